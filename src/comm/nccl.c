/* The nccl backend of the one communicator interface (comm/comm_backend.h):
 * bootstraps the world through the host communicator, keeps the registry
 * that cdp_nccl_abort_all() walks, and lends the front (comm.c, which checks
 * every argument and writes every message) NCCL's collectives and batches of
 * sends and receives on device memory. Each communicator keeps the host
 * communicator of the same group beside it (cdp_comm_host). NCCL itself is
 * behind the CUDA module's table (comm/cuda/nccl.cu), which runs every
 * deadline. */
#include "comm/nccl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "comm/comm_backend.h"
#include "device/backend.h"

/* The backend's state of one communicator (struct cdp_comm's impl). */
struct cdp_nccl {
    struct cdp_comm *self;
    const struct cdp_nccl_ops *ops;
    cdp_device_t dev;   /* not owned */
    void *state;        /* dev's backend state */
    void *comm;         /* ncclComm_t; NULL once aborted */
    double timeout_s;   /* of split and free */
    int host_owned;     /* self->host was split for this one (the world's is the caller's) */
    int broken;         /* an operation failed or timed out: it may still run */
    int aborted;
    struct cdp_nccl *prev, *next; /* the registry, newest first */
};

/* Every communicator not yet freed, for cdp_nccl_abort_all. */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cdp_nccl *registry;

static void registry_add(struct cdp_nccl *c)
{
    pthread_mutex_lock(&registry_lock);
    c->prev = NULL;
    c->next = registry;
    if (registry) registry->prev = c;
    registry = c;
    pthread_mutex_unlock(&registry_lock);
}

static void registry_remove(struct cdp_nccl *c)
{
    pthread_mutex_lock(&registry_lock);
    if (c->prev) c->prev->next = c->next;
    else registry = c->next;
    if (c->next) c->next->prev = c->prev;
    c->prev = c->next = NULL;
    pthread_mutex_unlock(&registry_lock);
}

/* ---- can this process use NCCL? ------------------------------------------------- */

static const char built_without[] =
    "the cuda module was built without NCCL (install NCCL's headers and library, "
    "then reconfigure with -Dnccl=enabled)";

/* The CUDA module's NCCL table; NULL when it was built without NCCL. */
static cdp_status module_ops(const struct cdp_nccl_ops **ops)
{
    const void *sym = NULL;
    cdp_status st = cdp_device_module_symbol("cuda", CDP_NCCL_MODULE_SYMBOL, &sym);
    *ops = (const struct cdp_nccl_ops *)sym;
    return st;
}

cdp_status cdp_nccl_available(void)
{
    const struct cdp_device_backend *be = NULL;
    const struct cdp_nccl_ops *ops = NULL;
    /* the loader's and CUDA's messages say what is missing; any failure here
     * means "not on this machine" */
    if (cdp_device_module_load("cuda", &be) || module_ops(&ops))
        return cdp_error_context(CDP_ERR_UNSUPPORTED, "nccl: unavailable");
    if (!ops) return cdp_fail(CDP_ERR_UNSUPPORTED, "nccl: unavailable: %s", built_without);
    int n = 0;
    if (be->count(&n)) return cdp_error_context(CDP_ERR_UNSUPPORTED, "nccl: unavailable");
    if (n < 1) return cdp_fail(CDP_ERR_UNSUPPORTED, "nccl: unavailable: no usable GPU");
    return CDP_OK;
}

cdp_status cdp_nccl_version(int *out)
{
    if (!out) return cdp_fail(CDP_ERR_INVALID, "cdp_nccl_version: out is NULL");
    const struct cdp_nccl_ops *ops = NULL;
    if (module_ops(&ops)) return cdp_error_context(CDP_ERR_UNSUPPORTED, "nccl");
    if (!ops) return cdp_fail(CDP_ERR_UNSUPPORTED, "nccl: %s", built_without);
    int v = 0;
    cdp_status st = ops->version(&v);
    if (st) return cdp_error_context(st, "nccl");
    *out = v;
    return CDP_OK;
}

