/* Communicators: one API over `self` (one rank, no MPI), `mpi` (Open MPI,
 * host memory), `nccl` (GPU memory, comm/nccl.h makes it) and the host
 * staging of device memory (cdp_comm_staged). A communicator says which
 * memory its buffers are (cdp_comm_memory); every call checks its arguments
 * here, once for all backends, and every message is written here. A communicator is a group of ranks; split() makes the
 * data-parallel group of each stage and the pipeline of each replica, and a
 * rank creates only the groups it belongs to. Every wait has a deadline: past
 * it the call fails with CDP_ERR_COMM and "timed out after N s", and the caller
 * decides to abort the job. ZeRO's reduce-scatter and all-gather split a
 * buffer into one shard per rank (cdp_comm_shard). Collectives also come
 * non-blocking (cdp_comm_iallreduce_f32 and friends), returning a request
 * that cdp_comm_test progresses and cdp_comm_wait completes within its
 * deadline.
 *
 * Threads: MPI is initialised MPI_THREAD_FUNNELED, so call every function on
 * a communicator from the thread that created the world.
 * Knobs read from the environment, for tests and measurement only:
 * CDP_COMM_CHUNK_BYTES (largest single MPI message, default 1 GiB),
 * CDP_COMM_SPIN_US / CDP_COMM_SLEEP_MAX_US (how a wait polls: spin 50 us,
 * plus the time the bytes in flight should take, then sleep up to 250 us). */
#ifndef CDP_COMM_H
#define CDP_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "cdp/device.h"
#include "cdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cdp_comm *cdp_comm_t;
typedef struct cdp_request *cdp_request_t;

enum cdp_reduce_op { CDP_REDUCE_SUM = 0, CDP_REDUCE_AVG, CDP_REDUCE_MAX, CDP_REDUCE_OP_COUNT };

/* The memory a communicator's buffers are: the host's, or its device's (a
 * GPU's memory, which the host cannot read). */
enum cdp_comm_memory { CDP_COMM_HOST_MEMORY = 0, CDP_COMM_DEVICE_MEMORY };

/* One half of a matched pair of a batch (cdp_comm_group): bytes go to /
 * come from `peer`, a rank of the communicator; buf is not owned. */
struct cdp_comm_p2p {
    int is_send;
    int peer;
    void *buf;
    size_t bytes;
};

/* 1 when this build has the mpi communicator. */
int cdp_comm_have_mpi(void);

/* 1 when this process was started by mpirun (or another MPI launcher):
 * OMPI_COMM_WORLD_SIZE or PMIX_RANK is set, or PMI_SIZE is above one. Also in
 * a build without MPI, so that the caller can refuse a multi-rank launch. */
int cdp_comm_launched_by_mpi(void);

/* 1 while this process waits on its peers (a receive, a send's completion, a
 * collective: every wait with a deadline), else 0; after a wait that failed
 * (past its deadline, a peer gone) it stays 1. Async-signal-safe: the
 * launcher's report of a stopped rank says whether it was waiting or busy,
 * which tells a hung rank from the ones waiting on it. */
int cdp_comm_waiting(void);

/* A testing hook run at the start of every wait on peers (a request's wait, a
 * blocking collective, a batch of sends and receives), once the transfer it
 * waits for is posted: it lets a test act deterministically "inside a
 * transfer" (CDP_FAULT=signal, pipeline/run/fault.h). One per process, NULL
 * to remove it; set and removed by the thread that waits. */
typedef void (*cdp_comm_wait_hook)(void *ctx);
void cdp_comm_set_wait_hook(cdp_comm_wait_hook hook, void *ctx);

/* The world: `mpi` when launched by mpirun (MPI_Init_thread happens here, once,
 * unless the program initialised MPI itself), else `self` (also when launched
 * by mpirun in a build without MPI). A second call while the mpi world lives
 * returns the same handle; each call needs its cdp_comm_free, and the last
 * one finalises MPI. After MPI is finalised, the mpi world cannot be made
 * again in this process (CDP_ERR_COMM). Sets the log's rank prefix. */
cdp_status cdp_comm_world(cdp_comm_t *out);

/* The world of one rank without MPI, whatever the environment. */
cdp_status cdp_comm_self(cdp_comm_t *out);

const char *cdp_comm_name(cdp_comm_t c); /* "self" / "mpi" / "nccl" / "nccl[color 3]" */
enum cdp_comm_memory cdp_comm_memory(cdp_comm_t c);
/* The same group on host memory, for small host values (a loss, a norm)
 * beside device buffers: c itself where c takes host memory, else the host
 * communicator it was made over (not owned; it lives as long as c). */
