/*
 * test_tensormap.c - the TensorMap's tag table, seen through the engine and
 * as a unit.
 *
 * Engine cases use a "gate" leaf: the task of callable c records when it
 * starts and ends, and while tu_hold[c] is set it blocks (at most
 * TU_GATE_MAX_MS, so a wrong engine fails a check instead of hanging).
 * Whether task B depends on task A is then observable: block A, submit B on
 * another idle worker, and see whether B runs while A is still blocked.
 * Tasks are pinned to distinct workers so that a blocked worker's queue can
 * never be the reason a task does not start.
 */
#include "testutil.h"

#include "slot.h"
#include "tensormap.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------ */
/* Gate leaf                                                           */

#define NC TU_NC               /* callables 0..NC-1 are recorded */
#define WAIT_MS 3000           /* how long a check waits for something that must happen */
#define QUIET_MS 80            /* how long a check watches for something that must not happen */


static void hold(int c) { atomic_store(&tu_hold[c], 1); }
static void release(int c) { atomic_store(&tu_hold[c], 0); }
static long started(int c) { return atomic_load(&tu_start[c]); }
static long ended(int c) { return atomic_load(&tu_end[c]); }

static int64_t submit(pto_orch *o, uint64_t callable, int32_t pin, int32_t n, pto_tensor *ts, const uint8_t *tags)
{
    pto_task_args a = {.tensor_count = n, .scalar_count = 0, .tensors = ts, .tags = tags, .scalars = NULL};
    int64_t id = pto_submit_next_level(o, callable, &a, NULL, pin);
    if (id < 0) fprintf(stderr, "submit of callable %llu failed: %s\n", (unsigned long long)callable, pto_errmsg());
    return id;
}

static int64_t submit1(pto_orch *o, uint64_t callable, int32_t pin, pto_tensor *t, uint8_t tag)
{
    return submit(o, callable, pin, 1, t, &tag);
}

static int32_t fanin_of(pto_orch *o, int64_t id)
{
    pto_task_info info;
    if (pto_task_info_get(o, id, &info) != 0) return -1;
    return info.fanin;
}

/* The producers of id, which must be exactly the n ids in want (any order). */
static bool edges_are(pto_orch *o, int64_t id, const int64_t *want, int n)
{
    int64_t got[16];
    int k = pto_task_edges(o, id, 0, got, 16);
    if (k != n) {
        fprintf(stderr, "  task %lld has %d producers, expected %d\n", (long long)id, k, n);
        return false;
    }
    for (int i = 0; i < n; i++) {
        bool found = false;
        for (int j = 0; j < k; j++) found |= got[j] == want[i];
        if (!found) {
            fprintf(stderr, "  task %lld: producer %lld missing\n", (long long)id, (long long)want[i]);
            return false;
        }
    }
    return true;
}

static const char *tag_name(uint8_t t)
{
    static const char *n[] = {"INPUT", "OUTPUT", "INOUT", "OUTPUT_EXISTING", "NO_DEP"};
    return t <= PTO_NO_DEP ? n[t] : "?";
}

static uint8_t g_storage[1 << 16];   /* bases of user tensors (never dereferenced) */
#define BASE1 ((uint64_t)(uintptr_t)&g_storage[0])
#define BASE2 ((uint64_t)(uintptr_t)&g_storage[4096])
#define BASE3 ((uint64_t)(uintptr_t)&g_storage[8192])

/* B (callable 2, worker 1) was submitted after A (callable 1, worker 0),
 * which is blocked. If B must wait, it does not start while A is blocked and
 * starts after A ends; otherwise it runs to its end while A is still blocked.
 * Leaves A released. */
static void expect_order(const char *what, pto_orch *o, int a, int b, int64_t b_id, bool waits)
{
    int before = tu_failures;
    if (waits) {
        tu_sleep_ms(QUIET_MS);
        CHECK_EQ(started(b), 0);
        CHECK(fanin_of(o, b_id) >= 1);
        release(a);
        CHECK(tu_wait_set(&tu_end[b], WAIT_MS));
        CHECK(started(b) > ended(a));
    } else {
        CHECK(tu_wait_set(&tu_end[b], WAIT_MS));
        CHECK_EQ(ended(a), 0);   /* B finished while A was still blocked */
        release(a);
    }
    if (tu_failures != before) fprintf(stderr, "  ... in case: %s\n", what);
}

/* A tagA then B tagB on the same view of one base. */
static void pair_case(pto_worker *w, uint8_t tag_a, uint8_t tag_b, bool waits)
{
    char what[128];
    snprintf(what, sizeof what, "%s after %s %s", tag_name(tag_b), tag_name(tag_a), waits ? "waits" : "does not wait");
    tu_gate_reset();
    pto_orch *o = pto_run_begin(w);
    CHECK(o != NULL);
    if (!o) return;
    pto_tensor ta = tu_tensor(BASE1, 0, 64), tb = tu_tensor(BASE1, 0, 64);
    hold(1);
    int64_t a = submit1(o, 1, 0, &ta, tag_a);
    CHECK(tu_wait_set(&tu_start[1], WAIT_MS));
    int64_t b = submit1(o, 2, 1, &tb, tag_b);
    CHECK(a >= 0 && b >= 0);
    expect_order(what, o, 1, 2, b, waits);
    int64_t want[1] = {a};
    if (waits) {
        CHECK_EQ(fanin_of(o, b), 1);
        CHECK(edges_are(o, b, want, 1));
    } else {
        CHECK_EQ(fanin_of(o, b), 0);
        CHECK(edges_are(o, b, want, 0));
    }
    CHECK_EQ(pto_drain(o), 0);
    CHECK_EQ(pto_run_end(w), 0);
    CHECK_EQ(atomic_load(&tu_leaf_timeouts), 0);
}

