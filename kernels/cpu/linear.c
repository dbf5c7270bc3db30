/* Linear layer (y = x W^T + b) on the CPU: both products are single sgemm
 * calls over all N rows, so OpenBLAS sees the largest shapes available.
 * Shapes: N rows, IC input features, OC output features; w is [OC, IC]. */
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vecmath.h"

#include <cblas.h>
#include <string.h>

void cdp_cpu_linear_fwd(float *out, const float *in, const float *w, const float *b, int N,
                        int IC, int OC)
{
    float beta = 0.0f;
    if (b) {
        /* Seeding out with the bias and accumulating the product (beta = 1)
         * costs one write pass instead of a read-modify-write pass after it. */
        for (int i = 0; i < N; i++)
            memcpy(out + (size_t)i * OC, b, (size_t)OC * sizeof *out);
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, in, IC, w, IC, beta,
                out, OC);
}

void cdp_cpu_linear_bwd(float *din, float *dw, float *db, const float *dout, const float *in,
                        const float *w, int N, int IC, int OC)
{
    if (din) /* din[N,IC] += dout[N,OC] . w[OC,IC] */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, OC, w, IC,
                    1.0f, din, IC);
    if (dw) /* dw[OC,IC] += dout^T . in */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, in, IC,
                    1.0f, dw, IC);
    if (db) {
        /* Row by row, so each pass is a contiguous, vectorisable add. */
        for (int i = 0; i < N; i++) {
            const float *restrict d = dout + (size_t)i * OC;
            float *restrict g = db;
            CDP_SIMD
            for (int o = 0; o < OC; o++)
                g[o] += d[o];
        }
    }
}
