-- helpers.lua: shared by the busted specs (spec/ is on LUA_PATH as ?.lua).
local pto = require "pto"

local M = {}

M.BUILD_DIR = os.getenv("PTO_BUILD_DIR")
M.CHIPSIM = M.BUILD_DIR and (M.BUILD_DIR .. "/libpto_chipsim.so")

-- A monotonic clock in seconds (luasystem ships with busted; LuaSocket as a fallback).
do
  local ok, system = pcall(require, "system")
  if ok and system.monotime then
    M.clock = system.monotime
  else
    M.clock = require("socket").gettime
  end
end

-- luaL_error and error(msg, 2) put "file:line: " in front of a message when
-- the raising function was called from Lua code; the contract is about what
-- follows it.
function M.strip_position(msg)
  return (msg:gsub("^[^:\n]*:%d+: ", "", 1))
end

-- Call fn, which must raise a string error that (after the optional
-- position) starts with prefix and contains fragment. Returns the stripped message.
function M.assert_error(fn, prefix, fragment)
  local ok, err = pcall(fn)
  assert(not ok, ("expected an error starting with %q, but the call succeeded"):format(prefix))
  assert(type(err) == "string", ("expected a string error, got %s"):format(type(err)))
  local msg = M.strip_position(err)
  if msg:sub(1, #prefix) ~= prefix then
    error(("error message does not start with %q:\n  %s"):format(prefix, err), 2)
  end
  if fragment and not msg:find(fragment, 1, true) then
    error(("error message lacks %q:\n  %s"):format(fragment, err), 2)
  end
  return msg
end

-- Handles of every built-in chip kernel on worker w, by name.
function M.kernels(w)
  local k = {}
  for _, name in ipairs{"vector_add", "vector_mul", "vector_scale", "fill", "copy", "gemm_tile", "tile_add",
                        "reduce_sum", "sleep_us", "spin_us", "fail"} do
    k[name] = w:register(pto.chip_kernel(name))
  end
  return k
end

-- Run c = a + b on 16 f32 elements with w's vector_add handle and check c.
-- Raises (through assert) if the Worker no longer runs a correct DAG.
function M.check_vector_add(w, vadd, n)
  n = n or 16
  local a, b, c = pto.tensor({n}, "f32"), pto.tensor({n}, "f32"), pto.tensor({n}, "f32")
  for i = 1, n do a[i] = i; b[i] = 2 * i end
  local id = w:run(function(orch)
    return orch:submit_next_level(vadd, pto.args{{a, "in"}, {b, "in"}, {c, "out"}})
  end)
  assert(math.type(id) == "integer", "submit did not return an integer task id")
  for i = 1, n do
    if c[i] ~= 3 * i then error(("vector_add: c[%d] = %s, expected %d"):format(i, tostring(c[i]), 3 * i), 2) end
  end
  return true
end

-- Busy-wait (on the orchestrator's thread, inside a run) until task id is
-- in one of the given states; returns its info table. Fails after `limit` s.
function M.wait_state(orch, id, states, limit)
  local want = {}
  for _, s in ipairs(states) do want[s] = true end
  local deadline = M.clock() + (limit or 10)
  while true do
    local t = orch:task(id)
    if want[t.state] then return t end
    if M.clock() > deadline then
      error(("task %d stayed %s (waited for %s)"):format(id, t.state, table.concat(states, "/")), 2)
    end
  end
end

-- Sorted copy of a list of integers (producers, consumers).
function M.sorted(list)
  local out = {}
  for i, v in ipairs(list) do out[i] = v end
  table.sort(out)
  return out
end

return M
