/* Models (model.h): making a stage range on a device (its parameters,
 * gradients, activations and scratch; ZeRO-2 gradient shards) and
 * destroying it. */
#include "model/model.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "kernels/ops.h"
#include "model/hf_gpt2.h"
#include "model/model_internal.h"
#include "model/safetensors.h"

cdp_status cdp_model_alloc(struct cdp_model *m, uint64_t bytes, const char *what, cdp_buffer_t *out)
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

cdp_status cdp_model_zero_grads(struct cdp_model *m)
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
    return cdp_model_create_tensor(desc, first, end, B, slots, seed, r, shards, shard, NULL, dev, out);
}

cdp_status cdp_model_create_tensor(const struct cdp_model_desc *desc, int first, int end, int B, int slots,
                                   uint64_t seed, enum cdp_recompute r, int shards, int shard,
                                   const struct cdp_tensor_group *tg, cdp_device_t dev, struct cdp_model **out)
{
    cdp_status st;
    struct cdp_unit *all = NULL;
    int n_all = 0;
    if ((st = cdp_units_build_tensor(desc, tg ? tg->size : 1, tg ? tg->index : 0, &all, &n_all))) return st;
    for (int i = 0; tg && i < n_all; i++) all[i].tp = tg;
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
            t->param_local = p;
            t->windowed = pd->tied_unit < 0 && !pd->tie_target;
            t->data = (float *)(intptr_t)off; /* offsets until the buffers exist */
            off += pd->numel;
        }
    }
    m->param_floats = off;
    m->grad_floats = (int64_t)(mb.grads / 4);
    CDP_ASSERT((uint64_t)off * 4 == mb.params);
    if ((st = cdp_model_alloc(m, mb.params, "parameters", &m->params_buf))) goto fail;
    if ((st = cdp_model_alloc(m, mb.grads, shards > 1 ? "gradients (this replica's shard, tied tensors, one unit's window)"
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
    if ((st = cdp_model_zero_grads(m))) goto fail;

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
        if ((st = cdp_model_alloc(m, mb.targets, "targets", &m->target_buf))) goto fail;
        if ((st = cdp_model_alloc(m, mb.losses, "losses", &m->loss_buf))) goto fail;
        if (!(m->loss_host = malloc((size_t)m->loss_rows * 4 + 1))) {
            st = cdp_fail(CDP_ERR_NOMEM, "out of memory for a model");
            goto fail;
        }
    }
    if ((st = cdp_model_alloc(m, mb.activations, "activations", &m->acts_buf))) goto fail;
    if ((st = cdp_model_alloc(m, mb.inputs, "inputs", &m->input_buf))) goto fail;
    if ((st = cdp_model_alloc(m, mb.scratch, "scratch", &m->scratch_buf))) goto fail;
    if ((st = cdp_model_alloc(m, mb.grad_buffers, "gradient buffers", &m->dbuf))) goto fail;
    if (mb.recompute && (st = cdp_model_alloc(m, mb.recompute, "recomputation buffer", &m->work_buf))) goto fail;
    free(all);
    *out = m;
    return CDP_OK;
fail:
    free(all);
    cdp_model_destroy(m);
    return st;
}

