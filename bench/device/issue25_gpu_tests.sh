#!/bin/bash
# Last call of the session: only the gpu tests whose measures were fixed.
set -u; T0=$(date +%s); el() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
mkdir -p /tmp/b && tar xJf gpu_pack/bundle.tar.xz -C /tmp/b; B=/tmp/b/gpu_bundle
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
L=$OUT/logs; mkdir -p $L
for f in decoder_cuda_test layers_cuda_test hf_decoder_gpu_parity_np1 hf_decoder_gpu_parity_np2; do
  (( $(date +%s) - T0 < 170 )) || break
  OUT=$L timeout 60 $B/run_gpu_tests.sh $f >> $L/summary.txt 2>&1; el "test $f rc=$?"; done
grep -h "tests:" $L/summary.txt; grep -rh "FAILED\|near tie\|bf16 on" $L | cut -c1-300 | head -30
