/* The units of a model and their passes, through the layer types'
 * descriptions (model/layer_def.h): this file never names a layer type but the
 * three a GPT preset is made of. Shapes: B batch, T tokens, C channels. */
#include "model/layers.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "core/hash.h"
#include "kernels/ops.h"
#include "model/layer_def.h"
#include "model/layers/common.h" /* shape helpers, cdp_mul_add */

/* A unit of type d->type on input in: its output shape, parameters, work. */
static void make_unit(struct cdp_unit *u, const struct cdp_layer_desc *d, struct cdp_shape in,
                      const struct cdp_model_desc *m, int t, int k)
{
    const struct cdp_layer_def *def = cdp_layer_def(d->type);
    char why[256];
    u->desc = *d;
    u->in = in;
    u->out = in;
    u->tp_size = t;
    u->tp_index = k;
    /* the plan loader checked the shapes with the same function */
    if (def->shape && def->shape(d, &in, &u->out, why, sizeof why)) CDP_ASSERT(!"a unit's shape does not fit");
    /* a column split's output is its rank's slice (a row split's input already is) */
    if (t > 1 && d->split == CDP_TSPLIT_COLUMN) u->out.d[u->out.ndim - 1] /= t;
    if (def->build) def->build(u, m);
}

void cdp_param_shard(struct cdp_unit *u, int p, int dim, int t, int k) { cdp_param_shard_parts(u, p, dim, 1, t, k); }

void cdp_param_shard_parts(struct cdp_unit *u, int p, int dim, int parts, int t, int k)
{
    struct cdp_param_desc *pd = &u->params[p];
    CDP_ASSERT(dim >= 0 && dim < pd->ndim && t >= 1 && k >= 0 && k < t && parts >= 1 && pd->shape[dim] > 0 &&
               (parts == 1 || pd->shape[dim] % ((int64_t)parts * t) == 0));
    const int64_t full = pd->shape[dim], inner = pd->numel / full;
    u->param_count -= pd->numel;
    pd->shard_dim = dim;
    pd->shard_parts = parts;
    pd->shard_full = full;
    /* one part: padded up to a multiple of t where t does not divide it (a vocabulary) */
    pd->shape[dim] = parts == 1 ? (full + t - 1) / t : full / t;
    pd->numel = pd->shape[dim] * inner;
    pd->shard_off = cdp_param_shard_off_of(pd, k);
    /* the rank owns the whole tensor's entries it holds, not its padding */
    u->param_count += cdp_param_slice_len(pd) * inner;
}

int64_t cdp_param_slice_len(const struct cdp_param_desc *pd)
{
    if (pd->shard_dim < 0) return pd->shape[0];
    const int64_t n = pd->shape[pd->shard_dim];
    if (pd->shard_parts > 1) return n; /* parts are never padded */
    const int64_t left = pd->shard_full - pd->shard_off;
    return left < 0 ? 0 : left < n ? left : n;
}

int64_t cdp_param_shard_off_of(const struct cdp_param_desc *pd, int j)
{
    const int64_t parts = pd->shard_parts > 1 ? pd->shard_parts : 1;
    return (int64_t)j * (pd->shape[pd->shard_dim] / parts);
}

int cdp_unit_tensor_split(const struct cdp_unit *u)
{
    return u->tp_size > 1 && (u->desc.split != CDP_TSPLIT_NONE || cdp_layer_def(u->desc.type)->tensor_splits);
}

cdp_status cdp_unit_tensor_sum(const struct cdp_unit *u, float *buf, int64_t n)
{
    if (u->tp_size <= 1) return CDP_OK;
    if (!u->tp || !u->tp->all_reduce)
        return cdp_fail(CDP_ERR_INTERNAL, "%s unit %d: split over %d ranks but has no tensor group",
                        cdp_layer_name(u->desc.type), u->index, u->tp_size);
    return u->tp->all_reduce(u->tp->ctx, buf, n);
}

/* The group's collectives work on n floats as t equal parts in rank order:
 * part j of stage is rank j's rows of every sample, [B, T/t, C]. */
