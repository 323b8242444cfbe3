/* lpto_worker.c - pto.Worker: construction, init, register (callable
 * handles, chip kernels), run, close, statistics. The orchestrator a run
 * hands to its function is lpto_orch.c; sub callables are lpto_sub.c. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lpto_priv.h"

typedef struct lkernel {
    char *lib;                 /* NULL: the Worker's chip runtime */
    char *symbol;
} lkernel;

/* ---- helpers --------------------------------------------------------------------- */

lworker *lpto_check_worker(lua_State *L, int idx, const char *who)
{
    lworker *W = luaL_testudata(L, idx, LPTO_WORKER);
    const char *method = who && strchr(who, ':') ? strchr(who, ':') + 1 : who ? who : "method";
    if (!W) lpto_error(L, who, "expected a Worker (call it as w:%s(...)), got %s", method, luaL_typename(L, idx));
    if (W->state == W_CLOSED) lpto_error(L, who, "this Worker is closed; create a new one with pto.Worker{...}");
    return W;
}

/* ---- Worker ------------------------------------------------------------------------ */

/* $PTO_MODE picks the default mode, so a whole script or test suite can
 * switch without editing each pto.Worker{...}. */
static int default_mode(lua_State *L, const char *who)
{
    const char *m = getenv("PTO_MODE");
    if (!m || !*m || strcmp(m, "process") == 0) return PTO_MODE_PROCESS;
    if (strcmp(m, "thread") == 0) return PTO_MODE_THREAD;
    return lpto_error(L, who, "the environment variable PTO_MODE is '%s'; set it to \"thread\" or \"process\", or unset it", m);
}

/* pto.Worker{...}'s fields, in the order the "unknown field" message lists
 * them; the integer ones are read in this order too, with these ranges. */
enum { F_LEVEL, F_MODE, F_CHIPS, F_SUBS, F_HEAP, F_ALLOC_TIMEOUT, F_RUNTIME, F_DEPTH, F_START_TIMEOUT, F_SHM, F_TASK_TIMEOUT, F_RANK, F_CHECK, F_CATCH, F_COUNT };
static const lpto_field WORKER_FIELDS[F_COUNT + 1] = {
    [F_LEVEL] = {"level", 3, 64},
    [F_MODE] = {"mode", 1, 0},
    [F_CHIPS] = {"chips", 0, 1024},
    [F_SUBS] = {"num_sub_workers", 0, 1024},
    [F_HEAP] = {"heap_ring_size", PTO_HEAP_ALIGN, (lua_Integer)1 << 46},
    [F_ALLOC_TIMEOUT] = {"alloc_timeout_ms", 1, 24 * 3600 * 1000},
    [F_RUNTIME] = {"chip_runtime", 1, 0},
    [F_DEPTH] = {"queue_depth", 1, 64},
    [F_START_TIMEOUT] = {"start_timeout_ms", 1, 24 * 3600 * 1000},
    [F_SHM] = {"shm_size", 16 << 20, (lua_Integer)1 << 50},
    [F_TASK_TIMEOUT] = {"task_timeout_ms", 0, 24 * 3600 * 1000},
    [F_RANK] = {"rank", 1, 1 << 24},
    [F_CHECK] = {"check", 1, 0},
    [F_CATCH] = {"catch", 1, 0},
    [F_COUNT] = {NULL, 0, 0},
};

/* The integer fields of the table at 1 into v (0 when absent; level 3). */
static void worker_int_fields(lua_State *L, lua_Integer v[F_COUNT], const char *who)
{
    for (int i = 0; i < F_COUNT; i++) {
        v[i] = i == F_LEVEL ? 3 : 0;
        if (WORKER_FIELDS[i].lo <= WORKER_FIELDS[i].hi) lpto_get_field(L, 1, &WORKER_FIELDS[i], &v[i], who);
    }
    if (v[F_LEVEL] >= 4 && v[F_CHIPS] > 0)
        lpto_error(L, who, "chips = %lld: a level-%lld Worker has no chips; its next-level children are "
                           "level-%lld Workers added with Worker:add_worker (give the chips to those)",
                   (long long)v[F_CHIPS], (long long)v[F_LEVEL], (long long)v[F_LEVEL] - 1);
}

static int worker_mode_field(lua_State *L, const char *who)
{
    lua_getfield(L, 1, "mode");
    int mode;
    if (lua_isnil(L, -1)) {
        mode = default_mode(L, who);
    } else {
        const char *m = lua_tostring(L, -1);
        if (lua_type(L, -1) != LUA_TSTRING || (strcmp(m, "thread") && strcmp(m, "process")))
            return lpto_error(L, who, "mode must be \"thread\" or \"process\" (got %s)", luaL_tolstring(L, -1, NULL));
        mode = strcmp(m, "process") == 0 ? PTO_MODE_PROCESS : PTO_MODE_THREAD;
    }
    lua_pop(L, 1);
    return mode;
}

/* check = true | false | "warn", else $PTO_CHECK ("1" on; "warn" on with findings as warnings; "0" or
 * unset off), so `ptolua --check[=warn]` reaches every Worker. The check mode (0, PTO_CHECK_ON, _WARN). */
