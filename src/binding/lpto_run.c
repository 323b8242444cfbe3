/* lpto_run.c - run handles: Worker:submit, Worker:wait_all, the pto.Run
 * handle (wait, done, status, cancel, to-be-closed) and pto.wait_any.
 *
 * Worker:submit runs the function as Worker:run does, on the calling
 * thread, but returns when the function does: the engine keeps every
 * submitted run of a Worker in one shared engine run (the session, see the
 * engine's run.h), so later runs are ordered after earlier ones by the tag
 * rules and overlap them otherwise. The binding's share:
 *   - a handle keeps what the function returned and the storages the run
 *     pinned (arena tensors its tasks use must outlive the function);
 *   - the Worker keeps every handle not yet observed (waited on, or
 *     reported by wait_all) in UV_RUNS, keyed by run id, so a failure
 *     nobody asked about still surfaces at wait_all, and a dropped handle's
 *     run still completes;
 *   - once no submitted run is live, the session ends (rings and task ids
 *     reset), and a plain Worker:run is a blocking run again;
 *   - while the session is open the Worker is on the list Ctrl-C
 *     interrupts, so an interrupted script's outstanding runs stop too. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>
#include <unistd.h>

#include "lpto_priv.h"

#define LPTO_RUN "pto.Run"
#define WAIT_ANY_SLICE_MS 2

/* Handle user values. */
enum { RUV_WORKER = 1, RUV_RESULTS, RUV_PINS, RUV_TASKS, RUV_COUNT = RUV_TASKS };   /* RUV_TASKS: its tasks' result boxes */

typedef struct lrun {
    pto_run *r;
    lworker *W;                /* kept alive by RUV_WORKER */
    int64_t id;
    bool observed;             /* its outcome was delivered (wait, wait_all) */
} lrun;

static lrun *check_run(lua_State *L, int idx, const char *who)
{
    lrun *R = luaL_testudata(L, idx, LPTO_RUN);
    if (!R) {
        const char *m = strchr(who, ':') ? strchr(who, ':') + 1 : who;
        lpto_error(L, who, "expected a run handle returned by Worker:submit (call it as h:%s(...)), got %s", m,
                   luaL_typename(L, idx));
    }
    return R;
}

/* The session ends once nothing in it is live, so that task ids and rings restart. */
static void settle(lua_State *L, lworker *W, const char *who)
{
    if (!W->runs_open || W->in_run || W->state != W_READY || pto_runs_live(W->w) > 0) return;
    int rc = pto_runs_end(W->w);
    W->runs_open = false;
    lpto_active_remove(W->w);
    if (rc < 0) lpto_engine_error(L, who);
}

void lpto_runs_before_blocking(lua_State *L, lworker *W, const char *who)
{
    if (!W->runs_open) return;
    settle(L, W, who);
    if (W->runs_open)
        lpto_error(L, who, "runs submitted with Worker:submit are still running on this Worker; wait for them "
                           "(Worker:wait_all) first");
}

/* Block until R's tasks have all finished, the interpreter lock given up. */
static void wait_engine(lua_State *L, lrun *R, const char *who)
{
    lworker *W = R->W;
    if (pto_run_wait(W->w, R->r, 0) == 1) return;
    lpto_active_add(W->w);   /* Ctrl-C interrupts what it waits for */
    lpto_gil_release(W->gil);
    int rc = pto_run_wait(W->w, R->r, -1);
    lpto_gil_acquire(W->gil);
    lpto_active_remove(W->w);
    if (rc < 0) lpto_engine_error(L, who);
}

/* Push the Worker's table of unobserved handles (R at idx). */
static void push_runs_table(lua_State *L, int idx)
{
    lua_getiuservalue(L, idx, RUV_WORKER);
    lua_getiuservalue(L, -1, UV_RUNS);
    lua_remove(L, -2);
}

/* R (at idx) was observed: the Worker lets go of it. */
static void forget(lua_State *L, int idx, lrun *R)
{
    R->observed = true;
    lua_pushnil(L);
    lua_setiuservalue(L, idx, RUV_PINS);
    if (R->W->state == W_CLOSED) return;
    push_runs_table(L, idx);
    lua_pushnil(L);
    lua_rawseti(L, -2, R->id);
    lua_pop(L, 1);
}

