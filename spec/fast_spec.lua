-- fast_spec.lua: the fast form for hot loops (docs/lua.md, "Submitting in
-- hot loops"): prepared submits (orch:prepare_next_level, orch:prepare_sub),
-- pto.temp and positional views. A prepared submit must infer exactly the
-- dependencies the plain form infers for the same tensors and tags (seen
-- through orch:task(id).producers, recorded at submit), compute the same
-- results, raise the same misuse errors with its own name in front, and
-- make no Lua garbage per call (seen through collectgarbage("count"), not
-- through timing).
local pto = require "pto"
local H = require "helpers"

local assert_error, sorted = H.assert_error, H.sorted

local W, K, NOOP, SUB
local BOX = H.box()
local PREPARED = "orch:submit_next_level (prepared): "

setup(function()
  W = pto.Worker{chips = 2, num_sub_workers = 1, heap_ring_size = 4 << 20}
  K = H.kernels(W)
  NOOP = W:register(pto.chip_kernel("noop"))
  local send = H.send
  SUB = W:register(function(args) send(BOX, {args:tensor_count(), args:scalar(1), args:tensor(1)[2]}) end, "fast_sub")
  W:init()
end)

teardown(function() W:close() end)

local function producers(orch, id) return sorted(orch:task(id).producers) end

local function filled(n, f)
  local t = pto.tensor({n}, "f32")
  for i = 1, n do t[i] = f(i) end
  return t
end

-- The same little DAG, written plainly or prepared: returns each task's
-- producers, in submit order.
local function dag(orch, prepared)
  local a, b = filled(8, function(i) return i end), filled(8, function(i) return 10 * i end)
  local c, d = pto.tensor({8}, "f32"), pto.tensor({8}, "f32")
  local spec = pto.tensor_spec({8}, "f32")
  local ids, deps = {}, {}
  -- Held: a producer that finished before its consumer's submit would need
  -- no edge, so without the hold the lists would depend on timing.
  W:hold()
  local function rec(id)   -- producers right at submit: the task may be reclaimed later
    ids[#ids + 1] = id
    deps[#deps + 1] = producers(orch, id)
  end
  if prepared then
    local add = orch:prepare_next_level(K.vector_add, {"in", "in", "out"})
    local scale = orch:prepare_next_level(K.vector_scale, {"in", "out"})
    local copy = orch:prepare_next_level(K.copy, {"in", "out"})
    local acc = orch:prepare_next_level(K.tile_add, {"inout", "in"})
    rec(add(a, b, c))                   -- c = a + b
    rec(scale(c, spec, 0.5))            -- spec (automatic OUTPUT) = c / 2
    rec(acc(c, spec))                   -- c += spec: waits for 1 (c) and 2 (spec)
    rec(copy(c:view(4, 4), d:view(0, 4)))   -- a view of c: waits for 3
    rec(copy(a:view(0, 4), d:view(4, 4)))   -- the other half of d: no producer
    rec(add(d, spec, b))                -- waits for 4 and 5 (d) and 2 (spec)
  else
    rec(orch:submit_next_level(K.vector_add, pto.args{{a, "in"}, {b, "in"}, {c, "out"}}))
    rec(orch:submit_next_level(K.vector_scale, pto.args{{c, "in"}, {spec, "out"}, scalars = {0.5}}))
    rec(orch:submit_next_level(K.tile_add, pto.args{{c, "inout"}, {spec, "in"}}))
    rec(orch:submit_next_level(K.copy, pto.args{{c:view{offset = 4, shape = {4}}, "in"},
                                                {d:view{offset = 0, shape = {4}}, "out"}}))
    rec(orch:submit_next_level(K.copy, pto.args{{a:view{offset = 0, shape = {4}}, "in"},
                                                {d:view{offset = 4, shape = {4}}, "out"}}))
    rec(orch:submit_next_level(K.vector_add, pto.args{{d, "in"}, {spec, "in"}, {b, "out"}}))
  end
  for _, p in ipairs(deps) do   -- task ids as submit positions
    for j, pid in ipairs(p) do
      for k, x in ipairs(ids) do if x == pid then p[j] = k end end
    end
    table.sort(p)
  end
  W:release()
  orch:drain()
  local out = {}
  for i = 1, 8 do out[i] = b[i] end
  return deps, out
end

describe("prepared submits", function()
  it("infer the same producers as the plain form, and compute the same results", function()
    local plain_deps, plain_out = W:run(function(orch) return dag(orch, false) end)
    local fast_deps, fast_out = W:run(function(orch) return dag(orch, true) end)
    assert.are.same({{}, {1}, {1, 2}, {3}, {}, {2, 4, 5}}, plain_deps)
    assert.are.same(plain_deps, fast_deps)
    assert.are.same(plain_out, fast_out)
    -- b = d + spec: d = (c + c/2 halves ... ) checked against the plain run above; one value by hand:
    -- c = a + b = 11 i, spec = 5.5 i, c += spec -> 16.5 i; d[1..4] = c[5..8]; b[1] = 16.5 * 5 + 5.5
    assert.are.equal(16.5 * 5 + 5.5, fast_out[1])
  end)

  it("return the task id, pass trailing arguments as scalars, and pin to a worker", function()
    local t = pto.tensor({4}, "i32")
    local ids, worker = W:run(function(orch)
      local fill = orch:prepare_next_level(K.fill, {"out"}, nil, {worker = 2})
      local id = fill(t, 7.0)
      orch:drain()
      return {id, orch:task_count()}, orch:task(id).worker
    end)
    assert.are.equal("integer", math.type(ids[1]))
    assert.are.equal(2, worker)
    for i = 1, 4 do assert.are.equal(7, t[i]) end
  end)

  it("take a CallConfig, as submit_next_level does", function()
    local a, c = filled(4, function(i) return i end), pto.tensor({4}, "f32")
    W:run(function(orch)
      local scale = orch:prepare_next_level(K.vector_scale, {"in", "out"}, pto.CallConfig{block_dim = 2})
      scale(a, c, 2.0)
    end)
    for i = 1, 4 do assert.are.equal(2 * i, c[i]) end
  end)

  it("submit Lua subs with orch:prepare_sub, their tensors and scalars as a plain submit gives them", function()
    local t = filled(4, function(i) return 3 * i end)
    W:run(function(orch)
      local call = orch:prepare_sub(SUB, {"in"})
      call(t, 42)
    end)
    assert.are.same({1, 42, 6}, H.recv(BOX))
  end)

  it("OUTPUT then INPUT of a pto.temp: each consumer waits for the producer of its own iteration", function()
    W:hold()   -- every producer is still pending when its consumer is submitted
    local deps = W:run(function(orch)
      local p = pto.temp({8}, "f32")
      local a = filled(8, function(i) return i end)
      local acc = pto.tensor({8}, "f32")
      local scale = orch:prepare_next_level(K.vector_scale, {"in", "out"})
      local add = orch:prepare_next_level(K.tile_add, {"inout", "in"})
      local ids = {}
      for k = 1, 3 do
        orch:scope_begin()
        ids[#ids + 1] = scale(a, p, k * 1.0)   -- p = k * a, new memory each time
        ids[#ids + 1] = add(acc, p)
        orch:scope_end()
      end
      local out = {}
      for i = 2, 6, 2 do out[#out + 1] = producers(orch, ids[i]) end
      W:release()
      orch:drain()
      out.acc = acc[2]
      out.ids = ids
      return out
    end)
    assert.are.same({deps.ids[1]}, deps[1])
    assert.are.same({deps.ids[2], deps.ids[3]}, deps[2])   -- the acc chain and this iteration's temp
    assert.are.same({deps.ids[4], deps.ids[5]}, deps[3])
    assert.are.equal((1 + 2 + 3) * 2, deps.acc)
  end)

  it("a pto.temp in the plain form behaves as in the prepared form", function()
    W:hold()   -- every producer is still pending when its consumer is submitted
    local r = W:run(function(orch)
      local p = pto.temp({4}, "f32")
      local a, acc = filled(4, function(i) return i end), pto.tensor({4}, "f32")
      local ids = {}
      for k = 1, 2 do
        orch:scope_begin()
        ids[#ids + 1] = orch:submit_next_level(K.vector_scale, pto.args{{a, "in"}, {p, "out"}, scalars = {k * 1.0}})
        ids[#ids + 1] = orch:submit_next_level(K.tile_add, pto.args{{acc, "inout"}, {p, "in"}})
        orch:scope_end()
      end
      local deps = producers(orch, ids[4])
      W:release()
      orch:drain()
      return {deps = deps, ids = ids, v = acc[4]}
    end)
    assert.are.same({r.ids[2], r.ids[3]}, r.deps)
    assert.are.equal(12, r.v)
  end)

  it("keep tensors alive that Lua dropped while their tasks may still run", function()
    local out = pto.tensor({64}, "f32")
    collectgarbage("collect")
    local blocks = pto.shm_stats().live_blocks
    local during = W:run(function(orch)
      local copy = orch:prepare_next_level(K.copy, {"in", "inout"})   -- inout: the copies run in order
      for i = 1, 8 do
        local src = pto.tensor({64}, "f32")
        src:fill(i)
        copy(src, out)
      end
      collectgarbage("collect")   -- the 8 sources are garbage to Lua now
      return pto.shm_stats().live_blocks
    end)
    assert.are.equal(blocks + 8, during)
    assert.are.equal(8, out[64])
    collectgarbage("collect")
    assert.are.equal(blocks, pto.shm_stats().live_blocks)
  end)
end)

describe("prepared submit misuse", function()
  local a, c, spec

  before_each(function()
    a, c = filled(4, function(i) return i end), pto.tensor({4}, "f32")
    spec = pto.tensor_spec({4}, "f32")
  end)

  local function in_run(fn) return function() W:run(fn) end end

  it("wrong arity", function()
    assert_error(in_run(function(orch) orch:prepare_next_level(K.copy, {"in", "out"})(a) end), PREPARED,
                 "expected 2 tensors, one per tag it was prepared with")
  end)

  it("a non-tensor where a tensor goes", function()
    assert_error(in_run(function(orch) orch:prepare_next_level(K.copy, {"in", "out"})(a, 5) end), PREPARED,
                 "argument 2 must be a tensor (prepared with tag 'out'), got number")
    assert_error(in_run(function(orch) orch:prepare_next_level(K.copy, {"in", "out"})(pto.TaskArgs(), c) end),
                 PREPARED, "argument 1 must be a tensor")
  end)

  it("a bad scalar", function()
    assert_error(in_run(function(orch) orch:prepare_next_level(K.fill, {"out"})(c, "x") end), PREPARED,
                 "argument 2: a scalar must be an integer, a float or a boolean (got string)")
  end)

  it("a stale heap-ring tensor", function()
    assert_error(in_run(function(orch)
      local p
      orch:scope(function() p = orch:alloc({4}, "f32") end)
      orch:prepare_next_level(K.copy, {"in", "out"})(p, c)
    end), PREPARED, "tensor 1's storage is gone: it came from a heap ring")
  end)

  it("an unset tensor_spec or an unwritten pto.temp as an input", function()
    assert_error(in_run(function(orch) orch:prepare_next_level(K.copy, {"in", "out"})(spec, c) end), PREPARED,
                 "tensor 1 is an unset pto.tensor_spec tagged 'in'; only an OUTPUT can be unset")
    assert_error(in_run(function(orch) orch:prepare_next_level(K.copy, {"in", "out"})(pto.temp({4}), c) end),
                 PREPARED, "it is a pto.temp that no submit has written yet")
  end)

  it("a pto.temp after its scope ended", function()
    local p = pto.temp({4}, "f32")
    assert_error(in_run(function(orch)
      local copy = orch:prepare_next_level(K.copy, {"in", "out"})
      orch:scope(function() copy(a, p) end)
      copy(p, c)
    end), PREPARED, "lives only until its scope ends")
    assert_error(function() return p[1] end, "Tensor: ", "storage is gone")
  end)

  it("use after the run", function()
    local copy
    W:run(function(orch) copy = orch:prepare_next_level(K.copy, {"in", "out"}) end)
    assert_error(function() copy(a, c) end, PREPARED, "this orchestrator's run has ended")
  end)

  it("bad tags, handles and options at prepare time", function()
    assert_error(in_run(function(orch) orch:prepare_next_level(K.copy, {"in", "sideways"}) end),
                 "orch:prepare_next_level: ", "unknown tag string 'sideways'")
    assert_error(in_run(function(orch) orch:prepare_next_level(K.copy, "in") end), "orch:prepare_next_level: ",
                 "argument 2 must be the list of tags")
    assert_error(in_run(function(orch) orch:prepare_next_level({}, {"in"}) end), "orch:prepare_next_level: ",
                 "must be a handle returned by Worker:register")
    assert_error(in_run(function(orch) orch:prepare_sub(K.copy, {"in"}) end), "orch:prepare_sub: ",
                 "this handle is a chip kernel; submit it with orch:submit_next_level")
    assert_error(in_run(function(orch) orch:prepare_next_level(K.copy, {"in", "out"}, nil, {worker = 9}) end),
                 "orch:prepare_next_level: ", "worker 9 does not exist")
    assert_error(in_run(function(orch) orch:prepare_next_level(K.copy, {"in", "out"}, 3) end),
                 "orch:prepare_next_level: ", "expected a CallConfig")
  end)
end)

describe("views and temporaries", function()
  it("t:view(offset, d1, ...) is t:view{offset = offset, shape = {d1, ...}}", function()
    local t = pto.tensor({4, 6}, "f32")
    for i = 1, 24 do t[i] = i end
    local a, b = t:view(7, 2, 3), t:view{offset = 7, shape = {2, 3}}
    assert.are.same(b.shape, a.shape)
    assert.are.equal(b.address, a.address)
    assert.are.same(b:totable(), a:totable())
    assert_error(function() t:view(7, 2, "x") end, "Tensor:view: ", "shape[2] must be an integer")
    assert_error(function() t:view(20, 2, 3) end, "Tensor:view: ", "outside the tensor's 24 elements")
    assert_error(function() t:view(1.5, 2) end, "Tensor:view: ", "offset must be an integer")
  end)

  it("a pto.temp is unset until written, cannot be viewed, and reads its latest memory", function()
    local p = pto.temp({4}, "i32")
    assert.is_false(p.is_set)
    assert.truthy(tostring(p):find("unset", 1, true))
    assert_error(function() p:view(0, 2) end, "Tensor:view: ", "a pto.temp cannot be viewed")
    local seen = W:run(function(orch)
      local fill = orch:prepare_next_level(K.fill, {"out"})
      local r = {}
      for k = 1, 2 do
        orch:scope_begin()
        fill(p, k * 1.0)
        orch:drain()
        r[k] = {p[1], p.is_set}
        orch:scope_end()
      end
      return r
    end)
    assert.are.same({{1, true}, {2, true}}, seen)
  end)
end)

describe("TaskArgs storage", function()
  it("keeps every tensor, inline or beyond, reads it back, and lets go of them on clear", function()
    collectgarbage("collect")
    local blocks = pto.shm_stats().live_blocks
    local a = pto.TaskArgs()
    local ts = {}
    for i = 1, 7 do
      ts[i] = pto.tensor({4}, "f32")
      ts[i]:fill(i)
      a:add_tensor(ts[i], i % 2 == 0 and "out" or "in")
    end
    assert.are.equal(7, a:tensor_count())
    for i = 1, 7 do
      assert.are.equal(ts[i], a:tensor(i))
      assert.are.equal(i % 2 == 0 and "out" or "in", a:tag(i))
    end
    ts = nil   -- luacheck: ignore
    collectgarbage("collect")
    assert.are.equal(blocks + 7, pto.shm_stats().live_blocks)   -- the TaskArgs keeps them
    assert.are.equal(3.0, a:tensor(3)[1])
    a:clear()
    collectgarbage("collect")
    assert.are.equal(blocks, pto.shm_stats().live_blocks)
    assert.are.equal(0, a:tensor_count())
  end)

  it("a submit of 9 tensors through pto.args waits for the writers of the ones beyond the inline four", function()
    local ids = W:run(function(orch)
      local t = {}
      for i = 1, 9 do t[i] = pto.tensor({4}, "f32") end
      local w = orch:submit_next_level(NOOP, pto.args{{t[7], "out"}, {t[9], "out"}})
      local entries = {}
      for i = 1, 9 do entries[i] = {t[i], "in"} end
      local r = orch:submit_next_level(NOOP, pto.args(entries))
      return {w = w, p = producers(orch, r)}
    end)
    assert.are.same({ids.w}, ids.p)
  end)
end)

describe("garbage", function()
  -- KiB the Lua heap grows over fn with the collector stopped: everything
  -- fn allocates, garbage or not.
  local function allocated(fn)
    collectgarbage("collect")
    collectgarbage("stop")
    local before = collectgarbage("count")
    fn()
    local grown = collectgarbage("count") - before
    collectgarbage("restart")
    return grown
  end

  local chain = pto.tensor({16}, "f32")
  local views = {}
  for i = 0, 63 do views[i] = chain:view(0, 16) end
  local temp = pto.temp({16}, "f32")

  -- 10,000 prepared submits: a chain, and bgemm's shape (a temporary per
  -- pair, a scope per 8 tasks).
  local function loop(orch)
    local inout = orch:prepare_next_level(NOOP, {"inout"})
    local gemm = orch:prepare_next_level(NOOP, {"in", "in", "out"})
    local add = orch:prepare_next_level(NOOP, {"inout", "in"})
    for _ = 1, 5000 do inout(chain) end
    for i = 0, 624 do
      orch:scope_begin()
      for k = 0, 3 do
        gemm(views[(i + k) % 64], views[(i * 3 + k) % 64], temp)
        add(views[i % 64], temp)
      end
      orch:scope_end()
    end
  end

  it("a loop of 10,000 prepared submits allocates no Lua object per submit", function()
    W:run(loop)   -- warm: tables reach their size
    local small = allocated(function() W:run(function(orch) orch:prepare_next_level(NOOP, {"inout"})(chain) end) end)
    local big = allocated(function() W:run(loop) end)
    -- a run allocates its orchestrator and a few tables whatever it submits;
    -- 10,000 submits may add less than 1 byte each
    assert.is_true(big - small < 10000 / 1024, ("the loop allocated %.1f KiB more than one submit"):format(big - small))
  end)

  it("leaves the Lua heap flat across runs", function()
    W:run(loop)
    collectgarbage("collect")
    local before = collectgarbage("count")
    for _ = 1, 10 do W:run(loop) end
    collectgarbage("collect")
    local after = collectgarbage("count")
    assert.is_true(after - before < 16, ("the heap grew by %.1f KiB over 10 runs"):format(after - before))
  end)
end)
