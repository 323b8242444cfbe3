/*
 * bench_starpu.c - the empty-task shapes through StarPU with implicit data
 * dependencies (sequential consistency on registered handles).
 *
 * Two CPU workers, no accelerators. Every benchmark tensor is one 64-byte
 * variable handle; tasks are starpu_task_insert calls with STARPU_R /
 * STARPU_W / STARPU_RW on a codelet whose CPU function is empty. Data
 * registration and unregistration are outside the timed section, which
 * spans the first insert to starpu_task_wait_for_all returning.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "bench.h"

#include <starpu.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char g_desc[200];

static void empty_cpu(void *buffers[], void *arg)
{
    (void)buffers;
    (void)arg;
    __asm__ __volatile__("" ::: "memory");
}

static struct starpu_codelet cl_empty = {
    .where = STARPU_CPU,
    .cpu_funcs = { empty_cpu },
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .name = "empty",
};

int starpu_bench_setup(void)
{
    char ncpu[16];
    snprintf(ncpu, sizeof ncpu, "%d", BENCH_THREADS);
    setenv("STARPU_SILENT", "1", 0);
    setenv("STARPU_NCPU", ncpu, 1);
    setenv("STARPU_NCUDA", "0", 1);
    setenv("STARPU_NOPENCL", "0", 1);
    setenv("STARPU_NMIC", "0", 1);
    setenv("STARPU_NMPI_MS", "0", 1);

    struct starpu_conf conf;
    starpu_conf_init(&conf);
    conf.ncpus = BENCH_THREADS;
    conf.ncuda = 0;
    conf.nopencl = 0;
    conf.nmic = 0;
    conf.nmpi_ms = 0;
    conf.calibrate = 0;
    conf.bus_calibrate = 0;

    int ret = starpu_init(&conf);
    if (ret != 0) {
        fprintf(stderr, "starpu: starpu_init failed: %s\n", strerror(-ret));
        return -1;
    }
    const char *sched = "?";
    struct starpu_sched_policy *pol = starpu_sched_ctx_get_sched_policy(0);
    if (pol && pol->policy_name)
        sched = pol->policy_name;
    snprintf(g_desc, sizeof g_desc,
             "starpu: %d.%d.%d, %u CPU workers, sched=%s, implicit data deps (variable handles)",
             STARPU_MAJOR_VERSION, STARPU_MINOR_VERSION, STARPU_RELEASE_VERSION,
             starpu_cpu_worker_get_count(), sched);
    return 0;
}

void starpu_bench_teardown(void)
{
    starpu_shutdown();
}

const char *starpu_bench_describe(void)
{
    return g_desc[0] ? g_desc : "starpu";
}

/* One variable handle per slot of buf. */
static starpu_data_handle_t *reg_slots(char *buf, size_t n)
{
    starpu_data_handle_t *h = malloc((n ? n : 1) * sizeof *h);
    if (!h) {
        fprintf(stderr, "starpu: out of memory\n");
        abort();
    }
    for (size_t i = 0; i < n; i++)
        starpu_variable_data_register(&h[i], STARPU_MAIN_RAM,
                                      (uintptr_t)(buf + i * BENCH_SLOT_BYTES), BENCH_SLOT_BYTES);
    return h;
}

static void unreg_slots(starpu_data_handle_t *h, size_t n)
{
    for (size_t i = 0; i < n; i++)
        starpu_data_unregister(h[i]);
    free(h);
}

static int insert_failed(int ret)
{
    fprintf(stderr, "starpu: starpu_task_insert failed: %s\n", strerror(-ret));
    starpu_task_wait_for_all();
    return -1;
}

static int wait_all(void)
{
    int ret = starpu_task_wait_for_all();
    if (ret != 0) {
        fprintf(stderr, "starpu: starpu_task_wait_for_all failed: %d\n", ret);
        return -1;
    }
    return 0;
}

double starpu_w1(int n)
{
    char *buf = bench_slots((size_t)n);
    starpu_data_handle_t *h = reg_slots(buf, (size_t)n);
    int rc = 0;
    double t0 = bench_now();
    for (int i = 0; i < n; i++) {
        int ret = starpu_task_insert(&cl_empty, STARPU_W, h[i], 0);
        if (ret != 0) { rc = insert_failed(ret); break; }
    }
    if (rc == 0)
        rc = wait_all();
    double t1 = bench_now();
    unreg_slots(h, (size_t)n);
    free(buf);
    return rc == 0 ? t1 - t0 : -1.0;
}

double starpu_w2(int n)
{
    char *buf = bench_slots(1);
    starpu_data_handle_t *h = reg_slots(buf, 1);
    int rc = 0;
    double t0 = bench_now();
    for (int i = 0; i < n; i++) {
        int ret = starpu_task_insert(&cl_empty, STARPU_RW, h[0], 0);
        if (ret != 0) { rc = insert_failed(ret); break; }
    }
    if (rc == 0)
        rc = wait_all();
    double t1 = bench_now();
    unreg_slots(h, 1);
    free(buf);
    return rc == 0 ? t1 - t0 : -1.0;
}

#if BENCH_FAN != 8
#error "starpu_w3 lists the 8 readers of a fan group explicitly"
#endif

