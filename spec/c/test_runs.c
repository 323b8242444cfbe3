/*
 * test_runs.c - submitted runs at the C API (run.c): runs in flight ordered
 * across runs by the tag rules, per-run counts and first failure, a failure
 * poisoning only its dependants in a later run, cancellation, the session's
 * end and a blocking run after it, and the misuse errors.
 */
#include "testutil.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GATED 777     /* blocks while g_gate is set */
#define FAILS 666     /* fails */
#define INC 5         /* adds 1 to element 0 of tensor 0 (an INOUT chain) */

static _Atomic int g_gate;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int leaf(void *ctx, uint64_t callable, const pto_args_view *args, const pto_call_config *cfg, char *err,
                size_t errlen)
{
    (void)ctx; (void)cfg;
    uint64_t t0 = now_ms();
    while (callable == GATED && atomic_load(&g_gate) && now_ms() - t0 < 5000) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    if (callable == FAILS) {
        snprintf(err, errlen, "boom");
        return 1;
    }
    if (callable == INC && args->tensor_count > 0) ((float *)(uintptr_t)args->tensors[0].base)[0] += 1.0f;
    return 0;
}

static int64_t submit1(pto_orch *o, uint64_t callable, float *buf, uint8_t tag)
{
    pto_tensor t = tu_tensor((uint64_t)(uintptr_t)buf, 0, 4);
    pto_task_args a = {.tensor_count = 1, .tensors = &t, .tags = &tag};
    int64_t id = pto_submit_next_level(o, callable, &a, NULL, -1);
    if (id < 0) fprintf(stderr, "submit: %s\n", pto_errmsg());
    return id;
}

static void test_inout_chain_over_runs(void)
{
    pto_worker *w = tu_worker(2, 0, leaf, NULL, 1 << 20, 5000);
    float *x = calloc(4, sizeof *x);
    pto_run *runs[50];
    for (int i = 0; i < 50; i++) {
        pto_orch *o = pto_run_submit(w, &runs[i]);
        CHECK(o != NULL);
        CHECK(submit1(o, INC, x, PTO_INOUT) >= 0);
        CHECK_EQ(pto_run_submitted(w, runs[i]), 0);
    }
    for (int i = 0; i < 50; i++) {
        CHECK_EQ(pto_run_wait(w, runs[i], -1), 1);
        pto_run_info in;
        pto_run_info_get(runs[i], &in);
        CHECK_EQ(in.state, PTO_RUN_OK);
        CHECK_EQ(in.submitted, 1);
        CHECK_EQ(in.completed, 1);
        CHECK_EQ(in.id, i + 1);
    }
    CHECK_EQ(x[0], 50);
    CHECK_EQ(pto_runs_live(w), 0);
    CHECK_EQ(pto_runs_end(w), 1);
    CHECK_EQ(pto_runs_end(w), 0);   /* none open */
    /* a blocking run after the session */
    pto_orch *o = pto_run_begin(w);
    CHECK(o != NULL);
    CHECK(submit1(o, INC, x, PTO_INOUT) == 0);   /* ids restart */
    CHECK_EQ(pto_run_end(w), 0);
    CHECK_EQ(x[0], 51);
    for (int i = 0; i < 50; i++) pto_run_free(runs[i]);
    pto_worker_close(w);
    free(x);
}

