/* lpto_worker.c - pto.Worker, callable handles, chip kernels, the
 * Orchestrator and its scopes, and sub callables in THREAD mode. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lpto_priv.h"

enum { W_NEW, W_READY, W_CLOSED };
enum { H_SUB, H_CHIP };
/* Worker user values. */
enum { UV_FNS = 1, UV_THREADS, UV_ORCH, UV_COUNT = UV_ORCH };
/* Orchestrator user values. */
enum { OUV_WORKER = 1, OUV_SCOPES, OUV_PINS, OUV_COUNT = OUV_PINS };

typedef struct lworker lworker;

typedef struct sub_ctx {
    lworker *W;
    lua_State *T;      /* this sub's Lua thread, anchored in UV_THREADS */
    int index;
    char name[24];
} sub_ctx;

struct lworker {
    pto_worker *w;
    int state;
    bool in_run;
    int level, mode, nchips, nsubs, queue_depth;
    uint64_t heap_ring_size;
    uint32_t alloc_timeout_ms;
    char *chip_runtime;        /* NULL: the built-in simulated chip */
    sub_ctx *subs;
    char (*chip_names)[24];
    lpto_gil *gil;
    int fns_ref;               /* registry ref of the UV_FNS table, for sub threads */
    uint64_t next_fn;
    pto_tensor *scratch;       /* submit's tensor descriptors */
    int32_t scratch_cap;
};

typedef struct lorch {
    lworker *W;
    pto_orch *o;
    bool valid;
    pthread_t thread;          /* the thread running the run's function: the engine's orchestrator is single-threaded */
} lorch;

typedef struct lhandle {
    int kind;
    uint64_t callable;
} lhandle;

typedef struct lkernel {
    char *lib;                 /* NULL: the Worker's chip runtime */
    char *symbol;
} lkernel;

typedef struct lscope {
    lorch *O;
    int depth;                 /* depth this scope opened; 0 once closed */
} lscope;

/* ---- interrupts ---------------------------------------------------------------- */

#define MAX_ACTIVE 64
static pto_worker *_Atomic active[MAX_ACTIVE];

static void active_add(pto_worker *w)
{
    for (int i = 0; i < MAX_ACTIVE; i++) {
        pto_worker *none = NULL;
        if (atomic_compare_exchange_strong(&active[i], &none, w)) return;
    }
}

static void active_remove(pto_worker *w)
{
    for (int i = 0; i < MAX_ACTIVE; i++) {
        pto_worker *me = w;
        if (atomic_compare_exchange_strong(&active[i], &me, NULL)) return;
    }
}

void lpto_interrupt_all(void)
{
    for (int i = 0; i < MAX_ACTIVE; i++) {
        pto_worker *w = atomic_load(&active[i]);
        if (w) pto_worker_interrupt(w);
    }
}

/* ---- helpers --------------------------------------------------------------------- */

static lworker *check_worker(lua_State *L, int idx, const char *who)
{
    lworker *W = luaL_testudata(L, idx, LPTO_WORKER);
    if (!W) lpto_error(L, who, "expected a Worker (call it as w:%s(...)), got %s", strchr(who, ':') ? strchr(who, ':') + 1 : who,
                       luaL_typename(L, idx));
    if (W->state == W_CLOSED) lpto_error(L, who, "this Worker is closed; create a new one with pto.Worker{...}");
    return W;
}

static lorch *check_orch(lua_State *L, int idx, const char *who)
{
    lorch *O = luaL_testudata(L, idx, LPTO_ORCH);
    if (!O) lpto_error(L, who, "expected the orchestrator given to the run function (call it as orch:...), got %s",
                       luaL_typename(L, idx));
    if (!O->valid)
        lpto_error(L, who, "this orchestrator's run has ended; an orchestrator is valid only inside the function "
                           "given to Worker:run, while that run lasts");
    if (!pthread_equal(O->thread, pthread_self()))
        lpto_error(L, who, "the orchestrator can be used only by the function given to Worker:run, not from a sub "
                           "callable; return results through the sub's tensors and submit from that function");
    return O;
}

static bool get_int_field(lua_State *L, int t, const char *k, lua_Integer *out, lua_Integer lo, lua_Integer hi,
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

static void check_fields(lua_State *L, int t, const char *const *known, const char *list, const char *who)
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
                                            "alloc_timeout_ms", "chip_runtime", "queue_depth", "start_timeout_ms", NULL};

static int l_worker(lua_State *L)
{
    const char *who = "pto.Worker";
    if (!lua_isnoneornil(L, 1) && !lua_istable(L, 1))
        return lpto_error(L, who, "expected a table like pto.Worker{chips = 2} (got %s)", luaL_typename(L, 1));
    if (lua_isnoneornil(L, 1)) {
        lua_settop(L, 0);
        lua_newtable(L);
    }
    check_fields(L, 1, WORKER_FIELDS,
                 "level, mode, chips, num_sub_workers, heap_ring_size, alloc_timeout_ms, chip_runtime, queue_depth, "
                 "start_timeout_ms", who);
    lua_Integer level = 3, chips = 0, subs = 0, heap = 0, timeout = 0, depth = 0, start_timeout = 0;
    get_int_field(L, 1, "level", &level, 3, 64, who);
    get_int_field(L, 1, "chips", &chips, 0, 1024, who);
    get_int_field(L, 1, "num_sub_workers", &subs, 0, 1024, who);
    get_int_field(L, 1, "heap_ring_size", &heap, PTO_HEAP_ALIGN, (lua_Integer)1 << 46, who);
    get_int_field(L, 1, "alloc_timeout_ms", &timeout, 1, 24 * 3600 * 1000, who);
    get_int_field(L, 1, "queue_depth", &depth, 1, 64, who);
    get_int_field(L, 1, "start_timeout_ms", &start_timeout, 1, 24 * 3600 * 1000, who);
    if (level >= 4)
        return lpto_error(L, who, "level %lld: Workers of Workers (level 4 and above) are not available yet; use level = 3",
                          (long long)level);
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
    return 1;
}

