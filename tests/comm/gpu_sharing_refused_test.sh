#!/bin/bash
# gpu_sharing_refused_test.sh PROGRAM: launches one rank more than there are
# visible GPUs, with ZE_ALLOW_GPU_SHARING=0 (tools/run_gpu_tests.sh exports 1
# for the tests that share on purpose), for --backend=auto and mpi. Checks
# that every rank printed CreateCommunicator's FailedPrecondition naming
# itself, its host, the local rank count, the GPU count and the variable,
# and that the job exited non-zero instead of hanging.
set -u
program="$1"
here="$(dirname "$0")"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "${gpus:-0}" -ge 1 ] || { echo "FAIL: no GPU visible (nvidia-smi -L)"; exit 1; }
np=$((gpus + 1))
gpu_word=$([ "$gpus" -eq 1 ] && echo "GPU" || echo "GPUs")
fail() { echo "FAIL: $*"; exit 1; }
for backend in auto mpi; do
  log="${TEST_TMPDIR:-/tmp}/gpu_sharing_refused_${backend}.log"
  ZE_ALLOW_GPU_SHARING=0 MPI_TEST_TIMEOUT=120 "$here/run_mpi.sh" "$np" \
    "$program" --device=cuda --backend="$backend" >"$log" 2>&1
  code=$?
  cat "$log"
  [ "$code" -ne 0 ] || fail "backend $backend: mpirun exited 0 with $np ranks on $gpus $gpu_word"
  [ "$code" -ne 124 ] && [ "$code" -ne 137 ] || fail "backend $backend: the job hung"
  for ((r = 0; r < np; r++)); do
    grep -E "CreateCommunicator: FAILED_PRECONDITION: rank $r on host [^:]+: $np ranks on this host \(counted by MPI_COMM_TYPE_SHARED split\) but $gpus visible $gpu_word, .*ZE_ALLOW_GPU_SHARING=1" "$log" >/dev/null \
      || fail "backend $backend: rank $r did not report the refusal naming itself, its host, $np ranks, $gpus $gpu_word and ZE_ALLOW_GPU_SHARING"
  done
done
echo "PASS: $np ranks on $gpus $gpu_word refused on every rank (backends auto and mpi)"
