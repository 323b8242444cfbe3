/* lpto_debug.c - interactive debugging (docs/repl.md): runs that stay open
 * across the prompt's chunks (Worker:open_run / Worker:close_run), dispatch
 * control (hold, step, release, breakpoints), the Workers of this state and
 * their children. The REPL's ":" commands (lua/pto/repl.lua) are built on
 * these; scripts may use them too. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lpto.h"
#include "lpto_priv.h"

static const char WORKERS_KEY = 'W';
static _Atomic unsigned interrupt_gen;

int lpto_interrupt(void)
{
    int n = lpto_active_interrupt();
    atomic_fetch_add(&interrupt_gen, 1);   /* a step's wait returns */
    return n;
}

void *lpto_idle_begin(lua_State *L)
{
    lpto_gil *g = lpto_gil_of(L);   /* read while the lock is still ours */
    if (g) lpto_gil_release(g);
    return g;
}

static void observe_open_runs(lua_State *L);

void lpto_idle_end(lua_State *L, void *token)
{
    if (!token) return;
    lpto_gil_acquire(token);
    observe_open_runs(L);
}

/* ---- the Workers of this state, in creation order (pto.workers) ---- */

void lpto_debug_track(lua_State *L, int idx)
{
    idx = lua_absindex(L, idx);
    lpto_weak_registry(L, &WORKERS_KEY, "v");
    /* Collected entries leave holes: keep a counter rather than #t. */
    lua_getfield(L, -1, "n");
    lua_Integer n = lua_tointeger(L, -1) + 1;
    lua_pop(L, 1);
    lua_pushinteger(L, n);
    lua_setfield(L, -2, "n");
    lua_pushvalue(L, idx);
    lua_rawseti(L, -2, n);
    lua_pop(L, 1);
}

