#!/bin/bash
# Issue 25: generation at the Llama-3.1-8B shape, batch 1 and
# 16, ours (stage 0, KV cache) and transformers' generate in the same call;
# then a per-kernel profile of one llama-1B training step (ncu) to see where
# the 13% to torch.compile goes.
source bench/device/setup.sh
rm -rf /tmp/l8 /tmp/l8_out /tmp/t32.bin
timeout 200 $B/bin/generate_bench --model=llama-8B --batch=1,16 --stage=0 --cache=1 --prompt=128 --new_tokens=128 --iters=3 --warmup=1 > $OUT/gen8b_ze.jsonl 2> $OUT/gen8b_ze.err; el "ze rc=$?"
timeout 200 python3 bench/hf_generate_reference.py --model=llama-8B --batch=1,16 --cache=1 --prompt=128 --new_tokens=128 --iters=3 --warmup=1 > $OUT/gen8b_hf.jsonl 2> $OUT/gen8b_hf.err; el "hf rc=$?"
cat $OUT/gen8b_ze.jsonl $OUT/gen8b_hf.jsonl | python3 -c 'import json,sys
for l in sys.stdin:
 d=json.loads(l); print(d["impl"],d["model"],d.get("batch"),d.get("device"),d.get("tokens_per_s"),d.get("ms_per_token"),d.get("prefill_ms"),round(d.get("memory",{}).get("peak_bytes_in_use",0)/2**30,2),d.get("error"))'
tail -2 $OUT/gen8b_ze.err $OUT/gen8b_hf.err
left=$(( 570 - ($(date +%s) - T0) )); el "ncu with ${left}s"
if (( left > 60 )); then
  timeout $left ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw \
    $B/bin/train_bench --models=llama-1B --stages=0 --batch=16 --seq=1024 --iters=1 --warmup=0 --dtype=bf16 > /tmp/k.csv 2> $OUT/ncu.err
  el "ncu rc=$?"; gzip -c /tmp/k.csv > $OUT/ncu_llama1b.csv.gz
  python3 bench/ncu_kernel_summary.py $OUT/ncu_llama1b.csv.gz > $OUT/ncu_summary.txt 2>&1; head -40 $OUT/ncu_summary.txt
fi
