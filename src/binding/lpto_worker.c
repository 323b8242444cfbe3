/* lpto_worker.c - pto.Worker: construction, init, register (callable
 * handles, chip kernels), run, close, statistics. The orchestrator a run
 * hands to its function is lpto_orch.c; sub callables are lpto_sub.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lpto_priv.h"

typedef struct lkernel {
    char *lib;                 /* NULL: the Worker's chip runtime */
    char *symbol;
} lkernel;

/* ---- interrupts ---------------------------------------------------------------- */

#define MAX_ACTIVE 64
static pto_worker *_Atomic active[MAX_ACTIVE];

void lpto_active_add(pto_worker *w)
{
    for (int i = 0; i < MAX_ACTIVE; i++) {
        pto_worker *none = NULL;
        if (atomic_compare_exchange_strong(&active[i], &none, w)) return;
    }
}

void lpto_active_remove(pto_worker *w)
{
    for (int i = 0; i < MAX_ACTIVE; i++) {
        pto_worker *me = w;
        if (atomic_compare_exchange_strong(&active[i], &me, NULL)) return;
    }
}

int lpto_wait_run(lworker *W, pto_orch *o)
{
    lpto_active_add(W->w);
    lpto_gil_release(W->gil);
    int rc = o ? pto_drain(o) : pto_run_end(W->w);
    lpto_gil_acquire(W->gil);
    lpto_active_remove(W->w);
    return rc;
}

void lpto_interrupt_all(void)
{
    for (int i = 0; i < MAX_ACTIVE; i++) {
        pto_worker *w = atomic_load(&active[i]);
        if (w) pto_worker_interrupt(w);
    }
}

/* ---- helpers --------------------------------------------------------------------- */

lworker *lpto_check_worker(lua_State *L, int idx, const char *who)
{
    lworker *W = luaL_testudata(L, idx, LPTO_WORKER);
    if (!W) lpto_error(L, who, "expected a Worker (call it as w:%s(...)), got %s", strchr(who, ':') ? strchr(who, ':') + 1 : who,
                       luaL_typename(L, idx));
    if (W->state == W_CLOSED) lpto_error(L, who, "this Worker is closed; create a new one with pto.Worker{...}");
    return W;
}

bool lpto_get_int_field(lua_State *L, int t, const char *k, lua_Integer *out, lua_Integer lo, lua_Integer hi,
                        const char *who)
{
    lua_getfield(L, t, k);
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        return false;
    }
    int isint;
    lua_Integer v = lua_tointegerx(L, -1, &isint);
    if (!isint) lpto_error(L, who, "%s must be an integer (got %s)", k, luaL_typename(L, -1));
    if (v < lo || v > hi) lpto_error(L, who, "%s must be between %lld and %lld (got %lld)", k, (long long)lo, (long long)hi, (long long)v);
    lua_pop(L, 1);
    *out = v;
    return true;
}

