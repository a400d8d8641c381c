#!/usr/bin/env python3
"""Interop check against the reference implementation's Python bindings.

  interop_check.py check PATH   verifies the file `interop_tool write` made
  interop_check.py write PATH   writes the file `interop_tool check` verifies

Needs the `safetensors` and `numpy` packages. Exits 0 on success, 1 with a
message on a mismatch, 3 when the packages are missing.
"""
import sys

try:
    import numpy as np
    import safetensors
    from safetensors.numpy import save_file
except ImportError as error:
    print(f"interop_check.py: needs `pip install safetensors numpy` ({error})",
          file=sys.stderr)
    sys.exit(3)


def bf16_to_f32(raw: bytes) -> np.ndarray:
    """numpy has no bfloat16: widen the bit patterns by hand."""
    bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
    return bits.view(np.float32)


def check(path: str) -> None:
    with open(path, "rb") as handle:
        blob = handle.read()
    # The reference parser validates the whole file and gives raw bytes for
    # every tensor, bf16 included.
    parsed = dict(safetensors.deserialize(blob))
    assert set(parsed) == {"f32", "bf16", "f16", "i32", "scalar", "empty"}, parsed.keys()
    bf16 = parsed["bf16"]
    assert bf16["dtype"] in ("BF16", "bfloat16"), bf16["dtype"]
    assert list(bf16["shape"]) == [4]
    got = bf16_to_f32(bytes(bf16["data"]))
    # 3e38 rounds to the nearest bf16, 0x7f62.
    want = np.array([1.5, -2.0, 0.0078125, bf16_to_f32(b"\x62\x7f")[0]],
                    dtype=np.float32)
    assert np.array_equal(got, want), (got, want)

    # numpy-typed tensors through the usual lazy loader (load_file would
    # fail on the bf16 tensor numpy cannot represent).
    with safetensors.safe_open(path, framework="numpy") as handle:
        others = {name: handle.get_tensor(name)
                  for name in handle.keys() if name != "bf16"}
    assert np.array_equal(others["f32"],
                          np.array([[-1, -0.5, 0], [0.5, 1, 1.5]], np.float32))
    assert others["f16"].dtype == np.float16
    assert np.array_equal(others["f16"],
                          np.array([[0.5, -1.25], [65504, 0]], np.float16))
    assert others["i32"].dtype == np.int32
    assert np.array_equal(others["i32"], np.array([-3, 0, 50256], np.int32))
    assert others["scalar"].shape == () and others["scalar"] == np.float32(7.25)
    assert others["empty"].shape == (0, 4)

    with safetensors.safe_open(path, framework="numpy") as handle:
        assert handle.metadata() == {"format": "pt", "writer": "zero-engine"}, \
            handle.metadata()


def write(path: str) -> None:
    tensors = {
        "f32": (np.arange(12, dtype=np.float32) / 4).reshape(3, 4),
        "f16": np.array([0.5, -1.25, 65504], np.float16),
        "i32": np.array([-3, 0, 7], np.int32),
        "f64": np.array([1.0 / 3.0], np.float64),
        "i64": np.array([-(1 << 40), 5], np.int64),
        "u8": np.array([0, 255], np.uint8),
        "mask": np.array([True, False, True]),
        "scalar": np.array(2.5, np.float32),
        "empty": np.zeros((0, 3), np.float32),
        "ones_after_empty": np.ones((1,), np.float32),
    }
    save_file(tensors, path, metadata={"source": "python"})


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[1] not in ("check", "write"):
        print(__doc__, file=sys.stderr)
        return 2
    mode, path = sys.argv[1], sys.argv[2]
    try:
        check(path) if mode == "check" else write(path)
    except AssertionError as error:
        print(f"interop_check.py {mode} {path}: mismatch: {error!r}",
              file=sys.stderr)
        return 1
    print(f"interop_check.py {mode} {path}: ok (safetensors "
          f"{safetensors.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
