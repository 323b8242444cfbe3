/* PROCESS-mode Workers with C leaves (they run in forked children): results
 * through shared memory, a DAG of many tasks, children that crash, abort,
 * exit or are killed mid-task (the task fails within 100 ms naming pid and
 * cause, consumers are poisoned, independent tasks complete, the child is
 * replaced), start hooks that fail or hang, shipped callables, a parent
 * killed with SIGKILL, shutdown of a stuck run, no process / zombie / fd
 * left behind, 1000 runs on one Worker. */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <sched.h>
#include "common.h"
#include "process.h"
#include "testutil.h"
#include "worker.h"

/* Callables: what the test leaf does (it runs in a child). */
enum {
    C_FILL = 1,      /* u64 tensor 0: t[i] = scalar 0 + i */
    C_ADD,           /* u64 tensor 0 (INOUT): t[0] += scalar 0 */
    C_COPY,          /* t1[0] = t0[0] */
    C_PID,           /* t0[0] = getpid() */
    C_FAIL,          /* returns 7 with a message */
    C_SEGV,          /* raise(SIGSEGV) with the default action */
    C_ABORT,         /* abort() */
    C_EXIT3,         /* _exit(3) */
    C_HANG,          /* waits until killed */
    C_SPIN,          /* spins, saying on which CPU, until told to stop */
    C_SHIPPED = 100, /* needs the shipped blob loaded in this child */
};

/* Shared with every child: allocated before the first Worker forks. */
typedef struct shared {
    _Atomic uint64_t event_ns;     /* when a leaf was about to die */
    _Atomic int hang_pid;          /* the pid of a C_HANG leaf, once it runs */
    _Atomic int loads;             /* load hook calls, all children */
    _Atomic int load_pids[64];
    _Atomic int starts;            /* start hook calls */
    _Atomic int start_pids[64];
    _Atomic int start_mode;        /* how start hooks behave: see leaf_start */
    _Atomic int spin_cpu;          /* C_SPIN: the CPU it last ran on */
    _Atomic int spin_stop;         /* C_SPIN: return now */
} shared;
static shared *SH;

/* Per child (private after the fork): what the load hook installed. */
static char installed[64];

static int leaf_run(void *ctx, uint64_t callable, const pto_args_view *a, const pto_call_config *cfg, char *err,
                    size_t errlen)
{
    (void)ctx, (void)cfg;
    uint64_t *t0 = a->tensor_count > 0 ? (uint64_t *)(uintptr_t)(a->tensors[0].base + a->tensors[0].offset) : NULL;
    uint64_t *t1 = a->tensor_count > 1 ? (uint64_t *)(uintptr_t)(a->tensors[1].base + a->tensors[1].offset) : NULL;
    uint64_t s0 = a->scalar_count > 0 ? a->scalars[0] : 0;
    switch (callable) {
    case C_FILL:
        for (uint64_t i = 0; i < pto_tensor_numel(&a->tensors[0]); i++) t0[i] = s0 + i;
        return 0;
    case C_ADD:
        t0[0] += s0;
        return 0;
    case C_COPY:
        t1[0] = t0[0];
        return 0;
    case C_PID:
        t0[0] = (uint64_t)getpid();
        return 0;
    case C_FAIL:
        snprintf(err, errlen, "deliberate failure in pid %d", (int)getpid());
        return 7;
    case C_SEGV:
        atomic_store(&SH->event_ns, pto_now_ns());
        signal(SIGSEGV, SIG_DFL);   /* a plain death also under the sanitizers' handlers */
        raise(SIGSEGV);
        return 0;
    case C_ABORT:
        atomic_store(&SH->event_ns, pto_now_ns());
        abort();
    case C_EXIT3:
        atomic_store(&SH->event_ns, pto_now_ns());
        _exit(3);
    case C_HANG:
        atomic_store(&SH->hang_pid, (int)getpid());
        for (;;) pause();
    case C_SPIN:
        while (!atomic_load(&SH->spin_stop)) atomic_store(&SH->spin_cpu, sched_getcpu());
        return 0;
    case C_SHIPPED:
        if (strcmp(installed, (const char *)(uintptr_t)s0) != 0) {
            snprintf(err, errlen, "shipped callable not installed (have '%s')", installed);
            return 1;
        }
        if (t0) t0[0] = (uint64_t)getpid();
        return 0;
    default:
        snprintf(err, errlen, "unknown callable %llu", (unsigned long long)callable);
        return 1;
    }
}

/* start_mode: 0 ok; 1 the child of ctx index 1 fails; 2 it _exits(3); 3 it hangs. */
static int leaf_start(void *ctx, char *err, size_t errlen)
{
    int index = (int)(intptr_t)ctx;
    int n = atomic_fetch_add(&SH->starts, 1);
    if (n < 64) atomic_store(&SH->start_pids[n], (int)getpid());
    int mode = atomic_load(&SH->start_mode);
    if (index == 1 && mode == 1) {
        snprintf(err, errlen, "no device for worker %d", index);
        return 1;
    }
    if (index == 1 && mode == 2) _exit(3);
    if (index == 1 && mode == 3)
        for (;;) pause();
    return 0;
}

static int leaf_load(void *ctx, uint64_t callable, const void *blob, size_t len, char *err, size_t errlen)
{
    (void)ctx;
    if (callable != C_SHIPPED || len >= sizeof installed) {
        snprintf(err, errlen, "cannot install %llu", (unsigned long long)callable);
        return 1;
    }
    memcpy(installed, blob, len);
    int n = atomic_fetch_add(&SH->loads, 1);
    if (n < 64) atomic_store(&SH->load_pids[n], (int)getpid());
    return 0;
}

static const char *NL_NAMES[] = {"chip 1", "chip 2", "chip 3", "chip 4"};
static const char *SUB_NAMES[] = {"sub 1", "sub 2"};

static pto_worker *make_worker(int nl, int ns, uint32_t start_timeout_ms, bool with_load)
{
    pto_worker_config cfg = {.level = 3, .mode = PTO_MODE_PROCESS, .heap_ring_size = 1 << 20,
                             .start_timeout_ms = start_timeout_ms};
    pto_worker *w = pto_worker_new(&cfg);
    if (!w) { fprintf(stderr, "pto_worker_new: %s\n", pto_errmsg()); exit(2); }
    for (int i = 0; i < nl + ns; i++) {
        pto_leaf l = {.run = leaf_run, .ctx = (void *)(intptr_t)i, .name = i < nl ? NL_NAMES[i] : SUB_NAMES[i - nl],
                      .start = leaf_start, .load = with_load ? leaf_load : NULL};
        if (i < nl) pto_worker_add_next_level(w, &l);
        else pto_worker_add_sub(w, &l);
    }
    return w;
}