static void worker_free(lua_State *L, lworker *W)
{
    if (W->state == W_CLOSED) return;
    pto_worker_close(W->w);
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
    if (W->in_run) return lpto_error(L, "Worker:close", "a run is in progress; close the Worker after Worker:run returns");
    worker_free(L, W);
    return 0;
}

static int w_gc(lua_State *L)
{
    lworker *W = lua_touserdata(L, 1);
    if (!W->in_run) worker_free(L, W);
    return 0;
}

/* A sub callable: fn(args) with a TaskArgs over the task's arguments. In
 * THREAD mode it runs on the sub's worker thread, holding the interpreter
 * lock for the call. */
static int run_sub(void *ctx, uint64_t callable, const pto_args_view *args, const pto_call_config *cfg, char *err,
                   size_t errlen)
{
    (void)cfg;
    sub_ctx *S = ctx;
    lworker *W = S->W;
    lua_State *T = S->T;
    int rc = 0;
    lua_settop(T, 0);
    lua_getglobal(T, "debug");
    lua_getfield(T, -1, "traceback");
    lua_remove(T, -2);
    lua_rawgeti(T, LUA_REGISTRYINDEX, W->fns_ref);
    lua_rawgeti(T, -1, (lua_Integer)callable);
    lua_remove(T, -2);
    if (!lua_isfunction(T, -1)) {
        snprintf(err, errlen, "callable %llu is not a sub function registered on this Worker", (unsigned long long)callable);
        rc = 1;
    } else {
        lpto_storage *st = lpto_push_storage(T, 0, 0, LPTO_ST_BORROWED);
        st->why_invalid = "tensors in a sub callable's arguments are valid only during that call; copy what you "
                          "need to keep";
        lpto_push_args_view(T, args, -1);
        lua_remove(T, -2);
        if (lua_pcall(T, 1, 0, 1) != LUA_OK) {
            const char *m = lua_tostring(T, -1);
            snprintf(err, errlen, "%s", m ? m : "(error object is not a string)");
            rc = 1;
        }
        st->valid = false;
    }
    lua_settop(T, 0);
    return rc;
}

static int sub_leaf(void *ctx, uint64_t callable, const pto_args_view *args, const pto_call_config *cfg, char *err,
                    size_t errlen)
{
    lpto_gil *g = ((sub_ctx *)ctx)->W->gil;
    lpto_gil_acquire(g);
    int rc = run_sub(ctx, callable, args, cfg, err, errlen);
    lpto_gil_release(g);
    return rc;
}


/* The same in PROCESS mode, inside the sub's forked child: the child has
 * its own copy of the Lua state and one thread, so no lock. */
static int sub_leaf_child(void *ctx, uint64_t callable, const pto_args_view *args, const pto_call_config *cfg,
                          char *err, size_t errlen)
{
    return run_sub(ctx, callable, args, cfg, err, errlen);
}

/* ---- shipping functions to children forked before they were registered ----
 * Format: "PTOF" | u32 code length | code (lua_dump, with debug info) |
 * u32 upvalue count | per upvalue: u8 kind, then i64 / f64 / u32 len + bytes.
 * Only plain values travel; _ENV becomes the child's globals. */
enum { UP_NIL, UP_FALSE, UP_TRUE, UP_INT, UP_FLOAT, UP_STRING, UP_ENV };

/* The buffer starts inside the writer, as string.dump does: luaL_buffinit
 * pushes a placeholder, and lua_dump must find the function on top. */
typedef struct dump_state {
    bool started;
    luaL_Buffer b;
} dump_state;

static int dump_writer(lua_State *L, const void *p, size_t sz, void *ud)
{
    dump_state *d = ud;
    if (!d->started) {
        d->started = true;
        luaL_buffinit(L, &d->b);
    }
    luaL_addlstring(&d->b, p, sz);
    return 0;
}

static void put_bytes(luaL_Buffer *b, const void *p, size_t n) { luaL_addlstring(b, (const char *)p, n); }

/* Push the shipped form of the function at idx, or raise saying what cannot travel. */
static void ship_function(lua_State *L, int idx, const char *who)
{
    idx = lua_absindex(L, idx);
    if (lua_iscfunction(L, idx))
        lpto_error(L, who, "a C function cannot be shipped to sub workers forked before it was registered; "
                           "register it before Worker:init, or wrap it in a Lua function registered before init");
    /* Check the upvalues before building anything. */
    int n = 0;
    for (const char *name; (name = lua_getupvalue(L, idx, n + 1)) != NULL; n++) {
        int t = lua_type(L, -1);
        lua_pop(L, 1);
        if (strcmp(name, "_ENV") == 0 || t == LUA_TNIL || t == LUA_TBOOLEAN || t == LUA_TNUMBER || t == LUA_TSTRING)
            continue;
        lpto_error(L, who, "this function is registered after Worker:init, so it must be shipped to the sub workers "
                           "forked before it existed, but its upvalue '%s' is a %s; only nil, booleans, numbers and "
                           "strings can be shipped: register it before init, or pass the value in the task's args",
                   name, lua_typename(L, t));
    }
    dump_state code = {0};
    lua_pushvalue(L, idx);
    if (lua_dump(L, dump_writer, &code, 0) != 0 || !code.started)
        lpto_error(L, who, "cannot dump this function to ship it to the sub workers; register it before Worker:init");
    luaL_pushresult(&code.b);
    lua_remove(L, -2);
    size_t clen;
    const char *c = lua_tolstring(L, -1, &clen);
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    luaL_addstring(&b, "PTOF");
    uint32_t u = (uint32_t)clen;
    put_bytes(&b, &u, 4);
    luaL_addlstring(&b, c, clen);
    u = (uint32_t)n;
    put_bytes(&b, &u, 4);
    for (int i = 1; i <= n; i++) {
        const char *name = lua_getupvalue(L, idx, i);
        uint8_t kind;
        switch (lua_type(L, -1)) {
        case LUA_TNIL: kind = UP_NIL; break;
        case LUA_TBOOLEAN: kind = lua_toboolean(L, -1) ? UP_TRUE : UP_FALSE; break;
        case LUA_TNUMBER: kind = lua_isinteger(L, -1) ? UP_INT : UP_FLOAT; break;
        case LUA_TSTRING: kind = UP_STRING; break;
        default: kind = UP_ENV; break;
        }
        if (strcmp(name, "_ENV") == 0) kind = UP_ENV;
        put_bytes(&b, &kind, 1);
        if (kind == UP_INT) {
            lua_Integer v = lua_tointeger(L, -1);
            put_bytes(&b, &v, 8);
        } else if (kind == UP_FLOAT) {
            lua_Number v = lua_tonumber(L, -1);
            put_bytes(&b, &v, 8);
        } else if (kind == UP_STRING) {
            size_t len;
            const char *s = lua_tolstring(L, -1, &len);
            u = (uint32_t)len;
            put_bytes(&b, &u, 4);
            luaL_addlstring(&b, s, len);
        }
        lua_pop(L, 1);
    }
    luaL_pushresult(&b);
    lua_remove(L, -2);
}

