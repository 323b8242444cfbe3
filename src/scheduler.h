/* Scheduler (seed 003): one thread that wires fan-out edges of newly
 * submitted tasks, dispatches ready tasks to worker threads, and handles
 * completions (fan-out release, poisoning, reclamation hand-off).
 * Phase order per turn: wiring, dispatch, completion. */
#ifndef PTO_SCHEDULER_H
#define PTO_SCHEDULER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include "event.h"
#include "worker_manager.h"

struct pto_slot;

typedef struct pto_ready_queue {
    struct pto_slot *head, *tail;
} pto_ready_queue;

typedef struct pto_scheduler {
    pto_worker_manager *wm;
    pthread_t thread;
    bool started;
    _Atomic bool running;
    pto_event ev;

    struct pto_slot *_Atomic wire_head;     /* orchestrator -> scheduler (LIFO stack) */
    pto_ready_queue ready[2];               /* per worker kind, unpinned */
    int64_t ready_len;
    _Atomic int64_t ready_hwm;

    struct pto_slot **work;                 /* finish worklist (poison cascades) */
    int32_t nwork, work_cap;

    /* Reclamation hand-off: called with each slot this thread consumed. */
    void (*retire)(void *ctx, struct pto_slot *s);
    void *retire_ctx;
    pto_event *orch_ev;                     /* woken when finished reaches finish_target */
    _Atomic int32_t *orch_waiting;          /* ORCH_WAIT_* of the orchestrator */
    _Atomic int64_t finish_target;

    _Atomic int64_t finished;               /* tasks COMPLETED or FAILED this run */
    _Atomic int64_t completed_total, failed_total;

    pthread_mutex_t fail_mu;
    char *first_failure;                    /* first failed task of the run */

    /* Set by pto_worker_interrupt (a signal handler may call it): tasks not
     * yet dispatched fail instead of running, so the run drains quickly. */
    _Atomic bool cancel;

    /* Names of callables for failure messages (pto_worker_name_callable);
     * read only on the failure path, under fail_mu. */
    struct pto_callable_name *names;
    int32_t nnames, names_cap;
} pto_scheduler;

typedef struct pto_callable_name {
    int32_t kind;
    uint64_t callable;
    char *name;
} pto_callable_name;

void pto_sched_init(pto_scheduler *s, pto_worker_manager *wm);
bool pto_sched_start(pto_scheduler *s);
void pto_sched_stop(pto_scheduler *s);
void pto_sched_destroy(pto_scheduler *s);
/* Orchestrator side: hand a new task over for wiring. */
void pto_sched_submit(pto_scheduler *s, struct pto_slot *slot);
/* Take the run's first failure message (caller frees), or NULL. */
char *pto_sched_take_failure(pto_scheduler *s);
/* Remember a display name for (kind, callable); replaces an earlier one. */
void pto_sched_name_callable(pto_scheduler *s, int32_t kind, uint64_t callable, const char *name);

#endif
