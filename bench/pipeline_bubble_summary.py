#!/usr/bin/env python3
"""Measured pipeline bubble against the step model's (issue 29).

pipeline_bubble_summary.py TRAIN_BENCH_JSONL PIPELINE_MODEL_JSONL

Reads train_bench's pipeline lines (each with "pipeline"."ranks": per rank
busy_ms, idle_ms, wait_ms, wall_ms, bubble, predicted_bubble, peak_mib) and
bench/pipeline_model's lines for the same model, schedules and ranks (its
"per_rank": busy_ms, bubble and memory_gib with the measured module times,
one GPU per rank), and prints, per (schedule, ranks), one row per rank:

  measured busy / idle / wait (ms per step; tied_ms, part of the wait: the
  tied embedding's gradient sum between the end ranks), bubble (idle /
  wall)
  the schedule's bubble for the rank (forward 1, backward 2 units)
  the model's bubble and busy time for the rank (separate GPUs)
  the measured peak memory against the model's

then the step: the measured wall (mean over ranks), the model's step on
separate GPUs and the model's one-GPU floor (the ranks' busy time summed:
ranks sharing one GPU cannot finish sooner). Lines with an error are
listed as such. Exit status 0 unless an input cannot be read.
"""
import json
import sys


def read(path):
    lines = []
    with open(path) as f:
        for text in f:
            text = text.strip()
            if text.startswith("{"):
                lines.append(json.loads(text))
    return lines


def key(schedule, ranks, per_rank):
    return (schedule, int(ranks), int(per_rank))


def main(argv):
    if len(argv) != 3:
        print(__doc__)
        return 2
    runs = read(argv[1])
    models = {}
    for line in read(argv[2]):
        if "error" in line or "per_rank" not in line:
            continue
        models[key(line["schedule"], line["ranks"],
                   line.get("stages_per_rank", 1))] = line
    for run in runs:
        if "error" in run:
            print("train_bench error:", run.get("model"), run["error"][:200])
            continue
        p = run.get("pipeline")
        if not p or "ranks" not in p:
            continue
        k = key(p["schedule"], p["stages"], p.get("stages_per_rank", 1))
        model = models.get(k)
        print(f"\n{run['model']} {p['schedule']} over {p['stages']} ranks"
              f" x {p.get('stages_per_rank', 1)} stage(s), "
              f"{run['accumulation']} micro-batches of {run['batch']}: "
              f"measured bubble {p['measured_bubble']:.3f}, the schedule's "
              f"{p['predicted_bubble']:.3f}"
              + (f", the model's {model['bubble']:.3f}" if model else
                 ", no model line"))
        print("  rank   busy_ms   idle_ms   wait_ms   tied_ms  bubble  schedule"
              "  model  model_busy_ms  peak_GiB  model_GiB")
        for r in p["ranks"]:
            m = model["per_rank"][r["rank"]] if model else None
            print(f"  {r['rank']:4d} {r['busy_ms']:9.1f} {r['idle_ms']:9.1f}"
                  f" {r['wait_ms']:9.1f} {r.get('tied_sum_ms', 0):9.1f}"
                  f"  {r['bubble']:6.3f}"
                  f"  {r['predicted_bubble']:8.3f}"
                  + (f"  {m['bubble']:5.3f}  {m['busy_ms']:13.1f}"
                     f"  {r['peak_mib'] / 1024:8.2f}  {m['memory_gib']:9.2f}"
                     if m else f"  {'-':>5}  {'-':>13}"
                     f"  {r['peak_mib'] / 1024:8.2f}  {'-':>9}"))
        walls = [r["wall_ms"] for r in p["ranks"]]
        wall = sum(walls) / len(walls)
        text = f"  step: measured wall {wall:.1f} ms (train_bench step_ms " \
               f"{run['step_ms']:.1f} with the optimizer)"
        if model:
            floor = sum(x["busy_ms"] for x in model["per_rank"])
            text += (f"; model {model['step_ms']:.1f} ms on separate GPUs "
                     f"(the tied sum {model.get('tied_reduce_ms', 0):.1f} ms "
                     f"of it), {floor:.1f} ms of compute for one GPU")
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
