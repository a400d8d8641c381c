"""DeepSpeed ZeRO reference for train_bench at any world size.

Trains bench/torch_gpt.py's GPT (the anchors' shapes; the same network as
bench/fsdp2_reference.py) under DeepSpeed ZeRO stage 1, 2 or 3, one process
per GPU, and prints on rank 0 one JSON line per (model, stage) with
train_bench's keys where they mean the same thing (model, world_size, batch,
seq, step_ms, tokens_per_s, tokens_per_s_per_gpu, tflops_per_gpu, mfu,
memory.peak_gib_in_use, ...) plus "engine":"deepspeed" and "stage".

The config is train_bench's (bench/train_bench.cc, DeepSpeedConfig): bf16,
micro-batch --batch, no accumulation, gradient_clipping 1.0, AdamW lr 6e-4,
betas 0.9/0.95, eps 1e-8, weight decay 0.1, overlap_comm, contiguous
gradients, reduce_scatter, reduce and allgather buckets 5e8, and at stage 3
DeepSpeed's fetch defaults (prefetch bucket 5e7, max live parameters 1e9,
max reuse distance 1e9, persistence threshold 1e5). --zero merges more keys.

The optimizer is torch.optim.AdamW(fused=True), chosen through the config
("torch_adam": true, "fused": true): DeepSpeed's own FusedAdam is a JIT build
that fails on the H200 machine (nvcc 13 parsing the sm_90a arch, see
shared/ANCHORS.md), and the DeepSpeed wheel there is built without ops. The
model is built on the GPU in f32 and handed to deepspeed.initialize, which
casts it to bf16 and partitions it.

DeepSpeed 0.19.8 is not installed on the GPU machine: its wheels (with hjson,
pydantic 2 and their needs) travel in shared/anchors/whl, and
tools/multi_gpu_bench.sh installs them into /tmp/site and puts that on
PYTHONPATH, as shared/anchors/run_deepspeed_anchor.sh does. By hand:

  python3 -m pip install -q --no-index --no-deps --target /tmp/site .anchors/whl/*.whl
  PYTHONPATH=/tmp/site torchrun --standalone --nproc_per_node=N \\
      bench/deepspeed_reference.py --models=1.3B --stages=2,3

(mpirun -np N python3 ... works too: the script reads OMPI_COMM_WORLD_*.)
Timing, errors and exit status as bench/fsdp2_reference.py: an OOM prints
{"error": ...} for its case and the run goes on. --dry_run prints every case's
DeepSpeed config without importing torch or deepspeed.
"""

import argparse
import datetime
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt as tg  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    tg.add_case_arguments(p, default_port=29514)
    p.add_argument("--stages", default="2,3", help="comma list of ZeRO stages 1-3")
    p.add_argument("--zero", default="{}", help="JSON merged into zero_optimization")
    a = p.parse_args(argv)
    tg.check_case_arguments(p, a)
    try:
        a.stages = [int(x) for x in tg.split_list(a.stages)]
    except ValueError:
        p.error(f"--stages: {a.stages!r} is not a list of numbers")
    if any(st not in (1, 2, 3) for st in a.stages):
        p.error("--stages: DeepSpeed ZeRO stages are 1, 2 and 3")
    if not a.stages:
        p.error("--stages must name at least one stage")
    try:
        a.zero = json.loads(a.zero)
    except ValueError as e:
        p.error(f"--zero is not JSON: {e}")
    if not isinstance(a.zero, dict):
        p.error("--zero must be a JSON object")
    return a


def ds_config(a, stage):
    """train_bench's DeepSpeedConfig for this stage, with torch's fused AdamW."""
    zero = {
        "stage": stage,
        "contiguous_gradients": True,
        "overlap_comm": True,
        "reduce_scatter": True,
        "reduce_bucket_size": int(5e8),
        "allgather_partitions": True,
        "allgather_bucket_size": int(5e8),
    }
    if stage == 3:
        zero.update(stage3_prefetch_bucket_size=int(5e7), stage3_max_live_parameters=int(1e9),
                    stage3_max_reuse_distance=int(1e9), stage3_param_persistence_threshold=int(1e5))
    zero.update(a.zero)
    cfg = {
        "train_micro_batch_size_per_gpu": a.batch,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 1000000,
        "wall_clock_breakdown": False,
        "bf16": {"enabled": True},
        "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": {
            "lr": a.lr, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1,
            "torch_adam": True, "fused": True}},
    }
    if a.clip > 0:
        cfg["gradient_clipping"] = a.clip
    return cfg


