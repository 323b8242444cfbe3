/* lpto_orch_inspect.c - orch:task(id) and orch:tensormap(): a run's tasks
 * and live writers as Lua tables, for the prompt (lua/pto/commands.lua),
 * orch:dag / orch:dot and tests. Registered among the orchestrator's
 * methods by lpto_open_orch (lpto_orch.c), whose upvalues they share. */
#include <stdlib.h>
#include <string.h>

#include "lpto_priv.h"

static const char *const STATE_NAMES[] = {"free", "pending", "ready", "running", "completed", "consumed", "failed"};

static void push_edges(lua_State *L, lorch *O, int64_t id, int what)
{
    int64_t buf[64];
    int n = pto_task_edges(O->o, id, what, buf, 64);
    int64_t *ids = buf;
    if (n > 64) {
        ids = lua_newuserdatauv(L, sizeof *ids * (size_t)n, 0);
        pto_task_edges(O->o, id, what, ids, n);
    }
    lua_createtable(L, n > 0 ? n : 0, 0);
    for (int i = 0; i < n; i++) {
        lua_pushinteger(L, ids[i]);
        lua_rawseti(L, -2, i + 1);
    }
    if (ids != buf) lua_remove(L, -2);
}

/* Set field "tensors" of the table on top: each member's tensors as submitted, with their tags. */
static void push_task_tensors(lua_State *L, lorch *O, int64_t id, int32_t members)
{
    lua_newtable(L);
    int k = 0;
    for (int32_t m = 0; m < members; m++) {
        int32_t n = pto_task_tensors(O->o, id, m, NULL, NULL, 0);
        if (n <= 0) continue;
        pto_tensor *ts = lua_newuserdatauv(L, (sizeof *ts + 1) * (size_t)n, 0);
        uint8_t *tg = (uint8_t *)(ts + n);
        pto_task_tensors(O->o, id, m, ts, tg, n);
        for (int32_t i = 0; i < n; i++) {
            const pto_tensor *t = &ts[i];
            lua_createtable(L, 0, 8);
            lua_pushstring(L, pto_tag_name(tg[i]) ? pto_tag_name(tg[i]) : "?");
            lua_setfield(L, -2, "tag");
            lua_pushstring(L, pto_dtype_name(t->dtype) ? pto_dtype_name(t->dtype) : "?");
            lua_setfield(L, -2, "dtype");
            lua_createtable(L, t->ndims, 0);
            for (int d = 0; d < t->ndims; d++) {
                lua_pushinteger(L, t->shape[d]);
                lua_rawseti(L, -2, d + 1);
            }
            lua_setfield(L, -2, "shape");
            lua_pushinteger(L, (lua_Integer)pto_tensor_nbytes(t));
            lua_setfield(L, -2, "nbytes");
            lua_pushinteger(L, (lua_Integer)(t->base + t->offset));
            lua_setfield(L, -2, "address");
            lua_pushinteger(L, (lua_Integer)t->base);
            lua_setfield(L, -2, "storage");
            uint64_t off;
            int r = pto_ring_locate(O->o, t->base + t->offset, &off);
            if (r >= 0) {
                lua_pushinteger(L, r);
                lua_setfield(L, -2, "ring");
                lua_pushinteger(L, (lua_Integer)off);
                lua_setfield(L, -2, "ring_offset");
            }
            if (members > 1) {
                lua_pushinteger(L, m + 1);
                lua_setfield(L, -2, "member");
            }
            lua_rawseti(L, -3, ++k);
        }
        lua_pop(L, 1);
    }
    lua_setfield(L, -2, "tensors");
}

