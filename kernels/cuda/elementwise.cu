/* Memory-bound elementwise ops on the GPU (zero, copy, add, scale, ReLU,
 * GELU, residual) and the sum of squares behind clipping by global norm.
 * Semantics and arithmetic order follow kernels/cpu/activation.c and optim.c.
 * n is an element count and may exceed 2^31: indices are size_t and every
 * kernel is a grid-stride loop. */
#include "kernels/cuda/cuda_state.h"
#include "kernels/cuda/ops_cuda.h"

#include <stdint.h>

#define GELU_S 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_A 0.044715f

/* Blocks of the first sum-of-squares pass; fixed (not taken from the device)
 * so that the summation order, and the result, depend on n alone. */
#define SUMSQ_BLOCKS 1024u

#define FOR_EACH_INDEX(i, n)                                                              \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);               \
         i += (size_t)gridDim.x * blockDim.x)

static __global__ void add_kernel(float *dst, const float *src, size_t n)
{
    FOR_EACH_INDEX(i, n) dst[i] += src[i];
}

static __global__ void scale_kernel(float *x, size_t n, float s)
{
    FOR_EACH_INDEX(i, n) x[i] *= s;
}

/* out may be in (in place), so no __restrict__ on forwards */
static __global__ void relu_fwd_kernel(float *out, const float *in, size_t n)
{
    FOR_EACH_INDEX(i, n)
    {
        float x = in[i];
        out[i] = x > 0.0f ? x : 0.0f;
    }
}

static __global__ void relu_bwd_kernel(float *__restrict__ din, const float *__restrict__ dout,
                                       const float *__restrict__ in, size_t n)
{
    FOR_EACH_INDEX(i, n)
    {
        float d = dout[i];
        din[i] += in[i] > 0.0f ? d : 0.0f;
    }
}

static __global__ void gelu_fwd_kernel(float *out, const float *in, size_t n)
{
    FOR_EACH_INDEX(i, n)
    {
        float x = in[i];
        float u = GELU_S * (x + GELU_A * x * x * x);
        out[i] = 0.5f * x * (1.0f + tanhf(u));
    }
}

/* the CPU's form: 0.5 (1 + tanh(u)) = sigmoid(2u) */
static __global__ void gelu_bwd_kernel(float *__restrict__ din, const float *__restrict__ dout,
                                       const float *__restrict__ in, size_t n)
{
    FOR_EACH_INDEX(i, n)
    {
        float x = in[i];
        float u = GELU_S * (x + GELU_A * x * x * x);
        float s = 1.0f / (1.0f + expf(-2.0f * u));
        float du = GELU_S * (1.0f + 3.0f * GELU_A * x * x);
        din[i] += (s + 2.0f * x * s * (1.0f - s) * du) * dout[i];
    }
}

/* d[i] *= GELU'(pre[i]), in place (the linear + GELU backward, linear.cu) */
static __global__ void gelu_grad_scale_kernel(float *__restrict__ d, const float *__restrict__ pre, size_t n)
{
    FOR_EACH_INDEX(i, n)
    {
        float x = pre[i];
        float u = GELU_S * (x + GELU_A * x * x * x);
        float s = 1.0f / (1.0f + expf(-2.0f * u));
        float du = GELU_S * (1.0f + 3.0f * GELU_A * x * x);
        d[i] *= s + 2.0f * x * s * (1.0f - s) * du;
    }
}

static __global__ void residual_fwd_kernel(float *out, const float *a, const float *b, size_t n)
{
    FOR_EACH_INDEX(i, n) out[i] = a[i] + b[i];
}

static __global__ void residual_bwd_kernel(float *__restrict__ da, float *__restrict__ db,
                                           const float *__restrict__ dout, size_t n)
{
    FOR_EACH_INDEX(i, n)
    {
        float d = dout[i];
        da[i] += d;
        db[i] += d;
    }
}

/* Sum over the block in a fixed order (deterministic); every thread gets it.
 * blockDim.x is a multiple of 32, at most 1024. */
static __device__ double block_sum_double(double v)
{
    __shared__ double part[32];
    unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (blockDim.x >> 5) ? part[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1)
            v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) part[0] = v;
    }
    __syncthreads();
    return part[0];
}

/* Each thread squares and sums in double (as the CPU does), one partial per block. */
static __global__ void sum_squares_partial_kernel(double *partial, const float *x, size_t n)
{
    double acc = 0.0;
    FOR_EACH_INDEX(i, n)
    {
        double v = (double)x[i];
        acc += v * v;
    }
    acc = block_sum_double(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

static __global__ void sum_squares_final_kernel(double *out, const double *partial, unsigned nparts)
{
    double acc = 0.0;
    for (unsigned i = threadIdx.x; i < nparts; i += blockDim.x)
        acc += partial[i];
    acc = block_sum_double(acc);
    if (threadIdx.x == 0) *out = acc;
}

cdp_status cdp_cuda_zero(void *ks, void *p, size_t bytes)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (bytes == 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    CDP_CUDA_TRY(cudaMemsetAsync(p, 0, bytes, s->stream));
    return CDP_OK;
}

cdp_status cdp_cuda_copy(void *ks, void *dst, const void *src, size_t bytes)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (bytes == 0 || dst == src) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    uintptr_t d = (uintptr_t)dst, a = (uintptr_t)src;
    if (d < a + bytes && a < d + bytes) {
        /* The CPU table's copy is memmove; cudaMemcpy is undefined on
         * overlapping ranges, so stage through the workspace. */
        void *ws;
        cdp_status rc = cdp_cuda_workspace(s, bytes, &ws);
        if (rc != CDP_OK) return rc;
        CDP_CUDA_TRY(cudaMemcpyAsync(ws, src, bytes, cudaMemcpyDeviceToDevice, s->stream));
        CDP_CUDA_TRY(cudaMemcpyAsync(dst, ws, bytes, cudaMemcpyDeviceToDevice, s->stream));
        return CDP_OK;
    }
    CDP_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s->stream));
    return CDP_OK;
}

