#include "worker_manager.h"
#include "common.h"
#include "crash.h"
#include "check.h"
#include "slot.h"
#include "trace.h"
#include "diag.h"
#include "run.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How long an idle worker thread spins before it sleeps (pto_hot_spin):
 * while the orchestrator waits, long enough to bridge the scheduler's
 * turnaround on a busy DAG; while it submits, only long enough to catch a
 * task the scheduler is about to stage. */
#define WT_SPIN_NS 20000
#define WT_COLD_SPIN_NS 2000

void pto_wm_init(pto_worker_manager *wm, int32_t mode, int32_t depth, uint32_t start_timeout_ms)
{
    memset(wm, 0, sizeof *wm);
    wm->mode = mode;
    wm->depth = depth < 1 ? 1 : depth > PTO_WT_QCAP ? PTO_WT_QCAP : depth;
    wm->start_timeout_ms = start_timeout_ms;
    pto_ship_init(&wm->ships);
}

int32_t pto_wm_add(pto_worker_manager *wm, int32_t kind, const pto_leaf *leaf)
{
    assert(pto_kind_valid(kind));
    pto_worker_thread *wt = pto_xcalloc_line(sizeof *wt);
    wt->kind = kind;
    wt->index = wm->count[kind];
    wt->leaf = *leaf;
    wt->call = leaf->run;
    wt->call_ctx = leaf->ctx;
    if (leaf->name) snprintf(wt->name, sizeof wt->name, "%s", leaf->name);
    else snprintf(wt->name, sizeof wt->name, "%s worker %d", kind == PTO_SUB ? "sub" : "next-level", wt->index);
    wt->wm = wm;
    atomic_init(&wt->current_task, -1);
    pto_grow((void **)&wm->threads[kind], &wm->cap[kind], wm->count[kind] + 1, sizeof *wm->threads[kind]);
    wm->threads[kind][wm->count[kind]++] = wt;
    return wt->index;
}

/* A thief takes only from a thread that is running a task: an owner that
 * is idle or waking up takes its own head at once, and a thief that took it
 * instead would leave the owner idle and make the next task wait behind it. */
static bool owner_busy(const pto_worker_thread *q)
{
    return atomic_load_explicit(&q->current_task, memory_order_relaxed) != -1;
}

/* Claim the head entry of qu, one of q's queues, for the calling worker
 * thread: q's own thread takes any entry, a thief (another thread of q's
 * kind) only a stealable one. */
static bool claim_from(pto_worker_thread *q, pto_wt_queue *qu, bool thief, pto_slot **slot, int32_t *member,
                       pto_slot **after, uint32_t *at)
{
    uint32_t h = atomic_load_explicit(&qu->head, memory_order_acquire);
    for (;;) {
        if (h == atomic_load_explicit(&qu->tail, memory_order_acquire)) return false;
        pto_dispatch *e = &qu->e[h & (PTO_WT_QCAP - 1)];
        if (thief && (!atomic_load_explicit(&e->stealable, memory_order_relaxed) || !owner_busy(q))) return false;
        pto_slot *sl = atomic_load_explicit(&e->slot, memory_order_relaxed);
        pto_slot *af = atomic_load_explicit(&e->after, memory_order_relaxed);
        int32_t m = atomic_load_explicit(&e->member, memory_order_relaxed);
        /* PROCESS mode: only the turn's holder claims (its pump), so nobody
         * races for h; a locked CAS here was 3-5% of a chain's turn. In
         * THREAD mode success proves h was unclaimed all along, so the entry
         * was not reused under the reads above (the scheduler never
         * overwrites an unclaimed entry: tail - head <= inflight, and it
         * sends only while inflight < PTO_WT_QCAP). */
        if (q->wm->mode != PTO_MODE_THREAD)
            atomic_store_explicit(&qu->head, h + 1, memory_order_release);
        else if (!atomic_compare_exchange_weak_explicit(&qu->head, &h, h + 1, memory_order_acq_rel,
                                                        memory_order_acquire))
            continue;
        *slot = sl;
        *member = m;
        *after = af;
        *at = h;
        return true;
    }
}

/* The owner takes its pq first: those tasks read what its last tasks
 * wrote. A thief takes from dq first: a pq task is better run late here
 * than never while the owner is busy, but a dq task loses nothing. */
static bool claim_at(pto_worker_thread *q, bool thief, pto_slot **slot, int32_t *member, pto_slot **after,
                     const pto_wt_queue **from, uint32_t *at)
{
    pto_wt_queue *first = thief ? &q->dq : &q->pq, *second = thief ? &q->pq : &q->dq;
    *from = first;
    if (claim_from(q, first, thief, slot, member, after, at)) return true;
    *from = second;
    return claim_from(q, second, thief, slot, member, after, at);
}

static bool claim(pto_worker_thread *q, bool thief, pto_slot **slot, int32_t *member, pto_slot **after)
{
    const pto_wt_queue *from;
    uint32_t at;
    return claim_at(q, thief, slot, member, after, &from, &at);
}

/* How far the owner's two queues reached at one instant: whether a task it
 * claims later was staged by then (queue_mark_has). */
typedef struct queue_mark {
    uint32_t pq, dq;
} queue_mark;

static queue_mark queue_mark_now(const pto_worker_thread *wt)
{
    return (queue_mark){atomic_load_explicit(&wt->pq.tail, memory_order_acquire),
                        atomic_load_explicit(&wt->dq.tail, memory_order_acquire)};
}

static bool queue_mark_has(const queue_mark *m, const pto_worker_thread *wt, const pto_wt_queue *from, uint32_t at)
{
    return (int32_t)((from == &wt->pq ? m->pq : m->dq) - at) > 0;
}

static bool stealable_head(const pto_worker_thread *q, const pto_wt_queue *qu)
{
    uint32_t h = atomic_load_explicit(&qu->head, memory_order_acquire);
    return h != atomic_load_explicit(&qu->tail, memory_order_acquire) &&
           atomic_load_explicit(&qu->e[h & (PTO_WT_QCAP - 1)].stealable, memory_order_relaxed) && owner_busy(q);
}

