#!/usr/bin/env bash
# Issue 15's multi-GPU measurements on one host with G GPUs, from an unpacked
# GPU bundle (tools/gpu_bundle.sh; on the GPU machine
# `tar xJf gpu_pack/bundle.tar.xz -C /tmp/b` gives BUNDLE=/tmp/b/gpu_bundle).
# Run from a checkout (the Python references are read from its bench/).
#
#   tools/multi_gpu_bench.sh BUNDLE PHASE [--budget SECONDS] [--dry_run]
#                            [--world_sizes=LIST] [--engines=LIST]
#
# PHASE:
#   comm     bench/comm_bench (NCCL, bf16, all_reduce/reduce_scatter/all_gather,
#            4 KiB..1 GiB) at 2, 4, .. G ranks, each followed by
#            bench/torch_comm_reference.py at the same size range when that
#            file exists (it is skipped with a note otherwise)
#   tests    the bundle's run_gpu_tests.sh (every gpu test; the fixed-rank
#            ones run one rank per GPU where the GPUs suffice), then each
#            multi-rank test family once more at G ranks when its largest
#            variant has fewer (the manifest fixes ranks at build time:
#            parity_cuda_w4 -> parity at G ranks, stage3_inference_cuda_np4
#            -> G ranks; MULTI_GPU_TEST_FAMILIES names the families)
#   train13  GPT 1.3B, micro-batch 16, seq 1024, bf16, at 1, G, 2, 4, ..
#            ranks (that order, so a budget cut drops the middle ones first):
#            train_bench stages 1,2,3 (one process), FSDP2 zero2+zero3 (one
#            process), DeepSpeed stages 2,3 (one process)
#   train67  the same at 6.7B, at G, 2, 4, .., then 1 (micro-batch 16 does
#            not fit one GPU at any stage: ~99 GiB of model state plus ~75 GiB
#            of activations; the W=1 cases report their OOM as error lines);
#            stages in the order 3,2,1 and FSDP2 zero3 before zero2, since
#            train_bench at several ranks stops at its first failed case and
#            each of those needs more memory than the one before
#   smoke    the tiny model through all three engines at 1 rank (and 2 if
#            G >= 2): a minute that shows the references and the launchers
#            work before the long phases
#
# Options:
#   --budget S       stop starting commands once the next one's estimate no
#                    longer fits in S seconds from the phase's start (default
#                    540); every command's own timeout also ends by then.
#                    Commands not started are recorded as "skipped" lines.
#   --dry_run        print every command with its estimate and the total, run
#                    nothing (MULTI_GPU_BENCH_GPUS=8 fakes the GPU count)
#   --world_sizes=L  only these world sizes (train/comm), e.g. 1,8
#   --engines=L      only these of ours, fsdp2, deepspeed, torch (comm)
#
# Estimates: the ESTIMATES table below (seconds per command: fixed start-up
# plus per-case cost plus a per-rank term), guesses from single-GPU runs
# (bench/RESULTS.md), not measurements on these machines; every command's
# actual wall time is recorded next to its estimate ("kind":"command"
# lines), so the first real run can correct the table.
#
# Output: $OUT/<phase>.jsonl (every result line of every command, tagged
# with "cmd" and "phase" and the engine; a line per case that produced none:
# "error" says why; a "kind":"command" line per command) and $OUT/<phase>.log
# (commands, their stderr, GPU topology). OUT defaults to /tmp/multi_gpu_bench.
# Read them with bench/scaling_summary.py.
#
# Environment: MULTI_GPU_BENCH_GPUS (GPU count instead of nvidia-smi -L),
# DS_WHEELS (DeepSpeed wheels, default .anchors/whl of this checkout: copy
# shared/anchors there and carry it), REFERENCE_HEADS_1P3B (head count of
# the PyTorch references at 1.3B, default 32 = train_bench's 1.3B preset;
# the anchors in shared/ANCHORS.md used 16); for tests:
# MULTI_GPU_BENCH_ESTIMATES (replaces the table), MULTI_GPU_BENCH_SITE
# (instead of /tmp/site).
set -uo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"

usage() {
  sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit "${1:-2}"
}

