/* lpto.h - the Lua binding's entry points for hosts (ptolua). */
#ifndef LPTO_H
#define LPTO_H
#include "lua.h"

/* Open the pto module: returns 1 with the module table on the stack. */
int luaopen_pto(lua_State *L);
/* Async-signal-safe: make every pto call blocked in this process (a run's
 * drain, ring back-pressure) return with an "interrupted" error soon. */
void lpto_interrupt(void);
/* The host waits for input (begin = 1) or is done waiting (0): THREAD-mode
 * sub callables may take the interpreter lock meanwhile. */
void lpto_idle(lua_State *L, int begin);
#endif
