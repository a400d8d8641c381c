#!/bin/bash
# Device call 6 (eighth session): the gpu tests on 54793ba, after the review's
# refactors (ThreadPool::RunLoop, CpuOptimizer::RunTile, PartitionState::chunk_span).
set -u
mkdir -p /tmp/b && tar xJf gpu_pack/bundle.tar.xz -C /tmp/b
B=/tmp/b/gpu_bundle
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64
OUT=/tmp/gt timeout 170 $B/run_gpu_tests.sh > $OUT/gpu_tests.txt 2>&1; tail -20 $OUT/gpu_tests.txt
