#!/bin/bash
# Issue 28's "NVMe traffic at the disk's duplex bandwidth", in one call
# (carry gpu_pack): the swap files under $NVME (default /tmp/nv; each run
# removes its files).
#   1. nvme_bench at 4 GiB: the dd-like baseline (each direction alone and
#      both at once) and the store solo and duplex, at DeepSpeed's aio
#      defaults (1 MiB blocks, queue depth 8) and at 4 MiB / 32;
#   2. train_bench, stage 3, both tiers on NVMe (max_in_cpu=0: every
#      parameter bucket in the swap file), --disk_baseline=1: the disk's
#      duplex figure measured by the same process before the steps, each
#      line's nvme.fraction_of_disk_duplex the issue's measure (>= 0.9): the
#      1.3B GPT, then the 2.7B while LIMIT (default 560 s) allows; swap
#      buffers of 2e8 elements (nvme_param_buffers.json: the default 1e8 is
#      smaller than either model's token table, refused in run 69 call 2).
# Prints the figures; the JSON lines are in $OUT/nvme_bench.jsonl and
# $OUT/train_bench.jsonl.
source bench/device/setup.sh
NVME=${NVME:-/tmp/nv}
mkdir -p "$NVME"
df -h "$NVME" | tee $OUT/df.txt
for aio in "1MiB 8" "4MiB 32"; do set -- $aio
  (( $(left) > 60 )) || break
  timeout 120 $B/bin/nvme_bench --directory=$NVME --bytes=4GiB \
    --block_size=$1 --queue_depth=$2 >> $OUT/nvme_bench.jsonl \
    2>> $OUT/nvme_bench.err
  el "nvme_bench $1 $2 rc=$?"
done
for model in 1.3B 2.7B; do
  (( $(left) > 120 )) || { el "skip $model"; break; }
  timeout $(( $(left) - 5 )) $B/bin/train_bench --models=$model --stages=3 \
    --batch=16 --seq=1024 --iters=3 --warmup=1 --dtype=bf16 --offload=both \
    --offload_device=nvme --offload_param_device=nvme --max_in_cpu=0 \
    --nvme_path=$NVME --disk_baseline=1 --disk_baseline_bytes=4GiB \
    --ds_config_patch=bench/device/nvme_param_buffers.json \
    >> $OUT/train_bench.jsonl 2>> $OUT/train_bench.err
  el "train_bench $model rc=$?"
done
python3 - $OUT <<'PYTHON'
import json, sys
out = sys.argv[1]
def lines(name):
    try:
        return [json.loads(l) for l in open(f"{out}/{name}")]
    except FileNotFoundError:
        return []
for d in lines("nvme_bench.jsonl"):
    if d["bench"] == "baseline":
        print("dd-like:", {k: d.get(k) for k in ("write_GBps", "read_GBps", "duplex")})
    elif d["bench"] == "nvme_store_duplex":
        print("store duplex:", {k: d.get(k) for k in (
            "block_size", "queue_depth", "read_GBps", "write_GBps", "combined_GBps",
            "combined_fraction", "whole_combined_GBps", "duplex_seconds", "busy_seconds")})
    else:
        print("store solo:", {k: d.get(k) for k in (
            "block_size", "queue_depth", "write_GBps", "read_GBps",
            "write_fraction", "read_fraction")})
for d in lines("train_bench.jsonl"):
    if d["bench"] == "disk_baseline":
        print("disk baseline:", d.get("duplex"))
        continue
    print(d["model"], {k: d.get(k) for k in ("step_ms", "tokens_per_s", "loss", "error")})
    print("  nvme:", d.get("nvme"))
    for s in d.get("nvme_steps", []):
        print("  step:", s)
PYTHON