cdp_comm_t cdp_comm_host(cdp_comm_t c);
/* 1 when c's sends may wait for their receive (NCCL): point-to-point
 * transfers are then posted in batches (cdp_comm_group), in an order that
 * cannot deadlock under that rule (cdp_schedule_build_ex, rendezvous). */
int cdp_comm_p2p_grouped(cdp_comm_t c);
/* 1 when c's non-blocking collectives run while the caller computes (mpi,
 * the host-staging adapter over it, and nccl on each communicator's own
 * stream); 0 where they complete within the call that starts them (self, and
 * any communicator of one rank). */
int cdp_comm_collectives_async(cdp_comm_t c);
int cdp_comm_rank(cdp_comm_t c);
int cdp_comm_size(cdp_comm_t c);

/* Collective over c: ranks with the same color form a new communicator,
 * ordered by key; color < 0 means "not a member" and gives *out = NULL.
 * It has no deadline (MPI has no non-blocking split): call it at start-up,
 * where a dead peer ends the job through mpirun. */
cdp_status cdp_comm_split(cdp_comm_t c, int color, int key, cdp_comm_t *out);

/* In-place all-reduce of n floats / doubles (sum, average, max) within the
 * deadline (MPI_Iallreduce, MPI_IN_PLACE, no copy). If an all-reduce,
 * barrier or gather fails or times out, MPI cannot cancel it and may still
 * write the buffer: the communicator then refuses further calls, the world is
 * not finalised, and the caller should end the job with cdp_comm_abort. */
cdp_status cdp_comm_allreduce_f32(cdp_comm_t c, float *buf, size_t n, enum cdp_reduce_op op, double timeout_s);
cdp_status cdp_comm_allreduce_f64(cdp_comm_t c, double *buf, size_t n, enum cdp_reduce_op op, double timeout_s);

/* ZeRO's shards: a flat buffer of n elements split over R ranks in rank
 * order, the first n % R shards one element longer. Shard r is
 * [*off, *off + *len) with *len = n / R + (r < n % R ? 1 : 0) and *off the
 * sum of the earlier lengths; when n < R the last R - n shards are empty. The
 * one home of that rule: the reduce-scatter and all-gather below, and those
 * of the nccl communicator, use it. R >= 1 and 0 <= r < R, else a programmer
 * error (abort). */
void cdp_comm_shard(size_t n, int R, int r, size_t *off, size_t *len);

/* In-place reduce-scatter of n floats (sum, average, max) within the
 * deadline: on return, this rank's shard of buf (cdp_comm_shard(n, size,
 * rank)) holds the reduction over all ranks of that shard; the rest of buf is
 * unspecified. Every rank passes the same n and op; n == 0 is a no-op.
 * On mpi: MPI_Ireduce_scatter (MPI_IN_PLACE) in pieces of at most the chunk
 * size, and the average is that sum divided by the size on the host, as
 * cdp_comm_allreduce_f32 divides its sum. The shard is bit-identical to the
 * same elements of cdp_comm_allreduce_f32 on the same inputs whenever MPI
 * sums both in the same order: Open MPI 4.1 does (its libnbc reduces an
 * in-place all-reduce and a reduce-scatter over one binomial tree rooted at
 * rank 0, whatever the count), and suite comm checks it on 1 to 4 ranks;
 * another MPI, or a coll component or libnbc algorithm chosen through MCA
 * parameters, may round differently. On self, a no-op (the sum, average and
 * max of one rank are its values). A failure or timeout leaves the
 * communicator unusable, as for an all-reduce. */
cdp_status cdp_comm_reduce_scatter_f32(cdp_comm_t c, float *buf, size_t n, enum cdp_reduce_op op,
                                       double timeout_s);
/* The same over a window (ZeRO-2 reduces one layer's gradients at a time):
 * buf holds the count floats [from, from + count) of an n-float buffer whose
 * shards are cdp_comm_shard(n, size, rank); on return this rank's part of
 * the window, its shard's overlap with [from, from + count) (at buf + its
 * start - from; possibly empty), holds the reduction, the rest of buf is
 * unspecified. Every rank passes the same n, from, count and op. With from
 * 0 and count n it is cdp_comm_reduce_scatter_f32; a window outside the
 * buffer is an error. */
cdp_status cdp_comm_reduce_scatter_window_f32(cdp_comm_t c, float *buf, size_t n, size_t from, size_t count,
                                              enum cdp_reduce_op op, double timeout_s);

