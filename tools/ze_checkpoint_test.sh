#!/bin/bash
# ze_checkpoint_test.sh ZE_CHECKPOINT TEST_CHECKPOINT_TOOL CHECK_NAMES_PY
# The checkpoint CLI on synthetic 3-rank checkpoints (no engine, no MPI):
# inspect (text and JSON), verify, consolidate (values exact, bf16 rounded,
# names and shapes through Python, the memory limit), clean, usage and
# input errors (exit 2), and damaged checkpoints: a flipped byte (verify
# exit 1, consolidate refuses the file by name, exit 2, writing nothing), a
# truncated and a missing rank file; incomplete saves (.<tag>.partial/)
# listed by inspect and removed by clean, with their sizes.
set -euo pipefail
tool="$1"; fixture="$2"; checker="$3"
python="${PYTHON:-python3}"
out="${TEST_TMPDIR:-$(mktemp -d)}/ze_checkpoint"
rm -rf "$out"; mkdir -p "$out"

fail() { echo "FAIL: $*"; exit 1; }
# expect_exit CODE COMMAND...: runs it, output in $out/last.{out,err}.
expect_exit() {
  local want="$1"; shift
  local got=0
  "$@" > "$out/last.out" 2> "$out/last.err" || got=$?
  [[ "$got" == "$want" ]] ||
    fail "exit $got, expected $want: $* ($(cat "$out/last.out" "$out/last.err"))"
}
expect_in() {  # expect_in FILE PATTERN
  grep -q -- "$2" "$1" || fail "no \"$2\" in $1: $(cat "$1")"
}

ckpt="$out/ckpt"
"$fixture" write "$ckpt" --model=awkward --tag=global_step7 --steps=7
"$fixture" shapes --model=awkward > "$out/awkward_shapes.json"

# Usage errors exit 2.
expect_exit 2 "$tool"
expect_exit 2 "$tool" inspect
expect_exit 2 "$tool" frobnicate "$ckpt"
expect_exit 2 "$tool" inspect "$ckpt" --bogus=1
expect_exit 2 "$tool" consolidate "$ckpt"
expect_exit 2 "$tool" consolidate "$ckpt" --out="$out/x" --dtype=f64
expect_exit 2 "$tool" consolidate "$ckpt" --out="$out/x" --format=onnx
expect_exit 2 "$tool" consolidate "$ckpt" --out="$out/x" --memory_limit=lots
expect_exit 2 "$tool" consolidate "$out/nowhere" --out="$out/x"
expect_in "$out/last.err" "$out/nowhere does not exist"
expect_exit 2 "$tool" verify "$out/nowhere"
expect_exit 2 "$tool" clean "$out/nowhere"
expect_in "$out/last.err" "$out/nowhere does not exist"
[[ ! -e "$out/x" ]] || fail "a usage error wrote a file"
expect_exit 0 "$tool" --help
expect_in "$out/last.out" "ze_checkpoint clean DIR"
expect_in "$out/last.out" "Exit status"
expect_exit 0 "$tool" consolidate --help

# inspect
expect_exit 0 "$tool" inspect "$ckpt"
cat "$out/last.out"
expect_in "$out/last.out" "tag global_step7, world size 3, ZeRO stage 3, model dtype bf16"
expect_in "$out/last.out" "kinds: master, exp_avg, exp_avg_sq, weights"
expect_in "$out/last.out" "global_steps 7"
expect_in "$out/last.out" "skipped_steps 0"
expect_in "$out/last.out" "micro_steps 14"
expect_in "$out/last.out" "global_samples 56"
expect_in "$out/last.out" "6 parameters, 383 elements"
[[ $(grep -c "rank_0000[0-2].safetensors .* bytes .*crc32c:.* size ok" "$out/last.out") == 3 ]] ||
  fail "inspect does not list three files with matching sizes"
expect_exit 0 "$tool" inspect "$ckpt" --tag=global_step7 --json
"$python" - "$out/last.out" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["tag"] == "global_step7" and d["world_size"] == 3, d
assert d["zero_stage"] == 3 and d["model_dtype"] == "bf16", d
assert d["global_steps"] == 7 and d["global_samples"] == 56, d
assert d["parameters"] == 6 and d["elements"] == 383, d
assert [f["name"] for f in d["files"]] == [
    "rank_%05d.safetensors" % r for r in range(3)], d
