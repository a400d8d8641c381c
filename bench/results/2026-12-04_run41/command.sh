#!/bin/bash
# Device call 6: aio block 4 MiB, queue depth 32; offload_optimizer nvme at 2.7B with the disk measured in the same call.
set -u
start=$SECONDS
mkdir -p /tmp/b && tar xJf gpu_pack/bundle.tar.xz -C /tmp/b
B=/tmp/b/gpu_bundle
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64
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
echo "dd done at $((SECONDS-start)) s"
timeout 400 gpu_pack/train_bench_aio --aio_block_size=4194304 --aio_queue_depth=32 --models=2.7B --stages=3 --offload=both --offload_device=nvme --nvme_path=/tmp/nv --iters=2 --warmup=1 > $OUT/train.jsonl 2> $OUT/train_err.txt
echo "train exit $? at $((SECONDS-start)) s"
cut -c1-3000 $OUT/train.jsonl | python3 -c "
import sys, json
for l in sys.stdin:
    d = json.loads(l) if l.startswith('{') else None
    if d: print({k: d.get(k) for k in ('tokens_per_s','step_ms','loss','nvme','offload')})
" 2>&1 | head
grep -i "nvme\|GB/s" $OUT/train_err.txt | tail -5
