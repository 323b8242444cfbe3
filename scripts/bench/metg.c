/*
 * metg.c - METG(50%) of ptolua (THREAD and PROCESS mode), OpenMP and StarPU.
 *
 * METG, from Task Bench (Slaughter et al., SC20): the minimum effective task
 * granularity, the smallest task duration at which a runtime still keeps the
 * machine 50% efficient, efficiency being the useful work (tasks x their
 * duration) over the cores' wall-clock time. Tasks spin a loop calibrated
 * on this machine (bench_spin); for each system and shape the duration is
 * doubled from 0.5 us until the efficiency reaches 50%, and METG is read off
 * between the last two points (log-linear). Each point keeps the best of two
 * runs of about 40 ms of work. Every system gets BENCH_THREADS workers, the
 * whole machine here, so an orchestrator or scheduler thread competes with
 * the workers for cores, as it would in a real run.
 *
 * Efficiency is measured against the ideal run of each point:
 * BENCH_THREADS plain threads spinning the same work split evenly, no
 * runtime at all, timed before any system starts and again after the last
 * (the best of both: a runtime's idle threads that keep spinning, as
 * StarPU's and OpenMP's do, would slow a reference timed beside them). On a
 * quiet machine that is Task Bench's definition (work / (cores x wall
 * time)); on one where another process holds a core it compares the
 * runtimes with what the machine gave, instead of capping every system
 * below 50%.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "bench.h"
#include "pto.h"

#include <math.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { M_THREAD, M_PROCESS, M_NOEARLY, M_RELAY, M_DIRECT, M_OMP, M_STARPU, M_NSYS };
static const char *const m_name[M_NSYS] = { "ptolua thread", "ptolua process", "process, no early", "floor: relay",
                                            "floor: direct", "openmp", "starpu" };
static const char *const shape_name[METG_NSHAPES] = { "W1 independent", "stencil 1-D, 3 deps" };

#define METG_POINTS 12   /* 0.5 us .. 1024 us */

typedef struct metg_row {
    int ran;
    double metg_us;     /* < 0: not reached; 0: at or below the smallest duration */
    double eff[METG_POINTS];
    int npoints;
} metg_row;

static double run_sys(int sys, int shape, int n, uint64_t iters)
{
    switch (sys) {
    case M_THREAD: return ptolua_metg(PTOLUA_METG_THREAD, shape, n, iters);
    case M_PROCESS: return ptolua_metg(PTOLUA_METG_PROCESS, shape, n, iters);
    case M_NOEARLY: return ptolua_metg(PTOLUA_METG_NOEARLY, shape, n, iters);
    case M_RELAY: return floor_metg(1, shape, n, iters);
    case M_DIRECT: return floor_metg(0, shape, n, iters);
#ifdef PTO_BENCH_HAVE_OPENMP
    case M_OMP: return omp_metg(shape, n, iters);
#endif
#ifdef PTO_BENCH_HAVE_STARPU
    case M_STARPU: return starpu_metg(shape, n, iters);
#endif
    default: return -1.0;
    }
}

static void *ref_body(void *arg)
{
    bench_spin(*(const uint64_t *)arg);
    return NULL;
}

/* The ideal: the same work on BENCH_THREADS threads, split evenly. */
static double ref_run(long n, uint64_t iters)
{
    uint64_t share = (uint64_t)(n / BENCH_THREADS) * iters;
    pthread_t th[BENCH_THREADS];
    double t0 = bench_now();
    for (int i = 0; i < BENCH_THREADS; i++) pthread_create(&th[i], NULL, ref_body, &share);
    for (int i = 0; i < BENCH_THREADS; i++) pthread_join(th[i], NULL);
    return bench_now() - t0;
}

static double g_ref[METG_POINTS];   /* ideal seconds per point, 0: not yet timed */
static double g_ref_worst[METG_POINTS];   /* the slowest of the same reference runs */