static pto_worker *started_worker(int nl, int ns)
{
    pto_worker *w = make_worker(nl, ns, 0, true);
    if (pto_worker_init(w) != 0) { fprintf(stderr, "pto_worker_init: %s\n", pto_errmsg()); exit(2); }
    return w;
}

/* ---- processes ---- */

/* "R", "S", "Z" ... from /proc/pid/stat, or 0 if the process is gone. */
static char proc_state(int pid, int *ppid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')');
    char st = 0;
    int pp = 0;
    if (!p || sscanf(p + 1, " %c %d", &st, &pp) != 2) return 0;
    if (ppid) *ppid = pp;
    return st;
}

static bool alive(int pid)
{
    char st = pid > 0 ? proc_state(pid, NULL) : 0;
    return st && st != 'Z' && st != 'X';
}

/* Processes (zombies too) whose parent is this process. */
static int count_my_children(void)
{
    DIR *d = opendir("/proc");
    int n = 0, me = (int)getpid();
    for (struct dirent *e; (e = readdir(d));) {
        int pid = atoi(e->d_name), ppid = 0;
        if (pid > 0 && proc_state(pid, &ppid) && ppid == me) n++;
    }
    closedir(d);
    return n;
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n - 1;   /* the DIR's own fd */
}

/* Wait until pid is gone (or a zombie of someone else); false after ms. */
static bool wait_gone(int pid, int ms)
{
    uint64_t t0 = tu_now_ms();
    while (alive(pid)) {
        if (tu_now_ms() - t0 > (uint64_t)ms) return false;
        tu_sleep_ms(1);
    }
    return true;
}

static void child_pids(pto_worker *w, int *out, int nl, int ns)
{
    for (int i = 0; i < nl; i++) out[i] = pto_worker_child_pid(w, PTO_NEXT_LEVEL, i);
    for (int i = 0; i < ns; i++) out[nl + i] = pto_worker_child_pid(w, PTO_SUB, i);
}

/* ---- tasks ---- */

static pto_tensor u64_tensor(uint64_t *p, uint32_t n)
{
    pto_tensor t = {.base = (uint64_t)(uintptr_t)p, .dtype = PTO_U64, .ndims = 1};
    t.shape[0] = n;
    return t;
}

static int64_t submit1(pto_orch *o, int kind, uint64_t callable, uint64_t *buf, uint8_t tag, uint64_t s0, int pin)
{
    pto_tensor t = u64_tensor(buf, 1);
    pto_task_args a = {buf ? 1 : 0, 1, &t, &tag, &s0};
    return kind == PTO_SUB ? pto_submit_sub(o, callable, &a, pin) : pto_submit_next_level(o, callable, &a, NULL, pin);
}

static int64_t submit2(pto_orch *o, uint64_t callable, uint64_t *in, uint64_t *out)
{
    pto_tensor t[2] = {u64_tensor(in, 1), u64_tensor(out, 1)};
    uint8_t tags[2] = {PTO_INPUT, PTO_OUTPUT_EXISTING};
    pto_task_args a = {2, 0, t, tags, NULL};
    return pto_submit_next_level(o, callable, &a, NULL, -1);
}

/* Poll task id until it failed; its failure time in ns, or 0 after 5 s. */
static uint64_t wait_failed(pto_orch *o, int64_t id)
{
    uint64_t t0 = pto_now_ns();
    pto_task_info info;
    while (pto_now_ns() - t0 < 5000000000ull) {
        if (pto_task_info_get(o, id, &info) == 0 && info.state == PTO_TASK_FAILED) return pto_now_ns();
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

/* ---- tests ---- */

static void test_thread_mode_has_no_children(void)
{
    pto_worker *w = tu_worker(1, 1, tu_gate_leaf, NULL, 1 << 20, 1000);
    CHECK_EQ(pto_worker_child_pid(w, PTO_NEXT_LEVEL, 0), -1);
    CHECK_EQ(pto_worker_ship_callable(w, PTO_SUB, 5, "x", 1), 0);
    CHECK_EQ(pto_worker_child_pid(w, PTO_SUB, 3), -1);
    pto_worker_close(w);
}

/* A forked copy of an initialised Worker has none of its threads: closing
 * it there must return at once and leave the original working. */
static void test_close_in_forked_copy(void)
{
    pto_worker *w = tu_worker(1, 1, tu_gate_leaf, NULL, 1 << 20, 1000);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(5);
        pto_worker_close(w);
        _exit(0);
    }
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(pto_run_begin(w) != NULL);
    CHECK_EQ(pto_run_end(w), 0);
    pto_worker_close(w);
}

static void test_results_through_shared_memory(void)
{
    int fds = count_fds();
    pto_worker *w = started_worker(2, 1);
    int pids[3];
    child_pids(w, pids, 2, 1);
    for (int i = 0; i < 3; i++) {
        int ppid = 0;
        CHECK(alive(pids[i]));
        CHECK(pids[i] != (int)getpid());
        /* children of the forkserver, which is a child of ours */
        CHECK(proc_state(pids[i], &ppid) && ppid != (int)getpid() && ppid > 0);
        int zppid = 0;
        CHECK(proc_state(ppid, &zppid) && zppid == (int)getpid());
    }
    CHECK(pids[0] != pids[1] && pids[1] != pids[2]);
    CHECK_EQ(count_my_children(), 1);   /* the forkserver only */

    uint64_t *buf = pto_shm_alloc(64 * 8);   /* created after init: children see it */
    uint64_t *pidbuf = pto_shm_alloc(3 * 8);
    CHECK(buf && pidbuf);
    pto_orch *o = pto_run_begin(w);
    pto_tensor t = u64_tensor(buf, 64);
    uint8_t tag = PTO_OUTPUT_EXISTING;
    uint64_t s0 = 1000;
    pto_task_args a = {1, 1, &t, &tag, &s0};
    pto_submit_next_level(o, C_FILL, &a, NULL, -1);
    submit1(o, PTO_NEXT_LEVEL, C_PID, &pidbuf[0], PTO_OUTPUT_EXISTING, 0, 0);
    submit1(o, PTO_NEXT_LEVEL, C_PID, &pidbuf[1], PTO_OUTPUT_EXISTING, 0, 1);
    submit1(o, PTO_SUB, C_PID, &pidbuf[2], PTO_OUTPUT_EXISTING, 0, 0);
    /* A heap-ring tensor (MAP_SHARED too). */
    pto_tensor r = {.dtype = PTO_U64, .ndims = 1};
    r.shape[0] = 4;
    uint8_t otag = PTO_OUTPUT;
    pto_task_args ra = {1, 1, &r, &otag, &s0};
    CHECK(pto_submit_next_level(o, C_FILL, &ra, NULL, -1) >= 0);
    CHECK_EQ(pto_run_end(w), 0);
    int bad = 0;
    for (int i = 0; i < 64; i++) bad += buf[i] != 1000u + (uint64_t)i;
    CHECK_EQ(bad, 0);
    for (int i = 0; i < 3; i++) CHECK_EQ(pidbuf[i], pids[i]);
    pto_worker_close(w);
    for (int i = 0; i < 3; i++) CHECK(wait_gone(pids[i], 1000));
    CHECK_EQ(count_my_children(), 0);
    CHECK_EQ(count_fds(), fds);
    pto_shm_free(buf);
    pto_shm_free(pidbuf);
}

/* Poll (asleep, so this thread takes no core from the child) until
 * *v == want, for up to ms; whether it came. */
static bool await_int(_Atomic int *v, int want, int ms)
{
    for (int i = 0; i < ms * 10; i++) {
        if (atomic_load(v) == want) return true;
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    return atomic_load(v) == want;
}

/* se.nr_migrations of pid from /proc/pid/sched (kernels with
 * CONFIG_SCHED_DEBUG), or -1. */
static long migrations(int pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/sched", pid);
    FILE *f = fopen(path, "r");
    long n = -1;
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "se.nr_migrations", 16) == 0) {
            char *colon = strchr(line, ':');
            if (colon) n = atol(colon + 1);
            break;
        }
    fclose(f);
    return n;
}

