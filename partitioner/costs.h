/* The cost model: per partition unit, the time of its forward and backward on
 * one micro-batch on a given device, and the bytes it holds and sends. The
 * simulator and the planner read these numbers: analytic (FLOPs over the
 * device's rate), or measured (a --profile table, model/costs.h, applied
 * over the analytic bytes). Defaults and their sources: docs/simulator.md. */
#ifndef CDP_PARTITIONER_COSTS_H
#define CDP_PARTITIONER_COSTS_H

#include <stdint.h>

#include "cdp/plan.h"
#include "cdp/status.h"
#include "cdp/topology.h"
#include "model/costs.h"
#include "model/layers.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Analytic defaults. */
#define CDP_COST_GPU_EFFICIENCY 0.5   /* share of the dtype's dense peak a GEMM-bound layer reaches */
#define CDP_COST_CPU_FLOPS 100e9      /* FLOP/s of a CPU device when the topology gives none */
#define CDP_COST_CPU_EFFICIENCY 1.0   /* the CPU rate above is already an achieved rate */
#define CDP_COST_UNIT_FLOOR_S 5e-6    /* least time of a unit's forward (and of its backward) */
#define CDP_COST_GPU_MEM_BW 1.0e12    /* bytes/s of a GPU whose name is not in the table */
#define CDP_COST_CPU_MEM_BW 20e9      /* bytes/s of a CPU device (the CPU topology's copy rate) */

/* How a device computes: rate (FLOP/s for the plan's precision), efficiency, memory bandwidth. */
struct cdp_device_rate {
    double flops;     /* dense peak (or achieved, for CPU devices) */
    double efficiency;
    double mem_bw;    /* bytes/s, for the optimizer step */
};

/* A device's dense peak FLOP/s for precision prec, as the topology states it:
 * fp32 -> peak_fp32 (peak_tf32 when fp32 is 0), bf16 -> peak_bf16 (the fp32
 * rule when 0); 0 when the topology knows none. The step lines' MFU divides by it. */
double cdp_device_peak_flops(const struct cdp_topology_gpu *g, enum cdp_precision prec);

/* The rate of device `gpu` of topology t for precision prec: fp32 -> peak_fp32
 * (peak_tf32 when fp32 is 0), bf16 -> peak_bf16 (the fp32 rule when 0); CPU
 * devices without a rate: CDP_COST_CPU_FLOPS. GPUs with no rate at all get
 * 10 TFLOP/s and a warning. */
struct cdp_device_rate cdp_device_rate_of(const struct cdp_topology *t, int gpu, enum cdp_precision prec);

/* Analytic costs of units u[0..n-1] on a device of rate r, for the plan's
 * micro-batch, precision and optimizer. out has n entries. */
void cdp_cost_analytic(const struct cdp_plan *plan, const struct cdp_unit *u, int n,
                       const struct cdp_device_rate *r, struct cdp_unit_cost *out);

/* Replaces the times in out[0..n-1] (filled by cdp_cost_analytic) with the
 * table's: forward, backward, the backward's weight-gradient part (measured
 * in a version 2 table; a version 1 table's split as the unit's FLOPs), and
 * the optimizer step as held parameters x optimizer_s_per_param. Bytes stay
 * analytic. t must have passed the check. */
void cdp_cost_apply(const struct cdp_cost_table *t, const struct cdp_unit *u, int n, struct cdp_unit_cost *out);

/* How the planner takes table t's times for a rank of a tensor group of tp
 * (cdp_planner_tensor_measured), in words for the costs line of --dry-run
 * and --simulate: "measured at t = 2, used as measured", "measured at t = 1,
 * split units' times / 2", ... */
void cdp_cost_table_tensor_note(const struct cdp_cost_table *t, int tp, char *buf, size_t cap);

/* Adds to each unit's backward time the forward work its recompute mode runs
 * again (cdp_unit_set_recompute): the whole forward under full recomputation,
 * else the share recompute_flops / fwd_flops of it. */
void cdp_cost_add_recompute(const struct cdp_unit *u, int n, struct cdp_unit_cost *out);

#ifdef __cplusplus
}
#endif

#endif
