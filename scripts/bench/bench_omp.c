/*
 * bench_omp.c - the empty-task shapes as OpenMP tasks with depend clauses.
 *
 * Two threads (num_threads(2)); one thread creates the tasks inside a single
 * construct, both execute them. Task bodies are an empty asm statement the
 * compiler cannot delete. The timed section spans the parallel region, from
 * entering it to its end (which waits for every task).
 */
#include "bench.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct slot {
    _Alignas(BENCH_SLOT_BYTES) unsigned char bytes[BENCH_SLOT_BYTES];
} slot;

#define BODY() __asm__ __volatile__("" ::: "memory")

static char g_desc[160];

int omp_bench_setup(void)
{
    /* Warm-up region so thread creation is not timed. */
    int nthreads = 0;
#pragma omp parallel num_threads(BENCH_THREADS)
    {
#pragma omp single
        nthreads = omp_get_num_threads();
    }
    if (nthreads != BENCH_THREADS)
        fprintf(stderr, "openmp: warning: got %d threads, wanted %d\n", nthreads, BENCH_THREADS);
    snprintf(g_desc, sizeof g_desc, "openmp: libgomp, num_threads(%d), task depend(in/out/inout)",
             nthreads);
    return 0;
}

void omp_bench_teardown(void)
{
}

const char *omp_bench_describe(void)
{
    return g_desc[0] ? g_desc : "openmp: num_threads(2)";
}

double omp_w1(int n)
{
    slot *s = bench_slots((size_t)n);
    double t0 = bench_now();
#pragma omp parallel num_threads(BENCH_THREADS)
#pragma omp single
    {
        for (int i = 0; i < n; i++) {
#pragma omp task depend(out: s[i])
            BODY();
        }
    }
    double t1 = bench_now();
    free(s);
    return t1 - t0;
}

/* W1 once more, untimed, counting where the tasks ran: libgomp runs a task
 * at once in the thread that creates it (undeferred) while more than 64 per
 * team thread are queued, so most of W1's empty tasks never leave the
 * creating thread and OpenMP's W1 rate is mostly that of a plain call. The
 * share printed beside the table says how much of it was. */
double omp_w1_inline_share(int n)
{
    slot *s = bench_slots((size_t)n);
    struct { _Alignas(64) long ran; } per[BENCH_THREADS] = {{0}};
    int creator = -1;
#pragma omp parallel num_threads(BENCH_THREADS)
#pragma omp single
    {
        creator = omp_get_thread_num();
        for (int i = 0; i < n; i++) {
#pragma omp task depend(out: s[i])
            {
                int t = omp_get_thread_num();
                if (t >= 0 && t < BENCH_THREADS) per[t].ran++;
            }
        }
    }
    free(s);
    return creator >= 0 && creator < BENCH_THREADS ? (double)per[creator].ran / n : -1.0;
}

double omp_w2(int n)
{
    slot *s = bench_slots(1);
    double t0 = bench_now();
#pragma omp parallel num_threads(BENCH_THREADS)
#pragma omp single
    {
        for (int i = 0; i < n; i++) {
#pragma omp task depend(inout: s[0])
            BODY();
        }
    }
    double t1 = bench_now();
    free(s);
    return t1 - t0;
}

/* W3's task graph, inside a single construct: groups of a head writing
 * X, BENCH_FAN readers of X each writing its Y, and a join of the Ys
 * writing Z; every task's body is the statement TASK. One macro for the
 * timed run and the counting one, so they cannot drift apart. */
#define W3_TASKS(s, groups, TASK)                                                    \
    for (int g = 0; g < (groups); g++) {                                             \
        slot *x = (s) + (size_t)g * (BENCH_FAN + 2);                                 \
        slot *y = x + 1;                                                             \
        slot *z = x + 1 + BENCH_FAN;                                                 \
        (void)y; (void)z; /* gcc 12 counts depend clauses as no use */               \
        _Pragma("omp task depend(out: x[0])") TASK;                                  \
        for (int j = 0; j < BENCH_FAN; j++) {                                        \
            _Pragma("omp task depend(in: x[0]) depend(out: y[j])") TASK;             \
        }                                                                            \
        _Pragma("omp task depend(in: y[0], y[1], y[2], y[3], y[4], y[5], y[6], y[7]) depend(out: z[0])") \
            TASK;                                                                    \
    }

