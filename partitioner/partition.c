/* Contiguous partitions by dynamic programming: the balanced split, and the
 * memory-aware one the planner uses (docs/planner.md). */
#include "partitioner/partition.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "pipeline/schedule.h"

cdp_status cdp_partition_balanced(const double *cost, int n, int k, int64_t (*ranges)[2])
{
    if (k < 1 || k > n)
        return cdp_fail(CDP_ERR_INVALID, "cannot split %d units into %d non-empty stages", n, k);
    double *prefix = malloc((size_t)(n + 1) * sizeof *prefix);
    double *best = malloc((size_t)(k + 1) * (size_t)(n + 1) * sizeof *best);
    int *cut = malloc((size_t)(k + 1) * (size_t)(n + 1) * sizeof *cut);
    if (!prefix || !best || !cut) {
        free(prefix);
        free(best);
        free(cut);
        return cdp_fail(CDP_ERR_NOMEM, "out of memory partitioning %d units", n);
    }
    prefix[0] = 0;
    for (int i = 0; i < n; i++) prefix[i + 1] = prefix[i] + cost[i];
#define B(j, i) best[(size_t)(j) * (size_t)(n + 1) + (size_t)(i)]
#define CUT(j, i) cut[(size_t)(j) * (size_t)(n + 1) + (size_t)(i)]
    /* B(j, i): the best largest cost of splitting the first i units into j ranges */
    for (int i = 1; i <= n; i++) {
        B(1, i) = prefix[i];
        CUT(1, i) = 0;
    }
    for (int j = 2; j <= k; j++) {
        for (int i = j; i <= n; i++) {
            double b = -1;
            int bc = j - 1;
            for (int c = j - 1; c < i; c++) {
                double last = prefix[i] - prefix[c];
                double v = B(j - 1, c) > last ? B(j - 1, c) : last;
                if (b < 0 || v < b) {
                    b = v;
                    bc = c;
                }
            }
            B(j, i) = b;
            CUT(j, i) = bc;
        }
    }
    int end = n;
    for (int j = k; j >= 1; j--) {
        int c = CUT(j, end);
        ranges[j - 1][0] = c;
        ranges[j - 1][1] = end;
        end = c;
    }
#undef B
#undef CUT
    free(prefix);
    free(best);
    free(cut);
    return CDP_OK;
}

/* The objective of a chunked split: the largest rank total, then the sum of
 * squared totals (which moves off plateaus of the largest). */
static void rank_objective(const double *load, int ranks, double *worst, double *squares)
{
    *worst = 0;
    *squares = 0;
    for (int r = 0; r < ranks; r++) {
        if (load[r] > *worst) *worst = load[r];
        *squares += load[r] * load[r];
    }
}

