-- helpers.lua: shared by the busted specs (spec/ is on LUA_PATH as ?.lua).
local pto = require "pto"

local M = {}

M.BUILD_DIR = os.getenv("PTO_BUILD_DIR")
M.CHIPSIM = M.BUILD_DIR and (M.BUILD_DIR .. "/libpto_chipsim.so")

-- The mode of every Worker that does not name one: $PTO_MODE, else "process"
-- (spec/CMakeLists.txt runs each spec once per mode). Read from the
-- environment, not from a Worker, so that specs can check the binding's default.
do
  local m = os.getenv("PTO_MODE")
  M.MODE = (m == nil or m == "") and "process" or m
end

-- it(name, fn) only in the given mode; in the other a pending entry saying
-- why. spec/run_busted.lua counts thread_only / process_only calls as tests
-- that their mode must pass, so a mode-only test is written with one of
-- them, never as an `it` behind an `if`.
local function mode_only(mode, name, why, fn)
  local busted = require "busted"   -- it and pending live in the spec file's environment, not in _G
  if M.MODE == mode then
    busted.it(name, fn)
  else
    busted.pending(("%s [%s mode only: %s]"):format(name, mode, why))
  end
end
function M.thread_only(name, why, fn) mode_only("thread", name, why, fn) end
function M.process_only(name, why, fn) mode_only("process", name, why, fn) end

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

---- Results from sub callables ------------------------------------------------
-- In process mode a sub runs in a forked copy of the Lua state: what it
-- assigns to Lua variables stays in its child. Shared tensors are how a sub
-- reports back in both modes. send/recv carry a plain Lua value (nil,
-- booleans, numbers, strings, tables of those) through a u8 tensor: the
-- value as Lua source, NUL-terminated.

local function serialize(v, out)
  local t = type(v)
  if t == "table" then
    out[#out + 1] = "{"
    for k, x in pairs(v) do
      out[#out + 1] = "["
      serialize(k, out)
      out[#out + 1] = "]="
      serialize(x, out)
      out[#out + 1] = ","
    end
    out[#out + 1] = "}"
  elseif t == "string" or t == "number" then
    out[#out + 1] = ("%q"):format(v)
  elseif t == "boolean" or t == "nil" then
    out[#out + 1] = tostring(v)
  else
    error("helpers.send: cannot send a " .. t, 3)
  end
end

-- A box for send/recv: a u8 tensor (create it before Worker:init when a
-- sub registered before init captures it).
function M.box(bytes) return pto.tensor({bytes or 4096}, "u8") end

function M.send(box, value)
  local out = {}
  serialize(value, out)
  local s = table.concat(out)
  assert(#s < #box, "helpers.send: value too large for the box")
  for i = 1, #s do box[i] = s:byte(i) end
  box[#s + 1] = 0
end

-- The string written into a u8 tensor up to its first NUL.
function M.string_of(box)
  local bytes = {}
  for i = 1, #box do
    local b = box[i]
    if b == 0 then break end
    bytes[#bytes + 1] = string.char(b)
  end
  return table.concat(bytes)
end

-- The value sent into box (raises if nothing was sent since box:fill(0)).
function M.recv(box)
  local s = M.string_of(box)
  assert(s ~= "", "helpers.recv: nothing was sent into the box")
  return assert(load("return " .. s, "=recv", "t", {}))()
end

---- Processes, shared memory, file descriptors ---------------------------------

-- The calling process's id (in a sub callable: the process running it).
function M.getpid()
  local f = assert(io.open("/proc/self/stat"))
  local pid = f:read("n")
  f:close()
  return math.tointeger(pid)
end

-- {state = "R"|"S"|"Z"|..., ppid = n} of process pid, or nil when it is gone.
function M.proc(pid)
  local f = io.open("/proc/" .. pid .. "/stat")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  if not s then return nil end
  -- the command name is in parentheses and may contain spaces
  local state, ppid = s:match("%) (%S) (%d+)")
  if not state then return nil end
  return {state = state, ppid = math.tointeger(tonumber(ppid))}
end

-- Alive: kill -0 succeeds and it is not a zombie.
function M.alive(pid)
  local p = M.proc(pid)
  if not p or p.state == "Z" or p.state == "X" then return false end
  return os.execute("kill -0 " .. pid .. " 2>/dev/null") == true
end

-- Gone: no /proc entry, or a zombie that is not ours to reap (reparented).
function M.gone(pid)
  local p = M.proc(pid)
  return p == nil or ((p.state == "Z" or p.state == "X") and p.ppid ~= M.getpid())
end

-- Wait up to `secs` for pred() to hold (polling every 5 ms); returns whether it did.
function M.eventually(pred, secs)
  local deadline = pto.now() + secs
  repeat
    if pred() then return true end
    os.execute("sleep 0.005")
  until pto.now() > deadline
  return pred()
end

-- Every process id in /proc.
local function all_pids()
  local lfs = require "lfs"
  local out = {}
  for name in lfs.dir("/proc") do
    local pid = math.tointeger(tonumber(name))
    if pid then out[#out + 1] = pid end
  end
  return out
end

-- Descendants of root (default: this process), zombies included, as a
-- sorted list of pids.
function M.descendants(root)
  root = root or M.getpid()
  local children = {}
  for _, pid in ipairs(all_pids()) do
    local p = M.proc(pid)
    if p then
      children[p.ppid] = children[p.ppid] or {}
      table.insert(children[p.ppid], pid)
    end
  end
  local out, todo = {}, {root}
  while #todo > 0 do
    local pid = table.remove(todo)
    for _, c in ipairs(children[pid] or {}) do
      out[#out + 1] = c
      todo[#todo + 1] = c
    end
  end
  table.sort(out)
  return out
end

-- Names in /dev/shm, as a set.
function M.shm_entries()
  local lfs = require "lfs"
  local out = {}
  if lfs.attributes("/dev/shm", "mode") ~= "directory" then return out end
  for name in lfs.dir("/dev/shm") do
    if name ~= "." and name ~= ".." then out[name] = true end
  end
  return out
end

-- Process pid is blocked in nanosleep: for a chip child, inside the
-- sleep_us kernel (a chip child's own waits use futexes and sched_yield,
-- never nanosleep; only a scheduler thread naps, and a chip child has
-- none). How a spec knows a chip task has really started,
-- where its state "running" only says it was handed to the worker.
function M.in_nanosleep(pid)
  local function read(what)
    local f = io.open(("/proc/%d/%s"):format(pid, what))
    if not f then return "" end
    local s = f:read("a") or ""
    f:close()
    return s
  end
  if read("wchan"):find("nanosleep", 1, true) then return true end
  -- where wchan is hidden: the syscall number (x86_64: nanosleep 35, clock_nanosleep 230)
  local nr = tonumber(read("syscall"):match("^(%d+) "))
  return nr == 35 or nr == 230
end

-- Threads of this process (a Worker's scheduler and worker threads among them).
function M.thread_count()
  local f = assert(io.open("/proc/self/status"))
  local n = f:read("a"):match("\nThreads:%s*(%d+)")
  f:close()
  return math.tointeger(tonumber(n))
end

-- Open file descriptors of this process (lfs.dir's own descriptor included,
-- the same in every count).
function M.fd_count()
  local lfs = require "lfs"
  local n = 0
  for name in lfs.dir("/proc/self/fd") do
    if name ~= "." and name ~= ".." then n = n + 1 end
  end
  return n
end

return M
