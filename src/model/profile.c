/* cdp_profile_run: each unit of the plan's model in a model of its own on the
 * CPU device, timed on random micro-batches; see profile.h for what is timed
 * and why (a pipeline stage runs exactly these calls). */
#include "model/profile.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/device.h"
#include "cdp/log.h"
#include "model/model.h"
#include "model/optim.h"
#include "model/tensor_group.h"

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void fill_floats(float *x, int64_t n, uint64_t *s)
{
    for (int64_t i = 0; i < n; i++) x[i] = (float)((double)(rng_next(s) >> 11) / 9007199254740992.0 * 2 - 1);
}

static int64_t shape_numel(const struct cdp_shape *sh)
{
    int64_t n = 1;
    for (int k = 0; k < sh->ndim; k++) n *= sh->d[k];
    return n;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *x, int n)
{
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

static double mean(const double *x, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++) s += x[i];
    return n ? s / n : 0;
}

/* Buffers of one unit's micro-batch: its input, the targets when it ends the
 * model, the gradient of its output and of its input. */
struct unit_io {
    void *tgt;
    float *dout, *din;
};

static void unit_io_free(struct unit_io *io)
{
    free(io->tgt);
    free(io->dout);
    free(io->din);
}

static cdp_status one_pass(struct cdp_model *m, const struct unit_io *io, int ends, double *fwd, double *bwd)
{
    cdp_status st;
    double loss = 0;
    uint64_t t0 = cdp_time_ns();
    if ((st = cdp_model_forward(m, 0))) return st;
    if (ends && (st = cdp_model_loss(m, 0, io->tgt, 1e-3f, &loss))) return st;
    uint64_t t1 = cdp_time_ns();
    if ((st = cdp_model_backward(m, 0, ends ? NULL : io->dout, io->din))) return st;
    uint64_t t2 = cdp_time_ns();
    *fwd = (double)(t1 - t0) / 1e9;
    *bwd = (double)(t2 - t1) / 1e9;
    return CDP_OK;
}

/* The same micro-batch again with the backward split (a zero-bubble
 * schedule's B and W): an untimed forward, then its B and its W timed. */
static cdp_status split_pass(struct cdp_model *m, const struct unit_io *io, int ends, double *bi, double *bw)
{
    cdp_status st;
    double loss = 0;
    if ((st = cdp_model_forward(m, 0))) return st;
    if (ends && (st = cdp_model_loss(m, 0, io->tgt, 1e-3f, &loss))) return st;
    uint64_t t0 = cdp_time_ns();
    if ((st = cdp_model_backward_input(m, 0, 0, ends ? NULL : io->dout, io->din))) return st;
    uint64_t t1 = cdp_time_ns();
    if ((st = cdp_model_backward_weight(m, 0, 0))) return st;
    uint64_t t2 = cdp_time_ns();
    *bi = (double)(t1 - t0) / 1e9;
    *bw = (double)(t2 - t1) / 1e9;
    return CDP_OK;
}

/* One unit alone in a model of its own, with its micro-batch's buffers. */
struct unit_run {
    struct cdp_model *m;
    struct unit_io io;
    int ends;
    int split;              /* it has parameters: its backward is timed split too */
    double *tf, *tb;        /* the timed passes */
    double *ti, *tw;        /* the split passes' B and W */
};

static void unit_run_free(struct unit_run *r)
{
    free(r->tf);
    free(r->tb);
    free(r->ti);
    free(r->tw);
    unit_io_free(&r->io);
    cdp_model_destroy(r->m);
}