double starpu_w3(int groups)
{
    const size_t per = BENCH_FAN + 2; /* X, Y[0..7], Z */
    const size_t total = (size_t)groups * per;
    char *buf = bench_slots(total);
    starpu_data_handle_t *h = reg_slots(buf, total);
    int rc = 0;
    double t0 = bench_now();
    for (int g = 0; g < groups && rc == 0; g++) {
        starpu_data_handle_t *x = h + (size_t)g * per;
        starpu_data_handle_t *y = x + 1;
        starpu_data_handle_t *z = x + 1 + BENCH_FAN;
        int ret = starpu_task_insert(&cl_empty, STARPU_W, x[0], 0);
        if (ret != 0) { rc = insert_failed(ret); break; }
        for (int j = 0; j < BENCH_FAN; j++) {
            ret = starpu_task_insert(&cl_empty, STARPU_R, x[0], STARPU_W, y[j], 0);
            if (ret != 0) { rc = insert_failed(ret); break; }
        }
        if (rc != 0)
            break;
        ret = starpu_task_insert(&cl_empty,
                                 STARPU_R, y[0], STARPU_R, y[1], STARPU_R, y[2], STARPU_R, y[3],
                                 STARPU_R, y[4], STARPU_R, y[5], STARPU_R, y[6], STARPU_R, y[7],
                                 STARPU_W, z[0], 0);
        if (ret != 0) { rc = insert_failed(ret); break; }
    }
    if (rc == 0)
        rc = wait_all();
    double t1 = bench_now();
    unreg_slots(h, total);
    free(buf);
    return rc == 0 ? t1 - t0 : -1.0;
}

/* BGEMM with a distinct registered temporary P per (b,m,n,k), registered
 * once and reused by every repetition; each repetition ends with
 * starpu_task_wait_for_all and the time covers all of them. */
double starpu_w4(int d, int reps)
{
    const size_t dd = (size_t)d;
    const size_t n3 = dd * dd * dd;
    char *bA = bench_slots(n3), *bB = bench_slots(n3), *bC = bench_slots(n3);
    char *bP = bench_slots(n3 * dd);
    starpu_data_handle_t *A = reg_slots(bA, n3), *B = reg_slots(bB, n3), *C = reg_slots(bC, n3);
    starpu_data_handle_t *P = reg_slots(bP, n3 * dd);
    int rc = 0;
    double t0 = bench_now();
    for (int r = 0; r < reps && rc == 0; r++) {
        for (size_t b = 0; b < dd && rc == 0; b++)
            for (size_t m = 0; m < dd && rc == 0; m++)
                for (size_t n = 0; n < dd && rc == 0; n++) {
                    starpu_data_handle_t c = C[(b * dd + m) * dd + n];
                    for (size_t k = 0; k < dd; k++) {
                        starpu_data_handle_t p = P[((b * dd + m) * dd + n) * dd + k];
                        int ret = starpu_task_insert(&cl_empty,
                                                     STARPU_R, A[(b * dd + m) * dd + k],
                                                     STARPU_R, B[(b * dd + k) * dd + n],
                                                     STARPU_W, p, 0);
                        if (ret != 0) { rc = insert_failed(ret); break; }
                        ret = starpu_task_insert(&cl_empty, STARPU_R, p, STARPU_RW, c, 0);
                        if (ret != 0) { rc = insert_failed(ret); break; }
                    }
                }
        if (rc == 0)
            rc = wait_all();
    }
    double t1 = bench_now();
    unreg_slots(A, n3); unreg_slots(B, n3); unreg_slots(C, n3);
    unreg_slots(P, n3 * dd);
    free(bA); free(bB); free(bC); free(bP);
    return rc == 0 ? t1 - t0 : -1.0;
}

static void spin_cpu(void *buffers[], void *arg)
{
    (void)buffers;
    uint64_t iters;
    starpu_codelet_unpack_args(arg, &iters);
    bench_spin(iters);
}

static struct starpu_codelet cl_spin = {
    .where = STARPU_CPU,
    .cpu_funcs = { spin_cpu },
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .name = "spin",
};

double starpu_metg(int shape, int n, uint64_t iters)
{
    char *buf = bench_slots((size_t)n);
    starpu_data_handle_t *h = reg_slots(buf, (size_t)n);
    int rc = 0;
    double t0 = bench_now();
    for (int k = 0; k < n && rc == 0; k++) {
        int ret;
        if (shape == METG_W1 || k < BENCH_STENCIL_W) {
            ret = starpu_task_insert(&cl_spin, STARPU_VALUE, &iters, sizeof iters, STARPU_W, h[k], 0);
        } else {
            int d[3];
            bench_stencil_deps(k / BENCH_STENCIL_W, k % BENCH_STENCIL_W, d);
            ret = starpu_task_insert(&cl_spin, STARPU_VALUE, &iters, sizeof iters, STARPU_R, h[d[0]],
                                     STARPU_R, h[d[1]], STARPU_R, h[d[2]], STARPU_W, h[k], 0);
        }
        if (ret != 0)
            rc = insert_failed(ret);
    }
    if (rc == 0)
        rc = wait_all();
    double t1 = bench_now();
    unreg_slots(h, (size_t)n);
    free(buf);
    return rc == 0 ? t1 - t0 : -1.0;
}