/* pto_wm_spread moves a child with pto_proc_nudge: a running child lands
 * on the CPU asked for and keeps its own CPU mask, so it is moved, never
 * pinned; a CPU outside its mask moves nothing. */
static void test_nudge_moves_and_keeps_mask(void)
{
    pto_worker *w = started_worker(1, 0);
    int pid = pto_worker_child_pid(w, PTO_NEXT_LEVEL, 0);
    pto_child *c = w->wm.threads[PTO_NEXT_LEVEL][0]->child;
    cpu_set_t was, now;
    CHECK(pid > 0 && c);
    CHECK_EQ(sched_getaffinity(pid, sizeof was, &was), 0);
    atomic_store(&SH->spin_stop, 0);
    atomic_store(&SH->spin_cpu, -1);
    pto_orch *o = pto_run_begin(w);
    submit1(o, PTO_NEXT_LEVEL, C_SPIN, NULL, 0, 0, 0);
    for (int i = 0; i < 20000 && atomic_load(&SH->spin_cpu) < 0; i++) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    int from = atomic_load(&SH->spin_cpu);
    CHECK(from >= 0);
    int to = -1;
    for (int cpu = 0; cpu < CPU_SETSIZE && to < 0; cpu++)
        if (CPU_ISSET(cpu, &was) && cpu != from) to = cpu;
    if (to >= 0) {   /* a machine of one CPU has nowhere to move it */
        /* The kernel's own count of the child's migrations must grow
         * during a nudge (a running task is moved before the call
         * returns), which a busy machine's balancer, moving it on its own,
         * does not do in the few microseconds of one call. Where the count
         * is not kept, the child must be seen on the CPU it was moved to:
         * weaker, as the balancer may move it there too. Retried: the
         * child may have moved to that CPU on its own just before. */
        bool moved = false;
        for (int k = 0; k < 20 && !moved; k++) {
            from = atomic_load(&SH->spin_cpu);
            to = -1;
            for (int cpu = 0; cpu < CPU_SETSIZE && to < 0; cpu++)
                if (CPU_ISSET(cpu, &was) && cpu != from) to = cpu;
            long before = migrations(pid);
            CHECK(pto_proc_nudge(c, to));
            long after = migrations(pid);
            moved = before >= 0 ? after > before : await_int(&SH->spin_cpu, to, 50);
        }
        CHECK(moved);
        CHECK_EQ(sched_getaffinity(pid, sizeof now, &now), 0);
        CHECK(CPU_EQUAL(&was, &now));
    }
    CHECK(!pto_proc_nudge(c, -1));
    CHECK(!pto_proc_nudge(c, CPU_SETSIZE));
    if (CPU_COUNT(&was) < CPU_SETSIZE) {
        int out = 0;
        while (CPU_ISSET(out, &was)) out++;
        CHECK(!pto_proc_nudge(c, out));
        CHECK_EQ(sched_getaffinity(pid, sizeof now, &now), 0);
        CHECK(CPU_EQUAL(&was, &now));
    }
    atomic_store(&SH->spin_stop, 1);
    CHECK_EQ(pto_run_end(w), 0);
    uint64_t *buf = pto_shm_alloc(8);   /* and it still serves */
    CHECK(buf != NULL);
    o = pto_run_begin(w);
    submit1(o, PTO_NEXT_LEVEL, C_PID, buf, PTO_OUTPUT_EXISTING, 0, 0);
    CHECK_EQ(pto_run_end(w), 0);
    CHECK_EQ(buf[0], (uint64_t)pid);
    pto_worker_close(w);
    pto_shm_free(buf);
}

/* A PTO_SPREAD that is neither 0 nor 1 fails the init, naming it; the
 * Worker initialises once it is fixed, and 0 keeps it working. */
static void test_bad_spread_env(void)
{
    pto_worker *w = make_worker(1, 0, 0, true);
    setenv("PTO_SPREAD", "off", 1);
    CHECK_EQ(pto_worker_init(w), -1);
    CHECK_CONTAINS(pto_errmsg(), "PTO_SPREAD must be 0 (children never moved) or 1");
    CHECK_CONTAINS(pto_errmsg(), "got 'off'");
    setenv("PTO_SPREAD", "0", 1);
    CHECK_EQ(pto_worker_init(w), 0);
    unsetenv("PTO_SPREAD");
    CHECK(!w->wm.spread);
    uint64_t *buf = pto_shm_alloc(8);
    CHECK(buf != NULL);
    pto_orch *o = pto_run_begin(w);
    submit1(o, PTO_NEXT_LEVEL, C_PID, buf, PTO_OUTPUT_EXISTING, 0, 0);
    CHECK_EQ(pto_run_end(w), 0);
    CHECK_EQ(buf[0], (uint64_t)pto_worker_child_pid(w, PTO_NEXT_LEVEL, 0));
    pto_worker_close(w);
    pto_shm_free(buf);
}

