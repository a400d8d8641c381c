#!/bin/bash
# Writes the convergence runs' corpus (issue 28): the English text of the
# Linux kernel's documentation (Debian's linux-doc-6.1 package, GPL-2.0:
# every .rst and .txt file under Documentation/, in path order, one blank
# line between files), about 28.5 MB, read by train_gpt as bytes
# (`--data=text:PATH`: a 256-symbol byte vocabulary; the last tenth is
# the validation part). Needs apt-get's package index (Debian bookworm).
#   bash bench/convergence/make_corpus.sh [OUT_DIR]   (default .corpus)
# Writes OUT_DIR/linux_doc.txt and OUT_DIR/linux_doc.txt.xz (the device
# carries the .xz) and prints the text's size and sha256.
set -euo pipefail
out=$(realpath -m "${1:-.corpus}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
(cd "$work" && apt-get download linux-doc-6.1 >/dev/null 2>&1) || {
  echo "make_corpus: apt-get download linux-doc-6.1 failed" >&2; exit 1; }
dpkg-deb -x "$work"/linux-doc-6.1_*.deb "$work/x"
find "$work/x" \( -name '*.rst.gz' -o -name '*.txt.gz' \) | LC_ALL=C sort |
  while read -r f; do zcat "$f"; echo; done > "$out/linux_doc.txt"
xz -T2 -6 -k -f "$out/linux_doc.txt"
echo "make_corpus: $out/linux_doc.txt $(stat -c %s "$out/linux_doc.txt") bytes," \
  "sha256 $(sha256sum "$out/linux_doc.txt" | cut -c1-16)"
