/* Linear layer on the GPU (y = x W^T + b), and the row-major GEMM helper and
 * bf16 conversions that attention and conv share (kernels/cuda/gemm.h).
 * Shapes: N rows, IC input features, OC output features; in[N,IC],
 * w[OC,IC] (PyTorch's layout), b[OC], out[N,OC], all row-major. */
#include "kernels/cuda/cuda_state.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/ops_cuda.h"

/* ---- the row-major GEMM ---------------------------------------------------- */

cdp_status cdp_cuda_gemm(struct cdp_cuda_state *s, bool bf16, bool transA, bool transB, int M, int N, int K,
                         float alpha, const void *A, int lda, long long strideA, const void *B, int ldb,
                         long long strideB, float beta, float *C, int ldc, long long strideC, int batch)
{
    if (M <= 0 || N <= 0 || batch <= 0) return CDP_OK;
    if (K <= 0) {
        /* an empty sum: C = beta C. cuBLAS would reject lda = 0, so do it here. */
        if (beta == 1.0f) return CDP_OK;
        if (beta != 0.0f)
            return CDP_CUDA_FAIL(CDP_ERR_INTERNAL, "cdp_cuda_gemm: K = 0 with beta = %g", (double)beta);
        for (int i = 0; i < batch; i++)
            CDP_CUDA_TRY(cudaMemset2DAsync(C + (size_t)i * (size_t)strideC, (size_t)ldc * sizeof(float), 0,
                                           (size_t)N * sizeof(float), (size_t)M, s->stream));
        return CDP_OK;
    }
    cublasHandle_t h;
    cdp_status st = cdp_cuda_cublas(s, &h);
    if (st) return st;
    /* cuBLAS is column-major: the row-major C[M,N] (ldc) is the column-major
     * C^T[N,M] with the same ldc, and C^T = op(B)^T op(A)^T. So cuBLAS gets
     * B first and A second, each with its own transpose flag unchanged (a
     * stored row-major matrix read column-major is already its transpose),
     * and m = N, n = M. */
    cublasOperation_t opA = transA ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opB = transB ? CUBLAS_OP_T : CUBLAS_OP_N;
    cudaDataType_t t = bf16 ? CUDA_R_16BF : CUDA_R_32F;
    if (batch == 1) {
        CDP_CUBLAS_TRY(cublasGemmEx(h, opB, opA, N, M, K, &alpha, B, t, ldb, A, t, lda, &beta, C, CUDA_R_32F,
                                    ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    } else {
        CDP_CUBLAS_TRY(cublasGemmStridedBatchedEx(h, opB, opA, N, M, K, &alpha, B, t, ldb, strideB, A, t, lda,
                                                  strideA, &beta, C, CUDA_R_32F, ldc, strideC, batch,
                                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    return CDP_OK;
}

/* ---- bf16 conversions -------------------------------------------------------- */

static __global__ void to_bf16_kernel(__nv_bfloat16 *dst, const float *src, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = __float2bfloat16_rn(src[i]);
}

static __global__ void round_bf16_kernel(float *dst, const float *src, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = __bfloat162float(__float2bfloat16_rn(src[i]));
}

cdp_status cdp_cuda_to_bf16(struct cdp_cuda_state *s, __nv_bfloat16 *dst, const float *src, size_t n)
{
    if (n == 0) return CDP_OK;
    to_bf16_kernel<<<cdp_cuda_blocks(n, CDP_CUDA_THREADS), CDP_CUDA_THREADS, 0, s->stream>>>(dst, src, n);
    CDP_CUDA_LAUNCHED("to_bf16_kernel");
    return CDP_OK;
}

cdp_status cdp_cuda_round_bf16(struct cdp_cuda_state *s, float *dst, const float *src, size_t n)
{
    if (n == 0) return CDP_OK;
    round_bf16_kernel<<<cdp_cuda_blocks(n, CDP_CUDA_THREADS), CDP_CUDA_THREADS, 0, s->stream>>>(dst, src, n);
    CDP_CUDA_LAUNCHED("round_bf16_kernel");
    return CDP_OK;
}

/* ---- linear ------------------------------------------------------------------ */

/* out[i, j] = b[j]: seeds the output so that the GEMM adds onto it (beta = 1),
 * one write pass instead of a read-modify-write pass after the product. */
static __global__ void bias_fill_kernel(float *out, const float *b, size_t n, int OC)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = b[i % (size_t)OC];
}

/* db[o] += sum over the N rows of dout[:, o]. A block owns 32 columns; its
 * DB_ROWS thread rows stride over the N rows (coalesced across the 32 lanes)
 * and are combined in a fixed order, so the result is deterministic. */
#define DB_ROWS 32
static __global__ void colsum_add_kernel(float *db, const float *dout, int N, int OC)
{
    __shared__ float part[DB_ROWS][33];
    int o = blockIdx.x * 32 + threadIdx.x;
    float acc = 0.0f;
    if (o < OC)
        for (int r = threadIdx.y; r < N; r += DB_ROWS)
            acc += dout[(size_t)r * OC + o];
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && o < OC) {
        float t = 0.0f;
        for (int y = 0; y < DB_ROWS; y++)
            t += part[y][threadIdx.x];
        db[o] += t;
    }
}

static cdp_status check_dims(int N, int IC, int OC)
{
    if (N < 0 || IC < 0 || OC < 0)
        return CDP_CUDA_FAIL(CDP_ERR_INVALID, "linear: negative size (N %d, IC %d, OC %d)", N, IC, OC);
    return CDP_OK;
}

/* dst[rows_p, ld] = src[rows, cols] rounded to bf16, zero outside it (the
 * padding adds nothing to a product). */
static __global__ void to_bf16_rows_kernel(__nv_bfloat16 *dst, const float *src, size_t rows, size_t cols,
                                           size_t rows_p, size_t ld)
{
    const size_t n = rows_p * ld;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / ld, c = i - r * ld;
        dst[i] = r < rows && c < cols ? __float2bfloat16_rn(src[r * cols + c]) : __float2bfloat16_rn(0.0f);
    }
}

static cdp_status to_bf16_padded(struct cdp_cuda_state *s, __nv_bfloat16 *dst, const float *src, int rows, int cols,
                                 int rows_p, int ld)
{
    size_t n = (size_t)rows_p * ld;
    to_bf16_rows_kernel<<<cdp_cuda_blocks(n, CDP_CUDA_THREADS), CDP_CUDA_THREADS, 0, s->stream>>>(
        dst, src, (size_t)rows, (size_t)cols, (size_t)rows_p, (size_t)ld);
    CDP_CUDA_LAUNCHED("to_bf16_rows_kernel");
    return CDP_OK;
}

/* out[r, c] = tmp[r, c] (leading dimension ld) + b[c] (b may be NULL). */
static __global__ void unpad_bias_kernel(float *out, const float *tmp, const float *b, size_t rows, size_t cols,
                                         size_t ld)
{
    const size_t n = rows * cols;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / cols, c = i - r * cols;
        out[i] = tmp[r * ld + c] + (b ? b[c] : 0.0f);
    }
}

/* cuBLAS takes its fast tensor-core kernels only when the contiguous extent of
 * every operand is a multiple of 8 elements; a width like GPT-2's vocabulary
 * (50257) sends it to slow unaligned ones. In bf16 the operands are copied
 * anyway, so the copies are padded with zeros to multiples of 8 (the padding
 * adds nothing), and a forward's output goes through a padded temporary. */
static inline int pad8(int n) { return (n + 7) & ~7; }

cdp_status cdp_cuda_linear_fwd(void *st, float *out, const float *in, const float *w, const float *b, int N,
                               int IC, int OC)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)st;
    cdp_status rc = check_dims(N, IC, OC);
    if (rc) return rc;
    if (N == 0 || OC == 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));

    if (s->precision == CDP_PRECISION_BF16 && IC > 0 && (OC % 8 || IC % 8)) {
        const int OCp = pad8(OC), ICp = pad8(IC);
        size_t nin = (size_t)N * ICp, nw = (size_t)OCp * ICp, nt = (size_t)N * OCp;
        size_t off_w = cdp_cuda_align(nin * 2), off_t = off_w + cdp_cuda_align(nw * 2);
        void *ws;
        if ((rc = cdp_cuda_workspace(s, off_t + cdp_cuda_align(nt * 4), &ws))) return rc;
        __nv_bfloat16 *in16 = (__nv_bfloat16 *)ws, *w16 = (__nv_bfloat16 *)((char *)ws + off_w);
        float *tmp = (float *)((char *)ws + off_t);
        if ((rc = to_bf16_padded(s, in16, in, N, IC, N, ICp))) return rc;
        if ((rc = to_bf16_padded(s, w16, w, OC, IC, OCp, ICp))) return rc;
        if ((rc = cdp_cuda_gemm(s, true, false, true, N, OCp, ICp, 1.0f, in16, ICp, 0, w16, ICp, 0, 0.0f, tmp, OCp,
                                0, 1)))
            return rc;
        unpad_bias_kernel<<<cdp_cuda_blocks((size_t)N * OC, CDP_CUDA_THREADS), CDP_CUDA_THREADS, 0, s->stream>>>(
            out, tmp, b, (size_t)N, (size_t)OC, (size_t)OCp);
        CDP_CUDA_LAUNCHED("unpad_bias_kernel");
        return CDP_OK;
    }

    float beta = 0.0f;
    if (b) {
        size_t n = (size_t)N * OC;
        bias_fill_kernel<<<cdp_cuda_blocks(n, CDP_CUDA_THREADS), CDP_CUDA_THREADS, 0, s->stream>>>(out, b, n,
                                                                                                   OC);
        CDP_CUDA_LAUNCHED("bias_fill_kernel");
        beta = 1.0f;
    }
    const void *A = in, *Bm = w;
    bool bf16 = s->precision == CDP_PRECISION_BF16 && IC > 0;
    if (bf16) {
        size_t nin = (size_t)N * IC, nw = (size_t)OC * IC;
        void *ws;
        if ((rc = cdp_cuda_workspace(s, cdp_cuda_align(nin * 2) + cdp_cuda_align(nw * 2), &ws))) return rc;
        __nv_bfloat16 *in16 = (__nv_bfloat16 *)ws;
        __nv_bfloat16 *w16 = (__nv_bfloat16 *)((char *)ws + cdp_cuda_align(nin * 2));
        if ((rc = cdp_cuda_to_bf16(s, in16, in, nin))) return rc;
        if ((rc = cdp_cuda_to_bf16(s, w16, w, nw))) return rc;
        A = in16;
        Bm = w16;
    }
    /* out[N,OC] (+)= in[N,IC] . w[OC,IC]^T */
    return cdp_cuda_gemm(s, bf16, false, true, N, OC, IC, 1.0f, A, IC, 0, Bm, IC, 0, beta, out, OC, 0, 1);
}

