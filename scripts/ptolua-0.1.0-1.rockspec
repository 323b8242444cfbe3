-- From the repository root: luarocks --lua-version=5.4 make scripts/ptolua-0.1.0-1.rockspec
package = "ptolua"
version = "0.1.0-1"
source = {
   url = "git+file:///ptolua",   -- `luarocks make` builds the checkout it runs in
}
description = {
   summary = "A scriptable task runtime for hierarchical accelerator machines",
   detailed = [[
The pto module: orchestration functions in Lua build a task DAG whose
dependencies come from tagged tensor arguments; a C engine schedules it on
simulated chips and Lua sub workers.]],
   license = "MIT",
}
dependencies = {
   "lua >= 5.4, < 5.5",
}
build = {
   type = "cmake",
   variables = {
      CMAKE_BUILD_TYPE = "Release",
      CMAKE_INSTALL_PREFIX = "$(PREFIX)",
      PTO_LUA_CMOD_DIR = "$(LIBDIR)",
      PTO_LUA_LMOD_DIR = "$(LUADIR)",
      PTO_BUILD_BENCH = "OFF",
      PTO_BUILD_TESTS = "OFF",
      PTO_LUAROCKS = "ON",
   },
}
