/* The planner's search context (planner_internal.h): the plan's units, their
 * costs and memory terms per recompute mode, the link matrices and the memory
 * caps, built once per search. */
#include "partitioner/planner.h"
#include "partitioner/planner_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "core/hash.h"
#include "model/layers.h"
#include "model/model.h"
#include "model/optim.h"
#include "partitioner/host.h"
#include "partitioner/partition.h"
#include "partitioner/placement.h"
#include "pipeline/balance.h"
#include "pipeline/schedule.h"
#include "plan/schedule_kind.h"

static void links_of(const struct cdp_topology *t, double *bw, double *lat)
{
    const int nd = t->n_gpus;
    for (int a = 0; a < nd; a++)
        for (int b = 0; b < nd; b++) {
            struct cdp_topology_link l;
            bw[a * nd + b] = 0;
            lat[a * nd + b] = 0;
            if (a == b || cdp_topology_link(t, a, b, &l)) continue;
            bw[a * nd + b] = l.bandwidth;
            lat[a * nd + b] = l.latency;
        }
}

/* With tensor groups of tp the simulator sees a group as its first device
 * (a leader), and what travels between two groups (a pipeline's activations,
 * a data-parallel ring's gradients, the tied embedding's) runs over the tp
 * member pairs k -> k in parallel: the link between two leaders is the
 * slowest of those pairs (the least bandwidth, the largest latency), as the
 * placement search sees a group's links (placement.h). Leaders are the
 * groups' first devices and, for an explicit placement, the devices it
 * names; pairs of devices closer than tp (a group's own ring) keep their
 * link. */
static cdp_status group_links(struct ctx *c, const struct cdp_topology *t)
{
    const int nd = c->nd, tp = c->tp;
    const struct cdp_parallel_desc *pd = &c->plan->parallel;
    char *is = calloc((size_t)nd, 1);
    int *lead = malloc((size_t)nd * sizeof *lead), n = 0;
    if (!is || !lead) {
        free(is);
        free(lead);
        return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
    }
    for (int g = 0; g < c->n_groups; g++) is[c->leader[g]] = 1;
    if (pd->placement == CDP_PLACEMENT_EXPLICIT)
        for (int64_t i = 0; i < pd->stages * pd->replicas; i++)
            if (pd->placement_map[i] >= 0 && pd->placement_map[i] + tp <= nd) is[pd->placement_map[i]] = 1;
    for (int d = 0; d < nd; d++)
        if (is[d]) lead[n++] = d;
    cdp_status st = CDP_OK;
    for (int i = 0; i < n && !st; i++)
        for (int j = 0; j < n; j++) {
            const int a = lead[i], b = lead[j];
            struct cdp_topology_link l;
            if (abs(a - b) < tp) continue;
            if ((st = cdp_topology_group_link(t, a, b, tp, &l))) break;
            c->bw[a * nd + b] = l.bandwidth;
            c->lat[a * nd + b] = l.latency;
        }
    free(is);
    free(lead);
    return st ? cdp_error_context(st, "planner: the link between tensor groups") : CDP_OK;
}

/* REDUCE_TIED_GRADS payload of a GPT with tied embeddings. */
static double tied_bytes_of(const struct cdp_plan *plan, const struct cdp_unit *u, int n)
{
    double b = 0;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < u[i].n_params; k++)
            if (u[i].params[k].tied_unit >= 0) b += (double)u[i].params[k].numel * cdp_cost_grad_bytes_per_param(plan);
    return b;
}

/* The schedule of the candidate being evaluated, and its chunks per rank
 * (chunks: interleaved's; zbv runs two, the others one). */
void cdp_planner_set_kind(struct ctx *c, enum cdp_schedule_kind kind, int chunks)
{
    c->kind = kind;
    c->v = cdp_schedule_chunks_of(kind, chunks);
}

/* Everything a search context allocates. */
void cdp_planner_ctx_free(struct ctx *c)
{
    cdp_schedule_free(c->sched);
    cdp_schedule_free(c->lin_sched[0]);
    cdp_schedule_free(c->lin_sched[1]);
    free(c->vs);
    free(c->keys);
    free(c->key_val);
    free(c->key_hash);
    free(c->lbw);
    free(c->llat);
    free(c->rdev);
    free(c->leader);
    for (int r = 0; r < CDP_RECOMPUTE_COUNT; r++) {
        free(c->mode[r].u);
        free(c->mode[r].cost);
        cdp_planner_mem_index_free(&c->mode[r].mi);
    }
    free(c->bw);
    free(c->lat);
    free(c->node);
    free(c->slots);
    for (int i = 0; i < c->n_memo; i++) free(c->memo[i].device);
}

