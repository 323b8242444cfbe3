/* lpto_level.c - Workers of Workers. A Worker of level >= 4
 * has Worker children, added with w:add_worker(child), as its next-level
 * workers. Each is driven by a leaf that does what Worker:run does, on the
 * child Worker:
 *
 *   PROCESS mode: the leaf runs in the forked child. Its start hook
 *   initialises the child Worker there (which forks the child's own
 *   children, recursively, within the deadline its parent set), each task
 *   is child:run(fn, args, cfg) with fn the orchestration function the task
 *   names, and its stop hook closes the child Worker when the parent closes.
 *   THREAD mode: the child Worker is initialised in this process at the
 *   parent's init, and the leaf runs it on the parent's worker thread under
 *   the interpreter lock (which every wait gives up).
 *   On another MPI rank (pto.Worker{rank = r}, lpto_mpi.c): rank r hosts
 *   the child as THREAD mode does (lpto_level_host_*), and the leaf here
 *   sends it each task and takes its statistics and trace back.
 *
 * Tensors are shared memory at the same address in every process, so they
 * pass down any number of levels as they are; each level infers its own
 * dependencies from its own tags. A failure is wrapped once per level
 * ("L4 task 0 (... on L3 worker 1 (pid 7)) failed: L3 task 2 ... failed:
 * <root cause>"). Each child publishes its statistics after every run into
 * a shared block its parent reads: plain records, one per Worker of its
 * tree (pto_stats is plain data, so it travels as it is). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
typedef struct trace_block {
    uint64_t next;               /* the previous block's address, 0 at the end */
    uint64_t len;
    uint32_t gen;
    char text[];
} trace_block;

typedef struct trace_link {
    _Atomic uint32_t want;       /* parent: the generation it collects, 0 for none */
    _Atomic uint64_t epoch;      /* parent: its traces' time origin */
    _Atomic uint64_t head;       /* child: the newest block */
} trace_link;

/* A task of the overlapping leaf: its child's submitted run, from begin to end. */
#define LEVEL_INFLIGHT 4         /* the most a level above stages on one worker (its mailbox ring) */
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
    int inflight;
};

/* ---- add_worker ------------------------------------------------------------------ */

/* w:add_worker(child) -> id (1, 2, ...) */
int lpto_level_add_worker(lua_State *L)
{
    const char *who = "Worker:add_worker";
    lworker *W = lpto_check_worker(L, 1, who);
    if (W->level < 4)
        return lpto_error(L, who, "only a Worker of level 4 or above has Worker children (this one is level %d)",
                          W->level);
    if (W->state != W_NEW)
        return lpto_error(L, who, "this Worker is already initialised; add Worker children before Worker:init");
    lworker *C = luaL_testudata(L, 2, LPTO_WORKER);
    if (!C)
        return lpto_error(L, who, "expected a Worker to add, created with pto.Worker{level = %d, ...} (got %s)",
                          W->level - 1, luaL_typename(L, 2));
    if (C->state == W_CLOSED) return lpto_error(L, who, "the Worker to add is closed; create a new one");
    if (C == W) return lpto_error(L, who, "a Worker cannot be its own child");
    if (C->parent)
        return lpto_error(L, who, "the Worker to add is already a child of %s level-%d Worker; a Worker has one parent",
                          C->parent == W ? "this" : "another", C->parent->level);
    for (lworker *a = W->parent; a; a = a->parent)
        if (a == C) return lpto_error(L, who, "the Worker to add is an ancestor of this one; the tree cannot loop");
    if (C->state != W_NEW)
        return lpto_error(L, who, "the Worker to add is already initialised; add a new Worker (not yet init or run): "
                                  "its parent initialises it");
    if (C->level != W->level - 1)
        return lpto_error(L, who, "a level-%d Worker's children are level-%d Workers (the one to add is level %d)",
                          W->level, W->level - 1, C->level);
    if (W->nworkers >= 1024) return lpto_error(L, who, "a Worker has at most 1024 Worker children");
    if (C->rank) {
        for (int i = 0; i < W->nworkers; i++)
            if (W->kids[i]->rank == C->rank)
                return lpto_error(L, who, "Worker child %d already lives on MPI rank %d; a rank hosts one Worker child "
                                          "(give this one another rank)", i + 1, C->rank);
        /* Its leaf talks MPI, which a forked child must not: the leaves of
         * a Worker with remote children run on its threads. */
        if (W->mode == PTO_MODE_PROCESS) {
            if (pto_worker_mode_set(W->w, PTO_MODE_THREAD) != 0) return lpto_engine_error(L, who);
            W->mode = PTO_MODE_THREAD;
        }
    }
    lworker **kids = realloc(W->kids, (size_t)(W->nworkers + 1) * sizeof *kids);
    if (!kids) return luaL_error(L, "%s: out of memory", who);
    W->kids = kids;
    kids[W->nworkers] = C;
    lua_getiuservalue(L, 1, UV_CHILDREN);
    lua_pushvalue(L, 2);
    lua_rawseti(L, -2, W->nworkers + 1);
    C->parent = W;
    lua_pushinteger(L, ++W->nworkers);
    return 1;
}

/* ---- statistics travel up as records -------------------------------------------------- */

static int child_records(wchild *C, stats_rec *out, int cap);

/* Write W's tree into out (at most cap records); returns how many (0: cap < 1). */
static int tree_records(lworker *W, stats_rec *out, int cap)
{
    if (cap < 1) return 0;
    stats_rec *r = out;
    memset(r, 0, sizeof *r);
    if (!W->w || W->state == W_CLOSED) return 1;
    r->present = true;
    pto_worker_stats_get(W->w, &r->s);
    r->level = W->level;
    r->chips = W->nchips;
    r->subs = W->nsubs;
    r->workers = W->nworkers;
    int n = 1;
    for (int i = 0; W->level >= 4 && W->wchildren && i < W->nworkers; i++) {
        int k = child_records(&W->wchildren[i], out + n, cap - n);
        if (k == 0) {
            r->truncated = true;
            break;
        }
        n += k;
        r->nkids++;
    }
    return n;
}

