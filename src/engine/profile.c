/* profile.c - the per-task timing of a Worker's last run (profile.h). */
#include "profile.h"
#include "common.h"
#include "worker.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define PROF_FIRST_CAP 256

/* Make room for item n of elem bytes in *arr (capacity *cap items), growing
 * up to max items; false when full or out of memory: the record is then not
 * kept. Growing here, not up front, keeps an idle or small Worker small. */
static bool room(void **arr, int64_t n, int64_t *cap, int64_t max, size_t elem)
{
    if (PTO_LIKELY(n < *cap)) return true;
    if (*cap >= max) return false;
    int64_t c = *cap ? *cap * 2 : PROF_FIRST_CAP;
    if (c > max) c = max;
    void *b = realloc(*arr, (size_t)c * elem);
    if (!b) return false;
    *arr = b;
    *cap = c;
    return true;
}

/* Empty l, keeping its buffers for the next run. */
static void log_clear(pto_prof_log *l)
{
    for (int64_t i = 0; i < l->nerrors; i++) free(l->errors[i].msg);
    l->ntasks = l->nedges = l->nuses = l->nerrors = l->nscopes = l->dropped = 0;
}

static void log_free(pto_prof_log *l)
{
    log_clear(l);
    free(l->tasks);
    free(l->edges);
    free(l->uses);
    free(l->errors);
    free(l->scopes);
}

void pto_prof_run_begin(pto_profile *p)
{
    log_clear(&p->cur);
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
    p->run.tasks = p->cur.ntasks;
    p->run.dropped = p->cur.dropped;
    pto_prof_log older = p->last;
    p->last = p->cur;
    p->cur = older;
    log_clear(&p->cur);   /* the run before: its messages go now */
    p->last_run = p->run;
    p->have_last = 1;
}

void pto_prof_scope(pto_profile *p, uint32_t seq, uint32_t parent)
{
    pto_prof_log *l = &p->cur;
    /* Scopes are numbered in opening order, so the tree is an array; a scope
     * past the cap has no parent on record (readers take the run's own). */
    if ((int64_t)seq != l->nscopes + 1 ||
        !room((void **)&l->scopes, l->nscopes, &l->cap_scopes, PTO_PROF_SCOPE_CAP, sizeof *l->scopes))
        return;
    l->scopes[l->nscopes++] = parent;
}

void pto_prof_task(pto_profile *p, int64_t id, int64_t ready_by, uint64_t callable, int32_t kind, int32_t index,
                   int32_t member, uint64_t t0, uint64_t t1, int failed, uint32_t scope)
{
    pto_prof_log *l = &p->cur;
    if (PTO_UNLIKELY(l->ntasks == l->cap_tasks) &&
        !room((void **)&l->tasks, l->ntasks, &l->cap_tasks, PTO_PROF_CAP, sizeof *l->tasks)) {
        l->dropped++;
        return;
    }
    l->tasks[l->ntasks++] = (pto_profile_task){.start_ns = t0, .end_ns = t1 > t0 ? t1 : t0, .id = id,
                                               .ready_by = ready_by, .callable = callable, .kind = kind,
                                               .worker = index, .member = member, .failed = failed, .scope = scope};
}

void pto_prof_edge(pto_profile *p, int64_t consumer, int64_t producer)
{
    pto_prof_log *l = &p->cur;
    if (!room((void **)&l->edges, l->nedges, &l->cap_edges, PTO_PROF_EDGE_CAP, 2 * sizeof *l->edges)) return;
    l->edges[2 * l->nedges] = consumer;
    l->edges[2 * l->nedges + 1] = producer;
    l->nedges++;
}

void pto_prof_use(pto_profile *p, int64_t id, int64_t alloc)
{
    pto_prof_log *l = &p->cur;
    if (!room((void **)&l->uses, l->nuses, &l->cap_uses, PTO_PROF_USE_CAP, 2 * sizeof *l->uses)) return;
    l->uses[2 * l->nuses] = id;
    l->uses[2 * l->nuses + 1] = alloc;
    l->nuses++;
}

void pto_prof_error(pto_profile *p, int64_t id, const char *msg)
{
    pto_prof_log *l = &p->cur;
    if (!room((void **)&l->errors, l->nerrors, &l->cap_errors, PTO_PROF_ERROR_CAP, sizeof *l->errors)) return;
    size_t n = strlen(msg);
    if (n > PTO_PROF_ERROR_BYTES) {   /* cut on a UTF-8 character boundary: a broken one would spoil the rest */
        n = PTO_PROF_ERROR_BYTES;
        while (n > 0 && ((unsigned char)msg[n] & 0xC0) == 0x80) n--;
    }
    char *m = malloc(n + 1);
    if (!m) return;
    memcpy(m, msg, n);
    m[n] = 0;
    l->errors[l->nerrors++] = (pto_prof_failure){id, m};
}

void pto_prof_free(pto_profile *p)
{
    log_free(&p->cur);
    log_free(&p->last);
    memset(p, 0, sizeof *p);
}

/* The last run's log, or NULL (with the error set) if no run has ended. */
static const pto_prof_log *last_log(pto_worker *w, int quiet)
{
    if (w && w->sched.prof.have_last) return &w->sched.prof.last;
    if (quiet) return NULL;
    if (!w) pto_set_error("no Worker");
    else pto_set_error("no run has ended on this Worker yet: the profile covers the last run that ended");
    return NULL;
}

int64_t pto_profile_get(pto_worker *w, pto_profile_run *run, pto_profile_task *out, int64_t cap)
{
    const pto_prof_log *l = last_log(w, 0);
    if (!l) return -1;
    if (run) *run = w->sched.prof.last_run;
    int64_t n = cap < l->ntasks ? cap : l->ntasks;
    if (out && n > 0) memcpy(out, l->tasks, (size_t)n * sizeof *out);   /* tasks is NULL before any record */
    return l->ntasks;
}

/* Copy at most cap (of n) pairs from v into out: the pair getters' common part. */
static int64_t pairs(const int64_t *v, int64_t n, int64_t *out, int64_t cap)
{
    int64_t k = cap < n ? cap : n;
    if (out && k > 0) memcpy(out, v, (size_t)k * 2 * sizeof *out);   /* v is NULL before any pair */
    return n;
}

int64_t pto_profile_edges(pto_worker *w, int64_t *out, int64_t cap)
{
    const pto_prof_log *l = last_log(w, 1);
    return l ? pairs(l->edges, l->nedges, out, cap) : -1;
}

int64_t pto_profile_alloc_uses(pto_worker *w, int64_t *out, int64_t cap)
{
    const pto_prof_log *l = last_log(w, 1);
    return l ? pairs(l->uses, l->nuses, out, cap) : -1;
}

int64_t pto_profile_scopes(pto_worker *w, uint32_t *parent, int64_t cap)
{
    const pto_prof_log *l = last_log(w, 1);
    if (!l) return -1;
    int64_t k = cap < l->nscopes ? cap : l->nscopes;
    if (parent && k > 0) memcpy(parent, l->scopes, (size_t)k * sizeof *parent);
    return l->nscopes;
}

const char *pto_profile_error(pto_worker *w, int64_t i, int64_t *id)
{
    const pto_prof_log *l = last_log(w, 1);
    if (!l || i < 0 || i >= l->nerrors) return NULL;
    if (id) *id = l->errors[i].id;
    return l->errors[i].msg;
}
