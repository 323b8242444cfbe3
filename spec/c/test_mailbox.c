/* The PROCESS-mode mailbox protocol (mailbox.c) on its own, without the
 * zygote: a "child" that is a thread (so TSan sees both sides) or a forked
 * process, many round trips through the spinning and the futex paths, a
 * full ring of cells in flight, chained cells skipped after a failure, error
 * messages, start failure, shipped callables, malformed input and shutdown.
 * The hand-off latency is a benchmark: scripts/bench/microbench.c. */
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "common.h"
#include "mailbox.h"
#include "testutil.h"

#define BIT(s) (1u << (s))
#define WAIT_MAX_NS 5000000000ll   /* a lost wake-up fails a check instead of hanging */

/* Memory both sides see, also across fork. */
typedef struct shared {
    _Atomic uint64_t sum;
    _Atomic int loads;
    _Atomic int runs;
    char loaded[64];               /* written by the load hook (the child's view) */
} shared;
static shared *SH;

enum { OP_ADD = 1, OP_FAIL, OP_SLEEP, OP_NOOP, OP_SHIPPED };

static int leaf_run(void *ctx, uint64_t callable, const pto_args_view *a, const pto_call_config *cfg, char *err,
                    size_t errlen)
{
    (void)ctx;
    atomic_fetch_add(&SH->runs, 1);
    switch (callable) {
    case OP_ADD: {
        uint64_t s = 0;
        for (int i = 0; i < a->scalar_count; i++) s += a->scalars[i];
        for (int i = 0; i < a->tensor_count; i++) s += a->tensors[i].offset;
        atomic_fetch_add(&SH->sum, s + (uint64_t)cfg->block_dim);
        return 0;
    }
    case OP_FAIL:
        snprintf(err, errlen, "failed on purpose (%d scalars, prefix '%s')", a->scalar_count, cfg->output_prefix);
        return 5;
    case OP_SLEEP: {
        struct timespec ts = {0, (long)(a->scalar_count ? a->scalars[0] : 1000000)};
        nanosleep(&ts, NULL);
        return 0;
    }
    case OP_SHIPPED:
        return strcmp(SH->loaded, "shipped!") == 0 ? 0 : (snprintf(err, errlen, "not loaded"), 1);
    default:
        return 0;
    }
}

static int leaf_start_fail(void *ctx, char *err, size_t errlen)
{
    (void)ctx;
    snprintf(err, errlen, "no device here");
    return 2;
}

static int leaf_load(void *ctx, uint64_t callable, const void *blob, size_t len, char *err, size_t errlen)
{
    (void)ctx;
    if (callable != OP_SHIPPED || len >= sizeof SH->loaded) {
        snprintf(err, errlen, "cannot load %llu", (unsigned long long)callable);
        return 3;
    }
    memcpy(SH->loaded, blob, len);
    atomic_fetch_add(&SH->loads, 1);
    return 0;
}

static pto_leaf LEAF = {.run = leaf_run, .name = "mb", .load = leaf_load};

/* ---- both kinds of peer ---- */

typedef struct peer {
    pto_mailbox *mb;
    pto_leaf leaf;
    uint32_t spin_max;
    pthread_t thread;
    pid_t pid;
    uint32_t seq;                  /* the parent's count of posts (= collections: one at a time) */
} peer;

static void peer_body(peer *p)
{
    if (pto_mb_child_start(p->mb, &p->leaf) != 0) return;
    pto_mb_child_loop(p->mb, &p->leaf, p->spin_max, p->spin_max);
}

static void *peer_thread(void *arg)
{
    peer_body(arg);
    return NULL;
}

/* Start a peer on a fresh mailbox (state STARTING -> IDLE); as_process forks. */
static void peer_start(peer *p, const pto_leaf *leaf, bool as_process, uint32_t spin_max)
{
    p->leaf = *leaf;
    p->mb = pto_mb_map();
    if (!p->mb) { fprintf(stderr, "%s\n", pto_errmsg()); exit(2); }
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
        pthread_create(&p->thread, NULL, peer_thread, p);
    }
}

static bool peer_started(peer *p)
{
    return pto_mb_wait(p->mb, BIT(PTO_MB_STARTING), NULL, NULL, 0, WAIT_MAX_NS) == PTO_MB_IDLE;
}

