-- runs_spec.lua: run handles (docs/lua.md, "Run handles"): Worker:submit,
-- h:wait/done/status/cancel, Worker:wait_all, pto.wait_any, to-be-closed
-- handles, close with runs outstanding, and the ordering of tasks across
-- runs in flight. Runs in both modes ($PTO_MODE decides).
--
-- Cross-run dependencies are observed exactly through orch:task(id).producers,
-- recorded at submit: a later run's task that must wait for an earlier run's
-- writer lists it, provided that writer is still running then, which the
-- tests make sure of (helpers.wait_state) rather than assume.
local pto = require "pto"
local H = require "helpers"

local W, K           -- the shared Worker (2 chips, 1 sub worker) and its kernels
local SUBMITTER      -- a sub that tries to submit a run of W from inside a task

-- A sub reaches W through a global: in process mode it runs in a forked copy
-- made at init, which has this global but is not the Worker's process.
setup(function()
  W = pto.Worker{chips = 2, num_sub_workers = 1}
  K = H.kernels(W)
  RUNS_SPEC_W = W
  SUBMITTER = W:register(function() RUNS_SPEC_W:submit(function() end) end, "submitter")
  W:init()
end)

teardown(function()
  if W then W:close() end
  RUNS_SPEC_W = nil
end)

local function ones(n)
  local t = pto.tensor({n}, "f32")
  t:fill(1)
  return t
end

local function sleep(orch, us, ...)
  local a = pto.args{...}
  a:add_scalar(us)
  return orch:submit_next_level(K.sleep_us, a)
end

-- fill t with v: the kernel reads its value as a double's bits.
local function fill(orch, t, v, k)
  local a = pto.args{{t, "out"}}
  a:add_scalar(v + 0.0)
  return orch:submit_next_level(k or K.fill, a)
end

local function producers(orch, id) return H.sorted(orch:task(id).producers) end

describe("Worker:submit and the run handle", function()
  it("returns a handle at once; wait returns what the function returned", function()
    local t = pto.tensor({16}, "f32")
    local h = W:submit(function(orch, args, cfg)
      fill(orch, t, 3.0)
      return args.x, nil, cfg, {k = "v"}
    end, {x = 7}, "cfg")
    local a, b, c, d = h:wait()
    assert.are.equal(7, a)
    assert.is_nil(b)
    assert.are.equal("cfg", c)
    assert.are.same({k = "v"}, d)
    assert.are.equal(3, t[16])
    assert.is_true(h:done())
    local state, counts = h:status()
    assert.are.equal("ok", state)
    assert.are.equal(1, counts.submitted)
    assert.are.equal(1, counts.completed)
    assert.are.equal(0, counts.failed)
    assert.are.equal(h.id, counts.id)
    -- waiting again gives the same results
    assert.are.equal(7, (h:wait()))
  end)

  it("does not wait for the drain: the handle is running while its task is", function()
    local h = W:submit(function(orch) sleep(orch, 300000) end)
    assert.is_false(h:done())
    assert.are.equal("running", (h:status()))
    h:wait()
    assert.is_true(h:done())
  end)

  it("Worker:run still works, and joins outstanding runs as submit():wait()", function()
    local t = pto.tensor({16}, "f32")
    local one = ones(16)
    local h = W:submit(function(orch)
      local id = sleep(orch, 100000, {t, "inout"})
      orch:submit_next_level(K.tile_add, pto.args{{t, "inout"}, one})
      return id
    end)
    local r = W:run(function(orch)
      orch:submit_next_level(K.tile_add, pto.args{{t, "inout"}, one})
      return "ran"
    end)
    assert.are.equal("ran", r)
    assert.are.equal(2, t[1])
    h:wait()
    assert.are.equal("ok", (W:run(function() return "ok" end)))
  end)

  it("a chain of INOUT steps over 100 submitted runs gives the sequential result", function()
    local t = pto.tensor({64}, "f32")
    local one = ones(64)
    local hs = {}
    for step = 1, 100 do
      hs[step] = W:submit(function(orch)
        orch:submit_next_level(K.tile_add, pto.args{{t, "inout"}, one})
        return step
      end)
    end
    W:wait_all()
    for i = 1, 64 do assert.are.equal(100, t[i]) end
    for step = 1, 100 do
      assert.is_true(hs[step]:done())
      assert.are.equal(step, (hs[step]:wait()))
    end
  end)

  it("orders a later run's reader after an earlier run's writer (RAW across runs)", function()
    local t, u = pto.tensor({16}, "f32"), pto.tensor({16}, "f32")
    local writer
    -- The writer is tagged INOUT so that it waits for the sleep: an OUTPUT
    -- writer does not wait for earlier writers (next test), and a fill free to
    -- run on the other chip may finish before run 2 submits its reader, which
    -- then rightly lists no producer (seen once in CI, thread mode).
    local h1 = W:submit(function(orch)
      local s = sleep(orch, 200000, {t, "out"})
      H.wait_state(orch, s, {"running"})
      local a = pto.args{{t, "inout"}}
      a:add_scalar(5.0)
      writer = orch:submit_next_level(K.fill, a)
      assert.are.same({s}, producers(orch, writer))
    end)
    local got
    local h2 = W:submit(function(orch)
      local c = orch:submit_next_level(K.copy, pto.args{t, {u, "out"}})
      got = producers(orch, c)
    end)
    h2:wait()
    h1:wait()
    assert.are.same({writer}, got)
    assert.are.equal(5, u[16])
  end)

  it("WAR and WAW across runs are as within a run: a writer does not wait for readers or earlier writers", function()
    local t = pto.tensor({16}, "f32")
    local h1 = W:submit(function(orch)
      local s = sleep(orch, 200000, {t, "out"})
      H.wait_state(orch, s, {"running"})
      sleep(orch, 1000, t)
    end)
    -- The two writers are sleeps tagged "out", not fills: with no edge
    -- between them they run at once, and two fills of one buffer would be
    -- a real data race (TSan reports it) that the test itself created.
    local war, waw
    local h2 = W:submit(function(orch)
      waw = producers(orch, sleep(orch, 1000, {t, "out"}))
      war = producers(orch, sleep(orch, 1000, {t, "out"}))
    end)
    W:wait_all()
    assert.are.same({}, war)
    assert.are.same({}, waw)
    assert.are.equal("ok", (h1:status()))
    assert.are.equal("ok", (h2:status()))
  end)

  it("independent runs overlap: a later run finishes while an earlier one still runs", function()
    local a, b = pto.tensor({16}, "f32"), pto.tensor({16}, "f32")
    local slow = W:submit(function(orch) sleep(orch, 600000, {a, "inout"}) end)
    local fast = W:submit(function(orch) fill(orch, b, 1.0) end)
    local first, i = pto.wait_any{slow, fast}
    assert.are.equal(fast, first)
    assert.are.equal(2, i)
    assert.is_false(slow:done())
    slow:wait()
  end)
end)

