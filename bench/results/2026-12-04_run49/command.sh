#!/bin/bash
# Device call 2 (eighth session): issue 12's stage-2 targets in one call:
# DeepSpeed 0.19.8 ZeRO-2 + offload_optimizer cpu (the anchor script, no
# clipping) and ours at e6b9f2a, stage 2 with and without offload at
# accumulation 1 and 4; then offload_optimizer nvme at 2.7B with 16M
# chunks (not measured since the cap went from 4M to 16M), dd alongside.
set -u
start=$SECONDS
mkdir -p /tmp/b && tar xJf gpu_pack/bundle.tar.xz -C /tmp/b
B=/tmp/b/gpu_bundle
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64
{ date -u; nproc; free -g; lscpu | grep -E "Model name|NUMA|Socket"; nvidia-smi --query-gpu=name,memory.used,power.limit --format=csv; } > $OUT/facts.txt 2>&1
NEW=$B/bin/train_bench
run() { echo "### $*" >> $OUT/train.txt; "$@" >> $OUT/train.txt 2>> $OUT/train_err.txt; echo "done $* at $((SECONDS-start)) s"; }
S2="--models=1.3B --stages=2 --warmup=2 --gradient_clipping=0 --reduce_bucket_size=5e7"
run $NEW $S2 --iters=4
run $NEW $S2 --iters=4 --offload=optimizer
( cd .anchors && OUT=$OUT timeout 220 bash run_deepspeed_anchor.sh --fallback --budget 200 z2_off_1.3B > $OUT/deepspeed_stdout.txt 2>&1 )
echo "deepspeed done at $((SECONDS-start)) s"; tail -3 $OUT/deepspeed_stdout.txt
run $NEW $S2 --iters=4 --offload=optimizer
run $NEW $S2 --iters=3 --accumulation=4
run $NEW $S2 --iters=3 --accumulation=4 --offload=optimizer
python3 - $OUT/train.txt <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("###"): print(line.strip()[:200]); continue
    if not line.startswith("{"): continue
    d = json.loads(line)
    print(round(d.get("tokens_per_s", 0)), round(d.get("step_ms", 0), 1), d.get("offload_worker"), d.get("error"))
PY
D=/tmp/disk; mkdir -p $D /tmp/nv
gb() { python3 -c "import sys; print(round(8*1024**3/(float(sys.argv[2])-float(sys.argv[1]))/1e9,2))" "$1" "$2"; }
t0=$(date +%s.%N); dd if=/dev/zero of=$D/a bs=1M count=8192 oflag=direct status=none; t1=$(date +%s.%N)
echo "{\"dd\":\"write\",\"GBps\":$(gb $t0 $t1)}" | tee -a $OUT/disk.jsonl
t0=$(date +%s.%N); dd if=$D/a of=/dev/null bs=1M iflag=direct status=none; t1=$(date +%s.%N)
echo "{\"dd\":\"read\",\"GBps\":$(gb $t0 $t1)}" | tee -a $OUT/disk.jsonl
t0=$(date +%s.%N)
( dd if=$D/a of=/dev/null bs=1M iflag=direct status=none; echo "r $(date +%s.%N)" > $D/r.done ) &
( dd if=/dev/zero of=$D/b bs=1M count=8192 oflag=direct status=none; echo "w $(date +%s.%N)" > $D/w.done ) &
wait
tr=$(cut -d' ' -f2 $D/r.done); tw=$(cut -d' ' -f2 $D/w.done)
echo "{\"dd\":\"read_while_writing\",\"read_GBps\":$(gb $t0 $tr),\"write_GBps\":$(gb $t0 $tw)}" | tee -a $OUT/disk.jsonl
rm -rf $D
left=$((585 - (SECONDS - start)))
echo "dd done at $((SECONDS-start)) s; nvme with ${left} s"
timeout $left $B/bin/train_bench --models=2.7B --stages=3 --offload=both --offload_device=nvme --nvme_path=/tmp/nv --iters=2 --warmup=1 --aio_block_size=4194304 --aio_queue_depth=32 > $OUT/nvme_train.jsonl 2> $OUT/nvme_train_err.txt
echo "nvme exit $? at $((SECONDS-start)) s"
cut -c1-3000 $OUT/nvme_train.jsonl | python3 -c "
import sys, json
for l in sys.stdin:
    d = json.loads(l) if l.startswith('{') else None
    if d: print({k: d.get(k) for k in ('tokens_per_s','step_ms','loss','nvme','offload','offload_worker')})
" 2>&1 | head
tail -3 $OUT/nvme_train_err.txt
