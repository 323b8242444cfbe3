/* bench_c_module.c - the Lua module pto_bench_c: pto_bench's shapes
 * submitted through pto.h from inside a Lua run, so that
 * scripts/bench_lua.lua times the C API in the same process, on the same
 * Worker and in the same runs as its Lua forms, alternating with them.
 * Between processes this machine's speed moves by up to 2x (a process
 * stays in its fast or slow mode), which made ratios of 1.25x undecidable
 * when the C rows ran in a process of their own.
 *   local c = package.loadlib(path, "luaopen_pto_bench_c")()
 *   w:run(function(orch) return c.w1(orch, n) end)   -- also w2, w3 (n tasks), w4 (orch, d)
 * Each returns the number of tasks it submitted. Only for ptolua, whose
 * executable exports pto.h's functions to the modules it loads; the
 * orchestrator is read out of the binding's userdata (lpto_priv.h), which
 * no user code may do. A benchmark, not an API. */
#include <lauxlib.h>
#include <lua.h>

#include "bench_shapes.h"
#include "lpto_priv.h"

static bench_shapes g_b;
static lua_Integer g_nslots;   /* slots in g_b.slots */

static pto_orch *orch_of(lua_State *L)
{
    lorch *O = luaL_checkudata(L, 1, LPTO_ORCH);
    if (!O->valid || O->inspect_only) luaL_error(L, "pto_bench_c: call it with the orchestrator of a run in progress");
    return O->o;
}

/* slots_used(n): the slots the shape touches for argument n, which must fit in the arena. */
static int shape(lua_State *L, long (*fn)(pto_orch *, const bench_shapes *, int), lua_Integer (*slots_used)(lua_Integer))
{
    pto_orch *o = orch_of(L);
    lua_Integer n = luaL_checkinteger(L, 2);
    luaL_argcheck(L, n > 0 && n <= (1 << 24), 2, "a task count (or a BGEMM order) between 1 and 2^24");
    if (slots_used(n) > g_nslots)
        return luaL_error(L, "pto_bench_c: %I needs %I slots; load the module with at least that many", n,
                          slots_used(n));
    long k = fn(o, &g_b, (int)n);
    if (k < 0) return luaL_error(L, "pto_bench_c: %s", pto_errmsg());
    lua_pushinteger(L, k);
    return 1;
}

static lua_Integer one_per_task(lua_Integer n) { return n; }
static lua_Integer one(lua_Integer n) { return (void)n, 1; }
static lua_Integer bgemm_tiles(lua_Integer d) { return d > 256 ? (lua_Integer)1 << 30 : 3 * d * d * d; }

static int c_w1(lua_State *L) { return shape(L, bench_w1, one_per_task); }
static int c_w2(lua_State *L) { return shape(L, bench_w2, one); }
static int c_w3(lua_State *L) { return shape(L, bench_w3, one_per_task); }
static int c_w4(lua_State *L) { return shape(L, bench_w4, bgemm_tiles); }

/* luaopen_pto_bench_c(nslots): allocates nslots slots in the shared arena
 * (PROCESS-mode chips read them) and registers the no-op kernel; load it
 * before w:init(), so a PROCESS-mode child forked then knows the kernel. */
int luaopen_pto_bench_c(lua_State *L);
int luaopen_pto_bench_c(lua_State *L)
{
    lua_Integer nslots = luaL_optinteger(L, 1, 3 * 16 * 16 * 16);
    luaL_argcheck(L, nslots > 0 && nslots <= (1 << 24), 1, "a slot count between 1 and 2^24");
    if (!g_b.slots) {
        int64_t id = pto_kernel_register(NULL, "noop");
        if (id < 0) return luaL_error(L, "pto_bench_c: %s", pto_errmsg());
        g_b.noop = (uint64_t)id;
        g_b.slots = pto_shm_alloc((size_t)nslots * BENCH_SLOT_ELEMS * sizeof(float));
        if (!g_b.slots) return luaL_error(L, "pto_bench_c: %s", pto_errmsg());
        g_nslots = nslots;
    }
    static const luaL_Reg fns[] = {{"w1", c_w1}, {"w2", c_w2}, {"w3", c_w3}, {"w4", c_w4}, {NULL, NULL}};
    luaL_newlib(L, fns);
    return 1;
}
