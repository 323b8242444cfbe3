/* Scheduler: one thread that wires fan-out edges of newly
 * submitted tasks, dispatches ready tasks to workers (in PROCESS mode also
 * into their children's mailboxes, pto_wm_pump), and handles
 * completions (fan-out release, poisoning, reclamation hand-off).
 * Phase order per turn: wiring, dispatch, completion. */
#ifndef PTO_SCHEDULER_H
#define PTO_SCHEDULER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include "event.h"
#include "profile.h"
#include "wire_queue.h"
#include "worker_manager.h"

struct pto_slot;

/* What the orchestrator sleeps for (pto_orch.waiting_for), so that others
 * wake it only then: the scheduler when every task finished, anyone who
 * retires a slot when it waits for reclamation. */
enum { ORCH_WAIT_NONE = 0, ORCH_WAIT_FINISH = 1, ORCH_WAIT_RETIRE = 2 };

typedef struct pto_scheduler {
    pto_worker_manager *wm;
    pthread_t thread;
    bool started;
    _Atomic int32_t up;                     /* 1 once the thread started (pto_wait_up) */
    _Atomic bool running;
    /* Its own MAP_SHARED page: in PROCESS mode the children and the zygote
     * ring it too (a result, a start, a death). */
    pto_event *ev;

    /* orchestrator -> scheduler: submitted, not yet wired (wire_queue.h).
     * Lines of their own: sharing one with the ready queues, which the
     * scheduler writes at every turn, made the orchestrator's hand-off a
     * miss per task (a fifth of the C API's W1 submit in perf). */
    pto_wire_queue wire;
    uint32_t unhelped_submits;              /* orchestrator-only: submits since its last help (pto_sched_help) */
    uint32_t spread_looks;                  /* the turn holder's: looks since pto_wm_spread last ran */
    pto_event park;                         /* the scheduler thread sleeps here while helped */
    _Alignas(64) pto_ready_queue ready[PTO_KINDS];   /* per worker kind, unpinned */
    int64_t ready_len;
    _Atomic int64_t ready_hwm;

    struct pto_slot **work;                 /* finish worklist (poison cascades) */
    int32_t nwork, work_cap;
    /* PROCESS mode: completions of early tasks that came back before those
     * of their producers on other children (scheduler.c, early posts) */
    struct pto_deferred *deferred;
    int32_t ndeferred, deferred_cap;

    /* Reclamation hand-off: retire is called with each slot the turn
     * consumed, then retire_flush once after a batch of them (finish_all),
     * so the check whether the orchestrator waits for them costs one fence
     * per batch, not one per slot. */
    void (*retire)(void *ctx, struct pto_slot *s);
    void (*retire_flush)(void *ctx);
    void *retire_ctx;
    bool retired_any;                       /* retire called since the last flush */
    pto_event *orch_ev;                     /* woken when finished reaches finish_target */
    _Atomic int32_t *orch_waiting;          /* ORCH_WAIT_* of the orchestrator */
    _Atomic int64_t finish_target;

    _Atomic int64_t finished;               /* tasks COMPLETED or FAILED this run */
    _Atomic int64_t early_total;            /* tasks posted early (scheduler.c), since init; the turn's */
    _Atomic int64_t completed_total, failed_total;
    /* Dispatched, not finished (written by the turn's holder only). Beside
     * the other counters the turn writes per task, not on cancel's line:
     * the orchestrator reads cancel at every submit, and sharing its line
     * with a counter written per dispatch made that read a miss (a tenth
     * of submit's own samples in a no-op BGEMM). */
    _Atomic int64_t nrunning;

    pthread_mutex_t fail_mu;
    char *first_failure;                    /* first failed task of the run */

    /* Set by pto_worker_interrupt (a signal handler may call it): tasks not
     * yet dispatched fail instead of running, so the run drains quickly. */
    _Atomic bool cancel;
    /* Bumped by pto_run_cancel: one submitted run's ready tasks fail (run.h). */
    _Atomic uint32_t run_cancels;
    uint32_t run_cancels_seen;              /* scheduler-only */

    /* Dispatch control (the REPL's :hold, :step, :break). The hot path reads
     * only `gated`, false unless dispatch is held or a breakpoint is set;
     * `draining` opens the gate while a drain waits, so a drain never hangs
     * on a hold. */
    _Atomic bool gated, held, draining;
    _Atomic int64_t step_left;              /* tasks a :step may still let through */
    _Atomic int64_t break_task;             /* last task stopped by a breakpoint: it passes next time */
    _Atomic uint64_t quiet_req, quiet_ack;  /* pto_sched_wait_quiet's request and this thread's answer */
    uint64_t quiet_seen;                    /* scheduler-only */
    _Atomic uint64_t sync_req, sync_ack;    /* pto_sched_sync: answered after one whole turn */
    _Atomic uint32_t gate_gen;              /* bumped by every change above: the scheduler wakes to look */
    uint32_t gate_seen;                     /* scheduler-only */
    int64_t wait_ns;                        /* scheduler-only: its next sleep's timeout (PROCESS mode), or -1 */
    /* Stop on failure (the REPL's :catch, :retry): a single task's failure
     * holds dispatch and waits in `caught` (scheduler-only), its consumers
     * not yet poisoned, until a retry or a release (or a drain) decides. */
    _Atomic bool catch_on;
    _Atomic int64_t run_no;                 /* the Worker's run count at the engine run's begin (check mode's messages) */
    _Atomic int64_t retry_req;              /* a task id to run again, -1 when none is asked */
    _Atomic int32_t retry_result;           /* 1: it was caught and runs again, 0: it was not caught, 2: of another kind */
    _Atomic int32_t retry_kind;             /* with retry_req: run it as retry_callable of this kind; -1 any, -2 as it was */
    _Atomic uint64_t retry_callable;
    _Atomic bool release_req;               /* accept the caught failures */
    _Atomic int64_t caught_task;            /* newest caught task, -1 if none */
    struct pto_slot **caught;
    int32_t ncaught, caught_cap;
    pthread_mutex_t gate_mu;                /* breaks */
    struct pto_break *breaks;
    int32_t nbreaks, breaks_cap;

    /* Names of callables for failure messages (pto_worker_callable_name_set);
     * read only on the failure path, under fail_mu. */
    struct pto_callable_name *names;
    int32_t nnames, names_cap;

    pto_profile prof;                       /* written by the turn's holder only (profile.h) */

    /* A turn (wire, dispatch, pump, collect) runs by whoever holds the
     * turn flag: the scheduler thread, which keeps it from turn to turn
     * while it finds work, a thread that waits for the run to drain
     * (pto_sched_help), or in THREAD mode a worker thread that finished a
     * task with nothing else staged (worker_turn), so "scheduler-only"
     * above means the flag's holder. While helpers is non-zero the
     * scheduler thread lets the flag go and sleeps instead of spinning, so
     * a drain on a small machine has one spinner less. In THREAD mode,
     * while tasks run PTO_WT_TURN_MIN_NS or more, the scheduler thread and
     * a helper let the flag go while they wait, so a worker finds it free. */
    _Atomic bool turn_held;
    _Atomic int32_t helpers;
} pto_scheduler;

