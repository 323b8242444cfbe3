/* lpto_priv.h - the Lua binding's types and the interface of each of its
 * files (lpto*.c); what every file uses without knowing a type is in
 * lpto_aux.h, and the order the files depend on each other is in lpto.c.
 *
 * Ownership in one paragraph: a Tensor userdata describes a view
 * (pto_tensor) of a Storage userdata, which it keeps alive through its user
 * value. A Storage owns arena memory (pto.tensor), or borrows heap-ring
 * memory (orch:alloc, automatic OUTPUTs) or a task's arguments (inside a sub
 * callable); borrowed storage is valid only while its scope or call lasts,
 * and every access checks that flag, so a stale tensor raises instead of
 * reading recycled memory. */
#ifndef LPTO_PRIV_H
#define LPTO_PRIV_H

#include <pthread.h>
#include <sys/types.h>

#include "lpto_aux.h"

#define LPTO_TENSOR "pto.Tensor"
#define LPTO_STORAGE "pto.Storage"
#define LPTO_ARGS "pto.TaskArgs"
#define LPTO_CONFIG "pto.CallConfig"
#define LPTO_WORKER "pto.Worker"
#define LPTO_ORCH "pto.Orchestrator"
#define LPTO_HANDLE "pto.Handle"
#define LPTO_SCOPE "pto.Scope"
#define LPTO_KERNEL "pto.ChipKernel"

/* ---- storage and tensors ------------------------------------------------- */
enum { LPTO_ST_ARENA, LPTO_ST_RING, LPTO_ST_BORROWED, LPTO_ST_PRIVATE };

typedef struct lpto_storage {
    uint64_t base;
    uint64_t nbytes;
    int kind;
    bool valid;
    bool temp;                 /* a pto.temp's: every OUTPUT submit rebinds it to new heap-ring memory */
    const char *why_invalid;   /* for the error when !valid */
    uint64_t pinned;           /* serial of the last run that pinned it: each run pins it once */
    uint64_t listed;           /* serial of the last scope that lists it for invalidation */
} lpto_storage;

typedef struct lpto_tensor {
    pto_tensor t;              /* t.base == 0 until an unset spec is bound */
    lpto_storage *st;          /* NULL for an unset spec; kept alive by the user value */
} lpto_tensor;

lpto_tensor *lpto_checktensor(lua_State *L, int idx, const char *who);
lpto_tensor *lpto_totensor(lua_State *L, int idx);
/* Push a tensor for desc over storage at index st_idx (a Storage userdata). */
lpto_tensor *lpto_push_tensor(lua_State *L, const pto_tensor *desc, int st_idx);
/* Push a new Storage userdata. */
lpto_storage *lpto_push_storage(lua_State *L, uint64_t base, uint64_t nbytes, int kind);
/* Raise unless the tensor's storage can be touched now. */
void lpto_check_live(lua_State *L, const lpto_tensor *t, const char *who);
int lpto_parse_dtype(lua_State *L, int idx, const char *who);
int lpto_parse_tag(lua_State *L, int idx, const char *who);
/* The tag at idx (nil: INPUT), or -1 if it is none: lpto_parse_tag without the error. */
int lpto_tag_value(lua_State *L, int idx);
/* Read a shape table at idx into shape; returns ndims. */
int lpto_parse_shape(lua_State *L, int idx, uint32_t shape[PTO_MAX_DIMS], const char *who);
/* lpto_check.c: check mode's tensor creation sites (docs/check.md). */
/* Start noting creation sites if $PTO_CHECK is 1 (ptolua --check): tensors come before Workers. */
void lpto_open_check(lua_State *L);
/* From now on, note where tensors are created. */
void lpto_check_record(void);
/* Note where the storage at idx is being created (a no-op until lpto_check_record). */
void lpto_check_note(lua_State *L, int idx);
/* If the message on top reports a write at an address outside a task's arguments, replace it with one
 * that names the tensor holding that address and where it was created. */
void lpto_check_explain(lua_State *L);

