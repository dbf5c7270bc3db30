/* The interpreter: runs this rank's instruction list of one step (LOAD,
 * FORWARD, SEND/RECV of activations and gradients, BACKWARD, the reductions,
 * the optimizer step) over its chunks' models and its communicators, and the
 * forward-only lists (validation, eval, decoding: exec_forward.c) in their
 * modes. It hands buffers of device memory to the
 * communicators of its roles and never chooses a transport (comm/ did); where
 * the pipeline's communicator batches transfers (NCCL), each run of
 * transfers is one batch. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "model/infer.h"
#include "model/optim.h"
#include "pipeline/run/exec_internal.h"

char cdp_exec_where_buf[256];

enum { TAG_ACT = 0, TAG_GRAD = 1 };

static const char *const op_names[] = {
    "LOAD", "FORWARD", "SEND_ACT", "RECV_ACT", "BACKWARD", "SEND_GRAD", "RECV_GRAD",
    "BACKWARD_INPUT", "BACKWARD_WEIGHT", "REDUCE_TIED_GRADS", "ALLREDUCE_GRADS", "OPTIMIZER_STEP"};
CDP_TABLE_CHECK(op_names, CDP_OP_COUNT);

static void set_where(struct exec *e, const struct cdp_instr *in)
{
    char buf[256];
    /* forward-only lists run after a step (validation) or alone (eval, decoding) */
    int n = e->eval_only ? snprintf(buf, sizeof buf, "rank %d/%d (stage %d), %s: %s", e->rank, e->size, e->s,
                                    e->dec ? "decoding" : "evaluating", op_names[in->op])
                   : snprintf(buf, sizeof buf, "rank %d/%d (stage %d, replica %d), %s %d: %s", e->rank, e->size, e->s,
                              e->r, e->fwd ? "validation after step" : "step", e->step, op_names[in->op]);
    if (in->mb >= 0) n += snprintf(buf + n, sizeof buf - (size_t)n, " of micro-batch %d", in->mb);
    if (in->chunk >= 0 && e->v > 1) n += snprintf(buf + n, sizeof buf - (size_t)n, ", chunk %d", in->chunk);
    if (in->peer >= 0)
        snprintf(buf + n, sizeof buf - (size_t)n, in->op == CDP_OP_RECV_ACT || in->op == CDP_OP_RECV_GRAD
                 ? ", from stage %d" : ", to stage %d", in->peer);
    memcpy(cdp_exec_where_buf, buf, sizeof buf);
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

static cdp_status acquire_wslot(struct chunk *c, int mb, int *wslot)
{
    for (int i = 0; i < c->nwslots; i++) {
        if (c->wslot_mb[i] >= 0) continue;
        c->wslot_mb[i] = mb;
        c->mb_wslot[mb] = i;
        *wslot = i;
        return CDP_OK;
    }
    return cdp_fail(CDP_ERR_INTERNAL, "no free W-state slot for micro-batch %d (%d slots)", mb, c->nwslots);
}

/* The chunk a trace event names: only in an interleaved run. */
static int ev_chunk(const struct exec *e, int chunk) { return e->v > 1 ? chunk : -1; }

static void trace_ev(struct exec *e, enum cdp_event_kind k, int mb, int chunk, uint64_t t0, uint64_t t1)
{
    if (e->trace)
        cdp_trace_add_event(e->trace, &(struct cdp_event_rec){.rank = e->rank, .kind = k, .step = e->step, .mb = mb,
                                                              .start_ns = t0, .dur_ns = t1 - t0,
                                                              .chunk = ev_chunk(e, chunk), .peer = -1});
}

/* A send or receive of n bytes with stage peer_stage of this replica. */
static void trace_p2p(struct exec *e, enum cdp_event_kind k, const struct cdp_instr *in, size_t n, uint64_t t0,
                      uint64_t t1)
{
    if (e->trace)
        cdp_trace_add_event(e->trace, &(struct cdp_event_rec){
            .rank = e->rank, .kind = k, .step = e->step, .mb = in->mb, .start_ns = t0, .dur_ns = t1 - t0,
            .chunk = ev_chunk(e, in->chunk), .peer = cdp_layout_rank_of(e->lay, in->peer, e->r), .bytes = n});
}

/* A collective over n floats among the stage's replicas or the tied pair. */
static void trace_coll(struct exec *e, enum cdp_event_kind k, int chunk, int group, size_t n, uint64_t t0,
                       uint64_t t1)
{
    if (e->trace)
        cdp_trace_add_event(e->trace, &(struct cdp_event_rec){
            .rank = e->rank, .kind = k, .step = e->step, .mb = -1, .start_ns = t0, .dur_ns = t1 - t0,
            .chunk = ev_chunk(e, chunk), .peer = -1, .group = group,
            .members = group == CDP_EV_GROUP_TIED ? 2 : e->R, .bytes = (uint64_t)n * sizeof(float)});
}

