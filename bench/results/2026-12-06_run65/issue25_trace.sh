#!/bin/bash
# Issue 25, first call of 2026-12-06's second session: llama-1B at stages 0
# and 3 with the 2 GiB loss chunks (16 -> 2 chunks), PyTorch's eager and
# torch.compile in the same call, then a CUPTI trace of 3 llama-1B steps and
# gpu_gap_summary.py's account of the idle time inside a step (never
# obtained so far: nsys is missing or writes no CSV on these machines).
# Last, issue 27's 1.3B stage-2 pair (no offload / offload_optimizer cpu).
source bench/device/setup.sh
LIMIT=${LIMIT:-420}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
bench() {  # tag, then train_bench flags
  local tag=$1; shift
  (( $(left) > 40 )) || { el "skip $tag"; return; }
  timeout 70 $B/bin/train_bench --batch=16 --seq=1024 --iters=5 --warmup=2 --dtype=bf16 "$@" \
    >> $OUT/train_bench.jsonl 2>> $OUT/train_bench.err
  el "$tag rc=$?"
}
bench llama0 --models=llama-1B --stages=0
bench llama3 --models=llama-1B --stages=3
timeout 200 python3 exp/anchors/torch_llama_anchor.py llama1b_eager llama1b_compile \
  > $OUT/anchor.jsonl 2> $OUT/anchor.err; el "anchor rc=$?"; cut -c1-300 $OUT/anchor.jsonl
TRACE_RUN="$B/bin/train_bench --models=llama-1B --stages=0 --batch=16 --seq=1024 --iters=3 --warmup=1 --dtype=bf16"
CUDA_INJECTION64_PATH=$B/bin/libze_cupti_trace.so ZE_CUPTI_TRACE=/tmp/trace_cupti.csv \
  timeout 90 $TRACE_RUN > $OUT/trace_run.txt 2>&1
el "cupti trace rc=$?"; tail -2 $OUT/trace_run.txt
python3 bench/gpu_gap_summary.py /tmp/trace_cupti.csv > $OUT/gaps.txt 2>&1; cut -c1-3000 $OUT/gaps.txt
gzip -c /tmp/trace_cupti.csv > $OUT/trace.csv.gz 2>/dev/null
bench gpt2 --models=1.3B --stages=2 --offload=none
bench gpt2off --models=1.3B --stages=2 --offload=optimizer
python3 -c "
import json
for l in open('$OUT/train_bench.jsonl'):
  d=json.loads(l); print({k:d.get(k) for k in ['model','stage','offload','loss_chunk_rows','tokens_per_s','mfu','step_ms','peak_gib','speculation','offload_worker','error']})"
