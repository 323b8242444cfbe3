#include "tensormap.h"
#include "common.h"

#include <assert.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define TM_MIN_CELLS 64u

static inline pto_tm_entry *ents(pto_tm_base *b) { return b->cap ? b->more : &b->one; }

void pto_tm_init(pto_tensormap *m)
{
    memset(m, 0, sizeof *m);
    pto_u64map_init(&m->bases, sizeof(pto_tm_base), TM_MIN_CELLS);
    pto_u64map_resize(&m->bases, TM_MIN_CELLS);
}

/* A run that ends with thousands of bases, each with its one writer,
 * frees nothing here: only cells that spilled into more are looked for. */
static void free_entries(pto_tensormap *m)
{
    for (size_t i = 0; m->spilled && i < pto_u64map_cells(&m->bases); i++) {
        pto_tm_base *b = pto_u64map_cell(&m->bases, i);
        if (!pto_u64map_used(&m->bases, i) || !b->cap) continue;
        free(b->more);
        b->more = NULL;
        m->spilled--;
    }
    assert(m->spilled == 0);
}

void pto_tm_destroy(pto_tensormap *m)
{
    free_entries(m);
    pto_u64map_destroy(&m->bases);
    memset(m, 0, sizeof *m);
}

static pto_tm_base *find(pto_tensormap *m, uint64_t base) { return pto_u64map_find(&m->bases, base); }

static pto_tm_base *find_or_add(pto_tensormap *m, uint64_t base)
{
    pto_tm_base *b = pto_u64map_add(&m->bases, base);
    if (m->bases.count > m->nbases_hwm) m->nbases_hwm = m->bases.count;
    return b;
}

static void remove_cell(pto_tensormap *m, pto_tm_base *b)
{
    if (b->cap) {
        free(b->more);
        m->spilled--;
    }
    pto_u64map_remove(&m->bases, b);
}

