/* Fused self-attention for bf16 precision: the scores and probabilities of a
 * 64 x 64 tile live in registers and never reach global memory (the method
 * of FlashAttention-2, Dao 2023), where attention.cu's general path writes
 * and re-reads B*NH*T*T floats several times per pass.
 *
 * Every product is a warp-level bf16 tensor-core instruction,
 * mma.sync.m16n8k16 with fp32 accumulation. A block of 4 warps owns 64 rows
 * (queries in the forward and the dQ pass, keys in the dK/dV pass), 16 per
 * warp, as A fragments in registers; the other operand streams through
 * shared memory 64 rows at a time, double-buffered with cp.async so that the
 * next tile arrives while this one is multiplied. The operands are first
 * packed once per call into bf16 [B*NH, T, HS] (the rounding to bf16 that
 * ops.h asks for; contiguous 16-byte rows for the copies). The accumulator of one
 * product has exactly the register layout of the A operand of the next, so
 * probabilities go from S = Q K^T into P V without leaving the registers.
 *
 * Forward: online softmax over key tiles in the log2 domain (scores scaled
 * by log2(e)/sqrt(HS)); saves the row's log2-sum-exp L and a copy of the
 * output in `att` (flash_attention.h). Backward recomputes the probabilities
 * P = 2^(s - L) tile by tile: one pass per key tile accumulates dK and dV in
 * registers, one pass per query tile accumulates dQ, so every gradient
 * element has exactly one writer (no atomics: results are deterministic).
 * Both need Dsum = rowsum(dO * O), from a small kernel first.
 *
 * Fragment layouts (PTX ISA, mma.m16n8k16 with .bf16): lane = 4 g + t.
 *   A (16x16, row-major): {a0,a1} row g, cols 2t,2t+1; {a2,a3} row g+8;
 *     {a4,a5} row g, cols 2t+8,2t+9; {a6,a7} row g+8, cols 2t+8,2t+9.
 *   B (16x8, k x n): {b0,b1} k = 2t,2t+1, col g; {b2,b3} k = 2t+8,2t+9.
 *   C (16x8 fp32): {c0,c1} row g, cols 2t,2t+1; {c2,c3} row g+8.
 * Each 32-bit register holds two bf16, the lower index in the low half. */
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/ops_cuda.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define FA_ROWS 64 /* rows a block owns, and rows per streamed tile */
#define FA_WARPS 4
#define FA_THREADS (FA_WARPS * 32)
#define FA_LOG2E 1.4426950408889634f

static __device__ __forceinline__ uint32_t pack2(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); /* .x = lo: the low half */
    return *reinterpret_cast<uint32_t *>(&v);
}

static __device__ __forceinline__ uint32_t pack2h(__nv_bfloat16 lo, __nv_bfloat16 hi)
{
    __nv_bfloat162 v = __halves2bfloat162(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

static __device__ __forceinline__ uint32_t ld32(const __nv_bfloat16 *p)
{
    return *reinterpret_cast<const uint32_t *>(p);
}

/* c += a b for one 16x8x16 tile */
static __device__ __forceinline__ void mma16816(float *c, const uint32_t *a, uint32_t b0, uint32_t b1)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    (void)c, (void)a, (void)b0, (void)b1;
    __trap(); /* never launched: cdp_cuda_flash_usable() needs sm_80 */
#endif
}

/* 16 bytes from global to shared memory without passing through registers
 * (sm_80 cp.async); with valid false nothing is read and the 16 bytes
 * become zeros. */
static __device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(gmem), "r"(n));
#else
    (void)smem, (void)gmem, (void)valid;
    __trap();
#endif
}

