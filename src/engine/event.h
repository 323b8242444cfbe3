/* A wake-up channel for one waiting thread: spin while work is likely to
 * arrive, then block on a futex. Notifiers pay one fence and one load when
 * the waiter is awake, and a syscall only when it sleeps. Works across
 * processes when the event lives in MAP_SHARED memory. */
#ifndef PTO_EVENT_H
#define PTO_EVENT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct pto_event {
    _Atomic uint32_t seq;
    _Atomic uint32_t sleeping;
} pto_event;

/* Wake the waiter if it sleeps; call after publishing the work. */
void pto_event_notify(pto_event *e);

/* pto_event_notify of a and of b (NULL: none) with one fence between them
 * and the work, for a waker that pays it on every task. */
void pto_event_notify_pair(pto_event *a, pto_event *b);

/* Wait until has_work(arg) is true, the event is notified, or timeout_ns
 * passes (< 0: no timeout). Spins for spin_ns first. Returns has_work(arg). */
bool pto_event_wait(pto_event *e, bool (*has_work)(void *), void *arg, int64_t spin_ns, int64_t timeout_ns);

/* Spin budgets follow the orchestrator. While it submits it is usually
 * the bottleneck, and on a machine with fewer cores than runnable threads
 * a spinner's sched_yield calls take its core (measured: ~15% of a
 * Lua-orchestrated run on 2 cores), so waiters spin only cold_ns and then
 * sleep. While it waits (a drain, back-pressure: hot_until_ns is
 * UINT64_MAX) and for a short window after a run opens and after each of
 * its waits (hot_until_ns is then that deadline, pto_now_ns), a futex
 * wake-up would cost more than spinning (tens of microseconds on a busy
 * machine, several times a whole hand-off), so they spin up to hot_ns.
 * Returns the budget that applies now. */
int64_t pto_hot_spin(int64_t hot_ns, int64_t cold_ns, const _Atomic uint64_t *hot_until_ns);

#endif
