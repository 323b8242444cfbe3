/* check.c - check mode: does a task do what its tags say?
 *
 * The engine trusts the tags: an OUTPUT is a pure overwrite, so the
 * TensorMap neither orders it after earlier users of the bytes nor expects
 * the task to read them. A wrong tag therefore fails silently, as a result
 * that is wrong by a different amount each run. Check mode observes instead:
 *
 * The double run (pto_check_call). Every argument region is snapshotted,
 * the OUTPUTs are filled with pattern A and the task runs; the OUTPUTs are
 * saved, the INPUTs compared with their snapshot (a change: it wrote an
 * INPUT), everything it may write restored, the OUTPUTs filled with pattern
 * B and the task runs again. An OUTPUT element that still holds A after the
 * first run and B after the second was never written (incomplete OUTPUT, a
 * warning; it gets its prior contents back). One that differs otherwise
 * depends on something that changed between the runs: a third run with A
 * tells the two causes apart, since a function of its inputs and of the
 * OUTPUT's prior contents gives the first run's result again (it read the
 * OUTPUT, an error), and anything else is not a function of its inputs at
 * all (a warning). Arguments that overlap another argument are only
 * restored, never filled or judged: their bytes have two tags.
 *
 * The submit check (pto_check_submit) keeps, per run, the accesses of its
 * tasks, finished or not, and the DAG their tags imply; a new OUTPUT (or
 * INOUT, against readers) over bytes an earlier task uses is reported
 * unless that task is among the new task's producers, directly or
 * transitively (then the DAG orders them). Below, "the submit check". */
#include "check.h"
#include "common.h"
#include "mailbox.h"
#include "orchestrator.h"
#include "ring.h"
#include "run.h"
#include "worker.h"
#include "shm.h"
#include "worker_manager.h"
#include "slot.h"

#include <inttypes.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAT_A 0x5a
#define PAT_B 0xa5

static bool is_out(uint8_t tag) { return tag == PTO_OUTPUT || tag == PTO_OUTPUT_EXISTING; }
static bool may_write(uint8_t tag) { return tag != PTO_INPUT; }

static const char *tag_upper(uint8_t tag)
{
    static const char *const names[] = {"INPUT", "OUTPUT", "INOUT", "OUTPUT_EXISTING", "NO_DEP"};
    return tag <= PTO_NO_DEP ? names[tag] : "?";
}

/* One argument's bytes and what the checks do with them. */
typedef struct region {
    unsigned char *p;
    uint64_t n, esz;
    unsigned char *snap;   /* before the first run */
    unsigned char *first;  /* after the first run (judged OUTPUTs and INOUTs) */
    bool judged;           /* an OUTPUT filled and compared */
    bool overlaps;         /* shares bytes with another argument */
} region;

typedef struct ccall {
    pto_leaf_fn fn;
    void *ctx;
    uint64_t callable;
    const pto_args_view *args;
    const pto_call_config *cfg;
    const uint8_t *tags;
    region *r;
    int32_t n;
    bool protect;          /* PROCESS mode, in a plain child: page protection around each run */
    bool warn;             /* check = "warn": findings are warnings */
    bool outside;          /* the last run() failed for a write outside the arguments */
} ccall;

/* ---- page protection (PROCESS mode, in the child) ----
 * While a checked task runs, the shared tensor memory and the heap rings
 * are read-only in this process except for the pages holding its writable
 * arguments. The first write elsewhere faults; the handler notes the page,
 * makes it writable and returns, so the task runs to its end (no longjmp
 * out of a Lua sub) and fails afterwards. A fault anywhere else gets the
 * previous action back and recurs: crashes stay crashes.
 *
 * mprotect costs in proportion to the pages it touches (~0.3 ms for 40 MB
 * in use), so the areas stay read-only between checked tasks and only the
 * arguments' pages open and close per task; an area is protected as far as
 * the parent has handed memory out (its top), and grows with it. The
 * parent's mailbox flag 2 (an unchecked run follows a checked one) lifts
 * the protection. */

#define MAX_FAULT_PAGES 64

typedef struct area {
    uintptr_t lo, hi;      /* hi: protected up to here */
    int ring;              /* -1: the shared tensor memory */
} area;

static struct {
    area a[1 + PTO_MAX_RING_DEPTH];
    int n;
    bool on;               /* the areas are read-only now */
    uintptr_t page;
    struct sigaction old;
    volatile sig_atomic_t nfaults;
    volatile uintptr_t fault;                 /* the first address of this run */
    volatile uintptr_t pages[MAX_FAULT_PAGES];
} P;

static const area *area_of(uintptr_t x)
{
    for (int i = 0; i < P.n; i++)
        if (x >= P.a[i].lo && x < P.a[i].hi) return &P.a[i];
    return NULL;
}