/* A writes (tag_a, blocked), B writes (tag_b), C reads. */
static void writer_writer_reader(pto_worker *w, uint8_t tag_a, uint8_t tag_b, bool b_waits)
{
    char what[160];
    snprintf(what, sizeof what, "%s after %s, then INPUT", tag_name(tag_b), tag_name(tag_a));
    int before = tu_failures;
    tu_gate_reset();
    pto_orch *o = pto_run_begin(w);
    CHECK(o != NULL);
    if (!o) return;
    pto_tensor ta = tu_tensor(BASE1, 0, 64), tb = tu_tensor(BASE1, 0, 64), tc = tu_tensor(BASE1, 0, 64);
    hold(1);
    hold(2);
    int64_t a = submit1(o, 1, 0, &ta, tag_a);
    CHECK(tu_wait_set(&tu_start[1], WAIT_MS));
    int64_t b = submit1(o, 2, 1, &tb, tag_b);
    if (b_waits) {
        /* INOUT: B waits for A and then is the only writer C sees. */
        tu_sleep_ms(QUIET_MS);
        CHECK_EQ(started(2), 0);
        int64_t c = submit1(o, 3, 2, &tc, PTO_INPUT);
        int64_t wa[1] = {a}, wb[1] = {b};
        CHECK_EQ(fanin_of(o, b), 1);
        CHECK(edges_are(o, b, wa, 1));
        CHECK_EQ(fanin_of(o, c), 1);
        CHECK(edges_are(o, c, wb, 1));
        release(1);
        CHECK(tu_wait_set(&tu_start[2], WAIT_MS));
        CHECK(started(2) > ended(1));
        tu_sleep_ms(QUIET_MS);
        CHECK_EQ(started(3), 0);     /* C waits for B */
        release(2);
        CHECK(tu_wait_set(&tu_end[3], WAIT_MS));
        CHECK(started(3) > ended(2));
    } else {
        /* Pure overwrite: B runs while A is blocked; C depends only on B. */
        CHECK(tu_wait_set(&tu_start[2], WAIT_MS));
        CHECK_EQ(ended(1), 0);
        CHECK_EQ(fanin_of(o, b), 0);
        int64_t c = submit1(o, 3, 2, &tc, PTO_INPUT);
        int64_t wb[1] = {b};
        CHECK_EQ(fanin_of(o, c), 1);
        CHECK(edges_are(o, c, wb, 1));
        tu_sleep_ms(QUIET_MS);
        CHECK_EQ(started(3), 0);     /* C waits for B ... */
        release(2);
        CHECK(tu_wait_set(&tu_end[3], WAIT_MS));
        CHECK(started(3) > ended(2));
        CHECK_EQ(ended(1), 0);       /* ... but not for A, still blocked */
        release(1);
    }
    CHECK_EQ(pto_drain(o), 0);
    CHECK_EQ(pto_run_end(w), 0);
    CHECK_EQ(atomic_load(&tu_leaf_timeouts), 0);
    if (tu_failures != before) fprintf(stderr, "  ... in case: %s\n", what);
}

static pto_worker *gate_worker(int n) { return tu_worker(n, 0, tu_gate_leaf, NULL, 1 << 20, 10000); }

/* ------------------------------------------------------------------ */
/* Tag table through the engine                                        */

static void test_input_after_output_waits(void)
{
    pto_worker *w = gate_worker(4);
    pair_case(w, PTO_OUTPUT, PTO_INPUT, true);
    pair_case(w, PTO_INOUT, PTO_INPUT, true);
    pto_worker_close(w);
}

static void test_inout_after_output_waits_and_becomes_writer(void)
{
    pto_worker *w = gate_worker(4);
    pair_case(w, PTO_OUTPUT, PTO_INOUT, true);
    writer_writer_reader(w, PTO_OUTPUT, PTO_INOUT, true);
    pto_worker_close(w);
}

static void test_output_after_output_does_not_wait(void)
{
    pto_worker *w = gate_worker(4);
    pair_case(w, PTO_OUTPUT, PTO_OUTPUT, false);
    pair_case(w, PTO_INOUT, PTO_OUTPUT, false);
    writer_writer_reader(w, PTO_OUTPUT, PTO_OUTPUT, false);
    pto_worker_close(w);
}

static void test_output_existing_same_as_output(void)
{
    pto_worker *w = gate_worker(4);
    pair_case(w, PTO_OUTPUT_EXISTING, PTO_INPUT, true);        /* it is a writer */
    pair_case(w, PTO_OUTPUT_EXISTING, PTO_INOUT, true);
    pair_case(w, PTO_OUTPUT, PTO_OUTPUT_EXISTING, false);      /* pure overwrite */
    pair_case(w, PTO_OUTPUT_EXISTING, PTO_OUTPUT_EXISTING, false);
    writer_writer_reader(w, PTO_OUTPUT, PTO_OUTPUT_EXISTING, false);
    writer_writer_reader(w, PTO_OUTPUT_EXISTING, PTO_OUTPUT, false);
    pto_worker_close(w);
}