static bool can_steal_from(const pto_worker_thread *q)
{
    return stealable_head(q, &q->dq) || stealable_head(q, &q->pq);
}

/* Tasks staged on wt and not yet claimed, in both its queues. */
static uint32_t unclaimed(const pto_worker_thread *wt)
{
    return atomic_load_explicit(&wt->dq.tail, memory_order_acquire) -
           atomic_load_explicit(&wt->dq.head, memory_order_relaxed) +
           atomic_load_explicit(&wt->pq.tail, memory_order_acquire) -
           atomic_load_explicit(&wt->pq.head, memory_order_relaxed);
}

/* An idle worker thread takes a task staged on a busy one of its kind, so a
 * deep queue behind a long task never waits while this thread idles. */
static pto_worker_thread *steal(pto_worker_thread *wt, bool probe, pto_slot **slot, int32_t *member,
                                 pto_slot **after)
{
    pto_worker_manager *wm = wt->wm;
    int32_t n = wm->count[wt->kind];
    if (atomic_load_explicit(&wt->cq_tail, memory_order_relaxed) -
            atomic_load_explicit(&wt->cq_head, memory_order_acquire) >= PTO_WT_QCAP)
        return NULL;   /* keeps the completion ring from overflowing (PTO_WT_CQCAP) */
    for (int32_t k = 1; k < n; k++) {
        pto_worker_thread *q = wm->threads[wt->kind][(wt->index + k) % n];
        if (probe ? can_steal_from(q) : claim(q, true, slot, member, after)) return q;
    }
    return NULL;
}

static bool wt_has_work(void *arg)
{
    pto_worker_thread *wt = arg;
    return unclaimed(wt) || atomic_load_explicit(&wt->wm->stopping, memory_order_acquire) ||
           steal(wt, true, NULL, NULL, NULL);
}

/* s, staged or handed to a child, must not run: staged before an interrupt
 * (an interrupted run drains without running what is queued, however deep
 * the queues are), or its submitted run was cancelled (the scheduler gives
 * it the run's message; looked at only once some run was). Group members
 * run on. */
static bool cancelled(const pto_worker_thread *wt, const pto_slot *s)
{
    if (s->group_size != 1) return false;
    if (atomic_load_explicit(wt->wm->cancel, memory_order_relaxed)) return true;
    return PTO_UNLIKELY(atomic_load_explicit(wt->wm->run_cancels, memory_order_relaxed)) && s->run &&
           pto_run_cancelled(s->run);
}

/* A task that must not run: its group failed, the task it is chained
 * behind did not succeed, or it is cancelled. -1: run it. */
static int32_t skip_status(const pto_worker_thread *wt, pto_slot *s, pto_slot *after)
{
    if (s->group_size > 1 && atomic_load_explicit(&s->group_failed, memory_order_acquire)) return PTO_DONE_SKIPPED;
    /* `after` was staged before s here, and neither could be stolen: it ran
     * on this worker already, which knows its outcome before the scheduler
     * does. */
    if (after && !atomic_load_explicit(&after->ran_ok, memory_order_relaxed)) return PTO_DONE_UNRUN;
    if (cancelled(wt, s)) return PTO_DONE_CANCELLED;
    return -1;
}

static void complete(pto_worker_thread *wt, pto_completion c)
{
    /* Only what its leaf ran: a task skipped here (interrupted, cancelled, a producer failed) did not run.
     * One writer, the completion queue's producer: a load and a store, not
     * a locked add, which would wait for every store before it. */
    if (c.status == PTO_DONE_OK || c.status == PTO_DONE_FAILED)
        atomic_store_explicit(&wt->tasks_run, atomic_load_explicit(&wt->tasks_run, memory_order_relaxed) + 1,
                              memory_order_relaxed);
    uint32_t t = atomic_load_explicit(&wt->cq_tail, memory_order_relaxed);
    wt->cq[t & (PTO_WT_CQCAP - 1)] = c;
    atomic_store_explicit(&wt->cq_tail, t + 1, memory_order_release);
}

/* The leaf ran (rc) from t0 to t1: account for it, trace it, report it. */
static void ran(pto_worker_thread *wt, pto_completion *c, uint64_t t0, uint64_t t1, int rc, const char *err)
{
    pto_slot *s = c->slot;
    atomic_store_explicit(&wt->current_task, -1, memory_order_relaxed);
    c->t0 = t0;
    c->t1 = t1;
    pto_trace *tr = pto_trace_on(&wt->wm->trace);
    if (tr && t0) pto_trace_task(tr, wt, s, c->member, t0, t1, rc);   /* before the completion: ends precede consumers */
    if (rc != 0) {
        c->status = PTO_DONE_FAILED;
        c->error = err[0] ? pto_xstrdup(err) : pto_xasprintf("the leaf returned %d", rc);
        return;
    }
    if (s->group_size == 1) atomic_store_explicit(&s->ran_ok, true, memory_order_relaxed);
    /* Check mode's warnings ride on a successful completion: the scheduler prints them. */
    if (PTO_UNLIKELY(err[0]) && atomic_load_explicit(&wt->wm->check, memory_order_relaxed)) c->error = pto_xstrdup(err);
}

static void started(pto_worker_thread *wt, pto_slot *s, int32_t member, uint64_t now)
{
    atomic_store_explicit(&wt->task_started_ns, now, memory_order_relaxed);
    atomic_store_explicit(&wt->current_task, s->id, memory_order_relaxed);
    /* Here, not at dispatch: an idle worker may have stolen the task. */
    if (member == 0) atomic_store_explicit(&s->worker, wt->index, memory_order_relaxed);
}

/* The running task's tags, for the leaves that move bytes by them (pto_leaf_tags). */
static _Thread_local const uint8_t *leaf_tags;

const uint8_t *pto_leaf_tags(void) { return leaf_tags; }

