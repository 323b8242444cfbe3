/*
 * shm.c - shared tensor memory: one MAP_SHARED | MAP_ANONYMOUS |
 * MAP_NORESERVE reservation per process, so children forked at any time see
 * every tensor at the same address, also tensors created after the fork.
 *
 * Design:
 *  - The allocator is TLSF-like: free blocks sit in segregated lists (16
 *    linear classes per power of two, 64-byte granule) found through two
 *    bitmaps, so alloc and free are O(1) apart from a rare fallback.
 *  - Its metadata lives in the private heap, never in the shared data: a
 *    node per block, linked in address order for coalescing, plus a hash
 *    of live block offsets so a bad or double free is caught, not obeyed.
 *    User data therefore cannot corrupt the allocator and free pages can be
 *    dropped.
 *  - Memory goes back to the OS on free: whole pages of a coalesced free
 *    block are released with MADV_REMOVE (MADV_DONTNEED would keep the
 *    pages of a shared mapping). Invariant: every whole page of a free block
 *    is zero, except those in its "dirty run" [dlo, dhi). A free adds the
 *    whole pages it newly makes free to that run; runs under 1 MiB, at most
 *    16 MiB in all, are kept for reuse (memset beats a madvise plus a page
 *    fault per page when small tensors churn), anything more is released at
 *    once. An allocation zeroes only the dirty run and the partial pages at
 *    the edges of the free block it is cut from, and does so unlocked.
 *  - One mutex guards it all (Lua's GC may free from any thread); madvise
 *    runs under it, since a released range must not be handed out before
 *    it is zero. fork takes it so the child gets a consistent copy, and the
 *    child may not allocate or free (see shm.h).
 */
#include "shm.h"
#include "common.h"
#include "u64map.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define GRAN_LOG 6
#define GRAN (1ull << GRAN_LOG)                  /* alignment and size unit */
#define SL_LOG 4
#define SL_COUNT (1u << SL_LOG)
#define SMALL (GRAN << SL_LOG)                   /* below: one class per granule */
#define FL_COUNT (64 - (GRAN_LOG + SL_LOG) + 1)
#define EXACT_PROBES 8
#define DEFAULT_SIZE (64ull << 30)
#define MIN_HALVED (256ull << 20)
#define MAX_SIZE (1ull << 56)                    /* beyond any address space */
#define RETAIN_RUN (1ull << 20)                  /* dirty runs kept must be smaller */
#define RETAIN_ALL (16ull << 20)                 /* and take this much at most */

typedef struct blk {
    uint64_t off, size;
    struct blk *prev, *next;                     /* neighbours in address order */
    struct blk *prev_free, *next_free;           /* size-class list, while free */
    uint64_t dlo, dhi;                           /* dirty whole pages, while free */
    bool free;
} blk;

/* A live block in the live table (u64map.h), keyed by its offset + 1: the
 * map reserves key 0, and the block at offset 0 is as live as any. */
typedef struct live_cell {
    PTO_U64MAP_CELL_HEAD
    blk *b;
} live_cell;

static struct {
    pthread_mutex_t lock;
    _Atomic uintptr_t base;                      /* 0 until reserved; size is set first */
    uint64_t size, page;
    _Atomic uint64_t top;                        /* highest end of a block so far, from outer_base (check.c) */
    uintptr_t outer_base;                        /* the whole reservation, also after pto_shm_adopt */
    uint64_t outer_size;
    pid_t owner;
    bool child;                                  /* forked from the owner: no allocating */
    bool zero_all;                               /* MADV_REMOVE failed: zero whole blocks */
    bool atfork_done;
    blk *first;                                  /* the block at offset 0, always there */
    uint64_t fl_map;
    uint32_t sl_map[FL_COUNT];
    blk *lists[FL_COUNT][SL_COUNT];
    pto_u64map live;                             /* of live_cell */
    uint64_t in_use, hwm, free_bytes, dirty;
    int64_t blocks, free_blocks;
    uint64_t madvise_calls, released_bytes, zeroed_bytes;
} A = {.lock = PTHREAD_MUTEX_INITIALIZER, .live = {.cell_size = sizeof(live_cell), .min_cells = 1024, .epoch = 1}};

