#!/bin/bash
# train_gpt_configs_test.sh TRAIN_GPT RUN_MPI CONFIG...
# Every training config in examples/configs/ through the main job, as a
# user would run it: 2 ranks under mpirun on the CPU, a few steps of the
# addition task. Each config is copied with its NVMe paths pointed into
# this test's temporary directory, csv_monitor switched on there and any
# learning-rate warm-up shortened to 3 steps; the
# trainer must see its loss fall (its exit status), and the CSV files
# (loss, lr, tokens/s, memory; loss scale under fp16) must have a row per
# step, with the loss column falling too.
#
# Configs with "auto" values are Hugging Face integration templates (the
# values come from the trainer's TrainingArguments): they are skipped, and
# said so.
set -euo pipefail
train="$1"; run_mpi="$2"; shift 2
out="${TEST_TMPDIR:-$(mktemp -d)}/train_gpt_configs"
rm -rf "$out"; mkdir -p "$out"
steps=15
ran=0
for config in "$@"; do
  name="$(basename "$config" .json)"
  if grep -q '"auto"' "$config"; then
    echo "== $name: skipped (\"auto\" values: a Hugging Face template)"
    continue
  fi
  mkdir -p "$out/$name/nvme"
  python3 - "$config" "$out/$name" <<'PY'
import json, sys
config_path, directory = sys.argv[1], sys.argv[2]
with open(config_path) as f:
    config = json.load(f)
zero = config.get("zero_optimization", {})
for key in ("offload_optimizer", "offload_param"):
    if zero.get(key, {}).get("device") == "nvme":
        zero[key]["nvme_path"] = directory + "/nvme"
# Warm-ups of hundreds of steps would keep a few steps' learning rate near
# zero: shortened, so that the loss can fall.
params = config.get("scheduler", {}).get("params", {})
if isinstance(params.get("warmup_num_steps"), (int, float)):
    params["warmup_num_steps"] = min(params["warmup_num_steps"], 3)
config["csv_monitor"] = {"enabled": True, "output_path": directory + "/csv",
                         "job_name": "run"}
# An offloaded optimizer: the print's offload line (wall_clock_breakdown).
if zero.get("offload_optimizer", {}).get("device") in ("cpu", "nvme"):
    config["wall_clock_breakdown"] = True
    config["steps_per_print"] = 5
with open(directory + "/config.json", "w") as f:
    json.dump(config, f, indent=2)
PY
  echo "== $name"
  if ! "$run_mpi" 2 "$train" --config="$out/$name/config.json" --device=cpu \
      --steps="$steps" --eval_problems=8 --min_loss_drop=0.1 \
      >"$out/$name/log.txt" 2>&1; then
    cat "$out/$name/log.txt"
    echo "FAIL: $name: train_gpt exited non-zero"
    exit 1
  fi
  grep "^train_gpt: " "$out/$name/log.txt"
  grep -q "OK, the loss fell" "$out/$name/log.txt"
  if grep -q '"wall_clock_breakdown": true' "$out/$name/config.json" &&
      grep -q '"offload_optimizer"' "$out/$name/config.json"; then
    # Every print says how long the CPU update took and what the engine
    # waited for it, and then whether backward hides it, which ratio would,
    # or why no ratio would (NVMe, or a wait that was not the update's).
    line="$(grep -m1 "offload (ms per step) | CPU update: " "$out/$name/log.txt" || true)"
    if [[ ! "$line" =~ \|\ waited\ for\ it:\ [0-9.]+\ \|\ (backward\ hides\ it|offload_optimizer.ratio|NVMe:|the\ engine\ waited\ longer) ]]; then
      echo "FAIL: $name: no offload line with wall_clock_breakdown: '$line'"; exit 1
    fi
    echo "   ${line#*] }"
  fi
  csv="$out/$name/csv/run"
  metrics=(Train_Samples_train_loss Train_Samples_lr
           Train_Samples_tokens_per_second Train_Samples_memory_allocated_bytes
           Train_Samples_memory_peak_bytes)
  if grep -q '"fp16"' "$config"; then metrics+=(Train_Samples_loss_scale); fi
  for metric in "${metrics[@]}"; do
    file="$csv/$metric.csv"
    if [[ ! -s "$file" ]]; then
      echo "FAIL: $name: $file is missing or empty"; ls -l "$csv" || true; exit 1
    fi
    # A header and one row per step (the tokens/s row needs a previous
    # step's time, so it may have one row fewer).
    rows=$(($(wc -l <"$file") - 1))
    if ((rows < steps - 1)); then
      echo "FAIL: $name: $file has $rows rows for $steps steps"; exit 1
    fi
  done
  python3 - "$csv/Train_Samples_train_loss.csv" <<'PY'
import sys
rows = [line.split(",") for line in open(sys.argv[1]).read().split("\n")[1:] if line]
losses = [float(value) for _, value in rows]
first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
print(f"   csv: {len(losses)} loss rows, {first:.3f} -> {last:.3f}")
if not last < first:
    sys.exit(f"FAIL: {sys.argv[1]}: the loss did not fall")
PY
  ran=$((ran + 1))
done
if ((ran < 8)); then
  echo "FAIL: only $ran training configs ran; expected stage 0-3, offload, fp16, bf16 ones"
  exit 1
fi
echo "train_gpt configs: $ran configs trained: ok"
