/* Scheduler behaviour through the public API: diamond ordering, groups,
 * pinning, per-kind head-of-line independence, failure poisoning. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include "testutil.h"

/* callable = id * 16 + action */
/* ACT_FAIL_FIRST: a group whose member on bufs[0] fails as soon as the
 * others wait at the gate. */
enum { ACT_RUN = 0, ACT_BLOCK = 1, ACT_FAIL = 2, ACT_FAIL_FIRST = 3 };
#define CALL(id, act) ((uint64_t)(id) * 16 + (act))
#define MAXT 256

static _Atomic int64_t clock_;
static _Atomic int64_t start_at[MAXT], end_at[MAXT];
static _Atomic int ran[MAXT];
static _Atomic int worker_of[MAXT];
static _Atomic int gate;          /* ACT_BLOCK waits until gate != 0 */
static _Atomic int blocked;       /* how many are waiting at the gate */
static float bufs[8][64];

typedef struct { int index; } leaf_ctx;
static leaf_ctx ctxs[8];

static void reset(void)
{
    atomic_store(&clock_, 1);
    for (int i = 0; i < MAXT; i++) {
        atomic_store(&start_at[i], 0);
        atomic_store(&end_at[i], 0);
        atomic_store(&ran[i], 0);
        atomic_store(&worker_of[i], -1);
    }
    atomic_store(&gate, 0);
    atomic_store(&blocked, 0);
}

static int leaf(void *ctx, uint64_t callable, const pto_args_view *a, const pto_call_config *cfg, char *err,
                size_t errlen)
{
    (void)cfg;
    int id = (int)(callable / 16), act = (int)(callable % 16);
    if (act == ACT_FAIL_FIRST) {
        act = a->tensor_count > 0 && a->tensors[0].base == (uint64_t)(uintptr_t)bufs[0] ? ACT_FAIL : ACT_BLOCK;
        /* fail only once the other member is running: a failed group skips
         * members that have not started */
        for (int i = 0; act == ACT_FAIL && i < 5000 && !atomic_load(&blocked); i++) usleep(1000);
    }
    atomic_store(&start_at[id], atomic_fetch_add(&clock_, 1));
    atomic_fetch_add(&ran[id], 1);
    atomic_store(&worker_of[id], ((leaf_ctx *)ctx)->index);
    if (act == ACT_BLOCK) {
        atomic_fetch_add(&blocked, 1);
        for (int i = 0; i < 5000 && !atomic_load(&gate); i++) usleep(1000);
        atomic_fetch_sub(&blocked, 1);
    }
    atomic_store(&end_at[id], atomic_fetch_add(&clock_, 1));
    if (act == ACT_FAIL) {
        snprintf(err, errlen, "kernel %d exploded", id);
        return 1;
    }
    return 0;
}

static pto_worker *make(int nl, int ns)
{
    pto_worker_config cfg = {.level = 3, .mode = PTO_MODE_THREAD, .heap_ring_size = 1 << 20};
    pto_worker *w = pto_worker_new(&cfg);
    for (int i = 0; i < nl + ns; i++) {
        ctxs[i].index = i;
        pto_leaf l = {.run = leaf, .ctx = &ctxs[i], .name = "test"};
        if (i < nl) pto_worker_add_next_level(w, &l);
        else pto_worker_add_sub(w, &l);
    }
    if (pto_worker_init(w) != 0) abort();
    return w;
}

static pto_tensor T(int i) { return tu_tensor((uint64_t)(uintptr_t)bufs[i], 0, 64); }

static int64_t sub1(pto_orch *o, uint64_t call, int n, const int *bi, const uint8_t *tags, int pin)
{
    pto_tensor t[8];
    for (int i = 0; i < n; i++) t[i] = T(bi[i]);
    pto_task_args a = {.tensor_count = n, .tensors = t, .tags = tags};
    return pto_submit_next_level(o, call, &a, NULL, pin);
}

static bool wait_for(_Atomic int *v, int want)
{
    for (int i = 0; i < 5000; i++) {
        if (atomic_load(v) >= want) return true;
        usleep(1000);
    }
    return false;
}

