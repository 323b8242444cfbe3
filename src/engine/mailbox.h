/* The shared-memory mailbox between the parent (its scheduler's turn
 * drives every mailbox, process.h, scheduler.h) and the child process that runs one
 * worker's leaf in PROCESS mode.
 *
 * One mailbox per worker, each its own MAP_SHARED|MAP_ANONYMOUS
 * mapping taken before any fork, so the zygote and every child it forks see
 * it at the same address. Three processes write to it, each only in the
 * states that give it ownership. The state word is the child's life:
 *
 *   state        owner of the other fields      next state (by whom)
 *   EMPTY        parent                         STARTING (parent, then asks the zygote to fork)
 *   STARTING     child (rc, err: start failure) IDLE (child) or DEAD (zygote)
 *   IDLE         see the cells below            SHUTDOWN (parent) or DEAD (zygote)
 *   SHUTDOWN     -                              DEAD (zygote)
 *   DEAD         parent (pid, exit fields are   STARTING (parent)
 *                final: the zygote reaped it)
 *
 * While IDLE (up), tasks travel through a ring of PTO_MB_CELLS cells, so a
 * child runs the tasks staged for it back to back without waiting for the
 * parent between them, and the parent collects results whenever it gets
 * the core. Two counters, each written by one side only, say who owns
 * which cell (sequence numbers, cell = seq % PTO_MB_CELLS):
 *
 *   cells [done, posted)        child: it runs them in order (started says
 *                               which one it has begun), then writes the
 *                               result and advances done (release)
 *   cells [posted, done + N)    parent: it writes a task, then advances
 *                               posted (release)
 *   cells the parent has not    the result waits for the parent, who owns
 *   collected below done        the cell again once it has read it
 *
 * The parent keeps its own copies of the counters: the child's memory is
 * untrusted, so a done that passes posted is a corrupt child, killed.
 * A cell may ask to run only if the one before it succeeded (after_prev: a
 * consumer chained behind its producer); the child then skips it, and the
 * parent decides what the skipped task becomes. On an interrupt the parent
 * revokes the cells the child has not begun: a claim word per cell, CAS
 * from POSTED by whichever side comes first, decides whether it runs.
 *
 * Every state transition is a CAS or an exchange, so a DEAD written by the
 * zygote is never overwritten by a late parent store. A child whose start
 * hook fails writes rc != 0 and the message, then exits: the zygote's DEAD
 * (died_in = STARTING) is the one signal the parent waits for. A child
 * that dies leaves the cells it had not begun unrun: the parent posts
 * them again to the replacement.
 *
 * Waiting: the child spins briefly (an adaptive budget, see pto_mb_spin)
 * and then sleeps on a futex in the mailbox (pto_event, shared futexes, no
 * PRIVATE flag); the parent side waits on to_parent (init, blocking
 * starts) or on the bell, the scheduler's own event; a waker issues
 * FUTEX_WAKE only when the sleeper announced itself (Dekker, seq_cst), so
 * a hand-off to a spinning peer costs no system call. */
#ifndef PTO_MAILBOX_H
#define PTO_MAILBOX_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include "diag.h"
#include "done_words.h"
#include "event.h"
#include "pto.h"

#define PTO_MB_BLOB_CAP (256u * 1024u)   /* bytes of args blob a task may carry */
#define PTO_MB_ERR_CAP 4096u             /* error message incl. a Lua traceback */
/* Tasks a child may have posted, a power of two. The scheduler keeps only
 * as many posted as cover PTO_WM_STOCK_NS of work, at most
 * PTO_WM_MAX_POSTED (worker_manager.h): a ring of short tasks lets it nap,
 * few long ones keep an idle sibling from waiting while tasks sit here
 * unstealable. The rest of the ring is for chains, which no sibling could
 * begin sooner. */
#define PTO_MB_CELLS 32u
enum { PTO_CELL_POSTED = 0, PTO_CELL_TAKEN = 1, PTO_CELL_REVOKED = 2 };

