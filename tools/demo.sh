#!/usr/bin/env bash
# The main job: builds examples/train_gpt and trains a GPT through mpirun on
# this machine's CPUs (or its GPUs, where present: --device=auto), with the
# default config examples/configs/train_gpt_cpu.json (ZeRO stage 2, bf16,
# AdamW, WarmupLR). The engine logs the loss every 10 steps; the last line
# says whether the loss fell (the exit status says it too).
#
# Usage: tools/demo.sh [number of ranks, default 4] [train_gpt flags...]
#   e.g. tools/demo.sh 2 --steps=100 --seq=128
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh

ranks="${1:-4}"
shift || true
bazel build //examples:train_gpt 2>&1 | grep -v linux-sandbox | tail -2
binary="$(bazel info bazel-bin 2>/dev/null)/examples/train_gpt"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export NCCL_NVLS_ENABLE=0
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
exec mpirun --oversubscribe --bind-to none -np "${ranks}" "${binary}" \
  --config=examples/configs/train_gpt_cpu.json "$@"
