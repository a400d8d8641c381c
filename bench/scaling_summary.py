#!/usr/bin/env python3
"""Markdown tables from tools/multi_gpu_bench.sh's JSONL files (issue 15).

  python3 bench/scaling_summary.py RESULTS... [--no_targets]

RESULTS are .jsonl files or folders holding them (searched two levels
down). Lines that are not JSON objects are skipped. Per model it prints:

- throughput: tokens/s per GPU for each engine configuration (zero-engine
  stages 1-3, FSDP2 zero2/zero3, DeepSpeed stages) by world size, with the
  scaling efficiency against the same configuration's 1-GPU figure
  (per-GPU tokens/s at W over per-GPU tokens/s at 1). Where 1 GPU has no
  figure (6.7B at micro-batch 16 does not fit one GPU) the baseline is the
  smallest world size that has one, and the table says so. A failed case
  shows OOM, timeout, skipped or error; the messages follow the table;
- zero-engine against its peers at each world size (ratio of tokens/s);
- stage 3's all-gather wait, train_bench's stage3.wait_fraction (target < 5%);
- peak GPU memory per rank;

then, for the comm phase, the bus bandwidth at 1 GiB of bench/comm_bench
against bench/torch_comm_reference.py per collective and world size; the
gpu tests' results; and every command's wall time against the estimate it
was started with (to correct tools/multi_gpu_bench.sh's table). A
configuration measured more than once shows the median of its successful
runs; a success hides failures of the same cell. Only the standard library.
"""

import argparse
import glob
import json
import os
import statistics
import sys

GIB = 1 << 30
ENGINE_NAMES = {"ours": "zero-engine", "fsdp2": "FSDP2", "deepspeed": "DeepSpeed", "torch": "PyTorch"}
TARGETS = {  # (engine, config) -> (minimum efficiency at the largest world size, text)
    ("ours", "stage 2"): (0.95, ">= 95%"),
    ("ours", "stage 3"): (0.90, ">= 90%"),
}
WAIT_TARGET = 0.05


def read_rows(paths):
    """Every JSON object line of the files (and the .jsonl files in folders)."""
    files = []
    for p in paths:
        if os.path.isdir(p):
            found = sorted(glob.glob(os.path.join(p, "*.jsonl")) + glob.glob(os.path.join(p, "*", "*.jsonl")))
            files.extend(found)
        else:
            files.append(p)
    rows = []
    for f in files:
        with open(f, errors="replace") as fh:
            for line in fh:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row, dict):
                    row.setdefault("_file", f)
                    rows.append(row)
    return rows


# ------------------------------------------------------------------ training


def is_train(row):
    return row.get("kind") in (None, "result") and "model" in row and (
        row.get("bench") == "train_step" or row.get("engine") in ("ours", "fsdp2", "deepspeed"))


def engine_of(row):
    return row.get("engine") or "ours"  # train_bench's own lines carry no engine


def config_of(row):
    """-> (engine, config label) e.g. ("ours", "stage 2"), ("fsdp2", "zero3")."""
    engine = engine_of(row)
    if engine == "fsdp2":
        return engine, str(row.get("mode", "?"))
    return engine, f"stage {row.get('stage', '?')}"


def failure_word(row):
    err = str(row.get("error", ""))
    low = err.lower()
    if row.get("skipped") or low.startswith("skipped"):
        return "skipped"
    code = str(row.get("error_code", "")).upper()  # train_bench's absl status code
    if code == "RESOURCE_EXHAUSTED" or any(k in low for k in (
            "out of memory", "outofmemory", "memoryerror", "resource_exhausted", "resourceexhausted",
            "cudaerrormemoryallocation", "memory exhausted")):
        return "OOM"
    if "timeout" in low or "timed out" in low:
        return "timeout"
    return "error"


def order_key(key):
    engine, config = key
    return (list(ENGINE_NAMES).index(engine) if engine in ENGINE_NAMES else 9, config)


