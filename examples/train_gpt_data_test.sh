#!/bin/bash
# train_gpt_data_test.sh TRAIN_GPT RUN_MPI CONFIG TEXT_FILE
# --data from files at 2 ranks: a text file read as bytes and a nanoGPT
# uint16 token file must train (the loss falls) and evaluate (validation
# loss and a sample); a uint32 token file (tokens32:) is read as such at
# 1 rank, its validation loss over 11 windows (--eval_windows); bad files are refused with errors naming them.
set -euo pipefail
train="$1"; run_mpi="$2"; config="$3"; text="$4"
out="${TEST_TMPDIR:-$(mktemp -d)}/train_gpt_data"
rm -rf "$out"; mkdir -p "$out"
common=(--config="$config" --device=cpu --steps=20 --eval_every=10 --min_loss_drop=0.1)

"$run_mpi" 2 "$train" "${common[@]}" --data="text:$text" >"$out/text.txt" 2>&1 \
  || { cat "$out/text.txt"; exit 1; }
grep "^eval\|^train_gpt" "$out/text.txt"
grep -q "eval at step 10: validation loss" "$out/text.txt"
grep -q "OK, the loss fell" "$out/text.txt"

# 20000 tokens of a repeating pattern below 500.
python3 -c "
import struct, sys
tokens = [(i * 7) % 500 for i in range(20000)]
open(sys.argv[1], 'wb').write(struct.pack('<%dH' % len(tokens), *tokens))
" "$out/tokens.bin"
"$run_mpi" 2 "$train" "${common[@]}" --data="$out/tokens.bin" --seq=32 \
  >"$out/tokens.txt" 2>&1 || { cat "$out/tokens.txt"; exit 1; }
grep "^eval\|^train_gpt\|sampled" "$out/tokens.txt"
grep -q "20000 uint16 tokens, largest 499" "$out/tokens.txt"
grep -q "sampled token ids" "$out/tokens.txt"
grep -q "OK, the loss fell" "$out/tokens.txt"

# The same tokens as uint32 (what tools/write_tokens.py writes for
# vocabularies above 65,535; ids above it are tested in train_data_test).
python3 -c "
import struct, sys
tokens = [(i * 7) % 500 for i in range(20000)]
open(sys.argv[1], 'wb').write(struct.pack('<%dI' % len(tokens), *tokens))
" "$out/tokens32.bin"
# --eval_windows=11: the validation loss from a batch of 8 windows and one
# of 3.
"$train" --config="$config" --device=cpu --steps=5 --seq=32 --eval_windows=11 \
  --data="tokens32:$out/tokens32.bin" >"$out/tokens32.txt" 2>&1 \
  || { cat "$out/tokens32.txt"; exit 1; }
grep "^eval\|^train_gpt" "$out/tokens32.txt"
grep -q "20000 uint32 tokens, largest 499" "$out/tokens32.txt"
grep -q "sampled token ids" "$out/tokens32.txt"
grep -q "eval at step 5: validation loss [0-9]" "$out/tokens32.txt"

expect_error() {  # pattern, train_gpt flags...
  local pattern="$1"; shift
  local status=0
  message=$("$train" --config="$config" --device=cpu "$@" 2>&1) || status=$?
  echo "$message" | tail -1
  [[ $status == 2 ]] && grep -q -- "$pattern" <<<"$message" \
    || { echo "FAIL: expected exit 2 and '$pattern'"; exit 1; }
}
printf 'abc' >"$out/odd.bin"
expect_error "odd.bin has 3 bytes, not a multiple of 2" --data="$out/odd.bin"
printf 'abcdef' >"$out/ragged32.bin"
expect_error "ragged32.bin has 6 bytes, not a multiple of 4: not a uint32" \
  --data="tokens32:$out/ragged32.bin"
expect_error "cannot open the text file $out/none.txt" --data="$out/none.txt"
printf 'short' >"$out/short.txt"
expect_error "short.txt holds 5 tokens; --seq=64 needs at least 650" \
  --data="text:$out/short.txt"
expect_error "--data=corpus.csv: use addition" --data=corpus.csv
expect_error "--eval_windows=0: need >= 1" --eval_windows=0 --data="$out/tokens.bin"
echo "train_gpt data: ok"
