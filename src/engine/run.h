/* Run handles: several runs of one Worker in flight at once.
 *
 * A blocking run (pto_run_begin .. pto_run_end) owns the engine's
 * orchestrator from its first submit to its drain. Submitted runs share one
 * engine run instead, the "session": the first submitted run opens it, each
 * run's function adds its tasks to it, and when the function returns only
 * the run's outer scope ends (its tasks keep running). The session's
 * TensorMap is therefore shared, so a later run's task that touches bytes an
 * earlier run still writes (or reads, for a write) waits for it by the very
 * tag rules that order tasks within a run, and failures poison only
 * dependants, as within a run. The session drains and resets (rings, slot
 * ids, TensorMap) once every run in it has finished.
 *
 * What a run needs on its own (counts, its first failure, cancellation) is a
 * pto_run record that each of its slots points to. The scheduler calls
 * pto_run_task_finished for a finished task of a submitted run (slot->run
 * set) and checks pto_run_cancelled before it readies one: nothing else is
 * added to a blocking run's path than those NULL tests.
 *
 * Lifetime: a record has two owners, the caller's handle (pto_run_free) and
 * the session (until it drains, as tasks may still point to it); the last
 * one to let go frees it. Both live on the orchestrator's thread. */
#ifndef PTO_RUN_H
#define PTO_RUN_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include "event.h"
#include "pto.h"

struct pto_worker;
struct pto_slot;
struct pto_orch;

struct pto_run {
    int64_t id;                       /* 1, 2, ... per Worker */
    int64_t first_task;               /* id of its first task in the session */
    int64_t base;                     /* the session's task count when it began */
    struct pto_orch *o;               /* the session's orchestrator */
    _Atomic int64_t submitted;        /* INT64_MAX until its function returned */
    _Atomic int64_t finished, completed, failed;
    _Atomic bool ending;              /* taken once, by whoever sees the last task finish (run_done) */
    _Atomic bool done;                /* then set, after the session's live count has dropped */
    _Atomic bool cancelled;
    pthread_mutex_t mu;               /* failure */
    char *failure;                    /* its first failed task's message */
    _Atomic int64_t *live;            /* the session's count of unfinished runs */
    pto_event *ev;                    /* the orchestrator's: woken when the run is done */
    _Atomic(pto_wake_fn) on_done;     /* pto_run_on_done: also called when it is done */
    _Atomic(void *) on_done_arg;
    int refs;                         /* handle + session (orchestrator thread only) */
    struct pto_run *next;             /* the session's list */
};

/* The session of a Worker (embedded in pto_worker). */
typedef struct pto_runs {
    bool open;                        /* the engine run is a session of submitted runs */
    struct pto_run *cur;              /* the run whose function is running, or NULL */
    struct pto_run *list;             /* every record of the session */
    _Atomic int64_t live;             /* runs whose tasks have not all finished */
    _Atomic uint32_t cancel_gen;      /* bumped by pto_run_cancel: the scheduler sweeps its queues */
    int64_t next_id;
} pto_runs;

/* Scheduler side: task s of run r finished (failed: with s->error). */
void pto_run_task_finished(struct pto_run *r, const struct pto_slot *s, bool failed);
static inline bool pto_run_cancelled(const struct pto_run *r)
{
    return atomic_load_explicit(&r->cancelled, memory_order_relaxed);
}
/* The message of a task that is not run because of run r: r was cancelled
 * and the task is r's (producer < 0), or the task consumes r's task
 * producer, which failed (r cancelled or not). */
char *pto_run_cancel_message(const struct pto_run *r, int64_t task, int64_t producer);
/* Worker close: drop the session's references (every thread is stopped). */
void pto_runs_destroy(pto_runs *rs);

#endif
