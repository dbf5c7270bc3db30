/* The NCCL table the CUDA module lends the core (found by its symbol,
 * CDP_NCCL_MODULE_SYMBOL, through the device module loader), so that the nccl communicator (comm/nccl.c) reaches NCCL
 * without the core or any program linking CUDA or NCCL. Shared by the core
 * (C) and the module (src/comm/cuda/nccl.cu): keep it valid C and CUDA C++.
 *
 * Every slot fails with a status and a message set through the module host's
 * fail(): the NCCL or CUDA call, its error string and NCCL's last error text.
 * Every call that waits takes a deadline (timeout_s <= 0: none) and fails with
 * CDP_ERR_COMM "timed out after N s" past it; it then leaves the communicator
 * as it is, for the caller to abort. The table is part of the module's ABI
 * (CDP_DEVICE_ABI, device/backend.h): a change of it bumps that. */
#ifndef CDP_COMM_NCCL_MODULE_H
#define CDP_COMM_NCCL_MODULE_H

#include <stddef.h>

#include "cdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* = NCCL_UNIQUE_ID_BYTES (checked in the module) */
#define CDP_NCCL_ID_BYTES 128

enum cdp_nccl_dtype { CDP_NCCL_F32 = 0, CDP_NCCL_F64, CDP_NCCL_DTYPE_COUNT };

/* What a non-blocking collective (start) is. */
enum cdp_nccl_coll { CDP_NCCL_ALLREDUCE = 0, CDP_NCCL_REDUCE_SCATTER, CDP_NCCL_ALLGATHER, CDP_NCCL_COLL_COUNT };

/* One half of a matched pair: bytes go to / come from `peer` (a rank of the
 * communicator). buf is device memory of the communicator's GPU, not owned. */
struct cdp_nccl_p2p {
    int is_send;
    int peer;
    void *buf;
    size_t bytes;
};

struct cdp_nccl_ops {
    /* ncclGetVersion: major*10000 + minor*100 + patch. Needs no GPU. */
    cdp_status (*version)(int *v);
    /* ncclGetUniqueId into id[CDP_NCCL_ID_BYTES] (on one rank; the caller sends
     * it to the others). */
    cdp_status (*unique_id)(void *id);
    /* Makes this rank's member of the communicator named by id, on the GPU of
     * dev_state (a struct cdp_cuda_state), non-blocking underneath
     * (ncclCommInitRankConfig, blocking = 0) and polled until ready. *comm is
     * written on success; on a failure or past the deadline the half-made
     * communicator is aborted here. */
    cdp_status (*init)(void *dev_state, const void *id, int nranks, int rank, double timeout_s,
                       void **comm);
    /* ncclCommSplit: collective over comm; color < 0 is NCCL_SPLIT_NOCOLOR and
     * gives *out = NULL. Past the deadline, the parent stays as it is (abort it). */
    cdp_status (*split)(void *comm, int color, int key, double timeout_s, void **out);
    /* This rank's rank and the size of comm. */
    cdp_status (*rank_size)(void *comm, int *rank, int *size);
    /* In-place all-reduce of n elements (dtype: enum cdp_nccl_dtype; op: enum
     * cdp_reduce_op of comm/comm.h) on the device's stream; returns when it
     * has completed there (so it also waits for work queued before it). */
    cdp_status (*allreduce)(void *comm, void *dev_state, void *buf, size_t n, int dtype, int op,
                            double timeout_s);
    /* ZeRO's in-place reduce-scatter (op: enum cdp_reduce_op) and all-gather
     * of n > 0 floats, on the device's stream; return when they have
     * completed there. Shard k of buf is [off[k], off[k] + len[k]) for every
     * rank k of comm: the core computes them (cdp_comm_shard), the module only
     * reads them. Equal shards in order: ncclReduceScatter / ncclAllGather in
     * place; else one group of ncclReduce / ncclBroadcast, one per non-empty
     * shard, rooted at its rank. */
    cdp_status (*reduce_scatter)(void *comm, void *dev_state, float *buf, size_t n, const size_t *off,
                                 const size_t *len, int op, double timeout_s);
    cdp_status (*all_gather)(void *comm, void *dev_state, float *buf, size_t n, const size_t *off,
                             const size_t *len, double timeout_s);
    /* The n sends and receives inside one ncclGroupStart / ncclGroupEnd (as
     * bytes), on the device's stream; returns when all have completed. */
    cdp_status (*p2p)(void *comm, void *dev_state, const struct cdp_nccl_p2p *ops, int n,
                      double timeout_s);
    /* Non-blocking collectives on the communicator's own stream (made with
     * the communicator in init / split, one per communicator). start records
     * an event on the device's compute stream (behind the kernels that made
     * buf), makes the communicator's stream wait on it, issues the collective
     * there (coll: enum cdp_nccl_coll; allreduce: n elements of dtype;
     * reduce_scatter / all_gather: n > 0 floats with the shards off/len as
     * for the blocking slots, read during the call only) and records a
     * completion event behind it; *req is written on success. timeout_s
     * bounds only the wait for an earlier operation of comm to be issued.
     * test: *done = 1 once the completion event has passed
     * (cudaEventQuery), and then the compute stream is made to wait on it,
     * so that whatever is queued there later (the optimizer) reads the
     * result; NCCL's own errors (ncclCommGetAsyncError) fail it. release
     * frees req, complete or not (an incomplete one still runs: the caller
     * must abort the communicator). */
    cdp_status (*start)(void *comm, void *dev_state, int coll, void *buf, size_t n, int dtype, int op,
                        const size_t *off, const size_t *len, double timeout_s, void **req);
    cdp_status (*test)(void *req, int *done);
    void (*release)(void *req);
    /* ncclCommAbort: ends whatever is in flight and frees the communicator.
     * comm is gone afterwards. */
    void (*abort)(void *comm);
    /* ncclCommFinalize, polled within the deadline, then ncclCommDestroy; past
     * the deadline or on an error, ncclCommAbort instead (and a status). comm
     * is gone afterwards in every case. */
    cdp_status (*destroy)(void *comm, double timeout_s);
};

/* The symbol of the table in the CUDA module, exported when it is built with
 * NCCL (cdp_device_module_symbol finds it). */
#define CDP_NCCL_MODULE_SYMBOL "cdp_nccl_module_ops"
extern const struct cdp_nccl_ops cdp_nccl_module_ops;

#ifdef __cplusplus
}
#endif

#endif
