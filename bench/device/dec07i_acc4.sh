#!/bin/bash
# Ninth session of 2026-12-07 (carry gpu_pack at ed3f606 or later): issue
# 27's "stage 2 + offload_optimizer: cpu, accumulation 4: at least 97% of
# no offload" after ed3f606 (one rank's stage 2 accumulates into the
# partition: no bucket buffer, fill, copy or add per micro-batch). As run
# 69: 1.3B, micro-batch 16 x 1024, bf16, clipping 1.0, 30 warm-up steps on
# train_bench's repeated batch so that the timed steps' norms fall under
# 1.0 (the speculated update is then the exact one), 6 timed steps; all of
# the optimizer state on the host (ratio 1, DeepSpeed's placement) and the
# engine's own choice ("auto").
#   LIMIT=300 bash bench/device/dec07i_acc4.sh
source bench/device/setup.sh
BENCH_DEFAULTS="--batch=16 --seq=1024 --iters=6 --warmup=30 --dtype=bf16 --models=1.3B --stages=2 --accumulation=4 --reduce_bucket_size=5e7"
BENCH_TIMEOUT=90
bench none
bench r1 --offload=optimizer --offload_ratio=1
bench auto --offload=optimizer --offload_ratio=auto
python3 -c "
import json
base=None
for l in open('$OUT/train_bench.jsonl'):
  d=json.loads(l)
  if d.get('error'): print('ERROR', d['error'][:200]); continue
  w=d.get('offload_worker',{})
  if d['offload']=='none': base=d['tokens_per_s']
  print(d['offload'], d.get('offload_ratio_chosen'), 'acc', d['accumulation'], round(d['tokens_per_s']), '%.1f%%' % (100*d['tokens_per_s']/base) if base else '', round(d['step_ms'],1), 'cpu', w.get('optimizer_ms'), 'wait', w.get('engine_wait_ms'), d.get('speculation'), 'losses', [round(x,3) for x in d.get('losses',[])][-3:])" | cut -c1-400
el done
