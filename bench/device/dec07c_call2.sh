#!/bin/bash
# Third session of 2026-12-07, call 2, on an H200 (carry gpu_pack, pack at
# 643f747): issue 28's 25B (bench/device/issue28_25b.sh with 2 timed steps
# after 1 warm-up), then, with the time left, the GPU parity test that
# runs the merged device-updated buckets' copy to the weights' tier
# (parity_cuda_w1: its cpuhalfparam and nvmehalfparam modes), then issue
# 27's 13B at accumulation 8 (stage 2, 60% of the optimizer state on the
# host).
START=$(date +%s)
ITERS=2 bash bench/device/issue28_25b.sh
source bench/device/setup.sh
T0=$START  # the call's clock, for `left`
if (( $(left) > 100 )); then
  mkdir -p $OUT/logs
  OUT=$OUT/logs timeout $(( $(left) - 10 )) $B/run_gpu_tests.sh parity_cuda_w1_test \
    > $OUT/logs/parity_cuda_w1.txt 2>&1
  el "parity_cuda_w1 rc=$?"
  grep -h "gpu tests:\|^FAILED\|OK \]\|FAILED  \]" $OUT/logs/parity_cuda_w1.txt | tail -8
fi
if (( $(left) > 200 )); then
  BENCH_DEFAULTS="--batch=4 --seq=1024 --dtype=bf16"
  BENCH_TIMEOUT=$(( $(left) - 15 ))
  bench 13Bacc8 --models=13B --stages=2 --checkpointing=1 --offload=optimizer \
    --offload_ratio=0.6 --iters=2 --warmup=1 --accumulation=8
  python3 -c "
import json
for l in open('$OUT/train_bench.jsonl'):
  d=json.loads(l)
  if d.get('model') == '13B': print({k:d.get(k) for k in ['model','accumulation','tokens_per_s','step_ms','speculation','error']})" | cut -c1-600
else
  el "13B skipped: $(left) s left"
fi
