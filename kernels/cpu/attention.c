/* Multi-head self-attention on the CPU. Every product is an sgemm per
 * (batch, head) that reads q, k, v straight out of the packed qkv[B,T,3C]
 * through leading dimension 3C, so nothing is copied. Causal attention works
 * in row blocks of ATT_BLOCK: block [i0, i1) only needs key columns [0, i1),
 * which skips most masked work when T is large; masked probabilities are
 * stored as exact zeros. Shapes: qkv[B,T,3C] (q | k | v, head h at columns
 * h*HS), out[B,T,C], att[B,NH,T,T], HS = C / NH. */
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vecmath.h"

#include "cdp/core.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#define ATT_BLOCK 64

static inline int block_end(int i, int T)
{
    int e = (i / ATT_BLOCK + 1) * ATT_BLOCK;
    return e < T ? e : T;
}

/* Row-wise softmax of the scores in a[T,T], in place; masked entries (j > i
 * when causal) become exact zeros. */
CDP_CLONES
static void softmax_rows(float *a, int T, int causal)
{
    for (int i = 0; i < T; i++) {
        float *r = a + (size_t)i * T;
        int n = causal ? i + 1 : T;
        float m = cdp_vmax(r, n);
        float f = 1.0f / cdp_vexp_sum_inplace(r, m, n);
        CDP_SIMD
        for (int j = 0; j < n; j++)
            r[j] *= f;
        if (n < T)
            memset(r + n, 0, (size_t)(T - n) * sizeof *r);
    }
}

/* ds = scale * att * (datt - rowsum(att * datt)), in place over datt. Causal
 * rows are zeroed up to the end of their row block, the columns the blocked
 * GEMMs that follow read. */
CDP_CLONES
static void softmax_bwd_rows(float *ds, const float *a, int T, int causal, float scale)
{
    for (int i = 0; i < T; i++) {
        const float *ar = a + (size_t)i * T;
        float *dr = ds + (size_t)i * T;
        int n = causal ? i + 1 : T;
        float dot = cdp_vdot(ar, dr, n);
        CDP_SIMD
        for (int j = 0; j < n; j++)
            dr[j] = scale * ar[j] * (dr[j] - dot);
        int e = causal ? block_end(i, T) : T;
        for (int j = n; j < e; j++)
            dr[j] = 0.0f;
    }
}

void cdp_cpu_attention_fwd(float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                           int causal)
{
    CDP_ASSERT(NH > 0 && C % NH == 0);
    int HS = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)HS);
    int blk = causal ? ATT_BLOCK : T;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + (size_t)h * HS;
            const float *k = q + C, *v = q + 2 * C;
            float *a = att + ((size_t)b * NH + h) * T * T;
            float *o = out + (size_t)b * T * C + (size_t)h * HS;
            /* scores = scale q k^T */
            for (int i0 = 0; i0 < T; i0 += blk) {
                int i1 = i0 + blk < T ? i0 + blk : T;
                int ncol = causal ? i1 : T;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, i1 - i0, ncol, HS, scale,
                            q + (size_t)i0 * C3, C3, k, C3, 0.0f, a + (size_t)i0 * T, T);
            }
            softmax_rows(a, T, causal);
            /* out = att v */
            for (int i0 = 0; i0 < T; i0 += blk) {
                int i1 = i0 + blk < T ? i0 + blk : T;
                int ncol = causal ? i1 : T;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i1 - i0, HS, ncol, 1.0f,
                            a + (size_t)i0 * T, T, v, C3, 0.0f, o + (size_t)i0 * C, C);
            }
        }
}

double cdp_cpu_attention_gemm_flops(int T, int C, int causal, int backward)
{
    /* S: score entries computed (rows x columns of each block); R: rows summed
     * over by the transposed products of the backward. Same loops as below. */
    const int64_t blk = causal ? ATT_BLOCK : T;
    double S = 0, R = 0;
    for (int64_t i0 = 0; i0 < T; i0 += blk) { /* 64-bit: i0 + blk may pass INT_MAX */
        const int64_t i1 = i0 + blk < T ? i0 + blk : T;
        S += (double)(i1 - i0) * (causal ? i1 : T);
        R += (double)(i1 - i0) * (T - (causal ? i0 : 0));
    }
    /* per head 2*HS per entry; heads together 2*C */
    return backward ? 4.0 * C * (S + R) : 4.0 * C * S;
}

void cdp_cpu_attention_bwd(float *dqkv, const float *dout, const float *qkv, const float *att,
                           float *scratch, int B, int T, int C, int NH, int causal)
{
    CDP_ASSERT(NH > 0 && C % NH == 0);
    int HS = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)HS);
    int blk = causal ? ATT_BLOCK : T;
    float *ds = scratch; /* datt, then dscores, [T,T] */
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + (size_t)h * HS;
            const float *k = q + C, *v = q + 2 * C;
            float *dq = dqkv + (size_t)b * T * C3 + (size_t)h * HS;
            float *dk = dq + C, *dv = dq + 2 * C;
            const float *a = att + ((size_t)b * NH + h) * T * T;
            const float *dO = dout + (size_t)b * T * C + (size_t)h * HS;
            /* Row block [i0, i1) touches columns [0, i1) of datt / dscores;
             * column block [j0, j1) sums over rows [j0, T) (causal). */
            for (int i0 = 0; i0 < T; i0 += blk) {
                int i1 = i0 + blk < T ? i0 + blk : T;
                int ncol = causal ? i1 : T;
                /* datt = dout v^T */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, i1 - i0, ncol, HS, 1.0f,
                            dO + (size_t)i0 * C, C, v, C3, 0.0f, ds + (size_t)i0 * T, T);
                /* dv += att^T dout, for the value rows of this block */
                int r0 = causal ? i0 : 0;
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, i1 - i0, HS, T - r0, 1.0f,
                            a + (size_t)r0 * T + i0, T, dO + (size_t)r0 * C, C, 1.0f,
                            dv + (size_t)i0 * C3, C3);
            }
            softmax_bwd_rows(ds, a, T, causal, scale);
            for (int i0 = 0; i0 < T; i0 += blk) {
                int i1 = i0 + blk < T ? i0 + blk : T;
                int ncol = causal ? i1 : T;
                int r0 = causal ? i0 : 0;
                /* dq += ds k */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i1 - i0, HS, ncol, 1.0f,
                            ds + (size_t)i0 * T, T, k, C3, 1.0f, dq + (size_t)i0 * C3, C3);
                /* dk += ds^T q */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, i1 - i0, HS, T - r0, 1.0f,
                            ds + (size_t)r0 * T + i0, T, q + (size_t)r0 * C3, C3, 1.0f,
                            dk + (size_t)i0 * C3, C3);
            }
        }
}