/* Copy the records child C last published into out; returns how many (0: none yet). */
static int read_published(wchild *C, stats_rec *out, int cap)
{
    stats_block *sb = C->stats;
    for (int tries = 0; tries < 1000; tries++) {
        uint32_t q = atomic_load_explicit(&sb->seq, memory_order_acquire);
        if (q & 1) continue;
        uint32_t n = sb->count <= STATS_RECS && sb->count <= (uint32_t)cap ? sb->count : 0;
        memcpy(out, sb->recs, n * sizeof *out);
        /* An RMW, not a fence (TSan has none): its release half keeps the copy before the re-check. */
        if (atomic_fetch_add_explicit(&sb->seq, 0, memory_order_acq_rel) == q) return (int)n;
    }
    return 0;
}

/* A remote child's records are written by its leaf's thread in this process: a lock, not the seqlock. */
static pthread_mutex_t remote_mu = PTHREAD_MUTEX_INITIALIZER;

static int read_remote(wchild *C, stats_rec *out, int cap)
{
    pthread_mutex_lock(&remote_mu);
    uint32_t n = C->stats->count <= (uint32_t)cap ? C->stats->count : 0;
    memcpy(out, C->stats->recs, n * sizeof *out);
    pthread_mutex_unlock(&remote_mu);
    return (int)n;
}

/* C's tree under its name: published (PROCESS mode, another rank) or read now (THREAD mode). */
static int child_records(wchild *C, stats_rec *out, int cap)
{
    if (cap < 1) return 0;
    int n = C->remote ? read_remote(C, out, cap) : C->process ? read_published(C, out, cap) : tree_records(C->child, out, cap);
    if (n == 0) {
        memset(out, 0, sizeof *out);
        n = 1;
    }
    snprintf(out->name, sizeof out->name, "%s", C->s.name);
    return n;
}

/* In the child process: make the hosted Worker's statistics visible to the
 * parent. Best effort: statistics never fail a task. */
static void publish_stats(wchild *C)
{
    stats_block *sb = C->stats;
    if (!sb) return;
    /* Odd while writing: the RMW's acquire half keeps the writes after it. */
    uint32_t q = atomic_fetch_add_explicit(&sb->seq, 1, memory_order_acq_rel);
    sb->count = (uint32_t)tree_records(C->child, sb->recs, STATS_RECS);
    atomic_store_explicit(&sb->seq, q + 2, memory_order_release);
}

/* Workers a published profile of W's tree covers: W and those of this rank below it, at most PROF_SECTIONS. */
static int prof_tree_size(const lworker *W)
{
    int n = 1;
    for (int i = 0; W->level >= 4 && i < W->nworkers && n < PROF_SECTIONS; i++)
        if (!W->kids[i]->rank) n += prof_tree_size(W->kids[i]);
    return n < PROF_SECTIONS ? n : PROF_SECTIONS;
}

/* s: the last run of Worker V, which lives in this process. */
static void put_run(prof_section *s, lworker *V)
{
    pto_worker *w = V->state == W_READY ? V->w : NULL;
    pto_profile_run run;
    int64_t total = w ? pto_profile_get(w, &run, NULL, 0) : -1;
    s->have = total >= 0;
    s->n = s->ne = 0;
    s->nnames = 0;
    if (total < 0) return;
    int64_t n = total < PROF_RECS ? total : PROF_RECS;
    pto_profile_get(w, &s->run, s->recs, n);
    s->run.dropped += total - n;
    s->n = n;
    int64_t ne = pto_profile_edges(w, s->edges, PROF_EDGES);
    s->ne = ne < 0 ? 0 : ne < PROF_EDGES ? ne : PROF_EDGES;
    for (int64_t k = 0; k < n; k++) {
        const pto_profile_task *r = &s->recs[k];
        int32_t j = 0;
        while (j < s->nnames && !(s->names[j].kind == r->kind && s->names[j].callable == r->callable)) j++;
        if (j < s->nnames || s->nnames == LPTO_CHILD_PROF_NAMES) continue;
        if (pto_worker_callable_name_get(w, r->kind, r->callable, s->names[j].name, sizeof s->names[j].name) < 0)
            continue;
        s->names[j].kind = r->kind;
        s->names[j].callable = r->callable;
        s->nnames++;
    }
}

/* Copy what src holds of section s: its fields and the records and edges in use, not the whole arrays. */
static void copy_section(prof_section *dst, const prof_section *src)
{
    int64_t n = src->n >= 0 && src->n <= PROF_RECS ? src->n : 0;
    int64_t ne = src->ne >= 0 && src->ne <= PROF_EDGES ? src->ne : 0;
    dst->parent = src->parent;
    dst->child = src->child;
    dst->have = src->have;
    dst->run = src->run;
    dst->n = n;
    dst->ne = ne;
    dst->nnames = src->nnames >= 0 && src->nnames <= LPTO_CHILD_PROF_NAMES ? src->nnames : 0;
    memcpy(dst->names, src->names, sizeof dst->names);
    memcpy(dst->recs, src->recs, (size_t)n * sizeof *dst->recs);
    memcpy(dst->edges, src->edges, (size_t)ne * 2 * sizeof *dst->edges);
}

/* Append to pb the sections that src (a PROCESS-mode child's block) holds, as the tree of child `child` of
 * section parent. Its writer finished: it published before the task that ran it ended. */
static void copy_published(prof_block *pb, prof_block *src, int32_t parent, int32_t child)
{
    int32_t base = pb->count;
    for (int tries = 0; tries < 1000; tries++) {
        uint32_t q = atomic_load_explicit(&src->seq, memory_order_acquire);
        if (q & 1) continue;
        int32_t n = src->count >= 0 && src->count <= src->cap ? src->count : 0;
        pb->count = base;
        for (int32_t k = 0; k < n && pb->count < pb->cap; k++) {
            prof_section *d = &pb->sec[pb->count++];
            copy_section(d, &src->sec[k]);
            bool top = d->parent < 0 || d->parent >= k;   /* its own, or (torn) no tree: under the child */
            d->child = top ? child : d->child;
            d->parent = top ? parent : base + d->parent;
        }
        /* An RMW, not a fence: its release half keeps the copy before the re-check (as read_published). */
        if (atomic_fetch_add_explicit(&src->seq, 0, memory_order_acq_rel) == q) return;
    }
    pb->count = base;
}

