/* Internal to the model files of src/model/ (model*.c): the model object
 * and the helpers they share. Not for other layers: the interface is
 * model/model.h. */
#ifndef CDP_MODEL_MODEL_INTERNAL_H
#define CDP_MODEL_MODEL_INTERNAL_H

#include "kernels/ops.h"
#include "model/model.h"

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

/* Byte offset of a tensor in the parameter (and gradient) buffer. */
static inline uint64_t tensor_offset(const struct cdp_model *m, const struct cdp_model_tensor *t)
{
    return (uint64_t)(t->data - (const float *)cdp_buffer_data(m->params_buf)) * 4;
}

static inline float *slot_act(struct cdp_model *m, int slot, int i)
{
    return (float *)cdp_buffer_data(m->acts_buf) + slot * m->acts_per_slot + m->act_off[i];
}
static inline int64_t shape_numel(const struct cdp_shape *s)
{
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++) n *= s->d[d];
    return n;
}

/* model_create.c: a buffer of the model's device (the message names what it is for). */
cdp_status cdp_model_alloc(struct cdp_model *m, uint64_t bytes, const char *what, cdp_buffer_t *out);
/* model_create.c: zero the gradient buffer (a range without parameters has none). */
cdp_status cdp_model_zero_grads(struct cdp_model *m);

#endif
