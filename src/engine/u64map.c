#include "u64map.h"
#include "common.h"

#include <assert.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static size_t table_bytes(const pto_u64map *m, size_t ncells) { return ncells * m->cell_size; }

/* Zeroed cells. Tables of PTO_HUGE_PAGE bytes or more are mapped on their
 * own and asked for huge pages. A run of 200k tasks, each writing its own
 * buffer, keeps 200k live keys: a 32 MiB table whose every probe lands on a
 * random 4 KiB page, so besides the cache miss each costs a page walk. With
 * 2 MiB pages the walks go, and so do all but one page fault per 2 MiB when
 * the table is first written. */
static void *table_new(const pto_u64map *m, size_t ncells)
{
    size_t bytes = table_bytes(m, ncells);
    return bytes >= PTO_HUGE_PAGE ? pto_xmap_huge(bytes) : pto_xcalloc(ncells, m->cell_size);
}

static void table_free(const pto_u64map *m, void *cells, size_t ncells)
{
    size_t bytes = table_bytes(m, ncells);
    if (!cells) return;
    if (bytes >= PTO_HUGE_PAGE) munmap(cells, pto_huge_len(bytes));
    else free(cells);
}

/* The cell's epoch, to be set (its key by pto_u64map_cell_key). */
static inline uint32_t *epoch_of(void *cell) { return (uint32_t *)((char *)cell + sizeof(uint64_t)); }

void pto_u64map_init(pto_u64map *m, size_t cell_size, size_t min_cells)
{
    assert(cell_size >= sizeof(uint64_t) + sizeof(uint32_t) && min_cells && (min_cells & (min_cells - 1)) == 0);
    memset(m, 0, sizeof *m);
    m->cell_size = cell_size;
    m->min_cells = min_cells;
    m->epoch = 1;
}

void pto_u64map_destroy(pto_u64map *m)
{
    table_free(m, m->cells, pto_u64map_cells(m));
    m->cells = NULL;
    m->mask = 0;
    m->count = 0;
}

void *pto_u64map_find(const pto_u64map *m, uint64_t key)
{
    if (!m->cells) return NULL;
    for (size_t i = pto_u64map_home(m, key);; i = (i + 1) & m->mask) {
        void *c = pto_u64map_cell(m, i);
        if (pto_u64map_cell_epoch(c) != m->epoch) return NULL;
        if (pto_u64map_cell_key(c) == key) return c;
    }
}

/* The first free cell of key's probe (key not in the map), zeroed. */
static void *free_cell(pto_u64map *m, uint64_t key)
{
    size_t i = pto_u64map_home(m, key);
    while (pto_u64map_used(m, i)) i = (i + 1) & m->mask;
    void *c = pto_u64map_cell(m, i);
    if (pto_u64map_cell_epoch(c)) memset(c, 0, m->cell_size);   /* left by an earlier epoch */
    return c;
}

void pto_u64map_resize(pto_u64map *m, size_t ncells)
{
    assert(ncells && (ncells & (ncells - 1)) == 0 && ncells > m->count);
    char *old = m->cells;
    size_t oldn = pto_u64map_cells(m);
    m->cells = table_new(m, ncells);
    m->mask = ncells - 1;
    for (size_t i = 0; i < oldn; i++) {
        const char *c = old + i * m->cell_size;
        if (pto_u64map_cell_epoch(c) == m->epoch) memcpy(free_cell(m, pto_u64map_cell_key(c)), c, m->cell_size);
    }
    table_free(m, old, oldn);
}

void *pto_u64map_add(pto_u64map *m, uint64_t key)
{
    assert(key != 0 && m->epoch != 0);   /* made by pto_u64map_init, or an initializer that sets epoch */
    void *c = pto_u64map_find(m, key);
    if (c) return c;
    if (!m->cells) pto_u64map_resize(m, m->min_cells);
    else if ((m->count + 1) * 4 > (m->mask + 1) * 3) pto_u64map_resize(m, (m->mask + 1) * 2);
    c = free_cell(m, key);
    *(uint64_t *)c = key;
    *epoch_of(c) = m->epoch;
    m->count++;
    return c;
}

void pto_u64map_remove(pto_u64map *m, void *cell)
{
    size_t i = (size_t)((char *)cell - (char *)m->cells) / m->cell_size;
    memset(cell, 0, m->cell_size);
    m->count--;
    for (size_t j = (i + 1) & m->mask; pto_u64map_used(m, j); j = (j + 1) & m->mask) {
        size_t home = pto_u64map_home(m, pto_u64map_cell_key(pto_u64map_cell(m, j)));
        /* Move j into the hole at i unless its home lies cyclically in (i, j]. */
        bool stays = (i < j) ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            memcpy(pto_u64map_cell(m, i), pto_u64map_cell(m, j), m->cell_size);
            memset(pto_u64map_cell(m, j), 0, m->cell_size);
            i = j;
        }
    }
}

void pto_u64map_clear(pto_u64map *m)
{
    if (!m->count) return;
    m->count = 0;
    if (++m->epoch != 0) return;
    /* The epoch wrapped: cells of 2^32 clears ago would look used again. */
    if (m->cells) memset(m->cells, 0, pto_u64map_cells(m) * m->cell_size);
    m->epoch = 1;
}
