/* Linear layer on the GPU (y = x W^T + b), and the row-major GEMM helper and
 * bf16 conversions that attention and conv share (kernels/cuda/gemm.h).
 * Shapes: N rows, IC input features, OC output features; in[N,IC],
 * w[OC,IC] (PyTorch's layout), b[OC], out[N,OC], all row-major.
 *
 * bf16, widths multiples of 8: the operands are copied to bf16 (round to
 * nearest even) and the forward is one cuBLASLt matmul whose epilogue adds the
 * bias, so the output is written once (no bias pass before it, no beta = 1
 * read of it); should cuBLASLt offer no kernel, a bias fill and cublasGemmEx
 * do the same. Other widths go through zero-padded copies (see pad8).
 * (Passing the fp32 tensors with CUBLAS_COMPUTE_32F_FAST_16BF instead of
 * copying was measured slower on an H200: 41.9 against 34.6 ms per GPT-2
 * step; docs/gpu.md.) */
#include "cdp/log.h"
#include "kernels/cuda/cuda_state.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/ops_cuda.h"

#include <stdint.h>
#include <string.h>

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
    const cublasComputeType_t ct = CUBLAS_COMPUTE_32F;
    if (batch == 1) {
        CDP_CUBLAS_TRY(cublasGemmEx(h, opB, opA, N, M, K, &alpha, B, t, ldb, A, t, lda, &beta, C, CUDA_R_32F,
                                    ldc, ct, CUBLAS_GEMM_DEFAULT));
    } else {
        CDP_CUBLAS_TRY(cublasGemmStridedBatchedEx(h, opB, opA, N, M, K, &alpha, B, t, ldb, strideB, A, t, lda,
                                                  strideA, &beta, C, CUDA_R_32F, ldc, strideC, batch, ct,
                                                  CUBLAS_GEMM_DEFAULT));
    }
    return CDP_OK;
}

/* ---- bf16 conversions -------------------------------------------------------- */

/* Four elements per thread and step, stored as one 8-byte write (dst comes
 * from the 256-byte aligned workspace); the reads are one float4 when src is
 * 16-byte aligned (activation views need not be), else four scalars. */
