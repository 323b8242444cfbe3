-- The end-to-end walkthrough: the user builds TaskArgs over
-- shared tensors, the orchestration function forwards them to a chip task,
-- the chip writes c in shared memory, and the caller sees it after run.
local pto = require "pto"

local N = 1024
local a, b, c = pto.tensor({N}, "f32"), pto.tensor({N}, "f32"), pto.tensor({N}, "f32")
for i = 1, N do a[i] = i; b[i] = 0.5 * i end

local args = pto.TaskArgs()
args:add_tensor(a, pto.INPUT)
args:add_tensor(b, pto.INPUT)
args:add_tensor(c, pto.OUTPUT_EXISTING)   -- c already has storage: the chip fills it

local function my_orch(orch, view, cfg)
  local chip_args = pto.TaskArgs()
  for i = 1, view:tensor_count() do
    chip_args:add_tensor(view:tensor(i), i <= 2 and pto.INPUT or pto.OUTPUT_EXISTING)
  end
  return orch:submit_next_level(vector_add, chip_args, cfg)
end

local w3 <close> = pto.Worker{level = 3, chips = 1}
vector_add = w3:register(pto.chip_kernel("vector_add"))
w3:init()
local id = w3:run(my_orch, args, pto.CallConfig{block_dim = 3})

for i = 1, N do
  if c[i] ~= 1.5 * i then error(("vector_add: c[%d] = %g, expected %g"):format(i, c[i], 1.5 * i)) end
end
print(("vector_add: task %d computed c = a + b for %d elements: OK (c[%d] = %g)"):format(id, N, N, c[N]))
