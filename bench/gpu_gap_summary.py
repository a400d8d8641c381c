#!/usr/bin/env python3
"""Where a training step's GPU sits idle, from an nsys cuda_gpu_trace CSV.

Usage: gpu_gap_summary.py TRACE.csv (from `nsys stats -r cuda_gpu_trace -f csv`).

Steps are delimited by the optimizer's kernels (names containing
"OptimizerKernel"): each step ends with a group of them. For every step after
the first it prints one JSON line: the step's span (end of the previous
group's last optimizer kernel to the end of its own), the time some kernel or
copy ran (union of intervals), the idle rest, and the 8 longest idle gaps
with the work on either side, so a gap can be traced to the host code that
launched the work after it.
"""
import csv
import json
import sys


def rows_of(path):
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            start = row.get("Start (ns)") or row.get("Start")
            dur = row.get("Duration (ns)") or row.get("Duration")
            name = row.get("Name") or ""
            if start is None or dur is None:
                continue
            yield float(start), float(start) + float(dur), name


def main():
    rows = sorted(rows_of(sys.argv[1]))
    if not rows:
        sys.exit("no rows in " + sys.argv[1])
    opt_ends = [end for start, end, name in rows if "OptimizerKernel" in name]
    groups = []
    for end in opt_ends:
        if groups and end - groups[-1] < 10e6:
            groups[-1] = end
        else:
            groups.append(end)
    for i in range(1, len(groups)):
        lo, hi = groups[i - 1], groups[i]
        inside = [r for r in rows if r[0] >= lo and r[1] <= hi]
        busy, cursor, gaps = 0.0, lo, []
        prev_name = "(previous step's optimizer)"
        for start, end, name in inside:
            if start > cursor:
                gaps.append((start - cursor, prev_name, name))
            if end > cursor:
                busy += end - max(start, cursor)
                cursor = end
                prev_name = name
        gaps.sort(reverse=True)
        print(json.dumps({
            "step": i,
            "span_ms": round((hi - lo) / 1e6, 3),
            "busy_ms": round(busy / 1e6, 3),
            "idle_ms": round((hi - lo - busy) / 1e6, 3),
            "rows": len(inside),
            "gaps_over_50us": sum(1 for g in gaps if g[0] > 5e4),
            "idle_in_gaps_over_50us_ms":
                round(sum(g[0] for g in gaps if g[0] > 5e4) / 1e6, 3),
            "longest_gaps": [{"ms": round(g / 1e6, 3), "after": a[:80],
                              "before": b[:80]} for g, a, b in gaps[:8]],
        }))


if __name__ == "__main__":
    main()
