#!/usr/bin/env python3
"""Tests of torch_comm_reference.py that need no torch: arguments, launcher
variables, the sweep, and the known-value arithmetic it runs on int64
tensors (here on a stand-in with torch's int64 semantics)."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_comm_reference as ref  # pylint: disable=wrong-import-position

MASK64 = (1 << 64) - 1


def wrap64(value):
    """A Python int as the int64 two's complement torch would hold."""
    value &= MASK64
    return value - (1 << 64) if value >> 63 else value


class Ints:
    """A 1-D int64 array with torch's semantics for the operators used:
    multiplication wraps modulo 2^64, >> is arithmetic, % takes the sign of
    the divisor, & and ^ act on two's complement, < gives 0/1."""

    def __init__(self, values):
        self.values = [wrap64(v) for v in values]

    def _map(self, other, op):
        if isinstance(other, Ints):
            return Ints(op(a, b) for a, b in zip(self.values, other.values))
        return Ints(op(a, other) for a in self.values)

    def __mul__(self, other):
        return self._map(other, lambda a, b: a * b)

    __rmul__ = __mul__

    def __add__(self, other):
        return self._map(other, lambda a, b: a + b)

    __radd__ = __add__

    def __rshift__(self, other):
        return self._map(other, lambda a, b: a >> b)

    def __and__(self, other):
        return self._map(other, lambda a, b: a & b)

    def __xor__(self, other):
        return self._map(other, lambda a, b: a ^ b)

    def __mod__(self, other):
        return self._map(other, lambda a, b: a % b)

    def __floordiv__(self, other):
        return self._map(other, lambda a, b: a // b)

    def __lt__(self, other):
        return self._map(other, lambda a, b: int(a < b))


def index_of(first, n):
    return Ints(range(first, first + n))


def scramble_reference(index):
    """collective_check.cc's Scramble in exact uint64 arithmetic."""
    x = (index * ref.SCRAMBLE_MULTIPLIER) & MASK64
    return x ^ (x >> 31)


class ArgumentsTest(unittest.TestCase):

    def test_defaults_are_comm_benchs(self):
        args = ref.parse_args([])
        self.assertEqual((args.backend, args.device, args.dtype),
                         ("auto", "auto", "f32"))
        self.assertEqual((args.min_bytes, args.max_bytes, args.factor),
                         (8, 1 << 30, 2))
        self.assertEqual((args.iters, args.warmup, args.check), (20, 5, 1))
        self.assertEqual(args.collectives, list(ref.COLLECTIVES))
        self.assertFalse(args.plan)

    def test_reads_comm_bench_style_flags(self):
        args = ref.parse_args([
            "--backend=gloo", "--device=cpu", "--dtype=bf16",
            "--min_bytes=64", "--max_bytes=4096", "--factor=4", "--iters=3",
            "--warmup=0", "--check=0", "--collectives=all_gather,broadcast",
            "--plan", "--world_size=3"
        ])
        self.assertEqual(args.backend, "gloo")
        self.assertEqual(args.dtype, "bf16")
        self.assertEqual((args.min_bytes, args.max_bytes, args.factor),
                         (64, 4096, 4))
        self.assertEqual((args.iters, args.warmup, args.check), (3, 0, 0))
        self.assertEqual(args.collectives, ["all_gather", "broadcast"])
        self.assertEqual(args.world_size, 3)
        # A factor below 2 would never end (comm_bench clamps it the same).
        self.assertEqual(ref.parse_args(["--factor=1"]).factor, 2)

    def test_rejects_what_comm_bench_rejects(self):
        for bad in (["--collectives=alltoall"], ["--dtype=f64"],
                    ["--backend=mpi"], ["--min_bytes=16", "--max_bytes=8"],
                    ["--min_bytes=0"], ["--format=table"], ["--check=2"]):
            with self.assertRaises(SystemExit, msg=str(bad)), \
                    open(os.devnull, "w") as devnull:
                stderr, sys.stderr = sys.stderr, devnull
                try:
                    ref.parse_args(bad)
                finally:
                    sys.stderr = stderr


class LaunchEnvTest(unittest.TestCase):

    def test_launchers(self):
        self.assertEqual(ref.launch_env({}), (0, 1, 0, "none"))
        self.assertEqual(
            ref.launch_env({"RANK": "3", "WORLD_SIZE": "4",
                            "LOCAL_RANK": "1"}), (3, 4, 1, "torchrun"))
        self.assertEqual(
            ref.launch_env({"OMPI_COMM_WORLD_RANK": "2",
                            "OMPI_COMM_WORLD_SIZE": "3",
                            "OMPI_COMM_WORLD_LOCAL_RANK": "2"}),
            (2, 3, 2, "Open MPI"))
        self.assertEqual(
            ref.launch_env({"PMI_RANK": "5", "PMI_SIZE": "8",
                            "MPI_LOCALRANKID": "1"}), (5, 8, 1, "Hydra"))
        # torchrun first: under mpirun + torchrun the inner launcher counts.
        self.assertEqual(
            ref.launch_env({"RANK": "1", "WORLD_SIZE": "2",
                            "OMPI_COMM_WORLD_RANK": "0",
                            "OMPI_COMM_WORLD_SIZE": "1"})[3], "torchrun")

    def test_inconsistent_variables_are_errors(self):
        with self.assertRaisesRegex(ValueError, "OMPI_COMM_WORLD_RANK"):
            ref.launch_env({"OMPI_COMM_WORLD_SIZE": "2"})
        with self.assertRaisesRegex(ValueError, "RANK=4 is not below"):
            ref.launch_env({"RANK": "4", "WORLD_SIZE": "4"})


class SweepTest(unittest.TestCase):

    def test_whole_elements_per_rank_as_comm_bench(self):
        args = ref.parse_args(["--dtype=bf16", "--max_bytes=64",
                               "--collectives=all_gather,all_reduce"])
        plan = ref.sweep(args, 3)
        # comm_bench at 3 ranks, bf16: 8 B -> 4 elements -> 3 -> 6 B, ...
        self.assertEqual([p[2] for p in plan if p[0] == "all_gather"],
                         [6, 6, 12, 12, 30, 30, 60, 60])
        self.assertEqual([p[3] for p in plan if p[0] == "all_gather"],
                         [False, True] * 4)
        # torch has no out-of-place all_reduce.
        self.assertEqual([p[3] for p in plan if p[0] == "all_reduce"],
                         [True] * 4)
        self.assertEqual(ref.bus_factor("all_reduce", 4), 1.5)
        self.assertEqual(ref.bus_factor("reduce_scatter", 4), 0.75)


class KnownValuesTest(unittest.TestCase):

    def test_int64_arithmetic_matches_uint64(self):
        indices = list(range(0, 2000)) + [
            10**9, 2**31 - 1, 2**31, 2**33 + 7, 2**40 + 12345
        ]
        for modulus in (5, 251):
            got = ref.scramble_mod(Ints(indices), modulus).values
            want = [scramble_reference(i) % modulus for i in indices]
            self.assertEqual(got, want, modulus)

    def test_values_match_collective_check(self):
        # bench/collective_check_test.cc holds the same numbers.
        self.assertEqual(
            ref.known_values("all_reduce", 3, index_of(0, 12)).values,
            [1, 3, 2, 3, 4, 1, 3, 1, 3, 1, 2, 2])
        self.assertEqual(
            ref.known_values("broadcast", 1, index_of(0, 12)).values,
            [2, 239, 152, 126, 52, 68, 187, 99, 103, 199, 135, 165])

    def test_expected_is_the_collective_of_the_inputs(self):
        for world_size in (1, 2, 3, 5):
            count = 7 * world_size
            m = count // world_size
            inputs = [
                {c: ref.input_values(c, r, world_size, count, index_of).values
                 for c in ref.COLLECTIVES} for r in range(world_size)
            ]
            for rank in range(world_size):
                simulated = {
                    "all_reduce": [sum(inputs[r]["all_reduce"][i]
                                       for r in range(world_size))
                                   for i in range(count)],
                    "reduce_scatter": [
                        sum(inputs[r]["reduce_scatter"][rank * m + i]
                            for r in range(world_size)) for i in range(m)
                    ],
                    "all_gather": [v for r in range(world_size)
                                   for v in inputs[r]["all_gather"]],
                    "broadcast": inputs[0]["broadcast"],
                }
                for collective in ref.COLLECTIVES:
                    expected = ref.expected_values(collective, rank,
                                                   world_size, count,
                                                   index_of).values
                    self.assertEqual(expected, simulated[collective],
                                     (collective, rank, world_size))
                    self.assertLessEqual(max(expected), 255)


if __name__ == "__main__":
    unittest.main()