cdp_status cdp_partition_balanced_ranks(const double *cost, int n, int k, const int *owner, int ranks,
                                        int64_t (*ranges)[2])
{
    cdp_status st = cdp_partition_balanced(cost, n, k, ranges);
    if (st) return st;
    for (int j = 0; j < k; j++)
        if (owner[j] < 0 || owner[j] >= ranks)
            return cdp_fail(CDP_ERR_INVALID, "range %d belongs to rank %d, outside 0..%d", j, owner[j], ranks - 1);
    double *prefix = malloc((size_t)(n + 1) * sizeof *prefix), *load = calloc((size_t)ranks, sizeof *load);
    if (!prefix || !load) {
        free(prefix);
        free(load);
        return cdp_fail(CDP_ERR_NOMEM, "out of memory partitioning %d units", n);
    }
    prefix[0] = 0;
    for (int i = 0; i < n; i++) prefix[i + 1] = prefix[i] + cost[i];
    for (int j = 0; j < k; j++) load[owner[j]] += prefix[ranges[j][1]] - prefix[ranges[j][0]];
    double worst, squares;
    rank_objective(load, ranks, &worst, &squares);
    /* boundary j (1..k-1) is ranges[j][0] == ranges[j-1][1]: each pass puts
     * every boundary where the objective is least between its neighbours */
    for (int pass = 0, moved = 1; moved && pass < 4 * n; pass++) {
        moved = 0;
        for (int j = 1; j < k; j++) {
            const int a = owner[j - 1], b = owner[j];
            if (a == b) continue;
            const int64_t lo = ranges[j - 1][0] + 1, hi = ranges[j][1] - 1, at = ranges[j][0];
            const double la = load[a] - (prefix[at] - prefix[ranges[j - 1][0]]),
                         lb = load[b] - (prefix[ranges[j][1]] - prefix[at]);
            int64_t best = at;
            double bw = worst, bs = squares;
            for (int64_t x = lo; x <= hi; x++) {
                if (x == at) continue;
                load[a] = la + prefix[x] - prefix[ranges[j - 1][0]];
                load[b] = lb + prefix[ranges[j][1]] - prefix[x];
                double w, q;
                rank_objective(load, ranks, &w, &q);
                /* a relative margin: rounding alone never moves a boundary */
                if (w < bw * (1 - 1e-12) || (w <= bw * (1 + 1e-12) && q < bs * (1 - 1e-12))) best = x, bw = w, bs = q;
            }
            load[a] = la + prefix[best] - prefix[ranges[j - 1][0]];
            load[b] = lb + prefix[ranges[j][1]] - prefix[best];
            if (best != at) {
                ranges[j - 1][1] = ranges[j][0] = best;
                worst = bw, squares = bs;
                moved = 1;
            }
        }
    }
    free(prefix);
    free(load);
    return CDP_OK;
}

/* ---- memory-aware partition ---------------------------------------------- */

cdp_status cdp_partition_in_flight(enum cdp_schedule_kind kind, int p, int m, int *in_flight)
{
    if (p < 1 || m < 1) return cdp_fail(CDP_ERR_INVALID, "in-flight counts need p >= 1 and m >= 1 (got %d, %d)", p, m);
    if (cdp_schedule_has_chunks(kind))
        return cdp_fail(CDP_ERR_UNSUPPORTED, "memory-aware partition: schedule %s has no contiguous stages",
                        cdp_schedule_name(kind));
    /* what the schedule's own lists keep: its generator is the one home of the rule */
    struct cdp_schedule *sc = NULL;
    cdp_status st = cdp_schedule_build(kind, p, 1, m, 0, &sc);
    if (st) return st;
    for (int s = 0; s < p; s++) in_flight[s] = cdp_schedule_peak_in_flight(sc, s);
    cdp_schedule_free(sc);
    return CDP_OK;
}

/* What a solve sees: k stages, their in-flight counts and capacities. */
struct part_rules {
    int k;
    const int *in_flight;
    const double *capacity; /* NULL: unlimited */
};

/* The link after stage s. When the smallest fitting stage count is searched,
 * there are more boundaries than the spec lists: those take the slowest listed
 * link (a bound that cannot flatter the plan). */
static double boundary_bw(const struct cdp_partition_spec *sp, int s)
{
    if (!sp->bandwidth || sp->n_bandwidth == 0) return 0;
    if (sp->n_bandwidth == 1) return sp->bandwidth[0];
    if (s < sp->n_bandwidth) return sp->bandwidth[s];
    double slowest = 0;
    for (int i = 0; i < sp->n_bandwidth; i++)
        if (sp->bandwidth[i] > 0 && (slowest == 0 || sp->bandwidth[i] < slowest)) slowest = sp->bandwidth[i];
    return slowest;
}

/* Stage s = [c, i) from its sums, which every caller accumulates from unit
 * i-1 down to c, the order the DP uses, so that every place computing a stage
 * gets the same floating-point value. */
