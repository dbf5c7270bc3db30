/* cdphybrid --plan P --simulate: the plan's schedule run on the cost model and
 * the topology's links before any device is touched (pipeline/simulator.c);
 * prints the stages, the prediction and the busiest links, and writes the
 * predicted trace and timeline. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "cdp/plan.h"
#include "cdp/topology.h"
#include "cli/commands.h"
#include "model/layers.h"
#include "partitioner/costs.h"
#include "partitioner/partition.h"
#include "partitioner/planner.h"
#include "pipeline/schedule.h"
#include "pipeline/simulator.h"


struct sim_setup {
    int p, v, m, R, nv, N, tied;
    struct cdp_topology *topo;
    int *device;          /* [s*R + r] */
    int64_t (*ranges)[2]; /* nv */
    struct cdp_sim_vstage *vs;
    double tied_bytes;
    double *bw, *lat;
    struct cdp_schedule *sched;
    struct cdp_sim_result *res;
    char topo_note[256];
    const char *placement_note;
    const char *costs; /* --costs FILE, or NULL: analytic */
    char costs_device[128];
};

static void sim_setup_free(struct sim_setup *S)
{
    cdp_topology_free(S->topo);
    free(S->device);
    free(S->ranges);
    free(S->vs);
    free(S->bw);
    free(S->lat);
    cdp_schedule_free(S->sched);
    cdp_sim_result_free(S->res);
}

static cdp_status sim_prepare(const struct cdp_plan *plan, struct sim_setup *S)
{
    const struct cdp_parallel_desc *pd = &plan->parallel;
    cdp_status st;
    struct cdp_unit *u = NULL;
    struct cdp_unit_cost *cost = NULL;
    double *w = NULL;
    int n = 0;
    S->p = (int)pd->stages;
    S->R = (int)pd->replicas;
    S->m = (int)pd->micro_batches;
    S->v = pd->schedule == CDP_SCHEDULE_INTERLEAVED ? (int)pd->chunks : 1;
    S->nv = S->p * S->v;
    S->N = S->p * S->R;
    S->tied = plan->model.kind == CDP_MODEL_GPT && plan->model.tie_embeddings && S->p > 1;
    if ((st = cdp_planner_topology(plan, S->N, &S->topo, S->topo_note, sizeof S->topo_note)))
        return cdp_error_context(st, "%s: /cluster/topology", plan->source);
    const int nd = S->topo->n_gpus;
    if (S->N > nd)
        return cdp_fail(CDP_ERR_INVALID, "%s: the plan needs %d devices (/parallel/stages %d x /parallel/replicas "
                        "%d); topology %s has %d", plan->source, S->N, S->p, S->R, S->topo->name, nd);
    S->device = calloc((size_t)S->N, sizeof *S->device);
    S->ranges = calloc((size_t)S->nv, sizeof *S->ranges);
    S->vs = calloc((size_t)S->nv, sizeof *S->vs);
    S->bw = calloc((size_t)nd * nd, sizeof *S->bw);
    S->lat = calloc((size_t)nd * nd, sizeof *S->lat);
    if (!S->device || !S->ranges || !S->vs || !S->bw || !S->lat) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    for (int s = 0; s < S->p; s++)
        for (int r = 0; r < S->R; r++) {
            int d;
            switch (pd->placement) {
            case CDP_PLACEMENT_EXPLICIT: d = (int)pd->placement_map[s * S->R + r]; break;
            case CDP_PLACEMENT_ORDERED_DP_INNER: d = s * S->R + r; break;
            default: d = r * S->p + s; break;
            }
            if (d < 0 || d >= nd)
                return cdp_fail(CDP_ERR_INVALID, "%s: /parallel/placement: stage %d replica %d on device %d; "
                                "topology %s has devices 0..%d", plan->source, s, r, d, S->topo->name, nd - 1);
            S->device[s * S->R + r] = d;
        }
    S->placement_note = pd->placement == CDP_PLACEMENT_EXPLICIT           ? "explicit"
                        : pd->placement == CDP_PLACEMENT_ORDERED_DP_INNER ? "ordered-dp-inner (replicas adjacent)"
                        : pd->placement == CDP_PLACEMENT_ORDERED_PP_INNER ? "ordered-pp-inner (stages adjacent)"
                                                                          : "topology: ordered-pp-inner (stages "
                                                                            "adjacent) until the planner lands";
    if ((st = cdp_units_build(&plan->model, &u, &n))) return st;
    cost = calloc((size_t)n * S->p, sizeof *cost); /* per rank: its replica 0's device */
    w = calloc((size_t)n, sizeof *w);
    if (!cost || !w) {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
        goto done;
    }
    struct cdp_cost_table table = {0};
    if (S->costs) {
        if ((st = cdp_cost_table_read(S->costs, &table))) goto done;
        if ((st = cdp_cost_table_check(&table, S->costs, plan, u, n))) {
            cdp_cost_table_clear(&table);
            goto done;
        }
        snprintf(S->costs_device, sizeof S->costs_device, "%s", table.device);
    }
    for (int s = 0; s < S->p; s++) {
        struct cdp_device_rate rate = cdp_device_rate_of(S->topo, S->device[s * S->R], plan->train.precision);
        cdp_costs_analytic(plan, u, n, &rate, cost + (size_t)s * n);
        /* a measured table is of one device: every stage's (the CPU ranks') */
        if (S->costs) cdp_costs_apply(&table, u, n, cost + (size_t)s * n);
    }
    cdp_cost_table_clear(&table);
    if (pd->partition) {
        memcpy(S->ranges, pd->partition, (size_t)S->nv * sizeof *S->ranges);
    } else {
        /* measured times predict a run, so the split is the executor's own
         * (pipeline/executor.c: FLOPs + 1e3 per unit), not one balanced on them */
        for (int i = 0; i < n; i++)
            w[i] = S->costs ? u[i].fwd_flops + u[i].bwd_flops + 1e3 : cost[i].fwd_s + cost[i].bwd_s;
        if ((st = cdp_partition_balanced(w, n, S->nv, S->ranges))) {
            st = cdp_error_context(st, "%s: /parallel/stages", plan->source);
            goto done;
        }
    }
    cdp_planner_vstages(cost, (size_t)n, S->p, S->nv, (const int64_t(*)[2])S->ranges, S->vs);
    if (S->tied) S->tied_bytes = cdp_planner_tied_bytes(plan, u, n);
    cdp_planner_links(S->topo, S->bw, S->lat);
    if ((st = cdp_schedule_build(pd->schedule, S->p, S->v, S->m, S->tied, &S->sched)))
        st = cdp_error_context(st, "%s: /parallel", plan->source);
done:
    free(w);
    free(cost);
    free(u);
    return st;
}

