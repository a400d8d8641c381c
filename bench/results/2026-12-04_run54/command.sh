#!/bin/bash
# Device call 1 (ninth session, issue 24): the gpu tests on 8912b92 after the
# four issue-24 branches were merged (non-finite steps in BoundaryStep, config
# warnings and aliases, file-removal signal handlers, trainer CLI checks).
# Packed here with tools/gpu_bundle.sh; carried as gpu_pack/.
set -u; mkdir -p /tmp/b && tar xJf gpu_pack/bundle.tar.xz -C /tmp/b; B=/tmp/b/gpu_bundle
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64; nvidia-smi -L > $OUT/gpu.txt
timeout 400 $B/run_gpu_tests.sh > $OUT/gpu_tests.txt 2>&1; echo "rc=$?" >> $OUT/gpu_tests.txt
