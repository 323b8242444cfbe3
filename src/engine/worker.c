#include "worker.h"
#include "diag.h"
#include "common.h"
#include "crash.h"
#include "check.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* Lock order, coarse to fine, for every lock the engine takes: callable
 * registry (chip reg_lock, the ship table's mutex) -> worker manager ->
 * worker thread -> scheduler (fail_mu) -> allocator (arena, whose own
 * atfork handlers take it across every fork) -> tensormap. The process
 * module's fork_mu is held across the zygote's fork on purpose (no other
 * fork may inherit the zygote's socket end); the zygote never takes it.
 * PROCESS mode forks the zygote before this Worker has threads, and every
 * child is forked by the single-threaded zygote, so no engine lock is ever
 * held in a child. */

static pthread_once_t hygiene_once = PTHREAD_ONCE_INIT;

/* Keep thread pools of libraries we may link from spinning up threads that a
 * forked child would inherit half-alive; user-set values win. */
static void fork_hygiene(void)
{
    setenv("OMP_NUM_THREADS", "1", 0);
    setenv("OPENBLAS_NUM_THREADS", "1", 0);
    setenv("MKL_NUM_THREADS", "1", 0);
    setenv("BLIS_NUM_THREADS", "1", 0);
}

/* ---- default heap ring size ----
 * The rings are reserved, not committed, so 1 GiB each costs nothing but
 * address space; under an address-space limit (ulimit -v) four of them may
 * not fit next to the arena, which has already halved itself to fit. The
 * default then shrinks, as the arena does, to a power of two that leaves
 * half of the space still free for threads, forks and malloc. A size the
 * user chose is never changed. */
#define RING_DEFAULT (1ull << 30)
#define RING_MIN (1ull << 20)

/* Address space still free under RLIMIT_AS in bytes, or UINT64_MAX. */
static uint64_t as_headroom(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return UINT64_MAX;
    uint64_t used = 0, pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        unsigned long long v;
        if (fscanf(f, "%llu", &v) == 1) pages = v;
        fclose(f);
    }
    long pg = sysconf(_SC_PAGESIZE);
    used = pages * (uint64_t)(pg > 0 ? pg : 4096);
    return (uint64_t)rl.rlim_cur > used ? (uint64_t)rl.rlim_cur - used : 0;
}

static uint64_t ring_default_size(void)
{
    uint64_t free_as = as_headroom(), size = RING_DEFAULT;
    while (size > RING_MIN && size * PTO_MAX_RING_DEPTH > free_as / 2) size /= 2;
    if (size < RING_DEFAULT) {
        static atomic_bool said;
        if (!atomic_exchange(&said, true))
            fprintf(stderr, "pto: heap rings shrunk from 1 GiB to %llu MiB each to fit the address-space limit "
                            "(ulimit -v); set heap_ring_size to choose their size\n",
                    (unsigned long long)(size >> 20));
    }
    return size;
}

pto_worker *pto_worker_new(const pto_worker_config *cfg)
{
    pto_worker_config c = {.level = 3, .mode = PTO_MODE_THREAD};
    if (cfg) c = *cfg;
    if (c.level < 3) {
        pto_set_error("level must be 3 or more (got %d)", c.level);
        return NULL;
    }
    if (c.mode != PTO_MODE_THREAD && c.mode != PTO_MODE_PROCESS) {
        pto_set_error("unknown mode %d (use \"thread\" or \"process\")", c.mode);
        return NULL;
    }
    if (c.heap_ring_size == 0) c.heap_ring_size = ring_default_size();
    if (c.heap_ring_size < PTO_HEAP_ALIGN || c.heap_ring_size > (1ull << 46)) {
        pto_set_error("heap_ring_size must be between %d bytes and 64 TiB (got %llu)", PTO_HEAP_ALIGN,
                      (unsigned long long)c.heap_ring_size);
        return NULL;
    }
    c.heap_ring_size = pto_align_up(c.heap_ring_size, PTO_HEAP_ALIGN);
    if (c.alloc_timeout_ms == 0) c.alloc_timeout_ms = 10000;
    if (c.task_timeout_ms && c.mode == PTO_MODE_THREAD) {
        /* Failing the task would leave its kernel running on the buffers its consumers and the next
         * run reuse. */
        pto_set_error("task_timeout_ms needs process mode: a thread cannot be stopped");
        return NULL;
    }
    if (c.queue_depth <= 0) c.queue_depth = 2;
    if (c.queue_depth > PTO_WT_QCAP) {
        pto_set_error("queue_depth must be at most %d (got %d)", PTO_WT_QCAP, c.queue_depth);
        return NULL;
    }
    pthread_once(&hygiene_once, fork_hygiene);
    pto_worker *w = pto_xcalloc_line(sizeof *w);
    w->cfg = c;
    /* A level-3 THREAD-mode Worker's chips and subs are its own threads:
     * nothing outside this process reads its rings (ring.h). Above level
     * 3 the children may be PROCESS-mode Workers whose chips do. */
    bool private_rings = c.mode == PTO_MODE_THREAD && c.level == 3;
    for (int r = 0; r < PTO_MAX_RING_DEPTH; r++) {
        if (!pto_ring_map(&w->rings[r], c.heap_ring_size, private_rings)) {
            for (int k = 0; k < r; k++) pto_ring_unmap(&w->rings[k]);
            free(w);
            return NULL;
        }
    }
    if (c.start_timeout_ms == 0) c.start_timeout_ms = 10000;
    pto_wm_init(&w->wm, c.mode, c.queue_depth, c.start_timeout_ms);
    if (!pto_sched_init(&w->sched, &w->wm)) {
        pto_wm_destroy(&w->wm);
        for (int r = 0; r < PTO_MAX_RING_DEPTH; r++) pto_ring_unmap(&w->rings[r]);
        free(w);
        return NULL;
    }
    w->wm.cancel = &w->sched.cancel;
    w->wm.run_cancels = &w->sched.run_cancels;
    return w;
}

static int add_leaf(pto_worker *w, int32_t kind, const pto_leaf *leaf)
{
    if (!w) {
        pto_set_error("no Worker");
        return -1;
    }
    if (w->inited) {
        pto_set_error("the Worker is already initialised; add its workers before pto_worker_init");
        return -1;
    }
    if (!leaf || !leaf->run) {
        pto_set_error("the leaf has no run function");
        return -1;
    }
    return pto_wm_add(&w->wm, kind, leaf);
}

int pto_worker_add_next_level(pto_worker *w, const pto_leaf *leaf)
{
    return add_leaf(w, PTO_NEXT_LEVEL, leaf);
}

int pto_worker_add_sub(pto_worker *w, const pto_leaf *leaf) { return add_leaf(w, PTO_SUB, leaf); }

int pto_worker_mode_set(pto_worker *w, int32_t mode)
{
    if (!w) {
        pto_set_error("no Worker");
        return -1;
    }
    if (mode != PTO_MODE_THREAD && mode != PTO_MODE_PROCESS) {
        pto_set_error("unknown mode %d (use \"thread\" or \"process\")", mode);
        return -1;
    }
    /* Leaves are started per mode: the mode is fixed once the first is added. */
    if (w->inited || w->wm.count[PTO_NEXT_LEVEL] || w->wm.count[PTO_SUB]) {
        pto_set_error("the Worker already has workers; set its mode before adding them");
        return -1;
    }
    if (w->cfg.task_timeout_ms && mode == PTO_MODE_THREAD) {
        pto_set_error("task_timeout_ms needs process mode: a thread cannot be stopped");
        return -1;
    }
    w->cfg.mode = mode;
    w->wm.mode = mode;
    return 0;
}

int pto_worker_init(pto_worker *w)
{
    if (!w) {
        pto_set_error("no Worker");
        return -1;
    }
    if (w->inited) {
        pto_set_error("the Worker is already initialised");
        return -1;
    }
    /* Children (PROCESS mode) are forked inside pto_wm_start before its
     * threads exist, and have all started when it returns; the scheduler
     * thread comes last. */
    /* A thread-mode task that takes the process down says which it was. */
    if (w->cfg.mode == PTO_MODE_THREAD) pto_crash_install();
    if (!pto_wm_start(&w->wm, w->sched.ev)) return -1;
    pto_orch_init(&w->orch, w, &w->sched, w->rings, w->cfg.alloc_timeout_ms, &w->shutdown);
    w->orch.task_timeout_ms = w->cfg.task_timeout_ms;
    if (!pto_sched_start(&w->sched)) {
        pto_wm_stop(&w->wm);
        pto_orch_destroy(&w->orch);   /* close destroys it only for an inited Worker */
        return -1;
    }
    w->owner = getpid();
    w->inited = true;
    return 0;
}

pto_orch *pto_run_begin(pto_worker *w)
{
    if (!w || !w->inited) {
        pto_set_error("the Worker is not initialised; call pto_worker_init first");
        return NULL;
    }
    if (w->runs_out.open) {
        pto_set_error("submitted runs are outstanding on this Worker; wait for them and end their session "
                      "(pto_runs_end) before a blocking run");
        return NULL;
    }
    return pto_run_begin_session(w) ? &w->orch : NULL;
}

bool pto_run_begin_session(pto_worker *w)
{
    if (w->orch.open) {
        pto_set_error("a run is already open on this Worker; runs do not nest (submit to the open "
                      "run's orchestrator instead)");
        return NULL;
    }
    if (atomic_load(&w->shutdown)) {
        pto_set_error("the Worker is shut down");
        return false;
    }
    pto_prof_run_begin(&w->sched.prof);
    pto_orch_begin(&w->orch);
    pto_check_run_begin(&w->orch, &w->wm, w->check);
    /* Wake whoever sleeps now, while the first submits are made, rather
     * than one after another as the first task reaches each of them. */
    pto_wm_hot(&w->wm, pto_now_ns() + PTO_HOT_NS, true);
    pto_event_notify(w->sched.ev);
    atomic_store(&w->interrupts, 0);
    w->runs++;
    atomic_store_explicit(&w->sched.run_no, w->runs, memory_order_relaxed);
    pto_diag_run_begin(&w->wm, w->runs);
    return true;
}

int pto_run_end(pto_worker *w)
{
    if (!w || !w->inited || !w->orch.open) {
        pto_set_error("no run is open on this Worker");
        return -1;
    }
    if (w->runs_out.open && (w->runs_out.cur || atomic_load(&w->runs_out.live) > 0)) {
        pto_set_error("the open run is shared by submitted runs; wait for them (pto_run_wait, pto_runs_end)");
        return -1;
    }
    pto_prof_run_draining(&w->sched.prof);
    int rc = pto_orch_end(&w->orch);
    /* After a shutdown the scheduler may still be recording. */
    if (!atomic_load(&w->shutdown)) pto_prof_run_end(&w->sched.prof);
    pto_diag_run_end(&w->wm);
    /* Children that died in this run are back before it returns, so the
     * next run starts with as many live children as the first. */
    pto_wm_settle(&w->wm);
    return rc;
}

void pto_worker_interrupt(pto_worker *w)
{
    if (!w) return;
    atomic_store(&w->sched.cancel, true);
    pto_event_notify(w->sched.ev);
    pto_event_notify(&w->orch.ev);
    /* A second interrupt of the same run stops tasks that are still running
     * in child processes (they fail and their children are replaced). */
    pto_proc *p = atomic_load(&w->wm.proc);
    if (atomic_fetch_add(&w->interrupts, 1) >= 1 && p) pto_proc_kill_busy(p, PTO_KILL_INTERRUPT);
}

void pto_worker_on_block(pto_worker *w, pto_block_fn block, pto_block_fn unblock, void *arg)
{
    w->block = block;
    w->unblock = unblock;
    w->block_arg = arg;
}

void pto_worker_callable_name_set(pto_worker *w, int32_t kind, uint64_t callable, const char *name)
{
    if (!w || !name || !(kind == PTO_SUB || kind == PTO_NEXT_LEVEL)) return;
    pto_sched_name_callable(&w->sched, kind, callable, name);
    if (w->cfg.mode == PTO_MODE_THREAD) pto_crash_name(&w->wm, kind, callable, name);
}

void pto_worker_shutdown(pto_worker *w)
{
    if (!w) return;
    atomic_store(&w->shutdown, true);
    pto_event_notify(&w->orch.ev);
    /* Nothing will wait for a task still running in a child. */
    pto_proc *p = atomic_load(&w->wm.proc);
    if (p) pto_proc_kill_busy(p, PTO_KILL_SHUTDOWN);
}

void pto_worker_close(pto_worker *w)
{
    if (!w) return;
    /* A forked copy (a child's garbage collector, say) has none of the
     * threads to join nor the children to stop: leave the original alone. */
    if (w->inited && w->owner != getpid()) return;
    pto_worker_shutdown(w);
    if (w->inited) {
        pto_sched_stop(&w->sched);
        pto_wm_stop(&w->wm);
        pto_orch_destroy(&w->orch);
    }
    pto_crash_forget(&w->wm);
    pto_runs_destroy(&w->runs_out);
    pto_sched_destroy(&w->sched);
    pto_wm_destroy(&w->wm);
    for (int r = 0; r < PTO_MAX_RING_DEPTH; r++) pto_ring_unmap(&w->rings[r]);
    free(w);
}

void *pto_worker_ring_base(pto_worker *w, int32_t r)
{
    return w && r >= 0 && r < PTO_MAX_RING_DEPTH ? w->rings[r].base : NULL;
}

int pto_worker_count(pto_worker *w, int32_t kind)
{
    return w && pto_kind_valid(kind) ? w->wm.count[kind] : 0;
}

int pto_worker_ship_callable(pto_worker *w, int32_t kind, uint64_t callable, const void *blob, size_t len)
{
    if (!w) {
        pto_set_error("no Worker");
        return -1;
    }
    if (!pto_kind_valid(kind)) {
        pto_set_error("unknown worker kind %d", kind);
        return -1;
    }
    if (!blob || len == 0) {
        pto_set_error("nothing to ship for callable %llu (empty blob)", (unsigned long long)callable);
        return -1;
    }
    /* THREAD mode runs every leaf in this process: nothing to ship. */
    if (w->cfg.mode != PTO_MODE_PROCESS) return 0;
    return pto_ship_add(&w->wm.ships, kind, callable, blob, len) != 0 ? -1 : 0;
}

int pto_worker_child_pid(pto_worker *w, int32_t kind, int32_t index)
{
    if (!w || !pto_kind_valid(kind) || index < 0 || index >= w->wm.count[kind]) return -1;
    pto_child *c = w->wm.threads[kind][index]->child;
    pto_proc *p = atomic_load(&w->wm.proc);
    return c && p ? pto_proc_child_pid(p, c->slot) : -1;
}

int64_t pto_worker_current_task(pto_worker *w, int32_t kind, int32_t index)
{
    if (!w || !pto_kind_valid(kind) || index < 0 || index >= w->wm.count[kind]) return -1;
    return atomic_load_explicit(&w->wm.threads[kind][index]->current_task, memory_order_relaxed);
}

int pto_worker_child_info_get(pto_worker *w, int32_t kind, int32_t index, pto_child_info *out)
{
    if (!w || !pto_kind_valid(kind) || index < 0 || index >= w->wm.count[kind]) {
        pto_set_error("no %s worker %d", kind == PTO_SUB ? "sub" : "next-level", index + 1);
        return -1;
    }
    const pto_worker_thread *wt = w->wm.threads[kind][index];
    memset(out, 0, sizeof *out);
    out->pid = w->cfg.mode == PTO_MODE_PROCESS ? pto_worker_child_pid(w, kind, index) : 0;
    out->current_task = atomic_load_explicit(&wt->current_task, memory_order_relaxed);
    out->tasks_run = atomic_load_explicit(&wt->tasks_run, memory_order_relaxed);
    uint64_t t0 = atomic_load_explicit(&wt->task_started_ns, memory_order_relaxed);
    if (out->current_task >= 0 && t0) {
        uint64_t now = pto_now_ns();
        out->running_ns = now > t0 ? (int64_t)(now - t0) : 0;
    }
    return 0;
}

/* ---- dispatch control ---- */

static bool dispatch_check(pto_worker *w)
{
    if (w && w->inited && !atomic_load(&w->shutdown)) return true;
    pto_set_error("the Worker is not initialised (call pto_worker_init first) or is shut down");
    return false;
}

int pto_dispatch_hold(pto_worker *w, int32_t hold)
{
    if (!dispatch_check(w)) return -1;
    pto_sched_hold(&w->sched, hold != 0);
    return 0;
}

int pto_dispatch_step(pto_worker *w, int64_t n)
{
    if (!dispatch_check(w)) return -1;
    if (n < 1) {
        pto_set_error("the number of tasks to step must be at least 1 (got %lld)", (long long)n);
        return -1;
    }
    if (!atomic_load(&w->sched.held)) {
        pto_set_error("dispatch is not held, so every ready task already runs; hold it first "
                      "(pto_dispatch_hold)");
        return -1;
    }
    pto_sched_step(&w->sched, n);
    return 0;
}

int pto_dispatch_break(pto_worker *w, int32_t kind, uint64_t callable, int32_t on)
{
    if (!w) return -1;
    if (!pto_kind_valid(kind)) {
        pto_set_error("unknown worker kind %d", kind);
        return -1;
    }
    return pto_sched_break(&w->sched, kind, callable, on != 0);
}

int pto_dispatch_wait(pto_worker *w, int32_t timeout_ms)
{
    if (!dispatch_check(w)) return -1;
    uint64_t t0 = pto_now_ns();
    bool quiet = pto_sched_wait_quiet(&w->sched, timeout_ms < 0 ? 0 : timeout_ms);
    pto_prof_waited(&w->sched.prof, t0);   /* not orchestration: the profile leaves it out */
    return quiet ? 1 : 0;
}

int pto_dispatch_sync(pto_worker *w)
{
    if (!dispatch_check(w)) return -1;
    pto_sched_sync(&w->sched);
    return 0;
}

int32_t pto_dispatch_breakpoints(pto_worker *w, int32_t *kinds, uint64_t *callables, int32_t cap)
{
    if (!w) return 0;
    pto_scheduler *s = &w->sched;
    pthread_mutex_lock(&s->gate_mu);
    int32_t n = s->nbreaks;
    for (int32_t i = 0; i < n && i < cap; i++) {
        kinds[i] = s->breaks[i].kind;
        callables[i] = s->breaks[i].callable;
    }
    pthread_mutex_unlock(&s->gate_mu);
    return n;
}

void pto_dispatch_get(pto_worker *w, pto_dispatch_state *out)
{
    memset(out, 0, sizeof *out);
    if (!w) return;
    pto_scheduler *s = &w->sched;
    pthread_mutex_lock(&s->gate_mu);
    out->breakpoints = s->nbreaks;
    pthread_mutex_unlock(&s->gate_mu);
    out->held = atomic_load(&s->held);
    out->step_left = atomic_load(&s->step_left);
    out->break_task = atomic_load(&s->break_task);
    out->running = atomic_load(&s->nrunning);
    out->caught_task = atomic_load(&s->caught_task);
}

int pto_worker_check_set(pto_worker *w, int32_t on)
{
    if (!w) {
        pto_set_error("no Worker");
        return -1;
    }
    if (on < 0 || on > PTO_CHECK_WARN) {
        pto_set_error("check mode is 0 (off), 1 (on) or 2 (findings are warnings), not %d", (int)on);
        return -1;
    }
    w->check = on;
    return 0;
}

int32_t pto_worker_check(pto_worker *w) { return w ? w->check : 0; }

int pto_worker_catch_set(pto_worker *w, int32_t on)
{
    if (!w) {
        pto_set_error("no Worker");
        return -1;
    }
    atomic_store(&w->sched.catch_on, on != 0);
    return 0;
}

int32_t pto_worker_catch(pto_worker *w) { return w && atomic_load(&w->sched.catch_on) ? 1 : 0; }

int pto_dispatch_retry(pto_worker *w, int64_t id) { return pto_dispatch_retry_as(w, id, -2, 0); }

int pto_dispatch_retry_as(pto_worker *w, int64_t id, int32_t kind, uint64_t callable)
{
    if (!dispatch_check(w)) return -1;
    if (id < 0) {   /* the scheduler's "no request" is -1: a negative id would never be answered */
        pto_set_error("task id %lld is not a task (ids start at 0)", (long long)id);
        return -1;
    }
    if (kind < -2 || kind > PTO_SUB) {   /* -2: as submitted (pto_dispatch_retry), -1: the task's own kind */
        pto_set_error("kind %d is not a worker kind (PTO_NEXT_LEVEL, PTO_SUB, or -1: the task's own)", (int)kind);
        return -1;
    }
    int r = pto_sched_retry(&w->sched, id, kind, callable);
    if (r == 2) {
        pto_set_error("task %lld is not a %s task: retry it with a callable of its own kind", (long long)id,
                      kind == PTO_SUB ? "sub" : "next-level");
        return -1;
    }
    if (r != 1) {
        pto_set_error("task %lld is not a caught failure (catch failures first; a task is caught when it fails "
                      "while they are, and stays caught until it is retried or dispatch is released)",
                      (long long)id);
        return -1;
    }
    return 0;
}
