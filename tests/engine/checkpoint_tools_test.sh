#!/bin/bash
# checkpoint_tools_test.sh CHECKPOINT_MAIN RUN_MPI ZE_CHECKPOINT CHECKER
# The checkpoint CLI on a checkpoint a 3-rank stage-3 job saved: inspect,
# verify (and a flipped byte caught), consolidate (equal to the engine's
# gathered parameters, f32 and bf16; HF GPT-2 names; bounded memory), and
# the round trip: a job at another world size and stage loads the
# consolidated file with LoadWeights and holds exactly those parameters.
set -euo pipefail
main="$1"; run_mpi="$2"; tool="$3"; checker="$4"
python="${PYTHON:-python3}"
out="${TEST_TMPDIR:-$(mktemp -d)}/checkpoint_tools"
rm -rf "$out"; mkdir -p "$out"
ckpt="$out/ckpt"

"$run_mpi" 3 "$main" train --stage=3 --from=0 --to=2 --save="$ckpt" --out="$out/gathered"

"$tool" inspect "$ckpt" | tee "$out/inspect.txt"
grep -q "world size 3, ZeRO stage 3" "$out/inspect.txt"
grep -q "global_steps 2" "$out/inspect.txt"
"$tool" inspect "$ckpt" --json |
  "$python" -c 'import json,sys; d=json.load(sys.stdin); assert d["world_size"]==3 and len(d["files"])==3, d'
"$tool" verify "$ckpt"

"$tool" consolidate "$ckpt" --out="$out/f32.safetensors"
"$python" "$checker" "$out/f32.safetensors" "$out/gathered"
"$tool" consolidate "$ckpt" --out="$out/bf16.safetensors" --dtype=bf16
"$python" "$checker" "$out/bf16.safetensors" "$out/gathered" --dtype=BF16
"$tool" consolidate "$ckpt" --out="$out/hf.safetensors" --format=hf-gpt2
"$python" "$checker" "$out/hf.safetensors" "$out/gathered" --hf

# Memory: --memory_limit caps the host allocator at a quarter of the model's
# f32 bytes; the consolidation, one parameter at a time, still succeeds and
# writes the same bytes. A limit below the largest parameter is refused
# before anything is written.
model_bytes=$(stat -c %s "$out/f32.safetensors")
"$tool" consolidate "$ckpt" --out="$out/capped.safetensors" --memory_limit=$((model_bytes / 4))
cmp <(tail -c +9 "$out/capped.safetensors") <(tail -c +9 "$out/f32.safetensors")
if "$tool" consolidate "$ckpt" --out="$out/too_small.safetensors" --memory_limit=100 2> "$out/err.txt"; then
  echo "FAIL: a 100-byte limit was accepted"; exit 1
fi
grep -q "over the limit" "$out/err.txt"
[[ ! -e "$out/too_small.safetensors" ]]

# Round trip: 2 ranks, stage 1, initialise from the consolidated file.
"$run_mpi" 2 "$main" train --stage=1 --from=2 --to=2 --load_weights="$out/f32.safetensors" --out="$out/reloaded"
"$main" compare --a="$out/reloaded" --b="$out/gathered" --exact

# From Hugging Face GPT-2 names back to ours, and into a 3-rank stage-2 job:
# the same parameters, exactly.
"$tool" import-hf-gpt2 "$out/hf.safetensors" --out="$out/imported.safetensors"
"$run_mpi" 3 "$main" train --stage=2 --from=2 --to=2 --load_weights="$out/imported.safetensors" --out="$out/from_hf"
"$main" compare --a="$out/from_hf" --b="$out/gathered" --exact

# A flipped byte: verify names the file and fails.
cp -r "$ckpt" "$out/flipped"
"$python" - "$out/flipped/global_step2/rank_00001.safetensors" <<'PY'
import sys
path = sys.argv[1]
with open(path, "r+b") as handle:
    handle.seek(-5, 2)
    byte = handle.read(1)
    handle.seek(-5, 2)
    handle.write(bytes([byte[0] ^ 0x40]))
PY
if "$tool" verify "$out/flipped" > "$out/verify.txt"; then
  echo "FAIL: verify passed a flipped byte"; exit 1
fi
cat "$out/verify.txt"
grep -q "BAD .*rank_00001.safetensors is corrupt" "$out/verify.txt"
grep -q "^OK  rank_00000.safetensors" "$out/verify.txt"
echo "checkpoint tools: all passed"
