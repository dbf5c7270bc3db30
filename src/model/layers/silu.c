/* silu: x * sigmoid(x), elementwise (Swish with beta 1, as torch.nn.SiLU); the
 * shape passes through. No keys. The CUDA table has no silu kernels yet. */
#include "model/layers/common.h"

static const char *const keys[] = {NULL};

static void cost(struct cdp_unit *u)
{
    u->act_floats = u->out_floats;
    /* no parameters: its input gradient (B) is its whole backward, W has nothing to do */
    u->bwd_weight_flops = 0;
    u->wstate_floats = 0;
}

static cdp_status forward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p, const void *in,
                          float *act, float *tail, float *scratch, int B)
{
    (void)tail;
    (void)p, (void)scratch;
    K(silu_fwd, act, (const float *)in, (size_t)(B * cdp_shape_numel(&u->in)));
    return CDP_OK;
}

static cdp_status backward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                           float *const *g, const void *in, const float *act, const float *tail,
                           const float *dout, float *din, float *scratch, int B)
{
    (void)tail;
    (void)p, (void)g, (void)act, (void)scratch;
    if (din) K(silu_bwd, din, dout, (const float *)in, (size_t)(B * cdp_shape_numel(&u->in)));
    return CDP_OK;
}

const struct cdp_layer_def cdp_layer_silu = {
    .type = CDP_LAYER_SILU,
    .name = "silu",
    .listable = 1,
    .tensor_ok = 1,
    .tensor_passes = 1,
    .keys = keys,
    .cost = cost,
    .forward = forward,
    .backward = backward,
};
