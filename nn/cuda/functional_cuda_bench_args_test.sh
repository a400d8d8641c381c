#!/bin/bash
# functional_cuda_bench_args_test.sh BENCH, on any machine (the arguments
# are read before the GPU is looked for): an argument that is not a known
# key=value (a positional shape, an unknown key, a non-positive or
# malformed number, an unknown or integer dtype) exits 2 naming it,
# instead of being ignored and the default shape timed under the caller's
# label.
set -u
bench="$1"
fail() { echo "FAIL: $*"; exit 1; }
expect_refused() {  # expect_refused NAMED ARG...
  local named="$1"; shift
  local err
  err="$("$bench" "$@" 2>&1 >/dev/null)"
  local rc=$?
  [[ $rc -eq 2 ]] || fail "$* exited $rc, want 2 ($err)"
  [[ "$err" == *"$named"* ]] || fail "$*: message does not name '$named': $err"
}
expect_refused "'4'" 4 1024
expect_refused "'frob=1'" frob=1
expect_refused "'iters=0'" iters=0
expect_refused "'seq=12x'" seq=12x
expect_refused "'channels'" channels
expect_refused "dtype=q8" dtype=q8
expect_refused "dtype=i32" dtype=i32
# Well-formed arguments get past parsing: exit 0 with a GPU, or 1 saying
# it needs one.
"$bench" channels=5120 heads=40 dtype=bf16 iters=1 > /dev/null 2>&1
rc=$?
[[ $rc -eq 0 || $rc -eq 1 ]] || fail "well-formed arguments exited $rc"
echo PASS
