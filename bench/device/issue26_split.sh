#!/bin/bash
# Issue 26's offload rows against d9c2e76 after the fine buckets reach the
# 124M GPT (2^24 elements), each beside this commit's run with the CPU/GPU
# split off (offload_optimizer.split_update false: the CPU updates all of
# it), all in one call: does the split pay on this machine? Needs gpu_pack
# and gpu_base (tools/baseline_bundle.sh d9c2e76) carried. base.jsonl:
# d9c2e76; head.jsonl: this commit's defaults; nosplit.jsonl: this commit,
# --split_update=0. LIMIT seconds (default 480).
source bench/device/setup.sh
LIMIT=${LIMIT:-480}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
[[ -d /tmp/baseline ]] || tar xJf gpu_base/baseline.tar.xz -C /tmp
cat /tmp/baseline/COMMIT | tee $OUT/baseline_commit.txt
HEAD_LD=$LD_LIBRARY_PATH
BASE_LD=/tmp/baseline/lib:/usr/local/cuda/lib64
one() {  # which(base|head|nosplit) tag flags...
  local which=$1 tag=$2; shift 2
  (( $(left) > 40 )) || { el "skip $which $tag"; return; }
  if [[ $which == base ]]; then
    LD_LIBRARY_PATH=$BASE_LD timeout 120 /tmp/baseline/bin/train_bench "$@" \
      >> $OUT/base.jsonl 2>> $OUT/base.err
  elif [[ $which == nosplit ]]; then
    LD_LIBRARY_PATH=$HEAD_LD timeout 120 $B/bin/train_bench --split_update=0 \
      "$@" >> $OUT/nosplit.jsonl 2>> $OUT/nosplit.err
  else
    LD_LIBRARY_PATH=$HEAD_LD timeout 120 $B/bin/train_bench "$@" \
      >> $OUT/head.jsonl 2>> $OUT/head.err
  fi
  el "$which $tag rc=$?"
}
common="--batch=16 --seq=1024 --dtype=bf16 --warmup=2"
run_fixed_tests parity_cuda_w1
for which in base head nosplit; do
  one $which 124M-opt --models=124M --stages=2,3 --offload=optimizer $common --iters=10
done
for which in base head nosplit; do
  one $which 1.3B-opt --models=1.3B --stages=2,3 --offload=optimizer $common --iters=6
done
grep -h "gradients are reduced in\|split between" $OUT/head.err | sort | uniq -c | cut -c1-400
python3 - <<PY
import json
rows = {}
for name in ['base', 'head', 'nosplit']:
  try: lines = open('$OUT/' + name + '.jsonl').read().splitlines()
  except OSError: continue
  for l in lines:
    try: d = json.loads(l)
    except ValueError: continue
    key = (d.get('model'), d.get('stage'), d.get('offload'))
    print(name, key, d.get('tokens_per_s'), d.get('step_ms'), d.get('speculation'),
          d.get('offload_worker'), d.get('error'))
    rows.setdefault(key, {})[name] = d.get('tokens_per_s')
for key, r in rows.items():
  for name in ['head', 'nosplit']:
    if r.get('base') and r.get(name):
      print('ratio', name, key, round(r[name] / r['base'], 4))
PY
