/* attention: the qkv projection, multi-head scaled dot-product attention
 * (causal by default) and the output projection over [T, C]. Keys: heads
 * (required), causal. Kept: the output, qkv, attention's state, its output. */
#include "model/layers/common.h"

static const char *const keys[] = {"heads", "causal", NULL};

static cdp_status parse(const struct cdp_json_in *in, const json_t *v, const char *ptr, const char *who,
                        struct cdp_layer_desc *L)
{
    cdp_status st = cdp_layer_get_required_int(in, v, ptr, "heads", 1, who, &L->heads);
    return st ? st : cdp_json_get_bool(in, v, ptr, "causal", &L->causal);
}

static int shape(const struct cdp_layer_desc *L, const struct cdp_shape *in, struct cdp_shape *out, char *why,
                 size_t cap)
{
    return cdp_heads_shape("attention", L, in, out, why, cap);
}

/* two projections: 3C x C + 3C, and C x C + C */
static int64_t params(const struct cdp_layer_desc *L, const struct cdp_shape *in)
{
    (void)L;
    const int64_t C = cdp_shape_last(in);
    return cdp_mul_add(cdp_mul_add(C, C, 0), 4, cdp_mul_add(4, C, 0));
}

static int emit(const struct cdp_layer_desc *L, json_t *o)
{
    return json_object_set_new(o, "heads", CDP_JINT(L->heads)) |
           json_object_set_new(o, "causal", json_boolean(L->causal));
}

static void describe(const struct cdp_layer_desc *L, char *buf, size_t cap)
{
    snprintf(buf, cap, " heads %lld%s", (long long)L->heads, L->causal ? ", causal" : "");
}

static void build(struct cdp_unit *u, const struct cdp_model_desc *m)
{
    (void)m;
    const int64_t C = cdp_shape_last(&u->in);
    cdp_unit_add_linear_params(u, "c_attn", 3 * C, C, 1, 0, 0.0f);
    cdp_unit_add_linear_params(u, "c_proj", C, C, 1, 0, 0.0f);
}

static void cost(struct cdp_unit *u)
{
    const int64_t T = u->in.d[0], C = u->in.d[1];
    u->fwd_flops = 8.0 * T * C * C + cdp_attention_flops(T, C, u->desc.causal, 0);
    u->bwd_flops = 16.0 * T * C * C + cdp_attention_flops(T, C, u->desc.causal, 1);
    u->att_floats = u->desc.heads * T * T;
    u->act_floats = 3 * T * C + u->att_floats + T * C + T * C;
    /* W: both projections' dw and db, from copies of their output gradients (dout, dqkv) */
    u->bwd_weight_flops = 8.0 * T * C * C;
    u->wstate_floats = T * C + 3 * T * C;
    /* selective: the attention's output and state, from the kept qkv */
    u->tail_floats = T * C;
    u->tail_flops = cdp_attention_flops(T, C, u->desc.causal, 0);
}

static int64_t scratch(const struct cdp_unit *u, int B)
{
    const int64_t T = u->in.d[0], C = u->in.d[1];
    return (int64_t)B * (3 * T * C + T * C) + T * T;
}

/* Kept: the output, then qkv; the tail: the attention's output (atty), then its state. */
static cdp_status forward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p, const void *in,
                          float *act, float *tail, float *scratch_, int B)
{
    (void)scratch_;
    const int T = (int)u->in.d[0], C = (int)u->in.d[1], N = B * T;
    float *qkv = act + (int64_t)N * C, *atty = tail, *att = atty + (int64_t)N * C;
    K(linear_fwd, qkv, (const float *)in, p[0], p[1], N, C, 3 * C);
    K(attention_fwd, atty, att, qkv, B, T, C, (int)u->desc.heads, u->desc.causal);
    K(linear_fwd, act, atty, p[2], p[3], N, C, C);
    return CDP_OK;
}

