#!/usr/bin/env python3
"""Loads a `ze_checkpoint consolidate --format=hf-gpt2` file with Hugging
Face transformers' GPT2LMHeadModel.from_pretrained and runs a forward.

  hf_load_check.py FILE --layers=L --heads=H --channels=C --vocab=V
      [--positions=1024]

Writes config.json next to a link to FILE in a temporary directory (the
consolidated file carries weights only), loads it, checks that every weight
came from the file (no missing or unexpected keys beyond the tied lm_head
and the attention-mask buffers), and prints one JSON line with the load
time and the logits of a short prompt. Exit 0 ok, 1 otherwise.
"""
import argparse
import json
import os
import sys
import tempfile
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("file")
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--heads", type=int, required=True)
    parser.add_argument("--channels", type=int, required=True)
    parser.add_argument("--vocab", type=int, required=True)
    parser.add_argument("--positions", type=int, default=1024)
    args = parser.parse_args()
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    directory = tempfile.mkdtemp()
    os.symlink(os.path.abspath(args.file),
               os.path.join(directory, "model.safetensors"))
    config = GPT2Config(n_layer=args.layers, n_head=args.heads,
                        n_embd=args.channels, vocab_size=args.vocab,
                        n_positions=args.positions, tie_word_embeddings=True)
    config.save_pretrained(directory)
    start = time.time()
    model, info = GPT2LMHeadModel.from_pretrained(
        directory, output_loading_info=True, torch_dtype=torch.bfloat16)
    seconds = time.time() - start
    missing = [k for k in info["missing_keys"] if not k.startswith("lm_head")]
    unexpected = info["unexpected_keys"]
    with torch.no_grad():
        logits = model(torch.tensor([[464, 2068, 7586, 21831]])).logits
    ok = not missing and not unexpected and bool(torch.isfinite(logits).all())
    print(json.dumps({"check": "hf_from_pretrained", "file": args.file,
                      "ok": ok, "load_seconds": seconds,
                      "missing_keys": sorted(missing), "unexpected_keys": sorted(unexpected),
                      "parameters": sum(p.numel() for p in model.parameters()),
                      "logits_mean": float(logits.float().mean())}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
