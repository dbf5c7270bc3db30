/* Internal to the planner (partitioner/planner*.c): the search's context and
 * candidates, and the parts of the search that live in files of their own.
 * The public side is partitioner/planner.h. */
#ifndef CDP_PLANNER_INTERNAL_H
#define CDP_PLANNER_INTERNAL_H

#include <stdint.h>
#include "model/layers.h"
#include "partitioner/planner.h"
#include "pipeline/schedule.h"

struct mem_index {
    int n, levels;
    struct cdp_unit_bytes *ub;   /* n */
    uint64_t *held, *win;        /* n + 1 prefix sums */
    unsigned __int128 *act;      /* n + 1 prefix sums: each unit's below 2^62, their sum may pass 2^64 */
    unsigned __int128 *wst;      /* n + 1 prefix sums of wstate_bytes (split backward's W-state) */
    uint64_t *scr, *io, *wrk, *wmx; /* levels x n sparse tables of maxima */
    int n_ties;
    int *tie_unit, *tie_owner;   /* units with a tied parameter and its owner */
    uint64_t *tie_floats;
};

struct cand {
    int p, R, m;
    enum cdp_schedule_kind kind;
    int v;                /* chunks per rank (cdp_schedule_chunks_of) */
    enum cdp_recompute rc;
    int zero;
    int64_t (*ranges)[2]; /* p*v */
    double step_s, sps;   /* with the screening placement */
    double lb_sps;        /* the most it could give (a lower bound on its step: planner.c, bound_sps) */
    int screened;         /* simulated (step_s, sps set) */
    double peak;          /* the largest rank's device bytes */
    int seq;              /* its shape's place in the order shapes are enumerated */
};

/* A shape enumerated by the search (planner.c, try_shapes), before its memory
 * is checked: ub is at least the bound (bound_sps) of whatever candidate
 * checking it gives, in any recompute mode (shape_bound). */
struct shape {
    int p, R, m;
    enum cdp_schedule_kind kind;
    int chunks;  /* as cdp_planner_set_kind takes it */
    double ub;
    int checked; /* its memory was checked (check_shape) */
};

struct ctx {
    const struct cdp_plan *plan;
    const struct cdp_topology *t;
    int n, nd, v, hv;
    /* tensor groups (/parallel/tensor t; "auto" plans t = 1 until the search
     * over t decides it): t consecutive devices of one node each. The search
     * places (stage, replica) on a group, named by its first device (leader),
     * so every device[] the search handles is a leader; the layout gives
     * tensor index k the device leader + k. t = 1: every device is a group. */
    int tp, n_groups;
    int *leader; /* n_groups devices (owned) */
    enum cdp_schedule_kind kind;
    /* per recompute mode: the plan's units (attention state as the backend
     * keeps it, activations as the mode keeps them), their costs and memory */
    struct {
        struct cdp_unit *u;
        struct cdp_unit_cost *cost;
        struct mem_index mi;
    } mode[CDP_RECOMPUTE_COUNT];
    enum cdp_recompute rc; /* the mode of u, cost and mi (cdp_planner_use_mode) */
    int zero;              /* the candidate's ZeRO stage, 0, 1 or 2 (its replicas > 1) */
    struct cdp_unit *u;
    struct cdp_unit_cost *cost;
    struct mem_index *mi;
    double *bw, *lat;
    int *node; /* nd: each device's node (the simulator's ports) */
    double cap;        /* bytes per device; 0 unlimited */
    double tied_bytes; /* of the model; used when p*v > 1 */
    int64_t sims, cheap_sims;
    int cheap;         /* 1: screen and place on the one-replica model (large worlds) */
    int *rdev;         /* p: devices of one replica (cheap model scratch) */
    double *keys;      /* cheap model cache: link signature of each distinct replica pipeline */
    double *key_val;   /* its step time */
    uint64_t *key_hash;
    int n_keys, cap_keys;
    double *lbw, *llat; /* p*p: links among one replica's devices */
    /* full simulations' numbers, by shape and devices (place_best, finish) */
    struct sim_memo {
        uint64_t key;
        int *device; /* p*R */
        struct cdp_planner_prediction pred;
        double phase_s;
    } memo[CDP_PLANNER_PLACED_SHAPES + 3];
    int n_memo;
    /* the candidate being simulated */
    int p, R, m;
    struct cdp_schedule *sched;
    /* long pipelines (m > 4p): the schedules of lin_m[0] and lin_m[1]
     * micro-batches, whose steps extrapolate to m for the cheap model and the
     * placement search (NULL: m is simulated) */
    struct cdp_schedule *lin_sched[2];
    int lin_m[2];
    struct cdp_sim_vstage *vs;
    int *slots;        /* 2p: activation slots of each stage (the partition's memory), then its W-state slots */
};

