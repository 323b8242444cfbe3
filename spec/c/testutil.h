/* Minimal test harness: each CHECK failure prints file:line and the
 * expression; a test binary exits non-zero if any check failed. */
#ifndef PTO_TESTUTIL_H
#define PTO_TESTUTIL_H
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "pto.h"

extern int tu_failures;
extern int tu_checks;

#define CHECK(cond) do { tu_checks++; if (!(cond)) { tu_failures++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); } } while (0)
#define CHECK_EQ(a, b) do { long long _a = (long long)(a), _b = (long long)(b); tu_checks++; \
    if (_a != _b) { tu_failures++; fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %s (%lld vs %lld)\n", \
    __FILE__, __LINE__, #a, #b, _a, _b); } } while (0)
#define CHECK_CONTAINS(hay, needle) do { const char *_h = (hay); tu_checks++; \
    if (!_h || !strstr(_h, (needle))) { tu_failures++; fprintf(stderr, \
    "%s:%d: expected \"%s\" in \"%s\"\n", __FILE__, __LINE__, (needle), _h ? _h : "(null)"); } } while (0)

/* Run one named test function and report it. */
#define RUN(fn) tu_run(#fn, fn)
void tu_run(const char *name, void (*fn)(void));
/* Print the summary line and return the process exit status. */
int tu_finish(void);

/* A THREAD-mode worker with nl next-level and ns sub leaves all running fn. */
pto_worker *tu_worker(int nl, int ns, pto_leaf_fn fn, void *ctx, uint64_t heap, uint32_t timeout_ms);
/* A 1-D f32 tensor view of n elements at byte offset off of base. */
pto_tensor tu_tensor(uint64_t base, uint64_t off, uint32_t n);

/* The gate leaf: for callable c < TU_NC it stamps tu_start[c] / tu_end[c]
 * from one clock and, while tu_hold[c] is set, blocks (at most
 * TU_GATE_MAX_MS, so a wrong engine fails a check instead of hanging,
 * counting tu_leaf_timeouts). Every call counts in tu_runs. */
#define TU_NC 64
#define TU_GATE_MAX_MS 5000
extern _Atomic int tu_hold[TU_NC];
extern _Atomic long tu_start[TU_NC], tu_end[TU_NC], tu_clock, tu_runs;
extern _Atomic int tu_leaf_timeouts;
int tu_gate_leaf(void *ctx, uint64_t callable, const pto_args_view *args, const pto_call_config *cfg, char *err,
                 size_t errlen);
void tu_gate_reset(void);
uint64_t tu_now_ms(void);
void tu_sleep_ms(long ms);
/* Wait until *p is non-zero; false after ms. */
bool tu_wait_set(_Atomic long *p, int ms);
#endif
