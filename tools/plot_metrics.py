#!/usr/bin/env python3
"""Turns csv_monitor's files into PNG plots of the training curves.

  plot_metrics.py CSV_DIR [--out=DIR]

CSV_DIR is csv_monitor's <output_path>/<job_name> (files such as
Train_Samples_train_loss.csv, one "step,value" row per optimizer step, the
step being the global sample count as in DeepSpeed). Writes loss.png (loss,
and the learning rate on a second axis), throughput.png (tokens/s) and
memory.png (allocated and peak bytes, GiB) when their files exist, into
--out (default: CSV_DIR). Needs matplotlib (pip install matplotlib); the
engine never needs it.
"""
import argparse
import csv
import os
import sys


def read(directory, name):
    path = os.path.join(directory, f"Train_Samples_{name}.csv")
    if not os.path.exists(path):
        return None
    steps, values = [], []
    with open(path) as handle:
        for row in csv.reader(handle):
            if not row or row[0] == "step":
                continue
            steps.append(int(float(row[0])))
            values.append(float(row[1]))
    return steps, values


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("--out")
    args = parser.parse_args()
    out = args.out or args.directory
    os.makedirs(out, exist_ok=True)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_metrics.py: needs matplotlib (pip install matplotlib)",
              file=sys.stderr)
        return 3
    written = []
    loss = read(args.directory, "train_loss")
    if loss:
        figure, axis = plt.subplots(figsize=(7, 4))
        axis.plot(*loss, color="tab:blue", label="train loss")
        axis.set_xlabel("samples")
        axis.set_ylabel("loss", color="tab:blue")
        lr = read(args.directory, "lr")
        if lr:
            second = axis.twinx()
            second.plot(*lr, color="tab:orange", alpha=0.6, label="learning rate")
            second.set_ylabel("learning rate", color="tab:orange")
        axis.set_title("training loss")
        axis.grid(alpha=0.3)
        figure.tight_layout()
        figure.savefig(os.path.join(out, "loss.png"), dpi=100)
        written.append("loss.png")
    throughput = read(args.directory, "tokens_per_second")
    if throughput:
        figure, axis = plt.subplots(figsize=(7, 4))
        axis.plot(*throughput, color="tab:green")
        axis.set_xlabel("samples")
        axis.set_ylabel("tokens/s (all ranks)")
        axis.set_title("throughput")
        axis.grid(alpha=0.3)
        figure.tight_layout()
        figure.savefig(os.path.join(out, "throughput.png"), dpi=100)
        written.append("throughput.png")
    allocated = read(args.directory, "memory_allocated_bytes")
    peak = read(args.directory, "memory_peak_bytes")
    if allocated and peak:
        figure, axis = plt.subplots(figsize=(7, 4))
        gib = 1024.0 ** 3
        axis.plot(allocated[0], [v / gib for v in allocated[1]], label="allocated")
        axis.plot(peak[0], [v / gib for v in peak[1]], label="peak")
        axis.set_xlabel("samples")
        axis.set_ylabel("GiB (model device)")
        axis.set_title("memory")
        axis.legend()
        axis.grid(alpha=0.3)
        figure.tight_layout()
        figure.savefig(os.path.join(out, "memory.png"), dpi=100)
        written.append("memory.png")
    if not written:
        print(f"plot_metrics.py: no csv_monitor files in {args.directory}",
              file=sys.stderr)
        return 1
    print("wrote " + ", ".join(os.path.join(out, name) for name in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
