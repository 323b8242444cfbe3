/* lpto_diag.c - pto.load_dump(path): the tensor dumps a CallConfig's
 * enable_dump_tensor wrote (src/engine/diag.c, docs/tracing.md), read back
 * as tensors, each checked against the checksum its writer recorded; and
 * the PMU counts orch:task reports. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lpto_priv.h"

static uint64_t fnv1a(const unsigned char *p, uint64_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (uint64_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

enum { COLS = 13 };

/* Split line (modified in place) at tabs into at most COLS fields; returns how many. */
static int split(char *line, char *col[COLS])
{
    int n = 0;
    char *p = line;
    while (n < COLS) {
        col[n++] = p;
        char *t = strchr(p, '\t');
        if (!t) break;
        *t = 0;
        p = t + 1;
    }
    char *nl = strchr(col[n - 1], '\n');
    if (nl) *nl = 0;
    return n;
}

/* Push the shape "4x8" (or "-" for no dimensions) as a table. */
static void push_shape(lua_State *L, const char *s)
{
    lua_newtable(L);
    if (strcmp(s, "-") == 0) return;
    int k = 0;
    for (const char *p = s; *p;) {
        char *end;
        unsigned long v = strtoul(p, &end, 10);
        lua_pushinteger(L, (lua_Integer)v);
        lua_rawseti(L, -2, ++k);
        p = *end == 'x' ? end + 1 : end + strlen(end);
    }
}

/* Read file (nbytes) into a new tensor of dtype and shape (the table on top); leaves the tensor on top. */
static void load_tensor(lua_State *L, const char *who, const char *path, const char *dtype, uint64_t nbytes,
                        const char *sum)
{
    lua_pushvalue(L, lua_upvalueindex(1));   /* pto.tensor */
    lua_pushvalue(L, -2);
    lua_pushstring(L, dtype);
    lua_call(L, 2, 1);
    lpto_tensor *t = lpto_totensor(L, -1);
    if (!t || pto_tensor_nbytes(&t->t) != nbytes)
        lpto_error(L, who, "%s: its index line says %" PRIu64 " bytes, which its dtype and shape do not make; the "
                   "index is damaged", path, nbytes);
    unsigned char *p = (unsigned char *)(uintptr_t)(t->t.base + t->t.offset);
    FILE *f = fopen(path, "rb");
    if (!f) lpto_error(L, who, "cannot open %s (%s); keep the dump files next to their index", path, strerror(errno));
    size_t got = nbytes ? fread(p, 1, (size_t)nbytes, f) : 0;
    int extra = fgetc(f);
    fclose(f);
    if (got != nbytes || extra != EOF)
        lpto_error(L, who, "%s holds %s bytes than the %" PRIu64 " its index names; the dump is incomplete or damaged",
                   path, got != nbytes ? "fewer" : "more", nbytes);
    char mine[17];
    snprintf(mine, sizeof mine, "%016" PRIx64, fnv1a(p, nbytes));
    if (strcmp(mine, sum) != 0)
        lpto_error(L, who, "%s does not match its checksum (index %s, file %s); the file changed after the dump",
                   path, sum, mine);
}

/* pto.load_dump(index_path) -> {{task, callable, worker, member, arg, when, tag, dtype, shape, offset, nbytes,
 * file, checksum, tensor}, ...} in the order the index lists them. */
