#include "mailbox.h"
#include "shm.h"
#include "common.h"
#include "check.h"

#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define SPIN_FLOOR_NS 2000u    /* a budget below this would catch nothing */

void pto_mb_spin_init(pto_mb_spin *s, uint32_t max_ns)
{
    /* Start optimistic: the first hand-offs of a run are usually short. */
    s->max_ns = max_ns;
    s->ewma_ns = max_ns / 4;
    s->wake_ns = max_ns / 4;
}

int64_t pto_mb_spin_budget(const pto_mb_spin *s)
{
    if (s->ewma_ns > s->max_ns) return 0;
    uint64_t b = 2ull * s->ewma_ns + SPIN_FLOOR_NS;
    if (b < s->wake_ns) b = s->wake_ns;
    return (int64_t)(b < s->max_ns ? b : s->max_ns);
}

void pto_mb_spin_woke(pto_mb_spin *s, uint64_t woke_ns)
{
    uint64_t w = woke_ns < 4ull * s->max_ns ? woke_ns : 4ull * s->max_ns;
    s->wake_ns = (uint32_t)((int64_t)s->wake_ns + ((int64_t)w - (int64_t)s->wake_ns) / 4);
}

void pto_mb_spin_observe(pto_mb_spin *s, uint64_t waited_ns)
{
    /* Clamp so one long wait (a slow task, a descheduled peer) moves the
     * average past max at most, and fast waits bring it back in a few rounds. */
    uint64_t w = waited_ns < 4ull * s->max_ns ? waited_ns : 4ull * s->max_ns;
    int64_t d = (int64_t)w - (int64_t)s->ewma_ns;
    s->ewma_ns = (uint32_t)((int64_t)s->ewma_ns + d / 8);
}

/* Spin up to spin_ns for has(arg). A hand-off between two running cores
 * takes well under a microsecond, so look every few pauses (~100 ns). Offer
 * the core every 4 looks: on a busy 2-core machine the peer we wait for may
 * be queued on exactly this core, and then the yield interval is the cost
 * of the hand-off (measured: p90 4.7 us at 4 looks, 10 us at 32), while an
 * uncontended sched_yield costs a fraction of a microsecond. */
static bool spin_for(bool (*has)(void *), void *arg, int64_t spin_ns)
{
    if (has(arg)) return true;
    if (spin_ns <= 0) return false;
    uint64_t t0 = pto_now_ns();
    for (uint32_t i = 1;; i++) {
        for (int k = 0; k < 4; k++) pto_cpu_relax();
        if (has(arg)) return true;
        if ((i & 3) == 0) sched_yield();
        if ((i & 15) == 0 && (int64_t)(pto_now_ns() - t0) >= spin_ns) return false;
    }
}

pto_mailbox *pto_mb_map(void)
{
    void *p = mmap(NULL, sizeof(pto_mailbox), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        pto_set_error("cannot map a %zu-byte mailbox (mmap: %s)", sizeof(pto_mailbox), strerror(errno));
        return NULL;
    }
    return p;   /* zero-filled: state EMPTY, events idle */
}

void pto_mb_unmap(pto_mailbox *mb)
{
    if (mb) munmap(mb, sizeof *mb);
}

bool pto_mb_cas(pto_mailbox *mb, uint32_t from, uint32_t to, uint32_t *seen)
{
    uint32_t s = from;
    bool ok = atomic_compare_exchange_strong_explicit(&mb->state, &s, to, memory_order_acq_rel, memory_order_acquire);
    if (seen) *seen = ok ? to : s;
    return ok;
}

/* ---- parent side ---- */

bool pto_mb_revoke(pto_mailbox *mb, uint32_t seq)
{
    uint32_t want = PTO_CELL_POSTED;
    return atomic_compare_exchange_strong_explicit(&pto_mb_cell_of(mb, seq)->claim, &want, PTO_CELL_REVOKED,
                                                   memory_order_acq_rel, memory_order_acquire);
}

/* A CallConfig's fields and its prefix up to the NUL (NULL src: the
 * defaults). The prefix buffer is 1 KiB and nearly always empty: copied
 * whole, every post dirtied 17 cache lines of the cell that the child had
 * just read, and every serve read them back. */
