/* wire_queue.c - the blocks of the submit and retire hand-offs (wire_queue.h). */
#include "wire_queue.h"
#include "common.h"

#include <stdlib.h>

static pto_wire_block *next_of(pto_wire_block *b)
{
    return atomic_load_explicit(&b->e[PTO_WQ_BLOCK], memory_order_relaxed);
}

void pto_wq_init(pto_wire_queue *q)
{
    q->tail = q->head = pto_xcalloc_line(sizeof(pto_wire_block));
    q->tail_i = q->head_i = 0;
    q->spare = NULL;
    atomic_init(&q->free, NULL);
    atomic_init(&q->peek, &q->head->e[0]);
}

static void free_chain(pto_wire_block *b)
{
    while (b) {
        pto_wire_block *n = next_of(b);
        free(b);
        b = n;
    }
}

void pto_wq_destroy(pto_wire_queue *q)
{
    free_chain(q->head);   /* through tail */
    free_chain(atomic_load(&q->free));
    free_chain(q->spare);
    q->head = q->tail = q->spare = NULL;
}

/* A zeroed block for the producer: one the consumer gave back, or a new one. */
static pto_wire_block *fresh_block(pto_wire_queue *q)
{
    if (!q->spare) q->spare = atomic_exchange_explicit(&q->free, NULL, memory_order_acquire);
    pto_wire_block *b = q->spare;
    if (!b) return pto_xcalloc_line(sizeof *b);
    q->spare = next_of(b);
    /* Atomic stores, not memset: a stale pto_wq_pending may read it. */
    for (uint32_t i = 0; i <= PTO_WQ_BLOCK; i++) atomic_store_explicit(&b->e[i], NULL, memory_order_relaxed);
    return b;
}

void pto_wq_push(pto_wire_queue *q, struct pto_slot *s)
{
    if (q->tail_i == PTO_WQ_BLOCK) {
        pto_wire_block *b = fresh_block(q);
        atomic_store_explicit(&q->tail->e[PTO_WQ_BLOCK], b, memory_order_release);
        q->tail = b;
        q->tail_i = 0;
    }
    atomic_store_explicit(&q->tail->e[q->tail_i++], s, memory_order_release);
}

/* The consumer is done with b: back to the producer. */
static void give_back(pto_wire_queue *q, pto_wire_block *b)
{
    pto_wire_block *old = atomic_load_explicit(&q->free, memory_order_relaxed);
    do {
        atomic_store_explicit(&b->e[PTO_WQ_BLOCK], old, memory_order_relaxed);
    } while (!atomic_compare_exchange_weak_explicit(&q->free, &old, b, memory_order_release, memory_order_relaxed));
}

struct pto_slot *pto_wq_pop(pto_wire_queue *q)
{
    for (;;) {
        void *v = atomic_load_explicit(&q->head->e[q->head_i], memory_order_acquire);
        if (!v) return NULL;
        if (q->head_i == PTO_WQ_BLOCK) {   /* v: the next block */
            pto_wire_block *done = q->head;
            q->head = v;
            q->head_i = 0;
            /* Release: a reader of peek then reads the new block's cells
             * after their zeroing (the link's acquire above ordered it). */
            atomic_store_explicit(&q->peek, &q->head->e[0], memory_order_release);
            give_back(q, done);
            continue;
        }
        q->head_i++;
        atomic_store_explicit(&q->peek, &q->head->e[q->head_i], memory_order_release);
        return v;
    }
}
