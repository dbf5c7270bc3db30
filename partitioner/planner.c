/* The planner (docs/planner.md): a bounded search over the plan's "auto"
 * values, each candidate split by the memory-aware partition (on the memory the
 * executor allocates) and predicted by the simulator, the best few placed by
 * the placement search; the answer is one layout (pipeline/layout.h) with
 * every rank's node, device, CPU set and memory. */
#include "partitioner/planner.h"

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

/* ---- costs and links --------------------------------------------------------------- */

/* The executor's gradient buckets of a virtual stage (pipeline/exec_buckets.c):
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
        }
        if (ranges[k][1] > ranges[k][0]) o->out_bytes = cost[ranges[k][1] - 1].out_bytes;
        buckets_of(cost, ranges[k][0], ranges[k][1], bucket_bytes, o);
    }
}

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

/* REDUCE_TIED_GRADS payload of a GPT with tied embeddings. */
static double tied_bytes_of(const struct cdp_plan *plan, const struct cdp_unit *u, int n)
{
    double b = 0;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < u[i].n_params; k++)
            if (u[i].params[k].tied_unit >= 0) b += (double)u[i].params[k].numel * cdp_cost_grad_bytes_per_param(plan);
    return b;
}

static int tied_model(const struct cdp_plan *plan)
{
    return cdp_model_ties_embeddings(&plan->model);
}

/* ---- memory of unit ranges in O(1): prefix sums and range maxima ----------------------------- */

struct mem_index {
    int n, levels;
    struct cdp_unit_bytes *ub;   /* n */
    uint64_t *held, *win;        /* n + 1 prefix sums */
    unsigned __int128 *act;      /* n + 1 prefix sums: each unit's below 2^62, their sum may pass 2^64 */
    unsigned __int128 *wst;      /* n + 1 prefix sums of wstate_bytes (split backward's W-state) */
    uint64_t *scr, *io, *wrk, *wmx; /* levels x n sparse tables of maxima */
    int n_ties;
    int *tie_unit, *tie_owner;   /* units with a tied parameter and its owner */
    uint64_t *tie_floats;
};

static void mem_index_free(struct mem_index *m)
{
    free(m->ub);
    free(m->held);
    free(m->act);
    free(m->wst);
    free(m->scr);
    free(m->io);
    free(m->wrk);
    free(m->win);
    free(m->wmx);
    free(m->tie_unit);
    free(m->tie_owner);
    free(m->tie_floats);
    memset(m, 0, sizeof *m);
}

static cdp_status mem_index_build(struct mem_index *m, const struct cdp_plan *plan, const struct cdp_unit *u, int n)
{
    const enum cdp_loss loss = cdp_model_loss_of(&plan->model);
    const int B = (int)plan->train.micro_batch;
    int levels = 1;
    while ((1 << levels) <= n) levels++;
    m->n = n;
    m->levels = levels;
    m->ub = calloc((size_t)n, sizeof *m->ub);
    m->held = calloc((size_t)n + 1, sizeof *m->held);
    m->act = calloc((size_t)n + 1, sizeof *m->act);
    m->wst = calloc((size_t)n + 1, sizeof *m->wst);
    m->scr = calloc((size_t)levels * n, sizeof *m->scr);
    m->io = calloc((size_t)levels * n, sizeof *m->io);
    m->wrk = calloc((size_t)levels * n, sizeof *m->wrk);
    m->win = calloc((size_t)n + 1, sizeof *m->win);
    m->wmx = calloc((size_t)levels * n, sizeof *m->wmx);
    m->tie_unit = calloc((size_t)n, sizeof *m->tie_unit);
    m->tie_owner = calloc((size_t)n, sizeof *m->tie_owner);
    m->tie_floats = calloc((size_t)n, sizeof *m->tie_floats);
    if (!m->ub || !m->held || !m->act || !m->wst || !m->scr || !m->io || !m->wrk || !m->win || !m->wmx || !m->tie_unit ||
        !m->tie_owner || !m->tie_floats)
        return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
    for (int i = 0; i < n; i++) {
        cdp_unit_bytes(&u[i], B, loss, &m->ub[i]);
        m->held[i + 1] = m->held[i] + m->ub[i].held_floats;
        m->act[i + 1] = m->act[i] + m->ub[i].act_bytes;
        m->wst[i + 1] = m->wst[i] + m->ub[i].wstate_bytes;
        m->scr[i] = m->ub[i].scratch_bytes;
        m->io[i] = m->ub[i].io_bytes;
        m->wrk[i] = m->ub[i].work_bytes;
        m->win[i + 1] = m->win[i] + m->ub[i].window_floats;
        m->wmx[i] = m->ub[i].window_floats;
        if (m->ub[i].tied_owner >= 0) {
            m->tie_unit[m->n_ties] = i;
            m->tie_owner[m->n_ties] = m->ub[i].tied_owner;
            m->tie_floats[m->n_ties++] = m->ub[i].tied_floats;
        }
    }
    for (int l = 1; l < levels; l++)
        for (int i = 0; i + (1 << l) <= n; i++) {
            const uint64_t *ps = m->scr + (size_t)(l - 1) * n, *pi = m->io + (size_t)(l - 1) * n,
                           *pw = m->wrk + (size_t)(l - 1) * n, *px = m->wmx + (size_t)(l - 1) * n;
            const int h = 1 << (l - 1);
            m->scr[(size_t)l * n + i] = ps[i] > ps[i + h] ? ps[i] : ps[i + h];
            m->io[(size_t)l * n + i] = pi[i] > pi[i + h] ? pi[i] : pi[i + h];
            m->wrk[(size_t)l * n + i] = pw[i] > pw[i + h] ? pw[i] : pw[i + h];
            m->wmx[(size_t)l * n + i] = px[i] > px[i + h] ? px[i] : px[i + h];
        }
    return CDP_OK;
}

/* The terms of units [first, end), as cdp_range_terms_add over them gives. */
static void mem_terms(const struct mem_index *m, int first, int end, struct cdp_range_terms *t, uint64_t *shared,
                      uint64_t *wstate)
{
    const unsigned __int128 w = m->wst[end] - m->wst[first];
    *wstate = w > UINT64_MAX ? UINT64_MAX : (uint64_t)w;
    int l = 0;
    while ((2 << l) <= end - first) l++;
    const size_t a = (size_t)l * m->n + first, b = (size_t)l * m->n + (size_t)(end - (1 << l));
    t->held_floats = m->held[end] - m->held[first];
    const unsigned __int128 act = m->act[end] - m->act[first];
    t->act_bytes = act > UINT64_MAX ? UINT64_MAX : (uint64_t)act; /* as cdp_range_terms_add saturates */
    t->scratch_bytes = m->scr[a] > m->scr[b] ? m->scr[a] : m->scr[b];
    t->io_bytes = m->io[a] > m->io[b] ? m->io[a] : m->io[b];
    t->work_bytes = m->wrk[a] > m->wrk[b] ? m->wrk[a] : m->wrk[b];
    t->window_sum = m->win[end] - m->win[first];
    t->window_max = m->wmx[a] > m->wmx[b] ? m->wmx[a] : m->wmx[b];
    *shared = 0;
    for (int k = 0; k < m->n_ties; k++)
        if (m->tie_unit[k] >= first && m->tie_unit[k] < end && m->tie_owner[k] >= first && m->tie_owner[k] < end)
            *shared += m->tie_floats[k];
}

/* ---- the search ------------------------------------------------------------------ */

