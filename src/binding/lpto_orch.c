/* lpto_orch.c - the Orchestrator a run hands to its function: submits,
 * prepared submits, orch:alloc and scopes. Valid only during
 * its run and only on the thread running it (the engine's orchestrator is
 * single-threaded). Its inspection (orch:task, orch:tensormap) is
 * lpto_orch_inspect.c.
 *
 * A submit is the hot path of every orchestration loop, so nothing in it
 * looks anything up by name: the functions carry the metatables they check
 * as upvalues; each storage a run uses is pinned once (its pinned serial),
 * not once per tensor per submit; heap-ring storages are listed for
 * invalidation in per-depth lists the run reuses; and a prepared submit
 * (orch:prepare_next_level) builds its task's arguments on the C stack. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "lpto_priv.h"

/* Most members of one group submit: bounds the stack arrays of a submit. */
#define MAX_GROUP 256

typedef struct lscope {
    lorch *O;
    int depth;                 /* depth this scope opened; 0 once closed */
} lscope;

/* Raise unless O may be used now, by this thread. */
static void orch_usable(lua_State *L, const lorch *O, const char *who)
{
    if (O->inspect_only && (!O->W->runs_open || O->W->session != O->session))
        lpto_error(L, who, "the submitted runs this orchestrator showed have all finished; call Worker:orch() again "
                           "while runs are outstanding");
    if (!O->valid)
        lpto_error(L, who, "this orchestrator's run has ended; an orchestrator is valid only while its run lasts "
                           "(inside the function given to Worker:run, or from Worker:open_run to Worker:close_run)");
    if (!pthread_equal(O->thread, pthread_self()))
        lpto_error(L, who, "the orchestrator can be used only by the function given to Worker:run, not from a sub "
                           "callable; return results through the sub's tensors and submit from that function");
}

/* Every caller is a function with the metatable upvalues (lpto_push_mt_upvalues). */
lorch *lpto_check_orch(lua_State *L, int idx, const char *who)
{
    lorch *O = lpto_testudata_up(L, idx, LPTO_UP_ORCH);
    if (!O) lpto_error(L, who, "expected the orchestrator given to the run function (call it as orch:...), got %s",
                       luaL_typename(L, idx));
    orch_usable(L, O, who);
    if (O->inspect_only)
        lpto_error(L, who, "this orchestrator (from Worker:orch() while submitted runs are outstanding) only inspects "
                           "them; submit from a run's function (Worker:submit, Worker:run)");
    return O;
}

lorch *lpto_check_orch_inspect(lua_State *L, int idx, const char *who)
{
    lorch *O = lpto_testudata_up(L, idx, LPTO_UP_ORCH);
    if (!O) lpto_error(L, who, "expected the orchestrator given to the run function (call it as orch:...), got %s",
                       luaL_typename(L, idx));
    orch_usable(L, O, who);
    return O;
}

const lhandle *lpto_check_handle(lua_State *L, int idx, lworker *W, const char *who)
{
    lhandle *h = luaL_testudata(L, idx, LPTO_HANDLE);
    if (!h)
        lpto_error(L, who, "argument %d must be a handle returned by Worker:register (got %s); register the function "
                           "or pto.chip_kernel first",
                   idx - 1, luaL_typename(L, idx));
    if (h->owner != W) lpto_error(L, who, "this handle was registered on another Worker; register it on this one");
    return h;
}

int lpto_wait_run(lworker *W, pto_orch *o)
{
    lpto_active_add(W->w);
    lpto_gil_release(W->gil);
    int rc = o ? pto_drain(o) : pto_run_end(W->w);
    lpto_gil_acquire(W->gil);
    lpto_active_remove(W->w);
    return rc;
}

/* The handle at idx, registered on O's Worker, for submit kind. */
static uint64_t check_handle(lua_State *L, int idx, lorch *O, int want, const char *who)
{
    const lhandle *h = lpto_testudata_up(L, idx, LPTO_UP_HANDLE);
    if (!h || h->owner != O->W) h = lpto_check_handle(L, idx, O->W, who);   /* raises */
    if (h->kind != want) {
        if (O->W->level >= 4)
            lpto_error(L, who, "this handle is a chip kernel, but a level-%d Worker has no chips: its next-level "
                               "children are Workers, which run an orchestration function registered with "
                               "Worker:register(fn); register chip kernels on the level-3 Workers",
                       O->W->level);
        lpto_error(L, who, "%s", want == LPTO_HANDLE_FUNCTION ? "this handle is a chip kernel; submit it with orch:submit_next_level"
                                               : "this handle is a Lua sub callable; submit it with orch:submit_sub");
    }
    return h->callable;
}

/* ---- Orchestrator -------------------------------------------------------------------- */

static pto_tensor *scratch(lua_State *L, lworker *W, int32_t n)
{
    if (n > W->scratch_cap) {
        pto_tensor *p = realloc(W->scratch, (size_t)n * sizeof *p);
        if (!p) luaL_error(L, "out of memory");
        W->scratch = p;
        W->scratch_cap = n;
    }
    return W->scratch;
}

