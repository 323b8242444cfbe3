/*
 * bench_ptolua.c - the empty-task shapes through the ptolua C API.
 *
 * One THREAD-mode Worker with two next-level children whose leaf returns 0
 * at once. Each shape is one run (pto_run_begin .. pto_run_end); the bgemm
 * shape is one run per repetition. The timed section is pto_run_begin up to
 * pto_run_end returning, i.e. submission plus drain.
 */
#include "bench.h"
#include "pto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bytes per heap ring; only the bgemm temporaries are carved from it. */
#ifndef PTO_BENCH_HEAP_BYTES
#define PTO_BENCH_HEAP_BYTES (256ULL << 20)
#endif

static pto_worker *g_worker;
static char g_desc[160];

static int empty_leaf(void *ctx, uint64_t callable, const pto_args_view *args,
                      const pto_call_config *cfg, char *err, size_t errlen)
{
    (void)ctx; (void)callable; (void)args; (void)cfg; (void)err; (void)errlen;
    return 0;
}

int ptolua_setup(void)
{
    pto_worker_config wc;
    memset(&wc, 0, sizeof wc);
    wc.level = 3;
    wc.mode = PTO_MODE_THREAD;
    wc.heap_ring_size = PTO_BENCH_HEAP_BYTES;
    const char *mb = getenv("PTO_BENCH_HEAP_MB");
    if (mb && atoll(mb) > 0)
        wc.heap_ring_size = (uint64_t)atoll(mb) << 20;

    g_worker = pto_worker_new(&wc);
    if (!g_worker) {
        fprintf(stderr, "ptolua: pto_worker_new failed: %s\n", pto_errmsg());
        return -1;
    }
    pto_leaf leaf = {.run = empty_leaf, .name = "empty"};
    for (int i = 0; i < BENCH_THREADS; i++) {
        if (pto_worker_add_next_level(g_worker, &leaf) < 0) {
            fprintf(stderr, "ptolua: pto_worker_add_next_level failed: %s\n", pto_errmsg());
            pto_worker_close(g_worker);
            g_worker = NULL;
            return -1;
        }
    }
    if (pto_worker_init(g_worker) != 0) {
        fprintf(stderr, "ptolua: pto_worker_init failed: %s\n", pto_errmsg());
        pto_worker_close(g_worker);
        g_worker = NULL;
        return -1;
    }
    snprintf(g_desc, sizeof g_desc,
             "ptolua: THREAD mode, %d next-level workers, heap ring %llu MiB",
             BENCH_THREADS, (unsigned long long)(wc.heap_ring_size >> 20));
    return 0;
}

void ptolua_teardown(void)
{
    pto_worker_close(g_worker);
    g_worker = NULL;
}

const char *ptolua_describe(void)
{
    return g_desc[0] ? g_desc : "ptolua: THREAD mode, 2 next-level workers";
}

/* A 1-D f32 tensor of 16 elements on the slot at p (or unset if p is NULL). */
static inline pto_tensor tensor_at(const void *p)
{
    pto_tensor t;
    memset(&t, 0, sizeof t);
    t.base = (uint64_t)(uintptr_t)p;
    t.offset = 0;
    t.shape[0] = BENCH_SLOT_ELEMS;
    t.dtype = PTO_F32;
    t.ndims = 1;
    return t;
}

static inline char *slot(char *base, size_t i)
{
    return base + i * BENCH_SLOT_BYTES;
}

static pto_orch *begin(void)
{
    pto_orch *o = pto_run_begin(g_worker);
    if (!o)
        fprintf(stderr, "ptolua: pto_run_begin failed: %s\n", pto_errmsg());
    return o;
}

/* Submit one task; on failure report and return -1. */
static inline int submit(pto_orch *o, pto_tensor *ts, const uint8_t *tags, int n)
{
    pto_task_args a;
    a.tensor_count = n;
    a.scalar_count = 0;
    a.tensors = ts;
    a.tags = tags;
    a.scalars = NULL;
    if (pto_submit_next_level(o, 0, &a, NULL, -1) /* NULL: default config */ < 0) {
        fprintf(stderr, "ptolua: pto_submit_next_level failed: %s\n", pto_errmsg());
        return -1;
    }
    return 0;
}

/* Close the run after a failed submit (its error is already reported). */
static double abort_run(void)
{
    if (pto_run_end(g_worker) != 0)
        fprintf(stderr, "ptolua: pto_run_end after failure: %s\n", pto_errmsg());
    return -1.0;
}