static cdp_status seq_group(const struct cdp_unit *u, int64_t T, const char *what)
{
    const int t = u->tp_size > 1 ? u->tp_size : 1;
    if (t > 1 && (!u->tp || !u->tp->reduce_scatter || !u->tp->all_gather))
        return cdp_fail(CDP_ERR_INTERNAL, "%s unit %d: sequence %s over %d ranks but has no tensor group",
                        cdp_layer_name(u->desc.type), u->index, what, t);
    if (T <= 0 || T % t)
        return cdp_fail(CDP_ERR_INVALID, "%s unit %d: a sequence of %lld positions does not split over %d ranks",
                        cdp_layer_name(u->desc.type), u->index, (long long)T, t);
    return CDP_OK;
}

/* Between the whole [B, T, C] and the staging of t equal parts in rank
 * order (part j: every sample's rows [j T/t, (j+1) T/t)): to_stage 1 copies
 * full into stage, 0 stage into full. */
static cdp_status seq_stage_copy(const struct cdp_kernels *k, float *full, float *stage, int B, int64_t T, int64_t C,
                                 int t, int to_stage)
{
    const int64_t rows = T / t * C, part = (int64_t)B * rows;
    for (int j = 0; j < t; j++)
        for (int b = 0; b < B; b++) {
            float *w = full + b * T * C + j * rows, *s = stage + j * part + b * rows;
            if (to_stage) CDP_KERNEL(k, copy, s, w, (size_t)rows * sizeof *s);
            else CDP_KERNEL(k, copy, w, s, (size_t)rows * sizeof *w);
        }
    return CDP_OK;
}

cdp_status cdp_unit_seq_gather(const struct cdp_kernels *k, const struct cdp_unit *u, const float *shard,
                               float *full, float *stage, int B, int64_t T, int64_t C)
{
    cdp_status st = seq_group(u, T, "gather");
    if (st) return st;
    const int t = u->tp_size > 1 ? u->tp_size : 1;
    const int64_t rows = T / t * C, part = (int64_t)B * rows;
    if (t == 1) {
        CDP_KERNEL(k, copy, full, shard, (size_t)part * sizeof *full);
        return CDP_OK;
    }
    CDP_KERNEL(k, copy, stage + u->tp_index * part, shard, (size_t)part * sizeof *stage);
    if ((st = u->tp->all_gather(u->tp->ctx, stage, part * t))) return st;
    return seq_stage_copy(k, full, stage, B, T, C, t, 0);
}

cdp_status cdp_unit_seq_scatter(const struct cdp_kernels *k, const struct cdp_unit *u, const float *full,
                                float *shard, float *stage, int B, int64_t T, int64_t C)
{
    cdp_status st = seq_group(u, T, "scatter");
    if (st) return st;
    const int t = u->tp_size > 1 ? u->tp_size : 1;
    const int64_t rows = T / t * C, part = (int64_t)B * rows;
    if (t == 1) {
        CDP_KERNEL(k, copy, shard, full, (size_t)part * sizeof *shard);
        return CDP_OK;
    }
    if ((st = seq_stage_copy(k, (float *)full, stage, B, T, C, t, 1))) return st; /* full is only read */
    if ((st = u->tp->reduce_scatter(u->tp->ctx, stage, part * t))) return st;
    CDP_KERNEL(k, copy, shard, stage + u->tp_index * part, (size_t)part * sizeof *shard);
    return CDP_OK;
}

