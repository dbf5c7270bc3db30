/* Load balance across replicas: how many of a step's micro-batches each
 * replica of a stage group runs, so that replicas on slower devices get fewer.
 * The planner uses it with predicted speeds (/parallel/balance "speed"), the
 * executor with measured ones (/parallel/rebalance_every). Any shares give the
 * same training result: the global batch and the loss's 1/G stay the same. */
#ifndef CDP_PIPELINE_BALANCE_H
#define CDP_PIPELINE_BALANCE_H

#include <stdint.h>

#include "cdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The predicted forward/backward time of a step when replica r runs shares[r]
 * micro-batches through its p-stage pipeline and t[r] is the time of one
 * micro-batch on its slowest stage: max over r of (shares[r] + p - 1) * t[r]. */
double cdp_balance_step_time(const double *t, int R, int p, const int64_t *shares);

/* Shares `total` micro-batches among R replicas, each a multiple of `unit`
 * (the interleaved schedule needs multiples of the stage count), at least
 * `unit` and at most `cap` (0: no cap), minimising cdp_balance_step_time.
 * Greedy and optimal for this min-max: every replica starts with one unit and
 * each further unit goes to the replica whose time after taking it is least
 * (ties to the lower index), so equal times give equal shares.
 * CDP_ERR_INVALID when total is not a multiple of unit, is less than R units,
 * or exceeds R caps, or a time is not positive and finite. */
cdp_status cdp_balance_shares(const double *t, int R, int p, int64_t total, int64_t unit, int64_t cap,
                              int64_t *shares);

#ifdef __cplusplus
}
#endif

#endif
