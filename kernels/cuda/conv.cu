/* 2-D convolution on the GPU through cuDNN (NCHW, square kernel K, stride S,
 * zero padding P, cross-correlation as PyTorch), the semantics of
 * cdp_cpu_conv2d_fwd/bwd. `col` (the CPU's im2col scratch) is unused here.
 * Shapes: in[B,IC,H,W], w[OC,IC,K,K], b[OC], out[B,OC,OH,OW] with
 * OH = (H + 2P - K) / S + 1, likewise OW.
 *
 * Precision. FP32: the descriptor asks for CUDNN_FMA_MATH, so no TF32 (the CPU
 * reference is plain fp32). BF16: the operands (x and w; dy and w; x and dy)
 * are rounded to bf16 into float copies in the workspace and the convolution
 * runs on float data with CUDNN_DEFAULT_MATH, which lets cuDNN use TF32 tensor
 * cores: a bf16 value is exact in TF32 (7 of its 10 mantissa bits), so this is
 * bf16 x bf16 products accumulated in fp32 into fp32 results, as the kernel
 * table promises, with no bf16 rounding of the output. Algorithms that ask for
 * CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION (which may down-convert float data to
 * fp16) are never taken. Bias gradients and the bias add stay fp32. */
#include "kernels/cuda/cuda_state.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/ops_cuda.h"

#if CDP_HAVE_CUDNN

/* The descriptors of one call, destroyed when it returns, on every path.
 * Created per call for simplicity; caching them per shape is a later
 * optimisation (they are host-side and cheap next to the convolution). */
struct conv_descs {
    cudnnTensorDescriptor_t x = NULL, y = NULL, bias = NULL;
    cudnnFilterDescriptor_t w = NULL;
    cudnnConvolutionDescriptor_t conv = NULL;
    cudnnMathType_t math = CUDNN_FMA_MATH;
    conv_descs() = default;
    conv_descs(const conv_descs &) = delete;
    conv_descs &operator=(const conv_descs &) = delete;
    ~conv_descs()
    {
        if (x) cudnnDestroyTensorDescriptor(x);
        if (y) cudnnDestroyTensorDescriptor(y);
        if (bias) cudnnDestroyTensorDescriptor(bias);
        if (w) cudnnDestroyFilterDescriptor(w);
        if (conv) cudnnDestroyConvolutionDescriptor(conv);
    }
};

static cdp_status check_dims(const char *what, int B, int IC, int H, int W, int OC, int K, int S, int P, int *OH,
                             int *OW)
{
    if (B < 0 || IC < 0 || H < 0 || W < 0 || OC < 0 || K <= 0 || S <= 0 || P < 0)
        return CDP_CUDA_FAIL(CDP_ERR_INVALID, "%s: bad sizes (B %d, IC %d, H %d, W %d, OC %d, K %d, S %d, P %d)",
                             what, B, IC, H, W, OC, K, S, P);
    int oh = (H + 2 * P - K) / S + 1, ow = (W + 2 * P - K) / S + 1;
    if (H + 2 * P < K || W + 2 * P < K || oh <= 0 || ow <= 0)
        return CDP_CUDA_FAIL(CDP_ERR_INVALID, "%s: a %dx%d kernel does not fit a %dx%d image padded by %d", what, K,
                             K, H, W, P);
    *OH = oh;
    *OW = ow;
    return CDP_OK;
}

/* Descriptors for x[B,IC,H,W] (when IC > 0), y[B,OC,OH,OW], b[1,OC,1,1] and,
 * when IC > 0, w[OC,IC,K,K] and the convolution in the precision's math. */
