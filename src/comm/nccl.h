/* The nccl communicator, a backend of comm/comm.h (cdp_comm_memory says
 * CDP_COMM_DEVICE_MEMORY): collectives and point to point on GPU memory, for
 * ranks that each own one GPU. One world communicator per job, bootstrapped
 * through the host communicator (rank 0 makes NCCL's unique id, the host
 * world broadcasts it), then ncclCommSplit for each stage's data-parallel
 * group and for each pipeline; a rank creates only the groups it belongs to.
 *
 * The core never links NCCL or CUDA: it reaches NCCL through the table the
 * CUDA module lends (comm/nccl_module.h, via the device backend), so this
 * file builds and runs everywhere and fails with CDP_ERR_UNSUPPORTED where
 * the module, NCCL or a GPU is missing, saying which.
 *
 * Every call that waits has a deadline (timeout_s <= 0: none), as on the
 * host communicators: past it, CDP_ERR_COMM "timed out after N s", with the
 * communicator, the rank and the operation in the message. A collective or
 * send/receive group that failed or timed out may still be running on the
 * GPU and writing its buffers: its communicator then refuses further calls,
 * and the caller should end the job: cdp_nccl_abort_all(), then
 * cdp_comm_abort() on the host world.
 *
 * Buffers are device memory of the communicator's GPU (cdp_buffer_data() of
 * a buffer on the device given to cdp_nccl_world), not owned. The operations
 * run on that device's stream, after the work already queued there (the
 * kernels that produced the data), and return once they have completed.
 *
 * Threads: call every function on a communicator from the thread that
 * created the world. */
#ifndef CDP_COMM_NCCL_H
#define CDP_COMM_NCCL_H

#include <stddef.h>

#include "cdp/device.h"
#include "cdp/status.h"
#include "comm/comm.h"
#include "comm/nccl_module.h" /* struct cdp_nccl_p2p */

