/* Models and stage ranges of models: memory, forward/backward over the units
 * through the device's kernel table, the loss, and weights in and out of
 * safetensors files. Device memory is only touched by the kernels and the
 * buffer copies, so the same code runs on a device the host cannot address. */
#include "model/model.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "kernels/ops.h"
#include "model/hf_gpt2.h"
#include "model/safetensors.h"

struct cdp_model {
    struct cdp_unit *units; /* the range's units (owned copies) */
    int n_units;
    int first;              /* global index of units[0] */
    int ends_model;         /* the range holds the model's last unit */
    enum cdp_model_kind kind; /* the described model's (which plan key a message names) */
    enum cdp_loss loss;
    int B, slots;
    cdp_device_t dev;
    struct cdp_kernels k; /* the device's */
    /* The first kernel failure where no status could be returned
     * (cdp_model_record_error); every later pass returns it. */
    cdp_status err;
    char err_msg[512];

    struct cdp_model_tensor *tensors;
    int n_tensors;
    float **pptr, **gptr; /* [n_units * CDP_UNIT_MAX_PARAMS] */
    cdp_buffer_t params_buf, grads_buf;
    int64_t param_floats, grad_floats;
    /* ZeRO-2 (cdp_model_create_sharded): the shard's reduced gradient, the
     * one-unit window, and per unit its runs of windowed tensors (contiguous
     * in the parameter buffer and in the window) */
    int grad_shards, grad_shard;
    uint64_t shard_off, shard_len;
    float *acc, *window;
    struct grad_run {
        uint64_t from, count; /* floats of the parameter buffer */
        float *win;           /* where they are in the window */
    } *runs;
    int *run_first;         /* [n_units + 1]: unit i's runs are run_first[i] .. run_first[i + 1] - 1 */
    uint64_t *unit_window;  /* [n_units]: floats of the window its backward writes */
    cdp_grad_reduce_fn reduce;
    cdp_unit_done_fn unit_done;
    void *unit_done_ctx;
    void *reduce_ctx;

    cdp_buffer_t acts_buf, input_buf, target_buf, scratch_buf, dbuf, loss_buf, work_buf;
    enum cdp_recompute recompute;
    int64_t acts_per_slot, input_bytes_per_slot, target_bytes_per_slot, dfloats;
    int64_t *act_off; /* per unit, within a slot */
    int64_t loss_rows; /* rows of the loss per micro-batch */
    float *loss_host;  /* [loss_rows]: the losses read back */
    float *loss_scale; /* [slots]: each slot's, from cdp_model_loss, for its backward (and its W) */
    struct cdp_model_bytes mb; /* what the model holds, as allocated (cdp_model_memory) */
    /* split backward (cdp_model_set_split_backward): wslots W-states of wstate_per_slot floats, unit i's
     * at wstate_off[i] in each */
    cdp_buffer_t wstate_buf;
    int wslots;
    int64_t wstate_per_slot, *wstate_off;
};

int cdp_model_unit_count(const struct cdp_model *m) { return m->n_units; }
const struct cdp_unit *cdp_model_unit(const struct cdp_model *m, int i) { return &m->units[i]; }
float *const *cdp_model_unit_params(const struct cdp_model *m, int i)
{
    CDP_ASSERT(i >= 0 && i < m->n_units);
    return &m->pptr[(size_t)i * CDP_UNIT_MAX_PARAMS];
}

int cdp_model_tensor_count(const struct cdp_model *m) { return m->n_tensors; }
struct cdp_model_tensor *cdp_model_tensor(struct cdp_model *m, int i) { return &m->tensors[i]; }

struct cdp_model_tensor *cdp_model_tied_tensor(struct cdp_model *m)
{
    int owner = -1, param = -1; /* the tied parameter's home: (global unit, parameter) */
    for (int u = 0; u < m->n_units && owner < 0; u++)
        for (int p = 0; p < m->units[u].n_params && owner < 0; p++) {
            const struct cdp_param_desc *pd = &m->units[u].params[p];
            if (pd->tied_unit >= 0) owner = pd->tied_unit, param = pd->tied_param;
            else if (pd->tie_target) owner = m->units[u].index, param = p;
        }
    for (int i = 0; owner >= 0 && i < m->n_tensors; i++)
        if (m->tensors[i].unit == owner && m->tensors[i].param == param) return &m->tensors[i];
    return NULL;
}
int64_t cdp_model_param_floats(const struct cdp_model *m) { return m->param_floats; }
const struct cdp_kernels *cdp_model_kernels(const struct cdp_model *m) { return &m->k; }

void cdp_model_record_error(struct cdp_model *m, cdp_status st)
{
    if (!st || m->err) return;
    m->err = st;
    snprintf(m->err_msg, sizeof m->err_msg, "%s", cdp_last_error());
    CDP_ERROR(KERNEL, "%s: %s", cdp_device_name(m->dev), m->err_msg);
}

cdp_status cdp_model_error(const struct cdp_model *m)
{
    return m->err ? cdp_fail(m->err, "%s", m->err_msg) : CDP_OK;
}

/* Byte offset of a tensor in the parameter (and gradient) buffer. */
static uint64_t tensor_offset(const struct cdp_model *m, const struct cdp_model_tensor *t)
{
    return (uint64_t)(t->data - (const float *)cdp_buffer_data(m->params_buf)) * 4;
}

double cdp_model_step_flops(const struct cdp_model *m)
{
    double f = 0;
    for (int i = 0; i < m->n_units; i++) f += m->units[i].fwd_flops + m->units[i].bwd_flops;
    return f * m->B;
}

static float *slot_act(struct cdp_model *m, int slot, int i)
{
    return (float *)cdp_buffer_data(m->acts_buf) + slot * m->acts_per_slot + m->act_off[i];
}

void *cdp_model_input(struct cdp_model *m, int slot)
{
    return (char *)cdp_buffer_data(m->input_buf) + slot * m->input_bytes_per_slot;
}

float *cdp_model_output(struct cdp_model *m, int slot) { return slot_act(m, slot, m->n_units - 1); }

static int64_t shape_numel(const struct cdp_shape *s)
{
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++) n *= s->d[d];
    return n;
}

enum cdp_loss cdp_model_loss_of(const struct cdp_model_desc *desc)
{
    return desc->kind == CDP_MODEL_GPT ? CDP_LOSS_CROSS_ENTROPY : desc->loss;
}

void cdp_unit_bytes(const struct cdp_unit *u, int B, enum cdp_loss loss, struct cdp_unit_bytes *out)
{
    const uint64_t b = (uint64_t)B, in = (uint64_t)shape_numel(&u->in), o = (uint64_t)u->out_floats;
    memset(out, 0, sizeof *out);
    out->tied_owner = -1;
    for (int p = 0; p < u->n_params; p++) {
        out->held_floats += (uint64_t)u->params[p].numel;
        if (u->params[p].tied_unit >= 0) {
            out->tied_floats += (uint64_t)u->params[p].numel;
            out->tied_owner = u->params[p].tied_unit;
        } else if (!u->params[p].tie_target) {
            out->window_floats += (uint64_t)u->params[p].numel;
        }
    }
    out->act_bytes = b * (uint64_t)u->keep_floats * 4;
    out->work_bytes = b * (uint64_t)u->work_floats * 4;
    out->wstate_bytes = b * (uint64_t)u->wstate_floats * 4;
    out->scratch_bytes = (uint64_t)cdp_unit_scratch_floats(u, B) * 4;
    out->io_bytes = b * (in > o ? in : o) * 4;
    out->input_bytes = b * in * 4;
    out->in_tokens = u->in_tokens;
    out->output_bytes = b * o * 4;
    const uint64_t last = u->out.ndim > 0 ? (uint64_t)u->out.d[u->out.ndim - 1] : 1;
    const uint64_t rows = loss == CDP_LOSS_MSE ? b : b * o / (last ? last : 1);
    out->target_bytes = loss == CDP_LOSS_MSE ? b * o * 4 : rows * 4;
    out->loss_bytes = rows * 4;
}