/* This rank's NCCL table and device state, or why there is none. */
static cdp_status local_nccl(cdp_device_t dev, const struct cdp_nccl_ops **ops, void **state)
{
    if (!dev) {
        cdp_status st = cdp_nccl_available();
        if (st) return st;
        return cdp_fail(CDP_ERR_INVALID, "nccl: no device given (the rank's CUDA device is needed)");
    }
    if (cdp_device_backend_of(dev) != CDP_BACKEND_CUDA)
        return cdp_fail(CDP_ERR_UNSUPPORTED, "nccl: needs a CUDA device, got %s (the nccl communicator "
                        "carries GPU memory; CPU ranks use the mpi communicator)", cdp_device_name(dev));
    if (module_ops(ops)) return cdp_error_context(CDP_ERR_UNSUPPORTED, "nccl");
    if (!*ops) return cdp_fail(CDP_ERR_UNSUPPORTED, "nccl: unavailable on %s: %s", cdp_device_name(dev), built_without);
    *state = cdp_device_kernel_state(dev);
    return CDP_OK;
}

/* All ranks of host learn whether any failed: 0 when none did, else the
 * lowest rank that did (+1). A failed agreement is returned as a status. */
static cdp_status agree(cdp_comm_t host, int failed, double timeout_s, int *first_failed)
{
    int size = cdp_comm_size(host);
    double v = failed ? (double)(size - cdp_comm_rank(host)) : 0.0;
    cdp_status st = cdp_comm_allreduce_f64(host, &v, 1, CDP_REDUCE_MAX, timeout_s);
    if (st) return st;
    *first_failed = v > 0 ? size - (int)v + 1 : 0;
    return CDP_OK;
}

static struct cdp_comm *wrap(const struct cdp_nccl_ops *ops, cdp_device_t dev, void *state, void *comm,
                             int rank, int size, double timeout_s, const char *label, struct cdp_comm *host,
                             int host_owned)
{
    struct cdp_nccl *n = calloc(1, sizeof *n);
    struct cdp_comm *c = n ? cdp_comm_alloc(&cdp_comm_nccl_ops, rank, size, n) : NULL;
    if (!c) {
        free(n);
        return NULL;
    }
    n->self = c;
    n->ops = ops;
    n->dev = dev;
    n->state = state;
    n->comm = comm;
    n->timeout_s = timeout_s;
    n->host_owned = host_owned;
    snprintf(c->name, sizeof c->name, "%s", label);
    c->host = host;
    registry_add(n);
    return c;
}

