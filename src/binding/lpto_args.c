/* lpto_args.c - pto.TaskArgs, pto.args{...} and pto.CallConfig.
 * A TaskArgs keeps its tensors' userdata in its user values (so they stay
 * alive and specs bound by a submit are seen by later submits: the first
 * LPTO_ARGS_INLINE each in a user value of its own, the rest in a table
 * made when needed) and the tags
 * and scalars in C arrays that a submit reads directly: inside the userdata
 * up to LPTO_ARGS_INLINE of each, beyond that in userdata blocks held as its
 * other user values, so a TaskArgs needs neither malloc nor a finalizer.
 * pto.args is C rather than Lua for the same reason: it runs per submit. */
#include <stdlib.h>
#include <string.h>

#include "lpto_priv.h"

lpto_args *lpto_checkargs(lua_State *L, int idx, const char *who)
{
    lpto_args *a = luaL_testudata(L, idx, LPTO_ARGS);
    if (!a) lpto_error(L, who, "expected a TaskArgs (from pto.TaskArgs() or pto.args{...}), got %s",
                       luaL_typename(L, idx));
    return a;
}

/* lpto_checkargs for the functions of this file, which carry the metatables as upvalues. */
static lpto_args *check_args(lua_State *L, int idx, const char *who)
{
    lpto_args *a = lpto_testudata_up(L, idx, LPTO_UP_ARGS);
    if (!a) lpto_error(L, who, "expected a TaskArgs (from pto.TaskArgs() or pto.args{...}), got %s",
                       luaL_typename(L, idx));
    return a;
}

/* Grow the arrays *p1 (elements of s1 bytes) and *p2 (of s2) from old to n
 * elements, into a new userdata kept as user value uv of the TaskArgs at
 * self: the collector frees them with it, so a TaskArgs needs no __gc (a
 * finalizer per object costs every collection cycle). */
static void grow_pair(lua_State *L, int self, int uv, void **p1, size_t s1, void **p2, size_t s2, int32_t old, int32_t n)
{
    char *blk = lua_newuserdatauv(L, (size_t)n * (s1 + s2), 0);
    memcpy(blk, *p1, (size_t)old * s1);
    memcpy(blk + (size_t)n * s1, *p2, (size_t)old * s2);
    *p1 = blk;
    *p2 = blk + (size_t)n * s1;
    lua_setiuservalue(L, self, uv);
}

/* Push a new, empty TaskArgs with the metatable at mt_idx. */
static lpto_args *push_args_mt(lua_State *L, int mt_idx, int narr)
{
    mt_idx = lua_absindex(L, mt_idx);
    lpto_args *a = lua_newuserdatauv(L, sizeof *a, UV_ARGS_INLINE + LPTO_ARGS_INLINE);
    memset(a, 0, sizeof *a);
    a->cap_t = a->cap_s = LPTO_ARGS_INLINE;
    a->tensors = a->tensors_in;
    a->tags = a->tags_in;
    a->scalars = a->scalars_in;
    a->scalar_float = a->scalar_float_in;
    (void)narr;
    lua_pushvalue(L, mt_idx);
    lua_setmetatable(L, -2);
    return a;
}

lpto_args *lpto_push_args(lua_State *L)
{
    luaL_getmetatable(L, LPTO_ARGS);
    lpto_args *a = push_args_mt(L, -1, 0);
    lua_remove(L, -2);
    return a;
}

static void add_tensor(lua_State *L, int self, lpto_args *a, int tidx, int tag)
{
    if (a->nt == a->cap_t) {
        if (a->cap_t > INT32_MAX / 2) luaL_error(L, "TaskArgs: too many tensors");
        grow_pair(L, self, 2, (void **)&a->tensors, sizeof *a->tensors, (void **)&a->tags, sizeof *a->tags, a->nt,
                  a->cap_t * 2);
        a->cap_t *= 2;
    }
    a->tensors[a->nt] = lua_touserdata(L, tidx);
    a->tags[a->nt] = (uint8_t)tag;
    int32_t i = ++a->nt;
    tidx = lua_absindex(L, tidx);
    if (i <= LPTO_ARGS_INLINE) {
        lua_pushvalue(L, tidx);
        lua_setiuservalue(L, self, UV_ARGS_INLINE + i);
        return;
    }
    if (lua_getiuservalue(L, self, 1) == LUA_TNIL) {
        lua_pop(L, 1);
        lua_newtable(L);
        lua_pushvalue(L, -1);
        lua_setiuservalue(L, self, 1);
    }
    lua_pushvalue(L, tidx);
    lua_rawseti(L, -2, i);
    lua_pop(L, 1);
}

