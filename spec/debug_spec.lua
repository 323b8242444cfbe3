-- debug_spec.lua: what the prompt's engine commands are built on, called
-- from Lua (docs/repl.md): runs that stay open (Worker:open_run /
-- close_run), dispatch control (hold, step, release, breakpoints) and
-- inspection (task tensors and workers, the TensorMap, children).
-- Runs in both modes (spec/CMakeLists.txt).
local pto = require "pto"
local H = require "helpers"

local function worker(extra)
  local cfg = {chips = 2, num_sub_workers = 1}
  for k, v in pairs(extra or {}) do cfg[k] = v end
  return pto.Worker(cfg)
end

local function states(orch, ids)
  local s = {}
  for i, id in ipairs(ids) do s[i] = orch:task(id).state end
  return table.concat(s, " ")
end

describe("interactive runs", function()
  it("keep the orchestrator usable until close_run, which drains and returns true", function()
    local w <close> = worker()
    local k = H.kernels(w)
    local a, b, c = pto.tensor({8}, "f32"), pto.tensor({8}, "f32"), pto.tensor({8}, "f32")
    for i = 1, 8 do a[i] = i; b[i] = 10 * i end
    local args = pto.args{{a, "in"}, {b, "in"}, {c, "out"}}
    local orch, got_args, got_cfg = w:open_run(args, "cfg")
    assert.equal(args, got_args)
    assert.equal("cfg", got_cfg)
    assert.equal(orch, w:orch())
    local id = orch:submit_next_level(k.vector_add, args)
    assert.equal(0, id)
    assert.is_true(w:close_run())
    for i = 1, 8 do assert.equal(11 * i, c[i]) end
    assert.is_nil(w:orch())
    H.assert_error(function() orch:task_count() end, "orch:task_count: ", "valid only while its run lasts")
    assert.is_true(H.check_vector_add(w, k.vector_add))   -- an ordinary run afterwards
  end)

  it("report the run's first failure from close_run, and the Worker stays usable", function()
    local w <close> = worker()
    local k = H.kernels(w)
    local boom = w:register(function() error("root cause 7") end, "boom")
    local orch = w:open_run()
    local t = pto.tensor({4}, "f32")
    orch:submit_next_level(k.fill, pto.args{{t, "out"}, scalars = {1.0}})
    local bad = orch:submit_sub(boom, pto.args{{t, "inout"}})
    local msg = H.assert_error(function() w:close_run() end, "Worker:close_run: ",
      ("task %d (callable 'boom' on sub 1) failed"):format(bad))
    assert.truthy(msg:find("root cause 7", 1, true))
    assert.is_true(H.check_vector_add(w, k.vector_add))
    orch = w:open_run()
    assert.equal(0, orch:task_count())
    assert.is_true(w:close_run())
  end)

  it("refuse misuse with a reason", function()
    local w <close> = worker()
    H.assert_error(function() w:close_run() end, "Worker:close_run: ", "no run opened by Worker:open_run")
    w:open_run()
    H.assert_error(function() w:open_run() end, "Worker:open_run: ", "already open")
    H.assert_error(function() w:run(function() end) end, "Worker:run: ", "Worker:close_run")
    H.assert_error(function() w:step(1) end, "Worker:step: ", "not held")
    w:hold()
    H.assert_error(function() w:step(0) end, "Worker:step: ", "at least 1")
    H.assert_error(function() w:set_break("gemm") end, "Worker:set_break: ", "handle returned by Worker:register")
    local other <close> = worker()
    local h = other:register(function() end)
    H.assert_error(function() w:set_break(h) end, "Worker:set_break: ", "another Worker")
    w:release()
    assert.is_true(w:close_run())
    local fresh <close> = worker()
    H.assert_error(function() fresh:step() end, "Worker:step: ", "not initialised")
  end)

  it("are dropped when the Worker is closed, leaving the orchestrator stale", function()
    local w = worker()
    local k = H.kernels(w)
    local orch = w:open_run()
    w:hold()
    orch:submit_next_level(k.fill, pto.args{{pto.tensor({4}, "f32"), "out"}, scalars = {2.0}})
    w:close()
    H.assert_error(function() orch:task(0) end, "orch:task: ", "valid only while its run lasts")
    local found = false
    for _, x in ipairs(pto.workers()) do found = found or x == w end
    assert.is_false(found)
  end)
end)

