#!/bin/bash
# Session of 2026-12-07, call 1, in order of what matters if cut short:
# every gpu test of the pack (first GPU run of 38bf82e's streaming backup,
# 82f9c73's gathers kept across micro-steps and ae2508f's pipeline mode),
# issue 27's 1.3B stage-2 pairs at accumulation 1 and 4, issue 28's
# activation-checkpointing pairs (1.3B GPT and llama-1B, without and with
# cpu_checkpointing, at the loss's default chunk and at 4096 rows: the
# logits chunk is most of what cpu_checkpointing leaves on the GPU), and train_bench's pipeline mode on the GPU (2 ranks
# sharing it over MPI). LIMIT seconds (default 540). One tarball back.
source bench/device/setup.sh
LIMIT=${LIMIT:-540}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
timeout 240 $B/run_gpu_tests.sh > $OUT/gpu_tests.txt 2>&1; el "gpu tests rc=$?"
grep -h "^FAILED\|^SKIPPED\|gpu tests:" $OUT/gpu_tests.txt | cut -c1-200
grep -A12 "^FAILED" $OUT/gpu_tests.txt | grep "Failure\|Expected\|Which is\|actual\|FAILED  \]" | head -20
bench() {  # tag, then train_bench flags
  local tag=$1; shift
  (( $(left) > 40 )) || { el "skip $tag"; return; }
  timeout 80 $B/bin/train_bench --batch=16 --seq=1024 --iters=4 --warmup=2 --dtype=bf16 "$@" \
    >> $OUT/train_bench.jsonl 2>> $OUT/train_bench.err
  el "$tag rc=$?"
}
bench gpt2 --models=1.3B --stages=2 --offload=none --reduce_bucket_size=5e7
bench gpt2off --models=1.3B --stages=2 --offload=optimizer --reduce_bucket_size=5e7
bench gpt2a4 --models=1.3B --stages=2 --offload=none --reduce_bucket_size=5e7 --accumulation=4 --iters=2
bench gpt2offa4 --models=1.3B --stages=2 --offload=optimizer --reduce_bucket_size=5e7 --accumulation=4 --iters=2
bench ckpt --models=1.3B --stages=0 --checkpointing=1
bench cpuckpt --models=1.3B --stages=0 --checkpointing=1 --cpu_checkpointing=1
bench ckpt4k --models=1.3B --stages=0 --checkpointing=1 --loss_chunk_rows=4096
bench cpuckpt4k --models=1.3B --stages=0 --checkpointing=1 --cpu_checkpointing=1 --loss_chunk_rows=4096
bench lckpt4k --models=llama-1B --stages=0 --checkpointing=1 --loss_chunk_rows=4096
bench lcpuckpt4k --models=llama-1B --stages=0 --checkpointing=1 --cpu_checkpointing=1 --loss_chunk_rows=4096
if (( $(left) > 60 )); then
  timeout $(( $(left) - 15 )) mpirun -np 2 --bind-to none $B/bin/train_bench --models=350M \
    --stages=0,3 --batch=8 --seq=1024 --accumulation=4 --iters=2 --warmup=1 --dtype=bf16 \
    --backend=mpi --pipeline_stages=2 > $OUT/pipeline.jsonl 2> $OUT/pipeline.err
  el "pipeline rc=$?"; cut -c1-400 $OUT/pipeline.jsonl
fi
python3 -c "
import json
for l in open('$OUT/train_bench.jsonl'):
  d=json.loads(l); print({k:d.get(k) for k in ['model','stage','offload','accumulation','tokens_per_s','step_ms','peak_bytes_above_initialize','speculation','offload_worker','loss_chunk_rows','activation_offload','error']})" | cut -c1-700
(cd $OUT && tar czf /tmp/all.tgz . && find . -mindepth 1 -delete && mv /tmp/all.tgz $OUT/all.tgz)
