#!/bin/bash
# train_gpt_init_from_test.sh TRAIN_GPT RUN_MPI ZE_CHECKPOINT WRITER
# --init_from at several stages and world sizes: a small Hugging Face GPT-2
# file (written by WRITER) and the same weights converted to our names by
# `ze_checkpoint import-hf-gpt2` must give the same model everywhere. With a
# learning rate of 0 the loss is the loaded weights' loss on the same data
# (the global batch is the same at every world size), so it must agree
# across 1 rank at stage 0, 3 ranks at stage 3 with CPU offload and 2 ranks
# at stage 2 from the native file, and differ for other weights or none.
set -euo pipefail
train="$1"; run_mpi="$2"; tool="$3"; writer="$4"
out="${TEST_TMPDIR:-$(mktemp -d)}/train_gpt_init_from"
rm -rf "$out"; mkdir -p "$out"
# A vocabulary of 300 (the built-in task's bytes need 256): not a multiple
# of 128, so train_gpt pads the table to 384 rows, and consolidation must
# drop the padding again.
python3 "$writer" "$out/hf.safetensors" --seed=1 --vocab=300
python3 "$writer" "$out/hf_other.safetensors" --seed=2 --vocab=300
"$tool" import-hf-gpt2 "$out/hf.safetensors" --out="$out/native.safetensors"

# f32, a learning rate of 0, 24 samples a step at any of 1-3 ranks.
config() {  # stage, extra zero_optimization JSON
  cat <<JSON
{"train_batch_size": 24, "train_micro_batch_size_per_gpu": 4,
 "steps_per_print": 100,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.0}},
 "zero_optimization": {"stage": $1 $2}}
JSON
}
config 0 "" >"$out/stage0.json"
config 2 "" >"$out/stage2.json"
config 3 ', "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}' \
  >"$out/stage3_offload.json"

# Prints the run's first loss; the run must end normally (exit 0 or 1: with
# a learning rate of 0 the loss cannot fall).
first_loss() {  # ranks, config, init_from, [more train_gpt flags]
  local status=0
  local init=()
  [[ -n "$3" ]] && init=(--init_from="$3")
  "$run_mpi" "$1" "$train" --config="$out/$2" --device=cpu --steps=5 \
    --seed=3 --eval_problems=8 "${init[@]}" "${@:4}" >"$out/run.txt" 2>&1 ||
    status=$?
  if ((status > 1)); then
    cat "$out/run.txt" >&2; echo "FAIL: train_gpt exited $status" >&2; exit 1
  fi
  if [[ -n "$3" ]] && ! grep -q "initialised 28 parameters from $3" "$out/run.txt"; then
    cat "$out/run.txt" >&2; echo "FAIL: no 'initialised' line" >&2; exit 1
  fi
  sed -nE 's/^train_gpt: .* loss ([0-9.]+) -> .*/\1/p' "$out/run.txt"
}
same() { python3 -c "import sys; a, b = float('$1'), float('$2'); sys.exit(abs(a - b) > 1e-3 * abs(a))"; }

hf_stage0=$(first_loss 1 stage0.json "$out/hf.safetensors")
# Checkpoints into a directory that does not exist yet (the converted file
# goes there too).
hf_stage3=$(first_loss 3 stage3_offload.json "$out/hf.safetensors" \
  --save_dir="$out/new/checkpoints")
native_stage2=$(first_loss 2 stage2.json "$out/native.safetensors")
other=$(first_loss 2 stage3_offload.json "$out/hf_other.safetensors")
echo "first loss: HF at 1 rank stage 0 $hf_stage0, HF at 3 ranks stage 3 + offload $hf_stage3, native at 2 ranks stage 2 $native_stage2, other weights $other"
same "$hf_stage0" "$hf_stage3" || { echo "FAIL: stage 3 at 3 ranks loaded other weights"; exit 1; }
same "$hf_stage0" "$native_stage2" || { echo "FAIL: the native file differs"; exit 1; }
if same "$hf_stage0" "$other"; then echo "FAIL: other weights, same loss"; exit 1; fi

# Back to Hugging Face's layout: with a learning rate of 0 the consolidated
# checkpoint is the file the run started from, name for name, shape for
# shape (the 300-row table, from the vocabulary the checkpoint records),
# bit for bit.
"$tool" consolidate "$out/new/checkpoints" --out="$out/back.safetensors" \
  --format=hf-gpt2 --dtype=f32
python3 - "$out/hf.safetensors" "$out/back.safetensors" <<'PY'
import json, struct, sys
def tensors(path):
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
        data = handle.read()
    header.pop("__metadata__", None)
    return {name: (info["dtype"], info["shape"],
                   data[info["data_offsets"][0]:info["data_offsets"][1]])
            for name, info in header.items()}
original, back = tensors(sys.argv[1]), tensors(sys.argv[2])
missing = sorted(set(original) - set(back))
differ = sorted(n for n in original if n in back and back[n] != original[n])
if missing or differ:
    sys.exit(f"FAIL: consolidated hf-gpt2 file: missing {missing}, differ {differ}")
print(f"consolidated hf-gpt2 file: {len(original)} tensors equal to the input")
PY
# An explicit --vocab_size beyond the table is refused, naming it.
set +e
message=$("$tool" consolidate "$out/new/checkpoints" --out="$out/bad.safetensors" \
  --format=hf-gpt2 --vocab_size=500 2>&1); status=$?
set -e
echo "$message" | tail -1
[[ $status == 1 ]] && grep -q "vocab_size 500 is not between 1 and the token table's 384 rows" <<<"$message"
if compgen -G "$out/new/checkpoints/init_from.*" >/dev/null; then
  echo "FAIL: the converted file was left behind"; exit 1
fi

# Errors name the flag and the file.
set +e
message=$("$train" --config="$out/stage0.json" --device=cpu \
  --init_from="$out/missing.safetensors" 2>&1); status=$?
set -e
echo "$message" | tail -1
[[ $status == 2 ]] && grep -q -- "--init_from: .*missing.safetensors" <<<"$message"
set +e
message=$("$train" --config="$out/stage0.json" --device=cpu --model=tiny \
  --init_from="$out/hf.safetensors" 2>&1); status=$?
set -e
echo "$message" | tail -1
[[ $status == 2 ]] && grep -q -- "--model=tiny has 4 layers of 128 channels; --init_from=" <<<"$message"
echo "train_gpt --init_from: ok"