static void stage_from(const struct cdp_partition_spec *sp, const struct part_rules *ru, int c, int i, int s,
                       double comp, double state, double act, struct cdp_partition_stage *out)
{
    const double bw = boundary_bw(sp, s);
    out->first = c;
    out->end = i;
    out->compute_s = comp;
    out->send_s = s < ru->k - 1 && bw > 0 ? sp->unit[i - 1].out_bytes / bw : 0;
    out->time_s = comp + out->send_s;
    out->memory_bytes = sp->memory ? sp->memory(sp->memory_ctx, s, c, i)
                                  : state + act * ru->in_flight[s] + sp->workspace_bytes;
}

/* The sums of unit u added to a stage that grows to the left. */
static void grow_left(const struct cdp_partition_spec *sp, int u, double *comp, double *state, double *act)
{
    *comp += sp->unit[u].fwd_s + sp->unit[u].bwd_s;
    *state += sp->unit[u].state_bytes;
    *act += sp->unit[u].act_bytes;
}

/* What the split minimises for a stage. */
static double value_of(const struct cdp_partition_spec *sp, const struct cdp_partition_stage *stage)
{
    return sp->objective == CDP_PARTITION_MEMORY ? stage->memory_bytes : stage->time_s;
}

static int fits(const struct part_rules *ru, int s, double mem)
{
    return !ru->capacity || ru->capacity[s] <= 0 || mem <= ru->capacity[s];
}

/* best[j*(n+1)+i]: the least slowest-stage time of the first i units in j
 * stages within memory (INFINITY: none fits). Returns best[k][n]. */
static double solve(const struct cdp_partition_spec *sp, const struct part_rules *ru, double *best)
{
    const int n = sp->n, k = ru->k;
#define BEST(j, i) best[(size_t)(j) * (size_t)(n + 1) + (size_t)(i)]
    for (int j = 0; j <= k; j++)
        for (int i = 0; i <= n; i++) BEST(j, i) = INFINITY;
    BEST(0, 0) = 0;
    for (int j = 1; j <= k; j++) {
        const int s = j - 1;
        const double bw = boundary_bw(sp, s);
        for (int i = j; i <= n - (k - j); i++) {
            const double send = s < k - 1 && bw > 0 ? sp->unit[i - 1].out_bytes / bw : 0;
            double comp = 0, state = 0, act = 0, scratch = 0, b = INFINITY;
            for (int c = i - 1; c >= j - 1; c--) {
                comp += sp->unit[c].fwd_s + sp->unit[c].bwd_s;
                state += sp->unit[c].state_bytes;
                act += sp->unit[c].act_bytes;
                if (sp->unit[c].scratch_bytes > scratch) scratch = sp->unit[c].scratch_bytes;
                /* this bound only grows as the stage grows to the left; the
                 * memory model holds the largest scratch besides (a unit whose
                 * scratch alone is too large ends the search at once) */
                const double bound = state + act * ru->in_flight[s] + sp->workspace_bytes;
                if (!fits(ru, s, bound + (sp->memory ? scratch : 0))) break;
                if (j == 1 && c != 0) continue;
                const double prev = BEST(j - 1, c);
                if (sp->objective != CDP_PARTITION_MEMORY) {
                    /* the time only grows as the stage grows to the left: once
                     * it reaches b no earlier start improves on b, and a start
                     * that cannot improve needs no memory figure (the costly
                     * part: 1,000 units on 64 GPUs planned in 31 s, not 3 s) */
                    const double t = comp + send;
                    if (t >= b) break;
                    if (prev >= b) continue;
                    if (sp->memory && !fits(ru, s, sp->memory(sp->memory_ctx, s, c, i))) continue;
                    b = prev > t ? prev : t;
                    continue;
                }
                const double mem = sp->memory ? sp->memory(sp->memory_ctx, s, c, i) : bound;
                if (sp->memory && !fits(ru, s, mem)) continue;
                const double v = prev > mem ? prev : mem;
                if (v < b) b = v;
            }
            BEST(j, i) = b;
        }
    }
    return BEST(k, n);
#undef BEST
}

