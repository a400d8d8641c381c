#!/usr/bin/env python3
"""Tests of bench/scaling_summary.py on synthetic JSONL, and of the parts of
the PyTorch references that need no torch (shapes, FLOPs, launcher
environment, --dry_run). Plain python3, standard library only:

  python3 bench/scaling_summary_test.py
"""

import io
import json
import os
import subprocess
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

def _bench_dir():
    """bench/ beside this file, or in Bazel's runfiles when run as a test."""
    candidates = [os.path.dirname(os.path.abspath(__file__))]
    if os.environ.get("TEST_SRCDIR"):
        candidates.append(os.path.join(os.environ["TEST_SRCDIR"], os.environ.get("TEST_WORKSPACE", ""), "bench"))
    for d in candidates:
        if os.path.exists(os.path.join(d, "scaling_summary.py")):
            return d
    return candidates[0]


HERE = _bench_dir()
sys.path.insert(0, HERE)
import scaling_summary as ss  # noqa: E402
import torch_gpt as tg  # noqa: E402


def train_row(engine, model, world, per_gpu, **extra):
    row = dict(model=model, world_size=world, tokens_per_s_per_gpu=per_gpu, tokens_per_s=per_gpu * world,
               memory=dict(peak_gib_in_use=40.0 + world))
    if engine == "ours":
        row["bench"] = "train_step"  # train_bench's own lines carry no engine; the orchestration adds it
    else:
        row["engine"] = engine
    row.update(extra)
    return row


def comm_row(engine, collective, world, nbytes, busbw):
    row = dict(collective=collective, world_size=world, bytes=nbytes, busbw_GBps=busbw)
    if engine:
        row["engine"] = engine
    return row


def write_jsonl(path, rows, junk=()):
    with open(path, "w") as f:
        for line in junk:
            f.write(line + "\n")
        for r in rows:
            f.write(json.dumps(r) + "\n")


class SummaryTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def summary(self, *paths, targets=True):
        return ss.summarize(ss.read_rows(list(paths)), targets=targets)

    def test_efficiency_against_one_gpu(self):
        rows = [
            dict(kind="phase", phase="train13", gpus=8, gpu_names=["NVIDIA H200"]),
            train_row("ours", "1.3B", 1, 60000.0, stage=2),
            train_row("ours", "1.3B", 2, 59000.0, stage=2),
            train_row("ours", "1.3B", 8, 57600.0, stage=2),  # 96.0%
            train_row("ours", "1.3B", 1, 58000.0, stage=3, stage3=dict(wait_fraction=0.001, wait_ms=0.3)),
            train_row("ours", "1.3B", 8, 51040.0, stage=3, stage3=dict(wait_fraction=0.062, wait_ms=16.0)),  # 88%
            train_row("fsdp2", "1.3B", 1, 50000.0, mode="zero2"),
            train_row("fsdp2", "1.3B", 8, 48000.0, mode="zero2"),
            train_row("deepspeed", "1.3B", 8, 40000.0, stage=3),
        ]
        path = os.path.join(self.dir, "train13.jsonl")
        write_jsonl(path, rows, junk=["not json", "{broken", "[1, 2]"])
        text = self.summary(path)
        self.assertIn("Machine: 8 GPUs (NVIDIA H200)", text)
        self.assertIn("| zero-engine | stage 2 | 60,000 | 59,000 (98.3%) | 57,600 (96.0%) | 1 GPU |", text)
        self.assertIn("| zero-engine | stage 3 | 58,000 |  | 51,040 (88.0%) | 1 GPU |", text)
        self.assertIn("| FSDP2 | zero2 | 50,000 |  | 48,000 (96.0%) | 1 GPU |", text)
        # DeepSpeed measured only at 8: its own baseline, no efficiency.
        self.assertIn("| DeepSpeed | stage 3 |  |  | 40,000 | 8 GPUs |", text)
        self.assertIn("zero-engine stage 2 at 8 GPUs vs 1: 96.0% (target >= 95%: met)", text)
        self.assertIn("zero-engine stage 3 at 8 GPUs vs 1: 88.0% (target >= 90%: not met)", text)
        # Peer ratios at each world size: 57,600 / 48,000 = 1.20; 51,040 / 40,000 = 1.28.
        self.assertIn("| stage 2 / FSDP2 zero2 | 1.20x |  | 1.20x |", text)
        self.assertIn("| stage 3 / DeepSpeed stage 3 |  |  | 1.28x |", text)
        self.assertIn("| wait fraction | 0.10% |  | 6.20% |", text)
        self.assertIn("Target: largest wait fraction 6.20% (not met).", text)
        self.assertIn("| zero-engine stage 2 | 41.0 | 42.0 | 48.0 |", text)
        self.assertNotIn("Target", self.summary(path, targets=False))

    def test_baseline_is_the_smallest_world_that_ran_and_failures_are_named(self):
        oom = "CUDA out of memory. Tried to allocate 2.00 GiB"
        rows = [
            dict(engine="ours", model="6.7B", world_size=1, stage=1, error="ResourceExhausted: plan needs 170 GiB"),
            dict(engine="ours", model="6.7B", world_size=2, stage=1, error="no result line (timeout after 200s)",
                 missing=True),
            train_row("ours", "6.7B", 4, 10000.0, stage=1),
            train_row("ours", "6.7B", 8, 9800.0, stage=1),
            dict(engine="fsdp2", model="6.7B", world_size=1, mode="zero3", error="OutOfMemoryError: " + oom),
            dict(engine="fsdp2", model="6.7B", world_size=2, mode="zero3", error="skipped: budget", skipped=True),
            dict(engine="deepspeed", model="6.7B", world_size=8, stage=2, error="exit code 3"),
            # train_bench's own failure line: the message and its status code.
            dict(bench="train_step", model="6.7B", world_size=1, stage=3, error="plan does not fit",
                 error_code="RESOURCE_EXHAUSTED"),
        ]
        path = os.path.join(self.dir, "train67.jsonl")
        write_jsonl(path, rows)
        text = self.summary(path)
        self.assertIn("| zero-engine | stage 1 | OOM | timeout | 10,000 | 9,800 (98.0%) | 4 GPUs |", text)
        self.assertIn("| FSDP2 | zero3 | OOM | skipped |  |  |  |", text)
        self.assertIn("| DeepSpeed | stage 2 |  |  |  | error |  |", text)
        self.assertIn("| zero-engine | stage 3 | OOM |  |  |  |  |", text)
        self.assertIn("- zero-engine stage 1, 1 GPU(s): ResourceExhausted: plan needs 170 GiB", text)
        self.assertIn("- DeepSpeed stage 2, 8 GPU(s): exit code 3", text)

    def test_repeats_take_the_median_and_a_success_hides_a_failure(self):
        a = os.path.join(self.dir, "call1")
        b = os.path.join(self.dir, "call2")
        os.makedirs(a)
        os.makedirs(b)
        write_jsonl(os.path.join(a, "train13.jsonl"), [
            train_row("ours", "1.3B", 1, 60000.0, stage=2),
            dict(engine="ours", model="1.3B", world_size=2, stage=2, error="timeout after 100s"),
            train_row("ours", "1.3B", 4, 57000.0, stage=2),
        ])
        write_jsonl(os.path.join(b, "train13.jsonl"), [
            train_row("ours", "1.3B", 1, 62000.0, stage=2),
            train_row("ours", "1.3B", 1, 64000.0, stage=2),
            train_row("ours", "1.3B", 2, 61000.0, stage=2),
        ])
        text = self.summary(self.dir)  # a folder: both calls' files, one level down
        self.assertIn("| zero-engine | stage 2 | 62,000 | 61,000 (98.4%) | 57,000 (91.9%) | 1 GPU |", text)
        self.assertNotIn("Failed cases", text)

    def test_comm_busbw_at_one_gib_against_torch(self):
        rows = [comm_row("ours", "all_reduce", 8, 1 << 30, 360.0), comm_row("ours", "all_reduce", 8, 1 << 20, 50.0),
                comm_row("torch", "allreduce", 8, 1 << 30, 400.0),
                comm_row(None, "all_gather", 2, 1 << 30, 300.0),  # comm_bench's own line: ours
                comm_row("torch", "all_gather", 2, 1 << 29, 310.0),  # torch stopped at 512 MiB
                dict(kind="note", phase="comm", note="bench/torch_comm_reference.py absent"),
                dict(kind="command", phase="comm", cmd="comm_ours_w8", estimate_s=21, wall_s=12.0, rc=0,
                     skipped=False)]
        path = os.path.join(self.dir, "comm.jsonl")
        write_jsonl(path, rows)
        text = self.summary(path)
        self.assertIn("| all_reduce | 8 | 360.0 | 400.0 | 0.90 |", text)
        self.assertIn("| all_gather | 2 | 300.0 | 310.0 (at 512 MiB) | 0.97 |", text)
        self.assertIn("| comm | comm_ours_w8 | 21 | 12.0 | 0 |", text)
        self.assertNotIn("GPT", text)

    def test_tests_and_skipped_commands(self):
        rows = [dict(kind="test", test="tests/engine:parity_cuda_w4_test", result="PASSED", seconds=18),
                dict(kind="test", test="tests/engine:parity_cuda_w4_test at 8 ranks", result="FAILED", seconds=90.0,
                     error="exit code 1"),
                dict(kind="command", phase="tests", cmd="gpu_tests", estimate_s=190, wall_s=0, rc=0, skipped=True)]
        path = os.path.join(self.dir, "tests.jsonl")
        write_jsonl(path, rows)
        text = self.summary(path)
        self.assertIn("## gpu tests: 1 passed, 1 failed", text)
        self.assertIn("| tests/engine:parity_cuda_w4_test at 8 ranks | FAILED | 90.0 |", text)
        self.assertIn("| tests | gpu_tests | 190 | skipped |  |", text)

    def test_command_line(self):
        path = os.path.join(self.dir, "x.jsonl")
        write_jsonl(path, [train_row("ours", "1.3B", 1, 1000.0, stage=1)])
        buf = io.StringIO()
        with redirect_stdout(buf):
            self.assertEqual(ss.main([path]), 0)
        self.assertIn("| zero-engine | stage 1 | 1,000 | 1 GPU |", buf.getvalue())
        self.assertEqual(ss.summarize([]), "(no results found)\n")


