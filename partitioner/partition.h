/* Contiguous partitions of a layer stack. This is the part of the planner the
 * executor needs before the planner lands: a split into k ranges that minimises
 * the most expensive range (exact, by dynamic programming). */
#ifndef CDP_PARTITIONER_PARTITION_H
#define CDP_PARTITIONER_PARTITION_H

#include <stdint.h>

#include "cdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Splits units 0..n-1 with costs cost[i] >= 0 into k non-empty contiguous
 * ranges [first, end) minimising the largest range cost; ties go to the split
 * whose ranges end earliest. Fails with CDP_ERR_INVALID when k > n or k < 1. */
cdp_status cdp_partition_balanced(const double *cost, int n, int k, int64_t (*ranges)[2]);

#ifdef __cplusplus
}
#endif

#endif
