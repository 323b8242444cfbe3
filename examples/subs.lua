-- Lua sub callables: fn(args) runs on a sub worker with a TaskArgs whose
-- tensors alias the submitted storage. One sub produces data, chips
-- transform it, another sub checks it; the DAG orders them by the tags.
-- In process mode (the default) each sub worker is a forked child with its
-- own copy of the Lua state: a sub reports back through shared tensors
-- (its args, or tensors created before init), never through Lua variables.
local pto = require "pto"

local N = 1000
local w <close> = pto.Worker{level = 3, chips = 2, num_sub_workers = 2}

local produce = w:register(function(args)
  local t, k = args:tensor(1), args:scalar(1)
  for i = 1, #t do t[i] = k * i end
end, "produce")
local scale = w:register(pto.chip_kernel("vector_scale"))
local checked = pto.tensor({4}, "i32")   -- checked[j] = 1 once check j passed (shared with the children)
local check = w:register(function(args)
  local t, expect, done = args:tensor(1), args:scalar_float(1), args:tensor(2)
  for i = 1, #t do
    if t[i] ~= expect * i then error(("check: t[%d] = %g, expected %g"):format(i, t[i], expect * i)) end
  end
  done[1] = 1
end, "check")

local x, y = {}, {}
for j = 1, 4 do x[j], y[j] = pto.tensor({N}, "f64"), pto.tensor({N}, "f64") end

w:run(function(orch)
  for j = 1, 4 do
    orch:submit_sub(produce, pto.args{{x[j], "out"}, scalars = {j}})
    orch:submit_next_level(scale, pto.args{{x[j], "in"}, {y[j], "out"}, scalars = {0.5}})
    -- checked[j] as the check's own OUTPUT (a one-element view): a task writes only what it declares
    orch:submit_sub(check, pto.args{{y[j], "in"}, {checked:view{offset = j - 1, shape = {1}}, "out"}, scalars = {0.5 * j}})
  end
end)
for j = 1, 4 do assert(checked[j] == 1, ("check %d did not run"):format(j)) end
for j = 1, 4 do assert(y[j][N] == 0.5 * j * N) end
print(("subs (%s mode): 4 producer subs, 4 chip scales, 4 checking subs: OK (y[4][%d] = %g)"):format(w.mode, N, y[4][N]))
