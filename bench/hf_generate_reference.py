#!/usr/bin/env python3
"""Hugging Face transformers' generate tokens/s at generate_bench's sizes.

For our GPT presets, a GPT-2-architecture model (GPT2LMHeadModel) with
n_layer / n_embd / n_head of nn/gpt.cc ("1.3B" is 24 layers, 32 heads, 2048
channels; vocabulary 50257, 1024 positions); for our Llama decoder presets
(nn/decoder_config.cc: llama-tiny, llama-1B, llama-3B, llama-8B), a
LlamaForCausalLM from a LlamaConfig of the same shape (layers, hidden, query
and key/value heads, head_dim, FFN, vocabulary, RMSNorm eps, rope_theta and
Llama 3's rope scaling, tied or not): the config.json generate_bench prints
as model_config. Randomly initialised, built directly in the dtype on the
device (an 8B model is never materialised in f32), generating greedily with
use_cache=True (the KV cache) for batch 1 and 16. Prints one JSON object per
(model, batch, cache) with the fields generate_bench prints, so the two can
run in one device call:

  bazel-bin/bench/generate_bench --model=llama-8B --batch=1,16 --cache=1
  python3 bench/hf_generate_reference.py --model=llama-8B --batch=1,16

What is timed (as generate_bench): `iters` calls of model.generate(prompts,
max_new_tokens=new_tokens) after `warmup` untimed ones, between
torch.cuda.synchronize() calls, by the wall clock. min_new_tokens equals
max_new_tokens, so no end-of-sequence token stops a row early: every call
produces batch x new_tokens tokens. The prompts are random ids (seed), all
of length --prompt, with an all-ones attention mask (no padding).
  total_ms            one generate call
  tokens_per_s        batch x new_tokens / total
  ms_per_token        total_ms / new_tokens
  prefill_ms          one generate call with max_new_tokens = 1
  decode_tokens_per_s batch x (new_tokens - 1) / (total - prefill)
  kv_cache_bytes      2 x layers x batch x (prompt + new_tokens - 1) x
                      kv channels x dtype bytes (0 without the cache; kv
                      channels: GPT's channels, Llama's key/value heads x
                      head_dim)

Flags: --model=1.3B (any of our GPT or Llama preset names; a list runs each)
--batch=1,16 --prompt=128 --new_tokens=128 --cache=1 (1, 0 or "1,0")
--dtype=bf16 (bf16, f16, f32) --device=cuda --iters=3 --warmup=1
--seed=1234 --attn_implementation= (transformers' default when empty).
--print_config prints each model's model_config (a Llama's config.json
keys) and exits without torch: bench/generate_bench_test.sh compares it with
generate_bench's presets. Needs torch and transformers otherwise; prints
{"bench": ..., "error": ...} and exits 1 when they are missing.
"""

import argparse
import json
import sys
import time

# nn/gpt.cc's presets: (layers, heads, channels).
PRESETS = {
    "124M": (12, 12, 768),
    "350M": (24, 16, 1024),
    "760M": (24, 16, 1536),
    "1.3B": (24, 32, 2048),
    "2.7B": (32, 32, 2560),
    "6.7B": (32, 32, 4096),
    "13B": (40, 40, 5120),
}


def llama3(layers, hidden, heads, ffn, tied, rope_factor):
    """nn/decoder_config.cc's Llama3(): Llama 3.1 8B, 3.2 1B and 3B shapes."""
    return dict(
        hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=8,
        head_dim=hidden // heads, vocab_size=128256,
        max_position_embeddings=131072, rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=dict(rope_type="llama3", factor=float(rope_factor),
                          low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=8192),
        tie_word_embeddings=tied)


# nn/decoder_config.cc's Llama presets as config.json keys (the keys of
# DecoderConfig::ToHuggingFaceJson that set the shape).
LLAMA_PRESETS = {
    "llama-tiny": dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        vocab_size=256, max_position_embeddings=128, rms_norm_eps=1e-6,
        rope_theta=10000.0, rope_scaling=None, tie_word_embeddings=True),
    "llama-1B": llama3(16, 2048, 32, 8192, True, 32),
    "llama-3B": llama3(28, 3072, 24, 8192, True, 32),
    "llama-8B": llama3(32, 4096, 32, 14336, False, 8),
}
DTYPE_BYTES = {"bf16": 2, "f16": 2, "f32": 4}


def llama_config(name, positions):
    """The preset's keys, its positions grown to `positions` as
    generate_bench grows them (BenchModelConfig::FromName)."""
    config = dict(LLAMA_PRESETS[name])
    config["max_position_embeddings"] = max(
        config["max_position_embeddings"], positions)
    return config


def int_list(text):
    return [int(item) for item in text.split(",") if item]


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="1.3B")
    parser.add_argument("--batch", default="1,16")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new_tokens", type=int, default=128)
    parser.add_argument("--cache", default="1")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPE_BYTES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--attn_implementation", default="")
    parser.add_argument("--print_config", action="store_true")
    args = parser.parse_args(argv)
    args.models = [m for m in args.model.split(",") if m]
    for model in args.models:
        if model not in PRESETS and model not in LLAMA_PRESETS:
            parser.error(f"--model: unknown preset '{model}'; known: "
                         f"{', '.join(list(PRESETS) + list(LLAMA_PRESETS))}")
    args.batches = int_list(args.batch)
    args.caches = [bool(c) for c in int_list(args.cache)]
    if not args.batches or any(b < 1 for b in args.batches):
        parser.error("--batch must list positive integers")
    if args.prompt < 1 or args.new_tokens < 1 or args.iters < 1:
        parser.error("--prompt, --new_tokens and --iters must be positive")
    return args


