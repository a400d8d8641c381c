#!/bin/bash
# Sixth session of 2026-12-07, call 5 (carry gpu_pack: train_bench at
# e208198 or later): stage 3's offloaded buckets the last modules' (their
# CPU update begins early in backward; the next forward reads them last),
# against run 73's first modules': 1.3B, micro-batch 16 x 1024, bf16,
# clipping 1.0, stage 3 without offload and with both offloads at ratio
# 0.5 and 0.3, the optimizer alone at 0.4. Then, where the pack has
# functional_cuda_bench (GPU_BUNDLE_ONLY="train_bench functional_cuda_bench",
# ~9 MB), LayerNorm's forward and backward at GPT 13B's and 25B's widths
# (90190f2's four-vector team kernel: never timed; run 73's lines ran the
# default shape).
rm -rf /tmp/b  # a warm machine may hold an older pack
source bench/device/setup.sh
BENCH_DEFAULTS="--batch=16 --seq=1024 --iters=5 --warmup=2 --dtype=bf16 --models=1.3B --stages=3"
BENCH_TIMEOUT=75
bench s3none
bench b0.5 --offload=both --offload_ratio=0.5
bench b0.3 --offload=both --offload_ratio=0.3
bench o0.4 --offload=optimizer --offload_ratio=0.4
python3 -c "
import json
base=None
for l in open('$OUT/train_bench.jsonl'):
  d=json.loads(l)
  if d.get('error'): print('ERROR', d['error'][:200]); continue
  w=d.get('offload_worker',{})
  if d['offload']=='none': base=d['tokens_per_s']
  print(d['offload'], d['ds_config']['zero_optimization'].get('offload_optimizer',{}).get('ratio','-'), round(d['tokens_per_s']), '%.1f%%' % (100*d['tokens_per_s']/base), round(d['step_ms'],1), 'cpu', w.get('optimizer_ms'), 'wait', w.get('engine_wait_ms'), d.get('speculation'), 'peak %.2f GB' % (d.get('memory',{}).get('peak_bytes_in_use',0)/1e9))" | cut -c1-400
if [[ -x $B/bin/functional_cuda_bench ]]; then
  for shape in "5120 40" "6144 48" "2048 32"; do
    set -- $shape
    timeout 60 $B/bin/functional_cuda_bench batch=4 seq=1024 channels=$1 heads=$2 \
      vocab=50304 dtype=bf16 iters=20 2>/dev/null | grep -i "layer_\?norm" \
      | sed "s/^/C=$1 /" | cut -c1-200
  done
fi
el done