static void on_segv(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    uintptr_t x = (uintptr_t)si->si_addr;
    if (P.on && si->si_code == SEGV_ACCERR && area_of(x)) {
        uintptr_t pg = x & ~(P.page - 1);
        if (!P.fault) P.fault = x;
        if (P.nfaults < MAX_FAULT_PAGES) P.pages[P.nfaults] = pg;
        P.nfaults++;
        mprotect((void *)pg, P.page, PROT_READ | PROT_WRITE);
        return;
    }
    sigaction(SIGSEGV, &P.old, NULL);
    if (si->si_code <= 0) raise(sig);   /* sent, not a fault: returning would not repeat it */
}

static void set_prot(uintptr_t lo, uintptr_t hi, int prot)
{
    if (hi > lo) mprotect((void *)lo, hi - lo, prot);
}

/* Protect every area up to its current top (mb's: the parent's view is current, this child's copy
 * of the allocators is as old as the fork); false if this child may not (it hosts a Worker). */
static bool protect_areas(const pto_mailbox *mb)
{
    uintptr_t base;
    uint64_t stale;
    if (!pto_shm_reservation(&base, &stale)) return false;
    if (!P.page) P.page = (uintptr_t)sysconf(_SC_PAGESIZE);
    area want[1 + PTO_MAX_RING_DEPTH];
    int n = 0;
    want[n++] = (area){base, base + pto_align_up(mb->check_shm_top, P.page), -1};
    for (int r = 0; r < PTO_MAX_RING_DEPTH; r++)
        if (mb->check_ring_base[r])
            want[n++] = (area){(uintptr_t)mb->check_ring_base[r],
                               (uintptr_t)mb->check_ring_base[r] + pto_align_up(mb->check_ring_size[r], P.page), r};
    for (int i = 0; i < n; i++) {
        const area *had = NULL;
        for (int k = 0; P.on && k < P.n; k++)
            if (P.a[k].lo == want[i].lo) had = &P.a[k];
        set_prot(had && had->hi < want[i].hi ? had->hi : had ? want[i].hi : want[i].lo, want[i].hi, PROT_READ);
        if (had && had->hi > want[i].hi) want[i].hi = had->hi;   /* never shrinks */
    }
    memcpy(P.a, want, sizeof want);
    P.n = n;
    if (!P.on) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_segv;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSEGV, &sa, &P.old);
        P.on = true;
    }
    return true;
}

/* Lift the protection (an unchecked task follows). */
static void unprotect_areas(void)
{
    if (!P.on) return;
    P.on = false;
    sigaction(SIGSEGV, &P.old, NULL);
    for (int i = 0; i < P.n; i++) set_prot(P.a[i].lo, P.a[i].hi, PROT_READ | PROT_WRITE);
}

/* Open (prot RW) or close (RO) the pages of the task's writable arguments. */
static void args_pages(ccall *c, int prot)
{
    for (int32_t k = 0; k < c->n; k++) {
        const region *r = &c->r[k];
        if (!r->p || !may_write(c->tags[k]) || !area_of((uintptr_t)r->p)) continue;
        set_prot((uintptr_t)r->p & ~(P.page - 1), pto_align_up((uintptr_t)r->p + r->n, P.page), prot);
    }
}

/* Close again what faults opened during the task. */
static void reclose_faults(void)
{
    if (P.nfaults > MAX_FAULT_PAGES) {
        for (int i = 0; i < P.n; i++) set_prot(P.a[i].lo, P.a[i].hi, PROT_READ);
    } else {
        for (int i = 0; i < P.nfaults; i++) set_prot(P.pages[i], P.pages[i] + P.page, PROT_READ);
    }
    P.nfaults = 0;
}

/* "wrote address 0x... in heap ring 1 (offset 4096) ..." for a fault at x. */
static void outside_msg(ccall *c, uintptr_t x, char *err, size_t errlen)
{
    const area *a = area_of(x);
    char where[96];
    if (a && a->ring >= 0)
        snprintf(where, sizeof where, "heap ring %d, offset %" PRIu64, a->ring, (uint64_t)(x - a->lo));
    else
        snprintf(where, sizeof where, "shared tensor memory");
    snprintf(err, errlen, "check: wrote address 0x%" PRIxPTR " (%s), which none of its %d arguments covers: it "
             "wrote a tensor it did not declare (compare the address with your tensors' .address); pass it as an "
             "argument tagged INOUT or OUTPUT", x, where, c->n);
}

static bool ranges_overlap(const region *a, const region *b)
{
    return a->p < b->p + b->n && b->p < a->p + a->n;
}