describe("runs in a trace", function()
  it("every task span names its submitted run, and independent runs' spans interleave", function()
    local json = require "dkjson"
    local F = require "files"
    local path = F.tmpname(".json")
    local a, b = pto.tensor({16}, "f32"), pto.tensor({16}, "f32")
    W:trace_start(path)
    local slow = W:submit(function(orch) sleep(orch, 300000, {a, "inout"}) end)
    local fast = W:submit(function(orch) fill(orch, b, 1) end)
    W:wait_all()
    W:trace_stop()
    local doc = assert(json.decode(assert(F.readfile(path))))
    F.cleanup()
    local spans = {}
    for _, e in ipairs(doc.traceEvents) do
      if e.cat == "task" then
        assert.is_number(e.args.submitted_run, "a task span without its submitted run")
        spans[e.args.submitted_run] = e
      end
    end
    local s, f = assert(spans[slow.id], "no span of the slow run"), assert(spans[fast.id], "no span of the fast run")
    assert.is_true(f.ts + f.dur < s.ts + s.dur,
      ("the later, independent run's task did not end before the earlier run's task: %s vs %s"):format(
        json.encode(f), json.encode(s)))
  end)
end)

describe("failures and cancellation across runs", function()
  it("run 3 of 10 fails: only the run that depends on it fails, naming its task", function()
    local bad = pto.tensor({16}, "f32")
    local own = {}
    for i = 1, 10 do own[i] = pto.tensor({16}, "f32") end
    local failing
    local hs = {}
    -- Held, so run 3's failure is still in the session when run 6 submits (once every earlier run has
    -- finished, the session resets and no producer is left to wait for: docs/lua.md).
    W:hold()
    for i = 1, 10 do
      hs[i] = W:submit(function(orch)
        if i == 3 then
          failing = orch:submit_next_level(K.fail, pto.args{{bad, "out"}})
        elseif i == 6 then
          orch:submit_next_level(K.copy, pto.args{bad, {own[i], "out"}})
        else
          fill(orch, own[i], i)
        end
      end)
    end
    W:release()
    for i = 1, 10 do
      if i == 3 then
        H.assert_error(function() hs[i]:wait() end, "Run:wait: ", "fail kernel called")
        assert.are.equal("failed", (hs[i]:status()))
      elseif i == 6 then
        H.assert_error(function() hs[i]:wait() end, "Run:wait: ",
                       ("producer task %d of run %d failed"):format(failing, hs[3].id))
        assert.are.equal("failed", (hs[i]:status()))
      else
        hs[i]:wait()
        assert.are.equal(i, own[i][1])
      end
    end
    W:wait_all()   -- every failure was observed by a wait: nothing left to raise
    H.check_vector_add(W, K.vector_add)
  end)

  it("wait_all raises the first failure nobody waited for, naming its run; the Worker is usable after", function()
    local h1 = W:submit(function() end)
    local h2 = W:submit(function(orch) orch:submit_next_level(K.fail, pto.args{{pto.tensor{4}, "out"}}) end)
    local msg = H.assert_error(function() W:wait_all() end, "Worker:wait_all: ", "run " .. h2.id .. ": ")
    assert.truthy(msg:find("fail kernel called", 1, true))
    assert.are.equal("ok", (h1:status()))
    W:wait_all()   -- reported once
    H.check_vector_add(W, K.vector_add)
  end)

  it("cancel stops a long run's dispatch while other runs go on; its dependants fail as cancelled", function()
    local t, other = pto.tensor({16}, "f32"), pto.tensor({16}, "f32")
    local long = W:submit(function(orch)
      for _ = 1, 20 do sleep(orch, 50000, {t, "inout"}) end
    end)
    local queued = W:submit(function(orch) fill(orch, other, 4.0) end)
    local dependant = W:submit(function(orch) orch:submit_next_level(K.copy, pto.args{t, {other, "out"}}) end)
    assert.is_true(long:cancel())
    H.assert_error(function() long:wait() end, "Run:wait: ", "cancelled")
    local state, counts = long:status()
    assert.are.equal("cancelled", state)
    assert.is_true(counts.failed >= 1 and counts.completed < 20)
    queued:wait()
    H.assert_error(function() dependant:wait() end, "Run:wait: ", "cancelled")
    assert.is_false(long:cancel())   -- a finished run: nothing to cancel
    H.check_vector_add(W, K.vector_add)
  end)

  it("w:children() counts only the tasks a chip ran, not the cancelled ones", function()
    local function chips_ran()
      local n = 0
      for _, c in ipairs(W:children()) do if c.kind == "chip" then n = n + c.tasks_run end end
      return n
    end
    local before = chips_ran()
    local h = W:submit(function(orch) for _ = 1, 20 do sleep(orch, 20000) end end)
    assert.is_true(h:cancel())
    pcall(h.wait, h)
    local _, counts = h:status()
    assert.is_true(counts.completed < 20)
    assert.are.equal(counts.completed, chips_ran() - before)
  end)

  it("cancel also stops the tasks handed to a busy worker but not begun", function()
    -- 20 independent sleeps: each chip begins one and has more staged
    -- behind it (in process mode in its mailbox's cells). Only the two
    -- begun before the cancel may run.
    local h = W:submit(function(orch) for _ = 1, 20 do sleep(orch, 100000) end end)
    assert.is_true(H.eventually(function()
      local busy = 0
      for _, c in ipairs(W:children()) do if c.kind == "chip" and c.task then busy = busy + 1 end end
      return busy == 2
    end, 5), "the chips did not both begin a task")
    assert.is_true(h:cancel())
    H.assert_error(function() h:wait() end, "Run:wait: ", "cancelled")
    local _, counts = h:status()
    assert.is_true(counts.completed <= 2, ("%d tasks ran after the cancel"):format(counts.completed - 2))
    assert.are.equal(20, counts.completed + counts.failed)
  end)

  it("a failing run function raises from submit, unchanged; the Worker is usable after", function()
    local ok, err = pcall(W.submit, W, function(orch)
      sleep(orch, 1000)
      error("boom in the run function")
    end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("boom in the run function", 1, true))
    W:wait_all()
    H.check_vector_add(W, K.vector_add)
  end)
end)

