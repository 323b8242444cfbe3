/* diag.c - what a CallConfig's diagnostic fields do (diag.h, docs/tracing.md).
 *
 * Files. Everything goes under the task's output_prefix P, named by run:
 * R = "p<pid>w<serial>r<run>" (the Worker's process, a per-process Worker
 * serial, its run number), so several Workers and runs never share a file.
 *   P.R.index            tensor dump index: a header line, then one line per
 *                        dumped tensor, appended by whoever ran the task
 *   P.R.t<task>.m<member>.a<arg>.<in|out>   the raw bytes of one dump
 *   P.R.deps, P.R.dot    the dependencies as the orchestrator inferred them; .deps
 *                        also each consumer as the scheduler wired it
 *   P.R.swimlane.w<worker>.tsv             swimlane points, per worker
 * The orchestrator creates the index (and the dependency files) at the first
 * submit that names P in a run: a missing or unwritable P is then an error
 * at that submit, not a silence in a child. Children append whole lines
 * with one write(2) to an O_APPEND file, so lines of concurrent children
 * never interleave.
 *
 * Counters. enable_pmu = N opens set N's events with perf_event_open(2)
 * around the leaf call, on the calling thread (inherit: threads the kernel
 * starts count too). An event the machine refuses is said once per process
 * on stderr and left out; the task runs either way. The dispatcher keeps the
 * counts per task id for pto_task_pmu_get, under a mutex: only tasks that
 * asked take it.
 *
 * Nothing here runs unless a field is set: the execution sites test
 * pto_diag_wanted(), the orchestrator tests the fields at submit. */
#include "diag.h"
#include "common.h"
#include "orchestrator.h"
#include "slot.h"
#include "tensormap.h"
#include "trace.h"
#include "worker.h"
#include "worker_manager.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/perf_event.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

/* ---- the per-Worker store ------------------------------------------------- */

typedef struct diag_prefix {
    char *prefix;
    FILE *deps, *dot;              /* enable_dep_gen: open until the run ends */
    struct diag_prefix *next;
} diag_prefix;

typedef struct pto_diag {
    pthread_mutex_t mu;            /* pmu, npmu (dispatchers write, the orchestrator reads) */
    pto_pmu_sample *pmu;           /* by task id */
    int64_t npmu;
    int32_t serial;
    int64_t run;
    char run_tag[PTO_DIAG_RUN_LEN];
    diag_prefix *prefixes;         /* orchestrator only: prefixes set up this run */
    pto_diag_span *spans;          /* under mu: kept for the trace while it records */
    int64_t nspans, spans_cap;
} pto_diag;

static _Atomic int32_t worker_serial;

static void set_run_tag(pto_diag *d, int64_t run)
{
    d->run = run;
    snprintf(d->run_tag, sizeof d->run_tag, "p%dw%dr%" PRId64, (int)getpid(), (int)d->serial, run);
}

/* Orchestrator: the store, made by the first submit that asks for diagnostics.
 * The scheduler hand-over publishes it to the dispatchers of that task. */
static pto_diag *store(pto_worker_manager *wm)
{
    if (!wm->diag) {
        pto_diag *d = pto_xcalloc(1, sizeof *d);
        pthread_mutex_init(&d->mu, NULL);
        d->serial = atomic_fetch_add(&worker_serial, 1);
        set_run_tag(d, wm->diag_run);
        wm->diag = d;
    }
    return wm->diag;
}

static void prefixes_close(pto_diag *d)
{
    for (diag_prefix *p = d->prefixes, *next; p; p = next) {
        next = p->next;
        if (p->deps) fclose(p->deps);
        if (p->dot) {
            fputs("}\n", p->dot);
            fclose(p->dot);
        }
        free(p->prefix);
        free(p);
    }
    d->prefixes = NULL;
}

void pto_diag_run_begin(pto_worker_manager *wm, int64_t run)
{
    wm->diag_run = run;
    pto_diag *d = wm->diag;
    if (!d) return;
    prefixes_close(d);
    pthread_mutex_lock(&d->mu);
    d->npmu = 0;
    pthread_mutex_unlock(&d->mu);
    set_run_tag(d, run);
}

void pto_diag_run_end(pto_worker_manager *wm)
{
    if (wm->diag) prefixes_close(wm->diag);
}

