-- mpi_spec.lua: level-3 Workers on other MPI ranks (issue 15, docs/mpi.md).
-- Each case is a job: `mpirun -np N ptolua spec/fixtures/<script>` (every
-- rank runs the script; rank 0 prints what it checked). CMake registers
-- this spec only where the build has MPI and mpirun is installed
-- ($PTO_MPIRUN), and says why otherwise.
local pto = require "pto"
local H = require "helpers"

local MPIRUN = assert(os.getenv("PTO_MPIRUN"), "PTO_MPIRUN is not set (spec/CMakeLists.txt sets it)")
local PTOLUA = assert(os.getenv("PTOLUA"), "PTOLUA is not set")
local SRC = os.getenv("PTO_SOURCE_DIR") or "."

-- Open MPI's shared-memory segments go to a directory of this spec's own,
-- not /dev/shm: specs running beside this one check /dev/shm for leftovers,
-- and this one checks that a job leaves nothing in its directory.
local SEGDIR = os.tmpname()
os.remove(SEGDIR)
assert(os.execute("mkdir -p " .. SEGDIR))

-- Passed to every job's script as an argument (ignored there), so that its
-- processes, forked children included, are told from those of another job.
local TOKEN = "pto-mpi-spec-" .. SEGDIR:match("[^/]+$")

