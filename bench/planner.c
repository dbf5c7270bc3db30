/* bench-planner: plans a 96-layer GPT-3-sized model on 128 x hgx-h100 (1,024
 * GPUs), and GPT-3 175B on 8 x dgx-a100, with stages, replicas,
 * micro-batches and tensor groups "auto" and prints the time the search took
 * (wall and CPU), what it searched, the plan it chose beside the best plan of
 * every other t, and its predicted MFU (targets: under 10 s; 40 % MFU for
 * 175B on 128 x hgx-h100). The 175B case on hgx-h100 sends its tensor
 * collectives as bf16, as Megatron-LM's do (they carry its bf16
 * activations), and reduces gradients in fp32, as Megatron-LM does for bf16
 * training (accumulate_allreduce_grads_in_fp32); it is planned once more with
 * both fp32, the other cases keep fp32. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cdp/core.h"
#include "cdp/plan.h"
#include "cdp/topology.h"
#include "model/costs.h"
#include "model/layers.h"
#include "partitioner/costs.h"
#include "partitioner/planner.h"
#include "partitioner/planner_internal.h"

/* %d, %d, %s, %s: heads, embed, /parallel/comm_dtype, topology. The GPT-3
 * shape (175B) fits 80 GB per GPU only with activation recomputation or
 * sequence parallelism, which the planner chooses ("auto"); a 96-layer model
 * of embed 4096 is planned too, which fits without. The two 175B cases on
 * 128 x hgx-h100 search the schedule too ("auto": it picks zb-h1 there, 38.4 %
 * MFU against 1F1B's 37.0 %); the search checks a shape's memory, building and
 * proving its lists, only when the shape's bound could still win, which keeps it
 * to a few seconds of CPU (docs/planner.md, "schedule"). The other two keep the
 * default 1F1B. */
static const char *const PLAN_FMT =
    "{\"model\": {\"preset\": \"gpt\", \"vocab\": 50257, \"context\": 2048, \"layers\": 96, \"heads\": %d,"
    " \"embed\": %d},"
    " \"train\": {\"global_batch\": 1536, \"micro_batch\": 1, \"precision\": \"bf16\","
    " \"optimizer\": {\"type\": \"adamw\"}},"
    " \"parallel\": {\"stages\": \"auto\", \"replicas\": \"auto\", \"micro_batches\": \"auto\", \"tensor\": \"auto\","
    " \"sequence_parallel\": \"auto\", \"comm_dtype\": %s%s},"
    " \"cluster\": {\"backend\": \"cuda\", \"topology\": \"%s\"}}";

/* The predicted rate per GPU the layout uses: model FLOPs (forward and
 * backward matrix work per sample x the global batch) per step, and with what
 * recomputation runs again (the hardware's work), against the GPU's dense
 * bf16 peak (MFU). */
static void print_rate(const struct cdp_plan *plan, const struct cdp_topology *t, const struct cdp_planner_result *r)
{
    struct cdp_unit *u = NULL;
    int n = 0;
    if (!r->predicted_ok || cdp_units_build(&plan->model, &u, &n)) return;
    double model = 0, again = 0;
    for (int i = 0; i < n; i++) {
        cdp_unit_set_recompute(&u[i], r->layout->recompute);
        model += u[i].fwd_flops + u[i].bwd_flops;
        again += u[i].recompute_flops;
    }
    free(u);
    const double samples = (double)plan->train.global_batch, gpus = r->layout->n_ranks;
    const double per_gpu = model * samples / r->predicted.step_s / gpus, hw = (model + again) * samples /
                                                                               r->predicted.step_s / gpus;
    const double peak = t->gpus[0].peak_bf16;
    printf("\nPredicted rate (%d GPUs of %d used; %s peak %.0f TFLOP/s dense bf16)\n", r->layout->n_ranks, t->n_gpus,
           t->gpus[0].name, peak / 1e12);
    printf("  model FLOPs     %.1f TFLOP/s per GPU, MFU %.1f%%\n", per_gpu / 1e12, peak > 0 ? 100 * per_gpu / peak : 0);
    printf("  with recompute  %.1f TFLOP/s per GPU (%.1f%% of peak; recompute %s)\n", hw / 1e12,
           peak > 0 ? 100 * hw / peak : 0, cdp_recompute_name(r->layout->recompute));
}

