/* What the planner's answer becomes (planner.h): the plan with its choices
 * applied, the table --dry-run prints, the brief layout a training run
 * prints, and the JSON of --dry-run --json. */
#include "partitioner/planner.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "pipeline/schedule.h"

/* ---- output ---------------------------------------------------------------------- */

void cdp_planner_apply_sequence_parallel(const struct cdp_planner_result *r, struct cdp_plan *plan)
{
    plan->parallel.sequence_parallel = r->sequence_parallel;
    plan->parallel.sequence_parallel_auto = 0;
    plan->model.seq_parallel = r->sequence_parallel;
}

cdp_status cdp_planner_apply(const struct cdp_planner_result *r, struct cdp_plan *plan)
{
    struct cdp_parallel_desc *pd = &plan->parallel;
    const struct cdp_layout *l = r->layout;
    const int N = l->n_ranks, nv = l->stages * l->chunks;
    if (!pd->partition || pd->n_partition != nv) {
        int64_t(*ranges)[2] = malloc((size_t)nv * sizeof *ranges);
        if (!ranges) return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
        memcpy(ranges, l->ranges, (size_t)nv * sizeof *ranges);
        free(pd->partition);
        pd->partition = ranges;
        pd->n_partition = nv;
    }
    if (pd->placement == CDP_PLACEMENT_TOPOLOGY) {
        int64_t *map = malloc((size_t)N * sizeof *map);
        if (!map) return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
        for (int i = 0; i < N; i++) /* a tensor group by its first device */
            if (l->rank[i].tensor == 0) map[l->rank[i].stage * l->replicas + l->rank[i].replica] = l->rank[i].device;
        free(pd->placement_map);
        pd->placement_map = map;
        pd->placement = CDP_PLACEMENT_EXPLICIT;
    }
    int equal = 1;
    for (int i = 1; i < l->replicas; i++) equal &= l->shares[i] == l->shares[0];
    if (pd->balance == CDP_BALANCE_SPEED && !equal) {
        int64_t *sh = malloc((size_t)l->replicas * sizeof *sh);
        if (!sh) return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
        memcpy(sh, l->shares, (size_t)l->replicas * sizeof *sh);
        free(pd->shares);
        pd->shares = sh;
        pd->n_shares = l->replicas;
        pd->balance = CDP_BALANCE_EXPLICIT;
    }
    pd->stages = l->stages;
    pd->schedule = l->schedule;
    pd->chunks = l->chunks; /* zbv, chosen by "auto", runs two */
    pd->schedule_auto = 0;
    plan->train.recompute = l->recompute;
    pd->zero = l->zero;
    plan->train.recompute_auto = 0;
    pd->replicas = l->replicas;
    pd->tensor = l->tensor;
    cdp_planner_apply_sequence_parallel(r, plan);
    pd->micro_batches = l->micro_batches;
    plan->train.global_batch = (int64_t)l->replicas * l->micro_batches * l->micro_batch;
    return CDP_OK;
}

static void units_of(const struct cdp_layout *l, int s, char *buf, size_t cap)
{
    size_t o = 0;
    buf[0] = '\0';
    for (int ch = 0; ch < l->chunks && o < cap; ch++) {
        const int k = cdp_schedule_vstage(l->schedule, l->stages, l->chunks, s, ch);
        o += (size_t)snprintf(buf + o, cap - o, "%s[%lld,%lld)", ch == 0 ? "" : " ", (long long)l->ranges[k][0],
                              (long long)l->ranges[k][1]);
    }
}

