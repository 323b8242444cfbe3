/* lpto_sub.c - sub callables: fn(args) on a sub worker, in THREAD mode
 * under the interpreter lock, in PROCESS mode in the sub's forked child;
 * and shipping functions registered after the children were forked. */
#include <stdio.h>
#include <string.h>

#include "lpto_priv.h"

/* A sub callable: fn(args) with a TaskArgs over the task's arguments. In
 * THREAD mode it runs on the sub's worker thread, holding the interpreter
 * lock for the call. */
int lpto_sub_run(void *ctx, uint64_t callable, const pto_args_view *args, const pto_call_config *cfg, char *err,
                 size_t errlen)
{
    (void)cfg;
    sub_ctx *S = ctx;
    lworker *W = S->W;
    lua_State *T = S->T;
    int rc = 0;
    lua_settop(T, 0);
    /* 1: the storage the arguments' tensors borrow, on the stack for the
     * whole call: a sub with no tensor arguments holds no other reference,
     * and the flag below is written after the call. */
    lpto_storage *st = lpto_push_storage(T, 0, 0, LPTO_ST_BORROWED);
    st->why_invalid = "tensors in a sub callable's arguments are valid only during that call; copy what you "
                      "need to keep";
    lua_getglobal(T, "debug");   /* 2: the message handler */
    lua_getfield(T, -1, "traceback");
    lua_remove(T, -2);
    lua_rawgeti(T, LUA_REGISTRYINDEX, W->fns_ref);
    lua_rawgeti(T, -1, (lua_Integer)callable);
    lua_remove(T, -2);
    if (!lua_isfunction(T, -1)) {
        snprintf(err, errlen, "callable %llu is not a sub function registered on this Worker", (unsigned long long)callable);
        rc = 1;
    } else {
        lpto_push_args_view(T, args, 1);
        if (lua_pcall(T, 1, 0, 2) != LUA_OK) {
            const char *m = lua_tostring(T, -1);
            snprintf(err, errlen, "%s", m ? m : "(error object is not a string)");
            rc = 1;
        }
        st->valid = false;
    }
    lua_settop(T, 0);
    return rc;
}

int lpto_sub_leaf(void *ctx, uint64_t callable, const pto_args_view *args, const pto_call_config *cfg, char *err,
                  size_t errlen)
{
    lpto_gil *g = ((sub_ctx *)ctx)->W->gil;
    lpto_gil_acquire_sub(g);
    int rc = lpto_sub_run(ctx, callable, args, cfg, err, errlen);
    lpto_gil_release(g);
    return rc;
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

void lpto_ship_function(lua_State *L, int idx, const char *who)
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
int lpto_sub_load(void *ctx, uint64_t callable, const void *blob, size_t len, char *err, size_t errlen)
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
