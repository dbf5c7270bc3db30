/* linear: y = x W^T + b over the last dimension. Keys: out (required), bias. */
#include "model/layers/common.h"

static const char *const keys[] = {"out", "bias", NULL};

static cdp_status parse(const struct cdp_json_in *in, const json_t *v, const char *ptr, const char *who,
                        struct cdp_layer_desc *L)
{
    cdp_status st = cdp_layer_get_required_int(in, v, ptr, "out", 1, who, &L->out);
    return st ? st : cdp_json_get_bool(in, v, ptr, "bias", &L->bias);
}

static int shape(const struct cdp_layer_desc *L, const struct cdp_shape *in, struct cdp_shape *out, char *why,
                 size_t cap)
{
    (void)why, (void)cap;
    *out = *in;
    out->d[out->ndim - 1] = L->out;
    return 0;
}

static int64_t params(const struct cdp_layer_desc *L, const struct cdp_shape *in)
{
    return cdp_mul_add(cdp_shape_last(in), L->out, L->bias ? L->out : 0);
}

static int emit(const struct cdp_layer_desc *L, json_t *o)
{
    return json_object_set_new(o, "out", CDP_JINT(L->out)) | json_object_set_new(o, "bias", json_boolean(L->bias));
}

static void describe(const struct cdp_layer_desc *L, char *buf, size_t cap)
{
    snprintf(buf, cap, " out %lld%s", (long long)L->out, L->bias ? "" : ", no bias");
}

static void build(struct cdp_unit *u, const struct cdp_model_desc *m)
{
    (void)m;
    cdp_unit_add_linear_params(u, "", u->desc.out, cdp_shape_last(&u->in), u->desc.bias, 0, 0.0f);
}

static void cost(struct cdp_unit *u)
{
    const double rows = (double)cdp_shape_rows(&u->in), last = (double)cdp_shape_last(&u->in);
    u->fwd_flops = 2.0 * rows * last * (double)u->desc.out;
    u->bwd_flops = 4.0 * rows * last * (double)u->desc.out;
    u->act_floats = u->out_floats;
    /* W: dw += dout^T . in (and db) from a copy of the output gradient */
    u->bwd_weight_flops = 2.0 * rows * last * (double)u->desc.out;
    u->wstate_floats = u->out_floats;
}

static cdp_status forward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p, const void *in,
                          float *act, float *tail, float *scratch, int B)
{
    (void)tail;
    (void)scratch;
    K(linear_fwd, act, (const float *)in, p[0], u->desc.bias ? p[1] : NULL, (int)(B * cdp_shape_rows(&u->in)),
      (int)cdp_shape_last(&u->in), (int)u->desc.out);
    return CDP_OK;
}

static cdp_status backward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                           float *const *g, const void *in, const float *act, const float *tail,
                           const float *dout, float *din, float *scratch, int B)
{
    (void)tail;
    (void)act, (void)scratch;
    K(linear_bwd, din, g[0], u->desc.bias ? g[1] : NULL, dout, (const float *)in, p[0],
      (int)(B * cdp_shape_rows(&u->in)), (int)cdp_shape_last(&u->in), (int)u->desc.out);
    return CDP_OK;
}

/* B: din with the weight outputs NULL; the output gradient kept for W */
static cdp_status backward_input(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                 const void *in, const float *act, const float *tail, const float *dout,
                                 float *din, float *ws, float *scratch, int B)
{
    (void)act, (void)tail, (void)scratch;
    const int N = (int)(B * cdp_shape_rows(&u->in));
    K(copy, ws, dout, (size_t)N * u->desc.out * sizeof *ws);
    if (din) K(linear_bwd, din, NULL, NULL, dout, (const float *)in, p[0], N, (int)cdp_shape_last(&u->in),
               (int)u->desc.out);
    return CDP_OK;
}

/* W: dw and db with din NULL, from that copy */
static cdp_status backward_weight(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                  float *const *g, const void *in, const float *act, const float *tail,
                                  const float *dout, const float *ws, float *scratch, int B)
{
    (void)act, (void)tail, (void)dout, (void)scratch;
    K(linear_bwd, NULL, g[0], u->desc.bias ? g[1] : NULL, ws, (const float *)in, p[0],
      (int)(B * cdp_shape_rows(&u->in)), (int)cdp_shape_last(&u->in), (int)u->desc.out);
    return CDP_OK;
}

const struct cdp_layer_def cdp_layer_linear = {
    .type = CDP_LAYER_LINEAR,
    .name = "linear",
    .listable = 1,
    .tensor_ok = 1,
    .keys = keys,
    .parse = parse,
    .shape = shape,
    .params = params,
    .emit = emit,
    .describe = describe,
    .build = build,
    .cost = cost,
    .forward = forward,
    .backward = backward,
    .backward_input = backward_input,
    .backward_weight = backward_weight,
};
