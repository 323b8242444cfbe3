-- The Lua binding's cost per task, measured in the same run as the engine's
-- C API: pto_bench's four DAG shapes on two chips running the no-op "noop"
-- kernel, written the idiomatic way (views, pto.args, orch:alloc, nested
-- scopes, as examples/bgemm.lua writes them), that form's floor (below),
-- the fast form (orch:prepare_next_level, pto.temp, views built once) and
-- its loop alone (fastloop, below), in THREAD and PROCESS mode; with
-- $PTO_BENCH_C set (scripts/bench/bench_c_module.c) also the C rows: the
-- same shapes through the C API, submitted inside this process's runs. A
-- benchmark, not a test: run it through scripts/bench_lua.sh, which adds
-- the ratios.
--   ptolua scripts/bench_lua.lua thread|process [reps] [form] [shape]
-- Prints "<form> <shape> <best us/task> <median us/task> <tasks per rep>"
-- per row (the forms alternate, one warm-up each), and "heap <form>
-- <KiB before> <KiB after> <KiB allocated>": the Lua heap over 100 W4 4^4
-- runs with the collector stopped, so allocated is every byte those runs
-- allocated. A shape (W1 W2 W3 W4s W4l) runs that shape alone and skips
-- the heap lines (scripts/bench_malloc.sh counts mallocs that way).
local pto = require "pto"
local mode = arg[1] or "thread"
local reps = tonumber(arg[2]) or 5
local only = arg[3]
local only_shape = arg[4]

local N = 20000
local SLOT = 16
local FAN = 8

local w <close> = pto.Worker{mode = mode, chips = 2, heap_ring_size = 16 << 20}
local noop = w:register(pto.chip_kernel("noop"))
-- The C rows: the same shapes submitted through pto.h by a C module
-- (scripts/bench/bench_c_module.c, path in $PTO_BENCH_C) inside this
-- process's runs, on this Worker, alternating with the Lua forms. Loaded
-- before w:init(), which forks PROCESS mode's children.
local cmod
if os.getenv("PTO_BENCH_C") then
  cmod = assert(package.loadlib(os.getenv("PTO_BENCH_C"), "luaopen_pto_bench_c"))(math.max(N, 3 * 16 * 16 * 16))
end
w:init()

-- Each slot is a tensor of its own, as in pto_bench and the C rows: the
-- engine keeps the writers of one storage in one list, so views of one big
-- tensor would time that list's scans, not the binding. The idiomatic rows
-- still make a view per use, as examples written with views do.
local nslots = math.max(N, 3 * 16 * 16 * 16)
local S = {}
for i = 0, nslots - 1 do S[i] = pto.tensor({SLOT}, "f32") end
local function slot(i) return S[i]:view{offset = 0, shape = {SLOT}} end

-- ---- idiomatic: a TaskArgs table per submit, views per tile, allocs, scopes
local idiomatic = {}

function idiomatic.W1(orch)
  for i = 0, N - 1 do orch:submit_next_level(noop, pto.args{{slot(i), "out"}}) end
  return N
end

function idiomatic.W2(orch)
  local t = slot(0)
  for _ = 1, N do orch:submit_next_level(noop, pto.args{{t, "inout"}}) end
  return N
end

function idiomatic.W3(orch)
  local groups = N // (FAN + 2)
  for g = 0, groups - 1 do
    local x = g * (FAN + 2)
    local head = slot(x)
    orch:submit_next_level(noop, pto.args{{head, "out"}})
    local join = {}
    for j = 1, FAN do
      local y = slot(x + j)
      orch:submit_next_level(noop, pto.args{{head, "in"}, {y, "out"}})
      join[j] = {y, "in"}
    end
    join[FAN + 1] = {slot(x + FAN + 1), "out"}
    orch:submit_next_level(noop, pto.args(join))
  end
  return groups * (FAN + 2)
end

local function bgemm_idiomatic(d, runs)
  local n3 = d * d * d
  local function tile(base, i) return slot(base + i) end
  return function(orch)
    for b = 0, d - 1 do
      orch:scope(function()
        for m = 0, d - 1 do
          for n = 0, d - 1 do
            local s <close> = orch:scope()
            local c = tile(2 * n3, (b * d + m) * d + n)
            for k = 0, d - 1 do
              local p = orch:alloc({SLOT}, "f32")
              orch:submit_next_level(noop, pto.args{{tile(0, (b * d + m) * d + k), "in"},
                                                    {tile(n3, (b * d + k) * d + n), "in"}, {p, "out"}})
              orch:submit_next_level(noop, pto.args{{p, "in"}, {c, "inout"}})
            end
          end
        end
      end)
    end
    return 2 * d * d * d * d
  end, runs
end

-- ---- fast: prepared submits, views built once outside the runs, a reusable
-- temporary, scope_begin/scope_end
local have_fast = pto.temp ~= nil
local views = {}
if have_fast then
  for i = 0, nslots - 1 do views[i] = S[i] end
