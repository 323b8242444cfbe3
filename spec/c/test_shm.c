/*
 * test_shm.c - shared tensor memory (shm.c): alignment and zero fill
 * (also of recycled dirty memory), coalescing, pages going back to the OS
 * (RssShmem) without a madvise per tiny free, sharing with a child forked
 * before the allocation, a randomised churn against a reference model,
 * bad and double frees, exhaustion and size errors, PTO_SHM_SIZE and the
 * halving fallback, and alloc/free from four threads with cross-thread
 * frees.
 *
 * The parent's arena is 1 GiB (pto_shm_init(ARENA) before anything else
 * allocates); the default size and PTO_SHM_SIZE are tried in forked children
 * that have not reserved one yet.
 */
#include "testutil.h"

#include "shm.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KIB 1024ull
#define MIB (1024ull * KIB)
#define GIB (1024ull * MIB)
#define ARENA GIB
#define RETAIN_ALL (16 * MIB)   /* shm.c keeps at most this much freed memory dirty */

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif
#if defined(__SANITIZE_THREAD__)
#define SLOW 4        /* TSan: fewer operations */
#else
#define SLOW 1
#endif

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

static uint64_t rnd_in(uint64_t lo, uint64_t hi) { return lo + rnd() % (hi - lo + 1); }

static bool all_bytes(const void *p, uint64_t n, uint8_t v)
{
    const uint8_t *b = p;
    uint64_t w = 0x0101010101010101ull * v, i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t x;
        memcpy(&x, b + i, 8);
        if (x != w) return false;
    }
    for (; i < n; i++)
        if (b[i] != v) return false;
    return true;
}

/* RssShmem of this process in KiB, or -1 if the kernel does not report it. */
static long rss_shmem_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long kb = -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "RssShmem:", 9) == 0) { kb = strtol(line + 9, NULL, 10); break; }
    fclose(f);
    return kb;
}

static pto_shm_debug_info dbg(void)
{
    pto_shm_debug_info d;
    pto_shm_debug(&d);
    return d;
}

static void check_consistent(void)
{
    int rc = pto_shm_check();
    CHECK_EQ(rc, 0);
    if (rc) fprintf(stderr, "  pto_shm_check: %s\n", pto_errmsg());
}

/* Everything freed: the arena is one free block again. */
static void check_empty(void)
{
    pto_shm_stats st;
    pto_shm_stats_get(&st);
    CHECK_EQ(st.in_use_bytes, 0);
    CHECK_EQ(st.live_blocks, 0);
    pto_shm_debug_info d = dbg();
    CHECK_EQ(d.blocks, 1);
    CHECK_EQ(d.free_bytes, ARENA);
    check_consistent();
}

/* Run fn in a forked child; its return value is the exit status. */
static int in_child(int (*fn)(void))
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) _exit(fn());
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

#define CHILD_CHECK(cond) do { if (!(cond)) { \
    fprintf(stderr, "%s:%d: child check failed: %s (%s)\n", __FILE__, __LINE__, #cond, pto_errmsg()); \
    return 1; } } while (0)

/* ------------------------------------------------------------------ */

static void test_parse_size(void)
{
    uint64_t v = 0;
    CHECK_EQ(pto_shm_parse_size("4096", &v), 0); CHECK_EQ(v, 4096);
    CHECK_EQ(pto_shm_parse_size("4k", &v), 0); CHECK_EQ(v, 4 * KIB);
    CHECK_EQ(pto_shm_parse_size("512M", &v), 0); CHECK_EQ(v, 512 * MIB);
    CHECK_EQ(pto_shm_parse_size("16G", &v), 0); CHECK_EQ(v, 16 * GIB);
    CHECK_EQ(pto_shm_parse_size("2GiB", &v), 0); CHECK_EQ(v, 2 * GIB);
    CHECK_EQ(pto_shm_parse_size("3gb", &v), 0); CHECK_EQ(v, 3 * GIB);
    CHECK_EQ(pto_shm_parse_size("1T", &v), 0); CHECK_EQ(v, 1024 * GIB);
    CHECK_EQ(pto_shm_parse_size("100B", &v), 0); CHECK_EQ(v, 100);
    const char *bad[] = {"", "0", "0G", "-1", "+5", "G", "12X", "1.5G", "5 G x", "99999999999999999999",
                         "17179869184G", " 5"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        v = 7;
        int rc = pto_shm_parse_size(bad[i], &v);
        CHECK_EQ(rc, -1);
        if (rc != -1) fprintf(stderr, "  accepted \"%s\"\n", bad[i]);
        CHECK_EQ(v, 7);
    }
}

