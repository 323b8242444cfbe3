/*
 * test_ring.c - heap rings: alignment, FIFO reclamation, wrap-around and
 * owner lookup as a unit; back-pressure, timeouts, deadlock detection,
 * shutdown and end-of-run reset through the engine.
 *
 * Engine cases use a "gate" leaf: the task of callable c blocks while
 * tu_hold[c] is set (at most TU_GATE_MAX_MS, so a wrong engine fails a
 * check instead of hanging), and so keeps its slab allocated.
 */
#include "testutil.h"

#include "common.h"
#include "ring.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NC TU_NC
#define WAIT_MS 3000
#define KIB 1024ull


static long started(int c) { return atomic_load(&tu_start[c]); }

/* Whether the mapping that holds addr is shared (its /proc/self/maps
 * permissions end in 's'); false if none holds it. */
static bool maps_line_shared(uintptr_t addr)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return false;
    char line[512];
    bool shared = false;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && lo <= addr && addr < hi) {
            shared = perms[3] == 's';
            break;
        }
    }
    fclose(f);
    return shared;
}
static long ended(int c) { return atomic_load(&tu_end[c]); }

/* Submit a task with one auto-allocated OUTPUT of `bytes` bytes (and
 * optionally one INPUT); the OUTPUT's storage is written to *out. */
static int64_t submit_out(pto_orch *o, uint64_t callable, uint64_t bytes, pto_tensor *out, const pto_tensor *in)
{
    pto_tensor t[2] = {tu_tensor(0, 0, (uint32_t)(bytes / 4)), {0}};
    uint8_t tags[2] = {PTO_OUTPUT, PTO_INPUT};
    if (in) t[1] = *in;
    pto_task_args a = {.tensor_count = in ? 2 : 1, .tensors = t, .tags = tags};
    int64_t id = pto_submit_next_level(o, callable, &a, NULL, -1);
    if (out) *out = t[0];
    return id;
}

/* A correct run: a chain of tasks with auto OUTPUTs in a scope. */
static void check_good_run(pto_worker *w)
{
    long before = atomic_load(&tu_runs);
    pto_orch *o = pto_run_begin(w);
    CHECK(o != NULL);
    if (!o) {
        fprintf(stderr, "run_begin: %s\n", pto_errmsg());
        return;
    }
    CHECK_EQ(pto_scope_begin(o), 0);
    pto_tensor prev;
    int64_t ok = 0;
    for (int i = 0; i < 8; i++) {
        int64_t id = submit_out(o, 1000 + (uint64_t)i, 4 * KIB, &prev, i ? &prev : NULL);
        if (id < 0) fprintf(stderr, "good run: submit %d: %s\n", i, pto_errmsg());
        ok += id >= 0;
    }
    CHECK_EQ(ok, 8);
    CHECK_EQ(pto_scope_end(o), 0);
    CHECK_EQ(pto_run_end(w), 0);
    CHECK_EQ(atomic_load(&tu_runs) - before, 8);
    pto_stats st;
    pto_worker_stats_get(w, &st);
    for (int r = 0; r < PTO_MAX_RING_DEPTH; r++) {
        CHECK_EQ(st.rings[r].used_bytes, 0);
        CHECK_EQ(st.rings[r].live_slabs, 0);
    }
}

/* ------------------------------------------------------------------ */
/* Unit                                                                */

static uint64_t g_fake[64];
#define FAKE(i) ((struct pto_slot *)(void *)&g_fake[(i)])

static void test_unit_alignment(void)
{
    pto_heap_ring r;
    CHECK(pto_ring_map(&r, 64 * KIB, false));
    CHECK_EQ((uintptr_t)r.base % PTO_HEAP_ALIGN, 0);
    uint64_t off, seq, sizes[] = {1024, 3072, 1024, 8192, 2048, 5120};
    uint64_t expect = 0;
    for (int i = 0; i < 6; i++) {
        CHECK(pto_ring_try_alloc(&r, sizes[i], FAKE(i), &off, &seq));
        CHECK_EQ(off % PTO_HEAP_ALIGN, 0);
        CHECK_EQ(off, expect);
        CHECK_EQ(seq, (uint64_t)i);
        expect += sizes[i];
    }
    CHECK_EQ(r.used, expect);
    /* Aligned after wrap, too. */
    for (uint64_t s = 0; s < 6; s++) pto_ring_release(&r, s);
    CHECK_EQ(r.used, 0);
    for (int i = 0; i < 200; i++) {
        uint64_t bytes = (uint64_t)(1 + i % 7) * 1024;
        bool got;
        while (!(got = pto_ring_try_alloc(&r, bytes, FAKE(i % 64), &off, &seq)) && r.count)
            pto_ring_release(&r, r.head_seq);   /* FIFO: free the oldest until it fits */
        CHECK(got);
        CHECK_EQ(off % PTO_HEAP_ALIGN, 0);
        CHECK(off + bytes <= r.size);
    }
    pto_ring_unmap(&r);
}

