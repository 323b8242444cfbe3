-- Scopes decide when heap-ring memory can be reused. Temporaries from
-- orch:alloc (or unset OUTPUTs, pto.tensor_spec) live until their scope
-- ends and their last consumer is done; the three forms of a scope below
-- all do the same, and the ring's high-water mark shows the reuse.
local pto = require "pto"

local N, ROUNDS = 4096, 64
local w <close> = pto.Worker{level = 3, chips = 2, heap_ring_size = 1 << 20}
local fill = w:register(pto.chip_kernel("fill"))
local add = w:register(pto.chip_kernel("vector_add"))
local acc = pto.tensor({N}, "f32")

-- acc += fill(v) each round, through a temporary that dies with the round's scope
local function round(orch, v)
  local tmp = orch:alloc({N}, "f32")
  orch:submit_next_level(fill, pto.args{{tmp, "out"}, scalars = {v + 0.0}})
  orch:submit_next_level(add, pto.args{{acc, "in"}, {tmp, "in"}, {acc, "out_existing"}})
end

w:run(function(orch)
  for r = 1, ROUNDS do
    if r % 3 == 0 then
      orch:scope(function() round(orch, r) end)             -- function form
    elseif r % 3 == 1 then
      local s <close> = orch:scope()                        -- to-be-closed form
      round(orch, r)
    else
      orch:scope_begin()                                    -- raw form
      round(orch, r)
      orch:scope_end()
    end
  end
  -- An automatic OUTPUT: submit allocates it, all OUTPUTs of one submit in one slab.
  orch:scope(function()
    local spec = pto.tensor_spec({N}, "f32")
    orch:submit_next_level(fill, pto.args{{spec, "out"}, scalars = {2.0}})
    assert(spec.is_set, "the submit bound the spec to heap-ring storage")
  end)
end)

local expect = ROUNDS * (ROUNDS + 1) / 2
for i = 1, N do assert(acc[i] == expect, ("acc[%d] = %g, expected %g"):format(i, acc[i], expect)) end
local st = w:stats()
local peak = 0
for _, r in ipairs(st.rings) do peak = math.max(peak, r.hwm_bytes) end
print(("scopes: %d rounds of %d KiB temporaries, heap high-water %d KiB (reused, not %d KiB): OK")
  :format(ROUNDS, N * 4 // 1024, peak // 1024, ROUNDS * N * 4 // 1024))
