-- Process mode against thread mode, measured in the same run, each pair of
-- Workers side by side with their runs alternating: the engine benchmark's
-- four DAG shapes with no-op chip kernels and no-op Lua subs, then the
-- marginal per-task cost and the fixed cost of one run with one sub child,
-- then the README's main job. A benchmark, not a test. Run it through
-- scripts/bench_process.sh.
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

-- A Worker in mode for shape on leaf kind ("chips" or "subs"), warmed up,
-- and a function that times one run of it: seconds per task.
local function shape_worker(mode, kind, shape, n)
  local w = pto.Worker{mode = mode, chips = kind == "chips" and 2 or 0,
                       num_sub_workers = kind == "subs" and 2 or 0, heap_ring_size = 16 << 20}
  local h = kind == "chips" and w:register(pto.chip_kernel("noop")) or w:register(function() end, "noop")
  local submit = kind == "chips" and submit_chip or submit_sub
  local t = {}
  for i = 1, 10 do t[i] = pto.tensor({16}, "f32") end
  w:init()
  local function job(orch) return shape[2](orch, h, submit, n, t) end
  -- Steady state: a fresh process-mode Worker's first run pays a
  -- copy-on-write fault for every page the parent writes after the fork
  -- (measured apart below, "first 100 after init").
  w:run(job)
  return w, function()
    local t0 = pto.now()
    local count = w:run(job)
    return (pto.now() - t0) / count
  end
end

-- Best seconds per task of shape on kind in thread and in process mode.
-- The two Workers live side by side and their runs alternate, so both
-- modes see the same machine: this VM's speed drifts between (and within)
-- invocations by more than the 1.5x the ratio is judged against, and
-- timing one mode after the other put the drift into the ratio.
local function measure_pair(kind, shape, n, reps)
  local wt <close>, run_t = shape_worker("thread", kind, shape, n)
  local wp <close>, run_p = shape_worker("process", kind, shape, n)
  local th, pr = math.huge, math.huge
  for _ = 1, reps do
    th = math.min(th, run_t())
    pr = math.min(pr, run_p())
  end
  return th, pr
end

local N = math.floor(20000 * scale)
-- Best of 10: the best of 3 moved a row's ratio by up to 2x between
-- invocations (W3 chips 0.87-2.03x; best of 10: 1.11-1.31x); a run is
-- 5-30 ms, so the 10 cost a few seconds in all.
local REPS = math.max(3, math.floor(10 * scale))
print(("bench_process: %d tasks per shape, thread and process runs alternating, best of %d each after a warm-up run;"
  .. " us/task (lower is better)"):format(N, REPS))
print(("%-20s %-6s %10s %10s %8s"):format("shape", "leaf", "thread", "process", "proc/thr"))
for _, shape in ipairs(SHAPES) do
  for _, kind in ipairs({"chips", "subs"}) do
    local th, pr = measure_pair(kind, shape, N, REPS)
    print(("%-20s %-6s %10.2f %10.2f %7.2fx"):format(shape[1], kind, th * 1e6, pr * 1e6, pr / th))
  end
end

