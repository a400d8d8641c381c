#!/bin/bash
# Session of 2026-12-07: the one device call (machines were scarce). In
# parallel first: issue 28's convergence runs (bench/convergence: byte-level
# GPT-350M shape on the Linux kernel's documentation, 2000 steps of 4 x 512
# tokens, one run per moment format, the four at once; carry
# .corpus/linux_doc.txt.xz) and every gpu test of the pack (correctness
# only: they share the GPU with the runs). Then, alone on the GPU, the
# timed pairs: issue 28's activation memory (checkpointing without and with
# cpu_checkpointing and the MLPs' recomputed activation functions, 1.3B GPT
# and llama-1B, 4096-row loss chunk; the recompute alone against nothing)
# and issue 27's 1.3B stage-2 pair. LIMIT seconds (default 560).
source bench/device/setup.sh
xz -dc .corpus/linux_doc.txt.xz > /tmp/linux_doc.txt
sha256sum /tmp/linux_doc.txt | cut -c1-16
pids=()
for v in f32 bf16_rne bf16_sr int8; do
  timeout 300 $B/bin/train_gpt --config=bench/convergence/$v.json \
    --model=350M --data=text:/tmp/linux_doc.txt --seq=512 --steps=2000 \
    --eval_every=100 --seed=1 --device=cuda --progress=log \
    > $OUT/conv_$v.log 2>&1 &
  pids+=($!)
done
timeout 240 $B/run_gpu_tests.sh > $OUT/gpu_tests.txt 2>&1; el "gpu tests rc=$?"
grep -h "^FAILED\|^SKIPPED\|gpu tests:" $OUT/gpu_tests.txt | cut -c1-200
grep -A12 "^FAILED" $OUT/gpu_tests.txt | grep "Failure\|Expected\|Which is\|actual\|FAILED  \]" | head -20
for p in "${pids[@]}"; do wait $p; el "convergence pid $p rc=$?"; done
for v in f32 bf16_rne bf16_sr int8; do
  echo "$v: $(grep 'validation loss' $OUT/conv_$v.log | tail -1) | $(tail -1 $OUT/conv_$v.log | cut -c1-160)"
done
A="--stages=0 --checkpointing=1 --loss_chunk_rows=4096"
bench ckpt --models=1.3B $A
bench cpuckpt --models=1.3B $A --cpu_checkpointing=1
bench cpuckptrc --models=1.3B $A --cpu_checkpointing=1 --recompute_activations=1
bench lckpt --models=llama-1B $A
bench lcpuckpt --models=llama-1B $A --cpu_checkpointing=1
bench lcpuckptrc --models=llama-1B $A --cpu_checkpointing=1 --recompute_activations=1
bench lplain --models=llama-1B --stages=0
bench lrc --models=llama-1B --stages=0 --recompute_activations=1
bench gpt2 --models=1.3B --stages=2 --offload=none --reduce_bucket_size=5e7
bench gpt2off --models=1.3B --stages=2 --offload=optimizer --reduce_bucket_size=5e7
python3 -c "
import json
for l in open('$OUT/train_bench.jsonl'):
  d=json.loads(l); print({k:d.get(k) for k in ['model','stage','offload','checkpointing','cpu_checkpointing','recompute_activations','tokens_per_s','step_ms','peak_bytes_above_initialize','speculation','error']})" | cut -c1-600
(cd $OUT && tar czf /tmp/all.tgz . && find . -mindepth 1 -delete && mv /tmp/all.tgz $OUT/all.tgz)
