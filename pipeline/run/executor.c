/* The executor's step driver (executor.h): sets a rank up from its layout,
 * runs every step (the interpreter, the reductions of the step's figures, the
 * monitor, validation, checkpoints, rebalancing, the reports), and ends with
 * the outputs and the summary. Its parts are in exec_internal.h. */
#include "pipeline/run/executor.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "core/file.h"
#include "comm/nccl.h"
#include "model/optim.h"
#include "pipeline/run/tensorboard.h"
#include "pipeline/run/exec_internal.h"

const char *cdp_exec_where(void) { return cdp_exec_where_buf; }

/* A stop asked of this rank (cdp_exec_request_stop, from a signal handler),
 * and where the run stopped for it. */
static volatile sig_atomic_t stop_asked;
static int64_t stopped_after = -1, stop_saved = -1;

void cdp_exec_request_stop(void) { stop_asked = 1; }

int64_t cdp_exec_stopped(int64_t *saved)
{
    if (saved) *saved = stop_saved;
    return stopped_after;
}

cdp_status cdp_exec_check(const struct cdp_plan *p)
{
    if (p->train.precision != CDP_PRECISION_FP32 && !cdp_backend_is_gpu(p->cluster.backend))
        return cdp_fail(CDP_ERR_UNSUPPORTED, "%s: /train/precision is \"bf16\": the cpu backend trains in fp32; "
                        "use \"fp32\", or /cluster/backend \"cuda\"", p->source);
    if ((p->parallel.comm_bf16_tensor || p->parallel.comm_bf16_gradients) && cdp_backend_is_gpu(p->cluster.backend))
        return cdp_fail(CDP_ERR_UNSUPPORTED, "%s: /parallel/comm_dtype: \"bf16\" on CUDA needs a kernel not yet run "
                        "on a GPU (bf16 to fp32 after the NCCL collective); use \"fp32\"", p->source);
    /* every output before the first step, not after the whole run */
    const struct {
        const char *key, *path;
        int dir;
    } out[] = {{"/output/metrics", p->output.metrics, 0},  {"/output/trace", p->output.trace, 0},
               {"/output/timeline", p->output.timeline, 0}, {"/output/weights", p->output.weights, 0},
               {"/train/checkpoint/dir", p->train.checkpoint.dir, 1}, {"/output/tensorboard", p->output.tensorboard, 1}};
    for (size_t i = 0; i < sizeof out / sizeof out[0]; i++) {
        if (!out[i].path) continue;
        cdp_status st = cdp_check_writable(out[i].path, out[i].dir);
        if (st) return cdp_error_context(st, "%s: %s", p->source, out[i].key);
    }
    return CDP_OK;
}

/* One step of this rank, then its figures reduced over every rank. The
 * bubble is the idle share of the forward/backward phase: the longest rank's
 * time from its step start to its last backward is the phase; each rank's
 * idle time is the phase minus its own loading, forward and backward. */
static cdp_status run_step(struct exec *e, int step, struct cdp_exec_step *s)
{
    cdp_status st;
    e->step = step;
    e->lr = cdp_lr_at(&e->plan->train, step);
    e->loss_sum = 0;
    e->t_compute = e->t_comm = e->t_idle = e->t_fb = e->t_tensor = 0;
    e->step_start = e->fb_end = cdp_time_ns();
    for (int k = 0; k < e->v; k++) cdp_model_zero_grad(e->ch[k].model);
    e->t_compute += cdp_time_ns() - e->step_start;
    if ((st = cdp_fault_at_step(&e->fault, e->rank, step))) return st;
    if ((st = cdp_exec_run_list(e)) || (st = cdp_exec_drain_sends(e))) return st;
    const uint64_t t_end = cdp_time_ns();
    /* the split layers' all-reduces run inside forwards and backwards: communication, not compute */
    const uint64_t tt = e->t_tensor < e->t_compute ? e->t_tensor : e->t_compute;
    e->t_compute -= tt;
    e->t_comm += tt;
    /* a tensor group's ranks compute the same loss: its index 0 counts it */
    double red[7] = {e->k == 0 ? e->loss_sum : 0, (double)e->t_fb / 1e9, (double)e->t_compute / 1e9, (double)e->t_comm / 1e9,
                     (double)e->t_idle / 1e9, (double)(t_end - e->step_start) / 1e9, (double)tt / 1e9};
    /* a stop asked of any rank ends every rank after this step */
    double mx[3] = {e->shape ? (double)e->scale : 0, (double)(e->fb_end - e->step_start) / 1e9, (double)stop_asked};
    if ((st = cdp_comm_allreduce_f64(e->world, red, 7, CDP_REDUCE_SUM, e->timeout))) return st;
    if ((st = cdp_comm_allreduce_f64(e->world, mx, 3, CDP_REDUCE_MAX, e->timeout))) return st;
    *s = (struct cdp_exec_step){.step = step, .loss = red[0] * mx[0],
                                .bubble = mx[1] > 0 ? fmax(0.0, 1.0 - red[1] / e->size / mx[1]) : 0,
                                .time_s = (double)(t_end - e->step_start) / 1e9, .val_loss = NAN,
                                .compute_s = red[2] / e->size, .comm_s = red[3] / e->size,
                                .idle_s = red[4] / e->size, .step_s = red[5] / e->size, .tensor_s = red[6] / e->size,
                                .stop = mx[2] > 0};
    if (!isfinite(s->loss))
        return cdp_fail(CDP_ERR_INVALID, "step %d: the loss is %g; lower /train/optimizer/lr or set "
                        "/train/grad_clip", step, s->loss);
    return CDP_OK;
}