void cdp_range_terms_add(struct cdp_range_terms *t, const struct cdp_unit_bytes *u)
{
    t->held_floats += u->held_floats;
    t->act_bytes = cdp_sat_add(t->act_bytes, u->act_bytes); /* each below 2^62, their sum may not be */
    if (u->scratch_bytes > t->scratch_bytes) t->scratch_bytes = u->scratch_bytes;
    if (u->io_bytes > t->io_bytes) t->io_bytes = u->io_bytes;
    if (u->work_bytes > t->work_bytes) t->work_bytes = u->work_bytes;
    t->window_sum += u->window_floats;
    if (u->window_floats > t->window_max) t->window_max = u->window_floats;
}

void cdp_model_bytes_of(const struct cdp_range_terms *t, uint64_t shared_floats, const struct cdp_unit_bytes *first,
                        const struct cdp_unit_bytes *last, int ends_model, int slots, int grad_shards, int grad_shard,
                        struct cdp_model_bytes *out)
{
    const uint64_t k = slots > 0 ? (uint64_t)slots : 0;
    memset(out, 0, sizeof *out);
    const uint64_t held = t->held_floats - shared_floats;
    out->params = out->grads = held * 4;
    if (grad_shards > 1) {
        /* the shard, the tensors in a tie whole, the largest unit's window */
        uint64_t off, len;
        cdp_shard(held, grad_shards, grad_shard, &off, &len);
        out->grads = (len + (held - t->window_sum) + t->window_max) * 4;
    }
    /* the unit figures are bounded (cdp_units_check_sizes); slot counts are not */
    out->activations = cdp_sat_mul(k, t->act_bytes);
    out->inputs = cdp_sat_mul(k, first->input_bytes);
    if (ends_model) {
        out->targets = cdp_sat_mul(k, last->target_bytes);
        out->losses = last->loss_bytes;
    }
    out->scratch = t->scratch_bytes;
    out->grad_buffers = 2 * t->io_bytes;
    out->recompute = t->work_bytes;
    const uint64_t parts[] = {out->params, out->grads,   out->activations, out->inputs,   out->targets,
                              out->losses, out->scratch, out->grad_buffers, out->recompute};
    out->total = 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) out->total = cdp_sat_add(out->total, parts[i]);
}

void cdp_model_bytes_add_wstate(struct cdp_model_bytes *mb, uint64_t wstate_sum, int wslots)
{
    if (mb->total != UINT64_MAX) mb->total -= mb->wstate; /* a saturated total stays saturated */
    mb->wstate = cdp_sat_mul(wslots > 0 ? (uint64_t)wslots : 0, wstate_sum);
    mb->total = cdp_sat_add(mb->total, mb->wstate);
}

static cdp_status alloc(struct cdp_model *m, uint64_t bytes, const char *what, cdp_buffer_t *out)
{
    cdp_status st = cdp_buffer_create(m->dev, bytes, out);
    return st ? cdp_error_context(st, "model %s", what) : CDP_OK;
}

void cdp_model_destroy(struct cdp_model *m)
{
    if (!m) return;
    cdp_buffer_destroy(m->params_buf);
    cdp_buffer_destroy(m->grads_buf);
    cdp_buffer_destroy(m->acts_buf);
    cdp_buffer_destroy(m->input_buf);
    cdp_buffer_destroy(m->target_buf);
    cdp_buffer_destroy(m->scratch_buf);
    cdp_buffer_destroy(m->dbuf);
    cdp_buffer_destroy(m->loss_buf);
    cdp_buffer_destroy(m->work_buf);
    cdp_buffer_destroy(m->wstate_buf);
    free(m->wstate_off);
    free(m->loss_scale);
    free(m->units);
    free(m->tensors);
    free(m->pptr);
    free(m->gptr);
    free(m->act_off);
    free(m->loss_host);
    free(m->runs);
    free(m->run_first);
    free(m->unit_window);
    free(m);
}

/* Initial values are computed on the host, one tensor at a time, and copied
 * to the device. */
static cdp_status init_params(struct cdp_model *m, const struct cdp_unit *all, uint64_t seed)
{
    int64_t most = 0;
    for (int t = 0; t < m->n_tensors; t++)
        if (m->tensors[t].numel > most) most = m->tensors[t].numel;
    float *host = malloc((size_t)most * 4 + 1);
    if (!host) return cdp_fail(CDP_ERR_NOMEM, "out of memory initialising a model");
    cdp_status st = CDP_OK;
    for (int t = 0; t < m->n_tensors && !st; t++) {
        const struct cdp_model_tensor *tt = &m->tensors[t];
        cdp_param_init(&all[tt->unit], tt->param, seed, host);
        st = cdp_buffer_write(m->params_buf, tensor_offset(m, tt), host, (uint64_t)tt->numel * 4);
        if (st) st = cdp_error_context(st, "initialising %s", tt->name);
    }
    free(host);
    return st;
}

static cdp_status zero_grads(struct cdp_model *m)
{
    /* a range of parameter-free units (activations, pooling) has no buffer */
    if (m->grad_floats) CDP_KERNEL(&m->k, zero, cdp_buffer_data(m->grads_buf), (size_t)m->grad_floats * 4);
    return CDP_OK;
}

cdp_status cdp_model_create(const struct cdp_model_desc *desc, int first, int end, int B, int slots,
                            uint64_t seed, cdp_device_t dev, struct cdp_model **out)
{
    return cdp_model_create_ex(desc, first, end, B, slots, seed, CDP_RECOMPUTE_NONE, dev, out);
}

cdp_status cdp_model_create_ex(const struct cdp_model_desc *desc, int first, int end, int B, int slots,
                               uint64_t seed, enum cdp_recompute r, cdp_device_t dev, struct cdp_model **out)
{
    return cdp_model_create_sharded(desc, first, end, B, slots, seed, r, 1, 0, dev, out);
}

/* Sharded gradients: where each tensor's gradient lives (tied ones after the
 * shard, windowed ones in their unit's window) and the runs reduced after
 * each unit's backward. */
