-- pto.commands: the prompt's engine commands (docs/repl.md): dispatch
-- control (:hold, :step, :release, :break), inspection of the open run
-- (:dag, :task, :why, :ready, :tensormap, :rings, :stats, :workers, :runs,
-- :profile), check mode (:check, docs/check.md), stop on failure (:catch,
-- :retry), exports (:dot, :trace, :report) and the end of an interactive run
-- (:finish).
--
-- Every command acts on the current Worker: the one chosen with :use, else
-- the newest Worker with a run opened by Worker:open_run, else the newest
-- Worker. The commands are thin: all they show comes from the Worker and
-- orchestrator methods a script can call too.
-- pto is not loaded here: a prompt that never creates a Worker need not load it.
return function(repl)
  local function workers()
    local pto = package.loaded.pto
    return pto and pto.workers() or {}
  end

  local chosen -- set by :use

  -- orch:task(id).pmu's counters, in the order of their sets (docs/tracing.md)
  local PMU_EVENTS = { "task_clock", "page_faults", "context_switches", "cpu_migrations", "cycles", "instructions",
    "cache_references", "cache_misses", "branches", "branch_misses" }

  local function out(fmt, ...) io.stdout:write(fmt:format(...), "\n") end

  -- A user-level problem: say it, no traceback.
  local Problem = {}
  local function problem(fmt, ...) error(setmetatable({ msg = fmt:format(...) }, Problem), 0) end

  -- Run a pto call; its error becomes a problem (the message names the call).
  local function try(f, ...)
    local r = table.pack(pcall(f, ...))
    if not r[1] then
      if getmetatable(r[2]) == Problem then error(r[2], 0) end
      problem("%s", tostring(r[2]))
    end
    return table.unpack(r, 2, r.n)
  end

  local function live(w)
    for _, x in ipairs(workers()) do if x == w then return true end end
    return false
  end

  local function worker(optional)
    if chosen and live(chosen) then return chosen end
    local ws = workers()
    for i = #ws, 1, -1 do if ws[i]:orch() then return ws[i] end end
    if ws[#ws] or optional then return ws[#ws] end
    problem("no Worker yet: create one, e.g. w = pto.Worker{chips = 2}")
  end

  local function open_orch(w)
    local orch = w:orch()
    if not orch then
      problem("no open run on %s: open one with orch = w:open_run() (runs of Worker:run end before the prompt "
        .. "returns)", tostring(w))
    end
    return orch
  end

  local levels = setmetatable({}, { __mode = "k" }) -- a Worker's level never changes

  -- "chip", "sub", "worker" or "alloc" for a task of w.
  local function kind_name(w, t)
    if t.kind == "sub" then return "sub" end
    levels[w] = levels[w] or w:stats().level
    if t.kind == "next_level" then return levels[w] >= 4 and "worker" or "chip" end
    return t.kind
  end

  local function callable_name(w, t)
    if t.kind ~= "sub" and t.kind ~= "next_level" then return "-" end
    return package.loaded.pto._callable_name(w, t.kind, t.callable) or ("callable " .. t.callable)
  end

  local function describe(w, t)
    return ("task %d %s (%s)"):format(t.id, callable_name(w, t), kind_name(w, t))
  end

  -- Rows of strings printed as left-aligned columns.
  local function columns(rows)
    local width = {}
    for _, r in ipairs(rows) do
      for i, c in ipairs(r) do width[i] = math.max(width[i] or 0, #c) end
    end
    for _, r in ipairs(rows) do
      local cells = {}
      for i, c in ipairs(r) do cells[i] = i == #r and c or c .. (" "):rep(width[i] - #c) end
      out("  %s", (table.concat(cells, "  "):gsub("%s+$", "")))
    end
  end

  local function bytes(n)
    local units = { "B", "KiB", "MiB", "GiB", "TiB" }
    local u = 1
    while n >= 1024 and u < #units and n % 1024 == 0 do n, u = n // 1024, u + 1 end
    if u == 1 and n >= 10240 then return ("%.1f KiB"):format(n / 1024) end
    return ("%d %s"):format(n, units[u])
  end

  -- Byte counts of one column in one unit: the largest the column's biggest
  -- value reaches, named once (in the header), so rows compare at a glance.
  local function byte_unit(values)
    local max = 0
    for _, v in ipairs(values) do max = math.max(max, v) end
    for _, u in ipairs { { "GiB", 1 << 30 }, { "MiB", 1 << 20 }, { "KiB", 1 << 10 } } do
      if max >= u[2] then return u[1], u[2] end
    end
    return "B", 1
  end

  local function in_unit(v, div)
    local x = v / div
    if x == math.floor(x) then return ("%d"):format(math.floor(x)) end
    return ("%.1f"):format(x)
  end

  -- The tasks a child is executing now; the other "running" tasks were
  -- handed to a worker and wait in its queue (queue_depth) for it.
  local function executing(w)
    local now = {}
    for _, c in ipairs(w:children()) do if c.task then now[c.task] = c.name end end
    return now
  end

  -- The state users see: the engine's "running" means handed to a worker,
  -- and orch:task marks those still waiting in its queue (queue_depth) as
  -- queued, so that "running" is only what a child executes now.
  local function shown_state(t)
    return t.queued and "queued" or t.state
  end

  local function dispatch_line(w)
    local d = w:dispatch()
    local parts = { d.held and "dispatch held" or "dispatch free" }
    if d.step_left > 0 then parts[#parts + 1] = ("%d steps left"):format(d.step_left) end
    if d.breakpoints > 0 then
      parts[#parts + 1] = ("%d breakpoint%s"):format(d.breakpoints, d.breakpoints == 1 and "" or "s")
    end
    if d.running > 0 then
      local n = 0
      for _ in pairs(executing(w)) do n = n + 1 end
      n = math.min(n, d.running)
      parts[#parts + 1] = ("%d running"):format(n)
      if d.running > n then parts[#parts + 1] = ("%d queued for workers"):format(d.running - n) end
    end
    if d.caught then
      parts[#parts + 1] = ("caught the failure of task %d: inspect, fix, then :retry %d; :release accepts it"):format(
        d.caught, d.caught)
    end
    if d.break_task and d.held then
      local orch = w:orch()
      local ok, t = pcall(function() return orch:task(d.break_task) end)
      if ok and t.state == "ready" then
        parts[#parts + 1] = ("stopped at a breakpoint before %s"):format(describe(w, t))
      end
    end
    return table.concat(parts, ", ")
  end

  -- Task states are read after the scheduler has wired every submit so far
  -- (w:sync), so a task just submitted shows as ready, not as a transient pending.
  local function snapshot(w, orch)
    w:sync()
    local s = {}
    if orch then for _, t in ipairs(orch:tasks()) do s[t.id] = shown_state(t) end end
    return s
  end

  -- More lines than this and :step/:release summarise (a screenful, less
  -- the prompt and the summary).
  local function screenful()
    return math.max(10, (math.tointeger(tonumber(os.getenv("LINES") or "")) or 24) - 4)
  end

  local function move_line(w, t, was)
    return ("%s: %s -> %s%s%s"):format(describe(w, t), was, shown_state(t), t.worker_name and
      ((t.queued and " for " or " on ") .. t.worker_name) or "",
      t.error and (": " .. t.error:match("[^\n]*")) or "")
  end

  -- After tasks moved: one line per task whose state changed, or, when more
  -- than a screenful changed, a count per transition and the failures; then
  -- why dispatch stopped.
  local function report_moves(w, orch, before)
    local moves = {}
    if orch then
      for _, t in ipairs(orch:tasks()) do
        local was = before[t.id]
        if was and was ~= shown_state(t) then moves[#moves + 1] = { t = t, was = was } end
      end
    end
    if #moves == 0 then out("no task changed state") end
    if #moves <= screenful() then
      for _, m in ipairs(moves) do out("%s", move_line(w, m.t, m.was)) end
    else
      local count, order, failed = {}, {}, {}
      for _, m in ipairs(moves) do
        local key = m.was .. " -> " .. shown_state(m.t)
        if not count[key] then order[#order + 1] = key end
        count[key] = (count[key] or 0) + 1
        if m.t.state == "failed" then failed[#failed + 1] = m end
      end
      out("%d tasks changed state:", #moves)
      for _, key in ipairs(order) do out("  %-24s %d", key, count[key]) end
      local show = math.min(#failed, 5)
      for i = 1, show do out("%s", move_line(w, failed[i].t, failed[i].was)) end
      if #failed > show then out("... %d more failed", #failed - show) end
      out("(:dag STATE lists the tasks in a state)")
    end
    out("(%s)", dispatch_line(w))
  end

  local function wait_report(w, orch, before, ok)
    if not ok then out("tasks are still running (:dag shows them; :release or :finish goes on)") end
    report_moves(w, orch, before)
  end

  local function int_arg(rest, what, default)
    if rest == "" then return default end
    local n = math.tointeger(tonumber(rest))
    if not n or n < 1 then problem("%s: expected a positive whole number (got '%s')", what, rest) end
    return n
  end

  -- ---- the commands -------------------------------------------------------

  -- Ctrl-C while a command waits: the error of ptolua's interrupt hook
  -- ("interrupted!") or of a pto call it interrupted.
  local function interrupted(err)
    if type(err) == "table" and getmetatable(err) == Problem then err = err.msg end
    return type(err) == "string" and (err:find("interrupted!$") or err:find("interrupted", 1, true)) ~= nil
  end

  local function add(name, usage, help, fn)
    repl.add_command(name, help, function(rest)
      local ok, err = pcall(fn, rest)
      if ok then return err end
      if interrupted(err) then
        local w = worker(true)
        local okl, line = pcall(dispatch_line, w)
        io.stdout:write(("interrupted :%s%s\n"):format(name, w and okl and (" (" .. line .. ")") or ""))
        return nil
      end
      if getmetatable(err) == Problem then
        io.stdout:write(err.msg, "\n")
        return nil
      end
      error(err, 0)
    end, usage)
  end

  -- :break TAB: the current Worker's callable names.
  function repl.callable_names()
    local w = worker(true)
    local names = {}
    if w then for _, c in ipairs(w:callables()) do if c.name then names[#names + 1] = c.name end end end
    return names
  end

  add("use", "[expr]", "the Worker the commands act on (default: the newest with an open run, else the newest)",
    function(rest)
      if rest ~= "" then
        local f, err = load("return " .. rest, "=:use", "t")
        if not f then problem(":use: %s", err) end
        local w = try(f)
        if not live(w) then problem(":use: %s is not an open Worker", tostring(w)) end
        chosen = w
      end
      local w = worker(true)
      if not w then out("no Worker yet") return end
      out("using %s%s", tostring(w), w:orch() and ", with an open run" or "")
    end)

  add("hold", nil, "stop dispatching ready tasks (submits still build the DAG)", function()
    local w = worker()
    try(w.hold, w)
    out("dispatch held: submits build the DAG; :step [n] runs tasks, :release resumes")
  end)

  add("step", "[n]", "let the next n ready tasks (default 1) run, and wait for them", function(rest)
    local n = int_arg(rest, ":step", 1)
    local w = worker()
    local orch = w:orch()
    local before = snapshot(w, orch)
    local ok = try(w.step, w, n)
    wait_report(w, orch, before, ok)
  end)

  -- A handle from a Lua expression, or a callable's registered name.
  local function find_callable(w, rest, who)
    local f = load("return " .. rest, "=" .. who, "t")
    if f then
      local ok, v = pcall(f)
      if ok and debug.getmetatable(v) == debug.getregistry()["pto.Handle"] then return v end
    end
    local names = {}
    for _, c in ipairs(w:callables()) do
      if c.name == rest then return c.handle end
      names[#names + 1] = c.name or tostring(c.handle)
    end
    problem("%s: '%s' is neither a handle from Worker:register nor the name of a callable registered on this Worker "
      .. "(registered: %s)", who, rest, #names > 0 and table.concat(names, ", ") or "none")
  end

  -- Stop on failure prints the failure when it is caught: the prompt calls this after every line,
  -- so a task that fails while the user types (or while w:wait waits) is named before the next
  -- prompt, once per catch. reported[w]: the caught task already shown (a :retry or :release
  -- forgets it, so a retry that fails again is shown again).
  local reported = setmetatable({}, { __mode = "k" })
  function repl.after_line()
    for _, w in ipairs(workers()) do
      local ok, d = pcall(w.dispatch, w)
      local caught = ok and d.caught or nil
      if caught and reported[w] ~= caught then
        reported[w] = caught
        local orch = w:orch()
        local okt, t = pcall(function() return orch:task(caught) end)
        local e = okt and t.error and t.error:match("[^\n]*") or ("task " .. caught .. " failed")
        out("caught: %s; dispatch is held: inspect, fix, then :retry %d; :release accepts the failure", e, caught)
      elseif not caught then
        reported[w] = nil
      end
    end
  end

  add("catch", "[on|off]", "stop on failure: a failed task holds dispatch before its consumers are poisoned", function(rest)
    local w = worker()
    if rest == "on" or rest == "off" then try(w.set_catch, w, rest == "on")
    elseif rest ~= "" then problem(":catch: expected on or off (got '%s')", rest) end
    out("failures are %s on %s", w.catch and "caught (dispatch holds at one; :retry N or :release)" or "not caught",
      tostring(w))
  end)

  add("retry", "N [callable]", "run the caught failed task N again (as callable, one registered since, e.g. a fixed "
    .. "one); on success the run goes on as if it had not failed", function(rest)
    local n, as = rest:match("^(%S+)%s*(.-)$")
    local id = math.tointeger(tonumber(n or ""))
    if not id then problem(":retry: expected a task id (got '%s')", rest) end
    local w = worker()
    local orch = open_orch(w)
    local h = as ~= "" and find_callable(w, as, ":retry") or nil
    local before = snapshot(w, orch)
    if w:dispatch().caught == id then reported[w] = nil end   -- a retry that fails again is news again
    local ok = try(w.retry, w, id, h)
    wait_report(w, orch, before, ok)
  end)

  add("release", nil, "dispatch freely again (accepting a caught failure), and wait until tasks finish or a breakpoint stops them", function()
    local w = worker()
    local orch = w:orch()
    local before = snapshot(w, orch)
    try(w.release, w)
    local ok = try(w.wait, w)
    wait_report(w, orch, before, ok)
  end)

  add("break", "[callable]", "hold dispatch before any task of callable (a handle or its registered name); alone: list them",
    function(rest)
      local w = worker()
      if rest == "" then
        local names = w:dispatch().breaks or {}
        if #names == 0 then out("no breakpoints") end
        for _, name in ipairs(names) do out("break before %s", name) end
        return
      end
      try(w.set_break, w, find_callable(w, rest, ":break"))
      out("dispatch will hold before any task of %s", rest)
    end)

  add("unbreak", "[callable]", "remove that breakpoint, or all", function(rest)
    local w = worker()
    if rest == "" then
      try(w.clear_break, w)
      out("no breakpoints")
      return
    end
    try(w.clear_break, w, find_callable(w, rest, ":unbreak"))
    out("breakpoint on %s removed", rest)
  end)

  local STATES = { pending = true, ready = true, running = true, queued = true, completed = true, consumed = true,
    failed = true, free = true }

  -- :dag's filter words: a state, an id or id range (N, N-M), worker=NAME
  -- (a prefix: "worker=chip" is every chip, spaces may be left out),
  -- callable=NAME or a bare callable name, and "all" (no row limit).
  local function dag_filter(rest)
    local f = { limit = 200 }
    for word in rest:gmatch("%S+") do
      local key, val = word:match("^(%a+)=(.*)$")
      local lo, hi = word:match("^(%d+)%-(%d+)$")
      if word == "all" then
        f.limit = math.huge
      elseif STATES[word] then
        f.state = word
      elseif lo then
        f.lo, f.hi = tonumber(lo), tonumber(hi)
      elseif word:match("^%d+$") then
        f.lo, f.hi = tonumber(word), tonumber(word)
      elseif key == "state" then
        if not STATES[val] then problem(":dag: unknown state '%s'", val) end
        f.state = val
      elseif key == "worker" then
        f.worker = val:gsub("%s", "")
      elseif key == "callable" then
        f.callable = val
      elseif key == "run" then
        f.run = math.tointeger(tonumber(val))
        if not f.run then problem(":dag: run= takes a run id (got '%s')", val) end
      elseif key then
        problem(":dag: unknown filter '%s' (state=, worker=, callable=, run=, an id or N-M, all)", key)
      else
        f.callable = word
      end
    end
    return f
  end

  local function dag_keep(f, row)
    if f.state and row.state ~= f.state then return false end
    if f.lo and (row.t.id < f.lo or row.t.id > f.hi) then return false end
    if f.callable and row.callable ~= f.callable then return false end
    if f.run and row.t.run ~= f.run then return false end
    if f.worker then
      local name = (row.t.worker_name or ""):gsub("%s", "")
      if name:sub(1, #f.worker) ~= f.worker then return false end
    end
    return true
  end

  add("dag", "[filter]", "the open run's tasks (state, kind, callable, worker, fan-in, fan-out, producers; the run of "
    .. "each while submitted runs are outstanding); filter by state, N-M, worker=, callable= (or its name), run=; all: "
    .. "no row limit", function(rest)
    local f = dag_filter(rest)
    local w = worker()
    local orch = open_orch(w)
    w:sync()
    local tasks = orch:tasks()
    out("%d task%s; %s", #tasks, #tasks == 1 and "" or "s", dispatch_line(w))
    if #tasks == 0 then return end
    local by, order, rows = {}, { "pending", "ready", "running", "queued", "completed", "consumed", "failed", "free" }, {}
    for _, t in ipairs(tasks) do
      local state = shown_state(t)
      by[state] = (by[state] or 0) + 1
      rows[#rows + 1] = { t = t, state = state, callable = callable_name(w, t) }
    end
    local summary = {}
    for _, st in ipairs(order) do if by[st] then summary[#summary + 1] = ("%d %s"):format(by[st], st) end end
    out("  by state: %s", table.concat(summary, ", "))
    -- submitted runs share one engine run: a column says whose each task is
    local runs = false
    for _, r in ipairs(rows) do if r.t.run then runs = true break end end
    local cells = { { "id", "state", "kind", "callable", "worker", "in", "out", "producers" } }
    if runs then table.insert(cells[1], 2, "run") end
    local matched = 0
    for _, r in ipairs(rows) do
      if dag_keep(f, r) then
        matched = matched + 1
        if matched <= f.limit then
          local t = r.t
          cells[#cells + 1] = { tostring(t.id), r.state, kind_name(w, t), r.callable, t.worker_name or "-",
            tostring(t.fanin), tostring(t.fanout), table.concat(t.producers, ",") }
          if runs then table.insert(cells[#cells], 2, t.run and tostring(t.run) or "-") end
        end
      end
    end
    if matched == 0 then out("  no task matches '%s'", rest) return end
    columns(cells)
    if matched > f.limit then
      out("  ... %d more (:dag all shows every one; :dag STATE, N-M, worker=, callable= filter; :task N shows one)",
        matched - f.limit)
    end
  end)

  add("task", "N", "one task in full: producers, consumers, tensors with tags, ring and slab, error", function(rest)
    local id = math.tointeger(tonumber(rest))
    if not id then problem(":task: expected a task id (got '%s')", rest) end
    local w = worker()
    local orch = open_orch(w)
    w:sync()
    local t = try(orch.task, orch, id)
    if t.queued then
      -- thread mode hands a task to its kind's queue before a worker takes it
      out("%s: queued for %s (handed to it, not executing yet: :why %d says behind what)", describe(w, t),
        t.worker_name or ("a " .. kind_name(w, t)), t.id)
    else
      out("%s: %s%s", describe(w, t), t.state, t.worker_name and (" on " .. t.worker_name) or "")
    end
    if (t.group_size or 1) > 1 then out("  group of %d members", t.group_size) end
    out("  producers: %s (fan-in %d)", #t.producers > 0 and table.concat(t.producers, ", ") or "none", t.fanin)
    -- the engine's fan-out counts every reference that keeps the task's
    -- outputs alive: its consumers and the scope that has not ended yet
    out("  consumers: %s (fan-out %d: consumers plus references such as its open scope's)",
      #t.consumers > 0 and table.concat(t.consumers, ", ") or "none", t.fanout)
    if t.ring then out("  slab: ring %d, offset %d, %s", t.ring, t.slab_offset, bytes(t.slab_bytes)) end
    if t.tensors and #t.tensors > 0 then
      local rows = {}
      for i, x in ipairs(t.tensors) do
        rows[#rows + 1] = { tostring(i), x.tag, ("%s[%s]"):format(x.dtype, table.concat(x.shape, "x")), bytes(x.nbytes),
          x.ring and ("ring %d +%d"):format(x.ring, x.ring_offset) or ("0x%x"):format(x.address),
          x.member and ("member %d"):format(x.member) or nil }
      end
      out("  tensors:")
      columns(rows)
    end
    if t.error then out("  error: %s", t.error) end
    if t.pmu then
      local counts = {}
      for _, k in ipairs(PMU_EVENTS) do
        if t.pmu[k] then counts[#counts + 1] = ("%s %d"):format(k:gsub("_", "-"), t.pmu[k]) end
      end
      out("  pmu (enable_pmu = %d): %s", t.pmu.set, #counts > 0 and table.concat(counts, ", ") or "nothing counted")
    end
  end)

  -- :why N: one line per reason task N does not run yet.
  local function why_lines(w, orch, t)
    local lines = {}
    local function say(fmt, ...) lines[#lines + 1] = fmt:format(...) end
    local d = w:dispatch()
    local e = (t.error or "?"):match("[^\n]*")
    -- A task its run's cancel (h:cancel) took out shows as consumed, not failed (its run's
    -- bookkeeping finished it): its error, not its state, says it never ran.
    local cancelled = e:match("its run (%d+) was cancelled") or e:match("as run (%d+) was cancelled")
    if cancelled then
      say("its run %s was cancelled: %s", cancelled, e)
    elseif t.state == "completed" or t.state == "consumed" then
      say("it has run: %s", t.state)
    elseif t.state == "failed" then
      if e:find("interrupted", 1, true) or e:find("was cancelled", 1, true) then say("its run was cancelled: %s", e)
      else say("it failed: %s", e) end
      if d.caught == t.id then say("the failure is caught: fix what it needs, then :retry %d; :release accepts it", t.id) end
    elseif t.state == "running" then
      local kids = executing(w)
      if kids[t.id] then
        say("it is running on %s", kids[t.id])
      else
        local busy, busy_children, n = {}, {}, 0
        for _, c in ipairs(w:children()) do
          if c.kind == kind_name(w, t) then
            n = n + 1
            busy_children[#busy_children + 1] = { index = n, task = c.task }
            if c.task then busy[#busy + 1] = ("%s runs task %d"):format(c.name, c.task) end
          end
        end
        if t.pinned then
          local c = nil
          for _, k in ipairs(busy_children) do if k.index == t.pinned then c = k end end
          say("it is pinned to %s %d ({worker = %d}) and queued behind %s", kind_name(w, t), t.pinned, t.pinned,
            c and c.task and ("task %d"):format(c.task) or "its current task")
        else
          say("it is queued for a busy %s (queue_depth): %s", kind_name(w, t),
            #busy > 0 and table.concat(busy, ", ") or "its worker is finishing a task")
        end
      end
    elseif t.state == "pending" then
      for _, p in ipairs(t.producers) do
        local ok, pt = pcall(function() return orch:task(p) end)
        if ok and pt.state ~= "completed" and pt.state ~= "consumed" then
          if pt.state == "failed" and d.caught == pt.id then
            say("producer %s failed and is caught (dispatch held): fix it, then :retry %d; :release accepts the "
              .. "failure and this task will not run", describe(w, pt), pt.id)
          elseif pt.state == "failed" then
            say("producer %s failed, so it will not run: %s", describe(w, pt), (pt.error or "?"):match("[^\n]*"))
          else
            say("it waits for producer %s: %s%s", describe(w, pt), pt.state,
              pt.worker_name and (" on " .. pt.worker_name) or "")
          end
        end
      end
      if #lines == 0 then say("its producers have finished: the scheduler is wiring it (:why again)") end
    elseif t.state == "ready" then
      if d.break_task == t.id and d.held then
        say("a breakpoint on %s stopped dispatch before it (:step runs it, :release frees dispatch)",
          callable_name(w, t))
      elseif d.held then
        say("dispatch is held (:step runs the next ready tasks, :release frees dispatch)")
      end
      local name = callable_name(w, t)
      for _, b in ipairs(d.breaks or {}) do
        if b == name and d.break_task ~= t.id then say("a breakpoint on %s holds dispatch before it", b) end
      end
      local kind = kind_name(w, t)
      local busy, total, by_kind = {}, 0, {}
      for _, c in ipairs(w:children()) do
        if c.kind == kind then
          total = total + 1
          by_kind[total] = c
          if c.task then busy[#busy + 1] = ("%s runs task %d"):format(c.name, c.task) end
        end
      end
      if t.pinned then
        local c = by_kind[t.pinned]
        if c and c.task then
          say("it is pinned to %s ({worker = %d}), which runs task %d", c.name, t.pinned, c.task)
        end
      elseif total > 0 and #busy == total then
        say("every %s is busy: %s", kind, table.concat(busy, ", "))
      end
      if #lines == 0 then say("nothing holds it: it dispatches as soon as a %s takes it", kind) end
    else
      say("it is %s", t.state)
    end
    for _, r in ipairs(w:stats().rings) do
      if r.capacity_bytes > 0 and r.used_bytes * 10 >= r.capacity_bytes * 9 then
        say("heap ring %d is %d%% full (%s of %s): a submit that needs more waits until tasks free their slabs",
          r.ring, r.used_bytes * 100 // r.capacity_bytes, bytes(r.used_bytes), bytes(r.capacity_bytes))
      end
    end
    return lines
  end

  add("why", "N", "why task N is not running yet: producers it waits for, hold, breakpoint, busy workers, ring space",
    function(rest)
    local id = math.tointeger(tonumber(rest))
    if not id then problem(":why: expected a task id (got '%s')", rest) end
    local w = worker()
    local orch = open_orch(w)
    w:sync()
    local t = try(orch.task, orch, id)
    out("%s is %s:", describe(w, t), shown_state(t))
    for _, l in ipairs(why_lines(w, orch, t)) do out("  %s", l) end
  end)

  add("check", "[on|off|warn]", "check mode for the next run: each task checked against its tags (docs/check.md)",
    function(rest)
    local w = worker()
    if rest == "on" or rest == "off" then try(w.set_check, w, rest == "on")
    elseif rest == "warn" then try(w.set_check, w, "warn")
    elseif rest ~= "" then problem(":check: expected on, off or warn (got '%s')", rest) end
    out("check mode is %s for %s's next run%s", w.check == "warn" and "on, findings as warnings," or w.check and "on"
      or "off", tostring(w),
      w:orch() and " (the open run keeps its mode)" or "")
  end)

  add("ready", nil, "the tasks ready to dispatch", function()
    local w = worker()
    local orch = open_orch(w)
    w:sync()
    local n = 0
    for _, t in ipairs(orch:tasks()) do
      if t.state == "ready" then
        n = n + 1
        out("%s", describe(w, t))
      end
    end
    if n == 0 then out("no task is ready") end
    out("(%s)", dispatch_line(w))
  end)

  add("tensormap", nil, "each live buffer and the task that last wrote it", function()
    local w = worker()
    local orch = open_orch(w)
    local entries = orch:tensormap()
    table.sort(entries, function(a, b) return a.address < b.address end)
    if #entries == 0 then out("the TensorMap is empty") return end
    local rows = { { "buffer", "bytes", "writer", "state" } }
    for _, e in ipairs(entries) do
      local ok, t = pcall(orch.task, orch, e.producer)
      rows[#rows + 1] = { e.ring and ("ring %d +%d"):format(e.ring, e.ring_offset) or ("0x%x"):format(e.address),
        bytes(e.nbytes), ok and describe(w, t) or ("task " .. e.producer), ok and shown_state(t) or "?" }
    end
    columns(rows)
  end)

  add("rings", nil, "per heap ring: bytes used and free, high-water mark, slabs, stalls", function()
    local w = worker()
    local rings = w:stats().rings
    local function col(f)
      local vals = {}
      for i, r in ipairs(rings) do vals[i] = f(r) end
      local name, div = byte_unit(vals)
      return vals, name, div
    end
    local used, uu, ud = col(function(r) return r.used_bytes end)
    local free, fu, fd = col(function(r) return r.capacity_bytes - r.used_bytes end)
    local hwm, hu, hd = col(function(r) return r.hwm_bytes end)
    local rows = { { "ring", "used " .. uu, "free " .. fu, "high-water " .. hu, "slabs", "stalls", "stall ms" } }
    for i, r in ipairs(rings) do
      rows[#rows + 1] = { tostring(r.ring), in_unit(used[i], ud), in_unit(free[i], fd), in_unit(hwm[i], hd),
        tostring(r.live_slabs), tostring(r.stalls), ("%.1f"):format(r.stall_ms) }
    end
    columns(rows)
  end)

  add("stats", nil, "the flow-control report with sizing advice", function()
    local w = worker()
    io.stdout:write(w:stats_report())
  end)

  add("runs", nil, "the submitted runs not yet waited for: id, state, tasks submitted / completed / failed", function()
    local w = worker()
    local runs = try(w.runs, w)
    if #runs == 0 then out("%s has no submitted runs outstanding", tostring(w)) return end
    local rows = { { "run", "state", "submitted", "completed", "failed" } }
    for _, h in ipairs(runs) do
      local state, c = h:status()
      rows[#rows + 1] = { tostring(h.id), state, tostring(c.submitted), tostring(c.completed), tostring(c.failed) }
    end
    columns(rows)
  end)

  add("workers", nil, "each child: kind, pid, what it runs now, tasks run", function()
    local w = worker()
    local kids = w:children()
    if #kids == 0 then out("%s has no children running (init it, or open a run)", tostring(w)) return end
    local orch = w:orch()
    local rows = {}
    for _, c in ipairs(kids) do
      local now = "idle"
      if c.task then
        now = "running task " .. c.task
        local ok, t = pcall(function() return orch:task(c.task) end)
        if ok then now = "running " .. describe(w, t) end
        if c.running_ms then now = ("%s for %d ms"):format(now, c.running_ms) end
      end
      rows[#rows + 1] = { c.name, c.pid and ("pid " .. c.pid) or "in-process", now, ("%d task%s run"):format(c.tasks_run, c.tasks_run == 1 and "" or "s") }
    end
    columns(rows)
  end)

  local function path_arg(rest, who)
    if rest == "" then problem("%s: expected a file name", who) end
    return rest
  end

  add("profile", nil, "where the time of the last run went: callables, workers, verdict, critical path", function()
    local w = worker()
    local p = try(w.profile, w)
    if not p then out("%s has not ended a run yet: the profile covers the last run that ended", tostring(w)) return end
    io.stdout:write(tostring(p))
  end)

  repl.arg_kinds.report = "file"
  add("report", "FILE", "write the HTML run report of the last run (profile, timeline, DAG) to FILE", function(rest)
    local path = path_arg(rest, ":report")
    local w = worker()
    if not try(w.profile, w) then problem("%s has not ended a run yet; :report writes the last run that ended", tostring(w)) end
    try(w.report, w, path)
    out("wrote %s", path)
  end)

  add("dot", "FILE [full]", "write the open run's DAG as Graphviz (condensed above 500 tasks unless full)",
    function(rest)
    local opts
    local file = rest:match("^(.-)%s+full$")
    if file then rest, opts = file, { condensed = false } end
    local path = path_arg(rest, ":dot")
    local w = worker()
    local orch = open_orch(w)
    local text = try(orch.dot, orch, opts)
    local f, err = io.open(path, "w")
    if not f then problem(":dot: %s", err) end
    f:write(text)
    f:close()
    out("wrote %s (%d tasks; render with dot -Tsvg %s -o dag.svg)", path, orch:task_count(), path)
  end)

  local trace_files = setmetatable({}, { __mode = "k" }) -- Worker -> the file :trace FILE gave

  add("trace", "[FILE|stop]", "record a Chrome/Perfetto trace into FILE; :trace stop writes it; alone: tracing or not",
    function(rest)
    local w = worker()
    if rest == "" then
      local st = try(w.trace_status, w)
      if not st.active then out("%s is not tracing (:trace FILE starts)", tostring(w)) return end
      out("tracing %s%s: %d events so far%s; :trace stop writes it", tostring(w),
        trace_files[w] and (" into " .. trace_files[w]) or "", st.events,
        st.dropped > 0 and (", %d dropped"):format(st.dropped) or "")
      return
    end
    if rest == "stop" then
      trace_files[w] = nil
      local r = try(w.trace_stop, w)
      out("wrote %s: %d events%s", r.path, r.events, r.dropped > 0 and (", %d dropped"):format(r.dropped) or "")
      return
    end
    try(w.trace_start, w, rest)
    trace_files[w] = rest
    out("tracing %s into %s; :trace stop writes it", tostring(w), rest)
  end)

  add("finish", nil, "end the open run: close its outer scope, drain, report its result or failure", function()
    local w = worker()
    local orch = open_orch(w)
    local n = orch:task_count()
    local held = w:dispatch().held
    local ok, err = pcall(w.close_run, w)
    if ok then
      out("run finished: %d task%s, no failure", n, n == 1 and "" or "s")
    else
      out("run failed: %s", (tostring(err):gsub("^Worker:close_run: ", "", 1)))
    end
    if held then out("(dispatch is still held for the next run: :release frees it)") end
  end)
end
