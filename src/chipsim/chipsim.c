/*
 * libpto_chipsim.so - the built-in simulated chip runtime: kernels with the
 * pto_kernel_fn signature, run on the CPU by chip workers.
 *
 * This library never calls into libpto: it is dlopened into processes that
 * link libpto statically (its symbols are then not exported) and into forked
 * chip processes, so dtype sizes and element counts are computed here.
 * Kernels keep no state and may run concurrently on several chip workers.
 * No kernel calls another exported one: a host exporting a symbol of the
 * same name (ptolua links with -E) would interpose on it.
 *
 * block_dim > 1 splits gemm_tile and the element-wise kernels (vector_add,
 * vector_mul, tile_add, vector_scale) over that many threads of the chip
 * process, as the device splits a kernel over its cores: each thread takes a
 * band of rows (elements), computed exactly as the whole kernel computes
 * them, so the result is bit for bit the one of block_dim = 1.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include "pto.h"

const char *const pto_chip_kernels[] = {
    "vector_add", "vector_mul", "vector_scale", "fill", "copy", "gemm_tile",
    "tile_add", "reduce_sum", "sleep_us", "spin_us", "fail", "crash", "noop", "flag_set", "flag_wait",
    "bad_read_out", "bad_write_in", "bad_half_out", "bad_write_outside", "bad_random", NULL,
};

/* One definition of the ABI, so no kernel can drift from pto_kernel_fn. */
#define KERNEL(name) \
    int name(const pto_args_view *args, const pto_call_config *cfg __attribute__((unused)), char *err, size_t errlen)

