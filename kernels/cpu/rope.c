/* Rotary position embeddings and grouped-query packing on the CPU
 * (kernels/cpu/ops.h). Shapes: q[B,T,NH*HD], k and v [B,T,NKV*HD],
 * qkv[B,T,3C] with C = NH*HD. Each (position, frequency) pair's cosine and
 * sine are computed once and applied to every head of the row. */
#include "kernels/cpu/ops.h"

#include <math.h>

#include "kernels/rope.h"

void cdp_cpu_rope_fwd(float *qkv, const float *q, const float *k, const float *v, int B, int T, int NH, int NKV,
                      int HD, int pos0, const struct cdp_rope *rope)
{
    const int C = NH * HD, KVD = NKV * HD, half = HD / 2, rep = NH / NKV;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const size_t n = (size_t)b * T + t;
            const float *qr = q + n * C, *kr = k + n * KVD, *vr = v + n * KVD;
            float *oq = qkv + n * 3 * C, *ok = oq + C, *ov = ok + C;
            for (int i = 0; i < half; i++) {
                const float a = (float)(t + pos0) * cdp_rope_inv_freq(rope, i, HD);
                const float c = cosf(a), s = sinf(a);
                for (int h = 0; h < NH; h++) {
                    const float x1 = qr[h * HD + i], x2 = qr[h * HD + i + half];
                    oq[h * HD + i] = x1 * c - x2 * s;
                    oq[h * HD + i + half] = x2 * c + x1 * s;
                }
                for (int j = 0; j < NKV; j++) {
                    const float x1 = kr[j * HD + i], x2 = kr[j * HD + i + half];
                    const float y1 = x1 * c - x2 * s, y2 = x2 * c + x1 * s;
                    for (int r = 0; r < rep; r++) {
                        ok[(j * rep + r) * HD + i] = y1;
                        ok[(j * rep + r) * HD + i + half] = y2;
                    }
                }
            }
            for (int j = 0; j < NKV; j++)
                for (int r = 0; r < rep; r++)
                    for (int d = 0; d < HD; d++) ov[(j * rep + r) * HD + d] = vr[j * HD + d];
        }
}

void cdp_cpu_rope_bwd(float *dq, float *dk, float *dv, const float *dqkv, int B, int T, int NH, int NKV, int HD,
                      int pos0, const struct cdp_rope *rope)
{
    const int C = NH * HD, KVD = NKV * HD, half = HD / 2, rep = NH / NKV;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const size_t n = (size_t)b * T + t;
            float *gq = dq + n * C, *gk = dk + n * KVD, *gv = dv + n * KVD;
            const float *iq = dqkv + n * 3 * C, *ik = iq + C, *iv = ik + C;
            for (int i = 0; i < half; i++) {
                const float a = (float)(t + pos0) * cdp_rope_inv_freq(rope, i, HD);
                const float c = cosf(a), s = sinf(a);
                for (int h = 0; h < NH; h++) {
                    const float y1 = iq[h * HD + i], y2 = iq[h * HD + i + half];
                    gq[h * HD + i] += y1 * c + y2 * s;
                    gq[h * HD + i + half] += y2 * c - y1 * s;
                }
                for (int j = 0; j < NKV; j++) {
                    float y1 = 0.0f, y2 = 0.0f;
                    for (int r = 0; r < rep; r++) {
                        y1 += ik[(j * rep + r) * HD + i];
                        y2 += ik[(j * rep + r) * HD + i + half];
                    }
                    gk[j * HD + i] += y1 * c + y2 * s;
                    gk[j * HD + i + half] += y2 * c - y1 * s;
                }
            }
            for (int j = 0; j < NKV; j++)
                for (int d = 0; d < HD; d++) {
                    float y = 0.0f;
                    for (int r = 0; r < rep; r++) y += iv[(j * rep + r) * HD + d];
                    gv[j * HD + d] += y;
                }
        }
}
