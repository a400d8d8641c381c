#!/bin/bash
# Every fixture: hf_decoder's export (one f32 file; bf16 shards with an
# index) loaded back by transformers (hf_decoder_transformers_check.py).
# Usage: hf_decoder_transformers_test.sh EXPORT_TOOL CHECK_PY TESTDATA_DIR
# Python: $PYTHON, else /work/venv/bin/python when present, else python3.
set -euo pipefail
tool="$1"
script="$2"
testdata="$3"
python="${PYTHON:-}"
if [[ -z "${python}" ]]; then
  if [[ -x /work/venv/bin/python ]]; then python=/work/venv/bin/python; else python=python3; fi
fi
out="${TEST_TMPDIR:-$(mktemp -d)}"
for fixture in llama mistral qwen2 qwen2_sharded qwen3; do
  rm -rf "${out:?}/${fixture}"
  mkdir -p "${out}/${fixture}"
  "${tool}" "${testdata}/${fixture}" "${out}/${fixture}"
  "${python}" "${script}" "${testdata}/${fixture}" "${out}/${fixture}"
done
echo "hf_decoder_transformers_test: all fixtures ok"
