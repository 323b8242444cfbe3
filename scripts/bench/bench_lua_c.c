/* pto_bench_lua_c - the C-own rows of scripts/bench_lua.sh: the four DAG
 * shapes of pto_bench (bench_shapes.c) submitted straight through pto.h,
 * on the same leaves the Lua rows use (two chips running the simulated
 * "noop" kernel, through pto_chip_leaf), in THREAD or PROCESS mode, in a
 * process with no Lua at all. The ratios divide by the same loops run
 * inside the Lua rows' process (bench_c_module.c); these rows show what
 * that process's Lua and its runs add to them.
 *   pto_bench_lua_c thread|process [reps]
 * Prints one line per shape: "<shape> <best us/task> <median us/task>",
 * over reps timed repetitions (default 5) after one warm-up.
 *   pto_bench_lua_c peak [tile] [threads]
 * The machine's GEMM peak the main job is measured against: the gemm_tile
 * kernel (tile x tile f32, default 64) called in a C loop on every core at
 * once (threads default: the online cores), for one second; prints
 * "peak <GFLOP/s total> <threads> <GFLOP/s per thread...>".
 *   pto_bench_lua_c jobloop [batch m n k tile] [threads]
 * The main job's own kernels with no runtime at all: examples/bgemm.lua's
 * gemm_tile and tile_add calls over its tiled A, B and C (default 4 8 8 8
 * 64), in its loop order, the output tiles dealt round-robin to a thread
 * per core, each with one P tile of its own (always hot), for one second;
 * prints "jobloop <GFLOP/s total> <threads>". What the main job could reach
 * if scheduling, dispatch and data placement cost nothing.
 *   pto_bench_lua_c job thread|process [batch m n k tile chips runs]
 * The main job's DAG through the C API: examples/bgemm.lua's loop (a scope
 * per output tile; per k a gemm_tile writing a temporary P from the heap
 * ring and a tile_add of P into the C tile) with its real kernels on its
 * chips (default 4 8 8 8 64 2 5), submitted straight through pto.h; prints
 * "job <mode> <first run GFLOP/s> <best run GFLOP/s> <ms per run> <submit
 * CPU ms> <drain CPU ms>", the last three the mean over the runs after the
 * first: the orchestrating thread's own CPU (CLOCK_THREAD_CPUTIME_ID) in
 * the submit loop and in pto_run_end, where it runs the scheduler's turns
 * until the run drains: CPU the chips, on two cores, do not get. Beside
 * bgemm.lua's own figures it separates what Lua costs the main job from
 * what the engine and the machine do.
 *   pto_bench_lua_c submitcpu [runs]
 * The orchestrator's own CPU per submit, which wall time hides while the
 * threads that execute are the bottleneck: CLOCK_THREAD_CPUTIME_ID around
 * the submit loop of one run of 200,000 tasks in one scope (THREAD mode,
 * two no-op chips), W1 (each task writes its own buffer) and the fan
 * 1->8->1, over runs runs (default 10) after a warm-up; prints
 * "submitcpu <shape> <median ns/submit> <median us/task wall>". A
 * benchmark, not a test. */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pto.h"

#include "bench_shapes.h"

static pto_worker *g_w;
static bench_shapes g_b;   /* its slots in the shared arena, as pto.tensor's memory is */

static void die(const char *what)
{
    fprintf(stderr, "pto_bench_lua_c: %s: %s\n", what, pto_errmsg());
    exit(2);
}

static double thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* The orchestrator thread's CPU in the last submit loop, in ns (submitcpu). */
static double g_submit_ns;

/* One timed repetition of a shape in a run of its own (W4: runs runs);
 * returns the task count. */
static long one_run(long (*shape)(pto_orch *, const bench_shapes *, int), int arg, int runs)
{
    long n = 0;
    for (int r = 0; r < runs; r++) {
        pto_orch *o = pto_run_begin(g_w);
        if (!o) die("pto_run_begin");
        double c0 = thread_cpu_ns();
        long k = shape(o, &g_b, arg);
        g_submit_ns = thread_cpu_ns() - c0;
        if (k < 0) die("submit");
        if (pto_run_end(g_w) != 0) die("pto_run_end");
        n += k;
    }
    return n;
}

