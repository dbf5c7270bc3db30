/* attention: the qkv projection, multi-head scaled dot-product attention
 * (causal by default) and the output projection over [T, C]. Keys: heads
 * (required), causal. Kept: the output, qkv, attention's state, its output.
 * Split over a tensor group of t (docs/parallelism.md), as a
 * transformer_block's attention: rank k holds heads [k H/t, (k+1) H/t) of Q,
 * K and V (three row ranges of the fused c_attn, and of its bias) and runs
 * attention on them; c_proj is row-parallel, its bias whole and added once
 * (by index 0); one all-reduce of the output forward, one of the input
 * gradient backward (B's under split backward: W has none). */
#include "model/layers/common.h"

static const char *const keys[] = {"heads", "causal", NULL};

static cdp_status parse(const struct cdp_json_in *in, const json_t *v, const char *ptr, const char *who,
                        struct cdp_layer_desc *L)
{
    cdp_status st = cdp_layer_get_required_int(in, v, ptr, "heads", 1, who, &L->heads);
    return st ? st : cdp_json_get_bool(in, v, ptr, "causal", &L->causal);
}

/* heads split (C is a multiple of heads, so the width does too) */
static int tensor_check(const struct cdp_layer_desc *L, const struct cdp_shape *in, int t, const char **key,
                        int64_t *value)
{
    (void)in;
    if (L->heads % t == 0) return 0;
    *key = "heads";
    *value = L->heads;
    return -1;
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
    if (!cdp_unit_tensor_split(u)) return;
    const int t = u->tp_size, k = u->tp_index;
    cdp_param_shard_parts(u, 0, 0, 3, t, k); /* q, k and v rows of this rank's heads */
    cdp_param_shard_parts(u, 1, 0, 3, t, k);
    cdp_param_shard(u, 2, 1, t, k); /* row-parallel: the bias (3) whole */
}

/* Sizes on the rank: C the input's and output's width (whole), A the
 * attention's width and NH its heads (the rank's slice; A = C at t = 1). */
struct dims {
    int T, C, A, NH, N;
};

static struct dims dims_of(const struct cdp_unit *u, int B)
{
    const int t = cdp_unit_tensor_split(u) ? u->tp_size : 1;
    struct dims d;
    d.T = (int)u->in.d[0];
    d.C = (int)u->in.d[1];
    d.A = d.C / t;
    d.NH = (int)u->desc.heads / t;
    d.N = B * d.T;
    return d;
}

/* Per sample, on the rank: the products 2 T C (3A + A), attention on A; kept
 * the output C (whole) and qkv 3A, the tail A and the state NH T T. */
static void cost(struct cdp_unit *u)
{
    const struct dims d = dims_of(u, 1);
    const int64_t T = d.T, C = d.C, A = d.A;
    u->fwd_flops = 8.0 * T * C * A + cdp_attention_flops(T, A, u->desc.causal, 0);
    u->bwd_flops = 16.0 * T * C * A + cdp_attention_flops(T, A, u->desc.causal, 1);
    u->att_floats = (int64_t)d.NH * T * T;
    u->act_floats = 3 * T * A + u->att_floats + T * A + T * C;
    /* W: both projections' dw and db, from copies of their output gradients (dout C, dqkv 3A) */
    u->bwd_weight_flops = 8.0 * T * C * A;
    u->wstate_floats = T * C + 3 * T * A;
    /* selective: the attention's output and state, from the kept qkv */
    u->tail_floats = T * A;
    u->tail_flops = cdp_attention_flops(T, A, u->desc.causal, 0);
}

/* backward: datty [N, A], dqkv [N, 3A], attention's T x T, and split over
 * a group the rank's part of the input gradient [N, C] (input_grad's part) */
static int64_t scratch(const struct cdp_unit *u, int B)
{
    const struct dims d = dims_of(u, B);
    const int64_t s = (int64_t)d.N * 4 * d.A + (int64_t)d.T * d.T;
    return cdp_unit_tensor_split(u) ? s + (int64_t)d.N * d.C : s;
}

/* din += dqkv's product with c_attn (linear_bwd's input gradient). Split over
 * a group, c_attn is column-parallel and the product the rank's heads' part:
 * made in part (scratch, zeroed), summed over the group there, then added,
 * so that din keeps what it held (it receives +=, model.h). */
static cdp_status input_grad(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p, float *gw,
                             float *gb, const float *dqkv, const void *in, float *din, float *part,
                             const struct dims *d)
{
    const int N = d->N, C = d->C, A = d->A;
    if (!din || !cdp_unit_tensor_split(u)) {
        K(linear_bwd, din, gw, gb, dqkv, (const float *)in, p[0], N, C, 3 * A);
        return CDP_OK;
    }
    K(zero, part, (size_t)N * C * sizeof *part);
    K(linear_bwd, part, gw, gb, dqkv, (const float *)in, p[0], N, C, 3 * A);
    return cdp_unit_tensor_add_sum(k, u, part, din, (int64_t)N * C);
}

