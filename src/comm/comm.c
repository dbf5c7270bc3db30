/* The communicator front: picks the backend (self or mpi), checks every
 * argument once for all backends, keeps the request bookkeeping, and runs the
 * deadline loop that every wait goes through. Messages name the backend, the
 * rank, the operation and its peer, so a hung pipeline says who waits on what. */
#include "comm/comm.h"

#include <errno.h>
#include <signal.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "comm/comm_backend.h"

/* ---- deadlines ------------------------------------------------------------- */

/* How a wait polls: spin this long first (a pipeline peer that is ready answers
 * within microseconds), then sleep with pauses doubling up to the cap. The
 * defaults come from bench/comm.c ("late reply"): on these VMs a wake-up costs
 * ~100 us on top of the pause, and a 1 ms cap added 400-600 us to a reply
 * that came 5-20 ms late (2-5% CPU), a 250 us cap 170-270 us (6-9% CPU).
 * CDP_COMM_SPIN_US and CDP_COMM_SLEEP_MAX_US override them (for measuring,
 * not for tuning jobs). */
static uint64_t poll_spin_ns = 50000;
static uint64_t poll_sleep_max_ns = 250000;
static pthread_once_t poll_once = PTHREAD_ONCE_INIT;

static void poll_config(void)
{
    const char *v;
    if ((v = getenv("CDP_COMM_SPIN_US")) && *v) poll_spin_ns = strtoull(v, NULL, 10) * 1000u;
    if ((v = getenv("CDP_COMM_SLEEP_MAX_US")) && *v) {
        uint64_t us = strtoull(v, NULL, 10);
        poll_sleep_max_ns = (us ? us : 1) * 1000u;
    }
}

/* 1 while this process waits in cdp_comm_poll (cdp_comm_waiting). */
static volatile sig_atomic_t in_wait;

int cdp_comm_waiting(void) { return in_wait; }

static cdp_status poll_loop(cdp_comm_test_fn test, void *arg, uint64_t t0, double timeout_s, size_t bytes,
                            double spin_gbps);

cdp_status cdp_comm_poll(cdp_comm_test_fn test, void *arg, uint64_t t0, double timeout_s,
                         size_t bytes, double spin_gbps)
{
    in_wait = 1;
    const cdp_status st = poll_loop(test, arg, t0, timeout_s, bytes, spin_gbps);
    /* a wait that failed (its deadline, a peer gone) ends the run: the rank was waiting */
    if (!st) in_wait = 0;
    return st;
}

static cdp_status poll_loop(cdp_comm_test_fn test, void *arg, uint64_t t0, double timeout_s, size_t bytes,
                            double spin_gbps)
{
    pthread_once(&poll_once, poll_config);
    uint64_t spin_ns = poll_spin_ns;
    if (bytes && spin_gbps > 0) spin_ns += (uint64_t)((double)bytes / spin_gbps);
    /* a deadline beyond ~30 years is no deadline */
    uint64_t limit = timeout_s > 0 && timeout_s < 1e9 ? (uint64_t)(timeout_s * 1e9) : UINT64_MAX;
    uint64_t start = cdp_time_ns();
    uint64_t pause = 1000;
    for (;;) {
        int done = 0;
        cdp_status st = test(arg, &done);
        if (st) return st;
        if (done) return CDP_OK;
        uint64_t now = cdp_time_ns();
        uint64_t elapsed = now - t0;
        if (elapsed >= limit) return cdp_fail(CDP_ERR_COMM, "timed out after %g s", timeout_s);
        if (now - start < spin_ns) continue;
        uint64_t nap = pause;
        if (limit != UINT64_MAX && nap > limit - elapsed) nap = limit - elapsed;
        struct timespec ts = { (time_t)(nap / 1000000000u), (long)(nap % 1000000000u) };
        while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
        }
        if (pause < poll_sleep_max_ns) pause = pause * 2 < poll_sleep_max_ns ? pause * 2 : poll_sleep_max_ns;
    }
}

