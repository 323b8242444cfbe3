#!/usr/bin/env bash
# Configure and build into build/ (or build-$PTO_SANITIZE with a sanitizer;
# build-nompi, without the MPI scale-out, with PTO_MPI=off).
# Usage: scripts/build.sh [extra cmake args]
set -euo pipefail
cd "$(dirname "$0")/.."
san="${PTO_SANITIZE:-}"
dir="build${san:+-$san}"
mpi=()
if [[ "${PTO_MPI:-}" == off ]]; then
  dir="$dir-nompi"
  mpi=(-DPTO_MPI=off)
fi
cmake -S . -B "$dir" -DPTO_SANITIZE="$san" "${mpi[@]}" "$@" >/dev/null
cmake --build "$dir" -j"$(nproc)" >/dev/null
echo "$dir"
