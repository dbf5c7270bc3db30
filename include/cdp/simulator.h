/* The simulator, as a program that embeds cdphybrid calls it
 * (docs/embedding.md, docs/simulator.md): one training step of a planned
 * layout run on the cost model and the topology's links, before any device
 * is touched; what `cdphybrid --simulate` prints. Deterministic. */
#ifndef CDP_SIMULATOR_H
#define CDP_SIMULATOR_H

#include "cdp/api.h"

#include <stddef.h>

#include "cdp/plan.h"
#include "cdp/planner.h"
#include "cdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A predicted step; versioned by size like cdp/train.h's structs. */
struct cdp_simulation {
    size_t size;          /* sizeof(struct cdp_simulation) */
    double step_s;        /* the step: its start to the last rank's optimizer step end */
    double phase_s;       /* its forward/backward phase */
    double bubble;        /* idle share of that phase over the ranks, 0..1 */
    double samples_per_s; /* the global batch / step_s */
    int ranks;            /* stages x replicas */
    double peak_memory_bytes; /* the most device memory one rank allocates (each rank's:
                                 cdp_layout_rank_memory) */
};

#define CDP_SIMULATION_INIT {.size = sizeof(struct cdp_simulation)}

/* Simulates one step of planned's layout (from cdp_plan_layout on this plan)
 * on the topology and costs it was planned with. out->size must be set
 * (CDP_SIMULATION_INIT); only that many bytes are written. CDP_ERR_INVALID
 * for a bad size, CDP_ERR_NOMEM. */
CDP_API cdp_status cdp_simulate(const struct cdp_plan *plan, const struct cdp_planned *planned,
                             struct cdp_simulation *out);

#ifdef __cplusplus
}
#endif

#endif
