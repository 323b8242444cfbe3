/* The Worker: one level of the hierarchy. It owns the heap rings (mapped at
 * creation, before any child is forked), the WorkerManager with its worker
 * threads, the Scheduler thread and the Orchestrator used by each run. */
#ifndef PTO_WORKER_H
#define PTO_WORKER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <sys/types.h>
#include "orchestrator.h"
#include "ring.h"
#include "run.h"
#include "scheduler.h"
#include "worker_manager.h"

struct pto_worker {
    pto_worker_config cfg;
    pto_heap_ring rings[PTO_MAX_RING_DEPTH];
    pto_worker_manager wm;
    pto_scheduler sched;
    struct pto_orch orch;
    bool inited;
    pid_t owner;                  /* the process whose threads and children these are (init's) */
    _Atomic bool shutdown;
    _Atomic int32_t interrupts;   /* this run's; the second one kills children mid-task */
    int64_t runs;
    pto_runs runs_out;            /* submitted runs (run.h) */
    int32_t check;                /* the next runs' check mode (check.c): 0 off, PTO_CHECK_ON or PTO_CHECK_WARN */
    pto_block_fn block, unblock;  /* pto_worker_on_block */
    void *block_arg;
};

/* Open the engine run (pto_run_begin's work, which a session of submitted runs shares). */
bool pto_run_begin_session(pto_worker *w);

#endif