/* The descriptor a submit passes for tensor t tagged tag, after checking
 * that t may be passed: an unset tensor_spec or a pto.temp tagged OUTPUT
 * goes unset (the submit allocates it); anything else must be live. */
static inline pto_tensor arg_desc(lua_State *L, const lpto_tensor *t, int tag, int i, const char *which,
                                  const char *who)
{
    const lpto_storage *st = t->st;
    if (st && st->valid && !st->temp) return t->t;
    if (!st || (st->temp && tag == PTO_OUTPUT)) {
        if (tag != PTO_OUTPUT)
            lpto_error(L, who, "%stensor %d is an unset pto.tensor_spec tagged '%s'; only an OUTPUT can be "
                               "unset (the submit allocates it)",
                       which, i + 1, pto_tag_name(tag));
        pto_tensor d = t->t;
        d.base = 0;
        d.offset = 0;
        return d;
    }
    if (!st->valid)
        lpto_error(L, who, "tensor %d's storage is gone: %s", i + 1,
                   st->why_invalid ? st->why_invalid : "it is no longer valid");
    return t->t;
}

/* Copy a TaskArgs into a pto_task_args over descs, checking each tensor. */
static void fill_args(lua_State *L, lpto_args *a, pto_tensor *descs, pto_task_args *out, const char *who, int which)
{
    const char *prefix = which ? (lua_pushfstring(L, "args %d: ", which), lua_tostring(L, -1)) : "";
    for (int32_t i = 0; i < a->nt; i++) descs[i] = arg_desc(L, a->tensors[i], a->tags[i], i, prefix, who);
    if (which) lua_pop(L, 1);
    *out = (pto_task_args){a->nt, a->ns, descs, a->tags, a->scalars};
}

/* Make depth's entries valid (lorch.depths). The serials of depths first
 * reached are the run's block (lpto_push_orch): first + 1 + depth. */
static void reach_depth(lorch *O, int depth)
{
    for (; O->depths <= depth; O->depths++) {
        O->scope_serial[O->depths] = O->serial + 1 + (uint64_t)O->depths;
        O->nlisted[O->depths] = 0;
    }
}

/* List the storage at st_idx under the current scope, whose end makes it
 * stale (invalidate_depth). A pto.temp rebound in the same scope is listed
 * once. The per-depth lists are reused: no table per scope. */
static void list_in_scope(lua_State *L, int oidx, lorch *O, int st_idx, lpto_storage *st)
{
    int depth = pto_scope_depth(O->o);
    reach_depth(O, depth);
    if (st->listed == O->scope_serial[depth]) return;
    st->listed = O->scope_serial[depth];
    st_idx = lua_absindex(L, st_idx);
    lua_getiuservalue(L, oidx, OUV_SCOPES);
    if (lua_rawgeti(L, -1, depth + 1) == LUA_TNIL) {
        lua_pop(L, 1);
        lua_newtable(L);
        lua_pushvalue(L, -1);
        lua_rawseti(L, -3, depth + 1);
    }
    lua_pushvalue(L, st_idx);
    lua_rawseti(L, -2, ++O->nlisted[depth]);
    lua_pop(L, 2);
}

/* Push a Storage for heap-ring memory d, listed under the current scope. */
static lpto_storage *push_ring_storage(lua_State *L, int oidx, lorch *O, const pto_tensor *d)
{
    lpto_storage *st = lpto_push_storage(L, d->base, pto_tensor_nbytes(d), LPTO_ST_RING);
    st->why_invalid = lpto_ring_gone;
    list_in_scope(L, oidx, O, -1, st);
    return st;
}

/* After a submit: the tensor t (at tidx) passed unset now has the heap-ring
 * memory d: an unset spec gets a Storage for good, a pto.temp's is moved. */
static void bind_output(lua_State *L, int oidx, lorch *O, lpto_tensor *t, int tidx, const pto_tensor *d)
{
    if (t->st && !t->st->temp) return;   /* passed twice: an earlier entry of the submit bound it */
    tidx = lua_absindex(L, tidx);
    t->t = *d;
    if (!t->st) {
        t->st = push_ring_storage(L, oidx, O, d);
        lua_setiuservalue(L, tidx, 1);
        return;
    }
    lpto_storage *st = t->st;
    st->base = d->base;
    st->nbytes = pto_tensor_nbytes(d);
    st->valid = true;
    st->why_invalid = lpto_ring_gone;
    lua_getiuservalue(L, tidx, 1);
    list_in_scope(L, oidx, O, -1, st);
    lua_pop(L, 1);
}

static inline bool unset_output(const lpto_tensor *t, int tag)
{
    return !t->st || (t->st->temp && tag == PTO_OUTPUT);
}

/* Keep the storage of tensor t (at tidx) alive for the run: a tensor Lua
 * drops must not give its memory back while a task still uses it. Each
 * storage is listed once per run; heap-ring memory is the engine's and
 * needs no pin. */
static inline void pin_tensor(lua_State *L, int oidx, lorch *O, const lpto_tensor *t, int tidx)
{
    lpto_storage *st = t->st;
    if (!st || st->kind == LPTO_ST_RING || st->pinned == O->serial) return;
    st->pinned = O->serial;
    tidx = lua_absindex(L, tidx);
    lua_getiuservalue(L, oidx, OUV_PINS);
    lua_getiuservalue(L, tidx, 1);
    lua_rawseti(L, -2, ++O->npins);
    lua_pop(L, 1);
}