/* A long chain through one buffer plus independent fills: order and values. */
static void test_dag_many_tasks(void)
{
    pto_worker *w = started_worker(2, 1);
    uint64_t *acc = pto_shm_alloc(8), *sub_acc = pto_shm_alloc(8);
    enum { N = 64 };
    uint64_t *cells = pto_shm_alloc(N * 8), *copies = pto_shm_alloc(N * 8);
    uint64_t t0 = pto_now_ns();
    pto_orch *o = pto_run_begin(w);
    int tasks = 0;
    for (int i = 1; i <= 2000; i++, tasks++) submit1(o, PTO_NEXT_LEVEL, C_ADD, acc, PTO_INOUT, (uint64_t)i, -1);
    for (int i = 1; i <= 200; i++, tasks++) submit1(o, PTO_SUB, C_ADD, sub_acc, PTO_INOUT, 2, -1);
    for (int i = 0; i < N; i++, tasks += 2) {
        submit1(o, PTO_NEXT_LEVEL, C_FILL, &cells[i], PTO_OUTPUT_EXISTING, (uint64_t)i * 7, -1);
        submit2(o, C_COPY, &cells[i], &copies[i]);   /* waits for its fill */
    }
    CHECK_EQ(pto_run_end(w), 0);
    double us = (double)(pto_now_ns() - t0) / 1000.0;
    printf("  %d tasks (a 2000-task chain) in %.1f ms, %.2f us per task\n", tasks, us / 1000.0, us / tasks);
    CHECK_EQ(*acc, 2000ull * 2001 / 2);
    CHECK_EQ(*sub_acc, 400);
    int bad = 0;
    for (int i = 0; i < N; i++) bad += copies[i] != (uint64_t)i * 7;
    CHECK_EQ(bad, 0);
    pto_worker_close(w);
    pto_shm_free(acc);
    pto_shm_free(sub_acc);
    pto_shm_free(cells);
    pto_shm_free(copies);
}

/* One failure kind: task A on chip 1 dies (or fails); B consumes A's output
 * and is poisoned; C and D are independent and complete. */
static void crash_case(uint64_t callable, const char *cause, bool external_kill)
{
    int fds = count_fds();
    pto_worker *w = started_worker(2, 0);
    int before[2];
    child_pids(w, before, 2, 0);
    uint64_t *x = pto_shm_alloc(8), *y = pto_shm_alloc(8), *z = pto_shm_alloc(8), *q = pto_shm_alloc(8);
    atomic_store(&SH->event_ns, 0);
    atomic_store(&SH->hang_pid, 0);
    pto_orch *o = pto_run_begin(w);
    int64_t a = submit1(o, PTO_NEXT_LEVEL, callable, x, PTO_OUTPUT_EXISTING, 0, 0);
    int64_t b = submit2(o, C_COPY, x, y);
    submit1(o, PTO_NEXT_LEVEL, C_FILL, z, PTO_OUTPUT_EXISTING, 5, 1);
    uint64_t event = 0;
    if (external_kill) {
        uint64_t t0 = tu_now_ms();
        while (!atomic_load(&SH->hang_pid) && tu_now_ms() - t0 < 5000) tu_sleep_ms(1);
        CHECK_EQ(atomic_load(&SH->hang_pid), before[0]);
        CHECK_EQ(pto_worker_child_pid(w, PTO_NEXT_LEVEL, 0), before[0]);
        event = pto_now_ns();
        kill(before[0], SIGKILL);
    }
    uint64_t failed = wait_failed(o, a);
    if (!external_kill) event = atomic_load(&SH->event_ns);
    CHECK(failed && event);
    double ms = (double)(failed - event) / 1e6;
    printf("  %-40s task failed %.2f ms after the event\n", cause, ms);
    CHECK(failed - event < 100000000ull);
    submit1(o, PTO_NEXT_LEVEL, C_FILL, q, PTO_OUTPUT_EXISTING, 9, 0);   /* after the death, on the same worker */
    CHECK_EQ(pto_run_end(w), -1);
    const char *msg = pto_errmsg();
    char want[128];
    snprintf(want, sizeof want, "chip 1 (pid %d) %s while running the task", before[0], cause);
    CHECK_CONTAINS(msg, want);
    snprintf(want, sizeof want, "task %lld", (long long)a);
    CHECK_CONTAINS(msg, want);
    (void)b;   /* its poisoning: test_poisoned_consumer */
    CHECK_EQ(*z, 5);    /* independent tasks ran */
    CHECK_EQ(*q, 9);
    /* The same number of live children, one of them new. */
    int after[2];
    child_pids(w, after, 2, 0);
    CHECK(after[0] != before[0] && alive(after[0]));
    CHECK_EQ(after[1], before[1]);
    CHECK(alive(after[1]));
    CHECK(!alive(before[0]));
    /* The next run is normal and uses both children. */
    o = pto_run_begin(w);
    submit1(o, PTO_NEXT_LEVEL, C_PID, x, PTO_OUTPUT_EXISTING, 0, 0);
    submit1(o, PTO_NEXT_LEVEL, C_PID, y, PTO_OUTPUT_EXISTING, 0, 1);
    CHECK_EQ(pto_run_end(w), 0);
    CHECK_EQ(*x, after[0]);
    CHECK_EQ(*y, after[1]);
    pto_worker_close(w);
    CHECK(wait_gone(after[0], 1000) && wait_gone(after[1], 1000));
    CHECK_EQ(count_my_children(), 0);
    CHECK_EQ(count_fds(), fds);
    pto_shm_free(x);
    pto_shm_free(y);
    pto_shm_free(z);
    pto_shm_free(q);
}

static void test_poisoned_consumer(void)
{
    pto_worker *w = started_worker(2, 0);
    uint64_t *x = pto_shm_alloc(8), *y = pto_shm_alloc(8);
    *y = 77;
    pto_orch *o = pto_run_begin(w);
    int64_t a = submit1(o, PTO_NEXT_LEVEL, C_SEGV, x, PTO_OUTPUT_EXISTING, 0, -1);
    int64_t b = submit2(o, C_COPY, x, y);
    CHECK(wait_failed(o, a) != 0);
    CHECK(wait_failed(o, b) != 0);
    pto_task_info info;
    CHECK_EQ(pto_task_info_get(o, b, &info), 0);
    CHECK_CONTAINS(info.error, "was not run: its producer task");
    CHECK_EQ(pto_run_end(w), -1);
    CHECK_EQ(*y, 77);
    pto_worker_close(w);
    pto_shm_free(x);
    pto_shm_free(y);
}