static int worker_check_field(lua_State *L, const char *who)
{
    lua_getfield(L, 1, "check");
    int t = lua_type(L, -1);
    bool on = lua_toboolean(L, -1);
    bool warn = t == LUA_TSTRING && strcmp(lua_tostring(L, -1), "warn") == 0;
    lua_pop(L, 1);
    if (t == LUA_TBOOLEAN || warn) {
        if (on) lpto_check_record();
        return warn ? PTO_CHECK_WARN : on ? PTO_CHECK_ON : 0;
    }
    if (t != LUA_TNIL)
        return lpto_error(L, who, "check must be true or false, or \"warn\" (got %s)", lua_typename(L, t));
    const char *e = getenv("PTO_CHECK");
    if (!e || !*e || strcmp(e, "0") == 0) return 0;
    if (strcmp(e, "1") == 0) return lpto_check_record(), PTO_CHECK_ON;
    if (strcmp(e, "warn") == 0) return lpto_check_record(), PTO_CHECK_WARN;
    return lpto_error(L, who, "the environment variable PTO_CHECK is '%s'; set it to 1 (check mode), warn (check "
                      "mode, findings as warnings) or 0, or unset it", e);
}

/* Push a new Worker userdata over w, with its user values. */
static lworker *push_worker(lua_State *L, pto_worker *w)
{
    lworker *W = lua_newuserdatauv(L, sizeof *W, UV_COUNT);
    memset(W, 0, sizeof *W);
    W->w = w;
    W->owner = getpid();
    W->gil = lpto_gil_of(L);
    luaL_setmetatable(L, LPTO_WORKER);
    lua_newtable(L);
    lua_pushvalue(L, -1);
    W->fns_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_setiuservalue(L, -2, UV_FNS);
    lua_newtable(L);
    lua_setiuservalue(L, -2, UV_THREADS);
    lua_newtable(L);
    lua_setiuservalue(L, -2, UV_CHILDREN);
    lua_newtable(L);
    lua_setiuservalue(L, -2, UV_HANDLES);
    lua_newtable(L);
    lua_setiuservalue(L, -2, UV_RUNS);
    return W;
}

/* pto.Worker{level, mode, chips, num_sub_workers, ...} */
static int l_worker(lua_State *L)
{
    const char *who = "pto.Worker";
    if (!lua_isnoneornil(L, 1) && !lua_istable(L, 1))
        return lpto_error(L, who, "expected a table like pto.Worker{chips = 2} (got %s)", luaL_typename(L, 1));
    if (lua_isnoneornil(L, 1)) {
        lua_settop(L, 0);
        lua_newtable(L);
    }
    lpto_check_fields(L, 1, WORKER_FIELDS, who);
    lua_Integer v[F_COUNT];
    worker_int_fields(L, v, who);
    int mode = worker_mode_field(L, who);
    int check = worker_check_field(L, who);
    lua_getfield(L, 1, "catch");
    if (!lua_isnil(L, -1) && !lua_isboolean(L, -1))
        return lpto_error(L, who, "catch must be true or false (got %s)", luaL_typename(L, -1));
    bool catch_on = lua_toboolean(L, -1);
    lua_pop(L, 1);
    lua_getfield(L, 1, "chip_runtime");
    if (!lua_isnil(L, -1) && lua_type(L, -1) != LUA_TSTRING)
        return lpto_error(L, who, "chip_runtime must be the path of a chip runtime library (got %s)", luaL_typename(L, -1));
    const char *rt = lua_tostring(L, -1);

    pto_worker_config cfg = {.level = (int32_t)v[F_LEVEL], .mode = mode, .heap_ring_size = (uint64_t)v[F_HEAP],
                             .alloc_timeout_ms = (uint32_t)v[F_ALLOC_TIMEOUT], .queue_depth = (int32_t)v[F_DEPTH],
                             .start_timeout_ms = (uint32_t)v[F_START_TIMEOUT],
                             .task_timeout_ms = (uint32_t)v[F_TASK_TIMEOUT]};
    if (v[F_RANK]) lpto_mpi_check_rank(L, (int)v[F_LEVEL], v[F_RANK], who);
    pto_worker *w = pto_worker_new(&cfg);
    if (!w) return lpto_engine_error(L, who);
    pto_worker_check_set(w, check);
    pto_worker_catch_set(w, catch_on);
    lworker *W = push_worker(L, w);
    W->shm_size = (uint64_t)v[F_SHM];
    W->level = (int)v[F_LEVEL];
    W->mode = mode;
    W->nchips = (int)v[F_CHIPS];
    W->nsubs = (int)v[F_SUBS];
    W->rank = (int)v[F_RANK];
    W->chip_runtime = rt ? strdup(rt) : NULL;
    lpto_debug_track(L, -1);
    lpto_trace_new_worker(L, -1);
    return 1;
}

void lpto_worker_free(lua_State *L, lworker *W)
{
    if (W->state == W_CLOSED) return;
    if (W->owner != getpid()) {
        /* A copy inherited by a forked child (a sub, or the host of a
         * Worker child) that its garbage collector found: the engine's
         * threads and children belong to the original. Forget it. */
        W->state = W_CLOSED;
        W->w = NULL;
        return;
    }
    if (W->runs_open) lpto_active_remove(W->w);   /* before the engine goes: Ctrl-C must not find it */
    W->runs_open = false;
    pto_worker_close(W->w);   /* children processes first: they may be running the Worker children */
    lpto_level_free(L, W);
    W->w = NULL;
    W->state = W_CLOSED;
    free(W->subs);
    free(W->chip_names);
    free(W->chip_runtime);
    free(W->scratch);
    W->subs = NULL;
    W->chip_names = NULL;
    W->chip_runtime = NULL;
    W->scratch = NULL;
    luaL_unref(L, LUA_REGISTRYINDEX, W->fns_ref);
    W->fns_ref = LUA_NOREF;
}

