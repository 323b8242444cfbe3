#include "orchestrator.h"
#include "common.h"
#include "check.h"
#include "scheduler.h"
#include "task_args.h"
#include "trace.h"
#include "diag.h"
#include "worker.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const pto_call_config default_cfg = {.aicpu_thread_num = 3};

static inline pto_trace *orch_trace(pto_orch *o) { return pto_trace_on(&o->sched->wm->trace); }

/* The scheduler's hand-off of a consumed slot, by the turn's holder (one
 * thread at a time: the turn flag orders successive holders, so the queue
 * has one producer). A queue of pointers, not a stack linked through the
 * slots: taking a stack cost the orchestrator a locked exchange and then
 * a cache miss per slot, each waiting for the one before it to give the
 * next address (a quarter of `submit`'s own samples in a no-op BGEMM);
 * from the queue drain_retired knows the next addresses and overlaps the
 * misses. */
static void orch_retire(void *arg, pto_slot *s)
{
    pto_orch *o = arg;
    pto_wq_push(&o->retired, s);
}

/* After a batch of orch_retire: wake the orchestrator if it waits for
 * reclaimed slots. The fence orders the pushes before the look at
 * waiting_for, against the orchestrator's store of it and the fence in
 * its wait (Dekker): either it sees the slots or we see it waiting. */
static void orch_retire_flush(void *arg)
{
    pto_orch *o = arg;
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&o->waiting_for, memory_order_relaxed) == ORCH_WAIT_RETIRE) pto_event_notify(&o->ev);
}

void pto_orch_init(pto_orch *o, struct pto_worker *w, pto_scheduler *sched, pto_heap_ring *rings,
                   uint32_t alloc_timeout_ms, _Atomic bool *shutdown)
{
    memset(o, 0, sizeof *o);
    o->w = w;
    o->sched = sched;
    o->rings = rings;
    o->alloc_timeout_ms = alloc_timeout_ms;
    o->next_timeout_ms = -1;
    o->shutdown = shutdown;
    o->nworkers[0] = sched->wm->count[0];
    o->nworkers[1] = sched->wm->count[1];
    pto_slot_pool_init(&o->pool);
    pto_tm_init(&o->tm);
    pto_scope_init(&o->scope);
    pto_wq_init(&o->retired);
    sched->retire = orch_retire;
    sched->retire_flush = orch_retire_flush;
    sched->retire_ctx = o;
    sched->orch_ev = &o->ev;
    sched->orch_waiting = &o->waiting_for;
}

static void cfgs_free(pto_orch *o)
{
    while (o->cfgs) {
        pto_cfg_ref *n = o->cfgs->next;
        free(o->cfgs);
        o->cfgs = n;
    }
}

void pto_orch_destroy(pto_orch *o)
{
    free(o->gone);
    pto_slot_pool_destroy(&o->pool);
    pto_tm_destroy(&o->tm);
    pto_scope_destroy(&o->scope);
    cfgs_free(o);
    pto_check_log_free(o->check_log);
    free(o->tmp_refs);
    pto_wq_destroy(&o->retired);
}

/* ---- reclamation ------------------------------------------------------ */

static void cfg_unref(pto_orch *o, pto_cfg_ref *c)
{
    if (!c || --c->refs > 0 || c == o->cfgs) return;   /* keep the most recent one */
    for (pto_cfg_ref **pp = &o->cfgs; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            free(c);
            return;
        }
}

/* Note what s was before its slot goes (pto_orch.gone). Reclaims come in
 * nearly id order, so the array grows in steps and a store is all a task
 * costs; past the cap nothing is kept. */
static void remember_gone(pto_orch *o, const pto_slot *s)
{
    int64_t id = s->id;
    if (id >= PTO_GONE_CAP) return;
    if (id >= o->gone_cap) {
        int64_t c = o->gone_cap ? o->gone_cap : 1024;
        while (c <= id) c *= 2;
        if (c > PTO_GONE_CAP) c = PTO_GONE_CAP;
        pto_gone *g = realloc(o->gone, (size_t)c * sizeof *g);
        if (!g) return;
        memset(g + o->gone_cap, 0, (size_t)(c - o->gone_cap) * sizeof *g);
        o->gone = g;
        o->gone_cap = c;
    }
    o->gone[id] = (pto_gone){s->callable, s->kind + 2,
                             s->kind >= 0 ? atomic_load_explicit(&s->worker, memory_order_relaxed) : -1};
    if (id + 1 > o->gone_hi) o->gone_hi = id + 1;
}