static void balance_print(const struct cdp_planner_result *r, FILE *f)
{
    const struct cdp_planner_balance *b = &r->balance;
    const int R = r->layout->replicas;
    fprintf(f, "\nPlan: balance (%s)\n", b->kind == CDP_BALANCE_UNIFORM    ? "uniform, from the plan"
                                          : b->kind == CDP_BALANCE_EXPLICIT ? "shares from the plan"
                                                                            : "speed: shares by predicted speed");
    fprintf(f, "  replica  devices                          ms/micro-batch  micro-batches\n");
    const int show = R > 64 ? 32 : R;
    for (int q = 0; q < show; q++)
        fprintf(f, "  %7d  %-32s %14.3f  %13lld\n", q, b->devices[q], b->t_s[q] * 1e3, (long long)b->shares[q]);
    if (show < R) fprintf(f, "  ... %d more replicas (--json lists them all)\n", R - show);
    if (!r->predicted_ok) return;
    fprintf(f, "  step        %.3f ms with these shares, %.3f ms with %d each: %+.1f%%\n", b->step_s * 1e3,
            b->uniform_step_s * 1e3, r->layout->micro_batches, 100 * b->gain);
    char fill[32] = "shares";
    if (r->layout->stages > 1) snprintf(fill, sizeof fill, "(shares + %d)", r->layout->stages - 1);
    fprintf(f, "              (max over replicas of %s x ms/micro-batch, + %.3f ms all-reduce and optimizer "
               "simulated)\n", fill, b->rest_s * 1e3);
}

static void mib(double bytes, char *buf, size_t cap) { cdp_format_bytes(bytes > 0 ? (uint64_t)bytes : 0, buf, cap); }

