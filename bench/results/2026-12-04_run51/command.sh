#!/bin/bash
# Device call 4 (eighth session): CPU Adam against PyTorch 2.11's fused CPU
# AdamW, alternating in three rounds on this call's machine, with the
# step's own memory-traffic bound (cpu_adam_bench), as run 43 did on
# another machine.
set -u
start=$SECONDS
mkdir -p /tmp/b && tar xJf gpu_pack/bundle.tar.xz -C /tmp/b
B=/tmp/b/gpu_bundle
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64
{ date -u; nproc; free -g; lscpu | grep -E "Model name|NUMA|Socket|MHz"; } > $OUT/facts.txt 2>&1
for round in 1 2 3; do
  echo "{\"round\":$round,\"who\":\"torch\"} $(python3 gpu_pack/torch_anchor.py cpu 2>/dev/null | tail -1)" >> $OUT/cpuadam.txt
  $B/bin/cpu_adam_bench --threads=16 --steps=8 > /tmp/ours.txt 2>&1
  while read -r line; do echo "{\"round\":$round,\"who\":\"ours\"} $line" >> $OUT/cpuadam.txt; done < /tmp/ours.txt
  echo "cpu adam round $round at $((SECONDS-start)) s"
done
python3 - $OUT/cpuadam.txt <<'PY'
import json, sys
for line in open(sys.argv[1]):
    head, _, body = line.partition("} ")
    try: d = json.loads(body)
    except Exception: continue
    print(head + "}", {k: d.get(k) for k in ("mparams_per_s", "params_per_s", "best_s", "mean_s", "adam_GBps", "step_traffic_GBps", "step_traffic_mean_s", "fraction_of_step_traffic", "read_GBps", "triad_GBps", "g_params_per_s", "mean_step_s") if k in d})
PY