static void test_unit_fifo_release(void)
{
    pto_heap_ring r;
    CHECK(pto_ring_map(&r, 64 * KIB, false));
    uint64_t oa, ob, oc, sa, sb, sc, off, seq;
    CHECK(pto_ring_try_alloc(&r, 16 * KIB, FAKE(1), &oa, &sa));
    CHECK(pto_ring_try_alloc(&r, 16 * KIB, FAKE(2), &ob, &sb));
    CHECK(pto_ring_try_alloc(&r, 32 * KIB, FAKE(3), &oc, &sc));
    CHECK_EQ(oa, 0);
    CHECK_EQ(ob, 16 * KIB);
    CHECK_EQ(oc, 32 * KIB);
    CHECK_EQ(r.used, 64 * KIB);
    CHECK(!pto_ring_try_alloc(&r, 1024, FAKE(4), &off, &seq));   /* full */

    /* Release B (not the oldest): its bytes stop counting, but the tail
     * does not move, so its space cannot be reused yet. */
    CHECK(!pto_ring_release(&r, sb));
    CHECK_EQ(r.used, 48 * KIB);
    CHECK_EQ(r.count, 3);
    CHECK(pto_ring_oldest(&r) && pto_ring_oldest(&r)->owner == FAKE(1));
    CHECK(!pto_ring_try_alloc(&r, 16 * KIB, FAKE(4), &off, &seq));
    CHECK(!pto_ring_try_alloc(&r, 1024, FAKE(4), &off, &seq));
    CHECK(pto_ring_owner(&r, ob) == NULL);        /* released, even if not reclaimed */
    CHECK(pto_ring_owner(&r, oa + 100) == FAKE(1));

    /* Release A: A and B are reclaimed together. */
    CHECK(pto_ring_release(&r, sa));
    CHECK_EQ(r.used, 32 * KIB);
    CHECK_EQ(r.count, 1);
    CHECK(pto_ring_oldest(&r) && pto_ring_oldest(&r)->owner == FAKE(3));
    CHECK(pto_ring_try_alloc(&r, 32 * KIB, FAKE(5), &off, &seq));   /* fits only in A+B */
    CHECK_EQ(off, 0);
    CHECK_EQ(r.used, 64 * KIB);
    /* A stale sequence number is ignored. */
    CHECK(!pto_ring_release(&r, sa));
    CHECK_EQ(r.used, 64 * KIB);
    pto_ring_reset(&r);
    CHECK_EQ(r.used, 0);
    CHECK_EQ(r.count, 0);
    CHECK(pto_ring_try_alloc(&r, 64 * KIB, FAKE(6), &off, &seq));
    CHECK_EQ(off, 0);
    pto_ring_unmap(&r);
}

