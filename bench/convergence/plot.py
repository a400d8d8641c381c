#!/usr/bin/env python3
"""Plots issue 28's convergence runs (bench/device/dec07_final.sh, and
dec07b_call1.sh with a second f32 seed and a 512-window validation set).

  python3 bench/convergence/plot.py LOG_DIR OUT.png

LOG_DIR holds one train_gpt log per moment format (f32.log, bf16_rne.log,
bf16_sr.log, int8.log; f32_seed2.log, the f32 run from another seed, shows
how far two runs of one format land apart). Draws the training loss (the engine's log line,
every steps_per_print steps) and the validation loss (train_gpt's "eval at
step N: validation loss X") against the step, and prints one JSON line per
run: its final validation loss and the difference from the f32 run's.
"""
import json
import os
import re
import sys

RUNS = [("f32", "f32 moments"), ("f32_seed2", "f32 moments, seed 2"),
        ("bf16_rne", "bf16 moments, to nearest"),
        ("bf16_sr", "bf16 moments, stochastic rounding"),
        ("int8", "8-bit block-wise moments")]


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


def main():
    log_dir, out = sys.argv[1], sys.argv[2]
    curves = {}
    for name, _ in RUNS:
        path = os.path.join(log_dir, name + ".log")
        if os.path.exists(path):
            curves[name] = read(path)
    if "f32" not in curves or not curves["f32"][1]:
        sys.exit("plot.py: no f32 validation losses in " + log_dir)
    reference = curves["f32"][1][-1][1]
    for name, (train, val) in curves.items():
        final = val[-1] if val else (None, None)
        print(json.dumps({"run": name, "steps": final[0],
                          "final_validation_loss": final[1],
                          "minus_f32": None if final[1] is None else
                          round(final[1] - reference, 4)}))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, label in RUNS:
        if name not in curves:
            continue
        train, val = curves[name]
        axes[0].plot(*zip(*train), label=label, lw=1)
        if val:
            axes[1].plot(*zip(*val), label=label, lw=1, marker=".")
    axes[0].set_title("training loss (every 100 steps)")
    axes[1].set_title("validation loss (last tenth of the corpus)")
    for ax in axes:
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy (nats per byte)")
        ax.legend()
        ax.grid(alpha=0.3)
    lo = min(v for _, (_, val) in curves.items() for _, v in val[len(val)//2:])
    axes[1].set_ylim(lo - 0.05, lo + 0.6)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
