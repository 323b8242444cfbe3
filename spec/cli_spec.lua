-- cli_spec.lua: the ptolua program's command line, run as a child process.
-- PTOLUA names the binary under test (spec/CMakeLists.txt sets it).
local PTOLUA = assert(os.getenv("PTOLUA"), "set PTOLUA to the ptolua binary")

local F = require "files"
local tmpname, writefile = F.tmpname, F.writefile
local function readfile(name) return assert(F.readfile(name), "missing " .. name) end

local function script(text) return writefile(tmpname(".lua"), text) end

local q = F.q

-- Run ptolua with the given arguments (already shell words); opts.stdin is
-- the input text (default: none), opts.env a prefix like "VAR=x ",
-- opts.wrap shell commands to run first (like "ulimit -v N;").
-- LUA_INIT is cleared so the caller's environment cannot change results.
-- Returns stdout, stderr, exit status.
local function run(args, opts)
  opts = opts or {}
  local inp = opts.stdin and writefile(tmpname(), opts.stdin) or "/dev/null"
  local err = tmpname()
  local cmd = ("%senv -u LUA_INIT -u LUA_INIT_5_4 %s%s %s <%s 2>%s")
    :format(opts.wrap or "", opts.env or "", q(PTOLUA), args, q(inp), q(err))
  local p = assert(io.popen(cmd, "r"))
  local out = p:read("a")
  local _, how, code = p:close()
  assert(how == "exit", "ptolua killed by signal " .. tostring(code))
  return out, readfile(err), code
end

-- Start a command in the background, SIGINT it after a pause and return
-- its exit status as the shell's `wait` reports it.
local function interrupt(cmd, delay)
  local p = assert(io.popen(("sh -c %s"):format(q(
    cmd .. " & pid=$!; sleep " .. (delay or 0.5) .. "; kill -INT $pid; " ..
    -- a watchdog turns "never stopped" into a failure instead of a hang
    "(sleep 20; kill -9 $pid) >/dev/null 2>&1 & dog=$!; wait $pid; rc=$?; kill $dog 2>/dev/null; echo $rc"))))
  local out = p:read("a")
  p:close()
  return tonumber(out:match("(%d+)%s*$"))
end

teardown(F.cleanup)

describe("ptolua exit status", function()
  it("is 0 when the script succeeds", function()
    local out, err, code = run(q(script("print('hello')")))
    assert.are.equal("hello\n", out)
    assert.are.equal("", err)
    assert.are.equal(0, code)
  end)

  it("is 1 on an uncaught error", function()
    local _, _, code = run(q(script("error('boom')")))
    assert.are.equal(1, code)
  end)

  it("is the value given to os.exit", function()
    local _, _, code = run(q(script("os.exit(3)")))
    assert.are.equal(3, code)
    _, _, code = run("-e " .. q("os.exit(false)"))
    assert.are.equal(1, code)
  end)

  it("is 1 for a script that cannot be opened", function()
    local _, err, code = run(q("/nonexistent/x.lua"))
    assert.matches("cannot open /nonexistent/x.lua", err, 1, true)
    assert.are.equal(1, code)
  end)
end)

describe("ptolua arg", function()
  local s = script([[
    local t = {}
    for i = -3, #arg do t[#t + 1] = i .. "=" .. tostring(arg[i]) end
    print(table.concat(t, " "))
    print(select("#", ...), ...)
  ]])

  it("has the script at 0, its arguments after, options before", function()
    local out, _, code = run("-e " .. q("x=1") .. " " .. q(s) .. " a " .. q("b c"))
    assert.are.equal(0, code)
    local line1, line2 = out:match("^(.-)\n(.-)\n$")
    assert.are.equal(("-3=%s -2=-e -1=x=1 0=%s 1=a 2=b c"):format(PTOLUA, s), line1)
    assert.are.equal("2\ta\tb c", line2)
  end)

  it("has no arguments when the script has none", function()
    local out = run(q(s))
    assert.are.equal(("-3=nil -2=nil -1=%s 0=%s"):format(PTOLUA, s), out:match("^(.-)\n"))
    assert.matches("\n0\n$", out)
  end)

  it("has the interpreter at 0 without a script", function()
    local out = run("-e " .. q("print(arg[0], arg[1], arg[2], #arg)"))
    assert.are.equal(("%s\t-e\tprint(arg[0], arg[1], arg[2], #arg)\t2\n"):format(PTOLUA), out)
  end)

  it("treats what follows -- as the script", function()
    local out, _, code = run("-- " .. q(s) .. " -x")
    assert.are.equal(0, code)
    assert.matches("\n1\t%-x\n$", out)
  end)
end)

