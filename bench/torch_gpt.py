"""The GPT that the PyTorch-side references train, and what they share.

Used by bench/fsdp2_reference.py (FSDP2) and bench/deepspeed_reference.py
(DeepSpeed) so both peers train the identical network, in the shape
conventions of the reference anchors (shared/anchors/torch_anchor.py): learned
position embeddings, pre-LayerNorm blocks with biases, tanh GELU, causal
scaled_dot_product_attention (flash in bf16), an output head without bias tied
to the token embedding, vocabulary 50304, sequence 1024.

Parameter count: V*C + T*C + L*(12*C*C + 13*C) + 2*C, the same as
GptConfig::NumParameters() with the vocabulary padded to 50304, so the FLOPs
per token are train_bench's: 6*N + 12*L*C*T with N the parameters minus the
position embeddings (bench/gpt_bench_util.cc), against 989 TFLOP/s.

Everything above the model classes imports no torch, so argument parsing,
presets and the launcher environment can be checked on a machine without it
(bench/scaling_summary_test.py does).
"""

import json
import os
import sys
import time

VOCAB = 50304  # GPT-2's 50257 padded to a multiple of 64, as train_bench
MAX_SEQ = 1024  # position-embedding rows of every preset (train_bench's max_seq_len)
PEAK_FLOPS = 989e12  # H200 dense bf16, train_bench's kPeakFlops

# name: (layers, heads, channels). 1.3B as the anchors (head size 128);
# train_bench's own 1.3B preset has 32 heads (head size 64): pass --heads=32
# to train exactly its shapes. 2.7B and 6.7B agree with nn/gpt.cc.
PRESETS = {
    "tiny": (2, 4, 64),  # smoke runs only (vocabulary 256, sequence 64)
    "124M": (12, 12, 768),
    "350M": (24, 16, 1024),
    "1.3B": (24, 16, 2048),
    "2.7B": (32, 32, 2560),
    "6.7B": (32, 32, 4096),
}
TINY_VOCAB, TINY_SEQ = 256, 64


def shape(name, heads=None, seq=None):
    """-> dict(layers, heads, channels, vocab, max_seq) for a preset name.

    heads overrides the preset's head count (channels must divide by it);
    max_seq is max(1024, seq) as train_bench's ModelConfig does."""
    if name not in PRESETS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(PRESETS)}")
    layers, preset_heads, channels = PRESETS[name]
    h = heads or preset_heads
    if channels % h:
        raise ValueError(f"{name}: channels {channels} do not divide into {h} heads")
    tiny = name == "tiny"
    vocab = TINY_VOCAB if tiny else VOCAB
    max_seq = TINY_SEQ if tiny else MAX_SEQ
    if seq and seq > max_seq:
        max_seq = seq
    return dict(layers=layers, heads=h, channels=channels, vocab=vocab, max_seq=max_seq)


def num_parameters(s):
    """All parameters of the model of shape s (tied head counted once)."""
    c, L = s["channels"], s["layers"]
    return s["vocab"] * c + s["max_seq"] * c + L * (12 * c * c + 13 * c) + 2 * c


def flops_parameters(s):
    """train_bench's flops_n: the parameters minus the position embeddings."""
    return num_parameters(s) - s["max_seq"] * s["channels"]


def flops_per_token(s, seq):
    return 6.0 * flops_parameters(s) + 12.0 * s["layers"] * s["channels"] * seq


def launcher_env(default_port):
    """Rank, world size and local rank from torchrun (RANK, WORLD_SIZE,
    LOCAL_RANK) or Open MPI's mpirun (OMPI_COMM_WORLD_*); a single process
    without a launcher is rank 0 of 1. Writes the torchrun names back into
    os.environ, with MASTER_ADDR/MASTER_PORT defaults, so that
    torch.distributed's env:// rendezvous (and DeepSpeed's) finds them.
    -> (rank, world_size, local_rank)"""
    def pick(*names, default):
        for n in names:
            v = os.environ.get(n)
            if v not in (None, ""):
                return int(v)
        return default

    rank = pick("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", default=0)
    world = pick("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", default=1)
    local = pick("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", default=0)
    local_world = pick("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", default=world)
    if not 0 <= rank < world:
        raise SystemExit(f"rank {rank} is outside world size {world}")
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local),
                      LOCAL_WORLD_SIZE=str(local_world))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(default_port))
    # NVLink multicast stays off on the lent machines (KINDS.md): keep it off
    # even when whoever started us did not say so.
    for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                 ("NVSHMEM_DISABLE_NVLS", "1")):
        os.environ.setdefault(k, v)
    return rank, world, local


