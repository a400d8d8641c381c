#!/bin/bash
# Device call 4 (2026-12-04, sixth session): the disk under a mixed load.
# The NVMe tier reads and writes the swap file at the same time; dd alone
# measures one direction. Measures dd write, dd read, both at once, and the
# store (nvme_bench) at DeepSpeed's aio defaults and at a deeper queue.
set -u
start=$SECONDS
mkdir -p /tmp/b && tar xJf gpu_pack/bundle.tar.xz -C /tmp/b
B=/tmp/b/gpu_bundle
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64
D=/tmp/disk; mkdir -p $D; df -h /tmp > $OUT/df.txt
gb() { python3 -c "import sys; print(round(8*1024**3/(float(sys.argv[2])-float(sys.argv[1]))/1e9,2))" "$1" "$2"; }
t0=$(date +%s.%N); dd if=/dev/zero of=$D/a bs=1M count=8192 oflag=direct status=none; t1=$(date +%s.%N)
echo "{\"dd\":\"write\",\"GBps\":$(gb $t0 $t1)}" | tee -a $OUT/disk.jsonl
t0=$(date +%s.%N); dd if=$D/a of=/dev/null bs=1M iflag=direct status=none; t1=$(date +%s.%N)
echo "{\"dd\":\"read\",\"GBps\":$(gb $t0 $t1)}" | tee -a $OUT/disk.jsonl
# Both at once: read file a while writing file b.
t0=$(date +%s.%N)
( dd if=$D/a of=/dev/null bs=1M iflag=direct status=none; echo "r $(date +%s.%N)" > $D/r.done ) &
( dd if=/dev/zero of=$D/b bs=1M count=8192 oflag=direct status=none; echo "w $(date +%s.%N)" > $D/w.done ) &
wait
tr=$(cut -d' ' -f2 $D/r.done); tw=$(cut -d' ' -f2 $D/w.done)
echo "{\"dd\":\"read_while_writing\",\"read_GBps\":$(gb $t0 $tr),\"write_GBps\":$(gb $t0 $tw)}" | tee -a $OUT/disk.jsonl
rm -f $D/a $D/b
echo "dd done at $((SECONDS-start)) s"
timeout 120 $B/bin/nvme_bench --directory=$D --bytes=8GiB | tee -a $OUT/nvme_bench.jsonl
timeout 120 $B/bin/nvme_bench --directory=$D --bytes=8GiB --queue_depth=32 --block_size=4MiB | grep nvme_store | tee -a $OUT/nvme_bench.jsonl
echo "all done at $((SECONDS-start)) s"