void lpto_args_push_tensor(lua_State *L, int aidx, int32_t i)
{
    if (i <= LPTO_ARGS_INLINE) {
        lua_getiuservalue(L, aidx, UV_ARGS_INLINE + i);
        return;
    }
    aidx = lua_absindex(L, aidx);
    lua_getiuservalue(L, aidx, 1);
    lua_rawgeti(L, -1, i);
    lua_remove(L, -2);
}

static void add_scalar(lua_State *L, int self, lpto_args *a, int idx, const char *who)
{
    if (a->ns == a->cap_s) {
        if (a->cap_s > INT32_MAX / 2) luaL_error(L, "TaskArgs: too many scalars");
        grow_pair(L, self, 3, (void **)&a->scalars, sizeof *a->scalars, (void **)&a->scalar_float,
                  sizeof *a->scalar_float, a->ns, a->cap_s * 2);
        a->cap_s *= 2;
    }
    uint64_t bits;
    bool is_float = false;
    if (lua_isinteger(L, idx)) {
        bits = (uint64_t)lua_tointeger(L, idx);
    } else if (lua_type(L, idx) == LUA_TNUMBER) {
        double d = lua_tonumber(L, idx);
        memcpy(&bits, &d, sizeof bits);
        is_float = true;
    } else if (lua_isboolean(L, idx)) {
        bits = (uint64_t)lua_toboolean(L, idx);
    } else {
        lpto_error(L, who, "a scalar must be an integer, a float or a boolean (got %s)", luaL_typename(L, idx));
        return;
    }
    a->scalars[a->ns] = bits;
    a->scalar_float[a->ns] = is_float;
    a->ns++;
}

static int a_add_tensor(lua_State *L)
{
    lpto_args *a = check_args(L, 1, "TaskArgs:add_tensor");
    lpto_checktensor(L, 2, "TaskArgs:add_tensor");
    int tag = lpto_parse_tag(L, 3, "TaskArgs:add_tensor");
    add_tensor(L, 1, a, 2, tag);
    lua_settop(L, 1);
    return 1;
}

static int a_add_scalar(lua_State *L)
{
    lpto_args *a = check_args(L, 1, "TaskArgs:add_scalar");
    add_scalar(L, 1, a, 2, "TaskArgs:add_scalar");
    lua_settop(L, 1);
    return 1;
}

static lua_Integer check_pos(lua_State *L, int idx, int32_t n, const char *who, const char *what)
{
    int isint;
    lua_Integer i = lua_tointegerx(L, idx, &isint);
    if (!isint) lpto_error(L, who, "index must be an integer (got %s)", luaL_typename(L, idx));
    if (i < 1 || i > n) lpto_error(L, who, "no %s %lld (this TaskArgs has %d, indexed from 1)", what, (long long)i, n);
    return i;
}

static int a_tensor(lua_State *L)
{
    lpto_args *a = check_args(L, 1, "TaskArgs:tensor");
    lua_Integer i = check_pos(L, 2, a->nt, "TaskArgs:tensor", "tensor");
    lpto_args_push_tensor(L, 1, (int32_t)i);
    return 1;
}

static int a_tag(lua_State *L)
{
    lpto_args *a = check_args(L, 1, "TaskArgs:tag");
    lua_Integer i = check_pos(L, 2, a->nt, "TaskArgs:tag", "tensor");
    lua_pushstring(L, pto_tag_name(a->tags[i - 1]));
    return 1;
}

static int a_scalar(lua_State *L)
{
    lpto_args *a = check_args(L, 1, "TaskArgs:scalar");
    lua_Integer i = check_pos(L, 2, a->ns, "TaskArgs:scalar", "scalar");
    uint64_t bits = a->scalars[i - 1];
    if (a->scalar_float[i - 1]) {
        double d;
        memcpy(&d, &bits, sizeof d);
        lua_pushnumber(L, d);
    } else {
        lua_pushinteger(L, (lua_Integer)bits);
    }
    return 1;
}