/* pto.workers() -> the Workers not closed and not children of another, oldest first. */
static int l_workers(lua_State *L)
{
    lua_newtable(L);
    if (lua_rawgetp(L, LUA_REGISTRYINDEX, &WORKERS_KEY) != LUA_TTABLE) return 1;
    lua_getfield(L, -1, "n");
    lua_Integer n = lua_tointeger(L, -1), k = 0;
    lua_pop(L, 1);
    for (lua_Integer i = 1; i <= n; i++) {
        if (lua_rawgeti(L, -1, i) == LUA_TUSERDATA) {
            lworker *W = lua_touserdata(L, -1);
            if (W->state != W_CLOSED && !W->parent) {
                lua_rawseti(L, -3, ++k);
                continue;
            }
        }
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    return 1;
}

/* ---- interactive runs ---- */

static void observe_open_runs(lua_State *L)
{
    if (lua_rawgetp(L, LUA_REGISTRYINDEX, &WORKERS_KEY) != LUA_TTABLE) {
        lua_pop(L, 1);
        return;
    }
    lua_getfield(L, -1, "n");
    lua_Integer n = lua_tointeger(L, -1);
    lua_pop(L, 1);
    for (lua_Integer i = 1; i <= n; i++) {
        if (lua_rawgeti(L, -1, i) == LUA_TUSERDATA) {
            lworker *W = lua_touserdata(L, -1);
            if (W->state != W_CLOSED && W->in_run && W->interactive) pto_check_observed(W->w);
        }
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
}

/* w:open_run([args, cfg]) -> orch, args, cfg */
static int w_open_run(lua_State *L)
{
    const char *who = "Worker:open_run";
    lworker *W = lpto_check_worker(L, 1, who);
    if (W->parent)
        return lpto_error(L, who, "this Worker is a child of a level-%d Worker, which runs it; open the run on that "
                                  "Worker", W->parent->level);
    if (W->interactive)
        return lpto_error(L, who, "a run opened by Worker:open_run is already open on this Worker; end it with "
                                  "Worker:close_run (:finish at the prompt) first");
    if (W->in_run) return lpto_error(L, who, "a run of this Worker is in progress (runs do not nest)");
    lua_settop(L, 3);
    lpto_worker_init(L, 1, W, who);
    lpto_runs_before_blocking(L, W, who);
    pto_orch *o = pto_run_begin(W->w);
    if (!o) return lpto_engine_error(L, who);
    W->in_run = true;
    W->interactive = true;
    lpto_push_orch(L, 1, W, o);
    lua_pushvalue(L, -1);
    lua_setiuservalue(L, 1, UV_ORCH);
    lua_pushvalue(L, 2);
    lua_pushvalue(L, 3);
    return 3;
}

/* w:close_run() -> true, or raises the run's first failure. */
static int w_close_run(lua_State *L)
{
    const char *who = "Worker:close_run";
    lworker *W = lpto_check_worker(L, 1, who);
    if (!W->interactive)
        return lpto_error(L, who, "no run opened by Worker:open_run is open on this Worker (open one with "
                                  "orch = w:open_run())");
    lua_settop(L, 1);
    lua_getiuservalue(L, 1, UV_ORCH);   /* 2 */
    int rc = lpto_wait_run(W, NULL);
    char *fail = rc != 0 ? strdup(pto_errmsg()) : NULL;
    W->in_run = false;
    W->interactive = false;
    lpto_orch_end(L, 2);
    lua_pushnil(L);
    lua_setiuservalue(L, 1, UV_ORCH);
    if (fail) {
        lua_pushfstring(L, "%s: %s", who, fail);
        free(fail);
        lpto_check_explain(L);
        return lua_error(L);
    }
    lua_pushboolean(L, 1);
    return 1;
}

/* w:orch() -> the open interactive run's orchestrator; while submitted runs are outstanding, one that
 * inspects them (orch:task, orch:tasks, orch:dag, ...); else nil. */
static int w_orch(lua_State *L)
{
    lworker *W = lpto_check_worker(L, 1, "Worker:orch");
    if (W->interactive) {
        lua_getiuservalue(L, 1, UV_ORCH);
        return 1;
    }
    if (!W->runs_open || W->in_run) return 0;
    /* Submitted runs are outstanding: an orchestrator that inspects their session. */
    lorch *O = lpto_push_orch(L, 1, W, W->session_o);
    O->inspect_only = true;
    O->session = W->session;
    return 1;
}

/* ---- dispatch control ---- */

static lworker *check_ready(lua_State *L, const char *who)
{
    lworker *W = lpto_check_worker(L, 1, who);
    if (W->state != W_READY)
        lpto_error(L, who, "this Worker is not initialised yet: dispatch control needs its scheduler (call "
                           "Worker:init, or open a run with Worker:open_run)");
    return W;
}

/* Holding or breaking before the first run is the usual start of a
 * session, so these two initialise a new Worker, as Worker:run does. */
static lworker *check_init(lua_State *L, const char *who)
{
    lworker *W = lpto_check_worker(L, 1, who);
    if (W->parent)
        lpto_error(L, who, "this Worker is a child of a level-%d Worker, which runs it; control that Worker's dispatch",
                   W->parent->level);
    lpto_worker_init(L, 1, W, who);
    return W;
}

static int w_hold(lua_State *L)
{
    lworker *W = check_init(L, "Worker:hold");
    if (pto_dispatch_hold(W->w, 1) != 0) return lpto_engine_error(L, "Worker:hold");
    return 0;
}

static int w_release(lua_State *L)
{
    lworker *W = check_ready(L, "Worker:release");
    if (pto_dispatch_hold(W->w, 0) != 0) return lpto_engine_error(L, "Worker:release");
    return 0;
}

/* w:set_check(on | "warn"): check mode (docs/check.md) for the runs that begin from now on. */
static int w_set_check(lua_State *L)
{
    const char *who = "Worker:set_check";
    lworker *W = lpto_check_worker(L, 1, who);
    bool warn = lua_type(L, 2) == LUA_TSTRING && strcmp(lua_tostring(L, 2), "warn") == 0;
    if (lua_type(L, 2) != LUA_TBOOLEAN && !warn)
        return lpto_error(L, who, "expected true or false, or \"warn\" (got %s)", luaL_typename(L, 2));
    if (!W->w) return lpto_error(L, who, "the Worker is closed");
    if (lua_toboolean(L, 2)) lpto_check_record();
    pto_worker_check_set(W->w, warn ? PTO_CHECK_WARN : lua_toboolean(L, 2) ? PTO_CHECK_ON : 0);
    return 0;
}

/* Wait until dispatch is quiet, in slices, so Ctrl-C gets through and
 * THREAD-mode subs can take the interpreter lock. */
static int wait_quiet(lua_State *L, lworker *W, double timeout_s, const char *who)
{
    unsigned gen = atomic_load(&interrupt_gen);
    uint64_t t0 = lpto_now_ns();
    for (;;) {
        lpto_gil_release(W->gil);
        int r = pto_dispatch_wait(W->w, 20);
        lpto_gil_acquire(W->gil);
        if (r < 0) return lpto_engine_error(L, who);
        if (r == 1) return 1;
        if (atomic_load(&interrupt_gen) != gen)
            return lpto_error(L, who, "interrupted while tasks were still running (they go on; dispatch stays as "
                                      "it was)");
        if ((double)(lpto_now_ns() - t0) * 1e-9 >= timeout_s) return 0;
    }
}

/* w:step([n = 1 [, timeout_s = 60]]) -> true once the n tasks (and any they
 * made ready, up to n in all) have finished; false if time ran out. */
/* w:set_catch(on): stop on failure (docs/check.md): a failed task holds dispatch before its consumers are
 * poisoned, until w:retry(id) or w:release(). */
static int w_set_catch(lua_State *L)
{
    const char *who = "Worker:set_catch";
    lworker *W = lpto_check_worker(L, 1, who);
    if (lua_type(L, 2) != LUA_TBOOLEAN)
        return lpto_error(L, who, "expected true or false (got %s)", luaL_typename(L, 2));
    if (!W->w) return lpto_error(L, who, "the Worker is closed");
    pto_worker_catch_set(W->w, lua_toboolean(L, 2));
    return 0;
}

/* w:retry(id [, handle] [, timeout_s]): run the caught failed task id again (as handle, a callable
 * registered since, e.g. a fixed one), release dispatch and wait like w:wait -> boolean. */
static int w_retry(lua_State *L)
{
    const char *who = "Worker:retry";
    lworker *W = check_ready(L, who);
    lua_Integer id = luaL_checkinteger(L, 2);
    int t = 3;
    int32_t kind = -2;
    uint64_t callable = 0;
    if (lua_type(L, 3) == LUA_TUSERDATA) {
        const lhandle *h = lpto_check_handle(L, 3, W, who);
        /* A chip kernel runs as a next-level task; a function as a sub at level 3, at level 4 and above
         * as either (a Worker child's orchestration function): there the task's own kind. */
        kind = h->kind == LPTO_HANDLE_KERNEL ? PTO_NEXT_LEVEL : W->level >= 4 ? -1 : PTO_SUB;
        callable = h->callable;
        t = 4;
    } else if (!lua_isnoneornil(L, 3) && lua_type(L, 3) != LUA_TNUMBER) {
        return lpto_error(L, who, "argument 2 must be a handle from Worker:register (the callable to run it as) or "
                          "a timeout in seconds (got %s)", luaL_typename(L, 3));
    }
    double timeout = luaL_optnumber(L, t, 60);
    if (pto_dispatch_retry_as(W->w, (int64_t)id, kind, callable) != 0) return lpto_engine_error(L, who);
    lua_pushboolean(L, wait_quiet(L, W, timeout, who));
    return 1;
}

static int w_step(lua_State *L)
{
    const char *who = "Worker:step";
    lworker *W = check_ready(L, who);
    lua_Integer n = luaL_optinteger(L, 2, 1);
    double timeout = luaL_optnumber(L, 3, 60);
    pto_dispatch_state st;
    pto_dispatch_get(W->w, &st);
    if (n >= 1 && !st.held)
        return lpto_error(L, who, "dispatch is not held, so every ready task already runs; hold it first "
                                  "(Worker:hold or :hold)");
    if (pto_dispatch_step(W->w, (int64_t)n) != 0) return lpto_engine_error(L, who);
    lua_pushboolean(L, wait_quiet(L, W, timeout, who));
    return 1;
}

/* w:sync(): task states are current once it returns (every submit so far
 * wired). Nothing to do for a Worker that has no scheduler yet. */
static int w_sync(lua_State *L)
{
    lworker *W = lpto_check_worker(L, 1, "Worker:sync");
    if (W->state == W_READY && pto_dispatch_sync(W->w) != 0) return lpto_engine_error(L, "Worker:sync");
    return 0;
}

/* w:wait([timeout_s = 60]) -> true once nothing runs and nothing more may dispatch. */
static int w_wait(lua_State *L)
{
    const char *who = "Worker:wait";
    lworker *W = check_ready(L, who);
    lua_pushboolean(L, wait_quiet(L, W, luaL_optnumber(L, 2, 60), who));
    return 1;
}

/* The engine kind(s) a handle's tasks run as: a function at level >= 4 may
 * be submitted both to subs and to Worker children. */
static void set_break(lworker *W, const lhandle *h, int on)
{
    if (h->kind == LPTO_HANDLE_KERNEL) {
        pto_dispatch_break(W->w, PTO_NEXT_LEVEL, h->callable, on);
        return;
    }
    pto_dispatch_break(W->w, PTO_SUB, h->callable, on);
    if (W->level >= 4) pto_dispatch_break(W->w, PTO_NEXT_LEVEL, h->callable, on);
}

/* w:set_break(handle): hold dispatch before any task of handle's callable would start. */
static int w_set_break(lua_State *L)
{
    lworker *W = check_init(L, "Worker:set_break");
    set_break(W, lpto_check_handle(L, 2, W, "Worker:set_break"), 1);
    return 0;
}

/* w:clear_break([handle]): remove that breakpoint, or all. */
static int w_clear_break(lua_State *L)
{
    lworker *W = check_ready(L, "Worker:clear_break");
    if (lua_isnoneornil(L, 2)) {
        pto_dispatch_break(W->w, PTO_SUB, UINT64_MAX, 0);
        pto_dispatch_break(W->w, PTO_NEXT_LEVEL, UINT64_MAX, 0);
    } else {
        set_break(W, lpto_check_handle(L, 2, W, "Worker:clear_break"), 0);
    }
    return 0;
}

/* Set field "breaks" of the table on top: the names of the callables with
 * a breakpoint (a function at level >= 4 has one per kind: named once). */
static void push_breaks(lua_State *L, lworker *W)
{
    int32_t kinds[64];
    uint64_t callables[64];
    int32_t n = pto_dispatch_breakpoints(W->w, kinds, callables, 64);
    lua_createtable(L, n < 64 ? n : 64, 0);
    int k = 0;
    for (int32_t i = 0; i < n && i < 64; i++) {
        bool seen = false;
        for (int32_t j = 0; j < i && !seen; j++) seen = callables[j] == callables[i] && kinds[j] != kinds[i];
        if (seen) continue;
        char name[256];
        if (pto_worker_callable_name_get(W->w, kinds[i], callables[i], name, sizeof name) >= 0) lua_pushstring(L, name);
        else lua_pushfstring(L, "callable %d", (int)callables[i]);
        lua_rawseti(L, -2, ++k);
    }
    lua_setfield(L, -2, "breaks");
}

/* w:dispatch() -> {held, breakpoints, breaks = {name, ...}, step_left, break_task, running, caught} */
static int w_dispatch(lua_State *L)
{
    lworker *W = lpto_check_worker(L, 1, "Worker:dispatch");
    pto_dispatch_state st;
    pto_dispatch_get(W->state == W_READY ? W->w : NULL, &st);
    lua_createtable(L, 0, 5);
    lua_pushboolean(L, st.held);
    lua_setfield(L, -2, "held");
    lua_pushinteger(L, st.breakpoints);
    lua_setfield(L, -2, "breakpoints");
    lua_pushinteger(L, st.step_left);
    lua_setfield(L, -2, "step_left");
    if (st.break_task >= 0 && W->in_run) {
        lua_pushinteger(L, st.break_task);
        lua_setfield(L, -2, "break_task");
    }
    lua_pushinteger(L, st.running);
    lua_setfield(L, -2, "running");
    if (st.caught_task >= 0 && W->in_run) {
        lua_pushinteger(L, st.caught_task);
        lua_setfield(L, -2, "caught");
    }
    if (W->state == W_READY) push_breaks(L, W);
    return 1;
}

/* w:callables() -> {{handle =, name =, kind = "chip" | "function"}, ...} in registration order. */
static int w_callables(lua_State *L)
{
    lworker *W = lpto_check_worker(L, 1, "Worker:callables");
    lua_newtable(L);
    lua_getiuservalue(L, 1, UV_HANDLES);
    for (lua_Integer i = 1; lua_rawgeti(L, -1, i) == LUA_TUSERDATA; i++) {
        lhandle *h = lua_touserdata(L, -1);
        lua_createtable(L, 0, 3);
        lua_insert(L, -2);
        lua_setfield(L, -2, "handle");
        lua_pushstring(L, h->kind == LPTO_HANDLE_KERNEL ? "chip" : "function");
        lua_setfield(L, -2, "kind");
        char name[256];
        int kind = h->kind == LPTO_HANDLE_KERNEL || W->nsubs == 0 ? PTO_NEXT_LEVEL : PTO_SUB;
        if (W->w && pto_worker_callable_name_get(W->w, kind, h->callable, name, sizeof name) >= 0) {
            lua_pushstring(L, name);
            lua_setfield(L, -2, "name");
        }
        lua_rawseti(L, -3, i);
    }
    lua_pop(L, 2);
    return 1;
}

/* w:children() -> {{kind = "chip" | "sub" | "worker", index, name, pid, task, running_ms, tasks_run}, ...} */
static int w_children(lua_State *L)
{
    lworker *W = lpto_check_worker(L, 1, "Worker:children");
    lua_newtable(L);
    if (W->state != W_READY) return 1;
    int k = 0;
    for (int kind = PTO_NEXT_LEVEL; kind <= PTO_SUB; kind++) {
        int n = pto_worker_count(W->w, kind);
        for (int i = 0; i < n; i++) {
            pto_child_info ci;
            if (pto_worker_child_info_get(W->w, kind, i, &ci) != 0) continue;
            const char *kname = kind == PTO_SUB ? "sub" : W->level >= 4 ? "worker" : "chip";
            lua_createtable(L, 0, 7);
            lua_pushstring(L, kname);
            lua_setfield(L, -2, "kind");
            lua_pushinteger(L, i + 1);
            lua_setfield(L, -2, "index");
            if (kind == PTO_NEXT_LEVEL && W->level >= 4) lua_pushfstring(L, "L%d worker %d", W->level - 1, i + 1);
            else lua_pushfstring(L, "%s %d", kname, i + 1);
            lua_setfield(L, -2, "name");
            if (W->mode == PTO_MODE_PROCESS) {
                lua_pushinteger(L, ci.pid);
                lua_setfield(L, -2, "pid");
            }
            if (ci.current_task >= 0) {
                lua_pushinteger(L, ci.current_task);
                lua_setfield(L, -2, "task");
                /* so that a hang shows at the prompt */
                lua_pushinteger(L, ci.running_ns / 1000000);
                lua_setfield(L, -2, "running_ms");
            }
            lua_pushinteger(L, ci.tasks_run);
            lua_setfield(L, -2, "tasks_run");
            lua_rawseti(L, -2, ++k);
        }
    }
    return 1;
}

/* w:trace_status() -> {active = bool, events = n, dropped = n}: the prompt's
 * :trace without an argument. A closed Worker is not tracing. */
static int w_trace_status(lua_State *L)
{
    lworker *W = lpto_check_worker(L, 1, "Worker:trace_status");
    bool on = W->state != W_CLOSED && W->w && pto_trace_active(W->w);
    lua_createtable(L, 0, 3);
    lua_pushboolean(L, on);
    lua_setfield(L, -2, "active");
    lua_pushinteger(L, on ? (lua_Integer)pto_trace_events(W->w) : 0);
    lua_setfield(L, -2, "events");
    lua_pushinteger(L, on ? (lua_Integer)pto_trace_dropped(W->w) : 0);
    lua_setfield(L, -2, "dropped");
    return 1;
}

const luaL_Reg lpto_debug_methods[] = {
    {"open_run", w_open_run}, {"close_run", w_close_run}, {"orch", w_orch},
    {"hold", w_hold}, {"set_check", w_set_check}, {"set_catch", w_set_catch}, {"retry", w_retry}, {"release", w_release}, {"step", w_step}, {"wait", w_wait}, {"sync", w_sync},
    {"set_break", w_set_break}, {"clear_break", w_clear_break}, {"dispatch", w_dispatch},
    {"callables", w_callables}, {"children", w_children}, {"trace_status", w_trace_status}, {NULL, NULL}};

void lpto_open_debug(lua_State *L)
{
    lua_pushcfunction(L, l_workers);
    lua_setfield(L, -2, "workers");
}