/* Append the last runs of W's tree to pb: W's, as child `child` of section parent, then its children's. */
static void put_tree(prof_block *pb, lworker *W, int32_t parent, int32_t child)
{
    if (pb->count >= pb->cap) return;
    int32_t me = pb->count++;
    prof_section *s = &pb->sec[me];
    s->parent = parent;
    s->child = child;
    put_run(s, W);
    for (int i = 0; s->have && W->level >= 4 && W->wchildren && i < W->nworkers; i++) {
        wchild *K = &W->wchildren[i];
        if (K->remote) continue;
        if (K->process) {
            if (K->prof) copy_published(pb, K->prof, me, i);
        } else {
            put_tree(pb, K->child, me, i);
        }
    }
}

/* In the child process, after a run: its tree's profiles for the parent (best effort, like the statistics). */
static void publish_profile(wchild *C)
{
    prof_block *pb = C->prof;
    if (!pb) return;
    uint32_t q = atomic_fetch_add_explicit(&pb->seq, 1, memory_order_acq_rel);
    pb->count = 0;
    put_tree(pb, C->child, -1, 0);
    atomic_store_explicit(&pb->seq, q + 2, memory_order_release);
}

int lpto_level_child_profiles(lua_State *L, lworker *W, int i, lpto_child_profile **out)
{
    wchild *C = W->wchildren && i < W->nworkers ? &W->wchildren[i] : NULL;
    prof_block *pb = C ? C->prof : NULL;
    if (!pb) return 0;
    for (int tries = 0; tries < 1000; tries++) {
        uint32_t q = atomic_load_explicit(&pb->seq, memory_order_acquire);
        if (q & 1) continue;
        /* The sizes first, then room for them in Lua (which may raise: nothing to free), then the copy;
         * the seqlock rejects a copy a publication tore, sizes and all. */
        int32_t n = pb->count >= 0 && pb->count <= pb->cap ? pb->count : 0;
        if (n == 0 || !pb->sec[0].have) {
            if (atomic_fetch_add_explicit(&pb->seq, 0, memory_order_acq_rel) == q) return 0;
            continue;
        }
        size_t nrec = 0, nedge = 0;
        for (int32_t k = 0; k < n; k++) {
            nrec += pb->sec[k].n >= 0 && pb->sec[k].n <= PROF_RECS ? (size_t)pb->sec[k].n : 0;
            nedge += pb->sec[k].ne >= 0 && pb->sec[k].ne <= PROF_EDGES ? (size_t)pb->sec[k].ne : 0;
        }
        lpto_child_profile *p = lua_newuserdatauv(L, (size_t)n * sizeof *p + nrec * sizeof *p->recs +
                                                         nedge * 2 * sizeof *p->edges, 0);
        pto_profile_task *recs = (pto_profile_task *)(p + n);
        int64_t *edges = (int64_t *)(recs + nrec);
        for (int32_t k = 0; k < n; k++) {
            const prof_section *s = &pb->sec[k];
            int64_t m = s->n >= 0 && s->n <= PROF_RECS ? s->n : 0;
            int64_t me = s->ne >= 0 && s->ne <= PROF_EDGES ? s->ne : 0;
            if ((size_t)m > nrec) m = (int64_t)nrec;     /* grown since it was counted: torn, the check fails */
            if ((size_t)me > nedge) me = (int64_t)nedge;
            p[k] = (lpto_child_profile){.parent = s->parent, .child = s->child, .have = (int32_t)s->have,
                                        .run = s->run, .n = m, .ne = me, .recs = recs, .edges = edges,
                                        .nnames = s->nnames >= 0 && s->nnames <= LPTO_CHILD_PROF_NAMES ? s->nnames
                                                                                                      : 0};
            memcpy(p[k].names, s->names, sizeof p[k].names);
            memcpy(recs, s->recs, (size_t)m * sizeof *recs);
            memcpy(edges, s->edges, (size_t)me * 2 * sizeof *edges);
            recs += m;
            edges += 2 * me;
            nrec -= (size_t)m;
            nedge -= (size_t)me;
        }
        if (atomic_fetch_add_explicit(&pb->seq, 0, memory_order_acq_rel) == q) {
            *out = p;
            return n;
        }
        lua_pop(L, 1);
    }
    return 0;
}

/* Records W's tree may take: THREAD-mode children are read live, PROCESS-mode ones published. */
static int tree_cap(lworker *W)
{
    int cap = 1;
    for (int i = 0; W->level >= 4 && W->wchildren && i < W->nworkers; i++) {
        wchild *C = &W->wchildren[i];
        cap += C->process ? STATS_RECS : tree_cap(C->child);
    }
    return cap;
}

/* Records of W's whole tree (malloc'd, count in *n), or NULL. */
static stats_rec *tree_of(lworker *W, int *n)
{
    int cap = tree_cap(W);
    stats_rec *recs = malloc((size_t)cap * sizeof *recs);
    *n = recs ? tree_records(W, recs, cap) : 0;
    return recs;
}

static void push_ring_stats(lua_State *L, const pto_stats *s)
{
    lua_createtable(L, PTO_MAX_RING_DEPTH, 0);
    for (int r = 0; r < PTO_MAX_RING_DEPTH; r++) {
        const pto_ring_stats *q = &s->rings[r];
        lua_createtable(L, 0, 7);
#define F(name) lpto_set_int(L, #name, (lua_Integer)q->name)
        F(stalls); F(hwm_bytes); F(capacity_bytes); F(used_bytes); F(live_slabs); F(need_bytes);
#undef F
        lua_pushnumber(L, (double)q->stall_ns / 1e6);
        lua_setfield(L, -2, "stall_ms");
        lpto_set_int(L, "ring", r);
        lua_rawseti(L, -2, r + 1);
    }
    lua_setfield(L, -2, "rings");
}

/* Push the table of record *i and its children's (nil if not present); *i moves past them. */
static void push_record(lua_State *L, const stats_rec *recs, int n, int *i)
{
    const stats_rec *r = &recs[(*i)++];
    if (!r->present) {
        lua_pushnil(L);
        return;
    }
    lua_createtable(L, 0, 16);
#define F(name) lpto_set_int(L, #name, (lua_Integer)r->s.name)
    F(tasks_submitted); F(tasks_completed); F(tasks_failed); F(allocs); F(runs); F(tasks_live_hwm);
    F(ready_hwm); F(tensormap_hwm); F(tensormap_live); F(tasks_live);
#undef F
    push_ring_stats(L, &r->s);
    lpto_set_int(L, "chips", r->chips);
    lpto_set_int(L, "sub_workers", r->subs);
    lpto_set_int(L, "level", r->level);
    if (r->truncated) {
        lua_pushboolean(L, 1);
        lua_setfield(L, -2, "truncated");
    }
    if (r->level < 4) return;
    lpto_set_int(L, "workers", r->workers);
    lua_createtable(L, r->nkids, 0);
    for (int k = 0; k < r->nkids && *i < n; k++) {
        const char *name = recs[*i].name;
        push_record(L, recs, n, i);
        if (lua_istable(L, -1)) {
            lua_pushstring(L, name);
            lua_setfield(L, -2, "name");
        }
        lua_rawseti(L, -2, k + 1);
    }
    lua_setfield(L, -2, "children");
}

