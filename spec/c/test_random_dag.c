/*
 * test_random_dag.c - randomised dependency test of the THREAD-mode engine.
 *
 * For each seed a random program of 30-80 tasks is submitted: random tags
 * (INPUT, INOUT, OUTPUT, OUTPUT_EXISTING, NO_DEP) over views of a few
 * malloc'ed bases, of auto-allocated OUTPUTs (base 0) and of pto_alloc
 * tensors, inside random nested scopes, as next-level or sub tasks (some
 * pinned). About one task in seven is a group of two members on distinct
 * workers that split the task's tensors between them (members pinned
 * sometimes); scalar 0 of a member is its index, so the leaf knows which
 * member it runs. A group's dependencies are the union of its members'
 * lookups, all made before any of its writes enter the TensorMap, so the
 * reference model treats it as one task naming all the members' tensors.
 * The leaf stamps every task's (every member's) start and end from one
 * global atomic clock. After pto_run_end the test checks, against a
 * byte-exact reference model of the TensorMap rules, that every task (every
 * member) started after every required producer ended, that every task ran
 * exactly once (each member once, on distinct leaves) on a leaf of the right
 * kind with the arguments it was submitted with, and that the run reclaimed
 * everything.
 *
 * The heap rings are small (16 KiB), so inner scopes' memory is reused within
 * a seed and submit sometimes waits for it; the generator models the FIFO
 * rings so that a program never needs more than a ring can give back. Heap
 * checks: every auto OUTPUT / pto_alloc tensor lies in a ring and overlaps no
 * other live heap tensor, and memory is handed out again only after every
 * task that named the old tensor has ended.
 *
 * In one seed of four, each task fails with a chance of 8% (in a group, one
 * member fails; the other may then be skipped). A task then
 * must not run if a producer it was given an edge to (pto_task_edges right
 * after its submit) failed or did not run; it must run if no task it
 * depends on, through those edges or the model's, fails (a failed
 * producer already reclaimed at submit leaves no edge, so the model alone
 * cannot say more); and the run must report the failure and count every
 * failed and unrun task.
 *
 * Deterministic checks: disjoint views of one base do not depend on each
 * other; WAR and WAW (OUTPUT / OUTPUT_EXISTING) create no edge; different
 * bases never interact; a task that names the same bytes twice does not wait
 * for itself; a dependency on a finished producer of an ended scope does not
 * pin that producer's heap slab while the dependent's submit waits for space.
 *
 * Environment:
 *   PTO_RANDOM_SEEDS=n      seeds to run (default 2000)
 *   PTO_RANDOM_SEED_BASE=s  first seed (default 1)
 *   PTO_RANDOM_SEED=s       run only seed s and print its program
 *   PTO_RANDOM_MAX_FAILS=n  stop after n failing seeds (default 3)
 *   PTO_HANG_S=n            seconds without progress before the watchdog
 *                           reports a hang and exits (default 120)
 */
#include "testutil.h"

#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* Leaf side: shared with worker threads, atomics only.                */

enum { MODE_RANDOM = 0, MODE_DET = 1 };
enum { WHO_NL0 = 0, WHO_NL1 = 1, WHO_SUB0 = 2, WHO_SUB1 = 3, WHO_COUNT = 4 };

#define MAX_TASKS 128
#define MAX_MEMBERS 2      /* a group has one member per worker of its kind */

typedef struct task_rec {
    _Atomic uint64_t start;
    _Atomic uint64_t end;
    _Atomic uint64_t hash;
    _Atomic int runs;
    _Atomic int who;
    _Atomic int timeout;     /* deterministic mode: the wait timed out */
} task_rec;

static task_rec g_rec[MAX_TASKS];                   /* a single task, or member 0 of a group */
static task_rec g_mrec[MAX_MEMBERS - 1][MAX_TASKS]; /* members 1.. of a group */
static _Atomic int g_members[MAX_TASKS];            /* > 1: task i is a group of that many members */
static _Atomic uint64_t g_clock;
static _Atomic int g_mode;
static _Atomic uint64_t g_seed;        /* spin pattern of the current seed */
static _Atomic int g_bad_callable;
static _Atomic int g_fail[MAX_TASKS];  /* random mode: the task returns an error */
static _Atomic int g_fail_member[MAX_TASKS];   /* ... from this member of a group */

/* Deterministic mode: task c waits until flag g_wait[c] is set, and sets flag
 * g_set[c] when it starts. -1 = none. */
#define MAX_FLAGS 8
static _Atomic int g_wait[MAX_TASKS];
static _Atomic int g_set[MAX_TASKS];
static _Atomic int g_flag[MAX_FLAGS];
static int g_det_wait_ms = 5000;

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) { h ^= b[i]; h *= 0x100000001B3ull; }
    return h;
}

static uint64_t view_hash(int32_t tc, int32_t sc, const pto_tensor *t, const uint64_t *s)
{
    uint64_t h = 0xCBF29CE484222325ull;
    h = fnv(h, &tc, sizeof tc);
    h = fnv(h, &sc, sizeof sc);
    if (tc > 0) h = fnv(h, t, sizeof(pto_tensor) * (size_t)tc);
    if (sc > 0) h = fnv(h, s, sizeof(uint64_t) * (size_t)sc);
    return h;
}

