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

-- Lua code that no Ctrl-C before the third can end: a thread-mode run
-- whose only task sleeps for 4 s (a thread cannot be stopped, and the run
-- waits for it). A pure C loop would do under lua5.4, but ThreadSanitizer
-- delivers no signal inside one, and a blocking read returns EINTR there.
local UNBREAKABLE = [[
local w = pto.Worker{mode = "thread", chips = 1}
local sl = w:register(pto.chip_kernel("sleep_us"))
w:run(function(o) o:submit_next_level(sl, pto.args{scalars = {4000000}}) end)
]]

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

  it("finds its own Lua parts in package.preload, whatever package.path says", function()
    local out, err, code = run("-e " .. q([[
      for _, m in ipairs{"pto.inspect", "pto.repl", "pto.commands"} do
        assert(type(package.preload[m]) == "function", m .. " not preloaded")
      end
      assert(type(require("pto.repl").print_results) == "function")
      print(package.path, package.cpath)]]), { env = "LUA_PATH=/nowhere/?.lua LUA_CPATH=/nowhere/?.so " })
    assert.are.equal("/nowhere/?.lua\t/nowhere/?.so\n", out, err)
    assert.are.equal(0, code)
  end)
end)

-- The checks of Lua 5.4's own test of its stand-alone interpreter
-- (testes/main.lua), restated: what a script sees of package.path/cpath,
-- LUA_INIT, -l, -E, arg, warnings, prompts, error objects and os.exit must
-- be exactly what lua5.4 gives it. `sh(fmt, ...)` runs a shell line in
-- which the word PTOLUA is the binary, with a clean LUA_* environment.
describe("ptolua as lua5.4's stand-alone interpreter", function()
  local function sh(line, ...)
    local err = tmpname()
    line = line:format(...):gsub("PTOLUA", (q(PTOLUA):gsub("%%", "%%%%")))
    local p = assert(io.popen(("env -u LUA_INIT -u LUA_INIT_5_4 -u LUA_PATH -u LUA_PATH_5_4 -u LUA_CPATH "
      .. "-u LUA_CPATH_5_4 sh -c %s 2>%s"):format(q(line), q(err))))
    local out = p:read("a")
    local _, how, code = p:close()
    assert(how == "exit", "killed by signal " .. tostring(code))
    return out, readfile(err), code
  end
  -- Every line of want appears in out (the prompt may echo input around them).
  local function has_lines(want, out)
    for line in want:gmatch(".-\n") do assert.matches(line, out, 1, true) end
  end
  local function defaults()
    local out = sh("PTOLUA -E -e 'print(package.path) print(package.cpath)'")
    return out:match("^(.-)\n(.-)\n$")
  end

  it("takes package.path and package.cpath from LUA_PATH[_5_4] and LUA_CPATH[_5_4] alone", function()
    assert.are.equal("x\n", sh("LUA_PATH=x PTOLUA -e 'print(package.path)'"))
    assert.are.equal("y\n", sh("LUA_PATH_5_4=y LUA_PATH=x PTOLUA -e 'print(package.path)'"))
    assert.are.equal("xuxu\n", sh("LUA_CPATH=xuxu PTOLUA -e 'print(package.cpath)'"))
    assert.are.equal("yacc\n", sh("LUA_CPATH_5_4=yacc LUA_CPATH=x PTOLUA -e 'print(package.cpath)'"))
  end)

  it("has lua5.4's default paths with -E and with an empty environment", function()
    local path, cpath = defaults()
    assert.truthy(path and path:find("lua", 1, true) and cpath:find("lua", 1, true))
    local out = sh("LUA_INIT='error(10)' LUA_PATH=xxx LUA_CPATH=xxx PTOLUA -E -e 'print(package.path) print(package.cpath)'")
    assert.are.equal(path .. "\n" .. cpath .. "\n", out)
    out = sh("env -i PTOLUA -e 'print(package.path) print(package.cpath)'")
    assert.are.equal(path .. "\n" .. cpath .. "\n", out)
    local lua54 = io.popen("command -v lua5.4"):read("l")
    if lua54 then   -- the same liblua5.4, so the very same defaults
      out = sh("env -i %s -e 'print(package.path) print(package.cpath)'", q(lua54))
      assert.are.equal(path .. "\n" .. cpath .. "\n", out)
    end
    assert.is_nil(path:find("pto", 1, true))
  end)

  it("replaces ';;' in LUA_PATH with the default path", function()
    local default = defaults()
    for _, p in ipairs{";", ";;", "a;;b", ";;b", "a;;", "a;b;;c"} do
      local want = p
      if p:find(";;", 1, true) then
        want = p:gsub(";;", ";" .. default:gsub("%%", "%%%%") .. ";"):gsub("^;", ""):gsub(";$", "")
      end
      assert.are.equal(want .. "\n", sh("LUA_PATH=%s PTOLUA -e 'print(package.path)'", q(p)), p)
    end
  end)

  it("runs LUA_INIT with arg set, LUA_INIT_5_4 first, @file, and stops on its error", function()
    local s = script("print(X)")
    assert.are.equal("3.2\n", sh("LUA_INIT='X=tonumber(arg[1])' PTOLUA %s 3.2", q(s)))
    assert.are.equal("10\n", sh("LUA_INIT_5_4='X=10' LUA_INIT='X=3' PTOLUA %s", q(s)))
    local twice = script("x = x or 10; print(x); x = x + 1")
    assert.are.equal("10\n11\n", sh("LUA_INIT=@%s PTOLUA %s", q(twice), q(twice)))
    local _, err, code = sh("LUA_INIT=\"error('msg')\" PTOLUA -e 'print(1)'")
    assert.matches("LUA_INIT:1: msg", err, 1, true)
    assert.are_not.equal(0, code)
  end)

  it("runs -l for several libraries in order, with explicit global names", function()
    local dir = tmpname()
    assert(os.execute(("rm -f %s && mkdir %s"):format(q(dir), q(dir))))
    F.writefile(dir .. "/liba.lua", "print(1); a=2; return {x=15}")
    F.writefile(dir .. "/libb.lua", "print(a); print(_G['liba'].x)")
    local out = sh("cd %s && LUA_PATH='?.lua;;' PTOLUA -l liba -llibb -lstring -l io libb.lua", q(dir))
    assert(os.execute("rm -r " .. q(dir)))
    assert.are.equal("1\n2\n15\n2\n15\n", out)
    out = sh("PTOLUA -l 'str=string' '-lm=math' -e 'print(m.sin(0))' %s",
             q(script("print(str.upper'alo alo', m.max(10, 20))")))
    assert.are.equal("0.0\nALO ALO\t20\n", out)
  end)

  it("builds arg from the command line, and a library loaded by -l sees it", function()
    local s = script(([[
      assert(#arg == 3 and arg[1] == 'a' and arg[2] == 'b' and arg[3] == 'c')
      assert(arg[-1] == '--' and arg[-2] == "-e " and arg[-3] == %q)
      assert(arg[4] == nil and arg[-4] == nil)
      local a, b, c = ...
      assert(... == 'a' and a == 'a' and b == 'b' and c == 'c')
      print("ok")]]):format(PTOLUA))
    local out, err = sh("PTOLUA '-e ' -- %s a b c", q(s))
    assert.are.equal("ok\n", out, err)
    local dir = tmpname()
    assert(os.execute(("rm -f %s && mkdir %s"):format(q(dir), q(dir))))
    F.writefile(dir .. "/lib.lua", "assert(arg) print('lib saw arg')")
    F.writefile(dir .. "/main.lua", "assert(arg) print('main')")
    out, err = sh("cd %s && LUA_PATH='?.lua;;' PTOLUA -llib - < main.lua", q(dir))
    assert(os.execute("rm -r " .. q(dir)))
    assert.are.equal("lib saw arg\nmain\n", out, err)
  end)

  it("runs with arg[1] changed by -e, and fails when arg is no table", function()
    assert.are.equal("100\n", sh("echo 'print(...)' | PTOLUA -e 'arg[1] = 100' - x"))
    local _, err, code = sh("echo '' | PTOLUA -e 'arg = 1' -")
    assert.matches("'arg' is not a table", err, 1, true)
    assert.are_not.equal(0, code)
  end)

  it("reports an error in print at the prompt, and debug.debug reads stdin", function()
    local _, err = sh("echo 10 | PTOLUA -e 'print=nil' -i")
    assert.matches("error calling 'print'", err, 1, true)
    _, err = sh("printf 'io.stderr:write(1000)\\ncont\\n' | PTOLUA -e \"require'debug'.debug()\"")
    assert.are.equal("lua_debug> 1000lua_debug> ", err)
  end)

  it("shows warnings only when on, with lua5.4's control messages", function()
    assert.are.equal("1", select(2, sh("echo 'io.stderr:write(1); warn[[XXX]]' | PTOLUA")))
    local s = script([[
warn("@allow")
warn("@off", "XXX", "@off")
warn("@off")
warn("@on", "YYY", "@on")
warn("@off")
warn("@on")
warn("", "@on")
warn("@on")
warn("Z", "Z", "Z")
]])
    assert.are.equal("Lua warning: @offXXX@off\nLua warning: @on\nLua warning: ZZZ\n", select(2, sh("PTOLUA -W %s", q(s))))
    local _, err = sh("PTOLUA -W %s", q(script([[
u1 = setmetatable({}, {__gc = function () error("XYZ") end})
u2 = setmetatable({}, {__gc = function () error("ZYX") end})]])))
    assert.matches("ZYX%).*XYZ%)", err)
  end)

  it("finalizes in order at exit, even when a finalizer calls os.exit", function()
    local out = sh("PTOLUA -W %s", q(script([[
print("creating 1")
setmetatable({}, {__gc = function () print(1) end})
print("creating 2")
setmetatable({}, {__gc = function ()
  print("2")
  print("creating 3")
  setmetatable({}, {__gc = function () print(3) end})
  print(collectgarbage())
  os.exit(0, true)
end})]])))
    assert.are.equal("creating 1\ncreating 2\n2\ncreating 3\nnil\n1\n", out)
  end)

  it("passes many arguments and runs attached -e chunks", function()
    assert.are.equal("a\n", sh("PTOLUA %s%s", q(script("print(({...})[30])")), (" a"):rep(30)))
    assert.are.equal("1\n3\n", sh("PTOLUA '-eprint(1)' -ea=3 -e 'print(a)'"))
  end)

  it("reads chunks at a plain prompt: _PROMPT, _PROMPT2, '=' and long chunks", function()
    local out = sh("PTOLUA -e \"_PROMPT='' _PROMPT2=''\" -i < %s",
                   q(script("(6*2-6) -- ===\na =\n10\nprint(a)\na")))
    has_lines("6\n10\n10\n\n", out)
    out = sh("PTOLUA -e \"_PROMPT='' _PROMPT2=''\" -i < %s", q(script("a = [[b\nc\nd\ne]]\n=a")))
    has_lines("b\nc\nd\ne\n\n", out)
    out = sh("PTOLUA -e \"_PROMPT='alo'\" -i < %s", q(script(" --\na = 2\n")))
    assert.matches("alo.*alo.*alo", out)
    out = sh("PTOLUA -i < %s", q(script(" --\na = 2\n")))
    assert.matches("> .*> .*> ", out)
    out = sh("PTOLUA -e %s -i < %s",
             q("local C = 0; _PROMPT=setmetatable({},{__tostring = function () C = C + 1; return C end})"),
             q(script(" --\na = 2\n")))
    assert.matches("1 --\n2a = 2\n3\n", out, 1, true)
    local long = ([=[ --
function f ( x )
  local a = [[
xuxu
]]
  local b = "\
xuxu\n"
  if x == 11 then return 1 + 12 , 2 + 20 end  --[[ test multiple returns ]]
  return x + 1
  --\\
end
return( f( 100 ) )
assert( a == b )
do return f( 11 ) end  ]=]):gsub(" ", "\n\n")
    out = sh("PTOLUA -e \"_PROMPT='' _PROMPT2=''\" -i < %s", q(script(long)))
    has_lines("101\n13\t22\n\n", out)
  end)

  it("reports error objects by __tostring, or by type", function()
    local _, err, code = sh("PTOLUA %s", q(script([[
debug = require "debug"
m = {x=0}
setmetatable(m, {__tostring = function(x)
  return tostring(debug.getinfo(4).currentline + x.x)
end})
error(m)
]])))
    assert.matches(": 6\n", err, 1, true)
    assert.are_not.equal(0, code)
    _, err = sh("PTOLUA %s", q(script("error{}")))
    assert.matches("error object is a table value", err, 1, true)
  end)

  it("skips a first line starting with #, counting it", function()
    local _, _, code = sh("PTOLUA %s", q(script("#comment in 1st line without \\n at the end")))
    assert.are.equal(0, code)
    assert.are.equal("3\n", sh("PTOLUA %s", q(script("#first\ndebug = require'debug'\nprint(debug.getinfo(1).currentline)\n"))))
  end)

  it("flushes an open file at exit, and prints -v before -e", function()
    local f = tmpname()
    sh("PTOLUA %s", q(script(("io.output(%q); io.write('alo')"):format(f))))
    assert.are.equal("alo", readfile(f))
    assert.matches("PUC%-Rio\nhello", (sh("PTOLUA -v -e \"print'hello'\"")))
  end)

  it("exits as os.exit says, closing the state and pending to-be-closed variables", function()
    for v, want in pairs{["nil"] = 0, ["0"] = 0, ["true"] = 0, ["1"] = 1, ["false"] = 1} do
      local _, err, code = sh("PTOLUA %s", q(script(("os.exit(%s, true)"):format(v))))
      assert.are.equal(want, code, v)
      assert.are.equal("", err, v)
    end
    local out = sh("PTOLUA %s", q(script([[
local x <close> = setmetatable({}, {__close = function (self, err) assert(err == nil) print("Ok") end})
local e1 <close> = setmetatable({}, {__close = function () print(120) end})
os.exit(true, true)]])))
    assert.are.equal("120\nOk\n", out)
  end)

  it("rejects the options lua5.4 rejects (-h is ptolua's help)", function()
    for opt, msg in pairs{["---"] = "unrecognized option '---'", ["-Ex"] = "unrecognized option '-Ex'",
                          ["-vv"] = "unrecognized option '-vv'", ["-iv"] = "unrecognized option '-iv'",
                          ["-e"] = "'-e' needs argument", ["-e a"] = "syntax error", ["-l"] = "'-l' needs argument"} do
      local _, err, code = sh("PTOLUA %s", opt)
      assert.matches(msg, err, 1, true)
      assert.are_not.equal(0, code, opt)
    end
  end)

  it("lets pcall catch a Ctrl-C, and leaves an unbreakable C call after a few", function()
    -- The program prints its own pid first (a shell's `& echo $!` races
    -- with the program's output); `timeout` turns a lost signal into a
    -- failure instead of a hang.
    local function start(code)
      local p = assert(io.popen(("timeout 60 %s -e %s"):format(q(PTOLUA),
        q("print(io.open('/proc/self/stat'):read('n')) " .. code))))
      return p, p:read("l")
    end
    local p, pid = start("pcall(function () print(12); while true do local t = {} end end); print(42)")
    assert.are.equal("12", p:read("l"))
    os.execute("kill -INT " .. pid)
    assert.are.equal("42", p:read("l"))
    assert.is_true(p:close())
    -- lua5.4's test uses a long string.find; see UNBREAKABLE
    p, pid = start("print(15) " .. UNBREAKABLE)
    assert.are.equal("15", p:read("l"))
    local n = 0
    for i = 1, 100 do
      if not os.execute("sleep 0.2; kill -INT " .. pid .. " 2>/dev/null") then break end
      n = i
    end
    p:close()
    assert.is_true(n >= 2 and n < 100, "signals sent: " .. n)
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
  it("stops a script in an endless loop with 'interrupted!' and exit 130, as a shell reports SIGINT", function()
    local err = tmpname()
    -- The loop allocates: ThreadSanitizer delivers signals only when the
    -- program enters one of its interceptors, and a bare `while true do end`
    -- never does. The interruption path (hook + lpto_interrupt) is the same.
    local s = script("while true do local t = {} end")
    local code = interrupt(("%s %s 2>%s"):format(q(PTOLUA), q(s), q(err)))
    assert.are.equal(130, code)
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

  -- Run cmd in the background and send it SIGINT once per delay (seconds
  -- since the previous one); returns whether it was still alive just
  -- before each signal (a list of booleans) and its exit status as the
  -- shell's `wait` reports it. A watchdog turns a hang into a failure.
  local function signals(cmd, delays)
    local steps = {}
    for _, d in ipairs(delays) do
      steps[#steps + 1] = ("sleep %s; if kill -0 $pid 2>/dev/null; then echo alive; else echo gone; fi; "
        .. "kill -INT $pid 2>/dev/null;"):format(d)
    end
    local p = assert(io.popen(("sh -c %s"):format(q(cmd .. " & pid=$!; " .. table.concat(steps) ..
      " (sleep 30; kill -9 $pid) >/dev/null 2>&1 & dog=$!; wait $pid; rc=$?; kill $dog 2>/dev/null; echo $rc"))))
    local out = p:read("a")
    p:close()
    local alive = {}
    for w in out:gmatch("(%a+)\n") do alive[#alive + 1] = w == "alive" end
    return alive, tonumber(out:match("(%d+)%s*$"))
  end

  -- A process-mode run whose only chip child is stopped: its task never ends.
  local STUCK = [[
local w = pto.Worker{mode = "process", chips = 1}
local sl = w:register(pto.chip_kernel("sleep_us"))
w:init()
os.execute("kill -STOP " .. w:child_pids().chips[1])
w:run(function(orch) orch:submit_next_level(sl, pto.args{scalars = {1000}}) end)
]]

  it("lets running tasks finish at the first Ctrl-C of a run, and says so", function()
    local err, done = tmpname(), tmpname()
    os.remove(done)
    local s = script(([[
local w = pto.Worker{mode = "process", num_sub_workers = 1}
local slow = w:register(function()
  os.execute("sleep 1.5")
  local f = io.open(%q, "a") f:write("finished\n") f:close()
end)
w:init()
-- Both go to the one sub child, the second into its mailbox's ring behind
-- the first: handed over, not begun, so the interrupt takes it back.
w:run(function(orch) orch:submit_sub(slow) orch:submit_sub(slow) end)
]]):format(done))
    local alive, code = signals(("%s %s 2>%s"):format(q(PTOLUA), q(s), q(err)), {0.8})
    assert.are.same({true}, alive)
    assert.are.equal(130, code)   -- a script an interrupt stopped
    local text = readfile(err)
    assert.matches("ptolua: interrupted: no new task starts; running tasks finish", text, 1, true)
    assert.matches("interrupted", text:gsub("ptolua: interrupted:[^\n]*", ""), 1, true)
    assert.are.equal("finished\n", F.readfile(done))   -- the running task was not killed; the queued one never began
  end)

  it("kills the busy children at the second Ctrl-C, failing the run, and says so", function()
    local err = tmpname()
    local alive, code = signals(("%s %s 2>%s"):format(q(PTOLUA), q(script(STUCK)), q(err)), {1, 1})
    assert.are.same({true, true}, alive)   -- one Ctrl-C does not end a run whose task hangs
    assert.are.equal(130, code)   -- a script an interrupt stopped
    local text = readfile(err)
    assert.matches("ptolua: interrupted: no new task starts", text, 1, true)
    assert.matches("ptolua: interrupted again: child processes busy with a task are killed", text, 1, true)
    assert.matches("Worker:run: interrupted", text, 1, true)
  end)

  it("returns to the prompt after a second Ctrl-C, where the next run works", function()
    local out, err = tmpname(), tmpname()
    local feed = ("(cat %s; sleep 4; echo 'print(\"back\")'; "
      .. "echo 'w:run(function(o) o:submit_next_level(sl, pto.args{scalars = {10}}) end) print(\"next run ok\")')")
      :format(q(script(STUCK:gsub("local ", ""))))
    local alive, code = signals(("%s | %s -i >%s 2>%s"):format(feed, q(PTOLUA), q(out), q(err)), {1.5, 1})
    assert.are.same({true, true}, alive)
    assert.are.equal(0, code, readfile(err))
    assert.matches("Worker:run: interrupted", readfile(err), 1, true)
    assert.matches("back\n.*next run ok\n", readfile(out))
  end)

  it("counts in w:children() only the tasks that ran before the interrupt", function()
    local out, err = tmpname(), tmpname()
    local setup = script("w = pto.Worker{chips = 2}\nsl = w:register(pto.chip_kernel('sleep_us'))\nw:init()\n"
      .. "print(pcall(w.run, w, function(orch) for _ = 1, 40 do orch:submit_next_level(sl, pto.args{scalars = {100000}}) end end))\n")
    local feed = ("(cat %s; sleep 3; echo 'n = 0 for _, c in ipairs(w:children()) do n = n + c.tasks_run end "
      .. "print(\"ran\", n, \"completed\", w:stats().tasks_completed)')"):format(q(setup))
    local alive, code = signals(("%s | %s -i >%s 2>%s"):format(feed, q(PTOLUA), q(out), q(err)), {1.0})
    assert.are.same({true}, alive)
    assert.are.equal(0, code, readfile(err))
    local ran, completed = readfile(out):match("ran\t(%d+)\tcompleted\t(%d+)")
    assert.truthy(ran, readfile(out) .. readfile(err))
    assert.are.equal(completed, ran)   -- the tasks the interrupt kept from running are not counted as run
    assert.is_true(tonumber(ran) < 40, ran)
  end)

  it("leaves ptolua only at the third Ctrl-C (status 130), saying so", function()
    local err = tmpname()
    local s = script(UNBREAKABLE)
    local alive, code = signals(("%s %s >/dev/null 2>%s"):format(q(PTOLUA), q(s), q(err)), {0.5, 0.5, 0.5})
    assert.are.same({true, true, true}, alive)
    assert.are.equal(130, code)
    local text = readfile(err)
    assert.matches("ptolua: interrupted: no new task starts", text, 1, true)
    assert.matches("tasks in threads cannot be stopped", text, 1, true)
    assert.matches("ptolua: interrupted a third time: leaving", text, 1, true)
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

-- ptolua's Lua state keeps its small objects on per-size free lists
-- (src/binding/lpto_alloc.c); PTO_LUA_ALLOC=malloc turns that off. Blocks
-- grow and shrink across the pool's largest size and move between the
-- pool and malloc; the results must be those of plain malloc.
local CHURN = [[
local parts, acc = {}, {}
for n = 1, 1200 do
  parts[#parts + 1] = string.rep(string.char(65 + n % 26), n % 700)   -- strings of every size around 512 bytes
  local t = {}
  for i = 1, n % 90 do t[i] = i end                                   -- arrays grown past the pool's sizes
  for i = 1, n % 90 do t[i] = nil end                                 -- and emptied
  t.x = n
  acc[n % 50 + 1] = t
  if n % 100 == 0 then collectgarbage() end
end
local sum = 0
for _, s in ipairs(parts) do sum = sum + #s end
local m = {}
for i = 1, 2000 do m["k" .. i] = {i} end
for i = 1, 2000, 2 do m["k" .. i] = nil end
collectgarbage()
local left = 0
for _, v in pairs(m) do left = left + v[1] end
print(sum, left, table.concat(parts):sub(500, 520))
]]

describe("ptolua's allocator", function()
  it("gives the same results as plain malloc", function()
    local s = script(CHURN)
    local out, err, code = run(q(s))
    assert.are.equal(0, code, err)
    local out2, err2, code2 = run(q(s), {env = "PTO_LUA_ALLOC=malloc "})
    assert.are.equal(0, code2, err2)
    assert.are.equal(out2, out)
  end)

  it("runs a Worker's submits with the pool and without it", function()
    local s = script([[
      local w = pto.Worker{mode = "thread", chips = 2}
      local noop = w:register(pto.chip_kernel("noop"))
      local base = pto.tensor({4096}, "f32")
      local n = 0
      for _ = 1, 3 do
        n = n + w:run(function(o)
          local c = 0
          for i = 0, 255 do
            o:scope(function()
              local p = o:alloc({16}, "f32")
              o:submit_next_level(noop, pto.args{{base:view{offset = i * 16, shape = {16}}, "in"}, {p, "out"}})
              o:submit_next_level(noop, pto.args{{p, "in"}, {base:view(i * 16, 4, 4), "inout"}})
              c = c + 2
            end)
          end
          return c
        end)
      end
      w:close()
      print(n)
    ]])
    for _, env in ipairs({"", "PTO_LUA_ALLOC=malloc "}) do
      local out, err, code = run(q(s), {env = env})
      assert.are.equal(0, code, err)
      assert.are.equal("1536\n", out)
    end
  end)

  plain_only("falls back to malloc when its address space is used up", function()
    -- Under ulimit -v the pool reserves a sixteenth of the limit (61 MiB
    -- here); 1.2 million small tables and strings need more.
    local out, err, code = run("-e " .. q([[
      local t = {}
      for i = 1, 1.2e6 do t[i] = {i, tostring(i)} end
      local s = 0
      for i = 1, #t do s = s + t[i][1] + #t[i][2] end
      print(#t, s)
    ]]), {wrap = "ulimit -v 1000000;"})
    assert.are.equal(0, code, err)
    assert.are.equal("1200000\t720007888896\n", out)
  end)
end)

-- A thread-mode task shares the process: when it takes the process down it
-- names itself on stderr first, and the exit status stays what the crash or
-- exit made it (issue 19, item 8).
describe("ptolua with a thread-mode task that ends the process", function()
  -- Sanitizer runtimes would report the crash themselves, with their own
  -- status: let the signal's default action decide, as in a plain build.
  local NOSAN = "ASAN_OPTIONS=handle_segv=0:handle_abort=0:detect_leaks=0 TSAN_OPTIONS=handle_segv=0:handle_abort=0 "
  local function status_of(code)
    local err = tmpname()
    local p = assert(io.popen(("env %s%s -e %s 2>%s; echo $?"):format(NOSAN, q(PTOLUA), q(code), q(err))))
    local out = p:read("a")
    p:close()
    return tonumber(out:match("(%d+)%s*$")), readfile(err)
  end

  it("names the task, callable and worker of a crashing kernel and keeps the signal's status", function()
    for how, want in pairs{[0] = {139, "SIGSEGV"}, [1] = {134, "SIGABRT"}} do
      local code, err = status_of(([[
        local w = pto.Worker{mode = "thread", chips = 1}
        local ok = w:register(pto.chip_kernel("noop"))
        local c = w:register(pto.chip_kernel("crash"))
        w:run(function(o)
          o:submit_next_level(ok, pto.args{})
          o:submit_next_level(c, pto.args{scalars = {%d}})
        end)]]):format(how))
      assert.are.equal(want[1], code, err)
      assert.matches("pto: task 1 (callable 'crash' on chip 1) crashed with " .. want[2] .. " in thread mode",
                     err, 1, true)
      assert.matches('process mode (mode = "process") contains such a failure', err, 1, true)
    end
  end)

  it("names a sub that calls os.exit and keeps its status", function()
    local code, err = status_of([[
      local w = pto.Worker{mode = "thread", num_sub_workers = 1}
      local quit = w:register(function() os.exit(7) end, "quitter")
      w:run(function(o) o:submit_sub(quit) end)]])
    assert.are.equal(7, code, err)
    assert.matches("pto: task 0 (callable 'quitter' on sub 1) called exit in thread mode", err, 1, true)
  end)

  it("says nothing when the process ends outside a task", function()
    local code, err = status_of([[
      local w = pto.Worker{mode = "thread", num_sub_workers = 1}
      w:run(function(o) o:submit_sub(w:register(function() end)) end)
      os.exit(5)]])
    assert.are.equal(5, code)
    assert.are.equal("", err)
  end)
end)
