#!/bin/bash
# The whole gpu suite, then issue 26's offload-optimizer rows against
# d9c2e76 with this commit's defaults (the CPU/GPU split off), each pair
# d9c2e76 first. Needs gpu_pack and gpu_base (tools/baseline_bundle.sh
# d9c2e76) carried. LIMIT seconds (default 450). TESTS="a b": only those
# gpu tests (run_gpu_tests.sh's short names) instead of the whole suite.
source bench/device/setup.sh
LIMIT=${LIMIT:-450}
source bench/device/pairs.sh
if [[ -n ${TESTS:-} ]]; then
  run_fixed_tests $TESTS
else
  timeout 260 $B/run_gpu_tests.sh > $OUT/gpu_tests.txt 2>&1; el "gpu tests rc=$?"
  grep -h "^PASSED\|^FAILED\|^SKIPPED\|gpu tests:" $OUT/gpu_tests.txt | cut -c1-200
  grep -A12 "^FAILED" $OUT/gpu_tests.txt | grep "Failure\|Expected\|Which is\|actual\|FAILED  \]" | head -20
  tar czf $OUT/gpu_test_logs.tgz -C $OUT gpu_test_logs 2>/dev/null && rm -rf $OUT/gpu_test_logs
fi
common="--batch=16 --seq=1024 --dtype=bf16 --warmup=2 --offload=optimizer --stages=2,3"
pair 124M-opt --models=124M $common --iters=10
pair 1.3B-opt --models=1.3B $common --iters=6
summarize head
