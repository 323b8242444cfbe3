/*
 * pto.h - the public C API of the ptolua engine.
 *
 * Everything between the two "ffi" markers is plain C declarations with no
 * macros and no includes, so LuaJIT's ffi.cdef can read it verbatim (the
 * build extracts it into pto_ffi.h). Constants are enums for that reason.
 *
 * Errors: a function that can fail returns a negative value (or NULL) and
 * leaves a message for the calling thread in pto_errmsg().
 *
 * Names: pto_<object>_<verb> for actions. A getter that returns its value
 * is named after it (pto_worker_count); one that copies into the caller's
 * struct or buffer ends in _get (pto_worker_stats_get), its setter in _set.
 */
#ifndef PTO_H
#define PTO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The engine is compiled with hidden visibility: what this header declares
 * is everything libpto.so exports. (Outside the ffi block: no pragma there.) */
#pragma GCC visibility push(default)

/* ffi-begin */

enum {
    PTO_MAX_DIMS = 5,
    PTO_MAX_RING_DEPTH = 4,
    PTO_MAX_SCOPE_DEPTH = 64,
    PTO_HEAP_ALIGN = 1024,
    PTO_OUTPUT_PREFIX_LEN = 1024
};

typedef enum pto_tag {
    PTO_INPUT = 0,
    PTO_OUTPUT = 1,
    PTO_INOUT = 2,
    PTO_OUTPUT_EXISTING = 3,
    PTO_NO_DEP = 4
} pto_tag;
/* Name of tag ("in", "out", "inout", "out_existing", "no_dep"), or NULL if unknown. */
const char *pto_tag_name(int tag);

typedef enum pto_dtype {
    PTO_F32 = 0, PTO_F16, PTO_BF16, PTO_F64,
    PTO_I8, PTO_I16, PTO_I32, PTO_I64,
    PTO_U8, PTO_U16, PTO_U32, PTO_U64,
    PTO_BOOL,
    PTO_DTYPE_COUNT
} pto_dtype;

typedef enum pto_worker_kind {
    PTO_NEXT_LEVEL = 0,
    PTO_SUB = 1
} pto_worker_kind;

typedef enum pto_mode {
    PTO_MODE_THREAD = 0,
    PTO_MODE_PROCESS = 1
} pto_mode;

typedef enum pto_task_state {
    PTO_TASK_FREE = 0,
    PTO_TASK_PENDING,
    PTO_TASK_READY,
    PTO_TASK_RUNNING,
    PTO_TASK_COMPLETED,
    PTO_TASK_CONSUMED,
    PTO_TASK_FAILED
} pto_task_state;

/* A view of contiguous storage: bytes [base + offset, base + offset + nbytes).
 * Views of one storage share `base`; the TensorMap compares their byte ranges.
 * base == 0 marks an unset OUTPUT that submit allocates from the heap ring.
 * Fixed 40 bytes: it is copied verbatim into the args blob. */
typedef struct pto_tensor {
    uint64_t base;
    uint64_t offset;
    uint32_t shape[5];
    uint8_t dtype;
    uint8_t ndims;
    uint16_t reserved;
} pto_tensor;

/* Execution knobs, copied by value to every level. */
typedef struct pto_call_config {
    int32_t block_dim;
    int32_t aicpu_thread_num;
    int32_t enable_l2_swimlane;
    int32_t enable_dump_tensor;
    int32_t enable_pmu;
    int32_t enable_dep_gen;
    char output_prefix[1024];
} pto_call_config;

/* A task's arguments as a leaf sees them: no tags. Does not own memory. */
typedef struct pto_args_view {
    int32_t tensor_count;
    int32_t scalar_count;
    const pto_tensor *tensors;
    const uint64_t *scalars;
} pto_args_view;

/* A task's arguments as submitted: tensors with one pto_tag each.
 * submit writes the storage it allocates for unset OUTPUT tensors back into
 * tensors[i], so the caller can hand them to later tasks. */
typedef struct pto_task_args {
    int32_t tensor_count;
    int32_t scalar_count;
    pto_tensor *tensors;
    const uint8_t *tags;
    const uint64_t *scalars;
} pto_task_args;

/* A leaf runs one task; returns 0 on success, or non-zero after writing a
 * NUL-terminated reason into err (errlen bytes). Chips, sub workers and nested
 * Workers all implement this one interface. */
typedef int (*pto_leaf_fn)(void *ctx, uint64_t callable, const pto_args_view *args,
                           const pto_call_config *cfg, char *err, size_t errlen);

/* PROCESS mode, in the child: prepare before the first task (e.g. dlopen a
 * chip runtime); 0, or non-zero with a reason in err (init then fails). */