[[ $# -ge 2 ]] || usage 2
bundle="$1"
phase="$2"
shift 2
budget=540
dry_run=0
only_world_sizes=""
only_engines=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --budget) budget="${2:?--budget needs seconds}"; shift ;;
    --budget=*) budget="${1#*=}" ;;
    --dry_run) dry_run=1 ;;
    --world_sizes=*) only_world_sizes="${1#*=}" ;;
    --engines=*) only_engines="${1#*=}" ;;
    -h | --help) usage 0 ;;
    *) echo "multi_gpu_bench: unknown option $1" >&2; usage 2 ;;
  esac
  shift
done
case "${phase}" in
  comm | tests | train13 | train67 | smoke) ;;
  *) echo "multi_gpu_bench: unknown phase '${phase}' (comm, tests, train13, train67, smoke)" >&2; exit 2 ;;
esac
[[ "${budget}" =~ ^[0-9]+$ ]] || { echo "multi_gpu_bench: --budget must be whole seconds" >&2; exit 2; }

if [[ -n "${MULTI_GPU_BENCH_GPUS:-}" ]]; then
  gpus="${MULTI_GPU_BENCH_GPUS}"
else
  gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)"
fi
[[ "${gpus}" =~ ^[0-9]+$ && "${gpus}" -ge 1 ]] || {
  echo "multi_gpu_bench: no GPU visible (nvidia-smi -L); set MULTI_GPU_BENCH_GPUS for a dry run" >&2
  exit 1
}

# ---------------------------------------------------------------- estimates
# One row per kind of command: seconds = base + per_case * cases + per_rank * W.
# base: process start, CUDA context, NCCL (and Python/DeepSpeed import);
# per_case: building the model and engine and the steps (1.3B: ~0.25 s a
# step on one H200, 6.7B: ~1.3 s); per_rank: NCCL set-up growing with W.
ESTIMATES='
ours_train_1.3B        15  12  1
ours_train_6.7B        15  30  1
fsdp2_train_1.3B       25  10  1
fsdp2_train_6.7B       25  25  2
deepspeed_train_1.3B   40  15  2
deepspeed_train_6.7B   40  45  3
ours_train_tiny        10   3  1
fsdp2_train_tiny       20   3  1
deepspeed_train_tiny   35   5  1
ours_comm               8   5  1
torch_comm             20   5  1
gpu_tests             150   0  5
rerun_parity_cuda_w    10  60  2
rerun_stage3_inference_cuda_np 5 5 1
'
# Tests replace the table (tools/multi_gpu_bench_test.sh).
ESTIMATES="${MULTI_GPU_BENCH_ESTIMATES:-${ESTIMATES}}"
estimate() {  # estimate KEY CASES WORLD -> seconds
  awk -v key="$1" -v cases="$2" -v w="$3" \
    '$1 == key { printf "%d\n", $2 + $3 * cases + $4 * w; found = 1 } END { if (!found) print 60 }' \
    <<< "${ESTIMATES}"
}

# ---------------------------------------------------------------- environment
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
export LD_LIBRARY_PATH="${bundle}/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
site="${MULTI_GPU_BENCH_SITE:-/tmp/site}"  # where the DeepSpeed wheels are installed
ds_wheels="${DS_WHEELS:-${repo}/.anchors/whl}"
heads13="${REFERENCE_HEADS_1P3B:-32}"

out="${OUT:-/tmp/multi_gpu_bench}"
jsonl="${out}/${phase}.jsonl"
log="${out}/${phase}.log"
if [[ ${dry_run} -eq 0 ]]; then
  mkdir -p "${out}"
  : > "${jsonl}"
  : > "${log}"
  [[ -x "${bundle}/bin/train_bench" ]] || { echo "multi_gpu_bench: ${bundle}/bin/train_bench not found (BUNDLE is the unpacked gpu_bundle folder)" >&2; exit 1; }
fi

# A collective that waits longer than this fails with the engine's named
# error and its dump of recent collectives, well before the command's
# timeout (the engine's default is 600 s). Not exported: the tests' own
# runner sets 15 s where it is unset.
comm_timeout="${ZE_COMM_TIMEOUT_SECONDS:-120}"
mpirun_w() {  # mpirun_w W: the launcher words for W ranks, one per GPU
  printf '%s\n' env "ZE_COMM_TIMEOUT_SECONDS=${comm_timeout}" \
    mpirun --allow-run-as-root --bind-to none -np "$1" \
    -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x PYTHONUNBUFFERED -x OMPI_MCA_btl \
    -x OMPI_MCA_btl_vader_single_copy_mechanism -x ZE_COMM_TIMEOUT_SECONDS
}
torchrun_w() {  # torchrun_w W
  printf '%s\n' python3 -m torch.distributed.run --standalone --nproc_per_node="$1"
}