/* ---- handles ---------------------------------------------------------------- */

struct cdp_comm *cdp_comm_alloc(const struct cdp_comm_ops *ops, int rank, int size, void *impl)
{
    struct cdp_comm *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->ops = ops;
    c->rank = rank;
    c->size = size;
    c->refs = 1;
    c->impl = impl;
    return c;
}

int cdp_comm_have_mpi(void) { return CDP_HAVE_MPI; }

static int env_set(const char *name)
{
    const char *v = getenv(name);
    return v && *v;
}

int cdp_comm_launched_by_mpi(void)
{
    if (env_set("OMPI_COMM_WORLD_SIZE") || env_set("PMIX_RANK")) return 1;
    const char *v = getenv("PMI_SIZE");
    return v && atoi(v) > 1;
}

/* The world is one handle per process, shared by every caller (MPI can be
 * initialised once per process). */
static pthread_mutex_t world_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cdp_comm *world;

cdp_status cdp_comm_world(cdp_comm_t *out)
{
    if (!out) return cdp_fail(CDP_ERR_INVALID, "cdp_comm_world: out is NULL");
    if (!cdp_comm_launched_by_mpi()) return cdp_comm_self(out);
#if CDP_HAVE_MPI
    pthread_mutex_lock(&world_lock);
    if (world) {
        world->refs++;
        *out = world;
        pthread_mutex_unlock(&world_lock);
        return CDP_OK;
    }
    struct cdp_comm *c = NULL;
    cdp_status st = cdp_comm_mpi_world(&c);
    if (!st) world = c;
    pthread_mutex_unlock(&world_lock);
    if (st) return st;
    cdp_log_set_rank(c->rank, c->size);
    CDP_DEBUG(COMM, "mpi world: rank %d of %d", c->rank, c->size);
    *out = c;
    return CDP_OK;
#else
    CDP_DEBUG(COMM, "started by an MPI launcher, but this build has no MPI: one rank (self)");
    return cdp_comm_self(out);
#endif
}

cdp_status cdp_comm_self(cdp_comm_t *out)
{
    if (!out) return cdp_fail(CDP_ERR_INVALID, "cdp_comm_self: out is NULL");
    return cdp_comm_self_create(out);
}

const char *cdp_comm_name(cdp_comm_t c) { return c ? c->ops->name : "(null)"; }
int cdp_comm_rank(cdp_comm_t c) { return c ? c->rank : 0; }
int cdp_comm_size(cdp_comm_t c) { return c ? c->size : 0; }

void cdp_comm_free(cdp_comm_t c)
{
    if (!c) return;
    CDP_ASSERT(c->pending == 0 && "wait for (or test to completion) every request before freeing its communicator");
    if (c->is_world) {
        pthread_mutex_lock(&world_lock);
        int last = --c->refs == 0;
        if (last) world = NULL;
        pthread_mutex_unlock(&world_lock);
        if (!last) return;
    }
    c->ops->free(c);
    free(c);
}

/* ---- collectives ------------------------------------------------------------- */

static const char *const op_names[] = {
    [CDP_REDUCE_SUM] = "sum", [CDP_REDUCE_AVG] = "average", [CDP_REDUCE_MAX] = "max"
};
CDP_TABLE_CHECK(op_names, CDP_REDUCE_OP_COUNT);

cdp_status cdp_comm_split(cdp_comm_t c, int color, int key, cdp_comm_t *out)
{
    if (!c || !out) return cdp_fail(CDP_ERR_INVALID, "cdp_comm_split: NULL communicator or out");
    struct cdp_comm *n = NULL;
    cdp_status st = c->ops->split(c, color, key, &n);
    if (st)
        return cdp_error_context(st, "%s rank %d/%d: split (color %d, key %d)", c->ops->name,
                                 c->rank, c->size, color, key);
    *out = n;
    return CDP_OK;
}

