/*
 * test_stress.c - a million tasks through a small heap ring.
 *
 * A THREAD-mode worker with 2 next-level leaves and a 1 MiB heap ring per
 * scope depth. Every task auto-allocates one 4 KiB OUTPUT (base 0) that the
 * next task of the same scope reads (INPUT); a new nested scope opens every
 * 64 tasks, so the ring (256 slabs) fills and submit must wait for finished
 * inner scopes to be reclaimed (back-pressure) while the orchestrator keeps
 * submitting.
 *
 * The leaf writes its task index into the first and last word of its OUTPUT
 * and checks that its INPUT holds the previous index, so a missing
 * dependency, a slab handed out twice, or (under TSan) a missing
 * happens-before between producer, consumer and the slab's next owner shows
 * up. Checks: run_end returns 0, every task ran exactly once, the data chain
 * is intact, the resident set stays flat (sampled from the submitting loop
 * after ~100k tasks and at the end), rings[1].stalls > 0, and everything is
 * reclaimed after run_end.
 *
 * Environment: PTO_STRESS_TASKS=n (default 1000000).
 */
#include "testutil.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SLAB_BYTES 4096u
#define SCOPE_TASKS 64
#define HEAP_RING (1u << 20)

static _Atomic uint8_t *g_runs;          /* per task: times its leaf ran */
static _Atomic uint64_t g_ntasks;
static _Atomic uint64_t g_ring_lo[PTO_MAX_RING_DEPTH], g_ring_hi[PTO_MAX_RING_DEPTH];
static _Atomic int64_t g_leaf_calls;
static _Atomic int64_t g_bad_callable;
static _Atomic int64_t g_bad_args;       /* wrong tensor count or sizes */
static _Atomic int64_t g_bad_addr;       /* tensor outside every heap ring */
static _Atomic int64_t g_bad_data;       /* input did not hold the producer's index */
static _Atomic int64_t g_first_bad_data = -1;

static int in_ring(uint64_t lo, uint64_t hi)
{
    for (int r = 0; r < PTO_MAX_RING_DEPTH; r++) {
        uint64_t a = atomic_load_explicit(&g_ring_lo[r], memory_order_relaxed);
        uint64_t b = atomic_load_explicit(&g_ring_hi[r], memory_order_relaxed);
        if (a && lo >= a && hi <= b) return 1;
    }
    return 0;
}

/* Pointer to the first byte of t if its bytes lie in a heap ring, else NULL. */
static unsigned char *ring_bytes(const pto_tensor *t)
{
    uint64_t lo = t->base + t->offset, n = pto_tensor_nbytes(t);
    if (n != SLAB_BYTES || !in_ring(lo, lo + n)) return NULL;
    return (unsigned char *)(uintptr_t)lo;
}

static int leaf(void *ctx, uint64_t callable, const pto_args_view *v, const pto_call_config *cfg,
                char *err, size_t errlen)
{
    (void)ctx; (void)cfg; (void)err; (void)errlen;
    atomic_fetch_add_explicit(&g_leaf_calls, 1, memory_order_relaxed);
    if (callable >= atomic_load_explicit(&g_ntasks, memory_order_relaxed)) {
        atomic_fetch_add(&g_bad_callable, 1);
        return 0;
    }
    atomic_fetch_add_explicit(&g_runs[callable], 1, memory_order_relaxed);
    int want = (callable % SCOPE_TASKS) ? 2 : 1;
    if (v->tensor_count != want) { atomic_fetch_add(&g_bad_args, 1); return 0; }
    if (want == 2) {
        const unsigned char *in = ring_bytes(&v->tensors[1]);
        if (!in) { atomic_fetch_add(&g_bad_addr, 1); return 0; }
        uint64_t a, b;
        memcpy(&a, in, 8);
        memcpy(&b, in + SLAB_BYTES - 8, 8);
        if (a != callable - 1 || b != callable - 1) {
            if (atomic_fetch_add(&g_bad_data, 1) == 0) atomic_store(&g_first_bad_data, (int64_t)callable);
        }
    }
    unsigned char *out = ring_bytes(&v->tensors[0]);
    if (!out) { atomic_fetch_add(&g_bad_addr, 1); return 0; }
    memcpy(out, &callable, 8);
    memcpy(out + SLAB_BYTES - 8, &callable, 8);
    return 0;
}

