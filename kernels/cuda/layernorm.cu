/* Layer normalisation over the last dimension on the GPU, matching
 * kernels/cpu/layernorm.c: fp32 statistics, mean first and then the variance
 * of the deviations (two passes over the row, no cancellation), rstd =
 * 1 / sqrtf(var + eps) with the biased variance.
 * Shapes: in[N,C], weight/bias[C], mean/rstd[N].
 *
 * Rows are independent, so forward and the input gradient take one warp per
 * row. dweight/dbias sum over all N rows: a column kernel writes per-chunk
 * partials into the workspace and a second kernel adds them, in a fixed order,
 * to the gradients (deterministic, no atomics). */
#include "kernels/cuda/cuda_state.h"
#include "kernels/cuda/ops_cuda.h"

#define ROWS_PER_BLOCK 8 /* warps per block in the row kernels */
#define COL_TILE 32      /* columns per block in the parameter-gradient kernel */
#define COL_ROWS 8       /* threads along the rows in that kernel */
#define MAX_CHUNKS 1024  /* row chunks of the parameter-gradient partials */
#define MIN_CHUNK_ROWS 64

static __device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __global__ void layernorm_fwd_kernel(float *out, float *mean, float *rstd, const float *in,
                                            const float *__restrict__ weight, const float *__restrict__ bias,
                                            int N, int C, float eps)
{
    int row = blockIdx.x * ROWS_PER_BLOCK + (int)(threadIdx.x >> 5);
    int lane = (int)(threadIdx.x & 31u);
    if (row >= N) return; /* uniform over the warp; no block barrier follows */
    const float *x = in + (size_t)row * C;
    float *y = out + (size_t)row * C;

    float sum = 0.0f;
    for (int j = lane; j < C; j += 32)
        sum += x[j];
    float m = warp_sum(sum) / (float)C;

    float var = 0.0f;
    for (int j = lane; j < C; j += 32) {
        float d = x[j] - m;
        var += d * d;
    }
    float r = 1.0f / sqrtf(warp_sum(var) / (float)C + eps);

    /* each lane reads x[j] before writing y[j], so out == in is safe */
    for (int j = lane; j < C; j += 32)
        y[j] = (x[j] - m) * r * weight[j] + bias[j];
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

/* din += (dy w - mean(dy w) - xhat mean(dy w xhat)) rstd, per row */
static __global__ void layernorm_bwd_din_kernel(float *__restrict__ din, const float *__restrict__ dout,
                                                const float *__restrict__ in, const float *__restrict__ weight,
                                                const float *__restrict__ mean, const float *__restrict__ rstd,
                                                int N, int C)
{
    int row = blockIdx.x * ROWS_PER_BLOCK + (int)(threadIdx.x >> 5);
    int lane = (int)(threadIdx.x & 31u);
    if (row >= N) return;
    const float *x = in + (size_t)row * C;
    const float *dy = dout + (size_t)row * C;
    float *dx = din + (size_t)row * C;
    float m = mean[row], s = rstd[row];

    float g1 = 0.0f, g2 = 0.0f;
    for (int j = lane; j < C; j += 32) {
        float g = dy[j] * weight[j];
        g1 += g;
        g2 += g * (x[j] - m);
    }
    g1 = warp_sum(g1) / (float)C;
    g2 = warp_sum(g2) * (s / (float)C);

    for (int j = lane; j < C; j += 32) {
        float xh = (x[j] - m) * s;
        dx[j] += (dy[j] * weight[j] - g1 - xh * g2) * s;
    }
}

/* Block (COL_TILE, COL_ROWS) over columns [blockIdx.x * COL_TILE, +COL_TILE)
 * and rows [blockIdx.y * chunk_rows, +chunk_rows): the chunk's sums of
 * xhat * dy and dy per column, into pw/pb[blockIdx.y * C + j]. */
static __global__ void layernorm_bwd_partial_kernel(float *__restrict__ pw, float *__restrict__ pb,
                                                    const float *__restrict__ dout, const float *__restrict__ in,
                                                    const float *__restrict__ mean,
                                                    const float *__restrict__ rstd, int N, int C,
                                                    int chunk_rows)
{
    __shared__ float sw[COL_ROWS][COL_TILE + 1], sb[COL_ROWS][COL_TILE + 1];
    int j = blockIdx.x * COL_TILE + (int)threadIdx.x;
    int r0 = blockIdx.y * chunk_rows;
    int r1 = N - r0 < chunk_rows ? N : r0 + chunk_rows;
    float aw = 0.0f, ab = 0.0f;
    if (j < C)
        for (int r = r0 + (int)threadIdx.y; r < r1; r += COL_ROWS) {
            size_t k = (size_t)r * C + j;
            float dy = dout[k];
            aw += (in[k] - mean[r]) * rstd[r] * dy;
            ab += dy;
        }
    sw[threadIdx.y][threadIdx.x] = aw;
    sb[threadIdx.y][threadIdx.x] = ab;
    __syncthreads();
    if (threadIdx.y == 0 && j < C) {
        for (int k = 1; k < COL_ROWS; k++) {
            aw += sw[k][threadIdx.x];
            ab += sb[k][threadIdx.x];
        }
        pw[(size_t)blockIdx.y * C + j] = aw;
        pb[(size_t)blockIdx.y * C + j] = ab;
    }
}

static __global__ void layernorm_bwd_param_kernel(float *dweight, float *dbias, const float *__restrict__ pw,
                                                  const float *__restrict__ pb, int C, int nchunks)
{
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < C; j += gridDim.x * blockDim.x) {
        float aw = 0.0f, ab = 0.0f;
        for (int k = 0; k < nchunks; k++) {
            aw += pw[(size_t)k * C + j];
            ab += pb[(size_t)k * C + j];
        }
        if (dweight) dweight[j] += aw;
        if (dbias) dbias[j] += ab;
    }
}

