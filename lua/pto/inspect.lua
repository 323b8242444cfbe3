-- Inspection of the current run, built on orch:task (spec §4): the task
-- list, the DAG as nodes and edges, and Graphviz text.
return function(pto)
  local M = {}

  -- orch:task_count(), its errors (run ended, ...) named after the call the user made.
  local function task_count(orch, who)
    local ok, n = pcall(orch.task_count, orch)
    if ok then return n end
    error((tostring(n):gsub("^[^:\n]*:%d+: ", "", 1):gsub("^orch:task_count: ", who .. ": ", 1)), 0)
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

  local function quote(s)
    return '"' .. tostring(s):gsub('[\\"]', "\\%0"):gsub("\n", "\\n") .. '"'
  end

  function M.dot(orch)
    local g = dag(orch, "orch:dot")
    local lines = {"digraph pto {", "  rankdir=LR;", "  node [shape=box, style=filled, fontname=\"monospace\"];"}
    for _, t in ipairs(g.nodes) do
      local label = ("task %d\\n%s %s\\n%s"):format(t.id, t.kind, tostring(t.callable), t.state)
      if t.error then label = label .. "\\n" .. t.error:sub(1, 120) end
      lines[#lines + 1] = ("  t%d [label=%s, fillcolor=%s];"):format(t.id, quote(label):gsub("\\\\n", "\\n"),
        COLOURS[t.state] or "white")
    end
    for _, e in ipairs(g.edges) do lines[#lines + 1] = ("  t%d -> t%d;"):format(e.from, e.to) end
    lines[#lines + 1] = "}"
    return table.concat(lines, "\n") .. "\n"
  end

  pto._extend_orch(M)
end
