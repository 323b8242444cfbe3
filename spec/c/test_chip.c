/* The chip-kernel table (chip.c) and the built-in runtime's kernels
 * (chipsim.c): results against plain references, every error message,
 * registration, and BGEMM end to end through a THREAD-mode Worker. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include "chip.h"
#include "common.h"
#include "testutil.h"

static char kerr[1024];

static uint64_t dbits(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

static pto_tensor ten(void *p, int dtype, int ndims, uint32_t d0, uint32_t d1)
{
    pto_tensor t = {.base = (uint64_t)(uintptr_t)p, .dtype = (uint8_t)dtype, .ndims = (uint8_t)ndims};
    t.shape[0] = d0;
    t.shape[1] = d1;
    return t;
}
#define T1(p, dt, n) ten((p), (dt), 1, (n), 0)
#define T2(p, dt, r, c) ten((p), (dt), 2, (r), (c))

static int64_t id_of(const char *symbol)
{
    int64_t id = pto_kernel_register(NULL, symbol);
    if (id < 0) {
        fprintf(stderr, "register %s: %s\n", symbol, pto_errmsg());
        exit(2);
    }
    return id;
}

/* Run a built-in kernel directly; its message (if any) lands in kerr. */
static int call(const char *symbol, int nt, const pto_tensor *t, int ns, const uint64_t *s)
{
    pto_args_view v = {nt, ns, t, s};
    kerr[0] = 0;
    return pto_kernel_lookup((uint64_t)id_of(symbol))(&v, NULL, kerr, sizeof kerr);
}

static float *falloc(size_t n) { return aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64); }

static float frand(void) { return (float)(rand() % 2001 - 1000) / 1000.0f; }

static bool close_rel(double got, double want, double tol) { return fabs(got - want) <= tol * (1.0 + fabs(want)); }

/* ---- the table ---- */