/* The reference runs repeat one fixed amount of work, so their spread is
 * the machine's: on a virtual machine whose host throttles or shares the
 * cores (invisible in /proc/stat's steal here), the same spin took 18 ms
 * and 110 ms a few seconds apart. Efficiencies are then unreliable, and
 * the figures say so. */
static void print_drift(const double *best, const double *worst, int n)
{
    double drift = 1.0;
    for (int i = 0; i < n; i++)
        if (best[i] > 0 && worst[i] / best[i] > drift) drift = worst[i] / best[i];
    printf("the plain-thread reference runs of one size took up to %.2fx their fastest%s\n", drift,
           drift > 1.3 ? " (the machine's speed moved during the run: numbers are unreliable)" : "");
}

/* Tasks of real_us each that make about work_ms of work on BENCH_THREADS
 * workers: whole stencil rows, within [16 rows, 100,000]. */
static long tasks_for(double real_us, double work_ms)
{
    long n = (long)(work_ms * 1000.0 * BENCH_THREADS / real_us);
    if (n < 16 * BENCH_STENCIL_W) n = 16 * BENCH_STENCIL_W;
    if (n > 100000) n = 100000;
    return n - n % BENCH_STENCIL_W;
}

static void point(int p, double ns_per_iter, double work_ms, uint64_t *iters, double *real_us, long *n)
{
    double d_us = 0.5 * (double)(1 << p);
    *iters = (uint64_t)(d_us * 1000.0 / ns_per_iter + 0.5);
    *real_us = (double)*iters * ns_per_iter / 1000.0;
    *n = tasks_for(*real_us, work_ms);
}

/* Two reference runs of n tasks of iters, folded into *best (0: none yet)
 * and *worst. */
static void time_ref(long n, uint64_t iters, double *best, double *worst)
{
    for (int r = 0; r < 2; r++) {
        double t = ref_run(n, iters);
        if (*best == 0 || t < *best) *best = t;
        if (t > *worst) *worst = t;
    }
}

static void time_refs(double ns_per_iter, double work_ms)
{
    for (int p = 0; p < METG_POINTS; p++) {
        uint64_t iters;
        double real_us;
        long n;
        point(p, ns_per_iter, work_ms, &iters, &real_us, &n);
        time_ref(n, iters, &g_ref[p], &g_ref_worst[p]);
    }
}

static int sweep(int sys, int shape, double ns_per_iter, double work_ms, metg_row *row)
{
    row->ran = 1;
    row->metg_us = -1.0;
    double prev_d = 0, prev_e = 0;
    for (int p = 0; p < METG_POINTS; p++) {
        uint64_t iters;
        double real_us;
        long n;
        point(p, ns_per_iter, work_ms, &iters, &real_us, &n);
        double best = -1.0;
        for (int r = 0; r < 2; r++) {
            double t = run_sys(sys, shape, (int)n, iters);
            if (t < 0) return -1;
            if (best < 0 || t < best) best = t;
        }
        double e = g_ref[p] / best;
        row->eff[p] = e;
        row->npoints = p + 1;
        fprintf(stderr, "  %-17s %-20s %7.1f us  %6ld tasks  %5.1f%% (of the machine: %.1f%%)\n", m_name[sys],
                shape_name[shape], real_us, n, 100.0 * e, 100.0 * (double)n * real_us * 1e-6 / (BENCH_THREADS * best));
        if (e >= 0.5) {
            if (p == 0) {
                row->metg_us = 0.0;
            } else {
                double f = (0.5 - prev_e) / (e - prev_e);
                row->metg_us = exp(log(prev_d) + f * (log(real_us) - log(prev_d)));
            }
            return 0;
        }
        prev_d = real_us;
        prev_e = e;
    }
    return 0;
}

