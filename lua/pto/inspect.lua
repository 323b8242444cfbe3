-- Inspection of the current run, built on orch:task (docs/lua.md): the task
-- list, the DAG as nodes and edges, and Graphviz text.
return function(pto)
  local M = {}

  -- orch:task_count(), its errors (run ended, ...) named after the call the user made.
  local function task_count(orch, who)
    pto._check_orch(orch, who)
    return orch:task_count()
  end

  local function tasks(orch, who)
    local out = {}
    for id = 0, task_count(orch, who) - 1 do out[#out + 1] = orch:task(id) end
    return out
  end

  local function dag(orch, who)
    local nodes, edges = tasks(orch, who), {}
    for _, t in ipairs(nodes) do
      for _, p in ipairs(t.producers) do edges[#edges + 1] = {from = p, to = t.id} end
    end
    return {nodes = nodes, edges = edges}
  end

  function M.tasks(orch) return tasks(orch, "orch:tasks") end

  function M.dag(orch) return dag(orch, "orch:dag") end

  -- One line of a DOT label: inside a quoted string only '"' and '\' are
  -- special (a backslash would also start an escape like \n or \l), other
  -- control characters become spaces, bytes that are not UTF-8 become '?'
  -- (dot rejects them), and a long line is cut on a character boundary.
  local function label_line(s, max)
    s = tostring(s):gsub("%c", " ")
    if not utf8.len(s) then s = s:gsub("[\128-\255]", "?") end
    if max and #s > max then
      local i = max
      while i > 0 and (s:byte(i + 1) or 0) >= 0x80 and s:byte(i + 1) < 0xC0 do i = i - 1 end
      s = s:sub(1, i) .. "..."
    end
    return (s:gsub('[\\"]', "\\%0"))
  end

  -- Lines joined with dot's centred line break, as one quoted string.
  local function quote_lines(lines)
    return '"' .. table.concat(lines, "\\n") .. '"'
  end

  -- The name the callable was registered under, if the Worker knows it.
  local function callable_name(orch, t)
    if t.kind ~= "next_level" and t.kind ~= "sub" then return nil end
    local ok, name = pcall(function() return pto._callable_name(orch:worker(), t.kind, t.callable) end)
    return ok and name or nil
  end

  -- ---- Graphviz ------------------------------------------------------------
  --
  -- Nodes are filled with one colour per callable, so that the structure of
  -- a DAG shows at a glance; a task that failed by itself (the root cause)
  -- is red with a thick border, one that was not run because a producer
  -- failed (poisoned) or the run was interrupted is pale red and dashed;
  -- tasks that have not run yet (pending, ready) have a dashed border,
  -- running ones a thick one. Labels name the worker that ran the task when
  -- it is known. An orch:alloc slot is drawn only when no task uses it;
  -- otherwise it is folded into the label of the tasks that use its memory.
  -- With the scope of each task and the tree of scopes (ptolua --dot has
  -- both from the run's profile), each nested scope's tasks are drawn in a
  -- cluster of their own, inside their parent scope's. Above CONDENSE tasks
  -- a DAG is condensed: one node per (scope depth, callable, state) with
  -- its count, one edge per pair of such nodes with the number of edges.

  local PALETTE = { "lightblue", "palegreen", "khaki", "plum", "lightsalmon", "paleturquoise", "wheat", "thistle",
    "lightpink", "darkseagreen", "lightsteelblue", "burlywood" }
  local CONDENSE = 500

  -- "root", "poisoned", "unrun" (interrupted) or nil: why a failed task
  -- failed. t.not_run: the profile says it never ran.
  local function failure_kind(t, failed)
    if t.state ~= "failed" then return nil end
    if t.error and t.error:find("was not run: its producer", 1, true) then return "poisoned" end
    for _, p in ipairs(t.producers) do if failed[p] then return "poisoned" end end
    if t.not_run or (t.error and t.error:find("was not run: the run was interrupted", 1, true)) then return "unrun" end
    return "root"
  end

  -- The label's state of a failed task of failure kind fk.
  local SHOWN = { poisoned = "poisoned (not run)", unrun = "not run (interrupted)" }

  local function colour_of(colours, key)
    if not colours[key] then
      colours.n = (colours.n or 0) + 1
      colours[key] = PALETTE[(colours.n - 1) % #PALETTE + 1]
    end
    return colours[key]
  end

  -- Attributes for a node of state (and failure kind fk), callable colour c;
  -- fillcolor comes last.
  local function node_style(state, fk, c)
    if fk == "root" then return "penwidth=3, color=red3, fillcolor=tomato" end
    if fk == "poisoned" or fk == "unrun" then return "style=\"filled,dashed\", color=red3, fillcolor=mistyrose" end
    if state == "pending" or state == "ready" then return ("style=\"filled,dashed\", fillcolor=%s"):format(c) end
    if state == "running" then return ("penwidth=3, fillcolor=%s"):format(c) end
    return ("fillcolor=%s"):format(c)
  end

  local function what_of(t)
    if t.kind == "next_level" or t.kind == "sub" then
      return ("%s (%s)"):format(t.name or ("callable " .. tostring(t.callable)), t.kind)
    end
    return t.kind
  end

  -- The alloc slots among nodes and, for each other node, the allocs whose
  -- slab holds one of its tensors (the newest alloc at that place: ring
  -- space is reused). Returns used[alloc id] = true, uses[task id] = {ids}.
  local function fold_allocs(nodes)
    local live, used, uses = {}, {}, {}
    for _, t in ipairs(nodes) do
      if t.kind == "alloc" and t.ring then
        local list = live[t.ring] or {}
        live[t.ring] = list
        local lo, hi = t.slab_offset, t.slab_offset + t.slab_bytes
        for i = #list, 1, -1 do   -- an older slab at the same place is gone
          if list[i].lo < hi and lo < list[i].hi then table.remove(list, i) end
        end
        list[#list + 1] = { lo = lo, hi = hi, id = t.id }
      elseif t.tensors then
        for _, x in ipairs(t.tensors) do
          for _, a in ipairs(x.ring and live[x.ring] or {}) do
            if x.ring_offset >= a.lo and x.ring_offset < a.hi then
              uses[t.id] = uses[t.id] or {}
              local u = uses[t.id]
              if u[#u] ~= a.id then u[#u + 1] = a.id end
              used[a.id] = true
            end
          end
        end
      end
    end
    return used, uses
  end

  local function node_line(t, prefix, indent, colours, failed, uses)
    local label = {label_line(("task %d"):format(t.id)), label_line(what_of(t), 60)}
    local state = t.queued and "queued" or t.state   -- handed to a worker, not executing (orch:task)
    local fk = failure_kind(t, failed)
    state = SHOWN[fk] or state
    if (t.group_size or 1) > 1 then state = ("%s, group of %d"):format(state, t.group_size) end
    label[#label + 1] = label_line(state)
    if t.worker_name then
      label[#label + 1] = label_line((t.queued and "for " or "on ") .. t.worker_name .. (t.duration_ms and (", %.3g ms"):format(t.duration_ms) or ""))
    end
    if uses and uses[t.id] then label[#label + 1] = label_line("uses alloc " .. table.concat(uses[t.id], ", ")) end
    local attrs = ""
    if t.error then
      local n = 0
      for l in t.error:gmatch("[^\n]+") do
        n = n + 1
        if n > 3 then label[#label + 1] = "..." break end
        label[#label + 1] = label_line(l, 100)
      end
      attrs = (", tooltip=%s"):format(quote_lines{label_line(t.error, 2000)})
    end
    local c = t.kind == "alloc" and "white" or colour_of(colours, what_of(t))
    return ("%s%st%d [label=%s%s, %s];"):format(indent, prefix, t.id, quote_lines(label), attrs,
      node_style(t.queued and "queued" or t.state, fk, c))
  end

  -- A function giving the chain of nested scopes, outermost first, that
  -- scope seq lies in (seq itself last; {} for the run's own scope), from
  -- parent[seq] (the profile's scope tree). Without a tree: no chains.
  local function scope_chains(parent)
    local memo = { [0] = {} }
    local function chain(seq)
      if not parent or not seq or seq == 0 then return memo[0] end
      local c = memo[seq]
      if c then return c end
      local up = parent[seq] or 0   -- a scope past the tree's cap: taken for a child of the run's own
      if up >= seq then up = 0 end  -- a parent opens before its children; anything else is no tree
      local above = chain(up)
      c = table.move(above, 1, #above, 1, {})
      c[#c + 1] = seq
      memo[seq] = c
      return c
    end
    return chain
  end

  -- Lines of the detailed view: nodes (each nested scope's in a cluster
  -- when the scope tree is known), then edges. fold: {used, uses} from the
  -- profile, else the allocs are found from the tasks' tensors.
  local function detailed_lines(nodes, prefix, indent, fold, parent)
    local lines, colours, failed = {}, {}, {}
    for _, t in ipairs(nodes) do if t.state == "failed" then failed[t.id] = true end end
    local used, uses
    if fold then used, uses = fold.used, fold.uses else used, uses = fold_allocs(nodes) end
    local chain_of = scope_chains(parent)
    -- Tasks in id order: a scope's come after its opening and before its
    -- end, so walking them opens and closes each scope's cluster once.
    local drawn, open = {}, {}
    for _, t in ipairs(nodes) do
      if not (t.kind == "alloc" and used[t.id]) then
        local chain = chain_of(t.scope)
        local k = 0
        while k < #open and k < #chain and open[k + 1] == chain[k + 1] do k = k + 1 end
        while #open > k do
          lines[#lines + 1] = indent .. "}"
          open[#open] = nil
        end
        for j = k + 1, #chain do
          open[j] = chain[j]
          lines[#lines + 1] = ("%ssubgraph cluster_%ss%d { label=\"scope (depth %d)\"; style=rounded;")
            :format(indent, prefix, chain[j], j)
        end
        lines[#lines + 1] = node_line(t, prefix, indent, colours, failed, uses)
        drawn[t.id] = true
      end
    end
    for _ = 1, #open do lines[#lines + 1] = indent .. "}" end
    for _, t in ipairs(nodes) do
      for _, p in ipairs(t.producers) do
        if drawn[t.id] and (drawn[p] or not used[p]) then
          lines[#lines + 1] = ("%s%st%d -> %st%d;"):format(indent, prefix, p, prefix, t.id)
        end
      end
    end
    return lines, drawn
  end

  -- Lines of the condensed view: one node per (depth, callable, state or
  -- failure kind), in a cluster per scope depth, with counts. fold and
  -- parent as for detailed_lines.
  local function condensed_lines(nodes, prefix, indent, fold, parent)
    local colours, failed, group_of, groups, order = {}, {}, {}, {}, {}
    for _, t in ipairs(nodes) do if t.state == "failed" then failed[t.id] = true end end
    local used = fold and fold.used or fold_allocs(nodes)
    local chain_of = scope_chains(parent)
    local allocs = 0
    for _, t in ipairs(nodes) do
      if t.kind == "alloc" and used[t.id] then
        allocs = allocs + 1
      else
        local fk = failure_kind(t, failed)
        local state = SHOWN[fk] or (t.queued and "queued") or t.state
        local depth = #chain_of(t.scope)
        local key = ("%d|%s|%s"):format(depth, what_of(t), state)
        local g = groups[key]
        if not g then
          g = { id = #order + 1, depth = depth, what = what_of(t), state = state, shown = state, fk = fk,
            n = 0, workers = {}, nworkers = 0, first = t.id, errors = {} }
          groups[key] = g
          order[#order + 1] = g
        end
        g.n, g.last = g.n + 1, t.id
        if t.duration_ms then g.ms, g.timed = (g.ms or 0) + t.duration_ms, (g.timed or 0) + 1 end
        if t.worker_name and not g.workers[t.worker_name] then
          g.workers[t.worker_name] = true
          g.nworkers = g.nworkers + 1
        end
        if t.error and #g.errors < 1 then g.errors[1] = t.error end
        group_of[t.id] = g
      end
    end
    local lines, maxdepth = {}, 0
    for _, g in ipairs(order) do maxdepth = math.max(maxdepth, g.depth) end
    local at_depth = {}
    for _, g in ipairs(order) do at_depth[g.depth] = true end
    for d = 0, maxdepth do
      local cluster = d > 0 and at_depth[d]
      if cluster then
        lines[#lines + 1] = ("%ssubgraph cluster_%sd%d { label=\"scopes at depth %d\"; style=rounded;"):format(indent,
          prefix, d, d)
      end
      for _, g in ipairs(order) do
        if g.depth == d then
          local label = { label_line(g.what, 60), label_line(("x%d %s"):format(g.n, g.shown)) }
          label[#label + 1] = label_line(g.n > 1 and ("task %d ... task %d"):format(g.first, g.last) or ("task %d"):format(g.first))
          if g.nworkers > 0 then
            local ws = {}
            for name in pairs(g.workers) do ws[#ws + 1] = name end
            table.sort(ws)
            if #ws > 4 then ws = { ws[1], ws[2], ws[3], ("... %d workers"):format(#ws) } end
            label[#label + 1] = label_line("on " .. table.concat(ws, ", "), 80)
          end
          if g.timed then label[#label + 1] = label_line(("mean %.3g ms"):format(g.ms / g.timed)) end
          if g.errors[1] then label[#label + 1] = label_line(g.errors[1]:match("[^\n]*"), 100) end
          local c = colour_of(colours, g.what)
          lines[#lines + 1] = ("%s%sg%d [label=%s, %s];"):format(indent, prefix, g.id, quote_lines(label),
            node_style(g.state, g.fk, c))
        end
      end
      if cluster then lines[#lines + 1] = indent .. "}" end
    end
    local edges, eorder = {}, {}
    for _, t in ipairs(nodes) do
      local to = group_of[t.id]
      for _, p in ipairs(t.producers) do
        local from = group_of[p]
        if to and from then
          local key = from.id .. ">" .. to.id
          if not edges[key] then eorder[#eorder + 1] = key end
          edges[key] = (edges[key] or 0) + 1
        end
      end
    end
    for _, key in ipairs(eorder) do
      local f, t = key:match("(%d+)>(%d+)")
      lines[#lines + 1] = ("%s%sg%s -> %sg%s [label=\"x%d\"];"):format(indent, prefix, f, prefix, t, edges[key])
    end
    return lines, #order, allocs
  end

  local function want_condensed(opts, n)
    if opts and opts.condensed ~= nil then return opts.condensed end
    return n > CONDENSE
  end

  -- orch:dot([{condensed = bool}])
  function M.dot(orch, opts)
    local nodes = tasks(orch, "orch:dot")
    if opts ~= nil and type(opts) ~= "table" then
      error(("orch:dot: the options must be a table like {condensed = true} (got %s)"):format(type(opts)), 2)
    end
    for _, t in ipairs(nodes) do t.name = callable_name(orch, t) end
    local lines = {"digraph pto {", "  rankdir=LR;", "  node [shape=box, style=filled, fontname=\"monospace\"];"}
    local body
    if want_condensed(opts, #nodes) then
      local groups
      body, groups = condensed_lines(nodes, "", "  ")
      lines[#lines + 1] = ("  label=%s;"):format(quote_lines{label_line(("condensed: %d tasks in %d groups "
        .. "(orch:dot{condensed = false} draws each task)"):format(#nodes, groups))})
    else
      body = detailed_lines(nodes, "", "  ")
    end
    for _, l in ipairs(body) do lines[#lines + 1] = l end
    lines[#lines + 1] = "}"
    return table.concat(lines, "\n") .. "\n"
  end

  -- ptolua --dot (src/binding/lpto_trace.c): the last run of Worker w as
  -- cluster `name` of a digraph, titled `title` and its run number, or nil
  -- if no run has ended. It is drawn after the run, from the run's profile
  -- (pto._profile_data), which the engine keeps anyway: every task's
  -- callable, worker, times, scope and whether it failed or never ran, the
  -- edges, the scope tree, the alloc slots each task used and the errors.
  -- Copying each task at its submit instead cost several times the submit.
  -- Tasks of the run's own scope show `completed`, those of nested scopes
  -- `consumed` (their scope ended before the run did). PTO_DOT=full in the
  -- environment draws every task of a large run, at most DOT_MAX.
  local DOT_MAX = 5000   -- beyond this a picture no longer helps (and dot takes minutes)

  function pto._dot_profile(w, name, title)
    local d = pto._profile_data(w, "ptolua --dot")
    if not d then return nil end
    -- One node per task: a group's members are one record each.
    local by_id, nodes = {}, {}
    local names = {}   -- by kind and callable, asked once each
    for i = 1, #d.id do
      local id, failed = d.id[i], d.failed[i]
      local t = by_id[id]
      if not t then
        local kind = d.kind[i] == 1 and "sub" or "next_level"
        local nk = kind .. d.callable[i]
        if names[nk] == nil then names[nk] = pto._callable_name(w, kind, d.callable[i]) or false end
        t = { id = id, kind = kind, callable = d.callable[i], name = names[nk] or nil, scope = d.scope[i],
          producers = {}, group_size = 0, failed = 0 }
        by_id[id] = t
        nodes[#nodes + 1] = t
      end
      t.group_size = t.group_size + 1
      if failed > t.failed then t.failed = failed end
      if d.member[i] == 0 and failed ~= 2 then
        t.duration_ms = (d.finish[i] - d.start[i]) / 1e6
        t.worker_name = (d.kind[i] == 1 and d.sub_names or d.next_names)[d.worker[i]]
      end
    end
    table.sort(nodes, function(a, b) return a.id < b.id end)
    for _, t in ipairs(nodes) do
      t.error = d.errors[t.id]
      t.not_run = t.failed == 2
      if t.failed > 0 then t.state = "failed"
      else t.state = t.scope == 0 and "completed" or "consumed" end
    end
    local e = d.edges
    for i = 1, #e, 2 do
      local t = by_id[e[i]]
      if t then t.producers[#t.producers + 1] = e[i + 1] end
    end
    local fold = { used = {}, uses = {} }
    local u = d.alloc_uses
    for i = 1, #u, 2 do
      local list = fold.uses[u[i]] or {}
      fold.uses[u[i]] = list
      if list[#list] ~= u[i + 1] then list[#list + 1] = u[i + 1] end
      fold.used[u[i + 1]] = true
    end
    title = ("%s, run %d"):format(title, d.run)
    local total = #nodes + d.dropped
    local condensed = os.getenv("PTO_DOT") ~= "full" and #nodes > CONDENSE
    if not condensed then
      for i = #nodes, DOT_MAX + 1, -1 do nodes[i] = nil end
    end
    if total > #nodes then
      title = ("%s (the first %d of %d tasks)"):format(title, #nodes, total)
    end
    local body, known = nil, {}
    if condensed then
      local groups
      body, groups = condensed_lines(nodes, name .. "_", "    ", fold, d.scope_parent)
      title = ("%s, condensed: %d tasks in %d groups (PTO_DOT=full draws each task)"):format(title, #nodes, groups)
    else
      body, known = detailed_lines(nodes, name .. "_", "    ", fold, d.scope_parent)
    end
    local lines = {("  subgraph cluster_%s {"):format(name), ("    label=%s;"):format(quote_lines{label_line(title)})}
    -- A producer that is not drawn (past the profile's cap) still gets a
    -- node, dashed; a folded alloc's edges are in its users' labels.
    if not condensed then
      for _, t in ipairs(nodes) do
        for _, p in ipairs(t.producers) do
          if not known[p] and not fold.used[p] then
            known[p] = true
            lines[#lines + 1] = ("    %s_t%d [label=\"task %d\", style=\"dashed,filled\", fillcolor=white];"):format(name, p, p)
          end
        end
      end
    end
    for _, l in ipairs(body) do lines[#lines + 1] = l end
    lines[#lines + 1] = "  }"
    return table.concat(lines, "\n") .. "\n"
  end

  pto._extend_orch(M)
end