void cdp_planner_print(const struct cdp_planner_result *r, FILE *f)
{
    const struct cdp_layout *l = r->layout;
    const int N = l->n_ranks;
    if (l->tensor > 1)
        fprintf(f, "\nPlan (on %s, %d tensor groups of %d devices usable)\n", l->topology, r->world, l->tensor);
    else
        fprintf(f, "\nPlan (on %s, %d devices usable)\n", l->topology, r->world);
    fprintf(f, "  shape       %d stage%s x %d replica%s", l->stages, l->stages == 1 ? "" : "s", l->replicas,
            l->replicas == 1 ? "" : "s");
    if (l->tensor > 1) fprintf(f, " x tensor %d%s", l->tensor, r->sequence_parallel ? " sequence parallel" : "");
    fprintf(f, ", %d micro-batches of %d, %s", l->micro_batches, l->micro_batch, cdp_schedule_name(l->schedule));
    if (l->chunks > 1) fprintf(f, " x %d chunks", l->chunks);
    fprintf(f, ", global batch %lld\n", (long long)l->replicas * l->micro_batches * l->micro_batch);
    if (l->stages * l->replicas < r->world) {
        fprintf(f, "  idle        %d of %d %s unused: ", r->world - l->stages * l->replicas, r->world,
                l->tensor > 1 ? "tensor groups" : "devices");
        if (r->more.stages)
            fprintf(f, "the best shape simulated that uses more, %d stage%s x %d replica%s with %d micro-batches, is "
                       "predicted %.4g samples/s (fixed placement) against %.4g\n", r->more.stages,
                    r->more.stages == 1 ? "" : "s", r->more.replicas, r->more.replicas == 1 ? "" : "s",
                    r->more.micro_batches, r->more.samples_per_s, r->predicted.samples_per_s);
        else
            fprintf(f, "no shape using more fits device memory with replicas dividing the step's micro-batches "
                       "and at least one unit per stage, or its bound is below this plan's\n");
    }
    fprintf(f, "  recompute   %s%s\n", cdp_recompute_name(l->recompute),
            l->recompute == CDP_RECOMPUTE_NONE        ? " (every activation kept)"
            : l->recompute == CDP_RECOMPUTE_SELECTIVE ? " (attention, norm and GELU outputs computed again)"
                                                      : " (each unit's forward run again before its backward)");
    if (l->replicas > 1)
        fprintf(f, "  zero        %d%s\n", l->zero,
                l->zero == 2 ? " (each replica keeps its shard of its stage's reduced gradients and optimizer "
                               "state, and steps it)"
                : l->zero    ? " (each replica keeps and steps its shard of its stage's optimizer state)"
                             : " (every replica keeps all of its stage's optimizer state)");
    fprintf(f, "\nPlan: partition (per micro-batch; memory: the most a rank of the stage allocates)\n"
               "  stage  units            fwd ms   bwd ms       memory     headroom\n");
    for (int s = 0; s < l->stages; s++) {
        char units[128], head[32] = "unlimited", mem[32];
        units_of(l, s, units, sizeof units);
        const struct cdp_planner_stage *ps = &r->stage[s];
        mib(ps->memory_bytes, mem, sizeof mem);
        if (ps->capacity_bytes > 0) mib(ps->capacity_bytes - ps->memory_bytes, head, sizeof head);
        fprintf(f, "  %5d  %-15s %8.3f %8.3f %12s %12s\n", s, units, ps->fwd_s * 1e3, ps->bwd_s * 1e3, mem, head);
    }
    /* the tensor column only where there are tensor groups */
    fprintf(f, "\nPlan: placement (%s)\n  rank  node  gpu  device  stage  replica  %scpus         memory\n",
            r->placement_method, l->tensor > 1 ? "tensor  " : "");
    const int show = N > 64 ? 32 : N;
    for (int i = 0; i < show; i++) {
        const struct cdp_layout_rank *k = &l->rank[i];
        char mem[32];
        mib((double)k->memory.device, mem, sizeof mem);
        char tc[16] = "";
        if (l->tensor > 1) snprintf(tc, sizeof tc, "%6d  ", k->tensor);
        fprintf(f, "  %4d  %4d  %3d  %6d  %5d  %7d  %s%-11s  %s\n", i, k->node, k->gpu, k->device, k->stage,
                k->replica, tc, k->cpuset[0] ? k->cpuset : "-", mem);
    }
    if (show < N) fprintf(f, "  ... %d more ranks (--json lists them all)\n", N - show);
    fprintf(f, "\nPlan: host memory\n  node  ranks        bytes     capacity  from\n");
    for (int n = 0; n < l->n_nodes; n++) {
        int ranks = 0;
        for (int i = 0; i < N; i++) ranks += l->rank[i].node == n;
        if (!ranks) continue;
        char a[32], b[32] = "unknown";
        mib(r->node[n].bytes, a, sizeof a);
        if (r->node[n].capacity_bytes > 0) mib(r->node[n].capacity_bytes, b, sizeof b);
        fprintf(f, "  %4d  %5d  %11s  %11s  %s\n", n, ranks, a, b, r->node[n].capacity_from);
    }
    if (r->predicted_ok) {
        fprintf(f, "\nPlan: predicted\n");
        fprintf(f, "  step time   %.3f ms\n", r->predicted.step_s * 1e3);
        fprintf(f, "  throughput  %.1f samples/s\n", r->predicted.samples_per_s);
        fprintf(f, "  bubble      %.2f%%\n", 100 * r->predicted.bubble);
    }
    if (l->replicas > 1 && r->balance.shares) balance_print(r, f);
    if (r->predicted_ok) {
        fprintf(f, "\nPlan: baselines (same shape and partition)\n  order              step ms    samples/s   vs chosen\n");
        for (int i = 0; i < 2; i++)
            fprintf(f, "  %-17s %9.3f %12.1f   %+.1f%%\n", r->baseline[i].name, r->baseline[i].pred.step_s * 1e3,
                    r->baseline[i].pred.samples_per_s, 100 * (r->baseline[i].pred.step_s / r->predicted.step_s - 1));
    }
    if (r->n_tensor_alt) {
        fprintf(f, "\nPlan: tensor parallelism (/parallel/tensor or /parallel/sequence_parallel \"auto\"; each t, "
                   "with and without sequence parallelism where tried, planned as fixed, the fastest kept)\n"
                   "  t  seq  stages  replicas  micro-batches  schedule        recompute    step ms   samples/s  "
                   "bubble\n");
        for (int i = 0; i < r->n_tensor_alt; i++) {
            const struct cdp_planner_tensor_alt *a = &r->tensor_alt[i];
            const char *seq = a->tensor < 2 ? "-" : a->sequence_parallel ? "on" : "off";
            if (!a->ok) {
                fprintf(f, "  %-2d %-4s %s\n", a->tensor, seq, a->why);
                continue;
            }
            char sched[32];
            if (a->chunks > 1) snprintf(sched, sizeof sched, "%s x %d", cdp_schedule_name(a->schedule), a->chunks);
            else snprintf(sched, sizeof sched, "%s", cdp_schedule_name(a->schedule));
            const int chosen = a->tensor == l->tensor && a->sequence_parallel == r->sequence_parallel;
            fprintf(f, "  %-2d %-4s %6d %9d %14d  %-14s  %-9s %10.3f %11.1f  %5.1f%%%s\n", a->tensor, seq, a->stages,
                    a->replicas, a->micro_batches, sched, cdp_recompute_name(a->recompute), a->step_s * 1e3,
                    a->samples_per_s, 100 * a->bubble,
                    chosen        ? "  <- chosen"
                    : a->bounded ? "  (only shapes whose bound beat a plan above simulated)"
                                 : "");
        }
        if (r->tensor_why[0]) fprintf(f, "  not tried: %s\n", r->tensor_why);
    }
    if (r->checked == r->shapes) {
        fprintf(f, "\nPlan: searched %lld shapes (%lld fit", (long long)r->shapes, (long long)r->feasible);
        if (r->pruned) fprintf(f, "; %lld of them not simulated: their bound could not win", (long long)r->pruned);
    } else {
        fprintf(f, "\nPlan: searched %lld shapes (memory checked for %lld, %lld of them fit; %lld not simulated: "
                "their bound could not win", (long long)r->shapes, (long long)r->checked, (long long)r->feasible,
                (long long)r->pruned);
    }
    fprintf(f, "), %lld placed, %lld simulations", (long long)r->placed_shapes, (long long)r->simulations);
    if (r->replica_simulations)
        fprintf(f, " + %lld of one replica (large world: docs/planner.md)", (long long)r->replica_simulations);
    fprintf(f, " in %.3f s\n", r->search_s);
}