# ---------------------------------------------------------------- the runner
t_start=$(date +%s)
total_estimate=0
skipping=""     # set once a command did not fit the budget: later ones are skipped too
n_commands=0

# record MODE NAME ESTIMATE TIMEOUT RC WALL DEFAULTS EXPECT FILE
#   Turns one command's stdout (FILE) into lines of ${jsonl}. MODE rows: every
#   JSON line, with DEFAULTS for absent keys; each EXPECT case (a list of
#   partial rows) that no line matches gets an error line. MODE gpu_tests:
#   run_gpu_tests.sh's PASSED/FAILED/SKIPPED lines. MODE test: one line from RC.
#   MODE skip: EXPECT's cases as skipped. Then a "kind":"command" line.
record() {
  python3 - "$@" "${phase}" >> "${jsonl}" 2>> "${log}" <<'PY'
import json, re, sys
mode, name, est, timeout, rc, wall, defaults, expect, path, phase = sys.argv[1:]
rc, defaults, expect = int(rc), json.loads(defaults), json.loads(expect)
rows, other = [], []
if mode in ("rows", "gpu_tests", "test"):
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        row = None
        if mode == "rows" and line.startswith("{"):
            try:
                row = json.loads(line)
            except ValueError:
                row = None
        if isinstance(row, dict):
            for k, v in defaults.items():
                row.setdefault(k, v)
            rows.append(row)
            continue
        m = re.match(r"^(PASSED|FAILED|SKIPPED) (\S+) \((\d+)s", line) if mode == "gpu_tests" else None
        if m:
            rows.append(dict(defaults, kind="test", test=m.group(2), result=m.group(1), seconds=int(m.group(3))))
        else:
            other.append(line)
if rc in (124, 137):
    why = f"timeout after {timeout}s"
elif mode == "skip":
    why = "skipped: " + path
elif rc != 0:
    why = f"exit code {rc}"
else:
    why = "exit code 0"
if mode == "test":
    rows.append(dict(defaults, kind="test", result="PASSED" if rc == 0 else "FAILED", seconds=float(wall),
                     **({} if rc == 0 else {"error": why})))
failed_before = any(r.get("error") for r in rows)
for case in expect:
    if any(all(r.get(k) == v for k, v in case.items()) for r in rows):
        continue
    row = dict(defaults, **case)
    if mode == "skip":
        row.update(error=why, skipped=True)
    else:
        reason = f"no result line ({why}; see {phase}.log)"
        if failed_before and rc != 0:
            reason += "; an earlier case of this command failed, and a multi-rank run stops there"
        row.update(error=reason, missing=True)
    rows.append(row)
for row in rows:
    row.setdefault("cmd", name)
    row.setdefault("phase", phase)
    print(json.dumps(row))
print(json.dumps(dict(kind="command", phase=phase, cmd=name, estimate_s=int(est), timeout_s=int(timeout),
                      wall_s=float(wall), rc=rc, skipped=mode == "skip")))
# What was not JSON goes to the log (train_bench prints only JSON on stdout;
# DeepSpeed also logs there).
if other:
    sys.stderr.write("\n".join(other[-200:]) + "\n")
PY
}

# words ARGS...: the command as one line a shell would read back (quoting
# only the words that need it).
words() {
  local word line=""
  for word in "$@"; do
    if [[ "${word}" =~ ^[][A-Za-z0-9_./=,:+@%-]+$ ]]; then line+="${word} "; else line+="$(printf '%q' "${word}") "; fi
  done
  echo "${line% }"
}

