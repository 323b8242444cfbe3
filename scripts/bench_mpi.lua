-- bench_mpi.lua: a remote L3 (MPI rank 1) against a local one, run by
-- scripts/bench_mpi.sh as `mpirun -np 2 ptolua bench_mpi.lua [min_ms]`.
-- Prints, on rank 0:
--   overhead remote|local_process|local_thread SECONDS_PER_L4_TASK
--     (an empty orchestration function per L4 task, tasks in a row on one L3)
--   tensor BYTES SECONDS_PER_TASK
--     (one INOUT tensor of BYTES per L4 task: out to rank 1 and back)
local pto = require "pto"

local min_s = (tonumber(arg and arg[1]) or 1000) / 1000

-- Seconds per L4 task: repeated runs of `per_run` tasks until min_s passed (best of the runs' rates).
local function per_task(w4, fn, args, per_run)
  local best = math.huge
  w4:run(function(orch) orch:submit_next_level(fn, args, pto.CallConfig(), {worker = 1}) end)   -- warm-up: first touch
  local t_end = pto.now() + min_s
  repeat
    local t0 = pto.now()
    w4:run(function(orch)
      for _ = 1, per_run do orch:submit_next_level(fn, args, pto.CallConfig(), {worker = 1}) end
    end)
    local dt = (pto.now() - t0) / per_run
    if dt < best then best = dt end
  until pto.now() >= t_end and best < math.huge
  return best
end

local function tree(opts)
  local w4 = pto.Worker{level = 4, mode = opts.mode}
  local l3 = pto.Worker{level = 3, num_sub_workers = 1, rank = opts.rank, mode = opts.mode3}
  local empty = w4:register(function() end, "empty")
  w4:add_worker(l3)
  w4:init()
  return w4, empty
end

local sizes = {}
do
  local n = 64 << 10
  while n <= 64 << 20 do sizes[#sizes + 1] = n; n = n * 4 end
end

-- The remote tree first: ranks other than 0 serve inside its init and exit at its close.
local w4, empty = tree{rank = 1}
print(("overhead remote %.9f"):format(per_task(w4, empty, pto.args{}, 200)))
for _, n in ipairs(sizes) do
  local t = pto.tensor({n}, "u8")
  print(("tensor %d %.9f"):format(n, per_task(w4, empty, pto.args{{t, "inout"}}, n >= 16 << 20 and 1 or 4)))
end
w4:close()

for _, m in ipairs{"process", "thread"} do
  local w, e = tree{mode = m, mode3 = m}
  print(("overhead local_%s %.9f"):format(m, per_task(w, e, pto.args{}, 200)))
  w:close()
end