/* Makes recompute mode r's units, costs and memory the current ones. */
void cdp_planner_use_mode(struct ctx *c, enum cdp_recompute r)
{
    c->rc = r;
    c->u = c->mode[r].u;
    c->cost = c->mode[r].cost;
    c->mi = &c->mode[r].mi;
}

/* ZeRO stages the search tries for a shape of R replicas: the plan's, or under
 * "auto" 0, 1, then 2 (with replicas to shard over; 2 only where every
 * replica runs the same micro-batches: its reduction after each backward is
 * a collective of the stage's replicas). */
int cdp_planner_zeros_of(const struct cdp_plan *plan, int R, int *out)
{
    const int64_t z = plan->parallel.zero;
    out[0] = R > 1 && (z == 1 || z == 2) ? (int)z : 0;
    if (z != CDP_AUTO || R < 2) return 1;
    out[1] = 1;
    if (!cdp_plan_zero2_allowed(plan, NULL, 0)) return 2;
    out[2] = 2;
    return 3;
}

/* The recompute modes the search tries for each shape, least first: the plan's,
 * or under "auto" every one. */
int cdp_planner_modes_of(const struct cdp_plan *plan, enum cdp_recompute *out)
{
    if (!plan->train.recompute_auto) {
        out[0] = plan->train.recompute;
        return 1;
    }
    for (int r = 0; r < CDP_RECOMPUTE_COUNT; r++) out[r] = (enum cdp_recompute)r;
    return CDP_RECOMPUTE_COUNT;
}

/* Units, costs at device 0's rate, links and memory terms for plan on t. */
static cdp_status tensor_groups(struct ctx *c, const struct cdp_plan *plan, const struct cdp_topology *t);

static cdp_status ctx_init_modes(struct ctx *c, const struct cdp_plan *plan, const struct cdp_topology *t,
                                 const struct cdp_cost_table *costs, const enum cdp_recompute *modes, int n_modes)
{
    memset(c, 0, sizeof *c);
    c->plan = plan;
    c->t = t;
    c->nd = t->n_gpus;
    c->kind = plan->parallel.schedule;
    c->v = cdp_schedule_chunks_of(plan->parallel.schedule, (int)plan->parallel.chunks);
    c->hv = cdp_backend_host_visible(plan->cluster.backend);
    const struct cdp_device_rate rate = cdp_device_rate_of(t, 0, plan->train.precision);
    cdp_status st = tensor_groups(c, plan, t);
    /* a rank of a tensor group: the group's ring for its collectives */
    const int tp = c->tp;
    double tp_bw = 0, tp_lat = 0;
    if (tp > 1) cdp_planner_tensor_links(t, tp, &tp_bw, &tp_lat);
    /* a rank's units: with tensor groups, its slices of the split layers and blocks (every index's
     * are alike); a GPT-family unit whose type does not run on a tensor group, estimated
     * (cdp_planner_tensor_units) */
    for (int i = 0; i < n_modes && !st; i++) {
        const enum cdp_recompute r = modes[i];
        if ((st = cdp_units_build_tensor(&plan->model, tp, 0, &c->mode[r].u, &c->n))) return st;
        for (int k = 0; k < c->n; k++) cdp_unit_set_recompute(&c->mode[r].u[k], r);
        cdp_cost_fit_units(plan, c->mode[r].u, c->n);
        cdp_planner_tensor_units(plan, tp, c->mode[r].u, c->n);
        if (!(c->mode[r].cost = calloc((size_t)c->n, sizeof *c->mode[r].cost)))
            return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
        cdp_cost_analytic(plan, c->mode[r].u, c->n, &rate, c->mode[r].cost);
        if (costs) cdp_cost_apply(costs, c->mode[r].u, c->n, c->mode[r].cost);
        if (costs) cdp_planner_tensor_measured(tp, costs->tensor, c->mode[r].u, c->n, c->mode[r].cost);
        cdp_cost_add_recompute(c->mode[r].u, c->n, c->mode[r].cost);
        cdp_planner_tensor_costs(plan, tp, tp_bw, tp_lat, c->mode[r].u, c->n, c->mode[r].cost);
        st = cdp_planner_mem_index_build(&c->mode[r].mi, plan, c->mode[r].u, c->n);
    }
    if (st) return st;
    cdp_planner_use_mode(c, modes[0]);
    c->bw = malloc((size_t)c->nd * c->nd * sizeof *c->bw);
    c->lat = malloc((size_t)c->nd * c->nd * sizeof *c->lat);
    c->rdev = malloc((size_t)c->nd * sizeof *c->rdev);
    c->node = malloc((size_t)c->nd * sizeof *c->node);
    if (!c->bw || !c->lat || !c->rdev || !c->node) return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
    links_of(t, c->bw, c->lat);
    if (tp > 1 && (st = group_links(c, t))) return st;
    for (int d = 0; d < c->nd; d++) c->node[d] = t->gpus[d].node;
    c->tied_bytes = cdp_planner_tied_model(plan) ? tied_bytes_of(plan, c->u, c->n) : 0;
    uint64_t cap = 0;
    for (int d = 0; d < c->nd; d++) {
        const uint64_t x = cdp_planner_device_cap(plan, t, d);
        if (x && (!cap || x < cap)) cap = x;
    }
    c->cap = (double)cap;
    /* a unit's scratch is the same in every stage, mode and shape: one too
     * large for the largest device ends the search before it starts (it took
     * minutes to find no fit among 1,000 units' splits) */
    uint64_t largest = 0;
    char from[160];
    for (int d = 0; d < c->nd; d++)
        if (cdp_planner_device_cap(plan, t, d) > largest) largest = cdp_planner_device_cap(plan, t, d);
    for (int nd = 0; c->hv && nd < t->n_nodes; nd++) {
        const double x = cdp_planner_node_capacity(plan, t, nd, from, sizeof from); /* may read /proc/meminfo */
        if (x > (double)largest) largest = (uint64_t)x;
    }
    for (int i = 0; largest && i < c->n; i++)
        if (c->mi->ub[i].scratch_bytes > largest) {
            char a[32], b[32];
            return cdp_fail(CDP_ERR_INVALID, "%s: planner: unit %d (%s) alone needs %s of scratch for a micro-batch "
                            "of %lld, more than the largest %s has (%s); no layout fits (a smaller "
                            "/train/micro_batch or /model/context would)", plan->source, i,
                            cdp_layer_name(c->u[i].desc.type), cdp_format_bytes(c->mi->ub[i].scratch_bytes, a, sizeof a),
                            (long long)plan->train.micro_batch, c->hv ? "node" : "device",
                            cdp_format_bytes(largest, b, sizeof b));
        }
    return CDP_OK;
}