void pto_diag_free(pto_worker_manager *wm)
{
    pto_diag *d = wm->diag;
    if (!d) return;
    prefixes_close(d);
    pthread_mutex_destroy(&d->mu);
    free(d->pmu);
    free(d->spans);
    free(d);
    wm->diag = NULL;
}

/* ---- submit: the prefix and its files --------------------------------------- */

static FILE *open_new(const char *path, int flags)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | flags, 0644);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "w");
    if (!f) close(fd);
    return f;
}

static const char INDEX_HEADER[] =
    "# ptolua tensor dump v1: task callable worker member arg when tag dtype shape offset nbytes file fnv1a64\n";

static diag_prefix *prefix_setup(pto_diag *d, const pto_call_config *cfg)
{
    for (diag_prefix *p = d->prefixes; p; p = p->next)
        if (strcmp(p->prefix, cfg->output_prefix) == 0) return p;
    char path[PTO_OUTPUT_PREFIX_LEN + 2 * PTO_DIAG_RUN_LEN];
    snprintf(path, sizeof path, "%s.%s.index", cfg->output_prefix, d->run_tag);
    FILE *f = open_new(path, 0);
    if (!f) {
        pto_set_error("output_prefix '%s' cannot be written (creating %s: %s); give a prefix in an existing, "
                      "writable directory, like \"/tmp/dump/run\"",
                      cfg->output_prefix, path, strerror(errno));
        return NULL;
    }
    fputs(INDEX_HEADER, f);
    fclose(f);
    diag_prefix *p = pto_xcalloc(1, sizeof *p);
    p->prefix = pto_xstrdup(cfg->output_prefix);
    p->next = d->prefixes;
    d->prefixes = p;
    return p;
}

static bool dep_files(pto_diag *d, diag_prefix *p)
{
    if (p->deps) return true;
    char path[PTO_OUTPUT_PREFIX_LEN + 2 * PTO_DIAG_RUN_LEN];
    snprintf(path, sizeof path, "%s.%s.deps", p->prefix, d->run_tag);
    /* Appended to by the scheduler too (pto_diag_consumer, through its own descriptor): O_APPEND and a flush
     * per line, so each line is one write(2) at the end of the file and lines never cut into each other. */
    p->deps = open_new(path, O_APPEND);
    if (p->deps) setvbuf(p->deps, NULL, _IOLBF, 0);
    snprintf(path, sizeof path, "%s.%s.dot", p->prefix, d->run_tag);
    p->dot = p->deps ? open_new(path, 0) : NULL;
    if (!p->dot) {
        pto_set_error("output_prefix '%s' cannot be written (creating %s: %s)", p->prefix, path, strerror(errno));
        if (p->deps) fclose(p->deps);
        p->deps = NULL;
        return false;
    }
    fputs("# ptolua dependencies v1\n"
          "# task T callable C: a submitted task\n"
          "# edge P -> T arg A tensor BASE bytes [START, END) producer-range [PSTART, PEND): T reads bytes P wrote\n"
          "# consumer P -> T wired|done|failed: the scheduler wired T to P: T waits for P (wired), or P had\n"
          "#   already finished (done) or failed (failed: T will not run) and T does not wait\n",
          p->deps);
    fputs("digraph deps {\n  node [shape=box];\n", p->dot);
    fflush(p->deps);
    fflush(p->dot);
    return true;
}

bool pto_diag_submit_check(pto_worker_manager *wm, const pto_call_config *cfg)
{
    bool files = cfg->enable_dump_tensor || cfg->enable_dep_gen || cfg->enable_l2_swimlane;
    if (cfg->enable_pmu < 0 || cfg->enable_pmu > PTO_PMU_SETS) {
        pto_set_error("enable_pmu = %d selects no event set (use 0 for none, or 1..%d)", (int)cfg->enable_pmu,
                      PTO_PMU_SETS);
        return false;
    }
    if (cfg->enable_l2_swimlane < 0 || cfg->enable_l2_swimlane > 4) {
        pto_set_error("enable_l2_swimlane = %d is not a level (use 0 for none, or 1..4)", (int)cfg->enable_l2_swimlane);
        return false;
    }
    pto_diag *d = store(wm);
    if (!files || (cfg->enable_l2_swimlane && !cfg->enable_dump_tensor && !cfg->enable_dep_gen &&
                   !cfg->output_prefix[0]))
        return true;   /* swimlanes go into the trace when there is no prefix */
    if (!cfg->output_prefix[0]) {
        pto_set_error("%s needs an output_prefix to write to (set output_prefix = \"dir/name\" in the CallConfig)",
                      cfg->enable_dump_tensor ? "enable_dump_tensor" : "enable_dep_gen");
        return false;
    }
    diag_prefix *p = prefix_setup(d, cfg);
    if (!p) return false;
    return !cfg->enable_dep_gen || dep_files(d, p);
}

