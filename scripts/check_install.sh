#!/usr/bin/env bash
# require "pto" from a stock lua5.4 after `cmake --install` and after
# `luarocks make`, each into a fresh temporary prefix. Usage:
#   scripts/check_install.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

probe='local pto = require "pto"
local w <close> = pto.Worker{mode = "thread", chips = 1}
local fill = w:register(pto.chip_kernel("fill"))
local t = pto.tensor({4}, "f32")
w:run(function(orch) orch:submit_next_level(fill, pto.args{{t, "out"}, scalars = {2.5}}) end)
assert(t[4] == 2.5, "fill did not run")
print("ok", pto._VERSION)'

echo "== cmake --install"
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
(cd "$tmp" && LUA_PATH="$tmp/prefix/share/lua/5.4/?.lua;;" LUA_CPATH="$tmp/prefix/lib/lua/5.4/?.so;;" \
  lua5.4 -e "$probe")
"$tmp/prefix/bin/ptolua" -e "$probe"

echo "== luarocks make"
luarocks --lua-version=5.4 make --tree "$tmp/tree" scripts/ptolua-0.1.0-1.rockspec >"$tmp/luarocks.log" 2>&1 ||
  { cat "$tmp/luarocks.log"; exit 1; }
(cd "$tmp" && eval "$(luarocks --lua-version=5.4 --tree "$tmp/tree" path)" && lua5.4 -e "$probe")
