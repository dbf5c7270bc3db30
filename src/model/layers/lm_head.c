/* lm_head: a language model's final norm and vocabulary projection, [T, C]
 * -> [T, vocab] logits (the weight tied to the token embedding when the plan
 * says tie_embeddings). The norm is GPT-2's layernorm ("ln_f") or, with rms
 * set, Llama's RMS norm ("norm", eps from the desc). GPT presets only: a
 * layer list cannot name it. Kept: the logits, the normalised input, each
 * row's mean (layernorm) and 1/std.
 * Vocab-parallel over a tensor group of t (docs/parallelism.md): the norm is
 * replicated; rank k holds rows [k Vp/t, (k+1) Vp/t) of the projection (the
 * embedding's slice when tied; Vp the vocabulary padded up to a multiple of
 * t) and gives those logits, [T, Vp/t] (padding columns 0, left out of the
 * loss: the model's vocab-parallel cross-entropy, which never gathers
 * them); the normalised input's gradient is a partial sum, all-reduced
 * over the group before the norm's backward (in B under split backward).
 * Sequence parallel (cdp_unit_set_sequence_parallel): the input is the
 * rank's sequence shard [T/t, C]; the norm runs on it and its output is
 * gathered whole for the projection; backward reduce-scatters the
 * normalised input's gradient to the shard (instead of the all-reduce) and
 * sums the norm's parameter gradients of the rank's rows over the group. */
#include <cblas.h>

#include "kernels/cpu/ops.h" /* the decoder's CPU kernels */
#include "model/layers/common.h"

static const char *const keys[] = {NULL};

static int shape(const struct cdp_layer_desc *L, const struct cdp_shape *in, struct cdp_shape *out, char *why,
                 size_t cap)
{
    (void)why, (void)cap;
    *out = (struct cdp_shape){2, {in->d[0], L->vocab}};
    return 0;
}

static void build(struct cdp_unit *u, const struct cdp_model_desc *m)
{
    const int64_t C = cdp_shape_last(&u->in);
    if (u->desc.rms)
        cdp_unit_add_rmsnorm_param(u, "norm", C);
    else
        cdp_unit_add_norm_params(u, "ln_f", C);
    struct cdp_param_desc *w =
        cdp_unit_add_param(u, "lm_head.weight", 2, u->desc.vocab, C, 0, 0, CDP_INIT_NORMAL, 0.02f,
                           CDP_PARAM_WEIGHT);
    if (u->tp_size > 1) { /* this rank's vocabulary slice, as the embedding's */
        cdp_param_shard(u, u->n_params - 1, 0, u->tp_size, u->tp_index);
        u->out.d[1] = w->shape[0];
    }
    if (m->tie_embeddings) {
        w->tied_unit = 0;
        w->tied_param = 0;
        u->param_count -= cdp_param_slice_len(w) * C;
    }
}

/* The logits' width: the vocabulary, or at t > 1 this rank's padded slice. */
static int64_t width(const struct cdp_unit *u) { return cdp_shape_last(&u->out); }

/* Positions per sample: the input's, or t times its shard's. */
static int64_t seq_len(const struct cdp_unit *u) { return u->in.d[0] * (u->seq_parallel ? u->tp_size : 1); }

static void cost(struct cdp_unit *u)
{
    const int64_t T = u->in.d[0], C = u->in.d[1], V = width(u);
    u->fwd_flops = 2.0 * T * C * V;
    u->bwd_flops = 4.0 * T * C * V;
    u->act_floats = T * V + T * C + (u->desc.rms ? 1 : 2) * T;
    /* W: the head's dw += dlogits^T . ln, the norm's from dln (the W-state). The logits' gradient is not
     * kept: the model computes it again at W from the kept logits and targets (the loss's backward, the
     * same kernel on the same inputs), T x V floats a sample it would otherwise hold */
    u->bwd_weight_flops = 2.0 * T * C * V;
    u->wstate_floats = T * C;
}

/* Where the kept activations are: the logits, the normalised input, the
 * rows' mean (layernorm only) and 1/std. */
struct head_acts {
    float *logits, *ln, *mean, *rstd;
    int w; /* the projection's parameter index: after the norm's one or two */
};

static struct head_acts head_layout(const struct cdp_unit *u, const float *act, int B)
{
    const int64_t N = (int64_t)B * seq_len(u), C = u->in.d[1], V = width(u);
    struct head_acts h;
    h.logits = (float *)act;
    h.ln = h.logits + N * V;
    const int64_t S = u->seq_parallel ? N / u->tp_size : N; /* the norm's rows: the shard's */
    h.mean = u->desc.rms ? NULL : h.ln + N * C;
    h.rstd = h.ln + N * C + (u->desc.rms ? 0 : S);
    h.w = u->desc.rms ? 1 : 2;
    return h;
}

