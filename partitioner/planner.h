/* The planner: chooses what a plan leaves "auto" (stages, replicas,
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
#include "pipeline/simulator.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CDP_PLANNER_PLACED_SHAPES 3 /* shapes whose placement is searched (the best by a fixed order) */
#define CDP_PLANNER_MB_CHOICES 4    /* micro-batch counts tried when nothing fixes them */

/* A prediction of one step. */
struct cdp_planner_prediction {
    double step_s, bubble, samples_per_s;
};

/* Stage s (a rank of the pipeline; all its chunks together). */
struct cdp_planner_stage {
    double fwd_s, bwd_s;   /* per micro-batch */
    double memory_bytes;   /* the simulator's peak over the stage's replicas */
    double capacity_bytes; /* 0: unknown (unlimited) */
};

/* Rank r*p + s runs stage s of replica r. */
struct cdp_planner_rank {
    int rank, stage, replica, device, node, gpu;
    double peak_memory;
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

struct cdp_planner_result {
    int stages, replicas, micro_batches, chunks;
    enum cdp_schedule_kind schedule;
    int64_t global_batch;
    int64_t (*ranges)[2];            /* stages*chunks [first, end) unit ranges (owned) */
    int n_ranges;
    struct cdp_planner_stage *stage; /* stages entries (owned) */
    int *device;                     /* [s*R + r] (owned) */
    struct cdp_planner_rank *rank;   /* stages*replicas, by rank (owned) */
    struct cdp_planner_prediction predicted;
    struct cdp_planner_baseline baseline[2];
    char topology[128];
    int world;                       /* devices the search could use */
    char placement_method[200];
    struct cdp_planner_balance balance;
    /* what was searched */
    int64_t shapes;          /* (stages, replicas, micro_batches) candidates */
    int64_t feasible;        /* of them, those whose partition fits */
    int64_t simulations;     /* simulator runs of every rank, placement search included */
    int64_t replica_simulations; /* runs of one replica's pipeline (the cheap model of large worlds) */
    int64_t placed_shapes;   /* shapes whose placement was searched */
    double search_s;         /* wall time of cdp_planner_run */
};

/* Plans: every "auto" of plan->parallel is searched on topology t (not owned;
 * its devices are the world, capped by /cluster/nodes x /cluster/devices when
 * given), fixed values are kept. costs: a measured table checked against the
 * plan (cdp_cost_table_check), or NULL: analytic. The search and the
 * simulations use device 0's rate for every device; after placement each
 * replica's time per micro-batch is scaled to its own devices' rates and the
 * micro-batches are shared per /parallel/balance (result's balance).
 * CDP_ERR_INVALID when nothing fits, naming the smallest stage count that fits
 * or the memory needed, or explicit shares that do not match the shape;
 * CDP_ERR_NOMEM. *out is written only on success (cdp_planner_result_clear). */
cdp_status cdp_planner_run(const struct cdp_plan *plan, const struct cdp_topology *t,
                           const struct cdp_cost_table *costs, struct cdp_planner_result *out);

void cdp_planner_result_clear(struct cdp_planner_result *r);

/* Writes the result into the plan as explicit values: stages, replicas,
 * micro_batches, global_batch, partition, placement (a device list), and for
 * /parallel/balance "speed" the shares when they are not all equal (a planned
 * plan runs with them; equal shares leave "speed"). */
cdp_status cdp_planner_apply(const struct cdp_planner_result *r, struct cdp_plan *plan);

/* "Plan" sections of --dry-run: partition, placement, prediction, balance
 * (with more than one replica), baselines, what was searched. */
void cdp_planner_print(const struct cdp_planner_result *r, FILE *f);

/* {"stages", "placement", "predicted", "balance", "baselines"}: what a fixed
 * plan gives again (nothing about the search, nor whether the shares were
 * computed or given, so --dry-run --json round-trips). New ref. */
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

/* The topology a plan runs on: /cluster/topology, or for "auto" a CPU topology
 * of `ranks` devices (cpu backend), this machine when it has `ranks` GPUs, else
 * the dgx-a100 preset (note says which). */
cdp_status cdp_planner_topology(const struct cdp_plan *plan, int ranks, struct cdp_topology **t, char *note,
                                size_t cap);

/* Sums unit costs into nv virtual stages of ranges; virtual stage k reads
 * cost + (k % p) * stride (stride 0: every stage the same costs). */
void cdp_planner_vstages(const struct cdp_unit_cost *cost, size_t stride, int p, int nv,
                         const int64_t (*ranges)[2], struct cdp_sim_vstage *vs);

/* Bytes/s and latency of every ordered device pair of t, [a*n + b] (n*n each). */
void cdp_planner_links(const struct cdp_topology *t, double *bw, double *lat);

/* REDUCE_TIED_GRADS payload of a GPT with tied embeddings over p*v > 1 chunks. */
double cdp_planner_tied_bytes(const struct cdp_plan *plan, const struct cdp_unit *u, int n);

#ifdef __cplusplus
}
#endif

#endif