static cdp_status unit_setup(const struct cdp_plan *plan, const struct cdp_unit *u, int n,
                             const struct cdp_tensor_group *tg, cdp_device_t dev, uint64_t *rng, int cap,
                             struct unit_run *run)
{
    const struct cdp_model_desc *d = &plan->model;
    const int B = (int)plan->train.micro_batch, ends = u->index == n - 1;
    const int64_t in_n = (int64_t)B * shape_numel(&u->in), out_n = (int64_t)B * u->out_floats;
    struct unit_io *io = &run->io;
    run->ends = ends;
    cdp_status st = cdp_model_create_tensor(d, u->index, u->index + 1, B, 1, plan->train.seed, CDP_RECOMPUTE_NONE,
                                            1, 0, tg, dev, &run->m);
    if (st) return st;
    run->split = u->n_params > 0;
    if (run->split && (st = cdp_model_set_split_backward(run->m, 1))) return st;
    /* host-visible memory: CPU only (this profiler opens the CPU device) */
    if (u->in_tokens) {
        int32_t *tok = cdp_model_input(run->m, 0);
        for (int64_t i = 0; i < in_n; i++) tok[i] = (int32_t)(rng_next(rng) % (uint64_t)(d->vocab > 0 ? d->vocab : 1));
    } else {
        fill_floats(cdp_model_input(run->m, 0), in_n, rng);
    }
    if (ends) {
        const int mse = d->kind != CDP_MODEL_GPT && d->loss == CDP_LOSS_MSE;
        const int64_t last = u->out.d[u->out.ndim - 1], rows = mse ? out_n : out_n / last;
        if (!(io->tgt = malloc((size_t)rows * 4))) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
        if (mse) fill_floats(io->tgt, rows, rng);
        else
            for (int64_t r = 0; r < rows; r++) ((int32_t *)io->tgt)[r] = (int32_t)(rng_next(rng) % (uint64_t)last);
    } else {
        if (!(io->dout = malloc((size_t)out_n * sizeof *io->dout))) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
        fill_floats(io->dout, out_n, rng);
        for (int64_t i = 0; i < out_n; i++) io->dout[i] *= 1e-3f;
    }
    /* the first unit's input gradient is never wanted; token ids have none */
    if (!u->in_tokens && u->index > 0 && !(io->din = calloc((size_t)in_n, sizeof *io->din)))
        return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    run->tf = malloc((size_t)cap * sizeof *run->tf);
    run->tb = malloc((size_t)cap * sizeof *run->tb);
    run->ti = malloc((size_t)cap * sizeof *run->ti);
    run->tw = malloc((size_t)cap * sizeof *run->tw);
    if (!run->tf || !run->tb || !run->ti || !run->tw) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    double f, b; /* warm-up: pages, caches, BLAS threads */
    if ((st = one_pass(run->m, io, ends, &f, &b))) return st;
    return run->split ? split_pass(run->m, io, ends, &f, &b) : CDP_OK;
}

/* The optimizer step of the whole model, as the executor's OPTIMIZER_STEP runs
 * it (the gradient norm, then the update), per parameter. */
static cdp_status profile_optimizer(const struct cdp_plan *plan, int n, const struct cdp_tensor_group *tg,
                                    cdp_device_t dev, const struct cdp_profile_options *o, double *out)
{
    struct cdp_model *m = NULL;
    struct cdp_optimizer *opt = NULL;
    double t[64];
    cdp_status st = cdp_model_create_tensor(&plan->model, 0, n, (int)plan->train.micro_batch, 1, plan->train.seed,
                                            CDP_RECOMPUTE_NONE, 1, 0, tg, dev, &m);
    if (st) return st;
    if ((st = cdp_optimizer_create(&plan->train.optimizer, m, dev, &opt))) goto fail;
    const int64_t params = cdp_model_param_floats(m);
    int reps = 0;
    double spent = 0;
    for (int r = -1; r < 64 && (r < o->min_reps || spent < o->min_unit_s); r++) {
        uint64_t t0 = cdp_time_ns();
        volatile double sq = cdp_model_grad_sumsq(m); /* the executor's clipping norm */
        (void)sq;
        cdp_optimizer_step(opt, m, 1e-6f, 1.0f);
        double dt = (double)(cdp_time_ns() - t0) / 1e9;
        if (r < 0) continue; /* warm-up */
        t[reps++] = dt;
        spent += dt;
    }
    *out = params > 0 ? median(t, reps) / (double)params : 0;
fail:
    cdp_optimizer_destroy(opt);
    cdp_model_destroy(m);
    return st;
}

/* The profiler's tensor group: one process, no peers. Timing only, the
 * collective is costed apart: the sum over the group is left undone, which
 * changes values but not the work the rank's kernels do (matrix products and
 * the loss take as long on any finite numbers). */
static cdp_status timing_only_all_reduce(void *ctx, float *buf, int64_t n)
{
    (void)ctx;
    (void)buf;
    (void)n;
    return CDP_OK;
}

