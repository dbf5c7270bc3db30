/* Losses on the GPU, matching kernels/cpu/loss.c: fused softmax cross-entropy
 * (max-subtracted, fp32) and mean squared error.
 * Shapes: logits/dlogits[N,V], targets[N], pred/target/dpred[N,D], losses[N].
 *
 * Cross-entropy takes one block per row (V reaches 50304 and more). Each
 * thread keeps a running maximum and a sum of exp(x - max) rescaled when the
 * maximum grows, so a row is read once for its statistics; the per-thread
 * pairs merge in a fixed order (deterministic). Backward overwrites dlogits. */
#include "kernels/cuda/cuda_state.h"
#include "kernels/cuda/ops_cuda.h"

#include <math.h>

#define CE_MAX_THREADS 512
#define MSE_ROWS_PER_BLOCK 8 /* warps per block, one row each */

/* (m, s): s = sum of exp(x - m) over the values seen; m = -inf when none
 * were (or all were -inf). -inf values add nothing; a NaN makes s NaN, as on
 * the CPU. */
static __device__ __forceinline__ void lse_add(float &m, float &s, float x)
{
    if (x > m) {
        s = s * expf(m - x) + 1.0f; /* m = -inf: s * 0 */
        m = x;
    } else if (x != -INFINITY) {
        s += expf(x - m);
    }
}

/* Merges (m2, s2) into (m, s); commutative, so the merge order of a butterfly
 * does not change the bits. */
static __device__ __forceinline__ void lse_merge(float &m, float &s, float m2, float s2)
{
    if (m2 > m) {
        s = s * expf(m - m2) + s2;
        m = m2;
    } else if (m2 == -INFINITY) {
        s += s2; /* s2 is 0, or NaN to pass on */
    } else {
        s += s2 * expf(m2 - m);
    }
}

/* A row is read in three parts: scalars up to the first 16-byte boundary
 * (rows of an odd V start anywhere), then float4 loads (several in flight
 * per thread, which a memory-bound pass over 1.6 GB of GPT-2 logits needs),
 * then the scalar tail. head_of() counts the leading scalars. */
static __device__ __forceinline__ int head_of(const float *x, int V)
{
    int h = (int)(((16u - ((unsigned)(uintptr_t)x & 15u)) & 15u) / 4u);
    return h < V ? h : V;
}

/* The row's (max, sum of exp(x - max)), for every thread of the block.
 * blockDim.x is a multiple of 32, at most 1024. */
static __device__ void row_lse(const float *x, int V, float *m_out, float *s_out)
{
    __shared__ float sm[32], ss[32];
    float m = -INFINITY, s = 0.0f;
    const int head = head_of(x, V), n4 = (V - head) / 4;
    for (int j = threadIdx.x; j < head; j += blockDim.x)
        lse_add(m, s, x[j]);
    const float4 *x4 = reinterpret_cast<const float4 *>(x + head);
#pragma unroll 4
    for (int j = threadIdx.x; j < n4; j += blockDim.x) {
        const float4 v = x4[j];
        lse_add(m, s, v.x);
        lse_add(m, s, v.y);
        lse_add(m, s, v.z);
        lse_add(m, s, v.w);
    }
    for (int j = head + 4 * n4 + threadIdx.x; j < V; j += blockDim.x)
        lse_add(m, s, x[j]);
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o);
        float s2 = __shfl_xor_sync(0xffffffffu, s, o);
        lse_merge(m, s, m2, s2);
    }
    unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sm[warp] = m;
        ss[warp] = s;
    }
    __syncthreads();
    if (warp == 0) {
        bool have = lane < (blockDim.x >> 5);
        m = have ? sm[lane] : -INFINITY;
        s = have ? ss[lane] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) {
            float m2 = __shfl_xor_sync(0xffffffffu, m, o);
            float s2 = __shfl_xor_sync(0xffffffffu, s, o);
            lse_merge(m, s, m2, s2);
        }
        if (lane == 0) {
            sm[0] = m;
            ss[0] = s;
        }
    }
    __syncthreads();
    *m_out = sm[0];
    *s_out = ss[0];
}

static __global__ void crossentropy_fwd_kernel(float *__restrict__ losses, const float *__restrict__ logits,
                                               const int32_t *__restrict__ targets, int V)
{
    const float *x = logits + (size_t)blockIdx.x * V;
    float m, s;
    row_lse(x, V, &m, &s);
    /* s >= 1, so the log is finite; m - x[t] first, as the CPU, so a large
     * shared offset cancels exactly */
    if (threadIdx.x == 0) losses[blockIdx.x] = logf(s) + (m - x[targets[blockIdx.x]]);
}

