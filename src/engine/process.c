#include "process_priv.h"
#include "shm.h"
#include "common.h"

#include <assert.h>
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define TICK_NS PTO_PROC_TICK_NS   /* a blocked wait's look at the zygote: a timed futex wait */
/* At close the parent waits this much longer than the zygote's own grace
 * for the zygote to exit, then SIGKILLs it: a stopped zygote cannot strand close. */
#define STOP_BOUND_MS (EXIT_GRACE_MS + 1000)
/* A message the zygote does not take within this long (its queue is full:
 * it is stopped or stuck) counts as a lost forkserver. */
#define SEND_BOUND_MS 2000
/* How long pto_proc_child_pid waits for the zygote to report a child the kernel no longer has. */
#define CHILD_GONE_WAIT_NS 100000000ull

/* Outcomes of a parent-side wait besides a mailbox state. */
enum { W_ABORTED = PTO_MB_NSTATES, W_TIMEOUT, W_ZYGOTE_GONE };

/* Held from socketpair to closing the zygote's end in the parent, so no
 * other Worker's fork in between inherits that end (the parent would then
 * not see the zygote's death as a hang-up). */
static pthread_mutex_t fork_mu = PTHREAD_MUTEX_INITIALIZER;

/* ---- shipped callables ---- */

void pto_ship_init(pto_ship_table *t)
{
    memset(t, 0, sizeof *t);
    pthread_mutex_init(&t->mu, NULL);
}

void pto_ship_destroy(pto_ship_table *t)
{
    uint32_t n = atomic_load(&t->count);
    for (uint32_t i = 0; i < n; i++) pto_shm_free(t->entries[i].blob);
    free(t->entries);
    pthread_mutex_destroy(&t->mu);
}

int pto_ship_add(pto_ship_table *t, int32_t kind, uint64_t callable, const void *blob, uint64_t len)
{
    if (pto_shm_init(0) != 0) return -1;
    void *copy = pto_shm_alloc(len);
    if (!copy) {
        char why[PTO_ERRLEN];
        snprintf(why, sizeof why, "%s", pto_errmsg());
        pto_set_error("cannot copy the callable (%llu bytes) into shared memory: %s", (unsigned long long)len, why);
        return -1;
    }
    memcpy(copy, blob, len);
    pthread_mutex_lock(&t->mu);
    uint32_t n = atomic_load_explicit(&t->count, memory_order_relaxed);
    if (n == PTO_MAX_SHIPPED) {
        pthread_mutex_unlock(&t->mu);
        pto_shm_free(copy);
        pto_set_error("at most %d callables can be shipped to a Worker's children; register them before the Worker is initialised",
                      PTO_MAX_SHIPPED);
        return -1;
    }
    if (!t->entries) t->entries = pto_xcalloc(PTO_MAX_SHIPPED, sizeof *t->entries);
    t->entries[n] = (pto_shipped){kind, callable, copy, len};
    atomic_store_explicit(&t->count, n + 1, memory_order_release);
    pthread_mutex_unlock(&t->mu);
    return 0;
}

static int32_t ship_find(const pto_ship_table *t, int32_t kind, uint64_t callable)
{
    uint32_t n = atomic_load_explicit(&t->count, memory_order_acquire);
    for (uint32_t i = n; i-- > 0;)
        if (t->entries[i].callable == callable && t->entries[i].kind == kind) return (int32_t)i;
    return -1;
}


/* ---- the parent side ---- */

/* Within SEND_BOUND_MS: a zygote that takes nothing (stopped, its queue full) is as good as gone. */
static bool send_msg(pto_proc *p, uint32_t op, int32_t slot, uint32_t reason)
{
    zmsg m = {op, slot, reason};
    uint64_t deadline = 0;
    for (;;) {
        ssize_t r = send(p->sock, &m, sizeof m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r == (ssize_t)sizeof m) return true;
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            uint64_t now = pto_now_ns();
            if (!deadline) deadline = now + SEND_BOUND_MS * 1000000ull;
            if (now < deadline) {
                struct pollfd f = {p->sock, POLLOUT, 0};
                poll(&f, 1, (int)((deadline - now) / 1000000 + 1));
                continue;
            }
        }
        atomic_store(&p->zygote_gone, true);
        return false;
    }
}

static bool is_stopping(void *arg)
{
    pto_proc *p = arg;
    return atomic_load_explicit(p->stopping, memory_order_acquire);
}

/* The zygote never writes to the socket: readable or hung up means gone. */
static bool zygote_alive(pto_proc *p)
{
    if (atomic_load_explicit(&p->zygote_gone, memory_order_relaxed)) return false;
    struct pollfd f = {p->sock, POLLIN, 0};
    if (poll(&f, 1, 0) > 0 && (f.revents & (POLLIN | POLLHUP | POLLERR))) {
        atomic_store(&p->zygote_gone, true);
        return false;
    }
    return true;
}

