#include "task_args.h"
#include "common.h"

#include <string.h>

static const struct { const char *name; uint8_t size; } dtypes[PTO_DTYPE_COUNT] = {
    [PTO_F32] = {"f32", 4}, [PTO_F16] = {"f16", 2}, [PTO_BF16] = {"bf16", 2},
    [PTO_F64] = {"f64", 8}, [PTO_I8] = {"i8", 1},   [PTO_I16] = {"i16", 2},
    [PTO_I32] = {"i32", 4}, [PTO_I64] = {"i64", 8}, [PTO_U8] = {"u8", 1},
    [PTO_U16] = {"u16", 2}, [PTO_U32] = {"u32", 4}, [PTO_U64] = {"u64", 8},
    [PTO_BOOL] = {"bool", 1},
};

size_t pto_dtype_size(int32_t dtype)
{
    return dtype >= 0 && dtype < PTO_DTYPE_COUNT ? dtypes[dtype].size : 0;
}

const char *pto_dtype_name(int32_t dtype)
{
    return dtype >= 0 && dtype < PTO_DTYPE_COUNT ? dtypes[dtype].name : NULL;
}

const char *pto_tag_name(int tag)
{
    static const char *const names[] = {"in", "out", "inout", "out_existing", "no_dep"};
    return tag >= PTO_INPUT && tag <= PTO_NO_DEP ? names[tag] : NULL;
}

uint64_t pto_tensor_numel(const pto_tensor *t)
{
    uint64_t n = 1;
    for (int i = 0; i < t->ndims && i < PTO_MAX_DIMS; i++) n *= t->shape[i];
    return n;
}

uint64_t pto_tensor_nbytes(const pto_tensor *t)
{
    return pto_tensor_numel(t) * pto_dtype_size(t->dtype);
}

bool pto_tensor_check(const pto_tensor *t, int index)
{
    if (!pto_dtype_name(t->dtype)) {
        pto_set_error("tensor %d has unknown dtype %d (use one of f32 f16 bf16 f64 i8 i16 i32 i64 "
                      "u8 u16 u32 u64 bool)", index + 1, t->dtype);
        return false;
    }
    if (t->ndims > PTO_MAX_DIMS) {
        pto_set_error("tensor %d has %d dimensions; at most %d are supported (reshape it)",
                      index + 1, t->ndims, PTO_MAX_DIMS);
        return false;
    }
    /* 2^48 bytes bounds every product without overflow and any real tensor. */
    uint64_t n = pto_dtype_size(t->dtype);
    for (int d = 0; d < t->ndims; d++) {
        n *= t->shape[d];
        if (n > (1ull << 48)) {
            pto_set_error("tensor %d is larger than 2^48 bytes (check its shape)", index + 1);
            return false;
        }
    }
    if (t->base && t->base + t->offset < t->base) {
        pto_set_error("tensor %d has an offset that wraps the address space", index + 1);
        return false;
    }
    return true;
}

size_t pto_blob_size(int32_t tensor_count, int32_t scalar_count)
{
    if (tensor_count < 0 || scalar_count < 0) return 0;
    return 8 + sizeof(pto_tensor) * (size_t)tensor_count + 8 * (size_t)scalar_count;
}

int64_t pto_blob_encode(const pto_args_view *v, void *buf, size_t cap)
{
    size_t need = pto_blob_size(v->tensor_count, v->scalar_count);
    if (v->tensor_count < 0 || v->scalar_count < 0 || need > cap) return -1;
    uint8_t *p = buf;
    memcpy(p, &v->tensor_count, 4);
    memcpy(p + 4, &v->scalar_count, 4);
    if (v->tensor_count) memcpy(p + 8, v->tensors, sizeof(pto_tensor) * (size_t)v->tensor_count);
    if (v->scalar_count)
        memcpy(p + 8 + sizeof(pto_tensor) * (size_t)v->tensor_count, v->scalars, 8 * (size_t)v->scalar_count);
    return (int64_t)need;
}

int pto_blob_decode(const void *buf, size_t len, pto_args_view *v)
{
    const uint8_t *p = buf;
    int32_t t, s;
    if (!buf || len < 8) return -1;
    memcpy(&t, p, 4);
    memcpy(&s, p + 4, 4);
    /* Bound the counts before multiplying so the size check cannot overflow. */
    if (t < 0 || s < 0 || (size_t)t > len / sizeof(pto_tensor) || (size_t)s > len / 8) return -1;
    if (pto_blob_size(t, s) > len) return -1;
    v->tensor_count = t;
    v->scalar_count = s;
    v->tensors = (const pto_tensor *)(p + 8);
    v->scalars = (const uint64_t *)(p + 8 + sizeof(pto_tensor) * (size_t)t);
    return 0;
}
