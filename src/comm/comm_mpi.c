/* The `mpi` communicator (Open MPI, host memory). Everything is non-blocking
 * underneath (MPI_Isend/Irecv, MPI_Iallreduce, MPI_Ireduce_scatter,
 * MPI_Iallgatherv, MPI_Ibarrier) and completed
 * through the front's deadline loop, so no call waits forever on a dead or
 * lost peer. Messages above the chunk size (1 GiB; MPI counts are int) travel
 * as several messages of the same tag, which MPI keeps in order. */
#include <limits.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "comm/comm_backend.h"

_Static_assert(sizeof(size_t) <= sizeof(uint64_t), "sizes travel as uint64");

static struct {
    int initialised_by_us; /* so we finalise only what we started */
    int live;              /* MPI communicators alive, the world's included */
    int broken;            /* a collective failed: MPI may still own a buffer */
    size_t chunk;          /* largest single message, bytes */
    MPI_Op bf16_sum;       /* the bf16 wire's sum (cdp_comm_bf16_sum); MPI_OP_NULL until first used */
} g = { 0, 0, 0, (size_t)1 << 30, MPI_OP_NULL };

struct mpi_comm {
    MPI_Comm comm;
    int broken; /* a collective on it failed or timed out */
};

/* One send or receive: one MPI request per chunk. */
struct mpi_req {
    int n, is_send;
    size_t bytes;
    MPI_Request *rq;
    MPI_Status *st;
};

static cdp_status mpi_fail(int rc, const char *fmt, ...) CDP_PRINTF(2, 3);
static cdp_status mpi_fail(int rc, const char *fmt, ...)
{
    char what[256], text[MPI_MAX_ERROR_STRING + 1];
    int len = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "unknown MPI error");
    text[len < 0 || len > MPI_MAX_ERROR_STRING ? 0 : len] = '\0';
    return cdp_fail(CDP_ERR_COMM, "%s: %s (MPI error %d)", what, text, rc);
}

int cdp_comm_mpi_active(void)
{
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    return init && !fin;
}

void cdp_comm_mpi_abort_world(int code)
{
    fflush(stdout);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
}

static cdp_status unusable(struct cdp_comm *c)
{
    (void)c;
    return cdp_fail(CDP_ERR_COMM,
                    "this communicator is unusable after an earlier collective failed or timed out "
                    "(end the job with cdp_comm_abort)");
}

static cdp_status wrap(MPI_Comm mc, struct cdp_comm **out)
{
    int rank = 0, size = 0, rc;
    if ((rc = MPI_Comm_set_errhandler(mc, MPI_ERRORS_RETURN)))
        return mpi_fail(rc, "MPI_Comm_set_errhandler");
    if ((rc = MPI_Comm_rank(mc, &rank))) return mpi_fail(rc, "MPI_Comm_rank");
    if ((rc = MPI_Comm_size(mc, &size))) return mpi_fail(rc, "MPI_Comm_size");
    struct mpi_comm *m = calloc(1, sizeof *m);
    struct cdp_comm *c = m ? cdp_comm_alloc(&cdp_comm_mpi_ops, rank, size, m) : NULL;
    if (!c) {
        free(m);
        return cdp_fail(CDP_ERR_NOMEM, "out of memory for a communicator");
    }
    m->comm = mc;
    g.live++;
    *out = c;
    return CDP_OK;
}

cdp_status cdp_comm_mpi_world(struct cdp_comm **out)
{
    int init = 0, fin = 0, rc;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (fin)
        return cdp_fail(CDP_ERR_COMM, "mpi: MPI is already finalised in this process (the world "
                                      "communicator can be created once per process)");
    if (!init) {
        int provided = 0;
        if ((rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided)))
            return mpi_fail(rc, "mpi: MPI_Init_thread");
        g.initialised_by_us = 1;
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        if (provided < MPI_THREAD_FUNNELED) {
            MPI_Finalize();
            return cdp_fail(CDP_ERR_COMM, "mpi: MPI_Init_thread: this MPI gives thread level %d, "
                                          "the library needs MPI_THREAD_FUNNELED", provided);
        }
    }
    const char *v = getenv("CDP_COMM_CHUNK_BYTES");
    if (v && *v) {
        unsigned long long b = strtoull(v, NULL, 10);
        if (b > 0 && b <= INT_MAX) g.chunk = (size_t)b;
    }
    MPI_Comm dup;
    cdp_status st;
    if ((rc = MPI_Comm_dup(MPI_COMM_WORLD, &dup))) {
        st = mpi_fail(rc, "mpi: MPI_Comm_dup(MPI_COMM_WORLD)");
        goto fail;
    }
    struct cdp_comm *c = NULL;
    if ((st = wrap(dup, &c))) {
        MPI_Comm_free(&dup);
        goto fail;
    }
    c->is_world = 1;
    *out = c;
    return CDP_OK;
