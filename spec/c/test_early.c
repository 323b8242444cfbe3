/* Early posts (sched_early.c, done_words.h; on by default, PTO_EARLY_POSTS=0 turns them off): in PROCESS mode a consumer whose
 * producers on other children are posted already is posted too, and its
 * child waits for them. Results of a stencil whose every task reads three
 * producers, two of them on the other child, are exact (with early posts
 * off too), and early posts do happen; a producer that fails or whose
 * child is killed leaves its early consumers unrun and poisoned, and
 * nothing hangs; a consumer's child killed while it waits is replaced and
 * the consumer runs there; an interrupt revokes a waiting consumer; a
 * Worker keeps posting early over hundreds of runs (no word leaks). The
 * run profile of an early-posted stencil keeps the DAG's order. A consumer
 * does not go early behind an unrelated task, nor while ready tasks of its
 * kind wait for a worker; a bad PTO_EARLY_POSTS fails the init. */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include "common.h"
#include "testutil.h"

enum {
    C_SUM3 = 1,   /* spin s0 ns; t3 = t0 + t1 + t2 + 1 */
    C_SET,        /* spin s0 ns; t0 = 42 */
    C_FAIL,       /* spin s0 ns; fail */
    C_HANG,       /* record the pid, wait until killed */
    C_COPY,       /* t1 = t0; count the call */
};

typedef struct shared {
    _Atomic int hang_pid;
    _Atomic int copies;
} shared;
static shared *SH;

static void spin_ns(uint64_t ns)
{
    uint64_t t0 = pto_now_ns();
    while (pto_now_ns() - t0 < ns) pto_cpu_relax();
}

static uint64_t *at(const pto_args_view *a, int i)
{
    return (uint64_t *)(uintptr_t)(a->tensors[i].base + a->tensors[i].offset);
}

static int leaf_run(void *ctx, uint64_t callable, const pto_args_view *a, const pto_call_config *cfg, char *err,
                    size_t errlen)
{
    (void)ctx, (void)cfg;
    uint64_t s0 = a->scalar_count > 0 ? a->scalars[0] : 0;
    switch (callable) {
    case C_SUM3:
        spin_ns(s0);
        *at(a, 3) = *at(a, 0) + *at(a, 1) + *at(a, 2) + 1;
        return 0;
    case C_SET:
        spin_ns(s0);
        *at(a, 0) = 42;
        return 0;
    case C_FAIL:
        spin_ns(s0);
        snprintf(err, errlen, "deliberate failure");
        return 7;
    case C_HANG:
        atomic_store(&SH->hang_pid, (int)getpid());
        for (;;) pause();
    case C_COPY:
        *at(a, 1) = *at(a, 0);
        atomic_fetch_add(&SH->copies, 1);
        return 0;
    default:
        snprintf(err, errlen, "unknown callable %llu", (unsigned long long)callable);
        return 1;
    }
}

/* mode: "always" posts early whatever the tasks' times (the tests must not
 * depend on them: this machine may be loaded, and a task preempted midway
 * looks long), "1" only while tasks are short, NULL as by default (as "1"),
 * "0" never. */
static pto_worker *new_worker(void)
{
    pto_worker_config cfg = {.level = 3, .mode = PTO_MODE_PROCESS, .heap_ring_size = 1 << 20};
    pto_worker *w = pto_worker_new(&cfg);
    if (!w) { fprintf(stderr, "pto_worker_new: %s\n", pto_errmsg()); exit(2); }
    static const char *names[] = {"chip 1", "chip 2"};
    for (int i = 0; i < 2; i++) {
        pto_leaf l = {.run = leaf_run, .name = names[i]};
        pto_worker_add_next_level(w, &l);
    }
    return w;
}

/* pto_worker_init with PTO_EARLY_POSTS set to mode (NULL: unset) meanwhile. */
static int init_with(pto_worker *w, const char *mode)
{
    if (mode) setenv("PTO_EARLY_POSTS", mode, 1);
    else unsetenv("PTO_EARLY_POSTS");
    int rc = pto_worker_init(w);
    unsetenv("PTO_EARLY_POSTS");
    return rc;
}

static pto_worker *started_worker(const char *mode)
{
    pto_worker *w = new_worker();
    if (init_with(w, mode) != 0) { fprintf(stderr, "pto_worker_init: %s\n", pto_errmsg()); exit(2); }
    return w;
}

