#!/bin/bash
# Fourth session of 2026-12-07, call 3 (carry gpu_pack, pack at f789006 or
# later): the whole gpu test suite after this session's merges (the
# pipeline executor's step timer, the stochastic 8-bit codes, the in-place
# MLP backward, the head's weight gradient in the backward), then issue
# 29's bubble counted in idle time (bench/device/pipeline_bubble.sh) with
# what is left of LIMIT.
source bench/device/setup.sh
timeout 230 $B/run_gpu_tests.sh > $OUT/gpu_tests.txt 2>&1
el "gpu tests rc=$?"
grep -h "^FAILED\|^SKIPPED\|gpu tests:" $OUT/gpu_tests.txt | cut -c1-200
grep -A12 "^FAILED" $OUT/gpu_tests.txt | grep "Failure\|Expected\|Which is\|actual\|FAILED  \]" | head -20
LIMIT=$(left) bash bench/device/pipeline_bubble.sh 2>&1 | tail -45
