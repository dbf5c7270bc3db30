/* The executor's setup of one rank from the layout: its entry, shares and
 * slots; its CPU binding; its device; the pipeline, data-parallel and tied
 * groups on its memory; its schedule; the models, optimizers and
 * pipeline buffers of its chunks; data and trace; and the teardown. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "model/infer.h"
#include "model/optim.h"
#include "pipeline/run/exec_internal.h"
#include "pipeline/run/executor.h"
#include "pipeline/run/launch.h"
#include "plan/schedule_kind.h"

void cdp_exec_free(struct exec *e)
{
    if (e->ckpt_lock > 0) close(e->ckpt_lock); /* the checkpoint folder is free again */
    e->ckpt_lock = -1;
    if (e->ch) {
        for (int k = 0; k < e->v; k++) {
            struct chunk *c = &e->ch[k];
            if (c->slot_send)
                for (int i = 0; i < c->nslots; i++)
                    if (c->slot_send[i]) cdp_comm_wait(c->slot_send[i], 1.0);
            if (c->grad_out_req)
                for (int i = 0; i < c->n_grad_out; i++)
                    if (c->grad_out_req[i]) cdp_comm_wait(c->grad_out_req[i], 1.0);
            cdp_exec_buckets_free(c);
            cdp_infer_destroy(c->inf);
            free(c->dec_in);
            free(c->dec_out);
            if (c->grad_in_req) cdp_comm_wait(c->grad_in_req, 1.0);
            cdp_optimizer_destroy(c->opt);
            cdp_model_destroy(c->model);
            free(c->slot_mb);
            free(c->mb_slot);
            free(c->wslot_mb);
            free(c->mb_wslot);
            free(c->slot_send);
            cdp_buffer_destroy(c->grad_in_buf);
            for (int i = 0; i < c->n_grad_out; i++)
                if (c->grad_out_buf) cdp_buffer_destroy(c->grad_out_buf[i]);
            free(c->grad_out);
            free(c->grad_out_buf);
            free(c->grad_out_req);
            free(c->mb_grad_out);
        }
        free(e->ch);
    }
    cdp_trace_destroy(e->trace);
    cdp_monitor_destroy(e->monitor);
    free(e->share);
    free(e->hosts);
    cdp_schedule_free(e->sched);
    cdp_data_close(e->data);
    free(e->tgt);
    free(e->in_scratch);
    cdp_comm_free(e->tied);
    cdp_comm_free(e->tpc);
    cdp_comm_free(e->dp);
    cdp_comm_free(e->pipe);
    cdp_comm_free(e->dev_world);
    cdp_device_close(e->dev);
}

/* The pipeline's gradient buffers of a chunk (device memory, sized by
 * cdp_layout_chunk_buffers, so the planner counts them). */
static cdp_status chunk_buffers(struct exec *e, struct chunk *c, const struct cdp_unit_bytes *first,
                                const struct cdp_unit_bytes *last)
{
    struct cdp_chunk_buffers cb;
    cdp_layout_chunk_buffers(first, last, c->vstage, e->nv, c->nslots, e->hv, &cb);
    cdp_status st;
    c->n_grad_out = cb.n_grad_out;
    if (cb.grad_in) {
        if ((st = cdp_buffer_create(e->dev, cb.grad_in, &c->grad_in_buf))) return st;
        c->grad_in = cdp_buffer_data(c->grad_in_buf);
    }
    c->grad_out = calloc((size_t)c->n_grad_out + 1, sizeof *c->grad_out);
    c->grad_out_buf = calloc((size_t)c->n_grad_out + 1, sizeof *c->grad_out_buf);
    c->grad_out_req = calloc((size_t)c->n_grad_out + 1, sizeof *c->grad_out_req);
    if (!c->grad_out || !c->grad_out_buf || !c->grad_out_req) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < c->n_grad_out; i++) {
        if ((st = cdp_buffer_create(e->dev, cb.grad_out, &c->grad_out_buf[i]))) return st;
        c->grad_out[i] = cdp_buffer_data(c->grad_out_buf[i]);
    }
    return CDP_OK;
}

/* This rank's device, as the layout says: the host's CPU (under the
 * layout's memory cap), or GPU `gpu` of its node in the plan's precision;
 * then the world on its memory (comm/ chooses how: host memory as is, NCCL
 * with a GPU each, else staged through the host communicator). */