describe("dispatch control", function()
  it("holds ready tasks, steps them one by one in order, and releases the rest", function()
    local w <close> = worker()
    local k = H.kernels(w)
    local x, y, z, u = pto.tensor({4}, "f32"), pto.tensor({4}, "f32"), pto.tensor({4}, "f32"), pto.tensor({4}, "f32")
    w:hold()
    assert.is_true(w:dispatch().held)
    local orch = w:open_run()
    local t0 = orch:submit_next_level(k.fill, pto.args{{x, "out"}, scalars = {1.0}})
    local t1 = orch:submit_next_level(k.vector_scale, pto.args{{x, "in"}, {y, "out"}, scalars = {2.0}})
    local t2 = orch:submit_next_level(k.vector_scale, pto.args{{y, "in"}, {z, "out"}, scalars = {3.0}})
    local t3 = orch:submit_next_level(k.fill, pto.args{{u, "out"}, scalars = {7.0}})
    local ids = {t0, t1, t2, t3}
    assert.is_true(w:wait())
    assert.equal("ready pending pending ready", states(orch, ids))
    assert.equal(0, x[1])

    assert.is_true(w:step())
    assert.equal("completed ready pending ready", states(orch, ids))
    assert.equal(1, x[1])
    assert.equal(0, y[1])
    assert.equal(0, u[1])

    assert.is_true(w:step(2))   -- the two ready tasks, not the one they make ready
    assert.equal("completed completed ready completed", states(orch, ids))
    assert.equal(2, y[1])
    assert.equal(0, z[1])
    local d = w:dispatch()
    assert.is_true(d.held)
    assert.equal(0, d.running)

    assert.is_true(w:step(10))   -- more than is left: runs the rest, then the budget is dropped
    assert.equal(6, z[1])
    assert.equal(0, w:dispatch().step_left)
    local later = pto.tensor({4}, "f32")
    local t4 = orch:submit_next_level(k.fill, pto.args{{later, "out"}, scalars = {5.0}})
    assert.is_true(w:wait())
    assert.equal("ready", orch:task(t4).state)

    w:release()
    assert.is_true(w:wait())
    assert.equal("completed", orch:task(t4).state)
    assert.equal(5, later[1])
    assert.is_true(w:close_run())
  end)

  it("steps Lua sub callables too (the interpreter lock is given up while waiting)", function()
    local w <close> = worker()
    local out = pto.tensor({1}, "i32")
    local put = w:register(function(args) args:tensor(1)[1] = 42 end, "put")
    w:hold()
    local orch = w:open_run()
    local id = orch:submit_sub(put, pto.args{{out, "out"}})
    assert.is_true(w:wait())
    assert.equal(0, out[1])
    assert.is_true(w:step())
    assert.equal("completed", orch:task(id).state)
    assert.equal("sub 1", orch:task(id).worker_name)
    assert.equal(42, out[1])
    assert.is_true(w:close_run())
  end)

  it("stops before a breakpoint's callable once, until a step or release", function()
    local w <close> = worker()
    local k = H.kernels(w)
    local x, y = pto.tensor({4}, "f32"), pto.tensor({4}, "f32")
    w:set_break(k.vector_scale)
    assert.equal(1, w:dispatch().breakpoints)
    assert.same({"vector_scale"}, w:dispatch().breaks)
    local orch = w:open_run()
    local t0 = orch:submit_next_level(k.fill, pto.args{{x, "out"}, scalars = {1.0}})
    local t1 = orch:submit_next_level(k.vector_scale, pto.args{{x, "in"}, {y, "out"}, scalars = {4.0}})
    assert.is_true(w:wait())
    assert.equal("completed ready", states(orch, {t0, t1}))
    local d = w:dispatch()
    assert.is_true(d.held)
    assert.equal(t1, d.break_task)
    w:release()
    assert.is_true(w:wait())
    assert.equal("completed", orch:task(t1).state)
    assert.equal(4, y[1])
    local t2 = orch:submit_next_level(k.vector_scale, pto.args{{y, "in"}, {x, "out"}, scalars = {0.5}})
    assert.is_true(w:wait())
    assert.equal("ready", orch:task(t2).state)   -- the same callable stops again
    w:clear_break(k.vector_scale)
    assert.equal(0, w:dispatch().breakpoints)
    assert.is_true(w:step())
    assert.equal(2, x[1])
    w:release()
    assert.is_true(w:close_run())
  end)

  it("never hangs a drain: orch:drain and close_run run held tasks, and the hold stays", function()
    local w <close> = worker()
    local k = H.kernels(w)
    local x = pto.tensor({4}, "f32")
    w:hold()
    local orch = w:open_run()
    local id = orch:submit_next_level(k.fill, pto.args{{x, "out"}, scalars = {3.0}})
    orch:drain()
    assert.equal("completed", orch:task(id).state)
    assert.is_true(w:dispatch().held)
    orch:submit_next_level(k.fill, pto.args{{x, "out"}, scalars = {4.0}})
    assert.is_true(w:close_run())
    assert.equal(4, x[1])
    -- a whole Worker:run while held: its end drains it
    w:run(function(o) o:submit_next_level(k.fill, pto.args{{x, "out"}, scalars = {5.0}}) end)
    assert.equal(5, x[1])
    w:release()
  end)

  it("fails a submit at once when only held tasks could free its ring space", function()
    local w <close> = worker{heap_ring_size = 64 * 1024}
    local k = H.kernels(w)
    w:hold()
    local orch = w:open_run()
    local t0 = H.clock()
    local msg = H.assert_error(function()
      for _ = 1, 3 do
        orch:scope(function()
          orch:submit_next_level(k.fill, pto.args{{pto.tensor_spec({10 * 1024}, "f32"), "out"}, scalars = {1.0}})
        end)
      end
    end, "orch:submit_next_level: ", "dispatch is held")
    assert.truthy(msg:find(":step or :release", 1, true))
    assert.is_true(H.clock() - t0 < 5)   -- not after alloc_timeout_ms (10 s)
    w:release()
    assert.is_true(w:close_run())
  end)
end)