/* ---- sizes and messages ---- */

static const char *fmt_size(char *buf, size_t len, uint64_t n)
{
    static const char *unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int u = 0;
    while (u < 6 && n >= (1ull << (10 * (u + 1)))) u++;
    if (u == 0) snprintf(buf, len, "%llu bytes", (unsigned long long)n);
    else if (n % (1ull << (10 * u)) == 0) snprintf(buf, len, "%llu %s", (unsigned long long)(n >> (10 * u)), unit[u]);
    else snprintf(buf, len, "%.1f %s", (double)n / (double)(1ull << (10 * u)), unit[u]);
    return buf;
}

int pto_shm_parse_size(const char *s, uint64_t *out)
{
    if (!s || !isdigit((unsigned char)*s)) return -1;   /* strtoull would take "-1" */
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno) return -1;
    int shift = 0;
    switch (toupper((unsigned char)*end)) {
    case 'K': shift = 10; break;
    case 'M': shift = 20; break;
    case 'G': shift = 30; break;
    case 'T': shift = 40; break;
    default: break;
    }
    if (shift) {
        end++;
        if (toupper((unsigned char)end[0]) == 'I' && toupper((unsigned char)end[1]) == 'B') end += 2;
        else if (toupper((unsigned char)*end) == 'B') end++;
    } else if (toupper((unsigned char)*end) == 'B') {
        end++;
    }
    while (isspace((unsigned char)*end)) end++;
    if (*end || v == 0 || v > (UINT64_MAX >> shift)) return -1;
    *out = (uint64_t)v << shift;
    return 0;
}

/* ---- size classes ---- */

static void mapping(uint64_t size, unsigned *fl, unsigned *sl)
{
    if (size < SMALL) {
        *fl = 0;
        *sl = (unsigned)(size >> GRAN_LOG);
    } else {
        unsigned f = 63u - (unsigned)__builtin_clzll(size);
        *fl = f - (GRAN_LOG + SL_LOG) + 1;
        *sl = (unsigned)(size >> (f - SL_LOG)) & (SL_COUNT - 1);
    }
}

static void list_insert(blk *b)
{
    unsigned fl, sl;
    mapping(b->size, &fl, &sl);
    b->prev_free = NULL;
    b->next_free = A.lists[fl][sl];
    if (b->next_free) b->next_free->prev_free = b;
    A.lists[fl][sl] = b;
    A.fl_map |= 1ull << fl;
    A.sl_map[fl] |= 1u << sl;
    b->free = true;
    A.free_blocks++;
}

static void list_remove(blk *b)
{
    unsigned fl, sl;
    mapping(b->size, &fl, &sl);
    if (b->prev_free) b->prev_free->next_free = b->next_free;
    else A.lists[fl][sl] = b->next_free;
    if (b->next_free) b->next_free->prev_free = b->prev_free;
    if (!A.lists[fl][sl]) {
        A.sl_map[fl] &= ~(1u << sl);
        if (!A.sl_map[fl]) A.fl_map &= ~(1ull << fl);
    }
    b->free = false;
    A.free_blocks--;
}

/* A free block of at least n bytes (a multiple of GRAN), or NULL. */
static blk *find_free(uint64_t n)
{
    unsigned fl, sl;
    mapping(n, &fl, &sl);
    /* n's own class may hold a block that fits exactly where it was freed
     * (neighbours coalesced); a few probes keep that from costing a scan. */
    blk *b = A.lists[fl][sl];
    for (int k = 0; b && k < EXACT_PROBES; k++, b = b->next_free)
        if (b->size >= n) return b;
    blk *rest = b;
    /* Good fit: the first class whose every block is >= n. */
    uint64_t up = n;
    if (n >= SMALL) up += (1ull << (63u - (unsigned)__builtin_clzll(n) - SL_LOG)) - 1;
    unsigned ufl, usl;
    mapping(up, &ufl, &usl);
    if (ufl < FL_COUNT) {
        uint32_t slm = A.sl_map[ufl] & (~0u << usl);
        if (!slm) {
            uint64_t flm = ufl + 1 < 64 ? A.fl_map & (~0ull << (ufl + 1)) : 0;
            if (flm) {
                ufl = (unsigned)__builtin_ctzll(flm);
                slm = A.sl_map[ufl];
            }
        }
        if (slm) return A.lists[ufl][__builtin_ctz(slm)];
    }
    /* Nothing larger: the rest of n's class is the last chance before
     * reporting exhaustion, so scanning it costs only on the way to failing. */
    for (b = rest; b; b = b->next_free)
        if (b->size >= n) return b;
    return NULL;
}