/* ---- dependency dump ---------------------------------------------------------- */

typedef struct dep_walk {
    const pto_slot *s;
    FILE *deps, *dot;
    int32_t arg;
    uint64_t base, start, end;
} dep_walk;

static bool is_producer(const pto_slot *s, const pto_slot *p)
{
    for (int32_t i = 0; i < s->nrefs; i++)
        if (s->refs[i].slot == p && s->refs[i].dep) return true;
    return false;
}

static void dep_entry(uint64_t base, const pto_tm_entry *e, void *arg)
{
    dep_walk *w = arg;
    if (base != w->base || !(e->start < w->end && w->start < e->end)) return;
    /* A producer that finished and was reclaimed before this submit is no edge: the engine drops it too. */
    if (!is_producer(w->s, e->producer)) return;
    fprintf(w->deps, "edge %" PRId64 " -> %" PRId64 " arg %d tensor 0x%" PRIx64 " bytes [%" PRIu64 ", %" PRIu64
            ") producer-range [%" PRIu64 ", %" PRIu64 ")\n",
            e->producer->id, w->s->id, (int)w->arg, base, w->start - base, w->end - base, e->start - base,
            e->end - base);
    fprintf(w->dot, "  t%" PRId64 " -> t%" PRId64 " [label=\"arg %d [%" PRIu64 ",%" PRIu64 ")\"];\n",
            e->producer->id, w->s->id, (int)w->arg, w->start - base, w->end - base);
}

void pto_diag_dep_gen(pto_orch *o, const pto_slot *s)
{
    pto_diag *d = o->sched->wm->diag;
    diag_prefix *p = NULL;
    if (d)
        for (p = d->prefixes; p && strcmp(p->prefix, s->cfg->cfg.output_prefix) != 0; p = p->next) {}
    if (!p || !p->deps) return;
    fprintf(p->deps, "task %" PRId64 " callable %" PRIu64 "\n", s->id, s->callable);
    fprintf(p->dot, "  t%" PRId64 " [label=\"task %" PRId64 "\\ncallable %" PRIu64 "\"];\n", s->id, s->id,
            s->callable);
    dep_walk w = {.s = s, .deps = p->deps, .dot = p->dot};
    for (int32_t m = 0; m < s->group_size; m++) {
        const pto_member *mb = &s->members[m];
        for (int32_t i = 0; i < mb->tensor_count; i++) {
            const pto_tensor *t = &mb->tensors[i];
            if (mb->tags[i] != PTO_INPUT && mb->tags[i] != PTO_INOUT) continue;
            w.arg = i + 1;
            w.base = t->base;
            w.start = t->base + t->offset;
            w.end = w.start + pto_tensor_nbytes(t);
            pto_tm_each(&o->tm, dep_entry, &w);
        }
    }
    fflush(p->deps);
    fflush(p->dot);
}

static bool write_all(int fd, const void *buf, size_t n);

/* Scheduler thread: the orchestrator keeps the FILE (and its list of prefixes) to itself, so this line goes
 * through a descriptor of its own, one write(2) with O_APPEND. The file exists: p's submit created it in this
 * run, and a run's files are closed only after all its tasks were wired (the run ends after its drain). */
void pto_diag_consumer(pto_worker_manager *wm, const pto_slot *p, const pto_slot *c, pto_diag_wiring how)
{
    static const char *const HOW[] = {"wired", "done", "failed"};
    pto_diag *d = wm->diag;
    if (!d || !p->cfg->cfg.output_prefix[0]) return;
    char path[PTO_OUTPUT_PREFIX_LEN + 2 * PTO_DIAG_RUN_LEN], line[96];
    snprintf(path, sizeof path, "%s.%s.deps", p->cfg->cfg.output_prefix, d->run_tag);
    int n = snprintf(line, sizeof line, "consumer %" PRId64 " -> %" PRId64 " %s\n", p->id, c->id, HOW[how]);
    int fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd < 0) return;
    if (n > 0 && (size_t)n < sizeof line) (void)write_all(fd, line, (size_t)n);
    close(fd);
}