/* The scalar's 64 bits read as a double: how a float travels through a
 * task (a leaf sees only bits). */
static int a_scalar_float(lua_State *L)
{
    lpto_args *a = check_args(L, 1, "TaskArgs:scalar_float");
    lua_Integer i = check_pos(L, 2, a->ns, "TaskArgs:scalar_float", "scalar");
    double d;
    memcpy(&d, &a->scalars[i - 1], sizeof d);
    lua_pushnumber(L, d);
    return 1;
}

static int a_tensor_count(lua_State *L)
{
    lua_pushinteger(L, check_args(L, 1, "TaskArgs:tensor_count")->nt);
    return 1;
}

static int a_scalar_count(lua_State *L)
{
    lua_pushinteger(L, check_args(L, 1, "TaskArgs:scalar_count")->ns);
    return 1;
}

static int a_clear(lua_State *L)
{
    lpto_args *a = check_args(L, 1, "TaskArgs:clear");
    a->nt = a->ns = 0;
    for (int uv = 1; uv <= UV_ARGS_INLINE + LPTO_ARGS_INLINE; uv++) {   /* let go of the tensors */
        if (uv == 2 || uv == 3) continue;   /* grown arrays stay for reuse */
        lua_pushnil(L);
        lua_setiuservalue(L, 1, uv);
    }
    lua_settop(L, 1);
    return 1;
}

static int a_len(lua_State *L)
{
    lua_pushinteger(L, ((lpto_args *)lua_touserdata(L, 1))->nt);
    return 1;
}

static int a_tostring(lua_State *L)
{
    lpto_args *a = lua_touserdata(L, 1);
    lua_pushfstring(L, "TaskArgs(%d tensors, %d scalars)", (int)a->nt, (int)a->ns);
    return 1;
}

/* The list's scalars field into the TaskArgs at self (the top), which it returns. */
static int args_scalars(lua_State *L, int self, const char *who)
{
    lpto_args *a = lua_touserdata(L, self);
    if (lua_getfield(L, 1, "scalars") != LUA_TNIL) {
        if (!lua_istable(L, -1))
            return lpto_error(L, who, "scalars must be a list of numbers (got %s)", luaL_typename(L, -1));
        int sc = lua_gettop(L);
        for (lua_Integer i = 1;; i++) {
            if (lua_geti(L, sc, i) == LUA_TNIL) break;
            int t = lua_type(L, sc + 1);   /* the message naming the entry is made only for a bad one */
            add_scalar(L, self, a, sc + 1, t == LUA_TNUMBER || t == LUA_TBOOLEAN ? NULL
                                           : lua_pushfstring(L, "pto.args: scalars[%d]", (int)i));
            lua_settop(L, sc);
        }
    }
    lua_settop(L, self);
    return 1;
}

static int l_taskargs(lua_State *L)
{
    push_args_mt(L, lua_upvalueindex(LPTO_UP_ARGS), 0);
    return 1;
}

/* The tag named by the string at idx, by its length and bytes (no strlen:
 * lua_tolstring knows the length), or -1 for anything else, which
 * lpto_tag_value then judges. */
static inline int tag_quick(lua_State *L, int idx)
{
    size_t n;
    const char *s = lua_type(L, idx) == LUA_TSTRING ? lua_tolstring(L, idx, &n) : NULL;
    if (!s) return -1;
    if (n == 2 && s[0] == 'i' && s[1] == 'n') return PTO_INPUT;
    if (n == 3 && memcmp(s, "out", 3) == 0) return PTO_OUTPUT;
    if (n == 5 && memcmp(s, "inout", 5) == 0) return PTO_INOUT;
    return -1;
}

/* Entry e of a plain list into the TaskArgs at self: a tensor, or a
 * {tensor, tag} table without a metatable tagged in, out or inout. False
 * for anything else (left to the general loop, which also raises). */