cdp_status cdp_unit_set_sequence_parallel(struct cdp_unit *u)
{
    const enum cdp_layer_type ty = u->desc.type;
    const int block = ty == CDP_LAYER_TRANSFORMER_BLOCK || ty == CDP_LAYER_LLAMA_BLOCK;
    if ((!block && ty != CDP_LAYER_EMBEDDING && ty != CDP_LAYER_LM_HEAD) || !cdp_unit_tensor_split(u))
        return cdp_fail(CDP_ERR_UNSUPPORTED, "%s unit %d: sequence parallelism needs a transformer_block, "
                        "llama_block, embedding or lm_head split over a tensor group", cdp_layer_name(ty), u->index);
    if (u->seq_parallel) return CDP_OK;
    const int t = u->tp_size;
    const int64_t T = u->out.d[0]; /* the embedding's output, the others' input and output */
    if (u->out.ndim != 2 || T % t)
        return cdp_fail(CDP_ERR_INVALID, "%s unit %d: a sequence of %lld positions does not split over %d ranks",
                        cdp_layer_name(ty), u->index, (long long)T, t);
    if (ty != CDP_LAYER_EMBEDDING) u->in.d[0] /= t; /* the embedding takes every token id */
    if (ty != CDP_LAYER_LM_HEAD) { /* the head gives the rank's logits of every position */
        u->out.d[0] /= t;
        u->out_floats /= t;
    }
    /* kept on the shard's rows only (the layouts in each type's file): a block's output, res2 and both
     * norms' statistics (GPT's mean and 1/std, Llama's 1/rms); the embedding's output; the head's norm
     * statistics */
    const int64_t gone = T - T / t, C = u->out.d[1];
    u->act_floats -= ty == CDP_LAYER_TRANSFORMER_BLOCK ? gone * (2 * C + 4)
                     : ty == CDP_LAYER_LLAMA_BLOCK     ? gone * (2 * C + 2)
                     : ty == CDP_LAYER_EMBEDDING       ? gone * C
                                                       : gone * (u->desc.rms ? 1 : 2);
    cdp_unit_set_recompute(u, u->recompute);
    u->seq_parallel = 1;
    return CDP_OK;
}

/* The units of m: a layer list's, or a GPT preset's token and position
 * embedding, its blocks and its head. */
int cdp_model_desc_units(const struct cdp_model_desc *m)
{
    return m->kind == CDP_MODEL_GPT ? (int)m->layers + 2 : m->n_layers;
}

struct cdp_layer_desc cdp_model_desc_unit(const struct cdp_model_desc *m, int i)
{
    if (m->kind != CDP_MODEL_GPT) return m->layer_list[i];
    const int llama = m->arch == CDP_ARCH_LLAMA;
    if (i == 0) /* Llama: no learned positions (rotary ones in every block) */
        return (struct cdp_layer_desc){.type = CDP_LAYER_EMBEDDING, .vocab = m->vocab, .dim = m->embed,
                                       .context = llama ? 0 : m->context};
    if (i <= m->layers) {
        if (llama)
            return (struct cdp_layer_desc){.type = CDP_LAYER_LLAMA_BLOCK, .heads = m->heads, .causal = 1,
                                           .kv_heads = m->kv_heads, .hidden = m->ffn_hidden, .eps = m->norm_eps,
                                           .rope = m->rope};
        return (struct cdp_layer_desc){.type = CDP_LAYER_TRANSFORMER_BLOCK, .heads = m->heads, .causal = 1};
    }
    return (struct cdp_layer_desc){.type = CDP_LAYER_LM_HEAD, .vocab = m->vocab, .rms = llama,
                                   .eps = llama ? m->norm_eps : 1e-5};
}

/* One sample's input of the first unit: token ids of a GPT, else the plan's input. */
static struct cdp_shape model_input(const struct cdp_model_desc *m)
{
    struct cdp_shape s = {1, {m->context}};
    if (m->kind == CDP_MODEL_GPT) return s;
    s.ndim = m->input_ndim;
    for (int i = 0; i < m->input_ndim; i++) s.d[i] = m->input[i];
    return s;
}

