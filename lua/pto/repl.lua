-- pto.repl: the Lua half of ptolua's interactive prompt (docs/repl.md).
-- ptolua.c owns the terminal (readline, history, signals); this module
-- decides what gets printed, what `:` commands do and what TAB completes,
-- so that all of it can be changed and tested without touching C.
--
-- ptolua.c calls:
--   M.print_results(...)      after a chunk returned values
--   M.command(line)           for a first line starting with ':'; returns
--                             "quit" to leave the prompt
--   M.complete(text, at_start, line, before) -> array of candidate words
--                             for `text` (at_start: the word begins the
--                             line; line: the whole line; before: the line
--                             up to the word), or {files = true}:
--                             complete a file name (readline does that)
--   M.after_line()            after each line ran (a chunk or a command):
--                             news the user must see before the next
--                             prompt (pto/commands.lua: a caught failure)
--   M.takes_file(line)        true when the word being completed is a file
--                             name (:dot FILE, :trace FILE): the word then
--                             breaks only at blanks, so that "/tmp/x" is whole
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

-- ---- tensors ---------------------------------------------------------------

M.tensor_edge = 3 -- a dimension longer than 2 * edge + 1 shows its first and last `edge` entries

local TENSOR = "pto.Tensor"

local function is_tensor(v)
  local mt = type(v) == "userdata" and debug.getmetatable(v)
  return mt and rawget(mt, "__name") == TENSOR
end

-- One element as text: f32 with the digits an f32 holds, floats always with
-- a decimal point (so 2.0 is not mistaken for an integer tensor).
local function elem_text(x, dtype)
  if math.type(x) == "float" then
    local s = dtype == "f32" and ("%.7g"):format(x) or tostring(x)
    if s:match("^%-?%d+$") then s = s .. ".0" end
    return s
  end
  return tostring(x)
end

