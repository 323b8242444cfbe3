-- check_spec.lua: check mode (docs/check.md). Every task runs under checks
-- of its tags: reading an OUTPUT or writing an INPUT fails it, leaving an
-- OUTPUT half written or not being a function of its inputs is a warning,
-- writing a tensor it did not declare fails it (process mode: page
-- protection), and an OUTPUT that overwrites bytes an earlier task of the run
-- uses, unordered (finished or not), fails the submit. Runs in both modes (spec/CMakeLists.txt).
local pto = require "pto"
local H = require "helpers"
local F = require "files"

local PTOLUA = assert(os.getenv("PTOLUA"), "set PTOLUA to the ptolua binary")
local N = 64

-- A checked Worker with the misbehaving chipsim kernels and a few Lua subs, all registered before init
-- (process mode ships nothing later that has upvalues).
local W, K, S
local function setup()
  W = pto.Worker{chips = 2, num_sub_workers = 1, check = true}
  K = {}
  for _, n in ipairs{"bad_read_out", "bad_write_in", "bad_half_out", "bad_write_outside", "bad_random", "copy",
                     "fill", "sleep_us"} do
    K[n] = W:register(pto.chip_kernel(n), n)
  end
  S = {
    write_in = W:register(function(a)
      local x, y = a:tensor(1), a:tensor(2)
      for i = 1, #y do y[i] = x[i] end
      x[3] = -1
    end, "write_in"),
    read_out = W:register(function(a)
      local x, y = a:tensor(1), a:tensor(2)
      for i = 1, #y do y[i] = y[i] + x[i] end
    end, "read_out"),
    copy = W:register(function(a)
      local x, y = a:tensor(1), a:tensor(2)
      for i = 1, #y do y[i] = x[i] end
    end, "copy_sub"),
  }
end

local function ramp(n)
  local t = pto.tensor({n or N}, "f32")
  for i = 1, #t do t[i] = i end
  return t
end

-- Run one task of handle h (chip kernel or sub) on x (in) and y (out); returns ok, err.
local function one(h, x, y, kind, scalars)
  return pcall(W.run, W, function(o)
    local args = pto.args{{x, "in"}, {y, "out"}, scalars = scalars}
    if kind == "sub" then o:submit_sub(h, args) else o:submit_next_level(h, args) end
  end)
end

local function has(s, frag)
  assert(s:find(frag, 1, true), ("%q lacks %q"):format(s, frag))
end

-- Run a script under `ptolua --check` (or with the command prefix env and no flag); returns its exit
-- status and everything it printed.
local function run_checked(src, env, flag)
  local f = F.writefile(F.tmpname(), src)
  local p = assert(io.popen(("%s%s %s %s 2>&1"):format(env or "", F.q(PTOLUA), env and "" or flag or "--check",
    F.q(f))))
  local out = p:read("a")
  local ok, _, code = p:close()
  return ok and 0 or code, out
end

