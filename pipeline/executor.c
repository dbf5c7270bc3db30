/* The executor: one process per rank interprets its schedule over its stage's
 * models, with the pipeline and data-parallel communicators. Shapes: B samples
 * per micro-batch, m micro-batches per replica, p stages, v chunks per rank, R
 * replicas, G = R * m * B samples per step. */
#include "pipeline/executor.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cdp/core.h"
#include "cdp/device.h"
#include "cdp/log.h"
#include "kernels/cpu/ops.h"
#include "model/data.h"
#include "model/model.h"
#include "model/checkpoint.h"
#include "model/optim.h"
#include "model/safetensors.h"
#include "comm/nccl.h"
#include "kernels/ops.h"
#include "pipeline/balance.h"
#include "pipeline/launch.h"
#include "pipeline/layout.h"
#include "pipeline/monitor.h"
#include "pipeline/schedule.h"
#include "pipeline/trace.h"

enum { TAG_ACT = 0, TAG_GRAD = 1, TAG_VAL = 2 };

struct chunk {
    int vstage;
    struct cdp_model *model;
    struct cdp_optimizer *opt;
    int first_unit, end_unit;
    int in_tokens;
    int64_t in_bytes, out_bytes; /* one micro-batch */
    int nslots;
    int *slot_mb, *mb_slot;
    cdp_request_t *slot_send;   /* the SEND_ACT still in flight from a slot's output */
    float *grad_in;             /* RECV_GRAD lands here; the next BACKWARD reads it */
    float **grad_out;           /* a ring of SEND_GRAD buffers */
    /* device memory the host cannot see (GPUs): grad_in and grad_out live in
     * device buffers, and point-to-point messages are staged through host
     * copies that stay untouched until their request completes */
    cdp_buffer_t grad_in_buf, *grad_out_buf;
    void **slot_host, *recv_host, *grad_in_host, **grad_out_host;
    cdp_request_t *grad_out_req;
    int n_grad_out, next_grad_out;
    int *mb_grad_out;           /* mb -> ring index of its input gradient */
};

struct exec {
    const struct cdp_plan *plan;
    const struct cdp_layout *lay;   /* what runs where (not owned) */
    const struct cdp_layout_rank *me; /* this rank's entry of it */
    cdp_comm_t world, pipe, dp, tied;
    int rank, size, p, R, v, m, s, r, B, nv;
    int64_t G;
    /* load balance: micro-batches of each replica this step (the shares sum
     * to R x micro_batches), those of the replicas before this one, and the
     * most this replica may be given (what its slots and buffers hold) */
    int64_t *share;
    int moff, mcap, unit;
    /* rebalancing: this rank's busy time and micro-batches since the last look */
    double rb_busy;
    int64_t rb_mb;
    double timeout;
    cdp_device_t dev;
    int hv;                /* the host sees the device's memory (cpu) */
    cdp_nccl_t nworld, npipe, ndp, ntied; /* GPU ranks with a GPU each: NCCL for device memory */
    float *grad_host;      /* host staging for all-reduces of device memory without NCCL */
    size_t grad_host_n;
    struct chunk *ch;
    struct cdp_schedule *sched;
    struct cdp_data *data;
    const struct cdp_sample_shape *shape;
    void *tgt;             /* [m][B * target_numel] */
    void *in_scratch;      /* inputs read by a last stage that is not the first */
    int64_t tgt_bytes;
    float scale;
    int step;
    double loss_sum;
    double grad_norm; /* before clipping, of the last step */
    /* timing of the current step */
    uint64_t t_compute, t_comm, t_idle, t_fb, fb_end, step_start;
    struct cdp_trace *trace;
    /* CDP_FAULT (a testing knob): "kill:RANK:STEP", "stall:RANK:STEP:SECONDS" or
     * "killsave:RANK:STEP:PHASE" (PHASE part: before writing its part; commit:
     * after it, before the manifest) */
    int fault_kill, fault_stall, fault_save, fault_rank, fault_step, fault_seconds;
    /* "slow:RANK:FACTOR": that rank's forward and backward take FACTOR times as long */
    int fault_slow;
    double slow_factor;
    struct cdp_monitor *monitor;
    char fault_phase[16];
    /* resuming: the checkpoint's step and the samples consumed by then */
    int step0;
    int64_t sample_base;
    FILE *out;
};

static char cdp_where_buf[256];
const char *cdp_exec_where(void) { return cdp_where_buf; }

static const char *const op_names[CDP_OP_COUNT] = {
    "LOAD", "FORWARD", "SEND_ACT", "RECV_ACT", "BACKWARD", "SEND_GRAD", "RECV_GRAD",
    "REDUCE_TIED_GRADS", "ALLREDUCE_GRADS", "OPTIMIZER_STEP"};

static void set_where(struct exec *e, const struct cdp_instr *in)
{
    char buf[256];
    int n = snprintf(buf, sizeof buf, "rank %d/%d (stage %d, replica %d), step %d: %s", e->rank, e->size,
                     e->s, e->r, e->step, op_names[in->op]);
    if (in->mb >= 0) n += snprintf(buf + n, sizeof buf - (size_t)n, " of micro-batch %d", in->mb);
    if (in->chunk >= 0 && e->v > 1) n += snprintf(buf + n, sizeof buf - (size_t)n, ", chunk %d", in->chunk);
    if (in->peer >= 0)
        snprintf(buf + n, sizeof buf - (size_t)n, in->op == CDP_OP_RECV_ACT || in->op == CDP_OP_RECV_GRAD
                 ? ", from stage %d" : ", to stage %d", in->peer);
    memcpy(cdp_where_buf, buf, sizeof buf);
}

cdp_status cdp_exec_check(const struct cdp_plan *p)
{
    if (p->train.precision != CDP_PRECISION_FP32 && p->cluster.backend != CDP_BACKEND_CUDA)
        return cdp_fail(CDP_ERR_UNSUPPORTED, "%s: /train/precision is \"bf16\": the cpu backend trains in fp32; "
                        "use \"fp32\", or /cluster/backend \"cuda\"", p->source);
    return CDP_OK;
}

static int tag_of(int kind, int vstage, int mb, int m) { return ((kind * 4096 + vstage) * m + mb) % (1 << 20); }

/* Requests are completed here, so their buffers can be reused. */
static cdp_status wait_req(struct exec *e, cdp_request_t *req)
{
    if (!*req) return CDP_OK;
    uint64_t t0 = cdp_time_ns();
    cdp_status st = cdp_comm_wait(*req, e->timeout);
    *req = NULL;
    e->t_comm += cdp_time_ns() - t0;
    return st;
}

static cdp_status acquire_slot(struct exec *e, struct chunk *c, int mb, int *slot)
{
    if (c->mb_slot[mb] >= 0) {
        *slot = c->mb_slot[mb];
        return CDP_OK;
    }
    for (int i = 0; i < c->nslots; i++) {
        if (c->slot_mb[i] >= 0) continue;
        cdp_status st = wait_req(e, &c->slot_send[i]);
        if (st) return st;
        c->slot_mb[i] = mb;
        c->mb_slot[mb] = i;
        *slot = i;
        return CDP_OK;
    }
    return cdp_fail(CDP_ERR_INTERNAL, "no free activation slot for micro-batch %d (%d slots)", mb, c->nslots);
}

static void trace_ev(struct exec *e, enum cdp_event_kind k, int mb, uint64_t t0, uint64_t t1)
{
    if (e->trace) cdp_trace_add(e->trace, e->rank, k, e->step, mb, t0, t1);
}

/* Device memory to a peer: as is where the host sees device memory, else
 * copied to `host` first (which stays untouched until the request completes). */
static cdp_status send_dev(struct exec *e, const void *dev, void *host, size_t n, int peer, int tag,
                           cdp_request_t *req)
{
    if (!e->hv) {
        cdp_status st = cdp_device_read(e->dev, host, dev, n);
        if (st) return st;
        dev = host;
    }
    return cdp_comm_isend(e->pipe, dev, n, peer, tag, req);
}

