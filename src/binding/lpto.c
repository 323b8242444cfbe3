/* lpto.c - luaopen_pto: builds the module from its parts, as Lua's linit.c
 * opens its libraries. Nothing else lives here.
 *
 * The binding's files depend on each other in one direction, tier by tier
 * (each uses only the tiers above it):
 *   lpto_aux.c      errors named for the Lua function, options tables, the
 *                   interpreter lock, the runs Ctrl-C interrupts; no pto type
 *   lpto_tensor.c   Tensor and Storage
 *   lpto_args.c     TaskArgs, pto.args and CallConfig
 *   lpto_sub.c      sub callables, and shipping functions to children
 *   lpto_orch.c     the orchestrator a run hands its function (its submits
 *                   call one hook of lpto_trace.c, which does nothing
 *                   unless ptolua --dot asks); lpto_orch_inspect.c its
 *                   orch:task and orch:tensormap
 *   lpto_worker.c   the Worker type, in four files that call each other: its
 *   lpto_level.c    methods (all listed in lpto_worker.c), its Worker children
 *   lpto_debug.c    (whose leaf runs a Worker), interactive runs and dispatch
 *   lpto_trace.c    control, tracing and ptolua's --trace/--dot
 *   lpto.c          luaopen_pto: each file's lpto_open_* (in any order), then
 *                   the Lua parts (lua/pto)
 * The engine under all of them never sees a Lua header. */
#include "lpto.h"
#include "lpto_priv.h"
#include "lpto_trace.h"
#include "pto_version.h"

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
    lpto_gil_open(L);
    lua_newtable(L);
    lua_pushliteral(L, PTO_VERSION);
    lua_setfield(L, -2, "_VERSION");
    lpto_open_tensor(L);
    lpto_open_args(L);
    lpto_open_orch(L);
    lpto_open_worker(L);
    lpto_open_debug(L);
    lpto_open_trace(L);
    lpto_open_profile(L);
    load_lua_part(L, "pto.inspect");
    load_lua_part(L, "pto.profile");
    load_lua_part(L, "pto.report");
    return 1;
}