static int child_default_size(void)
{
    unsetenv("PTO_SHM_SIZE");
    CHILD_CHECK(pto_shm_init(0) == 0);
    pto_shm_stats st;
    pto_shm_stats_get(&st);
    /* 64 GiB, or a halving of it where the machine refuses that much. */
    CHILD_CHECK(st.reserved_bytes >= 256 * MIB && st.reserved_bytes <= 64 * GIB);
    CHILD_CHECK((64 * GIB) % st.reserved_bytes == 0);
    uint8_t *p = pto_shm_alloc(100);
    CHILD_CHECK(p && all_bytes(p, 100, 0));
    pto_shm_free(p);
    CHILD_CHECK(pto_shm_init(4 * GIB) == 0);           /* idempotent: no second reservation */
    pto_shm_stats st2;
    pto_shm_stats_get(&st2);
    CHILD_CHECK(st2.reserved_bytes == st.reserved_bytes);
    return 0;
}

static int child_env_size(void)
{
    setenv("PTO_SHM_SIZE", "300M", 1);
    CHILD_CHECK(pto_shm_alloc(64) != NULL);            /* alloc reserves the arena itself */
    pto_shm_stats st;
    pto_shm_stats_get(&st);
    CHILD_CHECK(st.reserved_bytes == 300 * MIB);
    CHILD_CHECK(st.live_blocks == 1 && st.in_use_bytes == 64);
    CHILD_CHECK(pto_shm_alloc(300 * MIB) == NULL);
    return 0;
}

static int child_bad_env(void)
{
    setenv("PTO_SHM_SIZE", "lots", 1);
    CHILD_CHECK(pto_shm_init(0) == -1);
    CHILD_CHECK(strstr(pto_errmsg(), "PTO_SHM_SIZE=\"lots\""));
    CHILD_CHECK(pto_shm_alloc(64) == NULL);
    CHILD_CHECK(strstr(pto_errmsg(), "PTO_SHM_SIZE"));
    /* An explicit size does not read the environment. */
    CHILD_CHECK(pto_shm_init(32 * MIB) == 0);
    CHILD_CHECK(pto_shm_alloc(64) != NULL);
    return 0;
}

static long vm_size_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long kb = -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "VmSize:", 7) == 0) { kb = strtol(line + 7, NULL, 10); break; }
    fclose(f);
    return kb;
}

static int limit_address_space(uint64_t extra)
{
    long kb = vm_size_kb();
    if (kb < 0) return -1;
    struct rlimit rl = {.rlim_cur = (rlim_t)kb * 1024 + extra, .rlim_max = (rlim_t)kb * 1024 + extra};
    return setrlimit(RLIMIT_AS, &rl);
}

static int child_halving(void)
{
    unsetenv("PTO_SHM_SIZE");
    CHILD_CHECK(limit_address_space(GIB + 512 * MIB) == 0);
    CHILD_CHECK(pto_shm_init(0) == 0);
    pto_shm_stats st;
    pto_shm_stats_get(&st);
    CHILD_CHECK(st.reserved_bytes == GIB);             /* 64 GiB halved until it fits */
    CHILD_CHECK(pto_shm_alloc(GIB - 4 * KIB) != NULL);
    return 0;
}