typedef int (*pto_leaf_start_fn)(void *ctx, char *err, size_t errlen);
/* PROCESS mode, in the child: install a callable shipped after the fork
 * (pto_worker_ship_callable) before its first task; 0 or non-zero with err. */
typedef int (*pto_leaf_load_fn)(void *ctx, uint64_t callable, const void *blob, size_t len,
                                char *err, size_t errlen);

/* PROCESS mode, in the child: the Worker is closing and the child will exit
 * (e.g. close a Worker the child hosts, so its own children go first). */
typedef void (*pto_leaf_stop_fn)(void *ctx);

/* Optional, for a leaf that can run several tasks at once (a Worker child
 * runs each as a submitted run, so the tasks a level above stages for it
 * overlap). begin starts one and returns without waiting for it: 0 with
 * *token set, or non-zero with err (the task then failed and has no token);
 * once the task has finished, wake(wake_arg) is called, from any thread.
 * ready(token) says, without waiting, whether end would return at once;
 * end(token) waits for the task and returns as run does. Tasks are ended in
 * the order they began, and at most PTO_LEAF_MAX_BEGUN are begun at once.
 * args and cfg are the caller's only during begin; the tensor memory they
 * point to stays the task's until end returns. */
enum { PTO_LEAF_MAX_BEGUN = 4 };
typedef void (*pto_wake_fn)(void *arg);
typedef int (*pto_leaf_begin_fn)(void *ctx, uint64_t callable, const pto_args_view *args,
                                 const pto_call_config *cfg, pto_wake_fn wake, void *wake_arg, void **token,
                                 char *err, size_t errlen);
typedef int (*pto_leaf_ready_fn)(void *ctx, void *token);
typedef int (*pto_leaf_end_fn)(void *ctx, void *token, char *err, size_t errlen);

typedef struct pto_leaf {
    pto_leaf_fn run;
    void *ctx;
    const char *name;          /* for messages, e.g. "chip 1"; may be NULL */
    pto_leaf_start_fn start;   /* may be NULL */
    pto_leaf_load_fn load;     /* may be NULL: shipped callables then fail */
    pto_leaf_stop_fn stop;     /* may be NULL */
    pto_leaf_begin_fn begin;   /* may be NULL (then also ready and end): one task at a time */
    pto_leaf_ready_fn ready;
    pto_leaf_end_fn end;
} pto_leaf;

typedef struct pto_worker_config {
    int32_t level;               /* >= 3; a diagnostic label at this layer */
    int32_t mode;                /* pto_mode */
    uint64_t heap_ring_size;     /* bytes per ring; 0 = 1 GiB */
    uint32_t alloc_timeout_ms;   /* 0 = 10000 */
    int32_t queue_depth;         /* tasks staged per worker thread; 0 = 2 */
    /* PROCESS mode: children must report ready within this at init; 0 = 10000 */
    uint32_t start_timeout_ms;
    /* PROCESS mode: a task still running this long after it started fails and its child is
     * killed and replaced; 0 = no deadline. THREAD mode accepts only 0 (a thread cannot be
     * stopped). */
    uint32_t task_timeout_ms;
} pto_worker_config;

/* Flow-control statistics of one Worker (ring occupancy and submit stalls). */
typedef struct pto_ring_stats {
    int64_t stalls;              /* times an allocation waited on this ring */
    int64_t stall_ns;
    uint64_t hwm_bytes;          /* peak bytes in use */
    uint64_t capacity_bytes;
    uint64_t used_bytes;         /* now */
    int64_t live_slabs;          /* now */
    uint64_t need_bytes;         /* the capacity that would not have stalled, from the waits of the worst run; 0 if
                                  * no wait succeeded (the stall advice) */
    char stall_scope[64];        /* where the scope opened that allocated at the last stall (pto_scope_label), or "" */
} pto_ring_stats;

typedef struct pto_stats {
    int64_t tasks_submitted;
    int64_t tasks_completed;
    int64_t tasks_failed;
    int64_t allocs;
    int64_t runs;
    int64_t tasks_live_hwm;      /* peak submitted-but-not-reclaimed slots */
    int64_t ready_hwm;           /* peak ready-queue length */
    int64_t tensormap_hwm;       /* peak live TensorMap entries */
    int64_t tensormap_live;
    int64_t tasks_live;          /* submitted and not yet reclaimed, now */
    pto_ring_stats rings[4];
    int64_t tasks_early;         /* PROCESS mode: tasks posted to a child before their producers on other
                                  * children had ended, which they waited for there */
} pto_stats;