/* After the submit of the TaskArgs at aidx: bind its unset OUTPUTs (unset
 * says which were unset before the submit) and pin its tensors. */
static void after_submit(lua_State *L, int oidx, lorch *O, int aidx, lpto_args *a, const pto_tensor *descs,
                         const uint8_t *unset)
{
    for (int32_t i = 0; i < a->nt; i++) {
        lpto_tensor *t = a->tensors[i];
        if (!unset[i] && (!t->st || t->st->kind == LPTO_ST_RING || t->st->pinned == O->serial)) continue;
        lpto_args_push_tensor(L, aidx, i + 1);
        if (unset[i]) bind_output(L, oidx, O, t, -1, &descs[i]);
        else pin_tensor(L, oidx, O, t, -1);
        lua_pop(L, 1);
    }
}

/* Submit the TaskArgs at stack indices aidx[0..n-1]. */
static int do_submit(lua_State *L, lorch *O, int oidx, int kind, uint64_t callable, const int *aidx, int n,
                     const pto_call_config *cfg, const int32_t *pins, int32_t pin, int64_t timeout_ms, const char *who)
{
    lworker *W = O->W;
    lpto_args *as[MAX_GROUP];
    int32_t total = 0;
    for (int i = 0; i < n; i++) {
        as[i] = lpto_testudata_up(L, aidx[i], LPTO_UP_ARGS);
        if (!as[i]) as[i] = lpto_checkargs(L, aidx[i], who);
        total += as[i]->nt;
    }
    pto_tensor *descs = scratch(L, W, total > 0 ? 2 * total : 2);
    uint8_t *unset = (uint8_t *)(descs + (total > 0 ? total : 1));   /* the second half: one byte per tensor */
    pto_task_args targs[MAX_GROUP];
    for (int i = 0, off = 0; i < n; i++) {
        fill_args(L, as[i], descs + off, &targs[i], who, n > 1 ? i + 1 : 0);
        for (int32_t j = 0; j < as[i]->nt; j++) unset[off + j] = unset_output(as[i]->tensors[j], as[i]->tags[j]);
        off += as[i]->nt;
    }
    if (timeout_ms >= 0 && pto_submit_timeout(O->o, timeout_ms) != 0) return lpto_engine_error(L, who);
    /* A Worker child's task brings its function's results back (lpto_result.c), each member of a group its own. */
    int box = W->level >= 4 && kind == PTO_NEXT_LEVEL ? lpto_result_attach(L, targs, n) : 0;
    /* Threads waiting for the interpreter lock get it here now and then; a
     * wait for ring space gives it up through pto_worker_on_block. */
    if (lpto_releases_gil(W)) lpto_gil_yield(W->gil);
    int64_t id;
    if (kind == PTO_SUB)
        id = n == 1 && !pins ? pto_submit_sub(O->o, callable, &targs[0], pin)
                             : pto_submit_sub_group(O->o, callable, targs, n, pins);
    else
        id = n == 1 && !pins ? pto_submit_next_level(O->o, callable, &targs[0], cfg, pin)
                             : pto_submit_next_level_group(O->o, callable, targs, n, cfg, pins);
    if (id < 0) return lpto_engine_error(L, who);
    for (int i = 0, off = 0; i < n; i++) {
        after_submit(L, oidx, O, aidx[i], as[i], descs + off, unset + off);
        off += as[i]->nt;
    }
    if (box) lpto_result_track(L, oidx, O, id, box);
    lua_pushinteger(L, id);
    return 1;
}

/* An options table's timeout_ms (its field at index f) into *timeout_ms; -1 when absent. */
static void opt_timeout(lua_State *L, int idx, const lpto_field *f, int64_t *timeout_ms, const lworker *W,
                        const char *who)
{
    lua_Integer t = 0;
    *timeout_ms = -1;
    if (!lpto_get_field(L, idx, f, &t, who)) return;
    if (t > 0 && W->mode == PTO_MODE_THREAD)
        lpto_error(L, who, "timeout_ms needs process mode: a thread cannot be stopped (this Worker runs in thread mode)");
    *timeout_ms = t;
}

#define OPT_TIMEOUT_FIELD {"timeout_ms", 0, 24 * 3600 * 1000}

/* {worker = id, timeout_ms = n}: the pin (-1 for none) and *timeout_ms (-1 for the Worker's). */
static int32_t opt_pin(lua_State *L, int idx, int nworkers, const char *kname, int64_t *timeout_ms, const lworker *W,
                       const char *who)
{
    *timeout_ms = -1;
    if (lua_isnoneornil(L, idx)) return -1;
    if (!lua_istable(L, idx))
        lpto_error(L, who, "options must be a table like {worker = 1} (got %s)", luaL_typename(L, idx));
    static const lpto_field fields[] = {{"worker", LUA_MININTEGER, LUA_MAXINTEGER}, OPT_TIMEOUT_FIELD, {NULL, 0, 0}};
    lpto_check_fields(L, idx, fields, who);
    opt_timeout(L, idx, &fields[1], timeout_ms, W, who);
    lua_Integer w = 0;
    if (!lpto_get_field(L, idx, &fields[0], &w, who)) return -1;
    if (w < 1 || w > nworkers)
        lpto_error(L, who, "worker %lld does not exist: this Worker has %d %s, numbered from 1", (long long)w, nworkers,
                   kname);
    return (int32_t)(w - 1);
}