/* A message of n bytes of device memory to a peer of the pipeline; the
 * buffer stays untouched until the request completes. */
static cdp_status send_dev(struct exec *e, const void *dev, size_t n, int peer, int tag, cdp_request_t *req)
{
    return cdp_comm_isend(e->pipe, dev, n, peer, tag, req);
}

/* A peer's message into device memory. */
static cdp_status recv_dev(struct exec *e, void *dev, size_t n, int peer, int tag)
{
    cdp_request_t req = NULL;
    cdp_status st = cdp_comm_irecv(e->pipe, dev, n, peer, tag, &req);
    if (!st) st = cdp_comm_wait(req, e->timeout);
    return st;
}

/* Receives posted early: after the BACKWARD of micro-batch k of a chunk has
 * read grad_in, the chunk's next RECV_GRAD of the list is posted at once, so
 * the gradient can land while the rank computes (where the pipeline's
 * transfers are not batched: a batch posts them together anyway). */
static cdp_status post_next_grad(struct exec *e, struct chunk *c, const struct cdp_instr *in)
{
    const struct cdp_instr *list = e->sched->list[e->s];
    const int n = e->sched->len[e->s];
    if (cdp_comm_p2p_grouped(e->pipe) || c->vstage == e->nv - 1 || c->grad_in_req) return CDP_OK;
    for (int i = (int)(in - list) + 1; i < n; i++) {
        const struct cdp_instr *x = &list[i];
        if (x->chunk != in->chunk) continue;
        if (x->op == CDP_OP_BACKWARD || x->op == CDP_OP_BACKWARD_INPUT) return CDP_OK; /* not a list this knows */
        if (x->op != CDP_OP_RECV_GRAD) continue;
        c->grad_in_mb = x->mb;
        c->grad_in_posted = cdp_time_ns();
        return cdp_comm_irecv(e->pipe, c->grad_in, (size_t)c->out_bytes, x->peer,
                              tag_of(TAG_GRAD, c->vstage + 1, x->mb, e->m), &c->grad_in_req);
    }
    return CDP_OK;
}

/* The sum over the stage's replicas of the window [from, from + count) of an
 * n-float device buffer (dev points at the window's first float), into this
 * replica's part of it. */
static cdp_status reduce_window(struct exec *e, float *dev, size_t n, size_t from, size_t count)
{
    return cdp_comm_reduce_scatter_window_wire(e->dp, dev, n, from, count, CDP_REDUCE_SUM, e->wire_dp, e->timeout);
}

/* ZeRO-2: the model's hook after each unit's backward (and for its tied
 * tensors at the step's end); its time is communication. */
cdp_status cdp_exec_grad_reduce(void *ctx, float *buf, uint64_t n, uint64_t from, uint64_t count)
{
    struct exec *e = ctx;
    const uint64_t t0 = cdp_time_ns();
    cdp_status st = reduce_window(e, buf, (size_t)n, (size_t)from, (size_t)count);
    const uint64_t t1 = cdp_time_ns();
    e->t_reduce += t1 - t0;
    trace_coll(e, CDP_EV_REDUCE_SCATTER, -1, CDP_EV_GROUP_REPLICAS, (size_t)count, t0, t1);
    return st;
}

/* Sum of squares of a chunk's gradients that this rank counts for the global
 * norm: every stored tensor once (the last stage's copy of a tied embedding is
 * the first stage's tensor), and under ZeRO-1 only this replica's shard. */
static cdp_status chunk_sumsq(struct chunk *ch, double *out, double *split)
{
    struct cdp_model *mdl = ch->model;
    double sq = 0, sp = 0;
    for (int i = 0; i < cdp_model_tensor_count(mdl); i++) {
        struct cdp_model_tensor *t = cdp_model_tensor(mdl, i);
        if (t->unit < ch->first_unit) continue;
        float *s1, *s2;
        uint64_t from, count; /* the elements its optimizer steps */
        cdp_optimizer_state_range(ch->opt, mdl, i, &s1, &s2, &from, &count);
        if (!count) continue;
        double x = 0;
        cdp_status st = cdp_model_sum_squares(mdl, cdp_model_reduced_grad(mdl, i, from), (size_t)count, &x);
        if (st) return st;
        /* a tensor-split slice is a part of the norm; a replicated tensor is the same on the whole group */
        if (cdp_model_unit(mdl, t->unit_local)->params[t->param_local].shard_dim >= 0) sp += x;
        else sq += x;
    }
    *out = sq;
    *split = sp;
    return CDP_OK;
}

