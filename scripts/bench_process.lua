-- Process mode against thread mode, measured in the same run: the engine
-- benchmark's four DAG shapes with no-op chip kernels and no-op Lua subs,
-- then the marginal per-task cost and the fixed cost of one run with one
-- sub child. A benchmark, not a test. Run it through scripts/bench_process.sh.
--   ptolua scripts/bench_process.lua [scale]   (scale 1 = default sizes)
local pto = require "pto"
local scale = tonumber(arg[1]) or 1

local function median(xs)
  table.sort(xs)
  return xs[(#xs + 1) // 2]
end

local SHAPES = {
  {"W1 independent", function(orch, h, submit, n)
    for _ = 1, n do submit(orch, h, pto.TaskArgs()) end
    return n
  end},
  {"W2 chain", function(orch, h, submit, n, t)
    local a = pto.args{{t[1], "inout"}}
    for _ = 1, n do submit(orch, h, a) end
    return n
  end},
  {"W3 fan 1->8->1", function(orch, h, submit, n, t)
    local rounds = n // 10
    local head, tail = pto.args{{t[1], "out"}}, {{t[1], "in"}}
    local mids = {}
    for i = 1, 8 do
      mids[i] = pto.args{{t[1], "in"}, {t[i + 1], "out"}}
      tail[#tail + 1] = {t[i + 1], "in"}
    end
    tail[#tail + 1] = {t[10], "out"}
    local join = pto.args(tail)
    for _ = 1, rounds do
      submit(orch, h, head)
      for i = 1, 8 do submit(orch, h, mids[i]) end
      submit(orch, h, join)
    end
    return rounds * 10
  end},
  {"W4 bgemm 4^4 tiles", function(orch, h, submit, n, t)
    local reps, count = math.max(1, n // 512), 0
    for _ = 1, reps do
      for b = 1, 4 do
        orch:scope(function()
          for m = 1, 4 do for nn = 1, 4 do
            local s <close> = orch:scope()
            for k = 1, 4 do
              local p = orch:alloc({16}, "f32")
              submit(orch, h, pto.args{{t[(b + k) % 10 + 1], "in"}, {p, "out"}})
              submit(orch, h, pto.args{{t[(m * 4 + nn) % 10 + 1], "inout"}, {p, "in"}})
              count = count + 2
            end
          end end
        end)
      end
    end
    return count
  end},
}

local function submit_chip(orch, h, a) orch:submit_next_level(h, a) end
local function submit_sub(orch, h, a) orch:submit_sub(h, a) end

-- Seconds per task of shape in mode on leaf kind ("chips" or "subs").
local function measure(mode, kind, shape, n, reps)
  local w <close> = pto.Worker{mode = mode, chips = kind == "chips" and 2 or 0,
                              num_sub_workers = kind == "subs" and 2 or 0, heap_ring_size = 16 << 20}
  local h = kind == "chips" and w:register(pto.chip_kernel("noop")) or w:register(function() end, "noop")
  local submit = kind == "chips" and submit_chip or submit_sub
  local t = {}
  for i = 1, 10 do t[i] = pto.tensor({16}, "f32") end
  w:init()
  local best = math.huge
  for _ = 1, reps do
    local t0 = pto.now()
    local count = w:run(function(orch) return shape[2](orch, h, submit, n, t) end)
    best = math.min(best, (pto.now() - t0) / count)
  end
  return best
end

local N = math.floor(20000 * scale)
print(("bench_process: %d tasks per shape, best of 3 runs; us/task (lower is better)"):format(N))
print(("%-20s %-6s %10s %10s %8s"):format("shape", "leaf", "thread", "process", "proc/thr"))
for _, shape in ipairs(SHAPES) do
  for _, kind in ipairs({"chips", "subs"}) do
    local th = measure("thread", kind, shape, N, 3)
    local pr = measure("process", kind, shape, N, 3)
    print(("%-20s %-6s %10.2f %10.2f %7.2fx"):format(shape[1], kind, th * 1e6, pr * 1e6, pr / th))
  end
end

-- (a) one sub child: T(n) = fixed + n * marginal, from runs of 1 and M tasks.
local function one_sub(mode)
  local w <close> = pto.Worker{mode = mode, num_sub_workers = 1}
  local h = w:register(function() end, "noop")
  w:init()
  local function timed(n)
    local xs = {}
    for i = 1, 101 do
      local t0 = pto.now()
      w:run(function(orch) for _ = 1, n do orch:submit_sub(h) end end)
      if i > 1 then xs[#xs + 1] = pto.now() - t0 end   -- the first run warms up
    end
    return median(xs)
  end
  local M = math.floor(2000 * scale)
  local t1, tm = timed(1), timed(M)
  local marginal = (tm - t1) / (M - 1)
  return marginal, t1 - marginal
end
print()
print(("%-36s %10s %10s"):format("one sub child, no-op", "thread", "process"))
local mt, ft = one_sub("thread")
local mp, fp = one_sub("process")
print(("%-36s %10.2f %10.2f   (design reference: 8.08 us)"):format("marginal cost per task (us)", mt * 1e6, mp * 1e6))
print(("%-36s %10.2f %10.2f   (design reference: 43.3 us)"):format("fixed cost per run (us)", ft * 1e6, fp * 1e6))