static void test_no_dep_neither_waits_nor_writes(void)
{
    pto_worker *w = gate_worker(4);
    pair_case(w, PTO_OUTPUT, PTO_NO_DEP, false);   /* does not wait */
    pair_case(w, PTO_NO_DEP, PTO_INPUT, false);    /* is not a writer */
    pair_case(w, PTO_NO_DEP, PTO_INOUT, false);

    /* A writes (blocked), B NO_DEP, C reads: C depends on A only. */
    tu_gate_reset();
    pto_orch *o = pto_run_begin(w);
    CHECK(o != NULL);
    if (o) {
        pto_tensor ta = tu_tensor(BASE1, 0, 64), tb = ta, tc = ta;
        hold(1);
        int64_t a = submit1(o, 1, 0, &ta, PTO_OUTPUT);
        CHECK(tu_wait_set(&tu_start[1], WAIT_MS));
        int64_t b = submit1(o, 2, 1, &tb, PTO_NO_DEP);
        CHECK(tu_wait_set(&tu_end[2], WAIT_MS));
        int64_t c = submit1(o, 3, 2, &tc, PTO_INPUT);
        int64_t wa[1] = {a};
        CHECK(b >= 0);
        CHECK(edges_are(o, c, wa, 1));
        tu_sleep_ms(QUIET_MS);
        CHECK_EQ(started(3), 0);
        release(1);
        CHECK(tu_wait_set(&tu_end[3], WAIT_MS));
        CHECK(started(3) > ended(1));
        CHECK_EQ(pto_drain(o), 0);
        CHECK_EQ(pto_run_end(w), 0);
    }
    pto_worker_close(w);
}

static void test_raw_waw_and_no_war(void)
{
    pto_worker *w = gate_worker(4);
    pair_case(w, PTO_OUTPUT, PTO_INPUT, true);     /* RAW */
    pair_case(w, PTO_INOUT, PTO_INOUT, true);      /* WAW through INOUT */
    pair_case(w, PTO_INPUT, PTO_OUTPUT, false);    /* no WAR edge */
    pair_case(w, PTO_INPUT, PTO_OUTPUT_EXISTING, false);
    pair_case(w, PTO_INPUT, PTO_INOUT, false);     /* a reader is no writer */
    pair_case(w, PTO_INPUT, PTO_INPUT, false);

    /* No WAR even with an earlier writer: W (done), R reads (blocked), X writes. */
    tu_gate_reset();
    pto_orch *o = pto_run_begin(w);
    CHECK(o != NULL);
    if (o) {
        pto_tensor tw = tu_tensor(BASE1, 0, 64), tr = tw, tx = tw;
        int64_t wid = submit1(o, 5, 3, &tw, PTO_OUTPUT);
        CHECK(tu_wait_set(&tu_end[5], WAIT_MS));
        hold(1);
        int64_t r = submit1(o, 1, 0, &tr, PTO_INPUT);
        CHECK(tu_wait_set(&tu_start[1], WAIT_MS));
        int64_t x = submit1(o, 2, 1, &tx, PTO_OUTPUT);
        CHECK(wid >= 0 && r >= 0 && x >= 0);
        expect_order("OUTPUT after a blocked reader", o, 1, 2, x, false);
        CHECK_EQ(pto_drain(o), 0);
        CHECK_EQ(pto_run_end(w), 0);
    }
    pto_worker_close(w);
}

/* ------------------------------------------------------------------ */
/* Producer de-duplication                                             */

static void test_producer_dedup_single_task(void)
{
    pto_worker *w = gate_worker(4);
    tu_gate_reset();
    pto_orch *o = pto_run_begin(w);
    CHECK(o != NULL);
    if (!o) { pto_worker_close(w); return; }
    /* P writes two bases and two views of a third; C reads all four. */
    pto_tensor pt[4] = {tu_tensor(BASE1, 0, 64), tu_tensor(BASE2, 0, 64), tu_tensor(BASE3, 0, 32),
                        tu_tensor(BASE3, 128, 32)};
    uint8_t pw[4] = {PTO_OUTPUT, PTO_OUTPUT, PTO_OUTPUT, PTO_OUTPUT};
    hold(1);
    int64_t p = submit(o, 1, 0, 4, pt, pw);
    CHECK(tu_wait_set(&tu_start[1], WAIT_MS));
    pto_tensor ct[4] = {pt[0], pt[1], tu_tensor(BASE3, 0, 64), pt[3]};
    uint8_t cr[4] = {PTO_INPUT, PTO_INOUT, PTO_INPUT, PTO_INPUT};
    int64_t c = submit(o, 2, 1, 4, ct, cr);
    CHECK(p >= 0 && c >= 0);
    CHECK_EQ(fanin_of(o, c), 1);
    int64_t want[1] = {p};
    CHECK(edges_are(o, c, want, 1));
    int64_t cons[8];
    CHECK_EQ(pto_task_edges(o, p, 1, cons, 8), 1);
    CHECK_EQ(cons[0], c);
    expect_order("reader of two of P's tensors", o, 1, 2, c, true);
    CHECK_EQ(pto_drain(o), 0);
    CHECK_EQ(pto_run_end(w), 0);
    pto_worker_close(w);
}