void lpto_open_tensor(lua_State *L);
/* ---- diagnostics (lpto_diag.c) ---- */
/* Set field "pmu" of the table on top to task id's PMU counts, if it has any. */
void lpto_push_pmu(lua_State *L, pto_orch *o, int64_t id);
/* Push s's valid counts as {set = N, task_clock = ..., ...} (event names with '_' for '-'). */
void lpto_push_pmu_counts(lua_State *L, const pto_pmu_sample *s);
/* pto.load_dump, into the module table on top (after pto.tensor). */
void lpto_open_diag(lua_State *L);
/* The message of a ring storage once its scope has ended. */
extern const char lpto_ring_gone[];

/* ---- checks by identity -------------------------------------------------------
 * The hot functions (submits, views, prepared submits) carry the metatables
 * they check as upvalues, in this order, and compare by identity: no
 * registry lookup by name per call, as luaL_testudata makes. */
enum { LPTO_UP_TENSOR = 1, LPTO_UP_ARGS, LPTO_UP_ORCH, LPTO_UP_HANDLE, LPTO_UP_SCOPE, LPTO_UP_COUNT = LPTO_UP_SCOPE };
/* Push the LPTO_UP_COUNT metatables (creating any not made yet), for luaL_setfuncs. */
void lpto_push_mt_upvalues(lua_State *L);
/* The userdata at idx if its metatable is the one in upvalue up, else NULL. */
static inline void *lpto_testudata_up(lua_State *L, int idx, int up)
{
    if (lua_type(L, idx) != LUA_TUSERDATA || !lua_getmetatable(L, idx)) return NULL;
    bool same = lua_rawequal(L, -1, lua_upvalueindex(up));
    lua_pop(L, 1);
    return same ? lua_touserdata(L, idx) : NULL;
}
/* lpto_push_tensor with the Tensor metatable at mt_idx (no lookup by name). */
lpto_tensor *lpto_push_tensor_mt(lua_State *L, const pto_tensor *desc, int st_idx, int mt_idx);

/* ---- TaskArgs and CallConfig ---------------------------------------------- */
/* Arguments up to this many tensors (and scalars) live inside the
 * userdata: building the common TaskArgs makes no malloc. */
#define LPTO_ARGS_INLINE 4

typedef struct lpto_args {
    int32_t nt, ns, cap_t, cap_s;
    lpto_tensor **tensors;      /* userdata kept alive by its user values (lpto_args_push_tensor) */
    uint8_t *tags;
    uint64_t *scalars;
    uint8_t *scalar_float;      /* 1 if scalars[i] holds a double's bits */
    lpto_tensor *tensors_in[LPTO_ARGS_INLINE];
    uint64_t scalars_in[LPTO_ARGS_INLINE];
    uint8_t tags_in[LPTO_ARGS_INLINE], scalar_float_in[LPTO_ARGS_INLINE];
} lpto_args;

/* A TaskArgs' user values: 1 the table of its tensors beyond the first
 * LPTO_ARGS_INLINE (nil until needed), 2 and 3 its grown arrays, then one
 * per inline tensor. */
enum { UV_ARGS_INLINE = 3 };

lpto_args *lpto_checkargs(lua_State *L, int idx, const char *who);
/* Push tensor i (from 1) of the TaskArgs at aidx. */
void lpto_args_push_tensor(lua_State *L, int aidx, int32_t i);
/* Push a new, empty TaskArgs. */
lpto_args *lpto_push_args(lua_State *L);
/* Push a TaskArgs over a task's argument view (inside a sub callable):
 * its tensors borrow storage st_idx. */
void lpto_push_args_view(lua_State *L, const pto_args_view *v, int st_idx);
void lpto_open_args(lua_State *L);
const pto_call_config *lpto_optconfig(lua_State *L, int idx, const char *who);
/* Push a new CallConfig holding a copy of cfg (NULL: the defaults). */
void lpto_push_config(lua_State *L, const pto_call_config *cfg);

/* ---- Worker, orchestrator, sub callables ------------------------------------- */
enum { W_NEW, W_READY, W_CLOSED };
/* What a handle registers: a Lua function (a sub callable, or an orchestration
 * function run by Worker children) or a chip kernel. */