/* A peer's message into device memory, through `host` where needed. */
static cdp_status recv_dev(struct exec *e, void *dev, void *host, size_t n, int peer, int tag)
{
    cdp_request_t req = NULL;
    cdp_status st = cdp_comm_irecv(e->pipe, e->hv ? dev : host, n, peer, tag, &req);
    if (!st) st = cdp_comm_wait(req, e->timeout);
    if (!st && !e->hv) st = cdp_device_write(e->dev, dev, host, n);
    return st;
}

/* Sum of n floats of device memory over a group: NCCL where the group has it,
 * else the host communicator (through host memory for a GPU). */
static cdp_status allreduce_dev(struct exec *e, cdp_comm_t c, cdp_nccl_t nc, float *dev, size_t n)
{
    if (nc) return cdp_nccl_allreduce_f32(nc, dev, n, CDP_REDUCE_SUM, e->timeout);
    if (e->hv) return cdp_comm_allreduce_f32(c, dev, n, CDP_REDUCE_SUM, e->timeout);
    if (n > e->grad_host_n) {
        float *h = realloc(e->grad_host, n * sizeof *h);
        if (!h) return cdp_fail(CDP_ERR_NOMEM, "out of host memory staging an all-reduce of %zu floats", n);
        e->grad_host = h;
        e->grad_host_n = n;
    }
    cdp_status st = cdp_device_read(e->dev, e->grad_host, dev, n * sizeof *dev);
    if (!st) st = cdp_comm_allreduce_f32(c, e->grad_host, n, CDP_REDUCE_SUM, e->timeout);
    if (!st) st = cdp_device_write(e->dev, dev, e->grad_host, n * sizeof *dev);
    return st;
}

/* Kernels run asynchronously on a GPU. Where compute times matter (several
 * ranks: the bubble, the monitor's straggler, rebalancing; a trace) they are
 * taken after the kernels end; one rank without a trace does not wait (the
 * loss read back each micro-batch is its only wait inside a step). */
static cdp_status settle(const struct exec *e)
{
    return e->hv || (e->size == 1 && !e->trace) ? CDP_OK : cdp_device_synchronize(e->dev);
}

