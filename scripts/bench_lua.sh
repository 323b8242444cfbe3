#!/usr/bin/env bash
# The Lua binding against the C API, in one invocation: pto_bench's shapes
# (W1 independent, W2 chain, W3 fan 1->8->1, W4 bgemm 4^4 x200 and 16^4) on
# two chips running the no-op "noop" kernel, through the C API, idiomatic
# Lua, its floor (the idiomatic form's tables and calls with every binding
# call a no-op: what the form costs whatever the binding does) and the fast
# form and its loops alone, each submit a no-op C call (fastloop: the
# least the fast form can cost; its ratio is C plus it over C)
# (scripts/bench_lua.lua). The C row every Lua row is compared with
# runs in the Lua rows' own process, on their Worker, inside their kind of
# run (the pto_bench_c module: the C loops called from the run's
# orchestration function), alternating with them: this machine's speed
# differs between processes by up to 2x, more than the goals' margins.
# C-own is the same C loops in a process of their own with no Lua at all
# (pto_bench_lua_c), for reference;
# and, when luajit is installed, LuaJIT calling the C API through its FFI
# (scripts/bench_lua_ffi.lua, libpto.so and pto_ffi.h), in THREAD and
# PROCESS mode. Then the main job (examples/bgemm.lua at its
# default size) in both modes beside the machine's GEMM peak (gemm_tile in a
# C loop on every core: pto_bench_lua_c peak), measured right before and
# after it, and beside the job's own kernels with no runtime at all (its
# gemm_tile and tile_add calls in a C loop on every core: pto_bench_lua_c
# jobloop), the most any scheduler could reach with these kernels, and
# beside the same DAG and kernels submitted through the C API
# (pto_bench_lua_c job): what of the main job's gap is Lua's.
#
# The rows are interleaved: every round runs each system once per mode (and
# the peak around the main job), so load from elsewhere on a shared machine
# falls on all of them alike. Printed: the best and the median over the
# rounds of each process's best of 3 in us/task, tasks/ms, and each row's
# ratio to the C row of its mode: best to best, and the median over the
# rounds of the ratio within one round (one process) for the rows that
# share the C row's process (the median to the median for the others).
# A benchmark, not a test (Release build in build-bench/).
# Last, the TensorMap with many live writers of one storage against one
# writer per storage (scripts/bench_tensormap.lua).
#   scripts/bench_lua.sh [rounds]        (default 5)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$root/scripts/bench/common.sh"
rounds="${1:-5}"
# Each process times every row this many times, the forms alternating, and
# reports the best: one hiccup of the host then does not decide a ratio.
reps=3
"$root/scripts/setup.sh" >/dev/null
bench_build pto_bench_lua_c pto_bench_c ptolua pto_chipsim pto_shared pto_ffi_header
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
cbench="$build/scripts/bench/pto_bench_lua_c"
luajit="$(command -v luajit || true)"
[[ -n "$luajit" ]] || echo "LuaJIT FFI rows skipped: no luajit on PATH (Debian: luajit)"
for ((r = 1; r <= rounds; r++)); do
  for mode in thread process; do
    "$cbench" "$mode" "$reps" | sed "s/^/$mode C-own /" >>"$out/rows"
    PTO_BENCH_C="$build/scripts/bench/pto_bench_c.so" "$build/ptolua" "$root/scripts/bench_lua.lua" "$mode" "$reps" |
      sed "s/^/$mode /" >>"$out/rows"
    if [[ -n "$luajit" ]]; then
      PTO_LIB="$build/libpto.so" PTO_FFI_HEADER="$build/pto_ffi.h" "$luajit" "$root/scripts/bench_lua_ffi.lua" "$mode" "$reps" |
        sed "s/^/$mode /" >>"$out/rows"
    fi
  done
  p1="$("$cbench" peak 64 | cut -d' ' -f2)"
  for mode in process thread; do
    lua="$(PTO_MODE=$mode "$build/ptolua" "$root/examples/bgemm.lua" 4 8 8 8 64 2 5 |
      awk '/ first run / { f = $(NF - 1) } / best of / { b = $(NF - 1) } END { print f, b }')"
    capi="$("$cbench" job "$mode" 4 8 8 8 64 2 5 | cut -d' ' -f3-)"
    echo "$mode $lua $capi" >>"$out/job.$r"
  done
  p2="$("$cbench" peak 64 | cut -d' ' -f2)"
  jl="$("$cbench" jobloop | cut -d' ' -f2)"
  awk -v p1="$p1" -v p2="$p2" -v jl="$jl" '{ print $0, (p1 + p2) / 2, jl }' "$out/job.$r" >>"$out/job"
done

