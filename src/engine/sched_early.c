/* sched_early.c - early posts (PROCESS mode; PTO_EARLY_POSTS=0 turns them off):
 * which consumer goes to a child before its producers have ended, where,
 * and the task-end words it holds meanwhile (done_words.h). The turn
 * (scheduler.c) stages what pto_early_place picks, finishes early tasks in
 * DAG order (its `deferred` completions) and lets their words go.
 *
 * A dependency between tasks on two children costs, relayed, the parent's
 * collection of the producer's result, its turn, the consumer's post and
 * the child's look at its mailbox: with the parent one of three runnable
 * processes on two cores, a 1-D stencil of 2 us tasks ran at 40-44%
 * efficiency, where children that wait for each other's words reach
 * 87-98% (pto_bench --metg's floors). So a consumer whose unfinished
 * producers are all posted already, each with its task-end word
 * (done_words.h), is posted too, carrying their words: its child waits
 * for them itself and skips the task if one did not succeed. The parent
 * still collects every result and finishes each task in dependency order
 * (a consumer's result that comes back first waits in `deferred`), so
 * profiles, failures and reclamation are as for any task.
 * Only for kinds whose recent tasks take 0.5-50 us (pto_wm_early_kind:
 * below, the parent's own work per task is all there is, and a fan of
 * no-op tasks ran 0.71x with early posts, the waiting children taking the
 * parent's core), onto a worker with little staged (a waiting cell holds
 * its child, and work behind it waits too), not while ready tasks of the
 * kind wait for a worker (they keep the children busy already: the main
 * BGEMM ran 12% slower while its adds went early behind their gemms), for
 * single tasks without a deadline (its clock would run while the cell
 * waits), and not while the gate is shut, failures are caught, the run is
 * interrupted, or check mode or diagnostics watch the task.
 * Deadlock-free: a task waits only for tasks posted before it, and each
 * child runs its cells in order. */
#include "scheduler.h"
#include "dispatch_control.h"
#include "run.h"
#include "slot.h"

#define EARLY_MAX_STOCK_NS 200000

/* Whether ready tasks of c's kind wait for a worker: its children have
 * work until their producers end, and a cell that waited would keep one of
 * them from it (the main BGEMM, whose adds could go early behind their
 * gemms, ran 12% slower in the median while they did). */
static bool kind_backlog(const pto_scheduler *s, const pto_slot *c)
{
    if (s->ready[c->kind].head) return true;
    return c->member0.pin >= 0 && s->wm->threads[c->kind][c->member0.pin]->pinned.head;
}

static bool early_allowed(pto_scheduler *s, const pto_slot *c)
{
    const pto_worker_manager *wm = s->wm;
    return c->group_size == 1 && c->kind >= 0 && wm->count[c->kind] > 0 && !c->poisoned && !c->chained &&
           !kind_backlog(s, c) &&
           !c->timeout_ms && c->fanin_released < c->fanin_count &&
           pto_wm_early_kind(wm, c->kind) &&
           !pto_gate_shut(s) && !atomic_load_explicit(&s->catch_on, memory_order_relaxed) &&
           !atomic_load_explicit(&s->cancel, memory_order_relaxed) &&
           !atomic_load_explicit(&wm->check, memory_order_relaxed) && !(c->run && pto_run_cancelled(c->run)) &&
           !(c->cfg && pto_diag_wanted(&c->cfg->cfg));
}

/* Whether wt may take an early task: room, and little staged ahead of it. */
static bool early_room(const pto_worker_manager *wm, const pto_worker_thread *wt)
{
    return wt->inflight < PTO_WT_QCAP &&
           (wm->early_always || (int64_t)wt->inflight * wm->task_ns[wt->kind] <= EARLY_MAX_STOCK_NS);
}

