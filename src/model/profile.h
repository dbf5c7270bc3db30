/* Measured costs: forward and backward time of every partition unit of a model
 * on this machine's CPU (the kernels the executor runs), and the optimizer
 * step's time per parameter, for `cdphybrid --plan P --profile`. The table
 * (model/costs.h) replaces the analytic times in the simulator. */
#ifndef CDP_MODEL_PROFILE_H
#define CDP_MODEL_PROFILE_H

#include "cdp/plan_types.h"
#include "cdp/status.h"
#include "model/costs.h"

#ifdef __cplusplus
extern "C" {
#endif

struct cdp_profile_options {
    double min_unit_s; /* timing goes on for units x this (0: 0.05 s) */
    double max_total_s; /* most time all timed rounds take together (0: 60 s) */
    int min_reps;       /* fewest rounds, after one warm-up pass of each unit (0: 5) */
};

/* Profiles the plan's model for micro-batches of /train/micro_batch samples:
 * each unit alone in a model of that one unit, on random inputs (token ids in
 * the vocabulary, floats in [-1, 1)), one warm-up, then timed in rounds of
 * one forward and backward of every unit (at least min_reps rounds, and
 * until the rounds took n x min_unit_s or max_total_s), each unit's median
 * over the rounds: a slow spell of the machine slows a round's units alike
 * and the median leaves it out. The forward of the
 * model's last unit includes the loss, and its backward starts from the loss,
 * as a pipeline's last stage runs them; backward computes the input gradient
 * wherever the input is not token ids. A unit with parameters also runs its
 * backward split in every round (B, then W): its bwd_w_s is bwd_s x W / (B + W).
 * A plan of a fixed /parallel/tensor t > 1: rank 0's slices
 * (cdp_units_build_tensor(model, t, 0)) with a group of size t whose
 * all-reduce does nothing (timing only, the collective is costed apart by
 * the planner), and the table records t. The optimizer: the median of the
 * whole model's gradient norm plus cdp_optimizer_step, over its parameters.
 * o may be NULL (defaults). On success *out owns a new table. */
cdp_status cdp_profile_run(const struct cdp_plan *plan, const struct cdp_profile_options *o,
                           struct cdp_cost_table *out);

#ifdef __cplusplus
}
#endif

#endif
