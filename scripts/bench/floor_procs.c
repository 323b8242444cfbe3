/*
 * floor_procs.c - the floors under PROCESS mode's METG: BENCH_THREADS child
 * processes run METG's tasks (metg.c) straight from shared memory, with no
 * runtime at all, in two ways:
 *
 *   relay   the parent keeps the DAG: it sees every completion and posts
 *           each task to its child once its producers are done, as any
 *           design must whose children cannot read the DAG (PROCESS mode
 *           today). The parent's bookkeeping is a fan-in counter per task
 *           and a ring per child, nothing else; everyone waits as ptolua's
 *           parties do (spinning, offering the core: see look_pause),
 *           because a sleeping party costs a futex wake-up per hop
 *           (pto_pingpong).
 *   direct  each child runs its own columns in order and waits for its
 *           tasks' producers itself, on flags in shared memory; the parent
 *           only starts the run and sleeps until it ends. The bound of a
 *           design in which children resolve their cross-child
 *           dependencies themselves.
 *
 * Both place a stencil column on one child (columns split evenly) and W1's
 * tasks round robin, and both know the DAG before the run starts: they are
 * what a runtime costs at the least, not a runtime. The children are
 * forked once, at setup, and wait for each run on a futex.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "bench.h"

#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define FL_RING 16          /* tasks posted ahead to a child, as PTO_MB_CELLS */
#define FL_MAX_TASKS 100000 /* metg.c's tasks_for caps a point there */

typedef struct fl_child {
    _Alignas(64) _Atomic uint64_t posted;  /* parent: tasks posted so far this run */
    int32_t ids[FL_RING];                  /* parent: the task of post seq, at seq % FL_RING */
    _Alignas(64) _Atomic uint64_t done;    /* child: tasks it finished this run */
} fl_child;

typedef struct fl_shared {
    _Alignas(64) _Atomic uint32_t gen;     /* parent: bumped to start a run (a futex) */
    _Atomic uint32_t quit;
    int32_t relay, shape, n;
    uint64_t iters;
    _Alignas(64) _Atomic uint32_t over;    /* parent: the gen whose run is over (relay) */
    _Alignas(64) _Atomic uint32_t ended;   /* children done with the run, shared memory no longer read (a futex) */
    fl_child ch[BENCH_THREADS];
    _Alignas(64) _Atomic uint8_t flag[FL_MAX_TASKS];   /* direct: task k finished */
} fl_shared;

static fl_shared *g_fl;
static pid_t g_pid[BENCH_THREADS];

static void futex_wait(_Atomic uint32_t *a, uint32_t v)
{
    syscall(SYS_futex, (uint32_t *)a, FUTEX_WAIT, v, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *a) { syscall(SYS_futex, (uint32_t *)a, FUTEX_WAKE, INT_MAX, NULL, NULL, 0); }

/* The parties' wait between looks: a few pauses, then the core is offered.
 * Of offering it at every look, every 4th (as ptolua's waits do) or every
 * 16th, every look made the best relay on the 2-core VM (stencil of 1 / 2
 * / 4 us tasks: 43 / 60 / 73% efficient, against 38 / 56 / 63% at every
 * 4th); children that never offer it starve the parent and the run stalls.
 * (ptolua's own waits moved within the noise when they offered it at
 * every look: 2 us stencil 40-42% either way.) */
static void look_pause(void)
{
    for (int k = 0; k < 4; k++) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        __asm__ __volatile__("yield");
#endif
    }
    sched_yield();
}

/* The child of column i of a stencil row. */
static int col_owner(int i) { return i / (BENCH_STENCIL_W / BENCH_THREADS); }

static void end_run(fl_shared *s)
{
    if (atomic_fetch_add_explicit(&s->ended, 1, memory_order_acq_rel) + 1 == BENCH_THREADS) futex_wake(&s->ended);
}

static void child_relay(fl_shared *s, fl_child *c, uint32_t gen)
{
    uint64_t seq = 0;
    for (;;) {
        while (atomic_load_explicit(&c->posted, memory_order_acquire) == seq) {
            if (atomic_load_explicit(&s->over, memory_order_acquire) == gen) {
                end_run(s);
                return;
            }
            look_pause();
        }
        /* What a child reads of its task: the cell the parent wrote. */
        uint64_t iters = s->iters + (uint64_t)(c->ids[seq % FL_RING] < 0);
        bench_spin(iters);
        atomic_store_explicit(&c->done, ++seq, memory_order_release);
    }
}

static void wait_flag(fl_shared *s, int k)
{
    while (!atomic_load_explicit(&s->flag[k], memory_order_acquire)) look_pause();
}

static void child_direct(fl_shared *s, int me)
{
    if (s->shape == METG_W1) {
        for (int k = me; k < s->n; k += BENCH_THREADS) bench_spin(s->iters);
    } else {
        for (int k = 0; k < s->n; k++) {
            int t = k / BENCH_STENCIL_W, i = k % BENCH_STENCIL_W;
            if (col_owner(i) != me) continue;
            if (t > 0) {
                int d[3];
                bench_stencil_deps(t, i, d);
                for (int j = 0; j < 3; j++) wait_flag(s, d[j]);
            }
            bench_spin(s->iters);
            atomic_store_explicit(&s->flag[k], 1, memory_order_release);
        }
    }
    end_run(s);
}

