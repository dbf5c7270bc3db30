/* The communicator backend table, shared by the front (comm.c) and the
 * backends (comm_self.c, comm_mpi.c, nccl.c) and the host-staging adapter
 * (comm_staged.c). The front checks arguments, keeps the request bookkeeping,
 * runs every deadline and writes every message; a backend only moves bytes. */
#ifndef CDP_COMM_BACKEND_H
#define CDP_COMM_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "cdp_config.h"
#include "comm/comm.h"

/* User tags are below 2^20; the backends may use tags from here up. */
#define CDP_COMM_TAG_LIMIT (1 << 20)
#define CDP_COMM_TAG_GATHER (CDP_COMM_TAG_LIMIT + 1)

/* CDP_COMM_BF16: bfloat16 bits (uint16), which the front makes of floats
 * for a collective whose wire is CDP_COMM_WIRE_BF16 (sums only). */
enum cdp_comm_dtype { CDP_COMM_F32 = 0, CDP_COMM_F64, CDP_COMM_U64, CDP_COMM_BF16, CDP_COMM_DTYPE_COUNT };

/* What a request is. */
enum cdp_req_kind { CDP_REQ_P2P = 0, CDP_REQ_ALLREDUCE, CDP_REQ_REDUCE_SCATTER, CDP_REQ_ALLGATHER };

/* NULL in a slot means "not supported". Every call of a backend comes from the
 * front with checked arguments (peer in range, tag in range, buffers non-NULL
 * when bytes > 0, a window inside its buffer). A collective is either
 * blocking (allreduce, reduce_scatter_f32, allgather_f32) or started by icoll
 * and completed through test; the front uses icoll where a backend has it, and
 * otherwise runs the blocking slot (a non-blocking call then returns a
 * request that has completed). */
struct cdp_comm_ops {
    const char *name;
    enum cdp_comm_memory memory; /* which memory its buffers are */
    cdp_status (*split)(struct cdp_comm *c, int color, int key, struct cdp_comm **out);
    /* In-place all-reduce, barrier, gather and broadcast run to completion within the
     * deadline, polling with cdp_comm_poll(). */
    cdp_status (*allreduce)(struct cdp_comm *c, void *buf, size_t n, enum cdp_comm_dtype dt,
                            enum cdp_reduce_op op, double timeout_s);
    /* ZeRO's in-place reduce-scatter and all-gather of n > 0 floats over the
     * shards of cdp_comm_shard(n, size, rank), run to completion within the
     * deadline as the all-reduce is. The reduce-scatter takes a window: buf
     * holds the count > 0 floats [from, from + count) of the n-float buffer
     * (the whole is from 0, count n), and each rank's part is its shard's
     * overlap with the window. */
    cdp_status (*reduce_scatter_f32)(struct cdp_comm *c, float *buf, size_t n, size_t from, size_t count,
                                     enum cdp_reduce_op op, double timeout_s);
    cdp_status (*allgather_f32)(struct cdp_comm *c, float *buf, size_t n, double timeout_s);
    /* Starts the collective described by r (kind, buf, n, dt, op, from,
     * count; every rank of c starts the same collectives in the same order):
     * fills r->impl. test completes it; release of one that has not completed
     * (past its deadline) leaves the communicator unusable, since no backend
     * can cancel a collective that may still write its buffer. */
    cdp_status (*icoll)(struct cdp_comm *c, struct cdp_request *r);
    /* A batch of sends and receives posted together, complete on return
     * within the deadline (NCCL's group: sends may wait for their receive, so
     * the batch is what keeps matched pairs from deadlocking). NULL: the
     * front posts them one by one and waits for all. */
    cdp_status (*group)(struct cdp_comm *c, const struct cdp_comm_p2p *ops, int n, double timeout_s);
    /* Start a send / receive described by r (buf, bytes, peer, tag): fill r->impl. */
    cdp_status (*isend)(struct cdp_comm *c, struct cdp_request *r);
    cdp_status (*irecv)(struct cdp_comm *c, struct cdp_request *r);
    /* Progresses r; *done = 1 once complete (an error also completes it). */
    cdp_status (*test)(struct cdp_request *r, int *done);
    /* Frees r->impl; an incomplete request (past its deadline) is cancelled
     * where the backend can, else left to finish on its own. */
    void (*release)(struct cdp_request *r);
    cdp_status (*barrier)(struct cdp_comm *c, double timeout_s);
    cdp_status (*gather_bytes)(struct cdp_comm *c, const void *buf, size_t bytes, void **out,
                               size_t **lens, double timeout_s);
    cdp_status (*bcast_bytes)(struct cdp_comm *c, void *buf, size_t bytes, int root, double timeout_s);
    void (*abort)(struct cdp_comm *c, int code);
    void (*free)(struct cdp_comm *c);
};

