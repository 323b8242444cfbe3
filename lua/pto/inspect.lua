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

  local COLOURS = {
    pending = "lightgrey", ready = "lightblue", running = "gold", completed = "palegreen",
    consumed = "darkseagreen", failed = "tomato", free = "white",
  }

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

  -- Node and edge lines for tasks (orch:task tables, with `name` when
  -- known), ids prefixed by `prefix`.
  local function dot_lines(nodes, prefix, indent)
    local lines = {}
    for _, t in ipairs(nodes) do
      local what
      if t.kind == "next_level" or t.kind == "sub" then
        what = ("%s (%s)"):format(t.name or ("callable " .. tostring(t.callable)), t.kind)
      else
        what = t.kind
      end
      local state = t.state
      if (t.group_size or 1) > 1 then state = ("%s, group of %d"):format(state, t.group_size) end
      local label = {label_line(("task %d"):format(t.id)), label_line(what, 60), label_line(state)}
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
      lines[#lines + 1] = ("%s%st%d [label=%s%s, fillcolor=%s];"):format(indent, prefix, t.id, quote_lines(label),
        attrs, COLOURS[t.state] or "white")
    end
    for _, t in ipairs(nodes) do
      for _, p in ipairs(t.producers) do
        lines[#lines + 1] = ("%s%st%d -> %st%d;"):format(indent, prefix, p, prefix, t.id)
      end
    end
    return lines
  end

  function M.dot(orch)
    local nodes = tasks(orch, "orch:dot")
    for _, t in ipairs(nodes) do t.name = callable_name(orch, t) end
    local lines = {"digraph pto {", "  rankdir=LR;", "  node [shape=box, style=filled, fontname=\"monospace\"];"}
    for _, l in ipairs(dot_lines(nodes, "", "  ")) do lines[#lines + 1] = l end
    lines[#lines + 1] = "}"
    return table.concat(lines, "\n") .. "\n"
  end

  -- ptolua --dot (src/binding/lpto_trace.c) keeps each run's DAG as it is built,
  -- because tasks of scopes that ended are reclaimed before the run ends,
  -- and their producers and callables with them. rec = {nodes, total}.
  local DOT_MAX = 5000   -- beyond this a picture no longer helps (and dot takes minutes)

  -- Right after task id was submitted.
  function pto._dot_record(orch, rec, id)
    rec.total = rec.total + 1
    if #rec.nodes >= DOT_MAX then return end
    local ok, t = pcall(orch.task, orch, id)
    if not ok then return end
    t.name = callable_name(orch, t)
    rec.nodes[#rec.nodes + 1] = t
  end

  -- At the end of the run's function, once every task has finished: the
  -- final states of the tasks still there; the others finished and were
  -- reclaimed.
  function pto._dot_refresh(orch, rec)
    for _, t in ipairs(rec.nodes) do
      local ok, now = pcall(orch.task, orch, t.id)
      if ok and now.kind ~= "reclaimed" then
        t.state, t.error = now.state, now.error
      elseif ok then
        -- reclaimed: a task already seen failing stays failed
        t.state = t.error and "failed" or "consumed"
      end
    end
  end

  -- The run as cluster `name` of a digraph; failure: why the run failed, whose
  -- task is marked failed if it was reclaimed before it could be seen.
  function pto._dot_cluster(rec, name, title, failure)
    if type(failure) == "string" then
      local id = math.tointeger(tonumber(failure:match("task (%d+)")))
      for _, t in ipairs(rec.nodes) do
        if t.id == id and not t.error then
          t.state, t.error = "failed", failure
        end
      end
    end
    if rec.total > #rec.nodes then
      title = ("%s (the first %d of %d tasks)"):format(title, #rec.nodes, rec.total)
    end
    local lines = {("  subgraph cluster_%s {"):format(name), ("    label=%s;"):format(quote_lines{label_line(title)})}
    -- A producer that was not submitted (an orch:alloc slot read before
    -- anything wrote it) still gets a node, drawn dashed.
    local known, extra = {}, {}
    for _, t in ipairs(rec.nodes) do known[t.id] = true end
    for _, t in ipairs(rec.nodes) do
      for _, p in ipairs(t.producers) do
        if not known[p] then
          known[p] = true
          extra[#extra + 1] = ("    %s_t%d [label=\"task %d\", style=\"dashed,filled\", fillcolor=white];"):format(name, p, p)
        end
      end
    end
    for _, l in ipairs(extra) do lines[#lines + 1] = l end
    for _, l in ipairs(dot_lines(rec.nodes, name .. "_", "    ")) do lines[#lines + 1] = l end
    lines[#lines + 1] = "  }"
    return table.concat(lines, "\n") .. "\n"
  end

  pto._extend_orch(M)
end
