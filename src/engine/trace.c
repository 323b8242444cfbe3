#include "trace.h"
#include "common.h"
#include "slot.h"
#include "worker.h"
#include "diag.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRACE_DEFAULT_EVENTS (1u << 20)
#define TRACE_MAX_EVENTS (1u << 26)

/* One epoch for every Worker of the process, so traces of several Workers
 * merged into one file (ptolua --trace) share a time axis. */
static _Atomic uint64_t trace_epoch;

/* ---- recording (any engine thread) ------------------------------------------ */

/* Claim a slot, or NULL when the trace is off or full (the event is then
 * dropped, and counted by `next` running past `cap`). A non-NULL claim
 * must be followed by release(). The seq_cst increment of `active` before
 * the seq_cst load of `enabled` pairs with stop's store-then-load, so stop
 * never reads the buffer while a writer that saw the trace on is in it. */
static pto_trace_event *claim(pto_trace *t)
{
    atomic_fetch_add_explicit(&t->active, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&t->enabled, memory_order_seq_cst)) {
        uint64_t i = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
        if (i < t->cap) return &t->buf[i];
    }
    atomic_fetch_sub_explicit(&t->active, 1, memory_order_release);
    return NULL;
}

static void release(pto_trace *t) { atomic_fetch_sub_explicit(&t->active, 1, memory_order_release); }

/* Submitted runs share one engine run (run.h): `run` stays the engine's, so
 * flows still pair by (run, task), and this names the run handle's. */
static inline int32_t submitted_run(const pto_slot *s) { return s->run ? (int32_t)s->run->id : 0; }

void pto_trace_task(pto_trace *t, const pto_worker_thread *wt, const pto_slot *s, int32_t member, uint64_t t0,
                    uint64_t t1, int status)
{
    pto_trace_event *e = claim(t);
    if (!e) return;
    *e = (pto_trace_event){.t0 = t0, .t1 = t1, .id = s->id, .callable = s->callable,
                           .arg = s->group_size, .run = atomic_load_explicit(&t->run, memory_order_relaxed),
                           .index = (int16_t)wt->index,
                           .member = (int16_t)member, .type = PTO_TEV_TASK, .kind = (int8_t)wt->kind,
                           .status = status ? PTO_TEV_FAILED : PTO_TEV_OK, .submitted_run = submitted_run(s)};
    release(t);
}

void pto_trace_submit(pto_trace *t, const pto_slot *s, uint64_t t0)
{
    uint64_t t1 = pto_now_ns();
    int32_t run = atomic_load_explicit(&t->run, memory_order_relaxed);
    int64_t producers = 0;
    for (int32_t i = 0; i < s->nrefs; i++) {
        if (!s->refs[i].dep) continue;
        producers++;
        pto_trace_event *e = claim(t);
        if (!e) continue;
        *e = (pto_trace_event){.t0 = t1, .t1 = t1, .id = s->id, .arg = s->refs[i].slot->id, .run = run,
                               .type = PTO_TEV_EDGE, .kind = s->kind};
        release(t);
    }
    pto_trace_event *e = claim(t);
    if (!e) return;
    *e = (pto_trace_event){.t0 = t0, .t1 = t1, .id = s->id, .arg = producers, .callable = s->callable, .run = run,
                           .type = PTO_TEV_SUBMIT, .kind = s->kind, .submitted_run = submitted_run(s)};
    release(t);
}

void pto_trace_stall(pto_trace *t, int32_t ring, uint64_t bytes, uint64_t t0, uint64_t t1)
{
    pto_trace_event *e = claim(t);
    if (!e) return;
    *e = (pto_trace_event){.t0 = t0, .t1 = t1, .id = -1, .arg = (int64_t)bytes,
                           .run = atomic_load_explicit(&t->run, memory_order_relaxed), .type = PTO_TEV_STALL,
                           .kind = -1, .ring = (int8_t)ring};
    release(t);
}

void pto_trace_run_begin(pto_trace *t)
{
    atomic_fetch_add_explicit(&t->run, 1, memory_order_relaxed);
    t->run_t0 = pto_now_ns();
}

void pto_trace_run_end(pto_trace *t)
{
    uint64_t t1 = pto_now_ns();
    pto_trace_event *e = claim(t);
    if (!e) return;
    *e = (pto_trace_event){.t0 = t->run_t0, .t1 = t1, .id = -1,
                           .run = atomic_load_explicit(&t->run, memory_order_relaxed), .type = PTO_TEV_RUN,
                           .kind = -1};
    release(t);
}