/* Kernels run asynchronously on a GPU. Where compute times matter (several
 * ranks: the bubble, the monitor's straggler, rebalancing; a trace) they are
 * taken after the kernels end; one rank without a trace does not wait (the
 * loss read back each micro-batch is its only wait inside a step). */
static cdp_status settle(const struct exec *e)
{
    return e->hv || (e->size == 1 && !e->trace) ? CDP_OK : cdp_device_synchronize(e->dev);
}

/* Forward-only mode: micro-batch k of validation starts at sample (k B) mod
 * (split - B + 1) of the validation split, wrapping round a small split. */
static int64_t val_first(const struct exec *e, int mb)
{
    const int64_t avail = cdp_data_split_size(e->data, CDP_SPLIT_VAL), k = e->fwd_base + mb;
    return (k * e->B) % (avail > e->B ? avail - e->B + 1 : 1);
}

/* Forward-only mode: the slot of mb on chunk c is free once its output has
 * been taken (the loss, a send posted, the next chunk's copy); a send still
 * in flight is waited for before the slot is taken again (acquire_slot). */
static void fwd_release(struct exec *e, struct chunk *c, int mb)
{
    if (!e->fwd || c->mb_slot[mb] < 0) return;
    c->slot_mb[c->mb_slot[mb]] = -1;
    c->mb_slot[mb] = -1;
}

static cdp_status load(struct exec *e, int mb)
{
    const int64_t first = e->fwd ? val_first(e, mb)
                                 : e->sample_base + (int64_t)(e->step - 1 - e->step0) * e->G +
                                       ((int64_t)e->moff + mb) * e->B;
    void *inputs = e->in_scratch, *dev_in = NULL;
    cdp_status st;
    if (e->s == 0) {
        int slot;
        if ((st = acquire_slot(e, &e->ch[0], mb, &slot))) return st;
        dev_in = cdp_model_input(e->ch[0].model, slot);
        if (e->hv) inputs = dev_in;
    }
    st = cdp_data_fetch(e->data, e->fwd ? CDP_SPLIT_VAL : CDP_SPLIT_TRAIN, first, e->B, inputs,
                        (char *)e->tgt + mb * e->tgt_bytes);
    if (!st && dev_in && !e->hv) st = cdp_device_write(e->dev, dev_in, inputs, (uint64_t)e->ch[0].in_bytes);
    return st;
}

/* zbv's turn of the V: the input of chunk c's micro-batch mb is the output
 * of the chunk of this rank before it, copied into c's slot. */
static cdp_status local_input(struct exec *e, struct chunk *c, int mb, int slot)
{
    struct chunk *pc = &e->ch[c->local_prev];
    const int ps = pc->mb_slot[mb];
    if (ps < 0) return cdp_fail(CDP_ERR_INTERNAL, "chunk %d's input of micro-batch %d: chunk %d has no output of it",
                                (int)(c - e->ch), mb, c->local_prev);
    return cdp_model_copy(c->model, cdp_model_input(c->model, slot), cdp_model_output(pc->model, ps),
                          (size_t)c->in_bytes);
}

/* ... and the gradient of that input, din, is the output gradient of the
 * chunk before, which it reads where a received one lands (grad_in; the
 * lists run that chunk's backward of the micro-batch before c's next). */
static cdp_status local_grad(struct exec *e, struct chunk *c, const float *din)
{
    struct chunk *pc = &e->ch[c->local_prev];
    return cdp_model_copy(c->model, pc->grad_in, din, (size_t)c->in_bytes);
}

/* zbv with tied embeddings: rank 0 holds the embedding (chunk 0) and the
 * head's copy of it (the chunk of the last virtual stage); each gets the sum
 * of both gradients, as REDUCE_TIED_GRADS gives two ranks. */
static cdp_status sum_tied_locally(struct exec *e)
{
    struct chunk *a = &e->ch[0], *b = NULL;
    for (int k = 0; k < e->v; k++)
        if (e->ch[k].vstage == e->nv - 1) b = &e->ch[k];
    if (!b || b == a) return CDP_OK;
    struct cdp_model_tensor *ta = cdp_model_tied_tensor(a->model), *tb = cdp_model_tied_tensor(b->model);
    if (!ta || !tb) return CDP_OK;
    if (ta->numel != tb->numel)
        return cdp_fail(CDP_ERR_INTERNAL, "tied embedding of %lld and %lld floats", (long long)ta->numel,
                        (long long)tb->numel);
    const uint64_t t0 = cdp_time_ns();
    cdp_status st = cdp_model_add(a->model, ta->grad, tb->grad, (size_t)ta->numel);
    if (!st) st = cdp_model_copy(a->model, tb->grad, ta->grad, (size_t)ta->numel * sizeof(float));
    e->t_compute += cdp_time_ns() - t0;
    return st;
}

