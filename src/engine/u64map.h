/* A small hash map keyed by a non-zero uint64_t, shared by the TensorMap
 * (storage base -> its writers) and the shared-memory allocator (block
 * offset -> block): open addressing with linear probing, a power-of-two
 * table kept at most 3/4 full, and backward-shift deletion, so there are
 * no tombstones and a long run of inserts and erases never degrades it.
 *
 * Cells are the caller's structs that begin with PTO_U64MAP_CELL_HEAD (the
 * key and the map's epoch when it was added), so a value lives in its
 * cell: adding a key costs no allocation of its own. A cell is in use
 * only while its epoch is the map's; clearing the map moves the epoch on
 * instead of writing the table. Why: the TensorMap is cleared at the end
 * of every run, and a run of 200k tasks that each wrote a buffer of its
 * own leaves a 32 MiB table, whose memset took 8 ms of a 140 ms run on the
 * orchestrator's critical path. Cell pointers stay valid until the next
 * add, remove, clear or resize. Not thread-safe: each user holds its own
 * lock or is the only thread that touches its map. */
#ifndef PTO_U64MAP_H
#define PTO_U64MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The first members of every cell, in this order (as libuv's
 * UV_HANDLE_FIELDS): the key, and the map's epoch when the key was added.
 * Callers declare them with this macro and may pack a 32-bit member of
 * their own right behind, in what would otherwise be padding. */
#define PTO_U64MAP_CELL_HEAD \
    uint64_t key;                    /* 0 only in a zeroed (free) cell */ \
    uint32_t epoch;                  /* in use iff equal to the map's epoch, which is never 0 */

typedef struct pto_u64map {
    void *cells;                     /* NULL until the first add or resize */
    size_t cell_size;
    size_t mask;                     /* cells - 1 */
    size_t count;                    /* keys in the map */
    size_t min_cells;                /* the table never shrinks below this (a power of two) */
    uint32_t epoch;                  /* of the cells in use; >= 1 */
} pto_u64map;

/* An empty map of cells of cell_size bytes (PTO_U64MAP_CELL_HEAD first), at least min_cells of them once used. */
void pto_u64map_init(pto_u64map *m, size_t cell_size, size_t min_cells);
/* Free the table (not what cells point to); m is then empty and usable. */
void pto_u64map_destroy(pto_u64map *m);
/* The cell of key, or NULL. */
void *pto_u64map_find(const pto_u64map *m, uint64_t key);
/* The cell of key, added (zero-filled, key set) if it was not there. */
void *pto_u64map_add(pto_u64map *m, uint64_t key);
/* Remove the cell (from find or add) from the map. */
void pto_u64map_remove(pto_u64map *m, void *cell);
/* Empty every cell, keeping the table: O(1) but once per 2^32 clears. */
void pto_u64map_clear(pto_u64map *m);
/* Rebuild the table with ncells cells (a power of two, more than count). */
void pto_u64map_resize(pto_u64map *m, size_t ncells);

/* The cell a key's probe starts at: half of MurmurHash3's finaliser, enough
 * to spread the aligned addresses and offsets the engine uses as keys. */
static inline size_t pto_u64map_home(const pto_u64map *m, uint64_t key)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    return (size_t)key & m->mask;
}

/* Start loading the cell where key's probe begins: a map too big for the
 * cache misses on every probe, and the caller may have other work to do
 * before it probes. */
static inline void pto_u64map_prefetch(const pto_u64map *m, uint64_t key)
{
    if (m->cells) __builtin_prefetch((const char *)m->cells + pto_u64map_home(m, key) * m->cell_size, 1);
}

/* Table size: iterate i < pto_u64map_cells(m), skipping cells not pto_u64map_used. */
static inline size_t pto_u64map_cells(const pto_u64map *m) { return m->cells ? m->mask + 1 : 0; }
static inline void *pto_u64map_cell(const pto_u64map *m, size_t i) { return (char *)m->cells + i * m->cell_size; }
static inline uint64_t pto_u64map_cell_key(const void *cell) { return *(const uint64_t *)cell; }
static inline uint32_t pto_u64map_cell_epoch(const void *cell)
{
    return *(const uint32_t *)((const char *)cell + sizeof(uint64_t));
}
static inline bool pto_u64map_used(const pto_u64map *m, size_t i)
{
    return pto_u64map_cell_epoch(pto_u64map_cell(m, i)) == m->epoch;
}

#endif
