#!/bin/bash
# pipeline_model_test.sh PIPELINE_MODEL GPT_BENCH, on the CPU:
#   1. a written profile of the tiny GPT (2 blocks) whose blocks cost 1 ms
#      forward and 2 ms backward per sequence and everything else nothing,
#      cut into two equal stages ("0,2,5"), a link of no cost: every line's
#      step is (m + p - 1) (f + b) of one stage at the micro-batch size, its
#      bubble (p - 1) / (m + p - 1), its ZeRO-3 compute the whole batch's;
#      micro-batches past the profiled sizes are marked extrapolated; a slow
#      link makes the step longer;
#      zb_h1 with the backward split in halves (F = B = W, one unit b per
#      sequence): its step is (3m + p - 1 + max(0, p - m)) b, shorter than
#      1F1B's 3 (m + p - 1) b, its bubble the schedule's formula;
#      the output head's loss buffers (one bf16 logits chunk, the f32
#      losses, and per micro-batch awaiting its head backward the input's
#      bf16 gradient and the (V, C) f32 weight-gradient sum) are priced on
#      the last stage only, GPipe's m micro-batches' sums against 1F1B's and
#      zb_h1's one, and taken out of the blocks' slope (the profile's peak
#      includes them: 1.5e5 bytes a sequence and block remain), and a
#      --loss_chunk_rows below the rows makes the chunk that size;
#      every line's per-rank idle shares average to its bubble;
#   1b. interleaved 1F1B (a written 124M profile, 12 blocks of 1 ms forward
#      and 2 ms backward a sequence, 2 ranks x 2 stages of 3 blocks each):
#      its step is (v m + p - 1) stage units, against 1F1B's (m + p - 1)
#      units of twice the size over the same blocks ("0,7,15"), its bubble
#      the formula's (p - 1) / (v m + p - 1); each stage names its rank
#      (r, r + p); micro-batch counts not a multiple of the ranks give no
#      interleaved line; --stages_per_rank=3 over 6 stages of 2 blocks;
#   2. gpt_bench --smoke --profile=1's own lines are read (exit 0, a line per
#      configuration);
#   2b. --tied_gb_s: the tied embedding's gradient sum between the end
#      ranks (2 V C bytes at that rate) follows the schedule: step_ms is
#      schedule_ms plus it, every rank idle through it; --dtype=f32 doubles
#      it and each message; another --dtype exits 2;
#   3. bad input exits 2 with an error line: no --profile, a profile with
#      one micro-batch size, an unknown schedule.
set -u
model="$1"; bench="$2"
dir="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*"; exit 1; }

python3 - "$dir/profile.jsonl" <<'PYTHON'
import json, sys
# The tiny GPT's head at sequence 1024 (V 256, C 64, bf16): a sequence's
# logits, losses and input gradient, which the peak grows by too.
head = 1024 * 256 * 2 + 1024 * 4 + 1024 * 64 * 2
with open(sys.argv[1], "w") as f:
    for b in (1, 2, 4):
        for name, fwd, bwd in (("embed", 0, 0), ("blocks.*", 2.0 * b, 4.0 * b),
                               ("ln_f", 0, 0), ("lm_head", 0, 0)):
            f.write(json.dumps({"bench": "gpt_fwd_bwd_profile", "scope": "path",
                                "model": "tiny", "batch": b, "name": name,
                                "forward_ms": fwd, "backward_ms": bwd}) + "\n")
        f.write(json.dumps({"bench": "gpt_fwd_bwd", "model": "tiny", "batch": b,
                            "memory": {"peak_bytes_in_use": 1e6 + (3e5 + head) * b}}) + "\n")
PYTHON
common="--profile=$dir/profile.jsonl --model=tiny --ranks=2 --partition=0,2,5 --batches=4,16 --micro_batches=1,2,4"
"$model" $common --link_gb_s=1e12 --link_latency_us=1e-9 --collective_gb_s=1e12 \
  > "$dir/fast.jsonl" 2> "$dir/fast.err" || { cat "$dir/fast.err"; fail "exit $?"; }
"$model" $common --link_gb_s=0.001 > "$dir/slow.jsonl" 2> "$dir/slow.err" \
  || { cat "$dir/slow.err"; fail "slow link: exit $?"; }
