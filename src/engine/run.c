/* run.c - submitted runs and their records; the design is in run.h. */
#include "run.h"
#include "common.h"
#include "slot.h"
#include "worker.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* As the drain's (orchestrator.c): a small run's tasks finish within it. */
#define RUN_WAIT_SPIN_NS 20000

static void run_done(pto_run *r)
{
    /* The session's reference keeps r alive past this (run.h), so the
     * scheduler may still touch it after a waiter saw it done. */
    if (atomic_exchange_explicit(&r->ending, true, memory_order_seq_cst)) return;
    /* Live drops before done shows: whoever saw its run done also sees it
     * no longer counted live (pto_runs_live, pto_runs_end). */
    atomic_fetch_sub_explicit(r->live, 1, memory_order_seq_cst);
    atomic_store_explicit(&r->done, true, memory_order_seq_cst);
    pto_event_notify(r->ev);
    /* Dekker with pto_run_on_done: one of the two sees the other. */
    pto_wake_fn wake = atomic_load_explicit(&r->on_done, memory_order_seq_cst);
    if (wake) wake(atomic_load_explicit(&r->on_done_arg, memory_order_relaxed));
}

void pto_run_on_done(pto_run *r, pto_wake_fn wake, void *arg)
{
    atomic_store_explicit(&r->on_done, NULL, memory_order_seq_cst);
    atomic_store_explicit(&r->on_done_arg, arg, memory_order_relaxed);
    atomic_store_explicit(&r->on_done, wake, memory_order_seq_cst);
    /* Done before the wish was seen: a wake-up too many is harmless, one too few a hang. */
    if (wake && atomic_load_explicit(&r->done, memory_order_seq_cst)) wake(arg);
}

void pto_run_task_finished(pto_run *r, const pto_slot *s, bool failed)
{
    if (failed) {
        pthread_mutex_lock(&r->mu);
        if (!r->failure) r->failure = pto_xstrdup(s->error ? s->error : "task failed");
        pthread_mutex_unlock(&r->mu);
        atomic_fetch_add_explicit(&r->failed, 1, memory_order_relaxed);
    } else {
        atomic_fetch_add_explicit(&r->completed, 1, memory_order_relaxed);
    }
    int64_t f = atomic_fetch_add_explicit(&r->finished, 1, memory_order_seq_cst) + 1;
    if (f == atomic_load_explicit(&r->submitted, memory_order_seq_cst)) run_done(r);
}

char *pto_run_cancel_message(const pto_run *r, int64_t task, int64_t producer)
{
    if (producer < 0)
        return pto_xasprintf("task %lld was not run: its run %lld was cancelled", (long long)task, (long long)r->id);
    if (!pto_run_cancelled(r))
        return pto_xasprintf("task %lld was not run: its producer task %lld of run %lld failed", (long long)task,
                             (long long)producer, (long long)r->id);
    return pto_xasprintf("task %lld was not run: its producer task %lld failed, as run %lld was cancelled",
                         (long long)task, (long long)producer, (long long)r->id);
}

static void run_unref(pto_run *r)
{
    if (--r->refs > 0) return;
    pthread_mutex_destroy(&r->mu);
    free(r->failure);
    free(r);
}

void pto_runs_destroy(pto_runs *rs)
{
    while (rs->list) {
        pto_run *n = rs->list->next;
        run_unref(rs->list);
        rs->list = n;
    }
    rs->open = false;
    rs->cur = NULL;
}

pto_orch *pto_run_submit(pto_worker *w, pto_run **run)
{
    if (!w || !w->inited) {
        pto_set_error("the Worker is not initialised; call pto_worker_init first");
        return NULL;
    }
    pto_runs *rs = &w->runs_out;
    if (rs->cur) {
        pto_set_error("a submitted run's function is running on this Worker; runs do not nest (submit tasks to its "
                      "orchestrator instead)");
        return NULL;
    }
    if (w->orch.open && !rs->open) {
        pto_set_error("a run is already open on this Worker; end it before submitting runs");
        return NULL;
    }
    if (atomic_load(&w->shutdown)) {
        pto_set_error("the Worker is shut down");
        return NULL;
    }
    if (!rs->open) {
        /* The session opens as a blocking run does, so its first tasks are
         * numbered from 0 and the workers are woken now. */
        if (!pto_run_begin_session(w)) return NULL;
        rs->open = true;
    } else {
        pto_orch_reclaim(&w->orch);
        pto_wm_hot(&w->wm, pto_now_ns() + PTO_HOT_NS, true);
        pto_event_notify(w->sched.ev);
        w->runs++;
    }
    pto_run *r = pto_xcalloc(1, sizeof *r);
    r->id = ++rs->next_id;
    r->first_task = w->orch.pool.next_id;
    r->base = w->orch.submitted;
    r->o = &w->orch;
    atomic_store(&r->submitted, INT64_MAX);
    pthread_mutex_init(&r->mu, NULL);
    r->live = &rs->live;
    r->ev = &w->orch.ev;
    r->refs = 2;
    r->next = rs->list;
    rs->list = r;
    atomic_fetch_add(&rs->live, 1);
    rs->cur = r;
    w->orch.cur_run = r;
    *run = r;
    return &w->orch;
}

