#!/bin/bash
# One short call after a batch of changes: every gpu test of the pack (about
# 150 s); llama-1B through train_bench at stages 0 and 3 and PyTorch's
# torch_llama_anchor.py (eager, torch.compile) in the same call; the 1.3B GPT
# at stage 2 without and with offload_optimizer (speculation's counts in its
# JSON); then a trace of 3 llama-1B steps (nsys, or bench/cupti_trace.cc
# where nsys is missing) and bench/gpu_gap_summary.py's account of the
# GPU's idle time. Each part
# runs only while the call's time allows (LIMIT seconds, default 330).
source bench/device/setup.sh
LIMIT=${LIMIT:-330}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
timeout 240 $B/run_gpu_tests.sh > $OUT/gpu_tests.txt 2>&1; el "gpu tests rc=$?"
grep -h "^PASSED\|^FAILED\|^SKIPPED\|gpu tests:" $OUT/gpu_tests.txt | cut -c1-200
grep -A12 "^FAILED" $OUT/gpu_tests.txt | grep "Failure\|Expected\|Which is\|actual\|FAILED  \]" | head -20
bench() {  # tag, then train_bench flags
  local tag=$1; shift
  (( $(left) > 40 )) || { el "skip $tag"; return; }
  timeout 60 $B/bin/train_bench --batch=16 --seq=1024 --iters=5 --warmup=2 --dtype=bf16 "$@" \
    >> $OUT/train_bench.jsonl 2>> $OUT/train_bench.err
  el "$tag rc=$?"
}
bench llama0 --models=llama-1B --stages=0
bench llama3 --models=llama-1B --stages=3
if (( $(left) > 80 )); then
  timeout $(( $(left) - 10 )) python3 exp/anchors/torch_llama_anchor.py llama1b_eager llama1b_compile \
    > $OUT/anchor.jsonl 2> $OUT/anchor.err; el "anchor rc=$?"; cut -c1-300 $OUT/anchor.jsonl
fi
bench gpt2 --models=1.3B --stages=2 --offload=none
bench gpt2off --models=1.3B --stages=2 --offload=optimizer
# The offloaded update starts per reduce bucket: smaller buckets hand the
# CPU its first gradients earlier in backward.
bench gpt2off_b50m --models=1.3B --stages=2 --offload=optimizer --reduce_bucket_size=5e7
python3 -c "
import json
for l in open('$OUT/train_bench.jsonl'):
  d=json.loads(l); d['reduce_bucket_size']=d.get('ds_config',{}).get('zero_optimization',{}).get('reduce_bucket_size'); print({k:d.get(k) for k in ['model','stage','offload','tokens_per_s','mfu','step_ms','reduce_bucket_size','speculation','offload_worker','device','error']})"
# The trace: nsys where the machine has it, else bench/cupti_trace.cc's
# injection library (same CSV columns).
NSYS=$(command -v nsys || find /usr/local /opt -name nsys -type f -perm -u+x 2>/dev/null | head -1)
el "nsys=${NSYS:-none} with $(left)s"
TRACE_RUN="$B/bin/train_bench --models=llama-1B --stages=0 --batch=16 --seq=1024 --iters=3 --warmup=1 --dtype=bf16"
if (( $(left) > 45 )); then
  if [[ -n "$NSYS" ]]; then
    timeout $(left) $NSYS profile -t cuda --force-overwrite true -o /tmp/step $TRACE_RUN > $OUT/trace_run.txt 2>&1
    el "nsys rc=$?"
    $NSYS stats -q -r cuda_gpu_trace -f csv -o /tmp/trace /tmp/step.nsys-rep > /dev/null 2>&1
  fi
  # nsys without its importer (run 61: nsight-compute's copy writes only a
  # .qdstrm) leaves no CSV: the CUPTI library then.
  if ! ls /tmp/trace*.csv > /dev/null 2>&1; then
    CUDA_INJECTION64_PATH=$B/bin/libze_cupti_trace.so ZE_CUPTI_TRACE=/tmp/trace_cupti.csv \
      timeout $(left) $TRACE_RUN > $OUT/trace_run.txt 2>&1
    el "cupti trace rc=$?"; tail -2 $OUT/trace_run.txt
  fi
  python3 bench/gpu_gap_summary.py /tmp/trace*.csv > $OUT/gaps.txt 2>&1; cut -c1-1500 $OUT/gaps.txt
  gzip -c /tmp/trace*.csv > $OUT/trace.csv.gz 2>/dev/null
fi
