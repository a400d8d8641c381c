#!/usr/bin/env bash
# The main job: builds the example and runs it through mpirun on this
# machine's CPUs (or GPUs, where present).
#
# Usage: tools/demo.sh [number of ranks, default 4]
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh

ranks="${1:-4}"
bazel build //examples:comm_demo 2>&1 | grep -v linux-sandbox | tail -2
binary="$(bazel info bazel-bin 2>/dev/null)/examples/comm_demo"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export NCCL_NVLS_ENABLE=0
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
exec mpirun --oversubscribe --bind-to none -np "${ranks}" "${binary}"
