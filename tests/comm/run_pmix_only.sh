#!/bin/bash
# Runs a program under mpirun as Slurm's `srun --mpi=pmix` would start it:
# Open MPI's OMPI_COMM_WORLD_* variables removed from every rank, PMIx's left.
# Each rank also gets ZE_TEST_EXPECTED_WORLD_SIZE=NP.
# Usage: run_pmix_only.sh NP PROGRAM [ARGS...]
set -u
np="$1"
shift
here="$(dirname "$0")"
exec "${here}/run_mpi.sh" "${np}" -x "ZE_TEST_EXPECTED_WORLD_SIZE=${np}" \
  env -u OMPI_COMM_WORLD_SIZE -u OMPI_COMM_WORLD_RANK \
  -u OMPI_COMM_WORLD_LOCAL_RANK -u OMPI_COMM_WORLD_LOCAL_SIZE \
  -u OMPI_COMM_WORLD_NODE_RANK "$@"
