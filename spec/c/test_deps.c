/*
 * test_deps.c - directed tests of dependency paths that only a random DAG
 * used to reach, each written so that one realistic one-line bug in the
 * engine makes it fail (scripts/mutate.sh keeps that true):
 *
 *   - a group's members other than member 0 are looked up in the TensorMap;
 *   - pto_slot_try_ref's consume threshold (a consumed slot takes no new
 *     reference; a live one always does);
 *   - a submit naming heap memory whose owner is consumed but not yet
 *     reclaimed fails with "is being reclaimed" and gives back everything
 *     it took (references and its own slab);
 *   - one producer seen twice in a submit, first as a slab hold and then
 *     as a dependency (or the other way round), keeps both roles;
 *   - a consumer submitted after its producer failed is poisoned (not run);
 *   - a group completes only when its last member returns.
 *
 * Ordering checks use the gate leaf of testutil: a held producer blocks, and
 * its consumer must not start during a short quiet window. A correct engine
 * can never fail those, however slow the machine; the edge lists
 * (pto_task_edges) are checked right after submit and are exact.
 */
#include "testutil.h"

#include "orchestrator.h"
#include "slot.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WAIT_MS 5000
#define QUIET_MS 80

static _Atomic int g_fail[TU_NC];
static float g_buf[4][64];
/* Group members share a callable, so they are told apart by their first
 * tensor: a member whose tensor 0 is g_buf[k] records its end in
 * g_member_end[k] and, while g_member_hold[k] is set, blocks first. */
static _Atomic int g_member_hold[4];
static _Atomic long g_member_end[4];

static int buf_index(const pto_args_view *v)
{
    for (int k = 0; k < 4 && v->tensor_count > 0; k++)
        if (v->tensors[0].base == (uint64_t)(uintptr_t)g_buf[k]) return k;
    return -1;
}

/* The gate leaf, per-member holds, and a planned failure for callables with g_fail set. */
static int dep_leaf(void *ctx, uint64_t callable, const pto_args_view *v, const pto_call_config *cfg, char *err,
                    size_t errlen)
{
    int k = buf_index(v);
    uint64_t t0 = tu_now_ms();
    while (k >= 0 && atomic_load(&g_member_hold[k]) && tu_now_ms() - t0 < TU_GATE_MAX_MS) tu_sleep_ms(1);
    int rc = tu_gate_leaf(ctx, callable, v, cfg, err, errlen);
    if (k >= 0) atomic_store(&g_member_end[k], atomic_fetch_add(&tu_clock, 1) + 1);
    if (callable < TU_NC && atomic_load(&g_fail[callable])) {
        snprintf(err, errlen, "planned failure of callable %d", (int)callable);
        return 1;
    }
    return rc;
}

static void reset(void)
{
    tu_gate_reset();
    for (int i = 0; i < TU_NC; i++) atomic_store(&g_fail[i], 0);
    for (int k = 0; k < 4; k++) {
        atomic_store(&g_member_hold[k], 0);
        atomic_store(&g_member_end[k], 0);
    }
    memset(g_buf, 0, sizeof g_buf);
}

static uint64_t B(int i) { return (uint64_t)(uintptr_t)g_buf[i]; }

static int64_t submit1(pto_orch *o, int kind, uint64_t callable, int n, pto_tensor *ts, const uint8_t *tags,
                       int32_t pin)
{
    pto_task_args a = {.tensor_count = n, .tensors = ts, .tags = tags};
    int64_t id = kind == PTO_SUB ? pto_submit_sub(o, callable, &a, pin)
                                 : pto_submit_next_level(o, callable, &a, NULL, pin);
    if (id < 0) fprintf(stderr, "submit of callable %d: %s\n", (int)callable, pto_errmsg());
    return id;
}

/* Producers of task id (pto_task_edges), as a bit set of ids < 64. */
static uint64_t producers(pto_orch *o, int64_t id)
{
    int64_t e[16];
    int n = pto_task_edges(o, id, 0, e, 16);
    uint64_t set = 0;
    for (int i = 0; i < n && i < 16; i++)
        if (e[i] >= 0 && e[i] < 64) set |= 1ull << e[i];
    return set;
}