-- (a) one sub child: T(n) = fixed + n * marginal, from back-to-back runs of
-- 1 and M tasks. A new Worker's first runs are slower: after the fork, every
-- page the parent writes is copied once (the zygote and the children share
-- them), so those runs are reported apart and the figures are taken after.
-- Both modes' Workers live side by side and measure in alternating rounds,
-- each round a fit from the medians of 200 one-task and 21 M-task runs;
-- the figures are the medians over the rounds. A single round moved
-- between about 2 and 6 us of fixed cost from one second to the next on
-- this VM (both modes, any build), so one round read either.
local function one_sub(mode)
  local w = pto.Worker{mode = mode, num_sub_workers = 1}
  local h = w:register(function() end, "noop")
  w:init()
  local function timed(n, runs)
    local xs = {}
    for _ = 1, runs do
      local t0 = pto.now()
      w:run(function(orch) for _ = 1, n do orch:submit_sub(h) end end)
      xs[#xs + 1] = pto.now() - t0
    end
    return median(xs)
  end
  local M = math.floor(2000 * scale)
  local first = timed(1, 100)
  timed(M, 5)
  return w, first, function()
    local t1, tm = timed(1, 200), timed(M, 21)
    local marginal = (tm - t1) / (M - 1)
    return marginal, t1 - marginal
  end
end
collectgarbage("collect")
print()
print(("%-36s %10s %10s %9s"):format("one sub child, no-op", "thread", "process", "proc/thr"))
local mt, ft, rt, mp, fp, rp
do
  local wt <close>, first_t, round_t = one_sub("thread")
  local wp <close>, first_p, round_p = one_sub("process")
  rt, rp = first_t, first_p
  local xs = {mt = {}, ft = {}, mp = {}, fp = {}}
  for _ = 1, math.max(3, math.floor(5 * scale)) do
    local m, f = round_t()
    xs.mt[#xs.mt + 1], xs.ft[#xs.ft + 1] = m, f
    m, f = round_p()
    xs.mp[#xs.mp + 1], xs.fp[#xs.fp + 1] = m, f
  end
  mt, ft, mp, fp = median(xs.mt), median(xs.ft), median(xs.mp), median(xs.fp)
end
print(("%-36s %10.2f %10.2f %8.2fx  (design reference: 8.08 us)"):format("marginal cost per task (us)", mt * 1e6,
  mp * 1e6, mp / mt))
print(("%-36s %10.2f %10.2f %8.2fx  (design reference: 43.3 us)"):format("fixed cost per run (us)", ft * 1e6,
  fp * 1e6, fp / ft))
print(("%-36s %10.2f %10.2f %8.2fx"):format("one-task run, first 100 after init", rt * 1e6, rp * 1e6, rp / rt))

-- (b) The README's main job, examples/bgemm.lua at its default size (4 x 8 x
-- 8 x 8 tiles of 64 x 64 f32, 2 chips), in steady state: a thread-mode and
-- a process-mode Worker side by side, their runs alternating after a
-- warm-up run each; the median of each mode's runs.
local function bgemm_worker(mode)
  local batch, MT, NT, KT, T = 4, 8, 8, 8, 64
  local TT = T * T
  local A = pto.tensor({batch, MT, KT, T, T}, "f32")
  local B = pto.tensor({batch, KT, NT, T, T}, "f32")
  local C = pto.tensor({batch, MT, NT, T, T}, "f32")
  local function tile(t, R, Cn, b, i, j)
    return t:view{offset = ((b * R + i) * Cn + j) * TT, shape = {T, T}}
  end
  local w = pto.Worker{mode = mode, chips = 2, heap_ring_size = 64 << 20}
  local gemm = w:register(pto.chip_kernel("gemm_tile"))
  local add = w:register(pto.chip_kernel("tile_add"))
  w:init()
  local function job(orch)
    for b = 0, batch - 1 do
      orch:scope(function()
        for i = 0, MT - 1 do
          for j = 0, NT - 1 do
            local c = tile(C, MT, NT, b, i, j)
            local s <close> = orch:scope()
            for k = 0, KT - 1 do
              local p = orch:alloc({T, T}, "f32")
              orch:submit_next_level(gemm, pto.args{{tile(A, MT, KT, b, i, k), "in"},
                                                    {tile(B, KT, NT, b, k, j), "in"}, {p, "out"}})
              orch:submit_next_level(add, pto.args{{c, "inout"}, {p, "in"}})
            end
          end
        end
      end)
    end
  end
  w:run(job)
  return w, function()
    local t0 = pto.now()
    w:run(job)
    return pto.now() - t0
  end
end
local reps = math.max(5, math.floor(9 * scale))
local bt, bp
do
  local wt <close>, run_t = bgemm_worker("thread")
  local wp <close>, run_p = bgemm_worker("process")
  local xt, xp = {}, {}
  for _ = 1, reps do
    xt[#xt + 1] = run_t()
    xp[#xp + 1] = run_p()
  end
  bt, bp = median(xt), median(xp)
end
print(("%-36s %10.2f %10.2f %8.2fx"):format("examples/bgemm.lua default, ms/run", bt * 1e3, bp * 1e3, bp / bt))
