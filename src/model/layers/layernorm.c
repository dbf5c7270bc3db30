/* layernorm over the last dimension, with a learned scale and shift. Keys:
 * eps (default 1e-5). Kept: the output, then each row's mean and 1/std. */
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
    return cdp_mul_add(2, cdp_shape_last(in), 0);
}

static int emit(const struct cdp_layer_desc *L, json_t *o) { return json_object_set_new(o, "eps", json_real(L->eps)); }

static void describe(const struct cdp_layer_desc *L, char *buf, size_t cap) { snprintf(buf, cap, " eps %g", L->eps); }

static void build(struct cdp_unit *u, const struct cdp_model_desc *m)
{
    (void)m;
    cdp_unit_add_norm_params(u, "", cdp_shape_last(&u->in));
}

static void cost(struct cdp_unit *u)
{
    u->act_floats = u->out_floats + 2 * cdp_shape_rows(&u->in);
    /* W (no products): the weight and bias gradients from a copy of the output gradient */
    u->bwd_weight_flops = 0;
    u->wstate_floats = u->out_floats;
}

static int64_t scratch(const struct cdp_unit *u, int B) { return (int64_t)B * cdp_shape_numel(&u->in); }

static cdp_status forward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p, const void *in,
                          float *act, float *tail, float *scratch_, int B)
{
    (void)tail;
    (void)scratch_;
    const int64_t n_in = (int64_t)B * cdp_shape_numel(&u->in);
    const int rows = (int)(B * cdp_shape_rows(&u->in)), last = (int)cdp_shape_last(&u->in);
    float *mean = act + n_in, *rstd = mean + rows;
    K(layernorm_fwd, act, mean, rstd, (const float *)in, p[0], p[1], rows, last, (float)u->desc.eps);
    return CDP_OK;
}

static cdp_status backward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                           float *const *g, const void *in, const float *act, const float *tail,
                           const float *dout, float *din, float *scratch_, int B)
{
    (void)tail;
    const int64_t n_in = (int64_t)B * cdp_shape_numel(&u->in);
    const int rows = (int)(B * cdp_shape_rows(&u->in)), last = (int)cdp_shape_last(&u->in);
    const float *mean = act + n_in, *rstd = mean + rows;
    float *target = din ? din : scratch_;
    if (!din) K(zero, scratch_, (size_t)n_in * sizeof *scratch_);
    K(layernorm_bwd, target, g[0], g[1], dout, (const float *)in, p[0], mean, rstd, rows, last);
    return CDP_OK;
}

/* B: din with the weight outputs NULL (nothing when din is not wanted); the
 * output gradient kept for W */
static cdp_status backward_input(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                 const void *in, const float *act, const float *tail, const float *dout,
                                 float *din, float *ws, float *scratch_, int B)
{
    (void)tail, (void)scratch_;
    const int64_t n_in = (int64_t)B * cdp_shape_numel(&u->in);
    const int rows = (int)(B * cdp_shape_rows(&u->in)), last = (int)cdp_shape_last(&u->in);
    const float *mean = act + n_in, *rstd = mean + rows;
    K(copy, ws, dout, (size_t)n_in * sizeof *ws);
    if (din) K(layernorm_bwd, din, NULL, NULL, dout, (const float *)in, p[0], mean, rstd, rows, last);
    return CDP_OK;
}

/* W: the weight and bias gradients with din NULL, from that copy */
static cdp_status backward_weight(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                  float *const *g, const void *in, const float *act, const float *tail,
                                  const float *dout, const float *ws, float *scratch_, int B)
{
    (void)tail, (void)dout, (void)scratch_;
    const int64_t n_in = (int64_t)B * cdp_shape_numel(&u->in);
    const int rows = (int)(B * cdp_shape_rows(&u->in)), last = (int)cdp_shape_last(&u->in);
    const float *mean = act + n_in, *rstd = mean + rows;
    K(layernorm_bwd, NULL, g[0], g[1], ws, (const float *)in, p[0], mean, rstd, rows, last);
    return CDP_OK;
}

const struct cdp_layer_def cdp_layer_layernorm = {
    .type = CDP_LAYER_LAYERNORM,
    .name = "layernorm",
    .listable = 1,
    .tensor_ok = 1, /* replicated: whole on every rank of a tensor group */
    .keys = keys,
    .parse = parse,
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