static __device__ __forceinline__ void cp_async_commit(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

/* waits until at most N of this thread's committed groups are in flight */
template <int N>
static __device__ __forceinline__ void cp_async_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

/* Queues rows r0 .. r0+63 of a packed bf16 [T, D] matrix into a tile of row
 * stride D + 8 (the padding keeps fragment loads free of bank conflicts);
 * rows >= T become zeros. */
template <int D>
static __device__ __forceinline__ void tile_async(__nv_bfloat16 *dst, const __nv_bfloat16 *src, int r0, int T)
{
    constexpr int SD = D + 8, CH = D / 8; /* 16-byte chunks per row */
    for (int i = threadIdx.x; i < FA_ROWS * CH; i += FA_THREADS) {
        const int r = i / CH, c = (i % CH) * 8;
        const bool ok = r0 + r < T;
        cp_async16(dst + r * SD + c, src + (size_t)(ok ? r0 + r : 0) * D + c, ok);
    }
}

/* The A fragments of a warp's 16 rows (from row r) of a tile, over D columns. */
template <int D>
static __device__ __forceinline__ void load_a(uint32_t (*f)[4], const __nv_bfloat16 *tile, int r)
{
    constexpr int SD = D + 8;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        const __nv_bfloat16 *p = tile + (r + g) * SD + kk * 16 + 2 * t;
        f[kk][0] = ld32(p);
        f[kk][1] = ld32(p + 8 * SD);
        f[kk][2] = ld32(p + 8);
        f[kk][3] = ld32(p + 8 * SD + 8);
    }
}

/* acc[8][4] (16 x 64) = A (16 x D, fragments) times the transpose of a
 * 64-row tile: acc[i][j] = sum_f A[i][f] tile[j][f]. */
template <int D>
static __device__ __forceinline__ void mma_abt(float (*acc)[4], const uint32_t (*a)[4], const __nv_bfloat16 *tile)
{
    constexpr int SD = D + 8;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
        acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            const __nv_bfloat16 *p = tile + (nt * 8 + g) * SD + kk * 16 + 2 * t;
            mma16816(acc[nt], a[kk], ld32(p), ld32(p + 8));
        }
    }
}

/* acc[D/8][4] (16 x D) += P (16 x 64, the fp32 accumulator of a 16 x 64
 * product, rounded to bf16 here) times a 64-row tile (64 x D). */
template <int D>
static __device__ __forceinline__ void mma_pv(float (*acc)[4], const float (*p)[4], const __nv_bfloat16 *tile)
{
    constexpr int SD = D + 8;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        const uint32_t a[4] = {pack2(p[2 * kk][0], p[2 * kk][1]), pack2(p[2 * kk][2], p[2 * kk][3]),
                               pack2(p[2 * kk + 1][0], p[2 * kk + 1][1]), pack2(p[2 * kk + 1][2], p[2 * kk + 1][3])};
        const __nv_bfloat16 *v = tile + (kk * 16 + 2 * t) * SD + g;
#pragma unroll
        for (int nt = 0; nt < D / 8; nt++) {
            const __nv_bfloat16 *q = v + nt * 8;
            mma16816(acc[nt], a, pack2h(q[0], q[SD]), pack2h(q[8 * SD], q[9 * SD]));
        }
    }
}

static __device__ __forceinline__ float quad_max(float v)
{
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

static __device__ __forceinline__ float quad_sum(float v)
{
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

#define FA_TILE(D) (FA_ROWS * ((D) + 8)) /* bf16 elements of one tile */

/* q, k, v of qkv[B,T,3C] (fp32) into packed bf16 [3][B*NH][T][D], 8 elements
 * (one 16-byte store) per thread and step */
template <int D>
static __global__ void flash_pack_qkv_kernel(__nv_bfloat16 *__restrict__ dst, const float *__restrict__ qkv, int B,
                                             int T, int C, int NH)
{
    const size_t C3 = 3 * (size_t)C, n8 = (size_t)B * T * C3 / 8, plane = (size_t)B * T * C;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += (size_t)gridDim.x * blockDim.x) {
        const size_t e = 8 * i, bt = e / C3;
        const int col = (int)(e - bt * C3), which = col / C, h = (col - which * C) / D, f = col % D;
        const size_t b = bt / (size_t)T, t = bt - b * T;
        const float *p = qkv + e;
        __nv_bfloat162 v0 = __floats2bfloat162_rn(p[0], p[1]), v1 = __floats2bfloat162_rn(p[2], p[3]),
                       v2 = __floats2bfloat162_rn(p[4], p[5]), v3 = __floats2bfloat162_rn(p[6], p[7]);
        uint4 u;
        u.x = *reinterpret_cast<uint32_t *>(&v0);
        u.y = *reinterpret_cast<uint32_t *>(&v1);
        u.z = *reinterpret_cast<uint32_t *>(&v2);
        u.w = *reinterpret_cast<uint32_t *>(&v3);
        *reinterpret_cast<uint4 *>(dst + which * plane + ((b * NH + h) * T + t) * D + f) = u;
    }
}

/* dout[B,T,C] into packed bf16 [B*NH][T][D], and dsum[bh*T + t] = the row's
 * dot product of dout and out (the copy the forward kept): one warp per
 * (b, t, h) row */
template <int D>
static __global__ void flash_pack_dout_kernel(__nv_bfloat16 *__restrict__ do16, float *__restrict__ dsum,
                                              const float *__restrict__ dout, const float *__restrict__ ocopy,
                                              size_t rows, int T, int NH)
{
    const size_t w = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (w >= rows) return; /* the whole warp leaves together */
    const size_t bt = w / (size_t)NH, b = bt / (size_t)T;
    const int h = (int)(w - bt * NH), t = (int)(bt - b * T);
    const size_t src = w * D, dst = ((b * NH + h) * T + t) * D; /* [B,T,NH,D] is [B,T,C] */
    float acc = 0.0f;
#pragma unroll
    for (int f = lane; f < D; f += 32) {
        const float g = dout[src + f];
        acc += g * ocopy[src + f];
        do16[dst + f] = __float2bfloat16_rn(g);
    }
    for (int o = 16; o > 0; o >>= 1)
        acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) dsum[(b * NH + h) * T + t] = acc;
}

