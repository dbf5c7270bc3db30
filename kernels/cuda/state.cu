/* The CUDA state's library handles, workspace and precision. */
#include "kernels/cuda/cuda_state.h"
#include "kernels/cuda/ops_cuda.h"

#include <stdlib.h>
#include <string.h>

cdp_status cdp_cuda_workspace(struct cdp_cuda_state *s, size_t bytes, void **out)
{
    if (bytes <= s->workspace_bytes && s->workspace) {
        *out = s->workspace;
        return CDP_OK;
    }
    /* the stream may still read the old area */
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    CDP_CUDA_TRY(cudaStreamSynchronize(s->stream));
    if (s->workspace) CDP_CUDA_TRY(cudaFree(s->workspace));
    s->workspace = NULL;
    s->workspace_bytes = 0;
    size_t want = bytes < ((size_t)1 << 20) ? ((size_t)1 << 20) : bytes + bytes / 4;
    CDP_CUDA_TRY(cudaMalloc(&s->workspace, want));
    s->workspace_bytes = want;
    *out = s->workspace;
    return CDP_OK;
}

cdp_status cdp_cuda_cublas(struct cdp_cuda_state *s, cublasHandle_t *out)
{
    if (!s->cublas) {
        CDP_CUDA_TRY(cudaSetDevice(s->index));
        CDP_CUBLAS_TRY(cublasCreate(&s->cublas));
        CDP_CUBLAS_TRY(cublasSetStream(s->cublas, s->stream));
        /* fp32 GEMMs stay fp32 (no TF32): the CPU reference is the oracle */
        CDP_CUBLAS_TRY(cublasSetMathMode(s->cublas, CUBLAS_DEFAULT_MATH));
    }
    *out = s->cublas;
    return CDP_OK;
}

cdp_status cdp_cuda_cublaslt(struct cdp_cuda_state *s, cublasLtHandle_t *out)
{
    if (!s->cublaslt) {
        CDP_CUDA_TRY(cudaSetDevice(s->index));
        CDP_CUBLAS_TRY(cublasLtCreate(&s->cublaslt));
    }
    *out = s->cublaslt;
    return CDP_OK;
}

#if CDP_HAVE_CUDNN
cdp_status cdp_cuda_cudnn(struct cdp_cuda_state *s, cudnnHandle_t *out)
{
    if (!s->cudnn) {
        CDP_CUDA_TRY(cudaSetDevice(s->index));
        CDP_CUDNN_TRY(cudnnCreate(&s->cudnn));
        CDP_CUDNN_TRY(cudnnSetStream(s->cudnn, s->stream));
    }
    *out = s->cudnn;
    return CDP_OK;
}
#endif

void cdp_cuda_state_release(struct cdp_cuda_state *s)
{
    if (s->cublas) cublasDestroy(s->cublas);
    if (s->cublaslt) cublasLtDestroy(s->cublaslt);
#if CDP_HAVE_CUDNN
    if (s->cudnn) cudnnDestroy(s->cudnn);
#endif
    if (s->workspace) cudaFree(s->workspace);
    if (s->host_result) cudaFreeHost(s->host_result);
    s->cublas = NULL;
    s->cublaslt = NULL;
#if CDP_HAVE_CUDNN
    s->cudnn = NULL;
#endif
    s->workspace = NULL;
    s->workspace_bytes = 0;
    s->host_result = NULL;
    memset(s->lt_algos, 0, sizeof s->lt_algos);
    s->lt_next = 0;
}

cdp_status cdp_cuda_set_precision(void *ks, enum cdp_precision p)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (p != CDP_PRECISION_FP32 && p != CDP_PRECISION_BF16)
        return CDP_CUDA_FAIL(CDP_ERR_INVALID, "unknown precision %d", (int)p);
    s->precision = p;
    return CDP_OK;
}
