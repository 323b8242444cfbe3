/* bench_shapes.c - see bench_shapes.h. */
#include "bench_shapes.h"

#include <string.h>

static pto_tensor slot(const bench_shapes *b, size_t i)
{
    pto_tensor t;
    memset(&t, 0, sizeof t);
    t.base = (uint64_t)(uintptr_t)(b->slots + i * BENCH_SLOT_ELEMS);
    t.shape[0] = BENCH_SLOT_ELEMS;
    t.dtype = PTO_F32;
    t.ndims = 1;
    return t;
}

static int submit(pto_orch *o, const bench_shapes *b, pto_tensor *ts, const uint8_t *tags, int n)
{
    pto_task_args a = {n, 0, ts, tags, NULL};
    return pto_submit_next_level(o, b->noop, &a, NULL, -1) < 0 ? -1 : 0;
}

long bench_w1(pto_orch *o, const bench_shapes *b, int n)
{
    static const uint8_t tags[1] = {PTO_OUTPUT};
    for (int i = 0; i < n; i++) {
        pto_tensor t = slot(b, (size_t)i);
        if (submit(o, b, &t, tags, 1)) return -1;
    }
    return n;
}

long bench_w2(pto_orch *o, const bench_shapes *b, int n)
{
    static const uint8_t tags[1] = {PTO_INOUT};
    for (int i = 0; i < n; i++) {
        pto_tensor t = slot(b, 0);
        if (submit(o, b, &t, tags, 1)) return -1;
    }
    return n;
}

long bench_w3(pto_orch *o, const bench_shapes *b, int n)
{
    int groups = n / (BENCH_FAN + 2);
    static const uint8_t out[1] = {PTO_OUTPUT}, rd[2] = {PTO_INPUT, PTO_OUTPUT};
    uint8_t join[BENCH_FAN + 1];
    for (int j = 0; j < BENCH_FAN; j++) join[j] = PTO_INPUT;
    join[BENCH_FAN] = PTO_OUTPUT;
    for (int g = 0; g < groups; g++) {
        size_t x = (size_t)g * (BENCH_FAN + 2);
        pto_tensor t[BENCH_FAN + 1];
        t[0] = slot(b, x);
        if (submit(o, b, t, out, 1)) return -1;
        for (int j = 0; j < BENCH_FAN; j++) {
            t[0] = slot(b, x);
            t[1] = slot(b, x + 1 + (size_t)j);
            if (submit(o, b, t, rd, 2)) return -1;
        }
        for (int j = 0; j < BENCH_FAN; j++) t[j] = slot(b, x + 1 + (size_t)j);
        t[BENCH_FAN] = slot(b, x + 1 + BENCH_FAN);
        if (submit(o, b, t, join, BENCH_FAN + 1)) return -1;
    }
    return (long)groups * (BENCH_FAN + 2);
}

long bench_w4(pto_orch *o, const bench_shapes *b, int d)
{
    static const uint8_t tg[3] = {PTO_INPUT, PTO_INPUT, PTO_OUTPUT}, ta[2] = {PTO_INPUT, PTO_INOUT};
    size_t dd = (size_t)d, n3 = dd * dd * dd;
    pto_tensor unset = slot(b, 0);
    unset.base = 0;   /* an automatic OUTPUT: the engine allocates it */
    for (size_t bi = 0; bi < dd; bi++)
        for (size_t m = 0; m < dd; m++)
            for (size_t n = 0; n < dd; n++) {
                if (pto_scope_begin(o) != 0) return -1;
                for (size_t k = 0; k < dd; k++) {
                    pto_tensor g[3] = {slot(b, (bi * dd + m) * dd + k), slot(b, n3 + (bi * dd + k) * dd + n), unset};
                    if (submit(o, b, g, tg, 3)) return -1;
                    pto_tensor a[2] = {g[2], slot(b, 2 * n3 + (bi * dd + m) * dd + n)};
                    if (submit(o, b, a, ta, 2)) return -1;
                }
                if (pto_scope_end(o) != 0) return -1;
            }
    return 2L * d * d * d * d;
}
