/* conv2d: a square-kernel convolution over [C, H, W] (im2col + GEMM on the
 * CPU, cuDNN on GPUs). Keys: out, kernel (required), stride (1), padding (0),
 * bias. */
#include <math.h>

#include "model/layers/common.h"

static const char *const keys[] = {"out", "kernel", "stride", "padding", "bias", NULL};

static cdp_status parse(const struct cdp_json_in *in, const json_t *v, const char *ptr, const char *who,
                        struct cdp_layer_desc *L)
{
    cdp_status st;
    L->stride = 1;
    if ((st = cdp_layer_get_required_int(in, v, ptr, "out", 1, who, &L->out))) return st;
    if ((st = cdp_layer_get_required_int(in, v, ptr, "kernel", 1, who, &L->kernel))) return st;
    if ((st = cdp_json_get_int(in, v, ptr, "stride", 1, CDP_PLAN_MAX_COUNT, 0, &L->stride))) return st;
    if ((st = cdp_json_get_int(in, v, ptr, "padding", 0, CDP_PLAN_MAX_COUNT, 0, &L->padding))) return st;
    return cdp_json_get_bool(in, v, ptr, "bias", &L->bias);
}

static int shape(const struct cdp_layer_desc *L, const struct cdp_shape *in, struct cdp_shape *out, char *why,
                 size_t cap)
{
    return cdp_window_shape("conv2d", in, L->kernel, L->stride, L->padding, L->out, out, why, cap);
}

/* out x C x K x K weights and out biases */
static int64_t params(const struct cdp_layer_desc *L, const struct cdp_shape *in)
{
    return cdp_mul_add(cdp_mul_add(cdp_mul_add(in->d[0], L->kernel, 0), L->kernel, 0), L->out,
                       L->bias ? L->out : 0);
}

static int emit(const struct cdp_layer_desc *L, json_t *o)
{
    return json_object_set_new(o, "out", CDP_JINT(L->out)) | json_object_set_new(o, "kernel", CDP_JINT(L->kernel)) |
           json_object_set_new(o, "stride", CDP_JINT(L->stride)) |
           json_object_set_new(o, "padding", CDP_JINT(L->padding)) |
           json_object_set_new(o, "bias", json_boolean(L->bias));
}

static void describe(const struct cdp_layer_desc *L, char *buf, size_t cap)
{
    snprintf(buf, cap, " out %lld, kernel %lld, stride %lld, padding %lld%s", (long long)L->out,
             (long long)L->kernel, (long long)L->stride, (long long)L->padding, L->bias ? "" : ", no bias");
}

/* PyTorch's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and bias */
static void build(struct cdp_unit *u, const struct cdp_model_desc *m)
{
    (void)m;
    const struct cdp_layer_desc *d = &u->desc;
    const int64_t K = d->kernel;
    const float bound = 1.0f / sqrtf((float)(u->in.d[0] * K * K));
    cdp_unit_add_param(u, "weight", 4, d->out, u->in.d[0], K, K, CDP_INIT_UNIFORM, bound, CDP_PARAM_WEIGHT);
    if (d->bias) cdp_unit_add_param(u, "bias", 1, d->out, 0, 0, 0, CDP_INIT_UNIFORM, bound, CDP_PARAM_BIAS);
}

static void cost(struct cdp_unit *u)
{
    const struct cdp_layer_desc *d = &u->desc;
    const double gemm = 2.0 * d->out * (double)(u->in.d[0] * d->kernel * d->kernel) *
                        (double)(u->out.d[1] * u->out.d[2]);
    u->act_floats = u->out_floats;
    u->fwd_flops = gemm;
    u->bwd_flops = 2.0 * gemm;
    /* W: dw += corr(in, dout) (and db) from a copy of the output gradient */
    u->bwd_weight_flops = gemm;
    u->wstate_floats = u->out_floats;
}

/* one image's im2col matrix (-1 when it overflows: cdp_units_check_sizes) */
static int64_t scratch(const struct cdp_unit *u, int B)
{
    (void)B;
    const int64_t cols = cdp_mul_add(cdp_mul_add(u->in.d[0], u->desc.kernel, 0), u->desc.kernel, 0);
    return cdp_mul_add(cdp_mul_add(cols, u->out.d[1], 0), u->out.d[2], 0);
}

static cdp_status forward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p, const void *in,
                          float *act, float *tail, float *scratch_, int B)
{
    (void)tail;
    const struct cdp_layer_desc *d = &u->desc;
    K(conv2d_fwd, act, scratch_, (const float *)in, p[0], d->bias ? p[1] : NULL, B, (int)u->in.d[0],
      (int)u->in.d[1], (int)u->in.d[2], (int)d->out, (int)d->kernel, (int)d->stride, (int)d->padding);
    return CDP_OK;
}

static cdp_status backward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                           float *const *g, const void *in, const float *act, const float *tail,
                           const float *dout, float *din, float *scratch_, int B)
{
    (void)tail;
    (void)act;
    const struct cdp_layer_desc *d = &u->desc;
    K(conv2d_bwd, din, g[0], d->bias ? g[1] : NULL, scratch_, dout, (const float *)in, p[0], B, (int)u->in.d[0],
      (int)u->in.d[1], (int)u->in.d[2], (int)d->out, (int)d->kernel, (int)d->stride, (int)d->padding);
    return CDP_OK;
}

/* B: din with the weight outputs NULL; the output gradient kept for W */
static cdp_status backward_input(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                 const void *in, const float *act, const float *tail, const float *dout,
                                 float *din, float *ws, float *scratch_, int B)
{
    (void)act, (void)tail;
    const struct cdp_layer_desc *d = &u->desc;
    K(copy, ws, dout, (size_t)B * u->out_floats * sizeof *ws);
    if (din)
        K(conv2d_bwd, din, NULL, NULL, scratch_, dout, (const float *)in, p[0], B, (int)u->in.d[0],
          (int)u->in.d[1], (int)u->in.d[2], (int)d->out, (int)d->kernel, (int)d->stride, (int)d->padding);
    return CDP_OK;
}

/* W: dw and db with din NULL, from that copy */
static cdp_status backward_weight(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                  float *const *g, const void *in, const float *act, const float *tail,
                                  const float *dout, const float *ws, float *scratch_, int B)
{
    (void)act, (void)tail, (void)dout;
    const struct cdp_layer_desc *d = &u->desc;
    K(conv2d_bwd, NULL, g[0], d->bias ? g[1] : NULL, scratch_, ws, (const float *)in, p[0], B, (int)u->in.d[0],
      (int)u->in.d[1], (int)u->in.d[2], (int)d->out, (int)d->kernel, (int)d->stride, (int)d->padding);
    return CDP_OK;
}

const struct cdp_layer_def cdp_layer_conv2d = {
    .type = CDP_LAYER_CONV2D,
    .name = "conv2d",
    .listable = 1,
    .keys = keys,
    .parse = parse,
    .shape = shape,
    .params = params,
    .emit = emit,
    .describe = describe,
    .build = build,
    .cost = cost,
    .scratch = scratch,
    .forward = forward,
    .backward = backward,
    .backward_input = backward_input,
    .backward_weight = backward_weight,
};
