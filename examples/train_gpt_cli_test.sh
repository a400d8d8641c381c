#!/bin/bash
# train_gpt_cli_test.sh TRAIN_GPT RUN_MPI CONFIG TEXT_FILE
# The trainer's command-line contract (issue 24, section 3): every mistake
# is refused early with its exit status and a message naming it.
#   exit 0: a finished run (also one whose loss falls slowly), --help
#   exit 1: only a failed acceptance the command line asked for
#   exit 2: bad input: unknown flags, bad values, an unusable --save_dir,
#           --resume without a checkpoint, a micro-batch too large to allocate
set -euo pipefail
train="$(realpath "$1")"; run_mpi="$(realpath "$2")"
config="$(realpath "$3")"; text="$(realpath "$4")"
out="${TEST_TMPDIR:-$(mktemp -d)}/train_gpt_cli"
rm -rf "$out"; mkdir -p "$out"
quick=(--config="$config" --device=cpu --steps=5 --eval_problems=8)

# expect STATUS NAME COMMAND...: runs COMMAND, output in $out/NAME.txt;
# fails unless it exits with STATUS.
expect() {
  local want="$1" name="$2"; shift 2
  local status=0
  "$@" >"$out/$name.txt" 2>&1 || status=$?
  if [[ "$status" != "$want" ]]; then
    cat "$out/$name.txt"
    echo "FAIL: $name: exit status $status, expected $want: $*"
    exit 1
  fi
  echo "== $name: exit $status"
}
# has NAME PATTERN: $out/NAME.txt contains PATTERN (a fixed string).
has() {
  if ! grep -qF -- "$2" "$out/$1.txt"; then
    cat "$out/$1.txt"
    echo "FAIL: $1: expected \"$2\" in the output above"
    exit 1
  fi
}
lacks() {
  if grep -qF -- "$2" "$out/$1.txt"; then
    cat "$out/$1.txt"
    echo "FAIL: $1: unexpected \"$2\" in the output above"
    exit 1
  fi
}

# --- Exit codes.
expect 2 unknown_flag "$train" "${quick[@]}" --no_such_flag=1
has unknown_flag "unknown flag --no_such_flag"
expect 2 bad_value "$train" "${quick[@]}" --steps=many
has bad_value "--steps=many"
expect 2 bad_bool "$train" "${quick[@]}" --resume=if_present --save_dir="$out/x"
has bad_bool "--resume=if_present"
expect 2 bad_head_mode "$train" "${quick[@]}" --head_weight_gradient=sideways
has bad_head_mode "--head_weight_gradient=sideways: use forward or backward"
expect 0 help "$train" --help
has help "--resume_if_present"
has help "--min_loss_drop"
# Five steps at a tiny learning rate: the loss hardly moves, and that is a
# finished run (exit 0) unless a loss drop was asked for.
sed 's/"warmup_max_lr": 3e-3/"warmup_max_lr": 1e-9/; s/"lr": 3e-3/"lr": 1e-9/' \
  "$config" > "$out/slow.json"
expect 0 slow "$train" --config="$out/slow.json" --device=cpu --steps=5 \
  --eval_problems=8
has slow "train_gpt: tiny, 1 rank, ZeRO stage 2"
lacks slow "FAILED"
expect 1 slow_checked "$train" --config="$out/slow.json" --device=cpu \
  --steps=5 --eval_problems=8 --min_loss_drop=0.1
has slow_checked "FAILED, the loss"
has slow_checked "(--min_loss_drop 10%)"

# --- The batch triple in one order (micro x accumulation x ranks), as
# Initialize prints it, and plurals.
expect 0 triple "$run_mpi" 2 "$train" "${quick[@]}"
has triple "batch 4 x 1 x 2 = 8 (micro x accumulation x ranks)"
has triple "2 ranks on cpu, 5 steps of 4 x 1 x 2 (micro x accumulation x ranks)"
lacks triple "1 ranks"

# --- The default --config from another directory: the runfiles' copy
# (Bazel sets RUNFILES_DIR); a binary without runfiles says how to pass one.
(cd "$out" && expect 0 default_config "$train" --device=cpu --steps=5 \
  --eval_problems=8)
mkdir -p "$out/bare"; cp "$train" "$out/bare/train_gpt"
(cd "$out" && expect 2 no_default_config env -u RUNFILES_DIR \
  -u RUNFILES_MANIFEST_FILE "$out/bare/train_gpt" --device=cpu --steps=5)
has no_default_config "pass --config=PATH"

# --- --save_dir refused at start, on every rank, before any step: the
# Initialize line (which comes before any step) must not appear.
touch "$out/a_file"
expect 2 save_under_file "$run_mpi" 2 "$train" "${quick[@]}" \
  --save_dir="$out/a_file/ckpt"
