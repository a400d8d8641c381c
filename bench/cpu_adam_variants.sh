#!/bin/bash
# One device call's worth of cpu_adam_bench: the host's facts (CPUs, NUMA
# nodes, transparent huge pages, affinity) into $OUT/facts.txt, then the
# execution choices of offload::CpuExecutionOptions one at a time at 16
# threads, then a thread sweep with the defaults, into $OUT/bench.txt.
#
# Usage: bench/cpu_adam_variants.sh PACK_DIR
#   PACK_DIR holds cpu_adam_bench and the libabsl_*.so it links (the GPU
#   machine has no Abseil): built here with
#   `bazel build -c opt //bench:cpu_adam_bench`, copied with `ldd`.
set -u
pack=$(cd "${1:?usage: $0 PACK_DIR}" && pwd)
out=${OUT:-.}
export LD_LIBRARY_PATH=$pack${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
{
  date -u; nproc; lscpu
  echo "--- numa"; numactl -H 2>&1 || true
  for node in /sys/devices/system/node/node*; do
    echo "$node cpus $(cat "$node/cpulist")"; grep -E "MemTotal|MemFree" "$node/meminfo"
  done
  echo "--- thp"
  cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag
  grep -i huge /proc/meminfo
  echo "--- affinity"; taskset -p $$
  lscpu -e
} > "$out/facts.txt" 2>&1
head -40 "$out/facts.txt"
# BENCH_ARGS: extra flags for every run (e.g. a small --params for a smoke test).
run() { echo "### $*"; timeout 40 "$pack/cpu_adam_bench" --steps=8 ${BENCH_ARGS:-} "$@"; }
{
  # Before this change: dynamic tiles, small pages, plain stores.
  run --threads=16 --schedule=dynamic --huge_pages=0 --nt_out=0
  run --threads=16  # defaults: static split, huge pages, streamed out
  run --threads=16 --huge_pages=0 --nt_out=0
  run --threads=16 --nt_out=0
  run --threads=16 --huge_pages=0
  run --threads=16 --pin=1
  run --threads=16 --prefetch_bytes=1024
  run --threads=16 --prefetch_bytes=4096
  run --threads=16 --schedule=dynamic
  run --threads=16 --schedule=dynamic --pin=1 --tile_kib=256
  run --threads=8
  run --threads=8 --pin=1
  run --threads=15 --pin=1
  run --threads=1,2,4,8,16
} 2>&1 | tee "$out/bench.txt"
