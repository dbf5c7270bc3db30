/* The NCCL side of the nccl communicator, built into the CUDA module so that
 * only the module links NCCL. Every communicator is non-blocking underneath
 * (ncclConfig_t.blocking = 0): creation, split, finalisation and every
 * operation return at once, and this file polls ncclCommGetAsyncError (and
 * then the device's stream) against a deadline, so that no call waits forever
 * on a dead or lost peer and the caller can still abort. */
#include <cuda_runtime.h>
#include <nccl.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cdp/core.h" /* CDP_TABLE_CHECK */
#include "cdp/log.h"
#include "comm/comm.h"
#include "comm/nccl_module.h"
#include "kernels/cuda/cuda_state.h"

/* ncclCommSplit 2.18, non-blocking communicators 2.14, ncclAvg 2.10 */
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "the nccl communicator needs NCCL 2.18 or later"
#endif

static_assert(CDP_NCCL_ID_BYTES == NCCL_UNIQUE_ID_BYTES && sizeof(ncclUniqueId) == CDP_NCCL_ID_BYTES,
              "the unique id travels as CDP_NCCL_ID_BYTES bytes");

#define host cdp_cuda_host

/* An NCCL failure as a status: the call, NCCL's text for the code, and the
 * last error NCCL recorded (more precise; may describe an earlier failure). */
static cdp_status nccl_fail(ncclResult_t r, ncclComm_t comm, const char *call)
{
    const char *last = ncclGetLastError(comm);
    int have_last = last && *last;
    return host->fail(CDP_ERR_COMM, "%s: %s (NCCL error %d)%s%s", call, ncclGetErrorString(r), (int)r,
                      have_last ? ": " : "", have_last ? last : "");
}

/* A communicator of the table: NCCL's, and the stream its non-blocking
 * collectives run on. One stream per communicator (not per device): it is
 * made and destroyed with the communicator, so its life needs no count of
 * users, and the data-parallel and tied-embedding reductions of one rank
 * (two communicators) are free to overlap each other as well as the
 * compute. */
struct ncomm {
    ncclComm_t c;
    cudaStream_t stream;
    int device;
};

