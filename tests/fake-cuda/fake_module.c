/* A stand-in for the CUDA module, for the suites comm and pipeline: one "cuda"
 * device on host memory that the core treats as device memory (not host
 * visible: everything is staged as for a GPU), running the CPU kernel table,
 * and an NCCL table that pretends, so that the nccl communicator's front
 * (comm/nccl.c: bootstrap, agreement, registry, abort, messages) and the
 * executor's GPU path (device buffers, host staging, the kernel table) run on
 * machines without a GPU. It never connects ranks: an all-reduce,
 * reduce-scatter or all-gather leaves the buffer as it is (the latter two
 * check the shards the front hands them), a send to another rank is dropped,
 * and a split keeps the parent's rank and size; only sends to self move bytes.
 * The non-blocking collectives do their work at the start and complete at
 * their second test (a stream that finishes later).
 * CDP_FAKE_NCCL picks a failure: `fail_init:R` (rank R's init fails) or `hang`
 * (all-reduce, reduce-scatter, all-gather and send/receive never complete:
 * they end at the deadline).
 * What happened is counted in cdp_fake_nccl_stats, which tests read through
 * dlsym. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/nccl_module.h"
#include "device/backend.h"
#include "fake_stats.h"
#include "kernels/ops.h"

static const struct cdp_module_host *host;

__attribute__((visibility("default"))) struct fake_stats cdp_fake_nccl_stats;

/* ---- the device: host memory ---------------------------------------------------- */

/* CDP_FAKE_GPUS=N: N devices (default 1), so that ranks get one each and
 * take the nccl communicator rather than the host-staging adapter. */
static cdp_status fake_count(int *out)
{
    const char *v = getenv("CDP_FAKE_GPUS");
    *out = v && atoi(v) > 0 ? atoi(v) : 1;
    return CDP_OK;
}

static cdp_status fake_open(int index, void **state, struct cdp_device_info *info)
{
    int *s = malloc(sizeof *s);
    if (!s) return host->fail(CDP_ERR_NOMEM, "fake: out of memory");
    *s = index;
    info->total_memory = 1ull << 30;
    snprintf(info->description, sizeof info->description, "fake GPU %d (host memory)", index);
    *state = s;
    return CDP_OK;
}

static void fake_close(void *state) { free(state); }

static cdp_status fake_alloc(void *state, uint64_t bytes, void **out)
{
    (void)state;
    void *p = NULL;
    if (posix_memalign(&p, 64, (size_t)bytes)) return host->fail(CDP_ERR_NOMEM, "fake: out of memory");
    *out = p;
    return CDP_OK;
}

static void fake_free(void *state, void *p)
{
    (void)state;
    free(p);
}

static cdp_status fake_copy(void *state, void *dst, const void *src, uint64_t n, enum cdp_copy_kind k)
{
    (void)state, (void)k;
    memmove(dst, src, (size_t)n);
    return CDP_OK;
}

static cdp_status fake_memset(void *state, void *p, int v, uint64_t n)
{
    (void)state;
    memset(p, v, (size_t)n);
    return CDP_OK;
}

static cdp_status fake_event_create(void *state, void **ev)
{
    (void)state;
    *ev = calloc(1, sizeof(uint64_t));
    return *ev ? CDP_OK : host->fail(CDP_ERR_NOMEM, "fake: out of memory");
}

static cdp_status fake_event_record(void *state, void *ev)
{
    (void)state;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    *(uint64_t *)ev = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    return CDP_OK;
}

static cdp_status fake_event_elapsed_ms(void *state, void *a, void *b, double *ms)
{
    (void)state;
    *ms = ((double)*(uint64_t *)b - (double)*(uint64_t *)a) / 1e6;
    return CDP_OK;
}

static void fake_event_destroy(void *state, void *ev)
{
    (void)state;
    free(ev);
}

/* ---- the pretend NCCL ------------------------------------------------------------ */

struct fake_comm {
    int rank, size;
};

static int fail_init_rank(void)
{
    const char *v = getenv("CDP_FAKE_NCCL");
    return v && !strncmp(v, "fail_init:", 10) ? atoi(v + 10) : -1;
}

static int hanging(void)
{
    const char *v = getenv("CDP_FAKE_NCCL");
    return v && !strcmp(v, "hang");
}

/* What a real wait does when nothing completes: fail at the deadline. */
static cdp_status hang_until(double timeout_s, const char *what)
{
    struct timespec ts = { (time_t)timeout_s, (long)((timeout_s - (double)(time_t)timeout_s) * 1e9) };
    nanosleep(&ts, NULL);
    return host->fail(CDP_ERR_COMM, "timed out after %g s (%s)", timeout_s, what);
}

