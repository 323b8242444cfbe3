#include "testutil.h"
#include <stdlib.h>
#include <time.h>

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

_Atomic int tu_hold[TU_NC];
_Atomic long tu_start[TU_NC], tu_end[TU_NC], tu_clock, tu_runs;
_Atomic int tu_leaf_timeouts;

uint64_t tu_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void tu_sleep_ms(long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int tu_gate_leaf(void *ctx, uint64_t callable, const pto_args_view *args, const pto_call_config *cfg, char *err,
                 size_t errlen)
{
    (void)ctx, (void)args, (void)cfg, (void)err, (void)errlen;
    atomic_fetch_add(&tu_runs, 1);
    if (callable >= TU_NC) return 0;
    atomic_store(&tu_start[callable], atomic_fetch_add(&tu_clock, 1) + 1);
    uint64_t t0 = tu_now_ms();
    while (atomic_load(&tu_hold[callable])) {
        if (tu_now_ms() - t0 > TU_GATE_MAX_MS) {
            atomic_fetch_add(&tu_leaf_timeouts, 1);
            break;
        }
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    atomic_store(&tu_end[callable], atomic_fetch_add(&tu_clock, 1) + 1);
    return 0;
}

void tu_gate_reset(void)
{
    for (int i = 0; i < TU_NC; i++) {
        atomic_store(&tu_hold[i], 0);
        atomic_store(&tu_start[i], 0);
        atomic_store(&tu_end[i], 0);
    }
    atomic_store(&tu_leaf_timeouts, 0);
    atomic_store(&tu_runs, 0);
}

bool tu_wait_set(_Atomic long *p, int ms)
{
    uint64_t t0 = tu_now_ms();
    while (!atomic_load(p)) {
        if (tu_now_ms() - t0 > (uint64_t)ms) return false;
        tu_sleep_ms(1);
    }
    return true;
}
