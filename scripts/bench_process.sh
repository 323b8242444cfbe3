#!/usr/bin/env bash
# PROCESS mode against THREAD mode and against the floor of a bare
# two-process shared-memory ping-pong, all measured in this run.
#   scripts/bench_process.sh [scale]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build-bench}"
"$root/scripts/setup.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --target ptolua pto_pingpong pto_chipsim -j "$(nproc)" >/dev/null
"$build/scripts/bench/pto_pingpong"
"$build/ptolua" "$root/scripts/bench_process.lua" "$@"
