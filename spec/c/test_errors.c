/* The engine's error messages through pto.h: each misuse fails with a
 * message that says what was wrong in the engine's own terms. The Lua
 * binding names the Lua function a user called in front of these messages
 * (as luaL_argerror does), so the engine must never name one itself: a C
 * user would read names of an API they do not use. Every message provoked
 * here is checked for its content and for the absence of Lua names. */
#include <stdlib.h>
#include <string.h>

#include "pto.h"
#include "testutil.h"

/* What only the Lua API calls things: its method and module names. */
static const char *const LUA_NAMES[] = {
    "orch:", "Worker:", "TaskArgs:", "Tensor:", "pto.", "submit_next_level", "submit_sub", "add_worker",
    "chip_kernel", "in Lua", ":step", ":release", ":hold", ":break", NULL,
};

static int messages;

/* The last failing call's message contains want and no Lua name. */
#define CHECK_MSG(want) check_msg(__FILE__, __LINE__, (want))
static void check_msg(const char *file, int line, const char *want)
{
    const char *m = pto_errmsg();
    messages++;
    tu_checks++;
    if (!strstr(m, want)) {
        tu_failures++;
        fprintf(stderr, "%s:%d: expected \"%s\" in \"%s\"\n", file, line, want, m);
    }
    tu_checks++;
    if (pto_errcode() == PTO_ERR_NONE) {
        tu_failures++;
        fprintf(stderr, "%s:%d: pto_errcode() is PTO_ERR_NONE after a failure\n", file, line);
    }
    for (int i = 0; LUA_NAMES[i]; i++) {
        tu_checks++;
        if (strstr(m, LUA_NAMES[i])) {
            tu_failures++;
            fprintf(stderr, "%s:%d: the engine names the Lua API (\"%s\") in \"%s\"\n", file, line, LUA_NAMES[i], m);
        }
    }
}

static int fail_leaf(void *ctx, uint64_t callable, const pto_args_view *args, const pto_call_config *cfg, char *err,
                     size_t errlen)
{
    (void)ctx, (void)callable, (void)args, (void)cfg;
    snprintf(err, errlen, "the leaf failed on purpose");
    return 1;
}

static void test_worker_config(void)
{
    CHECK(!pto_worker_new(&(pto_worker_config){.level = 2}));
    CHECK_MSG("level must be 3 or more");
    CHECK(!pto_worker_new(&(pto_worker_config){.level = 3, .mode = 7}));
    CHECK_MSG("unknown mode 7");
    CHECK(!pto_worker_new(&(pto_worker_config){.level = 3, .heap_ring_size = 16}));
    CHECK_MSG("heap_ring_size must be between");
    CHECK(!pto_worker_new(&(pto_worker_config){.level = 3, .queue_depth = 1 << 20}));
    CHECK_MSG("queue_depth must be at most");
}

static void test_registration(void)
{
    CHECK_EQ(pto_worker_add_next_level(NULL, &(pto_leaf){.run = fail_leaf}), -1);
    CHECK_MSG("no Worker");
    pto_worker *w = pto_worker_new(&(pto_worker_config){.level = 3});
    CHECK_EQ(pto_worker_add_sub(w, &(pto_leaf){.name = "no run"}), -1);
    CHECK_MSG("the leaf has no run function");
    CHECK_EQ(pto_worker_add_next_level(w, &(pto_leaf){.run = fail_leaf, .name = "chip"}), 0);
    CHECK(!pto_run_begin(w));
    CHECK_MSG("not initialised");
    CHECK_EQ(pto_worker_init(w), 0);
    CHECK_EQ(pto_worker_init(w), -1);
    CHECK_MSG("already initialised");
    CHECK_EQ(pto_worker_add_sub(w, &(pto_leaf){.run = fail_leaf}), -1);
    CHECK_MSG("already initialised");
    CHECK_EQ(pto_worker_ship_callable(w, 5, 1, "x", 1), -1);
    CHECK_MSG("unknown worker kind 5");
    CHECK_EQ(pto_worker_ship_callable(w, PTO_SUB, 1, NULL, 0), -1);
    CHECK_MSG("nothing to ship");
    pto_child_info ci;
    CHECK_EQ(pto_worker_child_info_get(w, PTO_SUB, 3, &ci), -1);
    CHECK_MSG("no sub worker 4");
    CHECK_EQ(pto_run_end(w), -1);
    CHECK_MSG("no run is open");
    pto_worker_close(w);
    CHECK_EQ(pto_worker_init(NULL), -1);
    CHECK_MSG("no Worker");
}

