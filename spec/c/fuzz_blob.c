/* libFuzzer target for the args-blob decoder, the first thing a PROCESS-mode
 * child runs on the bytes in its mailbox. Built with clang only
 * (-DPTO_FUZZ=ON); CTest runs it for a bounded number of inputs. The input
 * is copied to a heap buffer of exactly its size so ASan catches overreads;
 * an accepted view must lie inside it and re-encode to the same bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "pto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    if (size) memcpy(buf, data, size);
    pto_args_view v;
    if (pto_blob_decode(buf, size, &v) == 0) {
        const uint8_t *end = buf + size;
        if (v.tensor_count < 0 || v.scalar_count < 0 || pto_blob_size(v.tensor_count, v.scalar_count) > size ||
            (const uint8_t *)v.tensors != buf + 8 || (const uint8_t *)(v.tensors + v.tensor_count) > end ||
            (const uint8_t *)(v.scalars + v.scalar_count) > end)
            __builtin_trap();
        volatile uint64_t h = 0;
        for (int32_t i = 0; i < v.tensor_count; i++) h += v.tensors[i].base + v.tensors[i].shape[4];
        for (int32_t i = 0; i < v.scalar_count; i++) h += v.scalars[i];
        (void)h;
        size_t need = pto_blob_size(v.tensor_count, v.scalar_count);
        uint8_t *again = malloc(need);
        if (!again || pto_blob_encode(&v, again, need) != (int64_t)need || memcmp(again, buf, need) != 0)
            __builtin_trap();
        free(again);
    }
    free(buf);
    return 0;
}
