/* The kernel table: every op of the CPU reference (kernels/cpu/ops.h) for one
 * backend, so that the layers run unchanged on any device. Shared by the core
 * and the CUDA module: keep it valid C and CUDA C++.
 *
 * Every op takes the backend's per-device state first (cdp_device_kernel_state)
 * and device pointers of that device. Shapes, layouts, the overwrite/accumulate
 * conventions and the meaning of every argument are exactly those of the
 * matching cdp_cpu_* function in kernels/cpu/ops.h: the CPU table is the
 * reference and the GPU ops suite (tests/test_gpu_ops.c) compares every other
 * table with it. Mind the exceptions to "backward accumulates" there: the loss
 * backwards (crossentropy_bwd, mse_bwd) overwrite their gradient. Scratch
 * arguments (attention's T*T, conv's col) are sized for the CPU's serial
 * loops; a GPU table may ignore them and use its own workspace. Attention's
 * att is the state its forward leaves for its backward in the same table,
 * [B,NH,T,T] floats unless attention_state_floats says fewer: the CPU table,
 * and the CUDA table under fp32, keep the probabilities there; the CUDA
 * table's fused bf16 kernels keep row statistics and a copy of the output,
 * B*T*(NH + C) floats (kernels/cuda/flash_attention.h).
 *
 * Split backward (model/layers.h: B, the input gradient, then W, the
 * parameter gradients, later) runs on every table through the ops that
 * compute both: linear_bwd, layernorm_bwd and conv2d_bwd take NULL for any
 * of their outputs, so B calls them with the weight outputs NULL and W with
 * din NULL; embedding_bwd has only weight outputs (all W). Every table
 * computes each output the same way whichever others are asked for (its own
 * products and sums, on the same operands), so B's din and W's dweight and
 * dbias are the bits of one call asking for all three. linear_gelu_bwd's dw
 * and db are linear_bwd's (din NULL) on the same operands, bit for bit; B
 * calls it with both NULL.
 *
 * On a GPU an op is queued on the device's stream and returns at once; the
 * status reports a launch, cuBLAS or cuDNN error (with the library's error
 * string in cdp_last_error()). Only sum_squares waits for the stream (it
 * returns a host value); whoever reads device results back (cdp_buffer_read)
 * waits there.
 *
 * Precision: set_precision(CDP_PRECISION_BF16) makes the matrix-multiply ops
 * (linear, the two products inside attention, conv2d) round their operands to
 * bf16 and multiply with fp32 accumulation into fp32 results, as autocast does;
 * every other op, the parameters (master weights), gradients and optimizer state
 * stay fp32. The CPU table supports only CDP_PRECISION_FP32. */
#ifndef CDP_KERNELS_OPS_H
#define CDP_KERNELS_OPS_H

#include <stddef.h> /* offsetof */
#include <stdint.h>

#include "cdp/plan_types.h"
#include "cdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CDP_OPS_ABI 5

struct cdp_ops {
    int abi;
    const char *name; /* "cpu", "cuda" */
    cdp_status (*set_precision)(void *ks, enum cdp_precision p);

    /* memset(p, 0, bytes) and memmove(dst, src, bytes) within the device */
    cdp_status (*zero)(void *ks, void *p, size_t bytes);
    cdp_status (*copy)(void *ks, void *dst, const void *src, size_t bytes);
    /* dst[n] += src[n] (gradients that pass through: residual, flatten) */
    cdp_status (*add)(void *ks, float *dst, const float *src, size_t n);
    /* x[n] *= s */
    cdp_status (*scale)(void *ks, float *x, size_t n, float s);
    /* *out = sum of x[i]^2, accumulated in (at least) fp32 per block and double
     * overall; waits for the result. */
    cdp_status (*sum_squares)(void *ks, const float *x, size_t n, double *out);

