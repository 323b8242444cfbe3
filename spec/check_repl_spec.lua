-- check_repl_spec.lua: the prompt's :why N and :check on|off (docs/repl.md,
-- docs/check.md), through a real pseudo-terminal (spec/fixtures/ptydrive.c),
-- like repl_spec.lua. Runs in both modes: ptolua inherits $PTO_MODE.
local PTOLUA = assert(os.getenv("PTOLUA"), "set PTOLUA to the ptolua binary")
local PTYDRIVE = assert(os.getenv("PTYDRIVE"), "set PTYDRIVE to the ptydrive fixture")

local F = require "files"

local function esc(s)
  return (s:gsub("\\", "\\\\"):gsub("\n", "\\n"):gsub("\t", "\\t"):gsub("\r", "\\r")
    :gsub("[%c]", function(c) return ("\\x%02x"):format(c:byte()) end))
end

local tmpdir = assert(io.popen("mktemp -d")):read("l")

-- Run one session of steps on `ptolua -i setup`; the transcript, once ptolua exited 0.
local function session(setup, steps)
  local lines = {}
  for _, s in ipairs(steps) do lines[#lines + 1] = s[1] .. (s[2] and " " .. esc(tostring(s[2])) or "") end
  local script = F.writefile(F.tmpname(), table.concat(lines, "\n") .. "\n")
  local init = F.writefile(F.tmpname(".lua"), setup)
  local err = F.tmpname()
  local cmd = ("env -u LUA_INIT -u LUA_INIT_5_4 TERM=xterm HOME=%s PTOLUA_HISTORY=%s %s %s %s -i %s 2>%s")
    :format(F.q(tmpdir), F.q(F.tmpname()), F.q(PTYDRIVE), F.q(script), F.q(PTOLUA), F.q(init), F.q(err))
  local p = assert(io.popen(cmd, "r"))
  local out = p:read("a")
  local _, _, code = p:close()
  assert(code == 0 and out:find("EXIT 0\n", 1, true),
    "session failed (" .. tostring(code) .. "): " .. (F.readfile(err) or "") .. "\n--- transcript:\n" .. out)
  return out
end

local function send(s) return {"send", s} end
local function expect(s) return {"expect", s} end
local PROMPT = {"line", "> "}
local EOF, WAIT = {"send", "\4"}, {"wait"}

local SETUP = [[
w = pto.Worker{chips = 1, heap_ring_size = 1 << 20}
fill = w:register(pto.chip_kernel("fill"), "fill")
copy = w:register(pto.chip_kernel("copy"), "copy")
fail = w:register(pto.chip_kernel("fail"), "fail")
slow = w:register(pto.chip_kernel("sleep_us"), "slow")
a, b, c = pto.tensor({16}, "f32"), pto.tensor({16}, "f32"), pto.tensor({16}, "f32")
]]

teardown(function()
  F.cleanup()
  os.execute("rm -rf " .. F.q(tmpdir))
end)

describe(":why", function()
  it("names the producer a task waits for, a hold, a breakpoint and a full heap ring", function()
    session(SETUP, {
      PROMPT, send(":hold\n"), expect("dispatch held"), PROMPT,
      send("orch = w:open_run()\n"), PROMPT,
      send("orch:submit_next_level(fill, pto.args{{a, 'out'}, scalars = {1.0}})\n"), expect("\n0\n"), PROMPT,
      send("orch:submit_next_level(copy, pto.args{{a, 'in'}, {b, 'out'}})\n"), expect("\n1\n"), PROMPT,
      send(":why 1\n"), expect("task 1 copy (chip) is pending:\n  it waits for producer task 0 fill (chip): ready\n"),
      PROMPT, send(":why 0\n"), expect("task 0 fill (chip) is ready:\n  dispatch is held (:step"), PROMPT,
      send(":break copy\n"), PROMPT, send(":step\n"), expect("(dispatch held, 1 breakpoint)"), PROMPT,
      send(":why 1\n"), expect("  a breakpoint on copy holds dispatch before it\n"), PROMPT,
      send("p = orch:alloc({240 * 1024}, 'f32')\n"), PROMPT,
      send(":why 1\n"), expect("heap ring 0 is 93% full (960 KiB of 1 MiB): a submit that needs more waits"), PROMPT,
      send(":unbreak\n"), PROMPT, send(":finish\n"), expect("run finished: 3 tasks, no failure"), PROMPT,
      send(":release\n"), PROMPT, EOF, WAIT,
    })
  end)

  it("names a failed producer, a busy worker, and a task that has run", function()
    session(SETUP, {
      PROMPT, send("orch = w:open_run()\n"), PROMPT,
      send("orch:submit_next_level(fail, pto.args{{a, 'out'}, scalars = {3}})\n"), PROMPT,
      send("orch:submit_next_level(copy, pto.args{{a, 'in'}, {b, 'out'}})\n"), PROMPT,
      send("w:wait(2000)\n"), PROMPT,
      send(":why 1\n"), expect("  it failed: "), PROMPT,
      send(":why 0\n"), expect("  it failed: "), PROMPT,
      send(":finish\n"), expect("run failed:"), PROMPT,
      send("orch = w:open_run()\n"), PROMPT,
      send("orch:submit_next_level(slow, pto.args{scalars = {1500000}})\n"), PROMPT,
      send("orch:submit_next_level(fill, pto.args{{c, 'out'}, scalars = {2.0}})\n"), PROMPT,
      -- the sleep has started on chip 1 (a loaded machine may take a moment to start it)
      send("repeat local k = w:children()[1] until k.task == 0\n"), PROMPT,
      send(":why 1\n"), expect("chip 1 runs task 0"), PROMPT,
      send("w:wait(10000)\n"), PROMPT,
      send(":why 1\n"), expect("  it has run: "), PROMPT,
      send(":finish\n"), expect("run finished: 2 tasks, no failure"), PROMPT, EOF, WAIT,
    })
  end)
end)

describe(":why, cancelled", function()
  it("says a task of a cancelled run was not run because its run was cancelled (it shows as consumed)", function()
    session(SETUP, {
      PROMPT, send(":hold\n"), PROMPT,
      send("h = w:submit(function(o) o:submit_next_level(fill, pto.args{{a, 'out'}, scalars = {1.0}}); "
        .. "o:submit_next_level(copy, pto.args{{a, 'in'}, {b, 'out'}}) end)\n"), PROMPT,
      send("h:cancel()\n"), expect("\ntrue\n"), PROMPT,
      -- consumed once the scheduler has swept the cancel and reclaimed it,
      -- failed a moment before on a loaded machine: either way the reason
      -- line names the cancel
      send(":why 0\n"), expect("task 0 fill (chip) is "),
      expect(":\n  its run 1 was cancelled: task 0 was not run: its run 1 was cancelled\n"), PROMPT,
      -- task 1 is cancelled by the sweep itself or poisoned by cancelled
      -- task 0 first ("its producer task 0 failed, as run 1 was
      -- cancelled"), whichever the scheduler reaches first
      send(":why 1\n"), expect("  its run 1 was cancelled: task 1 was not run: "), expect("run 1 was cancelled\n"),
      PROMPT,
      send(":release\n"), PROMPT,
      send("pcall(h.wait, h)\n"), expect("run 1 was cancelled"), PROMPT, EOF, WAIT,
    })
  end)
end)

describe(":why, pinned", function()
  it("names the busy worker a pinned task waits for while another is free", function()
    session(SETUP:gsub("chips = 1", "chips = 2"), {
      PROMPT, send("orch = w:open_run()\n"), PROMPT,
      send("orch:submit_next_level(slow, pto.args{scalars = {1500000}}, nil, {worker = 1})\n"), PROMPT,
      send("orch:submit_next_level(fill, pto.args{{c, 'out'}, scalars = {2.0}}, nil, {worker = 1})\n"), PROMPT,
      send("repeat local k = w:children()[1] until k.task == 0\n"), PROMPT,
      send("orch:task(1).pinned\n"), expect("\n1\n"), PROMPT,
      send(":why 1\n"), expect("pinned to chip 1 ({worker = 1})"), expect("task 0"), PROMPT,
      send("w:wait(10000)\n"), PROMPT,
      send(":finish\n"), expect("run finished: 2 tasks, no failure"), PROMPT, EOF, WAIT,
    })
  end)
end)

local CATCH_SETUP = [[
w = pto.Worker{chips = 1, num_sub_workers = 1}
x, y, z = pto.tensor({4}, "f32"), pto.tensor({4}, "f32"), pto.tensor({4}, "f32")
x[1] = -1
need = w:register(function(a)
  local i, o = a:tensor(1), a:tensor(2)
  if i[1] < 0 then error("x[1] is negative") end
  for k = 1, #o do o[k] = i[k] * 2 end
end, "need")
copy = w:register(pto.chip_kernel("copy"), "copy")
]]

local SUBMIT = {
  send("orch = w:open_run()\n"), PROMPT,
  send("orch:submit_sub(need, pto.args{{x, 'in'}, {y, 'out'}})\n"), expect("\n0\n"), PROMPT,
  send("orch:submit_next_level(copy, pto.args{{y, 'in'}, {z, 'out'}})\n"), expect("\n1\n"), PROMPT,
  send("w:wait()\n"), expect("\ntrue\n"), PROMPT,
}

local function steps(...)
  local t = {}
  for _, part in ipairs{...} do for _, s in ipairs(part) do t[#t + 1] = s end end
  return t
end

describe(":catch", function()
  it("holds dispatch at a failure before its consumer is poisoned; :retry after fixing the input succeeds", function()
    local out = session(CATCH_SETUP, steps(
      { PROMPT, send(":catch on\n"), expect("failures are caught"), PROMPT },
      SUBMIT,
      { send(":why 1\n"), expect("producer task 0 need (sub) failed and is caught (dispatch held): fix it, then :retry 0"),
        PROMPT, send(":task 0\n"), expect("task 0 need (sub): failed"), expect("x[1] is negative"), PROMPT,
        send(":retry 1\n"), expect("Worker:retry: task 1 is not a caught failure"), PROMPT,
        send("x[1] = 5\n"), PROMPT,
        send(":retry 0\n"), expect("task 0 need (sub): failed -> completed"), expect("(dispatch free)"), PROMPT,
        send("z[1]\n"), expect("\n10.0\n"), PROMPT,
        send(":finish\n"), expect("run finished: 2 tasks, no failure"), PROMPT, EOF, WAIT }))
    assert(out:find("task 1 copy (chip): pending -> completed", 1, true), out)
  end)

  it("prints the failure when it is caught, once per catch: after the line that ran it and after a :retry that failed again",
    function()
    local CAUGHT = "caught: task 0 (callable 'need' on sub 1) failed: "
    local HINT = "x[1] is negative; dispatch is held: inspect, fix, then :retry 0; :release accepts the failure\n"
    local out = session(CATCH_SETUP, {
      PROMPT, send(":catch on\n"), PROMPT, send(":hold\n"), PROMPT,
      send("orch = w:open_run()\n"), PROMPT,
      send("orch:submit_sub(need, pto.args{{x, 'in'}, {y, 'out'}})\n"), expect("\n0\n"), PROMPT,
      send("orch:submit_next_level(copy, pto.args{{y, 'in'}, {z, 'out'}})\n"), expect("\n1\n"), PROMPT,
      send(":step\n"), expect(CAUGHT), expect(HINT), PROMPT,
      send("x[1] = x[1]\n"), PROMPT,   -- still caught, already said: nothing more
      send(":retry 0\n"), expect(CAUGHT), expect(HINT), PROMPT,
      send("x[1] = 5\n"), PROMPT,
      send(":retry 0\n"), expect("task 0 need (sub): failed -> completed"), PROMPT,
      send(":finish\n"), expect("run finished: 2 tasks, no failure"), PROMPT, EOF, WAIT })
    local n = select(2, out:gsub(CAUGHT:gsub("%p", "%%%0"), ""))
    assert.equals(2, n, out)
    -- after an ordinary Lua line too: the one during which the task failed, or at the latest w:wait's
    out = session(CATCH_SETUP, steps({ PROMPT, send(":catch on\n"), PROMPT }, SUBMIT,
      { send(":release\n"), PROMPT, send(":finish\n"), expect("run failed:"), PROMPT, EOF, WAIT }))
    assert(out:find(CAUGHT, 1, true) and out:find(HINT, 1, true), out)
    assert.is_true(out:find(CAUGHT, 1, true) < out:find("> :release", 1, true), out)
  end)

  it(":retry N callable runs the caught task with a callable registered since (the fixed one)", function()
    local out = session(CATCH_SETUP, steps(
      { PROMPT, send(":catch on\n"), PROMPT },
      SUBMIT,
      { send("fixed = w:register(function(a) local i, o = a:tensor(1), a:tensor(2) for k = 1, #o do "
          .. "o[k] = math.abs(i[k]) * 3 end end, 'need_fixed')\n"), PROMPT,
        send(":retry 0 copy\n"), expect("Worker:retry: task 0 is not a next-level task"), PROMPT,
        send(":retry 0 nothing\n"), expect(":retry: 'nothing' is neither a handle"), PROMPT,
        send(":retry 0 need_fixed\n"), expect("task 0 need_fixed (sub): failed -> completed"), expect("(dispatch free)"),
        PROMPT, send("z[1]\n"), expect("\n3.0\n"), PROMPT,
        send(":finish\n"), expect("run finished: 2 tasks, no failure"), PROMPT, EOF, WAIT }))
    assert(out:find("task 1 copy (chip): pending -> completed", 1, true), out)
  end)

  it(":release accepts the failure, which then poisons its consumer as before", function()
    session(CATCH_SETUP, steps(
      { PROMPT, send(":catch on\n"), PROMPT },
      SUBMIT,
      { send(":dag\n"), expect("caught the failure of task 0: inspect, fix, then :retry 0; :release accepts it"), PROMPT,
        send(":release\n"), expect("task 1 copy (chip): pending -> failed"), PROMPT,
        send(":finish\n"), expect("run failed: task 0 (callable 'need' on sub 1) failed"), PROMPT,
        send(":catch off\n"), expect("failures are not caught"), PROMPT, EOF, WAIT }))
  end)
end)

describe(":check", function()
  it("turns check mode on for the next run, which then names a wrong tag", function()
    local out = session(SETUP, {
      PROMPT, send(":check\n"), expect("check mode is off"), PROMPT,
      send(":check on\n"), expect("check mode is on for Worker(level 3"), PROMPT,
      send("w:run(function(o) o:submit_next_level(fill, pto.args{{a, 'out'}, scalars = {1.0}}); "
        .. "o:submit_next_level(fill, pto.args{{a, 'out'}, scalars = {2.0}}) end)\n"),
      expect("not ordered after task 0"), PROMPT,
      send(":check off\n"), expect("check mode is off"), PROMPT,
      send(":check warn\n"), expect("check mode is on, findings as warnings, for Worker(level 3"), PROMPT,
      send("w.check\n"), expect("\nwarn\n"), PROMPT,
      send(":check maybe\n"), expect(":check: expected on, off or warn (got 'maybe')"), PROMPT, EOF, WAIT,
    })
    assert(out:find("tag it INOUT", 1, true), out)
  end)

  it("counts a task seen finished at the prompt as ordered before what the next line submits", function()
    local out = session(SETUP, {
      PROMPT, send(":check on\n"), expect("check mode is on"), PROMPT,
      send(":hold\n"), expect("dispatch held"), PROMPT,
      send("orch = w:open_run()\n"), PROMPT,
      send("orch:submit_next_level(fill, pto.args{{a, 'out'}, scalars = {1.0}})\n"), expect("\n0\n"), PROMPT,
      -- held: task 0 is unfinished, so the same line's overwrite is reported
      send("orch:submit_next_level(fill, pto.args{{a, 'out'}, scalars = {2.0}})\n"),
      expect("not ordered after task 0"), PROMPT,
      send(":step\n"), expect("task 0 fill (chip): ready -> completed"), PROMPT,
      -- seen completed at the prompt: this line's overwrite is ordered after it
      send("orch:submit_next_level(fill, pto.args{{a, 'out'}, scalars = {3.0}})\n"), expect("\n1\n"), PROMPT,
      -- but two overwrites in one line are unordered, however fast the first one runs
      send(":release\n"), PROMPT,
      send("orch:submit_next_level(fill, pto.args{{b, 'out'}, scalars = {4.0}}); "
        .. "orch:drain(); orch:submit_next_level(fill, pto.args{{b, 'out'}, scalars = {5.0}}); "
        .. "orch:submit_next_level(fill, pto.args{{b, 'out'}, scalars = {6.0}})\n"),
      expect("not ordered after task 3"), PROMPT,
      send(":finish\n"), expect("run finished"), PROMPT, EOF, WAIT,
    })
    assert(out:find("tag it INOUT", 1, true), out)
  end)
end)
