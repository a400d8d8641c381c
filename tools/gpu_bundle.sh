#!/usr/bin/env bash
# Packs what the GPU machine needs into gpu_bundle/ (git-ignored): every test
# tagged `gpu` (with its runfiles), the benchmarks and examples, and the
# non-system shared libraries they link. The GPU machine has CUDA 13, NCCL,
# Open MPI 4.1 and mpirun but no Bazel and no Abseil; those libraries that it
# has (libc, libstdc++, CUDA, NCCL, MPI) are not copied.
#
# Then on the GPU machine: gpu_bundle/run_gpu_tests.sh (exits non-zero on any
# failure) and gpu_bundle/bin/<benchmark>.
#
# Usage: tools/gpu_bundle.sh
#   GPU_BUNDLE_ONLY="train_gpt optimizer_cuda_test" tools/gpu_bundle.sh
# packs only the named benchmarks/examples (gpu_bundle/bin/NAME) and gpu
# tests (by the manifest's test name), with the libraries, the test runner
# and the configs: a few MB where the whole pack is over 50, for a call
# that also carries other files (a corpus) under the device's 64 MiB carry
# limit. gpu_bundle/ itself is still whole. A name that is neither exits 2.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh

bundle=gpu_bundle
rm -rf "${bundle}"
mkdir -p "${bundle}/bin" "${bundle}/lib" "${bundle}/tests"

# --keep_going: pack whatever built; a target that failed is reported and
# skipped (its tests then show up as missing on the GPU machine).
# The CUPTI tracer is tagged manual (CI need not carry CUPTI): by name.
bazel build --keep_going //... //bench:libze_cupti_trace.so 2>&1 |
  grep -v linux-sandbox | grep -E "ERROR|Build" | head -20
bin_dir="$(bazel info bazel-bin 2>/dev/null)"

# Libraries the GPU machine provides itself (or that must match its driver).
system_library_pattern='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|librt\.|libpthread\.|libstdc\+\+|libgcc_s|libcuda\.|libnvidia|libcudart|libcublas|libcublasLt|libnccl|libmpi|libopen-|libpmix|libevent|libhwloc|libz\.|libopenblas|libgfortran|libquadmath|libudev|libltdl|libnl-|libibverbs|librdmacm|libfabric|libpsm|libucp|libucs|libuct|libucm|libefa|libnuma|libmunge|libcrypto|libssl|libutil\.)'

copy_libraries() {
  local binary="$1"
  ldd "${binary}" 2>/dev/null | awk '/=> \// {print $1, $3}' | while read -r name path; do
    if [[ ! "${name}" =~ ${system_library_pattern} && ! -e "${bundle}/lib/${name}" ]]; then
      cp -L "${path}" "${bundle}/lib/${name}"
    fi
  done
}

add_binary() {  # add_binary <bazel-bin relative path> <destination>
  local source="${bin_dir}/$1" destination="$2"
  if [[ ! -e "${source}" ]]; then echo "gpu_bundle: skipping $1 (not built)" >&2; return 0; fi
  mkdir -p "$(dirname "${destination}")"
  cp -L "${source}" "${destination}"
  chmod u+w "${destination}"
  strip --strip-debug "${destination}" 2>/dev/null || true
  copy_libraries "${source}"
}

# gpu tests: label -> (kind, path). sh_tests keep their runfiles tree.
: > "${bundle}/tests/manifest.txt"
for label in $(bazel query 'attr(tags, "\bgpu\b", tests(//...))' 2>/dev/null); do
  package="${label#//}"; package="${package%%:*}"; name="${label##*:}"
  kind="$(bazel query --output=label_kind "${label}" 2>/dev/null | awk '{print $1}')"
  if [[ "${kind}" == "sh_test" ]]; then
    runfiles="${bin_dir}/${package}/${name}.runfiles"
    if [[ ! -d "${runfiles}" ]]; then echo "gpu_bundle: skipping ${label} (not built)" >&2; continue; fi
    mkdir -p "${bundle}/tests/${package}"
    # Without _solib_k8: its shared libraries (cuBLAS among them, ~800 MB)
    # come from lib/ and the machine's CUDA through LD_LIBRARY_PATH.
    (cd "${runfiles}" && find . -path '*/_solib_k8' -prune -o \( -type f -o -type l \) -print) |
      while read -r file; do
        mkdir -p "$(dirname "${bundle}/tests/${package}/${name}.runfiles/${file}")"
        cp -L "${runfiles}/${file}" "${bundle}/tests/${package}/${name}.runfiles/${file}"
      done
    # Binaries inside runfiles get their libraries too, and lose debug info.
    find "${bundle}/tests/${package}/${name}.runfiles" -type f -perm -u+x | while read -r file; do
      if [[ "$(head -c 4 "${file}" | tail -c 3)" == "ELF" ]]; then
        chmod u+w "${file}"; strip --strip-debug "${file}" 2>/dev/null || true
        copy_libraries "${file}"
      fi
    done
    # bazel test passes `args`; outside bazel the manifest carries them,
    # with $(rootpath :x) / $(location //p:x) turned into runfiles paths.
    # A test's `env` is not carried: the one gpu tests use,
    # ZE_ALLOW_GPU_SHARING=1, is exported by run_gpu_tests.sh for all.
    args="$(bazel query --output=build "${label}" 2>/dev/null | python3 -c '
