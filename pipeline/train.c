/* One-rank training: data -> micro-batches -> forward/loss/backward ->
 * clipping -> optimizer, with step lines, metrics.jsonl and validation. */
#include "pipeline/train.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/device.h"
#include "cdp/log.h"
#include "model/data.h"
#include "model/model.h"
#include "model/optim.h"
#include "pipeline/trace.h"

struct trainer {
    const struct cdp_plan *plan;
    cdp_device_t dev;
    struct cdp_model *model;
    struct cdp_optimizer *opt;
    struct cdp_data *data;
    const struct cdp_sample_shape *shape;
    void *targets;
    int B;
    int64_t micro_batches; /* per step */
    int64_t global_batch;
    int64_t rows_per_sample;
    FILE *metrics;
    struct cdp_trace *trace; /* NULL unless a trace or timeline is asked for */
    int step;                /* 1-based, for the trace */
};

static void trace(struct trainer *t, enum cdp_event_kind kind, int mb, uint64_t start)
{
    if (t->trace) cdp_trace_add(t->trace, 0, kind, t->step, mb, start, cdp_time_ns());
}

static cdp_status run_micro_batch(struct trainer *t, enum cdp_split split, int64_t first, float scale,
                                  int mb, double *loss_sum)
{
    cdp_status st;
    double s = 0;
    const int backward = split == CDP_SPLIT_TRAIN;
    uint64_t t0 = cdp_time_ns();
    if ((st = cdp_data_fetch(t->data, split, first, t->B, cdp_model_input(t->model, 0), t->targets)))
        return st;
    trace(t, backward ? CDP_EV_LOAD : CDP_EV_EVAL, mb, t0);
    t0 = cdp_time_ns();
    if ((st = cdp_model_forward(t->model, 0))) return st;
    if ((st = cdp_model_loss(t->model, 0, t->targets, scale, &s))) return st;
    trace(t, backward ? CDP_EV_FORWARD : CDP_EV_EVAL, mb, t0);
    t0 = cdp_time_ns();
    if (backward && (st = cdp_model_backward(t->model, 0, NULL, NULL))) return st;
    if (backward) trace(t, CDP_EV_BACKWARD, mb, t0);
    *loss_sum += s;
    return CDP_OK;
}

static cdp_status validate(struct trainer *t, double *loss)
{
    const int64_t n = t->plan->train.eval_batches;
    int64_t avail = cdp_data_split_size(t->data, CDP_SPLIT_VAL);
    double sum = 0;
    int64_t rows = 0;
    for (int64_t k = 0; k < n; k++) {
        /* the same validation samples every time, so the numbers compare */
        int64_t first = (k * t->B) % (avail > t->B ? avail - t->B + 1 : 1);
        cdp_status st = run_micro_batch(t, CDP_SPLIT_VAL, first, 1.0f, -1, &sum);
        if (st) return cdp_error_context(st, "validation");
        rows += t->B * t->rows_per_sample;
    }
    *loss = sum / (double)rows;
    return CDP_OK;
}

static void human_rate(double v, char *buf, size_t cap)
{
    if (v >= 1e9) snprintf(buf, cap, "%.1fG", v / 1e9);
    else if (v >= 1e6) snprintf(buf, cap, "%.2fM", v / 1e6);
    else if (v >= 1e4) snprintf(buf, cap, "%.1fk", v / 1e3);
    else if (v >= 10) snprintf(buf, cap, "%.0f", v);
    else snprintf(buf, cap, "%.2f", v);
}

static void trainer_free(struct trainer *t)
{
    if (t->metrics) fclose(t->metrics);
    cdp_trace_destroy(t->trace);
    free(t->targets);
    cdp_data_close(t->data);
    cdp_optimizer_destroy(t->opt);
    cdp_model_destroy(t->model);
    cdp_device_close(t->dev);
}

cdp_status cdp_train_one_rank(const struct cdp_plan *p, const struct cdp_train_opts *o,
                              struct cdp_train_summary *summary)
{
    const struct cdp_parallel_desc *pd = &p->parallel;
    const struct cdp_train_desc *td = &p->train;
    struct trainer t = {.plan = p};
    struct cdp_train_summary sum = {0};
    cdp_status st;
    FILE *out = o ? o->out : NULL;

