#!/usr/bin/env bash
# Heap allocations per task of the Lua rows of scripts/bench_lua.sh: each
# shape and form of scripts/bench_lua.lua run alone under the malloc counter
# (scripts/bench/malloc_count.c, LD_PRELOADed), once with 1 timed repetition
# and once with 3 (each after one warm-up), so that the difference is the
# allocations of 2 repetitions alone: startup, the Worker and the warm-up
# cancel out. Counted in the ptolua process only (the orchestrator, the
# scheduler and THREAD-mode workers), not in PROCESS-mode children.
# Prints "<mode> <form> <shape> <allocations per task> <frees per task>".
#   scripts/bench_malloc.sh [thread|process|both] [shapes...]   (default: thread, all shapes)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$root/scripts/bench/common.sh"
modes="${1:-thread}"
[[ "$modes" == both ]] && modes="thread process"
shift || true
shapes="${*:-W1 W2 W3 W4s W4l}"
"$root/scripts/setup.sh" >/dev/null
bench_build ptolua pto_chipsim pto_malloc_count
shim="$build/scripts/bench/libpto_malloc_count.so"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
count() {   # mode form shape reps -> "<allocs> <frees> <tasks per rep>"
  local f="$out/count.$RANDOM"
  local line
  line="$(PTO_MALLOC_COUNT="$f" LD_PRELOAD="$shim" "$build/ptolua" "$root/scripts/bench_lua.lua" "$1" "$4" "$2" "$3")"
  echo "$(cat "$f") ${line##* }"
}
for mode in $modes; do
  for shape in $shapes; do
    for form in idiomatic fast; do
      read -r a1 f1 _ <<<"$(count "$mode" "$form" "$shape" 1)"
      read -r a3 f3 n <<<"$(count "$mode" "$form" "$shape" 3)"
      awk -v m="$mode" -v fo="$form" -v s="$shape" -v a="$((a3 - a1))" -v f="$((f3 - f1))" -v n="$n" \
        'BEGIN { printf "%-7s %-9s %-4s %7.2f %7.2f\n", m, fo, s, a / (2 * n), f / (2 * n) }'
    done
  done
done