enum {
    PTO_MB_EMPTY = 0,
    PTO_MB_STARTING,
    PTO_MB_IDLE,
    PTO_MB_SHUTDOWN,
    PTO_MB_DEAD,
    PTO_MB_NSTATES
};

/* Why the zygote killed a child (kill_reason), for the parent's message. */
enum {
    PTO_KILL_NONE = 0,
    PTO_KILL_START_TIMEOUT,    /* start hook did not report in time */
    PTO_KILL_INTERRUPT,        /* second interrupt of a run */
    PTO_KILL_SHUTDOWN,         /* pto_worker_shutdown / close */
    PTO_KILL_TASK_TIMEOUT,     /* a task ran past its deadline (pto_proc_timeout) */
    PTO_KILL_CORRUPT,          /* its mailbox was in a state no protocol step leads to */
    PTO_KILL_SUBTREE,          /* the Worker it hosts lost its forkserver (written by that Worker's sentinel) */
};

/* One staged task and, once done, its result. */
typedef struct pto_mb_cell {
    /* The task: written by the parent before it advances posted. */
    _Alignas(64) uint64_t callable;
    uint64_t load_addr, load_len;    /* shipped callable to install first (shared memory), or 0 */
    uint32_t blob_len;
    uint32_t after_prev;             /* 1: skip it unless the cell before it succeeded */
    uint64_t posted_ns;              /* pto_now_ns() at the post (CLOCK_MONOTONIC is system-wide), 0 if the
                                      * child was still busy with earlier cells then */
    pto_call_config cfg;
    /* Early posts (done_words.h): the word of this child's page its end
     * writes (stamp 0: none), and the producers on any child it waits for
     * before it begins; it is skipped if one of them did not succeed. One
     * line, the parent's like the rest of the task. */
    _Alignas(64) uint32_t done_word;
    uint32_t nwaits;
    uint64_t done_stamp;
    pto_done_ref waits[PTO_DONE_WAITS];
    /* The result: written by the child before it advances done. */
    _Alignas(64) uint64_t start_ns;
    uint64_t done_ns;      /* pto_now_ns() when the child began it (the cell before it ended,
                                      * if it was waiting) and posted the result */
    int32_t rc;
    uint32_t loaded;                 /* 1 if load_addr was installed */
    uint32_t skipped;                /* 1 if not run (after_prev and the cell before failed, or revoked) */
    /* Who has the cell once posted: PTO_CELL_POSTED until the child takes it
     * (TAKEN) or the parent revokes it (REVOKED); one CAS decides. The
     * child puts it back to POSTED as it finishes the cell, and a post
     * writes it only when it is not (a revoke after the finish, a child
     * lost mid-task), so in steady state its line stays the child's: a
     * line apart from the result, which the parent reads at every
     * collection, and shared only with the error text, which the parent
     * reads only of a failed task. */
    _Alignas(64) _Atomic uint32_t claim;
    char err[PTO_MB_ERR_CAP];
    _Alignas(64) unsigned char blob[PTO_MB_BLOB_CAP];
} pto_mb_cell;