fail:
    if (g.initialised_by_us) {
        MPI_Finalize();
        g.initialised_by_us = 0;
    }
    return st;
}

static void mpi_free(struct cdp_comm *c)
{
    struct mpi_comm *m = c->impl;
    if (c->is_world)
        CDP_ASSERT(g.live == 1 && "free every split communicator before the world");
    MPI_Comm_free(&m->comm);
    g.live--;
    free(m);
    if (!c->is_world || !g.initialised_by_us) return;
    if (g.bf16_sum != MPI_OP_NULL) MPI_Op_free(&g.bf16_sum);
    if (g.broken) {
        /* MPI_Finalize with a collective still in flight may wait forever */
        CDP_WARN(COMM, "mpi: not finalising MPI after a failed collective; end the job with cdp_comm_abort");
        return;
    }
    int rc = MPI_Finalize();
    if (rc) {
        mpi_fail(rc, "mpi: MPI_Finalize");
        CDP_WARN(COMM, "%s", cdp_last_error());
    }
    g.initialised_by_us = 0;
}

static cdp_status mpi_split(struct cdp_comm *c, int color, int key, struct cdp_comm **out)
{
    struct mpi_comm *m = c->impl;
    if (m->broken) return unusable(c);
    MPI_Comm nc = MPI_COMM_NULL;
    int rc = MPI_Comm_split(m->comm, color < 0 ? MPI_UNDEFINED : color, key, &nc);
    if (rc) return mpi_fail(rc, "MPI_Comm_split");
    if (nc == MPI_COMM_NULL) {
        *out = NULL;
        return CDP_OK;
    }
    cdp_status st = wrap(nc, out);
    if (st) MPI_Comm_free(&nc);
    return st;
}

/* ---- requests ------------------------------------------------------------------ */

struct req_set {
    int n;
    MPI_Request *rq;
    MPI_Status *st; /* may be NULL: MPI_STATUSES_IGNORE */
    const char *call;
};

/* MPI_Test one request at a time rather than MPI_Testall: Open MPI 4.1
 * reports a truncated receive through MPI_Test's return code but leaves
 * MPI_ERROR in the status at MPI_SUCCESS, which MPI_ERR_IN_STATUS would hide. */
static cdp_status testall(void *arg, int *done)
{
    struct req_set *s = arg;
    int all = 1;
    for (int i = 0; i < s->n; i++) {
        if (s->rq[i] == MPI_REQUEST_NULL) continue;
        int flag = 0;
        int rc = MPI_Test(&s->rq[i], &flag, s->st ? &s->st[i] : MPI_STATUS_IGNORE);
        if (rc) return mpi_fail(rc, "%s", s->call);
        all &= flag;
    }
    *done = all;
    return CDP_OK;
}

static cdp_status req_post(struct mpi_comm *m, int is_send, void *buf, size_t bytes, int peer,
                           int tag, struct mpi_req **out)
{
    size_t n = bytes == 0 ? 1 : (bytes - 1) / g.chunk + 1;
    if (n > INT_MAX) return cdp_fail(CDP_ERR_INVALID, "%zu bytes is too large a message", bytes);
    struct mpi_req *q = calloc(1, sizeof *q);
    if (q) {
        q->rq = malloc(n * sizeof *q->rq);
        q->st = malloc(n * sizeof *q->st);
    }
    if (!q || !q->rq || !q->st) {
        if (q) free(q->rq), free(q->st);
        free(q);
        return cdp_fail(CDP_ERR_NOMEM, "out of memory for a request");
    }
    q->is_send = is_send;
    q->bytes = bytes;
    for (size_t i = 0; i < n; i++) q->rq[i] = MPI_REQUEST_NULL;
    char *p = buf;
    for (size_t i = 0; i < n; i++) {
        size_t off = i * g.chunk;
        int len = (int)(bytes - off < g.chunk ? bytes - off : g.chunk);
        int rc = is_send ? MPI_Isend(p + off, len, MPI_BYTE, peer, tag, m->comm, &q->rq[i])
                         : MPI_Irecv(p + off, len, MPI_BYTE, peer, tag, m->comm, &q->rq[i]);
        q->n = (int)i + 1;
        if (rc) {
            cdp_status st = mpi_fail(rc, is_send ? "MPI_Isend" : "MPI_Irecv");
            for (int k = 0; k < q->n; k++)
                if (q->rq[k] != MPI_REQUEST_NULL) {
                    if (!is_send) MPI_Cancel(&q->rq[k]);
                    MPI_Request_free(&q->rq[k]);
                }
            free(q->rq), free(q->st), free(q);
            return st;
        }
    }
    *out = q;
    return CDP_OK;
}

