/* Gradient buckets: the data-parallel reduction of a chunk's gradients in
 * pieces that start as soon as the step's last backward has produced them,
 * while the backward of earlier units still runs (Megatron-LM's
 * overlap_grad_reduce, PyTorch DDP's buckets).
 *
 * A bucket is a run of whole units of the chunk's parameter buffer, from the
 * last unit down, holding at most /parallel/bucket_mb (a larger unit is a
 * bucket of its own). During the chunk's last BACKWARD of the step the
 * model's backward hook reports each finished unit; every bucket whose lowest
 * unit it is then starts a non-blocking all-reduce (ZeRO-1: reduce-scatter of
 * the bucket's window) on the stage's replicas. A unit holding the tied
 * embedding is a bucket of its own that starts at ALLREDUCE_GRADS, after
 * REDUCE_TIED_GRADS, as the whole buffer's reduction did. Requests are tested
 * after every instruction (MPI moves data only inside its calls) and
 * ALLREDUCE_GRADS waits for what is still in flight: the optimizer needs the
 * global norm, so every gradient.
 *
 * The result does not depend on the buckets: each element is reduced by the
 * same collective over the same ranks (Open MPI reduces an in-place
 * all-reduce over one binomial tree whatever the count, and a window's
 * reduce-scatter as the whole buffer's; docs/training.md). Every replica
 * starts the same buckets in the same order: they follow the units, and with
 * interleaved chunks the buckets are on only while every replica runs the
 * same schedule (equal shares). */
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "pipeline/run/exec_internal.h"

static cdp_status unit_done(void *ctx, int unit);

/* Which units hold the tied embedding whose pair reduction comes first. */
static int unit_is_tied(const struct exec *e, const struct chunk *c, int unit)
{
    /* the chunks of the first and the last virtual stage, when their tied
     * copies are summed at the step's end: by two ranks (e->tied) or on this
     * one (zbv's rank 0, e->tied_local) */
    if (!(e->tied || e->tied_local) || (c->vstage != 0 && c->vstage != e->nv - 1)) return 0;
    const struct cdp_model_tensor *t = cdp_model_tied_tensor(c->model);
    return t && t->unit_local == unit;
}

cdp_status cdp_exec_buckets_setup(struct exec *e, struct chunk *c)
{
    struct cdp_model *m = c->model;
    const int U = cdp_model_unit_count(m), T = cdp_model_tensor_count(m);
    const double cap = cdp_plan_bucket_bytes(e->plan, e->R, e->zero) / sizeof(float);
    c->e = e;
    if (cap <= 0 || T == 0 || !cdp_comm_collectives_async(e->dp)) return CDP_OK;
    /* each unit's floats of the parameter buffer: contiguous, in unit order */
    size_t *lo = malloc((size_t)U * sizeof *lo), *hi = malloc((size_t)U * sizeof *hi);
    c->bk = calloc((size_t)U, sizeof *c->bk);
    if (!lo || !hi || !c->bk) {
        free(lo);
        free(hi);
        return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    }
    for (int u = 0; u < U; u++) lo[u] = SIZE_MAX, hi[u] = 0;
    const float *base = cdp_model_tensor(m, 0)->grad;
    for (int i = 0; i < T; i++) {
        const struct cdp_model_tensor *t = cdp_model_tensor(m, i);
        const size_t at = (size_t)(t->grad - base), end = at + (size_t)t->numel;
        if (at < lo[t->unit_local]) lo[t->unit_local] = at;
        if (end > hi[t->unit_local]) hi[t->unit_local] = end;
    }
    size_t prev = 0;
    int ok = 1;
    for (int u = 0; u < U && ok; u++) {
        if (lo[u] == SIZE_MAX) continue;
        ok = lo[u] >= prev;
        prev = hi[u];
    }
    ok = ok && prev == (size_t)cdp_model_param_floats(m);
    int n = 0;
    for (int u = U - 1; u >= 0 && ok; u--) {
        if (lo[u] == SIZE_MAX) continue;
        const int tied = unit_is_tied(e, c, u);
        struct bucket *b = n ? &c->bk[n - 1] : NULL;
        /* a unit joins the open bucket while both fit under the cap */
        if (b && !b->late && !tied && (double)(b->count + hi[u] - lo[u]) <= cap && b->from == hi[u]) {
            b->from = lo[u];
            b->count += hi[u] - lo[u];
            b->unit = u;
            continue;
        }
        c->bk[n++] = (struct bucket){.from = lo[u], .count = hi[u] - lo[u], .unit = u, .late = tied};
    }
    free(lo);
    free(hi);
    if (!ok) { /* a layout the buckets do not know: one reduction, as without them */
        free(c->bk);
        c->bk = NULL;
        return CDP_OK;
    }
    c->nbk = n;
    cdp_model_set_backward_hook(m, unit_done, c);
    return CDP_OK;
}

