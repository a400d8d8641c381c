#!/bin/bash
# Runs a program with no launcher (no OMPI_* variables): rank 0 of 1.
set -u
for var in $(env | grep -o '^OMPI_[A-Z_]*'); do unset "$var"; done
exec timeout --kill-after=5 60 "$@"
