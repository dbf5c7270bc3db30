/* The planner (docs/planner.md): a bounded search over the plan's "auto"
 * values, each candidate split by the memory-aware partition (on the memory the
 * executor allocates) and predicted by the simulator, the best few placed by
 * the placement search; the answer is one layout (pipeline/layout.h) with
 * every rank's node, device, CPU set and memory. This file is the search;
 * its parts are in planner_*.c (planner_internal.h). */
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
        cdp_planner_set_kind(c, k->kind, k->v);
        free(ranges);
        ranges = calloc((size_t)k->p * c->v, sizeof *ranges);
        int *dev = malloc((size_t)k->p * k->R * sizeof *dev);
        struct cdp_layout *l = NULL;
        cdp_planner_use_mode(c, k->rc);
        c->zero = k->zero;
        double peak = 0;
        char why[8];
        if (ranges && dev && !cdp_planner_split(c, k->p, k->R, k->m, CDP_PARTITION_MEMORY, ranges)) {
            cdp_planner_fixed_groups(c, k->p, k->R, dev);
            if (!cdp_planner_candidate_layout(c, k->p, k->R, k->m, (const int64_t(*)[2])ranges, dev, &l) && !cdp_planner_layout_memory(c, l)) {
                cdp_planner_misfit(c, l, &peak, why, sizeof why);
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

static void search_free(struct search *s)
{
    for (int i = 0; i < s->n_cand; i++) free(s->cand[i].ranges);
    free(s->cand);
    free(s->tried);
    free(s->shape);
    free(s->dev);
    cdp_layout_free(s->cl);
    cdp_sim_result_free(s->sr);
}

/* The most samples per second candidate k could give: R x m x micro_batch
 * over a lower bound of its step on any placement. Every rank runs m forwards
 * and backwards of its chunks; rank s cannot start before the first
 * micro-batch has passed the virtual stages before its first chunk, and
 * (without split backward) the gradient of its last backward of that chunk
 * still has to pass back through them: max over s of sum_{j<s} f_j + m (f_s +
 * b_s) + sum_{j<s} b_j, f_j and b_j virtual stage j's where the chunks are
 * interleaved (rank j's first chunk is virtual stage j), a whole rank's without
 * chunks: the 1F1B closed form (m + p - 1)(f + b) for equal stages. zbv
 * (its first chunk's ranks in a V) and a schedule file: m (f_s + b_s) alone.
 * Links, collectives and the optimizer only add to it. */
static double bound_sps(const struct ctx *c, const struct cand *k)
{
    const int p = k->p, v = k->v;
    const struct cdp_unit_cost *cost = c->mode[k->rc].cost;
    const int split = cdp_schedule_def(k->kind)->splits_backward;
    const int fill = !c->plan->parallel.schedule_file && (v == 1 || k->kind == CDP_SCHEDULE_INTERLEAVED);
    double before_f = 0, before_b = 0, lb = 0;
    for (int r = 0; r < p; r++) {
        double f = 0, b = 0, f0 = 0, b0 = 0;
        for (int ch = 0; ch < v; ch++) {
            const int j = cdp_schedule_vstage(k->kind, p, v, r, ch);
            double fj = 0, bj = 0;
            for (int64_t u = k->ranges[j][0]; u < k->ranges[j][1]; u++) fj += cost[u].fwd_s, bj += cost[u].bwd_s;
            f += fj, b += bj;
            if (j == r) f0 = fj, b0 = bj; /* the chunk the first micro-batch reaches it by */
        }
        const double here = fill ? before_f + k->m * (f + b) + (split ? 0 : before_b) : k->m * (f + b);
        if (here > lb) lb = here;
        before_f += v == 1 ? f : f0;
        before_b += v == 1 ? b : b0;
    }
    return lb > 0 ? (double)k->R * k->m * (double)c->plan->train.micro_batch / lb : INFINITY;
}

/* The least step bound (bound_sps's lb) of any split of units into at most p
 * contiguous stages, from below, without chunks: stage s's term is the work
 * before its first unit (forward, and backward without split backward; none
 * for a schedule file) plus m x its own work. Moving a boundary to the right
 * never raises the next stage's term (its start adds a unit's work once, its
 * own work loses it m times), so stages each as long as the term allows need
 * the fewest stages; bisection on the term finds the least that needs at most
 * p. Returns a value no more than that least (0 when it is 0). */
static double least_step_bound(const struct cdp_unit_cost *cost, int n, int p, int m, int fill, int split)
{
    double *C = malloc((size_t)(n + 1) * 2 * sizeof *C), *P = C ? C + n + 1 : NULL;
    if (!C) return 0; /* no bound: the caller's shape is then checked */
    C[0] = P[0] = 0;
    for (int u = 0; u < n; u++) {
        C[u + 1] = C[u] + cost[u].fwd_s + cost[u].bwd_s;
        P[u + 1] = P[u] + (fill ? cost[u].fwd_s + (split ? 0 : cost[u].bwd_s) : 0);
    }
    double lo = 0, hi = m * C[n]; /* one stage: feasible */
    for (int it = 0; it < 200 && hi - lo > 1e-12 * hi; it++) {
        const double T = lo + (hi - lo) / 2;
        int stages = 0, a = 0, ok = 1;
        while (ok && a < n) {
            if (++stages > p || P[a] + m * (C[a + 1] - C[a]) > T) {
                ok = 0;
                break;
            }
            int e = a + 1;
            while (e < n && P[a] + m * (C[e + 1] - C[a]) <= T) e++;
            a = e;
        }
        if (ok) hi = T;
        else lo = T;
    }
    free(C);
    return lo;
}

/* At least the bound (bound_sps) of the candidate any recompute mode's split
 * of the shape (p, R, m, c->kind) gives: the split itself where it needs no
 * memory (a partition the plan gives, chunks balanced on time), else
 * least_step_bound over the mode's costs; -INFINITY when no mode splits it.
 * Nothing is built: the search checks a shape's memory only when this can
 * still win (screen). */
static cdp_status shape_bound(struct ctx *c, int p, int R, int m, double *ub)
{
    const struct cdp_parallel_desc *pd = &c->plan->parallel;
    const int v = c->v, split = cdp_schedule_def(c->kind)->splits_backward;
    const int fill = !pd->schedule_file && (v == 1 || c->kind == CDP_SCHEDULE_INTERLEAVED);
    enum cdp_recompute modes[CDP_RECOMPUTE_COUNT];
    const int n_modes = cdp_planner_modes_of(c->plan, modes);
    struct cand k = {.p = p, .R = R, .m = m, .kind = c->kind, .v = v};
    *ub = -INFINITY;
    if (v > 1 || (pd->partition && pd->n_partition == p * v)) {
        if (!(k.ranges = calloc((size_t)p * v, sizeof *k.ranges))) return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
    }
    for (int q = 0; q < n_modes; q++) {
        cdp_planner_use_mode(c, modes[q]);
        k.rc = modes[q];
        double b;
        if (k.ranges) {
            cdp_status st = cdp_planner_split(c, p, R, m, CDP_PARTITION_TIME, k.ranges);
            if (st == CDP_ERR_INVALID) continue; /* checking the shape says why */
            if (st) {
                free(k.ranges);
                return st;
            }
            b = bound_sps(c, &k);
        } else {
            const double lb = least_step_bound(c->cost, c->n, p, m, fill, split);
            b = lb > 0 ? (double)R * m * (double)c->plan->train.micro_batch / lb : INFINITY;
        }
        /* sums in another order: a margin well above their rounding */
        b *= 1 + 1e-9;
        if (b > *ub) *ub = b;
    }
    free(k.ranges);
    return CDP_OK;
}

/* One shape (p stages, R replicas, m micro-batches, c->kind) in the current
 * recompute mode and ZeRO stage: split it, check the memory every rank
 * allocates under the fixed placement. It becomes a candidate when it fits;
 * otherwise s->why says why not. */
static cdp_status try_shape(struct ctx *c, struct search *s, int p, int R, int m, int seq)
{
    cdp_status st;
    /* every shape tried is a candidate until it does not fit: both lists grow alike */
    if (s->n_tried == s->cap || s->n_cand == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        struct cand *nc = realloc(s->cand, (size_t)s->cap * sizeof *s->cand);
        if (nc) s->cand = nc;
        struct cand *nt = nc ? realloc(s->tried, (size_t)s->cap * sizeof *s->tried) : NULL;
        if (nt) s->tried = nt;
        if (!nc || !nt) return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
    }
    s->tried[s->n_tried++] = (struct cand){.p = p, .R = R, .m = m, .kind = c->kind, .v = c->v, .rc = c->rc, .zero = c->zero};
    struct cand *k = &s->cand[s->n_cand];
    *k = (struct cand){.p = p, .R = R, .m = m, .kind = c->kind, .v = c->v, .rc = c->rc, .zero = c->zero, .seq = seq};
    k->ranges = calloc((size_t)p * c->v, sizeof *k->ranges);
    if (!k->ranges) return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
    if ((st = cdp_planner_split(c, p, R, m, CDP_PARTITION_TIME, k->ranges))) {
        free(k->ranges);
        if (st != CDP_ERR_INVALID) return st;
        snprintf(s->why, sizeof s->why, "%d stage%s x %d micro-batches: %s", p, p == 1 ? "" : "s", m,
                 cdp_last_error());
        s->device_short = 1;
        return CDP_OK;
    }
    /* the memory every rank allocates, under the fixed placement */
    cdp_planner_fixed_groups(c, p, R, s->dev);
    cdp_layout_free(s->cl);
    s->cl = NULL;
    double peak = 0;
    char misfit_why[512];
    if ((st = cdp_planner_candidate_layout(c, p, R, m, (const int64_t(*)[2])k->ranges, s->dev, &s->cl)) ||
        (st = cdp_planner_layout_memory(c, s->cl))) {
        free(k->ranges);
        if (st != CDP_ERR_INVALID) return st;
        snprintf(s->why, sizeof s->why, "%s", cdp_last_error());
        return CDP_OK;
    }
    const int bad = cdp_planner_misfit(c, s->cl, &peak, misfit_why, sizeof misfit_why);
    s->device_short |= bad == 1;
    if (bad) {
        snprintf(s->why, sizeof s->why, "%d stage%s x %d replica%s, %d micro-batches: %s", p, p == 1 ? "" : "s", R,
                 R == 1 ? "" : "s", m, misfit_why);
        free(k->ranges);
        return CDP_OK;
    }
    k->peak = peak;
    k->lb_sps = bound_sps(c, k);
    /* the order of the search (screen) rests on it */
    CDP_ASSERT(k->lb_sps <= s->shape[seq].ub);
    s->n_cand++; /* simulated later (screen), when its bound can still win */
    return CDP_OK;
}

/* Checks shape i's memory: the least recomputation that fits it (less is
 * always faster), unsharded before sharded (ZeRO-1 moves the bytes an
 * all-reduce does, in two collectives); ZeRO-2 only where nothing else fits.
 * The candidate, if any, is appended to s->cand. */
static cdp_status check_shape(struct ctx *c, struct search *s, int i)
{
    struct shape *sh = &s->shape[i];
    enum cdp_recompute modes[CDP_RECOMPUTE_COUNT];
    int zeros[3];
    cdp_planner_set_kind(c, sh->kind, sh->chunks);
    const int n_modes = cdp_planner_modes_of(c->plan, modes), n_zeros = cdp_planner_zeros_of(c->plan, sh->R, zeros),
              had = s->n_cand;
    /* ZeRO-2 last of all (a reduce-scatter after every backward: m x v
     * per step), so (mode, zero) goes (none, 0), (none, 1), (selective,
     * 0) ... (full, 1), then (none, 2) ... (full, 2) */
    int order[3 * CDP_RECOMPUTE_COUNT], n_order = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int q = 0; q < n_modes * n_zeros; q++)
            if ((zeros[q % n_zeros] >= 2) == pass) order[n_order++] = q;
    sh->checked = 1;
    s->n_checked++;
    for (int o = 0; o < n_order && s->n_cand == had; o++) {
        const int q = order[o];
        cdp_planner_use_mode(c, modes[q / n_zeros]);
        c->zero = zeros[q % n_zeros];
        cdp_status st = try_shape(c, s, sh->p, sh->R, sh->m, i);
        if (st) return st;
    }
    if (s->n_cand > had) s->n_fit++;
    return CDP_OK;
}

/* Every shape not yet checked, in the order enumerated (what the search did
 * before it bounded shapes first: the why of the last that does not fit is
 * kept). */
static cdp_status check_all(struct ctx *c, struct search *s)
{
    for (int i = 0; i < s->n_shape; i++)
        if (!s->shape[i].checked) {
            cdp_status st = check_shape(c, s, i);
            if (st) return st;
        }
    return CDP_OK;
}

/* Simulates candidate k under the fixed placement (the screening step). */
static cdp_status screen_one(struct ctx *c, struct search *s, struct cand *k)
{
    cdp_status st;
    double step = 0;
    cdp_planner_set_kind(c, k->kind, k->v);
    cdp_planner_use_mode(c, k->rc);
    c->zero = k->zero;
    cdp_planner_fixed_groups(c, k->p, k->R, s->dev);
    if (!(st = cdp_planner_prepare(c, k->p, k->R, k->m, (const int64_t(*)[2])k->ranges))) {
        if (c->cheap) st = cdp_planner_cheap_step(c, s->dev, 0, &step);
        else if (!(st = cdp_planner_sim(c, s->dev, NULL, &s->sr))) step = s->sr->step_s;
    }
    if (st) return st;
    k->step_s = step;
    k->sps = s->sr ? s->sr->samples_per_s : (double)k->R * k->m * (double)c->plan->train.micro_batch / step;
    k->screened = 1;
    cdp_sim_result_free(s->sr);
    s->sr = NULL;
    return CDP_OK;
}

/* Branch and bound: candidates are simulated in the order of their bounds
 * (best first; equal: fewer stages, fewer micro-batches, then the order
 * enumerated), until the bound of the next is no better than the
 * CDP_PLANNER_PLACED_SHAPES-th best simulated throughput (then no candidate
 * left could enter the shapes placed) or than floor_sps; the rest are dropped
 * unsimulated (res->pruned). A shape's memory is checked (check_shape: its
 * lists built, its candidate's exact bound known) only when its shape_bound
 * could still come first: before the best candidate at hand whenever its
 * shape_bound is at least that one's bound. So the candidates simulated, and
 * in the same order, are those of checking every shape first; the same
 * candidates are placed as with every one simulated. */
static int bound_first(const struct cand *x, const struct cand *y)
{
    if (x->lb_sps != y->lb_sps) return x->lb_sps > y->lb_sps;
    if (x->p != y->p) return x->p < y->p;
    if (x->m != y->m) return x->m < y->m;
    return x->seq < y->seq;
}

struct by_ub {
    double ub;
    int i;
};

static int by_ub(const void *a, const void *b)
{
    const struct by_ub *x = a, *y = b;
    if (x->ub != y->ub) return x->ub < y->ub ? 1 : -1;
    return x->i - y->i;
}

static cdp_status screen(struct ctx *c, struct search *s, struct cdp_planner_result *res, double floor_sps)
{
    cdp_status st = CDP_OK;
    struct by_ub *ord = malloc((size_t)(s->n_shape ? s->n_shape : 1) * sizeof *ord);
    if (!ord) return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
    for (int i = 0; i < s->n_shape; i++) ord[i] = (struct by_ub){s->shape[i].ub, i};
    qsort(ord, (size_t)s->n_shape, sizeof *ord, by_ub);
    double top[CDP_PLANNER_PLACED_SHAPES] = {0}; /* descending */
    /* s->cand: [0, w) simulated, in order; [w, n_cand) checked, fit, not yet taken */
    int w = 0, next = 0, taken = 0;
    for (;;) {
        int b = -1;
        for (int j = w; j < s->n_cand; j++)
            if (b < 0 || bound_first(&s->cand[j], &s->cand[b])) b = j;
        while (next < s->n_shape && s->shape[ord[next].i].checked) next++;
        if (b < 0 && next == s->n_shape) break;
        const double u = next < s->n_shape ? s->shape[ord[next].i].ub : -INFINITY;
        const double key = b >= 0 && s->cand[b].lb_sps > u ? s->cand[b].lb_sps : u; /* no bound left is higher */
        if ((taken >= CDP_PLANNER_PLACED_SHAPES && key <= top[CDP_PLANNER_PLACED_SHAPES - 1]) || key <= floor_sps) {
            for (int j = w; j < s->n_cand; j++) free(s->cand[j].ranges);
            res->pruned += s->n_cand - w;
            for (int j = next; j < s->n_shape; j++) res->pruned += !s->shape[ord[j].i].checked;
            break;
        }
        if (next < s->n_shape && (b < 0 || u >= s->cand[b].lb_sps)) {
            if ((st = check_shape(c, s, ord[next].i))) break;
            continue;
        }
        struct cand k = s->cand[b];
        if ((st = screen_one(c, s, &k))) {
            s->cand[b] = k;
            break;
        }
        for (int q = 0; q < CDP_PLANNER_PLACED_SHAPES; q++)
            if (k.sps > top[q]) {
                memmove(&top[q + 1], &top[q], (CDP_PLANNER_PLACED_SHAPES - 1 - q) * sizeof *top);
                top[q] = k.sps;
                break;
            }
        s->cand[b] = s->cand[w];
        s->cand[w++] = k;
        taken++;
    }
    if (st)
        for (int j = w; j < s->n_cand; j++) free(s->cand[j].ranges);
    s->n_cand = w;
    free(ord);
    return st;
}

/* 1. Every shape the plan allows on W devices: stages from the plan or 1..the
 * most, replicas that divide the global batch, micro-batch counts (powers of
 * two from p when the plan gives none), schedules ("auto": the table's kinds
 * and interleaved at 2 to CDP_PLANNER_AUTO_CHUNKS chunks). */
static cdp_status try_shapes(struct ctx *c, struct search *s, int W, struct cdp_planner_result *res)
{
    const struct cdp_plan *plan = c->plan;
    const struct cdp_parallel_desc *pd = &plan->parallel;
    const int64_t b = plan->train.micro_batch, G = plan->train.global_batch;
    const int64_t S = G != CDP_AUTO ? G / b : 0; /* samples-per-step in micro-batches, when fixed */
    const int chunks = (int)pd->chunks;
    cdp_planner_set_kind(c, pd->schedule_auto ? CDP_SCHEDULE_1F1B : pd->schedule, chunks);
    const int pmin = c->v > 1 ? 2 : 1, pmax = (int)(c->n / c->v < W ? c->n / c->v : W);
    int p_lo = pmin, p_hi = pmax;
    if (pd->stages != CDP_AUTO) p_lo = p_hi = (int)pd->stages;
    /* "auto" schedule: the kinds the table marks, in its order, then
     * interleaved at 2, 3 and 4 chunks a rank (docs/planner.md); zbv's two
     * chunks and interleaved's v set c->v (cdp_planner_set_kind) */
    enum cdp_schedule_kind kinds[CDP_SCHEDULE_COUNT + CDP_PLANNER_AUTO_CHUNKS];
    int vs[CDP_SCHEDULE_COUNT + CDP_PLANNER_AUTO_CHUNKS], n_auto = 0;
    for (int order = 1; order <= CDP_SCHEDULE_COUNT; order++)
        for (int k = 0; k < CDP_SCHEDULE_COUNT; k++)
            if (cdp_schedule_def((enum cdp_schedule_kind)k)->auto_order == order) {
                kinds[n_auto] = (enum cdp_schedule_kind)k;
                vs[n_auto++] = 1;
            }
    for (int v = 2; v <= CDP_PLANNER_AUTO_CHUNKS; v++) {
        kinds[n_auto] = CDP_SCHEDULE_INTERLEAVED;
        vs[n_auto++] = v;
    }
    if (!pd->schedule_auto) {
        kinds[0] = pd->schedule;
        vs[0] = chunks;
    }
    const int n_kinds = pd->schedule_auto ? n_auto : 1;
    for (int p = p_lo; p <= p_hi; p++) {
        cdp_planner_set_kind(c, kinds[0], vs[0]); /* the kinds loop below moves it */
        int R;
        if (pd->replicas != CDP_AUTO) {
            R = (int)pd->replicas;
        } else {
            R = W / p;
            if (S)
                while (R > 0 && (S % R || (pd->micro_batches != CDP_AUTO && S % ((int64_t)R * pd->micro_batches))))
                    R--;
        }
        if (R < 1 || (int64_t)p * R > c->n_groups) continue;
        int64_t ms[CDP_PLANNER_MB_CHOICES];
        int n_m = 0;
        if (pd->micro_batches != CDP_AUTO) ms[n_m++] = pd->micro_batches;
        else if (S) ms[n_m++] = S / R;
        else if (p == 1 && c->v == 1) ms[n_m++] = 1; /* no pipeline to fill: no accumulation made up */
        else
            for (int64_t q = pow2_at_least(p); n_m < CDP_PLANNER_MB_CHOICES; q *= 2) ms[n_m++] = q;
        for (int ik = 0; ik < n_m * n_kinds; ik++) {
            const int i = ik / n_kinds;
            cdp_planner_set_kind(c, kinds[ik % n_kinds], vs[ik % n_kinds]);
            const int m = (int)ms[i];
            if (p * c->v > c->n) continue; /* zbv, interleaved: chunks of at least one unit */
            if (p < cdp_schedule_def(c->kind)->min_stages) continue;
            if (m < 1 || (cdp_schedule_def(c->kind)->mb_multiple_of_stages && (m % p || !shares_fit(pd, p)))) continue;
            res->shapes++;
            s->largest_tried = p;
            if (s->n_shape == s->cap_shape) {
                s->cap_shape = s->cap_shape ? 2 * s->cap_shape : 64;
                struct shape *ns = realloc(s->shape, (size_t)s->cap_shape * sizeof *s->shape);
                if (!ns) return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
                s->shape = ns;
            }
            struct shape *sh = &s->shape[s->n_shape];
            *sh = (struct shape){.p = p, .R = R, .m = m, .kind = kinds[ik % n_kinds], .chunks = vs[ik % n_kinds]};
            cdp_status st = shape_bound(c, p, R, m, &sh->ub);
            if (st) return st;
            s->n_shape++;
        }
    }
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
 * the topology; *best is the candidate chosen and best_dev its placement.
 * With tensor groups the search places (stage, replica) on the groups, each
 * group one slot (placement.h), as it places them on devices at t = 1. */
static cdp_status place_best(struct ctx *c, struct search *s, struct cdp_planner_result *res, int *best,
                             int *best_dev)
{
    const struct cdp_plan *plan = c->plan;
    const struct cdp_parallel_desc *pd = &plan->parallel;
    cdp_status st = CDP_OK;
    double best_sps = s->cand[0].sps;
    *best = 0;
    cdp_planner_fixed_groups(c, s->cand[0].p, s->cand[0].R, best_dev);
    snprintf(res->placement_method, sizeof res->placement_method, "%s",
             pd->placement == CDP_PLACEMENT_EXPLICIT           ? "explicit (from the plan)"
             : pd->placement == CDP_PLACEMENT_ORDERED_DP_INNER ? "ordered-dp-inner (from the plan)"
                                                               : "ordered-pp-inner (from the plan)");
    if (pd->placement != CDP_PLACEMENT_TOPOLOGY) return CDP_OK;
    for (int i = 0; i < s->n_cand && i < CDP_PLANNER_PLACED_SHAPES; i++) {
        struct cand *k = &s->cand[i];
        cdp_planner_set_kind(c, k->kind, k->v);
        cdp_planner_use_mode(c, k->rc);
        c->zero = k->zero;
        if ((st = cdp_planner_prepare(c, k->p, k->R, k->m, (const int64_t(*)[2])k->ranges))) break;
        /* bounded work: about 1e6 simulated (rank x micro-batch) slots per shape, at least 8
         * evaluations; the cheap model simulates one pipeline per distinct replica (counted as 8) */
        int64_t per = c->cheap ? (int64_t)k->p * k->m * c->v * 8 + (int64_t)k->p * k->R
                               : (int64_t)k->p * k->R * k->m * c->v;
        int64_t evals = 1000000 / (per > 0 ? per : 1);
        if (evals > CDP_PLACEMENT_LOCAL_EVALS) evals = CDP_PLACEMENT_LOCAL_EVALS;
        if (evals < 8) evals = 8;
        struct cdp_placement_problem pb = {.topo = c->t, .p = k->p, .R = k->R, .cost = cdp_planner_search_cost, .ctx = c,
                                           .max_local_evals = evals};
        if (c->tp > 1) pb.group = c->tp, pb.n_groups = c->n_groups, pb.group_first = c->leader;
        struct cdp_placement_info info;
        if ((st = cdp_placement_search(&pb, s->dev, &info))) break;
        res->placed_shapes++;
        double step_s = info.cost;
        if (c->cheap || c->lin_sched[0]) { /* searched on a model: the full simulation decides */
            struct cdp_planner_prediction pr;
            double phase;
            if ((st = cdp_planner_sim_numbers(c, s->dev, &pr, &phase))) break;
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
    cdp_status st = cdp_planner_build_layout(c, k, device, shares, &l);
    if (st) return st;
    if (fits) {
        double peak;
        char why[512];
        *fits = !cdp_planner_misfit(c, l, &peak, why, sizeof why);
    }
    if (cdp_planner_layout_shares_processors(l)) {
        st = cdp_planner_simulate_layout(c, l, &s->sr);
        if (!st) {
            *pred = (struct cdp_planner_prediction){s->sr->step_s, s->sr->bubble, s->sr->samples_per_s};
            cdp_sim_result_free(s->sr);
            s->sr = NULL;
        }
    } else {
        st = cdp_planner_sim_numbers(c, device, pred, &phase);
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
    cdp_planner_set_kind(c, k->kind, k->v);
    cdp_planner_use_mode(c, k->rc);
    c->zero = k->zero;
    struct cdp_planner_prediction best, pr;
    int fits = 1;
    cdp_status st = cdp_planner_prepare(c, k->p, k->R, k->m, (const int64_t(*)[2])k->ranges);
    if (!st) st = layout_step(c, s, k, best_dev, uniform, &best, NULL);
    for (int i = 0; i < 2 && !st; i++) {
        if (i == 0) cdp_placement_ordered_pp_inner(k->p, k->R, s->dev);
        else cdp_placement_ordered_dp_inner(k->p, k->R, s->dev);
        cdp_planner_to_leaders(c, N, s->dev);
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
    cdp_planner_set_kind(c, k->kind, k->v);
    cdp_planner_use_mode(c, k->rc);
    c->zero = k->zero;
    res->stage = calloc((size_t)k->p, sizeof *res->stage);
    res->node = calloc((size_t)t->n_nodes, sizeof *res->node);
    if (!res->stage || !res->node) return cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
    /* times per stage for the balance, from the candidate's ranges */
    struct cdp_layout *tmp = NULL;
    if ((st = cdp_planner_candidate_layout(c, k->p, k->R, k->m, (const int64_t(*)[2])k->ranges, best_dev, &tmp))) return st;
    cdp_planner_stage_predictions(c, tmp, res->stage);
    cdp_layout_free(tmp);
    if ((st = cdp_planner_balance_result(c, best_dev, k->p, k->R, k->m, res->stage, &res->balance))) return st;
    if ((st = cdp_planner_build_layout(c, k, best_dev, res->balance.shares, &res->layout))) return st;
    cdp_planner_stage_predictions(c, res->layout, res->stage);
    double peak;
    char misfit_why[512];
    if (cdp_planner_misfit(c, res->layout, &peak, misfit_why, sizeof misfit_why))
        return cdp_fail(CDP_ERR_INVALID, "%s: planner: %d stage%s x %d replica%s as placed: %s", plan->source, k->p,
                        k->p == 1 ? "" : "s", k->R, k->R == 1 ? "" : "s", misfit_why);
    for (int i = 0; i < res->layout->n_ranks; i++)
        res->node[res->layout->rank[i].node].bytes += cdp_planner_rank_host_bytes(c, &res->layout->rank[i]);
    for (int n = 0; n < t->n_nodes; n++)
        res->node[n].capacity_bytes =
            cdp_planner_node_capacity(plan, t, n, res->node[n].capacity_from, sizeof res->node[n].capacity_from);
    if (s->layout_only) return CDP_OK;
    if ((st = cdp_planner_prepare(c, k->p, k->R, k->m, (const int64_t(*)[2])k->ranges))) return st;
    double phase = 0;
    if (cdp_planner_layout_shares_processors(res->layout)) {
        if ((st = cdp_planner_simulate_layout(c, res->layout, &s->sr))) return st;
        res->predicted = (struct cdp_planner_prediction){s->sr->step_s, s->sr->bubble, s->sr->samples_per_s};
        phase = s->sr->phase_s;
        cdp_sim_result_free(s->sr);
        s->sr = NULL;
    } else {
        for (int i = 0; i < res->layout->n_ranks; i++) {
            const struct cdp_layout_rank *q = &res->layout->rank[i];
            if (q->tensor == 0) s->dev[q->stage * k->R + q->replica] = q->device;
        }
        if ((st = cdp_planner_sim_numbers(c, s->dev, &res->predicted, &phase))) return st;
    }
    res->predicted_ok = 1;
    if ((st = cdp_planner_balance_predict(k->p, k->R, k->m, res->predicted.step_s, phase, &res->balance))) return st;
    /* each baseline predicted as the chosen layout is (layout_step) */
    static const char *const names[2] = {"ordered-pp-inner", "ordered-dp-inner"};
    for (int i = 0; i < 2; i++) {
        if (i == 0) cdp_placement_ordered_pp_inner(k->p, k->R, s->dev);
        else cdp_placement_ordered_dp_inner(k->p, k->R, s->dev);
        cdp_planner_to_leaders(c, k->p * k->R, s->dev);
        res->baseline[i].name = names[i];
        if ((st = layout_step(c, s, k, s->dev, res->balance.shares, &res->baseline[i].pred, NULL))) return st;
    }
    return CDP_OK;
}

/* floor_sps: shapes whose bound is no more are not simulated (another t's
 * plan is faster); CDP_ERR_UNSUPPORTED when that leaves none. */
static cdp_status run_fixed(const struct cdp_plan *plan, const struct cdp_topology *t,
                            const struct cdp_cost_table *costs, int flags, double floor_sps,
                            struct cdp_planner_result *out)
{
    const uint64_t t0 = cdp_time_ns();
    struct ctx c;
    struct search s = {.layout_only = (flags & CDP_PLANNER_LAYOUT_ONLY) && all_fixed(plan)};
    struct cdp_planner_result res = {0};
    int *best_dev = NULL, best = 0;
    cdp_status st;

    if ((st = cdp_planner_ctx_init(&c, plan, t, costs))) goto fail;
    s.dev = malloc((size_t)c.nd * sizeof *s.dev);
    best_dev = malloc((size_t)c.nd * sizeof *best_dev);
    if (!s.dev || !best_dev) {
        st = cdp_fail(CDP_ERR_NOMEM, "planner: out of memory");
        goto fail;
    }
    int W = c.nd;
    if (plan->cluster.devices != CDP_AUTO && plan->cluster.nodes * plan->cluster.devices < W)
        W = (int)(plan->cluster.nodes * plan->cluster.devices);
    if (c.tp > 1) { /* the search places (stage, replica) on tensor groups */
        int g = 0;
        while (g < c.n_groups && c.leader[g] + c.tp <= W) g++;
        W = g;
    }
    if ((st = try_shapes(&c, &s, W, &res))) goto fail;
    if (s.layout_only || (flags & CDP_PLANNER_CHECK_EVERY_SHAPE)) st = check_all(&c, &s);
    if (!st && !s.layout_only) st = screen(&c, &s, &res, floor_sps);
    if (st) goto fail;
    if (s.n_cand == 0 && !s.layout_only && s.n_fit == 0) {
        /* none simulated and none checked fits: whether any shape fits at
         * all (in the order enumerated, till one does) says which answer */
        for (int i = 0; i < s.n_shape && s.n_fit == 0; i++)
            if (!s.shape[i].checked && (st = check_shape(&c, &s, i))) goto fail;
        for (int i = 0; i < s.n_cand; i++) free(s.cand[i].ranges);
        s.n_cand = 0;
    }
    if (s.n_fit == 0) {
        /* every shape checked again in the order enumerated: the why of the
         * last that does not fit, as the message has always named it */
        for (int i = 0; i < s.n_shape; i++) s.shape[i].checked = 0;
        s.n_tried = s.n_checked = 0;
        s.device_short = 0;
        s.why[0] = '\0';
        if ((st = check_all(&c, &s))) goto fail;
        res.feasible = s.n_fit, res.checked = s.n_checked;
        st = none_fits(&c, &s, W, &res);
        goto fail;
    }
    res.feasible = s.n_fit, res.checked = s.n_checked;
    if (s.n_cand == 0) { /* every shape's bound below another t's plan */
        st = CDP_ERR_UNSUPPORTED;
        cdp_fail(st, "every shape's bound is below the plan of another t");
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
    /* devices left idle: the best simulated shape that would use more, for the dry-run's why */
    for (int i = 0; i < s.n_cand; i++) {
        const struct cand *k = &s.cand[i], *b = &s.cand[best];
        if (k->p * k->R > b->p * b->R && k->screened && k->sps > res.more.samples_per_s)
            res.more = (struct cdp_planner_more){k->p, k->R, k->m, k->sps};
    }
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
    cdp_planner_ctx_free(&c);
    free(best_dev);
    return st;
}

/* The sequence parallelism tried at t (out: 0 off, 1 on; how many): off at
 * t = 1, without the key, and for a model the runtime does not run sequence
 * parallel (cdp_plan_sequence_parallel_runs); "auto": off and on; true: on.
 * 0 (why) when true cannot run at t (the context is no multiple of it). */
static int sp_choices(const struct cdp_plan *plan, int tp, int *out, char *why, size_t cap)
{
    const struct cdp_parallel_desc *pd = &plan->parallel;
    out[0] = 0;
    if (tp < 2 || (!pd->sequence_parallel && !pd->sequence_parallel_auto) ||
        !cdp_plan_sequence_parallel_runs(&plan->model, NULL, 0))
        return 1;
    if (plan->model.context % tp) {
        if (pd->sequence_parallel_auto) return 1;
        snprintf(why, cap, "/parallel/sequence_parallel true needs /model/context %lld to be a multiple of t",
                 (long long)plan->model.context);
        return 0;
    }
    if (pd->sequence_parallel_auto) {
        out[1] = 1;
        return 2;
    }
    out[0] = 1;
    return 1;
}

/* The most device memory a rank of r's layout allocates. */
static double peak_of(const struct cdp_planner_result *r)
{
    double peak = 0;
    for (int i = 0; i < r->layout->n_ranks; i++)
        if ((double)r->layout->rank[i].memory.device > peak) peak = (double)r->layout->rank[i].memory.device;
    return peak;
}

/* The search over t and sequence parallelism (docs/parallelism.md, "How the
 * planner chooses t"): the plan's t, or under "auto" each t the model and the
 * topology allow (cdp_planner_tensor_choices), and at each the sequence
 * parallelism the plan allows (sp_choices), each planned as fixed; the
 * fastest predicted is kept (as fast: the one of less memory) and the others
 * are its runners-up. A plan that fixes both is planned once, with no table. */
cdp_status cdp_planner_run(const struct cdp_plan *plan, const struct cdp_topology *t,
                           const struct cdp_cost_table *costs, int flags, struct cdp_planner_result *out)
{
    if (plan->parallel.tensor != CDP_AUTO && !plan->parallel.sequence_parallel_auto) {
        cdp_status st = run_fixed(plan, t, costs, flags, 0, out);
        if (!st) out->sequence_parallel = plan->model.seq_parallel;
        return st;
    }
    const uint64_t t0 = cdp_time_ns();
    int ts[CDP_PLANNER_TENSOR_CHOICES];
    char why[256];
    const int n = cdp_planner_tensor_choices(plan, t, ts, CDP_PLANNER_TENSOR_CHOICES, why, sizeof why);
    struct cdp_planner_result best = {0}, r;
    struct cdp_planner_tensor_alt alt[CDP_PLANNER_TENSOR_ALTS];
    int n_alt = 0, have = 0;
    double best_peak = 0;
    int64_t shapes = 0, checked = 0, feasible = 0, pruned = 0, sims = 0, rsims = 0;
    cdp_status st = CDP_OK, last_err = CDP_OK;
    char last_msg[1024] = "";
    /* the largest t first: its plan's throughput bounds the shapes of the
     * next (their bounds no higher are not simulated) */
    for (int i = n - 1; i >= 0; i--) {
        int sps[2];
        char sp_why[256] = "";
        const int n_sp = sp_choices(plan, ts[i], sps, sp_why, sizeof sp_why);
        if (n_sp == 0) {
            struct cdp_planner_tensor_alt *a = &alt[n_alt++];
            memset(a, 0, sizeof *a);
            a->tensor = ts[i];
            a->sequence_parallel = 1;
            snprintf(a->why, sizeof a->why, "not tried: %s", sp_why);
            continue;
        }
        for (int j = 0; j < n_sp; j++) {
            struct cdp_plan copy = *plan; /* shallow: read only, never freed */
            copy.parallel.tensor = ts[i];
            copy.parallel.sequence_parallel = sps[j];
            copy.parallel.sequence_parallel_auto = 0;
            copy.model.seq_parallel = sps[j];
            memset(&r, 0, sizeof r);
            st = run_fixed(&copy, t, costs, flags, have ? best.predicted.samples_per_s : 0, &r);
            struct cdp_planner_tensor_alt *a = &alt[n_alt++];
            memset(a, 0, sizeof *a);
            a->tensor = ts[i];
            a->sequence_parallel = sps[j];
            if (st == CDP_ERR_UNSUPPORTED) {
                snprintf(a->why, sizeof a->why, "not simulated: no shape's bound reaches the t = %d%s plan (%.1f "
                         "samples/s)", best.layout->tensor, best.sequence_parallel ? " sequence parallel" : "",
                         best.predicted.samples_per_s);
                continue;
            }
            if (st) {
                if (st != CDP_ERR_INVALID) {
                    cdp_planner_result_clear(&best);
                    return st;
                }
                snprintf(a->why, sizeof a->why, "no plan: %s", cdp_last_error());
                /* the smallest t's reason is the one kept (t = 1 last: the plan as it would be without groups) */
                last_err = st;
                snprintf(last_msg, sizeof last_msg, "%s", cdp_last_error());
                continue;
            }
            r.sequence_parallel = sps[j];
            shapes += r.shapes, checked += r.checked, feasible += r.feasible, pruned += r.pruned;
            a->bounded = have; /* shapes under the plan found were not simulated: its best of the rest */
            sims += r.simulations, rsims += r.replica_simulations;
            a->ok = 1;
            a->stages = r.layout->stages;
            a->replicas = r.layout->replicas;
            a->micro_batches = r.layout->micro_batches;
            a->chunks = r.layout->chunks;
            a->schedule = r.layout->schedule;
            a->recompute = r.layout->recompute;
            a->step_s = r.predicted.step_s;
            a->samples_per_s = r.predicted.samples_per_s;
            a->bubble = r.predicted.bubble;
            a->peak_bytes = peak_of(&r);
            const int better = !have || (r.predicted_ok && (r.predicted.samples_per_s > best.predicted.samples_per_s ||
                                                            (r.predicted.samples_per_s == best.predicted.samples_per_s &&
                                                             a->peak_bytes < best_peak)));
            if (better) {
                cdp_planner_result_clear(&best);
                best = r;
                best_peak = a->peak_bytes;
                have = 1;
            } else {
                cdp_planner_result_clear(&r);
            }
        }
    }
    if (!have) return cdp_fail(last_err ? last_err : CDP_ERR_INVALID, "%s", last_msg);
    memcpy(best.tensor_alt, alt, sizeof alt);
    best.n_tensor_alt = n_alt;
    snprintf(best.tensor_why, sizeof best.tensor_why, "%s", plan->parallel.tensor == CDP_AUTO ? why : "");
    best.shapes = shapes, best.checked = checked, best.feasible = feasible, best.pruned = pruned;
    best.simulations = sims, best.replica_simulations = rsims;
    best.search_s = (double)(cdp_time_ns() - t0) * 1e-9;
    *out = best;
    return CDP_OK;
}
