#!/bin/bash
# Device call 2 (stop 33, issue 25): Llama-3.1-8B shape on the one H200 through
# the trainer, from a directory transformers wrote (random bf16 weights),
# exact f32 master weights and moments (70% on the host), activation
# checkpointing; the trained weights exported and loaded back into
# transformers.
set -u; B=/tmp/b/gpu_bundle
[[ -d $B ]] || { mkdir -p /tmp/b && tar xJf gpu_pack/bundle.tar.xz -C /tmp/b; }
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
timeout 130 python3 exp/anchors/torch_llama_anchor.py llama1b_eager llama1b_compile > $OUT/anchor.jsonl 2> $OUT/anchor.err; cat $OUT/anchor.jsonl
df -h /tmp > $OUT/disk.txt; free -g >> $OUT/disk.txt
[[ -f /tmp/l8/config.json ]] || timeout 200 python3 bench/hf_decoder_tools.py write /tmp/l8 --shape=8B --device=cuda > $OUT/write.txt 2>&1
python3 bench/hf_decoder_tools.py tokens /tmp/t32.bin --vocab=128256 --count=2000000
$B/bin/train_gpt --init_from=/tmp/l8 --config=bench/llama8b_one_gpu.json --device=cuda --seq=1024 --activation_checkpointing --dry_run > $OUT/plan8b.txt 2>&1
(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > $OUT/smi.txt &) 
/usr/bin/time -v timeout 300 $B/bin/train_gpt --init_from=/tmp/l8 --config=bench/llama8b_one_gpu.json \
  --device=cuda --data=tokens32:/tmp/t32.bin --seq=1024 --steps=4 --activation_checkpointing \
  --export_hf=/tmp/l8_out --progress=log > $OUT/train8b.txt 2>&1; echo "rc=$?" >> $OUT/train8b.txt
pkill nvidia-smi; sort -n $OUT/smi.txt | tail -1; tail -25 $OUT/plan8b.txt; grep -v "^\s*$" $OUT/train8b.txt | tail -14
timeout 120 python3 bench/hf_decoder_tools.py check /tmp/l8_out --like /tmp/l8 > $OUT/check8b.txt 2>&1; tail -1 $OUT/check8b.txt