/* dlogits = softmax * scale, minus scale at the target. Every element is read
 * before it is written, by the same thread, after the statistics are complete,
 * so dlogits == logits (in place) would also be safe. */
static __global__ void crossentropy_bwd_kernel(float *dlogits, const float *logits,
                                               const int32_t *__restrict__ targets, int V, float scale)
{
    const float *x = logits + (size_t)blockIdx.x * V;
    float *d = dlogits + (size_t)blockIdx.x * V;
    float m, s;
    row_lse(x, V, &m, &s);
    const float f = scale / s;
    const int t = targets[blockIdx.x], head = head_of(x, V), n4 = (V - head) / 4;
    for (int j = threadIdx.x; j < head; j += blockDim.x) {
        const float p = expf(x[j] - m) * f;
        d[j] = j == t ? p - scale : p;
    }
    const float4 *x4 = reinterpret_cast<const float4 *>(x + head);
    float *dh = d + head;
    const bool d_aligned = ((uintptr_t)dh & 15u) == 0; /* the same for the whole block */
#pragma unroll 4
    for (int j = threadIdx.x; j < n4; j += blockDim.x) {
        const float4 v = x4[j];
        const int k = head + 4 * j;
        float4 p = make_float4(expf(v.x - m) * f, expf(v.y - m) * f, expf(v.z - m) * f, expf(v.w - m) * f);
        if (t == k) p.x -= scale;
        if (t == k + 1) p.y -= scale;
        if (t == k + 2) p.z -= scale;
        if (t == k + 3) p.w -= scale;
        if (d_aligned) {
            reinterpret_cast<float4 *>(dh)[j] = p;
        } else {
            dh[4 * j] = p.x;
            dh[4 * j + 1] = p.y;
            dh[4 * j + 2] = p.z;
            dh[4 * j + 3] = p.w;
        }
    }
    for (int j = head + 4 * n4 + threadIdx.x; j < V; j += blockDim.x) {
        const float p = expf(x[j] - m) * f;
        d[j] = j == t ? p - scale : p;
    }
}

/* ---- vocab-parallel cross-entropy (kernels/ops.h, crossentropy_vp_*) ---- */

/* one block per row: this rank's (m_k, s_k) over the valid columns, the
 * target's logit where it is in the slice, zeros elsewhere */
static __global__ void crossentropy_vp_stats_kernel(float *__restrict__ stats, const float *__restrict__ logits,
                                                    const int32_t *__restrict__ targets, int V, int valid, int off,
                                                    int k, int t)
{
    const float *x = logits + (size_t)blockIdx.x * V;
    float *st = stats + (size_t)blockIdx.x * (2 * t + 1);
    float m = -INFINITY, s = 0.0f;
    if (valid > 0) row_lse(x, valid, &m, &s); /* uniform over the block */
    for (int j = threadIdx.x; j < 2 * t + 1; j += blockDim.x)
        st[j] = 0.0f;
    __syncthreads();
    if (threadIdx.x == 0) {
        st[k] = m;
        st[t + k] = s;
        const int tg = targets[blockIdx.x];
        if (tg >= off && tg - off < valid) st[2 * t] = x[tg - off];
    }
}

/* the row's maximum and total over the group's parts, as the CPU merges them */
static __device__ void vp_merge(const float *st, int t, float *m_out, float *s_out)
{
    float m = -INFINITY, s = 0.0f;
    for (int j = 0; j < t; j++)
        if (st[j] > m) m = st[j];
    for (int j = 0; j < t; j++)
        if (st[t + j] > 0.0f) s += st[t + j] * expf(st[j] - m);
    *m_out = m;
    *s_out = s;
}

static __global__ void crossentropy_vp_fwd_kernel(float *__restrict__ losses, const float *__restrict__ stats, int N,
                                                  int t)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < N; i += gridDim.x * blockDim.x) {
        const float *st = stats + (size_t)i * (2 * t + 1);
        float m, s;
        vp_merge(st, t, &m, &s);
        losses[i] = logf(s) + (m - st[2 * t]);
    }
}

/* one block per row */
static __global__ void crossentropy_vp_bwd_kernel(float *dlogits, const float *logits,
                                                  const int32_t *__restrict__ targets, const float *__restrict__ stats,
                                                  int V, int valid, int off, int t, float scale)
{
    const float *x = logits + (size_t)blockIdx.x * V;
    float *d = dlogits + (size_t)blockIdx.x * V;
    float m, s;
    vp_merge(stats + (size_t)blockIdx.x * (2 * t + 1), t, &m, &s);
    const float f = scale / s;
    const int tg = targets[blockIdx.x] - off;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        const float p = j < valid ? expf(x[j] - m) * f : 0.0f;
        d[j] = j == tg && j < valid ? p - scale : p;
    }
}