typedef struct pto_mailbox {
    _Alignas(64) _Atomic uint32_t state;
    _Atomic int32_t pid;             /* the child serving it (zygote and child write it) */
    _Atomic int32_t wait_status;     /* waitpid status, final in DEAD */
    _Atomic uint32_t died_in;        /* the state the child was reaped in */
    _Atomic uint32_t kill_reason;    /* PTO_KILL_*, written by the zygote before it kills */
    /* pto_now_ns() by which the child must report started: a child that
     * starts children of its own (a nested Worker) waits for them no longer
     * than this, so the whole tree shares one deadline. */
    uint64_t start_deadline_ns;
    /* The parent's hot window (pto_hot_spin): until then the child spins
     * for its next task instead of sleeping. */
    _Atomic uint64_t hot_until_ns;
    /* The parent's dispatcher (its scheduler thread) sleeps here, on an
     * event in another shared mapping, set before the fork; NULL if none.
     * The child and the zygote ring it with to_parent. */
    pto_event *bell;
    /* Every child's page of task-end words (done_words.h), set before the
     * fork: this child's own is writable, the others read-only. NULL: none. */
    pto_done_page *const *done_pages;
    int32_t ndone_pages;
    pto_done_page *own_done;
    /* The start's failure: written by the child before it exits (or by the zygote when fork fails). */
    int32_t rc;
    char err[PTO_MB_ERR_CAP];
    _Alignas(64) pto_event to_child;    /* the child sleeps here */
    _Alignas(64) pto_event to_parent;   /* the parent side sleeps here */
    _Alignas(64) _Atomic uint32_t posted;    /* parent: cells handed over (a sequence number) */
    _Alignas(64) _Atomic uint32_t started;   /* child: cells begun */
    _Atomic uint32_t done;                   /* child: cells finished */
    _Atomic int32_t cpu;                     /* child: the CPU it began its last cell on */
    /* Check mode (check.c) and diagnostics (diag.c) are per task but live
     * here, once: a task that uses them is posted alone, into an empty ring. */
    _Alignas(64) uint32_t check, check_ntags;
    uint32_t check_warn;                     /* 1: check mode's findings are warnings (check = "warn") */
    uint64_t check_ring_base[PTO_MAX_RING_DEPTH], check_ring_size[PTO_MAX_RING_DEPTH], check_shm_top;
    uint8_t check_tags[8192];
    pto_diag_task diag;
    pto_mb_cell cells[PTO_MB_CELLS];
} pto_mailbox;

/* An adaptive spin budget: spin about twice the recent wait when that is
 * short, not at all when waits are long (a futex wake-up then costs little
 * next to the wait, and a spinner would take a core from the peer). A wait
 * is measured up to the peer's post timestamp, not to the wake-up, so
 * sleeping does not inflate it and spinning resumes when waits shrink.
 * While waits are short the spin lasts at least as long as a recent
 * wake-up took (from the peer's post to running again): a wait that ends
 * within that is cheaper caught spinning than asleep, for the waker too,
 * whose FUTEX_WAKE is a system call. Waits are mostly near zero with a
 * few of a parent's turn (tens of us): twice their mean (2-3 us) slept
 * through those, and each cost both sides a wake-up (35-60 us on this
 * 2-core VM; the main BGEMM in PROCESS mode ran 12% slower so). */
typedef struct pto_mb_spin {
    uint32_t ewma_ns;     /* recent waits, 1/8 smoothing */
    uint32_t wake_ns;     /* recent wake-ups: from the peer's post to running again after a sleep, 1/4 smoothing */
    uint32_t max_ns;      /* never spin longer than this */
} pto_mb_spin;

void pto_mb_spin_init(pto_mb_spin *s, uint32_t max_ns);
int64_t pto_mb_spin_budget(const pto_mb_spin *s);
/* After a sleep: the peer's post reached the sleeper woke_ns later. */
void pto_mb_spin_woke(pto_mb_spin *s, uint64_t woke_ns);
void pto_mb_spin_observe(pto_mb_spin *s, uint64_t waited_ns);

/* A zero-filled mailbox in its own shared mapping; NULL with pto_errmsg. */
pto_mailbox *pto_mb_map(void);
void pto_mb_unmap(pto_mailbox *mb);

static inline uint32_t pto_mb_state(pto_mailbox *mb)
{
    return atomic_load_explicit(&mb->state, memory_order_acquire);
}

/* Whether st is one of the states in mask (bit 1 << state); a state
 * outside the protocol (a child wrote over its mailbox) is in no mask. */
static inline bool pto_mb_in(uint32_t st, uint32_t mask)
{
    return st < PTO_MB_NSTATES && ((1u << st) & mask);
}

/* CAS from -> to (release); false, with the state seen in *seen, if the state was not from. */
bool pto_mb_cas(pto_mailbox *mb, uint32_t from, uint32_t to, uint32_t *seen);

/* ---- parent side ---- */