static void drop_json(pto_trace *t)
{
    free(t->json);
    free(t->json_name);
    t->json = t->json_name = NULL;
    t->json_len = 0;
}

static void drop_extra(pto_trace *t)
{
    free(t->extra);
    t->extra = NULL;
    t->extra_len = 0;
}

void pto_trace_free(pto_trace *t)
{
    if (!t) return;
    drop_json(t);
    drop_extra(t);
    free(t->buf);
    free(t);
}

/* ---- control (the Worker's user thread) -------------------------------------- */

static pto_trace *trace_of(pto_worker *w) { return w ? atomic_load_explicit(&w->wm.trace, memory_order_acquire) : NULL; }

int pto_trace_start(pto_worker *w, uint32_t capacity_events)
{
    if (!w) {
        pto_set_error("no Worker");
        return -1;
    }
    if (capacity_events == 0) capacity_events = TRACE_DEFAULT_EVENTS;
    if (capacity_events > TRACE_MAX_EVENTS) {
        pto_set_error("a trace buffer holds at most %u events (asked for %u); record a shorter stretch instead",
                      TRACE_MAX_EVENTS, capacity_events);
        return -1;
    }
    pto_trace *t = trace_of(w);
    if (t && atomic_load(&t->enabled)) {
        pto_set_error("this Worker is already tracing; stop that trace first");
        return -1;
    }
    uint64_t zero = 0, now = pto_now_ns();
    atomic_compare_exchange_strong(&trace_epoch, &zero, now);
    bool fresh = !t;
    if (fresh) t = pto_xcalloc(1, sizeof *t);
    /* Writers never touch buf while the trace is off, so it may change here. */
    if (t->cap != capacity_events) {
        free(t->buf);
        t->buf = pto_xmalloc((size_t)capacity_events * sizeof *t->buf);
        t->cap = capacity_events;
    }
    drop_json(t);
    drop_extra(t);
    pto_diag_trace_reset(&w->wm);
    atomic_store_explicit(&t->next, 0, memory_order_relaxed);
    atomic_store_explicit(&t->run, (int32_t)w->runs, memory_order_relaxed);
    t->run_t0 = now;   /* a trace started inside a run shows that run from here */
    t->recorded = t->dropped = 0;
    if (fresh) atomic_store_explicit(&w->wm.trace, t, memory_order_release);
    atomic_store_explicit(&t->enabled, true, memory_order_seq_cst);
    return 0;
}

static void counts(const pto_trace *t, int64_t *recorded, int64_t *dropped)
{
    uint64_t n = atomic_load_explicit(&t->next, memory_order_relaxed);
    uint64_t kept = n < t->cap ? n : t->cap;
    *recorded = (int64_t)kept;
    *dropped = (int64_t)(n - kept);
}

int pto_trace_active(pto_worker *w)
{
    pto_trace *t = trace_of(w);
    return t && atomic_load(&t->enabled) ? 1 : 0;
}

int64_t pto_trace_events(pto_worker *w)
{
    pto_trace *t = trace_of(w);
    if (!t) return 0;
    if (!atomic_load(&t->enabled)) return t->recorded;
    int64_t r, d;
    counts(t, &r, &d);
    return r;
}

int64_t pto_trace_dropped(pto_worker *w)
{
    pto_trace *t = trace_of(w);
    if (!t) return 0;
    if (!atomic_load(&t->enabled)) return t->dropped;
    int64_t r, d;
    counts(t, &r, &d);
    return d;
}

/* ---- JSON ---------------------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t len, cap;
} sbuf;

static void sb_reserve(sbuf *b, size_t more)
{
    if (b->len + more + 1 <= b->cap) return;
    size_t c = b->cap ? b->cap : 4096;
    while (c < b->len + more + 1) c *= 2;
    b->p = pto_xrealloc(b->p, c);
    b->cap = c;
}

__attribute__((format(printf, 2, 3))) static void sb_printf(sbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (!b->p || b->len + (size_t)n + 1 > b->cap) {
        sb_reserve(b, (size_t)n);
        va_start(ap, fmt);
        vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
    }
    b->len += (size_t)n;
}

/* Length of the well-formed UTF-8 sequence at c, or 0. */
static int utf8_len(const unsigned char *c)
{
    int n = c[0] >= 0xF0 && c[0] <= 0xF4 ? 4 : c[0] >= 0xE0 ? 3 : c[0] >= 0xC2 && c[0] < 0xE0 ? 2 : 0;
    for (int i = 1; i < n; i++)
        if ((c[i] & 0xC0) != 0x80) return 0;
    return n;
}

