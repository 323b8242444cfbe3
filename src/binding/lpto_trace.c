/* lpto_trace.c - tracing from Lua (docs/tracing.md): w:trace_start(path
 * [, {events = N}]) and w:trace_stop(), a traced Worker that closes (or is
 * collected) writes its trace, and ptolua's --trace / --dot: every Worker
 * traced into one file, and the DAG of each Worker's last run.
 *
 * State lives in one registry table (per Lua state):
 *   tracing  [lightuserdata lworker] = {path = file | false (--trace), serial = n}
 *   cli_trace, cli_dot               the files of ptolua --trace / --dot
 *   parts    [serial] = the JSON events of a finished --trace Worker
 *   dags     [serial] = the Graphviz cluster of its last run (--dot), drawn
 *            from its profile when it closes or the script ends
 *   serials  weak-keyed [Worker] = n (the process id in the trace, the cluster name)
 * Entries of `tracing` are removed when the Worker closes or is collected
 * (both call lpto_trace_closing), so a key never outlives its Worker.
 *
 * Nothing here wraps a method: the Worker's own code calls the lpto_trace_*
 * hooks (lpto_priv.h), which do nothing unless a trace or ptolua's
 * --trace/--dot asks for it. --dot costs a run nothing: the engine's
 * always-on profile (profile.h) keeps what the picture needs. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lpto_priv.h"
#include "lpto_trace.h"

static const char STATE_KEY = 'T';

/* ptolua --profile / --report: each top-level Worker's last run is kept when it closes. */
static bool cli_profiles;

static void push_state(lua_State *L)
{
    if (lua_rawgetp(L, LUA_REGISTRYINDEX, &STATE_KEY) == LUA_TTABLE) return;
    lua_pop(L, 1);
    lua_createtable(L, 0, 8);
    lua_newtable(L);
    lua_setfield(L, -2, "tracing");
    lua_newtable(L);
    lua_setfield(L, -2, "parts");
    lua_newtable(L);
    lua_setfield(L, -2, "dags");
    lpto_push_weak_keys(L);
    lua_setfield(L, -2, "serials");
    lua_pushvalue(L, -1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &STATE_KEY);
}

/* Push state[field]. */
static void push_field(lua_State *L, const char *field)
{
    push_state(L);
    lua_getfield(L, -1, field);
    lua_remove(L, -2);
}

/* The serial number of the Worker at idx, given at first sight. */
static lua_Integer serial_of(lua_State *L, int idx)
{
    idx = lua_absindex(L, idx);
    push_field(L, "serials");
    lua_pushvalue(L, idx);
    lua_rawget(L, -2);
    lua_Integer n = lua_tointeger(L, -1);
    lua_pop(L, 1);
    if (n == 0) {
        push_state(L);
        lua_getfield(L, -1, "next_serial");
        n = lua_tointeger(L, -1) + 1;
        lua_pop(L, 1);
        lua_pushinteger(L, n);
        lua_setfield(L, -2, "next_serial");
        lua_pop(L, 1);
        lua_pushvalue(L, idx);
        lua_pushinteger(L, n);
        lua_rawset(L, -3);
    }
    lua_pop(L, 1);
    return n;
}

static const char *mode_name(const lworker *W) { return W->mode == PTO_MODE_THREAD ? "thread" : "process"; }

/* A file we will be able to create: checked at trace_start, so that a typo
 * fails at once rather than after a long run. */
static const char *unwritable(const char *path, char *why, size_t cap)
{
    struct stat st;
    if (!*path) return "the path is empty";
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode)) return "it is a directory";
        if (access(path, W_OK) != 0) return strerror(errno);
        return NULL;
    }
    const char *slash = strrchr(path, '/');
    if (slash && (size_t)(slash - path) >= cap) return "the path is too long";
    if (slash == path) snprintf(why, cap, "/");
    else if (slash) snprintf(why, cap, "%.*s", (int)(slash - path), path);
    else snprintf(why, cap, ".");
    if (stat(why, &st) != 0 || !S_ISDIR(st.st_mode)) return "its directory does not exist";
    if (access(why, W_OK | X_OK) != 0) return "its directory is not writable";
    return NULL;
}

/* ---- stopping a trace ------------------------------------------------------------ */

/* Stop W's trace: write it to its file, or keep it for --trace. Pushes
 * {path =, events =, dropped =}, or the error message, and says which. */
