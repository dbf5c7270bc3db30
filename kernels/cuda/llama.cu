/* The Llama family's ops on the GPU, matching kernels/cpu/rmsnorm.c, rope.c
 * and activation.c (swiglu): RMS norm (one warp per row; the weight gradient
 * through per-chunk partials summed in a fixed order, no atomics), rotary
 * embeddings with grouped-query packing (one thread per row, head and
 * frequency; frequencies from kernels/rope.h, cosf/sinf in fp32 as the CPU),
 * and the SwiGLU product. Shapes as kernels/cpu/ops.h. */
#include "kernels/cuda/cuda_state.h"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/rope.h"

#define ROWS_PER_BLOCK 8 /* warps per block in the row kernels */
#define COL_TILE 32      /* columns per block in the weight-gradient kernel */
#define COL_ROWS 8       /* threads along the rows in that kernel */
#define MAX_CHUNKS 1024  /* row chunks of the weight-gradient partials */
#define MIN_CHUNK_ROWS 64

#define FOR_EACH_INDEX(i, n)                                                              \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);               \
         i += (size_t)gridDim.x * blockDim.x)

static __device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* ---- rmsnorm ---------------------------------------------------------------- */

static __global__ void rmsnorm_fwd_kernel(float *out, float *rstd, const float *in, const float *__restrict__ weight,
                                          int N, int C, float eps)
{
    int row = blockIdx.x * ROWS_PER_BLOCK + (int)(threadIdx.x >> 5);
    int lane = (int)(threadIdx.x & 31u);
    if (row >= N) return; /* uniform over the warp */
    const float *x = in + (size_t)row * C;
    float *y = out + (size_t)row * C;
    float ss = 0.0f;
    for (int j = lane; j < C; j += 32) ss += x[j] * x[j];
    float r = 1.0f / sqrtf(warp_sum(ss) / (float)C + eps);
    for (int j = lane; j < C; j += 32) y[j] = weight[j] * (x[j] * r);
    if (lane == 0) rstd[row] = r;
}

/* din += r (w dy - x r^2 sum(w dy x) / C), per row */
static __global__ void rmsnorm_bwd_din_kernel(float *__restrict__ din, const float *__restrict__ dout,
                                              const float *__restrict__ in, const float *__restrict__ weight,
                                              const float *__restrict__ rstd, int N, int C)
{
    int row = blockIdx.x * ROWS_PER_BLOCK + (int)(threadIdx.x >> 5);
    int lane = (int)(threadIdx.x & 31u);
    if (row >= N) return;
    const float *x = in + (size_t)row * C;
    const float *dy = dout + (size_t)row * C;
    float *dx = din + (size_t)row * C;
    const float s = rstd[row];
    float g = 0.0f;
    for (int j = lane; j < C; j += 32) g += dy[j] * weight[j] * x[j];
    g = warp_sum(g) * (s * s / (float)C);
    for (int j = lane; j < C; j += 32) dx[j] += s * (dy[j] * weight[j] - x[j] * g);
}

/* the chunk's sums of dy * x * rstd per column, into pw[blockIdx.y * C + j] */
static __global__ void rmsnorm_bwd_partial_kernel(float *__restrict__ pw, const float *__restrict__ dout,
                                                  const float *__restrict__ in, const float *__restrict__ rstd, int N,
                                                  int C, int chunk_rows)
{
    __shared__ float sw[COL_ROWS][COL_TILE + 1];
    int j = blockIdx.x * COL_TILE + (int)threadIdx.x;
    int r0 = blockIdx.y * chunk_rows;
    int r1 = N - r0 < chunk_rows ? N : r0 + chunk_rows;
    float aw = 0.0f;
    if (j < C)
        for (int r = r0 + (int)threadIdx.y; r < r1; r += COL_ROWS) {
            size_t k = (size_t)r * C + j;
            aw += dout[k] * (in[k] * rstd[r]);
        }
    sw[threadIdx.y][threadIdx.x] = aw;
    __syncthreads();
    if (threadIdx.y == 0 && j < C) {
        for (int k = 1; k < COL_ROWS; k++) aw += sw[k][threadIdx.x];
        pw[(size_t)blockIdx.y * C + j] = aw;
    }
}

static __global__ void rmsnorm_bwd_param_kernel(float *dweight, const float *__restrict__ pw, int C, int nchunks)
{
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < C; j += gridDim.x * blockDim.x) {
        float aw = 0.0f;
        for (int k = 0; k < nchunks; k++) aw += pw[(size_t)k * C + j];
        dweight[j] += aw;
    }
}

