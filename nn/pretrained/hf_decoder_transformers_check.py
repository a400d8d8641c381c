#!/usr/bin/env python3
"""Checks what hf_decoder_export_tool wrote against the fixture it read:

  hf_decoder_transformers_check.py FIXTURE_DIR EXPORT_DIR

EXPORT_DIR/f32 (one file, f32) and EXPORT_DIR/sharded (bf16 shards with an
index) must load with AutoModelForCausalLM.from_pretrained with no missing,
unexpected or mismatched keys, into the fixture's architecture and config
(the fields the model's shape and numerics depend on), with the fixture's
weights (f32: equal; bf16: equal to the fixture's rounded to bf16), and the
f32 export must reproduce reference.json's eval loss and greedy tokens.
Needs torch and transformers; exits 1 naming the first difference.
"""

import json
import os
import sys

import torch
import transformers

# Config fields that change the model's shape or its numbers.
FIELDS = ("architectures", "model_type", "num_hidden_layers", "hidden_size",
          "num_attention_heads", "num_key_value_heads", "head_dim",
          "intermediate_size", "vocab_size", "max_position_embeddings",
          "rms_norm_eps", "tie_word_embeddings", "hidden_act",
          "attention_bias", "sliding_window", "use_sliding_window")


def fail(message):
    sys.exit(f"FAIL: {message}")


def load(directory):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, attn_implementation="eager",
        output_loading_info=True)
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys",
                 "error_msgs"):
        if info.get(kind):
            fail(f"{directory}: {kind}: {info[kind]}")
    return model.eval()


def rope(config):
    params = getattr(config, "rope_parameters", None) or {}
    return {k: v for k, v in dict(params).items() if v is not None}


def main():
    fixture, exported = sys.argv[1], sys.argv[2]
    with open(os.path.join(fixture, "reference.json")) as f:
        reference = json.load(f)
    want = load(fixture)
    want_state = want.state_dict()
    for variant, dtype in (("f32", torch.float32), ("sharded", torch.bfloat16)):
        directory = os.path.join(exported, variant)
        got = load(directory)
        for field in FIELDS:
            a = getattr(want.config, field, None)
            b = getattr(got.config, field, None)
            if field == "head_dim" and a is None:
                # Qwen2's config has no head_dim (it is hidden / heads); an
                # explicit one equal to that is the same model.
                a = want.config.hidden_size // want.config.num_attention_heads
            if a != b:
                fail(f"{directory}: config {field} is {b!r}, fixture {a!r}")
        if rope(want.config) != rope(got.config):
            fail(f"{directory}: rope {rope(got.config)} vs "
                 f"{rope(want.config)}")
        for name, value in got.state_dict().items():
            expected = want_state[name].to(dtype).to(torch.float32)
            if not torch.equal(value, expected):
                fail(f"{directory}: {name} differs from the fixture's")
        if variant == "sharded" and not os.path.exists(
                os.path.join(directory, "model.safetensors.index.json")):
            fail(f"{directory}: no index")
    model = load(os.path.join(exported, "f32"))
    with torch.no_grad():
        tokens = torch.tensor(reference["eval"]["tokens"])
        targets = torch.tensor(reference["eval"]["targets"])
        logits = model(input_ids=tokens).logits
        loss = float(torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)))
    if abs(loss - reference["eval"]["loss"]) > 1e-6 * abs(loss):
        fail(f"eval loss {loss} vs reference {reference['eval']['loss']}")
    config = transformers.GenerationConfig(
        do_sample=False, max_new_tokens=24, min_new_tokens=24,
        eos_token_id=None, pad_token_id=0, bos_token_id=None)
    for case in reference["generate"]["prompts"]:
        prompt = case["prompt"]
        with torch.no_grad():
            out = model.generate(
                input_ids=torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                generation_config=config)
        if out[0, len(prompt):].tolist() != case["tokens"]:
            fail(f"generate from {prompt}: {out[0, len(prompt):].tolist()} "
                 f"vs {case['tokens']}")
    print(f"{os.path.basename(fixture)}: transformers {transformers.__version__}"
          f" loads both exports with no missing or unexpected keys; loss "
          f"{loss:.6f} and greedy tokens as the reference")


if __name__ == "__main__":
    main()
