/* lpto_tensor.c - pto.tensor, pto.tensor_spec and the Tensor methods.
 * Element access converts between Lua numbers and the tensor's dtype. */
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "lpto_priv.h"

/* Tags and dtypes are matched by length and bytes: a submit parses tags
 * often, and a loop of strcmp over every name showed in profiles. */
static int tag_of(const char *s, size_t n)
{
    switch (n) {
    case 2: return memcmp(s, "in", 2) == 0 ? PTO_INPUT : -1;
    case 3: return memcmp(s, "out", 3) == 0 ? PTO_OUTPUT : -1;
    case 5: return memcmp(s, "inout", 5) == 0 ? PTO_INOUT : -1;
    case 6: return memcmp(s, "no_dep", 6) == 0 ? PTO_NO_DEP : -1;
    case 12: return memcmp(s, "out_existing", 12) == 0 ? PTO_OUTPUT_EXISTING : -1;
    default: return -1;
    }
}

int lpto_tag_value(lua_State *L, int idx)
{
    int t = lua_type(L, idx);
    if (t == LUA_TSTRING) {
        const char *s = lua_tostring(L, idx);
        return tag_of(s, strlen(s));   /* strlen: a name ends at a NUL, as strcmp saw it */
    }
    if (t == LUA_TNUMBER) {
        lua_Integer v;
        if (lua_isinteger(L, idx) && (v = lua_tointeger(L, idx)) >= PTO_INPUT && v <= PTO_NO_DEP) return (int)v;
        return -1;
    }
    return t == LUA_TNIL || t == LUA_TNONE ? PTO_INPUT : -1;
}

int lpto_parse_tag(lua_State *L, int idx, const char *who)
{
    int tag = lpto_tag_value(L, idx);
    if (tag >= 0) return tag;
    return lpto_error(L, who, "unknown tag %s '%s' (use pto.INPUT, pto.OUTPUT, pto.INOUT, pto.OUTPUT_EXISTING, "
                              "pto.NO_DEP or \"in\", \"out\", \"inout\", \"out_existing\", \"no_dep\")",
                      luaL_typename(L, idx), luaL_tolstring(L, idx, NULL));
}

int lpto_parse_dtype(lua_State *L, int idx, const char *who)
{
    if (lua_isnoneornil(L, idx)) return PTO_F32;
    if (lua_type(L, idx) == LUA_TSTRING) {
        size_t n;
        const char *s = lua_tolstring(L, idx, &n);
        if (n == 3 && memcmp(s, "f32", 3) == 0) return PTO_F32;   /* the common case first, per orch:alloc */
        n = strlen(s);   /* a name ends at a NUL, as strcmp saw it */
        if (n == 3 && memcmp(s, "f32", 3) == 0) return PTO_F32;
        for (int d = 0; d < PTO_DTYPE_COUNT; d++) {
            const char *name = pto_dtype_name(d);
            if (strlen(name) == n && memcmp(s, name, n) == 0) return d;
        }
    }
    return lpto_error(L, who, "unknown dtype '%s' (use one of \"f32\" \"f16\" \"bf16\" \"f64\" \"i8\" \"i16\" "
                              "\"i32\" \"i64\" \"u8\" \"u16\" \"u32\" \"u64\" \"bool\", or pto.FLOAT32 etc.)",
                      luaL_tolstring(L, idx, NULL));
}