    if (pd->stages != 1 || pd->replicas != 1) {
        char s[32], r[32];
        snprintf(s, sizeof s, pd->stages == CDP_AUTO ? "auto" : "%lld", (long long)pd->stages);
        snprintf(r, sizeof r, pd->replicas == CDP_AUTO ? "auto" : "%lld", (long long)pd->replicas);
        return cdp_fail(CDP_ERR_UNSUPPORTED,
                        "%s: /parallel/stages is %s and /parallel/replicas is %s: this version trains "
                        "on one rank only (1 stage x 1 replica); --dry-run checks any layout",
                        p->source, s, r);
    }
    if (p->cluster.backend != CDP_BACKEND_CPU)
        return cdp_fail(CDP_ERR_UNSUPPORTED, "%s: /cluster/backend is \"%s\": this version trains on "
                        "the cpu backend only", p->source, cdp_backend_name(p->cluster.backend));
    if (td->precision != CDP_PRECISION_FP32)
        return cdp_fail(CDP_ERR_UNSUPPORTED, "%s: /train/precision is \"bf16\": the cpu backend trains in "
                        "fp32; use \"fp32\"", p->source);
    if (td->checkpoint.dir)
        return cdp_fail(CDP_ERR_UNSUPPORTED, "%s: /train/checkpoint: this version does not write "
                        "checkpoints; remove it, or use /output/weights for the final weights", p->source);
    t.B = (int)td->micro_batch;
    t.global_batch = td->global_batch;
    if (t.global_batch == CDP_AUTO) {
        t.global_batch = td->micro_batch; /* one stage, one replica: "auto" means one micro-batch */
        CDP_INFO(EXEC, "/parallel/micro_batches is auto: one micro-batch of %d per step", t.B);
    }
    t.micro_batches = t.global_batch / t.B;

    if ((st = cdp_device_open(CDP_DEVICE_CPU, 0, p->cluster.device_memory, &t.dev))) goto fail;
    int n_units = (int)cdp_plan_model_units(p);
    if ((st = cdp_model_create(&p->model, 0, n_units, t.B, 1, td->seed, t.dev, &t.model))) goto fail;
    if (p->model.weights && (st = cdp_model_load(t.model, p->model.weights))) goto fail;
    if ((st = cdp_optimizer_create(&td->optimizer, t.model, t.dev, &t.opt))) goto fail;
    if ((st = cdp_data_open(&p->data, &p->model, &t.data))) goto fail;
    t.shape = cdp_data_shape(t.data);
    t.rows_per_sample = t.shape->tokens ? t.shape->input_numel : 1;
    t.targets = malloc((size_t)(t.B * t.shape->target_numel) * 4);
    if (!t.targets) {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory for targets");
        goto fail;
    }
    if (p->output.metrics && !(t.metrics = fopen(p->output.metrics, "w"))) {
        st = cdp_fail(CDP_ERR_IO, "%s: cannot write: %s", p->output.metrics, strerror(errno));
        goto fail;
    }

