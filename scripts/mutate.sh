#!/usr/bin/env bash
# Mutation check: does the suite notice realistic one-line bugs?
#
# Each mutant below is a small named edit of the engine, the binding or the
# Lua code, anchored on code text (a string that must occur exactly once in
# its file), never on a line number. For each one this script copies the
# tracked tree into one scratch directory (built once, then rebuilt
# incrementally), applies the edit, builds, runs the whole ctest suite,
# reverts the edit, and reports whether the suite failed ("killed", with the
# tests that caught it) or passed ("survived": no test can see that bug).
#
# Usage: scripts/mutate.sh [--list] [--jobs N] [--keep] [NAME ...]
#   NAME ...   run only these mutants (default: all)
#   --list     print the mutants and exit
#   --jobs N   ctest -j N (default: nproc)
#   --keep     keep the scratch directory (printed at the start)
# Environment: PTO_MUTATE_TIMEOUT=s  seconds one mutant's suite may take (default 300,
#              ten times a normal run; a suite still running then is stopped and the
#              mutant counts as killed by "timeout", naming the tests that hung).
# Not run by CI: about one build plus one suite run per mutant.
# Last line: "N killed, M survived"; the exit status is non-zero if any survived
# (or an anchor is missing, or a mutant does not build).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)

names=() files=() finds=() repls=() whys=()
# mutant NAME FILE FIND REPLACE WHY  (FIND/REPLACE: literal text; \n means a newline)
mutant() { names+=("$1"); files+=("$2"); finds+=("$3"); repls+=("$4"); whys+=("$5"); }

mutant child_pids_no_chips src/binding/lpto_worker.c \
  'push_child_pids(L, W, PTO_NEXT_LEVEL, W->nchips);' \
  'push_child_pids(L, W, PTO_NEXT_LEVEL, 0);' \
  'Worker:child_pids() leaves out the chips'
mutant group_lookup_member0_only src/engine/orchestrator.c \
  'if (a->tags[i] == PTO_INPUT || a->tags[i] == PTO_INOUT)' \
  'if (m == 0 && (a->tags[i] == PTO_INPUT || a->tags[i] == PTO_INOUT))' \
  'submit looks up dependencies of group member 0 only'
mutant try_ref_off_by_one src/engine/slot.c \
  'if (rel >= total + 1) return false;' \
  'if (rel > total + 1) return false;' \
  'try_ref takes a reference on a consumed slot'
mutant merge_drops_dependency src/engine/orchestrator.c \
  'o->tmp_refs[i].dep |= dep;' \
  '' \
  'a producer seen first as a slab hold loses its dependency when seen again'
mutant no_poison_failed_producer src/engine/scheduler.c \
  'if (failed) poison_consumer(c, p);' \
  '' \
  'wiring a consumer of an already-failed producer does not poison it'
mutant running_producer_finished src/engine/scheduler.c \
  'if (st == PTO_TASK_COMPLETED || st == PTO_TASK_FAILED || st == PTO_TASK_CONSUMED) {' \
  'if (st >= PTO_TASK_RUNNING) {' \
  'wiring treats a running producer as finished'
mutant tag_names_swapped src/engine/task_args.c \
  '{"in", "out", "inout", "out_existing", "no_dep"}' \
  '{"out", "in", "inout", "out_existing", "no_dep"}' \
  'tag names swapped: the binding parses "in" as OUTPUT and "out" as INPUT'
mutant workers_idle_as_running lua/pto/commands.lua \
  'local now = "idle"' \
  'local now = "running"' \
  ':workers shows an idle child as "running"'
mutant ring_release_one_slab src/engine/ring.c \
  'while (r->count && at(r, 0)->released) {' \
  'if (r->count && at(r, 0)->released) {' \
  'a heap ring release pops at most one released slab off its head'
mutant scope_depth_off_by_one src/engine/scope.c \
  'if (s->top > PTO_MAX_SCOPE_DEPTH) return -1;' \
  'if (s->top > PTO_MAX_SCOPE_DEPTH + 1) return -1;' \
  'scopes may nest one deeper than their frames'
mutant scope_end_keeps_hold src/engine/orchestrator.c \
  's->scope_held = false;' \
  '' \
  'a closed scope still marks its slots as held (false heap deadlocks)'
