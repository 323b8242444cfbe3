/* sched_turns.c - who runs the scheduler's turn (pto_sched_turn, in
 * scheduler.c: wire, dispatch, pump, collect) and how the others wait.
 *
 * The turn flag (turn_held) makes one thread at a time the turn's holder:
 *   - the scheduler thread (sched_main), which keeps the flag from turn to
 *     turn while it finds work, naps while every worker is stocked, spins
 *     and then sleeps on its event when idle, and parks while a helper runs
 *     the turns;
 *   - a thread waiting for its run to drain (pto_sched_help), which runs
 *     the turns itself so a small machine has one spinner less;
 *   - in THREAD mode, a worker thread that finished a long task with
 *     nothing else staged (worker_turn), which takes its own completion in
 *     and dispatches what that made ready, often to itself.
 * The orchestrator's hand-off (pto_sched_submit) wakes whoever waits. */
#include "scheduler.h"
#include "common.h"
#include "slot.h"

#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

/* The scheduler spins this long for new work before it sleeps. */
#define SCHED_SPIN_NS 20000
/* While every worker has work staged to last SCHED_NAP_STOCK naps, the
 * scheduler naps instead of spinning: no completion can make a worker idle
 * before it looks again, and its spinning would take a core from the
 * workers (a third of one in a BGEMM of 64x64 tiles on 2 cores). A nap is
 * the least stock over SCHED_NAP_STOCK, within [SCHED_NAP_MIN_NS,
 * SCHED_NAP_MAX_NS]: a timed sleep, not a futex wait, so neither a
 * worker's completion nor a submit pays a wake-up for it; its thread's
 * timer slack is 1 us, so a nap is not stretched by the default 50. */
#define SCHED_NAP_MIN_NS 30000
#define SCHED_NAP_MAX_NS 500000
#define SCHED_NAP_STOCK 4
/* While a draining thread runs the turns (pto_sched_help), the scheduler
 * thread sleeps in `park`, at first SCHED_PARK_MIN_NS at a time, each sleep
 * twice the last up to SCHED_PARK_MAX_NS: every look costs a wake-up that
 * preempts a worker (a fixed 50 us made 2.5 times the workers' preemptions
 * in a BGEMM drain), while a helper that stops before its wait is over, or
 * after a long help, wakes it at once. A short help (a small run) ends
 * without a wake-up: it would cost a syscall per run, and the next run's
 * drain helps again; a run that submits SCHED_UNPARK_SUBMITS tasks before
 * it drains wakes it then. */
#define SCHED_PARK_MIN_NS 50000
#define SCHED_PARK_MAX_NS 800000
#define SCHED_HELP_LONG_NS 200000
#define SCHED_UNPARK_SUBMITS 16

void pto_sched_submit(pto_scheduler *s, pto_slot *slot)
{
    pto_wq_push(&s->wire, slot);
    pto_event_notify_light(s->ev);   /* the orchestrator: a thread of the scheduler's process */
    /* A run that goes on submitting after a short help gets the parked
     * scheduler thread back now rather than at its next timeout. */
    if (++s->unhelped_submits == SCHED_UNPARK_SUBMITS) pto_event_notify(&s->park);
}

/* The turn holder's own fields that pending() compares requests with. */
typedef struct turn_seen {
    uint64_t quiet;
    uint32_t gate;
    bool ready;
} turn_seen;

static turn_seen seen_now(const pto_scheduler *s) { return (turn_seen){s->quiet_seen, s->gate_seen, s->ready_len > 0}; }

