/*
 * test_profile.c - what the run profile keeps beside each task's times
 * (profile.h), which ptolua --dot draws a run from after it ended: the tree
 * of nested scopes, the alloc slots each task used, and the errors of the
 * tasks that failed or were not run, each bounded; and scope numbers that
 * stay distinct across the submitted runs of one session.
 */
#include "testutil.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAILS 666     /* fails with a long message */

static int leaf(void *ctx, uint64_t callable, const pto_args_view *args, const pto_call_config *cfg, char *err,
                size_t errlen)
{
    (void)ctx; (void)args; (void)cfg;
    if (callable != FAILS) return 0;
    /* Longer than the profile keeps (with the engine's prefix), in two-byte
     * characters, so the cut falls inside one or right after one. */
    size_t n = errlen - 1;
    memset(err, 'x', n);
    memcpy(err, "boom ", 5);
    for (size_t i = 100; i + 1 < n; i += 2) memcpy(err + i, "\xc3\xa9", 2);
    err[n] = 0;
    return 1;
}

static int64_t submit(pto_orch *o, uint64_t callable, pto_tensor *t, uint8_t tag)
{
    pto_task_args a = {.tensor_count = t ? 1 : 0, .tensors = t, .tags = &tag};
    int64_t id = pto_submit_next_level(o, callable, &a, NULL, -1);
    if (id < 0) fprintf(stderr, "submit: %s\n", pto_errmsg());
    return id;
}

/* The alloc slots task id used, by the profile's pairs. */
static int uses_of(pto_worker *w, int64_t id, int64_t *out, int cap)
{
    int64_t pairs[64];
    int64_t n = pto_profile_alloc_uses(w, pairs, 32);
    int k = 0;
    for (int64_t i = 0; i < n && i < 32; i++)
        if (pairs[2 * i] == id && k < cap) out[k++] = pairs[2 * i + 1];
    return k;
}

static void test_scopes_allocs_errors(void)
{
    pto_worker *w = tu_worker(2, 0, leaf, NULL, 1 << 20, 5000);
    CHECK_EQ(pto_profile_scopes(w, NULL, 0), -1);   /* no run ended yet */
    CHECK_EQ(pto_profile_alloc_uses(w, NULL, 0), -1);
    CHECK(pto_profile_error(w, 0, NULL) == NULL);
    pto_orch *o = pto_run_begin(w);
    CHECK(o != NULL);
    if (!o) { pto_worker_close(w); return; }
    uint32_t shape[1] = {4};
    pto_tensor a;
    int64_t alloc = pto_alloc(o, shape, 1, PTO_F32, &a);      /* 0 */
    int64_t wr = submit(o, 1, &a, PTO_OUTPUT);                 /* 1: writes the alloc */
    int64_t rd = submit(o, 1, &a, PTO_INPUT);                  /* 2: reads it */
    float *x = calloc(4, sizeof *x);
    pto_tensor tx = tu_tensor((uint64_t)(uintptr_t)x, 0, 4);
    CHECK_EQ(pto_scope_begin(o), 0);                           /* scope 1 in the run's */
    int64_t bad = submit(o, FAILS, &tx, PTO_OUTPUT);           /* 3 */
    CHECK_EQ(pto_scope_begin(o), 0);                           /* scope 2 in 1 */
    int64_t after = submit(o, 1, &tx, PTO_INPUT);              /* 4: poisoned */
    CHECK_EQ(pto_scope_end(o), 0);
    CHECK_EQ(pto_scope_end(o), 0);
    CHECK_EQ(pto_scope_begin(o), 0);                           /* scope 3 in the run's */
    CHECK_EQ(pto_scope_begin(o), 0);                           /* scope 4 in 3 */
    CHECK_EQ(pto_scope_end(o), 0);
    CHECK_EQ(pto_scope_begin(o), 0);                           /* scope 5 in 3 */
    CHECK_EQ(pto_scope_end(o), 0);
    CHECK_EQ(pto_scope_end(o), 0);
    CHECK(pto_run_end(w) != 0);                                /* task 3 failed */

    uint32_t parent[8] = {99, 99, 99, 99, 99, 99, 99, 99};
    CHECK_EQ(pto_profile_scopes(w, parent, 8), 5);
    uint32_t want[5] = {0, 1, 0, 3, 3};
    for (int k = 0; k < 5; k++) CHECK_EQ(parent[k], want[k]);
    CHECK_EQ(parent[5], 99);                                   /* nothing past the count */
    CHECK_EQ(pto_profile_scopes(w, parent, 2), 5);             /* cap: the count all the same */

    int64_t u[4];
    CHECK_EQ(uses_of(w, wr, u, 4), 1);                         /* a writer holds the alloc */
    CHECK_EQ(u[0], alloc);
    CHECK_EQ(uses_of(w, rd, u, 4), 1);                         /* a reader too (and depends on its writer) */
    CHECK_EQ(u[0], alloc);
    CHECK_EQ(uses_of(w, bad, u, 4), 0);                        /* plain memory: no alloc */
    CHECK_EQ(pto_profile_alloc_uses(w, NULL, 0), 2);

    int64_t id = -1;
    const char *m = pto_profile_error(w, 0, &id);
    CHECK_EQ(id, bad);
    CHECK_CONTAINS(m, "boom ");
    CHECK(m && strlen(m) <= 4096);
    if (m) {   /* cut before the two-byte character, not inside it */
        size_t n = strlen(m);
        CHECK(((unsigned char)m[n - 1] & 0xC0) != 0xC0);
        CHECK(((unsigned char)m[n - 1] & 0x80) == 0 || ((unsigned char)m[n - 2] & 0xE0) == 0xC0);
    }
    m = pto_profile_error(w, 1, &id);
    CHECK_EQ(id, after);
    CHECK_CONTAINS(m, "was not run: its producer task 3 failed");
    CHECK(pto_profile_error(w, 2, &id) == NULL);
    CHECK(pto_profile_error(w, -1, &id) == NULL);

    /* The next run replaces all of it. */
    o = pto_run_begin(w);
    CHECK(o != NULL);
    if (o) {
        submit(o, 1, &tx, PTO_INOUT);
        CHECK_EQ(pto_run_end(w), 0);
    }
    CHECK_EQ(pto_profile_scopes(w, parent, 8), 0);
    CHECK_EQ(pto_profile_alloc_uses(w, NULL, 0), 0);
    CHECK(pto_profile_error(w, 0, NULL) == NULL);
    pto_worker_close(w);
    free(x);
}