/* Push each TaskArgs of the list at idx; returns the count (indices in aidx). */
static int push_members(lua_State *L, int idx, int *aidx, int cap, const char *who)
{
    if (!lua_istable(L, idx))
        lpto_error(L, who, "argument 2 must be a list of TaskArgs, one per member (got %s)", luaL_typename(L, idx));
    lua_Integer n = luaL_len(L, idx);
    if (n < 1) lpto_error(L, who, "a group needs at least one member (the list of TaskArgs is empty)");
    if (n > cap) lpto_error(L, who, "a group has at most %d members (got %lld)", cap, (long long)n);
    luaL_checkstack(L, (int)n + 8, who);
    for (lua_Integer i = 1; i <= n; i++) {
        lua_rawgeti(L, idx, i);
        if (!luaL_testudata(L, -1, LPTO_ARGS))
            lpto_error(L, who, "member %lld must be a TaskArgs (got %s)", (long long)i, luaL_typename(L, -1));
        aidx[i - 1] = lua_gettop(L);
    }
    return (int)n;
}

static int32_t *opt_group_pins(lua_State *L, int idx, int n, int nworkers, const char *kname, int32_t *pins,
                               int64_t *timeout_ms, const lworker *W, const char *who)
{
    *timeout_ms = -1;
    if (lua_isnoneornil(L, idx)) return NULL;
    if (!lua_istable(L, idx))
        lpto_error(L, who, "options must be a table like {workers = {1, 2}} (got %s)", luaL_typename(L, idx));
    static const lpto_field fields[] = {{"workers", 1, 0}, OPT_TIMEOUT_FIELD, {NULL, 0, 0}};
    lpto_check_fields(L, idx, fields, who);
    opt_timeout(L, idx, &fields[1], timeout_ms, W, who);
    lua_getfield(L, idx, "workers");
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        return NULL;
    }
    if (!lua_istable(L, -1) || luaL_len(L, -1) != n)
        lpto_error(L, who, "workers must be a list of %d worker ids, one per member", n);
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, -1, i + 1);
        int isint;
        lua_Integer w = lua_tointegerx(L, -1, &isint);
        if (!isint || w < 1 || w > nworkers)
            lpto_error(L, who, "workers[%d]: worker %s does not exist: this Worker has %d %s, numbered from 1", i + 1,
                       luaL_tolstring(L, -1, NULL), nworkers, kname);
        for (int k = 0; k < i; k++)
            if (pins[k] == w - 1)
                lpto_error(L, who, "workers[%d] and workers[%d] are both worker %lld; members need distinct workers",
                           k + 1, i + 1, (long long)w);
        pins[i] = (int32_t)(w - 1);
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    return pins;
}

/* A level-3 Worker's next-level children are chips, which run kernels; a
 * higher level's are Workers, which run orchestration functions. */
static int want_handle(const lorch *O, int kind) { return kind == PTO_SUB || O->W->level >= 4 ? LPTO_HANDLE_FUNCTION : LPTO_HANDLE_KERNEL; }
static int next_level_count(const lworker *W) { return W->level >= 4 ? W->nworkers : W->nchips; }
static const char *next_level_name(const lworker *W) { return W->level >= 4 ? "Worker children" : "chips"; }

/* orch:submit_next_level(h, args, cfg [, opts]) / orch:submit_sub(h [, args] [, opts]) */
static int submit_one(lua_State *L, int kind, const char *who)
{
    lorch *O = lpto_check_orch(L, 1, who);
    uint64_t c = check_handle(L, 2, O, want_handle(O, kind), who);
    int opts = kind == PTO_SUB ? 4 : 5;
    lua_settop(L, opts);
    if (lua_isnil(L, 3)) {
        if (kind != PTO_SUB) return lpto_error(L, who, "argument 2 must be a TaskArgs (got nil)");
        lpto_push_args(L);   /* a sub may take no arguments */
        lua_replace(L, 3);
    }
    const pto_call_config *cfg = kind == PTO_SUB ? NULL : lpto_optconfig(L, 4, who);
    int64_t tmo;
    int32_t pin = kind == PTO_SUB ? opt_pin(L, opts, O->W->nsubs, "sub workers", &tmo, O->W, who)
                                  : opt_pin(L, opts, next_level_count(O->W), next_level_name(O->W), &tmo, O->W, who);
    int aidx[1] = {3};
    return do_submit(L, O, 1, kind, c, aidx, 1, cfg, NULL, pin, tmo, who);
}

