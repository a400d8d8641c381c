#!/bin/bash
# skip_collective_test.sh NP PROGRAM [ARGS...]: runs skip_collective_main
# under mpirun with a 3 s timeout and checks that every rank but the skipper
# reported the named DeadlineExceeded error, that the job exited non-zero,
# and that it ended well before it could be called a hang.
set -u
np="$1"
shift
here="$(dirname "$0")"
timeout_s=3
log="${TEST_TMPDIR:-/tmp}/skip_collective.log"
start=$(date +%s)
MPI_TEST_TIMEOUT=60 "$here/run_mpi.sh" "$np" "$@" --timeout=$timeout_s >"$log" 2>&1
code=$?
elapsed=$(( $(date +%s) - start ))
cat "$log"
fail() { echo "FAIL: $*"; exit 1; }
[ "$code" -ne 0 ] || fail "mpirun exited 0; a skipped collective must fail the job"
[ "$code" -ne 124 ] && [ "$code" -ne 137 ] || fail "mpirun hung (killed by the outer timeout)"
[ "$elapsed" -le 25 ] || fail "took ${elapsed}s; the timeout is ${timeout_s}s"
for ((r = 0; r < np - 1; r++)); do
  grep -q "^rank $r: DEADLINE_EXCEEDED: rank $r of $np: collective all_reduce(sum) #2: 53 x bf16 (mpi backend) did not complete within" "$log" \
    || fail "rank $r did not report DeadlineExceeded naming all_reduce #2"
  grep -q "^rank $r: after the timeout: FAILED_PRECONDITION" "$log" \
    || fail "rank $r's communicator accepted work after the timeout"
done
grep -q "recent collectives on rank 0" "$log" || fail "no dump of recent collectives"
grep -q "rank 0: all_reduce(sum) #2: 53 x bf16 PENDING" "$log" || fail "dump lacks the pending #2"
echo "PASS: $((np - 1)) rank(s) timed out naming collective #2; exit code $code after ${elapsed}s"