static void reclaim(pto_orch *o, pto_slot *s)
{
    /* While the run ends (the slots its drain retires, those of a shut-down
     * Worker's scopes) the TensorMap, the rings and the configs are reset
     * at once afterwards; erasing entry by entry would cost a cache miss
     * per task (a 200k-task run's map is tens of MiB). */
    if (o->ending) {
        pto_slot_recycle(&o->pool, s);
        return;
    }
    for (int32_t m = 0; m < s->group_size; m++) {
        const pto_member *mb = &s->members[m];
        for (int32_t i = 0; i < mb->tensor_count; i++) {
            const pto_tensor *t = &mb->tensors[i];
            uint64_t start = t->base + t->offset;   /* the range record_writers (or alloc) entered */
            if (t->base) pto_tm_erase_range(&o->tm, t->base, start, start + pto_tensor_nbytes(t), s);
        }
    }
#ifndef NDEBUG   /* every entry went: a stale producer would be a use after free */
    for (int32_t m = 0; m < s->group_size; m++)
        for (int32_t i = 0; i < s->members[m].tensor_count; i++)
            assert(!pto_tm_holds(&o->tm, s->members[m].tensors[i].base, s));
#endif
    if (s->ring >= 0) pto_ring_release(&o->rings[s->ring], s->slab_seq);
    cfg_unref(o, s->cfg);
    remember_gone(o, s);
    pto_slot_recycle(&o->pool, s);
}

/* How far ahead of the slot being reclaimed drain_retired starts the next
 * one's miss (the turn's holder last wrote it, on another core). */
#define RECLAIM_AHEAD 2

/* Start loading the lines of s that reclaim reads beyond its first (which
 * pto_wq_pop_prefetch loads): its member and the first three inline
 * tensors. The orchestrator wrote them at the submit, long before: by the
 * time the slot comes back they have left the cache, and `perf annotate`
 * put half of reclaim's samples on the load of the first tensor's base. */
static void prefetch_reclaim(const pto_slot *s)
{
    __builtin_prefetch(&s->member0);
    __builtin_prefetch(&s->inl_tensors[0]);
    __builtin_prefetch(&s->inl_tensors[2]);
}

/* Reclaim everything the scheduler handed back; true if anything was. */
static bool drain_retired(pto_orch *o)
{
    bool any = false;
    for (pto_slot *s; (s = pto_wq_pop_prefetch(&o->retired, RECLAIM_AHEAD)); any = true) {
        const pto_slot *n = pto_wq_ahead(&o->retired, 1);
        if (n) prefetch_reclaim(n);
        reclaim(o, s);
    }
    return any;
}

static void release_local(pto_orch *o, pto_slot *s)
{
    if (pto_slot_release(s)) reclaim(o, s);
}

bool pto_orch_has_work(void *arg)
{
    pto_orch *o = arg;
    return pto_wq_pending(&o->retired) ||
           atomic_load_explicit(o->shutdown, memory_order_relaxed) ||
           atomic_load_explicit(&o->sched->cancel, memory_order_relaxed);
}

/* ---- checks -------------------------------------------------------------- */

bool pto_orch_check_open(pto_orch *o)
{
    if (!o) {
        pto_set_error("no orchestrator (submit only inside a run, between pto_run_begin and pto_run_end)");
        return false;
    }
    if (!o->open) {
        pto_set_error("the orchestrator is used outside its run (it is valid only between pto_run_begin and "
                      "pto_run_end)");
        return false;
    }
    if (atomic_load_explicit(o->shutdown, memory_order_relaxed)) {
        pto_set_error("the Worker is shutting down");
        return false;
    }
    if (atomic_load_explicit(&o->sched->cancel, memory_order_relaxed)) {
        pto_set_error("interrupted");
        return false;
    }
    return true;
}

static bool cfg_equal(const pto_call_config *a, const pto_call_config *b)
{
    /* The ints, then the prefix as a string: its 1 KiB is almost always
     * empty, so this stays cheap on the submit path. */
    return memcmp(a, b, offsetof(pto_call_config, output_prefix)) == 0 &&
           strncmp(a->output_prefix, b->output_prefix, sizeof a->output_prefix) == 0;
}

/* Tasks share interned copies; the most recent one is at the head. */
static pto_cfg_ref *cfg_intern(pto_orch *o, const pto_call_config *cfg)
{
    /* Most submits pass no CallConfig: no compare of its 1 KiB then. */
    if (!cfg && o->cfgs && o->cfgs->dflt) {
        o->cfgs->refs++;
        return o->cfgs;
    }
    if (!cfg) cfg = &default_cfg;
    int32_t looked = 0;
    for (pto_cfg_ref **pp = &o->cfgs; *pp && looked < 8; pp = &(*pp)->next, looked++) {
        pto_cfg_ref *c = *pp;
        if (!cfg_equal(&c->cfg, cfg)) continue;
        *pp = c->next;
        c->next = o->cfgs;
        o->cfgs = c;
        c->refs++;
        c->dflt |= cfg == &default_cfg;
        return c;
    }
    pto_cfg_ref *c = pto_xcalloc(1, sizeof *c);
    c->dflt = cfg == &default_cfg;
    memcpy(&c->cfg, cfg, offsetof(pto_call_config, output_prefix));
    size_t n = strnlen(cfg->output_prefix, sizeof cfg->output_prefix - 1);
    memcpy(c->cfg.output_prefix, cfg->output_prefix, n);
    c->refs = 1;
    c->next = o->cfgs;
    o->cfgs = c;
    return c;
}

