/* prompt.h - the line editor of ptolua's prompt (docs/repl.md). */
#ifndef PTO_PROMPT_H
#define PTO_PROMPT_H

#include "lua.h"

/* Open the prompt on L. repl_ref is a registry reference to the pto.repl
 * table for the full prompt (SIGINT clears the line, history, completion),
 * or LUA_NOREF for the plain lua5.4 loop. */
void prompt_open(lua_State *L, int repl_ref);
/* One line shown after prompt; NULL at end of input, or after Ctrl-C at the
 * full prompt with *interrupted set. The caller frees it. */
char *prompt_read(const char *prompt, int *interrupted);
/* Keep an entered line in the history (and its file at the full prompt). */
void prompt_save(const char *line);
/* Write the history back and give SIGINT its default action again. */
void prompt_close(void);

#endif