/* Whether a turn would find work, by what anyone may read, against seen. */
static bool pending_since(pto_scheduler *s, turn_seen seen)
{
    if (pto_wq_pending(&s->wire)) return true;
    if (atomic_load_explicit(&s->cancel, memory_order_relaxed) && seen.ready) return true;
    if (atomic_load_explicit(&s->quiet_req, memory_order_relaxed) != seen.quiet ||
        atomic_load_explicit(&s->sync_req, memory_order_relaxed) !=
            atomic_load_explicit(&s->sync_ack, memory_order_relaxed) ||
        atomic_load_explicit(&s->gate_gen, memory_order_relaxed) != seen.gate)
        return true;
    for (int32_t kind = 0; kind < PTO_KINDS; kind++)
        for (int32_t i = 0; i < s->wm->count[kind]; i++) {
            pto_worker_thread *wt = s->wm->threads[kind][i];
            if (atomic_load_explicit(&wt->cq_head, memory_order_relaxed) !=
                atomic_load_explicit(&wt->cq_tail, memory_order_relaxed))
                return true;
        }
    return false;
}

/* Whether a turn would find work; by the turn flag's holder. */
static bool pending(pto_scheduler *s)
{
    /* About every millisecond of waiting: see pto_wm_spread. */
    if ((++s->spread_looks & 4095) == 0) pto_wm_spread(s->wm);
    return pending_since(s, seen_now(s)) || pto_wm_pump_ready(s->wm, &s->wait_ns);
}

/* The scheduler thread must stop waiting: it is told to stop, or a helper
 * came (it gives the turn up). */
static bool called_off(const pto_scheduler *s)
{
    return !atomic_load_explicit(&s->running, memory_order_relaxed) ||
           atomic_load_explicit(&s->helpers, memory_order_relaxed);
}

static bool sched_has_work(void *arg)
{
    pto_scheduler *s = arg;
    return called_off(s) || pending(s);
}

/* The scheduler thread's wait without the turn (THREAD mode, where idle
 * workers take turns meanwhile): against what its last turn had seen; a
 * worker's turn since then that answered a request wakes it for a turn
 * that finds nothing, which is harmless. */
typedef struct unheld_wait {
    pto_scheduler *s;
    turn_seen seen;
} unheld_wait;

static bool sched_has_work_unheld(void *arg)
{
    unheld_wait *u = arg;
    return called_off(u->s) || pending_since(u->s, u->seen);
}

/* How long the scheduler may nap: the least work any worker has staged and
 * not yet begun (a THREAD-mode worker's queue, the cells posted to a
 * PROCESS-mode child), at its kind's recent mean run time, over
 * SCHED_NAP_STOCK; 0 if that is below SCHED_NAP_MIN_NS. */
static int64_t nap_ns(const pto_scheduler *s)
{
    const pto_worker_manager *wm = s->wm;
    int64_t least = (int64_t)SCHED_NAP_STOCK * SCHED_NAP_MAX_NS;
    for (int32_t kind = 0; kind < PTO_KINDS; kind++)
        for (int32_t i = 0; i < wm->count[kind]; i++) {
            int64_t stock = (int64_t)pto_wm_unbegun(wm->threads[kind][i]) * wm->task_ns[kind];
            if (stock < least) least = stock;
        }
    least /= SCHED_NAP_STOCK;
    return least < SCHED_NAP_MIN_NS ? 0 : least;
}

static void nap(int64_t ns)
{
    struct timespec ts = {0, (long)ns};
    nanosleep(&ts, NULL);
}

static bool turn_take(pto_scheduler *s)
{
    return !atomic_load_explicit(&s->turn_held, memory_order_relaxed) &&
           !atomic_exchange_explicit(&s->turn_held, true, memory_order_acquire);
}

static void turn_give(pto_scheduler *s) { atomic_store_explicit(&s->turn_held, false, memory_order_release); }

/* A THREAD-mode worker that finished a task with nothing else staged
 * (pto_worker_manager.idle_turn): when the flag is free it takes its own
 * completion in and dispatches what that made ready, often to itself,
 * instead of handing both to the scheduler thread and waiting for them to
 * come back (a 1-D stencil of 4 us tasks with 3 producers each, on 2
 * cores: 49-57% efficient instead of 43-48%). False if another thread
 * holds the flag: the caller wakes the scheduler thread as before. */
