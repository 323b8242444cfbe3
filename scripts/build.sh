#!/usr/bin/env bash
# Configure and build into build/ (or build-$PTO_SANITIZE with a sanitizer).
# Usage: scripts/build.sh [extra cmake args]
set -euo pipefail
cd "$(dirname "$0")/.."
san="${PTO_SANITIZE:-}"
dir="build${san:+-$san}"
cmake -S . -B "$dir" -DPTO_SANITIZE="$san" "$@" >/dev/null
cmake --build "$dir" -j"$(nproc)" >/dev/null
echo "$dir"
