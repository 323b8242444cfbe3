#!/usr/bin/env bash
# The MPI scale-out's figures in one run (docs/mpi.md, docs/performance.md):
# per-L4-task overhead of a remote L3 (rank 1) against local L3s, and the
# bandwidth of INOUT tensors (64 KiB - 64 MiB, out to rank 1 and back)
# against a bare MPI_Send/MPI_Recv ping-pong of the same sizes, measured in
# the same run. A benchmark, not a test: the box's load moves the numbers;
# compare the ratios, and run it several times.
#   scripts/bench_mpi.sh [min_ms per figure]   (default 1000)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$root/scripts/bench/common.sh"
ms="${1:-1000}"
command -v mpirun >/dev/null || { echo "bench_mpi: needs mpirun (Debian: openmpi-bin libopenmpi-dev)" >&2; exit 1; }
BENCH_CMAKE_ARGS=-DPTO_MPI=ON bench_build ptolua pto_chipsim
mpicc -O2 -o "$build/bench_mpi_pingpong" "$root/scripts/bench_mpi.c"
run=(mpirun -np 2)
[[ $(id -u) -eq 0 ]] && run=(mpirun --allow-run-as-root -np 2)
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"${run[@]}" "$build/bench_mpi_pingpong" "$ms" >"$tmp/pp"
"${run[@]}" "$build/ptolua" "$root/scripts/bench_mpi.lua" "$ms" >"$tmp/pto"
awk '
  FNR == NR { pp[$2] = $3; next }
  $1 == "overhead" { ov[$2] = $3 }
  $1 == "tensor" { t[$2] = $3; order[++n] = $2 }
  END {
    printf "per-L4-task overhead (empty orchestration function, one L3)\n"
    printf "  %-22s %10.1f us\n", "remote L3 (MPI rank 1)", ov["remote"] * 1e6
    printf "  %-22s %10.1f us   remote/local %.2fx (goal: within 2x)\n", "local L3, process mode", ov["local_process"] * 1e6, ov["remote"] / ov["local_process"]
    printf "  %-22s %10.1f us   remote/local %.2fx\n", "local L3, thread mode", ov["local_thread"] * 1e6, ov["remote"] / ov["local_thread"]
    printf "\nINOUT tensor to rank 1 and back (bytes both ways) vs bare MPI ping-pong\n"
    printf "  %10s %14s %14s %8s\n", "size", "pto MB/s", "MPI MB/s", "ratio"
    for (i = 1; i <= n; i++) {
      b = order[i]; mine = 2 * b / t[b] / 1e6; base = 2 * b / pp[b] / 1e6
      printf "  %7d KiB %14.0f %14.0f %7.2fx%s\n", b / 1024, mine, base, mine / base, (b >= 1048576 ? "  (goal >= 0.8x)" : "")
    }
  }' "$tmp/pp" "$tmp/pto"