static bool take(const char **p, const char *end, void *out, size_t n)
{
    if ((size_t)(end - *p) < n) return false;
    memcpy(out, *p, n);
    *p += n;
    return true;
}

/* In the child: install a shipped function as callable (the blob is
 * untrusted bytes as far as the child knows: check every length). */
static int sub_load_child(void *ctx, uint64_t callable, const void *blob, size_t len, char *err, size_t errlen)
{
    sub_ctx *S = ctx;
    lua_State *T = S->T;
    const char *p = blob, *end = p + len;
    uint32_t clen, n;
    char magic[4];
    lua_settop(T, 0);
    if (!take(&p, end, magic, 4) || memcmp(magic, "PTOF", 4) || !take(&p, end, &clen, 4) || (size_t)(end - p) < clen)
        goto bad;
    if (luaL_loadbufferx(T, p, clen, "=shipped", "b") != LUA_OK) {
        snprintf(err, errlen, "shipped function %llu does not load: %s", (unsigned long long)callable, lua_tostring(T, -1));
        lua_settop(T, 0);
        return 1;
    }
    p += clen;
    if (!take(&p, end, &n, 4)) goto bad;
    for (uint32_t i = 1; i <= n; i++) {
        uint8_t kind;
        if (!take(&p, end, &kind, 1)) goto bad;
        if (kind == UP_NIL) lua_pushnil(T);
        else if (kind == UP_FALSE || kind == UP_TRUE) lua_pushboolean(T, kind == UP_TRUE);
        else if (kind == UP_INT) {
            lua_Integer v;
            if (!take(&p, end, &v, 8)) goto bad;
            lua_pushinteger(T, v);
        } else if (kind == UP_FLOAT) {
            lua_Number v;
            if (!take(&p, end, &v, 8)) goto bad;
            lua_pushnumber(T, v);
        } else if (kind == UP_STRING) {
            uint32_t sl;
            if (!take(&p, end, &sl, 4) || (size_t)(end - p) < sl) goto bad;
            lua_pushlstring(T, p, sl);
            p += sl;
        } else if (kind == UP_ENV) {
            lua_rawgeti(T, LUA_REGISTRYINDEX, LUA_RIDX_GLOBALS);
        } else {
            goto bad;
        }
        if (!lua_setupvalue(T, 1, (int)i)) lua_pop(T, 1);
    }
    lua_rawgeti(T, LUA_REGISTRYINDEX, S->W->fns_ref);
    lua_pushvalue(T, 1);
    lua_rawseti(T, -2, (lua_Integer)callable);
    lua_settop(T, 0);
    return 0;
bad:
    lua_settop(T, 0);
    snprintf(err, errlen, "shipped function %llu is malformed", (unsigned long long)callable);
    return 1;
}

static void worker_init(lua_State *L, int idx, lworker *W, const char *who)
{
    if (W->state != W_NEW) return;
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
        S->index = i;
        snprintf(S->name, sizeof S->name, "sub %d", i + 1);
        S->T = lua_newthread(L);
        lua_rawseti(L, -2, i + 1);
        pto_leaf leaf = {.run = sub_leaf, .ctx = S, .name = S->name};
        if (W->mode == PTO_MODE_PROCESS) {
            leaf.run = sub_leaf_child;
            leaf.load = sub_load_child;
        }
        if (pto_worker_add_sub(W->w, &leaf) < 0) lpto_engine_error(L);
    }
    lua_pop(L, 1);
    if (pto_worker_init(W->w) != 0) lpto_engine_error(L);
    W->state = W_READY;
}

static int w_init(lua_State *L)
{
    lworker *W = check_worker(L, 1, "Worker:init");
    if (W->state == W_READY) return lpto_error(L, "Worker:init", "this Worker is already initialised; call init once "
                                                          "(Worker:run initialises a new Worker itself)");
    worker_init(L, 1, W, "Worker:init");
    lua_settop(L, 1);
    return 1;
}