describe("ptolua -e", function()
  it("runs several chunks in order, then the script", function()
    local s = script("io.write('c', x, '\\n')")
    local out, err, code = run("-e " .. q("io.write('a')") .. " -e" .. q("io.write('b') x = 42") .. " " .. q(s))
    assert.are.equal("abc42\n", out)
    assert.are.equal("", err)
    assert.are.equal(0, code)
  end)

  it("stops at the first failing chunk", function()
    local out, err, code = run("-e " .. q("io.write('a')") .. " -e " .. q("error('e2')") .. " -e " .. q("io.write('c')"))
    assert.are.equal("a", out)
    assert.matches("(command line):1: e2", err, 1, true)
    assert.are.equal(1, code)
  end)

  it("needs an argument", function()
    local out, err, code = run("-e")
    assert.are.equal("", out)
    assert.matches("'-e' needs argument", err, 1, true)
    assert.matches("usage:", err, 1, true)
    assert.are.equal(1, code)
  end)
end)

describe("ptolua stdin", function()
  it("runs stdin for -, with the arguments that follow", function()
    local out, _, code = run("- a b", { stdin = "print(...)" })
    assert.are.equal("a\tb\n", out)
    assert.are.equal(0, code)
  end)

  it("runs piped stdin when given no arguments", function()
    local out, _, code = run("", { stdin = "print(6 * 7)" })
    assert.are.equal("42\n", out)
    assert.are.equal(0, code)
  end)

  it("reports an error in piped stdin and exits 1", function()
    local _, err, code = run("", { stdin = "\nerror('piped')" })
    assert.matches("stdin:2: piped", err, 1, true)
    assert.matches("stack traceback:", err, 1, true)
    assert.are.equal(1, code)
  end)
end)

describe("ptolua -v and -h", function()
  it("-v prints the version line and exits 0", function()
    local out, err, code = run("-v")
    assert.matches("^ptolua %S+ %(pto engine%) %-%- Lua 5%.4%.%d+", out)
    assert.are.equal(1, select(2, out:gsub("\n", "")))
    assert.are.equal("", err)
    assert.are.equal(0, code)
  end)

  it("-v with a script prints the version, then runs the script", function()
    local out, _, code = run("-v " .. q(script("print('ran')")))
    assert.matches("^ptolua .-\nran\n$", out)
    assert.are.equal(0, code)
  end)

  for _, opt in ipairs { "-h", "--help" } do
    it(opt .. " prints the usage on stdout and exits 0", function()
      local out, err, code = run(opt .. " -e " .. q("print('not run')"))
      assert.matches("^usage: ", out)
      for _, o in ipairs { "-e stat", "-i", "-l mod", "-l g=mod", "-v", "-E", "-W", "-h, --help", "--", "-  " } do
        assert.matches("\n  " .. o:gsub("%p", "%%%0"), out)
      end
      assert.is_nil(out:find("not run", 1, true))
      assert.are.equal("", err)
      assert.are.equal(0, code)
    end)
  end

  it("an unknown option prints the usage on stderr and exits 1", function()
    for _, opt in ipairs { "-z", "-vx", "--x" } do
      local out, err, code = run(opt .. " " .. q(script("print('not run')")))
      assert.are.equal("", out)
      assert.matches("unrecognized option '" .. opt .. "'", err, 1, true)
      assert.matches("\nusage: ", err)
      assert.are.equal(1, code)
    end
  end)
end)

describe("ptolua errors", function()
  it("show the message and a traceback with the script's line", function()
    local s = script("local function f()\n  error('boom')\nend\nf()\n")
    local out, err, code = run(q(s))
    assert.are.equal("", out)
    assert.are.equal(1, code)
    local first = err:match("^(.-)\n")
    assert.are.equal(PTOLUA .. ": " .. s .. ":2: boom", first)
    assert.matches("\nstack traceback:\n", err, 1, true)
    assert.matches("\n\t" .. s .. ":2: in ", err, 1, true)
    assert.matches("\n\t" .. s .. ":4: in main chunk", err, 1, true)
  end)

  it("name the type of a non-string error object", function()
    local _, err, code = run(q(script("error({ code = 1 })")))
    assert.matches("(error object is a table value)", err, 1, true)
    assert.matches("stack traceback:", err, 1, true)
    assert.are.equal(1, code)
  end)

  it("use __tostring of an error object", function()
    local _, err, code = run(q(script("error(setmetatable({}, { __tostring = function() return 'custom' end }))")))
    assert.matches(": custom\n", err, 1, true)
    assert.are.equal(1, code)
  end)

  it("report syntax errors with the file and line, exit 1", function()
    local s = script("local x = 1\nx = = 2\n")
    local out, err, code = run(q(s))
    assert.are.equal("", out)
    assert.matches(s .. ":2: unexpected symbol near '='", err, 1, true)
    assert.are.equal(1, code)
    _, err, code = run("-e " .. q("x ="))
    assert.matches("(command line):1:", err, 1, true)
    assert.are.equal(1, code)
  end)
end)

