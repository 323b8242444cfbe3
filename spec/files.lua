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

-- A script whose run lasts about 1.5 s (60 sleeps of 50 ms on 2 chips):
-- long enough for ptolua's progress line (cli_spec, repl_spec).
M.SLOW_RUN_SCRIPT = [[
local w <close> = pto.Worker{chips = 2}
local sleep = w:register(pto.chip_kernel("sleep_us"))
w:run(function(orch)
  for _ = 1, 60 do orch:submit_next_level(sleep, pto.args{scalars = {50000}}) end
end)
print("run done")
]]

return M