/* THREAD mode with diagnostics asked for: the leaf call wrapped by diag.c. */
static int wt_diag_call(pto_worker_thread *wt, pto_slot *s, int32_t member, const pto_args_view *v, char *err,
                        size_t errlen)
{
    pto_diag_task d;
    pto_diag_prepare(&d, wt->wm, s, member, wt->index);
    const uint8_t *tags = atomic_load_explicit(&wt->wm->check, memory_order_relaxed) ? pto_check_tags_of(s) : NULL;
    pto_check_leaf cl = {wt->call, wt->call_ctx, tags, NULL,
                         atomic_load_explicit(&wt->wm->check, memory_order_relaxed) == PTO_CHECK_WARN};
    int rc = tags ? pto_diag_call(pto_check_leaf_run, &cl, s->callable, v, &s->cfg->cfg, &d, err, errlen)
                  : pto_diag_call(wt->call, wt->call_ctx, s->callable, v, &s->cfg->cfg, &d, err, errlen);
    pto_diag_finish(wt->wm, s, &d);
    return rc;
}

/* Run one task. t0: when it starts, or 0 to read the clock. Returns the
 * clock read at its end if, just before that read, tasks staged here were
 * waiting (their position then in *mark): the next of them may start at
 * that reading, as it was ready before it; 0 otherwise. */
static uint64_t wt_run_one(pto_worker_thread *wt, pto_slot *s, int32_t member, pto_slot *after,
                           pto_worker_thread *origin, uint64_t t0, queue_mark *mark)
{
    uint64_t carry = 0;
    pto_completion c = {.slot = s, .origin = origin, .member = member, .status = PTO_DONE_OK, .error = NULL};
    int32_t skip = skip_status(wt, s, after);
    if (skip >= 0) {
        c.status = skip;
    } else {
        const pto_member *m = &s->members[member];
        pto_args_view v = {m->tensor_count, m->scalar_count, m->tensors, m->scalars};
        char err[PTO_MB_ERR_CAP];
        err[0] = 0;
        /* The precise clock, always: the run profile (profile.h) keeps every task's times. */
        if (!t0) t0 = pto_now_ns();
        started(wt, s, member, t0);
        leaf_tags = m->tags;
        pto_crash_current(wt, s);   /* crash.c: last words if the task takes the process down */
        const pto_call_config *cfg = &s->cfg->cfg;
        int rc = PTO_UNLIKELY(pto_diag_wanted(cfg)) ? wt_diag_call(wt, s, member, &v, err, sizeof err)
                 : PTO_UNLIKELY(atomic_load_explicit(&wt->wm->check, memory_order_relaxed))
                     ? pto_check_call(wt->call, wt->call_ctx, s->callable, &v, pto_check_tags_of(s), cfg, err, sizeof err, NULL,
                                      atomic_load_explicit(&wt->wm->check, memory_order_relaxed) == PTO_CHECK_WARN)
                     : wt->call(wt->call_ctx, s->callable, &v, cfg, err, sizeof err);
        pto_crash_current(wt, NULL);
        leaf_tags = NULL;
        /* A task already staged here when this one ends starts at this
         * end's clock read instead of its own: in a flood of short tasks
         * the two reads were a quarter to a third of a worker's time (23
         * ns each on this VM). Staged before the read, it was ready before
         * it, so its start still follows its producers' ends in the
         * profile. */
        bool more = false;
        if (mark) {
            *mark = queue_mark_now(wt);
            more = mark->pq != atomic_load_explicit(&wt->pq.head, memory_order_relaxed) ||
                   mark->dq != atomic_load_explicit(&wt->dq.head, memory_order_relaxed);
        }
        uint64_t t1 = pto_now_ns();
        if (more) carry = t1;
        ran(wt, &c, t0, t1, rc, err);
    }
    complete(wt, c);
    /* With nothing staged here, after tasks long enough that the hand-off
     * to the scheduler thread and back would cost more than the turn's
     * state moving to this core, this thread takes the completion in (and
     * dispatches the next ready task) itself. Two in a row: a short task
     * preempted midway looks long once. */
    pto_worker_manager *wm = wt->wm;
    wt->long_runs = c.t1 - c.t0 < PTO_WT_TURN_MIN_NS ? 0 : wt->long_runs < 2 ? wt->long_runs + 1 : 2;
    if (!(wm->idle_turn && wt->long_runs >= 2 && !unclaimed(wt) && wm->idle_turn(wm->idle_ctx)))
        pto_event_notify_light(wm->sched_ev);   /* this thread is of the scheduler's process */
    return carry;
}

/* ---- THREAD mode, a leaf that overlaps its tasks (leaf.begin: a Worker
 * child, whose tasks are submitted runs) ----
 * The thread begins every task it can claim, up to PTO_LEAF_MAX_BEGUN at once as
 * a child process would, and ends them in order. A task chained behind one
 * staged before it here (after), or one run under check mode or
 * diagnostics, waits until nothing is begun and runs as with any leaf. */

typedef struct wt_begun {
    pto_slot *slot;
    int32_t member;
    pto_worker_thread *origin;
    void *token;
    uint64_t t0;
} wt_begun;

typedef struct wt_overlap {
    pto_worker_thread *wt;
    wt_begun q[PTO_LEAF_MAX_BEGUN];
    uint32_t head, len;
} wt_overlap;

static bool overlap_has_work(void *p)
{
    wt_overlap *o = p;
    const pto_leaf *leaf = &o->wt->leaf;
    return (o->len < PTO_LEAF_MAX_BEGUN && wt_has_work(o->wt)) ||
           atomic_load_explicit(&o->wt->wm->stopping, memory_order_acquire) ||
           (o->len && leaf->ready(leaf->ctx, o->q[o->head].token));
}

static void wake_thread(void *wt) { pto_event_notify(&((pto_worker_thread *)wt)->ev); }

/* Task c ended (or never began): the oldest still begun is the one running
 * now, and the scheduler hears of c. */
static void overlap_done(wt_overlap *o, pto_completion c)
{
    pto_worker_thread *wt = o->wt;
    if (o->len) started(wt, o->q[o->head].slot, o->q[o->head].member, o->q[o->head].t0);
    complete(wt, c);
    pto_event_notify_light(wt->wm->sched_ev);
}

