/* Forward passes alone on the executor (executor.h, cdp_exec_eval): the
 * validation loss of given weights, over the ranks of a layout, through the
 * same set-up, forward-only schedule and interpreter as training's
 * validation, so `cdphybrid eval` gives training's val_loss bit for bit. */
#include <stdlib.h>

#include "cdp/core.h"
#include "comm/nccl.h"
#include "model/checkpoint.h"
#include "pipeline/exec_internal.h"
#include "pipeline/executor.h"

cdp_status cdp_exec_eval(const struct cdp_plan *p, const struct cdp_layout *layout, cdp_comm_t world,
                         const struct cdp_exec_eval_opts *o, struct cdp_exec_eval_result *out)
{
    struct exec e = {.plan = p, .lay = layout, .world = world, .ckpt_lock = -1, .eval_only = 1};
    struct cdp_model **models = NULL;
    cdp_status st = cdp_exec_setup(&e);
    if (!st && o->ckpt_path) { /* the step's tensors of this rank's chunks, wherever they were trained */
        if (!(models = malloc((size_t)e.v * sizeof *models))) st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
        for (int k = 0; !st && k < e.v; k++) models[k] = e.ch[k].model;
        if (!st) st = cdp_ckpt_load(o->ckpt_path, o->ckpt, models, NULL, e.v);
        free(models);
    }
    if (!st) {
        snprintf(cdp_exec_where_buf, sizeof cdp_exec_where_buf, "rank %d/%d (stage %d): evaluating", e.rank, e.size,
                 e.s);
        st = cdp_exec_validate(&e, o->batches, &out->loss, &out->rows_per_sample);
    }
    double tokens = e.shape && e.shape->tokens; /* known where the data is read */
    if (!st) st = cdp_comm_allreduce_f64(world, &tokens, 1, CDP_REDUCE_MAX, e.timeout);
    if (!st) out->tokens = tokens > 0;
    if (!st) {
        cdp_exec_free(&e);
        return CDP_OK;
    }
    /* as cdp_exec_run: the caller aborts a job of several ranks (others may wait on this one) */
    cdp_nccl_abort_all();
    if (e.size <= 1) cdp_exec_free(&e);
    return st;
}
