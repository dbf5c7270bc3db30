/* transformer_block: a GPT-2 pre-LN block over [T, C] (layernorm, causal
 * self-attention, residual, layernorm, 4C GELU MLP, residual). Keys: heads
 * (required). GPT presets start its residual projections at 0.02/sqrt(2L). */
#include <math.h>
#include <string.h>

#include "kernels/cpu/ops.h" /* the decoder's CPU kernels */
#include "model/layers/common.h"

static const char *const keys[] = {"heads", NULL};

static cdp_status parse(const struct cdp_json_in *in, const json_t *v, const char *ptr, const char *who,
                        struct cdp_layer_desc *L)
{
    return cdp_layer_get_required_int(in, v, ptr, "heads", 1, who, &L->heads);
}

static int shape(const struct cdp_layer_desc *L, const struct cdp_shape *in, struct cdp_shape *out, char *why,
                 size_t cap)
{
    return cdp_heads_shape("transformer_block", L, in, out, why, cap);
}

/* 12 C^2 + 13 C: qkv and output projections, the MLP, two layernorms */
static int64_t params(const struct cdp_layer_desc *L, const struct cdp_shape *in)
{
    (void)L;
    const int64_t C = cdp_shape_last(in);
    return cdp_mul_add(cdp_mul_add(C, C, 0), 12, cdp_mul_add(13, C, 0));
}

static int emit(const struct cdp_layer_desc *L, json_t *o)
{
    return json_object_set_new(o, "heads", CDP_JINT(L->heads));
}

static void describe(const struct cdp_layer_desc *L, char *buf, size_t cap)
{
    snprintf(buf, cap, " heads %lld", (long long)L->heads);
}

static void build(struct cdp_unit *u, const struct cdp_model_desc *m)
{
    const int64_t C = cdp_shape_last(&u->in);
    const float proj_std = m->kind == CDP_MODEL_GPT ? 0.02f / sqrtf(2.0f * (float)m->layers) : 0.02f;
    cdp_unit_add_norm_params(u, "ln_1", C);
    cdp_unit_add_linear_params(u, "attn.c_attn", 3 * C, C, 1, 1, 0.02f);
    cdp_unit_add_linear_params(u, "attn.c_proj", C, C, 1, 1, proj_std);
    cdp_unit_add_norm_params(u, "ln_2", C);
    cdp_unit_add_linear_params(u, "mlp.c_fc", 4 * C, C, 1, 1, 0.02f);
    cdp_unit_add_linear_params(u, "mlp.c_proj", C, 4 * C, 1, 1, proj_std);
}

static void cost(struct cdp_unit *u)
{
    const int64_t T = u->in.d[0], C = u->in.d[1];
    u->fwd_flops = 24.0 * T * C * C + cdp_attention_flops(T, C, 1, 0);
    u->bwd_flops = 48.0 * T * C * C + cdp_attention_flops(T, C, 1, 1);
    u->att_floats = u->desc.heads * T * T;
    u->act_floats = 16 * T * C + 4 * T + u->att_floats;
    /* W: the four projections' dw and db and the two norms', from the output gradients of each
     * (block_wstate): dout C, dfch 4C, dln2 C, dres2 C, dqkv 3C, dln1 C */
    u->bwd_weight_flops = 24.0 * T * C * C;
    u->wstate_floats = 11 * T * C;
    /* selective: both layernorms' outputs, the attention's output and state,
     * the GELU's output (block_layout) */
    u->tail_floats = 7 * T * C;
    u->tail_flops = cdp_attention_flops(T, C, 1, 0);
}

/* forward: one C-wide projection; backward: dres2, dg, dfch, dln, dqkv, T x T */
static int64_t scratch(const struct cdp_unit *u, int B)
{
    const int64_t T = u->in.d[0], C = u->in.d[1];
    return (int64_t)B * 13 * T * C + T * T;
}

/* A transformer block's activations, per micro-batch of B. Kept (at act): what
 * is costly to compute again, the projections' outputs and the norms'
 * statistics; the tail (at tail), which selective recomputation drops: the
 * norms' outputs, the attention's output and state, the GELU's output. */
struct block_acts {
    float *out, *ln1_mean, *ln1_rstd, *qkv, *res2, *ln2_mean, *ln2_rstd, *fch; /* kept */
    float *ln1, *atty, *ln2, *fch_gelu, *att;                                   /* tail */
};

