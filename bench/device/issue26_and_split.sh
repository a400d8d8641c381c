#!/bin/bash
# Issue 26's "within 1% of d9c2e76" beside the split model that counts
# shared host memory. Needs gpu_pack (tools/gpu_bundle.sh) and gpu_base
# (tools/baseline_bundle.sh d9c2e76) carried. PART=1: the gpu suite, the
# 1.3B stage-2 offload run with the new split model (its choice in
# train_bench.err), and the 124M pairs; PART=2: the 1.3B pairs. Each pair
# runs d9c2e76's train_bench, then this commit's, with the same flags
# (bf16, micro-batch 16, sequence 1024, clipping 1.0), into
# base.jsonl / head.jsonl. LIMIT seconds (default 540).
source bench/device/setup.sh
LIMIT=${LIMIT:-540}
PART=${PART:-1}
source bench/device/pairs.sh
common="--batch=16 --seq=1024 --dtype=bf16 --warmup=2"
if [[ $PART == 1 ]]; then
  timeout 250 $B/run_gpu_tests.sh > $OUT/gpu_tests.txt 2>&1; el "gpu tests rc=$?"
  grep -h "^PASSED\|^FAILED\|^SKIPPED\|gpu tests:" $OUT/gpu_tests.txt | cut -c1-200
  grep -A12 "^FAILED" $OUT/gpu_tests.txt | grep "Failure\|Expected\|Which is\|actual\|FAILED  \]" | head -20
  tar czf $OUT/gpu_test_logs.tgz -C $OUT gpu_test_logs 2>/dev/null && rm -rf $OUT/gpu_test_logs
  one head split1.3B --models=1.3B --stages=2 --offload=optimizer --reduce_bucket_size=5e7 $common --iters=5
  grep -h "split between" $OUT/head.err | cut -c1-500
  pair 124M-none --models=124M --stages=0,2,3 --offload=none $common --iters=10
  pair 124M-opt --models=124M --stages=2,3 --offload=optimizer $common --iters=10
  pair 124M-both --models=124M --stages=3 --offload=both $common --iters=10
else
  # The tests the HostRegistration fix touches, then the 1.3B pairs; the
  # 124M pairs again, this commit first (order bias).
  run_fixed_tests allocator_cuda_test host_update_cuda_test parity_cuda_w1 \
    hf_decoder_gpu_parity_np1 parity_cuda_w2
  one head split1.3B --models=1.3B --stages=2 --offload=optimizer --reduce_bucket_size=5e7 $common --iters=5
  grep -h "split between" $OUT/head.err | cut -c1-500
  pair 1.3B-none --models=1.3B --stages=0,2,3 --offload=none $common --iters=6
  pair 1.3B-opt --models=1.3B --stages=2,3 --offload=optimizer $common --iters=6
  pair 1.3B-both --models=1.3B --stages=3 --offload=both $common --iters=6
  one head 124M-none --models=124M --stages=0,2,3 --offload=none $common --iters=10
  one base 124M-none --models=124M --stages=0,2,3 --offload=none $common --iters=10
  one head 124M-opt --models=124M --stages=2,3 --offload=optimizer $common --iters=10
  one base 124M-opt --models=124M --stages=2,3 --offload=optimizer $common --iters=10
  # The CPU optimizer on 15 of the 16 CPUs: does the update during backward
  # starve the thread that launches the kernels?
  OMP_NUM_THREADS=15 one head 124M-opt15 --models=124M --stages=2 --offload=optimizer $common --iters=10
  # The loss in one chunk (16 x 1024 rows) instead of the 256 MiB chunks.
  one head 124M-onechunk --models=124M --stages=0 --offload=none --loss_chunk_rows=16384 $common --iters=10
fi
summarize head
