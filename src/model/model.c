/* Models and stage ranges of models (model.h): what a model holds, asked.
 * The work is in model_create.c (memory), model_pass.c (forward, loss,
 * backward), model_weights.c (weights in and out of safetensors files) and
 * model_bytes.c (what a range needs, before it is made). Device memory is
 * only touched by the kernels and the buffer copies, so the same code runs on
 * a device the host cannot address. */
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

double cdp_model_step_flops(const struct cdp_model *m)
{
    double f = 0;
    for (int i = 0; i < m->n_units; i++) {
        const struct cdp_unit *u = &m->units[i];
        /* a tensor group's replicated unit: every rank repeats the same work, index 0 counts it */
        if (u->tp_size > 1 && !cdp_unit_tensor_split(u) && u->tp_index > 0) continue;
        /* a vocabulary slice computes its padding columns too; the model's FLOPs are its real ones' */
        int64_t off, valid;
        const double real = cdp_unit_vocab_split(u, &off, &valid)
                                ? (double)valid / (double)u->out.d[u->out.ndim - 1] : 1.0;
        f += (u->fwd_flops + u->bwd_flops) * real;
    }
    return f * m->B;
}

void *cdp_model_input(struct cdp_model *m, int slot)
{
    return (char *)cdp_buffer_data(m->input_buf) + slot * m->input_bytes_per_slot;
}

float *cdp_model_output(struct cdp_model *m, int slot) { return slot_act(m, slot, m->n_units - 1); }

