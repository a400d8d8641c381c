#!/bin/bash
# consolidate_interop_test.sh ZE_CHECKPOINT TEST_CHECKPOINT_TOOL CHECK_NAMES_PY
# A consolidated checkpoint (f32 and bf16) loads with the reference
# implementation, safetensors.numpy.load_file, with our names and shapes.
set -euo pipefail
tool="$1"; fixture="$2"; checker="$3"
python="${PYTHON:-python3}"
out="${TEST_TMPDIR:-$(mktemp -d)}/consolidate_interop"
rm -rf "$out"; mkdir -p "$out"
"$fixture" write "$out/ckpt" --model=awkward
"$fixture" shapes --model=awkward > "$out/shapes.json"
for dtype in f32 bf16; do
  "$tool" consolidate "$out/ckpt" --out="$out/$dtype.safetensors" --dtype=$dtype
  "$python" "$checker" "$out/$dtype.safetensors" "$out/shapes.json" --require-package
done
echo "consolidate interop: ok"
