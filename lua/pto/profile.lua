-- The run profile (docs/tracing.md "Profile"): where the time of a
-- Worker's last run went, from the start and end of every task that the
-- engine keeps (pto._profile_data, columns of numbers in ns from the run's
-- start).
--
-- w:profile() builds it: per callable (count, total, mean, p50, p95, max,
-- and the sums of CallConfig enable_pmu's counters where tasks asked),
-- per worker (tasks, busy, idle), orchestration (the run's function, less
-- the time it waited in orch:drain or the progress line's wait) vs execution
-- with a one-line verdict, the critical path, and the same for each Worker child's last run
-- (a PROCESS-mode child's as its process published it). tostring() of it is the text ptolua --profile
-- and the prompt's :profile print. The critical path is the longest chain of
-- dependent tasks weighted by their durations (the engine keeps the run's
-- edges); when the edges were too many to keep, the producer that released
-- each task stands in for them.
return function(pto)
  local Profile = {}
  Profile.__index = Profile

  local function ms(ns) return ns / 1e6 end

  -- Nearest-rank percentile of a sorted array.
  local function pct(sorted, p)
    if #sorted == 0 then return 0 end
    local k = math.max(1, math.ceil(p / 100 * #sorted))
    return sorted[k]
  end

  -- Longest chain through the DAG by duration. Ids grow in submission order
  -- and a producer is always submitted before its consumers, so one pass in
  -- id order is a topological order.
  local function critical_path(d, span)
    local preds = {}
    local function add(c, p)
      if span[p] and span[c] then
        local l = preds[c]
        if not l then l = {}; preds[c] = l end
        l[#l + 1] = p
      end
    end
    local e = d.edges
    for i = 1, #e, 2 do add(e[i], e[i + 1]) end
    for i = 1, #d.id do if d.ready_by[i] >= 0 then add(d.id[i], d.ready_by[i]) end end
    local ids = {}
    for id in pairs(span) do ids[#ids + 1] = id end
    table.sort(ids)
    local dist, via, best = {}, {}, nil
    for _, id in ipairs(ids) do
      local s, from = 0, nil
      for _, p in ipairs(preds[id] or {}) do
        if dist[p] and dist[p] > s then s, from = dist[p], p end
      end
      dist[id] = s + span[id].dur
      via[id] = from
      if not best or dist[id] > dist[best] then best = id end
    end
    local path = {}
    while best do table.insert(path, 1, best); best = via[best] end
    return path, path[#path] and dist[path[#path]] or 0
  end

  local function build(d)
    local n = #d.id
    local p = setmetatable({ run = d.run, level = d.level, mode = d.mode, tasks = n, dropped = d.dropped,
      makespan_ms = ms(d.end_ns), orchestration_ms = ms(math.max(0, d.drain_ns - d.waited_ns)),
      waited_ms = ms(d.waited_ns), timeline = {}, begin_ns = d.begin_ns,
      edges = d.edges, scopes = d.scope_parent or {} }, Profile)
    -- Each task's span: a group's members together, from the first start to the last end.
    local span, by_callable, lanes = {}, {}, {}
    local first, last = math.huge, 0
    p.not_run = {}   -- {id, name} of the tasks that never ran: a producer failed, or the run was interrupted
    local ran = 0
    for i = 1, n do
      local id, s, f = d.id[i], d.start[i], d.finish[i]
      if d.failed[i] == 2 then
        p.not_run[#p.not_run + 1] = { id = id, name = d.name[i], scope = d.scope and d.scope[i] or 0 }
        goto continue
      end
      ran = ran + 1
      local kind = d.kind[i] == 1 and "sub" or "next_level"
      local x = span[id]
      if not x then
        x = { id = id, start = s, finish = f, name = d.name[i], failed = false }
        span[id] = x
      else
        x.start, x.finish = math.min(x.start, s), math.max(x.finish, f)
      end
      x.failed = x.failed or d.failed[i] == 1
      x.dur = x.finish - x.start
      first, last = math.min(first, s), math.max(last, f)
      local c = by_callable[d.name[i]]
      if not c then
        c = { name = d.name[i], kind = kind == "sub" and "sub" or (d.level >= 4 and "worker" or "chip"), durs = {},
          failed = 0 }
        by_callable[d.name[i]] = c
      end
      c.durs[#c.durs + 1] = f - s
      if d.failed[i] == 1 then c.failed = c.failed + 1 end
      local pm = d.pmu and d.member[i] == 0 and d.pmu[id]
      if pm then   -- CallConfig enable_pmu: the task's counts (a group's members summed)
        c.pmu = c.pmu or { tasks = 0 }
        c.pmu.tasks = c.pmu.tasks + 1
        for k, v in pairs(pm) do
          if k ~= "set" then c.pmu[k] = (c.pmu[k] or 0) + v end
        end
      end
      local lk = kind .. d.worker[i]
      local lane = lanes[lk]
      if not lane then
        lane = { busy = 0, tasks = 0 }
        lanes[lk] = lane
      end
      lane.busy, lane.tasks = lane.busy + (f - s), lane.tasks + 1
      p.timeline[#p.timeline + 1] = { id = id, lane = lk, start_ms = ms(s), finish_ms = ms(f), name = d.name[i],
        member = d.member[i], failed = d.failed[i] == 1, scope = d.scope and d.scope[i] or 0 }
      ::continue::
    end
    p.tasks = ran
    p.execution_ms = ran > 0 and ms(last - first) or 0

    p.callables = {}
    for _, c in pairs(by_callable) do
      table.sort(c.durs)
      local total = 0
      for _, x in ipairs(c.durs) do total = total + x end
      p.callables[#p.callables + 1] = { name = c.name, kind = c.kind, count = #c.durs, failed = c.failed,
        total_ms = ms(total), mean_ms = ms(total / #c.durs), p50_ms = ms(pct(c.durs, 50)),
        p95_ms = ms(pct(c.durs, 95)), max_ms = ms(c.durs[#c.durs]), pmu = c.pmu }
    end
    table.sort(p.callables, function(a, b) return a.total_ms > b.total_ms end)

    -- Every worker, also one that ran nothing: it was idle the whole run.
    p.workers = {}
    local busy_all = 0
    for _, k in ipairs({ { "next_level", d.next_names }, { "sub", d.sub_names } }) do
      for i, name in ipairs(k[2]) do
        local lane = lanes[k[1] .. i] or { busy = 0, tasks = 0 }
        local busy = d.end_ns > 0 and lane.busy / d.end_ns * 100 or 0
        p.workers[#p.workers + 1] = { name = name, lane = k[1] .. i, tasks = lane.tasks, busy_ms = ms(lane.busy),
          busy_pct = busy, idle_pct = math.max(0, 100 - busy) }
        busy_all = busy_all + busy
      end
    end
    p.busy_pct = #p.workers > 0 and busy_all / #p.workers or 0
    p.idle_pct = 100 - p.busy_pct

    local path, len = critical_path(d, span)
    p.critical_path = { tasks = path, count = #path, length_ms = ms(len),
      pct = d.end_ns > 0 and len / d.end_ns * 100 or 0 }
    p.verdict = Profile.verdict(p)

    p.levels = {}
    for i, c in pairs(d.children or {}) do
      local cp = build(c)
      cp.name = d.next_names[i]
      p.levels[#p.levels + 1] = cp
    end
    table.sort(p.levels, function(a, b) return a.name < b.name end)
    return p
  end

  -- One line that says what bounded the run, and what to do about it.
  function Profile.verdict(p)
    if p.tasks == 0 then return "nothing ran: the run submitted no task" end
    local orch = p.makespan_ms > 0 and p.orchestration_ms / p.makespan_ms * 100 or 0
    if p.idle_pct >= 50 and orch >= 50 and p.critical_path.pct < 50 then
      return ("orchestration-bound: the workers were idle %.0f%% of the run while the orchestrator submitted; "
        .. "see docs/lua.md's fast form (Submitting in hot loops)"):format(p.idle_pct)
    elseif p.idle_pct >= 50 and p.critical_path.pct < 50 then
      return ("overhead-bound: the workers were idle %.0f%% of the run although no dependency held them; the "
        .. "tasks are too short for their dispatch: give each more work"):format(p.idle_pct)
    elseif p.idle_pct >= 30 and p.critical_path.pct >= 60 then
      return ("dependency-bound: the critical path is %.0f%% of the run and the workers were idle %.0f%%; "
        .. "more workers will not help, shorter tasks on the path will"):format(p.critical_path.pct, p.idle_pct)
    elseif p.busy_pct >= 70 then
      return ("execution-bound: the workers were busy %.0f%% of the run; more workers or faster kernels help")
          :format(p.busy_pct)
    end
    return ("mixed: the workers were busy %.0f%%, the orchestration took %.0f%% of the run, the critical path "
      .. "%.0f%%"):format(p.busy_pct, orch, p.critical_path.pct)
  end

  local function fmt_ms(x)
    if x >= 100 then return ("%.0f"):format(x) elseif x >= 1 then return ("%.2f"):format(x) end
    return ("%.3f"):format(x)
  end

  local function table_text(out, head, rows)
    local w = {}
    for c, h in ipairs(head) do w[c] = #h end
    for _, r in ipairs(rows) do for c, v in ipairs(r) do w[c] = math.max(w[c], #v) end end
    local function line(r, indent)
      local parts = {}
      for c, v in ipairs(r) do
        parts[c] = c == 1 and v .. (" "):rep(w[c] - #v) or (" "):rep(w[c] - #v) .. v
      end
      out[#out + 1] = indent .. table.concat(parts, "  ")
    end
    line(head, "  ")
    for _, r in ipairs(rows) do line(r, "  ") end
  end

  -- The counter names the callables' sums have, the common software ones first.
  local PMU_ORDER = { "task_clock", "page_faults", "context_switches", "cpu_migrations", "cycles", "instructions",
    "cache_references", "cache_misses", "branches", "branch_misses" }
  local function pmu_events(callables)
    local seen, events = {}, {}
    for _, c in ipairs(callables) do
      for k in pairs(c.pmu or {}) do if k ~= "tasks" then seen[k] = true end end
    end
    for _, e in ipairs(PMU_ORDER) do
      if seen[e] then events[#events + 1] = e; seen[e] = nil end
    end
    local rest = {}
    for e in pairs(seen) do rest[#rest + 1] = e end
    table.sort(rest)
    for _, e in ipairs(rest) do events[#events + 1] = e end
    return events
  end

  local function text(p, out, indent)
    local head = ("Profile of run %d (level %d, %s mode): %d task%s in %s ms"):format(p.run, p.level, p.mode,
      p.tasks, p.tasks == 1 and "" or "s", fmt_ms(p.makespan_ms))
    out[#out + 1] = indent .. head .. (p.name and (" — " .. p.name) or "")
    if #p.not_run > 0 then
      out[#out + 1] = indent .. ("  (%d more did not run: a producer failed, or the run was interrupted)"):format(#p.not_run)
    end
    if p.dropped > 0 then
      out[#out + 1] = indent .. ("  (%d more tasks ran than the profile keeps: they are not counted)"):format(p.dropped)
    end
    out[#out + 1] = indent .. ("  orchestration %s ms (%.0f%% of the run), execution %s ms; workers busy %.0f%%, idle %.0f%%")
        :format(fmt_ms(p.orchestration_ms), p.makespan_ms > 0 and p.orchestration_ms / p.makespan_ms * 100 or 0,
          fmt_ms(p.execution_ms), p.busy_pct, p.idle_pct)
    out[#out + 1] = indent .. "  verdict: " .. p.verdict
    local cp = p.critical_path
    local ids = {}
    for i = 1, math.min(#cp.tasks, 12) do ids[i] = tostring(cp.tasks[i]) end
    if #cp.tasks > 12 then ids[#ids + 1] = ("... (%d more)"):format(#cp.tasks - 12) end
    out[#out + 1] = indent .. ("  critical path: %s ms, %d task%s, %.0f%% of the run: %s"):format(fmt_ms(cp.length_ms),
      cp.count, cp.count == 1 and "" or "s", cp.pct, #ids > 0 and table.concat(ids, " -> ") or "none")
    if #p.callables > 0 then
      local rows = {}
      for _, c in ipairs(p.callables) do
        rows[#rows + 1] = { c.name, tostring(c.count), fmt_ms(c.total_ms), fmt_ms(c.mean_ms), fmt_ms(c.p50_ms),
          fmt_ms(c.p95_ms), fmt_ms(c.max_ms) }
      end
      local t = {}
      table_text(t, { "callable", "count", "total ms", "mean ms", "p50 ms", "p95 ms", "max ms" }, rows)
      for _, l in ipairs(t) do out[#out + 1] = indent .. l end
    end
    local events = pmu_events(p.callables)
    if #events > 0 then
      out[#out + 1] = indent .. "  counters (CallConfig enable_pmu), summed per callable over the tasks that asked:"
      local head, rows = { "callable", "tasks" }, {}
      for _, e in ipairs(events) do head[#head + 1] = (e:gsub("_", "-")) end
      for _, c in ipairs(p.callables) do
        if c.pmu then
          local r = { c.name, tostring(c.pmu.tasks) }
          for _, e in ipairs(events) do r[#r + 1] = c.pmu[e] and tostring(c.pmu[e]) or "-" end
          rows[#rows + 1] = r
        end
      end
      local t = {}
      table_text(t, head, rows)
      for _, l in ipairs(t) do out[#out + 1] = indent .. l end
    end
    local rows = {}
    for _, w in ipairs(p.workers) do
      rows[#rows + 1] = { w.name, tostring(w.tasks), fmt_ms(w.busy_ms), ("%.0f%%"):format(w.busy_pct),
        ("%.0f%%"):format(w.idle_pct) }
    end
    local t = {}
    table_text(t, { "worker", "tasks", "busy ms", "busy", "idle" }, rows)
    for _, l in ipairs(t) do out[#out + 1] = indent .. l end
    for _, c in ipairs(p.levels) do text(c, out, indent .. "  ") end
  end

  function Profile:__tostring()
    local out = {}
    text(self, out, "")
    return table.concat(out, "\n") .. "\n"
  end

  pto._profile_build = build

  pto._extend_worker {
    -- w:profile() -> the profile of w's last ended run, or nil if none ended yet.
    profile = function(w, ...)
      if select("#", ...) > 0 then
        error("Worker:profile: takes no arguments (it profiles the last run that ended)", 2)
      end
      local d = pto._profile_data(w, "Worker:profile")
      return d and build(d) or nil
    end,
  }
end
