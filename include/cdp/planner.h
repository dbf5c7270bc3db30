/* The planner, as a program that embeds cdphybrid calls it (docs/embedding.md):
 * a loaded plan and the machine in, one layout out, chosen as the cdphybrid
 * program chooses it (every "auto" of /parallel searched for the best
 * predicted step, fixed values kept; docs/planner.md). Every run goes through
 * it: the simulator (cdp/simulator.h) and the trainer (cdp/train.h) take the
 * layout it makes and decide none of it themselves. */
#ifndef CDP_PLANNER_H
#define CDP_PLANNER_H

#include "cdp/api.h"

#include <stddef.h>
#include <stdio.h>

#include "cdp/layout.h"
#include "cdp/plan.h"
#include "cdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The planner's answer for one plan: the layout, the prediction of its step
 * and what the simulator needs (the topology, the cost table). Opaque. */
struct cdp_planned;

/* Options of cdp_plan_layout; versioned by size like cdp/train.h's structs. */
struct cdp_plan_layout_opts {
    size_t size;       /* sizeof(struct cdp_plan_layout_opts) */
    const char *costs; /* a cost table measured by `cdphybrid --profile` to plan with, or NULL: the
                          analytic cost model */
};

#define CDP_PLAN_LAYOUT_OPTS_INIT {.size = sizeof(struct cdp_plan_layout_opts)}

/* Plans: resolves the plan against the machine (cdp_plan_resolve; machine
 * NULL: no GPUs, so "auto" is the cpu backend; ask cdp_device_count for the
 * GPUs as the cdphybrid program does), builds the plan's topology
 * (/cluster/topology), searches, and writes the answer into the plan as
 * explicit values (stages, replicas, micro-batches, schedule, partition,
 * placement), so the plan now plans to the same layout without a search: it
 * is what cdphybrid writes as planned.json (cdp_plan_to_json). opts NULL: the
 * defaults. CDP_ERR_INVALID naming the key when nothing fits or the plan does
 * not suit the machine; CDP_ERR_NOMEM; CDP_ERR_IO for an unreadable cost
 * table. On success *out is the caller's: cdp_planned_free. The plan must
 * outlive *out's use by cdp_simulate and cdp_train. */
CDP_API cdp_status cdp_plan_layout(struct cdp_plan *plan, const struct cdp_machine_info *machine,
                           const struct cdp_plan_layout_opts *opts, struct cdp_planned **out);

/* The chosen layout (cdp/layout.h): owned by r, valid until cdp_planned_free. */
CDP_API const struct cdp_layout *cdp_planned_layout(const struct cdp_planned *r);

/* The predicted step of the chosen layout, as cdphybrid prints it before
 * training: seconds, the bubble (idle share of the forward/backward phase,
 * 0..1) and samples per second. */
CDP_API double cdp_planned_step_s(const struct cdp_planned *r);
CDP_API double cdp_planned_bubble(const struct cdp_planned *r);
CDP_API double cdp_planned_samples_per_s(const struct cdp_planned *r);

/* The layout in a few lines, as training prints it before it starts: shape,
 * partition, ranks with their memory, the predicted step. */
CDP_API void cdp_planned_print(const struct cdp_planned *r, FILE *f);

/* Re-planning as a check: plans plan (as cdp_plan_layout does) on this
 * machine and compares the answer with l, a layout read from a planned file
 * (cdp_layout_load). The ranks of a job run their file's layout without
 * planning again; a program that wants to know the file still is what its
 * plan gives here asks this. CDP_ERR_INVALID naming the first difference
 * ("/ranks/3/device: 2 here, 5 there": the layout's, then the planner's), or the
 * planner's error. */
CDP_API cdp_status cdp_layout_replan_check(struct cdp_plan *plan, const struct cdp_machine_info *machine,
                                   const struct cdp_layout *l);

/* Frees r and everything it owns (its layout too); NULL is a no-op. */
CDP_API void cdp_planned_free(struct cdp_planned *r);

#ifdef __cplusplus
}
#endif

#endif
