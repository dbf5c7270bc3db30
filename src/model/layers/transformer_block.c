/* transformer_block: a GPT-2 pre-LN block over [T, C] (layernorm, causal
 * self-attention, residual, layernorm, 4C GELU MLP, residual). Keys: heads
 * (required). GPT presets start its residual projections at 0.02/sqrt(2L).
 * Split over a tensor group of t (docs/parallelism.md, Megatron-LM's): rank
 * k holds heads [k H/t, (k+1) H/t) of Q, K and V (three row ranges of the
 * fused attn.c_attn) and runs attention on them; attn.c_proj is row-parallel
 * (its bias added once, by index 0), one all-reduce forward; mlp.c_fc
 * column-parallel, mlp.c_proj row-parallel, one all-reduce forward; the
 * layernorms and the residual stream whole on every rank. Backward: the
 * gradients of both layernorms' outputs (partial sums of the column splits')
 * are all-reduced before the norms' backward, so the norms' gradients and
 * the block's input gradient are the same on every rank. */
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

/* heads split; the MLP's 4C then splits too (C is a multiple of heads) */
static int tensor_check(const struct cdp_layer_desc *L, const struct cdp_shape *in, int t, const char **key,
                        int64_t *value)
{
    (void)in;
    if (L->heads % t == 0) return 0;
    *key = "heads";
    *value = L->heads;
    return -1;
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

/* A block's sizes on its rank: C the residual stream's width (whole), A the
 * attention's width and NH its heads, F the MLP's width (the rank's slices). */
struct dims {
    int T, C, A, NH, F, N;
    int Ns; /* rows of the residual stream on the rank: B T, or B T/t sequence parallel */
};

static struct dims dims_of(const struct cdp_unit *u, int B)
{
    const int t = cdp_unit_tensor_split(u) ? u->tp_size : 1;
    struct dims d;
    d.T = (int)u->in.d[0] * (u->seq_parallel ? t : 1); /* the input: the rank's shard when sequence parallel */
    d.C = (int)u->in.d[1];
    d.A = d.C / t;
    d.NH = (int)u->desc.heads / t;
    d.F = 4 * d.C / t;
    d.N = B * d.T;
    d.Ns = u->seq_parallel ? d.N / t : d.N;
    return d;
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
    if (!cdp_unit_tensor_split(u)) return;
    const int t = u->tp_size, k = u->tp_index;
    cdp_param_shard_parts(u, 2, 0, 3, t, k); /* q, k and v rows of this rank's heads */
    cdp_param_shard_parts(u, 3, 0, 3, t, k);
    cdp_param_shard(u, 4, 1, t, k); /* row-parallel: the bias (5) whole */
    cdp_param_shard(u, 8, 0, t, k);
    cdp_param_shard(u, 9, 0, t, k);
    cdp_param_shard(u, 10, 1, t, k);
}

/* Per sample, on the rank (A = C, F = 4C at t = 1): the products 2 T C (3A +
 * A + F + F), attention on A; kept C + 3A + C + F (+ 4 T statistics), tail C
 * + A + C + F. */
static void cost(struct cdp_unit *u)
{
    const struct dims d = dims_of(u, 1);
    const int64_t T = d.T, C = d.C, A = d.A, F = d.F;
    const double gemm = 2.0 * T * C * (4.0 * A + 2.0 * F);
    u->fwd_flops = gemm + cdp_attention_flops(T, A, 1, 0);
    u->bwd_flops = 2.0 * gemm + cdp_attention_flops(T, A, 1, 1);
    u->att_floats = (int64_t)d.NH * T * T;
    u->act_floats = T * (4 * C + 4 * A + 2 * F) + 4 * T + u->att_floats;
    /* W: the four projections' dw and db and the two norms', from the output gradients of each
     * (block_wstate): dout C, dfch F, dln2 C, dres2 C, dqkv 3A, dln1 C */
    u->bwd_weight_flops = gemm;
    u->wstate_floats = T * (4 * C + F + 3 * A);
    /* selective: both layernorms' outputs, the attention's output and state,
     * the GELU's output (block_layout) */
    u->tail_floats = T * (2 * C + A + F);
    u->tail_flops = cdp_attention_flops(T, A, 1, 0);
}

/* forward: one C-wide projection; backward: block_grads */
static int64_t scratch(const struct cdp_unit *u, int B)
{
    const struct dims d = dims_of(u, B);
    const int64_t s = (int64_t)d.N * (2 * d.C + 2 * d.F + 3 * d.A) + (int64_t)d.T * d.T;
    /* sequence parallel (backward_seq): the moves' staging, two shards, the norms' gradients */
    return u->seq_parallel ? s + (int64_t)d.N * d.C + 2 * (int64_t)d.Ns * d.C + 4 * (int64_t)d.C : s;
}

/* A transformer block's activations, per micro-batch of B. Kept (at act): what
 * is costly to compute again, the projections' outputs and the norms'
 * statistics; the tail (at tail), which selective recomputation drops: the
 * norms' outputs, the attention's output and state, the GELU's output. */
struct block_acts {
    float *out, *ln1_mean, *ln1_rstd, *qkv, *res2, *ln2_mean, *ln2_rstd, *fch; /* kept */
    float *ln1, *atty, *ln2, *fch_gelu, *att;                                   /* tail */
};

static struct block_acts block_layout(float *a, float *t, const struct dims *d)
{
    struct block_acts r;
    const int64_t N = d->N, Ns = d->Ns; /* the residual stream and norm statistics: Ns rows */
    r.out = a;
    r.ln1_mean = r.out + Ns * d->C;
    r.ln1_rstd = r.ln1_mean + Ns;
    r.qkv = r.ln1_rstd + Ns;
    r.res2 = r.qkv + 3 * N * d->A;
    r.ln2_mean = r.res2 + Ns * d->C;
    r.ln2_rstd = r.ln2_mean + Ns;
    r.fch = r.ln2_rstd + Ns;
    r.ln1 = t;
    r.atty = r.ln1 + N * d->C;
    r.ln2 = r.atty + N * d->A;
    r.fch_gelu = r.ln2 + N * d->C;
    r.att = r.fch_gelu + N * d->F;
    return r;
}

/* Backward's buffers in scratch: dres2 [N, C], dg and dfch [N, F], dln [N,
 * C] (a norm's output gradient, or the attention output's, A <= C wide), dqkv
 * [N, 3A], then attention's T x T (13 N C + T T at t = 1). */
struct block_grads {
    float *dres2, *dg, *dfch, *dln, *dqkv, *att_scratch;
};

static struct block_grads grads_layout(float *s, const struct dims *d)
{
    struct block_grads g;
    const int64_t N = d->N;
    g.dres2 = s;
    g.dg = g.dres2 + N * d->C;
    g.dfch = g.dg + N * d->F;
    g.dln = g.dfch + N * d->F;
    g.dqkv = g.dln + N * d->C;
    g.att_scratch = g.dqkv + 3 * N * d->A;
    return g;
}

/* Sequence parallel (cdp_unit_set_sequence_parallel): x and the output are
 * the rank's shard [B, T/t, C], as are res2 and the norms' statistics; each
 * norm runs on the shard and its output is gathered whole (ln1, ln2 kept
 * whole in the tail) for the column products; each row product's partial
 * output is reduce-scattered back to the shard. Scratch: proj [N, C], the
 * moves' staging [N, C], a shard [Ns, C]. */
static cdp_status forward_seq(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p, const float *x,
                              const struct block_acts *a, float *scratch, const struct dims *d, int B)
{
    const int N = d->N, Ns = d->Ns, C = d->C, A = d->A, F = d->F;
    float *proj = scratch, *stage = proj + (size_t)N * C, *sh = stage + (size_t)N * C;
    const int bias_here = u->tp_index == 0;
    cdp_status st;
    K(layernorm_fwd, sh, a->ln1_mean, a->ln1_rstd, x, p[0], p[1], Ns, C, 1e-5f);
    if ((st = cdp_unit_seq_gather(k, u, sh, a->ln1, stage, B, d->T, C))) return st;
    K(linear_fwd, a->qkv, a->ln1, p[2], p[3], N, C, 3 * A);
    K(attention_fwd, a->atty, a->att, a->qkv, B, d->T, A, d->NH, 1);
    K(linear_fwd, proj, a->atty, p[4], bias_here ? p[5] : NULL, N, A, C);
    if ((st = cdp_unit_seq_scatter(k, u, proj, sh, stage, B, d->T, C))) return st;
    K(residual_fwd, a->res2, x, sh, (size_t)Ns * C);
    K(layernorm_fwd, sh, a->ln2_mean, a->ln2_rstd, a->res2, p[6], p[7], Ns, C, 1e-5f);
    if ((st = cdp_unit_seq_gather(k, u, sh, a->ln2, stage, B, d->T, C))) return st;
    K(linear_fwd, a->fch, a->ln2, p[8], p[9], N, C, F);
    K(gelu_fwd, a->fch_gelu, a->fch, (size_t)N * F);
    K(linear_fwd, proj, a->fch_gelu, p[10], bias_here ? p[11] : NULL, N, F, C);
    if ((st = cdp_unit_seq_scatter(k, u, proj, sh, stage, B, d->T, C))) return st;
    K(residual_fwd, a->out, a->res2, sh, (size_t)Ns * C);
    return CDP_OK;
}

static cdp_status forward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p, const void *in,
                          float *act, float *tail, float *scratch, int B)
{
    const float *x = (const float *)in;
    const struct dims d = dims_of(u, B);
    const int N = d.N, C = d.C, A = d.A, F = d.F;
    const size_t BTC = (size_t)N * C;
    struct block_acts a = block_layout(act, tail, &d);
    if (u->seq_parallel) return forward_seq(k, u, p, x, &a, scratch, &d, B);
    float *proj = scratch; /* B*T*C */
    /* a row-parallel product's bias is added once, by the group's index 0 */
    const int bias_here = u->tp_index == 0 || !cdp_unit_tensor_split(u);
    cdp_status st;
    K(layernorm_fwd, a.ln1, a.ln1_mean, a.ln1_rstd, x, p[0], p[1], N, C, 1e-5f);
    K(linear_fwd, a.qkv, a.ln1, p[2], p[3], N, C, 3 * A);
    K(attention_fwd, a.atty, a.att, a.qkv, B, d.T, A, d.NH, 1);
    K(linear_fwd, proj, a.atty, p[4], bias_here ? p[5] : NULL, N, A, C);
    if ((st = cdp_unit_tensor_sum(u, proj, (int64_t)BTC))) return st;
    K(residual_fwd, a.res2, x, proj, BTC);
    K(layernorm_fwd, a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p[6], p[7], N, C, 1e-5f);
    K(linear_fwd, a.fch, a.ln2, p[8], p[9], N, C, F);
    K(gelu_fwd, a.fch_gelu, a.fch, (size_t)N * F);
    K(linear_fwd, proj, a.fch_gelu, p[10], bias_here ? p[11] : NULL, N, F, C);
    if ((st = cdp_unit_tensor_sum(u, proj, (int64_t)BTC))) return st;
    K(residual_fwd, a.out, a.res2, proj, BTC);
    return CDP_OK;
}

