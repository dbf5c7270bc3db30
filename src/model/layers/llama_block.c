/* llama_block: a Llama pre-norm block over [T, C], as Hugging Face's
 * LlamaDecoderLayer: RMS norm, rotary grouped-query causal self-attention
 * (q, k, v and o projections without biases), residual, RMS norm, SwiGLU MLP
 * (gate, up, down without biases), residual. Keys: heads (required),
 * kv_heads (default heads), hidden (default Llama's rule with multiple_of
 * 256), eps (1e-5), rope_theta (10000), rope_scaling (none). Parameter names
 * are Hugging Face's within a layer (docs/models.md). Split over a tensor
 * group of t (docs/parallelism.md), as transformer_block is: rank k holds
 * heads [k H/t, (k+1) H/t) of q and its kv heads [k KV/t, (k+1) KV/t) of k
 * and v (column-parallel), o_proj row-parallel (one all-reduce forward); gate
 * and up column-parallel, down row-parallel (one all-reduce forward); the
 * norms and the residual stream whole; backward all-reduces the gradients of
 * both norms' outputs before the norms' backward. Sequence parallel
 * (cdp_unit_set_sequence_parallel), as transformer_block: the norms and the
 * residual stream on the rank's rows of the sequence, an all-gather before
 * q, k, v and before gate and up, a reduce-scatter after o_proj and after
 * down_proj; attention runs on the gathered whole sequence, so the rotary
 * positions are the global ones. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/ops.h" /* the decoder's CPU kernels */
#include "kernels/rope.h"
#include "model/layers/common.h"

static const char *const keys[] = {"heads", "kv_heads", "hidden", "eps", "rope_theta", "rope_scaling", NULL};

/* a llama_block's width, for the default of "hidden"; the loader checks shapes after parse */
static cdp_status parse(const struct cdp_json_in *in, const json_t *v, const char *ptr, const char *who,
                        struct cdp_layer_desc *L)
{
    cdp_status st;
    if ((st = cdp_layer_get_required_int(in, v, ptr, "heads", 1, who, &L->heads))) return st;
    L->kv_heads = L->heads;
    if ((st = cdp_json_get_int(in, v, ptr, "kv_heads", 1, CDP_PLAN_MAX_COUNT, 0, &L->kv_heads))) return st;
    L->hidden = 0; /* 0: Llama's rule on the input width (shape() and build() resolve it) */
    if ((st = cdp_json_get_int(in, v, ptr, "hidden", 1, CDP_PLAN_MAX_COUNT, 0, &L->hidden))) return st;
    L->eps = 1e-5;
    if ((st = cdp_json_get_number(in, v, ptr, "eps", CDP_JSON_POSITIVE, &L->eps))) return st;
    return cdp_rope_parse(in, v, ptr, &L->rope);
}

static int64_t hidden_of(const struct cdp_layer_desc *L, int64_t C)
{
    return L->hidden > 0 ? L->hidden : cdp_llama_hidden(C, 256, 0);
}

static int shape(const struct cdp_layer_desc *L, const struct cdp_shape *in, struct cdp_shape *out, char *why,
                 size_t cap)
{
    if (cdp_rotary_shape("llama_block", L, in, out, why, cap)) return -1;
    if (hidden_of(L, cdp_shape_last(in)) < 0) {
        snprintf(why, cap, "llama_block's MLP width overflows");
        return -1;
    }
    return 0;
}

/* heads, kv_heads and the MLP's width split */
static int tensor_check(const struct cdp_layer_desc *L, const struct cdp_shape *in, int t, const char **key,
                        int64_t *value)
{
    const int64_t H = hidden_of(L, cdp_shape_last(in));
    *key = L->heads % t ? "heads" : L->kv_heads % t ? "kv_heads" : H % t ? "hidden" : NULL;
    *value = L->heads % t ? L->heads : L->kv_heads % t ? L->kv_heads : H;
    return *key ? -1 : 0;
}

/* 2 C^2 + 2 C KVD (q, o; k, v) + 3 C H (gate, up, down) + 2 C (the norms) */
static int64_t params(const struct cdp_layer_desc *L, const struct cdp_shape *in)
{
    const int64_t C = cdp_shape_last(in), KVD = C / L->heads * L->kv_heads, H = hidden_of(L, C);
    int64_t n = cdp_mul_add(cdp_mul_add(C, C, 0), 2, cdp_mul_add(2, C, 0));
    n = cdp_mul_add(cdp_mul_add(C, KVD, 0), 2, n);
    return cdp_mul_add(cdp_mul_add(C, H, 0), 3, n);
}

static int emit(const struct cdp_layer_desc *L, json_t *o)
{
    return json_object_set_new(o, "heads", CDP_JINT(L->heads)) |
           json_object_set_new(o, "kv_heads", CDP_JINT(L->kv_heads)) |
           (L->hidden > 0 ? json_object_set_new(o, "hidden", CDP_JINT(L->hidden)) : 0) |
           json_object_set_new(o, "eps", json_real(L->eps)) | cdp_rope_emit(&L->rope, o);
}