static void test_unit_wrap_and_owner(void)
{
    pto_heap_ring r;
    CHECK(pto_ring_map(&r, 64 * KIB, false));
    uint64_t oa, ob, oc, od, sa, sb, sc, sd;
    CHECK(pto_ring_try_alloc(&r, 24 * KIB, FAKE(1), &oa, &sa));
    CHECK(pto_ring_try_alloc(&r, 24 * KIB, FAKE(2), &ob, &sb));
    CHECK(pto_ring_release(&r, sa));
    /* 16 KiB left at the end: too small. 24 KiB free at the start: wrap. */
    CHECK(pto_ring_try_alloc(&r, 24 * KIB, FAKE(3), &oc, &sc));
    CHECK_EQ(oc, 0);
    CHECK(pto_ring_owner(&r, 0) == FAKE(3));
    CHECK(pto_ring_owner(&r, 24 * KIB - 1) == FAKE(3));
    CHECK(pto_ring_owner(&r, 24 * KIB) == FAKE(2));
    CHECK(pto_ring_owner(&r, 48 * KIB - 1) == FAKE(2));
    CHECK(pto_ring_owner(&r, 48 * KIB) == NULL);   /* the skipped gap at the end */
    CHECK(pto_ring_owner(&r, 64 * KIB - 1) == NULL);
    /* Wrapped: nothing fits between top (24K) and tail (24K). */
    uint64_t off, seq;
    CHECK(!pto_ring_try_alloc(&r, 1024, FAKE(9), &off, &seq));
    CHECK(pto_ring_release(&r, sb));
    CHECK(pto_ring_owner(&r, 30 * KIB) == NULL);
    CHECK(pto_ring_try_alloc(&r, 40 * KIB, FAKE(4), &od, &sd));
    CHECK_EQ(od, 24 * KIB);
    CHECK(pto_ring_owner(&r, 63 * KIB) == FAKE(4));
    CHECK(pto_ring_owner(&r, 1 * KIB) == FAKE(3));
    pto_ring_unmap(&r);

    /* Randomised FIFO churn against a model: no overlap among live slabs,
     * owner finds every live slab and NULL for free space; in a shared
     * ring and in a private one. */
    for (int priv = 0; priv < 2; priv++) {
    CHECK(pto_ring_map(&r, 64 * KIB, priv));
    enum { MAXL = 64 };
    struct { uint64_t off, bytes, seq; int owner; bool released; } live[MAXL];
    int nlive = 0, wraps = 0, bad_overlap = 0, bad_owner = 0, bad_free = 0;
    uint64_t rng = 12345, last_off = 0;
    for (int it = 0; it < 20000; it++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t bytes = ((rng >> 33) % 12 + 1) * 1024;
        int owner = (int)((rng >> 20) % 63) + 1;
        if (nlive < MAXL && pto_ring_try_alloc(&r, bytes, FAKE(owner), &off, &seq)) {
            if (off < last_off) wraps++;
            last_off = off;
            for (int k = 0; k < nlive; k++)
                if (!live[k].released && off < live[k].off + live[k].bytes && live[k].off < off + bytes)
                    bad_overlap++;
            live[nlive].off = off;
            live[nlive].bytes = bytes;
            live[nlive].seq = seq;
            live[nlive].owner = owner;
            live[nlive].released = false;
            nlive++;
        } else if (nlive) {
            /* Release one live slab, sometimes out of order. */
            int k = ((rng >> 40) % 3 == 0) ? (int)((rng >> 45) % (uint64_t)nlive) : 0;
            while (k < nlive && live[k].released) k++;
            if (k == nlive) k = 0;
            if (!live[k].released) {
                pto_ring_release(&r, live[k].seq);
                live[k].released = true;
            }
            int drop = 0;
            while (drop < nlive && live[drop].released) drop++;
            memmove(live, live + drop, sizeof live[0] * (size_t)(nlive - drop));
            nlive -= drop;
        }
        if (it % 16 == 0) {
            for (int k = 0; k < nlive; k++) {
                uint64_t probe[3] = {live[k].off, live[k].off + live[k].bytes / 2, live[k].off + live[k].bytes - 1};
                for (int j = 0; j < 3; j++) {
                    struct pto_slot *got = pto_ring_owner(&r, probe[j]);
                    if (live[k].released ? got != NULL : got != FAKE(live[k].owner)) bad_owner++;
                }
            }
            for (uint64_t a = 0; a < r.size; a += 512) {
                bool inside = false;
                for (int k = 0; k < nlive; k++)
                    inside |= !live[k].released && a >= live[k].off && a < live[k].off + live[k].bytes;
                if (!inside && pto_ring_owner(&r, a) != NULL) bad_free++;
            }
        }
    }
    CHECK(wraps > 100);
    CHECK_EQ(bad_overlap, 0);
    CHECK_EQ(bad_owner, 0);
    CHECK_EQ(bad_free, 0);
    pto_ring_unmap(&r);
    }
}

/* A shared ring is what a process forked later writes into for this one
 * (PROCESS mode's children); a private one (a level-3 THREAD-mode
 * Worker's) is this process's alone. Both are aligned for huge pages. */
