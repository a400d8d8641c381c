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
# The activation estimate: the step's peak, where it falls (the estimate's
# own "loss head" is no sign of training, so trained() leaves its line out).
grep -q "activations per rank (estimate, micro-batch [0-9]* x 64): [0-9.]* GiB at " <<<"$output"
trained() { grep -v "activations per rank" <<<"$1" | grep -q "loss"; }
if trained "$output"; then echo "FAIL: a dry run trained"; exit 1; fi
# The head's weight gradient in the backward reaches the estimate (its
# bytes: zero:activation_estimate_test).
backward=$("$run_mpi" 2 "$train" --config="$config" --device=cpu --seq=64 --dry_run --head_weight_gradient=backward 2>&1)
grep -q "head weight gradient in backward): [0-9.]* GiB at " <<<"$backward"
# with_zero NAME JSON: the path of a copy of $config whose
# zero_optimization is updated with the keys of JSON.
with_zero() {
  local derived="${TEST_TMPDIR:-$(mktemp -d)}/$1.json"
  python3 - "$config" "$derived" "$2" <<'PY'
import json, sys
config = json.load(open(sys.argv[1]))
config["zero_optimization"].update(json.loads(sys.argv[3]))
json.dump(config, open(sys.argv[2], "w"))
PY
  echo "$derived"
}
# The parameter tier on NVMe (offload_param nvme, stage 3): the plan's NVMe
# bytes include the 16-bit weights; nothing is allocated, so the directory
# need not exist.
nvme_config=$(with_zero nvme_params '{"stage": 3,
  "offload_optimizer": {"device": "cpu"},
  "offload_param": {"device": "nvme", "nvme_path": "/nonexistent/dry",
                    "max_in_cpu": 0, "pin_memory": true}}')
output=$("$run_mpi" 2 "$train" --config="$nvme_config" --device=cpu --seq=64 --dry_run 2>&1)
echo "$output" | grep "train_gpt --dry_run\|model state"
grep -q "2 ranks, ZeRO stage 3" <<<"$output"
grep -q ", NVMe [0-9.]* GiB" <<<"$output"
if trained "$output"; then echo "FAIL: a dry run trained"; exit 1; fi
# offload_optimizer.ratio "auto": the plan is made with the ratio the engine
# chooses from the device's free memory (here the host's, which holds this
# model many times over: the key's smallest share, 0.05), said once; a
# short training run keeps that choice (Initialize is handed it, so the
# line is not repeated) and trains.
auto_config=$(with_zero auto_ratio \
  '{"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": "auto"}}')
output=$("$run_mpi" 2 "$train" --config="$auto_config" --device=cpu --seq=64 --dry_run 2>&1)
echo "$output" | grep "ratio \"auto\"\|model state"
grep -q "offload_optimizer.ratio \"auto\": 0.05 (model state on the device .* <= .*: free on the device, 2 ranks on it); all of it would fit on the device" <<<"$output"
grep -q "model state per rank: .*master weights and optimizer state: device [0-9.]* GiB + host [0-9.]* GiB" <<<"$output"
if trained "$output"; then echo "FAIL: a dry run trained"; exit 1; fi
# --device_memory_gib: a budget that holds part of the state takes a
# share between the smallest and all (10 MiB here: the weights, gradients
# and activations take most of it).
output=$("$run_mpi" 2 "$train" --config="$auto_config" --device=cpu --seq=64 --dry_run --device_memory_gib=0.01 2>&1)
grep "ratio \"auto\"" <<<"$output"
grep -q "offload_optimizer.ratio \"auto\": 0\.[1-9][0-9] (model state on the device .* <= 10\.2 MiB: the budget given)" <<<"$output"
output=$("$run_mpi" 2 "$train" --config="$auto_config" --device=cpu --seq=64 --steps=5 2>&1)
[[ $(grep -c "offload_optimizer.ratio \"auto\": 0.05" <<<"$output") == 1 ]] ||
  { echo "FAIL: the auto ratio's line is not there once:"; echo "$output" | tail -20; exit 1; }
grep -q "offload_optimizer cpu (ratio 0.05" <<<"$output" ||
  { echo "FAIL: Initialize did not train with the chosen ratio:"; echo "$output" | tail -20; exit 1; }
echo "train_gpt --dry_run: ok"