static void describe(const struct cdp_layer_desc *L, char *buf, size_t cap)
{
    char r[96], h[48];
    cdp_rope_describe(&L->rope, r, sizeof r);
    if (L->hidden > 0) snprintf(h, sizeof h, "hidden %lld", (long long)L->hidden);
    else snprintf(h, sizeof h, "hidden by Llama's rule");
    snprintf(buf, cap, " heads %lld, kv_heads %lld, %s,%s", (long long)L->heads, (long long)L->kv_heads, h, r);
}

/* Llama presets start every matrix at N(0, 0.02) (Hugging Face's
 * initializer_range), explicit lists at PyTorch's default. */
static void build(struct cdp_unit *u, const struct cdp_model_desc *m)
{
    const int64_t C = cdp_shape_last(&u->in), KVD = C / u->desc.heads * u->desc.kv_heads;
    const int64_t H = hidden_of(&u->desc, C);
    const int lm = m->kind == CDP_MODEL_GPT;
    u->desc.hidden = H;
    cdp_unit_add_rmsnorm_param(u, "input_layernorm", C);
    cdp_unit_add_linear_params(u, "self_attn.q_proj", C, C, 0, lm, 0.02f);
    cdp_unit_add_linear_params(u, "self_attn.k_proj", KVD, C, 0, lm, 0.02f);
    cdp_unit_add_linear_params(u, "self_attn.v_proj", KVD, C, 0, lm, 0.02f);
    cdp_unit_add_linear_params(u, "self_attn.o_proj", C, C, 0, lm, 0.02f);
    cdp_unit_add_rmsnorm_param(u, "post_attention_layernorm", C);
    cdp_unit_add_linear_params(u, "mlp.gate_proj", H, C, 0, lm, 0.02f);
    cdp_unit_add_linear_params(u, "mlp.up_proj", H, C, 0, lm, 0.02f);
    cdp_unit_add_linear_params(u, "mlp.down_proj", C, H, 0, lm, 0.02f);
    if (!cdp_unit_tensor_split(u)) return;
    const int t = u->tp_size, k = u->tp_index;
    for (int i = 1; i <= 3; i++) cdp_param_shard(u, i, 0, t, k); /* q, k, v: this rank's heads */
    cdp_param_shard(u, 4, 1, t, k);                               /* o: row-parallel */
    cdp_param_shard(u, 6, 0, t, k);                               /* gate, up: column-parallel */
    cdp_param_shard(u, 7, 0, t, k);
    cdp_param_shard(u, 8, 1, t, k); /* down: row-parallel */
}

/* A block's sizes on its rank: C the residual stream's width (whole); A the
 * attention's width, NH and NKV its heads and kv heads, KVD the kv width and
 * H the MLP's (the rank's slices; C, heads, kv_heads and hidden at t = 1):
 * the attention's from cdp_rotary_dims (common.h), as rotary_attention's. */
struct dims {
    int T, C, A, NH, NKV, HD, KVD, H, N;
    int Ns; /* rows of the residual stream on the rank: B T, or B T/t sequence parallel */
    float eps;
};

static struct dims dims_of(const struct cdp_unit *u, int B)
{
    const struct cdp_rotary_dims r = cdp_rotary_dims(u, B);
    const int t = cdp_unit_tensor_split(u) ? u->tp_size : 1;
    struct dims d = {.T = r.T, .C = r.C, .A = r.A, .NH = r.NH, .NKV = r.NKV, .HD = r.HD, .KVD = r.KVD, .N = r.N};
    d.H = (int)u->desc.hidden / t;
    d.Ns = u->seq_parallel ? d.N / t : d.N;
    d.eps = (float)u->desc.eps;
    return d;
}

static void cost(struct cdp_unit *u)
{
    const struct dims d = dims_of(u, 1);
    const int64_t T = d.T, C = d.C, A = d.A, KVD = d.KVD, H = d.H;
    const double gemm = 2.0 * T * (2.0 * C * A + 2.0 * C * KVD + 3.0 * C * H);
    u->fwd_flops = gemm + cdp_attention_flops(T, A, 1, 0);
    u->bwd_flops = 2.0 * gemm + cdp_attention_flops(T, A, 1, 1);
    u->att_floats = (int64_t)d.NH * T * T;
    /* kept 2C + 3A + 2 + 2H, tail 2C + A + H (block_layout) */
    u->act_floats = T * (4 * C + 4 * A + 3 * H + 2) + u->att_floats;
    /* W: the seven projections' dw and the two norms', from the output gradients of each (block_wstate) */
    u->bwd_weight_flops = gemm;
    u->wstate_floats = T * (4 * C + A + 2 * H + 2 * KVD);
    /* selective: both norms' outputs, the attention's output and state, the SwiGLU product */
    u->tail_floats = T * (2 * C + A + H);
    u->tail_flops = cdp_attention_flops(T, A, 1, 0);
}

