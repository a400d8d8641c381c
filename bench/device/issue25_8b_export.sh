#!/bin/bash
# Device call B (issue 25): the four gpu tests fixed this session, then the
# 8B through the trainer: transformers-written dir -> train 5 steps -> export
# -> transformers loads it back. Timestamps to price load, steps and export.
set -u; T0=$(date +%s); el() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
mkdir -p /tmp/b && tar xJf gpu_pack/bundle.tar.xz -C /tmp/b; B=/tmp/b/gpu_bundle
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
L=$OUT/logs; mkdir -p $L
for f in decoder_cuda_test layers_cuda_test hf_decoder_gpu_parity_np1; do
  OUT=$L timeout 60 $B/run_gpu_tests.sh $f >> $L/summary.txt 2>&1; el "test $f rc=$?"; done
grep -h "tests:" $L/summary.txt; grep -h "FAILED\|near tie" -r $L | head -20
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