/* Begin s, or finish it at once if it must not run or its begin failed. */
static void overlap_begin(wt_overlap *o, pto_slot *s, int32_t member, pto_worker_thread *origin)
{
    pto_worker_thread *wt = o->wt;
    pto_completion c = {.slot = s, .origin = origin, .member = member, .status = PTO_DONE_OK, .error = NULL};
    int32_t skip = skip_status(wt, s, NULL);
    if (skip >= 0) {
        c.status = skip;
        overlap_done(o, c);
        return;
    }
    const pto_member *m = &s->members[member];
    pto_args_view v = {m->tensor_count, m->scalar_count, m->tensors, m->scalars};
    char err[PTO_MB_ERR_CAP];
    err[0] = 0;
    uint64_t t0 = pto_now_ns();
    if (!o->len) started(wt, s, member, t0);
    else if (member == 0) atomic_store_explicit(&s->worker, wt->index, memory_order_relaxed);
    void *token = NULL;
    leaf_tags = m->tags;
    pto_crash_current(wt, s);
    int rc = wt->leaf.begin(wt->leaf.ctx, s->callable, &v, &s->cfg->cfg, wake_thread, wt, &token, err, sizeof err);
    pto_crash_current(wt, NULL);
    leaf_tags = NULL;
    if (rc != 0) {
        ran(wt, &c, t0, pto_now_ns(), rc, err);
        overlap_done(o, c);
        return;
    }
    o->q[(o->head + o->len++) % PTO_LEAF_MAX_BEGUN] = (wt_begun){s, member, origin, token, t0};
}

/* End the oldest begun task (waiting for it if need be). */
static void overlap_end(wt_overlap *o)
{
    pto_worker_thread *wt = o->wt;
    wt_begun b = o->q[o->head];
    o->head = (o->head + 1) % PTO_LEAF_MAX_BEGUN;
    o->len--;
    pto_completion c = {.slot = b.slot, .origin = b.origin, .member = b.member, .status = PTO_DONE_OK, .error = NULL};
    char err[PTO_MB_ERR_CAP];
    err[0] = 0;
    pto_crash_current(wt, b.slot);
    int rc = wt->leaf.end(wt->leaf.ctx, b.token, err, sizeof err);
    pto_crash_current(wt, NULL);
    ran(wt, &c, b.t0, pto_now_ns(), rc, err);
    overlap_done(o, c);
}

static bool runs_alone_here(const pto_worker_thread *wt, const pto_slot *s, const pto_slot *after)
{
    return after || PTO_UNLIKELY(atomic_load_explicit(&wt->wm->check, memory_order_relaxed)) ||
           PTO_UNLIKELY(pto_diag_wanted(&s->cfg->cfg));
}

static void wt_overlap_loop(pto_worker_thread *wt)
{
    wt_overlap o = {.wt = wt};
    for (;;) {
        if (atomic_load_explicit(&wt->wm->stopping, memory_order_acquire)) {
            while (o.len) overlap_end(&o);
            return;
        }
        pto_slot *slot, *after;
        int32_t member;
        pto_worker_thread *origin;
        while (o.len < PTO_LEAF_MAX_BEGUN) {
            if (claim(wt, false, &slot, &member, &after)) origin = wt;
            else if (!(origin = steal(wt, false, &slot, &member, &after))) break;
            if (!runs_alone_here(wt, slot, after)) {
                overlap_begin(&o, slot, member, origin);
                continue;
            }
            while (o.len) overlap_end(&o);
            wt_run_one(wt, slot, member, after, origin, 0, NULL);
        }
        if (o.len && wt->leaf.ready(wt->leaf.ctx, o.q[o.head].token)) {
            overlap_end(&o);
            continue;
        }
        pto_event_wait(&wt->ev, overlap_has_work, &o, pto_hot_spin(WT_SPIN_NS, WT_COLD_SPIN_NS, &wt->wm->hot_until_ns), -1);
    }
}

static void *wt_main(void *arg)
{
    pto_worker_thread *wt = arg;
    atomic_fetch_add_explicit(&wt->wm->up, 1, memory_order_release);
    if (wt->leaf.begin && wt->leaf.ready && wt->leaf.end) {
        wt_overlap_loop(wt);
        return NULL;
    }
    for (;;) {
        pto_event_wait(&wt->ev, wt_has_work, wt, pto_hot_spin(WT_SPIN_NS, WT_COLD_SPIN_NS, &wt->wm->hot_until_ns), -1);
        if (atomic_load_explicit(&wt->wm->stopping, memory_order_acquire)) break;
        pto_slot *slot, *after;
        int32_t member;
        pto_worker_thread *origin;
        uint64_t next_t0 = 0;   /* wt_run_one's carry */
        queue_mark mark;
        for (;;) {
            const pto_wt_queue *from;
            uint32_t at;
            uint64_t t0 = 0;
            if (claim_at(wt, false, &slot, &member, &after, &from, &at)) {
                origin = wt;
                if (next_t0 && queue_mark_has(&mark, wt, from, at)) t0 = next_t0;
            } else if (!(origin = steal(wt, false, &slot, &member, &after))) {
                break;
            }
            next_t0 = wt_run_one(wt, slot, member, after, origin, t0, &mark);
        }
    }
    return NULL;
}

/* ---- PROCESS mode: the scheduler drives the children ----
 * Each child has a FIFO of claimed tasks (wt->staged), mirrored by the
 * cells of its mailbox: the scheduler keeps up to post_cap() of them
 * posted, so the child goes from one task to the next without waiting for
 * the scheduler, which collects results whenever it runs. */

uint32_t pto_wm_unbegun(const pto_worker_thread *wt)
{
    if (wt->wm->mode == PTO_MODE_THREAD)
        return unclaimed(wt);
    return wt->child ? pto_proc_unbegun(wt->child) : 0;
}

/* Cells to keep posted to wt's child: PTO_WM_STOCK_NS of work at its
 * kind's recent mean task time, at least PTO_WM_MIN_POSTED (also while that
 * time is unknown), at most PTO_WM_MAX_POSTED; a chain goes on past it
 * (chained_next). */