static cdp_status allreduce(cdp_comm_t c, void *buf, size_t n, enum cdp_comm_dtype dt,
                            enum cdp_reduce_op op, double timeout_s)
{
    const char *what = dt == CDP_COMM_F32 ? "floats" : "doubles";
    if (!c) return cdp_fail(CDP_ERR_INVALID, "all-reduce: NULL communicator");
    if ((unsigned)op >= CDP_REDUCE_OP_COUNT)
        return cdp_fail(CDP_ERR_INVALID, "%s rank %d/%d: all-reduce: unknown reduce op %d",
                        c->ops->name, c->rank, c->size, (int)op);
    if (n > 0 && !buf)
        return cdp_fail(CDP_ERR_INVALID, "%s rank %d/%d: all-reduce of %zu %s: buffer is NULL",
                        c->ops->name, c->rank, c->size, n, what);
    if (n == 0) return CDP_OK;
    cdp_status st = c->ops->allreduce(c, buf, n, dt, op, timeout_s);
    if (st)
        return cdp_error_context(st, "%s rank %d/%d: all-reduce (%s) of %zu %s", c->ops->name,
                                 c->rank, c->size, op_names[op], n, what);
    return CDP_OK;
}

cdp_status cdp_comm_allreduce_f32(cdp_comm_t c, float *buf, size_t n, enum cdp_reduce_op op,
                                  double timeout_s)
{
    return allreduce(c, buf, n, CDP_COMM_F32, op, timeout_s);
}

cdp_status cdp_comm_allreduce_f64(cdp_comm_t c, double *buf, size_t n, enum cdp_reduce_op op,
                                  double timeout_s)
{
    return allreduce(c, buf, n, CDP_COMM_F64, op, timeout_s);
}

void cdp_comm_shard(size_t n, int R, int r, size_t *off, size_t *len)
{
    CDP_ASSERT(R >= 1 && r >= 0 && r < R && off && len);
    uint64_t o, l;
    cdp_shard((uint64_t)n, R, r, &o, &l); /* the rule's home, which the memory model reads too */
    *off = (size_t)o;
    *len = (size_t)l;
}

/* The checks the reduce-scatter and the all-gather share with the all-reduce;
 * CDP_OK with *skip = 1 for n == 0 (every rank passes the same n, so every
 * rank skips). */
static cdp_status shard_args(cdp_comm_t c, const char *what, const float *buf, size_t n, int *skip)
{
    *skip = 0;
    if (!c) return cdp_fail(CDP_ERR_INVALID, "%s: NULL communicator", what);
    if (n > 0 && !buf)
        return cdp_fail(CDP_ERR_INVALID, "%s rank %d/%d: %s of %zu floats: buffer is NULL", c->ops->name,
                        c->rank, c->size, what, n);
    *skip = n == 0;
    return CDP_OK;
}

cdp_status cdp_comm_reduce_scatter_window_f32(cdp_comm_t c, float *buf, size_t n, size_t from, size_t count,
                                              enum cdp_reduce_op op, double timeout_s)
{
    int skip = 0;
    cdp_status st = shard_args(c, "reduce-scatter", buf, count, &skip);
    if (st) return st;
    if ((unsigned)op >= CDP_REDUCE_OP_COUNT)
        return cdp_fail(CDP_ERR_INVALID, "%s rank %d/%d: reduce-scatter: unknown reduce op %d", c->ops->name,
                        c->rank, c->size, (int)op);
    if (from > n || count > n - from)
        return cdp_fail(CDP_ERR_INVALID, "%s rank %d/%d: reduce-scatter of floats [%zu, %zu) of a %zu-float buffer",
                        c->ops->name, c->rank, c->size, from, from + count, n);
    if (skip) return CDP_OK;
    if ((st = c->ops->reduce_scatter_f32(c, buf, n, from, count, op, timeout_s))) {
        if (from == 0 && count == n)
            return cdp_error_context(st, "%s rank %d/%d: reduce-scatter (%s) of %zu floats", c->ops->name, c->rank,
                                     c->size, op_names[op], n);
        return cdp_error_context(st, "%s rank %d/%d: reduce-scatter (%s) of floats [%zu, %zu) of %zu", c->ops->name,
                                 c->rank, c->size, op_names[op], from, from + count, n);
    }
    return CDP_OK;
}

