/* A given layout simulated (--simulate), and the spread of random placements
 * against the chosen one and the fixed orders (--explore). */
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

cdp_status cdp_planner_simulate(const struct cdp_plan *plan, const struct cdp_topology *t,
                                const struct cdp_cost_table *costs, const struct cdp_layout *l,
                                struct cdp_sim_result **out)
{
    struct ctx c;
    struct cdp_plan at = *plan; /* the layout's t ("auto" planned it); shallow, read only */
    at.parallel.tensor = l->tensor;
    at.model.seq_parallel = plan->model.seq_parallel && l->tensor > 1; /* as planned (cdp_planner_apply) */
    cdp_status st = cdp_planner_ctx_init_for(&c, &at, t, costs, l->recompute);
    if (!st) {
        c.kind = l->schedule;
        c.zero = l->zero;
        c.v = l->chunks;
        if (!(st = cdp_planner_prepare(&c, l->stages, l->replicas, l->micro_batches, (const int64_t(*)[2])l->ranges)))
            st = cdp_planner_simulate_layout(&c, l, out);
    }
    cdp_planner_ctx_free(&c);
    return st;
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
    const struct cdp_layout *l = r->layout;
    const int p = l->stages, R = l->replicas, N = p * R;
    struct cdp_planner_spread sp = {.n_random = n_random, .seed = seed};
    double *rnd = NULL;
    int *dev = NULL, *perm = NULL, *chosen = NULL;
    struct ctx c;
    if (n_random < 1 || N * l->tensor > t->n_gpus) return cdp_fail(CDP_ERR_INVALID, "planner: explore: bad sample count or shape");
    struct cdp_plan at = *plan; /* the layout's t ("auto" planned it); shallow, read only */
    at.parallel.tensor = l->tensor;
    at.model.seq_parallel = r->sequence_parallel;
    cdp_status st = cdp_planner_ctx_init_for(&c, &at, t, costs, l->recompute);
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
    for (int i = 0; i < l->n_ranks; i++) /* a tensor group by its first device */
        if (l->rank[i].tensor == 0) chosen[l->rank[i].stage * R + l->rank[i].replica] = l->rank[i].device;
    if ((st = cdp_planner_prepare(&c, p, R, l->micro_batches, (const int64_t(*)[2])l->ranges))) goto fail;
    sp.cheap = c.cheap;
    /* the chosen placement and the two fixed orders, then the random sample */
    for (int which = 0; which < 3 + n_random; which++) {
        if (which == 0) memcpy(dev, chosen, (size_t)N * sizeof *dev);
        else if (which == 1) cdp_placement_ordered_pp_inner(p, R, dev);
        else if (which == 2) cdp_placement_ordered_dp_inner(p, R, dev);
        else {
            for (int d = 0; d < c.n_groups; d++) perm[d] = d;
            for (int i = 0; i < N; i++) { /* partial Fisher-Yates: N distinct groups (devices at t = 1) */
                const int j = i + (int)(cdp_splitmix64(&seed) % (uint64_t)(c.n_groups - i));
                const int x = perm[i];
                perm[i] = perm[j];
                perm[j] = x;
            }
            memcpy(dev, perm, (size_t)N * sizeof *dev);
        }
        if (which) cdp_planner_to_leaders(&c, N, dev);
        const double step = cdp_planner_place_cost(dev, &c);
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
    cdp_planner_ctx_free(&c);
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