static uint32_t post_cap(const pto_worker_thread *wt)
{
    int64_t t = wt->wm->task_ns[wt->kind];
    if (t <= 0 || t >= PTO_WM_STOCK_NS / PTO_WM_MIN_POSTED) return PTO_WM_MIN_POSTED;
    int64_t n = PTO_WM_STOCK_NS / t;
    return n >= PTO_WM_MAX_POSTED ? PTO_WM_MAX_POSTED : (uint32_t)n;
}

static pto_staged *staged_at(pto_worker_thread *wt, uint32_t i)
{
    return &wt->staged[(wt->staged_head + i) & (PTO_MB_CELLS - 1)];
}

/* Whether the task to post after the first i (i > 0) is chained behind the
 * i-th: staged already, or at the head of wt's own queues, where
 * pump_claim takes it (only the turn's holder claims in PROCESS mode). */
static bool chained_next(pto_worker_thread *wt, uint32_t i)
{
    const pto_slot *prev = staged_at(wt, i - 1)->slot;
    if (i < wt->staged_len) return staged_at(wt, i)->after == prev;
    const pto_wt_queue *qs[2] = {&wt->pq, &wt->dq};   /* claim's order */
    for (int q = 0; q < 2; q++) {
        uint32_t h = atomic_load_explicit(&qs[q]->head, memory_order_relaxed);
        if (h != atomic_load_explicit(&qs[q]->tail, memory_order_acquire))
            return atomic_load_explicit(&qs[q]->e[h & (PTO_WT_QCAP - 1)].after, memory_order_relaxed) == prev;
    }
    return false;
}

/* Whether a task may go into wt's child's cell after the first i posted,
 * cap being post_cap(): the one rule pump_post follows and
 * pto_wm_pump_ready predicts. */
static bool may_post(pto_worker_thread *wt, uint32_t i, uint32_t cap)
{
    return i < PTO_MB_CELLS && (i < cap || chained_next(wt, i));
}

/* Claim one more task for wt's child: its own queue's head, or a stealable
 * one behind a busy child of its kind. */
static bool pump_claim(pto_worker_thread *wt)
{
    pto_staged e;
    if (claim(wt, false, &e.slot, &e.member, &e.after)) e.origin = wt;
    else if (!(e.origin = steal(wt, false, &e.slot, &e.member, &e.after))) return false;
    *staged_at(wt, wt->staged_len++) = e;
    return true;
}

/* Drop entry i (not posted) from wt's FIFO, keeping the order of the rest. */
static void staged_drop(pto_worker_thread *wt, uint32_t i)
{
    for (; i + 1 < wt->staged_len; i++) *staged_at(wt, i) = *staged_at(wt, i + 1);
    wt->staged_len--;
}

static void staged_pop(pto_worker_thread *wt)
{
    wt->staged_head = (wt->staged_head + 1) & (PTO_MB_CELLS - 1);
    wt->staged_len--;
    wt->staged_posted--;
    if (!wt->staged_posted) wt->staged_alone = false;
}

/* A task whose child-side state lives in the mailbox once (check mode's
 * tags, diagnostics): it is posted into an empty ring, and nothing after it
 * until it is collected. */
static bool runs_alone(pto_worker_thread *wt, const pto_slot *s)
{
    return PTO_UNLIKELY(atomic_load_explicit(&wt->wm->check, memory_order_relaxed) | wt->child->mb->check) ||
           PTO_UNLIKELY(pto_diag_wanted(&s->cfg->cfg));
}

/* The oldest posted task ended (r), or was lost with its child (r->lost). */
static void pump_finish(pto_worker_thread *wt, const pto_proc_result *r, const char *err)
{
    pto_staged *e = staged_at(wt, 0);
    pto_completion c = {.slot = e->slot, .origin = e->origin, .member = e->member, .status = PTO_DONE_OK};
    if (r->skipped) {
        /* Its producer, collected just before it, did not succeed. */
        int32_t skip = skip_status(wt, e->slot, e->after);
        c.status = skip >= 0 ? skip : PTO_DONE_UNRUN;
        atomic_store_explicit(&wt->current_task, -1, memory_order_relaxed);
    } else {
        if (PTO_UNLIKELY(pto_diag_wanted(&e->slot->cfg->cfg))) pto_diag_finish(wt->wm, e->slot, &wt->child->mb->diag);
        /* The span starts when the child began it, or earlier when the task
         * became the oldest posted (its post, the end of the one before)
         * and that time is exact: a hand-off belongs to its task, and the
         * ring's waiting does not. */
        uint64_t t0 = r->t0, t1 = r->t1, head = atomic_load_explicit(&wt->task_started_ns, memory_order_relaxed);
        /* Not an early task's: it was waiting for its producers meanwhile. */
        if (!t0 || (wt->head_exact && head < t0 && !e->slot->early)) t0 = head;
        if (t1 < t0) t1 = pto_now_ns();
        ran(wt, &c, t0, t1, r->rc, err);
    }
    complete(wt, c);
    staged_pop(wt);
    if (wt->staged_posted) {
        started(wt, staged_at(wt, 0)->slot, staged_at(wt, 0)->member, r->t1 ? r->t1 : pto_now_ns());
        wt->head_exact = true;
    }
}

/* When the oldest posted task s runs out of time. Its clock starts when
 * the child began it or, if the child has not (a stopped child never
 * will), when it became the oldest: a task waiting behind others in the
 * ring is not yet late. */
static uint64_t head_due(pto_worker_thread *wt, const pto_slot *s)
{
    uint64_t t0 = pto_proc_head_started(wt->child);
    if (!t0) t0 = atomic_load_explicit(&wt->task_started_ns, memory_order_relaxed);
    return t0 + (uint64_t)s->timeout_ms * 1000000ull;
}

/* Interrupted, or a submitted run cancelled: what wt's child has been
 * handed of it but not begun comes back skipped (pump_finish makes it
 * cancelled) instead of running. */
static void revoke_posted(pto_worker_thread *wt)
{
    /* A cell begun or revoked already fails the CAS: no harm done. */
    for (uint32_t k = 0; k < wt->staged_posted; k++)
        if (cancelled(wt, staged_at(wt, k)->slot)) pto_proc_revoke(wt->child, k);
}

