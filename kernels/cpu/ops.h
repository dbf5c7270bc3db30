/* CPU kernels: the reference implementation of every op, and the oracle the
 * CUDA kernels are tested against. GEMMs go through OpenBLAS (cblas_sgemm).
 *
 * Shapes: B batch, T tokens, C channels, V vocabulary, NH heads, HS = C / NH,
 * N rows (B*T for token models, B for others), IC/OC input/output features,
 * H/W image height/width. All tensors are row-major, float32, contiguous.
 *
 * Conventions:
 * - Forward kernels overwrite their outputs.
 * - Backward kernels ACCUMULATE (+=) into every gradient they produce, input
 *   gradients and parameter gradients alike; the caller zeroes gradients when a
 *   step starts. This makes gradient accumulation over micro-batches and the
 *   residual stream free.
 * - Weights follow PyTorch's layouts (Linear: [OC, IC]; Conv2d: [OC, IC, K, K]),
 *   so checkpoints compare directly with PyTorch.
 * - Kernels never allocate except where noted (scratch is passed in). */
#ifndef CDP_KERNELS_CPU_OPS_H
#define CDP_KERNELS_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "cdp/plan_types.h" /* struct cdp_rope */

#ifdef __cplusplus
extern "C" {
#endif

/* out[N,OC] = in[N,IC] . w[OC,IC]^T + b[OC] (b may be NULL). */
void cdp_cpu_linear_fwd(float *out, const float *in, const float *w, const float *b,
                        int N, int IC, int OC);
/* din[N,IC] += dout . w; dw[OC,IC] += dout^T . in; db[OC] += sum_rows dout.
 * din, dw, db may each be NULL (not wanted). */
void cdp_cpu_linear_bwd(float *din, float *dw, float *db, const float *dout, const float *in,
                        const float *w, int N, int IC, int OC);

/* Elementwise forwards (relu, gelu, residual) may run in place (out == in). */
void cdp_cpu_relu_fwd(float *out, const float *in, size_t n);
/* din += dout * (in > 0) */
void cdp_cpu_relu_bwd(float *din, const float *dout, const float *in, size_t n);

/* GELU, tanh approximation (as GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
void cdp_cpu_gelu_fwd(float *out, const float *in, size_t n);
void cdp_cpu_gelu_bwd(float *din, const float *dout, const float *in, size_t n);
/* SiLU: out = x * sigmoid(x); din += dout * s * (1 + x (1 - s)), s = sigmoid(x). */
void cdp_cpu_silu_fwd(float *out, const float *in, size_t n);
void cdp_cpu_silu_bwd(float *din, const float *dout, const float *in, size_t n);

/* Layer normalisation over the last dimension C of in[N,C]; saves mean[N] and
 * rstd[N] (1 / sqrt(biased variance + eps)) for backward. In backward, din,
 * dweight and dbias may each be NULL (not wanted). */
void cdp_cpu_layernorm_fwd(float *out, float *mean, float *rstd, const float *in,
                           const float *weight, const float *bias, int N, int C, float eps);
void cdp_cpu_layernorm_bwd(float *din, float *dweight, float *dbias, const float *dout,
                           const float *in, const float *weight, const float *mean,
                           const float *rstd, int N, int C);

/* SwiGLU's product: out = silu(gate) * up over n elements. Backward:
 * dgate += dout * up * silu'(gate), dup += dout * silu(gate); either may be NULL. */
void cdp_cpu_swiglu_fwd(float *out, const float *gate, const float *up, size_t n);
void cdp_cpu_swiglu_bwd(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n);

/* RMS normalisation over the last dimension C of in[N,C] (Llama's RMSNorm):
 * out = weight * (x * rstd), rstd[N] = 1 / sqrt(mean(x^2) + eps), saved for
 * backward. In backward, din and dweight may each be NULL (not wanted). */
void cdp_cpu_rmsnorm_fwd(float *out, float *rstd, const float *in, const float *weight, int N, int C, float eps);
void cdp_cpu_rmsnorm_bwd(float *din, float *dweight, const float *dout, const float *in, const float *weight,
                         const float *rstd, int N, int C);

/* Rotary position embeddings with grouped-query packing: q[B,T,NH*HD],
 * k and v [B,T,NKV*HD] (NKV dividing NH) -> qkv[B,T,3C], C = NH*HD, as
 * attention_fwd takes it: q and k rotated (rotate_half convention: dimension
 * i pairs with i + HD/2, angle (t + pos0) * freq i of kernels/rope.h), and k
 * and v's head j repeated for the NH/NKV query heads j*NH/NKV ... that share
 * it (Hugging Face's repeat_kv). Backward: dq, dk, dv += the transpose (the
 * repeated heads' gradients summed); dqkv as attention_bwd leaves it. */
void cdp_cpu_rope_fwd(float *qkv, const float *q, const float *k, const float *v, int B, int T, int NH, int NKV,
                      int HD, int pos0, const struct cdp_rope *rope);
void cdp_cpu_rope_bwd(float *dq, float *dk, float *dv, const float *dqkv, int B, int T, int NH, int NKV, int HD,
                      int pos0, const struct cdp_rope *rope);

/* out = a + b over n elements. Backward: da += dout, db += dout. */
void cdp_cpu_residual_fwd(float *out, const float *a, const float *b, size_t n);
void cdp_cpu_residual_bwd(float *da, float *db, const float *dout, size_t n);

/* out[B,T,C] = wte[tokens[b,t], :] + wpe[t, :] (wpe may be NULL: no positions).
 * Token ids outside [0, V) are the caller's to reject before this call.
 * Backward: dwte, dwpe may each be NULL. */
void cdp_cpu_embedding_fwd(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                           int B, int T, int C);
void cdp_cpu_embedding_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                           int B, int T, int C);
/* Vocab-parallel (kernels/ops.h): wte holds rows [off, off + rows) of the
 * whole table; tokens outside them give 0 (plus wpe) forward and scatter
 * nothing backward. */
