/* cdphybrid --plan P --simulate: the planner's layout (what training would
 * run) simulated on the cost model and the topology's links before any device
 * is touched (pipeline/simulator.c); prints the stages, the prediction, the
 * ranks with their memory and the busiest links, and writes the predicted
 * trace and timeline. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/plan.h"
#include "cdp/topology.h"
#include "cli/commands.h"
#include "partitioner/planner.h"
#include "pipeline/schedule.h"
#include "pipeline/simulator.h"
#include "pipeline/trace.h"
#include "plan/schedule_kind.h"

/* Row i of the simulator's per-(stage, replica) arrays for world rank i. */
static int sim_index(const struct cdp_layout *l, int rank)
{
    return l->rank[rank].stage * l->replicas + l->rank[rank].replica;
}

static void print_text(const struct cdp_plan *plan, const struct cdp_sim_in *in)
{
    const struct cdp_layout *l = in->r->layout;
    const struct cdp_sim_result *res = in->res;
    const int v = l->chunks;
    const double closed = cdp_sim_bubble_closed_form_kind(l->schedule, l->stages, v, l->micro_batches);
    printf("Simulation of %s (predicted; nothing runs)\n", plan->source);
    printf("  topology    %s (%d %s)%s%s\n", in->t->name, in->t->n_gpus,
           in->t->kind == CDP_TOPOLOGY_CPU ? "CPU devices" : "GPUs", in->note[0] ? "; " : "", in->note);
    printf("  placement   %s\n", in->r->placement_method);
    printf("  schedule    %s, %d stages", cdp_schedule_name(l->schedule), l->stages);
    if (v > 1) printf(" x %d chunks", v);
    printf(", %d micro-batches of %d, %d replica%s, %s\n", l->micro_batches, l->micro_batch, l->replicas,
           l->replicas == 1 ? "" : "s", plan->train.precision == CDP_PRECISION_BF16 ? "bf16" : "fp32");
    printf("  partition   %s\n", plan->parallel.partition ? "from the plan" : "the planner's");
    if (in->costs) {
        char note[192] = "";
        if (in->table) cdp_cost_table_tensor_note(in->table, l->tensor, note, sizeof note);
        printf("  costs       measured: %s (%s)%s%s\n", in->costs, in->costs_device, note[0] ? "; " : "", note);
    }
    printf("\n");
    printf("Stages (per micro-batch)\n  stage  units            fwd ms   bwd ms   memory\n");
    for (int s = 0; s < l->stages; s++) {
        char units[128] = "";
        size_t o = 0;
        for (int ch = 0; ch < v; ch++) {
            const int k = cdp_schedule_vstage(l->schedule, l->stages, v, s, ch);
            o += (size_t)snprintf(units + o, o < sizeof units ? sizeof units - o : 0, "%s[%lld,%lld)",
                                  ch == 0 ? "" : " ", (long long)l->ranges[k][0], (long long)l->ranges[k][1]);
        }
        char mem[32];
        cdp_format_bytes((uint64_t)in->r->stage[s].memory_bytes, mem, sizeof mem);
        printf("  %5d  %-15s %8.3f %8.3f   %s\n", s, units, in->r->stage[s].fwd_s * 1e3, in->r->stage[s].bwd_s * 1e3,
               mem);
    }
    printf("\nPredicted\n");
    printf("  step time   %.3f ms (forward/backward phase %.3f ms)\n", res->step_s * 1e3, res->phase_s * 1e3);
    printf("  throughput  %.1f samples/s\n", res->samples_per_s);
    const struct cdp_schedule_def *def = cdp_schedule_def(l->schedule);
    printf("  bubble      %.2f%% (closed form %s = %.2f%% for equal stages%s without communication)\n",
           100 * res->bubble, def->bubble_text, 100 * closed, def->bubble_assumes);
    printf("\nRanks\n  rank  node  stage  replica  device  busy ms       memory  in flight  of capacity\n");
    for (int i = 0; i < l->n_ranks; i++) {
        const struct cdp_layout_rank *k = &l->rank[i];
        const int j = sim_index(l, i);
        char capbuf[48] = "unknown";
        if (k->capacity)
            snprintf(capbuf, sizeof capbuf, "%.0f%%", 100.0 * (double)k->memory.device / (double)k->capacity);
        char mem[32];
        cdp_format_bytes(k->memory.device, mem, sizeof mem);
        printf("  %4d  %4d  %5d  %7d  %6d  %7.3f  %11s  %9d  %s\n", i, k->node, k->stage, k->replica, k->device,
               res->busy_s[j] * 1e3, mem, res->peak_in_flight[j], capbuf);
    }
    printf("\nBusiest links\n");
    if (res->n_links == 0) printf("  (no traffic between devices)\n");
    for (int q = 0; q < res->n_links && q < 8; q++) {
        struct cdp_topology_link tl;
        char lab[16] = "?";
        if (!cdp_topology_link(in->t, res->links[q].src, res->links[q].dst, &tl))
            cdp_topology_link_label(&tl, lab, sizeof lab);
        printf("  %3d -> %-3d %-5s %10.3f MB  %8.3f ms busy (%.0f%% of the step)\n", res->links[q].src,
               res->links[q].dst, lab, res->links[q].bytes / 1e6, res->links[q].busy_s * 1e3,
               res->step_s > 0 ? 100 * res->links[q].busy_s / res->step_s : 0);
    }
}