/* Wait while c's state is in mask. Returns the state, or W_ABORTED (the
 * Worker stops; only if abortable), W_TIMEOUT (deadline_ns, 0 = none) or
 * W_ZYGOTE_GONE. */
static uint32_t await(pto_child *c, uint32_t mask, uint64_t deadline_ns, int64_t spin_ns, bool abortable)
{
    pto_proc *p = c->proc;
    for (;;) {
        int64_t tick = TICK_NS;
        if (deadline_ns) {
            uint64_t now = pto_now_ns();
            tick = now >= deadline_ns ? 0 : (int64_t)(deadline_ns - now) < tick ? (int64_t)(deadline_ns - now) : tick;
        }
        uint32_t st = pto_mb_wait(c->mb, mask, abortable ? is_stopping : NULL, p, spin_ns, tick);
        if (!pto_mb_in(st, mask)) return st;
        if (abortable && is_stopping(p)) return W_ABORTED;
        if (!zygote_alive(p)) return W_ZYGOTE_GONE;
        if (deadline_ns && pto_now_ns() >= deadline_ns) return W_TIMEOUT;
        spin_ns = 0;
    }
}

/* "chip 1 (pid 42)" */
static void label(char *buf, size_t cap, const pto_child *c)
{
    int pid = atomic_load(&c->mb->pid);
    if (pid > 0) snprintf(buf, cap, "%s (pid %d)", c->name, pid);
    else snprintf(buf, cap, "%s", c->name);
}

/* How a child ended: "exited with status 3", "was killed by signal 11 (Segmentation fault)". */
static void describe_end(char *buf, size_t cap, const pto_mailbox *mb)
{
    int st = atomic_load(&mb->wait_status);
    switch (atomic_load(&mb->kill_reason)) {
    case PTO_KILL_INTERRUPT:
        snprintf(buf, cap, "was killed (SIGKILL) because the run was interrupted again");
        return;
    case PTO_KILL_SHUTDOWN:
        snprintf(buf, cap, "was killed (SIGKILL) because the Worker was shut down");
        return;
    case PTO_KILL_CORRUPT:
        snprintf(buf, cap, "was killed (SIGKILL) because its mailbox was in an impossible state (state %u: "
                 "memory of the child was overwritten); it is replaced", (unsigned)atomic_load(&mb->died_in));
        return;
    case PTO_KILL_SUBTREE:
        if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) {
            snprintf(buf, cap, "was killed (SIGKILL) because the forkserver of the Worker it hosts died; it is "
                     "replaced with a whole new subtree");
            return;
        }
        break;
    default:
        break;
    }
    if (WIFEXITED(st)) {
        snprintf(buf, cap, "exited with status %d", WEXITSTATUS(st));
    } else if (WIFSIGNALED(st)) {
        const char *d = sigdescr_np(WTERMSIG(st));
        snprintf(buf, cap, "was killed by signal %d (%s)%s", WTERMSIG(st), d ? d : "unknown signal",
                 WCOREDUMP(st) ? ", core dumped" : "");
    } else {
        snprintf(buf, cap, "ended with wait status %#x", (unsigned)st);
    }
}

static void zygote_gone_msg(char *buf, size_t cap, const pto_child *c)
{
    /* A hosted Worker cannot be closed by its user: its sentinel has the
     * host killed, and the level above replaces the whole subtree. */
    if (c->proc->nested)
        snprintf(buf, cap, "the Worker's forkserver process (pid %d) is gone, and %s with it; the process hosting "
                 "this Worker is killed and replaced by the Worker above", (int)c->proc->zygote_pid, c->name);
    else
        snprintf(buf, cap, "the Worker's forkserver process (pid %d) is gone, and %s with it; close this Worker and "
                 "create a new one (a Worker added to a thread-mode Worker of the level above: close that one)",
                 (int)c->proc->zygote_pid, c->name);
}

/* When a child asked for now must have started: start_timeout_ms from now,
 * or earlier if this process is itself a child that must be up by then.
 * The margin left before that inherited deadline is this process's time to
 * kill the late child, stop its forkserver, exit and have its parent see
 * it, so the cause reaches the top rather than a bare timeout: a quarter of
 * what is left, at least 50 ms. An eighth (50 ms of 400) was too little for
 * a TSan build on a loaded CI machine. */