static void test_diamond(void)
{
    reset();
    pto_worker *w = make(2, 0);
    pto_orch *o = pto_run_begin(w);
    const uint8_t OUT[] = {PTO_OUTPUT}, IN_OUT[] = {PTO_INPUT, PTO_OUTPUT}, IN2_OUT[] = {PTO_INPUT, PTO_INPUT, PTO_OUTPUT};
    sub1(o, CALL(0, ACT_RUN), 1, (int[]){0}, OUT, -1);              /* A writes 0 */
    sub1(o, CALL(1, ACT_RUN), 2, (int[]){0, 1}, IN_OUT, -1);        /* B: 0 -> 1 */
    sub1(o, CALL(2, ACT_RUN), 2, (int[]){0, 2}, IN_OUT, -1);        /* C: 0 -> 2 */
    int64_t d = sub1(o, CALL(3, ACT_RUN), 3, (int[]){1, 2, 3}, IN2_OUT, -1); /* D: 1,2 -> 3 */
    pto_task_info info;
    CHECK_EQ(pto_task_info_get(o, d, &info), 0);
    CHECK_EQ(info.fanin, 2);
    CHECK_EQ(pto_run_end(w), 0);
    for (int i = 0; i < 4; i++) CHECK_EQ(atomic_load(&ran[i]), 1);
    CHECK(atomic_load(&start_at[1]) > atomic_load(&end_at[0]));
    CHECK(atomic_load(&start_at[2]) > atomic_load(&end_at[0]));
    CHECK(atomic_load(&start_at[3]) > atomic_load(&end_at[1]));
    CHECK(atomic_load(&start_at[3]) > atomic_load(&end_at[2]));
    pto_worker_close(w);
}

static void test_group_completes_after_all_members(void)
{
    reset();
    pto_worker *w = make(2, 0);
    pto_orch *o = pto_run_begin(w);
    pto_tensor t0[1] = {T(0)}, t1[1] = {T(1)};
    const uint8_t OUT[] = {PTO_OUTPUT};
    pto_task_args members[2] = {{.tensor_count = 1, .tensors = t0, .tags = OUT},
                                {.tensor_count = 1, .tensors = t1, .tags = OUT}};
    /* Both members run the same callable; only member "ids" differ through
     * their worker index. The member on worker 1 blocks at the gate. */
    int64_t g = pto_submit_next_level_group(o, CALL(10, ACT_BLOCK), members, 2, NULL, (int32_t[]){0, 1});
    CHECK(g >= 0);
    const uint8_t IN_OUT[] = {PTO_INPUT, PTO_OUTPUT};
    sub1(o, CALL(11, ACT_RUN), 2, (int[]){0, 2}, IN_OUT, -1);      /* reads member 0's output */
    CHECK(wait_for(&blocked, 2));                                  /* both members started: distinct workers */
    usleep(20000);
    CHECK_EQ(atomic_load(&ran[11]), 0);                            /* group not complete yet */
    pto_task_info info;
    pto_task_info_get(o, g, &info);
    CHECK_EQ(info.state, PTO_TASK_RUNNING);
    CHECK_EQ(info.group_size, 2);
    atomic_store(&gate, 1);
    CHECK_EQ(pto_run_end(w), 0);
    CHECK_EQ(atomic_load(&ran[10]), 2);
    CHECK_EQ(atomic_load(&ran[11]), 1);
    pto_worker_close(w);
}

static void test_pinned_worker_fifo(void)
{
    reset();
    pto_worker *w = make(2, 0);
    pto_orch *o = pto_run_begin(w);
    const uint8_t OUT[] = {PTO_OUTPUT};
    for (int i = 0; i < 40; i++) sub1(o, CALL(20 + i, ACT_RUN), 1, (int[]){i % 8}, OUT, 1);
    CHECK_EQ(pto_run_end(w), 0);
    for (int i = 0; i < 40; i++) {
        CHECK_EQ(atomic_load(&ran[20 + i]), 1);
        CHECK_EQ(atomic_load(&worker_of[20 + i]), 1);
        if (i) CHECK(atomic_load(&start_at[20 + i]) > atomic_load(&end_at[20 + i - 1]));
    }
    pto_worker_close(w);
}

static void test_idle_worker_not_held_back(void)
{
    reset();
    pto_worker *w = make(2, 1);
    pto_orch *o = pto_run_begin(w);
    const uint8_t OUT[] = {PTO_OUTPUT};
    /* Worker 0 busy on a blocked task; a ready task must go to idle worker 1. */
    sub1(o, CALL(60, ACT_BLOCK), 1, (int[]){0}, OUT, 0);
    CHECK(wait_for(&blocked, 1));
    sub1(o, CALL(61, ACT_RUN), 1, (int[]){1}, OUT, -1);
    CHECK(wait_for(&ran[61], 1));
    CHECK_EQ(atomic_load(&worker_of[61]), 1);
    /* Saturate every next-level worker: the sub queue still dispatches. */
    sub1(o, CALL(62, ACT_BLOCK), 1, (int[]){2}, OUT, 1);
    CHECK(wait_for(&blocked, 2));
    for (int i = 0; i < 6; i++) sub1(o, CALL(63 + i, ACT_RUN), 1, (int[]){3 + (i % 4)}, OUT, -1);
    pto_tensor t[1] = {T(7)};
    pto_task_args a = {.tensor_count = 1, .tensors = t, .tags = OUT};
    int64_t s = pto_submit_sub(o, CALL(70, ACT_RUN), &a, -1);
    CHECK(s >= 0);
    CHECK(wait_for(&ran[70], 1));
    atomic_store(&gate, 1);
    CHECK_EQ(pto_run_end(w), 0);
    pto_worker_close(w);
}