class Cell:
    """Everything measured for one (model, engine, config, world size)."""

    def __init__(self):
        self.ok = []  # successful rows
        self.failed = []  # rows with an error

    def add(self, row):
        (self.failed if row.get("error") else self.ok).append(row)

    def median(self, field):
        vals = [r[field] for r in self.ok if isinstance(r.get(field), (int, float))]
        return statistics.median(vals) if vals else None

    def median_path(self, *path):
        vals = []
        for r in self.ok:
            v = r
            for p in path:
                v = v.get(p) if isinstance(v, dict) else None
            if isinstance(v, (int, float)):
                vals.append(v)
        return statistics.median(vals) if vals else None

    def word(self):
        return failure_word(self.failed[-1]) if self.failed else ""


def collect_train(rows):
    """-> {model: {(engine, config): {world: Cell}}}"""
    table = {}
    for row in rows:
        if not is_train(row) or row.get("dry_run"):
            continue
        w = row.get("world_size")
        if not isinstance(w, int):
            continue
        cell = table.setdefault(row["model"], {}).setdefault(config_of(row), {}).setdefault(w, Cell())
        cell.add(row)
    return table


def baseline(cells):
    """-> (world size, per-GPU tokens/s) of the smallest world size with a figure."""
    for w in sorted(cells):
        v = cells[w].median("tokens_per_s_per_gpu")
        if v:
            return w, v
    return None, None


def fmt_int(v):
    return f"{v:,.0f}"


def model_sort_key(name):
    try:
        return float(name.rstrip("BMK")) * {"B": 1e9, "M": 1e6, "K": 1e3}.get(name[-1:], 1)
    except ValueError:
        return float("inf")


def train_tables(table, out, targets):
    for model in sorted(table, key=model_sort_key):
        configs = table[model]
        worlds = sorted({w for cells in configs.values() for w in cells})
        out.append(f"## GPT {model}: tokens/s per GPU (scaling efficiency)\n")
        out.append("| engine | config | " + " | ".join(f"{w} GPU{'s' if w > 1 else ''}" for w in worlds)
                   + " | baseline |")
        out.append("| --- | --- | " + " | ".join("---" for _ in worlds) + " | --- |")
        notes = []
        for key in sorted(configs, key=order_key):
            cells = configs[key]
            base_w, base_v = baseline(cells)
            line = [ENGINE_NAMES.get(key[0], key[0]), key[1]]
            for w in worlds:
                cell = cells.get(w)
                if cell is None:
                    line.append("")
                    continue
                v = cell.median("tokens_per_s_per_gpu")
                if v is None:
                    line.append(cell.word())
                    row = cell.failed[-1]
                    notes.append(f"- {ENGINE_NAMES.get(key[0], key[0])} {key[1]}, {w} GPU(s): "
                                 f"{str(row.get('error', ''))[:160]}")
                    continue
                text = fmt_int(v)
                if base_v and w != base_w:
                    text += f" ({v / base_v:.1%})"
                line.append(text)
            line.append("" if base_w is None else f"{base_w} GPU{'s' if base_w > 1 else ''}")
            out.append("| " + " | ".join(line) + " |")
        out.append("")
        out.append("Efficiency = tokens/s per GPU at W / the same at the baseline world size.")
        if targets:
            for (engine, config), (minimum, text) in TARGETS.items():
                cells = configs.get((engine, config))
                if not cells:
                    continue
                base_w, base_v = baseline(cells)
                top = max(w for w in cells)
                v = cells[top].median("tokens_per_s_per_gpu")
                if v is None or base_v is None or top == base_w:
                    continue
                eff = v / base_v
                out.append(f"Target, {ENGINE_NAMES[engine]} {config} at {top} GPUs vs {base_w}: {eff:.1%} "
                           f"(target {text}: {'met' if eff >= minimum else 'not met'}).")
        if notes:
            out.append("")
            out.append("Failed cases:")
            out.extend(notes)
        out.append("")
        peer_table(model, configs, worlds, out)
        wait_table(model, configs, worlds, out, targets)
        memory_table(model, configs, worlds, out)