static uint64_t start_deadline(const pto_proc *p, bool *cut)
{
    *cut = false;
    uint64_t now = pto_now_ns(), d = now + (uint64_t)p->start_timeout_ms * 1000000ull;
    if (pto_zyg_inherited_deadline_ns) {
        uint64_t left = pto_zyg_inherited_deadline_ns > now ? pto_zyg_inherited_deadline_ns - now : 0;
        uint64_t margin = left / 4 > 50000000ull ? left / 4 : 50000000ull;
        uint64_t mine = left > margin ? now + (left - margin) : now;
        if (mine < d) {
            d = mine;
            *cut = true;
        }
    }
    return d;
}

/* Ask the zygote for a new child in c's slot (its mailbox EMPTY or DEAD). */
static bool request_spawn(pto_child *c)
{
    pto_mailbox *mb = c->mb;
    uint32_t st = pto_mb_state(mb);
    if (st != PTO_MB_EMPTY && st != PTO_MB_DEAD) return false;
    mb->rc = 0;
    mb->err[0] = 0;
    atomic_store(&mb->pid, 0);
    atomic_store(&mb->kill_reason, PTO_KILL_NONE);
    atomic_store(&mb->wait_status, 0);
    mb->start_deadline_ns = start_deadline(c->proc, &c->deadline_cut);
    memset(c->loaded, 0, sizeof c->loaded);
    /* A fresh ring: the new child starts at cell 0, and the cells the dead
     * one never began are posted again by the dispatcher. */
    atomic_store(&mb->posted, 0);
    atomic_store(&mb->started, 0);
    atomic_store(&mb->done, 0);
    c->posted = c->collected = c->published = 0;
    if (!pto_mb_cas(mb, st, PTO_MB_STARTING, NULL)) return false;
    return send_msg(c->proc, Z_SPAWN, c->slot, 0);
}

/* Why a requested child did not start, from the state it ended in:
 * "chip 1 (pid 42) failed to start: ...". timed_out: it was killed for
 * missing its start deadline. */
static void start_failure(pto_child *c, uint32_t st, bool timed_out, char *why, size_t cap)
{
    pto_proc *p = c->proc;
    char who[96], how[256];
    label(who, sizeof who, c);
    if (timed_out) {
        if (c->deadline_cut)
            snprintf(why, cap, "%s did not report ready before the deadline this Worker's own parent set (start_timeout_ms "
                     "of the Worker at the top applies to the whole tree; raise it there) (it was killed)", who);
        else
            snprintf(why, cap, "%s did not report ready within %u ms; raise start_timeout_ms if its start hook needs "
                     "longer (it was killed)", who, p->start_timeout_ms);
    } else if (st == PTO_MB_DEAD) {
        const pto_mailbox *mb = c->mb;
        if (atomic_load(&mb->died_in) == PTO_MB_STARTING && mb->rc != 0) {
            snprintf(why, cap, "%s failed to start: %.*s", who, (int)strnlen(mb->err, PTO_MB_ERR_CAP), mb->err);
        } else {
            describe_end(how, sizeof how, mb);
            snprintf(why, cap, "%s %s while starting", who, how);
        }
    } else if (st == W_ZYGOTE_GONE) {
        zygote_gone_msg(why, cap, c);
    } else if (st == W_ABORTED) {
        snprintf(why, cap, "the Worker was shut down while %s was starting", who);
    } else {
        snprintf(why, cap, "%s: unexpected mailbox state %u while starting", who, st);
    }
}

/* Wait for a requested child to report started; false with the reason in
 * why ("chip 1 (pid 42) failed to start: ..."). */
static bool await_start(pto_child *c, bool abortable, char *why, size_t cap)
{
    pto_proc *p = c->proc;
    uint64_t deadline = c->mb->start_deadline_ns;
    uint32_t st = await(c, 1u << PTO_MB_STARTING, deadline, 0, abortable);
    if (st == PTO_MB_IDLE) return true;
    if (st == W_TIMEOUT) {
        send_msg(p, Z_KILL, c->slot, PTO_KILL_START_TIMEOUT);
        /* Reaped within milliseconds; then the slot is free for a retry. */
        await(c, ((1u << PTO_MB_NSTATES) - 1) & ~(1u << PTO_MB_DEAD), 0, 0, false);
    }
    start_failure(c, st, st == W_TIMEOUT, why, cap);
    return false;
}

/* ---- the dispatcher's side: never blocks ----
 * The scheduler thread drives every child itself: it posts a task when the
 * child is idle, polls for the result, and moves a replacement along, all
 * between its other work, so a task crosses no thread of its own. A child
 * being (re)started keeps its claimed task until it is up or failed. */

/* Move a requested start along: true once it ended (up, or failed with the
 * reason in why when why is not NULL). Sends the start-timeout kill once. */
