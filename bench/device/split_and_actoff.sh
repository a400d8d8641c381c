#!/bin/bash
# After issue 27's CPU/GPU split and issue 28's moments and activation
# offload were merged (stop 37): every gpu test of the pack (logs packed
# into one file: $OUT keeps few files), the 1.3B GPT at stage 2 without and
# with offload_optimizer (the split's elements and times in its JSON, the
# model's choice in train_bench.err), and the 1.3B activation-checkpointing
# pair without and with cpu_checkpointing. LIMIT seconds (default 450).
source bench/device/setup.sh
LIMIT=${LIMIT:-450}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
timeout 240 $B/run_gpu_tests.sh > $OUT/gpu_tests.txt 2>&1; el "gpu tests rc=$?"
grep -h "^PASSED\|^FAILED\|^SKIPPED\|gpu tests:" $OUT/gpu_tests.txt | cut -c1-200
grep -A12 "^FAILED" $OUT/gpu_tests.txt | grep "Failure\|Expected\|Which is\|actual\|FAILED  \]" | head -20
grep -h "activation_offload\|peak" $OUT/gpu_test_logs/*activation_offload* 2>/dev/null | grep "{" | cut -c1-400 | head -4
tar czf $OUT/gpu_test_logs.tgz -C $OUT gpu_test_logs 2>/dev/null && rm -rf $OUT/gpu_test_logs
bench() {  # tag, then train_bench flags
  local tag=$1; shift
  (( $(left) > 40 )) || { el "skip $tag"; return; }
  timeout 70 $B/bin/train_bench --batch=16 --seq=1024 --iters=5 --warmup=2 --dtype=bf16 "$@" \
    >> $OUT/train_bench.jsonl 2>> $OUT/train_bench.err
  el "$tag rc=$?"
}
bench gpt2 --models=1.3B --stages=2 --offload=none --reduce_bucket_size=5e7
bench gpt2off --models=1.3B --stages=2 --offload=optimizer --reduce_bucket_size=5e7
bench gpt3off --models=1.3B --stages=3 --offload=optimizer --reduce_bucket_size=5e7
bench gpt3both --models=1.3B --stages=3 --offload=both --reduce_bucket_size=5e7
bench gpt3 --models=1.3B --stages=3 --offload=none --reduce_bucket_size=5e7
bench ckpt --models=1.3B --stages=0 --checkpointing=1
bench cpuckpt --models=1.3B --stages=0 --checkpointing=1 --cpu_checkpointing=1
grep -h "split between" $OUT/train_bench.err | cut -c1-400
python3 -c "
import json
for l in open('$OUT/train_bench.jsonl'):
  d=json.loads(l); print({k:d.get(k) for k in ['model','stage','offload','tokens_per_s','step_ms','peak_bytes_above_initialize','speculation','offload_worker','activation_offload','error']})"