cdp_status cdp_nccl_world(cdp_comm_t host, cdp_device_t dev, double timeout_s, cdp_nccl_t *out)
{
    if (!host || !out) return cdp_fail(CDP_ERR_INVALID, "cdp_nccl_world: NULL host communicator or out");
    const int rank = cdp_comm_rank(host), size = cdp_comm_size(host);
    const struct cdp_nccl_ops *ops = NULL;
    void *state = NULL, *comm = NULL;
    unsigned char id[CDP_NCCL_ID_BYTES];
    char why[768] = "";
    int first = 0;
    cdp_status st;

    /* 1. can every rank take part? rank 0 also makes the id */
    cdp_status mine = local_nccl(dev, &ops, &state);
    if (!mine && rank == 0 && (mine = ops->unique_id(id)))
        cdp_error_context(mine, "nccl: ncclGetUniqueId");
    if (mine) snprintf(why, sizeof why, "%s", cdp_last_error());
    if ((st = agree(host, mine != CDP_OK, timeout_s, &first)))
        return cdp_error_context(st, "nccl rank %d/%d: agreeing on NCCL's availability", rank, size);
    if (mine) return cdp_fail(mine, "%s", why);
    if (first)
        return cdp_fail(CDP_ERR_UNSUPPORTED, "nccl rank %d/%d: rank %d cannot use NCCL (its message says "
                        "why); no rank made a communicator", rank, size, first - 1);

    /* 2. the id travels through the host world */
    if ((st = cdp_comm_bcast_bytes(host, id, sizeof id, 0, timeout_s)))
        return cdp_error_context(st, "nccl rank %d/%d: receiving NCCL's unique id", rank, size);

    /* 3. every rank makes its member, then all agree it worked */
    mine = ops->init(state, id, size, rank, timeout_s, &comm);
    if (mine) {
        cdp_error_context(mine, "nccl rank %d/%d on %s: creating the world communicator", rank, size,
                          cdp_device_name(dev));
        snprintf(why, sizeof why, "%s", cdp_last_error());
        comm = NULL; /* the module aborted it */
    }
    int nrank = -1, nsize = -1;
    if (!mine && (mine = ops->rank_size(comm, &nrank, &nsize)))
        snprintf(why, sizeof why, "nccl rank %d/%d: %s", rank, size, cdp_last_error());
    if (!mine && (nrank != rank || nsize != size)) {
        mine = cdp_fail(CDP_ERR_INTERNAL, "nccl rank %d/%d: NCCL says rank %d of %d", rank, size, nrank, nsize);
        snprintf(why, sizeof why, "%s", cdp_last_error());
    }
    st = agree(host, mine != CDP_OK, timeout_s, &first);
    if (st || mine || first) {
        if (comm) ops->abort(comm);
        if (mine) return cdp_fail(mine, "%s", why);
        if (st) return cdp_error_context(st, "nccl rank %d/%d: agreeing on the world communicator", rank, size);
        return cdp_fail(CDP_ERR_COMM, "nccl rank %d/%d: rank %d failed to create its member of the world "
                        "communicator (its message says why); this rank's was aborted", rank, size, first - 1);
    }
    struct cdp_comm *c = wrap(ops, dev, state, comm, rank, size, timeout_s, "nccl", host, 0);
    if (!c) {
        ops->abort(comm);
        return cdp_fail(CDP_ERR_NOMEM, "nccl rank %d/%d: out of memory", rank, size);
    }
    CDP_DEBUG(COMM, "nccl world: rank %d of %d on %s", rank, size, cdp_device_name(dev));
    *out = c;
    return CDP_OK;
}

/* ---- the backend ----------------------------------------------------------------- */

/* CDP_OK when c may run another operation; else why not. */
static cdp_status usable(struct cdp_nccl *c)
{
    if (c->aborted)
        return cdp_fail(CDP_ERR_COMM, "this communicator was aborted (cdp_nccl_abort_all)");
    if (c->broken)
        return cdp_fail(CDP_ERR_COMM, "this communicator is unusable after an earlier operation failed or "
                        "timed out (end the job: cdp_nccl_abort_all, then cdp_comm_abort)");
    return CDP_OK;
}

/* An operation's status; a failure leaves c broken (it may still run). */
static cdp_status ran(struct cdp_nccl *c, cdp_status st)
{
    if (st) c->broken = 1;
    return st;
}

static cdp_status nccl_split(struct cdp_comm *pc, int color, int key, struct cdp_comm **out)
{
    struct cdp_nccl *c = pc->impl;
    cdp_status st = usable(c);
    void *comm = NULL;
    int rank = -1, size = -1;
    if (!st) st = ran(c, c->ops->split(c->comm, color, key, c->timeout_s, &comm));
    if (!st && comm && (st = c->ops->rank_size(comm, &rank, &size))) c->ops->abort(comm);
    if (st) return st;
    /* the host group of the same ranks, for the host values beside */
    struct cdp_comm *host = NULL;
    if ((st = cdp_comm_split(pc->host, color, key, &host))) {
        if (comm) c->ops->abort(comm);
        return st;
    }
    if (!comm) {
        *out = NULL;
        return CDP_OK;
    }
    char label[40];
    snprintf(label, sizeof label, "nccl[color %d]", color);
    struct cdp_comm *n = wrap(c->ops, c->dev, c->state, comm, rank, size, c->timeout_s, label, host, 1);
    if (!n) {
        c->ops->abort(comm);
        cdp_comm_free(host);
        return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    }
    CDP_DEBUG(COMM, "%s: rank %d of %d (from %s rank %d of %d)", n->name, rank, size, pc->name, pc->rank, pc->size);
    *out = n;
    return CDP_OK;
}

