#!/bin/bash
# run_nccl_all_gpus.sh PROGRAM: the collective tests on NCCL with one rank
# per visible GPU. With fewer than 2 GPUs it prints a SKIP line and exits
# with $ZE_TEST_SKIP_EXIT_CODE (tools/run_gpu_tests.sh sets 77 and reports
# the test as skipped, not passed; unset, 0).
set -u
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${gpus:-0}" -lt 2 ]; then
  echo "SKIP: $gpus GPU(s) visible; NCCL at N ranks needs N >= 2 GPUs"
  exit "${ZE_TEST_SKIP_EXIT_CODE:-0}"
fi
exec "$(dirname "$0")/run_mpi.sh" "$gpus" "$1" --device=cuda --backend=nccl
