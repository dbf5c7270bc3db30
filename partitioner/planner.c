/* The planner (docs/planner.md): a bounded search over the plan's "auto"
 * values, each candidate split by the memory-aware partition and predicted by
 * the simulator, the best few placed by the placement search; and the pieces
 * --simulate shares with it. */
#include "partitioner/planner.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "model/layers.h"
#include "partitioner/balance.h"
#include "partitioner/partition.h"
#include "partitioner/placement.h"
#include "pipeline/schedule.h"

/* ---- shared with --simulate ---------------------------------------------------- */

cdp_status cdp_planner_topology(const struct cdp_plan *plan, int ranks, struct cdp_topology **t, char *note,
                                size_t cap)
{
    const struct cdp_cluster_desc *cd = &plan->cluster;
    note[0] = '\0';
    if (strcmp(cd->topology, "auto") != 0) return cdp_topology_load(cd->topology, NULL, t);
    if (cd->backend == CDP_BACKEND_CPU) {
        snprintf(note, cap, "auto: one CPU device per rank");
        return cdp_topology_cpu(ranks, 0, cd->device_memory, t);
    }
    struct cdp_discover_options o = {0};
    if (!cdp_topology_discover(&o, t)) {
        if ((*t)->kind == CDP_TOPO_GPU && (*t)->n_gpus >= ranks) {
            snprintf(note, cap, "auto: this machine");
            return CDP_OK;
        }
        cdp_topology_free(*t);
        *t = NULL;
    }
    char spec[64];
    if (cd->nodes > 1) snprintf(spec, sizeof spec, "%lld x dgx-a100", (long long)cd->nodes);
    else snprintf(spec, sizeof spec, "dgx-a100");
    snprintf(note, cap, "auto: this machine has too few GPUs; simulating on the %s preset (set "
             "/cluster/topology to choose)", spec);
    return cdp_topology_load(spec, NULL, t);
}

void cdp_planner_vstages(const struct cdp_unit_cost *cost, size_t stride, int p, int nv,
                         const int64_t (*ranges)[2], struct cdp_sim_vstage *vs)
{
    for (int k = 0; k < nv; k++) {
        const struct cdp_unit_cost *c = cost + (size_t)(k % p) * stride;
        struct cdp_sim_vstage *o = &vs[k];
        memset(o, 0, sizeof *o);
        for (int64_t i = ranges[k][0]; i < ranges[k][1]; i++) {
            o->fwd_s += c[i].fwd_s;
            o->bwd_s += c[i].bwd_s;
            o->act_bytes += c[i].act_bytes;
            o->grad_bytes += c[i].param_bytes;
            o->state_bytes += c[i].state_bytes;
            o->opt_s += c[i].opt_s;
        }
        if (ranges[k][1] > ranges[k][0]) o->out_bytes = c[ranges[k][1] - 1].out_bytes;
    }
}

void cdp_planner_links(const struct cdp_topology *t, double *bw, double *lat)
{
    const int nd = t->n_gpus;
    for (int a = 0; a < nd; a++)
        for (int b = 0; b < nd; b++) {
            struct cdp_topo_link l;
            bw[a * nd + b] = 0;
            lat[a * nd + b] = 0;
            if (a == b || cdp_topology_link(t, a, b, &l)) continue;
            bw[a * nd + b] = l.bandwidth;
            lat[a * nd + b] = l.latency;
        }
}

double cdp_planner_tied_bytes(const struct cdp_plan *plan, const struct cdp_unit *u, int n)
{
    double b = 0;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < u[i].n_params; k++)
            if (u[i].params[k].tied_unit >= 0) b += (double)u[i].params[k].numel * cdp_cost_grad_bytes_per_param(plan);
    return b;
}

/* ---- the search ------------------------------------------------------------------ */

struct cand {
    int p, R, m;
    enum cdp_schedule_kind kind;
    int64_t (*ranges)[2]; /* p*v */
    double step_s, sps;   /* with the screening placement */
};

struct ctx {
    const struct cdp_plan *plan;
    const struct cdp_topology *t;
    int n, nd, v;
    enum cdp_schedule_kind kind;
    struct cdp_unit *u;
    struct cdp_unit_cost *cost;
    double *bw, *lat;
    double cap;        /* bytes per device; 0 unlimited */
    double tied_bytes; /* of the model; used when p*v > 1 */
    int64_t sims, cheap_sims;
    int cheap;         /* 1: screen and place on the one-replica model (large worlds) */
    int *rdev;         /* p: devices of one replica (cheap model scratch) */
    double *keys;      /* cheap model cache: link signature of each distinct replica pipeline */
    double *key_val;   /* [2j]: its step time, [2j+1]: its peak memory */
    uint64_t *key_hash;
    int n_keys, cap_keys;
    double *lbw, *llat; /* p*p: links among one replica's devices */
    /* the candidate being simulated */
    int p, R, m;
    struct cdp_schedule *sched;
    struct cdp_sim_vstage *vs;
};

static cdp_status sim(struct ctx *c, const int *device, struct cdp_sim_result **out)
{
    const int tied = c->plan->model.kind == CDP_MODEL_GPT && c->plan->model.tie_embeddings && c->p * c->v > 1;
    struct cdp_sim_config sc = {.sched = c->sched, .replicas = c->R, .vstage = c->vs,
                                .tied_bytes = tied ? c->tied_bytes : 0, .device = device, .n_devices = c->nd,
                                .bandwidth = c->bw, .latency = c->lat,
                                .samples_per_mb = (double)c->plan->train.micro_batch};
    c->sims++;
    return cdp_sim_run(&sc, out);
}

/* The cheap model (docs/planner.md, "Large worlds"): every replica's pipeline
 * simulated alone (R = 1; replicas whose stage-to-stage links are the same are
 * simulated once), the slowest taken, plus the data-parallel ring all-reduce
 * of each stage in closed form as the simulator computes it (2(R-1)/R x the
 * stage's gradient bytes over the ring's slowest link + 2(R-1) latencies of its
 * slowest hop), the largest over stages added after the forward/backward
 * phase. Ignores links shared by transfers of different replicas. *peak gets
 * the largest per-rank peak memory (NULL: not wanted). */