/* The tail again: the kernels of the forward that wrote it, on the same inputs
 * (the norms write their statistics again, the same values). Every product
 * whose output the group sums is kept, so this has no collective, except
 * sequence parallel: the norms' outputs are gathered again. */
static cdp_status recompute(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p, const void *in,
                            float *act, float *tail, float *scratch, int B)
{
    const float *x = (const float *)in;
    const struct dims d = dims_of(u, B);
    const int N = d.N, C = d.C;
    struct block_acts a = block_layout(act, tail, &d);
    if (u->seq_parallel) { /* the norms on the shard, gathered whole again: two all-gathers */
        float *stage = scratch, *sh = stage + (size_t)N * C;
        cdp_status st;
        K(layernorm_fwd, sh, a.ln1_mean, a.ln1_rstd, x, p[0], p[1], d.Ns, C, 1e-5f);
        if ((st = cdp_unit_seq_gather(k, u, sh, a.ln1, stage, B, d.T, C))) return st;
        K(attention_fwd, a.atty, a.att, a.qkv, B, d.T, d.A, d.NH, 1);
        K(layernorm_fwd, sh, a.ln2_mean, a.ln2_rstd, a.res2, p[6], p[7], d.Ns, C, 1e-5f);
        if ((st = cdp_unit_seq_gather(k, u, sh, a.ln2, stage, B, d.T, C))) return st;
        K(gelu_fwd, a.fch_gelu, a.fch, (size_t)N * d.F);
        return CDP_OK;
    }
    K(layernorm_fwd, a.ln1, a.ln1_mean, a.ln1_rstd, x, p[0], p[1], N, C, 1e-5f);
    K(attention_fwd, a.atty, a.att, a.qkv, B, d.T, d.A, d.NH, 1);
    K(layernorm_fwd, a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p[6], p[7], N, C, 1e-5f);
    K(gelu_fwd, a.fch_gelu, a.fch, (size_t)N * d.F);
    return CDP_OK;
}

