/* Small shared utilities of the engine: the per-thread error message,
 * allocation that fails loudly, the monotonic clock, alignment. */
#ifndef PTO_COMMON_H
#define PTO_COMMON_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include "pto.h"

#define PTO_ERRLEN 2048

/* Record the calling thread's error (read back by pto_errmsg). */
void pto_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The same with a pto_errcode() other than PTO_ERR_FAILED. */
void pto_set_error_code(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

void *pto_xmalloc(size_t n);
void *pto_xcalloc(size_t n, size_t size);
/* Zeroed memory aligned to a cache line, for structs with _Alignas(64) members; free() it. */
void *pto_xcalloc_line(size_t size);
void *pto_xrealloc(void *p, size_t n);
char *pto_xstrdup(const char *s);

#define PTO_HUGE_PAGE ((size_t)2 << 20)
/* A zeroed anonymous mapping of pto_huge_len(bytes), aligned to
 * PTO_HUGE_PAGE and asked for transparent huge pages (a hint: it works
 * without them); flags: MAP_PRIVATE or MAP_SHARED, and MAP_NORESERVE if
 * wanted. NULL with errno set on failure. Unmap it with munmap(p,
 * pto_huge_len(bytes)). */
void *pto_map_huge(size_t bytes, int flags);
/* pto_map_huge(bytes, MAP_PRIVATE), or abort as pto_xmalloc does. */
void *pto_xmap_huge(size_t bytes);
static inline size_t pto_huge_len(size_t bytes) { return (bytes + PTO_HUGE_PAGE - 1) & ~(PTO_HUGE_PAGE - 1); }
/* malloc'ed printf. */
char *pto_xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

uint64_t pto_now_ns(void);
/* The same clock at tick resolution (a few ms behind pto_now_ns) for a few ns instead of ~20:
 * for stamps taken per task that only a person reads. */
uint64_t pto_now_coarse_ns(void);

static inline uint64_t pto_align_up(uint64_t x, uint64_t a) { return (x + a - 1) & ~(a - 1); }

/* Wait until a thread just created counted itself into *up (want in all).
 * A Worker's init returns only once its threads are up: a thread's start
 * allocates (pthread_getattr_np), and a fork by another Worker's init at
 * that moment would copy the allocator's lock held, which GCC 12's ASan
 * allocator, having no fork handler, never releases in the child. */
void pto_wait_up(_Atomic int32_t *up, int32_t want);

/* Grow *arr (of elem bytes each, capacity *cap) to hold at least need items. */
void pto_grow(void **arr, int32_t *cap, int32_t need, size_t elem);

#define PTO_LIKELY(x) __builtin_expect(!!(x), 1)
#define PTO_UNLIKELY(x) __builtin_expect(!!(x), 0)

static inline void pto_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

#endif