static cdp_status fake_version(int *v)
{
    *v = 21800;
    return CDP_OK;
}

static cdp_status fake_unique_id(void *id)
{
    unsigned char *b = id;
    unsigned pid = (unsigned)getpid();
    for (int i = 0; i < CDP_NCCL_ID_BYTES; i++) b[i] = (unsigned char)((pid >> (8 * (i % 4))) ^ (unsigned)(i * 37 + 1));
    return CDP_OK;
}

static struct fake_comm *new_comm(int rank, int size)
{
    struct fake_comm *c = malloc(sizeof *c);
    if (!c) return NULL;
    c->rank = rank;
    c->size = size;
    cdp_fake_nccl_stats.live++;
    return c;
}

static cdp_status fake_init(void *dev_state, const void *id, int nranks, int rank, double timeout_s, void **out)
{
    (void)dev_state, (void)timeout_s;
    memcpy(cdp_fake_nccl_stats.last_id, id, CDP_NCCL_ID_BYTES);
    cdp_fake_nccl_stats.inits++;
    if (rank == fail_init_rank())
        return host->fail(CDP_ERR_COMM, "ncclCommInitRankConfig: fake failure of rank %d", rank);
    struct fake_comm *c = new_comm(rank, nranks);
    if (!c) return host->fail(CDP_ERR_NOMEM, "fake: out of memory");
    *out = c;
    return CDP_OK;
}

static cdp_status fake_split(void *comm, int color, int key, double timeout_s, void **out)
{
    (void)key, (void)timeout_s;
    struct fake_comm *p = comm;
    cdp_fake_nccl_stats.splits++;
    if (color < 0) {
        *out = NULL;
        return CDP_OK;
    }
    struct fake_comm *c = new_comm(p->rank, p->size);
    if (!c) return host->fail(CDP_ERR_NOMEM, "fake: out of memory");
    *out = c;
    return CDP_OK;
}

static cdp_status fake_rank_size(void *comm, int *rank, int *size)
{
    struct fake_comm *c = comm;
    *rank = c->rank;
    *size = c->size;
    return CDP_OK;
}

static cdp_status fake_allreduce(void *comm, void *dev_state, void *buf, size_t n, int dtype, int op,
                                 double timeout_s)
{
    (void)comm, (void)dev_state, (void)buf, (void)n, (void)dtype, (void)op;
    if (hanging()) return hang_until(timeout_s, "ncclAllReduce");
    return CDP_OK;
}

/* The shards the front computed must tile the buffer in rank order; this
 * rank's is kept for the tests. The values stay as they are. */
static cdp_status fake_sharded(struct fake_comm *c, size_t n, const size_t *off, const size_t *len)
{
    size_t next = 0;
    for (int k = 0; k < c->size; k++) {
        if (off[k] != next)
            return host->fail(CDP_ERR_INTERNAL, "fake: shard %d starts at %zu, expected %zu", k, off[k], next);
        next += len[k];
    }
    if (next != n) return host->fail(CDP_ERR_INTERNAL, "fake: the shards cover %zu of %zu floats", next, n);
    cdp_fake_nccl_stats.sharded++;
    cdp_fake_nccl_stats.shard_off = off[c->rank];
    cdp_fake_nccl_stats.shard_len = len[c->rank];
    return CDP_OK;
}

static cdp_status fake_reduce_scatter(void *comm, void *dev_state, float *buf, size_t n, const size_t *off,
                                      const size_t *len, int op, double timeout_s)
{
    (void)dev_state, (void)buf, (void)op;
    if (hanging()) return hang_until(timeout_s, "ncclReduceScatter");
    return fake_sharded(comm, n, off, len);
}

static cdp_status fake_all_gather(void *comm, void *dev_state, float *buf, size_t n, const size_t *off,
                                  const size_t *len, double timeout_s)
{
    (void)dev_state, (void)buf;
    if (hanging()) return hang_until(timeout_s, "ncclAllGather");
    return fake_sharded(comm, n, off, len);
}

