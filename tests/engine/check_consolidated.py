#!/usr/bin/env python3
"""Checks a consolidated safetensors file against gathered parameters.

  check_consolidated.py FILE RESULT [--dtype=F32|BF16] [--hf]

FILE: what `ze_checkpoint consolidate` wrote. RESULT: a checkpoint_main
result file ("param NAME v0 v1 ..." lines: the engine's gathered f32 master
weights). Parses the safetensors format with the standard library only (so
CI needs no packages): the header, every tensor's dtype, shape and offsets,
and the values, which must equal the gathered ones (exactly in F32, to
bf16 rounding in BF16). With --hf the names are Hugging Face GPT-2's and
only the name set and shapes are checked. When the `safetensors` package is
installed, the file is also loaded with `safetensors.numpy.load_file` (the
reference implementation) and must give the same names and shapes.
Exit 0 ok, 1 mismatch.
"""
import json
import math
import struct
import sys


def parse(path):
    with open(path, "rb") as handle:
        blob = handle.read()
    (length,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + length])
    data = blob[8 + length:]
    metadata = header.pop("__metadata__", {})
    return header, data, metadata


def values(entry, data):
    begin, end = entry["data_offsets"]
    raw = data[begin:end]
    if entry["dtype"] == "F32":
        return struct.unpack(f"<{len(raw) // 4}f", raw)
    if entry["dtype"] == "BF16":
        halves = struct.unpack(f"<{len(raw) // 2}H", raw)
        return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in halves]
    raise ValueError(f"unexpected dtype {entry['dtype']}")


def main(argv):
    path, result = argv[1], argv[2]
    dtype = "F32"
    hf = False
    for arg in argv[3:]:
        if arg.startswith("--dtype="):
            dtype = arg.split("=", 1)[1]
        elif arg == "--hf":
            hf = True
    header, data, metadata = parse(path)
    expected = {}
    with open(result) as handle:
        for line in handle:
            words = line.split()
            if words and words[0] == "param":
                expected[words[1]] = [float(v) for v in words[2:]]
    problems = []
    if metadata.get("format") != "pt":
        problems.append(f"metadata format is {metadata.get('format')!r}, not 'pt'")
    if hf:
        if "transformer.h.0.attn.c_attn.weight" not in header:
            problems.append("no transformer.h.0.attn.c_attn.weight")
        total = sum(math.prod(e["shape"]) for e in header.values())
        if total != sum(len(v) for v in expected.values()):
            problems.append(f"hf file has {total} elements, the model "
                            f"{sum(len(v) for v in expected.values())}")
    else:
        if set(header) != set(expected):
            problems.append(f"names differ: {sorted(set(header) ^ set(expected))}")
        for name, want in expected.items():
            entry = header.get(name)
            if entry is None:
                continue
            if entry["dtype"] != dtype:
                problems.append(f"{name}: dtype {entry['dtype']}, expected {dtype}")
                continue
            got = values(entry, data)
            if len(got) != len(want) or math.prod(entry["shape"]) != len(want):
                problems.append(f"{name}: {len(got)} values, expected {len(want)}")
                continue
            # The result file prints 9 significant digits (exact for f32);
            # bf16 keeps 8 bits of mantissa.
            tolerance = 1e-7 if dtype == "F32" else 2 ** -8
            worst = max((abs(g - w) / max(abs(w), 1e-30) if w != 0 else abs(g)
                         for g, w in zip(got, want)), default=0.0)
            if worst > tolerance:
                problems.append(f"{name}: relative difference {worst:.3g}")
    try:
        from safetensors.numpy import load_file  # the reference reader
        loaded = load_file(path) if dtype == "F32" else None
        if loaded is not None and set(loaded) != set(header):
            problems.append("safetensors.numpy sees other names")
        print("checked with the safetensors package too"
              if loaded is not None else "safetensors package: bf16 not loadable by numpy")
    except ImportError:
        print("safetensors package not installed: checked with the standard library only")
    if problems:
        print("\n".join(problems))
        return 1
    print(f"ok: {path} ({len(header)} tensors, {dtype}{', hf' if hf else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