mutant run_end_keeps_retired src/engine/orchestrator.c \
  '    drain_retired(o);\n    assert(pto_scope_held' \
  '    assert(pto_scope_held' \
  'a run end leaves the slots retired during the run queued, to be reclaimed again in the next run'
mutant run_end_drops_before_drain src/engine/orchestrator.c \
  '    bool ok = wait_until(o, finished_all, ORCH_WAIT_FINISH);\n    if (ok) {\n        drop_scopes(o);' \
  '    drop_scopes(o);\n    bool ok = wait_until(o, finished_all, ORCH_WAIT_FINISH);\n    if (ok) {' \
  'a run end drops its scopes before its tasks finished: the pool is reset under running tasks'
mutant tensormap_touching_overlap src/engine/tensormap.c \
  'if (b->count && b->one.start < end && start < b->one.end) fn(b->one.producer, arg);' \
  'if (b->count && b->one.start <= end && start <= b->one.end) fn(b->one.producer, arg);' \
  'adjacent byte ranges count as overlapping (false dependencies)'
mutant mailbox_len_without_scalars src/engine/mailbox.c \
  'c->blob_len = (uint32_t)n;' \
  'c->blob_len = (uint32_t)(n - 8 * args->scalar_count);' \
  'a PROCESS-mode mailbox posts a blob length without the scalars'
mutant ring_ignores_after_prev src/engine/mailbox.c \
  'c->skipped = revoked || (c->after_prev && prev_failed) || producer_failed;' \
  'c->skipped = revoked || (c->after_prev && prev_failed && false) || producer_failed;' \
  'a child runs a chained cell although the cell before it (its producer) failed'
mutant interrupt_revokes_nothing src/engine/worker_manager.c \
  'if (cancelled(wt, staged_at(wt, k)->slot)) pto_proc_revoke(wt->child, k);' \
  'if (cancelled(wt, staged_at(wt, k)->slot)) (void)k;' \
  'an interrupt or a cancel lets the tasks handed to a child but not begun run'
mutant respawn_skips_dead_child src/engine/process.c \
  'if (st == PTO_MB_DEAD || st == PTO_MB_EMPTY) {' \
  'if (st == PTO_MB_EMPTY) {' \
  'a child that died while idle is not replaced before the next task'
mutant dispatch_held_unclassified src/engine/orch_heap.c \
  'pto_set_error_code(PTO_ERR_DISPATCH_HELD,' \
  'pto_set_error_code(PTO_ERR_FAILED,' \
  'a ring full while dispatch is held is not classified, so Lua users get no :step / :release advice'
mutant completion_skips_inherited lua/pto/repl.lua \
  't = type(m) == "table" and rawget(m, "__index") or nil' \
  't = nil' \
  'TAB completion misses methods a methods table inherits (the orchestrator methods written in Lua)'
mutant blob_decode_no_size_check src/engine/task_args.c \
  'if (pto_blob_size(t, s) > len) return -1;' \
  '' \
  'the args blob decoder trusts counts larger than the blob'
mutant group_done_early src/engine/scheduler.c \
  'if (x->group_size > 1 && ++x->members_done < x->group_size) return;' \
  'if (x->group_size > 1 && ++x->members_done < x->group_size - 1) return;' \
  'a group completes before its last member returns'
mutant event_no_heavy_barrier src/engine/event.c \
  'static bool heavy_barrier(void) { return membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0; }' \
  'static bool heavy_barrier(void) { return true; }' \
  'an asymmetric event sleeps without the membarrier its light notifiers rely on'
mutant event_notify_no_fence src/engine/event.c \
  '     * work, or we see it sleeping (Dekker). */\n    atomic_thread_fence(memory_order_seq_cst);' \
  '     * work, or we see it sleeping (Dekker). */\n    atomic_signal_fence(memory_order_seq_cst);' \
  'pto_event_notify drops its half of the Dekker pairing'
mutant early_no_wait src/engine/mailbox.c \
  'if (n > PTO_DONE_WAITS || !mb->done_pages) return false;' \
  'if (n > PTO_DONE_WAITS || !mb->done_pages) return false;\n    n = 0;' \
  'a task posted early runs without waiting for its producers on other children'
