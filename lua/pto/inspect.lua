-- Inspection of the current run, built on orch:task (spec §4): the task
-- list, the DAG as nodes and edges, and Graphviz text.
return function(pto)
  local M = {}

  function M.tasks(orch)
    local out = {}
    for id = 0, orch:task_count() - 1 do out[#out + 1] = orch:task(id) end
    return out
  end

  function M.dag(orch)
    local nodes, edges = M.tasks(orch), {}
    for _, t in ipairs(nodes) do
      for _, p in ipairs(t.producers) do edges[#edges + 1] = {from = p, to = t.id} end
    end
    return {nodes = nodes, edges = edges}
  end

  local COLOURS = {
    pending = "lightgrey", ready = "lightblue", running = "gold", completed = "palegreen",
    consumed = "darkseagreen", failed = "tomato", free = "white",
  }

  local function quote(s)
    return '"' .. tostring(s):gsub('[\\"]', "\\%0"):gsub("\n", "\\n") .. '"'
  end

  function M.dot(orch)
    local g = M.dag(orch)
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