/* What the search over shapes keeps: the candidates that fit (cand) and every
 * shape tried (tried, for the smallest-capacity message), and why the last
 * shape that did not fit did not. */
struct search {
    struct cand *cand, *tried;
    int n_cand, n_tried, cap;
    struct shape *shape; /* every shape enumerated, in order */
    int n_shape, cap_shape;
    int n_checked, n_fit; /* shapes whose memory was checked; of them, those that fit */
    char why[1024];
    int device_short; /* a shape did not fit for device memory (not host memory) */
    int largest_tried;
    int layout_only;  /* every choice is the plan's: no simulation */
    int *dev;         /* scratch placement, nd entries */
    struct cdp_layout *cl;
    struct cdp_sim_result *sr;
};

/* ---- planner_context.c: the search's context: units, costs, links and memory per recompute mode */

void cdp_planner_set_kind(struct ctx *c, enum cdp_schedule_kind kind, int chunks);
void cdp_planner_ctx_free(struct ctx *c);
void cdp_planner_use_mode(struct ctx *c, enum cdp_recompute r);
int cdp_planner_zeros_of(const struct cdp_plan *plan, int R, int *out);
int cdp_planner_modes_of(const struct cdp_plan *plan, enum cdp_recompute *out);
cdp_status cdp_planner_ctx_init(struct ctx *c, const struct cdp_plan *plan, const struct cdp_topology *t,
                                const struct cdp_cost_table *costs);
cdp_status cdp_planner_ctx_init_for(struct ctx *c, const struct cdp_plan *plan, const struct cdp_topology *t,
                                    const struct cdp_cost_table *costs, enum cdp_recompute r);

/* ---- planner_memory.c: memory: unit ranges in O(1), what a layout needs, whether it fits */

void cdp_planner_mem_index_free(struct mem_index *m);
cdp_status cdp_planner_mem_index_build(struct mem_index *m, const struct cdp_plan *plan, const struct cdp_unit *u, int n);
uint64_t cdp_planner_device_cap(const struct cdp_plan *plan, const struct cdp_topology *t, int d);
double cdp_planner_part_memory(void *vc, int s, int first, int end);
double cdp_planner_node_capacity(const struct cdp_plan *plan, const struct cdp_topology *t, int node, char *from,
                                 size_t cap);
double cdp_planner_rank_host_bytes(const struct ctx *c, const struct cdp_layout_rank *k);
cdp_status cdp_planner_layout_memory(const struct ctx *c, struct cdp_layout *l);
int cdp_planner_misfit(const struct ctx *c, const struct cdp_layout *l, double *peak, char *why, size_t cap);

/* ---- planner_predict.c: a candidate on the simulator: full, memoised and the cheap one-replica model */

int cdp_planner_tied_model(const struct cdp_plan *plan);
cdp_status cdp_planner_sim(struct ctx *c, const int *device, const int *trace_rank, struct cdp_sim_result **out);
int cdp_planner_layout_shares_processors(const struct cdp_layout *l);
cdp_status cdp_planner_simulate_layout(struct ctx *c, const struct cdp_layout *l, struct cdp_sim_result **out);
cdp_status cdp_planner_sim_numbers(struct ctx *c, const int *device, struct cdp_planner_prediction *pred, double *phase);
cdp_status cdp_planner_cheap_step(struct ctx *c, const int *device, int all, double *step);
double cdp_planner_place_cost(const int *device, void *vctx);
double cdp_planner_search_cost(const int *device, void *vctx);
cdp_status cdp_planner_prepare(struct ctx *c, int p, int R, int m, const int64_t (*ranges)[2]);