/* A JSON string: names come from users (Lua sub names, kernel symbols), so
 * quotes, control characters and bytes that are not UTF-8 (which JSON
 * readers reject) are escaped or replaced by '?'. */
static void sb_str(sbuf *b, const char *s)
{
    sb_reserve(b, strlen(s) * 6 + 2);
    b->p[b->len++] = '"';
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') {
            b->p[b->len++] = '\\';
            b->p[b->len++] = (char)*c;
        } else if (*c < 0x20) {
            b->len += (size_t)snprintf(b->p + b->len, 7, "\\u%04x", *c);
        } else if (*c < 0x80) {
            b->p[b->len++] = (char)*c;
        } else {
            int n = utf8_len(c);
            if (n == 0) {
                b->p[b->len++] = '?';
                continue;
            }
            memcpy(b->p + b->len, c, (size_t)n);
            b->len += (size_t)n;
            c += n - 1;
        }
    }
    b->p[b->len++] = '"';
    b->p[b->len] = 0;
}

/* Microseconds (the format's unit) with the nanoseconds kept as decimals. */
static void sb_us(sbuf *b, uint64_t ns) { sb_printf(b, "%" PRIu64 ".%03u", ns / 1000, (unsigned)(ns % 1000)); }

static void sb_ts(sbuf *b, uint64_t t, uint64_t epoch) { sb_us(b, t > epoch ? t - epoch : 0); }

typedef struct names {
    pto_callable_name *v;
    int32_t n;
    int32_t last;
} names;

static void names_copy(pto_scheduler *s, names *out)
{
    pthread_mutex_lock(&s->fail_mu);
    out->n = s->nnames;
    out->v = pto_xcalloc((size_t)(out->n ? out->n : 1), sizeof *out->v);
    for (int32_t i = 0; i < out->n; i++) {
        out->v[i] = s->names[i];
        out->v[i].name = pto_xstrdup(s->names[i].name);
    }
    pthread_mutex_unlock(&s->fail_mu);
    out->last = 0;
}

static void names_free(names *n)
{
    for (int32_t i = 0; i < n->n; i++) free(n->v[i].name);
    free(n->v);
}

static const char *name_of(names *n, int32_t kind, uint64_t callable)
{
    if (n->n && n->v[n->last].kind == kind && n->v[n->last].callable == callable) return n->v[n->last].name;
    for (int32_t i = 0; i < n->n; i++)
        if (n->v[i].kind == kind && n->v[i].callable == callable) {
            n->last = i;
            return n->v[i].name;
        }
    return NULL;
}

static void sb_name(sbuf *b, names *n, const char *prefix, int32_t kind, uint64_t callable)
{
    const char *nm = kind >= 0 ? name_of(n, kind, callable) : NULL;
    char tmp[512];
    if (nm) snprintf(tmp, sizeof tmp, "%s%s", prefix, nm);
    else snprintf(tmp, sizeof tmp, "%scallable %" PRIu64, prefix, callable);
    sb_str(b, tmp);
}

static int32_t tid_of(const pto_worker *w, int32_t kind, int32_t index)
{
    return 1 + (kind == PTO_SUB ? w->wm.count[PTO_NEXT_LEVEL] : 0) + index;
}

typedef struct span_key {
    int32_t run;
    int32_t member;
    int64_t id;
    uint32_t ev;
} span_key;

static int span_cmp(const void *a, const void *b)
{
    const span_key *x = a, *y = b;
    if (x->run != y->run) return x->run < y->run ? -1 : 1;
    if (x->id != y->id) return x->id < y->id ? -1 : 1;
    return x->member < y->member ? -1 : x->member > y->member;
}

/* The span of task id in run (its lowest member), or NULL. */
static const pto_trace_event *find_span(const pto_trace *t, const span_key *keys, size_t n, int32_t run, int64_t id)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (keys[mid].run < run || (keys[mid].run == run && keys[mid].id < id)) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && keys[lo].run == run && keys[lo].id == id ? &t->buf[keys[lo].ev] : NULL;
}