static cdp_status nccl_allreduce(struct cdp_comm *pc, void *buf, size_t n, enum cdp_comm_dtype dt,
                                 enum cdp_reduce_op op, double timeout_s)
{
    struct cdp_nccl *c = pc->impl;
    cdp_status st = usable(c);
    if (st) return st;
    if (dt != CDP_COMM_F32 && dt != CDP_COMM_F64) return cdp_fail(CDP_ERR_UNSUPPORTED, "nccl: floats and doubles only");
    return ran(c, c->ops->allreduce(c->comm, c->state, buf, n, dt == CDP_COMM_F32 ? CDP_NCCL_F32 : CDP_NCCL_F64,
                                    (int)op, timeout_s));
}

/* Every rank's shard (the one rule, cdp_comm_shard) of the window [from,
 * from + count) of an n-float buffer, in the window's coordinates: malloc'd
 * arrays for the module. */
static cdp_status shards(struct cdp_comm *pc, size_t n, size_t from, size_t count, size_t **off_out,
                         size_t **len_out)
{
    size_t size = (size_t)(unsigned)pc->size;
    size_t *off = malloc(size * sizeof *off), *len = malloc(size * sizeof *len);
    if (!off || !len) {
        free(off);
        free(len);
        return cdp_fail(CDP_ERR_NOMEM, "out of memory for %d shards", pc->size);
    }
    for (int k = 0; k < pc->size; k++) {
        uint64_t at, l;
        cdp_shard_in_window(n, pc->size, k, from, count, &at, &l);
        off[k] = (size_t)at;
        len[k] = (size_t)l;
    }
    *off_out = off;
    *len_out = len;
    return CDP_OK;
}

/* ZeRO's collectives: the shards handed to the module. */
static cdp_status sharded(struct cdp_comm *pc, float *buf, size_t n, size_t from, size_t count, int is_reduce,
                          enum cdp_reduce_op op, double timeout_s)
{
    struct cdp_nccl *c = pc->impl;
    cdp_status st = usable(c);
    if (st) return st;
    if (is_reduce ? !c->ops->reduce_scatter : !c->ops->all_gather)
        return cdp_fail(CDP_ERR_UNSUPPORTED, "the cuda module has no %s", is_reduce ? "reduce-scatter" : "all-gather");
    size_t *off = NULL, *len = NULL;
    st = shards(pc, n, from, count, &off, &len);
    if (!st)
        st = ran(c, is_reduce ? c->ops->reduce_scatter(c->comm, c->state, buf, count, off, len, (int)op, timeout_s)
                              : c->ops->all_gather(c->comm, c->state, buf, count, off, len, timeout_s));
    free(off);
    free(len);
    return st;
}

static cdp_status nccl_reduce_scatter(struct cdp_comm *pc, float *buf, size_t n, size_t from, size_t count,
                                      enum cdp_reduce_op op, double timeout_s)
{
    return sharded(pc, buf, n, from, count, 1, op, timeout_s);
}

static cdp_status nccl_allgather(struct cdp_comm *pc, float *buf, size_t n, double timeout_s)
{
    return sharded(pc, buf, n, 0, n, 0, CDP_REDUCE_SUM, timeout_s);
}

/* The non-blocking collectives: on the communicator's own stream, ordered
 * behind the compute stream by an event, completed by testing the event
 * (comm/cuda/nccl.cu). The front runs the deadline; a request released
 * before it completed (past its deadline, or failed) leaves the
 * communicator broken, since the collective may still write its buffer. */