static int child_no_room(void)
{
    unsetenv("PTO_SHM_SIZE");
    CHILD_CHECK(limit_address_space(128 * MIB) == 0);
    CHILD_CHECK(pto_shm_init(0) == -1);
    CHILD_CHECK(strstr(pto_errmsg(), "cannot reserve 64 GiB"));
    CHILD_CHECK(strstr(pto_errmsg(), "down to 256 MiB"));
    CHILD_CHECK(strstr(pto_errmsg(), "PTO_SHM_SIZE"));
    return 0;
}

/* Runs before the parent reserves its arena, so children start bare. */
static void test_sizes_in_children(void)
{
    CHECK_EQ(pto_shm_contains((void *)&rng_state), 0);
    CHECK_EQ(in_child(child_default_size), 0);
    CHECK_EQ(in_child(child_env_size), 0);
    CHECK_EQ(in_child(child_bad_env), 0);
    if (!SANITIZED) {              /* sanitizers reserve terabytes: RLIMIT_AS would break them */
        CHECK_EQ(in_child(child_halving), 0);
        CHECK_EQ(in_child(child_no_room), 0);
    }
}

static void test_init(void)
{
    pto_shm_stats st;
    pto_shm_stats_get(&st);
    CHECK_EQ(st.reserved_bytes, 0);
    CHECK_EQ(pto_shm_block_size(&st), 0);
    pto_shm_free(NULL);
    CHECK_EQ(pto_shm_init(ARENA), 0);
    CHECK_EQ(pto_shm_init(0), 0);
    CHECK_EQ(pto_shm_init(4 * GIB), 0);
    pto_shm_stats_get(&st);
    CHECK_EQ(st.reserved_bytes, ARENA);
    check_empty();
}

static void test_contains_and_size(void)
{
    uint8_t *p = pto_shm_alloc(1000);
    CHECK(p != NULL);
    CHECK_EQ(pto_shm_contains(p), 1);
    CHECK_EQ(pto_shm_contains(p + 999), 1);
    CHECK_EQ(pto_shm_contains(NULL), 0);
    CHECK_EQ(pto_shm_contains(&p), 0);
    CHECK_EQ(pto_shm_block_size(p), 1024);
    CHECK_EQ(pto_shm_block_size(p + 64), 0);           /* inside, but not a block start */
    CHECK_EQ(pto_shm_block_size(&p), 0);
    /* The arena's first block sits at its base: probe both ends. */
    uint8_t *base = p;
    while (pto_shm_contains(base - 4096)) base -= 4096;
    CHECK_EQ(pto_shm_contains(base), 1);
    CHECK_EQ(pto_shm_contains(base - 1), 0);
    CHECK_EQ(pto_shm_contains(base + ARENA - 1), 1);
    CHECK_EQ(pto_shm_contains(base + ARENA), 0);
    pto_shm_stats st;
    pto_shm_stats_get(&st);
    CHECK_EQ(st.in_use_bytes, 1024);
    CHECK_EQ(st.live_blocks, 1);
    pto_shm_free(p);
    CHECK_EQ(pto_shm_block_size(p), 0);
    check_empty();
}

static void test_alignment_and_zero_fill(void)
{
    enum { N = 300 };
    uint8_t *p[N];
    uint64_t len[N];
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N; i++) {
            len[i] = i < 100 ? (uint64_t)i + 1 : rnd_in(1, 20000);
            p[i] = pto_shm_alloc(len[i]);
            CHECK(p[i] != NULL);
            if (!p[i]) return;
            CHECK_EQ((uintptr_t)p[i] % 64, 0);
            CHECK_EQ(pto_shm_block_size(p[i]), (len[i] + 63) / 64 * 64);
            CHECK(all_bytes(p[i], pto_shm_block_size(p[i]), 0));
            memset(p[i], 0xA5, pto_shm_block_size(p[i]));    /* dirty for the next round */
        }
        for (int i = 0; i < N; i += 2) pto_shm_free(p[i]);
        for (int i = 1; i < N; i += 2) CHECK(all_bytes(p[i], pto_shm_block_size(p[i]), 0xA5));
        for (int i = 1; i < N; i += 2) pto_shm_free(p[i]);
    }
    check_empty();

    /* A small hole between live blocks is reused as it is: dirty, zeroed by
     * the allocation (no page of it was released). */
    uint8_t *a = pto_shm_alloc(200), *b = pto_shm_alloc(200), *c = pto_shm_alloc(200);
    memset(b, 0xFF, 256);
    pto_shm_free(b);
    uint8_t *b2 = pto_shm_alloc(256);
    CHECK(b2 == b);
    CHECK(all_bytes(b2, 256, 0));
    pto_shm_free(a);
    pto_shm_free(b2);
    pto_shm_free(c);
    check_empty();
}

