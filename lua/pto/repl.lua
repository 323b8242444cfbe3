-- pto.repl: the Lua half of ptolua's interactive prompt (docs/repl.md).
-- ptolua.c owns the terminal (readline, history, signals); this module
-- decides what gets printed, what `:` commands do and what TAB completes,
-- so that all of it can be changed and tested without touching C.
--
-- ptolua.c calls:
--   M.print_results(...)      after a chunk returned values
--   M.command(line)           for a first line starting with ':'; returns
--                             "quit" to leave the prompt
--   M.complete(text, at_start) -> array of candidate words for `text`
--                             (at_start: the word begins the line)
-- Commands are added with M.add_command(name, help, fn); the engine's live
-- in pto/commands.lua.
local M = {}

M.max_depth = 3 -- nested tables deeper than this print as {...}
M.max_items = 30 -- entries shown per table before "..."
M.width = 72 -- a table whose one-line form is longer is printed one entry per line

-- ---- printing ------------------------------------------------------------

local function is_ident(s)
  return type(s) == "string" and s:match("^[%a_][%w_]*$") ~= nil and not ({
    ["and"] = 1, ["break"] = 1, ["do"] = 1, ["else"] = 1, ["elseif"] = 1, ["end"] = 1,
    ["false"] = 1, ["for"] = 1, ["function"] = 1, ["goto"] = 1, ["if"] = 1, ["in"] = 1,
    ["local"] = 1, ["nil"] = 1, ["not"] = 1, ["or"] = 1, ["repeat"] = 1, ["return"] = 1,
    ["then"] = 1, ["true"] = 1, ["until"] = 1, ["while"] = 1,
  })[s]
end

-- Keys sort numbers first (by value), then strings, then booleans, then
-- everything else by its printed form, so that output is stable.
local type_rank = { number = 1, string = 2, boolean = 3 }
local function key_less(a, b)
  local ta, tb = type(a), type(b)
  local ra, rb = type_rank[ta] or 4, type_rank[tb] or 4
  if ra ~= rb then return ra < rb end
  if ta == "number" or ta == "string" then
    if ta == tb then return a < b end
  end
  if ta == "boolean" then return (not a) and b end
  return tostring(a) < tostring(b)
end

-- tostring that never raises (a broken __tostring must not kill the print).
local function safe_tostring(v)
  local ok, s = pcall(tostring, v)
  if ok and type(s) == "string" then return s end
  return "<" .. type(v) .. ": __tostring failed>"
end

local format_value

local function format_key(k)
  if is_ident(k) then return k end
  if type(k) == "string" then return "[" .. string.format("%q", k) .. "]" end
  return "[" .. safe_tostring(k) .. "]"
end