static struct block_acts block_layout(float *a, float *t, int B, int64_t T, int64_t C)
{
    struct block_acts r;
    const int64_t BT = (int64_t)B * T, BTC = BT * C;
    r.out = a;
    a += BTC;
    r.ln1_mean = a;
    a += BT;
    r.ln1_rstd = a;
    a += BT;
    r.qkv = a;
    a += 3 * BTC;
    r.res2 = a;
    a += BTC;
    r.ln2_mean = a;
    a += BT;
    r.ln2_rstd = a;
    a += BT;
    r.fch = a;
    r.ln1 = t;
    t += BTC;
    r.atty = t;
    t += BTC;
    r.ln2 = t;
    t += BTC;
    r.fch_gelu = t;
    t += 4 * BTC;
    r.att = t;
    return r;
}

static cdp_status forward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p, const void *in,
                          float *act, float *tail, float *scratch, int B)
{
    const float *x = (const float *)in;
    const int T = (int)u->in.d[0], C = (int)u->in.d[1], NH = (int)u->desc.heads, N = B * T;
    const size_t BTC = (size_t)N * C;
    struct block_acts a = block_layout(act, tail, B, T, C);
    float *proj = scratch; /* B*T*C */
    K(layernorm_fwd, a.ln1, a.ln1_mean, a.ln1_rstd, x, p[0], p[1], N, C, 1e-5f);
    K(linear_fwd, a.qkv, a.ln1, p[2], p[3], N, C, 3 * C);
    K(attention_fwd, a.atty, a.att, a.qkv, B, T, C, NH, 1);
    K(linear_fwd, proj, a.atty, p[4], p[5], N, C, C);
    K(residual_fwd, a.res2, x, proj, BTC);
    K(layernorm_fwd, a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p[6], p[7], N, C, 1e-5f);
    K(linear_fwd, a.fch, a.ln2, p[8], p[9], N, C, 4 * C);
    K(gelu_fwd, a.fch_gelu, a.fch, 4 * BTC);
    K(linear_fwd, proj, a.fch_gelu, p[10], p[11], N, 4 * C, C);
    K(residual_fwd, a.out, a.res2, proj, BTC);
    return CDP_OK;
}

/* The tail again: the kernels of the forward that wrote it, on the same inputs
 * (the norms write their statistics again, the same values). */
static cdp_status recompute(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p, const void *in,
                            float *act, float *tail, float *scratch, int B)
{
    (void)scratch;
    const float *x = (const float *)in;
    const int T = (int)u->in.d[0], C = (int)u->in.d[1], NH = (int)u->desc.heads, N = B * T;
    struct block_acts a = block_layout(act, tail, B, T, C);
    K(layernorm_fwd, a.ln1, a.ln1_mean, a.ln1_rstd, x, p[0], p[1], N, C, 1e-5f);
    K(attention_fwd, a.atty, a.att, a.qkv, B, T, C, NH, 1);
    K(layernorm_fwd, a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p[6], p[7], N, C, 1e-5f);
    K(gelu_fwd, a.fch_gelu, a.fch, 4 * (size_t)N * C);
    return CDP_OK;
}

static cdp_status backward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                           float *const *g, const void *in, const float *act, const float *tail,
                           const float *dout, float *din, float *scratch, int B)
{
    const float *x = (const float *)in;
    const int T = (int)u->in.d[0], C = (int)u->in.d[1], NH = (int)u->desc.heads, N = B * T;
    const size_t BTC = (size_t)N * C;
    struct block_acts a = block_layout((float *)act, (float *)tail, B, T, C);
    float *dres2 = scratch, *dg = dres2 + BTC, *dfch = dg + 4 * BTC, *dln = dfch + 4 * BTC,
          *dqkv = dln + BTC, *att_scratch = dqkv + 3 * BTC;
    K(copy, dres2, dout, BTC * sizeof *dres2);
    if (k->ops->linear_gelu_bwd) { /* dfch overwritten, through the GELU */
        K(linear_gelu_bwd, dfch, g[10], g[11], dout, a.fch_gelu, a.fch, p[10], N, 4 * C, C);
    } else {
        K(zero, dg, 4 * BTC * sizeof *dg);
        K(linear_bwd, dg, g[10], g[11], dout, a.fch_gelu, p[10], N, 4 * C, C);
        K(zero, dfch, 4 * BTC * sizeof *dfch);
        K(gelu_bwd, dfch, dg, a.fch, 4 * BTC);
    }
    K(zero, dln, BTC * sizeof *dln);
    K(linear_bwd, dln, g[8], g[9], dfch, a.ln2, p[8], N, C, 4 * C);
    K(layernorm_bwd, dres2, g[6], g[7], dln, a.res2, p[6], a.ln2_mean, a.ln2_rstd, N, C);
    K(zero, dln, BTC * sizeof *dln);
    K(linear_bwd, dln, g[4], g[5], dres2, a.atty, p[4], N, C, C);
    K(zero, dqkv, 3 * BTC * sizeof *dqkv);
    K(attention_bwd, dqkv, dln, a.qkv, a.att, att_scratch, B, T, C, NH, 1);
    K(zero, dln, BTC * sizeof *dln);
    K(linear_bwd, dln, g[2], g[3], dqkv, a.ln1, p[2], N, C, 3 * C);
    if (din) {
        K(add, din, dres2, BTC);
        K(layernorm_bwd, din, g[0], g[1], dln, x, p[0], a.ln1_mean, a.ln1_rstd, N, C);
    } else {
        /* no input gradient wanted: still accumulate the norm's parameter gradients */
        float *sink = dg;
        K(zero, sink, BTC * sizeof *sink);
        K(layernorm_bwd, sink, g[0], g[1], dln, x, p[0], a.ln1_mean, a.ln1_rstd, N, C);
    }
    return CDP_OK;
}