    cdp_status (*linear_fwd)(void *ks, float *out, const float *in, const float *w, const float *b, int N,
                             int IC, int OC);
    cdp_status (*linear_bwd)(void *ks, float *din, float *dw, float *db, const float *dout, const float *in,
                             const float *w, int N, int IC, int OC);
    cdp_status (*relu_fwd)(void *ks, float *out, const float *in, size_t n);
    cdp_status (*relu_bwd)(void *ks, float *din, const float *dout, const float *in, size_t n);
    cdp_status (*gelu_fwd)(void *ks, float *out, const float *in, size_t n);
    cdp_status (*gelu_bwd)(void *ks, float *din, const float *dout, const float *in, size_t n);
    cdp_status (*layernorm_fwd)(void *ks, float *out, float *mean, float *rstd, const float *in,
                                const float *weight, const float *bias, int N, int C, float eps);
    cdp_status (*layernorm_bwd)(void *ks, float *din, float *dweight, float *dbias, const float *dout,
                                const float *in, const float *weight, const float *mean, const float *rstd,
                                int N, int C);
    cdp_status (*residual_fwd)(void *ks, float *out, const float *a, const float *b, size_t n);
    cdp_status (*residual_bwd)(void *ks, float *da, float *db, const float *dout, size_t n);
    cdp_status (*embedding_fwd)(void *ks, float *out, const int32_t *tokens, const float *wte, const float *wpe,
                                int B, int T, int C);
    cdp_status (*embedding_bwd)(void *ks, float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                                int B, int T, int C);
    cdp_status (*attention_fwd)(void *ks, float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                                int causal);
    cdp_status (*attention_bwd)(void *ks, float *dqkv, const float *dout, const float *qkv, const float *att,
                                float *scratch, int B, int T, int C, int NH, int causal);
    cdp_status (*crossentropy_fwd)(void *ks, float *losses, const float *logits, const int32_t *targets, int N,
                                   int V);
    cdp_status (*crossentropy_bwd)(void *ks, float *dlogits, const float *logits, const int32_t *targets, int N,
                                   int V, float scale);
    cdp_status (*mse_fwd)(void *ks, float *losses, const float *pred, const float *target, int N, int D);
    cdp_status (*mse_bwd)(void *ks, float *dpred, const float *pred, const float *target, int N, int D,
                          float scale);
    cdp_status (*conv2d_fwd)(void *ks, float *out, float *col, const float *in, const float *w, const float *b,
                             int B, int IC, int H, int W, int OC, int K, int S, int P);
    cdp_status (*conv2d_bwd)(void *ks, float *din, float *dw, float *db, float *col, const float *dout,
                             const float *in, const float *w, int B, int IC, int H, int W, int OC, int K, int S,
                             int P);
    cdp_status (*maxpool2d_fwd)(void *ks, float *out, int32_t *argmax, const float *in, int B, int C, int H,
                                int W, int K, int S);
    cdp_status (*maxpool2d_bwd)(void *ks, float *din, const float *dout, const int32_t *argmax, int B, int C,
                                int OH, int OW);
    cdp_status (*adamw_step)(void *ks, float *param, const float *grad, float *m, float *v, size_t n, float lr,
                             float beta1, float beta2, float eps, float weight_decay, int t);
    cdp_status (*sgd_step)(void *ks, float *param, const float *grad, float *velocity, size_t n, float lr,
                           float momentum, float weight_decay, int t);
    /* The Llama family's ops (docs/models.md): RMS norm, rotary embeddings
     * with grouped-query packing, the SwiGLU product. */
    cdp_status (*rmsnorm_fwd)(void *ks, float *out, float *rstd, const float *in, const float *weight, int N, int C,
                              float eps);
    cdp_status (*rmsnorm_bwd)(void *ks, float *din, float *dweight, const float *dout, const float *in,
                              const float *weight, const float *rstd, int N, int C);
    cdp_status (*rope_fwd)(void *ks, float *qkv, const float *q, const float *k, const float *v, int B, int T,
                           int NH, int NKV, int HD, int pos0, struct cdp_rope rope);
    cdp_status (*rope_bwd)(void *ks, float *dq, float *dk, float *dv, const float *dqkv, int B, int T, int NH,
                           int NKV, int HD, int pos0, struct cdp_rope rope);
    cdp_status (*swiglu_fwd)(void *ks, float *out, const float *gate, const float *up, size_t n);
    cdp_status (*swiglu_bwd)(void *ks, float *dgate, float *dup, const float *dout, const float *gate,
                             const float *up, size_t n);