/* Many ready tasks are staged deeper than queue_depth; the ones staged
 * behind a blocked task are taken by the idle worker, so they all run while
 * it blocks. */
static void test_deep_queue_stolen_by_idle_worker(void)
{
    reset();
    pto_worker *w = make(2, 0);
    pto_orch *o = pto_run_begin(w);
    const uint8_t OUT[] = {PTO_OUTPUT};
    sub1(o, CALL(120, ACT_BLOCK), 1, (int[]){0}, OUT, -1);
    CHECK(wait_for(&blocked, 1));
    int busy = atomic_load(&worker_of[120]);
    pto_task_args none = {0};
    for (int i = 0; i < 40; i++) CHECK(pto_submit_next_level(o, CALL(121 + i, ACT_RUN), &none, NULL, -1) >= 0);
    for (int i = 0; i < 40; i++) CHECK(wait_for(&ran[121 + i], 1));
    CHECK_EQ(atomic_load(&blocked), 1);
    for (int i = 0; i < 40; i++) CHECK(atomic_load(&worker_of[121 + i]) != busy);
    atomic_store(&gate, 1);
    CHECK_EQ(pto_run_end(w), 0);
    pto_worker_close(w);
}

/* An interrupt fails the tasks already staged behind a running one too, so
 * the run drains without running them however deep the queue is. */
static void test_interrupt_skips_staged(void)
{
    reset();
    pto_worker *w = make(1, 0);
    pto_orch *o = pto_run_begin(w);
    const uint8_t OUT[] = {PTO_OUTPUT};
    sub1(o, CALL(170, ACT_BLOCK), 1, (int[]){0}, OUT, -1);
    CHECK(wait_for(&blocked, 1));
    pto_task_args none = {0};
    for (int i = 0; i < 40; i++) CHECK(pto_submit_next_level(o, CALL(171 + i, ACT_RUN), &none, NULL, -1) >= 0);
    tu_sleep_ms(20);   /* let the scheduler stage them */
    pto_worker_interrupt(w);
    atomic_store(&gate, 1);
    CHECK_EQ(pto_run_end(w), -1);
    CHECK_CONTAINS(pto_errmsg(), "interrupted");
    CHECK_EQ(atomic_load(&ran[170]), 1);
    int ran_after = 0;
    for (int i = 0; i < 40; i++) ran_after += atomic_load(&ran[171 + i]);
    CHECK_EQ(ran_after, 0);
    /* the Worker runs the next run normally */
    o = pto_run_begin(w);
    CHECK(pto_submit_next_level(o, CALL(211, ACT_RUN), &none, NULL, -1) >= 0);
    CHECK_EQ(pto_run_end(w), 0);
    CHECK_EQ(atomic_load(&ran[211]), 1);
    pto_worker_close(w);
}

static void test_failure_poisons_consumers(void)
{
    reset();
    pto_worker *w = make(2, 0);
    pto_orch *o = pto_run_begin(w);
    const uint8_t OUT[] = {PTO_OUTPUT}, IN_OUT[] = {PTO_INPUT, PTO_OUTPUT};
    int64_t a = sub1(o, CALL(80, ACT_FAIL), 1, (int[]){0}, OUT, -1);
    int64_t b = sub1(o, CALL(81, ACT_RUN), 2, (int[]){0, 1}, IN_OUT, -1);
    int64_t c = sub1(o, CALL(82, ACT_RUN), 2, (int[]){1, 2}, IN_OUT, -1);
    sub1(o, CALL(83, ACT_RUN), 1, (int[]){5}, OUT, -1);            /* independent */
    CHECK(a >= 0 && b >= 0 && c >= 0);
    CHECK_EQ(pto_run_end(w), -1);
    CHECK_CONTAINS(pto_errmsg(), ") failed: ");
    CHECK_CONTAINS(pto_errmsg(), "task 0");
    CHECK_CONTAINS(pto_errmsg(), "kernel 80 exploded");
    CHECK_EQ(atomic_load(&ran[81]), 0);
    CHECK_EQ(atomic_load(&ran[82]), 0);
    CHECK_EQ(atomic_load(&ran[83]), 1);
    pto_stats st;
    pto_worker_stats_get(w, &st);
    CHECK_EQ(st.tasks_failed, 3);
    CHECK_EQ(st.tasks_live, 0);
    CHECK_EQ(st.tensormap_live, 0);
    /* The next run is unaffected. */
    reset();
    o = pto_run_begin(w);
    sub1(o, CALL(80, ACT_RUN), 1, (int[]){0}, OUT, -1);
    sub1(o, CALL(81, ACT_RUN), 2, (int[]){0, 1}, IN_OUT, -1);
    CHECK_EQ(pto_run_end(w), 0);
    CHECK_EQ(atomic_load(&ran[81]), 1);
    pto_worker_close(w);
}