static void worker_close(lua_State *L, lworker *W)
{
    const char *who = "Worker:close";
    if (W->state == W_CLOSED) return;
    if (W->in_run && !W->interactive)
        lpto_error(L, who, "a run is in progress; close the Worker after Worker:run returns");
    if (W->interactive) {   /* an open_run left open: its tasks are dropped with the Worker */
        lua_getiuservalue(L, 1, UV_ORCH);
        lpto_orch_end(L, -1);
        lua_pop(L, 1);
        W->in_run = W->interactive = false;
    }
    if (W->parent && !W->driven)
        lpto_error(L, who, "this Worker is a child of a level-%d Worker; closing that Worker closes it",
                   W->parent->level);
    /* Submitted runs outstanding: close waits for them (their failures stay on their handles). */
    if (W->runs_open && W->owner == getpid()) {
        if (lpto_runs_wait_all(L, 1, W, who)) lua_pop(L, 1);
    }
    lpto_worker_free(L, W);
}

/* w:close() and __close: a traced Worker writes its trace first. */
static int w_close(lua_State *L)
{
    lworker *W = luaL_testudata(L, 1, LPTO_WORKER);
    if (!W) return lpto_error(L, "Worker:close", "expected a Worker (call it as w:close()), got %s", luaL_typename(L, 1));
    int first = lua_gettop(L) + 1;
    int errs = lpto_trace_closing(L, W, false);
    worker_close(L, W);
    return lpto_trace_closed(L, first, errs, false);
}

static int w_gc(lua_State *L)
{
    lworker *W = lua_touserdata(L, 1);
    int first = lua_gettop(L) + 1;
    int errs = lpto_trace_closing(L, W, true);
    /* A Worker child is closed by its parent, which may still be running it. */
    if ((!W->in_run || W->interactive) && !W->parent) lpto_worker_free(L, W);
    return lpto_trace_closed(L, first, errs, true);
}

static void worker_init_body(lua_State *L, int idx, lworker *W, const char *who);

static int init_protected(lua_State *L)
{
    worker_init_body(L, 2, lua_touserdata(L, 1), lua_tostring(L, 3));
    return 0;
}

void lpto_worker_init(lua_State *L, int idx, lworker *W, const char *who)
{
    if (W->state != W_NEW) return;
    if (W->init_failed)
        lpto_error(L, who, "this Worker's init failed earlier; close it and create a new one with pto.Worker{...}");
    if (W->parent && !W->driven)
        lpto_error(L, who, "this Worker is a child of a level-%d Worker, which initialises and runs it; use that Worker",
                   W->parent->level);
    if (W->rank && !W->parent)
        lpto_error(L, who, "this Worker has rank = %d: it lives on MPI rank %d as the child of a level-4 Worker; add it "
                           "with w4:add_worker(w) and init and run that Worker", W->rank, W->rank);
    idx = lua_absindex(L, idx);
    lua_pushcfunction(L, init_protected);
    lua_pushlightuserdata(L, W);
    lua_pushvalue(L, idx);
    lua_pushstring(L, who);
    /* A failure part-way leaves leaves added to the engine: a retry would
     * add them twice, so it is refused instead. */
    if (lua_pcall(L, 3, 0, 0) != LUA_OK) {
        W->init_failed = true;
        lua_error(L);
    }
}

static void worker_init_body(lua_State *L, int idx, lworker *W, const char *who)
{
    idx = lua_absindex(L, idx);
    /* The engine's init failures name init, whichever method initialised the Worker. */
    const char *init = who ? "Worker:init" : NULL;
    W->chip_names = calloc((size_t)W->nchips + 1, sizeof *W->chip_names);
    W->subs = calloc((size_t)W->nsubs + 1, sizeof *W->subs);
    if (!W->chip_names || !W->subs) lpto_error(L, who, "out of memory");
    for (int i = 0; i < W->nchips; i++) {
        pto_leaf leaf = pto_chip_leaf();
        snprintf(W->chip_names[i], sizeof W->chip_names[i], "chip %d", i + 1);
        leaf.name = W->chip_names[i];
        leaf.ctx = W->chip_runtime;   /* the child dlopens this runtime (NULL: the built-in one) */
        if (pto_worker_add_next_level(W->w, &leaf) < 0) lpto_engine_error(L, init);
    }
    lua_getiuservalue(L, idx, UV_THREADS);
    for (int i = 0; i < W->nsubs; i++) {
        sub_ctx *S = &W->subs[i];
        S->W = W;
        snprintf(S->name, sizeof S->name, "sub %d", i + 1);
        S->T = lua_newthread(L);
        lua_rawseti(L, -2, i + 1);
        pto_leaf leaf = {.run = lpto_sub_leaf, .ctx = S, .name = S->name};
        if (W->mode == PTO_MODE_PROCESS) {   /* alone in its child: no lock */
            leaf.run = lpto_sub_run;
            leaf.load = lpto_sub_load;
        }
        if (pto_worker_add_sub(W->w, &leaf) < 0) lpto_engine_error(L, init);
    }
    lua_pop(L, 1);
    if (W->level >= 4) lpto_level_init(L, idx, W, who);
    if (pto_worker_init(W->w) != 0) lpto_engine_error(L, init);
    if (W->gil) pto_worker_on_block(W->w, lpto_gil_block, lpto_gil_unblock, W->gil);
    W->home = pthread_self();
    W->state = W_READY;
}