static uint64_t sim_capacity(const struct cdp_plan *plan, const struct sim_setup *S, int dev)
{
    uint64_t cap = S->topo->gpus[dev].memory_bytes;
    if (plan->cluster.device_memory && (!cap || plan->cluster.device_memory < cap)) cap = plan->cluster.device_memory;
    return cap;
}

static double sim_stage_memory(const struct sim_setup *S, int s)
{
    double m = 0;
    for (int r = 0; r < S->R; r++) m = fmax(m, S->res->peak_memory[s * S->R + r]);
    return m;
}

static void sim_print_text(const struct cdp_plan *plan, const struct sim_setup *S)
{
    const struct cdp_sim_result *res = S->res;
    const double closed = cdp_sim_bubble_closed_form(S->p, S->v, S->m);
    printf("Simulation of %s (predicted; nothing runs)\n", plan->source);
    printf("  topology    %s (%d %s)%s%s%s\n", S->topo->name, S->topo->n_gpus,
           S->topo->kind == CDP_TOPO_CPU ? "CPU devices" : "GPUs", S->topo_note[0] ? "; " : "", S->topo_note, "");
    printf("  placement   %s\n", S->placement_note);
    printf("  schedule    %s, %d stages", cdp_schedule_name(plan->parallel.schedule), S->p);
    if (S->v > 1) printf(" x %d chunks", S->v);
    printf(", %d micro-batches of %lld, %d replica%s, %s\n", S->m, (long long)plan->train.micro_batch, S->R,
           S->R == 1 ? "" : "s", plan->train.precision == CDP_PRECISION_BF16 ? "bf16" : "fp32");
    printf("  partition   %s\n", plan->parallel.partition ? "from the plan"
                                 : S->costs                ? "the executor's (balanced on FLOPs)"
                                                           : "balanced on the cost model");
    if (S->costs) printf("  costs       measured: %s (%s)\n", S->costs, S->costs_device);
    printf("\n");
    printf("Stages (per micro-batch)\n  stage  units            fwd ms   bwd ms   memory\n");
    for (int s = 0; s < S->p; s++) {
        char units[128] = "";
        size_t o = 0;
        double f = 0, b = 0;
        for (int k = s; k < S->nv; k += S->p) {
            o += (size_t)snprintf(units + o, o < sizeof units ? sizeof units - o : 0, "%s[%lld,%lld)",
                                  k == s ? "" : " ", (long long)S->ranges[k][0], (long long)S->ranges[k][1]);
            f += S->vs[k].fwd_s;
            b += S->vs[k].bwd_s;
        }
        printf("  %5d  %-15s %8.3f %8.3f   %.2f GiB\n", s, units, f * 1e3, b * 1e3,
               sim_stage_memory(S, s) / 1073741824.0);
    }
    printf("\nPredicted\n");
    printf("  step time   %.3f ms (forward/backward phase %.3f ms)\n", res->step_s * 1e3, res->phase_s * 1e3);
    printf("  throughput  %.1f samples/s\n", res->samples_per_s);
    printf("  bubble      %.2f%% (closed form (p-1)/(v*m+p-1) = %.2f%% for equal stages without communication)\n",
           100 * res->bubble, 100 * closed);
    printf("\nRanks\n  rank  stage  replica  device  busy ms  peak memory  in flight  of capacity\n");
    for (int r = 0; r < S->R; r++)
        for (int s = 0; s < S->p; s++) {
            const int i = s * S->R + r, d = S->device[i];
            const uint64_t cap = sim_capacity(plan, S, d);
            char capbuf[48] = "unknown";
            if (cap) snprintf(capbuf, sizeof capbuf, "%.0f%%%s", 100.0 * res->peak_memory[i] / (double)cap,
                              res->peak_memory[i] > (double)cap ? " (does not fit)" : "");
            printf("  %4d  %5d  %7d  %6d  %7.3f  %8.2f GiB  %9d  %s\n", r * S->p + s, s, r, d, res->busy_s[i] * 1e3,
                   res->peak_memory[i] / 1073741824.0, res->peak_in_flight[i], capbuf);
        }
    printf("\nBusiest links\n");
    if (res->n_links == 0) printf("  (no traffic between devices)\n");
    for (int l = 0; l < res->n_links && l < 8; l++) {
        struct cdp_topo_link tl;
        char lab[16] = "?";
        if (!cdp_topology_link(S->topo, res->links[l].src, res->links[l].dst, &tl))
            cdp_topology_link_label(&tl, lab, sizeof lab);
        printf("  %3d -> %-3d %-5s %10.3f MB  %8.3f ms busy (%.0f%% of the step)\n", res->links[l].src,
               res->links[l].dst, lab, res->links[l].bytes / 1e6, res->links[l].busy_s * 1e3,
               res->step_s > 0 ? 100 * res->links[l].busy_s / res->step_s : 0);
    }
}