_Static_assert((offsetof(pto_mb_cell, cfg) + offsetof(pto_call_config, output_prefix)) % 64 == 0,
               "cfg_copy: a cell's CallConfig prefix starts a cache line");

static void cfg_copy(pto_call_config *dst, const pto_call_config *src)
{
    enum { HEAD = offsetof(pto_call_config, output_prefix) };
    size_t n = src ? strnlen(src->output_prefix, sizeof src->output_prefix - 1) : 0;
    if (src) memcpy(dst, src, HEAD);
    else memset(dst, 0, HEAD);
    /* An empty prefix over an empty one is not written: the prefix starts a
     * cache line of its own, which then stays shared with the child instead
     * of crossing between the two cores at every post. */
    if (n == 0 && dst->output_prefix[0] == 0) return;
    if (n) memcpy(dst->output_prefix, src->output_prefix, n);
    dst->output_prefix[n] = 0;
}

int pto_mb_write(pto_mailbox *mb, uint32_t seq, uint64_t callable, const pto_args_view *args,
                 const pto_call_config *cfg, const void *load, uint64_t load_len, bool after_prev)
{
    uint32_t st = pto_mb_state(mb);
    if (st != PTO_MB_IDLE) return (int)st;
    pto_mb_cell *c = pto_mb_cell_of(mb, seq);
    int64_t n = pto_blob_encode(args, c->blob, PTO_MB_BLOB_CAP);
    if (n < 0) {
        pto_set_error("the task's arguments take %zu bytes (%d tensors, %d scalars); a PROCESS-mode mailbox holds at "
                      "most %u bytes (PTO_MB_BLOB_CAP): pass fewer tensors or scalars per task",
                      pto_blob_size(args->tensor_count, args->scalar_count), args->tensor_count, args->scalar_count,
                      PTO_MB_BLOB_CAP);
        return -1;
    }
    c->blob_len = (uint32_t)n;
    c->callable = callable;
    c->load_addr = (uint64_t)(uintptr_t)load;
    c->load_len = load ? load_len : 0;
    c->after_prev = after_prev;
    /* Mostly POSTED already (finish): a store would cost the line. */
    if (atomic_load_explicit(&c->claim, memory_order_relaxed) != PTO_CELL_POSTED)
        atomic_store_explicit(&c->claim, PTO_CELL_POSTED, memory_order_relaxed);
    /* Only a child that may be waiting for this cell reads the stamp (its
     * spin budget learns from it); one busy with earlier cells does not. */
    c->posted_ns = atomic_load_explicit(&mb->done, memory_order_relaxed) == seq ? pto_now_ns() : 0;
    cfg_copy(&c->cfg, cfg);
    return 0;
}

void pto_mb_set_deps(pto_mailbox *mb, uint32_t seq, const pto_mb_deps *deps)
{
    pto_mb_cell *c = pto_mb_cell_of(mb, seq);
    c->done_word = deps->own.word;
    c->done_stamp = deps->own.stamp;
    c->nwaits = deps->nwaits;
    for (uint32_t i = 0; i < deps->nwaits; i++) c->waits[i] = deps->waits[i];
}

void pto_mb_publish(pto_mailbox *mb, uint32_t posted)
{
    /* The release publishes every field of the cells written to the child;
     * seq_cst orders it before the sleeper check in pto_event_notify
     * (Dekker). */
    atomic_store_explicit(&mb->posted, posted, memory_order_seq_cst);
    pto_event_notify(&mb->to_child);
}

int pto_mb_post(pto_mailbox *mb, uint32_t seq, uint64_t callable, const pto_args_view *args,
                const pto_call_config *cfg, const void *load, uint64_t load_len, bool after_prev)
{
    uint32_t st = pto_mb_state(mb);   /* EMPTY is 0 too: tell it from success here */
    if (st != PTO_MB_IDLE) return (int)st;
    int r = pto_mb_write(mb, seq, callable, args, cfg, load, load_len, after_prev);
    if (r == 0) pto_mb_publish(mb, seq + 1);
    return r;
}

typedef struct wait_arg {
    pto_mailbox *mb;
    uint32_t mask;
    bool (*abort)(void *);
    void *arg;
} wait_arg;

static bool parent_has_work(void *p)
{
    wait_arg *a = p;
    return !pto_mb_in(pto_mb_state(a->mb), a->mask) || (a->abort && a->abort(a->arg));
}

