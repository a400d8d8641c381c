#!/bin/bash
# checkpoint_test.sh PROGRAM RUN_MPI GROUP
# Separate mpirun jobs that train, save and resume through the public API
# (checkpoint_main). GROUP:
#   exact    10-step-style exactness: train [0,6) straight; train [0,3), save,
#            then a new job loads and trains [3,6): losses and final weights
#            bit for bit equal, at several world sizes, stages, offloads, bf16.
#   reshard  save at one (world size, stage, offload), resume at another:
#            within f32 parity tolerance of a straight single-rank stage-0 run.
#   crash    a rank is SIGKILLed in the middle of writing its file of a
#            save; a new job loads `latest` and gets the previous checkpoint.
set -euo pipefail
program="$1"; run_mpi="$2"; group="$3"
out="${TEST_TMPDIR:-$(mktemp -d)}/checkpoint_${group}"
rm -rf "$out"; mkdir -p "$out"
export MPI_TEST_TIMEOUT="${MPI_TEST_TIMEOUT:-120}"
train() { local np="$1"; shift; "$run_mpi" "$np" "$program" train "$@"; }
compare() { "$program" compare "$@"; }

case "$group" in
exact)
  for spec in "1 0 none f32" "2 1 none f32" "3 2 cpu f32" "2 3 none f32" \
              "3 3 nvme f32" "2 2 none bf16" "2 3 cpu bf16"; do
    read -r np stage offload dtype <<< "$spec"
    name="w${np}_s${stage}_${offload}_${dtype}"
    common=(--stage="$stage" --offload="$offload" --dtype="$dtype")
    train "$np" "${common[@]}" --from=0 --to=6 --out="$out/$name.straight"
    train "$np" "${common[@]}" --from=0 --to=3 --save="$out/$name.ckpt" \
      --out="$out/$name.first"
    train "$np" "${common[@]}" --from=3 --to=6 --load="$out/$name.ckpt" \
      --out="$out/$name.resumed"
    compare --a="$out/$name.resumed" --b="$out/$name.straight" --exact
  done
  ;;
reshard)
  train 1 --stage=0 --from=0 --to=6 --out="$out/reference"
  # Savers: world size, stage, offload.
  for spec in "4 3 none" "3 1 none" "1 0 none" "2 2 cpu" "3 3 nvme" "2 0 none"; do
    read -r np stage offload <<< "$spec"
    train "$np" --stage="$stage" --offload="$offload" --from=0 --to=3 \
      --save="$out/ckpt_w${np}_s${stage}_${offload}" --out="$out/saved_w${np}_s${stage}_${offload}"
  done
  # Loaders: saved checkpoint -> world size, stage, offload.
  for pair in "w4_s3_none 3 1 none" "w3_s1_none 1 0 none" "w1_s0_none 4 3 none" \
              "w2_s2_cpu 3 3 none" "w3_s3_nvme 2 2 cpu" "w2_s0_none 4 2 none" \
              "w4_s3_none 2 0 none" "w3_s1_none 3 3 cpu" "w1_s0_none 2 1 none" \
              "w2_s2_cpu 1 3 nvme"; do
    read -r saved np stage offload <<< "$pair"
    name="${saved}_to_w${np}_s${stage}_${offload}"
    train "$np" --stage="$stage" --offload="$offload" --from=3 --to=6 \
      --load="$out/ckpt_${saved}" --out="$out/$name"
    compare --a="$out/$name" --b="$out/reference" --tolerance=1e-5
  done
  # Weights only: the optimizer state is left as a fresh engine has it, so
  # the run differs from the reference but still starts from its weights.
  train 2 --stage=3 --from=3 --to=4 --load="$out/ckpt_w2_s2_cpu" --weights_only \
    --out="$out/weights_only"
  ;;
crash)
  # Rank 1 dies 1 MB into its ~10 MB rank file, rank 0 at its first byte
  # past the header (4 KB).
  for spec in "1 1000000" "0 4096"; do
    read -r victim bytes <<< "$spec"
    dir="$out/ckpt_victim${victim}"
    if train_output=$("$run_mpi" 2 "$program" kill_during_save --save="$dir" \
        --stage=3 --victim="$victim" --kill_after_bytes="$bytes" 2>&1); then
      echo "$train_output" | tail -20
      echo "FAIL: the job that was killed mid-save exited 0"; exit 1
    fi
    echo "$train_output" | grep -q "killing itself mid-save" ||
      { echo "$train_output" | tail -20; echo "FAIL: no kill happened"; exit 1; }
    latest=$(cat "$dir/latest")
    [[ "$latest" == "first" ]] || { echo "FAIL: latest is '$latest'"; exit 1; }
    # A fresh job loads `latest` (the tag before the crash) and trains on.
    train 2 --stage=3 --channels=256 --from=2 --to=3 --load="$dir" --out="$out/after_crash_$victim"
    [[ -d "$dir/.second.partial" && ! -e "$dir/second" ]] ||
      { echo "FAIL: the killed save is not left as an incomplete partial"; exit 1; }
    echo "ok: rank $victim killed at byte $bytes of its file; latest = first, and it loads"
  done
  ;;
*) echo "unknown group $group"; exit 2 ;;
esac
echo "checkpoint $group: all passed"