/* "16×16 f32 at element 256" */
static void describe(char *buf, size_t cap, const pto_tensor *t)
{
    size_t k = 0;
    for (int d = 0; d < t->ndims && k < cap; d++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%" PRIu32, d ? "\xc3\x97" : "", t->shape[d]);
    if (t->ndims == 0 && k < cap) k += (size_t)snprintf(buf + k, cap - k, "scalar");
    const char *dt = pto_dtype_name(t->dtype);
    size_t esz = pto_dtype_size(t->dtype);
    if (k < cap)
        snprintf(buf + k, cap - k, " %s at element %" PRIu64, dt ? dt : "?", esz ? t->offset / esz : t->offset);
}

/* Index of the first element of r whose bytes differ between x and y, or UINT64_MAX. */
static uint64_t first_diff(const region *r, const unsigned char *x, const unsigned char *y)
{
    if (memcmp(x, y, r->n) == 0) return UINT64_MAX;
    for (uint64_t i = 0; i < r->n; i++)
        if (x[i] != y[i]) return i / r->esz;
    return UINT64_MAX;
}

static bool all_bytes(const unsigned char *p, uint64_t n, unsigned char v)
{
    for (uint64_t i = 0; i < n; i++)
        if (p[i] != v) return false;
    return true;
}

/* Put back what the task may have written and fill the judged OUTPUTs with pat. */
static void reset(ccall *c, unsigned char pat)
{
    for (int32_t i = 0; i < c->n; i++) {
        region *r = &c->r[i];
        if (!r->p || !may_write(c->tags[i])) continue;
        if (r->judged) memset(r->p, pat, r->n);
        else memcpy(r->p, r->snap, r->n);
    }
}

/* A fault in an INPUT's bytes is the INPUT check's to report (it names the argument). */
static bool in_an_input(const ccall *c, uintptr_t x)
{
    for (int32_t k = 0; k < c->n; k++) {
        const region *r = &c->r[k];
        if (r->p && c->tags[k] == PTO_INPUT && x >= (uintptr_t)r->p && x < (uintptr_t)r->p + r->n) return true;
    }
    return false;
}

static int run(ccall *c, char *err, size_t errlen)
{
    err[0] = 0;
    if (c->protect) P.fault = 0;   /* P is the child's alone: THREAD-mode workers never touch it */
    c->outside = false;
    int rc = c->fn(c->ctx, c->callable, c->args, c->cfg, err, errlen);
    if (c->protect && P.fault && !in_an_input(c, P.fault)) {
        outside_msg(c, P.fault, err, errlen);
        c->outside = true;
        return 1;
    }
    return rc;
}

/* check = "warn": the finding in err ("check: ...") becomes "check: warning: ...", and the task
 * runs once more from every argument's bytes as they were before the checks, so that it leaves
 * what it would have left unchecked (a read OUTPUT then reads its real prior contents). Returns
 * that run's result: a failure there is the task's own, with its own message. */
static int as_warning(ccall *c, char *err, size_t errlen)
{
    char finding[1024];
    snprintf(finding, sizeof finding, "%s", strncmp(err, "check: ", 7) == 0 ? err + 7 : err);
    for (int32_t i = 0; i < c->n; i++)   /* all were snapshotted from the same bytes: order does not matter */
        if (c->r[i].p) memcpy(c->r[i].p, c->r[i].snap, c->r[i].n);
    /* Unwatched: a write outside the arguments was reported already, and the pages it faulted on
     * stay writable until this task's end. */
    err[0] = 0;
    int rc = c->fn(c->ctx, c->callable, c->args, c->cfg, err, errlen);
    if (rc != 0) return rc;
    snprintf(err, errlen, "check: warning: %s", finding);
    return 0;
}

static void free_regions(ccall *c)
{
    for (int32_t i = 0; i < c->n; i++) {
        free(c->r[i].snap);
        free(c->r[i].first);
    }
    free(c->r);
}

/* Snapshot every argument; false if a region is unusable (the task then runs unchecked). */
static bool prepare(ccall *c)
{
    c->r = pto_xcalloc((size_t)(c->n ? c->n : 1), sizeof *c->r);
    for (int32_t i = 0; i < c->n; i++) {
        const pto_tensor *t = &c->args->tensors[i];
        region *r = &c->r[i];
        r->esz = pto_dtype_size(t->dtype);
        r->n = pto_tensor_nbytes(t);
        if (!t->base || !r->n || !r->esz) {
            r->n = 0;
            continue;
        }
        r->p = (unsigned char *)(uintptr_t)(t->base + t->offset);
        r->snap = pto_xmalloc(r->n);
        memcpy(r->snap, r->p, r->n);
    }
    for (int32_t i = 0; i < c->n; i++)
        for (int32_t j = 0; j < c->n; j++)
            if (i != j && c->r[i].p && c->r[j].p && ranges_overlap(&c->r[i], &c->r[j])) c->r[i].overlaps = true;
    for (int32_t i = 0; i < c->n; i++) c->r[i].judged = c->r[i].p && is_out(c->tags[i]) && !c->r[i].overlaps;
    return true;
}

static void save_first(ccall *c)
{
    for (int32_t i = 0; i < c->n; i++) {
        region *r = &c->r[i];
        if (!r->p || !may_write(c->tags[i])) continue;
        r->first = pto_xmalloc(r->n);
        memcpy(r->first, r->p, r->n);
    }
}

/* An INPUT that changed (and shares no bytes with a writable argument): its index, else -1. */
static int32_t wrote_input(ccall *c, uint64_t *elem)
{
    for (int32_t i = 0; i < c->n; i++) {
        region *r = &c->r[i];
        if (!r->p || c->tags[i] != PTO_INPUT || r->overlaps) continue;
        uint64_t e = first_diff(r, r->snap, r->p);
        if (e != UINT64_MAX) {
            *elem = e;
            return i;
        }
    }
    return -1;
}

typedef struct verdict {
    int32_t differ;        /* first judged OUTPUT whose written values differ between the runs, or -1 */
    uint64_t differ_elem;
    int32_t unwritten;     /* first judged OUTPUT with an element never written, or -1 */
    uint64_t unwritten_elem, unwritten_count;
    int32_t inout_differ;  /* first INOUT / NO_DEP that differs between the runs, or -1 */
    uint64_t inout_elem;
} verdict;

/* Compare the second run with the first; unwritten OUTPUT elements get their prior contents back. */
static verdict compare(ccall *c)
{
    verdict v = {-1, 0, -1, 0, 0, -1, 0};
    for (int32_t i = 0; i < c->n; i++) {
        region *r = &c->r[i];
        if (!r->p || !r->first) continue;
        if (!r->judged) {
            uint64_t e = first_diff(r, r->first, r->p);
            if (e != UINT64_MAX && v.inout_differ < 0) v.inout_differ = i, v.inout_elem = e;
            continue;
        }
        uint64_t missing = 0;
        for (uint64_t e = 0; e < r->n / r->esz; e++) {
            const unsigned char *a = r->first + e * r->esz, *b = r->p + e * r->esz;
            if (memcmp(a, b, r->esz) == 0) continue;
            if (all_bytes(a, r->esz, PAT_A) && all_bytes(b, r->esz, PAT_B)) {
                if (!missing++ && v.unwritten < 0) v.unwritten = i, v.unwritten_elem = e;
                memcpy(r->p + e * r->esz, r->snap + e * r->esz, r->esz);
            } else if (v.differ < 0) {
                v.differ = i, v.differ_elem = e;
            }
        }
        if (v.unwritten == i) v.unwritten_count = missing;
    }
    return v;
}

/* After a third run with pattern A: true if OUTPUT i came out as in the first run (so it is a function of
 * the OUTPUT's prior contents). */
static bool same_as_first(ccall *c, int32_t i)
{
    region *r = &c->r[i];
    return memcmp(r->first, r->p, r->n) == 0;
}

/* After a run with pattern pat: elements the first run left unwritten get their prior contents back. */
static void restore_unwritten(ccall *c, unsigned char pat)
{
    for (int32_t i = 0; i < c->n; i++) {
        region *r = &c->r[i];
        if (!r->judged) continue;
        for (uint64_t e = 0; e < r->n / r->esz; e++) {
            uint64_t o = e * r->esz;
            if (all_bytes(r->first + o, r->esz, PAT_A) && all_bytes(r->p + o, r->esz, pat))
                memcpy(r->p + o, r->snap + o, r->esz);
        }
    }
}

static size_t append(char *err, size_t errlen, size_t k, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static size_t append(char *err, size_t errlen, size_t k, const char *fmt, ...)
{
    if (k >= errlen) return k;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(err + k, errlen - k, fmt, ap);
    va_end(ap);
    return m < 0 ? k : k + (size_t)m;
}

/* The warnings of a successful double run into err ("" if none). */
static void warnings(ccall *c, const verdict *v, bool nondet_out, char *err, size_t errlen)
{
    char d[160];
    size_t k = 0;
    err[0] = 0;
    if (v->unwritten >= 0) {
        const region *r = &c->r[v->unwritten];
        describe(d, sizeof d, &c->args->tensors[v->unwritten]);
        k = append(err, errlen, k,
                   "check: warning: left %" PRIu64 " of the %" PRIu64 " elements of argument %d (%s) tagged %s "
                   "unwritten (first: element %" PRIu64 " of the view): write all of it, or tag it INOUT if the "
                   "rest must keep its contents",
                   v->unwritten_count, r->n / r->esz, v->unwritten + 1, d, tag_upper(c->tags[v->unwritten]),
                   v->unwritten_elem);
    }
    int32_t nd = nondet_out ? v->differ : v->inout_differ;
    if (nd >= 0) {
        describe(d, sizeof d, &c->args->tensors[nd]);
        k = append(err, errlen, k,
                   "%scheck: warning: two runs with the same inputs wrote different values to argument %d (%s, "
                   "element %" PRIu64 " of the view) although it read no OUTPUT: the task is not a function of its "
                   "inputs",
                   k ? "\n" : "", nd + 1, d, nondet_out ? v->differ_elem : v->inout_elem);
    }
}

int pto_check_call(pto_leaf_fn fn, void *ctx, uint64_t callable, const pto_args_view *args, const uint8_t *tags,
                   const pto_call_config *cfg, char *err, size_t errlen, const pto_mailbox *mb, bool warn)
{
    ccall c = {fn, ctx, callable, args, cfg, tags, NULL, args->tensor_count, false, warn, false};
    if (mb && mb->check == 2) unprotect_areas();
    if ((mb && mb->check == 2) || !tags || args->tensor_count > PTO_CHECK_MAX_TAGS || !prepare(&c)) {
        free(c.r);
        return run(&c, err, errlen);
    }
    if (mb && protect_areas(mb)) {
        c.protect = true;
        args_pages(&c, PROT_READ | PROT_WRITE);
    }
    char d[160];
    reset(&c, PAT_A);
    int rc = run(&c, err, errlen);
    if (rc != 0) {
        if (c.outside && c.warn) rc = as_warning(&c, err, errlen);
        goto out;
    }
    uint64_t e;
    int32_t i = wrote_input(&c, &e);
    if (i >= 0) {
        describe(d, sizeof d, &args->tensors[i]);
        snprintf(err, errlen, "check: wrote argument %d (%s) tagged INPUT (first changed: element %" PRIu64
                 " of the view): tag it INOUT, or copy it first", i + 1, d, e);
        rc = c.warn ? as_warning(&c, err, errlen) : 1;
        goto out;
    }
    save_first(&c);
    reset(&c, PAT_B);
    rc = run(&c, err, errlen);
    if (rc != 0) {
        char first[512];
        snprintf(first, sizeof first, "%s", err);
        snprintf(err, errlen, "check: the task failed when run a second time with the same inputs, though the first "
                 "run succeeded: %s", first);
        goto out;
    }
    verdict v = compare(&c);
    bool nondet_out = false;
    if (v.differ >= 0) {
        reset(&c, PAT_A);
        rc = run(&c, err, errlen);
        if (rc != 0) goto out;
        if (same_as_first(&c, v.differ)) {
            describe(d, sizeof d, &args->tensors[v.differ]);
            snprintf(err, errlen, "check: read argument %d (%s) tagged %s before writing it (element %" PRIu64
                     " of the view depends on its prior contents): tag it INOUT", v.differ + 1, d,
                     tag_upper(tags[v.differ]), v.differ_elem);
            rc = c.warn ? as_warning(&c, err, errlen) : 1;
            goto out;
        }
        nondet_out = true;
        restore_unwritten(&c, PAT_A);
    }
    warnings(&c, &v, nondet_out, err, errlen);
out:
    err[errlen - 1] = 0;
    if (c.protect) {
        args_pages(&c, PROT_READ);
        reclose_faults();
    }
    free_regions(&c);
    return rc;
}

/* ---- the submit check ---- */

/* Whether a new OUTPUT is ordered after an earlier access is a question
 * about the DAG the tags imply, not about timing: an earlier task that
 * happens to have finished by the submit is just as unordered (the next
 * run may find it still running). So the log keeps the run's accesses,
 * finished or not, and the run's own DAG by task id: the engine's edges
 * cannot serve, since they skip producers that already finished. An
 * access leaves the log only when nothing later can be unordered with it:
 * a later write that covers it and is ordered after it, fresh heap-ring
 * memory over it, or a point where the orchestration saw it finish (a
 * drain, the prompt's next line: pto_check_observed). */

typedef struct use {
    pto_slot *s;           /* valid while s->id == id (a reclaimed slot is reused) */
    int64_t id;
    uint64_t lo, hi;
    uint64_t callable;     /* for the message, once s may be reused */
    int8_t kind;
    bool writes;
} use;

/* At most this many accesses are kept: beyond it the oldest are forgotten,
 * which can only miss a report (never make one up, as the walk never needs
 * a task older than every access it judges). */
#define CHECK_WINDOW 2048

struct pto_check_log {
    use *a;                /* in id order */
    int32_t n, cap;
    /* The run's DAG: the producers (ids) of task base + i are pids[pfirst[i] .. pfirst[i + 1]). */
    int64_t base;          /* id of task 0 of the arrays; -1 while empty */
    int32_t ntasks, pfirst_cap;
    int32_t *pfirst;
    int64_t *pids;
    int32_t npids, pids_cap;
    uint32_t *seen;        /* per task: the walk's epoch when it reached it */
    int32_t seen_cap;
    uint32_t epoch;
    int64_t *stack;        /* the walk's */
    int32_t nstack, stack_cap;
    int64_t *pend;         /* producers of the task being submitted */
    int32_t npend, pend_cap;
};

pto_check_log *pto_check_log_new(void)
{
    pto_check_log *lg = pto_xcalloc(1, sizeof(pto_check_log));
    lg->base = -1;
    return lg;
}

void pto_check_log_free(pto_check_log *lg)
{
    if (!lg) return;
    free(lg->a);
    free(lg->pfirst);
    free(lg->pids);
    free(lg->seen);
    free(lg->stack);
    free(lg->pend);
    free(lg);
}

void pto_check_log_clear(pto_check_log *lg)
{
    if (!lg) return;
    lg->n = 0;
    lg->base = -1;
    lg->ntasks = lg->npids = 0;
}

static bool unfinished(const pto_slot *s, int64_t id)
{
    if (s->id != id) return false;   /* reclaimed and reused */
    int32_t st = atomic_load_explicit(&s->state, memory_order_acquire);
    return st == PTO_TASK_PENDING || st == PTO_TASK_READY || st == PTO_TASK_RUNNING;
}

/* Keep the accesses for which keep(x, arg) holds, in order. */
static void filter(pto_check_log *lg, bool (*keep)(const use *, const void *), const void *arg)
{
    int32_t k = 0;
    for (int32_t i = 0; i < lg->n; i++)
        if (keep(&lg->a[i], arg)) lg->a[k++] = lg->a[i];
    lg->n = k;
}

static bool keep_unfinished(const use *x, const void *arg)
{
    (void)arg;
    return unfinished(x->s, x->id);
}

void pto_check_observed_orch(pto_orch *o)
{
    if (o->check) filter(o->check, keep_unfinished, NULL);
}

void pto_check_observed(pto_worker *w)
{
    if (w) pto_check_observed_orch(&w->orch);
}

/* Absolute byte ranges [lo, hi): what an argument covers, and what a logged access used. */
typedef struct span { uint64_t lo, hi; } span;

static span bytes_of(const pto_tensor *t)
{
    uint64_t lo = t->base + t->offset;
    return (span){lo, lo + pto_tensor_nbytes(t)};
}

static bool overlaps(span r, const use *x) { return x->lo < r.hi && r.lo < x->hi; }

static bool keep_outside(const use *x, const void *arg) { return !overlaps(*(const span *)arg, x); }

void pto_check_fresh(pto_orch *o, uint64_t lo, uint64_t bytes)
{
    span r = {lo, lo + bytes};
    if (o->check) filter(o->check, keep_outside, &r);
}

static void push(pto_check_log *lg, int64_t id)
{
    pto_grow((void **)&lg->stack, &lg->stack_cap, lg->nstack + 1, sizeof *lg->stack);
    lg->stack[lg->nstack++] = id;
}

/* Mark every ancestor of the task being submitted (producers in lg->pend) down to id `floor`. */
static void mark_ancestors(pto_check_log *lg, int64_t floor)
{
    if (++lg->epoch == 0) {   /* wrapped: stale marks could collide */
        memset(lg->seen, 0, sizeof *lg->seen * (size_t)lg->seen_cap);
        lg->epoch = 1;
    }
    lg->nstack = 0;
    for (int32_t i = 0; i < lg->npend; i++) push(lg, lg->pend[i]);
    while (lg->nstack > 0) {
        int64_t p = lg->stack[--lg->nstack];
        if (p < floor || p < lg->base || p - lg->base >= lg->ntasks) continue;
        int32_t i = (int32_t)(p - lg->base);
        if (lg->seen[i] == lg->epoch) continue;
        lg->seen[i] = lg->epoch;
        for (int32_t k = lg->pfirst[i]; k < lg->pfirst[i + 1]; k++) push(lg, lg->pids[k]);
    }
}

static bool is_ancestor(const pto_check_log *lg, int64_t id)
{
    return id >= lg->base && id - lg->base < lg->ntasks && lg->seen[id - lg->base] == lg->epoch;
}

static void name_of(pto_orch *o, int32_t kind, uint64_t callable, char *buf, size_t cap)
{
    char nm[96];
    if (pto_worker_callable_name_get(o->w, kind, callable, nm, sizeof nm) >= 0)
        snprintf(buf, cap, "callable '%s'", nm);
    else
        snprintf(buf, cap, "callable %" PRIu64, callable);
}

/* The new task's producers as its tags imply them: every earlier write its INPUTs and INOUTs overlap. */
static void collect_pend(pto_check_log *lg, const pto_task_args *args, int32_t n)
{
    lg->npend = 0;
    for (int32_t m = 0; m < n; m++) {
        const pto_task_args *a = &args[m];
        for (int32_t i = 0; i < a->tensor_count; i++) {
            const pto_tensor *t = &a->tensors[i];
            if ((a->tags[i] != PTO_INPUT && a->tags[i] != PTO_INOUT) || !t->base) continue;
            span r = bytes_of(t);
            for (int32_t k = 0; k < lg->n; k++) {
                const use *x = &lg->a[k];
                if (!x->writes || !overlaps(r, x)) continue;
                pto_grow((void **)&lg->pend, &lg->pend_cap, lg->npend + 1, sizeof *lg->pend);
                lg->pend[lg->npend++] = x->id;
            }
        }
    }
}

/* Say that argument i (t, tagged tag) of the task being submitted writes bytes x uses, unordered:
 * false (raise) or, under check = "warn", true after a warning. The fix differs: a writer is waited
 * for by INOUT, a reader by nothing the tags of these bytes can say. */
static bool report(pto_orch *o, int32_t kind, uint64_t callable, int64_t id, int32_t i, const pto_tensor *t,
                   uint8_t tag, const use *x)
{
    char mine[128], theirs[128], d[160], msg[1024];
    name_of(o, kind, callable, mine, sizeof mine);
    name_of(o, x->kind, x->callable, theirs, sizeof theirs);
    describe(d, sizeof d, t);
    int len = snprintf(msg, sizeof msg, "check: run %" PRId64 ", task %" PRId64 " (%s) tags argument %d (%s) %s, %s that is not "
                       "ordered after task %" PRId64 " (%s), which %s those bytes and is not among its producers: ",
                       o->cur_run ? o->cur_run->id : o->w->runs, id, mine, i + 1, d, tag_upper(tag),
                       is_out(tag) ? "an overwrite" : "a write", x->id, theirs, x->writes ? "writes" : "reads");
    snprintf(msg + len, sizeof msg - (size_t)len, "%s",
             x->writes ? "tag it INOUT (it then waits for the last writer), or write into a fresh tensor"
                       : "no tag waits for a reader, so order it after that task (take one of that task's "
                         "outputs as an INPUT), or write into a fresh tensor");
    if (!o->check_warn) {
        pto_set_error("%s", msg);
        return false;
    }
    /* check = "warn": said as the task warnings are (scheduler.c), once per task; it is submitted */
    fprintf(stderr, "ptolua: check: warning: %s\n", msg + 7);
    return true;
}

bool pto_check_submit(pto_orch *o, int32_t kind, uint64_t callable, const pto_task_args *args, int32_t n, int64_t id)
{
    pto_check_log *lg = o->check;
    collect_pend(lg, args, n);
    bool marked = false;
    for (int32_t m = 0; m < n; m++) {
        const pto_task_args *a = &args[m];
        for (int32_t i = 0; i < a->tensor_count; i++) {
            const pto_tensor *t = &a->tensors[i];
            uint8_t tag = a->tags[i];
            /* An unset OUTPUT is fresh memory; an INOUT waits for every writer of its bytes, not their readers. */
            if ((!is_out(tag) && tag != PTO_INOUT) || !t->base) continue;
            span r = bytes_of(t);
            for (int32_t k = 0; k < lg->n; k++) {
                const use *x = &lg->a[k];
                if (!overlaps(r, x) || (tag == PTO_INOUT && x->writes)) continue;
                if (!marked) {
                    mark_ancestors(lg, lg->a[0].id);   /* nothing older is judged */
                    marked = true;
                }
                if (!is_ancestor(lg, x->id)) return report(o, kind, callable, id, i, t, tag, x);
            }
        }
    }
    return true;
}

/* Task id's row of the DAG, with the producers collected at its submit (ids between the last row and
 * it, orch:alloc's, get empty rows). */
static void record_task(pto_check_log *lg, int64_t id)
{
    if (lg->base < 0) lg->base = id;
    if (id - lg->base >= INT32_MAX / 2) {   /* a run of a billion checked tasks: start over rather than wrap */
        pto_check_log_clear(lg);
        lg->base = id;
    }
    int32_t row = (int32_t)(id - lg->base);
    pto_grow((void **)&lg->pfirst, &lg->pfirst_cap, row + 2, sizeof *lg->pfirst);
    pto_grow((void **)&lg->seen, &lg->seen_cap, row + 1, sizeof *lg->seen);
    if (lg->ntasks == 0) lg->pfirst[0] = 0;
    for (; lg->ntasks < row; lg->ntasks++) lg->pfirst[lg->ntasks + 1] = lg->npids;
    pto_grow((void **)&lg->pids, &lg->pids_cap, lg->npids + lg->npend, sizeof *lg->pids);
    if (lg->npend) memcpy(lg->pids + lg->npids, lg->pend, sizeof *lg->pids * (size_t)lg->npend);
    lg->npids += lg->npend;
    lg->pfirst[row + 1] = lg->npids;
    lg->seen[row] = 0;
    lg->ntasks = row + 1;
    lg->npend = 0;
}

typedef struct cover { span r; bool reads_too; } cover;

/* A write ordered after the accesses it covers stands for them: a later overwrite ordered after it is
 * ordered after them. An INOUT is ordered after the writes it covers but not after their readers. */
static bool keep_uncovered(const use *x, const void *arg)
{
    const cover *c = arg;
    return !(c->r.lo <= x->lo && x->hi <= c->r.hi && (x->writes || c->reads_too));
}

void pto_check_record(pto_orch *o, pto_slot *s)
{
    pto_check_log *lg = o->check;
    record_task(lg, s->id);
    for (int32_t m = 0; m < s->group_size; m++) {
        const pto_member *mb = &s->members[m];
        for (int32_t i = 0; i < mb->tensor_count; i++) {
            const pto_tensor *t = &mb->tensors[i];
            if (mb->tags[i] == PTO_NO_DEP || !t->base) continue;
            span r = bytes_of(t);
            bool writes = mb->tags[i] != PTO_INPUT;
            if (writes) {
                cover c = {r, is_out(mb->tags[i])};
                filter(lg, keep_uncovered, &c);
            }
            if (lg->n == CHECK_WINDOW) {   /* forget the oldest quarter */
                int32_t drop = CHECK_WINDOW / 4;
                memmove(lg->a, lg->a + drop, sizeof *lg->a * (size_t)(lg->n - drop));
                lg->n -= drop;
            }
            pto_grow((void **)&lg->a, &lg->cap, lg->n + 1, sizeof *lg->a);
            lg->a[lg->n++] = (use){s, s->id, r.lo, r.hi, s->callable, s->kind, writes};
        }
    }
}

/* ---- switching it on ---- */

const uint8_t *pto_check_tags_of(const pto_slot *s) { return s->group_size == 1 ? s->members[0].tags : NULL; }

void pto_check_run_begin(pto_orch *o, pto_worker_manager *wm, int32_t mode)
{
    bool on = mode != 0;
    o->check_warn = mode == PTO_CHECK_WARN;
    wm->check_rings = o->rings;
    if (on && !o->check_log) o->check_log = pto_check_log_new();
    pto_check_log_clear(o->check_log);   /* ids restart with the run */
    o->check = on ? o->check_log : NULL;
    atomic_store_explicit(&wm->check, mode, memory_order_relaxed);
}

void pto_check_stage(pto_mailbox *mb, const pto_worker_manager *wm, const uint8_t *tags, int32_t n)
{
    bool on = atomic_load_explicit(&wm->check, memory_order_relaxed) && tags && n <= PTO_CHECK_MAX_TAGS;
    /* 2: the child lifts the page protection a checked task left, then runs this one as usual. */
    mb->check = on ? 1 : mb->check == 1 ? 2 : 0;
    if (!on) return;
    mb->check_warn = atomic_load_explicit(&wm->check, memory_order_relaxed) == PTO_CHECK_WARN;
    /* Only what has been handed out: mprotect costs ~0.2 ms per GiB of mostly empty reservation. */
    for (int r = 0; r < PTO_MAX_RING_DEPTH; r++) {
        mb->check_ring_base[r] = (uint64_t)(uintptr_t)wm->check_rings[r].base;
        mb->check_ring_size[r] = wm->check_rings[r].base ? atomic_load_explicit(&wm->check_rings[r].top, memory_order_relaxed) : 0;
    }
    uintptr_t base;
    pto_shm_reservation(&base, &mb->check_shm_top);
    mb->check_ntags = (uint32_t)n;
    if (n) memcpy(mb->check_tags, tags, (size_t)n);
}

const uint8_t *pto_check_tags(const pto_mailbox *mb, const pto_args_view *args)
{
    return mb->check_ntags == (uint32_t)args->tensor_count ? mb->check_tags : NULL;
}

_Static_assert(sizeof(((pto_mailbox *)0)->check_tags) == PTO_CHECK_MAX_TAGS, "the mailbox carries every tag");

int pto_check_leaf_run(void *ctx, uint64_t callable, const pto_args_view *args, const pto_call_config *cfg, char *err,
                       size_t errlen)
{
    const pto_check_leaf *cl = ctx;
    return pto_check_call(cl->fn, cl->ctx, callable, args, cl->tags, cfg, err, errlen, cl->mb, cl->warn);
}