cdp_status cdp_comm_reduce_scatter_f32(cdp_comm_t c, float *buf, size_t n, enum cdp_reduce_op op,
                                       double timeout_s)
{
    return cdp_comm_reduce_scatter_window_f32(c, buf, n, 0, n, op, timeout_s);
}

cdp_status cdp_comm_allgather_f32(cdp_comm_t c, float *buf, size_t n, double timeout_s)
{
    int skip = 0;
    cdp_status st = shard_args(c, "all-gather", buf, n, &skip);
    if (st || skip) return st;
    if ((st = c->ops->allgather_f32(c, buf, n, timeout_s)))
        return cdp_error_context(st, "%s rank %d/%d: all-gather of %zu floats", c->ops->name, c->rank, c->size,
                                 n);
    return CDP_OK;
}

cdp_status cdp_comm_barrier(cdp_comm_t c, double timeout_s)
{
    if (!c) return cdp_fail(CDP_ERR_INVALID, "barrier: NULL communicator");
    cdp_status st = c->ops->barrier(c, timeout_s);
    if (st) return cdp_error_context(st, "%s rank %d/%d: barrier", c->ops->name, c->rank, c->size);
    return CDP_OK;
}

cdp_status cdp_comm_gather_bytes(cdp_comm_t c, const void *buf, size_t bytes, void **out,
                                 size_t **lens, double timeout_s)
{
    if (!c || !out || !lens) return cdp_fail(CDP_ERR_INVALID, "gather: NULL communicator, out or lens");
    if (bytes > 0 && !buf)
        return cdp_fail(CDP_ERR_INVALID, "%s rank %d/%d: gather of %zu bytes: buffer is NULL",
                        c->ops->name, c->rank, c->size, bytes);
    void *o = NULL;
    size_t *l = NULL;
    cdp_status st = c->ops->gather_bytes(c, buf, bytes, &o, &l, timeout_s);
    if (st)
        return cdp_error_context(st, "%s rank %d/%d: gather of %zu bytes to rank 0", c->ops->name,
                                 c->rank, c->size, bytes);
    *out = o;
    *lens = l;
    return CDP_OK;
}

cdp_status cdp_comm_bcast_bytes(cdp_comm_t c, void *buf, size_t bytes, int root, double timeout_s)
{
    if (!c) return cdp_fail(CDP_ERR_INVALID, "broadcast: NULL communicator");
    if (root < 0 || root >= c->size)
        return cdp_fail(CDP_ERR_INVALID, "%s rank %d/%d: broadcast from rank %d: no such rank (0..%d)",
                        c->ops->name, c->rank, c->size, root, c->size - 1);
    if (bytes > 0 && !buf)
        return cdp_fail(CDP_ERR_INVALID, "%s rank %d/%d: broadcast of %zu bytes: buffer is NULL",
                        c->ops->name, c->rank, c->size, bytes);
    cdp_status st = c->ops->bcast_bytes(c, buf, bytes, root, timeout_s);
    if (st)
        return cdp_error_context(st, "%s rank %d/%d: broadcast of %zu bytes from rank %d", c->ops->name,
                                 c->rank, c->size, bytes, root);
    return CDP_OK;
}

void cdp_comm_abort(cdp_comm_t c, int code)
{
    fflush(stdout);
    fflush(stderr);
    if (c) c->ops->abort(c, code);
    /* no communicator, or a backend that returned: the self behaviour */
    cdp_comm_self_ops.abort(NULL, code);
    exit(code);
}

/* ---- point to point -------------------------------------------------------------- */