/* ---- dispatcher side ------------------------------------------------------------- */

void pto_diag_prepare(pto_diag_task *d, pto_worker_manager *wm, const pto_slot *s, int32_t member, int32_t worker)
{
    const pto_member *m = &s->members[member];
    d->task_id = s->id;
    d->worker = worker;
    d->member = member;
    d->ntags = m->tensor_count < PTO_DIAG_MAX_TAGS ? m->tensor_count : PTO_DIAG_MAX_TAGS;
    if (d->ntags > 0) memcpy(d->tags, m->tags, (size_t)d->ntags);
    snprintf(d->run, sizeof d->run, "%s", wm->diag ? wm->diag->run_tag : "none");
    d->pmu_valid = 0;
    d->pmu_set = 0;
    memset(d->pmu, 0, sizeof d->pmu);
    memset(d->ts, 0, sizeof d->ts);
    d->child_pid = 0;
    d->trace_on = pto_trace_on(&wm->trace) != NULL;
}

/* Under st->mu: keep d for the trace (it formats the spans when it stops). */
static void keep_span(pto_diag *st, pto_worker_manager *wm, const pto_slot *s, const pto_diag_task *d)
{
    pto_trace *tr = pto_trace_on(&wm->trace);
    if (!tr || !d->ts[PTO_SWIM_KERNEL_START]) return;
    if (st->nspans == st->spans_cap) {
        st->spans_cap = st->spans_cap ? 2 * st->spans_cap : 64;
        st->spans = realloc(st->spans, (size_t)st->spans_cap * sizeof *st->spans);
        if (!st->spans) abort();
    }
    pto_diag_span *sp = &st->spans[st->nspans++];
    memset(sp, 0, sizeof *sp);
    sp->task = s->id;
    sp->run = atomic_load_explicit(&tr->run, memory_order_relaxed);
    sp->member = d->member;
    sp->kind = s->kind;
    sp->worker = d->worker;
    sp->level = s->cfg->cfg.enable_l2_swimlane;
    memcpy(sp->ts, d->ts, sizeof sp->ts);
    if (d->pmu_set) {
        sp->pmu.set = d->pmu_set;
        while (sp->pmu.count < PTO_PMU_MAX && pto_pmu_event_name(d->pmu_set, sp->pmu.count)) sp->pmu.count++;
        sp->pmu.valid = d->pmu_valid;
        sp->pmu.members = 1;
        memcpy(sp->pmu.counts, d->pmu, sizeof sp->pmu.counts);
    }
}

pto_diag_span *pto_diag_spans_copy(pto_worker_manager *wm, int64_t *n)
{
    pto_diag *st = wm->diag;
    *n = 0;
    if (!st) return NULL;
    pthread_mutex_lock(&st->mu);
    pto_diag_span *out = NULL;
    if (st->nspans) {
        out = pto_xmalloc((size_t)st->nspans * sizeof *out);
        memcpy(out, st->spans, (size_t)st->nspans * sizeof *out);
        *n = st->nspans;
    }
    pthread_mutex_unlock(&st->mu);
    return out;
}

void pto_diag_trace_reset(pto_worker_manager *wm)
{
    pto_diag *st = wm->diag;
    if (!st) return;
    pthread_mutex_lock(&st->mu);
    st->nspans = 0;
    pthread_mutex_unlock(&st->mu);
}

