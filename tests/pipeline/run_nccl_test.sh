#!/bin/bash
# run_nccl_test.sh PROGRAM: PROGRAM under mpirun at one rank per GPU over
# NCCL: 4 ranks with 4 or more visible GPUs, else 2. With fewer than 2 GPUs
# it prints a SKIP line and exits with $ZE_TEST_SKIP_EXIT_CODE
# (tools/run_gpu_tests.sh sets 77 and counts the test as skipped; unset, 0):
# NCCL refuses two ranks on one GPU (a duplicate device), so there is
# nothing to run.
set -u
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${gpus:-0}" -lt 2 ]; then
  echo "SKIP: ${gpus:-0} GPU(s) visible; NCCL point-to-point and a pipeline over it need 2 ranks on 2 GPUs (NCCL refuses two ranks on one GPU)"
  exit "${ZE_TEST_SKIP_EXIT_CODE:-0}"
fi
ranks=2
[ "$gpus" -ge 4 ] && ranks=4
# NVLink SHARP multicast off (bench/MULTI_GPU.md); the pipeline runs six
# trainings on each backend.
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
export MPI_TEST_TIMEOUT="${MPI_TEST_TIMEOUT:-500}"
export ZE_COMM_TIMEOUT_SECONDS="${ZE_COMM_TIMEOUT_SECONDS:-120}"
exec "$(dirname "$0")/../comm/run_mpi.sh" "$ranks" "$1"