static cdp_status nccl_icoll(struct cdp_comm *pc, struct cdp_request *r)
{
    struct cdp_nccl *c = pc->impl;
    cdp_status st = usable(c);
    if (st) return st;
    if (!c->ops->start) return cdp_fail(CDP_ERR_UNSUPPORTED, "the cuda module has no non-blocking collectives");
    static const char *const calls[] = {"", "ncclAllReduce", "ncclReduceScatter", "ncclAllGather"};
    r->call = calls[r->kind];
    if (r->kind == CDP_REQ_ALLREDUCE) {
        if (r->dt != CDP_COMM_F32 && r->dt != CDP_COMM_F64)
            return cdp_fail(CDP_ERR_UNSUPPORTED, "nccl: floats and doubles only");
        return ran(c, c->ops->start(c->comm, c->state, CDP_NCCL_ALLREDUCE, r->buf, r->n,
                                    r->dt == CDP_COMM_F32 ? CDP_NCCL_F32 : CDP_NCCL_F64, (int)r->op, NULL, NULL,
                                    c->timeout_s, &r->impl));
    }
    if (r->kind != CDP_REQ_REDUCE_SCATTER && r->kind != CDP_REQ_ALLGATHER)
        return cdp_fail(CDP_ERR_INTERNAL, "nccl: not a collective");
    size_t *off = NULL, *len = NULL;
    if ((st = shards(pc, r->n, r->from, r->count, &off, &len))) return st;
    const int is_reduce = r->kind == CDP_REQ_REDUCE_SCATTER;
    st = ran(c, c->ops->start(c->comm, c->state, is_reduce ? CDP_NCCL_REDUCE_SCATTER : CDP_NCCL_ALLGATHER, r->buf,
                              r->count, CDP_NCCL_F32, is_reduce ? (int)r->op : 0, off, len, c->timeout_s, &r->impl));
    free(off);
    free(len);
    return st;
}

static cdp_status nccl_test(struct cdp_request *r, int *done)
{
    struct cdp_nccl *c = r->comm->impl;
    if (c->aborted) return cdp_fail(CDP_ERR_COMM, "this communicator was aborted (cdp_nccl_abort_all)");
    return ran(c, c->ops->test(r->impl, done));
}

static void nccl_release(struct cdp_request *r)
{
    struct cdp_nccl *c = r->comm->impl;
    if (!r->done) c->broken = 1;
    c->ops->release(r->impl);
    r->impl = NULL;
}

static cdp_status nccl_group(struct cdp_comm *pc, const struct cdp_comm_p2p *ops, int n, double timeout_s)
{
    struct cdp_nccl *c = pc->impl;
    cdp_status st = usable(c);
    if (st) return st;
    struct cdp_nccl_p2p one[16], *p = n <= 16 ? one : malloc((size_t)n * sizeof *p);
    if (!p) return cdp_fail(CDP_ERR_NOMEM, "out of memory for %d transfers", n);
    for (int i = 0; i < n; i++) p[i] = (struct cdp_nccl_p2p){ops[i].is_send, ops[i].peer, ops[i].buf, ops[i].bytes};
    st = ran(c, c->ops->p2p(c->comm, c->state, p, n, timeout_s));
    if (p != one) free(p);
    return st;
}

/* Ending the job: NCCL's communicators first (nothing of theirs waits on a
 * peer that is gone), then the host world. */
static void nccl_abort(struct cdp_comm *pc, int code)
{
    cdp_nccl_abort_all();
    cdp_comm_abort(pc->host, code);
}

static void nccl_free(struct cdp_comm *pc)
{
    struct cdp_nccl *c = pc->impl;
    registry_remove(c);
    if (c->aborted) {
        /* nothing left to end */
    } else if (c->broken) {
        c->ops->abort(c->comm);
    } else if (c->ops->destroy(c->comm, c->timeout_s)) {
        CDP_WARN(COMM, "%s rank %d/%d: freeing: %s (aborted instead)", pc->name, pc->rank, pc->size, cdp_last_error());
    }
    if (c->host_owned) cdp_comm_free(pc->host);
    free(c);
}

const struct cdp_comm_ops cdp_comm_nccl_ops = {
    .name = "nccl",
    .memory = CDP_COMM_DEVICE_MEMORY,
    .split = nccl_split,
    .allreduce = nccl_allreduce,
    .reduce_scatter_f32 = nccl_reduce_scatter,
    .allgather_f32 = nccl_allgather,
    .icoll = nccl_icoll,
    .group = nccl_group,
    .test = nccl_test,
    .release = nccl_release,
    .abort = nccl_abort,
    .free = nccl_free,
};