static void sleep_us(long us)
{
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void shake(uint64_t callable)
{
    uint64_t s = atomic_load(&g_seed) * 1000003u + callable;
    uint64_t r = splitmix(&s);
    switch (r & 7) {
    case 0: case 1: {            /* a short busy spin */
        volatile unsigned x = 0;
        unsigned n = (unsigned)((r >> 8) % 3000u);
        for (unsigned i = 0; i < n; i++) x += i;
        break;
    }
    case 2:
        sched_yield();
        break;
    case 3:
        if (((r >> 8) & 7) == 0) sleep_us((long)((r >> 16) % 200u));
        break;
    default:
        break;
    }
}

static int leaf(void *ctx, uint64_t callable, const pto_args_view *v, const pto_call_config *cfg,
                char *err, size_t errlen)
{
    (void)cfg;
    int who = (int)(intptr_t)ctx;
    if (callable >= MAX_TASKS) { atomic_fetch_add(&g_bad_callable, 1); return 0; }
    int member = 0;
    if (atomic_load(&g_members[callable]) > 1) {
        if (v->scalar_count < 1 || v->scalars[0] >= (uint64_t)atomic_load(&g_members[callable])) {
            atomic_fetch_add(&g_bad_callable, 1);
            return 0;
        }
        member = (int)v->scalars[0];
    }
    task_rec *r = member ? &g_mrec[member - 1][callable] : &g_rec[callable];
    atomic_store(&r->start, atomic_fetch_add(&g_clock, 1) + 1);
    atomic_store(&r->who, who);
    atomic_store(&r->hash, view_hash(v->tensor_count, v->scalar_count, v->tensors, v->scalars));
    if (atomic_load(&g_mode) == MODE_RANDOM) {
        shake(callable);
    } else {
        int set = atomic_load(&g_set[callable]);
        if (set >= 0) atomic_store(&g_flag[set], 1);
        int wait = atomic_load(&g_wait[callable]);
        if (wait >= 0) {
            uint64_t deadline = now_ms() + (uint64_t)g_det_wait_ms;
            while (!atomic_load(&g_flag[wait])) {
                if (now_ms() > deadline) { atomic_store(&r->timeout, 1); break; }
                sleep_us(100);
            }
        }
    }
    atomic_store(&r->end, atomic_fetch_add(&g_clock, 1) + 1);
    atomic_fetch_add(&r->runs, 1);
    if (atomic_load(&g_fail[callable]) && member == atomic_load(&g_fail_member[callable])) {
        snprintf(err, errlen, "planned failure of task %d", (int)callable);
        return 1;
    }
    return 0;
}

static void rec_reset(task_rec *r)
{
    atomic_store(&r->start, 0);
    atomic_store(&r->end, 0);
    atomic_store(&r->hash, 0);
    atomic_store(&r->runs, 0);
    atomic_store(&r->who, -1);
    atomic_store(&r->timeout, 0);
}

static void reset_recs(void)
{
    for (int i = 0; i < MAX_TASKS; i++) {
        rec_reset(&g_rec[i]);
        for (int m = 1; m < MAX_MEMBERS; m++) rec_reset(&g_mrec[m - 1][i]);
        atomic_store(&g_members[i], 1);
        atomic_store(&g_fail_member[i], 0);
        atomic_store(&g_wait[i], -1);
        atomic_store(&g_set[i], -1);
        atomic_store(&g_fail[i], 0);
    }
    for (int i = 0; i < MAX_FLAGS; i++) atomic_store(&g_flag[i], 0);
}

/* Member m's record of task i. */
static task_rec *mrec(int i, int m) { return m ? &g_mrec[m - 1][i] : &g_rec[i]; }

/* Whether any member of task i ran. */
static int task_ran(int i)
{
    for (int m = 0; m < atomic_load(&g_members[i]); m++)
        if (atomic_load(&mrec(i, m)->runs)) return 1;
    return 0;
}

/* When the last member of task i that ran ended (a group ends with it). */
static uint64_t task_end(int i)
{
    uint64_t e = 0;
    for (int m = 0; m < atomic_load(&g_members[i]); m++) {
        uint64_t x = atomic_load(&mrec(i, m)->end);
        if (x > e) e = x;
    }
    return e;
}

/* ------------------------------------------------------------------ */
/* Watchdog: a hang (deadlock in submit, alloc or drain) reports what was
 * running instead of blocking until the CTest timeout.                 */

static _Atomic uint64_t g_progress;
static _Atomic int g_watch_stop;
static char g_watch_what[128];       /* written only between progress bumps */
static pthread_mutex_t g_watch_mu = PTHREAD_MUTEX_INITIALIZER;
static void (*g_hang_dump)(void);
static int g_hang_s = 120;

static void progress(const char *what)
{
    pthread_mutex_lock(&g_watch_mu);
    if (what) snprintf(g_watch_what, sizeof g_watch_what, "%s", what);
    pthread_mutex_unlock(&g_watch_mu);
    atomic_fetch_add(&g_progress, 1);
}

static void *watchdog(void *arg)
{
    (void)arg;
    uint64_t last = atomic_load(&g_progress), since = now_ms();
    while (!atomic_load(&g_watch_stop)) {
        sleep_us(100000);
        uint64_t p = atomic_load(&g_progress);
        if (p != last) { last = p; since = now_ms(); continue; }
        if (now_ms() - since > (uint64_t)g_hang_s * 1000u) {
            pthread_mutex_lock(&g_watch_mu);
            fprintf(stderr, "test_random_dag: HANG (no progress for %d s) in %s\n", g_hang_s,
                    g_watch_what);
            pthread_mutex_unlock(&g_watch_mu);
            if (g_hang_dump) g_hang_dump();
            fflush(stderr);
            _exit(3);
        }
    }
    return NULL;
}

/* ------------------------------------------------------------------ */
/* The shared worker: 2 next-level leaves and 2 sub leaves, each with its own
 * ctx so the leaf knows where it runs.                                 */

static pto_worker *g_w;
/* Small rings, so that heap memory of ended scopes is reused within a seed
 * (and submit sometimes waits for it). */
#ifndef RING_BYTES
#define RING_BYTES (16u << 10)
#endif
static uint64_t g_ring_lo[PTO_MAX_RING_DEPTH], g_ring_hi[PTO_MAX_RING_DEPTH];

static pto_worker *make_worker(void)
{
    pto_worker_config cfg = {.level = 3, .mode = PTO_MODE_THREAD, .heap_ring_size = RING_BYTES,
                             .alloc_timeout_ms = 3000};
    pto_worker *w = pto_worker_new(&cfg);
    if (!w) { fprintf(stderr, "pto_worker_new: %s\n", pto_errmsg()); exit(2); }
    for (int i = 0; i < 2; i++) {
        pto_leaf l = {.run = leaf, .ctx = (void *)(intptr_t)i, .name = "nl"};
        if (pto_worker_add_next_level(w, &l) != i) {
            fprintf(stderr, "pto_worker_add_next_level: %s\n", pto_errmsg()); exit(2);
        }
    }
    for (int i = 0; i < 2; i++) {
        pto_leaf s = {.run = leaf, .ctx = (void *)(intptr_t)(WHO_SUB0 + i), .name = "sub"};
        if (pto_worker_add_sub(w, &s) != i) { fprintf(stderr, "pto_worker_add_sub: %s\n", pto_errmsg()); exit(2); }
    }
    if (pto_worker_init(w) != 0) { fprintf(stderr, "pto_worker_init: %s\n", pto_errmsg()); exit(2); }
    pto_stats st;
    pto_worker_stats_get(w, &st);
    for (int r = 0; r < PTO_MAX_RING_DEPTH; r++) {
        g_ring_lo[r] = (uint64_t)(uintptr_t)pto_worker_ring_base(w, r);
        g_ring_hi[r] = g_ring_lo[r] + st.rings[r].capacity_bytes;
    }
    return w;
}

static int in_some_ring(uint64_t lo, uint64_t hi)
{
    for (int r = 0; r < PTO_MAX_RING_DEPTH; r++)
        if (g_ring_lo[r] && lo >= g_ring_lo[r] && hi <= g_ring_hi[r]) return 1;
    return 0;
}

/* Everything returned after a run. Returns the number of failed checks. */
static int check_reclaimed(const char *who)
{
    pto_stats st;
    pto_worker_stats_get(g_w, &st);
    int bad = 0;
    if (st.tasks_live != 0) bad++;
    if (st.tensormap_live != 0) bad++;
    for (int r = 0; r < PTO_MAX_RING_DEPTH; r++)
        if (st.rings[r].used_bytes != 0 || st.rings[r].live_slabs != 0) bad++;
    if (bad) {
        fprintf(stderr, "%s: not reclaimed after run_end: tasks_live=%" PRId64 " tensormap_live=%" PRId64,
                who, st.tasks_live, st.tensormap_live);
        for (int r = 0; r < PTO_MAX_RING_DEPTH; r++)
            fprintf(stderr, " ring%d(used=%" PRIu64 " slabs=%" PRId64 ")", r, st.rings[r].used_bytes,
                    st.rings[r].live_slabs);
        fprintf(stderr, "\n");
    }
    return bad;
}

/* ------------------------------------------------------------------ */
/* The random program and its reference model.                         */

#define MAX_BUFS 160
#define MAX_BUF_BYTES 256
#define MAX_TT 5           /* tensors per task */
#define MAX_OPS 512
#define N_MALLOC 3

enum { BUF_MALLOC, BUF_AUTO, BUF_ALLOC };

typedef struct buf {
    int kind;
    int id;                  /* task index (auto) or alloc ordinal */
    int slot;                /* auto: which tensor of the task */
    int depth;               /* scope depth it was created in; -1 = malloc */
    int valid;
    uint64_t base, off0;     /* its bytes: [base + off0, base + off0 + bytes) */
    uint64_t born;           /* heap: clock stamp taken right after submit/alloc returned */
    uint32_t bytes;
    int16_t lastw[MAX_BUF_BYTES];   /* reference: last writer of each byte, -1 none */
} buf;

typedef struct tdesc {
    int nt, ns;
    int kind;                /* PTO_NEXT_LEVEL or PTO_SUB */
    int pin;                 /* -1 = any */
    int bufi[MAX_TT];        /* buffer index of each tensor */
    uint8_t tags[MAX_TT];
    pto_tensor t[MAX_TT];    /* after submit (auto bases filled in) */
    uint64_t sc[2];
    uint64_t hash;
    int64_t id;
    int nprod;
    uint8_t prod[MAX_TASKS]; /* required producers */
    int fails;               /* the leaf returns an error */
    int may_die;             /* it, or something it depends on, fails */
    uint8_t eprod[MAX_TASKS];/* producers the engine gave it an edge to */
    /* A group (nm > 1): member m has tensors [moff[m], moff[m] + mt[m]) of
     * t[], scalars msc[m] (msc[m][0] = m, then sc[]), pin mpin[m]. */
    int nm;
    int moff[MAX_MEMBERS], mt[MAX_MEMBERS], mns[MAX_MEMBERS], mpin[MAX_MEMBERS];
    uint64_t msc[MAX_MEMBERS][3];
    uint64_t mhash[MAX_MEMBERS];
    int fail_member;
} tdesc;

enum { OP_BEGIN, OP_END, OP_ALLOC, OP_TASK };
typedef struct op { int kind, arg; } op;

typedef struct prog {
    uint64_t seed;
    int ntasks, nbufs, nops, nallocs;
    buf b[MAX_BUFS];
    tdesc t[MAX_TASKS];
    op ops[MAX_OPS];
    /* Generator's model of the heap rings: slabs in allocation order and the
     * scope instance holding each, so a seed never needs more memory than a
     * ring can give back (the engine would rightly report a deadlock). */
    uint32_t slab_bytes[PTO_MAX_RING_DEPTH][MAX_TASKS * 2];
    int slab_inst[PTO_MAX_RING_DEPTH][MAX_TASKS * 2];
    int nslabs[PTO_MAX_RING_DEPTH];
    int inst_open[MAX_OPS + 1];
    int inst_stack[PTO_MAX_SCOPE_DEPTH + 1];
    int ninst;
    int64_t reuses;          /* heap buffers placed over memory of an ended scope */
} prog;

/* The engine's rings are FIFO: a slab that does not fit at the end goes to
 * the start, leaving the end unused. With slabs of at most MAX_AUTO KiB that
 * waste is below MAX_AUTO KiB, so keeping held + new <= size - 2 * MAX_AUTO
 * KiB always leaves a contiguous gap for the new slab once the reclaimable
 * slabs are returned. */
#define MAX_AUTO 2                /* auto OUTPUTs per task (1 KiB slab each) */
#ifndef RING_MARGIN
#define RING_MARGIN (2u * MAX_AUTO * PTO_HEAP_ALIGN)
#endif

static int ring_for_depth(int depth) { return depth < PTO_MAX_RING_DEPTH - 1 ? depth : PTO_MAX_RING_DEPTH - 1; }

/* Could bytes more be held in ring r without relying on unreclaimable memory? */
static int ring_room(const prog *p, int r, uint32_t bytes)
{
    uint64_t held = 0;
    int k = 0;
    while (k < p->nslabs[r] && !p->inst_open[p->slab_inst[r][k]]) k++;   /* reclaimable prefix */
    for (; k < p->nslabs[r]; k++) held += p->slab_bytes[r][k];
    return held + bytes + RING_MARGIN <= RING_BYTES;
}

static void ring_push(prog *p, int depth, uint32_t bytes)
{
    int r = ring_for_depth(depth);
    if (p->nslabs[r] >= MAX_TASKS * 2) return;
    p->slab_bytes[r][p->nslabs[r]] = bytes;
    p->slab_inst[r][p->nslabs[r]] = p->inst_stack[depth];
    p->nslabs[r]++;
}

static uint32_t heap_align(uint32_t n) { return (n + PTO_HEAP_ALIGN - 1) / PTO_HEAP_ALIGN * PTO_HEAP_ALIGN; }

static uint64_t stamp_now(void) { return atomic_fetch_add(&g_clock, 1) + 1; }

static prog g_p;
static unsigned char *g_mbuf[N_MALLOC];
static const uint8_t g_dtypes[] = {PTO_F32, PTO_F16, PTO_U8, PTO_F64, PTO_I32, PTO_BF16, PTO_I64, PTO_I8};

static const char *tag_name(int tag)
{
    switch (tag) {
    case PTO_INPUT: return "IN";
    case PTO_OUTPUT: return "OUT";
    case PTO_INOUT: return "INOUT";
    case PTO_OUTPUT_EXISTING: return "OUTX";
    case PTO_NO_DEP: return "NODEP";
    default: return "?";
    }
}

static void buf_name(const prog *p, int bi, char *out, size_t cap)
{
    const buf *b = &p->b[bi];
    if (b->kind == BUF_MALLOC) snprintf(out, cap, "M%d", b->id);
    else if (b->kind == BUF_AUTO) snprintf(out, cap, "A%d.%d", b->id, b->slot);
    else snprintf(out, cap, "L%d", b->id);
}

static void dump_prog(const prog *p, int with_stamps)
{
    char nm[32];
    fprintf(stderr, "---- seed %" PRIu64 ": %d tasks (M* = malloc base of %d bytes, A<i>.<j> = auto OUTPUT "
            "of task i, tensor j, L<k> = pto_alloc #k; views are [byte off, +bytes) of the buffer)\n",
            p->seed, p->ntasks, MAX_BUF_BYTES);
    int depth = 0;
    for (int k = 0; k < p->nops; k++) {
        const op *o = &p->ops[k];
        if (o->kind == OP_BEGIN) { fprintf(stderr, "%*sscope_begin\n", depth * 2, ""); depth++; continue; }
        if (o->kind == OP_END) { depth--; fprintf(stderr, "%*sscope_end\n", depth * 2, ""); continue; }
        if (o->kind == OP_ALLOC) {
            buf_name(p, o->arg, nm, sizeof nm);
            fprintf(stderr, "%*s%s = pto_alloc(%u bytes)\n", depth * 2, "", nm, p->b[o->arg].bytes);
            continue;
        }
        const tdesc *t = &p->t[o->arg];
        fprintf(stderr, "%*stask %d: %s%s", depth * 2, "", o->arg,
                t->kind == PTO_SUB ? "sub" : "next_level", t->pin >= 0 ? "@" : "");
        if (t->pin >= 0) fprintf(stderr, "%d", t->pin);
        if (t->nm > 1) {
            fprintf(stderr, " group of %d (pins", t->nm);
            for (int m = 0; m < t->nm; m++) fprintf(stderr, " %d", t->mpin[m]);
            fprintf(stderr, "; tensors of member 0 | member 1)");
        }
        fprintf(stderr, " [");
        for (int j = 0; j < t->nt; j++) {
            const buf *b = &p->b[t->bufi[j]];
            buf_name(p, t->bufi[j], nm, sizeof nm);
            uint64_t off = t->t[j].offset - b->off0;
            const char *sep = j == 0 ? "" : t->nm > 1 && j == t->moff[1] ? " | " : ", ";
            if (t->nm > 1 && j == 0 && t->mt[0] == 0) sep = "| ";
            fprintf(stderr, "%s%s %s[%" PRIu64 ",+%" PRIu64 ") %s/%s nd%u", sep, tag_name(t->tags[j]),
                    nm, off, pto_tensor_nbytes(&t->t[j]), pto_dtype_name(t->t[j].dtype) ? pto_dtype_name(t->t[j].dtype) : "?",
                    b->kind == BUF_AUTO && b->id == o->arg ? "new" : "view", t->t[j].ndims);
        }
        fprintf(stderr, "] needs {");
        int first = 1;
        for (int q = 0; q < o->arg; q++)
            if (t->prod[q]) { fprintf(stderr, "%s%d", first ? "" : ",", q); first = 0; }
        fprintf(stderr, "} edges {");
        first = 1;
        for (int q = 0; q < o->arg; q++)
            if (t->eprod[q]) { fprintf(stderr, "%s%d", first ? "" : ",", q); first = 0; }
        fprintf(stderr, "}%s", t->fails ? " FAILS" : "");
        if (t->fails && t->nm > 1) fprintf(stderr, " (member %d)", t->fail_member);
        for (int m = 0; with_stamps && m < (t->nm > 1 ? t->nm : 1); m++) {
            const task_rec *r = mrec(o->arg, m);
            if (t->nm > 1) fprintf(stderr, " m%d:", m);
            fprintf(stderr, " ran=%d who=%d start=%" PRIu64 " end=%" PRIu64, atomic_load(&r->runs),
                    atomic_load(&r->who), atomic_load(&r->start), atomic_load(&r->end));
        }
        fprintf(stderr, "\n");
    }
}

static void hang_dump(void)
{
    if (atomic_load(&g_mode) == MODE_RANDOM) dump_prog(&g_p, 1);
}

static int rnd(uint64_t *s, int n) { return (int)(splitmix(s) % (uint64_t)n); }

/* A random (ndims, shape) with product n. */
static void rand_shape(uint64_t *s, uint32_t n, pto_tensor *t)
{
    int nd = 1 + rnd(s, 3);
    for (int i = 0; i < PTO_MAX_DIMS; i++) t->shape[i] = 0;
    if (nd == 1) { t->ndims = 1; t->shape[0] = n; return; }
    uint32_t divs[64]; int nd_ = 0;
    for (uint32_t d = 1; d <= n && nd_ < 64; d++) if (n % d == 0) divs[nd_++] = d;
    uint32_t d = divs[rnd(s, nd_)];
    if (nd == 2) { t->ndims = 2; t->shape[0] = d; t->shape[1] = n / d; return; }
    t->ndims = 3; t->shape[0] = 1; t->shape[1] = d; t->shape[2] = n / d;
}

static uint8_t rand_dtype(uint64_t *s, uint32_t max_bytes)
{
    for (;;) {
        uint8_t dt = g_dtypes[rnd(s, (int)sizeof g_dtypes)];
        if (pto_dtype_size(dt) <= max_bytes) return dt;
    }
}

/* A new buffer of random size (multiple of 8 bytes, 8..MAX_BUF_BYTES). */
static uint32_t rand_bytes(uint64_t *s) { return 8u * (uint32_t)(1 + rnd(s, MAX_BUF_BYTES / 8)); }

/* A random view of buffer bi into *t. */
static void rand_view(uint64_t *s, const buf *b, pto_tensor *t)
{
    memset(t, 0, sizeof *t);
    uint8_t dt;
    uint32_t es;
    /* Whole-buffer views sometimes, else random element-aligned sub-ranges. */
    dt = rand_dtype(s, b->bytes);
    es = (uint32_t)pto_dtype_size(dt);
    uint32_t nel = b->bytes / es;
    uint32_t first = 0, n = nel;
    if (rnd(s, 4) != 0) {
        first = (uint32_t)rnd(s, (int)nel);
        uint32_t maxn = nel - first;
        n = 1 + (uint32_t)rnd(s, (int)(rnd(s, 2) ? maxn : (maxn < 8 ? maxn : 8)));
    }
    t->base = b->base;
    t->offset = b->off0 + (uint64_t)first * es;
    t->dtype = dt;
    rand_shape(s, n, t);
}

static int pick_buf(uint64_t *s, const prog *p)
{
    int cand[MAX_BUFS], nc = 0;
    for (int i = 0; i < p->nbufs; i++) if (p->b[i].valid) cand[nc++] = i;
    /* Bias toward recently created buffers so auto OUTPUTs get read. */
    if (nc > N_MALLOC && rnd(s, 2)) {
        int recent = nc - N_MALLOC < 4 ? nc - N_MALLOC : 4;
        return cand[nc - 1 - rnd(s, recent)];
    }
    return cand[rnd(s, nc)];
}

static int rand_tag(uint64_t *s)
{
    int r = rnd(s, 100);
    if (r < 35) return PTO_INPUT;
    if (r < 55) return PTO_INOUT;
    if (r < 70) return PTO_OUTPUT;
    if (r < 88) return PTO_OUTPUT_EXISTING;
    return PTO_NO_DEP;
}

/* Bytes of tensor t relative to the buffer's first byte. */
static void rel_range(const buf *b, const pto_tensor *t, uint64_t *lo, uint64_t *hi)
{
    *lo = t->offset - b->off0;
    *hi = *lo + pto_tensor_nbytes(t);
}

static int seed_fail(const char *what, int64_t a, int64_t b)
{
    fprintf(stderr, "seed %" PRIu64 ": %s (%" PRId64 ", %" PRId64 ")\n", g_p.seed, what, a, b);
    return 1;
}

/* A new heap buffer (auto OUTPUT or pto_alloc) must lie in a heap ring and
 * must not overlap any other live heap buffer (their scopes are all open). */
static int check_new_heap_buf(const prog *p, int k)
{
    const buf *b = &p->b[k];
    int bad = 0;
    uint64_t lo = b->base + b->off0, hi = lo + b->bytes;
    if (!in_some_ring(lo, hi)) bad += seed_fail("heap buffer outside every heap ring (buffer, address)", k, (int64_t)lo);
    for (int m = N_MALLOC; m < p->nbufs; m++) {
        const buf *c = &p->b[m];
        if (m == k || !c->valid) continue;
        uint64_t clo = c->base + c->off0, chi = clo + c->bytes;
        if (lo < chi && clo < hi) {
            char n1[32], n2[32];
            buf_name(p, k, n1, sizeof n1);
            buf_name(p, m, n2, sizeof n2);
            fprintf(stderr, "seed %" PRIu64 ": live heap buffers %s [%#" PRIx64 ",%#" PRIx64 ") and %s [%#" PRIx64
                    ",%#" PRIx64 ") overlap\n", p->seed, n1, lo, hi, n2, clo, chi);
            bad++;
        }
    }
    return bad;
}

/* Heap memory is handed out again only after every task that used it ended:
 * for each heap buffer C and each later heap buffer B over the same bytes,
 * every task naming C ended before B's submit/alloc returned. */
static int check_reuse(prog *p)
{
    int bad = 0;
    for (int c = N_MALLOC; c < p->nbufs; c++) {
        const buf *C = &p->b[c];
        uint64_t clo = C->base + C->off0, chi = clo + C->bytes;
        for (int b = c + 1; b < p->nbufs; b++) {
            const buf *B = &p->b[b];
            uint64_t blo = B->base + B->off0, bhi = blo + B->bytes;
            if (B->kind == BUF_MALLOC || !(blo < chi && clo < bhi)) continue;
            if (B->kind == BUF_AUTO && C->kind == BUF_AUTO && B->id == C->id) continue;
            p->reuses++;
            for (int i = 0; i < p->ntasks; i++) {
                const tdesc *t = &p->t[i];
                for (int j = 0; j < t->nt && task_ran(i); j++) {   /* an unrun task touched nothing */
                    if (t->bufi[j] != c) continue;
                    uint64_t e = task_end(i);   /* a group holds its memory until its last member ends */
                    if (!(e < B->born)) {
                        char n1[32], n2[32];
                        buf_name(p, c, n1, sizeof n1);
                        buf_name(p, b, n2, sizeof n2);
                        fprintf(stderr, "seed %" PRIu64 ": %s was placed over memory of %s (stamp %" PRIu64 ") "
                                "while task %d, which uses %s, had not ended (end stamp %" PRIu64 ")\n",
                                p->seed, n2, n1, B->born, i, n1, e);
                        bad++;
                    }
                    break;
                }
            }
        }
    }
    return bad;
}

/* Generate, submit and verify one seed. Returns the number of problems. */
static int run_seed(uint64_t seed, int verbose)
{
    prog *p = &g_p;
    memset(p, 0, sizeof *p);
    p->seed = seed;
    uint64_t s = seed * 0x2545F4914F6CDD1Dull + 17;
    int bad = 0;
    char what[96];
    snprintf(what, sizeof what, "seed %" PRIu64, seed);
    progress(what);

    reset_recs();
    atomic_store(&g_seed, seed);
    atomic_store(&g_mode, MODE_RANDOM);

    for (int i = 0; i < N_MALLOC; i++) {
        buf *b = &p->b[p->nbufs++];
        b->kind = BUF_MALLOC; b->id = i; b->depth = -1; b->valid = 1;
        b->base = (uint64_t)(uintptr_t)g_mbuf[i]; b->off0 = 0; b->bytes = MAX_BUF_BYTES;
        for (int k = 0; k < MAX_BUF_BYTES; k++) b->lastw[k] = -1;
    }
    pto_stats st0;
    pto_worker_stats_get(g_w, &st0);

    pto_orch *o = pto_run_begin(g_w);
    if (!o) { fprintf(stderr, "seed %" PRIu64 ": pto_run_begin: %s\n", seed, pto_errmsg()); return 1; }

    int ntasks = 30 + rnd(&s, 51);
    uint64_t fs = seed ^ 0x5EEDFA11ull;   /* own stream: the programs stay those of earlier versions */
    uint64_t gs = seed ^ 0x6A0C9B1Dull;   /* groups: likewise */
    bool with_failures = seed % 4 == 0;
    int depth = 0;
    p->ninst = 0;
    p->inst_open[0] = 1;
    p->inst_stack[0] = 0;
    int aborted = 0;
    for (int i = 0; i < ntasks && !aborted; i++) {
        /* Scope moves. */
        if (depth < 6 && rnd(&s, 100) < 12 && p->nops < MAX_OPS) {
            if (pto_scope_begin(o) != 0) { bad += seed_fail("pto_scope_begin failed", depth, 0); aborted = 1; break; }
            depth++;
            p->ops[p->nops++] = (op){OP_BEGIN, 0};
            p->ninst++;
            p->inst_open[p->ninst] = 1;
            p->inst_stack[depth] = p->ninst;
        }
        if (depth > 0 && rnd(&s, 100) < 10 && p->nops < MAX_OPS) {
            if (pto_scope_end(o) != 0) { bad += seed_fail("pto_scope_end failed", depth, 0); aborted = 1; break; }
            p->inst_open[p->inst_stack[depth]] = 0;
            depth--;
            p->ops[p->nops++] = (op){OP_END, 0};
            for (int k = 0; k < p->nbufs; k++) if (p->b[k].depth > depth) p->b[k].valid = 0;
        }
        if (pto_scope_depth(o) != depth) bad += seed_fail("pto_scope_depth", pto_scope_depth(o), depth);

        /* Occasionally carve a tensor with pto_alloc. */
        uint32_t alloc_bytes = rand_bytes(&s);
        if (rnd(&s, 100) < 8 && p->nbufs < MAX_BUFS && p->nops < MAX_OPS &&
            ring_room(p, ring_for_depth(depth), heap_align(alloc_bytes))) {
            uint32_t bytes = alloc_bytes;
            uint8_t dt = rand_dtype(&s, 8);
            while (bytes % pto_dtype_size(dt)) dt = rand_dtype(&s, 8);
            pto_tensor shape_of = {0};
            rand_shape(&s, bytes / (uint32_t)pto_dtype_size(dt), &shape_of);
            pto_tensor out;
            memset(&out, 0, sizeof out);
            int64_t id = pto_alloc(o, shape_of.shape, shape_of.ndims, dt, &out);
            if (id < 0) { bad += seed_fail("pto_alloc failed", (int64_t)bytes, 0); fprintf(stderr, "  %s\n", pto_errmsg()); aborted = 1; break; }
            if (out.base == 0 || pto_tensor_nbytes(&out) != bytes) {
                bad += seed_fail("pto_alloc tensor: base or size wrong", (int64_t)out.base, (int64_t)pto_tensor_nbytes(&out));
            }
            buf *b = &p->b[p->nbufs];
            b->kind = BUF_ALLOC; b->id = p->nallocs++; b->depth = depth; b->valid = 1;
            b->base = out.base; b->off0 = out.offset; b->bytes = bytes;
            b->born = stamp_now();
            ring_push(p, depth, heap_align(bytes));
            for (int k = 0; k < MAX_BUF_BYTES; k++) b->lastw[k] = -1;
            p->ops[p->nops++] = (op){OP_ALLOC, p->nbufs};
            p->nbufs++;
            bad += check_new_heap_buf(p, p->nbufs - 1);
        }

        /* The task. */
        tdesc *t = &p->t[i];
        int r = rnd(&s, 100);
        t->nt = r < 4 ? 0 : r < 30 ? 1 : r < 60 ? 2 : r < 85 ? 3 : r < 95 ? 4 : 5;
        t->ns = rnd(&s, 3);
        for (int k = 0; k < t->ns; k++) t->sc[k] = splitmix(&s);
        if (rnd(&s, 100) < 70) { t->kind = PTO_NEXT_LEVEL; t->pin = rnd(&s, 100) < 15 ? rnd(&s, 2) : -1; }
        else { t->kind = PTO_SUB; t->pin = rnd(&s, 100) < 30 ? 0 : -1; }
        int nauto = 0;
        uint32_t auto_bytes = 0;
        for (int j = 0; j < t->nt; j++) {
            uint32_t bytes = rand_bytes(&s);
            if (rnd(&s, 100) < 25 && nauto < MAX_AUTO && p->nbufs + nauto < MAX_BUFS &&
                ring_room(p, ring_for_depth(depth), auto_bytes + heap_align(bytes))) {
                /* New auto-allocated OUTPUT. */
                auto_bytes += heap_align(bytes);
                uint8_t dt = rand_dtype(&s, 8);
                while (bytes % pto_dtype_size(dt)) dt = rand_dtype(&s, 8);
                memset(&t->t[j], 0, sizeof t->t[j]);
                t->t[j].dtype = dt;
                rand_shape(&s, bytes / (uint32_t)pto_dtype_size(dt), &t->t[j]);
                t->tags[j] = PTO_OUTPUT;
                t->bufi[j] = -1 - nauto;    /* resolved after submit */
                nauto++;
            } else {
                int bi = pick_buf(&s, p);
                rand_view(&s, &p->b[bi], &t->t[j]);
                t->tags[j] = (uint8_t)rand_tag(&s);
                t->bufi[j] = bi;
            }
        }
        /* Reference: required producers, from the state before this task. */
        for (int j = 0; j < t->nt; j++) {
            if (t->bufi[j] < 0) continue;
            if (t->tags[j] != PTO_INPUT && t->tags[j] != PTO_INOUT) continue;
            const buf *b = &p->b[t->bufi[j]];
            uint64_t lo, hi;
            rel_range(b, &t->t[j], &lo, &hi);
            for (uint64_t k = lo; k < hi; k++)
                if (b->lastw[k] >= 0) t->prod[b->lastw[k]] = 1;
        }
        for (int q = 0; q < i; q++) t->nprod += t->prod[q];
        t->fails = with_failures && splitmix(&fs) % 100 < 8;
        atomic_store(&g_fail[i], t->fails);
        t->nm = 1;
        if (splitmix(&gs) % 100 < 14) {
            /* A group of two: member 0 takes the first k tensors, member 1 the rest. */
            int k = (int)(splitmix(&gs) % (uint64_t)(t->nt + 1));
            t->nm = 2;
            t->moff[0] = 0; t->mt[0] = k;
            t->moff[1] = k; t->mt[1] = t->nt - k;
            for (int m = 0; m < t->nm; m++) {
                t->mns[m] = 1 + t->ns;
                t->msc[m][0] = (uint64_t)m;
                for (int q = 0; q < t->ns; q++) t->msc[m][1 + q] = t->sc[q];
                t->mpin[m] = -1;
            }
            switch (splitmix(&gs) % 8) {
            case 0: t->mpin[0] = 0; t->mpin[1] = 1; break;
            case 1: t->mpin[0] = 1; t->mpin[1] = 0; break;
            case 2: t->mpin[0] = (int)(splitmix(&gs) % 2); break;
            case 3: t->mpin[1] = (int)(splitmix(&gs) % 2); break;
            default: break;
            }
            t->pin = -1;
            t->fail_member = (int)(splitmix(&gs) % 2);
        }
        atomic_store(&g_members[i], t->nm);
        atomic_store(&g_fail_member[i], t->fail_member);

        p->ops[p->nops++] = (op){OP_TASK, i};
        pto_task_args a = {.tensor_count = t->nt, .scalar_count = t->ns, .tensors = t->nt ? t->t : NULL,
                           .tags = t->nt ? t->tags : NULL, .scalars = t->ns ? t->sc : NULL};
        snprintf(what, sizeof what, "seed %" PRIu64 " submit of task %d", seed, i);
        progress(what);
        if (t->nm > 1) {
            pto_task_args ma[MAX_MEMBERS];
            int32_t pins[MAX_MEMBERS];
            int pinned = 0;
            for (int m = 0; m < t->nm; m++) {
                ma[m] = (pto_task_args){.tensor_count = t->mt[m], .scalar_count = t->mns[m],
                                        .tensors = t->mt[m] ? t->t + t->moff[m] : NULL,
                                        .tags = t->mt[m] ? t->tags + t->moff[m] : NULL, .scalars = t->msc[m]};
                pins[m] = t->mpin[m];
                pinned |= pins[m] >= 0;
            }
            t->id = t->kind == PTO_SUB ? pto_submit_sub_group(o, (uint64_t)i, ma, t->nm, pinned ? pins : NULL)
                                       : pto_submit_next_level_group(o, (uint64_t)i, ma, t->nm, NULL,
                                                                     pinned ? pins : NULL);
        } else {
            t->id = t->kind == PTO_SUB ? pto_submit_sub(o, (uint64_t)i, &a, t->pin)
                                       : pto_submit_next_level(o, (uint64_t)i, &a, NULL, t->pin);
        }
        if (t->id < 0) {
            fprintf(stderr, "seed %" PRIu64 ": submit of task %d failed: %s\n", seed, i, pto_errmsg());
            bad++;
            p->ntasks = i;
            p->nops--;
            aborted = 1;
            break;
        }
        p->ntasks = i + 1;
        int64_t edges[MAX_TASKS];
        int ne = pto_task_edges(o, t->id, 0, edges, MAX_TASKS);
        for (int e = 0; e < ne && e < MAX_TASKS; e++)
            for (int q = 0; q < i; q++)
                if (p->t[q].id == edges[e]) t->eprod[q] = 1;   /* others are pto_alloc slots */
        t->may_die = t->fails;
        for (int q = 0; q < i; q++)
            if ((t->prod[q] || t->eprod[q]) && p->t[q].may_die) t->may_die = 1;
        t->hash = view_hash(t->nt, t->ns, t->t, t->sc);
        for (int m = 0; m < t->nm && t->nm > 1; m++)
            t->mhash[m] = view_hash(t->mt[m], t->mns[m], t->t + t->moff[m], t->msc[m]);
        uint64_t born = stamp_now();
        if (auto_bytes) ring_push(p, depth, auto_bytes);

        /* New auto buffers. */
        for (int j = 0; j < t->nt; j++) {
            if (t->bufi[j] >= 0) continue;
            buf *b = &p->b[p->nbufs];
            b->kind = BUF_AUTO; b->id = i; b->slot = j; b->depth = depth; b->valid = 1; b->born = born;
            b->base = t->t[j].base; b->off0 = t->t[j].offset; b->bytes = (uint32_t)pto_tensor_nbytes(&t->t[j]);
            for (int k = 0; k < MAX_BUF_BYTES; k++) b->lastw[k] = -1;
            t->bufi[j] = p->nbufs++;
            if (b->base == 0) bad += seed_fail("auto OUTPUT: submit left base 0", i, j);
        }
        /* Reference: this task becomes the writer of what it writes. */
        for (int j = 0; j < t->nt; j++) {
            int tg = t->tags[j];
            if (tg != PTO_OUTPUT && tg != PTO_INOUT && tg != PTO_OUTPUT_EXISTING) continue;
            buf *b = &p->b[t->bufi[j]];
            uint64_t lo, hi;
            rel_range(b, &t->t[j], &lo, &hi);
            for (uint64_t k = lo; k < hi; k++) b->lastw[k] = (int16_t)i;
        }
        for (int j = 0; j < t->nt; j++)
            if (p->b[t->bufi[j]].kind == BUF_AUTO && p->b[t->bufi[j]].id == i) bad += check_new_heap_buf(p, t->bufi[j]);
    }
    while (depth > 0) {
        if (pto_scope_end(o) != 0) { bad += seed_fail("pto_scope_end failed at close", depth, 0); break; }
        depth--;
        p->ops[p->nops++] = (op){OP_END, 0};
    }
    snprintf(what, sizeof what, "seed %" PRIu64 " pto_run_end", seed);
    progress(what);
    int rc = pto_run_end(g_w);
    progress(NULL);
    bool any_fails = false;
    int expect_failed = 0;
    for (int i = 0; i < p->ntasks; i++) {
        int ran = task_ran(i);
        any_fails |= p->t[i].fails && atomic_load(&mrec(i, p->t[i].fail_member)->runs);
        expect_failed += !ran || p->t[i].fails;
    }
    if (any_fails ? rc != -1 || !strstr(pto_errmsg(), "planned failure of task") : rc != 0) {
        fprintf(stderr, "seed %" PRIu64 ": pto_run_end returned %d (%s): %s\n", seed, rc,
                any_fails ? "a task failed" : "nothing failed", rc ? pto_errmsg() : "");
        bad++;
    }

    /* Verify. */
    for (int i = 0; i < p->ntasks; i++) {
        const tdesc *t = &p->t[i];
        if (!task_ran(i) && t->may_die) continue;   /* not run: something upstream failed */
        int ok = 1;
        for (int m = 0; m < t->nm; m++) {
            task_rec *r = mrec(i, m);
            int runs = atomic_load(&r->runs);
            /* A failed member's group skips siblings that have not started. */
            if (runs == 0 && t->nm > 1 && t->fails && m != t->fail_member) continue;
            if (runs != 1) {
                bad += t->nm > 1 ? seed_fail("group member ran != 1 times (task, member * 100 + runs)", i, m * 100 + runs)
                                 : seed_fail("task ran != 1 times (task, runs)", i, runs);
                ok = 0;
                continue;
            }
            uint64_t st = atomic_load(&r->start);
            for (int q = 0; q < i; q++) {
                if (!t->prod[q]) continue;
                uint64_t pe = task_end(q);
                if (!(st > pe)) {
                    fprintf(stderr, "seed %" PRIu64 ": task %d (member %d) started (stamp %" PRIu64 ") before its "
                            "producer %d ended (stamp %" PRIu64 ")\n", seed, i, m, st, q, pe);
                    bad++;
                }
            }
            int who = atomic_load(&r->who);
            int pin = t->nm > 1 ? t->mpin[m] : t->pin;
            if (t->kind == PTO_SUB ? who != WHO_SUB0 && who != WHO_SUB1 : who != WHO_NL0 && who != WHO_NL1)
                bad += seed_fail("task ran on the wrong kind of leaf (task, leaf)", i, who);
            else if (pin >= 0 && who != (t->kind == PTO_SUB ? WHO_SUB0 + pin : pin))
                bad += seed_fail("pinned task (member) ran on another worker (task, leaf)", i, who);
            if (atomic_load(&r->hash) != (t->nm > 1 ? t->mhash[m] : t->hash))
                bad += seed_fail("leaf saw different arguments than were submitted (task, member)", i, m);
        }
        if (t->nm > 1 && atomic_load(&mrec(i, 0)->runs) && atomic_load(&mrec(i, 1)->runs) &&
            atomic_load(&mrec(i, 0)->who) == atomic_load(&mrec(i, 1)->who))
            bad += seed_fail("two members of a group ran on one worker (task, leaf)", i, atomic_load(&mrec(i, 0)->who));
        if (t->fails && t->nm > 1 && task_ran(i) && !atomic_load(&mrec(i, t->fail_member)->runs))
            bad += seed_fail("a group ran without its failing member (task, member)", i, t->fail_member);
        for (int q = 0; ok && q < i; q++)
            if (t->eprod[q] && (p->t[q].fails || !task_ran(q)))
                bad += seed_fail("task ran although a producer failed or did not run (task, producer)", i, q);
    }
    for (int i = p->ntasks; i < MAX_TASKS; i++)
        for (int m = 0; m < MAX_MEMBERS; m++)
            if (atomic_load(&mrec(i, m)->runs) != 0) bad += seed_fail("unsubmitted task ran (task, member)", i, m);
    bad += check_reuse(p);
    if (atomic_load(&g_bad_callable)) { bad += seed_fail("leaf got an unknown callable", 0, 0); atomic_store(&g_bad_callable, 0); }

    pto_stats st1;
    pto_worker_stats_get(g_w, &st1);
    if (st1.tasks_failed - st0.tasks_failed != expect_failed)
        bad += seed_fail("tasks_failed grew by (got, expected)", st1.tasks_failed - st0.tasks_failed, expect_failed);
    if (st1.runs != st0.runs + 1) bad += seed_fail("stats.runs did not grow by one", st0.runs, st1.runs);
    bad += check_reclaimed("random_dag");

    if (bad || verbose) dump_prog(p, 1);
    return bad;
}

static long env_long(const char *name, long dflt)
{
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    long x = strtol(v, &end, 10);
    return *end ? dflt : x;
}

static void test_random_dag(void)
{
    long single = env_long("PTO_RANDOM_SEED", -1);
    long nseeds = env_long("PTO_RANDOM_SEEDS", 2000);
    long base = env_long("PTO_RANDOM_SEED_BASE", 1);
    long max_fails = env_long("PTO_RANDOM_MAX_FAILS", 3);
    int failed_seeds = 0, shown = 0;
    uint64_t t0 = now_ms();
    long ntasks = 0, ngroups = 0;
    int64_t reuses = 0;
    pto_stats st0, st1;
    pto_worker_stats_get(g_w, &st0);
    if (single >= 0) { base = single; nseeds = 1; }
    for (long k = 0; k < nseeds; k++) {
        uint64_t seed = (uint64_t)(base + k);
        int b = run_seed(seed, single >= 0);
        ntasks += g_p.ntasks;
        for (int i = 0; i < g_p.ntasks; i++) ngroups += g_p.t[i].nm > 1;
        reuses += g_p.reuses;
        tu_checks++;
        if (b) {
            tu_failures++;
            failed_seeds++;
            fprintf(stderr, "random_dag: seed %" PRIu64 " FAILED (%d problems); rerun with PTO_RANDOM_SEED=%" PRIu64 "\n",
                    seed, b, seed);
            if (++shown >= max_fails) {
                fprintf(stderr, "random_dag: stopping after %ld failing seeds\n", max_fails);
                break;
            }
        }
    }
    pto_worker_stats_get(g_w, &st1);
    int64_t stalls = 0;
    for (int r = 0; r < PTO_MAX_RING_DEPTH; r++) stalls += st1.rings[r].stalls - st0.rings[r].stalls;
    printf("random_dag: %ld seeds from %ld, %ld tasks (%ld groups), %d failing seeds, %.2f s; %" PRId64 " heap buffers reused "
           "memory of ended scopes, %" PRId64 " ring stalls\n", nseeds, base, ntasks, ngroups, failed_seeds,
           (double)(now_ms() - t0) / 1000.0, reuses, stalls);
}

/* ------------------------------------------------------------------ */
/* Deterministic checks.                                               */

typedef struct dtask {
    int kind, pin;
    int nt;
    pto_tensor t[3];
    uint8_t tags[3];
    int wait, set;
} dtask;

/* Submit the tasks (callable = index), end the run, and return run_end's rc. */
static int det_run(const char *name, dtask *d, int n)
{
    char what[96];
    snprintf(what, sizeof what, "deterministic test %s", name);
    progress(what);
    reset_recs();
    atomic_store(&g_mode, MODE_DET);
    for (int i = 0; i < n; i++) { atomic_store(&g_wait[i], d[i].wait); atomic_store(&g_set[i], d[i].set); }
    pto_orch *o = pto_run_begin(g_w);
    CHECK(o != NULL);
    if (!o) return -1;
    for (int i = 0; i < n; i++) {
        pto_task_args a = {.tensor_count = d[i].nt, .tensors = d[i].t, .tags = d[i].tags};
        int64_t id = d[i].kind == PTO_SUB ? pto_submit_sub(o, (uint64_t)i, &a, d[i].pin)
                                          : pto_submit_next_level(o, (uint64_t)i, &a, NULL, d[i].pin);
        if (id < 0) fprintf(stderr, "%s: submit %d: %s\n", name, i, pto_errmsg());
        CHECK(id >= 0);
    }
    int rc = pto_run_end(g_w);
    if (rc != 0) fprintf(stderr, "%s: pto_run_end: %s\n", name, pto_errmsg());
    progress(NULL);
    for (int i = 0; i < n; i++) {
        CHECK_EQ(atomic_load(&g_rec[i].runs), 1);
        if (atomic_load(&g_rec[i].timeout))
            fprintf(stderr, "%s: task %d waited %d ms for a task that should have been able to run "
                    "concurrently (it was ordered after it)\n", name, i, g_det_wait_ms);
        CHECK(!atomic_load(&g_rec[i].timeout));
    }
    CHECK_EQ(check_reclaimed(name), 0);
    return rc;
}

static dtask dt(int kind, int pin, int wait, int set)
{
    dtask d;
    memset(&d, 0, sizeof d);
    d.kind = kind; d.pin = pin; d.wait = wait; d.set = set;
    return d;
}

static void add_t(dtask *d, pto_tensor t, int tag)
{
    d->t[d->nt] = t;
    d->tags[d->nt] = (uint8_t)tag;
    d->nt++;
}

#define BEFORE(a, b) (atomic_load(&g_rec[a].end) < atomic_load(&g_rec[b].start))

/* Two disjoint views of one base, each written then read: reader 2 runs while
 * writer 1 (of the other view) is still blocked waiting for it. */
static void test_disjoint_views(void)
{
    static const int wtags[] = {PTO_OUTPUT, PTO_OUTPUT_EXISTING, PTO_INOUT};
    uint64_t base = (uint64_t)(uintptr_t)g_mbuf[0];
    for (int w = 0; w < 3; w++) {
        pto_tensor va = tu_tensor(base, 0, 32), vc = tu_tensor(base, 128, 32);
        dtask d[4];
        d[0] = dt(PTO_NEXT_LEVEL, 0, -1, -1); add_t(&d[0], va, wtags[w]);
        d[1] = dt(PTO_NEXT_LEVEL, 1, 0, -1);  add_t(&d[1], vc, wtags[w]);   /* waits for reader 2 */
        d[2] = dt(PTO_SUB, 0, -1, 0);         add_t(&d[2], va, PTO_INPUT);  /* sets the flag */
        d[3] = dt(PTO_SUB, -1, -1, -1);       add_t(&d[3], vc, PTO_INPUT);
        CHECK_EQ(det_run("disjoint_views", d, 4), 0);
        CHECK(BEFORE(0, 2));
        CHECK(BEFORE(1, 3));
        CHECK(atomic_load(&g_rec[2].start) < atomic_load(&g_rec[1].end));
    }
    /* Adjacent but not overlapping byte ranges, and a reader of the union. */
    {
        pto_tensor va = tu_tensor(base, 0, 16), vc = tu_tensor(base, 64, 16), vu = tu_tensor(base, 0, 32);
        dtask d[4];
        d[0] = dt(PTO_NEXT_LEVEL, 0, -1, -1); add_t(&d[0], va, PTO_OUTPUT);
        d[1] = dt(PTO_NEXT_LEVEL, 1, 0, -1);  add_t(&d[1], vc, PTO_OUTPUT);
        d[2] = dt(PTO_SUB, 0, -1, 0);         add_t(&d[2], va, PTO_INPUT);
        d[3] = dt(PTO_SUB, -1, -1, -1);       add_t(&d[3], vu, PTO_INPUT);  /* needs both */
        CHECK_EQ(det_run("adjacent_views", d, 4), 0);
        CHECK(BEFORE(0, 2));
        CHECK(BEFORE(0, 3));
        CHECK(BEFORE(1, 3));
    }
}

/* Overlap by a single byte orders; an f32 view and a u8 view of the same bytes order. */
static void test_overlapping_views(void)
{
    uint64_t base = (uint64_t)(uintptr_t)g_mbuf[1];
    pto_tensor w = tu_tensor(base, 0, 16);            /* bytes [0,64) */
    pto_tensor r = {.base = base, .offset = 63, .dtype = PTO_U8, .ndims = 1};
    r.shape[0] = 10;                                  /* bytes [63,73) */
    pto_tensor r2 = {.base = base, .offset = 64, .dtype = PTO_U8, .ndims = 2};
    r2.shape[0] = 2; r2.shape[1] = 4;                 /* bytes [64,72): disjoint */
    dtask d[3];
    d[0] = dt(PTO_NEXT_LEVEL, 0, 0, -1); add_t(&d[0], w, PTO_OUTPUT);  /* waits for task 2 */
    d[1] = dt(PTO_SUB, -1, -1, -1);      add_t(&d[1], r, PTO_INPUT);
    d[2] = dt(PTO_NEXT_LEVEL, 1, -1, 0); add_t(&d[2], r2, PTO_INPUT);
    CHECK_EQ(det_run("overlapping_views", d, 3), 0);
    CHECK(BEFORE(0, 1));
}

/* Write-after-read creates no edge: the writer runs while the reader is still running. */
static void test_no_war(void)
{
    uint64_t base = (uint64_t)(uintptr_t)g_mbuf[0];
    pto_tensor v = tu_tensor(base, 0, 8);
    static const int wtags[] = {PTO_OUTPUT, PTO_OUTPUT_EXISTING, PTO_INOUT};
    for (int k = 0; k < 3; k++) {
        dtask d[2];
        d[0] = dt(PTO_NEXT_LEVEL, 0, 0, -1); add_t(&d[0], v, PTO_INPUT);  /* waits for the writer */
        d[1] = dt(PTO_NEXT_LEVEL, 1, -1, 0); add_t(&d[1], v, wtags[k]);
        CHECK_EQ(det_run("no_war", d, 2), 0);
    }
}

/* OUTPUT and OUTPUT_EXISTING do not look up: no write-after-write edge. The
 * next reader follows the latest writer. */
static void test_no_waw(void)
{
    uint64_t base = (uint64_t)(uintptr_t)g_mbuf[0];
    pto_tensor v = tu_tensor(base, 32, 8);
    static const int wtags[] = {PTO_OUTPUT, PTO_OUTPUT_EXISTING};
    for (int k = 0; k < 2; k++) {
        dtask d[3];
        d[0] = dt(PTO_NEXT_LEVEL, 0, 0, -1); add_t(&d[0], v, PTO_OUTPUT);  /* waits for the second writer */
        d[1] = dt(PTO_NEXT_LEVEL, 1, -1, 0); add_t(&d[1], v, wtags[k]);
        d[2] = dt(PTO_SUB, -1, -1, -1);      add_t(&d[2], v, PTO_INPUT);
        CHECK_EQ(det_run("no_waw", d, 3), 0);
        CHECK(BEFORE(1, 2));
    }
}

/* Different bases never interact, even with equal offsets; NO_DEP orders nothing. */
static void test_bases_and_nodep(void)
{
    pto_tensor x = tu_tensor((uint64_t)(uintptr_t)g_mbuf[0], 0, 16);
    pto_tensor y = tu_tensor((uint64_t)(uintptr_t)g_mbuf[1], 0, 16);
    dtask d[4];
    d[0] = dt(PTO_NEXT_LEVEL, 0, 0, -1); add_t(&d[0], x, PTO_OUTPUT);    /* waits for task 2 */
    d[1] = dt(PTO_SUB, 0, -1, -1);       add_t(&d[1], y, PTO_OUTPUT);
    d[2] = dt(PTO_NEXT_LEVEL, 1, -1, 0); add_t(&d[2], y, PTO_INOUT); add_t(&d[2], x, PTO_NO_DEP);
    d[3] = dt(PTO_SUB, -1, -1, -1);      add_t(&d[3], x, PTO_INPUT);
    CHECK_EQ(det_run("bases_and_nodep", d, 4), 0);
    CHECK(BEFORE(1, 2));
    CHECK(BEFORE(0, 3));
}

/* A task naming the same bytes twice (read and write) does not wait for
 * itself; the next reader follows it. */
static void test_self_overlap(void)
{
    uint64_t base = (uint64_t)(uintptr_t)g_mbuf[2];
    pto_tensor a = tu_tensor(base, 0, 16), b = tu_tensor(base, 32, 16);
    dtask d[4];
    d[0] = dt(PTO_NEXT_LEVEL, -1, -1, -1); add_t(&d[0], a, PTO_OUTPUT);
    d[1] = dt(PTO_NEXT_LEVEL, -1, -1, -1); add_t(&d[1], a, PTO_INPUT); add_t(&d[1], a, PTO_OUTPUT);
    d[2] = dt(PTO_SUB, -1, -1, -1);        add_t(&d[2], b, PTO_OUTPUT_EXISTING); add_t(&d[2], a, PTO_INOUT);
                                           add_t(&d[2], b, PTO_INPUT);
    d[3] = dt(PTO_NEXT_LEVEL, -1, -1, -1); add_t(&d[3], a, PTO_INPUT);
    CHECK_EQ(det_run("self_overlap", d, 4), 0);
    CHECK(BEFORE(0, 1));
    CHECK(BEFORE(1, 2));
    CHECK(BEFORE(2, 3));
}

/* A task that depends on a finished producer from an ended scope must not
 * keep that producer's heap slab alive while its own submit waits for heap
 * space: here the slab is needed only until its last user C ends (200 ms),
 * and the program needs at most the ring's two slabs at any time.
 *   scope { P: OUTPUT auto X, OUTPUT_EXISTING M;  C: INPUT X (runs 200 ms) }
 *   scope { F: OUTPUT auto;  N: INPUT M, OUTPUT auto }   (2 KiB rings) */
static int pin_leaf(void *ctx, uint64_t callable, const pto_args_view *v, const pto_call_config *cfg,
                    char *err, size_t errlen)
{
    (void)ctx; (void)v; (void)cfg; (void)err; (void)errlen;
    if (callable == 1) sleep_us(200000);
    return 0;
}

static void test_dependency_does_not_pin_slab(void)
{
    progress("deterministic test dependency_does_not_pin_slab");
    pto_worker *w = tu_worker(2, 0, pin_leaf, NULL, 2 * PTO_HEAP_ALIGN, 3000);
    pto_tensor m = tu_tensor((uint64_t)(uintptr_t)g_mbuf[0], 0, 16);
    pto_orch *o = pto_run_begin(w);
    CHECK(o != NULL);
    if (!o) { pto_worker_close(w); return; }
    CHECK_EQ(pto_scope_begin(o), 0);
    pto_tensor pt[2] = {tu_tensor(0, 0, 16), m};
    uint8_t ptags[2] = {PTO_OUTPUT, PTO_OUTPUT_EXISTING};
    pto_task_args pa = {.tensor_count = 2, .tensors = pt, .tags = ptags};
    CHECK(pto_submit_next_level(o, 0, &pa, NULL, -1) >= 0);
    pto_tensor ct[1] = {pt[0]};
    uint8_t ctags[1] = {PTO_INPUT};
    pto_task_args ca = {.tensor_count = 1, .tensors = ct, .tags = ctags};
    CHECK(pto_submit_next_level(o, 1, &ca, NULL, -1) >= 0);
    CHECK_EQ(pto_scope_end(o), 0);
    CHECK_EQ(pto_scope_begin(o), 0);
    pto_tensor ft[1] = {tu_tensor(0, 0, 16)};
    uint8_t ftags[1] = {PTO_OUTPUT};
    pto_task_args fa = {.tensor_count = 1, .tensors = ft, .tags = ftags};
    CHECK(pto_submit_next_level(o, 2, &fa, NULL, -1) >= 0);
    pto_tensor nt[2] = {m, tu_tensor(0, 0, 16)};
    uint8_t ntags[2] = {PTO_INPUT, PTO_OUTPUT};
    pto_task_args na = {.tensor_count = 2, .tensors = nt, .tags = ntags};
    int64_t id = pto_submit_next_level(o, 3, &na, NULL, -1);
    if (id < 0) fprintf(stderr, "dependency_does_not_pin_slab: submit of N failed: %s\n", pto_errmsg());
    CHECK(id >= 0);
    CHECK_EQ(pto_scope_end(o), 0);
    int rc = pto_run_end(w);
    if (rc != 0) fprintf(stderr, "dependency_does_not_pin_slab: pto_run_end: %s\n", pto_errmsg());
    CHECK_EQ(rc, 0);
    pto_stats st;
    pto_worker_stats_get(w, &st);
    CHECK_EQ(st.tasks_live, 0);
    CHECK_EQ(st.rings[1].used_bytes, 0);
    CHECK_EQ(st.rings[1].live_slabs, 0);
    pto_worker_close(w);
    progress(NULL);
}

int main(void)
{
    g_hang_s = (int)env_long("PTO_HANG_S", 120);
    for (int i = 0; i < N_MALLOC; i++) {
        g_mbuf[i] = calloc(1, MAX_BUF_BYTES);
        if (!g_mbuf[i]) return 2;
    }
    g_w = make_worker();
    g_hang_dump = hang_dump;
    pthread_t wd;
    if (pthread_create(&wd, NULL, watchdog, NULL) != 0) return 2;

    RUN(test_disjoint_views);
    RUN(test_overlapping_views);
    RUN(test_no_war);
    RUN(test_no_waw);
    RUN(test_bases_and_nodep);
    RUN(test_self_overlap);
    RUN(test_dependency_does_not_pin_slab);
    RUN(test_random_dag);

    atomic_store(&g_watch_stop, 1);
    pthread_join(wd, NULL);
    pto_worker_close(g_w);
    for (int i = 0; i < N_MALLOC; i++) free(g_mbuf[i]);
    return tu_finish();
}