struct cand {
    int p, R, m;
    enum cdp_schedule_kind kind;
    enum cdp_recompute rc;
    int zero;
    int64_t (*ranges)[2]; /* p*v */
    double step_s, sps;   /* with the screening placement */
    double peak;          /* the largest rank's device bytes */
};

struct ctx {
    const struct cdp_plan *plan;
    const struct cdp_topology *t;
    int n, nd, v, hv;
    enum cdp_schedule_kind kind;
    /* per recompute mode: the plan's units (attention state as the backend
     * keeps it, activations as the mode keeps them), their costs and memory */
    struct {
        struct cdp_unit *u;
        struct cdp_unit_cost *cost;
        struct mem_index mi;
    } mode[CDP_RECOMPUTE_COUNT];
    enum cdp_recompute rc; /* the mode of u, cost and mi (use_mode) */
    int zero;              /* the candidate's ZeRO stage, 0, 1 or 2 (its replicas > 1) */
    struct cdp_unit *u;
    struct cdp_unit_cost *cost;
    struct mem_index *mi;
    double *bw, *lat;
    double cap;        /* bytes per device; 0 unlimited */
    double tied_bytes; /* of the model; used when p*v > 1 */
    int64_t sims, cheap_sims;
    int cheap;         /* 1: screen and place on the one-replica model (large worlds) */
    int *rdev;         /* p: devices of one replica (cheap model scratch) */
    double *keys;      /* cheap model cache: link signature of each distinct replica pipeline */
    double *key_val;   /* its step time */
    uint64_t *key_hash;
    int n_keys, cap_keys;
    double *lbw, *llat; /* p*p: links among one replica's devices */
    /* full simulations' numbers, by shape and devices (place_best, finish) */
    struct sim_memo {
        uint64_t key;
        int *device; /* p*R */
        struct cdp_planner_prediction pred;
        double phase_s;
    } memo[CDP_PLANNER_PLACED_SHAPES + 3];
    int n_memo;
    /* the candidate being simulated */
    int p, R, m;
    struct cdp_schedule *sched;
    struct cdp_sim_vstage *vs;
    int *slots;        /* 2p: activation slots of each stage (the partition's memory), then its W-state slots */
};

static cdp_status sim_procs(struct ctx *c, const int *device, const int *trace_rank, const int *proc,
                            struct cdp_sim_result **out)
{
    const int tied = tied_model(c->plan) && c->p * c->v > 1;
    struct cdp_sim_config sc = {.sched = c->sched, .replicas = c->R, .vstage = c->vs,
                                .tied_bytes = tied ? c->tied_bytes : 0, .device = device, .n_devices = c->nd,
                                .bandwidth = c->bw, .latency = c->lat,
                                .samples_per_mb = (double)c->plan->train.micro_batch, .trace_rank = trace_rank,
                                .proc = proc, .zero = c->R > 1 ? c->zero : 0};
    c->sims++;
    return cdp_sim_run(&sc, out);
}

