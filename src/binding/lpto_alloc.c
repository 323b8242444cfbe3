/* lpto_alloc.c - the Lua allocator ptolua runs its state with (lpto.h).
 *
 * Why: an orchestration loop written the idiomatic way (a view per tile,
 * pto.args{{t, "in"}, ...} per submit, orch:alloc per temporary) makes
 * 10-16 small Lua objects per task, the user's table constructors most of
 * them, and the collector frees them in batches far larger than glibc's
 * per-thread cache holds, so each malloc and free went through malloc's
 * slow paths: a quarter of the orchestrator's time in perf. Lua passes the
 * old size of every block it frees or resizes, so blocks of up to POOL_MAX
 * bytes can sit on free lists by size class with no header at all: a
 * malloc is a pop, a free a push.
 *
 * The pool carves its blocks from one reserved region, so that a block is
 * known to be the pool's by its address alone: the state was made by
 * luaL_newstate, whose allocator keeps the blocks it made before the pool
 * took over, the large ones, and any the region has no room for.
 *
 * Not thread-safe by itself, as the Lua state it serves is not: every
 * thread that runs Lua code holds the interpreter lock (lpto_gil). Memory
 * on the free lists is never given back to the system; the region is
 * reserved address space, committed page by page as the bump pointer
 * reaches it. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "lauxlib.h"
#include "lpto.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/lsan_interface.h>
/* Free and never-used pool memory is poisoned, so AddressSanitizer still
 * sees a Lua object used after the collector freed it, or written past
 * the size Lua asked for. */
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#define SANITIZED 1
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#define SANITIZED 0
#endif

#define POOL_GRAIN 16                    /* Lua's objects are multiples of 8; 16 keeps long double alignment */
#define POOL_MAX 512                     /* larger blocks (big arrays, long strings) go to the previous allocator */
#define POOL_CLASSES (POOL_MAX / POOL_GRAIN)
#define REGION_DEFAULT (1ull << 30)
#define REGION_MIN (16ull << 20)

typedef struct lpto_pool {
    char *base, *next, *end;             /* the region; blocks below next have been handed out */
    void *free[POOL_CLASSES + 1];        /* per class, freed blocks linked through their first word */
    lua_Alloc prev;                      /* the state's allocator before the pool */
    void *prev_ud;
    char *reached;                       /* sanitized builds: the region up to here is poisoned and a leak root */
} lpto_pool;

/* One pool per process: ptolua makes one state. Static, so that the leak
 * checker does not see the pool itself lost once lua_close is done. */
static lpto_pool pool;
static bool pool_used;

/* Sanitized builds, as the bump pointer moves to next: the region is
 * poisoned a MiB at a time ahead of it (poisoning all of it at once would
 * write 128 MiB of shadow at every start), and the part reached is a
 * LeakSanitizer root, since a Lua object in it may hold the only pointer
 * to a large block of the previous allocator (a table's array part) and
 * LeakSanitizer does not look into mappings of its own accord. */
static void reach(lpto_pool *P, const char *next)
{
#if SANITIZED
    if (next <= P->reached) return;
    size_t step = 1u << 20, used = (size_t)(next - P->base);
    size_t n = (used + step - 1) / step * step;
    if (n > (size_t)(P->end - P->base)) n = (size_t)(P->end - P->base);
    POISON(P->reached, (size_t)(P->base + n - P->reached));
    if (P->reached > P->base) __lsan_unregister_root_region(P->base, (size_t)(P->reached - P->base));
    __lsan_register_root_region(P->base, n);
    P->reached = P->base + n;
#else
    (void)P, (void)next;
#endif
}

static inline size_t class_of(size_t n) { return (n + POOL_GRAIN - 1) / POOL_GRAIN; }

static inline bool mine(const lpto_pool *P, const void *p)
{
    return (const char *)p >= P->base && (const char *)p < P->end;
}