/* Backward of forward_seq, dout and din the rank's shards: the output
 * gradient gathered whole for the row products (the backward of their
 * reduce-scatter), each column product's partial input gradient
 * reduce-scattered to the shard for its norm (the backward of the gather),
 * the residual stream's gradient on the shard. The norms' weight and bias
 * gradients of the rank's rows are summed over the group (one all-reduce of
 * 4C floats) and then added to g, so they are the whole sequence's on every
 * rank as without sequence parallelism. Scratch: block_grads (dres2 and dln
 * whole), then the staging [N, C], the shards of dres2 and of a norm's
 * output gradient [Ns, C], the norms' gradients [4C]. */
static cdp_status backward_seq(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                               float *const *g, const float *x, const struct block_acts *a, const float *dout,
                               float *din, float *scratch, const struct dims *d, int B)
{
    const int N = d->N, Ns = d->Ns, C = d->C, A = d->A, F = d->F;
    const size_t BTC = (size_t)N * C, BTF = (size_t)N * F, SC = (size_t)Ns * C;
    struct block_grads s = grads_layout(scratch, d);
    float *stage = s.att_scratch + (size_t)d->T * d->T, *dres2s = stage + BTC, *dlns = dres2s + SC;
    float *ng = dlns + SC; /* ln_1's weight and bias gradients, then ln_2's */
    cdp_status st;
    if ((st = cdp_unit_seq_gather(k, u, dout, s.dres2, stage, B, d->T, C))) return st;
    K(copy, dres2s, dout, SC * sizeof *dres2s);
    if (k->ops->linear_gelu_bwd) {
        K(linear_gelu_bwd, s.dfch, g[10], g[11], s.dres2, a->fch_gelu, a->fch, p[10], N, F, C);
    } else {
        K(zero, s.dg, BTF * sizeof *s.dg);
        K(linear_bwd, s.dg, g[10], g[11], s.dres2, a->fch_gelu, p[10], N, F, C);
        K(zero, s.dfch, BTF * sizeof *s.dfch);
        K(gelu_bwd, s.dfch, s.dg, a->fch, BTF);
    }
    K(zero, s.dln, BTC * sizeof *s.dln);
    K(linear_bwd, s.dln, g[8], g[9], s.dfch, a->ln2, p[8], N, C, F);
    if ((st = cdp_unit_seq_scatter(k, u, s.dln, dlns, stage, B, d->T, C))) return st;
    K(zero, ng, 4 * (size_t)C * sizeof *ng);
    K(layernorm_bwd, dres2s, ng + 2 * C, ng + 3 * C, dlns, a->res2, p[6], a->ln2_mean, a->ln2_rstd, Ns, C);
    if ((st = cdp_unit_seq_gather(k, u, dres2s, s.dres2, stage, B, d->T, C))) return st;
    K(zero, s.dln, (size_t)N * A * sizeof *s.dln);
    K(linear_bwd, s.dln, g[4], g[5], s.dres2, a->atty, p[4], N, A, C);
    K(zero, s.dqkv, 3 * (size_t)N * A * sizeof *s.dqkv);
    K(attention_bwd, s.dqkv, s.dln, a->qkv, a->att, s.att_scratch, B, d->T, A, d->NH, 1);
    K(zero, s.dln, BTC * sizeof *s.dln);
    K(linear_bwd, s.dln, g[2], g[3], s.dqkv, a->ln1, p[2], N, C, 3 * A);
    if ((st = cdp_unit_seq_scatter(k, u, s.dln, dlns, stage, B, d->T, C))) return st;
    float *into = din;
    if (din) {
        K(add, din, dres2s, SC);
    } else { /* no input gradient wanted: the norm's parameter gradients still */
        into = s.dres2;
        K(zero, into, SC * sizeof *into);
    }
    K(layernorm_bwd, into, ng, ng + C, dlns, x, p[0], a->ln1_mean, a->ln1_rstd, Ns, C);
    if ((st = cdp_unit_tensor_sum(u, ng, 4 * (int64_t)C))) return st;
    K(add, g[0], ng, (size_t)C);
    K(add, g[1], ng + C, (size_t)C);
    K(add, g[6], ng + 2 * C, (size_t)C);
    K(add, g[7], ng + 3 * C, (size_t)C);
    return CDP_OK;
}

