/* Minimal test harness: each CHECK failure prints file:line and the
 * expression; a test binary exits non-zero if any check failed. */
#ifndef PTO_TESTUTIL_H
#define PTO_TESTUTIL_H
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
#endif