/* A CUDA failure as a status: the call and CUDA's text. */
static cdp_status cuda_fail(cudaError_t e, const char *call)
{
    return host->fail(CDP_ERR_DEVICE, "%s: %s (%s)", call, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* Wraps a ready NCCL communicator on device `device` with its own stream;
 * on a failure c is aborted. */
static cdp_status wrap_comm(ncclComm_t c, int device, void **out)
{
    struct ncomm *m = (struct ncomm *)calloc(1, sizeof *m);
    if (!m) {
        ncclCommAbort(c);
        return host->fail(CDP_ERR_NOMEM, "out of memory");
    }
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        ncclCommAbort(c);
        free(m);
        return cuda_fail(e, "cudaStreamCreateWithFlags (the communicator's stream)");
    }
    m->c = c;
    m->device = device;
    *out = m;
    return CDP_OK;
}

static void unwrap_free(struct ncomm *m)
{
    /* work still queued on the stream finishes first; the call does not wait */
    cudaError_t e = cudaStreamDestroy(m->stream);
    if (e != cudaSuccess)
        host->log(CDP_LOG_WARN, CDP_SUBSYS_COMM, "nccl: cudaStreamDestroy: %s", cudaGetErrorString(e));
    free(m);
}

/* ---- deadlines ------------------------------------------------------------------ */

/* How a wait polls, as the host communicators do (comm.c): spin for the first
 * 50 us plus the time the bytes should take at ~10 GB/s (a peer that is ready
 * answers within microseconds), then sleep with pauses doubling up to 250 us.
 * CDP_COMM_SPIN_US and CDP_COMM_SLEEP_MAX_US override them, as for comm.c. */
static uint64_t poll_spin_ns = 50000;
static uint64_t poll_sleep_max_ns = 250000;
static int poll_configured;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

struct waiter {
    uint64_t t0, limit, spin, pause;
    double timeout_s;
};

static void waiter_start(struct waiter *w, double timeout_s, size_t bytes)
{
    if (!poll_configured) {
        const char *v;
        if ((v = getenv("CDP_COMM_SPIN_US")) && *v) poll_spin_ns = strtoull(v, NULL, 10) * 1000u;
        if ((v = getenv("CDP_COMM_SLEEP_MAX_US")) && *v) {
            uint64_t us = strtoull(v, NULL, 10);
            poll_sleep_max_ns = (us ? us : 1) * 1000u;
        }
        poll_configured = 1;
    }
    w->t0 = now_ns();
    /* a deadline beyond ~30 years is no deadline */
    w->limit = timeout_s > 0 && timeout_s < 1e9 ? (uint64_t)(timeout_s * 1e9) : UINT64_MAX;
    w->spin = poll_spin_ns + (uint64_t)((double)bytes / 10.0);
    w->pause = 1000;
    w->timeout_s = timeout_s;
}

/* 1 past the deadline; else waits a little (or not at all while spinning). */
static int waiter_expired(struct waiter *w)
{
    uint64_t elapsed = now_ns() - w->t0;
    if (elapsed >= w->limit) return 1;
    if (elapsed < w->spin) return 0;
    uint64_t nap = w->pause;
    if (w->limit != UINT64_MAX && nap > w->limit - elapsed) nap = w->limit - elapsed;
    struct timespec ts = {(time_t)(nap / 1000000000u), (long)(nap % 1000000000u)};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
    if (w->pause < poll_sleep_max_ns)
        w->pause = w->pause * 2 < poll_sleep_max_ns ? w->pause * 2 : poll_sleep_max_ns;
    return 0;
}

static cdp_status timed_out(const struct waiter *w, const char *what)
{
    return host->fail(CDP_ERR_COMM, "timed out after %g s (%s)", w->timeout_s, what);
}

/* Polls comm's state until it leaves ncclInProgress: the communicator is
 * ready, or the operations just issued are on the stream. */
static cdp_status wait_ready(ncclComm_t comm, struct waiter *w, const char *what)
{
    for (;;) {
        ncclResult_t state = ncclInProgress;
        ncclResult_t r = ncclCommGetAsyncError(comm, &state);
        if (r != ncclSuccess) return nccl_fail(r, comm, "ncclCommGetAsyncError");
        if (state == ncclSuccess) return CDP_OK;
        if (state != ncclInProgress) return nccl_fail(state, comm, what);
        if (waiter_expired(w)) return timed_out(w, what);
    }
}

/* Waits for what was issued on comm to be on the stream, then for the stream
 * to drain, watching comm for an asynchronous error (a peer that died) all
 * along. */
static cdp_status wait_done(ncclComm_t comm, struct cdp_cuda_state *d, struct waiter *w, const char *what)
{
    cdp_status st = wait_ready(comm, w, what);
    if (st) return st;
    for (;;) {
        cudaError_t e = cudaStreamQuery(d->stream);
        if (e == cudaSuccess) return CDP_OK;
        if (e != cudaErrorNotReady)
            return host->fail(CDP_ERR_DEVICE, "%s: cudaStreamQuery: %s (%s)", what, cudaGetErrorString(e),
                              cudaGetErrorName(e));
        ncclResult_t state = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(comm, &state);
        if (r != ncclSuccess) return nccl_fail(r, comm, "ncclCommGetAsyncError");
        if (state != ncclSuccess && state != ncclInProgress) return nccl_fail(state, comm, what);
        if (waiter_expired(w)) return timed_out(w, what);
    }
}

/* ---- the table ------------------------------------------------------------------- */

static cdp_status nccl_version(int *v)
{
    ncclResult_t r = ncclGetVersion(v);
    return r == ncclSuccess ? CDP_OK : nccl_fail(r, NULL, "ncclGetVersion");
}

static cdp_status nccl_unique_id(void *id)
{
    ncclUniqueId uid;
    ncclResult_t r = ncclGetUniqueId(&uid);
    if (r != ncclSuccess) return nccl_fail(r, NULL, "ncclGetUniqueId");
    memcpy(id, &uid, sizeof uid);
    return CDP_OK;
}

static void config_nonblocking(ncclConfig_t *c)
{
    ncclConfig_t init = NCCL_CONFIG_INITIALIZER;
    *c = init;
    c->blocking = 0;
}

static cdp_status nccl_init(void *dev_state, const void *id, int nranks, int rank, double timeout_s, void **out)
{
    struct cdp_cuda_state *d = (struct cdp_cuda_state *)dev_state;
    ncclUniqueId uid;
    memcpy(&uid, id, sizeof uid);
    CDP_CUDA_TRY(cudaSetDevice(d->index));
    ncclConfig_t config;
    config_nonblocking(&config);
    struct waiter w;
    waiter_start(&w, timeout_s, 0);
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, uid, rank, &config);
    cdp_status st = CDP_OK;
    if (r != ncclSuccess && r != ncclInProgress) st = nccl_fail(r, comm, "ncclCommInitRankConfig");
    else if (!comm) st = host->fail(CDP_ERR_COMM, "ncclCommInitRankConfig gave no communicator");
    else st = wait_ready(comm, &w, "ncclCommInitRankConfig");
    if (st) {
        if (comm) ncclCommAbort(comm);
        return st;
    }
    if ((st = wrap_comm(comm, d->index, out))) return st;
    host->log(CDP_LOG_DEBUG, CDP_SUBSYS_COMM, "nccl: rank %d of %d ready on cuda:%d", rank, nranks, d->index);
    return CDP_OK;
}