def peer_table(model, configs, worlds, out):
    pairs = [(("ours", "stage 2"), ("fsdp2", "zero2")), (("ours", "stage 2"), ("deepspeed", "stage 2")),
             (("ours", "stage 3"), ("fsdp2", "zero3")), (("ours", "stage 3"), ("deepspeed", "stage 3"))]
    lines = []
    for ours, peer in pairs:
        if ours not in configs or peer not in configs:
            continue
        cells = []
        for w in worlds:
            a, b = configs[ours].get(w), configs[peer].get(w)
            va = a.median("tokens_per_s_per_gpu") if a else None
            vb = b.median("tokens_per_s_per_gpu") if b else None
            cells.append(f"{va / vb:.2f}x" if va and vb else "")
        if any(cells):
            lines.append(f"| {ours[1]} / {ENGINE_NAMES[peer[0]]} {peer[1]} | " + " | ".join(cells) + " |")
    if lines:
        out.append(f"### GPT {model}: zero-engine / peer, tokens/s per GPU\n")
        out.append("| ratio | " + " | ".join(f"{w}" for w in worlds) + " |")
        out.append("| --- | " + " | ".join("---" for _ in worlds) + " |")
        out.extend(lines)
        out.append("")


def wait_table(model, configs, worlds, out, targets):
    cells = configs.get(("ours", "stage 3"))
    if not cells:
        return
    row, row_ms = [], []
    for w in worlds:
        c = cells.get(w)
        f = c.median_path("stage3", "wait_fraction") if c else None
        ms = c.median_path("stage3", "wait_ms") if c else None
        row.append("" if f is None else f"{f:.2%}")
        row_ms.append("" if ms is None else f"{ms:.2f}")
    if not any(row):
        return
    out.append(f"### GPT {model}: zero-engine stage 3, all-gather wait per step (target < {WAIT_TARGET:.0%})\n")
    out.append("| | " + " | ".join(str(w) for w in worlds) + " |")
    out.append("| --- | " + " | ".join("---" for _ in worlds) + " |")
    out.append("| wait fraction | " + " | ".join(row) + " |")
    out.append("| wait ms/step | " + " | ".join(row_ms) + " |")
    if targets:
        worst = [c.median_path("stage3", "wait_fraction") for c in cells.values()]
        worst = [v for v in worst if v is not None]
        if worst:
            out.append("")
            out.append(f"Target: largest wait fraction {max(worst):.2%} "
                       f"({'met' if max(worst) < WAIT_TARGET else 'not met'}).")
    out.append("")


def memory_table(model, configs, worlds, out):
    lines = []
    for key in sorted(configs, key=order_key):
        cells = []
        for w in worlds:
            c = configs[key].get(w)
            v = c.median_path("memory", "peak_gib_in_use") if c else None
            cells.append("" if v is None else f"{v:.1f}")
        if any(cells):
            lines.append(f"| {ENGINE_NAMES.get(key[0], key[0])} {key[1]} | " + " | ".join(cells) + " |")
    if lines:
        out.append(f"### GPT {model}: peak GPU memory per rank, GiB\n")
        out.append("| | " + " | ".join(str(w) for w in worlds) + " |")
        out.append("| --- | " + " | ".join("---" for _ in worlds) + " |")
        out.extend(lines)
        out.append("")


# ------------------------------------------------------------------ comm


def canonical_collective(name):
    n = str(name).lower().replace("_", "").replace("-", "")
    return {"allreduce": "all_reduce", "reducescatter": "reduce_scatter", "allgather": "all_gather",
            "broadcast": "broadcast"}.get(n, str(name))


def comm_fields(row):
    """-> (engine, collective, world, bytes, busbw GB/s) or None for a non-comm line."""
    if row.get("kind") not in (None, "result") or row.get("error"):
        return None
    coll = row.get("collective", row.get("op"))
    if coll is None:
        return None
    # Both benchmarks print a line per placement; torch.distributed has only
    # an in-place all-reduce and broadcast and out-of-place gathers and
    # scatters, so each collective is compared in that placement.
    if "in_place" in row and bool(row["in_place"]) != (
            canonical_collective(coll) in ("all_reduce", "broadcast")):
        return None
    nbytes = next((row[k] for k in ("bytes", "size_bytes", "size", "nbytes") if isinstance(row.get(k), int)), None)
    world = row.get("world_size", row.get("world"))
    bus = None
    for k in ("busbw_GBps", "busbw_gbps", "busbw_GB_s", "busbw"):
        if isinstance(row.get(k), (int, float)):
            bus = float(row[k])
            break
    if nbytes is None or not isinstance(world, int) or bus is None:
        return None
    engine = row.get("engine") or ("torch" if "torch" in str(row.get("bench", "")) + str(row.get("framework", ""))
                                   else "ours")
    return engine, canonical_collective(coll), world, nbytes, bus


