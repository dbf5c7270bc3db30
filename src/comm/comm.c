/* The communicator front: picks the host backend (self or mpi), checks every
 * argument once for all backends (nccl and the host-staging adapter too),
 * keeps the request bookkeeping of point-to-point transfers and non-blocking
 * collectives, and runs the deadline loop that every wait goes through.
 * Messages name the communicator, the rank, the operation and its peer, so a
 * hung pipeline says who waits on what; they are written here only. */
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
#include "cdp/tensor.h"
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

static cdp_comm_wait_hook wait_hook;
static void *wait_hook_ctx;

void cdp_comm_set_wait_hook(cdp_comm_wait_hook hook, void *ctx)
{
    wait_hook = hook;
    wait_hook_ctx = ctx;
}

static cdp_status poll_loop(cdp_comm_test_fn test, void *arg, uint64_t t0, double timeout_s, size_t bytes,
                            double spin_gbps);

cdp_status cdp_comm_poll(cdp_comm_test_fn test, void *arg, uint64_t t0, double timeout_s,
                         size_t bytes, double spin_gbps)
{
    in_wait = 1;
    if (wait_hook) wait_hook(wait_hook_ctx);
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
    snprintf(c->name, sizeof c->name, "%s", ops->name);
    c->host = ops->memory == CDP_COMM_HOST_MEMORY ? c : NULL;
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

const char *cdp_comm_name(cdp_comm_t c) { return c ? c->name : "(null)"; }
enum cdp_comm_memory cdp_comm_memory(cdp_comm_t c) { return c ? c->ops->memory : CDP_COMM_HOST_MEMORY; }
cdp_comm_t cdp_comm_host(cdp_comm_t c) { return c ? c->host : NULL; }
int cdp_comm_p2p_grouped(cdp_comm_t c) { return c && c->ops->group; }
int cdp_comm_collectives_async(cdp_comm_t c) { return c && c->ops->icoll && c->size > 1; }
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
        return cdp_error_context(st, "%s rank %d/%d: split (color %d, key %d)", c->name, c->rank, c->size, color,
                                 key);
    *out = n;
    return CDP_OK;
}

void cdp_comm_shard(size_t n, int R, int r, size_t *off, size_t *len)
{
    CDP_ASSERT(R >= 1 && r >= 0 && r < R && off && len);
    uint64_t o, l;
    cdp_shard((uint64_t)n, R, r, &o, &l); /* the rule's home, which the memory model reads too */
    *off = (size_t)o;
    *len = (size_t)l;
}

static size_t dtype_size(enum cdp_comm_dtype dt) { return dt == CDP_COMM_BF16 ? 2 : dt == CDP_COMM_F32 ? 4 : 8; }

/* "all-reduce (sum) of 4 floats", "reduce-scatter (max) of floats [1, 4) of 5",
 * "all-gather of 3 floats": what a collective request is, for its messages. */
static void describe_coll(const struct cdp_request *r, char *buf, size_t cap)
{
    const char *what = r->wire_bf16 ? "floats as bf16" : r->dt == CDP_COMM_F32 ? "floats" : "doubles";
    switch (r->kind) {
    case CDP_REQ_ALLREDUCE:
        snprintf(buf, cap, "all-reduce (%s) of %zu %s", op_names[r->op], r->n, what);
        break;
    case CDP_REQ_REDUCE_SCATTER:
        if (r->from == 0 && r->count == r->n)
            snprintf(buf, cap, "reduce-scatter (%s) of %zu floats", op_names[r->op], r->n);
        else
            snprintf(buf, cap, "reduce-scatter (%s) of floats [%zu, %zu) of %zu", op_names[r->op], r->from,
                     r->from + r->count, r->n);
        break;
    case CDP_REQ_ALLGATHER:
        snprintf(buf, cap, "all-gather of %zu floats", r->n);
        break;
    case CDP_REQ_P2P:
        snprintf(buf, cap, "%s rank %d (tag %d, %zu bytes)", r->is_send ? "send to" : "receive from", r->peer, r->tag,
                 r->bytes);
        break;
    }
}

