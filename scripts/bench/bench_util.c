/* bench_util.c - helpers shared by the pto_bench translation units. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void *bench_slots(size_t n)
{
    size_t bytes = (n ? n : 1) * BENCH_SLOT_BYTES;
    void *p = aligned_alloc(BENCH_SLOT_BYTES, bytes);
    if (!p) {
        fprintf(stderr, "pto_bench: out of memory (%zu bytes)\n", bytes);
        abort();
    }
    memset(p, 0, bytes); /* fault the pages in before any timing */
    return p;
}

double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One out-of-line copy that every task, reference and calibration runs.
 * The link-time optimizer inlined the loop into each caller, and the
 * copies' alignment differed: on the Intel Xeon VM of 2026-12-02 (stop 47)
 * the copy inlined into ptolua's leaf had its jne straddle a 32-byte
 * boundary (Intel's jump-erratum mitigation sends such loops down the
 * legacy decoder) and ran at half the speed of the plain threads' copy,
 * so ptolua read ~50% efficient even at 512 us tasks. noipa keeps gcc
 * from inlining, cloning or specializing it, with or without LTO. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((noipa))
#else
__attribute__((noinline))
#endif
void bench_spin(uint64_t iters)
{
    for (uint64_t i = 0; i < iters; i++)
        __asm__ __volatile__("" ::: "memory");
}

double bench_spin_calibrate(void)
{
    /* Best of a few runs of ~20 ms: a descheduled run only looks slower. */
    const uint64_t iters = 20000000;
    /* bench_spin's noipa makes this call the tasks' very loop: without it
     * gcc -O3 timed a constant-propagated copy (sub; jne) that ran at 0.27
     * ns an iteration on the Intel Xeon VM of 2026-12-02 (stop 44), where
     * the tasks' loop ran at 0.14, and every METG duration printed was
     * twice the tasks' real length. */
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = bench_now();
        bench_spin(iters);
        double t = bench_now() - t0;
        if (t < best)
            best = t;
    }
    return best * 1e9 / (double)iters;
}
