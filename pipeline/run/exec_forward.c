/* The executor's forward passes: training's validation (cdp_exec_validate),
 * the validation loss of given weights alone (cdp_exec_eval, `cdphybrid
 * eval`) and decoding with a KV cache (cdp_exec_decoder_*, `cdphybrid
 * generate`), each the forward-only schedule run by the interpreter of a step
 * (interpret.c) on a rank set up as training sets it up: eval gives
 * training's val_loss bit for bit, and generate the same tokens on one rank
 * and on a pipeline. */
#include <stdio.h>
#include <stdlib.h>

#include "cdp/core.h"
#include "comm/nccl.h"
#include "kernels/cpu/ops.h" /* cdp_cpu_set_threads */
#include "model/checkpoint.h"
#include "model/infer.h"
#include "pipeline/run/exec_internal.h"
#include "pipeline/run/executor.h"

/* ---- validation (training's, eval's) ---- */

/* The forward-only schedule of n micro-batches in windows of at most mcap
 * (what the slots' bookkeeping holds), run as a step's list is: the same
 * table of instructions, in forward-only mode, with no trace. */
static cdp_status run_forward(struct exec *e, int64_t n)
{
    struct cdp_schedule *const train = e->sched;
    struct cdp_trace *const trace = e->trace;
    const int m = e->m, w = (int)(n < e->mcap ? n : e->mcap);
    struct cdp_schedule *fs = NULL;
    cdp_status st = CDP_OK;
    e->fwd = 1;
    e->fwd_sum = 0;
    e->trace = NULL;
    for (int64_t base = 0; base < n && !st; base += w) {
        const int mw = (int)(n - base < w ? n - base : w);
        if (!fs || fs->m != mw) {
            cdp_schedule_free(fs);
            fs = NULL;
            if ((st = cdp_schedule_build_forward(e->lay->schedule, e->p, e->v, mw, &fs))) break;
        }
        e->sched = fs;
        e->m = mw; /* the tags of this window's transfers */
        e->fwd_base = base;
        st = cdp_exec_run_list(e);
        if (!st) st = cdp_exec_drain_sends(e);
    }
    for (int k = 0; k < e->v; k++) { /* a failed window may leave slots taken */
        struct chunk *c = &e->ch[k];
        for (int i = 0; i < c->nslots; i++)
            if (c->slot_mb[i] >= 0) {
                c->mb_slot[c->slot_mb[i]] = -1;
                c->slot_mb[i] = -1;
            }
    }
    cdp_schedule_free(fs);
    e->sched = train;
    e->m = m;
    e->trace = trace;
    e->fwd = 0;
    return st;
}

/* Validation on replica 0: the forward-only schedule; the loss is the same
 * sum as one-rank validation's, over the same samples in the same order. */
cdp_status cdp_exec_validate(struct exec *e, int64_t n, double *val, double *rows_per_sample)
{
    cdp_status st = CDP_OK;
    /* the same BLAS threads as `cdphybrid eval` on one rank, whatever this rank got */
    const int threads = cdp_cpu_threads();
    cdp_cpu_set_threads(CDP_CPU_EXACT_THREADS);
    if (e->r == 0) st = run_forward(e, n);
    cdp_cpu_set_threads(threads);
    /* rows per sample (every token of a token model, else 1) are known where
     * the data is read */
    /* a tensor group's ranks compute one loss: its index 0 counts it */
    double red[2] = {e->r == 0 && e->k == 0 ? e->fwd_sum : 0,
                     e->shape ? (e->shape->tokens ? (double)e->shape->input_numel : 1.0) : 0};
    if (!st) st = cdp_comm_allreduce_f64(e->world, &red[0], 1, CDP_REDUCE_SUM, e->timeout);
    if (!st) st = cdp_comm_allreduce_f64(e->world, &red[1], 1, CDP_REDUCE_MAX, e->timeout);
    if (!st) *val = red[0] / ((double)n * e->B * red[1]);
    if (!st && rows_per_sample) *rows_per_sample = red[1];
    return st;
}

/* ---- eval ---- */

