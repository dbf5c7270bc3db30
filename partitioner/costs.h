/* The cost model: per partition unit, the time of its forward and backward on
 * one micro-batch on a given device, and the bytes it holds and sends. The
 * simulator and the planner read these numbers; today they are analytic
 * (FLOPs over the device's rate), and the struct is the one a measured table
 * (--profile) will fill in later. Defaults and their sources: docs/simulator.md. */
#ifndef CDP_PARTITIONER_COSTS_H
#define CDP_PARTITIONER_COSTS_H

#include <stdint.h>

#include "cdp/plan.h"
#include "cdp/status.h"
#include "cdp/topology.h"
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

/* One unit on one device, per micro-batch of B = train.micro_batch samples. */
struct cdp_unit_cost {
    double fwd_s, bwd_s;  /* forward, backward time */
    double param_bytes;   /* gradient bytes of the parameters it owns (what data parallelism reduces) */
    double state_bytes;   /* weights + gradients + optimizer state it keeps (tied copies included) */
    double act_bytes;     /* activations kept from forward to backward, per micro-batch */
    double out_bytes;     /* output sent to the next stage, per micro-batch */
    double opt_s;         /* optimizer step of its parameters */
};

/* How a device computes: rate (FLOP/s for the plan's precision), efficiency, memory bandwidth. */
struct cdp_device_rate {
    double flops;     /* dense peak (or achieved, for CPU devices) */
    double efficiency;
    double mem_bw;    /* bytes/s, for the optimizer step */
};

/* The rate of device `gpu` of topology t for precision prec: fp32 -> peak_fp32
 * (peak_tf32 when fp32 is 0), bf16 -> peak_bf16 (the fp32 rule when 0); CPU
 * devices without a rate: CDP_COST_CPU_FLOPS. GPUs with no rate at all get
 * 10 TFLOP/s and a warning. */
struct cdp_device_rate cdp_device_rate_of(const struct cdp_topology *t, int gpu, enum cdp_precision prec);

/* Bytes per element of activations and sent tensors (4 fp32, 2 bf16); bytes a
 * parameter keeps (weights, gradients, master copy, optimizer state); bytes
 * one parameter's optimizer step reads and writes. */
double cdp_cost_act_elem_bytes(const struct cdp_plan *plan);
double cdp_cost_state_bytes_per_param(const struct cdp_plan *plan);
double cdp_cost_grad_bytes_per_param(const struct cdp_plan *plan);
double cdp_cost_opt_bytes_per_param(const struct cdp_plan *plan);

/* Analytic costs of units u[0..n-1] on a device of rate r, for the plan's
 * micro-batch, precision and optimizer. out has n entries. */
void cdp_costs_analytic(const struct cdp_plan *plan, const struct cdp_unit *u, int n,
                        const struct cdp_device_rate *r, struct cdp_unit_cost *out);

#ifdef __cplusplus
}
#endif

#endif