/* The parent's wait on to_parent until has(arg): spin, then sleep until
 * the timeout (< 0: none). */
static void parent_wait(pto_mailbox *mb, bool (*has)(void *), void *arg, int64_t spin_ns, int64_t timeout_ns)
{
    if (spin_for(has, arg, spin_ns)) return;
    uint64_t t0 = pto_now_ns();
    /* pto_event_wait may return early: a wake-up meant for the previous
     * round (the peer saw us sleeping then) lands in this one. */
    for (;;) {
        int64_t left = -1;
        if (timeout_ns >= 0) {
            left = timeout_ns - (int64_t)(pto_now_ns() - t0);
            if (left < 0) left = 0;
        }
        if (pto_event_wait(&mb->to_parent, has, arg, 0, left) || left == 0) return;
    }
}

uint32_t pto_mb_wait(pto_mailbox *mb, uint32_t while_mask, bool (*abort)(void *), void *arg, int64_t spin_ns,
                     int64_t timeout_ns)
{
    wait_arg a = {mb, while_mask, abort, arg};
    parent_wait(mb, parent_has_work, &a, spin_ns, timeout_ns);
    return pto_mb_state(mb);
}

typedef struct done_arg {
    pto_mailbox *mb;
    uint32_t seq;
} done_arg;

static bool cell_done(void *p)
{
    done_arg *a = p;
    return pto_mb_done_beyond(a->mb, a->seq) > 0 || pto_mb_state(a->mb) != PTO_MB_IDLE;
}

bool pto_mb_wait_done(pto_mailbox *mb, uint32_t seq, int64_t spin_ns, int64_t timeout_ns)
{
    done_arg a = {mb, seq};
    parent_wait(mb, cell_done, &a, spin_ns, timeout_ns);
    return pto_mb_done_beyond(mb, seq) > 0;
}

/* ---- child side ---- */

void pto_mb_wake_parent(pto_mailbox *mb)
{
    /* One fence for both events: a child pays this after every task. */
    pto_event_notify_pair(&mb->to_parent, mb->bell);
}

int pto_mb_child_start(pto_mailbox *mb, const pto_leaf *leaf)
{
    mb->err[0] = 0;
    int rc = leaf->start ? leaf->start(leaf->ctx, mb->err, PTO_MB_ERR_CAP) : 0;
    if (rc != 0) {
        mb->err[PTO_MB_ERR_CAP - 1] = 0;
        if (!mb->err[0]) snprintf(mb->err, PTO_MB_ERR_CAP, "its start hook returned %d", rc);
        mb->rc = rc;
        return rc;
    }
    mb->rc = 0;
    if (pto_mb_cas(mb, PTO_MB_STARTING, PTO_MB_IDLE, NULL)) pto_mb_wake_parent(mb);
    return 0;
}

static bool child_has_work(void *p)
{
    pto_mailbox *mb = p;
    return atomic_load_explicit(&mb->posted, memory_order_acquire) !=
               atomic_load_explicit(&mb->done, memory_order_relaxed) ||
           pto_mb_state(mb) == PTO_MB_SHUTDOWN;
}

/* A shipped callable lives in the shared arena: refuse anything else, so a
 * corrupt address cannot make the child read unmapped memory. */
static bool load_range_ok(uint64_t addr, uint64_t len)
{
    const char *p = (const char *)(uintptr_t)addr;
    return len > 0 && addr + len > addr && pto_shm_contains(p) && pto_shm_contains(p + len - 1);
}

/* Decode cell c's arguments (the mailbox is untrusted bytes) and install a
 * shipped callable: 0, or the task's failure with the reason in c->err. */