/* one warp per row */
static __global__ void mse_fwd_kernel(float *__restrict__ losses, const float *__restrict__ pred,
                                      const float *__restrict__ target, int N, int D)
{
    int row = blockIdx.x * MSE_ROWS_PER_BLOCK + (int)(threadIdx.x >> 5);
    int lane = (int)(threadIdx.x & 31u);
    if (row >= N) return; /* uniform over the warp */
    const float *p = pred + (size_t)row * D;
    const float *t = target + (size_t)row * D;
    float acc = 0.0f;
    for (int j = lane; j < D; j += 32) {
        float e = p[j] - t[j];
        acc += e * e;
    }
    for (int o = 16; o > 0; o >>= 1)
        acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) losses[row] = acc / (float)D;
}

static __global__ void mse_bwd_kernel(float *dpred, const float *pred, const float *target, size_t n, float f)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dpred[i] = (pred[i] - target[i]) * f;
}

static unsigned ce_threads(int V)
{
    unsigned t = ((unsigned)V + 31u) & ~31u;
    return t > CE_MAX_THREADS ? CE_MAX_THREADS : t;
}

cdp_status cdp_cuda_crossentropy_fwd(void *ks, float *losses, const float *logits, const int32_t *targets,
                                     int N, int V)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (N <= 0 || V <= 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    crossentropy_fwd_kernel<<<(unsigned)N, ce_threads(V), 0, s->stream>>>(losses, logits, targets, V);
    CDP_CUDA_LAUNCHED("crossentropy_fwd_kernel");
    return CDP_OK;
}

cdp_status cdp_cuda_crossentropy_bwd(void *ks, float *dlogits, const float *logits, const int32_t *targets,
                                     int N, int V, float scale)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (N <= 0 || V <= 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    crossentropy_bwd_kernel<<<(unsigned)N, ce_threads(V), 0, s->stream>>>(dlogits, logits, targets, V, scale);
    CDP_CUDA_LAUNCHED("crossentropy_bwd_kernel");
    return CDP_OK;
}

cdp_status cdp_cuda_crossentropy_vp_stats(void *ks, float *stats, const float *logits, const int32_t *targets,
                                          int N, int V, int valid, int off, int k, int t)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (N <= 0 || t <= 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    crossentropy_vp_stats_kernel<<<(unsigned)N, ce_threads(valid > 0 ? valid : 1), 0, s->stream>>>(
        stats, logits, targets, V, valid, off, k, t);
    CDP_CUDA_LAUNCHED("crossentropy_vp_stats_kernel");
    return CDP_OK;
}

cdp_status cdp_cuda_crossentropy_vp_fwd(void *ks, float *losses, const float *stats, int N, int t)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (N <= 0 || t <= 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    crossentropy_vp_fwd_kernel<<<cdp_cuda_blocks((size_t)N, CDP_CUDA_THREADS), CDP_CUDA_THREADS, 0, s->stream>>>(
        losses, stats, N, t);
    CDP_CUDA_LAUNCHED("crossentropy_vp_fwd_kernel");
    return CDP_OK;
}

cdp_status cdp_cuda_crossentropy_vp_bwd(void *ks, float *dlogits, const float *logits, const int32_t *targets,
                                        const float *stats, int N, int V, int valid, int off, int t, float scale)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (N <= 0 || V <= 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    crossentropy_vp_bwd_kernel<<<(unsigned)N, ce_threads(V), 0, s->stream>>>(dlogits, logits, targets, stats, V,
                                                                              valid, off, t, scale);
    CDP_CUDA_LAUNCHED("crossentropy_vp_bwd_kernel");
    return CDP_OK;
}

cdp_status cdp_cuda_mse_fwd(void *ks, float *losses, const float *pred, const float *target, int N, int D)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (N <= 0 || D <= 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    unsigned blocks = (unsigned)((N - 1) / MSE_ROWS_PER_BLOCK + 1);
    mse_fwd_kernel<<<blocks, MSE_ROWS_PER_BLOCK * 32, 0, s->stream>>>(losses, pred, target, N, D);
    CDP_CUDA_LAUNCHED("mse_fwd_kernel");
    return CDP_OK;
}

cdp_status cdp_cuda_mse_bwd(void *ks, float *dpred, const float *pred, const float *target, int N, int D,
                            float scale)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (N <= 0 || D <= 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    float f = 2.0f * scale / (float)D; /* as the CPU: one factor, computed in float */
    size_t n = (size_t)N * D;
    mse_bwd_kernel<<<cdp_cuda_blocks(n, CDP_CUDA_THREADS), CDP_CUDA_THREADS, 0, s->stream>>>(dpred, pred, target,
                                                                                            n, f);
    CDP_CUDA_LAUNCHED("mse_bwd_kernel");
    return CDP_OK;
}
