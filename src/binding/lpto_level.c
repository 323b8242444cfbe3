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
 * <root cause>"). After every run the leaf has the child's statistics,
 * profile and trace travel up to its parent (lpto_travel.c); the types the
 * two files share are in lpto_level_priv.h. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "lpto_level_priv.h"

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

/* The stack a task's call needs, from the leaf's arguments (C, args, cfg,
 * callable at 1..4): the storage its tensors borrow (1), then how
 * (Worker:run or Worker:submit, on the child) and its arguments: the
 * child, fn wrapped by traced_call, the task's args and cfg (2..6). */
static lpto_storage *push_call(lua_State *L, lua_CFunction how, void **box)
{
    wchild *C = lua_touserdata(L, 1);
    pto_args_view view;
    *box = lpto_result_unwrap(lua_touserdata(L, 2), &view);   /* the function does not see its result box */
    const pto_call_config *cfg = lua_touserdata(L, 3);
    lua_Integer callable = lua_tointeger(L, 4);
    lua_settop(L, 0);
    lpto_storage *st = lpto_push_storage(L, 0, 0, LPTO_ST_BORROWED);   /* 1 */
    st->why_invalid = "tensors in an orchestration function's arguments are valid only while its task runs";
    lua_pushcfunction(L, how);                                          /* 2 */
    lua_rawgeti(L, LUA_REGISTRYINDEX, C->child_ref);                    /* 3 */
    lua_rawgeti(L, LUA_REGISTRYINDEX, C->s.W->fns_ref);
    lua_rawgeti(L, -1, callable);
    lua_remove(L, -2);
    if (!lua_isfunction(L, -1))
        luaL_error(L, "callable %d is not an orchestration function registered on this Worker", (int)callable);
    lua_pushlightuserdata(L, C->child);
    lua_pushcclosure(L, traced_call, 2);                                /* 4 */
    lpto_push_args_view(L, &view, 1);                                   /* 5 */
    lpto_push_config(L, cfg);                                           /* 6 */
    return st;
}

static int run_protected(lua_State *L)
{
    wchild *C = lua_touserdata(L, 1);
    void *box;
    lpto_storage *st = push_call(L, lpto_worker_run_child, &box);
    C->child->driven = true;
    int status = lua_pcall(L, 4, LUA_MULTRET, 0);
    C->child->driven = false;
    st->valid = false;
    if (status == LUA_OK && box) lpto_result_write(L, box, 2, lua_gettop(L) - 1);
    if (status == LUA_OK) return 0;
    if (!lua_isstring(L, -1)) lua_pushliteral(L, "(error object is not a string)");
    return lua_error(L);   /* "L3 task 2 ...": the level above names its own task and this child */
}

static const char *message(lua_State *L, int idx)
{
    const char *m = lua_tostring(L, idx);
    return m ? m : "(error object is not a string)";
}

/* Onto C's thread: fn and the leaf's arguments, as push_call reads them (1..4). */
static void push_leaf_call(lua_State *T, lua_CFunction fn, wchild *C, uint64_t callable, const pto_args_view *args,
                           const pto_call_config *cfg)
{
    lua_settop(T, 0);
    lua_pushcfunction(T, fn);
    lua_pushlightuserdata(T, C);
    lua_pushlightuserdata(T, (void *)args);
    lua_pushlightuserdata(T, (void *)cfg);
    lua_pushinteger(T, (lua_Integer)callable);
}

/* The leaf's run: in the child process (PROCESS), or on the parent's worker
 * thread holding the interpreter lock (THREAD). */
static int level_run(void *ctx, uint64_t callable, const pto_args_view *args, const pto_call_config *cfg, char *err,
                     size_t errlen)
{
    wchild *C = ctx;
    lua_State *T = C->s.T;
    push_leaf_call(T, run_protected, C, callable, args, cfg);
    int rc = 0;
    if (C->tl) lpto_travel_trace_begin(C);
    int status = lua_pcall(T, 4, 0, 0);
    if (C->tl) lpto_travel_trace_end(C);
    if (status != LUA_OK) {
        snprintf(err, errlen, "%s", message(T, -1));
        rc = 1;
    }
    lua_settop(T, 0);
    lpto_travel_publish_stats(C);
    lpto_travel_publish_profile(C);
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

/* ---- the leaf, overlapping: each task a submitted run of the child ----
 * A level above stages several tasks on one Worker child; the child begins
 * each as child:submit(fn, args, cfg) and ends it with the handle's wait,
 * in order, so its runs overlap as a script's submitted runs do, ordered
 * across runs by their tags in the child's session. */

/* Begin a task: fn(orch, args, cfg) submitted on the child, its handle and
 * arguments' storage kept until the end (the task's tensors are valid until
 * then). Stack: C, args, cfg, callable, task. */
static int begin_protected(lua_State *L)
{
    wchild *C = lua_touserdata(L, 1);
    level_task *task = lua_touserdata(L, 5);
    void *box;
    lpto_storage *st = push_call(L, lpto_run_submit_child, &box);
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

/* Whether any task of C is begun and not yet ended. */
static bool begun(const wchild *C)
{
    for (int i = 0; i < LEVEL_INFLIGHT; i++)
        if (C->tasks[i].used) return true;
    return false;
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
    bool first = !begun(C);
    if (C->tl && first) lpto_travel_trace_begin(C);
    push_leaf_call(T, begin_protected, C, callable, args, cfg);
    lua_pushlightuserdata(T, task);
    int rc = 0;
    if (lua_pcall(T, 5, 0, 0) != LUA_OK) {
        snprintf(err, errlen, "%s", message(T, -1));
        rc = 1;
        if (C->tl && first) lpto_travel_trace_end(C);
        lpto_travel_publish_stats(C);
        lpto_travel_publish_profile(C);
    } else {
        task->used = true;
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
    if (C->tl && !begun(C)) lpto_travel_trace_end(C);
    lpto_travel_publish_stats(C);
    lpto_travel_publish_profile(C);
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
    lpto_travel_publish_stats(C);
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
            int nsec = lpto_travel_prof_tree_size(C->child);   /* virtual: backed as the child writes it */
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
