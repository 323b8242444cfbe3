-- BGEMM (batched GEMM as a task graph): C[b] = A[b] * B[b] for a batch of
-- matrices stored as tiles. For every output tile and every k a gemm_tile
-- task writes a temporary P, and a tile_add task adds P into the C tile;
-- the C tile's INOUT chain orders the adds, the temporaries are reclaimed
-- as their scope ends and their consumer is done.
--
-- The loop is written in the fast form for hot loops (docs/lua.md,
-- "Submitting in hot loops"): the tile views are made once, before the
-- runs; each kernel is prepared once per run (orch:prepare_next_level), so
-- a submit is one call with the tensors; P is one pto.temp that every gemm
-- moves to new heap-ring memory. The same DAG with pto.args, a view per
-- tile and orch:alloc per temporary is in docs/lua.md; it infers the same
-- dependencies and costs about 0.8 us more per task (3-4 times the C API's
-- cost per task against 1.0-1.3 times, docs/performance.md).
--
-- usage: ptolua examples/bgemm.lua [batch m n k tile chips runs]
--   batch x m x n x k tiles of tile x tile f32; default 4 8 8 8 64 2 5.
--   It runs the DAG `runs` times and reports the first run (cold: children
--   fault their memory in, rings grow) and the best run (steady state).
local pto = require "pto"

local function arg_int(i, default, name)
  local v = arg[i]
  if v == nil then return default end
  local n = math.tointeger(tonumber(v))
  if not n or n < 1 then
    io.stderr:write(("bgemm: %s must be a positive integer (got %q)\n"):format(name, v))
    os.exit(2)
  end
  return n
end

local batch = arg_int(1, 4, "batch")
local MT, NT, KT = arg_int(2, 8, "m"), arg_int(3, 8, "n"), arg_int(4, 8, "k")
local T = arg_int(5, 64, "tile")
local chips = arg_int(6, 2, "chips")
local runs = arg_int(7, 5, "runs")
local TT = T * T

-- Tiled storage: tile (b, i, j) of a matrix with R x C tiles starts at
-- element ((b * R + i) * C + j) * T*T and is a row-major T x T block.
local A = pto.tensor({batch, MT, KT, T, T}, "f32")
local B = pto.tensor({batch, KT, NT, T, T}, "f32")
local C = pto.tensor({batch, MT, NT, T, T}, "f32")

-- tiles[b][i][j]: the view of tile (b, i, j), made once and reused by every run.
local function tiles(t, R, Cn)
  local out = {}
  for b = 0, batch - 1 do
    out[b] = {}
    for i = 0, R - 1 do
      out[b][i] = {}
      for j = 0, Cn - 1 do out[b][i][j] = t:view(((b * R + i) * Cn + j) * TT, T, T) end
    end
  end
  return out
end
local At, Bt, Ct = tiles(A, MT, KT), tiles(B, KT, NT), tiles(C, MT, NT)
local P = pto.temp({T, T}, "f32")

-- Small exact values (multiples of 1/8 in [-1, 1]) keep f32 sums exact
-- enough to compare closely with a double-precision reference.
local seed = 12345
local function rand()
  seed = (seed * 1103515245 + 12345) % 2147483648
  return (seed % 17 - 8) / 8
end
for i = 1, #A do A[i] = rand() end
for i = 1, #B do B[i] = rand() end

local w <close> = pto.Worker{level = 3, chips = chips, heap_ring_size = 64 << 20}
local gemm = w:register(pto.chip_kernel("gemm_tile"))
local add = w:register(pto.chip_kernel("tile_add"))
w:init()

local function bgemm(orch)
  local gemm_tile = orch:prepare_next_level(gemm, {"in", "in", "out"})
  local tile_add = orch:prepare_next_level(add, {"inout", "in"})
  for b = 0, batch - 1 do
    local Ab, Bb, Cb = At[b], Bt[b], Ct[b]
    for i = 0, MT - 1 do
      for j = 0, NT - 1 do
        local c = Cb[i][j]
        orch:scope_begin()   -- each P lives until this scope ends and its tile_add is done
        for k = 0, KT - 1 do
          gemm_tile(Ab[i][k], Bb[k][j], P)
          tile_add(c, P)
        end
        orch:scope_end()
      end
    end
  end
end

-- Each run recomputes C from zero: the adds accumulate into it.
local first, best = nil, math.huge
for _ = 1, runs do
  C:fill(0)
  local t0 = pto.now()
  w:run(bgemm)
  local secs = pto.now() - t0
  first = first or secs
  best = math.min(best, secs)
end

-- Reference: every element when the problem is small, else a sample.
local function at(t, R, Cn, b, row, col)   -- element (row, col) of matrix b, 1-based flat index
  local i, r = row // T, row % T
  local j, c = col // T, col % T
  return ((b * R + i) * Cn + j) * TT + r * T + c + 1
end
local rows, cols, inner = MT * T, NT * T, KT * T
local checked, worst = 0, 0
local function check(b, row, col)
  local sum = 0.0
  for kk = 0, inner - 1 do sum = sum + A[at(A, MT, KT, b, row, kk)] * B[at(B, KT, NT, b, kk, col)] end
  local got = C[at(C, MT, NT, b, row, col)]
  local err = math.abs(got - sum) / math.max(1, math.abs(sum))
  if err > worst then worst = err end
  if err > 1e-4 then
    error(("bgemm: C[%d][%d][%d] = %g, expected %g"):format(b + 1, row + 1, col + 1, got, sum))
  end
  checked = checked + 1
end
if batch * rows * cols * inner <= 8e6 then
  for b = 0, batch - 1 do for row = 0, rows - 1 do for col = 0, cols - 1 do check(b, row, col) end end end
else
  for _ = 1, 2000 do
    rand()
    check(seed % batch, (seed // 3) % rows, (seed // 5) % cols)
  end
end

local tasks = 2 * batch * MT * NT * KT   -- gemm_tile + tile_add per (b, i, j, k)
local flops = 2.0 * batch * rows * cols * inner
print(("bgemm: batch %d, %dx%dx%d tiles of %dx%d f32 on %d chips (%s mode): %d tasks per run")
  :format(batch, MT, NT, KT, T, T, chips, w.mode, tasks))
print(("bgemm: first run %.3f s = %.0f tasks/s, %.2f GFLOP/s")
  :format(first, tasks / first, flops / first / 1e9))
print(("bgemm: best of %d runs %.3f s = %.0f tasks/s, %.2f GFLOP/s")
  :format(runs, best, tasks / best, flops / best / 1e9))
print(("bgemm: result OK (%d elements checked against the reference, max relative error %.2g)"):format(checked, worst))
w:print_stats()