/* ---- the nccl API: the front's calls under NCCL's names --------------------------- */

cdp_status cdp_nccl_split(cdp_nccl_t c, int color, int key, cdp_nccl_t *out)
{
    if (!c || !out) return cdp_fail(CDP_ERR_INVALID, "cdp_nccl_split: NULL communicator or out");
    return cdp_comm_split(c, color, key, out);
}

int cdp_nccl_rank(cdp_nccl_t c) { return cdp_comm_rank(c); }
int cdp_nccl_size(cdp_nccl_t c) { return cdp_comm_size(c); }

cdp_status cdp_nccl_allreduce_f32(cdp_nccl_t c, float *dev_buf, size_t n, enum cdp_reduce_op op,
                                  double timeout_s)
{
    if (!c) return cdp_fail(CDP_ERR_INVALID, "nccl all-reduce: NULL communicator");
    return cdp_comm_allreduce_f32(c, dev_buf, n, op, timeout_s);
}

cdp_status cdp_nccl_allreduce_f64(cdp_nccl_t c, double *dev_buf, size_t n, enum cdp_reduce_op op,
                                  double timeout_s)
{
    if (!c) return cdp_fail(CDP_ERR_INVALID, "nccl all-reduce: NULL communicator");
    return cdp_comm_allreduce_f64(c, dev_buf, n, op, timeout_s);
}

cdp_status cdp_nccl_reduce_scatter_f32(cdp_nccl_t c, float *dev_buf, size_t n, enum cdp_reduce_op op,
                                       double timeout_s)
{
    if (!c) return cdp_fail(CDP_ERR_INVALID, "nccl reduce-scatter: NULL communicator");
    return cdp_comm_reduce_scatter_f32(c, dev_buf, n, op, timeout_s);
}

cdp_status cdp_nccl_reduce_scatter_window_f32(cdp_nccl_t c, float *dev_buf, size_t n, size_t from, size_t count,
                                              enum cdp_reduce_op op, double timeout_s)
{
    if (!c) return cdp_fail(CDP_ERR_INVALID, "nccl reduce-scatter: NULL communicator");
    return cdp_comm_reduce_scatter_window_f32(c, dev_buf, n, from, count, op, timeout_s);
}

cdp_status cdp_nccl_allgather_f32(cdp_nccl_t c, float *dev_buf, size_t n, double timeout_s)
{
    if (!c) return cdp_fail(CDP_ERR_INVALID, "nccl all-gather: NULL communicator");
    return cdp_comm_allgather_f32(c, dev_buf, n, timeout_s);
}

cdp_status cdp_nccl_sendrecv(cdp_nccl_t c, const struct cdp_nccl_p2p *ops, int n, double timeout_s)
{
    if (!c) return cdp_fail(CDP_ERR_INVALID, "nccl send/receive: NULL communicator");
    if (n <= 0 || !ops) return cdp_comm_group(c, NULL, n, timeout_s);
    struct cdp_comm_p2p one[16], *p = n <= 16 ? one : malloc((size_t)n * sizeof *p);
    if (!p) return cdp_fail(CDP_ERR_NOMEM, "out of memory for %d transfers", n);
    for (int i = 0; i < n; i++) p[i] = (struct cdp_comm_p2p){ops[i].is_send, ops[i].peer, ops[i].buf, ops[i].bytes};
    cdp_status st = cdp_comm_group(c, p, n, timeout_s);
    if (p != one) free(p);
    return st;
}

/* ---- ending ------------------------------------------------------------------- */

void cdp_nccl_abort_all(void)
{
    pthread_mutex_lock(&registry_lock);
    int n = 0;
    for (struct cdp_nccl *c = registry; c; c = c->next) {
        if (c->aborted) continue;
        c->ops->abort(c->comm);
        c->comm = NULL;
        c->aborted = 1;
        n++;
    }
    pthread_mutex_unlock(&registry_lock);
    if (n) CDP_INFO(COMM, "nccl: aborted %d communicator%s", n, n == 1 ? "" : "s");
}

void cdp_nccl_free(cdp_nccl_t c) { cdp_comm_free(c); }