static void wait_started(int c) { CHECK(tu_wait_set(&tu_start[c], WAIT_MS)); }

/* Callable c does not start within the quiet window. */
static void check_not_started(int c)
{
    tu_sleep_ms(QUIET_MS);
    CHECK_EQ(atomic_load(&tu_start[c]), 0);
}

static void check_clean(pto_worker *w)
{
    pto_stats st;
    pto_worker_stats_get(w, &st);
    CHECK_EQ(st.tasks_live, 0);
    CHECK_EQ(st.tensormap_live, 0);
    for (int r = 0; r < PTO_MAX_RING_DEPTH; r++) CHECK_EQ(st.rings[r].used_bytes, 0);
    CHECK_EQ(atomic_load(&tu_leaf_timeouts), 0);
}

/* ------------------------------------------------------------------ */
/* Group members > 0 are looked up: a group whose only reader of X is
 * member 1 depends on X's writer. Every read tag (INPUT, INOUT), a view
 * that overlaps the written bytes by one element, and both kinds. */

static void group_case(int gkind, int read_tag, pto_tensor xr)
{
    reset();
    pto_worker *w = tu_worker(2, 2, dep_leaf, NULL, 1 << 20, 3000);
    int pkind = gkind == PTO_SUB ? PTO_NEXT_LEVEL : PTO_SUB;   /* the producer leaves the group's workers free */
    pto_orch *o = pto_run_begin(w);
    CHECK(o != NULL);
    atomic_store(&tu_hold[1], 1);
    pto_tensor pt[1] = {tu_tensor(B(0), 0, 16)};
    const uint8_t OUT[] = {PTO_OUTPUT};
    int64_t p = submit1(o, pkind, 1, 1, pt, OUT, 0);
    wait_started(1);
    pto_tensor m0[1] = {tu_tensor(B(1), 0, 16)}, m1[2] = {tu_tensor(B(2), 0, 8), xr};
    const uint8_t t0[] = {PTO_INPUT}, t1[] = {PTO_OUTPUT, (uint8_t)read_tag};
    pto_task_args members[2] = {{.tensor_count = 1, .tensors = m0, .tags = t0},
                                {.tensor_count = 2, .tensors = m1, .tags = t1}};
    int64_t g = gkind == PTO_SUB ? pto_submit_sub_group(o, 2, members, 2, NULL)
                                 : pto_submit_next_level_group(o, 2, members, 2, NULL, NULL);
    CHECK(p == 0 && g == 1);
    CHECK_EQ(producers(o, g), 1ull << p);
    pto_task_info info;
    CHECK_EQ(pto_task_info_get(o, g, &info), 0);
    CHECK_EQ(info.fanin, 1);
    check_not_started(2);
    /* A later reader of member 1's output follows the group. */
    pto_tensor ct[1] = {tu_tensor(B(2), 4, 1)};
    const uint8_t IN[] = {PTO_INPUT};
    int64_t c = submit1(o, pkind, 3, 1, ct, IN, 1);
    CHECK_EQ(producers(o, c), 1ull << g);
    atomic_store(&tu_hold[1], 0);
    CHECK_EQ(pto_run_end(w), 0);
    CHECK(atomic_load(&tu_start[2]) > atomic_load(&tu_end[1]));
    CHECK(atomic_load(&tu_start[3]) > atomic_load(&tu_end[2]));
    CHECK_EQ(atomic_load(&tu_runs), 4);
    check_clean(w);
    pto_worker_close(w);
}

static void test_group_member_lookup(void)
{
    pto_tensor whole = tu_tensor(B(0), 0, 16);
    pto_tensor last = tu_tensor(B(0), 60, 4);   /* bytes [60,76): one element of [0,64) */
    group_case(PTO_NEXT_LEVEL, PTO_INPUT, whole);
    group_case(PTO_NEXT_LEVEL, PTO_INOUT, last);
    group_case(PTO_SUB, PTO_INPUT, last);
    group_case(PTO_SUB, PTO_INOUT, whole);
}

