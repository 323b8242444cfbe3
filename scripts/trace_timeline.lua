-- trace_timeline.lua: draw a Chrome trace written by ptolua (--trace or
-- w:trace_stop) as a self-contained HTML page with an SVG timeline: one row
-- per track, a box per span, the dependency arrows. For the screenshot in
-- docs/tracing.md (scripts/trace_screenshot.sh); Perfetto is the real viewer.
-- usage: lua5.4 scripts/trace_timeline.lua trace.json out.html [width]
local json = require "dkjson"
local src, out, width = arg[1], arg[2], tonumber(arg[3] or "1400")
assert(src and out, "usage: trace_timeline.lua trace.json out.html [width]")
local f = assert(io.open(src, "rb"))
local doc = assert(json.decode(f:read("a")), "not JSON: " .. src)
f:close()

local tracks, order, spans, flows = {}, {}, {}, {}
local t0, t1 = math.huge, -math.huge
for _, e in ipairs(doc.traceEvents) do
  local key = e.pid .. ":" .. e.tid
  if e.ph == "M" and e.name == "thread_name" then
    tracks[key] = e.args.name
    order[#order + 1] = {key = key, pid = e.pid, tid = e.tid}
  elseif e.ph == "X" then
    spans[#spans + 1] = e
    t0, t1 = math.min(t0, e.ts), math.max(t1, e.ts + e.dur)
  elseif e.ph == "s" or e.ph == "f" then
    flows[e.id] = flows[e.id] or {}
    flows[e.id][e.ph] = e
  end
end
table.sort(order, function(a, b) return a.pid < b.pid or (a.pid == b.pid and a.tid < b.tid) end)
local row = {}
for i, o in ipairs(order) do row[o.key] = i end

local LEFT, ROW, TOP = 130, 40, 40
local plot = width - LEFT - 20
local height = TOP + #order * ROW + 40
local function x(ts) return LEFT + (ts - t0) / (t1 - t0) * plot end
local function esc(s) return (tostring(s):gsub("&", "&amp;"):gsub("<", "&lt;"):gsub(">", "&gt;"):gsub('"', "&quot;")) end
local COLOURS = {task = "#6baed6", submit = "#bdbdbd", stall = "#fb6a4a", run = "#f0f0f0"}
local PALETTE = {"#6baed6", "#74c476", "#fd8d3c", "#9e9ac8", "#e7ba52", "#f768a1"}
local by_name, nnames = {}, 0

local svg = {}
local function add(s) svg[#svg + 1] = s end
add(('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">')
  :format(width, height))
add('<defs><marker id="arrow" markerWidth="8" markerHeight="8" refX="7" refY="4" orient="auto">' ..
  '<path d="M0,0 L8,4 L0,8 z" fill="#333"/></marker></defs>')
for i, o in ipairs(order) do
  local y = TOP + (i - 1) * ROW
  add(('<rect x="0" y="%d" width="%d" height="%d" fill="%s"/>'):format(y, width, ROW, i % 2 == 0 and "#fafafa" or "#ffffff"))
  add(('<text x="8" y="%d">%s</text>'):format(y + ROW / 2 + 4, esc(tracks[o.key])))
end
-- a time axis in milliseconds
local span_ms = (t1 - t0) / 1000
local step = 10 ^ math.floor(math.log(span_ms / 5, 10))
for ms = 0, span_ms, step do
  local px = x(t0 + ms * 1000)
  add(('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>'):format(px, TOP, px, height - 30))
  add(('<text x="%.1f" y="%d" text-anchor="middle" fill="#555">%g ms</text>'):format(px, height - 14, ms))
end
local function box(e)
  local r = row[e.pid .. ":" .. e.tid]
  if not r then return end
  local colour = COLOURS[e.cat] or "#ccc"
  if e.cat == "task" then
    if not by_name[e.name] then nnames = nnames + 1; by_name[e.name] = PALETTE[(nnames - 1) % #PALETTE + 1] end
    colour = e.args.status == "failed" and "#de2d26" or by_name[e.name]
  end
  local inset = e.cat == "run" and 2 or e.cat == "stall" and 12 or 6
  local y = TOP + (r - 1) * ROW + inset
  local w = math.max(x(e.ts + e.dur) - x(e.ts), 0.8)
  add(('<rect x="%.2f" y="%d" width="%.2f" height="%d" fill="%s" stroke="#555" stroke-width="0.3"><title>%s</title></rect>')
    :format(x(e.ts), y, w, ROW - 2 * inset, colour, esc(e.name)))
  if e.cat ~= "run" and w > 7 * #e.name then
    add(('<text x="%.1f" y="%d" font-size="10">%s</text>'):format(x(e.ts) + 2, y + (ROW - 2 * inset) / 2 + 4, esc(e.name)))
  end
end
for _, cat in ipairs{"run", "submit", "stall", "task"} do
  for _, e in ipairs(spans) do if e.cat == cat then box(e) end end
end
-- arrows from the end of the producer's span to the start of the consumer's
local task = {}
for _, e in ipairs(spans) do
  if e.cat == "task" then task[e.pid .. ":" .. e.args.run .. ":" .. e.args.task] = e end
end
for _, fl in pairs(flows) do
  local a = fl.s and fl.s.args
  local p = a and task[fl.s.pid .. ":" .. a.run .. ":" .. a.from]
  local c = a and task[fl.s.pid .. ":" .. a.run .. ":" .. a.to]
  if p and c then
    local y1 = TOP + (row[p.pid .. ":" .. p.tid] - 0.5) * ROW
    local y2 = TOP + (row[c.pid .. ":" .. c.tid] - 0.5) * ROW
    add(('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333" stroke-width="0.7" marker-end="url(#arrow)" opacity="0.55"/>')
      :format(x(p.ts + p.dur), y1, x(c.ts), y2))
  end
end
-- legend: the colour of each callable, then the orchestrator's spans
local lx = LEFT
local legend = {}
for name, colour in pairs(by_name) do legend[#legend + 1] = {name, colour} end
table.sort(legend, function(a, b) return a[1] < b[1] end)
legend[#legend + 1] = {"submit", COLOURS.submit}
legend[#legend + 1] = {"ring stall", COLOURS.stall}
legend[#legend + 1] = {"failed", "#de2d26"}
for _, l in ipairs(legend) do
  add(('<rect x="%d" y="12" width="14" height="14" fill="%s" stroke="#555" stroke-width="0.3"/>'):format(lx, l[2]))
  add(('<text x="%d" y="24">%s</text>'):format(lx + 20, esc(l[1])))
  lx = lx + 40 + 7 * #l[1]
end
add(('<text x="%d" y="24" fill="#555">arrows: producer -> consumer</text>'):format(lx + 10))
add("</svg>")
local o = assert(io.open(out, "wb"))
o:write("<!doctype html><html><head><meta charset=\"utf-8\"><style>body{margin:0;background:#fff}</style></head><body>",
  table.concat(svg, "\n"), "</body></html>\n")
o:close()
