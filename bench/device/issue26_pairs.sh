#!/bin/bash
# Issue 26's "train_bench within 1% of d9c2e76", every pair in one call,
# after the 2 GiB loss chunks, the fine offload buckets and the speculation
# that waits after a clipped step; the gpu tests those changes touch first.
# Needs gpu_pack (tools/gpu_bundle.sh) and gpu_base (tools/baseline_bundle.sh
# d9c2e76) carried. Each pair runs d9c2e76's train_bench, then this
# commit's, with the same flags (bf16, micro-batch 16, sequence 1024,
# clipping 1.0, train_bench's 5e8-element reduce buckets) into base.jsonl /
# head.jsonl; then a few of this commit's alone (diag.jsonl) to say where
# a gap left comes from. LIMIT seconds (default 560).
source bench/device/setup.sh
LIMIT=${LIMIT:-560}
source bench/device/pairs.sh
common="--batch=16 --seq=1024 --dtype=bf16 --warmup=2"
run_fixed_tests allocator_cuda_test layers_cuda_test parity_cuda_w1
pair 1.3B-none --models=1.3B --stages=0,2,3 --offload=none $common --iters=6
pair 1.3B-opt --models=1.3B --stages=2,3 --offload=optimizer $common --iters=6
pair 1.3B-both --models=1.3B --stages=3 --offload=both $common --iters=6
pair 124M-none --models=124M --stages=0,2,3 --offload=none $common --iters=10
pair 124M-opt --models=124M --stages=2,3 --offload=optimizer $common --iters=10
pair 124M-both --models=124M --stages=3 --offload=both $common --iters=10
grep -h "gradients are reduced in\|split between" $OUT/head.err | sort | uniq -c | cut -c1-400
# Where a gap comes from: stage 3's update without the early start, the
# loss in one chunk.
one diag 1.3B-s3-nospec --models=1.3B --stages=3 --offload=optimizer --speculation_buffer_size=0 $common --iters=6
one diag 124M-onechunk --models=124M --stages=0 --offload=none --loss_chunk_rows=16384 $common --iters=10
summarize head diag