/* Sends to self are matched with receives from self in order; the sizes must agree. */
static cdp_status fake_p2p(void *comm, void *dev_state, const struct cdp_nccl_p2p *ops, int n, double timeout_s)
{
    struct fake_comm *c = comm;
    (void)dev_state;
    if (hanging()) return hang_until(timeout_s, "ncclGroupEnd (send/receive group)");
    int s = 0;
    for (int r = 0; r < n; r++) {
        if (ops[r].is_send || ops[r].peer != c->rank) continue;
        while (s < n && !(ops[s].is_send && ops[s].peer == c->rank)) s++;
        if (s == n) return host->fail(CDP_ERR_COMM, "fake: a receive from self without its send");
        if (ops[s].bytes != ops[r].bytes)
            return host->fail(CDP_ERR_COMM, "fake: send of %zu bytes, receive of %zu", ops[s].bytes, ops[r].bytes);
        if (ops[r].bytes) memcpy(ops[r].buf, ops[s].buf, ops[r].bytes);
        s++;
    }
    return CDP_OK;
}

/* The non-blocking collectives: the work is done (or checked) at the start
 * as the blocking slots do it, and the request reports completion only at
 * its second test, as a collective on its own stream would some time
 * later; "hang": never. Completion counts the compute stream's wait. */
struct fake_req {
    int tests;
    int hang;
};

static cdp_status fake_start(void *comm, void *dev_state, int coll, void *buf, size_t n, int dtype, int op,
                             const size_t *off, const size_t *len, double timeout_s, void **req)
{
    (void)dev_state, (void)buf, (void)dtype, (void)op, (void)timeout_s;
    if ((unsigned)coll >= CDP_NCCL_COLL_COUNT) return host->fail(CDP_ERR_INVALID, "fake: collective %d unknown", coll);
    struct fake_req *q = calloc(1, sizeof *q);
    if (!q) return host->fail(CDP_ERR_NOMEM, "fake: out of memory");
    q->hang = hanging();
    cdp_status st = CDP_OK;
    if (!q->hang && coll != CDP_NCCL_ALLREDUCE) st = fake_sharded(comm, n, off, len);
    if (st) {
        free(q);
        return st;
    }
    cdp_fake_nccl_stats.starts++;
    cdp_fake_nccl_stats.in_flight++;
    *req = q;
    return CDP_OK;
}

static cdp_status fake_test(void *req, int *done)
{
    struct fake_req *q = req;
    *done = 0;
    if (q->hang) return CDP_OK;
    if (++q->tests < 2) return CDP_OK;
    if (q->tests == 2) {
        cdp_fake_nccl_stats.compute_waits++;
        cdp_fake_nccl_stats.in_flight--;
    }
    *done = 1;
    return CDP_OK;
}

static void fake_release(void *req)
{
    struct fake_req *q = req;
    if (q->hang || q->tests < 2) cdp_fake_nccl_stats.in_flight--;
    free(q);
}

static void fake_abort(void *comm)
{
    cdp_fake_nccl_stats.aborts++;
    cdp_fake_nccl_stats.live--;
    free(comm);
}

static cdp_status fake_destroy(void *comm, double timeout_s)
{
    (void)timeout_s;
    cdp_fake_nccl_stats.destroys++;
    cdp_fake_nccl_stats.live--;
    free(comm);
    return CDP_OK;
}

__attribute__((visibility("default"))) const struct cdp_nccl_ops cdp_nccl_module_ops = {
    .version = fake_version,
    .unique_id = fake_unique_id,
    .init = fake_init,
    .split = fake_split,
    .rank_size = fake_rank_size,
    .allreduce = fake_allreduce,
    .reduce_scatter = fake_reduce_scatter,
    .all_gather = fake_all_gather,
    .p2p = fake_p2p,
    .start = fake_start,
    .test = fake_test,
    .release = fake_release,
    .abort = fake_abort,
    .destroy = fake_destroy,
};

static const struct cdp_device_backend fake_backend = {
    .abi = CDP_DEVICE_ABI,
    .name = "cuda",
    .count = fake_count,
    .open = fake_open,
    .close = fake_close,
    .alloc = fake_alloc,
    .free = fake_free,
    .copy = fake_copy,
    .memset = fake_memset,
    .synchronize = NULL,
    .event_create = fake_event_create,
    .event_record = fake_event_record,
    .event_elapsed_ms = fake_event_elapsed_ms,
    .event_destroy = fake_event_destroy,
    .ops = &cdp_cpu_ops,
    .usage = NULL,
};

__attribute__((visibility("default"))) cdp_status cdp_device_module_init(const struct cdp_module_host *h,
                                                                         const struct cdp_device_backend **out)
{
    if (!h || h->abi != CDP_DEVICE_ABI) return CDP_ERR_UNSUPPORTED;
    host = h;
    *out = &fake_backend;
    return CDP_OK;
}
