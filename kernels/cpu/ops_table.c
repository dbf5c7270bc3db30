/* The CPU kernel table: kernels/cpu/ops.h behind the backend-neutral table of
 * kernels/ops.h. The state argument is unused; every op is synchronous. */
#include "kernels/ops.h"

#include <string.h>

#include "kernels/cpu/ops.h"

static cdp_status cpu_set_precision(void *ks, enum cdp_precision p)
{
    (void)ks;
    if (p != CDP_PRECISION_FP32)
        return cdp_fail(CDP_ERR_UNSUPPORTED, "the cpu kernels compute in fp32 only");
    return CDP_OK;
}

static cdp_status cpu_zero(void *ks, void *p, size_t bytes)
{
    (void)ks;
    if (bytes) memset(p, 0, bytes);
    return CDP_OK;
}

static cdp_status cpu_copy(void *ks, void *dst, const void *src, size_t bytes)
{
    (void)ks;
    if (bytes && dst != src) memmove(dst, src, bytes);
    return CDP_OK;
}

static cdp_status cpu_add(void *ks, float *dst, const float *src, size_t n)
{
    (void)ks;
    for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
    return CDP_OK;
}

static cdp_status cpu_sum_squares(void *ks, const float *x, size_t n, double *out)
{
    (void)ks;
    *out = cdp_cpu_sum_squares(x, n);
    return CDP_OK;
}

static cdp_status cpu_scale(void *ks, float *x, size_t n, float s)
{
    (void)ks;
    cdp_cpu_scale(x, n, s);
    return CDP_OK;
}

static cdp_status cpu_linear_fwd(void *ks, float *out, const float *in, const float *w, const float *b, int N,
                                 int IC, int OC)
{
    (void)ks;
    cdp_cpu_linear_fwd(out, in, w, b, N, IC, OC);
    return CDP_OK;
}

static cdp_status cpu_linear_bwd(void *ks, float *din, float *dw, float *db, const float *dout,
                                 const float *in, const float *w, int N, int IC, int OC)
{
    (void)ks;
    cdp_cpu_linear_bwd(din, dw, db, dout, in, w, N, IC, OC);
    return CDP_OK;
}

static cdp_status cpu_relu_fwd(void *ks, float *out, const float *in, size_t n)
{
    (void)ks;
    cdp_cpu_relu_fwd(out, in, n);
    return CDP_OK;
}

static cdp_status cpu_relu_bwd(void *ks, float *din, const float *dout, const float *in, size_t n)
{
    (void)ks;
    cdp_cpu_relu_bwd(din, dout, in, n);
    return CDP_OK;
}

static cdp_status cpu_gelu_fwd(void *ks, float *out, const float *in, size_t n)
{
    (void)ks;
    cdp_cpu_gelu_fwd(out, in, n);
    return CDP_OK;
}

static cdp_status cpu_silu_fwd(void *ks, float *out, const float *in, size_t n)
{
    (void)ks;
    cdp_cpu_silu_fwd(out, in, n);
    return CDP_OK;
}

static cdp_status cpu_silu_bwd(void *ks, float *din, const float *dout, const float *in, size_t n)
{
    (void)ks;
    cdp_cpu_silu_bwd(din, dout, in, n);
    return CDP_OK;
}

static cdp_status cpu_gelu_bwd(void *ks, float *din, const float *dout, const float *in, size_t n)
{
    (void)ks;
    cdp_cpu_gelu_bwd(din, dout, in, n);
    return CDP_OK;
}

static cdp_status cpu_layernorm_fwd(void *ks, float *out, float *mean, float *rstd, const float *in,
                                    const float *weight, const float *bias, int N, int C, float eps)
{
    (void)ks;
    cdp_cpu_layernorm_fwd(out, mean, rstd, in, weight, bias, N, C, eps);
    return CDP_OK;
}

static cdp_status cpu_layernorm_bwd(void *ks, float *din, float *dweight, float *dbias, const float *dout,
                                    const float *in, const float *weight, const float *mean,
                                    const float *rstd, int N, int C)
{
    (void)ks;
    cdp_cpu_layernorm_bwd(din, dweight, dbias, dout, in, weight, mean, rstd, N, C);
    return CDP_OK;
}

static cdp_status cpu_residual_fwd(void *ks, float *out, const float *a, const float *b, size_t n)
{
    (void)ks;
    cdp_cpu_residual_fwd(out, a, b, n);
    return CDP_OK;
}

static cdp_status cpu_residual_bwd(void *ks, float *da, float *db, const float *dout, size_t n)
{
    (void)ks;
    cdp_cpu_residual_bwd(da, db, dout, n);
    return CDP_OK;
}