cdp_status cdp_cuda_rmsnorm_fwd(void *ks, float *out, float *rstd, const float *in, const float *weight, int N, int C,
                                float eps)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (N <= 0 || C <= 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    unsigned blocks = (unsigned)((N - 1) / ROWS_PER_BLOCK + 1);
    rmsnorm_fwd_kernel<<<blocks, ROWS_PER_BLOCK * 32, 0, s->stream>>>(out, rstd, in, weight, N, C, eps);
    CDP_CUDA_LAUNCHED("rmsnorm_fwd_kernel");
    return CDP_OK;
}

cdp_status cdp_cuda_rmsnorm_bwd(void *ks, float *din, float *dweight, const float *dout, const float *in,
                                const float *weight, const float *rstd, int N, int C)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (N <= 0 || C <= 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    if (din) {
        unsigned blocks = (unsigned)((N - 1) / ROWS_PER_BLOCK + 1);
        rmsnorm_bwd_din_kernel<<<blocks, ROWS_PER_BLOCK * 32, 0, s->stream>>>(din, dout, in, weight, rstd, N, C);
        CDP_CUDA_LAUNCHED("rmsnorm_bwd_din_kernel");
    }
    if (!dweight) return CDP_OK;
    /* chunks depend on N alone, so the summation order does too */
    int chunk_rows = (N - 1) / MAX_CHUNKS + 1;
    if (chunk_rows < MIN_CHUNK_ROWS) chunk_rows = MIN_CHUNK_ROWS;
    int nchunks = (N - 1) / chunk_rows + 1;
    void *ws;
    cdp_status rc = cdp_cuda_workspace(s, (size_t)nchunks * C * sizeof(float), &ws);
    if (rc != CDP_OK) return rc;
    float *pw = (float *)ws;
    dim3 grid((unsigned)((C - 1) / COL_TILE + 1), (unsigned)nchunks);
    dim3 block(COL_TILE, COL_ROWS);
    rmsnorm_bwd_partial_kernel<<<grid, block, 0, s->stream>>>(pw, dout, in, rstd, N, C, chunk_rows);
    CDP_CUDA_LAUNCHED("rmsnorm_bwd_partial_kernel");
    rmsnorm_bwd_param_kernel<<<cdp_cuda_blocks((size_t)C, CDP_CUDA_THREADS), CDP_CUDA_THREADS, 0, s->stream>>>(
        dweight, pw, C, nchunks);
    CDP_CUDA_LAUNCHED("rmsnorm_bwd_param_kernel");
    return CDP_OK;
}

/* ---- rope ------------------------------------------------------------------- */

/* One thread per (row, query head, frequency): rotates q's pair; the first
 * query head of each key/value group also rotates k's and copies v's pair
 * into all the group's heads. */
static __global__ void rope_fwd_kernel(float *__restrict__ qkv, const float *__restrict__ q,
                                       const float *__restrict__ k, const float *__restrict__ v, int N, int T, int NH,
                                       int NKV, int HD, int pos0, struct cdp_rope rope)
{
    const int half = HD / 2, rep = NH / NKV, C = NH * HD, KVD = NKV * HD;
    const size_t total = (size_t)N * NH * half;
    FOR_EACH_INDEX(idx, total)
    {
        const int i = (int)(idx % half);
        const int h = (int)((idx / half) % NH);
        const size_t n = idx / ((size_t)half * NH);
        const int t = (int)(n % T);
        const float a = (float)(t + pos0) * cdp_rope_inv_freq(&rope, i, HD);
        const float c = cosf(a), s = sinf(a);
        const float *qr = q + n * C;
        float *oq = qkv + n * 3 * C, *ok = oq + C, *ov = ok + C;
        float x1 = qr[h * HD + i], x2 = qr[h * HD + i + half];
        oq[h * HD + i] = x1 * c - x2 * s;
        oq[h * HD + i + half] = x2 * c + x1 * s;
        if (h % rep) continue;
        const int j = h / rep;
        const float *kr = k + n * KVD, *vr = v + n * KVD;
        x1 = kr[j * HD + i];
        x2 = kr[j * HD + i + half];
        const float y1 = x1 * c - x2 * s, y2 = x2 * c + x1 * s;
        const float v1 = vr[j * HD + i], v2 = vr[j * HD + i + half];
        for (int r = 0; r < rep; r++) {
            const int hh = j * rep + r;
            ok[hh * HD + i] = y1;
            ok[hh * HD + i + half] = y2;
            ov[hh * HD + i] = v1;
            ov[hh * HD + i + half] = v2;
        }
    }
}

/* One thread per (row, query head, frequency) for dq; the first query head of
 * each group sums the group's k and v gradients in head order, as the CPU. */
