/* pto_microbench: two numbers the unit tests used to print on every run
 * without checking them, moved here so that tests only test.
 *   - gemm_tile throughput of the built-in chip runtime on one core, for
 *     64, 128 and 256 square f32 tiles;
 *   - the PROCESS-mode mailbox hand-off (mailbox.c) on its own: a no-op task
 *     posted and collected, the peer a forked process or a thread, with both
 *     sides spinning for 20 us before they sleep, or sleeping on the futex
 *     at once. Mean and percentiles of 20000 round trips.
 * A benchmark, not a test. Run it through scripts/bench_micro.sh (Release
 * build in build-bench/). Usage: pto_microbench [gemm|mailbox] */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "common.h"
#include "mailbox.h"

#define BIT(s) (1u << (s))
#define WAIT_MAX_NS 5000000000ll

static void die(const char *what)
{
    fprintf(stderr, "pto_microbench: %s: %s\n", what, pto_errmsg());
    exit(2);
}

/* ---- gemm_tile ---- */

static float frand(void) { return (float)(rand() % 2001 - 1000) / 1000.0f; }

static pto_tensor tile(float *p, uint32_t n)
{
    pto_tensor t = {.base = (uint64_t)(uintptr_t)p, .dtype = PTO_F32, .ndims = 2};
    t.shape[0] = n;
    t.shape[1] = n;
    return t;
}

static void bench_gemm(void)
{
    int64_t id = pto_kernel_register(NULL, "gemm_tile");
    if (id < 0) die("register gemm_tile");
    pto_kernel_fn gemm = pto_kernel_lookup((uint64_t)id);
    for (uint32_t n = 64; n <= 256; n *= 2) {
        size_t bytes = ((size_t)n * n * sizeof(float) + 63) / 64 * 64;
        float *A = aligned_alloc(64, bytes), *B = aligned_alloc(64, bytes), *C = aligned_alloc(64, bytes);
        if (!A || !B || !C) die("out of memory");
        for (uint32_t i = 0; i < n * n; i++) A[i] = frand(), B[i] = frand();
        pto_tensor t[3] = {tile(A, n), tile(B, n), tile(C, n)};
        pto_args_view v = {3, 0, t, NULL};
        char err[256];
        uint64_t calls = 0, t0 = pto_now_ns(), dt;
        do {
            if (gemm(&v, NULL, err, sizeof err) != 0) {
                fprintf(stderr, "pto_microbench: gemm_tile: %s\n", err);
                exit(2);
            }
            calls++;
        } while ((dt = pto_now_ns() - t0) < 200000000u);
        printf("  gemm_tile %ux%u f32: %.1f GFLOP/s (%.1f us per tile)\n", n, n, 2.0 * n * n * n * calls / dt,
               dt / 1e3 / calls);
        free(A), free(B), free(C);
    }
}

/* ---- mailbox hand-off ---- */

static int noop(void *ctx, uint64_t callable, const pto_args_view *a, const pto_call_config *cfg, char *err,
                size_t errlen)
{
    (void)ctx, (void)callable, (void)a, (void)cfg, (void)err, (void)errlen;
    return 0;
}

static const pto_leaf LEAF = {.run = noop, .name = "bench"};

typedef struct peer {
    pto_mailbox *mb;
    pto_leaf leaf;
    uint32_t spin_max;
    pthread_t thread;
    pid_t pid;
    uint32_t seq;
} peer;

static void *peer_body(void *arg)
{
    peer *p = arg;
    if (pto_mb_child_start(p->mb, &p->leaf) == 0) pto_mb_child_loop(p->mb, &p->leaf, p->spin_max, p->spin_max);
    return NULL;
}

static void peer_start(peer *p, bool as_process, uint32_t spin_max)
{
    p->leaf = LEAF;
    p->mb = pto_mb_map();
    if (!p->mb) die("pto_mb_map");
    atomic_store(&p->mb->state, PTO_MB_STARTING);
    p->spin_max = spin_max;
    p->pid = -1;
    p->seq = 0;
    if (as_process) {
        fflush(NULL);
        p->pid = fork();
        if (p->pid == 0) {
            peer_body(p);
            _exit(0);
        }
    } else {
        pthread_create(&p->thread, NULL, peer_body, p);
    }
    if (pto_mb_wait(p->mb, BIT(PTO_MB_STARTING), NULL, NULL, 0, WAIT_MAX_NS) != PTO_MB_IDLE) die("peer start");
}

