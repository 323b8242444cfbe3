#!/usr/bin/env bash
# Submitted runs against blocking runs (docs/performance.md, "Run
# handles"): 200 back-to-back runs of BGEMM 2^4 with Worker:run, then with
# Worker:submit + Worker:wait_all, in THREAD and PROCESS mode, on the noop
# kernel (a run's fixed cost) and on gemm_tile (32x32 tiles), with runs
# that feed a stream of 8 output sets ("stream") or all accumulate into the
# same tiles ("chain", each run waiting for the last; see
# scripts/bench_runs.lua). Both rows of a
# mode alternate within one process, so load from elsewhere falls on both;
# printed: the best and median runs/s over the rounds and the speed-up
# (median to median, best to best). Goal: speed-up >= 1.5 on 2 cores.
# A benchmark, not a test (Release build in build-bench/).
#   scripts/bench_runs.sh [rounds] [runs]        (default 5 200)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$root/scripts/bench/common.sh"
rounds="${1:-5}"
runs="${2:-200}"
bench_build ptolua pto_chipsim
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
for what in "noop stream" "gemm stream" "noop chain" "gemm chain"; do
  for mode in thread process; do
    # shellcheck disable=SC2086
    "$build/ptolua" "$root/scripts/bench_runs.lua" "$mode" "$rounds" "$runs" $what >>"$out"
  done
done
echo "$runs runs of BGEMM 2^4 (32 tasks a run) on 2 chips, $rounds rounds; runs/s (higher is better)"
printf '%-8s %-12s %12s %12s %12s %12s %10s %10s\n' mode kernel "run best" "run median" "submit best" "submit med" "x best" "x median"
awk '
  { key = $1 " " $2; v[key, $3, ++n[key, $3]] = $4; keys[key] = 1 }
  function stats(k, kind,   i, m, a, t, j) {
    m = n[k, kind]
    for (i = 1; i <= m; i++) a[i] = v[k, kind, i]
    for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] > a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    best = a[1]; med = (m % 2) ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
  }
  END {
    for (k in keys) {
      stats(k, "run"); rb = best; rm = med
      stats(k, "submit"); sb = best; sm = med
      split(k, p, " ")
      printf "%-8s %-12s %12.0f %12.0f %12.0f %12.0f %9.2fx %9.2fx\n", p[1], p[2], rb, rm, sb, sm, sb / rb, sm / rm
    }
  }' "$out" | sort
echo "goal: submit >= 1.5x run"
