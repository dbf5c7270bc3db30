/* Fused causal/full self-attention for bf16 precision (flash attention: the
 * T x T scores never leave the chip). Internal to the CUDA module; called by
 * attention.cu when cdp_cuda_flash_usable() says the shapes fit, with the
 * semantics of kernels/cpu/attention.c except for what `att` holds.
 *
 * `att` (the op's saved state between forward and backward) holds the
 * per-row log2-sum-exp of the scaled scores, [B,NH,T], then a copy of the
 * output, [B,T,C]: B*T*(NH + C) floats, what attention_state_floats reports
 * (less than the general path's B*NH*T*T as T > HS). */
#ifndef CDP_KERNELS_CUDA_FLASH_ATTENTION_H
#define CDP_KERNELS_CUDA_FLASH_ATTENTION_H

#include "kernels/cuda/cuda_state.h"

/* true when the fused kernels take these shapes under the state's precision:
 * bf16, head size 32 or 64, T > head size, B*NH <= 65535, a build for
 * sm_80 or later, and CDP_CUDA_ATTENTION is not "materialized" (the switch
 * that keeps the T x T path, for comparisons). */
bool cdp_cuda_flash_usable(const struct cdp_cuda_state *s, int B, int T, int C, int NH);

cdp_status cdp_cuda_flash_fwd(struct cdp_cuda_state *s, float *out, float *att, const float *qkv, int B, int T,
                              int C, int NH, int causal);
/* dqkv += the gradient (accumulates, as every attention backward) */
cdp_status cdp_cuda_flash_bwd(struct cdp_cuda_state *s, float *dqkv, const float *dout, const float *qkv,
                              const float *att, int B, int T, int C, int NH, int causal);

#endif
