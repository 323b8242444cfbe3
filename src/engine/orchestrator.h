/* Orchestrator: turns submit calls on the user's thread into DAG
 * nodes. It owns the TensorMap, the Scope stack, the slot pool and the heap
 * rings' allocation, and it is the only thread that reclaims: slots the
 * scheduler consumed come back through a lock-free stack and are recycled
 * here, so none of those structures needs a lock. */
#ifndef PTO_ORCHESTRATOR_H
#define PTO_ORCHESTRATOR_H

#include <stdatomic.h>
#include <stdbool.h>
#include "event.h"
#include "ring.h"
#include "scheduler.h"
#include "scope.h"
#include "slot.h"
#include "tensormap.h"
#include "wire_queue.h"

struct pto_worker;
struct pto_scheduler;

#define PTO_ORCH_PREDICT 4            /* tensor positions whose next base the submit predicts */

struct pto_orch {
    struct pto_worker *w;
    struct pto_scheduler *sched;
    pto_heap_ring *rings;            /* the Worker's PTO_MAX_RING_DEPTH rings */
    uint32_t alloc_timeout_ms;
    uint32_t task_timeout_ms;        /* the Worker's default task deadline, 0 = none */
    int64_t next_timeout_ms;         /* pto_submit_timeout for the next submit, -1 = the default */
    int32_t nworkers[PTO_KINDS];

    pto_slot_pool pool;
    pto_tensormap tm;
    pto_scope scope;
    pto_cfg_ref *cfgs;               /* interned CallConfigs of this run */

    pto_wire_queue retired;          /* consumed slots awaiting reclamation: from the turn's holder */
    pto_event ev;
    /* What the orchestrator sleeps for, so others wake it only then:
     * ORCH_WAIT_FINISH (scheduler: every task finished) or ORCH_WAIT_RETIRE
     * (any reclaimed slot). Retired slots otherwise wait for the next submit. */
    _Atomic int32_t waiting_for;
    _Atomic bool *shutdown;

    struct pto_run *cur_run;         /* the submitted run whose tasks this is adding (run.h), or NULL */
    bool open;                       /* a run is in progress */
    bool ending;                     /* run end: TensorMap, rings and configs are reset wholesale */
    int64_t submitted;               /* tasks (not allocs) this run */
    int64_t live_hwm;
    int64_t submitted_total, allocs_total;
    uint32_t mark;

    struct pto_check_log *check;     /* this run's check mode (check.c), NULL when off */
    bool check_warn;                 /* check = "warn": an unordered overwrite is a warning, not a raise */
    struct pto_check_log *check_log; /* kept across runs once made */

    pto_ref *tmp_refs;               /* submit scratch */
    int32_t ntmp, tmp_cap;
    /* The base of the last submit's first tensors, by position: the next
     * submit's bases are predicted a stride on (prefetch_bases). */
    uint64_t last_base[PTO_ORCH_PREDICT];
    uint64_t last_out;               /* the base the last submit wrote last: the same for the writes */

    /* What a reclaimed task was (orch_inspect.c): its slot is gone, but
     * views of the open run (orch:dot colours by callable) still need its
     * kind, callable and worker. Indexed by id, the run's first
     * PTO_GONE_CAP ids (bounded memory, grown as ids are reclaimed);
     * cleared at run end up to gone_hi. */
    struct pto_gone *gone;
    int64_t gone_cap, gone_hi;
};

#define PTO_GONE_CAP (1 << 16)

typedef struct pto_gone {
    uint64_t callable;
    int32_t kind;                    /* pto_worker_kind + 2 (-1 + 2 for an alloc slot); 0: not recorded */
    int32_t worker;
} pto_gone;

void pto_orch_init(struct pto_orch *o, struct pto_worker *w, struct pto_scheduler *sched, pto_heap_ring *rings,
                   uint32_t alloc_timeout_ms, _Atomic bool *shutdown);
void pto_orch_destroy(struct pto_orch *o);
/* Open / close a run (outer scope, drain, reset). */
bool pto_orch_begin(struct pto_orch *o);
int pto_orch_end(struct pto_orch *o);
/* Whether o may be used now (a run is open, no shutdown or interrupt); if
 * not, pto_errmsg() says why. */
bool pto_orch_check_open(struct pto_orch *o);
/* Submitted runs (run.c): reclaim what the scheduler handed back; end every
 * scope of the run whose function returned and open a fresh outer one. */
void pto_orch_reclaim(struct pto_orch *o);
void pto_orch_outer_scope_renew(struct pto_orch *o);
/* The heap ring holding addr, or -1. */
int32_t pto_orch_ring_of(struct pto_orch *o, uint64_t addr);
/* The orchestrator's wait predicate: slots handed back, shutdown or an interrupt. */
bool pto_orch_has_work(void *arg);
/* bytes of heap ring r at *off (slab sequence *seq), waiting for room
 * (orch_heap.c); false with pto_errmsg() set on a deadlock, a timeout,
 * shutdown, an interrupt or dispatch held. */
bool pto_orch_heap_alloc(struct pto_orch *o, int32_t r, uint64_t bytes, uint64_t *off, uint64_t *seq);

#endif