typedef struct pto_task_info {
    int64_t id;
    int32_t state;               /* pto_task_state */
    int32_t kind;                /* pto_worker_kind, or -1 for an alloc slot */
    uint64_t callable;
    int32_t fanin;               /* producers this task waits for */
    int32_t fanout;              /* consumers wired so far */
    int32_t ring;                /* heap ring of its slab, -1 if none */
    int32_t group_size;          /* 1 unless a group task */
    uint64_t slab_offset;
    uint64_t slab_bytes;
    const char *error;           /* NULL unless failed; valid until next run */
    /* index of the worker that took it (a group: its member 0), -1 before */
    int32_t worker;
    int32_t pin;                 /* the worker it must run on (a group: its member 0's), -1 for any */
    int64_t run;                 /* the id of the submitted run it belongs to (pto_run_info), 0 in a blocking run */
    /* 1 if its slot was reclaimed: state is CONSUMED and only kind, callable and worker are known (for
     * the run's first 65536 ids; past them kind is -2) */
    int32_t reclaimed;
} pto_task_info;

/* One TensorMap entry: bytes [start, end) of storage base were last written by task producer. */
typedef struct pto_tm_item {
    uint64_t base;
    uint64_t start;
    uint64_t end;
    int64_t producer;
} pto_tm_item;

/* Dispatch control for interactive debugging (the REPL's :hold, :step, :break). */
typedef struct pto_dispatch_state {
    int32_t held;                /* 1 while ready tasks wait for a step or release */
    int32_t breakpoints;         /* callables that hold dispatch before their tasks */
    int64_t step_left;           /* tasks a step may still let through */
    int64_t break_task;          /* the task a breakpoint last stopped in this run, or -1 */
    int64_t running;             /* tasks dispatched and not finished */
    int64_t caught_task;         /* the newest failure a catch holds (pto_worker_catch_set), or -1 */
} pto_dispatch_state;

/* One child of a Worker, now. */
typedef struct pto_child_info {
    /* PROCESS mode: its process (-1 while it is being replaced); 0 in THREAD mode */
    int32_t pid;
    int32_t reserved;
    int64_t current_task;        /* the task it is running, or -1 when idle */
    int64_t tasks_run;           /* tasks (group members) it ran since init */
    int64_t running_ns;          /* how long its current task has run (to a few ms), 0 when idle */
} pto_child_info;

typedef struct pto_worker pto_worker;
typedef struct pto_orch pto_orch;

/* Message of the last failing pto_* call on this thread ("" if none). */
const char *pto_errmsg(void);

/* What kind of failure the last failing pto_* call on this thread had, for callers that
 * add their own advice (pto_errmsg says what went wrong either way). */
enum {
    PTO_ERR_NONE = 0,          /* nothing failed on this thread yet */
    PTO_ERR_FAILED = 1,        /* any failure not listed below */
    PTO_ERR_DISPATCH_HELD = 2  /* a heap ring is full and only held tasks could free it */
};
int pto_errcode(void);

/* Bytes per element of dtype, or 0 if dtype is unknown. */
size_t pto_dtype_size(int32_t dtype);
/* Name of dtype ("f32"), or NULL if unknown. */
const char *pto_dtype_name(int32_t dtype);
/* Elements in t (product of its shape). */
uint64_t pto_tensor_numel(const pto_tensor *t);
/* Bytes covered by t. */
uint64_t pto_tensor_nbytes(const pto_tensor *t);

/* Bytes of the args blob for T tensors and S scalars. */
size_t pto_blob_size(int32_t tensor_count, int32_t scalar_count);
/* Encode view into buf as [i32 T][i32 S][tensor x T][u64 x S]; returns bytes written or -1 if cap
 * is too small. */
int64_t pto_blob_encode(const pto_args_view *view, void *buf, size_t cap);
/* Decode len bytes of buf into view (pointing into buf); returns 0, or -1 if counts or sizes are
 * inconsistent. */
int pto_blob_decode(const void *buf, size_t len, pto_args_view *view);

/* A new Worker: maps its heap rings now so children forked later share them. NULL on error. */
pto_worker *pto_worker_new(const pto_worker_config *cfg);
/* Add a next-level child (before init); returns its id (0, 1, ...) or -1. */
int pto_worker_add_next_level(pto_worker *w, const pto_leaf *leaf);
/* Add a sub worker (before init); returns its index (0, 1, ...) or -1. */
int pto_worker_add_sub(pto_worker *w, const pto_leaf *leaf);
/* Change the mode (pto_mode) of a Worker that has no workers added yet; 0 or -1. */
int pto_worker_mode_set(pto_worker *w, int32_t mode);
/* THREAD mode, inside a leaf's run: the tags (pto_tag) of its task's tensors as submitted, one per
 * tensor; NULL anywhere else (a PROCESS-mode child's leaf sees none). */