static void test_coalescing(void)
{
    enum { N = 7 };
    uint8_t *x[N];
    for (int i = 0; i < N; i++) {
        x[i] = pto_shm_alloc(10000);
        memset(x[i], i + 1, 10000);
    }
    for (int i = 1; i < N; i++) CHECK(x[i] == x[i - 1] + 10048);
    int64_t blocks = dbg().blocks;
    /* Free 2 and 4, then 3 between them: one free block from x[2] to x[5]. */
    pto_shm_free(x[2]);
    pto_shm_free(x[4]);
    CHECK_EQ(dbg().blocks, blocks);
    pto_shm_free(x[3]);
    CHECK_EQ(dbg().blocks, blocks - 2);
    check_consistent();
    /* Exactly their space fits where they were, not in the arena's tail. */
    uint8_t *big = pto_shm_alloc(3 * 10048);
    CHECK(big == x[2]);
    CHECK(all_bytes(big, 3 * 10048, 0));
    CHECK(all_bytes(x[1], 10000, 2));
    CHECK(all_bytes(x[5], 10000, 6));
    pto_shm_free(big);
    /* Freeing the rest in any order merges everything back into one block. */
    int order[] = {6, 0, 5, 1};
    for (int i = 0; i < 4; i++) pto_shm_free(x[order[i]]);
    check_empty();
}

static void test_pages_released(void)
{
    long before = rss_shmem_kb();
    pto_shm_debug_info d0 = dbg();
    uint64_t n = 256 * MIB;
    uint8_t *p = pto_shm_alloc(n);
    CHECK(p != NULL);
    if (!p) return;
    for (uint64_t i = 0; i < n; i += 4096) p[i] = 0x5A;     /* every page resident */
    long touched = rss_shmem_kb();
    pto_shm_free(p);
    long after = rss_shmem_kb();
    pto_shm_debug_info d1 = dbg();
    CHECK(d1.released_bytes - d0.released_bytes >= n);
    if (before < 0) {
        printf("  (no RssShmem in /proc/self/status: RSS not checked)\n");
    } else {
        CHECK(touched - before >= (long)(n / KIB) - 1024);
        CHECK(after - before <= 1024);
        printf("  RssShmem: %ld KiB before, %ld touched, %ld after free\n", before, touched, after);
    }
    /* Reused, the released pages read as zero again. */
    uint8_t *q = pto_shm_alloc(n);
    CHECK(q == p);
    if (q) {
        uint64_t nonzero = 0;
        for (uint64_t i = 0; i < n; i += 4096) nonzero += q[i] != 0;
        CHECK_EQ(nonzero, 0);
        pto_shm_free(q);
    }
    check_empty();
}

static void test_no_madvise_storm(void)
{
    /* 64 small blocks between two live guards: their merged space is under
     * two pages, so at most one whole page is ever released, once. */
    uint8_t *g0 = pto_shm_alloc(64), *s[64], *g1;
    for (int i = 0; i < 64; i++) {
        s[i] = pto_shm_alloc(64);
        memset(s[i], 0xEE, 64);
    }
    g1 = pto_shm_alloc(64);
    pto_shm_debug_info d0 = dbg();
    for (int i = 0; i < 64; i++) pto_shm_free(s[(i * 37) % 64]);
    pto_shm_debug_info d1 = dbg();
    CHECK(d1.madvise_calls - d0.madvise_calls <= 1);
    /* Tiny churn in a hole between live blocks: no madvise at all. */
    uint8_t *a = pto_shm_alloc(200), *b = pto_shm_alloc(200), *c = pto_shm_alloc(200);
    pto_shm_free(b);
    d0 = dbg();
    for (int i = 0; i < 10000; i++) {
        uint8_t *t = pto_shm_alloc(100 + (uint64_t)i % 150);
        CHECK(t == b);
        t[0] = 1;
        pto_shm_free(t);
    }
    d1 = dbg();
    CHECK_EQ(d1.madvise_calls - d0.madvise_calls, 0);
    pto_shm_free(a);
    pto_shm_free(c);
    pto_shm_free(g0);
    pto_shm_free(g1);
    check_empty();
}