static __global__ void to_bf16_kernel(__nv_bfloat16 *dst, const float *src, size_t n)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x, n4 = n / 4;
    const bool a16 = ((uintptr_t)src & 15u) == 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 v;
        if (a16) {
            v = reinterpret_cast<const float4 *>(src)[i];
        } else {
            const float *p = src + 4 * i;
            v = make_float4(p[0], p[1], p[2], p[3]);
        }
        __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
        uint2 u;
        u.x = *reinterpret_cast<uint32_t *>(&lo);
        u.y = *reinterpret_cast<uint32_t *>(&hi);
        reinterpret_cast<uint2 *>(dst)[i] = u;
    }
    for (size_t i = 4 * n4 + (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
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
    to_bf16_kernel<<<cdp_cuda_blocks((n + 3) / 4, CDP_CUDA_THREADS), CDP_CUDA_THREADS, 0, s->stream>>>(dst, src, n);
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

/* db[o] += sum over the N rows of dout[:, o], in two deterministic steps:
 * blocks of 32 columns x DB_ROWS thread rows each sum one chunk of rows
 * (coalesced across the 32 lanes) into partial[chunk][o], then one thread per
 * column adds the chunks in order. Chunking the rows keeps every multiprocessor
 * busy: one block per 32 columns alone gave GPT-2's 768-wide biases 24 blocks. */
#define DB_ROWS 8
#define DB_CHUNK_ROWS 64
#define DB_MAX_CHUNKS 256
static __global__ void colsum_partial_kernel(float *__restrict__ part, const float *__restrict__ dout, int N, int OC,
                                             int chunk_rows)
{
    __shared__ float sh[DB_ROWS][33];
    const int o = blockIdx.x * 32 + threadIdx.x;
    const int r0 = blockIdx.y * chunk_rows, r1 = min(N, r0 + chunk_rows);
    float acc = 0.0f;
    if (o < OC)
        for (int r = r0 + threadIdx.y; r < r1; r += DB_ROWS)
            acc += dout[(size_t)r * OC + o];
    sh[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && o < OC) {
        float t = 0.0f;
        for (int y = 0; y < DB_ROWS; y++)
            t += sh[y][threadIdx.x];
        part[(size_t)blockIdx.y * OC + o] = t;
    }
}

static __global__ void colsum_final_kernel(float *db, const float *__restrict__ part, int OC, int nchunks)
{
    for (int o = blockIdx.x * blockDim.x + threadIdx.x; o < OC; o += gridDim.x * blockDim.x) {
        float t = 0.0f;
        for (int k = 0; k < nchunks; k++)
            t += part[(size_t)k * OC + o];
        db[o] += t;
    }
}

static cdp_status colsum_add(struct cdp_cuda_state *s, float *db, const float *dout, int N, int OC)
{
    int chunk_rows = DB_CHUNK_ROWS;
    if ((N - 1) / chunk_rows + 1 > DB_MAX_CHUNKS) chunk_rows = (N - 1) / DB_MAX_CHUNKS + 1;
    const int nchunks = (N - 1) / chunk_rows + 1;
    void *ws;
    cdp_status rc = cdp_cuda_workspace(s, (size_t)nchunks * OC * sizeof(float), &ws);
    if (rc) return rc;
    float *part = (float *)ws;
    const dim3 block(32, DB_ROWS), grid((unsigned)((OC + 31) / 32), (unsigned)nchunks);
    colsum_partial_kernel<<<grid, block, 0, s->stream>>>(part, dout, N, OC, chunk_rows);
    CDP_CUDA_LAUNCHED("colsum_partial_kernel");
    colsum_final_kernel<<<cdp_cuda_blocks((size_t)OC, CDP_CUDA_THREADS), CDP_CUDA_THREADS, 0, s->stream>>>(
        db, part, OC, nchunks);
    CDP_CUDA_LAUNCHED("colsum_final_kernel");
    return CDP_OK;
}

static cdp_status check_dims(int N, int IC, int OC)
{
    if (N < 0 || IC < 0 || OC < 0)
        return CDP_CUDA_FAIL(CDP_ERR_INVALID, "linear: negative size (N %d, IC %d, OC %d)", N, IC, OC);
    return CDP_OK;
}

/* Kernels over a padded matrix go row by row: a block per row (striding
 * over the rows), its threads along the row, so no element pays for a 64-bit
 * division to find its row (which cost as much as the memory traffic on the
 * 8192 x 50264 logits of GPT-2's head). */
static unsigned row_grid(size_t rows)
{
    return (unsigned)(rows < 1 ? 1 : rows > 65535u * 16u ? 65535u * 16u : rows);
}

/* dst[rows_p, ld] = src[rows, cols] rounded to bf16, zero outside it (the
 * padding adds nothing to a product). */
static __global__ void to_bf16_rows_kernel(__nv_bfloat16 *dst, const float *src, size_t rows, size_t cols,
                                           size_t rows_p, size_t ld)
{
    /* ld is a multiple of 8 and dst 16-byte aligned: 8 elements per store */
    for (size_t r = blockIdx.x; r < rows_p; r += gridDim.x) {
        const float *s = src + r * cols;
        uint4 *d = reinterpret_cast<uint4 *>(dst + r * ld);
        const size_t n = r < rows ? cols : 0;
        for (size_t c8 = threadIdx.x; c8 < ld / 8; c8 += blockDim.x) {
            const size_t c = 8 * c8;
            float v[8];
#pragma unroll
            for (int k = 0; k < 8; k++)
                v[k] = c + k < n ? s[c + k] : 0.0f;
            __nv_bfloat162 p0 = __floats2bfloat162_rn(v[0], v[1]), p1 = __floats2bfloat162_rn(v[2], v[3]),
                           p2 = __floats2bfloat162_rn(v[4], v[5]), p3 = __floats2bfloat162_rn(v[6], v[7]);
            uint4 u;
            u.x = *reinterpret_cast<uint32_t *>(&p0);
            u.y = *reinterpret_cast<uint32_t *>(&p1);
            u.z = *reinterpret_cast<uint32_t *>(&p2);
            u.w = *reinterpret_cast<uint32_t *>(&p3);
            d[c8] = u;
        }
    }
}

static cdp_status to_bf16_padded(struct cdp_cuda_state *s, __nv_bfloat16 *dst, const float *src, int rows, int cols,
                                 int rows_p, int ld)
{
    to_bf16_rows_kernel<<<row_grid((size_t)rows_p), CDP_CUDA_THREADS, 0, s->stream>>>(
        dst, src, (size_t)rows, (size_t)cols, (size_t)rows_p, (size_t)ld);
    CDP_CUDA_LAUNCHED("to_bf16_rows_kernel");
    return CDP_OK;
}

/* out[r, c] = tmp[r, c] (leading dimension ld) + b[c] (b may be NULL). */
static __global__ void unpad_bias_kernel(float *out, const float *tmp, const float *b, size_t rows, size_t cols,
                                         size_t ld)
{
    /* tmp's rows are 16-byte aligned (ld a multiple of 8, a workspace
     * pointer): float4 reads; out's rows (cols apart) need not be */
    const size_t n4 = cols / 4;
    for (size_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *t = tmp + r * ld;
        const float4 *t4 = reinterpret_cast<const float4 *>(t);
        float *o = out + r * cols;
        for (size_t i = threadIdx.x; i < n4; i += blockDim.x) {
            const float4 v = t4[i];
            const size_t c = 4 * i;
            if (b) {
                o[c] = v.x + b[c];
                o[c + 1] = v.y + b[c + 1];
                o[c + 2] = v.z + b[c + 2];
                o[c + 3] = v.w + b[c + 3];
            } else {
                o[c] = v.x;
                o[c + 1] = v.y;
                o[c + 2] = v.z;
                o[c + 3] = v.w;
            }
        }
        for (size_t c = 4 * n4 + threadIdx.x; c < cols; c += blockDim.x)
            o[c] = t[c] + (b ? b[c] : 0.0f);
    }
}

/* cuBLAS takes its fast tensor-core kernels only when the contiguous extent of
 * every operand is a multiple of 8 elements; a width like GPT-2's vocabulary
 * (50257) sends it to slow unaligned ones. In bf16 the operands are copied
 * anyway, so the copies are padded with zeros to multiples of 8 (the padding
 * adds nothing), and a forward's output goes through a padded temporary. */
static inline int pad8(int n) { return (n + 7) & ~7; }

/* ---- the forward as one cuBLASLt matmul with a bias epilogue ------------------ */

/* cuBLASLt's own workspace, carved after an op's other pieces: 32 MiB is what
 * NVIDIA recommends for Hopper's matmul kernels. */
#define LT_WORKSPACE ((size_t)32 << 20)

/* The largest power of two up to 256 that divides the address: what the
 * heuristic may assume of a pointer (its default assumption is 256). */
static unsigned alignment(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    unsigned al = 256;
    while (al > 1 && a % al) al >>= 1;
    return al;
}

static struct cdp_cuda_lt_algo *lt_algo_find(struct cdp_cuda_state *s, const struct cdp_cuda_lt_key *key)
{
    for (int i = 0; i < CDP_CUDA_LT_ALGOS; i++)
        if (s->lt_algos[i].state && !memcmp(&s->lt_algos[i].key, key, sizeof *key)) return &s->lt_algos[i];
    return NULL;
}

static struct cdp_cuda_lt_algo *lt_algo_slot(struct cdp_cuda_state *s, const struct cdp_cuda_lt_key *key)
{
    struct cdp_cuda_lt_algo *e = &s->lt_algos[s->lt_next++ % CDP_CUDA_LT_ALGOS];
    e->key = *key;
    e->state = 0;
    return e;
}

/* Descriptors of one matmul, destroyed together by lt_descs_destroy on every
 * path (a NULL one was never created). */
struct lt_descs {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulPreference_t pref;
};

static void lt_descs_destroy(struct lt_descs *L)
{
    /* only destroys host-side objects; nothing to report */
    if (L->pref) cublasLtMatmulPreferenceDestroy(L->pref);
    if (L->d) cublasLtMatrixLayoutDestroy(L->d);
    if (L->b) cublasLtMatrixLayoutDestroy(L->b);
    if (L->a) cublasLtMatrixLayoutDestroy(L->a);
    if (L->op) cublasLtMatmulDescDestroy(L->op);
}

/* A failed cuBLASLt call that CDP_CUBLAS_TRY cannot wrap, because its
 * NOT_SUPPORTED is tested first (it means "take the cublasGemmEx path"). */
static cdp_status lt_fail(cublasStatus_t e, const char *call)
{
    return CDP_CUDA_FAIL(CDP_ERR_DEVICE, "%s: %s (%s)", call, cublasGetStatusString(e), cublasGetStatusName(e));
}

/* One cublasLtMatmul, beta = 0, on bf16 operands with an fp32 result, in
 * cuBLAS's column-major terms: D[m,n] = op(A) B, B and D never transposed,
 * every matrix contiguous (ld = its rows). The row-major forward maps onto it
 * as in cdp_cuda_gemm: out[N,OC] = in . w^T is m = OC, n = N, k = IC,
 * A = w (IC x OC, op T), B = in (IC x N), D = out (OC x N). The epilogue then
 * works on D in those terms: CUBLASLT_EPILOGUE_BIAS adds a bias of length m
 * (one value per output feature, broadcast over the N columns). */
struct lt_matmul {
    int m, n, k;
    cublasOperation_t opA;
    cublasLtEpilogue_t epi;
    const void *A, *B;
    float *D;
    const float *bias; /* with the BIAS epilogue */
};

static cdp_status lt_matmul_run(struct cdp_cuda_state *s, struct lt_descs *L, const struct lt_matmul *p, void *ws,
                                size_t ws_bytes, bool *done)
{
    *done = true;
    cublasLtHandle_t h;
    cdp_status rc = cdp_cuda_cublaslt(s, &h);
    if (rc) return rc;

    struct cdp_cuda_lt_key key;
    memset(&key, 0, sizeof key);
    key.m = p->m;
    key.n = p->n;
    key.k = p->k;
    key.opA = (int)p->opA;
    key.epi = (int)p->epi;
    key.align[0] = alignment(p->A);
    key.align[1] = alignment(p->B);
    key.align[2] = alignment(p->D);
    key.align[3] = p->bias ? alignment(p->bias) : 0;
    struct cdp_cuda_lt_algo *cached = lt_algo_find(s, &key);
    if (cached && cached->state < 0) {
        *done = false;
        return CDP_OK;
    }

    const cudaDataType_t t = CUDA_R_16BF;
    const cublasOperation_t opB = CUBLAS_OP_N;
    const uint64_t a_rows = p->opA == CUBLAS_OP_T ? (uint64_t)p->k : (uint64_t)p->m;
    const uint64_t a_cols = p->opA == CUBLAS_OP_T ? (uint64_t)p->m : (uint64_t)p->k;
    CDP_CUBLAS_TRY(cublasLtMatmulDescCreate(&L->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CDP_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(L->op, CUBLASLT_MATMUL_DESC_TRANSA, &p->opA, sizeof p->opA));
    CDP_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(L->op, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof opB));
    CDP_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(L->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &p->epi, sizeof p->epi));
    if (p->bias) {
        /* fp32 like D; set before the heuristic, which reads the pointer's alignment */
        const void *bias = p->bias;
        const int32_t bias_type = CUDA_R_32F;
        CDP_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(L->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
        CDP_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(L->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                      sizeof bias_type));
    }
    CDP_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&L->a, t, a_rows, a_cols, (int64_t)a_rows));
    CDP_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&L->b, t, (uint64_t)p->k, (uint64_t)p->n, (int64_t)p->k));
    CDP_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&L->d, CUDA_R_32F, (uint64_t)p->m, (uint64_t)p->n, (int64_t)p->m));

    if (!cached) {
        const uint64_t max_ws = ws_bytes;
        CDP_CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&L->pref));
        CDP_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(L->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                            &max_ws, sizeof max_ws));
        /* D may be a view that is not 256-byte aligned: only kernels that
         * cope with the real alignments */
        const uint32_t al_a = key.align[0], al_b = key.align[1], al_cd = key.align[2];
        CDP_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(L->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                            &al_a, sizeof al_a));
        CDP_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(L->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                            &al_b, sizeof al_b));
        CDP_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(L->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                            &al_cd, sizeof al_cd));
        CDP_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(L->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                            &al_cd, sizeof al_cd));
        cublasLtMatmulHeuristicResult_t r;
        int count = 0;
        memset(&r, 0, sizeof r);
        cublasStatus_t e = cublasLtMatmulAlgoGetHeuristic(h, L->op, L->a, L->b, L->d, L->d, L->pref, 1, &r, &count);
        if (e != CUBLAS_STATUS_SUCCESS && e != CUBLAS_STATUS_NOT_SUPPORTED)
            return lt_fail(e, "cublasLtMatmulAlgoGetHeuristic");
        cached = lt_algo_slot(s, &key);
        if (e == CUBLAS_STATUS_NOT_SUPPORTED || count < 1 || r.state != CUBLAS_STATUS_SUCCESS) {
            /* remembered (state -1): later calls go straight to the plain path */
            cached->state = -1;
            cdp_cuda_host->log(CDP_LOG_INFO, CDP_SUBSYS_KERNEL,
                               "cuBLASLt has no %d x %d x %d matmul with epilogue %d here; cublasGemmEx instead",
                               p->m, p->n, p->k, (int)p->epi);
            *done = false;
            return CDP_OK;
        }
        cached->algo = r.algo;
        cached->state = 1;
    }

    const float alpha = 1.0f, beta = 0.0f;
    cublasStatus_t e = cublasLtMatmul(h, L->op, &alpha, p->A, L->a, p->B, L->b, &beta, p->D, L->d, p->D, L->d,
                                      &cached->algo, ws, ws_bytes, s->stream);
    if (e == CUBLAS_STATUS_NOT_SUPPORTED) {
        cached->state = -1;
        cdp_cuda_host->log(CDP_LOG_INFO, CDP_SUBSYS_KERNEL,
                           "cublasLtMatmul %d x %d x %d, epilogue %d: not supported; cublasGemmEx instead", p->m,
                           p->n, p->k, (int)p->epi);
        *done = false;
        return CDP_OK;
    }
    if (e != CUBLAS_STATUS_SUCCESS) return lt_fail(e, "cublasLtMatmul");
    return CDP_OK;
}

