-- process_spec.lua: PROCESS mode only (issue 4): every chip and sub worker
-- is a child process forked at Worker:init. Each failure the issue lists is
-- provoked here and must be detected and contained: the failing task fails
-- soon after the event, with a message naming the task, the callable, the
-- worker, the child's pid and the cause; its consumers are poisoned; the
-- run's independent tasks complete; the Worker replaces the dead child and
-- the next run succeeds. Also: init failures and hangs, children never
-- outliving a killed parent, no leaked processes, /dev/shm entries or file
-- descriptors, 1000 runs on one Worker, registration and tensors after init.
--
-- Every Worker here names mode = "process" (the file is about that mode),
-- so it runs the same under PTO_MODE=thread. Timing uses pto.now()
-- (CLOCK_MONOTONIC): subs write it into shared tensors, so times taken in a
-- child and in this process compare directly.
local pto = require "pto"
local H = require "helpers"

local now = pto.now
local assert_error = H.assert_error

-- Can this build start a process-mode Worker at all? Process mode is the
-- default mode, so when it cannot, this file fails; only a developer who
-- sets PTO_ALLOW_NO_PROCESS=1 (README, "Developing") gets one pending
-- entry instead. CI never sets it.
local usable, why_not = pcall(function()
  local w = pto.Worker{mode = "process", chips = 1}
  w:init()
  local pid = w:child_pids().chips[1]
  w:close()
  assert(pid, "Worker:child_pids() lists no chip process")
end)
if not usable then
  if os.getenv("PTO_ALLOW_NO_PROCESS") == "1" then
    describe("process mode", function()
      -- "[opt-out]": spec/run_busted.lua reports the file as skipped
      pending("[opt-out] PTO_ALLOW_NO_PROCESS=1: process mode cannot start a Worker in this build: " .. tostring(why_not))
    end)
    return
  end
  error("process mode cannot start a Worker in this build: " .. tostring(why_not) ..
        " (set PTO_ALLOW_NO_PROCESS=1 to skip spec/process_spec.lua instead)", 0)
end

-- "The failing task fails within 100 ms of the event" (issue 4), also
-- under the sanitizers (measured there: under 20 ms).
local LIMIT = 0.1
local PTOLUA = assert(os.getenv("PTOLUA"), "set PTOLUA to the ptolua binary")

local function kill(sig, pid) return os.execute(("kill -%s %d 2>/dev/null"):format(sig, pid)) end

local eventually, gone = H.eventually, H.gone

