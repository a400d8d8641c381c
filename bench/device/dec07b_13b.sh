#!/bin/bash
# Issue 27's 13B figure (needs the H200): run 26's placement (ZeRO stage 2,
# offload_optimizer cpu with ratio 0.6, micro-batch 4 x 1024, activation
# checkpointing, clipping 1.0) at accumulation 1 (run 26: 1,700 tokens/s)
# and 8 (the CPU update once per 8 micro-batches). Carry gpu_pack.
source bench/device/setup.sh
BENCH_DEFAULTS="--models=13B --stages=2 --batch=4 --seq=1024 --checkpointing=1 --offload=optimizer --offload_ratio=0.6 --dtype=bf16 --iters=2 --warmup=1"
BENCH_TIMEOUT=200
bench acc1
bench acc8 --accumulation=8
python3 -c "
import json
for l in open('$OUT/train_bench.jsonl'):
  d=json.loads(l); print({k:d.get(k) for k in ['model','accumulation','tokens_per_s','step_ms','mfu_pct','loss','grad_norm','speculation','offload_worker','memory','error']})" | cut -c1-900
tail -3 $OUT/train_bench.err | cut -c1-300
(cd $OUT && tar czf /tmp/all.tgz . && find . -mindepth 1 -delete && mv /tmp/all.tgz $OUT/all.tgz)
