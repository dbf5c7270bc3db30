/* The layer table and the per-unit forward/backward passes over a device's
 * kernel table. Shapes: B batch, T tokens, C channels, V vocabulary, NH heads. */
#include "model/layers.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "core/hash.h"
#include "kernels/cpu/ops.h" /* cdp_cpu_attention_gemm_flops: the work table */
#include "kernels/ops.h"

static const char *const cdp_unit_kind_names[CDP_UNIT_KIND_COUNT] = {
    [CDP_UNIT_LINEAR] = "linear",
    [CDP_UNIT_RELU] = "relu",
    [CDP_UNIT_GELU] = "gelu",
    [CDP_UNIT_LAYERNORM] = "layernorm",
    [CDP_UNIT_EMBEDDING] = "embedding",
    [CDP_UNIT_ATTENTION] = "attention",
    [CDP_UNIT_TRANSFORMER_BLOCK] = "transformer_block",
    [CDP_UNIT_CONV2D] = "conv2d",
    [CDP_UNIT_MAXPOOL2D] = "maxpool2d",
    [CDP_UNIT_FLATTEN] = "flatten",
    [CDP_UNIT_LM_HEAD] = "lm_head",
};

const char *cdp_unit_kind_name(enum cdp_unit_kind k)
{
    return (unsigned)k < CDP_UNIT_KIND_COUNT ? cdp_unit_kind_names[k] : "?";
}

static int64_t shape_numel(const struct cdp_shape *s)
{
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++) n *= s->d[i];
    return n;
}

/* Rows of a last-dimension op: everything but the last dimension. */
static int64_t shape_rows(const struct cdp_shape *s)
{
    return s->ndim ? shape_numel(s) / s->d[s->ndim - 1] : 1;
}

static int64_t shape_last(const struct cdp_shape *s) { return s->ndim ? s->d[s->ndim - 1] : 1; }

