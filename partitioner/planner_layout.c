/* Layouts of the planner's candidates: the fixed placements, a candidate's
 * layout, the memory-aware split of its units, the CPU sets of its ranks and
 * the chosen layout with every rank's node, GPU, cap and memory. */
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

/* The device of (s, r) under the plan's fixed placement, or ordered-pp-inner. */
void cdp_planner_fixed_placement(const struct cdp_plan *plan, int p, int R, int *device)
{
    const struct cdp_parallel_desc *pd = &plan->parallel;
    if (pd->placement == CDP_PLACEMENT_EXPLICIT && pd->stages == p && pd->replicas == R)
        for (int i = 0; i < p * R; i++) device[i] = (int)pd->placement_map[i];
    else if (pd->placement == CDP_PLACEMENT_ORDERED_DP_INNER) cdp_placement_ordered_dp_inner(p, R, device);
    else cdp_placement_ordered_pp_inner(p, R, device);
}

void cdp_planner_to_leaders(const struct ctx *c, int n, int *dev)
{
    if (c->tp > 1)
        for (int i = 0; i < n; i++) dev[i] = c->leader[dev[i]];
}

/* The plan's fixed placement of the (stage, replica) groups as their first
 * devices: an explicit placement names them; the ordered ones count groups. */
void cdp_planner_fixed_groups(const struct ctx *c, int p, int R, int *device)
{
    cdp_planner_fixed_placement(c->plan, p, R, device);
    const struct cdp_parallel_desc *pd = &c->plan->parallel;
    if (!(pd->placement == CDP_PLACEMENT_EXPLICIT && pd->stages == p && pd->replicas == R))
        cdp_planner_to_leaders(c, p * R, device);
}

/* A layout of the candidate (p, R, m) with uniform shares, ranges, ranks in
 * (s, r) order on the given devices; memory not yet computed. */
cdp_status cdp_planner_candidate_layout(const struct ctx *c, int p, int R, int m, const int64_t (*ranges)[2],
                                        const int *device, struct cdp_layout **out)
{
    struct cdp_layout *l = NULL;
    cdp_status st = cdp_layout_create_tensor(p, c->v, R, c->tp, &l);
    if (st) return st;
    l->backend = c->plan->cluster.backend;
    l->schedule = c->kind;
    l->recompute = c->rc;
    l->zero = R > 1 ? c->zero : 0;
    l->micro_batches = m;
    l->micro_batch = (int)c->plan->train.micro_batch;
    l->n_nodes = c->t->n_nodes;
    l->rebalance_every = c->plan->parallel.rebalance_every;
    if (c->plan->parallel.schedule_file && !(l->schedule_file = strdup(c->plan->parallel.schedule_file))) {
        cdp_layout_free(l);
        return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
    }
    for (int r = 0; r < R; r++) l->shares[r] = m;
    if (ranges) memcpy(l->ranges, ranges, (size_t)p * c->v * sizeof *ranges);
    for (int s = 0; s < p; s++)
        for (int r = 0; r < R; r++)
            for (int x = 0; x < c->tp; x++) {
                struct cdp_layout_rank *k = &l->rank[(s * R + r) * c->tp + x];
                k->stage = s;
                k->replica = r;
                k->tensor = x;
                k->device = device ? device[s * R + r] + x : 0;
                k->node = device ? c->t->gpus[k->device].node : 0;
            }
    *out = l;
    return CDP_OK;
}

/* Splits for p stages, m micro-batches; ranges gets p*v entries. Memory: what
 * the executor allocates (cdp_planner_part_memory), within the smallest device's cap. */
