/* The end-to-end walkthrough on the engine alone (no Lua): c = a + b in
 * chunks, each chunk a task on one of two in-process "chips". */
#include <stdio.h>
#include <stdlib.h>
#include "pto.h"

static int vadd(void *ctx, uint64_t callable, const pto_args_view *a, const pto_call_config *cfg, char *err,
                size_t errlen)
{
    (void)ctx, (void)callable, (void)cfg, (void)err, (void)errlen;
    const float *x = (const float *)(uintptr_t)(a->tensors[0].base + a->tensors[0].offset);
    const float *y = (const float *)(uintptr_t)(a->tensors[1].base + a->tensors[1].offset);
    float *z = (float *)(uintptr_t)(a->tensors[2].base + a->tensors[2].offset);
    for (uint64_t i = 0; i < pto_tensor_numel(&a->tensors[0]); i++) z[i] = x[i] + y[i];
    return 0;
}

int main(int argc, char **argv)
{
    uint32_t n = argc > 1 ? (uint32_t)atoi(argv[1]) : 1 << 20, chunk = 4096;
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *c = calloc(n, sizeof *c);
    for (uint32_t i = 0; i < n; i++) a[i] = (float)i, b[i] = 2.0f * (float)i;
    pto_worker_config cfg = {.level = 3, .mode = PTO_MODE_THREAD};
    pto_worker *w = pto_worker_new(&cfg);
    pto_leaf chip = {.run = vadd, .name = "chip"};
    pto_worker_add_next_level(w, &chip);
    pto_worker_add_next_level(w, &chip);
    if (!w || pto_worker_init(w) != 0) return fprintf(stderr, "%s\n", pto_errmsg()), 1;
    pto_orch *o = pto_run_begin(w);
    uint8_t tags[3] = {PTO_INPUT, PTO_INPUT, PTO_OUTPUT_EXISTING};
    for (uint32_t off = 0; off < n; off += chunk) {
        uint32_t len = n - off < chunk ? n - off : chunk;
        pto_tensor t[3];
        float *bufs[3] = {a, b, c};
        for (int k = 0; k < 3; k++)
            t[k] = (pto_tensor){.base = (uint64_t)(uintptr_t)bufs[k], .offset = off * 4ull, .shape = {len},
                                .dtype = PTO_F32, .ndims = 1};
        pto_task_args args = {.tensor_count = 3, .tensors = t, .tags = tags};
        if (pto_submit_next_level(o, 0, &args, NULL, -1) < 0) return fprintf(stderr, "%s\n", pto_errmsg()), 1;
    }
    if (pto_run_end(w) != 0) return fprintf(stderr, "%s\n", pto_errmsg()), 1;
    for (uint32_t i = 0; i < n; i++)
        if (c[i] != 3.0f * (float)i) return fprintf(stderr, "vector_add: c[%u] = %g, expected %g\n", i, c[i], 3.0 * i), 1;
    printf("vector_add: %u elements in %u tasks: OK\n", n, (n + chunk - 1) / chunk);
    pto_worker_close(w);
    free(a), free(b), free(c);
    return 0;
}