static cdp_status sim_print_json(const struct cdp_plan *plan, const struct sim_setup *S)
{
    const struct cdp_sim_result *res = S->res;
    json_t *o = json_object(), *stages = json_array(), *pl = json_array(), *pr = json_object(),
           *mem = json_array(), *links = json_array();
    json_object_set_new(o, "plan", json_string(plan->source));
    json_object_set_new(o, "topology", json_string(S->topo->name));
    json_object_set_new(o, "placement_kind", json_string(S->placement_note));
    json_object_set_new(o, "schedule", json_string(cdp_schedule_name(plan->parallel.schedule)));
    json_object_set_new(o, "chunks", json_integer(S->v));
    json_object_set_new(o, "micro_batches", json_integer(S->m));
    json_object_set_new(o, "replicas", json_integer(S->R));
    json_object_set_new(o, "costs", S->costs ? json_string(S->costs) : json_string("analytic"));
    for (int s = 0; s < S->p; s++) {
        json_t *st = json_object(), *ch = json_array();
        double f = 0, b = 0;
        for (int k = s; k < S->nv; k += S->p) {
            json_array_append_new(ch, json_pack("[I,I]", (json_int_t)S->ranges[k][0], (json_int_t)S->ranges[k][1]));
            f += S->vs[k].fwd_s;
            b += S->vs[k].bwd_s;
        }
        json_object_set_new(st, "index", json_integer(s));
        if (S->v == 1) json_object_set(st, "layers", json_array_get(ch, 0));
        json_object_set_new(st, "chunks", ch);
        json_object_set_new(st, "fwd_s", json_real(f));
        json_object_set_new(st, "bwd_s", json_real(b));
        json_object_set_new(st, "memory_bytes", json_real(sim_stage_memory(S, s)));
        json_array_append_new(stages, st);
    }
    json_object_set_new(o, "stages", stages);
    for (int r = 0; r < S->R; r++)
        for (int s = 0; s < S->p; s++) {
            const int i = s * S->R + r, d = S->device[i];
            json_array_append_new(pl, json_pack("{s:i,s:i,s:i,s:i,s:i,s:i}", "rank", r * S->p + s, "stage", s,
                                                "replica", r, "device", d, "node", S->topo->gpus[d].node, "gpu",
                                                S->topo->gpus[d].local));
            json_array_append_new(mem, json_real(res->peak_memory[i]));
        }
    json_object_set_new(o, "placement", pl);
    json_object_set_new(pr, "step_s", json_real(res->step_s));
    json_object_set_new(pr, "phase_s", json_real(res->phase_s));
    json_object_set_new(pr, "bubble", json_real(res->bubble));
    json_object_set_new(pr, "bubble_closed_form", json_real(cdp_sim_bubble_closed_form(S->p, S->v, S->m)));
    json_object_set_new(pr, "samples_per_s", json_real(res->samples_per_s));
    json_object_set_new(pr, "peak_memory_bytes", mem);
    json_object_set_new(o, "predicted", pr);
    for (int l = 0; l < res->n_links; l++)
        json_array_append_new(links, json_pack("{s:i,s:i,s:f,s:f}", "src", res->links[l].src, "dst",
                                               res->links[l].dst, "bytes", res->links[l].bytes, "busy_s",
                                               res->links[l].busy_s));
    json_object_set_new(o, "links", links);
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    json_decref(o);
    if (!text) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    puts(text);
    free(text);
    return CDP_OK;
}

