#!/usr/bin/env python3
"""torch.distributed's collectives at comm_bench's sizes, in comm_bench's JSON.

The reference for bench/comm_bench: the same sweep (sizes, rounding to whole
elements per rank, warm-up, timed iterations issued back to back then waited
for, rank 0's mean), the same known-input check after the timing, printed as
the same JSON keys, one object per collective, size and placement:

  {"collective":"all_reduce","backend":"nccl","dtype":"bf16","bytes":1048576,
   "world_size":2,"in_place":true,"time_us":12.3,"algbw_GBps":85.2,
   "busbw_GBps":85.2,"wrong":0}

so both can run in one device call and be compared line by line:

  mpirun -np 8 --bind-to none gpu_bundle/bin/comm_bench --backend=nccl \\
    --device=cuda --dtype=bf16 > ours.jsonl
  mpirun -np 8 --bind-to none -x MASTER_ADDR -x MASTER_PORT \\
    python3 bench/torch_comm_reference.py --dtype=bf16 > torch.jsonl

or under torchrun (torchrun --nproc_per_node=8 bench/torch_comm_reference.py).
Ranks come from torchrun's RANK/WORLD_SIZE/LOCAL_RANK, else Open MPI's
OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK, else Hydra's PMI_RANK/PMI_SIZE/
MPI_LOCALRANKID, else a single process; the rendezvous is env://
(MASTER_ADDR default 127.0.0.1, MASTER_PORT default 29500: set MASTER_ADDR to
rank 0's host for several hosts). Rank r uses cuda:(local rank % GPUs).

Backends: --backend=auto is nccl on cuda, gloo on cpu (--device=auto: cuda
when torch sees a GPU). Placements: torch has no out-of-place all_reduce or
broadcast (both write their one tensor), so those are in place only;
reduce_scatter_tensor and all_gather_into_tensor run both ways (in place:
output = this rank's slice of the input, input = this rank's slice of the
output). A collective the backend does not support (gloo's reduce_scatter in
some versions) is reported on stderr and skipped. comm_bench prints the
out-of-place all_reduce as well; everything else pairs up.

wrong: once per size and placement, after the timing, inputs are the known
values of bench/collective_check.cc (reductions: 1 + Scramble(i) % 5;
copies: 1 + (Scramble(i) + rank) % 251), outputs start at -1, and the
elements that differ from the exact result are counted and summed over ranks
(all_reduce of an int64). Any wrong element makes the exit status 1.

--plan prints the (collective, bytes, world_size, in_place) lines it would
measure at --world_size ranks, without torch or ranks: the sweep, checked
against comm_bench's by bench:comm_bench_np*_test.

Flags (as comm_bench): --backend=auto|nccl|gloo --device=auto|cpu|cuda
--dtype=f32|bf16|f16 --min_bytes=8 --max_bytes=1073741824 --factor=2
--iters=20 --warmup=5 --check=1
--collectives=all_reduce,reduce_scatter,all_gather,broadcast
Needs torch (imported only when measuring).
"""