static uint64_t largest_free(void)
{
    if (!A.fl_map) return 0;
    unsigned fl = 63u - (unsigned)__builtin_clzll(A.fl_map);
    unsigned sl = 31u - (unsigned)__builtin_clz(A.sl_map[fl]);
    uint64_t best = 0;
    for (blk *b = A.lists[fl][sl]; b; b = b->next_free)
        if (b->size > best) best = b->size;
    return best;
}

/* ---- live blocks: offset -> node ---- */

static void live_put(uint64_t off, blk *b)
{
    live_cell *c = pto_u64map_add(&A.live, off + 1);
    c->b = b;
}

static live_cell *live_find(uint64_t off) { return pto_u64map_find(&A.live, off + 1); }

static blk *live_get(uint64_t off)
{
    live_cell *c = live_find(off);
    return c ? c->b : NULL;
}

/* ---- pages ---- */

typedef struct range {
    uint64_t lo, hi;
} range;

static uint64_t page_up(uint64_t x) { return (x + A.page - 1) & ~(A.page - 1); }
static uint64_t page_down(uint64_t x) { return x & ~(A.page - 1); }
static uint8_t *at(uint64_t off) { return (uint8_t *)atomic_load_explicit(&A.base, memory_order_relaxed) + off; }
static uint64_t len(range r) { return r.hi > r.lo ? r.hi - r.lo : 0; }

/* Give dirty whole pages back; they read as zero from then on, in every
 * process sharing the mapping. */
static void release(range r)
{
    if (!len(r)) return;
    A.dirty -= len(r);
    if (A.zero_all) return;
    if (madvise(at(r.lo), len(r), MADV_REMOVE) == 0) {
        A.madvise_calls++;
        A.released_bytes += len(r);
    } else {
        /* Without MADV_REMOVE (an old or unusual kernel) free pages cannot be
         * kept zero: allocations zero their whole block from now on. */
        A.zero_all = true;
    }
}

/* One dirty run from two: adjacent ones join; otherwise the smaller is
 * released, so a run never spans clean pages an allocation would memset. */
static range join(range a, range b)
{
    if (!len(a)) return b;
    if (!len(b)) return a;
    if (a.hi == b.lo) return (range){a.lo, b.hi};
    if (b.hi == a.lo) return (range){b.lo, a.hi};
    if (len(a) < len(b)) {
        release(a);
        return b;
    }
    release(b);
    return a;
}

/* ---- fork ---- */

static void atfork_prepare(void) { pthread_mutex_lock(&A.lock); }
static void atfork_parent(void) { pthread_mutex_unlock(&A.lock); }

static void atfork_child(void)
{
    if (atomic_load_explicit(&A.base, memory_order_relaxed)) A.child = true;
    pthread_mutex_unlock(&A.lock);
}

/* ---- API ---- */

static void *map_arena(uint64_t size, uint64_t *got)
{
    char want[32], now[32];
    uint64_t n = size;
    for (;;) {
        void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p != MAP_FAILED) {
            *got = n;
            return p;
        }
        int err = errno;
        uint64_t half = page_up(n / 2);
        if (n <= MIN_HALVED || half < MIN_HALVED) {
            pto_set_error("cannot reserve %s of shared tensor memory (mmap: %s%s%s); "
                          "set PTO_SHM_SIZE to a size this machine allows, e.g. PTO_SHM_SIZE=1G",
                          fmt_size(want, sizeof want, size), strerror(err), n < size ? ", also at sizes down to " : "",
                          n < size ? fmt_size(now, sizeof now, n) : "");
            return NULL;
        }
        n = half;
    }
}

