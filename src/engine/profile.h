/* Run profile (docs/tracing.md "Profile"): the start and end of every task
 * of a Worker's last run, always on, for w:profile(), the run report and
 * ptolua --dot.
 *
 * One writer, the scheduler's turn (its thread, or a draining orchestrator
 * holding the turn flag), appends a record per completion it
 * handles (the worker measured the times; PROCESS mode: the mailbox's
 * posted_ns / done_ns), so recording takes no atomics and no lock. The
 * orchestrator's thread opens and closes runs; between them it swaps the
 * filled log into `last`, which only it reads. A run's writes happen
 * before its drain returns (the scheduler counts `finished` after it
 * records) and the next run's after its first submit is wired, so the
 * swap needs no synchronisation of its own. The orchestrator's thread also
 * writes one part of the log itself, the scope tree (`scopes`), which the
 * scheduler never touches.
 *
 * Memory is bounded: at most PTO_PROF_CAP records a run (the first ones);
 * later tasks are counted in `dropped`; likewise PTO_PROF_EDGE_CAP edges
 * (for the run report's DAG), which the scheduler notes as it wires them. Each task also carries the id of
 * the producer whose completion made it ready (`ready_by`), which is all
 * the critical path needs: walking ready_by back from the task that ended
 * last gives the chain that set the makespan.
 *
 * What a picture of the DAG needs besides (ptolua --dot draws the last run
 * from the profile after it ended, rather than copying every task at its
 * submit): the tree of the run's nested scopes (a parent per scope, noted
 * at scope_begin), which pto_alloc slots each task used (noted as it is
 * wired: an alloc slot is no task, the picture folds it into its users),
 * and the error of each task that failed or was not run (noted as it
 * ends; failures are rare, and at most PTO_PROF_ERROR_CAP are kept). */
#ifndef PTO_PROFILE_H
#define PTO_PROFILE_H

#include "pto.h"

#include <stdint.h>

#define PTO_PROF_CAP (1 << 16)
#define PTO_PROF_EDGE_CAP (1 << 18)
#define PTO_PROF_USE_CAP (1 << 18)
#define PTO_PROF_SCOPE_CAP (1 << 18)
#define PTO_PROF_ERROR_CAP 1024
#define PTO_PROF_ERROR_BYTES 4096   /* of one message: the start of a traceback says enough */

typedef struct pto_prof_failure {
    int64_t id;
    char *msg;                      /* malloc'ed */
} pto_prof_failure;

/* One run's records. */
typedef struct pto_prof_log {
    pto_profile_task *tasks;
    int64_t ntasks, cap_tasks, dropped;
    int64_t *edges;                 /* dependency edges as (consumer, producer) pairs */
    int64_t nedges, cap_edges;
    int64_t *uses;                  /* (task, alloc slot) pairs */
    int64_t nuses, cap_uses;
    pto_prof_failure *errors;
    int64_t nerrors, cap_errors;
    uint32_t *scopes;               /* orchestrator thread: scopes[k] = the parent of nested scope k + 1 */
    int64_t nscopes, cap_scopes;
} pto_prof_log;

typedef struct pto_profile {
    pto_prof_log cur, last;         /* the scheduler appends to cur; last is the previous run's */
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
/* Orchestrator thread: nested scope seq (1, 2, ... in opening order) opened inside scope parent. */
void pto_prof_scope(pto_profile *p, uint32_t seq, uint32_t parent);
/* Scheduler thread: member of task `id` ran on worker (kind, index) from t0 to t1; failed: 0, 1,
 * or 2 for a task that never ran (pto_profile_task). */
void pto_prof_task(pto_profile *p, int64_t id, int64_t ready_by, uint64_t callable, int32_t kind, int32_t index,
                   int32_t member, uint64_t t0, uint64_t t1, int failed, uint32_t scope);
/* Scheduler thread: task consumer depends on task producer. */
void pto_prof_edge(pto_profile *p, int64_t consumer, int64_t producer);
/* Scheduler thread: task `id` uses the memory of alloc slot `alloc` (a reference it holds). */
void pto_prof_use(pto_profile *p, int64_t id, int64_t alloc);
/* Scheduler thread: task `id` failed or was not run, for reason msg (copied). */
void pto_prof_error(pto_profile *p, int64_t id, const char *msg);
void pto_prof_free(pto_profile *p);

#endif
