#!/bin/bash
# train_gpt_resume_test.sh TRAIN_GPT RUN_MPI CONFIG
# The main job saves and resumes as a user would: 2 ranks at ZeRO stage 2
# train 20 steps, saving every 10; then 3 ranks at stage 3 with the
# optimizer offloaded to the CPU resume from `latest` and train to step 30.
# The resumed run must say where it continued and still see the loss fall
# (judged against the first steps' loss, kept in the checkpoint).
set -euo pipefail
train="$1"; run_mpi="$2"; config="$3"
out="${TEST_TMPDIR:-$(mktemp -d)}/train_gpt_resume"
rm -rf "$out"; mkdir -p "$out"
common=(--device=cpu --seq=32 --min_loss_drop=0.1)
"$run_mpi" 2 "$train" --config="$config" "${common[@]}" --steps=20 \
  --save_dir="$out/ckpt" --save_every=10 | tee "$out/first.txt"
[[ "$(cat "$out/ckpt/latest")" == "global_step20" ]]
[[ -d "$out/ckpt/global_step10" ]]
# Stage 3 with CPU offload, same optimizer and schedule.
sed -e 's/"stage": 2/"stage": 3, "offload_optimizer": {"device": "cpu"}/' \
  "$config" > "$out/stage3_offload.json"
"$run_mpi" 3 "$train" --config="$out/stage3_offload.json" "${common[@]}" \
  --steps=30 --save_dir="$out/ckpt" --resume 2>&1 | tee "$out/resumed.txt"
grep -q "resumed from .*global_step20 (saved by 2 ranks at ZeRO stage 2), continuing at step 20" "$out/resumed.txt"
grep -q "OK, the loss fell" "$out/resumed.txt"
[[ "$(cat "$out/ckpt/latest")" == "global_step30" ]]
echo "train_gpt resume: ok"
