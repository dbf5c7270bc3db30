/* Internal: the layout's fields, read and written by the planner, the
 * executor and the simulator; programs that embed cdphybrid see it opaque
 * through cdp/layout.h.
 *
 * The layout: the one resolved answer to "how does this plan run". Shape
 * (stages, chunks, replicas, micro-batches), schedule, each replica's share of
 * a step's micro-batches, the unit range of every virtual stage, and for every
 * rank its node, device, stage, replica, CPU set and memory cap, with the
 * memory it is predicted to allocate. The planner fills it
 * (partitioner/planner.h); the executor, the simulator, --schedule and
 * --dry-run read it and decide none of it themselves. Plain data: nothing here
 * touches a device or a communicator, so partitioner/ may use it.
 *
 * Ranks are numbered in device order (node by node), so the ranks of one node
 * are consecutive, as mpirun and srun start them. */
#ifndef CDP_PIPELINE_LAYOUT_H
#define CDP_PIPELINE_LAYOUT_H

#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "cdp/layout.h"
#include "cdp/plan.h"
#include "cdp/status.h"
#include "model/layers.h"
#include "model/model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CDP_LAYOUT_CPUSET_MAX 256

/* What a rank allocates, as predicted. Device bytes are what the device
 * layer's accounting counts (cdp_device_mem_peak); host bytes are what the
 * process holds besides (host staging, data buffers, the process itself). */
struct cdp_rank_memory {
    uint64_t params, grads, optimizer; /* fp32 state of the parameters it holds */
    uint64_t activations;              /* kept activations, inputs and targets of its slots */
    uint64_t buffers;                  /* scratch, backward gradients, recomputation, losses, pipeline gradient
                                        * buffers */
    uint64_t device;                   /* the sum of the above */
    uint64_t host;
};

struct cdp_layout_rank {
    int stage, replica;
    int tensor;   /* its index in its stage's tensor group, 0 .. layout tensor - 1 */
    int node;     /* node of the planned topology */
    int device;   /* global device index in the planned topology */
    int gpu;      /* the device it opens on its node: the GPU index (cuda); on cpu the host (shown only) */
    char cpuset[CDP_LAYOUT_CPUSET_MAX]; /* CPUs it is bound to, Linux list form ("0-3"); "" = not bound */
    uint64_t capacity; /* device memory cap it runs under (the planner's); 0 = the device's own */
    double peak_flops; /* its device's dense peak FLOP/s at the plan's precision (its share of a shared
                        * GPU), for the step lines' MFU; 0 = unknown (CPU devices, unknown GPUs) */
    struct cdp_rank_memory memory; /* predicted */
};

struct cdp_layout {
    enum cdp_backend backend;
    int stages, chunks, replicas;
    int tensor;           /* t: the ranks of one stage of one replica (its tensor group), each holding a
                           * 1/t slice of the stage's split layers; 1: a stage is one device */
    int micro_batches;    /* per replica per step, before shares (the shares' mean) */
    int micro_batch;      /* samples per micro-batch */
    enum cdp_schedule_kind schedule;
    enum cdp_recompute recompute; /* what every stage keeps for its backward (cdp_unit_set_recompute) */
    int zero;                     /* 1: each stage's optimizer state sharded over its replicas (ZeRO-1),
                                   * 2: its gradients too (ZeRO-2); only with replicas > 1 */
    int64_t *shares;      /* replicas entries: micro-batches of each replica per step (owned) */
    int64_t (*ranges)[2]; /* stages x chunks: [first, end) units of virtual stage k, placed on a stage
                             and chunk by cdp_schedule_vstage (owned) */
    int n_ranks;          /* stages x replicas x tensor */
    struct cdp_layout_rank *rank; /* by world rank (owned) */
    int n_nodes;          /* nodes of the planned topology */
    int shared_devices;   /* some ranks share a device: device memory between ranks travels through the host */
    char topology[128];   /* the planned topology's name, for messages */
    int64_t rebalance_every; /* re-measure and move micro-batches every N steps; 0 = never */
    char *schedule_file;  /* the lists come from this file (absolute path; owned), or NULL: generated */
};

/* A zeroed layout of p stages, v chunks, R replicas (tensor 1) with its
 * arrays allocated (shares, ranges, ranks). CDP_ERR_INVALID for counts below
 * 1 or p*R*v past 2^24; CDP_ERR_NOMEM. Free with cdp_layout_free (NULL is a
 * no-op). */
