#!/usr/bin/env bash
# Builds every target (CUDA ones included), runs every test not tagged
# `gpu` (or `manual`) and checks formatting (tools/check_format.sh). Ends with one line `tests: N passed, M failed` and
# exits non-zero when anything failed or did not build.
#
# Usage: tools/test.sh [extra bazel test flags]
set -uo pipefail
cd "$(dirname "$0")/.."

tools/install_deps.sh || { echo "tests: 0 passed, 1 failed"; exit 1; }

log="$(mktemp)"
trap 'rm -f "${log}"' EXIT

echo "== building every target" >&2
bazel build //... 2>&1 | grep -v "linux-sandbox" >&2
if [[ ${PIPESTATUS[0]} -ne 0 ]]; then
  echo "tests: 0 passed, 1 failed (the build failed; see above)"
  exit 1
fi

echo "== running tests (not tagged gpu)" >&2
bazel test //... --test_tag_filters=-gpu,-manual --test_summary=short "$@" 2>&1 \
  | grep -v "linux-sandbox" | tee "${log}" >&2
status=${PIPESTATUS[0]}

passed=$(grep -cE "^//[^ ]+ +(\(cached\) )?PASSED" "${log}")
failed=$(grep -cE "^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD|INCOMPLETE)" "${log}")
if [[ ${status} -ne 0 && ${failed} -eq 0 ]]; then
  failed=1  # bazel failed for a reason no test line shows
fi

# Formatting counts as one more test: every tracked C++/CUDA file must be
# as clang-format (the root .clang-format, Google style) writes it.
echo "== checking formatting" >&2
if tools/check_format.sh; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
fi
echo "tests: ${passed} passed, ${failed} failed"
[[ ${failed} -eq 0 ]]
