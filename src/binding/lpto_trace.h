/* lpto_trace.h - tracing in the Lua binding (lpto_trace.c): what
 * luaopen_pto and ptolua's --trace, --dot, --profile and --report options need. */
#ifndef LPTO_TRACE_H
#define LPTO_TRACE_H
#include "lua.h"

/* Called by luaopen_pto with the module table on top: adds
 * pto._callable_name (for orch:dot and --dot). */
void lpto_open_trace(lua_State *L);

/* lua_CFunction (trace_path_or_nil, dot_path_or_nil, profile, report_path_or_nil), after
 * require "pto": every Worker created from now on traces from its init until it closes
 * (or lpto_trace_cli_finish), and (dot, profile or report) every top-level
 * Worker's last run is kept, from its profile, when it closes, for what
 * lpto_trace_cli_finish prints and writes. */
int lpto_trace_cli(lua_State *L);

/* lua_CFunction: stop the traces still running, write the files asked
 * for by lpto_trace_cli and print the profiles; raises "--trace: ...",
 * "--dot: ..." or "--report: ..." on failure. */
int lpto_trace_cli_finish(lua_State *L);
#endif