/* Decoding mode: the bytes of a chunk's rows in and out this step. */
static size_t dec_in_bytes(const struct exec *e, const struct chunk *c)
{
    return (size_t)cdp_infer_in_floats(c->inf, e->dec_n) * sizeof(float);
}

static size_t dec_out_bytes(const struct exec *e, const struct chunk *c)
{
    return (size_t)cdp_infer_out_floats(c->inf, e->dec_n) * sizeof(float);
}

/* Decoding mode's FORWARD: a step of the chunk's decoder on the new
 * positions, from the tokens (the first virtual stage), the chunk before on
 * this rank (zbv's turn) or the rows received; into the logits (the last
 * virtual stage) or the rows to send. */
static cdp_status dec_forward(struct exec *e, struct chunk *c)
{
    const void *from = c->vstage == 0 ? (const void *)e->dec_tokens
                       : c->local_prev >= 0 ? (const void *)e->ch[c->local_prev].dec_out
                                            : (const void *)c->dec_in;
    return cdp_infer_step(c->inf, from, e->dec_n, c->vstage == e->nv - 1 ? e->dec_logits : c->dec_out);
}

static cdp_status op_load(struct exec *e, const struct cdp_instr *in, struct chunk *c, uint64_t t0)
{
    (void)c;
    cdp_status st = e->dec ? CDP_OK : load(e, in->mb); /* decoding: the caller's tokens */
    e->t_compute += cdp_time_ns() - t0;
    e->t_fb += cdp_time_ns() - t0;
    trace_ev(e, CDP_EV_LOAD, in->mb, -1, t0, cdp_time_ns());
    return st;
}

static cdp_status op_recv_act(struct exec *e, const struct cdp_instr *in, struct chunk *c, uint64_t t0)
{
    cdp_status st = CDP_OK;
    int slot;
    if (e->dec) {
        st = recv_dev(e, c->dec_in, dec_in_bytes(e, c), in->peer, tag_of(TAG_ACT, c->vstage - 1, in->mb, e->m));
    } else {
        if ((st = acquire_slot(e, c, in->mb, &slot))) return st;
        st = recv_dev(e, cdp_model_input(c->model, slot), (size_t)c->in_bytes, in->peer,
                      tag_of(TAG_ACT, c->vstage - 1, in->mb, e->m));
    }
    e->t_idle += cdp_time_ns() - t0;
    trace_p2p(e, CDP_EV_RECV_ACT, in, (size_t)c->in_bytes, t0, cdp_time_ns());
    return st;
}

static cdp_status op_forward(struct exec *e, const struct cdp_instr *in, struct chunk *c, uint64_t t0)
{
    cdp_status st = CDP_OK;
    int slot;
    if (e->dec) {
        st = dec_forward(e, c);
        e->t_compute += cdp_time_ns() - t0;
        trace_ev(e, CDP_EV_FORWARD, in->mb, in->chunk, t0, cdp_time_ns());
        return st;
    }
    if ((st = acquire_slot(e, c, in->mb, &slot))) return st;
    if (c->local_prev >= 0 && (st = local_input(e, c, in->mb, slot))) return st;
    if (c->local_prev >= 0) fwd_release(e, &e->ch[c->local_prev], in->mb);
    if ((st = cdp_model_forward(c->model, slot))) return st;
    if (c->vstage == e->nv - 1) {
        double s = 0;
        /* validation sums the loss unscaled, in micro-batch order */
        st = cdp_model_loss(c->model, slot, (char *)e->tgt + in->mb * e->tgt_bytes, e->fwd ? 1.0f : e->scale, &s);
        if (e->fwd) e->fwd_sum += s;
        else e->loss_sum += s;
        fwd_release(e, c, in->mb);
    }
    if (!st) st = settle(e);
    if (!e->fwd) cdp_fault_slow_down(&e->fault, e->rank, t0);
    e->t_compute += cdp_time_ns() - t0;
    e->t_fb += cdp_time_ns() - t0;
    trace_ev(e, CDP_EV_FORWARD, in->mb, in->chunk, t0, cdp_time_ns());
    return st;
}