static cdp_status place_sharded_grads(struct cdp_model *m, float *gbase, uint64_t tied_floats)
{
    m->acc = gbase;
    float *tied = gbase + m->shard_len;
    m->window = tied + tied_floats;
    m->runs = calloc((size_t)m->n_tensors + 1, sizeof *m->runs);
    m->run_first = calloc((size_t)m->n_units + 1, sizeof *m->run_first);
    m->unit_window = calloc((size_t)m->n_units + 1, sizeof *m->unit_window);
    if (!m->runs || !m->run_first || !m->unit_window) return cdp_fail(CDP_ERR_NOMEM, "out of memory for a model");
    int n_runs = 0, t = 0;
    for (int i = 0; i < m->n_units; i++) {
        m->run_first[i] = n_runs;
        uint64_t w = 0;
        /* tensors are made unit by unit, in parameter order */
        for (; t < m->n_tensors && m->tensors[t].unit_local == i; t++) {
            struct cdp_model_tensor *tt = &m->tensors[t];
            const uint64_t at = (uint64_t)(intptr_t)tt->data;
            if (!tt->windowed) {
                tt->grad = tied;
                tied += tt->numel;
                continue;
            }
            tt->grad = m->window + w;
            struct grad_run *last = n_runs > m->run_first[i] ? &m->runs[n_runs - 1] : NULL;
            if (last && last->from + last->count == at) {
                last->count += (uint64_t)tt->numel;
            } else {
                m->runs[n_runs++] = (struct grad_run){at, (uint64_t)tt->numel, m->window + w};
            }
            w += (uint64_t)tt->numel;
        }
        m->unit_window[i] = w;
    }
    m->run_first[m->n_units] = n_runs;
    return CDP_OK;
}

cdp_status cdp_model_create_sharded(const struct cdp_model_desc *desc, int first, int end, int B, int slots,
                                    uint64_t seed, enum cdp_recompute r, int shards, int shard, cdp_device_t dev,
                                    struct cdp_model **out)
{
    cdp_status st;
    struct cdp_unit *all = NULL;
    int n_all = 0;
    if ((st = cdp_units_build(desc, &all, &n_all))) return st;
    if (first < 0 || end > n_all || first >= end || B < 1 || slots < 1 || shards < 1 || shard < 0 ||
        shard >= shards) {
        free(all);
        return cdp_fail(CDP_ERR_INVALID,
                        "model range [%d, %d) with B=%d, %d slots, gradient shard %d of %d: the model has %d units",
                        first, end, B, slots, shard, shards, n_all);
    }
    struct cdp_model *m = calloc(1, sizeof *m);
    if (!m) {
        free(all);
        return cdp_fail(CDP_ERR_NOMEM, "out of memory for a model");
    }
    m->n_units = end - first;
    m->first = first;
    m->kind = desc->kind;
    m->ends_model = end == n_all;
    m->loss = cdp_model_loss_of(desc);
    m->B = B;
    m->slots = slots;
    m->dev = dev;
    m->k.ops = cdp_device_ops(dev);
    m->k.ks = cdp_device_kernel_state(dev);
    if (!m->k.ops) {
        st = cdp_fail(CDP_ERR_UNSUPPORTED, "device %s has no kernels", cdp_device_name(dev));
        goto fail;
    }
    m->units = malloc((size_t)m->n_units * sizeof *m->units);
    m->pptr = calloc((size_t)m->n_units * CDP_UNIT_MAX_PARAMS, sizeof *m->pptr);
    m->gptr = calloc((size_t)m->n_units * CDP_UNIT_MAX_PARAMS, sizeof *m->gptr);
    m->act_off = calloc((size_t)m->n_units, sizeof *m->act_off);
    m->wstate_off = calloc((size_t)m->n_units, sizeof *m->wstate_off);
    m->loss_scale = calloc((size_t)slots, sizeof *m->loss_scale);
    m->tensors = calloc((size_t)m->n_units * CDP_UNIT_MAX_PARAMS, sizeof *m->tensors);
    if (!m->units || !m->pptr || !m->gptr || !m->act_off || !m->wstate_off || !m->loss_scale || !m->tensors) {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory for a model");
        goto fail;
    }
    memcpy(m->units, all + first, (size_t)m->n_units * sizeof *m->units);
    /* attention's saved state as this device's kernels keep it, and what the mode keeps */
    m->recompute = r;
    for (int i = 0; i < m->n_units; i++) {
        cdp_unit_set_recompute(&m->units[i], r);
        cdp_unit_fit_kernels(&m->units[i], &m->k, B);
    }

    /* Every buffer's size comes from cdp_model_bytes_of, the sizes the planner predicts. */
    const enum cdp_loss loss = m->loss;
    struct cdp_range_terms terms = {0};
    struct cdp_unit_bytes ub0, ub, ubl;
    uint64_t shared = 0;
    for (int i = 0; i < m->n_units; i++) {
        cdp_unit_bytes(&m->units[i], B, loss, &ub);
        cdp_range_terms_add(&terms, &ub);
        if (ub.tied_owner >= first && ub.tied_owner < end) shared += ub.tied_floats;
        if (i == 0) ub0 = ub;
        ubl = ub;
    }
    struct cdp_model_bytes mb;
    cdp_model_bytes_of(&terms, shared, &ub0, &ubl, m->ends_model, slots, shards, shard, &mb);

    /* Parameters: one tensor per parameter, except a tied one whose owner is in
     * range, which shares the owner's storage. */
    int64_t off = 0;
    for (int i = 0; i < m->n_units; i++) {
        const struct cdp_unit *u = &m->units[i];
        for (int p = 0; p < u->n_params; p++) {
            const struct cdp_param_desc *pd = &u->params[p];
            if (pd->tied_unit >= first && pd->tied_unit < end) continue;
            struct cdp_model_tensor *t = &m->tensors[m->n_tensors++];
            int owner = pd->tied_unit >= 0 ? pd->tied_unit : u->index;
            int oparam = pd->tied_unit >= 0 ? pd->tied_param : p;
            snprintf(t->name, sizeof t->name, "layers.%d.%s", owner, all[owner].params[oparam].name);
            t->unit = owner;
            t->param = oparam;
            t->numel = pd->numel;
            t->ndim = pd->ndim;
            memcpy(t->shape, pd->shape, sizeof t->shape);
            t->group = all[owner].params[oparam].group;
            t->unit_local = i;
            t->windowed = pd->tied_unit < 0 && !pd->tie_target;
            t->data = (float *)(intptr_t)off; /* offsets until the buffers exist */
            off += pd->numel;
        }
    }
    m->param_floats = off;
    m->grad_floats = (int64_t)(mb.grads / 4);
    CDP_ASSERT((uint64_t)off * 4 == mb.params);
    if ((st = alloc(m, mb.params, "parameters", &m->params_buf))) goto fail;
    if ((st = alloc(m, mb.grads, shards > 1 ? "gradients (this replica's shard, tied tensors, one unit's window)"
                                             : "gradients", &m->grads_buf)))
        goto fail;
    float *pbase = cdp_buffer_data(m->params_buf), *gbase = cdp_buffer_data(m->grads_buf);
    if (shards > 1) {
        m->grad_shards = shards;
        m->grad_shard = shard;
        cdp_shard((uint64_t)off, shards, shard, &m->shard_off, &m->shard_len);
        const uint64_t tied = (uint64_t)off - terms.window_sum;
        CDP_ASSERT(m->shard_len + tied + terms.window_max == (uint64_t)m->grad_floats);
        if ((st = place_sharded_grads(m, gbase, tied))) goto fail;
    }
    for (int t = 0; t < m->n_tensors; t++) {
        intptr_t o = (intptr_t)m->tensors[t].data;
        m->tensors[t].data = pbase + o;
        if (shards == 1) m->tensors[t].grad = gbase + o;
    }
    for (int i = 0; i < m->n_units; i++) {
        const struct cdp_unit *u = &m->units[i];
        for (int p = 0; p < u->n_params; p++) {
            const struct cdp_param_desc *pd = &u->params[p];
            int owner = pd->tied_unit >= 0 ? pd->tied_unit : u->index;
            int oparam = pd->tied_unit >= 0 ? pd->tied_param : p;
            for (int t = 0; t < m->n_tensors; t++) {
                if (m->tensors[t].unit == owner && m->tensors[t].param == oparam) {
                    m->pptr[i * CDP_UNIT_MAX_PARAMS + p] = m->tensors[t].data;
                    m->gptr[i * CDP_UNIT_MAX_PARAMS + p] = m->tensors[t].grad;
                }
            }
        }
    }
    if ((st = init_params(m, all, seed))) goto fail;
    if ((st = zero_grads(m))) goto fail;