static cdp_status nccl_split(void *comm, int color, int key, double timeout_s, void **out)
{
    struct ncomm *pm = (struct ncomm *)comm;
    ncclComm_t parent = pm->c;
    /* A non-blocking split writes the child's handle from NCCL's own thread
     * when it completes: the slot must outlive a return past the deadline, so
     * it lives on the heap and is left behind (8 bytes) when the split fails. */
    ncclComm_t *slot = (ncclComm_t *)calloc(1, sizeof *slot);
    if (!slot) return host->fail(CDP_ERR_NOMEM, "out of memory");
    ncclConfig_t config;
    config_nonblocking(&config);
    struct waiter w;
    waiter_start(&w, timeout_s, 0);
    ncclResult_t r = ncclCommSplit(parent, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, slot, &config);
    if (r != ncclSuccess && r != ncclInProgress) return nccl_fail(r, parent, "ncclCommSplit");
    cdp_status st = wait_ready(parent, &w, "ncclCommSplit");
    if (st) return st;
    ncclComm_t child = *slot;
    if (child && (st = wait_ready(child, &w, "ncclCommSplit (the new communicator)"))) {
        ncclCommAbort(child);
        return st;
    }
    free(slot);
    if (color >= 0 && !child) return host->fail(CDP_ERR_COMM, "ncclCommSplit gave no communicator for color %d", color);
    if (!child) {
        *out = NULL;
        return CDP_OK;
    }
    return wrap_comm(child, pm->device, out);
}

static cdp_status nccl_rank_size(void *comm, int *rank, int *size)
{
    ncclComm_t c = ((struct ncomm *)comm)->c;
    ncclResult_t r = ncclCommUserRank(c, rank);
    if (r != ncclSuccess) return nccl_fail(r, c, "ncclCommUserRank");
    r = ncclCommCount(c, size);
    if (r != ncclSuccess) return nccl_fail(r, c, "ncclCommCount");
    return CDP_OK;
}

/* enum cdp_reduce_op as NCCL's */
static const ncclRedOp_t red_ops[] = {ncclSum, ncclAvg, ncclMax};
CDP_TABLE_CHECK(red_ops, CDP_REDUCE_OP_COUNT);

