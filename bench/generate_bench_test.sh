#!/bin/bash
# generate_bench_test.sh GENERATE_BENCH HF_REFERENCE: on the CPU,
#   1. generate_bench --smoke (tiny GPT and llama-tiny, stages 0 and 3,
#      batch 1 and 3, cache on and off): exit 0, one line per configuration,
#      no error, positive rates, kv_cache_bytes by the header's formula
#      (a decoder's key/value width, not its query width), the engine's
#      memory plan, and the decoder's Hugging Face config as model_config;
#   2. --dry_run at llama-8B (nothing allocated): the stage-0 plan holds
#      16-bit weights, 16-bit gradients and f32 master weights (SGD: no
#      moments), all on the device; stage 3 at 8 ranks an eighth of it;
#   3. hf_generate_reference.py --print_config gives, for every Llama preset
#      it knows, the keys and values generate_bench prints as model_config
#      (its shapes are our presets');
#   4. bad input: an unknown model and --world_size without --dry_run.
set -u
bench="$1"; reference="$2"
dir="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*"; exit 1; }

"$bench" --smoke > "$dir/smoke.jsonl" 2> "$dir/smoke.err" \
  || { cat "$dir/smoke.err"; fail "generate_bench --smoke exited $?"; }
models="llama-tiny,llama-1B,llama-3B,llama-8B"
"$bench" --dry_run --model="$models" --stage=0,3 --batch=1,16 \
  > "$dir/dry.jsonl" 2> "$dir/dry.err" \
  || { cat "$dir/dry.err"; fail "generate_bench --dry_run exited $?"; }
"$bench" --dry_run --model=llama-8B --stage=3 --world_size=8 \
  > "$dir/dry8.jsonl" 2> "$dir/dry8.err" \
  || { cat "$dir/dry8.err"; fail "generate_bench --dry_run --world_size=8 exited $?"; }
PYTHONDONTWRITEBYTECODE=1 python3 "$reference" --print_config --model="$models" \
  > "$dir/hf.jsonl" || fail "hf_generate_reference.py --print_config failed"

"$bench" --dry_run --model=llama-70B > "$dir/bad.jsonl" 2>/dev/null
[[ $? -eq 1 ]] || fail "an unknown model must exit 1"
grep -q "unknown model 'llama-70B'" "$dir/bad.jsonl" \
  || fail "the error line must name the model: $(cat "$dir/bad.jsonl")"
"$bench" --smoke --world_size=2 > /dev/null 2>&1
[[ $? -eq 2 ]] || fail "--world_size without --dry_run must exit 2"

python3 - "$dir" <<'PYTHON' || exit 1
import json, sys

directory = sys.argv[1]
def lines(name):
    with open(f"{directory}/{name}") as f:
        return [json.loads(line) for line in f if line.strip()]

problems = []
def check(ok, what):
    if not ok:
        problems.append(what)

# 1. The smoke run.
smoke = lines("smoke.jsonl")
seen = set()
for line in smoke:
    key = (line["model"], line["stage"], line["batch"], line["cache"])
    seen.add(key)
    check("error" not in line, f"{key}: {line.get('error')}")
    for field in ("total_ms", "tokens_per_s", "ms_per_token", "prefill_ms",
                  "kv_cache_bytes", "model_config", "memory_breakdown"):
        check(field in line, f"{key}: no {field}")
    if "error" in line or "model_config" not in line:
        continue
    check(line["tokens_per_s"] > 0, f"{key}: tokens_per_s {line['tokens_per_s']}")
    config = line["model_config"]
    if line["model"] == "llama-tiny":
        check(config.get("architectures") == ["LlamaForCausalLM"],
              f"{key}: model_config is not the decoder's config.json")
        layers = config["num_hidden_layers"]
        width = config["num_key_value_heads"] * config["head_dim"]
        check(width == 2 * 16, f"{key}: kv width {width}")
    else:
        layers, width = config["layers"], config["channels"]
    positions = line["prompt"] + line["new_tokens"] - 1
    expected = 2 * layers * line["batch"] * positions * width * 4 if line["cache"] else 0
    check(line["kv_cache_bytes"] == expected,
          f"{key}: kv_cache_bytes {line['kv_cache_bytes']}, expected {expected}")
    plan = line["memory_breakdown"]
    check(plan["parameter_elements"] > 0 and plan["total_bytes"] > 0,
          f"{key}: empty memory_breakdown {plan}")
want = {(m, s, b, c) for m in ("tiny", "llama-tiny") for s in (0, 3)
        for b in (1, 3) for c in (True, False)}
check(seen == want, f"smoke lines {sorted(seen)}, expected {sorted(want)}")

# 2. The llama-8B plan: 8 bytes per parameter (2 + 2 + 4), on the device.
psi = 8030261248
dry = {(l["model"], l["stage"], l["batch"]): l for l in lines("dry.jsonl")}
for stage in (0, 3):
    line = dry.get(("llama-8B", stage, 16))
    check(line is not None, f"no dry-run line for llama-8B stage {stage}")
    if line is None:
        continue
    check(line["num_parameters"] == psi, f"llama-8B has {line['num_parameters']}")
    plan = line["memory_breakdown"]
    for field, per in (("model_weight_bytes", 2), ("gradient_bytes", 2),
                       ("master_weight_bytes", 4)):
        check(per * psi <= plan[field] <= per * psi * 1.001,
              f"stage {stage}: {field} {plan[field]}, expected ~{per * psi}")
    check(plan["optimizer_state_bytes"] == 0, f"SGD has moments: {plan}")
    check(plan["device_bytes"] == plan["total_bytes"] and plan["host_bytes"] == 0,
          f"stage {stage}: not all on the device: {plan}")
    cache = 2 * 32 * 16 * 255 * 8 * 128 * 2
    check(line["kv_cache_bytes"] == cache,
          f"kv_cache_bytes {line['kv_cache_bytes']}, expected {cache}")
    check(line["planned_device_bytes"] == plan["device_bytes"] + cache,
          "planned_device_bytes is not the plan plus the cache")
eighth = lines("dry8.jsonl")
check(len(eighth) == 2, f"{len(eighth)} lines at 8 ranks, expected 2 batches")
if eighth and "memory_breakdown" in eighth[0]:
    total = eighth[0]["memory_breakdown"]["total_bytes"]
    check(8 * psi / 8 <= total <= 8 * psi / 8 * 1.01,
          f"stage 3 at 8 ranks holds {total}, expected ~{psi}")

# 3. The reference's Llama shapes are the presets'.
hf = lines("hf.jsonl")
check(len(hf) == 4, f"{len(hf)} --print_config lines, expected 4")
for entry in hf:
    ours = dry.get((entry["model"], 0, 1), {}).get("model_config", {})
    for key, value in entry["model_config"].items():
        check(ours.get(key) == value,
              f"{entry['model']}: {key} is {value} in the reference, "
              f"{ours.get(key)} in generate_bench")

for problem in problems:
    print("FAIL:", problem)
sys.exit(1 if problems else 0)
PYTHON
echo "PASS: $(wc -l < "$dir/smoke.jsonl") smoke lines, $(wc -l < "$dir/dry.jsonl") dry-run lines"