import re, sys
text = sys.stdin.read()
match = re.search(r"args = \[(.*?)\]", text, re.S)
args = re.findall(r"\"((?:[^\"\\]|\\.)*)\"", match.group(1)) if match else []
package = sys.argv[1]
def path(m):
    label = m.group(2)
    if label.startswith(":"):
        return package + "/" + label[1:]
    label = label.lstrip("/")
    pkg, _, name = label.partition(":")
    return pkg + "/" + (name or pkg.split("/")[-1])
print(" ".join(re.sub(r"\$\((rootpath|location|execpath) ([^)]+)\)", path, a) for a in args))
' "${package}")"
    echo "sh ${package} ${name} ${args}" >> "${bundle}/tests/manifest.txt"
  else
    add_binary "${package}/${name}" "${bundle}/tests/${package}/${name}"
    echo "cc ${package} ${name}" >> "${bundle}/tests/manifest.txt"
  fi
done

# Benchmarks and examples: every cc_binary under bench/ and examples/, and
# the ze_checkpoint and ze_estimate tools (device scripts print the plan).
for label in $(bazel query 'kind(cc_binary, //bench/... + //examples/... + //nn/cuda/... + //tools:ze_checkpoint + //tools:ze_estimate)' 2>/dev/null); do
  package="${label#//}"; package="${package%%:*}"; name="${label##*:}"
  add_binary "${package}/${name}" "${bundle}/bin/${name}"
done

# Identical files (the same binary in several tests' runfiles) become
# relative links to the first copy: the bundle must stay small to travel.
python3 - "${bundle}" <<'PYTHON'
import hashlib, os, sys
root = sys.argv[1]
seen = {}
for directory, _, files in sorted(os.walk(root)):
    for name in sorted(files):
        path = os.path.join(directory, name)
        if os.path.islink(path) or os.path.getsize(path) < 65536:
            continue
        digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
        if digest in seen:
            os.remove(path)
            os.symlink(os.path.relpath(seen[digest], directory), path)
        else:
            seen[digest] = path
PYTHON

cp tools/run_gpu_tests.sh "${bundle}/run_gpu_tests.sh"
cp tools/hf_finetune_gpu_check.sh bench/hf_load_check.py "${bundle}/"
cp -r examples/configs "${bundle}/configs" 2>/dev/null || true
echo "gpu_bundle: $(du -sh "${bundle}" | cut -f1) in ${bundle}/ ($(wc -l < "${bundle}/tests/manifest.txt") gpu tests)"

# One compressed file travels far faster (and under the size limit) than the
# folder: on the GPU machine, `tar xJf gpu_pack/bundle.tar.xz -C /tmp`.
mkdir -p gpu_pack
if [[ -z "${GPU_BUNDLE_ONLY:-}" ]]; then
  tar cf - "${bundle}" | xz -T2 -6 > gpu_pack/bundle.tar.xz
else
  # The subset: the named binaries and tests, with every library and the
  # runner (links between tests handled below).
  subset="$(mktemp -d)"
  trap 'rm -rf "${subset}"' EXIT
  mkdir -p "${subset}/${bundle}/bin" "${subset}/${bundle}/tests"
  cp -rL "${bundle}/lib" "${bundle}/run_gpu_tests.sh" "${subset}/${bundle}/"
  [[ -d "${bundle}/configs" ]] && cp -rL "${bundle}/configs" "${subset}/${bundle}/"
  : > "${subset}/${bundle}/tests/manifest.txt"
  for name in ${GPU_BUNDLE_ONLY}; do
    line="$(awk -v n="${name}" '$3 == n' "${bundle}/tests/manifest.txt" | head -1)"
    if [[ -e "${bundle}/bin/${name}" ]]; then
      cp -L "${bundle}/bin/${name}" "${subset}/${bundle}/bin/"
    elif [[ -n "${line}" ]]; then
      read -r kind directory _ <<< "${line}"
      mkdir -p "${subset}/${bundle}/tests/${directory}"
      # A cc test is one binary; an sh test is its whole runfiles tree.
      entry="${name}"
      [[ "${kind}" == "sh" ]] && entry="${name}.runfiles"
      cp -r "${bundle}/tests/${directory}/${entry}" "${subset}/${bundle}/tests/${directory}/"
      echo "${line}" >> "${subset}/${bundle}/tests/manifest.txt"
    else
      echo "gpu_bundle: GPU_BUNDLE_ONLY names \"${name}\", neither a binary in" \
        "${bundle}/bin nor a gpu test in ${bundle}/tests/manifest.txt" >&2
      exit 2
    fi
  done
  # Links between tests (relative, to a first copy) stay links where the
  # copy they point at came along; the rest become copies.
  (cd "${subset}" && find "${bundle}" -type l ! -exec test -e {} \; -print) |
    while read -r link; do
      rm "${subset}/${link}"; cp -L "${link}" "${subset}/${link}"
    done
  tar cf - -C "${subset}" "${bundle}" | xz -T2 -6 > gpu_pack/bundle.tar.xz
  echo "gpu_bundle: only ${GPU_BUNDLE_ONLY}"
fi
echo "gpu_bundle: packed into gpu_pack/bundle.tar.xz ($(du -h gpu_pack/bundle.tar.xz | cut -f1))"