static cdp_status recompute(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p, const void *in,
                            float *act, float *tail, float *scratch_, int B)
{
    (void)p, (void)in, (void)scratch_;
    const int T = (int)u->in.d[0], C = (int)u->in.d[1], N = B * T;
    const float *qkv = act + (int64_t)N * C;
    K(attention_fwd, tail, tail + (int64_t)N * C, qkv, B, T, C, (int)u->desc.heads, u->desc.causal);
    return CDP_OK;
}

static cdp_status backward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                           float *const *g, const void *in, const float *act, const float *tail,
                           const float *dout, float *din, float *scratch_, int B)
{
    const int T = (int)u->in.d[0], C = (int)u->in.d[1], N = B * T;
    const float *qkv = act + (int64_t)N * C, *atty = tail, *att = atty + (int64_t)N * C;
    float *datty = scratch_, *dqkv = datty + (int64_t)N * C, *tt = dqkv + 3 * (int64_t)N * C;
    K(zero, datty, (size_t)N * C * sizeof *datty);
    K(linear_bwd, datty, g[2], g[3], dout, atty, p[2], N, C, C);
    K(zero, dqkv, (size_t)3 * N * C * sizeof *dqkv);
    K(attention_bwd, dqkv, datty, qkv, att, tt, B, T, C, (int)u->desc.heads, u->desc.causal);
    K(linear_bwd, din, g[0], g[1], dqkv, (const float *)in, p[0], N, C, 3 * C);
    return CDP_OK;
}

/* The W-state: the output gradient of each projection. */
static void attention_wstate(float *ws, int64_t NC, float **dout, float **dqkv)
{
    *dout = ws;
    *dqkv = ws + NC;
}

/* B: backward's input-gradient calls, the weight outputs NULL, with dqkv in the W-state */
static cdp_status backward_input(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                 const void *in, const float *act, const float *tail, const float *dout,
                                 float *din, float *ws, float *scratch_, int B)
{
    const int T = (int)u->in.d[0], C = (int)u->in.d[1], N = B * T;
    const float *qkv = act + (int64_t)N * C, *atty = tail, *att = atty + (int64_t)N * C;
    float *datty = scratch_, *tt = datty + 4 * (int64_t)N * C, *wdout, *dqkv;
    attention_wstate(ws, (int64_t)N * C, &wdout, &dqkv);
    K(copy, wdout, dout, (size_t)N * C * sizeof *wdout);
    K(zero, datty, (size_t)N * C * sizeof *datty);
    K(linear_bwd, datty, NULL, NULL, dout, atty, p[2], N, C, C);
    K(zero, dqkv, (size_t)3 * N * C * sizeof *dqkv);
    K(attention_bwd, dqkv, datty, qkv, att, tt, B, T, C, (int)u->desc.heads, u->desc.causal);
    if (din) K(linear_bwd, din, NULL, NULL, dqkv, (const float *)in, p[0], N, C, 3 * C);
    return CDP_OK;
}

/* W: both projections' dw and db, din NULL */
static cdp_status backward_weight(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                  float *const *g, const void *in, const float *act, const float *tail,
                                  const float *dout, const float *ws, float *scratch_, int B)
{
    (void)act, (void)dout, (void)scratch_;
    const int T = (int)u->in.d[0], C = (int)u->in.d[1], N = B * T;
    const float *atty = tail;
    float *wdout, *dqkv;
    attention_wstate((float *)ws, (int64_t)N * C, &wdout, &dqkv);
    K(linear_bwd, NULL, g[2], g[3], wdout, atty, p[2], N, C, C);
    K(linear_bwd, NULL, g[0], g[1], dqkv, (const float *)in, p[0], N, C, 3 * C);
    return CDP_OK;
}

const struct cdp_layer_def cdp_layer_attention = {
    .type = CDP_LAYER_ATTENTION,
    .name = "attention",
    .listable = 1,
    .keys = keys,
    .keeps_attention = 1,
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
    .recompute = recompute,
};