static cdp_status backward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                           float *const *g, const void *in, const float *act, const float *tail,
                           const float *dout, float *din, float *scratch, int B)
{
    const float *x = (const float *)in;
    const struct dims d = dims_of(u, B);
    const int N = d.N, C = d.C, A = d.A, F = d.F;
    const size_t BTC = (size_t)N * C, BTF = (size_t)N * F;
    struct block_acts a = block_layout((float *)act, (float *)tail, &d);
    if (u->seq_parallel) return backward_seq(k, u, p, g, x, &a, dout, din, scratch, &d, B);
    struct block_grads s = grads_layout(scratch, &d);
    cdp_status st;
    K(copy, s.dres2, dout, BTC * sizeof *s.dres2);
    if (k->ops->linear_gelu_bwd) { /* dfch overwritten, through the GELU */
        K(linear_gelu_bwd, s.dfch, g[10], g[11], dout, a.fch_gelu, a.fch, p[10], N, F, C);
    } else {
        K(zero, s.dg, BTF * sizeof *s.dg);
        K(linear_bwd, s.dg, g[10], g[11], dout, a.fch_gelu, p[10], N, F, C);
        K(zero, s.dfch, BTF * sizeof *s.dfch);
        K(gelu_bwd, s.dfch, s.dg, a.fch, BTF);
    }
    K(zero, s.dln, BTC * sizeof *s.dln);
    K(linear_bwd, s.dln, g[8], g[9], s.dfch, a.ln2, p[8], N, C, F);
    if ((st = cdp_unit_tensor_sum(u, s.dln, (int64_t)BTC))) return st;
    K(layernorm_bwd, s.dres2, g[6], g[7], s.dln, a.res2, p[6], a.ln2_mean, a.ln2_rstd, N, C);
    K(zero, s.dln, (size_t)N * A * sizeof *s.dln);
    K(linear_bwd, s.dln, g[4], g[5], s.dres2, a.atty, p[4], N, A, C);
    K(zero, s.dqkv, 3 * (size_t)N * A * sizeof *s.dqkv);
    K(attention_bwd, s.dqkv, s.dln, a.qkv, a.att, s.att_scratch, B, d.T, A, d.NH, 1);
    K(zero, s.dln, BTC * sizeof *s.dln);
    K(linear_bwd, s.dln, g[2], g[3], s.dqkv, a.ln1, p[2], N, C, 3 * A);
    if ((st = cdp_unit_tensor_sum(u, s.dln, (int64_t)BTC))) return st;
    if (din) {
        K(add, din, s.dres2, BTC);
        K(layernorm_bwd, din, g[0], g[1], s.dln, x, p[0], a.ln1_mean, a.ln1_rstd, N, C);
    } else {
        /* no input gradient wanted: still accumulate the norm's parameter gradients (into
         * dres2, N x C and no longer needed: dg is F = 4C/t wide, less than C past t = 4) */
        float *sink = s.dres2;
        K(zero, sink, BTC * sizeof *sink);
        K(layernorm_bwd, sink, g[0], g[1], s.dln, x, p[0], a.ln1_mean, a.ln1_rstd, N, C);
    }
    return CDP_OK;
}

