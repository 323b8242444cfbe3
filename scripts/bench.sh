#!/usr/bin/env bash
# Build pto_bench in Release mode under build-bench/ and run it.
#   scripts/bench.sh [--quick] [--shapes=w1,w2,w3,w4s,w4l] [--systems=ptolua,openmp,starpu] [--reps=N]
# Arguments are passed through to pto_bench (see --help). BUILD_DIR and JOBS
# override the build directory and parallelism.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build-bench}"
jobs="${JOBS:-$(nproc 2>/dev/null || echo 2)}"

"$root/scripts/setup.sh" --bench || echo "bench: could not install libstarpu-dev; StarPU rows will be skipped" >&2
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --target pto_bench -j "$jobs"

export STARPU_SILENT="${STARPU_SILENT:-1}"
exec "$build/scripts/bench/pto_bench" "$@"