static void fmt_metg(char *out, size_t cap, const metg_row *r)
{
    if (!r->ran) snprintf(out, cap, "skipped");
    else if (r->metg_us < 0) snprintf(out, cap, "> 1 ms");
    else if (r->metg_us == 0) snprintf(out, cap, "<= 0.5");
    else snprintf(out, cap, "%.1f", r->metg_us);
}

/* Whether this build has the system (the baselines are optional). */
static bool has_sys(int sys)
{
#ifndef PTO_BENCH_HAVE_OPENMP
    if (sys == M_OMP) return false;
#endif
#ifndef PTO_BENCH_HAVE_STARPU
    if (sys == M_STARPU) return false;
#endif
    (void)sys;
    return true;
}

/* Ready sys to run (floors: whether the floors' children started):
 * true to run it; false to pass it by, counting an error in *errors if it
 * should have run. A ptolua Worker made here is closed by
 * ptolua_metg_teardown. */
static bool open_sys(int sys, bool floors, int *errors)
{
    if (!has_sys(sys) || ((sys == M_RELAY || sys == M_DIRECT) && !floors)) return false;
    if ((sys == M_PROCESS || sys == M_NOEARLY || sys == M_THREAD) &&
        ptolua_metg_setup(sys == M_PROCESS ? PTOLUA_METG_PROCESS
                          : sys == M_NOEARLY ? PTOLUA_METG_NOEARLY : PTOLUA_METG_THREAD) != 0) {
        ++*errors;
        return false;
    }
    return true;
}

/* --efficiency=LIST: each system's efficiency at the task durations of
 * LIST (us), on both shapes, the best of reps runs per point, with the ideal
 * timed before and after as for METG. Where METG reads one crossing off a
 * sweep of doubling durations with two runs per point, this compares two
 * builds at fixed durations with as many runs as the noise needs. */
int bench_metg_points(const char *list, int reps)
{
    enum { MAXD = 16 };
    double durs[MAXD];
    int nd = 0;
    for (const char *p = list; *p && nd < MAXD;) {
        char *end;
        double d = strtod(p, &end);
        if (end == p || d <= 0) {
            fprintf(stderr, "pto_bench: --efficiency wants task durations in us, like 2,4,8 (got '%s')\n", list);
            return 1;
        }
        durs[nd++] = d;
        p = *end == ',' ? end + 1 : end;
    }
    double ns = bench_spin_calibrate(), work_ms = 40.0;
    uint64_t iters[MAXD];
    long n[MAXD];
    double ref[MAXD], worst[MAXD] = { 0 }, eff[M_NSYS][METG_NSHAPES][MAXD];
    memset(eff, 0, sizeof eff);
    for (int k = 0; k < nd; k++) {
        iters[k] = (uint64_t)(durs[k] * 1000.0 / ns + 0.5);
        n[k] = tasks_for((double)iters[k] * ns / 1000.0, work_ms);
        ref[k] = 0;
    }
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < nd; k++) time_ref(n[k], iters[k], &ref[k], &worst[k]);
    int errors = 0;
    /* The floors' children and PROCESS mode's forkserver before OpenMP's threads. */
    enum { NORDER = 6 };
    int order[NORDER] = { M_RELAY, M_DIRECT, M_PROCESS, M_NOEARLY, M_THREAD, M_OMP };
    bool floors = floor_metg_setup() == 0;
    if (!floors) errors++;
    for (int o = 0; o < NORDER; o++) {
        int sys = order[o];
        if (!open_sys(sys, floors, &errors)) continue;
        for (int sh = 0; sh < METG_NSHAPES; sh++)
            for (int k = 0; k < nd; k++) {
                double best = -1;
                for (int r = 0; r < reps; r++) {
                    double t = run_sys(sys, sh, (int)n[k], iters[k]);
                    if (t < 0) {
                        errors++;
                        break;
                    }
                    if (best < 0 || t < best) best = t;
                }
                eff[sys][sh][k] = best > 0 ? ref[k] / best : 0;
            }
        if (sys == M_THREAD) ptolua_metg_teardown();
    }
    floor_metg_teardown();
    /* After: only to see whether the machine's speed moved (the best, taken before, stays). */
    for (int k = 0; k < nd; k++) {
        double after = 0;
        time_ref(n[k], iters[k], &after, &worst[k]);
    }
    printf("efficiency (%% of %d plain threads running the same work; best of %d runs; spin kernel %.3f ns per "
           "iteration)\n%-22s %-17s", BENCH_THREADS, reps, ns, "shape", "system");
    for (int k = 0; k < nd; k++) printf(" %7.1fus", durs[k]);
    printf("\n");
    for (int sh = 0; sh < METG_NSHAPES; sh++)
        for (int o = 0; o < NORDER; o++) {
            int sys = order[o];
            if (!has_sys(sys)) continue;
            printf("%-22s %-17s", shape_name[sh], m_name[sys]);
            for (int k = 0; k < nd; k++) printf(" %8.1f%%", 100.0 * eff[sys][sh][k]);
            printf("\n");
        }
    print_drift(ref, worst, nd);
    return errors;
}