static void test_failure_poisons_only_dependants(void)
{
    pto_worker *w = tu_worker(2, 0, leaf, NULL, 1 << 20, 5000);
    float *bad = calloc(4, sizeof *bad), *own = calloc(4, sizeof *own);
    atomic_store(&g_gate, 1);
    pto_run *r1, *r2, *r3;
    pto_orch *o = pto_run_submit(w, &r1);
    int64_t gate = submit1(o, GATED, bad, PTO_OUTPUT);
    int64_t failing = submit1(o, FAILS, bad, PTO_INOUT);   /* waits for the gate */
    CHECK(gate >= 0 && failing >= 0);
    CHECK_EQ(pto_run_submitted(w, r1), 0);
    o = pto_run_submit(w, &r2);
    CHECK(submit1(o, INC, bad, PTO_INOUT) >= 0);   /* depends on the failing task */
    CHECK_EQ(pto_run_submitted(w, r2), 0);
    o = pto_run_submit(w, &r3);
    CHECK(submit1(o, INC, own, PTO_INOUT) >= 0);    /* independent */
    CHECK_EQ(pto_run_submitted(w, r3), 0);
    CHECK_EQ(pto_run_wait(w, r3, -1), 1);            /* while run 1 is still held */
    CHECK_EQ(pto_run_wait(w, r1, 0), 0);
    atomic_store(&g_gate, 0);
    CHECK_EQ(pto_run_wait(w, NULL, -1), 1);
    pto_run_info in;
    char msg[256];
    pto_run_info_get(r1, &in);
    CHECK_EQ(in.state, PTO_RUN_FAILED);
    CHECK_EQ(in.completed, 1);
    CHECK_EQ(in.failed, 1);
    CHECK(pto_run_failure(r1, msg, sizeof msg) && strstr(msg, "boom"));
    pto_run_info_get(r2, &in);
    CHECK_EQ(in.state, PTO_RUN_FAILED);
    char want[64];
    snprintf(want, sizeof want, "producer task %lld of run 1 failed", (long long)failing);
    CHECK(pto_run_failure(r2, msg, sizeof msg) && strstr(msg, want));
    pto_run_info_get(r3, &in);
    CHECK_EQ(in.state, PTO_RUN_OK);
    CHECK(!pto_run_failure(r3, msg, sizeof msg));
    CHECK_EQ(own[0], 1);
    CHECK_EQ(pto_runs_end(w), 1);
    pto_run_free(r1);
    pto_run_free(r2);
    pto_run_free(r3);
    pto_worker_close(w);
    free(bad);
    free(own);
}

static void test_cancel_and_misuse(void)
{
    pto_worker *w = tu_worker(1, 0, leaf, NULL, 1 << 20, 5000);
    float *x = calloc(4, sizeof *x), *y = calloc(4, sizeof *y);
    atomic_store(&g_gate, 1);
    pto_run *r1, *r2, *nested;
    pto_orch *o = pto_run_submit(w, &r1);
    CHECK(submit1(o, GATED, x, PTO_INOUT) >= 0);
    for (int i = 0; i < 5; i++) CHECK(submit1(o, INC, x, PTO_INOUT) >= 0);
    CHECK(pto_run_submit(w, &nested) == NULL);   /* runs do not nest */
    CHECK(strstr(pto_errmsg(), "runs do not nest") != NULL);
    CHECK_EQ(pto_run_submitted(w, r1), 0);
    CHECK(pto_run_begin(w) == NULL);             /* no blocking run beside submitted ones */
    CHECK(strstr(pto_errmsg(), "submitted runs are outstanding") != NULL);
    CHECK_EQ(pto_runs_end(w), -1);               /* still live */
    o = pto_run_submit(w, &r2);
    CHECK(submit1(o, INC, y, PTO_INOUT) >= 0);
    CHECK_EQ(pto_run_submitted(w, r2), 0);
    pto_run_cancel(w, r1);
    atomic_store(&g_gate, 0);
    CHECK_EQ(pto_run_wait(w, r1, -1), 1);
    CHECK_EQ(pto_run_wait(w, r2, -1), 1);
    pto_run_info in;
    char msg[256];
    pto_run_info_get(r1, &in);
    CHECK_EQ(in.state, PTO_RUN_CANCELLED);
    CHECK(in.failed >= 1);
    CHECK(in.completed + in.failed == 6);
    CHECK(pto_run_failure(r1, msg, sizeof msg) && strstr(msg, "was cancelled"));
    pto_run_info_get(r2, &in);
    CHECK_EQ(in.state, PTO_RUN_OK);
    CHECK_EQ(y[0], 1);
    /* closing with the session open frees what the handles let go of */
    pto_run_free(r1);
    pto_worker_close(w);
    pto_run_free(r2);   /* after close: the handle was the last owner */
    free(x);
    free(y);
}

int main(void)
{
    RUN(test_inout_chain_over_runs);
    RUN(test_failure_poisons_only_dependants);
    RUN(test_cancel_and_misuse);
    return tu_finish();
}