/* ---- references ----------------------------------------------------------- */

static void add_ref(pto_orch *o, pto_slot *p, bool dep)
{
    if (p->mark == o->mark) {   /* seen in this submit: merge the roles */
        for (int32_t i = 0; i < o->ntmp; i++)
            if (o->tmp_refs[i].slot == p) {
                o->tmp_refs[i].dep |= dep;
                o->tmp_refs[i].hold |= !dep;
            }
        return;
    }
    p->mark = o->mark;
    pto_grow((void **)&o->tmp_refs, &o->tmp_cap, o->ntmp + 1, sizeof *o->tmp_refs);
    o->tmp_refs[o->ntmp++] = (pto_ref){p, dep, !dep};
}

static void lookup_cb(pto_slot *p, void *arg) { add_ref(arg, p, true); }

int32_t pto_orch_ring_of(pto_orch *o, uint64_t addr)
{
    for (int32_t r = 0; r < PTO_MAX_RING_DEPTH; r++)
        if (pto_ring_contains(&o->rings[r], addr)) return r;
    return -1;
}

/* Take every collected reference. A producer that is already consumed has
 * finished: it needs no edge (but passes on its failure). A consumed slab
 * owner is different: its storage is about to be reused, so that is an error
 * and the references taken so far are given back. */
static bool take_refs(pto_orch *o, bool *poisoned, int64_t *failed_producer)
{
    for (int32_t i = 0; i < o->ntmp; i++) {
        pto_slot *p = o->tmp_refs[i].slot;
        if (pto_slot_try_ref(p)) continue;
        if (atomic_load_explicit(&p->failed, memory_order_acquire)) {
            *poisoned = true;
            *failed_producer = p->id;
        }
        if (!o->tmp_refs[i].hold) {
            o->tmp_refs[i--] = o->tmp_refs[--o->ntmp];
            continue;
        }
        for (int32_t k = 0; k < i; k++) release_local(o, o->tmp_refs[k].slot);
        pto_set_error("a tensor's heap storage (task %lld's slab) is being reclaimed: tensors from pto_alloc "
                      "and automatic OUTPUTs live only until their scope ends; use them inside that scope",
                      (long long)p->id);
        return false;
    }
    return true;
}

/* ---- submit ----------------------------------------------------------------- */

typedef struct submit_req {
    int32_t kind;
    uint64_t callable;
    pto_task_args *args;
    int32_t n;
    const pto_call_config *cfg;
    const int32_t *pins;           /* n entries, or NULL */
    int32_t pin;                   /* single task */
} submit_req;

/* The pin of member m: a group's from its pins array, a single task's own. */
static int32_t member_pin(const submit_req *q, int32_t m)
{
    return q->pins ? q->pins[m] : (q->n == 1 ? q->pin : -1);
}

static bool validate(pto_orch *o, const submit_req *q)
{
    const char *kname = q->kind == PTO_SUB ? "sub workers" : "next-level children";
    int32_t nw = o->nworkers[q->kind];
    if (nw == 0) {
        pto_set_error("this Worker has no %s (give the Worker %s when creating it)", kname,
                      q->kind == PTO_SUB ? "num_sub_workers > 0" : "chips > 0 or add_worker children");
        return false;
    }
    if (q->n < 1) {
        pto_set_error("a group needs at least one member (got %d)", q->n);
        return false;
    }
    if (q->n > nw) {
        pto_set_error("a group of %d members needs %d distinct %s, but this Worker has %d", q->n, q->n,
                      kname, nw);
        return false;
    }
    for (int32_t m = 0; m < q->n; m++) {
        int32_t pin = member_pin(q, m);
        if (pin < -1 || pin >= nw) {
            pto_set_error("worker %d does not exist (this Worker has %s 0..%d)", pin, kname, nw - 1);
            return false;
        }
        if (q->pins && pin >= 0)
            for (int32_t k = 0; k < m; k++)
                if (q->pins[k] == pin) {
                    pto_set_error("group members %d and %d are pinned to the same worker %d; members need "
                                  "distinct workers", k + 1, m + 1, pin);
                    return false;
                }
        const pto_task_args *a = &q->args[m];
        if (a->tensor_count < 0 || a->scalar_count < 0 || (a->tensor_count && (!a->tensors || !a->tags)) ||
            (a->scalar_count && !a->scalars)) {
            pto_set_error("malformed task args (negative counts or missing arrays)");
            return false;
        }
        for (int32_t i = 0; i < a->tensor_count; i++) {
            const pto_tensor *t = &a->tensors[i];
            if (a->tags[i] > PTO_NO_DEP) {
                pto_set_error("tensor %d has unknown tag %d (use INPUT, OUTPUT, INOUT, OUTPUT_EXISTING or "
                              "NO_DEP)", i + 1, a->tags[i]);
                return false;
            }
            if (!pto_tensor_check(t, i)) return false;
            if (!t->base && a->tags[i] != PTO_OUTPUT) {
                pto_set_error("tensor %d has no storage; only an OUTPUT tensor may be unset (it is then "
                              "allocated by the submit)", i + 1);
                return false;
            }
            if (!t->base && t->offset) {
                pto_set_error("tensor %d is unset but has an offset; an unset OUTPUT must be a whole tensor",
                              i + 1);
                return false;
            }
        }
    }
    return true;
}

