#!/usr/bin/env bash
# Checks that every C++ and CUDA source git tracks is formatted as the root
# .clang-format (Google style) says. Prints the files that are not and exits
# non-zero when there are any; `tools/check_format.sh --fix` formats them.
#
# Usage: tools/check_format.sh [--fix]
set -uo pipefail
cd "$(dirname "$0")/.."

if ! command -v clang-format > /dev/null; then
  echo "check_format: installing clang-format" >&2
  SUDO=""
  if [[ "$(id -u)" != 0 ]]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  ${SUDO} apt-get update -qq && ${SUDO} apt-get install -y -qq clang-format > /dev/null
fi

mapfile -t files < <(git ls-files -- '*.cc' '*.h' '*.cu' '*.cuh')
if [[ "${1:-}" == "--fix" ]]; then
  clang-format -i "${files[@]}"
  exit 0
fi
unformatted=()
for file in "${files[@]}"; do
  if ! clang-format --dry-run --Werror "${file}" > /dev/null 2>&1; then
    unformatted+=("${file}")
  fi
done
if ((${#unformatted[@]} > 0)); then
  echo "check_format: ${#unformatted[@]} file(s) differ from clang-format (run tools/check_format.sh --fix):" >&2
  printf '  %s\n' "${unformatted[@]}" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files formatted" >&2