/* orch:submit_next_level_group(h, {args...}, cfg [, opts]) / orch:submit_sub_group(h, {args...} [, opts]) */
static int submit_group(lua_State *L, int kind, const char *who)
{
    lorch *O = lpto_check_orch(L, 1, who);
    uint64_t c = check_handle(L, 2, O, want_handle(O, kind), who);
    int opts = kind == PTO_SUB ? 4 : 5;
    lua_settop(L, opts);
    const pto_call_config *cfg = kind == PTO_SUB ? NULL : lpto_optconfig(L, 4, who);
    int aidx[MAX_GROUP];
    int n = push_members(L, 3, aidx, MAX_GROUP, who);
    int32_t pins[MAX_GROUP];
    int64_t tmo;
    int32_t *p = kind == PTO_SUB
                     ? opt_group_pins(L, opts, n, O->W->nsubs, "sub workers", pins, &tmo, O->W, who)
                     : opt_group_pins(L, opts, n, next_level_count(O->W), next_level_name(O->W), pins, &tmo, O->W, who);
    return do_submit(L, O, 1, kind, c, aidx, n, cfg, p, -1, tmo, who);
}

static int o_submit_next_level(lua_State *L) { return submit_one(L, PTO_NEXT_LEVEL, "orch:submit_next_level"); }
static int o_submit_sub(lua_State *L) { return submit_one(L, PTO_SUB, "orch:submit_sub"); }
static int o_submit_next_level_group(lua_State *L)
{
    return submit_group(L, PTO_NEXT_LEVEL, "orch:submit_next_level_group");
}
static int o_submit_sub_group(lua_State *L) { return submit_group(L, PTO_SUB, "orch:submit_sub_group"); }

/* ---- prepared submits -------------------------------------------------------------
 * orch:prepare_next_level(h, {tags...} [, cfg] [, opts]) returns a function
 * that submits h with its arguments as the tensors, tagged in order, and
 * any further arguments as scalars. What a plain submit does per call (the
 * handle, tags, config and options checked and parsed, a TaskArgs built)
 * is done once; a call checks each tensor by metatable identity, builds the
 * arguments on the C stack and allocates nothing, in Lua or in C. */
#define PREP_MAX_TENSORS 64
#define PREP_MAX_SCALARS 16

typedef struct lprep {
    lorch *O;
    int kind;
    uint64_t callable;
    int32_t pin;
    int64_t timeout_ms;        /* from its options, -1 for the Worker's */
    int32_t nt;
    const pto_call_config *cfg;   /* the CallConfig userdata (upvalue 4: alive), or NULL */
    const char *who;
    uint8_t tags[PREP_MAX_TENSORS];
} lprep;

static uint64_t scalar_bits(lua_State *L, int idx, const char *who)
{
    if (lua_isinteger(L, idx)) return (uint64_t)lua_tointeger(L, idx);
    int t = lua_type(L, idx);
    if (t == LUA_TNUMBER) {
        double d = lua_tonumber(L, idx);
        uint64_t bits;
        memcpy(&bits, &d, sizeof bits);
        return bits;
    }
    if (t == LUA_TBOOLEAN) return (uint64_t)lua_toboolean(L, idx);
    return (uint64_t)lpto_error(L, who, "argument %d: a scalar must be an integer, a float or a boolean (got %s)", idx,
                                luaL_typename(L, idx));
}

/* Upvalues: 1 the Tensor metatable (LPTO_UP_TENSOR), 2 the lprep, 3 the
 * orchestrator, 4 the CallConfig if any (read at each call, as a plain
 * submit reads the one it is given). */
static int prep_call(lua_State *L)
{
    const lprep *P = lua_touserdata(L, lua_upvalueindex(2));
    lorch *O = P->O;
    const char *who = P->who;
    orch_usable(L, O, who);
    int top = lua_gettop(L), nt = P->nt;
    if (top < nt)
        return lpto_error(L, who, "expected %d tensors, one per tag it was prepared with, then any scalars (got %d "
                                  "arguments)",
                          nt, top);
    int ns = top - nt;
    if (ns > PREP_MAX_SCALARS)
        return lpto_error(L, who, "at most %d scalars may follow the %d tensors (got %d)", PREP_MAX_SCALARS, nt, ns);
    pto_tensor descs[PREP_MAX_TENSORS];
    lpto_tensor *ts[PREP_MAX_TENSORS];
    uint64_t scalars[PREP_MAX_SCALARS];
    for (int i = 0; i < nt; i++) {
        lpto_tensor *t = lpto_testudata_up(L, i + 1, LPTO_UP_TENSOR);
        if (!t)
            return lpto_error(L, who, "argument %d must be a tensor (prepared with tag '%s'), got %s", i + 1,
                              pto_tag_name(P->tags[i]), luaL_typename(L, i + 1));
        ts[i] = t;
        descs[i] = arg_desc(L, t, P->tags[i], i, "", who);
    }
    for (int j = 0; j < ns; j++) scalars[j] = scalar_bits(L, nt + 1 + j, who);
    pto_task_args a = {nt, ns, descs, P->tags, scalars};
    lworker *W = O->W;
    if (P->timeout_ms >= 0 && pto_submit_timeout(O->o, P->timeout_ms) != 0) return lpto_engine_error(L, who);
    /* A Worker child's task brings its function's results back (lpto_result.c). */
    int box = W->level >= 4 && P->kind == PTO_NEXT_LEVEL ? lpto_result_attach(L, &a, 1) : 0;
    if (lpto_releases_gil(W)) lpto_gil_yield(W->gil);
    int64_t id = P->kind == PTO_SUB ? pto_submit_sub(O->o, P->callable, &a, P->pin)
                                    : pto_submit_next_level(O->o, P->callable, &a, P->cfg, P->pin);
    if (id < 0) return lpto_engine_error(L, who);
    int oidx = lua_upvalueindex(3);
    for (int i = 0; i < nt; i++) {
        if (unset_output(ts[i], P->tags[i])) bind_output(L, oidx, O, ts[i], i + 1, &descs[i]);
        else pin_tensor(L, oidx, O, ts[i], i + 1);
    }
    if (box) lpto_result_track(L, oidx, O, id, box);
    lua_pushinteger(L, id);
    return 1;
}