static void test_producer_dedup_group(void)
{
    pto_worker *w = gate_worker(4);
    tu_gate_reset();
    pto_orch *o = pto_run_begin(w);
    CHECK(o != NULL);
    if (!o) { pto_worker_close(w); return; }
    pto_tensor pt[2] = {tu_tensor(BASE1, 0, 64), tu_tensor(BASE2, 0, 64)};
    uint8_t pw[2] = {PTO_OUTPUT, PTO_OUTPUT};
    hold(1);
    int64_t p = submit(o, 1, 0, 2, pt, pw);
    CHECK(tu_wait_set(&tu_start[1], WAIT_MS));

    /* Both members read the same tensor of P. */
    pto_tensor m0[1] = {pt[0]}, m1[1] = {pt[0]};
    uint8_t rd[1] = {PTO_INPUT};
    pto_task_args ga[2] = {{1, 0, m0, rd, NULL}, {1, 0, m1, rd, NULL}};
    int64_t g = pto_submit_next_level_group(o, 2, ga, 2, NULL, NULL);
    if (g < 0) fprintf(stderr, "group submit: %s\n", pto_errmsg());
    CHECK(g >= 0);
    /* Members read different tensors of the same P. */
    pto_tensor n0[1] = {pt[0]}, n1[1] = {pt[1]};
    pto_task_args gb[2] = {{1, 0, n0, rd, NULL}, {1, 0, n1, rd, NULL}};
    int64_t g2 = pto_submit_next_level_group(o, 3, gb, 2, NULL, NULL);
    CHECK(g2 >= 0);

    int64_t want[1] = {p};
    pto_task_info info;
    CHECK_EQ(pto_task_info_get(o, g, &info), 0);
    CHECK_EQ(info.fanin, 1);
    CHECK_EQ(info.group_size, 2);
    CHECK(edges_are(o, g, want, 1));
    CHECK_EQ(fanin_of(o, g2), 1);
    CHECK(edges_are(o, g2, want, 1));
    tu_sleep_ms(QUIET_MS);
    CHECK_EQ(started(2), 0);
    CHECK_EQ(started(3), 0);
    release(1);
    CHECK(tu_wait_set(&tu_end[2], WAIT_MS));
    CHECK(tu_wait_set(&tu_end[3], WAIT_MS));
    CHECK(started(2) > ended(1));
    CHECK(started(3) > ended(1));
    CHECK_EQ(pto_drain(o), 0);
    CHECK_EQ(pto_run_end(w), 0);
    pto_worker_close(w);
}

/* ------------------------------------------------------------------ */
/* Overlap                                                             */

static void view_case(pto_worker *w, const char *what, pto_tensor wr, pto_tensor rd, bool waits)
{
    tu_gate_reset();
    pto_orch *o = pto_run_begin(w);
    CHECK(o != NULL);
    if (!o) return;
    hold(1);
    int64_t a = submit1(o, 1, 0, &wr, PTO_OUTPUT);
    CHECK(tu_wait_set(&tu_start[1], WAIT_MS));
    int64_t b = submit1(o, 2, 1, &rd, PTO_INPUT);
    CHECK(a >= 0 && b >= 0);
    expect_order(what, o, 1, 2, b, waits);
    CHECK_EQ(fanin_of(o, b), waits ? 1 : 0);
    CHECK_EQ(pto_drain(o), 0);
    CHECK_EQ(pto_run_end(w), 0);
}

static void test_overlapping_and_disjoint_views(void)
{
    pto_worker *w = gate_worker(4);
    /* 64 f32 = 256 bytes. */
    view_case(w, "[0,256) then [128,384)", tu_tensor(BASE1, 0, 64), tu_tensor(BASE1, 128, 64), true);
    view_case(w, "[128,384) then [0,256)", tu_tensor(BASE1, 128, 64), tu_tensor(BASE1, 0, 64), true);
    view_case(w, "[0,256) then [252,256)", tu_tensor(BASE1, 0, 64), tu_tensor(BASE1, 252, 1), true);
    view_case(w, "[0,128) then [128,256)", tu_tensor(BASE1, 0, 32), tu_tensor(BASE1, 128, 32), false);
    view_case(w, "[128,256) then [0,128)", tu_tensor(BASE1, 128, 32), tu_tensor(BASE1, 0, 32), false);
    view_case(w, "different bases", tu_tensor(BASE1, 0, 64), tu_tensor(BASE2, 0, 64), false);
    /* Same absolute bytes through different bases still do not interact:
     * the map keys on the storage base. */
    view_case(w, "different bases, overlapping addresses", tu_tensor(BASE1, 0, 64),
              tu_tensor(BASE1 + 64, 0, 64), false);
    pto_worker_close(w);
}

/* ------------------------------------------------------------------ */
/* A completed producer: an edge that holds its slab, no live fan-in.  */

