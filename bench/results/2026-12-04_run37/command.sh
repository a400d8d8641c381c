#!/bin/bash
# Device call 2 (2026-12-04, sixth session): the new CPU-optimizer defaults
# against PyTorch's fused CPU AdamW and in the engine's offloaded step, the
# run-to-run determinism of the f32 GPU path, issue 14's HF check, gpu tests.
set -u
start=$SECONDS
mkdir -p /tmp/b && tar xJf gpu_pack/bundle.tar.xz -C /tmp/b
B=/tmp/b/gpu_bundle
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64
{ date -u; git log --oneline -1 2>/dev/null; nproc; free -g; nvidia-smi --query-gpu=name,memory.used,power.limit --format=csv; } > $OUT/facts.txt 2>&1
for round in 1 2; do
  python3 gpu_pack/torch_anchor.py cpu 2>&1 | grep cpu_adamw | sed "s/^/{\"round\":$round,\"who\":\"torch\"} /" >> $OUT/cpuadam.txt
  timeout 60 $B/bin/cpu_adam_bench --threads=16 --steps=8 2>&1 | grep '"cpu_adam"' | sed "s/^/{\"round\":$round,\"who\":\"ours-default\"} /" >> $OUT/cpuadam.txt
done
echo "cpu adam done at $((SECONDS-start)) s"; cut -c1-300 $OUT/cpuadam.txt
T="$B/bin/train_bench --models=1.3B --stages=2 --warmup=2 --iters=4"
for flags in "" "--offload=optimizer" "--offload=optimizer --delayed_update=1"; do
  echo "### $flags" >> $OUT/train.txt
  timeout 120 $T $flags >> $OUT/train.txt 2>> $OUT/train_err.txt
  echo "train '$flags' done at $((SECONDS-start)) s"
done
grep -v '^###' $OUT/train.txt | cut -c1-400
# f32 GPU determinism: one parity spec twice, same inputs.
P=$(find $B/tests -name parity_main -type f | head -1)
for r in a b; do mkdir -p /tmp/det_$r; ZE_ALLOW_GPU_SHARING=1 timeout 60 $P run --out=/tmp/det_$r --only=w1_f32_adamw_s3_a2_m2_oserial --device=cuda > /dev/null 2>&1; done
( cd /tmp/det_a && for f in $(ls); do cmp -s $f /tmp/det_b/$f && echo "same $f" || echo "DIFFERENT $f"; done ) > $OUT/determinism.txt 2>&1
cat $OUT/determinism.txt | head
OUT=$OUT timeout 300 $B/hf_finetune_gpu_check.sh $B /tmp/hfck > $OUT/hf.txt 2>&1; cat $OUT/hf.txt
mkdir -p $OUT/hf_logs && cp /tmp/hfck/transformers_load_np*.log /tmp/hfck/train_np*.log $OUT/hf_logs/ 2>/dev/null
left=$((575 - (SECONDS - start)))
echo "gpu tests with ${left} s left"
OUT=/tmp/gt timeout ${left} $B/run_gpu_tests.sh > $OUT/gpu_tests.txt 2>&1; tail -40 $OUT/gpu_tests.txt
echo "all done at $((SECONDS-start)) s"