void lpto_level_push_stats(lua_State *L, lworker *W)
{
    int n;
    stats_rec *recs = tree_of(W, &n);
    if (!recs) luaL_error(L, "Worker:stats: out of memory");
    int i = 0;
    push_record(L, recs, n, &i);
    free(recs);
}

/* Append to b the report of record *i (none yet: say so) under a header
 * naming its path from the top ("L4 worker 1 / L3 worker 2"), then its
 * children's; *i moves past them. */
static void add_report(luaL_Buffer *b, const stats_rec *recs, int n, int *i, const char *path, const char *where)
{
    const stats_rec *r = &recs[(*i)++];
    char head[512];
    if (where[0]) snprintf(head, sizeof head, "\n== %s (%s) ==\n", path, where);
    else snprintf(head, sizeof head, "\n== %s ==\n", path);
    luaL_addstring(b, head);
    if (!r->present) {
        luaL_addstring(b, "(no statistics yet)\n");
        return;
    }
    int len = pto_format_stats(&r->s, r->level, NULL, 0);
    char *text = malloc((size_t)len + 1);
    if (text) {
        pto_format_stats(&r->s, r->level, text, (size_t)len + 1);
        luaL_addlstring(b, text, (size_t)len);
        free(text);
    }
    for (int k = 0; k < r->nkids && *i < n; k++) {
        char sub[256];
        snprintf(sub, sizeof sub, "%s / %s", path, recs[*i].name[0] ? recs[*i].name : "child");
        add_report(b, recs, n, i, sub, "");
    }
}

void lpto_level_report(lworker *W, luaL_Buffer *b)
{
    int n;
    stats_rec *recs = tree_of(W, &n);
    if (!recs) return;
    int i = 1;   /* W's own report is the caller's */
    for (int k = 0; k < recs[0].nkids && i < n; k++) {
        wchild *C = &W->wchildren[k];
        int pid = C->process && W->state == W_READY ? pto_worker_child_pid(W->w, PTO_NEXT_LEVEL, k) : -1;
        char where[256] = "";
        if (C->remote) lpto_mpi_where(&C->remote_leaf, where, sizeof where);
        else if (pid > 0) snprintf(where, sizeof where, "pid %d", pid);
        add_report(b, recs, n, &i, C->s.name, where);
    }
    free(recs);
}

/* ---- the leaf ---------------------------------------------------------------------- */

/* fn(orch, args, cfg) with its traceback kept: Worker:run passes a
 * function's error on unchanged, and a level above needs the root's
 * stack, not the one where the error was re-raised. */
static int traced_call(lua_State *L)
{
    int n = lua_gettop(L);
    lua_getglobal(L, "debug");
    lua_getfield(L, -1, "traceback");
    lua_remove(L, -2);
    lua_insert(L, 1);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 2);
    if (lua_pcall(L, n, LUA_MULTRET, 1) != LUA_OK) {
        lworker *C = lua_touserdata(L, lua_upvalueindex(2));
        const char *m = lua_tostring(L, -1);
        lua_pushfstring(L, "L%d orchestration function failed: %s", C->level, m ? m : "(error object is not a string)");
        return lua_error(L);
    }
    return lua_gettop(L) - 1;   /* its results, for the level above (lpto_result.c) */
}

static int run_protected(lua_State *L)
{
    wchild *C = lua_touserdata(L, 1);
    pto_args_view view;
    void *box = lpto_result_unwrap(lua_touserdata(L, 2), &view);   /* the function does not see its result box */
    const pto_args_view *args = &view;
    const pto_call_config *cfg = lua_touserdata(L, 3);
    lua_Integer callable = lua_tointeger(L, 4);
    lua_settop(L, 0);
    lpto_storage *st = lpto_push_storage(L, 0, 0, LPTO_ST_BORROWED);   /* 1 */
    st->why_invalid = "tensors in an orchestration function's arguments are valid only while its task runs";
    lua_pushcfunction(L, lpto_worker_run_child);                        /* 2 */
    lua_rawgeti(L, LUA_REGISTRYINDEX, C->child_ref);                    /* 3 */
    lua_rawgeti(L, LUA_REGISTRYINDEX, C->s.W->fns_ref);
    lua_rawgeti(L, -1, callable);
    lua_remove(L, -2);
    if (!lua_isfunction(L, -1))
        return luaL_error(L, "callable %d is not an orchestration function registered on this Worker", (int)callable);
    lua_pushlightuserdata(L, C->child);
    lua_pushcclosure(L, traced_call, 2);                                /* 4 */
    lpto_push_args_view(L, args, 1);                                    /* 5 */
    lpto_push_config(L, cfg);                                           /* 6 */
    C->child->driven = true;
    int status = lua_pcall(L, 4, LUA_MULTRET, 0);
    C->child->driven = false;
    st->valid = false;
    if (status == LUA_OK && box) lpto_result_write(L, box, 2, lua_gettop(L) - 1);
    if (status == LUA_OK) return 0;
    if (!lua_isstring(L, -1)) lua_pushliteral(L, "(error object is not a string)");
    return lua_error(L);   /* "L3 task 2 ...": the level above names its own task and this child */
}

/* ---- traces of PROCESS-mode children ---- */

static void free_blocks(trace_link *tl)
{
    uint64_t b = atomic_exchange(&tl->head, 0);
    while (b) {
        trace_block *x = (trace_block *)(uintptr_t)b;
        b = x->next;
        pto_shm_free(x);
    }
}