/* forward: q, k, v, the o projection; backward: block_grads */
static int64_t scratch(const struct cdp_unit *u, int B)
{
    const struct dims d = dims_of(u, B);
    const int64_t s = (int64_t)d.N * (2 * d.C + 3 * d.H + 5 * d.A + 2 * d.KVD) + (int64_t)d.T * d.T;
    /* sequence parallel (backward_seq): the moves' staging, two shards, the norms' gradients */
    return u->seq_parallel ? s + (int64_t)d.N * d.C + 2 * (int64_t)d.Ns * d.C + 2 * (int64_t)d.C : s;
}

/* A llama block's activations, per micro-batch of B. Kept (at act): the
 * output, the norms' 1/rms, the rotated and expanded qkv, the residual
 * stream after attention, the gate and up projections. The tail (at tail),
 * which selective recomputation drops: the norms' outputs, the attention's
 * output and state, the SwiGLU product. */
struct block_acts {
    float *out, *rstd1, *qkv, *res2, *rstd2, *gate, *up; /* kept */
    float *ln1, *atty, *ln2, *hmid, *att;                /* tail */
};

static struct block_acts block_layout(float *a, float *t, const struct dims *d)
{
    struct block_acts r;
    const int64_t N = d->N, NC = N * d->C, Ns = d->Ns; /* the residual stream and 1/rms: Ns rows */
    r.out = a;
    r.rstd1 = r.out + Ns * d->C;
    r.qkv = r.rstd1 + Ns;
    r.res2 = r.qkv + 3 * N * d->A;
    r.rstd2 = r.res2 + Ns * d->C;
    r.gate = r.rstd2 + Ns;
    r.up = r.gate + N * d->H;
    r.ln1 = t;
    r.atty = r.ln1 + NC;
    r.ln2 = r.atty + N * d->A;
    r.hmid = r.ln2 + NC;
    r.att = r.hmid + N * d->H;
    return r;
}

/* Sequence parallel (cdp_unit_set_sequence_parallel): x and the output are
 * the rank's shard [B, T/t, C], as are res2 and the norms' 1/rms; each norm
 * runs on the shard and its output is gathered whole (ln1, ln2 kept whole in
 * the tail) for the column products; each row product's partial output is
 * reduce-scattered back to the shard. q, k and v are the whole sequence's, so
 * the rotation uses the global positions. Scratch: q, k, v, proj [N, C], the
 * moves' staging [N, C], a shard [Ns, C]. */
static cdp_status forward_seq(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p, const float *x,
                              const struct block_acts *a, float *scratch_, const struct dims *d, int B)
{
    const int N = d->N, Ns = d->Ns, C = d->C;
    float *q = scratch_, *kk = q + (size_t)N * d->A, *v = kk + (size_t)N * d->KVD, *proj = v + (size_t)N * d->KVD;
    float *stage = proj + (size_t)N * C, *sh = stage + (size_t)N * C;
    cdp_status st;
    K(rmsnorm_fwd, sh, a->rstd1, x, p[0], Ns, C, d->eps);
    if ((st = cdp_unit_seq_gather(k, u, sh, a->ln1, stage, B, d->T, C))) return st;
    K(linear_fwd, q, a->ln1, p[1], NULL, N, C, d->A);
    K(linear_fwd, kk, a->ln1, p[2], NULL, N, C, d->KVD);
    K(linear_fwd, v, a->ln1, p[3], NULL, N, C, d->KVD);
    K(rope_fwd, a->qkv, q, kk, v, B, d->T, d->NH, d->NKV, d->HD, 0, u->desc.rope);
    K(attention_fwd, a->atty, a->att, a->qkv, B, d->T, d->A, d->NH, 1);
    K(linear_fwd, proj, a->atty, p[4], NULL, N, d->A, C);
    if ((st = cdp_unit_seq_scatter(k, u, proj, sh, stage, B, d->T, C))) return st;
    K(residual_fwd, a->res2, x, sh, (size_t)Ns * C);
    K(rmsnorm_fwd, sh, a->rstd2, a->res2, p[5], Ns, C, d->eps);
    if ((st = cdp_unit_seq_gather(k, u, sh, a->ln2, stage, B, d->T, C))) return st;
    K(linear_fwd, a->gate, a->ln2, p[6], NULL, N, C, d->H);
    K(linear_fwd, a->up, a->ln2, p[7], NULL, N, C, d->H);
    K(swiglu_fwd, a->hmid, a->gate, a->up, (size_t)N * d->H);
    K(linear_fwd, proj, a->hmid, p[8], NULL, N, d->H, C);
    if ((st = cdp_unit_seq_scatter(k, u, proj, sh, stage, B, d->T, C))) return st;
    K(residual_fwd, a->out, a->res2, sh, (size_t)Ns * C);
    return CDP_OK;
}

