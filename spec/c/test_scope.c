/*
 * test_scope.c - nested scopes: which heap ring each depth uses, the nesting
 * limit, unmatched ends, and reclamation of a scope's tasks at its end.
 */
#include "testutil.h"

#include "scope.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KIB 1024ull

static _Atomic long g_runs;
static _Atomic int g_gate;      /* the task of callable GATED blocks while set */
#define GATED 777

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int count_leaf(void *ctx, uint64_t callable, const pto_args_view *args, const pto_call_config *cfg, char *err,
                      size_t errlen)
{
    (void)ctx; (void)args; (void)cfg; (void)err; (void)errlen;
    atomic_fetch_add(&g_runs, 1);
    uint64_t t0 = now_ms();
    while (callable == GATED && atomic_load(&g_gate) && now_ms() - t0 < 5000) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

/* The ring whose mapping holds addr, or -1. */
static int ring_of(pto_worker *w, uint64_t addr)
{
    pto_stats st;
    pto_worker_stats_get(w, &st);
    for (int r = 0; r < PTO_MAX_RING_DEPTH; r++) {
        uint64_t lo = (uint64_t)(uintptr_t)pto_worker_ring_base(w, r);
        if (addr >= lo && addr < lo + st.rings[r].capacity_bytes) return r;
    }
    return -1;
}

static int64_t submit_out(pto_orch *o, uint64_t callable, uint32_t n_f32, pto_tensor *out, const pto_tensor *in)
{
    pto_tensor t[2] = {tu_tensor(0, 0, n_f32), {0}};
    uint8_t tags[2] = {PTO_OUTPUT, PTO_INPUT};
    if (in) t[1] = *in;
    pto_task_args a = {.tensor_count = in ? 2 : 1, .tensors = t, .tags = tags};
    int64_t id = pto_submit_next_level(o, callable, &a, NULL, -1);
    if (id < 0) fprintf(stderr, "submit: %s\n", pto_errmsg());
    if (out) *out = t[0];
    return id;
}

static int expected_ring(int depth) { return depth < PTO_MAX_RING_DEPTH - 1 ? depth : PTO_MAX_RING_DEPTH - 1; }

static void test_ring_selection_by_depth(void)
{
    atomic_store(&g_runs, 0);
    pto_worker *w = tu_worker(2, 0, count_leaf, NULL, 1 << 20, 5000);
    pto_orch *o = pto_run_begin(w);
    CHECK(o != NULL);
    if (!o) { pto_worker_close(w); return; }
    uint32_t n = 100;
    for (int d = 0; d <= 5; d++) {
        if (d) CHECK_EQ(pto_scope_begin(o), 0);
        CHECK_EQ(pto_scope_depth(o), d);
        int want = expected_ring(d);

        pto_tensor t;
        int64_t aid = pto_alloc(o, &n, 1, PTO_F32, &t);
        CHECK(aid >= 0);
        CHECK_EQ(ring_of(w, t.base), want);
        pto_task_info info;
        CHECK_EQ(pto_task_info_get(o, aid, &info), 0);
        CHECK_EQ(info.ring, want);
        CHECK_EQ(info.kind, -1);

        pto_tensor out;
        int64_t tid = submit_out(o, (uint64_t)d, 64, &out, &t);
        CHECK(tid >= 0);
        CHECK_EQ(ring_of(w, out.base), want);
        CHECK_EQ(pto_task_info_get(o, tid, &info), 0);
        CHECK_EQ(info.ring, want);
        CHECK_EQ(info.slab_bytes, 1024);

        /* A task with no auto OUTPUT has no slab. */
        pto_tensor in = out;
        uint8_t tag = PTO_INPUT;
        pto_task_args a = {.tensor_count = 1, .tensors = &in, .tags = &tag};
        int64_t rid = pto_submit_next_level(o, 100 + (uint64_t)d, &a, NULL, -1);
        CHECK(rid >= 0);
        CHECK_EQ(pto_task_info_get(o, rid, &info), 0);
        CHECK_EQ(info.ring, -1);
    }
    /* Each ring holds what its depth allocated: depths 3, 4, 5 share ring 3. */
    pto_stats st;
    pto_worker_stats_get(w, &st);
    CHECK_EQ(st.rings[0].live_slabs, 2);
    CHECK_EQ(st.rings[1].live_slabs, 2);
    CHECK_EQ(st.rings[2].live_slabs, 2);
    CHECK_EQ(st.rings[3].live_slabs, 6);
    /* Unwinding: depth and ring follow. */
    for (int d = 5; d >= 1; d--) {
        CHECK_EQ(pto_scope_end(o), 0);
        CHECK_EQ(pto_scope_depth(o), d - 1);
        pto_tensor t;
        CHECK(pto_alloc(o, &n, 1, PTO_F32, &t) >= 0);
        CHECK_EQ(ring_of(w, t.base), expected_ring(d - 1));
    }
    CHECK_EQ(pto_run_end(w), 0);
    CHECK_EQ(atomic_load(&g_runs), 12);
    pto_worker_close(w);
}

static void test_nesting_limit_64(void)
{
    atomic_store(&g_runs, 0);
    pto_worker *w = tu_worker(1, 0, count_leaf, NULL, 1 << 20, 5000);
    pto_orch *o = pto_run_begin(w);
    CHECK(o != NULL);
    if (!o) { pto_worker_close(w); return; }
    int ok = 0;
    for (int i = 0; i < PTO_MAX_SCOPE_DEPTH; i++) ok += pto_scope_begin(o) == 0;
    CHECK_EQ(ok, 64);
    CHECK_EQ(pto_scope_depth(o), 64);
    CHECK_EQ(pto_scope_begin(o), -1);
    CHECK_CONTAINS(pto_errmsg(), "64");
    CHECK_CONTAINS(pto_errmsg(), "scope");
    CHECK_EQ(pto_scope_depth(o), 64);
    CHECK_EQ(pto_scope_begin(o), -1);      /* still refused */
    CHECK_EQ(pto_scope_depth(o), 64);

    /* The deepest scope works: allocs and tasks land in the last ring. */
    pto_tensor out;
    CHECK(submit_out(o, 1, 16, &out, NULL) >= 0);
    CHECK_EQ(ring_of(w, out.base), PTO_MAX_RING_DEPTH - 1);

    /* Unwinding works, and once below the limit a scope can open again. */
    CHECK_EQ(pto_scope_end(o), 0);
    CHECK_EQ(pto_scope_depth(o), 63);
    CHECK_EQ(pto_scope_begin(o), 0);
    CHECK_EQ(pto_scope_depth(o), 64);
    ok = 0;
    for (int i = 0; i < PTO_MAX_SCOPE_DEPTH; i++) ok += pto_scope_end(o) == 0;
    CHECK_EQ(ok, 64);
    CHECK_EQ(pto_scope_depth(o), 0);
    CHECK_EQ(pto_scope_end(o), -1);
    CHECK(submit_out(o, 2, 16, &out, NULL) >= 0);
    CHECK_EQ(ring_of(w, out.base), 0);
    CHECK_EQ(pto_run_end(w), 0);
    CHECK_EQ(atomic_load(&g_runs), 2);

    /* Another run may nest 64 deep again, and run_end closes them all. */
    o = pto_run_begin(w);
    CHECK(o != NULL);
    if (o) {
        ok = 0;
        for (int i = 0; i < PTO_MAX_SCOPE_DEPTH; i++) {
            ok += pto_scope_begin(o) == 0;
            CHECK(submit_out(o, 3, 16, NULL, NULL) >= 0);
        }
        CHECK_EQ(ok, 64);
        CHECK_EQ(pto_scope_begin(o), -1);
        CHECK_EQ(pto_run_end(w), 0);
        pto_stats st;
        pto_worker_stats_get(w, &st);
        CHECK_EQ(st.tasks_live, 0);
        for (int r = 0; r < PTO_MAX_RING_DEPTH; r++) CHECK_EQ(st.rings[r].live_slabs, 0);
    }
    CHECK_EQ(atomic_load(&g_runs), 66);
    pto_worker_close(w);

    /* The internal stack: 64 nested frames above the outer one. */
    pto_scope s;
    pto_scope_init(&s);
    CHECK_EQ(pto_scope_push(&s), 0);   /* the run's outer frame */
    ok = 0;
    for (int i = 0; i < PTO_MAX_SCOPE_DEPTH; i++) ok += pto_scope_push(&s) == 0;
    CHECK_EQ(ok, 64);
    CHECK_EQ(pto_scope_nested(&s), 64);
    CHECK_EQ(pto_scope_ring(&s), 3);
    CHECK_EQ(pto_scope_push(&s), -1);
    CHECK_EQ(pto_scope_nested(&s), 64);
    pto_scope_destroy(&s);
}

static void test_unmatched_scope_end(void)
{
    atomic_store(&g_runs, 0);
    pto_worker *w = tu_worker(1, 0, count_leaf, NULL, 1 << 20, 5000);
    pto_orch *o = pto_run_begin(w);
    CHECK(o != NULL);
    if (!o) { pto_worker_close(w); return; }
    CHECK_EQ(pto_scope_end(o), -1);
    CHECK_CONTAINS(pto_errmsg(), "scope_end");
    CHECK_CONTAINS(pto_errmsg(), "no scope is open");
    CHECK_EQ(pto_scope_depth(o), 0);
    /* The outer scope is intact: its tensors stay usable. */
    pto_tensor a;
    CHECK(submit_out(o, 1, 16, &a, NULL) >= 0);
    CHECK(submit_out(o, 2, 16, NULL, &a) >= 0);
    CHECK_EQ(pto_scope_begin(o), 0);
    CHECK_EQ(pto_scope_end(o), 0);
    CHECK_EQ(pto_scope_end(o), -1);       /* one too many */
    CHECK_CONTAINS(pto_errmsg(), "no scope is open");
    CHECK(submit_out(o, 3, 16, NULL, &a) >= 0);
    CHECK_EQ(pto_run_end(w), 0);
    CHECK_EQ(atomic_load(&g_runs), 3);
    /* Outside a run it is an error too, and says so. */
    CHECK_EQ(pto_scope_end(o), -1);
    CHECK_CONTAINS(pto_errmsg(), "outside its run");
    CHECK_EQ(pto_scope_begin(o), -1);
    pto_worker_close(w);
}

static void test_scope_end_reclaims_tasks(void)
{
    atomic_store(&g_runs, 0);
    pto_worker *w = tu_worker(2, 0, count_leaf, NULL, 1 << 20, 5000);
    pto_orch *o = pto_run_begin(w);
    CHECK(o != NULL);
    if (!o) { pto_worker_close(w); return; }
    /* One outer task that lives for the whole run. */
    pto_tensor keep;
    int64_t outer = submit_out(o, 1, 256, &keep, NULL);
    CHECK(outer >= 0);

    for (int round = 0; round < 50; round++) {
        CHECK_EQ(pto_scope_begin(o), 0);
        int64_t ids[6];
        pto_tensor prev = keep;
        for (int i = 0; i < 6; i++) {
            ids[i] = submit_out(o, 10 + (uint64_t)i, 256, &prev, &prev);   /* a chain, 1 KiB each */
            CHECK(ids[i] >= 0);
        }
        CHECK_EQ(pto_drain(o), 0);
        pto_stats st;
        pto_worker_stats_get(w, &st);
        CHECK_EQ(st.rings[1].live_slabs, 6);           /* completed, but the scope holds them */
        CHECK_EQ(st.rings[1].used_bytes, 6 * KIB);
        pto_task_info info;
        for (int i = 0; i < 6; i++) {
            CHECK_EQ(pto_task_info_get(o, ids[i], &info), 0);
            CHECK_EQ(info.state, PTO_TASK_COMPLETED);
        }
        CHECK_EQ(pto_scope_end(o), 0);
        CHECK_EQ(pto_drain(o), 0);
        pto_worker_stats_get(w, &st);
        CHECK_EQ(st.rings[1].live_slabs, 0);
        CHECK_EQ(st.rings[1].used_bytes, 0);
        CHECK_EQ(st.rings[0].live_slabs, 1);           /* the outer task's slab remains */
        CHECK_EQ(st.tasks_live, 1);
        for (int i = 0; i < 6; i++) {
            CHECK_EQ(pto_task_info_get(o, ids[i], &info), 0);
            CHECK_EQ(info.state, PTO_TASK_CONSUMED);
        }
        CHECK_EQ(pto_task_info_get(o, outer, &info), 0);
        CHECK_EQ(info.state, PTO_TASK_COMPLETED);
    }

    /* Scope ended while its tasks are still queued or running: they are
     * reclaimed when they finish. Repeated with short and long chains. */
    int bad_rounds = 0;
    long expect_runs = 1 + 50 * 6 + 1;
    for (int round = 0; round < 300; round++) {
        int n = round < 50 ? 20 : 2;
        expect_runs += n;
        CHECK_EQ(pto_scope_begin(o), 0);
        int64_t ids[20];
        pto_tensor prev = keep;
        for (int i = 0; i < n; i++) ids[i] = submit_out(o, 20, 1024, &prev, &prev);
        CHECK_EQ(pto_scope_end(o), 0);
        CHECK_EQ(pto_drain(o), 0);
        pto_stats st;
        pto_worker_stats_get(w, &st);
        int not_consumed = 0;
        pto_task_info info;
        for (int i = 0; i < n; i++) {
            CHECK_EQ(pto_task_info_get(o, ids[i], &info), 0);
            not_consumed += info.state != PTO_TASK_CONSUMED;
        }
        if (st.rings[1].live_slabs != 0 || st.rings[1].used_bytes != 0 || st.tasks_live != 1 || not_consumed) {
            if (bad_rounds++ == 0)
                fprintf(stderr, "  round %d: after scope_end + pto_drain, ring 1 still has %lld live slabs "
                        "(%llu bytes), %lld tasks live (expected 1), %d of the scope's %d tasks not CONSUMED\n",
                        round, (long long)st.rings[1].live_slabs, (unsigned long long)st.rings[1].used_bytes,
                        (long long)st.tasks_live, not_consumed, n);
        }
    }
    if (bad_rounds) fprintf(stderr, "  %d of 300 rounds ended with a finished task not reclaimed\n",
                            bad_rounds);
    CHECK_EQ(bad_rounds, 0);
    CHECK(pto_task_count(o) > 0);                      /* the run is still open */
    CHECK(submit_out(o, 2, 16, NULL, &keep) >= 0);
    CHECK_EQ(pto_run_end(w), 0);
    CHECK_EQ(atomic_load(&g_runs), expect_runs);
    pto_worker_close(w);
}

/* One task is the last holder of many slabs of an ended scope. When it
 * finishes, the scheduler releases all those references; pto_drain must not
 * return before they are reclaimed. The window between the task's finish
 * and its last release is made long (many references) and the drain is
 * started right inside it (as soon as the task is seen COMPLETED). */
static void test_drain_reclaims_after_last_holder_finishes(void)
{
    enum { N = 20000 };
    atomic_store(&g_runs, 0);
    atomic_store(&g_gate, 1);
    pto_worker *w = tu_worker(1, 0, count_leaf, NULL, 32ull << 20, 5000);
    pto_orch *o = pto_run_begin(w);
    pto_tensor *t = calloc(N, sizeof *t);
    uint8_t *tags = calloc(N, 1);
    CHECK(o != NULL && t != NULL && tags != NULL);
    if (!o || !t || !tags) { free(t); free(tags); pto_worker_close(w); return; }
    CHECK_EQ(pto_scope_begin(o), 0);
    uint32_t n = 256;   /* 1 KiB each */
    int ok = 0;
    for (int i = 0; i < N; i++) {
        ok += pto_alloc(o, &n, 1, PTO_F32, &t[i]) >= 0;
        tags[i] = PTO_INPUT;
    }
    CHECK_EQ(ok, N);
    pto_task_args a = {.tensor_count = N, .tensors = t, .tags = tags};
    int64_t id = pto_submit_next_level(o, GATED, &a, NULL, -1);
    CHECK(id >= 0);
    CHECK_EQ(pto_scope_end(o), 0);            /* now only the task holds the slabs */
    pto_stats st;
    pto_worker_stats_get(w, &st);
    CHECK_EQ(st.rings[1].live_slabs, N);
    atomic_store(&g_gate, 0);
    pto_task_info info = {0};
    uint64_t t0 = now_ms();
    do {
        if (pto_task_info_get(o, id, &info) != 0) break;
        if (info.state == PTO_TASK_COMPLETED || info.state == PTO_TASK_CONSUMED) break;
        sched_yield();
    } while (now_ms() - t0 < 5000);
    CHECK_EQ(pto_drain(o), 0);
    pto_worker_stats_get(w, &st);
    if (st.rings[1].live_slabs != 0)
        fprintf(stderr, "  pto_drain returned with %lld of %d slabs (and %lld tasks) not yet reclaimed\n",
                (long long)st.rings[1].live_slabs, N, (long long)st.tasks_live);
    CHECK_EQ(st.rings[1].live_slabs, 0);
    CHECK_EQ(st.rings[1].used_bytes, 0);
    CHECK_EQ(st.tasks_live, 0);
    CHECK_EQ(pto_task_info_get(o, id, &info), 0);
    CHECK_EQ(info.state, PTO_TASK_CONSUMED);
    CHECK_EQ(pto_run_end(w), 0);
    CHECK_EQ(atomic_load(&g_runs), 1);
    free(t);
    free(tags);
    pto_worker_close(w);
}

int main(void)
{
    RUN(test_ring_selection_by_depth);
    RUN(test_nesting_limit_64);
    RUN(test_unmatched_scope_end);
    RUN(test_scope_end_reclaims_tasks);
    RUN(test_drain_reclaims_after_last_holder_finishes);
    return tu_finish();
}