/* In the child, before a run: follow the parent's wish. */
static void trace_begin(wchild *C)
{
    pto_worker *w = C->child->w;
    uint32_t want = atomic_load_explicit(&C->tl->want, memory_order_acquire);
    if (want != C->traced_gen) {   /* a new trace, or none: what was published is read or stale */
        free_blocks(C->tl);
        if (pto_trace_active(w)) pto_trace_stop(w, NULL);
        C->traced_gen = want;
    }
    if (want && !pto_trace_active(w)) {
        pto_trace_set_epoch(atomic_load(&C->tl->epoch));
        /* If it cannot, this run goes untraced. Its own Worker children
         * are traced with it, a level further down. */
        if (pto_trace_start(w, 0) == 0) lpto_level_trace(C->child, true);
    }
}

/* In the child, after a run: publish the run's events, and record on. */
static void trace_end(wchild *C)
{
    pto_worker *w = C->child->w;
    if (!C->traced_gen || !pto_trace_active(w)) return;
    lpto_level_trace_collect(C->child);
    if (pto_trace_stop(w, NULL) != 0) return;
    char name[96];
    snprintf(name, sizeof name, "%s (pid %d): level-%d Worker", C->s.name, (int)getpid(), C->child->level);
    int64_t n = pto_trace_format(w, (int32_t)getpid(), name, NULL, 0);
    trace_block *b = n > 0 ? pto_shm_alloc(sizeof *b + (uint64_t)n + 1) : NULL;
    if (b) {   /* no room in this child's memory: the run's events are lost, the run is not */
        pto_trace_format(w, (int32_t)getpid(), name, b->text, (size_t)n + 1);
        b->len = (uint64_t)n;
        b->gen = C->traced_gen;
        b->next = atomic_load(&C->tl->head);
        atomic_store_explicit(&C->tl->head, (uint64_t)(uintptr_t)b, memory_order_release);
    }
    if (pto_trace_start(w, 0) == 0) lpto_level_trace(C->child, true);
}

void lpto_level_trace(lworker *W, bool on)
{
    for (int i = 0; W->wchildren && i < W->nworkers; i++) {
        wchild *C = &W->wchildren[i];
        if (C->remote) {   /* its rank traces the runs and sends the events back with each answer */
            lpto_mpi_trace(&C->remote_leaf, on);
            continue;
        }
        if (!C->tl) {   /* THREAD mode: in this process; traced unless it already is */
            if (on && !C->child->w) continue;
            if (on && !pto_trace_active(C->child->w) && pto_trace_start(C->child->w, 0) == 0) {
                C->traced_here = true;
                lpto_level_trace(C->child, true);
            }
            continue;
        }
        if (on) {
            if (++C->tgen == 0) C->tgen = 1;
            atomic_store(&C->tl->epoch, pto_trace_epoch());
        }
        atomic_store_explicit(&C->tl->want, on ? C->tgen : 0, memory_order_release);
    }
}

void lpto_level_trace_collect(lworker *W)
{
    for (int i = 0; W->wchildren && i < W->nworkers; i++) {
        wchild *C = &W->wchildren[i];
        if (C->remote) {
            lpto_mpi_trace_collect(&C->remote_leaf, W->w);
            continue;
        }
        if (!C->tl) {
            if (!C->traced_here) continue;
            C->traced_here = false;
            lpto_level_trace_collect(C->child);
            if (pto_trace_stop(C->child->w, NULL) != 0) continue;
            char name[64];
            snprintf(name, sizeof name, "%s: level-%d Worker", C->s.name, C->child->level);
            /* A process of the file of its own, numbered apart from ptolua's serials and from real pids. */
            int32_t pid = (int32_t)(1000000000 + (i + 1) * 1000 + W->level);
            int64_t n = pto_trace_format(C->child->w, pid, name, NULL, 0);
            char *text = n > 0 ? malloc((size_t)n + 1) : NULL;
            if (text) {
                pto_trace_format(C->child->w, pid, name, text, (size_t)n + 1);
                pto_trace_attach(W->w, text, (size_t)n);
                free(text);
            }
            continue;
        }
        uint32_t gen = atomic_load(&C->tl->want);
        for (uint64_t b = atomic_load_explicit(&C->tl->head, memory_order_acquire); gen && b;) {
            const trace_block *x = (const trace_block *)(uintptr_t)b;
            /* Blocks are pushed whole, but a replaced child reuses the memory: check before reading. */
            if (!pto_shm_contains(x) || x->len > C->arena_bytes || !pto_shm_contains(x->text + x->len)) break;
            if (x->gen == gen) pto_trace_attach(W->w, x->text, x->len);
            b = x->next;
        }
        atomic_store_explicit(&C->tl->want, 0, memory_order_release);
    }
}

/* The leaf's run: in the child process (PROCESS), or on the parent's worker
 * thread holding the interpreter lock (THREAD). */
static int level_run(void *ctx, uint64_t callable, const pto_args_view *args, const pto_call_config *cfg, char *err,
                     size_t errlen)
{
    wchild *C = ctx;
    lua_State *T = C->s.T;
    lua_settop(T, 0);
    lua_pushcfunction(T, run_protected);
    lua_pushlightuserdata(T, C);
    lua_pushlightuserdata(T, (void *)args);
    lua_pushlightuserdata(T, (void *)cfg);
    lua_pushinteger(T, (lua_Integer)callable);
    int rc = 0;
    if (C->tl) trace_begin(C);
    int status = lua_pcall(T, 4, 0, 0);
    if (C->tl) trace_end(C);
    if (status != LUA_OK) {
        const char *m = lua_tostring(T, -1);
        snprintf(err, errlen, "%s", m ? m : "(error object is not a string)");
        rc = 1;
    }
    lua_settop(T, 0);
    publish_stats(C);
    publish_profile(C);
    return rc;
}

static int level_leaf_locked(void *ctx, uint64_t callable, const pto_args_view *args, const pto_call_config *cfg,
                             char *err, size_t errlen)
{
    lpto_gil *g = ((wchild *)ctx)->s.W->gil;
    lpto_gil_acquire(g);
    int rc = level_run(ctx, callable, args, cfg, err, errlen);
    lpto_gil_release(g);
    return rc;
}

static const char *message(lua_State *L, int idx)
{
    const char *m = lua_tostring(L, idx);
    return m ? m : "(error object is not a string)";
}