def split_list(text):
    return [t for t in (x.strip() for x in text.split(",")) if t]


def add_case_arguments(p, default_port):
    """The flags both references take, with the same meaning and defaults:
    the model list, the micro-batch, sequence, timing, optimizer and seed,
    the process group's timeout and port, --smoke, --dry_run and the
    error-path test hook."""
    import argparse
    p.add_argument("--models", default="1.3B", help="comma list of " + ", ".join(PRESETS))
    p.add_argument("--batch", type=int, default=16, help="micro-batch per GPU")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--heads", type=int, default=0, help="override the presets' head count (0: preset)")
    p.add_argument("--clip", type=float, default=1.0, help="gradient clipping (0: none)")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--pg_timeout", type=float, default=300, help="seconds a collective may wait")
    p.add_argument("--port", type=int, default=default_port,
                   help="MASTER_PORT default (mpirun, no launcher)")
    p.add_argument("--smoke", action="store_true", help="tiny model, batch 2, seq 64, 1+2 steps")
    p.add_argument("--dry_run", action="store_true", help="print the cases; needs no torch")
    # Testing the error path: raise MemoryError in the named case (on the
    # ranks listed in --_fail_ranks, default all).
    p.add_argument("--_fail_case", default="", help=argparse.SUPPRESS)
    p.add_argument("--_fail_ranks", default="", help=argparse.SUPPRESS)


def check_case_arguments(p, a):
    """Applies --smoke, splits --models and checks what add_case_arguments
    added; p.error (exit 2) names the flag otherwise."""
    if a.smoke:
        a.models, a.batch, a.seq, a.warmup, a.iters = "tiny", 2, 64, 1, 2
    a.models = split_list(a.models)
    if not a.models:
        p.error("--models must name at least one model")
    for m in a.models:
        try:
            shape(m, a.heads or None, a.seq)
        except ValueError as e:
            p.error(str(e))
    if a.batch < 1 or a.seq < 1 or a.iters < 1 or a.warmup < 0:
        p.error("--batch, --seq, --iters must be positive and --warmup not negative")


def print_row(row):
    """One JSON object per line on stdout, flushed (the orchestration reads it live)."""
    sys.stdout.write(json.dumps(row) + "\n")
    sys.stdout.flush()


def log(rank, *args):
    if rank == 0:
        print(*args, file=sys.stderr, flush=True)


def maybe_fail(a, case, rank):
    """The error-path test hook (--_fail_case, --_fail_ranks): raises
    MemoryError in the named case, as an out-of-memory step would."""
    if a._fail_case and a._fail_case == str(case):
        ranks = split_list(a._fail_ranks)
        if not ranks or str(rank) in ranks:
            raise MemoryError(f"injected failure in case {case} on rank {rank} (--_fail_case)")


def time_steps(step, a, case, rank, sync, dist):
    """`a.warmup` untimed calls of `step`, the error-path hook, then `a.iters`
    timed calls between two synchronisations and barriers (train_bench's
    timing). -> seconds of the timed calls."""
    for _ in range(a.warmup):
        step()
    maybe_fail(a, case, rank)
    sync()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(a.iters):
        step()
    sync()
    dist.barrier()
    return time.perf_counter() - start


def short_error(exc, limit=2000):
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[:limit] + " ..."


def timing_fields(s, batch, seq, iters, seconds, world):
    """train_bench's throughput fields for `iters` steps that took `seconds`
    (wall clock, synchronised at both ends): tokens counted on every rank."""
    per_gpu = batch * seq * iters / seconds
    fpt = flops_per_token(s, seq)
    return dict(step_ms=seconds * 1e3 / iters, tokens_per_s=per_gpu * world,
                tokens_per_s_per_gpu=per_gpu, tflops_per_gpu=per_gpu * fpt / 1e12,
                mfu=per_gpu * fpt / PEAK_FLOPS, mfu_pct=per_gpu * fpt / PEAK_FLOPS * 100)


def flops_json(s, seq):
    return dict(num_parameters=num_parameters(s), flops_n=flops_parameters(s),
                flops_per_token=flops_per_token(s, seq), flops_formula="6*flops_n + 12*L*C*T",
                peak_flops=PEAK_FLOPS)


def model_config_json(s):
    return dict(layers=s["layers"], heads=s["heads"], channels=s["channels"],
                padded_vocab_size=s["vocab"], max_seq_len=s["max_seq"])