cdp_status cdp_cuda_add(void *ks, float *dst, const float *src, size_t n)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (n == 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    add_kernel<<<cdp_cuda_blocks(n, CDP_CUDA_THREADS), CDP_CUDA_THREADS, 0, s->stream>>>(dst, src, n);
    CDP_CUDA_LAUNCHED("add_kernel");
    return CDP_OK;
}

cdp_status cdp_cuda_scale(void *ks, float *x, size_t n, float sc)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (n == 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    scale_kernel<<<cdp_cuda_blocks(n, CDP_CUDA_THREADS), CDP_CUDA_THREADS, 0, s->stream>>>(x, n, sc);
    CDP_CUDA_LAUNCHED("scale_kernel");
    return CDP_OK;
}

cdp_status cdp_cuda_sum_squares(void *ks, const float *x, size_t n, double *out)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (n == 0) {
        *out = 0.0;
        return CDP_OK;
    }
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    if (!s->host_result) CDP_CUDA_TRY(cudaMallocHost((void **)&s->host_result, sizeof(double)));
    unsigned nparts = cdp_cuda_blocks(n, CDP_CUDA_THREADS);
    if (nparts > SUMSQ_BLOCKS) nparts = SUMSQ_BLOCKS;
    void *ws;
    cdp_status rc = cdp_cuda_workspace(s, ((size_t)nparts + 1) * sizeof(double), &ws);
    if (rc != CDP_OK) return rc;
    double *partial = (double *)ws, *result = partial + nparts;
    sum_squares_partial_kernel<<<nparts, CDP_CUDA_THREADS, 0, s->stream>>>(partial, x, n);
    CDP_CUDA_LAUNCHED("sum_squares_partial_kernel");
    sum_squares_final_kernel<<<1, 1024, 0, s->stream>>>(result, partial, nparts);
    CDP_CUDA_LAUNCHED("sum_squares_final_kernel");
    CDP_CUDA_TRY(cudaMemcpyAsync(s->host_result, result, sizeof(double), cudaMemcpyDeviceToHost, s->stream));
    CDP_CUDA_TRY(cudaStreamSynchronize(s->stream));
    *out = *s->host_result;
    return CDP_OK;
}

cdp_status cdp_cuda_relu_fwd(void *ks, float *out, const float *in, size_t n)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (n == 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    relu_fwd_kernel<<<cdp_cuda_blocks(n, CDP_CUDA_THREADS), CDP_CUDA_THREADS, 0, s->stream>>>(out, in, n);
    CDP_CUDA_LAUNCHED("relu_fwd_kernel");
    return CDP_OK;
}

cdp_status cdp_cuda_relu_bwd(void *ks, float *din, const float *dout, const float *in, size_t n)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (n == 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    relu_bwd_kernel<<<cdp_cuda_blocks(n, CDP_CUDA_THREADS), CDP_CUDA_THREADS, 0, s->stream>>>(din, dout, in, n);
    CDP_CUDA_LAUNCHED("relu_bwd_kernel");
    return CDP_OK;
}

cdp_status cdp_cuda_gelu_fwd(void *ks, float *out, const float *in, size_t n)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (n == 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    gelu_fwd_kernel<<<cdp_cuda_blocks(n, CDP_CUDA_THREADS), CDP_CUDA_THREADS, 0, s->stream>>>(out, in, n);
    CDP_CUDA_LAUNCHED("gelu_fwd_kernel");
    return CDP_OK;
}

cdp_status cdp_cuda_gelu_bwd(void *ks, float *din, const float *dout, const float *in, size_t n)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (n == 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    gelu_bwd_kernel<<<cdp_cuda_blocks(n, CDP_CUDA_THREADS), CDP_CUDA_THREADS, 0, s->stream>>>(din, dout, in, n);
    CDP_CUDA_LAUNCHED("gelu_bwd_kernel");
    return CDP_OK;
}

cdp_status cdp_cuda_gelu_grad_scale(void *ks, float *d, const float *pre, size_t n)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (n == 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    gelu_grad_scale_kernel<<<cdp_cuda_blocks(n, CDP_CUDA_THREADS), CDP_CUDA_THREADS, 0, s->stream>>>(d, pre, n);
    CDP_CUDA_LAUNCHED("gelu_grad_scale_kernel");
    return CDP_OK;
}

cdp_status cdp_cuda_residual_fwd(void *ks, float *out, const float *a, const float *b, size_t n)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (n == 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    residual_fwd_kernel<<<cdp_cuda_blocks(n, CDP_CUDA_THREADS), CDP_CUDA_THREADS, 0, s->stream>>>(out, a, b, n);
    CDP_CUDA_LAUNCHED("residual_fwd_kernel");
    return CDP_OK;
}

cdp_status cdp_cuda_residual_bwd(void *ks, float *da, float *db, const float *dout, size_t n)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (n == 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    residual_bwd_kernel<<<cdp_cuda_blocks(n, CDP_CUDA_THREADS), CDP_CUDA_THREADS, 0, s->stream>>>(da, db, dout, n);
    CDP_CUDA_LAUNCHED("residual_bwd_kernel");
    return CDP_OK;
}
