/* 2-D convolution (NCHW, square kernel K, stride S, zero padding P) through
 * im2col and one sgemm per image, and max pooling. Shapes: in[B,IC,H,W],
 * w[OC,IC,K,K], b[OC], out[B,OC,OH,OW], col[IC*K*K, OH*OW] (scratch).
 * The 1x1, stride-1, unpadded case needs no im2col: the image is the matrix. */
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vecmath.h"

#include "cdp/core.h"

#include <cblas.h>
#include <string.h>

/* Output positions ow in [lo, hi) read an input column inside [0, W). */
static void valid_range(int OW, int W, int S, int off, int *lo, int *hi)
{
    /* iw = ow * S + off must satisfy 0 <= iw < W */
    int l = off >= 0 ? 0 : (-off + S - 1) / S;
    int h = W - off <= 0 ? 0 : (W - off + S - 1) / S;
    if (h > OW) h = OW;
    if (l > h) l = h;
    *lo = l;
    *hi = h;
}

static void im2col(float *col, const float *img, int IC, int H, int W, int K, int S, int P,
                   int OH, int OW)
{
    for (int c = 0; c < IC; c++)
        for (int kh = 0; kh < K; kh++)
            for (int kw = 0; kw < K; kw++) {
                float *restrict dst = col + ((size_t)(c * K + kh) * K + kw) * OH * OW;
                int lo, hi;
                valid_range(OW, W, S, kw - P, &lo, &hi);
                for (int oh = 0; oh < OH; oh++) {
                    float *restrict row = dst + (size_t)oh * OW;
                    int ih = oh * S - P + kh;
                    if (ih < 0 || ih >= H) {
                        memset(row, 0, (size_t)OW * sizeof *row);
                        continue;
                    }
                    const float *restrict src = img + ((size_t)c * H + ih) * W;
                    int off = kw - P;
                    for (int ow = 0; ow < lo; ow++)
                        row[ow] = 0.0f;
                    if (S == 1) {
                        if (hi > lo)
                            memcpy(row + lo, src + lo + off, (size_t)(hi - lo) * sizeof *row);
                    } else {
                        for (int ow = lo; ow < hi; ow++)
                            row[ow] = src[ow * S + off];
                    }
                    for (int ow = hi; ow < OW; ow++)
                        row[ow] = 0.0f;
                }
            }
}

/* img += col2im(col): the adjoint of im2col. */
static void col2im_add(float *img, const float *col, int IC, int H, int W, int K, int S, int P,
                       int OH, int OW)
{
    for (int c = 0; c < IC; c++)
        for (int kh = 0; kh < K; kh++)
            for (int kw = 0; kw < K; kw++) {
                const float *restrict srcc = col + ((size_t)(c * K + kh) * K + kw) * OH * OW;
                int lo, hi;
                valid_range(OW, W, S, kw - P, &lo, &hi);
                for (int oh = 0; oh < OH; oh++) {
                    int ih = oh * S - P + kh;
                    if (ih < 0 || ih >= H) continue;
                    const float *restrict row = srcc + (size_t)oh * OW;
                    float *restrict dst = img + ((size_t)c * H + ih) * W;
                    int off = kw - P;
                    for (int ow = lo; ow < hi; ow++)
                        dst[ow * S + off] += row[ow];
                }
            }
}

void cdp_cpu_conv2d_fwd(float *out, float *col, const float *in, const float *w, const float *b,
                        int B, int IC, int H, int W, int OC, int K, int S, int P)
{
    int OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1;
    CDP_ASSERT(OH > 0 && OW > 0);
    int KK = IC * K * K, HW = OH * OW;
    int direct = K == 1 && S == 1 && P == 0;
    for (int n = 0; n < B; n++) {
        const float *img = in + (size_t)n * IC * H * W;
        float *y = out + (size_t)n * OC * HW;
        const float *m = img;
        if (!direct) {
            im2col(col, img, IC, H, W, K, S, P, OH, OW);
            m = col;
        }
        float beta = 0.0f;
        if (b) {
            for (int o = 0; o < OC; o++) {
                float *restrict r = y + (size_t)o * HW;
                CDP_SIMD
                for (int j = 0; j < HW; j++)
                    r[j] = b[o];
            }
            beta = 1.0f;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, OC, HW, KK, 1.0f, w, KK, m, HW,
                    beta, y, HW);
    }
}

void cdp_cpu_conv2d_bwd(float *din, float *dw, float *db, float *col, const float *dout,
                        const float *in, const float *w, int B, int IC, int H, int W, int OC,
                        int K, int S, int P)
{
    int OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1;
    CDP_ASSERT(OH > 0 && OW > 0);
    int KK = IC * K * K, HW = OH * OW;
    int direct = K == 1 && S == 1 && P == 0;
    for (int n = 0; n < B; n++) {
        const float *img = in + (size_t)n * IC * H * W;
        const float *dy = dout + (size_t)n * OC * HW;
        if (dw) { /* dw[OC, KK] += dy[OC, HW] . col[KK, HW]^T */
            const float *m = img;
            if (!direct) {
                im2col(col, img, IC, H, W, K, S, P, OH, OW);
                m = col;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, OC, KK, HW, 1.0f, dy, HW, m, HW,
                        1.0f, dw, KK);
        }
        if (db)
            for (int o = 0; o < OC; o++) {
                const float *restrict r = dy + (size_t)o * HW;
                float s = 0.0f;
                for (int j = 0; j < HW; j++)
                    s += r[j];
                db[o] += s;
            }
        if (din) { /* dcol[KK, HW] = w^T . dy, then scattered back onto the image */
            float *dimg = din + (size_t)n * IC * H * W;
            if (direct) {
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, KK, HW, OC, 1.0f, w, KK, dy,
                            HW, 1.0f, dimg, HW);
            } else {
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, KK, HW, OC, 1.0f, w, KK, dy,
                            HW, 0.0f, col, HW);
                col2im_add(dimg, col, IC, H, W, K, S, P, OH, OW);
            }
        }
    }
}

void cdp_cpu_maxpool2d_fwd(float *out, int32_t *argmax, const float *in, int B, int C, int H,
                           int W, int K, int S)
{
    int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
    CDP_ASSERT(OH > 0 && OW > 0);
    CDP_ASSERT((int64_t)B * C * H * W <= INT32_MAX);
    for (int p = 0; p < B * C; p++) {
        const float *plane = in + (size_t)p * H * W;
        for (int oh = 0; oh < OH; oh++)
            for (int ow = 0; ow < OW; ow++) {
                int best = (oh * S) * W + ow * S;
                float m = plane[best];
                for (int kh = 0; kh < K; kh++)
                    for (int kw = 0; kw < K; kw++) {
                        int idx = (oh * S + kh) * W + ow * S + kw;
                        float v = plane[idx];
                        /* first maximum wins on ties, NaN wins outright: as PyTorch */
                        if (v > m || (v != v && m == m)) {
                            m = v;
                            best = idx;
                        }
                    }
                size_t o = ((size_t)p * OH + oh) * OW + ow;
                out[o] = m;
                argmax[o] = (int32_t)((size_t)p * H * W + (size_t)best);
            }
    }
}

void cdp_cpu_maxpool2d_bwd(float *din, const float *dout, const int32_t *argmax, int B, int C,
                           int OH, int OW)
{
    size_t n = (size_t)B * C * OH * OW;
    for (size_t i = 0; i < n; i++)
        din[argmax[i]] += dout[i];
}