static void test_unit_private_and_shared(void)
{
    for (int priv = 0; priv < 2; priv++) {
        pto_heap_ring r;
        CHECK(pto_ring_map(&r, 3 * PTO_HUGE_PAGE + 4 * KIB, priv));
        CHECK_EQ(maps_line_shared((uintptr_t)r.base), !priv);
        CHECK_EQ((uintptr_t)r.base % PTO_HUGE_PAGE, 0);
        r.base[0] = 1;
        r.base[r.size - 1] = 2;
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            r.base[0] = 7;
            _exit(0);
        }
        CHECK(pid > 0);
        int status = 0;
        CHECK_EQ(waitpid(pid, &status, 0), pid);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        CHECK_EQ(r.base[0], priv ? 1 : 7);
        CHECK_EQ(r.base[r.size - 1], 2);
        pto_ring_unmap(&r);
    }
}

/* Which Workers get which: only a level-3 THREAD-mode Worker's rings are
 * private; above level 3 a child may be a PROCESS-mode Worker whose chips
 * read them, and PROCESS mode's own children do. */
static void test_engine_private_rings(void)
{
    const struct { int32_t level, mode; bool priv; } cases[] = {
        {3, PTO_MODE_THREAD, true}, {3, PTO_MODE_PROCESS, false}, {4, PTO_MODE_THREAD, false}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pto_worker_config c = {.level = cases[i].level, .mode = cases[i].mode, .heap_ring_size = 4 * PTO_HUGE_PAGE};
        pto_worker *w = pto_worker_new(&c);
        CHECK(w != NULL);
        if (!w) continue;
        for (int k = 0; k < PTO_MAX_RING_DEPTH; k++) {
            uintptr_t base = (uintptr_t)pto_worker_ring_base(w, k);
            CHECK_EQ(base % PTO_HUGE_PAGE, 0);
            /* The mapping's kind, as the kernel lists it: shared anonymous memory is /dev/zero (deleted). */
            CHECK_EQ(maps_line_shared(base), !cases[i].priv);
        }
        pto_worker_close(w);
    }
}

/* ------------------------------------------------------------------ */
/* Engine                                                              */

static bool in_ring(pto_worker *w, int r, uint64_t addr)
{
    pto_stats st;
    pto_worker_stats_get(w, &st);
    uint64_t lo = (uint64_t)(uintptr_t)pto_worker_ring_base(w, r);
    return addr >= lo && addr < lo + st.rings[r].capacity_bytes;
}

static void test_engine_alignment(void)
{
    tu_gate_reset();
    pto_worker *w = tu_worker(2, 0, tu_gate_leaf, NULL, 1 << 20, 10000);
    pto_orch *o = pto_run_begin(w);
    CHECK(o != NULL);
    if (!o) { pto_worker_close(w); return; }
    uint32_t shapes[] = {3, 250, 256, 257, 1000, 1, 4096};
    uint64_t prev_base = 0;
    for (int i = 0; i < 7; i++) {
        pto_tensor t;
        CHECK(pto_alloc(o, &shapes[i], 1, PTO_F32, &t) >= 0);
        CHECK_EQ(t.base % PTO_HEAP_ALIGN, 0);
        CHECK_EQ(t.offset, 0);
        CHECK(in_ring(w, 0, t.base));
        CHECK(t.base != prev_base);
        prev_base = t.base;
    }
    uint32_t sh2[2] = {7, 3};
    pto_tensor t8;
    CHECK(pto_alloc(o, sh2, 2, PTO_I8, &t8) >= 0);   /* 21 bytes */
    CHECK_EQ(t8.base % PTO_HEAP_ALIGN, 0);

    /* Several auto OUTPUTs in one task are each aligned and disjoint. */
    CHECK_EQ(pto_scope_begin(o), 0);
    pto_tensor t[4] = {tu_tensor(0, 0, 3), tu_tensor(0, 0, 257), tu_tensor(0, 0, 1), tu_tensor(0, 0, 512)};
    uint8_t tags[4] = {PTO_OUTPUT, PTO_OUTPUT, PTO_OUTPUT, PTO_OUTPUT};
    pto_task_args a = {.tensor_count = 4, .tensors = t, .tags = tags};
    int64_t id = pto_submit_next_level(o, 1, &a, NULL, -1);
    CHECK(id >= 0);
    for (int i = 0; i < 4; i++) {
        CHECK_EQ(t[i].base % PTO_HEAP_ALIGN, 0);
        CHECK(in_ring(w, 1, t[i].base));
        for (int j = 0; j < i; j++)
            CHECK(t[j].base + pto_tensor_nbytes(&t[j]) <= t[i].base || t[i].base + pto_tensor_nbytes(&t[i]) <= t[j].base);
    }
    pto_task_info info;
    CHECK_EQ(pto_task_info_get(o, id, &info), 0);
    CHECK_EQ(info.ring, 1);
    CHECK_EQ(info.slab_offset % PTO_HEAP_ALIGN, 0);
    CHECK_EQ(info.slab_bytes, 1024 + 2048 + 1024 + 2048);
    CHECK_EQ(pto_scope_end(o), 0);
    CHECK_EQ(pto_run_end(w), 0);
    pto_worker_close(w);
}

