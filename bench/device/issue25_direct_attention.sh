#!/bin/bash
# Issue 25 after f4727a2 (grouped attention without packing on Hopper; the
# branch-gradient adds folded into the products and the RMSNorm backward):
# the whole gpu suite, the grouped-attention timings per route, llama-1B at
# stages 0 and 3 beside PyTorch's eager and torch.compile in the same call,
# a CUPTI trace of 3 llama-1B steps, and the 1.3B GPT at stage 2 (run 65:
# 65.7k tokens/s) to show the packed GPT path unchanged. Then (issue 29's
# step model) the 1.3B GPT's per-module forward/backward times at
# micro-batches 1-16 (gpt_bench --profile=1).
source bench/device/setup.sh
LIMIT=${LIMIT:-560}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
timeout 240 $B/run_gpu_tests.sh > $OUT/gpu_tests.txt 2>&1; el "gpu tests rc=$?"
grep -h "^PASSED\|^FAILED\|^SKIPPED\|gpu tests:" $OUT/gpu_tests.txt | cut -c1-200
grep -A30 "^FAILED" $OUT/gpu_tests.txt | grep "Failure\|Expected\|Which is\|actual\|FAILED  \]\|error" | head -30
(cd $B && timeout 60 ./tests/nn/cuda/decoder_cuda_test --gtest_also_run_disabled_tests \
  --gtest_filter='*GroupedAttentionTimings*' 2>&1 | grep "GQA timing") | tee $OUT/gqa_timing.txt
bench() {  # tag, then train_bench flags
  local tag=$1; shift
  (( $(left) > 40 )) || { el "skip $tag"; return; }
  timeout 70 $B/bin/train_bench --batch=16 --seq=1024 --iters=5 --warmup=2 --dtype=bf16 "$@" \
    >> $OUT/train_bench.jsonl 2>> $OUT/train_bench.err
  el "$tag rc=$?"
}
bench llama0 --models=llama-1B --stages=0
bench llama3 --models=llama-1B --stages=3
(( $(left) > 90 )) && { timeout $(( $(left) - 30 )) python3 exp/anchors/torch_llama_anchor.py llama1b_eager \
  llama1b_compile > $OUT/anchor.jsonl 2> $OUT/anchor.err; el "anchor rc=$?"; cut -c1-300 $OUT/anchor.jsonl; }
bench gpt2 --models=1.3B --stages=2 --offload=none
bench gpt2off --models=1.3B --stages=2 --offload=optimizer
python3 -c "
import json
for l in open('$OUT/train_bench.jsonl'):
  d=json.loads(l); print({k:d.get(k) for k in ['model','stage','offload','tokens_per_s','mfu','step_ms','speculation','offload_worker','error']})"
if (( $(left) > 45 )); then
  timeout $(( $(left) - 5 )) $B/bin/gpt_bench --models=1.3B,1.3B,1.3B,1.3B,1.3B --batch=1,2,4,8,16 --seq=1024 --iters=3 \
    --warmup=2 --profile=1 --profile_iters=3 > $OUT/gpt_bench_profile.jsonl 2> $OUT/gpt_bench_profile.err
  el "gpt_bench profile rc=$?"; grep -c . $OUT/gpt_bench_profile.jsonl
fi
# Issue 27: DeepSpeed 0.19.8's ZeRO-Offload at 1.3B in the same call, the
# anchor (.anchors = ../shared/anchors) with "gradient_clipping": 1.0 added
# to its config (the only change), as every real config and ours set.
if (( $(left) > 170 )); then
  sed -i 's/"steps_per_print": 1000000,/"steps_per_print": 1000000, "gradient_clipping": 1.0,/' .anchors/deepspeed_anchor.py
  grep -c gradient_clipping .anchors/deepspeed_anchor.py
  OUT=$OUT timeout $(( $(left) - 30 )) bash .anchors/run_deepspeed_anchor.sh --fallback --budget $(( $(left) - 40 )) \
    z2_off_1.3B > $OUT/deepspeed_run.txt 2>&1; el "deepspeed rc=$?"; cut -c1-400 $OUT/deepspeed_anchor.jsonl
fi
if (( $(left) > 40 )); then
  CUDA_INJECTION64_PATH=$B/bin/libze_cupti_trace.so ZE_CUPTI_TRACE=/tmp/trace_cupti.csv \
    timeout $(( $(left) - 5 )) $B/bin/train_bench --models=llama-1B --stages=0 --batch=16 --seq=1024 \
    --iters=3 --warmup=1 --dtype=bf16 > $OUT/trace_run.txt 2>&1
  el "cupti trace rc=$?"
  python3 bench/gpu_gap_summary.py /tmp/trace_cupti.csv 2>&1 | cut -c1-200 > $OUT/gaps.txt; cat $OUT/gaps.txt
  gzip -c /tmp/trace_cupti.csv > $OUT/trace.csv.gz 2>/dev/null
fi
