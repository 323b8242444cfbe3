/*
 * test_u64map.c - the engine's small hash map (u64map.c), checked against a
 * plain array: random adds and removes with colliding keys, so backward-shift
 * deletion must keep every probe run intact; growth, resize and clear (an
 * epoch step that leaves the old cells in the table), also when the epoch
 * wraps.
 */
#include "testutil.h"
#include "u64map.h"

#include <stdlib.h>

typedef struct cell {
    PTO_U64MAP_CELL_HEAD
    uint64_t value;
} cell;

#define NKEYS 4096

static uint64_t rng = 88172645463325252ull;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Every key of the reference is found with its value, and nothing else is. */
static void check_same(const pto_u64map *m, const uint64_t *keys, const bool *in, int n)
{
    size_t count = 0;
    for (int i = 0; i < n; i++) {
        cell *c = pto_u64map_find(m, keys[i]);
        if (in[i]) {
            count++;
            CHECK(c != NULL);
            if (c) CHECK_EQ(c->value, keys[i] * 3);
        } else {
            CHECK(c == NULL);
        }
    }
    CHECK_EQ(m->count, count);
    size_t seen = 0;
    for (size_t i = 0; i < pto_u64map_cells(m); i++) seen += pto_u64map_used(m, i);
    CHECK_EQ(seen, count);
}

static void test_random_against_reference(void)
{
    pto_u64map m;
    pto_u64map_init(&m, sizeof(cell), 16);
    CHECK(pto_u64map_find(&m, 1) == NULL);   /* no table yet */
    static uint64_t keys[NKEYS];
    static bool in[NKEYS];
    /* Multiples of 1024, as heap addresses are: they collide in the low bits. */
    for (int i = 0; i < NKEYS; i++) keys[i] = (uint64_t)(i + 1) * 1024;
    for (int round = 0; round < 200000; round++) {
        if (round % 50000 == 49999) {   /* now and then a clear: stale cells must read as free */
            pto_u64map_clear(&m);
            for (int k = 0; k < NKEYS; k++) in[k] = false;
        }
        int i = (int)(next_rand() % NKEYS);
        if (in[i]) {
            cell *c = pto_u64map_find(&m, keys[i]);
            CHECK(c != NULL);
            if (c) pto_u64map_remove(&m, c);
            in[i] = false;
        } else {
            cell *c = pto_u64map_add(&m, keys[i]);
            CHECK_EQ(c->key, keys[i]);
            CHECK_EQ(c->value, 0);   /* a new cell is zero-filled */
            c->value = keys[i] * 3;
            in[i] = true;
        }
        if (round % 20000 == 0) check_same(&m, keys, in, NKEYS);
    }
    check_same(&m, keys, in, NKEYS);
    CHECK(m.count * 4 <= pto_u64map_cells(&m) * 3);   /* at most 3/4 full */
    /* Adding a key that is there returns its cell, unchanged. */
    for (int i = 0; i < NKEYS; i++)
        if (in[i]) {
            size_t before = m.count;
            cell *c = pto_u64map_add(&m, keys[i]);
            CHECK_EQ(c->value, keys[i] * 3);
            CHECK_EQ(m.count, before);
            break;
        }
    /* A resize keeps everything; a clear drops everything but the table. */
    pto_u64map_resize(&m, pto_u64map_cells(&m) * 2);
    check_same(&m, keys, in, NKEYS);
    size_t cells = pto_u64map_cells(&m);
    pto_u64map_clear(&m);
    CHECK_EQ(m.count, 0);
    CHECK_EQ(pto_u64map_cells(&m), cells);
    for (int i = 0; i < NKEYS; i++) in[i] = false;
    check_same(&m, keys, in, NKEYS);
    pto_u64map_destroy(&m);
    CHECK_EQ(pto_u64map_cells(&m), 0);
    CHECK(pto_u64map_find(&m, keys[0]) == NULL);
}

/* Remove every key of a full probe run in every order of two: the rest stay findable. */
static void test_remove_inside_runs(void)
{
    pto_u64map m;
    pto_u64map_init(&m, sizeof(cell), 16);
    enum { N = 12 };   /* 12 of 16 cells: long runs that wrap around the table */
    for (int a = 0; a < N; a++)
        for (int b = 0; b < N; b++) {
            if (a == b) continue;
            for (int k = 0; k < N; k++) ((cell *)pto_u64map_add(&m, (uint64_t)(k + 1) << 20))->value = (uint64_t)k;
            CHECK_EQ(pto_u64map_cells(&m), 16);
            pto_u64map_remove(&m, pto_u64map_find(&m, (uint64_t)(a + 1) << 20));
            pto_u64map_remove(&m, pto_u64map_find(&m, (uint64_t)(b + 1) << 20));
            for (int k = 0; k < N; k++) {
                cell *c = pto_u64map_find(&m, (uint64_t)(k + 1) << 20);
                if (k == a || k == b) {
                    CHECK(c == NULL);
                } else {
                    CHECK(c != NULL);
                    if (c) CHECK_EQ(c->value, k);
                }
            }
            pto_u64map_clear(&m);
        }
    pto_u64map_destroy(&m);
}

/* A clear leaves the cells' bytes: the keys must still be gone and a new
 * add must still get a zeroed cell, clear after clear. */
static void test_clear_keeps_no_key(void)
{
    pto_u64map m;
    pto_u64map_init(&m, sizeof(cell), 16);
    for (int round = 0; round < 4; round++) {
        for (uint64_t k = 1; k <= 10; k++) {
            cell *c = pto_u64map_add(&m, k << 12);
            CHECK_EQ(c->value, 0);
            c->value = k + (uint64_t)round;
        }
        CHECK_EQ(m.count, 10);
        for (uint64_t k = 1; k <= 10; k++) {
            cell *c = pto_u64map_find(&m, k << 12);
            CHECK(c != NULL);
            if (c) CHECK_EQ(c->value, k + (uint64_t)round);
        }
        size_t cells = pto_u64map_cells(&m);
        pto_u64map_clear(&m);
        CHECK_EQ(pto_u64map_cells(&m), cells);
        for (uint64_t k = 1; k <= 10; k++) CHECK(pto_u64map_find(&m, k << 12) == NULL);
        size_t used = 0;
        for (size_t i = 0; i < pto_u64map_cells(&m); i++) used += pto_u64map_used(&m, i);
        CHECK_EQ(used, 0);
    }
    pto_u64map_destroy(&m);
}

/* After 2^32 clears the epoch comes round to 1 again: cells written in
 * epoch 1 long ago must not come back. */
static void test_epoch_wrap(void)
{
    pto_u64map m;
    pto_u64map_init(&m, sizeof(cell), 64);
    for (uint64_t k = 1; k <= 8; k++) pto_u64map_add(&m, k << 12);   /* epoch 1 */
    pto_u64map_clear(&m);
    m.epoch = UINT32_MAX;   /* as after 2^32 - 2 more clears */
    pto_u64map_add(&m, 99 << 12);
    pto_u64map_clear(&m);   /* wraps */
    CHECK_EQ(m.epoch, 1);
    for (uint64_t k = 1; k <= 8; k++) CHECK(pto_u64map_find(&m, k << 12) == NULL);
    size_t used = 0;
    for (size_t i = 0; i < pto_u64map_cells(&m); i++) used += pto_u64map_used(&m, i);
    CHECK_EQ(used, 0);
    pto_u64map_destroy(&m);
}

int main(void)
{
    RUN(test_random_against_reference);
    RUN(test_remove_inside_runs);
    RUN(test_clear_keeps_no_key);
    RUN(test_epoch_wrap);
    return tu_finish();
}