static cdp_status nccl_allreduce(void *comm, void *dev_state, void *buf, size_t n, int dtype, int op,
                                 double timeout_s)
{
    ncclComm_t c = ((struct ncomm *)comm)->c;
    struct cdp_cuda_state *d = (struct cdp_cuda_state *)dev_state;
    if ((unsigned)op >= CDP_REDUCE_OP_COUNT || (unsigned)dtype >= CDP_NCCL_DTYPE_COUNT)
        return host->fail(CDP_ERR_INVALID, "all-reduce: op %d / type %d unknown", op, dtype);
    ncclDataType_t type = dtype == CDP_NCCL_F32 ? ncclFloat32 : ncclFloat64;
    size_t esize = dtype == CDP_NCCL_F32 ? 4 : 8;
    CDP_CUDA_TRY(cudaSetDevice(d->index));
    struct waiter w;
    waiter_start(&w, timeout_s, n * esize);
    ncclResult_t r = ncclAllReduce(buf, buf, n, type, red_ops[op], c, d->stream);
    if (r != ncclSuccess && r != ncclInProgress) return nccl_fail(r, c, "ncclAllReduce");
    return wait_done(c, d, &w, "ncclAllReduce");
}

/* ---- ZeRO's shards ------------------------------------------------------------------ */

/* 1 when the shards are `size` equal blocks in rank order (the size divides
 * n): NCCL's own reduce-scatter and all-gather then apply, in place. */
static int equal_shards(const size_t *off, const size_t *len, int size)
{
    for (int k = 0; k < size; k++)
        if (len[k] != len[0] || off[k] != (size_t)k * len[0]) return 0;
    return 1;
}

/* Uneven shards (NCCL's reduce-scatter and all-gather take equal counts):
 * one NCCL group of one rooted collective per non-empty shard, in place, so
 * that the caller pads nothing and no scratch is needed: ncclReduce of shard
 * k to rank k, or ncclBroadcast of shard k from rank k. */
static cdp_status grouped_issue(ncclComm_t c, cudaStream_t stream, float *buf, const size_t *off,
                                const size_t *len, int size, int is_reduce, int op)
{
    const char *call = is_reduce ? "ncclReduce" : "ncclBroadcast";
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return nccl_fail(r, c, "ncclGroupStart");
    ncclResult_t first = ncclSuccess;
    int bad = -1;
    for (int k = 0; k < size && first == ncclSuccess; k++) {
        if (!len[k]) continue;
        float *p = buf + off[k];
        r = is_reduce ? ncclReduce(p, p, len[k], ncclFloat32, red_ops[op], k, c, stream)
                      : ncclBroadcast(p, p, len[k], ncclFloat32, k, c, stream);
        if (r != ncclSuccess && r != ncclInProgress) first = r, bad = k;
    }
    /* the group is closed even after a failed call, so that later groups start clean */
    r = ncclGroupEnd();
    if (first != ncclSuccess) {
        char what[96];
        snprintf(what, sizeof what, "%s of shard %d (%zu floats)", call, bad, len[bad]);
        return nccl_fail(first, c, what);
    }
    if (r != ncclSuccess && r != ncclInProgress) return nccl_fail(r, c, "ncclGroupEnd");
    return CDP_OK;
}

static cdp_status grouped(ncclComm_t c, struct cdp_cuda_state *d, float *buf, const size_t *off,
                          const size_t *len, int size, int is_reduce, int op, struct waiter *w)
{
    cdp_status st = grouped_issue(c, d->stream, buf, off, len, size, is_reduce, op);
    if (st) return st;
    char what[64];
    snprintf(what, sizeof what, "ncclGroupEnd (%s per shard)", is_reduce ? "ncclReduce" : "ncclBroadcast");
    return wait_done(c, d, w, what);
}

static cdp_status nccl_reduce_scatter(void *comm, void *dev_state, float *buf, size_t n, const size_t *off,
                                      const size_t *len, int op, double timeout_s)
{
    ncclComm_t c = ((struct ncomm *)comm)->c;
    struct cdp_cuda_state *d = (struct cdp_cuda_state *)dev_state;
    if ((unsigned)op >= CDP_REDUCE_OP_COUNT) return host->fail(CDP_ERR_INVALID, "reduce-scatter: op %d unknown", op);
    int rank = 0, size = 0;
    cdp_status st = nccl_rank_size(comm, &rank, &size);
    if (st) return st;
    CDP_CUDA_TRY(cudaSetDevice(d->index));
    struct waiter w;
    waiter_start(&w, timeout_s, n * sizeof *buf);
    if (!equal_shards(off, len, size)) return grouped(c, d, buf, off, len, size, 1, op, &w);
    ncclResult_t r = ncclReduceScatter(buf, buf + off[rank], len[rank], ncclFloat32, red_ops[op], c, d->stream);
    if (r != ncclSuccess && r != ncclInProgress) return nccl_fail(r, c, "ncclReduceScatter");
    return wait_done(c, d, &w, "ncclReduceScatter");
}

