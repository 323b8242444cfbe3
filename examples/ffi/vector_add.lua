-- c = a + b on two simulated chips, driven from LuaJIT through the C API
-- (pto.h) alone: no Lua module, no ptolua. Run it with
--
--   luajit examples/ffi/vector_add.lua
--
-- after `cmake --install build` and `ldconfig` (so ffi.load finds libpto.so
-- and pto_ffi.h is in /usr/local/include). From a build tree, point it at
-- the build instead:
--
--   PTO_LIB=build/libpto.so PTO_FFI_HEADER=build/pto_ffi.h luajit examples/ffi/vector_add.lua
local ffi = require "ffi"

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- pto_ffi.h is pto.h's declarations without macros or includes: ffi.cdef takes it as is.
ffi.cdef(read(os.getenv("PTO_FFI_HEADER") or "/usr/local/include/pto_ffi.h"))
local C = ffi.load(os.getenv("PTO_LIB") or "pto")

local function check(ok)
  if not ok then error(ffi.string(C.pto_errmsg()), 2) end
end

-- A Worker with two chips. Thread mode: the chips are threads of this
-- process (process mode would fork children of the LuaJIT process).
local cfg = ffi.new("pto_worker_config", {level = 3, mode = C.PTO_MODE_THREAD})
local w = C.pto_worker_new(cfg)
check(w ~= nil)
local chip = ffi.new("pto_leaf[1]", C.pto_chip_leaf())   -- runs registered kernels
check(C.pto_worker_add_next_level(w, chip) >= 0)
check(C.pto_worker_add_next_level(w, chip) >= 0)
-- lib nil: the built-in simulated chip runtime, libpto_chipsim.so (found next to libpto.so).
local vector_add = C.pto_kernel_register(nil, "vector_add")
check(vector_add >= 0)
check(C.pto_worker_init(w) == 0)

-- Tensors: shared memory from the engine's arena, described by pto_tensor.
local N = 65536
local function tensor()
  local p = ffi.cast("float *", C.pto_shm_alloc(N * 4))
  check(p ~= nil)
  local t = ffi.new("pto_tensor")
  t.base = ffi.cast("uintptr_t", p)
  t.offset = 0                        -- in bytes from base (Lua's t.offset counts elements)
  t.dtype, t.ndims, t.shape[0] = C.PTO_F32, 1, N
  return t, p
end
local ta, a = tensor()
local tb, b = tensor()
local tc, c = tensor()
for i = 0, N - 1 do a[i] = i; b[i] = 0.5 * i end

-- One task per half: each reads its halves of a and b and writes its half of c.
local o = C.pto_run_begin(w)
check(o ~= nil)
local tags = ffi.new("uint8_t[3]", C.PTO_INPUT, C.PTO_INPUT, C.PTO_OUTPUT_EXISTING)
local half = N / 2
for k = 0, 1 do
  local ts = ffi.new("pto_tensor[3]", ta, tb, tc)
  for j = 0, 2 do
    ts[j].offset = k * half * 4
    ts[j].shape[0] = half
  end
  local args = ffi.new("pto_task_args", {tensor_count = 3, tensors = ts, tags = tags})
  check(C.pto_submit_next_level(o, vector_add, args, nil, -1) >= 0)   -- -1: any chip
end
check(C.pto_run_end(w) == 0)   -- waits for both tasks; -1 with the first failure

for i = 0, N - 1 do
  if c[i] ~= 1.5 * i then error(("c[%d] = %g, expected %g"):format(i, c[i], 1.5 * i)) end
end
local st = ffi.new("pto_stats")
C.pto_worker_stats_get(w, st)
print(("vector_add (LuaJIT FFI): %d tasks computed c = a + b for %d elements: OK (c[%d] = %g)")
  :format(tonumber(st.tasks_completed), N, N - 1, c[N - 1]))
C.pto_worker_close(w)
C.pto_shm_free(a); C.pto_shm_free(b); C.pto_shm_free(c)
