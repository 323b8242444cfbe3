#include "common.h"

#include <errno.h>
#include <sched.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static _Thread_local char errbuf[PTO_ERRLEN];
static _Thread_local int errcode;

const char *pto_errmsg(void) { return errbuf; }

int pto_errcode(void) { return errcode; }

void pto_set_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errbuf, sizeof errbuf, fmt, ap);
    va_end(ap);
    errcode = PTO_ERR_FAILED;
}

void pto_set_error_code(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errbuf, sizeof errbuf, fmt, ap);
    va_end(ap);
    errcode = code;
}

static void oom(size_t n)
{
    fprintf(stderr, "ptolua: out of memory allocating %zu bytes\n", n);
    abort();
}

void *pto_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) oom(n);
    return p;
}

void *pto_xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) oom(n * size);
    return p;
}

void *pto_xcalloc_line(size_t size)
{
    size_t n = (size + 63) / 64 * 64;
    void *p = aligned_alloc(64, n ? n : 64);
    if (!p) oom(n);
    return memset(p, 0, n ? n : 64);
}

void *pto_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) oom(n);
    return q;
}

char *pto_xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = pto_xmalloc(n);
    memcpy(d, s, n);
    return d;
}

char *pto_xasprintf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = pto_xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

uint64_t pto_now_coarse_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t pto_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void pto_wait_up(_Atomic int32_t *up, int32_t want)
{
    while (atomic_load_explicit(up, memory_order_acquire) < want) sched_yield();
}

void pto_grow(void **arr, int32_t *cap, int32_t need, size_t elem)
{
    if (need <= *cap) return;
    int32_t c = *cap ? *cap : 4;
    while (c < need) c *= 2;
    *arr = pto_xrealloc(*arr, (size_t)c * elem);
    *cap = c;
}

void *pto_map_huge(size_t bytes, int flags)
{
    size_t len = pto_huge_len(bytes), span = len + PTO_HUGE_PAGE;
    /* Reserve room to align in, then map over its aligned part: a shared
     * mapping must also start its object there (trimming one would leave
     * its offsets unaligned, and shmem then maps no huge page). */
    char *p = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return NULL;
    char *a = (char *)(((uintptr_t)p + PTO_HUGE_PAGE - 1) & ~(uintptr_t)(PTO_HUGE_PAGE - 1));
    if (mmap(a, len, PROT_READ | PROT_WRITE, flags | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) {
        int e = errno;
        munmap(p, span);
        errno = e;
        return NULL;
    }
    if (a > p) munmap(p, (size_t)(a - p));
    if (a + len < p + span) munmap(a + len, (size_t)(p + span - (a + len)));
    (void)madvise(a, len, MADV_HUGEPAGE);
    return a;
}

void *pto_xmap_huge(size_t bytes)
{
    void *p = pto_map_huge(bytes, MAP_PRIVATE);
    if (!p) oom(pto_huge_len(bytes));
    return p;
}