int pto_shm_init(uint64_t bytes)
{
    if (atomic_load_explicit(&A.base, memory_order_acquire)) return 0;
    pthread_mutex_lock(&A.lock);
    if (atomic_load_explicit(&A.base, memory_order_relaxed)) {
        pthread_mutex_unlock(&A.lock);
        return 0;
    }
    uint64_t size = bytes;
    const char *env = getenv("PTO_SHM_SIZE");
    if (!size && env && *env && pto_shm_parse_size(env, &size) != 0) {
        pto_set_error("PTO_SHM_SIZE=\"%s\" is not a size; give bytes, optionally with a K, M, G or T "
                      "suffix (e.g. PTO_SHM_SIZE=16G)", env);
        pthread_mutex_unlock(&A.lock);
        return -1;
    }
    if (!size) size = DEFAULT_SIZE;
    if (size > MAX_SIZE) {
        char b[32];
        pto_set_error("shared tensor memory of %s is more than any address space; "
                      "set PTO_SHM_SIZE to a size this machine allows, e.g. PTO_SHM_SIZE=64G",
                      fmt_size(b, sizeof b, size));
        pthread_mutex_unlock(&A.lock);
        return -1;
    }
    long pg = sysconf(_SC_PAGESIZE);
    A.page = pg > 0 ? (uint64_t)pg : 4096;
    size = page_up(size);
    void *p = map_arena(size, &size);
    if (!p) {
        pthread_mutex_unlock(&A.lock);
        return -1;
    }
    blk *b = pto_xcalloc(1, sizeof *b);
    b->size = size;
    A.first = b;
    A.blocks = 1;
    A.size = size;
    A.free_bytes = size;
    A.owner = getpid();
    A.outer_base = (uintptr_t)p;
    A.outer_size = size;
    list_insert(b);
    if (!A.atfork_done) {
        pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
        A.atfork_done = true;
    }
    atomic_store_explicit(&A.base, (uintptr_t)p, memory_order_release);
    pthread_mutex_unlock(&A.lock);
    return 0;
}

int pto_shm_adopt(void *block, uint64_t bytes)
{
    pthread_mutex_lock(&A.lock);
    uintptr_t lo = (uintptr_t)block, hi = lo + bytes;
    if (!A.child || !A.outer_base || lo < A.outer_base || hi > A.outer_base + A.outer_size || hi < lo) {
        pto_set_error("cannot adopt %llu bytes at %p as this process's tensor memory: %s",
                      (unsigned long long)bytes, block,
                      !A.child ? "only a forked child adopts memory" : "it is not inside the shared tensor memory");
        pthread_mutex_unlock(&A.lock);
        return -1;
    }
    lo = (lo + A.page - 1) & ~(uintptr_t)(A.page - 1);   /* page-aligned offsets keep page releases exact */
    hi &= ~(uintptr_t)(A.page - 1);
    if (hi <= lo) {
        pto_set_error("%llu bytes are too few to adopt as tensor memory", (unsigned long long)bytes);
        pthread_mutex_unlock(&A.lock);
        return -1;
    }
    /* The parent's allocator state is a stale copy here: drop it. */
    for (blk *b = A.first, *next; b; b = next) {
        next = b->next;
        free(b);
    }
    pto_u64map_destroy(&A.live);
    A.fl_map = 0;
    memset(A.sl_map, 0, sizeof A.sl_map);
    memset(A.lists, 0, sizeof A.lists);
    A.in_use = A.hwm = A.dirty = 0;
    A.blocks = A.free_blocks = 0;
    A.madvise_calls = A.released_bytes = A.zeroed_bytes = 0;
    blk *b = pto_xcalloc(1, sizeof *b);
    b->size = hi - lo;
    A.first = b;
    A.blocks = 1;
    A.size = hi - lo;
    A.free_bytes = A.size;
    A.owner = getpid();
    A.child = false;
    list_insert(b);
    atomic_store_explicit(&A.base, lo, memory_order_release);
    pthread_mutex_unlock(&A.lock);
    return 0;
}

