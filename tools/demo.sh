#!/usr/bin/env bash
# The main job, as a first run: builds examples/train_gpt and trains a tiny
# GPT (0.8M parameters) on this machine's CPUs through mpirun, 2 ranks,
# ZeRO stage 3 with the optimizer state and the parameters offloaded to CPU
# memory (examples/configs/demo_zero3_offload_cpu.json), on the built-in
# task: 3-digit addition ("123+045=" -> the sum, written least significant
# digit first). It evaluates every 200 steps by generating answers to 128
# held-out problems it never trained on, and ends with their exact-match
# accuracy; the exit status is non-zero unless the accuracy reaches 50%
# (guessing scores about 0). About a minute and a half on 2 cores.
#
# Usage: tools/demo.sh [number of ranks, default 2] [train_gpt flags...]
#   e.g. tools/demo.sh 2 --steps=400 --digits=2
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh

ranks="${1:-2}"
shift || true
bazel build //examples:train_gpt 2>&1 | grep -v linux-sandbox | tail -2
binary="$(bazel info bazel-bin 2>/dev/null)/examples/train_gpt"

# A live progress line on a terminal, plain log lines otherwise (every rank
# of mpirun sees a pseudo-terminal, so the trainer cannot tell by itself).
progress=log
if [[ -t 1 ]]; then progress=line; fi

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export NCCL_NVLS_ENABLE=0
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
exec mpirun --oversubscribe --bind-to none -np "${ranks}" "${binary}" \
  --config=examples/configs/demo_zero3_offload_cpu.json --device=cpu \
  --steps=800 --eval_every=200 --min_accuracy=0.5 --progress="${progress}" \
  "$@"
