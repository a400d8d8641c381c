#!/bin/bash
# parity_test.sh WORLD PARITY_MAIN RUN_MPI [--device=cpu|cuda]
# Runs the world-size-1 references, then the full matrix at WORLD ranks under
# mpirun, then compares. Exits non-zero on any mismatch.
set -euo pipefail
world="$1"; program="$2"; run_mpi="$3"; device="${4:---device=cpu}"
out="${TEST_TMPDIR:-$(mktemp -d)}/parity_w${world}"
mkdir -p "$out"
export MPI_TEST_TIMEOUT="${MPI_TEST_TIMEOUT:-800}"
"$run_mpi" 1 "$program" run --out="$out" --configs=reference "$device"
if [[ "$world" != 1 ]]; then
  "$run_mpi" "$world" "$program" run --out="$out" "$device"
else
  "$run_mpi" 1 "$program" run --out="$out" "$device"
fi
"$program" compare --dir="$out" --world="$world" "$device"
