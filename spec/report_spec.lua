-- report_spec.lua: the flow-control report (w:stats_report, w:print_stats)
-- and the deadlock message's sizing advice. The report is short when
-- nothing stalled, uses one unit per column, gives each piece of advice
-- once, and the deadlock's advice yields a ring size that works at once.
local pto = require "pto"
local H = require "helpers"

local function lines(s)
  local n = 0
  for _ in s:gmatch("[^\n]*\n") do n = n + 1 end
  return n
end

-- The rows of the ring table: {ring, capacity, high-water, peak, stalls}.
local function ring_rows(report)
  local rows = {}
  for r, cap, hwm, peak, stalls in report:gmatch("\n  (%d)%s+([%d.]+)%s+([%d.]+)%s+([%d.]+)%%%s+(%d+)") do
    rows[#rows + 1] = {tonumber(r), tonumber(cap), tonumber(hwm), tonumber(peak), tonumber(stalls)}
  end
  return rows
end

local function fill_run(w)
  local h = w:register(pto.chip_kernel("fill"))
  w:run(function(orch) orch:submit_next_level(h, pto.args{{pto.tensor{4}, "out"}, scalars = {1.0}}) end)
end

describe("the flow-control report", function()
  it("is short when nothing stalled: no rows for unused rings, singular counts", function()
    local w <close> = pto.Worker{chips = 1}
    fill_run(w)
    local report = w:stats_report()
    assert.truthy(report:find("Tasks: 1 submitted, 1 completed, 0 failed; 0 allocs; 1 run\n", 1, true), report)
    assert.truthy(report:find("Heap Rings: none was used", 1, true), report)
    assert.truthy(report:find("none: no resource stalled", 1, true), report)
    assert.is_true(lines(report) <= 12, report)
    assert.equal(0, #ring_rows(report))
  end)

  it("lists every ring with {full = true}", function()
    local w <close> = pto.Worker{chips = 1, heap_ring_size = 1 << 20}
    fill_run(w)
    local report = w:stats_report{full = true}
    local rows = ring_rows(report)
    assert.equal(4, #rows, report)
    assert.truthy(report:find("capacity MiB  high-water B ", 1, true), report)
    for i, r in ipairs(rows) do assert.same({i - 1, 1, 0, 0, 0}, r) end
  end)

  it("shows a stalled ring once, in one unit per column, with one piece of advice", function()
    local w <close> = pto.Worker{chips = 1, heap_ring_size = 64 * 1024}
    local ok = pcall(w.run, w, function(orch) for _ = 1, 100 do orch:alloc({1024}, "f32") end end)
    assert.is_false(ok)
    local report = w:stats_report()
    local rows = ring_rows(report)
    assert.equal(1, #rows, report)
    assert.same({0, 64, 64, 100, 1}, rows[1])
    assert.truthy(report:find("capacity KiB  high%-water KiB"), report)
    assert.is_nil(report:find(" MB", 1, true), report)
    local _, advice = report:gsub("%[!%]", "")
    assert.equal(1, advice, report)
    assert.truthy(report:find("Increase heap_ring_size (now 64 KiB per ring)", 1, true), report)
  end)

  it("gives the last run's time, as w:profile() measures it, and none before a run ended", function()
    local w <close> = pto.Worker{chips = 2}
    local sl = w:register(pto.chip_kernel("sleep_us"))
    w:init()
    assert.is_nil(w:stats_report():find("Time (", 1, true))
    w:run(function(orch) for _ = 1, 4 do orch:submit_next_level(sl, pto.args{scalars = {20000}}) end end)
    local report, p = w:stats_report(), w:profile()
    local run, ms, orch, exec, busy = report:match(
      "\nTime %(run (%d+)%): ([%d.]+) ms from start to drained; orchestration ([%d.]+) ms, execution ([%d.]+) ms; "
      .. "workers busy (%d+)%%\n")
    assert.truthy(run, report)
    assert.are.equal(p.run, tonumber(run))
    assert.are.equal(("%.3f"):format(p.makespan_ms), ms)
    assert.are.equal(("%.3f"):format(p.orchestration_ms), orch)
    assert.are.equal(("%.3f"):format(p.execution_ms), exec)
    assert.are.equal(("%.0f"):format(p.busy_pct), busy)
    assert.is_true(tonumber(ms) >= 40, report)   -- four 20 ms tasks on two chips
    assert.truthy(report:find("Time %(run 1%).*\n\nHeap Rings"), report)   -- after the counts, before the rings
  end)

  it("names the scope whose allocations filled a stalled ring, and where it opened", function()
    local src = debug.getinfo(1, "S").short_src
    local w <close> = pto.Worker{chips = 1, heap_ring_size = 64 * 1024}
    local sl = w:register(pto.chip_kernel("sleep_us"))
    local line
    w:run(function(orch)
      for _ = 1, 12 do
        line = debug.getinfo(1, "l").currentline + 1   -- the next line opens the scope
        orch:scope(function()
          local t = orch:alloc({4096}, "f32")   -- 16 KiB of a 64 KiB ring, held until the task ran
          orch:submit_next_level(sl, pto.args{{t, "in"}, scalars = {3000}})
        end)
      end
    end)
    local report = w:stats_report()
    assert.truthy(report:find(("or end the scope opened at %s:%d (depth 1) sooner."):format(src, line), 1, true),
                  report)
  end)

  it("advises a ring size for a stall, says why, and a run with that size does not stall", function()
    -- 12 scopes each hold 16 KiB until their 20 ms task ran: the orchestrator
    -- runs ahead of the one chip and waits on a 64 KiB ring
    local function scopes(size)
      local w <close> = pto.Worker{chips = 1, heap_ring_size = size}
      local sl = w:register(pto.chip_kernel("sleep_us"))
      w:run(function(orch)
        for _ = 1, 12 do
          orch:scope(function()
            orch:submit_next_level(sl, pto.args{{orch:alloc({4096}, "f32"), "in"}, scalars = {20000}})
          end)
        end
      end)
      return w:stats_report(), w:stats().rings[2]
    end
    local report, ring = scopes(64 * 1024)
    assert.is_true(ring.stalls > 0, report)
    local n, unit = report:match("Increase heap_ring_size %(now 64 KiB per ring%) to (%d+) (%a+), or end the scope")
    assert.truthy(n, report)
    local size = tonumber(n) * ({ KiB = 1 << 10, MiB = 1 << 20, GiB = 1 << 30 })[unit]
    assert.truthy(report:find("Why: the 64 KiB it had plus the ", 1, true), report)
    assert.truthy(report:find("rounded up to a power of two", 1, true), report)
    assert.are.equal(0, size & (size - 1))                -- a power of two
    assert.is_true(size >= ring.need_bytes, report)
    local _, advice = report:gsub("%[!%]", "")
    assert.equal(1, advice, report)                       -- printed once
    local report2, ring2 = scopes(size)
    assert.are.equal(0, ring2.stalls, report2)
    assert.truthy(report2:find("none: no resource stalled", 1, true), report2)
  end)

  it("checks its options", function()
    local w <close> = pto.Worker{chips = 1}
    H.assert_error(function() w:stats_report{fulll = true} end, "Worker:stats_report: ", "unknown field 'fulll'")
    H.assert_error(function() w:print_stats{full = 1} end, "Worker:print_stats: ", "full must be a boolean")
    H.assert_error(function() w:stats_report(true) end, "Worker:stats_report: ", "must be a table")
  end)
end)

describe("the deadlock message", function()
  local function run_allocs(size)
    local w <close> = pto.Worker{chips = 1, heap_ring_size = size}
    local ok, err = pcall(w.run, w, function(orch) for _ = 1, 100 do orch:alloc({1024}, "f32") end end)
    return ok, err, w:stats().rings[1].hwm_bytes
  end

  it("gives advice that yields a ring size that works the first time", function()
    local ok, err = run_allocs(64 * 1024)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("deadlock", 1, true), err)
    assert.truthy(tostring(err):find("needs more than 69632", 1, true), err)
    assert.is_nil(tostring(err):find("recommended", 1, true), err)  -- the old guess deadlocked again
    assert.truthy(tostring(err):find("high-water mark", 1, true), err)
    -- follow it: measure with the default ring, round up to a power of two
    local ok2, err2, hwm = run_allocs(nil)
    assert.is_true(ok2, err2)
    local size = 1
    while size < hwm do size = size * 2 end
    local ok3, err3 = run_allocs(size)
    assert.is_true(ok3, err3)
  end)

  it("names the scope that holds the memory: its depth and where it was opened, in each form", function()
    local src = debug.getinfo(1, "S").short_src
    local w <close> = pto.Worker{chips = 1, heap_ring_size = 64 * 1024}
    local line
    local ok, err = pcall(w.run, w, function(orch)
      orch:scope(function()
        line = debug.getinfo(1, "l").currentline - 1
        for _ = 1, 100 do orch:alloc({1024}, "f32") end
      end)
    end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find(("held by the scope at depth 1 opened at %s:%d, still open"):format(src, line),
                                     1, true), err)
    ok, err = pcall(w.run, w, function(orch)
      orch:scope_begin()
      do
        line = debug.getinfo(1, "l").currentline + 1   -- the next line opens the scope
        local inner <close> = orch:scope()
        for _ = 1, 100 do orch:alloc({1024}, "f32") end
      end
    end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find(("held by the scope at depth 2 opened at %s:%d, still open"):format(src, line),
                                     1, true), err)
    -- in the run's outer scope, no scope to name but that one
    ok, err = pcall(w.run, w, function(orch) for _ = 1, 100 do orch:alloc({1024}, "f32") end end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("held by the run's outer scope", 1, true), err)
  end)
end)
