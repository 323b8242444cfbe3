/* lpto_mpi.c - L3 Workers on other MPI ranks (docs/mpi.md).
 *
 * Every rank runs the script, as MPI programs do, so every rank builds the
 * same Lua state: the same Workers, the same registered functions, the same
 * tables keyed by Worker. They part at the init of the level-4 Worker whose
 * children name ranks (pto.Worker{level = 3, rank = r}):
 *
 *   rank 0 goes on with the script. Its L4 runs in THREAD mode (a forked
 *   child must not call MPI): each remote child is a leaf on a worker thread
 *   of the L4 that sends a task to its rank and waits for the answer.
 *   rank r (> 0) never returns from init: it initialises its own child
 *   there (forking that Worker's children before MPI_Init), says hello to
 *   rank 0, and serves tasks until rank 0 closes the L4; then it closes the
 *   child, finalises MPI and exits 0. A rank no child names serves nothing
 *   and waits for the close.
 *
 * The protocol, all point-to-point with rank 0, MPI_BYTE:
 *   HELLO r->0   {status, pid, child, host, error}       once, at init
 *   SYNC  both   timestamps, SYNC_ROUNDS round trips     once, after HELLO
 *   REQ   0->r   {op, trace generation and origin, callable, counts,
 *                 CallConfig, tensors, tags, scalars}
 *   DATA  0->r   the bytes of each INPUT/INOUT/NO_DEP tensor (views: their byte range only)
 *   REP   r->0   {status, error, statistics records, the run's trace events}
 *   DATA  r->0   the bytes of each OUTPUT/INOUT/OUTPUT_EXISTING tensor
 *   REQ   0->r   {op = LOAD, callable, ns = blob length} + blob: a function
 *                 registered on the L4 after init, before the first task
 *                 that may name it (no answer: a load that fails leaves
 *                 the callable unknown there, and its task says so)
 * A STOP request is answered by an empty REP before the rank exits. One
 * task per remote child is in flight at a time, so nothing is numbered.
 *
 * Only one thread of a rank calls MPI at a time: rank r's main thread, and
 * on rank 0 the leaf threads under one lock (MPI_THREAD_SERIALIZED); waits
 * poll with MPI_Iprobe and back off to short sleeps, so an idle rank leaves
 * the cores to the chips. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lpto_priv.h"

/* Where the launcher says this process is (before or without MPI_Init):
 * Open MPI, PMIx, MPICH/Hydra, then Slurm's srun. */
static int env_int(const char *const names[], int dflt)
{
    for (int i = 0; names[i]; i++) {
        const char *v = getenv(names[i]);
        if (v && *v) return atoi(v);
    }
    return dflt;
}

