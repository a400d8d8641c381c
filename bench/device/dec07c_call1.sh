#!/bin/bash
# Third session of 2026-12-07, call 1 (carry gpu_pack and
# .corpus/linux_doc.txt.xz):
# 1. The new token-gradient kernel (ce0905f) against the CPU, bit for bit
#    (functional_cuda_test), and the fixed-order sum of squares (2888dc9)
#    against its host emulation (ops_cuda_test).
# 2. Issue 28's activation pairs with the token table's (V, C) f32 scratch
#    gone: 1.3B and llama-1B as run 69 call 3 (1024-row loss chunks), and
#    the 8B Llama shape (stage 2, optimizer on the host with 8-bit moments:
#    bench/device/llama8b_8bit_offload.json, micro-batch 8).
# 3. Is a GPU run reproducible on one machine? The 350M convergence config
#    twice at once, same seed, 100 steps, the loss printed every 10.
source bench/device/setup.sh
xz -dc .corpus/linux_doc.txt.xz > /tmp/linux_doc.txt
python3 -c "
import json; c = json.load(open('bench/convergence/f32.json')); c['steps_per_print'] = 10
json.dump(c, open('/tmp/det.json', 'w'))"
for r in a b; do
  timeout 150 $B/bin/train_gpt --config=/tmp/det.json --model=350M \
    --data=text:/tmp/linux_doc.txt --seq=512 --steps=100 --eval_every=100 \
    --eval_windows=64 --seed=1 --device=cuda --progress=log \
    > $OUT/det_$r.log 2>&1 &
done
wait
el "determinism runs done"
for r in a b; do grep -o "step [0-9]* loss [0-9.]*" $OUT/det_$r.log | tr '\n' ' ' | cut -c1-400; echo; done
cmp <(grep -o "step [0-9]* loss [0-9.]*" $OUT/det_a.log) \
    <(grep -o "step [0-9]* loss [0-9.]*" $OUT/det_b.log) && echo "determinism: identical"

run_fixed_tests functional_cuda_test ops_cuda_test

BENCH_DEFAULTS="--batch=16 --seq=1024 --iters=4 --warmup=2 --dtype=bf16 --stages=0 --checkpointing=1 --loss_chunk_rows=1024 --peak_attribution=1"
BENCH_TIMEOUT=60
bench ck13 --models=1.3B
bench cpu13 --models=1.3B --cpu_checkpointing=1
bench ckl1 --models=llama-1B
bench cpul1 --models=llama-1B --cpu_checkpointing=1
BENCH_DEFAULTS="--batch=8 --seq=1024 --iters=3 --warmup=1 --dtype=bf16 --stages=2 --checkpointing=1 --loss_chunk_rows=1024 --peak_attribution=1 --offload=optimizer --ds_config_patch=bench/device/llama8b_8bit_offload.json"
BENCH_TIMEOUT=170
bench ckl8 --models=llama-8B
bench cpul8 --models=llama-8B --cpu_checkpointing=1
python3 -c "
import json
for l in open('$OUT/train_bench.jsonl'):
  d=json.loads(l); print({k:d.get(k) for k in ['model','cpu_checkpointing','step_ms','tokens_per_s','peak_bytes_above_initialize','error']})
  if 'peak_attribution' in d:
    for label, b in d['peak_attribution']['bytes_by_scope'][:6]: print('   %-40s %8.3f GB' % (label, b / 1e9))" | cut -c1-400
(cd $OUT && tar czf /tmp/all.tgz . && find . -mindepth 1 -delete && mv /tmp/all.tgz $OUT/all.tgz)
