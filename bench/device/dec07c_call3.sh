#!/bin/bash
# Third session of 2026-12-07, call 3 (carry gpu_pack, pack at 643f747), on
# an H100 since no H200 came for call 2: the whole gpu test suite after the
# merges (the device-updated buckets' copy to the weights' tier runs in
# parity_cuda_*'s cpuhalfparam and nvmehalfparam modes for the first time
# on a GPU).
source bench/device/setup.sh
timeout $(( LIMIT - 20 )) $B/run_gpu_tests.sh > $OUT/gpu_tests.txt 2>&1
el "gpu tests rc=$?"
grep -h "^FAILED\|^SKIPPED\|gpu tests:" $OUT/gpu_tests.txt | cut -c1-200
grep -A12 "^FAILED" $OUT/gpu_tests.txt | grep "Failure\|Expected\|Which is\|actual\|FAILED  \]" | head -20