/* Kept: the output, then qkv; the tail: the attention's output (atty), then its state. */
static cdp_status forward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p, const void *in,
                          float *act, float *tail, float *scratch_, int B)
{
    (void)scratch_;
    const struct dims d = dims_of(u, B);
    const int N = d.N, C = d.C, A = d.A;
    float *qkv = act + (int64_t)N * C, *atty = tail, *att = atty + (int64_t)N * A;
    /* a row-parallel product's bias is added once, by the group's index 0 */
    const int bias_here = u->tp_index == 0 || !cdp_unit_tensor_split(u);
    K(linear_fwd, qkv, (const float *)in, p[0], p[1], N, C, 3 * A);
    K(attention_fwd, atty, att, qkv, B, d.T, A, d.NH, u->desc.causal);
    K(linear_fwd, act, atty, p[2], bias_here ? p[3] : NULL, N, A, C);
    return cdp_unit_tensor_sum(u, act, (int64_t)N * C);
}

/* The tail from the kept qkv: the rank's heads only, no collective. */
static cdp_status recompute(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p, const void *in,
                            float *act, float *tail, float *scratch_, int B)
{
    (void)p, (void)in, (void)scratch_;
    const struct dims d = dims_of(u, B);
    const float *qkv = act + (int64_t)d.N * d.C;
    K(attention_fwd, tail, tail + (int64_t)d.N * d.A, qkv, B, d.T, d.A, d.NH, u->desc.causal);
    return CDP_OK;
}

/* din gets the sum over the group of the rank's heads' parts (input_grad);
 * c_proj's bias gradient is from the whole dout, the same on every rank. */
static cdp_status backward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                           float *const *g, const void *in, const float *act, const float *tail,
                           const float *dout, float *din, float *scratch_, int B)
{
    const struct dims d = dims_of(u, B);
    const int N = d.N, C = d.C, A = d.A;
    const float *qkv = act + (int64_t)N * C, *atty = tail, *att = atty + (int64_t)N * A;
    float *datty = scratch_, *dqkv = datty + (int64_t)N * A, *tt = dqkv + 3 * (int64_t)N * A;
    K(zero, datty, (size_t)N * A * sizeof *datty);
    K(linear_bwd, datty, g[2], g[3], dout, atty, p[2], N, A, C);
    K(zero, dqkv, (size_t)3 * N * A * sizeof *dqkv);
    K(attention_bwd, dqkv, datty, qkv, att, tt, B, d.T, A, d.NH, u->desc.causal);
    return input_grad(k, u, p, g[0], g[1], dqkv, in, din, tt + (int64_t)d.T * d.T, &d);
}

/* The W-state: the output gradient of each projection (dout [N, C], dqkv [N, 3A]). */
static void attention_wstate(float *ws, int64_t NC, float **dout, float **dqkv)
{
    *dout = ws;
    *dqkv = ws + NC;
}

/* B: backward's input-gradient calls, the weight outputs NULL, with dqkv in
 * the W-state; the group's all-reduce of din is here */
static cdp_status backward_input(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                 const void *in, const float *act, const float *tail, const float *dout,
                                 float *din, float *ws, float *scratch_, int B)
{
    const struct dims d = dims_of(u, B);
    const int N = d.N, C = d.C, A = d.A;
    const float *qkv = act + (int64_t)N * C, *atty = tail, *att = atty + (int64_t)N * A;
    float *datty = scratch_, *tt = datty + 4 * (int64_t)N * A, *wdout, *dqkv;
    attention_wstate(ws, (int64_t)N * C, &wdout, &dqkv);
    K(copy, wdout, dout, (size_t)N * C * sizeof *wdout);
    K(zero, datty, (size_t)N * A * sizeof *datty);
    K(linear_bwd, datty, NULL, NULL, dout, atty, p[2], N, A, C);
    K(zero, dqkv, (size_t)3 * N * A * sizeof *dqkv);
    K(attention_bwd, dqkv, datty, qkv, att, tt, B, d.T, A, d.NH, u->desc.causal);
    if (!din) return CDP_OK;
    return input_grad(k, u, p, NULL, NULL, dqkv, in, din, tt + (int64_t)d.T * d.T, &d);
}

/* W: both projections' dw and db, din NULL; no collective */
static cdp_status backward_weight(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                  float *const *g, const void *in, const float *act, const float *tail,
                                  const float *dout, const float *ws, float *scratch_, int B)
{
    (void)act, (void)dout, (void)scratch_;
    const struct dims d = dims_of(u, B);
    const int N = d.N, C = d.C, A = d.A;
    const float *atty = tail;
    float *wdout, *dqkv;
    attention_wstate((float *)ws, (int64_t)N * C, &wdout, &dqkv);
    K(linear_bwd, NULL, g[2], g[3], wdout, atty, p[2], N, A, C);
    K(linear_bwd, NULL, g[0], g[1], dqkv, (const float *)in, p[0], N, C, 3 * A);
    return CDP_OK;
}

const struct cdp_layer_def cdp_layer_attention = {
    .type = CDP_LAYER_ATTENTION,
    .name = "attention",
    .listable = 1,
    .keys = keys,
    .keeps_attention = 1,
    .tensor_ok = 1,
    .tensor_splits = 1,
    .tensor_check = tensor_check,
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
