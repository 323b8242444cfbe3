/*
 * bench.h - shared declarations of the empty-task benchmark (pto_bench).
 *
 * Each system (ptolua, OpenMP, StarPU) lives in its own translation unit and
 * exposes a setup/teardown pair plus one function per DAG shape. A shape
 * function builds its inputs, times the DAG and returns the elapsed wall-clock
 * seconds of the timed section, or a negative value on error (after printing
 * the reason to stderr).
 *
 * Shapes (n = task count parameters):
 *   w1(n)        independent: n tasks, each OUTPUT to its own tensor
 *   w2(n)        chain: n tasks, each INOUT on one tensor
 *   w3(g)        fan: g groups of 1 producer -> 8 readers -> 1 joiner
 *   w4(d, reps)  bgemm d x d x d x d (gemm + tile_add per (b,m,n,k)),
 *                repeated reps times; the time covers all repetitions
 */
#ifndef PTO_BENCH_H
#define PTO_BENCH_H

#include <stddef.h>
#include <stdint.h>

/* Bytes per benchmark tensor slot: 16 f32 elements, 64-byte aligned. */
#define BENCH_SLOT_BYTES 64
#define BENCH_SLOT_ELEMS 16
/* Readers per fan group in W3. */
#define BENCH_FAN 8
/* Worker threads of every system. */
#define BENCH_THREADS 2

/* A zeroed, 64-byte-aligned array of n slots; aborts on failure. */
void *bench_slots(size_t n);
/* Monotonic wall clock in seconds. */
double bench_now(void);

/* Tasks in one fan group and in one bgemm repetition. */
#define BENCH_W3_TASKS_PER_GROUP (1 + BENCH_FAN + 1)
#define BENCH_W4_TASKS(d) (2LL * (d) * (d) * (d) * (d))

/* METG (metg.c): tasks that spin a calibrated number of iterations.
 * Shapes: METG_W1, n independent tasks; METG_STENCIL, a periodic 1-D
 * stencil of width BENCH_STENCIL_W, each task reading its own column and
 * both neighbours of the previous step (3 dependencies) and writing its
 * own slot (one slot per task, so no slot is written twice). */
enum { METG_W1 = 0, METG_STENCIL = 1, METG_NSHAPES };
#define BENCH_STENCIL_W (2 * BENCH_THREADS)
/* Spin iters iterations of a loop the compiler cannot remove. */
void bench_spin(uint64_t iters);
/* Nanoseconds per bench_spin iteration, measured on this thread. */
double bench_spin_calibrate(void);
/* The three producer slots of stencil task (t, i) (t >= 1). */
static inline void bench_stencil_deps(int t, int i, int deps[3])
{
    deps[0] = (t - 1) * BENCH_STENCIL_W + (i + BENCH_STENCIL_W - 1) % BENCH_STENCIL_W;
    deps[1] = (t - 1) * BENCH_STENCIL_W + i;
    deps[2] = (t - 1) * BENCH_STENCIL_W + (i + 1) % BENCH_STENCIL_W;
}
/* Per system: seconds to run shape with n tasks of iters iterations each
 * (n a multiple of BENCH_STENCIL_W), or < 0 on error. */
/* ptolua's METG Workers: THREAD mode, PROCESS mode (as by default: early
 * posts on), PROCESS mode without early posts (PTO_EARLY_POSTS=0 at init). */
enum { PTOLUA_METG_THREAD, PTOLUA_METG_PROCESS, PTOLUA_METG_NOEARLY, PTOLUA_METG_NWORKERS };
int ptolua_metg_setup(int which);
void ptolua_metg_teardown(void);
double ptolua_metg(int which, int shape, int n, uint64_t iters);
/* The floors under PROCESS mode (floor_procs.c): BENCH_THREADS child
 * processes forked at setup run the tasks with no runtime, the parent
 * relaying every dependency (relay = 1) or the children waiting for their
 * producers themselves (relay = 0). */
int floor_metg_setup(void);
void floor_metg_teardown(void);
double floor_metg(int relay, int shape, int n, uint64_t iters);
#ifdef PTO_BENCH_HAVE_OPENMP
double omp_metg(int shape, int n, uint64_t iters);
#endif
#ifdef PTO_BENCH_HAVE_STARPU
double starpu_metg(int shape, int n, uint64_t iters);
#endif
/* One no-op sub child through the C API: marginal cost per task and fixed
 * cost per run (back-to-back runs), in microseconds. 0 or -1. */
int ptolua_onesub(int32_t mode, double *marginal_us, double *fixed_us);
/* The METG table (metg.c); returns the number of errors. */
int bench_metg_main(int quick);
/* Efficiency of each system at the task durations of list ("2,4,8", us), best of reps runs (metg.c). */
int bench_metg_points(const char *list, int reps);

/* ptolua (bench_ptolua.c) */
int ptolua_setup(void);
void ptolua_teardown(void);
const char *ptolua_describe(void);
double ptolua_w1(int n);
double ptolua_w2(int n);
double ptolua_w3(int groups);
double ptolua_w4(int d, int reps);

/* OpenMP tasks with depend clauses (bench_omp.c; only built when the
 * compiler supports OpenMP, which defines PTO_BENCH_HAVE_OPENMP). */
#ifdef PTO_BENCH_HAVE_OPENMP
int omp_bench_setup(void);
void omp_bench_teardown(void);
const char *omp_bench_describe(void);
double omp_w1(int n);
/* Untimed W1: the share of its tasks the creating thread ran itself, or -1. */
double omp_w1_inline_share(int n);
/* Untimed W3: the same share of its tasks, or -1. */
double omp_w3_inline_share(int groups);
double omp_w2(int n);
double omp_w3(int groups);
double omp_w4(int d, int reps);
#endif

/* StarPU with implicit data dependencies (bench_starpu.c; only built when
 * libstarpu-dev is found, which defines PTO_BENCH_HAVE_STARPU). */
#ifdef PTO_BENCH_HAVE_STARPU
int starpu_bench_setup(void);
void starpu_bench_teardown(void);
const char *starpu_bench_describe(void);
double starpu_w1(int n);
double starpu_w2(int n);
double starpu_w3(int groups);
double starpu_w4(int d, int reps);
#endif

#endif