static inline bool entry_quick(lua_State *L, int self, lpto_args *a, int e)
{
    if (lpto_testudata_up(L, e, LPTO_UP_TENSOR)) {
        add_tensor(L, self, a, e, PTO_INPUT);
        return true;
    }
    if (lua_type(L, e) != LUA_TTABLE || lua_getmetatable(L, e)) return false;
    lua_rawgeti(L, e, 1);
    if (!lpto_testudata_up(L, e + 1, LPTO_UP_TENSOR)) return false;
    lua_rawgeti(L, e, 2);
    int tag = tag_quick(L, e + 2);
    if (tag < 0) return false;
    add_tensor(L, self, a, e + 1, tag);
    return true;
}

/* pto.args for a list without a metatable whose entries are its array in
 * order (as a table constructor makes it): one lua_next pass reads the
 * entries and checks the keys, where the general loop makes one pass to
 * check the keys and then looks every entry up. Leaves the TaskArgs at 2
 * and returns true with *has_scalars set; false (stack back to the list
 * alone) for anything else, which the general loop then builds or rejects
 * with its messages. */
static bool args_quick(lua_State *L, bool *has_scalars)
{
    if (lua_getmetatable(L, 1)) {
        lua_pop(L, 1);
        return false;
    }
    lpto_args *a = push_args_mt(L, lua_upvalueindex(LPTO_UP_ARGS), 0);
    lua_Integer next = 1;
    lua_pushnil(L);
    while (lua_next(L, 1)) {   /* key at 3, value at 4 */
        size_t len;
        if (lua_isinteger(L, 3) && lua_tointeger(L, 3) == next) {
            if (!entry_quick(L, 2, a, 4)) break;
            next++;
        } else if (lua_type(L, 3) == LUA_TSTRING && (lua_tolstring(L, 3, &len), len == 7) &&
                   memcmp(lua_tostring(L, 3), "scalars", 7) == 0) {
            *has_scalars = true;
        } else {
            break;
        }
        lua_settop(L, 3);
    }
    if (lua_gettop(L) == 2) return true;   /* lua_next reached the end */
    lua_settop(L, 1);
    return false;
}

/* pto.args{ {a, "in"}, {b, "in"}, {c, "out"}, scalars = {42} }: a TaskArgs
 * built from a table; a bare tensor entry is an INPUT. */
static int l_args(lua_State *L)
{
    const char *who = "pto.args";
    if (!lua_istable(L, 1))
        return lpto_error(L, who, "expected a table like { {a, \"in\"}, {c, \"out\"}, scalars = {42} } (got %s)",
                          luaL_typename(L, 1));
    lua_settop(L, 1);
    bool quick_scalars = false;
    if (args_quick(L, &quick_scalars)) return quick_scalars ? args_scalars(L, 2, who) : 1;
    lua_Integer n = luaL_len(L, 1);
    lua_pushnil(L);
    bool has_scalars = false;   /* read below only if the key was seen: no lookup by name per call */
    while (lua_next(L, 1)) {
        lua_pop(L, 1);
        int isint;
        lua_Integer k = lua_tointegerx(L, -1, &isint);
        bool ok = lua_type(L, -1) == LUA_TNUMBER ? isint && k >= 1 && k <= n
                                                : lua_type(L, -1) == LUA_TSTRING && strcmp(lua_tostring(L, -1), "scalars") == 0;
        if (ok && lua_type(L, -1) == LUA_TSTRING) has_scalars = true;
        if (!ok)
            return lpto_error(L, who, "unknown field '%s' (entries are {tensor, tag} pairs and an optional scalars list)",
                              luaL_tolstring(L, -1, NULL));
    }
    lpto_args *a = push_args_mt(L, lua_upvalueindex(LPTO_UP_ARGS), (int)(n < 64 ? n : 64));
    int self = lua_gettop(L);
    for (lua_Integer i = 1;; i++) {
        if (lua_geti(L, 1, i) == LUA_TNIL) break;   /* as ipairs */
        int e = lua_gettop(L);
        if (lpto_testudata_up(L, e, LPTO_UP_TENSOR)) {
            add_tensor(L, self, a, e, PTO_INPUT);
        } else if (lua_istable(L, e) && (lua_geti(L, e, 1), lpto_testudata_up(L, -1, LPTO_UP_TENSOR))) {
            lua_geti(L, e, 2);
            int tag = lpto_tag_value(L, e + 2);
            if (tag < 0) lpto_parse_tag(L, e + 2, lua_pushfstring(L, "pto.args: entry %d", (int)i));   /* raises */
            add_tensor(L, self, a, e + 1, tag);
        } else {
            return lpto_error(L, who, "entry %d must be a tensor or {tensor, tag} (got %s)", (int)i, luaL_typename(L, e));
        }
        lua_settop(L, self);
    }
    lua_settop(L, self);
    return has_scalars ? args_scalars(L, self, who) : 1;
}

