/* A layout, as a program that embeds cdphybrid sees it: the one answer to "how
 * does this plan run" that the planner (cdp/planner.h) makes and the simulator
 * (cdp/simulator.h) and the trainer (cdp/train.h) read. Opaque: only these
 * accessors are public, so the layout can grow without breaking a program.
 * A layout belongs to the planner's result it came from (cdp_planned_layout)
 * and lives until that result is freed. Ranks are numbered as mpirun starts
 * them: rank r of the layout is rank r of MPI_COMM_WORLD. */
#ifndef CDP_LAYOUT_H
#define CDP_LAYOUT_H

#include "cdp/api.h"

#include <stdint.h>

#include "cdp/plan_types.h"
#include "cdp/status.h"

struct cdp_plan;

#ifdef __cplusplus
extern "C" {
#endif

struct cdp_layout;

CDP_API int cdp_layout_stages(const struct cdp_layout *l);        /* pipeline stages */
CDP_API int cdp_layout_chunks(const struct cdp_layout *l);        /* model chunks per stage (interleaved schedules) */
CDP_API int cdp_layout_replicas(const struct cdp_layout *l);      /* data-parallel replicas */
CDP_API int cdp_layout_micro_batches(const struct cdp_layout *l); /* per replica per step (the replicas' mean share) */
CDP_API int cdp_layout_micro_batch(const struct cdp_layout *l);   /* samples per micro-batch */
CDP_API int cdp_layout_tensor(const struct cdp_layout *l);        /* ranks per stage and replica (tensor group) */
CDP_API int cdp_layout_ranks(const struct cdp_layout *l);         /* stages x replicas x tensor: its processes */
CDP_API enum cdp_schedule_kind cdp_layout_schedule(const struct cdp_layout *l); /* cdp_schedule_name() prints it */

/* Rank r's place (0 <= r < cdp_layout_ranks) and the device memory it is
 * predicted to allocate (what the device accounting counts; the trainer's
 * summary reports the measured peak beside it). -1 / 0 for r out of range. */
CDP_API int cdp_layout_rank_stage(const struct cdp_layout *l, int r);
CDP_API int cdp_layout_rank_replica(const struct cdp_layout *l, int r);
CDP_API int cdp_layout_rank_tensor(const struct cdp_layout *l, int r); /* its index in its tensor group */
CDP_API uint64_t cdp_layout_rank_memory(const struct cdp_layout *l, int r);

/* The layout a planned file holds: cdphybrid writes the one it runs under
 * "layout" in planned.json, and its ranks run that file's layout as written
 * (docs/plan.md, "The layout"). plan is that file loaded and resolved
 * (cdp_plan_load, cdp_plan_resolve); the layout is checked against it (every
 * value the plan fixes must agree). CDP_ERR_INVALID naming the key
 * ("planned.json: /layout/ranks/2/stage: ...") or the file without a layout;
 * CDP_ERR_IO. On success *out is the caller's: cdp_layout_free. */
CDP_API cdp_status cdp_layout_load(const char *path, const struct cdp_plan *plan, struct cdp_layout **out);

/* Frees a layout from cdp_layout_load; NULL is a no-op. (A planner's layout,
 * cdp_planned_layout, belongs to its result.) */
CDP_API void cdp_layout_free(struct cdp_layout *l);

#ifdef __cplusplus
}
#endif

#endif