static bool worker_turn(void *arg)
{
    pto_scheduler *s = arg;
    if (!turn_take(s)) return false;
    /* Until a turn finds nothing, as the scheduler thread would: a turn's
     * completions make tasks ready that only the next turn dispatches. */
    bool did = false;
    while (pto_sched_turn(s)) did = true;
    turn_give(s);
    return did;
}

/* Whether idle workers should find the turn flag free while its holder
 * waits: THREAD mode, and a kind's recent tasks run long enough for a
 * worker to take its own completion in (PTO_WT_TURN_MIN_NS). By the
 * flag's holder (turn_ns is the turn's). */
static bool lend_turns(const pto_scheduler *s)
{
    const pto_worker_manager *wm = s->wm;
    if (!wm->idle_turn) return false;
    for (int32_t kind = 0; kind < PTO_KINDS; kind++)
        if (wm->count[kind] && wm->turn_ns[kind] >= PTO_WT_TURN_MIN_NS) return true;
    return false;
}

static bool unhelped(void *arg)
{
    pto_scheduler *s = arg;
    return !atomic_load_explicit(&s->helpers, memory_order_relaxed) ||
           !atomic_load_explicit(&s->running, memory_order_relaxed);
}

static void *sched_main(void *arg)
{
    pto_scheduler *s = arg;
    prctl(PR_SET_TIMERSLACK, 1000UL);
    atomic_store_explicit(&s->up, 1, memory_order_release);
    bool held = false;   /* the turn flag, kept from turn to turn while nobody helps */
    int64_t park_ns = SCHED_PARK_MIN_NS;
    while (atomic_load_explicit(&s->running, memory_order_acquire)) {
        if (atomic_load_explicit(&s->helpers, memory_order_relaxed) || (!held && !turn_take(s))) {
            if (held) turn_give(s);
            held = false;
            pto_event_wait(&s->park, unhelped, s, 0, park_ns);
            if (park_ns < SCHED_PARK_MAX_NS) park_ns *= 2;
            continue;
        }
        held = true;
        park_ns = SCHED_PARK_MIN_NS;
        int64_t ns = 0;
        uint64_t posts = s->wm->posts;
        bool did = pto_sched_turn(s);
        /* PROCESS mode: the child just posted to may be waiting for this
         * very core, runnable (its wait spins with sched_yield). While the
         * orchestrator submits, this thread always has more to wire and
         * would keep the core for its whole time slice: a chain of no-op
         * chip tasks ran one ring of 16 tasks per slice, a few hundred of
         * 20,000 during their 15 ms of submits (perf sched: this thread
         * 97% of the core, the child 3%). Yielding after each post hands
         * the core over; when nobody waits for it the call costs well
         * under a microsecond, once per posting turn. */
        if (s->wm->posts != posts) sched_yield();
        if (!did && !sched_has_work(s) && !(ns = nap_ns(s))) {
            if (lend_turns(s)) {   /* idle workers take the turns meanwhile */
                unheld_wait u = {s, seen_now(s)};
                turn_give(s);
                held = false;
                pto_event_wait(s->ev, sched_has_work_unheld, &u, SCHED_SPIN_NS, -1);
            } else {
                pto_event_wait(s->ev, sched_has_work, s, SCHED_SPIN_NS, s->wait_ns);
            }
        }
        if (ns) {   /* a helper may come meanwhile */
            turn_give(s);
            held = false;
            nap(ns);
        }
    }
    if (held) turn_give(s);
    return NULL;
}

/* pto_sched_help's turns, the turn flag held: until done(arg), stop, or
 * idle_ns with nothing to do. Returns whether the scheduler thread should
 * be woken: the help stopped short of done, or lasted long enough that
 * the scheduler thread's park has grown long. */