static int prepare(lua_State *L, int kind, const char *who, const char *call_who)
{
    lorch *O = lpto_check_orch(L, 1, who);
    uint64_t c = check_handle(L, 2, O, want_handle(O, kind), who);
    int opts = kind == PTO_SUB ? 4 : 5;
    lua_settop(L, opts);
    if (!lua_istable(L, 3))
        return lpto_error(L, who, "argument 2 must be the list of tags, one per tensor, like {\"in\", \"in\", "
                                  "\"out\"} (got %s)",
                          luaL_typename(L, 3));
    lua_Integer n = luaL_len(L, 3);
    if (n > PREP_MAX_TENSORS)
        return lpto_error(L, who, "at most %d tensors per prepared submit (got %lld tags)", PREP_MAX_TENSORS,
                          (long long)n);
    const pto_call_config *cfg = kind == PTO_SUB ? NULL : lpto_optconfig(L, 4, who);
    int64_t tmo;
    int32_t pin = kind == PTO_SUB ? opt_pin(L, opts, O->W->nsubs, "sub workers", &tmo, O->W, who)
                                  : opt_pin(L, opts, next_level_count(O->W), next_level_name(O->W), &tmo, O->W, who);
    lprep *P = lua_newuserdatauv(L, sizeof *P, 0);
    memset(P, 0, sizeof *P);
    *P = (lprep){.O = O, .kind = kind, .callable = c, .pin = pin, .timeout_ms = tmo, .nt = (int32_t)n, .cfg = cfg, .who = call_who};
    for (lua_Integer i = 1; i <= n; i++) {
        lua_rawgeti(L, 3, i);
        if (lua_isnil(L, -1))
            return lpto_error(L, who, "tags[%lld] is nil; give one tag per tensor", (long long)i);
        P->tags[i - 1] = (uint8_t)lpto_parse_tag(L, -1, who);
        lua_pop(L, 1);
    }
    lua_pushvalue(L, lua_upvalueindex(LPTO_UP_TENSOR));
    lua_pushvalue(L, -2);
    lua_pushvalue(L, 1);
    lua_pushvalue(L, 4);
    lua_pushcclosure(L, prep_call, 4);
    return 1;
}

static int o_prepare_next_level(lua_State *L)
{
    return prepare(L, PTO_NEXT_LEVEL, "orch:prepare_next_level", "orch:submit_next_level (prepared)");
}
static int o_prepare_sub(lua_State *L) { return prepare(L, PTO_SUB, "orch:prepare_sub", "orch:submit_sub (prepared)"); }

static int o_alloc(lua_State *L)
{
    const char *who = "orch:alloc";
    lorch *O = lpto_check_orch(L, 1, who);
    pto_tensor d = {0};
    d.ndims = (uint8_t)lpto_parse_shape(L, 2, d.shape, who);
    d.dtype = (uint8_t)lpto_parse_dtype(L, 3, who);
    if (lpto_releases_gil(O->W)) lpto_gil_yield(O->W->gil);
    int64_t id = pto_alloc(O->o, d.shape, d.ndims, d.dtype, &d);
    if (id < 0) return lpto_engine_error(L, who);
    push_ring_storage(L, 1, O, &d);
    lpto_push_tensor_mt(L, &d, -1, lua_upvalueindex(LPTO_UP_TENSOR));
    return 1;
}

/* Heap-ring tensors bound at depth become invalid when its scope ends. */
static void invalidate_depth(lua_State *L, int oidx, lorch *O, int depth)
{
    if (depth >= O->depths) return;   /* never reached: nothing listed, and its serial is still unused */
    if (O->nlisted[depth] > 0) {
        lua_getiuservalue(L, oidx, OUV_SCOPES);
        lua_rawgeti(L, -1, depth + 1);
        for (lua_Integer i = 1; i <= O->nlisted[depth]; i++) {
            lua_rawgeti(L, -1, i);
            ((lpto_storage *)lua_touserdata(L, -1))->valid = false;
            lua_pop(L, 1);
            lua_pushnil(L);   /* the list is kept for the next scope at this depth; its entries are not */
            lua_rawseti(L, -2, i);
        }
        lua_pop(L, 2);
        O->nlisted[depth] = 0;
    }
    O->scope_serial[depth] = lpto_next_serial();
}

uint64_t lpto_next_serials(uint64_t n)
{
    static _Atomic uint64_t next;
    return atomic_fetch_add_explicit(&next, n, memory_order_relaxed) + 1;
}