static int end(void)
{
    if (pto_run_end(g_worker) != 0) {
        fprintf(stderr, "ptolua: pto_run_end failed: %s\n", pto_errmsg());
        return -1;
    }
    return 0;
}

/* Completed-task counter of the Worker (cumulative over runs). */
static int64_t completed(void)
{
    pto_stats st;
    pto_worker_stats_get(g_worker, &st);
    return st.tasks_completed;
}

/* Sanity check outside the timed section: every submitted task ran. */
static int check_done(const char *shape, int64_t before, int64_t expect)
{
    int64_t got = completed() - before;
    if (got != expect) {
        fprintf(stderr, "ptolua: %s: %lld tasks completed, expected %lld\n", shape,
                (long long)got, (long long)expect);
        return -1;
    }
    return 0;
}

double ptolua_w1(int n)
{
    char *buf = bench_slots((size_t)n);
    static const uint8_t tags[1] = { PTO_OUTPUT };
    const int64_t done0 = completed();
    double t0 = bench_now(), t1;
    pto_orch *o = begin();
    if (!o) { free(buf); return -1.0; }
    for (int i = 0; i < n; i++) {
        pto_tensor t = tensor_at(slot(buf, (size_t)i));
        if (submit(o, &t, tags, 1) != 0) { free(buf); return abort_run(); }
    }
    int rc = end();
    t1 = bench_now();
    free(buf);
    if (rc == 0)
        rc = check_done("W1", done0, (int64_t)n);
    return rc == 0 ? t1 - t0 : -1.0;
}

double ptolua_w2(int n)
{
    char *buf = bench_slots(1);
    static const uint8_t tags[1] = { PTO_INOUT };
    const int64_t done0 = completed();
    double t0 = bench_now(), t1;
    pto_orch *o = begin();
    if (!o) { free(buf); return -1.0; }
    for (int i = 0; i < n; i++) {
        pto_tensor t = tensor_at(buf);
        if (submit(o, &t, tags, 1) != 0) { free(buf); return abort_run(); }
    }
    int rc = end();
    t1 = bench_now();
    free(buf);
    if (rc == 0)
        rc = check_done("W2", done0, (int64_t)n);
    return rc == 0 ? t1 - t0 : -1.0;
}

double ptolua_w3(int groups)
{
    /* per group: X, Y[0..7], Z */
    const size_t per = BENCH_FAN + 2;
    char *buf = bench_slots((size_t)groups * per);
    static const uint8_t tag_out[1] = { PTO_OUTPUT };
    static const uint8_t tag_rd[2] = { PTO_INPUT, PTO_OUTPUT };
    uint8_t tag_join[BENCH_FAN + 1];
    for (int j = 0; j < BENCH_FAN; j++)
        tag_join[j] = PTO_INPUT;
    tag_join[BENCH_FAN] = PTO_OUTPUT;

    const int64_t done0 = completed();
    double t0 = bench_now(), t1;
    pto_orch *o = begin();
    if (!o) { free(buf); return -1.0; }
    for (int g = 0; g < groups; g++) {
        char *x = slot(buf, (size_t)g * per);
        char *y = slot(x, 1);
        char *z = slot(x, 1 + BENCH_FAN);
        pto_tensor t[BENCH_FAN + 1];
        t[0] = tensor_at(x);
        if (submit(o, t, tag_out, 1) != 0) goto fail;
        for (int j = 0; j < BENCH_FAN; j++) {
            t[0] = tensor_at(x);
            t[1] = tensor_at(slot(y, (size_t)j));
            if (submit(o, t, tag_rd, 2) != 0) goto fail;
        }
        for (int j = 0; j < BENCH_FAN; j++)
            t[j] = tensor_at(slot(y, (size_t)j));
        t[BENCH_FAN] = tensor_at(z);
        if (submit(o, t, tag_join, BENCH_FAN + 1) != 0) goto fail;
    }
    int rc = end();
    t1 = bench_now();
    free(buf);
    if (rc == 0)
        rc = check_done("W3", done0, (int64_t)groups * BENCH_W3_TASKS_PER_GROUP);
    return rc == 0 ? t1 - t0 : -1.0;
fail:
    free(buf);
    return abort_run();
}

/*
 * BGEMM: A[b][m][k], B[b][k][n], C[b][m][n] are user tensors; each gemm's
 * product P is an unset OUTPUT (base 0) that submit carves from the heap
 * ring. One scope per (b,m,n) so the temporaries are reclaimed as soon as
 * their tile_add has consumed them.
 */
