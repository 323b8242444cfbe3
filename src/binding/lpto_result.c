/* lpto_result.c - results from every level: what a level-3 (or any lower
 * level's) orchestration function returns reaches the level above, per
 * task, in both modes.
 *
 * A task a level >= 4 Worker submits to a Worker child carries one more
 * argument than the script gave: a result box, LPTO_RESULT_BYTES of shared
 * tensor memory (the same address in every process, like any pto.tensor),
 * tagged NO_DEP so no level infers a dependency from it, and a marker
 * scalar after the script's scalars. The child's leaf takes both off before
 * the orchestration function sees its arguments, and once the function
 * returned writes its results into the box as Lua source (nil, booleans,
 * numbers, strings and tables of those). The level above reads the box
 * with orch:result(id) or h:result(id) once the task completed. Nothing of
 * this touches a level-3 Worker's submits.
 *
 * The box is pinned like the run's other storages (so it outlives the run's
 * function when the run was submitted) and kept in the orchestrator's
 * results table, which a run handle takes over. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lpto_priv.h"

#define RESULT_MAGIC PTO_RESULT_BOX_MARK   /* the marker scalar */
#define RESULT_MAX_DEPTH 32

typedef struct box_header {
    uint32_t written;          /* 1 once the function's results are in */
    uint32_t len;              /* bytes of text after the header */
} box_header;

/* ---- the level above: attach a box to a submit ------------------------------------- */

int lpto_result_attach(lua_State *L, pto_task_args *ta, int n)
{
    size_t bytes = (size_t)LPTO_RESULT_BYTES * (size_t)n;
    char *p = pto_shm_alloc(bytes);
    if (!p)
        return lpto_error(L, "orch:submit_next_level", "no shared memory left for the task's result box%s (%zu bytes); "
                                                        "raise the Worker's shm_size or PTO_SHM_SIZE",
                          n > 1 ? "es" : "", bytes);
    for (int i = 0; i < n; i++) memset(p + (size_t)i * LPTO_RESULT_BYTES, 0, sizeof(box_header));
    lpto_push_storage(L, (uint64_t)(uintptr_t)p, bytes, LPTO_ST_ARENA);
    int box = lua_gettop(L);
    /* The extended arrays of every member live in one userdata on the stack until the submit returns. */
    size_t need = 0;
    for (int i = 0; i < n; i++)
        need += (sizeof(pto_tensor) + 1) * (size_t)(ta[i].tensor_count + 1) + 8 * (size_t)(ta[i].scalar_count + 1) + 8;
    char *buf = lua_newuserdatauv(L, need, 0);
    for (int i = 0; i < n; i++) {
        int32_t nt = ta[i].tensor_count + 1, ns = ta[i].scalar_count + 1;
        pto_tensor *ts = (pto_tensor *)buf;
        uint64_t *ss = (uint64_t *)(buf + sizeof(pto_tensor) * (size_t)nt);
        uint8_t *tags = (uint8_t *)(ss + ns);
        buf = (char *)tags + (((size_t)nt + 7) & ~(size_t)7);   /* the next member's arrays stay aligned */
        if (ta[i].tensor_count) {
            memcpy(ts, ta[i].tensors, sizeof(pto_tensor) * (size_t)ta[i].tensor_count);
            memcpy(tags, ta[i].tags, (size_t)ta[i].tensor_count);
        }
        if (ta[i].scalar_count) memcpy(ss, ta[i].scalars, 8 * (size_t)ta[i].scalar_count);
        ts[nt - 1] = (pto_tensor){.base = (uint64_t)(uintptr_t)p, .offset = (uint64_t)i * LPTO_RESULT_BYTES,
                                  .dtype = PTO_U8, .ndims = 1, .shape = {LPTO_RESULT_BYTES}};
        tags[nt - 1] = PTO_NO_DEP;
        ss[ns - 1] = RESULT_MAGIC;
        ta[i] = (pto_task_args){nt, ns, ts, tags, ss};
    }
    return box;
}

void lpto_result_track(lua_State *L, int oidx, lorch *O, int64_t id, int box)
{
    oidx = lua_absindex(L, oidx);
    box = lua_absindex(L, box);
    if (lua_getiuservalue(L, oidx, OUV_RESULTS) != LUA_TTABLE) {
        lua_pop(L, 1);
        lua_newtable(L);
        lua_pushvalue(L, -1);
        lua_setiuservalue(L, oidx, OUV_RESULTS);
    }
    lua_pushvalue(L, box);
    lua_rawseti(L, -2, (lua_Integer)id);
    lua_pop(L, 1);
    /* Pinned: it must outlive the run's function while the task writes it. */
    lua_getiuservalue(L, oidx, OUV_PINS);
    lua_pushvalue(L, box);
    lua_rawseti(L, -2, ++O->npins);
    lua_pop(L, 1);
}