local function segments_left()
  local p = assert(io.popen("ls -A " .. SEGDIR))
  local left = {}
  for name in p:lines() do left[#left + 1] = name end
  p:close()
  return left
end

-- Run a job; returns its output (stdout and stderr), exit status and pto.now() at its end.
-- Under ASan the ranks (not mpirun) get $PTO_MPI_RANK_PRELOAD (spec/CMakeLists.txt),
-- and unwind stacks at malloc the slow way: Open MPI is built without frame
-- pointers, so its leaks would otherwise end in "<unknown module>" frames no
-- suppression can name.
local PRELOAD = os.getenv("PTO_MPI_RANK_PRELOAD")
local ASAN = (os.getenv("ASAN_OPTIONS") and os.getenv("ASAN_OPTIONS") .. ":" or "") .. "fast_unwind_on_malloc=0"
local function job(np, script, script_args)
  local cmd = ("OMPI_MCA_btl_vader_backing_directory=%s timeout -s KILL 120 %s --allow-run-as-root --oversubscribe %s "
               .. "-np %d %s %s/%s %s 2>&1; echo \"exit=$?\"")
    :format(SEGDIR, MPIRUN, PRELOAD and ("-x LD_PRELOAD=" .. PRELOAD .. " -x ASAN_OPTIONS=" .. ASAN) or "",
            np, PTOLUA, SRC, script, script_args or TOKEN)
  local p = assert(io.popen(cmd))
  local out = p:read("a")
  p:close()
  local t = pto.now()
  local code = tonumber(out:match("exit=(%d+)%s*$"))
  return out, code, t
end

-- The tree fixture runs once per mode; its checks are spread over the tests below.
local tree_out, tree_code
local function tree()
  if not tree_out then tree_out, tree_code = job(3, "spec/fixtures/mpi_tree.lua") end
  return tree_out
end
local function assert_checks(...)
  local out = tree()
  for _, name in ipairs{...} do
    local line = out:match("check " .. name .. " ([^\n]*)")
    assert(line, ("check %s did not run; the job printed:\n%s"):format(name, out))
    assert(line == "ok", ("check %s: %s"):format(name, line))
  end
end

-- Processes of this spec's jobs: their command line holds TOKEN (forked children keep their parent's).
local function processes_of()
  local p = assert(io.popen("grep -l -a -F " .. TOKEN .. " /proc/[0-9]*/cmdline 2>/dev/null"))
  local found = {}
  for line in p:lines() do
    local pid = tonumber(line:match("/proc/(%d+)/"))
    local f = io.open(("/proc/%d/cmdline"):format(pid))
    local cmd = f and f:read("a") or ""
    if f then f:close() end
    -- not this grep, nor the shells that started a job
    if cmd:find("ptolua", 1, true) and not cmd:find("grep", 1, true) then found[#found + 1] = pid end
  end
  p:close()
  return found
end

local function shm_entries()
  local set = {}
  local p = assert(io.popen("ls /dev/shm 2>/dev/null"))
  for name in p:lines() do set[name] = true end
  p:close()
  return set
end

describe("pto.mpi without an MPI launch", function()
  it("says rank 0 of 1, and that this build has MPI", function()
    assert.equal(0, pto.mpi.rank())
    assert.equal(1, pto.mpi.size())
    assert.is_true(pto.mpi.available())
  end)

  it("refuses rank = r, saying to start the script with mpirun", function()
    H.assert_error(function() pto.Worker{level = 3, rank = 1} end, "pto.Worker: rank = 1 places the Worker on MPI rank 1",
                   "start it with mpirun -np N ptolua script.lua")
    H.assert_error(function() pto.Worker{level = 3, rank = 0} end, "pto.Worker: rank must be")
  end)
end)

describe("an L4 over L3s on ranks 1 and 2 (mpirun -np 3)", function()
  it("runs 100 times in a row in thread mode on rank 0, then closes: every rank exits 0; a second tree is refused", function()
    assert_checks("mode", "runs100", "closed", "second_tree")
    assert.equal(0, tree_code, tree())
    assert.truthy(tree():find("rank 1 pid %d+"), tree())
    assert.is_true(H.eventually(function() return #processes_of() == 0 end, 5),
                   "left: " .. table.concat(processes_of(), " "))
    assert.same({}, segments_left())
  end)

  it("sends INPUT and INOUT bytes, gets OUTPUT and INOUT bytes back, views as their byte ranges only", function()
    assert_checks("args", "input_not_returned", "out_existing")
  end)

  it("brings the remote L3 orchestration functions' results back: single, prepared and group submits", function()
    assert_checks("results")
  end)

  it("wraps a remote failure with rank, host and pid, keeps the root cause; the next run works", function()
    assert_checks("fail_raises", "fail_names_rank", "fail_root_cause", "fail_traceback", "fail_next_run")
  end)

  H.process_only("fails a task whose remote chip child was killed, replaces the child, runs on", "a chip is a thread in THREAD mode",
    function() assert_checks("chipkill_raises", "chipkill_named", "chipkill_next_run") end)

  it("reports the remote L3s in stats() and print_stats()", function()
    assert_checks("stats", "report")
  end)

  it("traces the remote ranks' runs on rank 0's time line", function()
    assert_checks("trace_remote", "trace_timeline")
  end)

  it("ships a function registered on the L4 after init to the remote ranks", function()
    assert_checks("shipped")
  end)
end)

describe("examples/mpi_bgemm.lua (mpirun -np 3)", function()
  it("checks its result against a reference and equals the run over two local L3s", function()
    local out, code = job(3, "examples/mpi_bgemm.lua", "")   -- its arguments are sizes
    assert.equal(0, code, out)
    assert.truthy(out:find("on ranks 1 and 2 (3 MPI ranks)", 1, true), out)
    assert.truthy(out:find("mpi_bgemm: result OK", 1, true), out)
    assert.truthy(out:find("mpi_bgemm: equal to the run over two local L3s", 1, true), out)
    assert.truthy(out:find("== L3 worker 2 (rank 2 on host", 1, true), out)
  end)
end)

describe("a remote L3 that cannot start", function()
  it("fails w4:init() naming rank, host, pid and cause; the job still ends", function()
    local out, code = job(3, "spec/fixtures/mpi_badinit.lua")
    assert.equal(0, code, out)   -- the script caught the error; every rank was stopped and exited 0
    local line = out:match("init raised: ([^\n]*)")
    assert(line, out)
    assert.truthy(line:find("Worker:init: L3 worker 2 (rank 2 on host ", 1, true), line)
    assert.truthy(line:find(", pid %d+%): its level%-3 Worker: chip 1 %(pid %d+%) failed to start"), line)
    assert.truthy(line:find("/nonexistent/libchip.so", 1, true), line)
    assert.is_true(H.eventually(function() return #processes_of() == 0 end, 5),
                   "left: " .. table.concat(processes_of(), " "))
  end)
end)

describe("a lost rank", function()
  it("ends the job non-zero within 10 s, naming the rank, leaving no process and no /dev/shm entry", function()
    local before = shm_entries()
    local out, code, t_end = job(3, "spec/fixtures/mpi_lost.lua")
    assert.is_not.equal(0, code, out)
    local killed = tonumber(out:match("kills itself at ([%d.]+)"))
    assert(killed, out)
    assert.is_true(t_end - killed < 10, ("mpirun took %.1f s to end after the kill:\n%s"):format(t_end - killed, out))
    assert.truthy(out:find("rank 2", 1, true), out)
    assert.is_true(H.eventually(function() return #processes_of() == 0 end, 5),
                   "left: " .. table.concat(processes_of(), " "))
    assert.same({}, segments_left())
    local new = {}
    for name in pairs(shm_entries()) do
      if not before[name] and (name:find("vader") or name:find("ompi") or name:find("pmix") or name:find("pto")) then
        new[#new + 1] = name
      end
    end
    assert.same({}, new)
  end)
end)

teardown(function() os.execute("rm -rf " .. SEGDIR) end)

describe("misuse under mpirun -np 2", function()
  it("names the problem and what to do", function()
    local out, code = job(2, "spec/fixtures/mpi_misuse.lua")
    assert.equal(0, code, out)
    local function says(name, prefix, fragment)
      local line = out:match("misuse " .. name .. " ([^\n]*)")
      assert(line, out)
      line = H.strip_position(line)
      assert.equal(prefix, line:sub(1, #prefix), line)
      assert.truthy(line:find(fragment, 1, true), line)
    end
    says("out_of_range", "pto.Worker: rank = 2 is out of range", "start more with mpirun -np 3")
    says("level4", "pto.Worker: rank = 1: only a level-3 Worker", "add it to a level-4 Worker")
    says("two_on_one_rank", "Worker:add_worker: Worker child 1 already lives on MPI rank 1", "give this one another rank")
    says("no_parent", "Worker:run: this Worker has rank = 1", "add it with w4:add_worker(w)")
    says("no_parent_init", "Worker:init: this Worker has rank = 1", "add it with w4:add_worker(w)")
    assert.truthy(out:find("mpi rank 0 size 2 available true", 1, true), out)
  end)
end)