static int w_init(lua_State *L)
{
    lworker *W = lpto_check_worker(L, 1, "Worker:init");
    if (W->parent && !W->driven)
        return lpto_error(L, "Worker:init", "this Worker is a child of a level-%d Worker, which initialises and runs "
                                            "it; use that Worker", W->parent->level);
    if (W->state == W_READY) return lpto_error(L, "Worker:init", "this Worker is already initialised; call init once "
                                                          "(Worker:run initialises a new Worker itself)");
    lpto_worker_init(L, 1, W, "Worker:init");
    lua_settop(L, 1);
    return 1;
}

/* Children forked before this kernel resolve it themselves: ship "lib\0symbol\0". */
static void ship_kernel(lua_State *L, lworker *W, const lkernel *k, int64_t id, const char *who)
{
    const char *lib = k->lib ? k->lib : W->chip_runtime ? W->chip_runtime : "";
    size_t ll = strlen(lib), sl = strlen(k->symbol);
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    luaL_addlstring(&b, lib, ll + 1);
    luaL_addlstring(&b, k->symbol, sl + 1);
    luaL_pushresult(&b);
    if (pto_worker_ship_callable(W->w, PTO_NEXT_LEVEL, (uint64_t)id, lua_tostring(L, -1), ll + sl + 2) != 0)
        lpto_engine_error(L, who);
    lua_pop(L, 1);
}

/* Push the handle of kind for callable, registered on the Worker at 1. */
static void push_handle(lua_State *L, int kind, uint64_t callable)
{
    lhandle *h = lua_newuserdatauv(L, sizeof *h, 1);
    *h = (lhandle){kind, callable, lua_touserdata(L, 1)};
    lua_pushvalue(L, 1);
    lua_setiuservalue(L, -2, 1);
    luaL_setmetatable(L, LPTO_HANDLE);
    lua_getiuservalue(L, 1, UV_HANDLES);   /* for Worker:callables (the REPL's :break by name) */
    lua_pushvalue(L, -2);
    lua_rawseti(L, -2, (lua_Integer)lua_rawlen(L, -2) + 1);
    lua_pop(L, 1);
}

static void register_kernel(lua_State *L, lworker *W, const lkernel *k, const char *name, const char *who)
{
    if (W->level >= 4)
        lpto_error(L, who, "a level-%d Worker has no chips: register chip kernels on the level-3 Workers "
                           "that run them, and submit those handles from their orchestration function",
                   W->level);
    int64_t id = pto_kernel_register(k->lib ? k->lib : W->chip_runtime, k->symbol);
    if (id < 0) lpto_engine_error(L, who);
    pto_worker_callable_name_set(W->w, PTO_NEXT_LEVEL, (uint64_t)id, name ? name : k->symbol);
    if (W->mode == PTO_MODE_PROCESS && W->state == W_READY) ship_kernel(L, W, k, id, who);
    push_handle(L, LPTO_HANDLE_KERNEL, (uint64_t)id);
}

/* Ship the function's blob (on top) to the children that may run callable id. */
static void ship_blob(lua_State *L, lworker *W, uint64_t id, const char *who)
{
    size_t len;
    const char *blob = lua_tolstring(L, -1, &len);
    if (W->mode == PTO_MODE_PROCESS) {
        if (W->nsubs > 0 && pto_worker_ship_callable(W->w, PTO_SUB, id, blob, len) != 0) lpto_engine_error(L, who);
        if (W->nworkers > 0 && pto_worker_ship_callable(W->w, PTO_NEXT_LEVEL, id, blob, len) != 0)
            lpto_engine_error(L, who);
    }
    lpto_level_ship_remote(W, id, blob, len);   /* Worker children on other MPI ranks, if any */
    lua_pop(L, 1);
}

static void register_function(lua_State *L, lworker *W, const char *name, const char *who)
{
    /* Children forked at init cannot see a function registered later; at
     * level >= 4 a function may run on a sub or on a Worker child. */
    bool ship = W->state == W_READY && ((W->mode == PTO_MODE_PROCESS && (W->nsubs > 0 || W->nworkers > 0)) ||
                                        lpto_level_has_remote(W));
    if (ship) lpto_ship_function(L, 2, who);
    uint64_t id = ++W->next_fn;
    if (ship) ship_blob(L, W, id, who);
    lua_getiuservalue(L, 1, UV_FNS);
    lua_pushvalue(L, 2);
    lua_rawseti(L, -2, (lua_Integer)id);
    lua_pop(L, 1);
    char where[160];
    if (!name) {
        lua_Debug ar;
        lua_pushvalue(L, 2);
        lua_getinfo(L, ">S", &ar);
        snprintf(where, sizeof where, "function at %s:%d", ar.short_src, ar.linedefined);
        name = where;
    }
    pto_worker_callable_name_set(W->w, PTO_SUB, id, name);
    if (W->level >= 4) pto_worker_callable_name_set(W->w, PTO_NEXT_LEVEL, id, name);
    push_handle(L, LPTO_HANDLE_FUNCTION, id);
}

