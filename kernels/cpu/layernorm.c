/* Layer normalisation over the last dimension on the CPU. Each row is read
 * twice forward (statistics, then output) and twice backward, while it sits
 * in L1; reductions use independent lanes so they vectorise.
 * Shapes: in[N,C], weight/bias[C], mean/rstd[N]. */
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vecmath.h"

#include <math.h>

CDP_CLONES
void cdp_cpu_layernorm_fwd(float *out, float *mean, float *rstd, const float *in,
                           const float *weight, const float *bias, int N, int C, float eps)
{
    for (int i = 0; i < N; i++) {
        const float *restrict x = in + (size_t)i * C;
        float *restrict y = out + (size_t)i * C;
        float m = cdp_vsum(x, C) / (float)C;
        /* Two-pass variance: no cancellation when |mean| >> std. */
        float acc[CDP_LANES] = {0};
        int j = 0;
        for (; j + CDP_LANES <= C; j += CDP_LANES)
            for (int k = 0; k < CDP_LANES; k++) {
                float d = x[j + k] - m;
                acc[k] += d * d;
            }
        float v = 0.0f;
        for (; j < C; j++)
            v += (x[j] - m) * (x[j] - m);
        for (int k = 0; k < CDP_LANES; k++)
            v += acc[k];
        float s = 1.0f / sqrtf(v / (float)C + eps);
        CDP_SIMD
        for (j = 0; j < C; j++)
            y[j] = (x[j] - m) * s * weight[j] + bias[j];
        mean[i] = m;
        rstd[i] = s;
    }
}

CDP_CLONES
void cdp_cpu_layernorm_bwd(float *din, float *dweight, float *dbias, const float *dout,
                           const float *in, const float *weight, const float *mean,
                           const float *rstd, int N, int C)
{
    for (int i = 0; i < N; i++) {
        const float *restrict x = in + (size_t)i * C;
        const float *restrict dy = dout + (size_t)i * C;
        const float *restrict w = weight;
        float m = mean[i], s = rstd[i];
        /* mean of (dy w) and of (dy w) * xhat over the row */
        float a1[CDP_LANES] = {0}, a2[CDP_LANES] = {0};
        int j = 0;
        for (; j + CDP_LANES <= C; j += CDP_LANES)
            for (int k = 0; k < CDP_LANES; k++) {
                float g = dy[j + k] * w[j + k];
                a1[k] += g;
                a2[k] += g * (x[j + k] - m);
            }
        float g1 = 0.0f, g2 = 0.0f;
        for (; j < C; j++) {
            float g = dy[j] * w[j];
            g1 += g;
            g2 += g * (x[j] - m);
        }
        for (int k = 0; k < CDP_LANES; k++) {
            g1 += a1[k];
            g2 += a2[k];
        }
        g1 /= (float)C;
        g2 *= s / (float)C;
        if (din) {
            float *restrict dx = din + (size_t)i * C;
            CDP_SIMD
            for (j = 0; j < C; j++) {
                float xh = (x[j] - m) * s;
                dx[j] += (dy[j] * w[j] - g1 - xh * g2) * s;
            }
        }
        if (dweight) {
            float *restrict dw = dweight;
            CDP_SIMD
            for (j = 0; j < C; j++)
                dw[j] += (x[j] - m) * s * dy[j];
        }
        if (dbias) {
            float *restrict db = dbias;
            CDP_SIMD
            for (j = 0; j < C; j++)
                db[j] += dy[j];
        }
    }
}