/* The one heap slab of a submit that holds all its unset OUTPUTs. */
typedef struct auto_slab {
    uint64_t bytes;                /* 0: the task has no unset OUTPUT */
    int32_t ring;
    uint64_t off, seq;
} auto_slab;

/* Count q's tensors and scalars, and the slab bytes its unset OUTPUTs need. */
static void measure_args(const submit_req *q, int32_t *total_tensors, int32_t *total_scalars, auto_slab *slab)
{
    *total_tensors = *total_scalars = 0;
    slab->bytes = 0;
    for (int32_t m = 0; m < q->n; m++) {
        const pto_task_args *a = &q->args[m];
        *total_tensors += a->tensor_count;
        *total_scalars += a->scalar_count;
        for (int32_t i = 0; i < a->tensor_count; i++)
            if (!a->tensors[i].base) {
                uint64_t nb = pto_tensor_nbytes(&a->tensors[i]);
                slab->bytes += pto_align_up(nb ? nb : 1, PTO_HEAP_ALIGN);
            }
    }
}

/* Dependencies (the TensorMap's writers of every INPUT and INOUT) and holds
 * (the slab owner of every tensor in a heap ring) into o->tmp_refs,
 * de-duplicated across tensors and members. */
static bool collect_refs(pto_orch *o, const submit_req *q)
{
    o->ntmp = 0;
    if (++o->mark == 0) o->mark = 1;
    for (int32_t m = 0; m < q->n; m++) {
        const pto_task_args *a = &q->args[m];
        for (int32_t i = 0; i < a->tensor_count; i++) {
            const pto_tensor *t = &a->tensors[i];
            if (!t->base) continue;
            uint64_t start = t->base + t->offset, nb = pto_tensor_nbytes(t);
            if (a->tags[i] == PTO_INPUT || a->tags[i] == PTO_INOUT)
                pto_tm_lookup(&o->tm, t->base, start, start + nb, lookup_cb, o);
            int32_t hr = pto_orch_ring_of(o, start);
            if (hr < 0) continue;
            pto_slot *owner = pto_ring_owner(&o->rings[hr], start - (uint64_t)(uintptr_t)o->rings[hr].base);
            if (!owner) {
                pto_set_error("tensor %d points into heap ring %d where nothing is allocated any more: "
                              "tensors from pto_alloc and automatic OUTPUTs live only until their scope ends",
                              i + 1, hr);
                return false;
            }
            add_ref(o, owner, false);
        }
    }
    return true;
}

/* Copy q's arguments into s's arrays, carving each unset OUTPUT from the
 * slab (and writing its storage back into the caller's args). */
static void copy_args(pto_orch *o, const submit_req *q, pto_slot *s, pto_slot_arrays arr, const auto_slab *slab)
{
    uint8_t *base = o->rings[slab->ring].base + slab->off;
    uint64_t carve = 0;
    for (int32_t m = 0; m < q->n; m++) {
        pto_task_args *a = &q->args[m];
        pto_member *mb = &s->members[m];
        mb->tensor_count = a->tensor_count;
        mb->scalar_count = a->scalar_count;
        mb->tensors = arr.tensors;
        mb->scalars = arr.scalars;
        mb->tags = arr.tags;
        mb->pin = member_pin(q, m);
        for (int32_t i = 0; i < a->tensor_count; i++) {
            if (!a->tensors[i].base) {
                a->tensors[i].base = (uint64_t)(uintptr_t)(base + carve);
                a->tensors[i].offset = 0;
                uint64_t nb = pto_tensor_nbytes(&a->tensors[i]);
                carve += pto_align_up(nb ? nb : 1, PTO_HEAP_ALIGN);
            }
            arr.tensors[i] = a->tensors[i];
        }
        if (a->scalar_count) memcpy(arr.scalars, a->scalars, 8 * (size_t)a->scalar_count);
        if (a->tensor_count) memcpy(arr.tags, a->tags, (size_t)a->tensor_count);
        arr.tensors += a->tensor_count;
        arr.tags += a->tensor_count;
        arr.scalars += a->scalar_count;
    }
}

