-- robust_spec.lua: the reproducers of issue 19, items 2 to 5, as tests.
-- Item 2: a stopped forkserver neither strands close nor outlives the
-- parent. Item 3: an L4 replaces an L3 whose forkserver died. Item 4: what a
-- task starts dies on replacement, close and parent death. Item 5: a child
-- maps only its own mailbox (the C side, spec/c/test_robust.c, scribbles
-- over mailboxes). All of it is about child processes: in thread mode each
-- test is a pending entry saying so. Bounds are loose (a shared 2-core box);
-- what they catch is a hang, not a slow machine.
local pto = require "pto"
local H = require "helpers"

local args = pto.args
local eventually, gone = H.eventually, H.gone
local PTOLUA = assert(os.getenv("PTOLUA"), "set PTOLUA to the ptolua binary")
local WHY = "thread mode starts no child processes"

-- The forkserver: the parent of every child of w.
local function forkserver_of(w)
  local pids = w:child_pids()
  local any = (pids.chips or {})[1] or (pids.subs or {})[1] or (pids.workers or {})[1]
  assert(any, "the Worker lists no child process")
  return assert(H.proc(any)).ppid
end

local function all_gone(pids, secs)
  return eventually(function()
    for _, p in ipairs(pids) do if not gone(p) then return false end end
    return true
  end, secs)
end

local function read_pid(path, secs)
  local pid
  eventually(function()
    local f = io.open(path)
    if f then pid = f:read("n"); f:close() end
    return pid ~= nil
  end, secs)
  return assert(math.tointeger(pid), "no pid in " .. path)
end

-- A sub that starts `sleep 313` in the background and records its pid in path.
local function starter(w, path)
  return w:register(function() os.execute("sleep 313 & echo $! > " .. path) end, "start_sleep")
end

