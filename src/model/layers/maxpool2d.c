/* maxpool2d: the maximum of each K x K window over [C, H, W]. Keys: kernel
 * (required), stride (the kernel). Kept: the output, then each output's
 * argmax (int32). */
#include "model/layers/common.h"

static const char *const keys[] = {"kernel", "stride", NULL};

static cdp_status parse(const struct cdp_json_in *in, const json_t *v, const char *ptr, const char *who,
                        struct cdp_layer_desc *L)
{
    cdp_status st = cdp_layer_get_required_int(in, v, ptr, "kernel", 1, who, &L->kernel);
    if (st) return st;
    L->stride = L->kernel;
    return cdp_json_get_int(in, v, ptr, "stride", 1, CDP_PLAN_MAX_COUNT, 0, &L->stride);
}

static int shape(const struct cdp_layer_desc *L, const struct cdp_shape *in, struct cdp_shape *out, char *why,
                 size_t cap)
{
    return cdp_window_shape("maxpool2d", in, L->kernel, L->stride, 0, in->ndim == 3 ? in->d[0] : 0, out, why,
                            cap);
}

static int emit(const struct cdp_layer_desc *L, json_t *o)
{
    return json_object_set_new(o, "kernel", CDP_JINT(L->kernel)) |
           json_object_set_new(o, "stride", CDP_JINT(L->stride));
}

static void describe(const struct cdp_layer_desc *L, char *buf, size_t cap)
{
    snprintf(buf, cap, " kernel %lld, stride %lld", (long long)L->kernel, (long long)L->stride);
}

static void cost(struct cdp_unit *u)
{
    u->act_floats = 2 * u->out_floats; /* output + argmax */
    /* no parameters: its input gradient (B) is its whole backward, W has nothing to do */
    u->bwd_weight_flops = 0;
    u->wstate_floats = 0;
}

static cdp_status forward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p, const void *in,
                          float *act, float *tail, float *scratch, int B)
{
    (void)tail;
    (void)p, (void)scratch;
    K(maxpool2d_fwd, act, (int32_t *)(act + B * u->out_floats), (const float *)in, B, (int)u->in.d[0],
      (int)u->in.d[1], (int)u->in.d[2], (int)u->desc.kernel, (int)u->desc.stride);
    return CDP_OK;
}

static cdp_status backward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                           float *const *g, const void *in, const float *act, const float *tail,
                           const float *dout, float *din, float *scratch, int B)
{
    (void)tail;
    (void)p, (void)g, (void)in, (void)scratch;
    if (din)
        K(maxpool2d_bwd, din, dout, (const int32_t *)(act + B * u->out_floats), B, (int)u->out.d[0],
          (int)u->out.d[1], (int)u->out.d[2]);
    return CDP_OK;
}

const struct cdp_layer_def cdp_layer_maxpool2d = {
    .type = CDP_LAYER_MAXPOOL2D,
    .name = "maxpool2d",
    .listable = 1,
    .keys = keys,
    .parse = parse,
    .shape = shape,
    .emit = emit,
    .describe = describe,
    .cost = cost,
    .forward = forward,
    .backward = backward,
};
