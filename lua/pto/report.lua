-- The run report (docs/tracing.md "Run report"): one self-contained HTML
-- file per script or Worker, written by w:report(path) and ptolua --report.
-- It holds the profile's tables (lua/pto/profile.lua), a zoomable timeline
-- with one lane per worker at every level and the critical path
-- highlighted, the DAG of the run (layered, coloured by callable, failed
-- tasks distinct, a box around each nested scope's tasks; condensed into
-- groups with counts above DAG_MAX tasks) and the flow-control report.
--
-- Nothing is fetched: the data is embedded as JSON and drawn by a small
-- script in the page into SVG. When the script has drawn everything it sets
-- <body data-rendered="ok"> (or data-error="..."), which the browser test
-- (spec/report_html_spec.lua, headless Chromium) reads from the DOM.
return function(pto)
  local M = {}

  -- ---- JSON, enough for the report's data ----
  local function json(v, out)
    local t = type(v)
    if t == "table" then
      if v[1] ~= nil or next(v) == nil then
        out[#out + 1] = "["
        for i, x in ipairs(v) do
          if i > 1 then out[#out + 1] = "," end
          json(x, out)
        end
        out[#out + 1] = "]"
      else
        local keys = {}
        for k in pairs(v) do keys[#keys + 1] = tostring(k) end
        table.sort(keys)
        out[#out + 1] = "{"
        for i, k in ipairs(keys) do
          if i > 1 then out[#out + 1] = "," end
          json(k, out)
          out[#out + 1] = ":"
          json(v[k], out)
        end
        out[#out + 1] = "}"
      end
    elseif t == "string" then
      -- "</" would end the <script> element the data sits in.
      out[#out + 1] = '"' .. v:gsub('[%c"\\]', function(c)
        return ({ ['"'] = '\\"', ["\\"] = "\\\\", ["\n"] = "\\n", ["\t"] = "\\t" })[c]
            or ("\\u%04x"):format(c:byte())
      end):gsub("</", "<\\/") .. '"'
    elseif t == "number" then
      if v ~= v or v == math.huge or v == -math.huge then out[#out + 1] = "0"
      elseif math.type(v) == "integer" then out[#out + 1] = tostring(v)
      else out[#out + 1] = ("%.6g"):format(v) end
    elseif t == "boolean" then
      out[#out + 1] = tostring(v)
    else
      out[#out + 1] = "null"
    end
  end

  local function html_escape(s)
    return (tostring(s):gsub("[&<>\"]", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;" }))
  end

  -- Above DAG_MAX tasks the DAG is condensed: drawn one circle per task it
  -- became a tangle the browser took seconds over, and the page used to
  -- stop at the first DAG_MAX. A group is the tasks of one scope depth,
  -- callable and outcome in one column of dependency layers (a task's layer
  -- is the longest chain of producers before it); at most DAG_COLUMNS
  -- columns, so a long chain shares columns. Only the groups and the edges
  -- between them, with counts, go into the page: it stays small.
  local DAG_MAX, DAG_COLUMNS = 3000, 24

  -- The condensed DAG of nodes ({id, callable, outcome, critical, scope}:
  -- outcome 0 ran, 1 failed, 2 not run) and edges ({producer, consumer},
  -- both ends among nodes), with scopes the profile's scope tree. Returns
  -- groups ({group id, callable, outcome, critical, scope depth, count,
  -- column, first layer, last layer, first id, last id, edges inside}),
  -- edges between groups ({from, to, count}) and the number of layers.
  local function condense(nodes, edges, scopes)
    local depth_of = { [0] = 0 }
    local function depth(s)
      if depth_of[s] then return depth_of[s] end
      local up = scopes[s] or 0   -- a scope past the tree's cap: taken for a child of the run's own
      if up >= s then up = 0 end  -- a parent opens before its children; anything else is no tree
      depth_of[s] = depth(up) + 1
      return depth_of[s]
    end
    local sorted = table.move(nodes, 1, #nodes, 1, {})
    table.sort(sorted, function(a, b) return a[1] < b[1] end)
    local preds = {}
    for _, e in ipairs(edges) do
      local l = preds[e[2]]
      if not l then l = {}; preds[e[2]] = l end
      l[#l + 1] = e[1]
    end
    -- Producers are submitted before their consumers: id order is a topological order.
    local layer, top = {}, 0
    for _, n in ipairs(sorted) do
      local l = 0
      for _, p in ipairs(preds[n[1]] or {}) do
        if layer[p] and layer[p] >= l then l = layer[p] + 1 end
      end
      layer[n[1]] = l
      if l > top then top = l end
    end
    local ncol = math.min(top + 1, DAG_COLUMNS)
    local groups, by_key, group_of = {}, {}, {}
    for _, n in ipairs(sorted) do
      local l = layer[n[1]]
      local col = l * ncol // (top + 1)
      local d = depth(n[5])
      local key = ("%d|%d|%d|%d"):format(d, n[2], n[3], col)
      local g = by_key[key]
      if not g then
        g = { #groups + 1, n[2], n[3], 0, d, 0, col, l, l, n[1], n[1], 0 }
        groups[#groups + 1] = g
        by_key[key] = g
      end
      g[6] = g[6] + 1
      if n[4] == 1 then g[4] = 1 end
      if l < g[8] then g[8] = l end
      if l > g[9] then g[9] = l end
      g[11] = n[1]
      group_of[n[1]] = g
    end
    local gedges, by_pair = {}, {}
    for _, e in ipairs(edges) do
      local a, b = group_of[e[1]], group_of[e[2]]
      if a == b then
        a[12] = a[12] + 1
      else
        local key = a[1] .. ">" .. b[1]
        local ge = by_pair[key]
        if not ge then
          ge = { a[1], b[1], 0 }
          gedges[#gedges + 1] = ge
          by_pair[key] = ge
        end
        ge[3] = ge[3] + 1
      end
    end
    return groups, gedges, top + 1
  end

  -- The data of one Worker's section: its profile at every level, flattened
  -- into lanes on the top level's time axis.
  local function section(title, p, stats_text)
    local crit = {}
    for _, id in ipairs(p.critical_path.tasks) do crit[id] = true end
    local names, name_index = {}, {}
    local function callable(n)
      if not name_index[n] then
        names[#names + 1] = n
        name_index[n] = #names - 1
      end
      return name_index[n]
    end
    local lanes = {}
    local function add_level(q, prefix, offset_ms, is_top)
      local by_lane = {}
      for _, w in ipairs(q.workers) do
        local lane = { name = prefix .. w.name, level = q.level, tasks = {} }
        lanes[#lanes + 1] = lane
        by_lane[w.lane] = lane
      end
      for _, t in ipairs(q.timeline) do
        local lane = by_lane[t.lane]
        if lane then
          lane.tasks[#lane.tasks + 1] = { offset_ms + t.start_ms, offset_ms + t.finish_ms, callable(t.name), t.id,
            (is_top and crit[t.id]) and 1 or 0, t.failed and 1 or 0 }
        end
      end
      for _, c in ipairs(q.levels) do
        add_level(c, prefix .. c.name .. " / ", offset_ms + (c.begin_ns - p.begin_ns) / 1e6, false)
      end
    end
    add_level(p, "", 0, true)
    local nodes, edges = {}, {}
    local seen = {}
    for _, t in ipairs(p.timeline) do
      if not seen[t.id] then
        seen[t.id] = true
        nodes[#nodes + 1] = { t.id, callable(t.name), t.failed and 1 or 0, crit[t.id] and 1 or 0, t.scope or 0 }
      end
    end
    for _, t in ipairs(p.not_run) do
      if not seen[t.id] then
        seen[t.id] = true
        nodes[#nodes + 1] = { t.id, callable(t.name), 2, 0, t.scope or 0 }
      end
    end
    for i = 1, #p.edges, 2 do
      if seen[p.edges[i]] and seen[p.edges[i + 1]] then edges[#edges + 1] = { p.edges[i + 1], p.edges[i] } end
    end
    local sec = { title = title, profile_text = tostring(p), stats = stats_text or "", makespan_ms = p.makespan_ms,
      names = names, lanes = lanes, nodes = nodes, edges = edges, tasks = p.tasks, not_run = #p.not_run,
      verdict = p.verdict,
      callables = p.callables, workers = p.workers, critical = p.critical_path }
    if #nodes > DAG_MAX then
      sec.groups, sec.group_edges, sec.layers = condense(nodes, edges, p.scopes or {})
      sec.dag_tasks, sec.nodes, sec.edges = #nodes, {}, {}
    end
    return sec
  end
  M.section = section

  local page_head = [==[<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:">
<title>%s</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 16px 24px; color: #222; }
h1 { font-size: 20px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ccc; }
h3 { font-size: 15px; margin: 14px 0 6px; }
table { border-collapse: collapse; margin: 4px 0 10px; }
td, th { padding: 2px 10px; border-bottom: 1px solid #eee; text-align: right; font-variant-numeric: tabular-nums; }
td:first-child, th:first-child { text-align: left; }
.verdict { font-weight: 600; padding: 6px 10px; background: #fff6dd; border-left: 4px solid #e0a000; }
.timeline, .dag { border: 1px solid #ccc; overflow: hidden; background: #fcfcfc; }
.timeline svg, .dag svg { display: block; cursor: grab; }
rect.task { stroke: #fff; stroke-width: 0.5; }
rect.task.critical { stroke: #d00000; stroke-width: 2; }
rect.task.failed, circle.node.failed { fill: #d00000 !important; }
circle.node.critical { stroke: #d00000; stroke-width: 2.5; }
circle.node.poisoned { fill: #ffe4e1 !important; stroke: #d00000; stroke-dasharray: 2 2; }
.lane-label { font: 11px monospace; fill: #333; }
text.count { font: 11px monospace; fill: #333; }
.legend span { display: inline-block; margin-right: 12px; }
.legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; vertical-align: middle; }
pre { background: #f6f6f6; padding: 8px; overflow-x: auto; font-size: 12px; }
button { margin-right: 4px; }
</style></head>
<body>
<h1>%s</h1>
<div id="report"></div>
<script id="data" type="application/json">]==]

  -- The page's script: tables, the timeline and the DAG, drawn from #data.
  local page_script = [==[</script>
<script>
"use strict";
window.onerror = function (msg) { document.body.dataset.error = String(msg); };
(function () {
  var started = performance.now();
  var data = JSON.parse(document.getElementById("data").textContent);
  var NS = "http://www.w3.org/2000/svg";
  var root = document.getElementById("report");
  var palette = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#bab0ac",
                 "#ff9da7", "#86bcb6", "#8cd17d", "#499894"];
  function colour(i) { return palette[i % palette.length]; }
  function el(tag, attrs, parent, text) {
    var e = /^(svg|g|rect|line|text|circle|path|title)$/.test(tag) ? document.createElementNS(NS, tag) : document.createElement(tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  function fmt(x) { return x >= 100 ? x.toFixed(0) : x >= 1 ? x.toFixed(2) : x.toFixed(3); }
  function table(parent, cls, head, rows) {
    var t = el("table", {"class": cls}, parent);
    var tr = el("tr", {}, t);
    head.forEach(function (h) { el("th", {}, tr, h); });
    rows.forEach(function (r) {
      var tr = el("tr", {}, t);
      r.forEach(function (v) { el("td", {}, tr, String(v)); });
    });
    return t;
  }
  // Wheel zooms the x axis around the pointer, drag pans, buttons zoom and reset.
  function zoomable(svg, inner, width, apply) {
    var k = 1, x0 = 0, drag = null;
    function set() { apply(k, x0); }
    svg.addEventListener("wheel", function (ev) {
      ev.preventDefault();
      var px = ev.offsetX, f = ev.deltaY < 0 ? 1.25 : 0.8;
      x0 = px - (px - x0) * f; k *= f; set();
    });
    svg.addEventListener("mousedown", function (ev) { drag = ev.clientX - x0; });
    window.addEventListener("mouseup", function () { drag = null; });
    window.addEventListener("mousemove", function (ev) { if (drag !== null) { x0 = ev.clientX - drag; set(); } });
    return {
      zoom: function (f) { x0 = width / 2 - (width / 2 - x0) * f; k *= f; set(); },
      reset: function () { k = 1; x0 = 0; set(); }
    };
  }
  function buttons(parent, z) {
    var d = el("div", {}, parent);
    el("button", {"class": "zoom-in"}, d, "zoom in").onclick = function () { z.zoom(1.5); };
    el("button", {"class": "zoom-out"}, d, "zoom out").onclick = function () { z.zoom(1 / 1.5); };
    el("button", {"class": "zoom-reset"}, d, "reset").onclick = function () { z.reset(); };
  }
  function legend(parent, names) {
    var d = el("div", {"class": "legend"}, parent);
    names.forEach(function (n, i) {
      var s = el("span", {}, d);
      el("i", {style: "background:" + colour(i)}, s);
      s.appendChild(document.createTextNode(n));
    });
    var s = el("span", {}, d); el("i", {style: "background:#d00000"}, s); s.appendChild(document.createTextNode("failed"));
    s = el("span", {}, d); el("i", {style: "background:#ffe4e1;border:1px dashed #d00000;width:8px;height:8px"}, s);
    s.appendChild(document.createTextNode("not run (a producer failed)"));
    s = el("span", {}, d); el("i", {style: "border:2px solid #d00000;width:7px;height:7px"}, s);
    s.appendChild(document.createTextNode("critical path"));
  }
  function timeline(parent, sec) {
    var W = Math.max(600, Math.min(1400, window.innerWidth - 60)), LW = 170, LH = 22;
    var H = sec.lanes.length * LH + 24, span = Math.max(sec.makespan_ms, 1e-6), pw = W - LW - 10;
    var box = el("div", {"class": "timeline"}, parent);
    var svg = el("svg", {width: W, height: H, "class": "timeline-svg"}, box);
    var g = el("g", {transform: "translate(" + LW + ",0)"}, svg);
    var axis = el("g", {"class": "axis"}, svg);
    var rects = [];
    sec.lanes.forEach(function (lane, i) {
      var lg = el("g", {"class": "lane", "data-name": lane.name}, g);
      el("text", {x: 4, y: i * LH + 15, "class": "lane-label"}, svg, lane.name);
      el("line", {x1: 0, x2: pw, y1: (i + 1) * LH, y2: (i + 1) * LH, stroke: "#eee"}, lg);
      lane.tasks.forEach(function (t) {
        var cls = "task" + (t[4] ? " critical" : "") + (t[5] ? " failed" : "");
        var r = el("rect", {"class": cls, y: i * LH + 3, height: LH - 6, fill: colour(t[2]), "data-id": t[3]}, lg);
        el("title", {}, r, sec.names[t[2]] + " — task " + t[3] + ": " + fmt(t[1] - t[0]) + " ms (" + fmt(t[0]) + " – " + fmt(t[1]) + " ms)");
        rects.push([r, t]);
      });
    });
    function apply(k, x0) {
      rects.forEach(function (p) {
        var x = x0 + p[1][0] / span * pw * k, w = Math.max(1, (p[1][1] - p[1][0]) / span * pw * k);
        p[0].setAttribute("x", x); p[0].setAttribute("width", w);
      });
      while (axis.firstChild) axis.removeChild(axis.firstChild);
      for (var j = 0; j <= 10; j++) {
        var px = j * pw / 10, ms = (px - x0) / (pw * k) * span;
        el("text", {x: LW + px, y: H - 6, "class": "lane-label", "text-anchor": "middle"}, axis, fmt(ms) + " ms");
      }
    }
    var z = zoomable(svg, g, pw, apply);
    buttons(parent, z);
    z.reset();
  }
  // Layers by longest path from a source; nodes in a layer in id order. At most report.lua's DAG_MAX
  // nodes: above, the section comes condensed (dagCondensed).
  function dag(parent, sec) {
    var nodes = sec.nodes, depth = {}, byId = {};
    nodes.forEach(function (n) { byId[n[0]] = n; depth[n[0]] = 0; });
    var edges = sec.edges.filter(function (e) { return byId[e[0]] && byId[e[1]]; });
    edges.sort(function (a, b) { return a[1] - b[1]; });
    edges.forEach(function (e) { depth[e[1]] = Math.max(depth[e[1]], depth[e[0]] + 1); });
    var layers = [];
    nodes.forEach(function (n) { var d = depth[n[0]]; (layers[d] = layers[d] || []).push(n); });
    // Each scope (n[4]; 0: the run's own) gets a band of rows as tall as its widest layer, so the box around a
    // nested scope's tasks holds no other scope's; within a band, id order.
    layers.forEach(function (l) { l.sort(function (a, b) { return (a[4] - b[4]) || (a[0] - b[0]); }); });
    var band = {}, order = [];
    layers.forEach(function (l) {
      var c = {};
      l.forEach(function (n) { c[n[4]] = (c[n[4]] || 0) + 1; });
      Object.keys(c).forEach(function (k) {
        if (!band[k]) { band[k] = {h: 0}; order.push(+k); }
        band[k].h = Math.max(band[k].h, c[k]);
      });
    });
    order.sort(function (a, b) { return a - b; });
    var CW = 46, RH = 22, maxRows = 0, pos = {};
    order.forEach(function (k) { band[k].start = maxRows; maxRows += band[k].h; });
    maxRows = Math.max(maxRows, 1);
    layers.forEach(function (l, d) {
      var used = {};
      l.forEach(function (n) {
        var k = n[4], r = band[k].start + (used[k] || 0);
        used[k] = (used[k] || 0) + 1;
        pos[n[0]] = [d * CW + 20, r * RH + 14];
      });
    });
    var W = Math.max(600, Math.min(1400, window.innerWidth - 60)), H = Math.min(700, maxRows * RH + 20);
    var box = el("div", {"class": "dag"}, parent);
    var svg = el("svg", {width: W, height: H, "class": "dag-svg"}, box);
    var g = el("g", {}, svg);
    // Nested scopes (orch:scope, scope_begin): a box around each one's tasks, under the edges and nodes.
    var boxes = {};
    nodes.forEach(function (n) {
      if (!n[4]) return;
      var p = pos[n[0]], b = boxes[n[4]];
      if (!b) boxes[n[4]] = b = [p[0], p[1], p[0], p[1]];
      b[0] = Math.min(b[0], p[0]); b[1] = Math.min(b[1], p[1]); b[2] = Math.max(b[2], p[0]); b[3] = Math.max(b[3], p[1]);
    });
    Object.keys(boxes).forEach(function (k) {
      var b = boxes[k];
      var r = el("rect", {x: b[0] - 11, y: b[1] - 10, width: b[2] - b[0] + 22, height: b[3] - b[1] + 20, rx: 6,
                          fill: "#eef3fb", stroke: "#9db3d9", "stroke-width": 0.8, "class": "scope", "data-scope": k}, g);
      el("title", {}, r, "scope " + k);
    });
    edges.forEach(function (e) {
      var a = pos[e[0]], b = pos[e[1]];
      el("line", {x1: a[0], y1: a[1], x2: b[0], y2: b[1], stroke: "#999", "stroke-width": 0.7, "class": "edge"}, g);
    });
    nodes.forEach(function (n) {
      var p = pos[n[0]];
      var c = el("circle", {cx: p[0], cy: p[1], r: 7, fill: colour(n[1]), "data-id": n[0],
                            "class": "node" + (n[2] === 1 ? " failed" : n[2] === 2 ? " poisoned" : "") + (n[3] ? " critical" : "")}, g);
      el("title", {}, c, "task " + n[0] + " (" + sec.names[n[1]] + ")" + (n[2] === 1 ? " failed" : n[2] === 2 ? " not run: a producer failed" : ""));
    });
    var z = zoomable(svg, g, W, function (k, x0) { g.setAttribute("transform", "translate(" + x0 + ",0) scale(" + k + ")"); });
    buttons(parent, z);
  }
  // A large run's DAG, condensed by report.lua: a circle per group (g: id, callable, outcome, critical, scope
  // depth, count, column, first and last layer, first and last id, edges inside), sized by its count, in its
  // column of dependency layers; a band of rows per scope depth, boxed from depth 1; edges weighted by count.
  function dagCondensed(parent, sec) {
    var groups = sec.groups, cols = [], band = {}, order = [], pos = {}, CW = 90, RH = 40;
    groups.forEach(function (g) { (cols[g[6]] = cols[g[6]] || []).push(g); });
    cols.forEach(function (c) {
      var n = {};
      c.forEach(function (g) { n[g[4]] = (n[g[4]] || 0) + 1; });
      Object.keys(n).forEach(function (k) {
        if (!band[k]) { band[k] = {h: 0}; order.push(+k); }
        band[k].h = Math.max(band[k].h, n[k]);
      });
    });
    order.sort(function (a, b) { return a - b; });
    var rows = 0;
    order.forEach(function (k) { band[k].start = rows; rows += band[k].h; });
    rows = Math.max(rows, 1);
    cols.forEach(function (c, ci) {
      c.sort(function (a, b) { return (a[4] - b[4]) || (a[1] - b[1]) || (a[2] - b[2]); });
      var used = {};
      c.forEach(function (g) {
        var k = g[4], r = band[k].start + (used[k] || 0);
        used[k] = (used[k] || 0) + 1;
        pos[g[0]] = [ci * CW + 40, r * RH + 26];
      });
    });
    var total = groups.reduce(function (a, g) { return a + g[5]; }, 0);
    el("p", {"class": "dag-caption"}, parent, "Condensed: " + total + " tasks in " + groups.length +
       " groups, one per scope depth, callable and outcome in each column of dependency layers (" + sec.layers +
       " layers" + (sec.layers > cols.length ? " in " + cols.length + " columns" : "") + "); hover a group for its tasks.");
    // Scaled at first so that every column shows: the point of condensing is to see the whole run.
    var W = Math.max(600, Math.min(1400, window.innerWidth - 60)), fit = Math.min(1, W / (cols.length * CW + 60));
    var H = Math.min(700, rows * RH * fit + 30);
    var box = el("div", {"class": "dag"}, parent);
    var svg = el("svg", {width: W, height: H, "class": "dag-svg condensed", "data-tasks": total}, box);
    var g = el("g", {}, svg);
    order.forEach(function (k) {
      if (!k) return;
      var r = el("rect", {x: 10, y: band[k].start * RH + 8, width: cols.length * CW + 40, height: band[k].h * RH - 4,
                          rx: 6, fill: "#eef3fb", stroke: "#9db3d9", "stroke-width": 0.8, "class": "scope", "data-depth": k}, g);
      el("title", {}, r, "nested scopes at depth " + k);
    });
    sec.group_edges.forEach(function (e) {
      var a = pos[e[0]], b = pos[e[1]];
      var l = el("line", {x1: a[0], y1: a[1], x2: b[0], y2: b[1], stroke: "#999", "stroke-width": 0.7 + Math.log10(e[2]),
                          "class": "edge", "data-count": e[2]}, g);
      el("title", {}, l, e[2] + (e[2] === 1 ? " edge" : " edges"));
    });
    groups.forEach(function (gr) {
      var p = pos[gr[0]], n = gr[5], r = Math.min(17, 6 + 2.5 * Math.log10(n));
      var c = el("circle", {cx: p[0], cy: p[1], r: r, fill: colour(gr[1]), "data-group": gr[0], "data-count": n,
                            "class": "node" + (gr[2] === 1 ? " failed" : gr[2] === 2 ? " poisoned" : "") + (gr[3] ? " critical" : "")}, g);
      el("title", {}, c, sec.names[gr[1]] + ": " + n + (n === 1 ? " task" : " tasks") +
         (gr[2] === 1 ? " that failed" : gr[2] === 2 ? " not run: a producer failed" : "") +
         (n > 1 ? ", ids " + gr[9] + " … " + gr[10] : ", id " + gr[9]) +
         (gr[7] === gr[8] ? ", layer " + gr[7] : ", layers " + gr[7] + "–" + gr[8]) +
         (gr[4] ? ", scope depth " + gr[4] : "") + (gr[11] ? ", " + gr[11] + " edges among them" : "") +
         (gr[3] ? "; on the critical path" : ""));
      el("text", {x: p[0] + r + 3, y: p[1] + 4, "class": "count"}, g, "×" + n);
    });
    var z = zoomable(svg, g, W, function (k, x0) { g.setAttribute("transform", "translate(" + x0 + ",0) scale(" + k * fit + ")"); });
    buttons(parent, z);
    z.reset();
  }
  if (!data.sections.length) el("p", {"class": "empty"}, root, "No Worker ended a run.");
  data.sections.forEach(function (sec, si) {
    var s = el("section", {"class": "worker", id: "worker-" + (si + 1)}, root);
    el("h2", {}, s, sec.title);
    el("p", {"class": "verdict"}, s, sec.verdict);
    el("p", {"class": "summary"}, s, sec.tasks + (sec.tasks === 1 ? " task" : " tasks") + (sec.not_run ? " (and " + sec.not_run + " not run)" : "") +
       " in " + fmt(sec.makespan_ms) + " ms; critical path " +
       fmt(sec.critical.length_ms) + " ms, " + sec.critical.count + " tasks, " + sec.critical.pct.toFixed(0) + "% of the run");
    el("h3", {}, s, "Callables");
    table(s, "callables", ["callable", "kind", "count", "failed", "total ms", "mean ms", "p50 ms", "p95 ms", "max ms"],
          sec.callables.map(function (c) { return [c.name, c.kind, c.count, c.failed, fmt(c.total_ms), fmt(c.mean_ms),
                                                   fmt(c.p50_ms), fmt(c.p95_ms), fmt(c.max_ms)]; }));
    el("h3", {}, s, "Workers");
    table(s, "workers", ["worker", "tasks", "busy ms", "busy", "idle"],
          sec.workers.map(function (w) { return [w.name, w.tasks, fmt(w.busy_ms), w.busy_pct.toFixed(0) + "%",
                                                 w.idle_pct.toFixed(0) + "%"]; }));
    el("h3", {}, s, "Timeline (wheel or buttons: zoom; drag: pan)");
    legend(s, sec.names);
    timeline(s, sec);
    el("h3", {}, s, "DAG");
    if (sec.groups) dagCondensed(s, sec); else dag(s, sec);
    el("h3", {}, s, "Profile");
    el("pre", {"class": "profile"}, s, sec.profile_text);
    if (sec.stats) { el("h3", {}, s, "Flow control"); el("pre", {"class": "stats"}, s, sec.stats); }
  });
  document.body.dataset.tasks = String(data.sections.reduce(function (a, s) { return a + s.tasks; }, 0));
  document.body.dataset.renderMs = (performance.now() - started).toFixed(0);   /* how long the drawing took */
  document.body.dataset.rendered = "ok";
})();
</script>
</body></html>
]==]

  -- The page for sections (from M.section), as a string.
  function M.html(title, sections)
    local out = {}
    json({ sections = sections }, out)
    local t = html_escape(title)
    return page_head:format(t, t) .. table.concat(out) .. page_script
  end

  local function write(who, path, text)
    local f, err = io.open(path, "w")
    if not f then
      err = err:sub(1, #path + 2) == path .. ": " and err:sub(#path + 3) or err   -- io.open's message repeats the path
      error(("%s: cannot write '%s' (%s); pass a path in a writable directory"):format(who, path, err), 3)
    end
    local ok, werr = f:write(text)
    f:close()
    if not ok then error(("%s: cannot write '%s' (%s)"):format(who, path, werr), 3) end
  end
  M.write = write

  pto._report = M

  -- ptolua --profile / --report: a Worker's last run, kept as it closes.
  function pto._cli_snapshot(w, serial)
    local d = pto._profile_data(w)
    if not d then return nil end
    return { data = d, title = ("Worker %d: %s, run %d"):format(serial, tostring(w), d.run), stats = w:stats_report() }
  end

  -- At the end of the script: print the profiles (--profile) and write the report (--report).
  function pto._cli_profile(snaps, profile, report_path)
    local serials = {}
    for s in pairs(snaps) do serials[#serials + 1] = s end
    table.sort(serials)
    local sections = {}
    io.stdout:flush()   -- the script's output first, as it was written
    for _, s in ipairs(serials) do
      local snap = snaps[s]
      local p = pto._profile_build(snap.data)
      if profile then io.stderr:write(("ptolua --profile: %s\n"):format(snap.title), tostring(p)) end
      sections[#sections + 1] = section(snap.title, p, snap.stats)
    end
    if profile and #serials == 0 then io.stderr:write("ptolua --profile: no Worker ended a run\n") end
    if report_path then
      write("--report", report_path, M.html("ptolua run report: " .. (arg and arg[0] or "ptolua"), sections))
    end
  end

  pto._extend_worker {
    -- w:report(path): the HTML run report of w's last ended run.
    report = function(w, path, ...)
      if type(path) ~= "string" or path == "" then
        error(("Worker:report: expected the path of the HTML file to write, like w:report(\"run.html\") (got %s)")
          :format(type(path)), 2)
      end
      if select("#", ...) > 0 then error("Worker:report: takes one argument, the path", 2) end
      local p = w:profile()
      if not p then error("Worker:report: no run has ended on this Worker yet; call it after w:run(...)", 2) end
      local title = ("%s, run %d"):format(tostring(w), p.run)
      write("Worker:report", path, M.html("ptolua run report", { section(title, p, w:stats_report()) }))
    end,
  }
  return M
end