/* Push R's failure as Worker:run words it (a level's failure names its level). */
static bool push_failure(lua_State *L, lrun *R)
{
    pto_run_info in;
    pto_run_info_get(R->r, &in);
    if (in.state == PTO_RUN_OK || in.state == PTO_RUN_RUNNING) return false;
    char buf[2048];
    if (in.state == PTO_RUN_CANCELLED) snprintf(buf, sizeof buf, "run %lld was cancelled", (long long)R->id);
    else if (!pto_run_failure(R->r, buf, sizeof buf)) snprintf(buf, sizeof buf, "run %lld failed", (long long)R->id);
    lpto_push_run_failure(L, R->W, buf);
    return true;
}

/* Push R's results (what its function returned); returns their count. */
static int push_results(lua_State *L, int idx)
{
    lua_getiuservalue(L, idx, RUV_RESULTS);
    int t = lua_gettop(L);
    lua_getfield(L, t, "n");
    int n = (int)lua_tointeger(L, -1);
    lua_pop(L, 1);
    luaL_checkstack(L, n, "too many results");
    for (int i = 1; i <= n; i++) lua_rawgeti(L, t, i);
    lua_remove(L, t);
    return n;
}

static void check_worker_open(lua_State *L, lrun *R, const char *who)
{
    if (R->W->state == W_CLOSED)
        lpto_error(L, who, "the Worker of run %lld is closed (it waited for the run when it closed); wait for a run "
                           "before closing its Worker, or read h:status()",
                   (long long)R->id);
    if (R->W->owner != getpid())
        lpto_error(L, who, "run %lld belongs to the process that submitted it, not to this child", (long long)R->id);
}

/* h:wait() -> what the run's function returned, or raises the run's failure. */
static int r_wait(lua_State *L)
{
    const char *who = "Run:wait";
    lrun *R = check_run(L, 1, who);
    check_worker_open(L, R, who);
    lua_settop(L, 1);
    wait_engine(L, R, who);
    forget(L, 1, R);
    settle(L, R->W, who);
    if (push_failure(L, R)) {
        lua_pushfstring(L, "%s: %s", who, lua_tostring(L, -1));
        return lua_error(L);
    }
    return push_results(L, 1);
}

/* h:done() -> true once every task of the run has finished (no wait). */
static int r_done(lua_State *L)
{
    lrun *R = check_run(L, 1, "Run:done");
    pto_run_info in;
    pto_run_info_get(R->r, &in);
    lua_pushboolean(L, in.state != PTO_RUN_RUNNING);
    return 1;
}

/* h:result(id [, member]) -> what the orchestration function of its task id
 * (submitted to a Worker child; of that member of a group) returned, once
 * that task completed. */
static int r_result(lua_State *L)
{
    const char *who = "Run:result";
    check_run(L, 1, who);
    lua_Integer id = luaL_checkinteger(L, 2);
    lua_Integer member = luaL_optinteger(L, 3, 0);
    lua_settop(L, 3);
    lua_getiuservalue(L, 1, RUV_TASKS);
    return lpto_result_push(L, 4, id, member, NULL, who);
}

static const char *const STATES[] = {"running", "ok", "failed", "cancelled"};

/* h:status() -> "running" | "ok" | "failed" | "cancelled", {id, submitted, completed, failed} */
static int r_status(lua_State *L)
{
    lrun *R = check_run(L, 1, "Run:status");
    pto_run_info in;
    pto_run_info_get(R->r, &in);
    lua_pushstring(L, STATES[in.state]);
    lua_createtable(L, 0, 4);
    lpto_set_int(L, "id", R->id);
    lpto_set_int(L, "submitted", in.submitted);
    lpto_set_int(L, "completed", in.completed);
    lpto_set_int(L, "failed", in.failed);
    return 2;
}

/* h:cancel(): none of its tasks is dispatched any more; true if it was still running. */
static int r_cancel(lua_State *L)
{
    const char *who = "Run:cancel";
    lrun *R = check_run(L, 1, who);
    check_worker_open(L, R, who);
    pto_run_info in;
    pto_run_info_get(R->r, &in);
    if (in.state != PTO_RUN_RUNNING) return lua_pushboolean(L, 0), 1;
    pto_run_cancel(R->W->w, R->r);
    lua_pushboolean(L, 1);
    return 1;
}

/* __close: closing a handle waits for its run; its failure is raised unless
 * an error is already on its way out (then it stays for wait_all). */
static int r_close(lua_State *L)
{
    lrun *R = check_run(L, 1, "Run:close");
    if (R->observed || R->W->state == W_CLOSED || R->W->owner != getpid()) return 0;
    if (!lua_isnil(L, 2)) {
        wait_engine(L, R, "Run:close");
        return 0;
    }
    lua_settop(L, 1);
    r_wait(L);   /* raises the run's failure; its results are not wanted */
    return 0;
}