/* Rebuilds the split of value opt with the documented tie rule: ok[j][i] says
 * whether the first i units split into j stages each within opt and memory;
 * then, from the last stage, each stage starts at the earliest unit that
 * leaves a completable prefix. */
static void rebuild(const struct cdp_partition_spec *sp, const struct part_rules *ru, double opt,
                    unsigned char *ok, struct cdp_partition_stage *stage)
{
    const int n = sp->n, k = ru->k;
    struct cdp_partition_stage cand;
#define OK(j, i) ok[(size_t)(j) * (size_t)(n + 1) + (size_t)(i)]
    memset(ok, 0, (size_t)(k + 1) * (size_t)(n + 1));
    OK(0, 0) = 1;
    /* each stage grown to the left with running sums: O(k n^2) as the DP,
     * not O(k n^3) (2000 units took 30 s) */
    for (int j = 1; j <= k; j++)
        for (int i = j; i <= n; i++) {
            double comp = 0, state = 0, act = 0;
            const double bw = boundary_bw(sp, j - 1);
            const double send = j < k && bw > 0 ? sp->unit[i - 1].out_bytes / bw : 0;
            for (int c = i - 1; c >= j - 1 && !OK(j, i); c--) {
                grow_left(sp, c, &comp, &state, &act);
                /* as in solve: the time only grows to the left */
                if (sp->objective != CDP_PARTITION_MEMORY && comp + send > opt) break;
                if (!OK(j - 1, c)) continue;
                stage_from(sp, ru, c, i, j - 1, comp, state, act, &cand);
                OK(j, i) = value_of(sp, &cand) <= opt && fits(ru, j - 1, cand.memory_bytes);
            }
        }
    /* from the last stage: each starts at the earliest unit that leaves a completable prefix */
    int end = n;
    for (int j = k; j >= 1; j--) {
        double comp = 0, state = 0, act = 0;
        struct cdp_partition_stage best = {0};
        int found = 0;
        for (int c = end - 1; c >= j - 1; c--) {
            grow_left(sp, c, &comp, &state, &act);
            if (!OK(j - 1, c)) continue;
            stage_from(sp, ru, c, end, j - 1, comp, state, act, &cand);
            if (value_of(sp, &cand) <= opt && fits(ru, j - 1, cand.memory_bytes)) best = cand, found = 1;
        }
        CDP_ASSERT(found); /* opt came from the DP: a split within it exists */
        stage[j - 1] = best;
        end = (int)best.first;
    }
#undef OK
}

/* The message for k stages that do not fit: the smallest k' that would, under
 * the retry rule of struct cdp_partition_spec, or the heaviest unit alone. */