/* The norm's forward and backward (din, dweight and dbias may be NULL). */
static cdp_status norm_fwd(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                           const struct head_acts *h, const float *x, int N, int C)
{
    if (u->desc.rms) K(rmsnorm_fwd, h->ln, h->rstd, x, p[0], N, C, (float)u->desc.eps);
    else K(layernorm_fwd, h->ln, h->mean, h->rstd, x, p[0], p[1], N, C, 1e-5f);
    return CDP_OK;
}

static cdp_status norm_bwd(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p, float *din,
                           float *const *g, const float *dln, const struct head_acts *h, const float *x, int N, int C)
{
    if (u->desc.rms) K(rmsnorm_bwd, din, g ? g[0] : NULL, dln, x, p[0], h->rstd, N, C);
    else K(layernorm_bwd, din, g ? g[0] : NULL, g ? g[1] : NULL, dln, x, p[0], h->mean, h->rstd, N, C);
    return CDP_OK;
}

/* the normalised input's gradient, and a sink for the input's when unwanted;
 * sequence parallel, besides: the moves' staging [N, C], two shards [N/t,
 * C] and the norm's gradients [2C] */
static int64_t scratch(const struct cdp_unit *u, int B)
{
    const int64_t NC = (int64_t)B * seq_len(u) * u->in.d[1];
    return u->seq_parallel ? 3 * NC + 2 * NC / u->tp_size + 2 * u->in.d[1] : 2 * NC;
}

/* Sequence parallel forward: the norm on the shard (statistics of its rows),
 * its output gathered whole into the kept ln, the rank's logits from it. */
static cdp_status forward_seq(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p, const float *x,
                              float *act, float *scratch_, int B)
{
    const int T = (int)seq_len(u), C = (int)u->in.d[1], N = B * T, Ns = N / u->tp_size, V = (int)width(u);
    const struct head_acts h = head_layout(u, act, B);
    float *stage = scratch_, *sh = stage + (size_t)N * C;
    struct head_acts hs = h;
    hs.ln = sh;
    cdp_status st = norm_fwd(k, u, p, &hs, x, Ns, C);
    if (st) return st;
    if ((st = cdp_unit_seq_gather(k, u, sh, h.ln, stage, B, T, C))) return st;
    K(linear_fwd, act, h.ln, p[h.w], NULL, N, C, V);
    return CDP_OK;
}

/* Its backward: dln's partial sums reduce-scattered to the shard, the norm's
 * backward on the shard, its gradients summed over the group, then added. */
static cdp_status backward_seq(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                               float *const *g, const float *x, const float *act, const float *dout, float *din,
                               float *scratch_, int B)
{
    const int T = (int)seq_len(u), C = (int)u->in.d[1], N = B * T, Ns = N / u->tp_size, V = (int)width(u);
    const struct head_acts h = head_layout(u, act, B);
    const int nn = u->desc.rms ? 1 : 2; /* the norm's parameters */
    float *dln = scratch_, *stage = dln + (size_t)N * C, *dlns = stage + (size_t)N * C, *sink = dlns + (size_t)Ns * C;
    float *ng = sink + (size_t)Ns * C;
    K(zero, dln, (size_t)N * C * sizeof *dln);
    K(linear_bwd, dln, g[h.w], NULL, dout, h.ln, p[h.w], N, C, V);
    cdp_status st = cdp_unit_seq_scatter(k, u, dln, dlns, stage, B, T, C);
    if (st) return st;
    float *target = din;
    if (!target) {
        target = sink;
        K(zero, target, (size_t)Ns * C * sizeof *target);
    }
    K(zero, ng, (size_t)nn * C * sizeof *ng);
    float *const gn[2] = {ng, ng + C};
    if ((st = norm_bwd(k, u, p, target, gn, dlns, &h, x, Ns, C))) return st;
    if ((st = cdp_unit_tensor_sum(u, ng, (int64_t)nn * C))) return st;
    for (int j = 0; j < nn; j++) K(add, g[j], ng + (size_t)j * C, (size_t)C);
    return CDP_OK;
}

static cdp_status forward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p, const void *in,
                          float *act, float *tail, float *scratch_, int B)
{
    (void)tail;
    if (u->seq_parallel) return forward_seq(k, u, p, (const float *)in, act, scratch_, B);
    const int T = (int)u->in.d[0], C = (int)u->in.d[1], N = B * T, V = (int)width(u);
    const struct head_acts h = head_layout(u, act, B);
    cdp_status st = norm_fwd(k, u, p, &h, (const float *)in, N, C);
    if (st) return st;
    K(linear_fwd, act, h.ln, p[h.w], NULL, N, C, V);
    return CDP_OK;
}

