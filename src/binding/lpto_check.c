/* lpto_check.c - check mode's binding side (docs/check.md): where each
 * tensor was created, so that a task's write outside its arguments, which
 * the engine can only report by address, names the tensor.
 *
 * Recording starts once check mode is asked for in this process
 * ($PTO_CHECK=1 when the module loads, pto.Worker{check = true},
 * w:set_check(true)): before that, creating a tensor costs one test of a
 * flag. The sites live in a weak-keyed table (storage -> "script.lua:12")
 * in the registry, read only when a run fails with such a write. */
#include <stdlib.h>
#include <string.h>

#include "lpto_priv.h"

static bool recording;
static const char SITES = 0;   /* its address keys the table in the registry */

void lpto_check_record(void) { recording = true; }

void lpto_open_check(lua_State *L)
{
    (void)L;
    const char *e = getenv("PTO_CHECK");
    if (e && (strcmp(e, "1") == 0 || strcmp(e, "warn") == 0)) recording = true;
}

void lpto_check_note(lua_State *L, int idx)
{
    if (!recording) return;
    idx = lua_absindex(L, idx);
    lpto_weak_registry(L, &SITES, "k");
    lua_pushvalue(L, idx);
    luaL_where(L, 1);   /* the Lua code that called pto.tensor */
    lua_rawset(L, -3);
    lua_pop(L, 1);
}

/* Where the storage holding addr was created ("script.lua:12", without the
 * colon luaL_where ends with) into buf, with addr's byte offset in it. */
static bool site_of(lua_State *L, uint64_t addr, char *buf, size_t cap, uint64_t *off, uint64_t *size)
{
    bool found = false;
    if (lua_rawgetp(L, LUA_REGISTRYINDEX, &SITES) != LUA_TTABLE) {
        lua_pop(L, 1);
        return false;
    }
    lua_pushnil(L);
    while (!found && lua_next(L, -2)) {
        const lpto_storage *s = lua_touserdata(L, -2);
        const char *w = lua_tostring(L, -1);
        if (s && w && addr >= s->base && addr - s->base < s->nbytes) {
            size_t n = strlen(w);
            while (n > 0 && (w[n - 1] == ' ' || w[n - 1] == ':')) n--;
            snprintf(buf, cap, "%.*s", (int)n, w);
            *off = addr - s->base;
            *size = s->nbytes;
            found = true;
            lua_pop(L, 1);   /* lua_next's key stays: popped below */
        }
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    return found;
}

void lpto_check_explain(lua_State *L)
{
    static const char mark[] = "check: wrote address 0x";
    static const char area[] = " (shared tensor memory)";
    const char *msg = lua_tostring(L, -1);
    const char *at = msg ? strstr(msg, mark) : NULL;
    if (!at) return;
    char *end;
    uint64_t addr = strtoull(at + sizeof mark - 1, &end, 16);
    char site[256];
    uint64_t off, size;
    if (strncmp(end, area, sizeof area - 1) != 0 || !site_of(L, addr, site, sizeof site, &off, &size)) return;
    lua_pushlstring(L, msg, (size_t)(end - msg));
    lua_pushfstring(L, " (byte %I of the %I-byte tensor created at %s)%s", (lua_Integer)off, (lua_Integer)size, site,
                    end + sizeof area - 1);
    lua_concat(L, 2);
    lua_replace(L, -2);
}