/* The tensor groups of t: on each node, its devices in order, cut into runs
 * of t (a node's last devices that make no whole group stay idle). The ranks
 * of a group are then consecutive (ranks follow devices, node by node), as
 * Megatron-LM's tensor-fastest order has them. */
static cdp_status tensor_groups(struct ctx *c, const struct cdp_plan *plan, const struct cdp_topology *t)
{
    /* "auto": t = 1 until the planner searches t (the search replaces this line) */
    c->tp = plan->parallel.tensor == CDP_AUTO ? 1 : (int)plan->parallel.tensor;
    c->n_groups = 0;
    if (!(c->leader = malloc((size_t)(c->nd ? c->nd : 1) * sizeof *c->leader)))
        return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
    for (int d = 0; d + c->tp <= c->nd;) {
        int k = 1;
        while (k < c->tp && t->gpus[d + k].node == t->gpus[d].node) k++;
        if (k == c->tp) c->leader[c->n_groups++] = d;
        d += k;
    }
    const struct cdp_parallel_desc *pd = &plan->parallel;
    if (c->tp > 1 && pd->placement == CDP_PLACEMENT_EXPLICIT)
        for (int64_t i = 0; i < pd->stages * pd->replicas; i++) {
            const int64_t d = pd->placement_map[i];
            int ok = d >= 0 && d + c->tp <= c->nd;
            for (int k = 1; ok && k < c->tp; k++) ok = t->gpus[d + k].node == t->gpus[d].node;
            if (!ok)
                return cdp_fail(CDP_ERR_INVALID, "%s: /parallel/placement/%lld/%lld: device %lld starts a tensor "
                                "group of /parallel/tensor %d devices, but devices %lld to %lld are not all on one "
                                "node of %s", plan->source, (long long)(i / pd->replicas),
                                (long long)(i % pd->replicas), (long long)d, c->tp, (long long)d,
                                (long long)(d + c->tp - 1), t->name);
        }
    if (c->tp > 1 && c->n_groups == 0)
        return cdp_fail(CDP_ERR_INVALID, "%s: /parallel/tensor: %d, but no node of the topology %s has %d devices "
                        "for a tensor group (a group is t devices of one node)", plan->source, c->tp, t->name,
                        c->tp);
    return CDP_OK;
}

/* The context of a search: every mode the plan allows. */
cdp_status cdp_planner_ctx_init(struct ctx *c, const struct cdp_plan *plan, const struct cdp_topology *t,
                                const struct cdp_cost_table *costs)
{
    enum cdp_recompute modes[CDP_RECOMPUTE_COUNT];
    const int n = cdp_planner_modes_of(plan, modes);
    return ctx_init_modes(c, plan, t, costs, modes, n);
}

/* The context of one layout, in its recompute mode. */
cdp_status cdp_planner_ctx_init_for(struct ctx *c, const struct cdp_plan *plan, const struct cdp_topology *t,
                                    const struct cdp_cost_table *costs, enum cdp_recompute r)
{
    return ctx_init_modes(c, plan, t, costs, &r, 1);
}