static void test_inner_scope_churn_reclaims(void)
{
    tu_gate_reset();
    pto_worker *w = tu_worker(2, 0, tu_gate_leaf, NULL, 64 * KIB, 5000);
    pto_orch *o = pto_run_begin(w);
    CHECK(o != NULL);
    if (!o) { pto_worker_close(w); return; }
    uint32_t n = 4096;   /* 16 KiB held by the outer scope for the whole run */
    pto_tensor outer;
    CHECK(pto_alloc(o, &n, 1, PTO_F32, &outer) >= 0);
    CHECK(in_ring(w, 0, outer.base));
    uint64_t total = 0;
    int fails = 0;
    for (int it = 0; it < 300 && fails == 0; it++) {
        CHECK_EQ(pto_scope_begin(o), 0);
        pto_tensor a, b;
        int64_t x = submit_out(o, 100, 8 * KIB, &a, &outer);
        int64_t y = submit_out(o, 101, 12 * KIB, &b, &a);
        if (x < 0 || y < 0) {
            fprintf(stderr, "churn iteration %d: %s\n", it, pto_errmsg());
            fails++;
        }
        CHECK(in_ring(w, 1, a.base));
        total += 20 * KIB;
        CHECK_EQ(pto_scope_end(o), 0);
    }
    CHECK_EQ(fails, 0);
    CHECK(total > 64 * 64 * KIB);
    CHECK_EQ(pto_drain(o), 0);
    pto_stats st;
    pto_worker_stats_get(w, &st);
    CHECK_EQ(st.rings[0].live_slabs, 1);
    CHECK_EQ(st.rings[0].used_bytes, 16 * KIB);
    CHECK(st.rings[1].hwm_bytes <= 64 * KIB);
    CHECK_EQ(pto_run_end(w), 0);
    CHECK_EQ(atomic_load(&tu_runs), 600);
    pto_worker_close(w);
}

static void test_timeout_error_text(void)
{
    tu_gate_reset();
    pto_worker *w = tu_worker(2, 0, tu_gate_leaf, NULL, 64 * KIB, 200);
    pto_orch *o = pto_run_begin(w);
    CHECK(o != NULL);
    if (!o) { pto_worker_close(w); return; }
    atomic_store(&tu_hold[1], 1);
    CHECK_EQ(pto_scope_begin(o), 0);
    CHECK(submit_out(o, 1, 48 * KIB, NULL, NULL) >= 0);
    CHECK_EQ(pto_scope_end(o), 0);        /* the slab is now held only by the running task */
    CHECK(tu_wait_set(&tu_start[1], WAIT_MS));
    CHECK_EQ(pto_scope_begin(o), 0);
    uint64_t t0 = tu_now_ms();
    int64_t id = submit_out(o, 2, 32 * KIB, NULL, NULL);
    uint64_t dt = tu_now_ms() - t0;
    CHECK_EQ(id, -1);
    CHECK_CONTAINS(pto_errmsg(), "heap_ring_size");
    CHECK(strstr(pto_errmsg(), "deadlock") == NULL);
    CHECK(dt >= 190);
    CHECK(dt < 2000);
    printf("  timeout after %llu ms: %s\n", (unsigned long long)dt, pto_errmsg());
    CHECK_EQ(pto_scope_end(o), 0);
    CHECK_EQ(ended(1), 0);                 /* the blocker was still running throughout */
    atomic_store(&tu_hold[1], 0);
    int rc = pto_run_end(w);
    CHECK(rc == 0 || rc == -1);
    CHECK_EQ(started(2), 0);
    pto_stats st;
    pto_worker_stats_get(w, &st);
    CHECK(st.rings[1].stalls >= 1);
    check_good_run(w);
    CHECK_EQ(atomic_load(&tu_leaf_timeouts), 0);
    pto_worker_close(w);
}

