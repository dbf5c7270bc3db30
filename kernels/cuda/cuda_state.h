/* What every CUDA kernel file shares: the per-device state of the CUDA backend
 * (the `void *ks` every op of kernels/ops.h receives), its lazily created
 * library handles and workspace, and the macros that turn CUDA, cuBLAS and
 * cuDNN failures into statuses. CUDA C++ only (included by .cu files). */
#ifndef CDP_KERNELS_CUDA_STATE_H
#define CDP_KERNELS_CUDA_STATE_H

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <stddef.h>
#include <stdint.h>

#include "cdp/plan_types.h"
#include "cdp/status.h"
#include "cdp/log.h"
#include "cdp_config.h"
#include "kernels/ops.h"

#if CDP_HAVE_CUDNN
#include <cudnn.h>
#endif

/* A cuBLASLt algorithm chosen for one problem of the linear layer
 * (linear.cu): the heuristic query costs more host time than the launch, and
 * its answer depends only on the key (sizes, types, epilogue, the pointers'
 * alignments). The key is compared bytewise: all of it is plain ints. */
struct cdp_cuda_lt_key {
    int m, n, k;       /* as cuBLAS sees the product (bf16 operands, fp32 D) */
    int opA;           /* cublasOperation_t of A */
    int epi;           /* cublasLtEpilogue_t */
    unsigned align[4]; /* bytes (at most 256) of A, B, D and the bias (0: none) */
};
struct cdp_cuda_lt_algo {
    struct cdp_cuda_lt_key key;
    int state; /* 0: empty slot; 1: `algo` below; -1: cuBLASLt has none (use cublasGemmEx) */
    cublasLtMatmulAlgo_t algo;
};
#define CDP_CUDA_LT_ALGOS 16

struct cdp_cuda_state {
    int index;
    cudaStream_t stream;
    enum cdp_precision precision;
    /* created on first use, destroyed with the device */
    cublasHandle_t cublas;
    cublasLtHandle_t cublaslt;
#if CDP_HAVE_CUDNN
    cudnnHandle_t cudnn;
#endif
    /* one scratch area for the ops' own temporaries (bf16 operand copies,
     * cuDNN and cuBLASLt workspaces, reduction partials); grows on demand and
     * is only valid until the next op, as every op runs on the one stream. It
     * is not counted against the device's memory cap. */
    void *workspace;
    size_t workspace_bytes;
    /* pinned host memory for small results read back (sum_squares) */
    double *host_result;
    /* the linear layer's cuBLASLt algorithms, replaced round-robin */
    struct cdp_cuda_lt_algo lt_algos[CDP_CUDA_LT_ALGOS];
    unsigned lt_next;
};

/* The core's error and logging functions, set when the module is initialised. */
extern const struct cdp_module_host *cdp_cuda_host;

/* s->workspace with at least `bytes`; waits for the stream before growing. */
cdp_status cdp_cuda_workspace(struct cdp_cuda_state *s, size_t bytes, void **out);
/* The cuBLAS handle bound to the device's stream (created on first use). */
cdp_status cdp_cuda_cublas(struct cdp_cuda_state *s, cublasHandle_t *out);
cdp_status cdp_cuda_cublaslt(struct cdp_cuda_state *s, cublasLtHandle_t *out);
#if CDP_HAVE_CUDNN
cdp_status cdp_cuda_cudnn(struct cdp_cuda_state *s, cudnnHandle_t *out);
#endif
/* Frees the handles, workspace and pinned memory (the device is closing). */
void cdp_cuda_state_release(struct cdp_cuda_state *s);

/* Threads per block and the number of blocks for n elements (grid-stride loops
 * are used where n may exceed the grid limit). */
#define CDP_CUDA_THREADS 256
static inline unsigned cdp_cuda_blocks(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    return b > 65535u * 16u ? 65535u * 16u : (unsigned)b;
}

#define CDP_CUDA_FAIL(st, ...) cdp_cuda_host->fail((st), __VA_ARGS__)

/* A CUDA runtime call whose failure returns a status naming the call. */
#define CDP_CUDA_TRY(call)                                                                              \
    do {                                                                                                \
        cudaError_t e_ = (call);                                                                        \
        if (e_ != cudaSuccess)                                                                          \
            return CDP_CUDA_FAIL(CDP_ERR_DEVICE, "%s: %s (%s)", #call, cudaGetErrorString(e_),          \
                                 cudaGetErrorName(e_));                                                 \
    } while (0)

/* After every kernel launch: a bad configuration fails here, at the launch. */
#define CDP_CUDA_LAUNCHED(what)                                                                         \
    do {                                                                                                \
        cudaError_t e_ = cudaGetLastError();                                                            \
        if (e_ != cudaSuccess)                                                                          \
            return CDP_CUDA_FAIL(CDP_ERR_DEVICE, "launching %s: %s (%s)", (what), cudaGetErrorString(e_), \
                                 cudaGetErrorName(e_));                                                 \
    } while (0)

#define CDP_CUBLAS_TRY(call)                                                                            \
    do {                                                                                                \
        cublasStatus_t e_ = (call);                                                                     \
        if (e_ != CUBLAS_STATUS_SUCCESS)                                                                \
            return CDP_CUDA_FAIL(CDP_ERR_DEVICE, "%s: %s (%s)", #call, cublasGetStatusString(e_),       \
                                 cublasGetStatusName(e_));                                              \
    } while (0)

#if CDP_HAVE_CUDNN
#define CDP_CUDNN_TRY(call)                                                                             \
    do {                                                                                                \
        cudnnStatus_t e_ = (call);                                                                      \
        if (e_ != CUDNN_STATUS_SUCCESS)                                                                 \
            return CDP_CUDA_FAIL(CDP_ERR_DEVICE, "%s: %s", #call, cudnnGetErrorString(e_));             \
    } while (0)
#endif

#endif
