/* Heap rings: MAX_RING_DEPTH mappings, each a circular byte heap with FIFO
 * reclamation. The mappings are taken when the Worker is created, so
 * children forked later see them at the same addresses: shared, wherever
 * another process may read them, else (a level-3 Worker in THREAD mode:
 * its chips and subs are its own threads) private. Either is aligned and
 * asked for transparent huge pages: the orchestrator runs far ahead, so
 * every intermediate lands on memory nothing touched lately, and with 4
 * KiB pages each such write costs a page walk as well as the miss (the
 * main BGEMM: THREAD mode about 5% faster, PROCESS mode about 18% where
 * the system grants shared memory huge pages). Private memory gets them
 * wherever transparent huge pages are on; shared anonymous memory is
 * shmem, which gets them only where
 * /sys/kernel/mm/transparent_hugepage/shmem_enabled allows (most systems
 * ship it "never"). Only the orchestrator thread allocates and releases,
 * so a ring needs no lock; the waiting for space lives in the
 * orchestrator. */
#ifndef PTO_RING_H
#define PTO_RING_H

#include <stdbool.h>
#include <stdatomic.h>
#include <stdint.h>

struct pto_slot;

typedef struct pto_slab {
    uint64_t start, end;          /* byte offsets in the ring */
    struct pto_slot *owner;
    bool released;
} pto_slab;

typedef struct pto_heap_ring {
    uint8_t *base;
    uint64_t size;
    pto_slab *fifo;               /* circular: oldest at head */
    uint32_t cap, head, count;
    uint64_t head_seq;            /* FIFO position of fifo[head] */
    uint64_t used, hwm;
    int64_t stalls, stall_ns;
    /* Stall advice: the bytes the orchestrator waited to be freed in this
     * run (reset with the ring), and the most capacity + that sum reached
     * in any run: a ring that large would not have made it wait. */
    uint64_t run_waited, need;
    char stall_scope[64];         /* the allocating scope's label at the last stall (stats advice) */
    _Atomic uint64_t top;         /* the highest end of any slab so far: check mode protects [0, top) */
} pto_heap_ring;

/* Map a ring of size bytes (lazily backed), shared with processes forked
 * later or (private) this process's alone; false with pto_errmsg set. */
bool pto_ring_map(pto_heap_ring *r, uint64_t size, bool is_private);
void pto_ring_unmap(pto_heap_ring *r);
/* Reserve bytes (a multiple of PTO_HEAP_ALIGN) for owner; on success stores
 * the offset and the slab's FIFO position. False when there is no room now. */
bool pto_ring_try_alloc(pto_heap_ring *r, uint64_t bytes, struct pto_slot *owner, uint64_t *off, uint64_t *seq);
/* Name the owner of the slab at FIFO position seq (reserved before its slot existed). */
void pto_ring_set_owner(pto_heap_ring *r, uint64_t seq, struct pto_slot *owner);
/* Mark the slab at FIFO position seq free; the ring's tail advances over
 * every freed slab at its head. Returns true if space was freed. */
bool pto_ring_release(pto_heap_ring *r, uint64_t seq);
/* The owner of the live slab containing ring offset off, or NULL. */
struct pto_slot *pto_ring_owner(const pto_heap_ring *r, uint64_t off);
/* The oldest live slab, or NULL if the ring is empty. */
const pto_slab *pto_ring_oldest(const pto_heap_ring *r);
/* True if addr lies inside this ring's mapping. */
static inline bool pto_ring_contains(const pto_heap_ring *r, uint64_t addr)
{
    return addr >= (uint64_t)(uintptr_t)r->base && addr < (uint64_t)(uintptr_t)r->base + r->size;
}
/* Forget every slab (end of run). */
void pto_ring_reset(pto_heap_ring *r);

#endif