/* grid (query tiles, B*NH); the last query tiles (most keys when causal)
 * first. q16/k16/v16: packed [B*NH][T][D]. */
template <int D>
static __global__ void __launch_bounds__(FA_THREADS)
    flash_fwd_kernel(float *__restrict__ out, float *__restrict__ lse, float *__restrict__ ocopy,
                     const __nv_bfloat16 *__restrict__ q16, const __nv_bfloat16 *__restrict__ k16,
                     const __nv_bfloat16 *__restrict__ v16, int T, int C, int NH, float sl2, int causal)
{
    /* two buffers of (K, V); Q is staged in the second before the loop */
    __shared__ __align__(16) __nv_bfloat16 sm[4 * FA_TILE(D)];
    const int qt = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int q0 = qt * FA_ROWS;
    const size_t mat = (size_t)bh * T * D;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int row0 = q0 + warp * 16 + g; /* this lane's rows: row0 and row0 + 8 */
    const int nk_all = (T + FA_ROWS - 1) / FA_ROWS;
    const int nk = causal ? min(qt + 1, nk_all) : nk_all;

    tile_async<D>(sm + 2 * FA_TILE(D), q16 + mat, q0, T);
    cp_async_commit();
    tile_async<D>(sm, k16 + mat, 0, T);
    tile_async<D>(sm + FA_TILE(D), v16 + mat, 0, T);
    cp_async_commit();
    cp_async_wait<1>(); /* Q is in */
    __syncthreads();
    uint32_t qf[D / 16][4];
    load_a<D>(qf, sm + 2 * FA_TILE(D), warp * 16);
    __syncthreads(); /* Q's buffer is the next prefetch's */

    float o[D / 8][4];
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++)
        o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    for (int kt = 0; kt < nk; kt++) {
        const int k0 = kt * FA_ROWS, cur = kt & 1;
        if (kt + 1 < nk) {
            __nv_bfloat16 *nb = sm + (cur ^ 1) * 2 * FA_TILE(D);
            tile_async<D>(nb, k16 + mat, k0 + FA_ROWS, T);
            tile_async<D>(nb + FA_TILE(D), v16 + mat, k0 + FA_ROWS, T);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const __nv_bfloat16 *Ks = sm + cur * 2 * FA_TILE(D), *Vs = Ks + FA_TILE(D);

        float s[8][4];
        mma_abt<D>(s, qf, Ks);
        const bool edge = k0 + FA_ROWS > T || (causal && k0 + FA_ROWS - 1 > q0);
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v = s[nt][e] * sl2;
                if (edge) {
                    const int key = k0 + nt * 8 + 2 * t + (e & 1), row = row0 + (e >> 1) * 8;
                    if (key >= T || (causal && key > row)) v = -INFINITY;
                }
                s[nt][e] = v;
                mx[e >> 1] = fmaxf(mx[e >> 1], v);
            }
        float mu[2], alpha[2], rs[2] = {0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const float mn = fmaxf(m[i], quad_max(mx[i]));
            mu[i] = mn == -INFINITY ? 0.0f : mn; /* a row with nothing unmasked yet stays at zero */
            alpha[i] = exp2f(m[i] - mu[i]);
            m[i] = mn;
        }
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float p = exp2f(s[nt][e] - mu[e >> 1]);
                s[nt][e] = p;
                rs[e >> 1] += p;
            }
