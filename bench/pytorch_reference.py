"""PyTorch reference for train_bench: the same GPT and training step in PyTorch.

Measures, on whatever GPU it runs on, what the issues' reference figures
measured: full training steps (forward, backward, gradient clipping at 1.0,
fused AdamW) of the GPT presets at sequence 1024, bf16 autocast over f32
parameters, eager and under torch.compile. Running it on the same card as
train_bench removes the card-to-card spread (about 2% between H200s) from the
comparison. Prints one JSON object per (model, mode) line, like train_bench:

  python3 bench/pytorch_reference.py --models=1.3B --modes=eager,compile

The model mirrors nn/gpt.cc: learned position embeddings, pre-LayerNorm
blocks with biases, tanh GELU, causal attention (scaled_dot_product_attention,
flash backend), tied output head, vocabulary padded to 50304. Data: one random
batch, as train_bench. FLOPs per token as gpt_bench: 6 N + 12 L C T, with N
the parameters minus the position embeddings. Not part of the test path; it
needs torch, which only the GPU machine has.
"""

import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {  # name: (layers, heads, channels), as GptConfig::Preset
    "124M": (12, 12, 768),
    "350M": (24, 16, 1024),
    "760M": (24, 16, 1536),
    "1.3B": (24, 32, 2048),
}
DEFAULT_BATCH = {"124M": 32}  # others 16, as train_bench
VOCAB = 50257
PADDED_VOCAB = 50304
PEAK_FLOPS = 989e12  # H200 dense bf16, as train_bench


class Block(nn.Module):
    def __init__(self, channels, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(channels)
        self.qkv = nn.Linear(channels, 3 * channels)
        self.proj = nn.Linear(channels, channels)
        self.ln2 = nn.LayerNorm(channels)
        self.fc = nn.Linear(channels, 4 * channels)
        self.fc_proj = nn.Linear(4 * channels, channels)

    def forward(self, x):
        batch, seq, channels = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(channels, dim=2)
        shape = (batch, seq, self.heads, channels // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(batch, seq, channels))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, layers, heads, channels, seq):
        super().__init__()
        self.wte = nn.Embedding(PADDED_VOCAB, channels)
        self.wpe = nn.Embedding(seq, channels)
        self.blocks = nn.ModuleList(Block(channels, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(channels)
        for parameter in self.parameters():
            if parameter.dim() > 1:
                nn.init.normal_(parameter, std=0.02)

    def forward(self, tokens, targets):
        positions = torch.arange(tokens.size(1), device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, PADDED_VOCAB),
                               targets.view(-1))


def run(name, mode, batch, seq, iters, warmup):
    layers, heads, channels = PRESETS[name]
    torch.manual_seed(1234)
    model = Gpt(layers, heads, channels, seq).cuda()
    parameters = sum(p.numel() for p in model.parameters())
    flops_n = parameters - seq * channels
    flops_per_token = 6 * flops_n + 12 * layers * channels * seq
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95),
                                  eps=1e-8, weight_decay=0.1, fused=True)
    step_model = torch.compile(model) if mode == "compile" else model
    tokens = torch.randint(0, VOCAB, (batch, seq), device="cuda")
    targets = torch.randint(0, VOCAB, (batch, seq), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    compile_start = time.perf_counter()
    for _ in range(warmup):
        loss = step()
    torch.cuda.synchronize()
    warmup_s = time.perf_counter() - compile_start
    start = time.perf_counter()
    for _ in range(iters):
        loss = step()
    torch.cuda.synchronize()
    step_s = (time.perf_counter() - start) / iters
    tokens_per_s = batch * seq / step_s
    mfu = tokens_per_s * flops_per_token / PEAK_FLOPS
    print(json.dumps({
        "bench": "pytorch_train_step", "model": name, "mode": mode,
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "dtype": "bf16 autocast, f32 parameters", "batch": batch, "seq": seq,
        "iters": iters, "warmup": warmup, "warmup_s": round(warmup_s, 1),
        "optimizer": "torch.optim.AdamW(fused=True), clip_grad_norm_ 1.0",
        "num_parameters": parameters, "step_ms": step_s * 1e3,
        "tokens_per_s": tokens_per_s, "mfu_pct": 100 * mfu,
        "loss": float(loss), "peak_gib":
            torch.cuda.max_memory_allocated() / 2**30}), flush=True)
    del model, step_model, optimizer
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="124M,350M,1.3B")
    parser.add_argument("--modes", default="eager,compile")
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    for name in args.models.split(","):
        for mode in args.modes.split(","):
            try:
                run(name, mode, DEFAULT_BATCH.get(name, 16), args.seq,
                    args.iters, args.warmup)
            except Exception as error:  # report and go on, as train_bench
                print(json.dumps({"bench": "pytorch_train_step", "model": name,
                                  "mode": mode, "error": repr(error)}),
                      flush=True)


if __name__ == "__main__":
    main()