# run_cmd NAME KIND ESTIMATE DEFAULTS EXPECT -- COMMAND...
#   KIND: rows, gpu_tests or test (see record). Runs COMMAND under its own
#   timeout (twice the estimate plus a minute, never past the budget),
#   unless the budget cannot fit the estimate.
run_cmd() {
  local name="$1" kind="$2" est="$3" defaults="$4" expect="$5"
  shift 6
  local now elapsed left limit start rc wall tmp
  n_commands=$((n_commands + 1))
  total_estimate=$((total_estimate + est))
  now=$(date +%s)
  elapsed=$((now - t_start))
  if [[ ${dry_run} -eq 1 ]]; then
    # Simulate the budget with the estimates alone.
    if [[ -z "${skipping}" && $((total_estimate)) -gt ${budget} ]]; then skipping="${name}"; fi
    if [[ -n "${skipping}" ]]; then
      printf '[skip: over --budget %ss] ' "${budget}"
    fi
    printf '[est %4ss, sum %5ss] %s:\n    %s\n' "${est}" "${total_estimate}" "${name}" "$(words "$@")"
    return 0
  fi
  left=$((budget - elapsed))
  if [[ -z "${skipping}" && ${est} -gt ${left} ]]; then
    skipping="${name}"
    echo "== $(date +%T) budget: ${left}s left, ${name} needs ~${est}s: it and every later command are skipped" | tee -a "${log}" >&2
  fi
  if [[ -n "${skipping}" ]]; then
    record skip "${name}" "${est}" 0 0 0 "${defaults}" "${expect}" "--budget ${budget}s would be exceeded (from ${skipping} on)"
    return 0
  fi
  limit=$((2 * est + 60))
  if [[ ${limit} -gt ${left} ]]; then limit=${left}; fi
  tmp="$(mktemp)"
  {
    echo
    echo "== $(date +%T) ${name} (estimate ${est}s, timeout ${limit}s, ${elapsed}s of ${budget}s used)"
    words "$@"
  } >> "${log}"
  echo "== $(date +%T) ${name} (estimate ${est}s, timeout ${limit}s)" >&2
  start=$(date +%s)
  timeout --kill-after=15 "${limit}" "$@" < /dev/null > "${tmp}" 2>> "${log}"
  rc=$?
  wall=$(($(date +%s) - start))
  record "${kind}" "${name}" "${est}" "${limit}" "${rc}" "${wall}" "${defaults}" "${expect}" "${tmp}"
  reap_gpu_leftovers "${name}"
  echo "   ${name}: exit ${rc} after ${wall}s (estimate ${est}s)" | tee -a "${log}" >&2
  rm -f "${tmp}"
}

# ---------------------------------------------------------------- helpers
# A command killed at its timeout can leave ranks behind (a launcher killed
# before its children, a process stuck in a kernel), holding GPU memory the
# next command needs. Whatever still runs on a GPU once a command returned
# is such a leftover here: the machine runs nothing else.
reap_gpu_leftovers() {
  local pids
  pids="$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | grep -oE '^ *[0-9]+' | tr -d ' ' | sort -u | tr '\n' ' ')"
  [[ -z "${pids// /}" ]] && return 0
  echo "== leftover GPU processes after $1: ${pids}; killing them" | tee -a "${log}" >&2
  # shellcheck disable=SC2086  # one PID per word
  kill -9 ${pids} 2>> "${log}"
  sleep 3
}

wanted_engine() {  # wanted_engine NAME: is NAME in --engines (or no filter)?
  [[ -z "${only_engines}" || ",${only_engines}," == *",$1,"* ]]
}
# World sizes as powers of two from 2 up to G, and G itself, filtered by
# --world_sizes: keep W (1 or any of those) only if asked for.
keep_w() {
  [[ -z "${only_world_sizes}" || ",${only_world_sizes}," == *",$1,"* ]]
}
multi_world_sizes() {  # multi_world_sizes: G first, then 2, 4, .. below G
  local w
  [[ ${gpus} -ge 2 ]] && keep_w "${gpus}" && echo "${gpus}"
  for ((w = 2; w < gpus; w *= 2)); do keep_w "${w}" && echo "${w}"; done
  return 0
}

