#!/bin/bash
# Sixth session of 2026-12-07, call 1 (carry gpu_pack: every gpu test,
# train_gpt and functional_cuda_bench at 90190f2 or later, packed with
# GPU_BUNDLE_ONLY; .corpus/linux_doc.txt.xz rides along for call 2):
# 1. The whole gpu suite at HEAD: the LayerNorm backward's team kernel at
#    four vectors a thread (bf16 rows of 5120-8192, deterministic weight
#    and bias gradients; functional_cuda_test's new cases) had only been
#    compiled.
# 2. functional_cuda_bench's layernorm lines at GPT 13B's width (C=5120,
#    40 heads) and 25B's (6144, 48), 4 x 1024 tokens: the new kernel's time
#    (one block per SM at 255 registers) against the bytes it moves.
source bench/device/setup.sh
timeout 300 $B/run_gpu_tests.sh > $OUT/gpu_tests.txt 2>&1
el "gpu tests rc=$?"
grep -h "^FAILED\|^SKIPPED\|gpu tests:" $OUT/gpu_tests.txt | cut -c1-200
grep -A12 "^FAILED" $OUT/gpu_tests.txt | grep "Failure\|Expected\|Which is\|actual\|FAILED  \]" | head -20
for shape in "5120 40" "6144 48" "4096 32"; do
  set -- $shape
  timeout 60 $B/bin/functional_cuda_bench 4 1024 $1 $2 50304 bf16 20 2>/dev/null \
    | grep -i "layer_\?norm" | sed "s/^/C=$1 /" | cut -c1-240
done
el done
