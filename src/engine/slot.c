#include "slot.h"
#include "common.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

bool pto_slot_try_ref(pto_slot *s)
{
    uint64_t old = atomic_load_explicit(&s->fanout, memory_order_relaxed);
    for (;;) {
        uint32_t total = (uint32_t)(old >> 32), rel = (uint32_t)old;
        if (rel >= total + 1) return false;
        if (atomic_compare_exchange_weak_explicit(&s->fanout, &old, pto_fanout_pack(total + 1, rel),
                                                  memory_order_acq_rel, memory_order_relaxed))
            return true;
    }
}

bool pto_slot_release(pto_slot *s)
{
    uint64_t old = atomic_fetch_add_explicit(&s->fanout, 1, memory_order_acq_rel);
    uint32_t total = (uint32_t)(old >> 32), rel = (uint32_t)old + 1;
    if (rel != total + 1) return false;
    atomic_store_explicit(&s->state, PTO_TASK_CONSUMED, memory_order_release);
    return true;
}

void pto_slot_poison(pto_slot *s, int64_t failed_producer)
{
    s->poisoned = true;
    if (s->error) return;
    if (failed_producer >= 0)
        s->error = pto_xasprintf("task %lld was not run: its producer task %lld failed", (long long)s->id,
                                 (long long)failed_producer);
    else
        s->error = pto_xasprintf("task %lld was not run: the run was interrupted", (long long)s->id);
}

void pto_slot_pool_init(pto_slot_pool *p) { memset(p, 0, sizeof *p); }

static void chunk_free(pto_slot_chunk *c)
{
    for (int i = 0; i < PTO_SLOT_CHUNK; i++) {
        free(c->slots[i].buf);
        free(c->slots[i].consumers);
        free(c->slots[i].error);
    }
    free(c);
}

void pto_slot_pool_destroy(pto_slot_pool *p)
{
    for (int32_t i = 0; i < p->dir_len; i++)
        if (p->dir[i]) chunk_free(p->dir[i]);
    while (p->free_chunks) {
        pto_slot_chunk *c = p->free_chunks;
        p->free_chunks = c->next_free;
        chunk_free(c);
    }
    free(p->dir);
    memset(p, 0, sizeof *p);
}

static pto_slot_chunk *chunk_take(pto_slot_pool *p, int64_t first_id)
{
    pto_slot_chunk *c = p->free_chunks;
    if (c) {
        p->free_chunks = c->next_free;
        p->nfree--;
    } else {
        c = pto_xcalloc(1, sizeof *c);
        for (int i = 0; i < PTO_SLOT_CHUNK; i++) c->slots[i].chunk = c;
    }
    c->first_id = first_id;
    c->live = 0;
    c->next_free = NULL;
    if (++p->in_use > p->in_use_hwm) p->in_use_hwm = p->in_use;
    return c;
}

/* Free chunks kept for reuse: a few for the next burst, and as many as the
 * previous run peaked at, so repeating a run of many live tasks does not
 * fault in (and then unmap) fresh chunks every time. A smaller run gives
 * the surplus back when it ends. */
static int32_t keep_limit(const pto_slot_pool *p)
{
    int32_t k = p->keep > p->in_use_hwm ? p->keep : p->in_use_hwm;
    return k > 8 ? k : 8;
}

static void chunk_give(pto_slot_pool *p, pto_slot_chunk *c)
{
    p->in_use--;
    if (p->nfree >= keep_limit(p)) {
        chunk_free(c);
        return;
    }
    c->next_free = p->free_chunks;
    p->free_chunks = c;
    p->nfree++;
}

pto_slot *pto_slot_alloc(pto_slot_pool *p)
{
    int64_t id = p->next_id++;
    int64_t cn = id / PTO_SLOT_CHUNK;
    int32_t idx = (int32_t)(id % PTO_SLOT_CHUNK);
    if (idx == 0) {
        if (p->dir_len == 0) p->dir_first = cn;
        pto_grow((void **)&p->dir, &p->dir_cap, p->dir_len + 1, sizeof *p->dir);
        p->dir[p->dir_len++] = chunk_take(p, id);
    }
    pto_slot_chunk *c = p->dir[cn - p->dir_first];
    c->live++;
    p->live++;
    pto_slot *s = &c->slots[idx];
    /* Reset everything but the reusable storage. */
    s->id = id;
    atomic_store_explicit(&s->state, PTO_TASK_PENDING, memory_order_relaxed);
    s->kind = PTO_NEXT_LEVEL;
    atomic_store_explicit(&s->failed, false, memory_order_relaxed);
    s->poisoned = false;
    s->scope_held = false;
    s->ring = -1;
    s->group_size = 1;
    atomic_store_explicit(&s->worker, -1, memory_order_relaxed);
    s->callable = 0;
    s->cfg = NULL;
    s->members = &s->member0;
    memset(&s->member0, 0, sizeof s->member0);
    s->member0.pin = -1;
    s->refs = s->inl_refs;
    s->nrefs = 0;
    atomic_store_explicit(&s->fanout, 0, memory_order_relaxed);
    s->fanin_count = 0;
    s->fanin_released = 0;
    s->nconsumers = 0;
    s->members_done = 0;
    s->chained = false;
    s->early = false;
    /* Its task-end words were let go when it finished (scheduler.c), and
     * calloc zeroed them first. */
    assert(!s->done.stamp && !s->nwaits);
    atomic_store_explicit(&s->group_failed, false, memory_order_relaxed);
    atomic_store_explicit(&s->ran_ok, false, memory_order_relaxed);
    free(s->error);
    s->error = NULL;
    s->slab_off = s->slab_bytes = 0;
    s->slab_seq = 0;
    s->next_ready = NULL;
    s->mark = 0;
    return s;
}