    /* Activations, inputs, targets, scratch, and the backward ping-pong buffers. */
    int64_t acts = 0;
    for (int i = 0; i < m->n_units; i++) {
        m->act_off[i] = acts;
        acts += (int64_t)B * m->units[i].keep_floats;
    }
    m->acts_per_slot = acts;
    int64_t wst = 0;
    for (int i = 0; i < m->n_units; i++) {
        m->wstate_off[i] = wst;
        wst += (int64_t)B * m->units[i].wstate_floats;
    }
    m->wstate_per_slot = wst;
    m->mb = mb;
    m->dfloats = (int64_t)(mb.grad_buffers / 8);
    m->input_bytes_per_slot = (int64_t)ub0.input_bytes;
    if (m->ends_model) {
        m->loss_rows = (int64_t)(ubl.loss_bytes / 4);
        m->target_bytes_per_slot = (int64_t)ubl.target_bytes;
        if ((st = alloc(m, mb.targets, "targets", &m->target_buf))) goto fail;
        if ((st = alloc(m, mb.losses, "losses", &m->loss_buf))) goto fail;
        if (!(m->loss_host = malloc((size_t)m->loss_rows * 4 + 1))) {
            st = cdp_fail(CDP_ERR_NOMEM, "out of memory for a model");
            goto fail;
        }
    }
    if ((st = alloc(m, mb.activations, "activations", &m->acts_buf))) goto fail;
    if ((st = alloc(m, mb.inputs, "inputs", &m->input_buf))) goto fail;
    if ((st = alloc(m, mb.scratch, "scratch", &m->scratch_buf))) goto fail;
    if ((st = alloc(m, mb.grad_buffers, "gradient buffers", &m->dbuf))) goto fail;
    if (mb.recompute && (st = alloc(m, mb.recompute, "recomputation buffer", &m->work_buf))) goto fail;
    free(all);
    *out = m;
    return CDP_OK;
fail:
    free(all);
    cdp_model_destroy(m);
    return st;
}

void cdp_model_zero_grad(struct cdp_model *m)
{
    cdp_status st = zero_grads(m);
    if (st) cdp_model_record_error(m, cdp_error_context(st, "zeroing the gradients"));
}

/* Where unit i's activations are for a pass over a slot: kept ones at *act,
 * the selective tail at *tail. A unit that keeps everything (or has nothing to
 * drop) has both in the slot; selective keeps the tail in the work buffer;
 * full runs in the work buffer, keeping only its output in the slot. */
static void unit_acts(struct cdp_model *m, int slot, int i, float **act, float **tail)
{
    const struct cdp_unit *u = &m->units[i];
    float *work = m->work_buf ? cdp_buffer_data(m->work_buf) : NULL;
    *act = slot_act(m, slot, i);
    if (u->work_floats && u->recompute == CDP_RECOMPUTE_FULL) *act = work;
    *tail = *act + (int64_t)m->B * (u->act_floats - cdp_unit_tail_floats(u));
    if (u->work_floats && u->recompute == CDP_RECOMPUTE_SELECTIVE) *tail = work;
}

static const void *unit_input(struct cdp_model *m, int slot, int i)
{
    return i == 0 ? cdp_model_input(m, slot) : (const void *)slot_act(m, slot, i - 1);
}

static cdp_status unit_forward(struct cdp_model *m, int slot, int i, float *act, float *tail, float *scratch)
{
    return cdp_unit_forward_split(&m->k, &m->units[i], &m->pptr[i * CDP_UNIT_MAX_PARAMS], unit_input(m, slot, i),
                                  act, tail, scratch, m->B);
}

cdp_status cdp_model_forward(struct cdp_model *m, int slot)
{
    CDP_ASSERT(slot >= 0 && slot < m->slots);
    cdp_status st;
    if ((st = cdp_model_error(m))) return st;
    float *scratch = cdp_buffer_data(m->scratch_buf);
    for (int i = 0; i < m->n_units; i++) {
        const struct cdp_unit *u = &m->units[i];
        float *act, *tail;
        unit_acts(m, slot, i, &act, &tail);
        st = unit_forward(m, slot, i, act, tail, scratch);
        /* full recomputation ran it in the work buffer: its output is what the slot keeps */
        if (!st && act != slot_act(m, slot, i))
            st = m->k.ops->copy(m->k.ks, slot_act(m, slot, i), act, (size_t)m->B * u->out_floats * sizeof *act);
        if (st) return cdp_error_context(st, "forward of unit %d (%s)", u->index, cdp_layer_name(u->desc.type));
    }
    return CDP_OK;
}

/* The per-row losses of a slot's output against the targets already on the device. */
static cdp_status loss_fwd(struct cdp_model *m, int slot, const void *tdev)
{
    const struct cdp_unit *ul = &m->units[m->n_units - 1];
    const float *outp = cdp_model_output(m, slot);
    float *losses = cdp_buffer_data(m->loss_buf);
    if (m->loss == CDP_LOSS_MSE)
        CDP_KERNEL(&m->k, mse_fwd, losses, outp, tdev, m->B, (int)ul->out_floats);
    else
        CDP_KERNEL(&m->k, crossentropy_fwd, losses, outp, tdev, (int)m->loss_rows, (int)ul->out.d[ul->out.ndim - 1]);
    return CDP_OK;
}