/* The slow-rank knob: stretch this rank's compute since t0 by the factor. */
static void slow_down(const struct exec *e, uint64_t t0)
{
    if (!e->fault_slow || e->rank != e->fault_rank) return;
    double extra = (double)(cdp_time_ns() - t0) * (e->slow_factor - 1.0);
    if (extra <= 0) return;
    struct timespec ts = {(time_t)(extra / 1e9), (long)fmod(extra, 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static cdp_status load(struct exec *e, int mb)
{
    const int64_t first = e->sample_base + (int64_t)(e->step - 1 - e->step0) * e->G + ((int64_t)e->moff + mb) * e->B;
    void *inputs = e->in_scratch, *dev_in = NULL;
    cdp_status st;
    if (e->s == 0) {
        int slot;
        if ((st = acquire_slot(e, &e->ch[0], mb, &slot))) return st;
        dev_in = cdp_model_input(e->ch[0].model, slot);
        if (e->hv) inputs = dev_in;
    }
    st = cdp_data_fetch(e->data, CDP_SPLIT_TRAIN, first, e->B, inputs, (char *)e->tgt + mb * e->tgt_bytes);
    if (!st && dev_in && !e->hv) st = cdp_device_write(e->dev, dev_in, inputs, (uint64_t)e->ch[0].in_bytes);
    return st;
}

static cdp_status execute(struct exec *e, const struct cdp_instr *in)
{
    struct chunk *c = in->chunk >= 0 ? &e->ch[in->chunk] : NULL;
    cdp_status st = CDP_OK;
    int slot;
    uint64_t t0 = cdp_time_ns();
    set_where(e, in);
    switch (in->op) {
    case CDP_OP_LOAD:
        st = load(e, in->mb);
        e->t_compute += cdp_time_ns() - t0;
        e->t_fb += cdp_time_ns() - t0;
        trace_ev(e, CDP_EV_LOAD, in->mb, t0, cdp_time_ns());
        break;
    case CDP_OP_RECV_ACT:
        if ((st = acquire_slot(e, c, in->mb, &slot))) break;
        st = recv_dev(e, cdp_model_input(c->model, slot), c->recv_host, (size_t)c->in_bytes, in->peer,
                      tag_of(TAG_ACT, c->vstage - 1, in->mb, e->m));
        e->t_idle += cdp_time_ns() - t0;
        break;
    case CDP_OP_FORWARD:
        if ((st = acquire_slot(e, c, in->mb, &slot))) break;
        if ((st = cdp_model_forward(c->model, slot))) break;
        if (c->vstage == e->nv - 1) {
            double s = 0;
            st = cdp_model_loss(c->model, slot, (char *)e->tgt + in->mb * e->tgt_bytes, e->scale, &s);
            e->loss_sum += s;
        }
        if (!st) st = settle(e);
        slow_down(e, t0);
        e->t_compute += cdp_time_ns() - t0;
        e->t_fb += cdp_time_ns() - t0;
        trace_ev(e, CDP_EV_FORWARD, in->mb, t0, cdp_time_ns());
        break;
    case CDP_OP_SEND_ACT:
        slot = c->mb_slot[in->mb];
        st = send_dev(e, cdp_model_output(c->model, slot), c->slot_host ? c->slot_host[slot] : NULL,
                      (size_t)c->out_bytes, in->peer, tag_of(TAG_ACT, c->vstage, in->mb, e->m), &c->slot_send[slot]);
        e->t_comm += cdp_time_ns() - t0;
        break;
    case CDP_OP_RECV_GRAD:
        st = recv_dev(e, c->grad_in, c->grad_in_host, (size_t)c->out_bytes, in->peer,
                      tag_of(TAG_GRAD, c->vstage + 1, in->mb, e->m));
        e->t_idle += cdp_time_ns() - t0;
        break;
    case CDP_OP_BACKWARD: {
        float *din = NULL;
        slot = c->mb_slot[in->mb];
        if (slot < 0) {
            st = cdp_fail(CDP_ERR_INTERNAL, "backward of micro-batch %d that was never forwarded", in->mb);
            break;
        }
        if (c->vstage > 0 && !c->in_tokens) {
            int g = c->next_grad_out;
            c->next_grad_out = (g + 1) % c->n_grad_out;
            if ((st = wait_req(e, &c->grad_out_req[g]))) break;
            din = c->grad_out[g];
            const struct cdp_kernels *k = cdp_model_kernels(c->model);
            if ((st = k->ops->zero(k->st, din, (size_t)c->in_bytes))) break;
            c->mb_grad_out[in->mb] = g;
        }
        uint64_t tb = cdp_time_ns();
        st = cdp_model_backward(c->model, slot, c->vstage == e->nv - 1 ? NULL : c->grad_in, din);
        if (!st) st = settle(e);
        slow_down(e, tb);
        c->slot_mb[slot] = -1;
        c->mb_slot[in->mb] = -1;
        uint64_t t1 = cdp_time_ns();
        e->t_compute += t1 - tb;
        e->t_fb += t1 - tb;
        e->fb_end = t1;
        trace_ev(e, CDP_EV_BACKWARD, in->mb, tb, t1);
        break;
    }
    case CDP_OP_SEND_GRAD: {
        int g = c->mb_grad_out[in->mb];
        st = send_dev(e, c->grad_out[g], c->grad_out_host ? c->grad_out_host[g] : NULL, (size_t)c->in_bytes,
                      in->peer, tag_of(TAG_GRAD, c->vstage, in->mb, e->m), &c->grad_out_req[g]);
        e->t_comm += cdp_time_ns() - t0;
        break;
    }
    case CDP_OP_REDUCE_TIED_GRADS: {
        if (!e->tied) break;
        struct chunk *tc = e->s == 0 ? &e->ch[0] : &e->ch[e->v - 1];
        for (int i = 0; i < cdp_model_tensor_count(tc->model) && !st; i++) {
            struct cdp_model_tensor *t = cdp_model_tensor(tc->model, i);
            if (!strcmp(t->name, "layers.0.wte"))
                st = allreduce_dev(e, e->tied, e->ntied, t->grad, (size_t)t->numel);
        }
        e->t_comm += cdp_time_ns() - t0;
        break;
    }
    case CDP_OP_ALLREDUCE_GRADS:
        for (int k = 0; k < e->v && !st && e->R > 1; k++) {
            struct cdp_model *mdl = e->ch[k].model;
            if (cdp_model_tensor_count(mdl) == 0) continue;
            st = allreduce_dev(e, e->dp, e->ndp, cdp_model_tensor(mdl, 0)->grad, (size_t)cdp_model_param_floats(mdl));
        }
        e->t_comm += cdp_time_ns() - t0;
        break;
    case CDP_OP_OPTIMIZER_STEP: {
        /* The global gradient norm: every stored tensor once; the last stage's
         * copy of a tied embedding is the first stage's tensor. */
        double sq = 0;
        for (int k = 0; k < e->v && !st; k++) {
            struct cdp_model *mdl = e->ch[k].model;
            const struct cdp_kernels *kk = cdp_model_kernels(mdl);
            for (int i = 0; i < cdp_model_tensor_count(mdl) && !st; i++) {
                struct cdp_model_tensor *t = cdp_model_tensor(mdl, i);
                if (t->unit < e->ch[k].first_unit) continue;
                double x = 0;
                st = kk->ops->sum_squares(kk->st, t->grad, (size_t)t->numel, &x);
                sq += x;
            }
        }
        if (st) break;
        uint64_t tc = cdp_time_ns();
        e->t_compute += tc - t0;
        if (e->p > 1) st = cdp_comm_allreduce_f64(e->pipe, &sq, 1, CDP_REDUCE_SUM, e->timeout);
        e->t_comm += cdp_time_ns() - tc;
        if (st) break;
        double norm = sqrt(sq), clip_at = e->plan->train.grad_clip;
        e->grad_norm = norm;
        float clip = clip_at > 0 && norm > clip_at ? (float)(clip_at / norm) : 1.0f;
        if (!isfinite(norm)) {
            st = cdp_fail(CDP_ERR_INVALID, "the gradient norm is %g; lower /train/optimizer/lr or set "
                          "/train/grad_clip", norm);
            break;
        }
        uint64_t to = cdp_time_ns();
        for (int k = 0; k < e->v; k++)
            cdp_optimizer_step(e->ch[k].opt, e->ch[k].model, (float)e->plan->train.optimizer.lr, clip);
        for (int k = 0; k < e->v && !st; k++) st = cdp_model_error(e->ch[k].model);
        /* a step ends when its update has: step times are whole */
        if (!st && !e->hv) st = cdp_device_synchronize(e->dev);
        e->t_compute += cdp_time_ns() - to;
        trace_ev(e, CDP_EV_OPTIMIZER, -1, to, cdp_time_ns());
        break;
    }
    default:
        st = cdp_fail(CDP_ERR_INTERNAL, "unknown instruction %d", (int)in->op);
    }
    return st;
}

/* A run of point-to-point instructions as one NCCL group (the schedule was
 * built so that such groups cannot deadlock): every transfer of the group
 * completes before it returns, so no send buffer stays in flight. */
static cdp_status execute_nccl_group(struct exec *e, const struct cdp_instr *list, int n)
{
    struct cdp_nccl_p2p ops[64];
    cdp_status st = CDP_OK;
    uint64_t t0 = cdp_time_ns();
    if (n > (int)(sizeof ops / sizeof ops[0]))
        return cdp_fail(CDP_ERR_INTERNAL, "a point-to-point group of %d transfers (64 at most)", n);
    for (int i = 0; i < n && !st; i++) {
        const struct cdp_instr *in = &list[i];
        struct chunk *c = &e->ch[in->chunk];
        int slot;
        set_where(e, in);
        switch (in->op) {
        case CDP_OP_SEND_ACT:
            slot = c->mb_slot[in->mb];
            ops[i] = (struct cdp_nccl_p2p){1, in->peer, cdp_model_output(c->model, slot), (size_t)c->out_bytes};
            break;
        case CDP_OP_RECV_ACT:
            st = acquire_slot(e, c, in->mb, &slot);
            ops[i] = (struct cdp_nccl_p2p){0, in->peer, st ? NULL : cdp_model_input(c->model, slot),
                                           (size_t)c->in_bytes};
            break;
        case CDP_OP_SEND_GRAD:
            ops[i] = (struct cdp_nccl_p2p){1, in->peer, c->grad_out[c->mb_grad_out[in->mb]], (size_t)c->in_bytes};
            break;
        case CDP_OP_RECV_GRAD:
            for (int j = 0; j < i; j++)
                if (list[j].op == CDP_OP_RECV_GRAD && list[j].chunk == in->chunk)
                    st = cdp_fail(CDP_ERR_INTERNAL, "two gradients for chunk %d in one group", in->chunk);
            ops[i] = (struct cdp_nccl_p2p){0, in->peer, c->grad_in, (size_t)c->out_bytes};
            break;
        default:
            st = cdp_fail(CDP_ERR_INTERNAL, "%s in a point-to-point group", op_names[in->op]);
        }
    }
    if (!st) st = cdp_nccl_sendrecv(e->npipe, ops, n, e->timeout);
    e->t_idle += cdp_time_ns() - t0;
    return st;
}

/* This rank's list for the step: instruction by instruction, or with NCCL
 * point-to-point, each run of transfers as one group. */
static cdp_status run_list(struct exec *e)
{
    const struct cdp_instr *list = e->sched->list[e->s];
    const int n = e->sched->len[e->s];
    cdp_status st = CDP_OK;
    for (int i = 0; i < n && !st;) {
        int end = e->npipe ? cdp_schedule_p2p_group_end(e->sched, e->s, i) : i;
        if (end > i) {
            st = execute_nccl_group(e, list + i, end - i);
            i = end;
        } else {
            st = execute(e, &list[i++]);
        }
    }
    return st;
}

/* Every in-flight send of this rank completes before the buffers change owner. */
static cdp_status drain_sends(struct exec *e)
{
    cdp_status st = CDP_OK;
    for (int k = 0; k < e->v && !st; k++) {
        struct chunk *c = &e->ch[k];
        for (int i = 0; i < c->nslots && !st; i++) st = wait_req(e, &c->slot_send[i]);
        for (int i = 0; i < c->n_grad_out && !st; i++) st = wait_req(e, &c->grad_out_req[i]);
    }
    return st;
}

/* Forward-only validation on replica 0; the loss is the same sum as one-rank
 * validation's, over the same samples. */
static cdp_status validate(struct exec *e, double *val)
{
    double sum = 0;
    cdp_status st = CDP_OK;
    const int64_t n = e->plan->train.eval_batches;
    if (e->r == 0) {
        int64_t avail = e->data ? cdp_data_split_size(e->data, CDP_SPLIT_VAL) : 0;
        for (int64_t k = 0; k < n && !st; k++) {
            int64_t first = (k * e->B) % (avail > e->B ? avail - e->B + 1 : 1);
            for (int c = 0; c < e->v && !st; c++) {
                struct chunk *ch = &e->ch[c];
                void *input = cdp_model_input(ch->model, 0);
                snprintf(cdp_where_buf, sizeof cdp_where_buf, "rank %d/%d (stage %d, replica %d): validation "
                         "micro-batch %lld, chunk %d", e->rank, e->size, e->s, e->r, (long long)k, c);
                if (ch->vstage == 0 || ch->vstage == e->nv - 1)
                    st = cdp_data_fetch(e->data, CDP_SPLIT_VAL, first, e->B,
                                        ch->vstage == 0 && e->hv ? input : e->in_scratch, e->tgt);
                if (!st && ch->vstage == 0 && !e->hv)
                    st = cdp_device_write(e->dev, input, e->in_scratch, (uint64_t)ch->in_bytes);
                if (!st && ch->vstage > 0)
                    st = recv_dev(e, input, ch->recv_host, (size_t)ch->in_bytes, (e->s + e->p - 1) % e->p,
                                  tag_of(TAG_VAL, ch->vstage - 1, (int)(k % e->m), e->m));
                if (!st) st = cdp_model_forward(ch->model, 0);
                if (!st && ch->vstage == e->nv - 1) {
                    double s = 0;
                    st = cdp_model_loss(ch->model, 0, e->tgt, 1.0f, &s);
                    sum += s;
                } else if (!st) {
                    /* slot 0's output is overwritten by the next micro-batch: complete the send first */
                    cdp_request_t req = NULL;
                    st = send_dev(e, cdp_model_output(ch->model, 0), ch->slot_host ? ch->slot_host[0] : NULL,
                                  (size_t)ch->out_bytes, (e->s + 1) % e->p,
                                  tag_of(TAG_VAL, ch->vstage, (int)(k % e->m), e->m), &req);
                    if (!st) st = cdp_comm_wait(req, e->timeout);
                }
            }
        }
    }
    /* rows per sample (every token of a token model, else 1) are known where
     * the data is read */
    double red[2] = {sum, e->shape ? (e->shape->tokens ? (double)e->shape->input_numel : 1.0) : 0};
    if (!st) st = cdp_comm_allreduce_f64(e->world, &red[0], 1, CDP_REDUCE_SUM, e->timeout);
    if (!st) st = cdp_comm_allreduce_f64(e->world, &red[1], 1, CDP_REDUCE_MAX, e->timeout);
    if (!st) *val = red[0] / ((double)n * e->B * red[1]);
    return st;
}

static void exec_free(struct exec *e)
{
    if (e->ch) {
        for (int k = 0; k < e->v; k++) {
            struct chunk *c = &e->ch[k];
            if (c->slot_send)
                for (int i = 0; i < c->nslots; i++)
                    if (c->slot_send[i]) cdp_comm_wait(c->slot_send[i], 1.0);
            if (c->grad_out_req)
                for (int i = 0; i < c->n_grad_out; i++)
                    if (c->grad_out_req[i]) cdp_comm_wait(c->grad_out_req[i], 1.0);
            cdp_optimizer_destroy(c->opt);
            cdp_model_destroy(c->model);
            free(c->slot_mb);
            free(c->mb_slot);
            free(c->slot_send);
            cdp_buffer_destroy(c->grad_in_buf);
            for (int i = 0; i < c->n_grad_out; i++) {
                if (c->grad_out_buf) cdp_buffer_destroy(c->grad_out_buf[i]);
                if (c->grad_out_host) free(c->grad_out_host[i]);
            }
            free(c->grad_out);
            free(c->grad_out_buf);
            free(c->grad_out_host);
            if (c->slot_host)
                for (int i = 0; i < c->nslots; i++) free(c->slot_host[i]);
            free(c->slot_host);
            free(c->recv_host);
            free(c->grad_in_host);
            free(c->grad_out_req);
            free(c->mb_grad_out);
        }
        free(e->ch);
    }
    cdp_trace_destroy(e->trace);
    cdp_monitor_destroy(e->monitor);
    free(e->share);
    cdp_schedule_free(e->sched);
    cdp_data_close(e->data);
    free(e->tgt);
    free(e->in_scratch);
    free(e->grad_host);
    cdp_comm_free(e->tied);
    cdp_comm_free(e->dp);
    cdp_comm_free(e->pipe);
    cdp_nccl_free(e->ntied);
    cdp_nccl_free(e->ndp);
    cdp_nccl_free(e->npipe);
    cdp_nccl_free(e->nworld);
    cdp_device_close(e->dev);
}

/* The pipeline's gradient buffers of a chunk (device memory, sized by
 * cdp_layout_chunk_buffers, so the planner counts them), and where the host
 * does not see the device the host copies that messages travel through. */
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
    if (e->hv) return CDP_OK;
    const size_t in_b = c->in_bytes ? (size_t)c->in_bytes : 1, out_b = c->out_bytes ? (size_t)c->out_bytes : 1;
    c->grad_out_host = calloc((size_t)c->n_grad_out + 1, sizeof *c->grad_out_host);
    c->slot_host = calloc((size_t)c->nslots, sizeof *c->slot_host);
    c->recv_host = malloc(in_b);
    c->grad_in_host = malloc(out_b);
    if (!c->grad_out_host || !c->slot_host || !c->recv_host || !c->grad_in_host)
        return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < c->n_grad_out; i++)
        if (!(c->grad_out_host[i] = malloc(in_b))) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < c->nslots; i++)
        if (!(c->slot_host[i] = malloc(out_b))) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    return CDP_OK;
}