static void ratio(char *out, size_t cap, const metg_row *a, const metg_row *b)
{
    if (a->metg_us > 0 && b->metg_us > 0) snprintf(out, cap, "%.2fx", a->metg_us / b->metg_us);
    else snprintf(out, cap, "-");
}

/* The floors beside ptolua's PROCESS mode and OpenMP: what the aim
 * process/omp <= 2 leaves to a design that relays every dependency
 * through the parent, and what one whose children wait for each other
 * would have. */
static void print_floors(metg_row rows[M_NSYS][METG_NSHAPES])
{
    printf("\nfloors of PROCESS mode, METG(50%%) in us, same run: %d child processes, no runtime, the DAG known "
           "ahead\n(relay: the parent posts each task once its producers are done, as any design whose children "
           "cannot\nread the DAG; direct: each child waits for its own tasks' producers in shared memory)\n",
           BENCH_THREADS);
    printf("%-22s %13s %14s %14s %10s %11s\n", "shape", "floor: relay", "floor: direct", "process/relay",
           "relay/omp", "direct/omp");
    for (int sh = 0; sh < METG_NSHAPES; sh++) {
        char c[3][32], r[3][32];
        fmt_metg(c[0], sizeof c[0], &rows[M_RELAY][sh]);
        fmt_metg(c[1], sizeof c[1], &rows[M_DIRECT][sh]);
        ratio(r[0], sizeof r[0], &rows[M_PROCESS][sh], &rows[M_RELAY][sh]);
        ratio(r[1], sizeof r[1], &rows[M_RELAY][sh], &rows[M_OMP][sh]);
        ratio(r[2], sizeof r[2], &rows[M_DIRECT][sh], &rows[M_OMP][sh]);
        printf("%-22s %13s %14s %14s %10s %11s\n", shape_name[sh], c[0], c[1], r[0], r[1], r[2]);
        const metg_row *rl = &rows[M_RELAY][sh], *om = &rows[M_OMP][sh];
        if (rl->metg_us > 0 && om->metg_us > 0 && rl->metg_us > 2.0 * om->metg_us)
            printf("  %s: the relay floor alone is above 2x openmp here: no design that relays each dependency "
                   "through the parent meets the aim on this machine\n", shape_name[sh]);
    }
}

