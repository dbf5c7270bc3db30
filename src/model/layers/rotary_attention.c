/* rotary_attention: Llama's self-attention over [T, C]: q, k and v
 * projections without biases (k and v with kv_heads heads: grouped-query
 * attention), rotary position embeddings on q and k, causal scaled
 * dot-product attention over the heads, the o projection. Keys: heads
 * (required), kv_heads (default heads), rope_theta (10000), rope_scaling
 * (none). Kept: the output, the rotated and expanded qkv; the tail: the
 * attention's output, then its state. Split over a tensor group of t
 * (docs/parallelism.md): rank k holds heads [k H/t, (k+1) H/t) of q and kv
 * heads [k KV/t, (k+1) KV/t) of k and v, o row-parallel; one all-reduce of
 * the output forward, one of the input gradient backward (B's under split
 * backward: the rank's part made in scratch, summed there, added into din). */
#include "model/layers/common.h"

static const char *const keys[] = {"heads", "kv_heads", "rope_theta", "rope_scaling", NULL};

static cdp_status parse(const struct cdp_json_in *in, const json_t *v, const char *ptr, const char *who,
                        struct cdp_layer_desc *L)
{
    cdp_status st;
    if ((st = cdp_layer_get_required_int(in, v, ptr, "heads", 1, who, &L->heads))) return st;
    L->kv_heads = L->heads;
    if ((st = cdp_json_get_int(in, v, ptr, "kv_heads", 1, CDP_PLAN_MAX_COUNT, 0, &L->kv_heads))) return st;
    return cdp_rope_parse(in, v, ptr, &L->rope);
}

/* heads and kv heads split */
static int tensor_check(const struct cdp_layer_desc *L, const struct cdp_shape *in, int t, const char **key,
                        int64_t *value)
{
    (void)in;
    *key = L->heads % t ? "heads" : L->kv_heads % t ? "kv_heads" : NULL;
    *value = L->heads % t ? L->heads : L->kv_heads;
    return *key ? -1 : 0;
}

static int shape(const struct cdp_layer_desc *L, const struct cdp_shape *in, struct cdp_shape *out, char *why,
                 size_t cap)
{
    return cdp_rotary_shape("rotary_attention", L, in, out, why, cap);
}

/* q and o: C x C each; k and v: KVD x C each */
static int64_t params(const struct cdp_layer_desc *L, const struct cdp_shape *in)
{
    const int64_t C = cdp_shape_last(in), KVD = C / L->heads * L->kv_heads;
    return cdp_mul_add(cdp_mul_add(C, C, 0), 2, cdp_mul_add(cdp_mul_add(C, KVD, 0), 2, 0));
}

static int emit(const struct cdp_layer_desc *L, json_t *o)
{
    return json_object_set_new(o, "heads", CDP_JINT(L->heads)) |
           json_object_set_new(o, "kv_heads", CDP_JINT(L->kv_heads)) | cdp_rope_emit(&L->rope, o);
}

static void describe(const struct cdp_layer_desc *L, char *buf, size_t cap)
{
    char r[96];
    cdp_rope_describe(&L->rope, r, sizeof r);
    snprintf(buf, cap, " heads %lld, kv_heads %lld,%s", (long long)L->heads, (long long)L->kv_heads, r);
}

static void build(struct cdp_unit *u, const struct cdp_model_desc *m)
{
    (void)m;
    const int64_t C = cdp_shape_last(&u->in), KVD = C / u->desc.heads * u->desc.kv_heads;
    cdp_unit_add_linear_params(u, "q_proj", C, C, 0, 0, 0.0f);
    cdp_unit_add_linear_params(u, "k_proj", KVD, C, 0, 0, 0.0f);
    cdp_unit_add_linear_params(u, "v_proj", KVD, C, 0, 0, 0.0f);
    cdp_unit_add_linear_params(u, "o_proj", C, C, 0, 0, 0.0f);
    if (!cdp_unit_tensor_split(u)) return;
    for (int i = 0; i < 3; i++) cdp_param_shard(u, i, 0, u->tp_size, u->tp_index);
    cdp_param_shard(u, 3, 1, u->tp_size, u->tp_index);
}

