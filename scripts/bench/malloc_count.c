/* libpto_malloc_count.so - counts the heap allocations of a process, for
 * scripts/bench_malloc.sh: LD_PRELOAD it and every malloc, calloc, realloc
 * and aligned allocation is counted (in any thread) before glibc's own
 * function does the work; at exit the total is appended to the file named
 * by $PTO_MALLOC_COUNT as "<allocations> <frees>" (by the process that
 * loaded it, not by children it forked). A benchmark tool, not
 * part of the library. glibc exports its allocator as __libc_malloc etc.,
 * which spares the shim dlsym (which itself allocates). */
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t n);
extern void *__libc_memalign(size_t align, size_t n);
extern void __libc_free(void *p);

static _Atomic unsigned long long allocs, frees;
static pid_t owner;   /* the process that loaded the shim: forked children inherit its counts, so they report none */

__attribute__((constructor)) static void start(void) { owner = getpid(); }

void *malloc(size_t n)
{
    atomic_fetch_add_explicit(&allocs, 1, memory_order_relaxed);
    return __libc_malloc(n);
}

void *calloc(size_t n, size_t size)
{
    atomic_fetch_add_explicit(&allocs, 1, memory_order_relaxed);
    return __libc_calloc(n, size);
}

/* realloc counts as an allocation when it may move the block: a new block
 * (p == NULL) or a resize; realloc(p, 0) is a free. */
void *realloc(void *p, size_t n)
{
    if (p && n == 0) atomic_fetch_add_explicit(&frees, 1, memory_order_relaxed);
    else atomic_fetch_add_explicit(&allocs, 1, memory_order_relaxed);
    return __libc_realloc(p, n);
}

void *aligned_alloc(size_t align, size_t n)
{
    atomic_fetch_add_explicit(&allocs, 1, memory_order_relaxed);
    return __libc_memalign(align, n);
}

void *memalign(size_t align, size_t n)
{
    atomic_fetch_add_explicit(&allocs, 1, memory_order_relaxed);
    return __libc_memalign(align, n);
}

int posix_memalign(void **out, size_t align, size_t n)
{
    atomic_fetch_add_explicit(&allocs, 1, memory_order_relaxed);
    void *p = __libc_memalign(align, n);
    if (!p) return 12;   /* ENOMEM */
    *out = p;
    return 0;
}

void free(void *p)
{
    if (p) atomic_fetch_add_explicit(&frees, 1, memory_order_relaxed);
    __libc_free(p);
}

__attribute__((destructor)) static void report(void)
{
    const char *path = getenv("PTO_MALLOC_COUNT");
    if (!path || getpid() != owner) return;
    FILE *f = fopen(path, "a");   /* fopen allocates: read the counts first */
    unsigned long long a = atomic_load(&allocs), d = atomic_load(&frees);
    if (!f) return;
    fprintf(f, "%llu %llu\n", a, d);
    fclose(f);
}