local function format_table(t, depth, path, indent)
  local mt = debug.getmetatable(t)
  if mt and rawget(mt, "__tostring") then return safe_tostring(t) end
  if path[t] then return "<cycle>" end
  if depth >= M.max_depth then return "{...}" end
  path[t] = true
  local items, n = {}, 0
  -- The array part 1..n prints without keys; next, not pairs, so that a
  -- __pairs metamethod cannot run (or fail) while printing.
  local len = 0
  while rawget(t, len + 1) ~= nil do len = len + 1 end
  local more = false
  for i = 1, len do
    if n >= M.max_items then more = true break end
    n = n + 1
    items[n] = format_value(rawget(t, i), depth + 1, path, indent .. "  ")
  end
  local keys = {}
  for k in next, t do
    if not (math.type(k) == "integer" and k >= 1 and k <= len) then keys[#keys + 1] = k end
  end
  table.sort(keys, key_less)
  for _, k in ipairs(keys) do
    if n >= M.max_items then more = true break end
    n = n + 1
    items[n] = format_key(k) .. " = " .. format_value(rawget(t, k), depth + 1, path, indent .. "  ")
  end
  if more then items[#items + 1] = "..." end
  path[t] = nil
  if #items == 0 then return "{}" end
  local flat = "{ " .. table.concat(items, ", ") .. " }"
  if #flat + #indent <= M.width and not flat:find("\n", 1, true) then return flat end
  local inner = indent .. "  "
  return "{\n" .. inner .. table.concat(items, ",\n" .. inner) .. "\n" .. indent .. "}"
end

function format_value(v, depth, path, indent)
  local tv = type(v)
  if tv == "string" then return string.format("%q", v):gsub("\\\n", "\\n") end
  if tv == "table" then return format_table(v, depth, path, indent) end
  -- userdata (pto tensors, Workers, ...) and the rest: their __tostring
  return safe_tostring(v)
end

-- The printed form of one value. A string at top level prints raw, as in
-- lua5.4; inside tables strings are quoted so that keys and values are
-- unambiguous.
function M.format(v)
  if type(v) == "string" then return v end
  return format_value(v, 0, {}, "")
end

function M.print_results(...)
  local n = select("#", ...)
  local out = {}
  for i = 1, n do out[i] = M.format((select(i, ...))) end
  io.stdout:write(table.concat(out, "\t"), "\n")
  io.stdout:flush()
end

-- ---- commands --------------------------------------------------------------

M.commands = {} -- name -> { help = text, fn = function(argstring), usage = "[n]" or nil }
local order = {}

-- usage (optional) names the arguments for :help, e.g. "[n]" or "FILE".
function M.add_command(name, help, fn, usage)
  if not M.commands[name] then order[#order + 1] = name end
  M.commands[name] = { help = help, fn = fn, usage = usage }
end

M.add_command("help", "list the commands", function()
  local w, heads = 0, {}
  for _, name in ipairs(order) do
    local u = M.commands[name].usage
    heads[name] = ":" .. name .. (u and " " .. u or "")
    w = math.max(w, #heads[name])
  end
  for _, name in ipairs(order) do
    io.stdout:write(string.format("%-" .. w .. "s  %s\n", heads[name], M.commands[name].help))
  end
  io.stdout:write("Other lines are Lua: expressions print their values, Ctrl-C interrupts, Ctrl-D exits.\n")
end)

M.add_command("quit", "leave the prompt (as Ctrl-D; open Workers are closed)", function()
  return "quit"
end)

-- Run ":name args"; unknown commands say so and point at :help.
function M.command(line)
  local name, rest = line:match("^:%s*(%S*)%s*(.-)%s*$")
  local cmd = M.commands[name or ""]
  if not cmd then
    io.stderr:write(string.format("unknown command ':%s' (:help lists them)\n", name or ""))
    return nil
  end
  local r = cmd.fn(rest)
  io.stdout:flush()
  return r
end

-- ---- completion ------------------------------------------------------------

-- The table whose string keys are the methods of v: the metatable's
-- `methods` table (pto Workers, tensors, orchestrators) or its __index when
-- that is a table (pto TaskArgs, plain classes); for tables, v itself too.
local function method_tables(v)
  local out = {}
  if type(v) == "table" then out[#out + 1] = v end
  local mt = debug.getmetatable(v)
  if type(mt) == "table" then
    if type(rawget(mt, "methods")) == "table" then out[#out + 1] = rawget(mt, "methods") end
    if type(rawget(mt, "__index")) == "table" then out[#out + 1] = rawget(mt, "__index") end
  end
  if type(v) == "string" then out[#out + 1] = string end
  return out
end

-- Follow a dotted path like "a.b.c" from the globals with raw reads only
-- (completion must not run user __index code); nil when it breaks off.
local function resolve(path)
  local v = _G
  for part in path:gmatch("[^.]+") do
    if type(v) ~= "table" then
      -- fields of userdata are reached through their method tables
      local found
      for _, t in ipairs(method_tables(v)) do
        if rawget(t, part) ~= nil then found = rawget(t, part) break end
      end
      v = found
    else
      v = rawget(v, part)
    end
    if v == nil then return nil end
  end
  return v
end

local function add_keys(set, t, prefix, want_fn)
  for k, val in next, t do
    if type(k) == "string" and k:sub(1, #prefix) == prefix and is_ident(k)
        and (not want_fn or type(val) == "function") then
      set[k] = true
    end
  end
end

-- Candidates for the word `text` (what readline found before the cursor,
-- with `.` and `:` kept inside words). Each candidate is a full word that
-- replaces `text`.
function M.complete(text, at_start)
  local set, base = {}, ""
  if at_start and text:sub(1, 1) == ":" then
    for name in pairs(M.commands) do
      if (":" .. name):sub(1, #text) == text then set[":" .. name] = true end
    end
  else
    local head, sep, last = text:match("^(.*)([.:])([%w_]*)$")
    if head then
      local obj = resolve(head)
      if obj == nil then return {} end
      base = head .. sep
      if sep == "." and type(obj) == "table" then
        add_keys(set, obj, last)
      else
        for _, t in ipairs(method_tables(obj)) do add_keys(set, t, last, sep == ":") end
      end
    else
      add_keys(set, _G, text)
      for _, kw in ipairs { "and", "break", "do", "else", "elseif", "end", "false", "for",
          "function", "goto", "if", "in", "local", "nil", "not", "or", "repeat", "return",
          "then", "true", "until", "while" } do
        if kw:sub(1, #text) == text then set[kw] = true end
      end
    end
  end
  local out = {}
  for k in pairs(set) do out[#out + 1] = base .. k end
  table.sort(out)
  return out
end

require("pto.commands")(M) -- the engine's commands: :hold, :step, :dag, ...

return M
