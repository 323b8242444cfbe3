-- The C API through LuaJIT's FFI: pto_ffi.h (generated from pto.h) goes to
-- ffi.cdef as is, libpto is loaded with ffi.load, and a small DAG runs on
-- the built-in simulated chips. Run by CTest under luajit (without luajit,
-- ctest lists it as skipped, or failed under CI).
local ffi = require "ffi"

local function read(path)
  local f = assert(io.open(path, "rb"), "cannot open " .. tostring(path))
  local s = f:read("*a")
  f:close()
  return s
end

describe("pto.h through LuaJIT's FFI", function()
  local header = read(os.getenv("PTO_FFI_HEADER"))
  ffi.cdef(header)
  local C = ffi.load(os.getenv("PTO_LIB"))

  it("has plain declarations only", function()
    assert.is_nil(header:find("#", 1, true), "no preprocessor lines")
    assert.truthy(header:find("pto_submit_next_level", 1, true))
  end)

  it("reports dtypes and errors", function()
    assert.are.equal(4, tonumber(C.pto_dtype_size(C.PTO_F32)))
    assert.are.equal("bf16", ffi.string(C.pto_dtype_name(C.PTO_BF16)))
    assert.are.equal(nil, C.pto_shm_alloc(0) ~= nil and true or nil)
    assert.truthy(ffi.string(C.pto_errmsg()):find("cannot allocate 0 bytes", 1, true))
  end)

  it("runs a chain of chip tasks and checks the result", function()
    local N = 256
    local cfg = ffi.new("pto_worker_config", {level = 3, mode = C.PTO_MODE_THREAD, heap_ring_size = 1048576})
    local w = C.pto_worker_new(cfg)
    assert.is_not_nil(w ~= nil and w or nil, ffi.string(C.pto_errmsg()))
    local leaf = ffi.new("pto_leaf[1]", C.pto_chip_leaf())
    assert.are.equal(0, C.pto_worker_add_next_level(w, leaf))
    assert.are.equal(1, C.pto_worker_add_next_level(w, leaf))
    local add = C.pto_kernel_register(nil, "vector_add")
    assert.is_true(add >= 0, ffi.string(C.pto_errmsg()))
    assert.are.equal(0, C.pto_worker_init(w))

    local function tensor()
      local p = ffi.cast("float *", C.pto_shm_alloc(N * 4))
      local t = ffi.new("pto_tensor")
      t.base = ffi.cast("uint64_t", ffi.cast("uintptr_t", p))
      t.ndims, t.dtype = 1, C.PTO_F32
      t.shape[0] = N
      return t, p
    end
    local ta, a = tensor()
    local tb, b = tensor()
    local tc, c = tensor()
    for i = 0, N - 1 do a[i] = i; b[i] = 1 end

    -- c = a + b, then c = c + b twice: an INOUT-style chain through c
    local o = C.pto_run_begin(w)
    local tags = ffi.new("uint8_t[3]", {C.PTO_INPUT, C.PTO_INPUT, C.PTO_OUTPUT_EXISTING})
    local first = ffi.new("pto_tensor[3]", {ta, tb, tc})
    local args = ffi.new("pto_task_args", {tensor_count = 3, tensors = first, tags = tags})
    assert.is_true(C.pto_submit_next_level(o, add, args, nil, -1) >= 0)
    local again = ffi.new("pto_tensor[3]", {tc, tb, tc})
    local args2 = ffi.new("pto_task_args", {tensor_count = 3, tensors = again, tags = tags})
    for _ = 1, 2 do assert.is_true(C.pto_submit_next_level(o, add, args2, nil, -1) >= 0) end
    assert.are.equal(3, tonumber(C.pto_task_count(o)))
    assert.are.equal(0, C.pto_run_end(w), ffi.string(C.pto_errmsg()))
    for i = 0, N - 1 do assert.are.equal(i + 3, c[i]) end

    local st = ffi.new("pto_stats")
    C.pto_worker_stats_get(w, st)
    assert.are.equal(3, tonumber(st.tasks_completed))
    C.pto_worker_close(w)
    C.pto_shm_free(a); C.pto_shm_free(b); C.pto_shm_free(c)
  end)
end)
