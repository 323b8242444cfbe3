/* Isolation of PROCESS-mode children (issue 19, item 5): a child maps only
 * its own mailbox, so a leaf that scribbles over every shared mapping of a
 * mailbox's size reaches no other worker; a child that leaves its own
 * mailbox in an impossible state, while running a task or while idle, is
 * killed and replaced, the task failing with a message that names it, and
 * the Worker keeps working. C leaves, since a Lua sub cannot write raw memory. */
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include "common.h"
#include "mailbox.h"
#include "process.h"
#include "testutil.h"

#define GARBAGE 0xDEADBEEFu

enum {
    C_PID = 1,        /* t0[0] = getpid() */
    C_SCRIBBLE,       /* write GARBAGE over the state of every other mailbox-sized shared mapping */
    C_SELF_HANG,      /* write GARBAGE over its own state, then hang */
    C_SELF_LATER,     /* return; 50 ms later a thread writes GARBAGE over its own state */
};

/* The mailbox of the child running a task: err points into it. */
static pto_mailbox *my_mailbox(char *err)
{
    (void)err;
    return pto_proc_own_mailbox();
}

/* Shared mappings of exactly a mailbox's (page-rounded) size, other than mine: how many were scribbled. */
static int scribble_others(const pto_mailbox *mine)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    size_t want = (sizeof(pto_mailbox) + pg - 1) / pg * pg;
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3) continue;
        if (hi - lo != want || strcmp(perms, "rw-s") != 0 || lo == (unsigned long)(uintptr_t)mine) continue;
        atomic_store(&((pto_mailbox *)(uintptr_t)lo)->state, GARBAGE);
        n++;
    }
    fclose(f);
    return n;
}

static void *scribble_later(void *arg)
{
    tu_sleep_ms(50);
    atomic_store(&((pto_mailbox *)arg)->state, GARBAGE);
    return NULL;
}

static int leaf_run(void *ctx, uint64_t callable, const pto_args_view *a, const pto_call_config *cfg, char *err,
                    size_t errlen)
{
    (void)ctx, (void)cfg;
    uint64_t *t0 = a->tensor_count > 0 ? (uint64_t *)(uintptr_t)(a->tensors[0].base + a->tensors[0].offset) : NULL;
    pthread_t th;
    switch (callable) {
    case C_PID:
        t0[0] = (uint64_t)getpid();
        return 0;
    case C_SCRIBBLE:
        t0[0] = (uint64_t)scribble_others(my_mailbox(err));
        return 0;
    case C_SELF_HANG:
        atomic_store(&my_mailbox(err)->state, GARBAGE);
        for (;;) pause();
    case C_SELF_LATER:
        if (pthread_create(&th, NULL, scribble_later, my_mailbox(err)) != 0) return 1;
        pthread_detach(th);
        return 0;
    default:
        snprintf(err, errlen, "unknown callable %llu", (unsigned long long)callable);
        return 1;
    }
}

static const char *NAMES[] = {"chip 1", "chip 2", "chip 3"};

static pto_worker *started_worker(int n)
{
    pto_worker_config cfg = {.level = 3, .mode = PTO_MODE_PROCESS, .heap_ring_size = 1 << 20};
    pto_worker *w = pto_worker_new(&cfg);
    if (!w) { fprintf(stderr, "pto_worker_new: %s\n", pto_errmsg()); exit(2); }
    for (int i = 0; i < n; i++) {
        pto_leaf l = {.run = leaf_run, .ctx = NULL, .name = NAMES[i]};
        pto_worker_add_next_level(w, &l);
    }
    if (pto_worker_init(w) != 0) { fprintf(stderr, "pto_worker_init: %s\n", pto_errmsg()); exit(2); }
    return w;
}

static int64_t submit(pto_orch *o, uint64_t callable, uint64_t *buf, int pin)
{
    pto_tensor t = {.base = (uint64_t)(uintptr_t)buf, .dtype = PTO_U64, .ndims = 1};
    t.shape[0] = 1;
    uint8_t tag = PTO_OUTPUT_EXISTING;
    pto_task_args a = {buf ? 1 : 0, 0, &t, &tag, NULL};
    return pto_submit_next_level(o, callable, &a, NULL, pin);
}

/* Every chip runs C_PID and reports its own pid. */
static void check_all_run(pto_worker *w, int n, uint64_t **bufs)
{
    pto_orch *o = pto_run_begin(w);
    for (int i = 0; i < n; i++) submit(o, C_PID, bufs[i], i);
    CHECK_EQ(pto_run_end(w), 0);
    for (int i = 0; i < n; i++) {
        int pid = pto_worker_child_pid(w, PTO_NEXT_LEVEL, i);
        CHECK(pid > 0);
        CHECK_EQ(*bufs[i], pid);
    }
}

static void test_child_sees_only_its_mailbox(void)
{
    uint64_t *b[3] = {pto_shm_alloc(8), pto_shm_alloc(8), pto_shm_alloc(8)};
    pto_worker *w = started_worker(3);
    pto_orch *o = pto_run_begin(w);
    *b[0] = 99;
    submit(o, C_SCRIBBLE, b[0], 0);
    CHECK_EQ(pto_run_end(w), 0);
    CHECK_EQ(*b[0], 0);   /* no other mailbox was mapped in chip 1 */
    for (int round = 0; round < 3; round++) check_all_run(w, 3, b);
    pto_worker_close(w);
    for (int i = 0; i < 3; i++) pto_shm_free(b[i]);
}

static void test_impossible_state_while_running(void)
{
    uint64_t *b[2] = {pto_shm_alloc(8), pto_shm_alloc(8)};
    pto_worker *w = started_worker(2);
    int before = pto_worker_child_pid(w, PTO_NEXT_LEVEL, 0);
    pto_orch *o = pto_run_begin(w);
    submit(o, C_SELF_HANG, NULL, 0);
    CHECK_EQ(pto_run_end(w), -1);
    char want[160];
    snprintf(want, sizeof want, "chip 1 (pid %d) left its mailbox in an impossible state (%u)", before, GARBAGE);
    CHECK_CONTAINS(pto_errmsg(), want);
    CHECK_CONTAINS(pto_errmsg(), "it was killed and is replaced");
    for (int round = 0; round < 3; round++) check_all_run(w, 2, b);
    CHECK(pto_worker_child_pid(w, PTO_NEXT_LEVEL, 0) != before);
    pto_worker_close(w);
    for (int i = 0; i < 2; i++) pto_shm_free(b[i]);
}

static void test_impossible_state_while_idle(void)
{
    uint64_t *b[2] = {pto_shm_alloc(8), pto_shm_alloc(8)};
    pto_worker *w = started_worker(2);
    int before = pto_worker_child_pid(w, PTO_NEXT_LEVEL, 0);
    pto_orch *o = pto_run_begin(w);
    submit(o, C_SELF_LATER, NULL, 0);
    CHECK_EQ(pto_run_end(w), 0);
    tu_sleep_ms(100);   /* the thread has scribbled */
    CHECK_EQ(pto_worker_child_pid(w, PTO_NEXT_LEVEL, 0), -1);   /* an impossible state is no live child */
    for (int round = 0; round < 3; round++) check_all_run(w, 2, b);
    CHECK(pto_worker_child_pid(w, PTO_NEXT_LEVEL, 0) != before);
    pto_worker_close(w);
    for (int i = 0; i < 2; i++) pto_shm_free(b[i]);
}

int main(void)
{
    RUN(test_child_sees_only_its_mailbox);
    RUN(test_impossible_state_while_running);
    RUN(test_impossible_state_while_idle);
    return tu_finish();
}