/* Queues p; *done false (nothing queued) when cuBLASLt has no kernel for it. */
static cdp_status lt_matmul(struct cdp_cuda_state *s, const struct lt_matmul *p, void *ws, size_t ws_bytes,
                            bool *done)
{
    struct lt_descs L;
    memset(&L, 0, sizeof L);
    cdp_status rc = lt_matmul_run(s, &L, p, ws, ws_bytes, done);
    lt_descs_destroy(&L);
    return rc;
}

/* The forward through cuBLASLt: out = in . w^T (+ b); in16, w16 are the
 * bf16 copies. */
static cdp_status lt_linear_fwd(struct cdp_cuda_state *s, float *out, const void *in16, const void *w16,
                                const float *b, int N, int IC, int OC, void *ws, size_t ws_bytes, bool *done)
{
    struct lt_matmul p;
    memset(&p, 0, sizeof p);
    p.m = OC;
    p.n = N;
    p.k = IC;
    p.opA = CUBLAS_OP_T;
    p.A = w16;
    p.B = in16;
    p.D = out;
    p.bias = b;
    p.epi = b ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    return lt_matmul(s, &p, ws, ws_bytes, done);
}

cdp_status cdp_cuda_linear_fwd(void *ks, float *out, const float *in, const float *w, const float *b, int N,
                               int IC, int OC)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
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
        unpad_bias_kernel<<<row_grid((size_t)N), CDP_CUDA_THREADS, 0, s->stream>>>(out, tmp, b, (size_t)N,
                                                                                    (size_t)OC, (size_t)OCp);
        CDP_CUDA_LAUNCHED("unpad_bias_kernel");
        return CDP_OK;
    }

    const bool bf16 = s->precision == CDP_PRECISION_BF16 && IC > 0;
    const void *A = in, *Bm = w;
    if (bf16) {
        /* widths multiples of 8 (the others went through the padded path):
         * one workspace request for the bf16 copies followed by cuBLASLt's */
        size_t nin = (size_t)N * IC, nw = (size_t)OC * IC;
        size_t off_w = cdp_cuda_align(nin * 2), off_lt = off_w + cdp_cuda_align(nw * 2);
        void *ws;
        if ((rc = cdp_cuda_workspace(s, off_lt + LT_WORKSPACE, &ws))) return rc;
        __nv_bfloat16 *in16 = (__nv_bfloat16 *)ws;
        __nv_bfloat16 *w16 = (__nv_bfloat16 *)((char *)ws + off_w);
        if ((rc = cdp_cuda_to_bf16(s, in16, in, nin))) return rc;
        if ((rc = cdp_cuda_to_bf16(s, w16, w, nw))) return rc;
        A = in16;
        Bm = w16;
        bool done;
        if ((rc = lt_linear_fwd(s, out, A, Bm, b, N, IC, OC, (char *)ws + off_lt, LT_WORKSPACE, &done)))
            return rc;
        if (done) return CDP_OK;
        /* no cuBLASLt kernel for it: the same product through cublasGemmEx */
    }

    float beta = 0.0f;
    if (b) {
        size_t n = (size_t)N * OC;
        bias_fill_kernel<<<cdp_cuda_blocks(n, CDP_CUDA_THREADS), CDP_CUDA_THREADS, 0, s->stream>>>(out, b, n,
                                                                                                   OC);
        CDP_CUDA_LAUNCHED("bias_fill_kernel");
        beta = 1.0f;
    }
    /* out[N,OC] (+)= in[N,IC] . w[OC,IC]^T */
    return cdp_cuda_gemm(s, bf16, false, true, N, OC, IC, 1.0f, A, IC, 0, Bm, IC, 0, beta, out, OC, 0, 1);
}