const uint8_t *pto_leaf_tags(void);
/* Start the children (PROCESS mode) or worker threads (THREAD mode), then
 * the scheduler thread. 0 or -1. */
int pto_worker_init(pto_worker *w);
/* Open a run: its outer scope; returns the run's orchestrator or NULL. */
pto_orch *pto_run_begin(pto_worker *w);
/* Close the outer scope, drain, reset the rings; 0, or -1 with the run's first failure in
 * pto_errmsg(). */
int pto_run_end(pto_worker *w);
/* Submitted runs (run handles): several runs of one Worker in flight, ordered across runs by the
 * same tag rules as within a run. A blocking run cannot open while submitted runs are outstanding. */
typedef struct pto_run pto_run;
typedef struct pto_run_info {
    int64_t id;                       /* 1, 2, ... per Worker */
    int64_t submitted, completed, failed;   /* tasks; submitted counts so far while its function runs */
    int32_t state;                    /* PTO_RUN_RUNNING, _OK, _FAILED, _CANCELLED */
} pto_run_info;
enum { PTO_RUN_RUNNING = 0, PTO_RUN_OK = 1, PTO_RUN_FAILED = 2, PTO_RUN_CANCELLED = 3 };
/* Open a submitted run (its outer scope) beside the outstanding ones; returns its orchestrator and
 * its record in *run, or NULL. */
pto_orch *pto_run_submit(pto_worker *w, pto_run **run);
/* Its function returned: end its outer scope without waiting; 0 or -1. */
int pto_run_submitted(pto_worker *w, pto_run *run);
/* Wait up to timeout_ms (< 0: no limit) for run's tasks (run NULL: every submitted run's); 1 done,
 * 0 not yet, -1 shut down. */
int pto_run_wait(pto_worker *w, pto_run *run, int32_t timeout_ms);
/* Counts and state of run now (any time, no wait). */
void pto_run_info_get(pto_run *run, pto_run_info *out);
/* Its first failed task's message into buf (truncated to len); 0 if none failed. */
int pto_run_failure(pto_run *run, char *buf, size_t len);
/* Dispatch no further task of run: what is not running fails as cancelled. */
void pto_run_cancel(pto_worker *w, pto_run *run);
/* Call wake(arg) once run's tasks have all finished, from the thread that sees it (at once if they
 * have); replaces an earlier wish. */
void pto_run_on_done(pto_run *run, pto_wake_fn wake, void *arg);
/* The handle lets go of run (it is freed once its tasks no longer point to it). */
void pto_run_free(pto_run *run);
/* Submitted runs whose tasks have not all finished. */
int64_t pto_runs_live(pto_worker *w);
/* With none live, end the engine run they shared (rings and task ids reset): 1 ended, 0 none was
 * open, -1 runs still live or shut down. */
int pto_runs_end(pto_worker *w);
/* Stop threads, unmap rings and free w; safe on NULL and on a blocked run. */
void pto_worker_close(pto_worker *w);
/* Ask a run blocked in submit/alloc/drain to fail now (any thread); the Worker is unusable
 * afterwards. */
void pto_worker_shutdown(pto_worker *w);
/* Async-signal-safe: the current run stops dispatching, fails what has not started, and its end
 * reports "interrupted"; the next run is normal. */
void pto_worker_interrupt(pto_worker *w);
/* Around every wait inside a submit or alloc (heap-ring back-pressure), the orchestrator's thread
 * calls block(arg) before it may sleep and unblock(arg) once it goes on: a binding that runs its
 * callers under one lock gives it up there, so the tasks the wait is for can run. NULLs: none. */
typedef void (*pto_block_fn)(void *arg);
void pto_worker_on_block(pto_worker *w, pto_block_fn block, pto_block_fn unblock, void *arg);
/* PROCESS mode: children forked before callable existed get blob (copied into shared memory)
 * through their leaf's load hook before its first task. 0 or -1. */
int pto_worker_ship_callable(pto_worker *w, int32_t kind, uint64_t callable, const void *blob,
                             size_t len);
/* PROCESS mode: pid of the child serving worker index of kind now, or -1. */
int pto_worker_child_pid(pto_worker *w, int32_t kind, int32_t index);
/* Name callable of kind for failure messages
 * ("task 3 (callable 'name' on chip 1) failed: ..."). */
void pto_worker_callable_name_set(pto_worker *w, int32_t kind, uint64_t callable, const char *name);
/* The name set for callable of kind, copied into buf like snprintf; returns its length, or -1 if it
 * has none. */
