# Sourced by the scripts beside it, on the device, in the repository root:
# the pack from tools/gpu_bundle.sh unpacked once into $B, its libraries and
# mpirun's root permission in the environment, the card named in
# $OUT/gpu.txt, `el` printing seconds since the start, and
# run_fixed_tests TEST... (run_gpu_tests.sh per test, 60 s each, logs under
# $OUT/logs, stopping once 170 s have gone), `left` (seconds of $LIMIT
# left, default 560) and `bench TAG FLAGS...` (one train_bench run with
# $BENCH_DEFAULTS before FLAGS, appended to $OUT/train_bench.jsonl, stderr
# to train_bench.err, at most $BENCH_TIMEOUT seconds (default 60); skipped
# once under 35 s are left).
set -u
T0=$(date +%s)
el() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
B=/tmp/b/gpu_bundle
[[ -d $B ]] || { mkdir -p /tmp/b && tar xJf gpu_pack/bundle.tar.xz -C /tmp/b; }
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt

run_fixed_tests() {
  local logs=$OUT/logs
  mkdir -p "$logs"
  for test in "$@"; do
    (( $(date +%s) - T0 < 170 )) || break
    OUT=$logs timeout 60 $B/run_gpu_tests.sh "$test" >> "$logs/summary.txt" 2>&1
    el "test $test rc=$?"
  done
  grep -h "tests:" "$logs/summary.txt"
  grep -rh "FAILED\|near tie\|bf16 on" "$logs" | cut -c1-300 | head -30
}

LIMIT=${LIMIT:-560}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
BENCH_DEFAULTS=${BENCH_DEFAULTS:---batch=16 --seq=1024 --iters=4 --warmup=2 --dtype=bf16}
bench() {
  local tag=$1; shift
  (( $(left) > 35 )) || { el "skip $tag"; return; }
  timeout ${BENCH_TIMEOUT:-60} $B/bin/train_bench $BENCH_DEFAULTS "$@" \
    >> $OUT/train_bench.jsonl 2>> $OUT/train_bench.err
  el "$tag rc=$?"
}