static cdp_status make_descs(struct cdp_cuda_state *s, conv_descs &d, int B, int IC, int H, int W, int OC, int K,
                             int S, int P, int OH, int OW)
{
    CDP_CUDNN_TRY(cudnnCreateTensorDescriptor(&d.y));
    CDP_CUDNN_TRY(cudnnSetTensor4dDescriptor(d.y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, B, OC, OH, OW));
    CDP_CUDNN_TRY(cudnnCreateTensorDescriptor(&d.bias));
    CDP_CUDNN_TRY(cudnnSetTensor4dDescriptor(d.bias, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, OC, 1, 1));
    if (IC == 0) return CDP_OK;
    CDP_CUDNN_TRY(cudnnCreateTensorDescriptor(&d.x));
    CDP_CUDNN_TRY(cudnnSetTensor4dDescriptor(d.x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, B, IC, H, W));
    CDP_CUDNN_TRY(cudnnCreateFilterDescriptor(&d.w));
    CDP_CUDNN_TRY(cudnnSetFilter4dDescriptor(d.w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, OC, IC, K, K));
    CDP_CUDNN_TRY(cudnnCreateConvolutionDescriptor(&d.conv));
    CDP_CUDNN_TRY(cudnnSetConvolution2dDescriptor(d.conv, P, P, S, S, 1, 1, CUDNN_CROSS_CORRELATION,
                                                  CUDNN_DATA_FLOAT));
    d.math = s->precision == CDP_PRECISION_BF16 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
    CDP_CUDNN_TRY(cudnnSetConvolutionMathType(d.conv, d.math));
    int n, c, h, w;
    CDP_CUDNN_TRY(cudnnGetConvolution2dForwardOutputDim(d.conv, d.x, d.w, &n, &c, &h, &w));
    if (n != B || c != OC || h != OH || w != OW)
        return CDP_CUDA_FAIL(CDP_ERR_INTERNAL, "conv2d: cuDNN makes the output [%d,%d,%d,%d], expected [%d,%d,%d,%d]",
                             n, c, h, w, B, OC, OH, OW);
    return CDP_OK;
}

/* The order in which to try the heuristics' candidates: those that succeeded,
 * deterministic first (runs reproduce), then those whose math type is the
 * descriptor's, then the heuristics' own order. Math types that the
 * precision rules out are dropped: ALLOW_CONVERSION always, tensor-op math
 * in FP32. Returns how many candidates remain in order[]. */
template <typename Perf>
static int rank_algos(const Perf *perf, int n, cudnnMathType_t math, int *order)
{
    int m = 0;
    for (int want = 3; want >= 0; want--)
        for (int i = 0; i < n; i++) {
            if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
            if (perf[i].mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) continue;
            if (math == CUDNN_FMA_MATH && perf[i].mathType == CUDNN_TENSOR_OP_MATH) continue;
            int score = (perf[i].determinism == CUDNN_DETERMINISTIC ? 2 : 0) + (perf[i].mathType == math ? 1 : 0);
            if (score == want) order[m++] = i;
        }
    return m;
}

/* The first ranked forward algorithm whose workspace size cuDNN can give. */
static cdp_status pick_fwd(cudnnHandle_t h, const conv_descs &d, cudnnConvolutionFwdAlgo_t *algo, size_t *bytes)
{
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int n = 0, order[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    CDP_CUDNN_TRY(cudnnGetConvolutionForwardAlgorithm_v7(h, d.x, d.w, d.conv, d.y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                         &n, perf));
    int m = rank_algos(perf, n, d.math, order);
    for (int i = 0; i < m; i++) {
        cudnnConvolutionFwdAlgo_t a = perf[order[i]].algo;
        if (cudnnGetConvolutionForwardWorkspaceSize(h, d.x, d.w, d.conv, d.y, a, bytes) == CUDNN_STATUS_SUCCESS) {
            *algo = a;
            return CDP_OK;
        }
    }
    return CDP_CUDA_FAIL(CDP_ERR_UNSUPPORTED, "conv2d forward: cuDNN offers no usable algorithm (%d candidates)", n);
}

static cdp_status pick_bwd_data(cudnnHandle_t h, const conv_descs &d, cudnnConvolutionBwdDataAlgo_t *algo,
                                size_t *bytes)
{
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int n = 0, order[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    CDP_CUDNN_TRY(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w, d.y, d.conv, d.x,
                                                              CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, perf));
    int m = rank_algos(perf, n, d.math, order);
    for (int i = 0; i < m; i++) {
        cudnnConvolutionBwdDataAlgo_t a = perf[order[i]].algo;
        if (cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w, d.y, d.conv, d.x, a, bytes) ==
            CUDNN_STATUS_SUCCESS) {
            *algo = a;
            return CDP_OK;
        }
    }
    return CDP_CUDA_FAIL(CDP_ERR_UNSUPPORTED, "conv2d backward data: cuDNN offers no usable algorithm (%d candidates)",
                         n);
}