end

-- The prepared submits of W3 (head, reader, join) and W4 (gemm, add), for
-- the fast form and the floor alike; prep(orch, tags) prepares one.
local function real_prep(orch, tags) return orch:prepare_next_level(noop, tags) end
local function fan_kernels(orch, prep)
  prep = prep or real_prep
  return prep(orch, {"out"}), prep(orch, {"in", "out"}),
         prep(orch, {"in", "in", "in", "in", "in", "in", "in", "in", "out"})
end

local function bgemm_kernels(orch, prep)
  prep = prep or real_prep
  return prep(orch, {"in", "in", "out"}), prep(orch, {"in", "inout"})
end

-- The fast form's shapes over submits that prep makes: the fast form
-- itself, and its loop alone (fastloop, below).
local function fast_form(prep)
  local f = {}
  function f.W1(orch)
    local out = prep(orch, {"out"})
    for i = 0, N - 1 do out(views[i]) end
    return N
  end

  function f.W2(orch)
    local inout = prep(orch, {"inout"})
    local t = views[0]
    for _ = 1, N do inout(t) end
    return N
  end

  function f.W3(orch)
    local groups = N // (FAN + 2)
    local out, rd, join = fan_kernels(orch, prep)
    for g = 0, groups - 1 do
      local x = g * (FAN + 2)
      local head = views[x]
      out(head)
      for j = 1, FAN do rd(head, views[x + j]) end
      join(views[x + 1], views[x + 2], views[x + 3], views[x + 4], views[x + 5], views[x + 6], views[x + 7],
           views[x + 8], views[x + 9])
    end
    return groups * (FAN + 2)
  end

  function f.bgemm(d, runs)
    local n3 = d * d * d
    local p = have_fast and pto.temp({SLOT}, "f32")
    return function(orch)
      local gemm, add = bgemm_kernels(orch, prep)
      for b = 0, d - 1 do
        for m = 0, d - 1 do
          for n = 0, d - 1 do
            orch:scope_begin()
            local c = views[2 * n3 + (b * d + m) * d + n]
            for k = 0, d - 1 do
              gemm(views[(b * d + m) * d + k], views[n3 + (b * d + k) * d + n], p)
              add(p, c)
            end
            orch:scope_end()
          end
        end
      end
      return 2 * d * d * d * d
    end, runs
  end
  return f
end

local fast = fast_form(real_prep)
local bgemm_fast = fast.bgemm

-- ---- fastloop: the fast form's own Lua, at no cost of the binding or the
-- engine: its loops, views and scopes, with every prepared submit replaced
-- by a C function of Lua's base library that does nothing with its
-- arguments (type), so no task is submitted. The C rows plus this is the
-- least the fast form can cost: what stands between it and the C API that
-- no binding can remove (one call from Lua into C per task).
local fastloop = fast_form(function(orch, tags)
  real_prep(orch, tags)
  return type
end)
-- Its W4 4^4's 200 DAGs go in one run: the C rows pay each run's own cost
-- already, and an empty run costs as much as a few dozen submits.
local fastloop_bgemm = fastloop.bgemm
function fastloop.bgemm(d, runs)
  local one = fastloop_bgemm(d, 1)
  return function(orch)
    local n = 0
    for _ = 1, runs do n = n + one(orch) end
    return n
  end, 1
end

-- ---- floor: the idiomatic form's shape at no cost of ours. Each of its
-- calls into the binding (t:view{...}, pto.args{...}, orch:alloc) becomes
-- a call of a C function that does nothing (select, from Lua's base
-- library), with the same tables built for it, and the submit is the fast
-- form's. No binding can make the idiomatic form cheaper than this: it is
-- the Lua interpreter's price for the form's tables and calls, the part of
-- the idiomatic rows that the idiomatic goal cannot reach by any change to
-- the binding.
local floor = {}
local nop = select

function floor.W1(orch)
  local out = orch:prepare_next_level(noop, {"out"})
  for i = 0, N - 1 do
    local v = nop(1, views[i], {offset = 0, shape = {SLOT}})
    local a = nop(1, {{v, "out"}})
    out(v)
  end
  return N
end

function floor.W2(orch)
  local inout = orch:prepare_next_level(noop, {"inout"})
  local t = nop(1, views[0], {offset = 0, shape = {SLOT}})
  for _ = 1, N do
    local a = nop(1, {{t, "inout"}})
    inout(t)
  end
  return N
end