int pto_shm_is_child(void)
{
    pthread_mutex_lock(&A.lock);
    int child = A.child;
    pthread_mutex_unlock(&A.lock);
    return child;
}

void *pto_shm_alloc(uint64_t nbytes)
{
    char b1[32], b2[32], b3[32], b4[32];
    if (pto_shm_init(0) != 0) return NULL;
    if (nbytes == 0) {
        pto_set_error("cannot allocate 0 bytes of shared tensor memory; a tensor needs at least one element");
        return NULL;
    }
    pthread_mutex_lock(&A.lock);
    if (A.child) {
        pto_set_error("cannot create a tensor in a forked child (pid %d); only the process that "
                      "reserved the shared tensor memory (pid %d) allocates, create it there",
                      (int)getpid(), (int)A.owner);
        goto fail;
    }
    if (nbytes > A.size) {
        pto_set_error("%llu bytes (%s) requested, more than the whole shared tensor memory (%s); "
                      "raise PTO_SHM_SIZE", (unsigned long long)nbytes, fmt_size(b1, sizeof b1, nbytes),
                      fmt_size(b2, sizeof b2, A.size));
        goto fail;
    }
    uint64_t n = pto_align_up(nbytes, GRAN);
    blk *f = find_free(n);
    if (!f) {
        pto_set_error("shared tensor memory exhausted: %llu bytes (%s) requested, %s free in a %s arena "
                      "(largest free block %s); free tensors you no longer need or raise PTO_SHM_SIZE",
                      (unsigned long long)nbytes, fmt_size(b1, sizeof b1, nbytes),
                      fmt_size(b2, sizeof b2, A.free_bytes), fmt_size(b3, sizeof b3, A.size),
                      fmt_size(b4, sizeof b4, largest_free()));
        goto fail;
    }
    list_remove(f);
    uint64_t s = f->off, e = f->off + f->size;
    range dirty = {f->dlo, f->dhi};
    A.dirty -= len(dirty);
    if (f->size > n) {
        blk *r = pto_xmalloc(sizeof *r);
        r->off = s + n;
        r->size = f->size - n;
        r->dlo = dirty.lo > page_up(s + n) ? dirty.lo : page_up(s + n);
        r->dhi = dirty.hi > r->dlo ? dirty.hi : r->dlo;
        A.dirty += r->dhi - r->dlo;
        r->prev = f;
        r->next = f->next;
        if (r->next) r->next->prev = r;
        f->next = r;
        f->size = n;
        A.blocks++;
        list_insert(r);
    }
    /* What may be dirty: the partial pages at the free block's edges and its
     * dirty run. The block is ours alone now, so it is zeroed unlocked. */
    range z[3] = {{s, s + n}, {0, 0}, {0, 0}};
    uint64_t clo = page_up(s), chi = page_down(e);
    if (!A.zero_all && clo < chi) {
        z[0].hi = clo < s + n ? clo : s + n;
        z[1] = (range){chi > s ? chi : s, s + n};
        z[2] = (range){dirty.lo, dirty.hi < s + n ? dirty.hi : s + n};
    }
    live_put(s, f);
    uint64_t end = (uint64_t)((uintptr_t)at(s) + n - A.outer_base);
    if (end > atomic_load_explicit(&A.top, memory_order_relaxed)) atomic_store_explicit(&A.top, end, memory_order_relaxed);
    A.in_use += n;
    A.free_bytes -= n;
    if (A.in_use > A.hwm) A.hwm = A.in_use;
    uint64_t zeroed = 0;
    for (int i = 0; i < 3; i++) zeroed += len(z[i]);
    A.zeroed_bytes += zeroed;
    pthread_mutex_unlock(&A.lock);
    for (int i = 0; i < 3; i++)
        if (len(z[i])) memset(at(z[i].lo), 0, len(z[i]));
    return at(s);
fail:
    pthread_mutex_unlock(&A.lock);
    return NULL;
}

/* Merge b into its lower neighbour a (both out of the free lists). */
static blk *merge(blk *a, blk *b)
{
    a->size += b->size;
    a->next = b->next;
    if (a->next) a->next->prev = a;
    free(b);
    A.blocks--;
    return a;
}