static void test_reset_at_end_of_run(void)
{
    tu_gate_reset();
    pto_worker *w = tu_worker(2, 0, tu_gate_leaf, NULL, 64 * KIB, 2000);
    for (int run = 0; run < 3; run++) {
        pto_orch *o = pto_run_begin(w);
        CHECK(o != NULL);
        if (!o) break;
        /* Fill each ring to 40 KiB at its depth and leave it wrapped-ish. */
        pto_tensor t;
        uint32_t n40 = 10 * 1024;   /* 40 KiB */
        for (int d = 0; d < PTO_MAX_RING_DEPTH; d++) {
            if (d) CHECK_EQ(pto_scope_begin(o), 0);
            CHECK(pto_alloc(o, &n40, 1, PTO_F32, &t) >= 0);
            CHECK(in_ring(w, d, t.base));
            CHECK(submit_out(o, 1000 + (uint64_t)d, 8 * KIB, NULL, &t) >= 0);
        }
        pto_stats st;
        pto_worker_stats_get(w, &st);
        for (int r = 0; r < PTO_MAX_RING_DEPTH; r++) {
            CHECK_EQ(st.rings[r].used_bytes, 48 * KIB);
            CHECK_EQ(st.rings[r].live_slabs, 2);
        }
        /* Leave the scopes open: run_end closes them. */
        CHECK_EQ(pto_run_end(w), 0);
        pto_worker_stats_get(w, &st);
        for (int r = 0; r < PTO_MAX_RING_DEPTH; r++) {
            CHECK_EQ(st.rings[r].used_bytes, 0);
            CHECK_EQ(st.rings[r].live_slabs, 0);
        }
        /* The next run can use each whole ring at once. */
        o = pto_run_begin(w);
        CHECK(o != NULL);
        if (!o) break;
        uint32_t nall = 16 * 1024;   /* 64 KiB */
        for (int d = 0; d < PTO_MAX_RING_DEPTH; d++) {
            if (d) CHECK_EQ(pto_scope_begin(o), 0);
            int64_t id = pto_alloc(o, &nall, 1, PTO_F32, &t);
            if (id < 0) fprintf(stderr, "whole-ring alloc at depth %d: %s\n", d, pto_errmsg());
            CHECK(id >= 0);
            CHECK_EQ(t.base, (uint64_t)(uintptr_t)pto_worker_ring_base(w, d));
        }
        CHECK_EQ(pto_run_end(w), 0);
        pto_worker_stats_get(w, &st);
        for (int r = 0; r < PTO_MAX_RING_DEPTH; r++) {
            CHECK_EQ(st.rings[r].used_bytes, 0);
            CHECK_EQ(st.rings[r].live_slabs, 0);
        }
    }
    pto_worker_close(w);
}

typedef struct shutdown_arg {
    pto_worker *w;
    int delay_ms;
} shutdown_arg;

static void *shutdown_thread(void *p)
{
    shutdown_arg *a = p;
    tu_sleep_ms(a->delay_ms);
    pto_worker_shutdown(a->w);
    return NULL;
}

static void test_shutdown_unblocks_alloc(void)
{
    tu_gate_reset();
    pto_worker *w = tu_worker(2, 0, tu_gate_leaf, NULL, 64 * KIB, 30000);
    pto_orch *o = pto_run_begin(w);
    CHECK(o != NULL);
    if (!o) { pto_worker_close(w); return; }
    atomic_store(&tu_hold[1], 1);
    CHECK_EQ(pto_scope_begin(o), 0);
    CHECK(submit_out(o, 1, 48 * KIB, NULL, NULL) >= 0);
    CHECK_EQ(pto_scope_end(o), 0);
    CHECK(tu_wait_set(&tu_start[1], WAIT_MS));
    CHECK_EQ(pto_scope_begin(o), 0);      /* ring 1 again, where the blocker's slab is */
    shutdown_arg sa = {w, 200};
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, shutdown_thread, &sa), 0);
    uint64_t t0 = tu_now_ms();
    int64_t id = submit_out(o, 2, 32 * KIB, NULL, NULL);
    uint64_t dt = tu_now_ms() - t0;
    CHECK_EQ(id, -1);
    CHECK_CONTAINS(pto_errmsg(), "shut down");
    CHECK(dt >= 150);
    CHECK(dt < 3000);
    printf("  shutdown unblocked the submit after %llu ms: %s\n", (unsigned long long)dt, pto_errmsg());
    pthread_join(th, NULL);
    /* Further calls fail fast. */
    CHECK_EQ(pto_scope_begin(o), -1);
    CHECK_CONTAINS(pto_errmsg(), "shutting down");
    atomic_store(&tu_hold[1], 0);
    CHECK(tu_wait_set(&tu_end[1], WAIT_MS));
    pto_worker_close(w);
    CHECK_EQ(atomic_load(&tu_leaf_timeouts), 0);
}

