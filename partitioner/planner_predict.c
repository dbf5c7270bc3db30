/* The planner's step prediction: a candidate's virtual stages for the
 * simulator, the full simulation (memoised by shape and devices), a layout
 * simulated with ranks sharing processors, and the cheap one-replica model of
 * large worlds (docs/planner.md, "Large worlds"). */
#include "partitioner/planner.h"
#include "partitioner/planner_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "core/hash.h"
#include "model/costs.h"
#include "model/layers.h"
#include "model/model.h"
#include "model/optim.h"
#include "partitioner/host.h"
#include "partitioner/partition.h"
#include "partitioner/placement.h"
#include "pipeline/balance.h"
#include "pipeline/schedule.h"
#include "plan/schedule_kind.h"

/* The executor's gradient buckets of a virtual stage (pipeline/run/exec_buckets.c):
 * whole units from the last down, at most cap bytes (a larger unit alone),
 * each ready when its lowest unit's backward is done; more than the
 * simulator's CDP_SIM_MAX_BUCKETS merge into the last. A unit holding a tied
 * embedding, which the executor reduces at ALLREDUCE_GRADS, is not told apart
 * here. */
static void buckets_of(const struct cdp_unit_cost *cost, int64_t first, int64_t end, double cap,
                       struct cdp_sim_vstage *o)
{
    double open = 0, done_s = 0;
    o->n_buckets = 0;
    if (cap <= 0 || o->grad_bytes <= 0 || o->bwd_s <= 0) return;
    for (int64_t i = end - 1; i >= first; i--) {
        const double b = cost[i].param_bytes;
        done_s += cost[i].bwd_s;
        if (b <= 0) continue;
        int k = o->n_buckets;
        if (k > 0 && open + b <= cap) {
            open += b;
            o->bucket_share[k - 1] += b / o->grad_bytes;
            o->bucket_ready[k - 1] = done_s / o->bwd_s;
            continue;
        }
        if (k == CDP_SIM_MAX_BUCKETS) k--, o->n_buckets--;
        o->bucket_share[k] += b / o->grad_bytes;
        o->bucket_ready[k] = done_s / o->bwd_s;
        o->n_buckets++;
        open = b;
    }
    if (o->n_buckets) o->bucket_ready[o->n_buckets - 1] = 1;
}

static void vstages_of(const struct cdp_unit_cost *cost, int nv, const int64_t (*ranges)[2], double bucket_bytes,
                       struct cdp_sim_vstage *vs)
{
    for (int k = 0; k < nv; k++) {
        struct cdp_sim_vstage *o = &vs[k];
        memset(o, 0, sizeof *o);
        for (int64_t i = ranges[k][0]; i < ranges[k][1]; i++) {
            o->fwd_s += cost[i].fwd_s;
            o->bwd_s += cost[i].bwd_s;
            o->bwd_w_s += cost[i].bwd_w_s;
            o->grad_bytes += cost[i].param_bytes;
            o->opt_s += cost[i].opt_s;
            o->tp_fwd_s += cost[i].tp_fwd_s;
            o->tp_bwd_s += cost[i].tp_bwd_s;
            o->tp_fwd_bytes += cost[i].tp_fwd_bytes;
            o->tp_bwd_bytes += cost[i].tp_bwd_bytes;
        }
        if (ranges[k][1] > ranges[k][0]) o->out_bytes = cost[ranges[k][1] - 1].out_bytes;
        buckets_of(cost, ranges[k][0], ranges[k][1], bucket_bytes, o);
    }
}

int cdp_planner_tied_model(const struct cdp_plan *plan)
{
    return cdp_model_ties_embeddings(&plan->model);
}

double cdp_planner_reduce_scale(const struct cdp_plan *plan)
{
    return cdp_cost_grad_comm_bytes_per_param(plan) / cdp_cost_grad_bytes_per_param(plan);
}

static cdp_status sim_procs(struct ctx *c, const struct cdp_schedule *sched, const int *device, const int *trace_rank,
                            const int *proc, struct cdp_sim_result **out)
{
    const int tied = cdp_planner_tied_model(c->plan) && c->p * c->v > 1;
    struct cdp_sim_config sc = {.sched = sched, .replicas = c->R, .vstage = c->vs,
                                .tied_bytes = tied ? c->tied_bytes : 0, .device = device, .n_devices = c->nd,
                                .bandwidth = c->bw, .latency = c->lat,
                                .samples_per_mb = (double)c->plan->train.micro_batch, .trace_rank = trace_rank,
                                .proc = proc, .zero = c->R > 1 ? c->zero : 0, .tensor = c->tp,
                                .node = c->node, .reduce_scale = cdp_planner_reduce_scale(c->plan)};
    c->sims++;
    return cdp_sim_run(&sc, out);
}

