/* Models (model.h): the passes over a range's units through the device's
 * kernel table: forward, the loss, backward (whole, or split into its input
 * and weight halves), the gradient hooks and the tied gradients. */
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

void cdp_model_zero_grad(struct cdp_model *m)
{
    cdp_status st = cdp_model_zero_grads(m);
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

/* A vocab-parallel head's loss statistics of a slot: [loss_rows, 2t + 1]
 * floats after the slot's targets (cdp_unit_bytes sizes them), kept from
 * the loss to the backward (and its W), so that neither sums over the group
 * again. */
static float *vp_stats(struct cdp_model *m, int slot)
{
    return (float *)((char *)cdp_buffer_data(m->target_buf) + slot * m->target_bytes_per_slot + m->loss_rows * 4);
}

/* The per-row losses of a slot's output against the targets already on the device. */
static cdp_status loss_fwd(struct cdp_model *m, int slot, const void *tdev)
{
    const struct cdp_unit *ul = &m->units[m->n_units - 1];
    const float *outp = cdp_model_output(m, slot);
    float *losses = cdp_buffer_data(m->loss_buf);
    int64_t off, valid;
    if (m->loss != CDP_LOSS_MSE && cdp_unit_vocab_split(ul, &off, &valid)) {
        /* vocab-parallel: each rank's maximum and sum of exponentials over its slice, and the target's logit
         * where it holds it, summed over the group in one all-reduce; the whole logits are never gathered */
        const int t = ul->tp_size, N = (int)m->loss_rows;
        float *stats = vp_stats(m, slot);
        CDP_KERNEL(&m->k, crossentropy_vp_stats, stats, outp, tdev, N, (int)ul->out.d[ul->out.ndim - 1], (int)valid,
                   (int)off, ul->tp_index, t);
        cdp_status st = ul->tp && ul->tp->all_reduce_f32
                            ? ul->tp->all_reduce_f32(ul->tp->ctx, stats, (int64_t)N * (2 * t + 1))
                            : cdp_fail(CDP_ERR_INTERNAL, "unit %d: vocab-parallel over %d ranks but has no tensor "
                                       "group's fp32 sum", ul->index, t);
        if (st) return st;
        CDP_KERNEL(&m->k, crossentropy_vp_fwd, losses, stats, N, t);
        return CDP_OK;
    }
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
    int64_t off, valid;
    const int vp = m->loss != CDP_LOSS_MSE && cdp_unit_vocab_split(ul, &off, &valid);
    if (m->loss != CDP_LOSS_MSE) {
        int V = vp ? (int)ul->desc.vocab : (int)ul->out.d[ul->out.ndim - 1]; /* the whole vocabulary */
        const int32_t *tg = targets;
        for (int64_t r = 0; r < m->loss_rows; r++)
            if (tg[r] < 0 || tg[r] >= V)
                return cdp_fail(CDP_ERR_INVALID, "target %d of row %lld is outside [0, %d)", tg[r],
                                (long long)r, V);
    }
    const uint64_t toff = (uint64_t)(slot * m->target_bytes_per_slot);
    /* cross-entropy: a token id a row (a vocab-parallel slot holds its statistics after them) */
    const uint64_t tbytes = m->loss == CDP_LOSS_MSE ? (uint64_t)m->target_bytes_per_slot : (uint64_t)m->loss_rows * 4;
    if ((st = cdp_buffer_write(m->target_buf, toff, targets, tbytes)))
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
    int64_t off, valid;
    if (m->loss != CDP_LOSS_MSE && cdp_unit_vocab_split(ul, &off, &valid)) {
        /* softmax of the slice minus one-hot where the target is in it, from the kept statistics: local */
        CDP_KERNEL(&m->k, crossentropy_vp_bwd, d, cdp_model_output(m, slot), tslot, vp_stats(m, slot),
                   (int)m->loss_rows, (int)ul->out.d[ul->out.ndim - 1], (int)valid, (int)off, ul->tp_size,
                   m->loss_scale[slot]);
        return CDP_OK;
    }
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
    cdp_status st = cdp_model_alloc(m, bytes, "W-state (split backward)", &m->wstate_buf);
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

