/* lpto.h - the Lua binding's entry points for hosts (ptolua). */
#ifndef LPTO_H
#define LPTO_H
#include <stdbool.h>

#include "lua.h"

/* Open the pto module: returns 1 with the module table on the stack. */
int luaopen_pto(lua_State *L);
/* Async-signal-safe: make every pto call blocked in this process (a run's
 * drain, ring back-pressure) return with an "interrupted" error soon; a
 * second call in the same run kills its busy children. Returns how many
 * Workers had a run in progress. */
int lpto_interrupt(void);
/* The host is about to wait for input: THREAD-mode sub callables may take
 * the interpreter lock meanwhile. Returns the token lpto_idle_end needs
 * (NULL when pto is not loaded); L must not be touched until then. */
void *lpto_idle_begin(lua_State *L);
/* The wait is over (a line was read): take the interpreter lock back. In
 * check mode, the tasks of runs open at the prompt that have finished by
 * now count as ordered before what the line submits: its author saw them
 * finish (docs/check.md). */
void lpto_idle_end(lua_State *L, void *token);
/* Give L (just made by luaL_newstate) a pool allocator for its small
 * objects, on top of its own (lpto_alloc.c); once per process. False, and
 * L unchanged, if $PTO_LUA_ALLOC is "malloc" or no address space could be
 * reserved. */
bool lpto_use_pool_allocator(lua_State *L);
#endif