static long w1(int n) { return one_run(bench_w1, n, 1); }
static long w3(int n) { return one_run(bench_w3, n, 1); }

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define N_TASKS 20000

static long run_shape(int s)
{
    switch (s) {
    case 0: return w1(N_TASKS);
    case 1: return one_run(bench_w2, N_TASKS, 1);
    case 2: return w3(N_TASKS);
    case 3: return one_run(bench_w4, 4, 200);
    default: return one_run(bench_w4, 16, 1);
    }
}

/* ---- peak and jobloop: kernels in a C loop on every core ---- */

/* m, or die: elems small values that keep the kernels' sums finite. */
static float *fill(float *m, size_t elems)
{
    if (!m) die("out of memory");
    for (size_t e = 0; e < elems; e++) m[e] = (float)(e % 17) / 16.0f - 0.5f;
    return m;
}

static float *filled(size_t elems) { return fill(aligned_alloc(64, (elems * sizeof(float) + 63) / 64 * 64), elems); }

static pto_tensor tile_tensor(const float *base, uint32_t n)
{
    pto_tensor t;
    memset(&t, 0, sizeof t);
    t.base = (uint64_t)(uintptr_t)base;
    t.dtype = PTO_F32;
    t.ndims = 2;
    t.shape[0] = t.shape[1] = n;
    return t;
}

static void call(pto_kernel_fn fn, pto_tensor *t, uint32_t count, const char *name)
{
    pto_args_view v = {count, 0, t, NULL};
    char err[256];
    if (fn(&v, NULL, err, sizeof err) != 0) {
        fprintf(stderr, "pto_bench_lua_c: %s: %s\n", name, err);
        exit(2);
    }
}

/* Run body(items[i]) on a thread each, items being n structs of size bytes,
 * and wait for them all. */
static void on_threads(void *(*body)(void *), void *items, size_t size, long n)
{
    pthread_t th[256];
    for (long i = 0; i < n; i++)
        if (pthread_create(&th[i], NULL, body, (char *)items + (size_t)i * size) != 0) die("pthread_create");
    for (long i = 0; i < n; i++) pthread_join(th[i], NULL);
}

/* ---- peak ---- */

typedef struct gemm_loop {
    pto_kernel_fn fn;
    uint32_t n;
    double gflops;
} gemm_loop;

static void *gemm_body(void *arg)
{
    gemm_loop *g = arg;
    float *m[3];
    pto_tensor t[3];
    for (int i = 0; i < 3; i++) {
        m[i] = filled((size_t)g->n * g->n);
        t[i] = tile_tensor(m[i], g->n);
    }
    uint64_t calls = 0;
    double t0 = now_us(), dt;
    do {
        call(g->fn, t, 3, "gemm_tile");
        calls++;
    } while ((dt = now_us() - t0) < 1e6);
    g->gflops = 2.0 * g->n * g->n * g->n * (double)calls / dt / 1e3;
    for (int i = 0; i < 3; i++) free(m[i]);
    return NULL;
}

static int peak(int argc, char **argv)
{
    uint32_t n = argc > 2 ? (uint32_t)atoi(argv[2]) : 64;
    long threads = argc > 3 ? atol(argv[3]) : sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1 || n > 1024 || threads < 1 || threads > 256) {
        fprintf(stderr, "usage: pto_bench_lua_c peak [tile] [threads]\n");
        return 2;
    }
    int64_t id = pto_kernel_register(NULL, "gemm_tile");
    if (id < 0) die("pto_kernel_register gemm_tile");
    gemm_loop g[256];
    for (long i = 0; i < threads; i++) g[i] = (gemm_loop){pto_kernel_lookup((uint64_t)id), n, 0};
    on_threads(gemm_body, g, sizeof *g, threads);
    double total = 0;
    for (long i = 0; i < threads; i++) total += g[i].gflops;
    printf("peak %.2f %ld", total, threads);
    for (long i = 0; i < threads; i++) printf(" %.2f", g[i].gflops);
    printf("\n");
    return 0;
}

/* ---- jobloop ---- */

