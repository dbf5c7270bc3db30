/* Internal to kernels/cpu: branch-free exp and tanh that GCC and Clang
 * auto-vectorise (libm's expf/tanhf are opaque calls that keep every loop
 * around them scalar), and reductions with independent lanes so a plain -O2
 * build vectorises them without -ffast-math. Accuracy: exp within ~2 ulp
 * (Cephes' polynomial); tanh within ~1e-7 absolute, which is what GELU needs. */
#ifndef CDP_KERNELS_CPU_VECMATH_H
#define CDP_KERNELS_CPU_VECMATH_H

#include <stdint.h>
#include <string.h>

#define CDP_LANES 8

/* Elementwise loops carry CDP_SIMD: with -fopenmp-simd (kernels/meson.build
 * adds it where the compiler has it) GCC vectorises them even at -O2, whose
 * "very cheap" cost model otherwise refuses loops needing a scalar tail. */
/* Compute-bound kernels (exp per element) carry CDP_CLONES: GCC builds an
 * x86-64-v4 (AVX-512), a v3 (AVX2) and a baseline copy and picks one at load
 * time, so the library stays portable. Measured 6x on GELU (AVX-512 host).
 * -std=c11 keeps -ffp-contract=off, so the copies round identically. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__ELF__) && \
    __GNUC__ >= 12
#define CDP_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CDP_CLONES
#endif

#if defined(CDP_KERNELS_OMP_SIMD)
#define CDP_SIMD _Pragma("omp simd")
#else
#define CDP_SIMD
#endif

static inline float cdp_bits_to_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* exp(x) for any finite x; results under ~1e-38 flush to exp(-87.3), and
 * arguments above 88 saturate at exp(88) (callers only pass x <= 0). */
static inline float cdp_vexpf(float x)
{
    x = x < -87.3f ? -87.3f : x;
    x = x > 88.0f ? 88.0f : x;
    /* x = n ln2 + r, |r| <= ln2 / 2; rounding by the 1.5 * 2^23 trick avoids rintf. */
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t e = (int32_t)n + 127;
    return p * cdp_bits_to_float((uint32_t)e << 23);
}

/* tanh(x) = sign(x) (1 - e) / (1 + e), e = exp(-2|x|). */
static inline float cdp_vtanhf(float x)
{
    float a = x < 0.0f ? -x : x;
    float e = cdp_vexpf(-2.0f * a);
    float t = (1.0f - e) / (1.0f + e);
    return x < 0.0f ? -t : t;
}

static inline float cdp_vsum(const float *x, int n)
{
    float acc[CDP_LANES] = {0};
    int i = 0;
    for (; i + CDP_LANES <= n; i += CDP_LANES)
        for (int k = 0; k < CDP_LANES; k++)
            acc[k] += x[i + k];
    float s = 0.0f;
    for (; i < n; i++)
        s += x[i];
    for (int k = 0; k < CDP_LANES; k++)
        s += acc[k];
    return s;
}

static inline float cdp_vdot(const float *x, const float *y, int n)
{
    float acc[CDP_LANES] = {0};
    int i = 0;
    for (; i + CDP_LANES <= n; i += CDP_LANES)
        for (int k = 0; k < CDP_LANES; k++)
            acc[k] += x[i + k] * y[i + k];
    float s = 0.0f;
    for (; i < n; i++)
        s += x[i] * y[i];
    for (int k = 0; k < CDP_LANES; k++)
        s += acc[k];
    return s;
}

/* Maximum; NaN does not propagate (callers feed finite logits). */
static inline float cdp_vmax(const float *x, int n)
{
    float acc[CDP_LANES];
    float m = x[0];
    for (int k = 0; k < CDP_LANES; k++)
        acc[k] = m;
    int i = 0;
    for (; i + CDP_LANES <= n; i += CDP_LANES)
        for (int k = 0; k < CDP_LANES; k++)
            acc[k] = x[i + k] > acc[k] ? x[i + k] : acc[k];
    for (; i < n; i++)
        m = x[i] > m ? x[i] : m;
    for (int k = 0; k < CDP_LANES; k++)
        m = acc[k] > m ? acc[k] : m;
    return m;
}

/* y[i] = exp(x[i] - m); returns the sum. */
static inline float cdp_vexp_sum(float *restrict y, const float *restrict x, float m, int n)
{
    float acc[CDP_LANES] = {0};
    int i = 0;
    for (; i + CDP_LANES <= n; i += CDP_LANES)
        for (int k = 0; k < CDP_LANES; k++) {
            float e = cdp_vexpf(x[i + k] - m);
            y[i + k] = e;
            acc[k] += e;
        }
    float s = 0.0f;
    for (; i < n; i++) {
        y[i] = cdp_vexpf(x[i] - m);
        s += y[i];
    }
    for (int k = 0; k < CDP_LANES; k++)
        s += acc[k];
    return s;
}

/* x[i] = exp(x[i] - m) in place; returns the sum. */
static inline float cdp_vexp_sum_inplace(float *x, float m, int n)
{
    float acc[CDP_LANES] = {0};
    int i = 0;
    for (; i + CDP_LANES <= n; i += CDP_LANES) {
        float e[CDP_LANES];
        for (int k = 0; k < CDP_LANES; k++)
            e[k] = cdp_vexpf(x[i + k] - m);
        for (int k = 0; k < CDP_LANES; k++) {
            x[i + k] = e[k];
            acc[k] += e[k];
        }
    }
    float s = 0.0f;
    for (; i < n; i++) {
        x[i] = cdp_vexpf(x[i] - m);
        s += x[i];
    }
    for (int k = 0; k < CDP_LANES; k++)
        s += acc[k];
    return s;
}

#endif