describe("memory of runs in flight", function()
  it("is bounded by the heap ring: a submit whose alloc does not fit waits for earlier runs", function()
    -- 100 runs of 1 MiB each through a 4 MiB ring: all succeed, and at no
    -- point are more than a few of them unfinished (without back-pressure
    -- all 100 would be in flight, holding 100 MiB).
    local w <close> = pto.Worker{chips = 2, heap_ring_size = 4 << 20}
    local sl = w:register(pto.chip_kernel("sleep_us"))
    w:init()
    local hs, most = {}, 0
    for i = 1, 100 do
      hs[i] = w:submit(function(orch)
        local open = 0
        for j = 1, i - 1 do if not hs[j]:done() then open = open + 1 end end
        most = math.max(most, open)
        local t = orch:alloc({262144}, "f32")
        orch:submit_next_level(sl, pto.args{{t, "out"}, scalars = {200}})
      end)
    end
    w:wait_all()
    for i = 1, 100 do assert.are.equal("ok", (hs[i]:status())) end
    assert.is_true(most <= 8, ("%d runs were in flight at once through a 4 MiB ring"):format(most))
    local hwm = 0
    for _, r in ipairs(w:stats().rings) do hwm = math.max(hwm, r.hwm_bytes) end
    assert.is_true(hwm <= 4 << 20)
  end)
end)