/* Runs first, in a child, because the path is looked up once per process. */
static void test_chip_runtime_env(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        setenv("PTO_CHIP_RUNTIME", "/nonexistent/libchip.so", 1);
        int ok = strcmp(pto_chipsim_path(), "/nonexistent/libchip.so") == 0 &&
                 pto_kernel_register(NULL, "vector_add") == -1 &&
                 strstr(pto_errmsg(), "cannot load the built-in chip runtime /nonexistent/libchip.so") &&
                 strstr(pto_errmsg(), "$PTO_CHIP_RUNTIME");
        if (!ok) fprintf(stderr, "child: path %s, error %s\n", pto_chipsim_path(), pto_errmsg());
        _exit(ok ? 0 : 1);
    }
    int st = -1;
    CHECK_EQ(waitpid(pid, &st, 0), pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void test_chipsim_path(void)
{
    const char *p = pto_chipsim_path();
    CHECK(p != NULL);
    CHECK_CONTAINS(p, "/libpto_chipsim.so");
    CHECK(p && p[0] == '/');
    CHECK(p && access(p, R_OK) == 0);
    CHECK(pto_chipsim_path() == p);   /* cached */
}

static void test_register_idempotent(void)
{
    int64_t a = pto_kernel_register(NULL, "vector_add");
    CHECK(a >= 0);
    CHECK_EQ(pto_kernel_register(NULL, "vector_add"), a);
    CHECK_EQ(pto_kernel_register(pto_chipsim_path(), "vector_add"), a);   /* NULL is that same library */
    int64_t b = pto_kernel_register(NULL, "vector_mul");
    CHECK(b >= 0 && b != a);
    CHECK(pto_kernel_lookup((uint64_t)a) != NULL);
    CHECK(pto_kernel_lookup((uint64_t)a) != pto_kernel_lookup((uint64_t)b));
    CHECK(pto_kernel_lookup(pto_kernel_count()) == NULL);
    CHECK(pto_kernel_lookup(UINT64_MAX) == NULL);

    const char *lib = NULL, *sym = NULL;
    CHECK_EQ(pto_kernel_describe((uint64_t)b, &lib, &sym), 0);
    CHECK(lib && strcmp(lib, pto_chipsim_path()) == 0);
    CHECK(sym && strcmp(sym, "vector_mul") == 0);
    CHECK_EQ(pto_kernel_describe(pto_kernel_count(), &lib, &sym), -1);
}

static void test_register_errors(void)
{
    CHECK_EQ(pto_kernel_register(NULL, "no_such_kernel"), -1);
    CHECK_CONTAINS(pto_errmsg(), "no kernel 'no_such_kernel' in ");
    CHECK_CONTAINS(pto_errmsg(), "libpto_chipsim.so; it has: vector_add, vector_mul, vector_scale, fill, copy, "
                                 "gemm_tile, tile_add, reduce_sum, sleep_us, spin_us, fail");

    CHECK_EQ(pto_kernel_register(NULL, NULL), -1);
    CHECK_CONTAINS(pto_errmsg(), "symbol is missing; name the kernel function");
    CHECK_EQ(pto_kernel_register(NULL, ""), -1);
    CHECK_CONTAINS(pto_errmsg(), "symbol is empty");

    CHECK_EQ(pto_kernel_register("/nonexistent/libmine.so", "k"), -1);
    CHECK_CONTAINS(pto_errmsg(), "cannot load chip runtime /nonexistent/libmine.so (");
    CHECK_CONTAINS(pto_errmsg(), "check the `lib` path (or the Worker's chip_runtime)");

    /* a library without a pto_chip_kernels list */
    CHECK_EQ(pto_kernel_register("libc.so.6", "no_such_symbol_xyz"), -1);
    CHECK_CONTAINS(pto_errmsg(), "no kernel 'no_such_symbol_xyz' in libc.so.6; check the `symbol`");
    CHECK(!strstr(pto_errmsg(), "it has:"));
}

static const char *const kernel_names[] = {"vector_add", "vector_mul", "vector_scale", "fill",
                                          "copy",       "gemm_tile",  "tile_add",     "reduce_sum",
                                          "sleep_us",   "spin_us",    "fail"};
enum { NK = sizeof kernel_names / sizeof kernel_names[0] };

static void *register_all(void *arg)
{
    int64_t *ids = arg;
    for (int round = 0; round < 50; round++)
        for (int i = 0; i < NK; i++) {
            int64_t id = pto_kernel_register(NULL, kernel_names[i]);
            if (round == 0) ids[i] = id;
            else if (ids[i] != id) ids[i] = -2;
            if (id < 0 || !pto_kernel_lookup((uint64_t)id)) ids[i] = -3;
        }
    return NULL;
}

/* Registration and lookups race from several threads (for TSan). */
static void test_register_concurrent(void)
{
    enum { NTHREADS = 4 };
    pthread_t th[NTHREADS];
    int64_t ids[NTHREADS][NK];
    for (int t = 0; t < NTHREADS; t++) pthread_create(&th[t], NULL, register_all, ids[t]);
    for (int t = 0; t < NTHREADS; t++) pthread_join(th[t], NULL);
    for (int i = 0; i < NK; i++) {
        CHECK(ids[0][i] >= 0);
        for (int t = 1; t < NTHREADS; t++) CHECK_EQ(ids[t][i], ids[0][i]);
    }
}

/* ---- the kernels ---- */

static void test_elementwise(void)
{
    enum { N = 1003 };
    float *a = falloc(N), *b = falloc(N), *c = falloc(N);
    for (int i = 0; i < N; i++) a[i] = frand(), b[i] = frand();
    pto_tensor t[3] = {T1(a, PTO_F32, N), T1(b, PTO_F32, N), T1(c, PTO_F32, N)};
    CHECK_EQ(call("vector_add", 3, t, 0, NULL), 0);
    int bad = 0;
    for (int i = 0; i < N; i++) bad += c[i] != a[i] + b[i];
    CHECK_EQ(bad, 0);
    CHECK_EQ(call("vector_mul", 3, t, 0, NULL), 0);
    for (int i = 0; i < N; i++) bad += c[i] != a[i] * b[i];
    CHECK_EQ(bad, 0);
    uint64_t f = dbits(2.5);
    pto_tensor ac[2] = {t[0], t[2]};
    CHECK_EQ(call("vector_scale", 2, ac, 1, &f), 0);
    for (int i = 0; i < N; i++) bad += c[i] != a[i] * 2.5f;
    CHECK_EQ(bad, 0);
    CHECK_EQ(call("tile_add", 3, t, 0, NULL), 0);
    for (int i = 0; i < N; i++) bad += c[i] != a[i] + b[i];
    CHECK_EQ(bad, 0);
    pto_tensor accb[2] = {t[2], t[1]};   /* c += b */
    CHECK_EQ(call("tile_add", 2, accb, 0, NULL), 0);
    for (int i = 0; i < N; i++) bad += c[i] != (a[i] + b[i]) + b[i];
    CHECK_EQ(bad, 0);
    /* in place: a = a + b */
    float *a0 = falloc(N);
    memcpy(a0, a, N * sizeof *a);
    pto_tensor inplace[3] = {t[0], t[1], t[0]};
    CHECK_EQ(call("vector_add", 3, inplace, 0, NULL), 0);
    for (int i = 0; i < N; i++) bad += a[i] != a0[i] + b[i];
    CHECK_EQ(bad, 0);
    free(a), free(b), free(c), free(a0);

    double x[5] = {1, 2, 3, 4, 5}, y[5] = {0.5, 0.25, 2, -1, 10}, z[5];
    pto_tensor d[3] = {T1(x, PTO_F64, 5), T1(y, PTO_F64, 5), T1(z, PTO_F64, 5)};
    CHECK_EQ(call("vector_mul", 3, d, 0, NULL), 0);
    CHECK(z[0] == 0.5 && z[2] == 6 && z[4] == 50);
    pto_tensor dz[2] = {d[0], d[2]};
    uint64_t third = dbits(1.0 / 3);
    CHECK_EQ(call("vector_scale", 2, dz, 1, &third), 0);
    CHECK(z[2] == 3.0 * (1.0 / 3));

    int32_t p[4] = {1, -2, INT32_MAX, 7}, q[4] = {10, 20, 1, -7}, r[4];
    pto_tensor it[3] = {T1(p, PTO_I32, 4), T1(q, PTO_I32, 4), T1(r, PTO_I32, 4)};
    CHECK_EQ(call("vector_add", 3, it, 0, NULL), 0);
    CHECK(r[0] == 11 && r[1] == 18 && r[2] == INT32_MIN && r[3] == 0);   /* wraps */
    CHECK_EQ(call("vector_mul", 3, it, 0, NULL), 0);
    CHECK(r[0] == 10 && r[1] == -40 && r[3] == -49);
}

static void test_fill_copy_reduce(void)
{
    float f[300];
    pto_tensor tf = T2(f, PTO_F32, 10, 30);
    uint64_t v = dbits(-1.5);
    CHECK_EQ(call("fill", 1, &tf, 1, &v), 0);
    int bad = 0;
    for (int i = 0; i < 300; i++) bad += f[i] != -1.5f;
    CHECK_EQ(bad, 0);
    double d[7];
    pto_tensor td = T1(d, PTO_F64, 7);
    uint64_t pi = dbits(3.14159);
    CHECK_EQ(call("fill", 1, &td, 1, &pi), 0);
    CHECK(d[0] == 3.14159 && d[6] == 3.14159);
    int32_t i32[3];
    pto_tensor ti = T1(i32, PTO_I32, 3);
    uint64_t m = dbits(-42);
    CHECK_EQ(call("fill", 1, &ti, 1, &m), 0);
    CHECK(i32[0] == -42 && i32[2] == -42);

    /* copy: any dtypes of one byte size */
    uint8_t src[16], dst[16];
    for (int i = 0; i < 16; i++) src[i] = (uint8_t)(i * 7);
    pto_tensor cp[2] = {T1(src, PTO_U8, 16), T2(dst, PTO_I32, 2, 2)};
    CHECK_EQ(call("copy", 2, cp, 0, NULL), 0);
    CHECK(memcmp(src, dst, 16) == 0);

    float x[1000];
    double want = 0;
    for (int i = 0; i < 1000; i++) x[i] = frand(), want += x[i];
    float outf;
    double outd;
    pto_tensor rs[2] = {T1(x, PTO_F32, 1000), T1(&outf, PTO_F32, 1)};
    CHECK_EQ(call("reduce_sum", 2, rs, 0, NULL), 0);
    CHECK(outf == (float)want);
    rs[1] = ten(&outd, PTO_F64, 0, 0, 0);   /* 0 dims: one element */
    CHECK_EQ(call("reduce_sum", 2, rs, 0, NULL), 0);
    CHECK(outd == want);
    int32_t xi[3] = {-5, 100, 2};
    pto_tensor ri[2] = {T1(xi, PTO_I32, 3), T1(&outd, PTO_F64, 1)};
    CHECK_EQ(call("reduce_sum", 2, ri, 0, NULL), 0);
    CHECK(outd == 97);
}

static void gemm_ref(uint32_t M, uint32_t N, uint32_t K, const float *A, const float *B, double *R)
{
    for (uint32_t i = 0; i < M; i++)
        for (uint32_t j = 0; j < N; j++) {
            double s = 0;
            for (uint32_t k = 0; k < K; k++) s += (double)A[i * K + k] * B[k * N + j];
            R[i * N + j] = s;
        }
}

static void test_gemm_tile(void)
{
    /* edges on every side of the 6x16 core, more than one 256-deep k panel, and K = 0 */
    static const uint32_t shapes[][3] = {{64, 64, 64}, {128, 64, 96}, {6, 16, 1},   {7, 17, 5},
                                         {1, 1, 1},    {13, 50, 300}, {100, 3, 70}, {5, 40, 0}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        uint32_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        float *A = falloc((size_t)M * K + 1), *B = falloc((size_t)K * N + 1), *C = falloc((size_t)M * N);
        double *R = malloc(sizeof(double) * M * N);
        for (uint32_t i = 0; i < M * K; i++) A[i] = frand();
        for (uint32_t i = 0; i < K * N; i++) B[i] = frand();
        for (uint32_t i = 0; i < M * N; i++) C[i] = 1e30f;   /* overwritten, not added to */
        gemm_ref(M, N, K, A, B, R);
        pto_tensor t[3] = {T2(A, PTO_F32, M, K), T2(B, PTO_F32, K, N), T2(C, PTO_F32, M, N)};
        CHECK_EQ(call("gemm_tile", 3, t, 0, NULL), 0);
        int bad = 0;
        for (uint32_t i = 0; i < M * N; i++) bad += !close_rel(C[i], R[i], 1e-4);
        CHECK_EQ(bad, 0);
        /* accumulate: C = A*B + A*B */
        uint64_t acc = 1;
        CHECK_EQ(call("gemm_tile", 3, t, 1, &acc), 0);
        for (uint32_t i = 0; i < M * N; i++) bad += !close_rel(C[i], 2 * R[i], 1e-4);
        CHECK_EQ(bad, 0);
        uint64_t overwrite = 0;
        CHECK_EQ(call("gemm_tile", 3, t, 1, &overwrite), 0);
        for (uint32_t i = 0; i < M * N; i++) bad += !close_rel(C[i], R[i], 1e-4);
        CHECK_EQ(bad, 0);
        if (bad) fprintf(stderr, "gemm_tile %ux%ux%u wrong\n", M, N, K);
        free(A), free(B), free(C), free(R);
    }
}

static void test_sleep_spin_fail(void)
{
    uint64_t us = 2000, t0 = tu_now_ms();
    CHECK_EQ(call("sleep_us", 0, NULL, 1, &us), 0);
    CHECK(tu_now_ms() - t0 >= 2);
    float any[4];
    pto_tensor dep = T1(any, PTO_F32, 4);   /* tensors are accepted and ignored */
    t0 = tu_now_ms();
    CHECK_EQ(call("spin_us", 1, &dep, 1, &us), 0);
    CHECK(tu_now_ms() - t0 >= 2);

    CHECK_EQ(call("fail", 0, NULL, 0, NULL), 1);
    CHECK(strcmp(kerr, "fail kernel called") == 0);
    uint64_t code = (uint64_t)-3;
    CHECK_EQ(call("fail", 0, NULL, 1, &code), 1);
    CHECK(strcmp(kerr, "fail kernel called with code -3") == 0);
}

static void expect_error(const char *symbol, int nt, const pto_tensor *t, int ns, const uint64_t *s, const char *msg)
{
    CHECK(call(symbol, nt, t, ns, s) != 0);
    CHECK_CONTAINS(kerr, msg);
}

static void test_kernel_errors(void)
{
    float a[12], b[12], c[12];
    double d[12];
    uint16_t h[12];
    pto_tensor f3[3] = {T1(a, PTO_F32, 12), T1(b, PTO_F32, 12), T1(c, PTO_F32, 12)};
    expect_error("vector_add", 2, f3, 0, NULL, "vector_add: expects 3 tensors (a IN, b IN, c OUT), got 2 tensors");
    expect_error("tile_add", 1, f3, 0, NULL,
                 "tile_add: expects 3 tensors (a IN, b IN, c OUT) or 2 (acc INOUT, b IN), got 1 tensor");
    pto_tensor mixed[3] = {f3[0], T1(d, PTO_F64, 12), f3[2]};
    expect_error("vector_mul", 3, mixed, 0, NULL, "vector_mul: a is f32 but b is f64; all tensors must have one dtype");
    pto_tensor shortc[3] = {f3[0], f3[1], T1(c, PTO_F32, 11)};
    expect_error("vector_add", 3, shortc, 0, NULL, "vector_add: a has 12 elements but c has 11; they must match");
    pto_tensor acc2[2] = {T1(a, PTO_F32, 12), T1(b, PTO_F32, 6)};
    expect_error("tile_add", 2, acc2, 0, NULL, "tile_add: acc has 12 elements but b has 6");
    pto_tensor half[3] = {T1(h, PTO_F16, 12), T1(h, PTO_F16, 12), T1(h, PTO_F16, 12)};
    expect_error("vector_add", 3, half, 0, NULL, "vector_add: dtype f16 is not supported; expects f32, f64 or i32");
    pto_tensor junk[1] = {f3[0]};
    junk[0].dtype = 99;
    expect_error("fill", 1, junk, 1, (uint64_t[]){0}, "fill: tensor 0 has dtype 99 and 1 dims; expects a pto_dtype");
    pto_tensor nobase[1] = {T1(NULL, PTO_F32, 4)};
    expect_error("fill", 1, nobase, 1, (uint64_t[]){0}, "fill: tensor 0 has no storage (base 0)");

    expect_error("vector_scale", 2, f3, 0, NULL, "vector_scale: expects scalar 0 = the factor (IEEE double bits), got no scalars");
    pto_tensor i2[2] = {T1(a, PTO_I32, 12), T1(b, PTO_I32, 12)};
    expect_error("vector_scale", 2, i2, 1, (uint64_t[]){dbits(2)}, "vector_scale: dtype i32 is not supported; expects f32 or f64");
    expect_error("fill", 1, f3, 0, NULL, "fill: expects scalar 0 = the value (IEEE double bits), got no scalars");
    expect_error("fill", 1, f3, 1, (uint64_t[]){2}, "fill: scalar 0 holds the integer 2, not a double; pass the value "
                                                    "as IEEE double bits (in Lua a float: 2.0)");
    expect_error("vector_scale", 2, f3, 1, (uint64_t[]){(uint64_t)-3}, "vector_scale: scalar 0 holds the integer -3");
    expect_error("fill", 1, half, 1, (uint64_t[]){0}, "fill: dtype f16 is not supported; expects f32, f64 or i32");
    expect_error("fill", 1, i2, 1, (uint64_t[]){dbits(0.5)}, "fill: value 0.5 does not fit an i32 tensor");
    expect_error("fill", 1, i2, 1, (uint64_t[]){dbits(3e9)}, "fill: value 3e+09 does not fit an i32 tensor");
    pto_tensor cp[2] = {T1(a, PTO_F32, 12), T1(d, PTO_F64, 12)};
    expect_error("copy", 2, cp, 0, NULL, "copy: src has 48 bytes but dst has 96; they must match (dtypes may differ)");

    pto_tensor g[3] = {T2(a, PTO_F32, 3, 4), T2(b, PTO_F32, 4, 3), T2(c, PTO_F32, 3, 3)};
    expect_error("gemm_tile", 2, g, 0, NULL, "gemm_tile: expects 3 tensors (A IN [M,K], B IN [K,N], C OUT [M,N]), got 2");
    pto_tensor gd[3] = {g[0], T2(d, PTO_F64, 4, 3), g[2]};
    expect_error("gemm_tile", 3, gd, 0, NULL, "gemm_tile: B is f64; expects f32");
    pto_tensor g1[3] = {T1(a, PTO_F32, 12), g[1], g[2]};
    expect_error("gemm_tile", 3, g1, 0, NULL, "gemm_tile: A has 1 dims; expects 2 (row-major [rows, cols])");
    pto_tensor gk[3] = {g[0], T2(b, PTO_F32, 3, 4), g[2]};
    expect_error("gemm_tile", 3, gk, 0, NULL, "gemm_tile: A is [3,4] but B is [3,4]; B must have 4 rows (A's columns)");
    pto_tensor gc[3] = {g[0], g[1], T2(c, PTO_F32, 3, 2)};
    expect_error("gemm_tile", 3, gc, 0, NULL, "gemm_tile: C is [3,2]; expects [3,3] for A [3,4] * B [4,3]");
    expect_error("gemm_tile", 3, g, 1, (uint64_t[]){dbits(1.0)},
                 "gemm_tile: scalar 0 is 4607182418800017408; expects the integer 0 (C = A*B) or 1 (C += A*B)");
    pto_tensor galias[3] = {g[0], g[1], T2(a, PTO_F32, 3, 3)};
    expect_error("gemm_tile", 3, galias, 0, NULL, "gemm_tile: C overlaps A or B; C must be a separate buffer");

    pto_tensor r2[2] = {T1(a, PTO_F32, 12), T1(b, PTO_F32, 2)};
    expect_error("reduce_sum", 2, r2, 0, NULL, "reduce_sum: out has 2 elements; expects 1");
    pto_tensor ri[2] = {T1(a, PTO_F32, 12), T1(b, PTO_I32, 1)};
    expect_error("reduce_sum", 2, ri, 0, NULL, "reduce_sum: out is i32; expects f32 or f64");
    pto_tensor rh[2] = {T1(h, PTO_F16, 12), T1(b, PTO_F32, 1)};
    expect_error("reduce_sum", 2, rh, 0, NULL, "reduce_sum: x is f16; expects f32, f64 or i32");
    expect_error("reduce_sum", 3, f3, 0, NULL, "reduce_sum: expects 2 tensors (x IN, out OUT with 1 element), got 3");
    expect_error("sleep_us", 0, NULL, 0, NULL, "sleep_us: expects scalar 0 = microseconds (integer), got no scalars");
    expect_error("spin_us", 0, NULL, 0, NULL, "spin_us: expects scalar 0 = microseconds (integer), got no scalars");
    expect_error("sleep_us", 0, NULL, 1, (uint64_t[]){dbits(100.0)}, "sleep_us: scalar 0 is 4636737291354636288 us, "
                 "over an hour; pass an integer number of microseconds (in Lua 100, not 100.0)");
}

/* ---- the chip leaf ---- */

static void test_leaf(void)
{
    pto_leaf leaf = pto_chip_leaf();
    CHECK(leaf.run != NULL);
    CHECK(leaf.name && strcmp(leaf.name, "chip") == 0);
    char err[256] = "";
    pto_args_view v = {0, 0, NULL, NULL};
    CHECK(leaf.run(leaf.ctx, 999999, &v, NULL, err, sizeof err) != 0);
    CHECK_CONTAINS(err, "chip: callable 999999 is not a registered kernel");
    float x[4] = {1, 2, 3, 4}, y[4] = {10, 20, 30, 40}, z[4];
    pto_tensor t[3] = {T1(x, PTO_F32, 4), T1(y, PTO_F32, 4), T1(z, PTO_F32, 4)};
    pto_args_view add = {3, 0, t, NULL};
    CHECK_EQ(leaf.run(leaf.ctx, (uint64_t)id_of("vector_add"), &add, NULL, err, sizeof err), 0);
    CHECK(z[0] == 11 && z[3] == 44);
    uint64_t code = 5;
    pto_args_view f = {0, 1, NULL, &code};
    CHECK_EQ(leaf.run(leaf.ctx, (uint64_t)id_of("fail"), &f, NULL, err, sizeof err), 1);
    CHECK(strcmp(err, "fail kernel called with code 5") == 0);
}

/* ---- end to end: BGEMM on a THREAD-mode Worker with two chips ---- */

enum { TS = 32, MT = 2, KT = 3, NT = 2 };   /* tile size, tiles along M, K, N */

static pto_worker *chip_worker(void)
{
    pto_worker_config cfg = {.level = 3, .mode = PTO_MODE_THREAD, .heap_ring_size = 8 << 20};
    pto_worker *w = pto_worker_new(&cfg);
    pto_leaf leaf = pto_chip_leaf();
    CHECK_EQ(pto_worker_add_next_level(w, &leaf), 0);
    CHECK_EQ(pto_worker_add_next_level(w, &leaf), 1);
    CHECK_EQ(pto_worker_init(w), 0);
    return w;
}

static void test_bgemm_end_to_end(void)
{
    /* Matrices are stored as contiguous TSxTS tiles: A[i][k], B[k][j], C[i][j]. */
    float *A[MT][KT], *B[KT][NT], *C[MT][NT], *C2[MT][NT];
    for (int i = 0; i < MT; i++)
        for (int k = 0; k < KT; k++) {
            A[i][k] = falloc(TS * TS);
            for (int e = 0; e < TS * TS; e++) A[i][k][e] = frand();
        }
    for (int k = 0; k < KT; k++)
        for (int j = 0; j < NT; j++) {
            B[k][j] = falloc(TS * TS);
            for (int e = 0; e < TS * TS; e++) B[k][j][e] = frand();
        }
    for (int i = 0; i < MT; i++)
        for (int j = 0; j < NT; j++) C[i][j] = falloc(TS * TS), C2[i][j] = falloc(TS * TS);

    uint64_t gemm = (uint64_t)id_of("gemm_tile"), add = (uint64_t)id_of("tile_add"), fill = (uint64_t)id_of("fill");
    const uint8_t OUT[] = {PTO_OUTPUT}, GEMM[] = {PTO_INPUT, PTO_INPUT, PTO_OUTPUT}, ACC[] = {PTO_INOUT, PTO_INPUT},
                  GEMM_ACC[] = {PTO_INPUT, PTO_INPUT, PTO_INOUT};
    uint64_t zero = dbits(0), one = 1;
    pto_worker *w = chip_worker();
    pto_orch *o = pto_run_begin(w);
    CHECK(o != NULL);
    for (int i = 0; i < MT; i++)
        for (int j = 0; j < NT; j++) {
            pto_tensor c = T2(C[i][j], PTO_F32, TS, TS), c2 = T2(C2[i][j], PTO_F32, TS, TS);
            pto_task_args fa = {1, 1, &c, OUT, &zero}, fa2 = {1, 1, &c2, OUT, &zero};
            CHECK(pto_submit_next_level(o, fill, &fa, NULL, -1) >= 0);
            CHECK(pto_submit_next_level(o, fill, &fa2, NULL, -1) >= 0);
            for (int k = 0; k < KT; k++) {
                /* C += A*B through a heap temporary, and C2 += A*B in place */
                pto_tensor g[3] = {T2(A[i][k], PTO_F32, TS, TS), T2(B[k][j], PTO_F32, TS, TS), T2(NULL, PTO_F32, TS, TS)};
                pto_task_args ga = {3, 0, g, GEMM, NULL};
                CHECK(pto_submit_next_level(o, gemm, &ga, NULL, -1) >= 0);
                CHECK(g[2].base != 0);   /* submit wrote the temporary back */
                pto_tensor acc[2] = {c, g[2]};
                pto_task_args aa = {2, 0, acc, ACC, NULL};
                CHECK(pto_submit_next_level(o, add, &aa, NULL, -1) >= 0);
                pto_tensor g2[3] = {g[0], g[1], c2};
                pto_task_args ga2 = {3, 1, g2, GEMM_ACC, &one};
                CHECK(pto_submit_next_level(o, gemm, &ga2, NULL, -1) >= 0);
            }
        }
    CHECK_EQ(pto_run_end(w), 0);

    int bad = 0;
    for (int i = 0; i < MT; i++)
        for (int j = 0; j < NT; j++)
            for (int r = 0; r < TS; r++)
                for (int col = 0; col < TS; col++) {
                    double want = 0;
                    for (int k = 0; k < KT; k++)
                        for (int e = 0; e < TS; e++) want += (double)A[i][k][r * TS + e] * B[k][j][e * TS + col];
                    bad += !close_rel(C[i][j][r * TS + col], want, 1e-4);
                    bad += !close_rel(C2[i][j][r * TS + col], want, 1e-4);
                }
    CHECK_EQ(bad, 0);

    /* a failing kernel fails the run with its own message */
    o = pto_run_begin(w);
    uint64_t code = 7;
    pto_task_args fa = {0, 1, NULL, NULL, &code};
    CHECK(pto_submit_next_level(o, (uint64_t)id_of("fail"), &fa, NULL, -1) >= 0);
    CHECK_EQ(pto_run_end(w), -1);
    CHECK_CONTAINS(pto_errmsg(), "fail kernel called with code 7");

    /* so does an id nobody registered */
    o = pto_run_begin(w);
    pto_task_args none = {0, 0, NULL, NULL, NULL};
    CHECK(pto_submit_next_level(o, 4000, &none, NULL, -1) >= 0);
    CHECK_EQ(pto_run_end(w), -1);
    CHECK_CONTAINS(pto_errmsg(), "chip: callable 4000 is not a registered kernel");
    pto_worker_close(w);

    for (int i = 0; i < MT; i++)
        for (int k = 0; k < KT; k++) free(A[i][k]);
    for (int k = 0; k < KT; k++)
        for (int j = 0; j < NT; j++) free(B[k][j]);
    for (int i = 0; i < MT; i++)
        for (int j = 0; j < NT; j++) free(C[i][j]), free(C2[i][j]);
}

int main(void)
{
    srand(1);
    RUN(test_chip_runtime_env);
    RUN(test_chipsim_path);
    RUN(test_register_idempotent);
    RUN(test_register_errors);
    RUN(test_register_concurrent);
    RUN(test_elementwise);
    RUN(test_fill_copy_reduce);
    RUN(test_gemm_tile);
    RUN(test_sleep_spin_fail);
    RUN(test_kernel_errors);
    RUN(test_leaf);
    RUN(test_bgemm_end_to_end);
    return tu_finish();
}
