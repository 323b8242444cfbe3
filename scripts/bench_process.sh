#!/usr/bin/env bash
# Every figure of the PROCESS-mode and engine goals in one run: the floor
# of a bare two-process shared-memory ping-pong, the engine's C API against
# OpenMP and StarPU (scripts/bench.sh's table) with the METG(50%) table,
# then PROCESS mode against THREAD mode from Lua (shapes, one sub child's
# marginal and fixed costs, examples/bgemm.lua in steady state).
#   scripts/bench_process.sh [scale] [--reps=N]   (scale 1 = default sizes)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$root/scripts/bench/common.sh"
scale=1 reps=3
for a in "$@"; do
  case "$a" in
    --reps=*) reps="${a#--reps=}" ;;
    *) scale="$a" ;;
  esac
done
"$root/scripts/setup.sh" --bench || echo "bench: could not install libstarpu-dev; StarPU columns will be skipped" >&2
bench_build ptolua pto_pingpong pto_chipsim pto_bench
export STARPU_SILENT="${STARPU_SILENT:-1}"
"$build/scripts/bench/pto_pingpong"
echo
"$build/scripts/bench/pto_bench" --reps="$reps" --metg 2>/dev/null
echo
"$build/ptolua" "$root/scripts/bench_process.lua" "$scale"