int cdp_cli_simulate(const struct cdp_plan *plan, int json, const char *trace, const char *timeline,
                     const char *costs)
{
    const struct cdp_parallel_desc *pd = &plan->parallel;
    const char *key = pd->stages == CDP_AUTO          ? "/parallel/stages"
                      : pd->replicas == CDP_AUTO      ? "/parallel/replicas"
                      : pd->micro_batches == CDP_AUTO ? "/parallel/micro_batches"
                      : pd->schedule_auto             ? "/parallel/schedule"
                                                      : NULL;
    if (key) {
        fprintf(stderr, "cdphybrid: %s: %s is \"auto\": --simulate needs it fixed; --dry-run plans it "
                        "(--dry-run --json writes the planned plan)\n", plan->source, key);
        return EXIT_USAGE;
    }
    struct sim_setup S = {.costs = costs};
    cdp_status st = sim_prepare(plan, &S);
    if (!st) {
        struct cdp_sim_config c = {.sched = S.sched, .replicas = S.R, .vstage = S.vs, .tied_bytes = S.tied_bytes,
                                   .device = S.device, .n_devices = S.topo->n_gpus, .bandwidth = S.bw,
                                   .latency = S.lat, .samples_per_mb = (double)plan->train.micro_batch};
        st = cdp_sim_run(&c, &S.res);
    }
    if (!st && (trace || timeline)) st = cdp_sim_write_trace(S.res, S.N, trace, timeline);
    if (!st) {
        if (json) st = sim_print_json(plan, &S);
        else sim_print_text(plan, &S);
    }
    sim_setup_free(&S);
    if (st) {
        fprintf(stderr, "cdphybrid: %s\n", cdp_last_error());
        return cdp_cli_exit_code(st);
    }
    if (fflush(stdout) != 0) {
        fprintf(stderr, "cdphybrid: cannot write to standard output\n");
        return EXIT_RUN_FAILED;
    }
    return 0;
}