static bool start_progress(pto_child *c, char *why, size_t cap, bool *up)
{
    uint32_t st = pto_mb_state(c->mb);
    *up = st == PTO_MB_IDLE;
    if (st == PTO_MB_IDLE) return true;
    if (st == PTO_MB_STARTING) {
        if (atomic_load_explicit(&c->proc->zygote_gone, memory_order_relaxed)) {
            if (why) start_failure(c, W_ZYGOTE_GONE, false, why, cap);
            return true;
        }
        if (!c->kill_sent && pto_now_ns() >= c->mb->start_deadline_ns) {
            c->kill_sent = true;
            send_msg(c->proc, Z_KILL, c->slot, PTO_KILL_START_TIMEOUT);
        }
        return false;
    }
    if (why) start_failure(c, st, c->kill_sent, why, cap);
    return true;
}

static void replaced(pto_child *c)
{
    c->replacing = false;
    pto_proc *p = c->proc;
    if (atomic_fetch_sub(&p->replacing, 1) == 1) pto_event_notify(&p->settle_ev);
}

bool pto_proc_tick(pto_child *c)
{
    if (!c->replacing) return false;
    bool up;
    /* A failed replacement is retried, and reported, by the next task. */
    if (!start_progress(c, NULL, 0, &up)) return false;
    c->awaiting = false;
    replaced(c);
    return true;
}

bool pto_proc_actionable(const pto_child *c)
{
    uint32_t st = pto_mb_state(c->mb);
    if (PTO_UNLIKELY(c->corrupt)) return st == PTO_MB_DEAD;
    return st != PTO_MB_STARTING || (!c->kill_sent && pto_now_ns() >= c->mb->start_deadline_ns);
}

/* c's mailbox is in a state no step of the protocol leads to (its child
 * wrote over it): kill that child; its DEAD, written by the zygote from
 * whatever state, frees the slot for a replacement. */
static void kill_corrupt(pto_child *c)
{
    c->corrupt = true;
    c->timed_out_ms = 0;
    send_msg(c->proc, Z_KILL, c->slot, PTO_KILL_CORRUPT);
}

static void publish(pto_child *c)
{
    if (c->published == c->posted) return;
    pto_mb_publish(c->mb, c->posted);
    c->published = c->posted;
}

void pto_proc_batch(pto_child *c, bool on)
{
    c->batching = on;
    if (!on) publish(c);
}

int pto_proc_try_post(pto_child *c, uint64_t callable, const pto_args_view *args, const pto_call_config *cfg,
                      bool after_prev, const pto_mb_deps *deps, char *err, size_t errlen)
{
    assert(c->posted - c->collected < PTO_MB_CELLS);
    pto_proc *p = c->proc;
    pto_mailbox *mb = c->mb;
    char why[PTO_MB_ERR_CAP];
    /* With cells in flight the child's end is pto_proc_poll's to report
     * (it fails the task begun and takes the rest back); a spawn from here
     * would reset the ring under them. */
    if (c->posted != c->collected && pto_mb_state(mb) != PTO_MB_IDLE) return 1;
    for (int attempt = 0; attempt < 2; attempt++) {
        uint32_t st = pto_mb_state(mb);
        if (atomic_load_explicit(&p->zygote_gone, memory_order_relaxed) || (st != PTO_MB_IDLE && !zygote_alive(p))) {
            zygote_gone_msg(why, sizeof why, c);
            snprintf(err, errlen, "%s has no live child process to run the task: %s", c->name, why);
            return -1;
        }
        if (c->replacing && !pto_proc_tick(c)) return 1;
        st = pto_mb_state(mb);
        if (PTO_UNLIKELY(c->corrupt)) {
            if (st != PTO_MB_DEAD) return 1;   /* the bell rings when it is reaped */
            c->corrupt = false;
            c->awaiting = false;
        }
        if (st == PTO_MB_STARTING || (c->awaiting && st == PTO_MB_DEAD)) {
            bool up;
            if (!start_progress(c, why, sizeof why, &up)) return 1;
            c->awaiting = false;
            if (!up) {
                snprintf(err, errlen, "%s has no live child process to run the task: %s", c->name, why);
                return -1;
            }
            st = PTO_MB_IDLE;
        }
        if (st == PTO_MB_DEAD || st == PTO_MB_EMPTY) {
            /* Died while idle: the task waits for its replacement. */
            if (request_spawn(c)) {
                c->awaiting = true;
                c->kill_sent = false;
                return 1;
            }
            snprintf(err, errlen, "%s has no live child process to run the task: ", c->name);
            size_t n = strlen(err);
            zygote_gone_msg(err + n, errlen - n, c);
            return -1;
        }
        if (st != PTO_MB_IDLE) {
            kill_corrupt(c);
            return 1;
        }
        /* Up: a start it waited for may have ended without this function
         * seeing STARTING; left set, the child's next death would be taken
         * for a failed start and fail the task instead of replacing it. */
        c->awaiting = false;
        int32_t e = ship_find(p->ships, c->kind, callable);
        const pto_shipped *sh = e >= 0 && !(c->loaded[e / 8] & (1u << (e % 8))) ? &p->ships->entries[e] : NULL;
        /* Installed once per child: a cell already carrying it installs it
         * first; its result (the bell) says whether this one needs it. */
        for (uint32_t k = c->collected; sh && k != c->posted; k++)
            if (c->ship[k & (PTO_MB_CELLS - 1)] == e) return 1;
        int r = pto_mb_write(mb, c->posted, callable, args, cfg, sh ? sh->blob : NULL, sh ? sh->len : 0, after_prev);
        if (r == 0) {
            uint32_t bit = 1u << (c->posted & (PTO_MB_CELLS - 1));
            if (deps) {
                pto_mb_set_deps(mb, c->posted, deps);
                c->deps_cells |= bit;
            } else if (c->deps_cells & bit) {
                pto_mb_set_deps(mb, c->posted, &(pto_mb_deps){0});
                c->deps_cells &= ~bit;
            }
            c->ship[c->posted & (PTO_MB_CELLS - 1)] = sh ? e : -1;
            c->posted++;
            /* Every cell handed over came back: the child may be waiting. (The
             * parent's own count, fresh from this turn's collection: reading
             * the child's started would cost a cache line per post.) */
            if (!c->batching || c->collected == c->published) publish(c);
            return 0;
        }
        if (r < 0) {
            snprintf(err, errlen, "%s", pto_errmsg());
            return -1;
        }
        /* r is the state found: the child died since. Once more, unless
         * cells are in flight (see above). */
        if (c->posted != c->collected) return 1;
    }
    snprintf(err, errlen, "%s has no live child process to run the task (mailbox state %u)", c->name, pto_mb_state(mb));
    return -1;
}