static int unpack(pto_mb_cell *c, const pto_leaf *leaf, pto_args_view *view, pto_call_config *cfg)
{
    char *err = c->err;
    uint64_t callable = c->callable;
    uint32_t len = c->blob_len;
    c->loaded = 0;
    err[0] = 0;
    if (len > PTO_MB_BLOB_CAP || pto_blob_decode(c->blob, len, view) != 0) {
        snprintf(err, PTO_MB_ERR_CAP, "the task's arguments arrived malformed in the mailbox (%" PRIu32 " bytes)", len);
        return 1;
    }
    /* A private copy: the leaf must see a NUL-terminated prefix whatever the bytes say. */
    cfg_copy(cfg, &c->cfg);
    uint64_t addr = c->load_addr, llen = c->load_len;
    if (addr) {
        if (!load_range_ok(addr, llen)) {
            snprintf(err, PTO_MB_ERR_CAP, "callable %" PRIu64 " was shipped with a blob outside shared memory", callable);
            return 1;
        }
        if (!leaf->load) {
            snprintf(err, PTO_MB_ERR_CAP, "callable %" PRIu64 " was registered after the child was forked, and this "
                     "worker's leaf has no load hook to install it; register it before the Worker is initialised", callable);
            return 1;
        }
        int rc = leaf->load(leaf->ctx, callable, (const void *)(uintptr_t)addr, (size_t)llen, err, PTO_MB_ERR_CAP);
        if (rc != 0) {
            err[PTO_MB_ERR_CAP - 1] = 0;
            if (!err[0]) snprintf(err, PTO_MB_ERR_CAP, "installing shipped callable %" PRIu64 " returned %d", callable, rc);
            return rc;
        }
        c->loaded = 1;
    }
    return 0;
}

static int serve(pto_mailbox *mb, pto_mb_cell *c, const pto_leaf *leaf)
{
    char *err = c->err;
    uint64_t callable = c->callable;
    pto_args_view view;
    pto_call_config cfg;
    int urc = unpack(c, leaf, &view, &cfg);
    if (urc != 0) return urc;
    const uint8_t *tags = PTO_UNLIKELY(mb->check) ? pto_check_tags(mb, &view) : NULL;
    int rc;
    if (PTO_UNLIKELY(pto_diag_wanted(&cfg))) {
        mb->diag.ts[PTO_SWIM_HANDED] = c->posted_ns;   /* the parent's post: level 3's hand-off span */
        /* diag.c's dumps go around the checks: they show the task's inputs and its final outputs */
        pto_check_leaf cl = {leaf->run, leaf->ctx, tags, mb, mb->check_warn != 0};
        rc = mb->check ? pto_diag_call(pto_check_leaf_run, &cl, callable, &view, &cfg, &mb->diag, err, PTO_MB_ERR_CAP)
                       : pto_diag_call(leaf->run, leaf->ctx, callable, &view, &cfg, &mb->diag, err, PTO_MB_ERR_CAP);
    } else {
        rc = PTO_UNLIKELY(mb->check) ? pto_check_call(leaf->run, leaf->ctx, callable, &view, tags, &cfg, err, PTO_MB_ERR_CAP, mb,
                                                                      mb->check_warn != 0)
                                     : leaf->run(leaf->ctx, callable, &view, &cfg, err, PTO_MB_ERR_CAP);
    }
    err[PTO_MB_ERR_CAP - 1] = 0;
    return rc;
}

/* Begin cell seq at start_ns: tell the parent, and claim the cell against
 * a revocation. false: it is not to run (revoked, or chained behind a
 * failure), and goes back skipped. */
static bool take(pto_mailbox *mb, pto_mb_cell *c, uint32_t seq, uint64_t start_ns, bool prev_failed,
                 bool producer_failed)
{
    /* The claim first: a locked CAS waits for every store before it, and
     * the two below go to lines the parent reads, so each would cost it a
     * round trip between the cores; after it, they drain together with
     * the result's at finish. A child lost between the two has begun
     * nothing the parent must fail: started still says the cell is not. */
    uint32_t want = PTO_CELL_POSTED;
    bool revoked = !atomic_compare_exchange_strong_explicit(&c->claim, &want, PTO_CELL_TAKEN, memory_order_acq_rel,
                                                            memory_order_acquire);
    c->start_ns = start_ns;
    /* Where this child runs, for the parent's pto_wm_spread: read from rseq, a few ns. */
    int cpu = sched_getcpu();
    if (cpu != atomic_load_explicit(&mb->cpu, memory_order_relaxed)) atomic_store_explicit(&mb->cpu, cpu, memory_order_relaxed);
    atomic_store_explicit(&mb->started, seq + 1, memory_order_release);
    c->skipped = revoked || (c->after_prev && prev_failed) || producer_failed;
    if (!c->skipped) return true;
    c->rc = 0;
    c->loaded = 0;
    c->err[0] = 0;
    return false;
}

