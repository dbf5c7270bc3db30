/* Models (model.h): the bytes a unit and a range of units need on a device,
 * computed from their shapes before anything is made (the planner's memory
 * check and the model's own accounting use the same sums). */
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
    int64_t off, valid; /* a vocab-parallel head: each row's loss statistics after its target (model_pass.c) */
    if (loss != CDP_LOSS_MSE && cdp_unit_vocab_split(u, &off, &valid))
        out->target_bytes += rows * (uint64_t)(2 * u->tp_size + 1) * 4;
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