static void test_segfault(void) { crash_case(C_SEGV, "was killed by signal 11 (Segmentation fault)", false); }
static void test_abort(void) { crash_case(C_ABORT, "was killed by signal 6 (Aborted)", false); }
static void test_exit3(void) { crash_case(C_EXIT3, "exited with status 3", false); }
static void test_external_kill(void) { crash_case(C_HANG, "was killed by signal 9 (Killed)", true); }

/* A leaf failure is an ordinary failure: the child lives on. */
static void test_leaf_error_keeps_child(void)
{
    pto_worker *w = started_worker(1, 0);
    int pid = pto_worker_child_pid(w, PTO_NEXT_LEVEL, 0);
    pto_orch *o = pto_run_begin(w);
    submit1(o, PTO_NEXT_LEVEL, C_FAIL, NULL, 0, 0, -1);
    CHECK_EQ(pto_run_end(w), -1);
    char want[96];
    snprintf(want, sizeof want, "chip 1 (pid %d): deliberate failure in pid %d", pid, pid);
    CHECK_CONTAINS(pto_errmsg(), want);
    CHECK_CONTAINS(pto_errmsg(), "on chip 1");
    CHECK_EQ(pto_worker_child_pid(w, PTO_NEXT_LEVEL, 0), pid);
    pto_worker_close(w);
}

/* A child that died while idle is replaced by the next task, which runs. */
static void test_idle_death(void)
{
    pto_worker *w = started_worker(1, 0);
    int pid = pto_worker_child_pid(w, PTO_NEXT_LEVEL, 0);
    kill(pid, SIGKILL);
    CHECK(wait_gone(pid, 1000));
    tu_sleep_ms(20);   /* the forkserver has reaped it */
    CHECK_EQ(pto_worker_child_pid(w, PTO_NEXT_LEVEL, 0), -1);
    uint64_t *x = pto_shm_alloc(8);
    pto_orch *o = pto_run_begin(w);
    submit1(o, PTO_NEXT_LEVEL, C_PID, x, PTO_OUTPUT_EXISTING, 0, -1);
    CHECK_EQ(pto_run_end(w), 0);
    int now = pto_worker_child_pid(w, PTO_NEXT_LEVEL, 0);
    CHECK(now != pid && alive(now));
    CHECK_EQ(*x, now);
    pto_worker_close(w);
    pto_shm_free(x);
}

/* Start hooks that fail, exit or hang make init fail in time, naming the
 * worker, its pid and why, and leave nothing running. */
static void start_failure_case(int mode, uint32_t timeout_ms, const char *want)
{
    int fds = count_fds();
    atomic_store(&SH->starts, 0);
    atomic_store(&SH->start_mode, mode);
    pto_worker *w = make_worker(3, 1, timeout_ms, true);
    uint64_t t0 = tu_now_ms();
    CHECK_EQ(pto_worker_init(w), -1);
    uint64_t took = tu_now_ms() - t0;
    atomic_store(&SH->start_mode, 0);
    const char *msg = pto_errmsg();
    printf("  init failed in %llu ms: %s\n", (unsigned long long)took, msg);
    CHECK_CONTAINS(msg, "chip 2 (pid ");
    CHECK_CONTAINS(msg, want);
    CHECK(took < timeout_ms + 2000);
    int n = atomic_load(&SH->starts);
    CHECK(n >= 2);
    for (int i = 0; i < n && i < 64; i++) CHECK(!alive(atomic_load(&SH->start_pids[i])));
    /* The pid in the message is the failing child's. */
    bool named = false;
    for (int i = 0; i < n && i < 64; i++) {
        char p[32];
        snprintf(p, sizeof p, "(pid %d)", atomic_load(&SH->start_pids[i]));
        named |= strstr(msg, p) != NULL;
    }
    CHECK(named);
    CHECK_EQ(count_my_children(), 0);
    pto_worker_close(w);
    CHECK_EQ(count_fds(), fds);
}

static void test_start_hook_fails(void) { start_failure_case(1, 10000, "failed to start: no device for worker 1"); }
static void test_start_hook_exits(void) { start_failure_case(2, 10000, "exited with status 3 while starting"); }
static void test_start_hook_hangs(void)
{
    start_failure_case(3, 300, "did not report ready within 300 ms; raise start_timeout_ms");
}

/* A callable shipped after init is installed once per child, and again in a
 * replacement; shipping it again installs the new blob. */
