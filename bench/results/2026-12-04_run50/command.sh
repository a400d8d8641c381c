#!/bin/bash
# Device call 3 (eighth session): offload_optimizer nvme at 2.7B against
# the disk measured with the anchor's own dd (host_bw.py: 16 MiB blocks,
# 4 GiB, direct I/O) before and after it, in the same call; then 2.7B
# stage 3 with both offloads to cpu (the stream of tiles, e6b9f2a).
set -u
start=$SECONDS
mkdir -p /tmp/b && tar xJf gpu_pack/bundle.tar.xz -C /tmp/b
B=/tmp/b/gpu_bundle
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64
{ date -u; nproc; free -g; df -h /tmp; nvidia-smi --query-gpu=name,memory.used,power.limit --format=csv; } > $OUT/facts.txt 2>&1
dd_anchor() {  # the commands of ../shared/anchors/host_bw.py
  w=$(dd if=/dev/zero of=/tmp/ddtest.bin bs=16M count=256 oflag=direct 2>&1 | tail -1)
  r=$(sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; dd if=/tmp/ddtest.bin of=/dev/null bs=16M iflag=direct 2>&1 | tail -1)
  t0=$(date +%s.%N)
  ( dd if=/tmp/ddtest.bin of=/dev/null bs=16M iflag=direct 2>&1 | tail -1 > /tmp/r.txt ) &
  ( dd if=/dev/zero of=/tmp/ddtest2.bin bs=16M count=256 oflag=direct 2>&1 | tail -1 > /tmp/w.txt ) &
  wait
  echo "{\"when\":\"$1\",\"write\":\"$w\",\"read\":\"$r\",\"read_while_writing\":\"$(cat /tmp/r.txt)\",\"write_while_reading\":\"$(cat /tmp/w.txt)\"}" | tee -a $OUT/disk.jsonl
  rm -f /tmp/ddtest.bin /tmp/ddtest2.bin
}
dd_anchor before
mkdir -p /tmp/nv
timeout 330 $B/bin/train_bench --models=2.7B --stages=3 --offload=both --offload_device=nvme --nvme_path=/tmp/nv --iters=2 --warmup=1 --aio_block_size=4194304 --aio_queue_depth=32 > $OUT/nvme_train.jsonl 2> $OUT/nvme_train_err.txt
echo "nvme exit $? at $((SECONDS-start)) s"
python3 -c "
import json
d = json.loads(open('$OUT/nvme_train.jsonl').read())
print({k: d.get(k) for k in ('tokens_per_s','step_ms','loss','nvme','offload_worker')})
"
dd_anchor after
echo "dd done at $((SECONDS-start)) s"
timeout $((580 - (SECONDS - start))) $B/bin/train_bench --models=2.7B --stages=3 --warmup=1 --iters=2 --offload=both > $OUT/cpu_train.jsonl 2> $OUT/cpu_train_err.txt
echo "cpu exit $? at $((SECONDS-start)) s"
python3 -c "
import json
d = json.loads(open('$OUT/cpu_train.jsonl').read())
print({k: d.get(k) for k in ('tokens_per_s','step_ms','loss','offload_worker')})
"