#pragma unroll
        for (int i = 0; i < 2; i++)
            l[i] = l[i] * alpha[i] + quad_sum(rs[i]);
#pragma unroll
        for (int nt = 0; nt < D / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                o[nt][e] *= alpha[e >> 1];
        mma_pv<D>(o, s, Vs);
        __syncthreads(); /* this buffer is the next iteration's prefetch target */
    }

#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int row = row0 + 8 * i;
        if (row >= T) continue;
        const float inv = 1.0f / l[i];
        const size_t off = ((size_t)b * T + row) * C + (size_t)h * D + 2 * t;
#pragma unroll
        for (int nt = 0; nt < D / 8; nt++) {
            const float x = o[nt][2 * i] * inv, y = o[nt][2 * i + 1] * inv;
            out[off + nt * 8] = x;
            out[off + nt * 8 + 1] = y;
            ocopy[off + nt * 8] = x;
            ocopy[off + nt * 8 + 1] = y;
        }
        if (t == 0) lse[(size_t)bh * T + row] = m[i] + log2f(l[i]);
    }
}

/* dK and dV of one key tile: grid (key tiles, B*NH), the first key tiles
 * (most queries when causal) first. A warp owns 16 keys; S^T = K Q^T, so
 * the accumulators are indexed (key, query). */