# ------------------------------------------------------------------ torch from here on


def torch_classes():
    """The model classes; defined on first use so the module imports without torch."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self, c, heads):
            super().__init__()
            self.heads = heads
            self.ln1 = nn.LayerNorm(c)
            self.qkv = nn.Linear(c, 3 * c)
            self.proj = nn.Linear(c, c)
            self.ln2 = nn.LayerNorm(c)
            self.fc = nn.Linear(c, 4 * c)
            self.fc2 = nn.Linear(4 * c, c)

        def forward(self, x):  # x: (B, T, C)
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)  # each (B, T, C)
            q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                       for z in (q, k, v))  # (B, H, T, D)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class Gpt(nn.Module):
        def __init__(self, s):
            super().__init__()
            c = s["channels"]
            self.wte = nn.Embedding(s["vocab"], c)
            self.wpe = nn.Embedding(s["max_seq"], c)
            self.blocks = nn.ModuleList(Block(c, s["heads"]) for _ in range(s["layers"]))
            self.lnf = nn.LayerNorm(c)
            self.head = nn.Linear(c, s["vocab"], bias=False)
            self.head.weight = self.wte.weight  # tied: one parameter
            # GPT-2's initialisation: small normal weights, zero biases. Any
            # finite values would time the same; these keep the loss sane.
            with torch.no_grad():
                for name, p in self.named_parameters():
                    if p.dim() >= 2:
                        p.normal_(0.0, 0.02)
                    elif name.endswith("bias"):
                        p.zero_()

        def forward(self, idx, tgt):  # idx, tgt: (B, T) int64
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)  # (B, T, C)
            for block in self.blocks:
                x = block(x)
            logits = self.head(self.lnf(x))  # (B, T, V)
            return F.cross_entropy(logits.float().view(-1, logits.size(-1)), tgt.view(-1))

    return Block, Gpt


def random_batch(torch, batch, seq, vocab, seed, device):
    """One random batch (tokens, targets) per rank, as train_bench: seed + rank."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    data = torch.randint(0, vocab, (batch, seq + 1), generator=g)
    return data[:, :-1].contiguous().to(device), data[:, 1:].contiguous().to(device)


def memory_json(torch, dist, device):
    """Peak and reserved device memory, the largest over the ranks (train_bench's
    "memory" keys; train_bench reports rank 0's, the ranks are alike)."""
    if device.type != "cuda":
        return None
    t = torch.tensor([torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)],
                     dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    peak, reserved = (int(v) for v in t.tolist())
    gib = float(1 << 30)
    return dict(peak_bytes_in_use=peak, peak_gib_in_use=peak / gib, bytes_reserved=reserved,
                gib_reserved=reserved / gib, of="max over ranks; torch.cuda.max_memory_allocated/reserved")


def agree_on_failure(torch, dist, device, error):
    """Every rank learns whether any rank failed this case, and rank 0 gets the
    messages. A collective: the ranks must all reach it (a rank stuck inside
    the failed case's collectives makes it hang until the process group's
    timeout, and the orchestration reports the case as lost).
    -> None when no rank failed, else the messages joined."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return error
    flag = torch.tensor([1.0 if error else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item() == 0:
        return None
    # Each rank's message in a fixed-size byte tensor (all_gather_object would
    # need numpy).
    size = 512
    text = (error or "").encode("utf-8")[:size]
    mine = torch.zeros(size, dtype=torch.uint8, device=device)
    if text:
        mine[:len(text)] = torch.tensor(list(text), dtype=torch.uint8, device=device)
    gathered = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    messages = [bytes(t.cpu().tolist()).rstrip(b"\0").decode("utf-8", "replace") for t in gathered]
    failed = [f"rank {r}: {m}" for r, m in enumerate(messages) if m]
    return "; ".join(failed[:2]) + (f" (and {len(failed) - 2} more ranks)" if len(failed) > 2 else "")


def finish_case(torch, dist, device, row, error, rank):
    """The end of one case in both references, after the caller dropped the
    case's tensors: frees cached device memory, agrees across ranks on
    whether the case failed (a collective), adds the memory figures and any
    error to `row`, prints it on rank 0. -> 1 when the case failed, else 0."""
    import gc
    gc.collect()
    if getattr(device, "type", str(device)) == "cuda":
        torch.cuda.empty_cache()
    error = agree_on_failure(torch, dist, device, error)
    row["memory"] = memory_json(torch, dist, device)
    if error:
        row["error"] = error
    if rank == 0:
        print_row(row)
    return 1 if error else 0
