#!/bin/bash
# The gpu tests whose measures 9a5b06c corrected (about 200 s).
source bench/device/setup.sh
run_fixed_tests decoder_cuda_test layers_cuda_test hf_decoder_gpu_parity_np1 \
  hf_decoder_gpu_parity_np2