template <int D>
static __global__ void __launch_bounds__(FA_THREADS)
    flash_bwd_dkdv_kernel(float *__restrict__ dqkv, const __nv_bfloat16 *__restrict__ q16,
                          const __nv_bfloat16 *__restrict__ k16, const __nv_bfloat16 *__restrict__ v16,
                          const __nv_bfloat16 *__restrict__ do16, const float *__restrict__ lse,
                          const float *__restrict__ dsum, int T, int C, int NH, float sl2, float scale, int causal)
{
    /* two buffers of (Q, dO); K and V are staged in the first before the loop */
    __shared__ __align__(16) __nv_bfloat16 sm[4 * FA_TILE(D)];
    __shared__ float LD[2][2][FA_ROWS]; /* per buffer: L, Dsum of its queries */
    const int kt = blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int k0 = kt * FA_ROWS;
    const size_t mat = (size_t)bh * T * D, ld = 3 * (size_t)C;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int key0 = k0 + warp * 16 + g; /* this lane's keys: key0 and key0 + 8 */
    const int nq = (T + FA_ROWS - 1) / FA_ROWS, qt0 = causal ? kt : 0;

    tile_async<D>(sm, k16 + mat, k0, T);
    tile_async<D>(sm + FA_TILE(D), v16 + mat, k0, T);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    uint32_t kf[D / 16][4], vf[D / 16][4];
    load_a<D>(kf, sm, warp * 16);
    load_a<D>(vf, sm + FA_TILE(D), warp * 16);
    __syncthreads(); /* K and V's buffer is the first prefetch's */

    float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dk[nt][e] = dv[nt][e] = 0.0f;

    /* queues query tile qt into buffer u: Q and dO by cp.async, L and Dsum by
     * plain loads (visible after the next barrier) */
    auto fetch = [&](int qt, int u) {
        const int q0 = qt * FA_ROWS;
        tile_async<D>(sm + u * 2 * FA_TILE(D), q16 + mat, q0, T);
        tile_async<D>(sm + u * 2 * FA_TILE(D) + FA_TILE(D), do16 + mat, q0, T);
        cp_async_commit();
        if (threadIdx.x < FA_ROWS) {
            const int r = q0 + threadIdx.x;
            LD[u][0][threadIdx.x] = r < T ? lse[(size_t)bh * T + r] : 0.0f;
            LD[u][1][threadIdx.x] = r < T ? dsum[(size_t)bh * T + r] : 0.0f;
        }
    };
    if (qt0 < nq) fetch(qt0, 0);
    for (int qt = qt0; qt < nq; qt++) {
        const int q0 = qt * FA_ROWS, cur = (qt - qt0) & 1;
        if (qt + 1 < nq) {
            fetch(qt + 1, cur ^ 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const __nv_bfloat16 *Qs = sm + cur * 2 * FA_TILE(D), *Os = Qs + FA_TILE(D);
        const float *Ls = LD[cur][0], *Ds = LD[cur][1];

        float s_t[8][4], dp[8][4];
        mma_abt<D>(s_t, kf, Qs); /* S^T */
        const bool edge = q0 + FA_ROWS > T || k0 + FA_ROWS > T || (causal && k0 + FA_ROWS - 1 > q0);
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int qi = nt * 8 + 2 * t + (e & 1);
                float p = exp2f(s_t[nt][e] * sl2 - Ls[qi]);
                if (edge) {
                    const int query = q0 + qi, key = key0 + (e >> 1) * 8;
                    if (query >= T || key >= T || (causal && key > query)) p = 0.0f;
                }
                s_t[nt][e] = p;
            }
        mma_pv<D>(dv, s_t, Os);  /* dV += P^T dO */
        mma_abt<D>(dp, vf, Os); /* dP^T = V dO^T */
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                s_t[nt][e] *= dp[nt][e] - Ds[nt * 8 + 2 * t + (e & 1)]; /* dS^T */
        mma_pv<D>(dk, s_t, Qs); /* dK += dS^T Q (times scale below) */
        __syncthreads();       /* this buffer is the next iteration's prefetch target */
    }

#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int key = key0 + 8 * i;
        if (key >= T) continue;
        float *pk = dqkv + ((size_t)b * T + key) * ld + C + (size_t)h * D + 2 * t, *pv = pk + C;
#pragma unroll
        for (int nt = 0; nt < D / 8; nt++) {
            pk[nt * 8] += dk[nt][2 * i] * scale;
            pk[nt * 8 + 1] += dk[nt][2 * i + 1] * scale;
            pv[nt * 8] += dv[nt][2 * i];
            pv[nt * 8 + 1] += dv[nt][2 * i + 1];
        }
    }
}

/* dQ of one query tile: grid (query tiles, B*NH), the last (most keys when
 * causal) first. A warp owns 16 queries. */
