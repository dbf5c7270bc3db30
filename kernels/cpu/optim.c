/* Optimizer steps and gradient utilities on the CPU, with torch.optim's
 * semantics: AdamW (bias-corrected moments, decoupled weight decay applied as
 * p -= lr * wd * p before the update), SGD with momentum, and the sum of
 * squares and scaling used by clipping by global norm. One pass each. */
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vecmath.h"

#include <math.h>

CDP_CLONES
void cdp_cpu_adamw_step(float *restrict param, const float *restrict grad, float *restrict m,
                        float *restrict v, size_t n, float lr, float beta1, float beta2, float eps,
                        float weight_decay, int t)
{
    /* Corrections in double: 1 - beta2^t is tiny for small t and beta2 near 1. */
    double bc1 = 1.0 - pow((double)beta1, (double)t);
    double bc2 = 1.0 - pow((double)beta2, (double)t);
    float step = (float)((double)lr / bc1);
    float rbc2 = (float)(1.0 / sqrt(bc2));
    float decay = 1.0f - lr * weight_decay;
    float b1 = beta1, b2 = beta2, c1 = 1.0f - beta1, c2 = 1.0f - beta2;
    CDP_SIMD
    for (size_t i = 0; i < n; i++) {
        float g = grad[i];
        float mi = b1 * m[i] + c1 * g;
        float vi = b2 * v[i] + c2 * g * g;
        m[i] = mi;
        v[i] = vi;
        param[i] = param[i] * decay - step * mi / (sqrtf(vi) * rbc2 + eps);
    }
}

void cdp_cpu_sgd_step(float *restrict param, const float *restrict grad, float *restrict velocity,
                      size_t n, float lr, float momentum, float weight_decay, int t)
{
    if (!velocity || momentum == 0.0f) {
        CDP_SIMD
        for (size_t i = 0; i < n; i++)
            param[i] -= lr * (grad[i] + weight_decay * param[i]);
        return;
    }
    if (t <= 1) {
        CDP_SIMD
        for (size_t i = 0; i < n; i++) {
            float g = grad[i] + weight_decay * param[i];
            velocity[i] = g;
            param[i] -= lr * g;
        }
        return;
    }
    CDP_SIMD
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] + weight_decay * param[i];
        float u = momentum * velocity[i] + g;
        velocity[i] = u;
        param[i] -= lr * u;
    }
}

double cdp_cpu_sum_squares(const float *grad, size_t n)
{
    double acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            acc[k] += (double)grad[i + k] * grad[i + k];
    double s = 0.0;
    for (; i < n; i++)
        s += (double)grad[i] * grad[i];
    for (int k = 0; k < 8; k++)
        s += acc[k];
    return s;
}

void cdp_cpu_scale(float *x, size_t n, float s)
{
    CDP_SIMD
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
}
