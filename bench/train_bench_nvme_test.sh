#!/bin/bash
# train_bench_nvme_test.sh TRAIN_BENCH, on the CPU (tiny GPT, f32, 3 timed
# steps after 1 warm-up), swap files in the test's temporary directory:
#   1. --disk_baseline=1 prints the disk's line first (solo and duplex,
#      every figure > 0) and, at stage 3 with both tiers on NVMe
#      (max_in_cpu=0: every parameter bucket in the swap file), the step's
#      "nvme": bytes read and written, busy/duplex time, combined GB/s and
#      its fraction of the disk's duplex figure (the ratio it says), and
#      "nvme_steps", one entry per timed step adding up to no more than the
#      total;
#   2. the optimizer tier alone (stage 3) has "nvme" too, and so has the
#      parameter tier put on NVMe by --ds_config_patch; a run without NVMe
#      has neither field;
#   3. bad values of the new flags exit 2 naming the flag; the swap files
#      and the baseline's files are gone afterwards.
set -u
bench="$1"
dir="${TEST_TMPDIR:-$(mktemp -d)}"
swap="$dir/swap"
mkdir -p "$swap"
fail() { echo "FAIL: $*"; exit 1; }
common=(--smoke --dtype=f32 --iters=3 --warmup=1 --nvme_path="$swap")

"$bench" "${common[@]}" --stages=3 --offload=both --offload_device=nvme \
  --offload_param_device=nvme --max_in_cpu=0 --disk_baseline=1 \
  --disk_baseline_bytes=4MiB > "$dir/both.jsonl" 2> "$dir/both.err" \
  || { tail "$dir/both.err"; fail "both tiers on nvme exited $?"; }
"$bench" "${common[@]}" --stages=3 --offload=optimizer --offload_device=nvme \
  > "$dir/opt.jsonl" 2> "$dir/opt.err" \
  || { tail "$dir/opt.err"; fail "optimizer on nvme exited $?"; }
"$bench" "${common[@]}" --stages=2 --offload=optimizer \
  > "$dir/cpu.jsonl" 2> "$dir/cpu.err" \
  || { tail "$dir/cpu.err"; fail "optimizer on cpu exited $?"; }
# The parameter tier put on NVMe by a config patch, not the flags.
cat > "$dir/patch.json" <<JSON
{"zero_optimization": {"offload_param": {"device": "nvme",
  "nvme_path": "$swap", "max_in_cpu": 0}}}
JSON
"$bench" "${common[@]}" --stages=3 --offload=both \
  --ds_config_patch="$dir/patch.json" > "$dir/patched.jsonl" \
  2> "$dir/patched.err" \
  || { tail "$dir/patched.err"; fail "patched parameter tier exited $?"; }
"$bench" "${common[@]}" --offload_param_device=disk > /dev/null \
  2> "$dir/bad.err"
status=$?
[[ $status -eq 2 ]] || fail "--offload_param_device=disk must exit 2, got $status"
grep -q "offload_param_device" "$dir/bad.err" || fail "the error must name the flag"
"$bench" "${common[@]}" --disk_baseline_bytes=3KiB > /dev/null 2> "$dir/bad2.err"
status=$?
[[ $status -eq 2 ]] || fail "--disk_baseline_bytes=3KiB must exit 2, got $status"
[[ -z "$(ls -A "$swap")" ]] || fail "files left behind: $(ls "$swap")"

python3 - "$dir" <<'PYTHON' || exit 1
import json, sys
d = sys.argv[1]
def lines(name):
    return [json.loads(l) for l in open(f"{d}/{name}")]
def close(a, b):
    return abs(a - b) <= 1e-6 * max(abs(a), abs(b)) + 1e-12

both = lines("both.jsonl")
assert [x["bench"] for x in both] == ["disk_baseline", "train_step"], both
disk, step = both
assert disk["bytes"] == 4 << 20 and disk["write_GBps"] > 0 and disk["read_GBps"] > 0, disk
assert disk["duplex"]["combined_GBps"] > 0, disk
assert "error" not in step, step
assert step["ds_config"]["zero_optimization"]["offload_param"]["device"] == "nvme", step["ds_config"]
nvme = step["nvme"]
for key in ("bytes_read", "bytes_written", "busy_ms", "read_busy_ms", "write_busy_ms",
            "wall_ms", "combined_GBps_busy", "combined_GBps_wall", "busy_fraction",
            "read_GBps_busy", "write_GBps_busy", "disk_duplex_GBps",
            "fraction_of_disk_duplex"):
    assert nvme[key] > 0, (key, nvme)
assert nvme["duplex_ms"] >= 0 and 0 <= nvme["duplex_fraction"] <= 1, nvme
assert nvme["busy_ms"] <= nvme["read_busy_ms"] + nvme["write_busy_ms"] + 1e-6, nvme
assert close(nvme["combined_GBps_busy"],
             (nvme["bytes_read"] + nvme["bytes_written"]) / (nvme["busy_ms"] / 1e3) / 1e9), nvme
assert close(nvme["fraction_of_disk_duplex"],
             nvme["combined_GBps_busy"] / disk["duplex"]["combined_GBps"]), nvme
assert close(nvme["disk_duplex_GBps"], disk["duplex"]["combined_GBps"]), nvme
steps = step["nvme_steps"]
assert len(steps) == 3, steps
for s in steps:
    assert s["bytes_read"] > 0 and s["bytes_written"] > 0 and s["wall_ms"] > 0, s
for key in ("bytes_read", "bytes_written"):
    assert sum(s[key] for s in steps) <= 3 * nvme[key] + 1e-6, (key, steps, nvme)

opt = lines("opt.jsonl")
assert len(opt) == 1 and "error" not in opt[0], opt
assert opt[0]["nvme"]["bytes_read"] > 0 and opt[0]["nvme"]["bytes_written"] > 0, opt[0]["nvme"]
assert len(opt[0]["nvme_steps"]) == 3 and "disk_duplex_GBps" not in opt[0]["nvme"], opt[0]
patched = lines("patched.jsonl")
assert len(patched) == 1 and "error" not in patched[0], patched
assert patched[0]["ds_config"]["zero_optimization"]["offload_param"]["device"] == "nvme", patched[0]
assert patched[0]["nvme"]["bytes_written"] > 0 and len(patched[0]["nvme_steps"]) == 3, patched[0]
cpu = lines("cpu.jsonl")
assert "nvme" not in cpu[0] and "nvme_steps" not in cpu[0], cpu[0]
print("nvme:", json.dumps(nvme))
PYTHON
echo PASS
