#!/bin/bash
# The shortest useful call after a batch of changes (when little device time
# is left): the gpu tests nearest the changes (the loss's gradients formed in
# the forward, the speculative offload update, the partition's import/export
# doors), llama-1B at stage 0 through train_bench, then the 1.3B GPT at stage
# 2 with offload_optimizer (speculation's counts in its JSON), each only
# while LIMIT seconds (default 150) allow.
source bench/device/setup.sh
LIMIT=${LIMIT:-150}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
for t in layers_cuda_test decoder_cuda_test host_update_cuda_test optimizer_cuda_test parity_cuda_w1; do
  (( $(left) > 30 )) || break
  OUT=$OUT/logs timeout 40 $B/run_gpu_tests.sh $t >> $OUT/tests.txt 2>&1; el "$t rc=$?"
done
grep -h "^PASSED\|^FAILED\|^SKIPPED" $OUT/tests.txt | cut -c1-200
grep -A12 "^FAILED" $OUT/tests.txt | grep "Failure\|Expected\|Which is\|actual\|FAILED  \]" | head -12
for run in "llama-1B 0 none" "1.3B 2 optimizer" "1.3B 2 none"; do set -- $run
  (( $(left) > 25 )) || break
  timeout $(( $(left) - 2 )) $B/bin/train_bench --models=$1 --stages=$2 --offload=$3 --batch=16 --seq=1024 \
    --iters=4 --warmup=2 --dtype=bf16 >> $OUT/train_bench.jsonl 2>> $OUT/train_bench.err; el "$1 $2 $3 rc=$?"
done
python3 -c "
import json
for l in open('$OUT/train_bench.jsonl'):
  d=json.loads(l); print({k:d.get(k) for k in ['model','stage','offload','tokens_per_s','mfu','step_ms','speculation','device','error']})"
