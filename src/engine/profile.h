/* Run profile (docs/tracing.md "Profile"): the start and end of every task
 * of a Worker's last run, always on, for w:profile() and the run report.
 *
 * One writer, the scheduler thread, appends a record per completion it
 * handles (the worker measured the times; PROCESS mode: the mailbox's
 * posted_ns / done_ns), so recording takes no atomics and no lock. The
 * orchestrator's thread opens and closes runs; between them it swaps the
 * filled buffer into `last`, which only it reads. A run's writes happen
 * before its drain returns (the scheduler counts `finished` after it
 * records) and the next run's after its first submit is wired, so the
 * swap needs no synchronisation of its own.
 *
 * Memory is bounded: at most PTO_PROF_CAP records a run (the first ones);
 * later tasks are counted in `dropped`; likewise PTO_PROF_EDGE_CAP edges
 * (for the run report's DAG), which the scheduler notes as it wires them. Each task also carries the id of
 * the producer whose completion made it ready (`ready_by`), which is all
 * the critical path needs: walking ready_by back from the task that ended
 * last gives the chain that set the makespan. */
#ifndef PTO_PROFILE_H
#define PTO_PROFILE_H

#include "pto.h"

#include <stdint.h>

#define PTO_PROF_CAP (1 << 16)
#define PTO_PROF_EDGE_CAP (1 << 18)

typedef struct pto_profile {
    pto_profile_task *cur, *last;   /* scheduler appends to cur; last is the previous run's */
    int64_t ncur, cap_cur, nlast, cap_last;
    int64_t dropped_cur;
    int64_t *ecur, *elast;          /* dependency edges as (consumer, producer) pairs, likewise */
    int64_t necur, ecap_cur, nelast, ecap_last;
    pto_profile_run run;            /* the open run (orchestrator thread) */
    pto_profile_run last_run;       /* valid when have_last */
    int have_last;
} pto_profile;

/* Orchestrator thread: a run opens (before its orchestrator). */
void pto_prof_run_begin(pto_profile *p);
/* Orchestrator thread: it waited (pto_drain, pto_dispatch_wait) from t0 until now. */
void pto_prof_waited(pto_profile *p, uint64_t t0);
/* Orchestrator thread: the run's function returned; its drain starts. */
void pto_prof_run_draining(pto_profile *p);
/* Orchestrator thread: the run drained; it becomes the last run. */
void pto_prof_run_end(pto_profile *p);
/* Scheduler thread: member of task `id` ran on worker (kind, index) from t0 to t1; failed: 0, 1,
 * or 2 for a task that never ran (pto_profile_task). */
void pto_prof_task(pto_profile *p, int64_t id, int64_t ready_by, uint64_t callable, int32_t kind, int32_t index,
                   int32_t member, uint64_t t0, uint64_t t1, int failed, uint32_t scope);
/* Scheduler thread: task consumer depends on task producer. */
void pto_prof_edge(pto_profile *p, int64_t consumer, int64_t producer);
void pto_prof_free(pto_profile *p);

#endif
