/* wire_queue.h - a single-producer, single-consumer FIFO of slot
 * pointers in linked blocks. Two of them carry tasks between the
 * orchestrator and the scheduler's turn: submitted slots to the turn
 * (the wire queue) and consumed slots back (the retire queue).
 *
 * Each replaces a lock-free LIFO stack linked through the slots. That cost
 * the producer a locked CAS per slot on a line the other side kept
 * reading, and the consumer a pointer chase: one cache miss per slot, each
 * waiting for the one before it (perf: 55% of the turn's own samples in a
 * chain of no-op tasks; a quarter of the orchestrator's submit in a no-op
 * BGEMM). Here the producer makes a plain release store per slot into a
 * block eight pointers to a line, and the consumer reads the slot
 * addresses ahead of using them (pto_wq_pop_prefetch), so their misses overlap.
 *
 *   who                      owns                        shares
 *   producer (one thread at  tail, tail_i, spare         writes each cell once (release);
 *   a time: the orchestrator                             links a full block through its last cell
 *   / the turn's holder)
 *   consumer (the turn's     head, head_i                reads cells (acquire); hands finished
 *   holder / the                                         blocks back on `free`; publishes `peek`
 *   orchestrator)
 *   anyone                   -                           pto_wq_pending reads `peek` and its cell
 *
 * The turn's holders take turns through the turn flag (release/acquire),
 * which orders one holder's use of its end after the last one's. A block
 * goes back to the producer only after the consumer has read all of it,
 * and blocks are freed only by pto_wq_destroy, so a stale `peek`
 * (pto_wq_pending from a thread that is not the consumer) still points
 * into live memory: at worst it reports work that is not there, which
 * costs a look that finds nothing. */
#ifndef PTO_WIRE_QUEUE_H
#define PTO_WIRE_QUEUE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct pto_slot;

#define PTO_WQ_BLOCK 255u   /* cells per block before its link: a block is 2 KiB */

typedef _Atomic(void *) pto_wq_cell;

typedef struct pto_wire_block {
    /* e[PTO_WQ_BLOCK]: the next block (in the queue, or on a free list) */
    pto_wq_cell e[PTO_WQ_BLOCK + 1];
} pto_wire_block;

typedef struct pto_wire_queue {
    _Alignas(64) pto_wire_block *tail;   /* producer */
    uint32_t tail_i;
    pto_wire_block *spare;               /* producer: blocks taken back from `free` */
    _Alignas(64) pto_wire_block *_Atomic free;   /* consumer -> producer, a LIFO */
    _Alignas(64) pto_wire_block *head;   /* consumer */
    uint32_t head_i;
    pto_wq_cell *_Atomic peek;           /* the next cell the consumer reads, for pto_wq_pending */
} pto_wire_queue;

/* An empty queue with one block. */
void pto_wq_init(pto_wire_queue *q);
/* Frees every block; no producer or consumer may run. */
void pto_wq_destroy(pto_wire_queue *q);
/* Producer: append s. */
void pto_wq_push(pto_wire_queue *q, struct pto_slot *s);
/* Consumer: the oldest slot not taken yet, or NULL. */
struct pto_slot *pto_wq_pop(pto_wire_queue *q);
/* Consumer: the slot pto_wq_pop would return n calls from now, if it is
 * in the head block already; NULL otherwise (a hint, for prefetching).
 * Acquire, as pto_wq_pop's: a caller may read the slot's fields to
 * prefetch what they point to. */
static inline struct pto_slot *pto_wq_ahead(const pto_wire_queue *q, uint32_t n)
{
    uint32_t i = q->head_i + n;
    return i < PTO_WQ_BLOCK ? (struct pto_slot *)atomic_load_explicit(&q->head->e[i], memory_order_acquire) : NULL;
}
/* Consumer: pto_wq_pop, and a prefetch of the slot `ahead` places on: every
 * slot in the queue was just written on another core, so each is a miss,
 * and starting the next ones' now makes them overlap instead of queueing
 * behind the use of each. */
static inline struct pto_slot *pto_wq_pop_prefetch(pto_wire_queue *q, uint32_t ahead)
{
    struct pto_slot *s = pto_wq_pop(q);
    struct pto_slot *n = s ? pto_wq_ahead(q, ahead) : NULL;
    if (n) __builtin_prefetch(n);
    return s;
}
/* Anyone: whether a pop may find a slot (true at times when it would not). */
static inline bool pto_wq_pending(pto_wire_queue *q)
{
    return atomic_load_explicit(atomic_load_explicit(&q->peek, memory_order_acquire), memory_order_relaxed) != NULL;
}

#endif
