-- misuse_spec.lua: the misuse table (docs/lua.md, conventions: errors). Every case must raise a Lua
-- error whose message starts with the function's name and says what to do,
-- and must leave the shared Worker able to run a correct DAG afterwards.
-- Runs in both modes ($PTO_MODE decides; no Worker here names a mode): a
-- sub callable in process mode runs in a forked copy of the Lua state, so
-- what a case needs from inside a sub comes back through a shared tensor.
--
-- Messages of errors raised from C functions called by Lua code carry
-- luaL_error's "file:line: " position first; helpers.assert_error skips it.
local pto = require "pto"
local H = require "helpers"

local W, K, SUB, OTHER   -- the shared Worker (2 chips, 2 sub workers), its kernels, a sub, another Worker
local SMALL, SLEEP       -- a Worker with 4 KiB heap rings and a 200 ms alloc timeout, and its sleep_us

setup(function()
  W = pto.Worker{chips = 2, num_sub_workers = 2}
  K = H.kernels(W)
  SUB = W:register(function() end, "noop")
  OTHER = pto.Worker{chips = 1}
  SMALL = pto.Worker{chips = 1, heap_ring_size = 4096, alloc_timeout_ms = 200}
  SLEEP = SMALL:register(pto.chip_kernel("sleep_us"))
end)

teardown(function()
  if W then W:close() end
  if OTHER then OTHER:close() end
  if SMALL then SMALL:close() end
end)

-- Run fn(orch) inside a run of W.
local function in_run(fn)
  return function() return W:run(fn) end
end

local function closed_worker()
  local w = pto.Worker{chips = 1, num_sub_workers = 1}
  w:init()
  w:close()
  return w
end

local function ended_orch()
  return W:run(function(orch) return orch end)
end

local t4 = function() return pto.tensor{4} end
local args3 = function() return pto.args{t4(), t4(), {t4(), "out"}} end

local CLOSED = "create a new one with pto.Worker"
local HANDLE = "handle returned by Worker:register"
local ENDED = "valid only while its run lasts"
local DTYPES = "use one of \"f32\""
local TAGS = "use pto.INPUT, pto.OUTPUT"

