#include "testutil.h"
#include <stdlib.h>

int tu_failures;
int tu_checks;

void tu_run(const char *name, void (*fn)(void))
{
    int before = tu_failures;
    fn();
    printf("%s %s\n", tu_failures == before ? "ok  " : "FAIL", name);
    fflush(stdout);
}

int tu_finish(void)
{
    printf("%d checks, %d failed\n", tu_checks, tu_failures);
    return tu_failures ? 1 : 0;
}

pto_worker *tu_worker(int nl, int ns, pto_leaf_fn fn, void *ctx, uint64_t heap, uint32_t timeout_ms)
{
    pto_worker_config cfg = {.level = 3, .mode = PTO_MODE_THREAD, .heap_ring_size = heap,
                             .alloc_timeout_ms = timeout_ms};
    pto_worker *w = pto_worker_new(&cfg);
    if (!w) { fprintf(stderr, "pto_worker_new: %s\n", pto_errmsg()); exit(2); }
    pto_leaf leaf = {.run = fn, .ctx = ctx, .name = "test"};
    for (int i = 0; i < nl; i++) pto_worker_add_next_level(w, &leaf);
    for (int i = 0; i < ns; i++) pto_worker_add_sub(w, &leaf);
    if (pto_worker_init(w) != 0) { fprintf(stderr, "pto_worker_init: %s\n", pto_errmsg()); exit(2); }
    return w;
}

pto_tensor tu_tensor(uint64_t base, uint64_t off, uint32_t n)
{
    pto_tensor t = {.base = base, .offset = off, .dtype = PTO_F32, .ndims = 1};
    t.shape[0] = n;
    return t;
}
