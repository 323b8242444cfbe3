/* dispatch_control.h - the dispatch gate (dispatch_control.c) as the
 * scheduler's turn sees it. The gate's own API, pto_sched_hold, _step,
 * _break, _draining, _stalled_by_hold, _sync and _wait_quiet, is in
 * scheduler.h. */
#ifndef PTO_DISPATCH_CONTROL_H
#define PTO_DISPATCH_CONTROL_H

#include <stdbool.h>
#include "scheduler.h"

struct pto_slot;

/* Whether dispatch is held or a breakpoint is set, and no drain opened it. */
static inline bool pto_gate_shut(const pto_scheduler *s)
{
    return atomic_load_explicit(&s->gated, memory_order_relaxed) &&
           !atomic_load_explicit(&s->draining, memory_order_relaxed);
}

/* Turn holder: whether slot may dispatch in a turn that found the gate shut
 * (*gated) when it began; *gated then says whether it is shut still. It may
 * have opened since: a passing slot then dispatches as in an open turn, with
 * its chain staged behind it (a chain never starts while the gate is shut,
 * which counts :step's tasks one by one). */
bool pto_gate_admits(pto_scheduler *s, const struct pto_slot *slot, bool *gated);

/* Any thread: the gate, or a request the scheduler's turn answers (a
 * retry), changed: the scheduler looks again. */
void pto_gate_changed(pto_scheduler *s);

/* Turn holder, at an idle point: answer a pending pto_sched_wait_quiet if
 * nothing runs and nothing more may dispatch. A step budget that finds
 * nothing left to run is dropped, so it cannot release tasks submitted
 * later. */
void pto_gate_answer_quiet(pto_scheduler *s);

#endif
