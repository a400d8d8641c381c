#!/bin/bash
# Device call 12 (seventh session): the early-begun update taking the newest
# landed bucket during backward, A/B against b42ff1b's train_bench
# (gpu_pack/before/) in the same call: 1.3B stage 2 without clipping.
set -u
start=$SECONDS
mkdir -p /tmp/b && tar xJf gpu_pack/bundle.tar.xz -C /tmp/b
B=/tmp/b/gpu_bundle
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64
{ date -u; nproc; free -g; nvidia-smi --query-gpu=name,memory.used,power.limit --format=csv; } > $OUT/facts.txt 2>&1
run() { echo "### $*" >> $OUT/train.txt; "$@" >> $OUT/train.txt 2>> $OUT/train_err.txt; echo "done $* at $((SECONDS-start)) s"; }
NEW=$B/bin/train_bench
OLD=gpu_pack/before/train_bench
S2="--models=1.3B --stages=2 --warmup=2 --gradient_clipping=0 --reduce_bucket_size=5e7"
run $NEW $S2 --iters=4
run $NEW $S2 --iters=4 --offload=optimizer
run $OLD $S2 --iters=4 --offload=optimizer
run $NEW $S2 --iters=3 --accumulation=4
run $NEW $S2 --iters=3 --accumulation=4 --offload=optimizer
python3 - $OUT/train.txt <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("###"): print(line.strip()[:200]); continue
    if not line.startswith("{"): continue
    d = json.loads(line)
    print(round(d.get("tokens_per_s", 0)), round(d.get("step_ms", 0), 1), d.get("offload_worker"), d.get("error"))
PY