static cdp_status op_send_act(struct exec *e, const struct cdp_instr *in, struct chunk *c, uint64_t t0)
{
    if (e->dec) { /* decoding: the rows, complete before the next step writes them again (drain) */
        cdp_status st = send_dev(e, c->dec_out, dec_out_bytes(e, c), in->peer, tag_of(TAG_ACT, c->vstage, in->mb, e->m),
                                 &c->slot_send[0]);
        e->t_comm += cdp_time_ns() - t0;
        return st;
    }
    const int slot = c->mb_slot[in->mb];
    cdp_status st = send_dev(e, cdp_model_output(c->model, slot), (size_t)c->out_bytes, in->peer,
                  tag_of(TAG_ACT, c->vstage, in->mb, e->m), &c->slot_send[slot]);
    fwd_release(e, c, in->mb);
    e->t_comm += cdp_time_ns() - t0;
    trace_p2p(e, CDP_EV_SEND_ACT, in, (size_t)c->out_bytes, t0, cdp_time_ns());
    return st;
}

static cdp_status op_recv_grad(struct exec *e, const struct cdp_instr *in, struct chunk *c, uint64_t t0)
{
    cdp_status st = CDP_OK;
    uint64_t from = t0;
    if (c->grad_in_req && c->grad_in_mb != in->mb) {
        return cdp_fail(CDP_ERR_INTERNAL, "the gradient of micro-batch %d was posted early, not %d's", c->grad_in_mb,
                        in->mb);
    }
    if (c->grad_in_req) { /* posted early */
        from = c->grad_in_posted;
        st = cdp_comm_wait(c->grad_in_req, e->timeout);
        c->grad_in_req = NULL;
    } else {
        st = recv_dev(e, c->grad_in, (size_t)c->out_bytes, in->peer, tag_of(TAG_GRAD, c->vstage + 1, in->mb, e->m));
    }
    e->t_idle += cdp_time_ns() - t0;
    trace_p2p(e, CDP_EV_RECV_GRAD, in, (size_t)c->out_bytes, from, cdp_time_ns());
    return st;
}

static cdp_status op_backward(struct exec *e, const struct cdp_instr *in, struct chunk *c, uint64_t t0)
{
    (void)t0;
    cdp_status st = CDP_OK;
    int slot;
    float *din = NULL;
    int wslot = -1;
    const int split = in->op == CDP_OP_BACKWARD_INPUT;
    slot = c->mb_slot[in->mb];
    if (slot < 0) {
        return cdp_fail(CDP_ERR_INTERNAL, "backward of micro-batch %d that was never forwarded", in->mb);
    }
    if (split && (st = acquire_wslot(c, in->mb, &wslot))) return st;
    if (c->vstage > 0 && !c->in_tokens) {
        int g = c->next_grad_out;
        c->next_grad_out = (g + 1) % c->n_grad_out;
        if ((st = wait_req(e, &c->grad_out_req[g]))) return st;
        din = c->grad_out[g];
        if ((st = cdp_model_zero(c->model, din, (size_t)c->in_bytes))) return st;
        c->mb_grad_out[in->mb] = g;
    }
    uint64_t tb = cdp_time_ns(), r0 = e->t_reduce;
    if (!split) cdp_exec_buckets_before_backward(e, c); /* the last one starts the gradient buckets */
    const float *dout = c->vstage == e->nv - 1 ? NULL : c->grad_in;
    st = split ? cdp_model_backward_input(c->model, slot, wslot, dout, din)
               : cdp_model_backward(c->model, slot, dout, din);
    /* zbv's turn: the previous virtual stage is a chunk of this rank */
    if (!st && din && c->local_prev >= 0) st = local_grad(e, c, din);
    if (!st) st = settle(e);
    cdp_fault_slow_down(&e->fault, e->rank, tb);
    if (!split) { /* a split backward's activations stay until its W */
        c->slot_mb[slot] = -1;
        c->mb_slot[in->mb] = -1;
    }
    uint64_t t1 = cdp_time_ns(), reduced = e->t_reduce - r0; /* ZeRO-2's reductions inside */
    e->t_compute += t1 - tb - reduced;
    e->t_comm += reduced;
    e->t_fb += t1 - tb;
    e->fb_end = t1;
    trace_ev(e, split ? CDP_EV_BACKWARD_INPUT : CDP_EV_BACKWARD, in->mb, in->chunk, tb, t1);
    if (!st) st = post_next_grad(e, c, in);
    return st;
}

static cdp_status op_backward_weight(struct exec *e, const struct cdp_instr *in, struct chunk *c, uint64_t t0)
{
    (void)t0;
    cdp_status st = CDP_OK;
    int slot;
    slot = c->mb_slot[in->mb];
    const int wslot = c->mb_wslot[in->mb];
    if (slot < 0 || wslot < 0) {
        return cdp_fail(CDP_ERR_INTERNAL, "weight gradient of micro-batch %d without its input gradient", in->mb);
    }
    uint64_t tb = cdp_time_ns(), r0 = e->t_reduce;
    cdp_exec_buckets_before_backward(e, c); /* the last W starts the gradient buckets */
    st = cdp_model_backward_weight(c->model, slot, wslot);
    if (!st) st = settle(e);
    cdp_fault_slow_down(&e->fault, e->rank, tb);
    c->slot_mb[slot] = -1;
    c->mb_slot[in->mb] = -1;
    c->wslot_mb[wslot] = -1;
    c->mb_wslot[in->mb] = -1;
    uint64_t t1 = cdp_time_ns(), reduced = e->t_reduce - r0;
    e->t_compute += t1 - tb - reduced;
    e->t_comm += reduced;
    e->t_fb += t1 - tb;
    e->fb_end = t1;
    trace_ev(e, CDP_EV_BACKWARD_WEIGHT, in->mb, in->chunk, tb, t1);
    return st;
}