static cdp_status open_device(struct exec *e)
{
    const struct cdp_plan *p = e->plan;
    const struct cdp_layout_rank *k = e->me;
    cdp_status st;
    const enum cdp_backend be = e->lay->backend;
    if (!cdp_backend_is_gpu(be)) {
        if ((st = cdp_device_open(be, 0, k->capacity, &e->dev))) return st;
        e->hv = cdp_backend_host_visible(be);
        return cdp_comm_for_device(e->world, e->dev, 0, e->timeout, &e->dev_world, NULL, 0);
    }
    int n = 0;
    if ((st = cdp_device_count(be, &n)))
        return cdp_error_context(st, "%s: /cluster/backend is \"%s\"", p->source, cdp_backend_name(be));
    if (k->gpu >= n)
        return cdp_fail(CDP_ERR_INVALID, "%s: the layout puts rank %d on GPU %d of node %d, and this machine has %d "
                        "usable GPU%s (topology %s)", p->source, e->rank, k->gpu, k->node, n, n == 1 ? "" : "s",
                        e->lay->topology);
    if ((st = cdp_device_open(be, k->gpu, k->capacity, &e->dev))) return st;
    e->hv = cdp_backend_host_visible(be);
    if ((st = cdp_device_set_precision(e->dev, p->train.precision))) return st;
    CDP_INFO(EXEC, "rank %d: %s (%s), %s", e->rank, cdp_device_name(e->dev), cdp_device_description(e->dev),
             p->train.precision == CDP_PRECISION_BF16 ? "bf16 matrix products" : "fp32");
    char why[512];
    if ((st = cdp_comm_for_device(e->world, e->dev, e->lay->shared_devices, e->timeout, &e->dev_world, why,
                                  sizeof why)))
        return st;
    CDP_INFO(EXEC, "rank %d: %s", e->rank, why);
    return CDP_OK;
}

/* A tied embedding in two chunk models: the first and the last virtual stage. */
static int tied_model(const struct exec *e)
{
    return cdp_model_ties_embeddings(&e->plan->model) && e->nv > 1;
}

/* ... held by two ranks, which sum its gradient (REDUCE_TIED_GRADS); under
 * zbv one rank holds both and sums them itself (e->tied_local). */
static int tied_grads(const struct exec *e) { return tied_model(e) && e->last_rank != 0; }

/* This replica's schedule for its current share; where activations travel
 * by NCCL, in the order that is safe under its rendezvous sends. */
cdp_status cdp_exec_build_schedule(struct exec *e)
{
    struct cdp_schedule *s = NULL;
    cdp_status st = cdp_schedule_for_layout(e->lay, e->m, tied_grads(e), cdp_comm_p2p_grouped(e->pipe), &s);
    /* build_ex has validated the lists (under rendezvous rules too for NCCL) */
    if (st) return cdp_error_context(st, "%s: /parallel", e->plan->source);
    cdp_schedule_free(e->sched);
    e->sched = s;
    return CDP_OK;
}

void cdp_exec_set_share(struct exec *e)
{
    e->m = (int)e->share[e->r];
    e->moff = 0;
    for (int r = 0; r < e->r; r++) e->moff += (int)e->share[r];
}

/* Binds this process to the layout's CPU set and gives BLAS that many
 * threads; a set this machine cannot give is a warning, not a failure. */
static void bind_rank(const struct exec *e)
{
    const struct cdp_layout_rank *k = e->me;
    char dev[32];
    cdp_layout_device_name(e->lay, e->rank, dev, sizeof dev);
    if (!k->cpuset[0]) {
        CDP_INFO(EXEC, "rank %d (stage %d, replica %d) on node %d, %s: not bound to CPUs", e->rank, e->s, e->r, k->node,
                 dev);
        return;
    }
    int cpus = 0;
    if (cdp_launch_bind(k->cpuset, &cpus)) {
        CDP_WARN(EXEC, "rank %d: not bound to CPUs %s: %s", e->rank, k->cpuset, cdp_last_error());
        return;
    }
    const int threads = cdp_launch_blas_threads(cpus);
    CDP_INFO(EXEC, "rank %d (stage %d, replica %d) on node %d, %s: bound to CPUs %s, %d BLAS thread%s", e->rank, e->s,
             e->r, k->node, dev, k->cpuset, threads, threads == 1 ? "" : "s");
}

/* The split units' collective: a sum over this rank's tensor group, on the
 * device's memory, timed as communication; it travels as the plan's
 * comm_dtype, the loss's statistics (all_reduce_f32) always as fp32. */