/* ------------------------------------------------------------------ */
/* pto_slot_try_ref: fanout packs (total refs, released refs); the slot is
 * consumed once released == total + 1 (its own release plus every ref). */

static void try_ref_case(uint32_t total, uint32_t rel, bool expect)
{
    static pto_slot s;
    atomic_store(&s.fanout, pto_fanout_pack(total, rel));
    bool got = pto_slot_try_ref(&s);
    if (got != expect) fprintf(stderr, "try_ref(total %u, released %u) = %d, expected %d\n", total, rel, got, expect);
    CHECK(got == expect);
    CHECK_EQ(atomic_load(&s.fanout), pto_fanout_pack(expect ? total + 1 : total, rel));
}

static void test_try_ref_threshold(void)
{
    try_ref_case(1, 0, true);    /* submitted: scope ref, not finished */
    try_ref_case(1, 1, true);    /* finished, its scope still open */
    try_ref_case(3, 2, true);
    try_ref_case(3, 3, true);    /* finished, only the scope's ref left */
    try_ref_case(1, 2, false);   /* consumed */
    try_ref_case(3, 4, false);
    try_ref_case(0, 1, false);   /* an alloc slot whose scope ended */
    /* release reports the consuming release, and only that one. */
    static pto_slot s;
    atomic_store(&s.fanout, pto_fanout_pack(2, 1));
    CHECK(!pto_slot_release(&s));
    CHECK(pto_slot_release(&s));
    CHECK(!pto_slot_try_ref(&s));
}

/* ------------------------------------------------------------------ */
/* A slab owner that is consumed but not yet reclaimed (the scheduler made
 * the last release after this submit drained the retire list) cannot be
 * referenced: the submit fails and gives back what it took. The window is
 * too short to hit on purpose, so the test puts the owner in that state
 * by hand (and back afterwards). */

static uint32_t refs_left(pto_slot *s)
{
    uint64_t f = atomic_load(&s->fanout);
    return (uint32_t)(f >> 32) + 1 - (uint32_t)f;   /* releases still to come */
}

