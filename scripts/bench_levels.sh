#!/usr/bin/env bash
# Tasks on one Worker child overlap (docs/performance.md, "Tasks on one
# Worker child"): an L4 over one L3 with 2 chips runs 100 tasks, each an L3
# run of a chain of 3 spin_us tasks. Rows alternate within one process:
# "chained" (the L4 tasks share an INOUT tensor, so the L3 runs them one at
# a time) and "independent" (the L3 begins each while the ones before it
# run). Printed: us per L4 task, best and median, the speed-up (median to
# median) and the floors (one L3 run alone: 3 x us; both chips busy: 1.5 x
# us). A benchmark, not a test (Release build in build-bench/).
#   scripts/bench_levels.sh [rounds] [tasks] [us]     (default 5 100 200)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$root/scripts/bench/common.sh"
rounds="${1:-5}"
n="${2:-100}"
us="${3:-200}"
bench_build ptolua pto_chipsim
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
for mode in thread process; do
  "$build/ptolua" "$root/scripts/bench_levels.lua" "$mode" "$rounds" "$n" "$us" >>"$out"
done
echo "$n L4 tasks on one L3 (2 chips), each an L3 run of 3 chained ${us} us tasks; $rounds rounds; us per L4 task"
echo "floors: one L3 run at a time $((3 * us)) us, both chips busy $((3 * us / 2)) us"
printf '%-8s %14s %14s %14s %14s %10s\n' mode "chained best" "chained med" "indep best" "indep med" "speed-up"
awk '
  { v[$1, $2, ++n[$1, $2]] = $3; modes[$1] = 1 }
  function stats(m, kind,   i, k, a, t, j) {
    k = n[m, kind]
    for (i = 1; i <= k; i++) a[i] = v[m, kind, i]
    for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    best = a[1]; med = (k % 2) ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
  }
  END {
    for (m in modes) {
      stats(m, "chained"); cb = best; cm = med
      stats(m, "independent"); ib = best; im = med
      printf "%-8s %14.1f %14.1f %14.1f %14.1f %9.2fx\n", m, cb, cm, ib, im, cm / im
    }
  }' "$out"