static void test_small_frees_retained(void)
{
    /* A small free keeps its dirty pages for the next allocation: no
     * madvise, and the reuse is zeroed by memset. */
    pto_shm_debug_info d0 = dbg();
    uint8_t *a = pto_shm_alloc(256 * KIB);
    memset(a, 0x77, 256 * KIB);
    pto_shm_free(a);
    pto_shm_debug_info d1 = dbg();
    CHECK_EQ(d1.madvise_calls, d0.madvise_calls);
    CHECK(d1.retained_bytes >= 256 * KIB);
    uint8_t *a2 = pto_shm_alloc(256 * KIB);
    CHECK(a2 == a);
    CHECK(all_bytes(a2, 256 * KIB, 0));
    pto_shm_debug_info d2 = dbg();
    CHECK(d2.zeroed_bytes - d1.zeroed_bytes >= 256 * KIB);
    CHECK(d2.retained_bytes <= d1.retained_bytes - 256 * KIB);
    pto_shm_free(a2);

    /* A large one goes back at once. */
    d0 = dbg();
    uint8_t *big = pto_shm_alloc(4 * MIB);
    memset(big, 0x77, 4 * MIB);
    pto_shm_free(big);
    d1 = dbg();
    CHECK(d1.madvise_calls > d0.madvise_calls);
    CHECK(d1.released_bytes - d0.released_bytes >= 4 * MIB);
    CHECK(d1.retained_bytes < RETAIN_ALL);

    /* Many small ones: at most RETAIN_ALL stays resident. */
    enum { N = 64 };
    uint8_t *blk[N], *guard[N];
    long rss0 = rss_shmem_kb();
    for (int i = 0; i < N; i++) {
        blk[i] = pto_shm_alloc(512 * KIB);
        guard[i] = pto_shm_alloc(64);          /* keeps the blocks from coalescing */
        memset(blk[i], 0x66, 512 * KIB);
    }
    for (int i = 0; i < N; i++) pto_shm_free(blk[i]);
    d2 = dbg();
    CHECK(d2.retained_bytes <= RETAIN_ALL);
    CHECK(d2.retained_bytes >= RETAIN_ALL / 2);
    long rss1 = rss_shmem_kb();
    if (rss0 >= 0) CHECK(rss1 - rss0 <= (long)(RETAIN_ALL / KIB) + 256);
    check_consistent();
    /* Retained blocks are handed out again zeroed. */
    for (int i = 0; i < N; i++) {
        blk[i] = pto_shm_alloc(512 * KIB);
        CHECK(all_bytes(blk[i], 512 * KIB, 0));
    }
    for (int i = 0; i < N; i++) {
        pto_shm_free(guard[i]);
        pto_shm_free(blk[i]);
    }
    check_empty();
}

static int to_child[2], to_parent[2];

static int fork_child(void)
{
    uint8_t *p = NULL;
    uint64_t n = 0;
    if (read(to_child[0], &p, sizeof p) != sizeof p || read(to_child[0], &n, sizeof n) != sizeof n) return 2;
    CHILD_CHECK(pto_shm_contains(p));
    CHILD_CHECK(all_bytes(p, n / 2, 0x11));              /* written by the parent after the fork */
    memset(p + n / 2, 0x22, n / 2);
    /* The child may not allocate, and its frees must not touch the parent's data. */
    CHILD_CHECK(pto_shm_alloc(64) == NULL);
    CHILD_CHECK(strstr(pto_errmsg(), "forked child"));
    pto_shm_free(p);
    CHILD_CHECK(strstr(pto_errmsg(), "ignored in a forked child"));
    CHILD_CHECK(all_bytes(p, n / 2, 0x11));
    char ok = 'k';
    if (write(to_parent[1], &ok, 1) != 1) return 3;
    return 0;
}