static cdp_status req_test(struct mpi_req *q, int *done)
{
    struct req_set s = { q->n, q->rq, q->st, q->is_send ? "MPI_Test (send)" : "MPI_Test (receive)" };
    cdp_status st = testall(&s, done);
    if (st || !*done || q->is_send) return st;
    size_t got = 0;
    for (int i = 0; i < q->n; i++) {
        int k = 0;
        MPI_Get_count(&q->st[i], MPI_BYTE, &k);
        got += k > 0 ? (size_t)k : 0;
    }
    if (got != q->bytes)
        return cdp_fail(CDP_ERR_COMM, "expected %zu bytes, the matching send had %zu", q->bytes, got);
    return CDP_OK;
}

static cdp_status req_test_cb(void *arg, int *done) { return req_test(arg, done); }

/* A receive that was never matched is cancelled; a send (MPI cannot cancel
 * one) or a receive caught mid-transfer is left to MPI to finish. */
static void req_free(struct mpi_req *q)
{
    if (!q) return;
    for (int i = 0; i < q->n; i++) {
        if (q->rq[i] == MPI_REQUEST_NULL) continue;
        if (!q->is_send) {
            MPI_Cancel(&q->rq[i]);
            int flag = 0;
            uint64_t t0 = cdp_time_ns();
            while (!flag && cdp_time_ns() - t0 < 100000000u)
                if (MPI_Test(&q->rq[i], &flag, MPI_STATUS_IGNORE)) break;
        }
        if (q->rq[i] != MPI_REQUEST_NULL) MPI_Request_free(&q->rq[i]);
    }
    free(q->rq);
    free(q->st);
    free(q);
}

static cdp_status mpi_isend(struct cdp_comm *c, struct cdp_request *r)
{
    struct mpi_comm *m = c->impl;
    if (m->broken) return unusable(c);
    return req_post(m, 1, r->buf, r->bytes, r->peer, r->tag, (struct mpi_req **)&r->impl);
}

static cdp_status mpi_irecv(struct cdp_comm *c, struct cdp_request *r)
{
    struct mpi_comm *m = c->impl;
    if (m->broken) return unusable(c);
    return req_post(m, 0, r->buf, r->bytes, r->peer, r->tag, (struct mpi_req **)&r->impl);
}

static cdp_status coll_test(struct cdp_request *r, int *done);
static void coll_release(struct cdp_request *r);

static cdp_status mpi_test(struct cdp_request *r, int *done)
{
    return r->kind == CDP_REQ_P2P ? req_test(r->impl, done) : coll_test(r, done);
}

static void mpi_release(struct cdp_request *r)
{
    if (r->kind != CDP_REQ_P2P) {
        coll_release(r);
        return;
    }
    req_free(r->impl);
    r->impl = NULL;
}

/* ---- collectives ------------------------------------------------------------------ */

/* Polls a set of collective requests; on failure the communicator is marked
 * unusable, because MPI offers no way to cancel a collective and may still
 * write the caller's buffer. */
static cdp_status finish_collective(struct mpi_comm *m, struct req_set *s, uint64_t t0, double timeout_s,
                                    size_t bytes)
{
    cdp_status st = cdp_comm_poll(testall, s, t0, timeout_s, bytes, CDP_COMM_SPIN_COLL_GBPS);
    if (st) m->broken = g.broken = 1;
    return st;
}

