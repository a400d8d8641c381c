#!/bin/bash
# Second session of 2026-12-07, call 1 (pack at dab10e7; carry gpu_pack and
# .corpus/linux_doc.txt.xz). Two measurements, no test suite (call 2 runs
# it after the helpers' merges, with issue 29's pipeline memory check):
# 1. Issue 28's convergence again, judged on a validation set 64 times
#    larger (--eval_windows=512: 256 KiB of held-out text instead of run
#    68's 4 KiB) and with a second f32 seed for the noise between runs: five
#    runs of 2000 steps at once on the GPU (bench/convergence).
# 2. Issue 27's 1.3B stage-2 pairs past the clipping phase: 40 warm-up
#    steps on the repeated batch before 10 timed ones, so the timed steps'
#    gradient norms (in the JSON) can fall under clipping 1.0 and the
#    offloaded update can run during backward; accumulation 1 and 4; stage
#    3 with both offloads against stage 3.
source bench/device/setup.sh
xz -dc .corpus/linux_doc.txt.xz > /tmp/linux_doc.txt
sha256sum /tmp/linux_doc.txt | cut -c1-16
pids=()
run_conv() {  # tag config seed
  timeout 420 $B/bin/train_gpt --config=bench/convergence/$2.json \
    --model=350M --data=text:/tmp/linux_doc.txt --seq=512 --steps=2000 \
    --eval_every=250 --eval_windows=512 --seed=$3 --device=cuda \
    --progress=log > $OUT/conv_$1.log 2>&1 &
  pids+=($!)
}
run_conv f32 f32 1
run_conv f32_seed2 f32 2
run_conv bf16_rne bf16_rne 1
run_conv bf16_sr bf16_sr 1
run_conv int8 int8 1
for p in "${pids[@]}"; do wait $p; el "convergence pid $p rc=$?"; done
for v in f32 f32_seed2 bf16_rne bf16_sr int8; do
  echo "$v: $(grep 'validation loss' $OUT/conv_$v.log | tail -1) | $(grep 'steps in' $OUT/conv_$v.log | cut -c1-170)"
done

BENCH_DEFAULTS="--batch=16 --seq=1024 --iters=10 --warmup=40 --dtype=bf16 --reduce_bucket_size=5e7"
BENCH_TIMEOUT=90
bench s2 --models=1.3B --stages=2
bench s2off --models=1.3B --stages=2 --offload=optimizer
bench s2acc4 --models=1.3B --stages=2 --accumulation=4
bench s2offacc4 --models=1.3B --stages=2 --offload=optimizer --accumulation=4
bench s3 --models=1.3B --stages=3
bench s3both --models=1.3B --stages=3 --offload=both
python3 -c "
import json
for l in open('$OUT/train_bench.jsonl'):
  d=json.loads(l); print({k:d.get(k) for k in ['model','stage','offload','accumulation','tokens_per_s','step_ms','grad_norm','speculation','error']})" | cut -c1-400

(cd $OUT && tar czf /tmp/all.tgz . && find . -mindepth 1 -delete && mv /tmp/all.tgz $OUT/all.tgz)
