#!/bin/bash
# train_bench_flags_test.sh TRAIN_BENCH, on the CPU (tiny GPT).
# --ds_config_patch: the
# --ds_config_patch file is merged (RFC 7386) over the generated config of
# every run and the run trains with it: 8-bit moments and a speculation
# buffer of 0 appear in the line's ds_config, a key set to null is gone,
# and the same run without the patch has none of them. A missing file or
# one that is not a JSON object exits 2 naming the flag.
# --peak_attribution=1: the line breaks the steps' memory peak down by the
# module scope that allocated each live block, model state first.
set -u
bench="$1"
dir="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*"; exit 1; }
common=(--smoke --stages=2 --offload=optimizer --iters=1 --warmup=1)
cat > "$dir/patch.json" <<'JSON'
{"optimizer": {"params": {"blockwise_8bit_moments": true}},
 "zero_optimization": {"offload_optimizer": {"speculation_buffer_size": 0},
                       "allgather_bucket_size": null}}
JSON
"$bench" "${common[@]}" --ds_config_patch="$dir/patch.json" \
  > "$dir/patched.jsonl" 2> "$dir/patched.err" \
  || { tail "$dir/patched.err"; fail "patched run exited $?"; }
"$bench" "${common[@]}" --peak_attribution=1 > "$dir/plain.jsonl" 2> "$dir/plain.err" \
  || { tail "$dir/plain.err"; fail "plain run exited $?"; }
python3 - "$dir" <<'PYTHON' || exit 1
import json, math, sys
d = sys.argv[1]
(patched,) = [json.loads(l) for l in open(f"{d}/patched.jsonl")]
(plain,) = [json.loads(l) for l in open(f"{d}/plain.jsonl")]
for x in (patched, plain):
    assert "error" not in x and math.isfinite(x["loss"]), x
c, p = patched["ds_config"], plain["ds_config"]
assert c["optimizer"]["params"]["blockwise_8bit_moments"] is True, c
assert c["zero_optimization"]["offload_optimizer"]["speculation_buffer_size"] == 0, c
assert "allgather_bucket_size" not in c["zero_optimization"], c
assert c["optimizer"]["params"]["lr"] == p["optimizer"]["params"]["lr"], (c, p)
assert "blockwise_8bit_moments" not in p["optimizer"]["params"], p
assert "allgather_bucket_size" in p["zero_optimization"], p
# The engine honoured the patch: nothing speculated with a buffer of 0.
assert patched["speculation"]["committed"] + patched["speculation"]["redone"] == 0, patched
# The plain run's peak, by scope: model state (live before the steps)
# and the layers' forward or backward buffers, largest first.
a = plain["peak_attribution"]
labels = dict(a["bytes_by_scope"])
sizes = [b for _, b in a["bytes_by_scope"]]
assert sizes == sorted(sizes, reverse=True) and sum(sizes) == a["peak_bytes"], a
assert labels.get("(before attribution)", 0) > 0, a
assert any(l.startswith("Linear ") for l in labels), a
assert "peak_attribution" not in patched, patched
print("train_bench_flags_test: ok")
PYTHON
for bad in "$dir/none.json" "$dir/list.json"; do
  echo '[1, 2]' > "$dir/list.json"
  "$bench" "${common[@]}" --ds_config_patch="$bad" > "$dir/bad.jsonl" 2>&1
  status=$?
  [[ $status -eq 2 ]] || fail "--ds_config_patch=$bad must exit 2, got $status"
  grep -q -- "--ds_config_patch=$bad" "$dir/bad.jsonl" \
    || fail "the error must name the flag: $(cat "$dir/bad.jsonl")"
done
