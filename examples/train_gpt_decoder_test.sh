#!/bin/bash
# train_gpt_decoder_test.sh TRAIN_GPT RUN_MPI ZE_CHECKPOINT FIXTURES
# The trainer on Llama-family decoders (issue 25), through the CLI:
#   - --init_from=DIR loads a Hugging Face model directory (FIXTURES/llama:
#     one bf16 file; FIXTURES/qwen2_sharded: f32 shards with an index) at
#     1 rank stage 0 and at 3 ranks stage 3 with CPU offload; with a
#     learning rate of 0 the loss is the loaded weights' loss on the same
#     data, so both must agree, and differ from another model's;
#   - `ze_checkpoint consolidate --format=hf` of such a run's checkpoint
#     writes a model directory whose tensors are the input's, name for
#     name, value for value (f32 export of bf16 weights: exactly their
#     values), in shards when --max_shard_size asks; and train_gpt loads
#     that directory back to the same loss;
#   - --model=llama-tiny trains from scratch (the loss falls);
#   - mistakes are refused by name (exit 2).
set -euo pipefail
train="$(realpath "$1")"; run_mpi="$(realpath "$2")"; tool="$(realpath "$3")"
fixtures="$(realpath "$4")"
out="${TEST_TMPDIR:-$(mktemp -d)}/train_gpt_decoder"
rm -rf "$out"; mkdir -p "$out"

config() {  # stage, learning rate, extra zero_optimization JSON
  cat <<JSON
{"train_batch_size": 6, "train_micro_batch_size_per_gpu": 2,
 "steps_per_print": 100,
 "optimizer": {"type": "AdamW", "params": {"lr": $2}},
 "zero_optimization": {"stage": $1 $3}}
JSON
}
config 0 0.0 "" >"$out/stage0.json"
config 3 0.0 ', "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}' \
  >"$out/stage3_offload.json"
config 2 3e-3 "" >"$out/learn.json"

# run NAME RANKS CONFIG [train_gpt flags...]: output in $out/NAME.txt; the
# run must end normally (exit 0 or 1: with a learning rate of 0 the loss
# cannot fall). Prints the run's first loss.
run() {
  local name="$1" ranks="$2" config="$3"; shift 3
  local status=0
  "$run_mpi" "$ranks" "$train" --config="$out/$config" --device=cpu \
    --steps=5 --seed=3 --eval_problems=8 "$@" >"$out/$name.txt" 2>&1 ||
    status=$?
  if ((status > 1)); then
    cat "$out/$name.txt" >&2; echo "FAIL: $name: train_gpt exited $status" >&2
    exit 1
  fi
  sed -nE 's/^train_gpt: .* loss ([0-9.]+) -> .*/\1/p' "$out/$name.txt"
}
has() {
  grep -qF -- "$2" "$out/$1.txt" ||
    { cat "$out/$1.txt"; echo "FAIL: $1: expected \"$2\""; exit 1; }
}
same() { python3 -c "import sys; sys.exit(float('$1') != float('$2'))"; }

llama_1=$(run llama_1 1 stage0.json --init_from="$fixtures/llama")
has llama_1 "initialised 20 parameters from $fixtures/llama (Hugging Face llama)"
has llama_1 "model llama from --init_from (2 layers, 4 heads, 64 channels;"
llama_3=$(run llama_3 3 stage3_offload.json --init_from="$fixtures/llama" \
  --save_dir="$out/llama_ckpt")
# The sharded Qwen2's vocabulary (128) is below the built-in task's bytes:
# a uint16 token file of ids below 100.
python3 -c "
import struct, sys
open(sys.argv[1], 'wb').write(struct.pack('<20000H', *[(i * 7) % 100 for i in range(20000)]))
" "$out/tokens.bin"
qwen_3=$(run qwen_3 3 stage3_offload.json --init_from="$fixtures/qwen2_sharded" \
  --save_dir="$out/qwen_ckpt" --data="$out/tokens.bin" --seq=16)
has qwen_3 "(Hugging Face qwen2)"
echo "first loss: llama 1 rank stage 0 $llama_1, 3 ranks stage 3 + offload $llama_3; qwen2 (sharded) $qwen_3"
same "$llama_1" "$llama_3" || { echo "FAIL: stage 3 at 3 ranks loaded other weights"; exit 1; }
if same "$llama_1" "$qwen_3"; then echo "FAIL: another model, the same loss"; exit 1; fi