double ptolua_w4(int d, int reps)
{
    const size_t dd = (size_t)d;
    const size_t n3 = dd * dd * dd;
    char *A = bench_slots(n3), *B = bench_slots(n3), *C = bench_slots(n3);
    static const uint8_t tag_gemm[3] = { PTO_INPUT, PTO_INPUT, PTO_OUTPUT };
    static const uint8_t tag_add[2] = { PTO_INPUT, PTO_INOUT };
    const int64_t done0 = completed();
    double t0 = bench_now(), t1;
    int rc = 0;
    for (int r = 0; r < reps && rc == 0; r++) {
        pto_orch *o = begin();
        if (!o) { rc = -1; break; }
        for (size_t b = 0; b < dd && rc == 0; b++)
            for (size_t m = 0; m < dd && rc == 0; m++)
                for (size_t n = 0; n < dd && rc == 0; n++) {
                    if (pto_scope_begin(o) != 0) {
                        fprintf(stderr, "ptolua: pto_scope_begin failed: %s\n", pto_errmsg());
                        rc = -1;
                        break;
                    }
                    for (size_t k = 0; k < dd; k++) {
                        pto_tensor g[3];
                        g[0] = tensor_at(slot(A, (b * dd + m) * dd + k));
                        g[1] = tensor_at(slot(B, (b * dd + k) * dd + n));
                        g[2] = tensor_at(NULL); /* auto-allocated P */
                        if (submit(o, g, tag_gemm, 3) != 0) { rc = -1; break; }
                        pto_tensor a[2];
                        a[0] = g[2]; /* submit wrote P's storage back */
                        a[1] = tensor_at(slot(C, (b * dd + m) * dd + n));
                        if (submit(o, a, tag_add, 2) != 0) { rc = -1; break; }
                    }
                    if (pto_scope_end(o) != 0 && rc == 0) {
                        fprintf(stderr, "ptolua: pto_scope_end failed: %s\n", pto_errmsg());
                        rc = -1;
                    }
                }
        if (rc != 0)
            abort_run();
        else
            rc = end();
    }
    t1 = bench_now();
    free(A); free(B); free(C);
    if (rc == 0)
        rc = check_done("W4", done0, BENCH_W4_TASKS(d) * reps);
    return rc == 0 ? t1 - t0 : -1.0;
}

/* ---- METG: spinning tasks on a Worker of either mode ----------------------
 * The leaf spins the task's one scalar (iterations). In PROCESS mode it runs
 * in the two forked children; the tensors are only tags there, never read. */

static pto_worker *g_metg[PTOLUA_METG_NWORKERS];

static int spin_leaf(void *ctx, uint64_t callable, const pto_args_view *args,
                     const pto_call_config *cfg, char *err, size_t errlen)
{
    (void)ctx; (void)callable; (void)cfg; (void)err; (void)errlen;
    bench_spin(args->scalar_count > 0 ? args->scalars[0] : 0);
    return 0;
}

int ptolua_metg_setup(int which)
{
    int32_t mode = which == PTOLUA_METG_THREAD ? PTO_MODE_THREAD : PTO_MODE_PROCESS;
    pto_worker_config wc;
    memset(&wc, 0, sizeof wc);
    wc.level = 3;
    wc.mode = mode;
    wc.heap_ring_size = 16ULL << 20;
    pto_worker *w = pto_worker_new(&wc);
    if (!w) {
        fprintf(stderr, "ptolua: pto_worker_new failed: %s\n", pto_errmsg());
        return -1;
    }
    pto_leaf leaf = {.run = spin_leaf, .name = "spin"};
    for (int i = 0; i < BENCH_THREADS; i++)
        pto_worker_add_next_level(w, &leaf);
    const char *was = getenv("PTO_EARLY_POSTS");
    char keep[16] = "";
    if (was) snprintf(keep, sizeof keep, "%s", was);
    if (which == PTOLUA_METG_NOEARLY) setenv("PTO_EARLY_POSTS", "0", 1);
    else unsetenv("PTO_EARLY_POSTS");
    int rc = pto_worker_init(w);
    if (was) setenv("PTO_EARLY_POSTS", keep, 1);
    else unsetenv("PTO_EARLY_POSTS");
    if (rc != 0) {
        fprintf(stderr, "ptolua: pto_worker_init (%s mode) failed: %s\n",
                mode == PTO_MODE_PROCESS ? "process" : "thread", pto_errmsg());
        pto_worker_close(w);
        return -1;
    }
    g_metg[which] = w;
    return 0;
}

