/* lpto_aux.c - the binding's auxiliary library (lpto_aux.h): errors named
 * for the Lua function called, options tables, the interpreter lock, the
 * registry of runs Ctrl-C interrupts. It knows no pto type, so every other
 * lpto*.c file may use it and it uses none of them. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "lpto_aux.h"

/* ---- errors -------------------------------------------------------------------------- */

int lpto_error(lua_State *L, const char *who, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return who ? luaL_error(L, "%s: %s", who, buf) : luaL_error(L, "%s", buf);
}

int lpto_engine_error(lua_State *L, const char *who)
{
    /* the engine says what went wrong; the names a Lua user types are the binding's to add */
    const char *advice = pto_errcode() == PTO_ERR_DISPATCH_HELD
                             ? " (:step or :release at the prompt; w:step() or w:release() from Lua)" : "";
    return who ? luaL_error(L, "%s: %s%s", who, pto_errmsg(), advice) : luaL_error(L, "%s%s", pto_errmsg(), advice);
}

/* ---- argument tables --------------------------------------------------------------------- */

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

bool lpto_get_field(lua_State *L, int t, const lpto_field *f, lua_Integer *out, const char *who)
{
    return lpto_get_int_field(L, t, f->name, out, f->lo, f->hi, who);
}

static bool is_field(lua_State *L, int k, const lpto_field *fields)
{
    if (lua_type(L, k) != LUA_TSTRING) return false;
    for (int i = 0; fields[i].name; i++)
        if (strcmp(lua_tostring(L, k), fields[i].name) == 0) return true;
    return false;
}

void lpto_check_fields(lua_State *L, int t, const lpto_field *fields, const char *who)
{
    t = lua_absindex(L, t);
    lua_pushnil(L);
    while (lua_next(L, t)) {
        if (!is_field(L, -2, fields)) {
            luaL_Buffer b;
            const char *key = luaL_tolstring(L, -2, NULL);
            luaL_buffinit(L, &b);
            for (int i = 0; fields[i].name; i++) {
                if (i) luaL_addstring(&b, ", ");
                luaL_addstring(&b, fields[i].name);
            }
            luaL_pushresult(&b);
            lpto_error(L, who, "unknown field '%s' (fields: %s)", key, lua_tostring(L, -1));
        }
        lua_pop(L, 1);
    }
}

uint64_t lpto_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- the interpreter lock ------------------------------------------------- */

/* Under g->mu. */
static void take(lpto_gil *g)
{
    g->held = true;
    g->handoff = false;
    g->taken++;
}

void lpto_gil_acquire_sub(lpto_gil *g)
{
    atomic_fetch_add_explicit(&g->waiters, 1, memory_order_relaxed);
    pthread_mutex_lock(&g->mu);
    while (g->held || (g->firsts && !g->handoff)) {
        g->sleepers++;
        pthread_cond_wait(&g->cv, &g->mu);
        g->sleepers--;
    }
    take(g);
    pthread_mutex_unlock(&g->mu);
    atomic_fetch_sub_explicit(&g->waiters, 1, memory_order_relaxed);
}

void lpto_gil_acquire(lpto_gil *g)
{
    atomic_fetch_add_explicit(&g->waiters, 1, memory_order_relaxed);
    pthread_mutex_lock(&g->mu);
    g->firsts++;
    while (g->held) pthread_cond_wait(&g->cv, &g->mu);
    g->firsts--;
    take(g);
    pthread_mutex_unlock(&g->mu);
    atomic_fetch_sub_explicit(&g->waiters, 1, memory_order_relaxed);
}

/* Under g->mu, the lock just let go: wake whoever may take it now. */
static void wake(lpto_gil *g)
{
    if (g->firsts) pthread_cond_broadcast(&g->cv);
    else if (g->sleepers) pthread_cond_signal(&g->cv);
}

void lpto_gil_release(lpto_gil *g)
{
    pthread_mutex_lock(&g->mu);
    g->held = false;
    wake(g);
    pthread_mutex_unlock(&g->mu);
}

void lpto_gil_block(void *g) { lpto_gil_release(g); }

void lpto_gil_unblock(void *g) { lpto_gil_acquire(g); }

void lpto_gil_yield(lpto_gil *g)
{
    if (!atomic_load_explicit(&g->waiters, memory_order_relaxed)) return;
    uint64_t now = lpto_now_ns();
    if (now - g->yielded_ns < LPTO_GIL_SLICE_NS) return;   /* the holder's own field */
    g->yielded_ns = now;
    pthread_mutex_lock(&g->mu);
    if (g->sleepers || g->firsts) {
        uint64_t before = g->taken;
        g->held = false;
        g->handoff = true;
        g->firsts++;
        pthread_cond_broadcast(&g->cv);
        /* Until another thread has had it (or none is left to take it). */
        while (g->held || (g->taken == before && (g->sleepers || g->firsts > 1))) pthread_cond_wait(&g->cv, &g->mu);
        g->firsts--;
        take(g);
    }
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

void lpto_gil_open(lua_State *L)
{
    if (lpto_gil_of(L)) return;
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

/* ---- runs that Ctrl-C interrupts ------------------------------------------------------- */

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

int lpto_active_interrupt(void)
{
    int n = 0;
    for (int i = 0; i < MAX_ACTIVE; i++) {
        pto_worker *w = atomic_load(&active[i]);
        if (w) {
            pto_worker_interrupt(w);
            n++;
        }
    }
    return n;
}

/* ---- small helpers ----------------------------------------------------------------------- */

void lpto_set_int(lua_State *L, const char *name, lua_Integer v)
{
    lua_pushinteger(L, v);
    lua_setfield(L, -2, name);
}

void lpto_push_weak_keys(lua_State *L)
{
    lua_newtable(L);
    lua_createtable(L, 0, 1);
    lua_pushliteral(L, "k");
    lua_setfield(L, -2, "__mode");
    lua_setmetatable(L, -2);
}

void lpto_weak_registry(lua_State *L, const void *key, const char *mode)
{
    if (lua_rawgetp(L, LUA_REGISTRYINDEX, key) == LUA_TTABLE) return;
    lua_pop(L, 1);
    lua_newtable(L);
    lua_createtable(L, 0, 1);
    lua_pushstring(L, mode);
    lua_setfield(L, -2, "__mode");
    lua_setmetatable(L, -2);
    lua_pushvalue(L, -1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, key);
}