static cdp_status nccl_all_gather(void *comm, void *dev_state, float *buf, size_t n, const size_t *off,
                                  const size_t *len, double timeout_s)
{
    ncclComm_t c = ((struct ncomm *)comm)->c;
    struct cdp_cuda_state *d = (struct cdp_cuda_state *)dev_state;
    int rank = 0, size = 0;
    cdp_status st = nccl_rank_size(comm, &rank, &size);
    if (st) return st;
    CDP_CUDA_TRY(cudaSetDevice(d->index));
    struct waiter w;
    waiter_start(&w, timeout_s, n * sizeof *buf);
    if (!equal_shards(off, len, size)) return grouped(c, d, buf, off, len, size, 0, 0, &w);
    ncclResult_t r = ncclAllGather(buf + off[rank], buf, len[rank], ncclFloat32, c, d->stream);
    if (r != ncclSuccess && r != ncclInProgress) return nccl_fail(r, c, "ncclAllGather");
    return wait_done(c, d, &w, "ncclAllGather");
}

static cdp_status nccl_p2p(void *comm, void *dev_state, const struct cdp_nccl_p2p *ops, int n, double timeout_s)
{
    ncclComm_t c = ((struct ncomm *)comm)->c;
    struct cdp_cuda_state *d = (struct cdp_cuda_state *)dev_state;
    size_t bytes = 0;
    for (int i = 0; i < n; i++) bytes += ops[i].bytes;
    CDP_CUDA_TRY(cudaSetDevice(d->index));
    struct waiter w;
    waiter_start(&w, timeout_s, bytes);
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return nccl_fail(r, c, "ncclGroupStart");
    ncclResult_t first = ncclSuccess;
    int bad = -1;
    for (int i = 0; i < n && first == ncclSuccess; i++) {
        const struct cdp_nccl_p2p *p = &ops[i];
        r = p->is_send ? ncclSend(p->buf, p->bytes, ncclUint8, p->peer, c, d->stream)
                       : ncclRecv(p->buf, p->bytes, ncclUint8, p->peer, c, d->stream);
        if (r != ncclSuccess && r != ncclInProgress) first = r, bad = i;
    }
    /* the group is closed even after a failed call, so that later groups start clean */
    r = ncclGroupEnd();
    if (first != ncclSuccess) {
        const struct cdp_nccl_p2p *p = &ops[bad];
        char what[96];
        snprintf(what, sizeof what, "%s rank %d (%zu bytes, #%d of the group)",
                 p->is_send ? "ncclSend to" : "ncclRecv from", p->peer, p->bytes, bad);
        return nccl_fail(first, c, what);
    }
    if (r != ncclSuccess && r != ncclInProgress) return nccl_fail(r, c, "ncclGroupEnd");
    return wait_done(c, d, &w, "ncclGroupEnd (send/receive group)");
}

/* ---- non-blocking collectives on the communicator's stream -------------------------- */

/* A request: the event that orders the communicator's stream behind the
 * compute stream (ready), the one recorded behind the collective (done),
 * and what it is, for messages. done is recorded once NCCL has put the
 * collective on the stream (a non-blocking communicator may still be
 * issuing it when the call returns: ncclInProgress). */
struct nreq {
    struct ncomm *m;
    struct cdp_cuda_state *d;
    cudaEvent_t ready, done;
    int recorded;  /* done is recorded behind the collective */
    int finished;  /* done has passed and the compute stream waits on it */
    const char *call;
};