/* Where the chosen plan's step goes, per GPU, from the model's FLOPs at the
 * dense peak up to the predicted step: each line is what one effect of the cost
 * model adds (the rank's units rebuilt as the search builds them for the
 * chosen t, sequence parallelism and recomputation: compute from FLOPs at the
 * device's rate, then the tensor group's collectives; the stages' times and the bubble are the plan's). */
static void print_breakdown(const struct cdp_plan *plan, const struct cdp_topology *t,
                            const struct cdp_planner_result *r)
{
    const struct cdp_layout *l = r->layout;
    const int tp = l->tensor, p = l->stages, v = l->chunks > 0 ? l->chunks : 1;
    struct cdp_unit *u = NULL, *whole = NULL;
    int n = 0, nw = 0;
    struct cdp_model_desc md = plan->model; /* as planned: sequence parallel or not */
    md.seq_parallel = r->sequence_parallel;
    if (!r->predicted_ok || cdp_units_build_tensor(&md, tp, 0, &u, &n) ||
        cdp_units_build(&plan->model, &whole, &nw)) {
        free(u);
        return;
    }
    struct cdp_unit_cost *cost = calloc((size_t)n, sizeof *cost);
    if (!cost) {
        free(u), free(whole);
        return;
    }
    for (int k = 0; k < n; k++) cdp_unit_set_recompute(&u[k], l->recompute);
    cdp_cost_fit_units(plan, u, n);
    cdp_planner_tensor_units(plan, tp, u, n);
    const struct cdp_device_rate rate = cdp_device_rate_of(t, 0, plan->train.precision);
    cdp_cost_analytic(plan, u, n, &rate, cost);
    cdp_cost_add_recompute(u, n, cost);
    double bw = 0, lat = 0;
    if (tp > 1) cdp_planner_tensor_links(t, tp, &bw, &lat);
    double plain = 0; /* fwd + bwd of one micro-batch, no recomputation, no collectives, summed over stages */
    for (int k = 0; k < n; k++) {
        const double B = (double)plan->train.micro_batch, rt = rate.flops * rate.efficiency;
        plain += fmax(u[k].fwd_flops * B / rt, CDP_COST_UNIT_FLOOR_S) + fmax(u[k].bwd_flops * B / rt, CDP_COST_UNIT_FLOOR_S);
    }
    struct cdp_plan at = *plan; /* shallow, read only */
    at.model = md;
    cdp_planner_tensor_costs(&at, tp, bw, lat, u, n, cost);
    double comp = 0, coll = 0, worst = 0;
    for (int k = 0; k < p * v; k++)
        for (int64_t i = l->ranges[k][0]; i < l->ranges[k][1]; i++) {
            comp += cost[i].fwd_s + cost[i].bwd_s - cost[i].tp_fwd_s - cost[i].tp_bwd_s;
            coll += cost[i].tp_fwd_s + cost[i].tp_bwd_s;
        }
    for (int s = 0; s < p; s++) worst = fmax(worst, r->stage[s].fwd_s + r->stage[s].bwd_s);
    double model = 0;
    for (int k = 0; k < nw; k++) model += whole[k].fwd_flops + whole[k].bwd_flops;
    free(u), free(whole), free(cost);
    const double m = (double)l->micro_batches, gpus = l->n_ranks, peak = cdp_device_peak_flops(&t->gpus[0],
                                                                                                 plan->train.precision);
    const double A = model * (double)plan->train.global_batch / gpus / peak; /* model FLOPs at the peak */
    const double B = m * plain / p;                                      /* at the cost model's efficiency */
    double C = m * comp / p;                                       /* with recomputation */
    const double D = m * (comp + coll) / p;                              /* with the tensor all-reduces */
    const double E = m * worst;                                          /* the slowest stage's busy time */
    const double F = D / (1 - r->predicted.bubble);                      /* the phase: to the last backward */
    const double G = r->predicted.step_s;
    const double zero = 5e-5; /* under the 0.1 ms printed: no "-0.0" */
    if (fabs(C - B) < zero) C = B;
    printf("\nWhere the step goes (per GPU; each line adds one effect of the cost model)\n");
    printf("  %-56s %9.1f ms  %5.1f%% of the step\n", "model FLOPs at the dense peak", 1e3 * A, 100 * A / G);
    printf("  %-56s %+9.1f ms  %5.1f%%\n", "compute at the cost model's efficiency", 1e3 * (B - A), 100 * (B - A) / G);
    printf("  %-56s %+9.1f ms  %5.1f%%\n", "recomputation", 1e3 * (C - B), 100 * (C - B) / G);
    char what[96];
    snprintf(what, sizeof what, "tensor %s (%s, not overlapped)",
             r->sequence_parallel ? "scatters and gathers" : "all-reduces",
             plan->parallel.comm_bf16_tensor ? "bf16" : "fp32");
    printf("  %-56s %+9.1f ms  %5.1f%%\n", what, 1e3 * (D - C), 100 * (D - C) / G);
    printf("  %-56s %+9.1f ms  %5.1f%%\n", "unequal stages (the slowest sets the pace)", 1e3 * (E - D),
           100 * (E - D) / G);
    printf("  %-56s %+9.1f ms  %5.1f%%\n", "pipeline fill and drain", 1e3 * (F - E), 100 * (F - E) / G);
    snprintf(what, sizeof what, "after the last backward (reduction in %s, optimizer)",
             plan->parallel.comm_bf16_gradients ? "bf16" : "fp32");
    printf("  %-56s %+9.1f ms  %5.1f%%\n", what, 1e3 * (G - F), 100 * (G - F) / G);
    printf("  %-56s %9.1f ms\n", "predicted step", 1e3 * G);
}