describe("handles as values", function()
  it("a to-be-closed handle waits for its run when it goes out of scope", function()
    local t = pto.tensor({16}, "f32")
    local h0
    do
      local h <close> = W:submit(function(orch)
        sleep(orch, 100000, {t, "out"})
        fill(orch, t, 9.0)
      end)
      h0 = h
    end
    assert.is_true(h0:done())
    assert.are.equal(9, t[1])
  end)

  it("pto.wait_any returns a finished handle and its index, or nothing after its timeout", function()
    local slow = W:submit(function(orch) sleep(orch, 400000) end)
    assert.is_nil(pto.wait_any({slow}, 0))
    local h, i = pto.wait_any{slow}
    assert.are.equal(slow, h)
    assert.are.equal(1, i)
  end)

  it("close with runs outstanding waits for them; their handles then say the Worker is closed", function()
    local w = pto.Worker{chips = 1}
    local k = w:register(pto.chip_kernel("fill"))
    local s = w:register(pto.chip_kernel("sleep_us"))
    local t = pto.tensor({16}, "f32")
    local h = w:submit(function(orch)
      local a = pto.args{{t, "out"}}
      a:add_scalar(200000)
      orch:submit_next_level(s, a)
      fill(orch, t, 6.0, k)
    end)
    w:close()
    assert.are.equal(6, t[1])
    assert.are.equal("ok", (h:status()))
    H.assert_error(function() h:wait() end, "Run:wait: ", "is closed")
    H.assert_error(function() h:cancel() end, "Run:cancel: ", "is closed")
  end)
end)

describe("misuse of run handles", function()
  it("submit inside a run's function: runs do not nest", function()
    H.assert_error(function()
      W:run(function() W:submit(function() end) end)
    end, "Worker:submit: ", "runs do not nest")
    H.assert_error(function()
      W:submit(function() W:submit(function() end) end)
    end, "Worker:submit: ", "runs do not nest")
    H.check_vector_add(W, K.vector_add)
  end)

  it("submit from inside a sub callable fails that task, saying so", function()
    local h = W:submit(function(orch) orch:submit_sub(SUBMITTER) end)
    H.assert_error(function() h:wait() end, "Run:wait: ", "not from a sub callable")
    H.check_vector_add(W, K.vector_add)
  end)

  it("bad arguments name the function and say what to give", function()
    H.assert_error(function() W:submit(42) end, "Worker:submit: ", "expected the function to run")
    H.assert_error(function() W.submit({}, function() end) end, "Worker:submit: ", "expected a Worker")
    local h = W:submit(function() end)
    H.assert_error(function() h.wait({}) end, "Run:wait: ", "expected a run handle")
    H.assert_error(function() pto.wait_any(h) end, "pto.wait_any: ", "list of run handles")
    H.assert_error(function() pto.wait_any{} end, "pto.wait_any: ", "at least one")
    H.assert_error(function() pto.wait_any{h, 3} end, "pto.wait_any: ", "item 2 is not a run handle")
    H.assert_error(function() pto.wait_any({h}, -1) end, "pto.wait_any: ", "seconds >= 0")
    h:wait()
  end)

  it("Worker:open_run while submitted runs are outstanding says to wait for them", function()
    local h = W:submit(function(orch) sleep(orch, 200000) end)
    H.assert_error(function() W:open_run() end, "Worker:open_run: ", "Worker:wait_all")
    h:wait()
    local orch = W:open_run()   -- none outstanding: an interactive run opens as before
    assert.is_not_nil(orch)
    W:close_run()
  end)

  it("a closed Worker refuses submit and wait_all", function()
    local w = pto.Worker{chips = 1}
    w:init()
    w:close()
    H.assert_error(function() w:submit(function() end) end, "Worker:submit: ", "create a new one")
    H.assert_error(function() w:wait_all() end, "Worker:wait_all: ", "create a new one")
  end)
end)

