#!/bin/bash
# Second session of 2026-12-07, call 2 (carry gpu_pack): after the merges of
# the zero-bubble schedule (issue 29), the speculative update with host
# weights (issue 27) and the NVMe duplex measure (issue 28).
#   1. Alone on the GPU: issue 27's stage-3 pair with both offloads past the
#      clipping phase (40 warm-up steps), now that host weights speculate;
#      issue 28's activation peak broken down by allocation scope
#      (--peak_attribution=1) for the 1.3B GPT and llama-1B with
#      checkpointing and cpu_checkpointing.
#   2. At once (none of it timed): the whole gpu test suite; issue 29's
#      pipelines of 2 and 4 ranks sharing the GPU over MPI, every rank's
#      memory peak (checked against bench/pipeline_model here, not there),
#      zb_h1 beside 1F1B; nvme_bench's duplex figures on the disk.
#   3. Issue 28's step on NVMe (both tiers) with the disk's duplex baseline
#      measured by the same process, while time is left.
source bench/device/setup.sh
BENCH_DEFAULTS="--batch=16 --seq=1024 --iters=10 --warmup=40 --dtype=bf16 --reduce_bucket_size=5e7"
BENCH_TIMEOUT=80
bench s3 --models=1.3B --stages=3
bench s3both --models=1.3B --stages=3 --offload=both
BENCH_DEFAULTS="--batch=16 --seq=1024 --iters=2 --warmup=1 --dtype=bf16 --stages=0 --checkpointing=1 --cpu_checkpointing=1 --peak_attribution=1"
BENCH_TIMEOUT=60
bench attr13 --models=1.3B
bench attrl1 --models=llama-1B
python3 -c "
import json
for l in open('$OUT/train_bench.jsonl'):
  d=json.loads(l); print({k:d.get(k) for k in ['model','stage','offload','tokens_per_s','step_ms','grad_norm','speculation','peak_bytes_above_initialize','error']})
  if 'peak_attribution' in d:
    for label, b in d['peak_attribution']['bytes_by_scope'][:12]: print('   %-40s %8.3f GB' % (label, b / 1e9))" | cut -c1-400

mkdir -p /tmp/nv
timeout 240 $B/run_gpu_tests.sh > $OUT/gpu_tests.txt 2>&1 &
tests=$!
( for spec in "2 1f1b" "2 zb_h1" "4 1f1b"; do
    set -- $spec
    timeout 110 mpirun -np $1 -x ZE_ALLOW_GPU_SHARING=1 -x LD_LIBRARY_PATH \
      $B/bin/train_bench --models=1.3B --stages=0 --batch=8 --seq=1024 \
      --accumulation=4 --iters=2 --warmup=1 --dtype=bf16 --backend=mpi \
      --pipeline_stages=$1 --pipeline_schedule=$2 \
      >> $OUT/pipeline.jsonl 2>> $OUT/pipeline.err
    el "pipeline $spec rc=$?"
  done ) &
pipes=$!
timeout 150 $B/bin/nvme_bench --directory=/tmp/nv --bytes=4GiB \
  >> $OUT/nvme_bench.jsonl 2>> $OUT/nvme_bench.err
el "nvme_bench rc=$?"
wait $pipes
wait $tests; el "gpu tests rc=$?"
grep -h "^FAILED\|^SKIPPED\|gpu tests:" $OUT/gpu_tests.txt | cut -c1-200
grep -A12 "^FAILED" $OUT/gpu_tests.txt | grep "Failure\|Expected\|Which is\|actual\|FAILED  \]" | head -20
python3 - $OUT <<'PY'
import json, sys
out = sys.argv[1]
for line in open(f"{out}/pipeline.jsonl"):
    d = json.loads(line)
    if "error" in d: print(d["error"]); continue
    p = d["pipeline"]
    for r in p["ranks"]:
        print(p["schedule"], p["stages"], "rank", r["rank"], "peak GiB %.2f" % (r["peak_mib"] / 1024),
              "saved", r["peak_saved_micro_batches"], "/", r["activation_bound"], "loss %.4f" % d["loss"],
              "step_ms %.0f" % d["step_ms"])
for line in open(f"{out}/nvme_bench.jsonl"):
    print(line.strip()[:400])
PY
if (( $(left) > 150 )); then
  timeout $(( $(left) - 10 )) $B/bin/train_bench --models=1.3B --stages=3 \
    --batch=16 --seq=1024 --iters=3 --warmup=1 --dtype=bf16 --offload=both \
    --offload_device=nvme --offload_param_device=nvme --max_in_cpu=0 \
    --nvme_path=/tmp/nv --disk_baseline=1 --disk_baseline_bytes=4GiB \
    >> $OUT/nvme_train.jsonl 2>> $OUT/nvme_train.err
  el "nvme train_bench rc=$?"
  python3 -c "
import json
for l in open('$OUT/nvme_train.jsonl'):
  d=json.loads(l); print({k:d.get(k) for k in ['bench','model','step_ms','tokens_per_s','duplex','nvme','error']})" | cut -c1-900
fi
(cd $OUT && tar czf /tmp/all.tgz . && find . -mindepth 1 -delete && mv /tmp/all.tgz $OUT/all.tgz)
