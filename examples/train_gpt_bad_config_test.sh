#!/bin/bash
# train_gpt_bad_config_test.sh TRAIN_GPT
# The trainer loads its config through the config library: a --config that is
# a directory, and a number that overflows a double (1e999), are errors
# naming the path / the file and key, with exit status 2 -- not an abort
# (the overflow used to escape as an uncaught nlohmann exception, status 134).
set -uo pipefail
train="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0

expect_bad_input() {
  local pattern="$1"; shift
  local output status
  output=$("$train" --device=cpu "$@" 2>&1); status=$?
  if [[ "$status" != 2 ]] || ! grep -qE -- "$pattern" <<<"$output" ||
     grep -q "terminate called" <<<"$output"; then
    echo "FAIL: train_gpt $* exited $status (want 2), output:"
    echo "$output" | tail -5
    echo "(wanted a line matching: $pattern)"
    failures=$((failures + 1))
  else
    echo "ok: train_gpt $* -> 2"
  fi
}

mkdir -p "$tmp/configs"
expect_bad_input "$tmp/configs: is a directory, not a config file" \
  --config="$tmp/configs"

echo '{"train_batch_size": 8, "optimizer": {"type": "AdamW",
       "params": {"lr": 1e999}}}' > "$tmp/overflow.json"
expect_bad_input "$tmp/overflow.json: number out of range at optimizer.params.lr" \
  --config="$tmp/overflow.json"

# Hugging Face's "auto" precision: train_gpt builds the model in the
# config's precision, so it names the key (it used to abort on a ZE_CHECK).
echo '{"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": "auto"},
       "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}' > "$tmp/auto_precision.json"
expect_bad_input "$tmp/auto_precision.json: bf16.enabled is \"auto\", but train_gpt builds the model in the config's precision" \
  --config="$tmp/auto_precision.json" --dry_run
# Other "auto" values only a trainer's arguments fill: named, with the hint
# they need, before anything is planned.
echo '{"train_micro_batch_size_per_gpu": 2,
       "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}' > "$tmp/auto_lr.json"
expect_bad_input "$tmp/auto_lr.json: optimizer.params.lr is \"auto\" but ResolutionContext::learning_rate was not given" \
  --config="$tmp/auto_lr.json" --dry_run

if (( failures > 0 )); then echo "$failures failure(s)"; exit 1; fi
echo "train_gpt bad configs: ok"