"$model" $common --link_gb_s=1e12 --link_latency_us=1e-9 --collective_gb_s=1e12 \
  --schedules=zb_h1 --weight_gradient_share=0.5 > "$dir/zb.jsonl" 2> "$dir/zb.err" \
  || { cat "$dir/zb.err"; fail "zb_h1: exit $?"; }

"$model" $common --link_gb_s=1e12 --link_latency_us=1e-9 --collective_gb_s=1e12 \
  --schedules=gpipe,1f1b --loss_chunk_rows=256 > "$dir/chunk.jsonl" 2> "$dir/chunk.err" \
  || { cat "$dir/chunk.err"; fail "loss_chunk_rows: exit $?"; }
"$model" $common --link_gb_s=1e12 --link_latency_us=1e-9 --collective_gb_s=1e12 \
  --tied_gb_s=0.001 > "$dir/tied.jsonl" 2> "$dir/tied.err" \
  || { cat "$dir/tied.err"; fail "tied_gb_s: exit $?"; }
"$model" $common --link_gb_s=1e12 --link_latency_us=1e-9 --collective_gb_s=1e12 \
  --tied_gb_s=0.001 --dtype=f32 > "$dir/tied_f32.jsonl" 2> "$dir/tied_f32.err" \
  || { cat "$dir/tied_f32.err"; fail "dtype f32: exit $?"; }
"$model" $common --link_gb_s=0.001 --dtype=f32 > "$dir/slow_f32.jsonl" \
  2> "$dir/slow_f32.err" || { cat "$dir/slow_f32.err"; fail "slow f32: exit $?"; }
"$model" $common --dtype=f16 > "$dir/bad_dtype.jsonl" 2>/dev/null
[[ $? -eq 2 ]] || fail "--dtype=f16 must exit 2"
grep -q "dtype" "$dir/bad_dtype.jsonl" || fail "error line: $(cat "$dir/bad_dtype.jsonl")"

"$bench" --smoke --models=tiny,tiny --batch=1,2 --profile=1 --profile_iters=1 \
  > "$dir/smoke.jsonl" 2> "$dir/smoke.err" || { cat "$dir/smoke.err"; fail "gpt_bench exit $?"; }
"$model" --profile="$dir/smoke.jsonl" --model=tiny --ranks=2,3 --batches=4 \
  --micro_batches=1,2,4 > "$dir/real.jsonl" 2> "$dir/real.err" \
  || { cat "$dir/real.err"; fail "on gpt_bench's lines: exit $?"; }

"$model" > "$dir/none.jsonl" 2>/dev/null
[[ $? -eq 2 ]] || fail "no --profile must exit 2"
grep -q "profile=PATH is required" "$dir/none.jsonl" || fail "error line: $(cat "$dir/none.jsonl")"
python3 - "$dir/profile124.jsonl" <<'PYTHON'
import json, sys
with open(sys.argv[1], "w") as f:
    for b in (1, 2, 4):
        for name, fwd, bwd in (("embed", 0, 0), ("blocks.*", 12.0 * b, 24.0 * b),
                               ("ln_f", 0, 0), ("lm_head", 0, 0)):
            f.write(json.dumps({"bench": "gpt_fwd_bwd_profile", "scope": "path",
                                "model": "124M", "batch": b, "name": name,
                                "forward_ms": fwd, "backward_ms": bwd}) + "\n")
PYTHON
free="--link_gb_s=1e12 --link_latency_us=1e-9 --collective_gb_s=1e12 --optimizer_params_per_s=1e18"
"$model" --profile="$dir/profile124.jsonl" --model=124M --ranks=2 --batches=8 \
  --micro_batches=1,2,4,8 --schedules=interleaved_1f1b --partition=0,4,7,10,15 \
  $free > "$dir/inter.jsonl" 2> "$dir/inter.err" \
  || { cat "$dir/inter.err"; fail "interleaved: exit $?"; }
"$model" --profile="$dir/profile124.jsonl" --model=124M --ranks=2 --batches=8 \
  --micro_batches=1,2,4,8 --schedules=1f1b --partition=0,7,15 \
  $free > "$dir/inter_base.jsonl" 2> "$dir/inter_base.err" \
  || { cat "$dir/inter_base.err"; fail "1f1b beside interleaved: exit $?"; }