void lpto_check_fields(lua_State *L, int t, const char *const *known, const char *list, const char *who)
{
    lua_pushnil(L);
    while (lua_next(L, t)) {
        bool ok = false;
        if (lua_type(L, -2) == LUA_TSTRING)
            for (int i = 0; known[i]; i++) ok |= strcmp(lua_tostring(L, -2), known[i]) == 0;
        if (!ok) lpto_error(L, who, "unknown field '%s' (fields: %s)", luaL_tolstring(L, -2, NULL), list);
        lua_pop(L, 1);
    }
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

static const char *const WORKER_FIELDS[] = {"level", "mode", "chips", "num_sub_workers", "heap_ring_size",
                                            "alloc_timeout_ms", "chip_runtime", "queue_depth", "start_timeout_ms", "shm_size", NULL};

static int l_worker(lua_State *L)
{
    const char *who = "pto.Worker";
    if (!lua_isnoneornil(L, 1) && !lua_istable(L, 1))
        return lpto_error(L, who, "expected a table like pto.Worker{chips = 2} (got %s)", luaL_typename(L, 1));
    if (lua_isnoneornil(L, 1)) {
        lua_settop(L, 0);
        lua_newtable(L);
    }
    lpto_check_fields(L, 1, WORKER_FIELDS,
                 "level, mode, chips, num_sub_workers, heap_ring_size, alloc_timeout_ms, chip_runtime, queue_depth, "
                 "start_timeout_ms, shm_size", who);
    lua_Integer level = 3, chips = 0, subs = 0, heap = 0, timeout = 0, depth = 0, start_timeout = 0, shm = 0;
    lpto_get_int_field(L, 1, "level", &level, 3, 64, who);
    lpto_get_int_field(L, 1, "chips", &chips, 0, 1024, who);
    lpto_get_int_field(L, 1, "num_sub_workers", &subs, 0, 1024, who);
    lpto_get_int_field(L, 1, "heap_ring_size", &heap, PTO_HEAP_ALIGN, (lua_Integer)1 << 46, who);
    lpto_get_int_field(L, 1, "alloc_timeout_ms", &timeout, 1, 24 * 3600 * 1000, who);
    lpto_get_int_field(L, 1, "queue_depth", &depth, 1, 64, who);
    lpto_get_int_field(L, 1, "start_timeout_ms", &start_timeout, 1, 24 * 3600 * 1000, who);
    lpto_get_int_field(L, 1, "shm_size", &shm, 16 << 20, (lua_Integer)1 << 50, who);
    if (level >= 4 && chips > 0)
        return lpto_error(L, who, "chips = %lld: a level-%lld Worker has no chips; its next-level children are "
                                  "level-%lld Workers added with Worker:add_worker (give the chips to those)",
                          (long long)chips, (long long)level, (long long)level - 1);
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
    lua_getfield(L, 1, "chip_runtime");
    if (!lua_isnil(L, -1) && lua_type(L, -1) != LUA_TSTRING)
        return lpto_error(L, who, "chip_runtime must be the path of a chip runtime library (got %s)", luaL_typename(L, -1));
    const char *rt = lua_tostring(L, -1);

    pto_worker_config cfg = {.level = (int32_t)level, .mode = mode, .heap_ring_size = (uint64_t)heap,
                             .alloc_timeout_ms = (uint32_t)timeout, .queue_depth = (int32_t)depth,
                             .start_timeout_ms = (uint32_t)start_timeout};
    pto_worker *w = pto_worker_new(&cfg);
    if (!w) return lpto_engine_error(L);
    lworker *W = lua_newuserdatauv(L, sizeof *W, UV_COUNT);
    memset(W, 0, sizeof *W);
    W->w = w;
    W->owner = getpid();
    W->shm_size = (uint64_t)shm;
    W->level = (int)level;
    W->mode = mode;
    W->nchips = (int)chips;
    W->nsubs = (int)subs;
    W->chip_runtime = rt ? strdup(rt) : NULL;
    W->gil = lpto_gil_of(L);
    W->fns_ref = LUA_NOREF;
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
    lpto_debug_track(L, -1);
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

static int w_close(lua_State *L)
{
    lworker *W = luaL_testudata(L, 1, LPTO_WORKER);
    if (!W) return lpto_error(L, "Worker:close", "expected a Worker (call it as w:close()), got %s", luaL_typename(L, 1));
    if (W->state == W_CLOSED) return 0;
    if (W->in_run && !W->interactive)
        return lpto_error(L, "Worker:close", "a run is in progress; close the Worker after Worker:run returns");
    if (W->interactive) {   /* an open_run left open: its tasks are dropped with the Worker */
        lua_getiuservalue(L, 1, UV_ORCH);
        lpto_orch_end(L, -1);
        lua_pop(L, 1);
        W->in_run = W->interactive = false;
    }
    if (W->parent && !W->driven)
        return lpto_error(L, "Worker:close", "this Worker is a child of a level-%d Worker; closing that Worker closes it",
                          W->parent->level);
    lpto_worker_free(L, W);
    return 0;
}

static int w_gc(lua_State *L)
{
    lworker *W = lua_touserdata(L, 1);
    /* A Worker child is closed by its parent, which may still be running it. */
    if ((!W->in_run || W->interactive) && !W->parent) lpto_worker_free(L, W);
    return 0;
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

    W->chip_names = calloc((size_t)W->nchips + 1, sizeof *W->chip_names);
    W->subs = calloc((size_t)W->nsubs + 1, sizeof *W->subs);
    if (!W->chip_names || !W->subs) luaL_error(L, "%s: out of memory", who);
    for (int i = 0; i < W->nchips; i++) {
        pto_leaf leaf = pto_chip_leaf();
        snprintf(W->chip_names[i], sizeof W->chip_names[i], "chip %d", i + 1);
        leaf.name = W->chip_names[i];
        leaf.ctx = W->chip_runtime;   /* the child dlopens this runtime (NULL: the built-in one) */
        if (pto_worker_add_next_level(W->w, &leaf) < 0) lpto_engine_error(L);
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
        if (pto_worker_add_sub(W->w, &leaf) < 0) lpto_engine_error(L);
    }
    lua_pop(L, 1);
    if (W->level >= 4) lpto_level_init(L, idx, W, who);
    if (pto_worker_init(W->w) != 0) lpto_engine_error(L);
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

/* w:register(fn [, name]) or w:register(pto.chip_kernel(...)) -> handle */
static int w_register(lua_State *L)
{
    const char *who = "Worker:register";
    lworker *W = lpto_check_worker(L, 1, who);
    lkernel *k = luaL_testudata(L, 2, LPTO_KERNEL);
    if (!lua_isnoneornil(L, 3) && lua_type(L, 3) != LUA_TSTRING)
        return lpto_error(L, who, "the optional name must be a string (got %s)", luaL_typename(L, 3));
    const char *name = lua_tostring(L, 3);
    lhandle *h;
    if (k && W->level >= 4)
        return lpto_error(L, who, "a level-%d Worker has no chips: register chip kernels on the level-3 Workers "
                                  "that run them, and submit those handles from their orchestration function",
                          W->level);
    if (k) {
        int64_t id = pto_kernel_register(k->lib ? k->lib : W->chip_runtime, k->symbol);
        if (id < 0) return lpto_engine_error_as(L, who);
        pto_worker_callable_name_set(W->w, PTO_NEXT_LEVEL, (uint64_t)id, name ? name : k->symbol);
        if (W->mode == PTO_MODE_PROCESS && W->state == W_READY) {
            /* children forked before this kernel resolve it themselves: "lib\0symbol\0" */
            const char *lib = k->lib ? k->lib : W->chip_runtime ? W->chip_runtime : "";
            size_t ll = strlen(lib), sl = strlen(k->symbol);
            luaL_Buffer b;
            luaL_buffinit(L, &b);
            luaL_addlstring(&b, lib, ll + 1);
            luaL_addlstring(&b, k->symbol, sl + 1);
            luaL_pushresult(&b);
            if (pto_worker_ship_callable(W->w, PTO_NEXT_LEVEL, (uint64_t)id, lua_tostring(L, -1), ll + sl + 2) != 0)
                return lpto_engine_error_as(L, who);
            lua_pop(L, 1);
        }
        h = lua_newuserdatauv(L, sizeof *h, 1);
        *h = (lhandle){H_CHIP, (uint64_t)id};
    } else if (lua_isfunction(L, 2)) {
        /* Children forked at init cannot see a function registered later;
         * at level >= 4 a function may run on a sub or on a Worker child. */
        bool ship = W->mode == PTO_MODE_PROCESS && W->state == W_READY && (W->nsubs > 0 || W->nworkers > 0);
        if (ship) lpto_ship_function(L, 2, who);
        uint64_t id = ++W->next_fn;
        if (ship) {
            size_t len;
            const char *blob = lua_tolstring(L, -1, &len);
            if (W->nsubs > 0 && pto_worker_ship_callable(W->w, PTO_SUB, id, blob, len) != 0)
                return lpto_engine_error_as(L, who);
            if (W->nworkers > 0 && pto_worker_ship_callable(W->w, PTO_NEXT_LEVEL, id, blob, len) != 0)
                return lpto_engine_error_as(L, who);
            lua_pop(L, 1);
        }
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
        h = lua_newuserdatauv(L, sizeof *h, 1);
        *h = (lhandle){H_SUB, id};
    } else {
        return lpto_error(L, who, "expected a Lua function (a sub callable) or pto.chip_kernel(...) (got %s)",
                          luaL_typename(L, 2));
    }
    lua_pushvalue(L, 1);
    lua_setiuservalue(L, -2, 1);
    luaL_setmetatable(L, LPTO_HANDLE);
    lua_getiuservalue(L, 1, UV_HANDLES);   /* for Worker:callables (the REPL's :break by name) */
    lua_pushvalue(L, -2);
    lua_rawseti(L, -2, (lua_Integer)lua_rawlen(L, -2) + 1);
    lua_pop(L, 1);
    return 1;
}

/* w:run(fn, args, cfg) */
int lpto_worker_run(lua_State *L)
{
    const char *who = "Worker:run";
    lworker *W = lpto_check_worker(L, 1, who);
    if (W->parent && !W->driven)
        return lpto_error(L, who, "this Worker is a child of a level-%d Worker, which runs it: submit an orchestration "
                                  "function to that Worker with orch:submit_next_level", W->parent->level);
    if (W->interactive)
        return lpto_error(L, who, "a run opened by Worker:open_run is open on this Worker; submit to its "
                                  "orchestrator, or end it with Worker:close_run (:finish at the prompt) first");
    if (W->in_run) return lpto_error(L, who, "a run of this Worker is already in progress (runs do not nest)");
    if (!lua_isfunction(L, 2))
        return lpto_error(L, who, "expected the function to run, fn(orch, args, cfg), as argument 1 (got %s)",
                          luaL_typename(L, 2));
    lua_settop(L, 4);
    lpto_worker_init(L, 1, W, who);
    pto_orch *o = pto_run_begin(W->w);
    if (!o) return lpto_engine_error(L);
    W->in_run = true;
    lpto_active_add(W->w);
    lpto_push_orch(L, 1, W, o);   /* 5 */
    lua_pushvalue(L, 5);
    lua_setiuservalue(L, 1, UV_ORCH);

    int base = lua_gettop(L);
    lua_pushvalue(L, 2);
    lua_pushvalue(L, 5);
    lua_pushvalue(L, 3);
    lua_pushvalue(L, 4);
    int status = lua_pcall(L, 3, LUA_MULTRET, 0);
    int nres = lua_gettop(L) - base;

    lpto_gil_release(W->gil);   /* THREAD-mode subs still run while the run drains */
    int rc = pto_run_end(W->w);
    lpto_gil_acquire(W->gil);
    char *fail = rc != 0 ? strdup(pto_errmsg()) : NULL;
    lpto_active_remove(W->w);
    W->in_run = false;
    lpto_orch_end(L, 5);   /* heap-ring tensors of this run die with it */
    lua_pushnil(L);
    lua_setiuservalue(L, 1, UV_ORCH);

    if (status != LUA_OK) {
        free(fail);
        return lua_error(L);   /* the function's own error, unchanged */
    }
    if (fail) {
        /* In a tree of Workers each level's failure names its level:
         * "Worker:run: L4 task 0 (... on L3 worker 1 (pid 7)) failed: L3 task 2 ...". */
        const char *pfx = "Worker:run: ";
        if ((W->level >= 4 || W->parent) && strncmp(fail, pfx, strlen(pfx)) == 0)
            lua_pushfstring(L, "%sL%d %s", pfx, W->level, fail + strlen(pfx));
        else
            lua_pushstring(L, fail);
        free(fail);
        return lua_error(L);
    }
    return nres;
}

int lpto_worker_stats(lua_State *L)
{
    lworker *W = lpto_check_worker(L, 1, "Worker:stats");
    pto_stats s;
    pto_worker_stats_get(W->w, &s);
    lua_createtable(L, 0, 16);
#define F(name) (lua_pushinteger(L, (lua_Integer)s.name), lua_setfield(L, -2, #name))
    F(tasks_submitted); F(tasks_completed); F(tasks_failed); F(allocs); F(runs); F(tasks_live_hwm);
    F(ready_hwm); F(tensormap_hwm); F(tensormap_live); F(tasks_live);
#undef F
    lua_createtable(L, PTO_MAX_RING_DEPTH, 0);
    for (int r = 0; r < PTO_MAX_RING_DEPTH; r++) {
        pto_ring_stats *q = &s.rings[r];
        lua_createtable(L, 0, 7);
#define F(name) (lua_pushinteger(L, (lua_Integer)q->name), lua_setfield(L, -2, #name))
        F(stalls); F(hwm_bytes); F(capacity_bytes); F(used_bytes); F(live_slabs);
#undef F
        lua_pushnumber(L, (double)q->stall_ns / 1e6);
        lua_setfield(L, -2, "stall_ms");
        lua_pushinteger(L, r);
        lua_setfield(L, -2, "ring");
        lua_rawseti(L, -2, r + 1);
    }
    lua_setfield(L, -2, "rings");
    lua_pushinteger(L, W->nchips);
    lua_setfield(L, -2, "chips");
    lua_pushinteger(L, W->nsubs);
    lua_setfield(L, -2, "sub_workers");
    lua_pushinteger(L, W->level);
    lua_setfield(L, -2, "level");
    if (W->level >= 4) {
        lua_pushinteger(L, W->nworkers);
        lua_setfield(L, -2, "workers");
        lpto_level_stats(L, W);
    }
    return 1;
}

/* w:child_pids() -> {chips = {pid, ...}, subs = {pid, ...}}: the processes
 * serving each worker now (empty in THREAD mode); for tests and tools. */
static int w_child_pids(lua_State *L)
{
    lworker *W = lpto_check_worker(L, 1, "Worker:child_pids");
    lua_createtable(L, 0, 2);
    int counts[2] = {W->nchips, W->nsubs};
    const char *names[2] = {"chips", "subs"};
    for (int kind = 0; kind < 2; kind++) {
        lua_createtable(L, counts[kind], 0);
        for (int i = 0; W->state == W_READY && i < counts[kind]; i++) {
            int pid = pto_worker_child_pid(W->w, kind, i);
            if (pid <= 0) continue;
            lua_pushinteger(L, pid);
            lua_rawseti(L, -2, i + 1);
        }
        lua_setfield(L, -2, names[kind]);
    }
    if (W->level >= 4) {
        lpto_level_pids(L, W);
        lua_setfield(L, -2, "workers");
    }
    return 1;
}

int lpto_worker_stats_report(lua_State *L)
{
    lworker *W = lpto_check_worker(L, 1, "Worker:stats_report");
    int n = pto_worker_format_stats(W->w, NULL, 0);
    luaL_Buffer b;
    char *p = luaL_buffinitsize(L, &b, (size_t)n + 1);
    pto_worker_format_stats(W->w, p, (size_t)n + 1);
    luaL_addsize(&b, (size_t)n);
    if (W->level >= 4) lpto_level_report(L, W, &b);
    luaL_pushresult(&b);
    return 1;
}

static int w_print_stats(lua_State *L)
{
    lpto_check_worker(L, 1, "Worker:print_stats");
    lpto_worker_stats_report(L);
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
        static const char *const known[] = {"lib", "symbol", NULL};
        lpto_check_fields(L, 1, known, "lib, symbol", who);
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

const lhandle *lpto_check_handle(lua_State *L, int idx, lworker *W, const char *who)
{
    lhandle *h = luaL_testudata(L, idx, LPTO_HANDLE);
    if (!h)
        lpto_error(L, who, "argument %d must be a handle returned by Worker:register (got %s); register the function "
                           "or pto.chip_kernel first",
                   idx - 1, luaL_typename(L, idx));
    lua_getiuservalue(L, idx, 1);
    bool mine = lua_touserdata(L, -1) == W;
    lua_pop(L, 1);
    if (!mine) lpto_error(L, who, "this handle was registered on another Worker; register it on this one");
    return h;
}

static int h_tostring(lua_State *L)
{
    lhandle *h = lua_touserdata(L, 1);
    lua_pushfstring(L, "handle(%s %d)", h->kind == H_SUB ? "sub" : "chip", (int)h->callable);
    return 1;
}

static int l_extend_worker(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    luaL_getmetatable(L, LPTO_WORKER);
    lua_getfield(L, -1, "methods");
    lua_pushnil(L);
    while (lua_next(L, 1)) {
        lua_pushvalue(L, -2);
        lua_insert(L, -2);
        lua_rawset(L, -4);
    }
    return 0;
}

void lpto_open_worker(lua_State *L)
{
    luaL_newmetatable(L, LPTO_WORKER);
    static const luaL_Reg wmeta[] = {{"__index", w_index}, {"__gc", w_gc}, {"__close", w_close},
                                     {"__tostring", w_tostring}, {NULL, NULL}};
    luaL_setfuncs(L, wmeta, 0);
    static const luaL_Reg wmethods[] = {
        {"init", w_init}, {"register", w_register}, {"add_worker", lpto_level_add_worker}, {"run", lpto_worker_run},
        {"close", w_close}, {"stats", lpto_worker_stats}, {"child_pids", w_child_pids},
        {"stats_report", lpto_worker_stats_report}, {"print_stats", w_print_stats},
        {NULL, NULL}};
    luaL_newlib(L, wmethods);
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

    static const luaL_Reg fns[] = {{"Worker", l_worker}, {"chip_kernel", l_chip_kernel},
                                   {"_extend_worker", l_extend_worker}, {NULL, NULL}};
    luaL_setfuncs(L, fns, 0);
    lpto_open_orch(L);
}