uint64_t lpto_next_serial(void) { return lpto_next_serials(1); }

lorch *lpto_push_orch(lua_State *L, int widx, lworker *W, pto_orch *o)
{
    widx = lua_absindex(L, widx);
    lorch *O = lua_newuserdatauv(L, sizeof *O, OUV_COUNT);
    memset(O, 0, offsetof(lorch, scope_serial));   /* the per-depth arrays are set as depths are reached */
    O->W = W;
    O->o = o;
    O->valid = true;
    O->thread = pthread_self();
    /* One atomic add for the run and every depth's first scope (reach_depth). */
    O->serial = lpto_next_serials(PTO_MAX_SCOPE_DEPTH + 3);
    luaL_setmetatable(L, LPTO_ORCH);
    lua_pushvalue(L, widx);
    lua_setiuservalue(L, -2, OUV_WORKER);
    lua_newtable(L);
    lua_setiuservalue(L, -2, OUV_SCOPES);
    lua_createtable(L, W->pins_hint, 0);   /* runs of one loop pin the same storages: no regrowth per run */
    lua_setiuservalue(L, -2, OUV_PINS);
    return O;
}

void lpto_orch_end(lua_State *L, int oidx)
{
    oidx = lua_absindex(L, oidx);
    lorch *O = lua_touserdata(L, oidx);
    O->valid = false;
    O->W->pins_hint = O->npins < (1 << 20) ? O->npins : 1 << 20;
    for (int depth = 0; depth < O->depths; depth++) invalidate_depth(L, oidx, O, depth);
    lua_pushnil(L);   /* the run's tensors need no pinning any more */
    lua_setiuservalue(L, oidx, OUV_PINS);
}

/* Where the Lua code that opens a scope is, so that a deadlock names it
 * (pto_scope_label). Every scope pays for it, so no printf: "src:line". */
static void label_scope(lua_State *L, lorch *O)
{
    lua_Debug ar;
    if (!lua_getstack(L, 1, &ar) || !lua_getinfo(L, "Sl", &ar) || ar.currentline <= 0) return;
    char label[LUA_IDSIZE + 16], digits[12];
    size_t n = strlen(ar.short_src), k = 0;
    memcpy(label, ar.short_src, n);
    label[n++] = ':';
    for (unsigned v = (unsigned)ar.currentline; v; v /= 10) digits[k++] = (char)('0' + v % 10);
    while (k) label[n++] = digits[--k];
    label[n] = '\0';
    pto_scope_label(O->o, label);
}

static int scope_begin(lua_State *L, lorch *O, const char *who)
{
    if (pto_scope_begin(O->o) != 0) return lpto_engine_error(L, who);
    label_scope(L, O);
    int depth = pto_scope_depth(O->o);
    reach_depth(O, depth);
    O->scope_serial[depth] = lpto_next_serial();
    return depth;
}

static void scope_end(lua_State *L, int oidx, lorch *O, const char *who)
{
    int depth = pto_scope_depth(O->o);
    if (pto_scope_end(O->o) != 0) lpto_engine_error(L, who);
    invalidate_depth(L, oidx, O, depth);
}

static int o_scope_begin(lua_State *L)
{
    lorch *O = lpto_check_orch(L, 1, "orch:scope_begin");
    lua_pushinteger(L, scope_begin(L, O, "orch:scope_begin"));
    return 1;
}

static int o_scope_end(lua_State *L)
{
    lorch *O = lpto_check_orch(L, 1, "orch:scope_end");
    scope_end(L, 1, O, "orch:scope_end");
    return 0;
}

static int sc_close(lua_State *L)
{
    lscope *S = luaL_checkudata(L, 1, LPTO_SCOPE);
    if (S->depth == 0) return 0;
    lua_getiuservalue(L, 1, 1);
    lorch *O = lua_touserdata(L, -1);
    int oidx = lua_gettop(L);
    if (!O->valid) return 0;   /* the run ended: its end closed every scope */
    if (!pthread_equal(O->thread, pthread_self()))
        return lpto_error(L, "orch:scope", "a scope can be closed only by the function given to Worker:run, not "
                                           "from a sub callable");
    int depth = S->depth;
    S->depth = 0;
    if (pto_scope_depth(O->o) != depth)
        return lpto_error(L, "orch:scope", "scopes closed out of order: this scope opened at depth %d but the "
                                          "innermost open scope is at depth %d", depth, pto_scope_depth(O->o));
    scope_end(L, oidx, O, "orch:scope");
    return 0;
}

/* orch:scope(fn) runs fn inside a scope; orch:scope() returns a
 * to-be-closed value: do local s <close> = orch:scope() ... end */