/* This rank's device, as the layout says: the host's CPU (under the
 * layout's memory cap), or GPU `gpu` of its node in the plan's precision.
 * Ranks with a GPU each use NCCL for device memory when the CUDA module has
 * it; where the layout has ranks sharing a GPU they stage through the host
 * communicator. */
static cdp_status open_device(struct exec *e)
{
    const struct cdp_plan *p = e->plan;
    const struct cdp_layout_rank *k = e->me;
    cdp_status st;
    if (e->lay->backend != CDP_BACKEND_CUDA) {
        if ((st = cdp_device_open(CDP_DEVICE_CPU, 0, k->capacity, &e->dev))) return st;
        e->hv = 1;
        return CDP_OK;
    }
    int n = 0;
    if ((st = cdp_device_count(CDP_DEVICE_CUDA, &n)))
        return cdp_error_context(st, "%s: /cluster/backend is \"cuda\"", p->source);
    if (k->gpu >= n)
        return cdp_fail(CDP_ERR_INVALID, "%s: the layout puts rank %d on GPU %d of node %d, and this machine has %d "
                        "usable GPU%s (topology %s)", p->source, e->rank, k->gpu, k->node, n, n == 1 ? "" : "s",
                        e->lay->topology);
    if ((st = cdp_device_open(CDP_DEVICE_CUDA, k->gpu, k->capacity, &e->dev))) return st;
    e->hv = 0;
    const struct cdp_ops *ops = cdp_device_ops(e->dev);
    if (!ops) return cdp_fail(CDP_ERR_UNSUPPORTED, "%s has no kernels", cdp_device_name(e->dev));
    if ((st = ops->set_precision(cdp_device_kernel_state(e->dev), p->train.precision))) return st;
    CDP_INFO(EXEC, "rank %d: %s (%s), %s", e->rank, cdp_device_name(e->dev), cdp_device_description(e->dev),
             p->train.precision == CDP_PRECISION_BF16 ? "bf16 matrix products" : "fp32");
    /* every rank makes the same choice: NCCL only when the layout shares no
     * GPU, and every rank can use it (the world call checks that) */
    if (e->lay->shared_devices || cdp_nccl_available() != CDP_OK) {
        CDP_INFO(EXEC, "rank %d: device memory travels through the host communicator (%s)", e->rank,
                 e->lay->shared_devices ? "ranks share a GPU" : cdp_last_error());
        return CDP_OK;
    }
    return cdp_nccl_world(e->world, e->dev, e->timeout, &e->nworld);
}

/* The first and last stage of each replica share a tied embedding. */
static int tied_grads(const struct exec *e)
{
    const struct cdp_plan *p = e->plan;
    return p->model.kind == CDP_MODEL_GPT && p->model.tie_embeddings && e->nv > 1 && e->p > 1;
}

/* This replica's schedule for its current share; where activations travel
 * by NCCL, in the order that is safe under its rendezvous sends. */
static cdp_status build_schedule(struct exec *e)
{
    struct cdp_schedule *s = NULL;
    cdp_status st = cdp_schedule_build_ex(e->lay->schedule, e->p, e->v, e->m, tied_grads(e), e->npipe != NULL, &s);
    /* build_ex has validated the lists (under rendezvous rules too for NCCL) */
    if (st) return cdp_error_context(st, "%s: /parallel", e->plan->source);
    cdp_schedule_free(e->sched);
    e->sched = s;
    return CDP_OK;
}

static void set_share(struct exec *e)
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