static cdp_status forward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p, const void *in,
                          float *act, float *tail, float *scratch_, int B)
{
    const float *x = (const float *)in;
    const struct dims d = dims_of(u, B);
    const size_t NC = (size_t)d.N * d.C;
    struct block_acts a = block_layout(act, tail, &d);
    if (u->seq_parallel) return forward_seq(k, u, p, x, &a, scratch_, &d, B);
    float *q = scratch_, *kk = q + (size_t)d.N * d.A, *v = kk + (size_t)d.N * d.KVD, *proj = v + (size_t)d.N * d.KVD;
    cdp_status st;
    K(rmsnorm_fwd, a.ln1, a.rstd1, x, p[0], d.N, d.C, d.eps);
    K(linear_fwd, q, a.ln1, p[1], NULL, d.N, d.C, d.A);
    K(linear_fwd, kk, a.ln1, p[2], NULL, d.N, d.C, d.KVD);
    K(linear_fwd, v, a.ln1, p[3], NULL, d.N, d.C, d.KVD);
    K(rope_fwd, a.qkv, q, kk, v, B, d.T, d.NH, d.NKV, d.HD, 0, u->desc.rope);
    K(attention_fwd, a.atty, a.att, a.qkv, B, d.T, d.A, d.NH, 1);
    K(linear_fwd, proj, a.atty, p[4], NULL, d.N, d.A, d.C);
    if ((st = cdp_unit_tensor_sum(u, proj, (int64_t)NC))) return st;
    K(residual_fwd, a.res2, x, proj, NC);
    K(rmsnorm_fwd, a.ln2, a.rstd2, a.res2, p[5], d.N, d.C, d.eps);
    K(linear_fwd, a.gate, a.ln2, p[6], NULL, d.N, d.C, d.H);
    K(linear_fwd, a.up, a.ln2, p[7], NULL, d.N, d.C, d.H);
    K(swiglu_fwd, a.hmid, a.gate, a.up, (size_t)d.N * d.H);
    K(linear_fwd, proj, a.hmid, p[8], NULL, d.N, d.H, d.C);
    if ((st = cdp_unit_tensor_sum(u, proj, (int64_t)NC))) return st;
    K(residual_fwd, a.out, a.res2, proj, NC);
    return CDP_OK;
}

/* The tail again: the kernels of the forward that wrote it, on the same
 * inputs (the norms write their 1/rms again, the same values); no collective
 * (every product the group sums is kept), except sequence parallel: the
 * norms' outputs are gathered again. */
static cdp_status recompute(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p, const void *in,
                            float *act, float *tail, float *scratch_, int B)
{
    const struct dims d = dims_of(u, B);
    struct block_acts a = block_layout(act, tail, &d);
    if (u->seq_parallel) { /* the norms on the shard, gathered whole again: two all-gathers */
        float *stage = scratch_, *sh = stage + (size_t)d.N * d.C;
        cdp_status st;
        K(rmsnorm_fwd, sh, a.rstd1, (const float *)in, p[0], d.Ns, d.C, d.eps);
        if ((st = cdp_unit_seq_gather(k, u, sh, a.ln1, stage, B, d.T, d.C))) return st;
        K(attention_fwd, a.atty, a.att, a.qkv, B, d.T, d.A, d.NH, 1);
        K(rmsnorm_fwd, sh, a.rstd2, a.res2, p[5], d.Ns, d.C, d.eps);
        if ((st = cdp_unit_seq_gather(k, u, sh, a.ln2, stage, B, d.T, d.C))) return st;
        K(swiglu_fwd, a.hmid, a.gate, a.up, (size_t)d.N * d.H);
        return CDP_OK;
    }
    K(rmsnorm_fwd, a.ln1, a.rstd1, (const float *)in, p[0], d.N, d.C, d.eps);
    K(attention_fwd, a.atty, a.att, a.qkv, B, d.T, d.A, d.NH, 1);
    K(rmsnorm_fwd, a.ln2, a.rstd2, a.res2, p[5], d.N, d.C, d.eps);
    K(swiglu_fwd, a.hmid, a.gate, a.up, (size_t)d.N * d.H);
    return CDP_OK;
}

/* Backward's buffers in scratch. */
struct block_grads {
    float *dres2, *dhmid, *dgate, *dup, *dln, *datty, *dqkv, *dq, *dk, *dv, *att_scratch;
};

static struct block_grads grads_layout(float *s, const struct dims *d)
{
    struct block_grads g;
    const size_t NC = (size_t)d->N * d->C, NH_ = (size_t)d->N * d->H, NK = (size_t)d->N * d->KVD,
                 NA = (size_t)d->N * d->A;
    g.dres2 = s;
    g.dhmid = g.dres2 + NC;
    g.dgate = g.dhmid + NH_;
    g.dup = g.dgate + NH_;
    g.dln = g.dup + NH_;
    g.datty = g.dln + NC;
    g.dqkv = g.datty + NA;
    g.dq = g.dqkv + 3 * NA;
    g.dk = g.dq + NA;
    g.dv = g.dk + NK;
    g.att_scratch = g.dv + NK;
    return g;
}

/* Split backward's W-state, per micro-batch of B (4C + A + 2H + 2KVD a token):
 * the output gradient of each product and norm, as backward computes it. */
