-- report_html_spec.lua: the HTML run report (w:report, ptolua --report) in a
-- real browser. Headless Chromium loads each file, and the DOM it dumps
-- after the page's script ran is checked: the script finished without an
-- error, one lane per worker at every level, one bar per task, the critical
-- path marked, the DAG drawn; a screenshot must come out as a PNG.
-- Runs once (process mode); spec/CMakeLists.txt registers it as not run when
-- chromium is missing (scripts/setup.sh installs it).
local pto = require "pto"
local F = require "files"
local tmpname, writefile, readfile, q = F.tmpname, F.writefile, F.readfile, F.q

local PTOLUA = assert(os.getenv("PTOLUA"), "set PTOLUA to the ptolua binary")
local CHROMIUM = os.getenv("PTO_CHROMIUM") or "chromium"

local profile_dir = assert(io.popen("mktemp -d")):read("l")

teardown(function()
  F.cleanup()
  os.execute("rm -rf " .. q(profile_dir))
end)

-- Chromium's stdout for file `path` with extra flags; its own chatter on stderr is dropped.
local function chromium(path, flags)
  local cmd = ("%s --headless --no-sandbox --disable-gpu --no-first-run --user-data-dir=%s --hide-scrollbars "
    .. "--window-size=1280,1400 %s file://%s 2>/dev/null"):format(q(CHROMIUM), q(profile_dir), flags, q(path))
  local p = assert(io.popen(cmd, "r"))
  local out = p:read("a")
  p:close()
  return out
end

local function count(s, pat)
  local n = 0
  for _ in s:gmatch(pat) do n = n + 1 end
  return n
end

local function body_attrs(dom) return dom:match("<body([^>]*)>") or "" end

