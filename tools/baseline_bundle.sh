#!/usr/bin/env bash
# Packs bench/train_bench as built from another commit (and the non-system
# shared libraries it links) into gpu_base/baseline.tar.xz (git-ignored), so
# a change's benchmark can be compared with its parent's binary in the same
# device call:
#
#   tools/baseline_bundle.sh ffdde73 && tools/gpu_bundle.sh
#   # on the GPU machine (carry gpu_pack and gpu_base):
#   tar xJf gpu_base/baseline.tar.xz -C /tmp   # /tmp/baseline/{bin,lib}
#   LD_LIBRARY_PATH=/tmp/baseline/lib:/usr/local/cuda/lib64 \
#     /tmp/baseline/bin/train_bench --models=1.3B --stages=0,2,3
#
# Usage: tools/baseline_bundle.sh <commit>
set -euo pipefail
cd "$(dirname "$0")/.."
commit="${1:?usage: tools/baseline_bundle.sh <commit>}"
tools/install_deps.sh

tree="$(mktemp -d /tmp/ze-baseline-XXXXXX)"
trap 'git worktree remove --force "${tree}" 2>/dev/null || rm -rf "${tree}"' EXIT
git worktree add --detach -q "${tree}" "${commit}"
(cd "${tree}" && bazel build //bench:train_bench 2>&1 | grep -E "ERROR|Build" | head -20)
binary="$(cd "${tree}" && bazel info bazel-bin 2>/dev/null)/bench/train_bench"
(cd "${tree}" && bazel shutdown 2>/dev/null) || true

pack="$(mktemp -d)"
mkdir -p "${pack}/baseline/bin" "${pack}/baseline/lib"
cp -L "${binary}" "${pack}/baseline/bin/train_bench"
chmod u+w "${pack}/baseline/bin/train_bench"
strip --strip-debug "${pack}/baseline/bin/train_bench" 2>/dev/null || true
# The libraries the GPU machine lacks: Abseil (as tools/gpu_bundle.sh packs).
ldd "${binary}" | awk '/=> \// {print $1, $3}' | while read -r name path; do
  if [[ "${name}" == libabsl* ]]; then cp -L "${path}" "${pack}/baseline/lib/${name}"; fi
done
mkdir -p gpu_base
git -C "${tree}" rev-parse --short HEAD > "${pack}/baseline/COMMIT"
tar cf - -C "${pack}" baseline | xz -T2 -6 > gpu_base/baseline.tar.xz
rm -rf "${pack}"
echo "baseline_bundle: train_bench of $(git rev-parse --short "${commit}") in gpu_base/baseline.tar.xz ($(du -h gpu_base/baseline.tar.xz | cut -f1))"