struct block_wstate {
    float *dout;  /* the block's: mlp.down_proj's */
    float *dgate; /* mlp.gate_proj's */
    float *dup;   /* mlp.up_proj's */
    float *dln2;  /* post_attention_layernorm's */
    float *dres2; /* self_attn.o_proj's: the residual stream's after the second norm */
    float *dq, *dk, *dv; /* the q, k, v projections' (through the rotation and the head repeat) */
    float *dln1;  /* input_layernorm's */
};

static struct block_wstate block_wstate(float *w, const struct dims *d)
{
    const size_t NC = (size_t)d->N * d->C, NHd = (size_t)d->N * d->H, NK = (size_t)d->N * d->KVD;
    struct block_wstate r;
    r.dout = w;
    r.dgate = r.dout + NC;
    r.dup = r.dgate + NHd;
    r.dln2 = r.dup + NHd;
    r.dres2 = r.dln2 + NC;
    r.dq = r.dres2 + NC;
    r.dk = r.dq + (size_t)d->N * d->A;
    r.dv = r.dk + NK;
    r.dln1 = r.dv + NK;
    return r;
}

/* Backward of forward_seq, dout and din the rank's shards: the output
 * gradient gathered whole for the row products (the backward of their
 * reduce-scatter), each column product's partial input gradient
 * reduce-scattered to the shard for its norm (the backward of the gather),
 * the residual stream's gradient on the shard. The norms' weight gradients of
 * the rank's rows are summed over the group (one all-reduce of 2C floats)
 * and then added to g, so they are the whole sequence's on every rank as
 * without sequence parallelism. gw (the products' weight gradients) NULL: B
 * of split backward, which leaves the gradients W reads in w (dout and dres2
 * whole, the norms' summed gradients at dln1 and dln2, C floats each); else
 * w is NULL and scratch holds them. Scratch: block_grads (dres2 and dln
 * whole), then the staging [N, C], the shards of dres2 and of a norm's
 * output gradient [Ns, C], the norms' gradients [2C]. */
static cdp_status backward_seq(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                               float *const *g, const float *x, const struct block_acts *a,
                               const struct block_wstate *w, const float *dout, float *din, float *scratch_,
                               const struct dims *d, int B)
{
    const int N = d->N, Ns = d->Ns, C = d->C, A = d->A, KVD = d->KVD, H = d->H;
    const size_t NC = (size_t)N * C, NHd = (size_t)N * H, NA = (size_t)N * A, SC = (size_t)Ns * C;
    struct block_grads s = grads_layout(scratch_, d);
    float *stage = s.att_scratch + (size_t)d->T * d->T, *dres2s = stage + NC, *dlns = dres2s + SC;
    float *ng = dlns + SC; /* input_layernorm's weight gradient, then post_attention_layernorm's */
    float *const gz[CDP_UNIT_MAX_PARAMS] = {NULL};
    if (!g) g = gz;
    /* the whole gradients W reads: in the W-state under split backward, else in scratch */
    float *dfull = w ? w->dout : s.dres2, *dres2 = w ? w->dres2 : s.dres2;
    float *dgate = w ? w->dgate : s.dgate, *dup = w ? w->dup : s.dup;
    float *dq = w ? w->dq : s.dq, *dk = w ? w->dk : s.dk, *dv = w ? w->dv : s.dv;
    cdp_status st;
    if ((st = cdp_unit_seq_gather(k, u, dout, dfull, stage, B, d->T, C))) return st;
    K(copy, dres2s, dout, SC * sizeof *dres2s);
    K(zero, s.dhmid, NHd * sizeof *s.dhmid);
    K(linear_bwd, s.dhmid, g[8], NULL, dfull, a->hmid, p[8], N, H, C);
    K(zero, dgate, NHd * sizeof *dgate);
    K(zero, dup, NHd * sizeof *dup);
    K(swiglu_bwd, dgate, dup, s.dhmid, a->gate, a->up, NHd);
    K(zero, s.dln, NC * sizeof *s.dln);
    K(linear_bwd, s.dln, g[6], NULL, dgate, a->ln2, p[6], N, C, H);
    K(linear_bwd, s.dln, g[7], NULL, dup, a->ln2, p[7], N, C, H);
    if ((st = cdp_unit_seq_scatter(k, u, s.dln, dlns, stage, B, d->T, C))) return st;
    K(zero, ng, 2 * (size_t)C * sizeof *ng);
    K(rmsnorm_bwd, dres2s, ng + C, dlns, a->res2, p[5], a->rstd2, Ns, C);
    if ((st = cdp_unit_seq_gather(k, u, dres2s, dres2, stage, B, d->T, C))) return st;
    K(zero, s.datty, NA * sizeof *s.datty);
    K(linear_bwd, s.datty, g[4], NULL, dres2, a->atty, p[4], N, A, C);
    K(zero, s.dqkv, 3 * NA * sizeof *s.dqkv);
    K(attention_bwd, s.dqkv, s.datty, a->qkv, a->att, s.att_scratch, B, d->T, A, d->NH, 1);
    K(zero, dq, NA * sizeof *dq);
    K(zero, dk, (size_t)N * KVD * sizeof *dk);
    K(zero, dv, (size_t)N * KVD * sizeof *dv);
    K(rope_bwd, dq, dk, dv, s.dqkv, B, d->T, d->NH, d->NKV, d->HD, 0, u->desc.rope);
    K(zero, s.dln, NC * sizeof *s.dln);
    K(linear_bwd, s.dln, g[1], NULL, dq, a->ln1, p[1], N, C, A);
    K(linear_bwd, s.dln, g[2], NULL, dk, a->ln1, p[2], N, C, KVD);
    K(linear_bwd, s.dln, g[3], NULL, dv, a->ln1, p[3], N, C, KVD);
    if ((st = cdp_unit_seq_scatter(k, u, s.dln, dlns, stage, B, d->T, C))) return st;
    if (din) K(add, din, dres2s, SC);
    K(rmsnorm_bwd, din, ng, dlns, x, p[0], a->rstd1, Ns, C);
    if ((st = cdp_unit_tensor_sum(u, ng, 2 * (int64_t)C))) return st;
    if (w) {
        K(copy, w->dln1, ng, (size_t)C * sizeof *ng);
        K(copy, w->dln2, ng + C, (size_t)C * sizeof *ng);
    } else {
        K(add, g[0], ng, (size_t)C);
        K(add, g[5], ng + C, (size_t)C);
    }
    return CDP_OK;
}