void lpto_push_args_view(lua_State *L, const pto_args_view *v, int st_idx)
{
    st_idx = lua_absindex(L, st_idx);
    lpto_args *a = lpto_push_args(L);
    int self = lua_gettop(L);
    for (int32_t i = 0; i < v->tensor_count; i++) {
        lpto_push_tensor(L, &v->tensors[i], st_idx);
        add_tensor(L, self, a, lua_gettop(L), PTO_INPUT);
        lua_pop(L, 1);
    }
    for (int32_t i = 0; i < v->scalar_count; i++) {
        lua_pushinteger(L, (lua_Integer)v->scalars[i]);
        add_scalar(L, self, a, lua_gettop(L), "TaskArgs");
        lua_pop(L, 1);
    }
}

/* ---- CallConfig --------------------------------------------------------------- */

static const char *const CFG_FIELDS[] = {"block_dim", "aicpu_thread_num", "enable_l2_swimlane", "enable_dump_tensor",
                                         "enable_pmu", "enable_dep_gen", "output_prefix", NULL};
static const char CFG_LIST[] = "block_dim, aicpu_thread_num, enable_l2_swimlane, enable_dump_tensor, enable_pmu, "
                               "enable_dep_gen, output_prefix";

static int cfg_field(lua_State *L, int idx, const char *who)
{
    if (lua_type(L, idx) == LUA_TSTRING) {
        const char *k = lua_tostring(L, idx);
        for (int i = 0; CFG_FIELDS[i]; i++)
            if (strcmp(k, CFG_FIELDS[i]) == 0) return i;
    }
    return lpto_error(L, who, "unknown field '%s' (fields: %s)", luaL_tolstring(L, idx, NULL), CFG_LIST);
}

static int32_t *cfg_int(pto_call_config *c, int f)
{
    int32_t *v[] = {&c->block_dim, &c->aicpu_thread_num, &c->enable_l2_swimlane, &c->enable_dump_tensor,
                    &c->enable_pmu, &c->enable_dep_gen};
    return v[f];
}

static void cfg_set(lua_State *L, pto_call_config *c, int f, int vidx, const char *who)
{
    if (f == 6) {
        size_t len;
        if (lua_type(L, vidx) != LUA_TSTRING)   /* before lua_tolstring, which would turn a number into a string */
            lpto_error(L, who, "output_prefix must be a string (got %s)", luaL_typename(L, vidx));
        const char *s = lua_tolstring(L, vidx, &len);
        if (len >= sizeof c->output_prefix)
            lpto_error(L, who, "output_prefix is %zu bytes; at most %zu fit", len, sizeof c->output_prefix - 1);
        memcpy(c->output_prefix, s, len + 1);
        return;
    }
    int isint;
    lua_Integer v = lua_isboolean(L, vidx) ? lua_toboolean(L, vidx) : lua_tointegerx(L, vidx, &isint);
    if (!lua_isboolean(L, vidx) && !isint)
        lpto_error(L, who, "%s must be an integer (got %s)", CFG_FIELDS[f], luaL_typename(L, vidx));
    if (v < 0 || v > INT32_MAX) lpto_error(L, who, "%s must be between 0 and %d (got %lld)", CFG_FIELDS[f], INT32_MAX, (long long)v);
    *cfg_int(c, f) = (int32_t)v;
}