cdp_status cdp_cuda_linear_bwd(void *st, float *din, float *dw, float *db, const float *dout, const float *in,
                               const float *w, int N, int IC, int OC)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)st;
    cdp_status rc = check_dims(N, IC, OC);
    if (rc) return rc;
    /* no rows: nothing to add; no outputs: dout is empty and adds nothing */
    if (N == 0 || OC == 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));

    if (db) {
        dim3 block(32, DB_ROWS);
        unsigned grid = (unsigned)((OC + 31) / 32);
        colsum_add_kernel<<<grid, block, 0, s->stream>>>(db, dout, N, OC);
        CDP_CUDA_LAUNCHED("colsum_add_kernel");
    }
    if ((!din && !dw) || IC == 0) return CDP_OK;

    const void *dO = dout, *W = w, *X = in;
    bool bf16 = s->precision == CDP_PRECISION_BF16;
    int ldo = OC, ldi = IC, K = OC;
    if (bf16 && (OC % 8 || IC % 8)) {
        /* zero-padded copies (see linear_fwd): din's product runs over OCp */
        ldo = pad8(OC);
        ldi = pad8(IC);
        K = ldo;
        size_t ndo = (size_t)N * ldo, nw = din ? (size_t)ldo * ldi : 0, nx = dw ? (size_t)N * ldi : 0;
        size_t off_w = cdp_cuda_align(ndo * 2), off_x = off_w + cdp_cuda_align(nw * 2);
        void *ws;
        if ((rc = cdp_cuda_workspace(s, off_x + cdp_cuda_align(nx * 2), &ws))) return rc;
        __nv_bfloat16 *do16 = (__nv_bfloat16 *)ws;
        __nv_bfloat16 *w16 = (__nv_bfloat16 *)((char *)ws + off_w);
        __nv_bfloat16 *x16 = (__nv_bfloat16 *)((char *)ws + off_x);
        if ((rc = to_bf16_padded(s, do16, dout, N, OC, N, ldo))) return rc;
        if (din && (rc = to_bf16_padded(s, w16, w, OC, IC, ldo, ldi))) return rc;
        if (dw && (rc = to_bf16_padded(s, x16, in, N, IC, N, ldi))) return rc;
        dO = do16;
        W = w16;
        X = x16;
    } else if (bf16) {
        size_t ndo = (size_t)N * OC, nw = din ? (size_t)OC * IC : 0, nx = dw ? (size_t)N * IC : 0;
        size_t off_w = cdp_cuda_align(ndo * 2), off_x = off_w + cdp_cuda_align(nw * 2);
        void *ws;
        if ((rc = cdp_cuda_workspace(s, off_x + cdp_cuda_align(nx * 2), &ws))) return rc;
        __nv_bfloat16 *do16 = (__nv_bfloat16 *)ws;
        __nv_bfloat16 *w16 = (__nv_bfloat16 *)((char *)ws + off_w);
        __nv_bfloat16 *x16 = (__nv_bfloat16 *)((char *)ws + off_x);
        if ((rc = cdp_cuda_to_bf16(s, do16, dout, ndo))) return rc;
        if ((rc = cdp_cuda_to_bf16(s, w16, w, nw))) return rc;
        if ((rc = cdp_cuda_to_bf16(s, x16, in, nx))) return rc;
        dO = do16;
        W = w16;
        X = x16;
    }
    /* din[N,IC] += dout[N,OC] . w[OC,IC] */
    if (din && (rc = cdp_cuda_gemm(s, bf16, false, false, N, IC, K, 1.0f, dO, ldo, 0, W, ldi, 0, 1.0f, din, IC,
                                   0, 1)))
        return rc;
    /* dw[OC,IC] += dout[N,OC]^T . in[N,IC] */
    if (dw && (rc = cdp_cuda_gemm(s, bf16, true, false, OC, IC, N, 1.0f, dO, ldo, 0, X, ldi, 0, 1.0f, dw, IC, 0,
                                  1)))
        return rc;
    return CDP_OK;
}