cdp_status cdp_model_loss(struct cdp_model *m, int slot, const void *targets, float scale,
                          double *loss_sum)
{
    cdp_status st;
    if ((st = cdp_model_error(m))) return st;
    if (!m->ends_model)
        return cdp_fail(CDP_ERR_INTERNAL, "the loss asked of a range that does not end the model");
    const struct cdp_unit *ul = &m->units[m->n_units - 1];
    if (m->loss != CDP_LOSS_MSE) {
        int V = (int)ul->out.d[ul->out.ndim - 1];
        const int32_t *tg = targets;
        for (int64_t r = 0; r < m->loss_rows; r++)
            if (tg[r] < 0 || tg[r] >= V)
                return cdp_fail(CDP_ERR_INVALID, "target %d of row %lld is outside [0, %d)", tg[r],
                                (long long)r, V);
    }
    const uint64_t toff = (uint64_t)(slot * m->target_bytes_per_slot);
    if ((st = cdp_buffer_write(m->target_buf, toff, targets, (uint64_t)m->target_bytes_per_slot)))
        return cdp_error_context(st, "the targets of the loss");
    if ((st = loss_fwd(m, slot, (char *)cdp_buffer_data(m->target_buf) + toff)))
        return cdp_error_context(st, "the loss");
    if ((st = cdp_buffer_read(m->loss_buf, 0, m->loss_host, (uint64_t)m->loss_rows * 4)))
        return cdp_error_context(st, "reading the losses back");
    double s = 0;
    for (int64_t r = 0; r < m->loss_rows; r++) s += m->loss_host[r];
    *loss_sum = s;
    m->loss_scale[slot] = scale;
    return CDP_OK;
}

/* The gradient of the loss kept by cdp_model_loss, into d (overwritten). */
static cdp_status loss_bwd(struct cdp_model *m, int slot, float *d)
{
    const struct cdp_unit *ul = &m->units[m->n_units - 1];
    const void *tslot = (char *)cdp_buffer_data(m->target_buf) + slot * m->target_bytes_per_slot;
    if (m->loss == CDP_LOSS_MSE)
        CDP_KERNEL(&m->k, mse_bwd, d, cdp_model_output(m, slot), tslot, m->B, (int)ul->out_floats, m->loss_scale[slot]);
    else
        CDP_KERNEL(&m->k, crossentropy_bwd, d, cdp_model_output(m, slot), tslot, (int)m->loss_rows,
                   (int)ul->out.d[ul->out.ndim - 1], m->loss_scale[slot]);
    return CDP_OK;
}

/* Zeroes the n floats of a gradient buffer before a unit accumulates into it. */
static cdp_status zero_floats(struct cdp_model *m, float *p, int64_t n)
{
    CDP_KERNEL(&m->k, zero, p, (size_t)n * 4);
    return CDP_OK;
}

/* Sharded gradients: the floats [from, from + count) of the parameter buffer,
 * at buf, reduced over the replicas (the hook), and this shard's part of them
 * added to what the shard keeps. */
static cdp_status reduce_into_shard(struct cdp_model *m, float *buf, uint64_t from, uint64_t count)
{
    cdp_status st;
    if (m->reduce && (st = m->reduce(m->reduce_ctx, buf, (uint64_t)m->param_floats, from, count))) return st;
    uint64_t at, len;
    cdp_shard_in_window((uint64_t)m->param_floats, m->grad_shards, m->grad_shard, from, count, &at, &len);
    if (len) CDP_KERNEL(&m->k, add, m->acc + (from + at - m->shard_off), buf + at, (size_t)len);
    return CDP_OK;
}

/* The unit's name in a message's context. */
#define UNIT_CTX(st, what, u) cdp_error_context(st, what " of unit %d (%s)", (u)->index, cdp_layer_name((u)->desc.type))

/* The output gradient of the range for a backward over a slot: dout, or the
 * loss's gradient into d0 when the range holds the loss. */
static cdp_status range_dout(struct cdp_model *m, int slot, const float **dout, float *d0)
{
    cdp_status st;
    if (*dout) return CDP_OK;
    if (!m->ends_model) return cdp_fail(CDP_ERR_INTERNAL, "backward without an output gradient on a middle range");
    if ((st = loss_bwd(m, slot, d0))) return cdp_error_context(st, "the loss gradient");
    *dout = d0;
    return CDP_OK;
}

/* Where unit i's input gradient goes in a backward whose output gradient is
 * at cur: din (or nowhere, tokens) for the first unit, else the other of the
 * two gradient buffers, zeroed. */
static cdp_status unit_din(struct cdp_model *m, int i, const float *cur, float *din, float **dst)
{
    const struct cdp_unit *u = &m->units[i];
    float *d0 = cdp_buffer_data(m->dbuf), *d1 = d0 + m->dfloats;
    if (i == 0) {
        *dst = u->in_tokens ? NULL : din;
        return CDP_OK;
    }
    *dst = cur == d0 ? d1 : d0;
    cdp_status st = zero_floats(m, *dst, m->B * shape_numel(&u->in));
    return st ? UNIT_CTX(st, "backward", u) : CDP_OK;
}

/* Unit i's activations for a backward pass over a slot, what the slot does
 * not keep computed again (unit_acts). */
static cdp_status unit_backward_acts(struct cdp_model *m, int slot, int i, float **act, float **tail)
{
    const struct cdp_unit *u = &m->units[i];
    float *scratch = cdp_buffer_data(m->scratch_buf);
    cdp_status st = CDP_OK;
    unit_acts(m, slot, i, act, tail);
    if (u->work_floats && u->recompute == CDP_RECOMPUTE_FULL) st = unit_forward(m, slot, i, *act, *tail, scratch);
    else if (u->work_floats)
        st = cdp_unit_recompute_tail(&m->k, u, &m->pptr[i * CDP_UNIT_MAX_PARAMS], unit_input(m, slot, i), *act,
                                     *tail, scratch, m->B);
    return st ? UNIT_CTX(st, "recomputing", u) : CDP_OK;
}

/* Sharded gradients: unit i's accumulate from zero in the window before its
 * parameter gradients, and are reduced into the shard after them. */
static cdp_status window_open(struct cdp_model *m, int i)
{
    cdp_status st;
    if (m->grad_shards > 1 && m->unit_window[i] && (st = zero_floats(m, m->window, (int64_t)m->unit_window[i])))
        return UNIT_CTX(st, "backward", &m->units[i]);
    return CDP_OK;
}

/* Unit i's gradients of this micro-batch are in place (after its combined
 * backward, or its W): sharded gradients reduce their windows, and the
 * backward hook (gradient buckets) hears of it. */
static cdp_status unit_grads_done(struct cdp_model *m, int i)
{
    cdp_status st;
    for (int k = m->grad_shards > 1 ? m->run_first[i] : 0; m->grad_shards > 1 && k < m->run_first[i + 1]; k++)
        if ((st = reduce_into_shard(m, m->runs[k].win, m->runs[k].from, m->runs[k].count)))
            return UNIT_CTX(st, "reducing the gradients", &m->units[i]);
    if (m->unit_done && (st = m->unit_done(m->unit_done_ctx, i))) return st;
    return CDP_OK;
}

cdp_status cdp_model_backward(struct cdp_model *m, int slot, const float *dout, float *din)
{
    cdp_status st;
    if ((st = cdp_model_error(m))) return st;
    float *scratch = cdp_buffer_data(m->scratch_buf);
    if ((st = range_dout(m, slot, &dout, cdp_buffer_data(m->dbuf)))) return st;
    const float *cur = dout;
    for (int i = m->n_units - 1; i >= 0; i--) {
        const struct cdp_unit *u = &m->units[i];
        float *dst, *act, *tail;
        if ((st = unit_din(m, i, cur, din, &dst))) return st;
        if ((st = unit_backward_acts(m, slot, i, &act, &tail))) return st;
        if ((st = window_open(m, i))) return st;
        if ((st = cdp_unit_backward_split(&m->k, u, &m->pptr[i * CDP_UNIT_MAX_PARAMS],
                                          &m->gptr[i * CDP_UNIT_MAX_PARAMS], unit_input(m, slot, i), act, tail, cur,
                                          dst, scratch, m->B)))
            return UNIT_CTX(st, "backward", u);
        if ((st = unit_grads_done(m, i))) return st;
        cur = dst;
    }
    return CDP_OK;
}

