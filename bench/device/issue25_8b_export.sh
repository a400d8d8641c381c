#!/bin/bash
# Issue 25: three of the gpu tests corrected in 9a5b06c, then the
# 8B through the trainer: transformers-written dir -> train 5 steps -> export
# -> transformers loads it back. Timestamps to price load, steps and export.
source bench/device/setup.sh
run_fixed_tests decoder_cuda_test layers_cuda_test hf_decoder_gpu_parity_np1
el "8B write"
timeout 120 python3 bench/hf_decoder_tools.py write /tmp/l8 --shape=8B --device=cuda > $OUT/write.txt 2>&1; el "write rc=$?"
python3 bench/hf_decoder_tools.py tokens /tmp/t32.bin --vocab=128256 --count=2000000 > /dev/null; el tokens
(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > $OUT/smi.txt &)
TL=$(( 400 - ($(date +%s) - T0) )); el "train limit $TL"
/usr/bin/time -v timeout $TL $B/bin/train_gpt --init_from=/tmp/l8 --config=bench/llama8b_one_gpu.json \
  --device=cuda --data=tokens32:/tmp/t32.bin --seq=1024 --steps=5 --activation_checkpointing \
  --export_hf=/tmp/l8_out --progress=log 2>&1 | while IFS= read -r l; do echo "[+$(( $(date +%s) - T0 ))s] $l"; done > $OUT/train8b.txt
el "train done"; pkill nvidia-smi; sort -n $OUT/smi.txt | tail -1 > $OUT/smi_peak.txt
grep -v "^\s*$" $OUT/train8b.txt | grep -v "page faults\|Average\|Socket\|Signals\|Swaps\|context sw\|Page size" | cut -c1-220 | tail -22
ls -la /tmp/l8_out; du -sh /tmp/l8_out
[[ -f /tmp/l8_out/config.json ]] && timeout $(( 470 - ($(date +%s) - T0) )) python3 bench/hf_decoder_tools.py check /tmp/l8_out --like /tmp/l8 > $OUT/check8b.txt 2>&1; el "check rc=$?"; tail -4 $OUT/check8b.txt