static pto_tensor u64_tensor(uint64_t *p)
{
    pto_tensor t = {.base = (uint64_t)(uintptr_t)p, .dtype = PTO_U64, .ndims = 1};
    t.shape[0] = 1;
    return t;
}

static int64_t submit_n(pto_orch *o, uint64_t callable, uint64_t **bufs, const uint8_t *tags, int n, uint64_t s0,
                        int pin)
{
    pto_tensor t[4];
    for (int i = 0; i < n; i++) t[i] = u64_tensor(bufs[i]);
    pto_task_args a = {n, 1, t, tags, &s0};
    return pto_submit_next_level(o, callable, &a, NULL, pin);
}

static int64_t submit_set(pto_orch *o, uint64_t *x, uint64_t spin, int pin)
{
    static const uint8_t tag[1] = {PTO_OUTPUT_EXISTING};
    return submit_n(o, C_SET, &x, tag, 1, spin, pin);
}

static int64_t submit_copy(pto_orch *o, uint64_t *in, uint64_t *out, int pin)
{
    static const uint8_t tags[2] = {PTO_INPUT, PTO_OUTPUT_EXISTING};
    uint64_t *b[2] = {in, out};
    return submit_n(o, C_COPY, b, tags, 2, 0, pin);
}

static int64_t early_count(pto_worker *w)
{
    pto_stats st;
    pto_worker_stats_get(w, &st);
    return st.tasks_early;
}

/* The Worker is usable after what a test did to it: a producer on chip 1
 * and its consumer on chip 2 run as they should. */
static void next_run_normal(pto_worker *w, uint64_t *x, uint64_t *y)
{
    pto_orch *o = pto_run_begin(w);
    submit_set(o, x, 2000000, 0);
    submit_copy(o, x, y, 1);
    CHECK_EQ(pto_run_end(w), 0);
    CHECK_EQ(*y, 42);
}

/* Poll until task id failed (its error in info) or 5 s passed. */
static bool wait_failed(pto_orch *o, int64_t id, pto_task_info *info)
{
    uint64_t t0 = pto_now_ns();
    while (pto_now_ns() - t0 < 5000000000ull) {
        if (pto_task_info_get(o, id, info) == 0 && info->state == PTO_TASK_FAILED) return true;
        tu_sleep_ms(1);
    }
    return false;
}

/* Poll until tasks 0..n-1 of o's run are dispatched (running), or 5 s:
 * then a task submitted next is wired and dispatched on its own. */
static bool wait_dispatched(pto_orch *o, int64_t n)
{
    uint64_t t0 = pto_now_ns();
    for (int64_t id = 0; id < n; id++) {
        pto_task_info info;
        while (!(pto_task_info_get(o, id, &info) == 0 && info.state == PTO_TASK_RUNNING)) {
            if (pto_now_ns() - t0 > 5000000000ull) return false;
            tu_sleep_ms(1);
        }
    }
    return true;
}

/* Poll until the Worker has posted n more tasks early than before, or 5 s. */
static bool wait_early(pto_worker *w, int64_t before, int64_t n)
{
    uint64_t t0 = pto_now_ns();
    while (early_count(w) < before + n && pto_now_ns() - t0 < 5000000000ull) tu_sleep_ms(1);
    return early_count(w) >= before + n;
}

/* ---- a stencil: exact results, early posts or not ---- */

enum { SW = 4, ST = 300 };

static void stencil_run(pto_worker *w, uint64_t *cells, uint64_t spin)
{
    static const uint8_t tags[4] = {PTO_INPUT, PTO_INPUT, PTO_INPUT, PTO_OUTPUT_EXISTING};
    pto_orch *o = pto_run_begin(w);
    for (int i = 0; i < SW; i++) cells[i] = (uint64_t)i * 1000;
    for (int t = 1; t < ST; t++)
        for (int i = 0; i < SW; i++) {
            uint64_t *b[4] = {&cells[(t - 1) * SW + (i + SW - 1) % SW], &cells[(t - 1) * SW + i],
                              &cells[(t - 1) * SW + (i + 1) % SW], &cells[t * SW + i]};
            submit_n(o, C_SUM3, b, tags, 4, spin, -1);
        }
    CHECK_EQ(pto_run_end(w), 0);
}