/* The task's slot: arguments and references copied in, unset OUTPUTs
 * carved from the slab, which the slot then owns. */
static pto_slot *build_slot(pto_orch *o, const submit_req *q, int32_t total_tensors, int32_t total_scalars,
                            const auto_slab *slab, int64_t timeout_ms)
{
    pto_slot *s = pto_slot_alloc(&o->pool);
    s->kind = (int8_t)q->kind;
    s->timeout_ms = timeout_ms >= 0 ? (uint32_t)timeout_ms : o->task_timeout_ms;
    s->callable = q->callable;
    s->cfg = cfg_intern(o, q->cfg);
    s->run = o->cur_run;
    s->group_size = q->n;
    pto_slot_arrays arr = pto_slot_carve(s, q->n, total_tensors, total_scalars, o->ntmp);
    if (o->ntmp) memcpy(s->refs, o->tmp_refs, sizeof(pto_ref) * (size_t)o->ntmp);
    s->nrefs = o->ntmp;
    copy_args(o, q, s, arr, slab);
    if (slab->bytes) {
        s->ring = (int8_t)slab->ring;
        s->slab_off = slab->off;
        s->slab_bytes = slab->bytes;
        s->slab_seq = slab->seq;
        pto_ring_set_owner(&o->rings[slab->ring], slab->seq, s);
    }
    return s;
}

/* New writers enter the TensorMap (after the lookups: INOUT reads the old writer). */
static void record_writers(pto_orch *o, const submit_req *q, pto_slot *s)
{
    for (int32_t m = 0; m < q->n; m++) {
        const pto_member *mb = &s->members[m];
        const pto_task_args *a = &q->args[m];
        for (int32_t i = 0; i < mb->tensor_count; i++) {
            uint8_t tag = a->tags[i];
            if (tag == PTO_OUTPUT || tag == PTO_INOUT || tag == PTO_OUTPUT_EXISTING) {
                const pto_tensor *t = &mb->tensors[i];
                uint64_t start = t->base + t->offset;
                pto_tm_insert(&o->tm, t->base, start, start + pto_tensor_nbytes(t), s);
            }
        }
    }
}

/* Any diagnostic field (diag.c) set: the submit checks them and sets up their files. */
static inline bool diag_fields(const pto_call_config *c)
{
    return (c->enable_dump_tensor | c->enable_pmu | c->enable_l2_swimlane | c->enable_dep_gen) != 0;
}

/* A run whose tasks each write a buffer of their own keeps a TensorMap far
 * bigger than the cache, so each lookup and insert misses: start the loads
 * now and let the rest of the submit overlap them (pto_bench's W1, 200k
 * such tasks: 6% and 15% faster in the medians of two sets of 10
 * alternating pairs, docs/performance.md). The rest of one submit is too
 * short to hide a miss (`perf annotate`: 78% of the insert's samples
 * still on the first load of its cell), so the cell the next submit will
 * want is loaded too, a whole submit ahead: such tasks are mostly
 * submitted in address order (an array of buffers, a heap ring's slabs),
 * so a tensor's base is predicted one stride past its base in the submit
 * before. A wrong guess costs one load nobody waits for. */
static void prefetch_bases(pto_orch *o, const submit_req *q)
{
    int32_t pos = 0;
    for (int32_t m = 0; m < q->n; m++)
        for (int32_t i = 0; i < q->args[m].tensor_count; i++) {
            uint64_t base = q->args[m].tensors[i].base;
            if (!base) continue;
            pto_tm_prefetch(&o->tm, base);
            /* And the writes as one stream, whatever their position: a
             * fan's head, its readers and its join write consecutive
             * buffers (W3: 10 a group), where by position the head's and
             * the first reader's were guessed from another task's. */
            uint8_t tag = q->args[m].tags[i];
            if (tag == PTO_OUTPUT || tag == PTO_INOUT || tag == PTO_OUTPUT_EXISTING) {
                if (o->last_out && o->last_out != base) pto_tm_prefetch(&o->tm, base + (base - o->last_out));
                o->last_out = base;
            }
            if (pos < PTO_ORCH_PREDICT) {
                uint64_t last = o->last_base[pos];
                if (last && last != base) pto_tm_prefetch(&o->tm, base + (base - last));
                o->last_base[pos++] = base;
            }
        }
}