install_deepspeed() {  # once per phase; leaves ds_ok=1 when deepspeed imports
  if [[ ${dry_run} -eq 1 ]]; then ds_ok=1; return; fi
  if PYTHONPATH="${site}${PYTHONPATH:+:${PYTHONPATH}}" python3 -c 'import deepspeed' > /dev/null 2>&1; then
    ds_ok=1
  elif compgen -G "${ds_wheels}/*.whl" > /dev/null; then
    echo "== installing DeepSpeed from ${ds_wheels} into ${site}" >> "${log}"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "${site}" "${ds_wheels}"/*.whl >> "${log}" 2>&1 &&
      PYTHONPATH="${site}${PYTHONPATH:+:${PYTHONPATH}}" python3 -c 'import deepspeed' >> "${log}" 2>&1 &&
      ds_ok=1
  fi
  if [[ ${ds_ok} -eq 1 ]]; then
    PYTHONPATH="${site}${PYTHONPATH:+:${PYTHONPATH}}" python3 -c \
      'import deepspeed, torch; print("deepspeed", deepspeed.__version__, "torch", torch.__version__)' >> "${log}" 2>&1
  else
    echo "== DeepSpeed is not importable and no wheels in ${ds_wheels}: its cases get error lines" | tee -a "${log}" >&2
  fi
}

header() {
  [[ ${dry_run} -eq 1 ]] && return
  {
    echo "== $(date -u +%FT%TZ) phase ${phase}, ${gpus} GPUs, budget ${budget}s, bundle ${bundle}"
    nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv 2>&1
    echo "== nvidia-smi topo -m"
    nvidia-smi topo -m 2>&1
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())' 2>&1
  } >> "${log}"
  python3 - "${phase}" "${gpus}" "${budget}" >> "${jsonl}" <<'PY'
import json, subprocess, sys, time
try:
    names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                           text=True, timeout=30).stdout.split("\n")
except Exception:
    names = []
print(json.dumps(dict(kind="phase", phase=sys.argv[1], gpus=int(sys.argv[2]), budget_s=int(sys.argv[3]),
                      gpu_names=sorted(set(n.strip() for n in names if n.strip())),
                      date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))))
PY
}

# One JSON object as text: json k1 v1 k2 v2 ... (whole numbers stay numbers).
json() {
  local text="{" key value
  while [[ $# -ge 2 ]]; do
    key="$1" value="$2"
    shift 2
    if [[ ! "${value}" =~ ^-?[0-9]+$ ]]; then
      value="${value//\\/\\\\}"
      value="\"${value//\"/\\\"}\""
    fi
    text+="\"${key}\": ${value}, "
  done
  echo "${text%, }}"
}

# train_cmd ENGINE MODEL W: one command of a train phase (all of that
# engine's cases at W ranks in one process). Uses the train_phase settings.
train_cmd() {
  local engine="$1" model="$2" w="$3" cases=0 expect="[" item key launcher=()
  local list
  case "${engine}" in
    ours) list="${stages}"; key=stage ;;
    fsdp2) list="${modes}"; key=mode ;;
    deepspeed) list="${ds_stages}"; key=stage ;;
  esac
  for item in ${list//,/ }; do
    expect+="$(json engine "${engine}" model "${model}" "${key}" "${item}" world_size "${w}"),"
    cases=$((cases + 1))
  done
  expect="${expect%,}]"
  local est name="${engine}_${model}_w${w}"
  est="$(estimate "${engine}_train_${model}" "${cases}" "${w}")"
  case "${engine}" in
    ours)
      mapfile -t launcher < <(mpirun_w "${w}")
      run_cmd "${name}" rows "${est}" "$(json engine ours)" "${expect}" -- \
        "${launcher[@]}" "${bundle}/bin/train_bench" --models="${model}" --stages="${stages}" \
        --batch="${batch}" --seq="${seq}" --warmup="${warmup}" --iters="${iters}" --backend=nccl --device=cuda
      ;;
    fsdp2)
      mapfile -t launcher < <(torchrun_w "${w}")
      run_cmd "${name}" rows "${est}" "$(json engine fsdp2)" "${expect}" -- \
        "${launcher[@]}" "${repo}/bench/fsdp2_reference.py" --models="${model}" --modes="${modes}" \
        --batch="${batch}" --seq="${seq}" --warmup="${warmup}" --iters="${iters}" --heads="${heads}" --device="${torch_device}" --pg_timeout="${comm_timeout}"
      ;;
    deepspeed)
      mapfile -t launcher < <(torchrun_w "${w}")
      if [[ ${ds_ok} -eq 1 ]]; then
        run_cmd "${name}" rows "${est}" "$(json engine deepspeed)" "${expect}" -- \
          env "PYTHONPATH=${site}${PYTHONPATH:+:${PYTHONPATH}}" \
          "${launcher[@]}" "${repo}/bench/deepspeed_reference.py" --models="${model}" --stages="${ds_stages}" \
          --batch="${batch}" --seq="${seq}" --warmup="${warmup}" --iters="${iters}" --heads="${heads}" \
          --pg_timeout="${comm_timeout}"
      else
        run_cmd "${name}" rows 1 "$(json engine deepspeed)" "${expect}" -- \
          sh -c 'echo "DeepSpeed is not importable here (no wheels in DS_WHEELS)" >&2; exit 3'
      fi
      ;;
  esac
}

# train_phase MODEL ORDER STAGES FSDP_MODES DS_STAGES WARMUP ITERS
#   The commands in priority order, so that a budget cut drops the least
#   needed first. ORDER ones_first: every engine at 1 and at G ranks, then
#   ours at 2, 4, .., then FSDP2 there, then DeepSpeed there. ORDER
#   one_last: the same without 1, which comes last. ORDER small: 1 and 2.
train_phase() {
  local model="$1" order="$2" stages="$3" modes="$4" ds_stages="$5" warmup="$6" iters="$7"
  local batch=16 seq=1024 heads=0 engines=() engine w first=() middle=() last=() torch_device=cuda
  [[ "${model}" == "1.3B" ]] && heads="${heads13}"
  # The smoke phase also runs where no GPU is (FSDP2 then uses gloo).
  if [[ "${model}" == tiny ]]; then batch=2; seq=64; torch_device=auto; fi
  for engine in ours fsdp2 deepspeed; do wanted_engine "${engine}" && engines+=("${engine}"); done
  ds_ok=0
  wanted_engine deepspeed && install_deepspeed
  mapfile -t middle < <(multi_world_sizes)
  case "${order}" in
    ones_first)
      keep_w 1 && first=(1)
      if [[ ${#middle[@]} -gt 0 ]]; then first+=("${middle[0]}"); middle=("${middle[@]:1}"); fi
      ;;
    one_last)
      if [[ ${#middle[@]} -gt 0 ]]; then first=("${middle[0]}"); middle=("${middle[@]:1}"); fi
      keep_w 1 && last=(1)
      ;;
    small)
      middle=()
      keep_w 1 && first=(1)
      [[ ${gpus} -ge 2 ]] && keep_w 2 && first+=(2)
      ;;
  esac
  for w in "${first[@]}"; do
    for engine in "${engines[@]}"; do train_cmd "${engine}" "${model}" "${w}"; done
  done
  for engine in "${engines[@]}"; do
    for w in "${middle[@]}"; do train_cmd "${engine}" "${model}" "${w}"; done
  done
  for w in "${last[@]}"; do
    for engine in "${engines[@]}"; do train_cmd "${engine}" "${model}" "${w}"; done
  done
}

comm_phase() {
  local w launcher min_bytes=4096 max_bytes=1073741824 expect
  if [[ ${gpus} -lt 2 ]]; then
    echo "multi_gpu_bench: comm needs 2 or more GPUs (${gpus} visible); nothing to measure" | tee -a "${log}" >&2
    return 0
  fi
  for w in $(multi_world_sizes); do
    if wanted_engine ours; then
      mapfile -t launcher < <(mpirun_w "${w}")
      expect="[$(json engine ours collective all_reduce world_size "${w}")]"
      run_cmd "comm_ours_w${w}" rows "$(estimate ours_comm 1 "${w}")" "$(json engine ours)" "${expect}" -- \
        "${launcher[@]}" "${bundle}/bin/comm_bench" --backend=nccl --device=cuda --dtype=bf16 \
        --min_bytes="${min_bytes}" --max_bytes="${max_bytes}" --collectives=all_reduce,reduce_scatter,all_gather
    fi
    if wanted_engine torch; then
      if [[ -f "${repo}/bench/torch_comm_reference.py" ]]; then
        mapfile -t launcher < <(torchrun_w "${w}")
        run_cmd "comm_torch_w${w}" rows "$(estimate torch_comm 1 "${w}")" "$(json engine torch world_size "${w}")" "[]" -- \
          "${launcher[@]}" "${repo}/bench/torch_comm_reference.py" --dtype=bf16 --min_bytes="${min_bytes}" --max_bytes="${max_bytes}"
      elif [[ ${dry_run} -eq 1 ]]; then
        echo "(bench/torch_comm_reference.py is absent: its ${w}-rank run would be skipped)"
      else
        echo "== bench/torch_comm_reference.py is absent: no PyTorch comparison at ${w} ranks" | tee -a "${log}" >&2
        json kind note phase comm world_size "${w}" note "bench/torch_comm_reference.py absent" >> "${jsonl}"
      fi
    fi
  done
}

tests_phase() {
  local manifest="${bundle}/tests/manifest.txt" tmp_out kind package name args family n
  local -A largest=() line_of=()
  if [[ ${dry_run} -eq 1 ]]; then tmp_out=/tmp/multi_gpu_tests.XXXXXX; else tmp_out="$(mktemp -d)"; fi
  # run_gpu_tests.sh writes one log per test under $OUT/gpu_test_logs: keep
  # those out of $OUT (only 8 files come back); failures print their tails.
  run_cmd gpu_tests gpu_tests "$(estimate gpu_tests 0 "${gpus}")" "$(json ranks_per_gpu_when_possible 1)" "[]" -- \
    env "OUT=${tmp_out}" bash "${bundle}/run_gpu_tests.sh"
  if [[ ! -f "${manifest}" ]]; then
    [[ ${dry_run} -eq 1 ]] && echo "(no ${manifest} here: the G-rank reruns are listed from the bundle's manifest on the GPU machine)"
    return 0
  fi
  # The families in ${families} (test names ending _w<N>_test or _np<N>_test
  # whose first argument is N): the largest variant, rerun at G ranks when
  # N < G. NCCL's collectives already run at G ranks
  # (collectives_nccl_all_gpus_test).
  local families=" ${MULTI_GPU_TEST_FAMILIES:-parity_cuda_w stage3_inference_cuda_np} "
  while read -r kind package name args; do
    [[ "${kind}" == sh ]] || continue
    if [[ "${name}" =~ ^(.*_(w|np))([0-9]+)_test$ ]]; then
      family="${package}/${BASH_REMATCH[1]}"
      n="${BASH_REMATCH[3]}"
      [[ "${families}" == *" ${BASH_REMATCH[1]} "* && "${args%% *}" == "${n}" ]] || continue
      if [[ -z "${largest[${family}]:-}" || ${n} -gt ${largest[${family}]} ]]; then
        largest[${family}]=${n}
        line_of[${family}]="${package} ${name} ${args}"
      fi
    fi
  done < "${manifest}"
  for family in $(printf '%s\n' "${!largest[@]}" | sort); do
    n=${largest[${family}]}
    [[ ${n} -lt ${gpus} ]] || continue
    read -r package name args <<< "${line_of[${family}]}"
    local rest="${args#* }"
    [[ "${rest}" == "${args}" ]] && rest=""
    local runfiles="${bundle}/tests/${package}/${name}.runfiles/zero_engine"
    [[ ${dry_run} -eq 1 ]] || mkdir -p "${tmp_out}/${name}_g"
    # shellcheck disable=SC2086  # the manifest's arguments are words
    run_cmd "${family##*/}${gpus}_at_${gpus}_ranks" test "$(estimate "rerun_${family##*/}" 1 "${gpus}")" \
      "$(json test "${package}:${name} at ${gpus} ranks" ranks "${gpus}")" "[]" -- \
      env -C "${runfiles}" "TEST_SRCDIR=${runfiles%/zero_engine}" TEST_WORKSPACE=zero_engine \
      "TEST_TMPDIR=${tmp_out}/${name}_g" "./${package}/${name}" "${gpus}" ${rest}
  done
  [[ ${dry_run} -eq 1 ]] || rm -rf "${tmp_out}"
}