int cdp_model_desc_tensor_misfit(const struct cdp_model_desc *m, int t, const char **key, int64_t *value)
{
    struct cdp_shape in = model_input(m);
    for (int i = 0; i < cdp_model_desc_units(m); i++) {
        const struct cdp_layer_desc L = cdp_model_desc_unit(m, i);
        const struct cdp_layer_def *d = cdp_layer_def(L.type);
        /* a preset's blocks take /model/embed wide rows; a list's, what the layers before give */
        if (m->kind == CDP_MODEL_GPT) in = (struct cdp_shape){2, {m->context, m->embed}};
        if (d->tensor_check && d->tensor_check(&L, &in, t, key, value)) return i;
        struct cdp_shape out = in;
        char why[256];
        if (m->kind != CDP_MODEL_GPT && d->shape && d->shape(&L, &in, &out, why, sizeof why)) return -1;
        in = out;
    }
    return -1;
}

/* -1 when a dimension is negative or the product overflows. */
static int64_t numel_checked(const struct cdp_shape *s)
{
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++)
        if (s->d[i] < 0 || __builtin_mul_overflow(n, s->d[i], &n)) return -1;
    return n;
}

/* per x B is above limit, or per is -1 (overflowed) */
static int over(int64_t per, int64_t B, int64_t limit)
{
    int64_t x;
    return per < 0 || __builtin_mul_overflow(per, B, &x) || x > limit;
}

int cdp_units_check_sizes(const struct cdp_model_desc *m, int64_t B, int *at, char *why, size_t cap)
{
    struct cdp_shape s = model_input(m);
    int64_t total = 0;
    const int count = cdp_model_desc_units(m);
    for (int i = 0; i < count; i++) {
        const struct cdp_layer_desc d = cdp_model_desc_unit(m, i);
        const struct cdp_layer_def *def = cdp_layer_def(d.type);
        struct cdp_shape out = s;
        char sh[96];
        *at = i;
        if (def->shape && def->shape(&d, &s, &out, why, cap)) return -1;
        const struct cdp_shape *io[2] = {&s, &out};
        for (int k = 0; k < 2; k++) {
            const int64_t n = numel_checked(io[k]), last = cdp_shape_last(io[k]);
            cdp_shape_format(io[k], sh, sizeof sh);
            if (over(n, B, CDP_PLAN_MAX_TENSOR)) {
                snprintf(why, cap, "the %s's %s %s holds more than 2^40 elements in a micro-batch of %lld; "
                         "one tensor may hold at most 2^40", def->name, k ? "output" : "input", sh, (long long)B);
                return -1;
            }
            if (last > 0 && over(n / last, B, INT32_MAX)) {
                snprintf(why, cap, "the %s's %s %s has %lld rows a sample, more than 2^31 - 1 in a micro-batch "
                         "of %lld (the kernels index rows with int)", def->name, k ? "output" : "input", sh,
                         (long long)(n / last), (long long)B);
                return -1;
            }
        }
        const int64_t p = def->params ? def->params(&d, &s) : 0;
        if (p < 0 || p > CDP_PLAN_MAX_TENSOR) {
            snprintf(why, cap, "the %s has more than 2^40 parameters; one layer may have at most 2^40", def->name);
            return -1;
        }
        if (__builtin_add_overflow(total, p, &total) || total > CDP_PLAN_MAX_PARAMS) {
            snprintf(why, cap, "the model has more than 2^44 parameters (17.6 trillion) up to this %s", def->name);
            return -1;
        }
        /* heads x T x T then stays below 2^60 (heads <= C, T x C <= 2^40); a
         * state that large is refused by the fit, not here: kernel tables may
         * keep less (cdp_unit_fit_kernels) */
        if (def->keeps_attention && s.d[0] > CDP_PLAN_MAX_CONTEXT) {
            snprintf(why, cap, "the %s's input has %lld tokens a sample; attention takes at most %d (2^20, as "
                     "/model/context)", def->name, (long long)s.d[0], CDP_PLAN_MAX_CONTEXT);
            return -1;
        }
        /* what remains is products of the sizes checked above */
        struct cdp_unit u;
        memset(&u, 0, sizeof u);
        make_unit(&u, &d, s, m, 1, 0);
        u.out_floats = numel_checked(&out);
        def->cost(&u);
        const int64_t sc = def->scratch ? def->scratch(&u, (int)B) : 0;
        /* a T x T attention scratch may pass 2^40 at a long context; the fit prices it */
        if (sc < 0 || sc > (int64_t)1 << 60) {
            snprintf(why, cap, "the %s's scratch holds more than 2^60 elements in a micro-batch of %lld",
                     def->name, (long long)B);
            return -1;
        }
        s = out;
    }
    return 0;
}