static void test_failed_group_member(void)
{
    reset();
    pto_worker *w = make(2, 0);
    pto_orch *o = pto_run_begin(w);
    pto_tensor t0[1] = {T(0)}, t1[1] = {T(1)};
    const uint8_t OUT[] = {PTO_OUTPUT};
    pto_task_args members[2] = {{.tensor_count = 1, .tensors = t0, .tags = OUT},
                                {.tensor_count = 1, .tensors = t1, .tags = OUT}};
    pto_submit_next_level_group(o, CALL(90, ACT_FAIL), members, 2, NULL, NULL);
    const uint8_t IN_OUT[] = {PTO_INPUT, PTO_OUTPUT};
    sub1(o, CALL(91, ACT_RUN), 2, (int[]){1, 2}, IN_OUT, -1);
    CHECK_EQ(pto_run_end(w), -1);
    CHECK_CONTAINS(pto_errmsg(), "group member");
    CHECK_EQ(atomic_load(&ran[91]), 0);
    pto_worker_close(w);
}

/* A consumer submitted after one member failed but while another still
 * runs must wait for the group: the run's error is the group's, not the
 * consumer's poisoning (this once raced). */
static void test_consumer_waits_for_failing_group(void)
{
    reset();
    pto_worker *w = make(2, 0);
    pto_orch *o = pto_run_begin(w);
    pto_tensor t0[1] = {T(0)}, t1[1] = {T(1)};
    const uint8_t OUT[] = {PTO_OUTPUT};
    pto_task_args members[2] = {{.tensor_count = 1, .tensors = t0, .tags = OUT},
                                {.tensor_count = 1, .tensors = t1, .tags = OUT}};
    int64_t g = pto_submit_next_level_group(o, CALL(92, ACT_FAIL_FIRST), members, 2, NULL, NULL);
    for (int i = 0; i < 5000 && !atomic_load(&blocked); i++) usleep(1000);
    CHECK_EQ(atomic_load(&blocked), 1);
    pto_task_info info;
    for (int i = 0; i < 5000; i++) {      /* the failing member has reported */
        pto_task_info_get(o, g, &info);
        if (info.error) break;
        usleep(1000);
    }
    const uint8_t IN_OUT[] = {PTO_INPUT, PTO_OUTPUT};
    sub1(o, CALL(93, ACT_RUN), 2, (int[]){0, 2}, IN_OUT, -1);
    usleep(20000);
    atomic_store(&gate, 1);
    CHECK_EQ(pto_run_end(w), -1);
    CHECK_CONTAINS(pto_errmsg(), "group member");
    CHECK_CONTAINS(pto_errmsg(), "kernel 92 exploded");
    CHECK_EQ(atomic_load(&ran[93]), 0);
    pto_worker_close(w);
}

/* Interrupt: the running task finishes, nothing else starts, the run
 * reports "interrupted", and the next run is normal. */
static void test_interrupt(void)
{
    reset();
    pto_worker *w = make(1, 0);
    pto_worker_callable_name_set(w, PTO_NEXT_LEVEL, CALL(95, ACT_FAIL), "exploder");
    pto_orch *o = pto_run_begin(w);
    const uint8_t OUT[] = {PTO_OUTPUT}, IN_OUT[] = {PTO_INPUT, PTO_OUTPUT};
    sub1(o, CALL(94, ACT_BLOCK), 1, (int[]){0}, OUT, -1);
    for (int i = 1; i < 5; i++) sub1(o, CALL(100 + i, ACT_RUN), 2, (int[]){i - 1, i}, IN_OUT, -1);
    for (int i = 0; i < 5000 && !atomic_load(&blocked); i++) usleep(1000);
    pto_worker_interrupt(w);
    pto_task_args none = {0};
    CHECK(pto_submit_next_level(o, CALL(111, ACT_RUN), &none, NULL, -1) < 0);
    CHECK_CONTAINS(pto_errmsg(), "interrupted");
    atomic_store(&gate, 1);
    CHECK_EQ(pto_run_end(w), -1);
    CHECK_CONTAINS(pto_errmsg(), "interrupted");
    CHECK_EQ(atomic_load(&ran[94]), 1);
    for (int i = 1; i < 5; i++) CHECK_EQ(atomic_load(&ran[100 + i]), 0);
    /* next run: normal, and a failure names the callable and the worker */
    o = pto_run_begin(w);
    sub1(o, CALL(103, ACT_RUN), 1, (int[]){0}, OUT, -1);
    sub1(o, CALL(95, ACT_FAIL), 1, (int[]){1}, OUT, -1);
    CHECK_EQ(pto_run_end(w), -1);
    CHECK_CONTAINS(pto_errmsg(), "callable 'exploder' on test");
    CHECK_EQ(atomic_load(&ran[103]), 1);
    pto_worker_close(w);
}

