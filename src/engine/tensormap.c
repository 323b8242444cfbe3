#include "tensormap.h"
#include "common.h"

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

static void free_entries(pto_tensormap *m)
{
    for (size_t i = 0; i < pto_u64map_cells(&m->bases); i++)
        free(((pto_tm_base *)pto_u64map_cell(&m->bases, i))->more);
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
    free(b->more);
    pto_u64map_remove(&m->bases, b);
}

void pto_tm_lookup(pto_tensormap *m, uint64_t base, uint64_t start, uint64_t end,
                   void (*fn)(struct pto_slot *, void *), void *arg)
{
    pto_tm_base *b = find(m, base);
    if (!b) return;
    pto_tm_entry *es = ents(b);
    for (int32_t k = 0; k < b->count; k++) {
        pto_tm_entry *e = &es[k];
        if (e->start < end && start < e->end) fn(e->producer, arg);
    }
}

void pto_tm_insert(pto_tensormap *m, uint64_t base, uint64_t start, uint64_t end, struct pto_slot *producer)
{
    pto_tm_base *b = find_or_add(m, base);
    pto_tm_entry *es = ents(b);
    for (int32_t k = 0; k < b->count;) {
        pto_tm_entry *e = &es[k];
        if (e->producer == producer && e->start == start && e->end == end) return;
        if (start <= e->start && e->end <= end) {
            es[k] = es[--b->count];
            m->live--;
        } else {
            k++;
        }
    }
    if (b->count == 1 && b->cap == 0) {   /* a second entry: move out of the cell */
        b->cap = 4;
        b->more = pto_xmalloc((size_t)b->cap * sizeof *b->more);
        b->more[0] = b->one;
    } else if (b->cap) {
        pto_grow((void **)&b->more, &b->cap, b->count + 1, sizeof *b->more);
    }
    ents(b)[b->count++] = (pto_tm_entry){start, end, producer};
    if (++m->live > m->hwm) m->hwm = m->live;
}

void pto_tm_erase(pto_tensormap *m, uint64_t base, struct pto_slot *producer)
{
    pto_tm_base *b = find(m, base);
    if (!b) return;
    pto_tm_entry *es = ents(b);
    for (int32_t k = 0; k < b->count;) {
        if (es[k].producer == producer) {
            es[k] = es[--b->count];
            m->live--;
        } else {
            k++;
        }
    }
    if (b->count == 0) remove_cell(m, b);
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
        if (!b->base) continue;
        const pto_tm_entry *e = ents(b);
        for (int32_t i = 0; i < b->count; i++) fn(b->base, &e[i], arg);
    }
}
