#!/bin/bash
# Device call 3 (2026-12-04, sixth session): accumulation 4 with the new CPU
# optimizer defaults, and three more PyTorch / ours CPU AdamW rounds.
set -u
start=$SECONDS
mkdir -p /tmp/b && tar xJf gpu_pack/bundle.tar.xz -C /tmp/b
B=/tmp/b/gpu_bundle
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64
T="$B/bin/train_bench --models=1.3B --stages=2 --warmup=2 --iters=3 --accumulation=4"
for flags in "" "--offload=optimizer" "--offload=optimizer --delayed_update=1"; do
  echo "### $flags" >> $OUT/train.txt
  timeout 150 $T $flags >> $OUT/train.txt 2>> $OUT/train_err.txt
  echo "train '$flags' done at $((SECONDS-start)) s"
done
for round in 3 4 5; do
  python3 gpu_pack/torch_anchor.py cpu 2>&1 | grep '"fused": true' | sed "s/^/{\"round\":$round,\"who\":\"torch\"} /" >> $OUT/cpuadam.txt
  timeout 60 $B/bin/cpu_adam_bench --threads=16 --steps=8 2>&1 | grep '"cpu_adam"' | sed "s/^/{\"round\":$round,\"who\":\"ours-default\"} /" >> $OUT/cpuadam.txt
done
cut -c1-330 $OUT/cpuadam.txt
echo "all done at $((SECONDS-start)) s"