static cdp_status tensor_sum(struct exec *e, float *buf, int64_t n, enum cdp_comm_wire wire)
{
    const uint64_t t0 = cdp_time_ns();
    cdp_status st = cdp_comm_allreduce_wire(e->tpc, buf, (size_t)n, CDP_REDUCE_SUM, wire, e->timeout);
    e->t_tensor += cdp_time_ns() - t0;
    return st;
}

static cdp_status tensor_all_reduce(void *ctx, float *buf, int64_t n)
{
    struct exec *e = ctx;
    return tensor_sum(e, buf, n, e->wire_tp);
}

static cdp_status tensor_all_reduce_f32(void *ctx, float *buf, int64_t n)
{
    return tensor_sum(ctx, buf, n, CDP_COMM_WIRE_F32);
}

/* n floats as t equal parts: comm/'s shards (cdp_comm_shard) are those
 * exactly when t divides n. */
static cdp_status tensor_parts(const struct exec *e, int64_t n, const char *what)
{
    const int t = e->tpc ? cdp_comm_size(e->tpc) : 1;
    if (n < 0 || n % t)
        return cdp_fail(CDP_ERR_INVALID, "tensor group %s of %lld floats: not %d equal parts", what, (long long)n, t);
    return CDP_OK;
}

/* Sequence parallelism's pair over the tensor group, timed as communication
 * like the all-reduce. */
static cdp_status tensor_reduce_scatter(void *ctx, float *buf, int64_t n)
{
    struct exec *e = ctx;
    cdp_status st = tensor_parts(e, n, "reduce-scatter");
    if (st) return st;
    const uint64_t t0 = cdp_time_ns();
    st = cdp_comm_reduce_scatter_window_wire(e->tpc, buf, (size_t)n, 0, (size_t)n, CDP_REDUCE_SUM, e->wire_tp,
                                             e->timeout);
    e->t_tensor += cdp_time_ns() - t0;
    return st;
}

static cdp_status tensor_all_gather(void *ctx, float *buf, int64_t n)
{
    struct exec *e = ctx;
    cdp_status st = tensor_parts(e, n, "all-gather");
    if (st) return st;
    const uint64_t t0 = cdp_time_ns();
    st = cdp_comm_allgather_wire(e->tpc, buf, (size_t)n, e->wire_tp, e->timeout);
    e->t_tensor += cdp_time_ns() - t0;
    return st;
}

struct cdp_tensor_group cdp_exec_tensor_group(struct exec *e)
{
    const int t = e->tpc ? cdp_comm_size(e->tpc) : 1, k = e->tpc ? cdp_comm_rank(e->tpc) : 0;
    return (struct cdp_tensor_group){.size = t, .index = k, .all_reduce = tensor_all_reduce,
                                     .all_reduce_f32 = tensor_all_reduce_f32,
                                     .reduce_scatter = tensor_reduce_scatter, .all_gather = tensor_all_gather,
                                     .ctx = e};
}