int pto_worker_callable_name_get(pto_worker *w, int32_t kind, uint64_t callable, char *buf,
                                 size_t cap);
/* Copy the Worker's flow-control statistics into out. */
void pto_worker_stats_get(pto_worker *w, pto_stats *out);
/* Print the flow-control report with sizing advice into buf; returns its length (like snprintf). */
int pto_worker_format_stats(pto_worker *w, char *buf, size_t cap);
/* The same report for statistics st of a Worker of level (e.g. copied from another process). */
int pto_format_stats(const pto_stats *st, int32_t level, char *buf, size_t cap);
/* pto_format_stats with flags: PTO_STATS_FULL also lists rings never used (the short form leaves them out). */
int pto_format_stats_ex(const pto_stats *st, int32_t level, int32_t flags, char *buf, size_t cap);
enum { PTO_STATS_FULL = 1 };
/* Base address of heap ring r (for tests and children). */
void *pto_worker_ring_base(pto_worker *w, int32_t r);
/* Number of next-level children / sub workers. */
int pto_worker_count(pto_worker *w, int32_t kind);
/* Fill out for child index of kind; 0, or -1 if there is no such child. */
int pto_worker_child_info_get(pto_worker *w, int32_t kind, int32_t index, pto_child_info *out);
/* The id of the task child index of kind runs now (pto_child_info's current_task), or -1; no system
 * call, unlike pto_worker_child_info_get's pid in PROCESS mode. */
int64_t pto_worker_current_task(pto_worker *w, int32_t kind, int32_t index);

/* Check mode (docs/check.md) for the runs that begin from now on: PTO_CHECK_ON (1) runs every task
 * under checks of its tags (it may run twice) and reports unordered OUTPUT overwrites at submit;
 * PTO_CHECK_WARN (2) checks the same but reports every finding as a warning on stderr (the task
 * succeeds with what it computes from its real inputs, the submit goes ahead); 0 turns it off.
 * 0 or -1. */
enum { PTO_CHECK_ON = 1, PTO_CHECK_WARN = 2 };
int pto_worker_check_set(pto_worker *w, int32_t on);
/* w's next run's check mode: 0, PTO_CHECK_ON or PTO_CHECK_WARN. */
int32_t pto_worker_check(pto_worker *w);
/* Check mode: the tasks of w's open run that have finished by now count as ordered before every later
 * submit, as after a drain (the caller saw them finish: ptolua's prompt calls this per line). Outside
 * check mode, nothing. */
void pto_check_observed(pto_worker *w);
/* Stop on failure (on = 1): a single task's failure holds dispatch before its consumers are
 * poisoned, until pto_dispatch_retry runs it again or releasing dispatch (pto_dispatch_hold 0)
 * or a drain accepts it. 0 or -1. */
int pto_worker_catch_set(pto_worker *w, int32_t on);
/* 1 if failures are caught, else 0. */
int32_t pto_worker_catch(pto_worker *w);
/* Run the caught failed task id again and release dispatch; its consumers then wait for it as if
 * it had not failed. 0, or -1 if id is not a caught failure. */
int pto_dispatch_retry(pto_worker *w, int64_t id);
/* pto_dispatch_retry, running it as callable (of kind; -1: of the task's own kind) instead of the
 * callable it was submitted with: a fixed one registered meanwhile. -1 also if the task is of
 * another kind. */
int pto_dispatch_retry_as(pto_worker *w, int64_t id, int32_t kind, uint64_t callable);

/* Hold (1) dispatch of ready tasks, or resume it (0); submits still build the DAG, and a drain
 * still runs everything. 0 or -1. */
int pto_dispatch_hold(pto_worker *w, int32_t hold);
/* While dispatch is held: let the next n ready tasks go, including tasks that become ready
 * meanwhile. 0, or -1 if not held. */
int pto_dispatch_step(pto_worker *w, int64_t n);
/* Hold dispatch before any task of (kind, callable) would dispatch (on = 1), or remove that
 * breakpoint (on = 0; callable UINT64_MAX removes all). Returns the number set, or -1. */
int pto_dispatch_break(pto_worker *w, int32_t kind, uint64_t callable, int32_t on);
/* Wait at most timeout_ms until nothing runs and nothing more may dispatch (a held Worker's step
 * is spent or has nothing left to run; it is then dropped). 1 when quiet, 0 on timeout, -1 on
 * error. */
int pto_dispatch_wait(pto_worker *w, int32_t timeout_ms);
/* Return once the scheduler has wired every task submitted before the call and dispatched what it
 * may: task states are then current. 0 or -1. */