static cdp_status cheap_step(struct ctx *c, const int *device, int all, double *step, double *peak)
{
    const int p = c->p, R = c->R, nk = 4 * (p - 1) + 1;
    const int tied = c->plan->model.kind == CDP_MODEL_GPT && c->plan->model.tie_embeddings && p * c->v > 1;
    double slowest = 0, mem = 0;
    int r_lo = 0, r_hi = R;
    if (!all) { /* screening: only the replica whose stage-to-stage transfers take longest alone */
        double worst = -1;
        for (int r = 0; r < R; r++) {
            double t = 0;
            for (int k = 0; k + 1 < p * c->v; k++) {
                const int a = device[(k % p) * R + r], b = device[((k + 1) % p) * R + r];
                const double fw = c->bw[a * c->nd + b], bw = c->bw[b * c->nd + a];
                t += (fw > 0 ? c->vs[k].out_bytes / fw : 0) + (bw > 0 ? c->vs[k].out_bytes / bw : 0) +
                     c->lat[a * c->nd + b] + c->lat[b * c->nd + a];
            }
            if (t > worst) worst = t, r_lo = r;
        }
        r_hi = r_lo + 1;
    }
    for (int r = r_lo; r < r_hi; r++) {
        if (c->n_keys == c->cap_keys) { /* replicas seen before (this shape) are looked up, not simulated */
            const int cap = c->cap_keys ? 2 * c->cap_keys : 64;
            double *k = realloc(c->keys, (size_t)cap * nk * sizeof *k);
            if (k) c->keys = k;
            double *ks = realloc(c->key_val, (size_t)cap * 2 * sizeof *ks);
            if (ks) c->key_val = ks;
            uint64_t *kh = realloc(c->key_hash, (size_t)cap * sizeof *kh);
            if (kh) c->key_hash = kh;
            if (!k || !ks || !kh) return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
            c->cap_keys = cap;
        }
        double *key = &c->keys[(size_t)c->n_keys * nk];
        for (int s = 0; s + 1 < p; s++) {
            const int a = device[s * R + r], b = device[(s + 1) * R + r];
            key[4 * s] = c->bw[a * c->nd + b];
            key[4 * s + 1] = c->bw[b * c->nd + a];
            key[4 * s + 2] = c->lat[a * c->nd + b];
            key[4 * s + 3] = c->lat[b * c->nd + a];
        }
        /* the tied-embedding reduction runs between the first and last stage */
        key[nk - 1] = tied ? c->bw[device[r] * c->nd + device[(p - 1) * R + r]] : 0;
        uint64_t h = 1469598103934665603ull;
        for (size_t q = 0; q < (size_t)nk * sizeof *key; q++) h = (h ^ ((const unsigned char *)key)[q]) * 1099511628211ull;
        int j = 0;
        while (j < c->n_keys &&
               (c->key_hash[j] != h || memcmp(&c->keys[(size_t)j * nk], key, (size_t)nk * sizeof *key)))
            j++;
        if (j == c->n_keys) {
            /* on a p-device sub-topology: the full link matrix would cost n^2 per run */
            for (int s = 0; s < p; s++) {
                c->rdev[s] = s;
                for (int q = 0; q < p; q++) {
                    const int a = device[s * R + r], b = device[q * R + r];
                    c->lbw[s * p + q] = c->bw[a * c->nd + b];
                    c->llat[s * p + q] = c->lat[a * c->nd + b];
                }
            }
            struct cdp_sim_config sc = {.sched = c->sched, .replicas = 1, .vstage = c->vs,
                                        .tied_bytes = tied ? c->tied_bytes : 0, .device = c->rdev,
                                        .n_devices = p, .bandwidth = c->lbw, .latency = c->llat,
                                        .samples_per_mb = (double)c->plan->train.micro_batch};
            struct cdp_sim_result *sr = NULL;
            c->cheap_sims++;
            cdp_status st = cdp_sim_run(&sc, &sr);
            if (st) return st;
            double pk = 0;
            for (int i = 0; i < sr->ranks; i++) pk = fmax(pk, sr->peak_memory[i]);
            c->key_val[2 * j] = sr->step_s;
            c->key_val[2 * j + 1] = pk;
            c->key_hash[j] = h;
            c->n_keys++;
            cdp_sim_result_free(sr);
        }
        slowest = fmax(slowest, c->key_val[2 * j]);
        mem = fmax(mem, c->key_val[2 * j + 1]);
    }
    double ar = 0;
    for (int s = 0; s < p && R > 1; s++) {
        double bytes = 0, min_bw = INFINITY, max_lat = 0;
        for (int k = s; k < p * c->v; k += p) bytes += c->vs[k].grad_bytes;
        for (int r = 0; r < R; r++) {
            const int a = device[s * R + r], b = device[s * R + (r + 1) % R];
            if (a == b) continue;
            if (c->bw[a * c->nd + b] > 0) min_bw = fmin(min_bw, c->bw[a * c->nd + b]);
            max_lat = fmax(max_lat, c->lat[a * c->nd + b]);
        }
        const double moved = 2.0 * (R - 1) / R * bytes;
        ar = fmax(ar, (isinf(min_bw) ? 0 : moved / min_bw) + 2.0 * (R - 1) * max_lat);
    }
    *step = slowest + ar;
    if (peak) *peak = mem;
    return CDP_OK;
}

static double place_cost(const int *device, void *vctx)
{
    struct ctx *c = vctx;
    if (c->cheap) {
        double s;
        return cheap_step(c, device, 1, &s, NULL) ? NAN : s;
    }
    struct cdp_sim_result *r = NULL;
    if (sim(c, device, &r)) return NAN;
    double s = r->step_s;
    cdp_sim_result_free(r);
    return s;
}

/* Prepares c->sched and c->vs for (p, R, m) and ranges. */
static cdp_status prepare(struct ctx *c, int p, int R, int m, const int64_t (*ranges)[2])
{
    const int tied = c->plan->model.kind == CDP_MODEL_GPT && c->plan->model.tie_embeddings && p * c->v > 1;
    cdp_schedule_free(c->sched);
    c->sched = NULL;
    free(c->vs);
    free(c->lbw);
    free(c->llat);
    c->p = p, c->R = R, c->m = m;
    c->cheap = p * R > CDP_PLACEMENT_EXACT_MAX_DEVICES;
    c->vs = calloc((size_t)p * c->v, sizeof *c->vs);
    c->n_keys = c->cap_keys = 0; /* the cache is per shape */
    free(c->keys);
    free(c->key_val);
    free(c->key_hash);
    c->keys = NULL, c->key_val = NULL, c->key_hash = NULL;
    c->lbw = malloc((size_t)p * p * sizeof *c->lbw);
    c->llat = malloc((size_t)p * p * sizeof *c->llat);
    if (!c->vs || !c->lbw || !c->llat) return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
    cdp_planner_vstages(c->cost, 0, p, p * c->v, ranges, c->vs);
    return cdp_schedule_build(c->kind, p, c->v, m, tied, &c->sched);
}