awk '
  function sort(a, n,   i, j, t) { for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t } }
  function stats(key,   a, i, n) {   # sets best[key], med[key]
    n = cnt[key]
    for (i = 1; i <= n; i++) a[i] = val[key, i]
    sort(a, n)
    best[key] = a[1]; med[key] = a[int((n + 1) / 2)]
  }
  function paired(key, c, plus,   a, i, n) {   # the median over the rounds of (plus C +) key / C in the same round
    n = cnt[key]
    for (i = 1; i <= n; i++) a[i] = (plus * val[c, i] + val[key, i]) / val[c, i]
    sort(a, n)
    return a[int((n + 1) / 2)]
  }
  $2 == "heap" { heap[$1 " " $3] = $6; next }
  { key = $1 SUBSEP $2 SUBSEP $3; val[key, ++cnt[key]] = $4; if (!($3 in seen)) { shapes[++ns] = $3; seen[$3] = 1 } }
  END {
    for (k in cnt) stats(k)
    split("C C-own idiomatic floor fast fastloop ffi", forms, " ")
    # No goal for the floor (the idiomatic form with a no-op C call for each of its binding calls: what the
    # form costs in Lua whatever the binding does), fastloop (the fast form'"'"'s loops with a no-op C call for
    # each submit: its ratios are C plus it over C, the least the fast form can cost against C), the LuaJIT
    # FFI row (the C API from LuaJIT, a process of its own) nor C-own (the C rows in a process of their own,
    # pto_bench_lua_c: no Lua in it at all).
    split("1.00 - 2.00 - 1.25 - -", goal, " ")
    printf "%-7s %-5s %-10s %9s %9s %9s %8s %8s %6s\n", "mode", "shape", "form", "best us", "median us", "tasks/ms", "best/C", "med/C", "goal"
    for (m = 1; m <= 2; m++) {
      mode = m == 1 ? "thread" : "process"
      for (s = 1; s <= ns; s++) {
        sh = shapes[s]
        c = mode SUBSEP "C" SUBSEP sh
        for (f = 1; f <= 7; f++) {
          k = mode SUBSEP forms[f] SUBSEP sh
          if (!(k in cnt)) continue
          # Rows from the C rows'"'"' own process pair with them round by round; the others (other processes) do not.
          inproc = forms[f] == "idiomatic" || forms[f] == "floor" || forms[f] == "fast" || forms[f] == "fastloop"
          plus = forms[f] == "fastloop"
          rb = (plus * best[c] + best[k]) / best[c]; rm = inproc ? paired(k, c, plus) : med[k] / med[c]
          nogoal = f == 1 || goal[f] == "-"
          printf "%-7s %-5s %-10s %9.3f %9.3f %9.0f %7.2fx %7.2fx %5s%s\n", mode, sh, forms[f], best[k], med[k], 1000 / med[k], rb, rm,
                 nogoal ? "" : goal[f] "x", nogoal || rm <= goal[f] ? "" : " missed"
        }
      }
    }
    for (k in heap) printf "Lua heap allocated over 100 W4 4^4 runs (51,200 tasks), collector stopped, last round (%s): %s KiB\n", k, heap[k]
  }' "$out/rows"

echo
echo "main job: examples/bgemm.lua 4 8 8 8 64 2 (GFLOP/s; best of its 5 runs), against the GEMM peak"
echo "(gemm_tile 64x64 f32 in a C loop on every core, the mean of one second before and one after),"
echo "and the same DAG with the same kernels submitted through the C API (pto_bench_lua_c job): Lua's share of the gap;"
echo "its orchestrating thread's CPU (mean over runs 2-5): the submit loop, and pto_run_end running the scheduler's turns"
awk -v cores="$(nproc)" '
  function median(key, k,   a, i, j, t) {
    for (i = 1; i <= k; i++) a[i] = rs[key, i]
    for (i = 2; i <= k; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
    return a[int((k + 1) / 2)]
  }
  { m = $1; k = ++n[m]; first[m] = first[m] " " sprintf("%.1f", $2); bestv[m] = bestv[m] " " sprintf("%.1f", $3)
    cbest[m] = cbest[m] " " sprintf("%.1f", $5)
    ratio[m] = ratio[m] " " sprintf("%.0f%%", 100 * $3 / $9); rs[m "lua", k] = $3 / $9
    cratio[m] = cratio[m] " " sprintf("%.0f%%", 100 * $5 / $9); rs[m "c", k] = $5 / $9
    luac[m] = luac[m] " " sprintf("%.2f", $3 / $5); rs[m "luac", k] = $3 / $5
    if (m == "thread") { peaks = peaks " " sprintf("%.0f", $9); loops = loops " " sprintf("%.0f (%.0f%%)", $10, 100 * $10 / $9) }
    ofloop[m] = ofloop[m] " " sprintf("%.0f%%", 100 * $3 / $10)
    orch[m] = orch[m] " " sprintf("%.1f+%.1f/%.1f", $7, $8, $6); rs[m "orch", k] = ($7 + $8) / (cores * $6) }
  END {
    for (m in n) {
      k = n[m]
      printf "%-7s first run:%s\n        best run:%s\n        of peak: %s  (median %.0f%%, goal 70%%)\n", m, first[m], bestv[m], ratio[m], 100 * median(m "lua", k)
      printf "        of jobloop:%s\n", ofloop[m]
      printf "        C API job, best run:%s, of peak:%s  (median %.0f%%)\n", cbest[m], cratio[m], 100 * median(m "c", k)
      printf "        Lua / C API job:%s  (median %.2f)\n", luac[m], median(m "luac", k)
      printf "        C API job, its orchestrating thread'"'"'s CPU per run, submit+drain/run ms:%s  (median %.0f%% of the %d cores)\n", orch[m], 100 * median(m "orch", k), cores
    }
    print "peak per round (GFLOP/s):" peaks
    print "jobloop per round (GFLOP/s, of peak): the job'"'"'s gemm_tile and tile_add in a C loop on every core, no runtime:" loops
  }' "$out/job"

echo
echo "TensorMap: writers of one storage (views of one tensor) against one writer per storage (scripts/bench_tensormap.lua)"
for mode in thread process; do
  PTO_MODE=$mode "$build/ptolua" "$root/scripts/bench_tensormap.lua"
done