/* An average is the sum over the ranks divided by their number, here on the
 * host (MPI has no average): the all-reduce and the reduce-scatter both
 * divide through this, so that their averages are equal where their sums are. */
static void average(void *buf, size_t n, enum cdp_comm_dtype dt, int size)
{
    if (size <= 1) return;
    if (dt == CDP_COMM_F32) {
        float *f = buf, k = (float)size;
        for (size_t i = 0; i < n; i++) f[i] /= k;
    } else if (dt == CDP_COMM_F64) {
        double *d = buf, k = (double)size;
        for (size_t i = 0; i < n; i++) d[i] /= k;
    }
}

/* ---- ZeRO's shards ---------------------------------------------------------------- */

/* The reduce-scatter and the all-gather move a buffer in pieces of at most
 * the chunk size (MPI counts are int), all posted at once; collectives on one
 * communicator complete in order. Piece i is elements [i * per, i * per + per)
 * of buf (the last one shorter), and rank k's part of it is where it meets
 * k's shard: shards are contiguous and in rank order, so the parts of a piece
 * are too, and counts[i * size + k] / displs[i * size + k] (relative to the
 * piece's start) are what MPI is given. */
struct pieces {
    size_t per; /* elements in a piece */
    int n;
    int *counts, *displs;
    MPI_Request *rq;
};

static void pieces_free(struct pieces *p, int in_flight)
{
    /* MPI may read the counts until the operations complete, which after a
     * failure or timeout may be never: then they are left behind */
    if (!in_flight) {
        free(p->counts);
        free(p->displs);
    }
    free(p->rq);
}

/* Pieces of the window [from, from + count) of an n-float buffer sharded by
 * cdp_comm_shard: counts and displacements are within the window (whose first
 * float is piece 0's first). */
static cdp_status pieces_make(const struct cdp_comm *c, size_t n, size_t from, size_t count, size_t esize,
                               struct pieces *p)
{
    size_t per = g.chunk / esize ? g.chunk / esize : 1;
    size_t np = (count - 1) / per + 1, size = (size_t)(unsigned)c->size;
    if (np > INT_MAX || np > SIZE_MAX / sizeof(int) / size)
        return cdp_fail(CDP_ERR_INVALID, "%zu floats is too large a buffer", count);
    p->per = per;
    p->n = (int)np;
    p->counts = malloc(np * size * sizeof *p->counts);
    p->displs = malloc(np * size * sizeof *p->displs);
    p->rq = malloc(np * sizeof *p->rq);
    if (!p->counts || !p->displs || !p->rq) {
        pieces_free(p, 0);
        return cdp_fail(CDP_ERR_NOMEM, "out of memory for %zu pieces", np);
    }
    for (size_t k = 0; k < size; k++) {
        uint64_t off = 0, len = 0; /* the shard within the window, in the window's coordinates */
        cdp_shard_in_window(n, c->size, (int)k, from, count, &off, &len);
        for (size_t i = 0; i < np; i++) {
            size_t lo = i * per, hi = count - lo < per ? count : lo + per;
            size_t a = off > lo ? off : lo, b = off + len < hi ? off + len : hi;
            p->counts[i * size + k] = a < b ? (int)(b - a) : 0;
            p->displs[i * size + k] = a < b ? (int)(a - lo) : 0;
        }
    }
    return CDP_OK;
}

/* The bf16 wire's sum as an MPI op (commutative: every pair is added in fp32
 * and rounded the same way whichever side holds it). */
static void bf16_sum_op(void *in, void *inout, int *len, MPI_Datatype *type)
{
    (void)type;
    cdp_comm_bf16_sum(in, inout, *len > 0 ? (size_t)*len : 0);
}

static size_t elem_size(enum cdp_comm_dtype dt)
{
    return dt == CDP_COMM_BF16 ? 2 : dt == CDP_COMM_F32 ? sizeof(float) : 8;
}