typedef struct job_loop {
    pto_kernel_fn gemm, add;
    uint32_t batch, mt, nt, kt, n, index, threads;
    const float *a, *b;
    float *c;
    double gflops;
} job_loop;

static void *job_body(void *arg)
{
    job_loop *g = arg;
    size_t tt = (size_t)g->n * g->n;
    float *p = aligned_alloc(64, (tt * sizeof(float) + 63) / 64 * 64);
    if (!p) die("out of memory");
    uint64_t tiles_done = 0;
    double t0 = now_us(), dt;
    do {
        uint32_t out = 0;
        for (uint32_t b = 0; b < g->batch; b++)
            for (uint32_t i = 0; i < g->mt; i++)
                for (uint32_t j = 0; j < g->nt; j++, out++) {
                    if (out % g->threads != g->index) continue;
                    pto_tensor c = tile_tensor(g->c + (((size_t)b * g->mt + i) * g->nt + j) * tt, g->n);
                    for (uint32_t k = 0; k < g->kt; k++) {
                        pto_tensor t[3] = {tile_tensor(g->a + (((size_t)b * g->mt + i) * g->kt + k) * tt, g->n),
                                           tile_tensor(g->b + (((size_t)b * g->kt + k) * g->nt + j) * tt, g->n),
                                           tile_tensor(p, g->n)};
                        call(g->gemm, t, 3, "gemm_tile");
                        pto_tensor acc[2] = {c, t[2]};
                        call(g->add, acc, 2, "tile_add");
                        tiles_done++;
                    }
                }
    } while ((dt = now_us() - t0) < 1e6);
    g->gflops = 2.0 * g->n * g->n * g->n * (double)tiles_done / dt / 1e3;
    free(p);
    return NULL;
}

static int jobloop(int argc, char **argv)
{
    uint32_t d[5] = {4, 8, 8, 8, 64};
    for (int i = 0; i < 5 && i + 2 < argc; i++) d[i] = (uint32_t)atoi(argv[i + 2]);
    long threads = argc > 7 ? atol(argv[7]) : sysconf(_SC_NPROCESSORS_ONLN);
    for (int i = 0; i < 5; i++)
        if (d[i] < 1 || d[i] > 1024) threads = 0;
    if (threads < 1 || threads > 256) {
        fprintf(stderr, "usage: pto_bench_lua_c jobloop [batch m n k tile] [threads]\n");
        return 2;
    }
    int64_t gid = pto_kernel_register(NULL, "gemm_tile"), aid = pto_kernel_register(NULL, "tile_add");
    if (gid < 0 || aid < 0) die("pto_kernel_register gemm_tile / tile_add");
    size_t tt = (size_t)d[4] * d[4];
    float *a = filled(tt * d[0] * d[1] * d[3]), *b = filled(tt * d[0] * d[3] * d[2]);
    float *c = filled(tt * d[0] * d[1] * d[2]);
    job_loop g[256];
    for (long i = 0; i < threads; i++)
        g[i] = (job_loop){pto_kernel_lookup((uint64_t)gid), pto_kernel_lookup((uint64_t)aid), d[0], d[1], d[2], d[3], d[4],
                          (uint32_t)i, (uint32_t)threads, a, b, c, 0};
    on_threads(job_body, g, sizeof *g, threads);
    double total = 0;
    for (long i = 0; i < threads; i++) total += g[i].gflops;
    printf("jobloop %.2f %ld\n", total, threads);
    free(a);
    free(b);
    free(c);
    return 0;
}

/* The Worker every mode but peak and jobloop times: two chips running the
 * simulated "noop" kernel. */
static void start_worker(int32_t mode)
{
    pto_worker_config wc = {.level = 3, .mode = mode, .heap_ring_size = 16u << 20};
    int64_t id = pto_kernel_register(NULL, "noop");
    if (id < 0) die("pto_kernel_register");
    g_b.noop = (uint64_t)id;
    if (!(g_w = pto_worker_new(&wc))) die("pto_worker_new");
    for (int i = 0; i < 2; i++) {
        pto_leaf leaf = pto_chip_leaf();
        leaf.name = i ? "chip 2" : "chip 1";
        if (pto_worker_add_next_level(g_w, &leaf) < 0) die("pto_worker_add_next_level");
    }
    if (pto_worker_init(g_w) != 0) die("pto_worker_init");
}

