#!/bin/bash
# Device call 1 (eighth session): the offloaded update as one stream of
# tiles (e6b9f2a), A/B in the same call against d35bdda's train_bench
# (gpu_pack/before/, same libraries); cpu_adam_bench's chunked timings
# (per-chunk calls against the stream); then the gpu tests.
set -u
start=$SECONDS
mkdir -p /tmp/b && tar xJf gpu_pack/bundle.tar.xz -C /tmp/b
B=/tmp/b/gpu_bundle
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64
{ date -u; nproc; free -g; nvidia-smi --query-gpu=name,memory.used,power.limit --format=csv; } > $OUT/facts.txt 2>&1
NEW=$B/bin/train_bench
OLD=gpu_pack/before/train_bench
run() { echo "### $*" >> $OUT/train.txt; "$@" >> $OUT/train.txt 2>> $OUT/train_err.txt; echo "done $* at $((SECONDS-start)) s"; }
$B/bin/cpu_adam_bench --threads=15,16 --steps=6 --chunk_elements=16777216 > $OUT/cpu_adam.txt 2>&1
echo "cpu_adam done at $((SECONDS-start)) s"; cat $OUT/cpu_adam.txt
S2="--models=1.3B --stages=2 --warmup=2 --gradient_clipping=0 --reduce_bucket_size=5e7"
run $NEW $S2 --iters=4
run $NEW $S2 --iters=4 --offload=optimizer
run $OLD $S2 --iters=4 --offload=optimizer
run $NEW $S2 --iters=4 --offload=optimizer
run $OLD $S2 --iters=4 --offload=optimizer
run $NEW $S2 --iters=3 --accumulation=4
run $NEW $S2 --iters=3 --accumulation=4 --offload=optimizer
run $OLD $S2 --iters=3 --accumulation=4 --offload=optimizer
S3="--models=1.3B --stages=3 --warmup=2 --iters=3 --offload=both"
run $NEW $S3
run $OLD $S3
python3 - $OUT/train.txt <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("###"): print(line.strip()[:200]); continue
    if not line.startswith("{"): continue
    d = json.loads(line)
    print(round(d.get("tokens_per_s", 0)), round(d.get("step_ms", 0), 1), d.get("offload_worker"), d.get("error"))
PY
left=$((570 - (SECONDS - start)))
echo "gpu tests with ${left} s left"
OUT=/tmp/gt timeout ${left} $B/run_gpu_tests.sh > $OUT/gpu_tests.txt 2>&1; tail -25 $OUT/gpu_tests.txt
