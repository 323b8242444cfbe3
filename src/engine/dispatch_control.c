/* dispatch_control.c - the dispatch gate behind pto_dispatch_* (the REPL's
 * :hold, :step, :break) and the scheduler's answers to pto_sched_sync and
 * pto_sched_wait_quiet. The scheduler's turn asks the gate about each task
 * it would dispatch (pto_gate_admits); any thread changes the gate, under
 * gate_mu, and bumps gate_gen so that a sleeping scheduler looks again. */
#include "dispatch_control.h"
#include "common.h"
#include "slot.h"

#include <sched.h>
#include <time.h>

static bool is_break(pto_scheduler *s, const pto_slot *slot)
{
    bool hit = false;
    pthread_mutex_lock(&s->gate_mu);
    for (int32_t i = 0; i < s->nbreaks && !hit; i++)
        hit = s->breaks[i].kind == slot->kind && s->breaks[i].callable == slot->callable;
    pthread_mutex_unlock(&s->gate_mu);
    return hit;
}

/* Whether slot, about to be dispatched, may go. A breakpoint stops a task
 * once: after a :step or :release it passes. A step is spent only here, on
 * a task that has its worker. */
static bool gate_pass(pto_scheduler *s, const pto_slot *slot)
{
    if (!atomic_load(&s->held)) {
        if (atomic_load(&s->break_task) == slot->id || !is_break(s, slot)) return true;
        atomic_store(&s->break_task, slot->id);
        atomic_store(&s->step_left, 0);
        atomic_store(&s->held, true);
        return false;
    }
    if (atomic_load(&s->step_left) <= 0) return false;
    atomic_fetch_sub(&s->step_left, 1);
    return true;
}

bool pto_gate_admits(pto_scheduler *s, const pto_slot *slot, bool *gated)
{
    if (!*gated) return true;
    if (!gate_pass(s, slot)) return false;
    *gated = pto_gate_shut(s);
    return true;
}

void pto_gate_changed(pto_scheduler *s)
{
    atomic_fetch_add(&s->gate_gen, 1);
    pto_event_notify(s->ev);
}

static void gate_update(pto_scheduler *s)
{
    atomic_store(&s->gated, atomic_load(&s->held) || s->nbreaks > 0);
    pto_gate_changed(s);
}

void pto_sched_hold(pto_scheduler *s, bool hold)
{
    if (!hold) atomic_store(&s->release_req, true);   /* releasing accepts the caught failures */
    pthread_mutex_lock(&s->gate_mu);
    atomic_store(&s->step_left, 0);
    /* A release opens the gate before it clears held: a turn that began
     * with the gate shut and then finds held clear finds the gate open
     * too (pto_gate_admits). */
    if (!hold) atomic_store(&s->gated, s->nbreaks > 0);
    atomic_store(&s->held, hold);
    gate_update(s);
    pthread_mutex_unlock(&s->gate_mu);
}

void pto_sched_step(pto_scheduler *s, int64_t n)
{
    atomic_fetch_add(&s->step_left, n);
    pto_gate_changed(s);
}

int32_t pto_sched_break(pto_scheduler *s, int32_t kind, uint64_t callable, bool on)
{
    pthread_mutex_lock(&s->gate_mu);
    int32_t i = 0;
    while (i < s->nbreaks && !(s->breaks[i].kind == kind && s->breaks[i].callable == callable)) i++;
    if (on && i == s->nbreaks) {
        pto_grow((void **)&s->breaks, &s->breaks_cap, s->nbreaks + 1, sizeof *s->breaks);
        s->breaks[s->nbreaks++] = (pto_break){kind, callable};
    } else if (!on && callable == UINT64_MAX) {
        s->nbreaks = 0;
    } else if (!on && i < s->nbreaks) {
        s->breaks[i] = s->breaks[--s->nbreaks];
    }
    int32_t n = s->nbreaks;
    gate_update(s);
    pthread_mutex_unlock(&s->gate_mu);
    return n;
}

void pto_sched_draining(pto_scheduler *s, bool on)
{
    atomic_store(&s->draining, on);
    pto_gate_changed(s);
}

bool pto_sched_stalled_by_hold(pto_scheduler *s)
{
    return atomic_load(&s->gated) && atomic_load(&s->held) && !atomic_load(&s->draining) &&
           atomic_load(&s->step_left) <= 0 && atomic_load(&s->nrunning) == 0;
}

void pto_gate_answer_quiet(pto_scheduler *s)
{
    uint64_t req = atomic_load(&s->quiet_req);
    if (req == atomic_load_explicit(&s->quiet_ack, memory_order_relaxed)) return;
    s->quiet_seen = req;
    if (atomic_load_explicit(&s->nrunning, memory_order_relaxed) != 0 ||
        pto_wq_pending(&s->wire))
        return;
    bool held = atomic_load(&s->held) && !atomic_load(&s->draining);
    if (s->ready_len != 0 && !(held && atomic_load(&s->step_left) <= 0)) return;
    if (held) atomic_store(&s->step_left, 0);
    atomic_store(&s->quiet_ack, req);
}

void pto_sched_sync(pto_scheduler *s)
{
    uint64_t req = atomic_fetch_add(&s->sync_req, 1) + 1;
    pto_event_notify(s->ev);
    while (atomic_load(&s->sync_ack) < req && atomic_load(&s->running)) sched_yield();
}

bool pto_sched_wait_quiet(pto_scheduler *s, int32_t timeout_ms)
{
    uint64_t req = atomic_fetch_add(&s->quiet_req, 1) + 1;
    pto_event_notify(s->ev);
    uint64_t deadline = pto_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (atomic_load(&s->quiet_ack) < req) {
        if (pto_now_ns() >= deadline) return false;
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
    return true;
}
