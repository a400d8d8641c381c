#!/bin/bash
# clipping_test.sh CLIPPING_MAIN RUN_MPI
# Runs clipping_main at world sizes 1, 2 and 3 (each checks that clipping
# limits the update), then compares the reported grad norms across all of
# them and stages 0-2.
set -euo pipefail
program="$1"; run_mpi="$2"
out="${TEST_TMPDIR:-$(mktemp -d)}/clipping"
mkdir -p "$out"
for world in 1 2 3; do
  "$run_mpi" "$world" "$program" run --out="$out"
done
"$program" compare --dir="$out" --worlds=1,2,3