static __global__ void rope_bwd_kernel(float *__restrict__ dq, float *__restrict__ dk, float *__restrict__ dv,
                                       const float *__restrict__ dqkv, int N, int T, int NH, int NKV, int HD, int pos0,
                                       struct cdp_rope rope)
{
    const int half = HD / 2, rep = NH / NKV, C = NH * HD, KVD = NKV * HD;
    const size_t total = (size_t)N * NH * half;
    FOR_EACH_INDEX(idx, total)
    {
        const int i = (int)(idx % half);
        const int h = (int)((idx / half) % NH);
        const size_t n = idx / ((size_t)half * NH);
        const int t = (int)(n % T);
        const float a = (float)(t + pos0) * cdp_rope_inv_freq(&rope, i, HD);
        const float c = cosf(a), s = sinf(a);
        const float *iq = dqkv + n * 3 * C, *ik = iq + C, *iv = ik + C;
        float *gq = dq + n * C;
        float y1 = iq[h * HD + i], y2 = iq[h * HD + i + half];
        gq[h * HD + i] += y1 * c + y2 * s;
        gq[h * HD + i + half] += y2 * c - y1 * s;
        if (h % rep) continue;
        const int j = h / rep;
        float *gk = dk + n * KVD, *gv = dv + n * KVD;
        float v1 = 0.0f, v2 = 0.0f;
        y1 = 0.0f;
        y2 = 0.0f;
        for (int r = 0; r < rep; r++) {
            const int hh = j * rep + r;
            y1 += ik[hh * HD + i];
            y2 += ik[hh * HD + i + half];
            v1 += iv[hh * HD + i];
            v2 += iv[hh * HD + i + half];
        }
        gk[j * HD + i] += y1 * c + y2 * s;
        gk[j * HD + i + half] += y2 * c - y1 * s;
        gv[j * HD + i] += v1;
        gv[j * HD + i + half] += v2;
    }
}

cdp_status cdp_cuda_rope_fwd(void *ks, float *qkv, const float *q, const float *k, const float *v, int B, int T,
                             int NH, int NKV, int HD, int pos0, struct cdp_rope rope)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    const size_t total = (size_t)B * T * NH * (HD / 2);
    if (!total) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    rope_fwd_kernel<<<cdp_cuda_blocks(total, CDP_CUDA_THREADS), CDP_CUDA_THREADS, 0, s->stream>>>(
        qkv, q, k, v, B * T, T, NH, NKV, HD, pos0, rope);
    CDP_CUDA_LAUNCHED("rope_fwd_kernel");
    return CDP_OK;
}

cdp_status cdp_cuda_rope_bwd(void *ks, float *dq, float *dk, float *dv, const float *dqkv, int B, int T, int NH,
                             int NKV, int HD, int pos0, struct cdp_rope rope)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    const size_t total = (size_t)B * T * NH * (HD / 2);
    if (!total) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    rope_bwd_kernel<<<cdp_cuda_blocks(total, CDP_CUDA_THREADS), CDP_CUDA_THREADS, 0, s->stream>>>(
        dq, dk, dv, dqkv, B * T, T, NH, NKV, HD, pos0, rope);
    CDP_CUDA_LAUNCHED("rope_bwd_kernel");
    return CDP_OK;
}

/* ---- swiglu ----------------------------------------------------------------- */

/* out may be gate or up (in place) */
static __global__ void swiglu_fwd_kernel(float *out, const float *gate, const float *up, size_t n)
{
    FOR_EACH_INDEX(i, n)
    {
        const float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

static __global__ void swiglu_bwd_kernel(float *__restrict__ dgate, float *__restrict__ dup,
                                         const float *__restrict__ dout, const float *__restrict__ gate,
                                         const float *__restrict__ up, size_t n)
{
    FOR_EACH_INDEX(i, n)
    {
        const float g = gate[i], s = 1.0f / (1.0f + expf(-g));
        if (dgate) dgate[i] += dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
        if (dup) dup[i] += dout[i] * g * s;
    }
}

cdp_status cdp_cuda_swiglu_fwd(void *ks, float *out, const float *gate, const float *up, size_t n)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (!n) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    swiglu_fwd_kernel<<<cdp_cuda_blocks(n, CDP_CUDA_THREADS), CDP_CUDA_THREADS, 0, s->stream>>>(out, gate, up, n);
    CDP_CUDA_LAUNCHED("swiglu_fwd_kernel");
    return CDP_OK;
}

cdp_status cdp_cuda_swiglu_bwd(void *ks, float *dgate, float *dup, const float *dout, const float *gate,
                               const float *up, size_t n)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (!n) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    swiglu_bwd_kernel<<<cdp_cuda_blocks(n, CDP_CUDA_THREADS), CDP_CUDA_THREADS, 0, s->stream>>>(dgate, dup, dout,
                                                                                                gate, up, n);
    CDP_CUDA_LAUNCHED("swiglu_bwd_kernel");
    return CDP_OK;
}
