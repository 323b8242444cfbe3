-- profile_spec.lua: w:profile(), the run profile (docs/tracing.md). Every
-- run keeps its tasks' start and end; the profile's numbers are checked
-- against DAGs of spin kernels with known durations. The bounds are loose
-- on the side that load on a shared machine can move (a run only ever
-- gets longer), and exact where they cannot move (a spin kernel never ends
-- early, a chain's tasks are on the critical path).
local pto = require "pto"
local H = require "helpers"

local MS = 1000   -- spin_us takes microseconds

local function spin_worker(chips)
  local w = pto.Worker{chips = chips}
  local long = w:register(pto.chip_kernel("spin_us"), "long")
  local short = w:register(pto.chip_kernel("sleep_us"), "short")   -- one kernel has one name
  return w, long, short
end

local function spin(orch, h, tensor, tag, us)
  return orch:submit_next_level(h, pto.args{{tensor, tag}, scalars = {us}})
end

local function by_name(list, name)
  for _, x in ipairs(list) do if x.name == name then return x end end
end

describe("w:profile()", function()
  it("is nil before the first run ends, and takes no arguments", function()
    local w <close> = pto.Worker{chips = 1}
    w:init()
    assert.is_nil(w:profile())
    H.assert_error(function() w:profile(true) end, "Worker:profile: ", "takes no arguments")
  end)

  it("finds the chain of three 30 ms tasks as the critical path beside four 5 ms ones", function()
    local w <close>, long, short = spin_worker(2)
    local chain = {}
    w:run(function(orch)
      local a = pto.tensor{4}
      for i = 1, 3 do chain[i] = spin(orch, long, a, "inout", 30 * MS) end
      for _ = 1, 4 do spin(orch, short, pto.tensor{4}, "out", 5 * MS) end
    end)
    local p = w:profile()
    assert.equal(7, p.tasks)
    local cp = p.critical_path
    assert.equal(3, cp.count, tostring(p))
    assert.same({0, 1, 2}, cp.tasks, tostring(p))
    assert.is_true(cp.length_ms >= 90 and cp.length_ms <= p.makespan_ms, tostring(p))
    assert.is_true(cp.pct > 40 and cp.pct <= 100, tostring(p))

    local l, s = by_name(p.callables, "long"), by_name(p.callables, "short")
    assert.equal(3, l.count)
    assert.equal(4, s.count)
    assert.equal("chip", l.kind)
    assert.is_true(l.max_ms >= 30 and l.p50_ms >= 30 and l.mean_ms >= 30 and l.total_ms >= 90, tostring(p))
    assert.is_true(s.max_ms >= 5 and s.p50_ms >= 5 and s.p95_ms >= s.p50_ms and s.max_ms >= s.p95_ms, tostring(p))
    assert.equal(p.callables[1].name, "long")   -- the most time first

    assert.equal(2, #p.workers)
    local busy, tasks = 0, 0
    for _, x in ipairs(p.workers) do
      busy, tasks = busy + x.busy_ms, tasks + x.tasks
      assert.near(100, x.busy_pct + x.idle_pct, 1e-6)
    end
    assert.equal(7, tasks)
    assert.is_true(busy >= 110 and busy <= 2 * p.makespan_ms, tostring(p))
    assert.is_true(p.makespan_ms >= 90 and p.orchestration_ms <= p.makespan_ms, tostring(p))
  end)

  it("says execution-bound when every worker spins the whole run", function()
    local w <close>, long = spin_worker(2)
    w:run(function(orch)
      for _ = 1, 8 do spin(orch, long, pto.tensor{4}, "out", 15 * MS) end
    end)
    local p = w:profile()
    for _, x in ipairs(p.workers) do assert.is_true(x.tasks >= 1) end
    -- 120 ms of spinning over two workers: busy is at least 60 ms each on average.
    assert.is_true(p.busy_pct >= 50, tostring(p))
    if p.busy_pct >= 70 then assert.truthy(p.verdict:find("^execution%-bound"), tostring(p)) end
    assert.truthy(tostring(p):find("verdict: ", 1, true))
  end)

  it("says dependency-bound for a chain on two workers", function()
    local w <close>, long = spin_worker(2)
    w:run(function(orch)
      local a = pto.tensor{4}
      for _ = 1, 4 do spin(orch, long, a, "inout", 20 * MS) end
    end)
    local p = w:profile()
    assert.equal(4, p.critical_path.count)
    -- One of two workers idle the whole time: idle is at least half.
    assert.is_true(p.idle_pct >= 45, tostring(p))
    if p.critical_path.pct >= 60 then assert.truthy(p.verdict:find("^dependency%-bound"), tostring(p)) end
  end)

  it("says orchestration-bound when the orchestrator is slower than the tasks", function()
    local w <close> = pto.Worker{chips = 2}
    local noop = w:register(pto.chip_kernel("noop"))
    w:run(function(orch)
      for _ = 1, 10 do
        orch:submit_next_level(noop, pto.args{{pto.tensor{4}, "out"}})
        local t = pto.now() + 0.010
        while pto.now() < t do end
      end
    end)
    local p = w:profile()
    assert.equal(10, p.tasks)
    assert.is_true(p.orchestration_ms >= 100, tostring(p))
    assert.truthy(p.verdict:find("^orchestration%-bound: the workers were idle %d+%% of the run"), tostring(p))
    assert.truthy(p.verdict:find("docs/lua.md's fast form", 1, true))
  end)

  it("does not count the time the orchestration waited in orch:drain() as orchestration", function()
    local w <close>, long = spin_worker(1)
    w:run(function(orch)
      spin(orch, long, pto.tensor{4}, "out", 80 * MS)
      orch:drain()
    end)
    local p = w:profile()
    assert.is_true(p.waited_ms >= 60, tostring(p))
    assert.is_true(p.orchestration_ms < p.makespan_ms / 2, tostring(p))
  end)

  it("covers the last run only, and counts failures", function()
    local w <close> = pto.Worker{chips = 1}
    local fail = w:register(pto.chip_kernel("fail"), "bad")
    local noop = w:register(pto.chip_kernel("noop"), "ok")
    w:run(function(orch) for _ = 1, 5 do orch:submit_next_level(noop, pto.args{{pto.tensor{4}, "out"}}) end end)
    assert.equal(5, w:profile().tasks)
    assert.equal(1, w:profile().run)
    pcall(w.run, w, function(orch)
      orch:submit_next_level(noop, pto.args{{pto.tensor{4}, "out"}})
      local x = pto.tensor{4}
      orch:submit_next_level(fail, pto.args{{x, "out"}})
      orch:submit_next_level(noop, pto.args{{x, "in"}})   -- poisoned: never runs
    end)
    local p = w:profile()
    assert.equal(2, p.run)
    assert.equal(2, p.tasks)
    assert.same({{id = 2, name = "ok", scope = 0}}, p.not_run)   -- scope 0: the run's own
    assert.equal(1, by_name(p.callables, "bad").failed)
    assert.equal(0, by_name(p.callables, "ok").failed)
    local text = tostring(p)
    assert.truthy(text:find("^Profile of run 2 %(level 3, %a+ mode%): 2 tasks in [^\n]+\n  %(1 more did not run: a producer failed"), text)
    assert.truthy(text:find("\n  callable +count +total ms +mean ms +p50 ms +p95 ms +max ms\n"), text)
    assert.truthy(text:find("\n  worker +tasks +busy ms +busy +idle\n  chip 1 +2 "), text)
  end)

  it("profiles a Worker child as the level below (a PROCESS-mode child publishes its last run)", function()
      local l3 = pto.Worker{level = 3, chips = 1}
      local k = l3:register(pto.chip_kernel("spin_us"), "inner")
      local w4 <close> = pto.Worker{level = 4}
      local f = w4:register(function(orch) orch:submit_next_level(k, pto.args{{pto.tensor{4}, "out"}, scalars = {2 * MS}}) end,
        "outer")
      w4:add_worker(l3)
      w4:run(function(orch) orch:submit_next_level(f, pto.args{}, pto.CallConfig()) end)
      local p = w4:profile()
      assert.equal(1, p.tasks)
      assert.equal("worker", p.callables[1].kind)
      assert.equal(1, #p.levels)
      assert.equal(3, p.levels[1].level)
      assert.equal("inner", p.levels[1].callables[1].name)
      assert.is_true(p.levels[1].callables[1].max_ms >= 2)
      assert.truthy(tostring(p):find("\n  Profile of run 1 %(level 3"), tostring(p))
      -- The next L4 run's L3 run replaces it (the child publishes after each of its runs).
      w4:run(function(orch) orch:submit_next_level(f, pto.args{}, pto.CallConfig()) end)
      assert.equal(2, w4:profile().levels[1].run)
      assert.equal(H.MODE, w4:profile().levels[1].mode)
    end)

  for _, mode4 in ipairs{"process", "thread"} do
  it("profiles every level below: an L5 in process mode over an L4 in " .. mode4 .. " mode over an L3", function()
    local w5, w4 = pto.Worker{level = 5, mode = "process"}, pto.Worker{level = 4, mode = mode4}
    local l3 = pto.Worker{level = 3, chips = 1}
    local k = l3:register(pto.chip_kernel("spin_us"), "inner")
    w4:add_worker(l3)
    w5:add_worker(w4)
    local mid = w4:register(function(orch)
      for _ = 1, 2 do orch:submit_next_level(k, pto.args{{pto.tensor{4}, "out"}, scalars = {MS}}) end
    end, "mid")
    local top = w5:register(function(orch) orch:submit_next_level(mid, pto.args{}, pto.CallConfig()) end, "top")
    for run = 1, 2 do
      w5:run(function(orch) orch:submit_next_level(top, pto.args{}, pto.CallConfig()) end)
      local p = w5:profile()
      assert.equal(1, p.tasks)
      local p4 = p.levels[1]
      assert.is_table(p4, "no level 4 profile")
      assert.equal(4, p4.level)
      assert.equal(mode4, p4.mode)
      assert.equal(run, p4.run)
      assert.equal("mid", p4.callables[1].name)
      local p3 = p4.levels[1]   -- the L4's own child: published by the L4's process with its own
      assert.is_table(p3, "no level 3 profile below the level 4 one")
      assert.equal(3, p3.level)
      assert.equal(run, p3.run)
      assert.equal(2, p3.tasks)
      assert.equal("inner", p3.callables[1].name)
      assert.is_true(p3.callables[1].max_ms >= 1)
      local text = tostring(p)
      assert.truthy(text:find("\n  Profile of run %d+ %(level 4, " .. mode4 .. " mode%): 1 task in .-\n    Profile of run "
        .. run .. " %(level 3, %a+ mode%): 2 tasks in "), text)
    end
    -- the run report has the lanes of every level
    local path = os.tmpname()
    w5:report(path)
    local f = assert(io.open(path))
    local html = f:read("a")
    f:close()
    os.remove(path)
    assert.truthy(html:find('"name":"Worker 1 / Worker 1 / chip 1"', 1, true))
    w5:close()
  end)
  end

  it("w:report(path) checks its path and needs an ended run", function()
    local w <close> = pto.Worker{chips = 1}
    w:init()
    H.assert_error(function() w:report("/tmp/x.html") end, "Worker:report: ", "no run has ended on this Worker yet")
    w:run(function(orch) orch:submit_next_level(w:register(pto.chip_kernel("noop")), pto.args{}) end)
    H.assert_error(function() w:report() end, "Worker:report: ", "expected the path of the HTML file to write")
    H.assert_error(function() w:report("a.html", 1) end, "Worker:report: ", "takes one argument")
    H.assert_error(function() w:report("/nonexistent-dir/r.html") end, "Worker:report: ",
      "cannot write '/nonexistent-dir/r.html'")
    local path = os.tmpname()
    w:report(path)
    local f = assert(io.open(path))
    local html = f:read("a")
    f:close()
    os.remove(path)
    assert.truthy(html:find("^<!DOCTYPE html>"))
    assert.truthy(html:find('"tasks":1', 1, true))
  end)
end)

describe("ptolua --profile and the prompt's :profile", function()
  local PTOLUA = assert(os.getenv("PTOLUA"), "set PTOLUA to the ptolua binary")
  local F = require "files"
  teardown(F.cleanup)

  it("--profile prints each Worker's last run to stderr at exit, and says so when none ran", function()
    local script = F.writefile(F.tmpname(".lua"), [[
      local w = pto.Worker{chips = 2}
      local h = w:register(pto.chip_kernel("noop"), "tiny")
      for _ = 1, 2 do w:run(function(orch) for _ = 1, 5 do orch:submit_next_level(h, pto.args{}) end end) end
      io.write("script done\n")
    ]])
    local p = assert(io.popen(("%s --profile %s 2>&1"):format(F.q(PTOLUA), F.q(script))))
    local out = p:read("a")
    assert.is_true(p:close())
    assert.truthy(out:find("script done\nptolua --profile: Worker 1: Worker(level 3, ", 1, true), out)
    assert.truthy(out:find("), run 2\nProfile of run 2 (level 3, ", 1, true), out)
    assert.truthy(out:find("\n  tiny +5 ", 1), out)
    p = assert(io.popen(("%s --profile -e 'x = 1' 2>&1"):format(F.q(PTOLUA))))
    out = p:read("a")
    assert.is_true(p:close())
    assert.equal("ptolua --profile: no Worker ended a run\n", out)
    p = assert(io.popen(("%s --report /nonexistent-dir/r.html -e 'x = 1' 2>&1"):format(F.q(PTOLUA))))
    out = p:read("a")
    assert.is_nil(p:close())
    assert.truthy(out:find("--report: cannot write '/nonexistent-dir/r.html' (No such file or directory); pass a path in "
      .. "a writable directory", 1, true), out)
  end)

  it("--dot labels each task with its worker and duration, a condensed group with its mean", function()
    local script = F.writefile(F.tmpname(".lua"), [[
      local w <close> = pto.Worker{chips = 2}
      local h = w:register(pto.chip_kernel("spin_us"), "spin")
      w:run(function(orch) orch:submit_next_level(h, pto.args{{pto.tensor{4}, "out"}, scalars = {1}}) end)
      w:run(function(orch)
        for _ = 1, 3 do orch:submit_next_level(h, pto.args{{pto.tensor{4}, "out"}, scalars = {3000}}) end
      end)
      local w2 <close> = pto.Worker{chips = 1}
      local n = w2:register(pto.chip_kernel("noop"), "many")
      w2:run(function(orch) for _ = 1, 600 do orch:submit_next_level(n, pto.args{}) end end)
    ]])
    local dot = F.tmpname(".dot")
    assert.is_true(os.execute(("%s --dot %s %s"):format(F.q(PTOLUA), F.q(dot), F.q(script))))
    local text = F.readfile(dot)
    local n = 0
    for ms in text:gmatch("spin %(next_level%)\\ncompleted\\non chip %d, ([%d.e+-]+) ms") do
      n = n + 1
      assert.is_true(tonumber(ms) >= 3, text)   -- the second run's tasks, not the first's 1 us one
    end
    assert.equal(3, n, text)
    assert.truthy(text:find("x600 completed\\ntask 0 ... task 599\\non chip 1\\nmean [%d.e+-]+ ms"), text)
  end)

  it(":profile prints the profile in the prompt; :report FILE writes the report", function()
    local PTYDRIVE = assert(os.getenv("PTYDRIVE"), "set PTYDRIVE to the ptydrive fixture")
    local html = F.tmpname("_only_report_file.html")
    F.writefile(html, "")
    local stem = html:sub(1, -#"_file.html" - 1)
    local steps = table.concat({
      "line > ",
      "send w = pto.Worker{chips = 1}\\n", "line > ",
      "send :profile\\n", "expect has not ended a run yet", "line > ",
      "send w:run(function(o) o:submit_next_level(w:register(pto.chip_kernel('noop'), 'nop'), pto.args{}) end)\\n",
      "line > ",
      "send :profile\\n", "expect critical path: ", "line > ",
      "send :report " .. stem .. "\\t\\n", "expect wrote " .. html, "line > ",   -- TAB completes the file name
      "send \4", "wait" }, "\n") .. "\n"
    local script = F.writefile(F.tmpname(), steps)
    local p = assert(io.popen(("env TERM=xterm PTOLUA_HISTORY=%s %s %s %s 2>&1"):format(F.q(F.tmpname()),
      F.q(PTYDRIVE), F.q(script), F.q(PTOLUA))))
    local out = p:read("a")
    p:close()
    assert.truthy(out:find("EXIT 0\n", 1, true), out)
    assert.truthy(out:find("Profile of run 1 (level 3, ", 1, true), out)
    assert.truthy(out:find("\n  nop +1 ", 1), out)
    assert.truthy(F.readfile(html):find("^<!DOCTYPE html>"))
  end)
end)
