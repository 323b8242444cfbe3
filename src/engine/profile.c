/* profile.c - the per-task timing of a Worker's last run (profile.h). */
#include "profile.h"
#include "common.h"
#include "worker.h"

#include <stdlib.h>
#include <string.h>

#define PROF_FIRST_CAP 256

void pto_prof_run_begin(pto_profile *p)
{
    p->ncur = 0;
    p->necur = 0;
    p->dropped_cur = 0;
    int64_t n = p->run.run;
    memset(&p->run, 0, sizeof p->run);
    p->run.run = n + 1;
    p->run.begin_ns = pto_now_ns();
}

void pto_prof_waited(pto_profile *p, uint64_t t0)
{
    if (p->run.begin_ns && !p->run.drain_ns) p->run.waited_ns += pto_now_ns() - t0;
}

void pto_prof_run_draining(pto_profile *p) { p->run.drain_ns = pto_now_ns(); }

void pto_prof_run_end(pto_profile *p)
{
    p->run.end_ns = pto_now_ns();
    p->run.tasks = p->ncur;
    p->run.dropped = p->dropped_cur;
    pto_profile_task *b = p->last;
    int64_t cap = p->cap_last;
    p->last = p->cur;
    p->cap_last = p->cap_cur;
    p->nlast = p->ncur;
    p->cur = b;
    p->cap_cur = cap;
    p->ncur = 0;
    int64_t *e = p->elast;
    cap = p->ecap_last;
    p->elast = p->ecur;
    p->ecap_last = p->ecap_cur;
    p->nelast = p->necur;
    p->ecur = e;
    p->ecap_cur = cap;
    p->necur = 0;
    p->last_run = p->run;
    p->have_last = 1;
}

void pto_prof_task(pto_profile *p, int64_t id, int64_t ready_by, uint64_t callable, int32_t kind, int32_t index,
                   int32_t member, uint64_t t0, uint64_t t1, int failed, uint32_t scope)
{
    if (PTO_UNLIKELY(p->ncur == p->cap_cur)) {
        if (p->cap_cur >= PTO_PROF_CAP) {
            p->dropped_cur++;
            return;
        }
        /* Growing here, not up front, keeps an idle or small Worker small. */
        int64_t cap = p->cap_cur ? p->cap_cur * 2 : PROF_FIRST_CAP;
        pto_profile_task *b = realloc(p->cur, (size_t)cap * sizeof *b);
        if (!b) {
            p->dropped_cur++;
            return;
        }
        p->cur = b;
        p->cap_cur = cap;
    }
    p->cur[p->ncur++] = (pto_profile_task){.start_ns = t0, .end_ns = t1 > t0 ? t1 : t0, .id = id,
                                           .ready_by = ready_by, .callable = callable, .kind = kind,
                                           .worker = index, .member = member, .failed = failed, .scope = scope};
}

void pto_prof_edge(pto_profile *p, int64_t consumer, int64_t producer)
{
    if (PTO_UNLIKELY(p->necur == p->ecap_cur)) {
        if (p->ecap_cur >= PTO_PROF_EDGE_CAP) return;
        int64_t cap = p->ecap_cur ? p->ecap_cur * 2 : PROF_FIRST_CAP;
        int64_t *b = realloc(p->ecur, (size_t)cap * 2 * sizeof *b);
        if (!b) return;
        p->ecur = b;
        p->ecap_cur = cap;
    }
    p->ecur[2 * p->necur] = consumer;
    p->ecur[2 * p->necur + 1] = producer;
    p->necur++;
}

void pto_prof_free(pto_profile *p)
{
    free(p->cur);
    free(p->last);
    free(p->ecur);
    free(p->elast);
    memset(p, 0, sizeof *p);
}

int64_t pto_profile_get(pto_worker *w, pto_profile_run *run, pto_profile_task *out, int64_t cap)
{
    if (!w) {
        pto_set_error("no Worker");
        return -1;
    }
    const pto_profile *p = &w->sched.prof;
    if (!p->have_last) {
        pto_set_error("no run has ended on this Worker yet: the profile covers the last run that ended");
        return -1;
    }
    if (run) *run = p->last_run;
    int64_t n = cap < p->nlast ? cap : p->nlast;
    if (out && n > 0) memcpy(out, p->last, (size_t)n * sizeof *out);   /* last is NULL before any record */
    return p->nlast;
}

int64_t pto_profile_edges(pto_worker *w, int64_t *out, int64_t cap)
{
    if (!w || !w->sched.prof.have_last) return -1;
    const pto_profile *p = &w->sched.prof;
    int64_t n = cap < p->nelast ? cap : p->nelast;
    if (out && n > 0) memcpy(out, p->elast, (size_t)n * 2 * sizeof *out);   /* elast is NULL before any edge */
    return p->nelast;
}
