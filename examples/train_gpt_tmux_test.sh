#!/bin/bash
# train_gpt_tmux_test.sh TRAIN_GPT RUN_MPI CONFIG
# A person's terminal, through tmux: the main job runs in a detached tmux
# pane (2 ranks under mpirun, --progress=line) and the pane is captured
# twice (tmux capture-pane -p) while it trains. Each capture must show the
# progress line exactly once, the second at a later step: one line updated
# in place, not a new line per update.
set -euo pipefail
train="$1"; run_mpi="$2"; config="$3"
if ! command -v tmux >/dev/null; then
  echo "FAIL: tmux is not installed (tools/install_deps.sh installs it)"
  exit 1
fi
out="${TEST_TMPDIR:-$(mktemp -d)}/train_gpt_tmux"
rm -rf "$out"; mkdir -p "$out"
# A socket path must fit in 108 bytes, which Bazel's TEST_TMPDIR may not.
socket_dir="$(mktemp -d /tmp/ze_tmux.XXXXXX)"
socket="$socket_dir/sock"
export TERM="${TERM:-xterm}"
[[ "$TERM" == dumb ]] && export TERM=xterm
steps=2000
# The pane stays open after the run so that a failure can be looked at.
tmux -S "$socket" new-session -d -x 160 -y 40 \
  "'$run_mpi' 2 '$train' --config='$config' --device=cpu --steps=$steps \
   --progress=line; echo TRAINER_EXITED; sleep 600"
# run_mpi.sh's `timeout` puts mpirun in a process group of its own, which
# the pane's hang-up does not reach: the pane's processes are ended by id.
descendants() {
  local child
  for child in $(ps -o pid= --ppid "$1"); do
    echo "$child"; descendants "$child"
  done
}
cleanup() {
  local pane_pid
  pane_pid="$(tmux -S "$socket" display-message -p '#{pane_pid}' 2>/dev/null)" || true
  if [[ -n "$pane_pid" ]]; then
    kill $(descendants "$pane_pid") 2>/dev/null || true
  fi
  tmux -S "$socket" kill-server 2>/dev/null || true
  rm -rf "$socket_dir"
}
trap cleanup EXIT

progress_pattern="^step [0-9]+/$steps \| loss [0-9.]+ \| .* tok/s \| ETA .* \| mem "
capture() { tmux -S "$socket" capture-pane -p -J; }
step_of() { grep -E "$progress_pattern" | sed -E 's/^step ([0-9]+)\/.*/\1/'; }

# Wait (up to a minute) for the first progress line.
for _ in $(seq 120); do
  if capture | grep -Eq "$progress_pattern"; then break; fi
  if capture | grep -q TRAINER_EXITED; then break; fi
  sleep 0.5
done
first="$(capture)"
sleep 2
second="$(capture)"
echo "--- first capture:"; echo "$first"
echo "--- second capture:"; echo "$second"
for pane in "$first" "$second"; do
  lines=$(echo "$pane" | grep -Ec "$progress_pattern" || true)
  if [[ "$lines" != 1 ]]; then
    echo "FAIL: $lines progress lines in one capture, expected exactly 1"
    exit 1
  fi
  if echo "$pane" | grep -q TRAINER_EXITED; then
    echo "FAIL: the trainer ended before both captures"
    exit 1
  fi
done
step1=$(echo "$first" | step_of); step2=$(echo "$second" | step_of)
if ((step2 <= step1)); then
  echo "FAIL: the progress line did not advance (step $step1, then $step2)"
  exit 1
fi
# Nothing else was printed between the captures: the line changed in place.
if [[ "$(echo "$first" | grep -Ev "$progress_pattern")" != \
      "$(echo "$second" | grep -Ev "$progress_pattern")" ]]; then
  echo "FAIL: other lines changed between the captures"
  exit 1
fi
echo "train_gpt tmux: the progress line went from step $step1 to $step2 in place: ok"