/* ---- the leaf, overlapping: each task a submitted run of the child ----
 * A level above stages several tasks on one Worker child; the child begins
 * each as child:submit(fn, args, cfg) and ends it with the handle's wait,
 * in order, so its runs overlap as a script's submitted runs do, ordered
 * across runs by their tags in the child's session. */

/* Begin cell: fn(orch, args, cfg) submitted on the child, its handle and
 * arguments' storage kept until the end (the task's tensors are valid until
 * then). Stack: C, args, cfg, callable, task. */
static int begin_protected(lua_State *L)
{
    wchild *C = lua_touserdata(L, 1);
    pto_args_view view;
    void *box = lpto_result_unwrap(lua_touserdata(L, 2), &view);
    const pto_call_config *cfg = lua_touserdata(L, 3);
    lua_Integer callable = lua_tointeger(L, 4);
    level_task *task = lua_touserdata(L, 5);
    lua_settop(L, 0);
    lpto_storage *st = lpto_push_storage(L, 0, 0, LPTO_ST_BORROWED);   /* 1 */
    st->why_invalid = "tensors in an orchestration function's arguments are valid only while its task runs";
    lua_pushcfunction(L, lpto_run_submit_child);                        /* 2 */
    lua_rawgeti(L, LUA_REGISTRYINDEX, C->child_ref);                    /* 3 */
    lua_rawgeti(L, LUA_REGISTRYINDEX, C->s.W->fns_ref);
    lua_rawgeti(L, -1, callable);
    lua_remove(L, -2);
    if (!lua_isfunction(L, -1))
        return luaL_error(L, "callable %d is not an orchestration function registered on this Worker", (int)callable);
    lua_pushlightuserdata(L, C->child);
    lua_pushcclosure(L, traced_call, 2);                                /* 4 */
    lpto_push_args_view(L, &view, 1);                                   /* 5 */
    lpto_push_config(L, cfg);                                           /* 6 */
    C->child->driven = true;
    int status = lua_pcall(L, 4, 1, 0);
    C->child->driven = false;
    if (status != LUA_OK) {
        /* What the function submitted before it failed runs on: the task
         * ends, and its tensors go back to the level above, only after. */
        st->valid = false;
        pto_worker *w = C->child->w;
        if (w) {
            lpto_gil_release(C->child->gil);
            pto_run_wait(w, NULL, -1);
            lpto_gil_acquire(C->child->gil);
        }
        return lua_error(L);
    }
    task->r = lpto_run_engine(L, -1);
    task->handle_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_pushvalue(L, 1);
    task->st_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    task->box = box;
    return 0;
}

/* End task: wait for its run, write its results. Stack: C, task. */
static int end_protected(lua_State *L)
{
    level_task *task = lua_touserdata(L, 2);
    lua_settop(L, 0);
    lua_rawgeti(L, LUA_REGISTRYINDEX, task->handle_ref);   /* 1 */
    int n = lpto_run_finish(L, 1, NULL);
    if (task->box) lpto_result_write(L, task->box, 2, n);
    return 0;
}

static void task_release(lua_State *T, level_task *task)
{
    lua_rawgeti(T, LUA_REGISTRYINDEX, task->st_ref);
    lpto_storage *st = lua_touserdata(T, -1);
    if (st) st->valid = false;
    lua_pop(T, 1);
    luaL_unref(T, LUA_REGISTRYINDEX, task->st_ref);
    luaL_unref(T, LUA_REGISTRYINDEX, task->handle_ref);
    task->used = false;
}

static int level_begin(void *ctx, uint64_t callable, const pto_args_view *args, const pto_call_config *cfg,
                       pto_wake_fn wake, void *wake_arg, void **token, char *err, size_t errlen)
{
    wchild *C = ctx;
    level_task *task = NULL;
    for (int i = 0; i < LEVEL_INFLIGHT && !task; i++)
        if (!C->tasks[i].used) task = &C->tasks[i];
    if (!task) {
        snprintf(err, errlen, "%s was handed more than %d tasks at once", C->s.name, LEVEL_INFLIGHT);
        return 1;
    }
    lua_State *T = C->s.T;
    if (C->tl && !C->inflight) trace_begin(C);
    lua_settop(T, 0);
    lua_pushcfunction(T, begin_protected);
    lua_pushlightuserdata(T, C);
    lua_pushlightuserdata(T, (void *)args);
    lua_pushlightuserdata(T, (void *)cfg);
    lua_pushinteger(T, (lua_Integer)callable);
    lua_pushlightuserdata(T, task);
    int rc = 0;
    if (lua_pcall(T, 5, 0, 0) != LUA_OK) {
        snprintf(err, errlen, "%s", message(T, -1));
        rc = 1;
        if (C->tl && !C->inflight) trace_end(C);
        publish_stats(C);
        publish_profile(C);
    } else {
        task->used = true;
        C->inflight++;
        *token = task;
        pto_run_on_done(task->r, wake, wake_arg);
    }
    lua_settop(T, 0);
    return rc;
}

static int level_ready(void *ctx, void *token)
{
    wchild *C = ctx;
    level_task *task = token;
    return C->child->w == NULL || pto_run_wait(C->child->w, task->r, 0) != 0;
}

static int level_end(void *ctx, void *token, char *err, size_t errlen)
{
    wchild *C = ctx;
    lua_State *T = C->s.T;
    level_task *task = token;
    lua_settop(T, 0);
    lua_pushcfunction(T, end_protected);
    lua_pushlightuserdata(T, C);
    lua_pushlightuserdata(T, task);
    C->child->driven = true;
    int rc = 0;
    if (lua_pcall(T, 2, 0, 0) != LUA_OK) {
        snprintf(err, errlen, "%s", message(T, -1));
        rc = 1;
    }
    C->child->driven = false;
    lua_settop(T, 0);
    task_release(T, task);
    C->inflight--;
    if (C->tl && !C->inflight) trace_end(C);
    publish_stats(C);
    publish_profile(C);
    return rc;
}

static int level_begin_locked(void *ctx, uint64_t callable, const pto_args_view *args, const pto_call_config *cfg,
                              pto_wake_fn wake, void *wake_arg, void **token, char *err, size_t errlen)
{
    lpto_gil *g = ((wchild *)ctx)->s.W->gil;
    lpto_gil_acquire(g);
    int rc = level_begin(ctx, callable, args, cfg, wake, wake_arg, token, err, errlen);
    lpto_gil_release(g);
    return rc;
}