static int r_gc(lua_State *L)
{
    lrun *R = lua_touserdata(L, 1);
    if (R->r) pto_run_free(R->r);
    R->r = NULL;
    return 0;
}

static int r_tostring(lua_State *L)
{
    lrun *R = lua_touserdata(L, 1);
    pto_run_info in;
    pto_run_info_get(R->r, &in);
    lua_pushfstring(L, "Run(%d, %s, %d of %d tasks finished)", (int)R->id, STATES[in.state],
                    (int)(in.completed + in.failed), (int)in.submitted);
    return 1;
}

static int r_index(lua_State *L)
{
    lrun *R = lua_touserdata(L, 1);
    const char *k = lua_tostring(L, 2);
    if (k && strcmp(k, "id") == 0) return lua_pushinteger(L, R->id), 1;
    luaL_getmetafield(L, 1, "methods");
    lua_getfield(L, -1, k);
    return 1;
}

/* ---- Worker:submit --------------------------------------------------------------- */

/* Runs that finished without a failure have nothing left to report: the
 * Worker lets go of them (their handles still answer), from the oldest up to
 * the first one still running, so UV_RUNS holds what is in flight and the
 * failures nobody has seen. */
static void prune(lua_State *L, int widx, lworker *W)
{
    lua_getiuservalue(L, widx, UV_RUNS);
    int t = lua_gettop(L);
    bool lead = true;   /* run_lo advances over the leading entries let go of */
    for (int64_t id = W->run_lo; id > 0 && id <= W->run_hi; id++) {
        if (lua_rawgeti(L, t, id) == LUA_TNIL) {
            lua_pop(L, 1);
            if (lead) W->run_lo = id + 1;
            continue;
        }
        lrun *R = lua_touserdata(L, -1);
        lua_pop(L, 1);
        pto_run_info in;
        pto_run_info_get(R->r, &in);
        if (in.state == PTO_RUN_RUNNING) break;
        if (in.state != PTO_RUN_OK) {
            lead = false;
            continue;
        }
        lua_pushnil(L);
        lua_rawseti(L, t, id);
        if (lead) W->run_lo = id + 1;
    }
    if (W->run_lo > W->run_hi) W->run_lo = W->run_hi = 0;
    lua_pop(L, 1);
}

/* Run fn(orch, args, cfg) (at 2, 3, 4 of the Worker at 1) as a submitted
 * run; push its handle. A failing function raises here, unchanged (its
 * tasks already submitted still run, as no one waits for them). */
static int submit_run(lua_State *L, const char *who)
{
    lworker *W = lpto_check_worker(L, 1, who);
    lpto_worker_check_can_run(L, W, who);
    if (W->owner != getpid() || (!W->parent && W->state == W_READY && !pthread_equal(W->home, pthread_self())))
        lpto_error(L, who, "this Worker can be run only by the thread that created it, not from a sub callable; "
                           "submit tasks from its orchestration function instead");
    lua_settop(L, 4);
    lpto_worker_init(L, 1, W, who);
    if (W->run_lo) prune(L, 1, W);
    /* A new session once the last one went quiet: ids and rings restart. */
    if (W->runs_open && pto_runs_live(W->w) == 0) settle(L, W, who);
    pto_run *run;
    pto_orch *o = pto_run_submit(W->w, &run);
    if (!o) return lpto_engine_error(L, who);
    /* While runs are outstanding, Ctrl-C interrupts them, waited for or not. */
    if (!W->runs_open) {
        lpto_active_add(W->w);
        W->session = lpto_next_serial();   /* w:orch() inspects this session until it settles */
        W->session_o = o;
    }
    W->runs_open = true;
    W->in_run = true;
    lpto_active_add(W->w);
    lpto_push_orch(L, 1, W, o);   /* 5 */
    lua_pushvalue(L, 5);
    lua_setiuservalue(L, 1, UV_ORCH);

    int base = lua_gettop(L);
    lua_pushvalue(L, 2);
    lua_pushvalue(L, 5);
    lua_pushvalue(L, 3);
    lua_pushvalue(L, 4);
    int status = lua_pcall(L, 3, LUA_MULTRET, 0);
    int nres = lua_gettop(L) - base;

    pto_run_submitted(W->w, run);
    lpto_active_remove(W->w);
    W->in_run = false;
    lua_getiuservalue(L, 5, OUV_PINS);   /* its arena storages live until its tasks have run */
    int pins = lua_gettop(L);
    lua_getiuservalue(L, 5, OUV_RESULTS);
    int tasks = lua_gettop(L);
    lpto_orch_end(L, 5);
    lua_pushnil(L);
    lua_setiuservalue(L, 1, UV_ORCH);
    if (status != LUA_OK) {
        pto_run_free(run);
        lua_pushvalue(L, base + 1);
        return lua_error(L);
    }
    lua_createtable(L, nres, 1);   /* the results */
    for (int i = 1; i <= nres; i++) {
        lua_pushvalue(L, base + i);
        lua_rawseti(L, -2, i);
    }
    lua_pushinteger(L, nres);
    lua_setfield(L, -2, "n");
    int results = lua_gettop(L);

    lrun *R = lua_newuserdatauv(L, sizeof *R, RUV_COUNT);
    pto_run_info in;
    pto_run_info_get(run, &in);
    *R = (lrun){run, W, in.id, false};
    luaL_setmetatable(L, LPTO_RUN);
    lua_pushvalue(L, 1);
    lua_setiuservalue(L, -2, RUV_WORKER);
    lua_pushvalue(L, results);
    lua_setiuservalue(L, -2, RUV_RESULTS);
    lua_pushvalue(L, pins);
    lua_setiuservalue(L, -2, RUV_PINS);
    lua_pushvalue(L, tasks);
    lua_setiuservalue(L, -2, RUV_TASKS);
    lua_getiuservalue(L, 1, UV_RUNS);
    lua_pushvalue(L, -2);
    lua_rawseti(L, -2, R->id);
    lua_pop(L, 1);
    if (W->run_lo == 0) W->run_lo = R->id;
    W->run_hi = R->id;
    return 1;
}

