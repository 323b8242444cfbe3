/* PROCESS mode: every worker is one child process driven through a
 * shared-memory mailbox (mailbox.h) by the scheduler thread itself
 * (pto_proc_try_post, pto_proc_poll: they never block); the user's
 * pto_leaf runs in the child.
 *
 * Children are forked by a forkserver (the "zygote"): one single-threaded
 * process forked at init before any engine thread of the Worker exists.
 * Initial children and every replacement are forked by it on request (a
 * SOCK_SEQPACKET socketpair), so a replacement is a clean copy of the
 * process as it was at init even though the parent has threads by then.
 * The zygote reaps its children (signalfd) and marks their mailbox DEAD with
 * the wait status, which wakes the scheduler (the mailbox's bell).
 *
 * Process tree and lifetimes:
 *   parent (threads) ── zygote ─┬─ sentinel (own process group)
 *                               └─ child × N (each leads its own process group)
 * The zygote dies with the parent (PR_SET_PDEATHSIG plus a getppid check,
 * so the exit of the thread that called init does not count); children die
 * with the zygote (PR_SET_PDEATHSIG, SIGKILL). What a child starts stays in
 * its group, killed whenever the child is killed or reaped; the zygote is a
 * subreaper for what leaves a group. The sentinel covers a zygote that
 * cannot act (stopped, killed): see sentinel_main in process.c. A child maps
 * only its own mailbox. All ignore SIGINT: the parent decides. */
#ifndef PTO_PROCESS_H
#define PTO_PROCESS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include "event.h"
#include "mailbox.h"
#include "pto.h"

/* ---- callables shipped after the fork (pto_worker_ship_callable) ----
 * An append-only table: readers (the scheduler) take no lock; a callable
 * shipped again gets a new entry, the newest one wins. Blobs live in the
 * shared arena, so every child can read them. */
#define PTO_MAX_SHIPPED 4096

typedef struct pto_shipped {
    int32_t kind;
    uint64_t callable;
    void *blob;              /* pto_shm_alloc'ed copy */
    uint64_t len;
} pto_shipped;

typedef struct pto_ship_table {
    pthread_mutex_t mu;      /* writers */
    pto_shipped *entries;    /* PTO_MAX_SHIPPED, allocated on the first ship, never moves */
    _Atomic uint32_t count;  /* entries published (release) */
} pto_ship_table;

void pto_ship_init(pto_ship_table *t);
void pto_ship_destroy(pto_ship_table *t);
/* Copy blob into shared memory and publish it for (kind, callable). 0 or -1 with errmsg. */
int pto_ship_add(pto_ship_table *t, int32_t kind, uint64_t callable, const void *blob, uint64_t len);

/* ---- children ---- */

typedef struct pto_proc pto_proc;

/* The parent-side state of one child, owned by the scheduler's turn (its
 * thread, or a draining orchestrator: scheduler.h) once the Worker runs. */
typedef struct pto_child {
    pto_proc *proc;
    pto_mailbox *mb;
    int32_t slot, kind;
    const char *name;                        /* the worker's label ("chip 1") */
    uint32_t posted, collected;              /* the parent's own counts of cells posted and collected */
    uint32_t published;                      /* cells below it the child may see (pto_proc_batch) */
    bool batching;                           /* pto_proc_batch: posts wait for its end to be published */
    int32_t ship[PTO_MB_CELLS];              /* ship entry sent with each posted cell, or -1 */
    bool replacing;                          /* asked for a replacement after a death */
    bool awaiting;                           /* asked for a child for a task that waits for it */
    bool kill_sent;                          /* the start-timeout kill of the current request */
    bool deadline_cut;                       /* its start deadline is the one this process inherited */
    uint32_t timed_out_ms;                   /* its task ran past this deadline and is being killed, or 0 */
    bool corrupt;                            /* killed for an impossible mailbox state: awaiting its DEAD */
    uint8_t loaded[PTO_MAX_SHIPPED / 8];     /* ship entries the current child installed */
    pto_done_words done;                     /* its page of task-end words: which are in use (done_words.h) */
    uint32_t deps_cells;                     /* cells (bit seq % PTO_MB_CELLS) whose deps are set (pto_mb_set_deps) */
} pto_child;

typedef struct pto_proc_config {
    int32_t n;                               /* children (one per worker) */
    const pto_leaf *const *leaves;           /* what child i runs: memory that outlives the Worker */
    const char *const *names;                /* labels for messages */
    const int32_t *kinds;
    uint32_t start_timeout_ms;
    const _Atomic bool *stopping;            /* set when the Worker stops: waits give up */
    const pto_ship_table *ships;
    pto_event *bell;                         /* in shared memory: rung on every result, start and death */
} pto_proc_config;

/* Map the mailboxes, fork the zygote, have it fork every child and wait
 * until all report started (start_timeout_ms). NULL with pto_errmsg naming
 * the worker, its pid and the reason; nothing is left running then. Call
 * before the Worker starts any thread. */
pto_proc *pto_proc_start(const pto_proc_config *cfg);
/* Shut every child and the zygote down (SIGKILL for any still running a
 * task), reap the zygote, unmap, free. Call after the scheduler stopped. */