describe("ptolua shutdown", function()
  it("closes the state at normal exit (__gc runs)", function()
    local out, _, code = run(q(script("g = setmetatable({}, { __gc = function() io.write('gc\\n') end })")))
    assert.are.equal("gc\n", out)
    assert.are.equal(0, code)
  end)

  it("closes the state at error exit", function()
    local out, _, code = run(q(script("g = setmetatable({}, { __gc = function() io.write('gc\\n') end }) error('x')")))
    assert.are.equal("gc\n", out)
    assert.are.equal(1, code)
  end)
end)

describe("ptolua pto", function()
  it("is a preloaded global, the same table require returns", function()
    local out, _, code = run("-e " .. q([[
      assert(type(pto) == "table", "no pto global")
      assert(type(package.preload.pto) == "function", "pto not preloaded")
      assert(require("pto") == pto, "require returns another table")
      print("ok")]]))
    assert.are.equal("ok\n", out)
    assert.are.equal(0, code)
  end)

  it("is present before LUA_INIT runs", function()
    local out = run("-e " .. q("print(seen)"), { env = "LUA_INIT='seen = type(pto)' " })
    assert.are.equal("table\n", out)
  end)

  it("finds lua/ modules first in package.path", function()
    local src = os.getenv("PTO_SOURCE_DIR")
    local out = run("-e " .. q("io.write(package.path)"), { env = "LUA_PATH='/x/?.lua;;' " })
    if src then
      local want = src .. "/lua/?.lua;" .. src .. "/lua/?/init.lua;/x/?.lua;"
      assert.are.equal(want, out:sub(1, #want))
    end
    assert.matches(";/x/?.lua;", out, 1, true)
    assert.matches(";./?.lua;", out, 1, true) -- ";;" brought back the default
  end)
end)

describe("ptolua environment", function()
  it("runs LUA_INIT_5_4 in preference to LUA_INIT", function()
    local out = run("-e " .. q("print(x)"), { env = "LUA_INIT='x = 1' " })
    assert.are.equal("1\n", out)
    out = run("-e " .. q("print(x)"), { env = "LUA_INIT='x = 1' LUA_INIT_5_4='x = 2' " })
    assert.are.equal("2\n", out)
  end)

  it("runs LUA_INIT=@file", function()
    local init = script("x = 'from file'")
    local out = run("-e " .. q("print(x)"), { env = "LUA_INIT=" .. q("@" .. init) .. " " })
    assert.are.equal("from file\n", out)
  end)

  it("fails like a script when LUA_INIT fails", function()
    local out, err, code = run("-e " .. q("print('not run')"), { env = "LUA_INIT='error(\"init\")' " })
    assert.are.equal("", out)
    assert.matches("LUA_INIT:1: init", err, 1, true)
    assert.are.equal(1, code)
  end)

  it("ignores LUA_INIT and LUA_PATH with -E", function()
    local out = run("-E -e " .. q("print(x, package.path:find('/x/', 1, true))"),
      { env = "LUA_INIT='x = 1' LUA_PATH='/x/?.lua' " })
    assert.are.equal("nil\tnil\n", out)
  end)

  it("-W turns warnings on", function()
    local _, err = run("-W -e " .. q("warn('careful')"))
    assert.matches("Lua warning: careful", err, 1, true)
    _, err = run("-e " .. q("warn('careful')"))
    assert.are.equal("", err)
  end)
end)

describe("ptolua -l", function()
  local base = tmpname()
  writefile(base .. "_mod.lua", "return { name = 'mod' }")
  F.track(base .. "_mod.lua")
  local env = "LUA_PATH=" .. q(base .. "_?.lua;;") .. " "

  it("requires a module into the global of its name", function()
    local out, _, code = run("-l mod -e " .. q("print(mod.name)"), { env = env })
    assert.are.equal("mod\n", out)
    assert.are.equal(0, code)
  end)

  it("g=mod picks the global name", function()
    local out = run("-l g=mod -e " .. q("print(g.name, mod)"), { env = env })
    assert.are.equal("mod\tnil\n", out)
  end)

  it("fails with exit 1 for a missing module", function()
    local _, err, code = run("-l no_such_mod_xyz", { env = env })
    assert.matches("module 'no_such_mod_xyz' not found", err, 1, true)
    assert.are.equal(1, code)
  end)
end)

describe("ptolua -i", function()
  it("prints the values of expressions", function()
    local out, _, code = run("-i", { stdin = "1+1\n" })
    assert.matches("^ptolua ", out) -- -i shows the version first
    assert.matches("2\n", out, 1, true)
    assert.are.equal(0, code)
  end)

  it("continues incomplete chunks and keeps going after errors", function()
    local out, err, code = run("-i", { stdin = "for i = 1, 3 do\nio.write(i)\nend\nerror('oops')\n=40+2\n'a', nil, 3\n" })
    assert.matches("123", out, 1, true)
    assert.matches("42\n", out, 1, true)
    assert.matches("a\tnil\t3\n", out, 1, true)
    assert.matches("stdin:1: oops", err, 1, true)
    assert.are.equal(0, code)
  end)

  it("shows the syntax error of a chunk left incomplete at end of input", function()
    local _, err, code = run("-i", { stdin = "if x then\n" })
    assert.matches("'end' expected near <eof>", err, 1, true)
    assert.are.equal(0, code)
  end)

  it("runs the script first, then reads commands", function()
    local out, _, code = run("-i " .. q(script("answer = 42")), { stdin = "answer\n" })
    assert.matches("42\n", out, 1, true)
    assert.are.equal(0, code)
  end)
end)

describe("ptolua's progress line", function()
  it("never shows when stderr is not a terminal", function()
    local s = script(F.SLOW_RUN_SCRIPT)
    local out, err, code = run(q(s))
    assert.are.equal(0, code, err)
    assert.are.equal("run done\n", out)
    assert.are.equal("", err)   -- no "[pto] ... tasks done" on a file
  end)
end)

describe("ptolua SIGINT", function()
  it("stops a script in an endless loop with 'interrupted!' and exit 1", function()
    local err = tmpname()
    -- The loop allocates: ThreadSanitizer delivers signals only when the
    -- program enters one of its interceptors, and a bare `while true do end`
    -- never does. The interruption path (hook + lpto_interrupt) is the same.
    local s = script("while true do local t = {} end")
    local code = interrupt(("%s %s 2>%s"):format(q(PTOLUA), q(s), q(err)))
    assert.are.equal(1, code)
    local text = readfile(err)
    assert.matches("interrupted!", text, 1, true)
    assert.matches("stack traceback:", text, 1, true)
    assert.matches(s .. ":1:", text, 1, true)
  end)

  it("returns to the prompt when it interrupts a chunk in the REPL", function()
    local out, err = tmpname(), tmpname()
    local feed = "(echo 'while true do local t = {} end'; sleep 1.5; echo 'print(\"back\")')"
    local code = interrupt(("%s | %s -i >%s 2>%s"):format(feed, q(PTOLUA), q(out), q(err)))
    assert.are.equal(0, code)
    assert.matches("interrupted!", readfile(err), 1, true)
    assert.matches("back\n", readfile(out), 1, true)
  end)
end)

-- A sanitizer runtime reserves terabytes of shadow memory, so a sanitizer
-- build cannot run under `ulimit -v` at all; the plain build runs these.
local SANITIZED = (os.getenv("PTO_SANITIZE") or "") ~= ""
local function plain_only(name, fn)
  if SANITIZED then
    pending(name .. " [plain build only: a sanitizer runtime cannot run under ulimit -v]")
  else
    it(name, fn)
  end
end

describe("ptolua under an address-space limit", function()
  plain_only("fits a default Worker's heap rings to ulimit -v and says so", function()
    local s = script([[
      local w = pto.Worker{chips = 1}
      local k = w:register(pto.chip_kernel("sleep_us"))
      w:init()
      w:run(function(o) o:submit_next_level(k, pto.args{scalars = {10}}) end)
      w:close()
      print("ran")
    ]])
    local out, err, code = run(q(s), {env = "", wrap = "ulimit -v 3000000;"})
    assert.are.equal(0, code, err)
    assert.are.equal("ran\n", out)
    assert.matches("heap rings shrunk from 1 GiB to %d+ MiB each to fit the address%-space limit %(ulimit %-v%)", err)
  end)

  plain_only("keeps a heap_ring_size the script chose, and says nothing", function()
    local out, err, code = run("-e " .. q("pto.Worker{heap_ring_size = 1 << 20}:close() print('ok')"),
                               {wrap = "ulimit -v 3000000;"})
    assert.are.equal(0, code, err)
    assert.are.equal("ok\n", out)
    assert.are.equal("", err)
  end)
end)