void cdp_cpu_embedding_vp_fwd(float *out, const int32_t *tokens, const float *wte, const float *wpe, int B, int T,
                              int C, int off, int rows);
void cdp_cpu_embedding_vp_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int B, int T,
                              int C, int off, int rows);

/* Causal (or full) multi-head self-attention on packed projections
 * qkv[B,T,3C] (q | k | v, each NH heads of HS) -> out[B,T,C]. Saves the
 * softmax probabilities att[B,NH,T,T] for backward. The score and value
 * products are GEMMs per (batch, head). */
void cdp_cpu_attention_fwd(float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                           int causal);
/* dqkv[B,T,3C] += gradient; scratch must hold T*T floats (its contents on
 * entry do not matter). att must be the forward's, masked entries zero. */
void cdp_cpu_attention_bwd(float *dqkv, const float *dout, const float *qkv, const float *att,
                           float *scratch, int B, int T, int C, int NH, int causal);
/* The GEMM work (2*M*N*K summed over its cblas_sgemm calls) of one sample's
 * attention forward (backward = 0) or backward (backward = 1); causal attention
 * skips the masked blocks, so this is less than 4*T*T*C (8*T*T*C) for long T. */
double cdp_cpu_attention_gemm_flops(int T, int C, int causal, int backward);

/* Fused softmax + cross-entropy over logits[N,V] with integer targets[N].
 * losses[N] = -log softmax(logits)[target]. Backward writes (overwrites)
 * dlogits[N,V] = (softmax - onehot) * scale, where scale is 1 / (rows in the
 * global batch), so the loss is the mean over the global batch. */
void cdp_cpu_crossentropy_fwd(float *losses, const float *logits, const int32_t *targets, int N,
                              int V);
void cdp_cpu_crossentropy_bwd(float *dlogits, const float *logits, const int32_t *targets, int N,
                              int V, float scale);
/* The cross-entropy over logits split by vocabulary (kernels/ops.h,
 * crossentropy_vp_*): stats[N, 2t + 1] of this rank (k of t), the losses
 * from the group's sum of them, and the logits' gradient. */
void cdp_cpu_crossentropy_vp_stats(float *stats, const float *logits, const int32_t *targets, int N, int V,
                                   int valid, int off, int k, int t);