def base_row(a, model, stage, world):
    s = tg.shape(model, a.heads or None, a.seq)
    return dict(bench="train_step", engine="deepspeed", stage=stage, model=model, world_size=world,
                batch=a.batch, seq=a.seq, dtype="bf16", iters=a.iters, warmup=a.warmup,
                optimizer="torch.optim.AdamW(fused=True) via torch_adam", gradient_clipping=a.clip,
                params=tg.num_parameters(s), model_config=tg.model_config_json(s),
                flops=tg.flops_json(s, a.seq), ds_config=ds_config(a, stage))


def main(argv):
    a = parse_args(argv)
    rank, world, local = tg.launcher_env(a.port)
    if a.dry_run:
        for model in a.models:
            for stage in a.stages:
                if rank == 0:
                    tg.print_row(dict(base_row(a, model, stage, world), dry_run=True))
        return 0

    # What DeepSpeed's JIT op builds would need (none should run: torch's
    # AdamW, no offload); set as the anchor script does, in case one does.
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", "/tmp/torch_extensions_ds")
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    os.environ.setdefault("DS_SKIP_CUDA_CHECK", "1")
    import torch
    import torch.distributed as dist
    import deepspeed
    _, Gpt = tg.torch_classes()

    if torch.cuda.is_available():
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
        backend = "nccl"
    else:  # smoke runs without a GPU; DeepSpeed picks its CPU accelerator
        device = torch.device("cpu")
        backend = "gloo"
    deepspeed.init_distributed(dist_backend=backend, timeout=datetime.timedelta(seconds=a.pg_timeout))
    use_cuda = device.type == "cuda"
    device_name = torch.cuda.get_device_name(device) if use_cuda else "cpu"

    def sync():
        if use_cuda:
            torch.cuda.synchronize(device)

    failures = 0
    for model_name in a.models:
        for stage in a.stages:
            row = base_row(a, model_name, stage, world)
            row.update(device=device_name, backend=backend, torch_version=torch.__version__,
                       deepspeed_version=deepspeed.__version__)
            s = tg.shape(model_name, a.heads or None, a.seq)
            tg.log(rank, f"deepspeed_reference: {model_name} ({row['params']} parameters), ZeRO stage "
                   f"{stage}, world size {world}")
            error = None
            model = engine = idx = tgt = None
            try:
                if use_cuda:
                    torch.cuda.reset_peak_memory_stats(device)
                torch.manual_seed(a.seed)  # the same weights on every rank
                with device:
                    model = Gpt(s)
                t0 = time.perf_counter()
                # A deep copy: DeepSpeed adds keys to the dict it is given.
                engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()),
                                                       config=json.loads(json.dumps(row["ds_config"])))
                sync()
                row["initialize_s"] = round(time.perf_counter() - t0, 2)
                row["ds_optimizer"] = type(engine.optimizer).__name__
                idx, tgt = tg.random_batch(torch, a.batch, a.seq, s["vocab"], a.seed + 1 + rank, device)
                engine.train()
                state = {}

                def step():
                    loss = engine(idx, tgt)
                    engine.backward(loss)
                    engine.step()
                    state["loss"] = loss

                seconds = tg.time_steps(step, a, stage, rank, sync, dist)
                row.update(tg.timing_fields(s, a.batch, a.seq, a.iters, seconds, world))
                row["loss"] = float(state["loss"].detach().float().item())
                gn = engine.get_global_grad_norm() if hasattr(engine, "get_global_grad_norm") else None
                if gn is not None:
                    row["grad_norm"] = float(gn.item() if hasattr(gn, "item") else gn)
                if row["loss"] != row["loss"]:
                    raise FloatingPointError("loss is NaN")
            except Exception as e:  # noqa: BLE001 - an OOM or any other failure costs this case only
                error = tg.short_error(e)
                print(f"rank {rank}: {model_name} stage {stage}: {error}", file=sys.stderr, flush=True)
            if engine is not None and hasattr(engine, "destroy"):
                try:
                    engine.destroy()
                except Exception as e:  # noqa: BLE001 - cleaning up must not end the run
                    print(f"rank {rank}: engine.destroy: {tg.short_error(e)}", file=sys.stderr, flush=True)
            model = engine = idx = tgt = state = step = None
            failures += tg.finish_case(torch, dist, device, row, error, rank)
    dist.barrier()
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