static void nreq_free(struct nreq *q)
{
    /* an event still pending is released once it completes; destroying it does not wait */
    if (q->ready) cudaEventDestroy(q->ready);
    if (q->done) cudaEventDestroy(q->done);
    free(q);
}

/* Records done behind the collective once NCCL has issued it; *issued = 0
 * while it is still in progress. */
static cdp_status nreq_record(struct nreq *q, int *issued)
{
    *issued = 0;
    ncclResult_t state = ncclInProgress;
    ncclResult_t r = ncclCommGetAsyncError(q->m->c, &state);
    if (r != ncclSuccess) return nccl_fail(r, q->m->c, "ncclCommGetAsyncError");
    if (state == ncclInProgress) return CDP_OK;
    if (state != ncclSuccess) return nccl_fail(state, q->m->c, q->call);
    cudaError_t e = cudaEventRecord(q->done, q->m->stream);
    if (e != cudaSuccess) return cuda_fail(e, "cudaEventRecord (behind the collective, on the communicator's stream)");
    q->recorded = 1;
    *issued = 1;
    return CDP_OK;
}

static cdp_status nccl_start(void *comm, void *dev_state, int coll, void *buf, size_t n, int dtype, int op,
                             const size_t *off, const size_t *len, double timeout_s, void **out)
{
    struct ncomm *m = (struct ncomm *)comm;
    struct cdp_cuda_state *d = (struct cdp_cuda_state *)dev_state;
    ncclComm_t c = m->c;
    if ((unsigned)coll >= CDP_NCCL_COLL_COUNT || (unsigned)op >= CDP_REDUCE_OP_COUNT ||
        (unsigned)dtype >= CDP_NCCL_DTYPE_COUNT || (coll != CDP_NCCL_ALLREDUCE && dtype != CDP_NCCL_F32))
        return host->fail(CDP_ERR_INVALID, "non-blocking collective %d: op %d / type %d unknown", coll, op, dtype);
    static const char *const calls[] = {"ncclAllReduce", "ncclReduceScatter", "ncclAllGather"};
    int rank = 0, size = 0;
    cdp_status st = nccl_rank_size(comm, &rank, &size);
    if (st) return st;
    CDP_CUDA_TRY(cudaSetDevice(m->device));
    /* NCCL takes no call on a communicator still issuing the previous one */
    struct waiter w;
    waiter_start(&w, timeout_s, 0);
    if ((st = wait_ready(c, &w, "issuing the previous operation"))) return st;
    struct nreq *q = (struct nreq *)calloc(1, sizeof *q);
    if (!q) return host->fail(CDP_ERR_NOMEM, "out of memory for a request");
    q->m = m;
    q->d = d;
    q->call = calls[coll];
    cudaError_t e = cudaEventCreateWithFlags(&q->ready, cudaEventDisableTiming);
    if (e != cudaSuccess) st = cuda_fail(e, "cudaEventCreateWithFlags");
    if (!st && (e = cudaEventCreateWithFlags(&q->done, cudaEventDisableTiming)) != cudaSuccess)
        st = cuda_fail(e, "cudaEventCreateWithFlags");
    /* the communicator's stream starts behind the kernels that made buf */
    if (!st && (e = cudaEventRecord(q->ready, d->stream)) != cudaSuccess)
        st = cuda_fail(e, "cudaEventRecord (on the compute stream)");
    if (!st && (e = cudaStreamWaitEvent(m->stream, q->ready, 0)) != cudaSuccess)
        st = cuda_fail(e, "cudaStreamWaitEvent (the communicator's stream behind the compute stream)");
    if (st) {
        nreq_free(q);
        return st;
    }
    ncclResult_t r = ncclSuccess;
    float *f = (float *)buf;
    if (coll == CDP_NCCL_ALLREDUCE) {
        r = ncclAllReduce(buf, buf, n, dtype == CDP_NCCL_F32 ? ncclFloat32 : ncclFloat64, red_ops[op], c, m->stream);
    } else if (!equal_shards(off, len, size)) {
        st = grouped_issue(c, m->stream, f, off, len, size, coll == CDP_NCCL_REDUCE_SCATTER, op);
        q->call = coll == CDP_NCCL_REDUCE_SCATTER ? "ncclGroupEnd (ncclReduce per shard)"
                                                  : "ncclGroupEnd (ncclBroadcast per shard)";
    } else if (coll == CDP_NCCL_REDUCE_SCATTER) {
        r = ncclReduceScatter(f, f + off[rank], len[rank], ncclFloat32, red_ops[op], c, m->stream);
    } else {
        r = ncclAllGather(f + off[rank], f, len[rank], ncclFloat32, c, m->stream);
    }
    if (!st && r != ncclSuccess && r != ncclInProgress) st = nccl_fail(r, c, q->call);
    int issued = 0;
    if (!st) st = nreq_record(q, &issued);
    if (st) {
        nreq_free(q);
        return st;
    }
    *out = q;
    return CDP_OK;
}

