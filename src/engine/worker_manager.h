/* WorkerManager and WorkerThread: one per child leaf (chip, sub worker or
 * nested Worker), fed by the scheduler through a bounded single-producer
 * queue and answering through another. In THREAD mode a thread per worker
 * calls the leaf. In PROCESS mode there is no such thread: the scheduler
 * thread itself moves each queue's tasks into the child's mailbox and the
 * results back (pto_wm_pump), so a task crosses two runnable entities, the
 * scheduler and the child, instead of three; the queues, stealing and
 * completions are the same, and the rest of the scheduler cannot tell. */
#ifndef PTO_WORKER_MANAGER_H
#define PTO_WORKER_MANAGER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include "event.h"
#include "process.h"
#include "pto.h"

struct pto_slot;
struct pto_scheduler;

/* Worker kinds (pto_worker_kind: PTO_NEXT_LEVEL, PTO_SUB) index every
 * per-kind array of the engine. */
enum { PTO_KINDS = 2 };
/* Whether kind names a kind of worker (PTO_NEXT_LEVEL or PTO_SUB), as
 * callers of the public API may pass anything. */
static inline bool pto_kind_valid(int32_t kind) { return kind == PTO_NEXT_LEVEL || kind == PTO_SUB; }

/* A FIFO of ready tasks linked through pto_slot.next_ready (scheduler only). */
typedef struct pto_ready_queue {
    struct pto_slot *head, *tail;
} pto_ready_queue;

#define PTO_WT_QCAP 64            /* power of two, >= any queue_depth */
/* THREAD mode: a worker takes the scheduler's turn (idle_turn) only after
 * two tasks in a row at least this long, and the scheduler lends it only
 * while its kinds' tasks take this long: with shorter ones the scheduler is
 * the bottleneck and its state is best kept on one core (no-op chains and
 * fans through the C API ran 20-25% slower with the turn moving between
 * cores). */
#define PTO_WT_TURN_MIN_NS 1000
/* PROCESS mode: the work the scheduler keeps posted to a child, in tasks
 * of its kind's mean time (task_ns), and never fewer tasks than this. */
#define PTO_WM_STOCK_NS 200000
#define PTO_WM_MIN_POSTED 4u
/* ... and at most this many, except a chain: tasks each chained behind the
 * cell before it (scheduler.c) fill the ring, PTO_MB_CELLS. A chain of
 * no-op chip tasks refilled 16 cells at a time ran at 0.31-0.80 us a task
 * in a Lua run, 32 at a time at 0.30-0.33; independent tasks posted that
 * deep made a stencil of 2 us tasks slower (unstealable, early posts
 * further ahead), so they keep 16. */
#define PTO_WM_MAX_POSTED 16u
/* A thread's completions include tasks it stole; it steals only while fewer
 * than PTO_WT_QCAP of them are unpolled, and its own stay below PTO_WT_QCAP. */
#define PTO_WT_CQCAP (2 * PTO_WT_QCAP)

/* CANCELLED: still staged when the run was interrupted, so not run.
 * UNRUN: chained behind its producer, which did not run to success here. */
enum { PTO_DONE_OK = 0, PTO_DONE_FAILED = 1, PTO_DONE_SKIPPED = 2, PTO_DONE_CANCELLED = 3, PTO_DONE_UNRUN = 4 };

/* A staged task. Idle workers of the same kind may steal unpinned single
 * tasks from the head of another worker's queue, so the fields are atomics
 * read before the claiming CAS on the queue's head (a thief's read may be stale; the
 * CAS then fails and the read is discarded). */
typedef struct pto_dispatch {
    struct pto_slot *_Atomic slot;
    struct pto_slot *_Atomic after;   /* run only if this slot, staged just before here, ran_ok */
    _Atomic int32_t member;
    _Atomic bool stealable;
} pto_dispatch;

/* Tasks staged on a worker thread: the scheduler writes entries and tail,
 * the owner and thieves claim the head by CAS. At most PTO_WT_QCAP are
 * unclaimed, as the owner's inflight bounds both of its queues together. */
typedef struct pto_wt_queue {
    _Alignas(64) _Atomic uint32_t tail;
    _Alignas(64) _Atomic uint32_t head;
    pto_dispatch e[PTO_WT_QCAP];
} pto_wt_queue;

typedef struct pto_completion {
    struct pto_slot *slot;
    struct pto_worker_thread *origin;   /* whose queue it was staged on (its inflight) */
    int32_t member;
    int32_t status;
    char *error;                  /* malloc'ed, or NULL */
    uint64_t t0, t1;              /* when it ran (pto_now_ns), 0 if it did not run (profile.h) */
} pto_completion;

/* PROCESS mode: a task claimed for a worker's child (pto_wm_pump). */
typedef struct pto_staged {
    struct pto_slot *slot, *after;
    struct pto_worker_thread *origin;
    int32_t member;
} pto_staged;