void ptolua_metg_teardown(void)
{
    for (int i = 0; i < PTOLUA_METG_NWORKERS; i++) {
        pto_worker_close(g_metg[i]);
        g_metg[i] = NULL;
    }
}

double ptolua_metg(int which, int shape, int n, uint64_t iters)
{
    pto_worker *w = g_metg[which];
    if (!w)
        return -1.0;
    char *buf = bench_slots((size_t)n);
    static const uint8_t tag_out[1] = { PTO_OUTPUT };
    static const uint8_t tag_st[4] = { PTO_INPUT, PTO_INPUT, PTO_INPUT, PTO_OUTPUT };
    uint64_t sc[1] = { iters };
    double t0 = bench_now();
    pto_orch *o = pto_run_begin(w);
    int rc = o ? 0 : -1;
    for (int k = 0; k < n && rc == 0; k++) {
        pto_tensor t[4];
        pto_task_args a = { .scalar_count = 1, .scalars = sc, .tensors = t };
        if (shape == METG_W1 || k < BENCH_STENCIL_W) {
            t[0] = tensor_at(slot(buf, (size_t)k));
            a.tensor_count = 1;
            a.tags = tag_out;
        } else {
            int deps[3];
            bench_stencil_deps(k / BENCH_STENCIL_W, k % BENCH_STENCIL_W, deps);
            for (int d = 0; d < 3; d++)
                t[d] = tensor_at(slot(buf, (size_t)deps[d]));
            t[3] = tensor_at(slot(buf, (size_t)k));
            a.tensor_count = 4;
            a.tags = tag_st;
        }
        if (pto_submit_next_level(o, 0, &a, NULL, -1) < 0) {
            fprintf(stderr, "ptolua: submit failed: %s\n", pto_errmsg());
            rc = -1;
        }
    }
    if (o && pto_run_end(w) != 0) {
        fprintf(stderr, "ptolua: pto_run_end failed: %s\n", pto_errmsg());
        rc = -1;
    }
    double t1 = bench_now();
    free(buf);
    return rc == 0 ? t1 - t0 : -1.0;
}

/* ---- one no-op sub child through the C API: T(n) = fixed + n * marginal ----
 * Back-to-back runs of 1 and 2000 tasks on a Worker with one sub worker,
 * the medians after a warm-up; the engine's share of bench_process.lua's
 * one-sub figures, without Lua. */

static int noop_leaf(void *ctx, uint64_t callable, const pto_args_view *args,
                     const pto_call_config *cfg, char *err, size_t errlen)
{
    (void)ctx; (void)callable; (void)args; (void)cfg; (void)err; (void)errlen;
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double onesub_median(pto_worker *w, int n, int runs)
{
    double xs[256];
    if (runs > 256) runs = 256;
    for (int r = 0; r < runs; r++) {
        double t0 = bench_now();
        pto_orch *o = pto_run_begin(w);
        for (int k = 0; k < n && o; k++) {
            pto_task_args a = { 0 };
            pto_submit_sub(o, 0, &a, -1);
        }
        if (o) pto_run_end(w);
        xs[r] = bench_now() - t0;
    }
    qsort(xs, (size_t)runs, sizeof xs[0], cmp_double);
    return xs[runs / 2];
}

int ptolua_onesub(int32_t mode, double *marginal_us, double *fixed_us)
{
    pto_worker_config wc;
    memset(&wc, 0, sizeof wc);
    wc.level = 3;
    wc.mode = mode;
    wc.heap_ring_size = 16ULL << 20;
    pto_worker *w = pto_worker_new(&wc);
    pto_leaf leaf = {.run = noop_leaf, .name = "sub"};
    if (!w || pto_worker_add_sub(w, &leaf) < 0 || pto_worker_init(w) != 0) {
        fprintf(stderr, "ptolua: one-sub Worker: %s\n", pto_errmsg());
        pto_worker_close(w);
        return -1;
    }
    onesub_median(w, 1, 100);
    double t1 = onesub_median(w, 1, 201), tm = onesub_median(w, 2000, 21);
    double m = (tm - t1) / 1999.0;
    *marginal_us = m * 1e6;
    *fixed_us = (t1 - m) * 1e6;
    pto_worker_close(w);
    return 0;
}