/* In-place all-gather of n floats within the deadline: every rank's own
 * shard of buf (cdp_comm_shard(n, size, rank)) is copied into the same place
 * on every other rank, so that on return buf is whole everywhere (the
 * inverse of a reduce-scatter; what buf held outside this rank's shard is
 * overwritten). Every rank passes the same n; n == 0 is a no-op. On mpi:
 * MPI_Iallgatherv (MPI_IN_PLACE) in pieces of at most the chunk size; on
 * self, a no-op. A failure or timeout leaves the communicator unusable. */
cdp_status cdp_comm_allgather_f32(cdp_comm_t c, float *buf, size_t n, double timeout_s);

/* Point to point, non-blocking: the buffer must stay untouched until the
 * request completes. tag >= 0 and below 2^20; peer in 0..size-1 (a rank may
 * send to itself). A receive must name exactly the size of the matching send:
 * a shorter message fails the receive ("expected N bytes"), a longer one
 * fails it with MPI_ERR_TRUNCATE (Open MPI 4.1 does not detect the longer one
 * on a message to self). Messages of any size_t length (above 1 GiB they
 * travel as several messages). On `self`, a send completes when its receive
 * is posted (the bytes are copied once, then). cdp_comm_wait always frees the
 * request; past its deadline it fails with "timed out after N s" (a receive
 * is cancelled; a send is left to MPI, so keep its buffer until the job
 * ends). A communicator must not be freed while it has requests. */
cdp_status cdp_comm_isend(cdp_comm_t c, const void *buf, size_t bytes, int peer, int tag, cdp_request_t *req);
cdp_status cdp_comm_irecv(cdp_comm_t c, void *buf, size_t bytes, int peer, int tag, cdp_request_t *req);
cdp_status cdp_comm_wait(cdp_request_t req, double timeout_s);
/* Never blocks. 0 while the request is pending; 1 when it has completed;
 * -1 when it has completed with an error (message in cdp_last_error()). The
 * request is freed in both non-zero cases. */
int cdp_comm_test(cdp_request_t req);

/* The n sends and receives of ops posted together, complete on return
 * within the deadline (on nccl one NCCL group; elsewhere posted one by one,
 * then waited for). Peers and buffers are checked as for isend / irecv; n == 0
 * is a no-op; ops is not kept. */
cdp_status cdp_comm_group(cdp_comm_t c, const struct cdp_comm_p2p *ops, int n, double timeout_s);

/* Non-blocking collectives: the same operations, arguments and rules as the
 * blocking ones above, started now and completed by cdp_comm_wait (within
 * its deadline, which counts from the wait) or cdp_comm_test; buf must stay
 * untouched until then. Every rank of c starts the same collectives in the
 * same order. On mpi they are MPI_Iallreduce / MPI_Ireduce_scatter /
 * MPI_Iallgatherv, progressed by every test and wait; on nccl they run on the
 * communicator's own stream behind an event of the compute stream, and a
 * completed one makes the compute stream wait on its event; on a backend that has
 * only blocking collectives the operation runs within timeout_s here and the
 * request comes back completed. A request that fails or passes its deadline
 * leaves the communicator unusable, as a blocking collective does. */
cdp_status cdp_comm_iallreduce_f32(cdp_comm_t c, float *buf, size_t n, enum cdp_reduce_op op, double timeout_s,
                                   cdp_request_t *req);
cdp_status cdp_comm_ireduce_scatter_window_f32(cdp_comm_t c, float *buf, size_t n, size_t from, size_t count,
                                               enum cdp_reduce_op op, double timeout_s, cdp_request_t *req);
cdp_status cdp_comm_iallgather_f32(cdp_comm_t c, float *buf, size_t n, double timeout_s, cdp_request_t *req);

/* What the floats of a collective travel as (the plan's /parallel/comm_dtype).
 * CDP_COMM_WIRE_BF16: each rank rounds its floats to bfloat16 (round to
 * nearest even, cdp_f32_to_bf16), the group sums them as bfloat16 (each pair
 * added in fp32 and rounded again, cdp_comm_bf16_sum), and the sum comes back
 * as floats; an average is that sum divided by the size, in fp32. Half the
 * bytes of fp32 on the wire; every rank of the group gets the same bits. The
 * conversion is in place (bf16 needs half of buf): no staging buffer, and buf
 * holds neither the input nor the result until the collective completes. A
 * group of one moves nothing and rounds nothing. Sums and averages only (a
 * max is CDP_ERR_INVALID), on a communicator of host memory (mpi; on device
 * memory CDP_ERR_UNSUPPORTED: the nccl path needs a bf16-to-fp32 kernel). */
enum cdp_comm_wire { CDP_COMM_WIRE_F32 = 0, CDP_COMM_WIRE_BF16, CDP_COMM_WIRE_COUNT };