describe("Ctrl-C with runs outstanding", function()
  local F = require "files"
  teardown(F.cleanup)

  -- Start ptolua on text (a script, or with -i the prompt's input), SIGINT it
  -- once the script has written its children's pids, and return its exit
  -- status, its stderr and those pids.
  local function interrupted(text, interactive)
    local PTOLUA = assert(os.getenv("PTOLUA"), "set PTOLUA to the ptolua binary")
    local pids, err, out = F.tmpname(), F.tmpname(), F.tmpname()
    local s = F.writefile(F.tmpname(".lua"), text:gsub("PIDS", pids))
    local cmd = interactive and ("(cat %s; sleep 2; echo 'print(\"back\")') | %s -i >%s"):format(F.q(s), F.q(PTOLUA), F.q(out))
                              or ("%s %s >%s"):format(F.q(PTOLUA), F.q(s), F.q(out))
    local p = assert(io.popen(("sh -c %s"):format(F.q(
      cmd .. " 2>" .. F.q(err) .. " & pid=$!; " ..
      "n=0; while ! grep -q ready " .. F.q(pids) .. " 2>/dev/null && [ $n -lt 200 ]; do sleep 0.05; n=$((n+1)); done; " ..
      "sleep 0.3; " ..
      "kill -INT $pid; (sleep 20; kill -9 $pid) >/dev/null 2>&1 & dog=$!; wait $pid; rc=$?; kill $dog 2>/dev/null; echo $rc"))))
    local rc = tonumber(p:read("a"):match("(%d+)%s*$"))
    p:close()
    local list = {}
    for pid in (F.readfile(pids) or ""):gmatch("%d+") do list[#list + 1] = tonumber(pid) end
    return rc, F.readfile(err) or "", F.readfile(out) or "", list
  end

  local function alive(pid)
    local f = io.open("/proc/" .. pid .. "/stat")
    if not f then return false end
    local st = f:read("a"):match("^%d+ %b() (%a)")
    f:close()
    return st ~= "Z"
  end

  -- Long runs queued behind each other (a chain of 1.5 s tasks), then the
  -- script waits; the children's pids and "ready" go to the file PIDS.
  local BODY = [[
local w = pto.Worker{chips = 2}
local k = w:register(pto.chip_kernel("sleep_us"))
w:init()
local t = pto.tensor{4}
local hs = {}
for i = 1, 5 do
  hs[i] = w:submit(function(orch)
    local a = pto.args{{t, "inout"}}
    a:add_scalar(1500000)
    orch:submit_next_level(k, a)
  end)
end
local f = io.open("PIDS", "w")
for _, p in ipairs(w:child_pids().chips) do f:write(p, "\n") end
f:write("ready\n")
f:close()
]]

  it("stops a script waiting for its runs: 'interrupted', exit 130, no child process left", function()
    local rc, err, _, pids = interrupted(BODY .. "w:wait_all()\n")
    assert.are.equal(130, rc)
    assert.truthy(err:find("interrupted", 1, true), err)
    assert.are.equal(H.MODE == "process" and 2 or 0, #pids)   -- thread mode: chips are threads
    local deadline = H.clock() + 5
    for _, pid in ipairs(pids) do
      while alive(pid) and H.clock() < deadline do os.execute("sleep 0.05") end
      assert.is_false(alive(pid), "child " .. pid .. " outlived ptolua")
    end
  end)

  it("at the prompt, cancels the outstanding runs and returns to the prompt", function()
    -- one line, globals: each line at the prompt is a chunk of its own
    local text = BODY:gsub("local ", ""):gsub("\n", " ") .. "\nwhile true do local x = {} end\n" ..
      "print(select(2, pcall(hs[5].wait, hs[5])))\n"
    local rc, err, out = interrupted(text, true)
    assert.are.equal(0, rc)
    assert.truthy(err:find("interrupted!", 1, true), err)
    assert.truthy(out:find("Run:wait: task %d+ was not run"), out)   -- the last run did not run
    assert.truthy(out:find("back\n", 1, true), out)
  end)
end)

describe("the prompt's :runs", function()
  it("lists the submitted runs not yet waited for, with their state and counts", function()
    local F = require "files"
    local PTOLUA = assert(os.getenv("PTOLUA"), "set PTOLUA to the ptolua binary")
    local PTYDRIVE = assert(os.getenv("PTYDRIVE"), "set PTYDRIVE to the ptydrive fixture")
    local steps = {
      "send w = pto.Worker{chips = 1}; k = w:register(pto.chip_kernel('sleep_us')); t = pto.tensor{4}\\n",
      "line > ",
      "send for i = 1, 2 do w:submit(function(orch) local a = pto.args{{t, 'inout'}} a:add_scalar(300000) " ..
        "orch:submit_next_level(k, a) end) end\\n",
      "line > ",
      "send :runs\\n", "expect running", "line > ",
      "send w:wait_all()\\n", "line > ",
      "send :runs\\n", "expect no submitted runs outstanding", "line > ",
      "send os.exit(0)\\n", "wait",
    }
    local script = F.writefile(F.tmpname(), table.concat(steps, "\n") .. "\n")
    local p = assert(io.popen(("env -u LUA_INIT -u LUA_INIT_5_4 TERM=xterm PTOLUA_HISTORY=%s %s %s %s 2>&1")
      :format(F.q(F.tmpname()), F.q(PTYDRIVE), F.q(script), F.q(PTOLUA))))
    local out = p:read("a")
    p:close()
    F.cleanup()
    local block = assert(out:match(":runs\n(.-)\n> "), out)
    assert.truthy(block:find("run%s+state%s+submitted%s+completed%s+failed"), block)
    assert.truthy(block:find("1%s+running%s+1%s+0%s+0"), block)
    assert.truthy(block:find("2%s+running%s+1%s+0%s+0"), block)
    assert.truthy(out:find("has no submitted runs outstanding", 1, true), out)
  end)
end)

describe("inspecting submitted runs", function()
  it("w:orch() shows their tasks with their run; :dag has a run column and run=; it submits nothing", function()
    local ts = {pto.tensor({4}, "f32"), pto.tensor({4}, "f32"), pto.tensor({4}, "f32")}
    W:hold()   -- the tasks stay put while they are looked at
    local hs = {}
    for i = 1, 3 do hs[i] = W:submit(function(orch) fill(orch, ts[i], i) end) end
    local o = W:orch()
    local tasks = o:tasks()
    assert.are.equal(3, #tasks)
    for i, x in ipairs(tasks) do assert.are.equal(hs[i].id, x.run) end
    H.assert_error(function() fill(o, ts[1], 9) end, "orch:submit_next_level: ", "only inspects them")
    H.assert_error(function() o:alloc({4}, "f32") end, "orch:alloc: ", "only inspects them")
    local repl = require "pto.repl"
    local f, saved = io.tmpfile(), io.stdout
    io.stdout = f
    local ok, err = pcall(repl.command, ":dag run=" .. hs[2].id)
    io.stdout = saved
    W:release()
    W:wait_all()
    assert(ok, err)
    f:seek("set")
    local text = f:read("a")
    assert.truthy(text:find("id%s+run%s+state"), text)
    assert.truthy(text:find("\n%s*1%s+" .. hs[2].id .. "%s+"), text)   -- task 1 is run 2's
    assert.is_nil(text:find("\n%s*0%s+" .. hs[1].id .. "%s+"), text)    -- run 1's task is filtered out
    for i = 1, 3 do assert.are.equal(i, ts[i][1]) end
    H.assert_error(function() o:tasks() end, "orch:tasks: ", "have all finished")
    assert.is_nil(W:orch())
  end)
end)

describe("results from every level", function()
  local w4, L3FN, BAD, ECHO
  setup(function()
    w4 = pto.Worker{level = 4}
    L3FN = w4:register(function(_, args)
      return {tensors = args:tensor_count(), scalars = args:scalar_count(), s = "q\"uote\n\0end", f = 0.5,
              nested = {1, 2, {true}}}, 42, nil, "last"
    end, "l3fn")
    BAD = w4:register(function() return coroutine.create(print) end, "bad_result")
    ECHO = w4:register(function(_, args) return args:scalar(1), args:tensor_count(), args:scalar_count() end, "echo")
    w4:add_worker(pto.Worker{level = 3, chips = 1})
    w4:add_worker(pto.Worker{level = 3, chips = 1})
  end)
  teardown(function() if w4 then w4:close() end end)

  local function check(n, t, a, b, c)
    assert.are.equal(4, n)
    -- the function saw exactly the arguments the L4 gave: no result box
    assert.are.same({tensors = 1, scalars = 1, s = "q\"uote\n\0end", f = 0.5, nested = {1, 2, {true}}}, t)
    assert.are.equal(42, a)
    assert.is_nil(b)
    assert.are.equal("last", c)
  end

  it("an L3 orchestration function's results reach the L4 per task: orch:result in the run, h:result after", function()
    local t = pto.tensor{4}
    local args = pto.TaskArgs()
    args:add_tensor(t, pto.INPUT)
    args:add_scalar(7)
    local r = w4:run(function(orch)
      local id = orch:submit_next_level(L3FN, args)
      H.assert_error(function() orch:result(id + 100) end, "orch:result: ", "not a task this run submitted")
      orch:drain()
      return table.pack(orch:result(id))
    end)
    check(r.n, table.unpack(r, 1, r.n))
    local ids = {}
    local h = w4:submit(function(orch)
      for i = 1, 3 do ids[i] = orch:submit_next_level(L3FN, args) end
    end)
    h:wait()
    for i = 1, 3 do check(select("#", h:result(ids[i])), h:result(ids[i])) end
  end)

  it("prepared and group submits carry results too: a group's per member, orch:result(id, k)", function()
    local t = pto.tensor{4}
    local ids = {}
    local r = w4:run(function(orch)
      local p = orch:prepare_next_level(ECHO, {"in"})
      ids.p = p(t, 7)
      ids.g = orch:submit_next_level_group(ECHO, {pto.args{{t, "in"}, scalars = {11}},
                                                  pto.args{{t, "in"}, scalars = {12}}})
      orch:drain()
      -- the function saw exactly the arguments the L4 gave (one tensor, one scalar): no result box
      return {p = {orch:result(ids.p)}, p1 = {orch:result(ids.p, 1)}, g1 = {orch:result(ids.g, 1)},
              g2 = {orch:result(ids.g, 2)}}
    end)
    assert.are.same({7, 1, 1}, {r.p[1], r.p[2], r.p[3]})
    assert.are.same(r.p, r.p1)
    assert.are.same({11, 1, 1}, {r.g1[1], r.g1[2], r.g1[3]})
    assert.are.same({12, 1, 1}, {r.g2[1], r.g2[2], r.g2[3]})
    -- after a submitted run, through its handle; misuse names the fix
    local h = w4:submit(function(orch)
      ids.g = orch:submit_next_level_group(ECHO, {pto.args{scalars = {21}}, pto.args{scalars = {22}}})
      ids.p = orch:prepare_next_level(ECHO, {})(23)
    end)
    h:wait()
    assert.are.equal(22, (h:result(ids.g, 2)))
    assert.are.equal(23, (h:result(ids.p)))
    local msg = H.assert_error(function() h:result(ids.g) end, "Run:result: ", "is a group of 2 members")
    assert.truthy(msg:find("give the member as the second argument, 1 to 2 (got none)", 1, true), msg)
    H.assert_error(function() h:result(ids.g, 3) end, "Run:result: ", "1 to 2 (got 3)")
    H.assert_error(function() h:result(ids.p, 2) end, "Run:result: ", "has one set of results")
    -- a group of one, pinned: its one set of results, with or without the member
    local one = w4:run(function(orch)
      local g = orch:submit_next_level_group(ECHO, {pto.args{scalars = {31}}}, nil, {workers = {2}})
      orch:drain()
      return {orch:result(g), orch:result(g, 1)}
    end)
    assert.are.same({31, 31, 0, 1}, one)   -- the first call gives one value, the last all three
  end)

  it("results that cannot travel fail their task, saying what can", function()
    local id
    local h = w4:submit(function(orch) id = orch:submit_next_level(BAD, pto.args{}) end)
    H.assert_error(function() h:wait() end, "Run:wait: ", "returned a thread; results that travel")
    H.assert_error(function() h:result(id) end, "Run:result: ", "has no results")
    w4:wait_all()
  end)
end)

-- A level above stages several tasks on one Worker child (its queue, its
-- mailbox ring); the child begins each as a submitted run of its own and
-- ends them in order, so they overlap. flag_set / flag_wait is a handshake
-- that passes only if two tasks run at the same time: run one after the
-- other, the waiter times out. The L3 tasks are pinned to chips: staged
-- behind a waiter on its chip, a setter would wait for it too.
describe("an L4's tasks on one L3 child", function()
  local w4, WAITER, SETTER, FAILS, RAISES
  setup(function()
    local l3 = pto.Worker{level = 3, chips = 2}
    local wait = l3:register(pto.chip_kernel("flag_wait"), "flag_wait")
    local set = l3:register(pto.chip_kernel("flag_set"), "flag_set")
    local fail = l3:register(pto.chip_kernel("fail"), "fail")
    w4 = pto.Worker{level = 4}
    -- on chip scalar 2: marks tensor 2 (it began), then waits up to scalar 1 ms for tensor 1
    WAITER = w4:register(function(orch, a)
      local on = {worker = a:scalar(2)}
      orch:submit_next_level(set, pto.args{{a:tensor(2), "no_dep"}, scalars = {1}}, nil, on)
      orch:submit_next_level(wait, pto.args{{a:tensor(1), "no_dep"}, scalars = {1, a:scalar(1)}}, nil, on)
      return "waited"
    end, "waiter")
    SETTER = w4:register(function(orch, a)
      orch:submit_next_level(set, pto.args{{a:tensor(1), "no_dep"}, scalars = {1}}, nil, {worker = 2})
      return "set"
    end, "setter")
    FAILS = w4:register(function(orch)
      orch:submit_next_level(fail, pto.args{scalars = {7}}, nil, {worker = 2})
    end, "fails")
    RAISES = w4:register(function(orch, a)
      orch:submit_next_level(set, pto.args{{a:tensor(1), "no_dep"}, scalars = {1}}, nil, {worker = 2})
      error("raised on purpose")
    end, "raises")
    w4:add_worker(l3)
    w4:init()
  end)
  teardown(function() if w4 then w4:close() end end)

  local function flag() return pto.tensor({1}, "i32") end
  local function waiter(f, mark, ms, chip)
    return pto.args{{f, "no_dep"}, {mark or flag(), "no_dep"}, scalars = {ms or 10000, chip or 1}}
  end

  -- A waiter and a setter on the child in one run: passes only if they overlap.
  local function handshake()
    local f = flag()
    w4:run(function(orch)
      orch:submit_next_level(WAITER, waiter(f))
      orch:submit_next_level(SETTER, pto.args{{f, "no_dep"}})
    end)
    assert.are.equal(1, f[1])
  end

  it("begins a task while the one before it on the same child still runs, in a run and across runs", function()
    local ids = {}
    local f = flag()
    local r = w4:run(function(orch)
      ids.w = orch:submit_next_level(WAITER, waiter(f))
      ids.s = orch:submit_next_level(SETTER, pto.args{{f, "no_dep"}})
      orch:drain()
      return {orch:result(ids.w), orch:result(ids.s)}
    end)
    assert.are.same({"waited", "set"}, r)
    f = flag()
    local hw = w4:submit(function(orch) ids.w = orch:submit_next_level(WAITER, waiter(f)) end)
    local hs = w4:submit(function(orch) ids.s = orch:submit_next_level(SETTER, pto.args{{f, "no_dep"}}) end)
    hs:wait()
    hw:wait()
    assert.are.equal("waited", hw:result(ids.w))
    assert.are.equal("set", hs:result(ids.s))
    assert.are.equal(1, f[1])
  end)

  it("fails only the task whose L3 run failed; the one beside it completes", function()
    local f = flag()
    local hf = w4:submit(function(orch) orch:submit_next_level(FAILS, pto.args{}) end)
    local hw = w4:submit(function(orch) orch:submit_next_level(WAITER, waiter(f)) end)
    local hs = w4:submit(function(orch) orch:submit_next_level(SETTER, pto.args{{f, "no_dep"}}) end)
    H.assert_error(function() hf:wait() end, "Run:wait: ", "fail kernel called with code 7")
    hw:wait()
    hs:wait()
    w4:wait_all()
  end)

  it("fails the task of an orchestration function that raises only after what it submitted has run", function()
    local f = flag()
    local msg = H.assert_error(function()
      w4:run(function(orch) orch:submit_next_level(RAISES, pto.args{{f, "no_dep"}}) end)
    end, "Worker:run: ", "raised on purpose")
    assert.truthy(msg:find("L3 orchestration function failed", 1, true), msg)
    assert.are.equal(1, f[1])
    handshake()
  end)

  H.process_only("fails every task a dying child had begun, and runs none of them again",
    "a thread-mode child cannot be killed alone", function()
    local fa, fb, ma, mb = flag(), flag(), flag(), flag()
    local h = w4:submit(function(orch)
      orch:submit_next_level(WAITER, waiter(fa, ma, 30000, 1))
      orch:submit_next_level(WAITER, waiter(fb, mb, 30000, 2))
    end)
    assert.is_true(H.eventually(function() return ma[1] == 1 and mb[1] == 1 end, 20), "both tasks began")
    os.execute("kill -9 " .. w4:child_pids().workers[1])
    -- run again on the replacement, either task would now pass at once
    fa[1], fb[1] = 1, 1
    H.assert_error(function() h:wait() end, "Run:wait: ", "while running the task")
    local state, counts = h:status()
    assert.are.equal("failed", state)
    assert.are.equal(2, counts.failed)
    handshake()   -- the replacement serves
  end)
end)