/* VmRSS of this process in KiB, or -1. */
static long vm_rss_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long kb = -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS:", 6) == 0) { kb = strtol(line + 6, NULL, 10); break; }
    fclose(f);
    return kb;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static long env_long(const char *name, long dflt)
{
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    long x = strtol(v, &end, 10);
    return (*end || x <= 0) ? dflt : x;
}

#if defined(__SANITIZE_ADDRESS__)
/* ASan's quarantine keeps freed blocks resident (up to 256 MB): RSS is not
 * meaningful there, so growth is only reported. */
#define RSS_LIMIT_KB (-1L)
#elif defined(__SANITIZE_THREAD__)
#define RSS_LIMIT_KB (16L * 1024)
#else
#define RSS_LIMIT_KB (4L * 1024)
#endif

static void test_stress(void)
{
    uint64_t n = (uint64_t)env_long("PTO_STRESS_TASKS", 1000000);
    atomic_store(&g_ntasks, n);
    g_runs = malloc(n * sizeof *g_runs);
    if (!g_runs) { CHECK(g_runs != NULL); return; }
    /* Touch every page now so the counters do not count as growth (a plain
     * memset after malloc may become calloc and leave the pages untouched). */
    for (uint64_t i = 0; i < n; i++) atomic_store_explicit(&g_runs[i], 0, memory_order_relaxed);

    pto_worker *w = tu_worker(2, 0, leaf, NULL, HEAP_RING, 10000);
    pto_stats st;
    pto_worker_stats_get(w, &st);
    for (int r = 0; r < PTO_MAX_RING_DEPTH; r++) {
        uint64_t lo = (uint64_t)(uintptr_t)pto_worker_ring_base(w, r);
        atomic_store(&g_ring_lo[r], lo);
        atomic_store(&g_ring_hi[r], lo + st.rings[r].capacity_bytes);
    }
    CHECK_EQ(st.rings[1].capacity_bytes, HEAP_RING);

    uint64_t sample_at = n / 10 < 100000 ? n / 10 : 100000;
    long rss_early = -1, rss_late = -1;
    double t0 = now_s();
    pto_orch *o = pto_run_begin(w);
    CHECK(o != NULL);
    if (!o) { pto_worker_close(w); free((void *)g_runs); return; }

    pto_tensor prev;
    memset(&prev, 0, sizeof prev);
    int depth = 0;
    int64_t submit_fail = 0, scope_fail = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (i % SCOPE_TASKS == 0) {
            if (depth) {
                if (pto_scope_end(o) != 0 && scope_fail++ == 0)
                    fprintf(stderr, "pto_scope_end before task %" PRIu64 ": %s\n", i, pto_errmsg());
                depth--;
            }
            if (pto_scope_begin(o) != 0) {
                if (scope_fail++ == 0) fprintf(stderr, "pto_scope_begin at task %" PRIu64 ": %s\n", i, pto_errmsg());
            } else {
                depth++;
            }
        }
        pto_tensor t[2];
        uint8_t tags[2] = {PTO_OUTPUT, PTO_INPUT};
        t[0] = tu_tensor(0, 0, SLAB_BYTES / 4);
        t[1] = prev;
        pto_task_args a = {.tensor_count = (i % SCOPE_TASKS) ? 2 : 1, .tensors = t, .tags = tags};
        if (pto_submit_next_level(o, i, &a, NULL, -1) < 0) {
            if (submit_fail++ == 0)
                fprintf(stderr, "submit of task %" PRIu64 " failed: %s\n", i, pto_errmsg());
            if (submit_fail > 10) break;
            memset(&prev, 0, sizeof prev);
            continue;
        }
        if (t[0].base == 0 && submit_fail++ == 0)
            fprintf(stderr, "task %" PRIu64 ": submit did not fill in the OUTPUT's base\n", i);
        prev = t[0];
        if (i + 1 == sample_at) rss_early = vm_rss_kb();
    }
    if (depth && pto_scope_end(o) != 0 && scope_fail++ == 0)
        fprintf(stderr, "pto_scope_end at the end: %s\n", pto_errmsg());
    rss_late = vm_rss_kb();
    double t_sub = now_s() - t0;
    int rc = pto_run_end(w);
    double t_all = now_s() - t0;
    if (rc != 0) fprintf(stderr, "pto_run_end: %s\n", pto_errmsg());
    CHECK_EQ(rc, 0);
    CHECK_EQ(submit_fail, 0);
    CHECK_EQ(scope_fail, 0);
    long rss_after = vm_rss_kb();

    /* Every task ran exactly once; the data chain held. */
    uint64_t not_once = 0, first_bad = n;
    for (uint64_t i = 0; i < n; i++)
        if (atomic_load_explicit(&g_runs[i], memory_order_relaxed) != 1) {
            if (!not_once++) first_bad = i;
        }
    if (not_once)
        fprintf(stderr, "%" PRIu64 " tasks did not run exactly once (first: task %" PRIu64 ", ran %d times)\n",
                not_once, first_bad, (int)atomic_load(&g_runs[first_bad]));
    CHECK_EQ(not_once, 0);
    CHECK_EQ(atomic_load(&g_leaf_calls), (long long)n);
    CHECK_EQ(atomic_load(&g_bad_callable), 0);
    CHECK_EQ(atomic_load(&g_bad_args), 0);
    CHECK_EQ(atomic_load(&g_bad_addr), 0);
    if (atomic_load(&g_bad_data))
        fprintf(stderr, "%" PRId64 " tasks read an INPUT that did not hold their producer's data "
                "(first: task %" PRId64 ")\n", atomic_load(&g_bad_data), atomic_load(&g_first_bad_data));
    CHECK_EQ(atomic_load(&g_bad_data), 0);

    /* Flat memory. */
    long growth = (rss_early >= 0 && rss_late >= 0) ? rss_late - rss_early : -1;
    printf("stress: %" PRIu64 " tasks, submit %.2f s, total %.2f s (%.0f tasks/s); VmRSS after %" PRIu64
           " tasks %ld KiB, at the end %ld KiB (growth %ld KiB), after run_end %ld KiB\n",
           n, t_sub, t_all, (double)n / t_all, sample_at, rss_early, rss_late, growth, rss_after);
    CHECK(rss_early > 0 && rss_late > 0);
    if (RSS_LIMIT_KB >= 0) {
        if (growth > RSS_LIMIT_KB)
            fprintf(stderr, "VmRSS grew by %ld KiB between task %" PRIu64 " and the end (limit %ld KiB)\n",
                    growth, sample_at, RSS_LIMIT_KB);
        CHECK(growth <= RSS_LIMIT_KB);
    }

    /* Back-pressure engaged; everything returned. */
    pto_worker_stats_get(w, &st);
    printf("stress: rings[1] stalls %" PRId64 " (%.3f s), hwm %" PRIu64 " of %" PRIu64 " bytes; tasks_live_hwm %"
           PRId64 ", tensormap_hwm %" PRId64 ", ready_hwm %" PRId64 "\n",
           st.rings[1].stalls, (double)st.rings[1].stall_ns * 1e-9, st.rings[1].hwm_bytes,
           st.rings[1].capacity_bytes, st.tasks_live_hwm, st.tensormap_hwm, st.ready_hwm);
    CHECK(st.rings[1].stalls > 0);
    CHECK(st.rings[1].hwm_bytes <= st.rings[1].capacity_bytes);
    CHECK(st.rings[1].hwm_bytes > 0);
    CHECK_EQ(st.tasks_failed, 0);
    CHECK_EQ(st.tasks_live, 0);
    CHECK_EQ(st.tensormap_live, 0);
    for (int r = 0; r < PTO_MAX_RING_DEPTH; r++) {
        CHECK_EQ(st.rings[r].used_bytes, 0);
        CHECK_EQ(st.rings[r].live_slabs, 0);
    }

    pto_worker_close(w);
    free((void *)g_runs);
    g_runs = NULL;
}

int main(void)
{
    RUN(test_stress);
    return tu_finish();
}