-- The indices of a dimension of n entries to show, with false where the
-- middle is left out (all of them when full).
local function shown(n, full)
  local e = M.tensor_edge
  local idx = {}
  if full or n <= 2 * e + 1 then
    for i = 1, n do idx[#idx + 1] = i end
  else
    for i = 1, e do idx[#idx + 1] = i end
    idx[#idx + 1] = false
    for i = n - e + 1, n do idx[#idx + 1] = i end
  end
  return idx
end

-- A tensor with its shape: one line for 1-D, rows and columns for 2-D,
-- the rows of the last dimension with their leading indices beyond that;
-- long dimensions are elided in the middle unless full.
function M.format_tensor(t, full)
  local ok, head = pcall(tostring, t)
  if not ok then return "<tensor: __tostring failed>" end
  local shape = t.shape
  if not t.is_set or not pcall(function() return t[1] end) or #shape == 0 then return head end
  local title = ("tensor(%s, {%s})"):format(t.dtype, table.concat(shape, ", "))
  local dtype, last = t.dtype, shape[#shape]
  local nrows = #t // math.max(last, 1)
  local cols = shown(last, full)
  -- cells[r][c] for the shown rows and columns (r: row index 1..nrows)
  local rows, width = shown(nrows, full), {}
  local cells = {}
  for _, r in ipairs(rows) do
    if r then
      local line = {}
      for ci, c in ipairs(cols) do
        local text = c and elem_text(t[(r - 1) * last + c], dtype) or "..."
        line[ci] = text
        width[ci] = math.max(width[ci] or 0, #text)
      end
      cells[r] = line
    end
  end
  local function row_text(r)
    local parts = {}
    for ci, text in ipairs(cells[r]) do parts[ci] = (" "):rep(width[ci] - #text) .. text end
    return "[" .. table.concat(parts, ", ") .. "]"
  end
  if #shape == 1 then
    local parts = {}
    for ci, text in ipairs(cells[1]) do parts[ci] = text end
    return title .. " [" .. table.concat(parts, ", ") .. "]"
  end
  local out = { title }
  if #shape == 2 then
    for i, r in ipairs(rows) do
      local open = i == 1 and "[" or " "
      local close = i == #rows and "]" or ","
      out[#out + 1] = open .. (r and row_text(r) or "...") .. close
    end
    return table.concat(out, "\n")
  end
  -- more dimensions: each row of the last one, led by its other indices
  for _, r in ipairs(rows) do
    if r then
      local idx, rest = {}, r - 1
      for d = #shape - 1, 1, -1 do
        idx[d] = rest % shape[d] + 1
        rest = rest // shape[d]
      end
      out[#out + 1] = ("[%s, :] %s"):format(table.concat(idx, ", "), row_text(r))
    else
      out[#out + 1] = "..."
    end
  end
  return table.concat(out, "\n")
end

-- The printed form of one value. A string at top level prints raw, as in
-- lua5.4; inside tables strings are quoted so that keys and values are
-- unambiguous. A tensor at top level prints with its shape.
function M.format(v, full)
  if type(v) == "string" then return v end
  if is_tensor(v) then return M.format_tensor(v, full) end
  if full then
    local items, depth = M.max_items, M.max_depth
    M.max_items, M.max_depth = math.huge, math.huge
    local ok, s = pcall(format_value, v, 0, {}, "")
    M.max_items, M.max_depth = items, depth
    if not ok then error(s, 0) end
    return s
  end
  return format_value(v, 0, {}, "")
end

-- The values of a chunk; the first is kept in the global `_` (the last
-- value, as in luaprompt), so that it can be used in the next line.
function M.print_results(...)
  local n = select("#", ...)
  local out = {}
  for i = 1, n do out[i] = M.format((select(i, ...))) end
  if n > 0 then rawset(_G, "_", (select(1, ...))) end
  io.stdout:write(table.concat(out, "\t"), "\n")
  io.stdout:flush()
end

function M.after_line() end

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

M.add_command("print", "everything in a value: every element of a tensor, every entry of a table", function(rest)
  if rest == "" then
    io.stdout:write(":print: expected a Lua expression, like :print t\n")
    return nil
  end
  local f, err = load("return " .. rest, "=:print", "t")
  if not f then
    io.stdout:write(":print: ", err, "\n")
    return nil
  end
  local r = table.pack(pcall(f))
  if not r[1] then
    io.stdout:write(":print: ", tostring(r[2]), "\n")
    return nil
  end
  table.remove(r, 1)
  r.n = r.n - 1
  local out = {}
  for i = 1, r.n do out[i] = M.format(r[i], true) end
  if r.n > 0 then rawset(_G, "_", r[1]) end
  io.stdout:write(table.concat(out, "\t"), "\n")
end, "EXPR")

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

-- Fields that pto objects compute in their __index (C code, so nothing to
-- enumerate), by metatable name; their methods are in the metatable's
-- `methods` table.
local CALLCONFIG = { "block_dim", "aicpu_thread_num", "enable_l2_swimlane", "enable_dump_tensor", "enable_pmu",
  "enable_dep_gen", "output_prefix" }   -- src/binding/lpto_args.c's CFG_FIELDS
M.fields = {
  ["pto.Tensor"] = { "shape", "dtype", "ndims", "numel", "nbytes", "offset", "is_set", "address" },
  ["pto.Worker"] = { "closed", "level", "chips", "num_sub_workers", "workers", "mode", "initialized" },
  ["pto.CallConfig"] = CALLCONFIG,
}

-- The field names a constructor's table takes, by the constructor's path:
-- offered for a key inside `pto.CallConfig{...}` (C checks the fields, so
-- there is nothing to enumerate).
M.constructor_fields = {
  ["pto.CallConfig"] = CALLCONFIG,
}

-- The tables whose string keys are the methods (and fields) of v: the
-- metatable's `methods` table (pto Workers, tensors, orchestrators), the
-- orchestrator's methods written in Lua, its __index when that is a table
-- (pto TaskArgs, plain classes), the known fields of pto objects; for
-- tables, v itself too.
local function method_tables(v)
  local out = {}
  if type(v) == "table" then out[#out + 1] = v end
  local mt = debug.getmetatable(v)
  if type(mt) == "table" then
    -- a methods table may inherit more (the orchestrator's methods written
    -- in Lua hang off its C methods table's own __index): follow table chains
    local function add_chain(t)
      for _ = 1, 8 do
        if type(t) ~= "table" then return end
        out[#out + 1] = t
        local m = debug.getmetatable(t)
        t = type(m) == "table" and rawget(m, "__index") or nil
      end
    end
    add_chain(rawget(mt, "methods"))
    add_chain(rawget(mt, "__index"))
    local name = rawget(mt, "__name")
    local fields = M.fields[name]
    if fields then
      local set = {}
      for _, f in ipairs(fields) do set[f] = true end
      out[#out + 1] = set
    end
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

-- Names starting with "_" are private (pto._callable_name, ...) and only
-- offered when the prefix asks for them.
local function add_keys(set, t, prefix, want_fn)
  local private = prefix:sub(1, 1) == "_"
  for k, val in next, t do
    if type(k) == "string" and k:sub(1, #prefix) == prefix and is_ident(k)
        and (private or k:sub(1, 1) ~= "_")
        and (not want_fn or type(val) == "function") then
      set[k] = true
    end
  end
end

-- What the argument of each command completes to: "file", "callable" or "lua".
M.arg_kinds = { dot = "file", trace = "file", ["break"] = "callable", unbreak = "callable", use = "lua", print = "lua",
  dag = "dag" }

-- Callable names for :break (set by pto.commands: the current Worker's).
function M.callable_names() return {} end

-- :dag's filter words besides the callable names.
M.dag_words = { "all", "pending", "ready", "running", "queued", "completed", "consumed", "failed", "worker=", "callable=" }

local function command_arg(line)
  local name = line and line:match("^%s*:%s*(%a+)%s")
  return name, name and (M.arg_kinds[name] or "none")
end

function M.takes_file(line)
  local _, kind = command_arg(line)
  return kind == "file"
end

-- The fields of the constructor whose table the word is a key of, when
-- `before` (the line up to the word) ends inside `name{` or `name({` with
-- nothing or a finished field before it; else nil.
local function constructor_keys(before)
  local path, inner = (before or ""):match("([%a_][%w_.]*)%s*%(?%s*{([^{}]*)$")
  local fields = path and M.constructor_fields[path]
  if fields and (inner:match("^%s*$") or inner:match("[,;]%s*$")) then return fields end
  return nil
end

-- Candidates for the word `text` (what readline found before the cursor,
-- with `.` and `:` kept inside words; `before`: the line before it). Each
-- candidate is a full word that replaces `text`.
function M.complete(text, at_start, line, before)
  local set, base = {}, ""
  local _, kind = command_arg(line)
  local keys = constructor_keys(before)
  if kind == "file" then return { files = true } end
  if keys and not text:find("[.:]") then
    for _, k in ipairs(keys) do
      if k:sub(1, #text) == text then set[k] = true end
    end
  elseif kind == "callable" or kind == "dag" then
    for _, name in ipairs(M.callable_names()) do
      if name:sub(1, #text) == text then set[name] = true end
    end
    for _, word in ipairs(kind == "dag" and M.dag_words or {}) do
      if word:sub(1, #text) == text then set[word] = true end
    end
  elseif kind == "none" then
    return {}
  elseif at_start and text:sub(1, 1) == ":" then
    for name in pairs(M.commands) do
      if (":" .. name):sub(1, #text) == text then set[":" .. name] = true end
    end
  else
    local head, sep, last = text:match("^(.*)([.:])([%w_]*)$")
    if head then
      -- "f(x):" reaches here as ":" alone: the value is not known without a call
      if head == "" then return {} end
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