static void test_slab_being_reclaimed(void)
{
    reset();
    pto_worker *w = tu_worker(1, 0, dep_leaf, NULL, 1 << 20, 3000);
    pto_orch *o = pto_run_begin(w);
    CHECK(o != NULL);
    const uint32_t shape[1] = {16};
    pto_tensor lb, la;
    int64_t idb = pto_alloc(o, shape, 1, PTO_F32, &lb);
    int64_t ida = pto_alloc(o, shape, 1, PTO_F32, &la);
    CHECK(idb >= 0 && ida >= 0);
    pto_slot *sb = pto_slot_get(&o->pool, idb), *sa = pto_slot_get(&o->pool, ida);
    CHECK(sb && sa);
    if (!sb || !sa) { pto_run_end(w); pto_worker_close(w); return; }
    uint32_t b_left = refs_left(sb);
    uint64_t a_fanout = atomic_load(&sa->fanout);
    uint32_t a_total = (uint32_t)(a_fanout >> 32);
    pto_stats st0, st1;
    pto_worker_stats_get(w, &st0);
    int64_t ntasks = pto_task_count(o);

    atomic_store(&tu_hold[1], 1);   /* if the submit wrongly succeeds, its task keeps A's state still */
    atomic_store(&sa->fanout, pto_fanout_pack(a_total, a_total + 1));   /* consumed, not reclaimed */
    pto_tensor ts[3] = {lb, la, tu_tensor(0, 0, 64)};                    /* B's ref is taken first */
    const uint8_t tags[3] = {PTO_INPUT, PTO_INPUT, PTO_OUTPUT};
    pto_task_args a = {.tensor_count = 3, .tensors = ts, .tags = tags};
    int64_t id = pto_submit_next_level(o, 1, &a, NULL, -1);
    CHECK_EQ(id, -1);
    /* the engine speaks C: the message starts with what went wrong, no Lua name */
    CHECK(strncmp(pto_errmsg(), "a tensor's heap storage", 23) == 0);
    char want[64];
    snprintf(want, sizeof want, "(task %lld's slab) is being reclaimed", (long long)ida);
    CHECK_CONTAINS(pto_errmsg(), want);
    CHECK_CONTAINS(pto_errmsg(), "use them inside that scope");
    /* Given back: B's reference, the automatic OUTPUT's slab, and no task. */
    int64_t leaked = (int64_t)refs_left(sb) - b_left;
    CHECK_EQ(leaked, 0);
    for (; leaked > 0 && leaked < 8; leaked--) pto_slot_release(sb);   /* so a broken engine still ends the run */
    pto_worker_stats_get(w, &st1);
    CHECK_EQ(st1.rings[0].used_bytes, st0.rings[0].used_bytes);
    CHECK_EQ(pto_task_count(o), ntasks);
    CHECK_EQ(atomic_load(&sa->fanout), pto_fanout_pack(a_total, a_total + 1));
    if (id >= 0) atomic_fetch_sub(&sa->fanout, 1);   /* a broken engine took a ref: A is live with it */
    else atomic_store(&sa->fanout, a_fanout);        /* live again */
    atomic_store(&tu_hold[1], 0);

    ts[2] = tu_tensor(0, 0, 64);   /* the same submit now works */
    id = pto_submit_next_level(o, 2, &a, NULL, -1);
    CHECK(id >= 0);
    CHECK_EQ(producers(o, id), (1ull << idb) | (1ull << ida));
    CHECK_EQ(pto_run_end(w), 0);
    CHECK_EQ(atomic_load(&tu_runs), 1);
    check_clean(w);
    pto_worker_close(w);
}

/* ------------------------------------------------------------------ */
/* One producer named twice in a submit: P's automatic OUTPUT X is both a
 * slab to hold and a tensor to read. Whichever role comes first, the task
 * gets its dependency (and still holds the slab). */

static void merge_case(int first_tag, int second_tag, bool group)
{
    reset();
    pto_worker *w = tu_worker(2, 1, dep_leaf, NULL, 1 << 20, 3000);
    pto_orch *o = pto_run_begin(w);
    CHECK(o != NULL);
    atomic_store(&tu_hold[1], 1);
    pto_tensor pt[1] = {tu_tensor(0, 0, 32)};
    const uint8_t OUT[] = {PTO_OUTPUT};
    int64_t p = submit1(o, PTO_SUB, 1, 1, pt, OUT, 0);
    wait_started(1);
    pto_tensor xv = pt[0];
    xv.offset = 64;          /* a view of X's second half */
    xv.shape[0] = 16;
    pto_tensor ts[2] = {xv, pt[0]};
    const uint8_t tags[2] = {(uint8_t)first_tag, (uint8_t)second_tag};
    int64_t c;
    if (group) {
        pto_task_args members[2] = {{.tensor_count = 1, .tensors = &ts[0], .tags = &tags[0]},
                                    {.tensor_count = 1, .tensors = &ts[1], .tags = &tags[1]}};
        c = pto_submit_next_level_group(o, 2, members, 2, NULL, NULL);
    } else {
        c = submit1(o, PTO_NEXT_LEVEL, 2, 2, ts, tags, -1);
    }
    CHECK(p == 0 && c == 1);
    CHECK_EQ(producers(o, c), 1ull << p);
    pto_task_info info;
    CHECK_EQ(pto_task_info_get(o, c, &info), 0);
    CHECK_EQ(info.fanin, 1);
    check_not_started(2);
    atomic_store(&tu_hold[1], 0);
    CHECK_EQ(pto_run_end(w), 0);
    CHECK(atomic_load(&tu_start[2]) > atomic_load(&tu_end[1]));
    check_clean(w);
    pto_worker_close(w);
}

