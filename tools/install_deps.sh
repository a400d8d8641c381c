#!/usr/bin/env bash
# Installs the system packages the build needs, if any is missing.
# Idempotent; safe to call from every entry script. Needs root (or sudo).
set -euo pipefail

packages=(
  bazel-bootstrap    # Bazel 4.2, works offline
  libabsl-dev        # Abseil 20220623
  libgtest-dev       # GoogleTest 1.12 (+ gmock)
  libopenmpi-dev     # Open MPI 4.1 headers and libraries
  openmpi-bin        # mpirun
  nlohmann-json3-dev # nlohmann-json 3.11
  libopenblas-dev    # OpenBLAS for CPU matrix products
  liburing-dev       # liburing 2.3 (io_uring), linked statically by offload/
  tmux               # //examples:train_gpt_tmux_test drives a terminal
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "${package}" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("${package}")
  fi
done

if ((${#missing[@]} > 0)); then
  echo "install_deps: installing ${missing[*]}" >&2
  SUDO=""
  if [[ "$(id -u)" != 0 ]]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  # Package lists may be empty on a fresh machine.
  ${SUDO} apt-get update -qq
  ${SUDO} apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
  echo "install_deps: the CUDA 13 toolkit must be installed at /usr/local/cuda (nvcc not found)" >&2
  exit 1
fi

# Bazel's disk cache (these machines set one in ~/.bazelrc) is never trimmed
# by this Bazel; it grew to 50 GB across sessions and filled the disk on
# 2026-12-04, after which no command could run. Past 20 GB it is dropped
# whole (the next build refills it; dropping all of it never leaves an
# action-cache entry pointing at a missing output).
# A machine without ~/.bazelrc has no disk cache (and sed's failure must not
# end this script under `set -e -o pipefail`).
disk_cache=""
if [[ -f "${HOME}/.bazelrc" ]]; then
  disk_cache="$(sed -n 's/^build --disk_cache=//p' "${HOME}/.bazelrc" | head -1)"
fi
if [[ -n "${disk_cache}" && -d "${disk_cache}" ]]; then
  cache_kib="$(du -sk "${disk_cache}" 2>/dev/null | cut -f1)"
  if (( ${cache_kib:-0} > 20 * 1024 * 1024 )); then
    echo "install_deps: Bazel's disk cache ${disk_cache} holds $((cache_kib / 1024 / 1024)) GiB; dropping it" >&2
    rm -rf "${disk_cache:?}/ac" "${disk_cache:?}/cas"
  fi
fi