struct cdp_comm {
    const struct cdp_comm_ops *ops;
    char name[40];     /* in messages: the backend's name, or "nccl[color 3]" */
    int rank, size;
    /* The same group on host memory (for the host scalars of a communicator
     * on device memory), not owned; c itself where c takes host memory. */
    struct cdp_comm *host;
    long pending;  /* requests handed out and not yet freed */
    int refs;      /* the world is shared by every cdp_comm_world() caller */
    int is_world;
    void *impl;    /* the backend's state */
};

struct cdp_request {
    struct cdp_comm *comm;
    enum cdp_req_kind kind;
    int is_send;
    int peer, tag;
    void *buf;     /* not owned */
    size_t bytes;
    /* collectives: n elements of dt (the whole buffer), the window [from,
     * from + count) of a reduce-scatter (buf points at its first float) */
    size_t n, from, count;
    enum cdp_comm_dtype dt;
    enum cdp_reduce_op op;
    /* bf16 on the wire: the front packed the floats into bf16 in place (dt
     * CDP_COMM_BF16, op the sum); on completion it unpacks them and, for an
     * average, divides (wire_avg) */
    int wire_bf16, wire_avg;
    int done;      /* a collective run by a blocking slot: completed at once */
    int failed;    /* the backend's test failed (else a failed wait is past the deadline) */
    /* the backend's call, named in the deadline's message ("timed out after
     * 2 s (ncclAllReduce)"); NULL: none named */
    const char *call;
    void *impl;    /* the backend's state */
};

/* The backends. */
extern const struct cdp_comm_ops cdp_comm_self_ops;
cdp_status cdp_comm_self_create(struct cdp_comm **out);
#if CDP_HAVE_MPI
extern const struct cdp_comm_ops cdp_comm_mpi_ops;
/* MPI_Init_thread (unless the program already did), then the world. */
cdp_status cdp_comm_mpi_world(struct cdp_comm **out);
/* 1 while MPI is initialised and not finalised (the self backend's abort uses it). */
int cdp_comm_mpi_active(void);
void cdp_comm_mpi_abort_world(int code);
#endif

/* The nccl backend (nccl.c) and the host-staging adapter (comm_staged.c). */
extern const struct cdp_comm_ops cdp_comm_nccl_ops;
extern const struct cdp_comm_ops cdp_comm_staged_ops;

/* Allocates a communicator handle for a backend (named after it, its own
 * host communicator when the backend takes host memory); NULL when out of
 * memory. */
struct cdp_comm *cdp_comm_alloc(const struct cdp_comm_ops *ops, int rank, int size, void *impl);

/* Polls test(arg) until it reports done, it fails, or the deadline passes
 * (timeout_s <= 0: none; t0 from cdp_time_ns()). It spins for the first
 * 50 us, plus the time `bytes` should take to move at spin_gbps (MPI moves
 * data only inside its calls, so a transfer under way is polled closely),
 * then sleeps with growing pauses up to a cap, so an idle rank does not burn
 * its core while a fast answer is still seen at once.
 * Past the deadline: CDP_ERR_COMM "timed out after N s". */
#define CDP_COMM_SPIN_P2P_GBPS 4.0
#define CDP_COMM_SPIN_COLL_GBPS 1.0
typedef cdp_status (*cdp_comm_test_fn)(void *arg, int *done);
cdp_status cdp_comm_poll(cdp_comm_test_fn test, void *arg, uint64_t t0, double timeout_s,
                         size_t bytes, double spin_gbps);

#endif