# ---------------------------------------------------------------- main
header
if [[ ${dry_run} -eq 1 ]]; then
  echo "multi_gpu_bench: phase ${phase}, ${gpus} GPUs, budget ${budget}s (dry run: nothing runs)"
fi
case "${phase}" in
  comm) comm_phase ;;
  tests) tests_phase ;;
  train13) train_phase 1.3B ones_first 1,2,3 zero2,zero3 2,3 3 10 ;;
  train67) train_phase 6.7B one_last 3,2,1 zero3,zero2 3,2 2 5 ;;
  smoke) train_phase tiny small 1,2,3 zero2,zero3 2,3 1 2 ;;
esac

elapsed=$(($(date +%s) - t_start))
if [[ ${dry_run} -eq 1 ]]; then
  echo "total: ${n_commands} commands, estimated ${total_estimate}s ($((total_estimate / 60)) min $((total_estimate % 60)) s) against a budget of ${budget}s${skipping:+; from ${skipping} on they would be skipped}"
else
  echo "multi_gpu_bench: phase ${phase}: ${n_commands} commands in ${elapsed}s (estimated ${total_estimate}s)${skipping:+; skipped from ${skipping} on (budget)}; results in ${jsonl}" | tee -a "${log}" >&2
  errors=$(grep -c '"error"' "${jsonl}" || true)
  echo "multi_gpu_bench: ${errors} lines with an error in ${jsonl}" >&2
fi
exit 0