/* The MPI type of r's elements, and for bf16 its sum (made once). */
static cdp_status datatype_of(const struct cdp_request *r, MPI_Datatype *type, MPI_Op *mop)
{
    switch (r->dt) {
    case CDP_COMM_F32: *type = MPI_FLOAT; return CDP_OK;
    case CDP_COMM_F64: *type = MPI_DOUBLE; return CDP_OK;
    case CDP_COMM_U64: *type = MPI_UINT64_T; return CDP_OK;
    case CDP_COMM_BF16: {
        *type = MPI_UINT16_T;
        if (r->op != CDP_REDUCE_SUM && r->kind != CDP_REQ_ALLGATHER)
            return cdp_fail(CDP_ERR_INTERNAL, "mpi: bf16 collectives sum only");
        int rc;
        if (g.bf16_sum == MPI_OP_NULL && (rc = MPI_Op_create(bf16_sum_op, 1, &g.bf16_sum)))
            return mpi_fail(rc, "MPI_Op_create (bf16 sum)");
        *mop = g.bf16_sum;
        return CDP_OK;
    }
    case CDP_COMM_DTYPE_COUNT: break;
    }
    return cdp_fail(CDP_ERR_INTERNAL, "mpi: unknown element type %d", (int)r->dt);
}

/* ---- non-blocking collectives ------------------------------------------------------ */

/* One collective: its MPI requests (one per piece of at most the chunk size),
 * and for the reduce-scatter and all-gather the pieces' counts. */
struct mpi_coll {
    struct req_set s;
    struct pieces p;
    MPI_Request one;
    int has_pieces;
};

static cdp_status coll_posted(struct mpi_comm *m, struct mpi_coll *q, int rc, const char *call)
{
    if (!rc) {
        q->s.n++;
        return CDP_OK;
    }
    m->broken = g.broken = 1; /* the ranks no longer agree on the collectives posted */
    return mpi_fail(rc, "%s", call);
}

static cdp_status mpi_icoll(struct cdp_comm *c, struct cdp_request *r)
{
    struct mpi_comm *m = c->impl;
    if (m->broken) return unusable(c);
    struct mpi_coll *q = calloc(1, sizeof *q);
    if (!q) return cdp_fail(CDP_ERR_NOMEM, "out of memory for a request");
    cdp_status st = CDP_OK;
    size_t size = (size_t)(unsigned)c->size;
    MPI_Datatype type;
    MPI_Op mop = r->op == CDP_REDUCE_MAX ? MPI_MAX : MPI_SUM;
    if ((st = datatype_of(r, &type, &mop))) {
        free(q);
        return st;
    }
    const size_t esize = elem_size(r->dt);
    if (r->kind == CDP_REQ_ALLREDUCE) {
        size_t per = g.chunk / esize ? g.chunk / esize : 1, n = r->n;
        size_t nchunks = (n - 1) / per + 1;
        if (nchunks > INT_MAX) {
            free(q);
            return cdp_fail(CDP_ERR_INVALID, "too many elements");
        }
        q->s.rq = nchunks == 1 ? &q->one : malloc(nchunks * sizeof *q->s.rq);
        if (!q->s.rq) {
            free(q);
            return cdp_fail(CDP_ERR_NOMEM, "out of memory for %zu requests", nchunks);
        }
        q->s.call = "MPI_Iallreduce (test)";
        for (size_t i = 0; i < nchunks && !st; i++) {
            size_t off = i * per;
            int cnt = (int)(n - off < per ? n - off : per);
            st = coll_posted(m, q, MPI_Iallreduce(MPI_IN_PLACE, (char *)r->buf + off * esize, cnt, type, mop, m->comm,
                                                  &q->s.rq[i]), "MPI_Iallreduce");
        }
    } else {
        const int rs = r->kind == CDP_REQ_REDUCE_SCATTER;
        if ((st = pieces_make(c, r->n, rs ? r->from : 0, rs ? r->count : r->n, esize, &q->p))) {
            free(q);
            return st;
        }
        q->has_pieces = 1;
        q->s.rq = q->p.rq;
        q->s.call = rs ? "MPI_Ireduce_scatter (test)" : "MPI_Iallgatherv (test)";
        char *buf = r->buf;
        for (int i = 0; i < q->p.n && !st; i++) {
            char *piece = buf + (size_t)i * q->p.per * esize;
            const int *counts = q->p.counts + (size_t)i * size, *displs = q->p.displs + (size_t)i * size;
            /* in place: each rank's part is already where the others' parts go */
            st = rs ? coll_posted(m, q, MPI_Ireduce_scatter(MPI_IN_PLACE, piece, counts, type, mop, m->comm,
                                                            &q->p.rq[i]), "MPI_Ireduce_scatter")
                    : coll_posted(m, q, MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, piece, counts, displs,
                                                        type, m->comm, &q->p.rq[i]), "MPI_Iallgatherv");
        }
    }
    r->impl = q;
    return st; /* on failure the front frees r; release then never runs: leave q to MPI */
}

