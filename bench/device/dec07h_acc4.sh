#!/bin/bash
# Issue 27's "stage 2 + offload_optimizer, accumulation 4: at least 97% of
# no offload" after ed3f606 (one rank's stage 2 accumulates into the
# partition: no bucket buffer, fill, copy or add per micro-batch). 1.3B,
# micro-batch 16 x 1024, bf16, clipping 1.0 (carry gpu_pack):
#   LIMIT=170 bash bench/device/dec07h_acc4.sh
source bench/device/setup.sh
BENCH_DEFAULTS="--batch=16 --seq=1024 --iters=3 --warmup=1 --dtype=bf16 --models=1.3B --stages=2 --accumulation=4"
BENCH_TIMEOUT=45
bench none
bench r1 --offload=optimizer --offload_ratio=1
bench r04 --offload=optimizer --offload_ratio=0.4
python3 -c "
import json
for l in open('$OUT/train_bench.jsonl'):
  d=json.loads(l)
  if d.get('error'): print('ERROR', d['error'][:200]); continue
  w=d.get('offload_worker',{})
  print(d['offload'], d['ds_config']['zero_optimization'].get('offload_optimizer',{}).get('ratio'), d['accumulation'], round(d['tokens_per_s']), round(d['step_ms'],1), 'cpu', round(w.get('optimizer_ms',0)), 'wait', round(w.get('engine_wait_ms',0)), d.get('speculation'))"
