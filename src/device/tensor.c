/* Tensor views and dtype helpers; the arithmetic lives in kernels/. */
#include "cdp/tensor.h"

#include <stdio.h>
#include <string.h>

#include "cdp/core.h" /* CDP_TABLE_CHECK */

static const struct {
    const char *name;
    size_t size;
} cdp_dtypes[] = {
    [CDP_DTYPE_F32] = {"f32", 4},
    [CDP_DTYPE_BF16] = {"bf16", 2},
    [CDP_DTYPE_I32] = {"i32", 4},
};
CDP_TABLE_CHECK(cdp_dtypes, CDP_DTYPE_COUNT);

size_t cdp_dtype_size(enum cdp_dtype t)
{
    return (unsigned)t < CDP_DTYPE_COUNT ? cdp_dtypes[t].size : 0;
}

const char *cdp_dtype_name(enum cdp_dtype t)
{
    return (unsigned)t < CDP_DTYPE_COUNT ? cdp_dtypes[t].name : "?";
}

cdp_status cdp_tensor_init(struct cdp_tensor *t, enum cdp_dtype dtype, int ndim,
                           const int64_t *shape, void *data, cdp_device_t device)
{
    if ((unsigned)dtype >= CDP_DTYPE_COUNT)
        return cdp_fail(CDP_ERR_INVALID, "tensor: unknown dtype %d", (int)dtype);
    if (ndim < 0 || ndim > CDP_MAX_DIMS)
        return cdp_fail(CDP_ERR_INVALID, "tensor: %d dimensions (expected 0 to %d)", ndim,
                        CDP_MAX_DIMS);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return cdp_fail(CDP_ERR_INVALID, "tensor: dimension %d is %lld (expected >= 0)", i,
                            (long long)shape[i]);
    memset(t, 0, sizeof *t);
    t->dtype = dtype;
    t->ndim = ndim;
    int64_t stride = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        t->shape[i] = shape[i];
        t->strides[i] = stride;
        stride *= shape[i] > 0 ? shape[i] : 1;
    }
    t->data = data;
    t->device = device;
    return CDP_OK;
}

cdp_status cdp_tensor_from_buffer(struct cdp_tensor *t, enum cdp_dtype dtype, int ndim,
                                  const int64_t *shape, cdp_buffer_t buf)
{
    struct cdp_tensor v;
    cdp_status st = cdp_tensor_init(&v, dtype, ndim, shape, cdp_buffer_data(buf),
                                    cdp_buffer_device(buf));
    if (st) return st;
    uint64_t need = cdp_tensor_nbytes(&v);
    if (need > cdp_buffer_size(buf)) {
        char desc[128];
        return cdp_fail(CDP_ERR_INVALID, "tensor %s needs %llu bytes, the buffer has %llu",
                        cdp_tensor_describe(&v, desc, sizeof desc), (unsigned long long)need,
                        (unsigned long long)cdp_buffer_size(buf));
    }
    *t = v;
    return CDP_OK;
}

int64_t cdp_tensor_numel(const struct cdp_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

uint64_t cdp_tensor_nbytes(const struct cdp_tensor *t)
{
    return (uint64_t)cdp_tensor_numel(t) * cdp_dtype_size(t->dtype);
}

int cdp_tensor_is_contiguous(const struct cdp_tensor *t)
{
    int64_t stride = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != stride) return 0;
        stride *= t->shape[i];
    }
    return 1;
}

cdp_status cdp_tensor_transpose(struct cdp_tensor *t, int a, int b)
{
    if (a < 0 || b < 0 || a >= t->ndim || b >= t->ndim)
        return cdp_fail(CDP_ERR_INVALID, "tensor: cannot swap dimensions %d and %d of a %d-d tensor",
                        a, b, t->ndim);
    int64_t s = t->shape[a], st = t->strides[a];
    t->shape[a] = t->shape[b];
    t->strides[a] = t->strides[b];
    t->shape[b] = s;
    t->strides[b] = st;
    return CDP_OK;
}

char *cdp_tensor_describe(const struct cdp_tensor *t, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "%s[", cdp_dtype_name(t->dtype));
    for (int i = 0; i < t->ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
    return buf;
}

uint16_t cdp_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu))
        return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN, sign kept */
    uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)((u + rounding) >> 16);
}

float cdp_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
