/* RMS normalisation over the last dimension on the CPU (Llama's RMSNorm, in
 * float32 as Hugging Face computes it). Shapes: in[N,C], weight[C], rstd[N]. */
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vecmath.h"

#include <math.h>

void cdp_cpu_rmsnorm_fwd(float *out, float *rstd, const float *in, const float *weight, int N, int C, float eps)
{
    for (int i = 0; i < N; i++) {
        const float *restrict x = in + (size_t)i * C;
        float *restrict y = out + (size_t)i * C;
        float acc[CDP_LANES] = {0}, ss = 0.0f;
        int j = 0;
        for (; j + CDP_LANES <= C; j += CDP_LANES)
            for (int k = 0; k < CDP_LANES; k++) acc[k] += x[j + k] * x[j + k];
        for (; j < C; j++) ss += x[j] * x[j];
        for (int k = 0; k < CDP_LANES; k++) ss += acc[k];
        const float s = 1.0f / sqrtf(ss / (float)C + eps);
        CDP_SIMD
        for (j = 0; j < C; j++) y[j] = weight[j] * (x[j] * s);
        rstd[i] = s;
    }
}

/* y = w x r, r = (mean(x^2) + eps)^-1/2: dx_j = r (w_j dy_j - x_j r^2 sum_k(w_k dy_k x_k) / C) */
void cdp_cpu_rmsnorm_bwd(float *din, float *dweight, const float *dout, const float *in, const float *weight,
                         const float *rstd, int N, int C)
{
    for (int i = 0; i < N; i++) {
        const float *restrict x = in + (size_t)i * C;
        const float *restrict dy = dout + (size_t)i * C;
        const float s = rstd[i];
        if (din) {
            float acc[CDP_LANES] = {0}, g = 0.0f;
            int j = 0;
            for (; j + CDP_LANES <= C; j += CDP_LANES)
                for (int k = 0; k < CDP_LANES; k++) acc[k] += dy[j + k] * weight[j + k] * x[j + k];
            for (; j < C; j++) g += dy[j] * weight[j] * x[j];
            for (int k = 0; k < CDP_LANES; k++) g += acc[k];
            g *= s * s / (float)C;
            float *restrict dx = din + (size_t)i * C;
            CDP_SIMD
            for (j = 0; j < C; j++) dx[j] += s * (dy[j] * weight[j] - x[j] * g);
        }
        if (dweight) {
            float *restrict dw = dweight;
            CDP_SIMD
            for (int j = 0; j < C; j++) dw[j] += dy[j] * (x[j] * s);
        }
    }
}