static int level_end_locked(void *ctx, void *token, char *err, size_t errlen)
{
    lpto_gil *g = ((wchild *)ctx)->s.W->gil;
    lpto_gil_acquire(g);
    int rc = level_end(ctx, token, err, errlen);
    lpto_gil_release(g);
    return rc;
}

static int init_protected(lua_State *L)
{
    wchild *C = lua_touserdata(L, 1);
    lua_rawgeti(L, LUA_REGISTRYINDEX, C->child_ref);
    C->child->owner = getpid();   /* PROCESS mode: this child hosts it from now on */
    C->child->driven = true;
    lpto_worker_init(L, -1, C->child, NULL);   /* no Lua function called: messages stand alone */
    C->child->driven = false;
    return 0;
}

/* PROCESS mode, in the child: initialise the hosted Worker, which forks its
 * own children and waits for them within this child's start deadline. */
static int level_start(void *ctx, char *err, size_t errlen)
{
    wchild *C = ctx;
    lua_State *T = C->s.T;
    /* Its orchestration functions create tensors, and its own children
     * need shared blocks: it allocates from a part of ours. */
    if (pto_shm_adopt(C->arena, C->arena_bytes) != 0) {
        snprintf(err, errlen, "%s", pto_errmsg());
        return 1;
    }
    /* A replaced child reuses the arena: what its predecessor published is gone. */
    atomic_store(&C->tl->head, 0);
    C->traced_gen = 0;
    lua_settop(T, 0);
    lua_pushcfunction(T, init_protected);
    lua_pushlightuserdata(T, C);
    if (lua_pcall(T, 1, 0, 0) != LUA_OK) {
        snprintf(err, errlen, "its level-%d Worker: %s", C->child->level, message(T, -1));
        lua_settop(T, 0);
        return 1;
    }
    publish_stats(C);
    /* From here this child's main thread takes the interpreter lock only
     * for a leaf call: between them it waits in the mailbox loop while the
     * tasks it began run, and a THREAD-mode Worker it hosts needs the lock
     * for its own threads then. */
    lpto_gil_release(C->s.W->gil);
    return 0;
}

/* PROCESS mode, in the child, at the parent's close: close the hosted
 * Worker so its children are stopped and reaped before this child exits. */
static void level_stop(void *ctx)
{
    wchild *C = ctx;
    lpto_gil_acquire(C->s.W->gil);
    lua_settop(C->s.T, 0);
    C->child->driven = true;
    lpto_worker_free(C->s.T, C->child);
    lpto_gil_release(C->s.W->gil);
}

static int level_load_locked(void *ctx, uint64_t callable, const void *blob, size_t len, char *err, size_t errlen)
{
    lpto_gil *g = ((wchild *)ctx)->s.W->gil;
    lpto_gil_acquire(g);
    int rc = lpto_sub_load(ctx, callable, blob, len, err, errlen);
    lpto_gil_release(g);
    return rc;
}

/* Child i of W into C: its userdata (referenced), its Lua thread (kept in W's thread list) and its name.
 * The stack has W's thread list and children list on top. */
static void bind_child(lua_State *L, lworker *W, wchild *C, int i)
{
    lua_rawgeti(L, -1, i + 1);
    C->child = lua_touserdata(L, -1);
    C->child_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    C->s.W = W;
    C->s.T = lua_newthread(L);
    lua_rawseti(L, -3, W->nsubs + i + 1);
    snprintf(C->s.name, sizeof C->s.name, "L%d worker %d", C->child->level, i + 1);
}

void lpto_level_init(lua_State *L, int idx, lworker *W, const char *who)
{
    idx = lua_absindex(L, idx);
    int nremote = 0;
    for (int i = 0; i < W->nworkers; i++) nremote += W->kids[i]->rank != 0;
    if (nremote && lpto_mpi_rank() != 0) lpto_mpi_serve(L, idx, W);   /* this rank hosts its child, then exits */
    W->wchildren = calloc((size_t)W->nworkers + 1, sizeof *W->wchildren);
    if (!W->wchildren) luaL_error(L, "%s: out of memory", who);
    for (int i = 0; i < W->nworkers; i++) W->wchildren[i].child_ref = LUA_NOREF;
    lua_getiuservalue(L, idx, UV_THREADS);
    lua_getiuservalue(L, idx, UV_CHILDREN);
    for (int i = 0; i < W->nworkers; i++) {
        wchild *C = &W->wchildren[i];
        bind_child(L, W, C, i);
        C->process = W->mode == PTO_MODE_PROCESS;
        pto_leaf leaf = {.run = level_leaf_locked, .ctx = C, .name = C->s.name, .begin = level_begin_locked,
                         .ready = level_ready, .end = level_end_locked};
        if (C->child->rank) {   /* on another MPI rank: the leaf sends it the tasks */
            C->remote = C->process = true;
            C->stats = calloc(1, sizeof *C->stats);
            C->remote_leaf = leaf = lpto_mpi_leaf(C, C->s.name, C->child->rank);
            if (!C->stats || !leaf.ctx) lpto_error(L, who, "out of memory");
        } else if (C->process) {
            C->stats = pto_shm_alloc(sizeof *C->stats);
            C->tl = pto_shm_alloc(sizeof *C->tl);
            int nsec = prof_tree_size(C->child);   /* virtual: backed as the child writes it */
            C->prof = pto_shm_alloc(sizeof *C->prof + (size_t)nsec * sizeof *C->prof->sec);
            if (!C->stats || !C->tl || !C->prof) lpto_engine_error(L, who);
            C->prof->cap = nsec;
            C->prof->count = 0;
            atomic_store(&C->prof->seq, 0);
            pto_shm_stats ss;
            pto_shm_stats_get(&ss);
            /* Virtual: pages are backed only when touched. */
            C->arena_bytes = C->child->shm_size ? C->child->shm_size
                                                : ss.reserved_bytes / 16 / (uint64_t)W->nworkers & ~((uint64_t)(1 << 20) - 1);
            C->arena = C->arena_bytes >= (16u << 20) ? pto_shm_alloc(C->arena_bytes) : NULL;
            if (!C->arena)
                lpto_error(L, who, "cannot set aside %llu MiB of shared tensor memory for %s (%llu MiB reserved, %llu "
                                   "MiB in use): give the child a smaller shm_size (pto.Worker{shm_size = bytes}; the "
                                   "default is a sixteenth of its parent's, shared among siblings), close Workers you "
                                   "no longer use, or raise PTO_SHM_SIZE", (unsigned long long)(C->arena_bytes >> 20),
                           C->s.name, (unsigned long long)(ss.reserved_bytes >> 20),
                           (unsigned long long)(ss.in_use_bytes >> 20));
            leaf = (pto_leaf){.run = level_leaf_locked, .ctx = C, .name = C->s.name, .start = level_start,
                              .load = level_load_locked, .stop = level_stop, .begin = level_begin_locked,
                              .ready = level_ready, .end = level_end_locked};
        } else {
            /* THREAD mode: the child lives in this process, on the thread of its leaf. */
            lua_pushcfunction(L, init_protected);
            lua_pushlightuserdata(L, C);
            if (lua_pcall(L, 1, 0, 0) != LUA_OK)
                lpto_error(L, who, "%s: %s", C->s.name, message(L, -1));
            C->child->gil_shared = true;
        }
        if (pto_worker_add_next_level(W->w, &leaf) < 0) lpto_engine_error(L, who);
    }
    lua_pop(L, 2);
    if (nremote) {   /* after the local children forked: MPI starts here */
        pto_leaf *leaves = lua_newuserdatauv(L, (size_t)W->nworkers * sizeof *leaves, 0);
        for (int i = 0; i < W->nworkers; i++) leaves[i] = W->wchildren[i].remote_leaf;
        lpto_mpi_start(L, W, leaves, who);
        lua_pop(L, 1);
    }
    if (pto_trace_active(W->w)) lpto_level_trace(W, true);   /* traced since before init (ptolua --trace) */
}

