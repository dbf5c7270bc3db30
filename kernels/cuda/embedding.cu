/* Token + learned position embedding on the GPU, matching
 * kernels/cpu/embedding.c: a row gather forward, a row scatter-add backward.
 * Shapes: tokens[B,T], wte[V,C], wpe[T,C], out/dout[B,T,C]. Token ids are
 * checked by the caller. */
#include "kernels/cuda/cuda_state.h"
#include "kernels/cuda/ops_cuda.h"

/* Threads for one row of C channels: a warp multiple, at most CDP_CUDA_THREADS. */
static unsigned row_threads(int C)
{
    unsigned t = ((unsigned)C + 31u) & ~31u;
    return t > CDP_CUDA_THREADS ? CDP_CUDA_THREADS : t;
}

/* one block per (b, t) row */
static __global__ void embedding_fwd_kernel(float *__restrict__ out, const int32_t *__restrict__ tokens,
                                            const float *__restrict__ wte, const float *__restrict__ wpe, int T,
                                            int C)
{
    int row = blockIdx.x;
    float *y = out + (size_t)row * C;
    const float *e = wte + (size_t)tokens[row] * C;
    if (wpe) {
        const float *p = wpe + (size_t)(row % T) * C;
        for (int c = threadIdx.x; c < C; c += blockDim.x)
            y[c] = e[c] + p[c];
    } else {
        for (int c = threadIdx.x; c < C; c += blockDim.x)
            y[c] = e[c];
    }
}

/* One block per (b, t) row. Rows with the same token add into the same dwte
 * row, so this scatters with atomicAdd: the order of those additions, and so
 * the last bits of dwte, vary from run to run (accepted for this op). */
static __global__ void embedding_bwd_wte_kernel(float *dwte, const float *__restrict__ dout,
                                                const int32_t *__restrict__ tokens, int C)
{
    int row = blockIdx.x;
    const float *d = dout + (size_t)row * C;
    float *g = dwte + (size_t)tokens[row] * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        atomicAdd(&g[c], d[c]);
}

/* dwpe[t,c] += dout[b,t,c] for b = 0.. B-1 in order, one thread per (t, c):
 * deterministic, and the same additions in the same order as the CPU. */
static __global__ void embedding_bwd_wpe_kernel(float *__restrict__ dwpe, const float *__restrict__ dout, int B,
                                                size_t TC)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < TC; i += (size_t)gridDim.x * blockDim.x) {
        float g = dwpe[i];
        for (int b = 0; b < B; b++)
            g += dout[(size_t)b * TC + i];
        dwpe[i] = g;
    }
}

cdp_status cdp_cuda_embedding_fwd(void *ks, float *out, const int32_t *tokens, const float *wte,
                                  const float *wpe, int B, int T, int C)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (B <= 0 || T <= 0 || C <= 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    unsigned rows = (unsigned)B * (unsigned)T;
    embedding_fwd_kernel<<<rows, row_threads(C), 0, s->stream>>>(out, tokens, wte, wpe, T, C);
    CDP_CUDA_LAUNCHED("embedding_fwd_kernel");
    return CDP_OK;
}

cdp_status cdp_cuda_embedding_bwd(void *ks, float *dwte, float *dwpe, const float *dout,
                                  const int32_t *tokens, int B, int T, int C)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (B <= 0 || T <= 0 || C <= 0) return CDP_OK;
    if (!dwte && !dwpe) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    if (dwte) {
        unsigned rows = (unsigned)B * (unsigned)T;
        embedding_bwd_wte_kernel<<<rows, row_threads(C), 0, s->stream>>>(dwte, dout, tokens, C);
        CDP_CUDA_LAUNCHED("embedding_bwd_wte_kernel");
    }
    if (dwpe) {
        size_t TC = (size_t)T * C;
        embedding_bwd_wpe_kernel<<<cdp_cuda_blocks(TC, CDP_CUDA_THREADS), CDP_CUDA_THREADS, 0, s->stream>>>(
            dwpe, dout, B, TC);
        CDP_CUDA_LAUNCHED("embedding_bwd_wpe_kernel");
    }
    return CDP_OK;
}

/* Vocab-parallel (kernels/ops.h): wte holds rows [off, off + rows) of the
 * whole table; one block per (b, t) row, tokens outside the slice give 0
 * (plus wpe) */
static __global__ void embedding_vp_fwd_kernel(float *__restrict__ out, const int32_t *__restrict__ tokens,
                                               const float *__restrict__ wte, const float *__restrict__ wpe, int T,
                                               int C, int off, int rows)
{
    int row = blockIdx.x;
    float *y = out + (size_t)row * C;
    const int tok = tokens[row];
    const float *e = tok >= off && tok - off < rows ? wte + (size_t)(tok - off) * C : NULL;
    const float *p = wpe ? wpe + (size_t)(row % T) * C : NULL;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        y[c] = e && p ? e[c] + p[c] : e ? e[c] : p ? p[c] : 0.0f;
}

static __global__ void embedding_vp_bwd_wte_kernel(float *dwte, const float *__restrict__ dout,
                                                   const int32_t *__restrict__ tokens, int C, int off, int rows)
{
    int row = blockIdx.x;
    const int tok = tokens[row];
    if (tok < off || tok - off >= rows) return; /* uniform over the block */
    const float *d = dout + (size_t)row * C;
    float *g = dwte + (size_t)(tok - off) * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        atomicAdd(&g[c], d[c]);
}

cdp_status cdp_cuda_embedding_vp_fwd(void *ks, float *out, const int32_t *tokens, const float *wte,
                                     const float *wpe, int B, int T, int C, int off, int rows)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (B <= 0 || T <= 0 || C <= 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    unsigned n = (unsigned)B * (unsigned)T;
    embedding_vp_fwd_kernel<<<n, row_threads(C), 0, s->stream>>>(out, tokens, wte, wpe, T, C, off, rows);
    CDP_CUDA_LAUNCHED("embedding_vp_fwd_kernel");
    return CDP_OK;
}

cdp_status cdp_cuda_embedding_vp_bwd(void *ks, float *dwte, float *dwpe, const float *dout,
                                     const int32_t *tokens, int B, int T, int C, int off, int rows)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (B <= 0 || T <= 0 || C <= 0) return CDP_OK;
    if (!dwte && !dwpe) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    if (dwte && rows > 0) {
        unsigned n = (unsigned)B * (unsigned)T;
        embedding_vp_bwd_wte_kernel<<<n, row_threads(C), 0, s->stream>>>(dwte, dout, tokens, C, off, rows);
        CDP_CUDA_LAUNCHED("embedding_vp_bwd_wte_kernel");
    }
    if (dwpe) {
        size_t TC = (size_t)T * C;
        embedding_bwd_wpe_kernel<<<cdp_cuda_blocks(TC, CDP_CUDA_THREADS), CDP_CUDA_THREADS, 0, s->stream>>>(
            dwpe, dout, B, TC);
        CDP_CUDA_LAUNCHED("embedding_bwd_wpe_kernel");
    }
    return CDP_OK;
}
