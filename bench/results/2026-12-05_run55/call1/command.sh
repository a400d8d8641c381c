#!/bin/bash
# Device call 1 (stop 33, issue 25): gpu tests (the decoder's CUDA ops and
# bf16 parity among them), then llama-1B through train_bench at stages 0 and
# 3 beside PyTorch (torch_llama_anchor.py) in the same call.
set -u; mkdir -p /tmp/b && tar xJf gpu_pack/bundle.tar.xz -C /tmp/b; B=/tmp/b/gpu_bundle
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64; nvidia-smi -L > $OUT/gpu.txt
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
T0=$(date +%s)
timeout 300 $B/run_gpu_tests.sh > $OUT/gpu_tests.txt 2>&1; echo "rc=$?" >> $OUT/gpu_tests.txt
tail -3 $OUT/gpu_tests.txt
for run in "0 0" "3 0" "0 16384"; do set -- $run
  timeout 75 $B/bin/train_bench --models=llama-1B --stages=$1 --loss_chunk_rows=$2 --batch=16 --seq=1024 \
    --iters=5 --warmup=2 --dtype=bf16 >> $OUT/train_bench.jsonl 2>> $OUT/train_bench.err
done
left=$(( 585 - ($(date +%s) - T0) ))
if (( left > 60 )); then timeout $left python3 exp/anchors/torch_llama_anchor.py llama1b_eager llama1b_compile > $OUT/anchor.jsonl 2> $OUT/anchor.err; fi
cat $OUT/anchor.jsonl; python3 -c "
import json,sys
for l in open('$OUT/train_bench.jsonl'):
  d=json.loads(l); print({k:d.get(k) for k in ['model','stage','loss_chunk_rows','tokens_per_s','mfu','step_ms','error']})"
