-- api_spec.lua: every entry point and object of the Lua API
-- (docs/lua.md), in both modes: no Worker here names a
-- mode unless the test is about modes, so $PTO_MODE decides (CTest runs
-- this file once per mode).
--
-- Dependencies are observed two ways: orch:task(id).producers (recorded at
-- submit, so exact) and the order and time at which Lua sub callables start.
-- A sub in process mode runs in a forked copy of the Lua state and cannot
-- change the parent's Lua variables, so the recording subs write shared
-- tensors instead: the pto.now() at which each started (CLOCK_MONOTONIC,
-- the same clock in every process), what it read, and which sub worker
-- (Lua thread and process) ran it. A sub that must not wait shows it by
-- starting before a sub that waits on a sleep_us chip task; a sub that must
-- wait shows it by starting no earlier than the sleep's length.
local pto = require "pto"
local H = require "helpers"

local assert_error, sorted = H.assert_error, H.sorted
local now = pto.now
local EPS = 0.002   -- clock granularity allowance for lower bounds

local W, K                   -- the shared Worker: 2 chips, 2 sub workers
local T0                     -- pto.now() when the current run began
local MARK, PEEK             -- recording subs: MARK stamps its id, PEEK also tensor 1's first element
local WRITER, NOARGS, KEEPER -- subs that report what they saw through BOX

-- What the recording subs saw, indexed by the sub's id (its scalar 1).
-- Created before W:init, so every forked child shares them.
local NREC = 64
local START = pto.tensor({NREC}, "f64")   -- pto.now() when sub id started; -1: it did not run
local VALUE = pto.tensor({NREC}, "f64")   -- PEEK: tensor 1's first element
local THREAD = pto.tensor({NREC}, "i64")  -- the Lua thread (address) of the sub worker that ran it
local PID = pto.tensor({NREC}, "i64")     -- and its process
local BOX = {H.box(), H.box(), H.box()}   -- helpers.send/recv

local function rec(args, peek)
  local t = now()
  local id = args:scalar(1)
  if peek then VALUE[id] = args:tensor(1)[1] end
  THREAD[id] = tonumber(tostring(coroutine.running()):match("(%x+)$"), 16)
  PID[id] = H.getpid()
  START[id] = t
end

-- TaskArgs from {tensor, tag} pairs followed by one integer scalar.
local function targs(scalar, ...)
  local a = pto.TaskArgs()
  for _, p in ipairs{...} do a:add_tensor(p[1], p[2]) end
  if scalar then a:add_scalar(scalar) end
  return a
end

local function run(fn, ...)
  START:fill(-1)
  VALUE:fill(0)
  THREAD:fill(0)
  PID:fill(0)
  T0 = now()
  return W:run(fn, ...)
end

local function sleep(orch, us, ...) return orch:submit_next_level(K.sleep_us, targs(us, ...)) end
-- The same, returning once the task runs: a consumer submitted next finds
-- its producer running, which a scheduler that took a running producer for
-- a finished one gets wrong. (Without the wait, whether the producer had
-- started when its consumer was wired was a race, and such a scheduler
-- passed some runs.)
-- Only for a task that can start without a Lua sub running first (in
-- THREAD mode the wait keeps the interpreter lock).
local function sleeping(orch, us, ...)
  local id = sleep(orch, us, ...)
  H.wait_state(orch, id, {"running"})
  return id
end
local function mark(orch, id, ...) return orch:submit_sub(MARK, targs(id, ...)) end
local function peek(orch, id, ...) return orch:submit_sub(PEEK, targs(id, ...)) end
local function fill(orch, value, ...)
  local a = targs(nil, ...)
  a:add_scalar(value + 0.0)   -- the fill kernel reads its value as a double's bits
  return orch:submit_next_level(K.fill, a)
end

-- What sub id recorded: t (seconds from the run's start), v (PEEK's value),
-- thread (which sub worker ran it). Raises if it did not run.
local function entry(id, level)
  local s = START[id]
  if s < 0 then error(("sub %d did not run"):format(id), (level or 1) + 1) end
  return {id = id, t = s - T0, v = VALUE[id], thread = THREAD[id] .. "/" .. PID[id]}
end

-- Sub id1 started before sub id2 (both must have run).
local function before(id1, id2)
  return entry(id1, 2).t < entry(id2, 2).t
end

-- How many recording subs ran in the last run.
local function ran()
  local n = 0
  for i = 1, NREC do
    if START[i] >= 0 then n = n + 1 end
  end
  return n
end

local function producers(orch, id) return sorted(orch:task(id).producers) end