static void test_shipped_callable(void)
{
    atomic_store(&SH->loads, 0);
    pto_worker *w = started_worker(2, 0);
    char *v1 = "version 1", *v2 = "v2";
    CHECK_EQ(pto_worker_ship_callable(w, PTO_NEXT_LEVEL, C_SHIPPED, v1, strlen(v1) + 1), 0);
    uint64_t *x = pto_shm_alloc(8), *y = pto_shm_alloc(8);
    char *want = pto_shm_alloc(16);
    strcpy(want, v1);
    for (int run = 0; run < 3; run++) {
        pto_orch *o = pto_run_begin(w);
        for (int i = 0; i < 5; i++) {
            submit1(o, PTO_NEXT_LEVEL, C_SHIPPED, x, PTO_OUTPUT_EXISTING, (uint64_t)(uintptr_t)want, 0);
            submit1(o, PTO_NEXT_LEVEL, C_SHIPPED, y, PTO_OUTPUT_EXISTING, (uint64_t)(uintptr_t)want, 1);
        }
        CHECK_EQ(pto_run_end(w), 0);
    }
    CHECK_EQ(atomic_load(&SH->loads), 2);
    int pids[2];
    child_pids(w, pids, 2, 0);
    CHECK((atomic_load(&SH->load_pids[0]) == pids[0] && atomic_load(&SH->load_pids[1]) == pids[1]) ||
          (atomic_load(&SH->load_pids[0]) == pids[1] && atomic_load(&SH->load_pids[1]) == pids[0]));
    /* The replacement of a dead child installs it again. */
    pto_orch *o = pto_run_begin(w);
    submit1(o, PTO_NEXT_LEVEL, C_SEGV, NULL, 0, 0, 0);
    CHECK_EQ(pto_run_end(w), -1);
    o = pto_run_begin(w);
    submit1(o, PTO_NEXT_LEVEL, C_SHIPPED, x, PTO_OUTPUT_EXISTING, (uint64_t)(uintptr_t)want, 0);
    CHECK_EQ(pto_run_end(w), 0);
    CHECK_EQ(atomic_load(&SH->loads), 3);
    CHECK_EQ(*x, pto_worker_child_pid(w, PTO_NEXT_LEVEL, 0));
    CHECK_EQ(atomic_load(&SH->load_pids[2]), (int)*x);
    /* Shipped again: the newest blob wins, in every child. */
    CHECK_EQ(pto_worker_ship_callable(w, PTO_NEXT_LEVEL, C_SHIPPED, v2, strlen(v2) + 1), 0);
    strcpy(want, v2);
    o = pto_run_begin(w);
    submit1(o, PTO_NEXT_LEVEL, C_SHIPPED, x, PTO_OUTPUT_EXISTING, (uint64_t)(uintptr_t)want, 0);
    submit1(o, PTO_NEXT_LEVEL, C_SHIPPED, y, PTO_OUTPUT_EXISTING, (uint64_t)(uintptr_t)want, 1);
    CHECK_EQ(pto_run_end(w), 0);
    CHECK_EQ(atomic_load(&SH->loads), 5);
    /* A sub worker was not shipped this callable. */
    CHECK_EQ(pto_worker_ship_callable(w, 7, 1, "x", 1), -1);
    CHECK_CONTAINS(pto_errmsg(), "unknown worker kind");
    CHECK_EQ(pto_worker_ship_callable(w, PTO_SUB, 1, NULL, 0), -1);
    pto_worker_close(w);

    /* Shipped before init: treated the same. A leaf without a load hook fails the task. */
    atomic_store(&SH->loads, 0);
    w = make_worker(1, 1, 0, true);
    CHECK_EQ(pto_worker_ship_callable(w, PTO_SUB, C_SHIPPED, v1, strlen(v1) + 1), 0);
    CHECK_EQ(pto_worker_init(w), 0);
    strcpy(want, v1);
    o = pto_run_begin(w);
    submit1(o, PTO_SUB, C_SHIPPED, x, PTO_OUTPUT_EXISTING, (uint64_t)(uintptr_t)want, 0);
    CHECK_EQ(pto_run_end(w), 0);
    CHECK_EQ(atomic_load(&SH->loads), 1);
    pto_worker_close(w);
    w = make_worker(1, 0, 0, false);
    CHECK_EQ(pto_worker_init(w), 0);
    CHECK_EQ(pto_worker_ship_callable(w, PTO_NEXT_LEVEL, C_SHIPPED, v1, strlen(v1) + 1), 0);
    o = pto_run_begin(w);
    submit1(o, PTO_NEXT_LEVEL, C_SHIPPED, x, PTO_OUTPUT_EXISTING, (uint64_t)(uintptr_t)want, 0);
    CHECK_EQ(pto_run_end(w), -1);
    CHECK_CONTAINS(pto_errmsg(), "no load hook");
    pto_worker_close(w);
    pto_shm_free(x);
    pto_shm_free(y);
    pto_shm_free(want);
}

static void test_blob_too_big(void)
{
    pto_worker *w = started_worker(1, 0);
    enum { N = 6600 };   /* 8 + 40 * N > 256 KiB */
    pto_tensor *t = calloc(N, sizeof *t);
    uint8_t *tags = calloc(N, 1);
    static uint64_t cell;
    for (int i = 0; i < N; i++) {
        t[i] = u64_tensor(&cell, 1);
        tags[i] = PTO_NO_DEP;
    }
    pto_orch *o = pto_run_begin(w);
    pto_task_args a = {N, 0, t, tags, NULL};
    CHECK(pto_submit_next_level(o, C_ADD, &a, NULL, -1) >= 0);
    CHECK_EQ(pto_run_end(w), -1);
    CHECK_CONTAINS(pto_errmsg(), "a PROCESS-mode mailbox holds at most 262144 bytes");
    free(t);
    free(tags);
    /* The child is fine. */
    o = pto_run_begin(w);
    submit1(o, PTO_NEXT_LEVEL, C_FAIL, NULL, 0, 0, -1);
    CHECK_EQ(pto_run_end(w), -1);
    CHECK_CONTAINS(pto_errmsg(), "deliberate failure");
    pto_worker_close(w);
}

static void *shutdown_later(void *arg)
{
    tu_sleep_ms(100);
    pto_worker_shutdown(arg);
    return NULL;
}

/* A child stuck in a task does not hang shutdown, close, or a twice
 * interrupted run. */
static void test_stuck_child(void)
{
    pto_worker *w = started_worker(2, 0);
    atomic_store(&SH->hang_pid, 0);
    pto_orch *o = pto_run_begin(w);
    submit1(o, PTO_NEXT_LEVEL, C_HANG, NULL, 0, 0, 0);
    while (!atomic_load(&SH->hang_pid)) tu_sleep_ms(1);
    uint64_t t0 = tu_now_ms();
    pto_worker_interrupt(w);   /* the first: running tasks may finish */
    tu_sleep_ms(50);
    CHECK(alive(atomic_load(&SH->hang_pid)));
    pto_worker_interrupt(w);   /* the second: they are stopped */
    CHECK_EQ(pto_run_end(w), -1);
    CHECK_CONTAINS(pto_errmsg(), "interrupted");
    CHECK(tu_now_ms() - t0 < 2000);
    CHECK(!alive(atomic_load(&SH->hang_pid)));
    uint64_t *x = pto_shm_alloc(8);
    o = pto_run_begin(w);
    submit1(o, PTO_NEXT_LEVEL, C_PID, x, PTO_OUTPUT_EXISTING, 0, 0);
    CHECK_EQ(pto_run_end(w), 0);
    CHECK(alive((int)*x));

    atomic_store(&SH->hang_pid, 0);
    o = pto_run_begin(w);
    submit1(o, PTO_NEXT_LEVEL, C_HANG, NULL, 0, 0, 1);
    pthread_t th;
    pthread_create(&th, NULL, shutdown_later, w);
    t0 = tu_now_ms();
    CHECK_EQ(pto_run_end(w), -1);
    CHECK_CONTAINS(pto_errmsg(), "shut down");
    pthread_join(th, NULL);
    int hung = atomic_load(&SH->hang_pid);
    pto_worker_close(w);
    CHECK(tu_now_ms() - t0 < 3000);
    CHECK(!alive(hung));
    CHECK_EQ(count_my_children(), 0);
    pto_shm_free(x);
}

/* A stuck task fails at its deadline (the Worker's, or the submit's own), its
 * child is killed and replaced, its consumer is poisoned, the next run works. */