void pto_proc_timeout(pto_child *c, uint32_t ms)
{
    c->timed_out_ms = ms;
    send_msg(c->proc, Z_KILL, c->slot, PTO_KILL_TASK_TIMEOUT);   /* a failed send marks the zygote gone */
}

uint64_t pto_proc_head_started(const pto_child *c)
{
    pto_mailbox *mb = c->mb;
    if ((int32_t)(atomic_load_explicit(&mb->started, memory_order_acquire) - c->collected) <= 0) return 0;
    return pto_mb_cell_of(mb, c->collected)->start_ns;
}

uint32_t pto_proc_unbegun(const pto_child *c)
{
    int32_t n = (int32_t)(c->posted - atomic_load_explicit(&c->mb->started, memory_order_relaxed));
    return n > 0 ? (uint32_t)n : 0;
}

int32_t pto_proc_busy_cpu(const pto_child *c)
{
    /* Busy while a posted cell is not done, running or waiting for its
     * producers (a waiting child spins, so it takes a CPU as much); the
     * CPU is the last cell's begin's. A hint, read without order. */
    if (c->posted == atomic_load_explicit(&c->mb->done, memory_order_relaxed)) return -1;
    return atomic_load_explicit(&c->mb->cpu, memory_order_relaxed);
}

bool pto_proc_nudge(pto_child *c, int32_t cpu)
{
    pid_t pid = atomic_load_explicit(&c->mb->pid, memory_order_relaxed);
    cpu_set_t was, one;
    if (pid <= 0 || cpu < 0 || cpu >= CPU_SETSIZE || sched_getaffinity(pid, sizeof was, &was) != 0 || !CPU_ISSET(cpu, &was))
        return false;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    /* The kernel moves it there before the first call returns; the second
     * gives the user's mask back, and the balancer has no reason to move
     * it again. The pid is cleared when the child is reaped; one reused
     * by another process within the microseconds between the load and
     * these calls would be moved once and keep its own mask. */
    bool ok = sched_setaffinity(pid, sizeof one, &one) == 0;
    sched_setaffinity(pid, sizeof was, &was);
    return ok;
}

bool pto_proc_revoke(pto_child *c, uint32_t k)
{
    assert(k < c->posted - c->collected);
    return pto_mb_revoke(c->mb, c->collected + k);
}

/* The child is gone (or must be): fail the oldest cell if it had begun,
 * take the others back, and have it replaced. */
