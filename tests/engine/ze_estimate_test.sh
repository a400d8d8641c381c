#!/bin/bash
# ze_estimate_test.sh ZE_ESTIMATE STAGE3_NVME_CONFIG ZERO2_AUTO_CONFIG
# 13e9 parameters at 8 ranks, bf16 AdamW: the paper's 16 Psi, 4 Psi + 12
# Psi / N, 2 Psi + 14 Psi / N and 16 Psi / N per rank, and offload moving
# the 12 Psi / N of optimizer state (plus a 2 Psi / N staging copy) to the
# host or NVMe. Then the engine-plan mode runs for a preset. Then the input
# checks (exit 2 naming the flag, never an abort), the 7B/350M spellings,
# --help, and --config, which must change the answer: only the config's own
# stage, offload, precision, optimizer and world size.
set -euo pipefail
tool="$1"; nvme_config="$2"; auto_config="$3"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
"$tool" --params=13e9 --world_size=8
"$tool" --params=13e9 --world_size=8 --json | python3 -c '
import json, sys
rows = {(r["stage"], r["offload"]): r for r in map(json.loads, sys.stdin)}
psi, n = 13e9, 8
expect = {0: 16 * psi, 1: 4 * psi + 12 * psi / n, 2: 2 * psi + 14 * psi / n, 3: 16 * psi / n}
for stage, total in expect.items():
    row = rows[(stage, "none")]
    assert row["device_bytes"] == total and row["paper_bytes"] == total, (stage, row)
optimizer = 12 * psi / n
row = rows[(3, "cpu")]
assert row["device_bytes"] == 4 * psi / n and row["host_bytes"] == optimizer + 2 * psi / n, row
row = rows[(3, "nvme")]
assert row["nvme_bytes"] == optimizer and row["device_bytes"] == 4 * psi / n, row
row = rows[(3, "cpu+param")]
assert row["device_bytes"] == 2 * psi / n, row
row = rows[(3, "nvme+nvmeparam")]
assert row["device_bytes"] == 2 * psi / n and row["nvme_bytes"] == optimizer + 2 * psi / n, row
print("ze_estimate: paper formulas ok")
'
"$tool" --model=124M --world_size=4 | tee /dev/stderr | grep -q "engine plan"
# The engine plan's NVMe parameter row: the 16-bit weights leave the device
# for the swap file (bytes on disk), read through pinned swap buffers.
"$tool" --model=124M --world_size=4 --json | python3 -c '
import json, sys
rows = {(r["stage"], r["offload"]): r for r in map(json.loads, sys.stdin)}
on_cpu, on_nvme = rows[(3, "nvme")], rows[(3, "nvme+nvmeparam")]
assert on_nvme["nvme_bytes"] > on_cpu["nvme_bytes"], (on_cpu, on_nvme)
assert on_nvme["device_bytes"] < on_cpu["device_bytes"], (on_cpu, on_nvme)
assert on_nvme["pinned_host_bytes"] > 0, on_nvme
print("ze_estimate: NVMe parameter row ok")
'

# A model whose largest bucket (25B's 6144-wide token table at one rank)
# exceeds offload_param's default buffer_size still gets its NVMe parameter
# row: without --config the row sizes the buffers to the largest bucket.
"$tool" --model=25B --world_size=1 --json | python3 -c '
import json, sys
rows = {(r["stage"], r["offload"]): r for r in map(json.loads, sys.stdin)}
row = rows[(3, "nvme+nvmeparam")]
assert row["nvme_bytes"] > 2 * 25e9, row
print("ze_estimate: 25B NVMe parameter row ok")
'

# One rank is "1 rank", in both modes.
"$tool" --params=7B --world_size=1 | grep -q "parameters, 1 rank,"
"$tool" --model=124M --world_size=1 | grep -q " 1 rank,"

# Bad input: exit 2 and a message naming the flag.
expect_bad() {  # expect_bad WORD_IN_MESSAGE ARGS...
  local word="$1"; shift
  local status=0
  "$tool" "$@" >"$tmp/out" 2>"$tmp/err" || status=$?
  if [[ "$status" != 2 ]] || ! grep -qF -- "$word" "$tmp/err"; then
    cat "$tmp/err"; echo "FAIL: $* -> exit $status, expected 2 naming $word"; exit 1
  fi
}
for bad in nan inf 1e30 -7 0 abc 7X 1.3BB ""; do
  expect_bad "--params=$bad" --params="$bad" --world_size=8
done
for bad in 0 -1 x 2.5 1e9; do
  expect_bad "--world_size=$bad" --params=7B --world_size="$bad"