/* Early posts: how long a wait for a producer on another child spins, and
 * then yields, before it sleeps between looks (growing up to
 * AWAIT_NAP_MAX_NS): a producer that runs long must not cost a core. */
#define AWAIT_SPIN_LOOKS 16
#define AWAIT_YIELD_NS 200000
#define AWAIT_NAP_MIN_NS 20000
#define AWAIT_NAP_MAX_NS 1000000

/* Wait until every producer cell c names has ended. false if one did not
 * succeed, or the wait was called off (c revoked, the child told to shut
 * down, a word that cannot be: the parent's cell was overwritten); *waited
 * says whether it had to wait at all. */
static bool await_producers(pto_mailbox *mb, pto_mb_cell *c, bool *waited)
{
    uint32_t n = c->nwaits;
    if (n > PTO_DONE_WAITS || !mb->done_pages) return false;
    uint64_t t0 = 0, nap = AWAIT_NAP_MIN_NS;
    for (uint32_t i = 0; i < n; i++) {
        pto_done_ref r = c->waits[i];
        if (r.child < 0 || r.child >= mb->ndone_pages || r.word >= PTO_DONE_WORDS) return false;
        const _Atomic uint64_t *w = &mb->done_pages[r.child]->w[r.word];
        const uint64_t good = pto_done_value(r.stamp, false), bad = pto_done_value(r.stamp, true);
        for (uint32_t k = 0;; k++) {
            /* Acquire: what the producer wrote is visible once its word is. */
            uint64_t v = atomic_load_explicit(w, memory_order_acquire);
            if (v == good) break;
            if (v == bad) return false;
            if (atomic_load_explicit(&c->claim, memory_order_relaxed) == PTO_CELL_REVOKED ||
                pto_mb_state(mb) == PTO_MB_SHUTDOWN)
                return false;
            if (!*waited) {
                *waited = true;
                t0 = pto_now_ns();
            }
            if (k < AWAIT_SPIN_LOOKS) {
                for (int j = 0; j < 4; j++) pto_cpu_relax();
            } else if ((k & 15) || (int64_t)(pto_now_ns() - t0) < AWAIT_YIELD_NS) {
                sched_yield();   /* the producer may be waiting for this core */
            } else {
                struct timespec ts = {0, (long)nap};
                nanosleep(&ts, NULL);
                if (nap < AWAIT_NAP_MAX_NS) nap *= 2;
            }
        }
    }
    return true;
}

/* Cell *seq (c)'s result is written: hand it back. */
static void finish(pto_mailbox *mb, pto_mb_cell *c, uint32_t *seq)
{
    /* Before done: the parent, when it collects this cell, finds its word
     * final, and a consumer waiting on another child starts now. */
    if (c->done_stamp && mb->own_done && c->done_word < PTO_DONE_WORDS)
        atomic_store_explicit(&mb->own_done->w[c->done_word], pto_done_value(c->done_stamp, c->skipped || c->rc != 0),
                              memory_order_release);
    /* The claim is left as the next post of this cell wants it, from here,
     * where the line is this child's already (its result): a post that
     * wrote it would pull the line over to the parent and back once more
     * per task (the child's claim CAS was a third of its time). A revoke
     * that lands between here and the collection fails nothing: the result
     * is final, and the next post puts the claim back (pto_mb_write). */
    atomic_store_explicit(&c->claim, PTO_CELL_POSTED, memory_order_relaxed);
    /* Only this child advances done; the zygote writes DEAD, never done.
     * Release, not seq_cst: pto_mb_wake_parent's fence orders it before
     * the sleepers' flags (Dekker). */
    atomic_store_explicit(&mb->done, ++*seq, memory_order_release);
    pto_mb_wake_parent(mb);
}

/* ---- a leaf that overlaps its tasks (leaf->begin: a Worker child) ----
 * Every posted cell is begun at once, up to PTO_LEAF_MAX_BEGUN, and they end
 * in order, so done stays a FIFO count and the parent's side (collection,
 * revocation, deadlines of the oldest) is the same as for any leaf. A
 * cell that needs the one before it to have ended (after_prev), or the
 * mailbox's one-task state (check mode, diagnostics), waits until nothing
 * is begun and runs as with any leaf. */