static cdp_status backward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                           float *const *g, const void *in, const float *act, const float *tail,
                           const float *dout, float *din, float *scratch_, int B)
{
    const float *x = (const float *)in;
    const struct dims d = dims_of(u, B);
    const size_t NC = (size_t)d.N * d.C, NHd = (size_t)d.N * d.H, NK = (size_t)d.N * d.KVD,
                 NA = (size_t)d.N * d.A;
    struct block_acts a = block_layout((float *)act, (float *)tail, &d);
    if (u->seq_parallel) return backward_seq(k, u, p, g, x, &a, NULL, dout, din, scratch_, &d, B);
    struct block_grads s = grads_layout(scratch_, &d);
    cdp_status st;
    K(copy, s.dres2, dout, NC * sizeof *s.dres2);
    K(zero, s.dhmid, NHd * sizeof *s.dhmid);
    K(linear_bwd, s.dhmid, g[8], NULL, dout, a.hmid, p[8], d.N, d.H, d.C);
    K(zero, s.dgate, 2 * NHd * sizeof *s.dgate); /* dgate and dup */
    K(swiglu_bwd, s.dgate, s.dup, s.dhmid, a.gate, a.up, NHd);
    K(zero, s.dln, NC * sizeof *s.dln);
    K(linear_bwd, s.dln, g[6], NULL, s.dgate, a.ln2, p[6], d.N, d.C, d.H);
    K(linear_bwd, s.dln, g[7], NULL, s.dup, a.ln2, p[7], d.N, d.C, d.H);
    if ((st = cdp_unit_tensor_sum(u, s.dln, (int64_t)NC))) return st;
    K(rmsnorm_bwd, s.dres2, g[5], s.dln, a.res2, p[5], a.rstd2, d.N, d.C);
    K(zero, s.datty, NA * sizeof *s.datty);
    K(linear_bwd, s.datty, g[4], NULL, s.dres2, a.atty, p[4], d.N, d.A, d.C);
    K(zero, s.dqkv, 3 * NA * sizeof *s.dqkv);
    K(attention_bwd, s.dqkv, s.datty, a.qkv, a.att, s.att_scratch, B, d.T, d.A, d.NH, 1);
    K(zero, s.dq, (NA + 2 * NK) * sizeof *s.dq); /* dq, dk, dv */
    K(rope_bwd, s.dq, s.dk, s.dv, s.dqkv, B, d.T, d.NH, d.NKV, d.HD, 0, u->desc.rope);
    K(zero, s.dln, NC * sizeof *s.dln);
    K(linear_bwd, s.dln, g[1], NULL, s.dq, a.ln1, p[1], d.N, d.C, d.A);
    K(linear_bwd, s.dln, g[2], NULL, s.dk, a.ln1, p[2], d.N, d.C, d.KVD);
    K(linear_bwd, s.dln, g[3], NULL, s.dv, a.ln1, p[3], d.N, d.C, d.KVD);
    if ((st = cdp_unit_tensor_sum(u, s.dln, (int64_t)NC))) return st;
    if (din) {
        K(add, din, s.dres2, NC);
        K(rmsnorm_bwd, din, g[0], s.dln, x, p[0], a.rstd1, d.N, d.C);
    } else {
        /* no input gradient wanted: still accumulate the norm's weight gradient */
        K(rmsnorm_bwd, NULL, g[0], s.dln, x, p[0], a.rstd1, d.N, d.C);
    }
    return CDP_OK;
}

/* B: backward's input-gradient calls in its order, the weight outputs NULL,
 * with the gradients W reads written in the W-state rather than scratch. */