cdp_status cdp_profile_run(const struct cdp_plan *plan, const struct cdp_profile_options *opts,
                           struct cdp_cost_table *out)
{
    struct cdp_profile_options o = {.min_unit_s = 0.05, .max_total_s = 60, .min_reps = 5};
    if (opts) {
        if (opts->min_unit_s > 0) o.min_unit_s = opts->min_unit_s;
        if (opts->max_total_s > 0) o.max_total_s = opts->max_total_s;
        if (opts->min_reps > 0) o.min_reps = opts->min_reps;
    }
    struct cdp_cost_table t = {0};
    struct cdp_unit *u = NULL;
    struct unit_run *runs = NULL;
    cdp_device_t dev = NULL;
    int n = 0;
    cdp_status st;
    if (plan->train.micro_batch < 1 || plan->train.micro_batch > (1 << 30))
        return cdp_fail(CDP_ERR_INVALID, "%s: /train/micro_batch: expected a positive number", plan->source);
    /* a plan of a fixed t > 1: rank 0's slices, their compute only; the group's all-reduces are
     * costed apart (the planner's ring model on the topology's links) */
    const int tp = plan->parallel.tensor != CDP_AUTO && plan->parallel.tensor > 1 ? (int)plan->parallel.tensor : 1;
    const struct cdp_tensor_group tg = {.size = tp, .index = 0, .all_reduce = timing_only_all_reduce,
                                         .all_reduce_f32 = timing_only_all_reduce};
    if ((st = cdp_units_build_tensor(&plan->model, tp, 0, &u, &n))) return st;
    if ((st = cdp_device_open(CDP_BACKEND_CPU, 0, plan->cluster.device_memory, &dev))) goto fail;
    if (!(t.units = calloc((size_t)n, sizeof *t.units))) {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    t.n_units = n;
    t.micro_batch = plan->train.micro_batch;
    t.threads = openblas_get_num_threads();
    t.tensor = tp;
    t.bwd_w_measured = 1;
    snprintf(t.device, sizeof t.device, "cpu: %s", cdp_device_description(dev));
    uint64_t rng = 0x9e3779b97f4a7c15ull ^ (uint64_t)plan->train.seed;
    /* Every unit is set up first, then timed in rounds of one pass of each:
     * a machine that is slow for a while (another tenant, frequency changes)
     * slows every unit of those rounds alike, and each unit's median over the
     * rounds leaves them out. */
    enum { MAX_ROUNDS = 4096 };
    if (!(runs = calloc((size_t)n, sizeof *runs))) {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < n; i++)
        if ((st = unit_setup(plan, &u[i], n, tp > 1 ? &tg : NULL, dev, &rng, MAX_ROUNDS, &runs[i]))) {
            st = cdp_error_context(st, "%s: profiling unit %d (%s)", plan->source, i, cdp_layer_name(u[i].desc.type));
            goto fail;
        }
    int rounds = 0;
    const double want = o.min_unit_s * n;
    for (double spent = 0; rounds < MAX_ROUNDS && (rounds < o.min_reps || (spent < want && spent < o.max_total_s));
         rounds++) {
        const uint64_t t0 = cdp_time_ns();
        for (int i = 0; i < n; i++) {
            if ((st = one_pass(runs[i].m, &runs[i].io, runs[i].ends, &runs[i].tf[rounds], &runs[i].tb[rounds]))) {
                st = cdp_error_context(st, "%s: profiling unit %d (%s)", plan->source, i,
                                       cdp_layer_name(u[i].desc.type));
                goto fail;
            }
            if (runs[i].split && (st = split_pass(runs[i].m, &runs[i].io, runs[i].ends, &runs[i].ti[rounds],
                                                  &runs[i].tw[rounds]))) {
                st = cdp_error_context(st, "%s: profiling unit %d (%s), its backward split", plan->source, i,
                                       cdp_layer_name(u[i].desc.type));
                goto fail;
            }
            if (rounds % 64 == 63) cdp_model_zero_grad(runs[i].m); /* keep accumulated gradients finite */
        }
        spent += (double)(cdp_time_ns() - t0) / 1e9;
    }
    for (int i = 0; i < n; i++) {
        t.units[i].index = u[i].index;
        t.units[i].type = u[i].desc.type;
        /* the clock's resolution is far below a unit's time; a zero would read as "not measured" */
        t.units[i].fwd_s = fmax(mean(runs[i].tf, rounds), 1e-9);
        t.units[i].bwd_s = fmax(mean(runs[i].tb, rounds), 1e-9);
        /* W's share of the split backward as measured, of the combined backward's time (both
         * timed in every round: a slow spell changes the two alike, and W stays below bwd_s) */
        const double bi = runs[i].split ? mean(runs[i].ti, rounds) : 0;
        const double bw = runs[i].split ? mean(runs[i].tw, rounds) : 0;
        t.units[i].bwd_w_s = bi + bw > 0 ? t.units[i].bwd_s * bw / (bi + bw) : 0;
        CDP_DEBUG(PART, "unit %d (%s): %d rounds, fwd %.6f s, bwd %.6f s (split: B %.6f s, W %.6f s)", i,
                  cdp_layer_name(u[i].desc.type), rounds, t.units[i].fwd_s, t.units[i].bwd_s, bi, bw);
        unit_run_free(&runs[i]);
    }
    free(runs);
    runs = NULL;
    if ((st = profile_optimizer(plan, n, tp > 1 ? &tg : NULL, dev, &o, &t.optimizer_s_per_param))) {
        st = cdp_error_context(st, "%s: profiling the optimizer", plan->source);
        goto fail;
    }
    free(u);
    cdp_device_close(dev);
    *out = t;
    return CDP_OK;
fail:
    for (int i = 0; runs && i < n; i++) unit_run_free(&runs[i]);
    free(runs);
    cdp_cost_table_clear(&t);
    free(u);
    cdp_device_close(dev);
    return st;
}