static bool finish(lua_State *L, lworker *W)
{
    int base = lua_gettop(L);
    push_field(L, "tracing");                      /* base + 1 */
    bool entry = lua_rawgetp(L, base + 1, W) == LUA_TTABLE;
    if (entry) lua_getfield(L, base + 2, "path");  /* base + 3: a file, or false for --trace */
    else lua_pushnil(L);
    const char *path = lua_tostring(L, base + 3);
    lpto_level_trace_collect(W);   /* PROCESS-mode Worker children's runs join W's events */
    bool ok = pto_trace_stop(W->w, path) == 0;
    if (ok && entry && !path) {
        lua_getfield(L, base + 2, "serial");
        lua_Integer serial = lua_tointeger(L, -1);
        lua_pop(L, 1);
        char name[96];
        snprintf(name, sizeof name, "Worker %lld (level %d, %s mode)", (long long)serial, W->level, mode_name(W));
        int64_t n = pto_trace_format(W->w, (int32_t)serial, name, NULL, 0);
        if (n >= 0) {
            push_field(L, "parts");
            luaL_Buffer b;
            char *p = luaL_buffinitsize(L, &b, (size_t)n + 1);
            pto_trace_format(W->w, (int32_t)serial, name, p, (size_t)n + 1);
            luaL_pushresultsize(&b, (size_t)n);
            lua_rawseti(L, -2, serial);
            lua_pop(L, 1);
        }
        push_field(L, "cli_trace");
        lua_replace(L, base + 3);                  /* the path reported back */
    }
    lua_pushnil(L);
    lua_rawsetp(L, base + 1, W);
    if (ok) {
        lua_createtable(L, 0, 3);
        lua_pushvalue(L, base + 3);
        lua_setfield(L, -2, "path");
        lua_pushinteger(L, (lua_Integer)pto_trace_events(W->w));
        lua_setfield(L, -2, "events");
        lua_pushinteger(L, (lua_Integer)pto_trace_dropped(W->w));
        lua_setfield(L, -2, "dropped");
    } else {
        lua_pushfstring(L, "Worker:trace_stop: %s", pto_errmsg());
    }
    lua_replace(L, base + 1);
    lua_settop(L, base + 1);
    return ok;
}

/* Only the process that owns W may stop its trace: a forked child's copy of
 * a Worker has a copy of the buffer, whose writers live in the original
 * (its count of active writers may be frozen mid-record), and writing the
 * file from there would clobber the original's. */
static bool tracing(lworker *W)
{
    return W->state != W_CLOSED && W->w && W->owner == getpid() && pto_trace_active(W->w);
}

/* Push an array of the traced Workers (light userdata) that are W or below
 * it (its Worker children, which its close closes); W NULL: every one. */
static void push_traced(lua_State *L, lworker *W)
{
    lua_newtable(L);
    push_field(L, "tracing");
    lua_Integer n = 0;
    lua_pushnil(L);
    while (lua_next(L, -2)) {
        lua_pop(L, 1);
        lworker *V = lua_touserdata(L, -1);
        if (!tracing(V)) continue;
        bool mine = !W;   /* an open Worker's parents are open too: closing one closes its children */
        for (lworker *p = V; p && !mine; p = p->parent) mine = p == W;
        if (mine) {
            lua_pushvalue(L, -1);
            lua_rawseti(L, -4, ++n);
        }
    }
    lua_pop(L, 1);
}

static void snapshot_profile(lua_State *L, int idx);
static void snapshot_dag(lua_State *L, int idx);

int lpto_trace_closing(lua_State *L, lworker *W, bool gc)
{
    if (lua_touserdata(L, 1) == W) {   /* ptolua --profile / --report / --dot: its last run, before it goes */
        snapshot_profile(L, 1);
        snapshot_dag(L, 1);
    }
    int errs = 0, base = lua_gettop(L);
    /* Not while a run is in progress (close then refuses). A Worker child
     * being collected is unreachable, so is its parent: nothing runs it. */
    if (W->state != W_CLOSED && !W->in_run && W->owner == getpid()) {
        push_traced(L, W);
        int list = lua_gettop(L);
        for (lua_Integer i = 1; lua_rawgeti(L, list, i) == LUA_TLIGHTUSERDATA; i++) {
            lworker *V = lua_touserdata(L, -1);
            lua_pop(L, 1);
            if (finish(L, V)) {
                lua_pop(L, 1);
            } else {
                lua_insert(L, base + 1);   /* messages collect below the list */
                list++;
                errs++;
            }
        }
        lua_settop(L, base + errs);
    }
    if (gc) {   /* whatever closed it, its key must not outlive it */
        push_field(L, "tracing");
        lua_pushnil(L);
        lua_rawsetp(L, -2, W);
        lua_pop(L, 1);
    }
    return errs;
}

