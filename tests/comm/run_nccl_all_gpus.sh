#!/bin/bash
# run_nccl_all_gpus.sh PROGRAM: the collective tests on NCCL with one rank
# per visible GPU; passes with a SKIP line when fewer than 2 GPUs exist.
set -u
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${gpus:-0}" -lt 2 ]; then
  echo "SKIP: $gpus GPU(s) visible; NCCL at N ranks needs N >= 2 GPUs"
  exit 0
fi
exec "$(dirname "$0")/run_mpi.sh" "$gpus" "$1" --device=cuda --backend=nccl