/* Busy time since the monitor's last report. */
struct monitor_acc {
    double busy;
    int steps;
    int64_t mbs;
};

/* On the first step, every log_every and the last: every rank's figures (a
 * collective), and a warning when a straggler appears. */
static cdp_status monitor_step(struct exec *e, struct monitor_acc *acc, struct cdp_exec_step *s)
{
    const struct cdp_plan *p = e->plan;
    acc->busy += (double)e->t_fb / 1e9;
    acc->steps++;
    acc->mbs += e->m;
    s->report = s->step == e->step0 + 1 || s->step % p->train.log_every == 0 || s->step == p->train.steps;
    if (!s->report) return CDP_OK;
    cdp_status st = cdp_monitor_collect(e->monitor, e->world, acc->busy, acc->steps, acc->mbs, e->timeout, &s->mon);
    if (st) return st;
    *acc = (struct monitor_acc){0};
    const struct cdp_monitor_report *mon = &s->mon;
    if (mon->straggler >= 0 && e->rank == 0)
        CDP_WARN(EXEC, "rank %d (stage %d, replica %d) has been the slowest of stage %d's replicas in %d "
                 "reports running: %.2f ms per micro-batch against their median %.2f ms%s", mon->straggler,
                 mon->ranks[mon->straggler].stage, mon->ranks[mon->straggler].replica,
                 mon->ranks[mon->straggler].stage, CDP_MONITOR_STRAGGLER_REPORTS, 1e3 * mon->straggler_mb_s,
                 1e3 * mon->median_mb_s, e->lay->rebalance_every > 0
                 ? "; rebalancing gives its replica fewer micro-batches"
                 : "; /parallel/rebalance_every would move micro-batches away from it");
    return CDP_OK;
}

/* FLOPs of a step and parameters over every rank (each tensor once). */
static cdp_status totals_of(struct exec *e, struct cdp_exec_totals *t)
{
    const struct cdp_plan *p = e->plan;
    double sums[2] = {0, 0};
    for (int k = 0; k < e->v; k++) {
        sums[0] += cdp_model_step_flops(e->ch[k].model) * e->m;
        if (e->r == 0)
            for (int i = 0; i < cdp_model_tensor_count(e->ch[k].model); i++) {
                const struct cdp_model_tensor *x = cdp_model_tensor(e->ch[k].model, i);
                /* a tensor group: each rank's slices, and its index 0's replicated tensors */
                const struct cdp_param_desc *pd = &cdp_model_unit(e->ch[k].model, x->unit_local)->params[x->param_local];
                const int sliced = pd->shard_dim >= 0; /* its padding (a vocabulary's) not counted */
                const double n = sliced ? (double)(x->numel / pd->shape[pd->shard_dim] * cdp_param_slice_len(pd))
                                        : (double)x->numel;
                if (x->unit >= e->ch[k].first_unit && (sliced || e->k == 0)) sums[1] += n;
            }
    }
    cdp_status st = cdp_comm_allreduce_f64(e->world, sums, 2, CDP_REDUCE_SUM, e->timeout);
    if (st) return st;
    *t = (struct cdp_exec_totals){.flops_per_step = sums[0], .params = sums[1],
                                  .tokens = e->shape ? e->shape->tokens : p->model.kind == CDP_MODEL_GPT,
                                  .sample_tokens = p->model.kind == CDP_MODEL_GPT ? (double)p->model.context : 0};
    return CDP_OK;
}

/* The layout's devices' peak FLOP/s together, or 0 when any is unknown (an
 * MFU over part of the devices would flatter the run). */
static double peak_flops_of(const struct cdp_layout *l)
{
    double sum = 0;
    for (int r = 0; r < l->n_ranks; r++) {
        if (!(l->rank[r].peak_flops > 0)) return 0;
        sum += l->rank[r].peak_flops;
    }
    return sum;
}

/* The summary's per-step means over the measured steps (the first is a
 * warm-up, unless it is the only one). */