int lpto_trace_closed(lua_State *L, int first, int errs, bool gc)
{
    if (!errs) return 0;
    if (gc) {
        for (int i = 0; i < errs; i++) lua_warning(L, lua_tostring(L, first + i), 0);
        return 0;
    }
    lua_pushvalue(L, first);
    return lua_error(L);
}

/* ---- Worker methods ------------------------------------------------------------------- */

/* w:trace_start(path [, {events = N}]) */
int lpto_trace_start(lua_State *L)
{
    const char *who = "Worker:trace_start";
    lworker *W = lpto_check_worker(L, 1, who);
    if (lua_type(L, 2) != LUA_TSTRING)
        return lpto_error(L, who, "expected the path of the trace file to write, like \"trace.json\" (got %s)",
                          luaL_typename(L, 2));
    if (W->owner != getpid())
        return lpto_error(L, who, "this Worker is a copy inherited by a forked child; trace it in the process that "
                                  "created it");
    const char *path = lua_tostring(L, 2);
    lua_Integer events = 0;
    if (!lua_isnoneornil(L, 3)) {
        if (!lua_istable(L, 3))
            return lpto_error(L, who, "the options must be a table like {events = 100000} (got %s)", luaL_typename(L, 3));
        static const lpto_field fields[] = {{"events", 1, 1 << 26}, {NULL, 0, 0}};
        lpto_check_fields(L, 3, fields, who);
        lpto_get_field(L, 3, &fields[0], &events, who);
    }
    if (pto_trace_active(W->w)) {
        push_field(L, "tracing");
        if (lua_rawgetp(L, -1, W) == LUA_TTABLE) lua_getfield(L, -1, "path");
        if (lua_isstring(L, -1))
            return lpto_error(L, who, "this Worker is already tracing into '%s'; call w:trace_stop() first",
                              lua_tostring(L, -1));
        return lpto_error(L, who, "this Worker is already tracing (ptolua --trace traces every Worker); call "
                                  "w:trace_stop() first");
    }
    char dir[4096];
    const char *why = unwritable(path, dir, sizeof dir);
    if (why)
        return lpto_error(L, who, "cannot write the trace to '%s': %s; give a path in an existing, writable directory",
                          path, why);
    if (pto_trace_start(W->w, (uint32_t)events) != 0) return lpto_engine_error(L, who);
    lpto_level_trace(W, true);
    push_field(L, "tracing");
    lua_createtable(L, 0, 2);
    lua_pushvalue(L, 2);
    lua_setfield(L, -2, "path");
    lua_rawsetp(L, -2, W);
    return 0;
}

/* w:trace_stop() -> {path =, events =, dropped =} */
int lpto_trace_stop(lua_State *L)
{
    const char *who = "Worker:trace_stop";
    lworker *W = lpto_check_worker(L, 1, who);
    if (!tracing(W))
        return lpto_error(L, who, "this Worker is not tracing%s; start a trace with w:trace_start(path)",
                          W->owner != getpid() ? " in this process (a forked child's copy of it)" : "");
    if (!finish(L, W)) return lua_error(L);
    return 1;
}