static cdp_status nccl_test(void *req, int *done)
{
    struct nreq *q = (struct nreq *)req;
    *done = 0;
    if (q->finished) {
        *done = 1;
        return CDP_OK;
    }
    int issued = 1;
    cdp_status st = q->recorded ? CDP_OK : nreq_record(q, &issued);
    if (st || !issued) return st;
    cudaError_t e = cudaEventQuery(q->done);
    if (e == cudaErrorNotReady) {
        /* a peer that died or a network error shows here, not on the event */
        ncclResult_t state = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(q->m->c, &state);
        if (r != ncclSuccess) return nccl_fail(r, q->m->c, "ncclCommGetAsyncError");
        if (state != ncclSuccess && state != ncclInProgress) return nccl_fail(state, q->m->c, q->call);
        return CDP_OK;
    }
    if (e != cudaSuccess) return cuda_fail(e, "cudaEventQuery (the collective's completion)");
    /* what the compute stream queues from now on (the optimizer) reads the
     * result: in stream order, the host does not wait */
    if ((e = cudaSetDevice(q->m->device)) != cudaSuccess) return cuda_fail(e, "cudaSetDevice");
    if ((e = cudaStreamWaitEvent(q->d->stream, q->done, 0)) != cudaSuccess)
        return cuda_fail(e, "cudaStreamWaitEvent (the compute stream behind the collective)");
    q->finished = 1;
    *done = 1;
    return CDP_OK;
}

static void nccl_release(void *req) { nreq_free((struct nreq *)req); }

static void nccl_abort(void *comm)
{
    struct ncomm *m = (struct ncomm *)comm;
    ncclResult_t r = ncclCommAbort(m->c);
    if (r != ncclSuccess)
        host->log(CDP_LOG_WARN, CDP_SUBSYS_COMM, "nccl: ncclCommAbort: %s", ncclGetErrorString(r));
    unwrap_free(m);
}

static cdp_status nccl_destroy(void *comm, double timeout_s)
{
    struct ncomm *m = (struct ncomm *)comm;
    ncclComm_t c = m->c;
    struct waiter w;
    waiter_start(&w, timeout_s, 0);
    ncclResult_t r = ncclCommFinalize(c);
    cdp_status st = CDP_OK;
    if (r != ncclSuccess && r != ncclInProgress) st = nccl_fail(r, c, "ncclCommFinalize");
    else st = wait_ready(c, &w, "ncclCommFinalize");
    if (st) {
        ncclCommAbort(c);
        unwrap_free(m);
        return st;
    }
    r = ncclCommDestroy(c);
    unwrap_free(m);
    return r == ncclSuccess ? CDP_OK : nccl_fail(r, NULL, "ncclCommDestroy");
}

extern "C" __attribute__((visibility("default"))) const struct cdp_nccl_ops cdp_nccl_module_ops = {
    nccl_version,
    nccl_unique_id,
    nccl_init,
    nccl_split,
    nccl_rank_size,
    nccl_allreduce,
    nccl_reduce_scatter,
    nccl_all_gather,
    nccl_p2p,
    nccl_start,
    nccl_test,
    nccl_release,
    nccl_abort,
    nccl_destroy,
};
