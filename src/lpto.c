/* placeholder: being written */
#include "lua.h"
#include "lauxlib.h"
int luaopen_pto(lua_State *L);
int luaopen_pto(lua_State *L) { lua_newtable(L); return 1; }
