-- Tasks on one Worker child overlap (docs/performance.md, "Tasks on one
-- Worker child"): an L4 over one L3 with 2 chips runs N tasks, each an L3
-- run of a chain of 3 spin_us tasks, so one L3 run alone leaves a chip idle.
-- "chained": each L4 task also takes one shared tensor INOUT, so it waits
-- for the one before (the L3 runs them one at a time: the baseline).
-- "independent": nothing orders them, so the L3 begins the next while one
-- runs and its chips fill. The two alternate, `rounds` times each.
--   ptolua bench_levels.lua mode rounds n us
local pto = require "pto"
local mode, rounds, N, US = arg[1] or "process", tonumber(arg[2] or 5), tonumber(arg[3] or 100), tonumber(arg[4] or 200)
local l3 = pto.Worker{level = 3, chips = 2, mode = mode}
local spin = l3:register(pto.chip_kernel("spin_us"))
local w4 = pto.Worker{level = 4, mode = mode}
local chain = w4:register(function(orch, a)
  for _ = 1, 3 do orch:submit_next_level(spin, pto.args{{a:tensor(1), "inout"}, scalars = {US}}) end
end)
w4:add_worker(l3)
w4:init()
local ts, shared = {}, pto.tensor({4})
for i = 1, N do ts[i] = pto.tensor({4}) end
local function once(chained)
  local t0 = pto.now()
  w4:run(function(orch)
    for i = 1, N do
      local args = chained and pto.args{{ts[i], "inout"}, {shared, "inout"}} or pto.args{{ts[i], "inout"}}
      orch:submit_next_level(chain, args)
    end
  end)
  return (pto.now() - t0) * 1e6 / N
end
once(false)   -- warm up: the children's first runs
for _ = 1, rounds do
  for _, kind in ipairs{"chained", "independent"} do print(mode, kind, ("%.1f"):format(once(kind == "chained"))) end
end
w4:close()