describe("the HTML run report in headless Chromium", function()
  it("w:report(path): the script runs, one lane per worker, one bar per task, the critical path marked", function()
    local w <close> = pto.Worker{chips = 2, num_sub_workers = 1}
    local gemm = w:register(pto.chip_kernel("spin_us"), "gemm")
    local add = w:register(pto.chip_kernel("noop"), "add")
    local sub = w:register(function() end, "check")
    w:run(function(orch)
      local a = pto.tensor{4}
      for i = 1, 4 do
        orch:submit_next_level(gemm, pto.args{{a, "inout"}, scalars = {2000}})
        local b = pto.tensor{4}
        if i <= 3 then   -- three nested scopes, one per step; the fourth step in the run's own scope
          orch:scope(function()
            orch:submit_next_level(add, pto.args{{a, "in"}, {b, "out"}})
            orch:submit_sub(sub, pto.args{{b, "in"}})
          end)
        else
          orch:submit_next_level(add, pto.args{{a, "in"}, {b, "out"}})
          orch:submit_sub(sub, pto.args{{b, "in"}})
        end
      end
    end)
    local p = w:profile()
    local path = tmpname(".html")
    w:report(path)
    local html = readfile(path)
    -- Self-contained: nothing to fetch (the SVG namespace is a name, not a request).
    assert.is_nil(html:find("src=", 1, true))
    assert.is_nil(html:find("<link", 1, true))
    assert.is_nil(html:gsub("http://www.w3.org/2000/svg", ""):find("https?://"))

    local dom = chromium(path, "--dump-dom")
    local body = body_attrs(dom)
    assert.truthy(body:find('data-rendered="ok"', 1, true), body .. "\n" .. dom:sub(1, 2000))
    assert.is_nil(body:find("data-error", 1, true), body)
    assert.truthy(body:find('data-tasks="12"', 1, true), body)
    assert.equal(3, count(dom, '<g class="lane"'))              -- chip 1, chip 2, sub 1
    assert.equal(12, count(dom, '<rect class="task'))
    assert.equal(p.critical_path.count, count(dom, '<rect class="task critical'))
    assert.equal(12, count(dom, '<circle [^>]*class="node'))
    assert.equal(3 + 4 + 4, count(dom, 'class="edge"'))          -- the gemm chain, gemm -> add, add -> check
    assert.equal(3, count(dom, '<rect [^>]*class="scope"'))     -- a box per nested scope
    for k = 1, 3 do assert.truthy(dom:find('data-scope="' .. k .. '"', 1, true), dom) end
    assert.truthy(dom:find('<table class="callables">', 1, true))
    assert.truthy(dom:find("<td>gemm</td>", 1, true))
    assert.truthy(dom:find('<pre class="stats">', 1, true))

    local png = tmpname(".png")
    chromium(path, "--screenshot=" .. q(png))
    local img = readfile(png) or ""
    assert.equal("\137PNG", img:sub(1, 4))
    assert.is_true(#img > 10000, #img .. " bytes")
  end)

  it("ptolua --report: every level of a Worker of Workers gets its lanes", function()
    local script = writefile(tmpname(".lua"), [[
      local l3 = pto.Worker{level = 3, chips = 2, mode = "thread"}
      local k = l3:register(pto.chip_kernel("spin_us"), "inner")
      local w4 <close> = pto.Worker{level = 4, mode = "thread"}
      local f = w4:register(function(orch)
        for _ = 1, 3 do orch:submit_next_level(k, pto.args{{pto.tensor{4}, "out"}, scalars = {1000}}) end
      end, "outer")
      w4:add_worker(l3)
      w4:run(function(orch) orch:submit_next_level(f, pto.args{}, pto.CallConfig()) end)
    ]])
    local path, err = tmpname(".html"), tmpname(".err")
    assert.is_true(os.execute(("%s --profile --report %s %s 2>%s"):format(q(PTOLUA), q(path), q(script), q(err))))
    local stderr = readfile(err)
    assert.truthy(stderr:find("ptolua --profile: Worker 2: Worker(level 4", 1, true), stderr)
    assert.truthy(stderr:find("\n  Profile of run 1 (level 3, thread mode): 3 tasks", 1, true), stderr)
    local dom = chromium(path, "--dump-dom")
    local body = body_attrs(dom)
    assert.truthy(body:find('data-rendered="ok"', 1, true), body)
    assert.truthy(body:find('data-tasks="1"', 1, true), body)
    assert.equal(3, count(dom, '<g class="lane"'))               -- Worker 1, Worker 1 / chip 1, Worker 1 / chip 2
    assert.truthy(dom:find('data-name="Worker 1 / chip 2"', 1, true))
    assert.equal(4, count(dom, '<rect class="task'))
  end)

  it("condenses the DAG of a run of more than 3000 tasks into groups with counts, every task in one", function()
    local w <close> = pto.Worker{chips = 2}
    local gemm = w:register(pto.chip_kernel("spin_us"), "gemm")
    local add = w:register(pto.chip_kernel("noop"), "add")
    local fail = w:register(pto.chip_kernel("fail"), "bad")
    local N = 9999   -- 2 tasks each, and 3 more: 20001 tasks
    pcall(w.run, w, function(orch)
      local acc = pto.tensor{4}
      for _ = 1, N do
        orch:scope(function()   -- depth 1: gemm into a temporary, add it into acc (a chain of adds)
          local t = pto.tensor{4}
          orch:submit_next_level(gemm, pto.args{{t, "out"}, scalars = {0}})
          orch:submit_next_level(add, pto.args{{t, "in"}, {acc, "inout"}})
        end)
      end
      orch:submit_next_level(fail, pto.args{{acc, "inout"}})   -- depth 0: fails, and its two readers are not run
      orch:submit_next_level(add, pto.args{{acc, "in"}, {pto.tensor{4}, "out"}})
      orch:submit_next_level(add, pto.args{{acc, "in"}, {pto.tensor{4}, "out"}})
    end)
    local total = 2 * N + 3
    local path = tmpname(".html")
    w:report(path)
    local html = readfile(path)
    assert.is_true(#html < 5e6, #html .. " bytes")
    local dom = chromium(path, "--dump-dom")
    local body = body_attrs(dom)
    assert.truthy(body:find('data-rendered="ok"', 1, true), body .. "\n" .. dom:sub(1, 2000))
    assert.is_nil(body:find("data-error", 1, true), body)
    assert.truthy(body:find(('data-tasks="%d"'):format(total - 2), 1, true), body)   -- those that ran
    assert.truthy(dom:find(('<svg [^>]*class="dag%%-svg condensed" data%%-tasks="%d"'):format(total)), dom:sub(1, 3000))
    assert.truthy(dom:find(("Condensed: %d tasks in "):format(total), 1, true))
    -- every task in exactly one group: the groups' counts add up to the run's tasks
    local groups, sum = 0, 0
    for n in dom:gmatch('<circle [^>]*data%-count="(%d+)"') do
      groups, sum = groups + 1, sum + tonumber(n)
    end
    assert.equal(total, sum)
    assert.is_true(groups >= 4 and groups <= 100, groups .. " groups")
    assert.equal(0, count(dom, '<circle [^>]*data%-id='))          -- no circle per task
    assert.equal(1, count(dom, '<circle [^>]*class="node failed'))  -- the failing task's group of one
    assert.equal(1, count(dom, '<circle [^>]*class="node poisoned'))  -- its two readers, one group
    assert.equal(1, count(dom, '<rect [^>]*class="scope" data%-depth="1"'))   -- a box for the scopes at depth 1
    assert.is_true(count(dom, 'class="edge"') >= groups - 1)
    assert.equal(total - 2, count(dom, '<rect class="task'))       -- the timeline still has every task
  end)

  it("marks a failed task and the tasks it poisoned differently", function()
    local w <close> = pto.Worker{chips = 1}
    local fail = w:register(pto.chip_kernel("fail"), "bad")
    local noop = w:register(pto.chip_kernel("noop"), "after")
    pcall(w.run, w, function(orch)
      local x = pto.tensor{4}
      orch:submit_next_level(fail, pto.args{{x, "out"}})
      orch:submit_next_level(noop, pto.args{{x, "in"}})
      orch:submit_next_level(noop, pto.args{{x, "in"}})
    end)
    local path = tmpname(".html")
    w:report(path)
    local dom = chromium(path, "--dump-dom")
    assert.truthy(body_attrs(dom):find('data-rendered="ok"', 1, true), body_attrs(dom))
    assert.equal(1, count(dom, '<rect class="task[^"]* failed"'))
    assert.equal(1, count(dom, 'class="node failed'))
    assert.equal(2, count(dom, 'class="node poisoned'))
    assert.equal(2, count(dom, 'class="edge"'))
    assert.truthy(dom:find("1 task (and 2 not run) in ", 1, true))
  end)
end)