static void test_completed_producer_holds_slab(void)
{
    pto_worker *w = gate_worker(4);
    pto_stats st;
    for (int order = 0; order < 2; order++) {
        /* order 0: the scope ends while the consumer runs;
         * order 1: the consumer finishes while the scope is open. */
        tu_gate_reset();
        pto_orch *o = pto_run_begin(w);
        CHECK(o != NULL);
        if (!o) break;
        CHECK_EQ(pto_scope_begin(o), 0);
        pto_tensor out = tu_tensor(0, 0, 256);   /* 1 KiB, auto-allocated in ring 1 */
        int64_t p = submit1(o, 1, 0, &out, PTO_OUTPUT);
        CHECK(p >= 0);
        CHECK(out.base != 0);
        CHECK_EQ(pto_drain(o), 0);
        pto_task_info info;
        CHECK_EQ(pto_task_info_get(o, p, &info), 0);
        CHECK_EQ(info.state, PTO_TASK_COMPLETED);
        CHECK_EQ(info.ring, 1);
        pto_worker_stats_get(w, &st);
        CHECK_EQ(st.rings[1].live_slabs, 1);
        CHECK_EQ(st.rings[1].used_bytes, 1024);

        if (order == 0) hold(2);
        pto_tensor in = out;
        int64_t c = submit1(o, 2, 1, &in, PTO_INPUT);
        CHECK(c >= 0);
        /* Dispatched at once: nothing to wait for. */
        CHECK(tu_wait_set(&tu_start[2], WAIT_MS));
        int64_t want[1] = {p};
        CHECK(edges_are(o, c, want, 1));   /* the edge exists (it holds the slab) */
        if (order == 0) {
            CHECK_EQ(pto_scope_end(o), 0);
            pto_worker_stats_get(w, &st);
            CHECK_EQ(st.rings[1].live_slabs, 1);   /* the running consumer still holds it */
            CHECK_EQ(st.rings[1].used_bytes, 1024);
            CHECK_EQ(pto_task_info_get(o, p, &info), 0);
            CHECK_EQ(info.state, PTO_TASK_COMPLETED);
            release(2);
            CHECK_EQ(pto_drain(o), 0);
        } else {
            CHECK(tu_wait_set(&tu_end[2], WAIT_MS));
            CHECK_EQ(pto_drain(o), 0);
            pto_worker_stats_get(w, &st);
            CHECK_EQ(st.rings[1].live_slabs, 1);   /* the open scope still holds it */
            CHECK_EQ(st.rings[1].used_bytes, 1024);
            CHECK_EQ(pto_scope_end(o), 0);
            CHECK_EQ(pto_drain(o), 0);
        }
        pto_worker_stats_get(w, &st);
        CHECK_EQ(st.rings[1].live_slabs, 0);
        CHECK_EQ(st.rings[1].used_bytes, 0);
        CHECK_EQ(pto_task_info_get(o, p, &info), 0);
        CHECK_EQ(info.state, PTO_TASK_CONSUMED);
        CHECK_EQ(pto_run_end(w), 0);
    }
    pto_worker_close(w);
}

/* ------------------------------------------------------------------ */
/* Unit level                                                          */

static uint64_t g_fake[256];   /* stand-ins for slots: only their addresses are used */
#define FAKE(i) ((struct pto_slot *)(void *)&g_fake[(i)])

typedef struct found {
    struct pto_slot *p[64];
    int n;
} found;

static void collect(struct pto_slot *p, void *arg)
{
    found *f = arg;
    if (f->n < 64) f->p[f->n] = p;
    f->n++;
}

static found look(pto_tensormap *m, uint64_t base, uint64_t s, uint64_t e)
{
    found f;
    memset(&f, 0, sizeof f);
    pto_tm_lookup(m, base, s, e, collect, &f);
    return f;
}

static bool has(const found *f, struct pto_slot *p)
{
    for (int i = 0; i < f->n && i < 64; i++)
        if (f->p[i] == p) return true;
    return false;
}