/* More failures than the profile keeps: the first ones, a bounded number. */
static void test_errors_bounded(void)
{
    pto_worker *w = tu_worker(2, 0, leaf, NULL, 1 << 20, 5000);
    pto_orch *o = pto_run_begin(w);
    CHECK(o != NULL);
    if (!o) { pto_worker_close(w); return; }
    for (int i = 0; i < 1100; i++) submit(o, FAILS, NULL, 0);
    CHECK(pto_run_end(w) != 0);
    int64_t n = 0, id;
    while (pto_profile_error(w, n, &id)) n++;
    CHECK_EQ(n, 1024);
    pto_worker_close(w);
}

/* A session of submitted runs is one run to the profile: its scopes are
 * numbered on from one submitted run to the next, not again from 1. */
static void test_scopes_across_submitted_runs(void)
{
    pto_worker *w = tu_worker(2, 0, leaf, NULL, 1 << 20, 5000);
    pto_run *r[2];
    for (int i = 0; i < 2; i++) {
        pto_orch *o = pto_run_submit(w, &r[i]);
        CHECK(o != NULL);
        if (!o) continue;
        CHECK_EQ(pto_scope_begin(o), 0);
        CHECK_EQ(pto_scope_begin(o), 0);
        submit(o, 1, NULL, 0);
        CHECK_EQ(pto_scope_end(o), 0);
        CHECK_EQ(pto_scope_end(o), 0);
        CHECK_EQ(pto_run_submitted(w, r[i]), 0);
    }
    CHECK_EQ(pto_run_wait(w, NULL, -1), 1);
    CHECK_EQ(pto_runs_end(w), 1);
    uint32_t parent[8];
    CHECK_EQ(pto_profile_scopes(w, parent, 8), 4);
    CHECK_EQ(parent[0], 0);
    CHECK_EQ(parent[1], 1);
    CHECK_EQ(parent[2], 0);
    CHECK_EQ(parent[3], 3);
    pto_profile_task t[4];
    CHECK_EQ(pto_profile_get(w, NULL, t, 4), 2);
    uint32_t seen = 0;
    for (int i = 0; i < 2; i++) seen |= 1u << t[i].scope;
    CHECK_EQ(seen, (1u << 2) | (1u << 4));   /* each task in its own run's inner scope */
    for (int i = 0; i < 2; i++) pto_run_free(r[i]);
    pto_worker_close(w);
}

int main(void)
{
    RUN(test_scopes_allocs_errors);
    RUN(test_errors_bounded);
    RUN(test_scopes_across_submitted_runs);
    return tu_finish();
}
