#!/usr/bin/env bash
# tools/multi_gpu_bench.sh without a GPU: fake nvidia-smi, mpirun and bundle
# (train_bench, comm_bench, run_gpu_tests.sh, the test manifest and two
# multi-rank test runners), then bench/scaling_summary.py on what it wrote.
# Checks dry runs, result tagging, error lines for cases without a result
# (a failed stage at several ranks, a timeout, DeepSpeed missing), the
# budget, the G-rank test reruns and the summary. No torch needed.
#
# Usage: tools/multi_gpu_bench_test.sh [MULTI_GPU_BENCH SCALING_SUMMARY]
# (Bazel passes both paths; by hand they default to this checkout's.)
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
absolute() { echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }
script="$(absolute "${1:-${here}/multi_gpu_bench.sh}")"
summary="$(absolute "${2:-${here}/../bench/scaling_summary.py}")"
tmp="$(mktemp -d "${TEST_TMPDIR:-/tmp}/multi_gpu_bench_test.XXXXXX")"
[[ -n "${KEEP_TMP:-}" ]] || trap 'rm -rf "${tmp}"' EXIT
failures=0
checks=0
check() {  # check DESCRIPTION COMMAND...: counts a failure when COMMAND fails
  local what="$1"
  shift
  checks=$((checks + 1))
  if ! "$@"; then
    echo "FAILED: ${what}" >&2
    failures=$((failures + 1))
  fi
}
has() { grep -q -- "$2" "$1"; }
count() { grep -c -- "$2" "$1" || true; }
jq_py() {  # jq_py FILE PYTHON_EXPRESSION_OVER_rows: prints the expression
  python3 -c 'import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print(eval(sys.argv[2]))' "$1" "$2"
}

# ---------------------------------------------------------------- fakes
fakebin="${tmp}/bin"
bundle="${tmp}/gpu_bundle"
mkdir -p "${fakebin}" "${bundle}/bin" "${bundle}/lib"
cat > "${fakebin}/nvidia-smi" <<'EOF'
#!/bin/bash
n=${FAKE_GPUS:-8}
case "$1" in
  -L) for ((i = 0; i < n; i++)); do echo "GPU $i: NVIDIA H200 (UUID: GPU-fake-$i)"; done ;;
  topo) echo "fake topology: NV18 everywhere" ;;
  --query-compute-apps=*) [[ -f "${FAKE_LEFTOVER:-/nonexistent}" ]] && cat "${FAKE_LEFTOVER}" ;;
  *) for ((i = 0; i < n; i++)); do echo "NVIDIA H200"; done ;;
esac
EOF
# mpirun -np N [-x VAR | --bind-to X | --flag]... PROGRAM ARGS: runs PROGRAM
# once as rank 0 of N (the fakes print what rank 0 would).
cat > "${fakebin}/mpirun" <<'EOF'
#!/bin/bash
np=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    -np) np="$2"; shift 2 ;;
    -x | --bind-to) shift 2 ;;
    --*) shift ;;
    *) break ;;
  esac