has save_under_file "--save_dir=$out/a_file/ckpt: cannot create the checkpoint directory on rank 0: Not a directory"
has save_under_file "--save_dir=$out/a_file/ckpt: cannot create the checkpoint directory on rank 1: Not a directory"
lacks save_under_file "ZeRO stage 2, world size"
# A read-only file system (root may write anywhere else) and one too small
# for a checkpoint (the tiny model's takes about 11 MiB), each a tmpfs in a
# private mount namespace.
if unshare -rm true 2>/dev/null; then
  mkdir -p "$out/ro" "$out/small"
  expect 2 save_read_only unshare -rm bash -c \
    'mount -t tmpfs -o ro tmpfs "$1" && shift && "$@"' _ "$out/ro" \
    "$run_mpi" 2 "$train" "${quick[@]}" --save_dir="$out/ro"
  has save_read_only "--save_dir=$out/ro: cannot write a file there on rank 1: Read-only file system"
  lacks save_read_only "ZeRO stage 2, world size"
  expect 2 save_no_space unshare -rm bash -c \
    'mount -t tmpfs -o size=1m tmpfs "$1" && shift && "$@"' _ "$out/small" \
    "$run_mpi" 2 "$train" "${quick[@]}" --save_dir="$out/small/ckpt"
  has save_no_space "its file system has 1.0 MiB free on rank 0, but one checkpoint of this model and config takes about 11.1 MiB"
  lacks save_no_space "ZeRO stage 2, world size"
else
  echo "== read-only and full file systems: skipped (unshare -rm is not allowed here)"
fi

# --- --resume, --resume_if_present, --resume_tag.
expect 2 resume_none "$train" "${quick[@]}" --save_dir="$out/ckpt" --resume
has resume_none "--resume: no checkpoint in --save_dir=$out/ckpt (no $out/ckpt/latest)"
expect 0 resume_if_present "$train" "${quick[@]}" --save_dir="$out/ckpt" \
  --resume_if_present --steps=10 --save_every=5
lacks resume_if_present "resumed from"
[[ "$(cat "$out/ckpt/latest")" == "global_step10" ]]
# The checkpoint is about what the --save_dir check expects.
du -sb "$out/ckpt/global_step10"
expect 0 resume_tag "$train" "${quick[@]}" --save_dir="$out/ckpt" \
  --resume_tag=global_step5 --steps=8
has resume_tag "resumed from $out/ckpt/global_step5 (saved by 1 rank at ZeRO stage 2), continuing at step 5"
[[ "$(cat "$out/ckpt/latest")" == "global_step8" ]]
expect 2 resume_tag_missing "$train" "${quick[@]}" --save_dir="$out/ckpt" \
  --resume_tag=global_step99
has resume_tag_missing "--resume_tag=global_step99: no checkpoint $out/ckpt/global_step99"
expect 2 resume_both "$train" "${quick[@]}" --save_dir="$out/ckpt" --resume \
  --resume_if_present
has resume_both "give one of them"

# --- A micro-batch too large to allocate: ResourceExhausted with the bytes
# asked for (2^40 rows of 64 int32 tokens: 2^48 bytes), exit 2.
sed 's/"train_micro_batch_size_per_gpu": 4/"train_micro_batch_size_per_gpu": 1099511627776/' \
  "$config" > "$out/huge.json"
expect 2 huge_batch "$train" --config="$out/huge.json" --device=cpu --steps=5 \
  --seq=64
has huge_batch "RESOURCE_EXHAUSTED"
has huge_batch "request of 281474976710656 bytes"

# --- --prompt: the addition task answers it; a text file continues it;
# token files take ids.
expect 0 prompt_addition "$train" "${quick[@]}" --prompt="123+456="
has prompt_addition '--prompt "123+456=" -> "'
expect 0 prompt_text "$train" "${quick[@]}" --data="text:$text" --seq=32 \
  --prompt="int main"
has prompt_text '"int main" -> "'
python3 -c "
import struct, sys
open(sys.argv[1], 'wb').write(struct.pack('<2000H', *[i % 50 for i in range(2000)]))
" "$out/tokens.bin"
expect 0 prompt_tokens "$train" "${quick[@]}" --data="$out/tokens.bin" \
  --seq=16 --prompt="1 2 3"
has prompt_tokens "--prompt [1 2 3] -> ["
expect 2 prompt_bad_token "$train" "${quick[@]}" --data="$out/tokens.bin" \
  --seq=16 --prompt="1 2 x"
has prompt_bad_token "--prompt: 'x' is not a token id in [0, 50)"
# --- --layers, --heads, --channels reshape tiny (the demo's shape) and
# nothing else; the start line says the shape trained.
expect 0 reshaped "$train" "${quick[@]}" --layers=2 --heads=8 --channels=64
has reshaped "model tiny (2 layers, 8 heads, 64 channels;"
expect 2 reshape_preset "$train" "${quick[@]}" --model=124M --layers=2
has reshape_preset "--layers, --heads and --channels reshape --model=tiny only; --model=124M has its own shape"
expect 2 reshape_uneven "$train" "${quick[@]}" --heads=3
has reshape_uneven "num_heads"
echo "train_gpt command line: ok"
