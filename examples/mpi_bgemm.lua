-- BGEMM across hosts: an L4 on MPI rank 0 spreads the batches over two L3
-- Workers with two chips each that live on ranks 1 and 2 (docs/mpi.md).
-- This is examples/l4_bgemm.lua with `rank = i` added to each L3: every
-- rank runs the script up to w4:init(); ranks 1 and 2 then host their L3
-- and serve its tasks until rank 0 closes the L4. A, B and each batch's C
-- travel by their tags (in: to the rank, inout: there and back).
-- Afterwards rank 0 runs the same BGEMM over two local L3s and checks that
-- both results are bit for bit equal.
--
-- usage: mpirun -np 3 ptolua examples/mpi_bgemm.lua [batch m n k tile]
--   batch x m x n x k tiles of tile x tile f32; default 8 4 4 4 64.
--   Started without mpirun (fewer than 3 ranks), both runs use local L3s.
local pto = require "pto"

local function arg_int(i, default, name)
  local v = arg[i]
  if v == nil then return default end
  local n = math.tointeger(tonumber(v))
  if not n or n < 1 then
    io.stderr:write(("mpi_bgemm: %s must be a positive integer (got %q)\n"):format(name, v))
    os.exit(2)
  end
  return n
end

local batch = arg_int(1, 8, "batch")
local MT, NT, KT = arg_int(2, 4, "m"), arg_int(3, 4, "n"), arg_int(4, 4, "k")
local T = arg_int(5, 64, "tile")
local TT = T * T
local A_SZ, B_SZ, C_SZ = MT * KT * TT, KT * NT * TT, MT * NT * TT

-- One matrix per batch, stored as row-major T x T tiles: tile (i, j) of a
-- matrix with Cn tile columns starts at element (i * Cn + j) * T*T.
local A = pto.tensor({batch * A_SZ}, "f32")
local B = pto.tensor({batch * B_SZ}, "f32")
local C = pto.tensor({batch * C_SZ}, "f32")
local seed = 12345
local function rand()
  seed = (seed * 1103515245 + 12345) % 2147483648
  return (seed % 17 - 8) / 8
end
for i = 1, #A do A[i] = rand() end
for i = 1, #B do B[i] = rand() end

local remote = pto.mpi.available() and pto.mpi.size() >= 3

-- The level-3 Workers, on ranks 1 and 2 (or local). Kernel handles are per
-- Worker; the orchestration function below finds its own through orch:worker().
local kernels = {}
local function level3s(ranked)
  local l3s = {}
  for i = 1, 2 do
    local w3 = pto.Worker{level = 3, chips = 2, heap_ring_size = 64 << 20, rank = ranked and i or nil}
    kernels[w3] = {gemm = w3:register(pto.chip_kernel("gemm_tile")), add = w3:register(pto.chip_kernel("tile_add"))}
    l3s[i] = w3
  end
  return l3s
end

-- Runs on an L3 child: one batch, args = A_b (in), B_b (in), C_b (inout).
local function one_batch(orch, args)
  local k = kernels[orch:worker()]
  local a, b, c = args:tensor(1), args:tensor(2), args:tensor(3)
  local function tile(t, cols, i, j) return t:view{offset = (i * cols + j) * TT, shape = {T, T}} end
  for i = 0, MT - 1 do
    for j = 0, NT - 1 do
      local ct = tile(c, NT, i, j)
      local s <close> = orch:scope()
      for kk = 0, KT - 1 do
        local p = orch:alloc({T, T}, "f32")
        orch:submit_next_level(k.gemm, pto.args{{tile(a, KT, i, kk), "in"}, {tile(b, NT, kk, j), "in"}, {p, "out"}})
        orch:submit_next_level(k.add, pto.args{{ct, "inout"}, {p, "in"}})
      end
    end
  end
end

-- One BGEMM over an L4 with the given L3s; returns the L4 (open), init and run seconds.
local function bgemm(l3s)
  local w4 = pto.Worker{level = 4}
  local batch_fn = w4:register(one_batch, "one_batch")
  for i = 1, 2 do w4:add_worker(l3s[i]) end
  local t_init = pto.now()
  w4:init()
  t_init = pto.now() - t_init
  for i = 1, #C do C[i] = 0 end
  local t0 = pto.now()
  w4:run(function(orch)
    for b = 0, batch - 1 do
      orch:submit_next_level(batch_fn, pto.args{{A:view{offset = b * A_SZ, shape = {A_SZ}}, "in"},
                                                {B:view{offset = b * B_SZ, shape = {B_SZ}}, "in"},
                                                {C:view{offset = b * C_SZ, shape = {C_SZ}}, "inout"}},
                             pto.CallConfig())
    end
  end)
  return w4, t_init, pto.now() - t0
end

local w4 <close>, t_init, secs = bgemm(level3s(remote))   -- ranks 1 and 2 serve in here and exit at its close
local s = w4:stats()
local report = w4:stats_report()
w4:close()

-- Reference: a sample of elements of every batch.
local function at(base, cols, row, col)   -- 1-based index of element (row, col) of a tiled matrix at base
  return base + ((row // T) * cols + col // T) * TT + (row % T) * T + col % T + 1
end
local checked, worst = 0, 0
for b = 0, batch - 1 do
  for _ = 1, 50 do
    rand()
    local row, col = seed % (MT * T), (seed // 7) % (NT * T)
    local sum = 0.0
    for kk = 0, KT * T - 1 do sum = sum + A[at(b * A_SZ, KT, row, kk)] * B[at(b * B_SZ, NT, kk, col)] end
    local got = C[at(b * C_SZ, NT, row, col)]
    local err = math.abs(got - sum) / math.max(1, math.abs(sum))
    if err > worst then worst = err end
    if err > 1e-4 then error(("mpi_bgemm: C[%d][%d][%d] = %g, expected %g"):format(b + 1, row + 1, col + 1, got, sum)) end
    checked = checked + 1
  end
end

local leaf_tasks = 0
for _, child in ipairs(s.children) do leaf_tasks = leaf_tasks + child.tasks_completed end
local flops = 2.0 * batch * MT * T * NT * T * KT * T
print(("mpi_bgemm: %d batches of %dx%dx%d tiles of %dx%d f32 over 2 L3 Workers x 2 chips, %s (%d MPI ranks)")
  :format(batch, MT, NT, KT, T, T, remote and "on ranks 1 and 2" or "local", pto.mpi.size()))
print(("mpi_bgemm: init %.3f s; run %.3f s: %d L4 tasks, %d L3 tasks = %.0f L3 tasks/s, %.2f GFLOP/s")
  :format(t_init, secs, s.tasks_completed, leaf_tasks, leaf_tasks / secs, flops / secs / 1e9))
print(("mpi_bgemm: result OK (%d sampled elements checked against the reference, max relative error %.2g)")
  :format(checked, worst))
print(report)

-- The same script over two local L3s gives the same bytes.
local got = {}
for i = 1, #C do got[i] = C[i] end
local w4l <close> = bgemm(level3s(false))
for i = 1, #C do
  if C[i] ~= got[i] then error(("mpi_bgemm: element %d differs between remote (%g) and local (%g) L3s"):format(i, got[i], C[i])) end
end
print(("mpi_bgemm: equal to the run over two local L3s (%d elements)"):format(#C))