static cdp_status request_context(struct cdp_request *r, cdp_status st)
{
    struct cdp_comm *c = r->comm;
    char what[160];
    describe_coll(r, what, sizeof what);
    return cdp_error_context(st, "%s rank %d/%d: %s", c->name, c->rank, c->size, what);
}

/* The checks every collective shares: the communicator, the op, the buffer
 * and the window; CDP_OK with *skip = 1 when there is nothing to move (every
 * rank passes the same sizes, so every rank skips). */
static cdp_status coll_args(cdp_comm_t c, const char *what, enum cdp_req_kind kind, const void *buf, size_t n,
                            size_t from, size_t count, enum cdp_comm_dtype dt, enum cdp_reduce_op op, int *skip)
{
    const char *elems = dt == CDP_COMM_F32 ? "floats" : "doubles";
    *skip = 0;
    if (!c) return cdp_fail(CDP_ERR_INVALID, "%s: NULL communicator", what);
    if (kind != CDP_REQ_ALLGATHER && (unsigned)op >= CDP_REDUCE_OP_COUNT)
        return cdp_fail(CDP_ERR_INVALID, "%s rank %d/%d: %s: unknown reduce op %d", c->name, c->rank, c->size, what,
                        (int)op);
    if (count > 0 && !buf)
        return cdp_fail(CDP_ERR_INVALID, "%s rank %d/%d: %s of %zu %s: buffer is NULL", c->name, c->rank, c->size,
                        what, count, elems);
    if (from > n || count > n - from)
        return cdp_fail(CDP_ERR_INVALID, "%s rank %d/%d: %s of floats [%zu, %zu) of a %zu-float buffer", c->name,
                        c->rank, c->size, what, from, from + count, n);
    *skip = count == 0;
    return CDP_OK;
}

static void request_free(struct cdp_request *r)
{
    if (r->impl) r->comm->ops->release(r);
    r->comm->pending--;
    free(r);
}

/* ---- bf16 on the wire -------------------------------------------------------- */

static const char *const wire_names[] = {[CDP_COMM_WIRE_F32] = "fp32", [CDP_COMM_WIRE_BF16] = "bf16"};
CDP_TABLE_CHECK(wire_names, CDP_COMM_WIRE_COUNT);

const char *cdp_comm_wire_name(enum cdp_comm_wire w)
{
    return (unsigned)w < CDP_COMM_WIRE_COUNT ? wire_names[w] : "?";
}

void cdp_comm_bf16_sum(const uint16_t *in, uint16_t *inout, size_t n)
{
    for (size_t i = 0; i < n; i++) inout[i] = cdp_f32_to_bf16(cdp_bf16_to_f32(in[i]) + cdp_bf16_to_f32(inout[i]));
}

/* Floats [a, b) of buf as bf16 at the same element indices of the bf16 view
 * of buf, in place: element i's two bytes land at 2i, never past the floats
 * not yet read (4j for j > i), so ascending order is safe; unpacking goes
 * descending for the same reason. */
static void wire_pack(void *buf, size_t a, size_t b)
{
    const float *f = buf;
    uint16_t *h = buf;
    for (size_t i = a; i < b; i++) {
        const float x = f[i];
        h[i] = cdp_f32_to_bf16(x);
    }
}

static void wire_unpack(void *buf, size_t n)
{
    float *f = buf;
    const uint16_t *h = buf;
    for (size_t i = n; i-- > 0;) {
        const uint16_t x = h[i];
        f[i] = cdp_bf16_to_f32(x);
    }
}

/* A completed collective that travelled as bf16: its floats back, and an
 * average's division (what was this rank's to receive: the whole buffer, or
 * its part of a reduce-scatter's window). Once. */
static void wire_finish(struct cdp_request *r)
{
    if (!r->wire_bf16) return;
    r->wire_bf16 = 0;
    struct cdp_comm *c = r->comm;
    wire_unpack(r->buf, r->count);
    if (!r->wire_avg) return;
    size_t at = 0, len = r->count;
    if (r->kind == CDP_REQ_REDUCE_SCATTER) {
        uint64_t o = 0, l = 0;
        cdp_shard_in_window(r->n, c->size, c->rank, r->from, r->count, &o, &l);
        at = (size_t)o;
        len = (size_t)l;
    }
    float *f = (float *)r->buf + at, k = (float)c->size;
    for (size_t i = 0; i < len; i++) f[i] /= k;
}

