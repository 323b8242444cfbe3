#!/usr/bin/env bash
# Install what ptolua needs from Debian's packages (idempotent; needs root
# only when something is missing). Usage: scripts/setup.sh [--bench]
set -euo pipefail
# luajit (ffi_spec), luarocks (install_and_rock), clang and its libFuzzer
# runtime (fuzz_blob), Open MPI (mpi_spec; PTO_MPI=auto builds with it when
# found), chromium (the run report's browser test): ctest names a test whose
# tool is missing as skipped, and fails it under CI.
pkgs=(gcc cmake make pkg-config lua5.4 liblua5.4-dev lua-busted luajit luarocks libreadline-dev lua-dkjson graphviz
      clang libclang-rt-14-dev openmpi-bin libopenmpi-dev chromium)
[[ "${1:-}" == "--bench" ]] && pkgs+=(libstarpu-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup: missing packages: ${missing[*]}; run as root or: sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi
