/* orch_heap.c - heap-ring memory for the orchestrator, with back-pressure.
 *
 * A submit's automatic OUTPUTs and pto_alloc take their memory from the
 * heap ring their scope selects. When the ring is full the orchestrator
 * waits here, reclaiming what the scheduler hands back, until the ring's
 * oldest slabs are freed. A request larger than the ring fails at once;
 * otherwise the wait ends in one of three ways besides success, each with
 * an error that says what to do: a deadlock (the oldest slab belongs to a
 * scope that is still open, which only this orchestrator could end), no
 * progress for alloc_timeout_ms, or nothing left that could free it
 * (shutdown, an interrupt, dispatch held). What a successful wait freed
 * sizes the ring a run needs (its statistics). */
#include "orchestrator.h"
#include "common.h"
#include "check.h"
#include "scheduler.h"
#include "trace.h"
#include "worker.h"

#include <stdio.h>

/* The size that would have been enough is not knowable here: the scope may
 * go on allocating after this request. So the advice is a procedure that
 * gives a size which works the first time (measure the peak with a ring big
 * enough), not a guess that can deadlock again. */
static void deadlock_error(pto_orch *o, int32_t r, uint64_t bytes, const pto_slab *oldest)
{
    pto_heap_ring *ring = &o->rings[r];
    uint64_t need = ring->used + bytes;
    /* Which scope: its depth, and where it was opened when the caller said (pto_scope_label). */
    char which[128] = "a scope that is still open";
    int32_t d = pto_scope_holder(&o->scope, oldest->owner);
    if (d > 0 && o->scope.frames[d].label[0])
        snprintf(which, sizeof which, "the scope at depth %d opened at %s, still open", (int)d,
                 o->scope.frames[d].label);
    else if (d > 0)
        snprintf(which, sizeof which, "the scope at depth %d, still open", (int)d);
    else if (d == 0)
        snprintf(which, sizeof which, "the run's outer scope");
    pto_set_error("deadlock: heap ring %d is full (%llu of %llu bytes in %u slabs) and cannot drain. Its oldest "
                  "slab (task %lld, %llu bytes) is held by %s, so only that scope's end "
                  "could free it, and the orchestrator that would end the scope is the one waiting for the space. "
                  "Fix: end scopes sooner (fewer or smaller tensors per scope), or increase heap_ring_size on the "
                  "Worker (current: %llu bytes per ring; this scope needs more than %llu, and how much more it "
                  "allocates before it ends is not known yet). A size that works: run once with a ring large "
                  "enough (the default, 1 GiB) and use the ring's high-water mark from the Worker's statistics, "
                  "rounded up to a power of two for wrap-around.",
                  r, (unsigned long long)ring->used, (unsigned long long)ring->size, ring->count,
                  (long long)oldest->owner->id, (unsigned long long)(oldest->end - oldest->start), which,
                  (unsigned long long)ring->size, (unsigned long long)need);
}