static void meta(sbuf *b, bool *first, int32_t pid, int32_t tid, const char *what, const char *key, const char *s,
                 int64_t v)
{
    sb_printf(b, "%s{\"name\":\"%s\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"%s\":", *first ? "" : ",\n", what,
              pid, tid, key);
    if (s) sb_str(b, s);
    else sb_printf(b, "%" PRId64, v);
    sb_printf(b, "}}");
    *first = false;
}

/* The metadata events: names and order of the process and its threads. */
static void format_meta(pto_worker *w, pto_trace *t, int32_t pid, const char *pname, sbuf *b, bool *first)
{
    char label[160];
    if (!pname) {
        snprintf(label, sizeof label, "Worker (level %d, %s mode)", w->cfg.level,
                 w->cfg.mode == PTO_MODE_PROCESS ? "process" : "thread");
        pname = label;
    }
    meta(b, first, pid, 0, "process_name", "name", pname, 0);
    meta(b, first, pid, 0, "process_sort_index", "sort_index", NULL, pid);
    if (t->dropped) {
        snprintf(label, sizeof label, "dropped %" PRId64 " events (buffer of %u)", t->dropped, t->cap);
        meta(b, first, pid, 0, "process_labels", "labels", label, 0);
    }
    meta(b, first, pid, 0, "thread_name", "name", "orchestrator", 0);
    meta(b, first, pid, 0, "thread_sort_index", "sort_index", NULL, 0);
    for (int32_t k = 0; k < PTO_KINDS; k++)
        for (int32_t i = 0; i < w->wm.count[k]; i++) {
            int32_t tid = tid_of(w, k, i);
            meta(b, first, pid, tid, "thread_name", "name", w->wm.threads[k][i]->name, 0);
            meta(b, first, pid, tid, "thread_sort_index", "sort_index", NULL, tid);
        }
}

