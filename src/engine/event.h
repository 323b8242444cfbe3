/* A wake-up channel for one waiting thread: spin while work is likely to
 * arrive, then block on a futex. Notifiers pay one fence and one load when
 * the waiter is awake, and a syscall only when it sleeps. Works across
 * processes when the event lives in MAP_SHARED memory.
 *
 * The fence is what keeps a notifier and a waiter going to sleep from
 * missing each other (Dekker: each stores, fences, then loads the other's
 * word). A notifier that pays it per task (the orchestrator's submit:
 * 15% of pto_bench W1's samples) can hand it to the waiter instead: an
 * asymmetric event's waiter, before it sleeps, makes every thread of its
 * process execute a full barrier (membarrier(2)), so a notifier of the
 * same process may use pto_event_notify_light, which only loads. Other
 * processes' notifiers keep the fence. */
#ifndef PTO_EVENT_H
#define PTO_EVENT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct pto_event {
    _Atomic uint32_t seq;
    _Atomic uint32_t sleeping;
    _Atomic uint32_t asym;           /* the waiter issues membarrier before it sleeps (pto_event_make_asymmetric) */
} pto_event;

/* Wake the waiter if it sleeps; call after publishing the work. */
void pto_event_notify(pto_event *e);

/* Let threads of this process notify e with pto_event_notify_light; by
 * e's waiter's process, before such a notifier runs. False, and e is left
 * as it was, where membarrier(2) cannot be used. */
bool pto_event_make_asymmetric(pto_event *e);

/* pto_event_notify, without the fence when e is asymmetric: only for a
 * thread of the process that made it so. */
void pto_event_notify_light(pto_event *e);

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
