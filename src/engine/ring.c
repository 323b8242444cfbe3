#include "ring.h"
#include "common.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

bool pto_ring_map(pto_heap_ring *r, uint64_t size, bool is_private)
{
    memset(r, 0, sizeof *r);
    void *p = pto_map_huge(size, (is_private ? MAP_PRIVATE : MAP_SHARED) | MAP_NORESERVE);
    if (!p) {
        pto_set_error("cannot map a heap ring of %llu bytes: %s (lower heap_ring_size)",
                      (unsigned long long)size, strerror(errno));
        return false;
    }
    r->base = p;
    r->size = size;
    return true;
}

void pto_ring_unmap(pto_heap_ring *r)
{
    if (r->base) munmap(r->base, pto_huge_len(r->size));
    free(r->fifo);
    memset(r, 0, sizeof *r);
}

static pto_slab *at(const pto_heap_ring *r, uint32_t i) { return &r->fifo[(r->head + i) & (r->cap - 1)]; }

static void fifo_grow(pto_heap_ring *r)
{
    uint32_t ncap = r->cap ? r->cap * 2 : 64;
    pto_slab *n = pto_xmalloc(ncap * sizeof *n);
    for (uint32_t i = 0; i < r->count; i++) n[i] = *at(r, i);
    free(r->fifo);
    r->fifo = n;
    r->cap = ncap;
    r->head = 0;
}

bool pto_ring_try_alloc(pto_heap_ring *r, uint64_t bytes, struct pto_slot *owner, uint64_t *off, uint64_t *seq)
{
    assert(bytes > 0 && bytes % PTO_HEAP_ALIGN == 0);
    uint64_t start;
    if (r->count == 0) {
        if (bytes > r->size) return false;
        start = 0;
    } else {
        uint64_t tail = at(r, 0)->start, top = at(r, r->count - 1)->end;
        if (top > tail) {            /* live bytes are [tail, top) */
            if (r->size - top >= bytes) start = top;
            else if (tail >= bytes) start = 0;   /* wrap: the gap at the end stays unused */
            else return false;
        } else {                     /* wrapped: live bytes are [tail, size) and [0, top) */
            if (tail - top >= bytes) start = top;
            else return false;
        }
    }
    if (r->count == r->cap) fifo_grow(r);
    pto_slab *s = &r->fifo[(r->head + r->count) & (r->cap - 1)];
    s->start = start;
    s->end = start + bytes;
    s->owner = owner;
    s->released = false;
    *seq = r->head_seq + r->count;
    r->count++;
    r->used += bytes;
    if (r->used > r->hwm) r->hwm = r->used;
    if (start + bytes > atomic_load_explicit(&r->top, memory_order_relaxed))
        atomic_store_explicit(&r->top, start + bytes, memory_order_relaxed);
    *off = start;
    return true;
}

void pto_ring_set_owner(pto_heap_ring *r, uint64_t seq, struct pto_slot *owner)
{
    assert(seq >= r->head_seq && seq - r->head_seq < r->count);
    at(r, (uint32_t)(seq - r->head_seq))->owner = owner;
}

bool pto_ring_release(pto_heap_ring *r, uint64_t seq)
{
    uint64_t i = seq - r->head_seq;
    if (seq < r->head_seq || i >= r->count) return false;
    pto_slab *s = at(r, (uint32_t)i);
    s->released = true;
    s->owner = NULL;
    r->used -= s->end - s->start;
    bool freed = false;
    while (r->count && at(r, 0)->released) {
        r->head = (r->head + 1) & (r->cap - 1);
        r->head_seq++;
        r->count--;
        freed = true;
    }
    return freed;
}

/* Slabs are in address order except for one wrap; binary-search each run. */
struct pto_slot *pto_ring_owner(const pto_heap_ring *r, uint64_t off)
{
    if (r->count == 0) return NULL;
    uint32_t wrap = r->count;    /* first index whose start is below its predecessor's */
    uint32_t lo = 1, hi = r->count;
    uint64_t first = at(r, 0)->start;
    while (lo < hi) {            /* starts >= first form a prefix */
        uint32_t mid = lo + (hi - lo) / 2;
        if (at(r, mid)->start >= first) lo = mid + 1;
        else hi = mid;
    }
    wrap = lo;
    uint32_t runs[2][2] = {{0, wrap}, {wrap, r->count}};
    for (int k = 0; k < 2; k++) {
        uint32_t a = runs[k][0], b = runs[k][1];
        while (a < b) {          /* last slab with start <= off */
            uint32_t mid = a + (b - a) / 2;
            if (at(r, mid)->start <= off) a = mid + 1;
            else b = mid;
        }
        if (a > runs[k][0]) {
            const pto_slab *s = at(r, a - 1);
            if (off < s->end && !s->released) return s->owner;
        }
    }
    return NULL;
}

const pto_slab *pto_ring_oldest(const pto_heap_ring *r) { return r->count ? at(r, 0) : NULL; }

void pto_ring_reset(pto_heap_ring *r)
{
    r->head = r->count = 0;
    r->head_seq = 0;
    r->used = 0;
    r->run_waited = 0;
}
