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

# An installed ptolua runs the chip runtime of its own install, never the
# build tree's (which someone else may later recreate): with the installed
# copy moved away it fails to find one instead of loading the build's.
maps='local w <close> = pto.Worker{mode = "thread", chips = 1}
w:register(pto.chip_kernel("fill"))
for l in io.lines("/proc/self/maps") do
  if l:find("libpto_chipsim", 1, true) then print(l:match("%S+$")) return end
end
error("no chip runtime mapped")'
got=$("$tmp/prefix/bin/ptolua" -e "$maps")
want=$(cd "$tmp/prefix/lib" && pwd -P)/libpto_chipsim.so
[ "$got" = "$want" ] || { echo "installed ptolua loaded $got, not $want"; exit 1; }
mv "$tmp/prefix/lib/libpto_chipsim.so" "$tmp/moved.so"
if out=$("$tmp/prefix/bin/ptolua" -e "$maps" 2>&1); then
  echo "installed ptolua found a chip runtime outside its install: $out"; exit 1
fi
case "$out" in *"libpto_chipsim.so was not found"*) ;; *) echo "unexpected: $out"; exit 1 ;; esac
mv "$tmp/moved.so" "$tmp/prefix/lib/libpto_chipsim.so"
# The prefix moved elsewhere still works: the paths are relative.
mv "$tmp/prefix" "$tmp/moved-prefix"
"$tmp/moved-prefix/bin/ptolua" -e "$probe"
LUA_PATH="$tmp/moved-prefix/share/lua/5.4/?.lua;;" LUA_CPATH="$tmp/moved-prefix/lib/lua/5.4/?.so;;" lua5.4 -e "$probe"
mv "$tmp/moved-prefix" "$tmp/prefix"

echo "== luarocks make"
luarocks --lua-version=5.4 make --tree "$tmp/tree" scripts/ptolua-0.1.0-1.rockspec >"$tmp/luarocks.log" 2>&1 ||
  { cat "$tmp/luarocks.log"; exit 1; }
(cd "$tmp" && eval "$(luarocks --lua-version=5.4 --tree "$tmp/tree" path)" && lua5.4 -e "$probe")