static cdp_status setup(struct exec *e)
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
    e->B = L->micro_batch;
    e->timeout = p->train.timeout_s;
    if ((st = cdp_exec_check(p))) return st;
    if ((st = cdp_layout_check(L, cdp_plan_model_units(p)))) return cdp_error_context(st, "%s", p->source);
    if (e->size != L->n_ranks)
        return cdp_fail(CDP_ERR_INVALID, "%s: the layout has %d ranks (%d stages x %d replicas); this job has %d",
                        p->source, L->n_ranks, e->p, e->R, e->size);
    e->me = &L->rank[e->rank];
    e->s = e->me->stage;
    e->r = e->me->replica;
    e->share = malloc((size_t)e->R * sizeof *e->share);
    if (!e->share) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    memcpy(e->share, L->shares, (size_t)e->R * sizeof *e->share);
    set_share(e);
    e->unit = e->v > 1 ? e->p : 1;
    e->G = (int64_t)e->R * L->micro_batches * e->B;
    int *stage_slots = malloc((size_t)e->p * sizeof *stage_slots);
    if (!stage_slots) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    st = cdp_layout_slots(p, L, e->r, &e->mcap, stage_slots);
    const int slots = stage_slots[e->s];
    free(stage_slots);
    if (st) return cdp_error_context(st, "%s", p->source);
    snprintf(cdp_where_buf, sizeof cdp_where_buf, "rank %d/%d (stage %d, replica %d): setting up", e->rank,
             e->size, e->s, e->r);
    cdp_log_set_rank(e->rank, e->size);
    /* before any memory is touched, so that it lands near the rank's CPUs */
    bind_rank(e);
    /* groups: the pipeline of each replica, the replicas of each stage, and the
     * first and last stage of each replica for tied embeddings */
    if ((st = cdp_comm_split(e->world, e->r, e->s, &e->pipe))) return st;
    if ((st = cdp_comm_split(e->world, e->s, e->r, &e->dp))) return st;
    const int tied = tied_grads(e);
    if ((st = cdp_comm_split(e->world, tied && (e->s == 0 || e->s == e->p - 1) ? e->r : -1, e->s, &e->tied)))
        return st;
    if ((st = open_device(e))) return st;
    /* NCCL groups, split like the host ones */
    if (e->nworld && ((st = cdp_nccl_split(e->nworld, e->r, e->s, &e->npipe)) ||
                      (st = cdp_nccl_split(e->nworld, e->s, e->r, &e->ndp)) ||
                      (st = cdp_nccl_split(e->nworld, tied && (e->s == 0 || e->s == e->p - 1) ? e->r : -1, e->s,
                                           &e->ntied))))
        return st;
    if ((st = build_schedule(e))) return st;

    e->ch = calloc((size_t)e->v, sizeof *e->ch);
    if (!e->ch) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    const enum cdp_loss loss = cdp_model_loss_of(&p->model);
    for (int k = 0; k < e->v && !st; k++) {
        struct chunk *c = &e->ch[k];
        c->vstage = k * e->p + e->s;
        c->first_unit = (int)L->ranges[c->vstage][0];
        c->end_unit = (int)L->ranges[c->vstage][1];
        c->nslots = slots;
        if ((st = cdp_model_create(&p->model, c->first_unit, c->end_unit, e->B, slots, p->train.seed, e->dev,
                                   &c->model)))
            break;
        if (p->model.weights && (st = cdp_model_load(c->model, p->model.weights))) break;
        if ((st = cdp_optimizer_create(&p->train.optimizer, c->model, e->dev, &c->opt))) break;
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
        if (!c->slot_mb || !c->mb_slot || !c->mb_grad_out || !c->slot_send) {
            st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
            break;
        }
        if ((st = chunk_buffers(e, c, &u0, &ul))) break;
        for (int i = 0; i < slots; i++) c->slot_mb[i] = -1;
        for (int i = 0; i < e->mcap; i++) c->mb_slot[i] = -1;
    }
    if (st) return st;
    /* data: the first stage reads inputs, the last reads targets */
    if (e->s == 0 || e->s == e->p - 1) {
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
        int64_t n = p->train.steps * (int64_t)(3 * e->mcap * e->v + 2);
        if ((st = cdp_trace_create(e->size, n < 1000000 ? n : 1000000, &e->trace))) return st;
    }
    return CDP_OK;
}

/* Rank 0 receives every rank's trace events and writes the files. */
static cdp_status write_traces(struct exec *e)
{
    const struct cdp_plan *p = e->plan;
    if (!e->trace) return CDP_OK;
    int64_t n = 0;
    struct cdp_event_rec *mine = cdp_trace_events(e->trace, &n);
    void *all = NULL;
    size_t *lens = NULL;
    cdp_status st = cdp_comm_gather_bytes(e->world, mine, (size_t)n * sizeof *mine, &all, &lens, e->timeout);
    if (st || e->rank != 0) {
        free(all);
        free(lens);
        return st;
    }
    struct cdp_trace *t = NULL;
    size_t total = 0;
    for (int r = 0; r < e->size; r++) total += lens[r] / sizeof *mine;
    if (!(st = cdp_trace_create(e->size, (int64_t)total + 1, &t))) {
        const struct cdp_event_rec *ev = all;
        cdp_trace_set_origin(t, 0);
        st = cdp_trace_set_layout(t, e->lay);
        for (size_t i = 0; i < total; i++)
            cdp_trace_add(t, ev[i].rank, ev[i].kind, ev[i].step, ev[i].mb, ev[i].start_ns,
                          ev[i].start_ns + ev[i].dur_ns);
        if (!st && p->output.trace) st = cdp_trace_write_chrome(t, p->output.trace);
        if (!st && p->output.timeline)
            st = cdp_trace_write_svg(t, p->train.steps > 1 ? 2 : 1, p->output.timeline);
    }
    cdp_trace_destroy(t);
    free(all);
    free(lens);
    return st;
}

/* Replica 0's stages send their tensors to rank 0, which writes one file named
 * by global unit, as one-rank training does. Record: name[48], ndim, shape[4], numel, data. */
struct wrec {
    char name[48];
    int64_t ndim, shape[CDP_SHAPE_MAX], numel;
};

static cdp_status write_weights(struct exec *e)
{
    const char *path = e->plan->output.weights;
    if (!path) return CDP_OK;
    size_t bytes = 0;
    for (int k = 0; k < e->v && e->r == 0; k++)
        for (int i = 0; i < cdp_model_tensor_count(e->ch[k].model); i++)
            bytes += sizeof(struct wrec) + (size_t)cdp_model_tensor(e->ch[k].model, i)->numel * 4;
    char *buf = malloc(bytes ? bytes : 1), *q = buf;
    if (!buf) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    for (int k = 0; k < e->v && e->r == 0; k++)
        for (int i = 0; i < cdp_model_tensor_count(e->ch[k].model); i++) {
            struct cdp_model_tensor *t = cdp_model_tensor(e->ch[k].model, i);
            struct wrec w = {.ndim = t->ndim, .numel = t->numel};
            snprintf(w.name, sizeof w.name, "%s", t->name);
            memcpy(w.shape, t->shape, sizeof w.shape);
            memcpy(q, &w, sizeof w);
            cdp_status rs = cdp_device_read(e->dev, q + sizeof w, t->data, (uint64_t)t->numel * 4);
            if (rs) {
                free(buf);
                return rs;
            }
            q += sizeof w + (size_t)t->numel * 4;
        }
    void *all = NULL;
    size_t *lens = NULL;
    cdp_status st = cdp_comm_gather_bytes(e->world, buf, bytes, &all, &lens, e->timeout);
    free(buf);
    if (!st && e->rank == 0) {
        size_t total = 0, n = 0, cap = 64;
        for (int r = 0; r < e->size; r++) total += lens[r];
        struct cdp_st_tensor *ts = calloc(cap, sizeof *ts);
        for (char *c = all; ts && c < (char *)all + total;) {
            struct wrec w;
            memcpy(&w, c, sizeof w);
            int dup = 0;
            for (size_t j = 0; j < n; j++) dup |= !strcmp(ts[j].name, ((struct wrec *)c)->name);
            if (!dup) {
                if (n == cap) {
                    struct cdp_st_tensor *nt = realloc(ts, 2 * cap * sizeof *ts);
                    if (!nt) break;
                    ts = nt;
                    cap *= 2;
                }
                /* the name stays inside `all`; the header copy keeps shape and count */
                ts[n] = (struct cdp_st_tensor){.name = ((struct wrec *)c)->name, .dtype = CDP_DTYPE_F32,
                                               .dtype_name = "F32", .ndim = (int)w.ndim,
                                               .data = c + sizeof w, .nbytes = (uint64_t)w.numel * 4};
                for (int d = 0; d < (int)w.ndim; d++) ts[n].shape[d] = w.shape[d];
                n++;
            }
            c += sizeof w + (size_t)w.numel * 4;
        }
        if (!ts) st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
        else {
            char steps[32];
            snprintf(steps, sizeof steps, "%lld", (long long)e->plan->train.steps);
            const char *meta[] = {"format", "cdphybrid", "steps", steps};
            st = cdp_st_write(path, ts, (int)n, meta, 2);
        }
        free(ts);
    }
    free(all);
    free(lens);
    return st;
}

