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

/* Wait until has_work(arg) is true, the event is notified, or timeout_ns
 * passes (< 0: no timeout). Spins for spin_ns first. Returns has_work(arg). */
bool pto_event_wait(pto_event *e, bool (*has_work)(void *), void *arg, int64_t spin_ns, int64_t timeout_ns);

#endif