done
echo "$np $*" >> "${FAKE_LOG:?}"
OMPI_COMM_WORLD_SIZE=$np OMPI_COMM_WORLD_RANK=0 exec "$@"
EOF
# train_bench: one line per stage; FAKE_FAIL="W:STAGE" fails that stage at W
# ranks (and stops, as the real one does at several ranks); FAKE_SLEEP_W=W
# hangs at W ranks.
cat > "${bundle}/bin/train_bench" <<'EOF'
#!/bin/bash
w=${OMPI_COMM_WORLD_SIZE:-1}
for a in "$@"; do case "$a" in --models=*) model=${a#*=} ;; --stages=*) stages=${a#*=} ;; esac; done
echo "train_bench: stderr noise" >&2
[[ "${FAKE_SLEEP_W:-}" == "$w" ]] && sleep 30
for s in ${stages//,/ }; do
  if [[ "${FAKE_FAIL:-}" == "$w:$s" ]]; then
    echo "{\"bench\":\"train_step\",\"model\":\"$model\",\"stage\":$s,\"world_size\":$w,\"error\":\"out of memory\"}"
    [[ $w -gt 1 ]] && exit 1
    continue
  fi
  wait_json=""
  [[ $s == 3 ]] && wait_json=",\"stage3\":{\"wait_fraction\":0.01,\"wait_ms\":2.5}"
  per_gpu=$((60000 - 1000 * s - 500 * w))
  echo "{\"bench\":\"train_step\",\"model\":\"$model\",\"stage\":$s,\"world_size\":$w,\"batch\":16,\"tokens_per_s_per_gpu\":$per_gpu,\"tokens_per_s\":$((per_gpu * w))$wait_json}"
done
EOF
cat > "${bundle}/bin/comm_bench" <<'EOF'
#!/bin/bash
w=${OMPI_COMM_WORLD_SIZE:-1}
for c in all_reduce reduce_scatter all_gather; do
  for b in 1048576 1073741824; do
    echo "{\"collective\":\"$c\",\"backend\":\"nccl\",\"dtype\":\"bf16\",\"bytes\":$b,\"world_size\":$w,\"time_us\":1.0,\"algbw_GBps\":100.0,\"busbw_GBps\":$((300 + w))}"
  done
done
EOF
cat > "${bundle}/run_gpu_tests.sh" <<'EOF'
#!/bin/bash
echo "PASSED core:ops_cuda_test (3s)"
echo "PASSED tests/engine:parity_cuda_w4_test (18s)"
echo "FAILED tests/comm:collectives_nccl_all_gpus_test (2s, exit 1); last lines:"
echo "    something broke"
echo "gpu tests: 2 passed, 1 failed"
mkdir -p "${OUT:?}/gpu_test_logs" && echo log > "${OUT}/gpu_test_logs/x.log"
exit 1
EOF
mkdir -p "${bundle}/tests"
cat > "${bundle}/tests/manifest.txt" <<'EOF'
cc core ops_cuda_test
sh tests/engine stage3_inference_cuda_np4_test 4 tests/engine/stage3_inference_gpu_main
sh tests/engine stage3_inference_cuda_np2_test 2 tests/engine/stage3_inference_gpu_main
sh tests/engine parity_cuda_w4_test 4 tests/engine/parity_main tests/comm/run_mpi.sh --device=cuda
sh tests/engine parity_cuda_w2_test 2 tests/engine/parity_main tests/comm/run_mpi.sh --device=cuda
sh tests/comm collectives_cuda_mpi_np4_test 4 tests/comm/collectives_mpi_test --device=cuda --backend=mpi
sh tests/comm collectives_nccl_all_gpus_test tests/comm/collectives_mpi_test
EOF
for t in parity_cuda_w4_test stage3_inference_cuda_np4_test; do
  d="${bundle}/tests/tests/engine/${t}.runfiles/zero_engine/tests/engine"
  mkdir -p "${d}"
  # Records its working directory and arguments; the stage-3 one fails.
  cat > "${d}/${t}" <<EOF
#!/bin/bash
echo "${t} \$(basename "\$PWD") \$*" >> "\${FAKE_LOG:?}"
[[ "${t}" == parity* ]]
EOF
done
chmod +x "${fakebin}"/* "${bundle}/bin"/* "${bundle}/run_gpu_tests.sh" \
  "${bundle}"/tests/tests/engine/*/zero_engine/tests/engine/*_test

export PATH="${fakebin}:${PATH}"
export FAKE_LOG="${tmp}/fake.log"
export MULTI_GPU_BENCH_SITE="${tmp}/site" DS_WHEELS="${tmp}/no_wheels"
unset MULTI_GPU_BENCH_GPUS
: > "${FAKE_LOG}"

# ---------------------------------------------------------------- dry runs
dry="${tmp}/dry.txt"
MULTI_GPU_BENCH_GPUS=8 "${script}" "${bundle}" train13 --dry_run > "${dry}" 2>&1
check "dry run train13 exits 0" test $? -eq 0
check "dry run train13 lists 12 commands" has "${dry}" "total: 12 commands"
check "dry run: 1 GPU first, then 8" test "$(grep -o '_1.3B_w[0-9]*' "${dry}" | head -4 | tr '\n' ' ')" \
  == "_1.3B_w1 _1.3B_w1 _1.3B_w1 _1.3B_w8 "
check "dry run: budget cut shown" has "${dry}" "skip: over --budget 540s"
check "dry run: 1.3B references get 32 heads" has "${dry}" "--heads=32"
check "dry run runs nothing" test ! -s "${FAKE_LOG}"
MULTI_GPU_BENCH_GPUS=4 "${script}" "${bundle}" train67 --dry_run --budget 9999 > "${dry}" 2>&1
check "dry run train67: 4 GPUs first, 1 GPU last" test \
  "$(grep -o 'ours_6.7B_w[0-9]*' "${dry}" | tr '\n' ' ')" == "ours_6.7B_w4 ours_6.7B_w2 ours_6.7B_w1 "
check "dry run train67: stages 3,2,1" has "${dry}" "--stages=3,2,1"
check "dry run train67: nothing skipped under a large budget" test "$(count "${dry}" "skip:")" -eq 0
MULTI_GPU_BENCH_GPUS=8 "${script}" "${bundle}" comm --dry_run > "${dry}" 2>&1
check "dry run comm: 8, 2, 4 ranks" test "$(grep -o 'comm_ours_w[0-9]*' "${dry}" | tr '\n' ' ')" \
  == "comm_ours_w8 comm_ours_w2 comm_ours_w4 "
MULTI_GPU_BENCH_GPUS=8 "${script}" "${bundle}" tests --dry_run > "${dry}" 2>&1
check "dry run tests: parity and stage 3 at 8 ranks" test \
  "$(grep -c '_at_8_ranks' "${dry}")" -eq 2
"${script}" "${bundle}" nonsense > /dev/null 2>&1
check "an unknown phase is refused" test $? -eq 2

# ---------------------------------------------------------------- train13, ours only
out="${tmp}/out13"
OUT="${out}" FAKE_FAIL="8:2" "${script}" "${bundle}" train13 --engines=ours > "${tmp}/run13.txt" 2>&1
check "train13 exits 0 although a case failed" test $? -eq 0
j="${out}/train13.jsonl"
check "train13: 4 world sizes launched as 1, 8, 2, 4" test \
  "$(grep train_bench "${FAKE_LOG}" | cut -d' ' -f1 | tr '\n' ' ')" == "1 8 2 4 "
check "train13: every result tagged engine ours" test \
  "$(jq_py "${j}" 'sum(1 for r in rows if r.get("model") and r.get("engine") != "ours")')" == 0
check "train13: stage 3 at 8 lost after stage 2 failed" test \
  "$(jq_py "${j}" '[r.get("missing") for r in rows if r.get("world_size") == 8 and r.get("stage") == 3]')" == "[True]"
check "train13: the lost case says why" has "${j}" "an earlier case of this command failed"
check "train13: 12 cases recorded" test \
  "$(jq_py "${j}" 'len([r for r in rows if r.get("model") == "1.3B"])')" == 12
check "train13: a command line per command" test \
  "$(jq_py "${j}" 'len([r for r in rows if r.get("kind") == "command"])')" == 4
check "train13: stderr in the log" has "${out}/train13.log" "train_bench: stderr noise"
check "train13: only two files in OUT" test "$(find "${out}" -type f | wc -l)" -eq 2

# ---------------------------------------------------------------- timeout, budget, DeepSpeed missing
out="${tmp}/out67"
: > "${FAKE_LOG}"
OUT="${out}" FAKE_GPUS=2 FAKE_SLEEP_W=2 MULTI_GPU_BENCH_ESTIMATES='ours_train_6.7B 1 0 0' \
  "${script}" "${bundle}" train67 --engines=ours,deepspeed --budget 10 > "${tmp}/run67.txt" 2>&1
j="${out}/train67.jsonl"
check "train67: the hung command timed out at the budget" test \
  "$(jq_py "${j}" 'all(r["error"].startswith("no result line (timeout after ") for r in rows if r.get("world_size") == 2 and r.get("engine") == "ours")')" \
  == True
check "train67: DeepSpeed cases skipped once the budget is spent" test \
  "$(jq_py "${j}" 'all(r.get("skipped") for r in rows if r.get("engine") == "deepspeed")')" == True
check "train67: DeepSpeed missing is logged" has "${out}/train67.log" "DeepSpeed is not importable"
check "train67: 1 GPU cases skipped, not run" test "$(grep -c train_bench "${FAKE_LOG}")" -eq 1

# ---------------------------------------------------------------- comm and tests
out="${tmp}/outc"
: > "${FAKE_LOG}"
# A rank left behind on a GPU (here a sleep this test started) is killed
# after the command.
sleep 300 &
leftover=$!
disown "${leftover}"
echo " ${leftover}" > "${tmp}/leftover"
OUT="${out}" FAKE_GPUS=4 FAKE_LEFTOVER="${tmp}/leftover" "${script}" "${bundle}" comm --engines=ours > /dev/null 2>&1
check "comm: the leftover GPU process was killed" test "$(kill -0 "${leftover}" 2> /dev/null && echo alive)" == ""
check "comm: and logged" has "${out}/comm.log" "leftover GPU processes after comm_ours_w4: ${leftover}"
kill "${leftover}" 2> /dev/null
check "comm: 4 and 2 ranks" test "$(grep comm_bench "${FAKE_LOG}" | cut -d' ' -f1 | tr '\n' ' ')" == "4 2 "
check "comm: rows tagged ours" test \
  "$(jq_py "${out}/comm.jsonl" 'len([r for r in rows if r.get("collective") and r["engine"] == "ours"])')" == 12
OUT="${out}" FAKE_GPUS=8 "${script}" "${bundle}" tests > /dev/null 2>&1
j="${out}/tests.jsonl"
check "tests: run_gpu_tests results parsed" test \
  "$(jq_py "${j}" '[(r["test"], r["result"]) for r in rows if r.get("kind") == "test"][:3]')" == \
  "[('core:ops_cuda_test', 'PASSED'), ('tests/engine:parity_cuda_w4_test', 'PASSED'), ('tests/comm:collectives_nccl_all_gpus_test', 'FAILED')]"
check "tests: parity rerun at 8 ranks from its runfiles" has "${FAKE_LOG}" \
  "parity_cuda_w4_test zero_engine 8 tests/engine/parity_main tests/comm/run_mpi.sh --device=cuda"
check "tests: stage 3 inference rerun at 8 ranks" has "${FAKE_LOG}" \
  "stage3_inference_cuda_np4_test zero_engine 8 tests/engine/stage3_inference_gpu_main"
check "tests: only the named families are rerun" test "$(grep -c "_test zero_engine" "${FAKE_LOG}")" -eq 2
check "tests: the failed rerun is a FAILED line" test \
  "$(jq_py "${j}" '[r["result"] for r in rows if r.get("test", "").endswith("at 8 ranks")]')" == "['PASSED', 'FAILED']"
check "tests: per-test logs stay out of OUT" test ! -e "${out}/gpu_test_logs"

# ---------------------------------------------------------------- the summary of it all
python3 "${summary}" "${tmp}/out13" "${tmp}/out67" "${tmp}/outc" > "${tmp}/summary.md"
check "summary runs" test $? -eq 0
check "summary: 1.3B stage 2 row with efficiencies" has "${tmp}/summary.md" \
  "| zero-engine | stage 2 | 57,500 | 57,000 (99.1%) | 56,000 (97.4%) | OOM | 1 GPU |"
check "summary: the lost stage 3 at 8 ranks" has "${tmp}/summary.md" "| zero-engine | stage 3 | 56,500 | 56,000 (99.1%) | 55,000 (97.3%) | error | 1 GPU |"
check "summary: comm at 1 GiB" has "${tmp}/summary.md" "| all_reduce | 4 | 304.0 |  |  |"
check "summary: tests" has "${tmp}/summary.md" "## gpu tests: 3 passed, 2 failed"

echo "multi_gpu_bench_test: $((checks - failures)) passed, ${failures} failed"
[[ ${failures} -eq 0 ]]