/* Collect what wt's child finished; true if anything moved. */
static bool pump_collect(pto_worker_thread *wt, bool check_zygote)
{
    pto_child *ch = wt->child;
    char err[PTO_MB_ERR_CAP];
    bool moved = false;
    while (wt->staged_posted) {
        pto_proc_result r = {0};
        err[0] = 0;
        int k = pto_proc_poll(ch, check_zygote, &r, err, sizeof err);
        if (k == PTO_PROC_RUNNING) {
            uint32_t rc = atomic_load_explicit(wt->wm->run_cancels, memory_order_relaxed);
            if (PTO_UNLIKELY(atomic_load_explicit(wt->wm->cancel, memory_order_relaxed) || rc != wt->run_cancels_seen)) {
                wt->run_cancels_seen = rc;
                revoke_posted(wt);
            }
            const pto_slot *s = staged_at(wt, 0)->slot;
            if (PTO_UNLIKELY(s->timeout_ms) && !ch->timed_out_ms) {
                /* Its death, which the bell reports, ends the task. */
                if (pto_now_ns() >= head_due(wt, s)) pto_proc_timeout(ch, s->timeout_ms);
            }
            return moved;
        }
        moved = true;
        if (k == PTO_PROC_DONE) {
            pto_slot *s0 = staged_at(wt, 0)->slot;
            /* The child wrote its word before its result. */
            if (s0->done.stamp) s0->done_said = true;
            pump_finish(wt, &r, err);
            continue;
        }
        /* Lost with its child: the tasks it had begun fail; the others were
         * never begun and are posted again, to the replacement. */
        for (uint32_t k = 0; r.lost && k < (r.begun ? r.begun : 1) && wt->staged_posted; k++) pump_finish(wt, &r, err);
        wt->staged_posted = 0;
        wt->staged_alone = false;
        atomic_store_explicit(&wt->current_task, -1, memory_order_relaxed);
    }
    return moved;
}

pto_done_words *pto_wm_done_words(pto_worker_manager *wm, int32_t child)
{
    return &pto_proc_child(atomic_load_explicit(&wm->proc, memory_order_relaxed), child)->done;
}

/* s's word (taken at its first post and kept for a repost to a replacement
 * child, so whoever waits for it is answered by that one) and, if it is
 * early, the producers' words it waits for. */
static pto_mb_deps *post_deps(pto_worker_thread *wt, pto_slot *s, pto_mb_deps *d)
{
    if (!s->done.stamp) (void)pto_done_take(&wt->child->done, wt->child->slot, &wt->wm->done_stamps, &s->done);
    s->done_said = false;
    d->own = s->done;
    d->nwaits = s->early ? (uint32_t)s->nwaits : 0;
    for (uint32_t i = 0; i < d->nwaits; i++) d->waits[i] = s->waits[i];
    return d;
}

static void posted_now(pto_worker_manager *wm, pto_slot *s)
{
    pto_grow((void **)&wm->posted_now, &wm->posted_now_cap, wm->nposted_now + 1, sizeof *wm->posted_now);
    wm->posted_now[wm->nposted_now++] = s;
}

/* Post what fits into wt's child's cells; true if anything moved. */
static bool pump_post(pto_worker_thread *wt)
{
    pto_child *ch = wt->child;
    char err[PTO_MB_ERR_CAP];
    bool moved = false;
    uint32_t cap = post_cap(wt);
    pto_proc_batch(ch, true);
    while (!wt->staged_alone && !ch->timed_out_ms && may_post(wt, wt->staged_posted, cap)) {
        uint32_t i = wt->staged_posted;
        if (i == wt->staged_len && !pump_claim(wt)) break;
        pto_staged *e = staged_at(wt, i);
        pto_slot *s = e->slot;
        /* Where its producer is: collected (its outcome known here), the
         * cell just before it (the child knows first), or further up. */
        int32_t at = -1;
        for (uint32_t k = 0; e->after && k < i; k++)
            if (staged_at(wt, k)->slot == e->after) at = (int32_t)k;
        if (at >= 0 && at != (int32_t)i - 1) break;
        int32_t skip = skip_status(wt, s, at >= 0 ? NULL : e->after);
        if (skip >= 0) {
            complete(wt, (pto_completion){.slot = s, .origin = e->origin, .member = e->member, .status = skip});
            staged_drop(wt, i);
            moved = true;
            continue;
        }
        bool alone = runs_alone(wt, s);
        if (alone && i > 0) break;
        const pto_member *m = &s->members[e->member];
        pto_args_view v = {m->tensor_count, m->scalar_count, m->tensors, m->scalars};
        if (PTO_UNLIKELY(alone)) {
            if (atomic_load_explicit(&wt->wm->check, memory_order_relaxed) | ch->mb->check)
                pto_check_stage(ch->mb, wt->wm, pto_check_tags_of(s), m->tensor_count);
            if (pto_diag_wanted(&s->cfg->cfg)) pto_diag_prepare(&ch->mb->diag, wt->wm, s, e->member, wt->index);
        }
        err[0] = 0;
        /* Before the post: the child may start (and trace) at once. The
         * precise clock only where a span or a deadline needs it (~20 ns). */
        bool exact = s->timeout_ms || pto_trace_on(&wt->wm->trace) || PTO_UNLIKELY(alone);
        uint64_t now = exact ? pto_now_ns() : pto_now_coarse_ns();
        /* The head is the running task before the post, which an idle
         * child takes at once: whoever sees the child running it (a
         * child-info query) sees it as the worker's current task. */
        if (i == 0) {
            started(wt, s, e->member, now);
            wt->head_exact = exact;
        }
        pto_mb_deps deps, *dp = NULL;
        /* A word only where a consumer may wait for it: a task of a kind
         * whose tasks are posted early now, or one kept from a first post;
         * and an early task's waits, whatever its kind's times are now. */
        if (wt->wm->early && s->group_size == 1 && (pto_wm_early_kind(wt->wm, s->kind) || s->early || s->done.stamp))
            dp = post_deps(wt, s, &deps);
        int r = pto_proc_try_post(ch, s->callable, &v, &s->cfg->cfg, at >= 0, dp, err, sizeof err);
        if (r != 0 && i == 0) atomic_store_explicit(&wt->current_task, -1, memory_order_relaxed);
        if (r > 0) break;   /* its child is starting: the bell rings when it is up */
        moved = true;
        if (r < 0) {
            pto_completion c = {.slot = s, .origin = e->origin, .member = e->member, .status = PTO_DONE_OK};
            ran(wt, &c, 0, 0, 1, err);
            complete(wt, c);
            staged_drop(wt, i);
            continue;
        }
        if (i > 0 && e->member == 0) atomic_store_explicit(&s->worker, wt->index, memory_order_relaxed);
        if (dp && s->done.stamp && s->nconsumers) posted_now(wt->wm, s);
        wt->staged_posted++;
        wt->wm->posts++;
        wt->staged_alone = alone;
    }
    pto_proc_batch(ch, false);
    return moved;
}

