/* Internal: the planner as the program and the library see it (the result's
 * fields, the search's knobs); programs that embed cdphybrid use cdp/planner.h,
 * which hides all of this behind struct cdp_planned.
 *
 * The planner: chooses what a plan leaves "auto" (stages, replicas,
 * micro-batches, partition, placement) for the best predicted throughput, by
 * searching shapes, splitting each with the memory-aware partition, placing the
 * best few with the placement search and simulating every candidate; then
 * shares each step's micro-batches among the replicas by their devices' speed.
 * Also the pieces --simulate shares with it (topology of a plan, per-stage
 * sums, link matrices). Search and limits: docs/planner.md. */
#ifndef CDP_PARTITIONER_PLANNER_H
#define CDP_PARTITIONER_PLANNER_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

#include "cdp/plan.h"
#include "cdp/status.h"
#include "cdp/topology.h"
#include "partitioner/costs.h"
#include "pipeline/layout.h"
#include "pipeline/simulator.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CDP_PLANNER_PLACED_SHAPES 3 /* shapes whose placement is searched (the best by a fixed order) */
#define CDP_PLANNER_MB_CHOICES 4    /* micro-batch counts tried when nothing fixes them */
#define CDP_PLANNER_AUTO_CHUNKS 4   /* "auto" schedule: interleaved tried at 2 up to this many chunks a rank */

/* A prediction of one step. */
struct cdp_planner_prediction {
    double step_s, bubble, samples_per_s;
};

/* Stage s (a rank of the pipeline; all its chunks together). */
struct cdp_planner_stage {
    double fwd_s, bwd_s;   /* per micro-batch */
    double memory_bytes;   /* the most device memory one of its ranks allocates (cdp_layout_memory) */
    double capacity_bytes; /* the least cap of its ranks' devices; 0: unknown (unlimited) */
};

struct cdp_planner_baseline {
    const char *name; /* "ordered-pp-inner", "ordered-dp-inner" (static) */
    struct cdp_planner_prediction pred;
};

/* The load balance of a result (docs/planner.md, "Mixed GPUs"): how a step's
 * micro-batches are shared among the replicas, each replica's time per
 * micro-batch on its own devices, and the step predicted with the shares and
 * with equal shares by cdp_balance_step_time plus what follows the
 * forward/backward phase in the simulation (all-reduce, optimizer). */
struct cdp_planner_balance {
    enum cdp_balance_kind kind;  /* what the plan asked for */
    int64_t *shares;             /* replicas entries: micro-batches per step (owned) */
    double *t_s;                 /* replicas entries: seconds per micro-batch on its slowest stage (owned) */
    char (*devices)[96];         /* replicas entries: "A100-SXM4-80GB x2" (owned) */
    double step_s;               /* predicted step with the shares */
    double uniform_step_s;       /* with micro_batches each */
    double gain;                 /* uniform_step_s / step_s - 1 */
    double rest_s;               /* the simulated step after the forward/backward phase, in both */
};

/* Host memory of one node of the layout: what its ranks hold together
 * (device memory too on the cpu backend, where devices are host memory)
 * against what the node has. */
struct cdp_planner_node {
    double bytes;
    double capacity_bytes; /* 0: unknown */
    char capacity_from[160]; /* where the capacity comes from ("/cluster/host_memory", "MemAvailable 23.2 GiB") */
};

#define CDP_PLANNER_TENSOR_CHOICES 8 /* t values /parallel/tensor "auto" tries at most */
#define CDP_PLANNER_TENSOR_ALTS (2 * CDP_PLANNER_TENSOR_CHOICES) /* each with and without sequence parallelism */

/* What one (t, sequence parallel) of the search gave (/parallel/tensor or
 * /parallel/sequence_parallel "auto"). */
struct cdp_planner_tensor_alt {
    int tensor, ok;          /* ok 0: nothing fits at this t (why) */
    int sequence_parallel;   /* planned with it */
    int bounded;             /* shapes whose bound was under another t's plan were not simulated: this is
                                the best of the others */
    int stages, replicas, micro_batches, chunks;
    enum cdp_schedule_kind schedule;
    enum cdp_recompute recompute;
    double step_s, samples_per_s, bubble;
    double peak_bytes;       /* the most device memory a rank allocates */
    char why[256];
};