/* Split backward's W-state, per micro-batch of B (11 T C a sample): the
 * output gradient of each product and norm, as backward computes it. */
struct block_wstate {
    float *dout;  /* the block's: mlp.c_proj's */
    float *dfch;  /* mlp.c_fc's (through the GELU) */
    float *dln2;  /* ln_2's */
    float *dres2; /* attn.c_proj's: the residual stream's after ln_2 */
    float *dqkv;  /* attn.c_attn's */
    float *dln1;  /* ln_1's */
};

static struct block_wstate block_wstate(float *w, int B, int64_t T, int64_t C)
{
    const int64_t BTC = (int64_t)B * T * C;
    struct block_wstate r;
    r.dout = w;
    r.dfch = r.dout + BTC;
    r.dln2 = r.dfch + 4 * BTC;
    r.dres2 = r.dln2 + BTC;
    r.dqkv = r.dres2 + BTC;
    r.dln1 = r.dqkv + 3 * BTC;
    return r;
}

/* B: backward's input-gradient calls in its order, the weight outputs NULL,
 * with the gradients W reads written in the W-state rather than scratch. */
static cdp_status backward_input(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                 const void *in, const float *act, const float *tail, const float *dout,
                                 float *din, float *ws, float *scratch, int B)
{
    const float *x = (const float *)in;
    const int T = (int)u->in.d[0], C = (int)u->in.d[1], NH = (int)u->desc.heads, N = B * T;
    const size_t BTC = (size_t)N * C;
    struct block_acts a = block_layout((float *)act, (float *)tail, B, T, C);
    struct block_wstate w = block_wstate(ws, B, T, C);
    /* scratch as backward lays it out; dres2, dfch and dqkv unused */
    float *dg = scratch + BTC, *dln = dg + 8 * BTC, *att_scratch = dln + 4 * BTC;
    K(copy, w.dout, dout, BTC * sizeof *w.dout);
    K(copy, w.dres2, dout, BTC * sizeof *w.dres2);
    if (k->ops->linear_gelu_bwd) {
        K(linear_gelu_bwd, w.dfch, NULL, NULL, dout, a.fch_gelu, a.fch, p[10], N, 4 * C, C);
    } else {
        K(zero, dg, 4 * BTC * sizeof *dg);
        K(linear_bwd, dg, NULL, NULL, dout, a.fch_gelu, p[10], N, 4 * C, C);
        K(zero, w.dfch, 4 * BTC * sizeof *w.dfch);
        K(gelu_bwd, w.dfch, dg, a.fch, 4 * BTC);
    }
    K(zero, w.dln2, BTC * sizeof *w.dln2);
    K(linear_bwd, w.dln2, NULL, NULL, w.dfch, a.ln2, p[8], N, C, 4 * C);
    K(layernorm_bwd, w.dres2, NULL, NULL, w.dln2, a.res2, p[6], a.ln2_mean, a.ln2_rstd, N, C);
    K(zero, dln, BTC * sizeof *dln);
    K(linear_bwd, dln, NULL, NULL, w.dres2, a.atty, p[4], N, C, C);
    K(zero, w.dqkv, 3 * BTC * sizeof *w.dqkv);
    K(attention_bwd, w.dqkv, dln, a.qkv, a.att, att_scratch, B, T, C, NH, 1);
    K(zero, w.dln1, BTC * sizeof *w.dln1);
    K(linear_bwd, w.dln1, NULL, NULL, w.dqkv, a.ln1, p[2], N, C, 3 * C);
    if (din) {
        K(add, din, w.dres2, BTC);
        K(layernorm_bwd, din, NULL, NULL, w.dln1, x, p[0], a.ln1_mean, a.ln1_rstd, N, C);
    }
    return CDP_OK;
}