static void test_fork_sees_later_tensors(void)
{
    CHECK_EQ(pipe(to_child), 0);
    CHECK_EQ(pipe(to_parent), 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) _exit(fork_child());
    CHECK(pid > 0);
    close(to_child[0]);        /* so a child that dies early ends our read */
    close(to_parent[1]);
    uint64_t n = 4 * MIB;
    uint8_t *p = pto_shm_alloc(n);              /* after the fork */
    CHECK(p != NULL);
    memset(p, 0x11, n / 2);
    CHECK(write(to_child[1], &p, sizeof p) == sizeof p);
    CHECK(write(to_child[1], &n, sizeof n) == sizeof n);
    char ok = 0;
    CHECK_EQ(read(to_parent[0], &ok, 1), 1);
    CHECK_EQ(ok, 'k');
    int st = 0;
    CHECK_EQ(waitpid(pid, &st, 0), pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(all_bytes(p, n / 2, 0x11));
    CHECK(all_bytes(p + n / 2, n / 2, 0x22));                 /* the child's writes */
    CHECK_EQ(pto_shm_block_size(p), n);
    pto_shm_free(p);
    close(to_child[1]);
    close(to_parent[0]);
    check_empty();
}

static void test_bad_free(void)
{
    uint8_t *p = pto_shm_alloc(4096), *q = pto_shm_alloc(4096);
    memset(p, 0x33, 4096);
    pto_shm_stats st0, st1;
    pto_shm_stats_get(&st0);
    int local = 0;
    pto_shm_free(&local);
    CHECK_CONTAINS(pto_errmsg(), "not in the shared tensor memory");
    pto_shm_free(p + 64);
    CHECK_CONTAINS(pto_errmsg(), "not the start of a live block");
    pto_shm_free(p + 1);
    CHECK_CONTAINS(pto_errmsg(), "ignored");
    pto_shm_free(q + 4096 + 64 * 1000);       /* in the free tail */
    CHECK_CONTAINS(pto_errmsg(), "not the start of a live block");
    pto_shm_stats_get(&st1);
    CHECK_EQ(st1.in_use_bytes, st0.in_use_bytes);
    CHECK_EQ(st1.live_blocks, st0.live_blocks);
    CHECK(all_bytes(p, 4096, 0x33));
    pto_shm_free(q);
    pto_shm_free(q);                           /* double free */
    CHECK_CONTAINS(pto_errmsg(), "freed twice");
    pto_shm_stats_get(&st1);
    CHECK_EQ(st1.live_blocks, st0.live_blocks - 1);
    check_consistent();
    /* After q's space is handed out again, p's double free is still caught
     * and leaves the new block alone. */
    uint8_t *r = pto_shm_alloc(8192);
    memset(r, 0x44, 8192);
    CHECK(all_bytes(p, 4096, 0x33));
    pto_shm_free(p);
    pto_shm_free(p);
    CHECK_CONTAINS(pto_errmsg(), "freed twice");
    CHECK(all_bytes(r, 8192, 0x44));
    CHECK_EQ(pto_shm_block_size(r), 8192);
    pto_shm_free(r);
    check_empty();
}

static void test_errors(void)
{
    CHECK(pto_shm_alloc(0) == NULL);
    CHECK_CONTAINS(pto_errmsg(), "cannot allocate 0 bytes");
    CHECK(pto_shm_alloc(ARENA + 1) == NULL);
    CHECK_CONTAINS(pto_errmsg(), "more than the whole shared tensor memory (1 GiB); raise PTO_SHM_SIZE");
    CHECK(pto_shm_alloc(UINT64_MAX) == NULL);
    CHECK_CONTAINS(pto_errmsg(), "raise PTO_SHM_SIZE");
    CHECK(pto_shm_alloc(UINT64_MAX - 10) == NULL);

    uint8_t *a = pto_shm_alloc(600 * MIB);
    CHECK(a != NULL);
    CHECK(pto_shm_alloc(600 * MIB) == NULL);
    const char *m = pto_errmsg();
    CHECK_CONTAINS(m, "shared tensor memory exhausted: 629145600 bytes (600 MiB) requested, "
                      "424 MiB free in a 1 GiB arena (largest free block 424 MiB)");
    CHECK_CONTAINS(m, "free tensors you no longer need or raise PTO_SHM_SIZE");
    pto_shm_stats st;
    pto_shm_stats_get(&st);
    CHECK_EQ(st.in_use_bytes, 600 * MIB);
    CHECK(st.hwm_bytes >= 600 * MIB);
    /* Fill the rest exactly, then nothing more fits. */
    uint8_t *b = pto_shm_alloc(424 * MIB);
    CHECK(b != NULL);
    CHECK(pto_shm_alloc(1) == NULL);
    CHECK_CONTAINS(pto_errmsg(), "0 bytes free in a 1 GiB arena");
    pto_shm_free(a);
    pto_shm_free(b);
    /* All coalesced: the whole arena is one block again. */
    uint8_t *all = pto_shm_alloc(ARENA);
    CHECK(all != NULL);
    pto_shm_stats_get(&st);
    CHECK_EQ(st.hwm_bytes, ARENA);
    pto_shm_free(all);
    check_empty();
}

/* ---- churn against a reference model ---- */

typedef struct live {
    uint8_t *p;
    uint64_t n;           /* usable size */
    uint8_t fill;
} live;

static uint64_t churn_size(void)
{
    uint64_t r = rnd() % 100;
    if (r < 70) return rnd_in(1, 2048);
    if (r < 98) return rnd_in(2049, 32 * KIB);
    return rnd_in(32 * KIB, 512 * KIB);
}

static void test_churn(void)
{
    enum { MAXLIVE = 512 };
    static live lv[MAXLIVE];
    int nlive = 0, ops = 200000 / SLOW;
    uint64_t model_in_use = 0, bad_overlap = 0, bad_zero = 0, bad_data = 0, bad_size = 0, fails = 0;
    long rss0 = rss_shmem_kb();
    for (int op = 0; op < ops; op++) {
        /* Drift between mostly-allocating and mostly-freeing phases. */
        int phase = (op / 5000) % 2;
        bool do_alloc = nlive == 0 || (nlive < MAXLIVE && rnd() % 100 < (phase ? 60u : 40u));
        if (do_alloc) {
            uint64_t want = churn_size();
            uint8_t *p = pto_shm_alloc(want);
            if (!p) { fails++; continue; }
            uint64_t n = pto_shm_block_size(p);
            if (n != (want + 63) / 64 * 64 || (uintptr_t)p % 64) bad_size++;
            for (int i = 0; i < nlive; i++)
                if (p < lv[i].p + lv[i].n && lv[i].p < p + n) bad_overlap++;
            if (!all_bytes(p, n, 0)) bad_zero++;
            uint8_t fill = (uint8_t)(1 + op % 255);
            memset(p, fill, n);
            lv[nlive++] = (live){p, n, fill};
            model_in_use += n;
        } else {
            int i = (int)(rnd() % (uint64_t)nlive);
            if (!all_bytes(lv[i].p, lv[i].n, lv[i].fill)) bad_data++;
            pto_shm_free(lv[i].p);
            model_in_use -= lv[i].n;
            lv[i] = lv[--nlive];
        }
        if (op % 20000 == 0) {
            check_consistent();
            pto_shm_stats st;
            pto_shm_stats_get(&st);
            CHECK_EQ(st.in_use_bytes, model_in_use);
            CHECK_EQ(st.live_blocks, nlive);
        }
    }
    CHECK_EQ(fails, 0);
    CHECK_EQ(bad_size, 0);
    CHECK_EQ(bad_overlap, 0);
    CHECK_EQ(bad_zero, 0);
    CHECK_EQ(bad_data, 0);
    pto_shm_debug_info d = dbg();
    printf("  %d ops: %lld blocks, %llu MiB zeroed by allocs, %llu madvise calls, %llu MiB released\n", ops,
           (long long)d.blocks, (unsigned long long)(d.zeroed_bytes >> 20), (unsigned long long)d.madvise_calls,
           (unsigned long long)(d.released_bytes >> 20));
    while (nlive) {
        nlive--;
        if (!all_bytes(lv[nlive].p, lv[nlive].n, lv[nlive].fill)) bad_data++;
        pto_shm_free(lv[nlive].p);
    }
    CHECK_EQ(bad_data, 0);
    check_empty();
    long rss1 = rss_shmem_kb();
    if (rss0 >= 0) CHECK(rss1 - rss0 <= (long)(RETAIN_ALL / KIB));   /* went back to the OS */
}

/* ---- threads ---- */

#define NT 4
static _Atomic uintptr_t handoff[NT];      /* a block passed to the next thread to free */
static _Atomic long thread_bad;

static void verify_and_free(uint8_t *p)
{
    uint64_t n = pto_shm_block_size(p);
    if (!n || !all_bytes(p, n, p[0]) || p[0] == 0) atomic_fetch_add(&thread_bad, 1);
    pto_shm_free(p);
}

static void *thread_main(void *arg)
{
    int id = (int)(intptr_t)arg;
    uint64_t x = 0x2545F4914F6CDD1Dull * (uint64_t)(id + 1);
    enum { K = 32 };
    uint8_t *mine[K] = {0};
    for (int op = 0; op < 20000 / SLOW; op++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        int k = (int)(x % K);
        if (mine[k]) {
            verify_and_free(mine[k]);
            mine[k] = NULL;
        } else {
            uint64_t n = 1 + (x >> 8) % (x % 16 == 0 ? 256 * KIB : 4 * KIB);
            uint8_t *p = pto_shm_alloc(n);
            if (!p || !all_bytes(p, pto_shm_block_size(p), 0)) { atomic_fetch_add(&thread_bad, 1); continue; }
            memset(p, 1 + id + 4 * (op % 60), pto_shm_block_size(p));
            if (op % 7 == 0) {
                /* Another thread frees it, as Lua's GC might. */
                uintptr_t old = atomic_exchange(&handoff[(id + 1) % NT], (uintptr_t)p);
                if (old) verify_and_free((uint8_t *)old);
            } else {
                mine[k] = p;
            }
        }
        uintptr_t got = atomic_exchange(&handoff[id], 0);
        if (got) verify_and_free((uint8_t *)got);
    }
    for (int k = 0; k < K; k++)
        if (mine[k]) verify_and_free(mine[k]);
    return NULL;
}

static void test_threads(void)
{
    pthread_t t[NT];
    for (int i = 0; i < NT; i++) CHECK_EQ(pthread_create(&t[i], NULL, thread_main, (void *)(intptr_t)i), 0);
    for (int i = 0; i < NT; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < NT; i++) {
        uintptr_t p = atomic_exchange(&handoff[i], 0);
        if (p) verify_and_free((uint8_t *)p);
    }
    CHECK_EQ(atomic_load(&thread_bad), 0);
    check_empty();
}

int main(void)
{
    RUN(test_parse_size);
    RUN(test_sizes_in_children);
    RUN(test_init);
    RUN(test_fork_sees_later_tensors);      /* before any thread exists */
    RUN(test_contains_and_size);
    RUN(test_alignment_and_zero_fill);
    RUN(test_coalescing);
    RUN(test_pages_released);
    RUN(test_no_madvise_storm);
    RUN(test_small_frees_retained);
    RUN(test_bad_free);
    RUN(test_errors);
    RUN(test_churn);
    RUN(test_threads);
    return tu_finish();
}
