#!/bin/bash
# Fourth session of 2026-12-07, call 1 (carry gpu_pack):
# 1. The gpu tests of this session's nn changes: functional_cuda_test
#    (linear backward writing the input's gradient into the input, the
#    cross-entropy slice kernel), decoder_cuda_test (SwiGLU backward in
#    place), layers_cuda_test (a GPT whose head forms its weight gradient
#    in the backward, against the CPU, and its forward's peak).
# 2. Issue 28's activation pairs (50% less peak for at most 3% more time
#    than checkpointing without offload): 1.3B (stage 0, micro-batch 16)
#    with the MLP's hidden buffer taking its own gradient (e6680fb); the 8B
#    Llama shape (stage 2, 8-bit moments on the host, micro-batch 8) also
#    with --head_weight_gradient=backward (2c5e5c5), and that flag alone.
source bench/device/setup.sh
run_fixed_tests functional_cuda_test decoder_cuda_test layers_cuda_test

BENCH_DEFAULTS="--batch=16 --seq=1024 --iters=4 --warmup=2 --dtype=bf16 --stages=0 --checkpointing=1 --loss_chunk_rows=1024 --peak_attribution=1"
BENCH_TIMEOUT=60
bench ck13 --models=1.3B
bench cpu13 --models=1.3B --cpu_checkpointing=1
BENCH_DEFAULTS="--batch=8 --seq=1024 --iters=3 --warmup=1 --dtype=bf16 --stages=2 --checkpointing=1 --loss_chunk_rows=1024 --peak_attribution=1 --offload=optimizer --ds_config_patch=bench/device/llama8b_8bit_offload.json"
BENCH_TIMEOUT=150
bench ckl8 --models=llama-8B
bench cpubl8 --models=llama-8B --cpu_checkpointing=1 --head_weight_gradient=backward
bench ckbl8 --models=llama-8B --head_weight_gradient=backward
python3 -c "
import json
for l in open('$OUT/train_bench.jsonl'):
  d=json.loads(l); print({k:d.get(k) for k in ['model','cpu_checkpointing','head_weight_gradient','step_ms','tokens_per_s','loss','peak_bytes_above_initialize','error']})
  if 'peak_attribution' in d:
    for label, b in d['peak_attribution']['bytes_by_scope'][:7]: print('   %-40s %8.3f GB' % (label, b / 1e9))" | cut -c1-400