typedef struct overlap {
    pto_mailbox *mb;
    const pto_leaf *leaf;
    uint32_t seq, next;             /* cells [seq, next) are begun and not yet ended */
    int prev_rc;                    /* the outcome of cell seq - 1 */
    void *token[PTO_MB_CELLS];      /* the leaf's, for a begun cell that runs; NULL once its result is final */
} overlap;

static bool runs_alone(const pto_mailbox *mb, const pto_mb_cell *c)
{
    return c->after_prev || c->nwaits || mb->check || pto_diag_wanted(&c->cfg);
}

/* Whether cell o->next may be begun now. */
static bool can_begin(overlap *o)
{
    pto_mailbox *mb = o->mb;
    if (atomic_load_explicit(&mb->posted, memory_order_acquire) == o->next || o->next - o->seq >= PTO_LEAF_MAX_BEGUN)
        return false;
    return o->next == o->seq || !runs_alone(mb, pto_mb_cell_of(mb, o->next));
}

static bool overlap_has_work(void *p)
{
    overlap *o = p;
    if (pto_mb_state(o->mb) == PTO_MB_SHUTDOWN || can_begin(o)) return true;
    void *t = o->seq != o->next ? o->token[o->seq & (PTO_MB_CELLS - 1)] : NULL;
    return t && o->leaf->ready(o->leaf->ctx, t);
}

static void wake_child(void *mb) { pto_event_notify(&((pto_mailbox *)mb)->to_child); }

/* Begin cell o->next. */
static void begin_next(overlap *o)
{
    pto_mailbox *mb = o->mb;
    const pto_leaf *leaf = o->leaf;
    pto_mb_cell *c = pto_mb_cell_of(mb, o->next);
    void **token = &o->token[o->next & (PTO_MB_CELLS - 1)];
    *token = NULL;
    bool alone = runs_alone(mb, c), waited = false;
    bool ok = !c->nwaits || await_producers(mb, c, &waited);
    if (take(mb, c, o->next, pto_now_ns(), o->prev_rc != 0, !ok)) {
        if (alone) {
            c->rc = serve(mb, c, leaf);
        } else {
            pto_args_view view;
            pto_call_config cfg;
            c->rc = unpack(c, leaf, &view, &cfg);
            if (c->rc == 0)
                c->rc = leaf->begin(leaf->ctx, c->callable, &view, &cfg, wake_child, mb, token, c->err, PTO_MB_ERR_CAP);
            c->err[PTO_MB_ERR_CAP - 1] = 0;
            if (c->rc != 0) *token = NULL;
        }
    }
    o->next++;
}

/* A sleep that began at slept_ns (0: none) ended with a cell the parent
 * stamped at posted_ns while it lasted: the wake-up took until now. */
static void learn_wake(pto_mb_spin *spin, uint64_t slept_ns, uint64_t posted_ns)
{
    uint64_t now = pto_now_ns();
    if (slept_ns && posted_ns > slept_ns && now > posted_ns) pto_mb_spin_woke(spin, now - posted_ns);
}

static void overlap_loop(pto_mailbox *mb, const pto_leaf *leaf, pto_mb_spin *spin, int64_t cold_spin_ns)
{
    overlap o = {.mb = mb, .leaf = leaf};
    o.seq = o.next = atomic_load_explicit(&mb->done, memory_order_relaxed);
    for (;;) {
        if (pto_mb_state(mb) == PTO_MB_SHUTDOWN) return;
        while (can_begin(&o)) {
            bool alone = runs_alone(mb, pto_mb_cell_of(mb, o.next));
            begin_next(&o);
            if (alone) break;   /* ended already: hand it back before anything else begins */
        }
        uint32_t i = o.seq & (PTO_MB_CELLS - 1);
        if (o.seq == o.next || (o.token[i] && !leaf->ready(leaf->ctx, o.token[i]))) {
            /* Nothing begun yet: a post wakes it (the adaptive spin learns
             * from those waits alone); a begun task: its end, or a post. */
            uint64_t t0 = pto_now_ns();
            bool idle = o.seq == o.next;
            int64_t b = pto_mb_spin_budget(spin);
            uint64_t slept = 0;
            if (!spin_for(overlap_has_work, &o, pto_hot_spin(b, b < cold_spin_ns ? b : cold_spin_ns, &mb->hot_until_ns))) {
                slept = pto_now_ns();
                pto_event_wait(&mb->to_child, overlap_has_work, &o, 0, -1);
            }
            if (idle && can_begin(&o)) {
                uint64_t posted_ns = pto_mb_cell_of(mb, o.next)->posted_ns;
                pto_mb_spin_observe(spin, posted_ns > t0 ? posted_ns - t0 : 0);
                learn_wake(spin, slept, posted_ns);
            }
            continue;
        }
        pto_mb_cell *c = pto_mb_cell_of(mb, o.seq);
        if (o.token[i]) {
            c->err[0] = 0;
            c->rc = leaf->end(leaf->ctx, o.token[i], c->err, PTO_MB_ERR_CAP);
            c->err[PTO_MB_ERR_CAP - 1] = 0;
            o.token[i] = NULL;
        }
        o.prev_rc = c->skipped ? 1 : c->rc;
        c->done_ns = pto_now_ns();
        finish(mb, c, &o.seq);
    }
}