cdp_status cdp_layout_create(int p, int v, int R, struct cdp_layout **out);
/* The same with t ranks per stage and replica (a tensor group each):
 * p x R x t ranks. CDP_ERR_INVALID also for t below 1 or p*R*t*v past 2^24. */
cdp_status cdp_layout_create_tensor(int p, int v, int R, int t, struct cdp_layout **out);
void cdp_layout_free(struct cdp_layout *l);

/* The world rank that runs stage s of replica r (its tensor index 0), or -1. */
int cdp_layout_rank_of(const struct cdp_layout *l, int s, int r);
/* The world rank that runs tensor slice k of stage s of replica r, or -1. */
int cdp_layout_rank_at(const struct cdp_layout *l, int s, int r, int k);

/* SHA-256 (hex) of what every rank of a job must agree on: the shape, the
 * schedule (and its file), recomputation, ZeRO, rebalancing, shares, ranges
 * and each rank's stage, replica, node and device (not CPU sets or
 * predictions). */
void cdp_layout_digest(const struct cdp_layout *l, char hex[65]);

/* A copy of l (its arrays and schedule file too). CDP_ERR_NOMEM. */
cdp_status cdp_layout_copy(const struct cdp_layout *l, struct cdp_layout **out);

/* Where a and b first differ in what cdp_layout_digest covers, as
 * "/ranks/3/device: 2 here, 5 there" (a's value, then b's) into buf; returns
 * 0 when they agree (buf ""), 1 otherwise. */
int cdp_layout_diff(const struct cdp_layout *a, const struct cdp_layout *b, char *buf, size_t cap);

/* ---- the layout's JSON form (layout_json.c; docs/plan.md, "The layout") ---- */

#define CDP_LAYOUT_JSON_VERSION 1

/* The layout as JSON: {"version", "backend", "topology", "nodes", "stages",
 * "chunks", "replicas", "tensor", "micro_batches", "micro_batch", "schedule",
 * "schedule_file", "recompute", "zero", "rebalance_every", "shares",
 * "ranges" (by virtual stage), "shared_devices", "ranks": [{"stage",
 * "replica", "tensor", "node", "device", "gpu", "cpuset", "capacity_bytes", "memory":
 * {...}}]}. New reference; NULL: out of memory. */
json_t *cdp_layout_to_json(const struct cdp_layout *l);

/* Reads the layout at JSON pointer ptr ("/layout" in planned.json, "" for a
 * file of its own) of file (for messages), checked as a plan is: every key
 * known (else "unknown key", with "did you mean"), every value of its type
 * and range, arrays of the shape's length, the version one this library
 * reads; then cdp_layout_check's rules but the unit count's. CDP_ERR_INVALID
 * "FILE: /layout/ranks/2/stage: expected ..."; CDP_ERR_NOMEM. */
cdp_status cdp_layout_from_json(const json_t *j, const char *file, const char *ptr, struct cdp_layout **out);

/* Checks a layout against the plan it runs: the model's units
 * (cdp_layout_check), and every value the plan fixes (backend, stages,
 * chunks, replicas, micro-batches and their size, schedule and its file,
 * recompute, ZeRO, rebalancing, partition, placement, shares) agrees with the
 * layout's; CDP_ERR_INVALID naming both places ("planned.json: /layout/ranks/
 * 0/device is 1, /parallel/placement/0/0 is 0"), file being the layout's. */
cdp_status cdp_layout_check_plan(const struct cdp_layout *l, const struct cdp_plan *plan, const char *file);

/* The layout a planned file holds (its "layout" key; a run of cdphybrid
 * writes it into planned.json), read and checked against plan (loaded from
 * the same file) with cdp_layout_check_plan; *out NULL when the file has
 * none. CDP_ERR_IO when it cannot be read. */
cdp_status cdp_layout_of_planned(const char *path, const struct cdp_plan *plan, struct cdp_layout **out);

/* Checks a layout against the plan it is for: every (stage, replica) on one
 * rank, ranks in node order, ranges contiguous over the model's n_units units,
 * shares positive and summing to replicas x micro_batches. CDP_ERR_INVALID
 * naming what is wrong. */
cdp_status cdp_layout_check(const struct cdp_layout *l, int64_t n_units);

