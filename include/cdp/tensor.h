/* Tensor views: a shape, strides, a dtype and a pointer into a device buffer.
 * A view owns nothing; the buffer it points into does (cdp/device.h).
 * Shape legend used across the code: B batch, T tokens, C channels/features. */
#ifndef CDP_TENSOR_H
#define CDP_TENSOR_H

#include "cdp/api.h"

#include <stdint.h>

#include "cdp/device.h"
#include "cdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CDP_MAX_DIMS 6

enum cdp_dtype { CDP_DTYPE_F32 = 0, CDP_DTYPE_BF16, CDP_DTYPE_I32, CDP_DTYPE_COUNT };

struct cdp_tensor {
    enum cdp_dtype dtype;
    int ndim;
    int64_t shape[CDP_MAX_DIMS];
    int64_t strides[CDP_MAX_DIMS]; /* in elements */
    void *data;                    /* not owned */
    cdp_device_t device;           /* not owned; NULL for plain host memory */
};

/* Bytes per element; "f32" / "bf16" / "i32". */
CDP_API size_t cdp_dtype_size(enum cdp_dtype t);
CDP_API const char *cdp_dtype_name(enum cdp_dtype t);

/* Fills a contiguous (row-major) view. Fails on ndim outside 0..CDP_MAX_DIMS or a
 * negative dimension. */
CDP_API cdp_status cdp_tensor_init(struct cdp_tensor *t, enum cdp_dtype dtype, int ndim,
                           const int64_t *shape, void *data, cdp_device_t device);

/* A view of the whole buffer as a contiguous tensor; fails when the buffer is
 * smaller than the shape needs. */
CDP_API cdp_status cdp_tensor_from_buffer(struct cdp_tensor *t, enum cdp_dtype dtype, int ndim,
                                  const int64_t *shape, cdp_buffer_t buf);

CDP_API int64_t cdp_tensor_numel(const struct cdp_tensor *t);
/* Bytes spanned by the elements of a contiguous tensor (numel * dtype size). */
CDP_API uint64_t cdp_tensor_nbytes(const struct cdp_tensor *t);
CDP_API int cdp_tensor_is_contiguous(const struct cdp_tensor *t);

/* Swaps two dimensions of the view (no data moves). */
CDP_API cdp_status cdp_tensor_transpose(struct cdp_tensor *t, int a, int b);

/* "f32[4, 64, 128]" into buf; returns buf. */
CDP_API char *cdp_tensor_describe(const struct cdp_tensor *t, char *buf, size_t cap);

/* bfloat16 conversions: round to nearest even; NaN stays NaN. */
CDP_API uint16_t cdp_f32_to_bf16(float f);
CDP_API float cdp_bf16_to_f32(uint16_t h);

#ifdef __cplusplus
}
#endif

#endif