cdp_status cdp_planner_split(struct ctx *c, int p, int R, int m, int objective, int64_t (*ranges)[2])
{
    const struct cdp_parallel_desc *pd = &c->plan->parallel;
    const int nv = p * c->v;
    if (pd->partition && pd->n_partition == nv) {
        memcpy(ranges, pd->partition, (size_t)nv * sizeof *ranges);
        return CDP_OK;
    }
    if (c->v > 1) {
        /* interleaved chunks are not contiguous per rank: balanced on time,
         * memory checked on the layout's memory afterwards */
        double *w = malloc((size_t)c->n * sizeof *w);
        int *owner = malloc((size_t)nv * sizeof *owner);
        if (!w || !owner) {
            free(w);
            free(owner);
            return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
        }
        for (int i = 0; i < c->n; i++) w[i] = c->cost[i].fwd_s + c->cost[i].bwd_s;
        /* each rank's chunks together are what the schedule waits on (zbv puts
         * the first and the last chunk, embedding and head, on rank 0) */
        for (int j = 0; j < nv; j++) {
            int chunk;
            cdp_schedule_vstage_place(c->kind, p, c->v, j, &owner[j], &chunk);
        }
        cdp_status st = cdp_partition_balanced_ranks(w, c->n, nv, owner, p, ranges);
        free(w);
        free(owner);
        return st;
    }
    int *inf = malloc((size_t)p * 2 * sizeof *inf); /* slots, then W-state slots */
    double *cap = malloc((size_t)p * sizeof *cap), *bw = malloc((size_t)p * sizeof *bw);
    struct cdp_partition_stage *ps = malloc((size_t)p * sizeof *ps);
    int *dev = malloc((size_t)p * sizeof *dev);
    struct cdp_layout *l = NULL;
    cdp_status st = CDP_OK;
    if (!inf || !cap || !bw || !ps || !dev) {
        st = cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
        goto done;
    }
    /* the slots each stage's chunk gets, as the executor counts them */
    int mcap;
    if ((st = cdp_planner_candidate_layout(c, p, R, m, NULL, NULL, &l)) ||
        (st = cdp_layout_slots_ex(l, 0, &mcap, inf, inf + p)))
        goto done;
    free(c->slots);
    c->slots = inf;
    c->p = p;
    c->R = R; /* cdp_planner_part_memory: the shards of ZeRO-1 */
    inf = NULL;
    /* boundary bandwidths of the first pipeline under the fixed placement */
    cdp_planner_fixed_groups(c, p, 1, dev);
    /* one value, the slowest boundary: the partition is chosen before the
     * placement, so it must not count on a fast link the placement may not give */
    bw[0] = 0;
    for (int s = 0; s < p; s++) {
        cap[s] = c->cap;
        if (s + 1 < p && dev[s] < c->nd && dev[s + 1] < c->nd) {
            const double b = c->bw[dev[s] * c->nd + dev[s + 1]];
            if (b > 0 && (bw[0] <= 0 || b < bw[0])) bw[0] = b;
        }
    }
    /* ZeRO: a unit's optimizer state (and under ZeRO-2 its gradient) is spread over the replicas */
    struct cdp_unit_cost *cost = c->cost, *sharded = NULL;
    if (c->zero && R > 1) {
        if (!(sharded = malloc((size_t)c->n * sizeof *sharded))) {
            st = cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
            goto done;
        }
        /* ZeRO-2 shards the fp32 gradients (4 bytes) too */
        const double per = cdp_cost_state_bytes_per_param(c->plan),
                     opt = (double)cdp_optimizer_state_bytes(&c->plan->train.optimizer, 1) + (c->zero >= 2 ? 4 : 0);
        for (int i = 0; i < c->n; i++) {
            sharded[i] = c->cost[i];
            sharded[i].state_bytes *= (per - opt + opt / R) / per;
        }
        cost = sharded;
    }
    struct cdp_partition_spec sp = {.unit = cost, .n = c->n, .k = p, .bandwidth = bw, .n_bandwidth = p > 1,
                                    .in_flight = c->slots, .capacity = cap, .workspace_bytes = 0,
                                    .schedule = c->kind, .micro_batches = m, .memory = cdp_planner_part_memory,
                                    .memory_ctx = c, .objective = objective};
    st = cdp_partition_plan(&sp, ps);
    free(sharded);
    if (st) goto done;
    for (int s = 0; s < p; s++) {
        ranges[s][0] = ps[s].first;
        ranges[s][1] = ps[s].end;
    }
done:
    cdp_layout_free(l);
    free(inf);
    free(cap);
    free(bw);
    free(ps);
    free(dev);
    return st;
}

/* CPU sets: each node's ranks grouped by the CPUs near their device (on the
 * cpu backend every CPU this process may use; on cuda the GPU's NUMA node or
 * package from the topology, this host's CPUs when it gives none), each
 * group's cores dealt out in contiguous blocks, one block per rank, when
 * there are at least as many cores as ranks; else rank i of the group shares
 * core i mod cores. */
static const char *near_cpus(const struct ctx *c, const struct cdp_layout_rank *k)
{
    return c->hv ? "" : c->t->gpus[k->device].cpuset;
}