/* The most micro-batches replica r may run in a step (its share, or with
 * /parallel/rebalance_every all but one unit of each other replica: rebalancing
 * may move that many to it), and the activation slots each of its stages
 * needs for them (slots: l->stages entries): the most (micro-batch, chunk)
 * activations the stage's schedule holds at once, the larger of the MPI and
 * the NCCL (rendezvous) orders, so the count does not depend on the
 * transport. CDP_ERR_INVALID / CDP_ERR_NOMEM from the schedule builder. */
cdp_status cdp_layout_slots(const struct cdp_layout *l, int r, int *mcap, int *slots);

/* The same, and (wslots, l->stages entries, unless NULL) the W-state slots
 * each stage needs: the most micro-batches its schedule holds between a
 * BACKWARD_INPUT and its BACKWARD_WEIGHT (cdp_schedule_peak_w_pending), the
 * larger of both orders; 0 for the schedules that do not split the backward. */
cdp_status cdp_layout_slots_ex(const struct cdp_layout *l, int r, int *mcap, int *slots, int *wslots);

/* The executor's own buffers of one chunk (virtual stage vstage of nv) whose
 * first unit is `first` and last `last` with `slots` activation slots: the
 * gradient arriving from the next stage (vstage < nv - 1) and a ring of
 * slots + 1 gradients going back to the previous one (vstage > 0, float
 * input). Device memory; where the host does not see the device, each also has
 * a host copy, and so does each slot's output and the arriving input. */
struct cdp_chunk_buffers {
    uint64_t grad_in;     /* bytes, 0 = none */
    int n_grad_out;       /* ring entries, 0 = none */
    uint64_t grad_out;    /* bytes of each ring entry */
    uint64_t host;        /* staging bytes in host memory (0 where the host sees the device) */
};
void cdp_layout_chunk_buffers(const struct cdp_unit_bytes *first, const struct cdp_unit_bytes *last, int vstage,
                              int nv, int slots, int host_visible, struct cdp_chunk_buffers *out);

/* The device and host bytes of one chunk: the model range's buffers
 * (cdp_model_bytes_of), its W-states (wslots x wstate_sum, the range's
 * units' wstate_bytes added up, cdp_model_bytes_add_wstate; counted with the
 * activations), its optimizer state and the executor's chunk buffers.
 * The planner's partition evaluates this for every candidate range from terms
 * it keeps incrementally; cdp_layout_memory sums it over a rank's chunks.
 * zero >= 1 with shards > 1: ZeRO-1, the optimizer state of shard `shard`
 * of the chunk's parameters only (cdp_shard); zero 2 also its gradients
 * (cdp_model_bytes_of). */
void cdp_layout_chunk_memory(const struct cdp_plan *plan, const struct cdp_range_terms *t, uint64_t shared_floats,
                             const struct cdp_unit_bytes *first, const struct cdp_unit_bytes *last, int ends_model,
                             int vstage, int nv, int slots, uint64_t wstate_sum, int wslots, int host_visible, int zero,
                             int shards, int shard, struct cdp_rank_memory *out);

/* Host bytes every rank process holds whatever its stage (code, libraries,
 * MPI and BLAS buffers), measured on the development machines (docs/planner.md). */
#define CDP_LAYOUT_PROCESS_BYTES (48ull << 20)

/* What every rank of l allocates (fills each l->rank[].memory): its chunks'
 * cdp_layout_chunk_memory with its slots, its data buffers and host staging,
 * and CDP_LAYOUT_PROCESS_BYTES; ranks of a stage whose replicas have equal
 * shares are computed once. units: the plan's n units with attention state
 * sized as the backend keeps it (what cdp_unit_fit_kernels gives the
 * executor's models). */
cdp_status cdp_layout_memory(const struct cdp_plan *plan, struct cdp_layout *l, const struct cdp_unit *units, int n);

/* "cuda:3" or "cpu" (the device a rank opens), for messages and metrics. */
void cdp_layout_device_name(const struct cdp_layout *l, int rank, char *buf, size_t cap);

/* The ranks as JSON: [{"rank", "node", "device", "gpu", "stage", "replica",
 * "cpuset", "memory_bytes", "host_bytes"}]. New reference (NULL: out of memory). */
json_t *cdp_layout_ranks_json(const struct cdp_layout *l);

#ifdef __cplusplus
}
#endif

#endif