/* ---- split backward ------------------------------------------------------------ */

cdp_status cdp_model_set_split_backward(struct cdp_model *m, int wslots)
{
    if (wslots < 0)
        return cdp_fail(CDP_ERR_INVALID, "split backward: %d W-state slots asked for; 0 or more", wslots);
    cdp_buffer_destroy(m->wstate_buf);
    m->wstate_buf = NULL;
    m->wslots = 0;
    cdp_model_bytes_add_wstate(&m->mb, 0, 0);
    if (!wslots) return CDP_OK;
    const uint64_t bytes = cdp_sat_mul((uint64_t)wslots, (uint64_t)m->wstate_per_slot * 4);
    cdp_status st = alloc(m, bytes, "W-state (split backward)", &m->wstate_buf);
    if (st) return st;
    m->wslots = wslots;
    cdp_model_bytes_add_wstate(&m->mb, (uint64_t)m->wstate_per_slot * 4, wslots);
    return CDP_OK;
}

int cdp_model_wstate_slots(const struct cdp_model *m) { return m->wslots; }

void cdp_model_memory(const struct cdp_model *m, struct cdp_model_bytes *out) { *out = m->mb; }

/* Unit i's W-state in W-state slot wslot. */
static float *unit_wstate(struct cdp_model *m, int wslot, int i)
{
    return (float *)cdp_buffer_data(m->wstate_buf) + (int64_t)wslot * m->wstate_per_slot + m->wstate_off[i];
}

static cdp_status check_split(const struct cdp_model *m, const char *what, int slot, int wslot)
{
    if (slot < 0 || slot >= m->slots)
        return cdp_fail(CDP_ERR_INVALID, "%s: slot %d of a model with %d activation slots", what, slot, m->slots);
    if (!m->wslots)
        return cdp_fail(CDP_ERR_INVALID, "%s: the model has no W-state slots (cdp_model_set_split_backward)", what);
    if (wslot < 0 || wslot >= m->wslots)
        return cdp_fail(CDP_ERR_INVALID, "%s: W-state slot %d of %d", what, wslot, m->wslots);
    return cdp_model_error(m);
}

cdp_status cdp_model_backward_input(struct cdp_model *m, int slot, int wslot, const float *dout, float *din)
{
    cdp_status st;
    if ((st = check_split(m, "the backward's input gradient", slot, wslot))) return st;
    if (dout && cdp_unit_weight_takes_dout(&m->units[m->n_units - 1]))
        return cdp_fail(CDP_ERR_INVALID, "split backward: a range ending with unit %d (%s) takes its output gradient "
                        "from the loss (dout NULL), which its W computes again", m->units[m->n_units - 1].index,
                        cdp_layer_name(m->units[m->n_units - 1].desc.type));
    float *scratch = cdp_buffer_data(m->scratch_buf);
    if ((st = range_dout(m, slot, &dout, cdp_buffer_data(m->dbuf)))) return st;
    const float *cur = dout;
    for (int i = m->n_units - 1; i >= 0; i--) {
        const struct cdp_unit *u = &m->units[i];
        float *dst, *act, *tail;
        if ((st = unit_din(m, i, cur, din, &dst))) return st;
        if ((st = unit_backward_acts(m, slot, i, &act, &tail))) return st;
        if ((st = cdp_unit_backward_input(&m->k, u, &m->pptr[i * CDP_UNIT_MAX_PARAMS], unit_input(m, slot, i), act,
                                          tail, cur, dst, unit_wstate(m, wslot, i), scratch, m->B)))
            return UNIT_CTX(st, "backward (input gradient)", u);
        cur = dst;
    }
    return CDP_OK;
}

cdp_status cdp_model_backward_weight(struct cdp_model *m, int slot, int wslot)
{
    cdp_status st;
    if ((st = check_split(m, "the backward's weight gradient", slot, wslot))) return st;
    float *scratch = cdp_buffer_data(m->scratch_buf);
    for (int i = m->n_units - 1; i >= 0; i--) {
        const struct cdp_unit *u = &m->units[i];
        if (!u->n_params) continue;
        float *act, *tail;
        const float *dout = NULL;
        if (cdp_unit_weight_takes_dout(u)) {
            /* the loss's gradient again, from the kept output and targets: the same kernel on the same values */
            if (i != m->n_units - 1 || !m->ends_model)
                return cdp_fail(CDP_ERR_INTERNAL, "unit %d (%s) needs the loss's gradient but does not end the model",
                                u->index, cdp_layer_name(u->desc.type));
            if ((st = range_dout(m, slot, &dout, cdp_buffer_data(m->dbuf)))) return st;
        }
        if ((st = unit_backward_acts(m, slot, i, &act, &tail))) return st;
        if ((st = window_open(m, i))) return st;
        if ((st = cdp_unit_backward_weight(&m->k, u, &m->pptr[i * CDP_UNIT_MAX_PARAMS],
                                           &m->gptr[i * CDP_UNIT_MAX_PARAMS], unit_input(m, slot, i), act, tail, dout,
                                           unit_wstate(m, wslot, i), scratch, m->B)))
            return UNIT_CTX(st, "backward (weight gradient)", u);
        if ((st = unit_grads_done(m, i))) return st;
    }
    return CDP_OK;
}

void cdp_model_set_backward_hook(struct cdp_model *m, cdp_unit_done_fn fn, void *ctx)
{
    m->unit_done = fn;
    m->unit_done_ctx = ctx;
}

void cdp_model_set_grad_reduce(struct cdp_model *m, cdp_grad_reduce_fn fn, void *ctx)
{
    m->reduce = fn;
    m->reduce_ctx = ctx;
}

int cdp_model_grads_sharded(const struct cdp_model *m) { return m->grad_shards > 1; }

cdp_status cdp_model_reduce_tied_grads(struct cdp_model *m)
{
    cdp_status st;
    if (m->grad_shards < 2) return CDP_OK;
    if ((st = cdp_model_error(m))) return st;
    for (int i = 0; i < m->n_tensors; i++) {
        struct cdp_model_tensor *t = &m->tensors[i];
        if (t->windowed) continue;
        if ((st = reduce_into_shard(m, t->grad, tensor_offset(m, t) / 4, (uint64_t)t->numel)))
            return cdp_error_context(st, "reducing the gradient of %s", t->name);
    }
    return CDP_OK;
}

float *cdp_model_reduced_grad(struct cdp_model *m, int i, uint64_t from)
{
    struct cdp_model_tensor *t = &m->tensors[i];
    if (m->grad_shards < 2) return t->grad + from;
    const uint64_t at = tensor_offset(m, t) / 4 + from;
    CDP_ASSERT(at >= m->shard_off && at < m->shard_off + m->shard_len);
    return m->acc + (at - m->shard_off);
}

/* ---- weights in and out ------------------------------------------------------ */