/* orch:tensormap() -> {{storage, address, nbytes, producer, ring?}, ...}: each live writer entry. */
int lpto_orch_tensormap(lua_State *L)
{
    lorch *O = lpto_check_orch_inspect(L, 1, "orch:tensormap");
    int64_t n = pto_tensormap_list(O->o, NULL, 0);
    if (n < 0) return lpto_engine_error(L, "orch:tensormap");
    pto_tm_item *items = lua_newuserdatauv(L, sizeof *items * (size_t)(n ? n : 1), 0);
    n = pto_tensormap_list(O->o, items, n);
    lua_createtable(L, (int)n, 0);
    for (int64_t i = 0; i < n; i++) {
        lua_createtable(L, 0, 6);
        lua_pushinteger(L, (lua_Integer)items[i].base);
        lua_setfield(L, -2, "storage");
        lua_pushinteger(L, (lua_Integer)items[i].start);
        lua_setfield(L, -2, "address");
        lua_pushinteger(L, (lua_Integer)(items[i].end - items[i].start));
        lua_setfield(L, -2, "nbytes");
        lua_pushinteger(L, items[i].producer);
        lua_setfield(L, -2, "producer");
        uint64_t off;
        int r = pto_ring_locate(O->o, items[i].start, &off);
        if (r >= 0) {
            lua_pushinteger(L, r);
            lua_setfield(L, -2, "ring");
            lua_pushinteger(L, (lua_Integer)off);
            lua_setfield(L, -2, "ring_offset");
        }
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    return 1;
}

/* Whether a child of kind executes task id now. The engine's "running"
 * means handed to a worker: with queue_depth > 1 (or a chain staged behind
 * its first task) a task can wait in a worker's queue in that state, and
 * users read "running" as executing. Only each child's current task says
 * which (a group's members run on several children: any of them counts). */
static bool executing(lorch *O, int kind, int64_t id)
{
    if (!O->W || O->W->state != W_READY) return true; /* nothing to ask: keep the engine's word */
    int n = pto_worker_count(O->W->w, kind);
    for (int i = 0; i < n; i++)   /* not pto_worker_child_info_get: its pid costs PROCESS mode a /proc read */
        if (pto_worker_current_task(O->W->w, kind, i) == id) return true;
    return false;
}

/* orch:task(id) -> {id, state, kind, callable, fanin, fanout, producers, consumers, ring, error, ...} */
int lpto_orch_task(lua_State *L)
{
    const char *who = "orch:task";
    lorch *O = lpto_check_orch_inspect(L, 1, who);
    int isint;
    lua_Integer id = lua_tointegerx(L, 2, &isint);
    if (!isint) return lpto_error(L, who, "expected a task id returned by a submit (got %s)", luaL_typename(L, 2));
    pto_task_info info;
    if (pto_task_info_get(O->o, id, &info) != 0) return lpto_engine_error(L, who);
    lua_createtable(L, 0, 12);
    lua_pushinteger(L, info.id);
    lua_setfield(L, -2, "id");
    lua_pushstring(L, info.state >= 0 && info.state <= PTO_TASK_FAILED ? STATE_NAMES[info.state] : "unknown");
    lua_setfield(L, -2, "state");
    lua_pushstring(L, info.kind == PTO_NEXT_LEVEL ? "next_level" : info.kind == PTO_SUB ? "sub"
                                                  : info.kind == -1 ? "alloc" : "reclaimed");
    lua_setfield(L, -2, "kind");
    lua_pushinteger(L, (lua_Integer)info.callable);
    lua_setfield(L, -2, "callable");
    lua_pushinteger(L, info.fanin);
    lua_setfield(L, -2, "fanin");
    lua_pushinteger(L, info.fanout);
    lua_setfield(L, -2, "fanout");
    lua_pushinteger(L, info.group_size);
    lua_setfield(L, -2, "group_size");
    if (info.ring >= 0) {
        lua_pushinteger(L, info.ring);
        lua_setfield(L, -2, "ring");
        lua_pushinteger(L, (lua_Integer)info.slab_bytes);
        lua_setfield(L, -2, "slab_bytes");
        lua_pushinteger(L, (lua_Integer)info.slab_offset);
        lua_setfield(L, -2, "slab_offset");
    }
    if (info.error) {
        lua_pushstring(L, info.error);
        lua_setfield(L, -2, "error");
    }
    if (info.worker >= 0 && info.kind >= 0) {
        lua_pushinteger(L, info.worker + 1);
        lua_setfield(L, -2, "worker");
        if (info.kind == PTO_SUB) lua_pushfstring(L, "sub %d", info.worker + 1);
        else if (O->W->level >= 4) lua_pushfstring(L, "L%d worker %d", O->W->level - 1, info.worker + 1);
        else lua_pushfstring(L, "chip %d", info.worker + 1);
        lua_setfield(L, -2, "worker_name");
    }
    if (info.state == PTO_TASK_RUNNING && info.kind >= 0 && !executing(O, info.kind, id)) {
        lua_pushboolean(L, 1);
        lua_setfield(L, -2, "queued");
    }
    if (info.reclaimed) {
        lua_pushboolean(L, 1);
        lua_setfield(L, -2, "reclaimed");
    }
    if (info.run > 0) {
        lua_pushinteger(L, info.run);
        lua_setfield(L, -2, "run");
    }
    if (info.pin >= 0 && info.kind >= 0) {
        lua_pushinteger(L, info.pin + 1);
        lua_setfield(L, -2, "pinned");
    }
    lpto_push_pmu(L, O->o, id);
    push_task_tensors(L, O, id, info.group_size);
    push_edges(L, O, id, 0);
    lua_setfield(L, -2, "producers");
    push_edges(L, O, id, 1);
    lua_setfield(L, -2, "consumers");
    return 1;
}

/* orch:drain(): wait until every task submitted so far has finished (held ones too). */
