-- diag_spec.lua: the CallConfig's diagnostic fields (docs/tracing.md,
-- "Diagnostics"): tensor dumps read back with pto.load_dump, per-task PMU
-- counts, the dependency dump, swimlanes and block_dim, in both modes
-- (CTest runs it once per PTO_MODE), from an L4 through an L3, and around
-- a user chip runtime (fixtures/saxpy.c, built by spec/CMakeLists.txt).
--
-- What each dump says is checked against what the engine itself reports:
-- the tensors' own bytes, orch:task(id).producers for the edges.
local pto = require "pto"
local H = require "helpers"
local F = require "files"

local PTOLUA = assert(os.getenv("PTOLUA"), "set PTOLUA to the ptolua binary")
local q = F.q

-- A fresh, empty directory; returns its path (with no trailing slash).
local function fresh_dir()
  local d = F.tmpname(".d")
  assert(os.execute("rm -rf " .. q(d) .. " && mkdir -p " .. q(d)))
  return d
end

-- Files of dir whose names match the Lua pattern, sorted.
local function ls(dir, pattern)
  local out = {}
  local p = io.popen("ls -1 " .. q(dir))
  for name in p:lines() do
    if name:match(pattern) then out[#out + 1] = dir .. "/" .. name end
  end
  p:close()
  table.sort(out)
  return out
end

local function the_one(dir, pattern)
  local files = ls(dir, pattern)
  assert(#files == 1, ("expected one file matching %s in %s, found %d"):format(pattern, dir, #files))
  return files[1]
end

local function filled(shape, f)
  local t = pto.tensor(shape, "f32")
  for i = 1, #t do t[i] = f(i) end
  return t
end

local function same_values(a, b)
  assert.are.equal(#a, #b)
  for i = 1, #a do
    if a[i] ~= b[i] then error(("element %d: %s ~= %s"):format(i, tostring(a[i]), tostring(b[i])), 2) end
  end
end

describe("enable_dump_tensor", function()
  after_each(F.cleanup)

  it("dumps inputs before and outputs after each task; pto.load_dump reads back what the kernel saw", function()
    local dir = fresh_dir()
    local w <close> = pto.Worker{level = 3, chips = 2}
    local gemm = w:register(pto.chip_kernel("gemm_tile"))
    local add = w:register(pto.chip_kernel("tile_add"))
    w:init()
    local A = filled({8, 8}, function(i) return i % 7 - 3 end)
    local B = filled({8, 8}, function(i) return i % 5 - 2 end)
    local big = filled({4, 8, 8}, function(i) return i % 3 end)
    local acc = big:view{offset = 128, shape = {8, 8}}   -- the third 8x8 block: a view is dumped as its bytes
    local acc_before = acc:totable()
    local cfg = pto.CallConfig{enable_dump_tensor = 1, output_prefix = dir .. "/bad"}
    local P, ids = pto.tensor({8, 8}, "f32"), {}
    w:run(function(orch)
      ids.gemm = orch:submit_next_level(gemm, pto.args{{A, "in"}, {B, "in"}, {P, "out"}}, cfg)
      ids.add = orch:submit_next_level(add, pto.args{{acc, "inout"}, {P, "in"}}, cfg)
    end)
    local rows = pto.load_dump(the_one(dir, "%.index$"))
    -- gemm: A, B before; P after. add: acc and P before, acc after.
    assert.are.equal(6, #rows)
    local by = {}
    for _, r in ipairs(rows) do
      by[r.task .. ":" .. r.arg .. ":" .. r.when] = r
      assert.is_true(r.worker >= 1 and r.worker <= 2)
      assert.are.equal(1, r.member)
      assert.are.equal("f32", r.dtype)
      assert.are.same({8, 8}, r.shape)
      assert.are.equal(256, r.nbytes)
      assert.is_truthy(r.checksum:match("^%x+$"))
    end
    local g, a = ids.gemm, ids.add
    same_values(A, by[g .. ":1:in"].tensor)
    same_values(B, by[g .. ":2:in"].tensor)
    same_values(P, by[g .. ":3:out"].tensor)
    assert.are.equal("in", by[g .. ":1:in"].tag)
    assert.are.equal("out", by[g .. ":3:out"].tag)
    assert.is_nil(by[g .. ":3:in"])                        -- an OUTPUT is not dumped before
    assert.are.equal("inout", by[a .. ":1:in"].tag)
    assert.are.equal(128 * 4, by[a .. ":1:in"].offset)     -- the view's byte offset in its storage
    same_values(acc_before, by[a .. ":1:in"].tensor)
    same_values(acc, by[a .. ":1:out"].tensor)
    same_values(P, by[a .. ":2:in"].tensor)
    -- before and after differ exactly where the kernel wrote: acc += P changes the elements where P ~= 0
    local before, after = by[a .. ":1:in"].tensor, by[a .. ":1:out"].tensor
    local changed = 0
    for i = 1, #P do
      assert.are.equal(P[i] ~= 0, before[i] ~= after[i])
      if P[i] ~= 0 then changed = changed + 1 end
    end
    assert.is_true(changed > 0)
    -- the rest of the storage was not touched
    for i = 1, #big do
      if i <= 128 or i > 192 then assert.are.equal(i % 3, big[i]) end
    end
  end)

  it("a load_dump of a changed file fails on its checksum", function()
    local dir = fresh_dir()
    local w <close> = pto.Worker{level = 3, chips = 1}
    local fill = w:register(pto.chip_kernel("fill"))
    w:init()
    local x = pto.tensor({16}, "f32")
    w:run(function(orch)
      orch:submit_next_level(fill, pto.args{{x, "out"}, scalars = {2.5}},
                             pto.CallConfig{enable_dump_tensor = 1, output_prefix = dir .. "/f"})
    end)
    local idx = the_one(dir, "%.index$")
    local rows = pto.load_dump(idx)
    assert.are.equal(1, #rows)
    same_values(x, rows[1].tensor)
    assert.are.equal(2.5, rows[1].tensor[16])
    local data = assert(io.open(rows[1].file, "r+b"))
    data:write("\0\0\0\0")
    data:close()
    H.assert_error(function() pto.load_dump(idx) end, "pto.load_dump: ", "does not match its checksum")
    H.assert_error(function() pto.load_dump(dir .. "/nothing.index") end, "pto.load_dump: ", "cannot open")
    local junk = F.writefile(dir .. "/junk.index", "task 1 2 3\n")
    H.assert_error(function() pto.load_dump(junk) end, "pto.load_dump: ", "is not a ptolua tensor dump index")
  end)

  it("a missing or unwritable output_prefix is an error at submit, and the Worker stays usable", function()
    local w <close> = pto.Worker{level = 3, chips = 1}
    local noop = w:register(pto.chip_kernel("noop"))
    w:init()
    local x = pto.tensor({4}, "f32")
    w:run(function(orch)
      H.assert_error(function()
        orch:submit_next_level(noop, pto.args{{x, "in"}}, pto.CallConfig{enable_dump_tensor = 1})
      end, "orch:submit_next_level: ", "needs an output_prefix")
      H.assert_error(function()
        orch:submit_next_level(noop, pto.args{{x, "in"}},
                               pto.CallConfig{enable_dump_tensor = 1, output_prefix = "/nonexistent-dir/x"})
      end, "orch:submit_next_level: ", "cannot be written")
      H.assert_error(function()
        orch:submit_next_level(noop, pto.args{{x, "in"}}, pto.CallConfig{enable_pmu = 9})
      end, "orch:submit_next_level: ", "selects no event set")
      orch:submit_next_level(noop, pto.args{{x, "in"}})
    end)
  end)
end)

describe("enable_pmu", function()
  after_each(F.cleanup)

  it("set 1 (software) gives positive counts: more task-clock for a bigger GEMM, page faults on fresh memory",
     function()
    local w <close> = pto.Worker{level = 3, chips = 1}
    local gemm = w:register(pto.chip_kernel("gemm_tile"))
    local scale = w:register(pto.chip_kernel("vector_scale"))
    w:init()
    local small = {filled({8, 8}, math.sin), filled({8, 8}, math.cos), pto.tensor({8, 8}, "f32")}
    local n = 256
    local large = {filled({n, n}, math.sin), filled({n, n}, math.cos), pto.tensor({n, n}, "f32")}
    local src, fresh = pto.tensor({1 << 20}, "f32"), pto.tensor({1 << 20}, "f32")   -- 4 MiB nobody touched yet
    local cfg = pto.CallConfig{enable_pmu = 1}
    w:run(function(orch)
      local s = orch:submit_next_level(gemm, pto.args{{small[1], "in"}, {small[2], "in"}, {small[3], "out"}}, cfg)
      local l = orch:submit_next_level(gemm, pto.args{{large[1], "in"}, {large[2], "in"}, {large[3], "out"}}, cfg)
      local f = orch:submit_next_level(scale, pto.args{{src, "in"}, {fresh, "out"}, scalars = {2.0}}, cfg)
      local plain = orch:submit_next_level(gemm, pto.args{{small[1], "in"}, {small[2], "in"}, {small[3], "out"}})
      orch:drain()
      local ps, pl, pf = orch:task(s).pmu, orch:task(l).pmu, orch:task(f).pmu
      assert.is_table(ps)
      assert.are.equal(1, ps.set)
      for _, p in ipairs{ps, pl, pf} do
        assert.is_true(p.task_clock > 0)
        assert.is_true(p.page_faults >= 0 and p.context_switches >= 0 and p.cpu_migrations >= 0)
      end
      assert.is_true(pl.task_clock > ps.task_clock, ("task-clock %d (256^3) <= %d (8^3)"):format(pl.task_clock,
                                                                                                ps.task_clock))
      assert.is_true(pf.page_faults >= 256, ("%d page faults writing 4 MiB of fresh memory"):format(pf.page_faults))
      assert.is_nil(orch:task(plain).pmu)   -- a task that did not ask has none
    end)
  end)

  it("w:profile() sums them per callable over the tasks that asked, and prints them", function()
    local w <close> = pto.Worker{level = 3, chips = 1}
    local gemm = w:register(pto.chip_kernel("gemm_tile"), "gemm")
    w:init()
    local A, B = filled({32, 32}, math.sin), filled({32, 32}, math.cos)
    local cfg = pto.CallConfig{enable_pmu = 1}
    local clock, faults = 0, 0
    w:run(function(orch)
      local ids = {}
      for k = 1, 3 do
        ids[k] = orch:submit_next_level(gemm, pto.args{{A, "in"}, {B, "in"}, {pto.tensor({32, 32}, "f32"), "out"}}, cfg)
      end
      orch:submit_next_level(gemm, pto.args{{A, "in"}, {B, "in"}, {pto.tensor({32, 32}, "f32"), "out"}})   -- no counts
      orch:drain()
      for _, id in ipairs(ids) do
        clock = clock + orch:task(id).pmu.task_clock
        faults = faults + orch:task(id).pmu.page_faults
      end
    end)
    local p = w:profile()
    local c = p.callables[1]
    assert.are.equal("gemm", c.name)
    assert.are.equal(4, c.count)
    assert.are.equal(3, c.pmu.tasks)
    assert.are.equal(clock, c.pmu.task_clock)
    assert.are.equal(faults, c.pmu.page_faults)
    local text = tostring(p)
    assert.matches("counters %(CallConfig enable_pmu%)", text)
    assert.matches("callable%s+tasks%s+task%-clock%s+page%-faults%s+context%-switches%s+cpu%-migrations", text)
    assert.matches("gemm%s+3%s+" .. clock .. "%s", text)
    -- A later run replaces the counts: its profile has none.
    w:run(function(orch) orch:submit_next_level(gemm, pto.args{{A, "in"}, {B, "in"}, {pto.tensor({32, 32}, "f32"), "out"}}) end)
    assert.is_nil(w:profile().callables[1].pmu)
    assert.is_nil(tostring(w:profile()):find("counters", 1, true))
  end)

  it("the prompt's :task N shows them", function()
    local w <close> = pto.Worker{level = 3, chips = 1}
    local gemm = w:register(pto.chip_kernel("gemm_tile"), "gemm")
    w:init()
    local A, B, C = filled({16, 16}, math.sin), filled({16, 16}, math.cos), pto.tensor({16, 16}, "f32")
    local orch = w:open_run()
    local id = orch:submit_next_level(gemm, pto.args{{A, "in"}, {B, "in"}, {C, "out"}}, pto.CallConfig{enable_pmu = 1})
    orch:drain()
    local repl = require "pto.repl"
    local f, saved = io.tmpfile(), io.stdout
    io.stdout = f
    local ok, err = pcall(repl.command, ":task " .. id)
    io.stdout = saved
    w:close_run()
    assert(ok, err)
    f:seek("set")
    local text = f:read("a")
    assert.matches("pmu %(enable_pmu = 1%): task%-clock %d+, page%-faults %d+, context%-switches %d+, cpu%-migrations %d+",
                   text)
  end)

  it("a hardware set says once on stderr what the machine refuses, and the run goes on", function()
    local script = F.writefile(F.tmpname(".lua"), [[
      local pto = require "pto"
      local w <close> = pto.Worker{level = 3, chips = 1}
      local noop = w:register(pto.chip_kernel("noop"))
      w:init()
      local cfg = pto.CallConfig{enable_pmu = 2}
      w:run(function(orch)
        local ids = {}
        for i = 1, 3 do ids[i] = orch:submit_next_level(noop, pto.args{}, cfg) end
        orch:drain()
        local p = orch:task(ids[3]).pmu
        print(("RESULT set=%s cycles=%s instructions=%s"):format(p and p.set, p and p.cycles, p and p.instructions))
      end)
      print("DONE")
    ]])
    local out = F.tmpname(".out")
    assert.is_true(os.execute(("%s %s >%s 2>&1"):format(q(PTOLUA), q(script), q(out))) == true)
    local text = F.readfile(out)
    assert.is_truthy(text:find("DONE", 1, true), text)
    local _, refusals = text:gsub("event cycles is not counted", "")
    if text:find("cycles=nil", 1, true) then
      -- no hardware PMU here: the refusal path, said once per process that counted (1 child or this one)
      assert.are.equal(1, refusals, text)
      assert.is_truthy(text:find("enable_pmu = 2: event cycles is not counted: ", 1, true), text)
    else
      assert.are.equal(0, refusals, text)
      assert.is_truthy(text:match("cycles=%d+"), text)
    end
  end)
end)

describe("enable_dep_gen", function()
  after_each(F.cleanup)

  it("writes exactly the edges orch:task(id).producers reports, as lines and as DOT that dot accepts", function()
    local dir = fresh_dir()
    local w <close> = pto.Worker{level = 3, chips = 2}
    local add = w:register(pto.chip_kernel("vector_add"))
    w:init()
    local x = filled({64}, function(i) return i end)
    local y, z = pto.tensor({64}, "f32"), pto.tensor({64}, "f32")
    local cfg = pto.CallConfig{enable_dep_gen = 1, output_prefix = dir .. "/g"}
    local producers = {}
    w:run(function(orch)
      local ids = {}
      ids[1] = orch:submit_next_level(add, pto.args{{x, "in"}, {x, "in"}, {y, "out"}}, cfg)
      ids[2] = orch:submit_next_level(add, pto.args{{y:view{offset = 0, shape = {32}}, "in"},
                                                    {y:view{offset = 32, shape = {32}}, "in"},
                                                    {z:view{offset = 0, shape = {32}}, "out"}}, cfg)
      ids[3] = orch:submit_next_level(add, pto.args{{y, "in"}, {z, "in"}, {x, "out"}}, cfg)
      orch:drain()
      for _, id in ipairs(ids) do
        local t = orch:task(id)
        producers[id] = {}
        for _, p in ipairs(t.producers) do producers[id][p] = true end
      end
    end)
    local deps = assert(F.readfile(the_one(dir, "%.deps$")))
    local got, tasks = {}, 0
    for line in deps:gmatch("[^\n]+") do
      if line:match("^task ") then tasks = tasks + 1 end
      local p, t, arg = line:match("^edge (%d+) %-> (%d+) arg (%d+) ")
      if p then
        got[tonumber(t)] = got[tonumber(t)] or {}
        got[tonumber(t)][tonumber(p)] = true
        assert.is_truthy(line:match("bytes %[%d+, %d+%) producer%-range %[%d+, %d+%)$"), line)
      end
    end
    assert.are.equal(3, tasks)
    for id, ps in pairs(producers) do assert.are.same(ps, got[id] or {}) end
    assert.is_true(next(producers[2]) ~= nil)   -- the DAG has edges at all
    local dot = the_one(dir, "%.dot$")
    local ok = os.execute(("dot -Tsvg %s -o /dev/null"):format(q(dot)))
    assert(ok, "dot -Tsvg rejected " .. dot .. ":\n" .. (F.readfile(dot) or ""))
  end)

  it("writes each consumer of a task that asked as the scheduler wires it: wired, done or failed", function()
    local dir = fresh_dir()
    local w <close> = pto.Worker{level = 3, chips = 2}
    local noop = w:register(pto.chip_kernel("noop"))
    local fail = w:register(pto.chip_kernel("fail"))
    w:init()
    local y, z = pto.tensor({16}, "f32"), pto.tensor({16}, "f32")
    local cfg = pto.CallConfig{enable_dep_gen = 1, output_prefix = dir .. "/c"}
    local ids = {}
    w:hold()   -- nothing starts until the release: the first consumer is wired to a producer that has not run
    local ok, err = pcall(w.run, w, function(orch)
      ids.first = orch:submit_next_level(noop, pto.args{{y, "out"}}, cfg)
      ids.waits = orch:submit_next_level(noop, pto.args{{y, "in"}}, cfg)
      w:sync()
      w:release()
      H.wait_state(orch, ids.first, {"completed"})
      -- no dep_gen of its own: the producer asked, so its consumer is written (and no task/edge line for it)
      ids.late = orch:submit_next_level(noop, pto.args{{y, "in"}})
      ids.bad = orch:submit_next_level(fail, pto.args{{z, "out"}}, cfg)
      H.wait_state(orch, ids.bad, {"failed"})
      ids.poisoned = orch:submit_next_level(noop, pto.args{{z, "in"}}, cfg)
    end)
    w:release()   -- also when the run failed while held
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("fail kernel called", 1, true), err)
    local deps = assert(F.readfile(the_one(dir, "%.deps$")))
    local consumers, edges = {}, {}
    for line in deps:gmatch("[^\n]+") do
      local p, t, how = line:match("^consumer (%d+) %-> (%d+) (%a+)$")
      if p then consumers[#consumers + 1] = ("%s->%s %s"):format(p, t, how) end
      local ep, et = line:match("^edge (%d+) %-> (%d+) ")
      if ep then edges[ep .. "->" .. et] = true end
      -- a task's consumer lines come after its own task and edge lines (written at its submit)
      if p and edges[p .. "->" .. t] == nil and tonumber(t) ~= ids.late then error("consumer before its edge: " .. line) end
    end
    table.sort(consumers)
    local want = {("%d->%d wired"):format(ids.first, ids.waits), ("%d->%d done"):format(ids.first, ids.late),
                  ("%d->%d failed"):format(ids.bad, ids.poisoned)}
    table.sort(want)
    assert.are.same(want, consumers)
    -- the edges of the tasks that asked have their consumer lines, and the reverse
    assert.are.same({[ids.first .. "->" .. ids.waits] = true, [ids.bad .. "->" .. ids.poisoned] = true}, edges)
    assert(os.execute(("dot -Tsvg %s -o /dev/null"):format(q(the_one(dir, "%.dot$")))), "dot -Tsvg rejected the DOT")
  end)
end)

describe("enable_l2_swimlane", function()
  after_each(F.cleanup)

  it("without a trace writes each task's four points, in order, to a file per worker", function()
    local dir = fresh_dir()
    local w <close> = pto.Worker{level = 3, chips = 2}
    local noop = w:register(pto.chip_kernel("noop"))
    w:init()
    local cfg = pto.CallConfig{enable_l2_swimlane = 1, output_prefix = dir .. "/s"}
    local n = 6
    w:run(function(orch)
      for _ = 1, n do orch:submit_next_level(noop, pto.args{}, cfg) end
    end)
    local files, rows = ls(dir, "%.swimlane%.w%d+%.tsv$"), 0
    assert.is_true(#files >= 1 and #files <= 2)
    for _, f in ipairs(files) do
      for line in io.lines(f) do
        if not line:match("^#") then
          local fields = {}
          for v in line:gmatch("[^\t]+") do fields[#fields + 1] = tonumber(v) end
          assert.are.equal(9, #fields, line)
          local r, s, e, p = fields[5], fields[6], fields[7], fields[8]
          assert.is_true(r <= s and s <= e and e <= p, line)
          assert.are.equal(0, fields[9])
          rows = rows + 1
        end
      end
    end
    assert.are.equal(n, rows)
  end)
end)

describe("swimlanes and counters in a trace", function()
  after_each(F.cleanup)

  it("kernel spans (dispatch/post from level 2, handoff from 3, their parts at 4) nest inside their task's span, "
     .. "with the PMU counts as args", function()
    local json = require "dkjson"
    local path = F.tmpname(".json")
    local dir = fresh_dir()
    local w <close> = pto.Worker{level = 3, chips = 2}
    local gemm = w:register(pto.chip_kernel("gemm_tile"))
    w:init()
    local A, B = filled({32, 32}, math.sin), filled({32, 32}, math.cos)
    local Cs = {}
    local LEVELS = {2, 2, 1, 1, 3, 4}
    w:trace_start(path)
    w:run(function(orch)
      for i, level in ipairs(LEVELS) do
        Cs[i] = pto.tensor({32, 32}, "f32")
        orch:submit_next_level(gemm, pto.args{{A, "in"}, {B, "in"}, {Cs[i], "out"}},
                               pto.CallConfig{enable_l2_swimlane = level, enable_pmu = 1,
                                              enable_dump_tensor = level == 4 and 1 or 0, output_prefix = dir .. "/s"})
      end
    end)
    w:trace_stop()
    local doc = assert(json.decode(assert(F.readfile(path))))
    local tasks, lanes = {}, {}
    for _, e in ipairs(doc.traceEvents) do
      if e.cat == "task" then tasks[e.args.task] = e end
      if e.cat == "swimlane" then lanes[#lanes + 1] = e end
    end
    local count = {dispatch = 0, kernel = 0, post = 0, handoff = 0, ["dump in"] = 0, ["counters on"] = 0,
                   ["counters off"] = 0, ["dump out"] = 0}
    local EPS = 1e-6
    for _, l in ipairs(lanes) do
      local t = assert(tasks[l.args.task], "a swimlane span of a task with no span")
      count[l.name] = count[l.name] + 1
      assert.are.equal(t.tid, l.tid)
      assert.is_true(l.ts >= t.ts - EPS and l.ts + l.dur <= t.ts + t.dur + EPS,
                     ("%s span of task %d [%f, +%f] outside its task [%f, +%f]"):format(l.name, l.args.task, l.ts,
                                                                                       l.dur, t.ts, t.dur))
      if l.name == "kernel" then assert.is_true(l.args["task-clock"] > 0) end
    end
    -- the hand-off is the parent's post to the child's receipt: a process-mode point
    local handoffs = os.getenv("PTO_MODE") == "thread" and 0 or 2
    assert.are.same({dispatch = 4, kernel = 6, post = 4, handoff = handoffs, ["dump in"] = 1, ["counters on"] = 1,
                     ["counters off"] = 1, ["dump out"] = 1}, count)
  end)
end)

describe("block_dim", function()
  it("block_dim = 2 (and 5) splits gemm_tile and vector kernels in the chip with the same result as 1", function()
    local w <close> = pto.Worker{level = 3, chips = 2}
    local gemm = w:register(pto.chip_kernel("gemm_tile"))
    local vadd = w:register(pto.chip_kernel("vector_add"))
    w:init()
    -- 100 rows: not a multiple of the 6-row blocks, so bands and the remainder path both run
    local M, K, N = 100, 70, 90
    local A, B = filled({M, K}, function(i) return math.sin(i) end), filled({K, N}, function(i) return math.cos(i) end)
    local x, y = filled({50000}, math.sin), filled({50000}, math.cos)
    local C, Z = {}, {}
    w:run(function(orch)
      for i, bd in ipairs{1, 2, 5} do
        C[i], Z[i] = pto.tensor({M, N}, "f32"), pto.tensor({50000}, "f32")
        local cfg = pto.CallConfig{block_dim = bd}
        orch:submit_next_level(gemm, pto.args{{A, "in"}, {B, "in"}, {C[i], "out"}}, cfg)
        orch:submit_next_level(vadd, pto.args{{x, "in"}, {y, "in"}, {Z[i], "out"}}, cfg)
      end
    end)
    for i = 2, 3 do
      same_values(C[1], C[i])
      same_values(Z[1], Z[i])
    end
    local want = 0
    for k = 1, K do want = want + A[(M - 1) * K + k] * B[(k - 1) * N + N] end
    assert.is_true(math.abs(C[1][M * N] - want) < 1e-3)
  end)
end)

describe("from an L4 through an L3", function()
  after_each(F.cleanup)

  it("an L3 task's tensors are dumped and counted at L4, its chip tasks at L3 with the cfg passed on", function()
    local dir = fresh_dir()
    local w3 = pto.Worker{level = 3, chips = 1}
    local scale = w3:register(pto.chip_kernel("vector_scale"))
    local w4 <close> = pto.Worker{level = 4}
    local fn = w4:register(function(orch, args, cfg)
      orch:submit_next_level(scale, pto.args{{args:tensor(1), "in"}, {args:tensor(2), "out"}, scalars = {3.0}}, cfg)
    end, "scale3")
    w4:add_worker(w3)
    w4:init()
    local x = filled({32}, function(i) return i end)
    local y = pto.tensor({32}, "f32")
    local cfg = pto.CallConfig{enable_dump_tensor = 1, enable_pmu = 1, enable_dep_gen = 1, output_prefix = dir .. "/l"}
    local pmu
    w4:run(function(orch)
      local id = orch:submit_next_level(fn, pto.args{{x, "in"}, {y, "out"}}, cfg)
      orch:drain()
      pmu = orch:task(id).pmu
    end)
    assert.are.equal(3 * 32, y[32])
    assert.is_true(pmu.task_clock > 0)
    local idx = ls(dir, "%.index$")
    assert.are.equal(2, #idx)   -- one per Worker: the L4's and the L3's runs
    for _, f in ipairs(idx) do
      local rows = pto.load_dump(f)
      assert.are.equal(2, #rows)
      for _, r in ipairs(rows) do same_values(r.arg == 1 and x or y, r.tensor) end
    end
  end)

  it("dep_gen and swimlane files are written per Worker run, and block_dim = 2 gives block_dim = 1's result",
     function()
    local dir = fresh_dir()
    local w3 = pto.Worker{level = 3, chips = 1}
    local gemm = w3:register(pto.chip_kernel("gemm_tile"))
    local add = w3:register(pto.chip_kernel("tile_add"))
    local w4 <close> = pto.Worker{level = 4}
    -- C += A*B at L3 as two chip tasks with an edge between them (P: gemm's output, tile_add's input)
    local fn = w4:register(function(orch, args, cfg)
      orch:submit_next_level(gemm, pto.args{{args:tensor(1), "in"}, {args:tensor(2), "in"}, {args:tensor(3), "out"}}, cfg)
      orch:submit_next_level(add, pto.args{{args:tensor(4), "inout"}, {args:tensor(3), "in"}}, cfg)
    end, "gemm_acc")
    w4:add_worker(w3)
    w4:init()
    -- 40 rows: not a multiple of gemm_tile's 6-row blocks, so block_dim = 2's bands and remainder both run
    local M = 40
    local A, B = filled({M, M}, math.sin), filled({M, M}, math.cos)
    local P1, P2 = pto.tensor({M, M}, "f32"), pto.tensor({M, M}, "f32")
    local C1, C2 = filled({M, M}, function(i) return i % 3 end), filled({M, M}, function(i) return i % 3 end)
    local producers = {}
    w4:run(function(orch)
      local cfg = {enable_dep_gen = 1, enable_l2_swimlane = 2, output_prefix = dir .. "/l"}
      cfg.block_dim = 1
      local t1 = orch:submit_next_level(fn, pto.args{{A, "in"}, {B, "in"}, {P1, "out"}, {C1, "inout"}},
                                        pto.CallConfig(cfg))
      -- C1 as a 5th argument the function ignores: an L4 edge t1 -> t2 for the L4's dependency file
      cfg.block_dim = 2
      local t2 = orch:submit_next_level(fn, pto.args{{A, "in"}, {B, "in"}, {P2, "out"}, {C2, "inout"}, {C1, "in"}},
                                        pto.CallConfig(cfg))
      orch:drain()
      producers = {orch:task(t1).producers, orch:task(t2).producers, t1 = t1, t2 = t2}
    end)
    same_values(C1, C2)
    local want = 1 % 3
    for k = 1, M do want = want + A[k] * B[(k - 1) * M + 1] end
    assert.is_true(math.abs(C1[1] - want) < 1e-3, ("C[1] = %f, want %f"):format(C1[1], want))
    assert.are.same({}, producers[1])
    assert.are.same({producers.t1}, producers[2])
    -- Files by run: "l.<run>.deps" and so on, <run> naming the Worker (process, serial) and its run.
    local runs = {}
    for _, f in ipairs(ls(dir, "^l%.")) do
      local run, rest = f:match("/l%.(p%d+w%d+r%d+)%.(.+)$")
      assert(run, f)
      runs[run] = runs[run] or {tsv = {}}
      if rest == "deps" or rest == "dot" then runs[run][rest] = f end
      if rest:match("^swimlane%.w%d+%.tsv$") then table.insert(runs[run].tsv, f) end
    end
    -- The L4's one run, and one L3 run per L4 task (each L4 task runs the function as a run of the L3).
    local l4, l3 = {}, {}
    for run, files in pairs(runs) do
      assert(files.deps and files.dot, "run " .. run .. " has no .deps/.dot")
      local deps = assert(F.readfile(files.deps))
      if deps:find("arg 5 ", 1, true) then l4[#l4 + 1] = deps else l3[#l3 + 1] = deps end
      local ok = os.execute(("dot -Tsvg %s -o /dev/null"):format(q(files.dot)))
      assert(ok, "dot -Tsvg rejected " .. files.dot .. ":\n" .. (F.readfile(files.dot) or ""))
      -- one worker per Worker (the L3 under the L4, the chip under the L3): one swimlane file each,
      -- a line per task with its points in order
      assert.are.equal(1, #files.tsv, run)
      local rows = 0
      for line in io.lines(files.tsv[1]) do
        local fields = {}
        for v in line:gmatch("[^\t]+") do fields[#fields + 1] = tonumber(v) end
        assert.are.equal(9, #fields, line)
        assert.is_true(fields[5] <= fields[6] and fields[6] <= fields[7] and fields[7] <= fields[8], line)
        assert.are.equal(0, fields[9], line)
        rows = rows + 1
      end
      assert.are.equal(2, rows, files.tsv[1])
    end
    assert.are.equal(1, #l4)
    assert.are.equal(2, #l3)
    -- the L4's file has exactly the edges orch:task(id).producers reported: t1 -> t2 through C1 (arg 5)
    local edges = {}
    for p, t in l4[1]:gmatch("\nedge (%d+) %-> (%d+) ") do edges[#edges + 1] = p .. "->" .. t end
    assert.are.same({producers.t1 .. "->" .. producers.t2}, edges)
    -- each L3 run: gemm (task 0) -> tile_add (task 1) through P, its second argument
    for _, deps in ipairs(l3) do
      local e = {}
      for line in deps:gmatch("edge [^\n]+") do e[#e + 1] = line:match("^edge %d+ %-> %d+ arg %d+") end
      assert.are.same({"edge 0 -> 1 arg 2"}, e)
    end
  end)
end)

describe("a user chip runtime", function()
  after_each(F.cleanup)

  it("gets every field around its kernel: dumps read back, counts, deps and swimlanes", function()
    local lib = assert(os.getenv("PTO_SAXPY_LIB"), "PTO_SAXPY_LIB names the fixture library (spec/CMakeLists.txt)")
    local dir = fresh_dir()
    local w <close> = pto.Worker{level = 3, chips = 1}
    local saxpy = w:register(pto.chip_kernel{lib = lib, symbol = "saxpy"})
    w:init()
    local n = 64
    local x = filled({n}, function(i) return i % 4 == 0 and 0 or i end)   -- zeros: elements saxpy leaves as they were
    local y = filled({n}, function(i) return 1 - i end)
    local z = filled({n}, function(i) return 0.5 * i end)
    local z0 = z:totable()
    local cfg = pto.CallConfig{enable_dump_tensor = 1, enable_pmu = 1, enable_dep_gen = 1, enable_l2_swimlane = 1,
                               output_prefix = dir .. "/u"}
    local ids, pmu, producers = {}, {}, {}
    w:run(function(orch)
      ids[1] = orch:submit_next_level(saxpy, pto.args{{x, "in"}, {y, "inout"}, scalars = {2.0}}, cfg)   -- y += 2x
      ids[2] = orch:submit_next_level(saxpy, pto.args{{y, "in"}, {z, "inout"}, scalars = {3.0}}, cfg)   -- z += 3y
      orch:drain()
      for k, id in ipairs(ids) do
        pmu[k] = orch:task(id).pmu
        producers[k] = orch:task(id).producers
      end
    end)
    for i = 1, n do
      assert.are.equal((1 - i) + 2 * x[i], y[i])
      assert.are.equal(0.5 * i + 3 * y[i], z[i])
    end
    -- dumps: task 1 x and y before, y after; task 2 y and z before, z after
    local rows = pto.load_dump(the_one(dir, "%.index$"))
    assert.are.equal(6, #rows)
    local by = {}
    for _, r in ipairs(rows) do by[r.task .. ":" .. r.arg .. ":" .. r.when] = r end
    local a, b = ids[1], ids[2]
    same_values(x, by[a .. ":1:in"].tensor)
    same_values(y, by[a .. ":2:out"].tensor)
    same_values(y, by[b .. ":1:in"].tensor)
    same_values(z0, by[b .. ":2:in"].tensor)
    same_values(z, by[b .. ":2:out"].tensor)
    local before, after = by[a .. ":2:in"].tensor, by[a .. ":2:out"].tensor
    for i = 1, n do
      assert.are.equal(1 - i, before[i])
      assert.are.equal(x[i] ~= 0, before[i] ~= after[i])   -- they differ exactly where the kernel changed y
    end
    -- counters of the software set, around the user's kernel
    for k = 1, 2 do
      assert.are.equal(1, pmu[k].set)
      assert.is_true(pmu[k].task_clock > 0)
    end
    -- the dependency files: the one edge, through y (task 2's first argument), as producers reports it
    assert.are.same({}, producers[1])
    assert.are.same({a}, producers[2])
    local deps = assert(F.readfile(the_one(dir, "%.deps$")))
    local edges = {}
    for line in deps:gmatch("edge [^\n]+") do edges[#edges + 1] = line:match("^edge %d+ %-> %d+ arg %d+") end
    assert.are.same({("edge %d -> %d arg 1"):format(a, b)}, edges)
    local dot = the_one(dir, "%.dot$")
    assert(os.execute(("dot -Tsvg %s -o /dev/null"):format(q(dot))), "dot -Tsvg rejected " .. dot)
    -- the swimlane file of the one chip: both tasks, points in order, taken where the kernel ran
    -- (the chip's child in process mode, this process in thread mode)
    local lines = {}
    for line in io.lines(the_one(dir, "%.swimlane%.w0%.tsv$")) do
      local f = {}
      for v in line:gmatch("[^\t]+") do f[#f + 1] = tonumber(v) end
      assert.are.equal(9, #f, line)
      assert.is_true(f[5] <= f[6] and f[6] <= f[7] and f[7] <= f[8], line)
      assert.are.equal(0, f[9], line)
      lines[#lines + 1] = f
    end
    assert.are.equal(2, #lines)
    local here = H.getpid()
    for _, f in ipairs(lines) do
      if os.getenv("PTO_MODE") == "thread" then assert.are.equal(here, f[4]) else assert.are_not.equal(here, f[4]) end
    end
  end)
end)
