/* Max pooling on the GPU (NCHW, square window K, stride S, no padding), the
 * semantics of cdp_cpu_maxpool2d_fwd/bwd. Own kernels rather than cuDNN's,
 * because backward needs the argmax the forward saves.
 * Shapes: in[B,C,H,W], out and argmax [B,C,OH,OW], OH = (H - K) / S + 1;
 * argmax holds flat indices into the whole of in. */
#include "kernels/cuda/cuda_state.h"
#include "kernels/cuda/ops_cuda.h"

/* One thread per output element. The comparison is the CPU's, byte for byte:
 * the first maximum in row-major window order wins ties, NaN wins outright. */
static __global__ void maxpool_fwd_kernel(float *out, int32_t *argmax, const float *in, size_t n, int H, int W,
                                          int OH, int OW, int K, int S)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t o = (size_t)blockIdx.x * blockDim.x + threadIdx.x; o < n; o += stride) {
        int ow = (int)(o % (size_t)OW);
        size_t t = o / (size_t)OW;
        int oh = (int)(t % (size_t)OH);
        size_t p = t / (size_t)OH; /* plane: b * C + c */
        const float *plane = in + p * (size_t)H * W;
        int best = (oh * S) * W + ow * S;
        float m = plane[best];
        for (int kh = 0; kh < K; kh++)
            for (int kw = 0; kw < K; kw++) {
                int idx = (oh * S + kh) * W + ow * S + kw;
                float v = plane[idx];
                if (v > m || (v != v && m == m)) {
                    m = v;
                    best = idx;
                }
            }
        out[o] = m;
        argmax[o] = (int32_t)(p * (size_t)H * W + (size_t)best);
    }
}

/* din[argmax[i]] += dout[i]; windows overlap when S < K, hence the atomics. */
static __global__ void maxpool_bwd_kernel(float *din, const float *dout, const int32_t *argmax, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        atomicAdd(din + argmax[i], dout[i]);
}

cdp_status cdp_cuda_maxpool2d_fwd(void *ks, float *out, int32_t *argmax, const float *in, int B, int C, int H,
                                  int W, int K, int S)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (B < 0 || C < 0 || H < 0 || W < 0 || K <= 0 || S <= 0)
        return CDP_CUDA_FAIL(CDP_ERR_INVALID, "maxpool2d_fwd: bad sizes (B %d, C %d, H %d, W %d, K %d, S %d)", B, C,
                             H, W, K, S);
    if (H < K || W < K)
        return CDP_CUDA_FAIL(CDP_ERR_INVALID, "maxpool2d_fwd: a %dx%d window does not fit a %dx%d image", K, K, H,
                             W);
    if ((int64_t)B * C * H * W > INT32_MAX)
        return CDP_CUDA_FAIL(CDP_ERR_INVALID, "maxpool2d_fwd: %d x %d x %d x %d input is too large for int32 argmax",
                             B, C, H, W);
    int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
    size_t n = (size_t)B * C * OH * OW;
    if (n == 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    maxpool_fwd_kernel<<<cdp_cuda_blocks(n, CDP_CUDA_THREADS), CDP_CUDA_THREADS, 0, s->stream>>>(
        out, argmax, in, n, H, W, OH, OW, K, S);
    CDP_CUDA_LAUNCHED("maxpool_fwd_kernel");
    return CDP_OK;
}

cdp_status cdp_cuda_maxpool2d_bwd(void *ks, float *din, const float *dout, const int32_t *argmax, int B, int C,
                                  int OH, int OW)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (B < 0 || C < 0 || OH < 0 || OW < 0)
        return CDP_CUDA_FAIL(CDP_ERR_INVALID, "maxpool2d_bwd: bad sizes (B %d, C %d, OH %d, OW %d)", B, C, OH, OW);
    size_t n = (size_t)B * C * OH * OW;
    if (n == 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    maxpool_bwd_kernel<<<cdp_cuda_blocks(n, CDP_CUDA_THREADS), CDP_CUDA_THREADS, 0, s->stream>>>(din, dout, argmax,
                                                                                                 n);
    CDP_CUDA_LAUNCHED("maxpool_bwd_kernel");
    return CDP_OK;
}
