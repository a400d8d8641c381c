#!/bin/bash
# train_gpt_nvme_swap_test.sh TRAIN_GPT CONFIG
# The NVMe tier's swap file never outlives its job and is never taken from a
# live one: train_gpt at stage 3 with offload_optimizer on NVMe (a temporary
# nvme_path), stopped mid-run by
#   SIGTERM, SIGINT -> it ends by that signal (exit 143, 130) and the swap
#                      file is gone;
#   SIGKILL         -> the file stays; the next run warns naming it (stale),
#                      takes it over, finishes and removes it;
# and a swap file held (flock) by another live process -> the run fails
# naming the file, whose contents stay untouched.
set -euo pipefail
set -m  # job control: background jobs keep SIGINT's default action
train="$1"; config="$2"
out="${TEST_TMPDIR:-$(mktemp -d)}/train_gpt_nvme_swap"
rm -rf "$out"; mkdir -p "$out/nvme"
python3 - "$config" "$out/nvme" > "$out/nvme.json" <<'PY'
import json, sys
config = json.load(open(sys.argv[1]))
zero = config.setdefault("zero_optimization", {})
zero["stage"] = 3
zero["offload_optimizer"] = {"device": "nvme", "nvme_path": sys.argv[2]}
print(json.dumps(config, indent=1))
PY
swap="$out/nvme/zero_engine_rank0_optimizer_state.swp"
common=(--config="$out/nvme.json" --device=cpu --seq=32)

# Starts a long run in the background (pid in $run) and waits until it has
# made its swap file and trained a few steps.
start_long_run() {
  "$train" "${common[@]}" --steps=100000 --eval_every=0 >"$out/$1.log" 2>&1 &
  run=$!
  for _ in $(seq 600); do
    [[ -e "$swap" ]] && grep -q "step" "$out/$1.log" && break
    kill -0 "$run" 2>/dev/null || { cat "$out/$1.log"; echo "FAIL: $1: run ended early"; exit 1; }
    sleep 0.1
  done
  [[ -e "$swap" ]] || { echo "FAIL: $1: no swap file $swap"; exit 1; }
  sleep 0.5  # mid-step, with swap I/O in flight
}

stop_with() {  # stop_with SIGNAL EXPECTED_STATUS
  start_long_run "$1"
  kill -s "$1" "$run"
  local status=0
  wait "$run" || status=$?
  if [[ "$status" != "$2" ]]; then
    tail -5 "$out/$1.log"; echo "FAIL: $1: exit status $status, expected $2"; exit 1
  fi
  if [[ -n "$(ls -A "$out/nvme")" ]]; then
    ls -l "$out/nvme"; echo "FAIL: $1 left files in nvme_path"; exit 1
  fi
  echo "$1: exit $status, no swap file left"
}
stop_with TERM 143
stop_with INT 130

# SIGKILL: nothing can run; the next job recognises the leftover.
start_long_run KILL
kill -s KILL "$run"
wait "$run" || true
[[ -e "$swap" ]] || { echo "FAIL: the killed run's swap file is gone?"; exit 1; }
"$train" "${common[@]}" --steps=5 >"$out/after_kill.log" 2>&1 || {
  cat "$out/after_kill.log"; echo "FAIL: the run after SIGKILL failed"; exit 1; }
grep "stale" "$out/after_kill.log" | grep -qF "$swap" || {
  cat "$out/after_kill.log"; echo "FAIL: no warning naming the stale file"; exit 1; }
[[ ! -e "$swap" ]] || { echo "FAIL: the run after SIGKILL left $swap"; exit 1; }
echo "SIGKILL: the next run warned about the stale file and removed it"

# A live process holds the file: the job refuses it and leaves it alone.
echo "another job's state" > "$swap"
python3 -c '
import fcntl, sys, time
f = open(sys.argv[1], "r+")
fcntl.flock(f, fcntl.LOCK_EX)
open(sys.argv[2], "w").close()
time.sleep(300)' "$swap" "$out/locked" &
holder=$!
trap 'kill "$holder" 2>/dev/null || true' EXIT
for _ in $(seq 100); do [[ -e "$out/locked" ]] && break; sleep 0.1; done
status=0
"$train" "${common[@]}" --steps=5 >"$out/locked.log" 2>&1 || status=$?
[[ "$status" != 0 ]] || { echo "FAIL: a run used a swap file held by a live process"; exit 1; }
grep -F "$swap" "$out/locked.log" | grep -q "in use by another live process" || {
  cat "$out/locked.log"; echo "FAIL: the error does not name the file in use"; exit 1; }
[[ "$(cat "$swap")" == "another job's state" ]] || { echo "FAIL: the held file was changed"; exit 1; }
kill -0 "$holder"
echo "a held swap file: refused by name (exit $status), untouched"
echo "train_gpt nvme swap files: ok"