static cdp_status op_send_grad(struct exec *e, const struct cdp_instr *in, struct chunk *c, uint64_t t0)
{
    cdp_status st = CDP_OK;
    int g = c->mb_grad_out[in->mb];
    st = send_dev(e, c->grad_out[g], (size_t)c->in_bytes, in->peer, tag_of(TAG_GRAD, c->vstage, in->mb, e->m),
                  &c->grad_out_req[g]);
    e->t_comm += cdp_time_ns() - t0;
    trace_p2p(e, CDP_EV_SEND_GRAD, in, (size_t)c->in_bytes, t0, cdp_time_ns());
    return st;
}

static cdp_status op_reduce_tied_grads(struct exec *e, const struct cdp_instr *in, struct chunk *c, uint64_t t0)
{
    (void)in;
    (void)c;
    cdp_status st = CDP_OK;
    if (!e->tied) return st;
    struct chunk *tc = e->s == 0 ? &e->ch[0] : &e->ch[e->v - 1];
    struct cdp_model_tensor *t = cdp_model_tied_tensor(tc->model);
    if (t) {
        const uint64_t ta = cdp_time_ns();
        st = cdp_comm_allreduce_f32(e->tied, t->grad, (size_t)t->numel, CDP_REDUCE_SUM, e->timeout);
        trace_coll(e, CDP_EV_TIED_REDUCE, ev_chunk(e, (int)(tc - e->ch)), CDP_EV_GROUP_TIED, (size_t)t->numel, ta,
                   cdp_time_ns());
    }
    e->t_comm += cdp_time_ns() - t0;
    return st;
}

static cdp_status op_allreduce_grads(struct exec *e, const struct cdp_instr *in, struct chunk *c, uint64_t t0)
{
    (void)in;
    (void)c;
    cdp_status st = CDP_OK;
    /* zbv: the embedding and the head tied to it are chunks of this rank,
     * summed here, where two ranks would run REDUCE_TIED_GRADS */
    if (e->tied_local) st = sum_tied_locally(e);
    if (!st && cdp_exec_buckets_on(e)) { /* what the backward has not started, then every bucket done */
        st = cdp_exec_buckets_finish(e);
        e->t_comm += cdp_time_ns() - t0;
        return st;
    }
    for (int k = 0; k < e->v && !st && e->R > 1; k++) {
        struct cdp_model *mdl = e->ch[k].model;
        if (cdp_model_tensor_count(mdl) == 0) continue;
        if (e->zero >= 2) { /* ZeRO-2: the rest was reduced after each backward */
            st = cdp_model_reduce_tied_grads(mdl);
            continue;
        }
        float *g = cdp_model_tensor(mdl, 0)->grad;
        const size_t n = (size_t)cdp_model_param_floats(mdl);
        const uint64_t ta = cdp_time_ns();
        st = e->zero ? reduce_window(e, g, n, 0, n)
                     : cdp_comm_allreduce_wire(e->dp, g, n, CDP_REDUCE_SUM, e->wire_dp, e->timeout);
        trace_coll(e, e->zero ? CDP_EV_REDUCE_SCATTER : CDP_EV_ALLREDUCE, k, CDP_EV_GROUP_REPLICAS, n, ta,
                   cdp_time_ns());
    }
    e->t_comm += cdp_time_ns() - t0;
    return st;
}