static void peer_stop(peer *p)
{
    CHECK_EQ(atomic_load(&p->mb->done), p->seq);   /* nothing left running */
    CHECK(pto_mb_cas(p->mb, PTO_MB_IDLE, PTO_MB_SHUTDOWN, NULL));
    pto_event_notify(&p->mb->to_child);
    if (p->pid > 0) {
        int st;
        CHECK_EQ(waitpid(p->pid, &st, 0), p->pid);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    } else {
        pthread_join(p->thread, NULL);
    }
    pto_mb_unmap(p->mb);
}

/* The cell of the last task a round trip collected. */
static pto_mb_cell *last_cell(peer *p) { return pto_mb_cell_of(p->mb, p->seq - 1); }

/* One task: post, wait, collect (rc, and the message when it failed). */
static int round_trip(peer *p, uint64_t callable, const pto_args_view *v, const pto_call_config *cfg, int64_t spin,
                      const void *load, uint64_t load_len, char *msg, size_t cap)
{
    int r = pto_mb_post(p->mb, p->seq, callable, v, cfg, load, load_len, false);
    if (r != 0) return -1000 + r;
    if (!pto_mb_wait_done(p->mb, p->seq, spin, WAIT_MAX_NS)) return -2000 - (int)pto_mb_state(p->mb);
    pto_mb_cell *c = pto_mb_cell_of(p->mb, p->seq++);
    int rc = c->rc;
    if (msg) snprintf(msg, cap, "%s", rc ? c->err : "");
    return rc;
}

/* Many tasks with varying args; the peer sums what it saw. */
static void many_round_trips(bool as_process, uint32_t child_spin, int64_t parent_spin, int n)
{
    peer p;
    atomic_store(&SH->sum, 0);
    peer_start(&p, &LEAF, as_process, child_spin);
    CHECK(peer_started(&p));
    uint64_t want = 0;
    int bad = 0;
    pto_call_config cfg = {.block_dim = 3};
    for (int i = 0; i < n; i++) {
        uint64_t sc[3] = {(uint64_t)i, 7, (uint64_t)i * 3};
        pto_tensor t[2] = {tu_tensor(0x1000, (uint64_t)i, 4), tu_tensor(0x2000, 1, 4)};
        pto_args_view v = {i % 3, i % 4, t, sc};
        for (int k = 0; k < v.scalar_count; k++) want += sc[k];
        for (int k = 0; k < v.tensor_count; k++) want += t[k].offset;
        want += 3;
        int r = round_trip(&p, OP_ADD, &v, &cfg, parent_spin, NULL, 0, NULL, 0);
        if (r != 0 && bad++ == 0) fprintf(stderr, "  round trip %d: %d\n", i, r);
    }
    CHECK_EQ(bad, 0);
    CHECK_EQ(atomic_load(&SH->sum), want);
    peer_stop(&p);
}

static void test_round_trips_thread(void)
{
    many_round_trips(false, 20000, 20000, 20000);   /* spinning hand-offs */
    many_round_trips(false, 0, 0, 3000);            /* every hand-off through the futex */
    many_round_trips(false, 20000, 0, 3000);        /* mixed */
}

static void test_round_trips_process(void)
{
    many_round_trips(true, 20000, 20000, 20000);
    many_round_trips(true, 0, 0, 3000);
    many_round_trips(true, 0, 20000, 3000);
}

/* Slow tasks: the parent sleeps on the futex and is woken by the result. */
static void test_sleeping_waits(void)
{
    for (int proc = 0; proc < 2; proc++) {
        peer p;
        peer_start(&p, &LEAF, proc, 20000);
        CHECK(peer_started(&p));
        uint64_t ns = 2000000;
        pto_args_view v = {0, 1, NULL, &ns};
        for (int i = 0; i < 20; i++) CHECK_EQ(round_trip(&p, OP_SLEEP, &v, NULL, 1000, NULL, 0, NULL, 0), 0);
        peer_stop(&p);
    }
}

