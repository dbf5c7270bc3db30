/* Optimizer steps on the GPU, matching kernels/cpu/optim.c operation for
 * operation: the scalar factors are computed on the host exactly as the CPU
 * computes them (bias corrections in double), and the kernels spell every
 * fp32 operation with a round-to-nearest intrinsic so that nvcc cannot fuse a
 * multiply and an add (the CPU build does not contract either). With the
 * correctly rounded sqrt and division, a step then gives the CPU's bits.
 * Shapes: param, grad, m, v, velocity all [n]. */
#include "kernels/cuda/cuda_state.h"
#include "kernels/cuda/ops_cuda.h"

#include <math.h>

#define FOR_EACH_INDEX(i, n)                                                              \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);               \
         i += (size_t)gridDim.x * blockDim.x)

static __global__ void adamw_kernel(float *__restrict__ param, const float *__restrict__ grad, float *__restrict__ m,
                                    float *__restrict__ v, size_t n, float b1, float b2, float c1, float c2,
                                    float step, float rbc2, float eps, float decay)
{
    FOR_EACH_INDEX(i, n)
    {
        float g = grad[i];
        float mi = __fadd_rn(__fmul_rn(b1, m[i]), __fmul_rn(c1, g));
        float vi = __fadd_rn(__fmul_rn(b2, v[i]), __fmul_rn(__fmul_rn(c2, g), g));
        m[i] = mi;
        v[i] = vi;
        float den = __fadd_rn(__fmul_rn(__fsqrt_rn(vi), rbc2), eps);
        param[i] = __fsub_rn(__fmul_rn(param[i], decay), __fdiv_rn(__fmul_rn(step, mi), den));
    }
}

/* no momentum: param -= lr * (grad + weight_decay * param) */
static __global__ void sgd_plain_kernel(float *__restrict__ param, const float *__restrict__ grad, size_t n,
                                        float lr, float wd)
{
    FOR_EACH_INDEX(i, n)
    {
        float p = param[i];
        param[i] = __fsub_rn(p, __fmul_rn(lr, __fadd_rn(grad[i], __fmul_rn(wd, p))));
    }
}

/* first step (velocity = g) or later (velocity = momentum velocity + g) */
static __global__ void sgd_momentum_kernel(float *__restrict__ param, const float *__restrict__ grad,
                                           float *__restrict__ velocity, size_t n, float lr, float momentum,
                                           float wd, int first)
{
    FOR_EACH_INDEX(i, n)
    {
        float p = param[i];
        float g = __fadd_rn(grad[i], __fmul_rn(wd, p));
        float u = first ? g : __fadd_rn(__fmul_rn(momentum, velocity[i]), g);
        velocity[i] = u;
        param[i] = __fsub_rn(p, __fmul_rn(lr, u));
    }
}

cdp_status cdp_cuda_adamw_step(void *ks, float *param, const float *grad, float *m, float *v, size_t n,
                               float lr, float beta1, float beta2, float eps, float weight_decay, int t)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (n == 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    /* Corrections in double: 1 - beta2^t is tiny for small t and beta2 near 1. */
    double bc1 = 1.0 - pow((double)beta1, (double)t);
    double bc2 = 1.0 - pow((double)beta2, (double)t);
    float step = (float)((double)lr / bc1);
    float rbc2 = (float)(1.0 / sqrt(bc2));
    float decay = 1.0f - lr * weight_decay;
    float c1 = 1.0f - beta1, c2 = 1.0f - beta2;
    adamw_kernel<<<cdp_cuda_blocks(n, CDP_CUDA_THREADS), CDP_CUDA_THREADS, 0, s->stream>>>(
        param, grad, m, v, n, beta1, beta2, c1, c2, step, rbc2, eps, decay);
    CDP_CUDA_LAUNCHED("adamw_kernel");
    return CDP_OK;
}

cdp_status cdp_cuda_sgd_step(void *ks, float *param, const float *grad, float *velocity, size_t n, float lr,
                             float momentum, float weight_decay, int t)
{
    struct cdp_cuda_state *s = (struct cdp_cuda_state *)ks;
    if (n == 0) return CDP_OK;
    CDP_CUDA_TRY(cudaSetDevice(s->index));
    unsigned blocks = cdp_cuda_blocks(n, CDP_CUDA_THREADS);
    if (!velocity || momentum == 0.0f) {
        sgd_plain_kernel<<<blocks, CDP_CUDA_THREADS, 0, s->stream>>>(param, grad, n, lr, weight_decay);
        CDP_CUDA_LAUNCHED("sgd_plain_kernel");
        return CDP_OK;
    }
    sgd_momentum_kernel<<<blocks, CDP_CUDA_THREADS, 0, s->stream>>>(param, grad, velocity, n, lr, momentum,
                                                                     weight_decay, t <= 1);
    CDP_CUDA_LAUNCHED("sgd_momentum_kernel");
    return CDP_OK;
}