enum { LPTO_HANDLE_FUNCTION, LPTO_HANDLE_KERNEL };
/* Worker user values. */
enum { UV_FNS = 1, UV_THREADS, UV_ORCH, UV_CHILDREN, UV_HANDLES, UV_RUNS, UV_COUNT = UV_RUNS };
/* Orchestrator user values. */
enum { OUV_WORKER = 1, OUV_SCOPES, OUV_PINS, OUV_RESULTS, OUV_COUNT = OUV_RESULTS };

typedef struct lworker lworker;
typedef struct wchild wchild;

typedef struct sub_ctx {
    lworker *W;
    lua_State *T;      /* this sub's Lua thread, anchored in UV_THREADS */
    char name[24];
} sub_ctx;

struct lworker {
    pto_worker *w;
    int state;
    bool in_run;
    bool interactive;          /* the run in progress was opened by Worker:open_run */
    int level, mode, nchips, nsubs;
    char *chip_runtime;        /* NULL: the built-in simulated chip */
    sub_ctx *subs;
    char (*chip_names)[24];
    lpto_gil *gil;
    int fns_ref;               /* registry ref of the UV_FNS table, for sub threads */
    uint64_t next_fn;
    pto_tensor *scratch;       /* submit's tensor descriptors */
    int32_t scratch_cap;
    bool init_failed;          /* a failed init leaves half-built state: no retry */
    pid_t owner;               /* the process that may close it: a forked child has a copy, with no threads */
    /* Levels (lpto_level.c). A Worker of level >= 4 has Worker children
     * (add_worker, kept in UV_CHILDREN) as its next-level workers. */
    int nworkers;
    lworker **kids;            /* the Worker children, in id order */
    wchild *wchildren;         /* one per Worker child, from init */
    lworker *parent;           /* the Worker this one was added to, or NULL */
    uint64_t shm_size;         /* tensor memory it takes from its parent's as a PROCESS-mode child; 0: default */
    bool driven;               /* its parent's leaf is initialising or running it now */
    bool gil_shared;           /* runs on a THREAD-mode parent's thread: give the lock up in waits */
    int32_t pins_hint;         /* storages the last run pinned: the next run's pin list starts that size */
    int rank;                  /* MPI (lpto_mpi.c): the rank it lives on (pto.Worker{rank}); 0: this process */
    /* Submitted runs (lpto_run.c). */
    bool runs_open;            /* the engine's session of submitted runs is open */
    int64_t run_lo, run_hi;    /* ids of the handles UV_RUNS may hold (0: none) */
    pthread_t home;            /* the thread that initialised it: the only one that may submit runs */
    pto_orch *session_o;       /* the open session's engine orchestrator (runs_open) */
    uint64_t session;          /* serial of the open session, 0 when none is */
};

/* Whether submits and allocs must give the interpreter lock up while they
 * may wait: other threads then need it to make progress. */
static inline bool lpto_releases_gil(const lworker *W)
{
    return W->gil_shared || (W->mode == PTO_MODE_THREAD && (W->nsubs > 0 || W->nworkers > 0));
}

typedef struct lorch {
    lworker *W;
    pto_orch *o;
    bool valid;
    pthread_t thread;          /* the thread running the run's function: the engine's orchestrator is single-threaded */
    uint64_t serial;           /* this run's, for lpto_storage.pinned */
    int32_t npins;             /* storages in the OUV_PINS list */
    /* w:orch() while submitted runs are outstanding: it inspects their session
     * (orch:task, orch:tasks, ...) and submits nothing; valid while that
     * session (W->session) is open. */
    bool inspect_only;
    uint64_t session;
    /* Per scope depth below depths (the depths this run has reached; the
     * rest is set when first reached, so a run of one flat loop does not
     * pay for 66): the serial of the scope open there and how many ring
     * storages its OUV_SCOPES list holds (the lists are reused). */
    int32_t depths;
    uint64_t scope_serial[PTO_MAX_SCOPE_DEPTH + 2];
    int32_t nlisted[PTO_MAX_SCOPE_DEPTH + 2];
} lorch;

/* A new serial (never 0) for runs and scopes; unique in the process. */
uint64_t lpto_next_serial(void);
/* The first of n consecutive new serials. */
uint64_t lpto_next_serials(uint64_t n);

typedef struct lhandle {
    int kind;
    uint64_t callable;
    const void *owner;         /* the lworker it was registered on (its user value keeps it alive) */
} lhandle;

