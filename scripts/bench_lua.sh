#!/usr/bin/env bash
# The Lua binding against the C API, in one invocation: pto_bench's shapes
# (W1 independent, W2 chain, W3 fan 1->8->1, W4 bgemm 4^4 x200 and 16^4) on
# two chips running the no-op "noop" kernel, through the C API
# (pto_bench_lua_c), idiomatic Lua and the fast form (scripts/bench_lua.lua),
# in THREAD and PROCESS mode. Prints best us/task (median beside it), tasks
# per ms and the Lua/C ratios against the C row of the same run and mode.
# Then the main job (examples/bgemm.lua at its default size) in both modes
# beside the machine's GEMM peak measured in the same run (gemm_tile in a C
# loop on every core: pto_bench_lua_c peak), and the ratio.
# A benchmark, not a test (Release build in build-bench/).
#   scripts/bench_lua.sh [reps]        (default 5 timed repetitions per row)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build-bench}"
reps="${1:-5}"
"$root/scripts/setup.sh" >/dev/null
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --target pto_bench_lua_c ptolua pto_chipsim -j "$(nproc)" >/dev/null
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
for mode in thread process; do
  "$build/scripts/bench/pto_bench_lua_c" "$mode" "$reps" | sed "s/^/$mode C /" >>"$out/rows"
  "$build/ptolua" "$root/scripts/bench_lua.lua" "$mode" "$reps" | sed "s/^/$mode /" >>"$out/rows"
done
awk '
  $2 == "heap" { heap[$1 " " $3] = $6; next }
  { best[$1, $2, $3] = $4; med[$1, $2, $3] = $5; if (!($3 in seen)) { shapes[++ns] = $3; seen[$3] = 1 } }
  END {
    split("C idiomatic fast", forms, " ")
    split("1.00 2.00 1.25", goal, " ")
    printf "%-7s %-5s %-10s %10s %10s %9s %8s %6s\n", "mode", "shape", "form", "best us", "median us", "tasks/ms", "vs C", "goal"
    for (m = 1; m <= 2; m++) {
      mode = m == 1 ? "thread" : "process"
      for (s = 1; s <= ns; s++) {
        sh = shapes[s]
        c = best[mode, "C", sh]
        for (f = 1; f <= 3; f++) {
          fo = forms[f]
          if (!((mode, fo, sh) in best)) continue
          b = best[mode, fo, sh]
          ratio = c > 0 ? b / c : 0
          printf "%-7s %-5s %-10s %10.3f %10.3f %9.0f %7.2fx %5s%s\n", mode, sh, fo, b, med[mode, fo, sh], 1000 / b, ratio,
                 f == 1 ? "" : goal[f] "x", f == 1 || ratio <= goal[f] ? "" : " MISSED"
        }
      }
    }
    for (k in heap) printf "Lua heap allocated over 100 W4 4^4 runs (51,200 tasks), collector stopped (%s): %s KiB\n", k, heap[k]
  }' "$out/rows"

echo
peak="$("$build/scripts/bench/pto_bench_lua_c" peak 64)"
read -r _ total threads per <<<"$peak"
echo "GEMM peak: gemm_tile 64x64 f32 in a C loop on $threads cores: $total GFLOP/s ($per per core)"
for mode in process thread; do
  PTO_MODE=$mode "$build/ptolua" "$root/examples/bgemm.lua" 4 8 8 8 64 2 "$reps" >"$out/bgemm"
  awk -v mode="$mode" -v peak="$total" '
    / first run / { first = $(NF - 1) }
    / best of / { best = $(NF - 1) }
    END { printf "main job (examples/bgemm.lua 4 8 8 8 64 2, %s): first run %.2f GFLOP/s, best %.2f GFLOP/s = %.0f%% of peak (goal 70%%)\n",
                 mode, first, best, 100 * best / peak }' "$out/bgemm"
done