done
expect_bad "--world_size" --params=13e9
expect_bad "--dtype=f64" --params=7B --world_size=8 --dtype=f64
expect_bad "--optimizer=lion" --params=7B --world_size=8 --optimizer=lion
expect_bad "--model=999B" --model=999B --world_size=8
expect_bad "--bogus" --params=7B --world_size=8 --bogus=1
expect_bad "--params" --params
expect_bad "$tmp/missing.json" --params=7B --world_size=8 --config="$tmp/missing.json"
echo "ze_estimate: bad input is exit 2, naming the flag"

# Spellings of a parameter count.
paper() { "$tool" --params="$1" --world_size=8 --json | head -1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["paper_bytes"])'; }
[[ "$(paper 7B)" == "$(paper 7e9)" && "$(paper 7b)" == "$(paper 7000000000)" ]]
[[ "$(paper 1.3B)" == "$(paper 1.3e9)" && "$(paper 350M)" == "$(paper 3.5e8)" ]]
[[ "$(paper 13e9)" == "$(paper 13B)" ]]
echo "ze_estimate: 7B, 1.3B, 350M, 13e9 ok"

"$tool" --help | grep -q -- "--config=FILE"

# --config: the config's own row. The stage-3 NVMe config (offload_param on
# the CPU) gives one row, stage 3, nvme+param, in both modes.
for mode in --params=7B --model=124M; do
  "$tool" $mode --world_size=4 --config="$nvme_config" --json > "$tmp/rows"
  python3 - "$tmp/rows" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
assert len(rows) == 1, rows
row = rows[0]
assert (row["stage"], row["offload"], row["world_size"]) == (3, "nvme+param", 4), row
assert row["nvme_bytes"] > 0 and row["host_bytes"] > 0, row
PY
done
# Its precision and optimizer: an f32 SGD (momentum) stage-1 config with no
# --world_size, --dtype or --optimizer gives what those flags would (world
# size 6 from its batch triple 48 = 2 x 4 x 6).
cat > "$tmp/sgd.json" <<'JSON'
{"train_batch_size": 48, "train_micro_batch_size_per_gpu": 2,
 "gradient_accumulation_steps": 4,
 "optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}},
 "zero_optimization": {"stage": 1}}
JSON
"$tool" --params=1B --config="$tmp/sgd.json" --json > "$tmp/rows"
"$tool" --params=1B --world_size=6 --dtype=f32 --optimizer=sgd --json > "$tmp/all"
python3 - "$tmp/rows" "$tmp/all" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
assert len(rows) == 1 and rows[0]["world_size"] == 6, rows
same = [json.loads(l) for l in open(sys.argv[2])]
same = [r for r in same if (r["stage"], r["offload"]) == (1, "none")][0]
for key in ("device_bytes", "paper_bytes"):
    assert rows[0][key] == same[key], (rows[0], same)
print("ze_estimate --config:", rows[0]["paper_bytes"], "bytes per rank")
PY
# The exact 16+16 master (bf16.master_weights_16_plus_16): the engine's plan
# (--model) counts 2 bytes of master per parameter instead of 4, so a
# stage-2 config at 8 ranks needs 2 Psi / 8 bytes less (plus padding).
cat > "$tmp/f32master.json" <<'JSON'
{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1,
 "bf16": {"enabled": true}, "zero_optimization": {"stage": 2}}
JSON
sed 's/"enabled": true}/"enabled": true, "master_weights_16_plus_16": true}/' \
  "$tmp/f32master.json" > "$tmp/split.json"
"$tool" --model=124M --world_size=8 --config="$tmp/f32master.json" --json > "$tmp/rows"
"$tool" --model=124M --world_size=8 --config="$tmp/split.json" --json > "$tmp/split_rows"
"$tool" --model=124M --world_size=8 --config="$tmp/split.json" | grep -q "16+16 master"
python3 - "$tmp/rows" "$tmp/split_rows" <<'PY'
import json, sys
f32 = json.loads(open(sys.argv[1]).readline())
split = json.loads(open(sys.argv[2]).readline())
saved = f32["device_bytes"] - split["device_bytes"]
psi = 124475904
assert 2 * psi / 8 <= saved <= 1.01 * 2 * psi / 8, (saved, f32, split)
print("ze_estimate: the 16+16 master saves", saved, "bytes per rank")
PY
# Compressed moments: bf16 (bf16.bf16_optimizer_states) holds 4 bytes of
# moments per parameter instead of 8, 8-bit (optimizer.params.
# blockwise_8bit_moments) 2 plus 8 per block of 256: at stage 2 over 8
# ranks the plan needs 4 Psi / 8 (bf16) and about 5.97 Psi / 8 (8-bit)
# bytes less per rank (plus padding and small f32 buckets).
sed 's/"enabled": true}/"enabled": true, "bf16_optimizer_states": true}/' \
  "$tmp/f32master.json" > "$tmp/bf16moments.json"
