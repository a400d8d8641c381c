#!/bin/bash
# Failing gpu tests' full logs (one tarball), then 8B train/export/check.
set -u; mkdir -p /tmp/b && tar xJf gpu_pack/bundle.tar.xz -C /tmp/b; B=/tmp/b/gpu_bundle
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
L=/tmp/logs; mkdir -p $L
for f in hf_decoder_gpu_parity_np1 decoder_cuda_test layers_cuda_test; do OUT=$L timeout 120 $B/run_gpu_tests.sh $f >> $L/summary.txt 2>&1; done
tar czf $OUT/failing_logs.tgz -C $L .
tail -3 $L/summary.txt
timeout 200 python3 bench/hf_decoder_tools.py write /tmp/l8 --shape=8B --device=cuda > $OUT/write.txt 2>&1
python3 bench/hf_decoder_tools.py tokens /tmp/t32.bin --vocab=128256 --count=2000000
(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > $OUT/smi.txt &)
/usr/bin/time -v timeout 330 $B/bin/train_gpt --init_from=/tmp/l8 --config=bench/llama8b_one_gpu.json \
  --device=cuda --data=tokens32:/tmp/t32.bin --seq=1024 --steps=6 --activation_checkpointing \
  --export_hf=/tmp/l8_out --progress=log > $OUT/train8b.txt 2>&1; echo "rc=$?" >> $OUT/train8b.txt
pkill nvidia-smi; sort -n $OUT/smi.txt | tail -1; grep -v "^\s*$" $OUT/train8b.txt | tail -30
[[ -d /tmp/l8_out ]] && timeout 100 python3 bench/hf_decoder_tools.py check /tmp/l8_out --like /tmp/l8 > $OUT/check8b.txt 2>&1; tail -3 $OUT/check8b.txt