# --activation_checkpointing recomputes each block in backward: the same
# run, the same losses (a learning rate, so the steps after the first
# depend on the gradients).
sed 's/"lr": 0.0/"lr": 3e-3/' "$out/stage0.json" >"$out/stage0_learn.json"
run plain 1 stage0_learn.json --init_from="$fixtures/llama" >/dev/null
run recomputed 1 stage0_learn.json --init_from="$fixtures/llama" \
  --activation_checkpointing >/dev/null
plain_line=$(grep "^train_gpt: .* loss " "$out/plain.txt" | sed 's/steps in .* s (.* tokens\/s)//')
recomputed_line=$(grep "^train_gpt: .* loss " "$out/recomputed.txt" | sed 's/steps in .* s (.* tokens\/s)//')
[[ "$plain_line" == "$recomputed_line" ]] ||
  { echo "$plain_line"; echo "$recomputed_line"; echo "FAIL: checkpointing changed the losses"; exit 1; }

# Back to Hugging Face: one file, and shards of at most 40 kB.
"$tool" consolidate "$out/llama_ckpt" --out="$out/llama_hf" --format=hf
"$tool" consolidate "$out/qwen_ckpt" --out="$out/qwen_hf" --format=hf \
  --max_shard_size=40000
ls "$out/llama_hf" "$out/qwen_hf"
[[ -f "$out/llama_hf/config.json" && -f "$out/llama_hf/model.safetensors" ]]
[[ -f "$out/qwen_hf/model.safetensors.index.json" ]]
python3 - "$fixtures/llama" "$out/llama_hf" "$fixtures/qwen2_sharded" "$out/qwen_hf" <<'PY'
import json, os, struct, sys

