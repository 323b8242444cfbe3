-- The LuaJIT FFI rows of scripts/bench_lua.sh: the shapes of
-- scripts/bench/bench_lua_c.c (W1 independent, W2 chain, W3 fan 1->8->1,
-- W4 bgemm 4^4 x200 and 16^4) on two chips running the no-op "noop"
-- kernel, submitted from LuaJIT straight through the C API (pto_ffi.h,
-- libpto.so): no pto module, no ptolua. Each submit fills a pto_tensor
-- array and a pto_task_args made once, as a C caller would, so the rows
-- measure what LuaJIT's compiled FFI calls cost against C's.
-- A benchmark, not a test.
--   PTO_LIB=build-bench/libpto.so PTO_FFI_HEADER=build-bench/pto_ffi.h \
--     luajit scripts/bench_lua_ffi.lua thread|process [reps]
-- Prints "ffi <shape> <best us/task> <median us/task> <tasks per rep>" per
-- shape over reps timed repetitions (default 5) after one warm-up.
local ffi = require "ffi"

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

ffi.cdef(read(assert(os.getenv("PTO_FFI_HEADER"), "set PTO_FFI_HEADER to pto_ffi.h")))
ffi.cdef [[
  typedef long time_t;
  struct timespec { time_t tv_sec; long tv_nsec; };
  int clock_gettime(int clk, struct timespec *ts);
]]
local C = ffi.load(assert(os.getenv("PTO_LIB"), "set PTO_LIB to libpto.so"))

local mode = arg[1] or "thread"
local reps = tonumber(arg[2]) or 5
if mode ~= "thread" and mode ~= "process" then
  io.stderr:write("usage: luajit scripts/bench_lua_ffi.lua thread|process [reps]\n")
  os.exit(2)
end

local function check(ok, what)
  if not ok then error(what .. ": " .. ffi.string(C.pto_errmsg()), 2) end
end

local SLOT = 16
local FAN = 8
local N = 20000
local NSLOTS = math.max(N, 3 * 16 * 16 * 16)

local ts = ffi.new("struct timespec")
local function now_us()
  C.clock_gettime(1, ts)   -- CLOCK_MONOTONIC
  return tonumber(ts.tv_sec) * 1e6 + tonumber(ts.tv_nsec) / 1e3
end

-- Slot i is a tensor of its own in the shared arena, as in the C rows.
local slots = ffi.cast("char *", C.pto_shm_alloc(NSLOTS * SLOT * 4))
check(slots ~= nil, "pto_shm_alloc")
local base0 = ffi.cast("uint64_t", slots)
local function set_slot(t, i)
  t.base = base0 + i * (SLOT * 4)
  t.offset = 0
  t.shape[0] = SLOT
  t.dtype = C.PTO_F32
  t.ndims = 1
end

local cfg = ffi.new("pto_worker_config", {level = 3, heap_ring_size = 16 * 1024 * 1024,
                                          mode = mode == "thread" and C.PTO_MODE_THREAD or C.PTO_MODE_PROCESS})
local w = C.pto_worker_new(cfg)
check(w ~= nil, "pto_worker_new")
local names = {ffi.new("char[8]", "chip 1"), ffi.new("char[8]", "chip 2")}
for i = 1, 2 do
  local leaf = ffi.new("pto_leaf[1]", C.pto_chip_leaf())
  leaf[0].name = names[i]
  check(C.pto_worker_add_next_level(w, leaf) >= 0, "pto_worker_add_next_level")
end
local noop = C.pto_kernel_register(nil, "noop")
check(noop >= 0, "pto_kernel_register")
check(C.pto_worker_init(w) == 0, "pto_worker_init")