/* The device of (s, r) under the plan's fixed placement, or ordered-pp-inner. */
static void fixed_placement(const struct cdp_plan *plan, int p, int R, int *device)
{
    const struct cdp_parallel_desc *pd = &plan->parallel;
    if (pd->placement == CDP_PLACEMENT_EXPLICIT && pd->stages == p && pd->replicas == R)
        for (int i = 0; i < p * R; i++) device[i] = (int)pd->placement_map[i];
    else if (pd->placement == CDP_PLACEMENT_ORDERED_DP_INNER) cdp_placement_ordered_dp_inner(p, R, device);
    else cdp_placement_ordered_pp_inner(p, R, device);
}

/* Splits for p stages, m micro-batches; ranges gets p*v entries. */
static cdp_status split(struct ctx *c, int p, int m, int64_t (*ranges)[2])
{
    const struct cdp_parallel_desc *pd = &c->plan->parallel;
    const int nv = p * c->v;
    if (pd->partition && pd->n_partition == nv) {
        memcpy(ranges, pd->partition, (size_t)nv * sizeof *ranges);
        return CDP_OK;
    }
    if (c->v > 1) {
        /* interleaved chunks are not contiguous per rank: balanced on time,
         * memory checked on the simulated peak afterwards */
        double *w = malloc((size_t)c->n * sizeof *w);
        if (!w) return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
        for (int i = 0; i < c->n; i++) w[i] = c->cost[i].fwd_s + c->cost[i].bwd_s;
        cdp_status st = cdp_partition_balanced(w, c->n, nv, ranges);
        free(w);
        return st;
    }
    int *inf = malloc((size_t)p * sizeof *inf);
    double *cap = malloc((size_t)p * sizeof *cap), *bw = malloc((size_t)p * sizeof *bw);
    struct cdp_partition_stage *ps = malloc((size_t)p * sizeof *ps);
    int *dev = malloc((size_t)p * sizeof *dev);
    cdp_status st = CDP_OK;
    if (!inf || !cap || !bw || !ps || !dev) {
        st = cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
        goto done;
    }
    if ((st = cdp_partition_in_flight(c->kind, p, m, inf))) goto done;
    /* boundary bandwidths of the first pipeline under the fixed placement */
    fixed_placement(c->plan, p, 1, dev);
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
    struct cdp_partition_spec sp = {.unit = c->cost, .n = c->n, .k = p, .bandwidth = bw, .n_bandwidth = p > 1,
                                    .in_flight = inf, .capacity = cap, .workspace_bytes = 0,
                                    .schedule = c->kind, .micro_batches = m};
    if ((st = cdp_partition_plan(&sp, ps))) goto done;
    for (int s = 0; s < p; s++) {
        ranges[s][0] = ps[s].first;
        ranges[s][1] = ps[s].end;
    }
done:
    free(inf);
    free(cap);
    free(bw);
    free(ps);
    free(dev);
    return st;
}

static int cand_better(const struct cand *a, const struct cand *b)
{
    if (a->sps != b->sps) return a->sps > b->sps;
    if (a->p != b->p) return a->p < b->p;
    if (a->m != b->m) return a->m < b->m;
    /* as fast: 1F1B, which keeps fewer activations in flight */
    return a->kind == CDP_SCHEDULE_1F1B && b->kind != CDP_SCHEDULE_1F1B;
}

/* Explicit shares are multiples of p, as the interleaved schedule needs. */
static int shares_fit(const struct cdp_parallel_desc *pd, int p)
{
    if (pd->balance != CDP_BALANCE_EXPLICIT) return 1;
    for (int i = 0; i < pd->n_shares; i++)
        if (pd->shares[i] % p) return 0;
    return 1;
}

static int64_t pow2_at_least(int64_t x)
{
    int64_t q = 1;
    while (q < x) q *= 2;
    return q;
}

static void fill_result(struct ctx *c, const struct cdp_sim_result *r, const int64_t (*ranges)[2],
                        const int *device, struct cdp_planner_result *out)
{
    const int p = c->p, R = c->R, nv = p * c->v;
    memcpy(out->ranges, ranges, (size_t)nv * sizeof *ranges);
    memcpy(out->device, device, (size_t)p * R * sizeof *device);
    for (int s = 0; s < p; s++) {
        struct cdp_planner_stage *st = &out->stage[s];
        memset(st, 0, sizeof *st);
        for (int k = s; k < nv; k += p) {
            st->fwd_s += c->vs[k].fwd_s;
            st->bwd_s += c->vs[k].bwd_s;
        }
        for (int q = 0; q < R; q++) st->memory_bytes = fmax(st->memory_bytes, r->peak_memory[s * R + q]);
        st->capacity_bytes = c->cap;
    }
    for (int q = 0; q < R; q++)
        for (int s = 0; s < p; s++) {
            const int i = s * R + q, d = device[i];
            out->rank[q * p + s] = (struct cdp_planner_rank){.rank = q * p + s, .stage = s, .replica = q,
                                                             .device = d, .node = c->t->gpus[d].node,
                                                             .gpu = c->t->gpus[d].local,
                                                             .peak_memory = r->peak_memory[i]};
        }
    out->predicted = (struct cdp_planner_prediction){r->step_s, r->bubble, r->samples_per_s};
}

/* A device's model without the vendor's words, for the balance table. */
static const char *short_name(const struct cdp_topology *t, int d)
{
    const char *n = t->gpus[d].name;
    if (t->kind == CDP_TOPO_CPU) return "CPU";
    if (!strncmp(n, "NVIDIA ", 7)) n += 7;
    if (!strncmp(n, "Tesla ", 6)) n += 6;
    return n;
}

/* How much longer device d takes than device 0, whose rate the costs are in:
 * rate(device 0) / rate(d) for the plan's precision. */
static double slowdown(const struct cdp_plan *plan, const struct cdp_topology *t, const struct cdp_device_rate *r0,
                       int d)
{
    const struct cdp_topo_gpu *a = &t->gpus[0], *g = &t->gpus[d];
    if (a->peak_fp32 == g->peak_fp32 && a->peak_tf32 == g->peak_tf32 && a->peak_bf16 == g->peak_bf16) return 1;
    const struct cdp_device_rate r = cdp_device_rate_of(t, d, plan->train.precision);
    return (r0->flops * r0->efficiency) / (r.flops * r.efficiency);
}

/* "A100-SXM4-80GB x2", or "A100-SXM4-80GB x1 + V100-SXM2-16GB x1": the
 * devices of replica r, models in stage order. */