local function same_list(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

local function all_pids(w)
  local p = w:child_pids()
  local out = {}
  for _, k in ipairs{"chips", "subs"} do for _, pid in ipairs(p[k]) do out[#out + 1] = pid end end
  return out
end

-- What a scope of code leaves behind: child processes (zombies included),
-- /dev/shm entries, file descriptors.
local function footprint()
  return {procs = H.descendants(), shm = H.shm_entries(), fds = H.fd_count()}
end

local function assert_footprint(before, what)
  local after = footprint()
  assert(same_list(before.procs, after.procs),
    ("%s: child processes before {%s}, after {%s}"):format(what, table.concat(before.procs, " "),
                                                           table.concat(after.procs, " ")))
  for name in pairs(after.shm) do
    assert(before.shm[name], ("%s: new /dev/shm entry %q"):format(what, name))
  end
  assert(before.fds == after.fds, ("%s: %d file descriptors before, %d after"):format(what, before.fds, after.fds))
end

---- The failure Worker: 2 chips, 2 subs ------------------------------------------
-- Subs registered before init (they capture tensors, which fork shares).
local F, K
local BOOM, QUIT, MARK, SPIN
local STAMP = pto.tensor({16}, "f64")   -- STAMP[i]: pto.now() written by a failing sub just before it fails
local RAN = pto.tensor({16}, "f64")     -- RAN[i]: pto.now() when MARK i ran; -1: it did not run
local BASE                              -- footprint before F existed

setup(function()
  BASE = footprint()
  F = pto.Worker{mode = "process", chips = 2, num_sub_workers = 2}
  K = H.kernels(F)
  K.crash = F:register(pto.chip_kernel("crash"))
  BOOM = F:register(function(args)
    STAMP[args:scalar(1)] = now()
    error("boom " .. args:scalar(2))
  end, "boom")
  QUIT = F:register(function(args)
    STAMP[args:scalar(1)] = now()
    os.exit(5)
  end, "quitter")
  MARK = F:register(function(args) RAN[args:scalar(1)] = now() end, "mark")
  SPIN = F:register(function(args)           -- busy for scalar 2 microseconds
    STAMP[args:scalar(1)] = now()
    local stop = now() + args:scalar(2) / 1e6
    while now() < stop do end
  end, "spinner")
  F:init()
end)

teardown(function()
  if F then F:close() end
end)

-- Runs on F: independent work in flight (chip 2: a 150 ms sleep, then a
-- fill), the failing task (c.submit(orch, x) submits it on worker 1 of its
-- kind, writing x, and returns its id), three consumers (a chip copy of x,
-- a sub reading x, a sub reading the copy), then waits for the failure and
-- submits more independent work. Checks everything the issue asks of a
-- failure. c.kind: "chips" or "subs"; c.where: "chip 1" / "sub 1";
-- c.callable; c.cause: fragments of the root cause; c.event(orch, id):
-- makes the failure happen and returns its time (default: the submit time,
-- the earliest it can happen); c.survives: the child lives on (a Lua error,
-- a kernel's non-zero return), else it died and must be replaced.
local function failure_case(c)
  local before = F:child_pids()
  local victim = before[c.kind][1]
  assert.is_true(H.alive(victim))
  local failed0 = F:stats().tasks_failed
  STAMP:fill(-1)
  RAN:fill(-1)
  local x, y, ind, ind2 = pto.tensor{4}, pto.tensor{4}, pto.tensor{4}, pto.tensor{4}
  y:fill(-1)
  local id, t_event, t_fail, info
  -- Dispatch held while the DAG is built: every consumer is wired to the
  -- failing task before it can run, in both modes (without the hold,
  -- whether a consumer was wired before or after the failure was a race).
  F:hold()
  local ok, err = pcall(F.run, F, function(orch)
    local sl = orch:submit_next_level(K.sleep_us, pto.args{{ind, "out"}, scalars = {150000}}, nil, {worker = 2})
    local fl = orch:submit_next_level(K.fill, pto.args{{ind, "inout"}, scalars = {4.0}}, nil, {worker = 2})
    id = c.submit(orch, x)
    local cp = orch:submit_next_level(K.copy, pto.args{x, {y, "out"}})
    local m1 = orch:submit_sub(MARK, pto.args{{x, "in"}, scalars = {1}})
    local m2 = orch:submit_sub(MARK, pto.args{{y, "in"}, scalars = {2}})
    F:sync()
    local function producers(t) return H.sorted(orch:task(t).producers) end
    assert.are.same({{}, {sl}, {}, {id}, {id}, {cp}},
                    {producers(sl), producers(fl), producers(id), producers(cp), producers(m1), producers(m2)})
    local states = {}
    for i, t in ipairs{sl, fl, id, cp, m1, m2} do states[i] = orch:task(t).state end
    assert.are.same({"ready", "pending", "ready", "pending", "pending", "pending"}, states)
    F:release()
    local t_submit = now()
    t_event = c.event and c.event(orch, id) or t_submit
    info = H.wait_state(orch, id, {"failed"}, 10)
    t_fail = now()
    -- independent work submitted after the failure, on the healthy workers
    orch:submit_sub(MARK, pto.args{scalars = {3}}, {worker = 2})
    orch:submit_next_level(K.fill, pto.args{{ind2, "out"}, scalars = {5.0}}, nil, {worker = 2})
  end)
  local t_raise = now()
  F:release()   -- also when an assertion above failed while held
  if type(err) ~= "string" then error(err, 0) end   -- that assertion's own report
  if type(t_event) ~= "number" or t_event < 0 then t_event = STAMP[1] end

  -- run raised the failure, soon
  assert.is_false(ok, "the run did not raise")
  assert.are.equal("string", type(err))
  assert.are.equal("Worker:run: ", err:sub(1, 12), err)
  assert.truthy(err:find(("task %d (callable '%s' on %s) failed"):format(id, c.callable, c.where), 1, true), err)
  assert.truthy(err:find(("%s (pid %d)"):format(c.where, victim), 1, true), err)
  for _, frag in ipairs(c.cause) do assert.truthy(err:find(frag, 1, true), ("lacks %q: %s"):format(frag, err)) end
  assert.truthy(info.error and info.error:find(c.cause[1], 1, true), info.error)
  assert.is_true(t_event > 0, "the failure event was not recorded")
  local lat = t_fail - t_event
  print(("# %s: the task failed %.2f ms after the event; the run raised %.1f ms after that"):format(
    c.cause[1], lat * 1e3, (t_raise - t_fail) * 1e3))
  assert.is_true(lat < LIMIT, ("the task failed %.1f ms after the event (limit %d ms)"):format(lat * 1e3, LIMIT * 1e3))
  -- the run waits for the 150 ms of independent work, then for no more than the limit
  assert.is_true(t_raise - t_fail < 0.15 + LIMIT, ("the run raised %.1f ms after the failure"):format((t_raise - t_fail) * 1e3))

  -- consumers poisoned, independent work done
  assert.are.same({-1, -1, -1, -1}, y:totable())
  assert.are.equal(-1, RAN[1], "a consumer of the failed task ran")
  assert.are.equal(-1, RAN[2], "a consumer of a poisoned task ran")
  assert.are.same({4, 4, 4, 4}, ind:totable())
  assert.are.same({5, 5, 5, 5}, ind2:totable())
  assert.is_true(RAN[3] > 0, "the independent sub submitted after the failure did not run")
  assert.are.equal(failed0 + 4, F:stats().tasks_failed)

  -- the next run succeeds on every child, the dead one replaced
  local a, b = pto.tensor{4}, pto.tensor{4}
  RAN:fill(-1)
  F:run(function(orch)
    orch:submit_next_level_group(K.fill, {pto.args{{a, "out"}, scalars = {1.0}}, pto.args{{b, "out"}, scalars = {2.0}}},
                                 nil, {workers = {1, 2}})
    orch:submit_sub_group(MARK, {pto.args{{a, "in"}, scalars = {4}}, pto.args{{b, "in"}, scalars = {5}}},
                          {workers = {1, 2}})
  end)
  assert.are.same({1, 1, 1, 1}, a:totable())
  assert.are.same({2, 2, 2, 2}, b:totable())
  assert.is_true(RAN[4] > 0 and RAN[5] > 0)
  local after = F:child_pids()
  assert.are.equal(#before.chips, #after.chips)
  assert.are.equal(#before.subs, #after.subs)
  for _, k in ipairs{"chips", "subs"} do
    for i, pid in ipairs(after[k]) do
      assert.is_true(H.alive(pid), ("%s %d (pid %d) is not alive"):format(k, i, pid))
      if k == c.kind and i == 1 and not c.survives then
        assert.are_not.equal(victim, pid, "the dead child was not replaced")
      else
        assert.are.equal(before[k][i], pid, ("%s %d was replaced though it did not fail"):format(k, i))
      end
    end
  end
  if not c.survives then   -- reaped, not a zombie
    assert.is_nil(H.proc(victim), ("the dead child %d is still there (state %s)"):format(victim,
      tostring(H.proc(victim) and H.proc(victim).state)))
  end
  return err
end

local function crash(how)
  return function(orch, x)
    return orch:submit_next_level(K.crash, pto.args{{x, "out"}, scalars = {how}}, nil, {worker = 1})
  end
end

describe("a child that fails mid-task", function()
  it("a chip kernel's SIGSEGV", function()
    failure_case{kind = "chips", where = "chip 1", callable = "crash", submit = crash(0),
                 cause = {"was killed by signal 11", "Segmentation fault"}}
  end)

  it("a chip kernel's abort()", function()
    failure_case{kind = "chips", where = "chip 1", callable = "crash", submit = crash(1),
                 cause = {"was killed by signal 6", "Aborted"}}
  end)

  it("a chip kernel's _exit(3)", function()
    failure_case{kind = "chips", where = "chip 1", callable = "crash", submit = crash(2),
                 cause = {"exited with status 3"}}
  end)

  it("a chip kernel's non-zero return (the child lives on)", function()
    failure_case{kind = "chips", where = "chip 1", callable = "fail", survives = true,
      submit = function(orch, x)
        return orch:submit_next_level(K.fail, pto.args{{x, "out"}, scalars = {9}}, nil, {worker = 1})
      end,
      cause = {"fail kernel called with code 9"}}
  end)

  it("a Lua error in a sub: message and traceback reach the parent (the child lives on)", function()
    local err = failure_case{kind = "subs", where = "sub 1", callable = "boom", survives = true,
      submit = function(orch, x) return orch:submit_sub(BOOM, pto.args{{x, "out"}, scalars = {1, 42}}, {worker = 1}) end,
      event = function() return -1 end,   -- STAMP[1], written by the sub just before error()
      cause = {"boom 42", "stack traceback"}}
    assert.truthy(err:find("process_spec.lua:%d+: boom 42"), err)   -- the error's position in the sub
    assert.truthy(err:find("in function", 1, true) or err:find("in upvalue", 1, true) or err:find("in local", 1, true),
                  err)   -- a real traceback, not just the header
  end)

  it("a sub calling os.exit(5)", function()
    failure_case{kind = "subs", where = "sub 1", callable = "quitter",
      submit = function(orch, x) return orch:submit_sub(QUIT, pto.args{{x, "out"}, scalars = {1}}, {worker = 1}) end,
      event = function() return -1 end,
      cause = {"exited with status 5"}}
  end)

  it("kill -9 of a chip child running a sleep_us task", function()
    failure_case{kind = "chips", where = "chip 1", callable = "sleep_us",
      submit = function(orch, x)
        return orch:submit_next_level(K.sleep_us, pto.args{{x, "out"}, scalars = {5000000}}, nil, {worker = 1})
      end,
      event = function(orch, id)
        H.wait_state(orch, id, {"running"})
        local pid = F:child_pids().chips[1]
        -- inside the 5 s sleep: killed any earlier, the child could be
        -- replaced before the task reaches it, and the task would succeed
        assert.is_true(eventually(function() return H.in_nanosleep(pid) end, 5), "chip 1 never entered sleep_us")
        local t = now()
        assert.is_true(kill(9, pid))
        return t
      end,
      cause = {"was killed by signal 9", "Killed"}}
  end)

  it("kill -9 of a sub child running Lua", function()
    failure_case{kind = "subs", where = "sub 1", callable = "spinner",
      submit = function(orch, x) return orch:submit_sub(SPIN, pto.args{{x, "out"}, scalars = {1, 5000000}}, {worker = 1}) end,
      event = function()
        assert.is_true(eventually(function() return STAMP[1] > 0 end, 5), "the spinner did not start")
        local pid = F:child_pids().subs[1]
        local t = now()
        assert.is_true(kill(9, pid))
        return t
      end,
      cause = {"was killed by signal 9", "Killed"}}
  end)

  it("a child killed while idle is replaced before its next task, shipped callables included", function()
    local late = F:register(function(args) local t = args:tensor(1); for i = 1, #t do t[i] = 7 end end, "late")
    local t = pto.tensor{4}
    F:run(function(orch) orch:submit_sub(late, pto.args{{t, "out"}}, {worker = 1}) end)
    assert.are.same({7, 7, 7, 7}, t:totable())
    local before = F:child_pids()
    assert.is_true(kill(9, before.subs[1]))
    assert.is_true(kill(9, before.chips[1]))
    assert.is_true(eventually(function() return gone(before.subs[1]) and gone(before.chips[1]) end, 1))
    -- and the Worker has seen them die (child_pids no longer lists them): a
    -- task posted in between would go to the dead child's mailbox and fail
    assert.is_true(eventually(function()
      local now_pids = F:child_pids()
      return now_pids.subs[1] ~= before.subs[1] and now_pids.chips[1] ~= before.chips[1]
    end, 1), "Worker:child_pids() still lists the killed children")
    t:fill(0)
    local c = pto.tensor{4}
    F:run(function(orch)
      orch:submit_sub(late, pto.args{{t, "out"}}, {worker = 1})
      orch:submit_next_level(K.fill, pto.args{{c, "out"}, scalars = {3.0}}, nil, {worker = 1})
    end)
    assert.are.same({7, 7, 7, 7}, t:totable())
    assert.are.same({3, 3, 3, 3}, c:totable())
    local after = F:child_pids()
    assert.are_not.equal(before.subs[1], after.subs[1])
    assert.are_not.equal(before.chips[1], after.chips[1])
    for _, pid in ipairs(all_pids(F)) do assert.is_true(H.alive(pid)) end
  end)
end)

describe("Worker:init", function()
  it("raises naming the chip, its pid and the dlopen error when the chip runtime cannot load; nothing is left",
     function()
    local before = footprint()
    local w = pto.Worker{mode = "process", chips = 2, num_sub_workers = 1, chip_runtime = "/nonexistent/libx.so"}
    local t0 = now()
    local msg = assert_error(function() w:init() end, "Worker:init: ", "chip 1 (pid ")
    local dt = now() - t0
    assert.truthy(msg:find("chip 1 %(pid %d+%) failed to start"), msg)
    assert.truthy(msg:find("/nonexistent/libx.so", 1, true), msg)
    assert.truthy(msg:find("cannot open shared object file", 1, true), msg)   -- dlerror's reason
    assert.is_true(dt < 1 + LIMIT, ("init took %.3f s to fail"):format(dt))
    assert_footprint(before, "after the failed init")   -- at once: init reaps what it forked
    w:close()
    assert_footprint(before, "after close")
  end)

  it("raises in time when a child hangs while starting, and kills it", function()
    local lib = assert(os.getenv("PTO_HANG_LIB"), "PTO_HANG_LIB names the fixture library (spec/CMakeLists.txt)")
    local before = footprint()
    local w = pto.Worker{mode = "process", chips = 2, num_sub_workers = 1, chip_runtime = lib, start_timeout_ms = 300}
    local t0 = now()
    local msg = assert_error(function() w:init() end, "Worker:init: ", "did not report ready within 300 ms")
    local dt = now() - t0
    assert.truthy(msg:find("chip %d %(pid %d+%) did not report ready"), msg)
    assert.is_true(dt >= 0.3 - 0.002, ("init gave up after %.3f s, before the 300 ms deadline"):format(dt))
    assert.is_true(dt < 0.3 + LIMIT + 0.1, ("init raised %.3f s after it began (deadline 0.3 s)"):format(dt))
    assert_footprint(before, "after the timed-out init")
    w:close()
    assert_footprint(before, "after close")
  end)
end)

describe("children never outlive the parent", function()
  it("are gone within 1 s of a SIGKILL to the parent, killed mid-run", function()
    local script = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write([[
      local w = pto.Worker{mode = "process", chips = 2, num_sub_workers = 2}
      local sl = w:register(pto.chip_kernel("sleep_us"))
      local spin = w:register(function() while true do end end)
      w:init()
      local me = assert(io.open("/proc/self/stat")):read("n")
      local p = w:child_pids()
      io.write("PIDS ", me)
      for _, k in ipairs{"chips", "subs"} do for _, pid in ipairs(p[k]) do io.write(" ", pid) end end
      io.write("\n")
      io.flush()
      w:run(function(orch)
        orch:submit_next_level(sl, pto.args{scalars = {30000000}})   -- 30 s: killed long before
        orch:submit_sub(spin)
      end)
    ]])
    f:close()
    local p = assert(io.popen(("exec %q %q"):format(PTOLUA, script)))
    local line = p:read("l")
    os.remove(script)
    local pids = {}
    for pid in (line or ""):gmatch("%d+") do pids[#pids + 1] = math.tointeger(tonumber(pid)) end
    assert.are.equal(5, #pids, "the script did not print its pid and 4 child pids: " .. tostring(line))
    local parent = table.remove(pids, 1)
    -- every process under it (the 4 children and any helper), once a chip
    -- is inside its 30 s task
    assert.is_true(eventually(function() return H.in_nanosleep(pids[1]) or H.in_nanosleep(pids[2]) end, 5),
                   "no chip child entered its sleep_us task")
    local family = H.descendants(parent)
    for _, pid in ipairs(pids) do
      local found = false
      for _, d in ipairs(family) do found = found or d == pid end
      assert.is_true(found, ("child %d is not a descendant of the parent %d"):format(pid, parent))
    end
    local t0 = now()
    assert.is_true(kill(9, parent))
    local all_gone = eventually(function()
      for _, pid in ipairs(family) do if not gone(pid) then return false end end
      return true
    end, 1)
    local dt = now() - t0
    p:close()
    local left = {}
    for _, pid in ipairs(family) do if not gone(pid) then left[#left + 1] = pid end end
    assert.is_true(all_gone, ("still there %.2f s after the parent's SIGKILL: %s"):format(dt, table.concat(left, " ")))
  end)
end)

describe("leaks", function()
  it("init, run and close cycles leave no process, /dev/shm entry or file descriptor", function()
    local before = footprint()
    for cycle = 1, 5 do
      local w = pto.Worker{mode = "process", chips = 2, num_sub_workers = 2}
      local fill = w:register(pto.chip_kernel("fill"))
      local sub = w:register(function(args) local t = args:tensor(1); t[1] = t[1] + 1 end)
      w:init()
      local open = H.descendants()
      local pids = all_pids(w)
      assert.are.equal(4, #pids)
      for _, pid in ipairs(pids) do
        local found = false
        for _, d in ipairs(open) do found = found or d == pid end
        assert.is_true(found, ("child %d is not a descendant of this process"):format(pid))
      end
      local t = pto.tensor{4}
      w:run(function(orch)
        orch:submit_next_level(fill, pto.args{{t, "out"}, scalars = {cycle + 0.0}})
        orch:submit_sub(sub, pto.args{{t, "inout"}})
      end)
      assert.are.equal(cycle + 1, t[1])
      w:close()
      for _, pid in ipairs(pids) do assert.is_true(gone(pid), ("child %d outlived close"):format(pid)) end
    end
    assert_footprint(before, "after 5 init/run/close cycles")
    -- a Worker dropped without close: __gc closes it
    do
      local w = pto.Worker{mode = "process", chips = 1, num_sub_workers = 1}
      w:init()
    end
    collectgarbage()
    collectgarbage()
    assert_footprint(before, "after a Worker collected by __gc")
  end)

  it("close after failures leaves nothing", function()
    local before = footprint()
    local w = pto.Worker{mode = "process", chips = 2, num_sub_workers = 1}
    local crash_k = w:register(pto.chip_kernel("crash"))
    local sleep_k = w:register(pto.chip_kernel("sleep_us"))
    local bad = w:register(function() error("bad sub") end)
    w:init()
    assert.is_false(pcall(w.run, w, function(orch)
      orch:submit_next_level(crash_k, pto.args{scalars = {0}}, nil, {worker = 1})
      orch:submit_sub(bad)
    end))
    local victim = w:child_pids().chips[2]
    local ok, err = pcall(w.run, w, function(orch)
      local id = orch:submit_next_level(sleep_k, pto.args{scalars = {5000000}}, nil, {worker = 2})
      H.wait_state(orch, id, {"running"})
      assert(eventually(function() return H.in_nanosleep(victim) end, 5), "chip 2 never entered sleep_us")
      kill(9, victim)
    end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("killed by signal 9", 1, true), tostring(err))
    w:close()
    assert_footprint(before, "after close of a Worker whose children failed")
    assert.is_true(gone(victim))
  end)
end)

describe("steady state", function()
  it("runs 1000 consecutive runs on one Worker", function()
    local w = pto.Worker{mode = "process", chips = 1, num_sub_workers = 1}
    local fill = w:register(pto.chip_kernel("fill"))
    local out = pto.tensor({1000}, "f64")
    local put = w:register(function(args) out[args:scalar(1)] = args:tensor(1)[1] end, "put")
    w:init()
    local pids = all_pids(w)
    local x = pto.tensor({1}, "f64")
    local t0 = now()
    for i = 1, 1000 do
      w:run(function(orch)
        orch:submit_next_level(fill, pto.args{{x, "out"}, scalars = {i + 0.0}})
        orch:submit_sub(put, pto.args{x, scalars = {i}})
      end)
    end
    local dt = now() - t0
    for i = 1, 1000 do
      if out[i] ~= i then error(("run %d: the sub saw %s"):format(i, tostring(out[i]))) end
    end
    local s = w:stats()
    assert.are.equal(1000, s.runs)
    assert.are.equal(2000, s.tasks_completed)
    assert.are.equal(0, s.tasks_failed)
    assert.is_true(same_list(pids, all_pids(w)), "a child was replaced during healthy runs")
    w:close()
    print(("# 1000 runs of 2 tasks (chip, then sub) in %.3f s: %.1f us per run"):format(dt, dt / 1000 * 1e6))
  end)
end)

describe("after init", function()
  local w, vadd
  setup(function()
    w = pto.Worker{mode = "process", chips = 2, num_sub_workers = 2}
    vadd = w:register(pto.chip_kernel("vector_add"))
    w:init()
  end)
  teardown(function() if w then w:close() end end)

  it("a sub registered after init is shipped to the children, with its plain upvalues", function()
    local k, f, s, yes, none = 42, 2.5, "abc", true, nil
    local h = w:register(function(args)
      local t = args:tensor(1)
      t[1], t[2], t[3], t[4], t[5] = k, f, #s, yes and 1 or 0, none == nil and 1 or 0
      t[6] = #string.rep(s, 2)                -- globals are the child's own
      t[7] = args:scalar(1)
    end, "shipped")
    local t1, t2 = pto.tensor({7}, "f64"), pto.tensor({7}, "f64")
    w:run(function(orch)
      orch:submit_sub_group(h, {pto.args{{t1, "out"}, scalars = {1}}, pto.args{{t2, "out"}, scalars = {2}}},
                            {workers = {1, 2}})
    end)
    assert.are.same({42, 2.5, 3, 1, 1, 6, 1}, t1:totable())
    assert.are.same({42, 2.5, 3, 1, 1, 6, 2}, t2:totable())
  end)

  it("a sub registered after init with a table, function or tensor upvalue is refused, saying why", function()
    local cfg, helper, tensor = {scale = 2}, function() end, pto.tensor{1}
    assert_error(function() w:register(function() return cfg.scale end) end, "Worker:register: ",
                 "its upvalue 'cfg' is a table; only nil, booleans, numbers and strings can be shipped")
    assert_error(function() w:register(function() return helper() end) end, "Worker:register: ",
                 "its upvalue 'helper' is a function")
    assert_error(function() w:register(function() return tensor[1] end) end, "Worker:register: ",
                 "its upvalue 'tensor' is a userdata")
    assert_error(function() w:register(print) end, "Worker:register: ", "a C function cannot be shipped")
    H.check_vector_add(w, vadd)
  end)

  it("a chip kernel registered after init runs on every chip child", function()
    local mul = w:register(pto.chip_kernel("vector_mul"))
    local scale = w:register(pto.chip_kernel{lib = H.CHIPSIM, symbol = "vector_scale"})
    local a, b = pto.tensor{8}, pto.tensor{8}
    local c1, c2, d1, d2 = pto.tensor{8}, pto.tensor{8}, pto.tensor{8}, pto.tensor{8}
    for i = 1, 8 do a[i] = i; b[i] = 3 end
    w:run(function(orch)
      orch:submit_next_level_group(mul, {pto.args{a, b, {c1, "out"}}, pto.args{b, a, {c2, "out"}}}, nil,
                                   {workers = {1, 2}})
      orch:submit_next_level_group(scale, {pto.args{a, {d1, "out"}, scalars = {0.5}},
                                           pto.args{b, {d2, "out"}, scalars = {2.0}}}, nil, {workers = {2, 1}})
    end)
    for i = 1, 8 do
      assert.are.equal(3 * i, c1[i])
      assert.are.equal(3 * i, c2[i])
      assert.are.equal(0.5 * i, d1[i])
      assert.are.equal(6, d2[i])
    end
  end)

  it("a tensor created after init is shared with chip and sub children", function()
    local double = w:register(function(args) local t = args:tensor(1); for i = 1, #t do t[i] = 2 * t[i] end end)
    local a, b, c, d = pto.tensor({64}, "f32"), pto.tensor({64}, "f32"), pto.tensor({64}, "f32"), pto.tensor({64}, "f32")
    for i = 1, 64 do a[i] = i; b[i] = 1 end
    for worker = 1, 2 do
      w:run(function(orch)
        orch:submit_next_level(vadd, pto.args{a, b, {c, "out"}}, nil, {worker = worker})
        orch:submit_sub(double, pto.args{{c, "inout"}}, {worker = worker})
        orch:submit_next_level(vadd, pto.args{c, b, {d, "out"}}, nil, {worker = 3 - worker})
      end)
      for i = 1, 64 do
        assert.are.equal(2 * (i + 1), c[i])
        assert.are.equal(2 * (i + 1) + 1, d[i])
      end
    end
  end)
end)

describe("the failure Worker", function()
  it("closes leaving nothing behind", function()
    local pids = all_pids(F)
    F:close()
    F = nil
    for _, pid in ipairs(pids) do assert.is_true(gone(pid), ("child %d outlived close"):format(pid)) end
    assert_footprint(BASE, "after the failure Worker closed")
  end)
end)
