/* Task slots: the per-task state shared by the orchestrator, the scheduler
 * and the worker threads, and the pool that hands them out by monotonic id.
 *
 * Ownership (who may write what) keeps the hot path lock-free:
 *   orchestrator thread: everything set at submit, refs[], scope_held, retire
 *   scheduler's turn:    consumers[], fanin_*, group counters, state
 *                        transitions PENDING..COMPLETED/FAILED, error
 *                        (the holder of the turn flag, scheduler.h: the
 *                        scheduler thread, or a draining orchestrator)
 *   any thread:          `fanout` (one packed atomic, see below)
 * A slot is recycled only by the orchestrator, after it reached CONSUMED and
 * no thread will touch it again (every toucher holds a reference). */
#ifndef PTO_SLOT_H
#define PTO_SLOT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include "done_words.h"
#include "pto.h"

typedef struct pto_slot pto_slot;
/* A CallConfig interned by the orchestrator: tasks share one copy. */
typedef struct pto_cfg_ref {
    pto_call_config cfg;
    int64_t refs;
    bool dflt;   /* equals the default CallConfig (a submit without one) */
    struct pto_cfg_ref *next;
} pto_cfg_ref;

/* A reference this task holds on an earlier slot. `dep` refs are fan-in
 * edges (RAW/WAW through the TensorMap); the others only keep the earlier
 * slot's heap slab alive while this task may touch it. */
typedef struct pto_ref {
    pto_slot *slot;
    bool dep;
    bool hold;
} pto_ref;

/* One member's arguments: a single task has one member, a group N. */
typedef struct pto_member {
    int32_t tensor_count;
    int32_t scalar_count;
    pto_tensor *tensors;
    uint64_t *scalars;
    uint8_t *tags;        /* as submitted: kept for inspection (pto_task_tensors) */
    int32_t pin;          /* worker index, or -1 for any */
} pto_member;

/* How many of m's tensors the submitter gave: a result box (PTO_RESULT_BOX_MARK) is not one. */
static inline int32_t pto_member_user_tensors(const pto_member *m)
{
    bool box = m->tensor_count > 0 && m->scalar_count > 0 && m->scalars[m->scalar_count - 1] == PTO_RESULT_BOX_MARK;
    return m->tensor_count - (box ? 1 : 0);
}

#define PTO_SLOT_INLINE_TENSORS 4
#define PTO_SLOT_INLINE_SCALARS 4
#define PTO_SLOT_INLINE_REFS 4

struct pto_slot {
    int64_t id;
    _Atomic int32_t state;            /* pto_task_state */
    int8_t kind;                      /* pto_worker_kind, or -1 for an alloc slot */
    _Atomic bool failed;              /* sticky: survives CONSUMED */
    bool poisoned;                    /* scheduler: a producer failed */
    bool scope_held;                  /* orchestrator: its scope has not ended */
    int8_t ring;                      /* heap ring of its slab, -1 if none */
    int32_t group_size;
    _Atomic int32_t worker;           /* index of the worker that runs it (member 0), -1 before it starts */
    uint32_t scope_seq;               /* orchestrator: its nested scope's instance (pto_scope_frame.seq) */
    uint64_t callable;
    pto_cfg_ref *cfg;
    struct pto_run *run;              /* its submitted run (run.h), NULL in a blocking run */

    pto_member *members;              /* == &member0 unless a group */
    pto_member member0;

    pto_ref *refs;                    /* producers and held slabs (orchestrator) */
    int32_t nrefs;
    uint32_t timeout_ms;              /* PROCESS mode: its deadline after it starts, 0 = none (fills a hole) */

    /* The consume threshold (references to drop before the slot can be
     * reclaimed) packed in one word so that adding a consumer and releasing
     * a reference never race: high 32 bits are fanout_total (scope ref +
     * consumers), low 32 bits fanout_released
     * (self + each released ref). CONSUMED once released == total + 1. */
    _Atomic uint64_t fanout;

    /* scheduler-only */
    int32_t fanin_count;
    int32_t fanin_released;
    int32_t nconsumers, consumers_cap;
    pto_slot **consumers;
    int32_t members_done;
    bool chained;                     /* staged behind its last unfinished producer (scheduler.c chain), or early */
    bool early;                       /* PROCESS mode: staged before its producers ended, which it waits for in
                                       * its child (sched_early.c) */
    int8_t nwaits;                    /* early: the producers' words it holds (waits) */
    bool done_said;                   /* its child's result came back, so its word is final */
    int64_t ready_by;                 /* the producer whose completion made it ready, -1 if none (profile.h) */
    _Atomic bool group_failed;
    _Atomic bool ran_ok;              /* worker: a single task ran and returned 0 */
    /* PROCESS mode: its task-end word while posted (stamp 0: none; sched_early.c). On this line, which
     * the turn touches anyway: every post of a kind with early posts reads and writes it (on the
     * slot's last line it cost a cache miss a post, 14% of the main BGEMM's turns). */
    pto_done_ref done;