static int stencil_wrong(const uint64_t *cells)
{
    uint64_t ref[SW * ST];
    for (int i = 0; i < SW; i++) ref[i] = (uint64_t)i * 1000;
    int bad = 0;
    for (int t = 1; t < ST; t++)
        for (int i = 0; i < SW; i++) {
            ref[t * SW + i] = ref[(t - 1) * SW + (i + SW - 1) % SW] + ref[(t - 1) * SW + i] +
                              ref[(t - 1) * SW + (i + 1) % SW] + 1;
            bad += cells[t * SW + i] != ref[t * SW + i];
        }
    return bad;
}

/* The run's profile, against the DAG: every task's result was taken in
 * after its producers' (completion order), it began after they ended, and
 * the one that made it ready, if any, is one of them. Stencil task (t, i) has id
 * (t - 1) * SW + i; step 0 is no task. */
static int profile_wrong(pto_worker *w)
{
    enum { N = SW * (ST - 1) };
    static pto_profile_task rec[N];
    int64_t n = pto_profile_get(w, NULL, rec, N);
    CHECK_EQ(n, N);
    if (n != N) return -1;
    static int64_t pos[N];
    static const pto_profile_task *by_id[N];
    for (int64_t k = 0; k < n; k++) {
        pos[rec[k].id] = k;
        by_id[rec[k].id] = &rec[k];
    }
    int bad = 0;
    for (int64_t id = SW; id < N; id++) {
        int64_t t = id / SW, i = id % SW, p[3] = {(t - 1) * SW + (i + SW - 1) % SW, (t - 1) * SW + i,
                                                  (t - 1) * SW + (i + 1) % SW};
        const pto_profile_task *r = by_id[id];
        /* -1: all its producers had ended by the time it was wired (a slow
         * orchestrator: under TSan the first steps drain that fast). */
        bool by_producer = r->ready_by == -1;
        for (int k = 0; k < 3; k++) {
            if (pos[id] < pos[p[k]]) printf("  task %lld: its result was taken in before producer %lld's\n", (long long)id, (long long)p[k]);
            if (r->start_ns < by_id[p[k]]->end_ns)
                printf("  task %lld (worker %d) began %.2f us before producer %lld (worker %d) ended\n", (long long)id, r->worker,
                       (double)(by_id[p[k]]->end_ns - r->start_ns) / 1e3, (long long)p[k], by_id[p[k]]->worker);
            bad += pos[id] < pos[p[k]];
            bad += r->start_ns < by_id[p[k]]->end_ns;
            by_producer |= r->ready_by == p[k];
        }
        if (!by_producer) printf("  task %lld: made ready by %lld, no producer of it\n", (long long)id, (long long)r->ready_by);
        bad += !by_producer;
    }
    return bad;
}

static void test_stencil_exact(void)
{
    uint64_t *cells = pto_shm_alloc(SW * ST * 8);
    const char *modes[] = {"always", "1", NULL, "0"};
    for (int m = 0; m < 4; m++) {
        pto_worker *w = started_worker(modes[m]);
        for (int r = 0; r < 3; r++) {
            memset(cells, 0, SW * ST * 8);
            stencil_run(w, cells, 3000);   /* 3 us: a consumer run too soon would read a stale input */
            CHECK_EQ(stencil_wrong(cells), 0);
            CHECK_EQ(profile_wrong(w), 0);
        }
        int64_t n = early_count(w);
        printf("  PTO_EARLY_POSTS=%s: %lld of %d tasks posted early\n", modes[m] ? modes[m] : "(unset)", (long long)n,
               3 * SW * (ST - 1));
        if (m == 0) CHECK(n > SW * (ST - 1));   /* most of them: more than one run's worth */
        if (m == 3) CHECK_EQ(n, 0);
        pto_worker_close(w);
    }
    pto_shm_free(cells);
}

/* ---- placement ---- */

/* Where each task of the last run began and ended, by id (n at most 8). */
static void spans(pto_worker *w, pto_profile_task *by_id, int n)
{
    pto_profile_task rec[8];
    int64_t got = pto_profile_get(w, NULL, rec, 8);
    CHECK_EQ(got, n);
    for (int64_t k = 0; k < got && k < n; k++)
        if (rec[k].id >= 0 && rec[k].id < n) by_id[rec[k].id] = rec[k];
}

/* P, then a long task L, on chip 2; C reads P. C goes early, but not to
 * P's child, where it would wait behind L while chip 1 idles. */