static int run(int heads, int embed, const char *topology, const char *comm_dtype, const char *schedule)
{
    char text[1024], sched[64] = "";
    if (schedule) snprintf(sched, sizeof sched, ", \"schedule\": \"%s\"", schedule);
    snprintf(text, sizeof text, PLAN_FMT, heads, embed, comm_dtype, sched, topology);
    struct cdp_plan *plan = NULL;
    struct cdp_topology *t = NULL;
    struct cdp_planner_result r = {0};
    struct cdp_machine_info m = {0};
    const uint64_t t0 = cdp_time_ns();
    if (cdp_plan_load_string(text, "bench.json", NULL, &plan) || cdp_plan_resolve(plan, &m) ||
        cdp_topology_load(plan->cluster.topology, NULL, &t)) {
        fprintf(stderr, "bench-planner: %s\n", cdp_last_error());
        return 1;
    }
    const uint64_t t1 = cdp_time_ns();
    const clock_t c1 = clock();
    printf("== GPT 96 layers, embed %d, heads %d, %.1f B parameters, bf16, adamw, global batch 1536 on %s (%d GPUs), "
           "comm_dtype %s, schedule %s\n", embed, heads, (double)cdp_plan_param_count(plan) / 1e9, t->name, t->n_gpus,
           comm_dtype, schedule ? schedule : "1f1b");
    cdp_status st = cdp_planner_run(plan, t, NULL, 0, &r);
    const uint64_t t2 = cdp_time_ns();
    const clock_t c2 = clock();
    printf("load        %.3f s (plan + topology)\n", (double)(t1 - t0) * 1e-9);
    printf("planning    %.3f s (target < 10 s; %.3f s of CPU, which other programs on the machine do not change)\n",
           (double)(t2 - t1) * 1e-9, (double)(c2 - c1) / CLOCKS_PER_SEC);
    if (st) {
        printf("result      no plan: %s\n\n", cdp_last_error());
    } else {
        printf("searched    %lld shapes, memory checked for %lld (%lld fit; the others' bound could not win), %lld "
               "placed, %lld simulations of all ranks, %lld of one replica\n", (long long)r.shapes,
               (long long)r.checked, (long long)r.feasible, (long long)r.placed_shapes, (long long)r.simulations,
               (long long)r.replica_simulations);
        cdp_planner_print(&r, stdout);
        print_rate(plan, t, &r);
        print_breakdown(plan, t, &r);
        printf("\n");
    }
    cdp_planner_result_clear(&r);
    cdp_topology_free(t);
    cdp_plan_free(plan);
    return st && st != CDP_ERR_INVALID;
}

int main(void)
{
    /* GPT-3 175B and a 96-layer GPT of embed 4096 on 1,024 H100s; 175B on 64 A100s */
    return run(96, 12288, "128 x hgx-h100", "{\"tensor\": \"bf16\", \"gradients\": \"fp32\"}", "auto") |
           run(96, 12288, "128 x hgx-h100", "\"fp32\"", "auto") | run(32, 4096, "128 x hgx-h100", "\"fp32\"", NULL) |
           run(96, 12288, "8 x dgx-a100", "\"fp32\"", NULL);
}