/* The best shape simulated that uses more devices than the chosen one (none: stages 0). */
struct cdp_planner_more {
    int stages, replicas, micro_batches;
    double samples_per_s; /* screened: under the fixed placement */
};

struct cdp_planner_result {
    struct cdp_layout *layout;       /* the chosen layout: shape, ranges, shares, every rank's place,
                                        CPU set, cap and predicted memory (owned) */
    struct cdp_planner_stage *stage; /* layout->stages entries (owned) */
    struct cdp_planner_node *node;   /* layout->n_nodes entries (owned) */
    int predicted_ok;                /* 0 when the step was not simulated (CDP_PLANNER_LAYOUT_ONLY) */
    struct cdp_planner_prediction predicted;
    struct cdp_planner_baseline baseline[2];
    int world;                       /* devices the search could use (tensor groups with t > 1) */
    struct cdp_planner_more more;    /* why devices stay idle (docs/planner.md) */
    char placement_method[200];
    struct cdp_planner_balance balance;
    /* what was searched */
    int64_t shapes;          /* (stages, replicas, micro_batches) candidates */
    int64_t checked;         /* of them, those whose memory was checked (the others' bound could not win) */
    int64_t feasible;        /* of those, the ones that fit */
    int64_t pruned;          /* shapes not simulated (unchecked, or checked and fitting): their bound could not
                              * reach the shapes placed */
    int64_t simulations;     /* simulator runs of every rank, placement search included */
    int64_t replica_simulations; /* runs of one replica's pipeline (the cheap model of large worlds) */
    int64_t placed_shapes;   /* shapes whose placement was searched */
    double search_s;         /* wall time of cdp_planner_run */
    int sequence_parallel;   /* the layout runs sequence parallel (/parallel/sequence_parallel, as planned) */
    /* /parallel/tensor or /parallel/sequence_parallel "auto": the best plan of
     * each (t, sequence parallel) tried (the chosen one among them), and why
     * larger t were not tried ("" none) */
    struct cdp_planner_tensor_alt tensor_alt[CDP_PLANNER_TENSOR_ALTS];
    int n_tensor_alt;
    char tensor_why[256];
};

/* cdp_planner_run flags. */
#define CDP_PLANNER_LAYOUT_ONLY 1 /* a plan that fixes everything: no simulation, no prediction (the ranks of
                                     a launched job, which only need their layout) */
#define CDP_PLANNER_CHECK_EVERY_SHAPE 2 /* check every shape's memory before the screening step, not only those
                                           whose bound could still win: the same plan and simulations, with
                                           checked == shapes (slower: docs/planner.md) */

/* Plans: every "auto" of plan->parallel is searched on topology t (not owned;
 * its devices are the world, capped by /cluster/nodes x /cluster/devices when
 * given), fixed values are kept, and the answer is one layout. costs: a
 * measured table checked against the plan (cdp_cost_table_check), or NULL:
 * analytic. The search and the simulations use device 0's rate for every
 * device; after placement each replica's time per micro-batch is scaled to
 * its own devices' rates and the micro-batches are shared per
 * /parallel/balance (result's balance). Memory is what the executor
 * allocates (cdp_layout_memory): a layout fits when every rank's device bytes
 * are within its device's cap and every node's host bytes within its memory.
 * CDP_ERR_INVALID when nothing fits, naming the smallest device cap that would
 * fit (and the layout that needs it) or the host memory needed, or explicit
 * shares that do not match the shape; CDP_ERR_NOMEM. *out is written only on
 * success (cdp_planner_result_clear). */
cdp_status cdp_planner_run(const struct cdp_plan *plan, const struct cdp_topology *t,
                           const struct cdp_cost_table *costs, int flags, struct cdp_planner_result *out);

void cdp_planner_result_clear(struct cdp_planner_result *r);

/* Writes the result into the plan as explicit values: stages, replicas,
 * micro_batches, global_batch, schedule, partition, placement (a device
 * list), and for /parallel/balance "speed" the shares when they are not all
 * equal (a planned plan runs with them; equal shares leave "speed"). The plan
 * then plans to the same layout without a search: it is what planned.json
 * holds. */