/* The fault knob lets tests kill or stall one rank at the start of a step. */
static void parse_fault(struct exec *e)
{
    const char *f = getenv("CDP_FAULT");
    if (!f) return;
    if (sscanf(f, "killsave:%d:%d:%15s", &e->fault_rank, &e->fault_step, e->fault_phase) == 3) e->fault_save = 1;
    else if (sscanf(f, "kill:%d:%d", &e->fault_rank, &e->fault_step) == 2) e->fault_kill = 1;
    else if (sscanf(f, "stall:%d:%d:%d", &e->fault_rank, &e->fault_step, &e->fault_seconds) == 3)
        e->fault_stall = 1;
    else if (sscanf(f, "slow:%d:%lf", &e->fault_rank, &e->slow_factor) == 2 && e->slow_factor >= 1.0 &&
             e->slow_factor <= 1000.0)
        e->fault_slow = 1;
    else CDP_WARN(EXEC, "CDP_FAULT=\"%s\" is not kill:RANK:STEP, stall:RANK:STEP:SECONDS, "
                  "killsave:RANK:STEP:PHASE or slow:RANK:FACTOR (1 to 1000); ignored", f);
}

static void fault_in_save(const struct exec *e, int step, const char *phase)
{
    if (e->fault_save && e->rank == e->fault_rank && step == e->fault_step && !strcmp(phase, e->fault_phase))
        raise(SIGKILL);
}

static void inject_fault(const struct exec *e)
{
    if (e->rank != e->fault_rank || e->step != e->fault_step) return;
    if (e->fault_kill) raise(SIGKILL);
    if (e->fault_stall) sleep((unsigned)e->fault_seconds);
}

static void human_rate(double v, char *buf, size_t cap)
{
    if (v >= 1e9) snprintf(buf, cap, "%.1fG", v / 1e9);
    else if (v >= 1e6) snprintf(buf, cap, "%.2fM", v / 1e6);
    else if (v >= 1e4) snprintf(buf, cap, "%.1fk", v / 1e3);
    else if (v >= 10) snprintf(buf, cap, "%.0f", v);
    else snprintf(buf, cap, "%.2f", v);
}

static void print_shares(FILE *f, const int64_t *share, int R)
{
    for (int r = 0; r < R; r++) fprintf(f, "%s%lld", r ? " " : "", (long long)share[r]);
}

/* Every rank measured its busy time per micro-batch since the last look; a
 * replica's is that of its slowest stage. New shares for those speeds replace
 * the current ones when they promise a step at least 5% shorter (so noise does
 * not move micro-batches back and forth). Every rank computes the same shares
 * from the same reduced times. */
static cdp_status rebalance(struct exec *e, int step)
{
    const int R = e->R;
    double *t = calloc((size_t)R, sizeof *t);
    int64_t *next = calloc((size_t)R, sizeof *next);
    cdp_status st = !t || !next ? cdp_fail(CDP_ERR_NOMEM, "out of memory") : CDP_OK;
    if (!st) {
        t[e->r] = e->rb_mb > 0 ? e->rb_busy / (double)e->rb_mb : 0;
        st = cdp_comm_allreduce_f64(e->world, t, (size_t)R, CDP_REDUCE_MAX, e->timeout);
    }
    e->rb_busy = 0;
    e->rb_mb = 0;
    int64_t total = 0;
    for (int r = 0; r < R; r++) total += e->share[r];
    int ok = 1;
    for (int r = 0; r < R; r++) ok &= t && t[r] > 0;
    if (!st && ok && !(st = cdp_balance_shares(t, R, e->p, total, e->unit, e->mcap, next))) {
        const double now = cdp_balance_step_time(t, R, e->p, e->share),
                     then = cdp_balance_step_time(t, R, e->p, next);
        if (memcmp(next, e->share, (size_t)R * sizeof *next) && then < 0.95 * now) {
            if (e->rank == 0 && e->out) {
                fprintf(e->out, "step %d: rebalanced micro-batches per replica ", step);
                print_shares(e->out, e->share, R);
                fputs(" -> ", e->out);
                print_shares(e->out, next, R);
                fputs(" (measured ms per micro-batch:", e->out);
                for (int r = 0; r < R; r++) fprintf(e->out, " %.1f", 1e3 * t[r]);
                fprintf(e->out, "; predicted forward/backward %.0f -> %.0f ms)\n", 1e3 * now, 1e3 * then);
                fflush(e->out);
            }
            CDP_INFO(EXEC, "step %d: replica %d now runs %lld micro-batches (was %lld)", step, e->r,
                     (long long)next[e->r], (long long)e->share[e->r]);
            memcpy(e->share, next, (size_t)R * sizeof *next);
            set_share(e);
            st = build_schedule(e);
        }
    }
    free(t);
    free(next);
    return st;
}

/* Replica 0's ranks each write the part of their stage; rank 0 commits the
 * checkpoint once every part is on disk. */
static cdp_status save_checkpoint(struct exec *e, int step)
{
    const struct cdp_plan *p = e->plan;
    cdp_status st = CDP_OK;
    snprintf(cdp_where_buf, sizeof cdp_where_buf, "rank %d/%d (stage %d, replica %d), step %d: writing a checkpoint",
             e->rank, e->size, e->s, e->r, step);
    fault_in_save(e, step, "part");
    if (e->r == 0) {
        struct cdp_model **models = malloc((size_t)e->v * sizeof *models);
        struct cdp_optimizer **opts = malloc((size_t)e->v * sizeof *opts);
        if (!models || !opts) st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
        for (int k = 0; !st && k < e->v; k++) {
            models[k] = e->ch[k].model;
            opts[k] = e->ch[k].opt;
        }
        char part[32];
        snprintf(part, sizeof part, "stage-%d", e->s);
        if (!st) st = cdp_ckpt_write_part(p->train.checkpoint.dir, step, part, models, opts, e->v);
        free(models);
        free(opts);
    }
    fault_in_save(e, step, "commit");
    if (!st) st = cdp_comm_barrier(e->world, e->timeout);
    if (!st && e->rank == 0) {
        struct cdp_ckpt_info info = {.step = step, .samples_seen = e->sample_base + (int64_t)(step - e->step0) * e->G,
                                     .seed = p->train.seed};
        snprintf(info.optimizer, sizeof info.optimizer, "%s",
                 p->train.optimizer.type == CDP_OPT_SGD ? "sgd" : "adamw");
        if (!(st = cdp_plan_to_json(p, &info.plan_json)))
            st = cdp_ckpt_commit(p->train.checkpoint.dir, step, &info, (int)p->train.checkpoint.keep);
        free(info.plan_json);
    }
    return st;
}

/* Every rank loads its ranges' tensors and optimizer state from the newest
 * complete checkpoint; training continues at the step after it. */
static cdp_status resume(struct exec *e, const char *dir)
{
    char *path = NULL;
    struct cdp_ckpt_info info = {0};
    cdp_status st = cdp_ckpt_find_latest(dir, &path, &info);
    if (st) return st;
    struct cdp_model **models = malloc((size_t)e->v * sizeof *models);
    struct cdp_optimizer **opts = malloc((size_t)e->v * sizeof *opts);
    if (!models || !opts) st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
    for (int k = 0; !st && k < e->v; k++) {
        models[k] = e->ch[k].model;
        opts[k] = e->ch[k].opt;
    }
    if (!st) st = cdp_ckpt_load(path, &info, models, opts, e->v);
    if (!st && info.step >= e->plan->train.steps)
        st = cdp_fail(CDP_ERR_INVALID, "%s: the checkpoint is at step %lld and /train/steps is %lld: nothing "
                      "left to train", path, (long long)info.step, (long long)e->plan->train.steps);
    /* every rank has read its tensors before rank 0 tidies the folder */
    if (!st) st = cdp_comm_barrier(e->world, e->timeout);
    if (!st && e->rank == 0 && e->plan->train.checkpoint.dir)
        cdp_ckpt_discard_incomplete_after(e->plan->train.checkpoint.dir, info.step);
    if (!st) {
        e->step0 = (int)info.step;
        e->sample_base = info.samples_seen;
        CDP_INFO(CKPT, "resuming from %s (step %lld, %lld samples seen)", path, (long long)info.step,
                 (long long)info.samples_seen);
        if (e->rank == 0 && e->out)
            fprintf(e->out, "resuming from %s at step %lld\n", path, (long long)info.step);
    }
    free(models);
    free(opts);
    free(path);
    cdp_ckpt_info_free(&info);
    return st;
}

