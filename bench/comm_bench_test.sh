#!/bin/bash
# comm_bench_test.sh NP DTYPE COMM_BENCH RUN_MPI TORCH_REFERENCE: runs
# comm_bench at NP ranks over the mpi backend on the CPU with tiny sizes,
# once per format, and checks: the JSON lines parse with comm_bench's keys,
# one per collective, size and placement (broadcast in place only), every
# result checked with 0 wrong elements; the table has nccl-tests' header, one
# row per size with 0 in both #wrong columns (N/A for out-of-place broadcast)
# and each collective's "Out of bounds values : 0 OK" and "Avg bus
# bandwidth" lines; and torch_comm_reference.py --plan names exactly the
# JSON lines torch can measure (all but the out-of-place all_reduce).
set -u
np="$1"; dtype="$2"; bench="$3"; run_mpi="$4"; reference="$5"
dir="${TEST_TMPDIR:-$(mktemp -d)}"
flags=(--backend=mpi --device=cpu --dtype="$dtype" --min_bytes=8
       --max_bytes=2048 --iters=3 --warmup=1)
fail() { echo "FAIL: $*"; exit 1; }

"$run_mpi" "$np" "$bench" "${flags[@]}" > "$dir/out.jsonl" 2> "$dir/json.err" \
  || { cat "$dir/json.err"; fail "comm_bench --format=json exited $?"; }
"$run_mpi" "$np" "$bench" "${flags[@]}" --format=table > "$dir/out.txt" \
  2> "$dir/table.err" || { cat "$dir/table.err"; fail "comm_bench --format=table failed"; }
PYTHONDONTWRITEBYTECODE=1 python3 "$reference" --plan --world_size="$np" "${flags[@]:2}" > "$dir/plan.jsonl" \
  || fail "torch_comm_reference.py --plan failed"
cat "$dir/out.txt"

python3 - "$np" "$dtype" "$dir" <<'PYTHON' || exit 1
import json, sys

np, dtype, directory = int(sys.argv[1]), sys.argv[2], sys.argv[3]
element = {"f32": 4, "bf16": 2, "f16": 2}[dtype]
collectives = ["all_reduce", "reduce_scatter", "all_gather", "broadcast"]
keys = ["collective", "backend", "dtype", "bytes", "world_size", "in_place",
        "time_us", "algbw_GBps", "busbw_GBps", "wrong"]
problems = []

# The sweep comm_bench must have run: 8..2048 bytes, doubling, rounded down
# to whole elements per rank.
sizes = []
size = 8
while size <= 2048:
    count = size // element // np * np
    if count:
        sizes.append(count * element)
    size *= 2
expected = [(c, s, p) for c in collectives for s in sizes
            for p in ((True,) if c == "broadcast" else (False, True))]

lines = open(f"{directory}/out.jsonl").read().splitlines()
seen = []
for line in lines:
    try:
        record = json.loads(line)
    except ValueError as error:
        problems.append(f"not JSON: {line!r} ({error})")
        continue
    if list(record) != keys:
        problems.append(f"keys {list(record)} != {keys}")
        continue
    if (record["backend"], record["dtype"], record["world_size"]) != \
            ("mpi", dtype, np):
        problems.append(f"wrong backend/dtype/world size: {line}")
    if record["wrong"] != 0:
        problems.append(f"wrong elements: {line}")
    if not record["time_us"] > 0:
        problems.append(f"no time: {line}")
    seen.append((record["collective"], record["bytes"], record["in_place"]))
if seen != expected:
    problems.append(f"JSON lines {seen} != expected {expected}")

plan = [json.loads(line) for line in open(f"{directory}/plan.jsonl")]
planned = [(p["collective"], p["bytes"], p["in_place"]) for p in plan]
torch_cannot = [s for s in expected if s[0] == "all_reduce" and not s[2]]
if planned != [s for s in expected if s not in torch_cannot]:
    problems.append(f"torch plan {planned} is not comm_bench's lines less "
                    f"{torch_cannot}")

text = open(f"{directory}/out.txt").read().splitlines()
header = [l for l in text if l.startswith("#       size")]
if len(header) != 4 or header[0].split()[1:] != [
        "size", "count", "type", "redop", "root", "time", "algbw", "busbw",
        "#wrong", "time", "algbw", "busbw", "#wrong"]:
    problems.append(f"table headers: {header}")
if sum("out-of-place" in l and "in-place" in l for l in text) != 4:
    problems.append("missing out-of-place/in-place header lines")
rows = [l.split() for l in text if l and not l.startswith("#")]
type_name = {"f32": "float", "bf16": "bfloat16", "f16": "half"}[dtype]
if len(rows) != 4 * len(sizes):
    problems.append(f"{len(rows)} table rows, expected {4 * len(sizes)}")
for i, row in enumerate(rows):
    collective = collectives[i // len(sizes)] if len(sizes) else "?"
    if len(row) != 13 or int(row[0]) != sizes[i % len(sizes)] or \
            row[2] != type_name:
        problems.append(f"bad row {row}")
        continue
    out_wrong, in_wrong = row[8], row[12]
    if collective == "broadcast":
        ok = row[5:9] == ["N/A"] * 4 and in_wrong == "0"
    else:
        ok = out_wrong == "0" and in_wrong == "0"
    if not ok:
        problems.append(f"{collective} row with wrong elements or no "
                        f"result: {row}")
if sum(l == "# Out of bounds values : 0 OK" for l in text) != 4:
    problems.append("not four '# Out of bounds values : 0 OK' lines")
if sum(l.startswith("# Avg bus bandwidth    : ") for l in text) != 4:
    problems.append("not four '# Avg bus bandwidth' lines")

for problem in problems:
    print("FAIL:", problem)
if problems:
    sys.exit(1)
print(f"PASS: {len(lines)} JSON lines and {len(rows)} table rows at {np} "
      f"ranks ({dtype}), 0 wrong; torch plan matches")
PYTHON