static void test_not_behind_other_work(void)
{
    pto_worker *w = started_worker("always");
    uint64_t *x = pto_shm_alloc(8), *y = pto_shm_alloc(8), *z = pto_shm_alloc(8);
    int64_t e0 = early_count(w);
    pto_orch *o = pto_run_begin(w);
    submit_set(o, x, 20000000, 1);    /* P: 20 ms */
    submit_set(o, z, 400000000, 1);   /* L: 400 ms */
    submit_copy(o, x, y, -1);         /* C */
    CHECK_EQ(pto_run_end(w), 0);
    CHECK_EQ(*y, 42);
    CHECK_EQ(early_count(w), e0 + 1);
    pto_profile_task t[3] = {{0}};
    spans(w, t, 3);
    printf("  C ran on chip %d at %.1f ms; L on chip %d from %.1f to %.1f ms\n", t[2].worker + 1,
           (double)(t[2].start_ns - t[0].start_ns) / 1e6, t[1].worker + 1, (double)(t[1].start_ns - t[0].start_ns) / 1e6,
           (double)(t[1].end_ns - t[0].start_ns) / 1e6);
    CHECK(t[2].start_ns < t[1].end_ns - 200000000ull);
    pto_worker_close(w);
    pto_shm_free(x);
    pto_shm_free(y);
    pto_shm_free(z);
}

/* While ready tasks of C's kind wait for a worker, C (whose producer P is
 * posted) does not go early: it would take a child from them. Unpinned:
 * four 100 ms tasks, P among them, fill both chips' queue depth (2), a
 * fifth waits in the ready queue, then C. Pinned to chip 1: P on chip 2,
 * two tasks on chip 1 fill its depth, a third waits in its pinned queue,
 * then C. Each waits until the tasks before it are dispatched, so the
 * fifth is wired and dispatched on its own. */
static void test_no_early_over_backlog(void)
{
    pto_worker *w = started_worker("always");
    uint64_t *b = pto_shm_alloc(8 * 8), *y = pto_shm_alloc(8);
    for (int pinned = 0; pinned < 2; pinned++) {
        int pin = pinned ? 0 : -1;
        int64_t e0 = early_count(w);
        pto_orch *o = pto_run_begin(w);
        int n = pinned ? 3 : 4;
        submit_set(o, &b[0], 100000000, pinned ? 1 : -1);   /* P */
        for (int i = 1; i < n; i++) submit_set(o, &b[i], 100000000, pin);
        CHECK(wait_dispatched(o, n));   /* chip 1 has 2 */
        submit_set(o, &b[4], 100000000, pin);   /* waits for a worker */
        submit_copy(o, &b[0], y, pin);          /* C */
        CHECK_EQ(pto_run_end(w), 0);
        CHECK_EQ(*y, 42);
        printf("  %s: %lld posted early\n", pinned ? "pinned" : "unpinned", (long long)(early_count(w) - e0));
        CHECK_EQ(early_count(w), e0);
    }
    next_run_normal(w, &b[0], y);
    pto_worker_close(w);
    pto_shm_free(b);
    pto_shm_free(y);
}

/* ---- failures ---- */

/* A fails on chip 2 after B (chip 1) and B's consumer C were posted early:
 * neither runs, both are poisoned, and the next run is normal. B's child
 * answers first (the turn collects chip 1 before chip 2): B's result must
 * wait for A's to be finished. */
static void test_producer_fails(void)
{
    pto_worker *w = started_worker("always");
    uint64_t *x = pto_shm_alloc(8), *y = pto_shm_alloc(8), *z = pto_shm_alloc(8);
    *y = 5;
    *z = 6;
    atomic_store(&SH->copies, 0);
    int64_t e0 = early_count(w);
    pto_orch *o = pto_run_begin(w);
    static const uint8_t tag[1] = {PTO_OUTPUT_EXISTING};
    int64_t a = submit_n(o, C_FAIL, &x, tag, 1, 20000000, 1);   /* 20 ms, then fails */
    int64_t b = submit_copy(o, x, y, 0);
    int64_t c = submit_copy(o, y, z, 0);
    CHECK(wait_early(w, e0, 2));
    pto_task_info info;
    CHECK(wait_failed(o, b, &info));
    CHECK_CONTAINS(info.error, "was not run: its producer task");
    CHECK(wait_failed(o, c, &info));
    CHECK_EQ(pto_run_end(w), -1);
    char want[64];
    snprintf(want, sizeof want, "task %lld", (long long)a);
    CHECK_CONTAINS(pto_errmsg(), want);
    CHECK_CONTAINS(pto_errmsg(), "deliberate failure");
    CHECK_EQ(*y, 5);
    CHECK_EQ(*z, 6);
    CHECK_EQ(atomic_load(&SH->copies), 0);
    /* The next run is normal, early posts included. */
    e0 = early_count(w);
    next_run_normal(w, x, y);
    CHECK_EQ(early_count(w), e0 + 1);
    pto_worker_close(w);
    pto_shm_free(x);
    pto_shm_free(y);
    pto_shm_free(z);
}

