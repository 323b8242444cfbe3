-- A BGEMM tile with a wrong dependency, for the walkthrough in
-- docs/repl.md: `ptolua -i examples/repl/bgemm_bug.lua`, then debug it at
-- the prompt. The bug is deliberate: add_into tags the C tile "out", so
-- the tile_adds that accumulate into it are not ordered (an OUTPUT only
-- records its writer; it does not wait for the previous one).
--
-- Globals left for the prompt: w, gemm, add, A, B, C, submit_tile, check.
-- Without -i the script runs the tile itself (see its end).
pto = require "pto"

T, KT = 4, 3                      -- one 4x4 output tile, summed over 3 k tiles
A = pto.tensor({KT, T, T}, "f32")  -- A[k] and B[k] are 4x4 tiles
B = pto.tensor({KT, T, T}, "f32")
C = pto.tensor({T, T}, "f32")
for i = 1, #A do A[i] = (i % 5) - 2 end
for i = 1, #B do B[i] = (i % 3) - 1 end

w = pto.Worker{chips = 2}
gemm = w:register(pto.chip_kernel("gemm_tile"), "gemm")
add = w:register(pto.chip_kernel("tile_add"), "add")

local function tile(t, k) return t:view{offset = k * T * T, shape = {T, T}} end

-- C = sum over k of A[k] * B[k]: a gemm into a temporary P, then C += P.
function add_into(orch, c, p)
  orch:submit_next_level(add, pto.args{{c, "out"}, {p, "in"}})   -- BUG: C accumulates, so it must be "inout"
end

function submit_tile(orch)
  for k = 0, KT - 1 do
    local p = orch:alloc({T, T}, "f32")
    orch:submit_next_level(gemm, pto.args{{tile(A, k), "in"}, {tile(B, k), "in"}, {p, "out"}})
    add_into(orch, C, p)
  end
end

-- true if C holds the product (within f32 rounding), else false and the first bad element.
function check()
  for r = 0, T - 1 do
    for c = 0, T - 1 do
      local sum = 0
      for k = 0, KT - 1 do
        for x = 0, T - 1 do sum = sum + A[k * T * T + r * T + x + 1] * B[k * T * T + x * T + c + 1] end
      end
      if math.abs(C[r * T + c + 1] - sum) > 1e-4 then return false, ("C[%d][%d] = %g, expected %g"):format(r + 1, c + 1, C[r * T + c + 1], sum) end
    end
  end
  return true
end

-- Run as a script (without -i) it computes the tile once and says whether C
-- came out right; `ptolua --check examples/repl/bgemm_bug.lua` names the
-- wrong tag at once instead (docs/check.md).
local interactive = false
for i = -1, -math.huge, -1 do
  if arg == nil or arg[i] == nil then break end
  if arg[i] == "-i" then interactive = true end
end
if not interactive then
  w:run(submit_tile)
  local ok, why = check()
  print(ok and "bgemm_bug: C is right this time (the race did not strike)" or "bgemm_bug: C is wrong: " .. why)
end