/* What a completed collective still does on the host: the average's division,
 * and a reduce-scatter's parts moved to their places. */
static void coll_finish(struct cdp_comm *c, struct cdp_request *r, struct mpi_coll *q)
{
    if (r->kind == CDP_REQ_ALLREDUCE) {
        if (r->op == CDP_REDUCE_AVG) average(r->buf, r->n, r->dt, c->size);
        return;
    }
    if (r->kind != CDP_REQ_REDUCE_SCATTER) return;
    size_t size = (size_t)(unsigned)c->size, me = (size_t)(unsigned)c->rank, esize = elem_size(r->dt);
    char *buf = r->buf;
    /* in place, MPI leaves a piece's reduced part at the piece's start: move
     * it to where it belongs */
    for (int i = 0; i < q->p.n; i++) {
        size_t at = (size_t)q->p.displs[(size_t)i * size + me], cnt = (size_t)q->p.counts[(size_t)i * size + me];
        char *piece = buf + (size_t)i * q->p.per * esize;
        if (cnt && at) memmove(piece + at * esize, piece, cnt * esize);
    }
    if (r->op == CDP_REDUCE_AVG) {
        uint64_t at = 0, len = 0;
        cdp_shard_in_window(r->n, c->size, c->rank, r->from, r->count, &at, &len);
        if (len) average((float *)(void *)buf + at, (size_t)len, CDP_COMM_F32, c->size);
    }
}

static cdp_status coll_test(struct cdp_request *r, int *done)
{
    struct mpi_coll *q = r->impl;
    struct mpi_comm *m = r->comm->impl;
    cdp_status st = testall(&q->s, done);
    if (st) {
        m->broken = g.broken = 1;
        return st;
    }
    if (*done) coll_finish(r->comm, r, q);
    return CDP_OK;
}

/* A collective that has not completed (past its deadline, or failed) cannot
 * be cancelled: MPI may still write its buffer and read its counts, so the
 * communicator is marked unusable and the counts are left behind. */
static void coll_release(struct cdp_request *r)
{
    struct mpi_coll *q = r->impl;
    struct mpi_comm *m = r->comm->impl;
    if (!r->done) m->broken = g.broken = 1;
    if (q->has_pieces) pieces_free(&q->p, !r->done);
    else if (q->s.rq != &q->one) free(q->s.rq);
    free(q);
    r->impl = NULL;
}

static cdp_status mpi_barrier(struct cdp_comm *c, double timeout_s)
{
    struct mpi_comm *m = c->impl;
    if (m->broken) return unusable(c);
    uint64_t t0 = cdp_time_ns();
    MPI_Request rq;
    int rc = MPI_Ibarrier(m->comm, &rq);
    if (rc) return mpi_fail(rc, "MPI_Ibarrier");
    struct req_set s = { 1, &rq, NULL, "MPI_Ibarrier (test)" };
    return finish_collective(m, &s, t0, timeout_s, 0);
}

/* Gather: the sizes with MPI_Igather, then the bytes point to point on a tag
 * above the user range (MPI_Igatherv counts and displacements are int). */
