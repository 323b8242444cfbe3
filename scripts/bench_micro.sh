#!/usr/bin/env bash
# Build pto_microbench in Release mode under build-bench/ and run it:
# gemm_tile GFLOP/s per tile size, and the PROCESS-mode mailbox hand-off
# latency (process and thread peer, spinning and futex-only).
#   scripts/bench_micro.sh [gemm|mailbox]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build-bench}"
"$root/scripts/setup.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --target pto_microbench pto_chipsim -j "$(nproc)" >/dev/null
exec "$build/scripts/bench/pto_microbench" "$@"