static int lost(pto_child *c, uint32_t st, pto_proc_result *r, char *err, size_t errlen)
{
    pto_mailbox *mb = c->mb;
    char who[96], how[256];
    label(who, sizeof who, c);
    /* The zygote's DEAD is final: after it, the counters no longer move. */
    int32_t begun = (int32_t)(atomic_load_explicit(&mb->started, memory_order_acquire) - c->collected);
    int32_t posted = (int32_t)(c->posted - c->collected);
    r->lost = c->timed_out_ms || st != PTO_MB_DEAD || begun > 0;
    /* The counter is the child's memory: believe it only within what was posted. */
    r->begun = begun < 1 ? 1 : begun > posted ? (uint32_t)posted : (uint32_t)begun;
    r->rc = 1;
    r->skipped = false;
    r->t0 = r->t1 = 0;
    if (st == PTO_MB_DEAD && c->timed_out_ms) {
        snprintf(err, errlen, "%s timed out after %u ms and was killed (SIGKILL)", who, c->timed_out_ms);
        c->timed_out_ms = 0;
    } else if (st == PTO_MB_DEAD) {
        describe_end(how, sizeof how, mb);
        snprintf(err, errlen, "%s %s while running the task", who, how);
    }
    if (st == PTO_MB_DEAD) {
        /* Start the replacement now; the tasks taken back wait for it, and
         * so does the end of the run. Not when the Worker is going away. */
        if (atomic_load(&mb->kill_reason) != PTO_KILL_SHUTDOWN && request_spawn(c)) {
            c->replacing = true;
            c->kill_sent = false;
            atomic_fetch_add(&c->proc->replacing, 1);
        }
    } else {
        snprintf(err, errlen, "%s left its mailbox in an impossible state (%u) while running the task (memory of the "
                 "child was overwritten); it was killed and is replaced", who, st);
        kill_corrupt(c);
    }
    c->posted = c->published = c->collected;   /* request_spawn may have reset both to 0 */
    return PTO_PROC_LOST;
}

int pto_proc_poll(pto_child *c, bool check_zygote, pto_proc_result *r, char *err, size_t errlen)
{
    pto_proc *p = c->proc;
    pto_mailbox *mb = c->mb;
    assert(c->posted != c->collected);
    uint32_t st = pto_mb_state(mb);
    /* A result that raced the kill is not taken: the child it came from is
     * about to die, and nothing more must be posted to it. */
    if (PTO_UNLIKELY(c->timed_out_ms)) {
        if (st == PTO_MB_DEAD) return lost(c, st, r, err, errlen);
        check_zygote = check_zygote || atomic_load_explicit(&p->zygote_gone, memory_order_relaxed);
        if (!check_zygote || zygote_alive(p)) return PTO_PROC_RUNNING;
        zygote_gone_msg(err, errlen, c);
        c->timed_out_ms = 0;
        r->rc = 1;
        r->lost = true;
        c->posted = c->published = c->collected;
        return PTO_PROC_LOST;
    }
    int32_t fin = pto_mb_done_beyond(mb, c->collected);
    if (fin > 0 && fin <= (int32_t)(c->posted - c->collected)) {
        /* Finished, even if the child died since: its result stands. */
        pto_mb_cell *cell = pto_mb_cell_of(mb, c->collected);
        int32_t e = c->ship[c->collected & (PTO_MB_CELLS - 1)];
        r->rc = cell->rc;
        r->skipped = cell->skipped != 0;
        r->lost = false;
        r->t0 = cell->start_ns;
        r->t1 = cell->done_ns;
        if (e >= 0 && cell->loaded) c->loaded[e / 8] |= (uint8_t)(1u << (e % 8));
        err[0] = 0;
        if (r->rc != 0 && !r->skipped) {
            char who[96];
            label(who, sizeof who, c);
            /* Name the process too: its logs, core or debugger need the pid. */
            if (cell->err[0]) snprintf(err, errlen, "%s: %.*s", who, (int)strnlen(cell->err, PTO_MB_ERR_CAP), cell->err);
            else snprintf(err, errlen, "%s: the leaf returned %d", who, r->rc);
        } else if (PTO_UNLIKELY(mb->check == 1) && cell->err[0] && !r->skipped) {
            snprintf(err, errlen, "%.*s", (int)strnlen(cell->err, PTO_MB_ERR_CAP), cell->err);   /* check mode's warnings */
        }
        c->collected++;
        return PTO_PROC_DONE;
    }
    if (fin != 0) {
        st = PTO_MB_NSTATES + 1;   /* done ran past what was posted: the child wrote over its counters */
        if (pto_mb_state(mb) == PTO_MB_DEAD) st = PTO_MB_DEAD;
    }
    if (st == PTO_MB_IDLE) {
        if (!check_zygote || zygote_alive(p)) return PTO_PROC_RUNNING;
        zygote_gone_msg(err, errlen, c);
        r->rc = 1;
        r->lost = true;
        c->posted = c->published = c->collected;
        return PTO_PROC_LOST;
    }
    return lost(c, st, r, err, errlen);
}

static bool settled(void *arg)
{
    pto_proc *p = arg;
    return atomic_load(&p->replacing) == 0 || is_stopping(p);
}

