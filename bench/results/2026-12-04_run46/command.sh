#!/bin/bash
# Device call 11 (seventh session): the offloaded update's chunk size
# (sub_group_size 4M, the old cap, against the new cap's 16M), stage 2
# 1.3B, with and without clipping, with the no-offload runs.
set -u
start=$SECONDS
mkdir -p /tmp/b && tar xJf gpu_pack/bundle.tar.xz -C /tmp/b
B=/tmp/b/gpu_bundle
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64
{ date -u; nproc; free -g; nvidia-smi --query-gpu=name,memory.used,power.limit --format=csv; } > $OUT/facts.txt 2>&1
run() { echo "### $*" >> $OUT/train.txt; "$@" >> $OUT/train.txt 2>> $OUT/train_err.txt; echo "done $* at $((SECONDS-start)) s"; }
S2="$B/bin/train_bench --models=1.3B --stages=2 --warmup=2 --gradient_clipping=0 --reduce_bucket_size=5e7"
run $S2 --iters=4
run $S2 --iters=4 --offload=optimizer --sub_group_size=4194304
run $S2 --iters=4 --offload=optimizer
run $S2 --iters=3 --accumulation=4
run $S2 --iters=3 --accumulation=4 --offload=optimizer
C="$B/bin/train_bench --models=1.3B --stages=2 --warmup=2 --iters=4"
run $C
run $C --offload=optimizer --sub_group_size=4194304
run $C --offload=optimizer
python3 - $OUT/train.txt <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("###"): print(line.strip()[:200]); continue
    if not line.startswith("{"): continue
    d = json.loads(line)
    print(round(d.get("tokens_per_s", 0)), round(d.get("step_ms", 0), 1), d.get("offload_worker"), d.get("error"))
PY