/* pto._callable_name(w, kind, callable) -> the name given at register, or nil (for orch:dot, --dot). */
static int l_callable_name(lua_State *L)
{
    lworker *W = lpto_check_worker(L, 1, "pto._callable_name");
    const char *k = luaL_checkstring(L, 2);
    int kind = strcmp(k, "sub") == 0 ? PTO_SUB : strcmp(k, "next_level") == 0 ? PTO_NEXT_LEVEL : -1;
    lua_Integer c = luaL_checkinteger(L, 3);
    char buf[256];
    int n = pto_worker_callable_name_get(W->w, kind, (uint64_t)c, buf, sizeof buf);
    if (n < 0) return 0;
    lua_pushlstring(L, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
    return 1;
}

void lpto_open_trace(lua_State *L)
{
    lua_pushcfunction(L, l_callable_name);
    lua_setfield(L, -2, "_callable_name");
}

/* ---- ptolua --trace / --dot --------------------------------------------------------------- */

#define CLI_TRACE_EVENTS (1u << 20)

/* The ptolua process: Workers created or run in its forked children (Lua
 * subs, hosts of Worker children) could never reach the files. */
static pid_t cli_pid;
static bool cli_dot;   /* --dot: each top-level Worker's last run is drawn when it closes */
static int call_pto(lua_State *L, const char *fn, int n, int nres);

/* --profile / --report: keep the profile data of the Worker at idx (a
 * top-level one of this process, not yet closed) in state.profiles, by its
 * serial, before closing frees it (lua/pto/report.lua's _cli_snapshot). */
static void snapshot_profile(lua_State *L, int idx)
{
    lworker *W = lua_touserdata(L, idx);
    if (!cli_profiles || getpid() != cli_pid || W->parent || W->state != W_READY || W->in_run) return;
    int top = lua_gettop(L);
    lua_Integer serial = serial_of(L, idx);
    lua_pushvalue(L, idx);
    lua_pushinteger(L, serial);
    if (call_pto(L, "_cli_snapshot", 2, 1) == LUA_OK && lua_istable(L, -1)) {
        push_field(L, "profiles");
        lua_insert(L, -2);
        lua_rawseti(L, -2, serial);
    }
    lua_settop(L, top);
}

/* --dot: draw the last run of the Worker at idx (a top-level one of this
 * process, not yet closed) from its profile into state.dags, by its serial
 * (lua/pto/inspect.lua's _dot_profile). A run leaves nothing else to draw
 * from, so --dot costs a run no more than no option does. */
static void snapshot_dag(lua_State *L, int idx)
{
    lworker *W = lua_touserdata(L, idx);
    if (!cli_dot || getpid() != cli_pid || W->parent || W->state != W_READY || W->in_run) return;
    int top = lua_gettop(L);
    int serial = (int)serial_of(L, idx);
    lua_pushvalue(L, idx);
    lua_pushfstring(L, "w%d", serial);
    lua_pushfstring(L, "Worker %d (level %d, %s mode)", serial, W->level, mode_name(W));
    if (call_pto(L, "_dot_profile", 3, 1) != LUA_OK) {
        /* A picture is not worth failing the close for, but a broken one must not go unnoticed. */
        fprintf(stderr, "ptolua --dot: Worker %d: %s\n", serial, lua_tostring(L, -1));
    } else if (lua_isstring(L, -1)) {
        push_field(L, "dags");
        lua_insert(L, -2);
        lua_rawseti(L, -2, serial);
    }
    lua_settop(L, top);
}

void lpto_trace_new_worker(lua_State *L, int idx)
{
    if (!cli_pid || getpid() != cli_pid) return;
    lworker *W = lua_touserdata(L, idx);
    lua_Integer serial = serial_of(L, idx);
    push_field(L, "cli_trace");
    bool trace = lua_isstring(L, -1);
    lua_pop(L, 1);
    if (trace && pto_trace_start(W->w, CLI_TRACE_EVENTS) == 0) {
        push_field(L, "tracing");
        lua_createtable(L, 0, 2);
        lua_pushboolean(L, 0);
        lua_setfield(L, -2, "path");
        lua_pushinteger(L, serial);
        lua_setfield(L, -2, "serial");
        lua_rawsetp(L, -2, W);
        lua_pop(L, 1);
    }
}

/* Call pto[fn] with the n values on top of the stack, leaving nres results. */
static int call_pto(lua_State *L, const char *fn, int n, int nres)
{
    lua_getfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
    lua_getfield(L, -1, "pto");
    lua_getfield(L, -1, fn);
    lua_replace(L, -3);
    lua_pop(L, 1);
    lua_insert(L, -1 - n);
    return lua_pcall(L, n, nres, 0);
}

int lpto_trace_cli(lua_State *L)
{
    bool trace = lua_isstring(L, 1), dot = lua_isstring(L, 2), profile = lua_toboolean(L, 3),
         report = lua_isstring(L, 4);
    if (!trace && !dot && !profile && !report) return 0;
    cli_pid = getpid();
    push_state(L);
    lua_pushvalue(L, 1);
    lua_setfield(L, -2, "cli_trace");
    lua_pushvalue(L, 2);
    lua_setfield(L, -2, "cli_dot");
    lua_pushboolean(L, profile);
    lua_setfield(L, -2, "cli_profile");
    lua_pushvalue(L, 4);
    lua_setfield(L, -2, "cli_report");
    lua_newtable(L);
    lua_setfield(L, -2, "profiles");
    lua_pop(L, 1);
    cli_dot = dot;
    cli_profiles = profile || report;
    lua_getfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
    lua_getfield(L, -1, "pto");
    if (!lua_istable(L, -1)) return luaL_error(L, "--trace/--dot: the pto module is not loaded");
    return 0;
}

static int write_file(lua_State *L, const char *opt, const char *path, const char *text, size_t len)
{
    FILE *f = fopen(path, "w");
    if (f) {
        size_t w = fwrite(text, 1, len, f);
        bool bad = w != len || ferror(f);
        if (fclose(f) == 0 && !bad) return 0;
    }
    return luaL_error(L, "%s: cannot write '%s': %s", opt, path, strerror(errno ? errno : EIO));
}

/* Concatenate t[1..n]'s strings, each after sep except the first, between head and tail. */
static void push_joined(lua_State *L, int t, lua_Integer n, const char *head, const char *sep, const char *tail)
{
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    luaL_addstring(&b, head);
    bool first = true;
    for (lua_Integer i = 1; i <= n; i++) {
        bool have = lua_rawgeti(L, t, i) == LUA_TSTRING && lua_rawlen(L, -1) > 0;
        lua_pop(L, 1);
        if (!have) continue;
        if (!first) luaL_addstring(&b, sep);
        first = false;
        lua_rawgeti(L, t, i);
        luaL_addvalue(&b);
    }
    luaL_addstring(&b, tail);
    luaL_pushresult(&b);
}

int lpto_trace_cli_finish(lua_State *L)
{
    lua_settop(L, 0);
    push_state(L);                   /* 1 */
    lua_getfield(L, 1, "cli_trace"); /* 2 */
    lua_getfield(L, 1, "cli_dot");   /* 3 */
    lua_getfield(L, 1, "next_serial");
    lua_Integer nserial = lua_tointeger(L, -1);
    lua_pop(L, 1);
    /* Traces still running at the end of the script: --trace's and w:trace_start's. */
    push_traced(L, NULL);            /* 4 */
    for (lua_Integer i = 1; lua_rawgeti(L, 4, i) == LUA_TLIGHTUSERDATA; i++) {
        lworker *W = lua_touserdata(L, -1);
        lua_pop(L, 1);
        if (!finish(L, W)) return luaL_error(L, "%s (at the end of the script)", lua_tostring(L, -1));
        lua_pop(L, 1);
    }
    lua_settop(L, 4);
    /* Workers still open at the end of the script (they close after this):
     * their last runs, for --dot, --profile and --report. */
    lua_getfield(L, 1, "serials");
    lua_pushnil(L);
    while (lua_next(L, 5)) {
        lua_pop(L, 1);
        if (!luaL_testudata(L, -1, LPTO_WORKER)) continue;
        snapshot_dag(L, lua_gettop(L));
        snapshot_profile(L, lua_gettop(L));
    }
    lua_settop(L, 4);
    if (lua_isstring(L, 2)) {
        lua_getfield(L, 1, "parts");
        push_joined(L, lua_gettop(L), nserial, "{\"traceEvents\":[\n", ",\n", "\n],\n\"displayTimeUnit\":\"ns\"}\n");
        size_t len;
        const char *text = lua_tolstring(L, -1, &len);
        write_file(L, "--trace", lua_tostring(L, 2), text, len);
        lua_settop(L, 4);
    }
    if (lua_isstring(L, 3)) {
        lua_getfield(L, 1, "dags");
        push_joined(L, lua_gettop(L), nserial,
                    "digraph ptolua {\n  rankdir=LR;\n  node [shape=box, style=filled, fontname=\"monospace\"];\n", "",
                    "}\n");
        size_t len;
        const char *text = lua_tolstring(L, -1, &len);
        write_file(L, "--dot", lua_tostring(L, 3), text, len);
    }
    if (cli_profiles) {
        lua_settop(L, 4);
        lua_getfield(L, 1, "profiles");
        lua_getfield(L, 1, "cli_profile");
        lua_getfield(L, 1, "cli_report");
        if (call_pto(L, "_cli_profile", 3, 0) != LUA_OK) return lua_error(L);
    }
    return 0;
}
