#!/usr/bin/env bash
# Build pto_microbench in Release mode under build-bench/ and run it:
# gemm_tile GFLOP/s per tile size, and the PROCESS-mode mailbox hand-off
# latency (process and thread peer, spinning and futex-only).
#   scripts/bench_micro.sh [gemm|mailbox]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$root/scripts/bench/common.sh"
"$root/scripts/setup.sh"
bench_build pto_microbench pto_chipsim
exec "$build/scripts/bench/pto_microbench" "$@"
