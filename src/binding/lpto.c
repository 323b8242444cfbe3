/* lpto.c - luaopen_pto: the module table, constants, the interpreter lock
 * and error helpers. The engine under it never sees a Lua header. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "lpto.h"
#include "lpto_priv.h"
#include "lpto_trace.h"

/* ---- the interpreter lock ------------------------------------------------- */

void lpto_gil_acquire(lpto_gil *g)
{
    atomic_fetch_add_explicit(&g->waiters, 1, memory_order_relaxed);
    pthread_mutex_lock(&g->mu);
    uint64_t me = g->next++;
    while (me != g->serving) pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
    atomic_fetch_sub_explicit(&g->waiters, 1, memory_order_relaxed);
}

void lpto_gil_release(lpto_gil *g)
{
    pthread_mutex_lock(&g->mu);
    g->serving++;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static const char GIL_KEY = 'G';

lpto_gil *lpto_gil_of(lua_State *L)
{
    lua_rawgetp(L, LUA_REGISTRYINDEX, &GIL_KEY);
    lpto_gil *g = lua_touserdata(L, -1);
    lua_pop(L, 1);
    return g;
}

static int gil_gc(lua_State *L)
{
    lpto_gil *g = lua_touserdata(L, 1);
    lpto_gil_release(g);   /* the loading thread's hold ends with the state */
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    return 0;
}

static void gil_create(lua_State *L)
{
    lua_rawgetp(L, LUA_REGISTRYINDEX, &GIL_KEY);
    bool have = !lua_isnil(L, -1);
    lua_pop(L, 1);
    if (have) return;
    lpto_gil *g = lua_newuserdatauv(L, sizeof *g, 0);
    memset(g, 0, sizeof *g);
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    lpto_gil_acquire(g);
    lua_newtable(L);
    lua_pushcfunction(L, gil_gc);
    lua_setfield(L, -2, "__gc");
    lua_setmetatable(L, -2);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &GIL_KEY);
}

/* ---- errors -------------------------------------------------------------------- */

int lpto_engine_error(lua_State *L)
{
    return luaL_error(L, "%s", pto_errmsg());
}

int lpto_engine_error_as(lua_State *L, const char *who)
{
    const char *m = pto_errmsg(), *colon = strstr(m, ": ");
    if (colon && !memchr(m, ' ', (size_t)(colon - m))) m = colon + 2;   /* the engine's own "name: " */
    return luaL_error(L, "%s: %s", who, m);
}

int lpto_error(lua_State *L, const char *who, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return luaL_error(L, "%s: %s", who, buf);
}

void lpto_interrupt(void)
{
    lpto_interrupt_all();
    lpto_debug_interrupted();
}

/* ---- module ----------------------------------------------------------------------- */

static int l_shm_stats(lua_State *L)
{
    pto_shm_stats s;
    pto_shm_stats_get(&s);
    lua_createtable(L, 0, 4);
    lua_pushinteger(L, (lua_Integer)s.reserved_bytes);
    lua_setfield(L, -2, "reserved_bytes");
    lua_pushinteger(L, (lua_Integer)s.in_use_bytes);
    lua_setfield(L, -2, "in_use_bytes");
    lua_pushinteger(L, (lua_Integer)s.hwm_bytes);
    lua_setfield(L, -2, "hwm_bytes");
    lua_pushinteger(L, (lua_Integer)s.live_blocks);
    lua_setfield(L, -2, "live_blocks");
    return 1;
}

/* Seconds on the monotonic clock, for timing runs (os.clock is CPU time). */
static int l_now(lua_State *L)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    lua_pushnumber(L, (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9);
    return 1;
}

static void set_int(lua_State *L, const char *name, lua_Integer v)
{
    lua_pushinteger(L, v);
    lua_setfield(L, -2, name);
}

/* The pure-Lua parts (the files under lua/pto) extend the table: each is a function
 * of the module table. */
static void load_lua_part(lua_State *L, const char *name)
{
    lua_getglobal(L, "require");
    lua_pushstring(L, name);
    if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
        luaL_error(L, "require \"pto\": cannot load its Lua part '%s' (%s); install ptolua with cmake --install or "
                      "luarocks make, or put ptolua's lua/ directory on package.path",
                   name, lua_tostring(L, -1));
    }
    lua_pushvalue(L, -2);
    lua_call(L, 1, 0);
}

int luaopen_pto(lua_State *L)
{
    luaL_checkversion(L);
    if (pto_shm_init(0) != 0) return luaL_error(L, "require \"pto\": %s", pto_errmsg());
    gil_create(L);
    lua_newtable(L);
    lua_pushliteral(L, "0.1.0");
    lua_setfield(L, -2, "_VERSION");
    set_int(L, "INPUT", PTO_INPUT);
    set_int(L, "OUTPUT", PTO_OUTPUT);
    set_int(L, "INOUT", PTO_INOUT);
    set_int(L, "OUTPUT_EXISTING", PTO_OUTPUT_EXISTING);
    set_int(L, "NO_DEP", PTO_NO_DEP);
    static const struct { const char *name; const char *dtype; } dtypes[] = {
        {"FLOAT32", "f32"}, {"FLOAT16", "f16"}, {"BFLOAT16", "bf16"}, {"FLOAT64", "f64"},
        {"INT8", "i8"}, {"INT16", "i16"}, {"INT32", "i32"}, {"INT64", "i64"},
        {"UINT8", "u8"}, {"UINT16", "u16"}, {"UINT32", "u32"}, {"UINT64", "u64"}, {"BOOL", "bool"},
    };
    for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++) {
        lua_pushstring(L, dtypes[i].dtype);
        lua_setfield(L, -2, dtypes[i].name);
    }
    set_int(L, "MAX_DIMS", PTO_MAX_DIMS);
    set_int(L, "MAX_SCOPE_DEPTH", PTO_MAX_SCOPE_DEPTH);
    lua_pushcfunction(L, l_shm_stats);
    lua_setfield(L, -2, "shm_stats");
    lua_pushcfunction(L, l_now);
    lua_setfield(L, -2, "now");
    lpto_open_tensor(L);
    lpto_open_args(L);
    lpto_open_worker(L);
    load_lua_part(L, "pto.args");
    load_lua_part(L, "pto.inspect");
    lpto_open_trace(L);
    lpto_open_debug(L);
    return 1;
}
