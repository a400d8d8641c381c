#!/bin/bash
# torch_comm_reference_test.sh SCRIPT TEST: the reference compiles, and its
# argument parsing, launcher variables, sweep and known-value arithmetic
# pass their tests (no torch needed).
set -eu
export PYTHONDONTWRITEBYTECODE=1
python3 -c 'import py_compile, sys
py_compile.compile(sys.argv[1], cfile=sys.argv[2], doraise=True)' \
  "$1" "${TEST_TMPDIR:-$(mktemp -d)}/torch_comm_reference.pyc"
exec python3 "$2"