void pto_shm_free(void *p)
{
    if (!p) return;
    if (!pto_shm_contains(p)) {
        pto_set_error("free of %p ignored: it is not in the shared tensor memory", p);
        return;
    }
    pthread_mutex_lock(&A.lock);
    uintptr_t base = atomic_load_explicit(&A.base, memory_order_relaxed);
    if (A.child || (uintptr_t)p < base || (uintptr_t)p - base >= A.size) {
        /* The parent may have freed and reused this block since the fork. */
        pto_set_error("free of %p ignored in a forked child (pid %d); the process that reserved the "
                      "shared tensor memory (pid %d) frees its tensors", p, (int)getpid(), (int)A.owner);
        pthread_mutex_unlock(&A.lock);
        return;
    }
    uint64_t off = (uint64_t)((uintptr_t)p - base);
    live_cell *cell = live_find(off);
    blk *b = cell ? cell->b : NULL;
    if (!b) {
        pto_set_error("free of %p (offset %llu in shared tensor memory) ignored: it is not the start "
                      "of a live block (freed twice, or never returned by pto_shm_alloc)",
                      p, (unsigned long long)off);
        pthread_mutex_unlock(&A.lock);
        return;
    }
    pto_u64map_remove(&A.live, cell);
    uint64_t s = b->off, e = b->off + b->size;
    A.in_use -= b->size;
    A.free_bytes += b->size;
    range before = {0, 0}, after = {0, 0};
    if (b->prev && b->prev->free) {
        before = (range){b->prev->dlo, b->prev->dhi};
        list_remove(b->prev);
        b = merge(b->prev, b);
    }
    if (b->next && b->next->free) {
        after = (range){b->next->dlo, b->next->dhi};
        list_remove(b->next);
        b = merge(b, b->next);
    }
    /* Whole pages of the merged block that lay in a free neighbour are
     * accounted for already; [s, e) newly completes those in between. */
    range mine = {page_up(b->off), page_down(b->off + b->size)};
    if (page_down(s) > mine.lo) mine.lo = page_down(s);
    if (page_up(e) < mine.hi) mine.hi = page_up(e);
    A.dirty += len(mine);
    range run = join(join(before, mine), after);
    if (len(run) >= RETAIN_RUN || A.dirty > RETAIN_ALL) {
        release(run);
        run = (range){0, 0};
    }
    b->dlo = run.lo;
    b->dhi = run.hi > run.lo ? run.hi : run.lo;
    list_insert(b);
    pthread_mutex_unlock(&A.lock);
}

int pto_shm_contains(const void *p)
{
    uintptr_t base = atomic_load_explicit(&A.base, memory_order_acquire);
    if (!base) return 0;   /* outer_* are set before base is published, and never change */
    return (uintptr_t)p >= A.outer_base && (uintptr_t)p - A.outer_base < A.outer_size;
}

bool pto_shm_reservation(uintptr_t *base, uint64_t *top)
{
    *base = atomic_load_explicit(&A.base, memory_order_acquire) ? A.outer_base : 0;
    *top = *base ? atomic_load_explicit(&A.top, memory_order_relaxed) : 0;
    return *base && A.child;
}

uint64_t pto_shm_block_size(const void *p)
{
    uintptr_t base = atomic_load_explicit(&A.base, memory_order_acquire);
    if (!base || (uintptr_t)p < base) return 0;
    uint64_t off = (uint64_t)((uintptr_t)p - base);
    pthread_mutex_lock(&A.lock);
    if (off >= A.size) {
        pthread_mutex_unlock(&A.lock);
        return 0;
    }
    blk *b = live_get(off);
    uint64_t n = b ? b->size : 0;
    pthread_mutex_unlock(&A.lock);
    return n;
}

void pto_shm_stats_get(pto_shm_stats *out)
{
    pthread_mutex_lock(&A.lock);
    out->reserved_bytes = A.size;
    out->in_use_bytes = A.in_use;
    out->hwm_bytes = A.hwm;
    out->live_blocks = (int64_t)A.live.count;
    pthread_mutex_unlock(&A.lock);
}