static void summary_add(struct cdp_train_summary *sum, const struct cdp_exec_step *s, int measured)
{
    if (!measured) return;
    sum->bubble += s->bubble;
    sum->compute_s += s->compute_s;
    sum->comm_s += s->comm_s;
    sum->idle_s += s->idle_s;
    sum->step_s += s->step_s;
}

static void summary_finish(struct cdp_train_summary *sum, const struct exec *e, const struct cdp_exec_totals *t,
                           int measured, double seconds)
{
    sum->seconds = seconds;
    const int64_t done = sum->steps - e->step0;
    sum->samples_per_s = (double)(done * e->G) / seconds;
    sum->tokens_per_s = t->tokens ? sum->samples_per_s * t->sample_tokens : 0;
    sum->flops_per_s = t->flops_per_step * (double)done / seconds;
    if (measured) {
        sum->bubble /= measured;
        sum->compute_s /= measured;
        sum->comm_s /= measured;
        sum->idle_s /= measured;
        sum->step_s /= measured;
        sum->overhead_s = sum->step_s - sum->compute_s - sum->comm_s - sum->idle_s;
    }
}

/* The caller's per-step callback (cdp/train.h): the figures of the step
 * lines and the metrics record. */
static void step_callback(const struct exec *e, const struct cdp_exec_step *s, const struct cdp_exec_totals *t,
                          const struct cdp_train_opts *o)
{
    const double sps = (double)e->G / s->time_s;
    const struct cdp_step_metrics m = {.size = sizeof m, .step = s->step, .steps = e->plan->train.steps,
                                       .rank = e->rank, .ranks = e->size, .loss = s->loss, .val_loss = s->val_loss,
                                       .lr = e->lr, .grad_norm = e->grad_norm,
                                       .time_s = s->time_s, .samples_per_s = sps,
                                       .tokens_per_s = t->tokens ? sps * t->sample_tokens : 0, .bubble = s->bubble};
    o->on_step(&m, o->user);
}

/* CDP_FAULT=signal's hook in every wait of this rank (fault.h). */
static void fault_in_wait(void *ctx)
{
    struct exec *e = ctx;
    cdp_fault_in_wait(&e->fault, e->rank, e->step);
}