static bool heap_take(pto_orch *o, int32_t r, uint64_t bytes, uint64_t *off, uint64_t *seq)
{
    pto_heap_ring *ring = &o->rings[r];
    if (bytes > ring->size) {
        pto_set_error("%llu bytes do not fit in a heap ring of %llu bytes; increase heap_ring_size on the "
                      "Worker", (unsigned long long)bytes, (unsigned long long)ring->size);
        return false;
    }
    if (pto_ring_try_alloc(ring, bytes, NULL, off, seq)) return true;
    uint64_t t0 = pto_now_ns(), last_progress = t0;
    uint64_t timeout = (uint64_t)o->alloc_timeout_ms * 1000000ull;
    bool ok = false;
    ring->stalls++;
    const uint64_t used0 = ring->used;
    const pto_scope_frame *f = pto_scope_innermost(&o->scope);   /* the scope whose allocations filled it */
    snprintf(ring->stall_scope, sizeof ring->stall_scope, "%s", f ? f->label : "");
    bool blocked = false;   /* pto_worker_on_block's block was called */
    for (;;) {
        uint32_t before = ring->count;
        uint64_t head_before = ring->head_seq;
        pto_orch_reclaim(o);
        if (ring->head_seq != head_before || ring->count != before) last_progress = pto_now_ns();
        if (pto_ring_try_alloc(ring, bytes, NULL, off, seq)) {
            ok = true;
            break;
        }
        const pto_slab *oldest = pto_ring_oldest(ring);
        if (oldest && oldest->owner && oldest->owner->scope_held) {
            deadlock_error(o, r, bytes, oldest);
            break;
        }
        if (atomic_load_explicit(o->shutdown, memory_order_relaxed)) {
            pto_set_error("the Worker was shut down while waiting for heap ring %d", r);
            break;
        }
        if (atomic_load_explicit(&o->sched->cancel, memory_order_relaxed)) {
            pto_set_error("interrupted while waiting for heap ring %d", r);
            break;
        }
        if (pto_sched_stalled_by_hold(o->sched)) {
            pto_set_error_code(PTO_ERR_DISPATCH_HELD,
                               "heap ring %d is full (%llu of %llu bytes) and dispatch is held (a hold or a "
                               "breakpoint), so no task can finish to free it: step or release dispatch first, or "
                               "drain",
                               r, (unsigned long long)ring->used, (unsigned long long)ring->size);
            break;
        }
        uint64_t now = pto_now_ns();
        if (now - last_progress >= timeout) {
            pto_set_error("HeapRing exhausted: heap ring %d had no room for %llu bytes for %u ms (%llu of %llu "
                          "bytes held by %u slabs of unfinished tasks); increase heap_ring_size on the Worker "
                          "(current: %llu bytes per ring) or alloc_timeout_ms if the tasks are just slow",
                          r, (unsigned long long)bytes, o->alloc_timeout_ms, (unsigned long long)ring->used,
                          (unsigned long long)ring->size, ring->count, (unsigned long long)ring->size);
            break;
        }
        if (!blocked && o->w && o->w->block) {
            o->w->block(o->w->block_arg);
            blocked = true;
        }
        atomic_store_explicit(&o->waiting_for, ORCH_WAIT_RETIRE, memory_order_seq_cst);
        pto_wm_hot(o->sched->wm, UINT64_MAX, false);
        pto_event_wait(&o->ev, pto_orch_has_work, o, 0, (int64_t)(timeout - (now - last_progress)));
        atomic_store_explicit(&o->waiting_for, ORCH_WAIT_NONE, memory_order_relaxed);
    }
    if (blocked && o->w->unblock) o->w->unblock(o->w->block_arg);
    pto_wm_hot(o->sched->wm, pto_now_ns() + PTO_HOT_NS, false);
    uint64_t t1 = pto_now_ns();
    ring->stall_ns += (int64_t)(t1 - t0);
    /* What the wait freed (at least the bytes asked for: a slab released
     * behind a live one left `used` before its room came back): with that
     * much more room the orchestrator goes on at once, and it stays ahead
     * of the frees by every earlier wait of the run too, hence the sum. A
     * failed wait (deadlock, timeout) measured nothing; its error sizes. */
    if (ok) {
        uint64_t after = ring->used - bytes, freed = used0 > after ? used0 - after : 0;
        ring->run_waited += freed > bytes ? freed : bytes;
        if (ring->size + ring->run_waited > ring->need) ring->need = ring->size + ring->run_waited;
    }
    pto_trace *tr = pto_trace_on(&o->sched->wm->trace);
    if (tr) pto_trace_stall(tr, r, bytes, t0, t1);
    return ok;
}

bool pto_orch_heap_alloc(pto_orch *o, int32_t r, uint64_t bytes, uint64_t *off, uint64_t *seq)
{
    if (!heap_take(o, r, bytes, off, seq)) return false;
    if (PTO_UNLIKELY(o->check)) pto_check_fresh(o, (uint64_t)(uintptr_t)(o->rings[r].base + *off), bytes);
    return true;
}
