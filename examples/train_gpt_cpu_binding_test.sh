#!/bin/bash
# train_gpt_cpu_binding_test.sh TRAIN_GPT CONFIG
# A process confined to one CPU (as Open MPI's default bind-to-core confines
# each of up to two ranks) trains with CPU offload on that one CPU, and says
# so: Initialize warns, naming the counts and --bind-to none, instead of
# running the CPU optimizer step on one core silently. Unconfined, no
# warning. Skipped (exit 0 with a note) on a one-CPU machine or without
# taskset.
set -euo pipefail
train="$1"; config="$2"
cpus=$(nproc --all)
if ((cpus < 2)) || ! command -v taskset >/dev/null; then
  echo "SKIP: needs taskset and at least 2 CPUs (have ${cpus})"; exit 0
fi
out="${TEST_TMPDIR:-$(mktemp -d)}/cpu_binding"
mkdir -p "$out"
run() {  # [taskset prefix...]; the run must end normally (0, or 1: no fall)
  local status=0
  "$@" "$train" --config="$config" --device=cpu --steps=5 --seq=16 \
    --progress=log >"$out/run.txt" 2>&1 || status=$?
  if ((status > 1)); then
    cat "$out/run.txt" >&2; echo "FAIL: train_gpt exited $status" >&2; exit 1
  fi
}
run taskset -c 0
expected="the launcher bound this process to 1 of the host's ${cpus} CPUs (1 rank here), so the CPU optimizer runs on 1; mpirun --bind-to none lets it use ${cpus}"
if ! grep -qF "$expected" "$out/run.txt"; then
  cat "$out/run.txt" >&2; echo "FAIL: no warning: $expected" >&2; exit 1
fi
grep -F "the launcher bound" "$out/run.txt"
run env
if grep -q "the launcher bound" "$out/run.txt"; then
  cat "$out/run.txt" >&2; echo "FAIL: warned without a binding" >&2; exit 1
fi
echo "train_gpt CPU binding warning: ok"