setup(function()
  W = pto.Worker{chips = 2, num_sub_workers = 2}
  K = H.kernels(W)
  MARK = W:register(function(args) rec(args, false) end, "mark")
  PEEK = W:register(function(args) rec(args, true) end, "peek")
  WRITER = W:register(function(args)
    local x = args:tensor(1)
    H.send(BOX[1], {n = #args, dtype = x.dtype, shape = x.shape, i = args:scalar(1), f = args:scalar_float(2),
                    count = args:scalar_count()})
    for i = 1, #x do x[i] = i * args:scalar(1) end
  end, "writer")
  NOARGS = W:register(function(args) H.send(BOX[2], {empty = #args + args:scalar_count()}) end, "noargs")
  -- call 1 keeps its tensor argument; call 2 reports what touching it does
  local kept
  KEEPER = W:register(function(args)
    if args:scalar(1) == 1 then
      kept = args:tensor(1)
    else
      local ok, err = pcall(function() return kept[1] end)
      H.send(BOX[3], {ok = ok, err = err})
    end
  end, "keeper")
  W:init()
end)

teardown(function()
  if W then W:close() end
end)

describe("entry points", function()
  it("require 'pto' returns the module ptolua preloads", function()
    local m = require "pto"
    assert.are.equal(m, pto)
    assert.are.equal(m, _G.pto)
    assert.are.equal("string", type(m._VERSION))
    for _, name in ipairs{"tensor", "tensor_spec", "TaskArgs", "args", "CallConfig", "Worker", "chip_kernel"} do
      assert.are.equal("function", type(m[name]), name)
    end
  end)
end)

describe("tags", function()
  it("are distinct integer constants", function()
    local seen = {}
    for _, name in ipairs{"INPUT", "OUTPUT", "INOUT", "OUTPUT_EXISTING", "NO_DEP"} do
      assert.are.equal("integer", math.type(pto[name]), name)
      assert.is_nil(seen[pto[name]], name)
      seen[pto[name]] = true
    end
  end)

  it("are accepted as constants or strings, and read back as strings", function()
    local t = pto.tensor{4}
    local pairs_ = {{pto.INPUT, "in"}, {pto.OUTPUT, "out"}, {pto.INOUT, "inout"},
                    {pto.OUTPUT_EXISTING, "out_existing"}, {pto.NO_DEP, "no_dep"}}
    local a = pto.TaskArgs()
    for i, p in ipairs(pairs_) do
      a:add_tensor(t, p[1])
      a:add_tensor(t, p[2])
      assert.are.equal(p[2], a:tag(2 * i - 1))
      assert.are.equal(p[2], a:tag(2 * i))
    end
    assert.are.equal("in", pto.TaskArgs():add_tensor(t):tag(1))   -- the default is INPUT
  end)
end)

describe("the tag table (TensorMap lookup and insert per tag), observed through task order", function()
  it("INPUT after OUTPUT waits for the writer (RAW)", function()
    local t = pto.tensor{4}
    local r = run(function(orch)
      local s = sleeping(orch, 200000, {t, pto.OUTPUT})
      local c = mark(orch, 1, {t, pto.INPUT})
      local d = mark(orch, 2)
      return {s = s, c = producers(orch, c), cfanin = orch:task(c).fanin, d = producers(orch, d)}
    end)
    assert.are.same({r.s}, r.c)
    assert.are.equal(1, r.cfanin)
    assert.are.same({}, r.d)
    assert.is_true(entry(1).t >= 0.2 - EPS, "the reader started before its writer's 200 ms ended")
    assert.is_true(before(2, 1), "an independent sub should have run before the waiting reader")
  end)

  it("INPUT sees the data of the last writer, through an INOUT in between", function()
    local t = pto.tensor{4}
    local r = run(function(orch)
      local s = sleeping(orch, 100000, {t, "out"})
      local f = fill(orch, 7, {t, "inout"})
      local c = peek(orch, 1, {t, "in"})
      return {s = s, f = f, fp = producers(orch, f), cp = producers(orch, c)}
    end)
    assert.are.same({r.s}, r.fp)
    assert.are.same({r.f}, r.cp)
    assert.are.equal(7, entry(1).v)
    assert.is_true(entry(1).t >= 0.1 - EPS)
    assert.are.same({7, 7, 7, 7}, t:totable())
  end)

  it("OUTPUT after INPUT of the same tensor does not wait for the reader (WAR is not tracked)", function()
    local t, u = pto.tensor{4}, pto.tensor{4}
    local r = run(function(orch)
      local s = sleep(orch, 300000, {t, "in"}, {u, "out"})   -- a slow reader of t
      local f = fill(orch, 5, {t, "out"})                    -- then a writer of t
      local c = peek(orch, 1, {t, "in"})
      local z = mark(orch, 2, {u, "in"})                     -- waits for the slow reader
      return {s = s, f = f, fp = producers(orch, f), cp = producers(orch, c), zp = producers(orch, z)}
    end)
    assert.are.same({}, r.fp)
    assert.are.same({r.f}, r.cp)
    assert.are.same({r.s}, r.zp)
    assert.are.equal(5, entry(1).v)
    assert.is_true(before(1, 2), "the writer waited for the earlier reader")
    assert.is_true(entry(1).t < 0.3, "the writer waited for the earlier reader")
    assert.is_true(entry(2).t >= 0.3 - EPS)
  end)

  it("OUTPUT after OUTPUT does not wait for the earlier writer (WAW replaces the producer)", function()
    local t, u = pto.tensor{4}, pto.tensor{4}
    local r = run(function(orch)
      local s = sleep(orch, 300000, {t, "out"}, {u, "out"})
      local f = fill(orch, 6, {t, "out"})
      local c = peek(orch, 1, {t, "in"})
      mark(orch, 2, {u, "in"})
      return {s = s, f = f, fp = producers(orch, f), cp = producers(orch, c)}
    end)
    assert.are.same({}, r.fp)
    assert.are.same({r.f}, r.cp)   -- only the latest writer
    assert.are.equal(6, entry(1).v)
    assert.is_true(before(1, 2))
    assert.is_true(entry(1).t < 0.3, "the second writer waited for the first")
  end)

  it("INOUT chains serialise", function()
    local t = pto.tensor{4}
    local r = run(function(orch)
      local s1 = sleeping(orch, 150000, {t, "inout"})
      local a = mark(orch, 1, {t, "inout"})
      -- not waited for: it runs only after sub a, which in THREAD mode
      -- needs the interpreter this busy wait would keep
      local s2 = sleep(orch, 150000, {t, "inout"})
      local b = mark(orch, 2, {t, pto.INOUT})
      return {s1 = s1, a = a, s2 = s2, b = b, ap = producers(orch, a), s2p = producers(orch, s2),
              bp = producers(orch, b)}
    end)
    assert.are.same({r.s1}, r.ap)
    assert.are.same({r.a}, r.s2p)
    assert.are.same({r.s2}, r.bp)
    assert.is_true(before(1, 2))
    assert.is_true(entry(1).t >= 0.15 - EPS)
    assert.is_true(entry(2).t >= 0.30 - EPS, "the second INOUT did not wait for the whole chain")
  end)

  it("INOUT accumulation on chips gives the serial result", function()
    local acc, one = pto.tensor({64}, "f32"), pto.tensor({64}, "f32")
    one:fill(1)
    run(function(orch)
      for _ = 1, 20 do orch:submit_next_level(K.tile_add, pto.args{{acc, "inout"}, {one, "in"}}) end
    end)
    for i = 1, 64 do assert.are.equal(20, acc[i]) end
  end)

  it("OUTPUT_EXISTING skips the lookup: it does not wait for the earlier writer", function()
    local t, u = pto.tensor{4}, pto.tensor{4}
    local r = run(function(orch)
      local s = sleep(orch, 300000, {t, "out"}, {u, "out"})
      local e = fill(orch, 5, {t, pto.OUTPUT_EXISTING})
      local c = peek(orch, 1, {t, "in"})
      mark(orch, 2, {u, "in"})
      return {e = e, ep = producers(orch, e), cp = producers(orch, c)}
    end)
    assert.are.same({}, r.ep)
    assert.are.same({r.e}, r.cp)
    assert.are.equal(5, entry(1).v)
    assert.is_true(before(1, 2))
    assert.is_true(entry(1).t < 0.3, "the OUTPUT_EXISTING writer waited for the earlier writer")
  end)

  it("OUTPUT_EXISTING registers the writer: a later INPUT waits for it", function()
    local t = pto.tensor{4}
    local r = run(function(orch)
      local s = sleeping(orch, 200000, {t, "out_existing"})
      local c = mark(orch, 1, {t, "in"})
      mark(orch, 2)
      return {s = s, cp = producers(orch, c)}
    end)
    assert.are.same({r.s}, r.cp)
    assert.is_true(entry(1).t >= 0.2 - EPS)
    assert.is_true(before(2, 1))
  end)

  it("NO_DEP does not wait for the writer", function()
    local t, u = pto.tensor{4}, pto.tensor{4}
    local r = run(function(orch)
      sleep(orch, 300000, {t, "out"}, {u, "out"})
      local c = mark(orch, 1, {t, pto.NO_DEP})
      mark(orch, 2, {u, "in"})
      return producers(orch, c)
    end)
    assert.are.same({}, r)
    assert.is_true(before(1, 2))
    assert.is_true(entry(1).t < 0.3, "the NO_DEP reader waited for the writer")
    assert.is_true(entry(2).t >= 0.3 - EPS)
  end)

  it("NO_DEP does not make its task a producer", function()
    local t, u = pto.tensor{4}, pto.tensor{4}
    local r = run(function(orch)
      sleep(orch, 300000, {t, "no_dep"}, {u, "out"})
      local c = mark(orch, 1, {t, "in"})
      mark(orch, 2, {u, "in"})
      return producers(orch, c)
    end)
    assert.are.same({}, r)
    assert.is_true(before(1, 2))
    assert.is_true(entry(1).t < 0.3, "the reader waited for a NO_DEP task")
  end)
end)

describe("data types", function()
  local names = {"f32", "f16", "bf16", "f64", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "bool"}
  local consts = {FLOAT32 = "f32", FLOAT16 = "f16", BFLOAT16 = "bf16", FLOAT64 = "f64", INT8 = "i8", INT16 = "i16",
                  INT32 = "i32", INT64 = "i64", UINT8 = "u8", UINT16 = "u16", UINT32 = "u32", UINT64 = "u64",
                  BOOL = "bool"}
  local sizes = {f32 = 4, f16 = 2, bf16 = 2, f64 = 8, i8 = 1, i16 = 2, i32 = 4, i64 = 8, u8 = 1, u16 = 2, u32 = 4,
                 u64 = 8, bool = 1}

  it("has all 13 names, each with its size, and the constants", function()
    for _, n in ipairs(names) do
      local t = pto.tensor({3}, n)
      assert.are.equal(n, t.dtype)
      assert.are.equal(3 * sizes[n], t.nbytes)
    end
    local count = 0
    for c, n in pairs(consts) do
      assert.are.equal(n, pto[c], c)
      assert.are.equal(n, pto.tensor({2}, pto[c]).dtype)
      count = count + 1
    end
    assert.are.equal(13, count)
    assert.are.equal("f32", pto.tensor{2}.dtype)   -- the default
  end)

  it("zero-fills, reading integers as integers, floats as floats, bools as booleans", function()
    for _, n in ipairs(names) do
      local v = pto.tensor({2}, n)[2]
      if n == "bool" then
        assert.are.equal(false, v)
      elseif n:match("^[iu]") then
        assert.are.equal("integer", math.type(v), n)
        assert.are.equal(0, v)
      else
        assert.are.equal("float", math.type(v), n)
        assert.are.equal(0.0, v)
      end
    end
  end)

  it("round-trips floats with f32/f64 precision", function()
    local f32, f64 = pto.tensor({2}, "f32"), pto.tensor({2}, "f64")
    f32[1], f64[1] = 0.1, 0.1
    assert.are.equal(string.unpack("f", string.pack("f", 0.1)), f32[1])
    assert.are_not.equal(0.1, f32[1])
    assert.are.equal(0.1, f64[1])
    f32[2], f64[2] = -1.5, 1e300
    assert.are.equal(-1.5, f32[2])
    assert.are.equal(1e300, f64[2])
    f32[1] = 1e300
    assert.are.equal(math.huge, f32[1])
  end)

  it("rounds f16 to nearest even, with subnormals, overflow and NaN", function()
    local t = pto.tensor({1}, "f16")
    local cases = {
      {1.0, 1.0}, {-2.0, -2.0}, {0.5, 0.5}, {65504, 65504}, {1 / 3, 0.333251953125},
      {2049, 2048}, {2051, 2052},                     -- ties to even at the 11-bit significand
      {65520, math.huge}, {-1e6, -math.huge},          -- overflow
      {2 ^ -24, 2 ^ -24}, {3 * 2 ^ -25, 2 ^ -23},      -- smallest subnormal; a tie rounds to even
      {1e-8, 0.0},
    }
    for _, c in ipairs(cases) do
      t[1] = c[1]
      assert.are.equal(c[2], t[1], ("f16 of %.17g"):format(c[1]))
    end
    t[1] = 0 / 0
    assert.is_true(t[1] ~= t[1], "NaN survives")
  end)

  it("rounds bf16 to nearest even", function()
    local t = pto.tensor({1}, "bf16")
    local cases = {{1.0, 1.0}, {1 / 3, 0.333984375}, {1 + 2 ^ -8, 1.0}, {1 + 3 * 2 ^ -8, 1 + 2 ^ -6},
                   {256.5, 256}, {-3.0, -3.0}, {3e38, (1 + 98 / 128) * 2 ^ 127}}
    for _, c in ipairs(cases) do
      t[1] = c[1]
      assert.are.equal(c[2], t[1], ("bf16 of %.17g"):format(c[1]))
    end
    t[1] = 0 / 0
    assert.is_true(t[1] ~= t[1])
  end)

  it("wraps integers as two's complement", function()
    local cases = {
      i8 = {{127, 127}, {128, -128}, {200, -56}, {-129, 127}},
      u8 = {{255, 255}, {-1, 255}, {256, 0}},
      i16 = {{40000, -25536}, {-32768, -32768}},
      u16 = {{70000, 4464}, {-1, 65535}},
      i32 = {{2 ^ 31 // 1, -2 ^ 31 // 1}, {-1, -1}},
      u32 = {{-1, 4294967295}, {(1 << 32) + 5, 5}},
      i64 = {{math.maxinteger, math.maxinteger}, {math.mininteger, math.mininteger}},
      u64 = {{1 << 62, 1 << 62}, {-1, -1}},   -- above math.maxinteger reads back as the same 64 bits
    }
    for dtype, list in pairs(cases) do
      local t = pto.tensor({1}, dtype)
      for _, c in ipairs(list) do
        t[1] = c[1]
        assert.are.equal(c[2], t[1], ("%s of %d"):format(dtype, c[1]))
        assert.are.equal("integer", math.type(t[1]))
      end
    end
    local t = pto.tensor({1}, "i32")
    t[1] = 3.0   -- a float with an integer value is accepted
    assert.are.equal(3, t[1])
    assert.are.equal("integer", math.type(t[1]))
  end)

  it("stores bools from booleans and numbers", function()
    local t = pto.tensor({4}, "bool")
    t[1], t[2], t[3], t[4] = true, false, 2, 0
    assert.are.same({true, false, true, false}, t:totable())
    t:fill(true)
    assert.are.same({true, true, true, true}, t:totable())
  end)
end)

describe("tensors", function()
  it("have shape, dtype, ndims, nbytes, numel and #t", function()
    local t = pto.tensor({2, 3}, "i16")
    assert.are.same({2, 3}, t.shape)
    local s = t.shape
    s[1] = 99
    assert.are.same({2, 3}, t.shape)   -- shape is a copy
    assert.are.equal("i16", t.dtype)
    assert.are.equal(2, t.ndims)
    assert.are.equal(6, t.numel)
    assert.are.equal(12, t.nbytes)
    assert.are.equal(6, #t)
    local t5 = pto.tensor{1, 2, 1, 2, 1}
    assert.are.equal(5, t5.ndims)
    assert.are.equal(4, t5.numel)
    local e = pto.tensor{0}
    assert.are.equal(0, #e)
    assert.are.equal(0, e.nbytes)
    assert.are.same({}, e:totable())
    assert.is_true(pto.is_tensor(t))
    assert.is_false(pto.is_tensor({}))
  end)

  it("index flat from 1, fill, totable and copy_from", function()
    local t = pto.tensor({2, 3}, "i32")
    for i = 1, #t do t[i] = i * 10 end
    assert.are.same({10, 20, 30, 40, 50, 60}, t:totable())
    assert.are.equal(t, t:fill(7))
    assert.are.same({7, 7, 7, 7, 7, 7}, t:totable())
    assert.are.equal(t, t:copy_from{1, 2, 3, 4, 5, 6})
    assert.are.same({1, 2, 3, 4, 5, 6}, t:totable())
    local f = pto.tensor({6}, "f32")
    f:copy_from(t)   -- converts i32 to f32
    assert.are.same({1, 2, 3, 4, 5, 6}, f:totable())
    assert.are.equal("float", math.type(f[1]))
    local g = pto.tensor({3, 2}, "i32")
    g:copy_from(t)   -- same element count, any shape
    assert.are.same(t:totable(), g:totable())
    t[1] = 100
    assert.are.equal(1, g[1])   -- a copy, not an alias
  end)

  it("view{...} reads its fields from plain and proxied tables alike", function()
    local base = pto.tensor({16}, "i32")
    for i = 1, 16 do base[i] = i end
    local plain = base:view{offset = 4, shape = {2, 2}}
    local proxied = base:view(setmetatable({}, {__index = {offset = 4, shape = setmetatable({}, {
      __index = {2, 2}, __len = function() return 2 end})}}))
    for _, v in ipairs({plain, proxied, base:view{shape = 4, offset = 4}, base:view(4, 2, 2)}) do
      assert.are.same({5, 6, 7, 8}, v:totable())
      assert.are.equal(4, v.offset)
    end
    assert.are.same({2, 2}, proxied.shape)
    assert.are.same({4}, base:view{shape = 4, offset = 4}.shape)   -- a bare number is a 1-D shape
    assert.are.same({3, 3}, {base:view{offset = 13}.numel, base:view{offset = 13}.shape[1]})
    local ok, err = pcall(base.view, base, setmetatable({offest = 1}, {}))
    assert.is_false(ok)
    assert.matches("Tensor:view: unknown field 'offest' %(fields: offset, shape%)", err)
  end)

  it("view{offset, shape} shares storage", function()
    local base = pto.tensor({4, 4}, "f32")
    for i = 1, 16 do base[i] = i end
    local v = base:view{offset = 4, shape = {2, 4}}
    assert.are.same({2, 4}, v.shape)
    assert.are.equal(8, #v)
    assert.are.equal(5, v[1])
    assert.are.equal(12, v[8])
    v[1] = 100
    assert.are.equal(100, base[5])
    base[6] = 200
    assert.are.equal(200, v[2])
    local rest = base:view{offset = 10}
    assert.are.same({6}, rest.shape)
    assert.are.equal(11, rest[1])
    local vv = v:view{offset = 2, shape = {3}}   -- offsets count from the start of the view
    assert.are.equal(base[7], vv[1])
    assert.are.equal(6, vv.offset)
    local whole = base:view{offset = 0, shape = {16}}
    assert.are.same(base:totable(), whole:totable())
  end)

  it("views keep their storage alive", function()
    local v = pto.tensor({64}, "i32"):view{offset = 8, shape = {8}}
    collectgarbage()
    collectgarbage()
    v:fill(3)
    assert.are.same({3, 3, 3, 3, 3, 3, 3, 3}, v:totable())
  end)

  it("disjoint views of one tensor do not serialise; overlapping views do", function()
    local base, u = pto.tensor{64}, pto.tensor{4}
    local lo = base:view{offset = 0, shape = {32}}
    local hi = base:view{offset = 32, shape = {32}}
    local mid = base:view{offset = 16, shape = {8}}   -- inside lo
    local r = run(function(orch)
      local s = sleeping(orch, 300000, {lo, "out"}, {u, "out"})
      local c1 = mark(orch, 1, {hi, "in"})
      local c2 = mark(orch, 2, {mid, "in"})
      mark(orch, 3, {u, "in"})
      local c4 = mark(orch, 4, {base, "in"})   -- the whole base overlaps lo
      return {s = s, c1 = producers(orch, c1), c2 = producers(orch, c2), c4 = producers(orch, c4)}
    end)
    assert.are.same({}, r.c1)
    assert.are.same({r.s}, r.c2)
    assert.are.same({r.s}, r.c4)
    assert.is_true(before(1, 3), "a reader of a disjoint view waited")
    assert.is_true(entry(1).t < 0.3, "a reader of a disjoint view waited")
    assert.is_true(entry(2).t >= 0.3 - EPS, "a reader of an overlapping view did not wait")
    assert.is_true(entry(4).t >= 0.3 - EPS)
  end)

  it("writers of disjoint views run in parallel; a reader of the whole waits for both", function()
    local base = pto.tensor{64}
    local lo = base:view{offset = 0, shape = {32}}
    local hi = base:view{offset = 32, shape = {32}}
    local r = run(function(orch)
      local a = sleeping(orch, 250000, {lo, "out"})
      local b = sleeping(orch, 250000, {hi, "inout"})
      local c = mark(orch, 1, {base, "in"})
      return {a = a, b = b, bp = producers(orch, b), cp = producers(orch, c)}
    end)
    assert.are.same({}, r.bp)
    assert.are.same(sorted{r.a, r.b}, r.cp)
    assert.is_true(entry(1).t >= 0.25 - EPS)
    assert.is_true(entry(1).t < 0.5, ("disjoint writers serialised (%.3f s)"):format(entry(1).t))
  end)

  it("print with tostring", function()
    local t = pto.tensor({2, 2}, "i32")
    t:copy_from{1, 2, 3, 4}
    assert.are.equal("tensor(i32, {2, 2}) [1, 2, 3, 4]", tostring(t))
    assert.are.equal("tensor(f32, {3}) [0.0, 0.0, 0.0]", tostring(pto.tensor{3}))
    local long = tostring(pto.tensor({10}, "u8"))
    assert.truthy(long:find("^tensor%(u8, {10}%) %[0, 0, 0, 0, 0, 0, 0, 0, %.%.%.%]$"), long)
    assert.are.equal("tensor(bool, {1}) [false]", tostring(pto.tensor({1}, "bool")))
    assert.truthy(tostring(pto.tensor_spec({4}, "f16")):find("unset"))
  end)
end)

describe("TaskArgs", function()
  it("builds tensors with tags and 64-bit scalars", function()
    local t1, t2 = pto.tensor{4}, pto.tensor{4}
    local a = pto.TaskArgs()
    assert.are.equal(0, #a)
    assert.are.equal(a, a:add_tensor(t1))
    assert.are.equal(a, a:add_tensor(t2, pto.OUTPUT))
    a:add_tensor(t1, "inout")
    assert.are.equal(3, #a)
    assert.are.equal(3, a:tensor_count())
    assert.are.equal(t1, a:tensor(1))
    assert.are.equal(t2, a:tensor(2))
    assert.are.same({"in", "out", "inout"}, {a:tag(1), a:tag(2), a:tag(3)})
    assert.are.equal(a, a:add_scalar(42))
    a:add_scalar(2.5)
    a:add_scalar(math.mininteger)
    a:add_scalar(true)
    assert.are.equal(4, a:scalar_count())
    assert.are.equal(42, a:scalar(1))
    assert.are.equal("integer", math.type(a:scalar(1)))
    assert.are.equal(2.5, a:scalar(2))
    assert.are.equal(math.mininteger, a:scalar(3))
    assert.are.equal(1, a:scalar(4))
    assert.are.equal("TaskArgs(3 tensors, 4 scalars)", tostring(a))
    assert.are.equal(a, a:clear())
    assert.are.equal(0, #a)
    assert.are.equal(0, a:scalar_count())
  end)

  it("has the pto.args shorthand", function()
    local a, b, c = pto.tensor{4}, pto.tensor{4}, pto.tensor{4}
    local args = pto.args{{a, "in"}, {b, pto.INPUT}, {c, "out"}, scalars = {42, 0.5}}
    assert.are.equal(3, #args)
    assert.are.same({"in", "in", "out"}, {args:tag(1), args:tag(2), args:tag(3)})
    assert.are.equal(c, args:tensor(3))
    assert.are.equal(2, args:scalar_count())
    assert.are.equal(42, args:scalar(1))
    assert.are.equal(0.5, args:scalar(2))
    local bare = pto.args{a, {b, "no_dep"}}   -- a bare tensor is an INPUT
    assert.are.same({"in", "no_dep"}, {bare:tag(1), bare:tag(2)})
    assert.are.equal(0, #pto.args{})
  end)

  -- pto.args reads a plain list made by a constructor in one pass and
  -- anything else entry by entry: both give the same TaskArgs.
  local function shape_of(args)
    local r = {}
    for i = 1, #args do r[i] = {args:tensor(i), args:tag(i)} end
    for i = 1, args:scalar_count() do r[#r + 1] = args:scalar(i) end
    return r
  end

  it("reads lists built any way alike", function()
    local a, b, c = pto.tensor{4}, pto.tensor{4}, pto.tensor{4}
    local want = {{a, "in"}, {b, "inout"}, {c, "out"}, 7}
    local plain = pto.args{{a, "in"}, {b, "inout"}, {c, "out"}, scalars = {7}}
    assert.are.same(want, shape_of(plain))
    local backwards = {}   -- integer keys in the hash part, in no order
    backwards[3], backwards[2], backwards[1] = {c, "out"}, {b, "inout"}, {a, "in"}
    backwards.scalars = {7}
    assert.are.same(want, shape_of(pto.args(backwards)))
    local proxied = setmetatable({}, {__index = {{a, "in"}, {b, "inout"}, {c, "out"}, scalars = {7}},
                                      __len = function() return 3 end})
    assert.are.same({{a, "in"}, {b, "inout"}, {c, "out"}}, shape_of(pto.args(proxied)))   -- no scalars key of its own
    local entry = setmetatable({}, {__index = {b, pto.INOUT}})
    assert.are.same({{a, "in"}, {b, "inout"}}, shape_of(pto.args{{a, "in"}, entry}))
    -- tags by constant, no_dep and out_existing, a bare tensor: the entry-by-entry reading of each
    assert.are.same({{a, "in"}, {b, "no_dep"}, {c, "out_existing"}, {a, "in"}},
                    shape_of(pto.args{{a, pto.INPUT}, {b, "no_dep"}, {c, "out_existing"}, a}))
    assert.are.same({{a, "in"}, {b, "in"}}, shape_of(pto.args{{a}, {b, nil}}))   -- no tag: INPUT
  end)

  it("stops at the first hole, as ipairs", function()
    local a, c = pto.tensor{4}, pto.tensor{4}
    assert.are.same({{a, "in"}}, shape_of(pto.args{{a, "in"}, nil, {c, "out"}}))
  end)

  it("names the entry or field that is wrong whatever the list's form", function()
    local a = pto.tensor{4}
    local function err(f) return select(2, pcall(f)) end
    assert.matches("pto.args: entry 2 must be a tensor or {tensor, tag} %(got number%)", err(function() pto.args{{a, "in"}, 5} end))
    assert.matches("pto.args: entry 2: unknown tag string 'inn'", err(function() pto.args{{a, "in"}, {a, "inn"}} end))
    assert.matches("pto.args: unknown field 'scalar'", err(function() pto.args{{a, "in"}, scalar = {1}} end))
    assert.matches("pto.args: unknown field '5'", err(function() pto.args{{a, "in"}, [5] = {a, "in"}} end))
    assert.matches("pto.args: unknown field '0'", err(function() pto.args{[0] = {a, "in"}, {a, "in"}} end))
    assert.matches("pto.args: entry 1 must be a tensor or {tensor, tag} %(got table%)",
                   err(function() pto.args{{5, "in"}} end))
  end)
end)

describe("CallConfig", function()
  it("has the documented defaults", function()
    local c = pto.CallConfig()
    assert.are.equal(0, c.block_dim)
    assert.are.equal(3, c.aicpu_thread_num)
    assert.are.equal(0, c.enable_l2_swimlane)
    assert.are.equal(0, c.enable_dump_tensor)
    assert.are.equal(0, c.enable_pmu)
    assert.are.equal(0, c.enable_dep_gen)
    assert.are.equal("", c.output_prefix)
    assert.are.equal(3, pto.CallConfig{}.aicpu_thread_num)
  end)

  it("takes every field in the constructor and by assignment", function()
    local c = pto.CallConfig{block_dim = 24, aicpu_thread_num = 4, enable_l2_swimlane = 1, enable_dump_tensor = true,
                             enable_pmu = 1, enable_dep_gen = 1, output_prefix = "out/run1"}
    assert.are.same({24, 4, 1, 1, 1, 1, "out/run1"},
      {c.block_dim, c.aicpu_thread_num, c.enable_l2_swimlane, c.enable_dump_tensor, c.enable_pmu, c.enable_dep_gen,
       c.output_prefix})
    c.block_dim = 8
    c.output_prefix = "x"
    assert.are.equal(8, c.block_dim)
    assert.are.equal("x", c.output_prefix)
    assert.truthy(tostring(c):find("block_dim = 8", 1, true))
  end)

  it("rejects unknown fields", function()
    assert_error(function() pto.CallConfig{block_dims = 1} end, "pto.CallConfig: ", "unknown field 'block_dims'")
    local c = pto.CallConfig()
    assert_error(function() return c.nope end, "CallConfig: ", "unknown field 'nope'")
    assert_error(function() c.nope = 1 end, "CallConfig: ", "unknown field 'nope'")
  end)
end)

describe("Worker", function()
  it("has the documented defaults", function()
    local w = pto.Worker{}
    assert.are.equal(3, w.level)
    assert.are.equal(H.MODE, w.mode)   -- $PTO_MODE, else "process"
    assert.are.equal(0, w.chips)
    assert.are.equal(0, w.num_sub_workers)
    assert.is_false(w.initialized)
    assert.truthy(tostring(w):find("not initialised"))
    assert.are.equal(w, w:init())
    assert.is_true(w.initialized)
    local s = w:stats()
    assert.are.equal(4, #s.rings)
    for _, ring in ipairs(s.rings) do assert.are.equal(1 << 30, ring.capacity_bytes) end   -- 1 GiB per ring
    w:close()
    local w0 = pto.Worker()
    assert.are.equal(3, w0.level)
    w0:close()
  end)

  it("takes every construction option; a mode named here wins over $PTO_MODE", function()
    for _, mode in ipairs{"thread", "process"} do
      local w = pto.Worker{level = 3, mode = mode, chips = 2, num_sub_workers = 1, heap_ring_size = 1 << 20,
                           alloc_timeout_ms = 500, chip_runtime = H.CHIPSIM, queue_depth = 1, start_timeout_ms = 5000}
      assert.are.same({3, mode, 2, 1}, {w.level, w.mode, w.chips, w.num_sub_workers})
      H.check_vector_add(w, w:register(pto.chip_kernel("vector_add")))
      local s = w:stats()
      assert.are.equal(2, s.chips)
      assert.are.equal(1, s.sub_workers)
      assert.are.equal(1 << 20, s.rings[1].capacity_bytes)
      w:close()
    end
  end)

  it("takes its default mode from $PTO_MODE: process when unset or empty", function()
    local chunk = "io.write(pto.Worker{}.mode, ' ', pto.Worker{mode = 'thread'}.mode, ' ', " ..
                  "pto.Worker{mode = 'process'}.mode)"
    local function modes(env)
      local p = assert(io.popen(("env %s %q -e %q 2>&1"):format(env, assert(os.getenv("PTOLUA")), chunk)))
      local out = p:read("a")
      p:close()
      return out
    end
    assert.are.equal("process thread process", modes("-u PTO_MODE"))
    assert.are.equal("process thread process", modes("PTO_MODE="))
    assert.are.equal("process thread process", modes("PTO_MODE=process"))
    assert.are.equal("thread thread process", modes("PTO_MODE=thread"))
  end)

  it("registers Lua functions and chip kernels by name or by library and symbol", function()
    local w = pto.Worker{chips = 1, num_sub_workers = 1}
    local seen = pto.tensor({1}, "i64")   -- shared: the sub may run in a forked child
    local hs = w:register(function(args) seen[1] = args:scalar(1) end)
    local hk = w:register(pto.chip_kernel("vector_add"))
    local hl = w:register(pto.chip_kernel{lib = H.CHIPSIM, symbol = "vector_add"})
    local hd = w:register(pto.chip_kernel{symbol = "vector_mul"})   -- lib defaults to the Worker's runtime
    assert.truthy(tostring(hs):find("^handle%(sub %d+%)$"), tostring(hs))
    assert.truthy(tostring(hk):find("^handle%(chip %d+%)$"), tostring(hk))
    assert.are.equal("chip_kernel(vector_add)", tostring(pto.chip_kernel("vector_add")))
    H.check_vector_add(w, hk)
    H.check_vector_add(w, hl)
    local a, b, c = pto.tensor{8}, pto.tensor{8}, pto.tensor{8}
    a:fill(3)
    b:fill(4)
    w:run(function(orch)
      orch:submit_sub(hs, pto.args{scalars = {77}})
      orch:submit_next_level(hd, pto.args{a, b, {c, "out"}})
    end)
    assert.are.equal(77, seen[1])
    assert.are.same({12, 12, 12, 12, 12, 12, 12, 12}, c:totable())
    w:close()
  end)

  it("runs fn(orch, args, cfg) in the outer scope and returns what fn returned", function()
    local A, C = pto.TaskArgs(), pto.CallConfig()
    local n, x, y, z = (function(...) return select("#", ...), ... end)(W:run(function(orch, args, cfg)
      assert.are.equal(A, args)
      assert.are.equal(C, cfg)
      assert.are.equal(0, orch:scope_depth())
      assert.are.equal(W, orch:worker())
      return 1, nil, "three"
    end, A, C))
    assert.are.same({3, 1, nil, "three"}, {n, x, y, z})
    assert.are.equal(0, select("#", W:run(function() end)))
  end)

  it("raises the first failure naming the task, callable, worker and cause; the next run succeeds", function()
    local t, u = pto.tensor{4}, pto.tensor{4}
    local failed0 = W:stats().tasks_failed
    local ok, err = pcall(run, function(orch)
      sleep(orch, 1000)                                                          -- task 0
      orch:submit_next_level(K.fail, pto.args{{t, "out"}, scalars = {7}}, nil, {worker = 2})   -- task 1
      mark(orch, 1, {t, "in"})                                                   -- never runs
      local s = sleep(orch, 100000, {u, "out"})
      orch:submit_next_level(K.fail, pto.args{{u, "in"}, scalars = {8}})        -- fails later
      return s
    end)
    assert.is_false(ok)
    assert.are.equal("string", type(err))
    assert.are.equal("Worker:run: ", err:sub(1, 12), err)
    assert.truthy(err:find("task 1", 1, true), err)
    assert.truthy(err:find("'fail'", 1, true), err)
    assert.truthy(err:find("chip 2", 1, true), err)
    assert.truthy(err:find("fail kernel called with code 7", 1, true), err)
    assert.is_nil(err:find("code 8", 1, true))
    assert.are.equal(0, ran())   -- the failed task's consumer did not run
    assert.are.equal(failed0 + 3, W:stats().tasks_failed)   -- both failures and the consumer not run
    H.check_vector_add(W, K.vector_add)
  end)

  it("reports a Lua error in a sub callable with its message and traceback", function()
    local bad = W:register(function(args) error("sub exploded with " .. args:scalar(1)) end, "exploder")
    local ok, err = pcall(W.run, W, function(orch) orch:submit_sub(bad, pto.args{scalars = {42}}) end)
    assert.is_false(ok)
    assert.are.equal("Worker:run: ", err:sub(1, 12), err)
    assert.truthy(err:find("callable 'exploder' on sub %d"), err)
    assert.truthy(err:find("sub exploded with 42", 1, true), err)
    assert.truthy(err:find("api_spec.lua:%d+:"), err)
    assert.truthy(err:find("stack traceback", 1, true), err)
    H.check_vector_add(W, K.vector_add)
  end)

  it("propagates an error raised by fn unchanged, after draining in-flight tasks", function()
    local t = pto.tensor{4}
    local obj = setmetatable({}, {__tostring = function() return "my error object" end})
    local start = now()
    local ok, err = pcall(W.run, W, function(orch)
      sleep(orch, 200000, {t, "out"})
      fill(orch, 7, {t, "inout"})
      error(obj)
    end)
    assert.is_false(ok)
    assert.is_true(rawequal(obj, err))
    assert.is_true(now() - start >= 0.2 - EPS, "run returned before its tasks drained")
    assert.are.same({7, 7, 7, 7}, t:totable())
    ok, err = pcall(W.run, W, function() error("plain text", 0) end)
    assert.are.equal("plain text", err)
    -- fn's own error wins over a task failure
    ok, err = pcall(W.run, W, function(orch)
      orch:submit_next_level(K.fail, pto.args{scalars = {1}})
      error(obj)
    end)
    assert.is_true(rawequal(obj, err))
    H.check_vector_add(W, K.vector_add)
  end)

  it("closes idempotently, as a to-be-closed value, and by __gc", function()
    local w = pto.Worker{chips = 1}
    local h = w:register(pto.chip_kernel("vector_add"))
    H.check_vector_add(w, h)
    w:close()
    assert.is_true(w.closed)
    w:close()
    assert.truthy(tostring(w):find("closed"))
    assert_error(function() w:run(function() end) end, "Worker:run: ", "closed")
    local ref
    do
      local w2 <close> = pto.Worker{chips = 1, num_sub_workers = 1}
      ref = w2
      H.check_vector_add(w2, w2:register(pto.chip_kernel("vector_add")))
      assert.is_false(w2.closed)
    end
    assert.is_true(ref.closed)
    -- A Worker dropped without close: __gc closes it, so it leaves the
    -- list of live Workers, and its threads and child processes go.
    local workers0, procs0, threads0 = #pto.workers(), H.descendants(), H.thread_count()
    local weak = setmetatable({}, {__mode = "v"})
    local function drop()   -- in its own frame, so no register keeps the Worker alive
      local w3 = pto.Worker{chips = 1, num_sub_workers = 1}
      w3:init()
      weak[1] = w3
      assert.equal(workers0 + 1, #pto.workers())
      if H.MODE == "process" then assert.is_true(#H.descendants() > #procs0, "w3 has no child processes") end
      assert.is_true(H.thread_count() > threads0, "w3 has no threads")
    end
    drop()
    collectgarbage()
    collectgarbage()
    assert.is_nil(weak[1], "the dropped Worker was not collected")
    assert.equal(workers0, #pto.workers())
    assert.is_true(H.eventually(function() return table.concat(H.descendants(), " ") == table.concat(procs0, " ") end, 2),
                   "the collected Worker's child processes outlived it")
    assert.is_true(H.eventually(function() return H.thread_count() == threads0 end, 2),
                   "the collected Worker's threads outlived it")
  end)

  it("reports flow-control statistics", function()
    local w = pto.Worker{chips = 1, num_sub_workers = 1, heap_ring_size = 1 << 20}
    local hadd = w:register(pto.chip_kernel("vector_add"))
    local hsub = w:register(function() end)
    local s0 = w:stats()
    assert.are.equal(0, s0.tasks_submitted)
    local a, b = pto.tensor{16}, pto.tensor{16}
    w:run(function(orch)
      local c = pto.tensor_spec{16}
      orch:submit_next_level(hadd, pto.args{a, b, {c, "out"}})
      orch:submit_sub(hsub, pto.args{c})
      orch:alloc({16}, "f32")
    end)
    local s = w:stats()
    assert.are.equal(2, s.tasks_submitted)
    assert.are.equal(2, s.tasks_completed)
    assert.are.equal(0, s.tasks_failed)
    assert.are.equal(1, s.allocs)
    assert.are.equal(1, s.runs)
    assert.are.equal(3, s.level)
    assert.are.equal(1, s.chips)
    assert.are.equal(1, s.sub_workers)
    assert.are.equal(0, s.tasks_live)
    for _, k in ipairs{"tasks_live_hwm", "ready_hwm", "tensormap_hwm", "tensormap_live"} do
      assert.are.equal("integer", math.type(s[k]), k)
    end
    assert.is_true(s.tasks_live_hwm >= 2)
    assert.are.equal(4, #s.rings)
    for i, r in ipairs(s.rings) do
      assert.are.equal(i - 1, r.ring)
      assert.are.equal(1 << 20, r.capacity_bytes)
      assert.are.equal(0, r.stalls)
      assert.are.equal(0, r.stall_ms)
      assert.are.equal(0, r.used_bytes)
      assert.are.equal(0, r.live_slabs)
    end
    assert.is_true(s.rings[1].hwm_bytes >= 2 * 1024)   -- the automatic OUTPUT's slab and the alloc
    local report = w:stats_report()
    assert.truthy(report:find("Flow Control Statistics", 1, true))
    assert.truthy(report:find("Tasks: 2 submitted, 2 completed, 0 failed", 1, true), report)
    assert.truthy(w:stats_report{full = true}:find("\n  3 ", 1, true))   -- the long form lists every ring
    assert.truthy(report:find("Sizing Recommendations", 1, true))
    w:close()
  end)

  it("prints the same report with print_stats", function()
    local script = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write([[
      local w = pto.Worker{chips = 1}
      local h = w:register(pto.chip_kernel("fill"))
      w:run(function(orch) orch:submit_next_level(h, pto.args{{pto.tensor{4}, "out"}, scalars = {1.0}}) end)
      io.stdout:write(w:stats_report(), "<<END>>\n")
      io.stdout:flush()
      w:print_stats()
      w:close()
    ]])
    f:close()
    local p = assert(io.popen(("%q %q 2>&1"):format(assert(os.getenv("PTOLUA")), script)))
    local out = p:read("a")
    local ok = p:close()
    os.remove(script)
    assert.is_true(ok, out)
    local report, printed = out:match("^(.*)<<END>>\n(.*)$")
    assert.truthy(report, out)
    assert.truthy(report:find("Tasks: 1 submitted, 1 completed", 1, true), report)
    assert.are.equal(report, printed)
  end)

  it("runs tasks on tensors created after init", function()
    local w = pto.Worker{chips = 1, num_sub_workers = 1}
    local h = w:register(pto.chip_kernel("vector_add"))
    local hs = w:register(function(args) local t = args:tensor(1); for i = 1, #t do t[i] = t[i] + 1 end end)
    w:init()
    local a, b, c = pto.tensor({32}, "i32"), pto.tensor({32}, "i32"), pto.tensor({32}, "i32")
    a:fill(1)
    b:fill(2)
    w:run(function(orch)
      orch:submit_next_level(h, pto.args{a, b, {c, "out"}})
      orch:submit_sub(hs, pto.args{{c, "inout"}})
    end)
    for i = 1, 32 do assert.are.equal(4, c[i]) end
    w:close()
  end)
end)

describe("orchestrator", function()
  it("submits next-level tasks with and without a CallConfig; ids count from 0 in each run", function()
    local a, b, c, d = pto.tensor{8}, pto.tensor{8}, pto.tensor{8}, pto.tensor{8}
    for i = 1, 8 do a[i] = i; b[i] = 10 end
    for _ = 1, 2 do
      local ids = {W:run(function(orch)
        local i1 = orch:submit_next_level(K.vector_add, pto.args{a, b, {c, "out"}})
        local i2 = orch:submit_next_level(K.vector_mul, pto.args{c, b, {d, "out"}}, pto.CallConfig{block_dim = 4})
        local i3 = orch:submit_next_level(K.vector_scale, pto.args{d, {d, "out_existing"}, scalars = {0.5}}, nil)
        return i1, i2, i3
      end)}
      assert.are.same({0, 1, 2}, ids)
    end
    for i = 1, 8 do
      assert.are.equal(i + 10, c[i])
      assert.are.equal((i + 10) * 5, d[i])
    end
  end)

  it("pins next-level tasks with {worker = id}: pinned to one chip they serialise", function()
    local u1, u2 = pto.tensor{4}, pto.tensor{4}
    local function twice(p1, p2)
      run(function(orch)
        orch:submit_next_level(K.sleep_us, targs(200000, {u1, "out"}), nil, p1)
        orch:submit_next_level(K.sleep_us, targs(200000, {u2, "out"}), nil, p2)
        mark(orch, 1, {u1, "in"}, {u2, "in"})
      end)
      return entry(1).t
    end
    local same = twice({worker = 2}, {worker = 2})
    assert.is_true(same >= 0.4 - EPS, ("two tasks pinned to chip 2 overlapped (%.3f s)"):format(same))
    local apart = twice({worker = 1}, {worker = 2})
    assert.is_true(apart >= 0.2 - EPS and apart < 0.4, ("pinned to chips 1 and 2: %.3f s"):format(apart))
    local free = twice(nil, nil)
    assert.is_true(free >= 0.2 - EPS and free < 0.4, ("unpinned: %.3f s"):format(free))
  end)

  it("pins sub tasks with {worker = id}", function()
    run(function(orch)
      orch:submit_sub(MARK, targs(1), {worker = 1})
      orch:submit_sub(MARK, targs(2), {worker = 2})
      orch:submit_sub(MARK, targs(3), {worker = 1})
      orch:submit_sub(MARK, targs(4), {worker = 2})
    end)
    assert.are.equal(entry(1).thread, entry(3).thread)
    assert.are.equal(entry(2).thread, entry(4).thread)
    assert.are_not.equal(entry(1).thread, entry(2).thread)
  end)

  it("submit_next_level_group runs members on distinct chips; a consumer waits for all", function()
    local u1, u2 = pto.tensor{4}, pto.tensor{4}
    for _, opts in ipairs{{}, {workers = {2, 1}}} do
      local r = run(function(orch)
        local g = orch:submit_next_level_group(K.sleep_us,
          {targs(300000, {u1, "out"}), targs(250000, {u2, "out"})}, pto.CallConfig(), opts.workers and opts)
        local c = mark(orch, 1, {u2, "in"})   -- reads only the faster member's output
        return {g = g, size = orch:task(g).group_size, kind = orch:task(g).kind, cp = producers(orch, c)}
      end)
      assert.are.equal(2, r.size)
      assert.are.equal("next_level", r.kind)
      assert.are.same({r.g}, r.cp)
      local t = entry(1).t
      assert.is_true(t >= 0.3 - EPS, ("the consumer did not wait for every member (%.3f s)"):format(t))
      assert.is_true(t < 0.55, ("the members did not run in parallel (%.3f s)"):format(t))
    end
  end)

  it("submit_sub_group runs members on distinct sub workers; a consumer waits for all", function()
    local u1, u2 = pto.tensor{4}, pto.tensor{4}
    local r = run(function(orch)
      local g = orch:submit_sub_group(MARK, {targs(1, {u1, "out"}), targs(2, {u2, "out"})})
      local c = mark(orch, 3, {u1, "in"})
      local p = orch:submit_sub_group(MARK, {targs(4), targs(5)}, {workers = {2, 1}})
      orch:submit_sub(MARK, targs(6), {worker = 2})
      return {g = g, cp = producers(orch, c), size = orch:task(g).group_size, p = p}
    end)
    assert.are.equal(2, r.size)
    assert.are.same({r.g}, r.cp)
    assert.are_not.equal(entry(1).thread, entry(2).thread)
    assert.is_true(before(1, 3) and before(2, 3))
    assert.are.equal(entry(6).thread, entry(4).thread)   -- member 1 was pinned to sub worker 2
    assert.are_not.equal(entry(4).thread, entry(5).thread)
  end)

  it("submits sub tasks with and without args; sub tensors alias the submitted storage", function()
    local t, res = pto.tensor({8}, "i32"), pto.tensor({8}, "i32")
    BOX[1]:fill(0)
    BOX[2]:fill(0)
    run(function(orch)
      orch:submit_sub(NOARGS)
      orch:submit_sub(WRITER, pto.args{{t, "out"}, scalars = {3, 2.5}})
      orch:submit_next_level(K.copy, pto.args{t, {res, "out"}})
    end)
    local seen = H.recv(BOX[1])
    assert.are.equal(0, H.recv(BOX[2]).empty)
    assert.are.same({1, "i32", {8}, 3, 2.5, 2}, {seen.n, seen.dtype, seen.shape, seen.i, seen.f, seen.count})
    for i = 1, 8 do
      assert.are.equal(3 * i, t[i])
      assert.are.equal(3 * i, res[i])
    end
  end)

  it("invalidates a sub's argument tensors after the call", function()
    -- the sub keeps its argument in its own Lua state (pinned: one sub worker
    -- keeps it) and touches it in its next call
    BOX[3]:fill(0)
    run(function(orch) orch:submit_sub(KEEPER, pto.args{pto.tensor{4}, scalars = {1}}, {worker = 1}) end)
    run(function(orch) orch:submit_sub(KEEPER, pto.args{scalars = {2}}, {worker = 1}) end)
    local r = H.recv(BOX[3])
    assert.is_false(r.ok)
    assert_error(function() error(r.err, 0) end, "Tensor: ", "valid only during that call")
  end)

  it("allocates from the scope's heap ring with orch:alloc", function()
    local res = pto.tensor({16}, "f32")
    local kept, inner
    run(function(orch)
      local x = orch:alloc({16}, "f32")
      assert.are.same({16}, x.shape)
      assert.are.equal("f32", x.dtype)
      x:fill(2)
      x[16] = 5
      assert.are.equal(5, x[16])
      orch:submit_next_level(K.copy, pto.args{x, {res, "out"}})
      orch:scope(function()
        inner = orch:alloc({4}, "i32")
        inner[1] = 9
        assert.are.equal(9, inner[1])
      end)
      assert_error(function() return inner[1] end, "Tensor: ", "lives only until its scope ends")
      assert.are.equal(2, x[1])   -- the outer scope's alloc is still alive
      kept = x
    end)
    for i = 1, 15 do assert.are.equal(2, res[i]) end
    assert.are.equal(5, res[16])
    assert_error(function() return kept[1] end, "Tensor: ", "lives only until its scope ends")
    assert_error(function() kept:fill(0) end, "Tensor:fill: ", "lives only until its scope ends")
  end)

  it("makes heap-ring tensors stale at every scope depth a run reached, depths first reached late included", function()
    local w <close> = pto.Worker{chips = 1}
    w:init()
    local got = {}
    for run = 1, 2 do
      local outer, mid, deep = nil, nil, {}
      w:run(function(orch)
        orch:scope(function() mid = orch:alloc({4}, "f32") end)   -- depth 2 reached and left first
        outer = orch:alloc({4}, "f32")
        orch:scope(function()
          orch:scope(function() orch:scope(function() deep[1] = orch:alloc({4}, "f32") end) end)
          assert_error(function() return deep[1][1] end, "Tensor: ", "lives only until its scope ends")
          orch:scope(function() orch:scope(function()
            deep[2] = orch:alloc({4}, "f32")
            deep[2][1] = run
            got[run] = deep[2][1]
          end) end)
        end)
        assert_error(function() return mid[1] end, "Tensor: ", "lives only until its scope ends")
        outer[1] = 7
        assert.are.equal(7, outer[1])
      end)
      for _, t in ipairs{outer, deep[2]} do
        assert_error(function() return t[1] end, "Tensor: ", "lives only until its scope ends")
      end
    end
    assert.are.same({1, 2}, got)
  end)

  it("keeps an alloc'd tensor alive while a task writes it, whatever its tag, after its scope ended", function()
    local w = pto.Worker{chips = 1, heap_ring_size = 4096}
    local sl = w:register(pto.chip_kernel("sleep_us"))
    local xa, ya, dt
    w:run(function(orch)
      do
        local s <close> = orch:scope()
        local x = orch:alloc({512}, "f32")   -- 2 KiB of the 4 KiB ring
        xa = x.address
        orch:submit_next_level(sl, targs(200000, {x, "out"}))   -- an OUTPUT writer, still running at scope end
      end
      local t0 = now()
      do
        local s <close> = orch:scope()
        ya = orch:alloc({768}, "f32").address   -- 3 KiB: fits only once the writer is done
      end
      dt = now() - t0
    end)
    assert.is_true(dt >= 0.2 - EPS, ("the writer's slab was recycled while it ran (%.3f s)"):format(dt))
    assert.are.equal(1, w:stats().rings[2].stalls)
    assert.are.equal(xa, ya)   -- the same ring memory, once free
    w:close()
  end)

  it("allocates unset OUTPUTs (pto.tensor_spec) at submit, readable inside their scope", function()
    local a, b, res = pto.tensor{16}, pto.tensor{16}, pto.tensor{16}
    for i = 1, 16 do a[i] = i; b[i] = 2 * i end
    local spec = pto.tensor_spec({16}, "f32")
    local s1, s2 = pto.tensor_spec({16}, "f32"), pto.tensor_spec({4, 4}, "i32")
    assert.is_false(spec.is_set)
    assert.are.same({16}, spec.shape)
    local r = run(function(orch)
      local id = orch:submit_next_level(K.vector_add, pto.args{a, b, {spec, "out"}})
      assert.is_true(spec.is_set)
      assert.are.same({16}, spec.shape)
      local info = H.wait_state(orch, id, {"completed"})
      local vals = spec:totable()
      local c = orch:submit_next_level(K.copy, pto.args{spec, {res, "out"}})
      local two = sleep(orch, 1, {s1, "out"}, {s2, "out"})   -- two unset OUTPUTs of one submit
      return {id = id, info = info, vals = vals, cp = producers(orch, c), a1 = s1.address, a2 = s2.address,
              two = orch:task(two), s2shape = s2.shape, s2dtype = s2.dtype}
    end)
    for i = 1, 16 do
      assert.are.equal(3 * i, r.vals[i])
      assert.are.equal(3 * i, res[i])
    end
    assert.are.same({r.id}, r.cp)
    assert.are.equal("integer", math.type(r.info.ring))
    assert.is_true(r.info.slab_bytes >= 64)
    -- one packed slab, each OUTPUT 1024-byte aligned in it
    assert.are.same({4, 4}, r.s2shape)
    assert.are.equal("i32", r.s2dtype)
    assert.is_true(r.two.slab_bytes >= 2 * 1024, r.two.slab_bytes)
    assert.is_true(r.a2 > r.a1 and (r.a2 - r.a1) % 1024 == 0 and r.a2 - r.a1 < r.two.slab_bytes)
    assert_error(function() return spec[1] end, "Tensor: ", "scope ends")
  end)

  it("opens scopes as a function, a to-be-closed value and raw begin/end", function()
    local r = run(function(orch)
      local out = {}
      out.d0 = orch:scope_depth()
      out.ret = {orch:scope(function(o)
        assert.are.equal(orch, o)
        return orch:scope_depth(), "b"
      end)}
      do
        local s <close> = orch:scope()
        out.d1 = orch:scope_depth()
        do
          local s2 <close> = orch:scope()
          out.d2 = orch:scope_depth()
        end
        out.d1b = orch:scope_depth()
      end
      out.after = orch:scope_depth()
      out.raw = orch:scope_begin()
      orch:scope_end()
      out.rawafter = orch:scope_depth()
      local ok = pcall(orch.scope, orch, function() error("inside") end)
      out.err_ok, out.err_depth = ok, orch:scope_depth()
      for i = 1, pto.MAX_SCOPE_DEPTH do assert.are.equal(i, orch:scope_begin()) end
      out.max = orch:scope_depth()
      assert_error(function() orch:scope_begin() end, "orch:scope_begin: ", "64")
      for _ = 1, pto.MAX_SCOPE_DEPTH do orch:scope_end() end
      assert_error(function() orch:scope_end() end, "orch:scope_end: ", "scope_begin")
      return out
    end)
    assert.are.same({d0 = 0, ret = {1, "b"}, d1 = 1, d2 = 2, d1b = 1, after = 0, raw = 1, rawafter = 0, err_ok = false,
                     err_depth = 0, max = 64}, r)
    assert.are.equal(64, pto.MAX_SCOPE_DEPTH)
  end)

  it("inspects tasks: orch:task, orch:tasks, orch:dag, orch:dot", function()
    local x, y, z = pto.tensor{4}, pto.tensor{4}, pto.tensor{4}
    -- Dispatch held: nothing runs until the release below, so each state
    -- is known once W:sync() has wired the submits.
    W:hold()
    local ok, err = pcall(run, function(orch)
      local a = orch:submit_next_level(K.vector_add, pto.args{x, y, {z, "out"}})
      local b = mark(orch, 1, {z, "in"})
      orch:alloc({4}, "f32")                 -- id 2, an alloc slot
      local spec = pto.tensor_spec{4}
      local d = orch:submit_next_level(K.copy, pto.args{z, {spec, "out"}})
      W:sync()
      local ta, tb, td = orch:task(a), orch:task(b), orch:task(d)
      assert.are.same({0, 1, 3}, {a, b, d})
      assert.are.same({"ready", "pending", "pending"}, {ta.state, tb.state, td.state})
      for _, t in ipairs{ta, tb, td} do
        assert.are.equal("integer", math.type(t.callable))
        assert.are.equal("integer", math.type(t.fanout))
        assert.is_nil(t.error)
      end
      assert.are.equal(a, ta.id)
      assert.are.equal("next_level", ta.kind)
      assert.are.equal("sub", tb.kind)
      assert.are.equal(0, ta.fanin)
      assert.are.same({}, ta.producers)
      assert.are.same({b, d}, sorted(ta.consumers))
      assert.are.equal(1, tb.fanin)
      assert.are.same({a}, tb.producers)
      assert.are.same({}, tb.consumers)
      assert.is_nil(ta.ring)                 -- no slab
      assert.are.equal("integer", math.type(td.ring))
      local list = orch:tasks()
      assert.are.equal(4, #list)
      assert.are.equal(orch:task_count(), #list)
      for i, t in ipairs(list) do assert.are.equal(i - 1, t.id) end
      assert.are.equal("alloc", list[3].kind)
      local dag = orch:dag()
      assert.are.equal(4, #dag.nodes)
      local edges = {}
      for _, e in ipairs(dag.edges) do edges[#edges + 1] = e.from .. "->" .. e.to end
      table.sort(edges)
      assert.are.same({"0->1", "0->3"}, edges)
      local dot = orch:dot()
      assert.truthy(dot:find("^digraph pto {\n"), dot)
      assert.truthy(dot:find("\n}\n$"), dot)
      local nodes, arrows = 0, 0
      for line in dot:gmatch("[^\n]+") do
        if line:find("^  t%d+ %[label=\".*\", fillcolor=%w+%];$") then nodes = nodes + 1
        elseif line:find("^  t%d+ %-> t%d+;$") then arrows = arrows + 1
        else assert.truthy(line == "digraph pto {" or line == "}" or line:find("^  %w+ ?%[?.*;$"), line) end
      end
      assert.are.equal(4, nodes)
      assert.are.equal(2, arrows)
      assert.truthy(dot:find("  t0 -> t1;", 1, true))
      assert.truthy(dot:find("  t0 -> t3;", 1, true))
      -- a failed task carries its error while the run lasts
      W:release()
      local f = orch:submit_next_level(K.fail, pto.args{scalars = {3}})
      local tf = H.wait_state(orch, f, {"failed"})
      assert.truthy(tf.error and tf.error:find("fail kernel called with code 3", 1, true), tf.error)
      assert.truthy(orch:dot():find("fillcolor=tomato", 1, true))
    end)
    W:release()   -- also when an assertion above failed while held
    if type(err) ~= "string" then error(err, 0) end   -- that assertion's own report
    assert.is_false(ok)
    assert.truthy(err:find("code 3", 1, true), err)
  end)

  it("is unusable after its run", function()
    local kept = W:run(function(orch) return orch end)
    assert.truthy(tostring(kept):find("run ended", 1, true))
    assert_error(function() kept:submit_sub(MARK, targs(1)) end, "orch:submit_sub: ", "run has ended")
    assert_error(function() kept:task(0) end, "orch:task: ", "run has ended")
    assert_error(function() kept:tasks() end, "orch:tasks: ", "run has ended")
    assert_error(function() kept:dag() end, "orch:dag: ", "run has ended")
    assert_error(function() kept:dot() end, "orch:dot: ", "run has ended")
  end)
end)

describe("sub callables in each mode", function()
  it("report through shared tensors in both modes; their Lua assignments reach the parent only in thread mode",
     function()
    local w = pto.Worker{num_sub_workers = 1}
    local log, out = {}, pto.tensor({2}, "i64")
    local late                                  -- assigned by the script after init
    local h = w:register(function(args)
      log[#log + 1] = args:scalar(1)            -- the parent's table in thread mode, the child's copy in process mode
      out[1] = #log                             -- counts the calls this Lua state has seen
      out[2] = late or -1
    end, "logger")
    w:init()
    late = 7
    w:run(function(orch) orch:submit_sub(h, pto.args{scalars = {5}}) end)
    w:run(function(orch) orch:submit_sub(h, pto.args{scalars = {6}}) end)
    assert.are.equal(2, out[1])                 -- one Lua state per sub worker, kept across runs
    if w.mode == "thread" then
      assert.are.same({5, 6}, log)              -- the sub ran in this Lua state
      assert.are.equal(7, out[2])               -- and saw the assignment made after init
    else
      assert.are.same({}, log)                  -- the child's copy of log got the entries
      assert.are.equal(-1, out[2])              -- the child's Lua state is a copy taken at init
    end
    w:close()
  end)

  it("run in parallel on distinct sub workers in process mode, one at a time in thread mode", function()
    local w = pto.Worker{num_sub_workers = 2}
    local span = pto.tensor({4}, "f64")         -- start and end of each sub, from pto.now()
    local busy = w:register(function(args)
      local i = args:scalar(1)
      span[2 * i - 1] = now()
      local stop = now() + 0.1
      while now() < stop do end
      span[2 * i] = now()
    end, "busy")
    w:init()
    w:run(function(orch) orch:submit_sub_group(busy, {pto.args{scalars = {1}}, pto.args{scalars = {2}}}) end)
    local s1, e1, s2, e2 = span[1], span[2], span[3], span[4]
    assert.is_true(e1 - s1 >= 0.1 and e2 - s2 >= 0.1)
    local overlap = math.min(e1, e2) - math.max(s1, s2)
    if w.mode == "process" then
      assert.is_true(overlap > 0.05, ("the two subs overlapped %.3f s"):format(overlap))
    else
      assert.is_true(overlap <= 0, ("the two subs overlapped %.3f s under the interpreter lock"):format(overlap))
    end
    w:close()
  end)

  H.thread_only("a sub's argument tensor kept in a parent variable is invalid after the call",
                "a forked sub cannot assign the parent's variables", function()
    local kept
    local keeper = W:register(function(args) kept = args:tensor(1) end)
    run(function(orch) orch:submit_sub(keeper, pto.args{pto.tensor{4}}) end)
    assert_error(function() return kept[1] end, "Tensor: ", "valid only during that call")
  end)

  H.thread_only("subs run one at a time with the script's Lua code, so they may share Lua tables",
                "each sub worker has its own Lua state", function()
    local seen, inside = {}, false
    local h = W:register(function(args)
      assert(not inside, "two subs ran at once")
      inside = true
      for _ = 1, 1000 do seen[#seen + 1] = args:scalar(1) end
      inside = false
    end, "appender")
    run(function(orch)
      for i = 1, 8 do orch:submit_sub(h, pto.args{scalars = {i}}) end
    end)
    assert.are.equal(8000, #seen)
    local counts = {}
    for _, v in ipairs(seen) do counts[v] = (counts[v] or 0) + 1 end
    for i = 1, 8 do assert.are.equal(1000, counts[i]) end
  end)

  -- In THREAD mode the script and the subs share one Lua state and its
  -- lock; the lock is not handed over at every submit (that traded it per
  -- task), so these two show that a sub still gets it when it must.
  it("runs a Lua sub while the orchestrator goes on submitting, without waiting for the drain", function()
    local seen_at
    run(function(orch)
      mark(orch, 1)
      local t0 = now()
      while now() - t0 < 5 do
        sleep(orch, 0)
        if START[1] >= 0 then
          seen_at = now() - t0
          break
        end
      end
    end)
    assert.truthy(seen_at, "sub 1 did not run while the orchestrator submitted for 5 s")
  end)

  it("lets the Lua subs run while a submit waits for heap-ring room they free", function()
    local w <close> = pto.Worker{chips = 1, num_sub_workers = 1, heap_ring_size = 64 << 10, alloc_timeout_ms = 3000}
    local used = pto.tensor({1}, "i64")   -- shared: the sub may run in a forked child
    local consume = w:register(function(args) used[1] = used[1] + #args:tensor(1) end, "consume")
    w:run(function(orch)
      for _ = 1, 64 do   -- 16 KiB each: the ring holds four
        orch:scope(function()
          local p = orch:alloc({4096}, "f32")
          orch:submit_sub(consume, pto.args{{p, "in"}})
        end)
      end
    end)
    assert.are.equal(64 * 4096, used[1])
  end)
end)

describe("dispatch order", function()
  -- One chip, so no other worker can take anything; eight tasks ready at
  -- once, then a consumer of the first. When the first ends, its consumer
  -- goes ahead of the seven still waiting (with what the first wrote still
  -- in that worker's caches), instead of behind them all. A PROCESS-mode
  -- child has a few tasks posted in its mailbox already, which go first;
  -- so the test asks only that the consumer start before the last of them.
  it("runs a consumer made ready by a finished task ahead of the tasks that were ready before it", function()
    local w <close> = pto.Worker{chips = 1}
    local k = H.kernels(w)
    w:init()
    local n, us = 8, 30000
    local outs = {}
    for i = 1, n do outs[i] = pto.tensor({1}, "f32") end
    local b = pto.tensor({1}, "f32")
    w:run(function(orch)
      for i = 1, n do orch:submit_next_level(k.sleep_us, targs(us, {outs[i], "out"})) end
      orch:submit_next_level(k.sleep_us, targs(0, {outs[1], "in"}, {b, "out"}))
    end)
    local start = {}
    for _, t in ipairs(w:profile().timeline) do start[t.id] = t.start_ms end
    assert.is_true(start[n] < start[n - 1],
                   ("the consumer (task %d) started at %.1f ms, after the last of the tasks ready before it (task %d, " ..
                    "%.1f ms): it waited behind all of them"):format(n, start[n], n - 1, start[n - 1]))
  end)

  -- The consumer goes to the worker its producer ran on, which by then has
  -- begun a long task: the idle chip must take it rather than let it wait.
  it("does not leave a consumer waiting behind a long task while another worker idles", function()
    local w <close> = pto.Worker{chips = 2}
    local k = H.kernels(w)
    w:init()
    local x, y, z = pto.tensor({1}, "f32"), pto.tensor({1}, "f32"), pto.tensor({1}, "f32")
    local long = 400000
    w:run(function(orch)
      orch:submit_next_level(k.sleep_us, targs(20000, {x, "out"}), nil, {worker = 1})
      orch:submit_next_level(k.sleep_us, targs(long, {z, "out"}), nil, {worker = 1})
      orch:submit_next_level(k.sleep_us, targs(0, {x, "in"}, {y, "out"}))
    end)
    local t = {}
    for _, e in ipairs(w:profile().timeline) do t[e.id] = e end
    assert.is_true(t[2].start_ms < t[1].finish_ms - long / 2000,
                   ("the consumer started at %.1f ms, behind the long task on %s (%.1f to %.1f ms), while the " ..
                    "other chip idled"):format(t[2].start_ms, t[1].lane, t[1].start_ms, t[1].finish_ms))
  end)
end)