/* Split backward's W-state, per micro-batch of B (T (4C + F + 3A) a sample):
 * the output gradient of each product and norm, as backward computes it. */
struct block_wstate {
    float *dout;  /* the block's: mlp.c_proj's */
    float *dfch;  /* mlp.c_fc's (through the GELU) */
    float *dln2;  /* ln_2's (summed over the group) */
    float *dres2; /* attn.c_proj's: the residual stream's after ln_2 */
    float *dqkv;  /* attn.c_attn's */
    float *dln1;  /* ln_1's (summed over the group) */
};

static struct block_wstate block_wstate(float *w, const struct dims *d)
{
    const int64_t N = d->N;
    struct block_wstate r;
    r.dout = w;
    r.dfch = r.dout + N * d->C;
    r.dln2 = r.dfch + N * d->F;
    r.dres2 = r.dln2 + N * d->C;
    r.dqkv = r.dres2 + N * d->C;
    r.dln1 = r.dqkv + 3 * N * d->A;
    return r;
}

/* B of backward_seq: its calls with the products' weight outputs NULL, the
 * whole gradients W reads in the W-state (dout and dres2 gathered whole);
 * the norms' weight and bias gradients are B's, summed over the group here
 * and left in the W-state (ln_1's at dln1, ln_2's at dln2, 2C floats each,
 * N C >= 2C as T >= t >= 2), so that W has no collective. */