void lpto_open_worker(lua_State *L);
/* Argument checks shared by the Worker and the orchestrator. */
lworker *lpto_check_worker(lua_State *L, int idx, const char *who);

/* lpto_orch.c: the orchestrator of a run, and what submitting needs. */
/* The handle at idx, which must have been registered on W. */
const lhandle *lpto_check_handle(lua_State *L, int idx, lworker *W, const char *who);
/* pto_drain(o), or pto_run_end of W's run when o is NULL, with the interpreter
 * lock given up (THREAD-mode subs finish meanwhile) and Ctrl-C able to stop it. */
int lpto_wait_run(lworker *W, pto_orch *o);
/* Push the orchestrator of W's run o (widx: the Worker); after the run has
 * drained, lpto_orch_end makes it and its heap-ring tensors stale. */
lorch *lpto_push_orch(lua_State *L, int widx, lworker *W, pto_orch *o);
void lpto_orch_end(lua_State *L, int oidx);
void lpto_open_orch(lua_State *L);
/* The orchestrator at idx (a function with the metatable upvalues calls
 * this), usable now by this thread; raises otherwise. */
lorch *lpto_check_orch(lua_State *L, int idx, const char *who);
/* The same for the methods that only look (orch:task, orch:tensormap): an inspect-only orchestrator passes. */
lorch *lpto_check_orch_inspect(lua_State *L, int idx, const char *who);
/* orch:task(id) and orch:tensormap() (lpto_orch_inspect.c). */
int lpto_orch_task(lua_State *L);
int lpto_orch_tensormap(lua_State *L);

/* lpto_sub.c: a sub callable's leaf. lpto_sub_run is the call itself (a
 * PROCESS-mode child, alone with its copy of the state, runs it as is);
 * lpto_sub_leaf wraps it in the interpreter lock for THREAD mode. */
int lpto_sub_run(void *ctx, uint64_t callable, const pto_args_view *args, const pto_call_config *cfg, char *err,
                 size_t errlen);
int lpto_sub_leaf(void *ctx, uint64_t callable, const pto_args_view *args, const pto_call_config *cfg, char *err,
                  size_t errlen);
/* In a child: install a function shipped by lpto_ship_function. */
int lpto_sub_load(void *ctx, uint64_t callable, const void *blob, size_t len, char *err, size_t errlen);
/* Push the shipped form of the function at idx, or raise saying what cannot travel. */
void lpto_ship_function(lua_State *L, int idx, const char *who);

/* lpto_worker.c internals the levels share. */
void lpto_worker_init(lua_State *L, int idx, lworker *W, const char *who);
void lpto_worker_free(lua_State *L, lworker *W);
/* lua_CFunction: Worker:run as a Worker child's leaf runs it (no Lua
 * function was called: its messages stand alone). */
int lpto_worker_run_child(lua_State *L);

/* Raise unless W may start a run now. */
void lpto_worker_check_can_run(lua_State *L, lworker *W, const char *who);
/* Push a run's failure message, named for W's level in a tree of Workers. */
void lpto_push_run_failure(lua_State *L, lworker *W, const char *fail);

/* lpto_run.c: run handles (Worker:submit, Worker:wait_all, pto.Run, pto.wait_any). */
void lpto_open_run(lua_State *L);
extern const luaL_Reg lpto_run_methods[];
/* Worker:run while submitted runs are outstanding: submit, then wait (Worker at 1, fn at 2). */
int lpto_run_blocking(lua_State *L, const char *who);
/* lua_CFunction: Worker:submit as a Worker child's leaf calls it (messages stand alone). */
int lpto_run_submit_child(lua_State *L);
/* The engine's record of the run handle at idx. */
pto_run *lpto_run_engine(lua_State *L, int idx);
/* Wait for the run handle at h, then push what its function returned or raise its failure (who NULL:
 * unprefixed, for the level above to name); returns the count pushed. */
int lpto_run_finish(lua_State *L, int h, const char *who);
/* Before a blocking run that cannot join submitted ones (Worker:open_run): end their session, or raise. */
void lpto_runs_before_blocking(lua_State *L, lworker *W, const char *who);
/* Wait for every submitted run of W (at idx); 1 with the first failure nobody observed pushed, or 0. */
int lpto_runs_wait_all(lua_State *L, int idx, lworker *W, const char *who);