cdp_status cdp_exec_run(const struct cdp_plan *p, const struct cdp_layout *layout, cdp_comm_t world,
                        const struct cdp_train_opts *o, struct cdp_train_summary *summary)
{
    struct exec e = {.plan = p, .lay = layout, .world = world, .ckpt_lock = -1};
    double *peaks = NULL;
    struct cdp_train_summary sum = {.size = sizeof sum};
    struct cdp_exec_totals tot;
    struct monitor_acc acc = {0};
    cdp_status st;
    FILE *out = o ? o->out : NULL, *metrics = NULL;
    e.out = out;
    e.resume_allow = o ? o->resume_allow : NULL;
    cdp_fault_parse(&e.fault);
    if (e.fault.signal) cdp_comm_set_wait_hook(fault_in_wait, &e);
    /* CDP_FAULT at step 0: at start-up, before the rank has set up or written anything */
    if ((st = cdp_fault_at_step(&e.fault, cdp_comm_rank(world), 0))) goto fail;
    stopped_after = stop_saved = -1;
    if ((st = cdp_exec_setup(&e))) goto fail;
    if (!(o && o->resume) && e.rank == 0 && (st = cdp_exec_check_checkpoint_dir(p, NULL))) goto fail;
    if ((st = cdp_exec_hold_checkpoint_dir(&e))) goto fail;
    if ((st = cdp_exec_gather_hosts(&e))) goto fail;
    /* a checkpoint folder that is not shared would be committed with one host's parts */
    if ((st = cdp_exec_check_shared(&e, p->train.checkpoint.dir, "/train/checkpoint/dir"))) goto fail;
    if (o && o->resume && (st = cdp_exec_resume(&e, o->resume))) goto fail;
    if ((st = cdp_monitor_create(e.s, e.r, e.dev, &e.monitor))) goto fail;
    if (e.rank == 0 && p->output.metrics && (st = cdp_exec_open_metrics(&e, &metrics))) goto fail;
    if (metrics && (st = cdp_exec_write_layout_record(&e, metrics))) goto fail;
    if (e.rank == 0 && p->output.tensorboard && (st = cdp_tb_open(p->output.tensorboard, e.step0, &e.tb))) goto fail;
    if ((st = totals_of(&e, &tot))) goto fail;
    e.peak_flops = peak_flops_of(layout);
    if (e.rank == 0 && out) cdp_exec_print_header(&e, &tot, out);
    if ((st = cdp_comm_barrier(world, e.timeout))) goto fail;
    /* every rank's events are timed from the barrier, on its own clock */
    const uint64_t t_start = cdp_time_ns();
    e.t_start = t_start;
    if (e.trace) cdp_trace_set_origin(e.trace, t_start);
    int measured = 0;
    for (int step = e.step0 + 1; step <= p->train.steps; step++) {
        struct cdp_exec_step s;
        if ((st = run_step(&e, step, &s))) goto fail;
        if ((st = monitor_step(&e, &acc, &s))) goto fail;
        if (step > e.step0 + 1 || e.lay->rebalance_every == 1) { /* the first step warms up */
            e.rb_busy += (double)e.t_fb / 1e9;
            e.rb_mb += e.m;
        }
        if (step == e.step0 + 1) sum.first_loss = s.loss;
        sum.last_loss = s.loss;
        sum.steps = step;
        const int counted = step > e.step0 + 1 || p->train.steps == e.step0 + 1;
        measured += counted;
        summary_add(&sum, &s, counted);
        const int last = step == p->train.steps;
        if ((p->train.eval_every > 0 && step % p->train.eval_every == 0) || last) {
            if ((st = cdp_exec_validate(&e, p->train.eval_batches, &s.val_loss, NULL))) goto fail;
            sum.val_loss = s.val_loss;
        }
        /* the step's record before its checkpoint: a resume from that
         * checkpoint then always finds it (and cuts what came after) */
        if (e.rank == 0 && (metrics || e.tb) && (st = cdp_exec_write_step_record(&e, &s, &tot, metrics))) goto fail;
        if (e.rank == 0 && out) cdp_exec_print_step(&e, &s, &tot, o->progress, out);
        if (o && o->on_step) step_callback(&e, &s, &tot, o);
        const int saved = p->train.checkpoint.dir && (step % p->train.checkpoint.every == 0 || last);
        if (saved && (st = cdp_exec_save_checkpoint(&e, step))) goto fail;
        if (s.stop && !last) { /* asked to stop: save what there is, and end */
            if (p->train.checkpoint.dir && !saved && (st = cdp_exec_save_checkpoint(&e, step))) goto fail;
            stopped_after = step;
            stop_saved = p->train.checkpoint.dir ? step : -1;
            sum.steps = step;
            if (e.rank == 0 && out) {
                fprintf(out, "stopped after step %d, as asked%s%s%s\n", step,
                        p->train.checkpoint.dir ? ": checkpoint saved in " : " (no /train/checkpoint: nothing saved)",
                        p->train.checkpoint.dir ? p->train.checkpoint.dir : "",
                        p->train.checkpoint.dir ? "; continue with --resume" : "");
                fflush(out);
            }
            if (metrics) fclose(metrics);
            cdp_exec_free(&e);
            if (summary) *summary = sum;
            cdp_comm_set_wait_hook(NULL, NULL);
            return CDP_OK;
        }
        if (e.lay->rebalance_every > 0 && e.R > 1 && step % e.lay->rebalance_every == 0 && !last &&
            (st = cdp_exec_rebalance(&e, step)))
            goto fail;
    }
    summary_finish(&sum, &e, &tot, measured, (double)(cdp_time_ns() - t_start) / 1e9);
    snprintf(cdp_exec_where_buf, sizeof cdp_exec_where_buf, "rank %d/%d (stage %d, replica %d), after step %lld: "
             "writing the trace and the weights", e.rank, e.size, e.s, e.r, (long long)p->train.steps);
    if ((st = cdp_exec_write_traces(&e))) goto fail;
    if ((st = cdp_exec_check_replicas(&e))) goto fail;
    if ((st = cdp_exec_write_weights(&e))) goto fail;
    if ((st = cdp_exec_gather_peaks(&e, &peaks))) goto fail;
    sum.peak_memory_bytes = peaks[e.rank];
    sum.predicted_memory_bytes = (double)e.me->memory.device;
    if (e.rank == 0 && out) cdp_exec_print_summary(&e, &sum, peaks, out);
    if (metrics) fclose(metrics);
    cdp_tb_close(e.tb);
    free(peaks);
    cdp_exec_free(&e);
    if (summary) *summary = sum;
    cdp_comm_set_wait_hook(NULL, NULL);
    return CDP_OK;
fail:
    cdp_comm_set_wait_hook(NULL, NULL);
    if (metrics) fclose(metrics);
    cdp_tb_close(e.tb);
    e.tb = NULL;
    free(peaks);
    {
        char msg[4096];
        snprintf(msg, sizeof msg, "%s", cdp_last_error());
        cdp_fail(st, "%s: %s", cdp_exec_where_buf[0] ? cdp_exec_where_buf : "setting up", msg);
    }
    /* other ranks may wait on this one: the caller aborts the job; no clean-up
     * that could block (pending requests) is attempted. NCCL communicators are
     * aborted now, so no kernel of theirs waits on a peer that is gone. */
    cdp_nccl_abort_all();
    if (e.size == 1) cdp_exec_free(&e);
    return st;
}
