#!/bin/bash
# ze_estimate_test.sh ZE_ESTIMATE
# 13e9 parameters at 8 ranks, bf16 AdamW: the paper's 16 Psi, 4 Psi + 12
# Psi / N, 2 Psi + 14 Psi / N and 16 Psi / N per rank, and offload moving
# the 12 Psi / N of optimizer state (plus a 2 Psi / N staging copy) to the
# host or NVMe. Then the engine-plan mode runs for a preset.
set -euo pipefail
tool="$1"
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
print("ze_estimate: paper formulas ok")
'
"$tool" --model=124M --world_size=4 | tee /dev/stderr | grep -q "engine plan"
if "$tool" --params=13e9 2>/dev/null; then echo "FAIL: missing --world_size accepted"; exit 1; fi
echo "ze_estimate: ok"