static struct cdp_param_desc *add_param(struct cdp_unit *u, const char *name, int ndim,
                                        int64_t d0, int64_t d1, int64_t d2, int64_t d3,
                                        enum cdp_init init, float scale, int decay)
{
    CDP_ASSERT(u->n_params < CDP_UNIT_MAX_PARAMS);
    struct cdp_param_desc *p = &u->params[u->n_params++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    int64_t d[4] = {d0, d1, d2, d3};
    p->ndim = ndim;
    p->numel = 1;
    for (int i = 0; i < ndim; i++) {
        p->shape[i] = d[i];
        p->numel *= d[i];
    }
    p->init = init;
    p->init_scale = scale;
    p->decay = decay;
    p->tied_unit = -1;
    p->tied_param = -1;
    u->param_count += p->numel;
    return p;
}

/* PyTorch's default for Linear/Conv2d: U(-1/sqrt(fan_in), 1/sqrt(fan_in)). */
static void add_linear_params(struct cdp_unit *u, const char *prefix, int64_t out, int64_t in,
                              int bias, int gpt, float gpt_std)
{
    char name[24];
    float bound = 1.0f / sqrtf((float)in);
    snprintf(name, sizeof name, "%s%sweight", prefix, *prefix ? "." : "");
    add_param(u, name, 2, out, in, 0, 0, gpt ? CDP_INIT_NORMAL : CDP_INIT_UNIFORM,
              gpt ? gpt_std : bound, 1);
    if (bias) {
        snprintf(name, sizeof name, "%s%sbias", prefix, *prefix ? "." : "");
        add_param(u, name, 1, out, 0, 0, 0, gpt ? CDP_INIT_ZERO : CDP_INIT_UNIFORM,
                  gpt ? 0.0f : bound, 0);
    }
}

static void add_norm_params(struct cdp_unit *u, const char *prefix, int64_t C)
{
    char name[24];
    snprintf(name, sizeof name, "%s%sweight", prefix, *prefix ? "." : "");
    add_param(u, name, 1, C, 0, 0, 0, CDP_INIT_ONE, 0.0f, 0);
    snprintf(name, sizeof name, "%s%sbias", prefix, *prefix ? "." : "");
    add_param(u, name, 1, C, 0, 0, 0, CDP_INIT_ZERO, 0.0f, 0);
}

/* Work of attention over [T, C]: the kernel's own count of its GEMMs, which
 * skip the masked blocks of causal attention. */
static double attn_fwd_flops(int64_t T, int64_t C, int causal)
{
    return cdp_cpu_attention_gemm_flops((int)T, (int)C, causal, 0);
}
static double attn_bwd_flops(int64_t T, int64_t C, int causal)
{
    return cdp_cpu_attention_gemm_flops((int)T, (int)C, causal, 1);
}

static void finish_unit(struct cdp_unit *u)
{
    const struct cdp_layer_desc *d = &u->desc;
    const int64_t rows = shape_rows(&u->in), last = shape_last(&u->in);
    u->out_floats = shape_numel(&u->out);
    switch (u->kind) {
    case CDP_UNIT_LINEAR:
        u->fwd_flops = 2.0 * rows * last * d->out;
        u->bwd_flops = 4.0 * rows * last * d->out;
        u->act_floats = u->out_floats;
        break;
    case CDP_UNIT_RELU:
    case CDP_UNIT_GELU:
    case CDP_UNIT_FLATTEN:
    case CDP_UNIT_EMBEDDING:
    case CDP_UNIT_CONV2D:
        u->act_floats = u->out_floats;
        if (u->kind == CDP_UNIT_CONV2D) {
            double gemm = 2.0 * d->out * (double)(u->in.d[0] * d->kernel * d->kernel) *
                          (double)(u->out.d[1] * u->out.d[2]);
            u->fwd_flops = gemm;
            u->bwd_flops = 2.0 * gemm;
        }
        break;
    case CDP_UNIT_LAYERNORM:
        u->act_floats = u->out_floats + 2 * rows;
        break;
    case CDP_UNIT_MAXPOOL2D:
        u->act_floats = 2 * u->out_floats; /* output + argmax */
        break;
    case CDP_UNIT_ATTENTION: {
        int64_t T = u->in.d[0], C = u->in.d[1];
        u->fwd_flops = 8.0 * T * C * C + attn_fwd_flops(T, C, d->causal);
        u->bwd_flops = 16.0 * T * C * C + attn_bwd_flops(T, C, d->causal);
        u->att_floats = d->heads * T * T;
        u->act_floats = 3 * T * C + u->att_floats + T * C + T * C;
        break;
    }
    case CDP_UNIT_TRANSFORMER_BLOCK: {
        int64_t T = u->in.d[0], C = u->in.d[1];
        u->fwd_flops = 24.0 * T * C * C + attn_fwd_flops(T, C, 1);
        u->bwd_flops = 48.0 * T * C * C + attn_bwd_flops(T, C, 1);
        u->att_floats = d->heads * T * T;
        u->act_floats = 16 * T * C + 4 * T + u->att_floats;
        break;
    }
    case CDP_UNIT_LM_HEAD: {
        int64_t T = u->in.d[0], C = u->in.d[1], V = d->vocab;
        u->fwd_flops = 2.0 * T * C * V;
        u->bwd_flops = 4.0 * T * C * V;
        u->act_floats = T * V + T * C + 2 * T;
        break;
    }
    default:
        break;
    }
}

int64_t cdp_unit_scratch_floats(const struct cdp_unit *u, int B)
{
    switch (u->kind) {
    case CDP_UNIT_CONV2D:
        /* one image's im2col matrix */
        return u->in.d[0] * u->desc.kernel * u->desc.kernel * u->out.d[1] * u->out.d[2];
    case CDP_UNIT_ATTENTION: {
        int64_t T = u->in.d[0], C = u->in.d[1];
        return (int64_t)B * (3 * T * C + T * C) + T * T;
    }
    case CDP_UNIT_TRANSFORMER_BLOCK: {
        int64_t T = u->in.d[0], C = u->in.d[1];
        /* forward: one C-wide projection; backward: dres2, dg, dfch, dln, dqkv, T x T */
        return (int64_t)B * 13 * T * C + T * T;
    }
    case CDP_UNIT_LM_HEAD:
        /* the normalised input's gradient, and a sink for the input's when unwanted */
        return (int64_t)B * 2 * u->in.d[0] * u->in.d[1];
    case CDP_UNIT_LAYERNORM:
        return (int64_t)B * shape_numel(&u->in);
    default:
        return 0;
    }
}

void cdp_unit_fit_kernels(struct cdp_unit *u, const struct cdp_kernels *k, int B)
{
    if (u->kind != CDP_UNIT_ATTENTION && u->kind != CDP_UNIT_TRANSFORMER_BLOCK) return;
    if (!k->ops->attention_state_floats || B < 1) return;
    const size_t n = k->ops->attention_state_floats(k->st, B, (int)u->in.d[0], (int)u->in.d[1], (int)u->desc.heads);
    const int64_t per = (int64_t)((n + (size_t)B - 1) / (size_t)B);
    if (per >= u->att_floats) return;
    u->act_floats -= u->att_floats - per;
    u->att_floats = per;
}

/* The parameters of a GPT-2 block of width C: residual projections start at proj_std. */
static void add_block_params(struct cdp_unit *u, int64_t C, float proj_std)
{
    add_norm_params(u, "ln_1", C);
    add_linear_params(u, "attn.c_attn", 3 * C, C, 1, 1, 0.02f);
    add_linear_params(u, "attn.c_proj", C, C, 1, 1, proj_std);
    add_norm_params(u, "ln_2", C);
    add_linear_params(u, "mlp.c_fc", 4 * C, C, 1, 1, 0.02f);
    add_linear_params(u, "mlp.c_proj", C, 4 * C, 1, 1, proj_std);
}

static void gpt_units(const struct cdp_model_desc *m, struct cdp_unit *units)
{
    const int64_t T = m->context, C = m->embed, V = m->vocab, L = m->layers;
    const float proj_std = 0.02f / sqrtf(2.0f * (float)L);
    struct cdp_unit *u = &units[0];
    u->kind = CDP_UNIT_EMBEDDING;
    u->desc.type = CDP_LAYER_EMBEDDING;
    u->desc.vocab = V;
    u->desc.dim = C;
    u->desc.context = T;
    u->in = (struct cdp_shape){1, {T}};
    u->in_tokens = 1;
    u->out = (struct cdp_shape){2, {T, C}};
    add_param(u, "wte", 2, V, C, 0, 0, CDP_INIT_NORMAL, 0.02f, 1);
    add_param(u, "wpe", 2, T, C, 0, 0, CDP_INIT_NORMAL, 0.01f, 1);
    for (int64_t l = 0; l < L; l++) {
        u = &units[1 + l];
        u->kind = CDP_UNIT_TRANSFORMER_BLOCK;
        u->desc.type = CDP_LAYER_TRANSFORMER_BLOCK;
        u->desc.heads = m->heads;
        u->in = u->out = (struct cdp_shape){2, {T, C}};
        add_block_params(u, C, proj_std);
    }
    u = &units[1 + L];
    u->kind = CDP_UNIT_LM_HEAD;
    u->desc.vocab = V;
    u->in = (struct cdp_shape){2, {T, C}};
    u->out = (struct cdp_shape){2, {T, V}};
    add_norm_params(u, "ln_f", C);
    struct cdp_param_desc *w = add_param(u, "lm_head.weight", 2, V, C, 0, 0, CDP_INIT_NORMAL, 0.02f, 1);
    if (m->tie_embeddings) {
        w->tied_unit = 0;
        w->tied_param = 0;
        u->param_count -= w->numel;
    }
}

static void list_unit(struct cdp_unit *u, const struct cdp_layer_desc *d, struct cdp_shape in)
{
    u->desc = *d;
    u->in = in;
    u->out = in;
    const int64_t last = shape_last(&in);
    switch (d->type) {
    case CDP_LAYER_LINEAR:
        u->kind = CDP_UNIT_LINEAR;
        u->out.d[in.ndim - 1] = d->out;
        add_linear_params(u, "", d->out, last, d->bias, 0, 0.0f);
        break;
    case CDP_LAYER_RELU:
        u->kind = CDP_UNIT_RELU;
        break;
    case CDP_LAYER_GELU:
        u->kind = CDP_UNIT_GELU;
        break;
    case CDP_LAYER_LAYERNORM:
        u->kind = CDP_UNIT_LAYERNORM;
        add_norm_params(u, "", last);
        break;
    case CDP_LAYER_EMBEDDING:
        u->kind = CDP_UNIT_EMBEDDING;
        u->in_tokens = 1;
        u->out = (struct cdp_shape){2, {in.d[0], d->dim}};
        add_param(u, "wte", 2, d->vocab, d->dim, 0, 0, CDP_INIT_NORMAL, 1.0f, 1);
        if (d->context > 0) add_param(u, "wpe", 2, d->context, d->dim, 0, 0, CDP_INIT_NORMAL, 1.0f, 1);
        break;
    case CDP_LAYER_ATTENTION:
        u->kind = CDP_UNIT_ATTENTION;
        add_linear_params(u, "c_attn", 3 * last, last, 1, 0, 0.0f);
        add_linear_params(u, "c_proj", last, last, 1, 0, 0.0f);
        break;
    case CDP_LAYER_TRANSFORMER_BLOCK:
        u->kind = CDP_UNIT_TRANSFORMER_BLOCK;
        add_block_params(u, last, 0.02f);
        break;
    case CDP_LAYER_CONV2D: {
        u->kind = CDP_UNIT_CONV2D;
        int64_t K = d->kernel, S = d->stride, P = d->padding;
        u->out = (struct cdp_shape){3, {d->out, (in.d[1] + 2 * P - K) / S + 1, (in.d[2] + 2 * P - K) / S + 1}};
        float bound = 1.0f / sqrtf((float)(in.d[0] * K * K));
        add_param(u, "weight", 4, d->out, in.d[0], K, K, CDP_INIT_UNIFORM, bound, 1);
        if (d->bias) add_param(u, "bias", 1, d->out, 0, 0, 0, CDP_INIT_UNIFORM, bound, 0);
        break;
    }
    case CDP_LAYER_MAXPOOL2D: {
        u->kind = CDP_UNIT_MAXPOOL2D;
        int64_t K = d->kernel, S = d->stride;
        u->out = (struct cdp_shape){3, {in.d[0], (in.d[1] - K) / S + 1, (in.d[2] - K) / S + 1}};
        break;
    }
    case CDP_LAYER_FLATTEN:
        u->kind = CDP_UNIT_FLATTEN;
        u->out = (struct cdp_shape){1, {shape_numel(&in)}};
        break;
    default:
        CDP_ASSERT(!"unknown layer type");
    }
}

cdp_status cdp_units_build(const struct cdp_model_desc *m, struct cdp_unit **out, int *n)
{
    int count = m->kind == CDP_MODEL_GPT ? (int)m->layers + 2 : m->n_layers;
    struct cdp_unit *units = calloc((size_t)count, sizeof *units);
    if (!units) return cdp_fail(CDP_ERR_NOMEM, "out of memory for %d layer descriptions", count);
    if (m->kind == CDP_MODEL_GPT) {
        gpt_units(m, units);
    } else {
        struct cdp_shape s = {m->input_ndim, {0}};
        for (int i = 0; i < m->input_ndim; i++) s.d[i] = m->input[i];
        for (int i = 0; i < count; i++) {
            list_unit(&units[i], &m->layer_list[i], s);
            s = units[i].out;
        }
    }
    for (int i = 0; i < count; i++) {
        units[i].index = i;
        units[i].T = m->kind == CDP_MODEL_GPT ? m->context
                   : (units[0].in_tokens ? units[0].in.d[0] : 0);
        finish_unit(&units[i]);
    }
    *out = units;
    *n = count;
    return CDP_OK;
}

/* ---- initialisation ------------------------------------------------------- */

static double uniform01(uint64_t *s) { return ((double)(cdp_splitmix64(s) >> 11) + 0.5) * 0x1p-53; }

void cdp_param_init(const struct cdp_unit *u, int p, uint64_t seed, float *dst)
{
    const struct cdp_param_desc *pd = &u->params[p];
    int owner = pd->tied_unit >= 0 ? pd->tied_unit : u->index;
    int pidx = pd->tied_unit >= 0 ? pd->tied_param : p;
    uint64_t s = seed * 0x100000001b3ull ^ ((uint64_t)owner << 20) ^ (uint64_t)pidx;
    cdp_splitmix64(&s);
    switch (pd->init) {
    case CDP_INIT_ZERO:
        memset(dst, 0, (size_t)pd->numel * sizeof *dst);
        break;
    case CDP_INIT_ONE:
        for (int64_t i = 0; i < pd->numel; i++) dst[i] = 1.0f;
        break;
    case CDP_INIT_UNIFORM:
        for (int64_t i = 0; i < pd->numel; i++)
            dst[i] = (float)((2.0 * uniform01(&s) - 1.0) * pd->init_scale);
        break;
    case CDP_INIT_NORMAL:
        for (int64_t i = 0; i < pd->numel; i += 2) {
            double r = sqrt(-2.0 * log(uniform01(&s))), th = 2.0 * M_PI * uniform01(&s);
            dst[i] = (float)(r * cos(th) * pd->init_scale);
            if (i + 1 < pd->numel) dst[i + 1] = (float)(r * sin(th) * pd->init_scale);
        }
        break;
    }
}

/* ---- forward and backward --------------------------------------------------- */

/* K(op, args...): op of the unit's kernel table; returns its failure. */
#define K(op, ...) CDP_KERNEL(k, op, __VA_ARGS__)

/* Offsets of a transformer block's kept activations, per micro-batch of B. */
struct block_acts {
    float *out, *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *res2, *ln2, *ln2_mean, *ln2_rstd,
        *fch, *fch_gelu;
};

static struct block_acts block_layout(float *a, int B, int64_t T, int64_t C, int64_t att_floats)
{
    struct block_acts r;
    const int64_t BT = (int64_t)B * T, BTC = BT * C;
    r.out = a;
    a += BTC;
    r.ln1 = a;
    a += BTC;
    r.ln1_mean = a;
    a += BT;
    r.ln1_rstd = a;
    a += BT;
    r.qkv = a;
    a += 3 * BTC;
    r.att = a;
    a += (int64_t)B * att_floats;
    r.atty = a;
    a += BTC;
    r.res2 = a;
    a += BTC;
    r.ln2 = a;
    a += BTC;
    r.ln2_mean = a;
    a += BT;
    r.ln2_rstd = a;
    a += BT;
    r.fch = a;
    a += 4 * BTC;
    r.fch_gelu = a;
    return r;
}

static cdp_status block_forward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                const float *x, float *act, float *scratch, int B)
{
    const int T = (int)u->in.d[0], C = (int)u->in.d[1], NH = (int)u->desc.heads, N = B * T;
    const size_t BTC = (size_t)N * C;
    struct block_acts a = block_layout(act, B, T, C, u->att_floats);
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

static cdp_status block_backward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                 float *const *g, const float *x, const float *act, const float *dout,
                                 float *din, float *scratch, int B)
{
    const int T = (int)u->in.d[0], C = (int)u->in.d[1], NH = (int)u->desc.heads, N = B * T;
    const size_t BTC = (size_t)N * C;
    struct block_acts a = block_layout((float *)act, B, T, C, u->att_floats);
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

cdp_status cdp_unit_forward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                            const void *in, float *act, float *scratch, int B)
{
    const float *x = (const float *)in;
    const int64_t n_in = (int64_t)B * shape_numel(&u->in);
    const int rows = (int)(B * shape_rows(&u->in)), last = (int)shape_last(&u->in);
    switch (u->kind) {
    case CDP_UNIT_LINEAR:
        K(linear_fwd, act, x, p[0], u->desc.bias ? p[1] : NULL, rows, last, (int)u->desc.out);
        break;
    case CDP_UNIT_RELU:
        K(relu_fwd, act, x, (size_t)n_in);
        break;
    case CDP_UNIT_GELU:
        K(gelu_fwd, act, x, (size_t)n_in);
        break;
    case CDP_UNIT_FLATTEN:
        K(copy, act, x, (size_t)n_in * sizeof *act);
        break;
    case CDP_UNIT_LAYERNORM: {
        float *mean = act + n_in, *rstd = mean + rows;
        K(layernorm_fwd, act, mean, rstd, x, p[0], p[1], rows, last, (float)u->desc.eps);
        break;
    }
    case CDP_UNIT_EMBEDDING:
        K(embedding_fwd, act, (const int32_t *)in, p[0], u->n_params > 1 ? p[1] : NULL, B, (int)u->in.d[0],
          (int)u->out.d[1]);
        break;
    case CDP_UNIT_ATTENTION: {
        const int T = (int)u->in.d[0], C = (int)u->in.d[1], N = B * T;
        float *qkv = act + (int64_t)N * C, *att = qkv + 3 * (int64_t)N * C,
              *atty = att + (int64_t)B * u->att_floats;
        K(linear_fwd, qkv, x, p[0], p[1], N, C, 3 * C);
        K(attention_fwd, atty, att, qkv, B, T, C, (int)u->desc.heads, u->desc.causal);
        K(linear_fwd, act, atty, p[2], p[3], N, C, C);
        break;
    }
    case CDP_UNIT_TRANSFORMER_BLOCK:
        return block_forward(k, u, p, x, act, scratch, B);
    case CDP_UNIT_CONV2D:
        K(conv2d_fwd, act, scratch, x, p[0], u->desc.bias ? p[1] : NULL, B, (int)u->in.d[0], (int)u->in.d[1],
          (int)u->in.d[2], (int)u->desc.out, (int)u->desc.kernel, (int)u->desc.stride, (int)u->desc.padding);
        break;
    case CDP_UNIT_MAXPOOL2D:
        K(maxpool2d_fwd, act, (int32_t *)(act + B * u->out_floats), x, B, (int)u->in.d[0], (int)u->in.d[1],
          (int)u->in.d[2], (int)u->desc.kernel, (int)u->desc.stride);
        break;
    case CDP_UNIT_LM_HEAD: {
        const int T = (int)u->in.d[0], C = (int)u->in.d[1], N = B * T, V = (int)u->desc.vocab;
        float *ln = act + (int64_t)N * V, *mean = ln + (int64_t)N * C, *rstd = mean + N;
        K(layernorm_fwd, ln, mean, rstd, x, p[0], p[1], N, C, 1e-5f);
        K(linear_fwd, act, ln, p[2], NULL, N, C, V);
        break;
    }
    default:
        CDP_ASSERT(!"unknown unit kind");
    }
    return CDP_OK;
}