static cdp_status backward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                           float *const *g, const void *in, const float *act, const float *tail,
                           const float *dout, float *din, float *scratch_, int B)
{
    (void)tail;
    if (u->seq_parallel) return backward_seq(k, u, p, g, (const float *)in, act, dout, din, scratch_, B);
    const int T = (int)u->in.d[0], C = (int)u->in.d[1], N = B * T, V = (int)width(u);
    const struct head_acts h = head_layout(u, act, B);
    float *dln = scratch_;
    K(zero, dln, (size_t)N * C * sizeof *dln);
    K(linear_bwd, dln, g[h.w], NULL, dout, h.ln, p[h.w], N, C, V);
    cdp_status st = cdp_unit_tensor_sum(u, dln, (int64_t)N * C); /* vocab-parallel: the slices' parts */
    if (st) return st;
    float *target = din;
    if (!target) {
        target = dln + (int64_t)N * C;
        K(zero, target, (size_t)N * C * sizeof *target);
    }
    return norm_bwd(k, u, p, target, g, dln, &h, (const float *)in, N, C);
}

/* B: dln (the W-state) with the head's weight output NULL, then din through
 * the norm with its weight outputs NULL (nothing when din is not wanted) */
static cdp_status backward_input(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                 const void *in, const float *act, const float *tail, const float *dout,
                                 float *din, float *ws, float *scratch_, int B)
{
    (void)tail;
    if (u->seq_parallel) { /* backward_seq into the W-state: the norm's gradients, summed over the group */
        const int nn = u->desc.rms ? 1 : 2;
        float *gw[CDP_UNIT_MAX_PARAMS] = {ws, ws + u->in.d[1]};
        gw[(u->desc.rms ? 1 : 2)] = NULL; /* the projection's: W's */
        K(zero, ws, (size_t)nn * u->in.d[1] * sizeof *ws);
        return backward_seq(k, u, p, gw, (const float *)in, act, dout, din, scratch_, B);
    }
    const int T = (int)u->in.d[0], C = (int)u->in.d[1], N = B * T, V = (int)width(u);
    const struct head_acts h = head_layout(u, act, B);
    float *dln = ws;
    K(zero, dln, (size_t)N * C * sizeof *dln);
    K(linear_bwd, dln, NULL, NULL, dout, h.ln, p[h.w], N, C, V);
    /* vocab-parallel: the slices' parts summed here, in B, so that W (the norm's weights) has no collective */
    cdp_status st = cdp_unit_tensor_sum(u, dln, (int64_t)N * C);
    if (st) return st;
    return din ? norm_bwd(k, u, p, din, NULL, dln, &h, (const float *)in, N, C) : CDP_OK;
}

/* W: the head's dw from dout (the logits' gradient again: weight_takes_dout)
 * and the norm's from dln, din NULL */
static cdp_status backward_weight(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                  float *const *g, const void *in, const float *act, const float *tail,
                                  const float *dout, const float *ws, float *scratch_, int B)
{
    (void)tail, (void)scratch_;
    const int T = (int)seq_len(u), C = (int)u->in.d[1], N = B * T, V = (int)width(u);
    const struct head_acts h = head_layout(u, act, B);
    K(linear_bwd, NULL, g[h.w], NULL, dout, h.ln, p[h.w], N, C, V);
    if (u->seq_parallel) { /* the norm's, as B left them */
        for (int j = 0; j < h.w; j++) K(add, g[j], ws + (size_t)j * C, (size_t)C);
        return CDP_OK;
    }
    return norm_bwd(k, u, p, NULL, g, ws, &h, (const float *)in, N, C);
}

/* Decoding: the logits of the last new position, no cache. */
static cdp_status decode_size(const struct cdp_unit *u, int64_t context, int64_t *cache, int64_t *row,
                              int64_t *logits)
{
    (void)context;
    *cache = *row = 0;
    *logits = u->params[u->n_params - 1].shape[0];
    return CDP_OK;
}

static cdp_status decode(const struct cdp_unit *u, float *const *p, const struct cdp_decode *d, float *cache)
{
    (void)cache;
    const int64_t C = d->C, V = u->params[u->n_params - 1].shape[0];
    const float *last = d->x + (d->n - 1) * C;
    if (u->desc.rms) cdp_cpu_rmsnorm_fwd(d->ln, d->rstd, last, p[0], 1, (int)C, (float)u->desc.eps);
    else cdp_cpu_layernorm_fwd(d->ln, d->mean, d->rstd, last, p[0], p[1], 1, (int)C, 1e-5f);
    cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)V, (int)C, 1.0f, p[u->n_params - 1], (int)C, d->ln, 1, 0.0f,
                d->logits, 1);
    return CDP_OK;
}

const struct cdp_layer_def cdp_layer_lm_head = {
    .type = CDP_LAYER_LM_HEAD,
    .name = "lm_head",
    .listable = 0,
    .tensor_ok = 1,
    .tensor_splits = 1, /* vocab-parallel, its norm replicated */
    .vocab_parallel = 1,
    .keys = keys,
    .shape = shape,
    .build = build,
    .cost = cost,
    .scratch = scratch,
    .forward = forward,
    .backward = backward,
    .backward_input = backward_input,
    .backward_weight = backward_weight,
    .weight_takes_dout = 1,
    .decode_size = decode_size,
    .decode = decode,
};
