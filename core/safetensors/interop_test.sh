#!/bin/bash
# C++ writer -> reference reader, and reference writer -> C++ reader.
# Usage: interop_test.sh INTEROP_TOOL INTEROP_CHECK_PY
set -euo pipefail
tool="$1"
script="$2"
python="${PYTHON:-python3}"
dir="${TEST_TMPDIR:-$(mktemp -d)}"

"$tool" write "$dir/from_cpp.safetensors"
"$python" "$script" check "$dir/from_cpp.safetensors"
"$python" "$script" write "$dir/from_python.safetensors"
"$tool" check "$dir/from_python.safetensors"
echo "interop: both directions ok"