describe("check mode", function()
  setup()
  teardown(function()
    W:close()
    F.cleanup()
  end)

  it("is on from the option, and Worker:set_check turns it off and on for the next run", function()
    assert.is_true(W.check)
    W:set_check(false)
    assert.is_false(W.check)
    local x, y = ramp(), pto.tensor({N}, "f32")
    assert.is_true((one(K.bad_read_out, x, y)))   -- unchecked: nothing is said
    W:set_check(true)
    assert.is_true(W.check)
    H.assert_error(function() W:set_check("yes") end, "Worker:set_check: ", "expected true or false")
    H.assert_error(function() pto.Worker{check = 1} end, "pto.Worker: ", "check must be true or false")
  end)

  it("fails a chip kernel that reads its OUTPUT, naming the run, task, argument and fix", function()
    local x, y = ramp(), pto.tensor({N}, "f32")
    local run = W:stats().runs + 1   -- the run one() begins
    local ok, err = one(K.bad_read_out, x, y)
    assert.is_false(ok)
    has(err, ("Worker:run: run %d, task 0 (callable 'bad_read_out' on chip "):format(run))
    has(err, "read argument 2 (64 f32 at element 0) tagged OUTPUT before writing it")
    has(err, "tag it INOUT")
    -- the Worker stays usable, and a correct kernel passes
    local ok2, err2 = one(K.copy, x, y)
    assert(ok2, err2)
    assert.equals(64, y[64])
  end)

  it("names a submitted run by its handle's id", function()
    local x, y = ramp(), pto.tensor({N}, "f32")
    local h = W:submit(function(o) o:submit_next_level(K.bad_read_out, pto.args{{x, "in"}, {y, "out"}}) end)
    local ok, err = pcall(h.wait, h)
    assert.is_false(ok)
    has(err, ("Run:wait: run %d, task 0 (callable 'bad_read_out' on chip "):format(h.id))
    has(err, "tagged OUTPUT before writing it")
    W:wait_all()
  end)

  it("names the view's offset and shape", function()
    local x, big = ramp(16), pto.tensor({4, 16}, "f32")
    local ok, err = one(K.bad_read_out, x, big:view{offset = 32, shape = {16}})
    assert.is_false(ok)
    has(err, "argument 2 (16 f32 at element 32)")
  end)

  it("fails a chip kernel and a Lua sub that write their INPUT", function()
    local x, y = ramp(), pto.tensor({N}, "f32")
    local ok, err = one(K.bad_write_in, x, y)
    assert.is_false(ok)
    has(err, "wrote argument 1 (64 f32 at element 0) tagged INPUT")
    has(err, "tag it INOUT, or copy it first")
    x = ramp()
    ok, err = one(S.write_in, x, y, "sub")
    assert.is_false(ok)
    has(err, "(callable 'write_in' on sub 1)")
    has(err, "wrote argument 1 (64 f32 at element 0) tagged INPUT (first changed: element 2 of the view)")
  end)

  it("fails a Lua sub that reads its OUTPUT, and passes a correct one", function()
    local x, y = ramp(), pto.tensor({N}, "f32")
    local ok, err = one(S.read_out, x, y, "sub")
    assert.is_false(ok)
    has(err, "read argument 2 (64 f32 at element 0) tagged OUTPUT before writing it")
    ok, err = one(S.copy, x, y, "sub")
    assert(ok, err)
    assert.equals(33, y[33])
  end)

  it("keeps what a half-written OUTPUT did not write", function()
    local x, y = ramp(), pto.tensor({N}, "f32")
    y:fill(7)
    local ok, err = one(K.bad_half_out, x, y)
    assert(ok, err)   -- a warning, not a failure
    assert.equals(32, y[32])
    assert.equals(7, y[33])
  end)

  it("reports an unordered OUTPUT over bytes an earlier task writes while it waits to run, naming both tasks", function()
    local t = pto.tensor({N}, "f32")
    local run = W:stats().runs + 1
    W:hold()   -- nothing runs: the first writer is unfinished at the second submit, whatever the timing
    local ok, err = pcall(W.run, W, function(o)
      o:submit_next_level(K.fill, pto.args{{t, "out"}, scalars = {1.0}})
      o:submit_next_level(K.fill, pto.args{{t, "out"}, scalars = {2.0}})
    end)
    W:release()
    assert.is_false(ok)
    has(err, ("orch:submit_next_level: check: run %d, task 1 (callable 'fill') tags argument 1 (64 f32 at element 0) "
              .. "OUTPUT"):format(run))
    has(err, "not ordered after task 0 (callable 'fill'), which writes those bytes")
    has(err, "tag it INOUT")
  end)

  it("reports an OUTPUT after an unfinished reader, and accepts it once ordered by INOUT", function()
    local t, u = ramp(), pto.tensor({N}, "f32")
    W:hold()
    local ok, err = pcall(W.run, W, function(o)
      o:submit_next_level(K.copy, pto.args{{t, "in"}, {u, "out"}})
      o:submit_next_level(K.fill, pto.args{{t, "out_existing"}, scalars = {5.0}})
    end)
    W:release()
    assert.is_false(ok)
    has(err, "task 1 (callable 'fill') tags argument 1 (64 f32 at element 0) OUTPUT_EXISTING")
    has(err, "task 0 (callable 'copy'), which reads those bytes")
    has(err, "no tag waits for a reader, so order it after that task (take one of that task's outputs as an INPUT)")
    -- INOUT waits for the writers of t, not for its readers: the same race
    W:hold()
    ok, err = pcall(W.run, W, function(o)
      o:submit_next_level(K.copy, pto.args{{t, "in"}, {u, "out"}})
      o:submit_sub(S.copy, pto.args{{ramp(), "in"}, {t, "inout"}})
    end)
    W:release()
    assert.is_false(ok)
    has(err, "task 1 (callable 'copy_sub') tags argument 2 (64 f32 at element 0) INOUT, a write that is not ordered after "
             .. "task 0 (callable 'copy'), which reads those bytes")
    -- ordered: the overwrite depends (through u, INOUT) on the reader
    W:hold()
    ok, err = pcall(W.run, W, function(o)
      o:submit_next_level(K.copy, pto.args{{t, "in"}, {u, "out"}})
      o:submit_sub(S.copy, pto.args{{u, "inout"}, {t, "out_existing"}})
      W:release()
    end)
    assert(ok, err)
  end)

  -- Until every task in ids has finished (polled: nothing here may order the run the way a drain does).
  local function until_finished(o, ids)
    local deadline = os.time() + 20
    for _, id in ipairs(ids) do
      while o:task(id).state ~= "completed" and o:task(id).state ~= "consumed" do
        assert(os.time() < deadline, "task " .. id .. " did not finish")
      end
    end
  end

  it("reports an unordered OUTPUT whether or not the earlier task has finished by then", function()
    local t = pto.tensor({N}, "f32")
    local ok, err = pcall(W.run, W, function(o)
      o:submit_next_level(K.fill, pto.args{{t, "out"}, scalars = {1.0}})
      until_finished(o, {0})   -- finished, but nothing orders the next overwrite after it: the next run may race
      o:submit_next_level(K.fill, pto.args{{t, "out"}, scalars = {2.0}})
    end)
    assert.is_false(ok)
    has(err, "not ordered after task 0 (callable 'fill'), which writes those bytes")
  end)

  it("accepts an overwrite ordered through producers that have finished, and one after orch:drain()", function()
    local t, u = ramp(), pto.tensor({N}, "f32")
    local ok, err = pcall(W.run, W, function(o)
      o:submit_next_level(K.fill, pto.args{{t, "out"}, scalars = {3.0}})
      o:submit_next_level(K.copy, pto.args{{t, "in"}, {u, "out"}})
      until_finished(o, {0, 1})
      -- ordered after task 1 through u (INPUT), and after task 0 through task 1's INPUT of t
      o:submit_next_level(K.copy, pto.args{{u, "in"}, {t, "out_existing"}})
      o:drain()   -- everything so far finished and the orchestration knows it
      o:submit_next_level(K.fill, pto.args{{u, "out"}, scalars = {4.0}})
    end)
    assert(ok, err)
    assert.equals(3, t[1])
    assert.equals(4, u[N])
  end)

  it("does not report heap-ring memory that a later allocation reuses", function()
    local w = pto.Worker{chips = 2, check = true, heap_ring_size = 1 << 16}
    local fill = w:register(pto.chip_kernel("fill"), "fill")
    local copy = w:register(pto.chip_kernel("copy"), "copy")
    local out = pto.tensor({N}, "f32")
    local ok, err = pcall(w.run, w, function(o)
      for i = 1, 200 do   -- 200 x 16 KiB through a 64 KiB ring: each scope's tensor lands on earlier ones' bytes
        o:scope(function()
          local p = o:alloc({4096}, "f32")
          o:submit_next_level(fill, pto.args{{p, "out"}, scalars = {i + 0.0}})
          o:submit_next_level(copy, pto.args{{p:view{offset = 0, shape = {N}}, "in"}, {out, "inout"}})
        end)
      end
    end)
    w:close()
    assert(ok, err)
    assert.equals(200, out[1])
  end)

  H.process_only("fails a chip kernel that writes a tensor it did not declare", "page protection needs a child process",
    function()
      local x, y = ramp(), pto.tensor({N}, "f32")
      local other = pto.tensor({1 << 16}, "f32"); local line = debug.getinfo(1, "l").currentline
      local ok, err = one(K.bad_write_outside, x, y, nil, {other.address + 4 * 40000})
      assert.is_false(ok)
      has(err, ("check: wrote address 0x%x (byte 160000 of the 262144-byte tensor created at "):format(other.address + 4 * 40000))
      has(err, ("check_spec.lua:%d), which none of its 2 arguments covers"):format(line))
      has(err, "pass it as an argument tagged INOUT or OUTPUT")
      ok, err = one(K.copy, x, y)   -- the child is usable afterwards
      assert(ok, err)
    end)

  H.process_only("names the heap ring and offset of a write into a heap-ring page the task did not declare",
    "page protection needs a child process", function()
      local x, y = ramp(), pto.tensor({N}, "f32")
      local at
      local ok, err = pcall(W.run, W, function(o)
        local p = o:alloc({1024}, "f32")   -- heap-ring memory of this run, no argument of the task
        at = p.address + 4 * 1000
        o:submit_next_level(K.bad_write_outside, pto.args{{x, "in"}, {y, "out"}, scalars = {at}})
      end)
      assert.is_false(ok)
      has(err, "(callable 'bad_write_outside' on chip ")
      has(err, ("check: wrote address 0x%x (heap ring "):format(at))
      assert(err:find("%(heap ring %d+, offset %d+%), which none of its 2 arguments covers"), err)
    end)

  it("finds an L3 task's kernel reading its OUTPUT in a run from an L4 (PTO_CHECK reaches every level)", function()
    local code, out = run_checked([[
      local w3 = pto.Worker{level = 3, chips = 1}
      local k = w3:register(pto.chip_kernel("bad_read_out"), "bad_read_out")
      local function one(orch, args)
        orch:submit_next_level(k, pto.args{{args:tensor(1), "in"}, {args:tensor(2), "out"}})
      end
      local w4 = pto.Worker{level = 4}
      assert(w4.check and w3.check)
      local fn = w4:register(one, "one")
      w4:add_worker(w3)
      local x, y = pto.tensor({64}, "f32"), pto.tensor({64}, "f32")
      for i = 1, 64 do x[i] = i end
      w4:run(function(o) o:submit_next_level(fn, pto.args{{x, "in"}, {y, "inout"}}) end)
    ]], "PTO_CHECK=1 ")
    assert.are_not.equal(0, code)
    has(out, "Worker:run: L4 run 1, task 0 (callable 'one' on L3 worker 1) failed: ")
    has(out, "L3 run 1, task 0 (callable 'bad_read_out' on chip 1) failed: ")
    has(out, "check: read argument 2 (64 f32 at element 0) tagged OUTPUT before writing it")
    has(out, "tag it INOUT")
  end)

  it("warns (on stderr) about an incomplete OUTPUT and a task that is not a function of its inputs", function()
    local code, out = run_checked([[
      local w = pto.Worker{chips = 1}
      local half, rnd = w:register(pto.chip_kernel("bad_half_out"), "half"), w:register(pto.chip_kernel("bad_random"), "rnd")
      local x, y = pto.tensor({64}, "f32"), pto.tensor({64}, "f32")
      w:run(function(o)
        o:submit_next_level(half, pto.args{{x, "in"}, {y, "out"}})
        o:submit_next_level(rnd, pto.args{{x, "in"}, {y, "inout"}})
      end)
      print("done")
    ]])
    assert.equals(0, code, out)
    has(out, "task 0 (callable 'half' on chip 1): check: warning: left 32 of the 64 elements of argument 2 "
             .. "(64 f32 at element 0) tagged OUTPUT unwritten (first: element 32 of the view)")
    has(out, "task 1 (callable 'rnd' on chip 1): check: warning: two runs with the same inputs wrote different "
             .. "values to argument 2")
    has(out, "done")
  end)

  it("finds the wrong tag of examples/repl/bgemm_bug.lua with ptolua --check, and passes the fixed script", function()
    local src = assert(F.readfile("examples/repl/bgemm_bug.lua"))
    local code, out = run_checked(src)
    assert.are_not.equal(0, code)
    has(out, "run 1, task ")   -- the submit check's message or the double run's, whichever comes first
    has(out, "(callable 'add')")   -- the add task ...
    has(out, "argument 1 (4\xc3\x974 f32 at element 0)")   -- ... and its C argument
    has(out, "tag it INOUT")
    local fixed = src:gsub('{c, "out"}', '{c, "inout"}')
    code, out = run_checked(fixed)
    assert.equals(0, code, out)
    has(out, "bgemm_bug: C is right")
    assert.is_nil(out:find("warning", 1, true), out)
  end)

  it("catches a failure: w:retry after fixing the input runs it; w:run still raises (its drain accepts)", function()
    local c = pto.Worker{chips = 1, num_sub_workers = 1, catch = true}
    local x, y, z = pto.tensor({4}, "f32"), pto.tensor({4}, "f32"), pto.tensor({4}, "f32")
    local need = c:register(function(a)
      local i, o = a:tensor(1), a:tensor(2)
      if i[1] < 0 then error("x[1] is negative") end
      for k = 1, #o do o[k] = i[k] * 2 end
    end, "need")
    local copy = c:register(pto.chip_kernel("copy"), "copy")
    assert.is_true(c.catch)
    x[1] = -1
    local orch = c:open_run()
    orch:submit_sub(need, pto.args{{x, "in"}, {y, "out"}})
    orch:submit_next_level(copy, pto.args{{y, "in"}, {z, "out"}})
    assert.is_true(c:wait(10))
    local d = c:dispatch()
    assert.equals(0, d.caught)
    assert.is_true(d.held)
    assert.equals("failed", orch:task(0).state)
    assert.equals("pending", orch:task(1).state)   -- not poisoned
    H.assert_error(function() c:retry(1) end, "Worker:retry: ", "task 1 is not a caught failure")
    H.assert_error(function() c:retry(-1) end, "Worker:retry: ", "task id -1 is not a task")   -- once hung
    H.assert_error(function() c:retry(math.mininteger) end, "Worker:retry: ", "is not a task")
    x[1] = 3
    assert.is_true(c:retry(0))
    assert.equals(6, z[1])
    assert.is_true(c:close_run())
    x[1] = -1
    local ok, err = pcall(c.run, c, function(o)
      o:submit_sub(need, pto.args{{x, "in"}, {y, "out"}})
      o:submit_next_level(copy, pto.args{{y, "in"}, {z, "out"}})
    end)
    assert.is_false(ok)
    has(err, "task 0 (callable 'need' on sub 1) failed")
    c:set_catch(false)
    assert.is_false(c.catch)
    c:close()
  end)

  it("w:retry(id, handle) runs the caught task with a fixed callable registered since, of the same kind", function()
    local c = pto.Worker{chips = 1, num_sub_workers = 1, catch = true}
    local x, y, z = pto.tensor({4}, "f32"), pto.tensor({4}, "f32"), pto.tensor({4}, "f32")
    local broken = c:register(function(a) error("broken") end, "broken")
    local copy = c:register(pto.chip_kernel("copy"), "copy")
    x[1] = 7
    local orch = c:open_run()
    orch:submit_sub(broken, pto.args{{x, "in"}, {y, "out"}})
    orch:submit_next_level(copy, pto.args{{y, "in"}, {z, "out"}})
    assert.is_true(c:wait(10))
    assert.equals(0, c:dispatch().caught)
    local fixed = c:register(function(a)
      local i, o = a:tensor(1), a:tensor(2)
      for k = 1, #o do o[k] = i[k] + 1 end
    end, "fixed")
    H.assert_error(function() c:retry(0, copy) end, "Worker:retry: ", "task 0 is not a next-level task")
    assert.equals(0, c:dispatch().caught)   -- still caught
    H.assert_error(function() c:retry(0, "fixed") end, "Worker:retry: ", "must be a handle from Worker:register")
    assert.is_true(c:retry(0, fixed, 10))
    assert.equals(8, z[1])
    local t = orch:task(0)
    assert.equals("fixed", package.loaded.pto._callable_name(c, t.kind, t.callable))
    assert.is_true(c:close_run())
    c:close()
  end)

  it('check = "warn": the failures become warnings, and the task leaves what it would unchecked', function()
    W:set_check("warn")
    assert.equals("warn", W.check)
    local x, y = ramp(), pto.tensor({N}, "f32")
    y:fill(1)
    local ok, err = one(K.bad_read_out, x, y)   -- y += x: fails under check = true
    W:set_check(true)
    assert(ok, err)
    assert.equals(2, y[1])     -- from y's real prior contents (1), not from a fill pattern
    assert.equals(65, y[64])
    assert.is_true(W.check)
    local v = pto.Worker{chips = 1, check = "warn"}
    assert.equals("warn", v.check)
    v:close()
    H.assert_error(function() W:set_check("loud") end, "Worker:set_check: ", 'expected true or false, or "warn"')
    H.assert_error(function() pto.Worker{check = "on"} end, "pto.Worker: ", 'check must be true or false, or "warn"')
  end)

  it("ptolua --check=warn and PTO_CHECK=warn print each finding on stderr and the script succeeds", function()
    local src = [[
      local w = pto.Worker{chips = 1}
      assert(w.check == "warn", tostring(w.check))
      local k = {}
      for _, n in ipairs{"bad_read_out", "bad_write_in", "bad_write_outside", "fill"} do
        k[n] = w:register(pto.chip_kernel(n), n)
      end
      local x, y, t = pto.tensor({64}, "f32"), pto.tensor({64}, "f32"), pto.tensor({64}, "f32")
      local other = pto.tensor({1 << 16}, "f32")
      for i = 1, 64 do x[i] = i end
      y:fill(1)
      w:run(function(o) o:submit_next_level(k.bad_read_out, pto.args{{x, "in"}, {y, "out"}}) end)
      assert(y[1] == 2 and y[64] == 65, ("y[1] = %g"):format(y[1]))
      w:run(function(o) o:submit_next_level(k.bad_write_in, pto.args{{x, "in"}, {y, "out"}}) end)
      assert(x[1] == 2 and y[1] == 1, ("x[1] = %g, y[1] = %g"):format(x[1], y[1]))   -- as unchecked: it wrote x once
      if w.mode == "process" then
        w:run(function(o) o:submit_next_level(k.bad_write_outside, pto.args{{x, "in"}, {y, "out"},
          scalars = {other.address + 4 * 40000}}) end)
        assert(other[40001] == 42)
      end
      w:hold()
      w:run(function(o)
        o:submit_next_level(k.fill, pto.args{{t, "out"}, scalars = {1.0}})
        o:submit_next_level(k.fill, pto.args{{t, "out"}, scalars = {2.0}})
        w:release()
      end)
      print("done in " .. w.mode .. " mode")
    ]]
    for _, how in ipairs{"flag", "env"} do
      local code, out = run_checked(src, how == "env" and "PTO_CHECK=warn " or nil, "--check=warn")
      assert.equals(0, code, out)
      has(out, "ptolua: run 1, task 0 (callable 'bad_read_out' on chip 1): check: warning: read argument 2 "
               .. "(64 f32 at element 0) tagged OUTPUT before writing it")
      has(out, "ptolua: run 2, task 0 (callable 'bad_write_in' on chip 1): check: warning: wrote argument 1 "
               .. "(64 f32 at element 0) tagged INPUT (first changed: element 0 of the view)")
      local mode = assert(out:match("done in (%a+) mode"), out)
      if mode == "process" then
        has(out, "ptolua: run 3, task 0 (callable 'bad_write_outside' on chip 1): check: warning: wrote address ")
      end
      has(out, ("ptolua: check: warning: run %d, task 1 (callable 'fill') tags argument 1 (64 f32 at element 0) "
                .. "OUTPUT, an overwrite that is not ordered after task 0"):format(mode == "process" and 4 or 3))
    end
  end)

  it("passes a correct BGEMM under PTO_CHECK=1", function()
    local code, out = run_checked([[
      local T, KT = 8, 4
      local w = pto.Worker{chips = 2}
      assert(w.check, "PTO_CHECK=1 turns check mode on")
      local gemm, add = w:register(pto.chip_kernel("gemm_tile")), w:register(pto.chip_kernel("tile_add"))
      local A, B, C = pto.tensor({KT, T, T}, "f32"), pto.tensor({KT, T, T}, "f32"), pto.tensor({T, T}, "f32")
      for i = 1, #A do A[i] = i % 7 - 3; B[i] = i % 5 - 2 end
      w:run(function(o)
        for k = 0, KT - 1 do
          local p = o:alloc({T, T}, "f32")
          o:submit_next_level(gemm, pto.args{{A:view{offset = k * T * T, shape = {T, T}}, "in"},
                                             {B:view{offset = k * T * T, shape = {T, T}}, "in"}, {p, "out"}})
          o:submit_next_level(add, pto.args{{C, "inout"}, {p, "in"}})
        end
      end)
      local s = 0
      for k = 0, KT - 1 do for x = 0, T - 1 do s = s + A[k * T * T + x + 1] * B[k * T * T + x * T + 1] end end
      assert(math.abs(C[1] - s) < 1e-3, ("C[1] = %g, expected %g"):format(C[1], s))
      print("bgemm ok")
    ]], "PTO_CHECK=1 ")   -- no --check: the environment variable alone
    assert.equals(0, code, out)
    has(out, "bgemm ok")
  end)
end)
