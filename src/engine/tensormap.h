/* TensorMap: for each
 * storage base, the byte ranges written by live producers. Lookups return
 * every producer whose range overlaps the query, so disjoint views of one
 * storage never serialise. Only the orchestrator thread touches it; entries
 * are erased when their producer is reclaimed, so its size tracks the live
 * tasks, not the length of the run. */
#ifndef PTO_TENSORMAP_H
#define PTO_TENSORMAP_H

#include <stdbool.h>
#include <stdint.h>
#include "u64map.h"

struct pto_slot;

typedef struct pto_tm_entry {
    uint64_t start, end;             /* absolute byte addresses */
    struct pto_slot *producer;
} pto_tm_entry;

/* Most bases have one writer at a time, so the first entry lives in the
 * cell: inserting and erasing it costs no malloc/free. cap == 0 means the
 * entries are `one`; cap > 0 means `more` holds them (one is unused).
 *
 * Many writers of one base (the tiles of a big tensor, the slabs of a heap
 * ring) must not cost a scan of all of them per lookup, so `more` is kept
 * sorted by start, and maxlen bounds how far before a query an overlapping
 * entry can start: a lookup is a binary search plus the entries it meets.
 * An erased entry becomes a tombstone (producer NULL) that keeps the order;
 * tombstones are reused by an insert that lands on them and squeezed out
 * once they are half of the array, so heap-ring slabs (appended in address
 * order, erased oldest first) cost O(1) amortised and O(log n) to find. */
typedef struct pto_tm_base {
    PTO_U64MAP_CELL_HEAD             /* key: the base */
    int32_t count;                   /* entries in more, tombstones included (one: 0 or 1) */
    pto_tm_entry one;
    pto_tm_entry *more;
    int32_t cap;
    int32_t dead;                    /* tombstones in more */
    uint64_t maxlen;                 /* >= every entry's end - start in more */
} pto_tm_base;
_Static_assert(sizeof(pto_tm_base) == 64, "a TensorMap cell is one cache line");

typedef struct pto_tensormap {
    pto_u64map bases;                /* of pto_tm_base cells */
    size_t nbases_hwm;               /* since the last clear: sizes the table for the next run */
    size_t spilled;                  /* cells whose entries are in more: a clear frees them */
    int64_t live, hwm;               /* entries */
} pto_tensormap;

void pto_tm_init(pto_tensormap *m);
void pto_tm_destroy(pto_tensormap *m);
/* Call fn(producer, arg) for every live producer overlapping [start, end) of base. */
void pto_tm_lookup(pto_tensormap *m, uint64_t base, uint64_t start, uint64_t end,
                   void (*fn)(struct pto_slot *, void *), void *arg);
/* Start loading base's cell, for a lookup or insert a little later. */
static inline void pto_tm_prefetch(const pto_tensormap *m, uint64_t base) { pto_u64map_prefetch(&m->bases, base); }
/* Record producer as the writer of [start, end) of base; entries it covers
 * completely are dropped (their readers now depend on the new writer). */
void pto_tm_insert(pto_tensormap *m, uint64_t base, uint64_t start, uint64_t end, struct pto_slot *producer);
/* Drop every entry of producer on base. */
void pto_tm_erase(pto_tensormap *m, uint64_t base, struct pto_slot *producer);
/* Drop producer's entry [start, end) of base, if it still has one (a later writer may have covered it):
 * the erase of a reclaimed task's tensor, found by binary search. */
void pto_tm_erase_range(pto_tensormap *m, uint64_t base, uint64_t start, uint64_t end, struct pto_slot *producer);
/* Whether producer has an entry on base (a linear scan: for asserts). */
bool pto_tm_holds(pto_tensormap *m, uint64_t base, const struct pto_slot *producer);
/* Call fn(base, entry, arg) for every live entry (inspection: orch:tensormap). */
void pto_tm_each(pto_tensormap *m, void (*fn)(uint64_t base, const pto_tm_entry *e, void *arg), void *arg);
/* Drop everything (end of run). */
void pto_tm_clear(pto_tensormap *m);

#endif