template <int D>
static __global__ void __launch_bounds__(FA_THREADS, 3) /* 3 blocks per SM fit without spills */
    flash_bwd_dq_kernel(float *__restrict__ dqkv, const __nv_bfloat16 *__restrict__ q16,
                        const __nv_bfloat16 *__restrict__ k16, const __nv_bfloat16 *__restrict__ v16,
                        const __nv_bfloat16 *__restrict__ do16, const float *__restrict__ lse,
                        const float *__restrict__ dsum, int T, int C, int NH, float sl2, float scale, int causal)
{
    /* two buffers of (K, V); Q and dO are staged in the first before the loop */
    __shared__ __align__(16) __nv_bfloat16 sm[4 * FA_TILE(D)];
    const int qt = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int q0 = qt * FA_ROWS;
    const size_t mat = (size_t)bh * T * D, ld = 3 * (size_t)C;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int row0 = q0 + warp * 16 + g; /* this lane's queries: row0 and row0 + 8 */
    const int nk_all = (T + FA_ROWS - 1) / FA_ROWS;
    const int nk = causal ? min(qt + 1, nk_all) : nk_all;

    tile_async<D>(sm, q16 + mat, q0, T);
    tile_async<D>(sm + FA_TILE(D), do16 + mat, q0, T);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    uint32_t qf[D / 16][4], of[D / 16][4];
    load_a<D>(qf, sm, warp * 16);
    load_a<D>(of, sm + FA_TILE(D), warp * 16);
    __syncthreads(); /* Q and dO's buffer is the first prefetch's */
    float L[2], Dr[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = row0 + 8 * i;
        L[i] = r < T ? lse[(size_t)bh * T + r] : 0.0f;
        Dr[i] = r < T ? dsum[(size_t)bh * T + r] : 0.0f;
    }

    float dq[D / 8][4];
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++)
        dq[nt][0] = dq[nt][1] = dq[nt][2] = dq[nt][3] = 0.0f;

    if (nk > 0) {
        tile_async<D>(sm, k16 + mat, 0, T);
        tile_async<D>(sm + FA_TILE(D), v16 + mat, 0, T);
        cp_async_commit();
    }
    for (int kt = 0; kt < nk; kt++) {
        const int k0 = kt * FA_ROWS, cur = kt & 1;
        if (kt + 1 < nk) {
            __nv_bfloat16 *nb = sm + (cur ^ 1) * 2 * FA_TILE(D);
            tile_async<D>(nb, k16 + mat, k0 + FA_ROWS, T);
            tile_async<D>(nb + FA_TILE(D), v16 + mat, k0 + FA_ROWS, T);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const __nv_bfloat16 *Ks = sm + cur * 2 * FA_TILE(D), *Vs = Ks + FA_TILE(D);

        float s[8][4], dp[8][4];
        mma_abt<D>(s, qf, Ks);  /* S = Q K^T */
        mma_abt<D>(dp, of, Vs); /* dP = dO V^T */
        const bool edge = k0 + FA_ROWS > T || q0 + FA_ROWS > T || (causal && k0 + FA_ROWS - 1 > q0);
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = exp2f(s[nt][e] * sl2 - L[e >> 1]);
                if (edge) {
                    const int key = k0 + nt * 8 + 2 * t + (e & 1), row = row0 + (e >> 1) * 8;
                    if (key >= T || row >= T || (causal && key > row)) p = 0.0f;
                }
                s[nt][e] = p * (dp[nt][e] - Dr[e >> 1]); /* dS */
            }
        mma_pv<D>(dq, s, Ks); /* dQ += dS K (times scale below) */
        __syncthreads();      /* this buffer is the next iteration's prefetch target */
    }

#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int row = row0 + 8 * i;
        if (row >= T) continue;
        float *pq = dqkv + ((size_t)b * T + row) * ld + (size_t)h * D + 2 * t;
#pragma unroll
        for (int nt = 0; nt < D / 8; nt++) {
            pq[nt * 8] += dq[nt][2 * i] * scale;
            pq[nt * 8 + 1] += dq[nt][2 * i + 1] * scale;
        }
    }
}

/* CDP_CUDA_ATTENTION=materialized keeps attention.cu's T x T path under bf16
 * (to compare the two); read once. */
static bool flash_enabled(void)
{
    static int mode = -1;
    if (mode < 0) {
        const char *e = getenv("CDP_CUDA_ATTENTION");
        mode = e && strcmp(e, "materialized") == 0 ? 0 : 1;
    }
    return mode == 1;
}

bool cdp_cuda_flash_usable(const struct cdp_cuda_state *s, int B, int T, int C, int NH)
{
#if CDP_CUDA_ARCH >= 80
    if (s->precision != CDP_PRECISION_BF16 || NH <= 0 || C % NH != 0) return false;
    const int HS = C / NH;
    return (HS == 32 || HS == 64) && T > HS && (long long)B * NH <= 65535 && flash_enabled();
#else
    (void)s, (void)B, (void)T, (void)C, (void)NH;
    (void)flash_enabled;
    return false; /* mma.sync on bf16 needs sm_80 */
#endif
}

/* q, k, v packed (flash_pack_qkv_kernel) at the start of the workspace;
 * `extra` more bytes after them, at *rest */
template <int D>
static cdp_status pack_qkv(struct cdp_cuda_state *s, const float *qkv, int B, int T, int C, int NH, size_t extra,
                           __nv_bfloat16 **packed, void **rest)
{
    const size_t plane = (size_t)B * T * C, bytes = cdp_cuda_align(3 * plane * sizeof(__nv_bfloat16));
    void *ws;
    cdp_status rc = cdp_cuda_workspace(s, bytes + extra, &ws);
    if (rc) return rc;
    *packed = (__nv_bfloat16 *)ws;
    if (rest) *rest = (char *)ws + bytes;
    const size_t n8 = 3 * plane / 8;
    flash_pack_qkv_kernel<D><<<cdp_cuda_blocks(n8, CDP_CUDA_THREADS), CDP_CUDA_THREADS, 0, s->stream>>>(
        *packed, qkv, B, T, C, NH);
    CDP_CUDA_LAUNCHED("flash_pack_qkv_kernel");
    return CDP_OK;
}