static cdp_status print_json(const struct cdp_plan *plan, const struct cdp_sim_in *in)
{
    const struct cdp_layout *l = in->r->layout;
    const struct cdp_sim_result *res = in->res;
    json_t *o = json_object(), *stages = json_array(), *pr = json_object(), *mem = json_array(),
           *links = json_array(), *pl = cdp_layout_ranks_json(l);
    json_object_set_new(o, "plan", json_string(plan->source));
    json_object_set_new(o, "topology", json_string(in->t->name));
    json_object_set_new(o, "placement_kind", json_string(in->r->placement_method));
    json_object_set_new(o, "schedule", json_string(cdp_schedule_name(l->schedule)));
    json_object_set_new(o, "chunks", json_integer(l->chunks));
    json_object_set_new(o, "micro_batches", json_integer(l->micro_batches));
    json_object_set_new(o, "replicas", json_integer(l->replicas));
    json_object_set_new(o, "costs", in->costs ? json_string(in->costs) : json_string("analytic"));
    for (int s = 0; s < l->stages; s++) {
        json_t *js = json_object(), *ch = json_array();
        for (int c = 0; c < l->chunks; c++) {
            const int k = cdp_schedule_vstage(l->schedule, l->stages, l->chunks, s, c);
            json_array_append_new(ch, json_pack("[I,I]", (json_int_t)l->ranges[k][0], (json_int_t)l->ranges[k][1]));
        }
        json_object_set_new(js, "index", json_integer(s));
        if (l->chunks == 1) json_object_set(js, "layers", json_array_get(ch, 0));
        json_object_set_new(js, "chunks", ch);
        json_object_set_new(js, "fwd_s", json_real(in->r->stage[s].fwd_s));
        json_object_set_new(js, "bwd_s", json_real(in->r->stage[s].bwd_s));
        json_object_set_new(js, "memory_bytes", json_real(in->r->stage[s].memory_bytes));
        json_array_append_new(stages, js);
    }
    json_object_set_new(o, "stages", stages);
    for (int i = 0; i < l->n_ranks; i++) {
        const int j = sim_index(l, i);
        json_t *e = json_array_get(pl, (size_t)i);
        json_object_set_new(e, "busy_s", json_real(res->busy_s[j]));
        json_object_set_new(e, "in_flight", json_integer(res->peak_in_flight[j]));
        json_array_append_new(mem, json_real((double)l->rank[i].memory.device));
    }
    json_object_set_new(o, "placement", pl);
    json_object_set_new(pr, "step_s", json_real(res->step_s));
    json_object_set_new(pr, "phase_s", json_real(res->phase_s));
    json_object_set_new(pr, "bubble", json_real(res->bubble));
    json_object_set_new(pr, "bubble_closed_form",
                        json_real(cdp_sim_bubble_closed_form_kind(l->schedule, l->stages, l->chunks, l->micro_batches)));
    json_object_set_new(pr, "samples_per_s", json_real(res->samples_per_s));
    json_object_set_new(pr, "peak_memory_bytes", mem);
    json_object_set_new(o, "predicted", pr);
    for (int q = 0; q < res->n_links; q++)
        json_array_append_new(links, json_pack("{s:i,s:i,s:f,s:f}", "src", res->links[q].src, "dst",
                                               res->links[q].dst, "bytes", res->links[q].bytes, "busy_s",
                                               res->links[q].busy_s));
    json_object_set_new(o, "links", links);
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    json_decref(o);
    if (!text) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    puts(text);
    free(text);
    return CDP_OK;
}

int cdp_cli_simulate(const struct cdp_plan *plan, const struct cdp_sim_in *in_, int json, const char *trace,
                     const char *timeline)
{
    struct cdp_sim_in in = *in_;
    struct cdp_sim_result *res = NULL;
    cdp_status st = cdp_planner_simulate(plan, in.t, in.table, in.r->layout, &res);
    in.res = res;
    if (!st && (trace || timeline)) {
        struct cdp_trace *tr = NULL;
        if (!(st = cdp_sim_trace(res, in.r->layout->n_ranks, &tr)) && !(st = cdp_trace_set_layout(tr, in.r->layout))) {
            if (trace) st = cdp_trace_write_chrome(tr, trace);
            if (!st && timeline) st = cdp_trace_write_svg(tr, 1, timeline);
        }
        cdp_trace_destroy(tr);
    }
    if (!st) {
        if (json) st = print_json(plan, &in);
        else print_text(plan, &in);
    }
    /* as training says it; beside --json on stderr, so stdout stays one JSON document */
    FILE *said = json ? stderr : stdout;
    if (!st && trace) fprintf(said, "trace written to %s\n", trace);
    if (!st && timeline) fprintf(said, "timeline written to %s\n", timeline);
    cdp_sim_result_free(res);
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
