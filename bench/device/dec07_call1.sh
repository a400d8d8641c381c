#!/bin/bash
# Session of 2026-12-07, call 1, in order of what matters if cut short:
# every gpu test of the pack (first GPU run of 38bf82e's streaming backup,
# 82f9c73's gathers kept across micro-steps and ae2508f's pipeline mode);
# issue 27's 1.3B stage-2 pair (no offload / offload_optimizer cpu);
# issue 28's activation memory: checkpointing without and with
# cpu_checkpointing (and with the MLPs' recomputed activation functions) at
# a 4096-row loss chunk (the logits chunk is most of what cpu_checkpointing
# leaves on the GPU), for the 1.3B GPT and llama-1B, then the recompute alone
# against nothing; issue 27's pair at accumulation 4; train_bench's pipeline
# mode on the GPU (2 ranks sharing it over MPI). LIMIT seconds (default
# 560). One tarball back.
source bench/device/setup.sh
LIMIT=${LIMIT:-560}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
timeout 220 $B/run_gpu_tests.sh > $OUT/gpu_tests.txt 2>&1; el "gpu tests rc=$?"
grep -h "^FAILED\|^SKIPPED\|gpu tests:" $OUT/gpu_tests.txt | cut -c1-200
grep -A12 "^FAILED" $OUT/gpu_tests.txt | grep "Failure\|Expected\|Which is\|actual\|FAILED  \]" | head -20
bench() {  # tag, then train_bench flags
  local tag=$1; shift
  (( $(left) > 35 )) || { el "skip $tag"; return; }
  timeout 60 $B/bin/train_bench --batch=16 --seq=1024 --iters=4 --warmup=2 --dtype=bf16 "$@" \
    >> $OUT/train_bench.jsonl 2>> $OUT/train_bench.err
  el "$tag rc=$?"
}
bench gpt2 --models=1.3B --stages=2 --offload=none --reduce_bucket_size=5e7
bench gpt2off --models=1.3B --stages=2 --offload=optimizer --reduce_bucket_size=5e7
A="--stages=0 --checkpointing=1 --loss_chunk_rows=4096"
bench ckpt --models=1.3B $A
bench cpuckpt --models=1.3B $A --cpu_checkpointing=1
bench cpuckptrc --models=1.3B $A --cpu_checkpointing=1 --recompute_activations=1
bench lckpt --models=llama-1B $A
bench lcpuckpt --models=llama-1B $A --cpu_checkpointing=1
bench lcpuckptrc --models=llama-1B $A --cpu_checkpointing=1 --recompute_activations=1
bench plain --models=1.3B --stages=0
bench rc --models=1.3B --stages=0 --recompute_activations=1
bench lplain --models=llama-1B --stages=0
bench lrc --models=llama-1B --stages=0 --recompute_activations=1
bench gpt2a4 --models=1.3B --stages=2 --offload=none --reduce_bucket_size=5e7 --accumulation=4 --iters=2
bench gpt2offa4 --models=1.3B --stages=2 --offload=optimizer --reduce_bucket_size=5e7 --accumulation=4 --iters=2
if (( $(left) > 60 )); then
  timeout $(( $(left) - 15 )) mpirun -np 2 --bind-to none $B/bin/train_bench --models=350M \
    --stages=0,3 --batch=8 --seq=1024 --accumulation=4 --iters=2 --warmup=1 --dtype=bf16 \
    --backend=mpi --pipeline_stages=2 > $OUT/pipeline.jsonl 2> $OUT/pipeline.err
  el "pipeline rc=$?"; cut -c1-400 $OUT/pipeline.jsonl
fi
python3 -c "
import json
for l in open('$OUT/train_bench.jsonl'):
  d=json.loads(l); print({k:d.get(k) for k in ['model','stage','offload','accumulation','checkpointing','cpu_checkpointing','recompute_activations','tokens_per_s','step_ms','peak_bytes_above_initialize','speculation','error']})" | cut -c1-600
(cd $OUT && tar czf /tmp/all.tgz . && find . -mindepth 1 -delete && mv /tmp/all.tgz $OUT/all.tgz)