#define CPU_TASKS 200000

static int submitcpu(int argc, char **argv)
{
    int runs = argc > 2 ? atoi(argv[2]) : 10;
    if (runs < 1 || runs > 100) runs = 10;
    /* THREAD mode reads the slots in this process: no shared arena needed for 200,000 of them. */
    g_b.slots = calloc((size_t)CPU_TASKS * BENCH_SLOT_ELEMS, sizeof(float));
    if (!g_b.slots) die("out of memory");
    start_worker(PTO_MODE_THREAD);
    static const char *const names[] = {"W1", "fan"};
    long (*const shapes[])(int) = {w1, w3};
    for (int s = 0; s < 2; s++) {
        double cpu[100], wall[100];
        shapes[s](CPU_TASKS);   /* warm-up */
        for (int r = 0; r < runs; r++) {
            double t0 = now_us();
            long n = shapes[s](CPU_TASKS);
            wall[r] = (now_us() - t0) / (double)n;
            cpu[r] = g_submit_ns / (double)n;
        }
        qsort(cpu, (size_t)runs, sizeof *cpu, cmp_d);
        qsort(wall, (size_t)runs, sizeof *wall, cmp_d);
        printf("submitcpu %s %.0f %.4f\n", names[s], cpu[runs / 2], wall[runs / 2]);
        fflush(stdout);
    }
    pto_worker_close(g_w);
    free(g_b.slots);
    return 0;
}

/* ---- job: the main job's DAG through the C API ---- */

/* In the shared arena: PROCESS-mode chips read it. */
static float *shm_filled(size_t elems) { return fill(pto_shm_alloc(elems * sizeof(float)), elems); }