-- {what, fn, prefix, advice fragment}
local cases = {
  -- pto.tensor / pto.tensor_spec
  {"pto.tensor with a string shape", function() pto.tensor("4x4") end, "pto.tensor: ", "shape must be a table"},
  {"pto.tensor with a negative dimension", function() pto.tensor{4, -1} end, "pto.tensor: ", "must be between 0 and"},
  {"pto.tensor with a non-integer dimension", function() pto.tensor{2.5} end, "pto.tensor: ", "must be an integer"},
  {"pto.tensor with a non-number dimension", function() pto.tensor{"x"} end, "pto.tensor: ", "must be an integer"},
  {"pto.tensor with 0 dimensions", function() pto.tensor{} end, "pto.tensor: ", "1 to 5 dimensions"},
  {"pto.tensor with 6 dimensions", function() pto.tensor{1, 1, 1, 1, 1, 1} end, "pto.tensor: ", "1 to 5 dimensions"},
  {"pto.tensor with an unknown dtype", function() pto.tensor({4}, "f33") end, "pto.tensor: ", DTYPES},
  {"pto.tensor with a number as dtype", function() pto.tensor({4}, 4) end, "pto.tensor: ", DTYPES},
  {"pto.tensor_spec with an unknown dtype", function() pto.tensor_spec({4}, "float") end, "pto.tensor_spec: ", DTYPES},
  {"pto.tensor_spec with a bad shape", function() pto.tensor_spec{0.5} end, "pto.tensor_spec: ", "must be an integer"},

  -- Tensor elements and methods
  {"reading past the last element", function() return t4()[5] end, "Tensor: ", "indexed 1..4"},
  {"reading element 0", function() return t4()[0] end, "Tensor: ", "indexed 1..4"},
  {"writing out of range", function() t4()[-1] = 1 end, "Tensor: ", "indexed 1..4"},
  {"a non-integer index", function() return t4()[1.5] end, "Tensor: ", "index must be an integer"},
  {"assigning a field", function() t4().shape = {2} end, "Tensor: ", "only elements can be assigned"},
  {"a string into a f32 tensor", function() t4()[1] = "x" end, "Tensor: ", "takes numbers"},
  {"a fraction into an i32 tensor", function() pto.tensor({2}, "i32")[1] = 0.5 end, "Tensor: ", "takes integers"},
  {"a string into a bool tensor", function() pto.tensor({2}, "bool")[1] = "yes" end, "Tensor: ", "true/false"},
  {"reading an unset tensor_spec", function() return pto.tensor_spec{4}[1] end, "Tensor: ",
   "pass it as an OUTPUT to a submit first"},
  {"fill with a string", function() t4():fill("x") end, "Tensor:fill: ", "takes numbers"},
  {"fill with no value", function() t4():fill() end, "Tensor:fill: ", "takes numbers"},
  {"fill called on a non-tensor", function() t4().fill(5, 1) end, "Tensor:fill: ", "expected a tensor (from pto.tensor"},
  {"totable on a non-tensor", function() t4().totable({}) end, "Tensor:totable: ", "expected a tensor"},
  {"copy_from a number", function() t4():copy_from(5) end, "Tensor:copy_from: ", "expected a tensor or a table"},
  {"copy_from a shorter table", function() t4():copy_from{1, 2} end, "Tensor:copy_from: ", "they must match"},
  {"copy_from a smaller tensor", function() t4():copy_from(pto.tensor{3}) end, "Tensor:copy_from: ", "they must match"},
  {"copy_from a table of strings", function() t4():copy_from{"a", "b", "c", "d"} end, "Tensor:copy_from: ",
   "takes numbers"},
  {"view with a number", function() t4():view(2) end, "Tensor:view: ", "expected a table like {offset"},
  {"a view past the end", function() t4():view{offset = 2, shape = {4}} end, "Tensor:view: ", "outside the tensor's 4"},
  {"a view with a negative offset", function() t4():view{offset = -1} end, "Tensor:view: ", "outside the tensor's 4"},
  {"a view with a fractional offset", function() t4():view{offset = 0.5} end, "Tensor:view: ", "must be an integer"},
  {"a view with an unknown field", function() t4():view{offest = 1} end, "Tensor:view: ", "fields: offset, shape"},
  {"a view with a bad shape", function() t4():view{shape = {1, 1, 1, 1, 1, 1}} end, "Tensor:view: ", "1 to 5"},
  {"a view of an unset tensor_spec", function() pto.tensor_spec{4}:view{} end, "Tensor:view: ",
   "submit it as an OUTPUT first"},

  -- TaskArgs and pto.args
  {"add_tensor of a number", function() pto.TaskArgs():add_tensor(5) end, "TaskArgs:add_tensor: ",
   "expected a tensor (from pto.tensor"},
  {"add_tensor with an unknown tag string", function() pto.TaskArgs():add_tensor(t4(), "input") end,
   "TaskArgs:add_tensor: ", TAGS},
  {"add_tensor with an unknown tag number", function() pto.TaskArgs():add_tensor(t4(), 99) end,
   "TaskArgs:add_tensor: ", TAGS},
  {"add_tensor with a table as tag", function() pto.TaskArgs():add_tensor(t4(), {}) end, "TaskArgs:add_tensor: ", TAGS},
  {"add_tensor on a non-TaskArgs", function() pto.TaskArgs().add_tensor({}, t4()) end, "TaskArgs:add_tensor: ",
   "expected a TaskArgs (from pto.TaskArgs()"},
  {"add_scalar of a string", function() pto.TaskArgs():add_scalar("1") end, "TaskArgs:add_scalar: ",
   "integer, a float or a boolean"},
  {"add_scalar of nothing", function() pto.TaskArgs():add_scalar() end, "TaskArgs:add_scalar: ",
   "integer, a float or a boolean"},
  {"tensor(i) out of range", function() pto.TaskArgs():tensor(1) end, "TaskArgs:tensor: ", "indexed from 1"},
  {"tensor(i) with a string", function() pto.args{t4()}:tensor("first") end, "TaskArgs:tensor: ",
   "index must be an integer"},
  {"clear on a non-TaskArgs", function() pto.TaskArgs().clear(5) end, "TaskArgs:clear: ", "expected a TaskArgs"},
  {"scalar(0)", function() pto.args{scalars = {1}}:scalar(0) end, "TaskArgs:scalar: ", "indexed from 1"},
  {"tag(i) out of range", function() pto.args{t4()}:tag(2) end, "TaskArgs:tag: ", "indexed from 1"},
  {"pto.args of a number", function() pto.args(5) end, "pto.args: ", "expected a table like"},
  {"pto.args with an unknown tag", function() pto.args{{t4(), "outp"}} end, "pto.args: ", TAGS},
  {"pto.args with a non-tensor entry", function() pto.args{5} end, "pto.args: ", "must be a tensor or {tensor, tag}"},
  {"pto.args with an unknown field", function() pto.args{scalar = {1}} end, "pto.args: ", "optional scalars list"},
  {"pto.args with string scalars", function() pto.args{scalars = {"1"}} end, "pto.args: ",
   "integer, a float or a boolean"},
  {"pto.args with scalars not a list", function() pto.args{scalars = 1} end, "pto.args: ",
   "scalars must be a list of numbers"},

  -- CallConfig
  {"CallConfig of a number", function() pto.CallConfig(3) end, "pto.CallConfig: ", "expected a table of fields"},
  {"CallConfig with an unknown field", function() pto.CallConfig{blockdim = 1} end, "pto.CallConfig: ",
   "fields: block_dim, aicpu_thread_num"},
  {"CallConfig with a negative field", function() pto.CallConfig{block_dim = -1} end, "pto.CallConfig: ",
   "must be between 0 and"},
  {"CallConfig with a string count", function() pto.CallConfig{aicpu_thread_num = "three"} end, "pto.CallConfig: ",
   "must be an integer"},
  {"CallConfig with a numeric output_prefix", function() pto.CallConfig{output_prefix = 5} end, "pto.CallConfig: ",
   "output_prefix must be a string"},
  {"CallConfig with a too long output_prefix", function() pto.CallConfig{output_prefix = ("x"):rep(2000)} end,
   "pto.CallConfig: ", "at most 1023"},
  {"reading an unknown CallConfig field", function() return pto.CallConfig().blockdim end, "CallConfig: ",
   "fields: block_dim"},
  {"writing an unknown CallConfig field", function() pto.CallConfig().blockdim = 1 end, "CallConfig: ",
   "fields: block_dim"},

  -- pto.Worker
  {"Worker of a number", function() pto.Worker(2) end, "pto.Worker: ", "expected a table like pto.Worker{chips = 2}"},
  {"Worker with an unknown field", function() pto.Worker{chip = 2} end, "pto.Worker: ", "fields: level, mode, chips"},
  {"Worker with a negative heap_ring_size", function() pto.Worker{heap_ring_size = -1} end, "pto.Worker: ",
   "heap_ring_size must be between"},
  {"Worker with a tiny heap_ring_size", function() pto.Worker{heap_ring_size = 10} end, "pto.Worker: ",
   "heap_ring_size must be between"},
  {"Worker with negative chips", function() pto.Worker{chips = -1} end, "pto.Worker: ", "chips must be between 0"},
  {"Worker with fractional chips", function() pto.Worker{chips = 1.5} end, "pto.Worker: ", "chips must be an integer"},
  {"Worker with negative num_sub_workers", function() pto.Worker{num_sub_workers = -2} end, "pto.Worker: ",
   "num_sub_workers must be between 0"},
  {"Worker with alloc_timeout_ms = 0", function() pto.Worker{alloc_timeout_ms = 0} end, "pto.Worker: ",
   "alloc_timeout_ms must be between 1"},
  {"Worker with level 2", function() pto.Worker{level = 2} end, "pto.Worker: ", "level must be between 3"},
  {"Worker with level 4 and chips", function() pto.Worker{level = 4, chips = 1} end, "pto.Worker: ", "add_worker"},
  {"add_worker of a Worker two levels down", function() pto.Worker{level = 5}:add_worker(pto.Worker{}) end,
   "Worker:add_worker: ", "level-4 Workers"},
  {"Worker with a shm_size under 16 MiB", function() pto.Worker{shm_size = 4096} end, "pto.Worker: ",
   "shm_size must be between"},
  {"add_worker of a table", function() pto.Worker{level = 4}:add_worker{level = 3} end, "Worker:add_worker: ",
   "expected a Worker"},
  {"add_worker of an initialised Worker", function() pto.Worker{level = 4}:add_worker(W) end, "Worker:add_worker: ",
   "already initialised"},
  {"Worker with $PTO_MODE set to an unknown mode", function()
    -- in a child ptolua: the variable is read when a Worker is created
    local p = assert(io.popen(("PTO_MODE=fork %q -e %q 2>&1"):format(assert(os.getenv("PTOLUA")),
      "local ok, err = pcall(pto.Worker, {}); io.write(ok and 'no error' or err)")))
    local out = p:read("a")
    p:close()
    error(out, 0)
  end, "pto.Worker: ", "the environment variable PTO_MODE is 'fork'; set it to \"thread\" or \"process\""},
  {"Worker with start_timeout_ms = 0", function() pto.Worker{start_timeout_ms = 0} end, "pto.Worker: ",
   "start_timeout_ms must be between 1"},
  {"Worker with an unknown mode", function() pto.Worker{mode = "fork"} end, "pto.Worker: ",
   "mode must be \"thread\" or \"process\""},
  {"Worker with a numeric chip_runtime", function() pto.Worker{chip_runtime = 1} end, "pto.Worker: ",
   "chip_runtime must be the path"},
  {"Worker with a numeric mode", function() pto.Worker{mode = 1} end, "pto.Worker: ",
   "mode must be \"thread\" or \"process\""},
  {"Worker with queue_depth = 0", function() pto.Worker{queue_depth = 0} end, "pto.Worker: ",
   "queue_depth must be between 1"},

  -- chip kernels and register
  {"chip_kernel of a number", function() pto.chip_kernel(1) end, "pto.chip_kernel: ", "expected a kernel name like"},
  {"chip_kernel with an empty name", function() pto.chip_kernel("") end, "pto.chip_kernel: ", "kernel name is empty"},
  {"chip_kernel with an unknown field", function() pto.chip_kernel{sym = "fill"} end, "pto.chip_kernel: ",
   "fields: lib, symbol"},
  {"chip_kernel with a numeric symbol", function() pto.chip_kernel{symbol = 1} end, "pto.chip_kernel: ",
   "symbol must be the kernel's name"},
  {"chip_kernel with a numeric lib", function() pto.chip_kernel{lib = 1, symbol = "fill"} end, "pto.chip_kernel: ",
   "lib must be the path of a shared library"},
  {"register a number", function() W:register(42) end, "Worker:register: ",
   "a Lua function (a sub callable) or pto.chip_kernel"},
  {"register an unknown kernel", function() W:register(pto.chip_kernel("no_such_kernel")) end, "Worker:register: ",
   "it has: vector_add"},
  {"register a kernel of a missing library", function()
    W:register(pto.chip_kernel{lib = "/nonexistent/libnothing.so", symbol = "fill"})
  end, "Worker:register: ", "check the `lib` path"},
  {"register with a non-string name", function() W:register(function() end, 5) end, "Worker:register: ",
   "name must be a string"},
  {"add_worker on a level-3 Worker", function() W:add_worker(pto.Worker{}) end, "Worker:add_worker: ",
   "level 4 or above"},

  -- Worker:init / run / close
  {"init twice", function() W:init(); W:init() end, "Worker:init: ", "call init once"},
  {"run with a nil fn", function() W:run(nil) end, "Worker:run: ", "expected the function to run"},
  {"run with a table as fn", function() W:run({}) end, "Worker:run: ", "expected the function to run"},
  {"run inside a run", in_run(function() W:run(function() end) end), "Worker:run: ", "runs do not nest"},
  {"close inside a run", in_run(function() W:close() end), "Worker:close: ",
   "close the Worker after Worker:run returns"},
  {"close on a non-Worker", function() W.close(5) end, "Worker:close: ", "expected a Worker"},
  {"stats on a non-Worker", function() W.stats({}) end, "Worker:stats: ", "expected a Worker"},

  -- a closed Worker, every method
  {"init on a closed Worker", function() closed_worker():init() end, "Worker:init: ", CLOSED},
  {"register on a closed Worker", function() closed_worker():register(function() end) end, "Worker:register: ", CLOSED},
  {"add_worker on a closed Worker", function() closed_worker():add_worker(pto.Worker{}) end, "Worker:add_worker: ",
   CLOSED},
  {"run on a closed Worker", function() closed_worker():run(function() end) end, "Worker:run: ", CLOSED},
  {"stats on a closed Worker", function() closed_worker():stats() end, "Worker:stats: ", CLOSED},
  {"stats_report on a closed Worker", function() closed_worker():stats_report() end, "Worker:stats_report: ", CLOSED},
  {"print_stats on a closed Worker", function() closed_worker():print_stats() end, "Worker:print_stats: ", CLOSED},

  -- handles
  {"a number as handle", in_run(function(o) o:submit_next_level(1, args3()) end), "orch:submit_next_level: ", HANDLE},
  {"a string as handle", in_run(function(o) o:submit_sub("noop") end), "orch:submit_sub: ", HANDLE},
  {"a chip_kernel as handle", in_run(function(o) o:submit_next_level(pto.chip_kernel("vector_add"), args3()) end),
   "orch:submit_next_level: ", HANDLE},
  {"a handle of another Worker", in_run(function(o)
    o:submit_next_level(OTHER:register(pto.chip_kernel("vector_add")), args3())
  end), "orch:submit_next_level: ", "register it on this one"},
  {"a sub handle given to submit_next_level", in_run(function(o) o:submit_next_level(SUB, args3()) end),
   "orch:submit_next_level: ", "submit it with orch:submit_sub"},
  {"a chip handle given to submit_sub", in_run(function(o) o:submit_sub(K.vector_add, args3()) end),
   "orch:submit_sub: ", "submit it with orch:submit_next_level"},
  {"a chip handle given to submit_sub_group", in_run(function(o) o:submit_sub_group(K.fill, {pto.TaskArgs()}) end),
   "orch:submit_sub_group: ", "submit it with orch:submit_next_level"},
  {"a sub handle given to submit_next_level_group", in_run(function(o)
    o:submit_next_level_group(SUB, {pto.TaskArgs()})
  end), "orch:submit_next_level_group: ", "submit it with orch:submit_sub"},

  -- submit arguments
  {"submit_next_level without args", in_run(function(o) o:submit_next_level(K.vector_add) end),
   "orch:submit_next_level: ", "must be a TaskArgs"},
  {"submit_next_level with a table as args", in_run(function(o) o:submit_next_level(K.vector_add, {}) end),
   "orch:submit_next_level: ", "expected a TaskArgs (from pto.TaskArgs()"},
  {"submit_sub with a number as args", in_run(function(o) o:submit_sub(SUB, 3) end), "orch:submit_sub: ",
   "expected a TaskArgs"},
  {"submit_next_level with a table as cfg", in_run(function(o) o:submit_next_level(K.vector_add, args3(), {}) end),
   "orch:submit_next_level: ", "expected a CallConfig from pto.CallConfig"},
  {"submit_next_level with an unknown option", in_run(function(o)
    o:submit_next_level(K.vector_add, args3(), nil, {wroker = 1})
  end), "orch:submit_next_level: ", "fields: worker"},
  {"submit_sub with options not a table", in_run(function(o) o:submit_sub(SUB, nil, 1) end), "orch:submit_sub: ",
   "options must be a table like {worker = 1}"},
  {"pin to chip 3 of 2", in_run(function(o) o:submit_next_level(K.vector_add, args3(), nil, {worker = 3}) end),
   "orch:submit_next_level: ", "this Worker has 2 chips, numbered from 1"},
  {"pin to chip 0", in_run(function(o) o:submit_next_level(K.vector_add, args3(), nil, {worker = 0}) end),
   "orch:submit_next_level: ", "numbered from 1"},
  {"pin to sub worker 5 of 2", in_run(function(o) o:submit_sub(SUB, nil, {worker = 5}) end), "orch:submit_sub: ",
   "this Worker has 2 sub workers, numbered from 1"},
  {"submit_next_level on a Worker without chips", function()
    local w <close> = pto.Worker{num_sub_workers = 1}
    local h = w:register(pto.chip_kernel("fill"))
    w:run(function(o) o:submit_next_level(h, pto.args{{t4(), "out"}, scalars = {1.0}}) end)
  end, "orch:submit_next_level: ", "give the Worker chips > 0"},
  {"an unset tensor_spec tagged INPUT", in_run(function(o)
    o:submit_next_level(K.vector_add, pto.args{pto.tensor_spec{4}, t4(), {t4(), "out"}})
  end), "orch:submit_next_level: ", "only an OUTPUT can be unset"},
  {"an unset tensor_spec tagged INOUT", in_run(function(o)
    o:submit_sub(SUB, pto.args{{pto.tensor_spec{4}, "inout"}})
  end), "orch:submit_sub: ", "only an OUTPUT can be unset"},
  {"an unset tensor_spec tagged OUTPUT_EXISTING", in_run(function(o)
    o:submit_sub(SUB, pto.args{{pto.tensor_spec{4}, "out_existing"}})
  end), "orch:submit_sub: ", "only an OUTPUT can be unset"},

  -- groups
  {"a next-level group with no members", in_run(function(o) o:submit_next_level_group(K.vector_add, {}) end),
   "orch:submit_next_level_group: ", "a group needs at least one member"},
  {"a sub group with no members", in_run(function(o) o:submit_sub_group(SUB, {}) end), "orch:submit_sub_group: ",
   "a group needs at least one member"},
  {"a group member that is not a TaskArgs", in_run(function(o)
    o:submit_next_level_group(K.vector_add, {args3(), "x"})
  end), "orch:submit_next_level_group: ", "member 2 must be a TaskArgs"},
  {"a group with members not a list", in_run(function(o) o:submit_sub_group(SUB, pto.TaskArgs()) end),
   "orch:submit_sub_group: ", "must be a list of TaskArgs"},
  {"a group larger than the chips", in_run(function(o)
    o:submit_next_level_group(K.vector_add, {args3(), args3(), args3()})
  end), "orch:submit_next_level_group: ", "needs 3 distinct"},
  -- 200 members overran the binding's stack arrays (sized for 160) before
  -- the engine could refuse the group
  {"a group of 200 members on 2 chips", in_run(function(o)
    local members = {}
    for i = 1, 200 do members[i] = args3() end
    o:submit_next_level_group(K.vector_add, members)
  end), "orch:submit_next_level_group: ", "needs 200 distinct"},
  {"a group of more than 256 members", in_run(function(o)
    local members = {}
    for i = 1, 300 do members[i] = pto.TaskArgs() end
    o:submit_sub_group(SUB, members)
  end), "orch:submit_sub_group: ", "at most 256 members"},
  {"a group pinned twice to one worker", in_run(function(o)
    o:submit_sub_group(SUB, {pto.TaskArgs(), pto.TaskArgs()}, {workers = {2, 2}})
  end), "orch:submit_sub_group: ", "members need distinct workers"},
  {"a group pinned to a missing worker", in_run(function(o)
    o:submit_next_level_group(K.vector_add, {args3(), args3()}, nil, {workers = {1, 3}})
  end), "orch:submit_next_level_group: ", "worker 3 does not exist"},
  {"a group with too few pins", in_run(function(o)
    o:submit_sub_group(SUB, {pto.TaskArgs(), pto.TaskArgs()}, {workers = {1}})
  end), "orch:submit_sub_group: ", "one per member"},

  -- alloc and heap-ring lifetimes
  {"alloc with a negative shape", in_run(function(o) o:alloc{-4} end), "orch:alloc: ", "must be between 0 and"},
  {"alloc with an unknown dtype", in_run(function(o) o:alloc({4}, "half") end), "orch:alloc: ", DTYPES},
  {"an alloc'd tensor after its scope", in_run(function(o)
    local x
    o:scope(function() x = o:alloc{4} end)
    return x[1]
  end), "Tensor: ", "copy it into a pto.tensor inside the scope"},
  {"an alloc'd tensor after its run", function()
    local x = W:run(function(o) return o:alloc{4} end)
    x[1] = 1
  end, "Tensor: ", "copy it into a pto.tensor inside the scope"},
  {"an alloc'd tensor submitted after its scope", in_run(function(o)
    local x
    do
      local s <close> = o:scope()
      x = o:alloc{4}
    end
    o:submit_sub(SUB, pto.args{x})
  end), "orch:submit_sub: ", "copy it into a pto.tensor inside the scope"},
  {"an automatic OUTPUT after its run", function()
    local spec = pto.tensor_spec{4}
    W:run(function(o) o:submit_sub(SUB, pto.args{{spec, "out"}}) end)
    spec:totable()
  end, "Tensor:totable: ", "copy it into a pto.tensor inside the scope"},
  {"a sub's tensor kept after the call", function()
    -- The sub keeps its argument in its own Lua state (both calls pinned to
    -- sub worker 1) and touches it in its next call, which writes the error
    -- into its tensor argument (W was initialised by earlier cases, so in
    -- process mode this function is shipped: plain upvalues only).
    local kept
    local h = W:register(function(args)
      if args:scalar(1) == 1 then kept = args:tensor(1); return end
      local ok, err = pcall(function() kept:fill(0) end)
      local msg, out = ok and "no error" or tostring(err), args:tensor(1)
      for i = 1, #msg do out[i] = msg:byte(i) end
      out[#msg + 1] = 0
    end)
    W:run(function(o) o:submit_sub(h, pto.args{t4(), scalars = {1}}, {worker = 1}) end)
    local box = H.box()
    W:run(function(o) o:submit_sub(h, pto.args{{box, "out"}, scalars = {2}}, {worker = 1}) end)
    error(H.string_of(box), 0)
  end, "Tensor:fill: ", "copy what you need to keep"},

  -- heap-ring exhaustion
  {"an alloc larger than a heap ring", function() SMALL:run(function(o) o:alloc({2048}, "f32") end) end,
   "orch:alloc: ", "increase heap_ring_size on the Worker"},
  {"allocs of one open scope overflowing its ring", function()
    SMALL:run(function(o) o:alloc({768}, "f32"); o:alloc({768}, "f32") end)
  end, "orch:alloc: ", "end scopes sooner"},
  {"automatic OUTPUTs of one open scope overflowing its ring", function()
    SMALL:run(function(o)
      o:submit_next_level(SLEEP, pto.args{{pto.tensor_spec{768}, "out"}, scalars = {1}})
      o:submit_next_level(SLEEP, pto.args{{pto.tensor_spec{768}, "out"}, scalars = {1}})
    end)
  end, "orch:submit_next_level: ", "end scopes sooner"},
  {"a ring held by a slow task past alloc_timeout_ms", function()
    SMALL:run(function(o)
      -- two scopes one after the other use the same ring; the first one's slab stays until its task ends
      o:scope(function() o:submit_next_level(SLEEP, pto.args{{pto.tensor_spec{768}, "out"}, scalars = {500000}}) end)
      o:scope(function() o:submit_next_level(SLEEP, pto.args{{pto.tensor_spec{768}, "out"}, scalars = {1}}) end)
    end)
  end, "orch:submit_next_level: ", "or alloc_timeout_ms if the tasks are just slow"},

  -- the orchestrator outside its run
  {"submit_sub after the run (orch kept)", function() ended_orch():submit_sub(SUB) end, "orch:submit_sub: ", ENDED},
  {"submit_next_level after the run", function() ended_orch():submit_next_level(K.vector_add, args3()) end,
   "orch:submit_next_level: ", ENDED},
  {"alloc after the run", function() ended_orch():alloc{4} end, "orch:alloc: ", ENDED},
  {"scope after the run", function() ended_orch():scope() end, "orch:scope: ", ENDED},
  {"task after the run", function() ended_orch():task(0) end, "orch:task: ", ENDED},
  {"tasks after the run", function() ended_orch():tasks() end, "orch:tasks: ", ENDED},
  {"dag after the run", function() ended_orch():dag() end, "orch:dag: ", ENDED},
  {"dot after the run", function() ended_orch():dot() end, "orch:dot: ", ENDED},
  {"scope_depth after the run", function() ended_orch():scope_depth() end, "orch:scope_depth: ", ENDED},
  {thread_only = "a forked sub cannot reach the parent's orchestrator",
   "the orchestrator used from a sub callable", function()
    local orch, entered
    local h = W:register(function()
      entered = true
      orch:submit_sub(SUB)
    end, "sneaky")
    W:run(function(o)
      orch = o
      o:submit_sub(h)
      -- a submit lets a waiting sub run: keep submitting until it has run, so it runs while the run is open
      local deadline = H.clock() + 10
      while not entered and H.clock() < deadline do o:submit_sub(SUB) end
    end)
  end, "Worker:run: ", "not from a sub callable"},
  {"an orchestrator method on a non-orchestrator", in_run(function(o) o.submit_sub({}, SUB) end), "orch:submit_sub: ",
   "expected the orchestrator given to the run function"},

  -- scopes
  {"scope_end without scope_begin", in_run(function(o) o:scope_end() end), "orch:scope_end: ",
   "every scope_end needs a matching scope_begin"},
  {"raw scopes deeper than 64", in_run(function(o)
    for _ = 1, 65 do o:scope_begin() end
  end), "orch:scope_begin: ", "end a scope before opening another"},
  {"orch:scope deeper than 64", in_run(function(o)
    for _ = 1, 64 do o:scope_begin() end
    o:scope(function() end)
  end), "orch:scope: ", "nest at most 64"},
  {"scopes closed out of order", in_run(function(o)
    local outer = o:scope()
    local inner = o:scope()
    getmetatable(outer).__close(outer)
  end), "orch:scope: ", "scopes closed out of order"},
  {"a to-be-closed scope closed under a raw scope", in_run(function(o)
    do
      local s <close> = o:scope()
      o:scope_begin()
    end
  end), "orch:scope: ", "scopes closed out of order"},
  {"a scope function leaving a scope open", in_run(function(o)
    o:scope(function() o:scope_begin() end)
  end), "orch:scope: ", "close every scope_begin with scope_end"},
  {"orch:scope with a number", in_run(function(o) o:scope(1) end), "orch:scope: ", "expected a function"},

  -- inspection
  {"orch:task with a table", in_run(function(o) o:task({}) end), "orch:task: ", "expected a task id"},
  {"orch:task with an unknown id", in_run(function(o)
    o:submit_sub(SUB)
    o:task(99)
  end), "orch:task: ", "ids are 0..0"},
}

describe("misuse", function()
  -- A case lost from the table (a bad merge, a stray `}`) fails here: add
  -- one and this number goes up with it.
  it("the table has its 166 cases, each named once and naming its function", function()
    assert.are.equal(166, #cases)
    local seen = {}
    for i, c in ipairs(cases) do
      assert.is_nil(seen[c[1]], ("cases %s and %d share the name %q"):format(tostring(seen[c[1]]), i, c[1]))
      seen[c[1]] = i
      assert.are.equal("function", type(c[2]), c[1])
      assert.truthy(type(c[3]) == "string" and c[3]:find("^[%w_.:]+: $"), c[1])
    end
  end)

  for i, c in ipairs(cases) do
    local name = ("%d. %s"):format(i, c[1])
    local check = function()
      H.assert_error(c[2], c[3], c[4])
      H.check_vector_add(W, K.vector_add)
    end
    if c.thread_only then H.thread_only(name, c.thread_only, check) else it(name, check) end
  end

  it("the small-ring Worker still runs after its ring errors", function()
    H.check_vector_add(SMALL, SMALL:register(pto.chip_kernel("vector_add")), 256)
  end)

  it("a failed run does not stop the next one (fail kernel)", function()
    local ok, err = pcall(W.run, W, function(o) o:submit_next_level(K.fail, pto.args{scalars = {5}}) end)
    assert.is_false(ok)
    H.assert_error(function() error(err, 0) end, "Worker:run: ", "fail kernel called with code 5")
    H.check_vector_add(W, K.vector_add)
  end)
end)
