/* lpto_aux.h - the auxiliary library of the Lua binding: what every
 * lpto*.c file uses, and nothing that knows a pto type (as lauxlib is to
 * Lua's libraries). Errors name the Lua function first, as luaL_argerror
 * does: the engine's messages never name Lua functions, so the binding
 * adds the name of the one that was called. */
#ifndef LPTO_AUX_H
#define LPTO_AUX_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "lauxlib.h"
#include "lua.h"
#include "pto.h"

/* ---- errors ------------------------------------------------------------------------- */

/* Raise "who: <formatted>" (who NULL: no Lua function was called, as when a
 * Worker child's leaf runs a Worker; the message stands alone). */
int lpto_error(lua_State *L, const char *who, const char *fmt, ...);
/* Raise "who: <the thread's last engine message>" (who NULL: the message alone). */
int lpto_engine_error(lua_State *L, const char *who);

/* ---- argument tables ----------------------------------------------------------------
 * An options table such as pto.Worker{...} is checked against one list of
 * its fields, which also makes the "unknown field" message. */
typedef struct lpto_field {
    const char *name;
    lua_Integer lo, hi;        /* an integer field's range; lo > hi: not an integer field */
} lpto_field;

/* Raise unless every key of table t is a field named in fields (ended by a NULL name). */
void lpto_check_fields(lua_State *L, int t, const lpto_field *fields, const char *who);
/* Read integer field k of table t into *out, checked against [lo, hi]; false if absent. */
bool lpto_get_int_field(lua_State *L, int t, const char *k, lua_Integer *out, lua_Integer lo, lua_Integer hi,
                        const char *who);
/* lpto_get_int_field for a field of a table checked with lpto_check_fields. */
bool lpto_get_field(lua_State *L, int t, const lpto_field *f, lua_Integer *out, const char *who);

/* The monotonic clock in nanoseconds. */
uint64_t lpto_now_ns(void);

/* ---- the interpreter lock -------------------------------------------------
 * Sub callables in THREAD mode run on worker threads but share the one Lua
 * state, so Lua runs under a lock. The thread that loaded the module holds
 * it whenever it runs Lua and gives it up inside pto calls that wait (a
 * run's drain, a submit's wait for heap-ring room: pto_worker_on_block).
 * A hand-over costs a futex wake-up and a context switch (tens of us on a
 * busy 2-core machine), so subs do not get it in turns: a sub worker that
 * releases it and takes it again at once keeps it, any other thread that
 * wants it (the script's after a wait, an orchestration on a level's
 * worker thread) goes before the subs, and a submit hands it to waiting
 * threads at most once per LPTO_GIL_SLICE_NS (lpto_gil_yield). Lua runs
 * one thread at a time whoever holds it, so this costs the subs latency,
 * not throughput; a strict turn per submit had the orchestrator and two
 * subs trade the lock every task, at 10 us a task. */
typedef struct lpto_gil {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool held;
    bool handoff;             /* a yield lets a waiting sub take it although others go first */
    int sleepers;             /* threads waiting in lpto_gil_acquire_sub */
    int firsts;               /* threads waiting in lpto_gil_acquire (and yields): before the subs */
    uint64_t taken;           /* acquisitions so far */
    uint64_t yielded_ns;      /* the last yield, CLOCK_MONOTONIC */
    _Atomic int waiters;      /* threads that want the lock: a yield's test without the mutex */
} lpto_gil;

#define LPTO_GIL_SLICE_NS 100000

/* Take the lock ahead of the sub workers waiting for it. */
void lpto_gil_acquire(lpto_gil *g);
/* A sub worker's: after every other thread that waits. */
void lpto_gil_acquire_sub(lpto_gil *g);
void lpto_gil_release(lpto_gil *g);
/* The holder lets one waiting thread have the lock and takes it back first,
 * if some thread waits and the last yield is LPTO_GIL_SLICE_NS old. */
void lpto_gil_yield(lpto_gil *g);
/* pto_worker_on_block's hooks, arg the lock: release, and lpto_gil_acquire. */
void lpto_gil_block(void *g);
void lpto_gil_unblock(void *g);
/* Create the lock of L's state (once), held by the calling thread. */
void lpto_gil_open(lua_State *L);
/* The module's lock for L's main state (NULL before lpto_gil_open). */
lpto_gil *lpto_gil_of(lua_State *L);

/* ---- runs that Ctrl-C interrupts --------------------------------------------------------
 * Workers blocked in a wait of this process; async-signal-safe to interrupt. */
void lpto_active_add(pto_worker *w);
void lpto_active_remove(pto_worker *w);
/* Async-signal-safe: pto_worker_interrupt every active Worker; returns how many. */
int lpto_active_interrupt(void);

/* ---- small helpers ------------------------------------------------------------------- */

/* t[name] = v for the table on top. */
void lpto_set_int(lua_State *L, const char *name, lua_Integer v);
/* Push a new table whose keys do not keep their values alive ("k" mode). */
void lpto_push_weak_keys(lua_State *L);

/* Push the registry table at key, made on first use with weak keys or values (mode "k" or "v"). */
void lpto_weak_registry(lua_State *L, const void *key, const char *mode);

#endif
