-- hang_spec.lua: task deadlines ("nothing hangs"). A task still running at
-- its deadline (pto.Worker{task_timeout_ms = N}, or {timeout_ms = N} in a
-- submit's options) fails with "timed out after N ms"; in process mode its
-- child is SIGKILLed and replaced, its consumers are poisoned, and the next
-- run works. A stuck task is made by stopping its child (SIGSTOP), so
-- nothing here depends on how fast the box is: every time bound is a
-- generous upper one (a hang fails the test instead of hanging it), never a
-- tight one. Thread mode refuses deadlines: a thread cannot be stopped.
local pto = require "pto"
local H = require "helpers"

local now = pto.now
local BOUND = 5   -- seconds: "it returns", not "it is fast"

-- Written by subs in the child processes: tensors made before init are shared.
local RAN = pto.tensor({8}, "f64")

local function stop(pid) assert.is_true(os.execute("kill -STOP " .. pid) == true) end

-- A process-mode Worker with one chip and one sub (a "mark" sub writing RAN).
local function worker(opts)
  opts.mode, opts.chips, opts.num_sub_workers = "process", 1, 1
  local w = pto.Worker(opts)
  local k = H.kernels(w)
  k.mark = w:register(function(args) RAN[args:scalar(1)] = now() end, "mark")
  w:init()
  return w, k
end

-- Run fn on w and return its error; fails if the run succeeded or took longer than BOUND.
local function run_fails(w, fn)
  local t0 = now()
  local ok, err = pcall(w.run, w, fn)
  local took = now() - t0
  assert.is_false(ok, "the run did not raise")
  assert.are.equal("string", type(err))
  assert.is_true(took < BOUND, ("the run took %.1f s"):format(took))
  return err
end

-- The next run on w uses every child (the replaced one included) and works.
local function assert_next_run_works(w, k)
  local a = pto.tensor{4}
  RAN:fill(-1)
  w:run(function(orch)
    orch:submit_next_level(k.sleep_us, pto.args{scalars = {1000}})
    orch:submit_next_level(k.fill, pto.args{{a, "out"}, scalars = {3.0}})
    orch:submit_sub(k.mark, pto.args{{a, "in"}, scalars = {1}})
  end)
  assert.are.same({3, 3, 3, 3}, a:totable())
  assert.is_true(RAN[1] > 0, "the sub of the next run did not run")
end

describe("task deadlines", function()
  H.process_only("a stopped chip fails its task at task_timeout_ms, its consumers are poisoned, the next run works",
    "deadlines need process mode", function()
    local w, k = worker{task_timeout_ms = 200}
    local victim = w:child_pids().chips[1]
    stop(victim)
    RAN:fill(-1)
    local x, y = pto.tensor{4}, pto.tensor{4}
    y:fill(-1)
    local failed0 = w:stats().tasks_failed
    local err = run_fails(w, function(orch)
      orch:submit_next_level(k.sleep_us, pto.args{{x, "out"}, scalars = {1000}})
      orch:submit_next_level(k.copy, pto.args{x, {y, "out"}})
      orch:submit_sub(k.mark, pto.args{{x, "in"}, scalars = {1}})
    end)
    local want = ("Worker:run: task 0 (callable 'sleep_us' on chip 1) failed: chip 1 (pid %d) timed out after 200 ms")
      :format(victim)
    assert.truthy(err:find(want, 1, true), err)
    assert.are.same({-1, -1, -1, -1}, y:totable())
    assert.are.equal(-1, RAN[1], "a consumer of the timed-out task ran")
    assert.are.equal(failed0 + 3, w:stats().tasks_failed)
    assert.is_true(H.eventually(function() return not H.alive(victim) end, BOUND), "the stopped child was not killed")
    assert_next_run_works(w, k)
    assert.are_not.equal(victim, w:child_pids().chips[1])
    w:close()
  end)

  H.process_only("a submit's timeout_ms overrides the Worker's, for chips, subs and prepared submits",
    "deadlines need process mode", function()
    local w, k = worker{task_timeout_ms = 600000}
    local chip = w:child_pids().chips[1]
    stop(chip)
    local err = run_fails(w, function(orch)
      orch:submit_next_level(k.sleep_us, pto.args{scalars = {1000}}, nil, {worker = 1, timeout_ms = 100})
    end)
    assert.truthy(err:find(("chip 1 (pid %d) timed out after 100 ms"):format(chip), 1, true), err)
    assert_next_run_works(w, k)

    local sub = w:child_pids().subs[1]
    stop(sub)
    err = run_fails(w, function(orch) orch:submit_sub(k.mark, pto.args{scalars = {2}}, {timeout_ms = 150}) end)
    assert.truthy(err:find(("task 0 (callable 'mark' on sub 1) failed: sub 1 (pid %d) timed out after 150 ms")
      :format(sub), 1, true), err)
    assert_next_run_works(w, k)

    chip = w:child_pids().chips[1]
    stop(chip)
    err = run_fails(w, function(orch)
      local sl = orch:prepare_next_level(k.sleep_us, {}, nil, {timeout_ms = 120})
      sl(1000)
    end)
    assert.truthy(err:find(("chip 1 (pid %d) timed out after 120 ms"):format(chip), 1, true), err)
    assert_next_run_works(w, k)
    w:close()
  end)

  H.process_only("timeout_ms = 0 lifts the Worker's deadline for one task", "deadlines need process mode", function()
    local w, k = worker{task_timeout_ms = 50}
    -- 300 ms of sleep cannot end before a 50 ms deadline: only the lifted deadline lets it succeed
    w:run(function(orch) orch:submit_next_level(k.sleep_us, pto.args{scalars = {300000}}, nil, {timeout_ms = 0}) end)
    local err = run_fails(w, function(orch) orch:submit_next_level(k.sleep_us, pto.args{scalars = {300000}}) end)
    assert.truthy(err:find("timed out after 50 ms", 1, true), err)
    assert_next_run_works(w, k)
    w:close()
  end)

  H.process_only("fast tasks under a deadline succeed", "deadlines need process mode", function()
    local w, k = worker{task_timeout_ms = 10000}
    local pids = w:child_pids()
    for i = 1, 20 do
      local a = pto.tensor{4}
      RAN:fill(-1)
      w:run(function(orch)
        orch:submit_next_level(k.fill, pto.args{{a, "out"}, scalars = {i + 0.0}}, nil, {timeout_ms = 10000})
        orch:submit_sub(k.mark, pto.args{{a, "in"}, scalars = {1}})
      end)
      assert.are.same({i, i, i, i}, a:totable())
      assert.is_true(RAN[1] > 0)
    end
    assert.are.same(pids, w:child_pids())
    w:close()
  end)

  H.process_only("Worker:children shows how long a stuck task has run", "stopping a child needs process mode", function()
    local w, k = worker{}
    local victim = w:child_pids().chips[1]
    stop(victim)
    local seen
    w:run(function(orch)
      local id = orch:submit_next_level(k.sleep_us, pto.args{scalars = {1000}})
      H.wait_state(orch, id, {"running"}, BOUND)
      local t1 = now()
      while now() < t1 + 0.05 do os.execute("sleep 0.01") end
      seen = w:children()[1]
      seen.id = id
      os.execute("kill -CONT " .. victim)
    end)
    assert.are.equal(seen.id, seen.task)
    assert.are.equal("number", type(seen.running_ms))
    assert.is_true(seen.running_ms >= 50, "running_ms " .. seen.running_ms)
    assert.is_nil(w:children()[1].running_ms, "an idle child reports running_ms")
    w:close()
  end)

  H.process_only("a level-4 Worker's deadline kills a stuck Worker child, which is replaced",
    "deadlines need process mode", function()
    local w4 = pto.Worker{level = 4, mode = "process", task_timeout_ms = 300}
    local w3 = pto.Worker{level = 3, mode = "process", chips = 1}
    local sl = w3:register(pto.chip_kernel("sleep_us"))
    w4:add_worker(w3)
    local stuck = w4:register(function(orch) orch:submit_next_level(sl, pto.args{scalars = {60000000}}) end, "stuck")
    local quick = w4:register(function(orch) orch:submit_next_level(sl, pto.args{scalars = {1000}}) end, "quick")
    w4:init()
    local victim = w4:child_pids().workers[1]
    local err = run_fails(w4, function(orch) orch:submit_next_level(stuck, pto.args{}) end)
    assert.truthy(err:find(("L4 task 0 (callable 'stuck' on L3 worker 1) failed: L3 worker 1 (pid %d) timed out after 300 ms")
      :format(victim), 1, true), err)
    w4:run(function(orch) orch:submit_next_level(quick, pto.args{}) end)
    assert.are_not.equal(victim, w4:child_pids().workers[1])
    w4:close()
  end)

  H.thread_only("a deadline needs process mode", "process mode takes deadlines", function()
    H.assert_error(function() pto.Worker{mode = "thread", chips = 1, task_timeout_ms = 200} end,
      "pto.Worker: ", "task_timeout_ms needs process mode: a thread cannot be stopped")
    local w = pto.Worker{mode = "thread", chips = 1, task_timeout_ms = 0}
    local k = H.kernels(w)
    w:init()
    H.assert_error(function()
      w:run(function(orch) orch:submit_next_level(k.sleep_us, pto.args{scalars = {1}}, nil, {timeout_ms = 100}) end)
    end, "orch:submit_next_level: ", "timeout_ms needs process mode: a thread cannot be stopped")
    w:run(function(orch) orch:submit_next_level(k.sleep_us, pto.args{scalars = {1}}, nil, {timeout_ms = 0}) end)
    w:close()
  end)

  it("checks the timeout options", function()
    H.assert_error(function() pto.Worker{task_timeout_ms = -1} end, "pto.Worker: ", "task_timeout_ms")
    local w = pto.Worker{chips = 1, num_sub_workers = 1}
    local k = H.kernels(w)
    local nop = w:register(function() end, "nop")
    w:init()
    H.assert_error(function()
      w:run(function(orch) orch:submit_next_level(k.sleep_us, pto.args{scalars = {1}}, nil, {timeout_ms = -5}) end)
    end, "orch:submit_next_level: ", "timeout_ms")
    H.assert_error(function()
      w:run(function(orch) orch:submit_sub(nop, nil, {timeout_ms = "soon"}) end)
    end, "orch:submit_sub: ", "timeout_ms")
    w:close()
  end)
end)
