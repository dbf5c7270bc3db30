/* The CUDA kernel table (kernels/ops.h), made from its lists in struct order. */
#include "kernels/cuda/ops_cuda.h"

extern "C" const struct cdp_ops cdp_cuda_ops = {
    CDP_OPS_ABI,
    "cuda",
#define CUDA_ENTRY_(op) cdp_cuda_##op,
    CDP_KERNEL_OPS(CUDA_ENTRY_) CDP_KERNEL_OPS_OPTIONAL(CUDA_ENTRY_)
#undef CUDA_ENTRY_
};