static int l_callconfig(lua_State *L)
{
    const char *who = "pto.CallConfig";
    if (!lua_isnoneornil(L, 1) && !lua_istable(L, 1))
        return lpto_error(L, who, "expected a table of fields like {block_dim = 3} (got %s)", luaL_typename(L, 1));
    pto_call_config *c = lua_newuserdatauv(L, sizeof *c, 0);
    memset(c, 0, sizeof *c);
    c->aicpu_thread_num = 3;
    luaL_setmetatable(L, LPTO_CONFIG);
    if (lua_istable(L, 1)) {
        lua_pushnil(L);
        while (lua_next(L, 1)) {
            cfg_set(L, c, cfg_field(L, -2, who), lua_gettop(L), who);
            lua_pop(L, 1);
        }
    }
    return 1;
}

void lpto_push_config(lua_State *L, const pto_call_config *cfg)
{
    pto_call_config *c = lua_newuserdatauv(L, sizeof *c, 0);
    if (cfg) {
        *c = *cfg;
    } else {
        memset(c, 0, sizeof *c);
        c->aicpu_thread_num = 3;
    }
    luaL_setmetatable(L, LPTO_CONFIG);
}

const pto_call_config *lpto_optconfig(lua_State *L, int idx, const char *who)
{
    if (lua_isnoneornil(L, idx)) return NULL;
    pto_call_config *c = luaL_testudata(L, idx, LPTO_CONFIG);
    if (!c) lpto_error(L, who, "expected a CallConfig from pto.CallConfig{...} or nil (got %s)", luaL_typename(L, idx));
    return c;
}

static int c_index(lua_State *L)
{
    pto_call_config *c = lua_touserdata(L, 1);
    int f = cfg_field(L, 2, "CallConfig");
    if (f == 6) lua_pushstring(L, c->output_prefix);
    else lua_pushinteger(L, *cfg_int(c, f));
    return 1;
}

static int c_newindex(lua_State *L)
{
    pto_call_config *c = lua_touserdata(L, 1);
    cfg_set(L, c, cfg_field(L, 2, "CallConfig"), 3, "CallConfig");
    return 0;
}

static int c_tostring(lua_State *L)
{
    pto_call_config *c = lua_touserdata(L, 1);
    lua_pushfstring(L, "CallConfig{block_dim = %d, aicpu_thread_num = %d, enable_l2_swimlane = %d, enable_dump_tensor = %d, "
                       "enable_pmu = %d, enable_dep_gen = %d, output_prefix = \"%s\"}",
                    (int)c->block_dim, (int)c->aicpu_thread_num, (int)c->enable_l2_swimlane, (int)c->enable_dump_tensor,
                    (int)c->enable_pmu, (int)c->enable_dep_gen, c->output_prefix);
    return 1;
}

void lpto_open_args(lua_State *L)
{
    luaL_newmetatable(L, LPTO_ARGS);
    static const luaL_Reg meta[] = {{"__len", a_len}, {"__tostring", a_tostring}, {NULL, NULL}};
    luaL_setfuncs(L, meta, 0);
    static const luaL_Reg methods[] = {
        {"add_tensor", a_add_tensor}, {"add_scalar", a_add_scalar}, {"tensor", a_tensor},
        {"scalar", a_scalar},         {"scalar_float", a_scalar_float}, {"tag", a_tag},
        {"tensor_count", a_tensor_count}, {"scalar_count", a_scalar_count}, {"clear", a_clear},
        {NULL, NULL}};
    lua_newtable(L);
    lpto_push_mt_upvalues(L);
    luaL_setfuncs(L, methods, LPTO_UP_COUNT);
    lua_setfield(L, -2, "__index");
    lua_pop(L, 1);

    luaL_newmetatable(L, LPTO_CONFIG);
    static const luaL_Reg cmeta[] = {
        {"__index", c_index}, {"__newindex", c_newindex}, {"__tostring", c_tostring}, {NULL, NULL}};
    luaL_setfuncs(L, cmeta, 0);
    lua_pop(L, 1);

    static const luaL_Reg fns[] = {{"TaskArgs", l_taskargs}, {"args", l_args}, {NULL, NULL}};
    lpto_push_mt_upvalues(L);
    luaL_setfuncs(L, fns, LPTO_UP_COUNT);
    lua_pushcfunction(L, l_callconfig);
    lua_setfield(L, -2, "CallConfig");
}