static void test_unit_lookup_insert_erase(void)
{
    pto_tensormap m;
    pto_tm_init(&m);
    const uint64_t B = 0x100000, C = 0x200000;
    pto_tm_insert(&m, B, B + 0, B + 100, FAKE(1));
    pto_tm_insert(&m, B, B + 100, B + 200, FAKE(2));
    pto_tm_insert(&m, B, B + 200, B + 300, FAKE(3));
    CHECK_EQ(m.live, 3);

    found f = look(&m, B, B + 50, B + 250);      /* all overlapping producers */
    CHECK_EQ(f.n, 3);
    CHECK(has(&f, FAKE(1)) && has(&f, FAKE(2)) && has(&f, FAKE(3)));
    f = look(&m, B, B + 100, B + 200);           /* half-open ranges */
    CHECK_EQ(f.n, 1);
    CHECK(has(&f, FAKE(2)));
    f = look(&m, B, B + 99, B + 101);
    CHECK_EQ(f.n, 2);
    f = look(&m, B, B + 300, B + 400);
    CHECK_EQ(f.n, 0);
    f = look(&m, C, B, B + 300);                 /* another base never matches */
    CHECK_EQ(f.n, 0);

    /* Re-inserting the same producer and range adds nothing. */
    pto_tm_insert(&m, B, B + 200, B + 300, FAKE(3));
    CHECK_EQ(m.live, 3);

    /* A writer covering entries completely replaces them. */
    pto_tm_insert(&m, B, B + 0, B + 200, FAKE(4));
    CHECK_EQ(m.live, 2);
    f = look(&m, B, B, B + 300);
    CHECK_EQ(f.n, 2);
    CHECK(has(&f, FAKE(3)) && has(&f, FAKE(4)));
    CHECK(!has(&f, FAKE(1)) && !has(&f, FAKE(2)));

    /* Partial cover keeps both. */
    pto_tm_insert(&m, B, B + 150, B + 250, FAKE(5));
    CHECK_EQ(m.live, 3);
    f = look(&m, B, B + 160, B + 170);
    CHECK_EQ(f.n, 2);
    CHECK(has(&f, FAKE(4)) && has(&f, FAKE(5)));

    /* One producer with entries on two bases. */
    pto_tm_insert(&m, C, C, C + 64, FAKE(5));
    pto_tm_insert(&m, C, C + 64, C + 128, FAKE(6));
    CHECK_EQ(m.live, 5);

    /* Erase by producer: only that base's entries of it. */
    pto_tm_erase(&m, B, FAKE(5));
    CHECK_EQ(m.live, 4);
    f = look(&m, C, C, C + 128);
    CHECK_EQ(f.n, 2);
    f = look(&m, B, B + 160, B + 170);
    CHECK_EQ(f.n, 1);
    CHECK(has(&f, FAKE(4)));
    pto_tm_erase(&m, B, FAKE(99));               /* unknown producer: no-op */
    pto_tm_erase(&m, 0x999000, FAKE(4));         /* unknown base: no-op */
    CHECK_EQ(m.live, 4);

    pto_tm_erase(&m, B, FAKE(3));
    pto_tm_erase(&m, B, FAKE(4));
    pto_tm_erase(&m, C, FAKE(5));
    pto_tm_erase(&m, C, FAKE(6));
    CHECK_EQ(m.live, 0);
    CHECK_EQ(m.bases.count, 0);
    f = look(&m, B, 0, UINT64_MAX);
    CHECK_EQ(f.n, 0);

    /* Multiple entries of one producer on one base are all erased. */
    pto_tm_insert(&m, B, B, B + 10, FAKE(7));
    pto_tm_insert(&m, B, B + 20, B + 30, FAKE(7));
    pto_tm_insert(&m, B, B + 40, B + 50, FAKE(8));
    CHECK_EQ(m.live, 3);
    pto_tm_erase(&m, B, FAKE(7));
    CHECK_EQ(m.live, 1);
    f = look(&m, B, B, B + 100);
    CHECK_EQ(f.n, 1);
    CHECK(has(&f, FAKE(8)));
    pto_tm_clear(&m);
    CHECK_EQ(m.live, 0);
    CHECK_EQ(look(&m, B, B, B + 100).n, 0);
    pto_tm_destroy(&m);
}

static void test_unit_many_bases(void)
{
    pto_tensormap m;
    pto_tm_init(&m);
    const int N = 100000;
    for (int i = 0; i < N; i++) {
        uint64_t b = 0x10000000ull + (uint64_t)i * 4096;
        pto_tm_insert(&m, b, b, b + 256, FAKE(i & 255));
    }
    CHECK_EQ(m.live, N);
    CHECK_EQ(m.bases.count, N);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        uint64_t b = 0x10000000ull + (uint64_t)i * 4096;
        found f = look(&m, b, b + 100, b + 101);
        if (f.n != 1 || f.p[0] != FAKE(i & 255)) bad++;
    }
    CHECK_EQ(bad, 0);
    /* Erase in a scrambled order (exercises backward-shift deletion). */
    for (int k = 0; k < N; k++) {
        int i = (int)(((uint64_t)k * 48271u) % (uint64_t)N);   /* 48271 is coprime to N */
        uint64_t b = 0x10000000ull + (uint64_t)i * 4096;
        pto_tm_erase(&m, b, FAKE(i & 255));
        if (k == N / 2) {
            /* the rest is still found */
            int miss = 0;
            for (int j = 0; j < N; j += 97) {
                uint64_t bj = 0x10000000ull + (uint64_t)j * 4096;
                bool erased = false;
                for (int kk = 0; kk <= k && !erased; kk++)
                    erased = (int)(((uint64_t)kk * 48271u) % (uint64_t)N) == j;
                if (!erased && look(&m, bj, bj, bj + 1).n != 1) miss++;
                if (j > 2000) break;
            }
            CHECK_EQ(miss, 0);
        }
    }
    CHECK_EQ(m.live, 0);
    CHECK_EQ(m.bases.count, 0);
    bad = 0;
    for (int i = 0; i < N; i += 7) {
        uint64_t b = 0x10000000ull + (uint64_t)i * 4096;
        if (look(&m, b, b, b + 4096).n != 0) bad++;
    }
    CHECK_EQ(bad, 0);
    /* Still works. */
    pto_tm_insert(&m, 0x42000, 0x42000, 0x42100, FAKE(1));
    pto_tm_insert(&m, 0x42000, 0x42080, 0x42200, FAKE(2));
    CHECK_EQ(look(&m, 0x42000, 0x42000, 0x42300).n, 2);
    pto_tm_erase(&m, 0x42000, FAKE(1));
    pto_tm_erase(&m, 0x42000, FAKE(2));
    CHECK_EQ(m.live, 0);
    pto_tm_destroy(&m);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void noop_cb(struct pto_slot *p, void *arg) { (*(long *)arg) += p != NULL; }

/* Lookups per second with 10 live entries (hits on the 10 bases and misses
 * on others). */
