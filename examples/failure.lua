-- A failing task: its consumers are poisoned (never run), independent work
-- still completes, Worker:run raises the first failure naming the task, its
-- callable and its worker, and the next run on the same Worker succeeds.
-- Runs in either mode (PTO_MODE=thread|process; process is the default).
local pto = require "pto"

local N = 256
local w <close> = pto.Worker{level = 3, chips = 2, num_sub_workers = 1}
local fill = w:register(pto.chip_kernel("fill"))
local fail = w:register(pto.chip_kernel("fail"))
-- The mark sub records which calls ran. In process mode it runs in a forked
-- child that cannot change this script's Lua variables, so it writes a
-- shared tensor, passed to it tagged "inout" (check mode, docs/check.md,
-- holds a task to what it declares): ran[1] counts the calls, ran[1 + k]
-- is call k's scalar.
local ran = pto.tensor({8}, "i64")
local mark = w:register(function(args)
  local r = args:tensor(2)
  r[1] = r[1] + 1                -- "inout": each mark waits for the previous one
  r[1 + r[1]] = args:scalar(1)
end, "mark")

local a, b, c = pto.tensor({N}, "f32"), pto.tensor({N}, "f32"), pto.tensor({N}, "f32")

local ok, err = pcall(w.run, w, function(orch)
  orch:submit_next_level(fail, pto.args{{a, "out"}, scalars = {7}})       -- fails with code 7
  orch:submit_sub(mark, pto.args{{a, "in"}, {ran, "inout"}, scalars = {1}})   -- poisoned: reads a
  orch:submit_next_level(fill, pto.args{{b, "out"}, scalars = {1.0}})    -- independent: runs
end)
assert(not ok, "the run must raise")
print("failure: Worker:run raised:\n  " .. err)
assert(err:find("Worker:run:", 1, true) and err:find("callable 'fail'", 1, true) and err:find("code 7", 1, true),
  "the error names the run, the callable and the root cause")
assert(ran[1] == 0, "the poisoned consumer must not run")
assert(b[1] == 1.0, "independent work completes")
assert(w:stats().tasks_failed == 2, "the failed task and its poisoned consumer")

w:run(function(orch)
  orch:submit_next_level(fill, pto.args{{c, "out"}, scalars = {3.0}})
  orch:submit_sub(mark, pto.args{{c, "in"}, {ran, "inout"}, scalars = {2}})
end)
assert(c[N] == 3.0 and ran[1] == 1 and ran[2] == 2, "the next run succeeds")
print(("failure (%s mode): poisoned consumer skipped, independent task done, next run OK"):format(w.mode))