int cdp_exec_buckets_on(const struct exec *e)
{
    int any = 0;
    for (int k = 0; e->ch && k < e->v; k++) any |= e->ch[k].bk != NULL;
    if (!any) return 0;
    for (int r = 1; e->v > 1 && r < e->R; r++)
        if (e->share[r] != e->share[0]) return 0;
    return 1;
}

void cdp_exec_buckets_start_step(struct exec *e)
{
    const int on = cdp_exec_buckets_on(e);
    const struct cdp_instr *list = e->sched->list[e->s];
    for (int k = 0; k < e->v; k++) {
        struct chunk *c = &e->ch[k];
        c->bw_left = 0;
        c->last_bw = 0;
        c->next_bk = 0;
        c->bk_first = c->bk_last = 0;
        for (int i = 0; i < c->nbk; i++) c->bk[i].posted = 0;
        for (int i = 0; on && c->bk && i < e->sched->len[e->s]; i++)
            c->bw_left += cdp_op_makes_weight_grads(list[i].op) && list[i].chunk == k;
    }
}

void cdp_exec_buckets_before_backward(struct exec *e, struct chunk *c)
{
    (void)e;
    if (c->bw_left > 0) c->last_bw = --c->bw_left == 0;
}

static void trace_coll(struct exec *e, struct chunk *c, enum cdp_event_kind k, uint64_t t0, uint64_t t1,
                       size_t floats)
{
    if (e->trace)
        cdp_trace_add_event(e->trace, &(struct cdp_event_rec){
            .rank = e->rank, .kind = k, .step = e->step, .mb = -1, .start_ns = t0, .dur_ns = t1 - t0,
            .chunk = e->v > 1 ? (int)(c - e->ch) : -1, .peer = -1, .group = CDP_EV_GROUP_REPLICAS, .members = e->R,
            .bytes = (uint64_t)floats * sizeof(float)});
}

/* A bucket done at t1. */
static void bucket_done(struct exec *e, struct chunk *c, const struct bucket *b, uint64_t t1)
{
    if (t1 > c->bk_last) c->bk_last = t1;
    trace_coll(e, c, CDP_EV_BUCKET, b->t_post, t1, b->count);
}

static cdp_status post(struct exec *e, struct chunk *c, struct bucket *b)
{
    float *g = cdp_model_tensor(c->model, 0)->grad;
    const size_t n = (size_t)cdp_model_param_floats(c->model);
    b->t_post = cdp_time_ns();
    if (!c->bk_first || b->t_post < c->bk_first) c->bk_first = b->t_post;
    cdp_status st = e->zero ? cdp_comm_ireduce_scatter_window_wire(e->dp, g + b->from, n, b->from, b->count,
                                                                   CDP_REDUCE_SUM, e->wire_dp, e->timeout, &b->req)
                            : cdp_comm_iallreduce_wire(e->dp, g + b->from, b->count, CDP_REDUCE_SUM, e->wire_dp,
                                                       e->timeout, &b->req);
    b->posted = !st;
    return st;
}