typedef struct pto_worker_thread {
    int32_t kind, index;
    pto_leaf leaf;                /* the user's: runs here (THREAD) or in the child (PROCESS) */
    pto_leaf_fn call;             /* THREAD mode: what this thread calls per task (leaf.run) */
    void *call_ctx;
    pto_child *child;             /* PROCESS mode: its child's parent-side state */
    char name[32];
    struct pto_worker_manager *wm;
    pthread_t thread;
    bool started;
    pto_event ev;
    /* scheduler -> worker: dispatched tasks (dq), and, taken before them,
     * consumers made ready by tasks that just ended here (pq,
     * pto_wt_send's `ahead`); thieves take from pq only when dq has nothing
     * they may take */
    pto_wt_queue dq, pq;
    /* worker -> scheduler */
    _Alignas(64) _Atomic uint32_t cq_tail;
    uint32_t long_runs;                     /* THREAD mode, the thread's own: tasks in a row (up to 2) that ran PTO_WT_TURN_MIN_NS or more */
    _Alignas(64) _Atomic uint32_t cq_head;
    pto_completion cq[PTO_WT_CQCAP];
    /* scheduler-only */
    int32_t inflight;                       /* staged here and not completed, wherever it runs */
    /* The task pto_wt_send staged here last, as a number (its slot may be
     * gone since: only compared, sched_early.c), and whether it went early. */
    uintptr_t last_sent;
    bool last_sent_early;
    pto_ready_queue pinned;                 /* ready tasks pinned here */
    _Atomic int64_t current_task;           /* -1 when idle */
    _Atomic int64_t tasks_run;
    _Atomic uint64_t task_started_ns;       /* pto_now_ns() when current_task started (pto_worker_child_info_get) */
    /* PROCESS mode, scheduler-only: the tasks claimed for the child, oldest
     * first; the first staged_posted of them are in its mailbox's cells (in
     * the same order), the rest wait for room or for a child to start. */
    pto_staged staged[PTO_MB_CELLS];
    uint32_t staged_head, staged_len, staged_posted;
    uint32_t run_cancels_seen;              /* PROCESS mode: *wm->run_cancels at the last revocation sweep */
    bool head_exact;                        /* task_started_ns of the oldest posted one is pto_now_ns, not coarse */
    bool staged_alone;                      /* the posted ones include a task that must run alone */
} pto_worker_thread;

typedef struct pto_worker_manager {
    int32_t mode;
    int32_t depth;                /* max tasks staged on one worker thread */
    pto_worker_thread **threads[PTO_KINDS];
    int32_t count[PTO_KINDS], cap[PTO_KINDS];
    _Atomic bool stopping;
    _Atomic int32_t up;           /* worker threads that started (pto_wait_up) */
    pto_event *sched_ev;          /* woken on every completion */
    /* THREAD mode: a worker thread with nothing staged runs the scheduler's
     * turn itself through this (set before pto_wm_start); true if the turn
     * was its and it took in the worker's own completions. */
    bool (*idle_turn)(void *ctx);
    void *idle_ctx;
    _Atomic bool *cancel;         /* the run was interrupted: staged tasks are not run */
    _Atomic uint32_t *run_cancels; /* bumped by every pto_run_cancel: a submitted run's staged tasks are not run */
    /* PROCESS mode */
    uint32_t start_timeout_ms;
    pto_proc *_Atomic proc;       /* zygote and children, from start to stop; read by signal handlers */
    pto_ship_table ships;         /* callables shipped after the fork */
    struct pto_trace *_Atomic trace;   /* trace.c: NULL until the first pto_trace_start */
    _Atomic uint64_t hot_until_ns;     /* pto_hot_spin, written by the orchestrator */
    _Atomic int32_t check;             /* this run runs its tasks under check.c (PTO_CHECK_ON or _WARN), set at run begin */
    const struct pto_heap_ring *check_rings;   /* the Worker's PTO_MAX_RING_DEPTH rings, for check.c */
    uint64_t zygote_checked_ns;        /* PROCESS mode, scheduler-only: pto_wm_pump's last look */
    uint64_t posts;                    /* PROCESS mode, turn-holder-only: cells posted so far (sched_main yields after a post) */
    struct pto_diag *diag;             /* diag.c: NULL until a submit asks for diagnostics */
    int64_t task_ns[PTO_KINDS];        /* scheduler-only: recent tasks' mean run time per kind (an EWMA) */
    int64_t turn_ns[PTO_KINDS];        /* scheduler-only: the same with each task counted at most 2 x PTO_WT_TURN_MIN_NS
                                        * (a preempted short task does not make its kind look long) */
    int64_t diag_run;                  /* diag.c: the run its files are named after */
    /* PROCESS mode, the turn's: early posts (scheduler.c). `early`: every
     * child runs one task at a time (no leaf.begin), so a posted task gets a
     * task-end word and a consumer may be posted before it ends; the tasks
     * the last pump posted with a word, for the scheduler to look at their
     * consumers. */
    bool early;
    bool early_always;                 /* PTO_EARLY_POSTS=always: whatever the tasks' times (tests) */
    bool spread;                       /* pto_wm_spread may move children (PTO_SPREAD=0: never) */
    uint64_t done_stamps;
    struct pto_slot **posted_now;
    int32_t nposted_now, posted_now_cap;
} pto_worker_manager;

