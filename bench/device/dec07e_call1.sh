#!/bin/bash
# Fifth session of 2026-12-07, call 1 (carry gpu_pack):
# 1. The whole gpu suite: the shared softmax-gradient expression of the
#    cross-entropy backwards (c42add3, compiled only until now) and the
#    8-bit codes' single hash per element (optimizer_cuda_test: the CUDA
#    kernel against the CPU's codes, bit for bit).
# 2. Issue 28's 1.3B activation pair (checkpointing vs + cpu_checkpointing,
#    1024-row loss chunks) with the attention workspaces allocated per call
#    (ad11d3c): target -50% peak activation memory for at most +3% time.
# 3. cpu_adam_bench's formats on this host at all its cores: the 8-bit
#    moments' parameters per second with the cheaper stochastic codes
#    (run 71: the 8B's host update 2013 ms against 1337 ms before them).
source bench/device/setup.sh
timeout 240 $B/run_gpu_tests.sh > $OUT/gpu_tests.txt 2>&1
el "gpu tests rc=$?"
grep -h "^FAILED\|^SKIPPED\|gpu tests:" $OUT/gpu_tests.txt | cut -c1-200
grep -A12 "^FAILED" $OUT/gpu_tests.txt | grep "Failure\|Expected\|Which is\|actual\|FAILED  \]" | head -20

BENCH_DEFAULTS="--batch=16 --seq=1024 --iters=4 --warmup=2 --dtype=bf16 --stages=0 --checkpointing=1 --loss_chunk_rows=1024 --peak_attribution=1"
BENCH_TIMEOUT=70
bench ck13 --models=1.3B
bench cpu13 --models=1.3B --cpu_checkpointing=1
python3 -c "
import json
for l in open('$OUT/train_bench.jsonl'):
  d=json.loads(l); print({k:d.get(k) for k in ['model','cpu_checkpointing','step_ms','tokens_per_s','loss','peak_bytes_above_initialize','error']})
  if 'peak_attribution' in d:
    for label, b in d['peak_attribution']['bytes_by_scope'][:6]: print('   %-40s %8.3f GB' % (label, b / 1e9))" | cut -c1-400
(( $(left) > 60 )) && timeout $(( $(left) - 10 )) $B/bin/cpu_adam_bench \
  --threads=16 --params=200000000 --steps=3 > $OUT/cpu_adam.jsonl 2> $OUT/cpu_adam.err
el "cpu_adam_bench rc=$?"
python3 -c "
import json
for l in open('$OUT/cpu_adam.jsonl'):
  d=json.loads(l)
  if d.get('bench')=='cpu_adam_formats': print(d['format'], '%.3g params/s' % d['params_per_s'], 'of bound %.2f' % d['fraction_of_bound'])"