static void peer_stop(peer *p)
{
    if (!pto_mb_cas(p->mb, PTO_MB_IDLE, PTO_MB_SHUTDOWN, NULL)) die("peer stop");
    pto_event_notify(&p->mb->to_child);
    if (p->pid > 0) waitpid(p->pid, NULL, 0);
    else pthread_join(p->thread, NULL);
    pto_mb_unmap(p->mb);
}

static void round_trip(peer *p, int64_t spin)
{
    pto_args_view v = {0, 0, NULL, NULL};
    if (pto_mb_post(p->mb, p->seq, 1, &v, NULL, NULL, 0, false) != 0) die("pto_mb_post");
    if (!pto_mb_wait_done(p->mb, p->seq++, spin, WAIT_MAX_NS)) die("task");
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static void latency(const char *what, bool as_process, uint32_t child_spin, int64_t parent_spin)
{
    enum { N = 20000 };
    static uint64_t rt[N];
    peer p;
    peer_start(&p, as_process, child_spin);
    for (int i = 0; i < 1000; i++) round_trip(&p, parent_spin);   /* warm */
    for (int i = 0; i < N; i++) {
        uint64_t t0 = pto_now_ns();
        round_trip(&p, parent_spin);
        rt[i] = pto_now_ns() - t0;
    }
    peer_stop(&p);
    qsort(rt, N, sizeof rt[0], cmp_u64);
    uint64_t sum = 0;
    for (int i = 0; i < N; i++) sum += rt[i];
    printf("  hand-off round trip, %-34s mean %6.2f us  p50 %6.2f  p90 %6.2f  p99 %7.2f\n", what,
           (double)sum / N / 1000.0, rt[N / 2] / 1000.0, rt[N * 9 / 10] / 1000.0, rt[N * 99 / 100] / 1000.0);
}

/* Streaming: the parent keeps every cell of the ring posted, writing each
 * freed cell again as soon as it has read its result, the way the
 * scheduler's pump does with a backlog; ns per task is the mailbox's own
 * throughput, the floor under a PROCESS-mode worker's per-task cost. */
static void stream(const char *what, bool as_process, int32_t tensors)
{
    enum { N = 400000 };
    peer p;
    peer_start(&p, as_process, 20000);
    pto_tensor t[4];
    for (int i = 0; i < 4; i++) t[i] = tile(NULL, 16);
    pto_args_view v = {tensors, 0, t, NULL};
    uint32_t posted = 0, collected = 0;
    uint64_t t0 = 0;
    for (int pass = 0; pass < 2; pass++) {   /* a warm-up pass, then the timed one */
        uint32_t end = posted + (pass ? N : N / 10);
        if (pass) t0 = pto_now_ns();
        while (collected != end) {
            bool wrote = false;
            while (posted != end && posted - collected < PTO_MB_CELLS) {
                if (pto_mb_write(p.mb, posted++, 1, &v, NULL, NULL, 0, false) != 0) die("pto_mb_write");
                wrote = true;
            }
            if (wrote) pto_mb_publish(p.mb, posted);
            for (int32_t fin = pto_mb_done_beyond(p.mb, collected); fin > 0; fin--, collected++) {
                const pto_mb_cell *c = pto_mb_cell_of(p.mb, collected);   /* read as the scheduler's collect does */
                if (c->rc || c->skipped) die("a streamed task failed");
            }
        }
    }
    uint64_t dt = pto_now_ns() - t0;
    peer_stop(&p);
    printf("  stream, %-40s %6.1f ns per task (%d tensor args)\n", what, (double)dt / N, tensors);
}

static void bench_mailbox(void)
{
    stream("process, ring kept full:", true, 0);
    stream("process, ring kept full:", true, 1);
    stream("thread, ring kept full:", false, 1);
    latency("process, both spin (20 us):", true, 20000, 20000);
    latency("process, futex only:", true, 0, 0);
    latency("thread, both spin (20 us):", false, 20000, 20000);
    latency("thread, futex only:", false, 0, 0);
}

int main(int argc, char **argv)
{
    const char *which = argc > 1 ? argv[1] : "all";
    bool all = strcmp(which, "all") == 0;
    if (!all && strcmp(which, "gemm") != 0 && strcmp(which, "mailbox") != 0) {
        fprintf(stderr, "usage: pto_microbench [gemm|mailbox]\n");
        return 2;
    }
    srand(1);
    if (all || strcmp(which, "gemm") == 0) bench_gemm();
    if (all || strcmp(which, "mailbox") == 0) bench_mailbox();
    return 0;
}
