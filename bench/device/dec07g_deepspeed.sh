#!/bin/bash
# Seventh session of 2026-12-07 (carry gpu_pack with train_bench, and
# .anchors = ../shared/anchors): issue 27's DeepSpeed comparison at 1.3B with
# clipping 1.0, both sides at the same placement. Ours: stage 2 without
# offload, with offload_optimizer at ratio 1.0 and 0.4; stage 3 without
# offload, with both offloads at ratio 1.0 and 0.5. DeepSpeed 0.19.8 in the
# same call: z2_off_1.3B (ZeRO-Offload: all of the state on the host, the
# only placement its stage 2 has) and z3_off_1.3B with offload_optimizer's
# ratio 0.5 (ZeRO-Offload++'s partial offload, a stage 3 key there), the
# anchor's config given "gradient_clipping": 1.0 (the only change).
rm -rf /tmp/b
source bench/device/setup.sh
BENCH_DEFAULTS="--batch=16 --seq=1024 --iters=5 --warmup=2 --dtype=bf16 --models=1.3B"
BENCH_TIMEOUT=75
bench s2none --stages=2
bench s2r1.0 --stages=2 --offload=optimizer --offload_ratio=1.0
bench s2r0.4 --stages=2 --offload=optimizer --offload_ratio=0.4
bench s3none --stages=3
bench s3r1.0 --stages=3 --offload=both --offload_ratio=1.0
bench s3r0.5 --stages=3 --offload=both --offload_ratio=0.5
python3 -c "
import json
for l in open('$OUT/train_bench.jsonl'):
  d=json.loads(l)
  if d.get('error'): print('ERROR', d['error'][:200]); continue
  w=d.get('offload_worker',{})
  print('ours', d['stage'], d['offload'], d['ds_config']['zero_optimization'].get('offload_optimizer',{}).get('ratio','-'), round(d['tokens_per_s']), round(d['step_ms'],1), 'cpu', w.get('optimizer_ms'), 'wait', w.get('engine_wait_ms'), d.get('speculation'), 'peak %.2f GB' % (d.get('memory',{}).get('peak_bytes_in_use',0)/1e9))" | cut -c1-300
sed -i 's/"steps_per_print": 1000000,/"steps_per_print": 1000000, "gradient_clipping": 1.0,/' .anchors/deepspeed_anchor.py
grep -c gradient_clipping .anchors/deepspeed_anchor.py
if (( $(left) > 120 )); then
  OUT=$OUT timeout $(( $(left) - 20 )) bash .anchors/run_deepspeed_anchor.sh --fallback --budget $(( $(left) - 30 )) \
    z2_off_1.3B > $OUT/deepspeed_z2.txt 2>&1; el "deepspeed z2 rc=$?"
fi
if (( $(left) > 90 )); then
  OUT=$OUT timeout $(( $(left) - 10 )) bash .anchors/run_deepspeed_anchor.sh --fallback --budget $(( $(left) - 20 )) \
    --zero '{"offload_optimizer": {"device": "cpu", "pin_memory": true, "ratio": 0.5}}' \
    z3_off_1.3B > $OUT/deepspeed_z3.txt 2>&1; el "deepspeed z3 rc=$?"
fi
cut -c1-400 $OUT/deepspeed_anchor.jsonl
tail -4 $OUT/deepspeed_z2.txt $OUT/deepspeed_z3.txt 2>/dev/null | cut -c1-300
el done