void pto_proc_settle(pto_proc *p)
{
    while (!settled(p)) pto_event_wait(&p->settle_ev, settled, p, 0, TICK_NS);
}

void pto_proc_hot(pto_proc *p, uint64_t until_ns, bool wake)
{
    for (int32_t i = 0; i < p->n; i++) {
        atomic_store_explicit(&p->mbs[i]->hot_until_ns, until_ns, memory_order_relaxed);
        if (wake) pto_event_notify(&p->mbs[i]->to_child);
    }
}

void pto_proc_wake(pto_proc *p)
{
    for (int32_t i = 0; i < p->n; i++) pto_proc_wake_parent(p, i);
    pto_event_notify(&p->settle_ev);
}

void pto_proc_kill_busy(pto_proc *p, uint32_t reason)
{
    /* send() is async-signal-safe; never block or raise SIGPIPE here. */
    int saved = errno;
    zmsg m = {Z_KILL_BUSY, -1, reason};
    (void)send(p->sock, &m, sizeof m, MSG_DONTWAIT | MSG_NOSIGNAL);
    errno = saved;
}

int pto_proc_child_pid(pto_proc *p, int32_t slot)
{
    if (!p || slot < 0 || slot >= p->n || !zygote_alive(p)) return -1;   /* children die with the zygote */
    pto_mailbox *mb = p->mbs[slot];
    uint32_t st = pto_mb_state(mb);
    int pid = atomic_load(&mb->pid);
    if (!(st >= PTO_MB_STARTING && st <= PTO_MB_IDLE && pid > 0)) return -1;
    /* The pid is in memory its child can write: report it only if the kernel
     * says it is one of the zygote's, so nobody is told to signal a stranger. */
    char state;
    int ppid = 0;
    if (pto_zyg_read_stat(pid, &state, &ppid)) return ppid == p->zygote_pid ? pid : -1;
    /* Gone from the kernel but not yet DEAD here: the zygote reaped it and is
     * about to say so. Report it gone only once the mailbox says so, so that
     * a caller that waits for a killed child to disappear and then posts a
     * task finds the death instead of a dead child's idle mailbox. The DEAD
     * may be over already: a replacement (a new pid) has the slot. And the
     * wait is bounded in time, not in yields: on a loaded machine each yield
     * may give a whole time slice away (10,000 of them held orch:task, which
     * asks this, for up to 1.7 s after a child died, beside two busy loops). */
    uint64_t until = pto_now_ns() + CHILD_GONE_WAIT_NS;
    while (pto_mb_state(mb) != PTO_MB_DEAD && atomic_load(&mb->pid) == pid && zygote_alive(p) && pto_now_ns() < until)
        sched_yield();
    return -1;
}


pto_child *pto_proc_child(pto_proc *p, int32_t slot) { return &p->children[slot]; }

pto_mailbox *pto_proc_own_mailbox(void) { return pto_zyg_own_mailbox; }

static void proc_free(pto_proc *p)
{
    for (int32_t i = 0; i < p->n; i++) {
        pto_mb_unmap(p->mbs[i]);
        pto_done_unmap(p->done_pages[i]);
    }
    if (p->closing) munmap(p->closing, sizeof *p->closing);
    free(p->mbs);
    free(p->done_pages);
    free(p->children);
    free(p->leaves);
    free(p->zpids);
    free(p);
}

void pto_proc_stop(pto_proc *p)
{
    if (!p) return;
    for (int32_t i = 0; i < p->n; i++)
        /* Only an idle child: one still running a task is killed by the zygote. */
        if (atomic_load(&p->mbs[i]->posted) == atomic_load(&p->mbs[i]->done) &&
            pto_mb_cas(p->mbs[i], PTO_MB_IDLE, PTO_MB_SHUTDOWN, NULL))
            pto_event_notify(&p->mbs[i]->to_child);
    if (p->zygote_pid > 0) {
        /* The zygote kills what did not take SHUTDOWN, reaps every child
         * (EXIT_GRACE_MS at most) and exits; without it, the children died
         * with it (PR_SET_PDEATHSIG). One that does not exit in time
         * (stopped, stuck) is killed; its sentinel then kills the children's
         * groups. */
        atomic_store(p->closing, 1);
        zmsg m = {Z_EXIT, 0, 0};
        (void)send(p->sock, &m, sizeof m, MSG_NOSIGNAL | MSG_DONTWAIT);
        uint64_t deadline = pto_now_ns() + STOP_BOUND_MS * 1000000ull;
        int pidfd = (int)syscall(SYS_pidfd_open, p->zygote_pid, 0);   /* readable when it exits */
        pid_t r;
        while ((r = waitpid(p->zygote_pid, NULL, WNOHANG)) == 0) {
            uint64_t now = pto_now_ns();
            if (now >= deadline) break;
            if (pidfd < 0) usleep(1000);
            else poll(&(struct pollfd){pidfd, POLLIN, 0}, 1, (int)((deadline - now) / 1000000 + 1));
        }
        if (pidfd >= 0) close(pidfd);
        if (r == 0) {
            kill(p->zygote_pid, SIGKILL);
            while (waitpid(p->zygote_pid, NULL, 0) < 0 && errno == EINTR) {
            }
        }
    }
    if (p->sock >= 0) close(p->sock);
    proc_free(p);
}

