/* Analytic cost model: FLOPs over the device's rate, bytes over its memory
 * bandwidth, with the defaults of costs.h (sources in docs/simulator.md). */
#include "partitioner/costs.h"

#include <math.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/log.h"

/* HBM bandwidth from NVIDIA's data sheets, by a substring of the device name. */
static const struct { const char *name; double bw; } mem_bw_table[] = {
    {"H200", 4.8e12}, {"H100", 3.35e12}, {"A100-SXM4-80GB", 2.039e12}, {"A100", 1.555e12},
    {"V100", 0.9e12}, {"P100", 0.732e12},
};

double cdp_device_peak_flops(const struct cdp_topology_gpu *g, enum cdp_precision prec)
{
    const double fp32 = g->peak_fp32 > 0 ? g->peak_fp32 : g->peak_tf32;
    return prec == CDP_PRECISION_BF16 && g->peak_bf16 > 0 ? g->peak_bf16 : fp32;
}

struct cdp_device_rate cdp_device_rate_of(const struct cdp_topology *t, int gpu, enum cdp_precision prec)
{
    const struct cdp_topology_gpu *g = &t->gpus[gpu];
    struct cdp_device_rate r = {0};
    r.flops = cdp_device_peak_flops(g, prec);
    if (t->kind == CDP_TOPOLOGY_CPU) {
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

/* Parameters a unit holds and steps: its own, and a tied copy (the GPT head's
 * embedding) where it is used too, although only its owner reduces it. */
static double held_params(const struct cdp_unit *u)
{
    double held = (double)u->param_count;
    for (int k = 0; k < u->n_params; k++)
        if (u->params[k].tied_unit >= 0) held += (double)u->params[k].numel;
    return held;
}

void cdp_cost_analytic(const struct cdp_plan *plan, const struct cdp_unit *u, int n,
                       const struct cdp_device_rate *r, struct cdp_unit_cost *out)
{
    const double B = (double)plan->train.micro_batch;
    const double rate = r->flops * r->efficiency;
    const double elem = cdp_cost_act_elem_bytes(plan);
    const double state = cdp_cost_state_bytes_per_param(plan);
    const double opt = cdp_cost_opt_bytes_per_param(plan);
    const double grad = cdp_cost_grad_bytes_per_param(plan);
    for (int i = 0; i < n; i++) {
        const double held = held_params(&u[i]);
        struct cdp_unit_cost *c = &out[i];
        c->fwd_s = fmax(u[i].fwd_flops * B / rate, CDP_COST_UNIT_FLOOR_S);
        c->bwd_s = fmax(u[i].bwd_flops * B / rate, CDP_COST_UNIT_FLOOR_S);
        c->bwd_w_s = u[i].bwd_flops > 0 ? c->bwd_s * u[i].bwd_weight_flops / u[i].bwd_flops : 0;
        c->param_bytes = (double)u[i].param_count * grad;
        c->state_bytes = (double)u[i].param_count * state;
        /* what its recompute mode keeps; attention's saved state, where kept, as the plan's backend keeps it */
        double act = (double)u[i].keep_floats;
        if (u[i].keep_floats == u[i].act_floats) act += (double)(cdp_cost_att_floats(plan, &u[i]) - u[i].att_floats);
        c->act_bytes = act * B * elem;
        c->out_bytes = (double)u[i].out_floats * B * elem;
        c->scratch_bytes = (double)cdp_unit_scratch_floats(&u[i], (int)B) * 4; /* as cdp_unit_bytes */
        c->opt_s = held * opt / r->mem_bw;
    }
}

void cdp_cost_apply(const struct cdp_cost_table *t, const struct cdp_unit *u, int n, struct cdp_unit_cost *out)
{
    CDP_ASSERT(t->n_units == n);
    for (int i = 0; i < n; i++) {
        out[i].fwd_s = t->units[i].fwd_s;
        out[i].bwd_s = t->units[i].bwd_s;
        /* its weight gradients' part as measured (version 2 tables); an older table's splits as its flops do */
        if (t->bwd_w_measured) out[i].bwd_w_s = t->units[i].bwd_w_s;
        else out[i].bwd_w_s = u[i].bwd_flops > 0 ? out[i].bwd_s * u[i].bwd_weight_flops / u[i].bwd_flops : 0;
        out[i].opt_s = held_params(&u[i]) * t->optimizer_s_per_param;
    }
}

void cdp_cost_table_tensor_note(const struct cdp_cost_table *t, int tp, char *buf, size_t cap)
{
    const int mt = t->tensor > 1 ? t->tensor : 1;
    if (tp < 1) tp = 1;
    const char *w = t->bwd_w_measured ? "" : "; W by FLOP share (a version 1 table)";
    if (mt == tp)
        snprintf(buf, cap, "measured at t = %d, used as measured%s%s", mt,
                 tp > 1 ? " (compute; the group's collectives costed on its links)" : "", w);
    else if (mt == 1)
        snprintf(buf, cap, "measured at t = 1, split units' times / %d for t = %d%s", tp, tp, w);
    else
        snprintf(buf, cap, "measured at t = %d, split units' times x %d/%d for t = %d%s", mt, mt, tp, tp, w);
}

void cdp_cost_add_recompute(const struct cdp_unit *u, int n, struct cdp_unit_cost *out)
{
    for (int i = 0; i < n; i++) {
        if (!u[i].work_floats) continue;
        double share = u[i].recompute == CDP_RECOMPUTE_FULL ? 1.0 : 0.0;
        if (u[i].recompute != CDP_RECOMPUTE_FULL && u[i].fwd_flops > 0) share = u[i].recompute_flops / u[i].fwd_flops;
        out[i].bwd_s += out[i].fwd_s * share;
    }
}
