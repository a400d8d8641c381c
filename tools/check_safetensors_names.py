#!/usr/bin/env python3
"""Checks that a safetensors file holds exactly the expected names and shapes.

  check_safetensors_names.py FILE SHAPES_JSON [--require-package]

SHAPES_JSON: a JSON object {name: [dims]} (test_checkpoint_tool shapes).
The header is parsed with the standard library always; when the
`safetensors` package (the reference implementation) is installed, the file
is also loaded with `safetensors.numpy.load_file` (BF16 files, which numpy
cannot hold, with `safetensors.safe_open`) and must give the same names and
shapes. --require-package makes its absence a failure (the
manual interop test). Exit 0 ok, 1 mismatch.
"""
import json
import struct
import sys


def main():
    path, shapes_path = sys.argv[1], sys.argv[2]
    require_package = "--require-package" in sys.argv[3:]
    with open(shapes_path) as handle:
        expected = {name: list(shape) for name, shape in json.load(handle).items()}
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    header.pop("__metadata__", None)
    found = {name: info["shape"] for name, info in header.items()}
    if found != expected:
        print(f"FAIL: {path} header holds {found}, expected {expected}")
        return 1
    try:
        from safetensors import safe_open
        from safetensors.numpy import load_file
    except ImportError:
        if require_package:
            print("FAIL: the safetensors package is not installed")
            return 1
        print(f"{path}: {len(found)} names and shapes ok (stdlib parse only)")
        return 0
    # numpy has no bfloat16: a BF16 file is opened lazily (names, shapes and
    # dtypes from the reference reader, without making arrays).
    if any(info["dtype"] == "BF16" for info in header.values()):
        with safe_open(path, framework="numpy") as handle:
            loaded = {name: list(handle.get_slice(name).get_shape())
                      for name in handle.keys()}
        reader = "safetensors.safe_open"
    else:
        loaded = {name: list(array.shape)
                  for name, array in load_file(path).items()}
        reader = "safetensors.numpy.load_file"
    if loaded != expected:
        print(f"FAIL: {reader} gave {loaded}")
        return 1
    print(f"{path}: {len(found)} names and shapes ok ({reader} too)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
