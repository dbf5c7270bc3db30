/* The host-staging adapter: a communicator on a device's memory over a host
 * communicator, for ranks whose device the host cannot read and that do not
 * use NCCL (ranks sharing one GPU). Each operation copies its device buffer
 * into host memory of its own, runs on the inner communicator, and copies the
 * result back when it completes. The front (comm.c) has checked every
 * argument and writes every message; the inner backend's own messages say
 * what failed underneath. Also: which communicator carries a device's memory
 * (cdp_comm_for_device), the one place that chooses a transport. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "comm/comm_backend.h"
#include "comm/nccl.h"

struct staged {
    struct cdp_comm *inner; /* owned */
    cdp_device_t dev;       /* not owned */
};

/* One operation: the inner request over the host copy. */
struct staged_req {
    struct cdp_request in;
    void *host;
};

static size_t esize(enum cdp_comm_dtype dt) { return dt == CDP_COMM_F32 ? 4 : 8; }

static cdp_status staged_wrap(struct cdp_comm *inner, cdp_device_t dev, struct cdp_comm **out)
{
    struct staged *s = calloc(1, sizeof *s);
    struct cdp_comm *c = s ? cdp_comm_alloc(&cdp_comm_staged_ops, inner->rank, inner->size, s) : NULL;
    if (!c) {
        free(s);
        cdp_comm_free(inner);
        return cdp_fail(CDP_ERR_NOMEM, "out of memory for a communicator");
    }
    s->inner = inner;
    s->dev = dev;
    /* messages name the communicator the bytes travel on */
    snprintf(c->name, sizeof c->name, "%s", inner->name);
    c->host = inner;
    *out = c;
    return CDP_OK;
}

cdp_status cdp_comm_staged(cdp_comm_t inner, cdp_device_t dev, cdp_comm_t *out)
{
    if (!inner || !dev || !out) {
        cdp_comm_free(inner);
        return cdp_fail(CDP_ERR_INVALID, "cdp_comm_staged: NULL communicator, device or out");
    }
    if (inner->ops->memory != CDP_COMM_HOST_MEMORY) {
        cdp_status st = cdp_fail(CDP_ERR_INVALID, "cdp_comm_staged: %s does not take host memory", inner->name);
        cdp_comm_free(inner);
        return st;
    }
    return staged_wrap(inner, dev, out);
}

static cdp_status staged_split(struct cdp_comm *c, int color, int key, struct cdp_comm **out)
{
    struct staged *s = c->impl;
    struct cdp_comm *n = NULL;
    cdp_status st = s->inner->ops->split(s->inner, color, key, &n);
    if (st || !n) {
        *out = NULL;
        return st;
    }
    return staged_wrap(n, s->dev, out);
}

/* The host copy of r's bytes: read from the device for what the inner
 * operation sends or reduces (everything but a receive). */
static cdp_status stage_in(struct staged *s, struct cdp_request *r, struct staged_req **out)
{
    struct staged_req *q = calloc(1, sizeof *q);
    size_t bytes = r->kind == CDP_REQ_P2P ? r->bytes : r->count * esize(r->dt);
    if (q) q->host = malloc(bytes ? bytes : 1);
    if (!q || !q->host) {
        if (q) free(q->host);
        free(q);
        return cdp_fail(CDP_ERR_NOMEM, "out of host memory staging %zu bytes", bytes);
    }
    cdp_status st = CDP_OK;
    if ((r->kind != CDP_REQ_P2P || r->is_send) && bytes) st = cdp_device_read(s->dev, q->host, r->buf, bytes);
    if (st) {
        free(q->host);
        free(q);
        return cdp_error_context(st, "staging through the host");
    }
    q->in = *r;
    q->in.comm = s->inner;
    q->in.buf = q->host;
    q->in.impl = NULL;
    *out = q;
    return CDP_OK;
}

static void stage_free(struct staged_req *q)
{
    if (!q) return;
    if (q->in.impl) q->in.comm->ops->release(&q->in);
    free(q->host);
    free(q);
}

/* The result back in device memory: a receive's bytes, a reduction's (only
 * this rank's part of a reduce-scatter: the rest is unspecified), the
 * gathered buffer. */
static cdp_status stage_out(struct staged *s, struct cdp_request *r, struct staged_req *q)
{
    struct cdp_comm *c = r->comm;
    switch (r->kind) {
    case CDP_REQ_P2P:
        return r->is_send || !r->bytes ? CDP_OK : cdp_device_write(s->dev, r->buf, q->host, r->bytes);
    case CDP_REQ_REDUCE_SCATTER: {
        uint64_t at, len;
        cdp_shard_in_window(r->n, c->size, c->rank, r->from, r->count, &at, &len);
        return len ? cdp_device_write(s->dev, (float *)r->buf + at, (float *)q->host + at, len * sizeof(float))
                   : CDP_OK;
    }
    case CDP_REQ_ALLREDUCE:
    case CDP_REQ_ALLGATHER:
        return cdp_device_write(s->dev, r->buf, q->host, r->count * esize(r->dt));
    }
    return CDP_OK;
}