/* w:register(fn [, name]) or w:register(pto.chip_kernel(...)) -> handle */
static int w_register(lua_State *L)
{
    const char *who = "Worker:register";
    lworker *W = lpto_check_worker(L, 1, who);
    lkernel *k = luaL_testudata(L, 2, LPTO_KERNEL);
    if (!lua_isnoneornil(L, 3) && lua_type(L, 3) != LUA_TSTRING)
        return lpto_error(L, who, "the optional name must be a string (got %s)", luaL_typename(L, 3));
    const char *name = lua_tostring(L, 3);
    if (k) register_kernel(L, W, k, name, who);
    else if (lua_isfunction(L, 2)) register_function(L, W, name, who);
    else
        return lpto_error(L, who, "expected a Lua function (a sub callable) or pto.chip_kernel(...) (got %s)",
                          luaL_typename(L, 2));
    return 1;
}

void lpto_worker_check_can_run(lua_State *L, lworker *W, const char *who)
{
    if (W->parent && !W->driven)
        lpto_error(L, who, "this Worker is a child of a level-%d Worker, which runs it: submit an orchestration "
                           "function to that Worker with orch:submit_next_level", W->parent->level);
    if (W->interactive)
        lpto_error(L, who, "a run opened by Worker:open_run is open on this Worker; submit to its "
                           "orchestrator, or end it with Worker:close_run (:finish at the prompt) first");
    if (W->in_run) lpto_error(L, who, "a run of this Worker is already in progress (runs do not nest)");
    if (!lua_isfunction(L, 2))
        lpto_error(L, who, "expected the function to run, fn(orch, args, cfg), as argument 1 (got %s)",
                   luaL_typename(L, 2));
}

/* ---- progress ---------------------------------------------------------------------
 * A run of a top-level Worker that lasts more than a second shows one line on
 * stderr, when stderr is a terminal and PTO_PROGRESS is not "0": tasks done
 * of submitted, the rate, failures; the line is cleared when the run ends.
 * Nothing is added to the engine's hot path: the line is written by the
 * thread that runs the orchestration function (the only one that may read
 * the submit counter), from a Lua count hook while that function runs (only
 * when no other hook is set) and from the run's final wait, which polls
 * pto_dispatch_wait instead of blocking in one call. */

#define PROGRESS_AFTER 1.0      /* seconds before the line appears */
#define PROGRESS_EVERY 0.25     /* seconds between updates */
#define PROGRESS_HOOK_COUNT 20000

typedef struct progress {
    lworker *W;
    pthread_t thread;          /* the run's thread: the one that may read the submit counter */
    double t0, last;
    int64_t done0, failed0, submitted0;
    bool shown;
} progress;

static progress *progress_now;   /* the run showing progress (one at a time), or NULL */

static double mono_now(void) { return (double)lpto_now_ns() * 1e-9; }

static void progress_tick(progress *p)
{
    double now = mono_now();
    if (!pthread_equal(p->thread, pthread_self())) return;   /* a coroutine or sub that inherited the hook */
    if (now - p->t0 < PROGRESS_AFTER || now - p->last < PROGRESS_EVERY) return;
    p->last = now;
    pto_stats st;
    pto_worker_stats_get(p->W->w, &st);
    int64_t done = st.tasks_completed - p->done0, failed = st.tasks_failed - p->failed0;
    fprintf(stderr, "\r[pto] %lld of %lld tasks done, %.0f tasks/s, %lld failed, %.1f s\033[K",
            (long long)done, (long long)(st.tasks_submitted - p->submitted0), done / (now - p->t0),
            (long long)failed, now - p->t0);
    fflush(stderr);
    p->shown = true;
}

static void progress_hook(lua_State *L, lua_Debug *ar)
{
    (void)L;
    (void)ar;
    if (progress_now) progress_tick(progress_now);
}

/* Start showing progress for W's run on L, if it should be shown. */
static progress *progress_begin(lua_State *L, lworker *W, progress *p, const char *who)
{
    /* Asked once per process: a run's fixed cost is a few µs, and a Lua
     * script can neither set the environment nor move stderr off a tty. */
    static int wanted = -1;
    if (!who || W->parent || progress_now) return NULL;
    if (wanted < 0) {
        const char *env = getenv("PTO_PROGRESS");
        wanted = !(env && strcmp(env, "0") == 0) && isatty(STDERR_FILENO);
    }
    if (!wanted) return NULL;
    pto_stats st;
    pto_worker_stats_get(W->w, &st);
    *p = (progress){W, pthread_self(), mono_now(), 0, st.tasks_completed, st.tasks_failed, st.tasks_submitted, false};
    progress_now = p;
    if (!lua_gethook(L)) lua_sethook(L, progress_hook, LUA_MASKCOUNT, PROGRESS_HOOK_COUNT);
    return p;
}

/* The orchestration function returned: no more hook (its own, if still set). */
static void progress_unhook(lua_State *L, progress *p)
{
    if (p && lua_gethook(L) == progress_hook) lua_sethook(L, NULL, 0, 0);
}

static void progress_end(progress *p)
{
    if (!p) return;
    if (p->shown) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
    }
    progress_now = NULL;
}

