#!/usr/bin/env bash
# Runs every gpu-tagged test packed by tools/gpu_bundle.sh, on the GPU
# machine, without Bazel. Prints each result and `gpu tests: N passed, M
# failed, K skipped` (a test that cannot run on this machine, e.g. NCCL at
# one rank per GPU with one GPU, exits 77 and is counted as skipped, never
# as passed); exits non-zero on any failure. Logs go to $OUT (or /tmp) as
# gpu_test_logs/<package>_<name>.log.
set -uo pipefail
bundle="$(cd "$(dirname "$0")" && pwd)"
export LD_LIBRARY_PATH="${bundle}/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export NCCL_NVLS_ENABLE=0
# The multi-rank gpu tests put 2 or 4 ranks on one GPU when the machine has
# fewer, which CreateCommunicator refuses unless asked (Bazel gives them the
# same through tools/mpi_test.bzl's GPU_SHARING_TEST_ENV).
# gpu_sharing_refused_test sets 0 itself to see the refusal.
export ZE_ALLOW_GPU_SHARING=1
export ZE_TEST_SKIP_EXIT_CODE=77
logs="${OUT:-/tmp}/gpu_test_logs"
mkdir -p "${logs}"
filter="${1:-}"

passed=0
failed=0
skipped=0
while read -r kind package name args; do
  [[ -n "${filter}" && "${package}/${name}" != *${filter}* ]] && continue
  log="${logs}/${package//\//_}_${name}.log"
  start=$(date +%s)
  if [[ "${kind}" == "sh" ]]; then
    runfiles="${bundle}/tests/${package}/${name}.runfiles"
    (cd "${runfiles}/zero_engine" && TEST_SRCDIR="${runfiles}" TEST_WORKSPACE=zero_engine \
      TEST_TMPDIR="$(mktemp -d)" timeout 600 "./${package}/${name}" ${args}) < /dev/null > "${log}" 2>&1
  else
    (cd "${bundle}" && TEST_TMPDIR="$(mktemp -d)" timeout 600 "${bundle}/tests/${package}/${name}") < /dev/null > "${log}" 2>&1
  fi
  result=$?
  elapsed=$(( $(date +%s) - start ))
  if [[ ${result} -eq 0 ]]; then
    passed=$((passed + 1)); echo "PASSED ${package}:${name} (${elapsed}s)"
  elif [[ ${result} -eq 77 ]]; then
    skipped=$((skipped + 1))
    echo "SKIPPED ${package}:${name} (${elapsed}s): $(grep -m1 '^SKIP' "${log}")"
  else
    failed=$((failed + 1)); echo "FAILED ${package}:${name} (${elapsed}s, exit ${result}); last lines:"
    tail -25 "${log}" | sed 's/^/    /'
  fi
done < "${bundle}/tests/manifest.txt"
echo "gpu tests: ${passed} passed, ${failed} failed, ${skipped} skipped"
[[ ${failed} -eq 0 ]]