void pto_proc_stop(pto_proc *p);

pto_child *pto_proc_child(pto_proc *p, int32_t slot);

_Static_assert(PTO_MB_CELLS <= 32, "pto_child.deps_cells has a bit per cell");

/* While a child runs a task or starts, its dispatcher looks this often
 * whether the forkserver is still there and a start is late: nothing else
 * tells it the zygote died (its children die with it and cannot mark
 * their mailboxes DEAD). */
#define PTO_PROC_TICK_NS 50000000ll

/* Hand a task to c's child, into its next cell (the caller keeps c->posted -
 * c->collected below PTO_MB_CELLS; after_prev: run it only if the cell
 * posted just before it succeeds; deps, if not NULL: its task-end word and
 * the producers on other children it waits for, done_words.h): 0 posted; 1 not yet (a child is starting
 * for it: call again when the bell rings); -1 failed, the reason in err (no
 * live child, a failed start, arguments too big for the mailbox). */
int pto_proc_try_post(pto_child *c, uint64_t callable, const pto_args_view *args, const pto_call_config *cfg,
                      bool after_prev, const pto_mb_deps *deps, char *err, size_t errlen);

typedef struct pto_proc_result {
    int rc;                  /* the leaf's result; 1 when the child died running it */
    bool skipped;            /* not run: after_prev, and the cell before failed */
    bool lost;               /* PTO_PROC_LOST: whether the oldest cell had begun (and so failed) */
    uint32_t begun;          /* PTO_PROC_LOST: how many cells from the oldest had begun (a leaf that
                              * overlaps tasks begins several): they all failed */
    uint64_t t0, t1;         /* when the child began and ended it (0 if it did not run) */
} pto_proc_result;

enum { PTO_PROC_RUNNING = 0, PTO_PROC_DONE = 1, PTO_PROC_LOST = 2 };

/* The oldest posted, uncollected cell (call only with one):
 * PTO_PROC_RUNNING: not finished yet.
 * PTO_PROC_DONE: finished; its result in *r and, if it failed, the message
 *   in err (check mode's warnings too on success).
 * PTO_PROC_LOST: the child is gone. If the oldest cell had begun (r->lost),
 *   it failed, and so did the r->begun - 1 after it that had begun too: rc 1
 *   and the reason in err. Every other uncollected cell was never begun and
 *   is taken back (c->posted = c->collected): post those again. A replacement is requested as for any death.
 * check_zygote: also look whether the forkserver is gone (a system call:
 * every TICK, not every turn). */
int pto_proc_poll(pto_child *c, bool check_zygote, pto_proc_result *r, char *err, size_t errlen);
/* When the child began the oldest uncollected cell, or 0 if it has not. */
uint64_t pto_proc_head_started(const pto_child *c);
/* Cells posted to c that its child has not begun (a hint: read racily). */
uint32_t pto_proc_unbegun(const pto_child *c);
/* The CPU c's child began its last cell on while it has cells posted and not done, else -1 (a hint). */
int32_t pto_proc_busy_cpu(const pto_child *c);
/* Move c's child to CPU cpu now, its own CPU mask kept (a nudge, not a pin); false if that failed. */
bool pto_proc_nudge(pto_child *c, int32_t cpu);
/* Between pto_proc_batch(c, true) and (c, false), pto_proc_try_post hands
 * a cell over at once only if every cell handed over before it has been
 * collected (the child may be waiting); the rest go over together at the
 * end, with one release and one wake-up check instead of one per cell. */
void pto_proc_batch(pto_child *c, bool on);
/* Revoke the k-th uncollected posted cell of c before its child begins it;
 * true if it will come back skipped instead of running. */
bool pto_proc_revoke(pto_child *c, uint32_t k);
/* The running task ran past its deadline of ms: have the zygote SIGKILL the child. Its death (not
 * a result it may still post) ends the task, reported by pto_proc_poll as timed out; a
 * replacement is requested as for any death. */
void pto_proc_timeout(pto_child *c, uint32_t ms);
/* Move a replacement along (its start timeout); true when it just ended. */
bool pto_proc_tick(pto_child *c);
/* Whether c's mailbox has news for the dispatcher: anything but a start
 * still within its deadline. */
bool pto_proc_actionable(const pto_child *c);
/* Wait until no replacement is under way (the end of a run). */
void pto_proc_settle(pto_proc *p);
/* Set every child's hot window (pto_hot_spin); with wake, wake the
 * sleeping ones so that they spin for their next task. */
void pto_proc_hot(pto_proc *p, uint64_t until_ns, bool wake);
/* Wake everyone waiting on a mailbox (the Worker is stopping). */
void pto_proc_wake(pto_proc *p);
/* Async-signal-safe: have the zygote SIGKILL every child running a task. */
void pto_proc_kill_busy(pto_proc *p, uint32_t reason);
/* Pid of the live child in slot, or -1. */
int pto_proc_child_pid(pto_proc *p, int32_t slot);
/* In a child process: the mailbox it serves (NULL elsewhere). */
pto_mailbox *pto_proc_own_mailbox(void);

#endif
