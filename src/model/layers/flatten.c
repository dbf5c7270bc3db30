/* flatten: a sample's shape becomes one dimension; the values are copied and
 * the gradient passes through unchanged. No keys. */
#include "model/layers/common.h"

static const char *const keys[] = {NULL};

static int shape(const struct cdp_layer_desc *L, const struct cdp_shape *in, struct cdp_shape *out, char *why,
                 size_t cap)
{
    (void)L;
    int64_t n = 1;
    for (int k = 0; k < in->ndim; k++)
        if (__builtin_mul_overflow(n, in->d[k], &n) || n > CDP_PLAN_MAX_COUNT) {
            char sh[96];
            cdp_shape_format(in, sh, sizeof sh);
            snprintf(why, cap, "flatten of %s gives more than %d features", sh, CDP_PLAN_MAX_COUNT);
            return -1;
        }
    *out = (struct cdp_shape){1, {n}};
    return 0;
}

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
    K(copy, act, in, (size_t)(B * cdp_shape_numel(&u->in)) * sizeof *act);
    return CDP_OK;
}

static cdp_status backward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                           float *const *g, const void *in, const float *act, const float *tail,
                           const float *dout, float *din, float *scratch, int B)
{
    (void)tail;
    (void)p, (void)g, (void)in, (void)act, (void)scratch;
    if (din) K(add, din, dout, (size_t)(B * cdp_shape_numel(&u->in)));
    return CDP_OK;
}

const struct cdp_layer_def cdp_layer_flatten = {
    .type = CDP_LAYER_FLATTEN,
    .name = "flatten",
    .listable = 1,
    .keys = keys,
    .shape = shape,
    .cost = cost,
    .forward = forward,
    .backward = backward,
};