static const char *const RANK_VARS[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID", NULL};
static const char *const SIZE_VARS[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", NULL};

static int launch_rank(void) { return env_int(RANK_VARS, 0); }
static int launch_size(void) { return env_int(SIZE_VARS, 1); }
static bool launched(void) { return env_int(SIZE_VARS, 0) > 0; }

#ifdef PTO_HAVE_MPI
#include <mpi.h>
#include <pthread.h>

enum { TAG_HELLO = 7101, TAG_REQ, TAG_REP, TAG_DATA, TAG_SYNC };
#define SYNC_ROUNDS 8            /* clock-offset probes per rank at init: the fastest round trip counts */
enum { OP_RUN = 1, OP_STOP = 2, OP_LOAD = 3 };   /* OP_LOAD: a function registered after init */
#define CHUNK (1 << 30)          /* bytes per MPI message: counts are ints */
#define START_MS 30000          /* every rank says hello within this at init */
#define STOP_MS 10000
#define HOST_LEN 64
#define ERR_LEN 4096

#define BOOT_LEN 40

typedef struct hello {
    int32_t status, pid, child, reserved;
    char host[HOST_LEN];
    char boot[BOOT_LEN];        /* the kernel's boot id: equal ids share one CLOCK_MONOTONIC */
    char err[ERR_LEN];
} hello;

/* This kernel's boot id (empty if unknown). */
static void boot_id(char *out)
{
    memset(out, 0, BOOT_LEN);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (!f) return;
    if (!fgets(out, BOOT_LEN, f)) out[0] = 0;
    fclose(f);
    out[strcspn(out, "\n")] = 0;
}

typedef struct req_head {
    int32_t op, nt, ns;
    uint32_t trace_gen;          /* rank 0 traces (generation, 0: not) */
    uint64_t trace_epoch;        /* its traces' time origin, on the serving rank's clock */
    uint64_t callable;
    pto_call_config cfg;
} req_head;

typedef struct rep_head {
    int32_t status, errlen;
    uint64_t statlen, tracelen;
} rep_head;

/* Rank 0: one per remote Worker child. */
typedef struct remote {
    wchild *C;
    int rank;
    char name[24];
    int pid;
    char host[HOST_LEN];
    int64_t offset_ns;           /* its CLOCK_MONOTONIC minus ours, estimated at init */
    _Atomic uint32_t trace_gen;  /* main thread: the trace its tasks record for, 0: none */
    _Atomic uint64_t trace_epoch;
    pthread_mutex_t tmu;         /* guards the collected trace text */
    char *trace;                 /* events sent back with its answers, for the main thread's collect */
    size_t trace_len;
    uint32_t tgen;
    struct shipment *ships;      /* under tmu: functions to send before the next task, oldest first */
} remote;

/* A function registered on the L4 after init, on its way to one rank. */
typedef struct shipment {
    struct shipment *next;
    size_t len;                  /* of the request: header and blob */
    char req[];
} shipment;

static struct {
    pthread_mutex_t mu;          /* rank 0: held by the thread calling MPI */
    bool inited, finalized, used;
    bool unheard;                /* rank 0: a rank never said hello: MPI_Finalize would wait for it */
    pid_t pid;                   /* the process that initialised MPI (forked children never finalise) */
    int rank, size;
    bool *live;                  /* rank 0: ranks that said hello and were not stopped */
} G = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void sleep_ns(long ns)
{
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
}

/* Wait until a message from src with tag (MPI_ANY_TAG) can be received;
 * locked: take G.mu around each probe and return holding it. false when
 * deadline (now_ns; 0: none) passes. */
static bool wait_msg(int src, int tag, MPI_Status *st, uint64_t deadline, bool locked)
{
    uint64_t t0 = lpto_now_ns();
    long nap = 0;
    for (;;) {
        int flag = 0;
        if (locked) pthread_mutex_lock(&G.mu);
        MPI_Iprobe(src, tag, MPI_COMM_WORLD, &flag, st);
        if (flag) return true;
        if (locked) pthread_mutex_unlock(&G.mu);
        uint64_t now = lpto_now_ns();
        if (deadline && now >= deadline) return false;
        /* Spin through a short task's turnaround, then nap, longer once idle. */
        if (now - t0 < 50000) continue;
        long cap = now - t0 < 20000000 ? 100000 : 2000000;
        nap = nap ? (nap * 2 > cap ? cap : nap * 2) : 5000;
        sleep_ns(nap);
    }
}

static void send_bytes(const void *p, uint64_t n, int dst)
{
    const char *c = p;
    do {
        int k = n > CHUNK ? CHUNK : (int)n;
        MPI_Send(c, k, MPI_BYTE, dst, TAG_DATA, MPI_COMM_WORLD);
        c += k;
        n -= (uint64_t)k;
    } while (n > 0);
}

static void recv_bytes(void *p, uint64_t n, int src)
{
    char *c = p;
    do {
        int k = n > CHUNK ? CHUNK : (int)n;
        MPI_Recv(c, k, MPI_BYTE, src, TAG_DATA, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        c += k;
        n -= (uint64_t)k;
    } while (n > 0);
}

/* Bytes travel to the rank with the task (out) and back when it completes (back). */
static bool goes_out(int tag) { return tag == PTO_INPUT || tag == PTO_INOUT || tag == PTO_NO_DEP; }
static bool comes_back(int tag) { return tag == PTO_OUTPUT || tag == PTO_INOUT || tag == PTO_OUTPUT_EXISTING; }
/* The index of a task's result box among its tensors, or -1 (recognised as
 * the child recognises it, lpto_result_unwrap). It does not go out (the
 * serving rank clears its header) and comes back as one message of the
 * bytes in use, which MPI may make shorter than the box. */
static int result_box(int nt, int ns, const pto_tensor *t, const uint64_t *sc)
{
    pto_args_view v = {nt, ns, t, sc}, rest;
    return lpto_result_unwrap(&v, &rest) ? nt - 1 : -1;
}

static void finalize_at_exit(void);

/* MPI_Init once, in the process that will finalise it; false with err. */
static bool mpi_up(int level, char *err, size_t errlen)
{
    if (G.inited) return true;
    int provided = 0, rc = MPI_Init_thread(NULL, NULL, level, &provided);
    if (rc != MPI_SUCCESS) {
        snprintf(err, errlen, "MPI_Init_thread failed (error %d)", rc);
        return false;
    }
    if (provided < level) {
        snprintf(err, errlen, "the MPI library gives thread level %d, less than the %d needed", provided, level);
        return false;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &G.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &G.size);
    G.inited = true;
    G.pid = getpid();
    G.live = calloc((size_t)G.size, sizeof *G.live);
    atexit(finalize_at_exit);
    return true;
}

/* Rank 0: tell rank r to stop and wait for its answer; false if it did not come. */
static bool stop_rank(int r)
{
    req_head h = {.op = OP_STOP};
    pthread_mutex_lock(&G.mu);
    MPI_Send(&h, (int)sizeof h, MPI_BYTE, r, TAG_REQ, MPI_COMM_WORLD);
    pthread_mutex_unlock(&G.mu);
    MPI_Status st;
    if (!wait_msg(r, TAG_REP, &st, lpto_now_ns() + (uint64_t)STOP_MS * 1000000u, true)) return false;
    rep_head rep;
    MPI_Recv(&rep, (int)sizeof rep, MPI_BYTE, r, TAG_REP, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    pthread_mutex_unlock(&G.mu);
    G.live[r] = false;
    return true;
}

/* Stop every rank still serving; false if one did not answer. */
static bool stop_all(void)
{
    bool ok = true;
    for (int r = 1; G.live && r < G.size; r++)
        if (G.live[r] && !stop_rank(r)) {
            fprintf(stderr, "ptolua: MPI rank %d did not stop within %d s\n", r, STOP_MS / 1000);
            ok = false;
        }
    return ok;
}

/* A script that ends without closing its L4 still stops the ranks, so the
 * job ends; a rank that does not answer ends it the hard way. */
static void finalize_at_exit(void)
{
    if (!G.inited || G.finalized || getpid() != G.pid) return;
    G.finalized = true;
    if (G.rank == 0 && (!stop_all() || G.unheard)) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Finalize();
}

/* ---- rank r: host this rank's child ------------------------------------------------ */

/* The distinct storages of a task's tensors, each rebased into one block of this rank's shared memory. */
typedef struct store {
    uint64_t base, lo, hi;
    char *mem;
} store;

/* Blocks kept from task to task: a fresh block would cost page faults and
 * zeroing on every task, more than the transfer itself for large tensors. */
#define CACHED 8
static struct cached {
    char *mem;
    uint64_t cap;
    bool busy;
} cache[CACHED];

static char *block_get(uint64_t n)
{
    int spare = -1;
    for (int i = 0; i < CACHED; i++) {
        if (cache[i].busy) continue;
        if (cache[i].mem && cache[i].cap >= n) {
            cache[i].busy = true;
            return cache[i].mem;
        }
        if (spare < 0 || cache[i].cap < cache[spare].cap) spare = i;
    }
    char *m = pto_shm_alloc(n);
    if (!m || spare < 0) return m;   /* every slot busy: used once */
    pto_shm_free(cache[spare].mem);
    cache[spare] = (struct cached){m, n, true};
    return m;
}

static void block_put(char *m)
{
    for (int i = 0; i < CACHED; i++)
        if (cache[i].mem == m) {
            cache[i].busy = false;
            return;
        }
    pto_shm_free(m);
}

/* Receive a RUN request's tensors into new shared memory and run it; reply. */
/* The hosted Worker records this run's events when rank 0 traces. */
static uint32_t traced_gen;

static void trace_begin(pto_worker *w, const req_head *h)
{
    if (h->trace_gen != traced_gen) {   /* a new trace, or none: what was recorded is stale */
        if (pto_trace_active(w)) pto_trace_stop(w, NULL);
        traced_gen = h->trace_gen;
    }
    if (h->trace_gen && !pto_trace_active(w)) {
        pto_trace_set_epoch(h->trace_epoch);   /* rank 0's origin, on this rank's clock */
        pto_trace_start(w, 0);                 /* if it cannot, this run goes untraced */
    }
}

/* The run's events as text (malloc'd, length in *len), or NULL; tracing goes on. */
static char *trace_end(pto_worker *w, const hello *hi, int child, int level, size_t *len)
{
    *len = 0;
    if (!traced_gen || !pto_trace_active(w) || pto_trace_stop(w, NULL) != 0) return NULL;
    char name[192];
    snprintf(name, sizeof name, "L%d worker %d (rank %d on host %s, pid %d): level-%d Worker", level, child + 1,
             G.rank, hi->host, hi->pid, level);
    /* A process of the trace file of its own: pids of other hosts could clash with ours. */
    int32_t tpid = 1500000000 + G.rank;
    int64_t n = pto_trace_format(w, tpid, name, NULL, 0);
    char *text = n > 0 ? malloc((size_t)n + 1) : NULL;
    if (text) {
        pto_trace_format(w, tpid, name, text, (size_t)n + 1);
        *len = (size_t)n;
    }
    pto_trace_start(w, 0);
    return text;
}

static void serve_run(lworker *W, int child, char *buf, int len, const hello *hi)
{
    req_head h;
    memcpy(&h, buf, sizeof h);
    size_t need = sizeof h + (size_t)h.nt * (sizeof(pto_tensor) + 1) + (size_t)h.ns * 8;
    char err[ERR_LEN];
    err[0] = 0;
    int status = 0;
    if (h.nt < 0 || h.ns < 0 || (size_t)len < need) {
        snprintf(err, sizeof err, "a malformed request reached rank %d", G.rank);
        status = 1;
        h.nt = h.ns = 0;
    }
    pto_tensor *t = calloc((size_t)h.nt + 1, sizeof *t);
    uint8_t *tags = calloc((size_t)h.nt + 1, 1);
    uint64_t *sc = calloc((size_t)h.ns + 1, 8);
    store *st = calloc((size_t)h.nt + 1, sizeof *st);
    char **at = calloc((size_t)h.nt + 1, sizeof *at);
    int nst = 0;
    if (!t || !tags || !sc || !st || !at) {
        fprintf(stderr, "ptolua: MPI rank %d: out of memory\n", G.rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    const char *p = buf + sizeof h;
    memcpy(t, p, (size_t)h.nt * sizeof *t);
    p += (size_t)h.nt * sizeof *t;
    memcpy(tags, p, (size_t)h.nt);
    p += h.nt;
    memcpy(sc, p, (size_t)h.ns * 8);
    int box = result_box(h.nt, h.ns, t, sc);
    /* Views of one storage stay views of one block here, so the L3 infers
     * the same overlaps; only the bytes the views cover travel. */
    for (int i = 0; i < h.nt; i++) {
        uint64_t lo = t[i].offset, hi = lo + pto_tensor_nbytes(&t[i]);
        int k = 0;
        while (k < nst && st[k].base != t[i].base) k++;
        if (k == nst) st[nst++] = (store){.base = t[i].base, .lo = lo, .hi = hi};
        if (lo < st[k].lo) st[k].lo = lo;
        if (hi > st[k].hi) st[k].hi = hi;
    }
    for (int k = 0; k < nst; k++) {
        st[k].mem = block_get(st[k].hi - st[k].lo + 64);
        if (!st[k].mem && !status) {
            snprintf(err, sizeof err, "cannot allocate %llu bytes of shared memory on rank %d for a tensor: %s "
                                      "(raise PTO_SHM_SIZE there)",
                     (unsigned long long)(st[k].hi - st[k].lo), G.rank, pto_errmsg());
            status = 1;
        }
    }
    static char sink[1 << 16];   /* bytes of a tensor that has nowhere to go still have to be received */
    for (int i = 0; i < h.nt; i++) {
        int k = 0;
        while (st[k].base != t[i].base) k++;
        uint64_t n = pto_tensor_nbytes(&t[i]);
        at[i] = st[k].mem ? st[k].mem + (t[i].offset - st[k].lo) : NULL;
        if (i == box) {
            if (at[i]) lpto_result_box_clear(at[i]);
        } else if (goes_out(tags[i])) {
            if (at[i]) recv_bytes(at[i], n, 0);
            else for (uint64_t got = 0; got < n; got += sizeof sink)
                recv_bytes(sink, n - got < sizeof sink ? n - got : sizeof sink, 0);
        }
        t[i].base = (uint64_t)(uintptr_t)st[k].mem - st[k].lo;
    }
    pto_worker *hw = W->kids[child]->w;
    trace_begin(hw, &h);
    if (!status) {
        pto_args_view v = {h.nt, h.ns, t, sc};
        status = lpto_level_host_run(W, child, h.callable, &v, &h.cfg, err, sizeof err);
    }
    size_t tracelen;
    char *trace = trace_end(hw, hi, child, W->kids[child]->level, &tracelen);
    size_t statlen = lpto_level_host_stats(W, child, NULL, 0);
    rep_head rep = {.status = status, .errlen = status ? (int32_t)strlen(err) : 0, .statlen = statlen,
                    .tracelen = tracelen};
    size_t replen = sizeof rep + (size_t)rep.errlen + statlen + tracelen;
    char *out = malloc(replen);
    if (!out) {
        fprintf(stderr, "ptolua: MPI rank %d: out of memory\n", G.rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memcpy(out, &rep, sizeof rep);
    memcpy(out + sizeof rep, err, (size_t)rep.errlen);
    lpto_level_host_stats(W, child, out + sizeof rep + rep.errlen, statlen);
    if (tracelen) memcpy(out + sizeof rep + rep.errlen + statlen, trace, tracelen);
    free(trace);
    MPI_Send(out, (int)replen, MPI_BYTE, 0, TAG_REP, MPI_COMM_WORLD);
    free(out);
    for (int i = 0; i < h.nt; i++) {
        if (i == box) {
            static const char none[64];   /* no block for it: "no results" */
            send_bytes(at[i] ? at[i] : none, lpto_result_box_used(at[i]), 0);
            continue;
        }
        if (!comes_back(tags[i])) continue;
        uint64_t n = pto_tensor_nbytes(&t[i]);
        /* A failed task still sends what it was to send: rank 0 waits for it. */
        if (at[i]) send_bytes(at[i], n, 0);
        else for (uint64_t sent = 0; sent < n; sent += sizeof sink)
            send_bytes(sink, n - sent < sizeof sink ? n - sent : sizeof sink, 0);
    }
    for (int k = 0; k < nst; k++)
        if (st[k].mem) block_put(st[k].mem);
    free(t);
    free(tags);
    free(sc);
    free(st);
    free(at);
}

void lpto_mpi_serve(lua_State *L, int idx, lworker *W)
{
    int me = launch_rank(), child = -1;
    for (int i = 0; i < W->nworkers; i++)
        if (W->kids[i]->rank == me) child = i;
    hello hi = {.pid = (int32_t)getpid(), .child = child};
    gethostname(hi.host, sizeof hi.host - 1);
    boot_id(hi.boot);
    /* Its children are forked before MPI_Init: they never inherit an initialised MPI. */
    if (child >= 0 && lpto_level_host_init(L, idx, W, child, hi.err, sizeof hi.err) != 0) hi.status = 1;
    char err[256];
    if (!mpi_up(MPI_THREAD_FUNNELED, err, sizeof err)) {
        fprintf(stderr, "ptolua: MPI rank %d: %s\n", me, err);
        exit(1);
    }
    MPI_Send(&hi, (int)sizeof hi, MPI_BYTE, 0, TAG_HELLO, MPI_COMM_WORLD);
    for (int k = 0; k < SYNC_ROUNDS; k++) {   /* rank 0 estimates our clock's offset */
        uint64_t t;
        MPI_Recv(&t, (int)sizeof t, MPI_BYTE, 0, TAG_SYNC, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        t = lpto_now_ns();
        MPI_Send(&t, (int)sizeof t, MPI_BYTE, 0, TAG_SYNC, MPI_COMM_WORLD);
    }
    for (;;) {
        MPI_Status st;
        wait_msg(0, TAG_REQ, &st, 0, false);
        int len = 0;
        MPI_Get_count(&st, MPI_BYTE, &len);
        char *buf = malloc((size_t)len + sizeof(req_head));
        if (!buf) MPI_Abort(MPI_COMM_WORLD, 1);
        memset(buf, 0, sizeof(req_head));
        MPI_Recv(buf, len, MPI_BYTE, 0, TAG_REQ, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        req_head h;
        memcpy(&h, buf, sizeof h);
        if (h.op == OP_STOP) {
            free(buf);
            if (child >= 0 && !hi.status) lpto_level_host_close(L, W, child);
            rep_head rep = {.status = 0};
            MPI_Send(&rep, (int)sizeof rep, MPI_BYTE, 0, TAG_REP, MPI_COMM_WORLD);
            fflush(NULL);
            G.finalized = true;
            MPI_Finalize();
            /* The rest of the script is rank 0's; this rank's job is done.
             * exit, not _exit: a leak check at exit (ASan) covers this rank too. */
            exit(0);
        }
        if (h.op == OP_LOAD && child >= 0 && !hi.status) {
            char lerr[256];
            if (h.ns < 0 || (size_t)len < sizeof h + (size_t)h.ns ||
                lpto_level_host_load(W, child, h.callable, buf + sizeof h, (size_t)h.ns, lerr, sizeof lerr) != 0)
                fprintf(stderr, "ptolua: MPI rank %d: a function registered after init does not load here: %s\n",
                        me, h.ns < 0 || (size_t)len < sizeof h + (size_t)h.ns ? "malformed" : lerr);
            free(buf);
            continue;
        }
        if (child < 0 || hi.status) {
            /* Rank 0 sends tasks only to children that started: a protocol error. */
            fprintf(stderr, "ptolua: MPI rank %d got a task but hosts no Worker\n", me);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        serve_run(W, child, buf, len, &hi);
        free(buf);
    }
}

int lpto_mpi_ship(const pto_leaf *leaf, uint64_t callable, const char *blob, size_t len)
{
    remote *R = leaf->ctx;
    shipment *m = malloc(sizeof *m + sizeof(req_head) + len);
    if (!m || len > INT32_MAX - sizeof(req_head)) return free(m), -1;
    req_head h = {.op = OP_LOAD, .ns = (int32_t)len, .callable = callable};
    memcpy(m->req, &h, sizeof h);
    memcpy(m->req + sizeof h, blob, len);
    m->len = sizeof h + len;
    m->next = NULL;
    pthread_mutex_lock(&R->tmu);
    shipment **tail = &R->ships;
    while (*tail) tail = &(*tail)->next;
    *tail = m;
    pthread_mutex_unlock(&R->tmu);
    return 0;
}

/* Leaf thread, holding G.mu: send what was registered since the last task. */
static void send_ships(remote *R)
{
    pthread_mutex_lock(&R->tmu);
    shipment *m = R->ships;
    R->ships = NULL;
    pthread_mutex_unlock(&R->tmu);
    while (m) {
        shipment *next = m->next;
        MPI_Send(m->req, (int)m->len, MPI_BYTE, R->rank, TAG_REQ, MPI_COMM_WORLD);
        free(m);
        m = next;
    }
}

/* ---- rank 0: the leaf of a remote child --------------------------------------------- */

static int remote_run(void *ctx, uint64_t callable, const pto_args_view *a, const pto_call_config *cfg, char *err,
                      size_t errlen)
{
    remote *R = ctx;
    const uint8_t *tags = pto_leaf_tags();
    int box = result_box(a->tensor_count, a->scalar_count, a->tensors, a->scalars);
    if (a->tensor_count && !tags) {
        snprintf(err, errlen, "%s (rank %d): the task's tensor tags are not known here", R->name, R->rank);
        return 1;
    }
    size_t len = sizeof(req_head) + (size_t)a->tensor_count * (sizeof(pto_tensor) + 1) + (size_t)a->scalar_count * 8;
    char *buf = malloc(len);
    if (!buf) {
        snprintf(err, errlen, "%s (rank %d): out of memory", R->name, R->rank);
        return 1;
    }
    req_head h = {.op = OP_RUN, .nt = a->tensor_count, .ns = a->scalar_count, .callable = callable, .cfg = *cfg,
                  .trace_gen = atomic_load_explicit(&R->trace_gen, memory_order_acquire)};
    if (h.trace_gen) h.trace_epoch = atomic_load(&R->trace_epoch) + (uint64_t)R->offset_ns;
    char *p = buf;
    memcpy(p, &h, sizeof h);
    p += sizeof h;
    memcpy(p, a->tensors, (size_t)a->tensor_count * sizeof(pto_tensor));
    p += (size_t)a->tensor_count * sizeof(pto_tensor);
    if (a->tensor_count) memcpy(p, tags, (size_t)a->tensor_count);
    p += a->tensor_count;
    if (a->scalar_count) memcpy(p, a->scalars, (size_t)a->scalar_count * 8);
    pthread_mutex_lock(&G.mu);
    send_ships(R);
    MPI_Send(buf, (int)len, MPI_BYTE, R->rank, TAG_REQ, MPI_COMM_WORLD);
    for (int i = 0; i < a->tensor_count; i++)
        if (goes_out(tags[i]) && i != box)
            send_bytes((const char *)(uintptr_t)(a->tensors[i].base + a->tensors[i].offset),
                       pto_tensor_nbytes(&a->tensors[i]), R->rank);
    pthread_mutex_unlock(&G.mu);
    free(buf);
    MPI_Status st;
    wait_msg(R->rank, TAG_REP, &st, 0, true);
    int rlen = 0;
    MPI_Get_count(&st, MPI_BYTE, &rlen);
    char *rep = malloc((size_t)rlen + sizeof(rep_head));
    if (!rep) {
        pthread_mutex_unlock(&G.mu);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(rep, 0, sizeof(rep_head));
    MPI_Recv(rep, rlen, MPI_BYTE, R->rank, TAG_REP, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    for (int i = 0; i < a->tensor_count; i++) {
        char *at = (char *)(uintptr_t)(a->tensors[i].base + a->tensors[i].offset);
        if (i == box)
            MPI_Recv(at, LPTO_RESULT_BYTES, MPI_BYTE, R->rank, TAG_DATA, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        else if (comes_back(tags[i]))
            recv_bytes(at, pto_tensor_nbytes(&a->tensors[i]), R->rank);
    }
    pthread_mutex_unlock(&G.mu);
    rep_head rh;
    memcpy(&rh, rep, sizeof rh);
    if ((size_t)rlen < sizeof rh) rlen = (int)sizeof rh;   /* a short answer: its parts are left out below */
    size_t errlen_in = rh.errlen > 0 && (size_t)rh.errlen <= (size_t)rlen - sizeof rh ? (size_t)rh.errlen : 0;
    if (rh.statlen && sizeof rh + errlen_in + rh.statlen <= (size_t)rlen)
        lpto_level_remote_stats(R->C, rep + sizeof rh + errlen_in, (size_t)rh.statlen);
    if (rh.tracelen && sizeof rh + errlen_in + rh.statlen + rh.tracelen <= (size_t)rlen) {
        pthread_mutex_lock(&R->tmu);
        char *t = realloc(R->trace, R->trace_len + rh.tracelen + 1);
        if (t) {   /* no room: this task's events are lost, not the task */
            if (R->trace_len) t[R->trace_len++] = ',';
            memcpy(t + R->trace_len, rep + sizeof rh + errlen_in + rh.statlen, rh.tracelen);
            R->trace_len += rh.tracelen;
            R->trace = t;
        }
        pthread_mutex_unlock(&R->tmu);
    }
    if (rh.status) snprintf(err, errlen, "%s (rank %d on host %s, pid %d): %.*s", R->name, R->rank, R->host, R->pid,
                            (int)errlen_in, rep + sizeof rh);
    free(rep);
    return rh.status ? 1 : 0;
}

pto_leaf lpto_mpi_leaf(wchild *C, const char *name, int rank)
{
    remote *R = calloc(1, sizeof *R);
    if (!R) return (pto_leaf){0};
    R->C = C;
    R->rank = rank;
    pthread_mutex_init(&R->tmu, NULL);
    snprintf(R->name, sizeof R->name, "%s", name);
    snprintf(R->host, sizeof R->host, "?");
    return (pto_leaf){.run = remote_run, .ctx = R, .name = R->name};
}

void lpto_mpi_leaf_free(pto_leaf *leaf)
{
    remote *R = leaf->ctx;
    if (!R) return;
    pthread_mutex_destroy(&R->tmu);
    free(R->trace);
    while (R->ships) {
        shipment *m = R->ships;
        R->ships = m->next;
        free(m);
    }
    free(R);
}

void lpto_mpi_trace(const pto_leaf *leaf, bool on)
{
    remote *R = leaf->ctx;
    if (on) {
        if (++R->tgen == 0) R->tgen = 1;
        atomic_store(&R->trace_epoch, pto_trace_epoch());
    }
    atomic_store_explicit(&R->trace_gen, on ? R->tgen : 0, memory_order_release);
}

void lpto_mpi_trace_collect(const pto_leaf *leaf, pto_worker *w)
{
    remote *R = leaf->ctx;
    pthread_mutex_lock(&R->tmu);
    if (R->trace_len) pto_trace_attach(w, R->trace, R->trace_len);
    free(R->trace);
    R->trace = NULL;
    R->trace_len = 0;
    pthread_mutex_unlock(&R->tmu);
    atomic_store_explicit(&R->trace_gen, 0, memory_order_release);
}

void lpto_mpi_where(const pto_leaf *leaf, char *buf, size_t cap)
{
    const remote *R = leaf->ctx;
    snprintf(buf, cap, "rank %d on host %s, pid %d", R->rank, R->host, R->pid);
}

void lpto_mpi_start(lua_State *L, lworker *W, pto_leaf *leaves, const char *who)
{
    if (G.used)
        lpto_error(L, who, "the remote ranks served an earlier level-%d Worker and have ended; a job has one Worker "
                           "tree with remote Workers (start another mpirun for another)", W->level);
    if (W->parent)
        lpto_error(L, who, "a Worker whose children live on other MPI ranks must be the top of its tree (this one is "
                           "a child of a level-%d Worker)", W->parent->level);
    if (launch_rank() != 0) lpto_error(L, who, "internal: remote Workers started on MPI rank %d", launch_rank());
    char err[256];
    if (!mpi_up(MPI_THREAD_SERIALIZED, err, sizeof err)) lpto_error(L, who, "%s", err);
    G.used = true;
    /* Every rank runs the script to this init: hear from each within one deadline. */
    uint64_t deadline = lpto_now_ns() + (uint64_t)START_MS * 1000000u;
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    int failed = 0;
    hello *hs = calloc((size_t)G.size, sizeof *hs);
    int64_t *offs = calloc((size_t)G.size, sizeof *offs);
    char my_boot[BOOT_LEN];
    boot_id(my_boot);
    if (!hs || !offs) {
        free(hs);
        lpto_error(L, who, "out of memory");
    }
    for (int r = 1; r < G.size; r++) {
        MPI_Status st;
        if (!wait_msg(r, TAG_HELLO, &st, deadline, false)) {
            G.unheard = true;
            free(hs);
            free(offs);
            lpto_error(L, who, "MPI rank %d did not reach this Worker's init within %d s (every rank runs the script "
                               "up to w:init(); see what rank %d printed)", r, START_MS / 1000, r);
        }
        MPI_Recv(&hs[r], (int)sizeof hs[r], MPI_BYTE, r, TAG_HELLO, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        hs[r].host[HOST_LEN - 1] = hs[r].err[ERR_LEN - 1] = 0;
        G.live[r] = true;
        /* Its clock against ours, from the fastest of a few round trips (traces share one time line). */
        uint64_t best = UINT64_MAX;
        for (int k = 0; k < SYNC_ROUNDS; k++) {
            uint64_t t0 = lpto_now_ns(), tr;
            MPI_Send(&t0, (int)sizeof t0, MPI_BYTE, r, TAG_SYNC, MPI_COMM_WORLD);
            MPI_Recv(&tr, (int)sizeof tr, MPI_BYTE, r, TAG_SYNC, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            uint64_t t1 = lpto_now_ns();
            if (t1 - t0 < best) {
                best = t1 - t0;
                offs[r] = (int64_t)(tr - t0 - (t1 - t0) / 2);
            }
        }
        /* The estimate is good to half the fastest round trip, which on an
         * oversubscribed host can be milliseconds. A rank on this same
         * kernel reads the same clock: no offset, unless one bigger than
         * the estimate's error says otherwise (a time namespace). */
        hs[r].boot[BOOT_LEN - 1] = 0;
        if (my_boot[0] && strcmp(my_boot, hs[r].boot) == 0 && (uint64_t)llabs(offs[r]) <= best / 2 + 1000) offs[r] = 0;
    }
    for (int i = 0; i < W->nworkers; i++) {
        int r = W->kids[i]->rank;
        if (r <= 0) continue;
        remote *R = leaves[i].ctx;
        R->pid = hs[r].pid;
        R->offset_ns = offs[r];
        snprintf(R->host, sizeof R->host, "%s", hs[r].host);
        char line[ERR_LEN + 256];
        if (hs[r].child != i)
            snprintf(line, sizeof line, "%s (rank %d on host %s, pid %d): that rank hosts Worker child %d, not %d: "
                                        "every rank must run the same script", R->name, r, R->host, R->pid,
                     hs[r].child + 1, i + 1);
        else if (hs[r].status)
            snprintf(line, sizeof line, "%s (rank %d on host %s, pid %d): %s", R->name, r, R->host, R->pid, hs[r].err);
        else continue;
        if (failed++) luaL_addstring(&b, "; ");
        luaL_addstring(&b, line);
    }
    free(hs);
    free(offs);
    if (failed) {
        luaL_pushresult(&b);
        lpto_error(L, who, "%s", lua_tostring(L, -1));
    }
    lua_pushliteral(L, "");
    luaL_pushresult(&b);
    lua_pop(L, 2);
}

void lpto_mpi_stop(void)
{
    if (!G.inited || G.finalized || getpid() != G.pid || G.rank != 0) return;
    stop_all();
}

int lpto_mpi_rank(void) { return G.inited ? G.rank : launch_rank(); }

static int l_available(lua_State *L) { return lua_pushboolean(L, 1), 1; }
static int l_rank(lua_State *L) { return lua_pushinteger(L, G.inited ? G.rank : launch_rank()), 1; }
static int l_size(lua_State *L) { return lua_pushinteger(L, G.inited ? G.size : launch_size()), 1; }

#else /* no MPI in this build */

int lpto_mpi_rank(void) { return launch_rank(); }
_Noreturn void lpto_mpi_serve(lua_State *L, int idx, lworker *W)
{
    (void)idx;
    (void)W;
    luaL_error(L, "internal: no MPI in this build");
    abort();
}
pto_leaf lpto_mpi_leaf(wchild *C, const char *name, int rank)
{
    (void)C, (void)name, (void)rank;
    return (pto_leaf){0};
}
void lpto_mpi_where(const pto_leaf *leaf, char *buf, size_t cap)
{
    (void)leaf;
    snprintf(buf, cap, "?");
}
void lpto_mpi_leaf_free(pto_leaf *leaf) { (void)leaf; }
int lpto_mpi_ship(const pto_leaf *leaf, uint64_t callable, const char *blob, size_t len)
{
    (void)leaf, (void)callable, (void)blob, (void)len;
    return 0;
}
void lpto_mpi_start(lua_State *L, lworker *W, pto_leaf *leaves, const char *who)
{
    (void)W, (void)leaves;
    lpto_error(L, who, "this ptolua was built without MPI");
}
void lpto_mpi_stop(void) {}
void lpto_mpi_trace(const pto_leaf *leaf, bool on) { (void)leaf, (void)on; }
void lpto_mpi_trace_collect(const pto_leaf *leaf, pto_worker *w) { (void)leaf, (void)w; }

static int l_available(lua_State *L) { return lua_pushboolean(L, 0), 1; }
static int l_rank(lua_State *L) { return lua_pushinteger(L, launch_rank()), 1; }
static int l_size(lua_State *L) { return lua_pushinteger(L, launch_size()), 1; }

#endif

void lpto_mpi_check_rank(lua_State *L, int level, lua_Integer rank, const char *who)
{
#ifndef PTO_HAVE_MPI
    lpto_error(L, who, "rank = %lld places the Worker on an MPI rank, but this ptolua was built without MPI (build "
                       "it with cmake -DPTO_MPI=on and Open MPI installed: apt-get install libopenmpi-dev openmpi-bin)",
               (long long)rank);
#endif
    if (level != 3)
        lpto_error(L, who, "rank = %lld: only a level-3 Worker lives on another MPI rank (this one is level %d); add "
                           "it to a level-4 Worker on rank 0", (long long)rank, level);
    int size = launch_size();
    if (!launched())
        lpto_error(L, who, "rank = %lld places the Worker on MPI rank %lld, but this script was not started by an MPI "
                           "launcher; start it with mpirun -np N ptolua script.lua (N > %lld), or drop rank to keep "
                           "the Worker on this host", (long long)rank, (long long)rank, (long long)rank);
    if (rank >= size)
        lpto_error(L, who, "rank = %lld is out of range: this job has %d ranks (0 to %d, and rank 0 runs the level-4 "
                           "Worker); start more with mpirun -np %lld", (long long)rank, size, size - 1,
                   (long long)rank + 1);
}

void lpto_open_mpi(lua_State *L)
{
    static const luaL_Reg fns[] = {{"available", l_available}, {"rank", l_rank}, {"size", l_size}, {NULL, NULL}};
    luaL_newlib(L, fns);
    lua_setfield(L, -2, "mpi");
}