void pto_wm_init(pto_worker_manager *wm, int32_t mode, int32_t depth, uint32_t start_timeout_ms);
/* Register a leaf of kind before start; returns its index. */
int32_t pto_wm_add(pto_worker_manager *wm, int32_t kind, const pto_leaf *leaf);
/* PROCESS mode: fork the zygote and every child and wait until they started
 * (sched_ev, in shared memory, is rung by them); THREAD mode: start every
 * worker thread. false with pto_errmsg set. */
bool pto_wm_start(pto_worker_manager *wm, pto_event *sched_ev);
/* PROCESS mode, scheduler's turn: post claimed tasks to idle children,
 * collect results as completions, move replacements along. true if
 * anything moved. */
bool pto_wm_pump(pto_worker_manager *wm);
/* PROCESS mode: early posts (scheduler.c) for tasks of kind, by its recent
 * mean task time: not below the parent's own work per task, not so long
 * that a waiting cell would hold its child from other work. */
#define PTO_EARLY_MIN_TASK_NS 500
#define PTO_EARLY_MAX_TASK_NS 50000
static inline bool pto_wm_early_kind(const pto_worker_manager *wm, int32_t kind)
{
    return wm->early && (wm->early_always || (wm->task_ns[kind] >= PTO_EARLY_MIN_TASK_NS &&
                                              wm->task_ns[kind] <= PTO_EARLY_MAX_TASK_NS));
}
/* PROCESS mode: the parent side of global child index child's task-end words. */
pto_done_words *pto_wm_done_words(pto_worker_manager *wm, int32_t child);
/* Tasks staged on wt that nothing has begun yet: in THREAD mode its queue,
 * in PROCESS mode the cells posted to its child (scheduler's turn; a hint). */
uint32_t pto_wm_unbegun(const pto_worker_thread *wt);
/* PROCESS mode: whether pto_wm_pump has something to do now; *timeout_ns
 * is lowered to when it must look again even if nothing rings (a running
 * or starting child: the forkserver and start deadlines). */
bool pto_wm_pump_ready(pto_worker_manager *wm, int64_t *timeout_ns);
/* PROCESS mode, by the turn's holder while it waits: if it is alone on its CPU while two busy
 * children share another, and no CPU is spare, move one of them onto its CPU (spread.c). */
void pto_wm_spread(pto_worker_manager *wm);
/* Set wm->spread from PTO_SPREAD (unset, empty or 1: on; 0: off); false, with the error set, for anything else. */
bool pto_wm_spread_from_env(pto_worker_manager *wm);
/* Stop and join every worker thread (tasks still queued are abandoned), then
 * shut the children and the zygote down. */
void pto_wm_stop(pto_worker_manager *wm);
/* How long the hot window (pto_hot_spin) stays open after a run opens and
 * after each wait of the orchestrator: back-to-back runs and a run's first
 * tasks then find every party awake instead of paying a futex wake-up per
 * hop. */
#define PTO_HOT_NS 100000

/* Orchestrator side: set the hot window (pto_hot_spin) of every worker
 * thread and child; with wake, wake the sleeping ones so that they spin. */
void pto_wm_hot(pto_worker_manager *wm, uint64_t until_ns, bool wake);
/* PROCESS mode: wait until children that died in the run are replaced. */
void pto_wm_settle(pto_worker_manager *wm);
void pto_wm_destroy(pto_worker_manager *wm);

/* Scheduler side: stage one member of slot on wt (wt->inflight < PTO_WT_QCAP);
 * an idle worker of the same kind may take it only if stealable. With
 * `after`, a non-stealable task staged on wt before slot, slot runs only if
 * `after` ran to success, and otherwise completes as PTO_DONE_UNRUN. With
 * `ahead`, slot goes before the tasks already staged on wt (its pq): it
 * reads what wt's last task wrote, while that is still in wt's caches. */
void pto_wt_send(pto_worker_thread *wt, struct pto_slot *slot, int32_t member, bool stealable,
                 struct pto_slot *after, bool ahead);
/* Scheduler side: take one completion; false if none. */
bool pto_wt_poll(pto_worker_thread *wt, pto_completion *out);

#endif