static void replica_devices(const struct cdp_topology *t, const int *device, int p, int R, int r, char *buf,
                            size_t cap)
{
    enum { MAX_KINDS = 4 };
    const char *name[MAX_KINDS];
    int count[MAX_KINDS], kinds = 0, other = 0;
    for (int s = 0; s < p; s++) {
        const char *n = short_name(t, device[s * R + r]);
        int k = 0;
        while (k < kinds && strcmp(name[k], n)) k++;
        if (k == kinds && kinds == MAX_KINDS) {
            other++;
            continue;
        }
        if (k == kinds) name[kinds] = n, count[kinds++] = 0;
        count[k]++;
    }
    size_t o = 0;
    buf[0] = '\0';
    for (int k = 0; k < kinds && o < cap; k++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%s x%d", k ? " + " : "", name[k], count[k]);
    if (other && o < cap) snprintf(buf + o, cap - o, " + %d others", other);
}

/* The balance of the chosen plan (docs/planner.md, "Mixed GPUs"): each
 * replica's time per micro-batch on its slowest stage with its own devices,
 * the shares the plan asks for, and the step with them and with equal shares
 * (cdp_balance_step_time plus the simulated tail, sr's step after its
 * forward/backward phase). */
static cdp_status balance_result(const struct ctx *c, const struct cdp_sim_result *sr, struct cdp_planner_result *res)
{
    const struct cdp_parallel_desc *pd = &c->plan->parallel;
    const int p = res->stages, R = res->replicas, m = res->micro_batches;
    struct cdp_planner_balance *b = &res->balance;
    b->kind = pd->balance;
    b->shares = calloc((size_t)R, sizeof *b->shares);
    b->t_s = calloc((size_t)R, sizeof *b->t_s);
    b->devices = calloc((size_t)R, sizeof *b->devices);
    int64_t *uniform = malloc((size_t)R * sizeof *uniform);
    cdp_status st = CDP_OK;
    if (!b->shares || !b->t_s || !b->devices || !uniform) {
        st = cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
        goto done;
    }
    const struct cdp_device_rate r0 = cdp_device_rate_of(c->t, 0, c->plan->train.precision);
    for (int r = 0; r < R; r++) {
        double t = 0;
        for (int s = 0; s < p; s++) {
            const double x = (res->stage[s].fwd_s + res->stage[s].bwd_s) *
                             slowdown(c->plan, c->t, &r0, res->device[s * R + r]);
            if (x > t) t = x;
        }
        b->t_s[r] = t;
        uniform[r] = m;
        replica_devices(c->t, res->device, p, R, r, b->devices[r], sizeof b->devices[r]);
    }
    switch (pd->balance) {
    case CDP_BALANCE_EXPLICIT:
        if (pd->n_shares != R) {
            st = cdp_fail(CDP_ERR_INVALID, "%s: /parallel/balance: %d shares for %d replicas", c->plan->source,
                          pd->n_shares, R);
            goto done;
        }
        memcpy(b->shares, pd->shares, (size_t)R * sizeof *b->shares);
        break;
    case CDP_BALANCE_SPEED:
        if ((st = cdp_balance_shares(b->t_s, R, p, (int64_t)R * m, c->v > 1 ? p : 1, 0, b->shares))) {
            st = cdp_error_context(st, "%s: planner", c->plan->source);
            goto done;
        }
        break;
    default:
        memcpy(b->shares, uniform, (size_t)R * sizeof *b->shares);
        break;
    }
    b->rest_s = sr->step_s > sr->phase_s ? sr->step_s - sr->phase_s : 0;
    b->step_s = cdp_balance_step_time(b->t_s, R, p, b->shares) + b->rest_s;
    b->uniform_step_s = cdp_balance_step_time(b->t_s, R, p, uniform) + b->rest_s;
    b->gain = b->step_s > 0 ? b->uniform_step_s / b->step_s - 1 : 0;
done:
    free(uniform);
    return st;
}

void cdp_planner_result_clear(struct cdp_planner_result *r)
{
    if (!r) return;
    free(r->balance.shares);
    free(r->balance.t_s);
    free(r->balance.devices);
    free(r->ranges);
    free(r->stage);
    free(r->device);
    free(r->rank);
    memset(r, 0, sizeof *r);
}

/* Everything a search context allocates. */
static void ctx_free(struct ctx *c)
{
    cdp_schedule_free(c->sched);
    free(c->vs);
    free(c->keys);
    free(c->key_val);
    free(c->key_hash);
    free(c->lbw);
    free(c->llat);
    free(c->rdev);
    free(c->u);
    free(c->cost);
    free(c->bw);
    free(c->lat);
}

cdp_status cdp_planner_run(const struct cdp_plan *plan, const struct cdp_topology *t,
                           const struct cdp_cost_table *costs, struct cdp_planner_result *out)
{
    const uint64_t t0 = cdp_time_ns();
    const struct cdp_parallel_desc *pd = &plan->parallel;
    struct ctx c = {.plan = plan, .t = t, .nd = t->n_gpus, .kind = pd->schedule,
                    .v = pd->schedule == CDP_SCHEDULE_INTERLEAVED ? (int)pd->chunks : 1};
    struct cand *cand = NULL;
    int n_cand = 0, cap_cand = 0;
    struct cdp_planner_result res = {0};
    struct cdp_sim_result *sr = NULL;
    int *dev = NULL;
    char why[1024] = "";
    cdp_status st;

    if ((st = cdp_units_build(&plan->model, &c.u, &c.n))) goto fail;
    c.cost = calloc((size_t)c.n, sizeof *c.cost);
    c.bw = malloc((size_t)c.nd * c.nd * sizeof *c.bw);
    c.lat = malloc((size_t)c.nd * c.nd * sizeof *c.lat);
    dev = malloc((size_t)c.nd * sizeof *dev);
    c.rdev = malloc((size_t)c.nd * sizeof *c.rdev);
    if (!c.cost || !c.bw || !c.lat || !dev || !c.rdev) {
        st = cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
        goto fail;
    }
    struct cdp_device_rate rate = cdp_device_rate_of(t, 0, plan->train.precision);
    cdp_costs_analytic(plan, c.u, c.n, &rate, c.cost);
    if (costs) cdp_costs_apply(costs, c.u, c.n, c.cost);
    cdp_planner_links(t, c.bw, c.lat);
    c.tied_bytes = plan->model.kind == CDP_MODEL_GPT && plan->model.tie_embeddings
                       ? cdp_planner_tied_bytes(plan, c.u, c.n) : 0;
    uint64_t cap = t->gpus[0].memory_bytes;
    for (int d = 1; d < c.nd; d++)
        if (t->gpus[d].memory_bytes && (!cap || t->gpus[d].memory_bytes < cap)) cap = t->gpus[d].memory_bytes;
    if (plan->cluster.device_memory && (!cap || plan->cluster.device_memory < cap)) cap = plan->cluster.device_memory;
    c.cap = (double)cap;

    int W = c.nd;
    if (plan->cluster.devices != CDP_AUTO && plan->cluster.nodes * plan->cluster.devices < W)
        W = (int)(plan->cluster.nodes * plan->cluster.devices);
    const int64_t b = plan->train.micro_batch, G = plan->train.global_batch;
    const int64_t S = G != CDP_AUTO ? G / b : 0; /* samples-per-step in micro-batches, when fixed */
    const int pmin = c.v > 1 ? 2 : 1, pmax = (int)(c.n / c.v < W ? c.n / c.v : W);
    int p_lo = pmin, p_hi = pmax;
    if (pd->stages != CDP_AUTO) p_lo = p_hi = (int)pd->stages;
    int largest_tried = 0;

    /* 1. every shape: split and simulate under the fixed (or pp-inner) placement */
    for (int p = p_lo; p <= p_hi; p++) {
        int R;
        if (pd->replicas != CDP_AUTO) {
            R = (int)pd->replicas;
        } else {
            R = W / p;
            if (S)
                while (R > 0 && (S % R || (pd->micro_batches != CDP_AUTO && S % ((int64_t)R * pd->micro_batches))))
                    R--;
        }
        if (R < 1 || (int64_t)p * R > c.nd) continue;
        int64_t ms[CDP_PLANNER_MB_CHOICES];
        int n_m = 0;
        if (pd->micro_batches != CDP_AUTO) ms[n_m++] = pd->micro_batches;
        else if (S) ms[n_m++] = S / R;
        else
            for (int64_t q = pow2_at_least(p); n_m < CDP_PLANNER_MB_CHOICES; q *= 2) ms[n_m++] = q;
        /* "auto" schedule: 1F1B and GPipe (interleaved needs chunks, which the plan gives) */
        const enum cdp_schedule_kind kinds[2] = {CDP_SCHEDULE_1F1B, CDP_SCHEDULE_GPIPE};
        const int n_kinds = pd->schedule_auto ? 2 : 1;
        for (int ik = 0; ik < n_m * n_kinds; ik++) {
            const int i = ik / n_kinds;
            c.kind = pd->schedule_auto ? kinds[ik % n_kinds] : pd->schedule;
            const int m = (int)ms[i];
            if (m < 1 || (c.v > 1 && (m % p || !shares_fit(pd, p)))) continue;
            res.shapes++;
            largest_tried = p;
            if (n_cand == cap_cand) {
                cap_cand = cap_cand ? 2 * cap_cand : 64;
                struct cand *nc = realloc(cand, (size_t)cap_cand * sizeof *cand);
                if (!nc) {
                    st = cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
                    goto fail;
                }
                cand = nc;
            }
            struct cand *k = &cand[n_cand];
            *k = (struct cand){.p = p, .R = R, .m = m, .kind = c.kind};
            k->ranges = calloc((size_t)p * c.v, sizeof *k->ranges);
            if (!k->ranges) {
                st = cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
                goto fail;
            }
            if ((st = split(&c, p, m, k->ranges))) {
                free(k->ranges);
                if (st != CDP_ERR_INVALID) goto fail;
                snprintf(why, sizeof why, "%s", cdp_last_error());
                continue;
            }
            if ((st = prepare(&c, p, R, m, (const int64_t(*)[2])k->ranges))) {
                free(k->ranges);
                goto fail;
            }
            fixed_placement(plan, p, R, dev);
            double step = 0, peak = 0;
            if (c.cheap) {
                st = cheap_step(&c, dev, 0, &step, &peak);
            } else if (!(st = sim(&c, dev, &sr))) {
                step = sr->step_s;
                for (int q = 0; q < sr->ranks; q++) peak = fmax(peak, sr->peak_memory[q]);
            }
            if (st) {
                free(k->ranges);
                goto fail;
            }
            if (c.cap > 0 && peak > c.cap) {
                snprintf(why, sizeof why, "%d stages x %d micro-batches: a rank needs more than the %.2f GiB "
                         "each device has", p, m, c.cap / 1073741824.0);
                free(k->ranges);
            } else {
                k->step_s = step;
                k->sps = sr ? sr->samples_per_s : (double)R * m * (double)b / step;
                n_cand++;
            }
            cdp_sim_result_free(sr);
            sr = NULL;
        }
    }
    res.feasible = n_cand;
    if (n_cand == 0) {
        if (!why[0])
            snprintf(why, sizeof why, "no (stages, replicas, micro_batches) fits %d devices and /train/global_batch",
                     W);
        if (pd->stages != CDP_AUTO || res.shapes == 0)
            st = cdp_fail(CDP_ERR_INVALID, "%s: planner: %s", plan->source, why);
        else
            st = cdp_fail(CDP_ERR_INVALID, "%s: planner: no shape up to %d stages on %d devices fits; at %d "
                          "stages: %s", plan->source, largest_tried, W, largest_tried, why);
        goto fail;
    }
    /* best first; equal throughput: fewer stages, fewer micro-batches */
    for (int i = 1; i < n_cand; i++)
        for (int j = i; j > 0 && cand_better(&cand[j], &cand[j - 1]); j--) {
            struct cand tmp = cand[j];
            cand[j] = cand[j - 1];
            cand[j - 1] = tmp;
        }

    /* 2. placement: searched for the best few shapes when the plan leaves it to the topology */
    int best = 0;
    double best_sps = cand[0].sps;
    int *best_dev = malloc((size_t)c.nd * sizeof *best_dev);
    if (!best_dev) {
        st = cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
        goto fail;
    }
    fixed_placement(plan, cand[0].p, cand[0].R, best_dev);
    snprintf(res.placement_method, sizeof res.placement_method, "%s",
             pd->placement == CDP_PLACEMENT_EXPLICIT           ? "explicit (from the plan)"
             : pd->placement == CDP_PLACEMENT_ORDERED_DP_INNER ? "ordered-dp-inner (from the plan)"
                                                               : "ordered-pp-inner (from the plan)");
    if (pd->placement == CDP_PLACEMENT_TOPOLOGY) {
        for (int i = 0; i < n_cand && i < CDP_PLANNER_PLACED_SHAPES; i++) {
            struct cand *k = &cand[i];
            c.kind = k->kind;
            if ((st = prepare(&c, k->p, k->R, k->m, (const int64_t(*)[2])k->ranges))) break;
            /* bounded work: about 1e6 simulated (rank x micro-batch) slots per shape, at least 8
             * evaluations; the cheap model simulates one pipeline per distinct replica (counted as 8) */
            int64_t per = c.cheap ? (int64_t)k->p * k->m * c.v * 8 + (int64_t)k->p * k->R
                                  : (int64_t)k->p * k->R * k->m * c.v;
            int64_t evals = 1000000 / (per > 0 ? per : 1);
            if (evals > CDP_PLACEMENT_LOCAL_EVALS) evals = CDP_PLACEMENT_LOCAL_EVALS;
            if (evals < 8) evals = 8;
            struct cdp_placement_problem pb = {.topo = t, .p = k->p, .R = k->R, .cost = place_cost, .ctx = &c,
                                               .max_local_evals = evals};
            struct cdp_placement_info info;
            if ((st = cdp_placement_search(&pb, dev, &info))) break;
            res.placed_shapes++;
            double step_s = info.cost;
            if (c.cheap) { /* searched on the cheap model: the full simulation decides */
                if ((st = sim(&c, dev, &sr))) break;
                step_s = sr->step_s;
                cdp_sim_result_free(sr);
                sr = NULL;
            }
            const double sps = (double)k->R * k->m * (double)b / step_s;
            if (i == 0 || sps > best_sps) {
                best = i;
                best_sps = sps;
                memcpy(best_dev, dev, (size_t)k->p * k->R * sizeof *dev);
                snprintf(res.placement_method, sizeof res.placement_method, "%s", info.method);
            }
        }
        if (st) {
            free(best_dev);
            goto fail;
        }
    }

    /* 3. the chosen plan and the baselines */
    struct cand *k = &cand[best];
    c.kind = k->kind;
    res.stages = k->p;
    res.replicas = k->R;
    res.micro_batches = k->m;
    res.chunks = c.v;
    res.schedule = c.kind;
    res.global_batch = (int64_t)k->R * k->m * b;
    res.n_ranges = k->p * c.v;
    res.world = W;
    snprintf(res.topology, sizeof res.topology, "%s", t->name);
    res.ranges = calloc((size_t)res.n_ranges, sizeof *res.ranges);
    res.stage = calloc((size_t)k->p, sizeof *res.stage);
    res.device = calloc((size_t)k->p * k->R, sizeof *res.device);
    res.rank = calloc((size_t)k->p * k->R, sizeof *res.rank);
    if (!res.ranges || !res.stage || !res.device || !res.rank) {
        free(best_dev);
        st = cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
        goto fail;
    }
    if (!(st = prepare(&c, k->p, k->R, k->m, (const int64_t(*)[2])k->ranges)) && !(st = sim(&c, best_dev, &sr))) {
        fill_result(&c, sr, (const int64_t(*)[2])k->ranges, best_dev, &res);
        st = balance_result(&c, sr, &res);
    }
    free(best_dev);
    cdp_sim_result_free(sr);
    sr = NULL;
    if (st) goto fail;
    static const char *const names[2] = {"ordered-pp-inner", "ordered-dp-inner"};
    for (int i = 0; i < 2; i++) {
        if (i == 0) cdp_placement_ordered_pp_inner(k->p, k->R, dev);
        else cdp_placement_ordered_dp_inner(k->p, k->R, dev);
        if ((st = sim(&c, dev, &sr))) goto fail;
        res.baseline[i] = (struct cdp_planner_baseline){names[i], {sr->step_s, sr->bubble, sr->samples_per_s}};
        cdp_sim_result_free(sr);
        sr = NULL;
    }
    res.simulations = c.sims;
    res.replica_simulations = c.cheap_sims;
    res.search_s = (double)(cdp_time_ns() - t0) * 1e-9;
    CDP_INFO(PART, "planner: %lld shapes, %lld feasible, %lld simulations (+%lld of one replica), %.3f s",
             (long long)res.shapes, (long long)res.feasible, (long long)res.simulations,
             (long long)res.replica_simulations, res.search_s);
    *out = res;
    st = CDP_OK;
    memset(&res, 0, sizeof res);
fail:
    for (int i = 0; i < n_cand; i++) free(cand[i].ranges);
    free(cand);
    cdp_sim_result_free(sr);
    cdp_planner_result_clear(&res);
    ctx_free(&c);
    free(dev);
    return st;
}

/* ---- --explore placements -------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Share of the random placements strictly faster than x, in percent. */
static double pct_faster(const double *sorted, int n, double x)
{
    int k = 0;
    while (k < n && sorted[k] < x) k++;
    return n ? 100.0 * k / n : 0;
}

cdp_status cdp_planner_explore(const struct cdp_plan *plan, const struct cdp_topology *t,
                               const struct cdp_cost_table *costs, const struct cdp_planner_result *r, int n_random,
                               uint64_t seed, struct cdp_planner_spread *out)
{
    struct ctx c = {.plan = plan, .t = t, .nd = t->n_gpus, .kind = r->schedule, .v = r->chunks};
    const int p = r->stages, R = r->replicas, N = p * R;
    struct cdp_planner_spread sp = {.n_random = n_random, .seed = seed};
    double *rnd = NULL;
    int *dev = NULL, *perm = NULL;
    cdp_status st;
    if (n_random < 1 || N > c.nd) return cdp_fail(CDP_ERR_INVALID, "planner: explore: bad sample count or shape");
    if ((st = cdp_units_build(&plan->model, &c.u, &c.n))) return st;
    c.cost = calloc((size_t)c.n, sizeof *c.cost);
    c.bw = malloc((size_t)c.nd * c.nd * sizeof *c.bw);
    c.lat = malloc((size_t)c.nd * c.nd * sizeof *c.lat);
    c.rdev = malloc((size_t)c.nd * sizeof *c.rdev);
    dev = malloc((size_t)c.nd * sizeof *dev);
    perm = malloc((size_t)c.nd * sizeof *perm);
    rnd = malloc((size_t)n_random * sizeof *rnd);
    if (!c.cost || !c.bw || !c.lat || !c.rdev || !dev || !perm || !rnd) {
        st = cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
        goto fail;
    }
    struct cdp_device_rate rate = cdp_device_rate_of(t, 0, plan->train.precision);
    cdp_costs_analytic(plan, c.u, c.n, &rate, c.cost);
    if (costs) cdp_costs_apply(costs, c.u, c.n, c.cost);
    cdp_planner_links(t, c.bw, c.lat);
    c.tied_bytes = plan->model.kind == CDP_MODEL_GPT && plan->model.tie_embeddings
                       ? cdp_planner_tied_bytes(plan, c.u, c.n) : 0;
    if ((st = prepare(&c, p, R, r->micro_batches, (const int64_t(*)[2])r->ranges))) goto fail;
    sp.cheap = c.cheap;
    /* the chosen placement and the two fixed orders, then the random sample */
    for (int which = 0; which < 3 + n_random; which++) {
        if (which == 0) memcpy(dev, r->device, (size_t)N * sizeof *dev);
        else if (which == 1) cdp_placement_ordered_pp_inner(p, R, dev);
        else if (which == 2) cdp_placement_ordered_dp_inner(p, R, dev);
        else {
            for (int d = 0; d < c.nd; d++) perm[d] = d;
            for (int i = 0; i < N; i++) { /* partial Fisher-Yates: N distinct devices */
                const int j = i + (int)(splitmix64(&seed) % (uint64_t)(c.nd - i));
                const int x = perm[i];
                perm[i] = perm[j];
                perm[j] = x;
            }
            memcpy(dev, perm, (size_t)N * sizeof *dev);
        }
        const double step = place_cost(dev, &c);
        if (!isfinite(step)) {
            st = cdp_fail(CDP_ERR_INTERNAL, "planner: explore: %s", cdp_last_error());
            goto fail;
        }
        if (which == 0) sp.chosen_s = step;
        else if (which == 1) sp.pp_inner_s = step;
        else if (which == 2) sp.dp_inner_s = step;
        else rnd[which - 3] = step;
    }
    qsort(rnd, (size_t)n_random, sizeof *rnd, cmp_double);
    sp.min_s = rnd[0];
    sp.max_s = rnd[n_random - 1];
    sp.median_s = n_random % 2 ? rnd[n_random / 2] : 0.5 * (rnd[n_random / 2 - 1] + rnd[n_random / 2]);
    sp.chosen_pct = pct_faster(rnd, n_random, sp.chosen_s);
    sp.pp_inner_pct = pct_faster(rnd, n_random, sp.pp_inner_s);
    sp.dp_inner_pct = pct_faster(rnd, n_random, sp.dp_inner_s);
    sp.stages = p, sp.replicas = R;
    sp.simulations = c.sims + c.cheap_sims;
    *out = sp;
    st = CDP_OK;
fail:
    ctx_free(&c);
    free(dev);
    free(perm);
    free(rnd);
    return st;
}

void cdp_planner_spread_print(const struct cdp_planner_spread *s, FILE *f)
{
    fprintf(f, "\nPlan: placements explored (%d stages x %d replicas; %d random injective placements, seed %llu; "
               "%s)\n", s->stages, s->replicas, s->n_random, (unsigned long long)s->seed,
            s->cheap ? "one-replica model, large world" : "full simulation");
    fprintf(f, "  random            min %.3f ms  median %.3f ms  max %.3f ms\n", s->min_s * 1e3, s->median_s * 1e3,
            s->max_s * 1e3);
    fprintf(f, "  placement          step ms   random faster\n");
    fprintf(f, "  %-17s %9.3f   %5.1f%%\n", "chosen", s->chosen_s * 1e3, s->chosen_pct);
    fprintf(f, "  %-17s %9.3f   %5.1f%%\n", "ordered-pp-inner", s->pp_inner_s * 1e3, s->pp_inner_pct);
    fprintf(f, "  %-17s %9.3f   %5.1f%%\n", "ordered-dp-inner", s->dp_inner_s * 1e3, s->dp_inner_pct);
}

/* ---- output ---------------------------------------------------------------------- */

cdp_status cdp_planner_apply(const struct cdp_planner_result *r, struct cdp_plan *plan)
{
    struct cdp_parallel_desc *pd = &plan->parallel;
    const int N = r->stages * r->replicas;
    if (!pd->partition || pd->n_partition != r->n_ranges) {
        int64_t(*ranges)[2] = malloc((size_t)r->n_ranges * sizeof *ranges);
        if (!ranges) return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
        memcpy(ranges, r->ranges, (size_t)r->n_ranges * sizeof *ranges);
        free(pd->partition);
        pd->partition = ranges;
        pd->n_partition = r->n_ranges;
    }
    if (pd->placement == CDP_PLACEMENT_TOPOLOGY) {
        int64_t *map = malloc((size_t)N * sizeof *map);
        if (!map) return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
        for (int i = 0; i < N; i++) map[i] = r->device[i];
        free(pd->placement_map);
        pd->placement_map = map;
        pd->placement = CDP_PLACEMENT_EXPLICIT;
    }
    const struct cdp_planner_balance *b = &r->balance;
    int equal = 1;
    for (int i = 1; b->shares && i < r->replicas; i++) equal &= b->shares[i] == b->shares[0];
    if (pd->balance == CDP_BALANCE_SPEED && b->shares && !equal) {
        int64_t *sh = malloc((size_t)r->replicas * sizeof *sh);
        if (!sh) return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
        memcpy(sh, b->shares, (size_t)r->replicas * sizeof *sh);
        free(pd->shares);
        pd->shares = sh;
        pd->n_shares = r->replicas;
        pd->balance = CDP_BALANCE_EXPLICIT;
    }
    pd->stages = r->stages;
    pd->schedule = r->schedule;
    pd->schedule_auto = 0;
    pd->replicas = r->replicas;
    pd->micro_batches = r->micro_batches;
    plan->train.global_batch = r->global_batch;
    return CDP_OK;
}

static void units_of(const struct cdp_planner_result *r, int s, char *buf, size_t cap)
{
    size_t o = 0;
    buf[0] = '\0';
    for (int k = s; k < r->n_ranges && o < cap; k += r->stages)
        o += (size_t)snprintf(buf + o, cap - o, "%s[%lld,%lld)", k == s ? "" : " ", (long long)r->ranges[k][0],
                              (long long)r->ranges[k][1]);
}

static void balance_print(const struct cdp_planner_result *r, FILE *f)
{
    const struct cdp_planner_balance *b = &r->balance;
    const int R = r->replicas;
    fprintf(f, "\nPlan: balance (%s)\n", b->kind == CDP_BALANCE_UNIFORM    ? "uniform, from the plan"
                                          : b->kind == CDP_BALANCE_EXPLICIT ? "shares from the plan"
                                                                            : "speed: shares by predicted speed");
    fprintf(f, "  replica  devices                          ms/micro-batch  micro-batches\n");
    const int show = R > 64 ? 32 : R;
    for (int q = 0; q < show; q++)
        fprintf(f, "  %7d  %-32s %14.3f  %13lld\n", q, b->devices[q], b->t_s[q] * 1e3, (long long)b->shares[q]);
    if (show < R) fprintf(f, "  ... %d more replicas (--json lists them all)\n", R - show);
    fprintf(f, "  step        %.3f ms with these shares, %.3f ms with %d each: %+.1f%%\n", b->step_s * 1e3,
            b->uniform_step_s * 1e3, r->micro_batches, 100 * b->gain);
    char fill[32] = "shares";
    if (r->stages > 1) snprintf(fill, sizeof fill, "(shares + %d)", r->stages - 1);
    fprintf(f, "              (max over replicas of %s x ms/micro-batch, + %.3f ms all-reduce and optimizer "
               "simulated)\n", fill, b->rest_s * 1e3);
}

void cdp_planner_print(const struct cdp_planner_result *r, FILE *f)
{
    const int N = r->stages * r->replicas;
    fprintf(f, "\nPlan (predicted on %s, %d devices usable)\n", r->topology, r->world);
    fprintf(f, "  shape       %d stage%s x %d replica%s, %d micro-batches, %s", r->stages, r->stages == 1 ? "" : "s",
            r->replicas, r->replicas == 1 ? "" : "s", r->micro_batches, cdp_schedule_name(r->schedule));
    if (r->chunks > 1) fprintf(f, " x %d chunks", r->chunks);
    fprintf(f, ", global batch %lld\n", (long long)r->global_batch);
    fprintf(f, "\nPlan: partition (per micro-batch)\n  stage  units            fwd ms   bwd ms     memory   headroom\n");
    for (int s = 0; s < r->stages; s++) {
        char units[128], head[32] = "unlimited";
        units_of(r, s, units, sizeof units);
        const struct cdp_planner_stage *st = &r->stage[s];
        if (st->capacity_bytes > 0)
            snprintf(head, sizeof head, "%.2f GiB", (st->capacity_bytes - st->memory_bytes) / 1073741824.0);
        fprintf(f, "  %5d  %-15s %8.3f %8.3f %7.2f GiB  %s\n", s, units, st->fwd_s * 1e3, st->bwd_s * 1e3,
                st->memory_bytes / 1073741824.0, head);
    }
    fprintf(f, "\nPlan: placement (%s)\n  rank  node  gpu  device  stage  replica\n", r->placement_method);
    const int show = N > 64 ? 32 : N;
    for (int i = 0; i < show; i++)
        fprintf(f, "  %4d  %4d  %3d  %6d  %5d  %7d\n", r->rank[i].rank, r->rank[i].node, r->rank[i].gpu,
                r->rank[i].device, r->rank[i].stage, r->rank[i].replica);
    if (show < N) fprintf(f, "  ... %d more ranks (--json lists them all)\n", N - show);
    fprintf(f, "\nPlan: predicted\n");
    fprintf(f, "  step time   %.3f ms\n", r->predicted.step_s * 1e3);
    fprintf(f, "  throughput  %.1f samples/s\n", r->predicted.samples_per_s);
    fprintf(f, "  bubble      %.2f%%\n", 100 * r->predicted.bubble);
    if (r->replicas > 1 && r->balance.shares) balance_print(r, f);
    fprintf(f, "\nPlan: baselines (same shape and partition)\n  order              step ms    samples/s   vs chosen\n");
    for (int i = 0; i < 2; i++)
        fprintf(f, "  %-17s %9.3f %12.1f   %+.1f%%\n", r->baseline[i].name, r->baseline[i].pred.step_s * 1e3,
                r->baseline[i].pred.samples_per_s,
                100 * (r->baseline[i].pred.step_s / r->predicted.step_s - 1));
    fprintf(f, "\nPlan: searched %lld shapes (%lld fit), %lld placed, %lld simulations", (long long)r->shapes,
            (long long)r->feasible, (long long)r->placed_shapes, (long long)r->simulations);
    if (r->replica_simulations)
        fprintf(f, " + %lld of one replica (large world: docs/planner.md)", (long long)r->replica_simulations);
    fprintf(f, " in %.3f s\n", r->search_s);
}

static json_t *pred_json(const struct cdp_planner_prediction *p)
{
    return json_pack("{s:f,s:f,s:f}", "step_s", p->step_s, "bubble", p->bubble, "samples_per_s", p->samples_per_s);
}

json_t *cdp_planner_to_json(const struct cdp_planner_result *r)
{
    const int N = r->stages * r->replicas;
    json_t *o = json_object(), *stages = json_array(), *pl = json_array(), *mem = json_array(),
           *base = json_object();
    for (int s = 0; s < r->stages; s++) {
        json_t *ch = json_array();
        for (int k = s; k < r->n_ranges; k += r->stages)
            json_array_append_new(ch, json_pack("[I,I]", (json_int_t)r->ranges[k][0], (json_int_t)r->ranges[k][1]));
        json_t *st = json_pack("{s:i}", "index", s);
        if (r->chunks == 1) json_object_set(st, "layers", json_array_get(ch, 0));
        else json_object_set(st, "chunks", ch);
        json_decref(ch);
        json_object_set_new(st, "fwd_s", json_real(r->stage[s].fwd_s));
        json_object_set_new(st, "bwd_s", json_real(r->stage[s].bwd_s));
        json_object_set_new(st, "memory_bytes", json_real(r->stage[s].memory_bytes));
        json_object_set_new(st, "headroom_bytes", r->stage[s].capacity_bytes > 0
                                                       ? json_real(r->stage[s].capacity_bytes - r->stage[s].memory_bytes)
                                                       : json_null());
        json_array_append_new(stages, st);
    }
    for (int i = 0; i < N; i++) {
        const struct cdp_planner_rank *k = &r->rank[i];
        json_array_append_new(pl, json_pack("{s:i,s:i,s:i,s:i,s:i,s:i}", "rank", k->rank, "stage", k->stage,
                                            "replica", k->replica, "node", k->node, "gpu", k->gpu, "device",
                                            k->device));
        json_array_append_new(mem, json_real(k->peak_memory));
    }
    json_t *pr = pred_json(&r->predicted);
    json_object_set_new(pr, "peak_memory_bytes", mem);
    for (int i = 0; i < 2; i++) json_object_set_new(base, r->baseline[i].name, pred_json(&r->baseline[i].pred));
    json_object_set_new(o, "stages", stages);
    json_object_set_new(o, "placement", pl);
    json_object_set_new(o, "predicted", pr);
    if (r->balance.shares) {
        const struct cdp_planner_balance *b = &r->balance;
        json_t *sh = json_array(), *ts = json_array(), *dv = json_array();
        for (int q = 0; q < r->replicas; q++) {
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