int lpto_parse_shape(lua_State *L, int idx, uint32_t shape[PTO_MAX_DIMS], const char *who)
{
    idx = lua_absindex(L, idx);
    if (lua_type(L, idx) == LUA_TNUMBER) {   /* a bare length: 1-D, read in place (no table) */
        int isint;
        lua_Integer d = lua_tointegerx(L, idx, &isint);
        if (!isint) return lpto_error(L, who, "shape[1] must be an integer (got %s)", luaL_typename(L, idx));
        if (d < 0 || d > UINT32_MAX)
            return lpto_error(L, who, "shape[1] must be between 0 and %u (got %lld)", UINT32_MAX, (long long)d);
        memset(shape, 0, PTO_MAX_DIMS * sizeof *shape);
        shape[0] = (uint32_t)d;
        return 1;
    }
    if (!lua_istable(L, idx))
        return lpto_error(L, who, "shape must be a table of dimension sizes like {4, 8} (got %s)",
                          luaL_typename(L, idx));
    /* Shapes are made per view and per orch:alloc: a table without a
     * metatable is read raw, which is what luaL_len and lua_geti do with it
     * but a step shorter each. */
    bool raw = !lua_getmetatable(L, idx);
    if (!raw) lua_pop(L, 1);
    lua_Integer n = raw ? (lua_Integer)lua_rawlen(L, idx) : luaL_len(L, idx);
    if (n < 1 || n > PTO_MAX_DIMS)
        return lpto_error(L, who, "shape must have 1 to %d dimensions (got %lld)", PTO_MAX_DIMS, (long long)n);
    uint64_t numel = 1;
    for (lua_Integer i = 1; i <= n; i++) {
        if (raw) lua_rawgeti(L, idx, i);
        else lua_geti(L, idx, i);
        int isint;
        lua_Integer d = lua_tointegerx(L, -1, &isint);
        if (!isint)
            return lpto_error(L, who, "shape[%lld] must be an integer (got %s)", (long long)i, luaL_typename(L, -1));
        if (d < 0 || d > UINT32_MAX)
            return lpto_error(L, who, "shape[%lld] must be between 0 and %u (got %lld)", (long long)i, UINT32_MAX,
                              (long long)d);
        shape[i - 1] = (uint32_t)d;
        numel *= (uint64_t)d;
        if (numel > (1ull << 46)) return lpto_error(L, who, "shape is too large (more than 2^46 elements)");
        lua_pop(L, 1);
    }
    for (int i = (int)n; i < PTO_MAX_DIMS; i++) shape[i] = 0;
    return (int)n;
}

/* ---- storage ---------------------------------------------------------------------- */

static int storage_gc(lua_State *L)
{
    lpto_storage *s = lua_touserdata(L, 1);
    if (s->kind == LPTO_ST_ARENA && s->base) pto_shm_free((void *)(uintptr_t)s->base);
    if (s->kind == LPTO_ST_PRIVATE) free((void *)(uintptr_t)s->base);
    s->base = 0;
    s->valid = false;
    return 0;
}

lpto_storage *lpto_push_storage(lua_State *L, uint64_t base, uint64_t nbytes, int kind)
{
    lpto_storage *s = lua_newuserdatauv(L, sizeof *s, 0);
    *s = (lpto_storage){.base = base, .nbytes = nbytes, .kind = kind, .valid = true};
    /* Only owned memory needs the finalizer; heap-ring and borrowed storage
     * (one per orch:alloc) skip the collector's finalizer round. */
    if (kind == LPTO_ST_ARENA || kind == LPTO_ST_PRIVATE) luaL_setmetatable(L, LPTO_STORAGE);
    return s;
}

/* ---- tensors ------------------------------------------------------------------------- */

lpto_tensor *lpto_totensor(lua_State *L, int idx) { return luaL_testudata(L, idx, LPTO_TENSOR); }

lpto_tensor *lpto_checktensor(lua_State *L, int idx, const char *who)
{
    lpto_tensor *t = lpto_totensor(L, idx);
    if (!t) lpto_error(L, who, "expected a tensor (from pto.tensor, pto.tensor_spec or orch:alloc), got %s",
                       luaL_typename(L, idx));
    return t;
}

const char lpto_ring_gone[] = "it came from a heap ring (orch:alloc or an automatic OUTPUT) and lives only until "
                              "its scope ends; copy it into a pto.tensor inside the scope to keep it";

void lpto_push_mt_upvalues(lua_State *L)
{
    static const char *const names[LPTO_UP_COUNT] = {LPTO_TENSOR, LPTO_ARGS, LPTO_ORCH, LPTO_HANDLE, LPTO_SCOPE};
    for (int i = 0; i < LPTO_UP_COUNT; i++) luaL_newmetatable(L, names[i]);
}

lpto_tensor *lpto_push_tensor_mt(lua_State *L, const pto_tensor *desc, int st_idx, int mt_idx)
{
    st_idx = lua_absindex(L, st_idx);
    mt_idx = lua_absindex(L, mt_idx);
    lpto_tensor *t = lua_newuserdatauv(L, sizeof *t, 1);
    t->t = *desc;
    t->st = lua_isnil(L, st_idx) ? NULL : lua_touserdata(L, st_idx);
    lua_pushvalue(L, st_idx);
    lua_setiuservalue(L, -2, 1);
    lua_pushvalue(L, mt_idx);
    lua_setmetatable(L, -2);
    return t;
}