static void test_task_deadline(void)
{
    pto_worker_config cfg = {.level = 3, .mode = PTO_MODE_PROCESS, .heap_ring_size = 1 << 20, .task_timeout_ms = 200};
    pto_worker *w = pto_worker_new(&cfg);
    CHECK(w != NULL);
    if (!w) return;
    for (int i = 0; i < 2; i++) {
        pto_leaf l = {.run = leaf_run, .ctx = (void *)(intptr_t)i, .name = NL_NAMES[i], .start = leaf_start};
        pto_worker_add_next_level(w, &l);
    }
    CHECK_EQ(pto_worker_init(w), 0);
    int before[2];
    child_pids(w, before, 2, 0);
    uint64_t *x = pto_shm_alloc(8), *y = pto_shm_alloc(8), *z = pto_shm_alloc(8);
    *y = 77;
    atomic_store(&SH->hang_pid, 0);
    pto_orch *o = pto_run_begin(w);
    int64_t a = submit1(o, PTO_NEXT_LEVEL, C_HANG, x, PTO_OUTPUT_EXISTING, 0, 0);
    int64_t b = submit2(o, C_COPY, x, y);
    uint64_t t0 = tu_now_ms();
    while (!atomic_load(&SH->hang_pid) && tu_now_ms() - t0 < 5000) tu_sleep_ms(1);
    pto_child_info ci;
    CHECK_EQ(pto_worker_child_info_get(w, PTO_NEXT_LEVEL, 0, &ci), 0);
    CHECK_EQ(ci.current_task, a);
    CHECK(ci.running_ns > 0);
    CHECK_EQ(pto_worker_current_task(w, PTO_NEXT_LEVEL, 0), a);   /* the same, without the pid's /proc read */
    CHECK(wait_failed(o, a) != 0);
    CHECK(wait_failed(o, b) != 0);
    CHECK_EQ(pto_run_end(w), -1);
    CHECK(tu_now_ms() - t0 < 5000);
    char want[128];
    snprintf(want, sizeof want, "task %lld", (long long)a);
    CHECK_CONTAINS(pto_errmsg(), want);
    snprintf(want, sizeof want, "chip 1 (pid %d) timed out after 200 ms", before[0]);
    CHECK_CONTAINS(pto_errmsg(), want);
    CHECK_EQ(*y, 77);
    CHECK(wait_gone(before[0], 5000));

    /* The submit's own deadline: 0 lifts it, a value replaces it; it applies to the next submit only. */
    atomic_store(&SH->hang_pid, 0);
    o = pto_run_begin(w);
    CHECK_EQ(pto_submit_timeout(o, -1), -1);
    CHECK_EQ(pto_submit_timeout(o, 0), 0);
    submit1(o, PTO_NEXT_LEVEL, C_FILL, z, PTO_OUTPUT_EXISTING, 4, 0);
    CHECK_EQ(pto_submit_timeout(o, 100), 0);
    a = submit1(o, PTO_NEXT_LEVEL, C_HANG, NULL, 0, 0, 1);
    CHECK_EQ(pto_run_end(w), -1);
    snprintf(want, sizeof want, "chip 2 (pid %d) timed out after 100 ms", before[1]);
    CHECK_CONTAINS(pto_errmsg(), want);
    CHECK_EQ(*z, 4);

    /* Both children replaced, the next run uses them. */
    int after[2];
    child_pids(w, after, 2, 0);
    o = pto_run_begin(w);
    submit1(o, PTO_NEXT_LEVEL, C_PID, x, PTO_OUTPUT_EXISTING, 0, 0);
    submit1(o, PTO_NEXT_LEVEL, C_PID, y, PTO_OUTPUT_EXISTING, 0, 1);
    CHECK_EQ(pto_run_end(w), 0);
    CHECK(*x == (uint64_t)after[0] && after[0] != before[0]);
    CHECK(*y == (uint64_t)after[1] && after[1] != before[1]);
    pto_worker_close(w);
    CHECK_EQ(count_my_children(), 0);
    pto_shm_free(x);
    pto_shm_free(y);
    pto_shm_free(z);

    /* THREAD mode refuses deadlines: a thread cannot be stopped. */
    cfg.mode = PTO_MODE_THREAD;
    CHECK(pto_worker_new(&cfg) == NULL);
    CHECK_CONTAINS(pto_errmsg(), "task_timeout_ms needs process mode");
    pto_worker *tw = tu_worker(1, 0, tu_gate_leaf, NULL, 1 << 20, 1000);
    o = pto_run_begin(tw);
    CHECK_EQ(pto_submit_timeout(o, 100), -1);
    CHECK_CONTAINS(pto_errmsg(), "needs process mode");
    CHECK_EQ(pto_submit_timeout(o, 0), 0);
    CHECK_EQ(pto_run_end(tw), 0);
    pto_worker_close(tw);
}

static void test_1000_runs(void)
{
    int fds = count_fds();
    pto_worker *w = started_worker(2, 1);
    uint64_t *acc = pto_shm_alloc(8), *sacc = pto_shm_alloc(8);
    uint64_t t0 = pto_now_ns();
    int bad = 0;
    for (int r = 0; r < 1000; r++) {
        pto_orch *o = pto_run_begin(w);
        submit1(o, PTO_NEXT_LEVEL, C_ADD, acc, PTO_INOUT, 1, -1);
        submit1(o, PTO_NEXT_LEVEL, C_ADD, acc, PTO_INOUT, 2, -1);
        submit1(o, PTO_SUB, C_ADD, sacc, PTO_INOUT, 1, -1);
        bad += pto_run_end(w) != 0;
    }
    double us = (double)(pto_now_ns() - t0) / 1000.0;
    printf("  1000 runs of 3 tasks: %.1f us per run\n", us / 1000.0);
    CHECK_EQ(bad, 0);
    CHECK_EQ(*acc, 3000);
    CHECK_EQ(*sacc, 1000);
    int pids[3];
    child_pids(w, pids, 2, 1);
    pto_worker_close(w);
    for (int i = 0; i < 3; i++) CHECK(wait_gone(pids[i], 1000));
    CHECK_EQ(count_my_children(), 0);
    CHECK_EQ(count_fds(), fds);
    pto_shm_free(acc);
    pto_shm_free(sacc);
}