/* One complete ("X") event for e: a task, submit, stall or run slice. */
static void format_slice(pto_worker *w, const pto_trace_event *e, int32_t pid, uint64_t epoch, names *nm, sbuf *b)
{
    sb_printf(b, ",\n{\"name\":");
    int32_t tid = 0;
    switch (e->type) {
    case PTO_TEV_TASK:
        tid = tid_of(w, e->kind, e->index);
        sb_name(b, nm, "", e->kind, e->callable);
        sb_printf(b, ",\"cat\":\"task\"");
        break;
    case PTO_TEV_SUBMIT:
        sb_name(b, nm, "submit ", e->kind, e->callable);
        sb_printf(b, ",\"cat\":\"submit\"");
        break;
    case PTO_TEV_STALL:
        sb_printf(b, "\"stall: heap ring %d full\",\"cat\":\"stall\"", e->ring);
        break;
    default:
        sb_printf(b, "\"run %d\",\"cat\":\"run\"", e->run);
        break;
    }
    sb_printf(b, ",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":", pid, tid);
    sb_ts(b, e->t0, epoch);
    sb_printf(b, ",\"dur\":");
    sb_us(b, e->t1 > e->t0 ? e->t1 - e->t0 : 0);
    sb_printf(b, ",\"args\":{\"run\":%d", e->run);
    switch (e->type) {
    case PTO_TEV_TASK:
        sb_printf(b, ",\"task\":%" PRId64 ",\"callable\":%" PRIu64 ",\"worker\":", e->id, e->callable);
        sb_str(b, w->wm.threads[e->kind][e->index]->name);
        sb_printf(b, ",\"status\":\"%s\"", e->status == PTO_TEV_OK ? "ok" : "failed");
        if (e->arg > 1) sb_printf(b, ",\"member\":%d,\"group_size\":%" PRId64, e->member, e->arg);
        if (e->submitted_run) sb_printf(b, ",\"submitted_run\":%d", e->submitted_run);
        break;
    case PTO_TEV_SUBMIT:
        sb_printf(b, ",\"task\":%" PRId64 ",\"kind\":\"%s\",\"producers\":%" PRId64, e->id,
                  e->kind == PTO_SUB ? "sub" : "next_level", e->arg);
        if (e->submitted_run) sb_printf(b, ",\"submitted_run\":%d", e->submitted_run);
        break;
    case PTO_TEV_STALL:
        sb_printf(b, ",\"ring\":%d,\"bytes\":%" PRId64, e->ring, e->arg);
        break;
    default:
        break;
    }
    sb_printf(b, "}}");
}

/* The flow ("s" and "f") events of every dependency edge whose both ends
 * ran while recording; keys (sorted) find the task spans. */
static void format_flows(pto_worker *w, pto_trace *t, int32_t pid, uint64_t epoch, const span_key *keys,
                         size_t nspans, sbuf *b)
{
    uint64_t flow = (uint64_t)pid << 32;
    for (int64_t i = 0; i < t->recorded; i++) {
        const pto_trace_event *e = &t->buf[i];
        if (e->type != PTO_TEV_EDGE) continue;
        const pto_trace_event *p = find_span(t, keys, nspans, e->run, e->arg);
        const pto_trace_event *c = find_span(t, keys, nspans, e->run, e->id);
        if (!p || !c) continue;
        flow++;
        /* Bound to the slices that enclose these instants (their middles). */
        sb_printf(b, ",\n{\"name\":\"dep\",\"cat\":\"dep\",\"ph\":\"s\",\"id\":%" PRIu64 ",\"pid\":%d,\"tid\":%d,\"ts\":",
                  flow, pid, tid_of(w, p->kind, p->index));
        sb_ts(b, p->t0 + (p->t1 - p->t0) / 2, epoch);
        sb_printf(b, ",\"args\":{\"from\":%" PRId64 ",\"to\":%" PRId64 ",\"run\":%d}}", e->arg, e->id, e->run);
        sb_printf(b, ",\n{\"name\":\"dep\",\"cat\":\"dep\",\"ph\":\"f\",\"bp\":\"e\",\"id\":%" PRIu64
                     ",\"pid\":%d,\"tid\":%d,\"ts\":",
                  flow, pid, tid_of(w, c->kind, c->index));
        sb_ts(b, c->t0 + (c->t1 - c->t0) / 2, epoch);
        sb_printf(b, ",\"args\":{\"from\":%" PRId64 ",\"to\":%" PRId64 ",\"run\":%d}}", e->arg, e->id, e->run);
    }
}

/* The swimlane and PMU spans of tasks whose CallConfig asked (diag.c), on their task's track inside its span:
 * "kernel" (kernel start to end, with the PMU counts as args); from level 2 "dispatch" (task received to
 * kernel start) and "post" (kernel end to completion posted); from level 3 "handoff" (PROCESS mode: the
 * parent's post to the child's receipt); at level 4 the parts of dispatch and post: "dump in", "counters on",
 * "counters off", "dump out". */
static void format_diag(pto_worker *w, int32_t pid, uint64_t epoch, sbuf *b)
{
    static const struct {
        const char *name;
        int level, from, to;
    } SPANS[] = {
        {"kernel", 1, PTO_SWIM_KERNEL_START, PTO_SWIM_KERNEL_END},
        {"dispatch", 2, PTO_SWIM_RECEIVED, PTO_SWIM_KERNEL_START},
        {"post", 2, PTO_SWIM_KERNEL_END, PTO_SWIM_POSTED},
        {"handoff", 3, PTO_SWIM_HANDED, PTO_SWIM_RECEIVED},
        {"dump in", 4, PTO_SWIM_RECEIVED, PTO_SWIM_DUMPED_IN},
        {"counters on", 4, PTO_SWIM_DUMPED_IN, PTO_SWIM_KERNEL_START},
        {"counters off", 4, PTO_SWIM_KERNEL_END, PTO_SWIM_COUNTED},
        {"dump out", 4, PTO_SWIM_COUNTED, PTO_SWIM_POSTED},
    };
    int64_t n;
    pto_diag_span *sp = pto_diag_spans_copy(&w->wm, &n);
    for (int64_t i = 0; i < n; i++) {
        const pto_diag_span *s = &sp[i];
        for (size_t k = 0; k < sizeof SPANS / sizeof *SPANS; k++) {
            uint64_t t0 = s->ts[SPANS[k].from], t1 = s->ts[SPANS[k].to];
            if (s->level < SPANS[k].level || !t0 || !t1) continue;   /* THREAD mode has no hand-off point */
            sb_printf(b, ",\n{\"name\":\"%s\",\"cat\":\"swimlane\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":",
                      SPANS[k].name, pid, tid_of(w, s->kind, s->worker));
            sb_ts(b, t0, epoch);
            sb_printf(b, ",\"dur\":");
            sb_us(b, t1 > t0 ? t1 - t0 : 0);
            sb_printf(b, ",\"args\":{\"run\":%d,\"task\":%" PRId64 ",\"member\":%d", s->run, s->task, s->member);
            for (int32_t e = 0; k == 0 && e < s->pmu.count; e++)
                if (s->pmu.valid & (1u << e))
                    sb_printf(b, ",\"%s\":%" PRId64, pto_pmu_event_name(s->pmu.set, e), s->pmu.counts[e]);
            sb_printf(b, "}}");
        }
    }
    free(sp);
}

/* Every event of the stopped trace t of w, as comma-separated objects. */
static void format_events(pto_worker *w, pto_trace *t, int32_t pid, const char *pname, sbuf *b)
{
    uint64_t epoch = atomic_load(&trace_epoch);
    names nm;
    names_copy(&w->sched, &nm);
    bool first = true;
    format_meta(w, t, pid, pname, b, &first);
    size_t nspans = 0;
    span_key *keys = pto_xmalloc(sizeof *keys * (size_t)(t->recorded ? t->recorded : 1));
    for (int64_t i = 0; i < t->recorded; i++) {
        const pto_trace_event *e = &t->buf[i];
        if (e->type == PTO_TEV_EDGE) continue;
        if (e->type == PTO_TEV_TASK) keys[nspans++] = (span_key){e->run, e->member, e->id, (uint32_t)i};
        format_slice(w, e, pid, epoch, &nm, b);
    }
    format_diag(w, pid, epoch, b);
    /* Flows last: an edge is drawn only when both ends ran while recording. */
    qsort(keys, nspans, sizeof *keys, span_cmp);
    format_flows(w, t, pid, epoch, keys, nspans, b);
    free(keys);
    names_free(&nm);
}

/* The "name" .. "tid" head of a metadata event line ({"name":..,"ph":"M",
 * "pid":..,"tid":..,), which names what it sets; NULL for other lines. */
static size_t meta_key(const char *line, size_t len)
{
    static const char ph[] = "\"ph\":\"M\"";
    const char *args = NULL;
    for (size_t i = 0; i + sizeof ph - 1 <= len; i++)
        if (memcmp(line + i, ph, sizeof ph - 1) == 0) {
            for (size_t j = i; j + 7 <= len; j++)
                if (memcmp(line + j, "\"args\":", 7) == 0) {
                    args = line + j;
                    break;
                }
            break;
        }
    return args ? (size_t)(args - line) : 0;
}

/* Append the events of other processes (one event a line), leaving out a
 * metadata event already given for the same pid and thread: a Worker child
 * sends its names with every run, and a process named four times shows as
 * four in some viewers. heads: offsets in b of the metadata lines so far. */
static void append_extra(sbuf *b, const char *extra, size_t len)
{
    size_t nheads = 0, cap = 16;
    size_t *heads = pto_xmalloc(cap * sizeof *heads);
    for (const char *line = b->p; line && *line;) {   /* the metadata b already has */
        const char *nl = strchr(line, '\n');
        size_t n = nl ? (size_t)(nl - line) : strlen(line);
        if (meta_key(line, n)) {
            if (nheads == cap) heads = pto_xrealloc(heads, (cap *= 2) * sizeof *heads);
            heads[nheads++] = (size_t)(line - b->p);
        }
        line = nl ? nl + 1 : NULL;
    }
    const char *p = extra, *end = extra + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        size_t line_len = n > 0 && p[n - 1] == ',' ? n - 1 : n;   /* without its separator */
        size_t key = meta_key(p, line_len);
        bool dup = false;
        for (size_t i = 0; key && i < nheads && !dup; i++) dup = strncmp(b->p + heads[i], p, key) == 0;
        if (!dup && line_len) {
            sb_reserve(b, line_len + 2);
            if (b->len) memcpy(b->p + b->len, ",\n", 2), b->len += 2;
            if (key) {
                if (nheads == cap) heads = pto_xrealloc(heads, (cap *= 2) * sizeof *heads);
                heads[nheads++] = b->len;
            }
            memcpy(b->p + b->len, p, line_len);
            b->len += line_len;
            b->p[b->len] = 0;
        }
        p += n + (nl ? 1 : 0);
    }
    free(heads);
}

