#!/bin/bash
# config_doc_test.sh PRINT_REFERENCE CONFIG_MD
# docs/config.md must be exactly what the code generates (after its
# four-line heading): every key, type, default and meaning comes from
# config/, so a changed default or a new key fails here until the document
# is regenerated with `bazel run //config:print_reference`.
set -euo pipefail
generator="$1"; document="$2"
if ! diff -u <(tail -n +5 "$document") <("$generator"); then
  echo "FAIL: docs/config.md differs from the code's reference; regenerate:"
  echo "  (head -4 docs/config.md; bazel-bin/config/print_reference) > /tmp/c && mv /tmp/c docs/config.md"
  exit 1
fi
echo "docs/config.md matches the code"