static void test_kernels(void)
{
    CHECK_EQ(pto_kernel_register(NULL, NULL), -1);
    CHECK_MSG("symbol is missing");
    CHECK_EQ(pto_kernel_register(NULL, "no_such_kernel"), -1);
    CHECK_MSG("no kernel 'no_such_kernel'");
    CHECK_EQ(pto_kernel_register("/nonexistent/libk.so", "k"), -1);
    CHECK_MSG("cannot load chip runtime /nonexistent/libk.so");
}

static void test_memory(void)
{
    CHECK(!pto_shm_alloc(0));
    CHECK_MSG("cannot allocate 0 bytes");
    int local;
    pto_shm_free(&local);
    CHECK_MSG("it is not in the shared tensor memory");
}

/* Submits, allocs and scopes that the orchestrator refuses. */
static void test_submits(void)
{
    pto_worker *w = tu_worker(2, 0, tu_gate_leaf, NULL, 1 << 20, 1000);
    pto_orch *o = pto_run_begin(w);
    CHECK(o != NULL);
    CHECK(!pto_run_begin(w));
    CHECK_MSG("runs do not nest");

    uint64_t base = (uint64_t)(uintptr_t)pto_shm_alloc(4096);
    pto_tensor t = tu_tensor(base, 0, 16);
    uint8_t tag = PTO_INPUT;
    pto_task_args a = {1, 0, &t, &tag, NULL};
    CHECK_EQ(pto_submit_next_level(o, 1, NULL, NULL, -1), -1);
    CHECK_MSG("missing task args");
    CHECK_EQ(pto_submit_sub(o, 1, &a, -1), -1);
    CHECK_MSG("this Worker has no sub workers");
    CHECK_EQ(pto_submit_next_level(o, 1, &a, NULL, 7), -1);
    CHECK_MSG("worker 7 does not exist");
    CHECK_EQ(pto_submit_next_level_group(o, 1, &a, 0, NULL, NULL), -1);
    CHECK_MSG("a group needs at least one member");
    pto_task_args three[3] = {a, a, a};
    CHECK_EQ(pto_submit_next_level_group(o, 1, three, 3, NULL, NULL), -1);
    CHECK_MSG("needs 3 distinct");
    CHECK_EQ(pto_submit_next_level_group(o, 1, three, 2, NULL, (int32_t[]){1, 1}), -1);
    CHECK_MSG("pinned to the same worker");
    pto_task_args bad = {-1, 0, NULL, NULL, NULL};
    CHECK_EQ(pto_submit_next_level(o, 1, &bad, NULL, -1), -1);
    CHECK_MSG("malformed task args");
    uint8_t badtag = 9;
    pto_task_args tagged = {1, 0, &t, &badtag, NULL};
    CHECK_EQ(pto_submit_next_level(o, 1, &tagged, NULL, -1), -1);
    CHECK_MSG("tensor 1 has unknown tag 9");
    pto_tensor odd = t;
    odd.dtype = 99;
    pto_task_args typed = {1, 0, &odd, &tag, NULL};
    CHECK_EQ(pto_submit_next_level(o, 1, &typed, NULL, -1), -1);
    CHECK_MSG("tensor 1 has unknown dtype 99");
    pto_tensor unset = tu_tensor(0, 0, 16);
    pto_task_args in_unset = {1, 0, &unset, &tag, NULL};
    CHECK_EQ(pto_submit_next_level(o, 1, &in_unset, NULL, -1), -1);
    CHECK_MSG("only an OUTPUT tensor may be unset");

    pto_tensor out;
    CHECK_EQ(pto_alloc(o, (uint32_t[]){4}, PTO_MAX_DIMS + 1, PTO_F32, &out), -1);
    CHECK_MSG("a shape has 0 to");
    CHECK_EQ(pto_alloc(o, (uint32_t[]){4}, 1, 99, &out), -1);
    CHECK_MSG("unknown dtype 99");
    CHECK_EQ(pto_alloc(o, (uint32_t[]){1 << 20, 64}, 2, PTO_F32, &out), -1);
    CHECK_MSG("do not fit in a heap ring");

    CHECK_EQ(pto_scope_end(o), -1);
    CHECK_MSG("no scope is open");
    int depth = 0;
    while (pto_scope_begin(o) == 0) depth++;
    CHECK_MSG("scopes nest at most");
    while (depth-- > 0) pto_scope_end(o);

    pto_task_info info;
    CHECK_EQ(pto_task_info_get(o, 99, &info), -1);
    CHECK_MSG("no task 99");
    CHECK_EQ(pto_run_end(w), 0);
    CHECK_EQ(pto_submit_next_level(o, 1, &a, NULL, -1), -1);
    CHECK_MSG("outside its run");
    CHECK_EQ(pto_scope_begin(NULL), -1);
    CHECK_MSG("no orchestrator");
    pto_worker_close(w);
    pto_shm_free((void *)(uintptr_t)base);
}