/* The stopped trace's events, formatted once per (pid, name). */
static const char *events_json(pto_worker *w, pto_trace *t, int32_t pid, const char *name, size_t *len)
{
    if (!t->json || t->json_pid != pid || (name == NULL) != (t->json_name == NULL) ||
        (name && strcmp(name, t->json_name) != 0)) {
        drop_json(t);
        sbuf b = {0};
        sb_reserve(&b, 0);
        b.p[0] = 0;
        /* In a file of several Workers (a name is given), one that recorded
         * nothing (the parent-side copy of a PROCESS-mode Worker child, whose
         * runs were traced in its own process) adds no empty process. */
        if (!name || t->recorded || t->extra_len) format_events(w, t, pid, name, &b);
        if (t->extra_len) append_extra(&b, t->extra, t->extra_len);   /* other processes' events */
        t->json = b.p;
        t->json_len = b.len;
        t->json_pid = pid;
        t->json_name = name ? pto_xstrdup(name) : NULL;
    }
    *len = t->json_len;
    return t->json;
}

int pto_trace_stop(pto_worker *w, const char *path)
{
    pto_trace *t = trace_of(w);
    if (!t || !atomic_load(&t->enabled)) {
        pto_set_error("this Worker is not tracing; start a trace first");
        return -1;
    }
    atomic_store_explicit(&t->enabled, false, memory_order_seq_cst);
    /* Writers finish in a few instructions; none of them ever waits. */
    while (atomic_load_explicit(&t->active, memory_order_seq_cst) != 0) pto_cpu_relax();
    counts(t, &t->recorded, &t->dropped);
    if (!path) return 0;
    size_t len;
    const char *ev = events_json(w, t, 1, NULL, &len);
    FILE *f = fopen(path, "w");
    if (!f) {
        pto_set_error("cannot write the trace to '%s': %s", path, strerror(errno));
        return -1;
    }
    fprintf(f, "{\"traceEvents\":[\n");
    fwrite(ev, 1, len, f);
    fprintf(f, "\n],\n\"displayTimeUnit\":\"ns\",\n\"otherData\":{\"recorded_events\":%" PRId64
               ",\"dropped_events\":%" PRId64 ",\"capacity_events\":%u}}\n",
            t->recorded, t->dropped, t->cap);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        pto_set_error("cannot write the trace to '%s': %s", path, strerror(errno ? errno : EIO));
        return -1;
    }
    return 0;
}