cdp_status cdp_units_build(const struct cdp_model_desc *m, struct cdp_unit **out, int *n)
{
    return cdp_units_build_tensor(m, 1, 0, out, n);
}

cdp_status cdp_units_build_tensor(const struct cdp_model_desc *m, int t, int k, struct cdp_unit **out, int *n)
{
    const int count = cdp_model_desc_units(m);
    if (t < 1 || k < 0 || k >= t) return cdp_fail(CDP_ERR_INVALID, "tensor slice %d of %d", k, t);
    struct cdp_unit *units = calloc((size_t)count, sizeof *units);
    if (!units) return cdp_fail(CDP_ERR_NOMEM, "out of memory for %d layer descriptions", count);
    struct cdp_shape s = model_input(m);
    for (int i = 0; i < count; i++) {
        const struct cdp_layer_desc d = cdp_model_desc_unit(m, i);
        /* the plan loader checks the splits (cdp_plan_check_splits); a library caller may not have */
        if (t > 1 && d.split == CDP_TSPLIT_COLUMN && d.out % t) {
            free(units);
            return cdp_fail(CDP_ERR_INVALID, "unit %d: a column split of width %lld over a tensor group of %d", i,
                            (long long)d.out, t);
        }
        const struct cdp_layer_def *def = cdp_layer_def(d.type);
        const char *key = NULL;
        int64_t value = 0;
        if (t > 1 && def->tensor_check && def->tensor_check(&d, &s, t, &key, &value)) {
            free(units);
            return cdp_fail(CDP_ERR_INVALID, "unit %d (%s): %s %lld is not a multiple of the tensor group's %d", i,
                            def->name, key, (long long)value, t);
        }
        make_unit(&units[i], &d, s, m, t, k);
        s = units[i].out;
    }
    for (int i = 0; i < count; i++) {
        struct cdp_unit *u = &units[i];
        u->index = i;
        u->T = m->kind == CDP_MODEL_GPT ? m->context : (units[0].in_tokens ? units[0].in.d[0] : 0);
        u->out_floats = cdp_shape_numel(&u->out);
        cdp_layer_def(u->desc.type)->cost(u);
        cdp_unit_set_recompute(u, CDP_RECOMPUTE_NONE);
        cdp_status st;
        if (m->seq_parallel && t > 1 && (st = cdp_unit_set_sequence_parallel(u))) {
            free(units);
            return st;
        }
    }
    for (int i = 0; i < count; i++)
        for (int p = 0; p < units[i].n_params; p++) {
            const struct cdp_param_desc *pd = &units[i].params[p];
            if (pd->tied_unit >= 0 && pd->tied_unit < count && pd->tied_param < units[pd->tied_unit].n_params)
                units[pd->tied_unit].params[pd->tied_param].tie_target = 1;
        }
    *out = units;
    *n = count;
    return CDP_OK;
}

int64_t cdp_unit_scratch_floats(const struct cdp_unit *u, int B)
{
    const struct cdp_layer_def *def = cdp_layer_def(u->desc.type);
    return def->scratch ? def->scratch(u, B) : 0;
}

void cdp_unit_fit_kernels(struct cdp_unit *u, const struct cdp_kernels *k, int B)
{
    if (!cdp_layer_def(u->desc.type)->keeps_attention) return;
    if (!k->ops->attention_state_floats || B < 1) return;
    /* a type split by heads keeps its rank's heads' state */
    const int t = cdp_unit_tensor_split(u) ? u->tp_size : 1;
    const int T = (int)u->in.d[0] * (u->seq_parallel ? u->tp_size : 1); /* the whole sequence's attention */
    const size_t n = k->ops->attention_state_floats(k->ks, B, T, (int)(u->in.d[1] / t),
                                                    (int)(u->desc.heads / t));
    const int64_t per = (int64_t)((n + (size_t)B - 1) / (size_t)B);
    if (per >= u->att_floats) return;
    u->act_floats -= u->att_floats - per;
    u->att_floats = per;
    cdp_unit_set_recompute(u, u->recompute);
}