static int fail_with(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail_with(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return 1;
}

static const char *const dtype_names[PTO_DTYPE_COUNT] = {
    "f32", "f16", "bf16", "f64", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "bool",
};
static const uint8_t dtype_sizes[PTO_DTYPE_COUNT] = {4, 2, 2, 8, 1, 2, 4, 8, 1, 2, 4, 8, 1};

static const char *dtype_name(unsigned dt) { return dt < PTO_DTYPE_COUNT ? dtype_names[dt] : "unknown"; }

static uint64_t numel(const pto_tensor *t)
{
    uint64_t n = 1;
    for (int i = 0; i < t->ndims; i++) n *= t->shape[i];
    return n;
}

static uint64_t nbytes(const pto_tensor *t) { return numel(t) * dtype_sizes[t->dtype]; }

static void *data(const pto_tensor *t) { return (void *)(uintptr_t)(t->base + t->offset); }

/* Checks the tensor count is lo..hi and every descriptor is sane, so the
 * kernels below may use dtype_sizes[] and numel() without further checks. */
static int check_args(const char *kernel, const pto_args_view *a, int lo, int hi, const char *usage, char *err,
                      size_t errlen)
{
    if (a->tensor_count < lo || a->tensor_count > hi)
        return fail_with(err, errlen, "%s: expects %s, got %d tensor%s", kernel, usage, a->tensor_count,
                         a->tensor_count == 1 ? "" : "s");
    for (int i = 0; i < a->tensor_count; i++) {
        const pto_tensor *t = &a->tensors[i];
        if (t->dtype >= PTO_DTYPE_COUNT || t->ndims > PTO_MAX_DIMS)
            return fail_with(err, errlen, "%s: tensor %d has dtype %u and %u dims; expects a pto_dtype and at most %d dims",
                             kernel, i, (unsigned)t->dtype, (unsigned)t->ndims, PTO_MAX_DIMS);
        if (!t->base && numel(t))
            return fail_with(err, errlen, "%s: tensor %d has no storage (base 0)", kernel, i);
    }
    return 0;
}

static int need_scalar(const char *kernel, const pto_args_view *a, const char *what, char *err, size_t errlen)
{
    if (a->scalar_count >= 1) return 0;
    return fail_with(err, errlen, "%s: expects scalar 0 = %s, got no scalars", kernel, what);
}

/* Scalar 0 read as a double. Lua passes the integer 2 as the bits 0x2, a
 * denormal nobody means (and -2 as a NaN), so bits that read as a small
 * integer are refused rather than silently used. */
static int scalar_double(const char *kernel, const pto_args_view *a, const char *what, double *out, char *err,
                         size_t errlen)
{
    if (a->scalar_count < 1)
        return fail_with(err, errlen, "%s: expects scalar 0 = %s (IEEE double bits), got no scalars", kernel, what);
    int64_t i;
    memcpy(&i, &a->scalars[0], sizeof i);
    if (i != 0 && i >= -(INT64_C(1) << 31) && i <= INT64_C(1) << 31)
        return fail_with(err, errlen, "%s: scalar 0 holds the integer %lld, not a double; pass %s as IEEE double "
                         "bits (in Lua a float: %lld.0)", kernel, (long long)i, what, (long long)i);
    memcpy(out, &a->scalars[0], sizeof *out);
    return 0;
}

/* Scalar 0 as microseconds; a float passed by mistake reads as ~1e18. */
static int scalar_us(const char *kernel, const pto_args_view *a, uint64_t *us, char *err, size_t errlen)
{
    if (need_scalar(kernel, a, "microseconds (integer)", err, errlen)) return 1;
    *us = a->scalars[0];
    if (*us > UINT64_C(3600000000))
        return fail_with(err, errlen, "%s: scalar 0 is %llu us, over an hour; pass an integer number of "
                         "microseconds (in Lua 100, not 100.0)", kernel, (unsigned long long)*us);
    return 0;
}

/* The same element count and one dtype among `allowed` for tensors t[0..n). */
static int check_same(const char *kernel, const pto_tensor *t, int n, const char *names[], unsigned allowed,
                      const char *allowed_names, char *err, size_t errlen)
{
    for (int i = 1; i < n; i++) {
        if (t[i].dtype != t[0].dtype)
            return fail_with(err, errlen, "%s: %s is %s but %s is %s; all tensors must have one dtype", kernel,
                             names[0], dtype_name(t[0].dtype), names[i], dtype_name(t[i].dtype));
        if (numel(&t[i]) != numel(&t[0]))
            return fail_with(err, errlen, "%s: %s has %llu elements but %s has %llu; they must match", kernel,
                             names[0], (unsigned long long)numel(&t[0]), names[i], (unsigned long long)numel(&t[i]));
    }
    if (!(allowed >> t[0].dtype & 1))
        return fail_with(err, errlen, "%s: dtype %s is not supported; expects %s", kernel, dtype_name(t[0].dtype),
                         allowed_names);
    return 0;
}

#define F32_F64_I32 (1u << PTO_F32 | 1u << PTO_F64 | 1u << PTO_I32)
#define F32_F64 (1u << PTO_F32 | 1u << PTO_F64)

/* ---- block_dim: a kernel split over threads ---- */

#define BLOCK_DIM_MAX 64

/* One band [lo, hi) of a split kernel. */
typedef void (*band_fn)(void *ctx, uint64_t lo, uint64_t hi);

typedef struct band {
    band_fn fn;
    void *ctx;
    uint64_t lo, hi;
} band;

static void *band_main(void *arg)
{
    band *b = arg;
    b->fn(b->ctx, b->lo, b->hi);
    return NULL;
}

/* Run fn over [0, n) in at most block_dim bands whose bounds are multiples of grain (but the last), one per
 * thread, the caller taking the first. A thread that cannot start leaves its band to the caller. */
static void split(const pto_call_config *cfg, uint64_t n, uint64_t grain, band_fn fn, void *ctx)
{
    int32_t parts = cfg && cfg->block_dim > 1 ? cfg->block_dim : 1;
    if (parts > BLOCK_DIM_MAX) parts = BLOCK_DIM_MAX;
    uint64_t units = (n + grain - 1) / grain;
    if ((uint64_t)parts > units) parts = (int32_t)(units ? units : 1);
    if (parts <= 1) {
        fn(ctx, 0, n);
        return;
    }
    band b[BLOCK_DIM_MAX];
    pthread_t th[BLOCK_DIM_MAX];
    int started[BLOCK_DIM_MAX] = {0};
    for (int32_t p = 0; p < parts; p++) {
        uint64_t lo = units * (uint64_t)p / (uint64_t)parts * grain;
        uint64_t hi = units * (uint64_t)(p + 1) / (uint64_t)parts * grain;
        b[p] = (band){fn, ctx, lo < n ? lo : n, hi < n ? hi : n};
        if (p > 0) started[p] = pthread_create(&th[p], NULL, band_main, &b[p]) == 0;
    }
    fn(ctx, b[0].lo, b[0].hi);
    for (int32_t p = 1; p < parts; p++) {
        if (started[p]) pthread_join(th[p], NULL);
        else fn(ctx, b[p].lo, b[p].hi);
    }
}

/* No restrict: c may be a or b (tile_add accumulates in place). i32 goes
 * through uint32_t so overflow wraps instead of being undefined. */
#define BINARY_LOOP(T, OP)                                              \
    do {                                                                \
        const T *x = data(a), *y = data(b);                             \
        T *z = data(c);                                                 \
        for (uint64_t i = lo; i < hi; i++) z[i] = (T)(x[i] OP y[i]);    \
    } while (0)

#define BINARY_DTYPES(OP)                                               \
    switch (a->dtype) {                                                 \
    case PTO_F32: BINARY_LOOP(float, OP); break;                        \
    case PTO_F64: BINARY_LOOP(double, OP); break;                       \
    default: BINARY_LOOP(uint32_t, OP); break;                          \
    }

typedef struct binary_job {
    const pto_tensor *a, *b, *c;
    int mul;
} binary_job;

#define BINARY_BAND_BODY                                                \
    const binary_job *j = ctx;                                          \
    const pto_tensor *a = j->a, *b = j->b, *c = j->c;                   \
    if (j->mul) BINARY_DTYPES(*)                                        \
    else BINARY_DTYPES(+)

static void binary_band_base(void *ctx, uint64_t lo, uint64_t hi) { BINARY_BAND_BODY }

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define HAVE_BINARY_AVX2 1
/* The same loops in 32-byte vectors instead of the baseline's 16: a BGEMM
 * runs a tile_add per gemm_tile, and its add in SSE2 took 10% as long as
 * the gemm, in AVX2 6% (docs/kernels.md). */
__attribute__((target("arch=x86-64-v3"))) static void binary_band_avx2(void *ctx, uint64_t lo, uint64_t hi)
{
    BINARY_BAND_BODY
}
#endif

static void binary_band(void *ctx, uint64_t lo, uint64_t hi)
{
#ifdef HAVE_BINARY_AVX2
    if (__builtin_cpu_supports("avx2")) {
        binary_band_avx2(ctx, lo, hi);
        return;
    }
#endif
    binary_band_base(ctx, lo, hi);
}

static int binary(const char *kernel, int mul, const pto_tensor *a, const pto_tensor *b, const pto_tensor *c,
                  const char *names[], const pto_call_config *cfg, char *err, size_t errlen)
{
    const pto_tensor t[3] = {*a, *b, *c};
    if (check_same(kernel, t, 3, names, F32_F64_I32, "f32, f64 or i32", err, errlen)) return 1;
    binary_job j = {a, b, c, mul};
    split(cfg, numel(a), 4096, binary_band, &j);
    return 0;
}

static const char *abc_names[] = {"a", "b", "c"};

KERNEL(vector_add)
{
    if (check_args("vector_add", args, 3, 3, "3 tensors (a IN, b IN, c OUT)", err, errlen)) return 1;
    const pto_tensor *t = args->tensors;
    return binary("vector_add", 0, &t[0], &t[1], &t[2], abc_names, cfg, err, errlen);
}

KERNEL(vector_mul)
{
    if (check_args("vector_mul", args, 3, 3, "3 tensors (a IN, b IN, c OUT)", err, errlen)) return 1;
    const pto_tensor *t = args->tensors;
    return binary("vector_mul", 1, &t[0], &t[1], &t[2], abc_names, cfg, err, errlen);
}

KERNEL(tile_add)
{
    static const char *acc_names[] = {"acc", "b", "acc"};
    const char *usage = "3 tensors (a IN, b IN, c OUT) or 2 (acc INOUT, b IN)";
    if (check_args("tile_add", args, 2, 3, usage, err, errlen)) return 1;
    const pto_tensor *t = args->tensors;
    if (args->tensor_count == 2) return binary("tile_add", 0, &t[0], &t[1], &t[0], acc_names, cfg, err, errlen);
    return binary("tile_add", 0, &t[0], &t[1], &t[2], abc_names, cfg, err, errlen);
}

typedef struct scale_job {
    const pto_tensor *a, *c;
    double f;
} scale_job;

static void scale_band(void *ctx, uint64_t lo, uint64_t hi)
{
    const scale_job *j = ctx;
    if (j->a->dtype == PTO_F32) {
        const float *x = data(j->a);
        float *z = data(j->c), ff = (float)j->f;
        for (uint64_t i = lo; i < hi; i++) z[i] = x[i] * ff;
    } else {
        const double *x = data(j->a);
        double *z = data(j->c);
        for (uint64_t i = lo; i < hi; i++) z[i] = x[i] * j->f;
    }
}

KERNEL(vector_scale)
{
    static const char *names[] = {"a", "c"};
    double f;
    if (check_args("vector_scale", args, 2, 2, "2 tensors (a IN, c OUT)", err, errlen) ||
        scalar_double("vector_scale", args, "the factor", &f, err, errlen) ||
        check_same("vector_scale", args->tensors, 2, names, F32_F64, "f32 or f64", err, errlen))
        return 1;
    scale_job j = {&args->tensors[0], &args->tensors[1], f};
    split(cfg, numel(&args->tensors[0]), 4096, scale_band, &j);
    return 0;
}

KERNEL(fill)
{
    double v;
    if (check_args("fill", args, 1, 1, "1 tensor (t OUT)", err, errlen) ||
        scalar_double("fill", args, "the value", &v, err, errlen))
        return 1;
    const pto_tensor *t = &args->tensors[0];
    uint64_t n = numel(t);
    if (t->dtype == PTO_F32) {
        float *p = data(t), fv = (float)v;
        for (uint64_t i = 0; i < n; i++) p[i] = fv;
    } else if (t->dtype == PTO_F64) {
        double *p = data(t);
        for (uint64_t i = 0; i < n; i++) p[i] = v;
    } else if (t->dtype == PTO_I32) {
        /* range first: converting an out-of-range double is undefined */
        if (!(v >= INT32_MIN && v <= INT32_MAX) || v != (double)(int32_t)v)
            return fail_with(err, errlen, "fill: value %g does not fit an i32 tensor; expects a whole number in "
                             "[-2147483648, 2147483647]", v);
        int32_t *p = data(t), iv = (int32_t)v;
        for (uint64_t i = 0; i < n; i++) p[i] = iv;
    } else {
        return fail_with(err, errlen, "fill: dtype %s is not supported; expects f32, f64 or i32", dtype_name(t->dtype));
    }
    return 0;
}

KERNEL(copy)
{
    if (check_args("copy", args, 2, 2, "2 tensors (src IN, dst OUT)", err, errlen)) return 1;
    const pto_tensor *s = &args->tensors[0], *d = &args->tensors[1];
    if (nbytes(s) != nbytes(d))
        return fail_with(err, errlen, "copy: src has %llu bytes but dst has %llu; they must match (dtypes may differ)",
                         (unsigned long long)nbytes(s), (unsigned long long)nbytes(d));
    if (nbytes(s)) memmove(data(d), data(s), nbytes(s));
    return 0;
}

/* ---- gemm_tile ----
 * C[M,N] (+)= A[M,K] * B[K,N], f32, row-major. */

/* Rows i0..i1, columns j0..j1 over all of K, i-k-j with A[i,k] broadcast:
 * the loop GCC auto-vectorizes. It is the whole product where the AVX2 core
 * below is not available, and the edges the core does not cover. Always
 * inlined, so inside the core's function it is compiled for AVX2 too. */
static inline __attribute__((always_inline)) void gemm_ikj(uint32_t N, uint32_t K, const float *restrict A,
                                                           const float *restrict B, float *restrict C, int accum,
                                                           uint32_t i0, uint32_t i1, uint32_t j0, uint32_t j1)
{
    for (uint32_t i = i0; i < i1; i++) {
        float *restrict c = C + (size_t)i * N;
        if (!accum)
            for (uint32_t j = j0; j < j1; j++) c[j] = 0.0f;
        for (uint32_t k = 0; k < K; k++) {
            float a = A[(size_t)i * K + k];
            const float *restrict b = B + (size_t)k * N;
            for (uint32_t j = j0; j < j1; j++) c[j] += a * b[j];
        }
    }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define HAVE_GEMM_AVX2 1

/* The i-k-j loop loads and stores C for every FMA, which caps it at about
 * half the FMA units' rate. This core keeps a 6x16 block of C in 12 ymm
 * registers across a k-panel, so an FMA costs one broadcast of A and no C
 * traffic: about 2x on 64..256 tiles. GCC's vector types name the registers;
 * the function is compiled for AVX2+FMA only (without AVX the same code
 * spills, so other CPUs take the i-k-j loop instead of a clone of this). */
enum { MR = 6, NR = 16, KC = 256 };   /* KC: a 16-column B panel of KC rows stays in L1 */

typedef float v8f __attribute__((vector_size(32)));

__attribute__((target("arch=x86-64-v3"))) static void gemm_avx2(uint32_t M, uint32_t N, uint32_t K,
                                                                 const float *restrict A, const float *restrict B,
                                                                 float *restrict C, int accum)
{
    const uint32_t Mc = M - M % MR, Nc = N - N % NR;
    const size_t vb = sizeof(v8f);
    for (uint32_t k0 = 0; k0 == 0 || k0 < K; k0 += KC) {   /* once at least: K = 0 still sets C */
        uint32_t k1 = K - k0 < KC ? K : k0 + KC;
        int load = accum || k0 > 0;
        for (uint32_t j = 0; j < Nc; j += NR) {
            for (uint32_t i = 0; i < Mc; i += MR) {
                v8f c[MR][2];
                for (int r = 0; r < MR; r++) {
                    if (load) {
                        memcpy(&c[r][0], C + (size_t)(i + r) * N + j, vb);
                        memcpy(&c[r][1], C + (size_t)(i + r) * N + j + 8, vb);
                    } else {
                        c[r][0] = c[r][1] = (v8f){0};
                    }
                }
                const float *a = A + (size_t)i * K;
                for (uint32_t k = k0; k < k1; k++) {
                    v8f b0, b1;
                    memcpy(&b0, B + (size_t)k * N + j, vb);
                    memcpy(&b1, B + (size_t)k * N + j + 8, vb);
                    for (int r = 0; r < MR; r++) {
                        float x = a[(size_t)r * K + k];
                        c[r][0] += x * b0;
                        c[r][1] += x * b1;
                    }
                }
                for (int r = 0; r < MR; r++) {
                    memcpy(C + (size_t)(i + r) * N + j, &c[r][0], vb);
                    memcpy(C + (size_t)(i + r) * N + j + 8, &c[r][1], vb);
                }
            }
        }
    }
    if (Nc < N) gemm_ikj(N, K, A, B, C, accum, 0, Mc, Nc, N);
    if (Mc < M) gemm_ikj(N, K, A, B, C, accum, Mc, M, 0, N);
}
#endif

static void gemm_f32(uint32_t M, uint32_t N, uint32_t K, const float *A, const float *B, float *C, int accum)
{
#ifdef HAVE_GEMM_AVX2
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        gemm_avx2(M, N, K, A, B, C, accum);
        return;
    }
#endif
    gemm_ikj(N, K, A, B, C, accum, 0, M, 0, N);
}

typedef struct gemm_job {
    uint32_t N, K;
    const float *A, *B;
    float *C;
    int accum;
} gemm_job;

static void gemm_band(void *ctx, uint64_t lo, uint64_t hi)
{
    const gemm_job *j = ctx;
    gemm_f32((uint32_t)(hi - lo), j->N, j->K, j->A + lo * j->K, j->B, j->C + lo * j->N, j->accum);
}

static int overlaps(const pto_tensor *x, const pto_tensor *y)
{
    uint64_t xs = x->base + x->offset, ys = y->base + y->offset;
    return xs < ys + nbytes(y) && ys < xs + nbytes(x);
}

KERNEL(gemm_tile)
{
    if (check_args("gemm_tile", args, 3, 3, "3 tensors (A IN [M,K], B IN [K,N], C OUT [M,N])", err, errlen)) return 1;
    const pto_tensor *A = &args->tensors[0], *B = &args->tensors[1], *C = &args->tensors[2];
    const char *names = "ABC";
    for (int i = 0; i < 3; i++) {
        const pto_tensor *t = &args->tensors[i];
        if (t->dtype != PTO_F32)
            return fail_with(err, errlen, "gemm_tile: %c is %s; expects f32", names[i], dtype_name(t->dtype));
        if (t->ndims != 2)
            return fail_with(err, errlen, "gemm_tile: %c has %u dims; expects 2 (row-major [rows, cols])", names[i],
                             (unsigned)t->ndims);
    }
    uint32_t M = A->shape[0], K = A->shape[1], N = B->shape[1];
    if (B->shape[0] != K)
        return fail_with(err, errlen, "gemm_tile: A is [%u,%u] but B is [%u,%u]; B must have %u rows (A's columns)",
                         M, K, B->shape[0], N, K);
    if (C->shape[0] != M || C->shape[1] != N)
        return fail_with(err, errlen, "gemm_tile: C is [%u,%u]; expects [%u,%u] for A [%u,%u] * B [%u,%u]",
                         C->shape[0], C->shape[1], M, N, M, K, K, N);
    uint64_t mode = args->scalar_count >= 1 ? args->scalars[0] : 0;
    if (mode > 1)
        return fail_with(err, errlen, "gemm_tile: scalar 0 is %llu; expects the integer 0 (C = A*B) or 1 (C += A*B)",
                         (unsigned long long)mode);
    if (overlaps(C, A) || overlaps(C, B))
        return fail_with(err, errlen, "gemm_tile: C overlaps A or B; C must be a separate buffer");
    gemm_job j = {N, K, data(A), data(B), data(C), (int)mode};
    /* Bands of whole 6-row blocks (MR): every row takes the path, and so the rounding, it takes unsplit. */
    if (M && N) split(cfg, M, 6, gemm_band, &j);
    return 0;
}

KERNEL(reduce_sum)
{
    if (check_args("reduce_sum", args, 2, 2, "2 tensors (x IN, out OUT with 1 element)", err, errlen)) return 1;
    const pto_tensor *x = &args->tensors[0], *out = &args->tensors[1];
    if (numel(out) != 1)
        return fail_with(err, errlen, "reduce_sum: out has %llu elements; expects 1",
                         (unsigned long long)numel(out));
    if (out->dtype != PTO_F32 && out->dtype != PTO_F64)
        return fail_with(err, errlen, "reduce_sum: out is %s; expects f32 or f64", dtype_name(out->dtype));
    uint64_t n = numel(x);
    double s = 0;
    if (x->dtype == PTO_F32) {
        const float *p = data(x);
        for (uint64_t i = 0; i < n; i++) s += p[i];
    } else if (x->dtype == PTO_F64) {
        const double *p = data(x);
        for (uint64_t i = 0; i < n; i++) s += p[i];
    } else if (x->dtype == PTO_I32) {
        const int32_t *p = data(x);
        for (uint64_t i = 0; i < n; i++) s += p[i];
    } else {
        return fail_with(err, errlen, "reduce_sum: x is %s; expects f32, f64 or i32", dtype_name(x->dtype));
    }
    if (out->dtype == PTO_F32) *(float *)data(out) = (float)s;
    else *(double *)data(out) = s;
    return 0;
}

/* sleep_us and spin_us take any tensors and ignore them, so scheduling
 * benchmarks can give them dependencies. */
KERNEL(sleep_us)
{
    uint64_t us;
    if (scalar_us("sleep_us", args, &us, err, errlen)) return 1;
    struct timespec ts = {.tv_sec = (time_t)(us / 1000000), .tv_nsec = (long)(us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }   /* a signal: sleep the rest */
    return 0;
}

KERNEL(spin_us)
{
    uint64_t us;
    if (scalar_us("spin_us", args, &us, err, errlen)) return 1;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t start = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec, now = start;
    uint64_t ns = us * 1000u;
    while (now - start < ns) {
        clock_gettime(CLOCK_MONOTONIC, &ts);
        now = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    }
    return 0;
}

KERNEL(fail)
{
    if (args->scalar_count >= 1)
        return fail_with(err, errlen, "fail kernel called with code %lld", (long long)(int64_t)args->scalars[0]);
    return fail_with(err, errlen, "fail kernel called");
}

/* Dies the way a broken kernel does, for failure tests: scalar 0 picks how
 * (0 or none: a SIGSEGV from a null write, 1: abort(), 2: _exit(3)). In
 * PROCESS mode only the chip's child dies; in THREAD mode it takes the
 * whole process with it, as a real crash would. */
KERNEL(crash)
{
    (void)err, (void)errlen;
    int64_t how = args->scalar_count >= 1 ? (int64_t)args->scalars[0] : 0;
    if (how == 1) abort();
    if (how == 2) _exit(3);
    raise(SIGSEGV);
    return 1;
}

/* Does nothing: the engine's own per-task cost, for benchmarks. */
KERNEL(noop)
{
    (void)args, (void)err, (void)errlen;
    return 0;
}

/* flag_set and flag_wait: a handshake between two tasks through element 0 of an
 * i32 tensor (typically tagged NO_DEP on both, so neither orders the
 * other), to show that two tasks run at the same time: flag_wait fails, after
 * its timeout, if the signal can come only after it ends. */
static int flag_args(const char *kernel, const pto_args_view *args, int nscalars, const char *usage, char *err,
                     size_t errlen)
{
    if (check_args(kernel, args, 1, 1, "1 tensor (t, i32)", err, errlen)) return 1;
    if (args->tensors[0].dtype != PTO_I32 || numel(&args->tensors[0]) < 1)
        return fail_with(err, errlen, "%s: t is %s with %llu elements; expects i32 with at least 1", kernel,
                         dtype_name(args->tensors[0].dtype), (unsigned long long)numel(&args->tensors[0]));
    if (args->scalar_count < nscalars)
        return fail_with(err, errlen, "%s: expects %s, got %d scalar%s", kernel, usage, args->scalar_count,
                         args->scalar_count == 1 ? "" : "s");
    return 0;
}

KERNEL(flag_set)
{
    if (flag_args("flag_set", args, 1, "scalar 0: the value (integer)", err, errlen)) return 1;
    __atomic_store_n((int32_t *)data(&args->tensors[0]), (int32_t)args->scalars[0], __ATOMIC_RELEASE);
    return 0;
}

KERNEL(flag_wait)
{
    if (flag_args("flag_wait", args, 1, "scalar 0: the value (integer), optional 1: timeout in ms", err, errlen)) return 1;
    int32_t want = (int32_t)args->scalars[0];
    uint64_t ms = args->scalar_count >= 2 ? args->scalars[1] : 10000;
    if (ms > UINT64_C(3600000))
        return fail_with(err, errlen, "flag_wait: scalar 1 is %llu ms, over an hour; pass an integer timeout in ms",
                         (unsigned long long)ms);
    const int32_t *p = data(&args->tensors[0]);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t start = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000, now = start;
    int32_t seen;
    while ((seen = __atomic_load_n(p, __ATOMIC_ACQUIRE)) != want) {
        if (now - start >= ms)
            return fail_with(err, errlen, "flag_wait: element 1 of t was still %d after %llu ms of waiting for %d (did the "
                             "task that signals it run at the same time?)", (int)seen, (unsigned long long)ms,
                             (int)want);
        struct timespec nap = {0, 100000};
        nanosleep(&nap, NULL);
        clock_gettime(CLOCK_MONOTONIC, &ts);
        now = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
    }
    return 0;
}

/* ---- misbehaving kernels, for check mode's tests (docs/check.md) ----
 * Each takes (a IN, c OUT), f32 of one size, and copies a into c, except
 * for the one thing its name says it gets wrong. */

static int bad_args(const char *kernel, const pto_args_view *args, char *err, size_t errlen)
{
    static const char *names[] = {"a", "c"};
    return check_args(kernel, args, 2, 2, "2 tensors (a IN, c OUT)", err, errlen) ||
           check_same(kernel, args->tensors, 2, names, 1u << PTO_F32, "f32", err, errlen);
}

/* c += a: reads its OUTPUT. */
KERNEL(bad_read_out)
{
    if (bad_args("bad_read_out", args, err, errlen)) return 1;
    const float *a = data(&args->tensors[0]);
    float *c = data(&args->tensors[1]);
    for (uint64_t i = 0, n = numel(&args->tensors[0]); i < n; i++) c[i] += a[i];
    return 0;
}

/* c = a, then a[0] += 1: writes its INPUT. */
KERNEL(bad_write_in)
{
    if (bad_args("bad_write_in", args, err, errlen)) return 1;
    float *a = data(&args->tensors[0]), *c = data(&args->tensors[1]);
    uint64_t n = numel(&args->tensors[0]);
    memcpy(c, a, n * sizeof *a);
    if (n) a[0] += 1;
    return 0;
}

/* c[0 .. n/2) = a: leaves half its OUTPUT unwritten. */
KERNEL(bad_half_out)
{
    if (bad_args("bad_half_out", args, err, errlen)) return 1;
    const float *a = data(&args->tensors[0]);
    float *c = data(&args->tensors[1]);
    memcpy(c, a, numel(&args->tensors[0]) / 2 * sizeof *a);
    return 0;
}

/* c = a, then 42 into the f32 at the address in scalar 0 (a tensor's `address`): writes outside its
 * arguments. */
KERNEL(bad_write_outside)
{
    if (bad_args("bad_write_outside", args, err, errlen) ||
        need_scalar("bad_write_outside", args, "the address of an f32 to write", err, errlen))
        return 1;
    const float *a = data(&args->tensors[0]);
    float *c = data(&args->tensors[1]);
    memcpy(c, a, numel(&args->tensors[0]) * sizeof *a);
    *(volatile float *)(uintptr_t)args->scalars[0] = 42.0f;
    return 0;
}

/* c = a + (times this process ran it): not a function of its inputs. */
KERNEL(bad_random)
{
    static _Atomic unsigned calls;
    if (bad_args("bad_random", args, err, errlen)) return 1;
    const float *a = data(&args->tensors[0]);
    float *c = data(&args->tensors[1]);
    float k = (float)(atomic_fetch_add(&calls, 1) + 1);
    for (uint64_t i = 0, n = numel(&args->tensors[0]); i < n; i++) c[i] = a[i] + k;
    return 0;
}