assert all(f["size_matches"] and f["actual_bytes"] == f["bytes"] for f in d["files"]), d
PY
expect_exit 2 "$tool" inspect "$ckpt" --tag=global_step99
expect_in "$out/last.err" "global_step99 does not exist"

# verify
expect_exit 0 "$tool" verify "$ckpt"
[[ $(grep -c "^OK  rank_0000[0-2].safetensors crc32c:[0-9a-f]\{8\}, [0-9]* bytes" "$out/last.out") == 3 ]] ||
  fail "verify: $(cat "$out/last.out")"

# consolidate: values exact in f32, rounded in bf16, any kind; names and
# shapes as Python's reader sees them.
expect_exit 0 "$tool" consolidate "$ckpt" --out="$out/f32.safetensors"
expect_in "$out/last.out" "6 parameters, 1532 tensor bytes"
"$fixture" expect "$out/f32.safetensors" --model=awkward --dtype=f32
"$python" "$checker" "$out/f32.safetensors" "$out/awkward_shapes.json"
expect_exit 0 "$tool" consolidate "$ckpt" --out="$out/bf16.safetensors" --dtype=bf16
"$fixture" expect "$out/bf16.safetensors" --model=awkward --dtype=bf16
expect_exit 0 "$tool" consolidate "$ckpt" --tag=global_step7 --out="$out/w.safetensors" --kind=weights --dtype=f16
"$fixture" expect "$out/w.safetensors" --model=awkward --dtype=f16 --kind=weights
expect_exit 2 "$tool" consolidate "$ckpt" --out="$out/hf.safetensors" --format=hf-gpt2
expect_in "$out/last.err" "not a GPT"
expect_exit 2 "$tool" consolidate "$ckpt" --out="$out/m.safetensors" --kind=momentum_buffer
expect_in "$out/last.err" "momentum_buffer"

# hf-gpt2 of a GPT-shaped checkpoint, imported back to our names: the same
# values.
"$fixture" write "$out/gpt" --model=gpt
expect_exit 0 "$tool" consolidate "$out/gpt" --out="$out/hf.safetensors" --format=hf-gpt2
expect_exit 0 "$tool" import-hf-gpt2 "$out/hf.safetensors" --out="$out/ours.safetensors"
"$fixture" expect "$out/ours.safetensors" --model=gpt --dtype=f32

# Memory: 12 parameters of 8000 bytes (96000 in all). A quarter of the
# model is enough, and so is exactly the largest parameter; below it the
# tool refuses before writing anything.
"$fixture" write "$out/wide" --model=wide
expect_exit 0 "$tool" consolidate "$out/wide" --out="$out/wide.safetensors"
for limit in 24000 8000; do
  expect_exit 0 "$tool" consolidate "$out/wide" --out="$out/capped.safetensors" --memory_limit=$limit
  expect_in "$out/last.out" "at most 8000 bytes of values held at once"
  cmp "$out/capped.safetensors" "$out/wide.safetensors" || fail "--memory_limit=$limit changed the output"
done
expect_exit 2 "$tool" consolidate "$out/wide" --out="$out/small.safetensors" --memory_limit=7999
expect_in "$out/last.err" "parameter layers.0.weight needs 8000 bytes at once, over the limit of 7999"
[[ ! -e "$out/small.safetensors" ]] || fail "a refused consolidation wrote its output"

# A flipped byte: verify names the file and both checksums, exit 1.
cp -r "$ckpt" "$out/flipped"
"$python" - "$out/flipped/global_step7/rank_00001.safetensors" <<'PY'
import sys
with open(sys.argv[1], "r+b") as handle:
    handle.seek(-5, 2)
    byte = handle.read(1)
    handle.seek(-5, 2)
    handle.write(bytes([byte[0] ^ 0x40]))