static cdp_status op_optimizer_step(struct exec *e, const struct cdp_instr *in, struct chunk *c, uint64_t t0)
{
    (void)in;
    (void)c;
    cdp_status st = CDP_OK;
    /* The global gradient norm: every stored tensor once; the last stage's
     * copy of a tied embedding is the first stage's tensor. */
    double sq = 0, split = 0;
    for (int k = 0; k < e->v && !st; k++) {
        double x = 0, y = 0;
        st = chunk_sumsq(&e->ch[k], &x, &y);
        sq += x;
        split += y;
    }
    if (st) return st;
    uint64_t tc = cdp_time_ns();
    e->t_compute += tc - t0;
    /* tensor groups: the slices' parts summed over the group, the replicated tensors counted once */
    if (e->tpc) st = cdp_comm_allreduce_f64(cdp_comm_host(e->tpc), &split, 1, CDP_REDUCE_SUM, e->timeout);
    sq += split;
    /* ZeRO-1: each replica holds its shard's part of the sum */
    if (!st && e->zero) st = cdp_comm_allreduce_f64(cdp_comm_host(e->dp), &sq, 1, CDP_REDUCE_SUM, e->timeout);
    if (!st && e->p > 1) st = cdp_comm_allreduce_f64(cdp_comm_host(e->pipe), &sq, 1, CDP_REDUCE_SUM, e->timeout);
    e->t_comm += cdp_time_ns() - tc;
    if (st) return st;
    double norm = sqrt(sq), clip_at = e->plan->train.grad_clip;
    e->grad_norm = norm;
    float clip = cdp_grad_clip_scale(norm, clip_at); /* torch's min(1, clip / (norm + 1e-6)) */
    if (!isfinite(norm)) {
        st = cdp_fail(CDP_ERR_INVALID, "the gradient norm is %g; lower /train/optimizer/lr or set "
                      "/train/grad_clip", norm);
        return st;
    }
    uint64_t to = cdp_time_ns();
    for (int k = 0; k < e->v; k++)
        cdp_optimizer_step(e->ch[k].opt, e->ch[k].model, (float)e->lr, clip);
    for (int k = 0; k < e->v && !st; k++) st = cdp_model_error(e->ch[k].model);
    /* a step ends when its update has: step times are whole */
    if (!st && !e->hv) st = cdp_device_synchronize(e->dev);
    e->t_compute += cdp_time_ns() - to;
    trace_ev(e, CDP_EV_OPTIMIZER, -1, -1, to, cdp_time_ns());
    /* ZeRO-1: every replica's updated shard to all */
    const uint64_t tg = cdp_time_ns();
    for (int k = 0; k < e->v && !st && e->zero; k++) {
        struct cdp_model *mdl = e->ch[k].model;
        if (!cdp_model_tensor_count(mdl)) continue;
        const uint64_t ta = cdp_time_ns();
        st = cdp_comm_allgather_f32(e->dp, cdp_model_tensor(mdl, 0)->data, (size_t)cdp_model_param_floats(mdl),
                                    e->timeout);
        trace_coll(e, CDP_EV_ALLGATHER, k, CDP_EV_GROUP_REPLICAS, (size_t)cdp_model_param_floats(mdl), ta,
                   cdp_time_ns());
    }
    if (e->zero) e->t_comm += cdp_time_ns() - tg;
    return st;
}

/* One function per instruction, by enum value: the table check fails to compile when an
 * instruction is added without its entry. */
typedef cdp_status (*op_fn)(struct exec *e, const struct cdp_instr *in, struct chunk *c, uint64_t t0);
static const op_fn op_table[] = {
    [CDP_OP_LOAD] = op_load,
    [CDP_OP_FORWARD] = op_forward,
    [CDP_OP_SEND_ACT] = op_send_act,
    [CDP_OP_RECV_ACT] = op_recv_act,
    [CDP_OP_BACKWARD] = op_backward,
    [CDP_OP_SEND_GRAD] = op_send_grad,
    [CDP_OP_RECV_GRAD] = op_recv_grad,
    [CDP_OP_BACKWARD_INPUT] = op_backward,
    [CDP_OP_BACKWARD_WEIGHT] = op_backward_weight,
    [CDP_OP_REDUCE_TIED_GRADS] = op_reduce_tied_grads,
    [CDP_OP_ALLREDUCE_GRADS] = op_allreduce_grads,
    [CDP_OP_OPTIMIZER_STEP] = op_optimizer_step,
};
CDP_TABLE_CHECK(op_table, CDP_OP_COUNT);

static cdp_status execute(struct exec *e, const struct cdp_instr *in)
{
    struct chunk *c = in->chunk >= 0 ? &e->ch[in->chunk] : NULL;
    const uint64_t t0 = cdp_time_ns();
    set_where(e, in);
    if ((unsigned)in->op >= CDP_OP_COUNT) return cdp_fail(CDP_ERR_INTERNAL, "unknown instruction %d", (int)in->op);
    return op_table[in->op](e, in, c, t0);
}

/* A run of point-to-point instructions as one batch (the schedule was built
 * so that such batches cannot deadlock): every transfer of the batch
 * completes before it returns, so no send buffer stays in flight. */