int pto_run_submitted(pto_worker *w, pto_run *r)
{
    if (!w || !r || w->runs_out.cur != r) {
        pto_set_error("this run's function is not the one running on this Worker");
        return -1;
    }
    pto_orch *o = &w->orch;
    pto_orch_outer_scope_renew(o);
    o->cur_run = NULL;
    w->runs_out.cur = NULL;
    int64_t n = o->submitted - r->base;
    atomic_store_explicit(&r->submitted, n, memory_order_seq_cst);
    if (atomic_load_explicit(&r->finished, memory_order_seq_cst) == n) run_done(r);
    return 0;
}

/* What a wait waits for: run r done, or (r NULL) no submitted run live. */
typedef struct wait_for {
    pto_worker *w;
    pto_run *r;
} wait_for;

static bool wait_done(const wait_for *f)
{
    if (f->r) return atomic_load_explicit(&f->r->done, memory_order_acquire);
    return atomic_load_explicit(&f->w->runs_out.live, memory_order_acquire) == 0;
}

static bool run_waitable(void *arg)
{
    const wait_for *f = arg;
    return wait_done(f) || atomic_load_explicit(&f->w->shutdown, memory_order_relaxed);
}

int pto_run_wait(pto_worker *w, pto_run *r, int32_t timeout_ms)
{
    if (r && atomic_load_explicit(&r->done, memory_order_acquire)) return 1;
    if (!w || atomic_load(&w->shutdown)) {
        pto_set_error("the Worker is shut down");
        return -1;
    }
    wait_for f = {w, r};
    if (wait_done(&f)) return 1;
    if (timeout_ms == 0) return 0;
    pto_orch *o = &w->orch;
    uint64_t t0 = pto_now_ns(), limit = timeout_ms < 0 ? UINT64_MAX : (uint64_t)timeout_ms * 1000000ull;
    /* As a drain: dispatch held or not, what is submitted runs. */
    pto_sched_draining(&w->sched, true);
    pto_wm_hot(&w->wm, UINT64_MAX, false);
    int rc = 1;
    while (!wait_done(&f)) {
        if (atomic_load(&w->shutdown)) {
            pto_set_error("the Worker is shut down");
            rc = -1;
            break;
        }
        uint64_t spent = pto_now_ns() - t0;
        if (spent >= limit) {
            rc = 0;
            break;
        }
        uint64_t left = limit - spent;
        pto_event_wait(&o->ev, run_waitable, &f, RUN_WAIT_SPIN_NS, left < 100000000 ? (int64_t)left : 100000000);
        pto_orch_reclaim(o);
    }
    pto_wm_hot(&w->wm, pto_now_ns() + PTO_HOT_NS, false);
    pto_sched_draining(&w->sched, false);
    return rc;
}

void pto_run_info_get(pto_run *r, pto_run_info *out)
{
    memset(out, 0, sizeof *out);
    if (!r) return;
    /* Ended, its counts are final: read them after. Ending (not done) so
     * that a wait for no live run, which run_done satisfies before done
     * shows, finds every run ended. */
    bool ended = atomic_load_explicit(&r->ending, memory_order_acquire);
    int64_t sub = atomic_load_explicit(&r->submitted, memory_order_acquire);
    out->id = r->id;
    out->submitted = sub == INT64_MAX ? r->o->submitted - r->base : sub;
    out->failed = atomic_load_explicit(&r->failed, memory_order_relaxed);
    out->completed = atomic_load_explicit(&r->completed, memory_order_relaxed);
    if (!ended) out->state = PTO_RUN_RUNNING;
    else if (atomic_load(&r->cancelled) && out->failed) out->state = PTO_RUN_CANCELLED;
    else out->state = out->failed ? PTO_RUN_FAILED : PTO_RUN_OK;
}

int pto_run_failure(pto_run *r, char *buf, size_t len)
{
    if (!r) return 0;
    pthread_mutex_lock(&r->mu);
    int has = r->failure != NULL;
    if (has && buf && len) snprintf(buf, len, "%s", r->failure);
    pthread_mutex_unlock(&r->mu);
    return has;
}

void pto_run_cancel(pto_worker *w, pto_run *r)
{
    if (!w || !r || atomic_load(&r->ending)) return;
    atomic_store(&r->cancelled, true);
    atomic_fetch_add_explicit(&w->sched.run_cancels, 1, memory_order_release);
    pto_event_notify(w->sched.ev);
}

void pto_run_free(pto_run *r)
{
    if (r) run_unref(r);
}

int64_t pto_runs_live(pto_worker *w) { return w ? atomic_load(&w->runs_out.live) : 0; }

int pto_runs_end(pto_worker *w)
{
    if (!w || !w->runs_out.open) return 0;
    if (w->runs_out.cur || atomic_load(&w->runs_out.live) > 0) {
        pto_set_error("submitted runs are still running on this Worker; wait for them first");
        return -1;
    }
    /* Every failure is its run's; the session's own (first of all) is not news. */
    int rc = pto_run_end(w);
    bool down = rc != 0 && atomic_load(&w->shutdown);
    pto_runs_destroy(&w->runs_out);
    if (down) {
        pto_set_error("the Worker was shut down before its runs drained");
        return -1;
    }
    return 1;
}
