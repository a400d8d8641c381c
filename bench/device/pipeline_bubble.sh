#!/bin/bash
# Issue 29: the pipeline's bubble counted in idle time, against the step
# model, on ONE GPU (carry gpu_pack; about 200 s):
#   1. gpt_bench --profile=1 of the 350M GPT at micro-batches 1, 2 and 4:
#      the module times bench/pipeline_model prices stages with;
#   2. train_bench with 2, 3 and 4 ranks sharing the GPU over MPI
#      (ZE_ALLOW_GPU_SHARING=1, --backend=mpi: NCCL refuses point-to-point),
#      8 micro-batches of 4 x 1024 tokens, schedules gpipe, 1f1b and zb_h1,
#      and interleaved_1f1b (2 stages per rank) at 2 ranks; each line's
#      "pipeline"."ranks" has every rank's busy_ms (its compute actions,
#      each until its kernels finished), idle_ms (the rest of its step:
#      blocked on messages, waiting for the slowest rank), wait_ms and
#      bubble = idle / wall, beside predicted_bubble (the schedule's own,
#      forward 1 and backward 2 units);
#   3. bench/pipeline_model on that profile for the same layouts
#      (--partition=parameters as train_bench; messages at --link_gb_s=10,
#      the host-staged copies of the mpi backend; the tied embedding's
#      gradient sum at --tied_gb_s, the bus bandwidth comm_bench measures
#      for that bf16 all-reduce between 2 ranks sharing the GPU);
#   4. bench/pipeline_bubble_summary.py: per schedule, ranks and rank, the
#      measured busy, idle and bubble beside both predictions.
#
# What is comparable. The bubble is a property of the schedule: the idle
# units of each rank when every rank has a GPU of its own. Ranks sharing
# one GPU contend for it: while one rank waits, another's kernels run
# faster, and while two compute, each one's kernels take longer (busy_ms
# includes the time the GPU spent on the other ranks' work). So on one GPU
#   - the step cannot be shorter than the ranks' compute one after
#     another: the summary prints the model's sum of the ranks' busy time
#     (a one-GPU floor) beside its step on separate GPUs and the measured
#     wall;
#   - a measured per-rank bubble is not the separate-GPU bubble; what does
#     carry over is the ordering (zb_h1 and interleaved below 1f1b and
#     gpipe), which ranks wait most (1F1B's first ranks in the cool-down,
#     the last in the warm-up), and that the busy + idle split adds up.
# Memory per stage is comparable (each rank has its own allocator): the
# lines' peak_mib per rank beside pipeline_model's per-rank memory_gib.
source bench/device/setup.sh
MODEL=${MODEL:-350M}
MB=${MB:-4}           # sequences per micro-batch
M=${M:-8}             # micro-batches per step
RUN_TIMEOUT=${RUN_TIMEOUT:-45}
mkdir -p $OUT

timeout 60 $B/bin/gpt_bench --models=$MODEL,$MODEL,$MODEL --batch=1,2,4 \
  --seq=1024 --iters=3 --warmup=2 --profile=1 --profile_iters=3 \
  > $OUT/profile.jsonl 2> $OUT/profile.err
el "gpt_bench profile rc=$?"

pipe() {  # pipe RANKS SCHEDULE [STAGES_PER_RANK]
  (( $(left) > RUN_TIMEOUT + 15 )) || { el "skip $*"; return; }
  timeout $RUN_TIMEOUT mpirun --allow-run-as-root -np $1 \
    -x ZE_ALLOW_GPU_SHARING=1 -x LD_LIBRARY_PATH \
    $B/bin/train_bench --models=$MODEL --stages=0 --batch=$MB --seq=1024 \
    --accumulation=$M --iters=3 --warmup=2 --dtype=bf16 --backend=mpi \
    --pipeline_stages=$1 --pipeline_schedule=$2 \
    --pipeline_stages_per_rank=${3:-1} \
    >> $OUT/pipeline.jsonl 2>> $OUT/pipeline.err
  el "pipeline $* rc=$?"
}
pipe 2 1f1b
pipe 2 zb_h1
pipe 2 interleaved_1f1b 2
pipe 2 gpipe
pipe 4 1f1b
pipe 4 zb_h1
pipe 3 1f1b
pipe 4 gpipe
pipe 3 zb_h1
pipe 3 gpipe

# The tied embedding's gradient sum between the end ranks: a bf16 all-reduce
# of the (V, C) table over 2 ranks sharing the GPU (host-staged on mpi), its
# bus bandwidth the model's --tied_gb_s.
TIED_BYTES=${TIED_BYTES:-$(( 50304 * 1024 * 2 ))}  # 350M: padded V x C
timeout 60 mpirun --allow-run-as-root -np 2 -x ZE_ALLOW_GPU_SHARING=1 \
  -x LD_LIBRARY_PATH $B/bin/comm_bench --backend=mpi --device=cuda \
  --dtype=bf16 --min_bytes=$TIED_BYTES --max_bytes=$TIED_BYTES --iters=1 \
  --warmup=2 --collectives=all_reduce > $OUT/tied_comm.jsonl 2> $OUT/tied_comm.err
el "tied all-reduce rc=$?"
TIED_GB_S=$(python3 -c "
import json, sys
v = [json.loads(l)['busbw_GBps'] for l in open('$OUT/tied_comm.jsonl') if '\"in_place\":true' in l]
print(v[0] if v and v[0] > 0 else 10)" 2>/dev/null || echo 10)
el "tied all-reduce: $TIED_GB_S GB/s bus bandwidth"

batch=$(( MB * M ))
common="--profile=$OUT/profile.jsonl --model=$MODEL --batches=$batch
  --micro_batches=$M --link_gb_s=10 --gpu_gib=80 --tied_gb_s=$TIED_GB_S"
$B/bin/pipeline_model $common --ranks=2,3,4 --schedules=gpipe,1f1b,zb_h1 \
  > $OUT/model.jsonl 2> $OUT/model.err
el "pipeline_model rc=$?"
$B/bin/pipeline_model $common --ranks=2 --schedules=interleaved_1f1b \
  --stages_per_rank=2 >> $OUT/model.jsonl 2>> $OUT/model.err
el "pipeline_model interleaved rc=$?"
grep -h "error" $OUT/profile.jsonl $OUT/model.jsonl | cut -c1-300
grep -h "^\[\|Error\|error" $OUT/pipeline.err | grep -v "^train_bench: pipeline rank" \
  | sort | uniq -c | sort -rn | head -5 | cut -c1-300
python3 bench/pipeline_bubble_summary.py $OUT/pipeline.jsonl $OUT/model.jsonl \
  | tee $OUT/summary.txt
