#!/bin/bash
# train_bench_pipeline_test.sh TRAIN_BENCH RUN_MPI, on the CPU (tiny GPT,
# f32, 4 micro-batches, 2 timed steps after 1 warm-up):
#   1. a 2-stage pipeline under mpirun -np 2 (--pipeline_stages=2, 1F1B)
#      ends with the same loss, bit for bit, as the single-rank run, at ZeRO
#      stages 0 and 3, and its line names the stages' layers;
#   2. 2 stages x 2 replicas (-np 4, GPipe): data_parallel 2, tokens/s
#      counted over the 4 GPUs' worth of ranks (4 x per GPU);
#   every pipeline line lists each rank's memory peak and the micro-batches
#   whose activations it held at once (1F1B: 2 - rank; GPipe: all 4);
#   3. bad pipeline flags exit 2 before any configuration runs, naming the
#      flag: a stage count that does not divide the world, an unknown
#      schedule.
set -u
bench="$1"; run_mpi="$2"
dir="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*"; exit 1; }
common=(--smoke --dtype=f32 --accumulation=4 --iters=2 --warmup=1)

"$bench" "${common[@]}" --stages=0,3 > "$dir/one.jsonl" 2> "$dir/one.err" \
  || { tail "$dir/one.err"; fail "single rank exited $?"; }
"$run_mpi" 2 "$bench" "${common[@]}" --stages=0,3 --pipeline_stages=2 \
  > "$dir/pipe2.jsonl" 2> "$dir/pipe2.err" \
  || { tail "$dir/pipe2.err"; fail "2 stages exited $?"; }
"$run_mpi" 4 "$bench" "${common[@]}" --stages=1 --pipeline_stages=2 \
  --pipeline_schedule=gpipe > "$dir/pipe22.jsonl" 2> "$dir/pipe22.err" \
  || { tail "$dir/pipe22.err"; fail "2 stages x 2 replicas exited $?"; }
"$run_mpi" 2 "$bench" "${common[@]}" --stages=0 --pipeline_stages=3 \
  > "$dir/bad.jsonl" 2> "$dir/bad.err"
status=$?
[[ $status -eq 2 ]] || fail "3 stages over 2 ranks must exit 2, got $status"
grep -q "pipeline_stages" "$dir/bad.jsonl" "$dir/bad.err" \
  || fail "the error must name --pipeline_stages: $(cat "$dir/bad.jsonl")"
"$run_mpi" 2 "$bench" "${common[@]}" --stages=0 --pipeline_stages=2 \
  --pipeline_schedule=zigzag > "$dir/bad2.jsonl" 2> "$dir/bad2.err"
status=$?
[[ $status -eq 2 ]] || fail "an unknown schedule must exit 2, got $status"
grep -q "zigzag" "$dir/bad2.jsonl" "$dir/bad2.err" \
  || fail "the error must name the schedule: $(cat "$dir/bad2.jsonl")"
"$run_mpi" 2 "$bench" "${common[@]}" --stages=0 --pipeline_stages=2 \
  --pipeline_schedule=interleaved_1f1b > "$dir/bad3.jsonl" 2> "$dir/bad3.err"
status=$?
[[ $status -eq 2 ]] || fail "interleaved_1f1b (one stage per rank here) must exit 2, got $status"
grep -q "interleaved_1f1b: train_bench builds one stage per rank" \
  "$dir/bad3.jsonl" "$dir/bad3.err" \
  || fail "the refusal must name the schedule: $(cat "$dir/bad3.jsonl")"

python3 - "$dir" <<'PYTHON' || exit 1
import json, math, sys
d = sys.argv[1]
def lines(name):
    return [json.loads(l) for l in open(f"{d}/{name}")]
one, pipe2, pipe22 = lines("one.jsonl"), lines("pipe2.jsonl"), lines("pipe22.jsonl")
assert [x["stage"] for x in one] == [0, 3] and [x["stage"] for x in pipe2] == [0, 3], (one, pipe2)
for a, b in zip(one, pipe2):
    assert "error" not in a and "error" not in b, (a, b)
    assert "pipeline" not in a, a
    assert a["loss"] == b["loss"], ("pipeline loss differs", a["stage"], a["loss"], b["loss"])
    p = b["pipeline"]
    assert p["stages"] == 2 and p["data_parallel"] == 1 and p["schedule"] == "1f1b", p
    assert p["stage_layers"][0][0] == 0 and p["stage_layers"][0][1] == p["stage_layers"][1][0], p
    assert b["ds_config"]["pipeline"]["stages"] == 2, b["ds_config"]
    assert b["ds_config"]["train_batch_size"] == b["batch"] * 4, b["ds_config"]
    # Every rank's figures: 1F1B over 2 ranks holds at most 2 - r
    # micro-batches' activations on rank r, and reaches the bound with 4.
    ranks = p["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1], ranks
    assert [r["activation_bound"] for r in ranks] == [2, 1], ranks
    assert [r["peak_saved_micro_batches"] for r in ranks] == [2, 1], ranks
(x,) = pipe22
assert "error" not in x, x
assert x["pipeline"]["data_parallel"] == 2 and x["pipeline"]["schedule"] == "gpipe", x["pipeline"]
# GPipe stashes all 4 micro-batches on every rank.
assert [r["peak_saved_micro_batches"] for r in x["pipeline"]["ranks"]] == [4] * 4, x["pipeline"]
assert x["ds_config"]["train_batch_size"] == x["batch"] * 2 * 4, x["ds_config"]
assert abs(x["tokens_per_s"] - 4 * x["tokens_per_s_per_gpu"]) < 1e-6 * x["tokens_per_s"], x
assert math.isfinite(x["loss"]), x
print("train_bench_pipeline_test: ok")
PYTHON