static cdp_status staged_post(struct cdp_comm *c, struct cdp_request *r)
{
    struct staged *s = c->impl;
    struct staged_req *q = NULL;
    cdp_status st = stage_in(s, r, &q);
    if (st) return st;
    struct cdp_comm *in = s->inner;
    if (r->kind == CDP_REQ_P2P) {
        st = r->is_send ? in->ops->isend(in, &q->in) : in->ops->irecv(in, &q->in);
    } else if (in->ops->icoll) {
        st = in->ops->icoll(in, &q->in);
    } else { /* an inner communicator with blocking collectives only (self) */
        switch (r->kind) {
        case CDP_REQ_ALLREDUCE: st = in->ops->allreduce(in, q->host, r->n, r->dt, r->op, 0); break;
        case CDP_REQ_REDUCE_SCATTER:
            st = in->ops->reduce_scatter_f32(in, q->host, r->n, r->from, r->count, r->op, 0);
            break;
        default: st = in->ops->allgather_f32(in, q->host, r->n, 0); break;
        }
        q->in.done = 1;
    }
    if (st) {
        q->in.impl = NULL; /* a failed post left nothing to release */
        stage_free(q);
        return st;
    }
    r->impl = q;
    return CDP_OK;
}

static cdp_status staged_test(struct cdp_request *r, int *done)
{
    struct staged_req *q = r->impl;
    struct staged *s = r->comm->impl;
    cdp_status st = CDP_OK;
    *done = q->in.done;
    if (!*done) st = q->in.comm->ops->test(&q->in, done);
    if (st || !*done) return st;
    q->in.done = 1;
    return stage_out(s, r, q);
}

/* An incomplete request: the inner backend decides (a receive cancelled, a
 * collective leaves the inner communicator unusable); the host copy is left
 * behind, since MPI may still read or write it. */
static void staged_release(struct cdp_request *r)
{
    struct staged_req *q = r->impl;
    if (!q) return;
    if (!q->in.done && q->in.impl) {
        q->in.comm->ops->release(&q->in);
        free(q);
    } else {
        stage_free(q);
    }
    r->impl = NULL;
}

static cdp_status staged_barrier(struct cdp_comm *c, double timeout_s)
{
    struct staged *s = c->impl;
    return s->inner->ops->barrier(s->inner, timeout_s);
}

static void staged_abort(struct cdp_comm *c, int code)
{
    struct staged *s = c->impl;
    s->inner->ops->abort(s->inner, code);
}

static void staged_free(struct cdp_comm *c)
{
    struct staged *s = c->impl;
    cdp_comm_free(s->inner);
    free(s);
}

const struct cdp_comm_ops cdp_comm_staged_ops = {
    .name = "staged",
    .memory = CDP_COMM_DEVICE_MEMORY,
    .split = staged_split,
    .icoll = staged_post,
    .isend = staged_post,
    .irecv = staged_post,
    .test = staged_test,
    .release = staged_release,
    .barrier = staged_barrier,
    .abort = staged_abort,
    .free = staged_free,
};

/* ---- which communicator carries a device's memory -------------------------------- */

cdp_status cdp_comm_for_device(cdp_comm_t host_world, cdp_device_t dev, int shared_gpu, double timeout_s,
                               cdp_comm_t *out, char *why, size_t why_len)
{
    if (!host_world || !dev || !out) return cdp_fail(CDP_ERR_INVALID, "cdp_comm_for_device: NULL argument");
    char none[1];
    if (!why || !why_len) why = none, why_len = sizeof none;
    cdp_status st;
    struct cdp_comm *dup = NULL;
    const int rank = cdp_comm_rank(host_world);
    if (cdp_backend_host_visible(cdp_device_backend_of(dev))) {
        snprintf(why, why_len, "%s on host memory", host_world->name);
        return cdp_comm_split(host_world, 0, rank, out);
    }
    /* every rank makes the same choice: NCCL only when no two ranks share a
     * GPU and this rank can use it (the world's own agreement then checks
     * that every rank can) */
    if (!shared_gpu && cdp_nccl_available() == CDP_OK) {
        snprintf(why, why_len, "nccl, one GPU per rank");
        return cdp_nccl_world(host_world, dev, timeout_s, out);
    }
    snprintf(why, why_len, "device memory travels through the host communicator (%s)",
             shared_gpu ? "ranks share a GPU" : cdp_last_error());
    if ((st = cdp_comm_split(host_world, 0, rank, &dup))) return st;
    return cdp_comm_staged(dup, dev, out);
}
