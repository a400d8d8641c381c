#!/bin/bash
# train_gpt_dry_run_test.sh TRAIN_GPT RUN_MPI CONFIG
# --dry_run at 2 ranks prints the per-rank plan for ZeRO stage 2 (2 Psi +
# 14 Psi / N of model state) and exits 0 without training.
set -euo pipefail
train="$1"; run_mpi="$2"; config="$3"
output=$("$run_mpi" 2 "$train" --config="$config" --device=cpu --seq=64 --dry_run 2>&1)
echo "$output" | grep "train_gpt --dry_run\|model state\|activations"
grep -q "2 ranks, ZeRO stage 2" <<<"$output"
grep -q "model state per rank: Psi=834304 parameters" <<<"$output"
if grep -q "loss" <<<"$output"; then echo "FAIL: a dry run trained"; exit 1; fi
echo "train_gpt --dry_run: ok"