cdp_status cdp_exec_buckets_progress(struct exec *e)
{
    for (int k = 0; k < e->v; k++) {
        struct chunk *c = &e->ch[k];
        for (int i = 0; i < c->next_bk; i++) {
            struct bucket *b = &c->bk[i];
            if (!b->req) continue;
            int r = cdp_comm_test(b->req);
            if (r == 0) continue;
            b->req = NULL;
            if (r < 0)
                return cdp_error_context(CDP_ERR_COMM, "gradient bucket %d (floats [%zu, %zu))", i, b->from,
                                         b->from + b->count);
            bucket_done(e, c, b, cdp_time_ns());
        }
    }
    return CDP_OK;
}

/* The model's hook: unit `unit` of c's backward is done. */
static cdp_status unit_done(void *ctx, int unit)
{
    struct chunk *c = ctx;
    struct exec *e = c->e;
    if (!c->last_bw) return CDP_OK;
    cdp_status st = CDP_OK;
    for (; !st && c->next_bk < c->nbk && c->bk[c->next_bk].unit >= unit; c->next_bk++) {
        struct bucket *b = &c->bk[c->next_bk];
        if (!b->late) st = post(e, c, b); /* a tied one at ALLREDUCE_GRADS, after REDUCE_TIED_GRADS */
    }
    return st ? st : cdp_exec_buckets_progress(e);
}

cdp_status cdp_exec_buckets_finish(struct exec *e)
{
    cdp_status st = CDP_OK;
    for (int k = 0; k < e->v && !st; k++) {
        struct chunk *c = &e->ch[k];
        for (int i = 0; i < c->nbk && !st; i++)
            if (!c->bk[i].posted) st = post(e, c, &c->bk[i]);
        c->next_bk = c->nbk;
        if (c->bk || !cdp_model_tensor_count(c->model)) continue;
        /* a chunk without buckets (a buffer they do not know): its one reduction, as without them */
        float *g = cdp_model_tensor(c->model, 0)->grad;
        const size_t n = (size_t)cdp_model_param_floats(c->model);
        const uint64_t t0 = cdp_time_ns();
        st = e->zero ? cdp_comm_reduce_scatter_window_wire(e->dp, g, n, 0, n, CDP_REDUCE_SUM, e->wire_dp, e->timeout)
                     : cdp_comm_allreduce_wire(e->dp, g, n, CDP_REDUCE_SUM, e->wire_dp, e->timeout);
        trace_coll(e, c, e->zero ? CDP_EV_REDUCE_SCATTER : CDP_EV_ALLREDUCE, t0, cdp_time_ns(), n);
    }
    for (int k = 0; k < e->v && !st; k++) {
        struct chunk *c = &e->ch[k];
        for (int i = 0; i < c->nbk && !st; i++) {
            struct bucket *b = &c->bk[i];
            if (!b->req) continue;
            st = cdp_comm_wait(b->req, e->timeout);
            b->req = NULL;
            if (st)
                return cdp_error_context(st, "gradient bucket %d (floats [%zu, %zu))", i, b->from,
                                         b->from + b->count);
            bucket_done(e, c, b, cdp_time_ns());
        }
        c->last_bw = 0;
        if (!c->bk) continue;
        /* the chunk's whole reduction: from its first bucket's start to its last's end */
        trace_coll(e, c, e->zero ? CDP_EV_REDUCE_SCATTER : CDP_EV_ALLREDUCE, c->bk_first, c->bk_last,
                   (size_t)cdp_model_param_floats(c->model));
    }
    return st;
}

void cdp_exec_buckets_free(struct chunk *c)
{
    for (int i = 0; c->bk && i < c->nbk; i++)
        if (c->bk[i].req) cdp_comm_wait(c->bk[i].req, 1.0);
    free(c->bk);
    c->bk = NULL;
}
