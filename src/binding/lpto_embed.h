/* lpto_embed.h - pto's pure-Lua parts (the .lua files under lua/pto), compiled into
 * ptolua and pto.so by scripts/embed_lua.cmake. luaopen_pto offers them
 * through package.preload, so pto never adds to package.path and nobody
 * who can write a directory on some path can replace them. */
#ifndef LPTO_EMBED_H
#define LPTO_EMBED_H

#include <stddef.h>

typedef struct lpto_lua_part {
    const char *module;    /* "pto.repl"; NULL ends the table */
    const char *chunkname; /* "@pto/repl.lua", as error messages show it */
    const char *text;
    size_t len;
} lpto_lua_part;

extern const lpto_lua_part lpto_lua_parts[];

#endif
