/* The CUDA kernels behind the table of kernels/ops.h, one file per op family
 * (the file is named beside each group). Semantics: kernels/cpu/ops.h. */
#ifndef CDP_KERNELS_CUDA_OPS_CUDA_H
#define CDP_KERNELS_CUDA_OPS_CUDA_H

#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const struct cdp_ops cdp_cuda_ops;

/* state.cu */
cdp_status cdp_cuda_set_precision(void *ks, enum cdp_precision p);

/* elementwise.cu */
cdp_status cdp_cuda_zero(void *ks, void *p, size_t bytes);
cdp_status cdp_cuda_copy(void *ks, void *dst, const void *src, size_t bytes);
cdp_status cdp_cuda_add(void *ks, float *dst, const float *src, size_t n);
cdp_status cdp_cuda_scale(void *ks, float *x, size_t n, float s);
cdp_status cdp_cuda_sum_squares(void *ks, const float *x, size_t n, double *out);

/* linear.cu */
cdp_status cdp_cuda_linear_fwd(void *ks, float *out, const float *in, const float *w, const float *b, int N,
                               int IC, int OC);
cdp_status cdp_cuda_linear_bwd(void *ks, float *din, float *dw, float *db, const float *dout, const float *in,
                               const float *w, int N, int IC, int OC);
cdp_status cdp_cuda_linear_gelu_bwd(void *ks, float *dpre, float *dw, float *db, const float *dout, const float *act,
                                    const float *pre, const float *w, int N, int IC, int OC);

/* elementwise.cu */
cdp_status cdp_cuda_relu_fwd(void *ks, float *out, const float *in, size_t n);
cdp_status cdp_cuda_relu_bwd(void *ks, float *din, const float *dout, const float *in, size_t n);
cdp_status cdp_cuda_gelu_fwd(void *ks, float *out, const float *in, size_t n);
cdp_status cdp_cuda_gelu_bwd(void *ks, float *din, const float *dout, const float *in, size_t n);
/* not in the table: d[n] *= GELU'(pre[n]) in place */
cdp_status cdp_cuda_gelu_grad_scale(void *ks, float *d, const float *pre, size_t n);

/* layernorm.cu */
cdp_status cdp_cuda_layernorm_fwd(void *ks, float *out, float *mean, float *rstd, const float *in,
                                  const float *weight, const float *bias, int N, int C, float eps);
cdp_status cdp_cuda_layernorm_bwd(void *ks, float *din, float *dweight, float *dbias, const float *dout,
                                  const float *in, const float *weight, const float *mean, const float *rstd,
                                  int N, int C);

/* elementwise.cu */
cdp_status cdp_cuda_residual_fwd(void *ks, float *out, const float *a, const float *b, size_t n);
cdp_status cdp_cuda_residual_bwd(void *ks, float *da, float *db, const float *dout, size_t n);

/* embedding.cu */
cdp_status cdp_cuda_embedding_fwd(void *ks, float *out, const int32_t *tokens, const float *wte,
                                  const float *wpe, int B, int T, int C);
cdp_status cdp_cuda_embedding_bwd(void *ks, float *dwte, float *dwpe, const float *dout,
                                  const int32_t *tokens, int B, int T, int C);
cdp_status cdp_cuda_embedding_vp_fwd(void *ks, float *out, const int32_t *tokens, const float *wte,
                                     const float *wpe, int B, int T, int C, int off, int rows);
cdp_status cdp_cuda_embedding_vp_bwd(void *ks, float *dwte, float *dwpe, const float *dout,
                                     const int32_t *tokens, int B, int T, int C, int off, int rows);

/* attention.cu */
cdp_status cdp_cuda_attention_fwd(void *ks, float *out, float *att, const float *qkv, int B, int T, int C,
                                  int NH, int causal);
size_t cdp_cuda_attention_state_floats(void *ks, int B, int T, int C, int NH);
cdp_status cdp_cuda_attention_bwd(void *ks, float *dqkv, const float *dout, const float *qkv,
                                  const float *att, float *scratch, int B, int T, int C, int NH, int causal);

/* loss.cu */
cdp_status cdp_cuda_crossentropy_fwd(void *ks, float *losses, const float *logits, const int32_t *targets,
                                     int N, int V);
cdp_status cdp_cuda_crossentropy_bwd(void *ks, float *dlogits, const float *logits, const int32_t *targets,
                                     int N, int V, float scale);
cdp_status cdp_cuda_crossentropy_vp_stats(void *ks, float *stats, const float *logits, const int32_t *targets,
                                          int N, int V, int valid, int off, int k, int t);
cdp_status cdp_cuda_crossentropy_vp_fwd(void *ks, float *losses, const float *stats, int N, int t);
cdp_status cdp_cuda_crossentropy_vp_bwd(void *ks, float *dlogits, const float *logits, const int32_t *targets,
                                        const float *stats, int N, int V, int valid, int off, int t, float scale);
cdp_status cdp_cuda_mse_fwd(void *ks, float *losses, const float *pred, const float *target, int N, int D);
cdp_status cdp_cuda_mse_bwd(void *ks, float *dpred, const float *pred, const float *target, int N, int D,
                            float scale);

/* conv.cu */
cdp_status cdp_cuda_conv2d_fwd(void *ks, float *out, float *col, const float *in, const float *w,
                               const float *b, int B, int IC, int H, int W, int OC, int K, int S, int P);
cdp_status cdp_cuda_conv2d_bwd(void *ks, float *din, float *dw, float *db, float *col, const float *dout,
                               const float *in, const float *w, int B, int IC, int H, int W, int OC, int K,
                               int S, int P);

/* llama.cu */
cdp_status cdp_cuda_rmsnorm_fwd(void *ks, float *out, float *rstd, const float *in, const float *weight, int N, int C,
                                float eps);
cdp_status cdp_cuda_rmsnorm_bwd(void *ks, float *din, float *dweight, const float *dout, const float *in,
                                const float *weight, const float *rstd, int N, int C);
cdp_status cdp_cuda_rope_fwd(void *ks, float *qkv, const float *q, const float *k, const float *v, int B, int T,
                             int NH, int NKV, int HD, int pos0, struct cdp_rope rope);
cdp_status cdp_cuda_rope_bwd(void *ks, float *dq, float *dk, float *dv, const float *dqkv, int B, int T, int NH,
                             int NKV, int HD, int pos0, struct cdp_rope rope);
cdp_status cdp_cuda_swiglu_fwd(void *ks, float *out, const float *gate, const float *up, size_t n);
cdp_status cdp_cuda_swiglu_bwd(void *ks, float *dgate, float *dup, const float *dout, const float *gate,
                               const float *up, size_t n);

/* pool.cu */
cdp_status cdp_cuda_maxpool2d_fwd(void *ks, float *out, int32_t *argmax, const float *in, int B, int C, int H,
                                  int W, int K, int S);
cdp_status cdp_cuda_maxpool2d_bwd(void *ks, float *din, const float *dout, const int32_t *argmax, int B,
                                  int C, int OH, int OW);

/* optim.cu */
cdp_status cdp_cuda_adamw_step(void *ks, float *param, const float *grad, float *m, float *v, size_t n,
                               float lr, float beta1, float beta2, float eps, float weight_decay, int t);
cdp_status cdp_cuda_sgd_step(void *ks, float *param, const float *grad, float *velocity, size_t n, float lr,
                             float momentum, float weight_decay, int t);

#ifdef __cplusplus
}
#endif

#endif