#ifdef __cplusplus
extern "C" {
#endif

/* An nccl communicator is a communicator of the one interface (comm/comm.h):
 * cdp_comm_allreduce_f32, cdp_comm_group, the non-blocking collectives,
 * cdp_comm_host (the host group of the same ranks, made beside it) and
 * cdp_comm_free all take it, and check and word everything as for the host
 * communicators. The cdp_nccl_* calls below are those calls under NCCL's
 * names (and the bootstrap, which only this backend has). */
typedef cdp_comm_t cdp_nccl_t;

/* CDP_OK when this process can make nccl communicators: the CUDA module
 * loads, it was built with NCCL, and the CUDA runtime sees a GPU. Else
 * CDP_ERR_UNSUPPORTED, and cdp_last_error() says which of the three is
 * missing (with the loader's or CUDA's own error text). Loads the module. */
cdp_status cdp_nccl_available(void);

/* The NCCL the CUDA module runs with (ncclGetVersion: major*10000 +
 * minor*100 + patch). Needs no GPU. CDP_ERR_UNSUPPORTED without the module or
 * without NCCL in it. */
cdp_status cdp_nccl_version(int *out);

/* Collective over host_world (every rank calls it): makes the world nccl
 * communicator on dev, this rank's CUDA device (not owned; it must outlive
 * the communicator and everything split from it). NCCL rank and size are
 * host_world's. Steps, each within timeout_s: every rank checks that it can
 * use NCCL, and rank 0 makes the unique id; the ranks agree through an
 * all-reduce on host_world, so that if any rank cannot (dev NULL or not a
 * CUDA device, module missing, built without NCCL, no GPU) all of them fail at
 * once with CDP_ERR_UNSUPPORTED, and the message of the rank that could not
 * (on the others: which rank it was); then host_world broadcasts the id
 * (cdp_comm_bcast_bytes), every rank initialises its member, and the ranks
 * agree again, so that either all get a communicator or none does. timeout_s
 * is also the deadline of cdp_nccl_split and cdp_nccl_free on this
 * communicator and those split from it. Statuses: CDP_ERR_INVALID (NULL
 * arguments), CDP_ERR_UNSUPPORTED, CDP_ERR_COMM (NCCL or host failures,
 * timeouts), CDP_ERR_NOMEM. */
cdp_status cdp_nccl_world(cdp_comm_t host_world, cdp_device_t dev, double timeout_s, cdp_nccl_t *out);

/* Collective over c (every rank of c calls it, in the same order of splits):
 * ranks with the same color form a new communicator, ordered by key;
 * color < 0 means "not a member" and gives *out = NULL (the rank still has to
 * call). Within the deadline given to cdp_nccl_world. */
cdp_status cdp_nccl_split(cdp_nccl_t c, int color, int key, cdp_nccl_t *out);

int cdp_nccl_rank(cdp_nccl_t c);
int cdp_nccl_size(cdp_nccl_t c);

/* In-place all-reduce of n floats / doubles in device memory (sum, average
 * — ncclAvg, max) within the deadline. n == 0 is a no-op. */
cdp_status cdp_nccl_allreduce_f32(cdp_nccl_t c, float *dev_buf, size_t n, enum cdp_reduce_op op,
                                  double timeout_s);
cdp_status cdp_nccl_allreduce_f64(cdp_nccl_t c, double *dev_buf, size_t n, enum cdp_reduce_op op,
                                  double timeout_s);

/* ZeRO's in-place reduce-scatter (sum, average — ncclAvg, max) and
 * all-gather of n floats in device memory, over the host communicators'
 * shards (cdp_comm_shard(n, size, rank)), within the deadline. After the
 * reduce-scatter, this rank's shard of dev_buf holds the reduction over all
 * ranks of that shard and the rest of dev_buf is unspecified; after the
 * all-gather, every rank's shard has been copied to every rank, so dev_buf is
 * whole everywhere. The caller passes its n floats as they are, no padding,
 * and no scratch memory is taken: when the size divides n, the shards are
 * NCCL's equal blocks and these are ncclReduceScatter / ncclAllGather in
 * place (the fastest path: keep n a multiple of the size to take it);
 * otherwise one NCCL group of in-place ncclReduce (shard k to rank k) or
 * ncclBroadcast (shard k from rank k), one per non-empty shard. The sum and
 * average are NCCL's, whose order of summation depends on the algorithm,
 * the sizes and the topology: equal to cdp_nccl_allreduce_f32's within
 * rounding, not bit-identical to it (unlike the mpi communicator's); the max
 * is exact. Every rank passes the same n (and op); n == 0 is a no-op.
 * Failures and timeouts as for the all-reduce; CDP_ERR_UNSUPPORTED from a
 * module without these operations. */
cdp_status cdp_nccl_reduce_scatter_f32(cdp_nccl_t c, float *dev_buf, size_t n, enum cdp_reduce_op op,
                                       double timeout_s);
cdp_status cdp_nccl_allgather_f32(cdp_nccl_t c, float *dev_buf, size_t n, double timeout_s);
/* The reduce-scatter over a window, as cdp_comm_reduce_scatter_window_f32:
 * dev_buf holds floats [from, from + count) of an n-float buffer; each
 * rank's part is its shard's overlap with the window, reduced by one group
 * of ncclReduce (or ncclReduceScatter where the overlaps are NCCL's equal
 * blocks). */
cdp_status cdp_nccl_reduce_scatter_window_f32(cdp_nccl_t c, float *dev_buf, size_t n, size_t from, size_t count,
                                              enum cdp_reduce_op op, double timeout_s);

/* The n sends and receives of ops, posted together in one NCCL group
 * (ncclGroupStart / ncclGroupEnd), so that matched pairs between two ranks
 * (a stage sending its activations while receiving the gradient) cannot
 * deadlock whatever their order; returns when all have completed, within the
 * deadline. Each peer is a rank of c (itself allowed); a receive must name the
 * size of the matching send (NCCL does not check it: a mismatch corrupts or
 * hangs, then times out). ops is not kept; the buffers must stay untouched
 * until the call returns. n == 0 is a no-op. */
cdp_status cdp_nccl_sendrecv(cdp_nccl_t c, const struct cdp_nccl_p2p *ops, int n, double timeout_s);

/* ncclCommAbort on every nccl communicator this process created and has not
 * freed, newest first: for the job's failure path, before the job ends
 * (cdp_comm_abort). Ends the GPU work they have in flight. The handles stay
 * valid for cdp_nccl_free (every other call fails). ncclCommAbort can itself
 * block if NCCL is wedged (NVIDIA/nccl#829): the host abort that follows is
 * what ends the job. Call it from the thread that uses the communicators,
 * once the failed call has returned (ncclCommAbort frees what a call still
 * polling would read). */
void cdp_nccl_abort_all(void);

/* Frees a communicator; NULL is a no-op. A healthy one is finalised
 * (ncclCommFinalize, within the deadline given to cdp_nccl_world) and
 * destroyed; a broken one, or one whose finalisation fails, is aborted. Free
 * the split communicators before the world. */
void cdp_nccl_free(cdp_nccl_t c);

#ifdef __cplusplus
}
#endif

#endif
