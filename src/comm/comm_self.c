/* The `self` communicator: one rank, no MPI. Collectives are no-ops; sends to
 * self are matched in memory against receives of the same tag, in posting
 * order, and the bytes are copied once, when the pair meets (a send to self
 * therefore completes only when its receive is posted, as a large MPI message
 * would). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "comm/comm_backend.h"

struct self_req {
    struct cdp_request *r;
    struct self_req *next; /* in the unmatched queue of its kind */
    int queued;
    int done;
    cdp_status st;
    char msg[160];
};

struct self_state {
    struct self_req *sends, *recvs; /* unmatched, oldest first */
};

static void enqueue(struct self_req **head, struct self_req *q)
{
    while (*head) head = &(*head)->next;
    q->next = NULL;
    q->queued = 1;
    *head = q;
}

static void unlink_req(struct self_req **head, struct self_req *q)
{
    for (; *head; head = &(*head)->next)
        if (*head == q) {
            *head = q->next;
            q->next = NULL;
            q->queued = 0;
            return;
        }
}

/* The oldest unmatched request of a queue with this tag, unlinked; or NULL. */
static struct self_req *take(struct self_req **head, int tag)
{
    for (struct self_req *q = *head; q; q = q->next)
        if (q->r->tag == tag) {
            unlink_req(head, q);
            return q;
        }
    return NULL;
}

static void match(struct self_req *send, struct self_req *recv)
{
    send->done = recv->done = 1;
    if (send->r->bytes != recv->r->bytes) {
        recv->st = CDP_ERR_COMM;
        snprintf(recv->msg, sizeof recv->msg, "expected %zu bytes, the matching send has %zu",
                 recv->r->bytes, send->r->bytes);
        return;
    }
    if (recv->r->bytes) memcpy(recv->r->buf, send->r->buf, recv->r->bytes);
}

static cdp_status self_post(struct cdp_comm *c, struct cdp_request *r)
{
    struct self_state *s = c->impl;
    struct self_req *q = calloc(1, sizeof *q);
    if (!q) return cdp_fail(CDP_ERR_NOMEM, "out of memory for a request");
    q->r = r;
    r->impl = q;
    struct self_req *other = take(r->is_send ? &s->recvs : &s->sends, r->tag);
    if (other)
        match(r->is_send ? q : other, r->is_send ? other : q);
    else
        enqueue(r->is_send ? &s->sends : &s->recvs, q);
    return CDP_OK;
}

static cdp_status self_test(struct cdp_request *r, int *done)
{
    struct self_req *q = r->impl;
    *done = q->done;
    if (q->done && q->st) return cdp_fail(q->st, "%s", q->msg);
    return CDP_OK;
}

static void self_release(struct cdp_request *r)
{
    struct self_req *q = r->impl;
    if (!q) return;
    if (q->queued) {
        struct self_state *s = r->comm->impl;
        unlink_req(r->is_send ? &s->sends : &s->recvs, q);
    }
    free(q);
    r->impl = NULL;
}

static cdp_status self_split(struct cdp_comm *c, int color, int key, struct cdp_comm **out)
{
    (void)c;
    (void)key;
    if (color < 0) {
        *out = NULL;
        return CDP_OK;
    }
    return cdp_comm_self_create(out);
}

static cdp_status self_allreduce(struct cdp_comm *c, void *buf, size_t n, enum cdp_comm_dtype dt,
                                 enum cdp_reduce_op op, double timeout_s)
{
    /* one rank: the sum, the average (over 1) and the max are the input */
    (void)c, (void)buf, (void)n, (void)dt, (void)op, (void)timeout_s;
    return CDP_OK;
}

static cdp_status self_reduce_scatter(struct cdp_comm *c, float *buf, size_t n, size_t from, size_t count,
                                      enum cdp_reduce_op op, double timeout_s)
{
    /* one rank, one shard (the whole buffer): the reduction is the input */
    (void)c, (void)buf, (void)n, (void)from, (void)count, (void)op, (void)timeout_s;
    return CDP_OK;
}

static cdp_status self_allgather(struct cdp_comm *c, float *buf, size_t n, double timeout_s)
{
    /* one rank: its shard is the whole buffer */
    (void)c, (void)buf, (void)n, (void)timeout_s;
    return CDP_OK;
}

static cdp_status self_barrier(struct cdp_comm *c, double timeout_s)
{
    (void)c, (void)timeout_s;
    return CDP_OK;
}

static cdp_status self_gather(struct cdp_comm *c, const void *buf, size_t bytes, void **out,
                              size_t **lens, double timeout_s)
{
    (void)c, (void)timeout_s;
    void *o = malloc(bytes ? bytes : 1);
    size_t *l = malloc(sizeof *l);
    if (!o || !l) {
        free(o);
        free(l);
        return cdp_fail(CDP_ERR_NOMEM, "out of memory for %zu bytes", bytes);
    }
    if (bytes) memcpy(o, buf, bytes);
    l[0] = bytes;
    *out = o;
    *lens = l;
    return CDP_OK;
}

static cdp_status self_bcast(struct cdp_comm *c, void *buf, size_t bytes, int root, double timeout_s)
{
    /* one rank: the root's bytes are already in place */
    (void)c, (void)buf, (void)bytes, (void)root, (void)timeout_s;
    return CDP_OK;
}

/* The one place the library ends the process, because the caller asked to.
 * Inside a running MPI job the job is the MPI world, so it aborts that. */
static void self_abort(struct cdp_comm *c, int code)
{
    (void)c;
#if CDP_HAVE_MPI
    if (cdp_comm_mpi_active()) cdp_comm_mpi_abort_world(code);
#endif
    fflush(stdout);
    fflush(stderr);
    exit(code);
}

static void self_free(struct cdp_comm *c)
{
    struct self_state *s = c->impl;
    CDP_ASSERT(!s->sends && !s->recvs);
    free(s);
}

const struct cdp_comm_ops cdp_comm_self_ops = {
    .name = "self",
    .memory = CDP_COMM_HOST_MEMORY,
    .split = self_split,
    .allreduce = self_allreduce,
    .reduce_scatter_f32 = self_reduce_scatter,
    .allgather_f32 = self_allgather,
    .isend = self_post,
    .irecv = self_post,
    .test = self_test,
    .release = self_release,
    .barrier = self_barrier,
    .gather_bytes = self_gather,
    .bcast_bytes = self_bcast,
    .abort = self_abort,
    .free = self_free,
};

cdp_status cdp_comm_self_create(struct cdp_comm **out)
{
    struct self_state *s = calloc(1, sizeof *s);
    struct cdp_comm *c = s ? cdp_comm_alloc(&cdp_comm_self_ops, 0, 1, s) : NULL;
    if (!c) {
        free(s);
        return cdp_fail(CDP_ERR_NOMEM, "self: out of memory for a communicator");
    }
    *out = c;
    return CDP_OK;
}
