#include "tensormap.h"
#include "common.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static uint32_t hash64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (uint32_t)x;
}

void pto_tm_init(pto_tensormap *m)
{
    memset(m, 0, sizeof *m);
    m->mask = 63;
    m->cells = pto_xcalloc(m->mask + 1, sizeof *m->cells);
}

void pto_tm_destroy(pto_tensormap *m)
{
    for (uint32_t i = 0; i <= m->mask; i++) free(m->cells[i].entries);
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
    m->nbases++;
    return &m->cells[i];
}

/* Backward-shift deletion keeps probe chains intact without tombstones. */
static void remove_cell(pto_tensormap *m, pto_tm_base *b)
{
    uint32_t i = (uint32_t)(b - m->cells);
    free(b->entries);
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
    for (int32_t k = 0; k < b->count; k++) {
        pto_tm_entry *e = &b->entries[k];
        if (e->start < end && start < e->end) fn(e->producer, arg);
    }
}

void pto_tm_insert(pto_tensormap *m, uint64_t base, uint64_t start, uint64_t end, struct pto_slot *producer)
{
    pto_tm_base *b = find_or_add(m, base);
    for (int32_t k = 0; k < b->count;) {
        pto_tm_entry *e = &b->entries[k];
        if (e->producer == producer && e->start == start && e->end == end) return;
        if (start <= e->start && e->end <= end) {
            b->entries[k] = b->entries[--b->count];
            m->live--;
        } else {
            k++;
        }
    }
    pto_grow((void **)&b->entries, &b->cap, b->count + 1, sizeof *b->entries);
    b->entries[b->count++] = (pto_tm_entry){start, end, producer};
    if (++m->live > m->hwm) m->hwm = m->live;
}

void pto_tm_erase(pto_tensormap *m, uint64_t base, struct pto_slot *producer)
{
    pto_tm_base *b = find(m, base);
    if (!b) return;
    for (int32_t k = 0; k < b->count;) {
        if (b->entries[k].producer == producer) {
            b->entries[k] = b->entries[--b->count];
            m->live--;
        } else {
            k++;
        }
    }
    if (b->count == 0) remove_cell(m, b);
}

void pto_tm_clear(pto_tensormap *m)
{
    for (uint32_t i = 0; i <= m->mask; i++) {
        free(m->cells[i].entries);
        memset(&m->cells[i], 0, sizeof m->cells[i]);
    }
    m->nbases = 0;
    m->live = 0;
}
