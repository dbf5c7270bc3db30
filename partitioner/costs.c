/* Analytic cost model: FLOPs over the device's rate, bytes over its memory
 * bandwidth, with the defaults of costs.h (sources in docs/simulator.md). */
#include "partitioner/costs.h"

#include <math.h>
#include <string.h>

#include "cdp/log.h"

/* HBM bandwidth from NVIDIA's data sheets, by a substring of the device name. */
static const struct { const char *name; double bw; } mem_bw_table[] = {
    {"H200", 4.8e12}, {"H100", 3.35e12}, {"A100-SXM4-80GB", 2.039e12}, {"A100", 1.555e12},
    {"V100", 0.9e12}, {"P100", 0.732e12},
};

struct cdp_device_rate cdp_device_rate_of(const struct cdp_topology *t, int gpu, enum cdp_precision prec)
{
    const struct cdp_topo_gpu *g = &t->gpus[gpu];
    struct cdp_device_rate r = {0};
    double fp32 = g->peak_fp32 > 0 ? g->peak_fp32 : g->peak_tf32;
    r.flops = prec == CDP_PRECISION_BF16 && g->peak_bf16 > 0 ? g->peak_bf16 : fp32;
    if (t->kind == CDP_TOPO_CPU) {
        if (r.flops <= 0) r.flops = CDP_COST_CPU_FLOPS;
        r.efficiency = CDP_COST_CPU_EFFICIENCY;
        r.mem_bw = t->nodes[g->node].copy_bw > 0 ? t->nodes[g->node].copy_bw : CDP_COST_CPU_MEM_BW;
        return r;
    }
    if (r.flops <= 0) {
        CDP_WARN(PART, "device %d (%s): no peak FLOP/s known; assuming 10 TFLOP/s", gpu, g->name);
        r.flops = 10e12;
    }
    r.efficiency = CDP_COST_GPU_EFFICIENCY;
    r.mem_bw = CDP_COST_GPU_MEM_BW;
    for (size_t i = 0; i < sizeof mem_bw_table / sizeof mem_bw_table[0]; i++)
        if (strstr(g->name, mem_bw_table[i].name)) {
            r.mem_bw = mem_bw_table[i].bw;
            break;
        }
    return r;
}

double cdp_cost_act_elem_bytes(const struct cdp_plan *plan)
{
    return plan->train.precision == CDP_PRECISION_BF16 ? 2 : 4;
}

double cdp_cost_grad_bytes_per_param(const struct cdp_plan *plan) { return cdp_cost_act_elem_bytes(plan); }

/* Optimizer state: AdamW two fp32 moments, SGD with momentum one buffer. */
static double opt_state_bytes(const struct cdp_plan *plan)
{
    const struct cdp_optimizer_desc *o = &plan->train.optimizer;
    if (o->type == CDP_OPT_ADAMW) return 8;
    return o->momentum != 0 ? 4 : 0;
}

/* fp32: weights 4 + gradients 4 + state; bf16 (mixed precision as in Megatron
 * and the ZeRO paper's 16 bytes with Adam): weights 2 + gradients 2 + fp32
 * master weights 4 + state: 8 bytes before the state either way. */
double cdp_cost_state_bytes_per_param(const struct cdp_plan *plan)
{
    return 8 + opt_state_bytes(plan);
}

/* Reads and writes of one fp32 step: AdamW reads w, g, m, v and writes w, m, v
 * (7 x 4); SGD with momentum reads w, g, b and writes w, b (5 x 4); plain SGD
 * reads w, g and writes w (3 x 4). bf16's extra weight copy is not counted. */
double cdp_cost_opt_bytes_per_param(const struct cdp_plan *plan)
{
    const struct cdp_optimizer_desc *o = &plan->train.optimizer;
    if (o->type == CDP_OPT_ADAMW) return 28;
    return o->momentum != 0 ? 20 : 12;
}

void cdp_costs_analytic(const struct cdp_plan *plan, const struct cdp_unit *u, int n,
                        const struct cdp_device_rate *r, struct cdp_unit_cost *out)
{
    const double B = (double)plan->train.micro_batch;
    const double rate = r->flops * r->efficiency;
    const double elem = cdp_cost_act_elem_bytes(plan);
    const double state = cdp_cost_state_bytes_per_param(plan);
    const double opt = cdp_cost_opt_bytes_per_param(plan);
    const double grad = cdp_cost_grad_bytes_per_param(plan);
    for (int i = 0; i < n; i++) {
        /* a tied parameter (the GPT head's copy of the embedding) is held and
         * stepped where it is used too, but reduced only by its owner */
        double held = (double)u[i].param_count;
        for (int k = 0; k < u[i].n_params; k++)
            if (u[i].params[k].tied_unit >= 0) held += (double)u[i].params[k].numel;
        struct cdp_unit_cost *c = &out[i];
        c->fwd_s = fmax(u[i].fwd_flops * B / rate, CDP_COST_UNIT_FLOOR_S);
        c->bwd_s = fmax(u[i].bwd_flops * B / rate, CDP_COST_UNIT_FLOOR_S);
        c->param_bytes = (double)u[i].param_count * grad;
        c->state_bytes = held * state;
        c->act_bytes = (double)u[i].act_floats * B * elem;
        c->out_bytes = (double)u[i].out_floats * B * elem;
        c->opt_s = held * opt / r->mem_bw;
    }
}
