#!/bin/bash
# Issue 28's convergence with several seeds per moment format (carry
# gpu_pack and .corpus/linux_doc.txt.xz; bench/convergence/README.md):
# run 69's setup (GPT 350M shape on the Linux documentation as bytes, 2000
# steps of 4 x 512, AdamW lr 6e-4 with 100 warm-up steps and linear decay,
# clipping 1.0, bf16, final validation loss over --eval_windows=512) for
# f32, bf16 stochastic rounding, bf16 to nearest and 8-bit block-wise
# moments, each at seeds $SEEDS (default "1 2": 8 runs), all at once on
# the one GPU, as runs 68 and 69 ran theirs. train_gpt's --seed sets the
# initialisation and the data order; the moments' rounding noise is keyed
# by the config's seed, the same in every run. One change from run 69:
# validation every 500 steps instead of 250 (the same final evaluation,
# half the evaluation time). With EXTRA_SEED=3, f32, bf16_sr and int8 get
# a third seed (11 runs: only on an H200, where memory and time allow; run
# 69's five runs took 180 s each there; the 8 runs need about 70 GiB of an
# H100's 80 by estimate: the "+90 s" line measures it).
#   LIMIT=540 bash bench/device/convergence_seeds.sh
# RUNS="int8:1 f32:5 ..." replaces SEEDS and EXTRA_SEED with exactly
# those format:seed runs (at most 8 on an H100).
# Beside the runs, the gpu test optimizer_cuda_test (the CUDA 8-bit kernel
# equals the CPU's, bit for bit). Prints each format's mean and spread of
# final validation loss against f32's (bench/convergence/plot.py; paired
# by seed) and writes $OUT/convergence.png; logs in
# $OUT/conv_FORMAT_seedN.log.
source bench/device/setup.sh
xz -dc .corpus/linux_doc.txt.xz > /tmp/linux_doc.txt
sha256sum /tmp/linux_doc.txt | cut -c1-16
SEEDS=${SEEDS:-1 2}
pids=()
tags=()
run_conv() {  # format seed
  local tag=$1_seed$2
  timeout $(( $(left) - 30 )) $B/bin/train_gpt \
    --config=bench/convergence/$1.json \
    --model=350M --data=text:/tmp/linux_doc.txt --seq=512 --steps=2000 \
    --eval_every=500 --eval_windows=512 --seed=$2 --device=cuda \
    --progress=log > $OUT/conv_$tag.log 2>&1 &
  pids+=($!)
  tags+=($tag)
}
if [[ -n ${RUNS:-} ]]; then
  for run in $RUNS; do run_conv ${run%%:*} ${run##*:}; done
else
  for seed in $SEEDS; do
    for format in f32 bf16_sr bf16_rne int8; do run_conv $format $seed; done
  done
  if [[ -n ${EXTRA_SEED:-} ]]; then
    for format in f32 bf16_sr int8; do run_conv $format $EXTRA_SEED; done
  fi
fi
el "${#pids[@]} runs started"
# The CUDA optimizer against the CPU's, bit for bit, with the 8-bit codes'
# stochastic rounding (OptimizerCudaTest.CompressedMomentsMatchCpuBitForBit),
# beside the runs (a few seconds).
run_fixed_tests optimizer_cuda_test
# GPU memory once every run is training (about 9 GiB a run estimated: the
# 5.3 GiB of f32 state or 4.0 / 3.3 compressed, activations, context).
(sleep 90; nvidia-smi --query-gpu=memory.used,memory.total,utilization.gpu \
   --format=csv,noheader | sed 's/^/gpu at +90 s: /') &
for k in "${!pids[@]}"; do
  wait ${pids[$k]}
  el "${tags[$k]} rc=$?"
done
for tag in "${tags[@]}"; do
  echo "$tag: $(grep 'validation loss' $OUT/conv_$tag.log | tail -1) |" \
    "$(grep 'steps in' $OUT/conv_$tag.log | cut -c1-120)"
done
python3 bench/convergence/plot.py $OUT $OUT/convergence.png ||
  echo "plot.py failed (matplotlib missing?): run it on the logs here"
el "done"
