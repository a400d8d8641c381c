#!/bin/bash
# Runs a program under a real mpirun: run_mpi.sh NP PROGRAM [ARGS...]
# Exits with mpirun's status; an outer timeout makes a hang a failure.
set -u
np="$1"
shift
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# Shared memory and loopback only; no cross-process memory attach (ptrace is
# often restricted in containers and sandboxes).
export OMPI_MCA_btl=self,vader
export OMPI_MCA_btl_vader_single_copy_mechanism=none
# Bazel runs tests in parallel, each in its own PID namespace, so two mpiruns
# can get the same PID and with it the same job id; their session files and
# shared-memory segments must not meet in the shared /tmp and /dev/shm.
session_dir="$(mktemp -d /tmp/ze_mpi.XXXXXX)"
trap 'rm -rf "$session_dir"' EXIT
export OMPI_MCA_orte_tmpdir_base="$session_dir"
export OMPI_MCA_btl_vader_backing_directory="$session_dir"
export ZE_COMM_TIMEOUT_SECONDS="${ZE_COMM_TIMEOUT_SECONDS:-15}"
export ZE_LOG_LEVEL="${ZE_LOG_LEVEL:-INFO}"
# Ranks sharing a GPU must ask (gpu tests on one GPU set it; see
# tools/mpi_test.bzl); passed on only when set, so the default stays "refuse".
forward=(-x ZE_COMM_TIMEOUT_SECONDS -x ZE_LOG_LEVEL)
[[ -n "${ZE_ALLOW_GPU_SHARING+set}" ]] && forward+=(-x ZE_ALLOW_GPU_SHARING)
timeout --kill-after=5 "${MPI_TEST_TIMEOUT:-100}" \
  mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$np" \
  "${forward[@]}" "$@"