/* lpto_result.c: results of orchestration functions, from a Worker child to its parent. */
/* Level >= 4 submit to a Worker child: extend each of the n members' ta[i] with a result box of its own
 * (pushes 2 values; returns the index of the boxes' storage). */
int lpto_result_attach(lua_State *L, pto_task_args *ta, int n);
/* After that submit (task id): keep the boxes at index box for orch:result, pinned for the run. */
void lpto_result_track(lua_State *L, int oidx, lorch *O, int64_t id, int box);
#define LPTO_RESULT_BYTES 16384   /* a result box: a header, then the results as Lua source */
/* The bytes of box in use (header and text; a NULL box: a header's worth), which is all that need travel. */
size_t lpto_result_box_used(const void *box);
/* Make box say "no results yet". */
void lpto_result_box_clear(void *box);
/* In the child: the arguments without the box into out; returns the box, or NULL if there is none. */
void *lpto_result_unwrap(const pto_args_view *in, pto_args_view *out);
/* Write the n values from stack index first into box (raises if they cannot travel). */
void lpto_result_write(lua_State *L, void *box, int first, int n);
/* Push task id's results (of member 1..n of a group; 0: not given) from the results table at tidx
 * (o: to say why there are none); returns their count. */
int lpto_result_push(lua_State *L, int tidx, int64_t id, lua_Integer member, pto_orch *o, const char *who);
int lpto_orch_result(lua_State *L);           /* orch:result */

/* lpto_level.c: Workers of Workers. */
int lpto_level_add_worker(lua_State *L);      /* Worker:add_worker */
/* At init of a level >= 4 Worker (at idx): add one next-level leaf per Worker child. */
void lpto_level_init(lua_State *L, int idx, lworker *W, const char *who);
void lpto_level_free(lua_State *L, lworker *W);
/* lpto_travel.c: what the Worker children send up. */
/* Push W's statistics table (Worker:stats), its Worker children's inside. */
void lpto_level_push_stats(lua_State *L, lworker *W);
/* Append each Worker child's report to the buffer (the stack is left alone). */
void lpto_level_report(lworker *W, luaL_Buffer *b);
/* PROCESS-mode Worker children trace their runs while W traces (on), and
 * collect attaches what they recorded to W's trace (before it stops). */
void lpto_level_trace(lworker *W, bool on);
void lpto_level_trace_collect(lworker *W);

/* lpto_level.c (and lpto_travel.c: the statistics), for lpto_mpi.c: a
 * rank other than 0 hosts W's child i in its own process (as a THREAD-mode
 * parent does), runs tasks on it and reports its tree's statistics; rank 0
 * publishes those for C. */
int lpto_level_host_init(lua_State *L, int idx, lworker *W, int i, char *err, size_t errlen);
int lpto_level_host_run(lworker *W, int i, uint64_t callable, const pto_args_view *args,
                        const pto_call_config *cfg, char *err, size_t errlen);
/* Writes at most cap bytes to buf (NULL: none); returns the bytes the statistics take. */
size_t lpto_level_host_stats(lworker *W, int i, void *buf, size_t cap);
void lpto_level_host_close(lua_State *L, lworker *W, int i);
void lpto_level_remote_stats(wchild *C, const void *buf, size_t len);
/* lpto_travel.c: the last runs W's PROCESS-mode child i published after its own last run (lpto_profile.c draws them as
 * the levels below): the child's, then those of the Workers of this rank below it, in pre-order. Pushes
 * a userdata holding them and returns their count with *out at the first (their recs and edges point into
 * it); 0, pushing nothing, if there are none (not a PROCESS-mode child, or it published nothing yet). A
 * section's parent indexes that array (-1: the child itself); child says which of that Worker's children
 * it is (0-based); have is 0 for a Worker no run ended on. */