cdp_status cdp_cuda_layernorm_fwd(void *ks, float *out, float *mean, float *rstd, const float *in,
                                  const float *weight, const float *bias, int N, int C, float eps)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (N <= 0 || C <= 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    unsigned blocks = (unsigned)((N - 1) / ROWS_PER_BLOCK + 1);
    layernorm_fwd_kernel<<<blocks, ROWS_PER_BLOCK * 32, 0, s->stream>>>(out, mean, rstd, in, weight, bias, N, C,
                                                                         eps);
    CDP_CUDA_LAUNCHED("layernorm_fwd_kernel");
    return CDP_OK;
}

cdp_status cdp_cuda_layernorm_bwd(void *ks, float *din, float *dweight, float *dbias, const float *dout,
                                  const float *in, const float *weight, const float *mean, const float *rstd,
                                  int N, int C)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (N <= 0 || C <= 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    if (din) {
        unsigned blocks = (unsigned)((N - 1) / ROWS_PER_BLOCK + 1);
        layernorm_bwd_din_kernel<<<blocks, ROWS_PER_BLOCK * 32, 0, s->stream>>>(din, dout, in, weight, mean, rstd,
                                                                                 N, C);
        CDP_CUDA_LAUNCHED("layernorm_bwd_din_kernel");
    }
    if (!dweight && !dbias) return CDP_OK;

    /* chunks depend on N alone, so the summation order does too */
    int chunk_rows = (N - 1) / MAX_CHUNKS + 1;
    if (chunk_rows < MIN_CHUNK_ROWS) chunk_rows = MIN_CHUNK_ROWS;
    int nchunks = (N - 1) / chunk_rows + 1;
    void *ws;
    cdp_status rc = cdp_cuda_workspace(s, 2 * (size_t)nchunks * C * sizeof(float), &ws);
    if (rc != CDP_OK) return rc;
    float *pw = (float *)ws, *pb = pw + (size_t)nchunks * C;

    dim3 grid((unsigned)((C - 1) / COL_TILE + 1), (unsigned)nchunks);
    dim3 block(COL_TILE, COL_ROWS);
    layernorm_bwd_partial_kernel<<<grid, block, 0, s->stream>>>(pw, pb, dout, in, mean, rstd, N, C, chunk_rows);
    CDP_CUDA_LAUNCHED("layernorm_bwd_partial_kernel");
    layernorm_bwd_param_kernel<<<cdp_cuda_blocks((size_t)C, CDP_CUDA_THREADS), CDP_CUDA_THREADS, 0, s->stream>>>(
        dweight, dbias, pw, pb, C, nchunks);
    CDP_CUDA_LAUNCHED("layernorm_bwd_param_kernel");
    return CDP_OK;
}
