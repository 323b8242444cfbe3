-- repl_spec.lua: ptolua's interactive prompt, driven through a real
-- pseudo-terminal by spec/fixtures/ptydrive.c (the prompt is only the full
-- prompt when stdin is a terminal). Each session is a list of steps:
-- {"send", text}, {"expect", text} (polls the output with a deadline, no
-- fixed sleeps), {"sleep", ms}, {"wait"}; the driver prints the transcript
-- (escape sequences and "\r" removed) and "EXIT n" once ptolua exits.
local PTOLUA = assert(os.getenv("PTOLUA"), "set PTOLUA to the ptolua binary")
local PTYDRIVE = assert(os.getenv("PTYDRIVE"), "set PTYDRIVE to the ptydrive fixture")

local F = require "files"
local tmpname, writefile, readfile, q = F.tmpname, F.writefile, F.readfile, F.q

-- The driver's escapes: a step's text is one script line.
local function esc(s)
  return (s:gsub("\\", "\\\\"):gsub("\n", "\\n"):gsub("\t", "\\t"):gsub("\r", "\\r")
    :gsub("[%c]", function(c) return ("\\x%02x"):format(c:byte()) end))
end

local tmpdir = assert(io.popen("mktemp -d")):read("l")

-- Run one session; opts.args are ptolua's arguments (shell words),
-- opts.env a prefix like "VAR=x ". Returns the transcript, the driver's
-- complaints and its exit status. PTOLUA_HISTORY defaults to a throwaway
-- file so that no spec touches the user's ~/.ptolua_history.
local function session(steps, opts)
  opts = opts or {}
  local lines = {}
  for _, s in ipairs(steps) do
    lines[#lines + 1] = s[1] .. (s[2] and " " .. esc(tostring(s[2])) or "")
  end
  local script = writefile(tmpname(), table.concat(lines, "\n") .. "\n")
  local err = tmpname()
  local env = opts.env or ("PTOLUA_HISTORY=" .. q(tmpname()) .. " ")
  local cmd = ("env -u LUA_INIT -u LUA_INIT_5_4 -u PTOLUA_HISTORY TERM=xterm HOME=%s %s%s %s %s %s 2>%s")
    :format(q(tmpdir), env, q(PTYDRIVE), q(script), q(PTOLUA), opts.args or "", q(err))
  local p = assert(io.popen(cmd, "r"))
  local out = p:read("a")
  local _, _, code = p:close()
  return out, readfile(err) or "", code
end

-- A session that must run to its end and leave ptolua with status 0.
local function ok_session(steps, opts)
  local out, err, code = session(steps, opts)
  assert(code == 0 and out:find("EXIT 0\n", 1, true),
    "session failed (" .. tostring(code) .. "): " .. err .. "\n--- transcript:\n" .. out)
  return out
end

local function send(s) return {"send", s} end
local function expect(s) return {"expect", s} end
local PROMPT = expect("> ")
local EOF = {"send", "\4"} -- Ctrl-D
local WAIT = {"wait"}

teardown(function()
  F.cleanup()
  os.execute("rm -rf " .. q(tmpdir))
end)

describe("the ptolua prompt", function()
  it("prints every value of an expression, tables pretty-printed", function()
    local out = ok_session {
      PROMPT, send("1+1\n"), expect("\n2\n"),
      send("1, 'x', nil\n"), expect("\n1\tx\tnil\n"),
      send("{a=1, b={c=2}, 'v'}\n"), expect('\n{ "v", a = 1, b = { c = 2 } }\n'),
      send("{{{{{1}}}}}\n"), expect("{ { { {...} } } }\n"),
      send("c = {}; c.self = c\n"), PROMPT, send("c\n"), expect("{ self = <cycle> }\n"),
      send("local t = {} for i = 1, 40 do t[i] = i end return t\n"), expect("  30,\n  ...\n}\n"),
      send("pto.tensor({3}, 'f32')\n"), expect("tensor(f32, {3}) [0.0, 0.0, 0.0]\n"),
      send("pto.args{}\n"), expect("TaskArgs(0 tensors, 0 scalars)\n"),
      PROMPT, EOF, WAIT,
    }
    -- long tables go one entry per line
    assert.is_nil(out:find("31,", 1, true))
  end)

  it("continues an incomplete chunk on a '>> ' prompt", function()
    ok_session {
      PROMPT, send("for i = 1, 3 do\n"), expect(">> "),
      send("io.write(i)\n"), expect(">> "),
      send("end\n"), expect("123"),
      PROMPT, EOF, WAIT,
    }
  end)

  it("writes its history file and reads it back in the next session", function()
    local hist = tmpname()
    os.remove(hist) -- a missing file is an empty history, then created
    local env = "PTOLUA_HISTORY=" .. q(hist) .. " "
    ok_session({ PROMPT, send("hist_value = 40 + 2\n"), PROMPT, EOF, WAIT }, { env = env })
    assert.matches("hist_value = 40 + 2\n", readfile(hist), 1, true)
    ok_session({
      PROMPT, send("\27[A"), expect("hist_value = 40 + 2"), -- up arrow
      send("\n"), PROMPT, send("hist_value\n"), expect("\n42\n"),
      PROMPT, EOF, WAIT,
    }, { env = env })
  end)

  it("keeps its history in $HOME/.ptolua_history without PTOLUA_HISTORY", function()
    ok_session({ PROMPT, send("home_hist = 1\n"), PROMPT, EOF, WAIT }, { env = "" })
    assert.matches("home_hist = 1\n", readfile(tmpdir .. "/.ptolua_history"), 1, true)
  end)

  it("completes globals, fields, methods and commands with TAB", function()
    ok_session {
      PROMPT, send("string.upp\t('abc')\n"), expect("\nABC\n"),
      PROMPT, send("collectgar\t('count') > 0\n"), expect("\ntrue\n"),
      send("w = pto.Worker{}\n"), PROMPT,
      send("h = w:reg\t(function() end)\n"), PROMPT,
      send("print('handle', h ~= nil)\n"), expect("handle\ttrue\n"), PROMPT,
      send("a = pto.args{}\n"), PROMPT,
      send("a:tensor_c\t()\n"), expect("\n0\n"),
      send(":he\t\n"), expect(":quit"),
      PROMPT, EOF, WAIT,
    }
  end)

  it("interrupts a running chunk with Ctrl-C and returns to the prompt", function()
    ok_session {
      PROMPT, send("print('looping') while true do local t = {} end\n"),
      expect("\nlooping\n"), send("\3"), expect("interrupted!"),
      PROMPT, send("2+3\n"), expect("\n5\n"),
      PROMPT, EOF, WAIT,
    }
  end)

  -- ThreadSanitizer holds a signal back until the program enters one of its
  -- interceptors, and readline waiting for a key never returns to one, so
  -- under TSan this Ctrl-C would only land at the next key press.
  local typing = os.getenv("PTO_SANITIZE") == "thread" and pending or it
  typing("clears a half-typed line and drops an unfinished chunk on Ctrl-C", function()
    ok_session {
      -- Ctrl-C on a line being typed clears it
      PROMPT, send("abc"), expect("abc"), send("\3"), PROMPT, send("7*6\n"), expect("\n42\n"),
      -- and at a continuation prompt drops the unfinished chunk
      PROMPT, send("if true then\n"), expect(">> "), send("\3"), PROMPT,
      send("'fresh'\n"), expect("\nfresh\n"),
      PROMPT, EOF, WAIT,
    }
  end)

  it("exits 0 on Ctrl-D and closes the Lua state (and so open Workers)", function()
    local out = ok_session {
      PROMPT, send("w = pto.Worker{num_sub_workers = 1}; w:init()\n"), PROMPT,
      send("g = setmetatable({}, {__gc = function() print('state closed') end})\n"),
      PROMPT, EOF, WAIT,
    }
    assert.matches("state closed\n", out, 1, true)
  end)

  it("runs the script of -i first, with its globals at the prompt", function()
    local s = writefile(tmpname(), "answer = 42\n")
    ok_session({ PROMPT, send("answer\n"), expect("\n42\n"), PROMPT, EOF, WAIT }, { args = "-i " .. q(s) })
  end)

  it("lists its commands with :help and leaves with :quit", function()
    local out = ok_session {
      PROMPT, send(":help\n"), expect(":quit"), PROMPT,
      send(":nope\n"), expect("unknown command ':nope'"), PROMPT,
      send(":quit\n"), WAIT,
    }
    assert.matches(":help%s+list the commands", out)
  end)
end)
