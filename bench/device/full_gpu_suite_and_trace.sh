#!/bin/bash
# Every gpu test of the pack (about 150 s), then llama-1B through train_bench
# at stages 0 and 3 (the same command as run 59), then, if the machine has
# nsys anywhere, a trace of 3 steps and bench/gpu_gap_summary.py's account of
# the GPU's idle time inside a step. Capped to fit one short call.
source bench/device/setup.sh
timeout 240 $B/run_gpu_tests.sh > $OUT/gpu_tests.txt 2>&1; el "gpu tests rc=$?"
grep -h "^PASSED\|^FAILED\|^SKIPPED\|gpu tests:" $OUT/gpu_tests.txt | cut -c1-200
grep -A12 "^FAILED" $OUT/gpu_tests.txt | grep "Failure\|Expected\|Which is\|actual\|FAILED  \]" | head -20
for stage in 0 3; do
  timeout 60 $B/bin/train_bench --models=llama-1B --stages=$stage --batch=16 --seq=1024 \
    --iters=5 --warmup=2 --dtype=bf16 >> $OUT/train_bench.jsonl 2>> $OUT/train_bench.err
  el "train_bench stage $stage rc=$?"
done
python3 -c "
import json
for l in open('$OUT/train_bench.jsonl'):
  d=json.loads(l); print({k:d.get(k) for k in ['model','stage','tokens_per_s','mfu','step_ms','device','error']})"
NSYS=$(command -v nsys || find /usr/local /opt -name nsys -type f -perm -u+x 2>/dev/null | head -1)
left=$(( 330 - ($(date +%s) - T0) )); el "nsys=${NSYS:-none} with ${left}s"
if [[ -n "$NSYS" ]] && (( left > 45 )); then
  timeout $left $NSYS profile -t cuda --force-overwrite true -o /tmp/step $B/bin/train_bench --models=llama-1B \
    --stages=0 --batch=16 --seq=1024 --iters=3 --warmup=1 --dtype=bf16 > $OUT/nsys_run.txt 2>&1; el "nsys rc=$?"
  $NSYS stats -q -r cuda_gpu_trace -f csv -o /tmp/trace /tmp/step.nsys-rep > /dev/null 2>&1
  python3 bench/gpu_gap_summary.py /tmp/trace*.csv > $OUT/gaps.txt 2>&1; cut -c1-1500 $OUT/gaps.txt
fi
