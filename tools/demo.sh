#!/usr/bin/env bash
# The main job, as a first run: builds examples/train_gpt and trains a tiny
# GPT (0.43M parameters, f32; 2 blocks of 8 heads) on this machine's CPUs
# through mpirun, 2 ranks, ZeRO stage 3 with the optimizer state and the parameters offloaded to CPU
# memory (examples/configs/demo_zero3_offload_cpu.json), on the built-in
# task: 3-digit addition ("123+045=" -> the sum, written least significant
# digit first). The flags are in examples/demo.flags (CI's
# //examples:demo_test runs the same file): 2000 steps of 72 problems (the
# global batch, the same at any rank count), an evaluation every 500 steps
# that generates answers to 128 held-out problems never trained on, and
# their exact-match accuracy at the end; the exit status is 1 unless it
# reaches 90% (guessing scores about 0). README's table has what it
# measured at seeds 42 (the default), 1, 2 and 3 and at 1, 2 and 3 ranks.
#
# Usage: tools/demo.sh [number of ranks, default 2] [train_gpt flags...]
#   e.g. tools/demo.sh 3 --seed=1
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
# OpenBLAS threads: this machine's cores shared by the ranks (at least 1),
# since more threads than cores only contend (its results do not depend on
# its thread count, only its speed does).
threads=$(($(nproc) / ranks))
if ((threads < 1)); then threads=1; fi
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-${threads}}"
# The demo's flags live in examples/demo.flags, which CI's
# //examples:demo_test runs too; flags given here come after and win.
exec mpirun --oversubscribe --bind-to none -np "${ranks}" \
  -x OPENBLAS_NUM_THREADS "${binary}" --flagfile=examples/demo.flags \
  --progress="${progress}" "$@"