static int64_t submit(pto_orch *o, const submit_req *q)
{
    /* Spent by this submit whether or not it succeeds. */
    int64_t timeout_ms = o->next_timeout_ms;
    o->next_timeout_ms = -1;
    if (!pto_orch_check_open(o) || !validate(o, q)) return -1;
    if (PTO_UNLIKELY(q->cfg && diag_fields(q->cfg)) && !pto_diag_submit_check(o->sched->wm, q->cfg)) return -1;
    pto_trace *tr = orch_trace(o);
    uint64_t t0 = tr ? pto_now_ns() : 0;
    prefetch_bases(o, q);
    drain_retired(o);

    /* The slab is taken first: while it waits on back-pressure, producers
     * may be reclaimed, and a reference taken before the wait could pin the
     * very slab the wait needs. */
    int32_t total_tensors, total_scalars;
    auto_slab slab = {0};
    measure_args(q, &total_tensors, &total_scalars, &slab);
    slab.ring = pto_scope_ring(&o->scope);
    if (slab.bytes && !pto_orch_heap_alloc(o, slab.ring, slab.bytes, &slab.off, &slab.seq)) return -1;

    bool poisoned = false;
    int64_t failed_producer = -1;
    if (!collect_refs(o, q) ||
        (PTO_UNLIKELY(o->check) && !pto_check_submit(o, q->kind, q->callable, q->args, q->n, o->pool.next_id)) ||
        !take_refs(o, &poisoned, &failed_producer)) {
        if (slab.bytes) pto_ring_release(&o->rings[slab.ring], slab.seq);
        return -1;
    }
    pto_slot *s = build_slot(o, q, total_tensors, total_scalars, &slab, timeout_ms);
    if (PTO_UNLIKELY(s->cfg->cfg.enable_dep_gen)) pto_diag_dep_gen(o, s);
    record_writers(o, q, s);
    if (PTO_UNLIKELY(o->check)) pto_check_record(o, s);

    /* The scope's reference, then the hand-over to the scheduler for wiring. */
    atomic_store_explicit(&s->fanout, pto_fanout_pack(1, 0), memory_order_relaxed);
    s->scope_held = true;
    pto_scope_register(&o->scope, s);
    if (poisoned) pto_slot_poison(s, failed_producer);
    o->submitted++;
    o->submitted_total++;
    if (o->pool.live > o->live_hwm) o->live_hwm = o->pool.live;
    int64_t id = s->id;
    if (tr) pto_trace_submit(tr, s, t0);
    pto_sched_submit(o->sched, s);
    return id;
}

int pto_submit_timeout(pto_orch *o, int64_t ms)
{
    if (ms < 0 || ms > UINT32_MAX) {
        pto_set_error("a task timeout must be between 0 (none) and %u ms (got %lld)", UINT32_MAX, (long long)ms);
        return -1;
    }
    if (ms > 0 && o->sched->wm->mode == PTO_MODE_THREAD) {
        pto_set_error("a task timeout needs process mode: a thread cannot be stopped");
        return -1;
    }
    o->next_timeout_ms = ms;
    return 0;
}

int64_t pto_submit_next_level(pto_orch *o, uint64_t callable, pto_task_args *args, const pto_call_config *cfg,
                              int32_t worker)
{
    submit_req q = {PTO_NEXT_LEVEL, callable, args, 1, cfg, NULL, worker};
    if (!args) {
        pto_set_error("missing task args");
        return -1;
    }
    return submit(o, &q);
}

int64_t pto_submit_next_level_group(pto_orch *o, uint64_t callable, pto_task_args *args, int32_t n,
                                    const pto_call_config *cfg, const int32_t *workers)
{
    submit_req q = {PTO_NEXT_LEVEL, callable, args, n, cfg, workers, -1};
    if (!args && n > 0) {
        pto_set_error("missing task args");
        return -1;
    }
    return submit(o, &q);
}

int64_t pto_submit_sub(pto_orch *o, uint64_t callable, pto_task_args *args, int32_t worker)
{
    pto_task_args none = {0};
    submit_req q = {PTO_SUB, callable, args ? args : &none, 1, NULL, NULL, worker};
    return submit(o, &q);
}

int64_t pto_submit_sub_group(pto_orch *o, uint64_t callable, pto_task_args *args, int32_t n, const int32_t *workers)
{
    submit_req q = {PTO_SUB, callable, args, n, NULL, workers, -1};
    if (!args && n > 0) {
        pto_set_error("missing task args");
        return -1;
    }
    return submit(o, &q);
}

