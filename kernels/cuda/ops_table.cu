/* The CUDA kernel table (kernels/ops.h), made from its lists in struct order. */
#include "kernels/cuda/ops_cuda.h"

/* the optional entries, each one said */
#define CUDA_OPTIONAL_attention_state_floats cdp_cuda_attention_state_floats
#define CUDA_OPTIONAL_linear_gelu_bwd cdp_cuda_linear_gelu_bwd
#define CUDA_OPTIONAL_silu_fwd NULL /* not yet: a new kernel waits for a GPU to check it on */
#define CUDA_OPTIONAL_silu_bwd NULL
/* written and compiled (kernels/cuda/embedding.cu, loss.cu), not yet run on a GPU */
#define CUDA_OPTIONAL_embedding_vp_fwd NULL
#define CUDA_OPTIONAL_embedding_vp_bwd NULL
#define CUDA_OPTIONAL_crossentropy_vp_stats NULL
#define CUDA_OPTIONAL_crossentropy_vp_fwd NULL
#define CUDA_OPTIONAL_crossentropy_vp_bwd NULL

extern "C" const struct cdp_ops cdp_cuda_ops = {
    CDP_OPS_ABI,
    "cuda",
#define CUDA_ENTRY_(op) cdp_cuda_##op,
#define CUDA_OPTIONAL_(op) CUDA_OPTIONAL_##op,
    CDP_KERNEL_OPS(CUDA_ENTRY_) CDP_KERNEL_OPS_OPTIONAL(CUDA_OPTIONAL_)
#undef CUDA_ENTRY_
#undef CUDA_OPTIONAL_
};
