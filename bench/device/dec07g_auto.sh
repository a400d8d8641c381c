#!/bin/bash
# Seventh session of 2026-12-07, for the next GPU call (carry gpu_pack with
# train_bench at 2866fc5 or later, and .anchors = ../shared/anchors):
# offload_optimizer.ratio "auto" (engine/auto_offload_ratio.h) on the card.
# 1.3B, micro-batch 16 x 1024, bf16, clipping 1.0: stage 2 and stage 3 (both
# offloads) without offload, at ratio 1.0 and at "auto" (on an 80 GB card
# the 1.3B fits whole: auto takes the key's smallest share, 0.05; the line
# shows what that costs against no offload). Then the Llama-3.1-8B shape as
# in run 75 at "auto" (its state does not fit: the engine picks the share)
# beside PyTorch's bf16-state anchor in the same call.
rm -rf /tmp/b
source bench/device/setup.sh
BENCH_DEFAULTS="--batch=16 --seq=1024 --iters=5 --warmup=2 --dtype=bf16 --models=1.3B"
BENCH_TIMEOUT=75
bench s2none --stages=2
bench s2r1 --stages=2 --offload=optimizer --offload_ratio=1
bench s2auto --stages=2 --offload=optimizer --offload_ratio=auto
bench s3auto --stages=3 --offload=both --offload_ratio=auto
BENCH_DEFAULTS="--seq=1024 --dtype=bf16 --models=llama-8B --stages=2 --batch=8 --accumulation=4 --checkpointing=1 --iters=3 --warmup=1"
BENCH_TIMEOUT=$(( $(left) - 120 ))
bench ours8b --offload=optimizer --offload_ratio=auto
python3 -c "
import json
for l in open('$OUT/train_bench.jsonl'):
  d=json.loads(l)
  if d.get('error'): print('ERROR', d['error'][:300]); continue
  w=d.get('offload_worker',{}); m=d.get('memory',{})
  print(d['model'], d['stage'], d['offload'], 'ratio', d.get('offload_ratio_chosen'), round(d['tokens_per_s']), round(d['step_ms'],1), 'cpu', w.get('optimizer_ms'), 'wait', w.get('engine_wait_ms'), d.get('speculation'), 'peak %.2f GB' % (m.get('peak_bytes_in_use',0)/1e9))" | cut -c1-400
grep -h 'ratio "auto"' $OUT/train_bench.err | cut -c1-400
if (( $(left) > 100 )); then
  timeout $(( $(left) - 10 )) python3 .anchors/torch_llama_anchor.py llama8b_bf16_ckpt > $OUT/torch_llama8b.jsonl 2> $OUT/torch_llama8b.err
  el "pytorch rc=$?"; cut -c1-400 $OUT/torch_llama8b.jsonl
fi
el done