/* Where early task c goes: its pinned worker, or among the workers of its
 * kind with room and not much more staged than the least loaded of them
 * (2 tasks and half of its), the one that runs most of its producers ps
 * (ties: the less loaded). The producers' child saves the consumer a wait
 * across children, but all eight readers of one producer on its child
 * would leave the other idle. A producer counts only where it, or an early
 * task, was staged last: behind any other task c would wait for that one
 * too, however long it takes, while a sibling may idle.
 * NULL if none has room. */
static pto_worker_thread *early_worker(pto_scheduler *s, const pto_slot *c, pto_slot *const *ps, int32_t n)
{
    pto_worker_manager *wm = s->wm;
    if (c->member0.pin >= 0) {
        pto_worker_thread *wt = wm->threads[c->kind][c->member0.pin];
        return early_room(wm, wt) ? wt : NULL;
    }
    int32_t least = PTO_WT_QCAP;
    for (int32_t w = 0; w < wm->count[c->kind]; w++) {
        const pto_worker_thread *wt = wm->threads[c->kind][w];
        if (early_room(wm, wt) && wt->inflight < least) least = wt->inflight;
    }
    pto_worker_thread *best = NULL;
    int32_t best_votes = -1;
    for (int32_t w = 0; w < wm->count[c->kind]; w++) {
        pto_worker_thread *wt = wm->threads[c->kind][w];
        if (!early_room(wm, wt) || wt->inflight > least + 2 + least / 2) continue;
        int32_t votes = 0;
        for (int32_t k = 0; k < n; k++)
            votes += ps[k]->kind == c->kind && atomic_load_explicit(&ps[k]->worker, memory_order_relaxed) == w &&
                     (wt->last_sent == (uintptr_t)ps[k] || wt->last_sent_early);
        if (votes > best_votes || (votes == best_votes && wt->inflight < best->inflight)) {
            best = wt;
            best_votes = votes;
        }
    }
    return best;
}


pto_worker_thread *pto_early_place(pto_scheduler *s, pto_slot *c)
{
    if (!early_allowed(s, c)) return NULL;
    pto_slot *ps[PTO_DONE_WAITS];
    int32_t n = 0;
    for (int32_t i = 0; i < c->nrefs; i++) {
        if (!c->refs[i].dep) continue;
        pto_slot *p = c->refs[i].slot;
        int32_t st = atomic_load_explicit(&p->state, memory_order_relaxed);
        if (st == PTO_TASK_COMPLETED || st == PTO_TASK_FAILED || st == PTO_TASK_CONSUMED) continue;
        if (!p->done.stamp || n == PTO_DONE_WAITS) return NULL;   /* not posted (or no word): relayed */
        ps[n++] = p;
    }
    if (n != c->fanin_count - c->fanin_released) return NULL;
    pto_worker_thread *wt = early_worker(s, c, ps, n);
    if (!wt) return NULL;
    for (int32_t k = 0; k < n; k++) {
        c->waits[k] = ps[k]->done;
        pto_done_hold(pto_wm_done_words(s->wm, ps[k]->done.child), &ps[k]->done);
    }
    c->nwaits = (int8_t)n;
    c->early = c->chained = true;
    atomic_store_explicit(&s->early_total, atomic_load_explicit(&s->early_total, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    c->ready_by = -1;
    return wt;
}

void pto_early_drop_words(pto_scheduler *s, pto_slot *x, bool settle, bool failed)
{
    pto_worker_manager *wm = s->wm;
    if (atomic_load_explicit(&wm->proc, memory_order_relaxed)) {
        if (x->done.stamp) {
            pto_done_words *d = pto_wm_done_words(wm, x->done.child);
            if (settle && !x->done_said) pto_done_settle(d, &x->done, failed);
            pto_done_release(d, &x->done);
        }
        for (int32_t i = 0; i < x->nwaits; i++) pto_done_release(pto_wm_done_words(wm, x->waits[i].child), &x->waits[i]);
    }
    x->done.stamp = 0;
    x->nwaits = 0;
}