int64_t cdp_unit_tail_floats(const struct cdp_unit *u)
{
    const struct cdp_layer_def *def = cdp_layer_def(u->desc.type);
    if (!def->recompute) return 0;
    return u->tail_floats + (def->keeps_attention ? u->att_floats : 0);
}

void cdp_unit_set_recompute(struct cdp_unit *u, enum cdp_recompute r)
{
    const int64_t tail = cdp_unit_tail_floats(u);
    u->recompute = r;
    u->keep_floats = u->act_floats;
    u->work_floats = 0;
    u->recompute_flops = 0;
    switch (r) {
    case CDP_RECOMPUTE_SELECTIVE:
        if (tail <= 0) break;
        u->keep_floats = u->act_floats - tail;
        u->work_floats = tail;
        u->recompute_flops = u->tail_flops;
        break;
    case CDP_RECOMPUTE_FULL:
        if (u->act_floats <= u->out_floats) break;
        u->keep_floats = u->out_floats;
        u->work_floats = u->act_floats;
        u->recompute_flops = u->fwd_flops;
        break;
    case CDP_RECOMPUTE_NONE:
    case CDP_RECOMPUTE_COUNT:
        break;
    }
}

/* ---- initialisation ------------------------------------------------------- */

static double uniform01(uint64_t *s) { return ((double)(cdp_splitmix64(s) >> 11) + 0.5) * 0x1p-53; }

/* The whole tensor of parameter p into dst (its numel floats). */
static void param_init_whole(const struct cdp_unit *u, const struct cdp_param_desc *pd, int p, uint64_t seed,
                             float *dst);

void cdp_param_init(const struct cdp_unit *u, int p, uint64_t seed, float *dst)
{
    const struct cdp_param_desc *pd = &u->params[p];
    if (pd->shard_dim < 0 || (pd->shard_full == pd->shape[pd->shard_dim] && pd->shard_off == 0)) {
        param_init_whole(u, pd, p, seed, dst);
        return;
    }
    /* a slice: the whole tensor as one rank makes it, then this rank's part */
    struct cdp_param_desc whole = *pd;
    whole.shape[pd->shard_dim] = pd->shard_full;
    whole.numel = pd->numel / pd->shape[pd->shard_dim] * pd->shard_full;
    float *all = malloc((size_t)whole.numel * sizeof *all);
    CDP_ASSERT(all); /* as large as the whole tensor one rank would hold */
    param_init_whole(u, &whole, p, seed, all);
    cdp_param_slice_copy(pd, all, dst, 0);
    free(all);
}

void cdp_param_slice_copy(const struct cdp_param_desc *pd, void *whole, void *slice, int to_whole)
{
    int64_t outer = 1, inner = 1; /* dimensions before and after the sliced one */
    for (int i = 0; i < pd->shard_dim; i++) outer *= pd->shape[i];
    for (int i = pd->shard_dim + 1; i < pd->ndim; i++) inner *= pd->shape[i];
    const int64_t parts = pd->shard_parts > 1 ? pd->shard_parts : 1, part_full = pd->shard_full / parts,
                  part_mine = pd->shape[pd->shard_dim] / parts, left = part_full - pd->shard_off,
                  valid = left < 0 ? 0 : left < part_mine ? left : part_mine;
    /* a padded slice's rows past the whole tensor's end: zeros, never in the whole */
    const size_t stride = (size_t)(part_mine * inner) * sizeof(float), len = (size_t)(valid * inner) * sizeof(float);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t q = 0; q < parts; q++) {
            char *s = (char *)slice + (size_t)(o * parts + q) * stride;
            if (len) {
                char *w = (char *)whole +
                          (size_t)((o * pd->shard_full + q * part_full + pd->shard_off) * inner) * sizeof(float);
                if (to_whole) memcpy(w, s, len);
                else memcpy(s, w, len);
            }
            if (!to_whole && len < stride) memset(s + len, 0, stride - len);
        }
}