"$model" --profile="$dir/profile124.jsonl" --model=124M --ranks=2 --batches=8 \
  --micro_batches=2,4 --schedules=interleaved_1f1b --stages_per_rank=3 \
  --partition=0,3,5,7,9,11,15 $free > "$dir/inter3.jsonl" 2> "$dir/inter3.err" \
  || { cat "$dir/inter3.err"; fail "interleaved v=3: exit $?"; }

head -4 "$dir/profile.jsonl" > "$dir/one.jsonl"
echo '{"bench":"gpt_fwd_bwd","model":"tiny","batch":1}' >> "$dir/one.jsonl"
"$model" --profile="$dir/one.jsonl" --model=tiny > "$dir/one_out.jsonl" 2>/dev/null
[[ $? -eq 2 ]] || fail "one micro-batch size must exit 2"
grep -q "two or more" "$dir/one_out.jsonl" || fail "error line: $(cat "$dir/one_out.jsonl")"
"$model" --profile="$dir/profile.jsonl" --model=tiny --schedules=zigzag > "$dir/bad.jsonl" 2>/dev/null
[[ $? -eq 2 ]] || fail "an unknown schedule must exit 2"

python3 - "$dir" <<'PYTHON' || exit 1
import json, sys
d = sys.argv[1]
def lines(name):
    return [json.loads(l) for l in open(f"{d}/{name}")]
fast, slow, real = lines("fast.jsonl"), lines("slow.jsonl"), lines("real.jsonl")
zb = lines("zb.jsonl")
assert len(zb) == 2 * 3, len(zb)  # batches x micro-batches
for x in zb:
    p, m, b = x["ranks"], x["micro_batches"], x["micro_batch"]
    want = (3 * m + p - 1 + max(0, p - m)) * b
    assert abs(x["step_ms"] - want) < 1e-3 * want + 1e-3, (x["step_ms"], want, x)
    assert abs(x["bubble"] - x["bubble_equal_stages"]) < 1e-4, x
    assert x["step_ms"] < 3 * (m + p - 1) * b, x
    assert abs(x["stages"][0]["weight_gradient_ms"] - b) < 1e-3, x["stages"]
