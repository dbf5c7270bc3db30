/* Row-major matrix products on cuBLAS and the bf16 operand copies, shared by
 * the CUDA kernels that multiply matrices (linear, attention, conv). Internal
 * to the CUDA module; CUDA C++ only. Implemented in linear.cu. */
#ifndef CDP_KERNELS_CUDA_GEMM_H
#define CDP_KERNELS_CUDA_GEMM_H

#include "kernels/cuda/cuda_state.h"

/* C = alpha op(A) op(B) + beta C on row-major matrices, with the arguments of
 * cblas_sgemm(CblasRowMajor, ...): op(A) is M x K, op(B) is K x N, C is M x N;
 * lda, ldb, ldc count elements between consecutive stored rows. `batch`
 * products run at once, operand i starting at A + i * strideA (likewise B, C;
 * strides in elements). A and B are float, or __nv_bfloat16 when bf16 is set;
 * either way the products accumulate in fp32 into the float C (no TF32).
 * With K == 0 only beta 0 or 1 is accepted. Queued on s->stream. */
cdp_status cdp_cuda_gemm(struct cdp_cuda_state *s, bool bf16, bool transA, bool transB, int M, int N, int K,
                         float alpha, const void *A, int lda, long long strideA, const void *B, int ldb,
                         long long strideB, float beta, float *C, int ldc, long long strideC, int batch);

/* dst[n] = src[n] rounded to bf16 (to nearest, ties to even); dst 8-byte
 * aligned (every caller's is a workspace piece). */
cdp_status cdp_cuda_to_bf16(struct cdp_cuda_state *s, __nv_bfloat16 *dst, const float *src, size_t n);

/* dst[n] = src[n] rounded to bf16 and widened back to float: bf16 operands for
 * a library that takes float data (cuDNN convolutions). dst may equal src. */
cdp_status cdp_cuda_round_bf16(struct cdp_cuda_state *s, float *dst, const float *src, size_t n);

/* Bytes rounded up to 256, so that pieces carved one after the other out of
 * the workspace stay aligned for cuBLAS and cuDNN. */
static inline size_t cdp_cuda_align(size_t bytes)
{
    return (bytes + 255) & ~(size_t)255;
}

#endif
