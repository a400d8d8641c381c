#!/bin/bash
# Fifth session of 2026-12-07, call 3 (carry gpu_pack; pack at 90190f2 or
# later; gpu_pack_slim/functional_cuda_bench_old.xz beside it, the
# functional_cuda_bench of 040ae21): the LayerNorm backward's team kernel
# at four vectors a thread (bf16 rows of 5120-8192):
# 1. functional_cuda_test (LayerNorm against the CPU at 5120, 6144 and 8192
#    wide; the team kernel's gradients the same bits twice) and
#    layers_cuda_test;
# 2. functional_cuda_bench's layernorm lines at GPT 13B's width (C=5120,
#    40 heads, 4 x 1024 tokens) and 25B's (6144, 48), before (the
#    warp-per-row kernel with shared-memory atomics) and after.
source bench/device/setup.sh
run_fixed_tests functional_cuda_test layers_cuda_test
if [[ -f gpu_pack_slim/functional_cuda_bench_old.xz ]]; then
  xz -dc gpu_pack_slim/functional_cuda_bench_old.xz > /tmp/fcb_old && chmod +x /tmp/fcb_old
fi
for shape in "5120 40" "6144 48"; do
  set -- $shape
  for which in old new; do
    bin=$B/bin/functional_cuda_bench
    if [[ $which == old ]]; then [[ -x /tmp/fcb_old ]] || continue; bin=/tmp/fcb_old; fi
    timeout 60 $bin batch=4 seq=1024 channels=$1 heads=$2 vocab=50304 dtype=bf16 iters=20 2>/dev/null | grep -i "layer_\?norm" \
      | sed "s/^/$which C=$1 /" | cut -c1-220
  done
done
el done