/* w:submit(fn, args, cfg) -> run handle */
static int w_submit(lua_State *L) { return submit_run(L, "Worker:submit"); }

int lpto_run_submit_child(lua_State *L) { return submit_run(L, NULL); }

pto_run *lpto_run_engine(lua_State *L, int idx) { return ((lrun *)lua_touserdata(L, idx))->r; }

int lpto_run_blocking(lua_State *L, const char *who)
{
    submit_run(L, who);
    return lpto_run_finish(L, lua_gettop(L), who);
}

int lpto_run_finish(lua_State *L, int h, const char *who)
{
    h = lua_absindex(L, h);
    lrun *R = lua_touserdata(L, h);
    lworker *W = R->W;
    wait_engine(L, R, who);
    forget(L, h, R);
    settle(L, W, who);
    if (push_failure(L, R)) {
        if (who) lua_pushfstring(L, "%s: %s", who, lua_tostring(L, -1));
        return lua_error(L);
    }
    return push_results(L, h);
}

/* Wait for every submitted run of W (at idx); push the first unobserved
 * failure (with its run id) and return 1, or return 0. Every handle is then
 * observed. */
int lpto_runs_wait_all(lua_State *L, int idx, lworker *W, const char *who)
{
    idx = lua_absindex(L, idx);
    if (!W->runs_open && W->run_lo == 0) return 0;
    lua_pushnil(L);   /* m: the first failure */
    int m = lua_gettop(L);
    /* One wait for all of them, then each handle's outcome (all known by then). */
    if (W->runs_open && W->state == W_READY && pto_run_wait(W->w, NULL, 0) != 1) {
        lpto_active_add(W->w);
        lpto_gil_release(W->gil);
        int rc = pto_run_wait(W->w, NULL, -1);
        lpto_gil_acquire(W->gil);
        lpto_active_remove(W->w);
        if (rc < 0) lpto_engine_error(L, who);
    }
    lua_getiuservalue(L, idx, UV_RUNS);
    int t = lua_gettop(L);
    for (int64_t id = W->run_lo; id > 0 && id <= W->run_hi; id++) {
        if (lua_rawgeti(L, t, id) == LUA_TNIL) {
            lua_pop(L, 1);
            continue;
        }
        lrun *R = lua_touserdata(L, -1);
        wait_engine(L, R, who);
        forget(L, lua_gettop(L), R);
        if (lua_isnil(L, m) && push_failure(L, R)) {
            lua_pushfstring(L, "run %d: %s", (int)R->id, lua_tostring(L, -1));
            lua_replace(L, m);
            lua_pop(L, 1);
        }
        lua_pop(L, 1);
    }
    W->run_lo = W->run_hi = 0;
    lua_pop(L, 1);
    settle(L, W, who);
    if (!lua_isnil(L, m)) return 1;
    lua_pop(L, 1);
    return 0;
}

