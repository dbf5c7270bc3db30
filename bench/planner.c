/* bench-planner: plans a 96-layer GPT-3-sized model on 128 x hgx-h100 (1,024
 * GPUs) with stages, replicas and micro-batches "auto" and prints the time the
 * search took, what it searched and the plan it chose (target: under 10 s). */
#include <stdio.h>
#include <stdlib.h>

#include "cdp/core.h"
#include "cdp/plan.h"
#include "cdp/topology.h"
#include "partitioner/planner.h"

/* %s: embed, heads. The GPT-3 shape does not fit 80 GB per GPU without
 * tensor parallelism or recomputation (neither is modelled), so a 96-layer
 * model of embed 4096 is planned too, to time a search that simulates. */
static const char *const PLAN_FMT =
    "{\"model\": {\"preset\": \"gpt\", \"vocab\": 50257, \"context\": 2048, \"layers\": 96, \"heads\": %d,"
    " \"embed\": %d},"
    " \"train\": {\"global_batch\": 1536, \"micro_batch\": 1, \"precision\": \"bf16\","
    " \"optimizer\": {\"type\": \"adamw\"}},"
    " \"parallel\": {\"stages\": \"auto\", \"replicas\": \"auto\", \"micro_batches\": \"auto\"},"
    " \"cluster\": {\"backend\": \"cuda\", \"topology\": \"128 x hgx-h100\"}}";

static int run(int heads, int embed)
{
    char text[1024];
    snprintf(text, sizeof text, PLAN_FMT, heads, embed);
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
    printf("== GPT 96 layers, embed %d, heads %d, %.1f B parameters, bf16, adamw, global batch 1536 on %s (%d GPUs)\n",
           embed, heads, (double)cdp_plan_param_count(plan) / 1e9, t->name, t->n_gpus);
    cdp_status st = cdp_planner_run(plan, t, NULL, 0, &r);
    const uint64_t t2 = cdp_time_ns();
    printf("load        %.3f s (plan + topology)\n", (double)(t1 - t0) * 1e-9);
    printf("planning    %.3f s (target < 10 s)\n", (double)(t2 - t1) * 1e-9);
    if (st) {
        printf("result      no plan: %s\n\n", cdp_last_error());
    } else {
        printf("searched    %lld shapes, %lld fit in memory, %lld placed, %lld simulations of all ranks, %lld of "
               "one replica\n", (long long)r.shapes, (long long)r.feasible, (long long)r.placed_shapes,
               (long long)r.simulations, (long long)r.replica_simulations);
        cdp_planner_print(&r, stdout);
        printf("\n");
    }
    cdp_planner_result_clear(&r);
    cdp_topology_free(t);
    cdp_plan_free(plan);
    return st && st != CDP_ERR_INVALID;
}

int main(void)
{
    return run(96, 12288) | run(32, 4096);
}