static pid_t fork_zygote(pto_proc *p)
{
    int sv[2];
    pthread_mutex_lock(&fork_mu);
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
        pthread_mutex_unlock(&fork_mu);
        pto_set_error("cannot create the forkserver's socket (%s)", strerror(errno));
        return -1;
    }
    /* Buffered output would otherwise be printed again by each child. */
    fflush(NULL);
    pid_t z = fork();
    if (z == 0) {
        /* Its children may host Workers of their own, which fork zygotes too. */
        pthread_mutex_unlock(&fork_mu);
        close(sv[0]);
        pto_zyg_main(p, sv[1]);
    }
    int e = errno;
    close(sv[1]);
    pthread_mutex_unlock(&fork_mu);
    if (z < 0) {
        close(sv[0]);
        pto_set_error("cannot fork the forkserver process (%s)", strerror(e));
        return -1;
    }
    p->sock = sv[0];
    return z;
}

pto_proc *pto_proc_start(const pto_proc_config *cfg)
{
    if (pto_shm_init(0) != 0) {
        char why[PTO_ERRLEN];
        snprintf(why, sizeof why, "%s", pto_errmsg());
        pto_set_error("PROCESS mode needs the shared tensor memory: %s", why);
        return NULL;
    }
    pto_proc *p = pto_xcalloc(1, sizeof *p);
    p->n = cfg->n;
    p->start_timeout_ms = cfg->start_timeout_ms;
    p->stopping = cfg->stopping;
    p->ships = cfg->ships;
    p->sock = -1;
    p->sfd = -1;
    p->parent_pid = getpid();
    p->bell = cfg->bell;
    p->nested = pto_zyg_own_mailbox != NULL;
    p->sentinel_fd = -1;
    p->closing = mmap(NULL, sizeof *p->closing, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p->closing == MAP_FAILED) {
        pto_set_error("cannot map the forkserver's control word (mmap: %s)", strerror(errno));
        free(p);
        return NULL;
    }
    p->mbs = pto_xcalloc((size_t)p->n, sizeof *p->mbs);
    p->done_pages = pto_xcalloc((size_t)p->n, sizeof *p->done_pages);
    p->children = pto_xcalloc((size_t)p->n, sizeof *p->children);
    p->leaves = pto_xcalloc((size_t)p->n, sizeof *p->leaves);
    p->zpids = pto_xcalloc((size_t)p->n, sizeof *p->zpids);
    for (int32_t i = 0; i < p->n; i++) {
        if (!(p->mbs[i] = pto_mb_map()) || !(p->done_pages[i] = pto_done_map())) {
            proc_free(p);
            return NULL;
        }
        p->leaves[i] = cfg->leaves[i];
        p->mbs[i]->bell = cfg->bell;
        p->mbs[i]->done_pages = p->done_pages;
        p->mbs[i]->ndone_pages = p->n;
        p->mbs[i]->own_done = p->done_pages[i];
        pto_child *c = &p->children[i];
        *c = (pto_child){.proc = p, .mb = p->mbs[i], .slot = i, .kind = cfg->kinds[i], .name = cfg->names[i]};
        pto_done_init(&c->done, p->done_pages[i]);
    }
    pthread_sigmask(SIG_SETMASK, NULL, &p->child_mask);
    p->zygote_pid = fork_zygote(p);
    if (p->zygote_pid < 0) {
        proc_free(p);
        return NULL;
    }
    /* All children start at once, then are awaited in order, each within
     * start_timeout_ms of when its wait began; the first failure ends init. */
    char why[PTO_MB_ERR_CAP];
    bool ok = true;
    for (int32_t i = 0; i < p->n && ok; i++) {
        if (!request_spawn(&p->children[i])) {
            zygote_gone_msg(why, sizeof why, &p->children[i]);
            ok = false;
        }
    }
    for (int32_t i = 0; i < p->n && ok; i++) ok = await_start(&p->children[i], false, why, sizeof why);
    if (!ok) {
        pto_proc_stop(p);
        pto_set_error("%s", why);
        return NULL;
    }
    return p;
}