static void test_misuse(void)
{
    reset();
    pto_worker *w = make(1, 0);
    CHECK(pto_worker_add_next_level(w, &(pto_leaf){.run = leaf}) < 0);
    CHECK_CONTAINS(pto_errmsg(), "before pto_worker_init");
    pto_orch *o = pto_run_begin(w);
    CHECK(pto_run_begin(w) == NULL);
    pto_task_args none = {0};
    CHECK(pto_submit_sub(o, 0, &none, -1) < 0);
    CHECK_CONTAINS(pto_errmsg(), "no sub workers");
    CHECK(pto_submit_next_level(o, 0, &none, NULL, 3) < 0);
    CHECK_CONTAINS(pto_errmsg(), "worker 3 does not exist");
    pto_tensor t = tu_tensor(0, 0, 4);
    uint8_t tag = PTO_INPUT;
    pto_task_args a = {.tensor_count = 1, .tensors = &t, .tags = &tag};
    CHECK(pto_submit_next_level(o, 0, &a, NULL, -1) < 0);
    CHECK_CONTAINS(pto_errmsg(), "only an OUTPUT tensor may be unset");
    t = T(0);
    tag = 9;
    CHECK(pto_submit_next_level(o, 0, &a, NULL, -1) < 0);
    CHECK_CONTAINS(pto_errmsg(), "unknown tag");
    tag = PTO_INPUT;
    t.ndims = 6;
    CHECK(pto_submit_next_level(o, 0, &a, NULL, -1) < 0);
    CHECK_CONTAINS(pto_errmsg(), "at most 5");
    CHECK(pto_submit_next_level_group(o, 0, &a, 2, NULL, NULL) < 0);
    CHECK_CONTAINS(pto_errmsg(), "distinct");
    CHECK_EQ(pto_run_end(w), 0);
    CHECK(pto_submit_next_level(o, 0, &none, NULL, -1) < 0);
    CHECK_CONTAINS(pto_errmsg(), "outside its run");
    /* Still usable. */
    o = pto_run_begin(w);
    CHECK(sub1(o, CALL(1, ACT_RUN), 1, (int[]){0}, (uint8_t[]){PTO_OUTPUT}, -1) >= 0);
    CHECK_EQ(pto_run_end(w), 0);
    pto_worker_close(w);
}

static int ran_count(const int *ids, int n)
{
    int k = 0;
    for (int i = 0; i < n; i++) k += atomic_load(&ran[ids[i]]);
    return k;
}

static int task_state(pto_orch *o, int64_t id)
{
    pto_task_info info;
    return pto_task_info_get(o, id, &info) == 0 ? info.state : -1;
}