static bool help_turns(pto_scheduler *s, bool (*done)(void *), void *arg, int64_t idle_ns, const _Atomic bool *stop,
                       bool *finished)
{
    uint64_t since = pto_now_ns(), idle_since = since;
    long slack = -1;   /* this thread's timer slack, once a nap changed it */
    bool again = false;   /* the last turn's completions made tasks ready: the next turn dispatches them */
    for (int i = 1;; i++) {
        if ((*finished = done(arg)) || atomic_load_explicit(stop, memory_order_relaxed)) break;
        int64_t ns;
        bool did = (again || pending(s)) && pto_sched_turn(s);
        again = did && s->ready_len > 0;
        if (did) {
            i = 0;
        } else if ((ns = nap_ns(s)) > 0) {
            /* Naps as short as the scheduler thread's (1 us timer slack,
             * not this thread's default 50), for as long as it helps. */
            if (slack < 0) {
                slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
                if (slack > 1000) prctl(PR_SET_TIMERSLACK, 1000UL);
            }
            nap(ns);
            i = 0;
        } else {
            /* As pto_event_wait spins: with more runnable threads than
             * cores, a worker may need this core to finish what we wait for.
             * The flag is free meanwhile, for a worker's own turn. */
            bool lend = lend_turns(s);
            if (lend) turn_give(s);
            for (int k = lend ? 16 : 1; k > 0; k--) pto_cpu_relax();   /* lent: long enough for a worker to find it */
            if ((i & 15) == 15) sched_yield();
            while (lend && !turn_take(s)) pto_cpu_relax();
        }
        if (i == 0) idle_since = pto_now_ns();
        else if ((i & 15) == 0 && (int64_t)(pto_now_ns() - idle_since) >= idle_ns) break;
    }
    if (slack > 1000) prctl(PR_SET_TIMERSLACK, (unsigned long)slack);
    return !*finished || (int64_t)(pto_now_ns() - since) >= SCHED_HELP_LONG_NS;
}

bool pto_sched_help(pto_scheduler *s, bool (*done)(void *), void *arg, int64_t idle_ns, const _Atomic bool *stop)
{
    bool finished = false, wake = false;
    atomic_fetch_add_explicit(&s->helpers, 1, memory_order_seq_cst);
    pto_event_notify(s->ev);   /* a scheduler asleep in its wait holds the turn */
    bool took = true;
    for (int i = 1; !turn_take(s); i++) {   /* the scheduler thread lets it go at its next look */
        if ((finished = done(arg)) || atomic_load_explicit(stop, memory_order_relaxed)) {
            took = false;   /* the scheduler thread kept the turn: it is awake */
            break;
        }
        pto_cpu_relax();
        if ((i & 3) == 0) sched_yield();   /* it may be waiting for this core */
    }
    if (took) {
        wake = help_turns(s, done, arg, idle_ns, stop, &finished);
        turn_give(s);
    }
    atomic_fetch_sub_explicit(&s->helpers, 1, memory_order_seq_cst);
    s->unhelped_submits = 0;
    if (wake) pto_event_notify(&s->park);
    return finished;
}

bool pto_sched_start(pto_scheduler *s)
{
    /* The submit's wake check then costs a load, not a fence: the
     * scheduler thread pays a membarrier when it goes to sleep instead. */
    (void)pto_event_make_asymmetric(s->ev);
    if (s->wm->mode == PTO_MODE_THREAD) {   /* PROCESS mode's turns pump the children: the scheduler's own */
        s->wm->idle_turn = worker_turn;
        s->wm->idle_ctx = s;
    }
    atomic_store(&s->running, true);
    int rc = pthread_create(&s->thread, NULL, sched_main, s);
    if (rc != 0) {
        atomic_store(&s->running, false);
        pto_set_error("cannot start the scheduler thread: %s", strerror(rc));
        return false;
    }
    s->started = true;
    pto_wait_up(&s->up, 1);
    return true;
}

void pto_sched_stop(pto_scheduler *s)
{
    if (!s->started) return;
    atomic_store_explicit(&s->running, false, memory_order_release);
    pto_event_notify(s->ev);
    pto_event_notify(&s->park);
    pthread_join(s->thread, NULL);
    s->started = false;
}