static cdp_status pick_bwd_filter(cudnnHandle_t h, const conv_descs &d, cudnnConvolutionBwdFilterAlgo_t *algo,
                                  size_t *bytes)
{
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int n = 0, order[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    CDP_CUDNN_TRY(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x, d.y, d.conv, d.w,
                                                                CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, perf));
    int m = rank_algos(perf, n, d.math, order);
    for (int i = 0; i < m; i++) {
        cudnnConvolutionBwdFilterAlgo_t a = perf[order[i]].algo;
        if (cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x, d.y, d.conv, d.w, a, bytes) ==
            CUDNN_STATUS_SUCCESS) {
            *algo = a;
            return CDP_OK;
        }
    }
    return CDP_CUDA_FAIL(CDP_ERR_UNSUPPORTED,
                         "conv2d backward filter: cuDNN offers no usable algorithm (%d candidates)", n);
}

cdp_status cdp_cuda_conv2d_fwd(void *ks, float *out, float *col, const float *in, const float *w, const float *b,
                               int B, int IC, int H, int W, int OC, int K, int S, int P)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    (void)col;
    int OH = 0, OW = 0;
    cdp_status rc = check_dims("conv2d_fwd", B, IC, H, W, OC, K, S, P, &OH, &OW);
    if (rc) return rc;
    if (B == 0 || OC == 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    cudnnHandle_t h;
    if ((rc = cdp_cuda_cudnn(s, &h))) return rc;
    conv_descs d;
    if ((rc = make_descs(s, d, B, IC, H, W, OC, K, S, P, OH, OW))) return rc;
    const float one = 1.0f, zero = 0.0f;

    if (IC == 0) { /* an empty sum: the output is the bias alone */
        CDP_CUDA_TRY(cudaMemsetAsync(out, 0, (size_t)B * OC * OH * OW * sizeof(float), s->stream));
    } else {
        cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
        size_t algo_bytes = 0;
        if ((rc = pick_fwd(h, d, &algo, &algo_bytes))) return rc;
        bool bf16 = s->precision == CDP_PRECISION_BF16;
        size_t nx = (size_t)B * IC * H * W, nw = (size_t)OC * IC * K * K;
        size_t off_x = cdp_cuda_align(algo_bytes);
        size_t off_w = off_x + (bf16 ? cdp_cuda_align(nx * sizeof(float)) : 0);
        size_t total = off_w + (bf16 ? cdp_cuda_align(nw * sizeof(float)) : 0);
        void *ws = NULL;
        if (total > 0 && (rc = cdp_cuda_workspace(s, total, &ws))) return rc;
        const float *x = in, *wt = w;
        if (bf16) {
            float *x16 = (float *)((char *)ws + off_x), *w16 = (float *)((char *)ws + off_w);
            if ((rc = cdp_cuda_round_bf16(s, x16, in, nx))) return rc;
            if ((rc = cdp_cuda_round_bf16(s, w16, w, nw))) return rc;
            x = x16;
            wt = w16;
        }
        CDP_CUDNN_TRY(cudnnConvolutionForward(h, &one, d.x, x, d.w, wt, d.conv, algo, algo_bytes ? ws : NULL,
                                              algo_bytes, &zero, d.y, out));
    }
    if (b) CDP_CUDNN_TRY(cudnnAddTensor(h, &one, d.bias, b, &one, d.y, out));
    return CDP_OK;
}