/* A block of n (1..POOL_MAX) bytes, or NULL when the region is used up. */
static inline void *take(lpto_pool *P, size_t n)
{
    size_t c = class_of(n), sz = c * POOL_GRAIN;
    void *p = P->free[c];
    if (p) {
        UNPOISON(p, sz);   /* the link may lie beyond n */
        P->free[c] = *(void **)p;
    } else {
        if ((size_t)(P->end - P->next) < sz) return NULL;
        p = P->next;
        P->next += sz;
        if (SANITIZED) reach(P, P->next);
        UNPOISON(p, sz);
    }
    POISON((char *)p + n, sz - n);   /* past what Lua asked for */
    return p;
}

static inline void give(lpto_pool *P, void *p, size_t n)
{
    size_t c = class_of(n);
    UNPOISON(p, sizeof(void *));   /* n may be less than a pointer: the class never is */
    *(void **)p = P->free[c];
    P->free[c] = p;
    POISON(p, c * POOL_GRAIN);
}

/* lua_Alloc: osize is the old block's size when ptr is set (Lua always
 * knows it), else the kind of object being made; nsize 0 frees. */
static void *pool_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    lpto_pool *P = ud;
    if (ptr && !mine(P, ptr)) {   /* the previous allocator's block: moves into the pool when it becomes small */
        void *q = nsize > 0 && nsize <= POOL_MAX ? take(P, nsize) : NULL;
        if (!q) return P->prev(P->prev_ud, ptr, osize, nsize);
        memcpy(q, ptr, osize < nsize ? osize : nsize);
        P->prev(P->prev_ud, ptr, osize, 0);
        return q;
    }
    if (nsize == 0) {
        if (ptr) give(P, ptr, osize);
        return NULL;
    }
    if (ptr && nsize <= POOL_MAX && class_of(osize) == class_of(nsize)) {
        UNPOISON(ptr, nsize);
        POISON((char *)ptr + nsize, class_of(nsize) * POOL_GRAIN - nsize);
        return ptr;
    }
    void *q = nsize <= POOL_MAX ? take(P, nsize) : NULL;
    if (!q && !(q = P->prev(P->prev_ud, NULL, ptr ? 0 : osize, nsize))) {
        if (!ptr || nsize > osize) return NULL;   /* ptr stays valid */
        /* A shrink must not fail (Lua raises a memory error while it
         * tidies up): the block stays where it is, and is freed later
         * into the smaller class, its tail unused. */
        UNPOISON(ptr, nsize);
        POISON((char *)ptr + nsize, class_of(osize) * POOL_GRAIN - nsize);
        return ptr;
    }
    if (ptr) {
        memcpy(q, ptr, osize < nsize ? osize : nsize);
        give(P, ptr, osize);
    }
    return q;
}

/* The region's size: 1 GiB of address space, or under an address-space
 * limit (ulimit -v) a sixteenth of the limit, so that the shared tensor
 * arena and the heap rings, which fit themselves to what is left, keep
 * nearly all of it. */
static size_t region_size(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return REGION_DEFAULT;
    uint64_t n = (uint64_t)rl.rlim_cur / 16;
    if (n > REGION_DEFAULT) n = REGION_DEFAULT;
    return n < REGION_MIN ? 0 : (size_t)(n & ~(uint64_t)0xfff);
}

bool lpto_use_pool_allocator(lua_State *L)
{
#if defined(__SANITIZE_THREAD__)
    /* ThreadSanitizer delivers a signal only when the program next enters
     * one of its interceptors, malloc among them: a Lua loop whose objects
     * come from the pool enters none, and Ctrl-C would never stop it. */
    (void)L;
    return false;
#endif
    const char *env = getenv("PTO_LUA_ALLOC");
    if (pool_used || (env && strcmp(env, "malloc") == 0)) return false;
    size_t size = region_size();
    if (size == 0) return false;
    void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) return false;
    pool_used = true;
    lpto_pool *P = &pool;
    P->base = P->next = P->reached = base;
    P->end = P->base + size;
    P->prev = lua_getallocf(L, &P->prev_ud);
    lua_setallocf(L, pool_alloc, P);
    return true;
}