/* w:wait_all(): waits for every run submitted to w; raises the first failure nobody waited for. */
static int w_wait_all(lua_State *L)
{
    const char *who = "Worker:wait_all";
    lworker *W = lpto_check_worker(L, 1, who);
    if (W->in_run) return lpto_error(L, who, "a run's function is running; wait for runs outside of it");
    lua_settop(L, 1);
    if (lpto_runs_wait_all(L, 1, W, who)) {
        lua_pushfstring(L, "%s: %s", who, lua_tostring(L, -1));
        return lua_error(L);
    }
    return 0;
}

/* w:runs() -> {handle, ...}: the submitted runs whose outcome nobody has
 * observed yet (running, or finished and not waited for), oldest first. */
static int w_runs(lua_State *L)
{
    lworker *W = lpto_check_worker(L, 1, "Worker:runs");
    lua_settop(L, 1);
    lua_newtable(L);
    lua_getiuservalue(L, 1, UV_RUNS);
    lua_Integer n = 0;
    for (int64_t id = W->run_lo; id > 0 && id <= W->run_hi; id++) {
        if (lua_rawgeti(L, 3, id) == LUA_TNIL) {
            lua_pop(L, 1);
            continue;
        }
        lua_rawseti(L, 2, ++n);
    }
    lua_pop(L, 1);
    return 1;
}

/* pto.wait_any({h1, h2, ...} [, timeout_s]) -> the first finished handle and its index, or nil on timeout. */
static int l_wait_any(lua_State *L)
{
    const char *who = "pto.wait_any";
    if (!lua_istable(L, 1))
        return lpto_error(L, who, "expected a list of run handles like {h1, h2} (got %s)", luaL_typename(L, 1));
    double limit = -1;
    if (!lua_isnoneornil(L, 2)) {
        if (!lua_isnumber(L, 2) || lua_tonumber(L, 2) < 0)
            return lpto_error(L, who, "the timeout must be a number of seconds >= 0 (got %s)", luaL_tolstring(L, 2, NULL));
        limit = lua_tonumber(L, 2);
    }
    lua_Integer n = luaL_len(L, 1);
    if (n < 1) return lpto_error(L, who, "the list of run handles is empty; give at least one");
    for (lua_Integer i = 1; i <= n; i++) {
        lua_rawgeti(L, 1, i);
        if (!luaL_testudata(L, -1, LPTO_RUN))
            return lpto_error(L, who, "item %d is not a run handle returned by Worker:submit (got %s)", (int)i,
                              luaL_typename(L, -1));
        lrun *R = lua_touserdata(L, -1);
        if (R->W->state != W_CLOSED) check_worker_open(L, R, who);
        lua_pop(L, 1);
    }
    double t0 = -1;
    for (;;) {
        lrun *pending = NULL;
        for (lua_Integer i = 1; i <= n; i++) {
            lua_rawgeti(L, 1, i);
            lrun *R = lua_touserdata(L, -1);
            pto_run_info in;
            pto_run_info_get(R->r, &in);
            if (in.state != PTO_RUN_RUNNING || R->W->state == W_CLOSED) {
                lua_pushinteger(L, i);
                return 2;
            }
            lua_pop(L, 1);
            if (!pending) pending = R;
        }
        double now = (double)lpto_now_ns() * 1e-9;
        if (t0 < 0) t0 = now;
        if (limit >= 0 && now - t0 >= limit) return 0;
        lpto_active_add(pending->W->w);
        lpto_gil_release(pending->W->gil);
        int rc = pto_run_wait(pending->W->w, pending->r, WAIT_ANY_SLICE_MS);
        lpto_gil_acquire(pending->W->gil);
        lpto_active_remove(pending->W->w);
        if (rc < 0) return lpto_engine_error(L, who);
    }
}

void lpto_open_run(lua_State *L)
{
    luaL_newmetatable(L, LPTO_RUN);
    static const luaL_Reg meta[] = {{"__index", r_index}, {"__gc", r_gc}, {"__close", r_close},
                                    {"__tostring", r_tostring}, {NULL, NULL}};
    luaL_setfuncs(L, meta, 0);
    static const luaL_Reg methods[] = {{"wait", r_wait}, {"done", r_done}, {"status", r_status},
                                       {"cancel", r_cancel}, {"result", r_result}, {NULL, NULL}};
    luaL_newlib(L, methods);
    lua_setfield(L, -2, "methods");
    lua_pop(L, 1);
    static const luaL_Reg fns[] = {{"wait_any", l_wait_any}, {NULL, NULL}};
    luaL_setfuncs(L, fns, 0);
}

const luaL_Reg lpto_run_methods[] = {{"submit", w_submit}, {"wait_all", w_wait_all}, {"runs", w_runs}, {NULL, NULL}};
