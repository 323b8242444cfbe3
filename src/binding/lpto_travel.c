/* lpto_travel.c - what a Worker child sends up to its parent: its
 * statistics, its profiles and its trace, for the parent's w:stats(),
 * w:report(), w:profile() and trace. The leaf that runs the child
 * (lpto_level.c) has them travel after every run. A THREAD-mode child is
 * read where it runs, in this process; a PROCESS-mode child writes into
 * shared memory its parent reads; a child on another MPI rank sends them
 * back with each answer (lpto_mpi.c), and its leaf's thread here writes
 * its records under a lock, not the seqlock.
 *
 *   Statistics: plain records, one per Worker of the child's tree, in
 *   pre-order (pto_stats is plain data, so it travels as it is), in a
 *   seqlock-published block: the child writes, the parent copies.
 *   Profiles: the child's last run profile and those of the Workers of
 *   this rank below it, in pre-order like the statistics, in a block of
 *   shared memory behind a seqlock, sized to the child's tree when the
 *   parent binds it.
 *   Traces: while its parent traces, the child traces its runs and, after
 *   each, pushes the run's events as a block of its own arena on a list the
 *   parent reads when its trace stops. Blocks are immutable once pushed, so
 *   reading needs no lock, and a child frees its blocks only after the
 *   parent's `want` changed, which the parent does after reading.
 *
 * The blocks' types are in lpto_level_priv.h, next to the Worker child's
 * record that points to them. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lpto_level_priv.h"

/* One block of that list (trace_link, lpto_level_priv.h): a run's events. */
typedef struct trace_block {
    uint64_t next;               /* the previous block's address, 0 at the end */
    uint64_t len;
    uint32_t gen;
    char text[];
} trace_block;

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
void lpto_travel_publish_stats(wchild *C)
{
    stats_block *sb = C->stats;
    if (!sb) return;
    /* Odd while writing: the RMW's acquire half keeps the writes after it. */
    uint32_t q = atomic_fetch_add_explicit(&sb->seq, 1, memory_order_acq_rel);
    sb->count = (uint32_t)tree_records(C->child, sb->recs, STATS_RECS);
    atomic_store_explicit(&sb->seq, q + 2, memory_order_release);
}

/* Workers a published profile of W's tree covers: W and those of this rank below it, at most PROF_SECTIONS. */
int lpto_travel_prof_tree_size(const lworker *W)
{
    int n = 1;
    for (int i = 0; W->level >= 4 && i < W->nworkers && n < PROF_SECTIONS; i++)
        if (!W->kids[i]->rank) n += lpto_travel_prof_tree_size(W->kids[i]);
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
void lpto_travel_publish_profile(wchild *C)
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
    F(ready_hwm); F(tensormap_hwm); F(tensormap_live); F(tasks_live); F(tasks_early);
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
void lpto_travel_trace_begin(wchild *C)
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
void lpto_travel_trace_end(wchild *C)
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

/* ---- a child on another MPI rank (lpto_mpi.c): its statistics ---------------------------- */

size_t lpto_level_host_stats(lworker *W, int i, void *buf, size_t cap)
{
    stats_rec *recs = malloc(STATS_RECS * sizeof *recs);
    if (!recs) return 0;
    size_t n = (size_t)tree_records(W->wchildren[i].child, recs, STATS_RECS) * sizeof *recs;
    if (buf) memcpy(buf, recs, n < cap ? n : cap);
    free(recs);
    return n;
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
