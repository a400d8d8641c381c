#!/bin/bash
# Eighth session of 2026-12-07, second call (carry gpu_pack with
# train_bench and cpu_adam_bench at 2c982d1 or later): where the 8B step's
# device memory above the plan goes (run 76: 17.65 GiB above Initialize
# against 6.1 GiB of activations estimated), by allocation scope
# (--peak_attribution), separating accumulation (the stage 2 gradient
# buckets' transient buffers from the second micro-batch on) from the
# device's share of the update (ratio < 1); then the CPU Adam per format
# with the 8-bit grid codes. Runs 75-76 measured 21.28 GiB above
# Initialize at ratio 0.7 and 17.65 at 0.65 (both accumulation 4): the
# activations (6.1) and the gradient buckets (6.8, 9033782) leave 8.4 and
# 4.8 GiB that grow with the host's share; r07a4 repeats run 75's.
#   LIMIT=560 bash bench/device/dec07h_8b_peak.sh
source bench/device/setup.sh
BENCH_DEFAULTS="--seq=1024 --dtype=bf16 --models=llama-8B --stages=2 --batch=8 --checkpointing=1 --iters=1 --warmup=1 --offload=optimizer --peak_attribution=1"
BENCH_TIMEOUT=150
bench r065a4 --offload_ratio=0.65 --accumulation=4
bench r07a4 --offload_ratio=0.7 --accumulation=4
bench r065a1 --offload_ratio=0.65 --accumulation=1
bench r1a4 --offload_ratio=1 --accumulation=4
python3 -c "
import json
for l in open('$OUT/train_bench.jsonl'):
  d=json.loads(l)
  if d.get('error'): print('ERROR', d['error'][:300]); continue
  pa=d.get('peak_attribution',{})
  print(d['offload_ratio'] if 'offload_ratio' in d else d['ds_config']['zero_optimization']['offload_optimizer'].get('ratio'), 'acc', d['accumulation'], 'after init %.2f GiB' % (d['bytes_in_use_after_initialize']/2**30), 'above init %.2f GiB' % (d['peak_bytes_above_initialize']/2**30), 'plan device %.2f GiB' % (d['memory_breakdown']['device_bytes']/2**30))
  print('   ', [(k, round(v/2**30,3)) for k,v in pa.get('bytes_by_scope',[])][:12])"
timeout $(( $(left) - 10 )) $B/bin/cpu_adam_bench --threads=16 --params=200000000 --steps=3 > $OUT/cpu_adam.jsonl 2> $OUT/cpu_adam.err
el "cpu_adam rc=$?"
python3 -c "
import json
for l in open('$OUT/cpu_adam.jsonl'):
  d=json.loads(l)
  if d['bench']=='bandwidth': print('triad', d.get('triad_GBps'))
  if d['bench']=='cpu_adam_formats': print(d['format'], '%.2f G params/s' % (d['params_per_s']/1e9), 'bound fraction %.2f' % d['fraction_of_bound'])"
el done
