-- Scopes decide when heap-ring memory can be reused. Temporaries from
-- orch:alloc (or unset OUTPUTs, pto.tensor_spec) live until their scope
-- ends and their last consumer is done; the three forms of a scope below
-- all do the same.
--
-- The rounds' temporaries add up to four times the heap ring, so the run
-- can only finish if the ring's memory is reused. The orchestrator runs
-- ahead of the chips, so it may wait for tasks to free space (back-pressure,
-- counted as the ring's stalls); that is flow control, not a failure.
local pto = require "pto"

local N, ROUNDS = 4096, 64
local RING = 256 * 1024
local w <close> = pto.Worker{level = 3, chips = 2, heap_ring_size = RING}
local fill = w:register(pto.chip_kernel("fill"))
local add = w:register(pto.chip_kernel("vector_add"))
local acc = pto.tensor({N}, "f32")

-- acc += fill(v) each round, through a temporary that dies with the round's
-- scope; the add reads acc and writes it back in place (OUTPUT_EXISTING),
-- so the next round's add must wait for it. Returns the add's task id.
local function round(orch, v)
  local tmp = orch:alloc({N}, "f32")
  orch:submit_next_level(fill, pto.args{{tmp, "out"}, scalars = {v + 0.0}})
  return orch:submit_next_level(add, pto.args{{acc, "in"}, {tmp, "in"}, {acc, "out_existing"}})
end

local function has(list, x)
  for _, v in ipairs(list) do if v == x then return true end end
  return false
end

w:run(function(orch)
  -- The first two rounds with dispatch held, so neither add can have finished
  -- when the second is submitted: its producers must name the first, the
  -- writer the OUTPUT_EXISTING registered (without it two adds could race).
  w:hold()
  local first = orch:scope(function() return round(orch, 1) end)
  local second = orch:scope(function() return round(orch, 2) end)
  local producers = orch:task(second).producers
  assert(has(producers, first), ("round 2's add (task %d) does not wait for round 1's (task %d): producers {%s}")
    :format(second, first, table.concat(producers, ", ")))
  w:release()
  for r = 3, ROUNDS do
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
local total = ROUNDS * N * 4
local ring = w:stats().rings[2]   -- ring 1: the rounds' scopes are at depth 1 (the run's own scope is 0)
assert(total > ring.capacity_bytes, "the temporaries must not fit in the ring at once, or nothing shows reuse")
assert(ring.hwm_bytes <= ring.capacity_bytes and ring.hwm_bytes < total)
print(("scopes: %d rounds of %d KiB temporaries, %d KiB in all, went through a %d KiB ring (high-water %d KiB): "
  .. "its memory was reused; the orchestrator waited %d time%s for tasks to free space"):format(ROUNDS,
  N * 4 // 1024, total // 1024, ring.capacity_bytes // 1024, ring.hwm_bytes // 1024, ring.stalls,
  ring.stalls == 1 and "" or "s"))