static void test_errors_travel(void)
{
    for (int proc = 0; proc < 2; proc++) {
        peer p;
        peer_start(&p, &LEAF, proc, 20000);
        CHECK(peer_started(&p));
        uint64_t sc[2] = {1, 2};
        pto_args_view v = {0, 2, NULL, sc};
        pto_call_config cfg = {0};
        snprintf(cfg.output_prefix, sizeof cfg.output_prefix, "out/");
        char msg[PTO_MB_ERR_CAP];
        CHECK_EQ(round_trip(&p, OP_FAIL, &v, &cfg, 20000, NULL, 0, msg, sizeof msg), 5);
        CHECK_CONTAINS(msg, "failed on purpose (2 scalars, prefix 'out/')");
        /* A prefix without its NUL arrives terminated. */
        memset(cfg.output_prefix, 'x', sizeof cfg.output_prefix);
        CHECK_EQ(round_trip(&p, OP_FAIL, &v, &cfg, 20000, NULL, 0, msg, sizeof msg), 5);
        CHECK(strlen(msg) < PTO_MB_ERR_CAP);
        /* The next task is clean. */
        CHECK_EQ(round_trip(&p, OP_NOOP, &v, NULL, 20000, NULL, 0, NULL, 0), 0);
        peer_stop(&p);
    }
}

static void test_start_failure(void)
{
    for (int proc = 0; proc < 2; proc++) {
        peer p;
        p.leaf = LEAF;
        p.leaf.start = leaf_start_fail;
        p.mb = pto_mb_map();
        atomic_store(&p.mb->state, PTO_MB_STARTING);
        if (proc) {
            pid_t pid = fork();
            if (pid == 0) _exit(pto_mb_child_start(p.mb, &p.leaf) == 2 ? 0 : 1);
            int st;
            waitpid(pid, &st, 0);
            CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        } else {
            CHECK_EQ(pto_mb_child_start(p.mb, &p.leaf), 2);
        }
        /* The mailbox says why; it stays STARTING (the zygote's DEAD is the signal). */
        CHECK_EQ(pto_mb_state(p.mb), PTO_MB_STARTING);
        CHECK_EQ(p.mb->rc, 2);
        CHECK_CONTAINS(p.mb->err, "no device here");
        pto_mb_unmap(p.mb);
    }
}

static void test_shipped_callable(void)
{
    CHECK_EQ(pto_shm_init(0), 0);
    char *blob = pto_shm_alloc(16);
    memcpy(blob, "shipped!", 9);
    for (int proc = 0; proc < 2; proc++) {
        peer p;
        memset(SH->loaded, 0, sizeof SH->loaded);
        atomic_store(&SH->loads, 0);
        peer_start(&p, &LEAF, proc, 20000);
        CHECK(peer_started(&p));
        pto_args_view v = {0, 0, NULL, NULL};
        char msg[PTO_MB_ERR_CAP];
        CHECK_EQ(round_trip(&p, OP_SHIPPED, &v, NULL, 20000, NULL, 0, msg, sizeof msg), 1);
        CHECK_CONTAINS(msg, "not loaded");
        CHECK_EQ(round_trip(&p, OP_SHIPPED, &v, NULL, 20000, blob, 9, msg, sizeof msg), 0);
        CHECK_EQ(last_cell(&p)->loaded, 1);
        CHECK_EQ(round_trip(&p, OP_SHIPPED, &v, NULL, 20000, NULL, 0, msg, sizeof msg), 0);
        CHECK_EQ(last_cell(&p)->loaded, 0);
        CHECK_EQ(atomic_load(&SH->loads), 1);
        /* A blob outside shared memory is refused before the hook sees it. */
        static char private_blob[16] = "shipped!";
        CHECK_EQ(round_trip(&p, OP_SHIPPED, &v, NULL, 20000, private_blob, 9, msg, sizeof msg), 1);
        CHECK_CONTAINS(msg, "outside shared memory");
        /* The hook's own failure is the task's. */
        CHECK(round_trip(&p, OP_NOOP, &v, NULL, 20000, blob, 9, msg, sizeof msg) == 3);
        CHECK_CONTAINS(msg, "cannot load 4");
        CHECK_EQ(atomic_load(&SH->loads), 1);
        peer_stop(&p);
    }
    /* A leaf without a load hook says so. */
    peer p;
    pto_leaf noload = LEAF;
    noload.load = NULL;
    peer_start(&p, &noload, false, 20000);
    CHECK(peer_started(&p));
    pto_args_view v = {0, 0, NULL, NULL};
    char msg[PTO_MB_ERR_CAP];
    CHECK_EQ(round_trip(&p, OP_SHIPPED, &v, NULL, 20000, blob, 9, msg, sizeof msg), 1);
    CHECK_CONTAINS(msg, "no load hook");
    peer_stop(&p);
    pto_shm_free(blob);
}

