#!/bin/bash
# check_config_test.sh CHECK_CONFIG REALWORLD_DIR
# check_config's command line: --help, exit status 0 for a valid config and
# 2 for bad input (bad arguments, an invalid config, a directory, a number
# that overflows a double) with a message naming the file and the key, and
# warnings on stderr for keys accepted and ignored.
set -uo pipefail
check="$1"; corpus="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0

# expect STATUS PATTERN ARGS...: runs check_config ARGS, checks the exit
# status and that stdout+stderr match PATTERN (grep -E).
expect() {
  local want="$1" pattern="$2"; shift 2
  local output status
  output=$("$check" "$@" 2>&1); status=$?
  if [[ "$status" != "$want" ]] || ! grep -qE -- "$pattern" <<<"$output"; then
    echo "FAIL: check_config $* exited $status (want $want), output:"
    echo "$output" | head -20
    echo "(wanted a line matching: $pattern)"
    failures=$((failures + 1))
  else
    echo "ok: check_config $* -> $status"
  fi
}

expect 0 "^usage: .*CONFIG.json \[WORLD_SIZE\]" --help
expect 0 "Exit status: 0 the config is valid; 2 bad input" -h
expect 2 "^usage:"
expect 2 "^usage:" --bogus_flag
expect 2 "WORLD_SIZE must be a positive integer, got \"two\"" \
  "$corpus/QwenLM__Qwen__finetune_ds_config_zero2.json" two

# A directory says so.
expect 2 "^$tmp: is a directory, not a config file" "$tmp"

# A number that overflows a double names the file and the key (it used to
# abort with an uncaught nlohmann exception).
echo '{"train_batch_size": 8, "zero_optimization": {"stage": 1,
       "reduce_bucket_size": 1e999}}' > "$tmp/overflow.json"
expect 2 "^$tmp/overflow.json: number out of range at zero_optimization.reduce_bucket_size" \
  "$tmp/overflow.json"

# A file DeepSpeed 0.19.8 rejects is rejected naming the key.
expect 2 "ds_zero2_no_offload.json: .*at fp16.min_loss_scale" \
  "$corpus/ymcui__Chinese-LLaMA-Alpaca__scripts_training_ds_zero2_no_offload.json" 2

# A file DeepSpeed accepts loads; what it ignores is a warning naming the key.
expect 0 "^warning: .*ds_z0_config.json: zero_allow_untested_optimizer is ignored: " \
  "$corpus/hiyouga__LLaMA-Factory__examples_deepspeed_ds_z0_config.json" 2
expect 0 "^warning: .*: zero_optimization.cpu_offload is deprecated by DeepSpeed" \
  "$corpus/THUDM__GLM__config_tasks_config_blocklm_10B.json" 8

if (( failures > 0 )); then echo "$failures failure(s)"; exit 1; fi
echo "check_config command line: ok"