    /* Optional entries: NULL in a table that has none (each table says, for
     * every one, what it has). */
    /* Floats of att that this table's attention_fwd and attention_bwd use for
     * these shapes under its current precision: at most B*NH*T*T, which is
     * also what a NULL entry means. A model sizes att with it when it is
     * created, so the precision must not change after that. (A plain query:
     * no status.) */
    size_t (*attention_state_floats)(void *ks, int B, int T, int C, int NH);
    /* A fused op; where it is NULL the layers call linear_bwd then gelu_bwd,
     * the composition the GPU ops suite compares it with. The backward of a
     * linear layer whose input is act = gelu(pre), through
     * that GELU: dpre = (dout . w) * gelu'(pre), OVERWRITTEN (not
     * accumulated); dw += dout^T . act and db += the column sums of dout as
     * linear_bwd (either may be NULL). dout[N,OC], act/pre/dpre[N,IC], w[OC,IC]. */
    cdp_status (*linear_gelu_bwd)(void *ks, float *dpre, float *dw, float *db, const float *dout, const float *act,
                                  const float *pre, const float *w, int N, int IC, int OC);
    /* SiLU (x * sigmoid(x)) and its backward, as relu_fwd and relu_bwd;
     * the CPU table has them, the CUDA table not yet. */
    cdp_status (*silu_fwd)(void *ks, float *out, const float *in, size_t n);
    cdp_status (*silu_bwd)(void *ks, float *din, const float *dout, const float *in, size_t n);
    /* Vocab-parallel embedding and loss (docs/parallelism.md): a rank of a
     * tensor group holds rows [off, off + rows) of the whole token table
     * (its slice wte[rows, C]; the slice may hold padding rows past rows,
     * never read). embedding_vp_fwd is embedding_fwd with the rows of tokens
     * outside the slice 0 (plus wpe[t] where wpe is given: one rank of the
     * group adds it, the group's sum holds it once); embedding_vp_bwd is
     * embedding_bwd with only the tokens inside the slice scattered into
     * dwte (dwpe, where given, from every row). */
    cdp_status (*embedding_vp_fwd)(void *ks, float *out, const int32_t *tokens, const float *wte, const float *wpe,
                                   int B, int T, int C, int off, int rows);
    cdp_status (*embedding_vp_bwd)(void *ks, float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                                   int B, int T, int C, int off, int rows);
    /* The cross-entropy over logits split by vocabulary: rank k of t holds
     * logits[N, V] of which columns [0, valid) are the whole vocabulary's
     * [off, off + valid) (the rest padding, left out). stats is [N, 2t + 1]
     * per row: m_0 .. m_{t-1}, s_0 .. s_{t-1}, the target's logit.
     * crossentropy_vp_stats OVERWRITES stats with this rank's part and zeros
     * elsewhere: m_k the maximum of the row's valid logits (-inf when none),
     * s_k the sum of exp(x - m_k) over them, the target's logit where the
     * target is in the slice; summed over the group, stats holds every
     * rank's part. Then crossentropy_vp_fwd: losses[N] = log S + (M - x_t)
     * with M = max m_j and S = sum s_j exp(m_j - M) (as crossentropy_fwd);
     * crossentropy_vp_bwd OVERWRITES dlogits[N, V] with scale (exp(x - M) /
     * S - 1 at the target) in the valid columns and 0 in the padding. */
    cdp_status (*crossentropy_vp_stats)(void *ks, float *stats, const float *logits, const int32_t *targets, int N,
                                        int V, int valid, int off, int k, int t);
    cdp_status (*crossentropy_vp_fwd)(void *ks, float *losses, const float *stats, int N, int t);
    cdp_status (*crossentropy_vp_bwd)(void *ks, float *dlogits, const float *logits, const int32_t *targets,
                                      const float *stats, int N, int V, int valid, int off, int t, float scale);
};

