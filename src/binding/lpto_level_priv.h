/* lpto_level_priv.h - what the two halves of Workers of Workers share:
 * lpto_level.c runs a Worker child (its leaf), lpto_travel.c carries the
 * child's statistics, profiles and traces up to its parent. A Worker
 * child's record (struct wchild), the blocks of shared memory its fields
 * point to, and the calls the leaf makes into lpto_travel.c. */
#ifndef LPTO_LEVEL_PRIV_H
#define LPTO_LEVEL_PRIV_H

#include "lpto_priv.h"

/* One Worker of a tree of Workers, as its statistics travel: the records of
 * its Worker children's trees follow it, in order (pre-order). */
typedef struct stats_rec {
    pto_stats s;
    int32_t level, chips, subs, workers;
    int32_t nkids;               /* children whose records follow */
    bool present;                /* false: none yet (a child that never published, or closed) */
    bool truncated;              /* some of its children did not fit */
    char name[24];               /* the name its parent gives it ("L3 worker 2"); "" at the top */
} stats_rec;

#define STATS_RECS 200           /* records a published block holds */

/* Seqlock-published records: the child writes, the parent copies. */
typedef struct stats_block {
    _Atomic uint32_t seq;        /* odd while the child writes */
    uint32_t count;
    stats_rec recs[STATS_RECS];
} stats_block;

/* A PROCESS-mode Worker child's last run profiles, for its parent's
 * w:profile() and run report: after each run the child copies its own
 * profile and those of the Workers of this rank below it (a THREAD-mode
 * child's read where it runs, a PROCESS-mode one's from the block it
 * published in turn), in pre-order like the statistics, into this block of
 * shared memory behind a seqlock: at most PROF_RECS tasks, PROF_EDGES edges
 * and the names of its callables each. The parent sizes the block to the
 * child's tree when it binds it (at most PROF_SECTIONS Workers: the
 * sections are virtual memory, backed as the child writes them). */
#define PROF_RECS 8192
#define PROF_EDGES 16384
#define PROF_SECTIONS 16
typedef struct prof_section {
    int32_t parent;              /* the section of the Worker it is a child of; -1: the block's own Worker */
    int32_t child;               /* which of that Worker's children (0-based) */
    uint32_t have;               /* a run ended */
    pto_profile_run run;
    int64_t n, ne;
    int32_t nnames;
    lpto_prof_name names[LPTO_CHILD_PROF_NAMES];
    pto_profile_task recs[PROF_RECS];
    int64_t edges[2 * PROF_EDGES];
} prof_section;
typedef struct prof_block {
    _Atomic uint32_t seq;        /* odd while the child writes */
    int32_t cap;                 /* sections it has room for (the parent sets it before the child starts) */
    int32_t count;               /* sections written */
    prof_section sec[];
} prof_block;

/* A PROCESS-mode Worker child's trace, travelling up. While its parent
 * traces, the parent sets `want` (a trace generation) and its time origin;
 * the child then traces its runs and, after each, pushes the run's events
 * as a block of its own arena on a list the parent reads when its trace
 * stops. Blocks are immutable once pushed, so reading needs no lock, and a
 * child frees its blocks only after `want` changed, which the parent does
 * after reading. */
typedef struct trace_link {
    _Atomic uint32_t want;       /* parent: the generation it collects, 0 for none */
    _Atomic uint64_t epoch;      /* parent: its traces' time origin */
    _Atomic uint64_t head;       /* child: the newest block */
} trace_link;

/* A task of the overlapping leaf: its child's submitted run, from begin to end. */
#define LEVEL_INFLIGHT PTO_LEAF_MAX_BEGUN   /* the most the engine begins on one worker at once */
typedef struct level_task {
    bool used;
    pto_run *r;                  /* the run's engine record, for ready */
    int handle_ref, st_ref;      /* registry: the run handle; the storage its tensor arguments borrow */
    void *box;                   /* its result box in the level above's memory, or NULL */
} level_task;

struct wchild {
    sub_ctx s;                   /* first: lpto_sub_load installs shipped functions through it */
    lworker *child;
    int child_ref;               /* registry reference to the child's userdata */
    stats_block *stats;          /* PROCESS mode: in shared memory */
    void *arena;                 /* PROCESS mode: the child's own tensor memory, carved from ours */
    uint64_t arena_bytes;
    bool process;
    trace_link *tl;              /* PROCESS mode: in shared memory */
    prof_block *prof;            /* PROCESS mode: in shared memory */
    uint32_t tgen;               /* parent: the last generation it asked for */
    uint32_t traced_gen;         /* child: the generation its blocks belong to */
    bool traced_here;            /* THREAD mode: its trace was started for its parent's */
    bool remote;                 /* on another MPI rank (lpto_mpi.c): stats are published by its leaf */
    pto_leaf remote_leaf;
    level_task tasks[LEVEL_INFLIGHT];   /* begun and not yet ended (the overlapping leaf) */
};

/* lpto_travel.c, called by the leaf (lpto_level.c). In the child process,
 * after a run: make the hosted Worker's statistics, and its tree's
 * profiles, visible to the parent (best effort: they never fail a task). */
void lpto_travel_publish_stats(wchild *C);
void lpto_travel_publish_profile(wchild *C);
/* In the child, before a run: follow the parent's wish; after it: publish
 * the run's events, and record on. */
void lpto_travel_trace_begin(wchild *C);
void lpto_travel_trace_end(wchild *C);
/* Workers a published profile of W's tree covers: W and those of this rank below it, at most PROF_SECTIONS. */
int lpto_travel_prof_tree_size(const lworker *W);

#endif