int pto_dispatch_sync(pto_worker *w);
/* Copy at most cap breakpoints (kind and callable of each) into kinds and callables; returns how
 * many are set. */
int32_t pto_dispatch_breakpoints(pto_worker *w, int32_t *kinds, uint64_t *callables, int32_t cap);
/* Copy the dispatch-control state into out. */
void pto_dispatch_get(pto_worker *w, pto_dispatch_state *out);

/* Give the next submit on o (any kind) a deadline of ms milliseconds, 0 for none, instead of the
 * Worker's task_timeout_ms. 0, or -1 (ms < 0; ms > 0 in THREAD mode). */
int pto_submit_timeout(pto_orch *o, int64_t ms);
/* Submit one task for a next-level child; worker >= 0 pins it. Returns the task id or -1. */
int64_t pto_submit_next_level(pto_orch *o, uint64_t callable, pto_task_args *args,
                              const pto_call_config *cfg, int32_t worker);
/* Submit n members as one task on n distinct children (workers may be NULL).
 * Returns the task id or -1. */
int64_t pto_submit_next_level_group(pto_orch *o, uint64_t callable, pto_task_args *args,
                                    int32_t n, const pto_call_config *cfg, const int32_t *workers);
/* Submit one task for a sub worker. Returns the task id or -1. */
int64_t pto_submit_sub(pto_orch *o, uint64_t callable, pto_task_args *args, int32_t worker);
/* Submit n members on n distinct sub workers. Returns the task id or -1. */
int64_t pto_submit_sub_group(pto_orch *o, uint64_t callable, pto_task_args *args, int32_t n,
                             const int32_t *workers);
/* Carve a tensor from the current scope's heap ring into out; returns its slot id or -1. */
int64_t pto_alloc(pto_orch *o, const uint32_t *shape, int32_t ndims, int32_t dtype,
                  pto_tensor *out);
/* Open a nested scope (at most 64 above the run's). 0 or -1. */
int pto_scope_begin(pto_orch *o);
/* Close the innermost nested scope, releasing its references. 0 or -1. */
int pto_scope_end(pto_orch *o);
/* Current nested depth: 0 in the run's outer scope. */
int pto_scope_depth(pto_orch *o);
/* Name the innermost open scope for the messages about it (e.g. where it was opened, "file.lua:12");
 * copied, at most 63 bytes kept. 0, or -1 if no run is open. */
int pto_scope_label(pto_orch *o, const char *label);
/* Wait until every task submitted so far has completed and been reclaimed where possible. 0 or -1
 * on failure. */
int pto_drain(pto_orch *o);
/* Fill info for task id of the current run; 0, or -1 if id is not a task of this run. */
int pto_task_info_get(pto_orch *o, int64_t id, pto_task_info *info);
/* Ids of the producers (what=0) or consumers (what=1) of task id; returns the count, writing at
 * most cap. */
int pto_task_edges(pto_orch *o, int64_t id, int32_t what, int64_t *out, int32_t cap);
/* Number of task ids handed out in the current run (ids are 0 .. n-1). */
int64_t pto_task_count(pto_orch *o);
/* Copy member's tensors and tags of task id (at most cap of each; either may be NULL); returns its
 * tensor count, or -1 if the task is reclaimed or unknown. */
int32_t pto_task_tensors(pto_orch *o, int64_t id, int32_t member, pto_tensor *tensors,
                         uint8_t *tags, int32_t cap);
/* The heap ring that holds address addr (and addr's offset in it), or -1 if none does. */
int32_t pto_ring_locate(pto_orch *o, uint64_t addr, uint64_t *offset);
/* Copy at most cap live TensorMap entries into out; returns how many there are, or -1 outside a
 * run. */
int64_t pto_tensormap_list(pto_orch *o, pto_tm_item *out, int64_t cap);

/* ---- diagnostics a CallConfig asks for (diag.c, docs/tracing.md) ---- */

/* A task's PMU counts (enable_pmu = set): event i of the set is pto_pmu_event_name(set, i). */
typedef struct pto_pmu_sample {
    int32_t set;                 /* the task's enable_pmu, 0 if nothing was counted */
    int32_t count;               /* events in the set */
    uint32_t valid;              /* bit i: counts[i] was read (an event the machine refuses is not) */
    int32_t members;             /* group members whose counts are summed here */
    int64_t counts[4];
} pto_pmu_sample;
/* Name of event i ("task-clock", "cycles", ...) of PMU set (1..4), or NULL. */
const char *pto_pmu_event_name(int32_t set, int32_t i);
/* Fill out with the PMU counts of task id of the current run: 1 if it has some, 0 if not (yet), -1 on a bad
 * id. */