static cdp_status backward_input(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                 const void *in, const float *act, const float *tail, const float *dout,
                                 float *din, float *ws, float *scratch_, int B)
{
    const float *x = (const float *)in;
    const struct dims d = dims_of(u, B);
    const size_t NC = (size_t)d.N * d.C, NHd = (size_t)d.N * d.H, NA = (size_t)d.N * d.A;
    struct block_acts a = block_layout((float *)act, (float *)tail, &d);
    struct block_grads s = grads_layout(scratch_, &d);
    struct block_wstate w = block_wstate(ws, &d);
    if (u->seq_parallel) return backward_seq(k, u, p, NULL, x, &a, &w, dout, din, scratch_, &d, B);
    cdp_status st;
    K(copy, w.dout, dout, NC * sizeof *w.dout);
    K(copy, w.dres2, dout, NC * sizeof *w.dres2);
    K(zero, s.dhmid, NHd * sizeof *s.dhmid);
    K(linear_bwd, s.dhmid, NULL, NULL, dout, a.hmid, p[8], d.N, d.H, d.C);
    K(zero, w.dgate, 2 * NHd * sizeof *w.dgate); /* dgate and dup */
    K(swiglu_bwd, w.dgate, w.dup, s.dhmid, a.gate, a.up, NHd);
    K(zero, w.dln2, NC * sizeof *w.dln2);
    K(linear_bwd, w.dln2, NULL, NULL, w.dgate, a.ln2, p[6], d.N, d.C, d.H);
    K(linear_bwd, w.dln2, NULL, NULL, w.dup, a.ln2, p[7], d.N, d.C, d.H);
    if ((st = cdp_unit_tensor_sum(u, w.dln2, (int64_t)NC))) return st;
    K(rmsnorm_bwd, w.dres2, NULL, w.dln2, a.res2, p[5], a.rstd2, d.N, d.C);
    K(zero, s.datty, NA * sizeof *s.datty);
    K(linear_bwd, s.datty, NULL, NULL, w.dres2, a.atty, p[4], d.N, d.A, d.C);
    K(zero, s.dqkv, 3 * NA * sizeof *s.dqkv);
    K(attention_bwd, s.dqkv, s.datty, a.qkv, a.att, s.att_scratch, B, d.T, d.A, d.NH, 1);
    K(zero, w.dq, (NA + 2 * (size_t)d.N * d.KVD) * sizeof *w.dq); /* dq, dk, dv */
    K(rope_bwd, w.dq, w.dk, w.dv, s.dqkv, B, d.T, d.NH, d.NKV, d.HD, 0, u->desc.rope);
    K(zero, w.dln1, NC * sizeof *w.dln1);
    K(linear_bwd, w.dln1, NULL, NULL, w.dq, a.ln1, p[1], d.N, d.C, d.A);
    K(linear_bwd, w.dln1, NULL, NULL, w.dk, a.ln1, p[2], d.N, d.C, d.KVD);
    K(linear_bwd, w.dln1, NULL, NULL, w.dv, a.ln1, p[3], d.N, d.C, d.KVD);
    if ((st = cdp_unit_tensor_sum(u, w.dln1, (int64_t)NC))) return st;
    if (din) {
        K(add, din, w.dres2, NC);
        K(rmsnorm_bwd, din, NULL, w.dln1, x, p[0], a.rstd1, d.N, d.C);
    }
    return CDP_OK;
}

/* W: each parameter's call of backward, din NULL, from the W-state. */
static cdp_status backward_weight(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                  float *const *g, const void *in, const float *act, const float *tail,
                                  const float *dout, const float *ws, float *scratch_, int B)
{
    (void)dout, (void)scratch_;
    const float *x = (const float *)in;
    const struct dims d = dims_of(u, B);
    struct block_acts a = block_layout((float *)act, (float *)tail, &d);
    struct block_wstate w = block_wstate((float *)ws, &d);
    if (u->seq_parallel) { /* the products' from the whole gradients, the norms' as B summed them */
        K(linear_bwd, NULL, g[8], NULL, w.dout, a.hmid, p[8], d.N, d.H, d.C);
        K(linear_bwd, NULL, g[6], NULL, w.dgate, a.ln2, p[6], d.N, d.C, d.H);
        K(linear_bwd, NULL, g[7], NULL, w.dup, a.ln2, p[7], d.N, d.C, d.H);
        K(add, g[5], w.dln2, (size_t)d.C);
        K(linear_bwd, NULL, g[4], NULL, w.dres2, a.atty, p[4], d.N, d.A, d.C);
        K(linear_bwd, NULL, g[1], NULL, w.dq, a.ln1, p[1], d.N, d.C, d.A);
        K(linear_bwd, NULL, g[2], NULL, w.dk, a.ln1, p[2], d.N, d.C, d.KVD);
        K(linear_bwd, NULL, g[3], NULL, w.dv, a.ln1, p[3], d.N, d.C, d.KVD);
        K(add, g[0], w.dln1, (size_t)d.C);
        return CDP_OK;
    }
    K(linear_bwd, NULL, g[8], NULL, w.dout, a.hmid, p[8], d.N, d.H, d.C);
    K(linear_bwd, NULL, g[6], NULL, w.dgate, a.ln2, p[6], d.N, d.C, d.H);
    K(linear_bwd, NULL, g[7], NULL, w.dup, a.ln2, p[7], d.N, d.C, d.H);
    K(rmsnorm_bwd, NULL, g[5], w.dln2, a.res2, p[5], a.rstd2, d.N, d.C);
    K(linear_bwd, NULL, g[4], NULL, w.dres2, a.atty, p[4], d.N, d.A, d.C);
    K(linear_bwd, NULL, g[1], NULL, w.dq, a.ln1, p[1], d.N, d.C, d.A);
    K(linear_bwd, NULL, g[2], NULL, w.dk, a.ln1, p[2], d.N, d.C, d.KVD);
    K(linear_bwd, NULL, g[3], NULL, w.dv, a.ln1, p[3], d.N, d.C, d.KVD);
    K(rmsnorm_bwd, NULL, g[0], w.dln1, x, p[0], a.rstd1, d.N, d.C);
    return CDP_OK;
}

