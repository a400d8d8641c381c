#!/bin/bash
# Device call 7: the CPU optimizer's thread count in the engine (15 by
# default on 16 cores: one left to the engine thread) against all 16, now
# that tiles are handed out dynamically.
set -u
start=$SECONDS
mkdir -p /tmp/b && tar xJf gpu_pack/bundle.tar.xz -C /tmp/b
B=/tmp/b/gpu_bundle
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64
T="$B/bin/train_bench --models=1.3B --stages=2 --warmup=2 --iters=4 --offload=optimizer"
run() { echo "### $*" >> $OUT/train.txt; env "$@" >> $OUT/train.txt 2>> $OUT/train_err.txt; echo "done $* at $((SECONDS-start)) s"; }
run ZE_X=1 $T --delayed_update=1
run OMP_NUM_THREADS=16 $T --delayed_update=1
run OMP_NUM_THREADS=16 $T
run ZE_X=1 $T
python3 - $OUT/train.txt <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("###"): print(line.strip()); continue
    if not line.startswith("{"): continue
    d = json.loads(line)
    print(round(d["tokens_per_s"]), round(d["step_ms"], 1), d.get("offload_worker"))
PY