/* Several Workers at once, closed in any order. */
static void test_workers_side_by_side(void)
{
    int fds = count_fds();
    pto_worker *a = started_worker(1, 1), *b = started_worker(2, 0);
    CHECK_EQ(count_my_children(), 2);
    uint64_t *x = pto_shm_alloc(8), *y = pto_shm_alloc(8);
    pto_orch *o = pto_run_begin(a);
    submit1(o, PTO_SUB, C_PID, x, PTO_OUTPUT_EXISTING, 0, 0);
    CHECK_EQ(pto_run_end(a), 0);
    o = pto_run_begin(b);
    submit1(o, PTO_NEXT_LEVEL, C_PID, y, PTO_OUTPUT_EXISTING, 0, 1);
    CHECK_EQ(pto_run_end(b), 0);
    CHECK_EQ(*x, pto_worker_child_pid(a, PTO_SUB, 0));
    CHECK_EQ(*y, pto_worker_child_pid(b, PTO_NEXT_LEVEL, 1));
    pto_worker_close(a);
    o = pto_run_begin(b);
    submit1(o, PTO_NEXT_LEVEL, C_PID, y, PTO_OUTPUT_EXISTING, 0, 0);
    CHECK_EQ(pto_run_end(b), 0);
    pto_worker_close(b);
    CHECK_EQ(count_my_children(), 0);
    CHECK_EQ(count_fds(), fds);
    /* A Worker never initialised, and one with no children. */
    pto_worker_close(make_worker(2, 0, 0, true));
    pto_worker *none = make_worker(0, 0, 0, true);
    CHECK_EQ(pto_worker_init(none), 0);
    pto_worker_close(none);
    CHECK_EQ(count_my_children(), 0);
    pto_shm_free(x);
    pto_shm_free(y);
}

/* The forkserver killed: its children die with it; running and later tasks
 * fail saying so (no hang), and close still cleans up. */
static void test_forkserver_killed(void)
{
    int fds = count_fds();
    pto_worker *w = started_worker(2, 0);
    int pids[2], zygote = 0;
    child_pids(w, pids, 2, 0);
    proc_state(pids[0], &zygote);
    atomic_store(&SH->hang_pid, 0);
    pto_orch *o = pto_run_begin(w);
    int64_t a = submit1(o, PTO_NEXT_LEVEL, C_HANG, NULL, 0, 0, 0);
    while (!atomic_load(&SH->hang_pid)) tu_sleep_ms(1);
    uint64_t t0 = pto_now_ns();
    kill(zygote, SIGKILL);
    uint64_t failed = wait_failed(o, a);
    CHECK(failed != 0);
    printf("  task failed %.1f ms after the forkserver was killed\n", (double)(failed - t0) / 1e6);
    CHECK(failed - t0 < 200000000ull);
    CHECK_EQ(pto_run_end(w), -1);
    char want[96];
    snprintf(want, sizeof want, "forkserver process (pid %d) is gone", zygote);
    CHECK_CONTAINS(pto_errmsg(), want);
    CHECK(wait_gone(pids[0], 1000) && wait_gone(pids[1], 1000));
    o = pto_run_begin(w);
    submit1(o, PTO_NEXT_LEVEL, C_FAIL, NULL, 0, 0, 1);
    CHECK_EQ(pto_run_end(w), -1);
    CHECK_CONTAINS(pto_errmsg(), want);
    CHECK_EQ(pto_worker_child_pid(w, PTO_NEXT_LEVEL, 0), -1);
    pto_worker_close(w);
    CHECK_EQ(count_my_children(), 0);
    CHECK_EQ(count_fds(), fds);
}

/* ---- the parent killed with SIGKILL ----
 * This binary re-executed with "--doomed-parent FD" builds a Worker, writes
 * the pids of its forkserver and children to FD and waits to be killed. */
static _Noreturn void doomed_parent(int fd)
{
    SH = pto_shm_alloc(sizeof *SH);
    pto_worker *w = started_worker(2, 1);
    uint64_t *x = pto_shm_alloc(8);
    pto_orch *o = pto_run_begin(w);
    submit1(o, PTO_NEXT_LEVEL, C_PID, x, PTO_OUTPUT_EXISTING, 0, -1);
    submit1(o, PTO_NEXT_LEVEL, C_HANG, NULL, 0, 0, 1);   /* one child busy when the parent dies */
    while (!atomic_load(&SH->hang_pid)) tu_sleep_ms(1);
    int pids[3];
    child_pids(w, pids, 2, 1);
    int zygote = 0;
    proc_state(pids[0], &zygote);
    dprintf(fd, "%d %d %d %d\n", zygote, pids[0], pids[1], pids[2]);
    close(fd);
    for (;;) pause();
}

static void test_parent_killed(void)
{
    int p[2];
    CHECK_EQ(pipe(p), 0);
    fflush(NULL);
    pid_t parent = fork();
    if (parent == 0) {
        close(p[0]);
        char fd[16];
        snprintf(fd, sizeof fd, "%d", p[1]);
        execl("/proc/self/exe", "test_process", "--doomed-parent", fd, (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    char line[128] = "";
    FILE *f = fdopen(p[0], "r");
    CHECK(fgets(line, sizeof line, f) != NULL);
    fclose(f);
    int pids[4] = {0};
    CHECK_EQ(sscanf(line, "%d %d %d %d", &pids[0], &pids[1], &pids[2], &pids[3]), 4);
    for (int i = 0; i < 4; i++) CHECK(alive(pids[i]));
    kill(parent, SIGKILL);
    uint64_t t0 = pto_now_ns();
    waitpid(parent, NULL, 0);
    for (int i = 0; i < 4; i++) CHECK(wait_gone(pids[i], 1000));
    printf("  forkserver and 3 children gone %.1f ms after the parent's SIGKILL\n", (double)(pto_now_ns() - t0) / 1e6);
}

int main(int argc, char **argv)
{
    /* Children that crash on purpose should not write core files. */
    struct rlimit nocore = {0, 0};
    setrlimit(RLIMIT_CORE, &nocore);
    if (pto_shm_init(0) != 0) { fprintf(stderr, "%s\n", pto_errmsg()); return 2; }
    if (argc == 3 && strcmp(argv[1], "--doomed-parent") == 0) doomed_parent(atoi(argv[2]));
    SH = pto_shm_alloc(sizeof *SH);
    RUN(test_thread_mode_has_no_children);
    RUN(test_close_in_forked_copy);
    RUN(test_results_through_shared_memory);
    RUN(test_dag_many_tasks);
    RUN(test_nudge_moves_and_keeps_mask);
    RUN(test_bad_spread_env);
    RUN(test_leaf_error_keeps_child);
    RUN(test_poisoned_consumer);
    RUN(test_segfault);
    RUN(test_abort);
    RUN(test_exit3);
    RUN(test_external_kill);
    RUN(test_idle_death);
    RUN(test_start_hook_fails);
    RUN(test_start_hook_exits);
    RUN(test_start_hook_hangs);
    RUN(test_shipped_callable);
    RUN(test_blob_too_big);
    RUN(test_stuck_child);
    RUN(test_task_deadline);
    RUN(test_workers_side_by_side);
    RUN(test_forkserver_killed);
    RUN(test_1000_runs);
    RUN(test_parent_killed);
    return tu_finish();
}
