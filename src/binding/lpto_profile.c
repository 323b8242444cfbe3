/* lpto_profile.c - the run profile's raw data for the Lua side
 * (lua/pto/profile.lua: w:profile(); lua/pto/report.lua: w:report()).
 *
 * The engine keeps every task's start and end of a Worker's last run
 * (pto_profile_get); this file copies them into a table of columns, one
 * array per field, which is cheaper to build and to walk than a table per
 * task, and adds what only the binding knows: worker names, callable names,
 * and the levels below: THREAD-mode Worker children run in this process,
 * PROCESS-mode ones publish their last run and those of their own tree
 * (lpto_travel.c), so the profile covers every level. Methods written in Lua join the Worker's
 * method table through pto._extend_worker. */
#include <stdlib.h>
#include <string.h>

#include "lpto_priv.h"

static void set_num(lua_State *L, const char *k, lua_Integer v)
{
    lua_pushinteger(L, v);
    lua_setfield(L, -2, k);
}

/* Names of the workers of kind, as the failure messages and traces name them. */
static void push_worker_names(lua_State *L, const lworker *W, int kind, int n)
{
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        if (kind == PTO_SUB) lua_pushfstring(L, "sub %d", i + 1);
        else lua_pushfstring(L, W->level >= 4 ? "Worker %d" : "chip %d", i + 1);
        lua_rawseti(L, -2, i + 1);
    }
}

