/* Per-task diagnostics a CallConfig asks for: tensor dumps
 * (enable_dump_tensor), PMU counters (enable_pmu), swimlane points
 * (enable_l2_swimlane) and the dependency dump (enable_dep_gen).
 *
 * A task's diagnostics travel in a pto_diag_task: the dispatcher fills its
 * input half (pto_diag_prepare) in the mailbox (PROCESS mode) or on its stack
 * (THREAD mode); where the leaf runs, pto_diag_call wraps the leaf and fills
 * the output half; the dispatcher then keeps what the orchestrator reports
 * (pto_diag_finish). Each execution site pays one branch on
 * pto_diag_wanted() when every field is 0. */
#ifndef PTO_DIAG_H
#define PTO_DIAG_H

#include <stdbool.h>
#include <stdint.h>
#include "pto.h"

struct pto_slot;
struct pto_orch;
struct pto_worker_manager;

#define PTO_DIAG_MAX_TAGS 256     /* tensors per task whose tags travel with it (dumps beyond: skipped) */
#define PTO_DIAG_RUN_LEN 64
#define PTO_PMU_MAX 4             /* events per PMU set */
#define PTO_PMU_SETS 4            /* enable_pmu = 1 .. PTO_PMU_SETS */

/* Swimlane points: the first four at every level (and in the per-worker file); from level 3 the hand-off
 * (PROCESS mode: the parent's post), at level 4 the ends of the dumps before and of the counter read. */
enum {
    PTO_SWIM_RECEIVED = 0, PTO_SWIM_KERNEL_START, PTO_SWIM_KERNEL_END, PTO_SWIM_POSTED,
    PTO_SWIM_HANDED, PTO_SWIM_DUMPED_IN, PTO_SWIM_COUNTED, PTO_SWIM_N
};

typedef struct pto_diag_task {
    /* in: the dispatcher, before the task runs */
    int64_t task_id;
    int32_t worker;
    int32_t member;
    int32_t ntags;
    char run[PTO_DIAG_RUN_LEN];   /* names this run's files: "p<pid>w<serial>r<run>" */
    uint8_t tags[PTO_DIAG_MAX_TAGS];
    /* out: where the leaf ran */
    uint32_t pmu_valid;           /* bit i: pmu[i] was read */
    int32_t pmu_set;
    int64_t pmu[PTO_PMU_MAX];
    uint64_t ts[PTO_SWIM_N];      /* pto_now_ns() of each swimlane point, 0 if not taken */
    int32_t child_pid;
    bool trace_on;                /* in: swimlanes go to the trace, not to a file */
} pto_diag_task;

/* Whether cfg asks for anything that happens where the task runs: the one
 * test the execution sites make. */
static inline bool pto_diag_wanted(const pto_call_config *cfg)
{
    return (cfg->enable_dump_tensor | cfg->enable_pmu | cfg->enable_l2_swimlane) != 0;
}

/* Dispatcher: fill d's input half for member of s, run by worker index. */
void pto_diag_prepare(pto_diag_task *d, struct pto_worker_manager *wm, const struct pto_slot *s, int32_t member,
                      int32_t worker);
/* Where the leaf runs: dump the tensors before, read the counters around the call, dump after. */
int pto_diag_call(pto_leaf_fn fn, void *ctx, uint64_t callable, const pto_args_view *v, const pto_call_config *cfg,
                  pto_diag_task *d, char *err, size_t errlen);
/* Dispatcher, once the task finished: keep d's counters and spans for the orchestrator and the trace. */
void pto_diag_finish(struct pto_worker_manager *wm, const struct pto_slot *s, const pto_diag_task *d);

/* A task's swimlane points and counters, kept for the trace while one records. */
typedef struct pto_diag_span {
    int64_t task;
    int32_t run, member, kind, worker, level, pad;
    uint64_t ts[PTO_SWIM_N];
    pto_pmu_sample pmu;
} pto_diag_span;
/* The trace formatter: a malloc'ed copy of the spans kept since the trace started; *n is their count. */
pto_diag_span *pto_diag_spans_copy(struct pto_worker_manager *wm, int64_t *n);
/* A trace starts: forget the last trace's spans. */
void pto_diag_trace_reset(struct pto_worker_manager *wm);

/* Orchestrator: a submit with cfg (any field set) may go ahead; false with pto_errmsg if its
 * output_prefix is missing or cannot be written. */
bool pto_diag_submit_check(struct pto_worker_manager *wm, const pto_call_config *cfg);
/* Orchestrator, before s's writers enter the TensorMap: write its inferred edges (enable_dep_gen). */
void pto_diag_dep_gen(struct pto_orch *o, const struct pto_slot *s);
/* How the scheduler wired consumer c to producer p (a dep edge): c waits for p, or p had already finished
 * (completed, or failed: c will not run). */
typedef enum { PTO_DIAG_WIRED = 0, PTO_DIAG_DONE, PTO_DIAG_FAILED } pto_diag_wiring;
/* Scheduler, for a producer submitted with enable_dep_gen: append the consumer line of that edge. */
void pto_diag_consumer(struct pto_worker_manager *wm, const struct pto_slot *p, const struct pto_slot *c,
                       pto_diag_wiring how);
/* A new run: forget the last run's counters, name this run's files. */
void pto_diag_run_begin(struct pto_worker_manager *wm, int64_t run);
/* The run is over: close its dependency files. */
void pto_diag_run_end(struct pto_worker_manager *wm);
void pto_diag_free(struct pto_worker_manager *wm);

#endif