describe("inspection", function()
  it("shows each task's tensors with their tags, its worker, and the TensorMap's writers", function()
    local w <close> = worker()
    local k = H.kernels(w)
    local a, b = pto.tensor({4, 2}, "f32"), pto.tensor({8}, "f32")
    w:hold()
    local orch = w:open_run()
    local p = orch:submit_next_level(k.fill, pto.args{{a, "out"}, scalars = {1.0}})
    local q = orch:submit_next_level(k.vector_add, pto.args{{a, "in"}, {b, "inout"}, {b, "no_dep"}})
    local s = orch:scope_begin()
    assert.equal(1, s)
    local r = orch:submit_next_level(k.fill, pto.args{{pto.tensor_spec({16}, "f32"), "out"}, scalars = {0.0}})
    local t = orch:task(q)
    assert.equal(3, #t.tensors)
    assert.same({"in", "inout", "no_dep"}, {t.tensors[1].tag, t.tensors[2].tag, t.tensors[3].tag})
    assert.same({4, 2}, t.tensors[1].shape)
    assert.equal("f32", t.tensors[1].dtype)
    assert.equal(32, t.tensors[1].nbytes)
    assert.is_nil(t.tensors[1].ring)
    assert.is_nil(t.worker)
    local rt = orch:task(r)
    assert.equal(1, rt.tensors[1].ring)
    assert.equal(0, rt.tensors[1].ring_offset)
    local writers = {}
    for _, e in ipairs(orch:tensormap()) do writers[#writers + 1] = e.producer end
    assert.same({p, q, r}, H.sorted(writers))
    orch:scope_end()
    w:release()
    assert.is_true(w:wait())
    t = orch:task(p)
    assert.truthy(t.worker_name == "chip 1" or t.worker_name == "chip 2")
    assert.equal(tonumber(t.worker_name:match("%d+")), t.worker)
    assert.is_true(w:close_run())
    H.assert_error(function() orch:tensormap() end, "orch:tensormap: ", "valid only while its run lasts")
  end)

  it("lists the children with their pids and the tasks they ran", function()
    local w <close> = worker()
    local k = H.kernels(w)
    assert.same({}, w:children())
    w:run(function(orch)
      orch:submit_next_level(k.fill, pto.args{{pto.tensor({4}, "f32"), "out"}, scalars = {1.0}}, nil, {worker = 2})
    end)
    local kids = w:children()
    assert.equal(3, #kids)
    assert.same({"chip 1", "chip 2", "sub 1"}, {kids[1].name, kids[2].name, kids[3].name})
    assert.same({0, 1, 0}, {kids[1].tasks_run, kids[2].tasks_run, kids[3].tasks_run})
    for _, c in ipairs(kids) do
      assert.is_nil(c.task)
      if H.MODE == "process" then
        assert.is_true(H.alive(c.pid))
      else
        assert.is_nil(c.pid)
      end
    end
  end)

  it("names the live top-level Workers, oldest first", function()
    local a <close> = worker()
    local b <close> = worker()
    local ws = pto.workers()
    local ia, ib
    for i, x in ipairs(ws) do
      if x == a then ia = i end
      if x == b then ib = i end
    end
    assert.truthy(ia and ib and ia < ib)
    b:close()
    for _, x in ipairs(pto.workers()) do assert.not_equal(b, x) end
  end)
end)