/* First index of es[0..n) whose start is >= key (upper: > key). */
static int32_t lower(const pto_tm_entry *es, int32_t n, uint64_t key)
{
    int32_t lo = 0, hi = n;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (es[mid].start < key) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static int32_t upper(const pto_tm_entry *es, int32_t n, uint64_t key)
{
    int32_t lo = 0, hi = n;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (es[mid].start <= key) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* The first entry that can overlap [start, ...): none starting maxlen or more before it. */
static int32_t first_candidate(const pto_tm_base *b, uint64_t start)
{
    return lower(b->more, b->count, b->maxlen <= start ? start - b->maxlen + 1 : 0);
}

static void entomb(pto_tensormap *m, pto_tm_base *b, pto_tm_entry *e)
{
    e->producer = NULL;
    b->dead++;
    m->live--;
}

/* Squeeze the tombstones out once they are half the array: amortised O(1) per erase. */
static void maybe_compact(pto_tm_base *b)
{
    if (b->dead < 16 || b->dead * 2 < b->count) return;
    int32_t n = 0;
    uint64_t maxlen = 0;
    for (int32_t k = 0; k < b->count; k++) {
        if (!b->more[k].producer) continue;
        b->more[n++] = b->more[k];
        if (b->more[k].end - b->more[k].start > maxlen) maxlen = b->more[k].end - b->more[k].start;
    }
    b->count = n;
    b->dead = 0;
    b->maxlen = maxlen;
}

static void drop_if_empty(pto_tensormap *m, pto_tm_base *b)
{
    if ((b->cap ? b->count - b->dead : b->count) == 0) remove_cell(m, b);
}

void pto_tm_lookup(pto_tensormap *m, uint64_t base, uint64_t start, uint64_t end,
                   void (*fn)(struct pto_slot *, void *), void *arg)
{
    pto_tm_base *b = find(m, base);
    if (!b) return;
    if (!b->cap) {
        if (b->count && b->one.start < end && start < b->one.end) fn(b->one.producer, arg);
        return;
    }
    for (int32_t k = first_candidate(b, start); k < b->count && b->more[k].start < end; k++) {
        pto_tm_entry *e = &b->more[k];
        if (e->producer && start < e->end) fn(e->producer, arg);
    }
}

/* A second entry: the cell's one moves into a sorted array. */
static void spill(pto_tensormap *m, pto_tm_base *b)
{
    m->spilled++;
    b->cap = 4;
    b->more = pto_xmalloc((size_t)b->cap * sizeof *b->more);
    b->more[0] = b->one;
    b->dead = 0;
    b->maxlen = b->one.end - b->one.start;
}

void pto_tm_insert(pto_tensormap *m, uint64_t base, uint64_t start, uint64_t end, struct pto_slot *producer)
{
    pto_tm_base *b = find_or_add(m, base);
    pto_tm_entry ne = {start, end, producer};
    if (!b->cap) {
        if (b->count == 1) {
            pto_tm_entry *e = &b->one;
            if (e->producer == producer && e->start == start && e->end == end) return;
            if (start <= e->start && e->end <= end) {   /* covered: the new writer replaces it */
                *e = ne;
                return;
            }
            spill(m, b);
        } else {
            b->one = ne;
            b->count = 1;
            if (++m->live > m->hwm) m->hwm = m->live;
            return;
        }
    }
    /* Entries the new range covers completely start inside it. */
    for (int32_t k = lower(b->more, b->count, start); k < b->count && b->more[k].start <= end; k++) {
        pto_tm_entry *e = &b->more[k];
        if (!e->producer) continue;
        if (e->producer == producer && e->start == start && e->end == end) return;
        if (e->end <= end) entomb(m, b, e);
    }
    int32_t pos = upper(b->more, b->count, start);
    if (pos > 0 && !b->more[pos - 1].producer) {   /* a tombstone right before: the order holds */
        b->more[pos - 1] = ne;
        b->dead--;
    } else {
        pto_grow((void **)&b->more, &b->cap, b->count + 1, sizeof *b->more);
        memmove(&b->more[pos + 1], &b->more[pos], (size_t)(b->count - pos) * sizeof *b->more);
        b->more[pos] = ne;
        b->count++;
    }
    if (end - start > b->maxlen) b->maxlen = end - start;
    if (++m->live > m->hwm) m->hwm = m->live;
    maybe_compact(b);
}

void pto_tm_erase(pto_tensormap *m, uint64_t base, struct pto_slot *producer)
{
    pto_tm_base *b = find(m, base);
    if (!b) return;
    if (!b->cap) {
        if (b->count && b->one.producer == producer) {
            b->count = 0;
            m->live--;
        }
    } else {
        for (int32_t k = 0; k < b->count; k++)
            if (b->more[k].producer == producer) entomb(m, b, &b->more[k]);
        maybe_compact(b);
    }
    drop_if_empty(m, b);
}

void pto_tm_erase_range(pto_tensormap *m, uint64_t base, uint64_t start, uint64_t end, struct pto_slot *producer)
{
    pto_tm_base *b = find(m, base);
    if (!b) return;
    if (!b->cap) {
        if (b->count && b->one.producer == producer && b->one.start == start && b->one.end == end) {
            b->count = 0;
            m->live--;
        }
    } else {
        for (int32_t k = lower(b->more, b->count, start); k < b->count && b->more[k].start == start; k++) {
            pto_tm_entry *e = &b->more[k];
            if (e->producer == producer && e->end == end) {
                entomb(m, b, e);
                break;   /* an insert never repeats an entry */
            }
        }
        maybe_compact(b);
    }
    drop_if_empty(m, b);
}

bool pto_tm_holds(pto_tensormap *m, uint64_t base, const struct pto_slot *producer)
{
    pto_tm_base *b = find(m, base);
    if (!b) return false;
    const pto_tm_entry *e = ents(b);
    for (int32_t k = 0; k < b->count; k++)
        if (e[k].producer == producer) return true;
    return false;
}

void pto_tm_clear(pto_tensormap *m)
{
    /* A run that drained has erased every entry, so usually only the size
     * is decided here. A table sized for an earlier, larger run would make
     * every lookup of a small run a cache miss (and the old clear memset it
     * all once per run), so it shrinks to what this run needed. */
    if (m->bases.count) {
        free_entries(m);
        pto_u64map_clear(&m->bases);
    }
    uint64_t want = TM_MIN_CELLS;
    while (want * 3 < (uint64_t)m->nbases_hwm * 4) want *= 2;
    if (want * 4 <= (uint64_t)pto_u64map_cells(&m->bases)) pto_u64map_resize(&m->bases, (size_t)want);
    m->nbases_hwm = 0;
    m->live = 0;
}

void pto_tm_each(pto_tensormap *m, void (*fn)(uint64_t base, const pto_tm_entry *e, void *arg), void *arg)
{
    for (size_t c = 0; c < pto_u64map_cells(&m->bases); c++) {
        pto_tm_base *b = pto_u64map_cell(&m->bases, c);
        if (!pto_u64map_used(&m->bases, c)) continue;
        const pto_tm_entry *e = ents(b);
        for (int32_t i = 0; i < b->count; i++)
            if (e[i].producer) fn(b->key, &e[i], arg);
    }
}
