/* The frequencies of rotary position embeddings, one home for the CPU and the
 * CUDA kernels (valid C and CUDA C++). They follow Hugging Face's Llama
 * (LlamaRotaryEmbedding and its "llama3" rope_type) step by step in float32,
 * as it computes them even for a float64 model, so that angles agree with it
 * to the last bit where the libraries' pow and cos do: inv_freq[i] =
 * 1 / theta^(2i/HD), then (llama3) frequencies whose wavelength is past
 * original_context / low_freq_factor divided by factor, those under
 * original_context / high_freq_factor kept, and those between blended. */
#ifndef CDP_KERNELS_ROPE_H
#define CDP_KERNELS_ROPE_H

#include <math.h>

#include "cdp/plan_types.h"

#ifdef __CUDACC__
#define CDP_ROPE_FN static inline __host__ __device__
#else
#define CDP_ROPE_FN static inline
#endif

/* Frequency i (0 <= i < HD/2) of a head of HD dimensions. */
CDP_ROPE_FN float cdp_rope_inv_freq(const struct cdp_rope *r, int i, int HD)
{
    const float e = (float)(2 * i) / (float)HD;
    float f = 1.0f / powf((float)r->theta, e);
    if (r->factor > 0) {
        const float factor = (float)r->factor, lo = (float)r->low_freq_factor, hi = (float)r->high_freq_factor;
        const float old = (float)r->original_context;
        const float low_wavelen = old / lo, high_wavelen = old / hi;
        const float wavelen = 2.0f * 3.14159265358979323846f / f;
        if (wavelen > low_wavelen) {
            f = f / factor;
        } else if (!(wavelen < high_wavelen)) {
            const float smooth = (old / wavelen - lo) / (hi - lo);
            f = (1.0f - smooth) * f / factor + smooth * f;
        }
    }
    return f;
}

#undef CDP_ROPE_FN

#endif