import argparse
import json
import os
import sys
import time

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")
REDUCTIONS = ("all_reduce", "reduce_scatter")
DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2}
# Placements torch.distributed offers for each collective.
PLACEMENTS = {
    "all_reduce": (True,),
    "reduce_scatter": (False, True),
    "all_gather": (False, True),
    "broadcast": (True,),
}
# bench/collective_check.cc's Scramble: x = i * M mod 2^64; x ^ (x >> 31).
SCRAMBLE_MULTIPLIER = 0x9E3779B97F4A7C15
_SIGNED_MULTIPLIER = SCRAMBLE_MULTIPLIER - (1 << 64)  # the same bits in int64


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def collective_list(text):
    names = [name for name in text.split(",") if name]
    for name in names:
        if name not in COLLECTIVES:
            raise argparse.ArgumentTypeError(
                f"unknown collective {name!r}; use {', '.join(COLLECTIVES)}")
    if not names:
        raise argparse.ArgumentTypeError("no collective named")
    return names


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[1:]))
    parser.add_argument("--backend", default="auto",
                        choices=("auto", "nccl", "gloo"))
    parser.add_argument("--device", default="auto",
                        choices=("auto", "cpu", "cuda"))
    parser.add_argument("--dtype", default="f32", choices=tuple(DTYPE_BYTES))
    parser.add_argument("--min_bytes", type=positive_int, default=8)
    parser.add_argument("--max_bytes", type=positive_int, default=1 << 30)
    parser.add_argument("--factor", type=int, default=2)
    parser.add_argument("--iters", type=positive_int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--check", type=int, default=1, choices=(0, 1))
    parser.add_argument("--collectives", type=collective_list,
                        default=list(COLLECTIVES))
    parser.add_argument("--plan", action="store_true",
                        help="print the sweep without torch and exit")
    parser.add_argument("--world_size", type=positive_int, default=None,
                        help="ranks for --plan (default: the launcher's)")
    args = parser.parse_args(argv)
    # As comm_bench: a factor below 2 would never end, warm-up is >= 0.
    args.factor = max(2, args.factor)
    args.warmup = max(0, args.warmup)
    if args.max_bytes < args.min_bytes:
        parser.error("need --min_bytes <= --max_bytes")
    return args


def launch_env(environ):
    """(rank, world_size, local_rank, launcher) from the launcher's variables."""
    for launcher, names in (
            ("torchrun", ("RANK", "WORLD_SIZE", "LOCAL_RANK")),
            ("Open MPI", ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                          "OMPI_COMM_WORLD_LOCAL_RANK")),
            ("Hydra", ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"))):
        rank_name, size_name, local_name = names
        if size_name in environ:
            if rank_name not in environ:
                raise ValueError(f"{size_name} is set but {rank_name} is not")
            rank = int(environ[rank_name])
            world_size = int(environ[size_name])
            local_rank = int(environ.get(local_name, rank))
            if not 0 <= rank < world_size:
                raise ValueError(f"{rank_name}={rank} is not below "
                                 f"{size_name}={world_size}")
            return rank, world_size, local_rank, launcher
    return 0, 1, 0, "none"


def sweep(args, world_size):
    """[(collective, count, bytes, in_place)] in comm_bench's order."""
    element = DTYPE_BYTES[args.dtype]
    plan = []
    for collective in args.collectives:
        size = args.min_bytes
        while size <= args.max_bytes:
            # Whole elements per rank, as comm_bench and nccl-tests.
            count = size // element // world_size * world_size
            if count > 0:
                for in_place in PLACEMENTS[collective]:
                    plan.append((collective, count, count * element, in_place))
            size *= args.factor
    return plan


def bus_factor(collective, world_size):
    n = world_size
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective == "broadcast":
        return 1.0
    return (n - 1) / n


def scramble_mod(index, modulus):
    """collective_check.cc's Scramble(index) % modulus on an int64 array.

    Works on torch and numpy int64 arrays alike: both wrap multiplication
    modulo 2^64 and shift right arithmetically, so the uint64 arithmetic is
    rebuilt: the shift is masked to a logical one, and a negative result x
    stands for x + 2^64 in the final remainder.
    """
    x = index * _SIGNED_MULTIPLIER
    x = x ^ ((x >> 31) & ((1 << 33) - 1))
    return (x % modulus + (x < 0) * pow(2, 64, modulus)) % modulus


def known_values(collective, rank, index):
    """What `rank` contributes at positions `index` (collective_check.cc)."""
    if collective in REDUCTIONS:
        return 1 + scramble_mod(index, 5)
    return 1 + (scramble_mod(index, 251) + rank) % 251


def expected_values(collective, rank, world_size, count, index_of):
    """The exact result on `rank`; index_of(first, n) makes an int64 range."""
    m = count // world_size
    if collective == "all_reduce":
        return world_size * known_values(collective, 0, index_of(0, count))
    if collective == "reduce_scatter":
        return world_size * known_values(collective, 0,
                                          index_of(rank * m, m))
    if collective == "all_gather":
        index = index_of(0, count)
        return 1 + (scramble_mod(index, 251) + index // m) % 251
    return known_values(collective, 0, index_of(0, count))  # from root 0


def input_values(collective, rank, world_size, count, index_of):
    """The known input of `rank` (send count elements)."""
    m = count // world_size
    if collective == "all_gather":
        return known_values(collective, rank, index_of(rank * m, m))
    return known_values(collective, rank, index_of(0, count))


class Runner:
    """One rank's torch.distributed state and the two preallocated buffers."""

    def __init__(self, args, torch, dist, rank, world_size, local_rank):
        self.args, self.torch, self.dist = args, torch, dist
        self.rank, self.world_size = rank, world_size
        use_cuda = args.device == "cuda" or (args.device == "auto" and
                                             torch.cuda.is_available())
        if use_cuda:
            self.device = torch.device(
                "cuda", local_rank % torch.cuda.device_count())
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        self.backend = args.backend
        if self.backend == "auto":
            self.backend = "nccl" if use_cuda else "gloo"
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        dist.init_process_group(self.backend, init_method="env://",
                                rank=rank, world_size=world_size)
        self.dtype = {"f32": torch.float32, "bf16": torch.bfloat16,
                      "f16": torch.float16}[args.dtype]
        max_count = args.max_bytes // DTYPE_BYTES[args.dtype]
        self.a = torch.ones(max_count, dtype=self.dtype, device=self.device)
        self.b = torch.zeros(max_count, dtype=self.dtype, device=self.device)

    def index_of(self, first, n):
        return self.torch.arange(first, first + n, dtype=self.torch.int64,
                                 device=self.device)

    def views(self, collective, count, in_place):
        """(input, output) as comm_bench's ViewsFor."""
        m = count // self.world_size
        a, b, r = self.a, self.b, self.rank
        if collective == "reduce_scatter":
            return ((b[:count], b[r * m:(r + 1) * m]) if in_place
                    else (a[:count], b[:m]))
        if collective == "all_gather":
            return ((b[r * m:(r + 1) * m], b[:count]) if in_place
                    else (a[:m], b[:count]))
        return b[:count], b[:count]

    def issue(self, collective, views):
        source, target = views
        if collective == "all_reduce":
            return self.dist.all_reduce(target, async_op=True)
        if collective == "reduce_scatter":
            return self.dist.reduce_scatter_tensor(target, source,
                                                   async_op=True)
        if collective == "all_gather":
            return self.dist.all_gather_into_tensor(target, source,
                                                    async_op=True)
        return self.dist.broadcast(target, src=0, async_op=True)

    def synchronize(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def check(self, collective, count, views):
        source, target = views
        target.fill_(-1)
        source.copy_(input_values(collective, self.rank, self.world_size,
                                  count, self.index_of).to(self.dtype))
        self.issue(collective, views).wait()
        self.synchronize()
        expected = expected_values(collective, self.rank, self.world_size,
                                   count, self.index_of)
        wrong = (target.float() != expected.float()).sum().to(
            self.torch.int64).reshape(1)
        self.dist.all_reduce(wrong)
        return int(wrong.item())

    def measure(self, collective, count, in_place):
        views = self.views(collective, count, in_place)
        if in_place:  # reductions feed their output back in; keep it finite
            views[0].zero_()
            views[1].zero_()
        for _ in range(self.args.warmup):
            self.issue(collective, views).wait()
        self.synchronize()
        self.dist.barrier()
        start = time.perf_counter()
        works = [self.issue(collective, views)
                 for _ in range(self.args.iters)]
        for work in works:
            work.wait()
        self.synchronize()
        seconds = (time.perf_counter() - start) / self.args.iters
        wrong = self.check(collective, count, views) if self.args.check else -1
        return seconds, wrong


def measure_all(args):
    import torch  # pylint: disable=import-outside-toplevel
    import torch.distributed as dist  # pylint: disable=import-outside-toplevel

    rank, world_size, local_rank, _ = launch_env(os.environ)
    runner = Runner(args, torch, dist, rank, world_size, local_rank)
    failed = 0
    unsupported = set()
    for collective, count, size, in_place in sweep(args, world_size):
        if collective in unsupported:
            continue
        try:
            seconds, wrong = runner.measure(collective, count, in_place)
        except (RuntimeError, NotImplementedError, ValueError) as error:
            # A backend without this collective refuses it on every rank.
            print(f"torch_comm_reference: rank {rank}: {collective} on "
                  f"{runner.backend} failed ({error}); skipping it",
                  file=sys.stderr)
            unsupported.add(collective)
            continue
        failed += wrong > 0
        if rank == 0:
            algbw = size / seconds / 1e9
            print(json.dumps({
                "collective": collective,
                "backend": runner.backend,
                "dtype": args.dtype,
                "bytes": size,
                "world_size": world_size,
                "in_place": in_place,
                "time_us": round(seconds * 1e6, 3),
                "algbw_GBps": round(algbw, 3),
                "busbw_GBps": round(algbw * bus_factor(collective,
                                                       world_size), 3),
                "wrong": wrong,
            }, separators=(",", ":")), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    if failed:
        print(f"torch_comm_reference: rank {rank}: {failed} result(s) had "
              "wrong elements", file=sys.stderr)
    return 1 if failed else 0


def main(argv):
    args = parse_args(argv)
    if args.plan:
        world_size = args.world_size or launch_env(os.environ)[1]
        for collective, _, size, in_place in sweep(args, world_size):
            print(json.dumps({"collective": collective, "bytes": size,
                              "world_size": world_size,
                              "in_place": in_place},
                             separators=(",", ":")))
        return 0
    return measure_all(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