/* ---- the child: take the box off, write the results --------------------------------- */

void *lpto_result_unwrap(const pto_args_view *in, pto_args_view *out)
{
    *out = *in;
    if (in->tensor_count < 1 || in->scalar_count < 1 || in->scalars[in->scalar_count - 1] != RESULT_MAGIC) return NULL;
    const pto_tensor *t = &in->tensors[in->tensor_count - 1];
    if (t->dtype != PTO_U8 || t->ndims != 1 || t->shape[0] != LPTO_RESULT_BYTES) return NULL;
    out->tensor_count--;
    out->scalar_count--;
    return (void *)(uintptr_t)(t->base + t->offset);
}

/* Text pieces go into a table (acc) and are joined at the end: a
 * luaL_Buffer cannot share the stack with the table traversal. */
typedef struct acc {
    int idx;                   /* the table of pieces */
    lua_Integer n;
    size_t bytes;
} acc;

static void add(lua_State *L, acc *a, const char *s)
{
    a->bytes += strlen(s);
    if (a->bytes > LPTO_RESULT_BYTES)
        luaL_error(L, "its results take more than %d bytes as text, which is what travels to the level above "
                      "(return less, or pass large data through a tensor)", LPTO_RESULT_BYTES - (int)sizeof(box_header));
    lua_pushstring(L, s);
    lua_rawseti(L, a->idx, ++a->n);
}

static void put_value(lua_State *L, acc *a, int idx, int depth);

static void put_table(lua_State *L, acc *a, int idx, int depth)
{
    if (depth > RESULT_MAX_DEPTH)
        luaL_error(L, "its results nest tables more than %d deep (a cycle?); results are nil, booleans, numbers, "
                      "strings and tables of those", RESULT_MAX_DEPTH);
    luaL_checkstack(L, 4, NULL);
    add(L, a, "{");
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        int k = lua_gettop(L) - 1;
        add(L, a, "[");
        put_value(L, a, k, depth + 1);
        add(L, a, "]=");
        put_value(L, a, k + 1, depth + 1);
        add(L, a, ",");
        lua_pop(L, 1);
    }
    add(L, a, "}");
}

static void put_string(lua_State *L, acc *a, int idx)
{
    size_t len;
    const char *s = lua_tolstring(L, idx, &len);
    if (len > LPTO_RESULT_BYTES) add(L, a, s);   /* raises: too large */
    luaL_Buffer b;
    char *p = luaL_buffinitsize(L, &b, 4 * len + 2);
    size_t o = 0;
    p[o++] = '"';
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            p[o++] = '\\';
            p[o++] = (char)c;
        } else if (c < 32 || c >= 127) {
            o += (size_t)snprintf(p + o, 5, "\\%03u", c);
        } else {
            p[o++] = (char)c;
        }
    }
    p[o++] = '"';
    luaL_pushresultsize(&b, o);
    a->bytes += o;
    if (a->bytes > LPTO_RESULT_BYTES) add(L, a, "");   /* raises */
    lua_rawseti(L, a->idx, ++a->n);
}

static void put_value(lua_State *L, acc *a, int idx, int depth)
{
    char num[64];
    switch (lua_type(L, idx)) {
    case LUA_TNIL:
        add(L, a, "nil");
        break;
    case LUA_TBOOLEAN:
        add(L, a, lua_toboolean(L, idx) ? "true" : "false");
        break;
    case LUA_TNUMBER:
        if (lua_isinteger(L, idx)) {
            lua_Integer v = lua_tointeger(L, idx);
            if (v == LUA_MININTEGER) snprintf(num, sizeof num, "math.mininteger");
            else snprintf(num, sizeof num, "%lld", (long long)v);
        } else {
            double d = lua_tonumber(L, idx);
            if (isnan(d)) snprintf(num, sizeof num, "(0/0)");
            else if (isinf(d)) snprintf(num, sizeof num, d > 0 ? "math.huge" : "-math.huge");
            else snprintf(num, sizeof num, "%.17g", d);
            if (!strpbrk(num, ".eEn(h")) strcat(num, ".0");   /* stays a float */
        }
        add(L, a, num);
        break;
    case LUA_TSTRING:
        put_string(L, a, idx);
        break;
    case LUA_TTABLE:
        put_table(L, a, lua_absindex(L, idx), depth);
        break;
    default:
        luaL_error(L, "the orchestration function returned a %s; results that travel to the level above are nil, booleans, numbers, strings "
                      "and tables of those", luaL_typename(L, idx));
    }
}