template <int D>
static cdp_status flash_fwd(struct cdp_cuda_state *s, float *out, float *att, const float *qkv, int B, int T, int C,
                            int NH, int causal)
{
    const float sl2 = FA_LOG2E / sqrtf((float)D);
    float *lse = att, *ocopy = att + (size_t)B * NH * T;
    const size_t plane = (size_t)B * T * C;
    __nv_bfloat16 *p;
    cdp_status rc = pack_qkv<D>(s, qkv, B, T, C, NH, 0, &p, NULL);
    if (rc) return rc;
    const dim3 grid((unsigned)((T + FA_ROWS - 1) / FA_ROWS), (unsigned)(B * NH));
    flash_fwd_kernel<D><<<grid, FA_THREADS, 0, s->stream>>>(out, lse, ocopy, p, p + plane, p + 2 * plane, T, C, NH,
                                                            sl2, causal);
    CDP_CUDA_LAUNCHED("flash_fwd_kernel");
    return CDP_OK;
}

template <int D>
static cdp_status flash_bwd(struct cdp_cuda_state *s, float *dqkv, const float *dout, const float *qkv,
                            const float *att, int B, int T, int C, int NH, int causal)
{
    const float scale = 1.0f / sqrtf((float)D), sl2 = FA_LOG2E * scale;
    const size_t rows = (size_t)B * NH * T, plane = (size_t)B * T * C;
    const float *lse = att, *ocopy = att + rows;
    const size_t do_bytes = cdp_cuda_align(plane * sizeof(__nv_bfloat16));
    __nv_bfloat16 *p;
    void *rest;
    cdp_status rc = pack_qkv<D>(s, qkv, B, T, C, NH, do_bytes + rows * sizeof(float), &p, &rest);
    if (rc) return rc;
    __nv_bfloat16 *do16 = (__nv_bfloat16 *)rest;
    float *dsum = (float *)((char *)rest + do_bytes);
    const unsigned warps_per_block = 8;
    flash_pack_dout_kernel<D><<<(unsigned)((rows + warps_per_block - 1) / warps_per_block), warps_per_block * 32, 0,
                                s->stream>>>(do16, dsum, dout, ocopy, rows, T, NH);
    CDP_CUDA_LAUNCHED("flash_pack_dout_kernel");
    const dim3 grid((unsigned)((T + FA_ROWS - 1) / FA_ROWS), (unsigned)(B * NH));
    flash_bwd_dkdv_kernel<D><<<grid, FA_THREADS, 0, s->stream>>>(dqkv, p, p + plane, p + 2 * plane, do16, lse, dsum,
                                                                 T, C, NH, sl2, scale, causal);
    CDP_CUDA_LAUNCHED("flash_bwd_dkdv_kernel");
    flash_bwd_dq_kernel<D><<<grid, FA_THREADS, 0, s->stream>>>(dqkv, p, p + plane, p + 2 * plane, do16, lse, dsum, T,
                                                               C, NH, sl2, scale, causal);
    CDP_CUDA_LAUNCHED("flash_bwd_dq_kernel");
    return CDP_OK;
}

cdp_status cdp_cuda_flash_fwd(struct cdp_cuda_state *s, float *out, float *att, const float *qkv, int B, int T,
                              int C, int NH, int causal)
{
    return C / NH == 64 ? flash_fwd<64>(s, out, att, qkv, B, T, C, NH, causal)
                        : flash_fwd<32>(s, out, att, qkv, B, T, C, NH, causal);
}

cdp_status cdp_cuda_flash_bwd(struct cdp_cuda_state *s, float *dqkv, const float *dout, const float *qkv,
                              const float *att, int B, int T, int C, int NH, int causal)
{
    return C / NH == 64 ? flash_bwd<64>(s, dqkv, dout, qkv, att, B, T, C, NH, causal)
                        : flash_bwd<32>(s, dqkv, dout, qkv, att, B, T, C, NH, causal);
}