static bool pump_one(pto_worker_thread *wt, bool check_zygote)
{
    bool moved = pto_proc_tick(wt->child);
    moved |= pump_collect(wt, check_zygote);
    moved |= pump_post(wt);
    return moved;
}

bool pto_wm_pump(pto_worker_manager *wm)
{
    if (!atomic_load_explicit(&wm->proc, memory_order_relaxed)) return false;
    uint64_t now = pto_now_coarse_ns();   /* a 50 ms tick: a few ms late is fine */
    bool check = now - wm->zygote_checked_ns >= (uint64_t)PTO_PROC_TICK_NS;
    if (check) wm->zygote_checked_ns = now;
    bool moved = false;
    for (int k = 0; k < PTO_KINDS; k++)
        for (int32_t i = 0; i < wm->count[k]; i++) moved |= pump_one(wm->threads[k][i], check);
    return moved;
}

bool pto_wm_pump_ready(pto_worker_manager *wm, int64_t *timeout_ns)
{
    if (!atomic_load_explicit(&wm->proc, memory_order_relaxed)) return false;
    for (int k = 0; k < PTO_KINDS; k++)
        for (int32_t i = 0; i < wm->count[k]; i++) {
            pto_worker_thread *wt = wm->threads[k][i];
            pto_child *ch = wt->child;
            uint32_t st = pto_mb_state(ch->mb);
            if (wt->staged_len || ch->replacing || st == PTO_MB_STARTING) {
                if (*timeout_ns < 0 || *timeout_ns > PTO_PROC_TICK_NS) *timeout_ns = PTO_PROC_TICK_NS;
            }
            if (wt->staged_posted) {
                if (st != PTO_MB_IDLE || pto_mb_done_beyond(ch->mb, ch->collected) != 0) return true;
                /* The pump looks at a timeout: come back when it is due. */
                const pto_slot *s = staged_at(wt, 0)->slot;
                if (PTO_UNLIKELY(s->timeout_ms) && !ch->timed_out_ms) {
                    uint64_t due = head_due(wt, s), now = pto_now_ns();
                    int64_t left = due > now ? (int64_t)(due - now) : 0;
                    if (*timeout_ns < 0 || *timeout_ns > left) *timeout_ns = left;
                }
            }
            if (wt->staged_posted < wt->staged_len || ch->replacing) {
                if (!wt->staged_alone && pto_proc_actionable(ch)) return true;
            } else if (!wt->staged_alone && may_post(wt, wt->staged_posted, post_cap(wt)) &&
                       (unclaimed(wt) || steal(wt, true, NULL, NULL, NULL))) {
                return true;
            }
        }
    return false;
}

/* PTO_EARLY_POSTS: unset, empty or 1, early posts (sched_early.c) while
 * the tasks are short; 0, none; always, whatever the tasks' times (for
 * tests, which must not depend on them). False, with the error set, for
 * anything else: a typo must not quietly leave them as they were. */
static bool early_from_env(pto_worker_manager *wm)
{
    const char *env = getenv("PTO_EARLY_POSTS");
    wm->early = !env || !*env || strcmp(env, "1") == 0 || strcmp(env, "always") == 0;
    wm->early_always = env && strcmp(env, "always") == 0;
    if (wm->early || strcmp(env, "0") == 0) return true;
    pto_set_error("PTO_EARLY_POSTS must be 0 (no early posts), 1 (early posts, the default) or always (got '%s')",
                  env);
    return false;
}

/* PROCESS mode: the zygote and one child per worker, all started before
 * any thread of this Worker exists. */
static bool start_children(pto_worker_manager *wm)
{
    int32_t n = wm->count[0] + wm->count[1];
    if (n == 0) return true;
    if (!early_from_env(wm) || !pto_wm_spread_from_env(wm)) return false;
    const pto_leaf **leaves = pto_xcalloc((size_t)n, sizeof *leaves);
    const char **names = pto_xcalloc((size_t)n, sizeof *names);
    int32_t *kinds = pto_xcalloc((size_t)n, sizeof *kinds);
    int32_t slot = 0;
    for (int k = 0; k < PTO_KINDS; k++)
        for (int32_t i = 0; i < wm->count[k]; i++, slot++) {
            assert(!wm->threads[k][i]->started);   /* pto_proc_start forks: no thread of this Worker may run */
            leaves[slot] = &wm->threads[k][i]->leaf;   /* lives as long as the Worker: the children read it */
            names[slot] = wm->threads[k][i]->name;
            kinds[slot] = k;
        }
    pto_proc_config pc = {.n = n, .leaves = leaves, .names = names, .kinds = kinds,
                          .start_timeout_ms = wm->start_timeout_ms, .stopping = &wm->stopping, .ships = &wm->ships,
                          .bell = wm->sched_ev};
    pto_proc *p = pto_proc_start(&pc);
    free(leaves);
    free(names);
    free(kinds);
    if (!p) return false;
    slot = 0;
    /* Early posts need children that run one task after the other: a
     * Worker child overlaps its tasks (leaf.begin). */
    for (int k = 0; k < PTO_KINDS; k++)
        for (int32_t i = 0; i < wm->count[k]; i++, slot++) {
            wm->threads[k][i]->child = pto_proc_child(p, slot);
            if (wm->threads[k][i]->leaf.begin) wm->early = false;
        }
    atomic_store(&wm->proc, p);
    return true;
}