/* ---- planner_layout.c: layouts of candidates: ranges, placement, ranks, CPU sets, memory */

void cdp_planner_fixed_placement(const struct cdp_plan *plan, int p, int R, int *device);
/* The groups' leaders for the n group indices in dev (the fixed orders count
 * groups): a no-op at t = 1. */
void cdp_planner_to_leaders(const struct ctx *c, int n, int *dev);
/* cdp_planner_fixed_placement as the groups' first devices (explicit lists name them). */
void cdp_planner_fixed_groups(const struct ctx *c, int p, int R, int *device);
cdp_status cdp_planner_candidate_layout(const struct ctx *c, int p, int R, int m, const int64_t (*ranges)[2],
                                        const int *device, struct cdp_layout **out);
cdp_status cdp_planner_split(struct ctx *c, int p, int R, int m, int objective, int64_t (*ranges)[2]);
cdp_status cdp_planner_build_layout(const struct ctx *c, const struct cand *k, const int *device,
                                    const int64_t *shares, struct cdp_layout **out);

/* ---- planner_balance.c: per-stage predictions and the balance of replicas on mixed devices */

cdp_status cdp_planner_balance_result(const struct ctx *c, const int *device, int p, int R, int m,
                                      const struct cdp_planner_stage *stage, struct cdp_planner_balance *b);
cdp_status cdp_planner_balance_predict(int p, int R, int m, double step_s, double phase_s, struct cdp_planner_balance *b);
void cdp_planner_stage_predictions(const struct ctx *c, const struct cdp_layout *l, struct cdp_planner_stage *stage);

/* ---- planner_tensor.c: the tensor groups' t, units and collectives (docs/parallelism.md) */

/* The t the search tries (out, at most cap; 1 first): the plan's fixed t, or
 * under "auto" 1 and every power of two dividing the model's heads and widths
 * whose groups (t consecutive devices of a node) are all inside one node's
 * NVLink/NVSwitch domain (a layer list: where its linears split, t dividing the
 * column splits' widths); why: what stopped the list ("" when nothing did). */
int cdp_planner_tensor_choices(const struct cdp_plan *plan, const struct cdp_topology *t, int *out, int cap,
                               char *why, size_t why_cap);
/* A unit as one rank of a group of tp holds and runs it: split FLOPs,
 * parameters and activations divided by tp, layernorm and residual whole. */
void cdp_planner_tensor_units(const struct cdp_plan *plan, int tp, struct cdp_unit *u, int n);
/* The slowest link and the largest latency of the ring over devices 0..tp-1. */
/* The data-parallel gradient reduction's bytes per gradient byte (the
 * simulator's reduce_scale): 0.5 where /parallel/comm_dtype sends them as bf16. */
double cdp_planner_reduce_scale(const struct cdp_plan *plan);
void cdp_planner_tensor_links(const struct cdp_topology *t, int tp, double *bw, double *lat);
/* One all-reduce of a micro-batch's activations (micro_batch x context x
 * embed x the activation element size) over the group's ring, and how many
 * unit u runs forward and backward. */
double cdp_planner_tensor_collective_s(const struct cdp_plan *plan, int tp, double bw, double lat,
                                       const struct cdp_unit *u, int *count_fwd, int *count_bwd);
/* A measured table's times for a rank of a group of tp, the table measured
 * at measured_tp (rank 0's slices, compute only): as measured when the two
 * are equal; else each split unit's times scaled by measured_tp / tp (a t = 1
 * table divided by tp). The collectives are added apart
 * (cdp_planner_tensor_costs). */
void cdp_planner_tensor_measured(int tp, int measured_tp, const struct cdp_unit *u, int n,
                                 struct cdp_unit_cost *cost);
/* Adds every unit's tensor collectives to its forward and backward time. */
void cdp_planner_tensor_costs(const struct cdp_plan *plan, int tp, double bw, double lat, const struct cdp_unit *u,
                              int n, struct cdp_unit_cost *cost);

#endif