function floor.W3(orch)
  local groups = N // (FAN + 2)
  local out, rd, join = fan_kernels(orch)
  for g = 0, groups - 1 do
    local x = g * (FAN + 2)
    local head = nop(1, views[x], {offset = 0, shape = {SLOT}})
    local a = nop(1, {{head, "out"}})
    out(head)
    local jt = {}
    for j = 1, FAN do
      local y = nop(1, views[x + j], {offset = 0, shape = {SLOT}})
      a = nop(1, {{head, "in"}, {y, "in"}})
      rd(head, y)
      jt[j] = {y, "in"}
    end
    jt[FAN + 1] = {nop(1, views[x + FAN + 1], {offset = 0, shape = {SLOT}}), "out"}
    a = nop(1, jt)
    join(views[x + 1], views[x + 2], views[x + 3], views[x + 4], views[x + 5], views[x + 6], views[x + 7],
         views[x + 8], views[x + 9])
  end
  return groups * (FAN + 2)
end

local function bgemm_floor(d, runs)
  local n3 = d * d * d
  local p = have_fast and pto.temp({SLOT}, "f32")
  local function tile(base, i) return nop(1, views[base + i], {offset = 0, shape = {SLOT}}) end
  return function(orch)
    local gemm, add = bgemm_kernels(orch)
    for b = 0, d - 1 do
      for m = 0, d - 1 do
        for n = 0, d - 1 do
          orch:scope_begin()
          local c = tile(2 * n3, (b * d + m) * d + n)
          for k = 0, d - 1 do
            local q = nop(1, p, {SLOT}, "f32")
            local x, y = tile(0, (b * d + m) * d + k), tile(n3, (b * d + k) * d + n)
            local a = nop(1, {{x, "in"}, {y, "in"}, {q, "out"}})
            gemm(x, y, q)
            a = nop(1, {{q, "in"}, {c, "inout"}})
            add(q, c)
          end
          orch:scope_end()
        end
      end
    end
    return 2 * d * d * d * d
  end, runs
end

-- ---- C: the C API's loops (bench_shapes.c) in this process's runs
local cform = cmod and {
  W1 = function(orch) return cmod.w1(orch, N) end,
  W2 = function(orch) return cmod.w2(orch, N) end,
  W3 = function(orch) return cmod.w3(orch, N) end,
}
local function bgemm_c(d, runs) return function(orch) return cmod.w4(orch, d) end, runs end

local function once(fn) return fn, 1 end
local bgemm_of = {[fast] = bgemm_fast, [fastloop] = fastloop.bgemm, [floor] = bgemm_floor,
                  [idiomatic] = bgemm_idiomatic}
if cform then bgemm_of[cform] = bgemm_c end
local SHAPES = {
  {"W1", function(f) return once(f.W1) end},
  {"W2", function(f) return once(f.W2) end},
  {"W3", function(f) return once(f.W3) end},
  {"W4s", function(f) return bgemm_of[f](4, 200) end},
  {"W4l", function(f) return bgemm_of[f](16, 1) end},
}

local function time_shape(fn, runs)
  local count = 0
  local t0 = pto.now()
  for _ = 1, runs do count = count + w:run(fn) end
  return (pto.now() - t0) * 1e6 / count, count
end

local forms = {{"idiomatic", idiomatic}, {"fast", fast}, {"floor", floor}, {"fastloop", fastloop}, {"C", cform}}
local function wanted(form)
  return form[2] and (form[1] == "idiomatic" or form[1] == "C" or have_fast) and (not only or only == form[1])
end
for _, shape in ipairs(SHAPES) do
  if only_shape and shape[1] ~= only_shape then goto next_shape end
  local xs, fns, tasks = {}, {}, 0
  for i, form in ipairs(forms) do
    if wanted(form) then
      xs[i], fns[i] = {}, {shape[2](form[2])}
      time_shape(fns[i][1], fns[i][2])   -- warm-up
    end
  end
  for r = 1, reps do   -- alternate the forms: noise from elsewhere falls on both
    for i in pairs(fns) do xs[i][r], tasks = time_shape(fns[i][1], fns[i][2]) end
  end
  for i, form in ipairs(forms) do
    if xs[i] then
      table.sort(xs[i])
      print(("%s %s %.4f %.4f %d"):format(form[1], shape[1], xs[i][1], xs[i][(reps + 1) // 2], tasks))
      io.stdout:flush()
    end
  end
  ::next_shape::
end

-- The Lua heap across 100 runs of the W4 4^4 DAG: the fast form makes no
-- garbage per task, so the count after a full collection stays where it was.
for _, form in ipairs(forms) do
  if wanted(form) and (form[1] == "fast" or form[1] == "idiomatic") and not only_shape then
    local fn = (form[1] == "fast" and bgemm_fast or bgemm_idiomatic)(4, 1)
    w:run(fn)
    collectgarbage("collect")
    local before = collectgarbage("count")
    collectgarbage("stop")
    for _ = 1, 100 do w:run(fn) end
    local grown = collectgarbage("count") - before
    collectgarbage("restart")
    collectgarbage("collect")
    print(("heap %s %.1f %.1f %.1f"):format(form[1], before, collectgarbage("count"), grown))
  end
end
