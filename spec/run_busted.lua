-- run_busted.lua: runs one busted spec file and fails unless its TAP output
-- proves the file really ran. busted's exit status alone is not enough: a
-- file with no tests prints `1..0` and exits 0, a spec that calls os.exit(0)
-- part-way exits 0 with no plan at all, and a spec whose `it` blocks turned
-- into `pending` (a probe that gave up, a misplaced early return) passes
-- with nothing tested. CTest runs every Lua spec through this script
-- (spec/CMakeLists.txt); spec/fixtures/tap_selftest.lua proves it rejects
-- each kind of bad output.
--
-- Usage: ptolua spec/run_busted.lua --spec FILE --mode MODE [--min N] -- COMMAND...
--   COMMAND (busted -o TAP FILE, under its interpreter) runs with stdout
--   read here and echoed; stderr passes through.
--   MODE is process or thread: the Worker mode the spec runs in, which
--   decides which mode-only tests count (see expected_min).
--   --min N overrides the minimum derived from FILE.
--
-- Passes only when all of these hold, and otherwise says which did not:
--   COMMAND exits 0; its output has exactly one plan line `1..N`, after
--   every result line, with N >= 1; result lines are numbered 1..N in
--   order, none missing; no `not ok`; at least the expected minimum of
--   them passed (`ok` without `# SKIP`).
-- A developer's explicit opt-out (a pending entry whose text has
-- "[opt-out]", e.g. process_spec.lua under PTO_ALLOW_NO_PROCESS=1) makes an
-- otherwise complete run a skip instead: exit 77, which spec/CMakeLists.txt
-- declares as SKIP_RETURN_CODE. Under CI (CI or PTO_CI set) it is a failure.

local function die(fmt, ...)
  io.stderr:write("run_busted: ", fmt:format(...), "\n")
  os.exit(2)
end

local function parse_args(argv)
  local opt, i = {}, 1
  while i <= #argv do
    local a = argv[i]
    if a == "--" then
      opt.cmd = table.move(argv, i + 1, #argv, 1, {})
      break
    elseif a == "--spec" or a == "--mode" or a == "--min" then
      opt[a:sub(3)] = argv[i + 1] or die("%s needs a value", a)
      i = i + 2
    else
      die("unknown argument %q (usage: --spec FILE --mode MODE [--min N] -- COMMAND...)", a)
    end
  end
  if not opt.cmd or #opt.cmd == 0 then die("no command after --") end
  if opt.mode ~= "process" and opt.mode ~= "thread" then die("--mode must be process or thread") end
  return opt
end

-- The tests a spec file must pass, counted from its text: every `it(`
-- call, plus the mode-only tests of this mode (H.thread_only and
-- H.process_only in spec/helpers.lua give `pending` in the other mode).
-- A loop that makes many tests from one `it(` counts once: this is a
-- floor, and what it catches is a block of tests that stopped running.
-- Comments are dropped first, so prose that mentions it( does not count.
local function expected_min(path, mode)
  local f = io.open(path) or die("cannot read spec file %s", path)
  local text = f:read("a")
  f:close()
  text = text:gsub("%-%-%[(=*)%[.-%]%1%]", ""):gsub("%-%-[^\n]*", "")
  local n = 0
  for _ in text:gmatch("%f[%w_.:]it%(") do n = n + 1 end
  local own = mode == "thread" and "thread_only%(" or "process_only%("
  for _ in text:gmatch(own) do n = n + 1 end
  return n
end

local function shell_quote(s)
  return "'" .. s:gsub("'", "'\\''") .. "'"
end

-- Run cmd, echo its stdout, return its lines and whether it exited 0.
local function run(cmd)
  local q = {}
  for i, a in ipairs(cmd) do q[i] = shell_quote(a) end
  local p = io.popen(table.concat(q, " "), "r") or die("cannot start %s", cmd[1])
  local lines = {}
  for line in p:lines() do
    io.stdout:write(line, "\n")
    io.stdout:flush()
    lines[#lines + 1] = line
  end
  local ok, how, code = p:close()
  return lines, ok, how, code
end

-- The reasons lines (TAP) fall short, empty when they do not.
local function check(lines, min)
  local why, plan, plan_at, last_result = {}, nil, nil, 0
  local numbers, passed, skipped, failed, optout = {}, 0, 0, 0, nil
  for i, line in ipairs(lines) do
    local n = line:match("^1%.%.(%d+)%s*$")
    if n then
      if plan then why[#why + 1] = "more than one plan line" end
      plan, plan_at = tonumber(n), i
    else
      local notok = line:match("^not ok (%d+)")
      local num = notok or line:match("^ok (%d+)")
      if num then
        last_result = i
        numbers[#numbers + 1] = tonumber(num)
        if notok then
          failed = failed + 1
        elseif line:find("^ok %d+ %- # SKIP") then
          skipped = skipped + 1
          optout = optout or line:match("^ok %d+ %- # SKIP .-(%[opt%-out%].*)")
        else
          passed = passed + 1
        end
      end
    end
  end
  if not plan then
    why[#why + 1] = "no TAP plan line (1..N): the run ended early"
  else
    if plan == 0 then why[#why + 1] = "the plan is 1..0: no test ran" end
    if plan_at < last_result then why[#why + 1] = "result lines after the plan" end
    if #numbers ~= plan then
      why[#why + 1] = ("the plan says %d tests, %d result lines"):format(plan, #numbers)
    end
  end
  for i, num in ipairs(numbers) do
    if num ~= i then
      why[#why + 1] = ("result line %d is numbered %d"):format(i, num)
      break
    end
  end
  if failed > 0 then why[#why + 1] = ("%d not ok"):format(failed) end
  local fewer = passed < min
  if fewer then
    why[#why + 1] = ("%d tests passed (%d skipped), fewer than the %d expected"):format(passed, skipped, min)
  end
  -- an opt-out excuses only the missing passes
  local excused = optout and fewer and #why == 1
  return why, passed, skipped, excused and optout
end

local function in_ci()
  for _, v in ipairs{os.getenv("CI") or "", os.getenv("PTO_CI") or ""} do
    if v ~= "" and v ~= "0" and v ~= "false" and v ~= "no" then return true end
  end
  return false
end

local opt = parse_args(arg)
local min = opt.min and math.tointeger(tonumber(opt.min)) or (opt.spec and expected_min(opt.spec, opt.mode))
if not min then die("give --spec FILE or --min N") end
local label = (opt.spec or "TAP"):match("([^/]+)$") .. " (" .. opt.mode .. " mode)"
local lines, ok, how, code = run(opt.cmd)
local why, passed, skipped, optout = check(lines, min)
if ok and optout then
  if not in_ci() then
    io.stdout:write(("SKIPPED: %s: %s\n"):format(label, optout))
    os.exit(77)
  end
  why[#why + 1] = "an opt-out under CI, which must run every test: " .. optout
end
if not ok then table.insert(why, 1, ("the command %s with %s"):format(how == "signal" and "died" or "exited", code)) end
if #why > 0 then
  io.stdout:write(("run_busted: FAILED %s: %s\n"):format(label, table.concat(why, "; ")))
  os.exit(1)
end
io.stdout:write(("run_busted: %s: %d passed, %d skipped, at least %d expected\n"):format(label, passed, skipped, min))
