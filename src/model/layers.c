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

static int64_t shape_numel(const struct cdp_shape *s)
{
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++) n *= s->d[i];
    return n;
}

/* A unit of type d->type on input in: its output shape, parameters, work. */
static void make_unit(struct cdp_unit *u, const struct cdp_layer_desc *d, struct cdp_shape in,
                      const struct cdp_model_desc *m)
{
    const struct cdp_layer_def *def = cdp_layer_def(d->type);
    char why[256];
    u->desc = *d;
    u->in = in;
    u->out = in;
    /* the plan loader checked the shapes with the same function */
    if (def->shape && def->shape(d, &in, &u->out, why, sizeof why)) CDP_ASSERT(!"a unit's shape does not fit");
    if (def->build) def->build(u, m);
}

/* A GPT preset: the token and position embedding, the blocks, the head. */
static void gpt_units(const struct cdp_model_desc *m, struct cdp_unit *units)
{
    const int64_t T = m->context, C = m->embed;
    const struct cdp_layer_desc emb = {.type = CDP_LAYER_EMBEDDING, .vocab = m->vocab, .dim = C, .context = T};
    const struct cdp_layer_desc block = {.type = CDP_LAYER_TRANSFORMER_BLOCK, .heads = m->heads, .causal = 1};
    const struct cdp_layer_desc head = {.type = CDP_LAYER_LM_HEAD, .vocab = m->vocab};
    make_unit(&units[0], &emb, (struct cdp_shape){1, {T}}, m);
    for (int64_t l = 0; l < m->layers; l++) make_unit(&units[1 + l], &block, units[0].out, m);
    make_unit(&units[1 + m->layers], &head, units[0].out, m);
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
            make_unit(&units[i], &m->layer_list[i], s, m);
            s = units[i].out;
        }
    }
    for (int i = 0; i < count; i++) {
        struct cdp_unit *u = &units[i];
        u->index = i;
        u->T = m->kind == CDP_MODEL_GPT ? m->context : (units[0].in_tokens ? units[0].in.d[0] : 0);
        u->out_floats = shape_numel(&u->out);
        cdp_layer_def(u->desc.type)->cost(u);
        cdp_unit_set_recompute(u, CDP_RECOMPUTE_NONE);
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
    const size_t n = k->ops->attention_state_floats(k->ks, B, (int)u->in.d[0], (int)u->in.d[1], (int)u->desc.heads);
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

cdp_status cdp_unit_recompute_tail(const struct cdp_kernels *k, const struct cdp_unit *u, float *const *p,
                                   const void *in, float *act, float *tail, float *scratch, int B)
{
    const struct cdp_layer_def *def = cdp_layer_def(u->desc.type);
    return def->recompute ? def->recompute(k, u, p, in, act, tail, scratch, B) : CDP_OK;
}