int64_t pto_alloc(pto_orch *o, const uint32_t *shape, int32_t ndims, int32_t dtype, pto_tensor *out)
{
    if (!pto_orch_check_open(o)) return -1;
    if (ndims < 0 || ndims > PTO_MAX_DIMS || (ndims && !shape) || !out) {
        pto_set_error("a shape has 0 to %d dimensions (got %d)", PTO_MAX_DIMS, ndims);
        return -1;
    }
    pto_tensor t = {.dtype = (uint8_t)dtype, .ndims = (uint8_t)ndims};
    if (dtype < 0 || dtype >= PTO_DTYPE_COUNT) {
        pto_set_error("unknown dtype %d (use one of f32 f16 bf16 f64 i8 i16 i32 i64 u8 u16 u32 u64 bool)", dtype);
        return -1;
    }
    for (int32_t d = 0; d < ndims; d++) t.shape[d] = shape[d];
    if (!pto_tensor_check(&t, 0)) return -1;
    drain_retired(o);
    uint64_t nb = pto_tensor_nbytes(&t), bytes = pto_align_up(nb ? nb : 1, PTO_HEAP_ALIGN), off, seq;
    int32_t r = pto_scope_ring(&o->scope);
    if (!pto_orch_heap_alloc(o, r, bytes, &off, &seq)) return -1;
    pto_slot *s = pto_slot_alloc(&o->pool);
    s->kind = -1;
    s->ring = (int8_t)r;
    s->slab_off = off;
    s->slab_bytes = bytes;
    s->slab_seq = seq;
    pto_ring_set_owner(&o->rings[r], seq, s);
    t.base = (uint64_t)(uintptr_t)(o->rings[r].base + off);
    s->inl_tensors[0] = t;
    s->member0.tensor_count = 1;
    s->member0.tensors = s->inl_tensors;
    s->inl_tags[0] = PTO_OUTPUT;
    s->member0.tags = s->inl_tags;
    /* Born COMPLETED with its self-release done: an allocation runs nothing,
     * so only its scope holds it. */
    atomic_store_explicit(&s->fanout, pto_fanout_pack(1, 1), memory_order_relaxed);
    atomic_store_explicit(&s->state, PTO_TASK_COMPLETED, memory_order_release);
    s->scope_held = true;
    pto_scope_register(&o->scope, s);
    pto_tm_insert(&o->tm, t.base, t.base, t.base + nb, s);
    o->allocs_total++;
    if (o->pool.live > o->live_hwm) o->live_hwm = o->pool.live;
    *out = t;
    return s->id;
}

/* ---- scopes and the run --------------------------------------------------- */

int pto_scope_begin(pto_orch *o)
{
    if (!pto_orch_check_open(o)) return -1;
    if (pto_scope_push(&o->scope) != 0) {
        pto_set_error("scopes nest at most %d deep; end a scope before opening another",
                      PTO_MAX_SCOPE_DEPTH);
        return -1;
    }
    const pto_scope_frame *f = &o->scope.frames[o->scope.top - 1];
    pto_prof_scope(&o->sched->prof, f->seq, f[-1].seq);   /* the scope tree, for a picture of the run */
    return 0;
}

int pto_scope_label(pto_orch *o, const char *label)
{
    if (!pto_orch_check_open(o)) return -1;
    pto_scope_frame *f = pto_scope_innermost(&o->scope);
    size_t n = label ? strnlen(label, sizeof f->label - 1) : 0;   /* per scope: no printf */
    if (n) memcpy(f->label, label, n);
    f->label[n] = '\0';
    return 0;
}

static void scope_close(pto_orch *o)
{
    pto_scope_frame *f = pto_scope_innermost(&o->scope);
    for (int32_t i = 0; i < f->count; i++) {
        pto_slot *s = f->slots[i];
        s->scope_held = false;
        release_local(o, s);
    }
    pto_scope_pop(&o->scope);
}

int pto_scope_end(pto_orch *o)
{
    if (!pto_orch_check_open(o)) return -1;
    if (pto_scope_nested(&o->scope) < 1) {
        pto_set_error("no scope is open; every scope_end needs a matching scope_begin");
        return -1;
    }
    scope_close(o);
    drain_retired(o);
    return 0;
}

void pto_orch_reclaim(pto_orch *o) { drain_retired(o); }

void pto_orch_outer_scope_renew(pto_orch *o)
{
    while (o->scope.top > 0) scope_close(o);
    pto_scope_push(&o->scope);
    drain_retired(o);
}

int pto_scope_depth(pto_orch *o) { return o && o->open ? pto_scope_nested(&o->scope) : 0; }

/* A drain spins this long before it sleeps: a small run's tasks finish
 * within it, and a futex wake-up costs tens of microseconds on a busy
 * machine. */
#define DRAIN_SPIN_NS 20000

/* While it waits for every task to finish, retired slots do not wake the
 * orchestrator: they are reclaimed once, at the end. Waking for each would
 * make it one more spinner beside the scheduler and the workers for the
 * whole drain. */
static bool all_finished(void *arg)
{
    pto_orch *o = arg;
    if (atomic_load_explicit(&o->waiting_for, memory_order_relaxed) != ORCH_WAIT_FINISH && pto_orch_has_work(o))
        return true;
    return atomic_load_explicit(o->shutdown, memory_order_relaxed) ||
           atomic_load_explicit(&o->sched->cancel, memory_order_relaxed) ||
           atomic_load_explicit(&o->sched->finished, memory_order_seq_cst) == o->submitted;
}