/* Makes r a bf16 collective: checks that c can carry it, then packs the
 * floats this rank sends (an all-gather: its own shard). */
static cdp_status wire_begin(struct cdp_comm *c, struct cdp_request *r)
{
    if (c->ops->memory != CDP_COMM_HOST_MEMORY || !c->ops->icoll)
        return cdp_fail(CDP_ERR_UNSUPPORTED, "%s cannot carry bf16 collectives (comm_dtype bf16 needs a "
                        "communicator on host memory: mpi)", c->name);
    if (r->kind == CDP_REQ_ALLGATHER) {
        size_t off = 0, len = 0;
        cdp_comm_shard(r->n, c->size, c->rank, &off, &len);
        wire_pack(r->buf, off, off + len);
    } else {
        wire_pack(r->buf, 0, r->count);
    }
    r->wire_bf16 = 1;
    r->wire_avg = r->op == CDP_REDUCE_AVG;
    if (r->kind != CDP_REQ_ALLGATHER) r->op = CDP_REDUCE_SUM;
    r->dt = CDP_COMM_BF16;
    r->bytes = r->count * dtype_size(CDP_COMM_BF16);
    return CDP_OK;
}

/* Starts a checked collective: the backend's icoll, or its blocking slot run
 * now within timeout_s (the request then comes back completed). n == 0 (a
 * skipped one) also comes back completed. With the bf16 wire (and more than
 * one rank) the floats are packed here and unpacked when it completes. */
static cdp_status coll_start(cdp_comm_t c, enum cdp_req_kind kind, void *buf, size_t n, size_t from, size_t count,
                             enum cdp_comm_dtype dt, enum cdp_reduce_op op, enum cdp_comm_wire wire, int skip,
                             double timeout_s, cdp_request_t *req)
{
    struct cdp_request *r = calloc(1, sizeof *r);
    if (!r) return cdp_fail(CDP_ERR_NOMEM, "%s rank %d/%d: out of memory for a request", c->name, c->rank, c->size);
    *r = (struct cdp_request){.comm = c, .kind = kind, .peer = -1, .tag = -1, .buf = buf,
                              .bytes = count * dtype_size(dt), .n = n, .from = from, .count = count, .dt = dt,
                              .op = op};
    cdp_status st = CDP_OK;
    if (wire == CDP_COMM_WIRE_BF16 && op == CDP_REDUCE_MAX && kind != CDP_REQ_ALLGATHER)
        st = cdp_fail(CDP_ERR_INVALID, "bf16 on the wire carries sums and averages, not a max");
    else if (!skip && wire == CDP_COMM_WIRE_BF16 && c->size > 1)
        st = wire_begin(c, r);
    if (!st && skip) {
        r->done = 1;
    } else if (!st && c->ops->icoll) {
        st = c->ops->icoll(c, r);
    } else if (!st) {
        switch (kind) {
        case CDP_REQ_ALLREDUCE: st = c->ops->allreduce(c, buf, n, dt, op, timeout_s); break;
        case CDP_REQ_REDUCE_SCATTER: st = c->ops->reduce_scatter_f32(c, buf, n, from, count, op, timeout_s); break;
        case CDP_REQ_ALLGATHER: st = c->ops->allgather_f32(c, buf, n, timeout_s); break;
        case CDP_REQ_P2P: st = cdp_fail(CDP_ERR_INTERNAL, "not a collective"); break;
        }
        r->done = 1;
    }
    if (st) {
        st = request_context(r, st);
        free(r);
        return st;
    }
    c->pending++;
    *req = r;
    return CDP_OK;
}