/* Hold, step, release and breakpoints (the REPL's :hold/:step/:break). */
static void test_dispatch_control(void)
{
    reset();
    pto_worker *w = make(2, 0);
    pto_dispatch_state st;
    const uint8_t OUT[] = {PTO_OUTPUT}, IN_OUT[] = {PTO_INPUT, PTO_OUTPUT};
    CHECK(pto_dispatch_step(w, 1) < 0);
    CHECK_CONTAINS(pto_errmsg(), "not held");
    CHECK_EQ(pto_dispatch_hold(w, 1), 0);
    pto_orch *o = pto_run_begin(w);
    int64_t a = sub1(o, CALL(120, ACT_RUN), 1, (int[]){0}, OUT, -1);
    int64_t b = sub1(o, CALL(121, ACT_RUN), 2, (int[]){0, 1}, IN_OUT, -1);
    int64_t c = sub1(o, CALL(122, ACT_RUN), 2, (int[]){1, 2}, IN_OUT, -1);
    int64_t d = sub1(o, CALL(123, ACT_RUN), 1, (int[]){3}, OUT, -1);
    CHECK_EQ(pto_dispatch_sync(w), 0);   /* wired: states are current */
    CHECK_EQ(task_state(o, a), PTO_TASK_READY);
    CHECK_EQ(task_state(o, d), PTO_TASK_READY);
    CHECK_EQ(pto_dispatch_wait(w, 2000), 1);
    CHECK_EQ(ran_count((int[]){120, 121, 122, 123}, 4), 0);
    CHECK_EQ(task_state(o, a), PTO_TASK_READY);
    CHECK_EQ(task_state(o, b), PTO_TASK_PENDING);
    CHECK_EQ(task_state(o, d), PTO_TASK_READY);
    /* one step: the oldest ready task, and only it */
    CHECK_EQ(pto_dispatch_step(w, 1), 0);
    CHECK_EQ(pto_dispatch_wait(w, 2000), 1);
    CHECK_EQ(atomic_load(&ran[120]), 1);
    CHECK_EQ(ran_count((int[]){121, 122, 123}, 3), 0);
    CHECK_EQ(task_state(o, a), PTO_TASK_COMPLETED);
    CHECK_EQ(task_state(o, b), PTO_TASK_READY);
    pto_task_info info;
    CHECK_EQ(pto_task_info_get(o, a, &info), 0);
    CHECK(info.worker == 0 || info.worker == 1);
    CHECK_EQ(pto_task_info_get(o, c, &info), 0);
    CHECK_EQ(info.worker, -1);
    /* two steps: both ready tasks, not the one they make ready */
    CHECK_EQ(pto_dispatch_step(w, 2), 0);
    CHECK_EQ(pto_dispatch_wait(w, 2000), 1);
    CHECK_EQ(ran_count((int[]){121, 123}, 2), 2);
    CHECK_EQ(atomic_load(&ran[122]), 0);
    /* a step larger than what is left runs the rest and is then dropped */
    CHECK_EQ(pto_dispatch_step(w, 5), 0);
    CHECK_EQ(pto_dispatch_wait(w, 2000), 1);
    CHECK_EQ(atomic_load(&ran[122]), 1);
    pto_dispatch_get(w, &st);
    CHECK_EQ(st.held, 1);
    CHECK_EQ(st.step_left, 0);
    CHECK_EQ(st.running, 0);
    int64_t e = sub1(o, CALL(124, ACT_RUN), 1, (int[]){4}, OUT, -1);
    CHECK_EQ(pto_dispatch_wait(w, 2000), 1);
    CHECK_EQ(atomic_load(&ran[124]), 0);
    CHECK_EQ(pto_dispatch_hold(w, 0), 0);
    CHECK_EQ(pto_dispatch_wait(w, 2000), 1);
    CHECK_EQ(atomic_load(&ran[124]), 1);
    CHECK_EQ(task_state(o, e), PTO_TASK_COMPLETED);

    /* a breakpoint holds everything before its callable's task, once */
    CHECK_EQ(pto_dispatch_break(w, PTO_NEXT_LEVEL, CALL(125, ACT_RUN), 1), 1);
    int64_t f = sub1(o, CALL(125, ACT_RUN), 1, (int[]){5}, OUT, -1);
    sub1(o, CALL(126, ACT_RUN), 1, (int[]){6}, OUT, -1);
    CHECK_EQ(pto_dispatch_wait(w, 2000), 1);
    pto_dispatch_get(w, &st);
    CHECK_EQ(st.held, 1);
    CHECK_EQ(st.break_task, f);
    CHECK_EQ(st.breakpoints, 1);
    CHECK_EQ(ran_count((int[]){125, 126}, 2), 0);
    CHECK_EQ(pto_dispatch_hold(w, 0), 0);
    CHECK_EQ(pto_dispatch_wait(w, 2000), 1);
    CHECK_EQ(ran_count((int[]){125, 126}, 2), 2);
    sub1(o, CALL(125, ACT_RUN), 1, (int[]){7}, OUT, -1);   /* the same callable stops again */
    CHECK_EQ(pto_dispatch_wait(w, 2000), 1);
    CHECK_EQ(atomic_load(&ran[125]), 1);
    /* the run's end drains through a hold */
    CHECK_EQ(pto_run_end(w), 0);
    CHECK_EQ(atomic_load(&ran[125]), 2);
    pto_dispatch_get(w, &st);
    CHECK_EQ(st.held, 1);
    CHECK_EQ(pto_dispatch_break(w, PTO_NEXT_LEVEL, UINT64_MAX, 0), 0);
    CHECK_EQ(pto_dispatch_hold(w, 0), 0);
    /* released: an ordinary run */
    o = pto_run_begin(w);
    sub1(o, CALL(125, ACT_RUN), 1, (int[]){0}, OUT, -1);
    CHECK_EQ(pto_run_end(w), 0);
    CHECK_EQ(atomic_load(&ran[125]), 3);
    pto_worker_close(w);
}