static cdp_status assign_cpus(const struct ctx *c, struct cdp_layout *l)
{
    int *hcpu = NULL, *hcore = NULL, hn = 0, hcores = 0;
    cdp_status st = cdp_host_cpus(&hcpu, &hcore, &hn, &hcores);
    if (st) return st;
    const int N = l->n_ranks;
    unsigned char *done = calloc((size_t)N, 1);
    int *members = malloc((size_t)N * sizeof *members), *mine = NULL, *cpus = NULL, *core = NULL;
    if (!done || !members) st = cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
    for (int i = 0; i < N && !st; i++) {
        if (done[i]) continue;
        const struct cdp_layout_rank *k = &l->rank[i];
        const char *near = near_cpus(c, k);
        int n = 0, ncore = 0, g = 0;
        if (near[0]) { /* a topology's list: each CPU counts as a core */
            if ((st = cdp_cpuset_parse_list(near, &cpus, &n))) break;
            if (!(core = malloc((size_t)(n ? n : 1) * sizeof *core))) {
                st = cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
                break;
            }
            for (int q = 0; q < n; q++) core[q] = q;
            ncore = n;
        } else {
            cpus = malloc((size_t)hn * sizeof *cpus);
            core = malloc((size_t)hn * sizeof *core);
            if (!cpus || !core) {
                st = cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
                break;
            }
            memcpy(cpus, hcpu, (size_t)hn * sizeof *cpus);
            memcpy(core, hcore, (size_t)hn * sizeof *core);
            n = hn;
            ncore = hcores;
        }
        for (int j = i; j < N; j++)
            if (!done[j] && l->rank[j].node == k->node && !strcmp(near_cpus(c, &l->rank[j]), near)) members[g++] = j;
        if (!(mine = malloc((size_t)(n ? n : 1) * sizeof *mine)))
            st = cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
        for (int q = 0; q < g && !st; q++) {
            int lo, hi; /* its cores [lo, hi) */
            if (g <= ncore) {
                lo = (int)((int64_t)q * ncore / g);
                hi = (int)((int64_t)(q + 1) * ncore / g);
            } else {
                lo = q % ncore;
                hi = lo + 1;
            }
            int m = 0;
            for (int x = 0; x < n; x++)
                if (core[x] >= lo && core[x] < hi) mine[m++] = cpus[x];
            for (int a = 1; a < m; a++) /* ascending, for the list form */
                for (int b = a; b > 0 && mine[b - 1] > mine[b]; b--) {
                    const int t = mine[b];
                    mine[b] = mine[b - 1];
                    mine[b - 1] = t;
                }
            st = cdp_cpuset_format(mine, m, l->rank[members[q]].cpuset, sizeof l->rank[members[q]].cpuset);
            done[members[q]] = 1;
        }
        free(mine);
        free(cpus);
        free(core);
        mine = cpus = core = NULL;
    }
    free(done);
    free(members);
    free(hcpu);
    free(hcore);
    return st;
}

/* The chosen candidate as a layout: ranks in device order (node by node),
 * their GPU on the node, CPU sets, caps, shares and memory. */
cdp_status cdp_planner_build_layout(const struct ctx *c, const struct cand *k, const int *device,
                                    const int64_t *shares, struct cdp_layout **out)
{
    const int p = k->p, R = k->R, t = c->tp, N = p * R * t;
    struct cdp_layout *l = NULL;
    cdp_status st = cdp_planner_candidate_layout(c, p, R, k->m, (const int64_t(*)[2])k->ranges, NULL, &l);
    if (st) return st;
    memcpy(l->shares, shares, (size_t)R * sizeof *shares);
    snprintf(l->topology, sizeof l->topology, "%s", c->t->name);
    int *order = malloc((size_t)N * sizeof *order);
    if (!order) {
        cdp_layout_free(l);
        return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
    }
    /* order[i]: (s * R + r) * t + x, the tensor index x on device[s * R + r] + x */
#define DEV_OF(o) (device[(o) / t] + (o) % t)
    for (int i = 0; i < N; i++) order[i] = i;
    for (int i = 1; i < N; i++) /* by device; N is at most the topology's devices */
        for (int j = i; j > 0 && DEV_OF(order[j - 1]) > DEV_OF(order[j]); j--) {
            const int x = order[j];
            order[j] = order[j - 1];
            order[j - 1] = x;
        }
    const int share_k = cdp_backend_is_gpu(c->plan->cluster.backend) && c->plan->cluster.ranks_per_device > 1
                            ? (int)c->plan->cluster.ranks_per_device : 1;
    for (int i = 0; i < N; i++) {
        struct cdp_layout_rank *q = &l->rank[i];
        const int sr = order[i] / t, d = DEV_OF(order[i]);
        q->stage = sr / R;
        q->replica = sr % R;
        q->tensor = order[i] % t;
        q->device = d;
        q->node = c->t->gpus[d].node;
        q->gpu = c->t->gpus[d].local / share_k;
        q->capacity = cdp_planner_device_cap(c->plan, c->t, d);
        /* a GPU's peak only: a CPU device's figure is the cost model's assumption, not a known peak */
        q->peak_flops =
            c->t->kind == CDP_TOPOLOGY_CPU ? 0 : cdp_device_peak_flops(&c->t->gpus[d], c->plan->train.precision);
    }
#undef DEV_OF
    free(order);
    for (int i = 0; i < N && cdp_backend_is_gpu(l->backend); i++)
        for (int j = 0; j < i; j++)
            if (l->rank[j].node == l->rank[i].node && l->rank[j].gpu == l->rank[i].gpu) l->shared_devices = 1;
    if (!(st = assign_cpus(c, l)) && !(st = cdp_planner_layout_memory(c, l))) {
        *out = l;
        return CDP_OK;
    }
    cdp_layout_free(l);
    return st;
}