static cdp_status backward_input_seq(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                     const float *x, const struct block_acts *a, const struct block_wstate *w,
                                     const float *dout, float *din, float *scratch, const struct dims *d, int B)
{
    const int N = d->N, Ns = d->Ns, C = d->C, A = d->A, F = d->F;
    const size_t BTC = (size_t)N * C, BTF = (size_t)N * F, SC = (size_t)Ns * C;
    struct block_grads s = grads_layout(scratch, d);
    float *stage = s.att_scratch + (size_t)d->T * d->T, *dres2s = stage + BTC, *dlns = dres2s + SC;
    float *ng = dlns + SC;
    cdp_status st;
    if ((st = cdp_unit_seq_gather(k, u, dout, w->dout, stage, B, d->T, C))) return st;
    K(copy, dres2s, dout, SC * sizeof *dres2s);
    if (k->ops->linear_gelu_bwd) {
        K(linear_gelu_bwd, w->dfch, NULL, NULL, w->dout, a->fch_gelu, a->fch, p[10], N, F, C);
    } else {
        K(zero, s.dg, BTF * sizeof *s.dg);
        K(linear_bwd, s.dg, NULL, NULL, w->dout, a->fch_gelu, p[10], N, F, C);
        K(zero, w->dfch, BTF * sizeof *w->dfch);
        K(gelu_bwd, w->dfch, s.dg, a->fch, BTF);
    }
    K(zero, s.dln, BTC * sizeof *s.dln);
    K(linear_bwd, s.dln, NULL, NULL, w->dfch, a->ln2, p[8], N, C, F);
    if ((st = cdp_unit_seq_scatter(k, u, s.dln, dlns, stage, B, d->T, C))) return st;
    K(zero, ng, 4 * (size_t)C * sizeof *ng);
    K(layernorm_bwd, dres2s, ng + 2 * C, ng + 3 * C, dlns, a->res2, p[6], a->ln2_mean, a->ln2_rstd, Ns, C);
    if ((st = cdp_unit_seq_gather(k, u, dres2s, w->dres2, stage, B, d->T, C))) return st;
    K(zero, s.dln, (size_t)N * A * sizeof *s.dln);
    K(linear_bwd, s.dln, NULL, NULL, w->dres2, a->atty, p[4], N, A, C);
    K(zero, w->dqkv, 3 * (size_t)N * A * sizeof *w->dqkv);
    K(attention_bwd, w->dqkv, s.dln, a->qkv, a->att, s.att_scratch, B, d->T, A, d->NH, 1);
    K(zero, s.dln, BTC * sizeof *s.dln);
    K(linear_bwd, s.dln, NULL, NULL, w->dqkv, a->ln1, p[2], N, C, 3 * A);
    if ((st = cdp_unit_seq_scatter(k, u, s.dln, dlns, stage, B, d->T, C))) return st;
    float *into = din;
    if (din) {
        K(add, din, dres2s, SC);
    } else {
        into = s.dres2;
        K(zero, into, SC * sizeof *into);
    }
    K(layernorm_bwd, into, ng, ng + C, dlns, x, p[0], a->ln1_mean, a->ln1_rstd, Ns, C);
    if ((st = cdp_unit_tensor_sum(u, ng, 4 * (int64_t)C))) return st;
    K(copy, w->dln1, ng, 2 * (size_t)C * sizeof *ng);
    K(copy, w->dln2, ng + 2 * C, 2 * (size_t)C * sizeof *ng);
    return CDP_OK;
}

/* B: backward's input-gradient calls in its order, the weight outputs NULL,
 * with the gradients W reads written in the W-state rather than scratch; the
 * group's two all-reduces are here, W has none. */
