#!/bin/bash
# Seventh session of 2026-12-07 (carry gpu_pack with train_bench, and
# .anchors = ../shared/anchors): issue 27's 8B row on whatever card comes.
# Ours: the Llama-3.1-8B shape, stage 2, accumulation 4 of micro-batch 8,
# sequence 1024, bf16 with exact f32 master and moments (70% of them on the
# host: what fits beside the 16-bit weights and gradients on 80 GB),
# activation checkpointing, clipping 1.0. PyTorch in the same call: the
# anchor's llama8b_bf16_ckpt (bf16 weights and bf16 AdamW states,
# checkpointing, micro-batch 8). Run 67 gave the 8B 150 s and it did not
# finish: this call gives it 330 s. RATIO=auto (a pack at or after the
# commit that added offload_optimizer.ratio "auto") lets the engine choose
# the share from the card's free memory.
rm -rf /tmp/b
source bench/device/setup.sh
RATIO=${RATIO:-0.7}
BENCH_DEFAULTS="--seq=1024 --dtype=bf16 --models=llama-8B --stages=2 --batch=8 --accumulation=4 --checkpointing=1 --iters=3 --warmup=1"
BENCH_TIMEOUT=330
bench ours8b --offload=optimizer --offload_ratio=$RATIO
python3 -c "
import json
for l in open('$OUT/train_bench.jsonl'):
  d=json.loads(l)
  if d.get('error'): print('ERROR', d['error'][:300]); continue
  w=d.get('offload_worker',{}); m=d.get('memory',{})
  print('ours 8B ratio', d.get('offload_ratio_chosen'), round(d['tokens_per_s']), 'step_ms', round(d['step_ms'],1), 'cpu', w.get('optimizer_ms'), 'wait', w.get('engine_wait_ms'), d.get('speculation'), 'peak %.2f GB' % (m.get('peak_bytes_in_use',0)/1e9), {k: d[k] for k in d if 'host' in k or 'pinned' in k or 'pageable' in k})" | cut -c1-700
tail -5 $OUT/train_bench.err | cut -c1-300
el "pytorch"
timeout $(( $(left) - 10 )) python3 .anchors/torch_llama_anchor.py llama8b_bf16_ckpt > $OUT/torch_llama8b.jsonl 2> $OUT/torch_llama8b.err
el "pytorch rc=$?"; cut -c1-400 $OUT/torch_llama8b.jsonl; tail -3 $OUT/torch_llama8b.err | cut -c1-300
el done