static int job(int argc, char **argv)
{
    uint32_t d[7] = {4, 8, 8, 8, 64, 2, 5};   /* batch m n k tile chips runs */
    int32_t mode = argc > 2 && strcmp(argv[2], "thread") == 0 ? PTO_MODE_THREAD : PTO_MODE_PROCESS;
    bool ok = argc > 2 && (strcmp(argv[2], "thread") == 0 || strcmp(argv[2], "process") == 0);
    for (int i = 0; i < 7 && i + 3 < argc; i++) d[i] = (uint32_t)atoi(argv[i + 3]);
    for (int i = 0; i < 7; i++) ok = ok && d[i] >= 1 && d[i] <= 1024;
    if (!ok) {
        fprintf(stderr, "usage: pto_bench_lua_c job thread|process [batch m n k tile chips runs]\n");
        return 2;
    }
    uint32_t batch = d[0], mt = d[1], nt = d[2], kt = d[3], n = d[4], chips = d[5], runs = d[6];
    size_t tt = (size_t)n * n;
    float *a = shm_filled(tt * batch * mt * kt), *b = shm_filled(tt * batch * kt * nt);
    float *c = shm_filled(tt * batch * mt * nt);
    int64_t gid = pto_kernel_register(NULL, "gemm_tile"), aid = pto_kernel_register(NULL, "tile_add");
    if (gid < 0 || aid < 0) die("pto_kernel_register gemm_tile / tile_add");
    pto_worker_config wc = {.level = 3, .mode = mode, .heap_ring_size = 64u << 20};   /* as bgemm.lua */
    if (!(g_w = pto_worker_new(&wc))) die("pto_worker_new");
    for (uint32_t i = 0; i < chips; i++) {
        pto_leaf leaf = pto_chip_leaf();
        if (pto_worker_add_next_level(g_w, &leaf) < 0) die("pto_worker_add_next_level");
    }
    if (pto_worker_init(g_w) != 0) die("pto_worker_init");
    static const uint8_t tg[3] = {PTO_INPUT, PTO_INPUT, PTO_OUTPUT}, ta[2] = {PTO_INOUT, PTO_INPUT};
    double first = 0, best = 0, flops = 2.0 * batch * mt * nt * kt * (double)n * n * n;
    double wall = 0, submit_cpu = 0, drain_cpu = 0;   /* sums over the runs after the first */
    for (uint32_t r = 0; r < runs; r++) {
        memset(c, 0, tt * batch * mt * nt * sizeof(float));   /* outside the timed run, as C:fill(0) */
        double t0 = now_us(), c0 = thread_cpu_ns();
        pto_orch *o = pto_run_begin(g_w);
        if (!o) die("pto_run_begin");
        for (size_t bb = 0; bb < batch; bb++)
            for (size_t i = 0; i < mt; i++)
                for (size_t j = 0; j < nt; j++) {
                    pto_tensor ct = tile_tensor(c + ((bb * mt + i) * nt + j) * tt, n);
                    if (pto_scope_begin(o) != 0) die("pto_scope_begin");
                    for (size_t k = 0; k < kt; k++) {
                        pto_tensor g[3] = {tile_tensor(a + ((bb * mt + i) * kt + k) * tt, n),
                                           tile_tensor(b + ((bb * kt + k) * nt + j) * tt, n), tile_tensor(NULL, n)};
                        pto_task_args ga = {3, 0, g, tg, NULL};
                        if (pto_submit_next_level(o, (uint64_t)gid, &ga, NULL, -1) < 0) die("pto_submit_next_level");
                        pto_tensor t[2] = {ct, g[2]};   /* g[2]: the P the submit bound */
                        pto_task_args aa = {2, 0, t, ta, NULL};
                        if (pto_submit_next_level(o, (uint64_t)aid, &aa, NULL, -1) < 0) die("pto_submit_next_level");
                    }
                    if (pto_scope_end(o) != 0) die("pto_scope_end");
                }
        double c1 = thread_cpu_ns();
        if (pto_run_end(g_w) != 0) die("pto_run_end");
        double dt = now_us() - t0, gf = flops / dt / 1e3;
        if (r == 0) first = gf;
        if (gf > best) best = gf;
        if (r > 0) {
            wall += dt / 1e3;
            submit_cpu += (c1 - c0) / 1e6;
            drain_cpu += (thread_cpu_ns() - c1) / 1e6;
        }
    }
    double later = runs > 1 ? runs - 1 : 1;
    printf("job %s %.2f %.2f %.3f %.3f %.3f\n", argv[2], first, best, wall / later, submit_cpu / later, drain_cpu / later);
    pto_worker_close(g_w);
    pto_shm_free(a);
    pto_shm_free(b);
    pto_shm_free(c);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "job") == 0) return job(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "submitcpu") == 0) return submitcpu(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "peak") == 0) return peak(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "jobloop") == 0) return jobloop(argc, argv);
    if (argc < 2 || (strcmp(argv[1], "thread") && strcmp(argv[1], "process"))) {
        fprintf(stderr, "usage: pto_bench_lua_c thread|process [reps] | peak [tile] [threads] | jobloop [batch m n k tile] [threads] | job thread|process [batch m n k tile chips runs] | submitcpu [runs]\n");
        return 2;
    }
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    if (reps < 1 || reps > 100) reps = 5;
    size_t nslots = 3 * 16 * 16 * 16 > N_TASKS ? 3 * 16 * 16 * 16 : N_TASKS;
    g_b.slots = pto_shm_alloc(nslots * BENCH_SLOT_ELEMS * sizeof(float));
    if (!g_b.slots) die("pto_shm_alloc");
    start_worker(strcmp(argv[1], "thread") == 0 ? PTO_MODE_THREAD : PTO_MODE_PROCESS);
    static const char *const names[] = {"W1", "W2", "W3", "W4s", "W4l"};
    for (int s = 0; s < 5; s++) {
        double xs[100];
        run_shape(s);   /* warm-up */
        for (int r = 0; r < reps; r++) {
            double t0 = now_us();
            long n = run_shape(s);
            xs[r] = (now_us() - t0) / (double)n;
        }
        qsort(xs, (size_t)reps, sizeof *xs, cmp_d);
        printf("%s %.4f %.4f\n", names[s], xs[0], xs[reps / 2]);
        fflush(stdout);
    }
    pto_worker_close(g_w);
    pto_shm_free(g_b.slots);
    return 0;
}