static cdp_status backward_input(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                 const void *in, const float *act, const float *tail, const float *dout,
                                 float *din, float *ws, float *scratch, int B)
{
    const float *x = (const float *)in;
    const struct dims d = dims_of(u, B);
    const int N = d.N, C = d.C, A = d.A, F = d.F;
    const size_t BTC = (size_t)N * C, BTF = (size_t)N * F;
    struct block_acts a = block_layout((float *)act, (float *)tail, &d);
    struct block_wstate w = block_wstate(ws, &d);
    if (u->seq_parallel) return backward_input_seq(k, u, p, x, &a, &w, dout, din, scratch, &d, B);
    struct block_grads s = grads_layout(scratch, &d); /* dres2, dfch and dqkv unused */
    cdp_status st;
    K(copy, w.dout, dout, BTC * sizeof *w.dout);
    K(copy, w.dres2, dout, BTC * sizeof *w.dres2);
    if (k->ops->linear_gelu_bwd) {
        K(linear_gelu_bwd, w.dfch, NULL, NULL, dout, a.fch_gelu, a.fch, p[10], N, F, C);
    } else {
        K(zero, s.dg, BTF * sizeof *s.dg);
        K(linear_bwd, s.dg, NULL, NULL, dout, a.fch_gelu, p[10], N, F, C);
        K(zero, w.dfch, BTF * sizeof *w.dfch);
        K(gelu_bwd, w.dfch, s.dg, a.fch, BTF);
    }
    K(zero, w.dln2, BTC * sizeof *w.dln2);
    K(linear_bwd, w.dln2, NULL, NULL, w.dfch, a.ln2, p[8], N, C, F);
    if ((st = cdp_unit_tensor_sum(u, w.dln2, (int64_t)BTC))) return st;
    K(layernorm_bwd, w.dres2, NULL, NULL, w.dln2, a.res2, p[6], a.ln2_mean, a.ln2_rstd, N, C);
    K(zero, s.dln, (size_t)N * A * sizeof *s.dln);
    K(linear_bwd, s.dln, NULL, NULL, w.dres2, a.atty, p[4], N, A, C);
    K(zero, w.dqkv, 3 * (size_t)N * A * sizeof *w.dqkv);
    K(attention_bwd, w.dqkv, s.dln, a.qkv, a.att, s.att_scratch, B, d.T, A, d.NH, 1);
    K(zero, w.dln1, BTC * sizeof *w.dln1);
    K(linear_bwd, w.dln1, NULL, NULL, w.dqkv, a.ln1, p[2], N, C, 3 * A);
    if ((st = cdp_unit_tensor_sum(u, w.dln1, (int64_t)BTC))) return st;
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
    const struct dims d = dims_of(u, B);
    const int N = d.N, C = d.C, A = d.A, F = d.F;
    struct block_acts a = block_layout((float *)act, (float *)tail, &d);
    struct block_wstate w = block_wstate((float *)ws, &d);
    if (u->seq_parallel) { /* the products' from the whole gradients, the norms' as B summed them */
        K(linear_bwd, NULL, g[10], g[11], w.dout, a.fch_gelu, p[10], N, F, C);
        K(linear_bwd, NULL, g[8], g[9], w.dfch, a.ln2, p[8], N, C, F);
        K(linear_bwd, NULL, g[4], g[5], w.dres2, a.atty, p[4], N, A, C);
        K(linear_bwd, NULL, g[2], g[3], w.dqkv, a.ln1, p[2], N, C, 3 * A);
        K(add, g[0], w.dln1, (size_t)C);
        K(add, g[1], w.dln1 + C, (size_t)C);
        K(add, g[6], w.dln2, (size_t)C);
        K(add, g[7], w.dln2 + C, (size_t)C);
        return CDP_OK;
    }
    K(linear_bwd, NULL, g[10], g[11], w.dout, a.fch_gelu, p[10], N, F, C);
    K(linear_bwd, NULL, g[8], g[9], w.dfch, a.ln2, p[8], N, C, F);
    K(layernorm_bwd, NULL, g[6], g[7], w.dln2, a.res2, p[6], a.ln2_mean, a.ln2_rstd, N, C);
    K(linear_bwd, NULL, g[4], g[5], w.dres2, a.atty, p[4], N, A, C);
    K(linear_bwd, NULL, g[2], g[3], w.dqkv, a.ln1, p[2], N, C, 3 * A);
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
    .decode_size = decode_size,
    .decode = decode,
};