PY
expect_exit 0 "$tool" inspect "$out/flipped"  # sizes are intact
expect_exit 1 "$tool" verify "$out/flipped"
cat "$out/last.out"
expect_in "$out/last.out" "^OK  rank_00000.safetensors"
expect_in "$out/last.out" "^BAD .*rank_00001.safetensors is corrupt: .*crc32c:.*the manifest records .*crc32c:"
expect_in "$out/last.out" "^OK  rank_00002.safetensors"
# consolidate checks the checksums as a load does: the corrupt file is
# named, exit 2, and nothing is written (an older output stays as it was).
expect_exit 2 "$tool" consolidate "$out/flipped" --out="$out/flipped.safetensors"
expect_in "$out/last.err" "rank_00001.safetensors is corrupt"
expect_in "$out/last.err" "nothing was written"
[[ ! -e "$out/flipped.safetensors" ]] || fail "consolidated a corrupt checkpoint"
cp "$out/f32.safetensors" "$out/kept.safetensors"
expect_exit 2 "$tool" consolidate "$out/flipped" --out="$out/kept.safetensors" --format=native
cmp "$out/kept.safetensors" "$out/f32.safetensors" || fail "a refused consolidation changed its output path"
[[ -z "$(ls "$out" | grep -v -e '\.safetensors$' -e '^[a-z_0-9]*$' -e '\.json$' -e '^last\.')" ]] ||
  fail "a refused consolidation left temporary files: $(ls "$out")"

# A truncated file and a missing one: inspect still describes the
# checkpoint and says which file is wrong; verify and consolidate refuse.
cp -r "$ckpt" "$out/damaged"
truncate -s -3 "$out/damaged/global_step7/rank_00002.safetensors"
rm "$out/damaged/global_step7/rank_00000.safetensors"
expect_exit 1 "$tool" inspect "$out/damaged"
expect_in "$out/last.out" "rank_00000.safetensors .* MISSING"
expect_in "$out/last.out" "rank_00001.safetensors .* size ok"
expect_in "$out/last.out" "rank_00002.safetensors .* SIZE MISMATCH"
expect_in "$out/last.err" "2 of 3 files"
expect_exit 1 "$tool" verify "$out/damaged"
expect_in "$out/last.err" "rank_00000.safetensors of checkpoint tag global_step7 is missing"
expect_exit 2 "$tool" consolidate "$out/damaged" --out="$out/d.safetensors"
[[ ! -e "$out/d.safetensors" ]] || fail "consolidated a damaged checkpoint"

# Incomplete saves (what a save that failed or was killed leaves): inspect
# lists them with their sizes (also with no complete checkpoint at all),
# clean removes them, printing each, and leaves the checkpoints alone.
mkdir -p "$ckpt/.global_step9.partial" "$ckpt/.other.partial/sub"
head -c 1234 /dev/zero > "$ckpt/.global_step9.partial/rank_00000.safetensors.tmp"
head -c 100 /dev/zero > "$ckpt/.other.partial/sub/x"
expect_exit 0 "$tool" inspect "$ckpt"
expect_in "$out/last.out" "incomplete saves in $ckpt"
expect_in "$out/last.out" "$ckpt/.global_step9.partial/  1234 bytes"
expect_in "$out/last.out" "$ckpt/.other.partial/  100 bytes"
expect_exit 0 "$tool" inspect "$ckpt" --json
"$python" - "$out/last.out" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert [(p["tag"], p["bytes"]) for p in d["partial_saves"]] == [
    ("global_step9", 1234), ("other", 100)], d["partial_saves"]
PY
mkdir -p "$out/only_partial/.global_step1.partial"
head -c 10 /dev/zero > "$out/only_partial/.global_step1.partial/f"
expect_exit 2 "$tool" inspect "$out/only_partial"
expect_in "$out/last.out" "$out/only_partial/.global_step1.partial/  10 bytes"
expect_in "$out/last.err" "no checkpoint was completed"
expect_exit 0 "$tool" clean "$ckpt"
expect_in "$out/last.out" "removed $ckpt/.global_step9.partial/  1234 bytes"
expect_in "$out/last.out" "removed $ckpt/.other.partial/  100 bytes"
expect_in "$out/last.out" "2 incomplete saves removed from $ckpt, 1334 bytes"
[[ ! -e "$ckpt/.global_step9.partial" && ! -e "$ckpt/.other.partial" ]] || fail "clean left them"
expect_exit 0 "$tool" verify "$ckpt"
expect_exit 0 "$tool" clean "$ckpt"
expect_in "$out/last.out" "0 incomplete saves removed"
echo "ze_checkpoint: all passed"