static void cost(struct cdp_unit *u)
{
    const struct cdp_rotary_dims d = cdp_rotary_dims(u, 1);
    const int64_t T = d.T, C = d.C, A = d.A, KVD = d.KVD;
    const double gemm = 2.0 * T * (2.0 * C * A + 2.0 * C * KVD);
    u->fwd_flops = gemm + cdp_attention_flops(T, A, 1, 0);
    u->bwd_flops = 2.0 * gemm + cdp_attention_flops(T, A, 1, 1);
    u->att_floats = (int64_t)d.NH * T * T;
    u->act_floats = T * C + 3 * T * A + T * A + u->att_floats;
    /* W: the four projections' dw, from copies of their output gradients (dout, dq, dk, dv) */
    u->bwd_weight_flops = gemm;
    u->wstate_floats = T * (C + A + 2 * KVD);
    /* selective: the attention's output and state, from the kept qkv */
    u->tail_floats = T * A;
    u->tail_flops = cdp_attention_flops(T, A, 1, 0);
}

/* forward: q, k, v; backward: datty, dqkv, dq, dk, dv, T x T, and split
 * over a group the rank's part of the input gradient [N, C] (input_grad's) */
static int64_t scratch(const struct cdp_unit *u, int B)
{
    const struct cdp_rotary_dims d = cdp_rotary_dims(u, B);
    const int64_t s = (int64_t)d.N * (5 * d.A + 2 * d.KVD) + (int64_t)d.T * d.T;
    return cdp_unit_tensor_split(u) ? s + (int64_t)d.N * d.C : s;
}

static cdp_status forward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p, const void *in,
                          float *act, float *tail, float *scratch_, int B)
{
    const struct cdp_rotary_dims d = cdp_rotary_dims(u, B);
    const float *x = (const float *)in;
    float *qkv = act + (size_t)d.N * d.C, *atty = tail, *att = atty + (size_t)d.N * d.A;
    float *q = scratch_, *kk = q + (size_t)d.N * d.A, *v = kk + (size_t)d.N * d.KVD;
    K(linear_fwd, q, x, p[0], NULL, d.N, d.C, d.A);
    K(linear_fwd, kk, x, p[1], NULL, d.N, d.C, d.KVD);
    K(linear_fwd, v, x, p[2], NULL, d.N, d.C, d.KVD);
    K(rope_fwd, qkv, q, kk, v, B, d.T, d.NH, d.NKV, d.HD, 0, u->desc.rope);
    K(attention_fwd, atty, att, qkv, B, d.T, d.A, d.NH, 1);
    K(linear_fwd, act, atty, p[3], NULL, d.N, d.A, d.C);
    return cdp_unit_tensor_sum(u, act, (int64_t)d.N * d.C);
}

static cdp_status recompute(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p, const void *in,
                            float *act, float *tail, float *scratch_, int B)
{
    (void)p, (void)in, (void)scratch_;
    const struct cdp_rotary_dims d = cdp_rotary_dims(u, B);
    const float *qkv = act + (size_t)d.N * d.C;
    K(attention_fwd, tail, tail + (size_t)d.N * d.A, qkv, B, d.T, d.A, d.NH, 1);
    return CDP_OK;
}

/* backward's buffers in scratch, and the W-state's (dout, dq, dk, dv) */
struct grads {
    float *datty, *dqkv, *dq, *dk, *dv, *tt, *part;
};

static struct grads grads_layout(float *s, const struct cdp_rotary_dims *d)
{
    struct grads g;
    const size_t NA = (size_t)d->N * d->A, NK = (size_t)d->N * d->KVD;
    g.datty = s;
    g.dqkv = g.datty + NA;
    g.dq = g.dqkv + 3 * NA;
    g.dk = g.dq + NA;
    g.dv = g.dk + NK;
    g.tt = g.dv + NK;
    g.part = g.tt + (size_t)d->T * d->T;
    return g;
}

/* The common part of backward and B: dq, dk, dv (zeroed, then accumulated)
 * from dout through o, the attention and the rotation; o's dw into go (NULL: not). */
static cdp_status to_qkv(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p, float *go,
                         const float *act, const float *tail, const float *dout, struct grads *s, float *dq,
                         float *dk, float *dv, int B)
{
    const struct cdp_rotary_dims d = cdp_rotary_dims(u, B);
    const size_t NC = (size_t)d.N * d.C, NA = (size_t)d.N * d.A, NK = (size_t)d.N * d.KVD;
    const float *qkv = act + NC, *atty = tail, *att = atty + NA;
    K(zero, s->datty, NA * sizeof *s->datty);
    K(linear_bwd, s->datty, go, NULL, dout, atty, p[3], d.N, d.A, d.C);
    K(zero, s->dqkv, 3 * NA * sizeof *s->dqkv);
    K(attention_bwd, s->dqkv, s->datty, qkv, att, s->tt, B, d.T, d.A, d.NH, 1);
    K(zero, dq, NA * sizeof *dq);
    K(zero, dk, NK * sizeof *dk);
    K(zero, dv, NK * sizeof *dv);
    K(rope_bwd, dq, dk, dv, s->dqkv, B, d.T, d.NH, d.NKV, d.HD, 0, u->desc.rope);
    return CDP_OK;
}

