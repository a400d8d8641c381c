#!/bin/bash
# gpu_gap_summary.py on a synthetic trace in the CSV columns both nsys and
# bench/cupti_trace.cc write (quoted names with commas): two steps delimited
# by optimizer kernels (tens of ms apart, as real steps are); step 2 has a
# 30 ms idle gap between two kernels, which
# must be found, attributed to the kernels on its sides, and summed.
set -euo pipefail
summary="$1"
trace="${TEST_TMPDIR:-/tmp}/trace.csv"
cat > "${trace}" <<'CSV'
"Start (ns)","Duration (ns)","Name"
0,10000000,"void zero::(anonymous namespace)::OptimizerKernel<1, 1, 1>(...)"
10000000,40000000,"nvjet_gemm_a"
50000000,10000000,"void zero::(anonymous namespace)::OptimizerKernel<1, 1, 1>(...)"
60000000,20000000,"nvjet_gemm_b, with a comma"
110000000,10000000,"[CUDA memcpy]"
120000000,10000000,"void zero::(anonymous namespace)::OptimizerKernel<1, 1, 1>(...)"
CSV
out="$(python3 "${summary}" "${trace}")"
echo "${out}"
python3 - "${out}" <<'PYTHON'
import json, sys
lines = [json.loads(l) for l in sys.argv[1].splitlines()]
assert len(lines) == 2, lines
first, second = lines
assert first["span_ms"] == 50.0 and first["idle_ms"] == 0.0, first  # 10->60
assert second["span_ms"] == 70.0, second   # 60 -> 130 ms
assert second["busy_ms"] == 40.0, second   # 20 + 10 + 10
assert second["idle_ms"] == 30.0, second
gap = second["longest_gaps"][0]
assert gap["ms"] == 30.0, gap
assert gap["after"].startswith("nvjet_gemm_b, with a comma"), gap
assert gap["before"] == "[CUDA memcpy]", gap
print("gpu_gap_summary_test: ok")
PYTHON