static void param_init_whole(const struct cdp_unit *u, const struct cdp_param_desc *pd, int p, uint64_t seed,
                             float *dst)
{
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

/* Where a contiguous act's tail starts: after the kept activations. */
static float *tail_in(const struct cdp_unit *u, const float *act, int B)
{
    return (float *)act + (int64_t)B * (u->act_floats - cdp_unit_tail_floats(u));
}

cdp_status cdp_unit_forward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                            const void *in, float *act, float *scratch, int B)
{
    return cdp_layer_def(u->desc.type)->forward(k, u, p, in, act, tail_in(u, act, B), scratch, B);
}

cdp_status cdp_unit_backward(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                             float *const *g, const void *in, const float *act, const float *dout, float *din,
                             float *scratch, int B)
{
    return cdp_layer_def(u->desc.type)->backward(k, u, p, g, in, act, tail_in(u, act, B), dout, din, scratch, B);
}

cdp_status cdp_unit_forward_split(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                  const void *in, float *act, float *tail, float *scratch, int B)
{
    return cdp_layer_def(u->desc.type)->forward(k, u, p, in, act, tail, scratch, B);
}

cdp_status cdp_unit_backward_split(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                   float *const *g, const void *in, const float *act, const float *tail,
                                   const float *dout, float *din, float *scratch, int B)
{
    return cdp_layer_def(u->desc.type)->backward(k, u, p, g, in, act, tail, dout, din, scratch, B);
}

int cdp_unit_vocab_split(const struct cdp_unit *u, int64_t *off, int64_t *valid)
{
    if (u->tp_size <= 1 || !cdp_layer_def(u->desc.type)->vocab_parallel) return 0;
    const int64_t w = cdp_shape_last(&u->out), left = u->desc.vocab - u->tp_index * w;
    *off = u->tp_index * w;
    *valid = left < 0 ? 0 : left < w ? left : w;
    return 1;
}

int cdp_unit_weight_takes_dout(const struct cdp_unit *u) { return cdp_layer_def(u->desc.type)->weight_takes_dout; }

cdp_status cdp_unit_backward_input(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                   const void *in, const float *act, const float *tail, const float *dout,
                                   float *din, float *ws, float *scratch, int B)
{
    const struct cdp_layer_def *def = cdp_layer_def(u->desc.type);
    /* no parameters: the backward is all input gradient */
    if (!def->backward_input) return def->backward(k, u, p, NULL, in, act, tail, dout, din, scratch, B);
    return def->backward_input(k, u, p, in, act, tail, dout, din, ws, scratch, B);
}

cdp_status cdp_unit_backward_weight(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                    float *const *g, const void *in, const float *act, const float *tail,
                                    const float *dout, const float *ws, float *scratch, int B)
{
    const struct cdp_layer_def *def = cdp_layer_def(u->desc.type);
    if (!def->backward_weight) return CDP_OK;
    if (def->weight_takes_dout && !dout)
        return cdp_fail(CDP_ERR_INTERNAL, "the weight gradient of a %s needs its output gradient again", def->name);
    return def->backward_weight(k, u, p, g, in, act, tail, dout, ws, scratch, B);
}

cdp_status cdp_unit_recompute_tail(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                   const void *in, float *act, float *tail, float *scratch, int B)
{
    const struct cdp_layer_def *def = cdp_layer_def(u->desc.type);
    return def->recompute ? def->recompute(k, u, p, in, act, tail, scratch, B) : CDP_OK;
}

int cdp_model_ties_embeddings(const struct cdp_model_desc *m)
{
    return m->kind == CDP_MODEL_GPT && m->tie_embeddings;
}