/* "fp32" / "bf16" */
const char *cdp_comm_wire_name(enum cdp_comm_wire w);

/* The collectives above with the wire named: CDP_COMM_WIRE_F32 is the
 * function without _wire. The all-gather with CDP_COMM_WIRE_BF16 rounds
 * every shard, this rank's own too, so that buf is the same everywhere. */
cdp_status cdp_comm_allreduce_wire(cdp_comm_t c, float *buf, size_t n, enum cdp_reduce_op op,
                                   enum cdp_comm_wire wire, double timeout_s);
cdp_status cdp_comm_iallreduce_wire(cdp_comm_t c, float *buf, size_t n, enum cdp_reduce_op op,
                                    enum cdp_comm_wire wire, double timeout_s, cdp_request_t *req);
cdp_status cdp_comm_reduce_scatter_window_wire(cdp_comm_t c, float *buf, size_t n, size_t from, size_t count,
                                               enum cdp_reduce_op op, enum cdp_comm_wire wire, double timeout_s);
cdp_status cdp_comm_ireduce_scatter_window_wire(cdp_comm_t c, float *buf, size_t n, size_t from, size_t count,
                                                enum cdp_reduce_op op, enum cdp_comm_wire wire, double timeout_s,
                                                cdp_request_t *req);
cdp_status cdp_comm_allgather_wire(cdp_comm_t c, float *buf, size_t n, enum cdp_comm_wire wire, double timeout_s);

/* The bf16 wire's sum, the one home of its rounding (the mpi communicator's
 * reduction op): inout[i] = bf16(float(in[i]) + float(inout[i])), the pair
 * added in fp32 and rounded to nearest even; NaN and infinities as fp32's
 * sum gives them. Commutative, so a ring's or a tree's partners agree. */
void cdp_comm_bf16_sum(const uint16_t *in, uint16_t *inout, size_t n);

cdp_status cdp_comm_barrier(cdp_comm_t c, double timeout_s);

/* Rank 0 receives every rank's bytes (sizes may differ): *out (malloc'd) holds
 * them in rank order and lens[] their sizes (malloc'd, size entries); other
 * ranks get NULL. */
cdp_status cdp_comm_gather_bytes(cdp_comm_t c, const void *buf, size_t bytes, void **out,
                                 size_t **lens, double timeout_s);

/* Collective over c: root's `bytes` bytes of buf are copied into buf on every
 * other rank, within the deadline (MPI_Ibcast; above the chunk size, as several
 * broadcasts). Every rank passes the same bytes and root (0..size-1). Used to
 * hand NCCL's unique id from rank 0 to the others. A failure or timeout leaves
 * the communicator unusable, as for an all-reduce. On `self`, a no-op. */
cdp_status cdp_comm_bcast_bytes(cdp_comm_t c, void *buf, size_t bytes, int root, double timeout_s);

/* Ends the whole job now with this exit code: MPI_Abort(MPI_COMM_WORLD) on
 * mpi (mpirun then kills every rank and exits with the code); on self, exit()
 * (or MPI_Abort when an MPI world is live), the one place the library ends
 * the process, because the caller asked it to. c may be NULL. */
void cdp_comm_abort(cdp_comm_t c, int code);

/* Frees a communicator; NULL is a no-op. Freeing the world finalises MPI. */
void cdp_comm_free(cdp_comm_t c);

/* The host-staging adapter: a communicator on dev's memory over `inner`, a
 * host-memory communicator, for ranks whose device the host cannot read and
 * that cannot use NCCL (ranks sharing a GPU): each operation copies its
 * device buffer to the host, runs on inner, and copies the result back (a
 * receive, once it completes). Takes inner over (freed with the adapter, also
 * when this fails); dev is not owned and must outlive it. Splits are
 * adapters over inner's splits. */
cdp_status cdp_comm_staged(cdp_comm_t inner, cdp_device_t dev, cdp_comm_t *out);

/* Collective over host_world: the communicator that carries this rank's
 * device memory. A device the host reads (cpu): host_world itself (a new
 * handle of it, to free). Else nccl when every rank can use it and no two
 * ranks share a GPU (shared_gpu = 0; every rank passes the same), else the
 * host-staging adapter over a split of host_world; *why (when not NULL) says
 * which and why, for the log. */
cdp_status cdp_comm_for_device(cdp_comm_t host_world, cdp_device_t dev, int shared_gpu, double timeout_s,
                               cdp_comm_t *out, char *why, size_t why_len);

#ifdef __cplusplus
}
#endif

#endif
