#!/bin/bash
# Ninth session of 2026-12-07, for an H100 (carry gpu_pack; pack at 2af5e62
# or later): issue 27's accumulation-4 pair past the clipping phase
# (dec07i_acc4.sh), then the 8B Llama shape with the auto ratio past its
# first clipped steps: stage 2, micro-batch 8 x 1024, accumulation 4,
# checkpointing, exact f32 state, clipping 1.0, 12 warm-up steps on
# train_bench's repeated batch so that the timed steps may be speculated
# (run 77: every step clipped, 7,584 tokens/s, the GPU waiting 1.0 s of
# 4.3 s for the CPU's share).
#   LIMIT=560 bash bench/device/dec07i_h100.sh
source bench/device/setup.sh
LIMIT_ACC4=$(( LIMIT - 220 ))
LIMIT=$LIMIT_ACC4 bash bench/device/dec07i_acc4.sh 2>&1 | grep -v "^\[+" | grep -v "^NVIDIA"
el "acc4 done"
BENCH_DEFAULTS="--seq=1024 --dtype=bf16 --stages=2 --offload=optimizer --offload_ratio=auto"
BENCH_TIMEOUT=$(( $(left) - 10 ))
bench l8b_ck --models=llama-8B --batch=8 --accumulation=4 --checkpointing=1 --warmup=12 --iters=4
python3 -c "
import json
for l in open('$OUT/train_bench.jsonl'):
  d=json.loads(l)
  if d.get('model')!='llama-8B': continue
  if d.get('error'): print('ERROR', d['error'][:300]); continue
  w=d.get('offload_worker',{}); m=d.get('memory',{})
  print('8B ratio', d.get('offload_ratio_chosen'), round(d['tokens_per_s']), 'tok/s step_ms', round(d['step_ms'],1), 'mfu', d.get('mfu'), 'cpu', w.get('optimizer_ms'), 'wait', w.get('engine_wait_ms'), d.get('speculation'), 'GPU peak %.2f GiB plan %.2f' % (m.get('peak_bytes_in_use',0)/2**30, d['memory_breakdown']['device_bytes']/2**30), 'losses', [round(x,3) for x in d.get('losses',[])])" | cut -c1-700
el done