static double lookup_rate(pto_tensormap *m, long *hits)
{
    const int ROUNDS = 100000;
    double t0 = now_s();
    for (int r = 0; r < ROUNDS; r++)
        for (int i = 0; i < 10; i++) {
            uint64_t b = 0x7000000000ull + (uint64_t)i * 65536;
            pto_tm_lookup(m, b, b, b + 64, noop_cb, hits);
            pto_tm_lookup(m, b + 8, b + 8, b + 64, noop_cb, hits);   /* miss */
        }
    double dt = now_s() - t0;
    return (double)ROUNDS * 20 / (dt > 0 ? dt : 1e-9);
}

static void test_unit_lookups_stay_o_live(void)
{
    pto_tensormap fresh, churned;
    pto_tm_init(&fresh);
    pto_tm_init(&churned);
    for (int i = 0; i < 10; i++) {
        uint64_t b = 0x7000000000ull + (uint64_t)i * 65536;
        pto_tm_insert(&fresh, b, b, b + 1024, FAKE(i));
        pto_tm_insert(&churned, b, b, b + 1024, FAKE(i));
    }
    const long CYCLES = 1000000;
    double t0 = now_s();
    for (long k = 0; k < CYCLES; k++) {
        uint64_t b = 0x100000000ull + (uint64_t)k * 1024;   /* a new base every cycle */
        pto_tm_insert(&churned, b, b, b + 512, FAKE(k & 255));
        if (k >= 4) {                                        /* a few in flight at a time */
            uint64_t ob = 0x100000000ull + (uint64_t)(k - 4) * 1024;
            pto_tm_erase(&churned, ob, FAKE((k - 4) & 255));
        }
    }
    for (long k = CYCLES - 4; k < CYCLES; k++) {
        uint64_t ob = 0x100000000ull + (uint64_t)k * 1024;
        pto_tm_erase(&churned, ob, FAKE(k & 255));
    }
    double churn_s = now_s() - t0;
    CHECK_EQ(churned.live, 10);
    CHECK_EQ(churned.bases.count, 10);
    long hf = 0, hc = 0;
    double rf = lookup_rate(&fresh, &hf);
    double rc = lookup_rate(&churned, &hc);
    CHECK_EQ(hf, 100000L * 10);
    CHECK_EQ(hc, 100000L * 10);
    printf("  tensormap: %ld insert/erase cycles in %.3f s; lookups/s with 10 live entries: fresh %.3g, "
           "after churn %.3g (ratio %.2f); hash cells fresh %zu, churned %zu\n",
           CYCLES, churn_s, rf, rc, rf / rc, pto_u64map_cells(&fresh.bases), pto_u64map_cells(&churned.bases));
    pto_tm_destroy(&fresh);
    pto_tm_destroy(&churned);
}

/* Many writers of one base against a plain list that holds the same entries: random inserts (views of
 * mixed sizes, identical re-inserts, covering writes), lookups and erases (by range, as the orchestrator
 * erases, and by producer), so the sorted array, its tombstones, their reuse, the compaction and maxlen are
 * all exercised. Every lookup must find exactly the model's overlapping producers. */
typedef struct model_e {
    uint64_t s, e;
    int p;
    bool live;
} model_e;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(uint64_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state % n;
}

static void test_unit_one_base_many_writers(void)
{
    enum { MAXE = 4096, ROUNDS = 60000 };
    static model_e mod[MAXE];
    int nm = 0, bad = 0, live = 0;
    unsigned next_p = 0;
    pto_tensormap m;
    pto_tm_init(&m);
    const uint64_t base = 0x50000000ull;
    for (int r = 0; r < ROUNDS; r++) {
        int op = (int)rnd(10);
        uint64_t unit = rnd(8) == 0 ? 4096 : 256;   /* tiles, and now and then a bigger view */
        uint64_t s = base + rnd(512) * 64, e = s + unit * (1 + rnd(4));
        if (rnd(500) == 0) { s = base; e = base + 512 * 64 + 4096; }   /* a write of everything */
        if (op < 4 && nm < MAXE) {
            /* A new task: its slot's earlier use was reclaimed first (all its entries erased), and it
             * may name one range twice in one submit (INOUT and OUTPUT of one view): a no-op. */
            int p = (int)(next_p++ & 255);
            pto_tm_erase(&m, base, FAKE(p));
            for (int k = 0; k < nm; k++)
                if (mod[k].live && mod[k].p == p) {
                    mod[k].live = false;
                    live--;
                }
            int times = rnd(8) == 0 ? 2 : 1;
            for (int t = 0; t < times; t++) pto_tm_insert(&m, base, s, e, FAKE(p));
            for (int k = 0; k < nm; k++)
                if (mod[k].live && s <= mod[k].s && mod[k].e <= e) {
                    mod[k].live = false;
                    live--;
                }
            mod[nm++] = (model_e){s, e, p, true};
            live++;
        } else if (op < 8) {
            found f = look(&m, base, s, e);
            int want = 0;
            for (int k = 0; k < nm; k++)
                if (mod[k].live && mod[k].s < e && s < mod[k].e) {
                    want++;
                    if (f.n <= 64 && !has(&f, FAKE(mod[k].p))) bad++;   /* look() keeps the first 64 */
                }
            if (f.n != want) bad++;
        } else if (nm > 0) {
            int k = (int)rnd((uint64_t)nm);
            if (!mod[k].live) continue;
            if (op == 8) {   /* by range: the orchestrator's erase */
                pto_tm_erase_range(&m, base, mod[k].s, mod[k].e, FAKE(mod[k].p));
                mod[k].live = false;
                live--;
                /* a second one of the same producer and range was never entered twice */
            } else {         /* by producer: every entry of it */
                pto_tm_erase(&m, base, FAKE(mod[k].p));
                int p = mod[k].p;
                for (int j = 0; j < nm; j++)
                    if (mod[j].live && mod[j].p == p) {
                        mod[j].live = false;
                        live--;
                    }
            }
        }
        if (m.live != live) bad++;
        if (nm == MAXE) {   /* keep the model small: forget the dead */
            int n = 0;
            for (int k = 0; k < nm; k++)
                if (mod[k].live) mod[n++] = mod[k];
            nm = n;
        }
    }
    CHECK_EQ(bad, 0);
    for (int k = 0; k < nm; k++)
        if (mod[k].live) pto_tm_erase_range(&m, base, mod[k].s, mod[k].e, FAKE(mod[k].p));
    CHECK_EQ(m.live, 0);
    CHECK_EQ(m.bases.count, 0);   /* the cell goes with its last entry */
    pto_tm_destroy(&m);
}