static int o_scope(lua_State *L)
{
    const char *who = "orch:scope";
    lorch *O = lpto_check_orch(L, 1, who);
    if (lua_isnoneornil(L, 2)) {
        lscope *S = lua_newuserdatauv(L, sizeof *S, 1);
        S->O = O;
        S->depth = 0;
        lua_pushvalue(L, lua_upvalueindex(LPTO_UP_SCOPE));
        lua_setmetatable(L, -2);
        lua_pushvalue(L, 1);
        lua_setiuservalue(L, -2, 1);
        S->depth = scope_begin(L, O, who);
        return 1;
    }
    if (!lua_isfunction(L, 2))
        return lpto_error(L, who, "expected a function to run inside the scope, or nothing for the <close> form (got %s)",
                          luaL_typename(L, 2));
    int depth = scope_begin(L, O, who);
    int base = lua_gettop(L);
    lua_pushvalue(L, 2);
    lua_pushvalue(L, 1);
    int status = lua_pcall(L, 1, LUA_MULTRET, 0);
    if (O->valid && pto_scope_depth(O->o) == depth) scope_end(L, 1, O, who);
    else if (status == LUA_OK && O->valid)
        return lpto_error(L, who, "the function left scopes open (depth %d, expected %d); close every scope_begin "
                                  "with scope_end",
                          pto_scope_depth(O->o), depth);
    if (status != LUA_OK) return lua_error(L);
    return lua_gettop(L) - base;
}

static int o_scope_depth(lua_State *L)
{
    lorch *O = lpto_check_orch_inspect(L, 1, "orch:scope_depth");
    lua_pushinteger(L, pto_scope_depth(O->o));
    return 1;
}

static int o_drain(lua_State *L)
{
    lorch *O = lpto_check_orch(L, 1, "orch:drain");
    if (lpto_wait_run(O->W, O->o) != 0) return lpto_engine_error(L, "orch:drain");
    return 0;
}

static int o_task_count(lua_State *L)
{
    lorch *O = lpto_check_orch_inspect(L, 1, "orch:task_count");
    lua_pushinteger(L, pto_task_count(O->o));
    return 1;
}

static int o_worker(lua_State *L)
{
    lpto_check_orch_inspect(L, 1, "orch:worker");
    lua_getiuservalue(L, 1, OUV_WORKER);
    return 1;
}

static int o_tostring(lua_State *L)
{
    lorch *O = lua_touserdata(L, 1);
    if (!O->valid) lua_pushliteral(L, "Orchestrator(run ended)");
    else if (!pthread_equal(O->thread, pthread_self())) lua_pushliteral(L, "Orchestrator(in use by its run)");
    else lua_pushfstring(L, "Orchestrator(%d tasks, scope depth %d)", (int)pto_task_count(O->o), pto_scope_depth(O->o));
    return 1;
}

/* pto._check_orch(orch, who): raise as lpto_check_orch does for the Lua method who
 * (the methods written in Lua, lua/pto/inspect.lua). */
static int l_check_orch(lua_State *L)
{
    lpto_check_orch_inspect(L, 1, luaL_checkstring(L, 2));
    return 0;
}

/* pto._extend_orch(table): methods written in Lua (lua/pto/inspect.lua),
 * found through the C methods table's own __index: a method call is then
 * table lookups in the VM, with no C function to find it. */
static int l_extend_orch(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    luaL_getmetatable(L, LPTO_ORCH);
    lua_getfield(L, -1, "methods");
    lua_createtable(L, 0, 1);
    lua_pushvalue(L, 1);
    lua_setfield(L, -2, "__index");
    lua_setmetatable(L, -2);
    return 0;
}

void lpto_open_orch(lua_State *L)
{
    luaL_newmetatable(L, LPTO_ORCH);
    static const luaL_Reg ometa[] = {{"__tostring", o_tostring}, {NULL, NULL}};
    luaL_setfuncs(L, ometa, 0);
    static const luaL_Reg omethods[] = {
        {"submit_next_level", o_submit_next_level}, {"submit_next_level_group", o_submit_next_level_group},
        {"submit_sub", o_submit_sub}, {"submit_sub_group", o_submit_sub_group}, {"alloc", o_alloc},
        {"scope", o_scope}, {"scope_begin", o_scope_begin}, {"scope_end", o_scope_end},
        {"scope_depth", o_scope_depth}, {"task", lpto_orch_task}, {"task_count", o_task_count}, {"drain", o_drain}, {"tensormap", lpto_orch_tensormap}, {"result", lpto_orch_result}, {"worker", o_worker},
        {"prepare_next_level", o_prepare_next_level}, {"prepare_sub", o_prepare_sub},
        {NULL, NULL}};
    lua_newtable(L);
    lpto_push_mt_upvalues(L);
    luaL_setfuncs(L, omethods, LPTO_UP_COUNT);
    lua_pushvalue(L, -1);
    lua_setfield(L, -3, "methods");   /* for the REPL's completion */
    lua_setfield(L, -2, "__index");
    lua_pop(L, 1);

    luaL_newmetatable(L, LPTO_SCOPE);
    lua_pushcfunction(L, sc_close);
    lua_setfield(L, -2, "__close");
    lua_pop(L, 1);

    static const luaL_Reg fns[] = {{"_extend_orch", l_extend_orch}, {"_check_orch", l_check_orch}, {NULL, NULL}};
    lpto_push_mt_upvalues(L);
    luaL_setfuncs(L, fns, LPTO_UP_COUNT);
    lpto_set_int(L, "MAX_SCOPE_DEPTH", PTO_MAX_SCOPE_DEPTH);
}