/* Wait for the run of the orchestrator at oidx to drain and end it; returns
 * its failure (to free), or NULL. With progress p, the wait is in slices. */
static char *end_run(lua_State *L, lworker *W, int oidx, progress *p)
{
    lpto_gil_release(W->gil);   /* THREAD-mode subs still run while the run drains */
    pto_dispatch_state ds;
    if (p) pto_dispatch_get(W->w, &ds);
    if (p && !ds.held)   /* a held Worker is drained by pto_run_end alone; its step stays as it is */
        while (pto_dispatch_wait(W->w, 100) == 0) progress_tick(p);
    int rc = pto_run_end(W->w);
    lpto_gil_acquire(W->gil);
    char *fail = rc != 0 ? strdup(pto_errmsg()) : NULL;
    lpto_active_remove(W->w);
    W->in_run = false;
    lpto_orch_end(L, oidx);   /* heap-ring tensors of this run die with it */
    lua_pushnil(L);
    lua_setiuservalue(L, 1, UV_ORCH);
    return fail;
}

/* Push the engine's failure of W's run. In a tree of Workers each level's
 * failure names its level: "L4 task 0 (... on L3 worker 1 (pid 7)) failed:
 * L3 task 2 ...". */
void lpto_push_run_failure(lua_State *L, lworker *W, const char *fail)
{
    if (W->level >= 4 || W->parent) lua_pushfstring(L, "L%d %s", W->level, fail);
    else lua_pushstring(L, fail);
    lpto_check_explain(L);
}

/* w:run(fn, args, cfg), called as the Lua method (who) or by a Worker
 * child's leaf (who NULL: the level above names the failure). */
static int worker_run(lua_State *L, const char *who)
{
    lworker *W = lpto_check_worker(L, 1, who);
    lpto_worker_check_can_run(L, W, who);
    /* Submitted runs outstanding: this one joins them (ordered after them by the tag rules); all
     * finished: their session ends and this is a blocking run again. */
    if (W->runs_open && pto_runs_live(W->w) == 0) lpto_runs_before_blocking(L, W, who);
    if (W->runs_open) return lpto_run_blocking(L, who);
    lua_settop(L, 4);
    lpto_worker_init(L, 1, W, who);
    pto_orch *o = pto_run_begin(W->w);
    if (!o) return lpto_engine_error(L, who);
    W->in_run = true;
    lpto_active_add(W->w);
    lpto_push_orch(L, 1, W, o);   /* 5 */
    lua_pushvalue(L, 5);
    lua_setiuservalue(L, 1, UV_ORCH);
    progress pstate;
    progress *p = progress_begin(L, W, &pstate, who);

    int base = lua_gettop(L);
    lua_pushvalue(L, 2);
    lua_pushvalue(L, 5);
    lua_pushvalue(L, 3);
    lua_pushvalue(L, 4);
    int status = lua_pcall(L, 3, LUA_MULTRET, 0);
    int nres = lua_gettop(L) - base;
    progress_unhook(L, p);
    char *fail = end_run(L, W, 5, p);
    progress_end(p);
    if (status == LUA_OK && !fail) return nres;
    if (status == LUA_OK) {   /* else the function's own error passes unchanged */
        lpto_push_run_failure(L, W, fail);
        if (who) lua_pushfstring(L, "%s: %s", who, lua_tostring(L, -1));   /* who NULL: the level above names it */
    }
    free(fail);
    return lua_error(L);
}

static int w_run(lua_State *L) { return worker_run(L, "Worker:run"); }
int lpto_worker_run_child(lua_State *L) { return worker_run(L, NULL); }

static int w_stats(lua_State *L)
{
    lpto_level_push_stats(L, lpto_check_worker(L, 1, "Worker:stats"));
    return 1;
}

/* Push {pid, ...}: the processes serving W's n workers of kind now (empty in THREAD mode). */
static void push_child_pids(lua_State *L, lworker *W, int kind, int n)
{
    lua_createtable(L, n, 0);
    for (int i = 0; W->state == W_READY && i < n; i++) {
        int pid = pto_worker_child_pid(W->w, kind, i);
        if (pid <= 0) continue;
        lua_pushinteger(L, pid);
        lua_rawseti(L, -2, i + 1);
    }
}

/* w:child_pids() -> {chips = {pid, ...}, subs = {pid, ...}[, workers = {pid, ...}]}; for tests and tools. */
static int w_child_pids(lua_State *L)
{
    lworker *W = lpto_check_worker(L, 1, "Worker:child_pids");
    lua_createtable(L, 0, 3);
    push_child_pids(L, W, PTO_NEXT_LEVEL, W->nchips);
    lua_setfield(L, -2, "chips");
    push_child_pids(L, W, PTO_SUB, W->nsubs);
    lua_setfield(L, -2, "subs");
    if (W->level >= 4) {
        push_child_pids(L, W, PTO_NEXT_LEVEL, W->nworkers);
        lua_setfield(L, -2, "workers");
    }
    return 1;
}