static cdp_status coll_blocking(cdp_comm_t c, enum cdp_req_kind kind, void *buf, size_t n, size_t from,
                                size_t count, enum cdp_comm_dtype dt, enum cdp_reduce_op op, enum cdp_comm_wire wire,
                                double timeout_s)
{
    static const char *const names[] = {"", "all-reduce", "reduce-scatter", "all-gather"};
    int skip = 0;
    cdp_status st = coll_args(c, names[kind], kind, buf, n, from, count, dt, op, &skip);
    if (st || skip) return st;
    cdp_request_t r = NULL;
    if ((st = coll_start(c, kind, buf, n, from, count, dt, op, wire, 0, timeout_s, &r))) return st;
    return cdp_comm_wait(r, timeout_s);
}

static cdp_status coll_nonblocking(cdp_comm_t c, enum cdp_req_kind kind, void *buf, size_t n, size_t from,
                                   size_t count, enum cdp_comm_dtype dt, enum cdp_reduce_op op,
                                   enum cdp_comm_wire wire, double timeout_s, cdp_request_t *req)
{
    static const char *const names[] = {"", "all-reduce", "reduce-scatter", "all-gather"};
    if (!req) return cdp_fail(CDP_ERR_INVALID, "non-blocking %s: request is NULL", names[kind]);
    int skip = 0;
    cdp_status st = coll_args(c, names[kind], kind, buf, n, from, count, dt, op, &skip);
    if (st) return st;
    return coll_start(c, kind, buf, n, from, count, dt, op, wire, skip, timeout_s, req);
}

static cdp_status wire_arg(enum cdp_comm_wire wire)
{
    if ((unsigned)wire >= CDP_COMM_WIRE_COUNT)
        return cdp_fail(CDP_ERR_INVALID, "collective: unknown wire dtype %d", (int)wire);
    return CDP_OK;
}

cdp_status cdp_comm_allreduce_wire(cdp_comm_t c, float *buf, size_t n, enum cdp_reduce_op op,
                                   enum cdp_comm_wire wire, double timeout_s)
{
    cdp_status st = wire_arg(wire);
    return st ? st : coll_blocking(c, CDP_REQ_ALLREDUCE, buf, n, 0, n, CDP_COMM_F32, op, wire, timeout_s);
}

cdp_status cdp_comm_allreduce_f32(cdp_comm_t c, float *buf, size_t n, enum cdp_reduce_op op,
                                  double timeout_s)
{
    return cdp_comm_allreduce_wire(c, buf, n, op, CDP_COMM_WIRE_F32, timeout_s);
}

cdp_status cdp_comm_allreduce_f64(cdp_comm_t c, double *buf, size_t n, enum cdp_reduce_op op,
                                  double timeout_s)
{
    return coll_blocking(c, CDP_REQ_ALLREDUCE, buf, n, 0, n, CDP_COMM_F64, op, CDP_COMM_WIRE_F32, timeout_s);
}

cdp_status cdp_comm_reduce_scatter_window_wire(cdp_comm_t c, float *buf, size_t n, size_t from, size_t count,
                                               enum cdp_reduce_op op, enum cdp_comm_wire wire, double timeout_s)
{
    cdp_status st = wire_arg(wire);
    return st ? st : coll_blocking(c, CDP_REQ_REDUCE_SCATTER, buf, n, from, count, CDP_COMM_F32, op, wire, timeout_s);
}

cdp_status cdp_comm_reduce_scatter_window_f32(cdp_comm_t c, float *buf, size_t n, size_t from, size_t count,
                                              enum cdp_reduce_op op, double timeout_s)
{
    return cdp_comm_reduce_scatter_window_wire(c, buf, n, from, count, op, CDP_COMM_WIRE_F32, timeout_s);
}

cdp_status cdp_comm_reduce_scatter_f32(cdp_comm_t c, float *buf, size_t n, enum cdp_reduce_op op,
                                       double timeout_s)
{
    return cdp_comm_reduce_scatter_window_f32(c, buf, n, 0, n, op, timeout_s);
}

cdp_status cdp_comm_allgather_wire(cdp_comm_t c, float *buf, size_t n, enum cdp_comm_wire wire, double timeout_s)
{
    cdp_status st = wire_arg(wire);
    return st ? st : coll_blocking(c, CDP_REQ_ALLGATHER, buf, n, 0, n, CDP_COMM_F32, CDP_REDUCE_SUM, wire, timeout_s);
}