/* Decoding: keys (rotated at their positions) and values of every
 * position, [context, kv_heads x head width] each, then the rotary
 * frequencies of a head (kernels/rope.h); the MLP's gate and up rows, 2
 * hidden wide. Parameters as build() lays them: input_layernorm, q, k, v, o
 * projections, post_attention_layernorm, gate, up, down. */
static cdp_status decode_size(const struct cdp_unit *u, int64_t context, int64_t *cache, int64_t *row,
                              int64_t *logits)
{
    const int64_t C = cdp_shape_last(&u->in), HD = C / u->desc.heads, KVD = HD * u->desc.kv_heads;
    *cache = 2 * context * KVD + HD / 2;
    *row = 2 * u->desc.hidden;
    *logits = 0;
    return CDP_OK;
}

static cdp_status decode(const struct cdp_unit *u, float *const *p, const struct cdp_decode *d, float *cache)
{
    const int64_t C = d->C, n = d->n, NH = u->desc.heads, NKV = u->desc.kv_heads, HD = C / NH, KVD = HD * NKV,
                  H = u->desc.hidden, half = HD / 2;
    const float eps = (float)u->desc.eps;
    float *kc = cache, *vc = kc + d->context * KVD, *inv_freq = vc + d->context * KVD;
    for (int64_t i = 0; i < half; i++) inv_freq[i] = cdp_rope_inv_freq(&u->desc.rope, (int)i, (int)HD);
    float *q = d->qkv, *k = q + n * C, *v = k + n * KVD;
    cdp_cpu_rmsnorm_fwd(d->ln, d->rstd, d->x, p[0], (int)n, (int)C, eps);
    cdp_decode_linear(q, d->ln, p[1], NULL, n, C, C, 0);
    cdp_decode_linear(k, d->ln, p[2], NULL, n, C, KVD, 0);
    cdp_decode_linear(v, d->ln, p[3], NULL, n, C, KVD, 0);
    for (int64_t r = 0; r < n; r++) {
        float *qr = q + r * C, *kr = k + r * KVD;
        for (int64_t i = 0; i < half; i++) {
            const float a = (float)(d->pos + r) * inv_freq[i], c = cosf(a), sn = sinf(a);
            for (int64_t h = 0; h < NH; h++) {
                const float x1 = qr[h * HD + i], x2 = qr[h * HD + i + half];
                qr[h * HD + i] = x1 * c - x2 * sn;
                qr[h * HD + i + half] = x2 * c + x1 * sn;
            }
            for (int64_t j = 0; j < NKV; j++) {
                const float x1 = kr[j * HD + i], x2 = kr[j * HD + i + half];
                kr[j * HD + i] = x1 * c - x2 * sn;
                kr[j * HD + i + half] = x2 * c + x1 * sn;
            }
        }
        memcpy(kc + (d->pos + r) * KVD, kr, (size_t)KVD * sizeof(float));
        memcpy(vc + (d->pos + r) * KVD, v + r * KVD, (size_t)KVD * sizeof(float));
    }
    cdp_decode_attend(d, kc, vc, NH, NKV, q, C, d->att);
    cdp_decode_linear(d->x, d->att, p[4], NULL, n, C, C, 1);
    cdp_cpu_rmsnorm_fwd(d->ln, d->rstd, d->x, p[5], (int)n, (int)C, eps);
    float *gate = d->fc, *up = gate + n * H;
    cdp_decode_linear(gate, d->ln, p[6], NULL, n, C, H, 0);
    cdp_decode_linear(up, d->ln, p[7], NULL, n, C, H, 0);
    cdp_cpu_swiglu_fwd(gate, gate, up, (size_t)(n * H));
    cdp_decode_linear(d->x, gate, p[8], NULL, n, H, C, 1);
    return CDP_OK;
}

const struct cdp_layer_def cdp_layer_llama_block = {
    .type = CDP_LAYER_LLAMA_BLOCK,
    .name = "llama_block",
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