/* The child treats the mailbox as untrusted bytes. */
static void test_malformed_mailbox(void)
{
    peer p;
    peer_start(&p, &LEAF, false, 20000);
    CHECK(peer_started(&p));
    struct { uint32_t len; int32_t t, s; } cases[] = {
        {PTO_MB_BLOB_CAP + 1, 0, 0},   /* longer than the blob area */
        {4, 0, 0},                     /* shorter than the header */
        {8, 1, 0},                     /* a tensor that is not there */
        {8, -1, 0},
        {8, 0, 0x7fffffff},
        {1000, 0x06666667, 0},         /* 40 * T wraps 32 bits */
        {UINT32_MAX, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pto_mb_cell *c = pto_mb_cell_of(p.mb, p.seq);
        memcpy(c->blob, &cases[i].t, 4);
        memcpy(c->blob + 4, &cases[i].s, 4);
        c->blob_len = cases[i].len;
        c->callable = OP_NOOP;
        c->load_addr = 0;
        c->after_prev = 0;
        atomic_store(&c->claim, PTO_CELL_POSTED);
        atomic_store(&p.mb->posted, p.seq + 1);
        pto_event_notify(&p.mb->to_child);
        CHECK(pto_mb_wait_done(p.mb, p.seq++, 20000, WAIT_MAX_NS));
        CHECK_EQ(c->rc, 1);
        CHECK_CONTAINS(c->err, "malformed");
    }
    /* A shipped blob address that wraps. */
    pto_mb_cell *c = pto_mb_cell_of(p.mb, p.seq);
    c->blob_len = 8;
    memset(c->blob, 0, 8);
    c->load_addr = UINT64_MAX - 4;
    c->load_len = 100;
    atomic_store(&c->claim, PTO_CELL_POSTED);
    atomic_store(&p.mb->posted, p.seq + 1);
    pto_event_notify(&p.mb->to_child);
    CHECK(pto_mb_wait_done(p.mb, p.seq++, 20000, WAIT_MAX_NS));
    CHECK_CONTAINS(c->err, "outside shared memory");
    peer_stop(&p);
}

/* A full ring in flight: the child runs the cells in order without waiting
 * for the parent between them, and each result stays in its cell until
 * the parent reads it. A chained cell (after_prev) is skipped, not run,
 * when the one before it failed, and runs when it succeeded. */
_Static_assert(PTO_MB_CELLS % 4 == 0 && PTO_MB_CELLS >= 4, "test_ring and test_revoke fill the ring four cells at a time");

static void test_ring(void)
{
    for (int proc = 0; proc < 2; proc++) {
        peer p;
        atomic_store(&SH->runs, 0);
        peer_start(&p, &LEAF, proc, 20000);
        CHECK(peer_started(&p));
        uint64_t ns = 20000000;
        pto_args_view slow = {0, 1, NULL, &ns}, none = {0, 0, NULL, NULL};
        int runs = 0;
        for (int round = 0; round < 50; round++) {
            /* Per four cells: (slow the very first), fail, chained (skipped),
             * chained to a skipped one (skipped). */
            uint64_t ops[PTO_MB_CELLS];
            bool after[PTO_MB_CELLS];
            for (uint32_t k = 0; k < PTO_MB_CELLS; k++) {
                static const uint64_t group[4] = {OP_NOOP, OP_FAIL, OP_NOOP, OP_NOOP};
                ops[k] = group[k % 4];
                after[k] = k % 4 >= 2;
            }
            if (round == 0) ops[0] = OP_SLEEP;
            if (round % 2)   /* odd rounds: nothing fails, the chains run */
                for (uint32_t k = 1; k < PTO_MB_CELLS; k += 4) ops[k] = OP_NOOP;
            for (uint32_t k = 0; k < PTO_MB_CELLS; k++)
                CHECK_EQ(pto_mb_post(p.mb, p.seq + k, ops[k], ops[k] == OP_SLEEP ? &slow : &none, NULL, NULL, 0,
                                     after[k]), 0);
            if (round == 0) CHECK(atomic_load(&p.mb->done) == p.seq);   /* the whole ring posted while the first sleeps */
            for (uint32_t k = 0; k < PTO_MB_CELLS; k++) CHECK(pto_mb_wait_done(p.mb, p.seq + k, 20000, WAIT_MAX_NS));
            pto_mb_cell *c = pto_mb_cell_of(p.mb, p.seq);
            CHECK_EQ(c[0].rc, 0);
            CHECK(c[0].start_ns >= c[0].posted_ns && c[0].done_ns >= c[0].start_ns);
            for (uint32_t g = 0; g < PTO_MB_CELLS; g += 4) {
                CHECK(c[g].rc == 0 && !c[g].skipped);
                if (round % 2) {
                    for (int k = 1; k < 4; k++) CHECK(c[g + k].rc == 0 && !c[g + k].skipped);
                    runs += 4;
                } else {
                    CHECK_EQ(c[g + 1].rc, 5);
                    CHECK_CONTAINS(c[g + 1].err, "failed on purpose");
                    CHECK(c[g + 2].skipped && c[g + 3].skipped);
                    runs += 2;
                }
            }
            p.seq += PTO_MB_CELLS;
        }
        CHECK_EQ(atomic_load(&SH->runs), runs);
        peer_stop(&p);
    }
}

/* An interrupt revokes what the child has not begun: the one running
 * finishes, the revoked ones come back skipped without running, and a
 * cell the child has begun cannot be revoked. */
static void test_revoke(void)
{
    for (int proc = 0; proc < 2; proc++) {
        peer p;
        atomic_store(&SH->runs, 0);
        peer_start(&p, &LEAF, proc, 20000);
        CHECK(peer_started(&p));
        uint64_t ns = 20000000;
        pto_args_view slow = {0, 1, NULL, &ns}, none = {0, 0, NULL, NULL};
        CHECK_EQ(pto_mb_post(p.mb, p.seq, OP_SLEEP, &slow, NULL, NULL, 0, false), 0);
        for (uint32_t k = 1; k < PTO_MB_CELLS; k++)
            CHECK_EQ(pto_mb_post(p.mb, p.seq + k, OP_NOOP, &none, NULL, NULL, 0, false), 0);
        uint64_t t0 = pto_now_ns();
        while (atomic_load(&p.mb->started) == p.seq && pto_now_ns() - t0 < WAIT_MAX_NS) sched_yield();
        CHECK(atomic_load(&p.mb->started) == p.seq + 1);   /* the sleep has begun */
        CHECK(!pto_mb_revoke(p.mb, p.seq));
        CHECK(pto_mb_revoke(p.mb, p.seq + 1) && pto_mb_revoke(p.mb, p.seq + 3));
        CHECK(!pto_mb_revoke(p.mb, p.seq + 1));            /* once */
        for (uint32_t k = 0; k < PTO_MB_CELLS; k++) CHECK(pto_mb_wait_done(p.mb, p.seq + k, 20000, WAIT_MAX_NS));
        pto_mb_cell *c = pto_mb_cell_of(p.mb, p.seq);
        CHECK(!c[0].skipped && c[0].rc == 0);
        CHECK(c[1].skipped && !c[2].skipped && c[3].skipped);
        for (uint32_t k = 4; k < PTO_MB_CELLS; k++) CHECK(!c[k].skipped && c[k].rc == 0);
        CHECK_EQ(atomic_load(&SH->runs), (int)PTO_MB_CELLS - 2);
        p.seq += PTO_MB_CELLS;
        CHECK_EQ(round_trip(&p, OP_NOOP, &none, NULL, 20000, NULL, 0, NULL, 0), 0);   /* the cells serve again */
        peer_stop(&p);
    }
}

static void test_blob_too_big(void)
{
    peer p;
    peer_start(&p, &LEAF, false, 20000);
    CHECK(peer_started(&p));
    int32_t n = PTO_MB_BLOB_CAP / 8;   /* n scalars need 8 * n + 8 bytes */
    uint64_t *sc = calloc((size_t)n, 8);
    pto_args_view v = {0, n, NULL, sc};
    CHECK_EQ(pto_mb_post(p.mb, p.seq, OP_NOOP, &v, NULL, NULL, 0, false), -1);
    CHECK_CONTAINS(pto_errmsg(), "at most 262144 bytes");
    CHECK_EQ(pto_mb_state(p.mb), PTO_MB_IDLE);   /* nothing was handed over */
    v.scalar_count = n - 1;                      /* exactly the cap */
    CHECK_EQ(round_trip(&p, OP_NOOP, &v, NULL, 20000, NULL, 0, NULL, 0), 0);
    free(sc);
    peer_stop(&p);
}

/* The protocol words refuse transitions from the wrong state. */
static void test_states(void)
{
    pto_mailbox *mb = pto_mb_map();
    CHECK_EQ(pto_mb_state(mb), PTO_MB_EMPTY);
    pto_args_view v = {0, 0, NULL, NULL};
    CHECK_EQ(pto_mb_post(mb, 0, 1, &v, NULL, NULL, 0, false), PTO_MB_EMPTY);
    atomic_store(&mb->state, PTO_MB_DEAD);
    CHECK_EQ(pto_mb_post(mb, 0, 1, &v, NULL, NULL, 0, false), PTO_MB_DEAD);
    CHECK_EQ(atomic_load(&mb->posted), 0u);   /* nothing was handed over */
    uint32_t seen;
    CHECK(!pto_mb_cas(mb, PTO_MB_IDLE, PTO_MB_SHUTDOWN, &seen));
    CHECK_EQ(seen, PTO_MB_DEAD);
    /* A wait on a state that does not change times out. */
    uint64_t t0 = pto_now_ns();
    CHECK_EQ(pto_mb_wait(mb, BIT(PTO_MB_DEAD), NULL, NULL, 1000, 20000000), PTO_MB_DEAD);
    CHECK(pto_now_ns() - t0 >= 15000000);
    pto_mb_unmap(mb);
}

static void test_spin_budget(void)
{
    pto_mb_spin s;
    pto_mb_spin_init(&s, 20000);
    CHECK(pto_mb_spin_budget(&s) > 0);
    for (int i = 0; i < 50; i++) pto_mb_spin_observe(&s, 1000000);   /* slow peer: stop spinning */
    CHECK_EQ(pto_mb_spin_budget(&s), 0);
    for (int i = 0; i < 50; i++) pto_mb_spin_observe(&s, 1000);      /* fast again: spin again */
    CHECK(pto_mb_spin_budget(&s) > 0 && pto_mb_spin_budget(&s) <= 20000);
    /* Waits near zero, but a wake-up takes 40 us: spin about that long, not
     * twice the mean wait, and still not at all once waits are long. */
    pto_mb_spin_init(&s, 100000);
    for (int i = 0; i < 50; i++) pto_mb_spin_observe(&s, 100);
    for (int i = 0; i < 50; i++) pto_mb_spin_woke(&s, 1000);
    CHECK(pto_mb_spin_budget(&s) < 5000);
    for (int i = 0; i < 50; i++) pto_mb_spin_woke(&s, 40000);
    CHECK(pto_mb_spin_budget(&s) >= 35000 && pto_mb_spin_budget(&s) <= 40000);
    for (int i = 0; i < 50; i++) pto_mb_spin_woke(&s, 10000000);   /* clamped: never past max */
    CHECK_EQ(pto_mb_spin_budget(&s), 100000);
    for (int i = 0; i < 50; i++) pto_mb_spin_observe(&s, 1000000);
    CHECK_EQ(pto_mb_spin_budget(&s), 0);
    pto_mb_spin_init(&s, 0);
    CHECK_EQ(pto_mb_spin_budget(&s), 0);
}

/* ---- hand-off latency: printed for the record ---- */

int main(void)
{
    SH = mmap(NULL, sizeof *SH, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    RUN(test_states);
    RUN(test_spin_budget);
    RUN(test_round_trips_thread);
    RUN(test_round_trips_process);
    RUN(test_sleeping_waits);
    RUN(test_errors_travel);
    RUN(test_start_failure);
    RUN(test_shipped_callable);
    RUN(test_malformed_mailbox);
    RUN(test_ring);
    RUN(test_revoke);
    RUN(test_blob_too_big);
    return tu_finish();
}