sed 's/"bf16": {"enabled": true}/"bf16": {"enabled": true}, "optimizer": {"type": "AdamW", "params": {"blockwise_8bit_moments": true}}/' \
  "$tmp/f32master.json" > "$tmp/8bitmoments.json"
"$tool" --model=124M --world_size=8 --config="$tmp/bf16moments.json" --json > "$tmp/bf16_rows"
"$tool" --model=124M --world_size=8 --config="$tmp/8bitmoments.json" --json > "$tmp/8bit_rows"
"$tool" --model=124M --world_size=8 --config="$tmp/bf16moments.json" | grep -q "bf16 moments"
"$tool" --model=124M --world_size=8 --config="$tmp/8bitmoments.json" | grep -q "8-bit block-wise moments"
python3 - "$tmp/rows" "$tmp/bf16_rows" "$tmp/8bit_rows" <<'PY'
import json, sys
f32, bf16, eight = (json.loads(open(p).readline()) for p in sys.argv[1:4])
psi = 124475904
saved = f32["device_bytes"] - bf16["device_bytes"]
assert 4 * psi / 8 <= saved <= 1.01 * 4 * psi / 8, (saved, f32, bf16)
saved8 = f32["device_bytes"] - eight["device_bytes"]
assert 0.98 * 5.9375 * psi / 8 <= saved8 <= 6 * psi / 8, (saved8, f32, eight)
print("ze_estimate: bf16 moments save", saved, "and 8-bit", saved8,
      "bytes per rank")
PY
# "auto" precision: --dtype fills it; a config that sets it refuses --dtype.
"$tool" --model=124M --world_size=2 --config="$auto_config" --dtype=fp16 | grep -q "f16"
expect_bad "--dtype" --params=7B --config="$tmp/sgd.json" --dtype=bf16
# offload_param with part of the optimizer kept on the device (ratio 0.5,
# issue 28): one row, cpu0.5+param; the device keeps the gradients and that
# part's master and moments, the host the rest, the weights and the staging
# of the offloaded part; the parts add up to the totals, and the text names
# both tiers of the optimizer.
cat > "$tmp/split_param.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true},
 "zero_optimization": {"stage": 3,
   "offload_optimizer": {"device": "cpu", "ratio": 0.5},
   "offload_param": {"device": "cpu"}}}
JSON
"$tool" --model=124M --world_size=1 --config="$tmp/split_param.json" --json > "$tmp/rows"
"$tool" --model=124M --world_size=1 --config="$tmp/split_param.json" | tee "$tmp/text"
grep -q "^GPU = weights 0.00 + gradients" "$tmp/text"
python3 - "$tmp/rows" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
assert len(rows) == 1, rows
row = rows[0]
assert (row["stage"], row["offload"]) == (3, "cpu0.5+param"), row
p = row["placement"]
assert p["device_weight_bytes"] == 0 and p["host_weight_bytes"] > 0, p
assert p["device_optimizer_bytes"] > 0 and p["host_optimizer_bytes"] > 0, p
assert row["device_bytes"] == p["gradient_bytes"] + p["device_optimizer_bytes"], row
assert row["host_bytes"] == (p["host_optimizer_bytes"] + p["host_weight_bytes"] +
                             p["staging_bytes"] + p["swap_buffer_bytes"] +
                             p["speculation_bytes"]), row
# About half of the state each way (whole buckets, so not exactly).
share = p["host_optimizer_bytes"] / (p["host_optimizer_bytes"] + p["device_optimizer_bytes"])
assert 0.5 <= share < 0.75, share
print("ze_estimate: offload_param with ratio 0.5 ok, host share", share)
PY
# A config Initialize refuses gets no row either, the same message: here
# the 16+16 master with offload_param.
cat > "$tmp/master16_param.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 1,
 "bf16": {"enabled": true, "master_weights_16_plus_16": true},
 "zero_optimization": {"stage": 3,
   "offload_optimizer": {"device": "cpu"},
   "offload_param": {"device": "cpu"}}}
JSON
expect_bad "bf16.master_weights_16_plus_16" --model=124M --world_size=1 --config="$tmp/master16_param.json"
echo "ze_estimate: ok"
