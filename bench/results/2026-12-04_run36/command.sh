#!/bin/bash
# Device call 1 (2026-12-04, sixth session): CPU Adam against PyTorch's fused
# CPU AdamW in the same call, then issue 14's Hugging Face GPU check.
set -u
start=$SECONDS
mkdir -p /tmp/b && tar xJf gpu_pack/bundle.tar.xz -C /tmp/b
B=/tmp/b/gpu_bundle
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64
echo "unpacked in $((SECONDS-start)) s"
{ date -u; nproc; lscpu | grep -E "Model name|Flags" | cut -c1-200; free -g; nvidia-smi --query-gpu=name,memory.used,power.limit --format=csv; } > $OUT/facts.txt 2>&1
for round in 1 2; do
  python3 gpu_pack/torch_anchor.py cpu 2>&1 | grep cpu_adamw | sed "s/^/{\"round\":$round,\"who\":\"torch\"} /" >> $OUT/cpuadam.txt
  timeout 60 $B/bin/cpu_adam_bench --threads=16 --steps=8 2>&1 | grep '^{' | sed "s/^/{\"round\":$round,\"who\":\"ours-default\"} /" >> $OUT/cpuadam.txt
  timeout 60 $B/bin/cpu_adam_bench --threads=16 --steps=8 --schedule=dynamic --pin=1 --tile_kib=256 2>&1 | grep '^{' | sed "s/^/{\"round\":$round,\"who\":\"ours-dynpin256\"} /" >> $OUT/cpuadam.txt
  timeout 60 $B/bin/cpu_adam_bench --threads=16 --steps=8 --huge_pages=0 2>&1 | grep '^{' | sed "s/^/{\"round\":$round,\"who\":\"ours-nothp\"} /" >> $OUT/cpuadam.txt
  echo "round $round done at $((SECONDS-start)) s"
done
cat $OUT/cpuadam.txt | cut -c1-330
OUT=$OUT timeout 400 $B/hf_finetune_gpu_check.sh $B /tmp/hfck
echo "call1 done at $((SECONDS-start)) s"
mkdir -p $OUT/hf_logs && cp /tmp/hfck/*.log $OUT/hf_logs/ 2>/dev/null
left=$((570 - (SECONDS - start)))
echo "running gpu tests with ${left} s left"
OUT=$OUT timeout ${left} $B/run_gpu_tests.sh 2>&1 | tee $OUT/gpu_tests.txt
echo "all done at $((SECONDS-start)) s"
