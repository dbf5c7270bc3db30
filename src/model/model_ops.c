/* The device work callers do on a model's own buffers (activations, gradients
 * and the tied copies) without a layer: copies, zeroing, sums (model.h). The
 * executor goes through these, so the kernel table stays the model's and the
 * device's business. */
#include "model/model.h"

#include "kernels/ops.h"

cdp_status cdp_model_copy(struct cdp_model *m, void *dst, const void *src, size_t bytes)
{
    const struct cdp_kernels *k = cdp_model_kernels(m);
    return k->ops->copy(k->ks, dst, src, bytes);
}

cdp_status cdp_model_zero(struct cdp_model *m, void *dst, size_t bytes)
{
    const struct cdp_kernels *k = cdp_model_kernels(m);
    return k->ops->zero(k->ks, dst, bytes);
}

cdp_status cdp_model_add(struct cdp_model *m, float *dst, const float *src, size_t n)
{
    const struct cdp_kernels *k = cdp_model_kernels(m);
    return k->ops->add(k->ks, dst, src, n);
}

cdp_status cdp_model_sum_squares(struct cdp_model *m, const float *x, size_t n, double *out)
{
    const struct cdp_kernels *k = cdp_model_kernels(m);
    return k->ops->sum_squares(k->ks, x, n, out);
}