/* The n values from first are the function's results: write them into box. */
void lpto_result_write(lua_State *L, void *box, int first, int n)
{
    int top = lua_gettop(L);
    lua_newtable(L);
    acc a = {lua_gettop(L), 0, 0};
    add(L, &a, "return ");
    for (int i = 0; i < n; i++) {
        if (i > 0) add(L, &a, ",");
        put_value(L, &a, first + i, 0);
    }
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (lua_Integer i = 1; i <= a.n; i++) {
        lua_rawgeti(L, a.idx, i);
        luaL_addvalue(&b);
    }
    luaL_pushresult(&b);
    size_t len;
    const char *text = lua_tolstring(L, -1, &len);
    if (len > LPTO_RESULT_BYTES - sizeof(box_header))
        luaL_error(L, "its results take %d bytes as text; at most %d travel to the level above (return less, or pass "
                      "large data through a tensor)",
                   (int)len, (int)(LPTO_RESULT_BYTES - sizeof(box_header)));
    box_header *h = box;
    memcpy((char *)box + sizeof *h, text, len);
    h->len = (uint32_t)len;
    __atomic_store_n(&h->written, 1, __ATOMIC_RELEASE);
    lua_settop(L, top);
}

size_t lpto_result_box_used(const void *box)
{
    const box_header *h = box;
    if (!box) return sizeof *h;
    size_t len = __atomic_load_n(&h->written, __ATOMIC_ACQUIRE) ? h->len : 0;
    return sizeof *h + (len <= LPTO_RESULT_BYTES - sizeof *h ? len : 0);
}

void lpto_result_box_clear(void *box) { memset(box, 0, sizeof(box_header)); }

/* ---- reading: orch:result(id), h:result(id) ---------------------------------------- */

/* Push the results of task id (of its member-th member, 1-based, for a
 * group; 0: none given) from the results table at tidx; returns their count. */
int lpto_result_push(lua_State *L, int tidx, int64_t id, lua_Integer member, pto_orch *o, const char *who)
{
    tidx = lua_absindex(L, tidx);
    if (lua_type(L, tidx) != LUA_TTABLE || lua_rawgeti(L, tidx, (lua_Integer)id) == LUA_TNIL)
        return lpto_error(L, who, "task %lld is not a task this run submitted to a Worker child (orch:submit_next_level, "
                                  "prepared or group); only those carry results",
                          (long long)id);
    /* One box per member, in one storage: its size says how many. */
    lpto_storage *st = lua_touserdata(L, -1);
    lua_Integer n = (lua_Integer)(st->nbytes / LPTO_RESULT_BYTES);
    if (n == 1 && (member < 0 || member > 1))
        return lpto_error(L, who, "task %lld has one set of results (member 1, or none given; got %lld)",
                          (long long)id, (long long)member);
    if (n > 1 && (member < 1 || member > n))
        return lpto_error(L, who, "task %lld is a group of %lld members, each with its own results: give the "
                                  "member as the second argument, 1 to %lld (got %s)",
                          (long long)id, (long long)n, (long long)n,
                          member ? lua_pushfstring(L, "%I", member) : "none");
    uint64_t at = member > 1 ? (uint64_t)(member - 1) * LPTO_RESULT_BYTES : 0;
    const box_header *h = (const box_header *)(uintptr_t)(st->base + at);
    if (!__atomic_load_n(&h->written, __ATOMIC_ACQUIRE)) {
        pto_task_info info;
        if (o && pto_task_info_get(o, id, &info) == 0 && info.state == PTO_TASK_FAILED)
            return lpto_error(L, who, "task %lld failed, so it has no results: %s", (long long)id,
                              info.error ? info.error : "(no message)");
        return lpto_error(L, who, "task %lld has no results yet: it has not completed (or it failed); wait for it "
                                  "first (orch:drain() in the run, or h:wait() on its run)",
                          (long long)id);
    }
    const char *text = (const char *)h + sizeof *h;
    int top = lua_gettop(L);
    if (luaL_loadbufferx(L, text, h->len, "=result", "t") != LUA_OK)
        return lpto_error(L, who, "task %lld's results cannot be read back: %s", (long long)id, lua_tostring(L, -1));
    lua_newtable(L);   /* no environment: the text is data */
    lua_pushliteral(L, "math");
    lua_getglobal(L, "math");
    lua_rawset(L, -3);
    lua_setupvalue(L, -2, 1);
    lua_call(L, 0, LUA_MULTRET);
    return lua_gettop(L) - top;
}

/* orch:result(id [, member]) -> what the orchestration function of task id
 * (of that member of a group) returned. */
int lpto_orch_result(lua_State *L)
{
    const char *who = "orch:result";
    lorch *O = lpto_check_orch(L, 1, who);
    lua_Integer id = luaL_checkinteger(L, 2);
    lua_Integer member = luaL_optinteger(L, 3, 0);
    lua_settop(L, 3);
    lua_getiuservalue(L, 1, OUV_RESULTS);
    return lpto_result_push(L, 4, id, member, O->o, who);
}