static void deadlock_case(bool nested)
{
    tu_gate_reset();
    pto_worker *w = tu_worker(2, 0, tu_gate_leaf, NULL, 64 * KIB, 10000);
    pto_orch *o = pto_run_begin(w);
    CHECK(o != NULL);
    if (!o) { pto_worker_close(w); return; }
    if (nested) {
        CHECK_EQ(pto_scope_begin(o), 0);
        CHECK_EQ(pto_scope_begin(o), 0);   /* ring 2 */
    }
    for (int i = 0; i < 4; i++) CHECK(submit_out(o, 1000 + (uint64_t)i, 16 * KIB, NULL, NULL) >= 0);
    pto_stats st;
    pto_worker_stats_get(w, &st);
    CHECK_EQ(st.rings[nested ? 2 : 0].used_bytes, 64 * KIB);
    uint64_t t0 = tu_now_ms();
    int64_t id = submit_out(o, 1100, 4 * KIB, NULL, NULL);
    uint64_t dt = tu_now_ms() - t0;
    CHECK_EQ(id, -1);
    CHECK_CONTAINS(pto_errmsg(), "deadlock");
    CHECK_CONTAINS(pto_errmsg(), "heap_ring_size");
    CHECK(dt < 1000);
    if (!nested) printf("  deadlock reported after %llu ms: %s\n", (unsigned long long)dt, pto_errmsg());
    /* pto_alloc reports it the same way. */
    uint32_t n = 1024;
    pto_tensor t;
    t0 = tu_now_ms();
    CHECK_EQ(pto_alloc(o, &n, 1, PTO_F32, &t), -1);
    CHECK_CONTAINS(pto_errmsg(), "deadlock");
    CHECK(tu_now_ms() - t0 < 1000);
    int rc = pto_run_end(w);
    CHECK(rc == 0 || rc == -1);
    CHECK_EQ(atomic_load(&tu_runs), 4);
    check_good_run(w);
    pto_worker_close(w);
}

static void test_oversized_request_fails_at_once(void)
{
    tu_gate_reset();
    pto_worker *w = tu_worker(1, 0, tu_gate_leaf, NULL, 64 * KIB, 10000);
    pto_orch *o = pto_run_begin(w);
    CHECK(o != NULL);
    if (!o) { pto_worker_close(w); return; }
    uint32_t n = 16 * 1024 + 1;   /* one element more than the ring */
    pto_tensor t;
    uint64_t t0 = tu_now_ms();
    CHECK_EQ(pto_alloc(o, &n, 1, PTO_F32, &t), -1);
    CHECK_CONTAINS(pto_errmsg(), "heap_ring_size");
    CHECK(submit_out(o, 1, 128 * KIB, NULL, NULL) < 0);
    CHECK_CONTAINS(pto_errmsg(), "heap_ring_size");
    CHECK(tu_now_ms() - t0 < 1000);
    /* Exactly the ring's size fits. */
    n = 16 * 1024;
    CHECK(pto_alloc(o, &n, 1, PTO_F32, &t) >= 0);
    CHECK_EQ(pto_run_end(w), 0);
    CHECK_EQ(atomic_load(&tu_runs), 0);
    pto_worker_close(w);
}

static void test_deadlock_detected_outer_scope(void) { deadlock_case(false); }
static void test_deadlock_detected_nested_scope(void) { deadlock_case(true); }

int main(void)
{
    RUN(test_unit_alignment);
    RUN(test_unit_fifo_release);
    RUN(test_unit_wrap_and_owner);
    RUN(test_unit_private_and_shared);
    RUN(test_engine_private_rings);
    RUN(test_engine_alignment);
    RUN(test_inner_scope_churn_reclaims);
    RUN(test_timeout_error_text);
    RUN(test_reset_at_end_of_run);
    RUN(test_shutdown_unblocks_alloc);
    RUN(test_oversized_request_fails_at_once);
    RUN(test_deadlock_detected_outer_scope);
    RUN(test_deadlock_detected_nested_scope);
    return tu_finish();
}