cdp_status cdp_cuda_conv2d_bwd(void *ks, float *din, float *dw, float *db, float *col, const float *dout,
                               const float *in, const float *w, int B, int IC, int H, int W, int OC, int K, int S,
                               int P)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    (void)col;
    int OH = 0, OW = 0;
    cdp_status rc = check_dims("conv2d_bwd", B, IC, H, W, OC, K, S, P, &OH, &OW);
    if (rc) return rc;
    if (B == 0 || OC == 0) return CDP_OK; /* dout is empty: nothing to add */
    if (IC == 0) din = dw = NULL;         /* empty tensors */
    if (!din && !dw && !db) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    cudnnHandle_t h;
    if ((rc = cdp_cuda_cudnn(s, &h))) return rc;
    conv_descs d;
    if ((rc = make_descs(s, d, B, IC, H, W, OC, K, S, P, OH, OW))) return rc;
    const float one = 1.0f;

    /* db[OC] += sums of dout over batch and positions, in fp32 */
    if (db) CDP_CUDNN_TRY(cudnnConvolutionBackwardBias(h, &one, d.y, dout, &one, d.bias, db));
    if (!din && !dw) return CDP_OK;

    cudnnConvolutionBwdDataAlgo_t data_algo = CUDNN_CONVOLUTION_BWD_DATA_ALGO_0;
    cudnnConvolutionBwdFilterAlgo_t filter_algo = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0;
    size_t data_bytes = 0, filter_bytes = 0;
    if (din && (rc = pick_bwd_data(h, d, &data_algo, &data_bytes))) return rc;
    if (dw && (rc = pick_bwd_filter(h, d, &filter_algo, &filter_bytes))) return rc;
    size_t algo_bytes = data_bytes > filter_bytes ? data_bytes : filter_bytes;

    /* bf16 operand copies: dout always, w for din, in for dw */
    bool bf16 = s->precision == CDP_PRECISION_BF16;
    size_t ndy = (size_t)B * OC * OH * OW, nw = din ? (size_t)OC * IC * K * K : 0,
           nx = dw ? (size_t)B * IC * H * W : 0;
    size_t off_dy = cdp_cuda_align(algo_bytes);
    size_t off_w = off_dy + (bf16 ? cdp_cuda_align(ndy * sizeof(float)) : 0);
    size_t off_x = off_w + (bf16 ? cdp_cuda_align(nw * sizeof(float)) : 0);
    size_t total = off_x + (bf16 ? cdp_cuda_align(nx * sizeof(float)) : 0);
    void *ws = NULL;
    if (total > 0 && (rc = cdp_cuda_workspace(s, total, &ws))) return rc;
    const float *dy = dout, *wt = w, *x = in;
    if (bf16) {
        float *dy16 = (float *)((char *)ws + off_dy), *w16 = (float *)((char *)ws + off_w);
        float *x16 = (float *)((char *)ws + off_x);
        if ((rc = cdp_cuda_round_bf16(s, dy16, dout, ndy))) return rc;
        if ((rc = cdp_cuda_round_bf16(s, w16, w, nw))) return rc;
        if ((rc = cdp_cuda_round_bf16(s, x16, in, nx))) return rc;
        dy = dy16;
        wt = w16;
        x = x16;
    }
    /* din += conv^T(dout, w); dw += corr(in, dout): beta = 1 accumulates */
    if (din)
        CDP_CUDNN_TRY(cudnnConvolutionBackwardData(h, &one, d.w, wt, d.y, dy, d.conv, data_algo,
                                                   data_bytes ? ws : NULL, data_bytes, &one, d.x, din));
    if (dw)
        CDP_CUDNN_TRY(cudnnConvolutionBackwardFilter(h, &one, d.x, x, d.y, dy, d.conv, filter_algo,
                                                     filter_bytes ? ws : NULL, filter_bytes, &one, d.w, dw));
    return CDP_OK;
}

#else /* !CDP_HAVE_CUDNN */

cdp_status cdp_cuda_conv2d_fwd(void *ks, float *out, float *col, const float *in, const float *w, const float *b,
                               int B, int IC, int H, int W, int OC, int K, int S, int P)
{
    (void)ks, (void)out, (void)col, (void)in, (void)w, (void)b, (void)B, (void)IC, (void)H, (void)W, (void)OC,
        (void)K, (void)S, (void)P;
    return CDP_CUDA_FAIL(CDP_ERR_UNSUPPORTED, "conv2d on CUDA: this build of the CUDA module is built without cuDNN");
}

cdp_status cdp_cuda_conv2d_bwd(void *ks, float *din, float *dw, float *db, float *col, const float *dout,
                               const float *in, const float *w, int B, int IC, int H, int W, int OC, int K, int S,
                               int P)
{
    (void)ks, (void)din, (void)dw, (void)db, (void)col, (void)dout, (void)in, (void)w, (void)B, (void)IC, (void)H,
        (void)W, (void)OC, (void)K, (void)S, (void)P;
    return CDP_CUDA_FAIL(CDP_ERR_UNSUPPORTED, "conv2d on CUDA: this build of the CUDA module is built without cuDNN");
}

#endif