pto_slot *pto_slot_get(pto_slot_pool *p, int64_t id)
{
    if (id < 0 || id >= p->next_id || p->dir_len == 0) return NULL;
    int64_t cn = id / PTO_SLOT_CHUNK;
    if (cn < p->dir_first || cn >= p->dir_first + p->dir_len) return NULL;
    pto_slot_chunk *c = p->dir[cn - p->dir_first];
    if (!c) return NULL;
    pto_slot *s = &c->slots[id % PTO_SLOT_CHUNK];
    if (s->id != id || atomic_load_explicit(&s->state, memory_order_acquire) == PTO_TASK_FREE) return NULL;
    return s;
}

void pto_slot_recycle(pto_slot_pool *p, pto_slot *s)
{
    assert(atomic_load_explicit(&s->state, memory_order_relaxed) == PTO_TASK_CONSUMED);
    atomic_store_explicit(&s->state, PTO_TASK_FREE, memory_order_relaxed);
    pto_slot_chunk *c = s->chunk;
    p->live--;
    /* A chunk whose ids are all handed out and all recycled is free. */
    if (--c->live > 0 || p->next_id < c->first_id + PTO_SLOT_CHUNK) return;
    int64_t i = c->first_id / PTO_SLOT_CHUNK - p->dir_first;
    p->dir[i] = NULL;
    chunk_give(p, c);
    int32_t skip = 0;
    while (skip < p->dir_len && !p->dir[skip]) skip++;
    if (skip) {
        memmove(p->dir, p->dir + skip, (size_t)(p->dir_len - skip) * sizeof *p->dir);
        p->dir_len -= skip;
        p->dir_first += skip;
    }
}

void pto_slot_pool_reset(pto_slot_pool *p)
{
    for (int32_t i = 0; i < p->dir_len; i++)
        if (p->dir[i]) chunk_give(p, p->dir[i]);
    p->keep = p->in_use_hwm;
    p->in_use_hwm = p->in_use;
    while (p->nfree > (p->keep > 8 ? p->keep : 8)) {
        pto_slot_chunk *c = p->free_chunks;
        p->free_chunks = c->next_free;
        p->nfree--;
        chunk_free(c);
    }
    p->dir_len = 0;
    p->dir_first = 0;
    p->next_id = 0;
    p->live = 0;
}

/* Make room in s->buf for n bytes, keeping nothing. */
static void *slot_buf(pto_slot *s, size_t n)
{
    if (n > s->buf_cap) {
        free(s->buf);
        s->buf_cap = n < 256 ? 256 : pto_align_up(n, 256);
        s->buf = pto_xmalloc(s->buf_cap);
    }
    return s->buf;
}

pto_slot_arrays pto_slot_carve(pto_slot *s, int32_t nmembers, int32_t ntensors, int32_t nscalars, int32_t nrefs)
{
    size_t need = (nmembers > 1 ? sizeof(pto_member) * (size_t)nmembers : 0) +
                  (ntensors > PTO_SLOT_INLINE_TENSORS ? sizeof(pto_tensor) * (size_t)ntensors : 0) +
                  (nscalars > PTO_SLOT_INLINE_SCALARS ? 8 * (size_t)nscalars : 0) +
                  (nrefs > PTO_SLOT_INLINE_REFS ? sizeof(pto_ref) * (size_t)nrefs : 0) +
                  (ntensors > PTO_SLOT_INLINE_TENSORS ? (size_t)ntensors : 0);
    assert(nmembers >= 1 && ntensors >= 0 && nscalars >= 0 && nrefs >= 0);
    uint8_t *buf = need ? slot_buf(s, need) : NULL;
    pto_slot_arrays arr = {s->inl_tensors, s->inl_scalars, s->inl_tags};
    if (nmembers > 1) {
        s->members = (pto_member *)buf;
        buf += sizeof(pto_member) * (size_t)nmembers;
    }
    if (ntensors > PTO_SLOT_INLINE_TENSORS) {
        arr.tensors = (pto_tensor *)buf;
        buf += sizeof(pto_tensor) * (size_t)ntensors;
    }
    if (nscalars > PTO_SLOT_INLINE_SCALARS) {
        arr.scalars = (uint64_t *)buf;
        buf += 8 * (size_t)nscalars;
    }
    if (nrefs > PTO_SLOT_INLINE_REFS) {
        s->refs = (pto_ref *)buf;
        buf += sizeof(pto_ref) * (size_t)nrefs;
    }
    if (ntensors > PTO_SLOT_INLINE_TENSORS) arr.tags = buf;   /* last: no alignment needed */
    return arr;
}
