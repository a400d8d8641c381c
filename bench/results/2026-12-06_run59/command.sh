#!/bin/bash
# Issue 25: the corrected chunked-loss memory test and the bf16 parity at 2
# ranks, then llama-1B through train_bench (stages 0 and 3) beside PyTorch
# (eager, torch.compile) in the same call, after the vectorised SwiGLU and
# packing kernels; then an nsys trace of 3 steps to price the time the GPU
# sits idle inside a step (the kernels' sum was 253 ms of a 279 ms step).
# exp/anchors/torch_llama_anchor.py is ../shared/anchors/ unchanged.
source bench/device/setup.sh
run_fixed_tests layers_cuda_test decoder_cuda_test hf_decoder_gpu_parity_np2
for run in "0 0" "3 0"; do set -- $run
  timeout 75 $B/bin/train_bench --models=llama-1B --stages=$1 --loss_chunk_rows=$2 --batch=16 --seq=1024 \
    --iters=5 --warmup=2 --dtype=bf16 >> $OUT/train_bench.jsonl 2>> $OUT/train_bench.err
  el "train_bench stage $1 rc=$?"
done
python3 -c "
import json
for l in open('$OUT/train_bench.jsonl'):
  d=json.loads(l); print({k:d.get(k) for k in ['model','stage','loss_chunk_rows','tokens_per_s','mfu','step_ms','error']})"
timeout 200 python3 exp/anchors/torch_llama_anchor.py llama1b_eager llama1b_compile > $OUT/anchor.jsonl 2> $OUT/anchor.err
el "anchor rc=$?"; cut -c1-300 $OUT/anchor.jsonl
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
left=$(( 500 - ($(date +%s) - T0) )); el "nsys=${NSYS:-none} with ${left}s"
if [[ -n "$NSYS" ]] && (( left > 50 )); then
  timeout $left $NSYS profile -t cuda,osrt --force-overwrite true -o /tmp/step $B/bin/train_bench --models=llama-1B \
    --stages=0 --batch=16 --seq=1024 --iters=3 --warmup=1 --dtype=bf16 > $OUT/nsys_run.txt 2>&1; el "nsys rc=$?"
  $NSYS stats -q -r cuda_gpu_trace -f csv -o /tmp/trace /tmp/step.nsys-rep > /dev/null 2>&1
  $NSYS stats -q -r cuda_api_sum -f csv -o /tmp/api /tmp/step.nsys-rep > /dev/null 2>&1
  ls /tmp/trace* /tmp/api* 2>/dev/null
  for f in /tmp/trace*.csv /tmp/api*.csv; do [[ -f $f ]] && gzip -c $f > $OUT/$(basename $f).gz; done
  python3 bench/gpu_gap_summary.py /tmp/trace*.csv > $OUT/gaps.txt 2>&1; head -40 $OUT/gaps.txt
  head -15 /tmp/api*.csv
fi