static cdp_status explain_infeasible(const struct cdp_partition_spec *sp, double *best)
{
    const int n = sp->n;
    if (sp->memory)
        return cdp_fail(CDP_ERR_INVALID, "%d units do not fit in %d stages within the memory capacity", n, sp->k);
    int *inf = malloc((size_t)n * sizeof *inf);
    double *cap = malloc((size_t)n * sizeof *cap);
    if (!inf || !cap) {
        free(inf);
        free(cap);
        return cdp_fail(CDP_ERR_NOMEM, "out of memory partitioning %d units", n);
    }
    double cmin = 0;
    for (int s = 0; sp->capacity && s < sp->k; s++)
        if (sp->capacity[s] > 0 && (cmin <= 0 || sp->capacity[s] < cmin)) cmin = sp->capacity[s];
    int found = 0;
    for (int k2 = sp->k + 1; k2 <= n && !found; k2++) {
        if (sp->micro_batches <= 0 || cdp_partition_in_flight(sp->schedule, k2, sp->micro_batches, inf))
            for (int s = 0; s < k2; s++) inf[s] = sp->in_flight[0];
        for (int s = 0; s < k2; s++) cap[s] = cmin;
        struct part_rules ru = {.k = k2, .in_flight = inf, .capacity = cap};
        if (isfinite(solve(sp, &ru, best))) found = k2;
    }
    cdp_status st;
    if (found) {
        st = cdp_fail(CDP_ERR_INVALID,
                      "%d units do not fit in %d stages within the memory capacity; the smallest number of stages "
                      "that fits is %d", n, sp->k, found);
    } else {
        /* one unit per stage does not fit: name the unit needing the most */
        if (sp->micro_batches <= 0 || cdp_partition_in_flight(sp->schedule, n, sp->micro_batches, inf))
            for (int s = 0; s < n; s++) inf[s] = sp->in_flight[0];
        int worst = 0;
        double need = -1;
        for (int i = 0; i < n; i++) {
            const double m = sp->unit[i].state_bytes + sp->unit[i].act_bytes * inf[i] + sp->workspace_bytes;
            if (m > need) {
                need = m;
                worst = i;
            }
        }
        const struct cdp_unit_cost *u = &sp->unit[worst];
        st = cdp_fail(CDP_ERR_INVALID,
                      "%d units do not fit in %d stages, nor in any number up to %d: unit %d alone needs %.0f bytes "
                      "(%.3f GiB: state %.0f + activations %.0f x %d in flight + workspace %.0f) against a capacity "
                      "of %.0f bytes (%.3f GiB)", n, sp->k, n, worst, need, need / 1073741824.0, u->state_bytes,
                      u->act_bytes, inf[worst], sp->workspace_bytes, cmin, cmin / 1073741824.0);
    }
    free(inf);
    free(cap);
    return st;
}

cdp_status cdp_partition_plan(const struct cdp_partition_spec *sp, struct cdp_partition_stage *stage)
{
    const int n = sp->n, k = sp->k;
    if (k < 1 || k > n) return cdp_fail(CDP_ERR_INVALID, "cannot split %d units into %d non-empty stages", n, k);
    if (sp->n_bandwidth != 0 && sp->n_bandwidth != 1 && sp->n_bandwidth != k - 1)
        return cdp_fail(CDP_ERR_INVALID, "partition: %d boundary bandwidths for %d stages (want 0, 1 or %d)",
                        sp->n_bandwidth, k, k - 1);
    if (!sp->in_flight) return cdp_fail(CDP_ERR_INVALID, "partition: no in-flight counts");
    for (int s = 0; s < k; s++)
        if (sp->in_flight[s] < 0)
            return cdp_fail(CDP_ERR_INVALID, "partition: stage %d has %d activations in flight", s, sp->in_flight[s]);
    for (int i = 0; i < n; i++) {
        const struct cdp_unit_cost *u = &sp->unit[i];
        if (!(u->fwd_s >= 0 && u->bwd_s >= 0 && u->state_bytes >= 0 && u->act_bytes >= 0 && u->out_bytes >= 0))
            return cdp_fail(CDP_ERR_INVALID, "partition: unit %d has a negative or NaN cost", i);
    }
    if (!(sp->workspace_bytes >= 0)) return cdp_fail(CDP_ERR_INVALID, "partition: negative workspace");
    double *best = malloc((size_t)(n + 1) * (size_t)(n + 1) * sizeof *best); /* k' <= n for the retries */
    unsigned char *ok = malloc((size_t)(k + 1) * (size_t)(n + 1));
    cdp_status st = CDP_OK;
    if (!best || !ok) {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory partitioning %d units", n);
        goto done;
    }
    struct part_rules ru = {.k = k, .in_flight = sp->in_flight, .capacity = sp->capacity};
    const double opt = solve(sp, &ru, best);
    if (!isfinite(opt)) {
        st = explain_infeasible(sp, best);
        goto done;
    }
    rebuild(sp, &ru, opt, ok, stage);
done:
    free(best);
    free(ok);
    return st;
}
