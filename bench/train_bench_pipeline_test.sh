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
#   every pipeline line splits each rank's step into busy and idle time
#   (busy + idle = wall, waits within idle) beside the schedule's predicted
#   bubble for the rank (1F1B and GPipe over 2 ranks and 4 micro-batches:
#   0.2 on both);
#   3. interleaved 1F1B, 2 ranks x 2 stages each (-np 2,
#      --pipeline_stages_per_rank=2): the single-rank run's loss at ZeRO 0,
#      4 stages' layers, each rank's predicted bubble 1/9;
#   4. bench/pipeline_bubble_summary.py prints a row per rank of those
#      lines, with a pipeline_model line's figures where one matches;
#   5. bad pipeline flags exit 2 before any configuration runs, naming the
#      flag: a stage count that does not divide the world, an unknown
#      schedule, interleaved_1f1b with one stage per rank, several stages
#      per rank with another schedule.
set -u
bench="$1"; run_mpi="$2"; summary="$3"
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
[[ $status -eq 2 ]] || fail "interleaved_1f1b with one stage per rank must exit 2, got $status"
grep -q "interleaved_1f1b needs --pipeline_stages_per_rank=2 or more" \
  "$dir/bad3.jsonl" "$dir/bad3.err" \
  || fail "the refusal must name the flag: $(cat "$dir/bad3.jsonl")"
"$run_mpi" 2 "$bench" "${common[@]}" --stages=0 --pipeline_stages=2 \
  --pipeline_stages_per_rank=2 > "$dir/bad4.jsonl" 2> "$dir/bad4.err"
status=$?
[[ $status -eq 2 ]] || fail "2 stages per rank under 1f1b must exit 2, got $status"
grep -q "pipeline_stages_per_rank=2: only --pipeline_schedule=interleaved_1f1b" \
  "$dir/bad4.jsonl" "$dir/bad4.err" \
  || fail "the refusal must name both flags: $(cat "$dir/bad4.jsonl")"
"$run_mpi" 2 "$bench" "${common[@]}" --stages=0 --pipeline_stages=2 \
  --pipeline_schedule=interleaved_1f1b --pipeline_stages_per_rank=2 \
  > "$dir/inter.jsonl" 2> "$dir/inter.err" \
  || { tail "$dir/inter.err"; fail "interleaved exited $?"; }
grep -q "pipeline rank 1: busy_ms" "$dir/inter.err" \
  || fail "rank 0 prints each rank's time: $(tail -3 "$dir/inter.err")"

python3 - "$dir" <<'PYTHON' || exit 1
import json, math, sys
d = sys.argv[1]
def lines(name):
    return [json.loads(l) for l in open(f"{d}/{name}")]
one, pipe2, pipe22 = lines("one.jsonl"), lines("pipe2.jsonl"), lines("pipe22.jsonl")
(inter,) = lines("inter.jsonl")
def check_times(x, predicted):
    p = x["pipeline"]
    assert p["timed_steps"] == x["iters"], p
    assert abs(p["predicted_bubble"] - predicted) < 1e-9, p
    for r in p["ranks"]:
        # f32 figures: the sums within their rounding.
        assert abs(r["busy_ms"] + r["idle_ms"] - r["wall_ms"]) <= 1e-5 * r["wall_ms"] + 1e-6, r
        assert 0 <= r["wait_ms"] <= r["idle_ms"] * (1 + 1e-5) + 1e-6, r
        # The tied GPT's table and head: every rank here holds the first or
        # the last stage, so each sums the tied gradients, inside its waits.
        assert 0 < r["tied_sum_ms"] <= r["wait_ms"] * (1 + 1e-5) + 1e-6, r
        parts = r["forward_ms"] + r["backward_ms"] + r["weight_gradient_ms"] + r["reduce_ms"]
        assert abs(r["busy_ms"] - parts) <= 1e-5 * r["busy_ms"] + 1e-4, r
        assert r["weight_gradient_ms"] == 0, r  # no zb_h1 here
        assert 0 <= r["bubble"] < 1, r
        assert abs(r["predicted_bubble"] - predicted) < 1e-6, r
    assert 0 <= p["measured_bubble"] < 1, p
assert "error" not in inter, inter
assert inter["loss"] == one[0]["loss"], ("interleaved loss differs", inter["loss"], one[0]["loss"])
ip = inter["pipeline"]
assert ip["schedule"] == "interleaved_1f1b" and ip["stages_per_rank"] == 2, ip
assert len(ip["stage_layers"]) == 4, ip
assert inter["ds_config"]["pipeline"]["stages_per_rank"] == 2, inter["ds_config"]
check_times(inter, 1 / 9)
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
    check_times(b, 0.2)
(x,) = pipe22
assert "error" not in x, x
assert x["pipeline"]["data_parallel"] == 2 and x["pipeline"]["schedule"] == "gpipe", x["pipeline"]
# GPipe stashes all 4 micro-batches on every rank.
assert [r["peak_saved_micro_batches"] for r in x["pipeline"]["ranks"]] == [4] * 4, x["pipeline"]
check_times(x, 0.2)
assert x["ds_config"]["train_batch_size"] == x["batch"] * 2 * 4, x["ds_config"]
assert abs(x["tokens_per_s"] - 4 * x["tokens_per_s_per_gpu"]) < 1e-6 * x["tokens_per_s"], x
assert math.isfinite(x["loss"]), x
print("train_bench_pipeline_test: ok")
PYTHON

# The summary the device script prints: a model line for 1F1B over 2 ranks
# (its figures made up), none for the others.
echo '{"bench":"pipeline_model","schedule":"1f1b","ranks":2,"stages_per_rank":1,"bubble":0.25,"step_ms":40,"tied_reduce_ms":5,"per_rank":[{"rank":0,"busy_ms":30,"bubble":0.25,"memory_gib":1.5},{"rank":1,"busy_ms":30,"bubble":0.25,"memory_gib":2.5}]}' \
  > "$dir/model.jsonl"
cat "$dir/pipe2.jsonl" "$dir/inter.jsonl" > "$dir/runs.jsonl"
python3 "$summary" "$dir/runs.jsonl" "$dir/model.jsonl" > "$dir/summary.txt" \
  || { cat "$dir/summary.txt"; fail "summary exited $?"; }
[[ $(grep -c "1f1b over 2 ranks x 1 stage(s)" "$dir/summary.txt") -eq 2 ]] \
  || fail "a block per 1f1b line: $(cat "$dir/summary.txt")"
grep -q "interleaved_1f1b over 2 ranks x 2 stage(s).*no model line" "$dir/summary.txt" \
  || fail "interleaved without a model line: $(cat "$dir/summary.txt")"
grep -q "model 40.0 ms on separate GPUs (the tied sum 5.0 ms of it), 60.0 ms of compute for one GPU" "$dir/summary.txt" \
  || fail "the model's step and one-GPU floor: $(cat "$dir/summary.txt")"
# busy, idle, wait, tied_ms (the tied gradients' sum), bubble, then both
# predictions.
[[ $(grep -cE "^ +[01] +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +0\.200 +0\.250" "$dir/summary.txt") -eq 4 ]] \
  || fail "a row per rank with both predictions: $(cat "$dir/summary.txt")"
echo "train_bench_pipeline_test (summary): ok"