/* The weights are staged through host memory: a copy of the parameters. */
cdp_status cdp_model_save(struct cdp_model *m, const char *path, const char *const *meta, int n_meta)
{
    cdp_status st;
    struct cdp_safetensors_tensor *ts = calloc((size_t)m->n_tensors + 1, sizeof *ts);
    char *host = malloc((size_t)m->param_floats * 4 + 1);
    if (!ts || !host) {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory writing %s", path);
        goto done;
    }
    if ((st = cdp_buffer_read(m->params_buf, 0, host, (uint64_t)m->param_floats * 4))) {
        st = cdp_error_context(st, "writing %s", path);
        goto done;
    }
    for (int i = 0; i < m->n_tensors; i++) {
        const struct cdp_model_tensor *t = &m->tensors[i];
        ts[i].name = t->name;
        ts[i].dtype = CDP_DTYPE_F32;
        ts[i].dtype_name = "F32";
        ts[i].ndim = t->ndim;
        memcpy(ts[i].shape, t->shape, sizeof t->shape);
        ts[i].data = host + tensor_offset(m, t);
        ts[i].nbytes = (uint64_t)t->numel * 4;
    }
    st = cdp_safetensors_write(path, ts, m->n_tensors, meta, n_meta);
done:
    free(host);
    free(ts);
    return st;
}

/* Which part of a GPT a unit is, by the Hugging Face names (model/hf_gpt2.h):
 * the embedding (unit 0), the head, or a block (*block its 0-based index). */
static enum cdp_hf_part hf_part(const struct cdp_unit *u, int *block)
{
    *block = u->index - 1;
    if (u->index == 0) return CDP_HF_EMBED;
    return u->desc.type == CDP_LAYER_LM_HEAD ? CDP_HF_HEAD : CDP_HF_BLOCK;
}

/* The tensor of file f that holds parameter `param` of unit u: its own name
 * (ours: "layers.N.param", into buf), or in the Hugging Face layout (hf, with
 * prefix) its name there, where a tied head stored once is found under either
 * name: save_pretrained keeps the embedding (wte.weight), safetensors'
 * save_model the head (lm_head.weight). NULL when the file has none; buf
 * names what was looked for. */
static const struct cdp_safetensors_tensor *file_tensor(const struct cdp_safetensors_file *f, int hf,
                                                        const char *prefix, const struct cdp_unit *u,
                                                        const char *param, char *buf, size_t cap, int *conv1d)
{
    *conv1d = 0;
    if (!hf) {
        snprintf(buf, cap, "layers.%d.%s", u->index, param);
        return cdp_safetensors_find(f, buf);
    }
    int block = 0;
    const enum cdp_hf_part part = hf_part(u, &block);
    if (!cdp_hf_gpt2_name(part, block, param, prefix, buf, cap, conv1d)) {
        snprintf(buf, cap, "layers.%d.%s (no Hugging Face GPT-2 name)", u->index, param);
        return NULL;
    }
    const struct cdp_safetensors_tensor *x = cdp_safetensors_find(f, buf);
    if (x) return x;
    char other[96];
    int c;
    if (!strcmp(param, "wte")) cdp_hf_gpt2_name(CDP_HF_HEAD, 0, "lm_head.weight", prefix, other, sizeof other, &c);
    else if (!strcmp(param, "lm_head.weight")) cdp_hf_gpt2_name(CDP_HF_EMBED, 0, "wte", prefix, other, sizeof other, &c);
    else return NULL;
    if ((x = cdp_safetensors_find(f, other))) snprintf(buf, cap, "%s", other);
    return x;
}

/* The plan key of an embedding's context: the GPT's, or the layer's. */
static void context_key(enum cdp_model_kind kind, const struct cdp_unit *u, char *buf, size_t cap)
{
    if (kind == CDP_MODEL_GPT) snprintf(buf, cap, "/model/context");
    else snprintf(buf, cap, "/model/layers/%d/context", u->index);
}

/* Each tensor is read into host memory (and transposed there when the file
 * stores it transposed), then copied to the device. Learned positions (wpe)
 * with more rows than the model's context load their first rows. */
cdp_status cdp_model_load(struct cdp_model *m, const char *path)
{
    struct cdp_safetensors_file *f = NULL;
    cdp_status st = cdp_safetensors_open(path, &f);
    if (st) return st;
    int64_t most = 0;
    for (int i = 0; i < m->n_tensors; i++)
        if (m->tensors[i].numel > most) most = m->tensors[i].numel;
    float *host = malloc((size_t)most * 4 + 1), *tmp = NULL;
    if (!host) {
        cdp_safetensors_close(f);
        return cdp_fail(CDP_ERR_NOMEM, "out of memory reading %s", path);
    }
    const char *prefix = "";
    const int hf = m->n_tensors > 0 && cdp_hf_gpt2_layout(f, m->tensors[0].name, &prefix);
    for (int i = 0; i < m->n_tensors && !st; i++) {
        struct cdp_model_tensor *t = &m->tensors[i];
        /* the owning unit: a tied copy's owner may lie outside the range */
        struct cdp_unit owner = {.index = t->unit};
        for (int k = 0; k < m->n_units; k++)
            if (m->units[k].index == t->unit) owner = m->units[k];
        if (owner.index == 0) owner.desc.type = CDP_LAYER_EMBEDDING;
        const char *pname = strchr(strchr(t->name, '.') + 1, '.') + 1;
        char name[128];
        int transposed = 0;
        const struct cdp_safetensors_tensor *x =
            file_tensor(f, hf, prefix, &owner, pname, name, sizeof name, &transposed);
        if (!x) {
            st = cdp_safetensors_read_f32(f, name, t->ndim, t->shape, host); /* names what is missing */
        } else if (!strcmp(pname, "wpe") && x->ndim == 2 && t->ndim == 2 && x->shape[1] == t->shape[1] &&
                   x->shape[0] != t->shape[0]) {
            char key[64];
            context_key(m->kind, &owner, key, sizeof key);
            if (x->shape[0] < t->shape[0]) {
                st = cdp_fail(CDP_ERR_INVALID,
                              "%s: tensor %s: %lld learned positions, fewer than the model's context %lld (%s); "
                              "a context of at most %lld can load it",
                              path, name, (long long)x->shape[0], (long long)t->shape[0], key,
                              (long long)x->shape[0]);
            } else {
                st = cdp_safetensors_read_f32_range(f, name, 0, (uint64_t)t->numel, host);
                if (!st)
                    CDP_INFO(CKPT, "%s: tensor %s has %lld positions; using the first %lld (%s %lld)", path, name,
                             (long long)x->shape[0], (long long)t->shape[0], key, (long long)t->shape[0]);
            }
        } else if (!transposed) {
            st = cdp_safetensors_read_f32(f, name, t->ndim, t->shape, host);
        } else {
            int64_t shape[2] = {t->shape[1], t->shape[0]};
            if (!tmp && !(tmp = malloc((size_t)most * 4 + 1))) {
                st = cdp_fail(CDP_ERR_NOMEM, "out of memory reading %s", path);
                break;
            }
            st = cdp_safetensors_read_f32(f, name, 2, shape, tmp);
            for (int64_t r = 0; !st && r < shape[0]; r++)
                for (int64_t c = 0; c < shape[1]; c++) host[c * shape[0] + r] = tmp[r * shape[1] + c];
        }
        if (!st && (st = cdp_buffer_write(m->params_buf, tensor_offset(m, t), host, (uint64_t)t->numel * 4)))
            st = cdp_error_context(st, "%s: loading %s", path, t->name);
    }
    free(host);
    free(tmp);
    cdp_safetensors_close(f);
    if (!st)
        CDP_INFO(CKPT, "loaded %d tensors from %s%s", m->n_tensors, path, hf ? " (Hugging Face GPT-2 layout)" : "");
    return st;
}