static int l_load_dump(lua_State *L)
{
    const char *who = "pto.load_dump";
    const char *path = luaL_checkstring(L, 1);
    FILE *f = fopen(path, "r");
    if (!f)
        return lpto_error(L, who, "cannot open %s (%s); pass the .index file a dump with enable_dump_tensor wrote "
                          "(<output_prefix>.<run>.index)", path, strerror(errno));
    /* The index is read whole first: what follows may raise, and must not leave f open. */
    luaL_Buffer buf;
    luaL_buffinit(L, &buf);
    char chunk[4096];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) luaL_addlstring(&buf, chunk, got);
    fclose(f);
    luaL_pushresult(&buf);
    int text = lua_gettop(L);
    const char *slash = strrchr(path, '/');
    lua_pushlstring(L, path, slash ? (size_t)(slash - path + 1) : 0);   /* the directory of the dump files */
    int dir = lua_gettop(L);
    lua_newtable(L);
    int out = lua_gettop(L);
    char line[4096];
    int n = 0, lineno = 0;
    bool header = false;
    for (const char *p = lua_tostring(L, text); *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        if (len >= sizeof line) return lpto_error(L, who, "%s line %d is too long for a dump index", path, lineno + 1);
        memcpy(line, p, len);
        line[len] = 0;
        p += len + (nl ? 1 : 0);
        lineno++;
        if (line[0] == '#') {
            header = header || strstr(line, "ptolua tensor dump v1") != NULL;
            continue;
        }
        char *col[COLS];
        if (!header || split(line, col) != COLS)
            return lpto_error(L, who, "%s line %d is not a ptolua tensor dump index line", path, lineno);
        static const char *const INT_NAMES[] = {"task", "callable", "worker", "member", "arg"};
        lua_createtable(L, 0, 14);
        for (int k = 0; k < 5; k++) {
            lua_pushinteger(L, (lua_Integer)strtoll(col[k], NULL, 10) + (k >= 2 ? 1 : 0) - (k == 4 ? 1 : 0));
            lua_setfield(L, -2, INT_NAMES[k]);
        }
        static const char *const STR_NAMES[] = {"when", "tag", "dtype"};
        for (int k = 0; k < 3; k++) {
            lua_pushstring(L, col[5 + k]);
            lua_setfield(L, -2, STR_NAMES[k]);
        }
        uint64_t nbytes = strtoull(col[10], NULL, 10);
        lua_pushinteger(L, (lua_Integer)strtoull(col[9], NULL, 10));
        lua_setfield(L, -2, "offset");
        lua_pushinteger(L, (lua_Integer)nbytes);
        lua_setfield(L, -2, "nbytes");
        lua_pushstring(L, col[12]);
        lua_setfield(L, -2, "checksum");
        lua_pushvalue(L, dir);
        lua_pushstring(L, col[11]);
        lua_concat(L, 2);
        const char *file = lua_tostring(L, -1);
        lua_pushvalue(L, -1);
        lua_setfield(L, -3, "file");
        push_shape(L, col[8]);
        lua_pushvalue(L, -1);
        lua_setfield(L, -4, "shape");
        load_tensor(L, who, file, col[7], nbytes, col[12]);
        lua_setfield(L, -4, "tensor");
        lua_pop(L, 2);
        lua_rawseti(L, out, ++n);
    }
    if (!header) return lpto_error(L, who, "%s is not a ptolua tensor dump index (its header line is missing)", path);
    return 1;
}

void lpto_push_pmu_counts(lua_State *L, const pto_pmu_sample *s)
{
    lua_createtable(L, 0, s->count + 1);
    lua_pushinteger(L, s->set);
    lua_setfield(L, -2, "set");
    for (int32_t i = 0; i < s->count; i++) {
        if (!(s->valid & (1u << i))) continue;
        char key[32];
        snprintf(key, sizeof key, "%s", pto_pmu_event_name(s->set, i));
        for (char *p = key; *p; p++)
            if (*p == '-') *p = '_';
        lua_pushinteger(L, s->counts[i]);
        lua_setfield(L, -2, key);
    }
}

void lpto_push_pmu(lua_State *L, pto_orch *o, int64_t id)
{
    pto_pmu_sample s;
    if (pto_task_pmu_get(o, id, &s) != 1) return;
    lpto_push_pmu_counts(L, &s);
    lua_setfield(L, -2, "pmu");
}

void lpto_open_diag(lua_State *L)
{
    lua_getfield(L, -1, "tensor");
    lua_pushcclosure(L, l_load_dump, 1);
    lua_setfield(L, -2, "load_dump");
}