    if (p->output.trace || p->output.timeline) {
        int64_t events = td->steps * (3 * t.micro_batches + 1) + 64 * (td->eval_batches + 1);
        if ((st = cdp_trace_create(1, events < 1000000 ? events : 1000000, &t.trace))) goto fail;
    }
    const double flops_per_step = cdp_model_step_flops(t.model) * (double)t.micro_batches;
    const float scale = (float)(1.0 / ((double)t.global_batch * (double)t.rows_per_sample));
    if (out)
        fprintf(out, "training %s: %lld parameters, %lld steps of %lld samples (%lld x %d), %s\n",
                p->model.kind == CDP_MODEL_GPT ? p->model.preset : "model",
                (long long)cdp_model_param_floats(t.model), (long long)td->steps,
                (long long)t.global_batch, (long long)t.micro_batches, t.B,
                td->optimizer.type == CDP_OPT_ADAMW ? "adamw" : "sgd");
    const uint64_t t_start = cdp_time_ns();
    for (int64_t step = 0; step < td->steps; step++) {
        const uint64_t t0 = cdp_time_ns();
        double loss_sum = 0;
        t.step = (int)step + 1;
        cdp_model_zero_grad(t.model);
        for (int64_t k = 0; k < t.micro_batches; k++) {
            int64_t first = step * t.global_batch + k * t.B;
            if ((st = run_micro_batch(&t, CDP_SPLIT_TRAIN, first, scale, (int)k, &loss_sum))) goto fail;
        }
        const uint64_t t_opt = cdp_time_ns();
        double loss = loss_sum * scale;
        double norm = sqrt(cdp_model_grad_sumsq(t.model));
        float clip = 1.0f;
        if (td->grad_clip > 0 && norm > td->grad_clip) clip = (float)(td->grad_clip / norm);
        if (!isfinite(loss) || !isfinite(norm)) {
            st = cdp_fail(CDP_ERR_INVALID, "step %lld: the loss is %g and the gradient norm %g; lower "
                          "/train/optimizer/lr or set /train/grad_clip", (long long)step + 1, loss, norm);
            goto fail;
        }
        cdp_optimizer_step(t.opt, t.model, (float)td->optimizer.lr, clip);
        trace(&t, CDP_EV_OPTIMIZER, -1, t_opt);
        const double dt = (double)(cdp_time_ns() - t0) / 1e9;
        if (step == 0) sum.first_loss = loss;
        sum.last_loss = loss;
        sum.steps = step + 1;

        const int last = step + 1 == td->steps;
        double val = NAN;
        if ((td->eval_every > 0 && (step + 1) % td->eval_every == 0) || last) {
            if ((st = validate(&t, &val))) goto fail;
            sum.val_loss = val;
        }
        const double sps = (double)t.global_batch / dt;
        const double tps = t.shape->tokens ? sps * (double)t.shape->input_numel : 0;
        const double fps = flops_per_step / dt;
        if (t.metrics) {
            fprintf(t.metrics, "{\"step\": %lld, \"loss\": %.9g, \"lr\": %g, \"grad_norm\": %.6g, "
                    "\"time_s\": %.6g, \"samples_per_s\": %.6g, \"tokens_per_s\": %.6g, "
                    "\"flops_per_s\": %.6g",
                    (long long)step + 1, loss, td->optimizer.lr, norm, dt, sps, tps, fps);
            if (!isnan(val)) fprintf(t.metrics, ", \"val_loss\": %.6g", val);
            fputs("}\n", t.metrics);
            fflush(t.metrics);
        }
        if (out && (step == 0 || (step + 1) % td->log_every == 0 || last || !isnan(val))) {
            char s1[32], s2[32], s3[32];
            human_rate(sps, s1, sizeof s1);
            human_rate(tps, s2, sizeof s2);
            human_rate(fps, s3, sizeof s3);
            if (o->progress) fputs("\r\033[K", out);
            fprintf(out, "step %*lld/%lld  loss %.4f", (int)snprintf(NULL, 0, "%lld", (long long)td->steps),
                    (long long)step + 1, (long long)td->steps, loss);
            if (!isnan(val)) fprintf(out, "  val %.4f", val);
            fprintf(out, "  | %s samples/s", s1);
            if (t.shape->tokens) fprintf(out, "  %s tokens/s", s2);
            fprintf(out, dt < 0.01 ? "  %sFLOP/s  %.2f ms/step\n" : "  %sFLOP/s  %.0f ms/step\n", s3, dt * 1e3);
        } else if (out && o->progress) {
            fprintf(out, "\r\033[Kstep %lld/%lld  loss %.4f", (long long)step + 1, (long long)td->steps, loss);
            fflush(out);
        }
    }
    sum.seconds = (double)(cdp_time_ns() - t_start) / 1e9;
    sum.samples_per_s = (double)(sum.steps * t.global_batch) / sum.seconds;
    sum.tokens_per_s = t.shape->tokens ? sum.samples_per_s * (double)t.shape->input_numel : 0;
    sum.flops_per_s = flops_per_step * (double)sum.steps / sum.seconds;
    if (p->output.trace && (st = cdp_trace_write_chrome(t.trace, p->output.trace))) goto fail;
    /* the second step shows the steady state; the first also pays for warming up */
    if (p->output.timeline &&
        (st = cdp_trace_write_svg(t.trace, sum.steps > 1 ? 2 : 1, p->output.timeline)))
        goto fail;
    if (p->output.weights) {
        char steps[32];
        snprintf(steps, sizeof steps, "%lld", (long long)sum.steps);
        const char *meta[] = {"format", "cdphybrid", "steps", steps};
        if ((st = cdp_model_save(t.model, p->output.weights, meta, 2))) goto fail;
    }
    if (out) {
        char s3[32];
        human_rate(sum.flops_per_s, s3, sizeof s3);
        fprintf(out, "done: %lld steps in %.1f s, loss %.4f -> %.4f, validation loss %.4f, %sFLOP/s\n",
                (long long)sum.steps, sum.seconds, sum.first_loss, sum.last_loss, sum.val_loss, s3);
        if (p->output.weights) fprintf(out, "weights written to %s\n", p->output.weights);
    }
    trainer_free(&t);
    if (summary) *summary = sum;
    return CDP_OK;
fail:
    trainer_free(&t);
    return st;
}