static cdp_status execute_group(struct exec *e, const struct cdp_instr *list, int n)
{
    struct cdp_comm_p2p ops[64];
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
            if (e->dec) {
                ops[i] = (struct cdp_comm_p2p){1, in->peer, c->dec_out, dec_out_bytes(e, c)};
                break;
            }
            slot = c->mb_slot[in->mb];
            ops[i] = (struct cdp_comm_p2p){1, in->peer, cdp_model_output(c->model, slot), (size_t)c->out_bytes};
            break;
        case CDP_OP_RECV_ACT:
            if (e->dec) {
                ops[i] = (struct cdp_comm_p2p){0, in->peer, c->dec_in, dec_in_bytes(e, c)};
                break;
            }
            st = acquire_slot(e, c, in->mb, &slot);
            ops[i] = (struct cdp_comm_p2p){0, in->peer, st ? NULL : cdp_model_input(c->model, slot),
                                           (size_t)c->in_bytes};
            break;
        case CDP_OP_SEND_GRAD:
            ops[i] = (struct cdp_comm_p2p){1, in->peer, c->grad_out[c->mb_grad_out[in->mb]], (size_t)c->in_bytes};
            break;
        case CDP_OP_RECV_GRAD:
            for (int j = 0; j < i; j++)
                if (list[j].op == CDP_OP_RECV_GRAD && list[j].chunk == in->chunk)
                    st = cdp_fail(CDP_ERR_INTERNAL, "two gradients for chunk %d in one group", in->chunk);
            ops[i] = (struct cdp_comm_p2p){0, in->peer, c->grad_in, (size_t)c->out_bytes};
            break;
        case CDP_OP_LOAD:
        case CDP_OP_FORWARD:
        case CDP_OP_BACKWARD:
        case CDP_OP_BACKWARD_INPUT:
        case CDP_OP_BACKWARD_WEIGHT:
        case CDP_OP_REDUCE_TIED_GRADS:
        case CDP_OP_ALLREDUCE_GRADS:
        case CDP_OP_OPTIMIZER_STEP:
        case CDP_OP_COUNT:
            st = cdp_fail(CDP_ERR_INTERNAL, "%s in a point-to-point group",
                          (unsigned)in->op < CDP_OP_COUNT ? op_names[in->op] : "?");
            break;
        }
    }
    if (!st) st = cdp_comm_group(e->pipe, ops, n, e->timeout);
    const uint64_t t1 = cdp_time_ns();
    e->t_idle += t1 - t0;
    /* one group: each of its transfers spans the group's time */
    static const enum cdp_event_kind kind_of[CDP_OP_COUNT] = {
        [CDP_OP_SEND_ACT] = CDP_EV_SEND_ACT, [CDP_OP_RECV_ACT] = CDP_EV_RECV_ACT,
        [CDP_OP_SEND_GRAD] = CDP_EV_SEND_GRAD, [CDP_OP_RECV_GRAD] = CDP_EV_RECV_GRAD};
    for (int i = 0; i < n && !st; i++) trace_p2p(e, kind_of[list[i].op], &list[i], ops[i].bytes, t0, t1);
    for (int i = 0; i < n && !st; i++)
        if (list[i].op == CDP_OP_SEND_ACT) fwd_release(e, &e->ch[list[i].chunk], list[i].mb);
    return st;
}

/* This rank's list for the step: instruction by instruction, or where the
 * pipeline batches its transfers, each run of transfers as one batch. */
cdp_status cdp_exec_run_list(struct exec *e)
{
    const struct cdp_instr *list = e->sched->list[e->s];
    const int n = e->sched->len[e->s];
    cdp_status st = CDP_OK;
    const int forward_only = e->fwd || e->dec; /* a forward-only list reduces nothing */
    if (!forward_only) cdp_exec_buckets_start_step(e);
    const int buckets = !forward_only && cdp_exec_buckets_on(e);
    for (int i = 0; i < n && !st;) {
        int end = cdp_comm_p2p_grouped(e->pipe) ? cdp_schedule_p2p_group_end(e->sched, e->s, i) : i;
        if (end > i) {
            st = execute_group(e, list + i, end - i);
            i = end;
        } else {
            st = execute(e, &list[i++]);
        }
        /* gradient buckets in flight move on (MPI moves data inside its calls) */
        if (!st && buckets) st = cdp_exec_buckets_progress(e);
    }
    return st;
}

/* Every in-flight send of this rank completes before the buffers change owner. */
cdp_status cdp_exec_drain_sends(struct exec *e)
{
    cdp_status st = CDP_OK;
    for (int k = 0; k < e->v && !st; k++) {
        struct chunk *c = &e->ch[k];
        for (int i = 0; i < c->nslots && !st; i++) st = wait_req(e, &c->slot_send[i]);
        for (int i = 0; i < c->n_grad_out && !st; i++) st = wait_req(e, &c->grad_out_req[i]);
    }
    return st;
}