/* A chain (each task's only unfinished producer is the one before it) is
 * staged on one worker behind its head; a failing link stops the rest there,
 * and a link pinned elsewhere breaks the chain. Holding dispatch while the
 * chain is submitted makes every link wired before its head dispatches. */
static void test_chain_staged_behind_producer(void)
{
    reset();
    pto_worker *w = make(2, 0);
    const uint8_t OUT[] = {PTO_OUTPUT}, INOUT[] = {PTO_INOUT};
    CHECK_EQ(pto_dispatch_hold(w, 1), 0);
    pto_orch *o = pto_run_begin(w);
    int64_t id[10];
    id[0] = sub1(o, CALL(130, ACT_BLOCK), 1, (int[]){0}, OUT, -1);
    for (int i = 1; i < 10; i++) id[i] = sub1(o, CALL(130 + i, i == 4 ? ACT_FAIL : ACT_RUN), 1, (int[]){0}, INOUT, -1);
    sub1(o, CALL(140, ACT_RUN), 1, (int[]){5}, OUT, -1);   /* independent */
    CHECK_EQ(pto_dispatch_sync(w), 0);
    CHECK_EQ(pto_dispatch_hold(w, 0), 0);
    CHECK(wait_for(&blocked, 1));
    CHECK_EQ(pto_dispatch_sync(w), 0);
    for (int i = 1; i < 10; i++) CHECK_EQ(task_state(o, id[i]), PTO_TASK_RUNNING);   /* staged behind the head */
    atomic_store(&gate, 1);
    CHECK_EQ(pto_dispatch_wait(w, 5000), 1);
    for (int i = 0; i < 10; i++) CHECK_EQ(atomic_load(&ran[130 + i]), i <= 4);
    for (int i = 1; i <= 4; i++) CHECK_EQ(atomic_load(&worker_of[130 + i]), atomic_load(&worker_of[130]));
    CHECK_EQ(atomic_load(&ran[140]), 1);
    pto_task_info info;
    CHECK_EQ(pto_task_info_get(o, id[5], &info), 0);
    CHECK_EQ(info.state, PTO_TASK_FAILED);
    CHECK_EQ(info.worker, -1);
    CHECK_CONTAINS(info.error, "was not run: its producer task 4 failed");
    CHECK_EQ(pto_task_info_get(o, id[9], &info), 0);
    CHECK_EQ(info.state, PTO_TASK_FAILED);
    CHECK_CONTAINS(info.error, "its producer task 8 failed");
    CHECK_EQ(pto_run_end(w), -1);
    CHECK_CONTAINS(pto_errmsg(), "kernel 134 exploded");
    pto_stats st;
    pto_worker_stats_get(w, &st);
    CHECK_EQ(st.tasks_failed, 6);
    CHECK_EQ(st.tasks_live, 0);

    /* pins: the head on worker 0, link 3 on worker 1; each runs where pinned, in order */
    reset();
    CHECK_EQ(pto_dispatch_hold(w, 1), 0);
    o = pto_run_begin(w);
    sub1(o, CALL(130, ACT_RUN), 1, (int[]){0}, OUT, 0);
    for (int i = 1; i < 6; i++) sub1(o, CALL(130 + i, ACT_RUN), 1, (int[]){0}, INOUT, i == 3 ? 1 : -1);
    CHECK_EQ(pto_dispatch_sync(w), 0);
    CHECK_EQ(pto_dispatch_hold(w, 0), 0);
    CHECK_EQ(pto_run_end(w), 0);
    for (int i = 0; i < 6; i++) CHECK_EQ(atomic_load(&ran[130 + i]), 1);
    for (int i = 1; i < 6; i++) CHECK(atomic_load(&start_at[130 + i]) > atomic_load(&end_at[130 + i - 1]));
    CHECK_EQ(atomic_load(&worker_of[130]), 0);
    CHECK_EQ(atomic_load(&worker_of[132]), 0);
    CHECK_EQ(atomic_load(&worker_of[133]), 1);

    /* no chain jumps ahead of an older ready task pinned to the same worker */
    reset();
    CHECK_EQ(pto_dispatch_hold(w, 1), 0);
    o = pto_run_begin(w);
    sub1(o, CALL(130, ACT_RUN), 1, (int[]){0}, OUT, 0);
    sub1(o, CALL(131, ACT_RUN), 1, (int[]){3}, OUT, 0);     /* ready, waits for worker 0 */
    sub1(o, CALL(132, ACT_RUN), 1, (int[]){0}, INOUT, 0);   /* ready only after 130 */
    CHECK_EQ(pto_dispatch_sync(w), 0);
    CHECK_EQ(pto_dispatch_hold(w, 0), 0);
    CHECK_EQ(pto_run_end(w), 0);
    CHECK(atomic_load(&start_at[131]) < atomic_load(&start_at[132]));
    pto_worker_close(w);
}

