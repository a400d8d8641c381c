#!/usr/bin/env python3
"""Writes a small GPT-2 checkpoint in Hugging Face's safetensors layout.

    write_tiny_hf_gpt2.py OUT --layers=2 --channels=64 --vocab=256
                              --positions=32 --seed=1

Names and shapes are GPT2LMHeadModel's ("transformer.h.0.attn.c_attn.weight",
Conv1D weights stored (in, out)), f32, values drawn from the seed; the test of
train_gpt --init_from feeds it to the trainer, so it needs only Python's
standard library (no torch, numpy or safetensors).
"""
import argparse
import json
import random
import struct


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--positions", type=int, default=32)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    c = args.channels
    rng = random.Random(args.seed)
    tensors = [("transformer.wte.weight", (args.vocab, c), "normal"),
               ("transformer.wpe.weight", (args.positions, c), "normal")]
    for layer in range(args.layers):
        p = f"transformer.h.{layer}."
        tensors += [
            (p + "ln_1.weight", (c,), "ones"), (p + "ln_1.bias", (c,), "normal"),
            (p + "attn.c_attn.weight", (c, 3 * c), "normal"),
            (p + "attn.c_attn.bias", (3 * c,), "normal"),
            (p + "attn.c_proj.weight", (c, c), "normal"),
            (p + "attn.c_proj.bias", (c,), "normal"),
            (p + "ln_2.weight", (c,), "ones"), (p + "ln_2.bias", (c,), "normal"),
            (p + "mlp.c_fc.weight", (c, 4 * c), "normal"),
            (p + "mlp.c_fc.bias", (4 * c,), "normal"),
            (p + "mlp.c_proj.weight", (4 * c, c), "normal"),
            (p + "mlp.c_proj.bias", (c,), "normal"),
        ]
    tensors += [("transformer.ln_f.weight", (c,), "ones"),
                ("transformer.ln_f.bias", (c,), "normal")]
    header = {"__metadata__": {"format": "pt"}}
    data = bytearray()
    for name, shape, kind in tensors:
        count = 1
        for size in shape:
            count *= size
        # Layer-norm gains near 1, everything else small: a sane network.
        values = [1.0 + rng.gauss(0, 0.1) if kind == "ones" else rng.gauss(0, 0.1)
                  for _ in range(count)]
        begin = len(data)
        data += struct.pack(f"<{count}f", *values)
        header[name] = {"dtype": "F32", "shape": list(shape),
                        "data_offsets": [begin, len(data)]}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # the data section starts 8-aligned
    with open(args.out, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        f.write(data)


if __name__ == "__main__":
    main()
