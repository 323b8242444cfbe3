/*
 * test_blob.c - the args blob [i32 T][i32 S][40-byte tensor x T][u64 x S]:
 * layout, encode/decode round trip, and a decoder that rejects malformed
 * input without reading past the bytes it was given. Every decode reads from
 * a heap buffer of exactly len bytes, so ASan reports any overread.
 */
#include "testutil.h"

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void put_i32(uint8_t *p, int32_t v) { memcpy(p, &v, 4); }

static int32_t get_i32(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* A heap copy of exactly len bytes (at least one byte is allocated so that
 * len 0 still yields a valid pointer). */
static uint8_t *exact(const void *src, size_t len)
{
    uint8_t *p = malloc(len ? len : 1);
    if (!p) { fprintf(stderr, "out of memory\n"); exit(2); }
    if (len && src) memcpy(p, src, len);
    return p;
}

static pto_tensor sample_tensor(int k)
{
    pto_tensor t;
    memset(&t, 0, sizeof t);
    t.base = 0x1000000000ull * (uint64_t)(k + 1) + 0xABCDu;
    t.offset = 4096u * (uint64_t)k + 12;
    t.ndims = (uint8_t)(1 + k % PTO_MAX_DIMS);
    for (int d = 0; d < PTO_MAX_DIMS; d++) t.shape[d] = (uint32_t)(k * 10 + d + 1);
    t.dtype = (uint8_t)(k % PTO_DTYPE_COUNT);
    t.reserved = (uint16_t)(0xBEEF + k);
    return t;
}

/* Touch every byte the view points at: ASan reports it if outside the buffer. */
static uint64_t touch(const pto_args_view *v)
{
    uint64_t h = 0;
    const uint8_t *p = (const uint8_t *)v->tensors;
    for (size_t i = 0; i < sizeof(pto_tensor) * (size_t)v->tensor_count; i++) h = h * 31 + p[i];
    p = (const uint8_t *)v->scalars;
    for (size_t i = 0; i < 8 * (size_t)v->scalar_count; i++) h = h * 31 + p[i];
    return h;
}

static void test_tensor_layout(void)
{
    CHECK_EQ(sizeof(pto_tensor), 40);
    CHECK_EQ(offsetof(pto_tensor, base), 0);
    CHECK_EQ(offsetof(pto_tensor, offset), 8);
    CHECK_EQ(offsetof(pto_tensor, shape), 16);
    CHECK_EQ(offsetof(pto_tensor, dtype), 36);
    CHECK_EQ(offsetof(pto_tensor, ndims), 37);
    CHECK_EQ(offsetof(pto_tensor, reserved), 38);
    CHECK_EQ(pto_blob_size(0, 0), 8);
    CHECK_EQ(pto_blob_size(1, 0), 48);
    CHECK_EQ(pto_blob_size(0, 1), 16);
    CHECK_EQ(pto_blob_size(3, 5), 8 + 3 * 40 + 5 * 8);
}

static void round_trip(int32_t T, int32_t S)
{
    pto_tensor *ts = calloc((size_t)T + 1, sizeof *ts);
    uint64_t *ss = calloc((size_t)S + 1, sizeof *ss);
    for (int k = 0; k < T; k++) ts[k] = sample_tensor(k);
    for (int k = 0; k < S; k++) ss[k] = 0x0123456789ABCDEFull ^ ((uint64_t)k * 0x9E3779B97F4A7C15ull);
    pto_args_view in = {T, S, T ? ts : NULL, S ? ss : NULL};
    size_t need = pto_blob_size(T, S);
    CHECK_EQ(need, 8 + 40 * (size_t)T + 8 * (size_t)S);

    /* Too small a buffer: refused, nothing written past cap. */
    if (need > 0) {
        uint8_t *small = exact(NULL, need - 1);
        CHECK_EQ(pto_blob_encode(&in, small, need - 1), -1);
        free(small);
    }

    uint8_t *buf = exact(NULL, need);
    CHECK_EQ(pto_blob_encode(&in, buf, need), (int64_t)need);

    /* Layout: [i32 T][i32 S][tensor x T][u64 x S]. */
    CHECK_EQ(get_i32(buf), T);
    CHECK_EQ(get_i32(buf + 4), S);
    int bad = 0;
    for (int k = 0; k < T; k++) bad += memcmp(buf + 8 + 40 * (size_t)k, &ts[k], 40) != 0;
    for (int k = 0; k < S; k++) bad += memcmp(buf + 8 + 40 * (size_t)T + 8 * (size_t)k, &ss[k], 8) != 0;
    CHECK_EQ(bad, 0);

    pto_args_view out;
    memset(&out, 0xFF, sizeof out);
    CHECK_EQ(pto_blob_decode(buf, need, &out), 0);
    CHECK_EQ(out.tensor_count, T);
    CHECK_EQ(out.scalar_count, S);
    CHECK(out.tensors == (const pto_tensor *)(const void *)(buf + 8));   /* points into the blob */
    CHECK(out.scalars == (const uint64_t *)(const void *)(buf + 8 + 40 * (size_t)T));
    bad = 0;
    for (int k = 0; k < T; k++) bad += memcmp(&out.tensors[k], &ts[k], sizeof(pto_tensor)) != 0;
    for (int k = 0; k < S; k++) bad += out.scalars[k] != ss[k];
    CHECK_EQ(bad, 0);
    (void)touch(&out);

    /* Re-encoding the decoded view gives the same bytes. */
    uint8_t *again = exact(NULL, need);
    CHECK_EQ(pto_blob_encode(&out, again, need), (int64_t)need);
    CHECK(memcmp(buf, again, need) == 0);
    free(again);

    /* A larger cap still writes exactly need bytes. */
    uint8_t *big = exact(NULL, need + 64);
    memset(big, 0x5A, need + 64);
    CHECK_EQ(pto_blob_encode(&in, big, need + 64), (int64_t)need);
    int untouched = 1;
    for (size_t i = need; i < need + 64; i++) untouched &= big[i] == 0x5A;
    CHECK(untouched);
    free(big);

    free(buf);
    free(ts);
    free(ss);
}

static void test_round_trip(void)
{
    int32_t cases[][2] = {{0, 0}, {1, 0}, {0, 1}, {1, 1}, {3, 5}, {5, 3}, {16, 0}, {0, 16}, {17, 33}, {200, 100}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int before = tu_failures;
        round_trip(cases[i][0], cases[i][1]);
        if (tu_failures != before) fprintf(stderr, "  ... with T=%d S=%d\n", cases[i][0], cases[i][1]);
    }
    /* Negative counts cannot be encoded. */
    uint8_t buf[64];
    pto_args_view v = {-1, 0, NULL, NULL};
    CHECK_EQ(pto_blob_encode(&v, buf, sizeof buf), -1);
    v.tensor_count = 0;
    v.scalar_count = -1;
    CHECK_EQ(pto_blob_encode(&v, buf, sizeof buf), -1);
}

/* Decode a header (T, S) followed by `extra` bytes, from a buffer of exactly
 * 8 + extra bytes; returns decode's result and checks its view if it succeeded. */
static int decode_header(int32_t T, int32_t S, size_t extra)
{
    size_t len = 8 + extra;
    uint8_t *buf = exact(NULL, len);
    memset(buf, 0x33, len);
    put_i32(buf, T);
    put_i32(buf + 4, S);
    pto_args_view v;
    int rc = pto_blob_decode(buf, len, &v);
    if (rc == 0) {
        CHECK_EQ(v.tensor_count, T);
        CHECK_EQ(v.scalar_count, S);
        CHECK(8 + 40 * (uint64_t)T + 8 * (uint64_t)S <= len);
        (void)touch(&v);
    }
    free(buf);
    return rc;
}

static void test_decode_rejects_short(void)
{
    /* Fewer than 8 bytes: no header. */
    uint8_t hdr[8] = {0};
    for (size_t len = 0; len < 8; len++) {
        uint8_t *buf = exact(hdr, len);
        pto_args_view v;
        CHECK_EQ(pto_blob_decode(buf, len, &v), -1);
        free(buf);
    }
    pto_args_view v;
    CHECK_EQ(pto_blob_decode(NULL, 0, &v), -1);
    CHECK_EQ(pto_blob_decode(NULL, 100, &v), -1);
    /* Exactly the header: T=0, S=0 is valid. */
    CHECK_EQ(decode_header(0, 0, 0), 0);
}

static void test_decode_rejects_negative_counts(void)
{
    CHECK_EQ(decode_header(-1, 0, 64), -1);
    CHECK_EQ(decode_header(0, -1, 64), -1);
    CHECK_EQ(decode_header(-1, -1, 64), -1);
    CHECK_EQ(decode_header(INT32_MIN, 0, 64), -1);
    CHECK_EQ(decode_header(0, INT32_MIN, 64), -1);
    CHECK_EQ(decode_header(1, INT32_MIN, 64), -1);
    CHECK_EQ(decode_header(INT32_MIN, 1, 64), -1);
}

static void test_decode_rejects_sizes_beyond_len(void)
{
    /* One byte short of what the counts need is refused; exactly enough is accepted. */
    int32_t cases[][2] = {{1, 0}, {0, 1}, {1, 1}, {2, 3}, {10, 0}, {0, 10}, {7, 9}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int32_t T = cases[i][0], S = cases[i][1];
        size_t body = 40 * (size_t)T + 8 * (size_t)S;
        CHECK_EQ(decode_header(T, S, body - 1), -1);
        CHECK_EQ(decode_header(T, S, body), 0);
    }
    /* Every length between 0 and the needed one for a fixed header. */
    int bad = 0;
    for (size_t extra = 0; extra < 40 * 3 + 8 * 4; extra++) bad += decode_header(3, 4, extra) != -1;
    CHECK_EQ(bad, 0);
}

static void test_decode_rejects_huge_counts(void)
{
    /* Counts whose byte size would overflow a 32-bit (or careless 64-bit)
     * computation, with small and moderately large buffers. */
    int32_t huge[][2] = {
        {0x7fffffff, 0}, {0, 0x7fffffff}, {0x7fffffff, 0x7fffffff}, {0x7fffffff, 1}, {1, 0x7fffffff},
        {0x06666667, 0},  /* 40 * T wraps 32 bits to a small number */
        {0, 0x20000000},  /* 8 * S wraps 32 bits to 0 */
        {0x06666666, 0x00000002}, {0x40000000, 0x40000000},
    };
    size_t extras[] = {0, 40, 4096, 1 << 16};
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++)
        for (size_t e = 0; e < sizeof extras / sizeof extras[0]; e++) {
            int rc = decode_header(huge[i][0], huge[i][1], extras[e]);
            if (rc != -1)
                fprintf(stderr, "  decode accepted T=%d S=%d with %zu bytes\n", huge[i][0], huge[i][1],
                        8 + extras[e]);
            CHECK_EQ(rc, -1);
        }
}

