/* Token + learned position embedding on the CPU: a row gather forward, a row
 * scatter-add backward. Shapes: tokens[B,T], wte[V,C], wpe[T,C], out[B,T,C]. */
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vecmath.h"

#include <string.h>

void cdp_cpu_embedding_fwd(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                           int B, int T, int C)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *restrict y = out + ((size_t)b * T + t) * C;
            const float *restrict e = wte + (size_t)tokens[b * T + t] * C;
            if (wpe) {
                const float *restrict p = wpe + (size_t)t * C;
                CDP_SIMD
                for (int c = 0; c < C; c++)
                    y[c] = e[c] + p[c];
            } else {
                memcpy(y, e, (size_t)C * sizeof *y);
            }
        }
}

void cdp_cpu_embedding_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                           int B, int T, int C)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *restrict d = dout + ((size_t)b * T + t) * C;
            if (dwte) {
                float *restrict g = dwte + (size_t)tokens[b * T + t] * C;
                CDP_SIMD
                for (int c = 0; c < C; c++)
                    g[c] += d[c];
            }
            if (dwpe) {
                float *restrict g = dwpe + (size_t)t * C;
                CDP_SIMD
                for (int c = 0; c < C; c++)
                    g[c] += d[c];
            }
        }
}

void cdp_cpu_embedding_vp_fwd(float *out, const int32_t *tokens, const float *wte, const float *wpe, int B, int T,
                              int C, int off, int rows)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *restrict y = out + ((size_t)b * T + t) * C;
            const int32_t tok = tokens[b * T + t];
            const int mine = tok >= off && tok - off < rows;
            const float *restrict e = mine ? wte + (size_t)(tok - off) * C : NULL;
            const float *restrict p = wpe ? wpe + (size_t)t * C : NULL;
            if (e && p) {
                CDP_SIMD
                for (int c = 0; c < C; c++)
                    y[c] = e[c] + p[c];
            } else if (e) {
                memcpy(y, e, (size_t)C * sizeof *y);
            } else if (p) {
                memcpy(y, p, (size_t)C * sizeof *y);
            } else {
                memset(y, 0, (size_t)C * sizeof *y);
            }
        }
}

void cdp_cpu_embedding_vp_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int B, int T,
                              int C, int off, int rows)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *restrict d = dout + ((size_t)b * T + t) * C;
            const int32_t tok = tokens[b * T + t];
            if (dwte && tok >= off && tok - off < rows) {
                float *restrict g = dwte + (size_t)(tok - off) * C;
                CDP_SIMD
                for (int c = 0; c < C; c++)
                    g[c] += d[c];
            }
            if (dwpe) {
                float *restrict g = dwpe + (size_t)t * C;
                CDP_SIMD
                for (int c = 0; c < C; c++)
                    g[c] += d[c];
            }
        }
}
