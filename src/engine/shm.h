/* Shared tensor memory (shm.c): the internals tests look at. The public
 * API (pto_shm_*) is in pto.h.
 *
 * Behaviour worth knowing beyond pto.h:
 *  - Blocks are 64-byte aligned and rounded up to 64 bytes; that rounded size
 *    is what pto_shm_block_size reports and in_use_bytes counts.
 *  - pto_shm_free of NULL does nothing. A pointer outside the arena, a
 *    pointer that is not the start of a live block, and a double free are
 *    ignored with a message in pto_errmsg(); nothing is touched.
 *  - After fork() the child keeps the mapping (and sees blocks the parent
 *    allocates later) but not the right to allocate: the parent's allocator
 *    state moves on without it. In a forked child pto_shm_alloc fails and
 *    pto_shm_free is ignored (its copy of a Lua heap may "free" the parent's
 *    tensors when it closes); pto_shm_contains and the data work as usual.
 *  - Freed memory goes back to the OS at once, except that dirty pages in
 *    free runs under 1 MiB (16 MiB in all) are kept for reuse, so churn of
 *    small tensors costs a memset rather than a madvise and page faults.
 *  - If the arena cannot be mapped at the asked size, half of it is tried,
 *    and so on down to 256 MiB (or the asked size if smaller). */
#ifndef PTO_SHM_H
#define PTO_SHM_H

#include <stdbool.h>
#include <stdint.h>

/* Parse a PTO_SHM_SIZE value: bytes with an optional K, M, G or T suffix
 * (powers of 1024, "KiB"/"KB" spellings too). 0, or -1 if s is not a size. */
int pto_shm_parse_size(const char *s, uint64_t *out);

/* The reservation's start into *base and the highest end (from *base) of any block allocated so
 * far into *top; true only in a forked child that allocates nothing of its own (check mode
 * protects its pages there, check.c). */
bool pto_shm_reservation(uintptr_t *base, uint64_t *top);

/* Counters of the page-release machinery, for tests. */
typedef struct pto_shm_debug_info {
    uint64_t madvise_calls;      /* MADV_REMOVE calls made by frees */
    uint64_t released_bytes;     /* bytes those calls covered */
    uint64_t zeroed_bytes;       /* bytes memset to zero by allocations */
    int64_t blocks;              /* free and live blocks */
    int64_t free_blocks;
    uint64_t free_bytes;
    uint64_t retained_bytes;     /* free pages kept dirty for reuse, not yet released */
} pto_shm_debug_info;

void pto_shm_debug(pto_shm_debug_info *out);

/* Walk every block and check the allocator's invariants (address order,
 * coalescing, free lists, live table, counters): 0, or -1 with pto_errmsg()
 * naming the first broken one. O(blocks); for tests. */
int pto_shm_check(void);

#endif