/* W: each parameter's call of backward, din NULL, from the W-state (the fused
 * linear_gelu_bwd's dw and db are linear_bwd's: kernels/ops.h). */
static cdp_status backward_weight(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                  float *const *g, const void *in, const float *act, const float *tail,
                                  const float *dout, const float *ws, float *scratch, int B)
{
    (void)dout, (void)scratch;
    const float *x = (const float *)in;
    const int T = (int)u->in.d[0], C = (int)u->in.d[1], N = B * T;
    struct block_acts a = block_layout((float *)act, (float *)tail, B, T, C);
    struct block_wstate w = block_wstate((float *)ws, B, T, C);
    K(linear_bwd, NULL, g[10], g[11], w.dout, a.fch_gelu, p[10], N, 4 * C, C);
    K(linear_bwd, NULL, g[8], g[9], w.dfch, a.ln2, p[8], N, C, 4 * C);
    K(layernorm_bwd, NULL, g[6], g[7], w.dln2, a.res2, p[6], a.ln2_mean, a.ln2_rstd, N, C);
    K(linear_bwd, NULL, g[4], g[5], w.dres2, a.atty, p[4], N, C, C);
    K(linear_bwd, NULL, g[2], g[3], w.dqkv, a.ln1, p[2], N, C, 3 * C);
    K(layernorm_bwd, NULL, g[0], g[1], w.dln1, x, p[0], a.ln1_mean, a.ln1_rstd, N, C);
    return CDP_OK;
}

/* Decoding: keys and values of every position, [context, C] each; the MLP's
 * rows are 4C wide. Parameters as build() lays them: ln_1, attn.c_attn,
 * attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj. */
static cdp_status decode_size(const struct cdp_unit *u, int64_t context, int64_t *cache, int64_t *row,
                              int64_t *logits)
{
    const int64_t C = cdp_shape_last(&u->in);
    *cache = 2 * context * C;
    *row = 4 * C;
    *logits = 0;
    return CDP_OK;
}

static cdp_status decode(const struct cdp_unit *u, float *const *p, const struct cdp_decode *d, float *cache)
{
    const int64_t C = d->C, n = d->n;
    float *kc = cache, *vc = cache + d->context * C;
    cdp_cpu_layernorm_fwd(d->ln, d->mean, d->rstd, d->x, p[0], p[1], (int)n, (int)C, 1e-5f);
    cdp_decode_linear(d->qkv, d->ln, p[2], p[3], n, C, 3 * C, 0);
    for (int64_t r = 0; r < n; r++) {
        memcpy(kc + (d->pos + r) * C, d->qkv + r * 3 * C + C, (size_t)C * sizeof(float));
        memcpy(vc + (d->pos + r) * C, d->qkv + r * 3 * C + 2 * C, (size_t)C * sizeof(float));
    }
    cdp_decode_attend(d, kc, vc, u->desc.heads, u->desc.heads, d->qkv, 3 * C, d->att);
    cdp_decode_linear(d->x, d->att, p[4], p[5], n, C, C, 1);
    cdp_cpu_layernorm_fwd(d->ln, d->mean, d->rstd, d->x, p[6], p[7], (int)n, (int)C, 1e-5f);
    cdp_decode_linear(d->fc, d->ln, p[8], p[9], n, C, 4 * C, 0);
    cdp_cpu_gelu_fwd(d->fc, d->fc, (size_t)(n * 4 * C));
    cdp_decode_linear(d->x, d->fc, p[10], p[11], n, 4 * C, C, 1);
    return CDP_OK;
}

const struct cdp_layer_def cdp_layer_transformer_block = {
    .type = CDP_LAYER_TRANSFORMER_BLOCK,
    .name = "transformer_block",
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
    .decode_size = decode_size,
    .decode = decode,
};