void cdp_cpu_crossentropy_vp_fwd(float *losses, const float *stats, int N, int t);
void cdp_cpu_crossentropy_vp_bwd(float *dlogits, const float *logits, const int32_t *targets, const float *stats,
                                 int N, int V, int valid, int off, int t, float scale);

/* Mean squared error per row: losses[N] = sum_j (pred - target)^2 / D.
 * Backward overwrites dpred = 2 (pred - target) / D * scale. */
void cdp_cpu_mse_fwd(float *losses, const float *pred, const float *target, int N, int D);
void cdp_cpu_mse_bwd(float *dpred, const float *pred, const float *target, int N, int D, float scale);

/* 2-D convolution, NCHW, square kernel K, stride S, padding P, through im2col
 * and one GEMM per image. col is scratch of IC*K*K*OH*OW floats.
 * OH = (H + 2P - K) / S + 1, likewise OW. b may be NULL; in backward, din,
 * dw and db may each be NULL. */
void cdp_cpu_conv2d_fwd(float *out, float *col, const float *in, const float *w, const float *b,
                        int B, int IC, int H, int W, int OC, int K, int S, int P);
void cdp_cpu_conv2d_bwd(float *din, float *dw, float *db, float *col, const float *dout,
                        const float *in, const float *w, int B, int IC, int H, int W, int OC,
                        int K, int S, int P);

/* Max pooling, NCHW, square window K, stride S, no padding,
 * OH = (H - K) / S + 1; argmax[B,C,OH,OW] saves, for backward, the flat index
 * of each maximum into the whole input in[B,C,H,W] (so backward needs no H, W).
 * Ties go to the first maximum in row-major window order and NaN wins, as in
 * PyTorch. Backward: din[argmax[i]] += dout[i]. */
void cdp_cpu_maxpool2d_fwd(float *out, int32_t *argmax, const float *in, int B, int C, int H,
                           int W, int K, int S);
void cdp_cpu_maxpool2d_bwd(float *din, const float *dout, const int32_t *argmax, int B, int C,
                           int OH, int OW);

/* AdamW as torch.optim.AdamW: p *= 1 - lr * weight_decay; m = beta1 m +
 * (1 - beta1) g; v = beta2 v + (1 - beta2) g^2; p -= lr / (1 - beta1^t) * m /
 * (sqrt(v) / sqrt(1 - beta2^t) + eps). t is the 1-based step; m, v are state
 * (zero before step 1). The betas arrive as float: 1 - 0.999f is 4.7e-5 above
 * 0.001, so a PyTorch reference should be given float32-rounded betas. */
void cdp_cpu_adamw_step(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                        float beta1, float beta2, float eps, float weight_decay, int t);
/* SGD with momentum, as torch.optim.SGD: g = grad + weight_decay * param;
 * velocity = momentum * velocity + g (velocity = g on the first step, t == 1);
 * param -= lr * velocity. With momentum == 0, velocity is unused (may be NULL). */
void cdp_cpu_sgd_step(float *param, const float *grad, float *velocity, size_t n, float lr,
                      float momentum, float weight_decay, int t);
/* Sum of squares of grad[n], accumulated in double. */
double cdp_cpu_sum_squares(const float *grad, size_t n);
/* grad *= s */
void cdp_cpu_scale(float *x, size_t n, float s);

/* Threads the GEMMs use (OpenBLAS's pool), and setting them: a rank bound to
 * n cores runs n. A thread count the user fixed in the environment
 * (OPENBLAS_NUM_THREADS, OMP_NUM_THREADS) is kept; returns the count in use. */
int cdp_cpu_threads(void);
int cdp_cpu_set_threads(int n);
/* The count a validation loss is computed with, in training and in `cdphybrid
 * eval` (and the logits of `generate`): one. OpenBLAS's kernels (Haswell's,
 * Zen's) give a product's rows different rounding depending on how many
 * threads split it, so a loss computed by a rank with 2 threads differs in
 * its last bits from one computed with 1; with one thread everywhere the
 * value is the same double whatever the layout and the cores each rank got
 * (docs/generate.md). */
#define CDP_CPU_EXACT_THREADS 1

#ifdef __cplusplus
}
#endif

#endif