cdp_status cdp_comm_allgather_f32(cdp_comm_t c, float *buf, size_t n, double timeout_s)
{
    return cdp_comm_allgather_wire(c, buf, n, CDP_COMM_WIRE_F32, timeout_s);
}

cdp_status cdp_comm_iallreduce_wire(cdp_comm_t c, float *buf, size_t n, enum cdp_reduce_op op,
                                    enum cdp_comm_wire wire, double timeout_s, cdp_request_t *req)
{
    cdp_status st = wire_arg(wire);
    return st ? st : coll_nonblocking(c, CDP_REQ_ALLREDUCE, buf, n, 0, n, CDP_COMM_F32, op, wire, timeout_s, req);
}

cdp_status cdp_comm_iallreduce_f32(cdp_comm_t c, float *buf, size_t n, enum cdp_reduce_op op, double timeout_s,
                                   cdp_request_t *req)
{
    return cdp_comm_iallreduce_wire(c, buf, n, op, CDP_COMM_WIRE_F32, timeout_s, req);
}

cdp_status cdp_comm_ireduce_scatter_window_wire(cdp_comm_t c, float *buf, size_t n, size_t from, size_t count,
                                                enum cdp_reduce_op op, enum cdp_comm_wire wire, double timeout_s,
                                                cdp_request_t *req)
{
    cdp_status st = wire_arg(wire);
    return st ? st
              : coll_nonblocking(c, CDP_REQ_REDUCE_SCATTER, buf, n, from, count, CDP_COMM_F32, op, wire, timeout_s,
                                 req);
}

cdp_status cdp_comm_ireduce_scatter_window_f32(cdp_comm_t c, float *buf, size_t n, size_t from, size_t count,
                                               enum cdp_reduce_op op, double timeout_s, cdp_request_t *req)
{
    return cdp_comm_ireduce_scatter_window_wire(c, buf, n, from, count, op, CDP_COMM_WIRE_F32, timeout_s, req);
}

cdp_status cdp_comm_iallgather_f32(cdp_comm_t c, float *buf, size_t n, double timeout_s, cdp_request_t *req)
{
    return coll_nonblocking(c, CDP_REQ_ALLGATHER, buf, n, 0, n, CDP_COMM_F32, CDP_REDUCE_SUM, CDP_COMM_WIRE_F32,
                            timeout_s, req);
}

cdp_status cdp_comm_barrier(cdp_comm_t c, double timeout_s)
{
    if (!c) return cdp_fail(CDP_ERR_INVALID, "barrier: NULL communicator");
    cdp_status st = c->ops->barrier(c, timeout_s);
    if (st) return cdp_error_context(st, "%s rank %d/%d: barrier", c->name, c->rank, c->size);
    return CDP_OK;
}

cdp_status cdp_comm_gather_bytes(cdp_comm_t c, const void *buf, size_t bytes, void **out,
                                 size_t **lens, double timeout_s)
{
    if (!c || !out || !lens) return cdp_fail(CDP_ERR_INVALID, "gather: NULL communicator, out or lens");
    if (bytes > 0 && !buf)
        return cdp_fail(CDP_ERR_INVALID, "%s rank %d/%d: gather of %zu bytes: buffer is NULL", c->name, c->rank,
                        c->size, bytes);
    if (!c->ops->gather_bytes)
        return cdp_fail(CDP_ERR_UNSUPPORTED, "%s rank %d/%d: gather: %s carries no host bytes (use its host "
                        "communicator, cdp_comm_host)", c->name, c->rank, c->size, c->name);
    void *o = NULL;
    size_t *l = NULL;
    cdp_status st = c->ops->gather_bytes(c, buf, bytes, &o, &l, timeout_s);
    if (st)
        return cdp_error_context(st, "%s rank %d/%d: gather of %zu bytes to rank 0", c->name, c->rank, c->size,
                                 bytes);
    *out = o;
    *lens = l;
    return CDP_OK;
}