/* The table's entries in the order of struct cdp_ops, every backend's table
 * is made from these lists (kernels/cpu/ops_table.c, kernels/cuda/ops_table.cu),
 * so a table cannot miss an entry or hold one out of place; the checks below
 * keep the lists and the struct in step. Required entries: every table has
 * them. Optional ones: NULL where a table has none. */
#define CDP_KERNEL_OPS(X)                                                                                   \
    X(set_precision) X(zero) X(copy) X(add) X(scale) X(sum_squares) X(linear_fwd) X(linear_bwd) X(relu_fwd)  \
    X(relu_bwd) X(gelu_fwd) X(gelu_bwd) X(layernorm_fwd) X(layernorm_bwd) X(residual_fwd) X(residual_bwd)   \
    X(embedding_fwd) X(embedding_bwd) X(attention_fwd) X(attention_bwd) X(crossentropy_fwd)                 \
    X(crossentropy_bwd) X(mse_fwd) X(mse_bwd) X(conv2d_fwd) X(conv2d_bwd) X(maxpool2d_fwd) X(maxpool2d_bwd) \
    X(adamw_step) X(sgd_step) X(rmsnorm_fwd) X(rmsnorm_bwd) X(rope_fwd) X(rope_bwd) X(swiglu_fwd)           \
    X(swiglu_bwd)
#define CDP_KERNEL_OPS_OPTIONAL(X)                                                                          \
    X(attention_state_floats) X(linear_gelu_bwd) X(silu_fwd) X(silu_bwd) X(embedding_vp_fwd) X(embedding_vp_bwd) \
    X(crossentropy_vp_stats) X(crossentropy_vp_fwd) X(crossentropy_vp_bwd)

enum cdp_kernel_op {
#define CDP_KERNEL_OP_ENUM_(op) CDP_KERNEL_OP_##op,
    CDP_KERNEL_OPS(CDP_KERNEL_OP_ENUM_) CDP_KERNEL_OPS_OPTIONAL(CDP_KERNEL_OP_ENUM_)
#undef CDP_KERNEL_OP_ENUM_
    CDP_KERNEL_OP_COUNT
};

/* Every entry is a function pointer, in list order after abi and name. */
#define CDP_KERNEL_OP_AT_(op)                                                                                \
    CDP_OPS_ASSERT(offsetof(struct cdp_ops, op) ==                                                           \
                       offsetof(struct cdp_ops, set_precision) + CDP_KERNEL_OP_##op * sizeof(void (*)(void)), \
                   #op " is where the lists say");
#ifdef __cplusplus
#define CDP_OPS_ASSERT(c, m) static_assert(c, m)
#else
#define CDP_OPS_ASSERT(c, m) _Static_assert(c, m)
#endif
CDP_KERNEL_OPS(CDP_KERNEL_OP_AT_)
CDP_KERNEL_OPS_OPTIONAL(CDP_KERNEL_OP_AT_)
CDP_OPS_ASSERT(sizeof(struct cdp_ops) ==
                   offsetof(struct cdp_ops, set_precision) + CDP_KERNEL_OP_COUNT * sizeof(void (*)(void)),
               "struct cdp_ops has exactly the entries of the lists");
#undef CDP_KERNEL_OP_AT_

/* The CPU reference table (kernels/cpu/ops_table.c); its state argument is unused. */
extern const struct cdp_ops cdp_cpu_ops;

#ifdef __cplusplus
}
#endif

#endif