cdp_status cdp_exec_setup(struct exec *e)
{
    const struct cdp_plan *p = e->plan;
    const struct cdp_layout *L = e->lay;
    cdp_status st;
    e->rank = cdp_comm_rank(e->world);
    e->size = cdp_comm_size(e->world);
    e->p = L->stages;
    e->R = L->replicas;
    e->v = L->chunks;
    e->nv = e->p * e->v;
    {
        int lc;
        cdp_schedule_vstage_place(L->schedule, e->p, e->v, e->nv - 1, &e->last_rank, &lc);
    }
    e->B = L->micro_batch;
    e->timeout = p->train.timeout_s;
    e->wire_tp = p->parallel.comm_bf16_tensor ? CDP_COMM_WIRE_BF16 : CDP_COMM_WIRE_F32;
    e->wire_dp = p->parallel.comm_bf16_gradients ? CDP_COMM_WIRE_BF16 : CDP_COMM_WIRE_F32;
    if ((st = cdp_exec_check(p))) return st;
    if ((st = cdp_layout_check(L, cdp_plan_model_units(p)))) return cdp_error_context(st, "%s", p->source);
    if (e->size != L->n_ranks)
        return cdp_fail(CDP_ERR_INVALID, "%s: the layout has %d ranks (%d stages x %d replicas); this job has %d",
                        p->source, L->n_ranks, e->p, e->R, e->size);
    e->me = &L->rank[e->rank];
    e->s = e->me->stage;
    e->r = e->me->replica;
    e->t = L->tensor;
    e->k = e->me->tensor;
    e->share = malloc((size_t)e->R * sizeof *e->share);
    if (!e->share) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    memcpy(e->share, L->shares, (size_t)e->R * sizeof *e->share);
    cdp_exec_set_share(e);
    e->zero = e->R > 1 ? L->zero : 0;
    for (int r = 1; e->zero >= 2 && r < e->R; r++)
        if (e->share[r] != e->share[0])
            return cdp_fail(CDP_ERR_INVALID, "%s: zero 2 (ZeRO-2) needs every replica to run the same micro-batches; "
                            "the layout gives replica 0 %lld and replica %d %lld", p->source,
                            (long long)e->share[0], r, (long long)e->share[r]);
    e->unit = cdp_schedule_def(L->schedule)->mb_multiple_of_stages ? e->p : 1;
    e->G = (int64_t)e->R * L->micro_batches * e->B;
    int *stage_slots = malloc((size_t)e->p * 2 * sizeof *stage_slots);
    if (!stage_slots) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    st = cdp_layout_slots_ex(L, e->r, &e->mcap, stage_slots, stage_slots + e->p);
    const int slots = stage_slots[e->s], wslots = stage_slots[e->p + e->s];
    free(stage_slots);
    if (st) return cdp_error_context(st, "%s", p->source);
    snprintf(cdp_exec_where_buf, sizeof cdp_exec_where_buf, "rank %d/%d (stage %d, replica %d): setting up", e->rank,
             e->size, e->s, e->r);
    cdp_log_set_rank(e->rank, e->size);
    /* before any memory is touched, so that it lands near the rank's CPUs */
    bind_rank(e);
    if ((st = open_device(e))) return st;
    /* groups on the device's memory: the pipeline of each replica, the
     * replicas of each stage, and the first and last stage of each replica
     * for tied embeddings */
    const int tied = tied_grads(e);
    e->tied_local = tied_model(e) && e->last_rank == 0 && e->s == 0;
    /* with tensor groups: the pipeline of (replica, tensor index), the
     * replicas of (stage, tensor index), the group of (stage, replica); the
     * same three colors make every rank's groups at once */
    const int t = e->t, k = e->k;
    if ((st = cdp_comm_split(e->dev_world, e->r * t + k, e->s, &e->pipe))) return st;
    if ((st = cdp_comm_split(e->dev_world, e->s * t + k, e->r, &e->dp))) return st;
    if ((st = cdp_comm_split(e->dev_world, tied && (e->s == 0 || e->s == e->last_rank) ? e->r * t + k : -1, e->s,
                             &e->tied)))
        return st;
    if ((st = cdp_comm_split(e->dev_world, t > 1 ? e->s * e->R + e->r : -1, k, &e->tpc))) return st;
    e->tg = cdp_exec_tensor_group(e);
    if (e->tg.size != t || e->tg.index != k)
        return cdp_fail(CDP_ERR_INTERNAL, "rank %d: tensor group of %d with index %d; the layout says %d and %d", e->rank,
                        e->tg.size, e->tg.index, t, k);
    if ((st = cdp_exec_build_schedule(e))) return st;

    e->ch = calloc((size_t)e->v, sizeof *e->ch);
    if (!e->ch) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    const enum cdp_loss loss = cdp_model_loss_of(&p->model);
    /* a weights file holding tensors the model does not use is refused before anything loads */
    if (p->model.weights && (st = cdp_model_check_weights(&p->model, p->model.weights))) return st;
    for (int k = 0; k < e->v && !st; k++) {
        struct chunk *c = &e->ch[k];
        c->vstage = cdp_schedule_vstage(L->schedule, e->p, e->v, e->s, k);
        c->first_unit = (int)L->ranges[c->vstage][0];
        c->end_unit = (int)L->ranges[c->vstage][1];
        c->nslots = slots;
        if ((st = cdp_model_create_tensor(&p->model, c->first_unit, c->end_unit, e->B, slots, p->train.seed,
                                          L->recompute, e->zero >= 2 ? e->R : 1, e->zero >= 2 ? e->r : 0,
                                          t > 1 ? &e->tg : NULL, e->dev, &c->model)))
            break;
        if (e->zero >= 2) cdp_model_set_grad_reduce(c->model, cdp_exec_grad_reduce, e);
        if (p->model.weights && (st = cdp_model_load(c->model, p->model.weights))) break;
        /* split backward: W-states for the micro-batches between their I and W */
        c->nwslots = wslots;
        if (wslots > 0 && (st = cdp_model_set_split_backward(c->model, wslots))) break;
        int pr, pc, nr, nc;
        c->local_prev = c->local_next = -1;
        if (c->vstage > 0) {
            cdp_schedule_vstage_place(L->schedule, e->p, e->v, c->vstage - 1, &pr, &pc);
            if (pr == e->s) c->local_prev = pc;
        }
        if (c->vstage < e->nv - 1) {
            cdp_schedule_vstage_place(L->schedule, e->p, e->v, c->vstage + 1, &nr, &nc);
            if (nr == e->s) c->local_next = nc;
        }
        /* ZeRO-1 and 2: this replica's shard of the chunk's parameters (cdp_shard) */
        uint64_t off = 0, len = (uint64_t)cdp_model_param_floats(c->model);
        if (e->zero) cdp_shard(len, e->R, e->r, &off, &len);
        if (!e->eval_only && (st = cdp_optimizer_create_shard(&p->train.optimizer, c->model, e->dev, off, len,
                                                             &c->opt)))
            break;
        struct cdp_unit_bytes u0, ul;
        cdp_unit_bytes(cdp_model_unit(c->model, 0), e->B, loss, &u0);
        cdp_unit_bytes(cdp_model_unit(c->model, cdp_model_unit_count(c->model) - 1), e->B, loss, &ul);
        c->in_tokens = u0.in_tokens;
        c->in_bytes = (int64_t)u0.input_bytes;
        c->out_bytes = (int64_t)ul.output_bytes;
        c->slot_mb = malloc((size_t)slots * sizeof *c->slot_mb);
        c->mb_slot = malloc((size_t)e->mcap * sizeof *c->mb_slot);
        c->mb_grad_out = calloc((size_t)e->mcap, sizeof *c->mb_grad_out);
        c->slot_send = calloc((size_t)slots, sizeof *c->slot_send);
        c->wslot_mb = malloc((size_t)(wslots > 0 ? wslots : 1) * sizeof *c->wslot_mb);
        c->mb_wslot = malloc((size_t)e->mcap * sizeof *c->mb_wslot);
        if (!c->slot_mb || !c->mb_slot || !c->mb_grad_out || !c->slot_send || !c->wslot_mb || !c->mb_wslot) {
            st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
            break;
        }
        if ((st = chunk_buffers(e, c, &u0, &ul))) break;
        if ((st = cdp_exec_buckets_setup(e, c))) break;
        for (int i = 0; i < slots; i++) c->slot_mb[i] = -1;
        for (int i = 0; i < e->mcap; i++) c->mb_slot[i] = c->mb_wslot[i] = -1;
        for (int i = 0; i < wslots; i++) c->wslot_mb[i] = -1;
    }
    if (st) return st;
    /* data: the first stage reads inputs, the last reads targets (zbv: rank 0 both) */
    if (!e->no_data && (e->s == 0 || e->s == e->last_rank)) {
        if ((st = cdp_data_open(&p->data, &p->model, &e->data))) return st;
        e->shape = cdp_data_shape(e->data);
        e->tgt_bytes = (int64_t)e->B * e->shape->target_numel * 4;
        e->tgt = malloc((size_t)(e->mcap * e->tgt_bytes));
        e->in_scratch = malloc((size_t)e->B * (size_t)e->shape->input_numel * 4);
        if (!e->tgt || !e->in_scratch) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
        const double rows = e->shape->tokens ? (double)e->shape->input_numel : 1.0;
        e->scale = (float)(1.0 / ((double)e->G * rows));
    }
    if (p->output.trace || p->output.timeline) {
        /* per micro-batch and chunk: load, forward, backward and four
         * transfers, with ZeRO-2 a reduce-scatter per unit; per step the
         * optimizer and the reductions of each chunk */
        int64_t per_step = 2 + 4 * (int64_t)e->v;
        for (int k = 0; k < e->v; k++)
            per_step += (int64_t)e->mcap * (8 + (e->zero >= 2 ? e->ch[k].end_unit - e->ch[k].first_unit + 1 : 0));
        int64_t n = p->train.steps * per_step;
        if ((st = cdp_trace_create(e->size, n < 1000000 ? n : 1000000, &e->trace))) return st;
    }
    return CDP_OK;
}
