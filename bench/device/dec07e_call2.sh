#!/bin/bash
# Fifth session of 2026-12-07, call 2 (same warm machine as call 1, whose
# unpacked bundle it reuses; carry gpu_pack if the machine is fresh):
# issue 29's bubble counted in idle time (bench/device/pipeline_bubble.sh)
# after the mpi backend's groups of one rank stopped staging their
# gradients through the host (ecdb81b: run 71's 540-1700 ms boundary) and
# the bf16 reductions reuse their f32 buffers (b74f6cf: the tied
# embedding's all-reduce), then, with what is left of LIMIT, the 8B Llama
# shape's activation pair (stage 2, 8-bit moments on the host, micro-batch
# 8, the head's weight gradient in the backward) with the attention
# workspaces allocated per call (ad11d3c) and the cheaper 8-bit codes.
source bench/device/setup.sh
LIMIT=$(( $(left) - ${RESERVE:-0} )) bash bench/device/pipeline_bubble.sh 2>&1 | tail -45
BENCH_DEFAULTS="--batch=8 --seq=1024 --iters=3 --warmup=1 --dtype=bf16 --stages=2 --checkpointing=1 --loss_chunk_rows=1024 --peak_attribution=1 --offload=optimizer --ds_config_patch=bench/device/llama8b_8bit_offload.json --head_weight_gradient=backward"
BENCH_TIMEOUT=150
if (( $(left) > 330 )); then
  bench ckbl8 --models=llama-8B
  bench cpubl8 --models=llama-8B --cpu_checkpointing=1
  python3 -c "
import json
for l in open('$OUT/train_bench.jsonl'):
  d=json.loads(l); print({k:d.get(k) for k in ['model','cpu_checkpointing','step_ms','tokens_per_s','loss','peak_bytes_above_initialize','optimizer_ms','error']})" | cut -c1-400
fi