/* din += the q, k and v projections' input gradients, their dw into gw[0..2]
 * (gw NULL: not). Split over a group, the sum is the rank's heads' part:
 * made in part (scratch, zeroed), summed over the group there, then added,
 * so that din keeps what it held (it receives +=, model.h). */
static cdp_status input_grad(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                             float *const *gw, const float *x, const float *dq, const float *dk, const float *dv,
                             float *din, float *part, const struct cdp_rotary_dims *d)
{
    const int split = din && cdp_unit_tensor_split(u);
    float *to = split ? part : din;
    if (split) K(zero, part, (size_t)d->N * d->C * sizeof *part);
    K(linear_bwd, to, gw ? gw[0] : NULL, NULL, dq, x, p[0], d->N, d->C, d->A);
    K(linear_bwd, to, gw ? gw[1] : NULL, NULL, dk, x, p[1], d->N, d->C, d->KVD);
    K(linear_bwd, to, gw ? gw[2] : NULL, NULL, dv, x, p[2], d->N, d->C, d->KVD);
    return split ? cdp_unit_tensor_add_sum(k, u, part, din, (int64_t)d->N * d->C) : CDP_OK;
}

static cdp_status backward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                           float *const *g, const void *in, const float *act, const float *tail,
                           const float *dout, float *din, float *scratch_, int B)
{
    const struct cdp_rotary_dims d = cdp_rotary_dims(u, B);
    struct grads s = grads_layout(scratch_, &d);
    cdp_status st = to_qkv(k, u, p, g[3], act, tail, dout, &s, s.dq, s.dk, s.dv, B);
    if (st) return st;
    return input_grad(k, u, p, g, (const float *)in, s.dq, s.dk, s.dv, din, s.part, &d);
}

static void rot_wstate(float *ws, const struct cdp_rotary_dims *d, float **dout, float **dq, float **dk, float **dv)
{
    *dout = ws;
    *dq = ws + (size_t)d->N * d->C;
    *dk = *dq + (size_t)d->N * d->A;
    *dv = *dk + (size_t)d->N * d->KVD;
}

/* B: backward's input-gradient calls, the weight outputs NULL, with the
 * projections' output gradients in the W-state */
static cdp_status backward_input(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                 const void *in, const float *act, const float *tail, const float *dout,
                                 float *din, float *ws, float *scratch_, int B)
{
    const struct cdp_rotary_dims d = cdp_rotary_dims(u, B);
    const float *x = (const float *)in;
    struct grads s = grads_layout(scratch_, &d);
    float *wdout, *dq, *dk, *dv;
    rot_wstate(ws, &d, &wdout, &dq, &dk, &dv);
    K(copy, wdout, dout, (size_t)d.N * d.C * sizeof *wdout);
    cdp_status st = to_qkv(k, u, p, NULL, act, tail, dout, &s, dq, dk, dv, B);
    if (st) return st;
    return din ? input_grad(k, u, p, NULL, x, dq, dk, dv, din, s.part, &d) : CDP_OK;
}

/* W: the four projections' dw, din NULL */
static cdp_status backward_weight(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                  float *const *g, const void *in, const float *act, const float *tail,
                                  const float *dout, const float *ws, float *scratch_, int B)
{
    (void)act, (void)dout, (void)scratch_;
    const struct cdp_rotary_dims d = cdp_rotary_dims(u, B);
    const float *x = (const float *)in;
    float *wdout, *dq, *dk, *dv;
    rot_wstate((float *)ws, &d, &wdout, &dq, &dk, &dv);
    K(linear_bwd, NULL, g[3], NULL, wdout, tail, p[3], d.N, d.A, d.C);
    K(linear_bwd, NULL, g[0], NULL, dq, x, p[0], d.N, d.C, d.A);
    K(linear_bwd, NULL, g[1], NULL, dk, x, p[1], d.N, d.C, d.KVD);
    K(linear_bwd, NULL, g[2], NULL, dv, x, p[2], d.N, d.C, d.KVD);
    return CDP_OK;
}

const struct cdp_layer_def cdp_layer_rotary_attention = {
    .type = CDP_LAYER_ROTARY_ATTENTION,
    .name = "rotary_attention",
    .listable = 1,
    .tensor_ok = 1,
    .tensor_splits = 1,
    .tensor_check = tensor_check,
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
