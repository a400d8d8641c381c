#!/bin/bash
# Ninth session of 2026-12-07 (carry gpu_pack at ed3f606 or later, and
# .anchors = ../shared/anchors; needs the H200's 139 GiB): issue 27's 13B
# and 8B rows with the auto ratio, which on 139 GiB keeps most of the f32
# state on the GPU (train_gpt --dry_run --device_memory_gib=139 plans 13B
# at 0.50, the 8B at 0.05 with checkpointing and 0.35 without).
#   1. the Llama-3.1-8B shape, stage 2, micro-batch 8 x 1024, accumulation
#      4, bf16, exact f32 master and moments, clipping 1.0, ratio "auto",
#      without activation checkpointing (the step without recompute), 12
#      warm-up steps on train_bench's repeated batch so that the timed
#      steps' norms may fall under 1.0 and their updates be speculated, as
#      a fine-tune's mostly are (the first steps from random weights all
#      clip; run 69 at 1.3B: 40 steps);
#   2. PyTorch's llama8b_bf16_ckpt in the same call (bf16 weights and bf16
#      AdamW states, checkpointing, micro-batch 8);
#   3. the 13B GPT, stage 2, micro-batch 2 x 1024, accumulation 16, no
#      checkpointing, ratio "auto" (planned 0.55: 13.7 GiB of activations;
#      run 26: 1,700 tokens/s at ratio 0.6, micro-batch 4, accumulation 1,
#      checkpointing);
#   4. the 13B at micro-batch 8, accumulation 8, checkpointing (planned
#      0.50), while time is left.
#   LIMIT=560 bash bench/device/dec07i_h200.sh
# PARTS (default "8b torch 13b 13bck") picks and orders them, e.g.
# PARTS="13b 8b" after the 25B run on the same warm machine.
source bench/device/setup.sh
PARTS=${PARTS:-8b torch 13b 13bck}
BENCH_DEFAULTS="--seq=1024 --dtype=bf16 --stages=2 --offload=optimizer --offload_ratio=auto --iters=3 --warmup=1"
for part in $PARTS; do
  case $part in
    8b) BENCH_TIMEOUT=190
        bench l8b_nock --models=llama-8B --batch=8 --accumulation=4 --checkpointing=0 --warmup=12 --iters=4 ;;
    torch) el "pytorch"
        timeout 120 python3 .anchors/torch_llama_anchor.py llama8b_bf16_ckpt > $OUT/torch_llama8b.jsonl 2> $OUT/torch_llama8b.err
        el "pytorch rc=$?"; cut -c1-400 $OUT/torch_llama8b.jsonl; tail -2 $OUT/torch_llama8b.err | cut -c1-300 ;;
    13b) BENCH_TIMEOUT=200
        bench g13b_nock --models=13B --batch=2 --accumulation=16 --checkpointing=0 --iters=2 ;;
    13bck) BENCH_TIMEOUT=$(( $(left) - 10 ))
        bench g13b_ck --models=13B --batch=8 --accumulation=8 --checkpointing=1 --iters=2 ;;
  esac
done
python3 -c "
import json
for l in open('$OUT/train_bench.jsonl'):
  d=json.loads(l)
  if d.get('error'): print('ERROR', d['error'][:300]); continue
  w=d.get('offload_worker',{}); m=d.get('memory',{}); h=d.get('host_memory',{})
  print(d['model'], 'ckpt', d.get('checkpointing'), 'mb', d.get('batch'), 'acc', d['accumulation'], 'ratio', d.get('offload_ratio_chosen'), round(d['tokens_per_s']), 'tok/s step_ms', round(d['step_ms'],1), 'mfu', d.get('mfu'), 'cpu', w.get('optimizer_ms'), 'wait', w.get('engine_wait_ms'), d.get('speculation'), 'GPU peak %.2f GiB plan %.2f GiB' % (m.get('peak_bytes_in_use',0)/2**30, d['memory_breakdown']['device_bytes']/2**30), 'host rss %.1f GiB plan %.1f' % (h.get('peak_rss_bytes',0)/2**30, d['memory_breakdown']['host_bytes']/2**30), 'losses', [round(x,3) for x in d.get('losses',[])])" | cut -c1-900
grep -h "auto\"" $OUT/train_bench.err | cut -c1-300
tail -3 $OUT/train_bench.err | cut -c1-300
el done
