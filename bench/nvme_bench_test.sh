#!/bin/bash
# nvme_bench_test.sh NVME_BENCH, at 8 MiB on the test's temporary directory
# (whatever filesystem it is: buffered where O_DIRECT is refused, so only
# the fields and their sanity are checked, not the figures):
#   1. --mode=both prints the baseline (solo and "duplex"), the store's solo
#      line and its duplex line; every bandwidth > 0, the fractions are the
#      ratios they say, the duplex window within the whole transfer and the
#      store's duplex time within its busy time;
#   2. --mode=duplex alone (the store writes region A untimed) and
#      --mode=solo alone (no duplex figures);
#   3. bad flags exit non-zero naming the flag; no file is left behind.
set -u
bench="$1"
dir="${TEST_TMPDIR:-$(mktemp -d)}/nvme"
mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }
common=(--directory="$dir" --bytes=8MiB --chunk=2MiB --backend=threads
        --thread_count=2)

for mode in both duplex solo; do
  "$bench" "${common[@]}" --mode=$mode > "$dir/../$mode.jsonl" \
    2> "$dir/../$mode.err" \
    || { cat "$dir/../$mode.err"; fail "--mode=$mode exited $?"; }
done
"$bench" "${common[@]}" --mode=sideways > /dev/null 2> "$dir/../bad.err" \
  && fail "--mode=sideways must fail"
grep -q "mode" "$dir/../bad.err" || fail "the error must name --mode"
"$bench" "${common[@]}" --bytes=3KiB > /dev/null 2> "$dir/../bad2.err" \
  && fail "--bytes=3KiB must fail"
[[ -z "$(ls -A "$dir")" ]] || fail "files left behind: $(ls "$dir")"

python3 - "$dir/.." <<'PYTHON' || exit 1
import json, sys
d = sys.argv[1]
def lines(mode):
    return {x["bench"]: x for x in map(json.loads, open(f"{d}/{mode}.jsonl"))}
def close(a, b):
    return abs(a - b) <= 1e-6 * max(abs(a), abs(b)) + 1e-9

both = lines("both")
assert sorted(both) == ["baseline", "nvme_store", "nvme_store_duplex"], both
base = both["baseline"]
assert base["bytes"] == 8 << 20 and base["write_GBps"] > 0 and base["read_GBps"] > 0, base
dup = base["duplex"]
for key in ("read_GBps", "write_GBps", "combined_GBps", "window_seconds"):
    assert dup[key] > 0, (key, dup)
# Each thread stops when the first has moved its bytes: one moved them all.
assert max(dup["read_bytes"], dup["write_bytes"]) == 8 << 20, dup
assert close(dup["combined_GBps"], dup["read_GBps"] + dup["write_GBps"]), dup
solo = both["nvme_store"]
assert solo["write_GBps"] > 0 and solo["read_GBps"] > 0, solo
assert close(solo["write_fraction"], solo["write_GBps"] / base["write_GBps"]), solo

def check_duplex(line, baseline):
    for key in ("read_GBps", "write_GBps", "combined_GBps", "whole_combined_GBps",
                "window_seconds", "whole_seconds", "busy_seconds", "duplex_seconds"):
        assert line[key] > 0, (key, line)
    assert line["chunk"] == 2 << 20 and line["thread_count"] == 2, line
    assert line["backend"].startswith("threads"), line
    assert close(line["combined_GBps"], line["read_GBps"] + line["write_GBps"]), line
    assert close(line["combined_fraction"],
                 line["combined_GBps"] / baseline["duplex"]["combined_GBps"]), line
    assert line["window_seconds"] <= line["whole_seconds"] + 1e-9, line
    # The store's clock: both directions in flight within any in flight,
    # which lies within the whole transfer (plus timer slack).
    assert line["duplex_seconds"] <= line["busy_seconds"] + 1e-9, line
    assert line["busy_seconds"] <= line["whole_seconds"] + 1e-3, line
check_duplex(both["nvme_store_duplex"], base)

duplex = lines("duplex")
assert sorted(duplex) == ["baseline", "nvme_store_duplex"], duplex
check_duplex(duplex["nvme_store_duplex"], duplex["baseline"])

solo_only = lines("solo")
assert sorted(solo_only) == ["baseline", "nvme_store"], solo_only
assert "duplex" not in solo_only["baseline"], solo_only
print("nvme_bench duplex:", both["nvme_store_duplex"])
PYTHON
echo PASS
