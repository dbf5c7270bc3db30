/* The unit-cost record: what one partition unit costs on one device per
 * micro-batch (time forward and backward, bytes it holds and sends), the
 * bytes per element and per parameter the runtime keeps, and the measured
 * cost table (`cdphybrid --plan P --profile`) with its file. A model-level
 * description: the profiler (profile.h) fills tables, the simulator reads
 * records, and the cost model (partitioner/costs.h) computes them. */
#ifndef CDP_MODEL_COSTS_H
#define CDP_MODEL_COSTS_H

#include <stdint.h>

#include "cdp/plan_types.h"
#include "cdp/status.h"
#include "model/layers.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One unit on one device, per micro-batch of B = train.micro_batch samples. */
struct cdp_unit_cost {
    double fwd_s, bwd_s;  /* forward, backward time */
    double bwd_w_s;       /* of bwd_s, the weight gradients' part (a split backward's W; the rest, and any
                             recomputation, is its I): bwd_weight_flops / bwd_flops of it */
    double param_bytes;   /* gradient bytes of the parameters it owns (what data parallelism reduces) */
    double state_bytes;   /* fp32 weights + gradients + optimizer state of the parameters it owns (a tied
                             copy a stage keeps counts in the exact memory, cdp_layout_memory, not here) */
    double act_bytes;     /* activations kept from forward to backward, per micro-batch, fp32 */
    double out_bytes;     /* output sent to the next stage, per micro-batch */
    double scratch_bytes; /* its scratch for a micro-batch (a stage holds its units' largest) */
    double opt_s;         /* optimizer step of its parameters */
    double tp_fwd_s, tp_bwd_s; /* of fwd_s and bwd_s, its tensor group's collectives (the planner's,
                                  partitioner/planner_tensor.c); 0 at t = 1 */
    double tp_fwd_bytes, tp_bwd_bytes; /* what they move on each link of the group's ring */
};

/* Bytes per element of activations and sent tensors (4: the runtime keeps
 * fp32 whatever the precision of its matrix products); bytes a parameter keeps
 * (fp32 weights, gradients, optimizer state); bytes one parameter's optimizer
 * step reads and writes. */
double cdp_cost_act_elem_bytes(const struct cdp_plan *plan);
double cdp_cost_state_bytes_per_param(const struct cdp_plan *plan);
double cdp_cost_grad_bytes_per_param(const struct cdp_plan *plan);
double cdp_cost_opt_bytes_per_param(const struct cdp_plan *plan);
/* Bytes an element moves on the wire (/parallel/comm_dtype: 2 for bf16, else
 * the fp32 above): of the tensor group's collectives (the vocab-parallel
 * loss's statistics excepted: always fp32), and of the data-parallel
 * gradient reduction (ZeRO's parameter all-gather excepted: always fp32). */
double cdp_cost_tensor_comm_elem_bytes(const struct cdp_plan *plan);
double cdp_cost_grad_comm_bytes_per_param(const struct cdp_plan *plan);

/* Floats per sample that unit u keeps for attention's backward where the plan
 * runs it: B*T*(heads + C) / B under the CUDA table's fused bf16 kernels
 * (backend cuda, precision bf16, head size 32 or 64, T above it: the rule of
 * cdp_cuda_flash_usable, which gpu_ops checks against the table's
 * attention_state_floats on a GPU), else the probabilities, u->att_floats
 * (0 for units without attention). heads and C are the rank's (heads/t, C/t)
 * where u is split by heads over a tensor group of t, as
 * cdp_unit_fit_kernels asks the table. */
int64_t cdp_cost_att_floats(const struct cdp_plan *plan, const struct cdp_unit *u);

/* Sizes every attention unit's saved state as the plan's backend keeps it
 * (cdp_cost_att_floats): what cdp_unit_fit_kernels does with the kernel table
 * in the executor, so the planner's memory counts the executor's buffers. */
void cdp_cost_fit_units(const struct cdp_plan *plan, struct cdp_unit *u, int n);

/* A measured cost table (`cdphybrid --plan P --profile`, src/model/profile.h):
 * per unit, forward and backward seconds of one micro-batch of micro_batch
 * samples on one device, of them the weight gradients' (a split backward's
 * W), and the optimizer step's seconds per parameter; tensor: the t it was
 * measured at (rank 0's slices of a tensor group of t, their compute only:
 * the group's collectives are costed by the planner on the topology's links).
 * Its file, version 2: {"format": "cdphybrid-costs", "version": 2, "device",
 * "micro_batch", "threads", "tensor", "units": [{"index", "kind", "fwd_s",
 * "bwd_s", "bwd_w_s"}], "optimizer_s_per_param"}. Version 1 files (no
 * "tensor", no "bwd_w_s") still load: t = 1, and bwd_w_measured 0 (the
 * planner splits their backward by FLOPs). */
struct cdp_cost_table_unit {
    int index;
    enum cdp_layer_type type;
    double fwd_s, bwd_s;
    double bwd_w_s; /* of bwd_s, the weight gradients' part; 0 for a unit without parameters */
};

struct cdp_cost_table {
    char device[128];                  /* what measured it ("cpu: ...") */
    int64_t micro_batch;
    int threads;                       /* BLAS threads it ran with */
    int tensor;                        /* t it was measured at (0 reads as 1) */
    int bwd_w_measured;                /* units' bwd_w_s are measured (version 2); else derived by FLOPs */
    int n_units;
    struct cdp_cost_table_unit *units; /* owned, n_units entries */
    double optimizer_s_per_param;
};

/* Frees the units and zeroes the table; NULL is a no-op. */
void cdp_cost_table_clear(struct cdp_cost_table *t);

/* Writes the table to path atomically (a temporary file renamed over it).
 * CDP_ERR_IO naming the file when it cannot be written. */
cdp_status cdp_cost_table_write(const struct cdp_cost_table *t, const char *path);

/* Reads a table written by cdp_cost_table_write (version 2) or an older one
 * (version 1). CDP_ERR_INVALID naming the file and the key for anything else
 * (not JSON, another format, a missing or non-positive time, a bwd_w_s above
 * its bwd_s), CDP_ERR_IO when it cannot be read. On success *out owns
 * its units (cdp_cost_table_clear). */
cdp_status cdp_cost_table_read(const char *path, struct cdp_cost_table *out);

/* Whether table t (read from path) was measured for the plan's model and
 * micro-batch: the same number of units, of the same kinds, and
 * /train/micro_batch (any t: the planner rescales the split units' times,
 * cdp_planner_tensor_measured). CDP_ERR_INVALID naming path and what differs. */
cdp_status cdp_cost_table_check(const struct cdp_cost_table *t, const char *path, const struct cdp_plan *plan,
                                const struct cdp_unit *u, int n);

#ifdef __cplusplus
}
#endif

#endif
