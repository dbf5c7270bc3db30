/* rmsnorm: RMS normalisation over the last dimension with a learned scale,
 * as Llama's RMSNorm (no mean, no bias). Keys: eps (default 1e-5). Kept: the
 * output, then each row's 1/rms. */
#include "model/layers/common.h"

static const char *const keys[] = {"eps", NULL};

static cdp_status parse(const struct cdp_json_in *in, const json_t *v, const char *ptr, const char *who,
                        struct cdp_layer_desc *L)
{
    (void)who;
    L->eps = 1e-5;
    return cdp_json_get_number(in, v, ptr, "eps", CDP_JSON_POSITIVE, &L->eps);
}

static int64_t params(const struct cdp_layer_desc *L, const struct cdp_shape *in)
{
    (void)L;
    return cdp_shape_last(in);
}

static int emit(const struct cdp_layer_desc *L, json_t *o) { return json_object_set_new(o, "eps", json_real(L->eps)); }

static void describe(const struct cdp_layer_desc *L, char *buf, size_t cap) { snprintf(buf, cap, " eps %g", L->eps); }

static void build(struct cdp_unit *u, const struct cdp_model_desc *m)
{
    (void)m;
    cdp_unit_add_rmsnorm_param(u, "", cdp_shape_last(&u->in));
}

static void cost(struct cdp_unit *u)
{
    u->act_floats = u->out_floats + cdp_shape_rows(&u->in);
    /* W (no products): the weight gradient from a copy of the output gradient */
    u->bwd_weight_flops = 0;
    u->wstate_floats = u->out_floats;
}

struct dims {
    int64_t n;    /* elements of a micro-batch */
    int rows, C;
};

static struct dims dims_of(const struct cdp_unit *u, int B)
{
    return (struct dims){(int64_t)B * cdp_shape_numel(&u->in), (int)(B * cdp_shape_rows(&u->in)),
                         (int)cdp_shape_last(&u->in)};
}

static cdp_status forward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p, const void *in,
                          float *act, float *tail, float *scratch_, int B)
{
    (void)tail, (void)scratch_;
    const struct dims d = dims_of(u, B);
    K(rmsnorm_fwd, act, act + d.n, (const float *)in, p[0], d.rows, d.C, (float)u->desc.eps);
    return CDP_OK;
}

static cdp_status backward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                           float *const *g, const void *in, const float *act, const float *tail,
                           const float *dout, float *din, float *scratch_, int B)
{
    (void)tail, (void)scratch_;
    const struct dims d = dims_of(u, B);
    K(rmsnorm_bwd, din, g[0], dout, (const float *)in, p[0], act + d.n, d.rows, d.C);
    return CDP_OK;
}

/* B: din with the weight output NULL (nothing when din is not wanted); the
 * output gradient kept for W */
static cdp_status backward_input(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                 const void *in, const float *act, const float *tail, const float *dout,
                                 float *din, float *ws, float *scratch_, int B)
{
    (void)tail, (void)scratch_;
    const struct dims d = dims_of(u, B);
    K(copy, ws, dout, (size_t)d.n * sizeof *ws);
    if (din) K(rmsnorm_bwd, din, NULL, dout, (const float *)in, p[0], act + d.n, d.rows, d.C);
    return CDP_OK;
}

/* W: the weight gradient with din NULL, from that copy */
static cdp_status backward_weight(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                  float *const *g, const void *in, const float *act, const float *tail,
                                  const float *dout, const float *ws, float *scratch_, int B)
{
    (void)tail, (void)dout, (void)scratch_;
    const struct dims d = dims_of(u, B);
    K(rmsnorm_bwd, NULL, g[0], ws, (const float *)in, p[0], act + d.n, d.rows, d.C);
    return CDP_OK;
}

const struct cdp_layer_def cdp_layer_rmsnorm = {
    .type = CDP_LAYER_RMSNORM,
    .name = "rmsnorm",
    .listable = 1,
    .tensor_ok = 1, /* replicated: whole on every rank of a tensor group */
    .keys = keys,
    .parse = parse,
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