cdp_status cdp_planner_sim(struct ctx *c, const int *device, const int *trace_rank, struct cdp_sim_result **out)
{
    return sim_procs(c, c->sched, device, trace_rank, NULL, out);
}

/* Whether ranks q and k of layout l run on the same processor: the same GPU
 * on cuda, the same CPU set on the cpu backend. */
static int same_processor(const struct cdp_layout *l, const struct cdp_layout_rank *q,
                          const struct cdp_layout_rank *k)
{
    return cdp_backend_is_gpu(l->backend) ? q->node == k->node && q->gpu == k->gpu
                                          : q->node == k->node && k->cpuset[0] && !strcmp(q->cpuset, k->cpuset);
}

/* Whether some ranks of a layout share a processor. */
int cdp_planner_layout_shares_processors(const struct cdp_layout *l)
{
    for (int i = 0; i < l->n_ranks; i++)
        for (int j = 0; j < i; j++)
            if (same_processor(l, &l->rank[j], &l->rank[i])) return 1;
    return 0;
}

/* A layout's step on the simulator: its devices, a trace row per world rank,
 * and ranks that share a processor sharing its time (the same CPU set on the
 * cpu backend, the same GPU on cuda). c is prepared for the layout's shape. */
cdp_status cdp_planner_simulate_layout(struct ctx *c, const struct cdp_layout *l, struct cdp_sim_result **out)
{
    const int N = l->n_ranks;
    int *device = malloc((size_t)N * sizeof *device), *row = malloc((size_t)N * sizeof *row);
    int *proc = malloc((size_t)N * sizeof *proc);
    cdp_status st = !device || !row || !proc ? cdp_fail(CDP_ERR_NOMEM, "planner: out of memory") : CDP_OK;
    /* a tensor group is simulated as its first rank (index 0), the group's
     * collectives not yet among the simulator's events */
    for (int i = 0; !st && i < N; i++) {
        const struct cdp_layout_rank *k = &l->rank[i];
        if (k->tensor) continue;
        const int sr = k->stage * l->replicas + k->replica;
        device[sr] = k->device;
        row[sr] = i;
        proc[sr] = sr;
        /* the first rank with the same processor names it */
        for (int j = 0; j < i; j++) {
            const struct cdp_layout_rank *q = &l->rank[j];
            if (!q->tensor && same_processor(l, q, k)) {
                proc[sr] = q->stage * l->replicas + q->replica;
                break;
            }
        }
    }
    if (!st) st = sim_procs(c, c->sched, device, row, proc, out);
    free(device);
    free(row);
    free(proc);
    return st;
}

/* The key of what the simulator is given besides the devices: the prepared
 * shape (sizes, schedule, recompute mode, every virtual stage's costs). */
static uint64_t shape_key(const struct ctx *c)
{
    uint64_t h = 1469598103934665603ull;
    const int head[7] = {c->p, c->R, c->m, c->v, (int)c->kind, (int)c->rc, c->zero};
    const unsigned char *b = (const unsigned char *)head;
    for (size_t q = 0; q < sizeof head; q++) h = (h ^ b[q]) * 1099511628211ull;
    b = (const unsigned char *)c->vs;
    for (size_t q = 0; q < (size_t)c->p * c->v * sizeof *c->vs; q++) h = (h ^ b[q]) * 1099511628211ull;
    return h;
}

/* The numbers of a full simulation of the prepared shape on device (p*R, by
 * (s, r)), every rank on a processor of its own: computed once per shape and
 * devices (the placement search's last look, the chosen layout, a baseline
 * that is the chosen placement are the same simulation). */