lpto_tensor *lpto_push_tensor(lua_State *L, const pto_tensor *desc, int st_idx)
{
    st_idx = lua_absindex(L, st_idx);
    luaL_getmetatable(L, LPTO_TENSOR);
    lpto_tensor *t = lpto_push_tensor_mt(L, desc, st_idx, -1);
    lua_remove(L, -2);
    return t;
}

void lpto_check_live(lua_State *L, const lpto_tensor *t, const char *who)
{
    if (!t->st)
        lpto_error(L, who, "this tensor is a pto.tensor_spec with no storage yet; pass it as an OUTPUT to a submit "
                           "first (the submit allocates it)");
    if (!t->st->valid)
        lpto_error(L, who, "this tensor's storage is gone: %s",
                   t->st->why_invalid ? t->st->why_invalid : "it is no longer valid");
}

static uint64_t numel_of(const lpto_tensor *t) { return pto_tensor_numel(&t->t); }

static void *elem_ptr(const lpto_tensor *t, uint64_t i)
{
    return (char *)(uintptr_t)(t->t.base + t->t.offset) + i * pto_dtype_size(t->t.dtype);
}

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0) {
        if (mant == 0) bits = sign;
        else {   /* subnormal: renormalise */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400)) mant <<= 1, exp--;
            bits = sign | exp << 23 | (mant & 0x3ff) << 13;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | mant << 13;
    } else {
        bits = sign | (exp + 127 - 15) << 23 | mant << 13;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t float_to_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t mant = x & 0x7fffff;
    if (((x >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10) return sign;
        mant |= 0x800000;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = mant >> shift, rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = (uint32_t)exp << 10 | mant >> 13, rem = mant & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++;   /* may carry into the exponent: correct */
    return (uint16_t)(sign | half);
}

static float bf16_to_float(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t float_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

static void push_elem(lua_State *L, const lpto_tensor *t, uint64_t i)
{
    void *p = elem_ptr(t, i);
    switch (t->t.dtype) {
    case PTO_F32: lua_pushnumber(L, *(float *)p); break;
    case PTO_F64: lua_pushnumber(L, *(double *)p); break;
    case PTO_F16: lua_pushnumber(L, half_to_float(*(uint16_t *)p)); break;
    case PTO_BF16: lua_pushnumber(L, bf16_to_float(*(uint16_t *)p)); break;
    case PTO_I8: lua_pushinteger(L, *(int8_t *)p); break;
    case PTO_I16: lua_pushinteger(L, *(int16_t *)p); break;
    case PTO_I32: lua_pushinteger(L, *(int32_t *)p); break;
    case PTO_I64: lua_pushinteger(L, *(int64_t *)p); break;
    case PTO_U8: lua_pushinteger(L, *(uint8_t *)p); break;
    case PTO_U16: lua_pushinteger(L, *(uint16_t *)p); break;
    case PTO_U32: lua_pushinteger(L, *(uint32_t *)p); break;
    case PTO_U64: lua_pushinteger(L, (lua_Integer) * (uint64_t *)p); break;
    case PTO_BOOL: lua_pushboolean(L, *(uint8_t *)p != 0); break;
    }
}

/* Convert the Lua value at idx for dtype into buf (up to 8 bytes). */
static void to_elem(lua_State *L, int idx, int dtype, void *buf, const char *who)
{
    if (dtype == PTO_BOOL) {
        if (!lua_isboolean(L, idx) && !lua_isnumber(L, idx))
            lpto_error(L, who, "a bool tensor takes true/false or a number (got %s)", luaL_typename(L, idx));
        *(uint8_t *)buf = lua_isboolean(L, idx) ? lua_toboolean(L, idx) : lua_tonumber(L, idx) != 0;
        return;
    }
    int isnum;
    if (dtype == PTO_F32 || dtype == PTO_F64 || dtype == PTO_F16 || dtype == PTO_BF16) {
        lua_Number v = lua_tonumberx(L, idx, &isnum);
        if (!isnum) lpto_error(L, who, "a %s tensor takes numbers (got %s)", pto_dtype_name(dtype), luaL_typename(L, idx));
        switch (dtype) {
        case PTO_F32: *(float *)buf = (float)v; break;
        case PTO_F64: *(double *)buf = v; break;
        case PTO_F16: *(uint16_t *)buf = float_to_half((float)v); break;
        default: *(uint16_t *)buf = float_to_bf16((float)v); break;
        }
        return;
    }
    lua_Integer v = lua_tointegerx(L, idx, &isnum);
    if (!isnum) {
        if (lua_type(L, idx) == LUA_TNUMBER)
            lpto_error(L, who, "a %s tensor takes integers (got %s, which has no integer representation)",
                       pto_dtype_name(dtype), lua_tostring(L, idx));
        lpto_error(L, who, "a %s tensor takes integers (got %s)", pto_dtype_name(dtype), luaL_typename(L, idx));
    }
    switch (dtype) {   /* two's-complement wrap, as a C cast would on this ABI */
    case PTO_I8: case PTO_U8: *(uint8_t *)buf = (uint8_t)v; break;
    case PTO_I16: case PTO_U16: *(uint16_t *)buf = (uint16_t)v; break;
    case PTO_I32: case PTO_U32: *(uint32_t *)buf = (uint32_t)v; break;
    default: *(uint64_t *)buf = (uint64_t)v; break;
    }
}

static uint64_t check_index(lua_State *L, const lpto_tensor *t, int idx, const char *who)
{
    lua_Integer i = lua_tointeger(L, idx);
    uint64_t n = numel_of(t);
    if (i < 1 || (uint64_t)i > n)
        lpto_error(L, who, "index %lld is out of range (the tensor has %llu elements, indexed 1..%llu)", (long long)i,
                   (unsigned long long)n, (unsigned long long)n);
    return (uint64_t)i - 1;
}

static int push_shape(lua_State *L, const pto_tensor *t)
{
    lua_createtable(L, t->ndims, 0);
    for (int i = 0; i < t->ndims; i++) {
        lua_pushinteger(L, t->shape[i]);
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

/* Field ids of the Tensor's named fields, the values of the key table (an
 * upvalue of t_index, which maps methods to their functions as well), so a
 * key costs one table lookup. */
enum { F_SHAPE = 1, F_DTYPE, F_NDIMS, F_NUMEL, F_NBYTES, F_OFFSET, F_IS_SET, F_ADDRESS };
static const char *const FIELD_NAMES[] = {NULL, "shape", "dtype", "ndims", "numel", "nbytes", "offset", "is_set", "address", NULL};

static int t_index(lua_State *L)
{
    lpto_tensor *t = lua_touserdata(L, 1);
    if (lua_type(L, 2) == LUA_TNUMBER) {
        int isint;
        lua_tointegerx(L, 2, &isint);   /* 3.0 indexes like 3, as for tables */
        if (!isint) return lpto_error(L, "Tensor", "index must be an integer (got %s)", lua_tostring(L, 2));
        lpto_check_live(L, t, "Tensor");
        push_elem(L, t, check_index(L, t, 2, "Tensor"));
        return 1;
    }
    lua_settop(L, 2);
    if (lua_rawget(L, lua_upvalueindex(1)) != LUA_TNUMBER) return 1;   /* a method, or nil */
    switch (lua_tointeger(L, -1)) {
    case F_SHAPE: return push_shape(L, &t->t);
    case F_DTYPE: return lua_pushstring(L, pto_dtype_name(t->t.dtype)), 1;
    case F_NDIMS: return lua_pushinteger(L, t->t.ndims), 1;
    case F_NUMEL: return lua_pushinteger(L, (lua_Integer)numel_of(t)), 1;
    case F_NBYTES: return lua_pushinteger(L, (lua_Integer)pto_tensor_nbytes(&t->t)), 1;
    case F_OFFSET:   /* in elements, from the start of the storage */
        return lua_pushinteger(L, (lua_Integer)(t->t.offset / pto_dtype_size(t->t.dtype))), 1;
    case F_IS_SET: return lua_pushboolean(L, t->st != NULL && (!t->st->temp || t->st->base)), 1;
    default: return lua_pushinteger(L, (lua_Integer)(t->t.base + t->t.offset)), 1;
    }
}

static int t_newindex(lua_State *L)
{
    lpto_tensor *t = lua_touserdata(L, 1);
    int isint = 0;
    if (lua_type(L, 2) == LUA_TNUMBER) lua_tointegerx(L, 2, &isint);
    if (!isint)
        return lpto_error(L, "Tensor", "only elements can be assigned, as t[i] = v with an integer i (got key %s)",
                          luaL_tolstring(L, 2, NULL));
    lpto_check_live(L, t, "Tensor");
    uint64_t i = check_index(L, t, 2, "Tensor");
    uint64_t buf = 0;
    to_elem(L, 3, t->t.dtype, &buf, "Tensor");
    memcpy(elem_ptr(t, i), &buf, pto_dtype_size(t->t.dtype));
    return 0;
}

static int t_len(lua_State *L)
{
    lpto_tensor *t = lua_touserdata(L, 1);
    lua_pushinteger(L, (lua_Integer)numel_of(t));
    return 1;
}

static int t_tostring(lua_State *L)
{
    lpto_tensor *t = lua_touserdata(L, 1);
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    luaL_addstring(&b, "tensor(");
    luaL_addstring(&b, pto_dtype_name(t->t.dtype));
    luaL_addstring(&b, ", {");
    for (int i = 0; i < t->t.ndims; i++) {
        char d[16];
        snprintf(d, sizeof d, i ? ", %u" : "%u", t->t.shape[i]);
        luaL_addstring(&b, d);
    }
    luaL_addstring(&b, "}");
    if (!t->st || (t->st->temp && !t->st->base)) luaL_addstring(&b, ", unset)");
    else if (!t->st->valid) luaL_addstring(&b, ", released)");
    else {
        luaL_addstring(&b, ") [");
        uint64_t n = numel_of(t), show = n < 8 ? n : 8;
        for (uint64_t i = 0; i < show; i++) {
            if (i) luaL_addstring(&b, ", ");
            if (t->t.dtype == PTO_BOOL) {   /* luaL_addvalue takes only strings and numbers */
                luaL_addstring(&b, *(uint8_t *)elem_ptr(t, i) ? "true" : "false");
                continue;
            }
            push_elem(L, t, i);
            luaL_addvalue(&b);   /* tostring of a number */
        }
        if (show < n) luaL_addstring(&b, ", ...");
        luaL_addstring(&b, "]");
    }
    luaL_pushresult(&b);
    return 1;
}

static int t_fill(lua_State *L)
{
    lpto_tensor *t = lpto_checktensor(L, 1, "Tensor:fill");
    lpto_check_live(L, t, "Tensor:fill");
    uint64_t buf = 0, n = numel_of(t);
    size_t es = pto_dtype_size(t->t.dtype);
    to_elem(L, 2, t->t.dtype, &buf, "Tensor:fill");
    char *p = elem_ptr(t, 0);
    if (buf == 0) memset(p, 0, n * es);
    else if (es == 4) for (uint64_t i = 0; i < n; i++) memcpy(p + i * 4, &buf, 4);
    else for (uint64_t i = 0; i < n; i++) memcpy(p + i * es, &buf, es);
    lua_settop(L, 1);
    return 1;
}

static int t_totable(lua_State *L)
{
    lpto_tensor *t = lpto_checktensor(L, 1, "Tensor:totable");
    lpto_check_live(L, t, "Tensor:totable");
    uint64_t n = numel_of(t);
    if (n > INT32_MAX) return lpto_error(L, "Tensor:totable", "tensor too large for a table (%llu elements)", (unsigned long long)n);
    lua_createtable(L, (int)n, 0);
    for (uint64_t i = 0; i < n; i++) {
        push_elem(L, t, i);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    return 1;
}

static int t_copy_from(lua_State *L)
{
    const char *who = "Tensor:copy_from";
    lpto_tensor *t = lpto_checktensor(L, 1, who);
    lpto_check_live(L, t, who);
    uint64_t n = numel_of(t);
    lpto_tensor *src = lpto_totensor(L, 2);
    if (src) {
        lpto_check_live(L, src, who);
        if (numel_of(src) != n)
            return lpto_error(L, who, "source has %llu elements, this tensor %llu; they must match",
                              (unsigned long long)numel_of(src), (unsigned long long)n);
        if (src->t.dtype == t->t.dtype) {
            memmove(elem_ptr(t, 0), elem_ptr(src, 0), n * pto_dtype_size(t->t.dtype));
        } else {
            for (uint64_t i = 0; i < n; i++) {
                uint64_t buf = 0;
                push_elem(L, src, i);
                to_elem(L, -1, t->t.dtype, &buf, who);
                memcpy(elem_ptr(t, i), &buf, pto_dtype_size(t->t.dtype));
                lua_pop(L, 1);
            }
        }
    } else if (lua_istable(L, 2)) {
        lua_Integer len = luaL_len(L, 2);
        if ((uint64_t)len != n)
            return lpto_error(L, who, "table has %lld values, the tensor %llu elements; they must match",
                              (long long)len, (unsigned long long)n);
        for (uint64_t i = 0; i < n; i++) {
            uint64_t buf = 0;
            lua_geti(L, 2, (lua_Integer)i + 1);
            to_elem(L, -1, t->t.dtype, &buf, who);
            memcpy(elem_ptr(t, i), &buf, pto_dtype_size(t->t.dtype));
            lua_pop(L, 1);
        }
    } else {
        return lpto_error(L, who, "expected a tensor or a table of numbers (got %s)", luaL_typename(L, 2));
    }
    lua_settop(L, 1);
    return 1;
}

/* The positional form t:view(offset, d1, d2, ...) reads its numbers off the
 * stack: no table to build or parse, for views made in loops. */
static void view_positional(lua_State *L, pto_tensor *v, const char *who)
{
    int n = lua_gettop(L) - 2;
    if (n < 1 || n > PTO_MAX_DIMS)
        lpto_error(L, who, "shape must have 1 to %d dimensions (got %d)", PTO_MAX_DIMS, n < 0 ? 0 : n);
    uint64_t numel = 1;
    memset(v->shape, 0, sizeof v->shape);
    for (int i = 0; i < n; i++) {
        int isint;
        lua_Integer d = lua_tointegerx(L, 3 + i, &isint);
        if (!isint) lpto_error(L, who, "shape[%d] must be an integer (got %s)", i + 1, luaL_typename(L, 3 + i));
        if (d < 0 || d > UINT32_MAX)
            lpto_error(L, who, "shape[%d] must be between 0 and %u (got %lld)", i + 1, UINT32_MAX, (long long)d);
        v->shape[i] = (uint32_t)d;
        numel *= (uint64_t)d;
        if (numel > (1ull << 46)) lpto_error(L, who, "shape is too large (more than 2^46 elements)");
    }
    v->ndims = (uint8_t)n;
}

/* Push the fields offset and shape of the table at 2 (nil if absent),
 * raising for any other key. One pass over the table's keys, as
 * lpto_check_fields and two lua_getfield would make three: views are made
 * per tile in loops. A table with a metatable gets exactly those calls,
 * whose __index a raw pass would not see. */
static void view_fields(lua_State *L, const char *who)
{
    static const lpto_field fields[] = {{"offset", 1, 0}, {"shape", 1, 0}, {NULL, 0, 0}};
    if (lua_getmetatable(L, 2)) {
        lua_pop(L, 1);
        lpto_check_fields(L, 2, fields, who);
        lua_getfield(L, 2, "offset");
        lua_getfield(L, 2, "shape");
        return;
    }
    lua_pushnil(L);
    lua_pushnil(L);
    int base = lua_gettop(L);   /* offset at base - 1, shape at base */
    lua_pushnil(L);
    while (lua_next(L, 2)) {
        size_t len = 0;
        const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tolstring(L, -2, &len) : NULL;
        if (k && len == 6 && memcmp(k, "offset", 6) == 0) lua_replace(L, base - 1);
        else if (k && len == 5 && memcmp(k, "shape", 5) == 0) lua_replace(L, base);
        else lpto_check_fields(L, 2, fields, who);   /* raises, naming the key */
    }
}

/* t:view{offset = k, shape = {...}} or t:view(k, d1, d2, ...): k in elements from the start of t. */
static int t_view(lua_State *L)
{
    const char *who = "Tensor:view";
    lpto_tensor *t = lpto_testudata_up(L, 1, LPTO_UP_TENSOR);
    if (!t) t = lpto_checktensor(L, 1, who);
    if (!t->st) return lpto_error(L, who, "an unset pto.tensor_spec has no storage to view; submit it as an OUTPUT first");
    if (t->st->temp)
        return lpto_error(L, who, "a pto.temp cannot be viewed: every submit that writes it moves it to new memory; "
                                  "view a tensor from orch:alloc instead");
    pto_tensor v = t->t;
    lua_Integer off;
    int isint = 1;
    if (lua_type(L, 2) == LUA_TNUMBER) {
        off = lua_tointegerx(L, 2, &isint);
        if (!isint) return lpto_error(L, who, "offset must be an integer count of elements (got %s)", luaL_typename(L, 2));
        if (lua_gettop(L) == 2)
            return lpto_error(L, who, "expected a table like {offset = k, shape = {...}}, or the offset followed by "
                                      "the shape as t:view(k, rows, cols) (got an offset and no shape)");
        view_positional(L, &v, who);
    } else {
        if (!lua_istable(L, 2))
            return lpto_error(L, who, "expected a table like {offset = k, shape = {...}} (got %s)", luaL_typename(L, 2));
        view_fields(L, who);   /* pushes offset, shape */
        off = lua_isnil(L, -2) ? 0 : lua_tointegerx(L, -2, &isint);
        if (!isint) return lpto_error(L, who, "offset must be an integer count of elements (got %s)", luaL_typename(L, -2));
        if (lua_isnil(L, -1)) {
            if (off < 0 || (uint64_t)off > numel_of(t))
                return lpto_error(L, who, "offset %lld is outside the tensor's %llu elements", (long long)off,
                                  (unsigned long long)numel_of(t));
            v.ndims = 1;
            memset(v.shape, 0, sizeof v.shape);
            v.shape[0] = (uint32_t)(numel_of(t) - (uint64_t)off);
        } else {
            v.ndims = (uint8_t)lpto_parse_shape(L, lua_gettop(L), v.shape, who);
        }
    }
    uint64_t es = pto_dtype_size(t->t.dtype), n = pto_tensor_numel(&v);
    if (off < 0 || (uint64_t)off + n > numel_of(t))
        return lpto_error(L, who, "elements %lld..%llu are outside the tensor's %llu elements (offset and shape count "
                                  "in elements from the start of this tensor)",
                          (long long)off + 1, (unsigned long long)((uint64_t)off + n), (unsigned long long)numel_of(t));
    v.offset = t->t.offset + (uint64_t)off * es;
    lua_getiuservalue(L, 1, 1);
    lpto_push_tensor_mt(L, &v, -1, lua_upvalueindex(LPTO_UP_TENSOR));
    return 1;
}

static int new_tensor(lua_State *L, bool spec)
{
    const char *who = spec ? "pto.tensor_spec" : "pto.tensor";
    pto_tensor d = {0};
    d.ndims = (uint8_t)lpto_parse_shape(L, 1, d.shape, who);
    d.dtype = (uint8_t)lpto_parse_dtype(L, 2, who);
    if (spec) {
        lua_pushnil(L);
        lpto_push_tensor(L, &d, -1);
        return 1;
    }
    uint64_t nbytes = pto_tensor_nbytes(&d);
    int kind = LPTO_ST_ARENA;
    void *p;
    if (pto_shm_is_child()) {
        /* Inside a PROCESS-mode sub: scratch memory of this child only
         * (a sub cannot submit, so nobody else could use a shared one). */
        kind = LPTO_ST_PRIVATE;
        p = calloc(1, nbytes ? nbytes : 1);
        if (!p) return lpto_error(L, who, "out of memory for %llu bytes", (unsigned long long)nbytes);
    } else {
        p = pto_shm_alloc(nbytes ? nbytes : 1);
        if (!p) return lpto_engine_error(L, who);
    }
    d.base = (uint64_t)(uintptr_t)p;
    lpto_push_storage(L, d.base, nbytes, kind);
    lpto_check_note(L, -1);
    lpto_push_tensor(L, &d, -1);
    return 1;
}

static int l_tensor(lua_State *L) { return new_tensor(L, false); }

/* pto.temp(shape [, dtype]): a reusable temporary. Every submit that passes
 * it tagged OUTPUT gives it new heap-ring memory, as an unset tensor_spec
 * gets once; it then reads that memory until the scope of that submit ends.
 * One temporary serves a whole loop of producer/consumer pairs without a
 * new tensor per iteration. */
static int l_temp(lua_State *L)
{
    const char *who = "pto.temp";
    pto_tensor d = {0};
    d.ndims = (uint8_t)lpto_parse_shape(L, 1, d.shape, who);
    d.dtype = (uint8_t)lpto_parse_dtype(L, 2, who);
    lpto_storage *st = lpto_push_storage(L, 0, pto_tensor_nbytes(&d), LPTO_ST_RING);
    st->temp = true;
    st->valid = false;
    st->why_invalid = "it is a pto.temp that no submit has written yet; pass it tagged 'out' to a submit first";
    lpto_push_tensor(L, &d, -1);
    return 1;
}
static int l_tensor_spec(lua_State *L) { return new_tensor(L, true); }

static int l_is_tensor(lua_State *L)
{
    lua_pushboolean(L, lpto_testudata_up(L, 1, LPTO_UP_TENSOR) != NULL);
    return 1;
}

/* pto.shm_stats() -> {reserved_bytes, in_use_bytes, hwm_bytes, live_blocks}: the shared tensor memory. */
static int l_shm_stats(lua_State *L)
{
    pto_shm_stats s;
    pto_shm_stats_get(&s);
    lua_createtable(L, 0, 4);
    lpto_set_int(L, "reserved_bytes", (lua_Integer)s.reserved_bytes);
    lpto_set_int(L, "in_use_bytes", (lua_Integer)s.in_use_bytes);
    lpto_set_int(L, "hwm_bytes", (lua_Integer)s.hwm_bytes);
    lpto_set_int(L, "live_blocks", (lua_Integer)s.live_blocks);
    return 1;
}

/* pto.INPUT ... pto.NO_DEP, pto.FLOAT32 ... pto.BOOL, pto.MAX_DIMS. */
static void set_constants(lua_State *L)
{
    lpto_set_int(L, "INPUT", PTO_INPUT);
    lpto_set_int(L, "OUTPUT", PTO_OUTPUT);
    lpto_set_int(L, "INOUT", PTO_INOUT);
    lpto_set_int(L, "OUTPUT_EXISTING", PTO_OUTPUT_EXISTING);
    lpto_set_int(L, "NO_DEP", PTO_NO_DEP);
    static const struct { const char *name; const char *dtype; } dtypes[] = {
        {"FLOAT32", "f32"}, {"FLOAT16", "f16"}, {"BFLOAT16", "bf16"}, {"FLOAT64", "f64"},
        {"INT8", "i8"}, {"INT16", "i16"}, {"INT32", "i32"}, {"INT64", "i64"},
        {"UINT8", "u8"}, {"UINT16", "u16"}, {"UINT32", "u32"}, {"UINT64", "u64"}, {"BOOL", "bool"},
    };
    for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++) {
        lua_pushstring(L, dtypes[i].dtype);
        lua_setfield(L, -2, dtypes[i].name);
    }
    lpto_set_int(L, "MAX_DIMS", PTO_MAX_DIMS);
}

void lpto_open_tensor(lua_State *L)
{
    set_constants(L);
    luaL_newmetatable(L, LPTO_STORAGE);
    lua_pushcfunction(L, storage_gc);
    lua_setfield(L, -2, "__gc");
    lua_pop(L, 1);

    luaL_newmetatable(L, LPTO_TENSOR);
    static const luaL_Reg meta[] = {{"__newindex", t_newindex}, {"__len", t_len}, {"__tostring", t_tostring}, {NULL, NULL}};
    luaL_setfuncs(L, meta, 0);
    static const luaL_Reg methods[] = {
        {"fill", t_fill}, {"totable", t_totable}, {"copy_from", t_copy_from}, {"view", t_view}, {NULL, NULL}};
    lua_newtable(L);
    lpto_push_mt_upvalues(L);
    luaL_setfuncs(L, methods, LPTO_UP_COUNT);
    lua_pushvalue(L, -1);
    lua_setfield(L, -3, "methods");   /* for the REPL's completion */
    lua_newtable(L);   /* the key table: method name -> function, field name -> field id */
    for (int i = 0; methods[i].name; i++) {
        lua_getfield(L, -2, methods[i].name);
        lua_setfield(L, -2, methods[i].name);
    }
    for (int f = F_SHAPE; FIELD_NAMES[f]; f++) lpto_set_int(L, FIELD_NAMES[f], f);
    lua_remove(L, -2);
    lua_pushcclosure(L, t_index, 1);
    lua_setfield(L, -2, "__index");
    lua_pop(L, 1);

    static const luaL_Reg fns[] = {
        {"tensor", l_tensor}, {"tensor_spec", l_tensor_spec}, {"temp", l_temp}, {"is_tensor", l_is_tensor},
        {"shm_stats", l_shm_stats}, {NULL, NULL}};
    lpto_push_mt_upvalues(L);
    luaL_setfuncs(L, fns, LPTO_UP_COUNT);
}