void cdp_planner_print_brief(const struct cdp_planner_result *r, FILE *f)
{
    const struct cdp_layout *l = r->layout;
    const int N = l->n_ranks;
    fprintf(f, "plan: %d stage%s x %d replica%s", l->stages, l->stages == 1 ? "" : "s", l->replicas,
            l->replicas == 1 ? "" : "s");
    if (l->tensor > 1) fprintf(f, " x tensor %d%s", l->tensor, r->sequence_parallel ? " sequence parallel" : "");
    fprintf(f, ", %d micro-batches of %d, %s", l->micro_batches, l->micro_batch, cdp_schedule_name(l->schedule));
    if (l->chunks > 1) fprintf(f, " x %d chunks", l->chunks);
    if (l->recompute != CDP_RECOMPUTE_NONE) fprintf(f, ", recompute %s", cdp_recompute_name(l->recompute));
    if (l->zero) fprintf(f, ", zero %d", l->zero);
    fprintf(f, " on %s (planned in %.3f s)\n", l->topology, r->search_s);
    fprintf(f, "  stage  units            fwd ms   bwd ms       memory\n");
    for (int s = 0; s < l->stages && s < 16; s++) {
        char units[128], mem[32];
        units_of(l, s, units, sizeof units);
        mib(r->stage[s].memory_bytes, mem, sizeof mem);
        fprintf(f, "  %5d  %-15s %8.3f %8.3f %12s\n", s, units, r->stage[s].fwd_s * 1e3, r->stage[s].bwd_s * 1e3, mem);
    }
    if (l->stages > 16) fprintf(f, "  ... %d more stages (--dry-run lists them all)\n", l->stages - 16);
    fprintf(f, "  rank  node  device  gpu  stage  replica  %scpus         memory\n", l->tensor > 1 ? "tensor  " : "");
    for (int i = 0; i < N && i < 16; i++) {
        const struct cdp_layout_rank *k = &l->rank[i];
        char mem[32];
        mib((double)k->memory.device, mem, sizeof mem);
        char tc[16] = "";
        if (l->tensor > 1) snprintf(tc, sizeof tc, "%6d  ", k->tensor);
        fprintf(f, "  %4d  %4d  %6d  %3d  %5d  %7d  %s%-11s  %s\n", i, k->node, k->device, k->gpu, k->stage,
                k->replica, tc, k->cpuset[0] ? k->cpuset : "-", mem);
    }
    if (N > 16) fprintf(f, "  ... %d more ranks (--dry-run lists them all)\n", N - 16);
    if (r->predicted_ok)
        fprintf(f, "  predicted: %.3f ms per step, bubble %.1f%%\n", r->predicted.step_s * 1e3, 100 * r->predicted.bubble);
    /* the fullest node stands for the others */
    int full = l->rank[0].node, used = 0;
    for (int n = 0; n < l->n_nodes; n++) {
        int ranks = 0;
        for (int i = 0; i < N; i++) ranks += l->rank[i].node == n;
        used += ranks > 0;
        if (ranks && r->node[n].bytes > r->node[full].bytes) full = n;
    }
    int ranks = 0;
    for (int i = 0; i < N; i++) ranks += l->rank[i].node == full;
    char a[32], b[32] = "unknown";
    mib(r->node[full].bytes, a, sizeof a);
    if (r->node[full].capacity_bytes > 0) mib(r->node[full].capacity_bytes, b, sizeof b);
    fprintf(f, "  host memory of node %d%s: %s for %d rank%s, of %s (%s)\n", full,
            used > 1 ? " (the fullest)" : "", a, ranks, ranks == 1 ? "" : "s", b, r->node[full].capacity_from);
}

