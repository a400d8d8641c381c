#!/bin/bash
# Sixth session of 2026-12-07, call 2 (the pack of call 1 still unpacked):
# issue 27's offload targets with part of the f32 state on the GPU
# (offload_optimizer.ratio = the share updated on the CPU), each against no
# offload in the same call: 1.3B, micro-batch 16 x 1024, bf16, clipping 1.0:
# stage 2 at ratio 0.4 (call 1: 0.5 gave 89.9%); stage 2 accumulation 4 at
# ratio 1.0 and 0.5 (target 97%); stage 3 with both offloads at 0.5 and
# 0.4 (target 85%).
source bench/device/setup.sh
BENCH_DEFAULTS="--batch=16 --seq=1024 --iters=5 --warmup=2 --dtype=bf16 --models=1.3B"
BENCH_TIMEOUT=75
bench s2none --stages=2
bench s2r0.4 --stages=2 --offload=optimizer --offload_ratio=0.4
bench s3none --stages=3
bench s3both0.5 --stages=3 --offload=both --offload_ratio=0.5
bench s3both0.4 --stages=3 --offload=both --offload_ratio=0.4
BENCH_DEFAULTS="--batch=16 --seq=1024 --iters=3 --warmup=1 --dtype=bf16 --models=1.3B --accumulation=4"
BENCH_TIMEOUT=90
bench a4none --stages=2
bench a4r1.0 --stages=2 --offload=optimizer --offload_ratio=1.0
bench a4r0.5 --stages=2 --offload=optimizer --offload_ratio=0.5
python3 -c "
import json
base={}
for l in open('$OUT/train_bench.jsonl'):
  d=json.loads(l)
  if d.get('error'): print('ERROR', d['error'][:200]); continue
  ratio=d['ds_config']['zero_optimization'].get('offload_optimizer',{}).get('ratio','-')
  key=(d['stage'], d['accumulation'])
  if d['offload']=='none': base[key]=d['tokens_per_s']
  b=base.get(key)
  w=d.get('offload_worker',{})
  print('stage %s acc %s offload=%s ratio=%s %.0f tokens/s %.1f ms %s; cpu update %s ms, engine wait %s ms; speculation %s; peak GPU %.2f GB' % (
    d['stage'], d['accumulation'], d['offload'], ratio, d['tokens_per_s'], d['step_ms'],
    '(%.1f%% of no offload)' % (100*d['tokens_per_s']/b) if b else '',
    w.get('optimizer_ms'), w.get('engine_wait_ms'), d.get('speculation'),
    d.get('memory',{}).get('peak_bytes_in_use',0)/1e9))
" | cut -c1-400
el done