void pto_shm_debug(pto_shm_debug_info *out)
{
    pthread_mutex_lock(&A.lock);
    out->madvise_calls = A.madvise_calls;
    out->released_bytes = A.released_bytes;
    out->zeroed_bytes = A.zeroed_bytes;
    out->blocks = A.blocks;
    out->free_blocks = A.free_blocks;
    out->free_bytes = A.free_bytes;
    out->retained_bytes = A.dirty;
    pthread_mutex_unlock(&A.lock);
}

#define BAD(...) do { pto_set_error(__VA_ARGS__); goto out; } while (0)

int pto_shm_check(void)
{
    int rc = -1;
    pthread_mutex_lock(&A.lock);
    uint64_t off = 0, used = 0, live = 0, nfree = 0, nblocks = 0, dirty = 0;
    for (blk *b = A.first; b; b = b->next) {
        nblocks++;
        if (b->off != off) BAD("block at %llu should start at %llu", (unsigned long long)b->off,
                               (unsigned long long)off);
        if (!b->size || b->size % GRAN) BAD("block at %llu has size %llu", (unsigned long long)b->off,
                                            (unsigned long long)b->size);
        if (b->next && b->next->prev != b) BAD("block at %llu: broken back link", (unsigned long long)b->off);
        if (b->free) {
            nfree++;
            if (b->next && b->next->free) BAD("free blocks at %llu and %llu not coalesced",
                                              (unsigned long long)b->off, (unsigned long long)b->next->off);
            if (live_get(b->off)) BAD("free block at %llu is in the live table", (unsigned long long)b->off);
            if (b->dhi > b->dlo) {
                if (b->dlo % A.page || b->dhi % A.page || b->dlo < b->off || b->dhi > b->off + b->size ||
                    b->dhi - b->dlo >= RETAIN_RUN)
                    BAD("free block at %llu has a bad dirty run [%llu, %llu)", (unsigned long long)b->off,
                        (unsigned long long)b->dlo, (unsigned long long)b->dhi);
                dirty += b->dhi - b->dlo;
            }
        } else {
            live++;
            used += b->size;
            if (live_get(b->off) != b) BAD("live block at %llu missing from the live table",
                                           (unsigned long long)b->off);
        }
        off += b->size;
    }
    if (off != A.size) BAD("blocks cover %llu of %llu bytes", (unsigned long long)off, (unsigned long long)A.size);
    uint64_t listed = 0;
    for (unsigned fl = 0; fl < FL_COUNT; fl++) {
        for (unsigned sl = 0; sl < SL_COUNT; sl++) {
            bool bit = (A.fl_map >> fl & 1) && (A.sl_map[fl] >> sl & 1);
            if (bit != (A.lists[fl][sl] != NULL)) BAD("bitmap of class %u/%u is wrong", fl, sl);
            for (blk *b = A.lists[fl][sl]; b; b = b->next_free) {
                unsigned f, s;
                mapping(b->size, &f, &s);
                if (!b->free || f != fl || s != sl) BAD("block at %llu is in the wrong free list",
                                                        (unsigned long long)b->off);
                listed++;
            }
        }
    }
    if (listed != nfree || (int64_t)nfree != A.free_blocks) BAD("%llu free blocks, %llu listed, %lld counted",
        (unsigned long long)nfree, (unsigned long long)listed, (long long)A.free_blocks);
    if ((int64_t)nblocks != A.blocks) BAD("%llu blocks, %lld counted", (unsigned long long)nblocks,
                                          (long long)A.blocks);
    if (live != A.live.count) BAD("%llu live blocks, %llu in the live table", (unsigned long long)live,
                                  (unsigned long long)A.live.count);
    if (used != A.in_use || A.size - used != A.free_bytes) BAD("%llu bytes in use, counters say %llu",
        (unsigned long long)used, (unsigned long long)A.in_use);
    if (dirty != A.dirty || dirty > RETAIN_ALL) BAD("%llu dirty bytes in runs, counter says %llu",
        (unsigned long long)dirty, (unsigned long long)A.dirty);
    rc = 0;
out:
    pthread_mutex_unlock(&A.lock);
    return rc;
}