mutant early_no_settle src/engine/done_words.c \
  '    _Atomic uint64_t *w = &d->page->w[r->word];' \
  '    if (r) return;\n    _Atomic uint64_t *w = &d->page->w[r->word];' \
  'the parent never answers for a producer lost with its child: its early consumers wait forever'
mutant early_no_defer src/engine/scheduler.c \
  '        if (x->fanin_released < x->fanin_count) {\n            defer_completion(s, wt, c);' \
  '        if (0) {\n            defer_completion(s, wt, c);' \
  'an early task that finished before its producer did here is finished first, out of DAG order'
mutant early_over_backlog src/engine/sched_early.c \
  '    if (s->ready[c->kind].head) return true;' \
  '    if (0 && s->ready[c->kind].head) return true;' \
  'a consumer goes early while ready tasks of its kind wait for a worker, and takes a child from them'
mutant early_behind_other_work src/engine/sched_early.c \
  '(wt->last_sent == (uintptr_t)ps[k] || wt->last_sent_early)' \
  '1' \
  'an early consumer goes to its producer'"'"'s child behind an unrelated long task while the other child idles'
mutant nudge_does_not_move src/engine/process.c \
  'bool ok = sched_setaffinity(pid, sizeof one, &one) == 0;' \
  'bool ok = true; (void)one;' \
  'the spread (pto_wm_spread) moves no child, so two children left on one core stay there'
mutant nudge_pins_child src/engine/process.c \
  '    sched_setaffinity(pid, sizeof was, &was);\n    return ok;' \
  '    return ok;' \
  'a nudged child is left pinned to one CPU instead of getting its own CPU mask back'

usage() { sed -n '12,21p' "$0" | sed 's/^# \{0,1\}//'; }

jobs=$(nproc) keep=0 list=0 want=()
while (($#)); do
  case "$1" in
    --list) list=1 ;;
    --jobs) jobs="${2:?--jobs needs a number}"; shift ;;
    --jobs=*) jobs="${1#--jobs=}" ;;
    --keep) keep=1 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "mutate.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) want+=("$1") ;;
  esac
  shift
done

if ((list)); then
  for i in "${!names[@]}"; do printf '%-28s %-28s %s\n' "${names[$i]}" "${files[$i]}" "${whys[$i]}"; done
  exit 0
fi

