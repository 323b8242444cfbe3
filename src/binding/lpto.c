/* lpto.c - luaopen_pto: builds the module from its parts, as Lua's linit.c
 * opens its libraries. Nothing else lives here.
 *
 * The binding's files depend on each other one way only:
 *   lpto_aux.c      errors, options tables, the interpreter lock, the runs
 *                   Ctrl-C interrupts; knows no pto type
 *   lpto_tensor.c   Tensor and Storage                          (aux)
 *   lpto_args.c     TaskArgs and CallConfig                     (aux, tensor)
 *   lpto_sub.c      sub callables and shipping functions        (aux, tensor, args)
 *   lpto_orch.c     the Orchestrator a run hands its function   (aux, tensor, args, trace hooks)
 *   lpto_trace.c    tracing and ptolua's --trace/--dot hooks    (aux, levels)
 *   lpto_debug.c    interactive runs and dispatch control       (aux, orch, worker)
 *   lpto_worker.c   the Worker (its method table lists every    (all of the above)
 *   lpto_level.c    Worker method) and its Worker children; the two call each other
 *                   because a Worker child's leaf runs a Worker
 *   lpto.c          luaopen_pto                                 (the lpto_open_* of each)
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
    load_lua_part(L, "pto.args");
    load_lua_part(L, "pto.inspect");
    return 1;
}
