"""PyTorch FSDP2 (fully_shard) reference for train_bench at any world size.

Trains bench/torch_gpt.py's GPT (the anchors' shapes) with FSDP2, one process
per GPU, and prints on rank 0 one JSON line per (model, mode) with
train_bench's keys where they mean the same thing (model, world_size, batch,
seq, step_ms, tokens_per_s, tokens_per_s_per_gpu, tflops_per_gpu, mfu,
memory.peak_gib_in_use, ...) plus "engine":"fsdp2" and "mode":

  zero2  fully_shard(reshard_after_forward=False): parameters stay gathered
         from forward to backward, as ZeRO-2 keeps them whole
  zero3  fully_shard(reshard_after_forward=True): each block's parameters are
         gathered again for backward, as ZeRO-3

Every block is its own FSDP unit, then the root (embeddings, final LayerNorm,
tied head). MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=f32 by
default): bf16 compute, gradients reduce-scattered in f32 into f32 shards,
torch.optim.AdamW(fused=True) on the f32 shards, gradient clipping at 1.0, as
train_bench's config (AdamW betas 0.9/0.95, weight decay 0.1, lr 6e-4).

Launch (the same flags at every world size):

  torchrun --standalone --nproc_per_node=N bench/fsdp2_reference.py --models=1.3B
  mpirun -np N python3 bench/fsdp2_reference.py ...   (reads OMPI_COMM_WORLD_*)
  python3 bench/fsdp2_reference.py ...                (world size 1)

Timing as train_bench: --warmup untimed steps, then --iters steps between two
device synchronisations followed by a barrier, by rank 0's wall clock; tokens
count every rank's micro-batch. Each case is in a try/except: an OOM prints
{"error": ...} for that case and the run goes on with the next (all ranks must
fail alike, as an OOM of identical shapes does; a rank that fails alone leaves
the others waiting until --pg_timeout). Exit status 1 if any case failed.

--dry_run prints the cases without importing torch; --smoke trains the tiny
model for 1+2 steps (on the CPU with gloo when no GPU is visible).
"""

import argparse
import datetime
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt as tg  # noqa: E402

MODES = {"zero2": False, "zero3": True}  # mode -> reshard_after_forward


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    tg.add_case_arguments(p, default_port=29513)
    p.add_argument("--modes", default="zero2,zero3", help="comma list of zero2, zero3")
    p.add_argument("--reduce_dtype", choices=("f32", "bf16"), default="f32")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    a = p.parse_args(argv)
    tg.check_case_arguments(p, a)
    a.modes = tg.split_list(a.modes)
    for m in a.modes:
        if m not in MODES:
            p.error(f"--modes: {m!r} is not one of {', '.join(MODES)}")
    if not a.modes:
        p.error("--modes must name at least one mode")
    return a


def base_row(a, model, mode, world):
    s = tg.shape(model, a.heads or None, a.seq)
    return dict(bench="train_step", engine="fsdp2", mode=mode, reshard_after_forward=MODES[mode],
                model=model, world_size=world, batch=a.batch, seq=a.seq, dtype="bf16",
                reduce_dtype=a.reduce_dtype, iters=a.iters, warmup=a.warmup,
                optimizer="torch.optim.AdamW(fused=True)", gradient_clipping=a.clip,
                params=tg.num_parameters(s), model_config=tg.model_config_json(s),
                flops=tg.flops_json(s, a.seq))


def main(argv):
    a = parse_args(argv)
    rank, world, local = tg.launcher_env(a.port)
    if a.dry_run:
        for model in a.models:
            for mode in a.modes:
                if rank == 0:
                    tg.print_row(dict(base_row(a, model, mode, world), dry_run=True))
        return 0

    import torch
    import torch.distributed as dist
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:  # PyTorch before 2.6
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
    _, Gpt = tg.torch_classes()

    use_cuda = a.device == "cuda" or (a.device == "auto" and torch.cuda.is_available())
    if use_cuda:
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=a.pg_timeout), device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=a.pg_timeout))
    reduce_dtype = torch.float32 if a.reduce_dtype == "f32" else torch.bfloat16
    device_name = torch.cuda.get_device_name(device) if use_cuda else "cpu"

    def sync():
        if use_cuda:
            torch.cuda.synchronize(device)

    failures = 0
    for model_name in a.models:
        for mode in a.modes:
            row = base_row(a, model_name, mode, world)
            row.update(device=device_name, backend=dist.get_backend(), torch_version=torch.__version__)
            s = tg.shape(model_name, a.heads or None, a.seq)
            tg.log(rank, f"fsdp2_reference: {model_name} ({row['params']} parameters), {mode}, "
                   f"world size {world}")
            error = None
            model = opt = idx = tgt = None
            try:
                if use_cuda:
                    torch.cuda.reset_peak_memory_stats(device)
                torch.manual_seed(a.seed)  # the same weights on every rank
                with device:
                    model = Gpt(s)
                mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype)
                for block in model.blocks:
                    fully_shard(block, mp_policy=mp, reshard_after_forward=MODES[mode])
                fully_shard(model, mp_policy=mp, reshard_after_forward=MODES[mode])
                opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
                                        weight_decay=0.1, fused=True)
                idx, tgt = tg.random_batch(torch, a.batch, a.seq, s["vocab"], a.seed + 1 + rank, device)
                state = {}

                def step():
                    loss = model(idx, tgt)
                    loss.backward()
                    if a.clip > 0:
                        state["grad_norm"] = torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    state["loss"] = loss

                seconds = tg.time_steps(step, a, mode, rank, sync, dist)
                row.update(tg.timing_fields(s, a.batch, a.seq, a.iters, seconds, world))
                row["loss"] = float(state["loss"].detach().float().item())
                gn = state.get("grad_norm")
                if gn is not None:
                    gn = gn.full_tensor() if hasattr(gn, "full_tensor") else gn
                    row["grad_norm"] = float(gn.float().item())
                if row["loss"] != row["loss"]:
                    raise FloatingPointError("loss is NaN")
            except Exception as e:  # noqa: BLE001 - an OOM or any other failure costs this case only
                error = tg.short_error(e)
                print(f"rank {rank}: {model_name} {mode}: {error}", file=sys.stderr, flush=True)
            # Drop the failed case's tensors (the exception's frames are gone
            # once the except block ends) before the collectives below.
            model = opt = idx = tgt = state = step = None
            failures += tg.finish_case(torch, dist, device, row, error, rank)
    dist.barrier()
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
