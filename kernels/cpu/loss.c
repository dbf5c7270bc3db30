/* Losses on the CPU: fused softmax cross-entropy (stable log-sum-exp, so
 * logits of +-1e4 stay finite) and mean squared error. Shapes: logits[N,V],
 * targets[N], pred/target[N,D], losses[N]. Backwards overwrite their output. */
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vecmath.h"

#include <math.h>

CDP_CLONES
void cdp_cpu_crossentropy_fwd(float *losses, const float *logits, const int32_t *targets, int N,
                              int V)
{
    for (int i = 0; i < N; i++) {
        const float *restrict x = logits + (size_t)i * V;
        float m = cdp_vmax(x, V);
        float acc[CDP_LANES] = {0};
        int j = 0;
        for (; j + CDP_LANES <= V; j += CDP_LANES)
            for (int k = 0; k < CDP_LANES; k++)
                acc[k] += cdp_vexpf(x[j + k] - m);
        float s = 0.0f;
        for (; j < V; j++)
            s += cdp_vexpf(x[j] - m);
        for (int k = 0; k < CDP_LANES; k++)
            s += acc[k];
        /* s >= 1 (the maximum contributes exp(0)), so the log is finite;
         * m - x[t] first, so a large shared offset (logits ~ 1e4) cancels
         * exactly instead of rounding log(s) at the offset's scale. */
        losses[i] = logf(s) + (m - x[targets[i]]);
    }
}

CDP_CLONES
void cdp_cpu_crossentropy_bwd(float *dlogits, const float *logits, const int32_t *targets, int N,
                              int V, float scale)
{
    for (int i = 0; i < N; i++) {
        const float *restrict x = logits + (size_t)i * V;
        float *restrict d = dlogits + (size_t)i * V;
        float m = cdp_vmax(x, V);
        float s = cdp_vexp_sum(d, x, m, V);
        float f = scale / s;
        CDP_SIMD
        for (int j = 0; j < V; j++)
            d[j] *= f;
        d[targets[i]] -= scale;
    }
}

/* A row's maximum and total over the group's parts (stats after the sum). */
static void vp_merge(const float *st, int t, float *m_out, float *s_out)
{
    float m = -INFINITY, s = 0.0f;
    for (int j = 0; j < t; j++)
        if (st[j] > m) m = st[j];
    for (int j = 0; j < t; j++)
        if (st[t + j] > 0.0f) s += st[t + j] * expf(st[j] - m);
    *m_out = m;
    *s_out = s;
}

void cdp_cpu_crossentropy_vp_stats(float *stats, const float *logits, const int32_t *targets, int N, int V,
                                   int valid, int off, int k, int t)
{
    const int w = 2 * t + 1;
    for (int i = 0; i < N; i++) {
        const float *restrict x = logits + (size_t)i * V;
        float *restrict st = stats + (size_t)i * w;
        for (int j = 0; j < w; j++)
            st[j] = 0.0f;
        float m = valid > 0 ? cdp_vmax(x, valid) : -INFINITY, s = 0.0f;
        for (int j = 0; j < valid; j++)
            s += expf(x[j] - m);
        st[k] = m;
        st[t + k] = s;
        const int32_t tg = targets[i];
        if (tg >= off && tg - off < valid) st[2 * t] = x[tg - off];
    }
}

void cdp_cpu_crossentropy_vp_fwd(float *losses, const float *stats, int N, int t)
{
    for (int i = 0; i < N; i++) {
        const float *st = stats + (size_t)i * (2 * t + 1);
        float m, s;
        vp_merge(st, t, &m, &s);
        /* as crossentropy_fwd: s >= 1, m - x[t] first */
        losses[i] = logf(s) + (m - st[2 * t]);
    }
}

void cdp_cpu_crossentropy_vp_bwd(float *dlogits, const float *logits, const int32_t *targets, const float *stats,
                                 int N, int V, int valid, int off, int t, float scale)
{
    for (int i = 0; i < N; i++) {
        const float *restrict x = logits + (size_t)i * V;
        float *restrict d = dlogits + (size_t)i * V;
        float m, s;
        vp_merge(stats + (size_t)i * (2 * t + 1), t, &m, &s);
        const float f = scale / s;
        for (int j = 0; j < valid; j++)
            d[j] = expf(x[j] - m) * f;
        for (int j = valid < 0 ? 0 : valid; j < V; j++)
            d[j] = 0.0f;
        const int32_t tg = targets[i];
        if (tg >= off && tg - off < valid) d[tg - off] -= scale;
    }
}

void cdp_cpu_mse_fwd(float *losses, const float *pred, const float *target, int N, int D)
{
    for (int i = 0; i < N; i++) {
        const float *restrict p = pred + (size_t)i * D;
        const float *restrict t = target + (size_t)i * D;
        float acc[CDP_LANES] = {0};
        int j = 0;
        for (; j + CDP_LANES <= D; j += CDP_LANES)
            for (int k = 0; k < CDP_LANES; k++) {
                float e = p[j + k] - t[j + k];
                acc[k] += e * e;
            }
        float s = 0.0f;
        for (; j < D; j++)
            s += (p[j] - t[j]) * (p[j] - t[j]);
        for (int k = 0; k < CDP_LANES; k++)
            s += acc[k];
        losses[i] = s / (float)D;
    }
}

void cdp_cpu_mse_bwd(float *dpred, const float *pred, const float *target, int N, int D,
                     float scale)
{
    float f = 2.0f * scale / (float)D;
    size_t n = (size_t)N * D;
    float *restrict d = dpred;
    const float *restrict p = pred, *restrict t = target;
    CDP_SIMD
    for (size_t i = 0; i < n; i++)
        d[i] = (p[i] - t[i]) * f;
}
