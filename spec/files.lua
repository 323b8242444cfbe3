-- files.lua: temporary files and shell quoting for the specs that run
-- ptolua as a child process (cli_spec, repl_spec).
local M = {}

local made = {}

-- A fresh temporary file name (with suffix), removed by M.cleanup.
function M.tmpname(suffix)
  local name = os.tmpname() .. (suffix or "")
  made[#made + 1] = name
  return name
end

-- Remember another file for M.cleanup.
function M.track(name) made[#made + 1] = name end

function M.cleanup()
  for _, name in ipairs(made) do os.remove(name) end
  made = {}
end

function M.writefile(name, text)
  local f = assert(io.open(name, "wb"))
  f:write(text)
  f:close()
  return name
end

-- The file's text, or nil if it does not exist.
function M.readfile(name)
  local f = io.open(name, "rb")
  if not f then return nil end
  local text = f:read("a")
  f:close()
  return text
end

-- A single-quoted shell word.
function M.q(s) return "'" .. tostring(s):gsub("'", [['\'']]) .. "'" end

return M
