#include "tensormap.h"
#include "common.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define TM_MIN_CELLS 64u

static uint32_t hash64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (uint32_t)x;
}

static inline pto_tm_entry *ents(pto_tm_base *b) { return b->cap ? b->more : &b->one; }

void pto_tm_init(pto_tensormap *m)
{
    memset(m, 0, sizeof *m);
    m->mask = TM_MIN_CELLS - 1;
    m->cells = pto_xcalloc(m->mask + 1, sizeof *m->cells);
}

void pto_tm_destroy(pto_tensormap *m)
{
    for (uint32_t i = 0; i <= m->mask; i++) free(m->cells[i].more);
    free(m->cells);
    memset(m, 0, sizeof *m);
}

static pto_tm_base *find(pto_tensormap *m, uint64_t base)
{
    for (uint32_t i = hash64(base) & m->mask;; i = (i + 1) & m->mask) {
        if (m->cells[i].base == base) return &m->cells[i];
        if (m->cells[i].base == 0) return NULL;
    }
}

static void rehash(pto_tensormap *m, uint32_t ncells)
{
    pto_tm_base *old = m->cells;
    uint32_t oldn = m->mask + 1;
    m->cells = pto_xcalloc(ncells, sizeof *m->cells);
    m->mask = ncells - 1;
    for (uint32_t i = 0; i < oldn; i++) {
        if (!old[i].base) continue;
        uint32_t j = hash64(old[i].base) & m->mask;
        while (m->cells[j].base) j = (j + 1) & m->mask;
        m->cells[j] = old[i];
    }
    free(old);
}

static pto_tm_base *find_or_add(pto_tensormap *m, uint64_t base)
{
    pto_tm_base *b = find(m, base);
    if (b) return b;
    if ((m->nbases + 1) * 4 > (m->mask + 1) * 3) rehash(m, (m->mask + 1) * 2);
    uint32_t i = hash64(base) & m->mask;
    while (m->cells[i].base) i = (i + 1) & m->mask;
    m->cells[i].base = base;
    if (++m->nbases > m->nbases_hwm) m->nbases_hwm = m->nbases;
    return &m->cells[i];
}

/* Backward-shift deletion keeps probe chains intact without tombstones. */
static void remove_cell(pto_tensormap *m, pto_tm_base *b)
{
    uint32_t i = (uint32_t)(b - m->cells);
    free(b->more);
    memset(b, 0, sizeof *b);
    m->nbases--;
    for (uint32_t j = (i + 1) & m->mask; m->cells[j].base; j = (j + 1) & m->mask) {
        uint32_t home = hash64(m->cells[j].base) & m->mask;
        /* Move j into the hole at i unless its home lies cyclically in (i, j]. */
        bool stays = (i < j) ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            m->cells[i] = m->cells[j];
            memset(&m->cells[j], 0, sizeof m->cells[j]);
            i = j;
        }
    }
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
    if (m->nbases) {
        for (uint32_t i = 0; i <= m->mask; i++) {
            free(m->cells[i].more);
            memset(&m->cells[i], 0, sizeof m->cells[i]);
        }
    }
    uint64_t want = TM_MIN_CELLS;
    while (want * 3 < (uint64_t)m->nbases_hwm * 4) want *= 2;
    if (want * 4 <= (uint64_t)m->mask + 1) {
        free(m->cells);
        m->cells = pto_xcalloc(want, sizeof *m->cells);
        m->mask = (uint32_t)want - 1;
    }
    m->nbases = 0;
    m->nbases_hwm = 0;
    m->live = 0;
}

void pto_tm_each(pto_tensormap *m, void (*fn)(uint64_t base, const pto_tm_entry *e, void *arg), void *arg)
{
    for (uint32_t c = 0; c <= m->mask; c++) {
        pto_tm_base *b = &m->cells[c];
        if (!b->base) continue;
        const pto_tm_entry *e = ents(b);
        for (int32_t i = 0; i < b->count; i++) fn(b->base, &e[i], arg);
    }
}