static cdp_status mpi_gather(struct cdp_comm *c, const void *buf, size_t bytes, void **out,
                             size_t **lens, double timeout_s)
{
    struct mpi_comm *m = c->impl;
    if (m->broken) return unusable(c);
    uint64_t t0 = cdp_time_ns();
    uint64_t mine = bytes, *sizes = NULL;
    size_t nranks = (size_t)(unsigned)c->size;
    int root = c->rank == 0;
    cdp_status st = CDP_OK;
    char *data = NULL;
    size_t *l = NULL;
    struct mpi_req **qs = NULL;
    if (root && !(sizes = malloc(nranks * sizeof *sizes)))
        return cdp_fail(CDP_ERR_NOMEM, "out of memory for %d sizes", c->size);
    MPI_Request rq;
    int rc = MPI_Igather(&mine, 1, MPI_UINT64_T, sizes, 1, MPI_UINT64_T, 0, m->comm, &rq);
    if (rc) {
        st = mpi_fail(rc, "MPI_Igather (sizes)");
        goto done;
    }
    struct req_set s = { 1, &rq, NULL, "MPI_Igather (test)" };
    if ((st = finish_collective(m, &s, t0, timeout_s, 0))) goto done;

    if (!root) {
        struct mpi_req *q = NULL;
        if ((st = req_post(m, 1, (void *)(uintptr_t)buf, bytes, 0, CDP_COMM_TAG_GATHER, &q))) goto done;
        st = cdp_comm_poll(req_test_cb, q, t0, timeout_s, bytes, CDP_COMM_SPIN_P2P_GBPS);
        req_free(q);
        goto done;
    }
    size_t total = 0;
    for (int i = 0; i < c->size; i++) {
        if (sizes[i] > SIZE_MAX - total) {
            st = cdp_fail(CDP_ERR_INVALID, "the gathered sizes overflow size_t");
            goto done;
        }
        total += sizes[i];
    }
    data = malloc(total ? total : 1);
    l = malloc(nranks * sizeof *l);
    qs = calloc(nranks, sizeof *qs);
    if (!data || !l || !qs) {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory for %zu gathered bytes", total);
        goto done;
    }
    size_t off = 0;
    for (int i = 0; i < c->size; i++) {
        l[i] = sizes[i];
        if (i == 0) {
            if (bytes) memcpy(data, buf, bytes);
        } else if ((st = req_post(m, 0, data + off, l[i], i, CDP_COMM_TAG_GATHER, &qs[i]))) {
            goto done;
        }
        off += l[i];
    }
    for (int i = 1; i < c->size; i++)
        if ((st = cdp_comm_poll(req_test_cb, qs[i], t0, timeout_s, l[i], CDP_COMM_SPIN_P2P_GBPS)))
            goto done;
done:
    if (qs)
        for (int i = 0; i < c->size; i++) req_free(qs[i]);
    free(qs);
    free(sizes);
    if (st) {
        free(data);
        free(l);
        return st;
    }
    *out = data;
    *lens = l;
    return CDP_OK;
}

/* Broadcast in chunks of at most the chunk size (MPI counts are int), all
 * posted at once; collectives on one communicator complete in order. */
static cdp_status mpi_bcast(struct cdp_comm *c, void *buf, size_t bytes, int root, double timeout_s)
{
    struct mpi_comm *m = c->impl;
    if (m->broken) return unusable(c);
    if (bytes == 0) return CDP_OK;
    uint64_t t0 = cdp_time_ns();
    size_t nchunks = (bytes - 1) / g.chunk + 1;
    if (nchunks > INT_MAX) return cdp_fail(CDP_ERR_INVALID, "%zu bytes is too large a broadcast", bytes);
    MPI_Request one, *rq = nchunks == 1 ? &one : malloc(nchunks * sizeof *rq);
    if (!rq) return cdp_fail(CDP_ERR_NOMEM, "out of memory for %zu requests", nchunks);
    struct req_set s = { 0, rq, NULL, "MPI_Ibcast (test)" };
    cdp_status st = CDP_OK;
    for (size_t i = 0; i < nchunks; i++) {
        size_t off = i * g.chunk;
        int len = (int)(bytes - off < g.chunk ? bytes - off : g.chunk);
        int rc = MPI_Ibcast((char *)buf + off, len, MPI_BYTE, root, m->comm, &rq[i]);
        if (rc) {
            st = mpi_fail(rc, "MPI_Ibcast");
            m->broken = g.broken = 1; /* the ranks no longer agree on the collectives posted */
            break;
        }
        s.n++;
    }
    if (!st) st = finish_collective(m, &s, t0, timeout_s, bytes);
    if (rq != &one) free(rq);
    return st;
}

static void mpi_abort(struct cdp_comm *c, int code)
{
    (void)c;
    cdp_comm_mpi_abort_world(code);
}

const struct cdp_comm_ops cdp_comm_mpi_ops = {
    .name = "mpi",
    .memory = CDP_COMM_HOST_MEMORY,
    .split = mpi_split,
    .icoll = mpi_icoll,
    .isend = mpi_isend,
    .irecv = mpi_irecv,
    .test = mpi_test,
    .release = mpi_release,
    .barrier = mpi_barrier,
    .gather_bytes = mpi_gather,
    .bcast_bytes = mpi_bcast,
    .abort = mpi_abort,
    .free = mpi_free,
};
