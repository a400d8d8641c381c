#!/bin/bash
# Issue 26's offload rows against d9c2e76 after the fine buckets reach the
# 124M GPT (2^24 elements), each beside this commit's run with the CPU/GPU
# split off (offload_optimizer.split_update false: the CPU updates all of
# it), all in one call: does the split pay on this machine? Needs gpu_pack
# and gpu_base (tools/baseline_bundle.sh d9c2e76) carried. base.jsonl:
# d9c2e76; split.jsonl: this commit, --split_update=1; nosplit.jsonl: this
# commit, --split_update=0 (run 64 call 2 ran it at cd945dc, whose default
# was the split, as head.jsonl). LIMIT seconds (default 480).
source bench/device/setup.sh
LIMIT=${LIMIT:-480}
source bench/device/pairs.sh
common="--batch=16 --seq=1024 --dtype=bf16 --warmup=2"
run_fixed_tests parity_cuda_w1
for model_iters in 124M:10 1.3B:6; do
  model=${model_iters%:*} iters=${model_iters#*:}
  one base $model --models=$model --stages=2,3 --offload=optimizer $common --iters=$iters
  one split $model --models=$model --stages=2,3 --offload=optimizer --split_update=1 $common --iters=$iters
  one nosplit $model --models=$model --stages=2,3 --offload=optimizer --split_update=0 $common --iters=$iters
done
grep -h "gradients are reduced in\|split between" $OUT/split.err | sort | uniq -c | cut -c1-400
summarize split nosplit