static cdp_status sim(struct ctx *c, const int *device, const int *trace_rank, struct cdp_sim_result **out)
{
    return sim_procs(c, device, trace_rank, NULL, out);
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
static int layout_shares_processors(const struct cdp_layout *l)
{
    for (int i = 0; i < l->n_ranks; i++)
        for (int j = 0; j < i; j++)
            if (same_processor(l, &l->rank[j], &l->rank[i])) return 1;
    return 0;
}

/* A layout's step on the simulator: its devices, a trace row per world rank,
 * and ranks that share a processor sharing its time (the same CPU set on the
 * cpu backend, the same GPU on cuda). c is prepared for the layout's shape. */
static cdp_status simulate_layout(struct ctx *c, const struct cdp_layout *l, struct cdp_sim_result **out)
{
    const int N = l->n_ranks;
    int *device = malloc((size_t)N * sizeof *device), *row = malloc((size_t)N * sizeof *row);
    int *proc = malloc((size_t)N * sizeof *proc);
    cdp_status st = !device || !row || !proc ? cdp_fail(CDP_ERR_NOMEM, "planner: out of memory") : CDP_OK;
    for (int i = 0; !st && i < N; i++) {
        const struct cdp_layout_rank *k = &l->rank[i];
        const int sr = k->stage * l->replicas + k->replica;
        device[sr] = k->device;
        row[sr] = i;
        proc[sr] = sr;
        /* the first rank with the same processor names it */
        for (int j = 0; j < i; j++) {
            const struct cdp_layout_rank *q = &l->rank[j];
            if (same_processor(l, q, k)) {
                proc[sr] = q->stage * l->replicas + q->replica;
                break;
            }
        }
    }
    if (!st) st = sim_procs(c, device, row, proc, out);
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
static cdp_status sim_numbers(struct ctx *c, const int *device, struct cdp_planner_prediction *pred, double *phase)
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
    cdp_status st = sim(c, device, NULL, &r);
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

/* The cheap model (docs/planner.md, "Large worlds"): every replica's pipeline
 * simulated alone (R = 1; replicas whose stage-to-stage links are the same are
 * simulated once), the slowest taken, plus the data-parallel ring all-reduce
 * of each stage in closed form as the simulator computes it (2(R-1)/R x the
 * stage's gradient bytes over the ring's slowest link + 2(R-1) latencies of its
 * slowest hop), the largest over stages added after the forward/backward
 * phase. Ignores links shared by transfers of different replicas. */
static cdp_status cheap_step(struct ctx *c, const int *device, int all, double *step)
{
    const int p = c->p, R = c->R, nk = 4 * (p - 1) + 1;
    const int tied = tied_model(c->plan) && p * c->v > 1;
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
            struct cdp_sim_result *sr = NULL;
            c->cheap_sims++;
            cdp_status st = cdp_sim_run(&sc, &sr);
            if (st) return st;
            c->key_val[j] = sr->step_s;
            c->key_hash[j] = h;
            c->n_keys++;
            cdp_sim_result_free(sr);
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
        const double rounds = c->zero >= 2 ? (double)c->m * c->v + 1 : 2, moved = rounds * (R - 1) / R * bytes;
        ar = fmax(ar, (isinf(min_bw) ? 0 : moved / min_bw) + rounds * (R - 1) * max_lat);
    }
    *step = slowest + ar;
    return CDP_OK;
}

static double place_cost(const int *device, void *vctx)
{
    struct ctx *c = vctx;
    if (c->cheap) {
        double s;
        return cheap_step(c, device, 1, &s) ? NAN : s;
    }
    struct cdp_sim_result *r = NULL;
    if (sim(c, device, NULL, &r)) return NAN;
    double s = r->step_s;
    cdp_sim_result_free(r);
    return s;
}

/* Prepares c->sched and c->vs for (p, R, m) and ranges. */
static cdp_status prepare(struct ctx *c, int p, int R, int m, const int64_t (*ranges)[2])
{
    const int tied = tied_model(c->plan) && p * c->v > 1;
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
    /* the executor's buckets (the one rule: cdp_plan_bucket_bytes) */
    const double bucket = cdp_plan_bucket_bytes(c->plan, R, c->zero);
    vstages_of(c->cost, p * c->v, ranges, bucket, c->vs);
    return cdp_schedule_for_plan(c->plan, c->kind, p, c->v, m, tied, 0, &c->sched);
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

/* The least memory cap of the devices a layout may use (0: unknown). */
static uint64_t device_cap(const struct cdp_plan *plan, const struct cdp_topology *t, int d)
{
    uint64_t cap = t->gpus[d].memory_bytes;
    if (plan->cluster.device_memory && (!cap || plan->cluster.device_memory < cap)) cap = plan->cluster.device_memory;
    return cap;
}

/* The memory of stage s in the partition's search: the chunk the executor
 * builds for [first, end) with the stage's slots (one chunk per stage). */
static double part_memory(void *vc, int s, int first, int end)
{
    const struct ctx *c = vc;
    struct cdp_range_terms t;
    uint64_t shared, wstate;
    mem_terms(c->mi, first, end, &t, &shared, &wstate);
    struct cdp_rank_memory m;
    /* ZeRO: the largest shard, the first */
    cdp_layout_chunk_memory(c->plan, &t, shared, &c->mi->ub[first], &c->mi->ub[end - 1], end == c->n, s, c->p,
                            c->slots[s], wstate, c->slots[c->p + s], c->hv, c->R > 1 ? c->zero : 0, c->R, 0, &m);
    return (double)m.device;
}

/* A layout of the candidate (p, R, m) with uniform shares, ranges, ranks in
 * (s, r) order on the given devices; memory not yet computed. */
static cdp_status candidate_layout(const struct ctx *c, int p, int R, int m, const int64_t (*ranges)[2],
                                   const int *device, struct cdp_layout **out)
{
    struct cdp_layout *l = NULL;
    cdp_status st = cdp_layout_create(p, c->v, R, &l);
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
        for (int r = 0; r < R; r++) {
            struct cdp_layout_rank *k = &l->rank[s * R + r];
            k->stage = s;
            k->replica = r;
            k->device = device ? device[s * R + r] : 0;
            k->node = device ? c->t->gpus[k->device].node : 0;
        }
    *out = l;
    return CDP_OK;
}

/* Splits for p stages, m micro-batches; ranges gets p*v entries. Memory: what
 * the executor allocates (part_memory), within the smallest device's cap. */
static cdp_status split(struct ctx *c, int p, int R, int m, int objective, int64_t (*ranges)[2])
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
        if (!w) return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
        for (int i = 0; i < c->n; i++) w[i] = c->cost[i].fwd_s + c->cost[i].bwd_s;
        cdp_status st = cdp_partition_balanced(w, c->n, nv, ranges);
        free(w);
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
    if ((st = candidate_layout(c, p, R, m, NULL, NULL, &l)) ||
        (st = cdp_layout_slots_ex(l, 0, &mcap, inf, inf + p)))
        goto done;
    free(c->slots);
    c->slots = inf;
    c->p = p;
    c->R = R; /* part_memory: the shards of ZeRO-1 */
    inf = NULL;
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
                                    .schedule = c->kind, .micro_batches = m, .memory = part_memory,
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

/* What a node's ranks may hold in host memory, and where that figure is from. */
static double node_capacity(const struct cdp_plan *plan, const struct cdp_topology *t, int node, char *from,
                            size_t cap)
{
    if (plan->cluster.host_memory) {
        snprintf(from, cap, "/cluster/host_memory");
        return (double)plan->cluster.host_memory;
    }
    /* ranks run here: on the cpu backend always (their devices are this host's
     * memory), on cuda when the topology is this machine */
    if (cdp_backend_host_visible(plan->cluster.backend) || !strcmp(plan->cluster.topology, "auto")) {
        uint64_t avail = 0;
        char why[140];
        if (!cdp_host_memory(&avail, why, sizeof why)) {
            snprintf(from, cap, "this host: %.140s", why);
            return (double)avail;
        }
    }
    uint64_t numa = 0;
    for (int i = 0; i < t->n_numa; i++)
        if (t->numa[i].node == node) numa += t->numa[i].memory_bytes;
    snprintf(from, cap, numa ? "the topology's NUMA memory" : "unknown");
    return (double)numa;
}

/* Host bytes of a rank: on the cpu backend its device memory is host memory too. */
static double rank_host_bytes(const struct ctx *c, const struct cdp_layout_rank *k)
{
    return (double)k->memory.host + (c->hv ? (double)k->memory.device : 0);
}

/* Fills every rank's memory (cdp_layout_memory). */
static cdp_status layout_memory(const struct ctx *c, struct cdp_layout *l)
{
    return cdp_layout_memory(c->plan, l, c->u, c->n);
}

/* The fit of a layout whose memory is filled: every rank within its device's
 * cap and every node's ranks within its host memory. 0 when it fits; else a
 * message in why. *peak gets the largest rank's device bytes. */
static int misfit(const struct ctx *c, const struct cdp_layout *l, double *peak, char *why, size_t cap)
{
    double *node = calloc((size_t)c->t->n_nodes, sizeof *node);
    int bad = 0;
    *peak = 0;
    for (int i = 0; i < l->n_ranks; i++) {
        const struct cdp_layout_rank *k = &l->rank[i];
        *peak = fmax(*peak, (double)k->memory.device);
        if (node) node[k->node] += rank_host_bytes(c, k);
        const uint64_t dc = device_cap(c->plan, c->t, k->device);
        if (!bad && dc && k->memory.device > dc) {
            char a[32], b[32];
            snprintf(why, cap, "stage %d needs %s of device memory and the device has %s",
                     k->stage, cdp_format_bytes(k->memory.device, a, sizeof a), cdp_format_bytes(dc, b, sizeof b));
            bad = 1;
        }
    }
    for (int n = 0; node && !bad && n < c->t->n_nodes; n++) {
        char from[160];
        const double hc = node_capacity(c->plan, c->t, n, from, sizeof from);
        if (hc > 0 && node[n] > hc) {
            char a[32], b[32];
            int ranks = 0;
            for (int i = 0; i < l->n_ranks; i++) ranks += l->rank[i].node == n;
            if (ranks == 1)
                snprintf(why, cap, "the rank on node %d needs %s of host memory and the node has %s (%s)", n,
                         cdp_format_bytes((uint64_t)node[n], a, sizeof a), cdp_format_bytes((uint64_t)hc, b, sizeof b),
                         from);
            else
                snprintf(why, cap, "the %d ranks on node %d need %s of host memory together and the node has %s (%s)",
                         ranks, n, cdp_format_bytes((uint64_t)node[n], a, sizeof a),
                         cdp_format_bytes((uint64_t)hc, b, sizeof b), from);
            bad = 2;
        }
    }
    free(node);
    return bad;
}

/* The schedule of the candidate being evaluated, and its chunks per rank. */
static void set_kind(struct ctx *c, enum cdp_schedule_kind kind)
{
    c->kind = kind;
    c->v = cdp_schedule_chunks_of(kind, (int)c->plan->parallel.chunks);
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

/* A device's model without the vendor's words, for the balance table. */
static const char *short_name(const struct cdp_topology *t, int d)
{
    const char *n = t->gpus[d].name;
    if (t->kind == CDP_TOPOLOGY_CPU) return "CPU";
    if (!strncmp(n, "NVIDIA ", 7)) n += 7;
    if (!strncmp(n, "Tesla ", 6)) n += 6;
    return n;
}

/* How much longer device d takes than device 0, whose rate the costs are in:
 * rate(device 0) / rate(d) for the plan's precision. */
static double slowdown(const struct cdp_plan *plan, const struct cdp_topology *t, const struct cdp_device_rate *r0,
                       int d)
{
    const struct cdp_topology_gpu *a = &t->gpus[0], *g = &t->gpus[d];
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
 * and the shares the plan asks for. The predicted steps are filled once the
 * layout is simulated (balance_predict). */
static cdp_status balance_result(const struct ctx *c, const int *device, int p, int R, int m,
                                 const struct cdp_planner_stage *stage, struct cdp_planner_balance *b)
{
    const struct cdp_parallel_desc *pd = &c->plan->parallel;
    b->kind = pd->balance;
    b->shares = calloc((size_t)R, sizeof *b->shares);
    b->t_s = calloc((size_t)R, sizeof *b->t_s);
    b->devices = calloc((size_t)R, sizeof *b->devices);
    if (!b->shares || !b->t_s || !b->devices) return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
    const struct cdp_device_rate r0 = cdp_device_rate_of(c->t, 0, c->plan->train.precision);
    for (int r = 0; r < R; r++) {
        double t = 0;
        for (int s = 0; s < p; s++) {
            const double x = (stage[s].fwd_s + stage[s].bwd_s) * slowdown(c->plan, c->t, &r0, device[s * R + r]);
            if (x > t) t = x;
        }
        b->t_s[r] = t;
        replica_devices(c->t, device, p, R, r, b->devices[r], sizeof b->devices[r]);
    }
    switch (pd->balance) {
    case CDP_BALANCE_EXPLICIT:
        if (pd->n_shares != R)
            return cdp_fail(CDP_ERR_INVALID, "%s: /parallel/balance: %d shares for %d replicas", c->plan->source,
                            pd->n_shares, R);
        memcpy(b->shares, pd->shares, (size_t)R * sizeof *b->shares);
        break;
    case CDP_BALANCE_SPEED: {
        if (c->zero >= 2) { /* ZeRO-2: every replica the same micro-batches */
            for (int r = 0; r < R; r++) b->shares[r] = m;
            break;
        }
        cdp_status st = cdp_balance_shares(b->t_s, R, p, (int64_t)R * m, c->v > 1 ? p : 1, 0, b->shares);
        if (st) return cdp_error_context(st, "%s: planner", c->plan->source);
        break;
    }
    case CDP_BALANCE_UNIFORM:
    case CDP_BALANCE_KIND_COUNT:
        for (int r = 0; r < R; r++) b->shares[r] = m;
        break;
    }
    return CDP_OK;
}

/* The steps with the shares and with uniform ones (cdp_balance_step_time plus
 * the simulated tail: the step after its forward/backward phase). */
static cdp_status balance_predict(int p, int R, int m, double step_s, double phase_s, struct cdp_planner_balance *b)
{
    int64_t *uniform = malloc((size_t)R * sizeof *uniform);
    if (!uniform) return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
    for (int r = 0; r < R; r++) uniform[r] = m;
    b->rest_s = step_s > phase_s ? step_s - phase_s : 0;
    b->step_s = cdp_balance_step_time(b->t_s, R, p, b->shares) + b->rest_s;
    b->uniform_step_s = cdp_balance_step_time(b->t_s, R, p, uniform) + b->rest_s;
    b->gain = b->step_s > 0 ? b->uniform_step_s / b->step_s - 1 : 0;
    free(uniform);
    return CDP_OK;
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
static cdp_status build_layout(const struct ctx *c, const struct cand *k, const int *device,
                               const int64_t *shares, struct cdp_layout **out)
{
    const int p = k->p, R = k->R, N = p * R;
    struct cdp_layout *l = NULL;
    cdp_status st = candidate_layout(c, p, R, k->m, (const int64_t(*)[2])k->ranges, NULL, &l);
    if (st) return st;
    memcpy(l->shares, shares, (size_t)R * sizeof *shares);
    snprintf(l->topology, sizeof l->topology, "%s", c->t->name);
    int *order = malloc((size_t)N * sizeof *order);
    if (!order) {
        cdp_layout_free(l);
        return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
    }
    for (int i = 0; i < N; i++) order[i] = i;
    for (int i = 1; i < N; i++) /* by device; N is at most the topology's devices */
        for (int j = i; j > 0 && device[order[j - 1]] > device[order[j]]; j--) {
            const int x = order[j];
            order[j] = order[j - 1];
            order[j - 1] = x;
        }
    const int share_k = cdp_backend_is_gpu(c->plan->cluster.backend) && c->plan->cluster.ranks_per_device > 1
                            ? (int)c->plan->cluster.ranks_per_device : 1;
    for (int i = 0; i < N; i++) {
        struct cdp_layout_rank *q = &l->rank[i];
        const int sr = order[i], d = device[sr];
        q->stage = sr / R;
        q->replica = sr % R;
        q->device = d;
        q->node = c->t->gpus[d].node;
        q->gpu = c->t->gpus[d].local / share_k;
        q->capacity = device_cap(c->plan, c->t, d);
        /* a GPU's peak only: a CPU device's figure is the cost model's assumption, not a known peak */
        q->peak_flops =
            c->t->kind == CDP_TOPOLOGY_CPU ? 0 : cdp_device_peak_flops(&c->t->gpus[d], c->plan->train.precision);
    }
    free(order);
    for (int i = 0; i < N && cdp_backend_is_gpu(l->backend); i++)
        for (int j = 0; j < i; j++)
            if (l->rank[j].node == l->rank[i].node && l->rank[j].gpu == l->rank[i].gpu) l->shared_devices = 1;
    if (!(st = assign_cpus(c, l)) && !(st = layout_memory(c, l))) {
        *out = l;
        return CDP_OK;
    }
    cdp_layout_free(l);
    return st;
}

void cdp_planner_result_clear(struct cdp_planner_result *r)
{
    if (!r) return;
    free(r->balance.shares);
    free(r->balance.t_s);
    free(r->balance.devices);
    cdp_layout_free(r->layout);
    free(r->stage);
    free(r->node);
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
    for (int r = 0; r < CDP_RECOMPUTE_COUNT; r++) {
        free(c->mode[r].u);
        free(c->mode[r].cost);
        mem_index_free(&c->mode[r].mi);
    }
    free(c->bw);
    free(c->lat);
    free(c->slots);
    for (int i = 0; i < c->n_memo; i++) free(c->memo[i].device);
}

/* Makes recompute mode r's units, costs and memory the current ones. */
static void use_mode(struct ctx *c, enum cdp_recompute r)
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
static int zeros_of(const struct cdp_plan *plan, int R, int *out)
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
static int modes_of(const struct cdp_plan *plan, enum cdp_recompute *out)
{
    if (!plan->train.recompute_auto) {
        out[0] = plan->train.recompute;
        return 1;
    }
    for (int r = 0; r < CDP_RECOMPUTE_COUNT; r++) out[r] = (enum cdp_recompute)r;
    return CDP_RECOMPUTE_COUNT;
}

/* Units, costs at device 0's rate, links and memory terms for plan on t. */
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
    cdp_status st = CDP_OK;
    for (int i = 0; i < n_modes && !st; i++) {
        const enum cdp_recompute r = modes[i];
        if ((st = cdp_units_build(&plan->model, &c->mode[r].u, &c->n))) return st;
        for (int k = 0; k < c->n; k++) cdp_unit_set_recompute(&c->mode[r].u[k], r);
        cdp_cost_fit_units(plan, c->mode[r].u, c->n);
        if (!(c->mode[r].cost = calloc((size_t)c->n, sizeof *c->mode[r].cost)))
            return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
        cdp_cost_analytic(plan, c->mode[r].u, c->n, &rate, c->mode[r].cost);
        if (costs) cdp_cost_apply(costs, c->mode[r].u, c->n, c->mode[r].cost);
        cdp_cost_add_recompute(c->mode[r].u, c->n, c->mode[r].cost);
        st = mem_index_build(&c->mode[r].mi, plan, c->mode[r].u, c->n);
    }
    if (st) return st;
    use_mode(c, modes[0]);
    c->bw = malloc((size_t)c->nd * c->nd * sizeof *c->bw);
    c->lat = malloc((size_t)c->nd * c->nd * sizeof *c->lat);
    c->rdev = malloc((size_t)c->nd * sizeof *c->rdev);
    if (!c->bw || !c->lat || !c->rdev) return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
    links_of(t, c->bw, c->lat);
    c->tied_bytes = tied_model(plan) ? tied_bytes_of(plan, c->u, c->n) : 0;
    uint64_t cap = 0;
    for (int d = 0; d < c->nd; d++) {
        const uint64_t x = device_cap(plan, t, d);
        if (x && (!cap || x < cap)) cap = x;
    }
    c->cap = (double)cap;
    /* a unit's scratch is the same in every stage, mode and shape: one too
     * large for the largest device ends the search before it starts (it took
     * minutes to find no fit among 1,000 units' splits) */
    uint64_t largest = 0;
    char from[160];
    for (int d = 0; d < c->nd; d++)
        if (device_cap(plan, t, d) > largest) largest = device_cap(plan, t, d);
    for (int nd = 0; c->hv && nd < t->n_nodes; nd++) {
        const double x = node_capacity(plan, t, nd, from, sizeof from); /* may read /proc/meminfo */
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

/* The context of a search: every mode the plan allows. */
static cdp_status ctx_init(struct ctx *c, const struct cdp_plan *plan, const struct cdp_topology *t,
                           const struct cdp_cost_table *costs)
{
    enum cdp_recompute modes[CDP_RECOMPUTE_COUNT];
    const int n = modes_of(plan, modes);
    return ctx_init_modes(c, plan, t, costs, modes, n);
}

/* The context of one layout, in its recompute mode. */
static cdp_status ctx_init_for(struct ctx *c, const struct cdp_plan *plan, const struct cdp_topology *t,
                               const struct cdp_cost_table *costs, enum cdp_recompute r)
{
    return ctx_init_modes(c, plan, t, costs, &r, 1);
}

/* Per-stage predictions of a layout: forward/backward per micro-batch (all
 * chunks) and the most device memory of its ranks against their least cap. */
static void stage_predictions(const struct ctx *c, const struct cdp_layout *l, struct cdp_planner_stage *stage)
{
    for (int s = 0; s < l->stages; s++) {
        struct cdp_planner_stage *ps = &stage[s];
        memset(ps, 0, sizeof *ps);
        for (int ch = 0; ch < l->chunks; ch++) {
            const int k = cdp_schedule_vstage(l->schedule, l->stages, l->chunks, s, ch);
            for (int64_t i = l->ranges[k][0]; i < l->ranges[k][1]; i++) {
                ps->fwd_s += c->cost[i].fwd_s;
                ps->bwd_s += c->cost[i].bwd_s;
            }
        }
    }
    for (int i = 0; i < l->n_ranks; i++) {
        struct cdp_planner_stage *ps = &stage[l->rank[i].stage];
        ps->memory_bytes = fmax(ps->memory_bytes, (double)l->rank[i].memory.device);
        const double cap = (double)l->rank[i].capacity;
        if (cap > 0 && (ps->capacity_bytes <= 0 || cap < ps->capacity_bytes)) ps->capacity_bytes = cap;
    }
}

/* The smallest device cap some layout the plan allows fits in, for the message
 * when none fits: over the shapes tried, the split of least memory. */
static void smallest_cap(struct ctx *c, const struct cand *shapes, int n, char *buf, size_t cap)
{
    double best = -1;
    int bi = -1;
    int64_t(*ranges)[2] = NULL;
    const double saved = c->cap;
    c->cap = 0;
    for (int i = 0; i < n; i++) {
        const struct cand *k = &shapes[i];
        set_kind(c, k->kind);
        free(ranges);
        ranges = calloc((size_t)k->p * c->v, sizeof *ranges);
        int *dev = malloc((size_t)k->p * k->R * sizeof *dev);
        struct cdp_layout *l = NULL;
        use_mode(c, k->rc);
        c->zero = k->zero;
        double peak = 0;
        char why[8];
        if (ranges && dev && !split(c, k->p, k->R, k->m, CDP_PARTITION_MEMORY, ranges)) {
            fixed_placement(c->plan, k->p, k->R, dev);
            if (!candidate_layout(c, k->p, k->R, k->m, (const int64_t(*)[2])ranges, dev, &l) && !layout_memory(c, l)) {
                misfit(c, l, &peak, why, sizeof why);
                if (best < 0 || peak < best) best = peak, bi = i;
            }
        }
        cdp_layout_free(l);
        free(dev);
    }
    free(ranges);
    c->cap = saved;
    buf[0] = '\0';
    if (bi >= 0) {
        char a[32];
        snprintf(buf, cap, "; the smallest device memory any layout fits in is %s (%d stage%s x %d replica%s, %d "
                 "micro-batches, %s)", cdp_format_bytes((uint64_t)ceil(best), a, sizeof a), shapes[bi].p,
                 shapes[bi].p == 1 ? "" : "s", shapes[bi].R, shapes[bi].R == 1 ? "" : "s", shapes[bi].m,
                 cdp_schedule_name(shapes[bi].kind));
    }
}

/* Whether the plan fixes every choice the search would make. */
static int all_fixed(const struct cdp_plan *plan)
{
    const struct cdp_parallel_desc *pd = &plan->parallel;
    return pd->stages != CDP_AUTO && pd->replicas != CDP_AUTO && pd->micro_batches != CDP_AUTO && !pd->schedule_auto &&
           pd->partition && pd->n_partition == pd->stages * (cdp_schedule_has_chunks(pd->schedule) ? pd->chunks : 1) &&
           pd->placement != CDP_PLACEMENT_TOPOLOGY;
}

/* What the search over shapes keeps: the candidates that fit (cand) and every
 * shape tried (tried, for the smallest-capacity message), and why the last
 * shape that did not fit did not. */
struct search {
    struct cand *cand, *tried;
    int n_cand, n_tried, cap;
    char why[1024];
    int device_short; /* a shape did not fit for device memory (not host memory) */
    int largest_tried;
    int layout_only;  /* every choice is the plan's: no simulation */
    int *dev;         /* scratch placement, nd entries */
    struct cdp_layout *cl;
    struct cdp_sim_result *sr;
};

static void search_free(struct search *s)
{
    for (int i = 0; i < s->n_cand; i++) free(s->cand[i].ranges);
    free(s->cand);
    free(s->tried);
    free(s->dev);
    cdp_layout_free(s->cl);
    cdp_sim_result_free(s->sr);
}

/* One shape (p stages, R replicas, m micro-batches, c->kind): split it, check
 * the memory every rank allocates under the fixed placement, and simulate it.
 * It becomes a candidate when it fits; otherwise s->why says why not. */
static cdp_status try_shape(struct ctx *c, struct search *s, int p, int R, int m)
{
    const struct cdp_plan *plan = c->plan;
    cdp_status st;
    /* every shape tried is a candidate until it does not fit: both lists grow alike */
    if (s->n_tried == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        struct cand *nc = realloc(s->cand, (size_t)s->cap * sizeof *s->cand);
        if (nc) s->cand = nc;
        struct cand *nt = nc ? realloc(s->tried, (size_t)s->cap * sizeof *s->tried) : NULL;
        if (nt) s->tried = nt;
        if (!nc || !nt) return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
    }
    s->tried[s->n_tried++] = (struct cand){.p = p, .R = R, .m = m, .kind = c->kind, .rc = c->rc, .zero = c->zero};
    struct cand *k = &s->cand[s->n_cand];
    *k = (struct cand){.p = p, .R = R, .m = m, .kind = c->kind, .rc = c->rc, .zero = c->zero};
    k->ranges = calloc((size_t)p * c->v, sizeof *k->ranges);
    if (!k->ranges) return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
    if ((st = split(c, p, R, m, CDP_PARTITION_TIME, k->ranges))) {
        free(k->ranges);
        if (st != CDP_ERR_INVALID) return st;
        snprintf(s->why, sizeof s->why, "%d stage%s x %d micro-batches: %s", p, p == 1 ? "" : "s", m,
                 cdp_last_error());
        s->device_short = 1;
        return CDP_OK;
    }
    /* the memory every rank allocates, under the fixed placement */
    fixed_placement(plan, p, R, s->dev);
    cdp_layout_free(s->cl);
    s->cl = NULL;
    double peak = 0;
    char misfit_why[512];
    if ((st = candidate_layout(c, p, R, m, (const int64_t(*)[2])k->ranges, s->dev, &s->cl)) ||
        (st = layout_memory(c, s->cl))) {
        free(k->ranges);
        if (st != CDP_ERR_INVALID) return st;
        snprintf(s->why, sizeof s->why, "%s", cdp_last_error());
        return CDP_OK;
    }
    const int bad = misfit(c, s->cl, &peak, misfit_why, sizeof misfit_why);
    s->device_short |= bad == 1;
    if (bad) {
        snprintf(s->why, sizeof s->why, "%d stage%s x %d replica%s, %d micro-batches: %s", p, p == 1 ? "" : "s", R,
                 R == 1 ? "" : "s", m, misfit_why);
        free(k->ranges);
        return CDP_OK;
    }
    k->peak = peak;
    if (s->layout_only) { /* nothing to compare: no simulation */
        s->n_cand++;
        return CDP_OK;
    }
    double step = 0;
    if (!(st = prepare(c, p, R, m, (const int64_t(*)[2])k->ranges))) {
        if (c->cheap) st = cheap_step(c, s->dev, 0, &step);
        else if (!(st = sim(c, s->dev, NULL, &s->sr))) step = s->sr->step_s;
    }
    if (st) {
        free(k->ranges);
        return st;
    }
    k->step_s = step;
    k->sps = s->sr ? s->sr->samples_per_s : (double)R * m * (double)plan->train.micro_batch / step;
    s->n_cand++;
    cdp_sim_result_free(s->sr);
    s->sr = NULL;
    return CDP_OK;
}

/* 1. Every shape the plan allows on W devices: stages from the plan or 1..the
 * most, replicas that divide the global batch, micro-batch counts (powers of
 * two from p when the plan gives none), schedules ("auto": 1F1B and GPipe). */
static cdp_status try_shapes(struct ctx *c, struct search *s, int W, struct cdp_planner_result *res)
{
    const struct cdp_plan *plan = c->plan;
    const struct cdp_parallel_desc *pd = &plan->parallel;
    const int64_t b = plan->train.micro_batch, G = plan->train.global_batch;
    const int64_t S = G != CDP_AUTO ? G / b : 0; /* samples-per-step in micro-batches, when fixed */
    set_kind(c, pd->schedule_auto ? CDP_SCHEDULE_1F1B : pd->schedule);
    const int pmin = c->v > 1 ? 2 : 1, pmax = (int)(c->n / c->v < W ? c->n / c->v : W);
    int p_lo = pmin, p_hi = pmax;
    if (pd->stages != CDP_AUTO) p_lo = p_hi = (int)pd->stages;
    for (int p = p_lo; p <= p_hi; p++) {
        set_kind(c, pd->schedule_auto ? CDP_SCHEDULE_1F1B : pd->schedule); /* the kinds loop below moves it */
        int R;
        if (pd->replicas != CDP_AUTO) {
            R = (int)pd->replicas;
        } else {
            R = W / p;
            if (S)
                while (R > 0 && (S % R || (pd->micro_batches != CDP_AUTO && S % ((int64_t)R * pd->micro_batches))))
                    R--;
        }
        if (R < 1 || (int64_t)p * R > c->nd) continue;
        int64_t ms[CDP_PLANNER_MB_CHOICES];
        int n_m = 0;
        if (pd->micro_batches != CDP_AUTO) ms[n_m++] = pd->micro_batches;
        else if (S) ms[n_m++] = S / R;
        else if (p == 1 && c->v == 1) ms[n_m++] = 1; /* no pipeline to fill: no accumulation made up */
        else
            for (int64_t q = pow2_at_least(p); n_m < CDP_PLANNER_MB_CHOICES; q *= 2) ms[n_m++] = q;
        /* "auto" schedule: the kinds the table marks (not interleaved: it needs a
         * number of chunks, which the plan gives), in its order; zbv's two chunks
         * per rank set c->v (set_kind) */
        enum cdp_schedule_kind kinds[CDP_SCHEDULE_COUNT];
        int n_auto = 0;
        for (int order = 1; order <= CDP_SCHEDULE_COUNT; order++)
            for (int k = 0; k < CDP_SCHEDULE_COUNT; k++)
                if (cdp_schedule_def((enum cdp_schedule_kind)k)->auto_order == order)
                    kinds[n_auto++] = (enum cdp_schedule_kind)k;
        const int n_kinds = pd->schedule_auto ? n_auto : 1;
        for (int ik = 0; ik < n_m * n_kinds; ik++) {
            const int i = ik / n_kinds;
            set_kind(c, pd->schedule_auto ? kinds[ik % n_kinds] : pd->schedule);
            const int m = (int)ms[i];
            if (p * c->v > c->n) continue; /* zbv: two chunks of at least one unit per rank */
            if (m < 1 || (cdp_schedule_def(c->kind)->mb_multiple_of_stages && (m % p || !shares_fit(pd, p)))) continue;
            res->shapes++;
            s->largest_tried = p;
            /* the least recomputation that fits this shape (less is always
             * faster), unsharded before sharded (ZeRO-1 moves the bytes an
             * all-reduce does, in two collectives); ZeRO-2 only where nothing
             * else fits */
            enum cdp_recompute modes[CDP_RECOMPUTE_COUNT];
            int zeros[3];
            const int n_modes = modes_of(plan, modes), n_zeros = zeros_of(plan, R, zeros), had = s->n_cand;
            /* ZeRO-2 last of all (a reduce-scatter after every backward: m x v
             * per step), so (mode, zero) goes (none, 0), (none, 1), (selective,
             * 0) ... (full, 1), then (none, 2) ... (full, 2) */
            int order[3 * CDP_RECOMPUTE_COUNT], n_order = 0;
            for (int pass = 0; pass < 2; pass++)
                for (int q = 0; q < n_modes * n_zeros; q++)
                    if ((zeros[q % n_zeros] >= 2) == pass) order[n_order++] = q;
            for (int o = 0; o < n_order && s->n_cand == had; o++) {
                const int q = order[o];
                use_mode(c, modes[q / n_zeros]);
                c->zero = zeros[q % n_zeros];
                cdp_status st = try_shape(c, s, p, R, m);
                if (st) return st;
            }
        }
    }
    res->feasible = s->n_cand;
    return CDP_OK;
}

/* Why no shape fits, with the smallest device memory that would do. */
static cdp_status none_fits(struct ctx *c, struct search *s, int W, const struct cdp_planner_result *res)
{
    const struct cdp_plan *plan = c->plan;
    char smallest[256] = "";
    if (s->n_tried && s->device_short) smallest_cap(c, s->tried, s->n_tried, smallest, sizeof smallest);
    if (!s->why[0])
        snprintf(s->why, sizeof s->why, "no (stages, replicas, micro_batches) fits %d devices and /train/global_batch",
                 W);
    if (plan->parallel.stages != CDP_AUTO || res->shapes == 0)
        return cdp_fail(CDP_ERR_INVALID, "%s: planner: %s%s", plan->source, s->why, smallest);
    return cdp_fail(CDP_ERR_INVALID, "%s: planner: no shape up to %d stages on %d devices fits; at %d stages: %s%s",
                    plan->source, s->largest_tried, W, s->largest_tried, s->why, smallest);
}

/* 2. Placement: searched for the best few shapes when the plan leaves it to
 * the topology; *best is the candidate chosen and best_dev its placement. */
static cdp_status place_best(struct ctx *c, struct search *s, struct cdp_planner_result *res, int *best,
                             int *best_dev)
{
    const struct cdp_plan *plan = c->plan;
    const struct cdp_parallel_desc *pd = &plan->parallel;
    cdp_status st = CDP_OK;
    double best_sps = s->cand[0].sps;
    *best = 0;
    fixed_placement(plan, s->cand[0].p, s->cand[0].R, best_dev);
    snprintf(res->placement_method, sizeof res->placement_method, "%s",
             pd->placement == CDP_PLACEMENT_EXPLICIT           ? "explicit (from the plan)"
             : pd->placement == CDP_PLACEMENT_ORDERED_DP_INNER ? "ordered-dp-inner (from the plan)"
                                                               : "ordered-pp-inner (from the plan)");
    if (pd->placement != CDP_PLACEMENT_TOPOLOGY) return CDP_OK;
    for (int i = 0; i < s->n_cand && i < CDP_PLANNER_PLACED_SHAPES; i++) {
        struct cand *k = &s->cand[i];
        set_kind(c, k->kind);
        use_mode(c, k->rc);
        c->zero = k->zero;
        if ((st = prepare(c, k->p, k->R, k->m, (const int64_t(*)[2])k->ranges))) break;
        /* bounded work: about 1e6 simulated (rank x micro-batch) slots per shape, at least 8
         * evaluations; the cheap model simulates one pipeline per distinct replica (counted as 8) */
        int64_t per = c->cheap ? (int64_t)k->p * k->m * c->v * 8 + (int64_t)k->p * k->R
                               : (int64_t)k->p * k->R * k->m * c->v;
        int64_t evals = 1000000 / (per > 0 ? per : 1);
        if (evals > CDP_PLACEMENT_LOCAL_EVALS) evals = CDP_PLACEMENT_LOCAL_EVALS;
        if (evals < 8) evals = 8;
        struct cdp_placement_problem pb = {.topo = c->t, .p = k->p, .R = k->R, .cost = place_cost, .ctx = c,
                                           .max_local_evals = evals};
        struct cdp_placement_info info;
        if ((st = cdp_placement_search(&pb, s->dev, &info))) break;
        res->placed_shapes++;
        double step_s = info.cost;
        if (c->cheap) { /* searched on the cheap model: the full simulation decides */
            struct cdp_planner_prediction pr;
            double phase;
            if ((st = sim_numbers(c, s->dev, &pr, &phase))) break;
            step_s = pr.step_s;
        }
        const double sps = (double)k->R * k->m * (double)plan->train.micro_batch / step_s;
        if (i == 0 || sps > best_sps) {
            *best = i;
            best_sps = sps;
            memcpy(best_dev, s->dev, (size_t)k->p * k->R * sizeof *s->dev);
            snprintf(res->placement_method, sizeof res->placement_method, "%s", info.method);
        }
    }
    return st;
}

/* The step of candidate k placed on device (p*R, stage-major) as training
 * would run it: its own layout (these shares, its CPU sets), simulated with
 * the ranks that share a processor (a GPU with /cluster/ranks_per_device, a
 * core on a small host) sharing its time. *fits: whether every rank fits its
 * device (NULL: not asked). */
static cdp_status layout_step(struct ctx *c, struct search *s, const struct cand *k, const int *device,
                              const int64_t *shares, struct cdp_planner_prediction *pred, int *fits)
{
    struct cdp_layout *l = NULL;
    double phase;
    cdp_status st = build_layout(c, k, device, shares, &l);
    if (st) return st;
    if (fits) {
        double peak;
        char why[512];
        *fits = !misfit(c, l, &peak, why, sizeof why);
    }
    if (layout_shares_processors(l)) {
        st = simulate_layout(c, l, &s->sr);
        if (!st) {
            *pred = (struct cdp_planner_prediction){s->sr->step_s, s->sr->bubble, s->sr->samples_per_s};
            cdp_sim_result_free(s->sr);
            s->sr = NULL;
        }
    } else {
        st = sim_numbers(c, device, pred, &phase);
    }
    cdp_layout_free(l);
    return st;
}

/* 2b. The search's placement against the two fixed orders, each as training
 * would run it (layout_step): an order that is faster and fits is taken.
 * The search's cost leaves out ranks that share a processor, so with
 * /cluster/ranks_per_device it could choose two stages of one replica on
 * a GPU where an order puts them on two. */
static cdp_status prefer_orders(struct ctx *c, struct search *s, const struct cand *k, int *best_dev,
                                struct cdp_planner_result *res)
{
    const int N = k->p * k->R;
    int64_t *uniform = malloc((size_t)k->R * sizeof *uniform);
    if (!uniform) return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
    for (int r = 0; r < k->R; r++) uniform[r] = k->m;
    set_kind(c, k->kind);
    use_mode(c, k->rc);
    c->zero = k->zero;
    struct cdp_planner_prediction best, pr;
    int fits = 1;
    cdp_status st = prepare(c, k->p, k->R, k->m, (const int64_t(*)[2])k->ranges);
    if (!st) st = layout_step(c, s, k, best_dev, uniform, &best, NULL);
    for (int i = 0; i < 2 && !st; i++) {
        if (i == 0) cdp_placement_ordered_pp_inner(k->p, k->R, s->dev);
        else cdp_placement_ordered_dp_inner(k->p, k->R, s->dev);
        if ((st = layout_step(c, s, k, s->dev, uniform, &pr, &fits))) break;
        if (fits && pr.step_s < best.step_s) {
            best = pr;
            memcpy(best_dev, s->dev, (size_t)N * sizeof *best_dev);
            snprintf(res->placement_method, sizeof res->placement_method, "%s (faster than the search's, ranks "
                     "sharing processors counted)", i == 0 ? "ordered-pp-inner" : "ordered-dp-inner");
        }
    }
    free(uniform);
    return st;
}

/* 3. The chosen layout: balance, ranks, memory, fit; then its prediction and
 * the baselines. */
static cdp_status finish(struct ctx *c, struct search *s, const struct cand *k, const int *best_dev,
                         struct cdp_planner_result *res)
{
    const struct cdp_plan *plan = c->plan;
    const struct cdp_topology *t = c->t;
    cdp_status st;
    set_kind(c, k->kind);
    use_mode(c, k->rc);
    c->zero = k->zero;
    res->stage = calloc((size_t)k->p, sizeof *res->stage);
    res->node = calloc((size_t)t->n_nodes, sizeof *res->node);
    if (!res->stage || !res->node) return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
    /* times per stage for the balance, from the candidate's ranges */
    struct cdp_layout *tmp = NULL;
    if ((st = candidate_layout(c, k->p, k->R, k->m, (const int64_t(*)[2])k->ranges, best_dev, &tmp))) return st;
    stage_predictions(c, tmp, res->stage);
    cdp_layout_free(tmp);
    if ((st = balance_result(c, best_dev, k->p, k->R, k->m, res->stage, &res->balance))) return st;
    if ((st = build_layout(c, k, best_dev, res->balance.shares, &res->layout))) return st;
    stage_predictions(c, res->layout, res->stage);
    double peak;
    char misfit_why[512];
    if (misfit(c, res->layout, &peak, misfit_why, sizeof misfit_why))
        return cdp_fail(CDP_ERR_INVALID, "%s: planner: %d stage%s x %d replica%s as placed: %s", plan->source, k->p,
                        k->p == 1 ? "" : "s", k->R, k->R == 1 ? "" : "s", misfit_why);
    for (int i = 0; i < res->layout->n_ranks; i++)
        res->node[res->layout->rank[i].node].bytes += rank_host_bytes(c, &res->layout->rank[i]);
    for (int n = 0; n < t->n_nodes; n++)
        res->node[n].capacity_bytes =
            node_capacity(plan, t, n, res->node[n].capacity_from, sizeof res->node[n].capacity_from);
    if (s->layout_only) return CDP_OK;
    if ((st = prepare(c, k->p, k->R, k->m, (const int64_t(*)[2])k->ranges))) return st;
    double phase = 0;
    if (layout_shares_processors(res->layout)) {
        if ((st = simulate_layout(c, res->layout, &s->sr))) return st;
        res->predicted = (struct cdp_planner_prediction){s->sr->step_s, s->sr->bubble, s->sr->samples_per_s};
        phase = s->sr->phase_s;
        cdp_sim_result_free(s->sr);
        s->sr = NULL;
    } else {
        for (int i = 0; i < res->layout->n_ranks; i++) {
            const struct cdp_layout_rank *q = &res->layout->rank[i];
            s->dev[q->stage * k->R + q->replica] = q->device;
        }
        if ((st = sim_numbers(c, s->dev, &res->predicted, &phase))) return st;
    }
    res->predicted_ok = 1;
    if ((st = balance_predict(k->p, k->R, k->m, res->predicted.step_s, phase, &res->balance))) return st;
    /* each baseline predicted as the chosen layout is (layout_step) */
    static const char *const names[2] = {"ordered-pp-inner", "ordered-dp-inner"};
    for (int i = 0; i < 2; i++) {
        if (i == 0) cdp_placement_ordered_pp_inner(k->p, k->R, s->dev);
        else cdp_placement_ordered_dp_inner(k->p, k->R, s->dev);
        res->baseline[i].name = names[i];
        if ((st = layout_step(c, s, k, s->dev, res->balance.shares, &res->baseline[i].pred, NULL))) return st;
    }
    return CDP_OK;
}

cdp_status cdp_planner_run(const struct cdp_plan *plan, const struct cdp_topology *t,
                           const struct cdp_cost_table *costs, int flags, struct cdp_planner_result *out)
{
    const uint64_t t0 = cdp_time_ns();
    struct ctx c;
    struct search s = {.layout_only = (flags & CDP_PLANNER_LAYOUT_ONLY) && all_fixed(plan)};
    struct cdp_planner_result res = {0};
    int *best_dev = NULL, best = 0;
    cdp_status st;

    if ((st = ctx_init(&c, plan, t, costs))) goto fail;
    s.dev = malloc((size_t)c.nd * sizeof *s.dev);
    best_dev = malloc((size_t)c.nd * sizeof *best_dev);
    if (!s.dev || !best_dev) {
        st = cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
        goto fail;
    }
    int W = c.nd;
    if (plan->cluster.devices != CDP_AUTO && plan->cluster.nodes * plan->cluster.devices < W)
        W = (int)(plan->cluster.nodes * plan->cluster.devices);
    if ((st = try_shapes(&c, &s, W, &res))) goto fail;
    if (s.n_cand == 0) {
        st = none_fits(&c, &s, W, &res);
        goto fail;
    }
    /* best first; equal throughput: fewer stages, fewer micro-batches */
    for (int i = 1; i < s.n_cand; i++)
        for (int j = i; j > 0 && cand_better(&s.cand[j], &s.cand[j - 1]); j--) {
            struct cand tmp = s.cand[j];
            s.cand[j] = s.cand[j - 1];
            s.cand[j - 1] = tmp;
        }
    if ((st = place_best(&c, &s, &res, &best, best_dev))) goto fail;
    if (!s.layout_only && plan->parallel.placement == CDP_PLACEMENT_TOPOLOGY &&
        (st = prefer_orders(&c, &s, &s.cand[best], best_dev, &res)))
        goto fail;
    res.world = W;
    if ((st = finish(&c, &s, &s.cand[best], best_dev, &res))) goto fail;
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
    search_free(&s);
    cdp_planner_result_clear(&res);
    ctx_free(&c);
    free(best_dev);
    return st;
}

/* ---- a layout simulated (--simulate) ----------------------------------------------- */

cdp_status cdp_planner_simulate(const struct cdp_plan *plan, const struct cdp_topology *t,
                                const struct cdp_cost_table *costs, const struct cdp_layout *l,
                                struct cdp_sim_result **out)
{
    struct ctx c;
    cdp_status st = ctx_init_for(&c, plan, t, costs, l->recompute);
    if (!st) {
        c.kind = l->schedule;
        c.zero = l->zero;
        c.v = l->chunks;
        if (!(st = prepare(&c, l->stages, l->replicas, l->micro_batches, (const int64_t(*)[2])l->ranges)))
            st = simulate_layout(&c, l, out);
    }
    ctx_free(&c);
    return st;
}

/* ---- --explore placements -------------------------------------------------------- */

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
    const struct cdp_layout *l = r->layout;
    const int p = l->stages, R = l->replicas, N = p * R;
    struct cdp_planner_spread sp = {.n_random = n_random, .seed = seed};
    double *rnd = NULL;
    int *dev = NULL, *perm = NULL, *chosen = NULL;
    struct ctx c;
    if (n_random < 1 || N > t->n_gpus) return cdp_fail(CDP_ERR_INVALID, "planner: explore: bad sample count or shape");
    cdp_status st = ctx_init_for(&c, plan, t, costs, l->recompute);
    if (st) goto fail;
    c.kind = l->schedule;
    c.zero = l->zero;
    c.v = l->chunks;
    dev = malloc((size_t)c.nd * sizeof *dev);
    perm = malloc((size_t)c.nd * sizeof *perm);
    chosen = malloc((size_t)N * sizeof *chosen);
    rnd = malloc((size_t)n_random * sizeof *rnd);
    if (!dev || !perm || !chosen || !rnd) {
        st = cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
        goto fail;
    }
    for (int i = 0; i < N; i++) chosen[l->rank[i].stage * R + l->rank[i].replica] = l->rank[i].device;
    if ((st = prepare(&c, p, R, l->micro_batches, (const int64_t(*)[2])l->ranges))) goto fail;
    sp.cheap = c.cheap;
    /* the chosen placement and the two fixed orders, then the random sample */
    for (int which = 0; which < 3 + n_random; which++) {
        if (which == 0) memcpy(dev, chosen, (size_t)N * sizeof *dev);
        else if (which == 1) cdp_placement_ordered_pp_inner(p, R, dev);
        else if (which == 2) cdp_placement_ordered_dp_inner(p, R, dev);
        else {
            for (int d = 0; d < c.nd; d++) perm[d] = d;
            for (int i = 0; i < N; i++) { /* partial Fisher-Yates: N distinct devices */
                const int j = i + (int)(cdp_splitmix64(&seed) % (uint64_t)(c.nd - i));
                const int x = perm[i];
                perm[i] = perm[j];
                perm[j] = x;
            }
            memcpy(dev, perm, (size_t)N * sizeof *dev);
        }
        const double step = place_cost(dev, &c);
        if (!isfinite(step)) {
            st = cdp_error_context(CDP_ERR_INTERNAL, "planner: explore");
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
    free(chosen);
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