def tensors(directory):
    """{hf name: (shape, [f32 values as ints of their bits])} over a model
    directory, one file or shards."""
    index = os.path.join(directory, "model.safetensors.index.json")
    files = (sorted(set(json.load(open(index))["weight_map"].values()))
             if os.path.exists(index) else ["model.safetensors"])
    out = {}
    for file in files:
        with open(os.path.join(directory, file), "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
            data = handle.read()
        header.pop("__metadata__", None)
        for name, info in header.items():
            raw = data[info["data_offsets"][0]:info["data_offsets"][1]]
            if info["dtype"] == "F32":
                bits = list(struct.unpack(f"<{len(raw) // 4}I", raw))
            elif info["dtype"] == "BF16":  # bf16 is f32's upper half
                bits = [b << 16 for b in struct.unpack(f"<{len(raw) // 2}H", raw)]
            else:
                sys.exit(f"FAIL: {directory}/{file}: {name} is {info['dtype']}")
            out[name] = (info["shape"], bits)
    return out

for original_dir, back_dir in zip(sys.argv[1::2], sys.argv[2::2]):
    original, back = tensors(original_dir), tensors(back_dir)
    # A tied model's file may carry lm_head.weight; the export leaves it out.
    if json.load(open(os.path.join(back_dir, "config.json"))).get("tie_word_embeddings"):
        original.pop("lm_head.weight", None)
    if set(original) != set(back):
        sys.exit(f"FAIL: {back_dir}: names {sorted(set(original) ^ set(back))} differ")
    differ = sorted(n for n in original if original[n] != back[n])
    if differ:
        sys.exit(f"FAIL: {back_dir}: {differ} differ from {original_dir}")
    config = json.load(open(os.path.join(back_dir, "config.json")))
    print(f"{back_dir}: {len(back)} tensors equal to {original_dir}'s, "
          f"{config['architectures'][0]}")
PY
# The exported directory trains to the same loss as the one it came from.
back=$(run llama_back 3 stage0.json --init_from="$out/llama_hf")
same "$llama_1" "$back" || { echo "FAIL: the exported directory loads to $back, not $llama_1"; exit 1; }
# --export_hf writes the trained weights at the end of a run: a run that
# learns (stage 3 at 3 ranks with offload), its checkpoint consolidated the
# other way, f32 both: the same tensors, bit for bit.
sed 's/"lr": 0.0/"lr": 3e-3/' "$out/stage3_offload.json" >"$out/stage3_learn.json"
run learned 3 stage3_learn.json --init_from="$fixtures/llama" \
  --save_dir="$out/learned_ckpt" --export_hf="$out/learned_hf" --export_dtype=f32 >/dev/null
has learned "wrote $out/learned_hf (Hugging Face llama, f32)"
"$tool" consolidate "$out/learned_ckpt" --out="$out/learned_consolidated" --format=hf
cmp "$out/learned_hf/config.json" "$out/learned_consolidated/config.json"
python3 - "$out/learned_hf" "$out/learned_consolidated" <<'PY'
import json, struct, sys
def tensors(path):
    with open(path + "/model.safetensors", "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
        data = handle.read()
    header.pop("__metadata__", None)
    return {n: data[i["data_offsets"][0]:i["data_offsets"][1]] for n, i in header.items()}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
if a != b:
    sys.exit(f"FAIL: --export_hf and consolidate differ: {sorted(n for n in a if a[n] != b.get(n))}")
print(f"--export_hf: {len(a)} tensors equal to consolidate --format=hf's")
PY
expect_export_bad() {  # NAME MESSAGE flags...
  local name="$1" message="$2"; shift 2
  local status=0
  "$train" --config="$out/stage0.json" --device=cpu --steps=5 "$@" \
    >"$out/$name.txt" 2>&1 || status=$?
  [[ $status == 2 ]] || { cat "$out/$name.txt"; echo "FAIL: $name: exit $status"; exit 1; }
  has "$name" "$message"
  grep -q "^\[rank 0\] .*step 1 " "$out/$name.txt" && { echo "FAIL: $name trained first"; exit 1; }
  true
}
expect_export_bad export_gpt "--export_hf=$out/gpt_export: writes Llama/Mistral/Qwen decoders" \
  --export_hf="$out/gpt_export"
touch "$out/a_file"
expect_export_bad export_under_file "--export_hf=$out/a_file/x: cannot create the directory" \
  --model=llama-tiny --export_hf="$out/a_file/x"
expect_export_bad export_dtype "--export_dtype=f64: use bf16, f16 or f32" \
  --model=llama-tiny --export_dtype=f64

# A GPT checkpoint has no config.json to write.
set +e
"$run_mpi" 1 "$train" --config="$out/stage0.json" --device=cpu --steps=5 \
  --eval_problems=8 --save_dir="$out/gpt_ckpt" >"$out/gpt.txt" 2>&1
message=$("$tool" consolidate "$out/gpt_ckpt" --out="$out/gpt_hf" --format=hf 2>&1)
status=$?
set -e
[[ $status == 2 ]] && grep -q 'records no Hugging Face config.json (client_state "hf_config")' <<<"$message" ||
  { echo "$message"; echo "FAIL: a GPT checkpoint consolidated with --format=hf (exit $status)"; exit 1; }

# From scratch: llama-tiny learns (the loss falls by 10% in 20 steps).
status=0
"$run_mpi" 3 "$train" --config="$out/learn.json" --device=cpu --steps=20 \
  --model=llama-tiny --eval_problems=8 --min_loss_drop=0.1 --seed=3 >"$out/tiny.txt" 2>&1 ||
  status=$?
((status == 0)) || { cat "$out/tiny.txt"; echo "FAIL: llama-tiny did not learn (exit $status)"; exit 1; }
has tiny "model llama-tiny (2 layers, 4 heads, 64 channels;"

# Mistakes, each exit 2 and named.
expect_bad() {  # NAME MESSAGE flags...
  local name="$1" message="$2"; shift 2
  local status=0
  "$train" --config="$out/stage0.json" --device=cpu --steps=5 "$@" \
    >"$out/$name.txt" 2>&1 || status=$?
  [[ $status == 2 ]] || { cat "$out/$name.txt"; echo "FAIL: $name: exit $status"; exit 1; }
  has "$name" "$message"
}
expect_bad model_and_dir "--model=124M with --init_from=$fixtures/llama: the directory's config.json gives the shape" \
  --model=124M --init_from="$fixtures/llama"
expect_bad reshape_decoder "--layers, --heads and --channels reshape --model=tiny only" \
  --model=llama-tiny --layers=3
expect_bad long_seq "--seq=600 exceeds --init_from=$fixtures/llama's 512 positions" \
  --init_from="$fixtures/llama" --data="$out/tokens.bin" --seq=600
mkdir -p "$out/empty"
expect_bad empty_dir "--init_from: " --init_from="$out/empty"
has empty_dir "$out/empty"
echo "train_gpt decoders: ok"
