#!/bin/bash
# Device call 8 (seventh session): the CPU optimizer against the step's own
# memory traffic (cpu_adam_bench's new step_traffic bound) and PyTorch's
# fused CPU AdamW, alternating; then the offloaded 1.3B stage-2 step with
# and without gradient clipping (without: the update begins during
# backward, as DeepSpeed's anchor config clips none), with the no-offload
# runs of the same configs.
set -u
start=$SECONDS
mkdir -p /tmp/b && tar xJf gpu_pack/bundle.tar.xz -C /tmp/b
B=/tmp/b/gpu_bundle
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64
{ date -u; git log --oneline -1 2>/dev/null; nproc; free -g; nvidia-smi --query-gpu=name,memory.used,power.limit --format=csv; } > $OUT/facts.txt 2>&1
for round in 1 2 3; do
  echo "{\"round\":$round,\"who\":\"torch\"} $(python3 gpu_pack/torch_anchor.py cpu 2>/dev/null | tail -1)" >> $OUT/cpuadam.txt
  $B/bin/cpu_adam_bench --threads=16 --steps=8 > /tmp/ours.txt 2>&1
  while read -r line; do echo "{\"round\":$round,\"who\":\"ours\"} $line" >> $OUT/cpuadam.txt; done < /tmp/ours.txt
  echo "cpu adam round $round at $((SECONDS-start)) s"
done
T="$B/bin/train_bench --models=1.3B --stages=2 --warmup=2"
run() { echo "### $*" >> $OUT/train.txt; "$@" >> $OUT/train.txt 2>> $OUT/train_err.txt; echo "done $* at $((SECONDS-start)) s"; }
run $T --iters=4
run $T --iters=4 --offload=optimizer
run $T --iters=4 --gradient_clipping=0 --reduce_bucket_size=5e7
run $T --iters=4 --gradient_clipping=0 --reduce_bucket_size=5e7 --offload=optimizer
run $T --iters=3 --accumulation=4 --gradient_clipping=0 --reduce_bucket_size=5e7
run $T --iters=3 --accumulation=4 --gradient_clipping=0 --reduce_bucket_size=5e7 --offload=optimizer
python3 - $OUT/train.txt $OUT/cpuadam.txt <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("###"): print(line.strip()); continue
    if not line.startswith("{"): continue
    d = json.loads(line)
    print(round(d["tokens_per_s"]), round(d["step_ms"], 1), d.get("offload_worker"))
for line in open(sys.argv[2]):
    head, _, body = line.partition("} ")
    try: d = json.loads(body)
    except Exception: continue
    print(head + "}", {k: d.get(k) for k in ("mparams_per_s", "params_per_s", "mean_s", "adam_GBps", "step_traffic_GBps", "step_traffic_mean_s", "fraction_of_step_traffic", "read_GBps", "triad_GBps") if k in d})
PY