static json_t *pred_json(const struct cdp_planner_prediction *p)
{
    return json_pack("{s:f,s:f,s:f}", "step_s", p->step_s, "bubble", p->bubble, "samples_per_s", p->samples_per_s);
}

json_t *cdp_planner_to_json(const struct cdp_planner_result *r)
{
    const struct cdp_layout *l = r->layout;
    json_t *o = json_object(), *stages = json_array(), *mem = json_array(), *base = json_object(),
           *host = json_array();
    for (int s = 0; s < l->stages; s++) {
        json_t *ch = json_array();
        for (int c = 0; c < l->chunks; c++) {
            const int k = cdp_schedule_vstage(l->schedule, l->stages, l->chunks, s, c);
            json_array_append_new(ch, json_pack("[I,I]", (json_int_t)l->ranges[k][0], (json_int_t)l->ranges[k][1]));
        }
        json_t *js = json_pack("{s:i}", "index", s);
        if (l->chunks == 1) json_object_set(js, "layers", json_array_get(ch, 0));
        else json_object_set(js, "chunks", ch);
        json_decref(ch);
        json_object_set_new(js, "fwd_s", json_real(r->stage[s].fwd_s));
        json_object_set_new(js, "bwd_s", json_real(r->stage[s].bwd_s));
        json_object_set_new(js, "memory_bytes", json_real(r->stage[s].memory_bytes));
        json_object_set_new(js, "headroom_bytes", r->stage[s].capacity_bytes > 0
                                                       ? json_real(r->stage[s].capacity_bytes - r->stage[s].memory_bytes)
                                                       : json_null());
        json_array_append_new(stages, js);
    }
    for (int i = 0; i < l->n_ranks; i++) json_array_append_new(mem, json_real((double)l->rank[i].memory.device));
    for (int n = 0; n < l->n_nodes; n++) {
        int ranks = 0;
        for (int i = 0; i < l->n_ranks; i++) ranks += l->rank[i].node == n;
        if (ranks)
            /* not the capacity: what a host has free changes from run to run */
            json_array_append_new(host, json_pack("{s:i,s:i,s:f}", "node", n, "ranks", ranks, "bytes",
                                                  r->node[n].bytes));
    }
    json_object_set_new(o, "topology", json_string(l->topology));
    json_object_set_new(o, "recompute", json_string(cdp_recompute_name(l->recompute)));
    json_object_set_new(o, "zero", json_integer(l->zero));
    json_object_set_new(o, "stages", stages);
    json_object_set_new(o, "placement", cdp_layout_ranks_json(l));
    json_object_set_new(o, "host", host);
    if (r->n_tensor_alt) { /* the search over t ("tensor": "auto"; a plan with t fixed has none) */
        json_t *ts = json_array();
        for (int i = 0; i < r->n_tensor_alt; i++) {
            const struct cdp_planner_tensor_alt *a = &r->tensor_alt[i];
            json_t *x = json_pack("{s:i,s:b,s:b}", "tensor", a->tensor, "sequence_parallel", a->sequence_parallel,
                                  "chosen", a->ok && a->tensor == l->tensor &&
                                                a->sequence_parallel == r->sequence_parallel);
            if (a->ok) {
                json_object_set_new(x, "stages", json_integer(a->stages));
                json_object_set_new(x, "replicas", json_integer(a->replicas));
                json_object_set_new(x, "micro_batches", json_integer(a->micro_batches));
                json_object_set_new(x, "schedule", json_string(cdp_schedule_name(a->schedule)));
                json_object_set_new(x, "chunks", json_integer(a->chunks));
                json_object_set_new(x, "peak_memory_bytes", json_real(a->peak_bytes));
                json_object_set_new(x, "recompute", json_string(cdp_recompute_name(a->recompute)));
                json_object_set_new(x, "step_s", json_real(a->step_s));
                json_object_set_new(x, "samples_per_s", json_real(a->samples_per_s));
                json_object_set_new(x, "bubble", json_real(a->bubble));
                json_object_set_new(x, "bounded", json_boolean(a->bounded));
            } else {
                json_object_set_new(x, "why", json_string(a->why));
            }
            json_array_append_new(ts, x);
        }
        json_object_set_new(o, "tensor_search", json_pack("{s:o,s:s}", "tried", ts, "not_tried", r->tensor_why));
    }
    if (r->predicted_ok) {
        json_t *pr = pred_json(&r->predicted);
        json_object_set_new(pr, "peak_memory_bytes", mem);
        json_object_set_new(o, "predicted", pr);
        for (int i = 0; i < 2; i++) json_object_set_new(base, r->baseline[i].name, pred_json(&r->baseline[i].pred));
    } else {
        json_object_set_new(o, "predicted", json_pack("{s:o}", "peak_memory_bytes", mem));
    }
    if (r->balance.shares) {
        const struct cdp_planner_balance *b = &r->balance;
        json_t *sh = json_array(), *ts = json_array(), *dv = json_array();
        for (int q = 0; q < l->replicas; q++) {
            json_array_append_new(sh, json_integer((json_int_t)b->shares[q]));
            json_array_append_new(ts, json_real(b->t_s[q]));
            json_array_append_new(dv, json_string(b->devices[q]));
        }
        json_object_set_new(o, "balance", json_pack("{s:o,s:o,s:o,s:f,s:f,s:f,s:f}", "shares", sh, "devices", dv,
                                                    "t_s", ts, "step_s", b->step_s, "uniform_step_s",
                                                    b->uniform_step_s, "gain", b->gain, "rest_s", b->rest_s));
    }
    json_object_set_new(o, "baselines", base);
    return o;
}