#if BENCH_FAN != 8
#error "W3_TASKS lists the 8 readers of a fan group explicitly"
#endif

double omp_w3(int groups)
{
    slot *s = bench_slots((size_t)groups * (BENCH_FAN + 2));
    double t0 = bench_now();
#pragma omp parallel num_threads(BENCH_THREADS)
#pragma omp single
    {
        W3_TASKS(s, groups, BODY());
    }
    double t1 = bench_now();
    free(s);
    return t1 - t0;
}

/* W3 once more, untimed, counting where the tasks ran (as
 * omp_w1_inline_share): an undeferred task with dependences waits for its
 * producers where it is created, so the creating thread runs most of a
 * fan's readers and joins too. */
double omp_w3_inline_share(int groups)
{
    slot *s = bench_slots((size_t)groups * (BENCH_FAN + 2));
    struct { _Alignas(64) long ran; } ran[BENCH_THREADS] = {{0}};
    int creator = -1;
#define W3_COUNT()                                                 \
    do {                                                           \
        int t = omp_get_thread_num();                              \
        if (t >= 0 && t < BENCH_THREADS) ran[t].ran++;             \
    } while (0)
#pragma omp parallel num_threads(BENCH_THREADS)
#pragma omp single
    {
        creator = omp_get_thread_num();
        W3_TASKS(s, groups, W3_COUNT());
    }
#undef W3_COUNT
    free(s);
    return creator >= 0 && creator < BENCH_THREADS
               ? (double)ran[creator].ran / ((double)groups * BENCH_W3_TASKS_PER_GROUP)
               : -1.0;
}

/* BGEMM with a distinct temporary P per (b,m,n,k). One parallel region per
 * repetition; the time covers all of them. */
double omp_w4(int d, int reps)
{
    const size_t dd = (size_t)d;
    const size_t n3 = dd * dd * dd;
    slot *A = bench_slots(n3), *B = bench_slots(n3), *C = bench_slots(n3);
    slot *P = bench_slots(n3 * dd);
    double t0 = bench_now();
    for (int r = 0; r < reps; r++) {
#pragma omp parallel num_threads(BENCH_THREADS)
#pragma omp single
        {
            for (size_t b = 0; b < dd; b++)
                for (size_t m = 0; m < dd; m++)
                    for (size_t n = 0; n < dd; n++) {
                        slot *c = &C[(b * dd + m) * dd + n];
                        (void)c; /* gcc 12 counts depend clauses as no use */
                        for (size_t k = 0; k < dd; k++) {
                            slot *a = &A[(b * dd + m) * dd + k];
                            slot *bb = &B[(b * dd + k) * dd + n];
                            slot *p = &P[((b * dd + m) * dd + n) * dd + k];
                            (void)a; (void)bb; (void)p;
#pragma omp task depend(in: a[0], bb[0]) depend(out: p[0])
                            BODY();
#pragma omp task depend(in: p[0]) depend(inout: c[0])
                            BODY();
                        }
                    }
        }
    }
    double t1 = bench_now();
    free(A); free(B); free(C); free(P);
    return t1 - t0;
}

double omp_metg(int shape, int n, uint64_t iters)
{
    slot *s = bench_slots((size_t)n);
    double t0 = bench_now();
#pragma omp parallel num_threads(BENCH_THREADS)
#pragma omp single
    {
        for (int k = 0; k < n; k++) {
            if (shape == METG_W1 || k < BENCH_STENCIL_W) {
#pragma omp task depend(out: s[k])
                bench_spin(iters);
            } else {
                int d[3];
                bench_stencil_deps(k / BENCH_STENCIL_W, k % BENCH_STENCIL_W, d);
#pragma omp task depend(in: s[d[0]], s[d[1]], s[d[2]]) depend(out: s[k])
                bench_spin(iters);
            }
        }
    }
    double t1 = bench_now();
    free(s);
    return t1 - t0;
}
