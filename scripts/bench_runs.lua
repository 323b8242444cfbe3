-- Blocking runs against submitted runs: 200 back-to-back runs of a small
-- DAG (BGEMM 2^4: 2 batches of 2x2 output tiles, each summing 2 products,
-- as examples/bgemm.lua writes it, 32 tasks a run) with Worker:run, and the
-- same 200 runs with Worker:submit and one Worker:wait_all. A benchmark,
-- not a test: run it through scripts/bench_runs.sh.
--   ptolua scripts/bench_runs.lua thread|process [rounds] [runs] [kernel] [deps]
-- kernel: "noop" (default: the fixed cost of a run) or "gemm" (gemm_tile and
-- tile_add on 32x32 f32 tiles). deps: "stream" (default: run i accumulates
-- into output set i mod 8, a stream of batches; a run waits for the run 8
-- before it) or "chain" (every run accumulates into the same tiles, so each
-- run's sums wait for the previous run's: a training loop's shape).
-- Prints per round "<mode> <kernel>/<deps> run <runs/s>" and "... submit
-- <runs/s>", alternating.
local pto = require "pto"
local mode = arg[1] or "thread"
local rounds = tonumber(arg[2]) or 5
local RUNS = tonumber(arg[3]) or 200
local kernel = arg[4] or "noop"
local deps = arg[5] or "stream"
local D, T = 2, 32
local SETS = deps == "chain" and 1 or 8

local w <close> = pto.Worker{mode = mode, chips = 2, heap_ring_size = 16 << 20}
local gemm_k = w:register(pto.chip_kernel(kernel == "gemm" and "gemm_tile" or "noop"))
local add_k = w:register(pto.chip_kernel(kernel == "gemm" and "tile_add" or "noop"))
w:init()

local n3 = D * D * D
local A, B, C = {}, {}, {}
for i = 0, n3 - 1 do
  A[i], B[i] = pto.tensor({T, T}, "f32"), pto.tensor({T, T}, "f32")
  A[i]:fill(1)
  B[i]:fill(0.001)
end
for s = 1, SETS do
  C[s] = {}
  for i = 0, n3 - 1 do C[s][i] = pto.tensor({T, T}, "f32") end
end

local nstep = 0
local function step(orch)
  nstep = nstep + 1
  local out = C[nstep % SETS + 1]
  local gemm = orch:prepare_next_level(gemm_k, {"in", "in", "out"})
  local add = orch:prepare_next_level(add_k, {"in", "inout"})
  for b = 0, D - 1 do
    for m = 0, D - 1 do
      for n = 0, D - 1 do
        orch:scope_begin()
        local c = out[(b * D + m) * D + n]
        for k = 0, D - 1 do
          local p = orch:alloc({T, T}, "f32")
          gemm(A[(b * D + m) * D + k], B[(b * D + k) * D + n], p)
          add(p, c)
        end
        orch:scope_end()
      end
    end
  end
end

local function blocking()
  for _ = 1, RUNS do w:run(step) end
end

local function submitted()
  for _ = 1, RUNS do w:submit(step) end
  w:wait_all()
end

blocking()   -- warm-up: children, rings, the Lua heap
submitted()
for _ = 1, rounds do
  for _, row in ipairs{{"run", blocking}, {"submit", submitted}} do
    local t0 = pto.now()
    row[2]()
    local dt = pto.now() - t0
    print(("%s %s/%s %s %.1f"):format(mode, kernel, deps, row[1], RUNS / dt))
  end
end