/* The flags of an optional {full = bool} table at idx (the report's long form lists unused rings). */
static int32_t report_flags(lua_State *L, int idx, const char *who)
{
    if (lua_isnoneornil(L, idx)) return 0;
    if (!lua_istable(L, idx))
        return lpto_error(L, who, "the options must be a table like {full = true} (got %s)", luaL_typename(L, idx));
    static const lpto_field fields[] = {{"full", 1, 0}, {NULL, 0, 0}};
    lpto_check_fields(L, idx, fields, who);
    lua_getfield(L, idx, "full");
    if (!lua_isnil(L, -1) && !lua_isboolean(L, -1))
        return lpto_error(L, who, "full must be a boolean (got %s)", luaL_typename(L, -1));
    int32_t flags = lua_toboolean(L, -1) ? PTO_STATS_FULL : 0;
    lua_pop(L, 1);
    return flags;
}

/* Push the print_stats line on the time of W's last ended run (from its profile), or nothing (0). */
static int push_time_line(lua_State *L, lworker *W)
{
    pto_profile_run run;
    int64_t n = W->state == W_READY && W->w ? pto_profile_get(W->w, &run, NULL, 0) : -1;
    if (n < 0 || run.end_ns <= run.begin_ns) return 0;
    pto_profile_task *t = lua_newuserdatauv(L, (size_t)(n ? n : 1) * sizeof *t, 0);
    n = pto_profile_get(W->w, &run, t, n);
    uint64_t busy = 0, first = UINT64_MAX, last = 0;
    for (int64_t i = 0; i < n; i++) {
        if (t[i].failed == 2) continue;
        busy += t[i].end_ns - t[i].start_ns;
        if (t[i].start_ns < first) first = t[i].start_ns;
        if (t[i].end_ns > last) last = t[i].end_ns;
    }
    double span = (double)(run.end_ns - run.begin_ns);
    uint64_t drain = run.drain_ns > run.begin_ns ? run.drain_ns - run.begin_ns : 0;
    double orch = drain > run.waited_ns ? (double)(drain - run.waited_ns) : 0;
    int workers = (W->level >= 4 ? W->nworkers : W->nchips) + W->nsubs;
    char line[320];
    snprintf(line, sizeof line,
             "Time (run %lld): %.3f ms from start to drained; orchestration %.3f ms, execution %.3f ms; "
             "workers busy %.0f%%\n  (w:profile(), :profile or ptolua --profile: times per callable and worker, "
             "the critical path, a verdict)\n",
             (long long)run.run, span / 1e6, orch / 1e6, last > first ? (double)(last - first) / 1e6 : 0.0,
             workers > 0 ? (double)busy / span / workers * 100 : 0.0);
    lua_pop(L, 1);
    lua_pushstring(L, line);
    return 1;
}

static void push_report(lua_State *L, lworker *W, int32_t flags)
{
    pto_stats st;
    pto_worker_stats_get(W->w, &st);
    int n = pto_format_stats_ex(&st, W->level, flags, NULL, 0);
    luaL_Buffer b;
    char *p = luaL_buffinitsize(L, &b, (size_t)n + 1);
    pto_format_stats_ex(&st, W->level, flags, p, (size_t)n + 1);
    luaL_addsize(&b, (size_t)n);
    if (W->level >= 4) lpto_level_report(W, &b);
    luaL_pushresult(&b);
    /* The time of the last run goes after the task counts and peaks (when a run has ended). */
    const char *r = lua_tostring(L, -1), *peaks = strstr(r, "\nPeaks:");
    const char *at = peaks ? strchr(peaks + 1, '\n') : NULL;
    if (at && push_time_line(L, W)) {
        lua_pushlstring(L, r, (size_t)(at + 1 - r));
        lua_insert(L, -2);
        lua_pushstring(L, at + 1);
        lua_concat(L, 3);
        lua_remove(L, -2);
    }
}

/* w:stats_report([{full = true}]) */
static int w_stats_report(lua_State *L)
{
    const char *who = "Worker:stats_report";
    lworker *W = lpto_check_worker(L, 1, who);
    push_report(L, W, report_flags(L, 2, who));
    return 1;
}

/* w:print_stats([{full = true}]) */
static int w_print_stats(lua_State *L)
{
    const char *who = "Worker:print_stats";
    lworker *W = lpto_check_worker(L, 1, who);
    push_report(L, W, report_flags(L, 2, who));
    fwrite(lua_tostring(L, -1), 1, lua_rawlen(L, -1), stdout);
    fflush(stdout);
    return 0;
}

static int w_index(lua_State *L)
{
    lworker *W = lua_touserdata(L, 1);
    const char *k = lua_tostring(L, 2);
    if (k && strcmp(k, "closed") == 0) return lua_pushboolean(L, W->state == W_CLOSED), 1;
    if (k && strcmp(k, "level") == 0) return lua_pushinteger(L, W->level), 1;
    if (k && strcmp(k, "chips") == 0) return lua_pushinteger(L, W->nchips), 1;
    if (k && strcmp(k, "num_sub_workers") == 0) return lua_pushinteger(L, W->nsubs), 1;
    if (k && strcmp(k, "workers") == 0) return lua_pushinteger(L, W->nworkers), 1;
    if (k && strcmp(k, "mode") == 0) return lua_pushstring(L, W->mode == PTO_MODE_THREAD ? "thread" : "process"), 1;
    if (k && strcmp(k, "catch") == 0) return lua_pushboolean(L, W->w && pto_worker_catch(W->w)), 1;
    if (k && strcmp(k, "check") == 0) {   /* true, false, or "warn" */
        int32_t m = W->w ? pto_worker_check(W->w) : 0;
        if (m == PTO_CHECK_WARN) return lua_pushliteral(L, "warn"), 1;
        return lua_pushboolean(L, m != 0), 1;
    }
    if (k && strcmp(k, "initialized") == 0) return lua_pushboolean(L, W->state == W_READY), 1;
    luaL_getmetafield(L, 1, "methods");
    lua_getfield(L, -1, k);
    return 1;
}