-- One argument block for every submit: tensors, tags and the args struct.
local tensors = ffi.new("pto_tensor[?]", FAN + 1)
local args = ffi.new("pto_task_args[1]")
args[0].tensors = tensors
local function tags_of(...)
  local t = {...}
  return ffi.new("uint8_t[?]", #t, t)
end
local T_OUT = tags_of(C.PTO_OUTPUT)
local T_INOUT = tags_of(C.PTO_INOUT)
local T_RD = tags_of(C.PTO_INPUT, C.PTO_OUTPUT)
local join = {}
for j = 1, FAN do join[j] = C.PTO_INPUT end
join[FAN + 1] = C.PTO_OUTPUT
local T_JOIN = tags_of(unpack(join))
local T_GEMM = tags_of(C.PTO_INPUT, C.PTO_INPUT, C.PTO_OUTPUT)
local T_ADD = tags_of(C.PTO_INPUT, C.PTO_INOUT)

local function submit(o, tags, n)
  args[0].tensor_count = n
  args[0].tags = tags
  if C.pto_submit_next_level(o, noop, args, nil, -1) < 0 then check(false, "pto_submit_next_level") end
end

local function begin()
  local o = C.pto_run_begin(w)
  check(o ~= nil, "pto_run_begin")
  return o
end
local function finish() check(C.pto_run_end(w) == 0, "pto_run_end") end

local function w1()
  local o = begin()
  for i = 0, N - 1 do
    set_slot(tensors[0], i)
    submit(o, T_OUT, 1)
  end
  finish()
  return N
end

local function w2()
  local o = begin()
  for _ = 1, N do
    set_slot(tensors[0], 0)
    submit(o, T_INOUT, 1)
  end
  finish()
  return N
end

local function w3()
  local groups = math.floor(N / (FAN + 2))
  local o = begin()
  for g = 0, groups - 1 do
    local x = g * (FAN + 2)
    set_slot(tensors[0], x)
    submit(o, T_OUT, 1)
    for j = 1, FAN do
      set_slot(tensors[0], x)
      set_slot(tensors[1], x + j)
      submit(o, T_RD, 2)
    end
    for j = 0, FAN - 1 do set_slot(tensors[j], x + 1 + j) end
    set_slot(tensors[FAN], x + 1 + FAN)
    submit(o, T_JOIN, FAN + 1)
  end
  finish()
  return groups * (FAN + 2)
end

-- BGEMM d^4: A, B, C tiles are distinct slots; P is an automatic OUTPUT
-- (base 0: the submit allocates it and writes its descriptor back).
local function w4(d, runs)
  local n3 = d * d * d
  for _ = 1, runs do
    local o = begin()
    for b = 0, d - 1 do
      for m = 0, d - 1 do
        for n = 0, d - 1 do
          check(C.pto_scope_begin(o) == 0, "pto_scope_begin")
          for k = 0, d - 1 do
            set_slot(tensors[0], (b * d + m) * d + k)
            set_slot(tensors[1], n3 + (b * d + k) * d + n)
            set_slot(tensors[2], 0)
            tensors[2].base = 0
            submit(o, T_GEMM, 3)
            tensors[0] = tensors[2]
            set_slot(tensors[1], 2 * n3 + (b * d + m) * d + n)
            submit(o, T_ADD, 2)
          end
          check(C.pto_scope_end(o) == 0, "pto_scope_end")
        end
      end
    end
    finish()
  end
  return 2 * d * d * d * d * runs
end

local SHAPES = {
  {"W1", w1}, {"W2", w2}, {"W3", w3},
  {"W4s", function() return w4(4, 200) end},
  {"W4l", function() return w4(16, 1) end},
}
for _, s in ipairs(SHAPES) do
  local xs, tasks = {}, 0
  s[2]()   -- warm-up
  for r = 1, reps do
    local t0 = now_us()
    tasks = s[2]()
    xs[r] = (now_us() - t0) / tasks
  end
  table.sort(xs)
  print(("ffi %s %.4f %.4f %d"):format(s[1], xs[1], xs[math.floor((reps + 1) / 2)], tasks))
  io.stdout:flush()
end
C.pto_worker_close(w)
C.pto_shm_free(slots)