/* The orchestrator waits by running the scheduler's turns itself
 * (pto_sched_help) until it has found nothing to do for DRAIN_SPIN_NS: on
 * a machine with as many cores as workers the scheduler thread would
 * otherwise be one more spinner beside the workers and this thread, and
 * each hand-off between them a context switch (most of a one-task run's
 * fixed cost). Then it sleeps, and the scheduler thread takes over. A
 * drain runs everything submitted, held dispatch included: the gate stays
 * open while it waits, so no hold or breakpoint can hang it. */
static bool wait_until(pto_orch *o, bool (*done)(void *), int32_t why)
{
    pto_sched_draining(o->sched, true);
    pto_wm_hot(o->sched->wm, UINT64_MAX, false);
    atomic_store_explicit(&o->waiting_for, why, memory_order_seq_cst);
    bool ok = true;
    pto_sched_help(o->sched, done, o, DRAIN_SPIN_NS, o->shutdown);
    /* Here the help found nothing to do for DRAIN_SPIN_NS: sleep at once,
     * and spin again only after a wake-up. */
    for (int64_t spin = 0; !done(o); spin = DRAIN_SPIN_NS) {
        if (atomic_load_explicit(o->shutdown, memory_order_relaxed)) {
            ok = false;
            break;
        }
        pto_event_wait(&o->ev, all_finished, o, spin, 100000000);
        drain_retired(o);
    }
    atomic_store_explicit(&o->waiting_for, ORCH_WAIT_NONE, memory_order_relaxed);
    pto_wm_hot(o->sched->wm, pto_now_ns() + PTO_HOT_NS, false);
    pto_sched_draining(o->sched, false);
    return ok;
}

static bool finished_all(void *arg)
{
    pto_orch *o = arg;
    return atomic_load_explicit(&o->sched->finished, memory_order_acquire) == o->submitted;
}

int pto_drain(pto_orch *o)
{
    if (!pto_orch_check_open(o)) return -1;
    atomic_store_explicit(&o->sched->finish_target, o->submitted, memory_order_seq_cst);
    uint64_t t0 = pto_now_ns();
    if (!wait_until(o, finished_all, ORCH_WAIT_FINISH)) {
        pto_set_error("the Worker was shut down");
        return -1;
    }
    pto_prof_waited(&o->sched->prof, t0);   /* profile.h: waiting is not orchestrating */
    drain_retired(o);
    pto_check_observed_orch(o);
    return 0;
}

bool pto_orch_begin(pto_orch *o)
{
    assert(!o->open && o->pool.live == 0);
    o->open = true;
    o->next_timeout_ms = -1;
    o->submitted = 0;
    atomic_store(&o->sched->cancel, false);
    atomic_store(&o->sched->finished, 0);
    atomic_store(&o->sched->break_task, -1);   /* ids restart */
    o->scope.opened = 0;                       /* and scope numbers (not at each submitted run: one profile) */
    pto_scope_push(&o->scope);
    pto_trace *tr = orch_trace(o);
    if (tr) pto_trace_run_begin(tr);
    return true;
}

/* The run's last reference to each of its slots is its scope's once every
 * task finished (each released its producers and itself before it was
 * counted, and anything consumed since is in the retire queue): the slots
 * go with the pool's reset, not one release each. Closing the scopes
 * first touched every slot of the run again, cold by then (a W3 of 200k
 * tasks: 5% of the run's samples on one CPU in scope_close and
 * pto_slot_recycle). */
static void drop_scopes(pto_orch *o)
{
    drain_retired(o);
    assert(pto_scope_held(&o->scope) == o->pool.live);
    pto_scope_drop(&o->scope);
}

int pto_orch_end(pto_orch *o)
{
    o->ending = true;
    atomic_store_explicit(&o->sched->finish_target, o->submitted, memory_order_seq_cst);
    bool ok = wait_until(o, finished_all, ORCH_WAIT_FINISH);
    if (ok) {
        drop_scopes(o);
    } else {
        while (o->scope.top > 0) scope_close(o);
    }
    pto_trace *tr = orch_trace(o);
    if (tr) pto_trace_run_end(tr);
    o->open = false;
    o->ending = false;
    if (o->gone_hi) memset(o->gone, 0, (size_t)o->gone_hi * sizeof *o->gone);   /* ids restart */
    o->gone_hi = 0;
    char *fail = pto_sched_take_failure(o->sched);
    if (!ok) {
        free(fail);
        pto_tm_clear(&o->tm);   /* reclaimed slots skipped their erase (ending) */
        pto_set_error("the Worker was shut down before the run drained");
        return -1;
    }
    pto_slot_pool_reset(&o->pool);
    pto_tm_clear(&o->tm);
    for (int32_t r = 0; r < PTO_MAX_RING_DEPTH; r++) pto_ring_reset(&o->rings[r]);
    cfgs_free(o);
    if (atomic_load(&o->sched->cancel)) {
        free(fail);
        pto_set_error("interrupted");
        return -1;
    }
    if (fail) {
        pto_set_error("%s", fail);
        free(fail);
        return -1;
    }
    return 0;
}