int bench_metg_main(int quick)
{
    double work_ms = quick ? 10.0 : 40.0;
    double ns = bench_spin_calibrate();
    metg_row rows[M_NSYS][METG_NSHAPES];
    memset(rows, 0, sizeof rows);
    int errors = 0;
    time_refs(ns, work_ms);
    double om[2] = { 0, 0 }, of[2] = { 0, 0 };
    for (int m = 1; m >= 0; m--)
        if (ptolua_onesub(m ? PTO_MODE_PROCESS : PTO_MODE_THREAD, &om[m], &of[m]) != 0) errors++;
    /* The floors' children and PROCESS mode's forkserver are forked before
     * OpenMP or StarPU start threads of their own. */
    int order[M_NSYS] = { M_RELAY, M_DIRECT, M_PROCESS, M_NOEARLY, M_THREAD, M_OMP, M_STARPU };
    bool floors = floor_metg_setup() == 0;
    if (!floors) errors++;
    for (int k = 0; k < M_NSYS; k++) {
        int sys = order[k];
        if (!open_sys(sys, floors, &errors)) continue;
#ifdef PTO_BENCH_HAVE_STARPU
        if (sys == M_STARPU && starpu_bench_setup() != 0) {
            errors++;
            continue;
        }
#endif
        for (int sh = 0; sh < METG_NSHAPES; sh++)
            if (sweep(sys, sh, ns, work_ms, &rows[sys][sh]) != 0) errors++;
        if (sys == M_THREAD) ptolua_metg_teardown();
#ifdef PTO_BENCH_HAVE_STARPU
        if (sys == M_STARPU) starpu_bench_teardown();
#endif
    }
    floor_metg_teardown();
    time_refs(ns, work_ms);
    printf("\nMETG(50%%): smallest task duration (us) at which %d workers stay 50%% efficient; lower is better\n"
           "(efficiency against %d plain threads running the same work, best before and after; calibrated\n"
           "spin kernel, %.3f ns per iteration; stencil: width %d, periodic, 3 deps per task)\n",
           BENCH_THREADS, BENCH_THREADS, ns, BENCH_STENCIL_W);
    printf("%-22s %14s %15s %10s %10s %12s %12s %12s\n", "shape", "ptolua thread", "ptolua process", "openmp",
           "starpu", "process/omp", "process/spu", "thread/omp");
    for (int sh = 0; sh < METG_NSHAPES; sh++) {
        char c[M_NSYS][32], r1[32], r2[32], r3[32];
        for (int s = 0; s < M_NSYS; s++) fmt_metg(c[s], sizeof c[s], &rows[s][sh]);
        const metg_row *p = &rows[M_PROCESS][sh], *t = &rows[M_THREAD][sh], *o = &rows[M_OMP][sh],
                       *u = &rows[M_STARPU][sh];
        ratio(r1, sizeof r1, p, o);
        ratio(r2, sizeof r2, p, u);
        ratio(r3, sizeof r3, t, o);
        printf("%-22s %14s %15s %10s %10s %12s %12s %12s\n", shape_name[sh], c[M_THREAD], c[M_PROCESS], c[M_OMP],
               c[M_STARPU], r1, r2, r3);
    }
    printf("aims: ptolua process below starpu (process/spu < 1) and within 2x of openmp (process/omp <= 2)\n");
    printf("without early posts (PTO_EARLY_POSTS=0):");
    for (int sh = 0; sh < METG_NSHAPES; sh++) {
        char c[32], r[32];
        fmt_metg(c, sizeof c, &rows[M_NOEARLY][sh]);
        ratio(r, sizeof r, &rows[M_NOEARLY][sh], &rows[M_OMP][sh]);
        printf("%s %s %s us (no-early/omp %s)", sh ? ";" : "", shape_name[sh], c, r);
    }
    printf("\n");
    print_floors(rows);
    print_drift(g_ref, g_ref_worst, METG_POINTS);
    printf("\none no-op sub child, C API (the engine without Lua)   thread    process  proc/thr\n");
    printf("marginal cost per task (us)                       %9.2f %10.2f %8.2fx\n", om[0], om[1],
           om[0] > 0 ? om[1] / om[0] : 0.0);
    printf("fixed cost per run, back-to-back (us)             %9.2f %10.2f %8.2fx\n", of[0], of[1],
           of[0] > 0 ? of[1] / of[0] : 0.0);
    return errors;
}