static void push_callable_name(lua_State *L, const lworker *W, int kind, uint64_t callable)
{
    char buf[128];
    int n = pto_worker_callable_name_get(W->w, kind, callable, buf, sizeof buf);
    if (n >= 0) lua_pushlstring(L, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
    else lua_pushfstring(L, "%s %d", kind == PTO_SUB ? "sub" : "chip", (int)callable);
}

/* Where a level's callable names come from: its Worker in this process, or the table its process published. */
typedef struct namer {
    const lworker *W;                    /* this process */
    const lpto_child_profile *cp;        /* published (W NULL) */
} namer;

static void push_name(lua_State *L, const namer *nm, int kind, uint64_t callable)
{
    if (nm->W) {
        push_callable_name(L, nm->W, kind, callable);
        return;
    }
    for (int32_t j = 0; j < nm->cp->nnames; j++)
        if (nm->cp->names[j].kind == kind && nm->cp->names[j].callable == callable) {
            lua_pushstring(L, nm->cp->names[j].name);
            return;
        }
    lua_pushfstring(L, "%s %d", kind == PTO_SUB ? "sub" : "chip", (int)callable);
}

/* Push the columns of one level's run: W's shape, the records t[0..n) and edges e[0..ne). */
static void push_columns(lua_State *L, const lworker *W, const pto_profile_run *run, const pto_profile_task *t,
                         int64_t n, const int64_t *e, int64_t ne, const namer *nm)
{
    lua_createtable(L, 0, 24);
    set_num(L, "run", run->run);
    set_num(L, "begin_ns", (lua_Integer)run->begin_ns);
    set_num(L, "drain_ns", (lua_Integer)(run->drain_ns - run->begin_ns));
    set_num(L, "end_ns", (lua_Integer)(run->end_ns - run->begin_ns));
    set_num(L, "waited_ns", (lua_Integer)run->waited_ns);
    set_num(L, "dropped", run->dropped);
    set_num(L, "level", W->level);
    lua_pushstring(L, W->mode == PTO_MODE_THREAD ? "thread" : "process");
    lua_setfield(L, -2, "mode");
    int nnext = W->level >= 4 ? W->nworkers : W->nchips;
    push_worker_names(L, W, PTO_NEXT_LEVEL, nnext);
    lua_setfield(L, -2, "next_names");
    push_worker_names(L, W, PTO_SUB, W->nsubs);
    lua_setfield(L, -2, "sub_names");
    static const char *const cols[] = {"start", "finish", "id", "ready_by", "kind", "worker", "member", "failed",
                                       "scope", "callable", "name"};
    enum { NCOLS = sizeof cols / sizeof *cols };
    int base = lua_gettop(L);
    for (int c = 0; c < NCOLS; c++) lua_createtable(L, (int)n, 0);
    lua_newtable(L);   /* names by kind and callable, resolved once each */
    int names = lua_gettop(L);
    for (int64_t i = 0; i < n; i++) {
        const pto_profile_task *r = &t[i];
        bool ran = r->start_ns != 0;
        lua_Integer v[] = {ran ? (lua_Integer)(r->start_ns - run->begin_ns) : 0,
                           ran ? (lua_Integer)(r->end_ns - run->begin_ns) : 0, r->id,
                           r->ready_by, r->kind, r->worker + 1, r->member, r->failed, (lua_Integer)r->scope,
                           (lua_Integer)r->callable};
        for (int c = 0; c < NCOLS - 1; c++) {
            lua_pushinteger(L, v[c]);
            lua_rawseti(L, base + 1 + c, i + 1);
        }
        lua_Integer key = (lua_Integer)(r->callable * 2 + (uint64_t)r->kind);
        if (lua_rawgeti(L, names, key) == LUA_TNIL) {
            lua_pop(L, 1);
            push_name(L, nm, r->kind, r->callable);
            lua_pushvalue(L, -1);
            lua_rawseti(L, names, key);
        }
        lua_rawseti(L, base + NCOLS, i + 1);
    }
    lua_pop(L, 1);
    for (int c = NCOLS - 1; c >= 0; c--) lua_setfield(L, base, cols[c]);
    lua_createtable(L, (int)(ne > 0 ? ne * 2 : 0), 0);
    for (int64_t i = 0; i < 2 * ne; i++) {
        lua_pushinteger(L, e[i]);
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "edges");
}

/* Push the columns of the last runs a PROCESS-mode child K published, cp[0..n)
 * (lpto_level_child_profiles: K's own, then the Workers' below it in
 * pre-order), each under its parent's "children" as push_data does for a
 * child in this process: K's on top, or nil. The shape of each Worker
 * (level, workers) is that of its copy here, where the tree was built. */
static void push_published(lua_State *L, lworker *K, const lpto_child_profile *cp, int n)
{
    luaL_checkstack(L, n + 4, "profile of a Worker child");
    lworker **who = lua_newuserdatauv(L, (size_t)n * sizeof *who, 0);
    int base = lua_gettop(L);
    for (int k = 0; k < n; k++) {
        const lpto_child_profile *s = &cp[k];
        lworker *P = k > 0 && s->parent >= 0 && s->parent < k ? who[s->parent] : NULL;
        who[k] = k == 0 ? K : P && P->level >= 4 && s->child >= 0 && s->child < P->nworkers ? P->kids[s->child] : NULL;
        if (!who[k] || !s->have) {
            lua_pushnil(L);
            continue;
        }
        namer nm = {.cp = s};
        push_columns(L, who[k], &s->run, s->recs, s->n, s->edges, s->ne, &nm);
    }
    for (int k = 1; k < n; k++) {   /* parents come first: link each to its parent's table */
        int p = cp[k].parent;
        if (lua_isnil(L, base + 1 + k) || p < 0 || p >= k || lua_isnil(L, base + 1 + p)) continue;
        if (lua_getfield(L, base + 1 + p, "children") != LUA_TTABLE) {
            lua_pop(L, 1);
            lua_newtable(L);
            lua_pushvalue(L, -1);
            lua_setfield(L, base + 1 + p, "children");
        }
        lua_pushvalue(L, base + 1 + k);
        lua_rawseti(L, -2, cp[k].child + 1);
        lua_pop(L, 1);
    }
    lua_settop(L, base + 1);
    lua_remove(L, base);
}

/* Set the fields of the table on top that a picture of W's last run needs
 * beside the records (ptolua --dot, lua/pto/inspect.lua): scope_parent[k]
 * (the scope nested scope k was opened in), alloc_uses (task, alloc slot
 * id pairs, flat) and errors[id] (why each failed or unrun task failed). */
static void push_dag_extras(lua_State *L, lworker *W)
{
    int64_t ns = pto_profile_scopes(W->w, NULL, 0);
    uint32_t *sp = lua_newuserdatauv(L, (size_t)(ns > 0 ? ns : 1) * sizeof *sp, 0);
    if (ns > 0) pto_profile_scopes(W->w, sp, ns);
    lua_createtable(L, ns > 0 ? (int)ns : 0, 0);
    for (int64_t k = 0; k < ns; k++) {
        lua_pushinteger(L, sp[k]);
        lua_rawseti(L, -2, k + 1);
    }
    lua_setfield(L, -3, "scope_parent");
    lua_pop(L, 1);
    int64_t nu = pto_profile_alloc_uses(W->w, NULL, 0);
    int64_t *u = lua_newuserdatauv(L, (size_t)(nu > 0 ? nu : 1) * 2 * sizeof *u, 0);
    if (nu > 0) pto_profile_alloc_uses(W->w, u, nu);
    lua_createtable(L, nu > 0 ? (int)(2 * nu) : 0, 0);
    for (int64_t i = 0; i < 2 * nu; i++) {
        lua_pushinteger(L, u[i]);
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -3, "alloc_uses");
    lua_pop(L, 1);
    lua_newtable(L);
    int64_t id;
    const char *msg;
    for (int64_t i = 0; (msg = pto_profile_error(W->w, i, &id)) != NULL; i++) {
        lua_pushstring(L, msg);
        lua_rawseti(L, -2, id);
    }
    lua_setfield(L, -2, "errors");
}

/* Push the columns of W's last run, or nil if it has none. */
static void push_data(lua_State *L, lworker *W, int depth)
{
    pto_profile_run run;
    int64_t n = W->state == W_READY && W->w ? pto_profile_get(W->w, &run, NULL, 0) : -1;
    if (n < 0) {
        lua_pushnil(L);
        return;
    }
    /* Userdata, not malloc: any Lua call below may raise. */
    pto_profile_task *t = lua_newuserdatauv(L, (size_t)(n ? n : 1) * sizeof *t, 0);
    int64_t ne = pto_profile_edges(W->w, NULL, 0);
    int64_t *e = lua_newuserdatauv(L, (size_t)(ne > 0 ? ne : 1) * 2 * sizeof *e, 0);
    int bufs = lua_gettop(L);
    pto_profile_get(W->w, &run, t, n);
    if (ne > 0) pto_profile_edges(W->w, e, ne);
    namer nm = {.W = W};
    push_columns(L, W, &run, t, n, e, ne > 0 ? ne : 0, &nm);
    /* CallConfig enable_pmu's counts by task id (a group's members summed): profile.lua sums them per callable. */
    lua_newtable(L);
    for (int64_t i = 0; i < n; i++) {
        pto_pmu_sample s;
        if (t[i].member != 0 || pto_profile_pmu_get(W->w, t[i].id, &s) != 1) continue;
        lpto_push_pmu_counts(L, &s);
        lua_rawseti(L, -2, t[i].id);
    }
    lua_setfield(L, -2, "pmu");
    push_dag_extras(L, W);
    /* The level below: a THREAD-mode Worker child's last run lives in this
     * process; a PROCESS-mode child's is what its process published. */
    if (W->level >= 4 && depth < 8) {
        lua_createtable(L, W->nworkers, 0);
        for (int i = 0; i < W->nworkers; i++) {
            lpto_child_profile *cp;
            int n;
            if (W->kids[i]->state == W_READY) {
                push_data(L, W->kids[i], depth + 1);
            } else if ((n = lpto_level_child_profiles(L, W, i, &cp)) > 0) {
                push_published(L, W->kids[i], cp, n);
                lua_remove(L, -2);   /* the copy */
            } else {
                lua_pushnil(L);
            }
            if (lua_isnil(L, -1)) lua_pop(L, 1);
            else lua_rawseti(L, -2, i + 1);
        }
        lua_setfield(L, -2, "children");
    }
    lua_replace(L, bufs - 1);
    lua_settop(L, bufs - 1);
}

/* pto._profile_data(w) -> the columns of w's last run, or nil if none ended yet. */
static int l_profile_data(lua_State *L)
{
    lworker *W = lpto_check_worker(L, 1, luaL_optstring(L, 2, "Worker:profile"));
    push_data(L, W, 0);
    return 1;
}

/* pto._extend_worker(t): every field of t becomes a Worker method. */
static int l_extend_worker(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    luaL_getmetatable(L, LPTO_WORKER);
    lua_getfield(L, -1, "methods");
    lua_pushnil(L);
    while (lua_next(L, 1)) {
        lua_pushvalue(L, -2);
        lua_insert(L, -2);
        lua_settable(L, -4);
    }
    return 0;
}

void lpto_open_profile(lua_State *L)
{
    static const luaL_Reg fns[] = {{"_profile_data", l_profile_data}, {"_extend_worker", l_extend_worker},
                                   {NULL, NULL}};
    luaL_setfuncs(L, fns, 0);
}