void pto_diag_finish(pto_worker_manager *wm, const pto_slot *s, const pto_diag_task *d)
{
    pto_diag *st = wm->diag;
    if (!st || s->id < 0) return;
    pthread_mutex_lock(&st->mu);
    if (d->trace_on) keep_span(st, wm, s, d);
    if (!d->pmu_set) {
        pthread_mutex_unlock(&st->mu);
        return;
    }
    if (s->id >= st->npmu) {
        int64_t n = st->npmu ? st->npmu : 64;
        while (n <= s->id) n *= 2;
        st->pmu = realloc(st->pmu, (size_t)n * sizeof *st->pmu);
        if (!st->pmu) abort();
        memset(st->pmu + st->npmu, 0, (size_t)(n - st->npmu) * sizeof *st->pmu);
        st->npmu = n;
    }
    pto_pmu_sample *o = &st->pmu[s->id];
    o->set = d->pmu_set;
    o->count = 0;
    while (o->count < PTO_PMU_MAX && pto_pmu_event_name(d->pmu_set, o->count)) o->count++;
    o->valid |= d->pmu_valid;
    o->members++;
    for (int i = 0; i < PTO_PMU_MAX; i++) o->counts[i] += d->pmu[i];
    pthread_mutex_unlock(&st->mu);
}

int pto_task_pmu_get(pto_orch *o, int64_t id, pto_pmu_sample *out)
{
    memset(out, 0, sizeof *out);
    if (!o || id < 0) return -1;
    pto_diag *st = o->sched->wm->diag;
    if (!st) return 0;
    pthread_mutex_lock(&st->mu);
    if (id < st->npmu) *out = st->pmu[id];
    pthread_mutex_unlock(&st->mu);
    return out->set ? 1 : 0;
}

int pto_profile_pmu_get(pto_worker *w, int64_t id, pto_pmu_sample *out)
{
    memset(out, 0, sizeof *out);
    const pto_profile *p = w ? &w->sched.prof : NULL;
    /* The store holds the counts of the run begun last: the profile's run only while no other began. */
    if (!p || id < 0 || !p->have_last || p->run.run != p->last_run.run) return -1;
    pto_diag *st = w->wm.diag;
    if (!st) return 0;
    pthread_mutex_lock(&st->mu);
    if (id < st->npmu) *out = st->pmu[id];
    pthread_mutex_unlock(&st->mu);
    return out->set ? 1 : 0;
}

/* ---- PMU event sets ----------------------------------------------------------------- */

typedef struct pmu_event {
    const char *name;
    uint32_t type;
    uint64_t config;
} pmu_event;

static const pmu_event PMU_SETS[PTO_PMU_SETS][PTO_PMU_MAX] = {
    {{"task-clock", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK},
     {"page-faults", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_PAGE_FAULTS},
     {"context-switches", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CONTEXT_SWITCHES},
     {"cpu-migrations", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_MIGRATIONS}},
    {{"cycles", PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES},
     {"instructions", PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS}},
    {{"cache-references", PERF_TYPE_HARDWARE, PERF_COUNT_HW_CACHE_REFERENCES},
     {"cache-misses", PERF_TYPE_HARDWARE, PERF_COUNT_HW_CACHE_MISSES}},
    {{"branches", PERF_TYPE_HARDWARE, PERF_COUNT_HW_BRANCH_INSTRUCTIONS},
     {"branch-misses", PERF_TYPE_HARDWARE, PERF_COUNT_HW_BRANCH_MISSES}},
};

const char *pto_pmu_event_name(int32_t set, int32_t i)
{
    if (set < 1 || set > PTO_PMU_SETS || i < 0 || i >= PTO_PMU_MAX) return NULL;
    return PMU_SETS[set - 1][i].name;
}

static _Atomic uint32_t pmu_refused;   /* bit set*PTO_PMU_MAX + i: said on stderr already */

