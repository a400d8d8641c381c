#!/bin/bash
# train_gpt_pipeline_dry_run_test.sh TRAIN_GPT RUN_MPI
# A config with pipeline.stages 2 at 4 ranks: --dry_run prints the layout
# (2 stages x 2 data-parallel), the 1F1B schedule's bubble over 4
# micro-batches and each stage's layers and model-state plan, and exits 0;
# with zb_h1, the zero-bubble schedule's smaller bubble;
# with 2 stages per rank (interleaved_1f1b), each rank's two stages and
# its plan over both;
# without --dry_run train_gpt refuses the config by name with exit status 2
# (it does not train a pipeline yet) instead of failing inside Initialize.
set -euo pipefail
train="$1"; run_mpi="$2"
config="${TEST_TMPDIR:-/tmp}/pipeline_dry_run.json"
cat > "$config" <<'JSON'
{
  "train_micro_batch_size_per_gpu": 2,
  "gradient_accumulation_steps": 4,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 1},
  "pipeline": {"stages": 2, "partition": "parameters", "schedule": "1f1b"}
}
JSON
output=$("$run_mpi" 4 "$train" --config="$config" --device=cpu --seq=64 --dry_run 2>&1)
echo "$output" | grep "dry_run\|stage [01]:\|activations per stage"
fail() { echo "FAIL: $*"; echo "$output"; exit 1; }
grep -q "4 ranks, ZeRO stage 1, pipeline 2 stages x 2 data-parallel" <<<"$output" \
  || fail "no layout line"
grep -q "schedule 1f1b over 4 micro-batches (bubble 0.200; at most 2 " <<<"$output" \
  || fail "no schedule and bubble"
[[ $(grep -c "stage 0: layers \[0, [0-9]*), model state per rank: Psi=[1-9]" <<<"$output") == 1 ]] \
  || fail "stage 0's plan once"
[[ $(grep -c "stage 1: layers \[[1-9][0-9]*, [0-9]*), model state per rank: Psi=[1-9]" <<<"$output") == 1 ]] \
  || fail "stage 1's plan once"
if grep -q "loss" <<<"$output"; then fail "a dry run trained"; fi

# Zero bubble (ZB-H1): the same layout, its bubble with equal F, B and W,
# 1 / (3 * 4 + 1).
zero_bubble="${TEST_TMPDIR:-/tmp}/pipeline_dry_run_zb.json"
sed 's/"schedule": "1f1b"/"schedule": "zb_h1"/' "$config" > "$zero_bubble"
output=$("$run_mpi" 4 "$train" --config="$zero_bubble" --device=cpu --seq=64 --dry_run 2>&1)
echo "$output" | grep "dry_run"
grep -q "schedule zb_h1 over 4 micro-batches (bubble 0.077; at most 2 " <<<"$output" \
  || fail "no zero-bubble schedule and bubble"

# Interleaved: 2 stages per rank, the model cut into 4; one plan per rank
# over its two stages (stage r and r + 2).
interleaved="${TEST_TMPDIR:-/tmp}/pipeline_dry_run_interleaved.json"
sed 's/"schedule": "1f1b"/"schedule": "interleaved_1f1b", "stages_per_rank": 2/' \
  "$config" > "$interleaved"
output=$("$run_mpi" 4 "$train" --config="$interleaved" --device=cpu --seq=64 --dry_run 2>&1)
echo "$output" | grep "dry_run\|rank [01] (\|activations per stage"
grep -q "pipeline 2 stages x 2 data-parallel over 4 ranks, 2 stages per rank, schedule interleaved_1f1b over 4 micro-batches (bubble 0.111; " <<<"$output" \
  || fail "no interleaved layout and bubble"
[[ $(grep -c "rank 0 (stage 0: layers \[0, [0-9]*), stage 2: layers \[[1-9][0-9]*, [0-9]*)), model state per rank: Psi=[1-9]" <<<"$output") == 1 ]] \
  || fail "rank 0's stages and plan once"
[[ $(grep -c "rank 1 (stage 1: layers \[[1-9][0-9]*, [0-9]*), stage 3: layers \[[1-9][0-9]*, [0-9]*)), model state per rank: Psi=[1-9]" <<<"$output") == 1 ]] \
  || fail "rank 1's stages and plan once"
set +e
refused=$("$run_mpi" 2 "$train" --config="$config" --device=cpu --seq=64 --steps=5 2>&1)
status=$?
set -e
[[ $status == 2 ]] || { echo "$refused"; fail "exit status $status, not 2"; }
grep -q "pipeline.stages 2: train_gpt does not train a pipeline yet" <<<"$refused" \
  || { echo "$refused"; fail "the refusal does not name pipeline.stages"; }
echo "train_gpt pipeline --dry_run: ok"