void lpto_level_free(lua_State *L, lworker *W)
{
    bool remote = false;
    for (int i = 0; W->wchildren && i < W->nworkers; i++) {
        wchild *C = &W->wchildren[i];
        if (C->remote) {
            free(C->stats);
            C->stats = NULL;
            lpto_mpi_leaf_free(&C->remote_leaf);
            remote = true;
        }
        pto_shm_free(C->stats);
        pto_shm_free(C->prof);
        pto_shm_free(C->tl);
        pto_shm_free(C->arena);
        luaL_unref(L, LUA_REGISTRYINDEX, C->child_ref);
    }
    free(W->wchildren);
    W->wchildren = NULL;
    if (remote) lpto_mpi_stop();   /* its threads are gone (the engine closed first): the ranks can go */
    /* The children were this Worker's alone (their userdata stay alive
     * while W's does, through its user value). */
    for (int i = 0; i < W->nworkers; i++) {
        W->kids[i]->driven = true;
        lpto_worker_free(L, W->kids[i]);
    }
    free(W->kids);
    W->kids = NULL;
}

/* ---- a child on another MPI rank (lpto_mpi.c) ------------------------------------------- */

int lpto_level_host_init(lua_State *L, int idx, lworker *W, int i, char *err, size_t errlen)
{
    idx = lua_absindex(L, idx);
    W->wchildren = calloc((size_t)W->nworkers + 1, sizeof *W->wchildren);
    if (!W->wchildren) {
        snprintf(err, errlen, "out of memory");
        return 1;
    }
    for (int k = 0; k < W->nworkers; k++) W->wchildren[k].child_ref = LUA_NOREF;
    wchild *C = &W->wchildren[i];
    lua_getiuservalue(L, idx, UV_THREADS);
    lua_getiuservalue(L, idx, UV_CHILDREN);
    bind_child(L, W, C, i);
    lua_pop(L, 2);
    /* As a THREAD-mode parent hosts it, run by this rank's main thread, which holds the interpreter lock. */
    lua_pushcfunction(L, init_protected);
    lua_pushlightuserdata(L, C);
    if (lua_pcall(L, 1, 0, 0) != LUA_OK) {
        snprintf(err, errlen, "its level-%d Worker: %s", C->child->level, message(L, -1));
        lua_pop(L, 1);
        return 1;
    }
    C->child->gil_shared = true;
    return 0;
}

int lpto_level_host_run(lworker *W, int i, uint64_t callable, const pto_args_view *args, const pto_call_config *cfg,
                        char *err, size_t errlen)
{
    return level_run(&W->wchildren[i], callable, args, cfg, err, errlen);
}

size_t lpto_level_host_stats(lworker *W, int i, void *buf, size_t cap)
{
    stats_rec *recs = malloc(STATS_RECS * sizeof *recs);
    if (!recs) return 0;
    size_t n = (size_t)tree_records(W->wchildren[i].child, recs, STATS_RECS) * sizeof *recs;
    if (buf) memcpy(buf, recs, n < cap ? n : cap);
    free(recs);
    return n;
}

int lpto_level_host_load(lworker *W, int i, uint64_t callable, const void *blob, size_t len, char *err,
                         size_t errlen)
{
    return lpto_sub_load(&W->wchildren[i], callable, blob, len, err, errlen);
}

bool lpto_level_has_remote(const lworker *W)
{
    for (int i = 0; W->wchildren && i < W->nworkers; i++)
        if (W->wchildren[i].remote) return true;
    return false;
}

void lpto_level_ship_remote(lworker *W, uint64_t callable, const char *blob, size_t len)
{
    for (int i = 0; W->wchildren && i < W->nworkers; i++)
        if (W->wchildren[i].remote && lpto_mpi_ship(&W->wchildren[i].remote_leaf, callable, blob, len) != 0) {
            fprintf(stderr, "ptolua: out of memory shipping function %llu to %s\n", (unsigned long long)callable,
                    W->wchildren[i].s.name);
            abort();
        }
}

void lpto_level_host_close(lua_State *L, lworker *W, int i)
{
    wchild *C = &W->wchildren[i];
    C->child->driven = true;
    lpto_worker_free(L, C->child);
}

void lpto_level_remote_stats(wchild *C, const void *buf, size_t len)
{
    stats_block *sb = C->stats;
    size_t n = len / sizeof(stats_rec);
    if (!sb || n == 0) return;
    if (n > STATS_RECS) n = STATS_RECS;
    pthread_mutex_lock(&remote_mu);
    memcpy(sb->recs, buf, n * sizeof(stats_rec));
    sb->count = (uint32_t)n;
    pthread_mutex_unlock(&remote_mu);
}