static cdp_status cpu_embedding_fwd(void *ks, float *out, const int32_t *tokens, const float *wte,
                                    const float *wpe, int B, int T, int C)
{
    (void)ks;
    cdp_cpu_embedding_fwd(out, tokens, wte, wpe, B, T, C);
    return CDP_OK;
}

static cdp_status cpu_embedding_bwd(void *ks, float *dwte, float *dwpe, const float *dout,
                                    const int32_t *tokens, int B, int T, int C)
{
    (void)ks;
    cdp_cpu_embedding_bwd(dwte, dwpe, dout, tokens, B, T, C);
    return CDP_OK;
}

static cdp_status cpu_attention_fwd(void *ks, float *out, float *att, const float *qkv, int B, int T, int C,
                                    int NH, int causal)
{
    (void)ks;
    cdp_cpu_attention_fwd(out, att, qkv, B, T, C, NH, causal);
    return CDP_OK;
}

static cdp_status cpu_attention_bwd(void *ks, float *dqkv, const float *dout, const float *qkv,
                                    const float *att, float *scratch, int B, int T, int C, int NH, int causal)
{
    (void)ks;
    cdp_cpu_attention_bwd(dqkv, dout, qkv, att, scratch, B, T, C, NH, causal);
    return CDP_OK;
}

static cdp_status cpu_crossentropy_fwd(void *ks, float *losses, const float *logits, const int32_t *targets,
                                       int N, int V)
{
    (void)ks;
    cdp_cpu_crossentropy_fwd(losses, logits, targets, N, V);
    return CDP_OK;
}

static cdp_status cpu_crossentropy_bwd(void *ks, float *dlogits, const float *logits, const int32_t *targets,
                                       int N, int V, float scale)
{
    (void)ks;
    cdp_cpu_crossentropy_bwd(dlogits, logits, targets, N, V, scale);
    return CDP_OK;
}

static cdp_status cpu_embedding_vp_fwd(void *ks, float *out, const int32_t *tokens, const float *wte,
                                       const float *wpe, int B, int T, int C, int off, int rows)
{
    (void)ks;
    cdp_cpu_embedding_vp_fwd(out, tokens, wte, wpe, B, T, C, off, rows);
    return CDP_OK;
}

static cdp_status cpu_embedding_vp_bwd(void *ks, float *dwte, float *dwpe, const float *dout,
                                       const int32_t *tokens, int B, int T, int C, int off, int rows)
{
    (void)ks;
    cdp_cpu_embedding_vp_bwd(dwte, dwpe, dout, tokens, B, T, C, off, rows);
    return CDP_OK;
}

static cdp_status cpu_crossentropy_vp_stats(void *ks, float *stats, const float *logits, const int32_t *targets,
                                            int N, int V, int valid, int off, int k, int t)
{
    (void)ks;
    cdp_cpu_crossentropy_vp_stats(stats, logits, targets, N, V, valid, off, k, t);
    return CDP_OK;
}

static cdp_status cpu_crossentropy_vp_fwd(void *ks, float *losses, const float *stats, int N, int t)
{
    (void)ks;
    cdp_cpu_crossentropy_vp_fwd(losses, stats, N, t);
    return CDP_OK;
}

static cdp_status cpu_crossentropy_vp_bwd(void *ks, float *dlogits, const float *logits, const int32_t *targets,
                                          const float *stats, int N, int V, int valid, int off, int t, float scale)
{
    (void)ks;
    cdp_cpu_crossentropy_vp_bwd(dlogits, logits, targets, stats, N, V, valid, off, t, scale);
    return CDP_OK;
}

static cdp_status cpu_mse_fwd(void *ks, float *losses, const float *pred, const float *target, int N, int D)
{
    (void)ks;
    cdp_cpu_mse_fwd(losses, pred, target, N, D);
    return CDP_OK;
}

static cdp_status cpu_mse_bwd(void *ks, float *dpred, const float *pred, const float *target, int N, int D,
                              float scale)
{
    (void)ks;
    cdp_cpu_mse_bwd(dpred, pred, target, N, D, scale);
    return CDP_OK;
}

static cdp_status cpu_conv2d_fwd(void *ks, float *out, float *col, const float *in, const float *w,
                                 const float *b, int B, int IC, int H, int W, int OC, int K, int S, int P)
{
    (void)ks;
    cdp_cpu_conv2d_fwd(out, col, in, w, b, B, IC, H, W, OC, K, S, P);
    return CDP_OK;
}

static cdp_status cpu_conv2d_bwd(void *ks, float *din, float *dw, float *db, float *col, const float *dout,
                                 const float *in, const float *w, int B, int IC, int H, int W, int OC, int K,
                                 int S, int P)
{
    (void)ks;
    cdp_cpu_conv2d_bwd(din, dw, db, col, dout, in, w, B, IC, H, W, OC, K, S, P);
    return CDP_OK;
}