assert len(fast) == 2 * 2 * 3, len(fast)  # schedules x batches x micro-batches
for x in fast:
    p, m, b = x["ranks"], x["micro_batches"], x["micro_batch"]
    # One stage: one block, 1 ms forward and 2 ms backward a sequence.
    stage = 3.0 * b
    want = (m + p - 1) * stage
    assert abs(x["step_ms"] - want) < 1e-3 * want + 1e-3, (x["step_ms"], want, x)
    assert abs(x["bubble"] - (p - 1) / (m + p - 1)) < 1e-4, x
    assert x["extrapolated"] == (b > 4), x
    assert [s["layers"] for s in x["stages"]] == [[0, 2], [2, 5]], x["stages"]
    assert abs(x["one_gpu_step_ms"] - m * 2 * stage) < 1e-3 * want + 1e-3, x
    z = x["zero3_same_gpus"]
    assert z["sequences_per_gpu"] == x["batch"] // 2, z
    assert abs(z["compute_ms"] - x["batch"] // 2 * 6.0) < 1e-2, z
    # Activations: 3e5 bytes a sequence over 2 blocks.
    assert abs(x["assumptions"]["activation_bytes_per_sequence_and_block"] - 1.5e5) < 1, x
# The head's loss buffers: on the last stage only; GPipe keeps a (V, C) f32
# sum per micro-batch in flight (m), 1F1B and zb_h1 one.
V, C, T = 256, 64, 1024
def head_bytes(x, chunk_rows=None):
    rows = int(x["micro_batch"] * T)
    chunk = rows if chunk_rows is None else min(rows, chunk_rows)
    held = x["micro_batches"] if x["schedule"] == "gpipe" else 1
    return chunk * V * 2 + rows * 4 + held * (rows * C * 2 + V * C * 4)
chunked = lines("chunk.jsonl")
assert len(chunked) == len(fast), len(chunked)
for lines_, chunk_rows in ((fast, None), (zb, None), (chunked, 256)):
    for x in lines_:
        stages = x["stages"]
        assert all(s["loss_buffers_bytes"] == 0 for s in stages[:-1]), stages
        want = head_bytes(x, chunk_rows)
        assert abs(stages[-1]["loss_buffers_bytes"] - want) < 1, (want, x)
        # In the stage's memory, beside its activations.
        assert stages[-1]["memory_gib"] * 2**30 > want + stages[-1]["activations_gib"] * 2**30, x
for f, s in zip(fast, slow):
    assert (f["schedule"], f["batch"], f["micro_batches"]) == (s["schedule"], s["batch"], s["micro_batches"])
    assert s["step_ms"] > f["step_ms"] and s["message_ms"] > 1, (f, s)
for x in fast + slow + zb + real:
    shares = [r["bubble"] for r in x["per_rank"]]
    assert len(shares) == x["ranks"], x["per_rank"]
    assert abs(sum(shares) / len(shares) - x["bubble"]) < 1e-9, x
inter, base, inter3 = lines("inter.jsonl"), lines("inter_base.jsonl"), lines("inter3.jsonl")
# m = 1 is not a multiple of 2 ranks: no interleaved line.
assert [x["micro_batches"] for x in inter] == [2, 4, 8], inter
assert [x["micro_batches"] for x in base] == [1, 2, 4, 8], base
for x in inter:
    p, v, m, b = x["ranks"], x["stages_per_rank"], x["micro_batches"], x["micro_batch"]
    assert (p, v) == (2, 2), x
    unit = 9.0 * b  # a stage's 3 blocks: 3 b forward + 6 b backward
    want = (v * m + p - 1) * unit
    assert abs(x["step_ms"] - want) < 1e-6 * want, (x["step_ms"], want)
    assert abs(x["bubble"] - (p - 1) / (v * m + p - 1)) < 1e-9, x
    assert abs(x["bubble_equal_stages"] - x["bubble"]) < 1e-9, x
    assert [s["rank"] for s in x["stages"]] == [0, 1, 0, 1], x["stages"]
    assert [s["layers"] for s in x["stages"]] == [[0, 4], [4, 7], [7, 10], [10, 15]], x["stages"]
    assert abs(x["one_gpu_step_ms"] - m * 4 * unit) < 1e-6 * want, x
    (one,) = [y for y in base if y["micro_batches"] == m]
    assert abs(one["step_ms"] - (m + p - 1) * 2 * unit) < 1e-6 * want, one
    assert x["step_ms"] < one["step_ms"], (x["step_ms"], one["step_ms"])
    for r in x["per_rank"]:
        assert abs(r["busy_ms"] - v * m * unit) < 1e-6 * want, r
assert [x["micro_batches"] for x in inter3] == [2, 4], inter3
for x in inter3:
    p, v, m, b = x["ranks"], x["stages_per_rank"], x["micro_batches"], x["micro_batch"]
    assert v == 3 and len(x["stages"]) == 6, x
    want = (v * m + p - 1) * 6.0 * b  # 2 blocks a stage
    assert abs(x["step_ms"] - want) < 1e-6 * want, (x["step_ms"], want)
# The tied embedding's sum (V x C bf16 at 1 MB/s) after the schedule, every
# rank idle through it.
tied = lines("tied.jsonl")
assert len(tied) == len(fast), tied
for x in tied:
    want = 2 * 256 * 64 / 1e6 * 1e3
    assert abs(x["tied_reduce_ms"] - want) < 1e-9, x
    assert abs(x["step_ms"] - (x["schedule_ms"] + want)) < 1e-9, x
    for r in x["per_rank"]:
        assert abs(r["busy_ms"] + r["idle_ms"] - x["step_ms"]) < 1e-9, (r, x)
    shares = [r["bubble"] for r in x["per_rank"]]
    assert abs(sum(shares) / len(shares) - x["bubble"]) < 1e-9, x
    assert x["bubble"] > x["schedule_bubble"], x
# f32 training: the tied gradient (and each message) twice the bytes.
for x, y in zip(tied, lines("tied_f32.jsonl")):
    assert abs(y["tied_reduce_ms"] - 2 * x["tied_reduce_ms"]) < 1e-9, (x, y)
for x, y in zip(slow, lines("slow_f32.jsonl")):
    assert abs(y["message_ms"] - 2 * x["message_ms"]) < 1e-3 * y["message_ms"], (x, y)
assert len(real) == 2 * 2 * 3, len(real)  # ranks x schedules x micro-batches
for x in real:
    assert x["step_ms"] > 0 and 0 <= x["bubble"] < 1, x
print("pipeline_model_test: ok")
PYTHON