/* w:register(fn [, name]) or w:register(pto.chip_kernel(...)) -> handle */
static int w_register(lua_State *L)
{
    const char *who = "Worker:register";
    lworker *W = check_worker(L, 1, who);
    lkernel *k = luaL_testudata(L, 2, LPTO_KERNEL);
    if (!lua_isnoneornil(L, 3) && lua_type(L, 3) != LUA_TSTRING)
        return lpto_error(L, who, "the optional name must be a string (got %s)", luaL_typename(L, 3));
    const char *name = lua_tostring(L, 3);
    lhandle *h;
    if (k) {
        int64_t id = pto_kernel_register(k->lib ? k->lib : W->chip_runtime, k->symbol);
        if (id < 0) return lpto_engine_error_as(L, who);
        pto_worker_name_callable(W->w, PTO_NEXT_LEVEL, (uint64_t)id, name ? name : k->symbol);
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
        /* Children forked at init cannot see a function registered later. */
        bool ship = W->mode == PTO_MODE_PROCESS && W->state == W_READY && W->nsubs > 0;
        if (ship) ship_function(L, 2, who);
        uint64_t id = ++W->next_fn;
        if (ship) {
            size_t len;
            const char *blob = lua_tolstring(L, -1, &len);
            if (pto_worker_ship_callable(W->w, PTO_SUB, id, blob, len) != 0) return lpto_engine_error_as(L, who);
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
        pto_worker_name_callable(W->w, PTO_SUB, id, name);
        h = lua_newuserdatauv(L, sizeof *h, 1);
        *h = (lhandle){H_SUB, id};
    } else {
        return lpto_error(L, who, "expected a Lua function (a sub callable) or pto.chip_kernel(...) (got %s)",
                          luaL_typename(L, 2));
    }
    lua_pushvalue(L, 1);
    lua_setiuservalue(L, -2, 1);
    luaL_setmetatable(L, LPTO_HANDLE);
    return 1;
}

static int w_add_worker(lua_State *L)
{
    lworker *W = check_worker(L, 1, "Worker:add_worker");
    return lpto_error(L, "Worker:add_worker", "only a Worker of level 4 or above has Worker children (this one is level %d)",
                      W->level);
}

/* w:run(fn, args, cfg) */
static int w_run(lua_State *L)
{
    const char *who = "Worker:run";
    lworker *W = check_worker(L, 1, who);
    if (W->in_run) return lpto_error(L, who, "a run of this Worker is already in progress (runs do not nest)");
    if (!lua_isfunction(L, 2))
        return lpto_error(L, who, "expected the function to run, fn(orch, args, cfg), as argument 1 (got %s)",
                          luaL_typename(L, 2));
    lua_settop(L, 4);
    worker_init(L, 1, W, who);
    pto_orch *o = pto_run_begin(W->w);
    if (!o) return lpto_engine_error(L);
    W->in_run = true;
    active_add(W->w);
    lorch *O = lua_newuserdatauv(L, sizeof *O, OUV_COUNT);   /* 5 */
    *O = (lorch){W, o, true, pthread_self()};
    luaL_setmetatable(L, LPTO_ORCH);
    lua_pushvalue(L, 1);
    lua_setiuservalue(L, 5, OUV_WORKER);
    lua_newtable(L);
    lua_setiuservalue(L, 5, OUV_SCOPES);
    lua_newtable(L);
    lua_setiuservalue(L, 5, OUV_PINS);
    lua_pushvalue(L, 5);
    lua_setiuservalue(L, 1, UV_ORCH);

    int base = lua_gettop(L);
    lua_pushvalue(L, 2);
    lua_pushvalue(L, 5);
    lua_pushvalue(L, 3);
    lua_pushvalue(L, 4);
    int status = lua_pcall(L, 3, LUA_MULTRET, 0);
    int nres = lua_gettop(L) - base;

    O->valid = false;
    lpto_gil_release(W->gil);
    int rc = pto_run_end(W->w);
    lpto_gil_acquire(W->gil);
    char *fail = rc != 0 ? strdup(pto_errmsg()) : NULL;
    active_remove(W->w);
    W->in_run = false;
    /* Heap-ring tensors of this run die with it. */
    lua_getiuservalue(L, 5, OUV_SCOPES);
    lua_pushnil(L);
    while (lua_next(L, -2)) {
        lua_pushnil(L);
        while (lua_next(L, -2)) {
            lpto_storage *st = lua_touserdata(L, -1);
            st->valid = false;
            lua_pop(L, 1);
        }
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    lua_pushnil(L);
    lua_setiuservalue(L, 5, OUV_PINS);
    lua_pushnil(L);
    lua_setiuservalue(L, 1, UV_ORCH);

    if (status != LUA_OK) {
        free(fail);
        return lua_error(L);   /* the function's own error, unchanged */
    }
    if (fail) {
        lua_pushstring(L, fail);
        free(fail);
        return lua_error(L);
    }
    return nres;
}

static int w_stats(lua_State *L)
{
    lworker *W = check_worker(L, 1, "Worker:stats");
    pto_stats s;
    pto_worker_stats(W->w, &s);
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
    return 1;
}

/* w:child_pids() -> {chips = {pid, ...}, subs = {pid, ...}}: the processes
 * serving each worker now (empty in THREAD mode); for tests and tools. */
static int w_child_pids(lua_State *L)
{
    lworker *W = check_worker(L, 1, "Worker:child_pids");
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
    return 1;
}

static int w_stats_report(lua_State *L)
{
    lworker *W = check_worker(L, 1, "Worker:stats_report");
    int n = pto_worker_format_stats(W->w, NULL, 0);
    luaL_Buffer b;
    char *p = luaL_buffinitsize(L, &b, (size_t)n + 1);
    pto_worker_format_stats(W->w, p, (size_t)n + 1);
    luaL_pushresultsize(&b, (size_t)n);
    return 1;
}

static int w_print_stats(lua_State *L)
{
    check_worker(L, 1, "Worker:print_stats");
    w_stats_report(L);
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
    if (k && strcmp(k, "mode") == 0) return lua_pushstring(L, W->mode == PTO_MODE_THREAD ? "thread" : "process"), 1;
    if (k && strcmp(k, "initialized") == 0) return lua_pushboolean(L, W->state == W_READY), 1;
    luaL_getmetafield(L, 1, "methods");
    lua_getfield(L, -1, k);
    return 1;
}

static int w_tostring(lua_State *L)
{
    lworker *W = lua_touserdata(L, 1);
    lua_pushfstring(L, "Worker(level %d, %s mode, %d chips, %d sub workers%s)", W->level,
                    W->mode == PTO_MODE_THREAD ? "thread" : "process", W->nchips, W->nsubs,
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
        check_fields(L, 1, known, "lib, symbol", who);
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
    lua_pushfstring(L, "handle(%s %d)", h->kind == H_SUB ? "sub" : "chip", (int)h->callable);
    return 1;
}

/* The handle at idx, registered on O's Worker, for submit kind. */
static uint64_t check_handle(lua_State *L, int idx, lorch *O, int want, const char *who)
{
    lhandle *h = luaL_testudata(L, idx, LPTO_HANDLE);
    if (!h)
        lpto_error(L, who, "argument 1 must be a handle returned by Worker:register (got %s); register the function "
                           "or pto.chip_kernel first",
                   luaL_typename(L, idx));
    lua_getiuservalue(L, idx, 1);
    bool mine = lua_touserdata(L, -1) == O->W;
    lua_pop(L, 1);
    if (!mine) lpto_error(L, who, "this handle was registered on another Worker; register it on this one");
    if (h->kind != want)
        lpto_error(L, who, "%s", want == H_SUB ? "this handle is a chip kernel; submit it with orch:submit_next_level"
                                               : "this handle is a Lua sub callable; submit it with orch:submit_sub");
    return h->callable;
}

/* ---- Orchestrator -------------------------------------------------------------------- */

static pto_tensor *scratch(lua_State *L, lworker *W, int32_t n)
{
    if (n > W->scratch_cap) {
        pto_tensor *p = realloc(W->scratch, (size_t)n * sizeof *p);
        if (!p) luaL_error(L, "out of memory");
        W->scratch = p;
        W->scratch_cap = n;
    }
    return W->scratch;
}

/* Copy a TaskArgs into a pto_task_args over descs, checking each tensor. */
static void fill_args(lua_State *L, lpto_args *a, pto_tensor *descs, pto_task_args *out, const char *who, int which)
{
    for (int32_t i = 0; i < a->nt; i++) {
        lpto_tensor *t = a->tensors[i];
        if (!t->st) {
            if (a->tags[i] != PTO_OUTPUT)
                lpto_error(L, who, "%stensor %d is an unset pto.tensor_spec tagged '%s'; only an OUTPUT can be "
                                   "unset (the submit allocates it)",
                           which ? lua_pushfstring(L, "args %d: ", which), lua_tostring(L, -1) : "", (int)i + 1,
                           (const char *[]){"in", "out", "inout", "out_existing", "no_dep"}[a->tags[i]]);
        } else if (!t->st->valid) {
            lpto_error(L, who, "tensor %d's storage is gone: %s", (int)i + 1,
                       t->st->why_invalid ? t->st->why_invalid : "it is no longer valid");
        }
        descs[i] = t->t;
    }
    *out = (pto_task_args){a->nt, a->ns, descs, a->tags, a->scalars};
}

/* After a submit: unset OUTPUTs of the TaskArgs at aidx now have heap-ring
 * storage, owned by the current scope. */
static void bind_outputs(lua_State *L, int oidx, lorch *O, int aidx, lpto_args *a, const pto_tensor *descs)
{
    bool any = false;
    for (int32_t i = 0; i < a->nt && !any; i++) any = !a->tensors[i]->st;
    if (!any) return;
    lua_getiuservalue(L, oidx, OUV_SCOPES);
    int depth = pto_scope_depth(O->o);
    if (lua_rawgeti(L, -1, depth + 1) == LUA_TNIL) {
        lua_pop(L, 1);
        lua_newtable(L);
        lua_pushvalue(L, -1);
        lua_rawseti(L, -3, depth + 1);
    }
    int list = lua_gettop(L);
    lua_getiuservalue(L, aidx, 1);
    for (int32_t i = 0; i < a->nt; i++) {
        lpto_tensor *t = a->tensors[i];
        if (t->st) continue;
        lua_rawgeti(L, -1, i + 1);
        lpto_storage *st = lpto_push_storage(L, descs[i].base, pto_tensor_nbytes(&descs[i]), LPTO_ST_RING);
        st->why_invalid = "it came from a heap ring (orch:alloc or an automatic OUTPUT) and lives only until its "
                          "scope ends; copy it into a pto.tensor inside the scope to keep it";
        lua_pushvalue(L, -1);
        lua_rawseti(L, list, (lua_Integer)lua_rawlen(L, list) + 1);
        lua_setiuservalue(L, -2, 1);
        t->t = descs[i];
        t->st = st;
        lua_pop(L, 1);
    }
    lua_pop(L, 3);
}

/* Keep the tensors of the TaskArgs at aidx alive for the run: a tensor Lua
 * drops must not give its memory back while a task still uses it. */
static void pin_args(lua_State *L, int oidx, int aidx)
{
    lua_getiuservalue(L, oidx, OUV_PINS);
    lua_getiuservalue(L, aidx, 1);
    lua_Integer n = (lua_Integer)lua_rawlen(L, -1), base = (lua_Integer)lua_rawlen(L, -2);
    for (lua_Integer i = 1; i <= n; i++) {
        lua_rawgeti(L, -1, i);
        lua_rawseti(L, -3, base + i);
    }
    lua_pop(L, 2);
}

/* Submit the TaskArgs at stack indices aidx[0..n-1]. */
static int do_submit(lua_State *L, lorch *O, int oidx, int kind, uint64_t callable, const int *aidx, int n,
                     const pto_call_config *cfg, const int32_t *pins, int32_t pin, const char *who)
{
    lworker *W = O->W;
    lpto_args *as[LUA_MINSTACK * 8];
    int32_t total = 0;
    for (int i = 0; i < n; i++) {
        as[i] = lpto_checkargs(L, aidx[i], who);
        total += as[i]->nt;
    }
    pto_tensor *descs = scratch(L, W, total > 0 ? total : 1);
    pto_task_args targs[LUA_MINSTACK * 8];
    for (int i = 0, off = 0; i < n; i++) {
        fill_args(L, as[i], descs + off, &targs[i], who, n > 1 ? i + 1 : 0);
        off += as[i]->nt;
    }
    /* a submit blocked on ring space must let THREAD-mode Lua subs run */
    bool release = W->nsubs > 0 && W->mode == PTO_MODE_THREAD;
    if (release) lpto_gil_release(W->gil);
    int64_t id;
    if (kind == PTO_SUB)
        id = n == 1 && !pins ? pto_submit_sub(O->o, callable, &targs[0], pin)
                             : pto_submit_sub_group(O->o, callable, targs, n, pins);
    else
        id = n == 1 && !pins ? pto_submit_next_level(O->o, callable, &targs[0], cfg, pin)
                             : pto_submit_next_level_group(O->o, callable, targs, n, cfg, pins);
    if (release) lpto_gil_acquire(W->gil);
    if (id < 0) return lpto_engine_error(L);
    for (int i = 0, off = 0; i < n; i++) {
        bind_outputs(L, oidx, O, aidx[i], as[i], descs + off);
        pin_args(L, oidx, aidx[i]);
        off += as[i]->nt;
    }
    lua_pushinteger(L, id);
    return 1;
}

static int32_t opt_pin(lua_State *L, int idx, int nworkers, const char *kname, const char *who)
{
    if (lua_isnoneornil(L, idx)) return -1;
    if (!lua_istable(L, idx))
        lpto_error(L, who, "options must be a table like {worker = 1} (got %s)", luaL_typename(L, idx));
    static const char *const known[] = {"worker", NULL};
    check_fields(L, idx, known, "worker", who);
    lua_Integer w = 0;
    if (!get_int_field(L, idx, "worker", &w, LUA_MININTEGER, LUA_MAXINTEGER, who)) return -1;
    if (w < 1 || w > nworkers)
        lpto_error(L, who, "worker %lld does not exist: this Worker has %d %s, numbered from 1", (long long)w, nworkers,
                   kname);
    return (int32_t)(w - 1);
}

/* Push each TaskArgs of the list at idx; returns the count (indices in aidx). */
static int push_members(lua_State *L, int idx, int *aidx, int cap, const char *who)
{
    if (!lua_istable(L, idx))
        lpto_error(L, who, "argument 2 must be a list of TaskArgs, one per member (got %s)", luaL_typename(L, idx));
    lua_Integer n = luaL_len(L, idx);
    if (n < 1) lpto_error(L, who, "a group needs at least one member (the list of TaskArgs is empty)");
    if (n > cap) lpto_error(L, who, "a group has at most %d members (got %lld)", cap, (long long)n);
    luaL_checkstack(L, (int)n + 8, who);
    for (lua_Integer i = 1; i <= n; i++) {
        lua_rawgeti(L, idx, i);
        if (!luaL_testudata(L, -1, LPTO_ARGS))
            lpto_error(L, who, "member %lld must be a TaskArgs (got %s)", (long long)i, luaL_typename(L, -1));
        aidx[i - 1] = lua_gettop(L);
    }
    return (int)n;
}

static int32_t *opt_group_pins(lua_State *L, int idx, int n, int nworkers, const char *kname, int32_t *pins,
                               const char *who)
{
    if (lua_isnoneornil(L, idx)) return NULL;
    if (!lua_istable(L, idx))
        lpto_error(L, who, "options must be a table like {workers = {1, 2}} (got %s)", luaL_typename(L, idx));
    static const char *const known[] = {"workers", NULL};
    check_fields(L, idx, known, "workers", who);
    lua_getfield(L, idx, "workers");
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        return NULL;
    }
    if (!lua_istable(L, -1) || luaL_len(L, -1) != n)
        lpto_error(L, who, "workers must be a list of %d worker ids, one per member", n);
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, -1, i + 1);
        int isint;
        lua_Integer w = lua_tointegerx(L, -1, &isint);
        if (!isint || w < 1 || w > nworkers)
            lpto_error(L, who, "workers[%d]: worker %s does not exist: this Worker has %d %s, numbered from 1", i + 1,
                       luaL_tolstring(L, -1, NULL), nworkers, kname);
        for (int k = 0; k < i; k++)
            if (pins[k] == w - 1)
                lpto_error(L, who, "workers[%d] and workers[%d] are both worker %lld; members need distinct workers",
                           k + 1, i + 1, (long long)w);
        pins[i] = (int32_t)(w - 1);
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    return pins;
}

static int o_submit_next_level(lua_State *L)
{
    const char *who = "orch:submit_next_level";
    lorch *O = check_orch(L, 1, who);
    uint64_t c = check_handle(L, 2, O, H_CHIP, who);
    lua_settop(L, 5);
    if (lua_isnil(L, 3)) return lpto_error(L, who, "argument 2 must be a TaskArgs (got nil)");
    const pto_call_config *cfg = lpto_optconfig(L, 4, who);
    int32_t pin = opt_pin(L, 5, O->W->nchips, "chips", who);
    int aidx[1] = {3};
    return do_submit(L, O, 1, PTO_NEXT_LEVEL, c, aidx, 1, cfg, NULL, pin, who);
}

#define MAX_GROUP 256

static int o_submit_next_level_group(lua_State *L)
{
    const char *who = "orch:submit_next_level_group";
    lorch *O = check_orch(L, 1, who);
    uint64_t c = check_handle(L, 2, O, H_CHIP, who);
    lua_settop(L, 5);
    const pto_call_config *cfg = lpto_optconfig(L, 4, who);
    int aidx[MAX_GROUP];
    int n = push_members(L, 3, aidx, MAX_GROUP, who);
    int32_t pins[MAX_GROUP];
    int32_t *p = opt_group_pins(L, 5, n, O->W->nchips, "chips", pins, who);
    return do_submit(L, O, 1, PTO_NEXT_LEVEL, c, aidx, n, cfg, p, -1, who);
}

static int o_submit_sub(lua_State *L)
{
    const char *who = "orch:submit_sub";
    lorch *O = check_orch(L, 1, who);
    uint64_t c = check_handle(L, 2, O, H_SUB, who);
    lua_settop(L, 4);
    if (lua_isnil(L, 3)) {   /* no args: an empty TaskArgs */
        lpto_args *a = lua_newuserdatauv(L, sizeof *a, 1);
        memset(a, 0, sizeof *a);
        lua_newtable(L);
        lua_setiuservalue(L, -2, 1);
        luaL_setmetatable(L, LPTO_ARGS);
        lua_replace(L, 3);
    }
    int32_t pin = opt_pin(L, 4, O->W->nsubs, "sub workers", who);
    int aidx[1] = {3};
    return do_submit(L, O, 1, PTO_SUB, c, aidx, 1, NULL, NULL, pin, who);
}

static int o_submit_sub_group(lua_State *L)
{
    const char *who = "orch:submit_sub_group";
    lorch *O = check_orch(L, 1, who);
    uint64_t c = check_handle(L, 2, O, H_SUB, who);
    lua_settop(L, 4);
    int aidx[MAX_GROUP];
    int n = push_members(L, 3, aidx, MAX_GROUP, who);
    int32_t pins[MAX_GROUP];
    int32_t *p = opt_group_pins(L, 4, n, O->W->nsubs, "sub workers", pins, who);
    return do_submit(L, O, 1, PTO_SUB, c, aidx, n, NULL, p, -1, who);
}

static int o_alloc(lua_State *L)
{
    const char *who = "orch:alloc";
    lorch *O = check_orch(L, 1, who);
    pto_tensor d = {0};
    d.ndims = (uint8_t)lpto_parse_shape(L, 2, d.shape, who);
    d.dtype = (uint8_t)lpto_parse_dtype(L, 3, who);
    bool release = O->W->nsubs > 0 && O->W->mode == PTO_MODE_THREAD;
    if (release) lpto_gil_release(O->W->gil);
    int64_t id = pto_alloc(O->o, d.shape, d.ndims, d.dtype, &d);
    if (release) lpto_gil_acquire(O->W->gil);
    if (id < 0) return lpto_engine_error(L);
    lua_getiuservalue(L, 1, OUV_SCOPES);
    int depth = pto_scope_depth(O->o);
    if (lua_rawgeti(L, -1, depth + 1) == LUA_TNIL) {
        lua_pop(L, 1);
        lua_newtable(L);
        lua_pushvalue(L, -1);
        lua_rawseti(L, -3, depth + 1);
    }
    lpto_storage *st = lpto_push_storage(L, d.base, pto_tensor_nbytes(&d), LPTO_ST_RING);
    st->why_invalid = "it came from orch:alloc and lives only until its scope ends; copy it into a pto.tensor "
                      "inside the scope to keep it";
    lua_pushvalue(L, -1);
    lua_rawseti(L, -3, (lua_Integer)lua_rawlen(L, -3) + 1);
    lpto_push_tensor(L, &d, -1);
    return 1;
}

/* Heap-ring tensors bound at depth become invalid when its scope ends. */
static void invalidate_depth(lua_State *L, int oidx, int depth)
{
    lua_getiuservalue(L, oidx, OUV_SCOPES);
    if (lua_rawgeti(L, -1, depth + 1) == LUA_TTABLE) {
        lua_Integer n = (lua_Integer)lua_rawlen(L, -1);
        for (lua_Integer i = 1; i <= n; i++) {
            lua_rawgeti(L, -1, i);
            ((lpto_storage *)lua_touserdata(L, -1))->valid = false;
            lua_pop(L, 1);
        }
    }
    lua_pop(L, 1);
    lua_pushnil(L);
    lua_rawseti(L, -2, depth + 1);
    lua_pop(L, 1);
}

static int scope_begin(lua_State *L, lorch *O, const char *who)
{
    if (pto_scope_begin(O->o) != 0) return lpto_engine_error_as(L, who);
    return pto_scope_depth(O->o);
}

static void scope_end(lua_State *L, int oidx, lorch *O)
{
    int depth = pto_scope_depth(O->o);
    if (pto_scope_end(O->o) != 0) lpto_engine_error(L);
    invalidate_depth(L, oidx, depth);
}

static int o_scope_begin(lua_State *L)
{
    lorch *O = check_orch(L, 1, "orch:scope_begin");
    lua_pushinteger(L, scope_begin(L, O, "orch:scope_begin"));
    return 1;
}

static int o_scope_end(lua_State *L)
{
    lorch *O = check_orch(L, 1, "orch:scope_end");
    scope_end(L, 1, O);
    return 0;
}

static int sc_close(lua_State *L)
{
    lscope *S = luaL_checkudata(L, 1, LPTO_SCOPE);
    if (S->depth == 0) return 0;
    lua_getiuservalue(L, 1, 1);
    lorch *O = lua_touserdata(L, -1);
    int oidx = lua_gettop(L);
    if (!O->valid) return 0;   /* the run ended: its end closed every scope */
    if (!pthread_equal(O->thread, pthread_self()))
        return lpto_error(L, "orch:scope", "a scope can be closed only by the function given to Worker:run, not "
                                           "from a sub callable");
    int depth = S->depth;
    S->depth = 0;
    if (pto_scope_depth(O->o) != depth)
        return lpto_error(L, "orch:scope", "scopes closed out of order: this scope opened at depth %d but the "
                                          "innermost open scope is at depth %d", depth, pto_scope_depth(O->o));
    scope_end(L, oidx, O);
    return 0;
}

/* orch:scope(fn) runs fn inside a scope; orch:scope() returns a
 * to-be-closed value: do local s <close> = orch:scope() ... end */
static int o_scope(lua_State *L)
{
    const char *who = "orch:scope";
    lorch *O = check_orch(L, 1, who);
    if (lua_isnoneornil(L, 2)) {
        lscope *S = lua_newuserdatauv(L, sizeof *S, 1);
        S->O = O;
        S->depth = 0;
        luaL_setmetatable(L, LPTO_SCOPE);
        lua_pushvalue(L, 1);
        lua_setiuservalue(L, -2, 1);
        S->depth = scope_begin(L, O, who);
        return 1;
    }
    if (!lua_isfunction(L, 2))
        return lpto_error(L, who, "expected a function to run inside the scope, or nothing for the <close> form (got %s)",
                          luaL_typename(L, 2));
    int depth = scope_begin(L, O, who);
    int base = lua_gettop(L);
    lua_pushvalue(L, 2);
    lua_pushvalue(L, 1);
    int status = lua_pcall(L, 1, LUA_MULTRET, 0);
    if (O->valid && pto_scope_depth(O->o) == depth) scope_end(L, 1, O);
    else if (status == LUA_OK && O->valid)
        return lpto_error(L, who, "the function left scopes open (depth %d, expected %d); close every scope_begin "
                                  "with scope_end",
                          pto_scope_depth(O->o), depth);
    if (status != LUA_OK) return lua_error(L);
    return lua_gettop(L) - base;
}

static int o_scope_depth(lua_State *L)
{
    lorch *O = check_orch(L, 1, "orch:scope_depth");
    lua_pushinteger(L, pto_scope_depth(O->o));
    return 1;
}

static const char *const STATE_NAMES[] = {"free", "pending", "ready", "running", "completed", "consumed", "failed"};

static void push_edges(lua_State *L, lorch *O, int64_t id, int what)
{
    int64_t buf[64];
    int n = pto_task_edges(O->o, id, what, buf, 64);
    int64_t *ids = buf;
    if (n > 64) {
        ids = lua_newuserdatauv(L, sizeof *ids * (size_t)n, 0);
        pto_task_edges(O->o, id, what, ids, n);
    }
    lua_createtable(L, n > 0 ? n : 0, 0);
    for (int i = 0; i < n; i++) {
        lua_pushinteger(L, ids[i]);
        lua_rawseti(L, -2, i + 1);
    }
    if (ids != buf) lua_remove(L, -2);
}

/* orch:task(id) -> {id, state, kind, callable, fanin, fanout, producers, consumers, ring, error, ...} */
static int o_task(lua_State *L)
{
    const char *who = "orch:task";
    lorch *O = check_orch(L, 1, who);
    int isint;
    lua_Integer id = lua_tointegerx(L, 2, &isint);
    if (!isint) return lpto_error(L, who, "expected a task id returned by a submit (got %s)", luaL_typename(L, 2));
    pto_task_info info;
    if (pto_task_info_get(O->o, id, &info) != 0) return lpto_engine_error(L);
    lua_createtable(L, 0, 12);
    lua_pushinteger(L, info.id);
    lua_setfield(L, -2, "id");
    lua_pushstring(L, info.state >= 0 && info.state <= PTO_TASK_FAILED ? STATE_NAMES[info.state] : "unknown");
    lua_setfield(L, -2, "state");
    lua_pushstring(L, info.kind == PTO_NEXT_LEVEL ? "next_level" : info.kind == PTO_SUB ? "sub"
                                                  : info.kind == -1 ? "alloc" : "reclaimed");
    lua_setfield(L, -2, "kind");
    lua_pushinteger(L, (lua_Integer)info.callable);
    lua_setfield(L, -2, "callable");
    lua_pushinteger(L, info.fanin);
    lua_setfield(L, -2, "fanin");
    lua_pushinteger(L, info.fanout);
    lua_setfield(L, -2, "fanout");
    lua_pushinteger(L, info.group_size);
    lua_setfield(L, -2, "group_size");
    if (info.ring >= 0) {
        lua_pushinteger(L, info.ring);
        lua_setfield(L, -2, "ring");
        lua_pushinteger(L, (lua_Integer)info.slab_bytes);
        lua_setfield(L, -2, "slab_bytes");
        lua_pushinteger(L, (lua_Integer)info.slab_offset);
        lua_setfield(L, -2, "slab_offset");
    }
    if (info.error) {
        lua_pushstring(L, info.error);
        lua_setfield(L, -2, "error");
    }
    push_edges(L, O, id, 0);
    lua_setfield(L, -2, "producers");
    push_edges(L, O, id, 1);
    lua_setfield(L, -2, "consumers");
    return 1;
}

static int o_task_count(lua_State *L)
{
    lorch *O = check_orch(L, 1, "orch:task_count");
    lua_pushinteger(L, pto_task_count(O->o));
    return 1;
}

static int o_worker(lua_State *L)
{
    check_orch(L, 1, "orch:worker");
    lua_getiuservalue(L, 1, OUV_WORKER);
    return 1;
}

static int o_index(lua_State *L)
{
    luaL_getmetafield(L, 1, "methods");
    lua_pushvalue(L, 2);
    lua_rawget(L, -2);
    if (lua_isnil(L, -1) && lua_type(L, 2) == LUA_TSTRING) {
        /* methods added by the Lua parts live in pto._orch_methods */
        lua_getfield(L, LUA_REGISTRYINDEX, "pto.orch_extra");
        if (lua_istable(L, -1)) {
            lua_pushvalue(L, 2);
            lua_rawget(L, -2);
        }
    }
    return 1;
}

static int o_tostring(lua_State *L)
{
    lorch *O = lua_touserdata(L, 1);
    if (!O->valid) lua_pushliteral(L, "Orchestrator(run ended)");
    else if (!pthread_equal(O->thread, pthread_self())) lua_pushliteral(L, "Orchestrator(in use by its run)");
    else lua_pushfstring(L, "Orchestrator(%d tasks, scope depth %d)", (int)pto_task_count(O->o), pto_scope_depth(O->o));
    return 1;
}

/* pto._extend_orch(table): methods written in Lua (lua/pto/inspect.lua). */
static int l_extend_orch(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_pushvalue(L, 1);
    lua_setfield(L, LUA_REGISTRYINDEX, "pto.orch_extra");
    return 0;
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
        {"init", w_init}, {"register", w_register}, {"add_worker", w_add_worker}, {"run", w_run},
        {"close", w_close}, {"stats", w_stats}, {"child_pids", w_child_pids}, {"stats_report", w_stats_report}, {"print_stats", w_print_stats},
        {NULL, NULL}};
    luaL_newlib(L, wmethods);
    lua_setfield(L, -2, "methods");
    lua_pop(L, 1);

    luaL_newmetatable(L, LPTO_ORCH);
    static const luaL_Reg ometa[] = {{"__index", o_index}, {"__tostring", o_tostring}, {NULL, NULL}};
    luaL_setfuncs(L, ometa, 0);
    static const luaL_Reg omethods[] = {
        {"submit_next_level", o_submit_next_level}, {"submit_next_level_group", o_submit_next_level_group},
        {"submit_sub", o_submit_sub}, {"submit_sub_group", o_submit_sub_group}, {"alloc", o_alloc},
        {"scope", o_scope}, {"scope_begin", o_scope_begin}, {"scope_end", o_scope_end},
        {"scope_depth", o_scope_depth}, {"task", o_task}, {"task_count", o_task_count}, {"worker", o_worker},
        {NULL, NULL}};
    luaL_newlib(L, omethods);
    lua_setfield(L, -2, "methods");
    lua_pop(L, 1);

    luaL_newmetatable(L, LPTO_SCOPE);
    lua_pushcfunction(L, sc_close);
    lua_setfield(L, -2, "__close");
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
                                   {"_extend_orch", l_extend_orch}, {"_extend_worker", l_extend_worker}, {NULL, NULL}};
    luaL_setfuncs(L, fns, 0);
}