cdp_status cdp_planner_sim_numbers(struct ctx *c, const int *device, struct cdp_planner_prediction *pred, double *phase)
{
    const int N = c->p * c->R;
    const uint64_t key = shape_key(c);
    for (int i = 0; i < c->n_memo; i++)
        if (c->memo[i].key == key && !memcmp(c->memo[i].device, device, (size_t)N * sizeof *device)) {
            *pred = c->memo[i].pred;
            *phase = c->memo[i].phase_s;
            return CDP_OK;
        }
    struct cdp_sim_result *r = NULL;
    cdp_status st = cdp_planner_sim(c, device, NULL, &r);
    if (st) return st;
    *pred = (struct cdp_planner_prediction){r->step_s, r->bubble, r->samples_per_s};
    *phase = r->phase_s;
    cdp_sim_result_free(r);
    const int slot = c->n_memo < (int)(sizeof c->memo / sizeof c->memo[0]) ? c->n_memo++ : -1;
    if (slot >= 0) {
        struct sim_memo *m = &c->memo[slot];
        if (!(m->device = malloc((size_t)N * sizeof *device))) {
            c->n_memo--;
            return CDP_OK;
        }
        memcpy(m->device, device, (size_t)N * sizeof *device);
        m->key = key;
        m->pred = *pred;
        m->phase_s = *phase;
    }
    return CDP_OK;
}

/* The step at m micro-batches from the steps at lin_m[0] and lin_m[1]: the
 * line through them (lin_schedules, below). */
static double lin_step(const struct ctx *c, const double at[2])
{
    return at[1] + (at[1] - at[0]) * (c->m - c->lin_m[1]) / (double)(c->lin_m[1] - c->lin_m[0]);
}

/* The cheap model (docs/planner.md, "Large worlds"): every replica's pipeline
 * simulated alone (R = 1; replicas whose stage-to-stage links are the same are
 * simulated once), the slowest taken, plus the data-parallel ring all-reduce
 * of each stage in closed form as the simulator computes it (2(R-1)/R x the
 * stage's gradient bytes over the ring's slowest link + 2(R-1) latencies of its
 * slowest hop), the largest over stages added after the forward/backward
 * phase. Ignores links shared by transfers of different replicas. */