/* Sleep until the parent posts cell seq (or shuts the mailbox), and learn
 * from the post's stamp how long a wake-up took. */
static void sleep_for_work(pto_mailbox *mb, pto_mb_spin *spin, uint32_t seq)
{
    uint64_t t0 = pto_now_ns();
    pto_event_wait(&mb->to_child, child_has_work, mb, 0, -1);
    if (atomic_load_explicit(&mb->posted, memory_order_acquire) != seq) learn_wake(spin, t0, pto_mb_cell_of(mb, seq)->posted_ns);
}

void pto_mb_child_loop(pto_mailbox *mb, const pto_leaf *leaf, uint32_t spin_max_ns, int64_t cold_spin_ns)
{
    pto_mb_spin spin;
    pto_mb_spin_init(&spin, spin_max_ns);
    if (leaf->begin && leaf->ready && leaf->end) {
        overlap_loop(mb, leaf, &spin, cold_spin_ns);
        return;
    }
    /* This child's own count: what the memory says may be scribbled on. */
    uint32_t seq = atomic_load_explicit(&mb->done, memory_order_relaxed);
    int prev_rc = 0;
    /* The clock costs ~20 ns a read: a cell that was waiting behind the
     * one before it starts when that one ended, so back-to-back cells read
     * it once each. */
    uint64_t t0 = 0, last_done = 0;
    for (;;) {
        bool waited = false;
        if (atomic_load_explicit(&mb->posted, memory_order_acquire) == seq) {
            waited = true;
            t0 = pto_now_ns();
            int64_t b = pto_mb_spin_budget(&spin);
            if (!spin_for(child_has_work, mb, pto_hot_spin(b, b < cold_spin_ns ? b : cold_spin_ns, &mb->hot_until_ns)))
                sleep_for_work(mb, &spin, seq);
        }
        if (pto_mb_state(mb) == PTO_MB_SHUTDOWN) return;
        if (atomic_load_explicit(&mb->posted, memory_order_acquire) == seq) continue;   /* a spurious wake-up */
        pto_mb_cell *c = pto_mb_cell_of(mb, seq);
        /* The wait until the post, from the parent's stamp: time asleep
         * past it would inflate the spin budget. A cell found waiting
         * needed no spin at all. */
        pto_mb_spin_observe(&spin, waited && c->posted_ns > t0 ? c->posted_ns - t0 : 0);
        /* Only a cell posted while the one before it still ran (posted_ns
         * 0) was waiting when that one ended; one posted after (stamped)
         * starts now, even if this child was slow to look: a stale start
         * would cut into its deadline. */
        /* A cell posted ahead of its producers elsewhere waits for them
         * here, and starts when it saw the last of them end, which may be
         * after the cell before it here ended even if it did not wait. */
        bool ok = !c->nwaits || await_producers(mb, c, &waited);
        if (take(mb, c, seq, waited || c->nwaits || c->posted_ns || !last_done ? pto_now_ns() : last_done, prev_rc != 0,
                 !ok))
            c->rc = serve(mb, c, leaf);
        prev_rc = c->skipped ? 1 : c->rc;
        c->done_ns = last_done = pto_now_ns();
        finish(mb, c, &seq);
    }
}