/* A submit that needs ring space only held tasks could free fails at once. */
static void test_ring_full_while_held(void)
{
    reset();
    pto_worker *w = make(1, 0);
    CHECK_EQ(pto_dispatch_hold(w, 1), 0);
    pto_orch *o = pto_run_begin(w);
    uint64_t t0 = tu_now_ms();
    int64_t last = 0;
    for (int i = 0; i < 4 && last >= 0; i++) {
        pto_scope_begin(o);
        pto_tensor t = tu_tensor(0, 0, 100 * 1024);   /* 400 KiB, allocated by the submit */
        pto_task_args a = {.tensor_count = 1, .tensors = &t, .tags = (uint8_t[]){PTO_OUTPUT}};
        last = pto_submit_next_level(o, CALL(130 + i, ACT_RUN), &a, NULL, -1);
        pto_scope_end(o);
    }
    CHECK(last < 0);
    CHECK_CONTAINS(pto_errmsg(), "dispatch is held");
    CHECK_EQ(pto_errcode(), PTO_ERR_DISPATCH_HELD);   /* callers add their own commands' names */
    CHECK(!strstr(pto_errmsg(), ":step"));
    CHECK(tu_now_ms() - t0 < 2000);   /* not after alloc_timeout_ms */
    CHECK_EQ(pto_run_end(w), 0);
    CHECK_EQ(ran_count((int[]){130, 131}, 2), 2);
    pto_worker_close(w);
}

/* What :task and :tensormap show: tensors with tags, live TensorMap entries. */
static void test_inspection(void)
{
    reset();
    pto_worker *w = make(1, 0);
    CHECK_EQ(pto_dispatch_hold(w, 1), 0);
    pto_orch *o = pto_run_begin(w);
    const uint8_t TAGS[] = {PTO_INPUT, PTO_INOUT, PTO_OUTPUT, PTO_NO_DEP, PTO_OUTPUT_EXISTING};
    int64_t p = sub1(o, CALL(140, ACT_RUN), 5, (int[]){0, 1, 2, 3, 4}, TAGS, -1);
    pto_tensor ts[8];
    uint8_t tg[8];
    CHECK_EQ(pto_task_tensors(o, p, 0, ts, tg, 8), 5);
    for (int i = 0; i < 5; i++) {
        CHECK_EQ(tg[i], TAGS[i]);
        CHECK_EQ(ts[i].base, (uint64_t)(uintptr_t)bufs[i]);
    }
    CHECK_EQ(pto_task_tensors(o, p, 1, ts, tg, 8), -1);
    CHECK_EQ(pto_task_tensors(o, 99, 0, ts, tg, 8), -1);
    pto_tm_item items[8];
    CHECK_EQ(pto_tensormap_list(o, items, 8), 3);   /* INOUT, OUTPUT, OUTPUT_EXISTING */
    for (int i = 0; i < 3; i++) CHECK_EQ(items[i].producer, p);
    pto_child_info ci;
    CHECK_EQ(pto_worker_child_info_get(w, PTO_NEXT_LEVEL, 0, &ci), 0);
    CHECK_EQ(ci.current_task, -1);
    CHECK_EQ(ci.pid, 0);
    CHECK(pto_worker_child_info_get(w, PTO_SUB, 0, &ci) < 0);
    CHECK_EQ(pto_worker_current_task(w, PTO_NEXT_LEVEL, 0), -1);
    CHECK_EQ(pto_worker_current_task(w, PTO_SUB, 0), -1);        /* no such worker */
    CHECK_EQ(pto_worker_current_task(w, PTO_NEXT_LEVEL, 7), -1);
    CHECK_EQ(pto_run_end(w), 0);
    CHECK_EQ(pto_tensormap_list(o, items, 8), -1);
    CHECK_EQ(pto_worker_child_info_get(w, PTO_NEXT_LEVEL, 0, &ci), 0);
    CHECK_EQ(ci.tasks_run, 1);
    pto_worker_close(w);
}

int main(void)
{
    RUN(test_diamond);
    RUN(test_group_completes_after_all_members);
    RUN(test_pinned_worker_fifo);
    RUN(test_idle_worker_not_held_back);
    RUN(test_deep_queue_stolen_by_idle_worker);
    RUN(test_interrupt_skips_staged);
    RUN(test_failure_poisons_consumers);
    RUN(test_failed_group_member);
    RUN(test_consumer_waits_for_failing_group);
    RUN(test_interrupt);
    RUN(test_misuse);
    RUN(test_dispatch_control);
    RUN(test_chain_staged_behind_producer);
    RUN(test_ring_full_while_held);
    RUN(test_inspection);
    return tu_finish();
}
