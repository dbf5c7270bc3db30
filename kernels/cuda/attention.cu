/* Multi-head self-attention on the GPU, the semantics of kernels/cpu/attention.c.
 * Under bf16, head sizes 32 and 64 take the fused kernels of
 * flash_attention.cu instead (att then holds their saved state, not the
 * probabilities); everything else takes the path below.
 * Every product is one strided-batched GEMM per sample over its NH heads,
 * reading q, k, v and writing dq, dk, dv straight inside the packed qkv
 * (leading dimension 3C, head h at column h*HS, so heads are HS apart); the
 * scores live in att itself (contiguous per head, T*T apart). Causal attention
 * computes the full T x T scores and masks them in the softmax (masked
 * probabilities are exact zeros), which costs up to twice the CPU's blocked
 * work but keeps one GEMM per product.
 * Shapes: qkv[B,T,3C] (q | k | v), out[B,T,C], att[B,NH,T,T], HS = C / NH. */
#include "kernels/cuda/cuda_state.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/ops_cuda.h"

#include <math.h>

#define WARP 32
#define ROWS_PER_BLOCK 8 /* one warp per row */

static __device__ __forceinline__ float warp_sum(float v)
{
    for (int o = WARP / 2; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v)
{
    for (int o = WARP / 2; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Row-wise softmax of the scores in att (rows of T; row r is query r % T),
 * in place; masked entries (j > i when causal) become exact zeros. With p16,
 * a bf16 copy of the probabilities is written beside them. */
static __global__ void softmax_rows_kernel(float *att, __nv_bfloat16 *p16, size_t rows, int T, int causal)
{
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / WARP;
    int lane = threadIdx.x % WARP;
    if (row >= rows) return; /* the whole warp leaves together */
    float *r = att + row * (size_t)T;
    int i = (int)(row % (size_t)T);
    int n = causal ? i + 1 : T;
    float m = -INFINITY;
    for (int j = lane; j < n; j += WARP)
        m = fmaxf(m, r[j]);
    m = warp_max(m);
    float sum = 0.0f;
    for (int j = lane; j < n; j += WARP) {
        float e = expf(r[j] - m);
        r[j] = e;
        sum += e;
    }
    float f = 1.0f / warp_sum(sum);
    /* each lane rescales the entries it wrote itself */
    for (int j = lane; j < T; j += WARP) {
        float p = j < n ? r[j] * f : 0.0f;
        r[j] = p;
        if (p16) p16[row * (size_t)T + j] = __float2bfloat16_rn(p);
    }
}

/* ds = scale * att * (datt - rowsum(att * datt)) over rows of T, in place over
 * datt (or into ds16 when given); masked entries become exact zeros. */
static __global__ void softmax_bwd_rows_kernel(float *ds, __nv_bfloat16 *ds16, const float *att, size_t rows,
                                               int T, int causal, float scale)
{
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / WARP;
    int lane = threadIdx.x % WARP;
    if (row >= rows) return;
    const float *a = att + row * (size_t)T;
    float *d = ds + row * (size_t)T;
    int i = (int)(row % (size_t)T);
    int n = causal ? i + 1 : T;
    float dot = 0.0f;
    for (int j = lane; j < n; j += WARP)
        dot += a[j] * d[j];
    dot = warp_sum(dot);
    for (int j = lane; j < T; j += WARP) {
        float v = j < n ? scale * a[j] * (d[j] - dot) : 0.0f;
        if (ds16)
            ds16[row * (size_t)T + j] = __float2bfloat16_rn(v);
        else
            d[j] = v;
    }
}

static unsigned row_blocks(size_t rows)
{
    size_t b = (rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
    return (unsigned)(b < 1 ? 1 : b);
}

static cdp_status check_dims(const char *what, int B, int T, int C, int NH)
{
    if (B < 0 || T < 0 || C < 0 || NH <= 0 || C % NH != 0)
        return CDP_CUDA_FAIL(CDP_ERR_INVALID, "%s: bad sizes (B %d, T %d, C %d, NH %d: C must split into NH heads)",
                             what, B, T, C, NH);
    if ((size_t)B * NH * T > (size_t)2147483647u * ROWS_PER_BLOCK)
        return CDP_CUDA_FAIL(CDP_ERR_INVALID, "%s: %d x %d x %d attention rows are too many", what, B, NH, T);
    return CDP_OK;
}

cdp_status cdp_cuda_attention_fwd(void *ks, float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                                  int causal)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    cdp_status rc = check_dims("attention_fwd", B, T, C, NH);
    if (rc) return rc;
    if (B == 0 || T == 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    if (cdp_cuda_flash_usable(s, B, T, C, NH)) return cdp_cuda_flash_fwd(s, out, att, qkv, B, T, C, NH, causal);
    int HS = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)HS);
    size_t TT = (size_t)T * T, nqkv = (size_t)B * T * C3, natt = (size_t)B * NH * TT;

    /* bf16: a bf16 copy of qkv (same layout) and of the probabilities */
    bool bf16 = s->precision == CDP_PRECISION_BF16 && C > 0;
    const char *X = (const char *)qkv; /* q | k | v, float or bf16 */
    size_t esz = sizeof(float);
    __nv_bfloat16 *p16 = NULL;
    if (bf16) {
        void *ws;
        if ((rc = cdp_cuda_workspace(s, cdp_cuda_align(nqkv * 2) + cdp_cuda_align(natt * 2), &ws))) return rc;
        __nv_bfloat16 *qkv16 = (__nv_bfloat16 *)ws;
        p16 = (__nv_bfloat16 *)((char *)ws + cdp_cuda_align(nqkv * 2));
        if ((rc = cdp_cuda_to_bf16(s, qkv16, qkv, nqkv))) return rc;
        X = (const char *)qkv16;
        esz = sizeof(__nv_bfloat16);
    }

    /* scores[b,h] = scale q k^T: [T,HS] x [T,HS]^T, heads HS apart in qkv,
     * T*T apart in att */
    for (int b = 0; b < B; b++) {
        const char *q = X + (size_t)b * T * C3 * esz, *k = q + (size_t)C * esz;
        if ((rc = cdp_cuda_gemm(s, bf16, false, true, T, T, HS, scale, q, C3, HS, k, C3, HS, 0.0f,
                                att + (size_t)b * NH * TT, T, (long long)TT, NH)))
            return rc;
    }
    size_t rows = (size_t)B * NH * T;
    softmax_rows_kernel<<<row_blocks(rows), ROWS_PER_BLOCK * WARP, 0, s->stream>>>(att, p16, rows, T, causal);
    CDP_CUDA_LAUNCHED("softmax_rows_kernel");

    /* out[b, :, h] = att[b,h] v: [T,T] x [T,HS], written at column h*HS of
     * out (leading dimension C) */
    for (int b = 0; b < B; b++) {
        const char *v = X + ((size_t)b * T * C3 + 2 * (size_t)C) * esz;
        const void *P = bf16 ? (const void *)(p16 + (size_t)b * NH * TT) : (const void *)(att + (size_t)b * NH * TT);
        if ((rc = cdp_cuda_gemm(s, bf16, false, false, T, HS, T, 1.0f, P, T, (long long)TT, v, C3, HS, 0.0f,
                                out + (size_t)b * T * C, C, HS, NH)))
            return rc;
    }
    return CDP_OK;
}

/* The fused kernels keep the row statistics and a copy of the output
 * (flash_attention.h); the general path the probabilities. */
size_t cdp_cuda_attention_state_floats(void *ks, int B, int T, int C, int NH)
{
    const struct cdp_cuda_state *s = (const struct cdp_cuda_state *)ks;
    if (cdp_cuda_flash_usable(s, B, T, C, NH)) return (size_t)B * NH * T + (size_t)B * T * C;
    return (size_t)B * NH * T * T;
}

cdp_status cdp_cuda_attention_bwd(void *ks, float *dqkv, const float *dout, const float *qkv, const float *att,
                                  float *scratch, int B, int T, int C, int NH, int causal)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    (void)scratch; /* T*T is one head's worth; the NH heads of a sample use the workspace */
    cdp_status rc = check_dims("attention_bwd", B, T, C, NH);
    if (rc) return rc;
    if (B == 0 || T == 0 || C == 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    if (cdp_cuda_flash_usable(s, B, T, C, NH))
        return cdp_cuda_flash_bwd(s, dqkv, dout, qkv, att, B, T, C, NH, causal);
    int HS = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)HS);
    size_t TT = (size_t)T * T, nhead = (size_t)NH * TT; /* one sample's att */
    size_t nqkv = (size_t)B * T * C3, nout = (size_t)B * T * C;
    bool bf16 = s->precision == CDP_PRECISION_BF16;

    /* Workspace, one sample at a time: ds[NH,T,T] (datt, then dscores, fp32);
     * bf16 adds copies of qkv and dout (whole) and of att and ds (a sample). */
    size_t off_qkv = cdp_cuda_align(nhead * sizeof(float));
    size_t off_dout = off_qkv + (bf16 ? cdp_cuda_align(nqkv * 2) : 0);
    size_t off_att = off_dout + (bf16 ? cdp_cuda_align(nout * 2) : 0);
    size_t off_ds = off_att + (bf16 ? cdp_cuda_align(nhead * 2) : 0);
    size_t total = off_ds + (bf16 ? cdp_cuda_align(nhead * 2) : 0);
    void *ws;
    if ((rc = cdp_cuda_workspace(s, total, &ws))) return rc;
    float *ds = (float *)ws;
    const char *X = (const char *)qkv, *DO = (const char *)dout;
    size_t esz = sizeof(float);
    __nv_bfloat16 *att16 = NULL, *ds16 = NULL;
    if (bf16) {
        __nv_bfloat16 *qkv16 = (__nv_bfloat16 *)((char *)ws + off_qkv);
        __nv_bfloat16 *dout16 = (__nv_bfloat16 *)((char *)ws + off_dout);
        att16 = (__nv_bfloat16 *)((char *)ws + off_att);
        ds16 = (__nv_bfloat16 *)((char *)ws + off_ds);
        if ((rc = cdp_cuda_to_bf16(s, qkv16, qkv, nqkv))) return rc;
        if ((rc = cdp_cuda_to_bf16(s, dout16, dout, nout))) return rc;
        X = (const char *)qkv16;
        DO = (const char *)dout16;
        esz = sizeof(__nv_bfloat16);
    }

    size_t rows = (size_t)NH * T;
    for (int b = 0; b < B; b++) {
        const char *q = X + (size_t)b * T * C3 * esz, *k = q + (size_t)C * esz, *v = q + 2 * (size_t)C * esz;
        const char *dO = DO + (size_t)b * T * C * esz;
        float *dq = dqkv + (size_t)b * T * C3, *dk = dq + C, *dv = dq + 2 * (size_t)C;
        const float *a = att + (size_t)b * nhead;
        const void *P = a;
        if (bf16) {
            if ((rc = cdp_cuda_to_bf16(s, att16, a, nhead))) return rc;
            P = att16;
        }
        /* datt[h] = dout[h] v[h]^T: [T,HS] x [T,HS]^T */
        if ((rc = cdp_cuda_gemm(s, bf16, false, true, T, T, HS, 1.0f, dO, C, HS, v, C3, HS, 0.0f, ds, T,
                                (long long)TT, NH)))
            return rc;
        /* dv[h] += att[h]^T dout[h]: [T,T]^T x [T,HS] */
        if ((rc = cdp_cuda_gemm(s, bf16, true, false, T, HS, T, 1.0f, P, T, (long long)TT, dO, C, HS, 1.0f, dv,
                                C3, HS, NH)))
            return rc;
        softmax_bwd_rows_kernel<<<row_blocks(rows), ROWS_PER_BLOCK * WARP, 0, s->stream>>>(ds, ds16, a, rows, T,
                                                                                          causal, scale);
        CDP_CUDA_LAUNCHED("softmax_bwd_rows_kernel");
        const void *dS = bf16 ? (const void *)ds16 : (const void *)ds;
        /* dq[h] += ds[h] k[h]: [T,T] x [T,HS] */
        if ((rc = cdp_cuda_gemm(s, bf16, false, false, T, HS, T, 1.0f, dS, T, (long long)TT, k, C3, HS, 1.0f, dq,
                                C3, HS, NH)))
            return rc;
        /* dk[h] += ds[h]^T q[h]: [T,T]^T x [T,HS] */
        if ((rc = cdp_cuda_gemm(s, bf16, true, false, T, HS, T, 1.0f, dS, T, (long long)TT, q, C3, HS, 1.0f, dk,
                                C3, HS, NH)))
            return rc;
    }
    return CDP_OK;
}