static void test_decode_fuzz_never_overreads(void)
{
    /* Random headers over random lengths: decode never accepts counts that
     * do not fit (trailing bytes are not judged here), always accepts a blob
     * of exactly the size its counts need, and every byte an accepted view
     * points at lies inside the buffer. */
    uint64_t rng = 0x243F6A8885A308D3ull;
    int wrong = 0, accepted = 0;
    for (int it = 0; it < 20000; it++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        size_t len = (size_t)(rng >> 40) % 400;
        int32_t T, S;
        switch ((rng >> 20) & 3) {
        case 0: T = (int32_t)((rng >> 8) % 11); S = (int32_t)((rng >> 16) % 50); break;
        case 1: T = (int32_t)(uint32_t)(rng >> 3); S = (int32_t)((rng >> 16) % 5); break;
        case 2: T = (int32_t)((rng >> 8) % 5); S = (int32_t)(uint32_t)(rng >> 29); break;
        default: T = (int32_t)(uint32_t)(rng >> 7); S = (int32_t)(uint32_t)(rng >> 31); break;
        }
        uint8_t *buf = exact(NULL, len);
        memset(buf, (int)(rng & 0xFF), len);
        if (len >= 4) put_i32(buf, T);
        if (len >= 8) put_i32(buf + 4, S);
        pto_args_view v;
        int rc = pto_blob_decode(buf, len, &v);
        bool fits = len >= 8 && T >= 0 && S >= 0 && 8 + 40 * (uint64_t)T + 8 * (uint64_t)S <= len;
        bool exact_size = fits && 8 + 40 * (uint64_t)T + 8 * (uint64_t)S == len;
        if ((rc == 0 && !fits) || (exact_size && rc != 0)) wrong++;
        if (rc == 0) {
            accepted++;
            (void)touch(&v);
        }
        free(buf);
    }
    CHECK_EQ(wrong, 0);
    CHECK(accepted > 100);
}

int main(void)
{
    RUN(test_tensor_layout);
    RUN(test_round_trip);
    RUN(test_decode_rejects_short);
    RUN(test_decode_rejects_negative_counts);
    RUN(test_decode_rejects_sizes_beyond_len);
    RUN(test_decode_rejects_huge_counts);
    RUN(test_decode_fuzz_never_overreads);
    return tu_finish();
}
