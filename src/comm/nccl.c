/* The nccl communicator's front, in the core: bootstraps the world through
 * the host communicator, checks every argument, keeps the registry that
 * cdp_nccl_abort_all() walks, and names the communicator, the rank and the
 * operation in every message. NCCL itself is behind the CUDA module's table
 * (comm/cuda/nccl.cu), which runs every deadline. */
#include "comm/nccl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "device/backend.h"

struct cdp_nccl {
    const struct cdp_nccl_ops *ops;
    cdp_device_t dev;   /* not owned */
    void *state;        /* dev's backend state */
    void *comm;         /* ncclComm_t; NULL once aborted */
    int rank, size;
    double timeout_s;   /* of split and free */
    char label[40];     /* "nccl", "nccl[color 3]" */
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

static struct cdp_nccl *wrap(const struct cdp_nccl_ops *ops, cdp_device_t dev, void *state, void *comm,
                             int rank, int size, double timeout_s, const char *label)
{
    struct cdp_nccl *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->ops = ops;
    c->dev = dev;
    c->state = state;
    c->comm = comm;
    c->rank = rank;
    c->size = size;
    c->timeout_s = timeout_s;
    snprintf(c->label, sizeof c->label, "%s", label);
    registry_add(c);
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
    struct cdp_nccl *c = wrap(ops, dev, state, comm, rank, size, timeout_s, "nccl");
    if (!c) {
        ops->abort(comm);
        return cdp_fail(CDP_ERR_NOMEM, "nccl rank %d/%d: out of memory", rank, size);
    }
    CDP_DEBUG(COMM, "nccl world: rank %d of %d on %s", rank, size, cdp_device_name(dev));
    *out = c;
    return CDP_OK;
}

/* ---- using a communicator ---------------------------------------------------- */

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

int cdp_nccl_rank(cdp_nccl_t c) { return c ? c->rank : 0; }
int cdp_nccl_size(cdp_nccl_t c) { return c ? c->size : 0; }

cdp_status cdp_nccl_split(cdp_nccl_t c, int color, int key, cdp_nccl_t *out)
{
    if (!c || !out) return cdp_fail(CDP_ERR_INVALID, "cdp_nccl_split: NULL communicator or out");
    cdp_status st = usable(c);
    void *comm = NULL;
    int rank = -1, size = -1;
    if (!st && (st = c->ops->split(c->comm, color, key, c->timeout_s, &comm))) c->broken = 1;
    if (!st && comm && (st = c->ops->rank_size(comm, &rank, &size))) c->ops->abort(comm);
    if (st)
        return cdp_error_context(st, "%s rank %d/%d: split (color %d, key %d)", c->label, c->rank, c->size,
                                 color, key);
    if (!comm) {
        *out = NULL;
        return CDP_OK;
    }
    char label[40];
    snprintf(label, sizeof label, "nccl[color %d]", color);
    struct cdp_nccl *n = wrap(c->ops, c->dev, c->state, comm, rank, size, c->timeout_s, label);
    if (!n) {
        c->ops->abort(comm);
        return cdp_fail(CDP_ERR_NOMEM, "%s rank %d/%d: split: out of memory", c->label, c->rank, c->size);
    }
    CDP_DEBUG(COMM, "%s: rank %d of %d (from %s rank %d of %d)", n->label, rank, size, c->label, c->rank, c->size);
    *out = n;
    return CDP_OK;
}

static const char *const op_names[] = {
    [CDP_REDUCE_SUM] = "sum", [CDP_REDUCE_AVG] = "average", [CDP_REDUCE_MAX] = "max"
};
CDP_TABLE_CHECK(op_names, CDP_REDUCE_OP_COUNT);

static cdp_status allreduce(struct cdp_nccl *c, void *buf, size_t n, enum cdp_nccl_dtype dt,
                            enum cdp_reduce_op op, double timeout_s)
{
    const char *what = dt == CDP_NCCL_F32 ? "floats" : "doubles";
    if (!c) return cdp_fail(CDP_ERR_INVALID, "nccl all-reduce: NULL communicator");
    if ((unsigned)op >= CDP_REDUCE_OP_COUNT)
        return cdp_fail(CDP_ERR_INVALID, "%s rank %d/%d: all-reduce: unknown reduce op %d", c->label, c->rank,
                        c->size, (int)op);
    if (n > 0 && !buf)
        return cdp_fail(CDP_ERR_INVALID, "%s rank %d/%d: all-reduce of %zu %s: buffer is NULL", c->label,
                        c->rank, c->size, n, what);
    cdp_status st = usable(c);
    if (!st && n == 0) return CDP_OK;
    if (!st && (st = c->ops->allreduce(c->comm, c->state, buf, n, (int)dt, (int)op, timeout_s))) c->broken = 1;
    if (st)
        return cdp_error_context(st, "%s rank %d/%d: all-reduce (%s) of %zu %s", c->label, c->rank, c->size,
                                 op_names[op], n, what);
    return CDP_OK;
}

cdp_status cdp_nccl_allreduce_f32(cdp_nccl_t c, float *dev_buf, size_t n, enum cdp_reduce_op op,
                                  double timeout_s)
{
    return allreduce(c, dev_buf, n, CDP_NCCL_F32, op, timeout_s);
}

cdp_status cdp_nccl_allreduce_f64(cdp_nccl_t c, double *dev_buf, size_t n, enum cdp_reduce_op op,
                                  double timeout_s)
{
    return allreduce(c, dev_buf, n, CDP_NCCL_F64, op, timeout_s);
}

/* ZeRO's collectives: the front checks, computes every rank's shard (the
 * one rule, cdp_comm_shard) and hands them to the module. */
static cdp_status sharded(struct cdp_nccl *c, const char *what, float *buf, size_t n, size_t from, size_t count,
                          int is_reduce, enum cdp_reduce_op op, double timeout_s)
{
    if (!c) return cdp_fail(CDP_ERR_INVALID, "nccl %s: NULL communicator", what);
    if (is_reduce && (unsigned)op >= CDP_REDUCE_OP_COUNT)
        return cdp_fail(CDP_ERR_INVALID, "%s rank %d/%d: %s: unknown reduce op %d", c->label, c->rank, c->size,
                        what, (int)op);
    if (count > 0 && !buf)
        return cdp_fail(CDP_ERR_INVALID, "%s rank %d/%d: %s of %zu floats: buffer is NULL", c->label, c->rank,
                        c->size, what, count);
    if (from > n || count > n - from)
        return cdp_fail(CDP_ERR_INVALID, "%s rank %d/%d: %s of floats [%zu, %zu) of a %zu-float buffer", c->label,
                        c->rank, c->size, what, from, from + count, n);
    cdp_status st = usable(c);
    if (!st && count == 0) return CDP_OK;
    if (!st && (is_reduce ? !c->ops->reduce_scatter : !c->ops->all_gather))
        st = cdp_fail(CDP_ERR_UNSUPPORTED, "the cuda module has no %s", what);
    size_t *off = NULL, *len = NULL;
    if (!st) {
        size_t size = (size_t)(unsigned)c->size;
        off = malloc(size * sizeof *off);
        len = malloc(size * sizeof *len);
        if (!off || !len) st = cdp_fail(CDP_ERR_NOMEM, "out of memory for %d shards", c->size);
        for (int k = 0; !st && k < c->size; k++) { /* in the window's coordinates */
            uint64_t at, l;
            cdp_shard_in_window(n, c->size, k, from, count, &at, &l);
            off[k] = (size_t)at;
            len[k] = (size_t)l;
        }
    }
    if (!st) {
        st = is_reduce ? c->ops->reduce_scatter(c->comm, c->state, buf, count, off, len, (int)op, timeout_s)
                       : c->ops->all_gather(c->comm, c->state, buf, count, off, len, timeout_s);
        if (st) c->broken = 1;
    }
    free(off);
    free(len);
    if (st && is_reduce && (from || count != n))
        return cdp_error_context(st, "%s rank %d/%d: %s (%s) of floats [%zu, %zu) of %zu", c->label, c->rank,
                                 c->size, what, op_names[op], from, from + count, n);
    if (st && is_reduce)
        return cdp_error_context(st, "%s rank %d/%d: %s (%s) of %zu floats", c->label, c->rank, c->size, what,
                                 op_names[op], n);
    if (st) return cdp_error_context(st, "%s rank %d/%d: %s of %zu floats", c->label, c->rank, c->size, what, n);
    return CDP_OK;
}

cdp_status cdp_nccl_reduce_scatter_f32(cdp_nccl_t c, float *dev_buf, size_t n, enum cdp_reduce_op op,
                                       double timeout_s)
{
    return sharded(c, "reduce-scatter", dev_buf, n, 0, n, 1, op, timeout_s);
}

cdp_status cdp_nccl_reduce_scatter_window_f32(cdp_nccl_t c, float *dev_buf, size_t n, size_t from, size_t count,
                                              enum cdp_reduce_op op, double timeout_s)
{
    return sharded(c, "reduce-scatter", dev_buf, n, from, count, 1, op, timeout_s);
}

cdp_status cdp_nccl_allgather_f32(cdp_nccl_t c, float *dev_buf, size_t n, double timeout_s)
{
    return sharded(c, "all-gather", dev_buf, n, 0, n, 0, CDP_REDUCE_SUM, timeout_s);
}

/* "send to 1 (4096 bytes), receive from 0 (4096 bytes)", the first few. */
static void describe(const struct cdp_nccl_p2p *ops, int n, char *buf, size_t cap)
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

cdp_status cdp_nccl_sendrecv(cdp_nccl_t c, const struct cdp_nccl_p2p *ops, int n, double timeout_s)
{
    if (!c) return cdp_fail(CDP_ERR_INVALID, "nccl send/receive: NULL communicator");
    if (n < 0 || (n > 0 && !ops))
        return cdp_fail(CDP_ERR_INVALID, "%s rank %d/%d: send/receive group of %d operations: %s", c->label,
                        c->rank, c->size, n, n < 0 ? "negative count" : "ops is NULL");
    for (int i = 0; i < n; i++) {
        const struct cdp_nccl_p2p *p = &ops[i];
        const char *verb = p->is_send ? "send to" : "receive from";
        if (p->peer < 0 || p->peer >= c->size)
            return cdp_fail(CDP_ERR_INVALID, "%s rank %d/%d: %s rank %d: no such rank (0..%d)", c->label,
                            c->rank, c->size, verb, p->peer, c->size - 1);
        if (p->bytes > 0 && !p->buf)
            return cdp_fail(CDP_ERR_INVALID, "%s rank %d/%d: %s rank %d (%zu bytes): buffer is NULL", c->label,
                            c->rank, c->size, verb, p->peer, p->bytes);
    }
    cdp_status st = usable(c);
    if (!st && n == 0) return CDP_OK;
    if (!st && (st = c->ops->p2p(c->comm, c->state, ops, n, timeout_s))) c->broken = 1;
    if (st) {
        char what[256];
        describe(ops, n, what, sizeof what);
        return cdp_error_context(st, "%s rank %d/%d: send/receive group (%s)", c->label, c->rank, c->size, what);
    }
    return CDP_OK;
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

void cdp_nccl_free(cdp_nccl_t c)
{
    if (!c) return;
    registry_remove(c);
    if (c->aborted) {
        free(c);
        return;
    }
    if (c->broken) {
        c->ops->abort(c->comm);
    } else if (c->ops->destroy(c->comm, c->timeout_s)) {
        CDP_WARN(COMM, "%s rank %d/%d: freeing: %s (aborted instead)", c->label, c->rank, c->size,
                 cdp_last_error());
    }
    free(c);
}