/* A heap ring's slabs: appended in address order, erased oldest first, then wrapping around to low
 * addresses, thousands live at once: every lookup finds its one writer, and lookups stay cheap. */
static void test_unit_ring_slabs(void)
{
    enum { SLAB = 16384, LIVE = 2000, N = 200000 };
    const uint64_t ring = 0x60000000ull, size = (uint64_t)SLAB * (LIVE + 100);
    pto_tensormap m;
    pto_tm_init(&m);
    int bad = 0;
    double t0 = now_s();
    for (long i = 0; i < N; i++) {
        uint64_t s = ring + (uint64_t)(i * SLAB) % size;
        pto_tm_insert(&m, ring, s, s + SLAB, FAKE(i & 255));
        found f = look(&m, ring, s + 100, s + 200);
        if (f.n != 1 || f.p[0] != FAKE(i & 255)) bad++;
        if (i >= LIVE) {
            uint64_t o = ring + (uint64_t)((i - LIVE) * SLAB) % size;
            pto_tm_erase_range(&m, ring, o, o + SLAB, FAKE((i - LIVE) & 255));
        }
    }
    double dt = now_s() - t0;
    CHECK_EQ(bad, 0);
    CHECK_EQ(m.live, LIVE);
    printf("  tensormap: %d slabs of one ring (%d live): %.0f ns per insert + lookup + erase\n", N, LIVE,
           dt / N * 1e9);
    pto_tm_destroy(&m);
}

/* The end of a run clears the map without erasing entry by entry (a clear
 * moves the table's epoch on): nothing of the old run may be found after
 * it, bases that spilled into an array must have it freed (ASan's leak
 * check) and reused cells must start empty, run after run. */
static void test_unit_clear_then_reuse(void)
{
    pto_tensormap m;
    pto_tm_init(&m);
    const int N = 5000;
    for (int run = 0; run < 3; run++) {
        for (int i = 0; i < N; i++) {
            uint64_t b = 0x20000000ull + (uint64_t)i * 4096;
            pto_tm_insert(&m, b, b, b + 256, FAKE((i + run) & 255));
            if (i % 100 == 0) pto_tm_insert(&m, b, b + 512, b + 768, FAKE((i + run + 1) & 255));   /* spills */
        }
        CHECK_EQ(m.bases.count, N);
        CHECK_EQ(m.spilled, N / 100);
        int bad = 0;
        for (int i = 0; i < N; i++) {
            uint64_t b = 0x20000000ull + (uint64_t)i * 4096;
            found f = look(&m, b, b, b + 1024);
            bad += f.n != (i % 100 == 0 ? 2 : 1) || !has(&f, FAKE((i + run) & 255));
        }
        CHECK_EQ(bad, 0);
        pto_tm_clear(&m);
        CHECK_EQ(m.bases.count, 0);
        CHECK_EQ(m.spilled, 0);
        CHECK_EQ(m.live, 0);
        int stale = 0;
        for (int i = 0; i < N; i++) {
            uint64_t b = 0x20000000ull + (uint64_t)i * 4096;
            stale += look(&m, b, b, b + 1024).n != 0;
        }
        CHECK_EQ(stale, 0);
    }
    pto_tm_destroy(&m);
}

int main(void)
{
    RUN(test_input_after_output_waits);
    RUN(test_inout_after_output_waits_and_becomes_writer);
    RUN(test_output_after_output_does_not_wait);
    RUN(test_output_existing_same_as_output);
    RUN(test_no_dep_neither_waits_nor_writes);
    RUN(test_raw_waw_and_no_war);
    RUN(test_producer_dedup_single_task);
    RUN(test_producer_dedup_group);
    RUN(test_overlapping_and_disjoint_views);
    RUN(test_completed_producer_holds_slab);
    RUN(test_unit_lookup_insert_erase);
    RUN(test_unit_many_bases);
    RUN(test_unit_clear_then_reuse);
    RUN(test_unit_lookups_stay_o_live);
    RUN(test_unit_one_base_many_writers);
    RUN(test_unit_ring_slabs);
    return tu_finish();
}