typedef struct pto_callable_name {
    int32_t kind;
    uint64_t callable;
    char *name;
} pto_callable_name;

typedef struct pto_break {
    int32_t kind;
    uint64_t callable;
} pto_break;

/* false with pto_errmsg set (the event's mapping failed). */
bool pto_sched_init(pto_scheduler *s, pto_worker_manager *wm);
/* ---- early posts (sched_early.c), the turn's ---- */
/* Where c goes early, with its producers' words held and c marked early
 * and chained; NULL (nothing changed) if it is not to go early now. */
struct pto_worker_thread *pto_early_place(pto_scheduler *s, struct pto_slot *c);
/* x is finished here, or its word is void (a caught failure, an early task
 * run again): let go of its task-end word, saying how it ended if its child
 * did not (settle), and of the producers' words it waited for. */
void pto_early_drop_words(pto_scheduler *s, struct pto_slot *x, bool settle, bool failed);

/* Start the scheduler thread (sched_turns.c); false with pto_errmsg set. */
bool pto_sched_start(pto_scheduler *s);
void pto_sched_stop(pto_scheduler *s);
void pto_sched_destroy(pto_scheduler *s);
/* Orchestrator side: hand a new task over for wiring. */
void pto_sched_submit(pto_scheduler *s, struct pto_slot *slot);
/* Take the run's first failure message (caller frees), or NULL. */
char *pto_sched_take_failure(pto_scheduler *s);
/* Remember a display name for (kind, callable); replaces an earlier one. */
void pto_sched_name_callable(pto_scheduler *s, int32_t kind, uint64_t callable, const char *name);

/* Dispatch control (see pto_dispatch_* in pto.h). */
void pto_sched_hold(pto_scheduler *s, bool hold);
/* Run caught task id again, releasing the hold (as callable of kind, or as it was when kind is -2; -1: of the task's own
 * kind): 1, or 0 if it is not a caught failure, 2 if kind is not the task's. */
int pto_sched_retry(pto_scheduler *s, int64_t id, int32_t kind, uint64_t callable);
void pto_sched_step(pto_scheduler *s, int64_t n);
/* Add (on) or remove a breakpoint; remove with callable UINT64_MAX drops all. Returns how many are set. */
int32_t pto_sched_break(pto_scheduler *s, int32_t kind, uint64_t callable, bool on);
/* Orchestrator side: open the gate while a drain waits (on), close it after. */
void pto_sched_draining(pto_scheduler *s, bool on);
/* Wait until nothing runs and nothing more may dispatch; false after timeout_ms. */
bool pto_sched_wait_quiet(pto_scheduler *s, int32_t timeout_ms);
/* Return once the scheduler has wired every task submitted before the call and dispatched what it may. */
void pto_sched_sync(pto_scheduler *s);
/* True when dispatch is held with nothing running: no task can finish until a step or release. */
bool pto_sched_stalled_by_hold(pto_scheduler *s);

/* A thread that waits for the scheduler's work to end (a drain) runs the
 * scheduler's turns itself until done(arg), stop, or idle_ns with nothing
 * to do; the scheduler thread parks meanwhile. True when done(arg). */
bool pto_sched_help(pto_scheduler *s, bool (*done)(void *), void *arg, int64_t idle_ns, const _Atomic bool *stop);
/* One turn (wire, dispatch, pump, collect), by the turn flag's holder only
 * (sched_turns.c decides who that is). True if it did anything. */
bool pto_sched_turn(pto_scheduler *s);

#endif