static void test_merge_keeps_dependency(void)
{
    merge_case(PTO_NO_DEP, PTO_INPUT, false);            /* hold first, then the dependency */
    merge_case(PTO_OUTPUT_EXISTING, PTO_INPUT, false);
    merge_case(PTO_NO_DEP, PTO_INOUT, false);
    merge_case(PTO_INPUT, PTO_NO_DEP, false);            /* dependency first */
    merge_case(PTO_NO_DEP, PTO_INPUT, true);             /* across group members */
}

/* ------------------------------------------------------------------ */
/* A producer that has already failed (FAILED, its scope still open) when its
 * consumer is submitted: the consumer gets the edge, is poisoned when the
 * scheduler wires it, never runs, and so do its own consumers. */

static bool wait_state(pto_worker *w, pto_orch *o, int64_t id, int32_t state)
{
    uint64_t t0 = tu_now_ms();
    pto_task_info info;
    for (;;) {
        pto_dispatch_sync(w);
        if (pto_task_info_get(o, id, &info) == 0 && info.state == state) return true;
        if (tu_now_ms() - t0 > WAIT_MS) return false;
        tu_sleep_ms(1);
    }
}

static void poison_case(bool group)
{
    reset();
    pto_worker *w = tu_worker(2, 0, dep_leaf, NULL, 1 << 20, 3000);
    pto_orch *o = pto_run_begin(w);
    CHECK(o != NULL);
    atomic_store(&g_fail[1], 1);
    pto_tensor pt[1] = {tu_tensor(B(0), 0, 16)};
    const uint8_t OUT[] = {PTO_OUTPUT};
    int64_t p = submit1(o, PTO_NEXT_LEVEL, 1, 1, pt, OUT, -1);
    CHECK(wait_state(w, o, p, PTO_TASK_FAILED));
    pto_tensor ct[2] = {tu_tensor(B(0), 8, 2), tu_tensor(B(1), 0, 16)};
    const uint8_t IN_OUT[] = {PTO_INPUT, PTO_OUTPUT};
    int64_t c;
    if (group) {
        pto_tensor other[1] = {tu_tensor(B(2), 0, 4)};
        const uint8_t OUT1[] = {PTO_OUTPUT};
        pto_task_args members[2] = {{.tensor_count = 1, .tensors = other, .tags = OUT1},
                                    {.tensor_count = 2, .tensors = ct, .tags = IN_OUT}};
        c = pto_submit_next_level_group(o, 2, members, 2, NULL, NULL);
    } else {
        c = submit1(o, PTO_NEXT_LEVEL, 2, 2, ct, IN_OUT, -1);
    }
    CHECK_EQ(producers(o, c), 1ull << p);
    pto_tensor dt[1] = {tu_tensor(B(1), 0, 4)};
    const uint8_t IN[] = {PTO_INPUT};
    int64_t d = submit1(o, PTO_NEXT_LEVEL, 3, 1, dt, IN, -1);
    CHECK_EQ(producers(o, d), 1ull << c);
    CHECK(wait_state(w, o, c, PTO_TASK_FAILED));
    pto_task_info info;
    CHECK_EQ(pto_task_info_get(o, c, &info), 0);
    char want[80];
    snprintf(want, sizeof want, "task %lld was not run: its producer task %lld failed", (long long)c,
             (long long)p);
    CHECK_CONTAINS(info.error, want);
    CHECK_EQ(pto_run_end(w), -1);
    CHECK_CONTAINS(pto_errmsg(), "planned failure of callable 1");
    CHECK_EQ(atomic_load(&tu_start[2]), 0);
    CHECK_EQ(atomic_load(&tu_start[3]), 0);
    CHECK_EQ(atomic_load(&tu_runs), 1);
    pto_stats st;
    pto_worker_stats_get(w, &st);
    CHECK_EQ(st.tasks_failed, 3);
    CHECK_EQ(st.tasks_completed, 0);
    check_clean(w);
    pto_worker_close(w);
}

static void test_poison_from_failed_producer(void)
{
    poison_case(false);
    poison_case(true);
}