int pto_task_pmu_get(pto_orch *o, int64_t id, pto_pmu_sample *out);

/* ---- tracing (trace.c, docs/tracing.md) ----
 * Call these from the thread that runs w's runs, never two at once. */

/* Record w's task spans, submits, dependency edges, ring stalls and runs into a buffer of
 * capacity_events events (0 = 1048576, at most 67108864); once it is full, events are dropped and
 * counted, never waited for. 0, or -1 if w is already tracing or the capacity is too large. */
int pto_trace_start(pto_worker *w, uint32_t capacity_events);
/* Stop recording (also inside a run) and, if path is not NULL, write the events to path as Chrome
 * trace-event JSON (Perfetto, chrome://tracing); 0, or -1 if w is not tracing or path cannot be
 * written (recording has stopped either way). */
int pto_trace_stop(pto_worker *w, const char *path);
/* 1 while w is recording, else 0. */
int pto_trace_active(pto_worker *w);
/* Events kept by w's current or last trace. */
int64_t pto_trace_events(pto_worker *w);
/* Events w's current or last trace dropped because its buffer was full. */
int64_t pto_trace_dropped(pto_worker *w);
/* The stopped trace's events as comma-separated trace-event objects of process pid named name
 * (NULL: "Worker (level 3, thread mode)"), to merge several Workers into one traceEvents array;
 * writes at most cap bytes with a NUL and returns the full length (like snprintf), or -1 if w has
 * no stopped trace. */
int64_t pto_trace_format(pto_worker *w, int32_t pid, const char *name, char *buf, size_t cap);
/* Add events (comma-separated trace-event objects from pto_trace_format, e.g. of a Worker child in
 * another process) to w's trace: pto_trace_stop's file and pto_trace_format include them until the
 * next pto_trace_start. 0 or -1. */
int pto_trace_attach(pto_worker *w, const char *events, size_t len);
/* The time origin of this process's traces (CLOCK_MONOTONIC ns), 0 before the
 * first pto_trace_start. */
uint64_t pto_trace_epoch(void);
/* In a child process: use origin epoch_ns (its parent's pto_trace_epoch) so traces merged from
 * several processes share one time axis. */
void pto_trace_set_epoch(uint64_t epoch_ns);

/* ---- run profile (profile.c, docs/tracing.md) ----
 * Every Worker keeps the start and end of each task of its last run (at most 65536 tasks a run;
 * later ones are counted, not kept). Call from the thread that runs w's runs. */
typedef struct pto_profile_task {
    uint64_t start_ns, end_ns;   /* CLOCK_MONOTONIC; PROCESS mode: post to the child, its result */
    int64_t id;                  /* task id in its run */
    int64_t ready_by;            /* the producer whose completion made it ready; -1: ready when submitted */
    uint64_t callable;
    int32_t kind;                /* pto_worker_kind */
    int32_t worker;              /* index of the worker that ran it (-1: see failed) */
    int32_t member;              /* group member (0 for a single task) */
    /* 1 if it ran and failed; 2 if it never ran (a producer failed, or the run was interrupted):
     * then start_ns = end_ns = 0 and worker = -1 */
    int32_t failed;
    uint32_t scope;              /* the nested scope it was submitted in: 1, 2, ... in opening order; 0 the run's */
} pto_profile_task;

typedef struct pto_profile_run {
    uint64_t begin_ns;           /* pto_run_begin */
    uint64_t drain_ns;           /* pto_run_end was called: the orchestration returned */
    uint64_t end_ns;             /* the run drained */
    uint64_t waited_ns;          /* before drain_ns, spent waiting in pto_drain / pto_dispatch_wait */
    int64_t tasks;               /* records kept */
    int64_t dropped;             /* tasks beyond the cap, not kept */
    int64_t run;                 /* 1 for the Worker's first run */
} pto_profile_run;

/* The last ended run of w: its times into *run (may be NULL) and at most cap task records into out,
 * in completion order. Returns the number of records, or -1 if no run has ended yet. */
int64_t pto_profile_get(pto_worker *w, pto_profile_run *run, pto_profile_task *out, int64_t cap);
/* The dependency edges of w's last ended run (at most 262144): at most cap (consumer, producer) id
 * pairs into out[2i], out[2i + 1]. Returns the number of edges, or -1 if no run has ended yet. */
int64_t pto_profile_edges(pto_worker *w, int64_t *out, int64_t cap);
/* The nested scopes of w's last ended run (pto_profile_task.scope numbers them 1, 2, ... in opening
 * order; at most 262144 are kept): parent[k] = the scope nested scope k + 1 was opened in (0: the
 * run's own), at most cap into parent. Returns the number kept, or -1 if no run has ended yet. */