/* A's child (chip 1) is killed while B waits for A on chip 2: A fails
 * within 100 ms, B is poisoned without running, chip 2's child lives on,
 * chip 1's is replaced. */
static void test_producer_killed(void)
{
    pto_worker *w = started_worker("always");
    uint64_t *x = pto_shm_alloc(8), *y = pto_shm_alloc(8);
    *y = 5;
    atomic_store(&SH->copies, 0);
    atomic_store(&SH->hang_pid, 0);
    int pid0 = pto_worker_child_pid(w, PTO_NEXT_LEVEL, 0), pid1 = pto_worker_child_pid(w, PTO_NEXT_LEVEL, 1);
    int64_t e0 = early_count(w);
    pto_orch *o = pto_run_begin(w);
    static const uint8_t tag[1] = {PTO_OUTPUT_EXISTING};
    int64_t a = submit_n(o, C_HANG, &x, tag, 1, 0, 0);
    int64_t b = submit_copy(o, x, y, 1);
    CHECK(wait_early(w, e0, 1));
    uint64_t t0 = tu_now_ms();
    while (!atomic_load(&SH->hang_pid) && tu_now_ms() - t0 < 5000) tu_sleep_ms(1);
    CHECK_EQ(atomic_load(&SH->hang_pid), pid0);
    uint64_t killed = pto_now_ns();
    kill(pid0, SIGKILL);
    pto_task_info info;
    CHECK(wait_failed(o, a, &info));
    printf("  producer failed %.2f ms after its child was killed\n", (double)(pto_now_ns() - killed) / 1e6);
    CHECK(pto_now_ns() - killed < 100000000ull);
    CHECK(wait_failed(o, b, &info));
    CHECK_CONTAINS(info.error, "was not run: its producer task");
    CHECK_EQ(pto_run_end(w), -1);
    CHECK_CONTAINS(pto_errmsg(), "was killed by signal 9");
    CHECK_EQ(*y, 5);
    CHECK_EQ(atomic_load(&SH->copies), 0);
    CHECK_EQ(pto_worker_child_pid(w, PTO_NEXT_LEVEL, 1), pid1);
    next_run_normal(w, x, y);
    CHECK(pto_worker_child_pid(w, PTO_NEXT_LEVEL, 0) != pid0);
    pto_worker_close(w);
    pto_shm_free(x);
    pto_shm_free(y);
}

/* B's own child (chip 2) is killed while B waits for A: B had not begun, so
 * the replacement runs it once A ends, and the run succeeds. */
static void test_waiting_consumer_killed(void)
{
    pto_worker *w = started_worker("always");
    uint64_t *x = pto_shm_alloc(8), *y = pto_shm_alloc(8);
    *x = 0;
    *y = 5;
    atomic_store(&SH->copies, 0);
    int pid1 = pto_worker_child_pid(w, PTO_NEXT_LEVEL, 1);
    int64_t e0 = early_count(w);
    pto_orch *o = pto_run_begin(w);
    submit_set(o, x, 300000000, 0);   /* 300 ms */
    submit_copy(o, x, y, 1);
    CHECK(wait_early(w, e0, 1));
    tu_sleep_ms(20);   /* B's child is waiting in A's word by now */
    kill(pid1, SIGKILL);
    CHECK_EQ(pto_run_end(w), 0);
    CHECK_EQ(*y, 42);
    CHECK_EQ(atomic_load(&SH->copies), 1);
    int now1 = pto_worker_child_pid(w, PTO_NEXT_LEVEL, 1);
    CHECK(now1 != pid1 && now1 > 0);
    pto_worker_close(w);
    pto_shm_free(x);
    pto_shm_free(y);
}

typedef struct later {
    pto_worker *w;
    int ms;
} later;

static void *interrupt_later(void *arg)
{
    later *l = arg;
    tu_sleep_ms(l->ms);
    pto_worker_interrupt(l->w);
    return NULL;
}

/* An interrupt while B waits for A: B is revoked and does not run; the run
 * ends once A has, reporting the interrupt; the next run is normal. */