describe("a stopped forkserver", function()
  H.process_only("does not strand close: close returns within a bound and nothing of the tree is left", WHY,
                 function()
    local w = pto.Worker{mode = "process", chips = 2}
    w:init()
    local z = forkserver_of(w)
    local tree = H.descendants(z)
    tree[#tree + 1] = z
    os.execute("kill -STOP " .. z)
    local t0 = pto.now()
    w:close()
    assert.is_true(pto.now() - t0 < 10, "close waited on the stopped forkserver")
    assert.is_true(all_gone(tree, 5), "a process of the stopped forkserver's tree outlived close")
  end)

  H.process_only("dies with its parent, and so do its children and what they started", WHY, function()
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir " .. dir .. " && mkfifo " .. dir .. "/fifo"))
    local script = dir .. "/parent.lua"
    local f = assert(io.open(script, "w"))
    f:write(([[
      local pto = require "pto"
      local w = pto.Worker{mode = "process", chips = 1, num_sub_workers = 1}
      local s = w:register(function() os.execute("sleep 313 & echo $! > %s/sleep") end)
      w:init()
      w:run(function(o) o:submit_sub(s) end)
      local z = assert(io.open("/proc/" .. w:child_pids().subs[1] .. "/stat")):read("a"):match("%%) %%S (%%d+)")
      os.execute("kill -STOP " .. z)
      local me = assert(io.open("/proc/self/stat")):read("n")
      local out = assert(io.open("%s/pid.tmp", "w"))
      out:write(me, " ", z, "\n")
      out:close()
      os.rename("%s/pid.tmp", "%s/pid")
      assert(io.open("%s/fifo")):read("a")   -- blocks (no writer) until it is killed, starting nothing
    ]]):format(dir, dir, dir, dir, dir))
    f:close()
    assert(os.execute(("%q %q </dev/null >/dev/null 2>&1 &"):format(PTOLUA, script)))
    local parent = read_pid(dir .. "/pid", 20)
    local z = assert(math.tointeger(tonumber(io.open(dir .. "/pid"):read("a"):match(" (%d+)"))))
    local sleeper = read_pid(dir .. "/sleep", 5)
    local tree = H.descendants(z)
    tree[#tree + 1] = z
    tree[#tree + 1] = sleeper
    assert.is_true(#tree >= 4, "the parent has no tree")   -- forkserver, chip, sub, sleep at least
    for _, p in ipairs(tree) do
      local st = H.proc(p)
      assert.is_true(st ~= nil, "process " .. p .. " of the tree is gone before its parent")
    end
    os.execute("kill -9 " .. parent)
    assert.is_true(all_gone(tree, 5), "a process of the tree outlived its SIGKILLed parent")
    os.execute("rm -rf " .. dir)
  end)
end)

describe("processes a task starts", function()
  H.process_only("are gone after close", WHY, function()
    local path = os.tmpname()
    local w = pto.Worker{mode = "process", num_sub_workers = 1}
    local s = starter(w, path)
    w:init()
    w:run(function(o) o:submit_sub(s) end)
    local sleeper = read_pid(path, 5)
    assert.is_true(H.alive(sleeper))
    w:close()
    assert.is_true(all_gone({sleeper}, 5), "sleep 313 started by a sub outlived close")
    os.remove(path)
  end)

  H.process_only("are gone after close also when they left their process group (setsid)", WHY, function()
    local path = os.tmpname()
    local w = pto.Worker{mode = "process", num_sub_workers = 1}
    local s = w:register(function() os.execute("setsid sleep 313 & echo $! > " .. path) end, "start_setsid")
    w:init()
    w:run(function(o) o:submit_sub(s) end)
    local sleeper = read_pid(path, 5)
    assert.is_true(H.alive(sleeper))
    -- setsid runs in the background job: it may not have left the group yet
    assert.is_true(eventually(function()
      local f = io.open("/proc/" .. sleeper .. "/stat")
      local pgrp = f and f:read("a"):match("%) %S %d+ (%d+)")
      if f then f:close() end
      return math.tointeger(tonumber(pgrp)) == sleeper
    end, 5), "the sleep did not leave its group")
    w:close()
    assert.is_true(all_gone({sleeper}, 5), "setsid sleep 313 started by a sub outlived close")
    os.remove(path)
  end)

  H.process_only("are gone when their child dies and is replaced", WHY, function()
    local path = os.tmpname()
    local w = pto.Worker{mode = "process", num_sub_workers = 1}
    local s = starter(w, path)
    local die = w:register(function() os.exit(3) end, "die")
    local pid = w:register(function(a) a:tensor(1)[1] = H.getpid() end, "pid")
    w:init()
    w:run(function(o) o:submit_sub(s) end)
    local sleeper = read_pid(path, 5)
    local child = w:child_pids().subs[1]
    H.assert_error(function() w:run(function(o) o:submit_sub(die) end) end, "Worker:run:", "exited with status 3")
    assert.is_true(all_gone({child, sleeper}, 5), "sleep 313 outlived the child that started it")
    local t = pto.tensor({1}, "i64")
    w:run(function(o) o:submit_sub(pid, args{{t, "inout"}}) end)
    assert.is_true(t[1] ~= child and H.alive(t[1]), "the sub was not replaced")
    w:close()
    os.remove(path)
  end)
end)

describe("an L3 whose forkserver died", function()
  local function tree()
    local counter = pto.tensor({1}, "i64")
    local started = pto.tensor({1}, "i64")
    local l3 = pto.Worker{level = 3, chips = 1, num_sub_workers = 1, mode = "process"}
    local bump = l3:register(function(a) local t = a:tensor(1); t[1] = t[1] + 1 end, "bump")
    local sleep = l3:register(pto.chip_kernel("sleep_us"))
    local w4 = pto.Worker{level = 4, mode = "process"}
    local count = w4:register(function(orch, a) orch:submit_sub(bump, args{{a:tensor(1), "inout"}}) end, "count")
    local slow = w4:register(function(orch, a)
      a:tensor(1)[1] = 1
      orch:submit_next_level(sleep, args{scalars = {30000000}})
    end, "slow")
    w4:add_worker(l3)
    w4:init()
    local function run_count()
      w4:run(function(o) o:submit_next_level(count, args{{counter, "inout"}}, pto.CallConfig()) end)
    end
    return w4, run_count, counter, slow, started
  end

  local function forkserver_of_host(host)
    local p = io.popen("pgrep -P " .. host)
    local z = p:read("n")
    p:close()
    return assert(math.tointeger(z), "the L3 host has no forkserver")
  end

  H.process_only("while idle is replaced with its host, and the next L4 run works", WHY, function()
    local w4, run_count, counter = tree()
    run_count()
    local host = w4:child_pids().workers[1]
    os.execute("kill -9 " .. forkserver_of_host(host))
    assert.is_true(eventually(function() return gone(host) end, 5), "the L3 host outlived its forkserver")
    assert.is_true(eventually(function() return w4:child_pids().workers[1] == nil end, 5))
    run_count()
    run_count()
    assert.equal(3, counter[1])
    local replaced = w4:child_pids().workers[1]
    assert.is_true(replaced ~= nil and replaced ~= host, "no new L3 host")
    w4:close()
  end)

  H.process_only("while the L3 runs a task fails that task naming the cause, and the next run works", WHY, function()
    local w4, run_count, counter, slow, started = tree()
    local host = w4:child_pids().workers[1]
    local z = forkserver_of_host(host)
    local t0 = pto.now()
    local msg = H.assert_error(function()
      w4:run(function(o)
        o:submit_next_level(slow, args{{started, "inout"}}, pto.CallConfig())
        assert.is_true(eventually(function() return started[1] == 1 end, 10), "the L3 task did not start")
        os.execute("kill -9 " .. z)
      end)
    end, "Worker:run: L4 task 0 (callable 'slow' on L3 worker 1")
    assert.truthy(msg:find("forkserver", 1, true), msg)
    assert.is_true(pto.now() - t0 < 20, "the failure waited for the 30 s task")
    assert.is_true(eventually(function() return gone(host) end, 5), "the L3 host outlived its forkserver")
    assert.is_true(eventually(function() return w4:child_pids().workers[1] ~= host end, 5))
    run_count()
    assert.equal(1, counter[1])
    w4:close()
  end)
end)

describe("a child's mappings", function()
  -- Shared mappings in a sub's child: the arena and its own mailbox, not one per worker.
  local function shared_in_child(nsubs)
    local w = pto.Worker{mode = "process", num_sub_workers = nsubs}
    local count = w:register(function(a)
      local n = 0
      for line in io.lines("/proc/self/maps") do
        if line:match("^%x+%-%x+ rw%-s ") then n = n + 1 end
      end
      a:tensor(1)[1] = n
    end, "count")
    w:init()
    local t = pto.tensor({1}, "i64")
    w:run(function(o) o:submit_sub(count, args{{t, "inout"}}) end)
    w:close()
    return t[1]
  end

  H.process_only("do not grow with the number of workers: a child maps only its own mailbox", WHY, function()
    local one, four = shared_in_child(1), shared_in_child(4)
    assert.is_true(one > 0)
    assert.equal(one, four)
  end)
end)