class TorchGptTest(unittest.TestCase):
    """What the references share with train_bench, checked without torch."""

    def test_parameters_and_flops_equal_train_bench(self):
        # train_bench's 1.3B line (bench/results/2026-12-02_run19_train_bench.jsonl):
        # num_parameters 1313722368, flops_per_token 8473731072.
        s = tg.shape("1.3B", heads=32)
        self.assertEqual(tg.num_parameters(s), 1313722368)
        self.assertEqual(tg.flops_per_token(s, 1024), 8473731072.0)
        self.assertEqual(tg.shape("1.3B")["heads"], 16)  # the anchors' head count by default
        self.assertEqual(tg.num_parameters(tg.shape("6.7B")), 6654402560)
        with self.assertRaises(ValueError):
            tg.shape("1.3B", heads=3)
        fields = tg.timing_fields(s, 16, 1024, 10, 2.5, 8)
        self.assertAlmostEqual(fields["tokens_per_s_per_gpu"], 16 * 1024 * 10 / 2.5)
        self.assertAlmostEqual(fields["tokens_per_s"], 8 * fields["tokens_per_s_per_gpu"])
        self.assertAlmostEqual(fields["step_ms"], 250.0)

    def test_launcher_env(self):
        saved = dict(os.environ)
        try:
            for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR"):
                os.environ.pop(k, None)
            os.environ.update(OMPI_COMM_WORLD_RANK="3", OMPI_COMM_WORLD_SIZE="4", OMPI_COMM_WORLD_LOCAL_RANK="3",
                              OMPI_COMM_WORLD_LOCAL_SIZE="4")
            self.assertEqual(tg.launcher_env(29999), (3, 4, 3))
            self.assertEqual((os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["MASTER_PORT"]),
                             ("3", "4", "29999"))
            self.assertEqual(os.environ["NCCL_NVLS_ENABLE"], "0")
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def test_dry_runs_need_no_torch(self):
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        env.update(WORLD_SIZE="8", RANK="0", LOCAL_RANK="0")
        for script, args, key, values in (
                ("fsdp2_reference.py", ["--models=1.3B,6.7B", "--heads=32"], "mode", ["zero2", "zero3"] * 2),
                ("deepspeed_reference.py", ["--stages=3,2"], "stage", [3, 2])):
            out = subprocess.run([sys.executable, os.path.join(HERE, script), "--dry_run"] + args, env=env,
                                 capture_output=True, text=True, check=True).stdout
            rows = [json.loads(line) for line in out.splitlines()]
            self.assertEqual([r[key] for r in rows], values)
            self.assertTrue(all(r["world_size"] == 8 and r["batch"] == 16 and r["seq"] == 1024 for r in rows))
        ds = rows[0]["ds_config"]
        self.assertEqual(ds["zero_optimization"]["stage"], 3)
        self.assertEqual(ds["optimizer"]["params"]["torch_adam"], True)
        bad = subprocess.run([sys.executable, os.path.join(HERE, "fsdp2_reference.py"), "--modes=zero4"],
                             capture_output=True, text=True)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("zero4", bad.stderr)


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=1).result
    failed = len(result.failures) + len(result.errors)
    print(f"scaling_summary_test: {result.testsRun - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