    char *error;                      /* malloc'ed; set before FAILED is published */
    /* heap slab */
    uint64_t slab_off, slab_bytes;
    uint64_t slab_seq;                /* position in its ring's FIFO */

    /* intrusive links */
    pto_slot *next_ready;             /* scheduler ready queues */
    uint32_t mark;                    /* orchestrator: de-duplication stamp */

    struct pto_slot_chunk *chunk;

    /* storage reused across recycling */
    void *buf;
    size_t buf_cap;
    pto_tensor inl_tensors[PTO_SLOT_INLINE_TENSORS];
    uint64_t inl_scalars[PTO_SLOT_INLINE_SCALARS];
    uint8_t inl_tags[PTO_SLOT_INLINE_TENSORS];
    /* PROCESS mode, the turn's, early tasks only (sched_early.c): few tasks
     * go early. Here, inl_refs begins a line of its own. */
    pto_done_ref waits[PTO_DONE_WAITS];
    pto_ref inl_refs[PTO_SLOT_INLINE_REFS];
};

static inline uint64_t pto_fanout_pack(uint32_t total, uint32_t released)
{
    return ((uint64_t)total << 32) | released;
}

/* Mark s as not to be run, and say why in its error unless it has one:
 * its producer task failed_producer failed, or (failed_producer < 0) the
 * run was interrupted. */
void pto_slot_poison(pto_slot *s, int64_t failed_producer);

/* Add one reference (a consumer) unless the slot is already consumed. */
bool pto_slot_try_ref(pto_slot *s);
/* Release one reference; true when this release consumed the slot: it is
 * then CONSUMED, and the caller owns the hand-off to reclamation (no other
 * thread touches s again). */
bool pto_slot_release(pto_slot *s);

#define PTO_SLOT_CHUNK 1024

typedef struct pto_slot_chunk {
    pto_slot slots[PTO_SLOT_CHUNK];
    int64_t first_id;
    int32_t live;
    struct pto_slot_chunk *next_free;
} pto_slot_chunk;

/* Orchestrator-private pool: ids are monotonic within a run; slot memory is
 * recycled a chunk at a time so a long run needs only its peak live chunks. */
typedef struct pto_slot_pool {
    pto_slot_chunk **dir;             /* dir[i] holds ids of chunk dir_first + i */
    int64_t dir_first;
    int32_t dir_len, dir_cap;
    pto_slot_chunk *free_chunks;
    int32_t nfree;
    int32_t in_use, in_use_hwm;       /* chunks handed out; peak this run */
    int32_t keep;                     /* free chunks kept: the previous run's peak */
    int64_t next_id;
    int64_t live;
} pto_slot_pool;

void pto_slot_pool_init(pto_slot_pool *p);
void pto_slot_pool_destroy(pto_slot_pool *p);
/* A fresh slot with the next id; its fields are reset. */
pto_slot *pto_slot_alloc(pto_slot_pool *p);
/* The slot of id if it has not been recycled, else NULL. */
pto_slot *pto_slot_get(pto_slot_pool *p, int64_t id);
/* Give a CONSUMED slot back. */
void pto_slot_recycle(pto_slot_pool *p, pto_slot *s);
/* Forget every slot and restart ids at 0 (end of run: all are recycled). */
void pto_slot_pool_reset(pto_slot_pool *p);
/* Where a task's arguments live in its slot. */
typedef struct pto_slot_arrays {
    pto_tensor *tensors;
    uint64_t *scalars;
    uint8_t *tags;
} pto_slot_arrays;

/* Lay out s for a task of nmembers members with ntensors tensors and
 * nscalars scalars in all and nrefs references: the inline arrays where they
 * fit, else s->buf (reused across recycling). Sets s->members and s->refs
 * and returns the arrays for tensors, scalars and tags. */
pto_slot_arrays pto_slot_carve(pto_slot *s, int32_t nmembers, int32_t ntensors, int32_t nscalars, int32_t nrefs);

#endif