/* Copy a task into cell seq (the parent's own count of posts: the cell must
 * be the parent's, seq - collected < PTO_MB_CELLS) and hand it to the child.
 * Returns 0; -1 (errmsg set) if the args blob does not fit; or the state
 * found instead of IDLE (PTO_MB_DEAD ...), nothing handed over. */
int pto_mb_post(pto_mailbox *mb, uint32_t seq, uint64_t callable, const pto_args_view *args,
                const pto_call_config *cfg, const void *load, uint64_t load_len, bool after_prev);
/* pto_mb_post without the hand-over: the cell is written, and the child
 * sees it (and every cell written before it) at pto_mb_publish. */
int pto_mb_write(pto_mailbox *mb, uint32_t seq, uint64_t callable, const pto_args_view *args,
                 const pto_call_config *cfg, const void *load, uint64_t load_len, bool after_prev);
/* What a cell's task says to and waits for from other children (done_words.h). */
typedef struct pto_mb_deps {
    pto_done_ref own;                /* stamp 0: its end writes no word */
    uint32_t nwaits;
    pto_done_ref waits[PTO_DONE_WAITS];
} pto_mb_deps;
/* After pto_mb_write of cell seq, before the publish: its task's word and
 * the producers it waits for. pto_mb_write leaves them as the cell's last
 * task had them (zero in a fresh mailbox): writing them at every post
 * would move their line to the parent's core and back to the child's, so
 * the caller clears them only where it set them (pto_proc_try_post). */
void pto_mb_set_deps(pto_mailbox *mb, uint32_t seq, const pto_mb_deps *deps);
/* Hand the cells below posted (the parent's count) to the child, waking it
 * if it sleeps. */
void pto_mb_publish(pto_mailbox *mb, uint32_t posted);

/* Take back posted cell seq before the child begins it (an interrupt: what
 * was handed over but not begun must not run). true if it will not run: the
 * child reports it done and skipped. false if the child took it first. */
bool pto_mb_revoke(pto_mailbox *mb, uint32_t seq);

static inline pto_mb_cell *pto_mb_cell_of(pto_mailbox *mb, uint32_t seq)
{
    return &mb->cells[seq & (PTO_MB_CELLS - 1)];
}

/* How many cells the child reports finished beyond seq (acquire: their
 * results are visible). Negative or above what was posted: a corrupt child. */
static inline int32_t pto_mb_done_beyond(pto_mailbox *mb, uint32_t seq)
{
    return (int32_t)(atomic_load_explicit(&mb->done, memory_order_acquire) - seq);
}

/* Wait while the state is in while_mask (bit 1 << state), until abort(arg)
 * (may be NULL) or timeout_ns (< 0: none). Spins spin_ns first. Returns the
 * state seen last. */
uint32_t pto_mb_wait(pto_mailbox *mb, uint32_t while_mask, bool (*abort)(void *), void *arg, int64_t spin_ns,
                     int64_t timeout_ns);
/* Wait until cell seq is done, the state leaves IDLE, or timeout_ns (< 0:
 * none); spins spin_ns first. true if the cell is done. */
bool pto_mb_wait_done(pto_mailbox *mb, uint32_t seq, int64_t spin_ns, int64_t timeout_ns);

/* ---- child side ---- */

/* Wake whoever waits on the parent side (to_parent and the bell). */
void pto_mb_wake_parent(pto_mailbox *mb);

/* Run leaf->start, then IDLE; on failure write rc and the message (the
 * caller exits). 0 or the start hook's result. */
int pto_mb_child_start(pto_mailbox *mb, const pto_leaf *leaf);

/* Serve cells in order until SHUTDOWN (waiting for each with an adaptive
 * spin of at most spin_max_ns, or cold_spin_ns outside the hot window):
 * decode (the mailbox is untrusted bytes: bad lengths fail the task),
 * install a shipped callable, run the leaf, post the result. Returns when
 * told to shut down. */
void pto_mb_child_loop(pto_mailbox *mb, const pto_leaf *leaf, uint32_t spin_max_ns, int64_t cold_spin_ns);

#endif