/* A producer still running is not finished: its consumer waits. */
static void test_running_producer_waits(void)
{
    reset();
    pto_worker *w = tu_worker(2, 0, dep_leaf, NULL, 1 << 20, 3000);
    pto_orch *o = pto_run_begin(w);
    CHECK(o != NULL);
    atomic_store(&tu_hold[1], 1);
    pto_tensor pt[1] = {tu_tensor(B(0), 0, 16)};
    const uint8_t OUT[] = {PTO_OUTPUT}, IN[] = {PTO_INPUT};
    int64_t p = submit1(o, PTO_NEXT_LEVEL, 1, 1, pt, OUT, 0);
    wait_started(1);
    CHECK(wait_state(w, o, p, PTO_TASK_RUNNING));
    int64_t c = submit1(o, PTO_NEXT_LEVEL, 2, 1, pt, IN, 1);
    CHECK_EQ(producers(o, c), 1ull << p);
    check_not_started(2);
    atomic_store(&tu_hold[1], 0);
    CHECK_EQ(pto_run_end(w), 0);
    CHECK(atomic_load(&tu_start[2]) > atomic_load(&tu_end[1]));
    check_clean(w);
    pto_worker_close(w);
}

/* A group whose member 0 returned while member 1 still runs is not complete:
 * a reader of member 0's output waits for member 1 too. An engine that
 * completes the group early cannot end the run either (the late member
 * finishes it twice), so that failure is reported at once. */
static void test_group_waits_for_last_member(void)
{
    reset();
    pto_worker *w = tu_worker(2, 1, dep_leaf, NULL, 1 << 20, 3000);
    pto_orch *o = pto_run_begin(w);
    CHECK(o != NULL);
    atomic_store(&g_member_hold[1], 1);
    pto_tensor m0[1] = {tu_tensor(B(0), 0, 16)}, m1[1] = {tu_tensor(B(1), 0, 16)};
    const uint8_t OUT[] = {PTO_OUTPUT}, IN[] = {PTO_INPUT};
    pto_task_args members[2] = {{.tensor_count = 1, .tensors = m0, .tags = OUT},
                                {.tensor_count = 1, .tensors = m1, .tags = OUT}};
    int64_t g = pto_submit_next_level_group(o, 1, members, 2, NULL, NULL);
    pto_tensor ct[1] = {tu_tensor(B(0), 0, 4)};
    int64_t c = submit1(o, PTO_SUB, 2, 1, ct, IN, -1);
    CHECK_EQ(producers(o, c), 1ull << g);
    CHECK(tu_wait_set(&g_member_end[0], WAIT_MS));   /* member 0 returned */
    tu_sleep_ms(QUIET_MS);
    pto_dispatch_sync(w);
    pto_task_info info;
    CHECK_EQ(pto_task_info_get(o, g, &info), 0);
    CHECK_EQ(info.state, PTO_TASK_RUNNING);
    CHECK_EQ(atomic_load(&tu_start[2]), 0);
    if (info.state != PTO_TASK_RUNNING || atomic_load(&tu_start[2])) {
        fprintf(stderr, "group_waits_for_last_member: the group completed before member 1 returned; "
                "such an engine cannot end the run, so the test stops here\n");
        exit(tu_finish());
    }
    atomic_store(&g_member_hold[1], 0);
    CHECK_EQ(pto_run_end(w), 0);
    CHECK(atomic_load(&tu_start[2]) > atomic_load(&g_member_end[1]));
    check_clean(w);
    pto_worker_close(w);
}

int main(void)
{
    /* First: with groups that complete early, the other group tests would hang in pto_run_end. */
    RUN(test_group_waits_for_last_member);
    RUN(test_group_member_lookup);
    RUN(test_try_ref_threshold);
    RUN(test_slab_being_reclaimed);
    RUN(test_merge_keeps_dependency);
    RUN(test_poison_from_failed_producer);
    RUN(test_running_producer_waits);
    return tu_finish();
}