static int pmu_open(const pmu_event *e, bool user_only)
{
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.size = sizeof a;
    a.type = e->type;
    a.config = e->config;
    a.disabled = 1;
    a.inherit = 1;
    a.exclude_kernel = user_only;
    a.exclude_hv = user_only;
    return (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
}

static void pmu_refuse(int32_t set, int32_t i, int why)
{
    uint32_t bit = 1u << ((set - 1) * PTO_PMU_MAX + i);
    if (atomic_fetch_or(&pmu_refused, bit) & bit) return;
    const char *reason = why == ENOENT || why == EOPNOTSUPP || why == ENODEV
                             ? "this machine has no such counter (a VM without a hardware PMU?)"
                         : why == EACCES || why == EPERM
                             ? "perf_event_paranoid forbids it (lower /proc/sys/kernel/perf_event_paranoid or run "
                               "with CAP_PERFMON)"
                             : "perf_event_open refused it";
    fprintf(stderr, "ptolua: enable_pmu = %d: event %s is not counted: %s (%s); the tasks run without it\n", (int)set,
            PMU_SETS[set - 1][i].name, reason, strerror(why));
}

static void pmu_start(int32_t set, int fds[PTO_PMU_MAX])
{
    for (int32_t i = 0; i < PTO_PMU_MAX; i++) {
        fds[i] = -1;
        const pmu_event *e = &PMU_SETS[set - 1][i];
        if (!e->name) continue;
        int fd = pmu_open(e, false);
        if (fd < 0 && (errno == EACCES || errno == EPERM)) fd = pmu_open(e, true);
        if (fd < 0) {
            pmu_refuse(set, i, errno);
            continue;
        }
        fds[i] = fd;
    }
    for (int32_t i = 0; i < PTO_PMU_MAX; i++)
        if (fds[i] >= 0) ioctl(fds[i], PERF_EVENT_IOC_ENABLE, 0);
}

static void pmu_stop(int fds[PTO_PMU_MAX], pto_diag_task *d)
{
    for (int32_t i = 0; i < PTO_PMU_MAX; i++)
        if (fds[i] >= 0) ioctl(fds[i], PERF_EVENT_IOC_DISABLE, 0);
    for (int32_t i = 0; i < PTO_PMU_MAX; i++) {
        if (fds[i] < 0) continue;
        uint64_t v;
        if (read(fds[i], &v, sizeof v) == (ssize_t)sizeof v) {
            d->pmu[i] = (int64_t)v;
            d->pmu_valid |= 1u << i;
        }
        close(fds[i]);
    }
}

/* ---- tensor dumps ------------------------------------------------------------------ */

static uint64_t fnv1a(const unsigned char *p, uint64_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (uint64_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static bool write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

static void shape_str(const pto_tensor *t, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = 0;
    if (t->ndims == 0) snprintf(buf, cap, "-");
    for (int k = 0; k < t->ndims && k < PTO_MAX_DIMS && n < cap; k++)
        n += (size_t)snprintf(buf + n, cap - n, k ? "x%u" : "%u", t->shape[k]);
}

/* Dump tensor i of v ("in" before the call, "out" after) and add its index line; false (err set) if a file
 * cannot be written: the task then fails, since the user asked for what it cannot get. */
static bool dump_one(const pto_args_view *v, int32_t i, const char *when, const pto_call_config *cfg,
                     const pto_diag_task *d, uint64_t callable, char *err, size_t errlen)
{
    const pto_tensor *t = &v->tensors[i];
    uint64_t nb = pto_tensor_nbytes(t);
    const unsigned char *p = (const unsigned char *)(uintptr_t)(t->base + t->offset);
    char path[PTO_OUTPUT_PREFIX_LEN + 2 * PTO_DIAG_RUN_LEN + 64];
    int n = snprintf(path, sizeof path, "%s.%s.t%" PRId64 ".m%d.a%d.%s", cfg->output_prefix, d->run, d->task_id,
                     (int)d->member, (int)i + 1, when);
    const char *file = strrchr(path, '/');
    file = file ? file + 1 : path;
    if (n < 0 || (size_t)n >= sizeof path) {
        snprintf(err, errlen, "enable_dump_tensor: the dump file name under output_prefix '%s' is too long",
                 cfg->output_prefix);
        return false;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    bool ok = fd >= 0 && (nb == 0 || (t->base && write_all(fd, p, (size_t)nb)));
    int e = errno;
    if (fd >= 0) close(fd);
    if (!ok) {
        snprintf(err, errlen, "enable_dump_tensor: cannot write %s (%s)", path, strerror(e));
        return false;
    }
    char shape[96], line[PTO_OUTPUT_PREFIX_LEN + 512];
    shape_str(t, shape, sizeof shape);
    const char *dt = pto_dtype_name(t->dtype);
    int ln = snprintf(line, sizeof line,
                      "%" PRId64 "\t%" PRIu64 "\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%" PRIu64 "\t%" PRIu64
                      "\t%s\t%016" PRIx64 "\n",
                      d->task_id, callable, (int)d->worker, (int)d->member, (int)i + 1, when,
                      i < d->ntags ? pto_tag_name(d->tags[i]) : "?", dt ? dt : "?", shape, t->offset, nb, file,
                      t->base ? fnv1a(p, nb) : fnv1a(p, 0));
    snprintf(path, sizeof path, "%s.%s.index", cfg->output_prefix, d->run);
    fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
    ok = fd >= 0 && ln > 0 && (size_t)ln < sizeof line && write_all(fd, line, (size_t)ln);
    e = errno;
    if (fd >= 0) close(fd);
    if (!ok) snprintf(err, errlen, "enable_dump_tensor: cannot append to %s (%s)", path, strerror(e));
    return ok;
}

static bool dumped_before(uint8_t tag) { return tag == PTO_INPUT || tag == PTO_INOUT || tag == PTO_NO_DEP; }
static bool dumped_after(uint8_t tag) { return tag == PTO_OUTPUT || tag == PTO_INOUT || tag == PTO_OUTPUT_EXISTING; }

static bool dump_all(const pto_args_view *v, bool after, const pto_call_config *cfg, const pto_diag_task *d,
                     uint64_t callable, char *err, size_t errlen)
{
    int32_t n = v->tensor_count;
    if (n > 0 && v->scalar_count > 0 && v->scalars[v->scalar_count - 1] == PTO_RESULT_BOX_MARK) n--;   /* not the user's */
    for (int32_t i = 0; i < n && i < d->ntags; i++) {
        uint8_t tag = d->tags[i];
        if (!(after ? dumped_after(tag) : dumped_before(tag))) continue;
        if (!dump_one(v, i, after ? "out" : "in", cfg, d, callable, err, errlen)) return false;
    }
    return true;
}

/* ---- swimlane file (no trace) ------------------------------------------------------ */

static void swimlane_write(const pto_call_config *cfg, const pto_diag_task *d, uint64_t callable, int rc)
{
    if (!cfg->output_prefix[0]) return;
    char path[PTO_OUTPUT_PREFIX_LEN + 2 * PTO_DIAG_RUN_LEN + 64], line[256];
    snprintf(path, sizeof path, "%s.%s.swimlane.w%d.tsv", cfg->output_prefix, d->run, (int)d->worker);
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    uint64_t ep = pto_trace_epoch();
    int n = snprintf(line, sizeof line,
                     "%" PRId64 "\t%d\t%" PRIu64 "\t%d\t%" PRIu64 "\t%" PRIu64 "\t%" PRIu64 "\t%" PRIu64 "\t%d\n",
                     d->task_id, (int)d->member, callable, (int)d->child_pid, d->ts[0] - ep, d->ts[1] - ep,
                     d->ts[2] - ep, d->ts[3] - ep, rc);
    if (n > 0 && (size_t)n < sizeof line) (void)write_all(fd, line, (size_t)n);
    close(fd);
}

/* ---- where the leaf runs ------------------------------------------------------------- */

int pto_diag_call(pto_leaf_fn fn, void *ctx, uint64_t callable, const pto_args_view *v, const pto_call_config *cfg,
                  pto_diag_task *d, char *err, size_t errlen)
{
    d->ts[PTO_SWIM_RECEIVED] = pto_now_ns();
    d->child_pid = (int32_t)getpid();
    if (cfg->enable_dump_tensor && !dump_all(v, false, cfg, d, callable, err, errlen)) return 1;
    d->ts[PTO_SWIM_DUMPED_IN] = pto_now_ns();
    int32_t set = cfg->enable_pmu >= 1 && cfg->enable_pmu <= PTO_PMU_SETS ? cfg->enable_pmu : 0;
    int fds[PTO_PMU_MAX];
    if (set) pmu_start(set, fds);
    d->ts[PTO_SWIM_KERNEL_START] = pto_now_ns();
    int rc = fn(ctx, callable, v, cfg, err, errlen);
    d->ts[PTO_SWIM_KERNEL_END] = pto_now_ns();
    if (set) {
        pmu_stop(fds, d);
        d->pmu_set = set;
    }
    d->ts[PTO_SWIM_COUNTED] = pto_now_ns();
    if (rc == 0 && cfg->enable_dump_tensor && !dump_all(v, true, cfg, d, callable, err, errlen)) rc = 1;
    d->ts[PTO_SWIM_POSTED] = pto_now_ns();
    if (cfg->enable_l2_swimlane && !d->trace_on) swimlane_write(cfg, d, callable, rc);
    return rc;
}