cdp_status cdp_comm_bcast_bytes(cdp_comm_t c, void *buf, size_t bytes, int root, double timeout_s)
{
    if (!c) return cdp_fail(CDP_ERR_INVALID, "broadcast: NULL communicator");
    if (root < 0 || root >= c->size)
        return cdp_fail(CDP_ERR_INVALID, "%s rank %d/%d: broadcast from rank %d: no such rank (0..%d)", c->name,
                        c->rank, c->size, root, c->size - 1);
    if (bytes > 0 && !buf)
        return cdp_fail(CDP_ERR_INVALID, "%s rank %d/%d: broadcast of %zu bytes: buffer is NULL", c->name, c->rank,
                        c->size, bytes);
    if (!c->ops->bcast_bytes)
        return cdp_fail(CDP_ERR_UNSUPPORTED, "%s rank %d/%d: broadcast: %s carries no host bytes (use its host "
                        "communicator, cdp_comm_host)", c->name, c->rank, c->size, c->name);
    cdp_status st = c->ops->bcast_bytes(c, buf, bytes, root, timeout_s);
    if (st)
        return cdp_error_context(st, "%s rank %d/%d: broadcast of %zu bytes from rank %d", c->name, c->rank,
                                 c->size, bytes, root);
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

/* The checks of one send or receive; batch: one of a batch (no tag). */
static cdp_status p2p_args(cdp_comm_t c, int is_send, const void *buf, size_t bytes, int peer, int tag, int batch)
{
    const char *verb = is_send ? "send to" : "receive from";
    char t[48] = "";
    if (!batch) snprintf(t, sizeof t, "tag %d, ", tag);
    if (peer < 0 || peer >= c->size)
        return cdp_fail(CDP_ERR_INVALID, "%s rank %d/%d: %s rank %d: no such rank (0..%d)", c->name, c->rank,
                        c->size, verb, peer, c->size - 1);
    if (!batch && (tag < 0 || tag >= CDP_COMM_TAG_LIMIT))
        return cdp_fail(CDP_ERR_INVALID, "%s rank %d/%d: %s rank %d: tag %d is outside 0..%d", c->name, c->rank,
                        c->size, verb, peer, tag, CDP_COMM_TAG_LIMIT - 1);
    if (bytes > 0 && !buf)
        return cdp_fail(CDP_ERR_INVALID, "%s rank %d/%d: %s rank %d (%s%zu bytes): buffer is NULL", c->name, c->rank,
                        c->size, verb, peer, t, bytes);
    return CDP_OK;
}

/* Posts a checked send or receive (no context on failure). */
static cdp_status p2p_start(cdp_comm_t c, int is_send, void *buf, size_t bytes, int peer, int tag,
                            struct cdp_request **out)
{
    if (!c->ops->isend)
        return cdp_fail(CDP_ERR_UNSUPPORTED, "%s sends and receives only in batches (cdp_comm_group)", c->name);
    struct cdp_request *r = calloc(1, sizeof *r);
    if (!r) return cdp_fail(CDP_ERR_NOMEM, "out of memory for a request");
    *r = (struct cdp_request){.comm = c, .kind = CDP_REQ_P2P, .is_send = is_send, .peer = peer, .tag = tag,
                              .buf = buf, .bytes = bytes};
    cdp_status st = is_send ? c->ops->isend(c, r) : c->ops->irecv(c, r);
    if (st) {
        free(r);
        return st;
    }
    c->pending++;
    *out = r;
    return CDP_OK;
}

static cdp_status post(cdp_comm_t c, int is_send, void *buf, size_t bytes, int peer, int tag,
                       cdp_request_t *req)
{
    const char *verb = is_send ? "send to" : "receive from";
    if (!c || !req) return cdp_fail(CDP_ERR_INVALID, "%s: NULL communicator or request", is_send ? "isend" : "irecv");
    cdp_status st = p2p_args(c, is_send, buf, bytes, peer, tag, 0);
    if (st) return st;
    if ((st = p2p_start(c, is_send, buf, bytes, peer, tag, req)))
        return cdp_error_context(st, "%s rank %d/%d: %s rank %d (tag %d, %zu bytes)", c->name, c->rank, c->size,
                                 verb, peer, tag, bytes);
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

static cdp_status request_test(void *arg, int *done)
{
    struct cdp_request *r = arg;
    if (r->done) {
        wire_finish(r);
        *done = 1;
        return CDP_OK;
    }
    cdp_status st = r->comm->ops->test(r, done);
    if (st) r->failed = 1;
    if (!st && *done) {
        r->done = 1;
        wire_finish(r);
    }
    return st;
}

cdp_status cdp_comm_wait(cdp_request_t req, double timeout_s)
{
    if (!req) return cdp_fail(CDP_ERR_INVALID, "cdp_comm_wait: NULL request");
    cdp_status st = cdp_comm_poll(request_test, req, cdp_time_ns(), timeout_s, req->bytes,
                                  req->kind == CDP_REQ_P2P ? CDP_COMM_SPIN_P2P_GBPS : CDP_COMM_SPIN_COLL_GBPS);
    if (st && !req->failed && req->call) st = cdp_fail(st, "timed out after %g s (%s)", timeout_s, req->call);
    if (st) st = request_context(req, st);
    request_free(req);
    return st;
}

int cdp_comm_test(cdp_request_t req)
{
    if (!req) return 0;
    int done = 0;
    cdp_status st = request_test(req, &done);
    if (st) {
        request_context(req, st);
        request_free(req);
        return -1;
    }
    if (!done) return 0;
    request_free(req);
    return 1;
}

/* "send to 1 (4096 bytes), receive from 0 (4096 bytes)", the first few. */
static void describe_group(const struct cdp_comm_p2p *ops, int n, char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && i < 4 && used < cap; i++) {
        int w = snprintf(buf + used, cap - used, "%s%s %d (%zu bytes)", i ? ", " : "",
                         ops[i].is_send ? "send to" : "receive from", ops[i].peer, ops[i].bytes);
        if (w < 0) return;
        used += (size_t)w;
    }
    if (n > 4 && used < cap) snprintf(buf + used, cap - used, ", and %d more", n - 4);
}

/* A batch without a backend's group: every transfer posted (tag 0: MPI keeps
 * the messages of a pair in order, and a batch pairs its sends and receives
 * in the same order on both sides), then all waited for within one deadline. */
static cdp_status group_by_requests(cdp_comm_t c, const struct cdp_comm_p2p *ops, int n, double timeout_s)
{
    struct cdp_request **rq = calloc((size_t)n, sizeof *rq);
    if (!rq) return cdp_fail(CDP_ERR_NOMEM, "out of memory for %d requests", n);
    cdp_status st = CDP_OK;
    const uint64_t t0 = cdp_time_ns();
    for (int i = 0; i < n && !st; i++) st = p2p_start(c, ops[i].is_send, ops[i].buf, ops[i].bytes, ops[i].peer, 0, &rq[i]);
    for (int i = 0; i < n && !st; i++)
        st = cdp_comm_poll(request_test, rq[i], t0, timeout_s, rq[i]->bytes, CDP_COMM_SPIN_P2P_GBPS);
    for (int i = 0; i < n; i++)
        if (rq[i]) request_free(rq[i]);
    free(rq);
    return st;
}

cdp_status cdp_comm_group(cdp_comm_t c, const struct cdp_comm_p2p *ops, int n, double timeout_s)
{
    if (!c) return cdp_fail(CDP_ERR_INVALID, "send/receive group: NULL communicator");
    if (n < 0 || (n > 0 && !ops))
        return cdp_fail(CDP_ERR_INVALID, "%s rank %d/%d: send/receive group of %d operations: %s", c->name, c->rank,
                        c->size, n, n < 0 ? "negative count" : "ops is NULL");
    cdp_status st;
    for (int i = 0; i < n; i++)
        if ((st = p2p_args(c, ops[i].is_send, ops[i].buf, ops[i].bytes, ops[i].peer, 0, 1))) return st;
    if (n == 0) return CDP_OK;
    st = c->ops->group ? c->ops->group(c, ops, n, timeout_s) : group_by_requests(c, ops, n, timeout_s);
    if (st) {
        char what[256];
        describe_group(ops, n, what, sizeof what);
        return cdp_error_context(st, "%s rank %d/%d: send/receive group (%s)", c->name, c->rank, c->size, what);
    }
    return CDP_OK;
}