static cdp_status post(cdp_comm_t c, int is_send, void *buf, size_t bytes, int peer, int tag,
                       cdp_request_t *req)
{
    const char *verb = is_send ? "send to" : "receive from";
    if (!c || !req) return cdp_fail(CDP_ERR_INVALID, "%s: NULL communicator or request", is_send ? "isend" : "irecv");
    if (peer < 0 || peer >= c->size)
        return cdp_fail(CDP_ERR_INVALID, "%s rank %d/%d: %s rank %d: no such rank (0..%d)",
                        c->ops->name, c->rank, c->size, verb, peer, c->size - 1);
    if (tag < 0 || tag >= CDP_COMM_TAG_LIMIT)
        return cdp_fail(CDP_ERR_INVALID, "%s rank %d/%d: %s rank %d: tag %d is outside 0..%d",
                        c->ops->name, c->rank, c->size, verb, peer, tag, CDP_COMM_TAG_LIMIT - 1);
    if (bytes > 0 && !buf)
        return cdp_fail(CDP_ERR_INVALID, "%s rank %d/%d: %s rank %d (tag %d, %zu bytes): buffer is NULL",
                        c->ops->name, c->rank, c->size, verb, peer, tag, bytes);
    struct cdp_request *r = calloc(1, sizeof *r);
    if (!r) return cdp_fail(CDP_ERR_NOMEM, "%s rank %d/%d: out of memory for a request", c->ops->name, c->rank, c->size);
    r->comm = c;
    r->is_send = is_send;
    r->peer = peer;
    r->tag = tag;
    r->buf = buf;
    r->bytes = bytes;
    cdp_status st = is_send ? c->ops->isend(c, r) : c->ops->irecv(c, r);
    if (st) {
        free(r);
        return cdp_error_context(st, "%s rank %d/%d: %s rank %d (tag %d, %zu bytes)", c->ops->name,
                                 c->rank, c->size, verb, peer, tag, bytes);
    }
    c->pending++;
    *req = r;
    return CDP_OK;
}

cdp_status cdp_comm_isend(cdp_comm_t c, const void *buf, size_t bytes, int peer, int tag, cdp_request_t *req)
{
    /* the backends never write through a send's buffer */
    return post(c, 1, (void *)(uintptr_t)buf, bytes, peer, tag, req);
}

cdp_status cdp_comm_irecv(cdp_comm_t c, void *buf, size_t bytes, int peer, int tag, cdp_request_t *req)
{
    return post(c, 0, buf, bytes, peer, tag, req);
}

static void request_free(struct cdp_request *r)
{
    r->comm->ops->release(r);
    r->comm->pending--;
    free(r);
}

static cdp_status request_test(void *arg, int *done)
{
    struct cdp_request *r = arg;
    return r->comm->ops->test(r, done);
}

static cdp_status request_context(struct cdp_request *r, cdp_status st)
{
    struct cdp_comm *c = r->comm;
    return cdp_error_context(st, "%s rank %d/%d: %s rank %d (tag %d, %zu bytes)", c->ops->name,
                             c->rank, c->size, r->is_send ? "send to" : "receive from", r->peer,
                             r->tag, r->bytes);
}

cdp_status cdp_comm_wait(cdp_request_t req, double timeout_s)
{
    if (!req) return cdp_fail(CDP_ERR_INVALID, "cdp_comm_wait: NULL request");
    cdp_status st = cdp_comm_poll(request_test, req, cdp_time_ns(), timeout_s, req->bytes, CDP_COMM_SPIN_P2P_GBPS);
    if (st) st = request_context(req, st);
    request_free(req);
    return st;
}

int cdp_comm_test(cdp_request_t req)
{
    if (!req) return 0;
    int done = 0;
    cdp_status st = req->comm->ops->test(req, &done);
    if (st) {
        request_context(req, st);
        request_free(req);
        return -1;
    }
    if (!done) return 0;
    request_free(req);
    return 1;
}
