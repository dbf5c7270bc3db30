/* Placement: which device (or tensor group of devices) runs (stage s,
 * replica r) of p stages x R replicas. The objective is a callback (the
 * planner passes the simulated step time), so this module knows nothing of
 * schedules or costs: it searches assignments, exactly on small machines and
 * heuristically beyond (docs/planner.md). */
#ifndef CDP_PARTITIONER_PLACEMENT_H
#define CDP_PARTITIONER_PLACEMENT_H

#include <stdint.h>

#include "cdp/status.h"
#include "cdp/topology.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CDP_PLACEMENT_EXACT_MAX_DEVICES 16 /* more slots (devices or groups) go straight to the heuristic */
#define CDP_PLACEMENT_EXACT_EVALS 50000    /* default cap on assignments the exact search evaluates */
#define CDP_PLACEMENT_LOCAL_EVALS 4000     /* default cap on the heuristic's local-search evaluations */

/* The objective of a complete assignment: device[s*R + r] is the device of
 * stage s, replica r (p*R distinct devices; with tensor groups the first
 * device of its group). Lower is better; NaN or infinity means "not
 * allowed". Must depend on the slots only through what the search knows of
 * them (a device's links, name, memory and rates; a group's: below) and
 * treat the replicas as a ring in order r = 0..R-1 (as the simulator's
 * all-reduce does): the search skips assignments that a symmetry of the
 * slots or a rotation of the replicas maps onto one already seen. */
typedef double (*cdp_placement_cost_fn)(const int *device, void *ctx);

struct cdp_placement_problem {
    const struct cdp_topology *topo; /* not owned */
    int p, R;                        /* p*R <= topo->n_gpus */
    cdp_placement_cost_fn cost;
    void *ctx;                       /* passed to cost (not owned) */
    int64_t max_exact_evals;         /* 0: CDP_PLACEMENT_EXACT_EVALS */
    int64_t max_local_evals;         /* 0: CDP_PLACEMENT_LOCAL_EVALS */
    /* Tensor groups. group 0 or 1: every device is a slot. group t > 1: the
     * slots are n_groups groups of t consecutive devices of one node, group g
     * on devices group_first[g] .. group_first[g] + t - 1 (disjoint, in
     * increasing order), and device[] names a group by its first device. The
     * traffic between two groups runs over the t member pairs k -> k in
     * parallel, so the link from group g to group h is the slowest of them:
     * the least bandwidth, the largest latency, the worst class; two groups
     * are alike when each member is the same kind of device as the other's
     * member of the same index. */
    int group;
    int n_groups;
    const int *group_first;          /* n_groups entries (not owned) */
};

struct cdp_placement_info {
    double cost;      /* the objective of the returned assignment */
    int exact;        /* 1: the exhaustive search finished (the result is optimal) */
    int64_t evals;    /* calls of the objective */
    char method[200]; /* how the result was found, for reports */
};

/* The two fixed orders: ordered-pp-inner (stages adjacent: device r*p + s)
 * and ordered-dp-inner (replicas adjacent, DeepSpeed: device s*R + r).
 * device has p*R entries, [s*R + r]. */
void cdp_placement_ordered_pp_inner(int p, int R, int *device);
void cdp_placement_ordered_dp_inner(int p, int R, int *device);

/* The best assignment: the exact search when there are at most
 * CDP_PLACEMENT_EXACT_MAX_DEVICES slots and the canonical assignments number
 * at most max_exact_evals, else the heuristic (info->method says which and
 * why). Deterministic. device (p*R entries) and info (may be NULL) are written
 * only on success. CDP_ERR_INVALID for a bad shape (p, R < 1, p*R > slots),
 * bad groups (outside the topology, across nodes, overlapping) or when no
 * assignment has a finite cost; CDP_ERR_NOMEM. */
cdp_status cdp_placement_search(const struct cdp_placement_problem *pb, int *device, struct cdp_placement_info *info);

/* Exhaustive enumeration of injective assignments up to symmetry: slots
 * with identical rows (swapping them preserves every link and property) are
 * used in index order, further automorphisms of the slots and rotations of
 * the replicas prune by lexicographic leaders. CDP_ERR_UNSUPPORTED, writing
 * nothing, when more than max_exact_evals assignments would be evaluated or
 * there are too many slots. */
cdp_status cdp_placement_exact(const struct cdp_placement_problem *pb, int *device, struct cdp_placement_info *info);

/* The scalable heuristic: the two fixed orders over slot index and over a
 * locality order (node by node, inside a node a chain along the fastest links,
 * so a pipeline or a replica group lands on an NVLink island), the best of the
 * four refined by pairwise swaps and moves to unused slots (first
 * improvement, deterministic order; one unused slot per class of alike ones)
 * until no move improves or max_local_evals is spent. Never worse than either
 * fixed order. */
cdp_status cdp_placement_heuristic(const struct cdp_placement_problem *pb, int *device,
                                   struct cdp_placement_info *info);

#ifdef __cplusplus
}
#endif

#endif
