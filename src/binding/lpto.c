/* lpto.c - luaopen_pto: builds the module from its parts, as Lua's linit.c
 * opens its libraries. Nothing else lives here.
 *
 * The binding's files depend on each other in one direction, tier by tier
 * (each uses only the tiers above it):
 *   lpto_aux.c      errors named for the Lua function, options tables, the
 *                   interpreter lock, the runs Ctrl-C interrupts; no pto type
 *   lpto_tensor.c   Tensor and Storage (lpto_check.c: where each was
 *                   created, for check mode's messages)
 *   lpto_args.c     TaskArgs, pto.args and CallConfig
 *   lpto_sub.c      sub callables, and shipping functions to children
 *   lpto_orch.c     the orchestrator a run hands its function (its submits
 *                   call one hook of lpto_trace.c, which does nothing
 *                   unless ptolua --dot asks); lpto_orch_inspect.c its
 *                   orch:task and orch:tensormap
 *   lpto_worker.c   the Worker type, in four files that call each other: its
 *   lpto_level.c    methods (all listed in lpto_worker.c), its Worker children
 *   lpto_debug.c    (whose leaf runs a Worker), interactive runs and dispatch
 *   lpto_trace.c    control, tracing and ptolua's --trace/--dot;
 *   lpto_run.c      and run handles (Worker:submit, wait_all, pto.wait_any),
 *   lpto_result.c   and what a Worker child's orchestration function returns
 *   lpto_mpi.c      (lpto_level.c's) Worker children on other MPI ranks
 *   lpto_travel.c   what Worker children send up: statistics, profiles, traces
 *   lpto_diag.c     pto.load_dump and orch:task's PMU counts (CallConfig diagnostics)
 *   lpto.c          luaopen_pto: each file's lpto_open_* (in any order), then
 *                   the Lua parts (lua/pto, compiled in: lpto_embed.h)
 * The engine under all of them never sees a Lua header. */
#include "lpto.h"
#include "lpto_embed.h"
#include "lpto_priv.h"
#include "lpto_trace.h"
#include "pto_version.h"

/* package.preload loader of an embedded part: (module name, ":preload:")
 * -> the chunk's result, as the file searcher would return it. */
static int load_part(lua_State *L)
{
    const lpto_lua_part *p = lua_touserdata(L, lua_upvalueindex(1));
    if (luaL_loadbufferx(L, p->text, p->len, p->chunkname, "t") != LUA_OK) return lua_error(L);
    lua_pushvalue(L, 1);
    lua_pushstring(L, p->chunkname + 1);
    lua_call(L, 2, 1);
    return 1;
}

/* The pure-Lua parts come from the binary, never from package.path: pto
 * adds nothing to the user's paths, so they mean what they mean in lua5.4,
 * and no directory on them can supply pto.repl. An entry the user put in
 * package.preload first is left alone. */
static void preload_parts(lua_State *L)
{
    luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
    for (const lpto_lua_part *p = lpto_lua_parts; p->module; p++) {
        if (lua_getfield(L, -1, p->module) == LUA_TNIL) {
            lua_pushlightuserdata(L, (void *)p);
            lua_pushcclosure(L, load_part, 1);
            lua_setfield(L, -3, p->module);
        }
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
}

/* The pure-Lua parts that extend the table are each a function of it. */
static void load_lua_part(lua_State *L, const char *name)
{
    lua_getglobal(L, "require");
    lua_pushstring(L, name);
    lua_call(L, 1, 1);
    lua_pushvalue(L, -2);
    lua_call(L, 1, 0);
}

int luaopen_pto(lua_State *L)
{
    luaL_checkversion(L);
    if (pto_shm_init(0) != 0) return luaL_error(L, "require \"pto\": %s", pto_errmsg());
    lpto_gil_open(L);
    lua_newtable(L);
    lua_pushliteral(L, PTO_VERSION);
    lua_setfield(L, -2, "_VERSION");
    lpto_open_check(L);
    lpto_open_tensor(L);
    lpto_open_args(L);
    lpto_open_orch(L);
    lpto_open_worker(L);
    lpto_open_debug(L);
    lpto_open_trace(L);
    lpto_open_mpi(L);
    preload_parts(L);
    lpto_open_run(L);
    lpto_open_diag(L);
    lpto_open_profile(L);
    load_lua_part(L, "pto.inspect");
    load_lua_part(L, "pto.profile");
    load_lua_part(L, "pto.report");
    return 1;
}