static void test_dispatch(void)
{
    CHECK_EQ(pto_dispatch_hold(NULL, 1), -1);
    CHECK_MSG("not initialised");
    pto_worker *w = tu_worker(1, 0, tu_gate_leaf, NULL, 1 << 20, 1000);
    CHECK_EQ(pto_dispatch_step(w, 1), -1);
    CHECK_MSG("dispatch is not held");
    CHECK_EQ(pto_dispatch_hold(w, 1), 0);
    CHECK_EQ(pto_dispatch_step(w, 0), -1);
    CHECK_MSG("at least 1");
    CHECK_EQ(pto_dispatch_break(w, 9, 1, 1), -1);
    CHECK_MSG("unknown worker kind 9");
    CHECK_EQ(pto_dispatch_hold(w, 0), 0);
    pto_worker_close(w);
}

static void test_trace(void)
{
    CHECK_EQ(pto_trace_start(NULL, 0), -1);
    CHECK_MSG("no Worker");
    pto_worker *w = tu_worker(1, 0, tu_gate_leaf, NULL, 1 << 20, 1000);
    CHECK_EQ(pto_trace_stop(w, NULL), -1);
    CHECK_MSG("not tracing");
    CHECK_EQ(pto_trace_attach(w, "{}", 2), -1);
    CHECK_MSG("no trace to attach");
    CHECK_EQ(pto_trace_start(w, 0xffffffffu), -1);
    CHECK_MSG("a trace buffer holds at most");
    CHECK_EQ(pto_trace_start(w, 0), 0);
    CHECK_EQ(pto_trace_start(w, 0), -1);
    CHECK_MSG("already tracing");
    CHECK_EQ(pto_trace_format(w, 1, "w", NULL, 0), -1);
    CHECK_MSG("no stopped trace");
    CHECK_EQ(pto_trace_stop(w, "/nonexistent-dir/trace.json"), -1);
    CHECK_MSG("cannot write the trace to '/nonexistent-dir/trace.json'");
    pto_worker_close(w);
}

/* A failed run: the message names the task, its callable and its worker, and the leaf's reason. */
static void test_run_failure(void)
{
    pto_worker *w = pto_worker_new(&(pto_worker_config){.level = 3});
    CHECK_EQ(pto_worker_add_next_level(w, &(pto_leaf){.run = fail_leaf, .name = "chip 1"}), 0);
    CHECK_EQ(pto_worker_init(w), 0);
    pto_worker_callable_name_set(w, PTO_NEXT_LEVEL, 5, "doomed");
    pto_orch *o = pto_run_begin(w);
    CHECK(pto_submit_next_level(o, 5, &(pto_task_args){0}, NULL, -1) >= 0);
    CHECK_EQ(pto_run_end(w), -1);
    CHECK_MSG("task 0 (callable 'doomed' on chip 1) failed: the leaf failed on purpose");
    pto_worker_close(w);
}

int main(void)
{
    if (pto_shm_init(64u << 20) != 0) {
        fprintf(stderr, "pto_shm_init: %s\n", pto_errmsg());
        return 1;
    }
    RUN(test_worker_config);
    RUN(test_registration);
    RUN(test_kernels);
    RUN(test_memory);
    RUN(test_submits);
    RUN(test_dispatch);
    RUN(test_trace);
    RUN(test_run_failure);
    printf("%d messages checked\n", messages);
    CHECK(messages >= 50);
    return tu_finish();
}