cdp_status cdp_planner_cheap_step(struct ctx *c, const int *device, int all, double *step)
{
    const int p = c->p, R = c->R, nk = 4 * (p - 1) + 1;
    const int tied = cdp_planner_tied_model(c->plan) && p * c->v > 1;
    double slowest = 0;
    int r_lo = 0, r_hi = R;
    if (!all) { /* screening: only the replica whose stage-to-stage transfers take longest alone */
        double worst = -1;
        for (int r = 0; r < R; r++) {
            double t = 0;
            for (int k = 0; k + 1 < p * c->v; k++) {
                int sa, sb, ca, cb;
                cdp_schedule_vstage_place(c->kind, p, c->v, k, &sa, &ca);
                cdp_schedule_vstage_place(c->kind, p, c->v, k + 1, &sb, &cb);
                const int a = device[sa * R + r], b = device[sb * R + r];
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
            double *ks = realloc(c->key_val, (size_t)cap * sizeof *ks);
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
        for (size_t q = 0; q < (size_t)nk * sizeof *key; q++)
            h = (h ^ ((const unsigned char *)key)[q]) * 1099511628211ull;
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
            /* a long pipeline: two shorter ones, the step linear in m past them */
            double at[2] = {0, 0};
            for (int q = 0; q < (c->lin_sched[0] ? 2 : 1); q++) {
                struct cdp_sim_result *sr = NULL;
                if (c->lin_sched[0]) sc.sched = c->lin_sched[q];
                c->cheap_sims++;
                cdp_status st = cdp_sim_run(&sc, &sr);
                if (st) return st;
                at[q] = sr->step_s;
                cdp_sim_result_free(sr);
            }
            c->key_val[j] = c->lin_sched[0] ? lin_step(c, at) : at[0];
            c->key_hash[j] = h;
            c->n_keys++;
        }
        slowest = fmax(slowest, c->key_val[j]);
    }
    double ar = 0;
    for (int s = 0; s < p && R > 1; s++) {
        double bytes = 0, min_bw = INFINITY, max_lat = 0;
        for (int ch = 0; ch < c->v; ch++) bytes += c->vs[cdp_schedule_vstage(c->kind, p, c->v, s, ch)].grad_bytes;
        for (int r = 0; r < R; r++) {
            const int a = device[s * R + r], b = device[s * R + (r + 1) % R];
            if (a == b) continue;
            if (c->bw[a * c->nd + b] > 0) min_bw = fmin(min_bw, c->bw[a * c->nd + b]);
            max_lat = fmax(max_lat, c->lat[a * c->nd + b]);
        }
        /* ZeRO-2: a reduce-scatter after each backward, an all-gather after the step */
        const double k = cdp_planner_reduce_scale(c->plan);
        const double rounds = c->zero >= 2 ? (double)c->m * c->v + 1 : 2;
        const double moved = (R - 1.0) / R *
                             (c->zero >= 2 ? (double)c->m * c->v * k * bytes + bytes
                                           : 2 * cdp_sim_step_collective_bytes(bytes, c->zero, k));
        ar = fmax(ar, (isinf(min_bw) ? 0 : moved / min_bw) + rounds * (R - 1) * max_lat);
    }
    *step = slowest + ar;
    return CDP_OK;
}

double cdp_planner_place_cost(const int *device, void *vctx)
{
    struct ctx *c = vctx;
    if (c->cheap) {
        double s;
        return cdp_planner_cheap_step(c, device, 1, &s) ? NAN : s;
    }
    struct cdp_sim_result *r = NULL;
    if (cdp_planner_sim(c, device, NULL, &r)) return NAN;
    double s = r->step_s;
    cdp_sim_result_free(r);
    return s;
}

/* A pipeline of m micro-batches: past the fill (2p, 3p: multiples of p, as
 * interleaved needs, and past zbv's 2p - 2) every further micro-batch adds the
 * slowest stage's period, so the step is linear in m and two simulations at 2p
 * and 3p give it; the cheap model's pipelines of one replica and the placement
 * search of a small world then no longer cost in proportion to m
 * (docs/planner.md, "Large worlds", "Long pipelines"). These are the two
 * shorter runs' schedules; none where m <= 4p or the plan gives the schedule
 * as a file. */
static cdp_status lin_schedules(struct ctx *c)
{
    const int p = c->p, tied = cdp_planner_tied_model(c->plan) && p * c->v > 1;
    cdp_status st = CDP_OK;
    if (c->lin_sched[0] || c->plan->parallel.schedule_file || c->m <= 4 * p) return CDP_OK;
    c->lin_m[0] = 2 * p;
    c->lin_m[1] = 3 * p;
    for (int q = 0; q < 2 && !st; q++)
        st = cdp_schedule_for_plan(c->plan, c->kind, p, c->v, c->lin_m[q], tied, 0, &c->lin_sched[q]);
    if (st) {
        cdp_schedule_free(c->lin_sched[0]);
        c->lin_sched[0] = NULL;
    }
    return st;
}

/* The placement search's objective: cdp_planner_place_cost, but a long
 * pipeline of a small world (m >= 10p: the two short runs simulate at most
 * half its micro-batches) is simulated in full at lin_m[0] and lin_m[1]
 * micro-batches and its step extrapolated to m, as the cheap model does for
 * one replica: the search ranks placements on the steady state, and the
 * placement it returns is then simulated in full at m (place_best). */
double cdp_planner_search_cost(const int *device, void *vctx)
{
    struct ctx *c = vctx;
    if (c->cheap || c->m < 10 * c->p) return cdp_planner_place_cost(device, vctx);
    if (lin_schedules(c)) return NAN;
    if (!c->lin_sched[0]) return cdp_planner_place_cost(device, vctx);
    double at[2];
    for (int q = 0; q < 2; q++) {
        struct cdp_sim_result *r = NULL;
        if (sim_procs(c, c->lin_sched[q], device, NULL, NULL, &r)) return NAN;
        at[q] = r->step_s;
        cdp_sim_result_free(r);
    }
    return lin_step(c, at);
}

/* Prepares c->sched and c->vs for (p, R, m) and ranges. */
cdp_status cdp_planner_prepare(struct ctx *c, int p, int R, int m, const int64_t (*ranges)[2])
{
    const int tied = cdp_planner_tied_model(c->plan) && p * c->v > 1;
    cdp_schedule_free(c->sched);
    cdp_schedule_free(c->lin_sched[0]);
    cdp_schedule_free(c->lin_sched[1]);
    c->sched = c->lin_sched[0] = c->lin_sched[1] = NULL;
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
    /* the executor's buckets (the one rule: cdp_plan_bucket_bytes) */
    const double bucket = cdp_plan_bucket_bytes(c->plan, R, c->zero);
    vstages_of(c->cost, p * c->v, ranges, bucket, c->vs);
    cdp_status st = cdp_schedule_for_plan(c->plan, c->kind, p, c->v, m, tied, 0, &c->sched);
    /* the cheap model extrapolates long pipelines from the start; a small
     * world's placement search asks for them (cdp_planner_search_cost) */
    if (!st && c->cheap) st = lin_schedules(c);
    return st;
}
