/* TensorMap: for each
 * storage base, the byte ranges written by live producers. Lookups return
 * every producer whose range overlaps the query, so disjoint views of one
 * storage never serialise. Only the orchestrator thread touches it; entries
 * are erased when their producer is reclaimed, so its size tracks the live
 * tasks, not the length of the run. */
#ifndef PTO_TENSORMAP_H
#define PTO_TENSORMAP_H

#include <stdint.h>
#include "u64map.h"

struct pto_slot;

typedef struct pto_tm_entry {
    uint64_t start, end;             /* absolute byte addresses */
    struct pto_slot *producer;
} pto_tm_entry;

/* Most bases have one writer at a time, so the first entry lives in the
 * cell: inserting and erasing it costs no malloc/free. cap == 0 means the
 * entries are `one`; cap > 0 means `more` holds them (one is unused). */
typedef struct pto_tm_base {
    uint64_t base;                   /* the key (u64map.h); 0 = empty cell */
    pto_tm_entry one;
    pto_tm_entry *more;
    int32_t count, cap;
} pto_tm_base;

typedef struct pto_tensormap {
    pto_u64map bases;                /* of pto_tm_base cells */
    size_t nbases_hwm;               /* since the last clear: sizes the table for the next run */
    int64_t live, hwm;               /* entries */
} pto_tensormap;

void pto_tm_init(pto_tensormap *m);
void pto_tm_destroy(pto_tensormap *m);
/* Call fn(producer, arg) for every live producer overlapping [start, end) of base. */
void pto_tm_lookup(pto_tensormap *m, uint64_t base, uint64_t start, uint64_t end,
                   void (*fn)(struct pto_slot *, void *), void *arg);
/* Record producer as the writer of [start, end) of base; entries it covers
 * completely are dropped (their readers now depend on the new writer). */
void pto_tm_insert(pto_tensormap *m, uint64_t base, uint64_t start, uint64_t end, struct pto_slot *producer);
/* Drop every entry of producer on base. */
void pto_tm_erase(pto_tensormap *m, uint64_t base, struct pto_slot *producer);
/* Call fn(base, entry, arg) for every live entry (inspection: orch:tensormap). */
void pto_tm_each(pto_tensormap *m, void (*fn)(uint64_t base, const pto_tm_entry *e, void *arg), void *arg);
/* Drop everything (end of run). */
void pto_tm_clear(pto_tensormap *m);

#endif