def print_json(line):
    print(json.dumps(line), flush=True)


def model_config(name, args):
    """The JSON lines' model_config: GPT's shape, or a Llama's config.json
    keys."""
    if name in LLAMA_PRESETS:
        return llama_config(name, args.prompt + args.new_tokens)
    layers, heads, channels = PRESETS[name]
    return {"layers": layers, "heads": heads, "channels": channels,
            "vocab_size": 50257, "max_seq_len": 1024}


def shape_facts(name, config):
    """(layers, vocabulary, kv channels: one layer's keys per position)."""
    if name in LLAMA_PRESETS:
        return (config["num_hidden_layers"], config["vocab_size"],
                config["num_key_value_heads"] * config["head_dim"])
    return config["layers"], config["vocab_size"], config["channels"]


def build_model(name, config, args, torch, transformers, dtype, device):
    """The randomly initialised model, created in `dtype` on `device` (the
    default dtype set for the construction, as from_pretrained does), so
    8B parameters are never held in f32 or on the host."""
    if name in LLAMA_PRESETS:
        hf_config = transformers.LlamaConfig(**config)
    else:
        hf_config = transformers.GPT2Config(
            vocab_size=config["vocab_size"],
            n_positions=config["max_seq_len"], n_embd=config["channels"],
            n_layer=config["layers"], n_head=config["heads"])
    kwargs = {}
    if args.attn_implementation:
        kwargs["attn_implementation"] = args.attn_implementation
    torch.manual_seed(args.seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with device:
            model = transformers.AutoModelForCausalLM.from_config(
                hf_config, **kwargs)
    finally:
        torch.set_default_dtype(previous)
    # No .to(dtype): that would also round the f32 RoPE inv_freq buffer to
    # 16 bits, which a from_pretrained(dtype=...) model keeps in f32.
    return model.eval()


def main(argv):
    args = parse_args(argv)
    if args.print_config:
        for name in args.models:
            print_json(dict(model=name, model_config=model_config(name, args)))
        return 0
    base = {"bench": "generate", "impl": "hf-transformers"}
    try:
        import torch
        import transformers
    except ImportError as error:
        print_json(dict(base, error=f"needs torch and transformers: {error}"))
        return 1
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16,
             "f32": torch.float32}[args.dtype]
    device = torch.device(args.device)
    device_name = (torch.cuda.get_device_name(device)
                   if device.type == "cuda" else "cpu")

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    failures = 0
    for name in args.models:
        config = model_config(name, args)
        layers, vocab, kv_channels = shape_facts(name, config)
        model = build_model(name, config, args, torch, transformers, dtype,
                            device)
        parameters = sum(p.numel() for p in model.parameters())
        for batch in args.batches:
            for cache in args.caches:
                line = dict(
                    base, model=name, batch=batch, prompt=args.prompt,
                    new_tokens=args.new_tokens, stage=None, cache=cache,
                    dtype=args.dtype, device=device_name, world_size=1,
                    iters=args.iters, warmup=args.warmup, greedy=True,
                    model_config=dict(config, num_parameters=parameters),
                    torch_version=torch.__version__,
                    transformers_version=transformers.__version__,
                    attn_implementation=getattr(
                        model.config, "_attn_implementation", None))
                generator = torch.Generator().manual_seed(args.seed + 1)
                prompts = torch.randint(
                    0, vocab, (batch, args.prompt), generator=generator)
                prompts = prompts.to(device)
                mask = torch.ones_like(prompts)

                def call(new_tokens):
                    with torch.inference_mode():
                        out = model.generate(
                            input_ids=prompts, attention_mask=mask,
                            max_new_tokens=new_tokens,
                            min_new_tokens=new_tokens, do_sample=False,
                            use_cache=cache, pad_token_id=0)
                    if out.shape[1] != args.prompt + new_tokens:
                        raise RuntimeError(
                            f"generated {out.shape[1] - args.prompt} of "
                            f"{new_tokens} tokens")

                def time_calls(new_tokens, iters, warmup):
                    for _ in range(warmup):
                        call(new_tokens)
                    sync()
                    start = time.perf_counter()
                    for _ in range(iters):
                        call(new_tokens)
                    sync()
                    return (time.perf_counter() - start) / iters

                try:
                    if device.type == "cuda":
                        torch.cuda.reset_peak_memory_stats(device)
                    total = time_calls(args.new_tokens, args.iters,
                                       args.warmup)
                    prefill = time_calls(1, args.iters, min(args.warmup, 1))
                except (RuntimeError, torch.cuda.OutOfMemoryError) as error:
                    failures += 1
                    print_json(dict(line, error=str(error)))
                    continue
                tokens = batch * args.new_tokens
                line.update(
                    total_ms=total * 1e3,
                    tokens_per_s=tokens / total,
                    tokens_per_s_per_gpu=tokens / total,
                    ms_per_token=total * 1e3 / args.new_tokens,
                    prefill_ms=prefill * 1e3)
                if args.new_tokens > 1 and total > prefill:
                    line["decode_tokens_per_s"] = (
                        batch * (args.new_tokens - 1) / (total - prefill))
                line["kv_cache_bytes"] = (
                    2.0 * layers * batch *
                    (args.prompt + args.new_tokens - 1) * kv_channels *
                    DTYPE_BYTES[args.dtype] if cache else 0.0)
                if device.type == "cuda":
                    line["memory"] = {
                        "peak_bytes_in_use":
                            torch.cuda.max_memory_allocated(device),
                        "bytes_reserved": torch.cuda.memory_reserved(device),
                    }
                print_json(line)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
