-- fuzz_api_spec.lua: random argument types and values to every public Lua
-- function of pto (the module's functions, Worker, orchestrator, Tensor,
-- TaskArgs and CallConfig methods, the metamethods a script can reach),
-- a few thousand calls with a fixed seed (PTO_FUZZ_SEED picks another).
-- What must hold: each call returns or raises a string error, nothing
-- crashes or hangs (CTest's timeout; CI runs this under ASan+UBSan and
-- TSan), and afterwards the fuzzed Worker still runs a correct DAG.
--
-- Left out of the random calls, each for a reason that has nothing to do
-- with its arguments: w:close (the Worker must stay usable; it is closed at
-- the end), w:print_stats (prints on stdout, which carries TAP), and
-- w:trace_start (a string from the pool names a file to write in the
-- source tree). Timeouts given to w:step and w:wait are capped at 50 ms so
-- the spec stays short; every other value is passed as drawn.
local pto = require "pto"
local H = require "helpers"

local SEED = tonumber(os.getenv("PTO_FUZZ_SEED")) or 19
local ROUNDS = 12   -- each round calls every target a few times

describe("the Lua API under random arguments (seed " .. SEED .. ")", function()
  it("raises string errors, never crashes or hangs, and leaves the Worker usable", function()
    math.randomseed(SEED)
    local w = pto.Worker{chips = 2, num_sub_workers = 1, alloc_timeout_ms = 100}
    local k = H.kernels(w)
    local sub = w:register(function(args) return args end, "fuzz_sub")
    local t4, t16 = pto.tensor({4}, "f32"), pto.tensor({4, 4}, "i32")
    local spec, tmp = pto.tensor_spec({8}, "f64"), pto.temp({2, 2})
    local view = t16:view{shape = {2, 2}, offset = 2}

    local strings = {"", "x", "in", "out", "inout", "out_existing", "no_dep", "f32", "i64", "bf16", "bool",
                     "process", "thread", "fill", "vector_add", ("z"):rep(2000), "\0", "%s%n", "chip", "sub"}
    local numbers = {-1, 0, 1, 2, 3, 7, 0.5, -0.0, 1e300, math.huge, -math.huge, 0 / 0, math.maxinteger,
                     math.mininteger, 2 ^ 31, 2 ^ 32 + 1, 2 ^ 53, -2 ^ 63, 1e-300, 4.5}
    local fns = {function() end, function(...) return ... end, function() error("fuzz") end,
                 function() error({}) end}
    local pool = {nil, true, false, t4, t16, spec, tmp, view, w, pto.args{}, pto.CallConfig(),
                  setmetatable({}, {__index = function() error("trap") end}), coroutine.create(print),
                  io.stderr, k.fill, sub, pto}

    local function draw(depth)
      local r = math.random(10)
      if r <= 3 then return numbers[math.random(#numbers)] end
      if r <= 5 then return strings[math.random(#strings)] end
      if r <= 6 then return fns[math.random(#fns)] end
      if r <= 9 or depth > 1 then return pool[math.random(#pool + 1)] end   -- +1: nil
      -- a table: a list, a record of likely keys, or both
      local t = {}
      for i = 1, math.random(0, 4) do t[i] = draw(depth + 1) end
      for _ = 1, math.random(0, 3) do t[strings[math.random(#strings)]] = draw(depth + 1) end
      for _, key in ipairs{"shape", "dtype", "scalars", "lib", "symbol", "mode", "chips", "block_dim",
                           "timeout_ms", "full", "output_prefix"} do
        if math.random(6) == 1 then t[key] = draw(depth + 1) end
      end
      return t
    end
    local function args(n)
      local a = {}
      for i = 1, n or math.random(0, 4) do a[i] = draw(0) end
      return a
    end

    local calls, failed = 0, 0
    local function call(name, fn, a)
      calls = calls + 1
      local ok, err = pcall(fn, table.unpack(a, 1, 4))
      if not ok then
        failed = failed + 1
        -- a table is the pool's own error({}) passed through from a
        -- function the fuzz handed in; everything else must be a message
        assert(type(err) == "string" or type(err) == "table",
               ("%s raised a %s instead of a message"):format(name, type(err)))
      end
    end
    local function capped(a)   -- w:step(n, timeout_s) and w:wait(timeout_s)
      for i = 1, 2 do
        if type(a[i]) == "number" and (a[i] ~= a[i] or a[i] > 0.05) then a[i] = 0.05 end
      end
      return a
    end

    -- Methods are called on the right object most of the time and on a
    -- random value otherwise (a method taken from its table and misused).
    local function fuzz_methods(label, obj, methods, skip, shape_args)
      for name, fn in pairs(methods) do
        if not skip[name] then
          for _ = 1, 3 do
            local self = math.random(5) == 1 and draw(0) or obj
            local a = args()
            if shape_args and shape_args[name] then a = shape_args[name](a) end
            call(label .. ":" .. name, function(...) return fn(self, ...) end, a)
          end
        end
      end
    end

    local wmethods = getmetatable(w).methods
    local wskip = {close = true, print_stats = true, trace_start = true}
    local wshape = {step = function(a) return capped({a[1], a[2]}) end, wait = capped}
    for _ = 1, ROUNDS do
      -- the module's functions
      for name, fn in pairs(pto) do
        if type(fn) == "function" and name:sub(1, 1) ~= "_" then   -- _name: internal
          for _ = 1, 3 do
            local a = args()
            call("pto." .. name, function(...)
              local r = fn(...)
              -- a Worker the fuzz made is closed at once: its children and
              -- threads would otherwise pile up until collected
              if name == "Worker" and r then r:close() end
            end, a)
          end
        end
      end
      -- Worker, Tensor, TaskArgs and CallConfig methods and metamethods
      fuzz_methods("Worker", w, wmethods, wskip, wshape)
      fuzz_methods("Tensor", t4, getmetatable(t4).methods, {})
      fuzz_methods("TaskArgs", pto.args{{t4, "in"}, scalars = {1}}, getmetatable(pto.args{}).__index, {})
      for _ = 1, 10 do
        local t = math.random(2) == 1 and t4 or view
        call("Tensor[]", function(key) return t[key] end, {draw(0)})
        call("Tensor[]=", function(key, v) t[key] = v end, {draw(0), draw(0)})
        local cfg = pto.CallConfig()
        call("CallConfig[]=", function(key, v) cfg[key] = v end, {draw(0), draw(0)})
        call("CallConfig[]", function(key) return cfg[key] end, {draw(0)})
        call("tostring", tostring, {draw(0)})
        call("#", function(v) return #v end, {pool[math.random(#pool)] or t4})
      end
      -- the orchestrator's methods, inside a run, and once more after it
      local orch
      call("Worker:run", function()
        w:release()
        w:run(function(o)
          orch = o
          local omethods = getmetatable(o).methods
          fuzz_methods("orch", o, omethods, {})
          for _ = 1, 4 do   -- well-formed submits mixed in, so tasks really run
            o:submit_next_level(k.fill, pto.args{{pto.tensor({4}, "f32"), "out"}, scalars = {1.5}})
            o:submit_sub(sub, pto.args{scalars = {draw(0) == nil and 1 or 2}})
          end
        end)
      end, {})
      if orch then fuzz_methods("orch (after its run)", orch, getmetatable(orch).methods, {}) end
      -- leave no interactive state for the next round's run
      w:release()
      pcall(w.close_run, w)
      w:clear_break()
    end

    -- The fuzzed Worker still computes, in both modes.
    w:release()
    pcall(w.close_run, w)
    w:clear_break()
    H.check_vector_add(w, k.vector_add, 64)
    local t = pto.tensor({32}, "f32")
    w:run(function(o) o:submit_next_level(k.fill, pto.args{{t, "out"}, scalars = {2.5}}) end)
    for i = 1, 32 do assert.are.equal(2.5, t[i]) end
    w:close()
    assert.is_true(calls > 2000, "only " .. calls .. " calls")
    assert.is_true(failed > 0 and failed < calls, ("%d of %d calls failed"):format(failed, calls))
  end)
end)
