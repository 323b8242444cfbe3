-- levels_spec.lua: Workers of Workers (issue 5). A Worker of level >= 4 has
-- Worker children (w:add_worker); each task it dispatches to one is an
-- orchestration function the child runs with its own engine. Tensors pass
-- down any number of levels and alias the same storage; failures come back
-- wrapped once per level; init, failure and close cover the whole tree.
--
-- Workers that name no mode take $PTO_MODE (this file runs once per mode);
-- "thread over process" is checked explicitly as well.
local pto = require "pto"
local H = require "helpers"

local now = pto.now
local assert_error = H.assert_error

local args = pto.args

local eventually, gone = H.eventually, H.gone

local function live_descendants()
  local out = {}
  for _, pid in ipairs(H.descendants()) do
    if not gone(pid) then out[#out + 1] = pid end
  end
  return out
end


local function assert_no_new_processes(before, what)
  local known = {}
  for _, pid in ipairs(before) do known[pid] = true end
  local left = {}
  assert.is_true(eventually(function()
    left = {}
    for _, pid in ipairs(live_descendants()) do
      if not known[pid] then left[#left + 1] = pid end
    end
    return #left == 0
  end, 2), ("%s: processes left: %s"):format(what, table.concat(left, " ")))
end

-- An L4 over one L3 whose single sub adds 1 to element 1 of its tensor.
local function counter_tree(mode4, mode3)
  local l3 = pto.Worker{level = 3, num_sub_workers = 1, mode = mode3}
  local bump = l3:register(function(a) local t = a:tensor(1); t[1] = t[1] + 1 end, "bump")
  local w4 = pto.Worker{level = 4, mode = mode4}
  local orch3 = w4:register(function(orch, a)
    orch:submit_sub(bump, args{{a:tensor(1), "inout"}})
  end, "count")
  assert.equal(1, w4:add_worker(l3))
  return w4, orch3
end

describe("an L4 over one L3 with a sub", function()
  it("counts 1 submit, 3 submits in a run, then 5 runs", function()
    local counter = pto.tensor({1}, "i64")
    local w4, count = counter_tree()
    w4:init()
    local function run(n)
      w4:run(function(orch)
        for _ = 1, n do orch:submit_next_level(count, args{{counter, "inout"}}, pto.CallConfig()) end
      end)
    end
    run(1)
    assert.equal(1, counter[1])
    counter[1] = 0
    run(3)
    assert.equal(3, counter[1])
    counter[1] = 0
    for _ = 1, 5 do run(1) end
    assert.equal(5, counter[1])
    local s = w4:stats()
    assert.equal(4, s.level)
    assert.equal(1, s.workers)
    assert.equal(9, s.tasks_completed)
    assert.equal(3, s.children[1].level)
    assert.equal(9, s.children[1].tasks_completed)   -- one sub task per L4 task
    assert.equal(9, s.children[1].runs)
    local report = w4:stats_report()
    assert.truthy(report:find("level 4", 1, true), report)
    assert.truthy(report:find("== L3 worker 1", 1, true), report)
    assert.truthy(report:find("level 3", 1, true), report)
    w4:close()
  end)

  it("works with the L4 in thread mode over an L3 in process mode", function()
    local counter = pto.tensor({1}, "i64")
    local w4, count = counter_tree("thread", "process")
    w4:init()
    for _ = 1, 3 do
      w4:run(function(orch) orch:submit_next_level(count, args{{counter, "inout"}}, pto.CallConfig()) end)
    end
    assert.equal(3, counter[1])
    w4:close()
  end)
end)

describe("an L4 with its own sub and an L3 child", function()
  it("has both write their own slot", function()
    local slots = pto.tensor({2}, "i32")
    local l3 = pto.Worker{level = 3, num_sub_workers = 1}
    local put3 = l3:register(function(a) a:tensor(1)[2] = 3 end)
    local w4 = pto.Worker{level = 4, num_sub_workers = 1}
    local put4 = w4:register(function(a) a:tensor(1)[1] = 4 end)
    local orch3 = w4:register(function(orch, a) orch:submit_sub(put3, args{{a:tensor(1), "inout"}}) end)
    w4:add_worker(l3)
    w4:init()
    w4:run(function(orch)
      orch:submit_sub(put4, args{{slots:view{offset = 0, shape = {1}}, "inout"}})
      orch:submit_next_level(orch3, args{{slots, "no_dep"}}, pto.CallConfig())
    end)
    assert.same({4, 3}, {slots[1], slots[2]})
    w4:close()
  end)
end)

describe("arguments", function()
  it("pass an INOUT tensor and scalars down to an L3 sub that writes them", function()
    local t = pto.tensor({8}, "f32")
    local l3 = pto.Worker{level = 3, num_sub_workers = 1}
    local add1 = l3:register(function(a)
      local x = a:tensor(1)
      for i = 1, #x do x[i] = x[i] + 1 end
      x[1], x[2] = a:scalar(1), a:scalar(2)
    end)
    local w4 = pto.Worker{level = 4}
    local fwd = w4:register(function(orch, a, cfg)
      assert(cfg.block_dim == 5, "the CallConfig did not arrive")
      orch:submit_sub(add1, args{{a:tensor(1), "inout"}, scalars = {a:scalar(1), a:scalar(2)}})
    end)
    w4:add_worker(l3)
    w4:init()
    w4:run(function(orch)
      local fill = args{{t, "inout"}, scalars = {7, 11}}
      for i = 1, #t do t[i] = 5.0 end
      orch:submit_next_level(fwd, fill, pto.CallConfig{block_dim = 5})
    end)
    assert.equal(7, t[1])
    assert.equal(11, t[2])
    for i = 3, #t do assert.equal(6.0, t[i]) end
    w4:close()
  end)
end)

describe("failures", function()
  it("of an L3 sub reach the L4 run wrapped per level, and the next run succeeds", function()
    local counter = pto.tensor({1}, "i64")
    local l3 = pto.Worker{level = 3, num_sub_workers = 1}
    local boom = l3:register(function() error("root cause 42") end, "boom")
    local bump = l3:register(function(a) local t = a:tensor(1); t[1] = t[1] + 1 end, "bump")
    local w4 = pto.Worker{level = 4}
    local bad = w4:register(function(orch) orch:submit_sub(boom) end, "bad_orch")
    local good = w4:register(function(orch, a) orch:submit_sub(bump, args{{a:tensor(1), "inout"}}) end, "good_orch")
    w4:add_worker(l3)
    w4:init()
    local msg = assert_error(function()
      w4:run(function(orch)
        local id = orch:submit_next_level(bad, args{{counter, "inout"}}, pto.CallConfig())
        orch:submit_next_level(good, args{{counter, "inout"}}, pto.CallConfig())   -- poisoned
        return id
      end)
    end, "Worker:run: L4 task 0 (callable 'bad_orch' on L3 worker 1")
    assert.truthy(msg:find("L3 task 0 (callable 'boom' on sub 1", 1, true), msg)
    assert.truthy(msg:find("root cause 42", 1, true), msg)
    assert.truthy(msg:find("stack traceback", 1, true), msg)
    assert.equal(0, counter[1])   -- the consumer was poisoned, not run
    w4:run(function(orch) orch:submit_next_level(good, args{{counter, "inout"}}, pto.CallConfig()) end)
    assert.equal(1, counter[1])
    w4:close()
  end)

  it("of an L3 orchestration function itself come back with its traceback", function()
    local l3 = pto.Worker{level = 3, num_sub_workers = 1}
    local w4 = pto.Worker{level = 4}
    local bad = w4:register(function() local x = nil; return x.field end, "nil_index")
    w4:add_worker(l3)
    w4:init()
    local msg = assert_error(function()
      w4:run(function(orch) orch:submit_next_level(bad, pto.TaskArgs(), pto.CallConfig()) end)
    end, "Worker:run: L4 task 0 (callable 'nil_index' on L3 worker 1")
    assert.truthy(msg:find("L3 orchestration function failed", 1, true), msg)
    assert.truthy(msg:find("attempt to index", 1, true), msg)
    assert.truthy(msg:find("stack traceback", 1, true), msg)
    w4:close()
  end)
end)

describe("an L3 child process", function()
  local WHY = "a killed L3 child is replaced with its whole subtree"
  H.process_only("killed with SIGKILL while idle is replaced with its subtree before the next task", WHY, function()
    local counter = pto.tensor({1}, "i64")
    local w4, count = counter_tree("process", "process")
    w4:init()
    local pid = w4:child_pids().workers[1]
    assert.is_true(pid ~= nil)
    local below = H.descendants(pid)   -- the L3's zygote and sub
    assert.is_true(#below >= 2, "the L3 child has no children of its own")
    os.execute("kill -9 " .. pid)
    assert.is_true(eventually(function()
      for _, p in ipairs(below) do if not gone(p) then return false end end
      return true
    end, 2), "the L3 child's own children outlived it")
    -- Once the L4 has seen the death (its zygote reaped the child: no pid
    -- listed), the next task replaces the child before it is sent, so the
    -- run succeeds. (A child killed while it runs a task fails that task:
    -- process_spec.)
    assert.is_true(eventually(function() return w4:child_pids().workers[1] == nil end, 2),
                   "the L4 still lists the killed L3 child")
    w4:run(function(orch) orch:submit_next_level(count, args{{counter, "inout"}}, pto.CallConfig()) end)
    assert.equal(1, counter[1])
    local replaced = w4:child_pids().workers[1]
    assert.is_true(replaced ~= nil and replaced ~= pid, "no new L3 child")
    w4:run(function(orch) orch:submit_next_level(count, args{{counter, "inout"}}, pto.CallConfig()) end)
    assert.equal(2, counter[1])
    assert.equal(replaced, w4:child_pids().workers[1])
    w4:close()
  end)

  H.process_only("killed with SIGKILL while it runs a task fails that task, and is replaced for the next run", WHY,
                 function()
    local started, counter = pto.tensor({1}, "i64"), pto.tensor({1}, "i64")
    local l3 = pto.Worker{level = 3, chips = 1, num_sub_workers = 1, mode = "process"}
    local sleep = l3:register(pto.chip_kernel("sleep_us"))
    local bump = l3:register(function(a) local t = a:tensor(1); t[1] = t[1] + 1 end, "bump")
    local w4 = pto.Worker{level = 4, mode = "process"}
    -- says it started (the flag is shared memory), then sleeps 30 s: killed long before
    local slow = w4:register(function(orch, a)
      a:tensor(1)[1] = 1
      orch:submit_next_level(sleep, args{scalars = {30000000}})
    end, "slow")
    local count = w4:register(function(orch, a) orch:submit_sub(bump, args{{a:tensor(1), "inout"}}) end, "count")
    w4:add_worker(l3)
    w4:init()
    local pid = w4:child_pids().workers[1]
    local t0 = now()
    local msg = assert_error(function()
      w4:run(function(orch)
        orch:submit_next_level(slow, args{{started, "inout"}}, pto.CallConfig())
        assert.is_true(eventually(function() return started[1] == 1 end, 10), "the L3 task did not start")
        os.execute("kill -9 " .. pid)
      end)
    end, "Worker:run: L4 task 0 (callable 'slow' on L3 worker 1")
    assert.truthy(msg:find("killed by signal 9", 1, true), msg)
    assert.is_true(now() - t0 < 10, "the failure waited for the 30 s task")
    w4:run(function(orch) orch:submit_next_level(count, args{{counter, "inout"}}, pto.CallConfig()) end)
    assert.equal(1, counter[1])
    local replaced = w4:child_pids().workers[1]
    assert.is_true(replaced ~= nil and replaced ~= pid, "no new L3 child")
    w4:close()
  end)
end)

describe("orchestration functions", function()
  it("registered after init reach the children, and create tensors there", function()
    local out = pto.tensor({4}, "f32")
    local l3 = pto.Worker{level = 3, chips = 1, num_sub_workers = 1}
    local fill = l3:register(pto.chip_kernel("fill"))
    local copy = l3:register(pto.chip_kernel("copy"))
    local w4 = pto.Worker{level = 4}
    w4:add_worker(l3)
    -- A function registered after init is shipped to the child, with plain
    -- upvalues only; it finds the handles through a global the fork carried.
    _G.KERNELS_FOR_LEVELS_SPEC = {fill = fill, copy = copy}   -- busted gives spec files their own globals
    w4:init()
    local h = w4:register(function(orch, a)
      local k, P = KERNELS_FOR_LEVELS_SPEC, require "pto"
      local tmp = P.tensor({4}, "f32")   -- created in the child's own arena
      orch:submit_next_level(k.fill, P.args{{tmp, "out"}, scalars = {2.5}})
      orch:submit_next_level(k.copy, P.args{{tmp, "in"}, {a:tensor(1), "out"}})
    end, "late")
    w4:run(function(orch) orch:submit_next_level(h, args{{out, "out"}}, pto.CallConfig()) end)
    for i = 1, 4 do assert.equal(2.5, out[i]) end
    w4:close()
  end)
end)

describe("a forked child's garbage collector", function()
  it("leaves its copies of unreachable Workers alone (their threads are not in it)", function()
    do
      local junk = pto.Worker{level = 3, chips = 1, num_sub_workers = 1}
      junk:init()   -- threads and children, then unreachable and never closed
    end
    local done = pto.tensor({1}, "i64")
    local l3 = pto.Worker{level = 3, num_sub_workers = 1}
    local sub = l3:register(function(a) collectgarbage(); collectgarbage(); a:tensor(1)[1] = 1 end)
    local w4 = pto.Worker{level = 4}
    local h = w4:register(function(orch, a)
      collectgarbage()
      collectgarbage()
      orch:submit_sub(sub, args{{a:tensor(1), "inout"}})
    end)
    w4:add_worker(l3)
    w4:init()
    local t0 = now()
    w4:run(function(orch) orch:submit_next_level(h, args{{done, "inout"}}, pto.CallConfig()) end)
    assert.equal(1, done[1])
    assert.is_true(now() - t0 < 5)
    w4:close()
    collectgarbage()   -- here the original is collected, and closed
    collectgarbage()
  end)
end)

-- Tiled BGEMM across three levels: L5 hands each batch to the L4, which
-- hands each row of C tiles to one of its L3 Workers, whose chips run
-- gemm_tile and tile_add.
describe("L5 -> L4 -> L3 -> chips", function()
  it("computes a small BGEMM that matches the reference", function()
    local batch, MT, NT, KT, T = 2, 2, 2, 2, 8
    local TT = T * T
    local A = pto.tensor({batch * MT * KT * TT}, "f32")
    local B = pto.tensor({batch * KT * NT * TT}, "f32")
    local C = pto.tensor({batch * MT * NT * TT}, "f32")
    for i = 1, #A do A[i] = ((i * 7) % 17 - 8) / 8 end
    for i = 1, #B do B[i] = ((i * 5) % 13 - 6) / 8 end

    local l3s, kernels = {}, {}
    for i = 1, 2 do
      l3s[i] = pto.Worker{level = 3, chips = 2, heap_ring_size = 1 << 20}
      kernels[l3s[i]] = {gemm = l3s[i]:register(pto.chip_kernel("gemm_tile")),
                         add = l3s[i]:register(pto.chip_kernel("tile_add"))}
    end
    -- args: A (batch b, all of it), B (batch b), C row i of tiles; scalar: i
    local row = function(orch, a)
      local gemm, add = kernels[orch:worker()].gemm, kernels[orch:worker()].add
      local Ab, Bb, Crow, i = a:tensor(1), a:tensor(2), a:tensor(3), a:scalar(1)
      for j = 0, NT - 1 do
        local c = Crow:view{offset = j * TT, shape = {T, T}}
        for k = 0, KT - 1 do
          local p = orch:alloc({T, T}, "f32")
          orch:submit_next_level(gemm, args{{Ab:view{offset = (i * KT + k) * TT, shape = {T, T}}, "in"},
                                            {Bb:view{offset = (k * NT + j) * TT, shape = {T, T}}, "in"}, {p, "out"}})
          orch:submit_next_level(add, args{{c, "inout"}, {p, "in"}})
        end
      end
    end
    local w4 = pto.Worker{level = 4}
    local row_h = w4:register(row, "row")
    for i = 1, 2 do w4:add_worker(l3s[i]) end
    local batch_fn = function(orch, a)
      local Ab, Bb, Cb = a:tensor(1), a:tensor(2), a:tensor(3)
      for i = 0, MT - 1 do
        orch:submit_next_level(row_h, args{{Ab, "in"}, {Bb, "in"}, {Cb:view{offset = i * NT * TT, shape = {NT * TT}}, "inout"},
                                           scalars = {i}}, pto.CallConfig(), {worker = i % 2 + 1})
      end
    end
    local w5 = pto.Worker{level = 5}
    local batch_h = w5:register(batch_fn, "batch")
    w5:add_worker(w4)
    w5:init()
    w5:run(function(orch)
      for b = 0, batch - 1 do
        orch:submit_next_level(batch_h, args{{A:view{offset = b * MT * KT * TT, shape = {MT * KT * TT}}, "in"},
                                             {B:view{offset = b * KT * NT * TT, shape = {KT * NT * TT}}, "in"},
                                             {C:view{offset = b * MT * NT * TT, shape = {MT * NT * TT}}, "inout"}},
                               pto.CallConfig())
      end
    end)
    -- reference
    local function at(R, Cn, b, r, c)   -- 1-based index of element (r, c) of matrix b in tiled storage
      return ((b * R + r // T) * Cn + c // T) * TT + (r % T) * T + (c % T) + 1
    end
    for b = 0, batch - 1 do
      for r = 0, MT * T - 1 do
        for c = 0, NT * T - 1 do
          local sum = 0.0
          for k = 0, KT * T - 1 do sum = sum + A[at(MT, KT, b, r, k)] * B[at(KT, NT, b, k, c)] end
          local got = C[at(MT, NT, b, r, c)]
          assert(math.abs(got - sum) <= 1e-4 * math.max(1, math.abs(sum)),
            ("C[%d][%d][%d] = %g, expected %g"):format(b, r, c, got, sum))
        end
      end
    end
    local s = w5:stats()
    assert.equal(batch, s.tasks_completed)
    assert.equal(batch * MT, s.children[1].tasks_completed)
    local l3_tasks = s.children[1].children[1].tasks_completed + s.children[1].children[2].tasks_completed
    assert.equal(2 * batch * MT * NT * KT, l3_tasks)
    local report = w5:stats_report()
    assert.truthy(report:find("== L4 worker 1 / L3 worker 2 ==", 1, true), report)
    w5:close()
  end)
end)

describe("submit_next_level_group", function()
  it("runs one member on each of two L3 children, and a consumer waits for both", function()
    local t = pto.tensor({2}, "f64")
    local out = pto.tensor({1}, "f64")
    local l3s, stamps = {}, {}
    for i = 1, 2 do
      l3s[i] = pto.Worker{level = 3, num_sub_workers = 1}
      stamps[i] = l3s[i]:register(function(a)
        local x = a:tensor(1)
        local t0 = pto.now()
        while pto.now() - t0 < 0.02 do end
        x[1] = pto.now()
      end, "stamp")
    end
    local after = l3s[1]:register(function(a) a:tensor(2)[1] = pto.now() end, "after")
    local w4 = pto.Worker{level = 4}
    -- handles belong to one Worker: each member picks its own L3's
    local member = w4:register(function(orch, a)
      local h = orch:worker() == l3s[1] and stamps[1] or stamps[2]
      orch:submit_sub(h, args{{a:tensor(1), "inout"}})
    end)
    local consumer = w4:register(function(orch, a) orch:submit_sub(after, args{{a:tensor(1), "in"}, {a:tensor(2), "out"}}) end)
    for i = 1, 2 do w4:add_worker(l3s[i]) end
    w4:init()
    w4:run(function(orch)
      local id = orch:submit_next_level_group(member, {args{{t:view{offset = 0, shape = {1}}, "inout"}},
                                                        args{{t:view{offset = 1, shape = {1}}, "inout"}}},
                                              pto.CallConfig(), {workers = {1, 2}})
      local c = orch:submit_next_level(consumer, args{{t, "in"}, {out, "out"}}, pto.CallConfig(), {worker = 1})
      assert.same({id}, orch:task(c).producers)
    end)
    assert.is_true(t[1] > 0 and t[2] > 0)
    assert.is_true(out[1] >= t[1] and out[1] >= t[2], "the consumer ran before a member finished")
    w4:close()
  end)
end)

describe("init of a tree", function()
  local WHY = "process-mode init failures (children of children must be processes)"
  H.process_only("raises naming the path when an L3 child's own chip fails to start; nothing is left", WHY, function()
    local before = live_descendants()
    local l3 = pto.Worker{level = 3, chips = 1, chip_runtime = "/nonexistent/libx.so", mode = "process"}
    local w4 = pto.Worker{level = 4, mode = "process"}
    w4:add_worker(l3)
    local msg = assert_error(function() w4:init() end, "Worker:init: L3 worker 1 (pid ")
    assert.truthy(msg:find("failed to start: its level%-3 Worker: chip 1 %(pid %d+%) failed to start"), msg)
    assert.truthy(msg:find("/nonexistent/libx.so", 1, true), msg)
    assert_no_new_processes(before, "after the failed init")
    assert_error(function() w4:init() end, "Worker:init: ", "init failed earlier")
    w4:close()
  end)

  H.process_only("raises in time when an L3 child's chip hangs, with one deadline for the tree", WHY, function()
    local lib = assert(os.getenv("PTO_HANG_LIB"), "PTO_HANG_LIB names the fixture library (spec/CMakeLists.txt)")
    local before = live_descendants()
    local l3 = pto.Worker{level = 3, chips = 1, chip_runtime = lib, mode = "process"}   -- its own timeout: 10 s
    local w4 = pto.Worker{level = 4, mode = "process", start_timeout_ms = 400}
    w4:add_worker(l3)
    local t0 = now()
    local msg = assert_error(function() w4:init() end, "Worker:init: L3 worker 1 (pid ")
    local dt = now() - t0
    assert.truthy(msg:find("chip 1 (pid ", 1, true), msg)   -- the cause, from below
    assert.truthy(msg:find("did not report ready", 1, true), msg)
    assert.is_true(dt < 0.4 + 0.2, ("init raised %.3f s after it began (deadline 0.4 s)"):format(dt))
    assert_no_new_processes(before, "after the timed-out init")
    w4:close()
  end)
end)

describe("close", function()
  it("leaves no process of the whole tree behind", function()
    local before = live_descendants()
    local l3a = pto.Worker{level = 3, chips = 1, num_sub_workers = 1}
    local l3b = pto.Worker{level = 3, chips = 1, num_sub_workers = 1}
    local w4 = pto.Worker{level = 4, num_sub_workers = 1}
    w4:add_worker(l3a)
    w4:add_worker(l3b)
    w4:init()
    local tree = live_descendants()
    if H.MODE == "process" then
      -- zygote + 3 children of the L4; per L3: zygote + 2 children
      assert.is_true(#tree - #before >= 10, ("only %d processes in the tree"):format(#tree - #before))
    end
    w4:close()
    assert_no_new_processes(before, "after close")
  end)
end)

describe("misuse", function()
  it("of add_worker is refused with a reason", function()
    local w3 = pto.Worker{level = 3}
    assert_error(function() w3:add_worker(pto.Worker{level = 3}) end, "Worker:add_worker: ", "level 4 or above")
    local w4 = pto.Worker{level = 4}
    assert_error(function() w4:add_worker({}) end, "Worker:add_worker: ", "expected a Worker")
    assert_error(function() w4:add_worker(w4) end, "Worker:add_worker: ", "its own child")
    assert_error(function() w4:add_worker(pto.Worker{level = 4}) end, "Worker:add_worker: ", "level-3 Workers")
    local ready = pto.Worker{level = 3, num_sub_workers = 1}
    ready:init()
    assert_error(function() w4:add_worker(ready) end, "Worker:add_worker: ", "already initialised")
    ready:close()
    assert_error(function() w4:add_worker(ready) end, "Worker:add_worker: ", "closed")
    local c = pto.Worker{level = 3}
    w4:add_worker(c)
    local other = pto.Worker{level = 4}
    assert_error(function() other:add_worker(c) end, "Worker:add_worker: ", "already a child of another")
    assert_error(function() w4:add_worker(c) end, "Worker:add_worker: ", "already a child of this")
    assert_error(function() c:run(function() end) end, "Worker:run: ", "child of a level-4 Worker")
    assert_error(function() c:init() end, "Worker:init: ", "child of a level-4 Worker")
    assert_error(function() c:close() end, "Worker:close: ", "closing that Worker closes it")
    local w5 = pto.Worker{level = 5}
    w5:add_worker(other)
    local l3 = pto.Worker{level = 3}
    w4:init()
    assert_error(function() w4:add_worker(l3) end, "Worker:add_worker: ", "before Worker:init")
    w4:close()
    assert.is_true(c.closed)   -- closed with its parent
    w5:close()
  end)

  it("of chips and kernels at level 4 is refused with a reason", function()
    assert_error(function() pto.Worker{level = 4, chips = 2} end, "pto.Worker: ", "add_worker")
    local w4 = pto.Worker{level = 4}
    assert_error(function() w4:register(pto.chip_kernel("vector_add")) end, "Worker:register: ", "no chips")
    w4:close()
  end)

  it("of submits at level 4 is refused with a reason, and the Worker still runs", function()
    local counter = pto.tensor({1}, "i64")
    local w4, count = counter_tree()
    w4:init()
    assert_error(function()
      w4:run(function(orch) orch:submit_next_level(count, args{{counter, "inout"}}, pto.CallConfig(), {worker = 2}) end)
    end, "orch:submit_next_level: ", "this Worker has 1 Worker children")
    w4:run(function(orch) orch:submit_next_level(count, args{{counter, "inout"}}, pto.CallConfig()) end)
    assert.equal(1, counter[1])
    w4:close()
  end)
end)
