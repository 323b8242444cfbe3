/* The args-blob decoder runs in every child on bytes that came through
 * shared memory: feed it random and mutated blobs (each in a heap buffer of
 * exactly its length, so ASan reports any overread) and check that every
 * accepted view lies inside the buffer and describes it consistently.
 * spec/c/fuzz_blob.c is the same check as a libFuzzer target (PTO_FUZZ). */
#include <stdlib.h>
#include "testutil.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Decode buf[0..len) from an exact-size copy; check the view if accepted. 1 if accepted. */
static int check_one(const uint8_t *src, size_t len, int *bad)
{
    uint8_t *buf = malloc(len ? len : 1);
    if (len) memcpy(buf, src, len);
    pto_args_view v;
    int accepted = pto_blob_decode(buf, len, &v) == 0;
    if (accepted) {
        int32_t t, s;
        memcpy(&t, buf, 4);
        memcpy(&s, buf + 4, 4);
        const uint8_t *end = buf + len;
        bool ok = v.tensor_count == t && v.scalar_count == s && t >= 0 && s >= 0 &&
                  pto_blob_size(t, s) <= len && (const uint8_t *)v.tensors == buf + 8 &&
                  (const uint8_t *)(v.tensors + t) <= end && (const uint8_t *)(v.scalars + s) <= end &&
                  (const uint8_t *)v.scalars == (const uint8_t *)(v.tensors + t);
        if (!ok) (*bad)++;
        /* Touch every byte the view covers: ASan catches what the checks missed. */
        volatile uint64_t h = 0;
        for (int32_t i = 0; i < t; i++) h += v.tensors[i].base ^ v.tensors[i].shape[4];
        for (int32_t i = 0; i < s; i++) h += v.scalars[i];
        (void)h;
        /* Re-encoding the view gives back the bytes it was decoded from. */
        size_t need = pto_blob_size(t, s);
        uint8_t *again = malloc(need);
        if (pto_blob_encode(&v, again, need) != (int64_t)need || memcmp(again, buf, need) != 0) (*bad)++;
        free(again);
    }
    free(buf);
    return accepted;
}

static void test_random_blobs(void)
{
    enum { N = 100000, MAXLEN = 600 };
    static uint8_t b[MAXLEN];
    int bad = 0, accepted = 0;
    for (int it = 0; it < N; it++) {
        size_t len = next() % MAXLEN;
        for (size_t i = 0; i < len; i++) b[i] = (uint8_t)next();
        /* Mostly plausible headers, so that the interesting boundary is hit. */
        if (len >= 8 && (it & 3) != 0) {
            int32_t t = (int32_t)(next() % 16), s = (int32_t)(next() % 80);
            if ((it & 15) == 1) t = (int32_t)(uint32_t)next();
            if ((it & 15) == 2) s = (int32_t)(uint32_t)next();
            memcpy(b, &t, 4);
            memcpy(b + 4, &s, 4);
        }
        accepted += check_one(b, len, &bad);
    }
    CHECK_EQ(bad, 0);
    CHECK(accepted > N / 10);
    printf("  %d random blobs, %d accepted\n", N, accepted);
}

/* Valid blobs with a few bytes flipped, truncated or extended. */
static void test_mutated_blobs(void)
{
    enum { N = 100000 };
    static uint8_t b[8 + 40 * 20 + 8 * 40 + 64];
    int bad = 0, accepted = 0;
    for (int it = 0; it < N; it++) {
        int32_t t = (int32_t)(next() % 20), s = (int32_t)(next() % 40);
        pto_tensor ts[20];
        uint64_t ss[40];
        for (int i = 0; i < t; i++) {
            memset(&ts[i], 0, sizeof ts[i]);
            ts[i].base = next();
            ts[i].ndims = (uint8_t)(next() % 6);
        }
        for (int i = 0; i < s; i++) ss[i] = next();
        pto_args_view v = {t, s, ts, ss};
        int64_t n = pto_blob_encode(&v, b, sizeof b);
        if (n < 0) { bad++; continue; }
        size_t len = (size_t)n;
        int flips = (int)(next() % 4);
        for (int f = 0; f < flips; f++) b[next() % (len < 8 ? 8 : (len > 16 && (next() & 1) ? 8 : len))] ^= (uint8_t)(1u << (next() % 8));
        switch (next() % 4) {
        case 0: len = (size_t)(next() % (len + 1)); break;          /* truncated */
        case 1: len += next() % 64; break;                           /* trailing bytes */
        default: break;
        }
        accepted += check_one(b, len, &bad);
    }
    CHECK_EQ(bad, 0);
    printf("  %d mutated blobs, %d accepted\n", N, accepted);
}

int main(void)
{
    RUN(test_random_blobs);
    RUN(test_mutated_blobs);
    return tu_finish();
}