int pto_trace_attach(pto_worker *w, const char *events, size_t len)
{
    pto_trace *t = trace_of(w);
    if (!t) {
        pto_set_error("this Worker has no trace to attach events to");
        return -1;
    }
    if (!len) return 0;
    t->extra = pto_xrealloc(t->extra, t->extra_len + len + 3);
    if (t->extra_len) memcpy(t->extra + t->extra_len, ",\n", 2), t->extra_len += 2;
    memcpy(t->extra + t->extra_len, events, len);
    t->extra_len += len;
    t->extra[t->extra_len] = 0;
    drop_json(t);
    return 0;
}

uint64_t pto_trace_epoch(void) { return atomic_load(&trace_epoch); }

void pto_trace_set_epoch(uint64_t epoch_ns) { atomic_store(&trace_epoch, epoch_ns); }

int64_t pto_trace_format(pto_worker *w, int32_t pid, const char *name, char *buf, size_t cap)
{
    pto_trace *t = trace_of(w);
    if (!t || atomic_load(&t->enabled)) {
        pto_set_error("this Worker has no stopped trace to format");
        return -1;
    }
    size_t len;
    const char *ev = events_json(w, t, pid, name, &len);
    if (buf && cap) {
        size_t n = len < cap - 1 ? len : cap - 1;
        memcpy(buf, ev, n);
        buf[n] = 0;
    }
    return (int64_t)len;
}

/* Here rather than in worker.c: names matter to the tools that show a run. */
int pto_worker_callable_name_get(pto_worker *w, int32_t kind, uint64_t callable, char *buf, size_t cap)
{
    if (!w || !pto_kind_valid(kind)) return -1;
    pto_scheduler *s = &w->sched;
    int n = -1;
    pthread_mutex_lock(&s->fail_mu);
    for (int32_t i = 0; i < s->nnames; i++)
        if (s->names[i].kind == kind && s->names[i].callable == callable)
            n = snprintf(buf, buf ? cap : 0, "%s", s->names[i].name);
    pthread_mutex_unlock(&s->fail_mu);
    return n;
}
