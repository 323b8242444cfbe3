-- BGEMM over two levels of Workers: an L4 spreads the batches over two L3
-- Workers with two chips each. The L4's orchestration function submits one
-- task per batch; each runs on an L3 child, whose own orchestration
-- function tiles it into gemm_tile and tile_add tasks on its chips (as in
-- examples/bgemm.lua). Tensors live in shared memory, so the L3s and their
-- chips read A and B and write C in place; the L4 checks C afterwards.
--
-- usage: ptolua examples/l4_bgemm.lua [batch m n k tile]
--   batch x m x n x k tiles of tile x tile f32; default 8 4 4 4 64
local pto = require "pto"

local function arg_int(i, default, name)
  local v = arg[i]
  if v == nil then return default end
  local n = math.tointeger(tonumber(v))
  if not n or n < 1 then
    io.stderr:write(("l4_bgemm: %s must be a positive integer (got %q)\n"):format(name, v))
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

-- The level-3 Workers. Kernel handles are per Worker; the orchestration
-- function below finds its own through orch:worker().
local l3s, kernels = {}, {}
for i = 1, 2 do
  local w3 = pto.Worker{level = 3, chips = 2, heap_ring_size = 64 << 20}
  kernels[w3] = {gemm = w3:register(pto.chip_kernel("gemm_tile")), add = w3:register(pto.chip_kernel("tile_add"))}
  l3s[i] = w3
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

local w4 <close> = pto.Worker{level = 4}
local batch_fn = w4:register(one_batch, "one_batch")
for i = 1, 2 do w4:add_worker(l3s[i]) end
local t_init = pto.now()
w4:init()
t_init = pto.now() - t_init

local t0 = pto.now()
w4:run(function(orch)
  for b = 0, batch - 1 do
    orch:submit_next_level(batch_fn, pto.args{{A:view{offset = b * A_SZ, shape = {A_SZ}}, "in"},
                                              {B:view{offset = b * B_SZ, shape = {B_SZ}}, "in"},
                                              {C:view{offset = b * C_SZ, shape = {C_SZ}}, "inout"}},
                           pto.CallConfig())
  end
end)
local secs = pto.now() - t0

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
    if err > 1e-4 then error(("l4_bgemm: C[%d][%d][%d] = %g, expected %g"):format(b + 1, row + 1, col + 1, got, sum)) end
    checked = checked + 1
  end
end

local s = w4:stats()
local leaf_tasks = 0
for _, child in ipairs(s.children) do leaf_tasks = leaf_tasks + child.tasks_completed end
local flops = 2.0 * batch * MT * T * NT * T * KT * T
print(("l4_bgemm: %s, %d batches of %dx%dx%d tiles of %dx%d f32 over 2 L3 Workers x 2 chips (%s mode)")
  :format(tostring(w4), batch, MT, NT, KT, T, T, w4.mode))
print(("l4_bgemm: init %.3f s; run %.3f s: %d L4 tasks, %d L3 tasks = %.0f L3 tasks/s, %.2f GFLOP/s")
  :format(t_init, secs, s.tasks_completed, leaf_tasks, leaf_tasks / secs, flops / secs / 1e9))
print(("l4_bgemm: result OK (%d sampled elements checked against the reference, max relative error %.2g)")
  :format(checked, worst))
w4:print_stats()