/* metrics.jsonl's first record of a run: the layout it runs, every rank's
 * place and predicted memory. */
static cdp_status write_layout_record(const struct exec *e, FILE *f)
{
    const struct cdp_layout *l = e->lay;
    json_t *ranks = cdp_layout_ranks_json(l);
    json_t *o = ranks ? json_pack("{s:{s:s,s:s,s:i,s:i,s:i,s:i,s:i,s:o}}", "layout", "topology", l->topology, "schedule",
                                  cdp_schedule_name(l->schedule), "stages", l->stages, "chunks", l->chunks, "replicas",
                                  l->replicas, "micro_batches", l->micro_batches, "nodes", l->n_nodes, "ranks", ranks)
                      : NULL;
    char *text = o ? json_dumps(o, JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    if (!text) return cdp_fail(CDP_ERR_NOMEM, "out of memory writing the metrics");
    fprintf(f, "%s\n", text);
    free(text);
    fflush(f);
    return CDP_OK;
}

/* Every rank's device high-water mark, gathered on every rank (n_ranks
 * entries, malloc'd). */
static cdp_status gather_peaks(const struct exec *e, double **out)
{
    double *pk = calloc((size_t)e->size, sizeof *pk);
    if (!pk) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    pk[e->rank] = (double)cdp_device_mem_peak(e->dev);
    cdp_status st = cdp_comm_allreduce_f64(e->world, pk, (size_t)e->size, CDP_REDUCE_SUM, e->timeout);
    if (st) {
        free(pk);
        return st;
    }
    *out = pk;
    return CDP_OK;
}

/* "memory: peak 12.3 MiB, predicted 12.3 MiB (+0.0%)" over the ranks: the
 * one furthest from its prediction. */
static void print_memory(const struct exec *e, const double *peak, FILE *out)
{
    int worst = 0;
    double werr = -1;
    for (int r = 0; r < e->size; r++) {
        const double pred = (double)e->lay->rank[r].memory.device;
        const double err = pred > 0 ? fabs(peak[r] - pred) / pred : 0;
        if (err > werr) werr = err, worst = r;
    }
    const double pred = (double)e->lay->rank[worst].memory.device;
    char a[32], b[32];
    cdp_format_bytes((uint64_t)peak[worst], a, sizeof a);
    cdp_format_bytes((uint64_t)pred, b, sizeof b);
    if (e->size == 1)
        fprintf(out, "memory: device peak %s, predicted %s (%+.1f%%)\n", a, b,
                pred > 0 ? 100 * (peak[worst] / pred - 1) : 0.0);
    else
        fprintf(out, "memory: device peak per rank within %.1f%% of the prediction (furthest: rank %d, %s against %s)\n",
                100 * werr, worst, a, b);
}

cdp_status cdp_exec_run(const struct cdp_plan *p, const struct cdp_layout *layout, cdp_comm_t world,
                        const struct cdp_train_opts *o, struct cdp_train_summary *summary)
{
    struct exec e = {.plan = p, .lay = layout, .world = world};
    double *peaks = NULL;
    struct cdp_train_summary sum = {0};
    cdp_status st;
    FILE *out = o ? o->out : NULL, *metrics = NULL;
    e.out = out;
    parse_fault(&e);
    if ((st = setup(&e))) goto fail;
    if (o && o->resume && (st = resume(&e, o->resume))) goto fail;
    if ((st = cdp_monitor_create(e.s, e.r, e.dev, &e.monitor))) goto fail;
    double mon_busy = 0;
    int mon_steps = 0;
    int64_t mon_mbs = 0;
    if (e.rank == 0 && p->output.metrics && !(metrics = fopen(p->output.metrics, e.step0 ? "a" : "w"))) {
        st = cdp_fail(CDP_ERR_IO, "%s: cannot write: %s", p->output.metrics, strerror(errno));
        goto fail;
    }
    if (metrics && (st = write_layout_record(&e, metrics))) goto fail;
    double totals[2] = {0, 0}; /* flops of a step, parameters */
    for (int k = 0; k < e.v; k++) {
        totals[0] += cdp_model_step_flops(e.ch[k].model) * e.m;
        if (e.r == 0)
            for (int i = 0; i < cdp_model_tensor_count(e.ch[k].model); i++) {
                const struct cdp_model_tensor *t = cdp_model_tensor(e.ch[k].model, i);
                if (t->unit >= e.ch[k].first_unit) totals[1] += (double)t->numel;
            }
    }
    if ((st = cdp_comm_allreduce_f64(world, totals, 2, CDP_REDUCE_SUM, e.timeout))) goto fail;
    const double flops_per_step = totals[0];
    const int tokens = e.shape ? e.shape->tokens : p->model.kind == CDP_MODEL_GPT;
    const double sample_tokens = p->model.kind == CDP_MODEL_GPT ? (double)p->model.context : 0;
    if (e.rank == 0 && out) {
        fprintf(out, "training %s: %.0f parameters, %lld steps of %lld samples", p->model.kind == CDP_MODEL_GPT
                ? p->model.preset : "model", totals[1], (long long)p->train.steps, (long long)e.G);
        if (e.size == 1)
            fprintf(out, " (%d x %d), %s\n", e.m, e.B, p->train.optimizer.type == CDP_OPT_SGD ? "sgd" : "adamw");
        else
        {
            int equal = 1;
            for (int r = 1; r < e.R; r++) equal &= e.share[r] == e.share[0];
            fprintf(out, " on %d ranks: %d stages x %d replicas, %s, ", e.size, e.p, e.R,
                    cdp_schedule_name(p->parallel.schedule));
            if (equal) {
                fprintf(out, "%lld micro-batches of %d per replica\n", (long long)e.share[0], e.B);
            } else {
                fputs("micro-batches of ", out);
                fprintf(out, "%d per replica: ", e.B);
                print_shares(out, e.share, e.R);
                fputc('\n', out);
            }
        }
    }
    if ((st = cdp_comm_barrier(world, e.timeout))) goto fail;
    /* every rank's events are timed from the barrier, on its own clock */
    const uint64_t t_start = cdp_time_ns();
    if (e.trace) cdp_trace_set_origin(e.trace, t_start);
    int measured = 0;
    for (int step = e.step0 + 1; step <= p->train.steps; step++) {
        e.step = step;
        e.loss_sum = 0;
        e.t_compute = e.t_comm = e.t_idle = e.t_fb = 0;
        e.step_start = e.fb_end = cdp_time_ns();
        for (int k = 0; k < e.v; k++) cdp_model_zero_grad(e.ch[k].model);
        e.t_compute += cdp_time_ns() - e.step_start;
        inject_fault(&e);
        st = run_list(&e);
        if (!st) st = drain_sends(&e);
        if (st) goto fail;
        const uint64_t t_end = cdp_time_ns();
        /* the loss, and this step's timing averaged over ranks. The bubble is the
         * idle share of the forward/backward phase: the longest rank's time from
         * its step start to its last backward is the phase; each rank's idle time
         * is the phase minus its own loading, forward and backward. */
        double red[6] = {e.loss_sum, (double)e.t_fb / 1e9, (double)e.t_compute / 1e9, (double)e.t_comm / 1e9,
                         (double)e.t_idle / 1e9, (double)(t_end - e.step_start) / 1e9};
        double mx[2] = {e.shape ? (double)e.scale : 0, (double)(e.fb_end - e.step_start) / 1e9};
        if ((st = cdp_comm_allreduce_f64(world, red, 6, CDP_REDUCE_SUM, e.timeout))) goto fail;
        if ((st = cdp_comm_allreduce_f64(world, mx, 2, CDP_REDUCE_MAX, e.timeout))) goto fail;
        const double loss = red[0] * mx[0];
        const double bubble = mx[1] > 0 ? fmax(0.0, 1.0 - red[1] / e.size / mx[1]) : 0;
        const double dt = (double)(t_end - e.step_start) / 1e9;
        if (!isfinite(loss)) {
            st = cdp_fail(CDP_ERR_INVALID, "step %d: the loss is %g; lower /train/optimizer/lr or set "
                          "/train/grad_clip", step, loss);
            goto fail;
        }
        /* the monitor and rebalancing see this step's busy time */
        mon_busy += (double)e.t_fb / 1e9;
        mon_steps++;
        mon_mbs += e.m;
        if (step > e.step0 + 1 || p->parallel.rebalance_every == 1) { /* the first step warms up */
            e.rb_busy += (double)e.t_fb / 1e9;
            e.rb_mb += e.m;
        }
        struct cdp_monitor_report mon = {0};
        const int report = step == e.step0 + 1 || step % p->train.log_every == 0 || step == p->train.steps;
        if (report) {
            if ((st = cdp_monitor_collect(e.monitor, world, mon_busy, mon_steps, mon_mbs, e.timeout, &mon)))
                goto fail;
            mon_busy = 0;
            mon_steps = 0;
            mon_mbs = 0;
            if (mon.straggler >= 0 && e.rank == 0)
                CDP_WARN(EXEC, "rank %d (stage %d, replica %d) has been the slowest of stage %d's replicas in %d "
                         "reports running: %.2f ms per micro-batch against their median %.2f ms%s", mon.straggler,
                         mon.ranks[mon.straggler].stage, mon.ranks[mon.straggler].replica,
                         mon.ranks[mon.straggler].stage, CDP_MONITOR_STRAGGLER_REPORTS, 1e3 * mon.straggler_mb_s,
                         1e3 * mon.median_mb_s, p->parallel.rebalance_every > 0
                         ? "; rebalancing gives its replica fewer micro-batches"
                         : "; /parallel/rebalance_every would move micro-batches away from it");
        }
        if (step == e.step0 + 1) sum.first_loss = loss;
        sum.last_loss = loss;
        sum.steps = step;
        if (step > e.step0 + 1 || p->train.steps == e.step0 + 1) {
            measured++;
            sum.bubble += bubble;
            sum.compute_s += red[2] / e.size;
            sum.comm_s += red[3] / e.size;
            sum.idle_s += red[4] / e.size;
            sum.step_s += red[5] / e.size;
        }
        double val = NAN;
        const int last = step == p->train.steps;
        if ((p->train.eval_every > 0 && step % p->train.eval_every == 0) || last) {
            if ((st = validate(&e, &val))) goto fail;
            sum.val_loss = val;
        }
        if (p->train.checkpoint.dir && (step % p->train.checkpoint.every == 0 || last) &&
            (st = save_checkpoint(&e, step)))
            goto fail;
        if (p->parallel.rebalance_every > 0 && e.R > 1 && step % p->parallel.rebalance_every == 0 && !last &&
            (st = rebalance(&e, step)))
            goto fail;
        if (e.rank != 0) continue;
        const double sps = (double)e.G / dt, tps = tokens ? sps * sample_tokens : 0, fps = flops_per_step / dt;
        if (metrics) {
            fprintf(metrics, "{\"step\": %d, \"loss\": %.9g, \"lr\": %g, \"grad_norm\": %.6g, \"time_s\": %.6g, "
                    "\"samples_per_s\": %.6g, \"tokens_per_s\": %.6g, \"flops_per_s\": %.6g, \"bubble\": %.4f",
                    step, loss, p->train.optimizer.lr, e.grad_norm, dt, sps, tps, fps, bubble);
            if (!isnan(val)) fprintf(metrics, ", \"val_loss\": %.6g", val);
            if (e.R > 1) {
                fputs(", \"shares\": [", metrics);
                for (int r = 0; r < e.R; r++) fprintf(metrics, "%s%lld", r ? ", " : "", (long long)e.share[r]);
                fputc(']', metrics);
            }
            if (report) {
                cdp_monitor_json(&mon, e.lay, metrics);
                if (mon.straggler >= 0) fprintf(metrics, ", \"straggler\": %d", mon.straggler);
            }
            fputs("}\n", metrics);
            fflush(metrics);
        }
        if (out && (step == e.step0 + 1 || step % p->train.log_every == 0 || last || !isnan(val))) {
            char s1[32], s2[32], s3[32];
            human_rate(sps, s1, sizeof s1);
            human_rate(tps, s2, sizeof s2);
            human_rate(fps, s3, sizeof s3);
            if (o->progress) fputs("\r\033[K", out);
            fprintf(out, "step %*d/%lld  loss %.4f", (int)snprintf(NULL, 0, "%lld", (long long)p->train.steps), step,
                    (long long)p->train.steps, loss);
            if (!isnan(val)) fprintf(out, "  val %.4f", val);
            fprintf(out, "  | %s samples/s", s1);
            if (tps > 0) fprintf(out, "  %s tokens/s", s2);
            fprintf(out, dt < 0.01 ? "  %sFLOP/s  %.2f ms/step" : "  %sFLOP/s  %.0f ms/step", s3, dt * 1e3);
            if (e.size > 1) fprintf(out, "  bubble %.0f%%", 100.0 * bubble);
            if (report) {
                char mb[160];
                cdp_monitor_format(&mon, mb, sizeof mb);
                fprintf(out, "  | %s", mb);
            }
            fputc('\n', out);
        } else if (out && o->progress) {
            fprintf(out, "\r\033[Kstep %d/%lld  loss %.4f", step, (long long)p->train.steps, loss);
            fflush(out);
        }
    }
    sum.seconds = (double)(cdp_time_ns() - t_start) / 1e9;
    const int64_t done = sum.steps - e.step0;
    sum.samples_per_s = (double)(done * e.G) / sum.seconds;
    sum.tokens_per_s = tokens ? sum.samples_per_s * sample_tokens : 0;
    sum.flops_per_s = flops_per_step * (double)done / sum.seconds;
    if (measured) {
        sum.bubble /= measured;
        sum.compute_s /= measured;
        sum.comm_s /= measured;
        sum.idle_s /= measured;
        sum.step_s /= measured;
        sum.overhead_s = sum.step_s - sum.compute_s - sum.comm_s - sum.idle_s;
    }
    if ((st = write_traces(&e))) goto fail;
    if ((st = write_weights(&e))) goto fail;
    if ((st = gather_peaks(&e, &peaks))) goto fail;
    sum.peak_memory_bytes = peaks[e.rank];
    sum.predicted_memory_bytes = (double)e.me->memory.device;
    if (e.rank == 0 && out) {
        char s3[32];
        human_rate(sum.flops_per_s, s3, sizeof s3);
        fprintf(out, "done: %lld steps in %.1f s, loss %.4f -> %.4f, validation loss %.4f, %sFLOP/s\n",
                (long long)done, sum.seconds, sum.first_loss, sum.last_loss, sum.val_loss, s3);
        if (e.size > 1)
            fprintf(out, "per step (mean over ranks): %.1f ms compute, %.1f ms communication, %.1f ms waiting on "
                    "peers, %.2f ms executor overhead; bubble %.1f%%\n", sum.compute_s * 1e3, sum.comm_s * 1e3,
                    sum.idle_s * 1e3, sum.overhead_s * 1e3, 100 * sum.bubble);
        print_memory(&e, peaks, out);
        if (p->output.weights) fprintf(out, "weights written to %s\n", p->output.weights);
        if (p->train.checkpoint.dir) fprintf(out, "checkpoints in %s\n", p->train.checkpoint.dir);
    }
    if (metrics) fclose(metrics);
    free(peaks);
    exec_free(&e);
    if (summary) *summary = sum;
    return CDP_OK;
fail:
    if (metrics) fclose(metrics);
    free(peaks);
    {
        char msg[4096];
        snprintf(msg, sizeof msg, "%s", cdp_last_error());
        cdp_fail(st, "%s: %s", cdp_where_buf[0] ? cdp_where_buf : "setting up", msg);
    }
    /* other ranks may wait on this one: the caller aborts the job; no clean-up
     * that could block (pending requests) is attempted. NCCL communicators are
     * aborted now, so no kernel of theirs waits on a peer that is gone. */
    if (e.nworld) cdp_nccl_abort_all();
    if (e.size == 1) exec_free(&e);
    return st;
}
