#!/usr/bin/env python3
"""Hugging Face decoder directories for the GPU machine's runs (not a test).

  hf_decoder_tools.py write DIR --shape=8B [--device=cuda]
      A Llama directory with random weights, as transformers writes it
      (LlamaForCausalLM from a LlamaConfig of the torch_llama_anchor.py
      shape, bf16, save_pretrained's 5 GB shards): the input of the 8B run.
  hf_decoder_tools.py tokens PATH --vocab=V --count=N
      N random uint32 token ids below V (train_gpt --data=tokens32:PATH).
  hf_decoder_tools.py check DIR [--like=DIR]
      AutoModelForCausalLM.from_pretrained(DIR): prints one JSON line with
      the missing / unexpected / mismatched keys (all must be empty), the
      load time, and with --like the largest absolute difference from that
      directory's weights. Exit 0 when every key loaded, 1 otherwise.
"""
import argparse
import json
import sys
import time

import torch

SHAPES = {  # layers, hidden, heads, kv heads, intermediate, vocab, tied
    "1B": (16, 2048, 32, 8, 8192, 128256, True),
    "8B": (32, 4096, 32, 8, 14336, 128256, False),
    "tiny": (2, 64, 4, 2, 128, 300, False),  # smoke runs on a CPU
}


def write(args):
    import transformers
    layers, hidden, heads, kv, ffn, vocab, tied = SHAPES[args.shape]
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn,
        num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv, tie_word_embeddings=tied,
        max_position_embeddings=8192, rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=dict(rope_type="llama3", factor=8.0,
                          low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=8192))
    start = time.time()
    torch.manual_seed(0)
    with torch.device(args.device):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(args.dir, max_shard_size="5GB")
    print(json.dumps(dict(wrote=args.dir, shape=args.shape,
                          parameters=sum(p.numel() for p in model.parameters()),
                          seconds=round(time.time() - start, 1))), flush=True)


def tokens(args):
    import numpy as np
    rng = np.random.default_rng(0)
    rng.integers(0, args.vocab, size=args.count, dtype=np.uint32).tofile(args.path)


def check(args):
    import transformers
    start = time.time()
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        args.dir, output_loading_info=True, dtype=torch.bfloat16)
    seconds = time.time() - start
    result = dict(dir=args.dir, architecture=type(model).__name__,
                  parameters=sum(p.numel() for p in model.parameters()),
                  load_seconds=round(seconds, 1),
                  **{k: sorted(v) if not isinstance(v, list) else v
                     for k, v in info.items()})
    ok = not any(info[k] for k in ("missing_keys", "unexpected_keys",
                                   "mismatched_keys") if k in info)
    if args.like:
        other = transformers.AutoModelForCausalLM.from_pretrained(
            args.like, dtype=torch.bfloat16)
        theirs = other.state_dict()
        result["max_abs_difference_from_like"] = max(
            (value.float() - theirs[name].float()).abs().max().item()
            for name, value in model.state_dict().items())
    result["ok"] = ok
    print(json.dumps(result, default=str), flush=True)
    return 0 if ok else 1


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write")
    w.add_argument("dir")
    w.add_argument("--shape", choices=sorted(SHAPES), default="8B")
    w.add_argument("--device", default="cuda")
    t = sub.add_parser("tokens")
    t.add_argument("path")
    t.add_argument("--vocab", type=int, required=True)
    t.add_argument("--count", type=int, required=True)
    c = sub.add_parser("check")
    c.add_argument("dir")
    c.add_argument("--like", default="")
    args = parser.parse_args()
    if args.command == "write":
        write(args)
    elif args.command == "tokens":
        tokens(args)
    else:
        return check(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
