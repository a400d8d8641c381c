#!/bin/bash
# Issue 28's goal, "the largest model on one GPU: at least 25B parameters",
# in one call (carry gpu_pack; one H200 with 139 GiB, 128 GiB of host
# memory, at least 46 GB free under $NVME, default /tmp/nv):
#   1. the plan of bench/device/gpt25b_h200.json for the 25B GPT
#      (25,686,994,944 parameters): ze_estimate's placement (GPU 119.18 GiB,
#      host 104.20 of which 31.25 pinned, NVMe 42.48; see the JSON's notes in
#      bench/device/README.md) and train_gpt --dry_run's activation estimate;
#   2. train_bench --models=25B at stage 3 with that config as the patch
#      (ZeRO-3, the optimizer's last half of the buckets on the CPU and the
#      rest on the GPU, offload_optimizer ratio 0.5; the bf16 weights on NVMe
#      beyond the first 3e9 elements; 8-bit moments), micro-batch 1 x 1024
#      tokens, activation checkpointing, 1 warm-up and 3 timed steps, while
#      a sampler records the GPU's memory in use, the host's MemAvailable and
#      the swap files' bytes on disk every 2 s;
#   3. a summary: tokens/s and step time, every step's loss (finite and
#      falling: train_bench trains each step on the same batch), and where
#      the bytes went against the plan: the GPU (allocator in use after
#      Initialize and at its peak, nvidia-smi's peak), host memory (resident,
#      page-locked, pageable; the sampler's lowest MemAvailable) and disk.
# The swap files are removed by the engine at exit; $NVME is emptied first.
# LIMIT (default 560 s) bounds the whole call; ITERS (default 3) timed steps.
source bench/device/setup.sh
NVME=${NVME:-/tmp/nv}
mkdir -p "$NVME" && rm -f "$NVME"/zero_engine_rank*.swp
df -B1 "$NVME" | tee $OUT/df.txt
free -g | tee $OUT/free.txt
# The config with the swap files under $NVME (the file names /tmp/nv).
sed "s#\"/tmp/nv\"#\"$NVME\"#" bench/device/gpt25b_h200.json > $OUT/gpt25b_h200.json
$B/bin/ze_estimate --model=25B --world_size=1 --config=$OUT/gpt25b_h200.json \
  | tee $OUT/plan.txt
$B/bin/ze_estimate --model=25B --world_size=1 --config=$OUT/gpt25b_h200.json \
  --json > $OUT/plan.json
# train_gpt's --dry_run needs data only to check it: any 20 KB of text.
head -c 30000 /dev/urandom | base64 > $OUT/dry_run.txt
$B/bin/train_gpt --model=25B --config=$OUT/gpt25b_h200.json --seq=1024 \
  --activation_checkpointing --dry_run --data=text:$OUT/dry_run.txt \
  2>&1 | tail -3 | tee $OUT/dry_run_plan.txt
rm -f $OUT/dry_run.txt
el "plan printed"

# Sampler: GPU memory in use (MiB), MemAvailable (kB), swap files (bytes).
(while true; do
   echo "$(date +%s) $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1) $(awk '/MemAvailable/ {print $2}' /proc/meminfo) $(du -sB1 "$NVME" 2>/dev/null | cut -f1)"
   sleep 2
 done) > $OUT/samples.txt 2>/dev/null &
SAMPLER=$!

# The flags say what train_bench's own columns need (offload on, ratio,
# parameters on NVMe, the swap directory); the patch, applied last, is the
# config itself.
timeout $(( $(left) - 15 )) $B/bin/train_bench --models=25B --stages=3 \
  --batch=1 --seq=1024 --iters=${ITERS:-3} --warmup=1 --dtype=bf16 --checkpointing=1 \
  --offload=both --offload_ratio=0.5 --offload_param_device=nvme \
  --nvme_path=$NVME --ds_config_patch=$OUT/gpt25b_h200.json \
  >> $OUT/train_bench.jsonl 2>> $OUT/train_bench.err