static int w_tostring(lua_State *L)
{
    lworker *W = lua_touserdata(L, 1);
    lua_pushfstring(L, W->level >= 4 ? "Worker(level %d, %s mode, %d Worker children, %d sub workers%s)"
                                     : "Worker(level %d, %s mode, %d chips, %d sub workers%s)",
                    W->level, W->mode == PTO_MODE_THREAD ? "thread" : "process", W->level >= 4 ? W->nworkers : W->nchips,
                    W->nsubs,
                    W->state == W_CLOSED ? ", closed" : W->state == W_NEW ? ", not initialised" : "");
    return 1;
}

/* Seconds on the monotonic clock, for timing runs (os.clock is CPU time). */
static int l_now(lua_State *L)
{
    lua_pushnumber(L, mono_now());
    return 1;
}

/* ---- chip kernels and handles ------------------------------------------------------ */

static int k_gc(lua_State *L)
{
    lkernel *k = lua_touserdata(L, 1);
    free(k->lib);
    free(k->symbol);
    k->lib = k->symbol = NULL;
    return 0;
}

static int l_chip_kernel(lua_State *L)
{
    const char *who = "pto.chip_kernel";
    const char *lib = NULL, *sym = NULL;
    if (lua_type(L, 1) == LUA_TSTRING) {
        sym = lua_tostring(L, 1);
    } else if (lua_istable(L, 1)) {
        static const lpto_field fields[] = {{"lib", 1, 0}, {"symbol", 1, 0}, {NULL, 0, 0}};
        lpto_check_fields(L, 1, fields, who);
        lua_getfield(L, 1, "lib");
        lua_getfield(L, 1, "symbol");
        if (lua_type(L, -2) != LUA_TSTRING && !lua_isnil(L, -2))
            return lpto_error(L, who, "lib must be the path of a shared library (got %s)", luaL_typename(L, -2));
        if (lua_type(L, -1) != LUA_TSTRING)
            return lpto_error(L, who, "symbol must be the kernel's name in lib (got %s)", luaL_typename(L, -1));
        lib = lua_tostring(L, -2);
        sym = lua_tostring(L, -1);
    } else {
        return lpto_error(L, who, "expected a kernel name like \"vector_add\" or {lib = \"path.so\", symbol = \"name\"} "
                                  "(got %s)", luaL_typename(L, 1));
    }
    if (!*sym) return lpto_error(L, who, "the kernel name is empty");
    lkernel *k = lua_newuserdatauv(L, sizeof *k, 0);
    k->lib = lib ? strdup(lib) : NULL;
    k->symbol = strdup(sym);
    luaL_setmetatable(L, LPTO_KERNEL);
    return 1;
}

static int k_tostring(lua_State *L)
{
    lkernel *k = lua_touserdata(L, 1);
    lua_pushfstring(L, "chip_kernel(%s%s%s)", k->symbol, k->lib ? " in " : "", k->lib ? k->lib : "");
    return 1;
}

static int h_tostring(lua_State *L)
{
    lhandle *h = lua_touserdata(L, 1);
    lua_pushfstring(L, "handle(%s %d)", h->kind == LPTO_HANDLE_FUNCTION ? "sub" : "chip", (int)h->callable);
    return 1;
}

void lpto_open_worker(lua_State *L)
{
    luaL_newmetatable(L, LPTO_WORKER);
    static const luaL_Reg wmeta[] = {{"__index", w_index}, {"__gc", w_gc}, {"__close", w_close},
                                     {"__tostring", w_tostring}, {NULL, NULL}};
    luaL_setfuncs(L, wmeta, 0);
    static const luaL_Reg wmethods[] = {
        {"init", w_init}, {"register", w_register}, {"add_worker", lpto_level_add_worker}, {"run", w_run},
        {"close", w_close}, {"stats", w_stats}, {"child_pids", w_child_pids},
        {"stats_report", w_stats_report}, {"print_stats", w_print_stats},
        {"trace_start", lpto_trace_start}, {"trace_stop", lpto_trace_stop}, {NULL, NULL}};
    luaL_newlib(L, wmethods);
    luaL_setfuncs(L, lpto_debug_methods, 0);   /* open_run, hold, step, ... */
    luaL_setfuncs(L, lpto_run_methods, 0);     /* submit, wait_all */
    lua_setfield(L, -2, "methods");
    lua_pop(L, 1);

    luaL_newmetatable(L, LPTO_HANDLE);
    lua_pushcfunction(L, h_tostring);
    lua_setfield(L, -2, "__tostring");
    lua_pop(L, 1);

    luaL_newmetatable(L, LPTO_KERNEL);
    lua_pushcfunction(L, k_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, k_tostring);
    lua_setfield(L, -2, "__tostring");
    lua_pop(L, 1);

    static const luaL_Reg fns[] = {{"Worker", l_worker}, {"chip_kernel", l_chip_kernel}, {"now", l_now}, {NULL, NULL}};
    luaL_setfuncs(L, fns, 0);
}