#define LPTO_CHILD_PROF_NAMES 32
typedef struct lpto_prof_name {
    int32_t kind;
    uint64_t callable;
    char name[48];
} lpto_prof_name;
typedef struct lpto_child_profile {
    int32_t parent, child, have;
    pto_profile_run run;
    int64_t n, ne;
    pto_profile_task *recs;
    int64_t *edges;              /* ne (consumer, producer) pairs */
    int32_t nnames;
    lpto_prof_name names[LPTO_CHILD_PROF_NAMES];
} lpto_child_profile;
int lpto_level_child_profiles(lua_State *L, lworker *W, int i, lpto_child_profile **out);
/* Rank 0: whether W has Worker children on other ranks; ship a function registered after init to them
 * (blob: lpto_ship_function's). */
bool lpto_level_has_remote(const lworker *W);
void lpto_level_ship_remote(lworker *W, uint64_t callable, const char *blob, size_t len);
/* Rank r: install a function rank 0 shipped, for W's child i (0, or non-zero with a reason in err). */
int lpto_level_host_load(lworker *W, int i, uint64_t callable, const void *blob, size_t len, char *err,
                         size_t errlen);

/* lpto_mpi.c: level-3 Workers on other MPI ranks (docs/mpi.md). */
void lpto_open_mpi(lua_State *L);             /* pto.mpi, into the module table on top */
/* pto.Worker{rank = rank}: raise unless a level-`level` Worker can live on that rank. */
void lpto_mpi_check_rank(lua_State *L, int level, lua_Integer rank, const char *who);
/* Rank r > 0, at the init of W (whose children name ranks): host this
 * rank's child until rank 0 closes W, then exit; never returns. */
_Noreturn void lpto_mpi_serve(lua_State *L, int idx, lworker *W);
/* This process's rank (0 when not started by an MPI launcher). */
int lpto_mpi_rank(void);
/* Rank 0: the leaf of W's child C on rank (.ctx NULL: out of memory), its
 * rank, host and pid for messages, and its release. */
pto_leaf lpto_mpi_leaf(wchild *C, const char *name, int rank);
void lpto_mpi_where(const pto_leaf *leaf, char *buf, size_t cap);
void lpto_mpi_leaf_free(pto_leaf *leaf);
/* Rank 0, main thread: callable's blob goes to the leaf's rank before its next task (0, or -1: out of
 * memory). */
int lpto_mpi_ship(const pto_leaf *leaf, uint64_t callable, const char *blob, size_t len);
/* Rank 0, main thread: its tasks record their remote runs' events from now
 * on (on) or not; collect attaches what came back to w's trace. */
void lpto_mpi_trace(const pto_leaf *leaf, bool on);
void lpto_mpi_trace_collect(const pto_leaf *leaf, pto_worker *w);
/* Rank 0, after W's leaves are added: start MPI and hear from every rank
 * (leaves[i]: child i's leaf, for its remote children); raises if a remote
 * child failed to start. */
void lpto_mpi_start(lua_State *L, lworker *W, pto_leaf *leaves, const char *who);
/* Rank 0, at W's close: every rank stops and exits. */
void lpto_mpi_stop(void);

/* lpto_trace.c: Worker:trace_start / trace_stop, and the hooks the Worker's
 * and the orchestrator's code call (each does nothing unless a trace or
 * ptolua's --trace/--dot wants it). */
int lpto_trace_start(lua_State *L);           /* Worker:trace_start */
int lpto_trace_stop(lua_State *L);            /* Worker:trace_stop */
/* The new Worker at idx (ptolua --trace: traced from now on). */
void lpto_trace_new_worker(lua_State *L, int idx);
/* W is closing (gc: being collected): stop the traces of W and the Worker
 * children below it, writing their files. Pushes one message per failure
 * and returns their count, for lpto_trace_closed once W is closed. */
int lpto_trace_closing(lua_State *L, lworker *W, bool gc);
/* Raise the first of the errs messages from index first (gc: warn of each). */
int lpto_trace_closed(lua_State *L, int first, int errs, bool gc);

/* lpto_debug.c: interactive runs and dispatch control (Worker methods,
 * pto.workers). lpto_debug_track remembers the new Worker at idx. */
void lpto_open_debug(lua_State *L);
/* pto._profile_data and pto._extend_worker (lpto_profile.c). */
void lpto_open_profile(lua_State *L);
/* The Worker methods it defines, for the Worker's method table. */
extern const luaL_Reg lpto_debug_methods[];
void lpto_debug_track(lua_State *L, int idx);

#endif