static cdp_status cpu_maxpool2d_fwd(void *ks, float *out, int32_t *argmax, const float *in, int B, int C,
                                    int H, int W, int K, int S)
{
    (void)ks;
    cdp_cpu_maxpool2d_fwd(out, argmax, in, B, C, H, W, K, S);
    return CDP_OK;
}

static cdp_status cpu_maxpool2d_bwd(void *ks, float *din, const float *dout, const int32_t *argmax, int B,
                                    int C, int OH, int OW)
{
    (void)ks;
    cdp_cpu_maxpool2d_bwd(din, dout, argmax, B, C, OH, OW);
    return CDP_OK;
}

static cdp_status cpu_adamw_step(void *ks, float *param, const float *grad, float *m, float *v, size_t n,
                                 float lr, float beta1, float beta2, float eps, float weight_decay, int t)
{
    (void)ks;
    cdp_cpu_adamw_step(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, t);
    return CDP_OK;
}

static cdp_status cpu_sgd_step(void *ks, float *param, const float *grad, float *velocity, size_t n, float lr,
                               float momentum, float weight_decay, int t)
{
    (void)ks;
    cdp_cpu_sgd_step(param, grad, velocity, n, lr, momentum, weight_decay, t);
    return CDP_OK;
}

static cdp_status cpu_rmsnorm_fwd(void *ks, float *out, float *rstd, const float *in, const float *weight, int N,
                                  int C, float eps)
{
    (void)ks;
    cdp_cpu_rmsnorm_fwd(out, rstd, in, weight, N, C, eps);
    return CDP_OK;
}

static cdp_status cpu_rmsnorm_bwd(void *ks, float *din, float *dweight, const float *dout, const float *in,
                                  const float *weight, const float *rstd, int N, int C)
{
    (void)ks;
    cdp_cpu_rmsnorm_bwd(din, dweight, dout, in, weight, rstd, N, C);
    return CDP_OK;
}

static cdp_status cpu_rope_fwd(void *ks, float *qkv, const float *q, const float *k, const float *v, int B, int T,
                               int NH, int NKV, int HD, int pos0, struct cdp_rope rope)
{
    (void)ks;
    cdp_cpu_rope_fwd(qkv, q, k, v, B, T, NH, NKV, HD, pos0, &rope);
    return CDP_OK;
}

static cdp_status cpu_rope_bwd(void *ks, float *dq, float *dk, float *dv, const float *dqkv, int B, int T, int NH,
                               int NKV, int HD, int pos0, struct cdp_rope rope)
{
    (void)ks;
    cdp_cpu_rope_bwd(dq, dk, dv, dqkv, B, T, NH, NKV, HD, pos0, &rope);
    return CDP_OK;
}

static cdp_status cpu_swiglu_fwd(void *ks, float *out, const float *gate, const float *up, size_t n)
{
    (void)ks;
    cdp_cpu_swiglu_fwd(out, gate, up, n);
    return CDP_OK;
}

static cdp_status cpu_swiglu_bwd(void *ks, float *dgate, float *dup, const float *dout, const float *gate,
                                 const float *up, size_t n)
{
    (void)ks;
    cdp_cpu_swiglu_bwd(dgate, dup, dout, gate, up, n);
    return CDP_OK;
}

const struct cdp_ops cdp_cpu_ops = {
    .abi = CDP_OPS_ABI,
    .name = "cpu",
#define CPU_ENTRY_(op) .op = cpu_##op,
    CDP_KERNEL_OPS(CPU_ENTRY_)
#undef CPU_ENTRY_
    /* the optional entries, each one said */
#define CPU_OPTIONAL_attention_state_floats NULL /* att holds B*NH*T*T probabilities */
#define CPU_OPTIONAL_linear_gelu_bwd NULL        /* linear_bwd then gelu_bwd */
#define CPU_OPTIONAL_silu_fwd cpu_silu_fwd
#define CPU_OPTIONAL_silu_bwd cpu_silu_bwd
#define CPU_OPTIONAL_embedding_vp_fwd cpu_embedding_vp_fwd
#define CPU_OPTIONAL_embedding_vp_bwd cpu_embedding_vp_bwd
#define CPU_OPTIONAL_crossentropy_vp_stats cpu_crossentropy_vp_stats
#define CPU_OPTIONAL_crossentropy_vp_fwd cpu_crossentropy_vp_fwd
#define CPU_OPTIONAL_crossentropy_vp_bwd cpu_crossentropy_vp_bwd
#define CPU_OPTIONAL_(op) .op = CPU_OPTIONAL_##op,
    CDP_KERNEL_OPS_OPTIONAL(CPU_OPTIONAL_)
#undef CPU_OPTIONAL_
};
