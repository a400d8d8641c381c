#!/bin/bash
# Device call 5 (eighth session): the gpu tests on db31407, the final code (the
# stream's producer sets the device), and one 1.3B stage-2 offload and one
# stage-3 both-offload run as a check that nothing moved.
set -u
start=$SECONDS
mkdir -p /tmp/b && tar xJf gpu_pack/bundle.tar.xz -C /tmp/b
B=/tmp/b/gpu_bundle
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64
{ date -u; nproc; free -g; nvidia-smi --query-gpu=name,memory.used,power.limit --format=csv; } > $OUT/facts.txt 2>&1
OUT=/tmp/gt timeout 300 $B/run_gpu_tests.sh > $OUT/gpu_tests.txt 2>&1; tail -22 $OUT/gpu_tests.txt
echo "gpu tests done at $((SECONDS-start)) s"
run() { echo "### $*" >> $OUT/train.txt; "$@" >> $OUT/train.txt 2>> $OUT/train_err.txt; echo "done $* at $((SECONDS-start)) s"; }
S2="--models=1.3B --stages=2 --warmup=2 --gradient_clipping=0 --reduce_bucket_size=5e7"
run $B/bin/train_bench $S2 --iters=4
run $B/bin/train_bench $S2 --iters=4 --offload=optimizer
run $B/bin/train_bench --models=1.3B --stages=3 --warmup=2 --iters=3 --offload=both
python3 - $OUT/train.txt <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("###"): print(line.strip()[:200]); continue
    if not line.startswith("{"): continue
    d = json.loads(line)
    print(round(d.get("tokens_per_s", 0)), round(d.get("step_ms", 0), 1), d.get("offload_worker"), d.get("error"))
PY