static void test_interrupt_while_waiting(void)
{
    pto_worker *w = started_worker("always");
    uint64_t *x = pto_shm_alloc(8), *y = pto_shm_alloc(8);
    *y = 5;
    atomic_store(&SH->copies, 0);
    int64_t e0 = early_count(w);
    pto_orch *o = pto_run_begin(w);
    submit_set(o, x, 200000000, 0);   /* 200 ms */
    submit_copy(o, x, y, 1);
    CHECK(wait_early(w, e0, 1));
    later l = {w, 20};
    pthread_t th;
    pthread_create(&th, NULL, interrupt_later, &l);
    uint64_t t0 = tu_now_ms();
    CHECK_EQ(pto_run_end(w), -1);
    pthread_join(th, NULL);
    CHECK_CONTAINS(pto_errmsg(), "interrupted");
    CHECK(tu_now_ms() - t0 < 2000);
    CHECK_EQ(*y, 5);
    CHECK_EQ(atomic_load(&SH->copies), 0);
    next_run_normal(w, x, y);
    pto_worker_close(w);
    pto_shm_free(x);
    pto_shm_free(y);
}

/* Words go back when their tasks and waiters finish: after 400 runs (about
 * 12,000 words taken, 256 per child) the last run still posts early. */
static void test_words_reused(void)
{
    pto_worker *w = started_worker("always");
    enum { STEPS = 8 };
    uint64_t *cells = pto_shm_alloc(SW * STEPS * 8);
    static const uint8_t tags[4] = {PTO_INPUT, PTO_INPUT, PTO_INPUT, PTO_OUTPUT_EXISTING};
    int64_t last = 0;
    for (int r = 0; r < 400; r++) {
        int64_t e0 = early_count(w);
        pto_orch *o = pto_run_begin(w);
        /* Everything submitted before anything runs: however slow this
         * thread is (TSan), the later steps find their producers posted. */
        pto_dispatch_hold(w, 1);
        for (int i = 0; i < SW; i++) cells[i] = 1;
        for (int t = 1; t < STEPS; t++)
            for (int i = 0; i < SW; i++) {
                uint64_t *b[4] = {&cells[(t - 1) * SW + (i + SW - 1) % SW], &cells[(t - 1) * SW + i],
                                  &cells[(t - 1) * SW + (i + 1) % SW], &cells[t * SW + i]};
                submit_n(o, C_SUM3, b, tags, 4, 2000, -1);
            }
        pto_dispatch_hold(w, 0);
        CHECK_EQ(pto_run_end(w), 0);
        last = early_count(w) - e0;
    }
    printf("  the 400th run posted %lld of %d tasks early\n", (long long)last, SW * (STEPS - 1));
    CHECK(last > 0);
    pto_stats st;
    pto_worker_stats_get(w, &st);
    CHECK_EQ(st.tasks_failed, 0);
    CHECK_EQ(st.tasks_live, 0);
    pto_worker_close(w);
    pto_shm_free(cells);
}

/* A PTO_EARLY_POSTS that is none of 0, 1, always fails the init, naming
 * it; the Worker initialises once it is fixed. */
static void test_bad_env(void)
{
    pto_worker *w = new_worker();
    CHECK_EQ(init_with(w, "yes"), -1);
    CHECK_CONTAINS(pto_errmsg(), "PTO_EARLY_POSTS must be 0 (no early posts), 1 (early posts, the default) or always");
    CHECK_CONTAINS(pto_errmsg(), "got 'yes'");
    CHECK_EQ(init_with(w, "0"), 0);
    uint64_t *x = pto_shm_alloc(8), *y = pto_shm_alloc(8);
    next_run_normal(w, x, y);
    CHECK_EQ(early_count(w), 0);
    pto_worker_close(w);
    pto_shm_free(x);
    pto_shm_free(y);
}

int main(void)
{
    struct rlimit nocore = {0, 0};
    setrlimit(RLIMIT_CORE, &nocore);
    if (pto_shm_init(0) != 0) { fprintf(stderr, "%s\n", pto_errmsg()); return 2; }
    SH = pto_shm_alloc(sizeof *SH);
    RUN(test_stencil_exact);
    RUN(test_not_behind_other_work);
    RUN(test_no_early_over_backlog);
    RUN(test_producer_fails);
    RUN(test_producer_killed);
    RUN(test_waiting_consumer_killed);
    RUN(test_interrupt_while_waiting);
    RUN(test_words_reused);
    RUN(test_bad_env);
    return tu_finish();
}