/* ---- what a weights file holds that the plan does not use ---------------------------- */

/* The tensor's index in f. */
static int tensor_index(const struct cdp_safetensors_file *f, const struct cdp_safetensors_tensor *x)
{
    for (int i = 0; i < cdp_safetensors_count(f); i++)
        if (cdp_safetensors_at(f, i) == x) return i;
    return -1;
}

/* Two tensors with the same dtype, shape and bytes (a tied head stored twice). */
static int same_tensor(const struct cdp_safetensors_tensor *a, const struct cdp_safetensors_tensor *b)
{
    if (strcmp(a->dtype_name, b->dtype_name) || a->ndim != b->ndim || a->nbytes != b->nbytes) return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return 0;
    return memcmp(a->data, b->data, (size_t)a->nbytes) == 0;
}

/* Appends to a message buffer. */
static void add(char *buf, size_t cap, const char *fmt, ...) CDP_PRINTF(3, 4);
static void add(char *buf, size_t cap, const char *fmt, ...)
{
    size_t n = strlen(buf);
    if (n + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, cap - n, fmt, ap);
    va_end(ap);
}

#define UNUSED_LISTED 4

cdp_status cdp_model_check_weights(const struct cdp_model_desc *desc, const char *path)
{
    struct cdp_unit *all = NULL;
    int n_all = 0;
    cdp_status st = cdp_units_build(desc, &all, &n_all);
    if (st) return st;
    struct cdp_safetensors_file *f = NULL;
    if ((st = cdp_safetensors_open(path, &f))) {
        free(all);
        return st;
    }
    const int nf = cdp_safetensors_count(f);
    char *used = calloc((size_t)nf + 1, 1);
    if (!used) {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory checking %s", path);
        goto done;
    }
    /* the layout, decided as cdp_model_load decides it: by our first tensor's name */
    char first[96] = "";
    for (int u = 0; u < n_all && !first[0]; u++)
        if (all[u].n_params) snprintf(first, sizeof first, "layers.%d.%s", all[u].index, all[u].params[0].name);
    const char *prefix = "";
    const int hf = first[0] && cdp_hf_gpt2_layout(f, first, &prefix);
    const struct cdp_safetensors_tensor *wte = NULL, *head = NULL;
    const int gpt = desc->kind == CDP_MODEL_GPT;
    for (int u = 0; u < n_all; u++) {
        for (int p = 0; p < all[u].n_params; p++) {
            if (all[u].params[p].tied_unit >= 0) continue; /* stored as its owner */
            char name[128];
            int conv1d;
            const struct cdp_safetensors_tensor *x =
                file_tensor(f, hf, prefix, &all[u], all[u].params[p].name, name, sizeof name, &conv1d);
            if (!x) continue; /* the load names what is missing */
            used[tensor_index(f, x)] = 1;
            if (u == 0 && !strcmp(all[u].params[p].name, "wte")) wte = x;
        }
    }
    /* a tied plan: a head stored beside the embedding is used when it is the same tensor */
    if (gpt && desc->tie_embeddings && hf && wte) {
        char name[96];
        int c;
        cdp_hf_gpt2_name(CDP_HF_HEAD, 0, "lm_head.weight", prefix, name, sizeof name, &c);
        head = cdp_safetensors_find(f, name);
        if (head && head != wte && same_tensor(head, wte)) used[tensor_index(f, head)] = 1;
    }
    int n_unused = 0, buffers = 0, lo = -1, hi = -1, untied_head = 0, top_unit = -1;
    char list[512] = "";
    for (int i = 0; i < nf; i++) {
        const char *name = cdp_safetensors_at(f, i)->name;
        int block = -1;
        if (used[i]) continue;
        if (hf && cdp_hf_gpt2_is_buffer(name, &block) && block < desc->layers) {
            buffers++;
            continue;
        }
        if (n_unused < UNUSED_LISTED) add(list, sizeof list, "%s%s", n_unused ? ", " : "", name);
        n_unused++;
        enum cdp_hf_part part = CDP_HF_EMBED;
        const char *param = "";
        int c, unit;
        if (hf && cdp_hf_gpt2_is_buffer(name, &block)) part = CDP_HF_BLOCK;
        else if (hf && !cdp_hf_gpt2_parse(name, &part, &block, &param, &c)) continue;
        if (hf) {
            if (gpt && part == CDP_HF_BLOCK && block >= desc->layers) {
                if (lo < 0 || block < lo) lo = block;
                if (block > hi) hi = block;
            }
            if (gpt && part == CDP_HF_HEAD && !strcmp(param, "lm_head.weight")) untied_head = 1;
        } else if (sscanf(name, "layers.%d.", &unit) == 1) {
            if (unit > top_unit) top_unit = unit;
            const char *dot = strchr(name + 7, '.');
            if (gpt && dot && !strcmp(dot + 1, "lm_head.weight")) untied_head = 1;
        }
    }
    if (buffers) CDP_DEBUG(CKPT, "%s: %d causal-mask buffers (h.N.attn.bias) skipped: not weights", path, buffers);
    if (!n_unused) goto done;

    char msg[2048];
    snprintf(msg, sizeof msg, "%s: %d tensor%s in the file %s not used by the plan's model: %s%s", path, n_unused,
             n_unused == 1 ? "" : "s", n_unused == 1 ? "is" : "are", list,
             n_unused > UNUSED_LISTED ? ", ..." : "");
    if (lo >= 0)
        add(msg, sizeof msg, "; /model/layers: the file has blocks %d-%d (%sh.%d.* .. %sh.%d.*) beyond the plan's "
            "%lld; layers %d would use them", lo, hi, prefix, lo, prefix, hi, (long long)desc->layers, hi + 1);
    if (!hf && top_unit >= 0 && top_unit != n_all - 1)
        add(msg, sizeof msg, "; %s: the file has units 0-%d, the plan's model 0-%d%s", gpt ? "/model/layers" : "/model",
            top_unit, n_all - 1, gpt ? " (a GPT of N blocks has N + 2 units)" : "");
    if (untied_head)
        add(msg, sizeof msg, "; /model/tie_embeddings: the file has an untied head (lm_head.weight, not the "
            "embedding); tie_embeddings false would use it");
    if (desc->unused_tensors == CDP_UNUSED_WARN) {
        CDP_WARN(CKPT, "%s (loaded without them: /model/unused_tensors is \"warn\")", msg);
    } else {
        st = cdp_fail(CDP_ERR_INVALID, "%s; /model/unused_tensors \"warn\" loads the rest with a warning", msg);
    }
done:
    free(used);
    cdp_safetensors_close(f);
    free(all);
    return st;
}