el "train_bench 25B rc=$?"
kill $SAMPLER 2>/dev/null
tail -5 $OUT/train_bench.err

python3 - $OUT <<'PYTHON'
import json, math, sys
out = sys.argv[1]
GiB = 1024.0 ** 3
def gib(x):
    return "%.2f GiB" % (x / GiB) if x is not None else "?"
plan_rows = [json.loads(l) for l in open(f"{out}/plan.json")]
plan = plan_rows[0] if plan_rows else {}
samples = []
for line in open(f"{out}/samples.txt"):
    parts = line.split()
    if len(parts) == 4 and all(p.isdigit() for p in parts):
        samples.append([int(p) for p in parts])
runs = [json.loads(l) for l in open(f"{out}/train_bench.jsonl")]
if not runs:
    print("no train_bench line (killed by the time limit or the OOM killer?)")
for d in runs:
    if d.get("error"):
        print("ERROR:", d["error"])
        continue
    losses = d.get("losses", [])
    finite = all(math.isfinite(x) for x in losses)
    falling = len(losses) > 1 and losses[-1] < losses[0]
    print("25B: %.1f tokens/s, %.1f s a step; losses %s: %s, %s" % (
        d["tokens_per_s"], d["step_ms"] / 1e3, [round(x, 4) for x in losses],
        "finite" if finite else "NOT FINITE", "falling" if falling else "NOT FALLING"))
    m = d["memory_breakdown"]
    print("plan (engine): GPU %s (weights %s, gradients %s, master+moments %s);"
          " host %s (pinned %s; master+moments %s, weights %s, staging %s,"
          " swap buffers %s); NVMe %s" % tuple(gib(m.get(k)) for k in (
              "device_bytes", "device_weight_bytes", "gradient_bytes",
              "device_optimizer_bytes", "host_bytes", "pinned_host_bytes",
              "host_optimizer_bytes", "host_weight_bytes", "staging_bytes",
              "swap_buffer_bytes", "nvme_bytes")))
    if plan:
        same = all(plan[k] == m.get(k) for k in
                   ("device_bytes", "host_bytes", "pinned_host_bytes", "nvme_bytes"))
        print("  ze_estimate's plan of the same config %s" %
              ("matches" if same else "DIFFERS: %s" % plan))
    mem = d.get("memory", {})
    print("GPU measured: in use after Initialize %s (plan %s), allocator peak %s,"
          " reserved %s" % (gib(d.get("bytes_in_use_after_initialize")),
                            gib(m["device_bytes"]), gib(mem.get("peak_bytes_in_use")),
                            gib(mem.get("bytes_reserved"))))
    h = d.get("host_memory", {})
    print("host measured: resident %s (peak %s; plan %s), page-locked %s"
          " (plan %s), pageable %s" % (
              gib(h.get("rss_bytes")), gib(h.get("peak_rss_bytes")),
              gib(m["host_bytes"]), gib(h.get("pinned_bytes")),
              gib(m["pinned_host_bytes"]), gib(h.get("pageable_bytes"))))
    n = d.get("nvme_files", {})
    print("disk measured: swap files %s (plan %s)" % (gib(n.get("bytes")),
                                                     gib(m["nvme_bytes"])))
    nv = d.get("nvme", {})
    print("NVMe a step: read %s, written %s, busy %.1f s, %.2f GB/s combined"
          " over the busy time" % (gib(nv.get("bytes_read")), gib(nv.get("bytes_written")),
                                   nv.get("busy_ms", 0) / 1e3, nv.get("combined_GBps_busy", 0)))
    print("stage 3:", d.get("stage3"))
if samples:
    print("sampler: GPU peak %.2f GiB (nvidia-smi, CUDA context included),"
          " lowest MemAvailable %.2f GiB, most on disk %s" % (
              max(s[1] for s in samples) / 1024.0,
              min(s[2] for s in samples) / 1024.0 ** 2,
              gib(max(s[3] for s in samples))))
PYTHON