cdp_status cdp_cuda_linear_bwd(void *ks, float *din, float *dw, float *db, const float *dout, const float *in,
                               const float *w, int N, int IC, int OC)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    cdp_status rc = check_dims(N, IC, OC);
    if (rc) return rc;
    /* no rows: nothing to add; no outputs: dout is empty and adds nothing */
    if (N == 0 || OC == 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));

    if (db) {
        if ((rc = colsum_add(s, db, dout, N, OC))) return rc;
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

/* ---- the backward through a GELU ------------------------------------------- */

/* db and dw as linear_bwd; dpre = (dout . w) * GELU'(pre), overwritten: the
 * product written straight into dpre (beta 0: no zeroing pass, no read of
 * what was there), then the GELU factor applied in place. bf16 with widths
 * multiples of 8: one set of bf16 copies serves both products.
 *
 * cuBLASLt's GELU epilogues were measured on an H200 (GPT-2 124M, per block)
 * and are not used: DGELU ran as a separate cuBLASLt kernel of 0.19 ms after
 * its product (0.26 ms in all), where this product plus gelu_grad_scale takes
 * 0.19 ms (0.07 + 0.125); GELU_AUX_BIAS in
 * the forward (0.146 ms with its product) saved nothing over the bias
 * epilogue's product followed by gelu_fwd (0.152 ms). */
cdp_status cdp_cuda_linear_gelu_bwd(void *ks, float *dpre, float *dw, float *db, const float *dout, const float *act,
                                    const float *pre, const float *w, int N, int IC, int OC)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    cdp_status rc = check_dims(N, IC, OC);
    if (rc) return rc;
    if (N == 0 || IC == 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    const size_t npre = (size_t)N * IC;
    if (OC == 0) /* an empty product: dpre = 0 */
        return cdp_cuda_zero(ks, dpre, npre * sizeof *dpre);
    if (s->precision == CDP_PRECISION_BF16 && IC % 8 == 0 && OC % 8 == 0) {
        if (db && (rc = colsum_add(s, db, dout, N, OC))) return rc;
        size_t ndo = (size_t)N * OC, nw = (size_t)OC * IC, nx = dw ? npre : 0;
        size_t off_w = cdp_cuda_align(ndo * 2), off_x = off_w + cdp_cuda_align(nw * 2);
        void *ws;
        if ((rc = cdp_cuda_workspace(s, off_x + cdp_cuda_align(nx * 2), &ws))) return rc;
        __nv_bfloat16 *do16 = (__nv_bfloat16 *)ws, *w16 = (__nv_bfloat16 *)((char *)ws + off_w);
        __nv_bfloat16 *x16 = (__nv_bfloat16 *)((char *)ws + off_x);
        if ((rc = cdp_cuda_to_bf16(s, do16, dout, ndo))) return rc;
        if ((rc = cdp_cuda_to_bf16(s, w16, w, nw))) return rc;
        if (dw) {
            if ((rc = cdp_cuda_to_bf16(s, x16, act, nx))) return rc;
            /* dw[OC,IC] += dout[N,OC]^T . act[N,IC] */
            if ((rc = cdp_cuda_gemm(s, true, true, false, OC, IC, N, 1.0f, do16, OC, 0, x16, IC, 0, 1.0f, dw, IC, 0,
                                    1)))
                return rc;
        }
        /* dpre[N,IC] = dout[N,OC] . w[OC,IC] */
        if ((rc = cdp_cuda_gemm(s, true, false, false, N, IC, OC, 1.0f, do16, OC, 0, w16, IC, 0, 0.0f, dpre, IC, 0,
                                1)))
            return rc;
    } else {
        if ((rc = cdp_cuda_zero(ks, dpre, npre * sizeof *dpre))) return rc;
        if ((rc = cdp_cuda_linear_bwd(ks, dpre, dw, db, dout, act, w, N, IC, OC))) return rc;
    }
    return cdp_cuda_gelu_grad_scale(ks, dpre, pre, npre);
}
