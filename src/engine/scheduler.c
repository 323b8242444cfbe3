/* scheduler.c - the scheduler's turn: wiring each submitted task to its
 * producers, dispatch of ready tasks (chains staged behind their producer,
 * a consumer ahead on the worker its producer just ran on), completion
 * and failure (poisoning, caught failures, cancels). Who runs the turn,
 * and how the others wait meanwhile, is sched_turns.c; the dispatch gate
 * is dispatch_control.c. */
#include "scheduler.h"
#include "dispatch_control.h"
#include "diag.h"
#include "run.h"
#include "common.h"
#include "slot.h"

#include <assert.h>
#include <errno.h>
#include <sched.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool pto_sched_init(pto_scheduler *s, pto_worker_manager *wm)
{
    memset(s, 0, sizeof *s);
    s->wm = wm;
    void *ev = mmap(NULL, sizeof *s->ev, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (ev == MAP_FAILED) {
        pto_set_error("cannot map the scheduler's wake-up word (mmap: %s)", strerror(errno));
        return false;
    }
    s->ev = ev;   /* zero-filled: idle */
    pto_wq_init(&s->wire);
    atomic_init(&s->break_task, -1);
    atomic_init(&s->retry_req, -1);
    atomic_init(&s->caught_task, -1);
    pthread_mutex_init(&s->fail_mu, NULL);
    pthread_mutex_init(&s->gate_mu, NULL);
    return true;
}

void pto_sched_destroy(pto_scheduler *s)
{
    if (s->wire.head) pto_wq_destroy(&s->wire);
    free(s->work);
    free(s->deferred);
    free(s->caught);
    free(s->first_failure);
    for (int32_t i = 0; i < s->nnames; i++) free(s->names[i].name);
    free(s->names);
    free(s->breaks);
    pto_prof_free(&s->prof);
    pthread_mutex_destroy(&s->fail_mu);
    pthread_mutex_destroy(&s->gate_mu);
    if (s->ev) munmap(s->ev, sizeof *s->ev);
}

char *pto_sched_take_failure(pto_scheduler *s)
{
    pthread_mutex_lock(&s->fail_mu);
    char *f = s->first_failure;
    s->first_failure = NULL;
    pthread_mutex_unlock(&s->fail_mu);
    return f;
}

static void record_failure(pto_scheduler *s, const char *msg)
{
    pthread_mutex_lock(&s->fail_mu);
    if (!s->first_failure) s->first_failure = pto_xstrdup(msg);
    pthread_mutex_unlock(&s->fail_mu);
}

static void queue_push(pto_ready_queue *q, pto_slot *slot)
{
    slot->next_ready = NULL;
    if (q->tail) q->tail->next_ready = slot;
    else q->head = slot;
    q->tail = slot;
}

static pto_slot *queue_pop(pto_ready_queue *q)
{
    assert(q->head);
    pto_slot *slot = q->head;
    q->head = slot->next_ready;
    if (!q->head) q->tail = NULL;
    return slot;
}

static void make_ready(pto_scheduler *s, pto_slot *c)
{
    atomic_store_explicit(&c->state, PTO_TASK_READY, memory_order_relaxed);
    if (c->group_size == 1 && c->member0.pin >= 0) queue_push(&s->wm->threads[c->kind][c->member0.pin]->pinned, c);
    else queue_push(&s->ready[c->kind], c);
    if (++s->ready_len > atomic_load_explicit(&s->ready_hwm, memory_order_relaxed))
        atomic_store_explicit(&s->ready_hwm, s->ready_len, memory_order_relaxed);
}

/* A task of a cancelled submitted run: it fails instead of running. */
static void run_cancel_task(pto_slot *x)
{
    if (!x->error) x->error = pto_run_cancel_message(x->run, x->id, -1);
    pto_slot_poison(x, -1);
}

/* c is not run: its producer p failed (or, p's run cancelled, was not run);
 * a producer of another submitted run is named with its run. */
static void poison_consumer(pto_slot *c, const pto_slot *p)
{
    if (p->run && !c->error && (p->run != c->run || pto_run_cancelled(p->run)))
        c->error = pto_run_cancel_message(p->run, c->id, p->id);
    pto_slot_poison(c, p->id);
}

static void work_push(pto_scheduler *s, pto_slot *slot)
{
    pto_grow((void **)&s->work, &s->work_cap, s->nwork + 1, sizeof *s->work);
    s->work[s->nwork++] = slot;
}

static void release_ref(pto_scheduler *s, pto_slot *slot)
{
    if (pto_slot_release(slot)) {
        s->retire(s->retire_ctx, slot);
        s->retired_any = true;
    }
}

/* Only the scheduler thread writes `running`; others read it. */
static void running_add(pto_scheduler *s, int64_t d)
{
    atomic_store_explicit(&s->nrunning, atomic_load_explicit(&s->nrunning, memory_order_relaxed) + d,
                          memory_order_release);
}

static void send_single(pto_scheduler *s, pto_worker_thread *wt, pto_slot *slot, bool gated, bool ahead);
static bool try_early(pto_scheduler *s, pto_slot *c);

/* A worker of wt's kind other than wt with nothing staged, while wt has. */
static bool sibling_idle(const pto_scheduler *s, const pto_worker_thread *wt)
{
    if (wt->inflight == 0) return false;
    const pto_worker_manager *wm = s->wm;
    for (int32_t k = 0; k < wm->count[wt->kind]; k++)
        if (wm->threads[wt->kind][k]->inflight == 0) return true;
    return false;
}

/* Stage c, made ready by the task that just ended on wt, on wt ahead of its
 * queue. A consumer queued behind every task ready before it reads its
 * inputs back from memory: in a BGEMM of 64x64 tiles, whose orchestrator
 * runs far ahead, each tile_add ran a millisecond or more after its
 * gemm_tile, at twice the time of one that ran within 100 us. False for
 * what goes through the ready queue: a group, another kind, a pinned task
 * (or ready tasks pinned to wt, which go first), held or stepped dispatch,
 * caught failures, and any task while a sibling of wt idles and wt has
 * work staged: dispatch gives it to the idle one, where behind a long task
 * on wt it could wait (a PROCESS-mode child's posted cells are not
 * stealable). */
static bool send_next(pto_scheduler *s, pto_worker_thread *wt, pto_slot *c)
{
    if (c->group_size != 1 || c->kind != wt->kind || c->member0.pin >= 0 || wt->pinned.head ||
        wt->inflight == PTO_WT_QCAP || pto_gate_shut(s) || atomic_load_explicit(&s->catch_on, memory_order_relaxed) ||
        atomic_load_explicit(&s->cancel, memory_order_relaxed) || sibling_idle(s, wt))
        return false;
    send_single(s, wt, c, false, true);   /* its chain, if any, behind it */
    return true;
}

/* counter += n, by the one thread that writes it (the turn's holder): a
 * locked add per task was a full fence in finish_all, waiting on every
 * store before it (46% of its samples in the main BGEMM's turns sat on the
 * instruction after it). */
static void count_add(_Atomic int64_t *counter, int64_t n, memory_order mo)
{
    if (n) atomic_store_explicit(counter, atomic_load_explicit(counter, memory_order_relaxed) + n, mo);
}

/* Terminal transition of every slot on the worklist, cascading to consumers
 * that become terminal through poisoning. A slot is never touched after its
 * own self-release: that may hand it to reclamation. */
static void finish_all(pto_scheduler *s, pto_worker_thread *cont)
{
    int64_t nfinished = 0, nfailed = 0;
    while (s->nwork) {
        pto_slot *x = s->work[--s->nwork];
        bool failed = x->poisoned || atomic_load_explicit(&x->failed, memory_order_relaxed);
        if (PTO_UNLIKELY(x->poisoned) && x->kind >= 0)   /* it never ran: the profile's DAG still shows it */
            pto_prof_task(&s->prof, x->id, x->ready_by, x->callable, x->kind, -1, 0, 0, 0, 2, x->scope_seq);
        if (failed) {
            atomic_store_explicit(&x->failed, true, memory_order_release);   /* publishes x->error */
            record_failure(s, x->error ? x->error : "task failed");
            pto_prof_error(&s->prof, x->id, x->error ? x->error : "task failed");
            nfailed++;
        }
        atomic_store_explicit(&x->state, failed ? PTO_TASK_FAILED : PTO_TASK_COMPLETED, memory_order_release);
        for (int32_t i = 0; i < x->nconsumers; i++) {
            pto_slot *c = x->consumers[i];
            if (failed) poison_consumer(c, x);
            if (c->run && pto_run_cancelled(c->run)) run_cancel_task(c);
            if (++c->fanin_released == c->fanin_count && !c->chained) {   /* a chained one is staged already */
                c->ready_by = x->id;
                if (c->poisoned) work_push(s, c);
                else if (cont && send_next(s, cont, c)) cont = NULL;
                else make_ready(s, c);
            } else if (PTO_UNLIKELY(c->early) && c->fanin_released == c->fanin_count) {
                c->ready_by = x->id;   /* posted already: in this view x ended last of those it waits for */
            }
        }
        if (PTO_UNLIKELY(x->done.stamp || x->nwaits)) pto_early_drop_words(s, x, true, failed);   /* early posts only */
        /* Before its releases, which may recycle x; before `finished`, so a
         * drained session has no hook left to run. */
        if (x->run) pto_run_task_finished(x->run, x, failed);
        for (int32_t i = 0; i < x->nrefs; i++) release_ref(s, x->refs[i].slot);
        release_ref(s, x);
        nfinished++;
    }
    count_add(&s->failed_total, nfailed, memory_order_relaxed);
    count_add(&s->completed_total, nfinished - nfailed, memory_order_relaxed);
    /* Counted last: when drain sees every task finished, every release
     * they made is already in the retire queue. */
    count_add(&s->finished, nfinished, memory_order_seq_cst);
    if (s->retired_any) {
        s->retired_any = false;
        s->retire_flush(s->retire_ctx);
    }
}

static void wire(pto_scheduler *s, pto_slot *c)
{
    int32_t live = 0;
    if (c->run && pto_run_cancelled(c->run)) run_cancel_task(c);
    c->ready_by = -1;
    for (int32_t i = 0; i < c->nrefs; i++) {
        pto_slot *p = c->refs[i].slot;
        /* An alloc slot is no task: a picture of the DAG folds it into the tasks that use its memory. */
        if (PTO_UNLIKELY(p->kind < 0)) pto_prof_use(&s->prof, c->id, p->id);
        if (!c->refs[i].dep) continue;
        pto_prof_edge(&s->prof, c->id, p->id);
        /* Only a terminal producer is skipped: a group's failed flag is set by
         * its first failing member, while other members may still run and
         * the group's own failure is not yet recorded as the run's error. */
        int32_t st = atomic_load_explicit(&p->state, memory_order_acquire);
        /* enable_dep_gen on the producer: its consumers as they are wired (diag.c), which the submit cannot
         * know: whether c waits for p or p had finished already. */
        bool dep_gen = PTO_UNLIKELY(p->cfg && p->cfg->cfg.enable_dep_gen);
        if (st == PTO_TASK_COMPLETED || st == PTO_TASK_FAILED || st == PTO_TASK_CONSUMED) {
            bool failed = atomic_load_explicit(&p->failed, memory_order_relaxed);
            if (failed) poison_consumer(c, p);
            if (dep_gen) pto_diag_consumer(s->wm, p, c, failed ? PTO_DIAG_FAILED : PTO_DIAG_DONE);
            continue;
        }
        if (dep_gen) pto_diag_consumer(s->wm, p, c, PTO_DIAG_WIRED);
        pto_grow((void **)&p->consumers, &p->consumers_cap, p->nconsumers + 1, sizeof *p->consumers);
        p->consumers[p->nconsumers++] = c;
        live++;
    }
    c->fanin_count = live;
    if (live == 0) {
        if (c->poisoned) {
            work_push(s, c);
            finish_all(s, NULL);
        } else {
            make_ready(s, c);
        }
    } else if (s->wm->early) {
        try_early(s, c);
    }
}

/* Every slot in the wire queue was just written on the orchestrator's
 * core, and wire() reads three of its lines and then each producer's:
 * the slot's first line, the one with refs/nrefs, the refs array (inline,
 * further on), then the producers' state and consumer lists. Each load
 * depends on the one before, so wire_all starts them in stages, a wire
 * apart (about one miss here): the slot's lines WIRE_AHEAD slots ahead,
 * its refs array one closer, its producers' lines one closer still. */
#define WIRE_AHEAD 3

static void prefetch_producers(const pto_slot *c)
{
    for (int32_t i = 0; i < c->nrefs && i < PTO_SLOT_INLINE_REFS; i++) {
        const pto_slot *p = c->refs[i].slot;
        __builtin_prefetch(p);
        __builtin_prefetch(&p->nconsumers);
    }
}

static bool wire_all(pto_scheduler *s)
{
    bool any = false;
    for (pto_slot *c; (c = pto_wq_pop(&s->wire)); any = true) {
        const pto_slot *n;
        if ((n = pto_wq_ahead(&s->wire, WIRE_AHEAD - 1))) {
            __builtin_prefetch(n);
            __builtin_prefetch(&n->nrefs);
        }
        if ((n = pto_wq_ahead(&s->wire, WIRE_AHEAD - 2)) && n->nrefs) __builtin_prefetch(n->refs);
        if ((n = pto_wq_ahead(&s->wire, 0))) prefetch_producers(n);
        wire(s, c);
    }
    return any;
}

/* A consumer of p that may wait on wt right behind p: p is its only
 * unfinished producer, so it can start the moment p ends, and there is no
 * sooner start for it than on the thread that runs p. A chain of such tasks
 * runs without a round trip through this thread per task. */
static pto_slot *chain_next(const pto_worker_thread *wt, const pto_slot *p)
{
    for (int32_t i = 0; i < p->nconsumers; i++) {
        pto_slot *c = p->consumers[i];
        if (c->fanin_count - c->fanin_released == 1 && !c->chained && !c->poisoned && c->group_size == 1 &&
            c->kind == wt->kind && (c->member0.pin < 0 || c->member0.pin == wt->index))
            return c;
    }
    return NULL;
}

/* Stage the single task slot on wt (ahead: before what is staged there
 * already, send_next), and its chain behind it. Every link is
 * unstealable, so the worker runs them in order and knows each producer's
 * outcome first (pto_wt_send's `after`). That costs the head its
 * stealability, so a chain starts only at a head that runs at once or is
 * pinned anyway; and none starts while the dispatch gate is shut, whose
 * :step counts tasks one by one. The scheduler finishes a chained task
 * from its completion, as any other: its producer's completion, queued
 * before it on the same thread, only counts the fan-in. */
static void send_single(pto_scheduler *s, pto_worker_thread *wt, pto_slot *slot, bool gated, bool ahead)
{
    bool pinned = slot->member0.pin >= 0;
    /* Nor while older ready tasks wait for wt alone: they go first. */
    /* Nor while catching failures: a chained consumer would be failed by its producer's failure at once. */
    pto_slot *next = !gated && !wt->pinned.head && (pinned || wt->inflight == 0) &&
                             !atomic_load_explicit(&s->catch_on, memory_order_relaxed)
                         ? chain_next(wt, slot)
                         : NULL;
    pto_slot *after = NULL;
    for (;;) {
        atomic_store_explicit(&slot->state, PTO_TASK_RUNNING, memory_order_relaxed);
        running_add(s, 1);
        pto_wt_send(wt, slot, 0, !after && !next && !pinned, after, ahead);
        if (!next || wt->inflight == PTO_WT_QCAP) return;
        after = slot;
        slot = next;
        slot->chained = true;
        slot->ready_by = after->id;
        next = chain_next(wt, slot);
    }
}

/* Least-loaded worker of kind with room, preferring idle ones and the
 * lowest index (a hot worker stays hot); NULL if all are full. While the
 * ready queue is longer than the workers' depth, they are filled up to
 * PTO_WT_QCAP: a worker then runs many tasks per scheduler round trip
 * instead of queue_depth, and idle workers steal from a queue that sits
 * behind a long task (worker_manager.c), so balance does not suffer. */
static pto_worker_thread *pick(pto_scheduler *s, int32_t kind)
{
    pto_worker_manager *wm = s->wm;
    pto_worker_thread *best = NULL;
    int32_t limit = s->ready_len > (int64_t)wm->depth * wm->count[kind] ? PTO_WT_QCAP : wm->depth;
    for (int32_t k = 0; k < wm->count[kind]; k++) {
        pto_worker_thread *wt = wm->threads[kind][k];
        if (wt->inflight >= limit) continue;
        if (!best || wt->inflight < best->inflight) best = wt;
        if (wt->inflight == 0) break;
    }
    return best;
}

/* A group needs group_size distinct idle workers at once (pinned members on
 * their own). Returns false, picking nothing, when they are not all free. */
static bool pick_group(pto_scheduler *s, pto_slot *g, pto_worker_thread **out)
{
    pto_worker_manager *wm = s->wm;
    int32_t n = wm->count[g->kind];
    bool *taken = __builtin_alloca((size_t)n);
    memset(taken, 0, (size_t)n);
    for (int32_t i = 0; i < g->group_size; i++) {
        int32_t pin = g->members[i].pin;
        if (pin < 0) continue;
        if (taken[pin] || wm->threads[g->kind][pin]->inflight) return false;
        taken[pin] = true;
        out[i] = wm->threads[g->kind][pin];
    }
    int32_t next = 0;
    for (int32_t i = 0; i < g->group_size; i++) {
        if (g->members[i].pin >= 0) continue;
        while (next < n && (taken[next] || wm->threads[g->kind][next]->inflight)) next++;
        if (next == n) return false;
        taken[next] = true;
        out[i] = wm->threads[g->kind][next];
    }
    return true;
}

static void cancel_queue(pto_scheduler *s, pto_ready_queue *q)
{
    while (q->head) {
        pto_slot *x = queue_pop(q);
        s->ready_len--;
        pto_slot_poison(x, -1);
        work_push(s, x);
    }
}

/* An interrupted run: whatever is ready fails instead of running. Its
 * consumers are poisoned as they become ready, so the run drains as soon as
 * the tasks already running return. */
static void cancel_ready(pto_scheduler *s)
{
    for (int32_t kind = 0; kind < PTO_KINDS; kind++) {
        cancel_queue(s, &s->ready[kind]);
        for (int32_t i = 0; i < s->wm->count[kind]; i++) cancel_queue(s, &s->wm->threads[kind][i]->pinned);
    }
    finish_all(s, NULL);
}

/* Submitted runs were cancelled (pto_run_cancel): their ready tasks fail
 * instead of running; their later ones are caught as they are wired or
 * become ready. */
static void sweep_queue(pto_scheduler *s, pto_ready_queue *q)
{
    pto_slot *x = q->head;
    q->head = q->tail = NULL;
    while (x) {
        pto_slot *next = x->next_ready;
        if (x->run && pto_run_cancelled(x->run)) {
            s->ready_len--;
            run_cancel_task(x);
            work_push(s, x);
        } else {
            queue_push(q, x);
        }
        x = next;
    }
}

static void sweep_cancelled_runs(pto_scheduler *s)
{
    s->run_cancels_seen = atomic_load_explicit(&s->run_cancels, memory_order_acquire);
    for (int32_t kind = 0; kind < PTO_KINDS; kind++) {
        sweep_queue(s, &s->ready[kind]);
        for (int32_t i = 0; i < s->wm->count[kind]; i++) sweep_queue(s, &s->wm->threads[kind][i]->pinned);
    }
    finish_all(s, NULL);
}

/* An early task's completion that came back before its producers' (sched_early.c). */
typedef struct pto_deferred {
    pto_worker_thread *wt;
    pto_completion c;
} pto_deferred;

/* Post c early if sched_early.c finds it a worker: staged like any
 * dispatch, unstealable, marked chained so its producers' ends do not make
 * it ready again. Whether it went. */
static bool try_early(pto_scheduler *s, pto_slot *c)
{
    pto_worker_thread *wt = pto_early_place(s, c);
    if (!wt) return false;
    atomic_store_explicit(&c->state, PTO_TASK_RUNNING, memory_order_relaxed);
    running_add(s, 1);
    pto_wt_send(wt, c, 0, false, NULL, false);
    return true;
}

/* The pump just posted these with their words: their consumers may go
 * too. Whether any did (the pump then posts them in the same turn). */
static bool early_after_posts(pto_scheduler *s)
{
    pto_worker_manager *wm = s->wm;
    bool any = false;
    for (int32_t i = 0; i < wm->nposted_now; i++) {
        pto_slot *p = wm->posted_now[i];
        for (int32_t k = 0; k < p->nconsumers; k++)
            if (!p->consumers[k]->chained) any |= try_early(s, p->consumers[k]);
    }
    wm->nposted_now = 0;
    return any;
}

/* An early task came back unrun although none of its producers failed
 * here (a caught failure retried, a producer run again): it runs again,
 * now that its producers are done, as a ready task with a new word. */
static void early_again(pto_scheduler *s, pto_slot *x)
{
    pto_early_drop_words(s, x, false, false);   /* its child said "failed" in its word: whoever waits runs again too */
    x->early = x->chained = false;
    running_add(s, -1);
    make_ready(s, x);
}

static void defer_completion(pto_scheduler *s, pto_worker_thread *wt, const pto_completion *c)
{
    pto_grow((void **)&s->deferred, &s->deferred_cap, s->ndeferred + 1, sizeof *s->deferred);
    s->deferred[s->ndeferred++] = (pto_deferred){wt, *c};
}

static void on_completion(pto_scheduler *s, pto_worker_thread *wt, pto_completion *c);

/* Finish the deferred completions whose producers are finished now. */
static bool run_deferred(pto_scheduler *s)
{
    bool any = false;
    for (bool again = true; again;) {
        again = false;
        for (int32_t i = 0; i < s->ndeferred;) {
            pto_slot *x = s->deferred[i].c.slot;
            if (x->fanin_released < x->fanin_count) {
                i++;
                continue;
            }
            pto_deferred d = s->deferred[i];
            s->deferred[i] = s->deferred[--s->ndeferred];
            on_completion(s, d.wt, &d.c);
            any = again = true;
        }
    }
    return any;
}

static void dispatch_ready(pto_scheduler *s)
{
    pto_worker_manager *wm = s->wm;
    s->gate_seen = atomic_load_explicit(&s->gate_gen, memory_order_acquire);
    if (atomic_load_explicit(&s->cancel, memory_order_relaxed)) {
        cancel_ready(s);
        return;
    }
    if (atomic_load_explicit(&s->run_cancels, memory_order_relaxed) != s->run_cancels_seen) sweep_cancelled_runs(s);
    bool gated = pto_gate_shut(s);
    for (int32_t kind = 0; kind < PTO_KINDS; kind++) {
        for (int32_t i = 0; i < wm->count[kind]; i++) {
            pto_worker_thread *wt = wm->threads[kind][i];
            while (wt->pinned.head && wt->inflight < wm->depth) {
                if (!pto_gate_admits(s, wt->pinned.head, &gated)) break;
                pto_slot *slot = queue_pop(&wt->pinned);
                s->ready_len--;
                send_single(s, wt, slot, gated, false);
            }
        }
        pto_ready_queue *q = &s->ready[kind];
        while (q->head) {
            pto_slot *slot = q->head;
            /* The next one's lines: made ready a turn ago, cold by now
             * (`perf annotate`, pto_bench W3: 90% of dispatch_ready's
             * samples on the head's group_size and next_ready). */
            pto_slot *after = slot->next_ready;
            if (after) {
                __builtin_prefetch(after);
                __builtin_prefetch(&after->next_ready);
            }
            if (slot->group_size == 1) {
                pto_worker_thread *wt = pick(s, kind);
                if (!wt) break;           /* head-of-line: this kind is saturated */
                if (!pto_gate_admits(s, slot, &gated)) break;
                queue_pop(q);
                s->ready_len--;
                send_single(s, wt, slot, gated, false);
            } else {
                pto_worker_thread **wts = __builtin_alloca(sizeof *wts * (size_t)slot->group_size);
                if (!pick_group(s, slot, wts)) break;
                if (!pto_gate_admits(s, slot, &gated)) break;
                queue_pop(q);
                s->ready_len--;
                atomic_store_explicit(&slot->state, PTO_TASK_RUNNING, memory_order_relaxed);
                running_add(s, 1);
                for (int32_t m = 0; m < slot->group_size; m++) pto_wt_send(wts[m], slot, m, false, NULL, false);
            }
        }
    }
}

void pto_sched_name_callable(pto_scheduler *s, int32_t kind, uint64_t callable, const char *name)
{
    pthread_mutex_lock(&s->fail_mu);
    int32_t i = 0;
    while (i < s->nnames && !(s->names[i].kind == kind && s->names[i].callable == callable)) i++;
    if (i == s->nnames) {
        pto_grow((void **)&s->names, &s->names_cap, s->nnames + 1, sizeof *s->names);
        s->names[s->nnames++] = (pto_callable_name){kind, callable, NULL};
    }
    free(s->names[i].name);
    s->names[i].name = pto_xstrdup(name);
    pthread_mutex_unlock(&s->fail_mu);
}

/* "task 7 (callable 'gemm_tile' on chip 2) failed: ..." */
static char *describe_outcome(pto_scheduler *s, const pto_slot *x, const pto_worker_thread *wt, const char *verb,
                              const char *why);
static char *describe_failure(pto_scheduler *s, const pto_slot *x, const pto_worker_thread *wt, const char *why)
{
    return describe_outcome(s, x, wt, " failed", why);
}

static char *describe_outcome(pto_scheduler *s, const pto_slot *x, const pto_worker_thread *wt, const char *verb,
                              const char *why)
{
    /* Check mode names the run too (docs/check.md): a checked script runs many, and its finding
     * must say which. A submitted run's is its handle's id (h.id), as in its cancel messages; a
     * blocking or interactive run's is the Worker's run count (w:stats().runs, the trace's and the
     * profile's run). Outside check mode the message stays as it always was. */
    char run[40] = "";
    if (PTO_UNLIKELY(atomic_load_explicit(&s->wm->check, memory_order_relaxed)))
        snprintf(run, sizeof run, "run %lld, ",
                 (long long)(x->run ? x->run->id : atomic_load_explicit(&s->run_no, memory_order_relaxed)));
    pthread_mutex_lock(&s->fail_mu);
    const char *name = NULL;
    for (int32_t i = 0; i < s->nnames; i++)
        if (s->names[i].kind == wt->kind && s->names[i].callable == x->callable) name = s->names[i].name;
    char *msg = name ? pto_xasprintf("%stask %lld (callable '%s' on %s%s)%s: %s", run, (long long)x->id, name,
                                     wt->name, x->group_size > 1 ? ", group member" : "", verb, why)
                     : pto_xasprintf("%stask %lld (callable %llu on %s%s)%s: %s", run, (long long)x->id,
                                     (unsigned long long)x->callable, wt->name,
                                     x->group_size > 1 ? ", group member" : "", verb, why);
    pthread_mutex_unlock(&s->fail_mu);
    return msg;
}

/* ---- stop on failure (the REPL's :catch, :retry, :release) ---- */

/* A single task failed while catching: hold dispatch and keep it aside, its consumers untouched. */
static bool catch_failure(pto_scheduler *s, pto_worker_thread *wt, pto_completion *c)
{
    pto_slot *x = c->slot;
    if (x->group_size != 1 || x->poisoned || atomic_load(&s->draining) || atomic_load(&s->cancel)) return false;
    free(x->error);
    x->error = describe_failure(s, x, wt, c->error);
    free(c->error);
    /* Its word says it failed; a retry posts it with a new one. */
    if (x->done.stamp) pto_early_drop_words(s, x, false, true);
    pto_grow((void **)&s->caught, &s->caught_cap, s->ncaught + 1, sizeof *s->caught);
    s->caught[s->ncaught++] = x;
    /* Neither failed nor terminal: a consumer submitted meanwhile waits for it instead of being poisoned.
     * Inspection shows it as failed (orch_inspect.c), after caught_task publishes x->error. */
    running_add(s, -1);
    pto_sched_hold(s, true);
    atomic_store(&s->caught_task, x->id);
    return true;
}

/* Answer a retry, and settle the caught failures once released (or drained, or interrupted). */
static void serve_caught(pto_scheduler *s)
{
    int64_t want = atomic_load(&s->retry_req);
    bool release = atomic_exchange(&s->release_req, false) || atomic_load(&s->draining) || atomic_load(&s->cancel);
    int32_t found = 0, k = 0;
    for (int32_t i = 0; i < s->ncaught; i++) {
        pto_slot *x = s->caught[i];
        int32_t as = want >= 0 ? atomic_load(&s->retry_kind) : -2;
        if (x->id == want && as >= 0 && as != x->kind) {   /* a callable of another kind: it stays caught */
            found = 2;
            s->caught[k++] = x;
        } else if (x->id == want) {
            /* The user re-registered what it calls (a fixed kernel or sub): its handle replaces the task's. */
            if (as != -2) x->callable = atomic_load(&s->retry_callable);
            atomic_store(&s->caught_task, -1);   /* before the free: inspection stops reading x->error */
            free(x->error);
            x->error = NULL;
            atomic_store_explicit(&x->group_failed, false, memory_order_relaxed);
            make_ready(s, x);
            found = 1;
        } else if (release) {
            atomic_store_explicit(&x->failed, true, memory_order_release);   /* publishes x->error */
            work_push(s, x);
        } else {
            s->caught[k++] = x;
        }
    }
    s->ncaught = k;
    finish_all(s, NULL);
    atomic_store(&s->caught_task, k ? s->caught[k - 1]->id : -1);
    if (want >= 0) {
        if (found == 1) pto_sched_hold(s, false);   /* the run goes on as if it had not failed */
        atomic_store(&s->release_req, false);
        atomic_store(&s->retry_result, found);
        atomic_store(&s->retry_req, -1);
    }
}

int pto_sched_retry(pto_scheduler *s, int64_t id, int32_t kind, uint64_t callable)
{
    atomic_store(&s->retry_kind, kind);
    atomic_store(&s->retry_callable, callable);
    atomic_store(&s->retry_req, id);   /* last: the scheduler reads the two above once it sees it */
    pto_gate_changed(s);
    while (atomic_load(&s->retry_req) != -1 && atomic_load(&s->running)) sched_yield();
    if (!atomic_load(&s->running)) {
        atomic_store(&s->retry_req, -1);
        return 0;
    }
    return atomic_load(&s->retry_result);
}

static void on_completion(pto_scheduler *s, pto_worker_thread *wt, pto_completion *c)
{
    pto_slot *x = c->slot;
    if (PTO_UNLIKELY(x->early)) {
        /* Back before a producer's own result: finished after it. */
        if (x->fanin_released < x->fanin_count) {
            defer_completion(s, wt, c);
            return;
        }
        if (c->status == PTO_DONE_UNRUN && !x->poisoned) {
            early_again(s, x);
            return;
        }
    }
    if (c->t1) {
        int64_t ran = (int64_t)(c->t1 - c->t0), capped = ran < 2 * PTO_WT_TURN_MIN_NS ? ran : 2 * PTO_WT_TURN_MIN_NS;
        s->wm->task_ns[wt->kind] += (ran - s->wm->task_ns[wt->kind]) / 8;
        s->wm->turn_ns[wt->kind] += (capped - s->wm->turn_ns[wt->kind]) / 8;
        pto_prof_task(&s->prof, x->id, x->ready_by, x->callable, x->kind, wt->index, c->member, c->t0, c->t1,
                      c->status == PTO_DONE_FAILED, x->scope_seq);
    }
    if (c->status == PTO_DONE_CANCELLED) {   /* as cancel_ready or a run's cancel, for what was already staged */
        if (x->run && pto_run_cancelled(x->run)) run_cancel_task(x);
        else pto_slot_poison(x, -1);
    }
    if (c->status == PTO_DONE_UNRUN) x->poisoned = true;   /* its producer's completion, polled first, said why */
    if (PTO_UNLIKELY(c->status == PTO_DONE_OK && c->error)) {   /* check mode's warnings (check.c) */
        char *msg = describe_outcome(s, x, wt, "", c->error);
        fprintf(stderr, "ptolua: %s\n", msg);
        free(msg);
        free(c->error);
    }
    if (PTO_UNLIKELY(c->status == PTO_DONE_FAILED && atomic_load_explicit(&s->catch_on, memory_order_relaxed)) &&
        catch_failure(s, wt, c))
        return;
    if (c->status == PTO_DONE_FAILED) {
        if (!x->error) x->error = describe_failure(s, x, wt, c->error);
        free(c->error);
        atomic_store_explicit(&x->group_failed, true, memory_order_release);
        atomic_store_explicit(&x->failed, true, memory_order_release);   /* publishes x->error */
    }
    if (x->group_size > 1 && ++x->members_done < x->group_size) return;
    running_add(s, -1);
    work_push(s, x);
    finish_all(s, wt);
}

/* Start loading what finish_all reads of x's lines beyond the first: its
 * consumers and references, written at its wiring and submit long ago. */
static void prefetch_finish(const pto_slot *x)
{
    __builtin_prefetch(&x->consumers);
    __builtin_prefetch(&x->refs);
}

/* ... and the arrays they point to (x's lines loaded by now). */
static void prefetch_edges(const pto_slot *x)
{
    if (x->nconsumers) __builtin_prefetch(x->consumers);
    if (x->nrefs) __builtin_prefetch(x->refs);
}

/* Completions taken from a worker's queue at once. finish_all's samples
 * sat on the loads of each slot's consumer and reference arrays, cold by
 * the time its task ends; a batch loads them all first and the next
 * one's arrays while one finishes (pto_bench W3: finish_all 11.7% -> 7.7%
 * of the samples). */
#define COMPLETE_BATCH 8

static bool complete_all(pto_scheduler *s)
{
    bool any = false;
    pto_completion b[COMPLETE_BATCH];
    for (int32_t kind = 0; kind < PTO_KINDS; kind++) {
        for (int32_t i = 0; i < s->wm->count[kind]; i++) {
            pto_worker_thread *wt = s->wm->threads[kind][i];
            for (;;) {
                int n = 0;
                while (n < COMPLETE_BATCH && pto_wt_poll(wt, &b[n])) prefetch_finish(b[n++].slot);
                if (!n) break;
                if (n > 1) prefetch_edges(b[0].slot);
                for (int k = 0; k < n; k++) {
                    if (k + 1 < n) prefetch_edges(b[k + 1].slot);
                    on_completion(s, wt, &b[k]);
                }
                any = true;
            }
        }
    }
    if (PTO_UNLIKELY(s->ndeferred)) any |= run_deferred(s);
    /* The orchestrator sleeps in drain until every task finished; wake it
     * only then, not on every batch. */
    if (any && s->orch_ev && atomic_load_explicit(s->orch_waiting, memory_order_seq_cst) == ORCH_WAIT_FINISH &&
        atomic_load_explicit(&s->finished, memory_order_seq_cst) >=
            atomic_load_explicit(&s->finish_target, memory_order_relaxed))
        pto_event_notify(s->orch_ev);
    return any;
}

bool pto_sched_turn(pto_scheduler *s)
{
    /* A sync request seen here is answered after this whole turn, whose
     * wiring then includes every task submitted before the request. */
    uint64_t sync = atomic_load(&s->sync_req);
    bool wired = wire_all(s);
    if (PTO_UNLIKELY(s->ncaught || atomic_load_explicit(&s->retry_req, memory_order_relaxed) >= 0)) serve_caught(s);
    dispatch_ready(s);
    bool pumped = pto_wm_pump(s->wm);   /* PROCESS mode: into the children and back */
    /* What was just posted lets its consumers go early, whose posts let
     * theirs go: as far as the children's rings take them, in this turn
     * (one step per turn would fall behind children that need no turn). */
    while (s->wm->nposted_now && early_after_posts(s)) pumped |= pto_wm_pump(s->wm);
    bool done = complete_all(s);
    if (sync != atomic_load_explicit(&s->sync_ack, memory_order_relaxed)) atomic_store(&s->sync_ack, sync);
    if (wired || done || pumped) return true;
    pto_gate_answer_quiet(s);
    s->wait_ns = -1;
    return false;
}