bool pto_wm_start(pto_worker_manager *wm, pto_event *sched_ev)
{
    wm->sched_ev = sched_ev;
    if (wm->mode == PTO_MODE_PROCESS) return start_children(wm);   /* the scheduler drives them */
    int32_t started = 0;
    for (int k = 0; k < PTO_KINDS; k++) {
        for (int32_t i = 0; i < wm->count[k]; i++) {
            pto_worker_thread *wt = wm->threads[k][i];
            /* Dispatch wakes it with a load, not a fence (pto_wt_send). */
            (void)pto_event_make_asymmetric(&wt->ev);
            int rc = pthread_create(&wt->thread, NULL, wt_main, wt);
            if (rc != 0) {
                pto_set_error("cannot start a worker thread: %s", strerror(rc));
                pto_wm_stop(wm);
                return false;
            }
            wt->started = true;
            started++;
        }
    }
    pto_wait_up(&wm->up, started);
    return true;
}

void pto_wm_stop(pto_worker_manager *wm)
{
    atomic_store_explicit(&wm->stopping, true, memory_order_seq_cst);
    pto_proc *p = atomic_load(&wm->proc);
    if (p) pto_proc_wake(p);   /* threads waiting on a child give up */
    for (int k = 0; k < PTO_KINDS; k++) {
        for (int32_t i = 0; i < wm->count[k]; i++) {
            pto_worker_thread *wt = wm->threads[k][i];
            if (!wt->started) continue;
            pto_event_notify(&wt->ev);
            pthread_join(wt->thread, NULL);
            wt->started = false;
        }
    }
    if (p) {
        atomic_store(&wm->proc, NULL);
        pto_proc_stop(p);
        for (int k = 0; k < PTO_KINDS; k++)
            for (int32_t i = 0; i < wm->count[k]; i++) wm->threads[k][i]->child = NULL;
    }
}

void pto_wm_hot(pto_worker_manager *wm, uint64_t until_ns, bool wake)
{
    atomic_store_explicit(&wm->hot_until_ns, until_ns, memory_order_relaxed);
    pto_proc *p = atomic_load_explicit(&wm->proc, memory_order_acquire);
    if (p) pto_proc_hot(p, until_ns, wake);
    if (!wake) return;
    for (int k = 0; k < PTO_KINDS; k++)
        for (int32_t i = 0; i < wm->count[k]; i++) pto_event_notify(&wm->threads[k][i]->ev);
}

void pto_wm_settle(pto_worker_manager *wm)
{
    pto_proc *p = atomic_load(&wm->proc);
    if (p) pto_proc_settle(p);
}

void pto_wm_destroy(pto_worker_manager *wm)
{
    for (int k = 0; k < PTO_KINDS; k++) {
        for (int32_t i = 0; i < wm->count[k]; i++) {
            pto_worker_thread *wt = wm->threads[k][i];
            /* Completions nobody collected (a run abandoned by shutdown). */
            uint32_t h = atomic_load(&wt->cq_head), t = atomic_load(&wt->cq_tail);
            for (; h != t; h++) free(wt->cq[h & (PTO_WT_CQCAP - 1)].error);
            free(wt);
        }
        free(wm->threads[k]);
    }
    pto_ship_destroy(&wm->ships);
    pto_trace_free(atomic_load(&wm->trace));
    pto_diag_free(wm);
    free(wm->posted_now);
    memset(wm, 0, sizeof *wm);
}

void pto_wt_send(pto_worker_thread *wt, pto_slot *slot, int32_t member, bool stealable, pto_slot *after, bool ahead)
{
    assert(wt->inflight < PTO_WT_QCAP);   /* claim() relies on it: no unclaimed entry is overwritten */
    pto_wt_queue *qu = ahead ? &wt->pq : &wt->dq;
    uint32_t t = atomic_load_explicit(&qu->tail, memory_order_relaxed);
    pto_dispatch *e = &qu->e[t & (PTO_WT_QCAP - 1)];
    atomic_store_explicit(&e->slot, slot, memory_order_relaxed);
    atomic_store_explicit(&e->after, after, memory_order_relaxed);
    atomic_store_explicit(&e->member, member, memory_order_relaxed);
    atomic_store_explicit(&e->stealable, stealable, memory_order_relaxed);
    atomic_store_explicit(&qu->tail, t + 1, memory_order_release);
    wt->inflight++;
    wt->last_sent = (uintptr_t)slot;
    wt->last_sent_early = slot->early;
    /* PROCESS mode has no thread to wake: the turn that staged it pumps it
     * (a notify would be a full fence, on every task of the turn). THREAD
     * mode: the turn's holder is a thread of this process, and wt->ev is
     * asymmetric (pto_wm_start). */
    if (wt->wm->mode != PTO_MODE_THREAD) return;
    pto_event_notify_light(&wt->ev);
    /* Staged behind a running task: an idle thread of the kind may have gone
     * to sleep already, and only this wakes it to steal. (The scheduler's
     * inflight counts tasks by the queue they were staged on, so a thread
     * running a stolen task looks idle to pick.) */
    if (stealable && owner_busy(wt)) {
        pto_worker_manager *wm = wt->wm;
        for (int32_t k = 0; k < wm->count[wt->kind]; k++)
            if (wm->threads[wt->kind][k] != wt) pto_event_notify_light(&wm->threads[wt->kind][k]->ev);
    }
}

bool pto_wt_poll(pto_worker_thread *wt, pto_completion *out)
{
    uint32_t h = atomic_load_explicit(&wt->cq_head, memory_order_relaxed);
    if (h == atomic_load_explicit(&wt->cq_tail, memory_order_acquire)) return false;
    *out = wt->cq[h & (PTO_WT_CQCAP - 1)];
    atomic_store_explicit(&wt->cq_head, h + 1, memory_order_release);
    out->origin->inflight--;
    return true;
}