/* A checkpoint's tensors of this rank's chunks, wherever they were trained. */
static cdp_status load_checkpoint(struct exec *e, const char *path, const struct cdp_ckpt_info *info)
{
    struct cdp_model **models = malloc((size_t)e->v * sizeof *models);
    if (!models) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    for (int k = 0; k < e->v; k++) models[k] = e->ch[k].model;
    cdp_status st = cdp_ckpt_load(path, info, models, NULL, e->v);
    free(models);
    return st;
}

cdp_status cdp_exec_eval(const struct cdp_plan *p, const struct cdp_layout *layout, cdp_comm_t world,
                         const struct cdp_exec_eval_opts *o, struct cdp_exec_eval_result *out)
{
    struct exec e = {.plan = p, .lay = layout, .world = world, .ckpt_lock = -1, .eval_only = 1};
    cdp_status st = cdp_exec_setup(&e);
    if (!st && o->ckpt_path) st = load_checkpoint(&e, o->ckpt_path, o->ckpt);
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

/* ---- decoding ---- */

struct cdp_exec_decoder {
    struct exec e;
};

cdp_status cdp_exec_decoder_open(const struct cdp_plan *p, const struct cdp_layout *layout, cdp_comm_t world,
                                 const char *ckpt_path, const struct cdp_ckpt_info *ckpt, int64_t context,
                                 struct cdp_exec_decoder **out)
{
    struct cdp_exec_decoder *d = calloc(1, sizeof *d);
    if (!d) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    struct exec *e = &d->e;
    *e = (struct exec){.plan = p, .lay = layout, .world = world, .ckpt_lock = -1, .eval_only = 1, .no_data = 1};
    cdp_status st = cdp_exec_setup(e);
    if (!st && ckpt_path) st = load_checkpoint(e, ckpt_path, ckpt);
    /* every step runs the forward lists of one micro-batch */
    struct cdp_schedule *fs = NULL;
    if (!st && !(st = cdp_schedule_build_forward(layout->schedule, e->p, e->v, 1, &fs))) {
        cdp_schedule_free(e->sched);
        e->sched = fs;
        e->m = 1;
    }
    for (int k = 0; k < e->v && !st; k++) {
        struct chunk *c = &e->ch[k];
        if ((st = cdp_infer_create(c->model, context, &c->inf))) break;
        if ((c->vstage > 0 && !(c->dec_in = malloc((size_t)cdp_infer_in_floats(c->inf, context) * sizeof(float)))) ||
            (c->vstage < e->nv - 1 &&
             !(c->dec_out = malloc((size_t)cdp_infer_out_floats(c->inf, context) * sizeof(float)))))
            st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
    }
    if (st) {
        cdp_nccl_abort_all();
        if (e->size <= 1) cdp_exec_free(e);
        free(d);
        return st;
    }
    /* the same logits on one rank and on a pipeline, whatever CPUs a rank got */
    cdp_cpu_set_threads(CDP_CPU_EXACT_THREADS);
    *out = d;
    return CDP_OK;
}

int cdp_exec_decoder_last(const struct cdp_exec_decoder *d)
{
    for (int k = 0; k < d->e.v; k++)
        if (d->e.ch[k].vstage == d->e.nv - 1) return 1;
    return 0;
}

int64_t cdp_exec_decoder_position(const struct cdp_exec_decoder *d) { return cdp_infer_position(d->e.ch[0].inf); }

void cdp_exec_decoder_reset(struct cdp_exec_decoder *d)
{
    for (int k = 0; k < d->e.v; k++) cdp_infer_reset(d->e.ch[k].inf);
}

cdp_status cdp_exec_decoder_step(struct cdp_exec_decoder *d, const int32_t *tokens, int64_t n, float *logits)
{
    struct exec *e = &d->e;
    e->dec = 1;
    e->dec_tokens = tokens;
    e->dec_n = n;
    e->dec_logits = logits;
    cdp_status st = cdp_exec_run_list(e);
    if (!st) st = cdp_exec_drain_sends(e);
    e->dec = 0;
    if (st) {
        char msg[4096];
        snprintf(msg, sizeof msg, "%s", cdp_last_error());
        st = cdp_fail(st, "%s: %s", cdp_exec_where_buf, msg);
    }
    return st;
}

void cdp_exec_decoder_close(struct cdp_exec_decoder *d)
{
    if (!d) return;
    cdp_exec_free(&d->e);
    free(d);
}
