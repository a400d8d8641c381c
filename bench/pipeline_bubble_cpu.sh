#!/bin/bash
# Issue 29's bubble counted in idle time against bench/pipeline_model, on
# CPU cores: each rank computes on cores of its own (OMP_NUM_THREADS per
# rank, mpirun --bind-to core), so unlike ranks sharing one GPU
# (bench/device/pipeline_bubble.sh) a rank's idle time is the schedule's
# and the stages' imbalance, not another rank's compute. Needs RANKS x
# THREADS cores; builds nothing (run `bazel build //bench/...` first).
#   bash bench/pipeline_bubble_cpu.sh [OUT_DIR]   (default /tmp/pipeline_bubble_cpu)
# Steps: gpt_bench --profile=1 of MODEL on the CPU at micro-batches 1 and 2
# (the module times the model prices stages with, at THREADS threads);
# comm_bench's f32 all-reduce of the tied (V, C) table between 2 ranks (the
# model's --tied_gb_s); train_bench pipelines of RANKS ranks, M
# micro-batches of 1 x SEQ tokens, f32, schedules 1f1b, gpipe, zb_h1 and
# interleaved_1f1b (2 stages per rank); pipeline_model for the same
# layouts (--dtype=f32, the optimizer left out as train_bench's boundary
# is); bench/pipeline_bubble_summary.py.
set -u
out=${1:-/tmp/pipeline_bubble_cpu}
MODEL=${MODEL:-124M} SEQ=${SEQ:-64} M=${M:-8} RANKS=${RANKS:-2} THREADS=${THREADS:-1}
BIN=${BIN:-bazel-bin/bench}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$out" && rm -f "$out"/*.jsonl
OMP_NUM_THREADS=$THREADS "$BIN/gpt_bench" --device=cpu --models=$MODEL,$MODEL \
  --batch=1,2 --seq=$SEQ --dtype=f32 --iters=2 --warmup=1 --profile=1 \
  --profile_iters=2 > "$out/profile.jsonl" 2> "$out/profile.err" || exit 1
# The tied table: V x C f32 (124M: 50257 x 768).
tied_bytes=$(python3 -c "
import json
print(4 * 50257 * {'124M': 768, '350M': 1024}['$MODEL'])")
mpirun -np 2 --bind-to core "$BIN/comm_bench" --backend=mpi --device=cpu \
  --dtype=f32 --min_bytes=$tied_bytes --max_bytes=$tied_bytes --iters=1 \
  --warmup=2 --collectives=all_reduce > "$out/tied.jsonl" 2> "$out/tied.err"
tied_gb_s=$(python3 -c "
import json
v = [json.loads(l)['busbw_GBps'] for l in open('$out/tied.jsonl') if '\"in_place\":true' in l]
print(v[0] if v and v[0] > 0 else 1)")
for s in 1f1b gpipe zb_h1 "interleaved_1f1b 2"; do
  set -- $s
  mpirun -np $RANKS --bind-to core --map-by core:PE=$THREADS \
    -x OMP_NUM_THREADS=$THREADS "$BIN/train_bench" --device=cpu \
    --models=$MODEL --stages=0 --batch=1 --seq=$SEQ --accumulation=$M \
    --iters=2 --warmup=1 --dtype=f32 --backend=mpi --pipeline_stages=$RANKS \
    --pipeline_schedule=$1 --pipeline_stages_per_rank=${2:-1} \
    >> "$out/pipeline.jsonl" 2>> "$out/pipeline.err"
  echo "pipeline $s: rc=$?"
done
common="--profile=$out/profile.jsonl --model=$MODEL --seq=$SEQ --batches=$M
  --micro_batches=$M --ranks=$RANKS --dtype=f32 --link_gb_s=2
  --tied_gb_s=$tied_gb_s --optimizer_params_per_s=1e18 --gpu_gib=1000"
"$BIN/pipeline_model" $common --schedules=1f1b,gpipe,zb_h1 > "$out/model.jsonl"
"$BIN/pipeline_model" $common --schedules=interleaved_1f1b --stages_per_rank=2 \
  >> "$out/model.jsonl"
echo "tied all-reduce: $tied_gb_s GB/s bus bandwidth"
python3 bench/pipeline_bubble_summary.py "$out/pipeline.jsonl" "$out/model.jsonl"