int64_t pto_profile_scopes(pto_worker *w, uint32_t *parent, int64_t cap);
/* The pto_alloc slots the tasks of w's last ended run used (read, wrote or kept alive; at most
 * 262144 pairs): at most cap (task id, alloc slot id) pairs into out[2i], out[2i + 1]. Returns the
 * number of pairs, or -1 if no run has ended yet. */
int64_t pto_profile_alloc_uses(pto_worker *w, int64_t *out, int64_t cap);
/* The i-th of the tasks of w's last ended run that failed or were not run, in the order they ended
 * (at most 1024, each message cut at 4 KiB): its message, valid until the next run ends, and its id
 * into *id (may be NULL). NULL past the last, or if no run has ended yet. */
const char *pto_profile_error(pto_worker *w, int64_t i, int64_t *id);
/* The PMU counts (CallConfig enable_pmu) of task id of w's last ended run into out: 1 if it has some,
 * 0 if none, -1 if no run ended yet or a later run has begun since (its counts replaced them). */
int pto_profile_pmu_get(pto_worker *w, int64_t id, pto_pmu_sample *out);

/* ---- shared tensor memory (shm.c) ----
 * One MAP_SHARED | MAP_NORESERVE reservation per process, taken once (the
 * Lua module takes it when it loads), so every child forked later sees
 * every tensor at the same address, also tensors created after the fork. */
typedef struct pto_shm_stats {
    uint64_t reserved_bytes;     /* size of the reservation (virtual) */
    uint64_t in_use_bytes;       /* bytes in live blocks, rounded to the granule */
    uint64_t hwm_bytes;          /* peak of in_use_bytes */
    int64_t live_blocks;
} pto_shm_stats;

/* Reserve the arena if not yet done (bytes = 0: $PTO_SHM_SIZE or a default); 0, or -1 with
 * pto_errmsg(). Thread-safe, idempotent. */
int pto_shm_init(uint64_t bytes);
/* nbytes (> 0) of zero-filled shared memory, 64-byte aligned; NULL with pto_errmsg() if the arena
 * has no room. */
void *pto_shm_alloc(uint64_t nbytes);
/* Give back a block from pto_shm_alloc (NULL is a no-op); its whole pages are returned
 * to the OS. */
void pto_shm_free(void *p);
/* In a forked child: make block (bytes from the parent's pto_shm_alloc, kept by the parent while
 * the child lives) this process's own arena, so it can allocate; 0 or -1. */
int pto_shm_adopt(void *block, uint64_t bytes);
/* 1 in a process forked from the arena's owner: it may use tensors but not allocate them. */
int pto_shm_is_child(void);
/* 1 if p lies inside the arena, else 0. */
int pto_shm_contains(const void *p);
/* Usable size of the block starting at p, or 0 if p is not a live block. */
uint64_t pto_shm_block_size(const void *p);
/* Copy the arena's counters into out. */
void pto_shm_stats_get(pto_shm_stats *out);

/* ---- chip kernels (chip.c) ----
 * A chip runtime is a shared object exporting kernels with this signature;
 * the built-in one (libpto_chipsim.so) simulates a chip on the CPU. */
typedef int (*pto_kernel_fn)(const pto_args_view *args, const pto_call_config *cfg, char *err,
                             size_t errlen);

/* Path of the built-in simulated chip runtime, or NULL if it cannot be found. */
const char *pto_chipsim_path(void);
/* dlopen lib (NULL = the built-in runtime) and resolve symbol into the process's kernel table;
 * returns its callable id (>= 0) or -1. */
int64_t pto_kernel_register(const char *lib, const char *symbol);
/* The kernel behind callable id, or NULL. */
pto_kernel_fn pto_kernel_lookup(uint64_t callable);
/* A leaf that runs kernel-table callables: what a chip worker executes. ctx: the runtime path
 * kernels default to (NULL = built-in). PROCESS mode: its start hook dlopens ctx in the child; its
 * load hook installs a kernel registered after init, shipped as "lib\0symbol\0" (lib "" = ctx or
 * the built-in runtime), under the same callable id. */
pto_leaf pto_chip_leaf(void);

/* ffi-end */

/* A task whose last scalar is PTO_RESULT_BOX_MARK carries, as its last
 * tensor, a box its leaf writes the orchestration function's results into
 * (the Lua binding adds one to each task a level >= 4 Worker submits to a
 * Worker child). Tools that show a task's arguments leave both out. */
#define PTO_RESULT_BOX_MARK 0x50544f526573756cull   /* "PTOResul" */

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