cdp_status cdp_planner_apply(const struct cdp_planner_result *r, struct cdp_plan *plan);

/* Writes the result's sequence parallelism into the plan (/parallel/sequence_parallel
 * true or false, and the units' model.seq_parallel): what cdp_planner_apply
 * does for it, for a caller that keeps the plan's other "auto" values
 * (--simulate). */
void cdp_planner_apply_sequence_parallel(const struct cdp_planner_result *r, struct cdp_plan *plan);

/* "Plan" sections of --dry-run and of a training run's start: shape,
 * partition (per stage time, memory and headroom), placement (rank -> node,
 * device, GPU, stage, replica, CPU set, memory), prediction, host memory,
 * balance (with more than one replica), baselines, what was searched. */
void cdp_planner_print(const struct cdp_planner_result *r, FILE *f);

/* The layout in a few lines, as training prints it before it starts: shape,
 * partition, ranks (node, device, GPU, stage, replica, CPU set, memory), the
 * predicted step and each node's host memory. */
void cdp_planner_print_brief(const struct cdp_planner_result *r, FILE *f);

/* {"stages", "placement", "predicted", "balance", "baselines", "host"}: what
 * a fixed plan gives again (nothing about the search, nor whether the shares
 * were computed or given, so --dry-run --json round-trips); with
 * /parallel/tensor "auto" also "tensor_search" (each t's plan, why larger t
 * were not tried), which the resolved plan, its t fixed, does not repeat.
 * New ref. */
json_t *cdp_planner_to_json(const struct cdp_planner_result *r);

#define CDP_PLANNER_EXPLORE_SAMPLES 200 /* random placements --explore placements evaluates */

/* The spread of predicted step times over placements of one shape. */
struct cdp_planner_spread {
    int stages, replicas, n_random, cheap; /* cheap: evaluated on the one-replica model (large world) */
    uint64_t seed;
    double chosen_s, pp_inner_s, dp_inner_s;     /* step time of each */
    double min_s, median_s, max_s;               /* over the random placements */
    double chosen_pct, pp_inner_pct, dp_inner_pct; /* % of the random placements strictly faster */
    int64_t simulations;
};

/* --explore placements: for r's shape, partition and placement (r from
 * cdp_planner_run), predicts the chosen placement, both fixed orders and
 * n_random random injective placements (seeded splitmix64, deterministic) on
 * t with the objective the placement search used (docs/planner.md).
 * CDP_ERR_INVALID (n_random < 1, a shape larger than t), CDP_ERR_NOMEM;
 * *out written only on success. */
cdp_status cdp_planner_explore(const struct cdp_plan *plan, const struct cdp_topology *t,
                               const struct cdp_cost_table *costs, const struct cdp_planner_result *r, int n_random,
                               uint64_t seed, struct cdp_planner_spread *out);
void cdp_planner_spread_print(const struct cdp_planner_spread *s, FILE *f);

/* The topology a plan runs on: /cluster/topology; for "auto" on the cpu
 * backend this host as a CPU topology (its CPUs and NUMA nodes; one device per
 * core, or per rank where the plan fixes more ranks, or /cluster/devices per
 * node); on cuda this machine when it has the GPUs (live discovery, else a
 * generic topology of the live_gpus GPUs the device layer found), else
 * the dgx-a100 preset to plan for (note says which). With
 * /cluster/ranks_per_device k > 1 every GPU offers k devices (a generic
 * topology of GPUs x k; the layout's gpu is device / k). */
cdp_status cdp_planner_topology(const struct cdp_plan *plan, int live_gpus, struct cdp_topology **t, char *note,
                                size_t cap);

/* Simulates one step of layout l (the planner's, for plan on t) on the cost
 * model (costs as in cdp_planner_run) and t's links: what --simulate shows
 * and traces, with one trace row per world rank. The plan's sequence
 * parallelism is the planned one (cdp_planner_apply_sequence_parallel where
 * it was "auto"). *out owned by the caller. */
cdp_status cdp_planner_simulate(const struct cdp_plan *plan, const struct cdp_topology *t,
                                const struct cdp_cost_table *costs, const struct cdp_layout *l,
                                struct cdp_sim_result **out);

#ifdef __cplusplus
}
#endif

#endif
