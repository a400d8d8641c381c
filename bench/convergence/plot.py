#!/usr/bin/env python3
"""Plots issue 28's convergence runs, one or several seeds per moment format
(bench/device/dec07_final.sh and dec07b_call1.sh: one seed;
bench/device/convergence_seeds.sh: several).

  python3 bench/convergence/plot.py LOG_DIR OUT.png

LOG_DIR holds one train_gpt log per run, named FORMAT[_seedN].log, with an
optional conv_ prefix: FORMAT is f32, bf16_rne, bf16_sr or int8, N the
run's --seed (no suffix: seed 1). Run 69's f32_seed2.log is f32 at seed 2.

Prints one JSON line per run (its final validation loss), then one per
format: the final validation losses' mean, sample standard deviation, min
and max over its seeds, the mean minus f32's mean, and the paired
difference (the same seed has the same initialisation and data order, so
FORMAT at seed N minus f32 at seed N): its mean, min and max. Draws the
training loss (the engine's log line every steps_per_print steps) and the
validation loss ("eval at step N: validation loss X"): each format's mean
over its seeds, with the min-max band of the seeds.
"""
import json
import os
import re
import statistics
import sys

FORMATS = [("f32", "f32 moments"),
           ("bf16_sr", "bf16 moments, stochastic rounding"),
           ("bf16_rne", "bf16 moments, to nearest"),
           ("int8", "8-bit block-wise moments")]
NAME = re.compile(r"^(?:conv_)?(f32|bf16_rne|bf16_sr|int8)(?:_seed(\d+))?\.log$")


def read(path):
    train, val = [], []
    with open(path, errors="replace") as f:
        for line in f:
            m = re.search(r"step (\d+) loss ([0-9.]+) lr", line)
            if m:
                train.append((int(m.group(1)), float(m.group(2))))
            m = re.match(r"eval at step (\d+): validation loss ([0-9.]+)", line)
            if m:
                val.append((int(m.group(1)), float(m.group(2))))
    return train, val


def spread(values):
    return {"n": len(values),
            "mean": round(statistics.fmean(values), 4),
            "std": round(statistics.stdev(values), 4) if len(values) > 1
            else None,
            "min": round(min(values), 4), "max": round(max(values), 4)}


def mean_curve(curves):
    """Per step present in every curve: (step, mean, min, max)."""
    steps = sorted(set.intersection(*(set(s for s, _ in c) for c in curves)))
    out = []
    for step in steps:
        values = [dict(c)[step] for c in curves]
        out.append((step, statistics.fmean(values), min(values), max(values)))
    return out


def main():
    log_dir, out = sys.argv[1], sys.argv[2]
    runs = {}  # format -> {seed: (train, val)}
    for name in sorted(os.listdir(log_dir)):
        m = NAME.match(name)
        if m:
            seed = int(m.group(2) or 1)
            runs.setdefault(m.group(1), {})[seed] = read(
                os.path.join(log_dir, name))
    finals = {fmt: {seed: val[-1][1] for seed, (_, val) in seeds.items()
                    if val and val[-1][0] == max(s for s, _ in val)}
              for fmt, seeds in runs.items()}
    if not finals.get("f32"):
        sys.exit("plot.py: no f32 validation losses in " + log_dir)
    for fmt, _ in FORMATS:
        for seed, (_, val) in sorted(runs.get(fmt, {}).items()):
            final = val[-1] if val else (None, None)
            print(json.dumps({"run": fmt, "seed": seed, "steps": final[0],
                              "final_validation_loss": final[1]}))
    f32 = finals["f32"]
    f32_mean = statistics.fmean(f32.values())
    for fmt, _ in FORMATS:
        values = finals.get(fmt)
        if not values:
            continue
        line = {"format": fmt, "final_validation_loss": spread(
            list(values.values()))}
        line["mean_minus_f32_mean"] = round(
            statistics.fmean(values.values()) - f32_mean, 4)
        paired = [values[s] - f32[s] for s in sorted(values) if s in f32]
        if fmt != "f32" and paired:
            line["paired_minus_f32"] = spread(paired)
        print(json.dumps(line))

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for (fmt, label), color in zip(FORMATS, ["k", "C0", "C1", "C2"]):
        if fmt not in runs:
            continue
        seeds = runs[fmt]
        label = "%s (%d seed%s)" % (label, len(seeds),
                                     "" if len(seeds) == 1 else "s")
        for ax, part in ((axes[0], 0), (axes[1], 1)):
            curves = [c[part] for c in seeds.values() if c[part]]
            if not curves:
                continue
            curve = mean_curve(curves)
            if not curve:
                continue
            steps, mean, low, high = zip(*curve)
            ax.plot(steps, mean, label=label, lw=1, color=color,
                    marker="." if part else None)
            if len(curves) > 1:
                ax.fill_between(steps, low, high, color=color, alpha=0.15)
    axes[0].set_title("training loss (mean of seeds; band: min-max)")
    axes[1].set_title("validation loss (last tenth of the corpus)")
    for ax in axes:
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy (nats per byte)")
        ax.legend()
        ax.grid(alpha=0.3)
    tail = [v for seeds in runs.values() for _, val in seeds.values()
            for _, v in val[len(val) // 2:]]
    if tail:
        axes[1].set_ylim(min(tail) - 0.05, min(tail) + 0.6)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