def comm_table(rows, out, size=GIB):
    data = {}  # (collective, world) -> engine -> {bytes: [busbw]}
    for row in rows:
        f = comm_fields(row)
        if f is None:
            continue
        engine, coll, world, nbytes, bus = f
        data.setdefault((coll, world), {}).setdefault(engine, {}).setdefault(nbytes, []).append(bus)
    if not data:
        return

    def at_size(by_bytes):
        """busbw at `size` bytes, else at the largest size below it (and that size)."""
        if size in by_bytes:
            return statistics.median(by_bytes[size]), size
        below = [b for b in by_bytes if b <= size]
        if not below:
            return None, None
        b = max(below)
        return statistics.median(by_bytes[b]), b

    out.append("## Collectives: bus bandwidth at 1 GiB, GB/s (bf16 for comm_bench)\n")
    out.append("| collective | GPUs | zero-engine (comm_bench) | PyTorch | ours / torch |")
    out.append("| --- | --- | --- | --- | --- |")
    for coll, world in sorted(data, key=lambda k: (k[0], k[1])):
        engines = data[(coll, world)]
        ours, ours_b = at_size(engines.get("ours", {}))
        torch_, torch_b = at_size(engines.get("torch", {}))

        def show(v, b):
            if v is None:
                return ""
            return f"{v:.1f}" + ("" if b == size else f" (at {b / (1 << 20):.0f} MiB)")

        ratio = f"{ours / torch_:.2f}" if ours and torch_ else ""
        out.append(f"| {coll} | {world} | {show(ours, ours_b)} | {show(torch_, torch_b)} | {ratio} |")
    out.append("")


# ------------------------------------------------------------------ tests and timings


def tests_table(rows, out):
    tests = [r for r in rows if r.get("kind") == "test"]
    if not tests:
        return
    passed = sum(1 for t in tests if t.get("result") == "PASSED")
    skipped = sum(1 for t in tests if t.get("result") == "SKIPPED")
    out.append(f"## gpu tests: {passed} passed, {len(tests) - passed - skipped} failed"
               + (f", {skipped} skipped" if skipped else "") + "\n")
    out.append("| test | result | seconds |")
    out.append("| --- | --- | --- |")
    for t in tests:
        out.append(f"| {t.get('test', t.get('cmd', '?'))} | {t.get('result', '?')} | {t.get('seconds', '')} |")
    out.append("")


def timings_table(rows, out):
    cmds = [r for r in rows if r.get("kind") == "command"]
    if not cmds:
        return
    out.append("## Commands: wall time against the estimate\n")
    out.append("| phase | command | estimate s | wall s | exit |")
    out.append("| --- | --- | --- | --- | --- |")
    for c in cmds:
        wall = "skipped" if c.get("skipped") else c.get("wall_s")
        out.append(f"| {c.get('phase', '')} | {c.get('cmd', '')} | {c.get('estimate_s', '')} | {wall} | "
                   f"{'' if c.get('skipped') else c.get('rc', '')} |")
    out.append("")


def summarize(rows, targets=True):
    out = []
    phases = [r for r in rows if r.get("kind") == "phase"]
    if phases:
        gpus = sorted({p.get("gpus") for p in phases if p.get("gpus")})
        names = sorted({n for p in phases for n in p.get("gpu_names", [])})
        out.append(f"Machine: {', '.join(str(g) for g in gpus)} GPUs ({', '.join(names) or 'unknown'}); "
                   f"phases {', '.join(sorted({str(p.get('phase')) for p in phases}))}.\n")
    train_tables(collect_train(rows), out, targets)
    comm_table(rows, out)
    tests_table(rows, out)
    timings_table(rows, out)
    if not out:
        out.append("(no results found)")
    return "\n".join(out).rstrip() + "\n"


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="+", help=".jsonl files or folders holding them")
    p.add_argument("--no_targets", action="store_true", help="leave out the target lines")
    a = p.parse_args(argv)
    for path in a.paths:
        if not os.path.exists(path):
            p.error(f"{path}: no such file or folder")
    sys.stdout.write(summarize(read_rows(a.paths), targets=not a.no_targets))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