cdp_status cdp_unit_backward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                             float *const *g, const void *in, const float *act, const float *dout, float *din,
                             float *scratch, int B)
{
    const float *x = (const float *)in;
    const int64_t n_in = (int64_t)B * shape_numel(&u->in);
    const int rows = (int)(B * shape_rows(&u->in)), last = (int)shape_last(&u->in);
    switch (u->kind) {
    case CDP_UNIT_LINEAR:
        K(linear_bwd, din, g[0], u->desc.bias ? g[1] : NULL, dout, x, p[0], rows, last, (int)u->desc.out);
        break;
    case CDP_UNIT_RELU:
        if (din) K(relu_bwd, din, dout, x, (size_t)n_in);
        break;
    case CDP_UNIT_GELU:
        if (din) K(gelu_bwd, din, dout, x, (size_t)n_in);
        break;
    case CDP_UNIT_FLATTEN:
        /* the gradient passes through unchanged */
        if (din) K(add, din, dout, (size_t)n_in);
        break;
    case CDP_UNIT_LAYERNORM: {
        const float *mean = act + n_in, *rstd = mean + rows;
        float *target = din ? din : scratch;
        if (!din) K(zero, scratch, (size_t)n_in * sizeof *scratch);
        K(layernorm_bwd, target, g[0], g[1], dout, x, p[0], mean, rstd, rows, last);
        break;
    }
    case CDP_UNIT_EMBEDDING:
        K(embedding_bwd, g[0], u->n_params > 1 ? g[1] : NULL, dout, (const int32_t *)in, B, (int)u->in.d[0],
          (int)u->out.d[1]);
        break;
    case CDP_UNIT_ATTENTION: {
        const int T = (int)u->in.d[0], C = (int)u->in.d[1], N = B * T;
        const float *qkv = act + (int64_t)N * C, *att = qkv + 3 * (int64_t)N * C,
                    *atty = att + (int64_t)B * u->att_floats;
        float *datty = scratch, *dqkv = datty + (int64_t)N * C, *tt = dqkv + 3 * (int64_t)N * C;
        K(zero, datty, (size_t)N * C * sizeof *datty);
        K(linear_bwd, datty, g[2], g[3], dout, atty, p[2], N, C, C);
        K(zero, dqkv, (size_t)3 * N * C * sizeof *dqkv);
        K(attention_bwd, dqkv, datty, qkv, att, tt, B, T, C, (int)u->desc.heads, u->desc.causal);
        K(linear_bwd, din, g[0], g[1], dqkv, x, p[0], N, C, 3 * C);
        break;
    }
    case CDP_UNIT_TRANSFORMER_BLOCK:
        return block_backward(k, u, p, g, x, act, dout, din, scratch, B);
    case CDP_UNIT_CONV2D:
        K(conv2d_bwd, din, g[0], u->desc.bias ? g[1] : NULL, scratch, dout, x, p[0], B, (int)u->in.d[0],
          (int)u->in.d[1], (int)u->in.d[2], (int)u->desc.out, (int)u->desc.kernel, (int)u->desc.stride,
          (int)u->desc.padding);
        break;
    case CDP_UNIT_MAXPOOL2D:
        if (din)
            K(maxpool2d_bwd, din, dout, (const int32_t *)(act + B * u->out_floats), B, (int)u->out.d[0],
              (int)u->out.d[1], (int)u->out.d[2]);
        break;
    case CDP_UNIT_LM_HEAD: {
        const int T = (int)u->in.d[0], C = (int)u->in.d[1], N = B * T, V = (int)u->desc.vocab;
        const float *ln = act + (int64_t)N * V, *mean = ln + (int64_t)N * C, *rstd = mean + N;
        float *dln = scratch;
        (void)T;
        K(zero, dln, (size_t)N * C * sizeof *dln);
        K(linear_bwd, dln, g[2], NULL, dout, ln, p[2], N, C, V);
        float *target = din;
        if (!target) {
            target = dln + (int64_t)N * C;
            K(zero, target, (size_t)N * C * sizeof *target);
        }
        K(layernorm_bwd, target, g[0], g[1], dln, x, p[0], mean, rstd, N, C);
        break;
    }
    default:
        CDP_ASSERT(!"unknown unit kind");
    }
    return CDP_OK;
}