/* seen: the gen at the fork (a child may first look after a run began).
 * A benchmark killed mid-run leaves no spinner: the child dies with its
 * parent, or exits at once if the parent went before it could ask. */
static void child_main(fl_shared *s, int me, uint32_t seen, pid_t parent)
{
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(1);
    for (;;) {
        uint32_t g;
        while ((g = atomic_load_explicit(&s->gen, memory_order_acquire)) == seen) futex_wait(&s->gen, seen);
        seen = g;
        if (atomic_load_explicit(&s->quit, memory_order_acquire)) _exit(0);
        if (s->relay) child_relay(s, &s->ch[me], g);
        else child_direct(s, me);
    }
}

int floor_metg_setup(void)
{
    void *p = mmap(NULL, sizeof(fl_shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("floor: mmap");
        return -1;
    }
    g_fl = p;
    pid_t parent = getpid();
    for (int i = 0; i < BENCH_THREADS; i++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) {
            perror("floor: fork");
            return -1;
        }
        if (pid == 0) child_main(g_fl, i, 0, parent);
        g_pid[i] = pid;
    }
    return 0;
}

void floor_metg_teardown(void)
{
    if (!g_fl) return;
    atomic_store(&g_fl->quit, 1);
    atomic_fetch_add(&g_fl->gen, 1);
    futex_wake(&g_fl->gen);
    for (int i = 0; i < BENCH_THREADS; i++)
        if (g_pid[i] > 0) waitpid(g_pid[i], NULL, 0);
    munmap(g_fl, sizeof(fl_shared));
    g_fl = NULL;
}

/* A FIFO of ready task ids per child, for the relay. */
typedef struct fl_queue {
    int32_t *ids;
    int head, tail;
} fl_queue;

/* The relay parent: collect each child's completions, count down their
 * consumers' fan-ins, post what became ready. */
static void relay_run(fl_shared *s, int n, int32_t *fanin, fl_queue *q)
{
    uint64_t got[BENCH_THREADS] = { 0 }, posted[BENCH_THREADS] = { 0 };
    int finished = 0;
    while (finished < n) {
        bool progress = false;
        for (int c = 0; c < BENCH_THREADS; c++) {
            fl_child *ch = &s->ch[c];
            uint64_t done = atomic_load_explicit(&ch->done, memory_order_acquire);
            for (; got[c] < done; got[c]++, finished++) {
                progress = true;
                if (s->shape == METG_W1) continue;
                int k = ch->ids[got[c] % FL_RING], t = k / BENCH_STENCIL_W, i = k % BENCH_STENCIL_W;
                if ((t + 1) * BENCH_STENCIL_W >= n) continue;   /* the last row has no consumers */
                for (int dj = -1; dj <= 1; dj++) {
                    int j = (i + dj + BENCH_STENCIL_W) % BENCH_STENCIL_W, cons = (t + 1) * BENCH_STENCIL_W + j;
                    if (--fanin[cons] == 0) q[col_owner(j)].ids[q[col_owner(j)].tail++] = cons;
                }
            }
            while (posted[c] - got[c] < FL_RING && q[c].head < q[c].tail) {
                ch->ids[posted[c] % FL_RING] = q[c].ids[q[c].head++];
                atomic_store_explicit(&ch->posted, ++posted[c], memory_order_release);
                progress = true;
            }
        }
        if (!progress) look_pause();
    }
}

static void await_end(fl_shared *s)
{
    uint32_t e;
    while ((e = atomic_load_explicit(&s->ended, memory_order_acquire)) < BENCH_THREADS) futex_wait(&s->ended, e);
}

double floor_metg(int relay, int shape, int n, uint64_t iters)
{
    fl_shared *s = g_fl;
    if (!s || n > FL_MAX_TASKS) return -1.0;
    int32_t *fanin = calloc((size_t)n, sizeof *fanin);
    fl_queue q[BENCH_THREADS];
    for (int c = 0; c < BENCH_THREADS; c++) q[c] = (fl_queue){ calloc((size_t)n, sizeof(int32_t)), 0, 0 };
    for (int k = 0; k < n; k++) {
        bool first_row = shape == METG_W1 || k < BENCH_STENCIL_W;
        fanin[k] = first_row ? 0 : 3;
        if (first_row) {
            int c = shape == METG_W1 ? k % BENCH_THREADS : col_owner(k);
            q[c].ids[q[c].tail++] = k;
        }
    }
    s->relay = relay;
    s->shape = shape;
    s->n = n;
    s->iters = iters;
    for (int c = 0; c < BENCH_THREADS; c++) {
        atomic_store(&s->ch[c].posted, 0);
        atomic_store(&s->ch[c].done, 0);
    }
    atomic_store(&s->ended, 0);
    if (!relay) memset((void *)s->flag, 0, (size_t)n);
    double t0 = bench_now();
    uint32_t gen = atomic_fetch_add_explicit(&s->gen, 1, memory_order_acq_rel) + 1;
    futex_wake(&s->gen);
    if (relay) relay_run(s, n, fanin, q);
    else await_end(s);
    double t1 = bench_now();
    if (relay) {   /* the children stop looking at their rings before the next run resets them */
        atomic_store_explicit(&s->over, gen, memory_order_release);
        await_end(s);
    }
    free(fanin);
    for (int c = 0; c < BENCH_THREADS; c++) free(q[c].ids);
    return t1 - t0;
}
