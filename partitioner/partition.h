/* Contiguous partitions of a layer stack: the balanced split the executor
 * uses (minimise the most expensive range) and the planner's memory-aware
 * split (slowest stage including its send, every stage within its memory).
 * Both exact, by dynamic programming; docs/planner.md. */
#ifndef CDP_PARTITIONER_PARTITION_H
#define CDP_PARTITIONER_PARTITION_H

#include <stdint.h>

#include "cdp/plan.h"
#include "cdp/status.h"
#include "partitioner/costs.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Splits units 0..n-1 with costs cost[i] >= 0 into k non-empty contiguous
 * ranges [first, end) minimising the largest range cost; ties go to the split
 * whose ranges end earliest. Fails with CDP_ERR_INVALID when k > n or k < 1. */
cdp_status cdp_partition_balanced(const double *cost, int n, int k, int64_t (*ranges)[2]);

/* The same for chunked schedules, where rank owner[j] (0..ranks-1) runs range
 * j: k non-empty contiguous ranges minimising the largest rank's total (its
 * chunks together), then the spread of the ranks' totals. Starts from
 * cdp_partition_balanced and moves one boundary by one unit at a time while
 * that lowers (largest total, sum of squared totals): a local optimum, not
 * proven the best. CDP_ERR_INVALID as cdp_partition_balanced. */
cdp_status cdp_partition_balanced_ranks(const double *cost, int n, int k, const int *owner, int ranks,
                                        int64_t (*ranges)[2]);

/* Memory-aware partition (cdp_partition_plan): the stage's time is its units'
 * forward + backward plus sending its last unit's output over the boundary's
 * link; its memory is its units' state + activations x micro-batches in flight
 * on that stage + a workspace constant, and must fit the stage's capacity. */
struct cdp_partition_spec {
    const struct cdp_unit_cost *unit; /* n units (not owned); reads fwd_s, bwd_s, state_bytes, act_bytes, out_bytes */
    int n;
    int k;                            /* stages, 1..n */
    const double *bandwidth;          /* bytes/s of boundary s -> s+1: k-1 values, or 1 value for all, or
                                         NULL / n_bandwidth 0 for no send cost; <= 0: unlimited (not owned) */
    int n_bandwidth;
    const int *in_flight;             /* k entries: activations held at once on stage s (not owned);
                                         cdp_partition_in_flight fills them for a schedule */
    const double *capacity;           /* k entries: bytes stage s may use; <= 0 or NULL: unlimited (not owned) */
    double workspace_bytes;           /* added to every stage's memory */
    /* The rule used when k stages do not fit, to find the smallest k' that
     * would: in-flight counts for k' stages from (schedule, micro_batches) and
     * every stage given the smallest positive capacity[s]. micro_batches <= 0:
     * every stage keeps in_flight[0] in flight. */
    enum cdp_schedule_kind schedule;
    int micro_batches;
    /* Optional exact memory of stage s holding units [first, end): where set it
     * is the fit test and the stages' memory_bytes, and the formula above stays
     * the bound the search stops growing a stage at, so it must never exceed
     * what `memory` returns. The planner's is what the executor allocates. */
    double (*memory)(void *ctx, int s, int first, int end);
    void *memory_ctx;
    /* What the split minimises: the slowest stage's time (CDP_PARTITION_TIME),
     * or the largest stage's memory (CDP_PARTITION_MEMORY: the smallest
     * capacity any split fits in). */
    int objective;
};

enum { CDP_PARTITION_TIME = 0, CDP_PARTITION_MEMORY = 1 };

/* One stage of a partition. */
struct cdp_partition_stage {
    int64_t first, end;   /* units [first, end) */
    double compute_s;     /* sum of fwd_s + bwd_s */
    double send_s;        /* out_bytes of unit end-1 / the boundary's bandwidth; 0 on the last stage */
    double time_s;        /* compute_s + send_s */
    double memory_bytes;  /* state + act x in_flight[s] + workspace, or the spec's memory() */
};

/* Activations in flight per stage for a schedule of p stages and m
 * micro-batches, as its lists keep them (cdp_schedule_peak_in_flight): GPipe m
 * on every stage, 1F1B min(p - s, m). Interleaved:
 * CDP_ERR_UNSUPPORTED (chunks are not contiguous ranges). */
cdp_status cdp_partition_in_flight(enum cdp_schedule_kind kind, int p, int m, int *in_flight);

/* Splits sp->unit into sp->k non-empty contiguous stages minimising the
 * slowest stage's time_s (or with CDP_PARTITION_MEMORY the largest
 * memory_bytes), every stage within its capacity (exact: dynamic
 * programming over (stage, prefix), memory a feasibility filter on each
 * transition). Ties: the last stage starts as early as possible, then the one
 * before it, and so on. stage[k] is written only on success. CDP_ERR_INVALID
 * for bad arguments (k outside 1..n, a negative cost, a bandwidth count other
 * than 0, 1, k-1) and when no split fits, with a message naming the smallest
 * number of stages that fits or, if none does, the unit that needs the most
 * memory alone against the capacity. CDP_ERR_NOMEM. */
cdp_status cdp_partition_plan(const struct cdp_partition_spec *sp, struct cdp_partition_stage *stage);

#ifdef __cplusplus
}
#endif

#endif