sel=()
if ((${#want[@]})); then
  for w in "${want[@]}"; do
    found=0
    for i in "${!names[@]}"; do [[ "${names[$i]}" == "$w" ]] && { sel+=("$i"); found=1; }; done
    ((found)) || { echo "mutate.sh: no mutant named $w (see --list)" >&2; exit 2; }
  done
else
  sel=("${!names[@]}")
fi

# apply FILE FIND REPLACE: exactly one occurrence of FIND becomes REPLACE.
# Exit 3 if FIND is missing or not unique (then FILE is untouched).
apply() {
  python3 - "$1" "$2" "$3" <<'EOF'
import sys
path, find, repl = sys.argv[1], sys.argv[2].replace('\\n', '\n'), sys.argv[3].replace('\\n', '\n')
try:
    text = open(path, encoding='utf-8').read()
except FileNotFoundError:
    print(f"{path}: no such file", file=sys.stderr)
    sys.exit(3)
n = text.count(find)
if n != 1:
    print(f"{path}: the anchor occurs {n} times", file=sys.stderr)
    sys.exit(3)
open(path, 'w', encoding='utf-8').write(text.replace(find, repl))
EOF
}

# Every anchor first: a stale one fails now, not after an hour of builds.
bad=0
for i in "${sel[@]}"; do
  f="$root/${files[$i]}"
  tmp=$(mktemp)
  cp "$f" "$tmp" 2>/dev/null || : >"$tmp"
  if ! apply "$tmp" "${finds[$i]}" "${repls[$i]}" 2>/dev/null; then
    echo "anchor not found: ${names[$i]} (${files[$i]}: '${finds[$i]}' must occur exactly once)" >&2
    bad=1
  fi
  rm -f "$tmp"
done
((bad)) && exit 3

scratch=$(mktemp -d "${TMPDIR:-/tmp}/ptolua-mutate.XXXXXX")
cur_file="" cur_orig=""
cleanup() {
  [[ -n "$cur_file" && -f "$cur_orig" ]] && cp "$cur_orig" "$cur_file"
  if ((keep)); then echo "scratch tree kept in $scratch" >&2; else rm -rf "$scratch"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
echo "mutate.sh: ${#sel[@]} mutants; scratch tree $scratch"

# Tracked files plus new ones not yet committed (not ignored build output).
mkdir -p "$scratch/src-tree"
(cd "$root" && git ls-files -z --cached --others --exclude-standard |
  tar --null --ignore-failed-read -T - -cf - 2>/dev/null) | tar -C "$scratch/src-tree" -xf -
src="$scratch/src-tree" build="$scratch/build"

build_tree() { cmake --build "$build" -j"$(nproc)" >"$scratch/build.log" 2>&1; }

# Tests ctest started but never finished, and those that finished failing,
# read from its progress log (for a suite stopped by the timeout).
hung_tests() {
  awk '/^ *Start +[0-9]+: /{ s[$3] = 1 }
       / Test +#[0-9]+: /{ for (i = 1; i < NF; i++) if ($i ~ /^#[0-9]+:$/) { f[$(i + 1)] = 1; if ($0 ~ /\*\*\*/) bad = bad " " $(i + 1) } }
       END { h = ""; for (n in s) if (!(n in f)) h = h " " n; printf "timeout (hung:%s%s)", h, bad ? "; failed before:" bad : "" }' "$scratch/ctest.log"
}

# run_suite: ctest the scratch build; sets $failed to the failing tests (or "timeout (...)").
run_suite() {
  local rc=0
  rm -f "$build/Testing/Temporary/LastTestsFailed.log"
  (cd "$build" && timeout "${PTO_MUTATE_TIMEOUT:-300}" ctest -j"$jobs" >"$scratch/ctest.log" 2>&1) || rc=$?
  failed=""
  if ((rc == 124)); then failed=$(hung_tests); return 1; fi
  if [[ -f "$build/Testing/Temporary/LastTestsFailed.log" ]]; then
    failed=$(sed 's/^[0-9]*://' "$build/Testing/Temporary/LastTestsFailed.log" | tr '\n' ' ' | sed 's/ $//')
  fi
  [[ $rc -eq 0 && -z "$failed" ]]
}

echo "mutate.sh: building and testing the unmutated tree"
cmake -S "$src" -B "$build" >"$scratch/cmake.log" 2>&1 || { cat "$scratch/cmake.log" >&2; exit 2; }
build_tree || { tail -40 "$scratch/build.log" >&2; echo "mutate.sh: the unmutated tree does not build" >&2; exit 2; }
if ! run_suite; then
  echo "mutate.sh: the unmutated tree fails its suite ($failed); fix that first" >&2
  exit 2
fi

killed=0 survived=0 broken=0 report=()
for i in "${sel[@]}"; do
  name=${names[$i]}
  cur_file="$src/${files[$i]}" cur_orig="$scratch/orig"
  cp "$cur_file" "$cur_orig"
  apply "$cur_file" "${finds[$i]}" "${repls[$i]}"
  t0=$(date +%s)
  if ! build_tree; then
    line=$(printf '%-9s %-28s %s' "NO BUILD" "$name" "(see a build log with --keep)")
    broken=$((broken + 1))
  elif run_suite; then
    line=$(printf '%-9s %-28s %s' "SURVIVED" "$name" "${whys[$i]}")
    survived=$((survived + 1))
  else
    line=$(printf '%-9s %-28s by %s' "killed" "$name" "$failed")
    killed=$((killed + 1))
  fi
  ((keep)) && cp "$scratch/ctest.log" "$scratch/ctest-$name.log" 2>/dev/null
  cp "$cur_orig" "$cur_file"
  touch "$cur_file"   # newer than the mutant's objects, so the next build redoes them
  cur_file=""
  echo "$line ($(($(date +%s) - t0)) s)"
  report+=("$line")
done

echo
echo "---- mutation check: ${#sel[@]} mutants"
printf '%s\n' "${report[@]}"
((broken)) && echo "$broken mutants did not build (fix their replacement text)"
echo "$killed killed, $survived survived"
((survived == 0 && broken == 0))
