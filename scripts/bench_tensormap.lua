-- The TensorMap with many live writers of one storage (docs/performance.md):
-- N tasks, each the OUTPUT of its own view of one big tensor, submitted while
-- dispatch is held so that all N writers are live at once (the tiles of a big
-- matrix, the slabs of a heap ring), against the same N tasks on N separate
-- tensors (one writer per storage: the floor), in one process. Prints the
-- best of several runs of each in us per submit, and the ratio.
-- A benchmark, not a test.
--   ptolua scripts/bench_tensormap.lua [N] [runs]     (default 8000 7)
local pto = require "pto"
local N = tonumber(arg[1]) or 8000
local runs = tonumber(arg[2]) or 7

local w <close> = pto.Worker{chips = 2}
local noop = w:register(pto.chip_kernel("noop"))
w:init()
local big = pto.tensor({N, 16}, "f32")
local views, own = {}, {}
for i = 1, N do
  views[i] = big:view((i - 1) * 16, 16)
  own[i] = pto.tensor({16}, "f32")
end

local function submit_all(ts)
  w:hold()
  local t0 = pto.now()
  local orch = w:open_run()
  local f = orch:prepare_next_level(noop, {"out"})
  for i = 1, N do f(ts[i]) end
  local dt = pto.now() - t0
  w:release()
  w:close_run()
  return dt / N * 1e6
end

local best_views, best_own = math.huge, math.huge
for _ = 1, runs do   -- alternating, so load falls on both
  best_views = math.min(best_views, submit_all(views))
  best_own = math.min(best_own, submit_all(own))
end
print(("%s mode, %d live writers: one storage %.3f us per submit, %d storages %.3f us per submit: %.2fx"):format(
  w.mode, N, best_views, N, best_own, best_views / best_own))
