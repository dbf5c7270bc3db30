/* Suite partition: the memory-aware partition (cdp_partition_plan) against
 * brute force over every composition on random small instances, the
 * infeasibility messages, heavy first/last stages and the tie rule; the
 * balanced split the executor uses. Costs are multiples of 1/4 and
 * bandwidths powers of two, so every sum is exact and splits compare equal. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "partitioner/partition.h"

static unsigned long long rng_state;
static int rnd(int lo, int hi) /* inclusive */
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return lo + (int)((rng_state >> 33) % (unsigned long long)(hi - lo + 1));
}

struct inst {
    struct cdp_unit_cost u[10];
    int n, k, inflight[4];
    double bw[3], cap[4];
    int n_bw;
    struct cdp_partition_spec sp;
};

static void spec_of(struct inst *I)
{
    I->sp = (struct cdp_partition_spec){.unit = I->u, .n = I->n, .k = I->k, .bandwidth = I->bw,
                                        .n_bandwidth = I->n_bw, .in_flight = I->inflight, .capacity = I->cap,
                                        .workspace_bytes = 2, .schedule = CDP_SCHEDULE_1F1B, .micro_batches = 4};
}

/* Brute force: every way to place k-1 cuts among n-1 gaps. ok = 0 when none fits. */
static int brute(const struct cdp_partition_spec *sp, const int *inflight, const double *cap, int k,
                 double *best, int *best_first)
{
    const int n = sp->n;
    int found = 0;
    for (unsigned mask = 0; mask < 1u << (n - 1); mask++) {
        if (__builtin_popcount(mask) != k - 1) continue;
        int first[4], s = 0, ok = 1;
        first[0] = 0;
        for (int g = 0; g < n - 1; g++)
            if (mask >> g & 1) first[++s] = g + 1;
        double worst = 0;
        for (s = 0; s < k && ok; s++) {
            const int a = first[s], b = s + 1 < k ? first[s + 1] : n;
            double t = 0, state = 0, act = 0;
            for (int i = a; i < b; i++) {
                t += sp->unit[i].fwd_s + sp->unit[i].bwd_s;
                state += sp->unit[i].state_bytes;
                act += sp->unit[i].act_bytes;
            }
            const double bw = sp->n_bandwidth == 0 ? 0 : sp->n_bandwidth == 1 ? sp->bandwidth[0] : sp->bandwidth[s];
            if (s < k - 1 && bw > 0) t += sp->unit[b - 1].out_bytes / bw;
            const double mem = state + act * inflight[s] + sp->workspace_bytes;
            if (cap && cap[s] > 0 && mem > cap[s]) ok = 0;
            if (t > worst) worst = t;
        }
        if (!ok) continue;
        /* tie rule: the last stage starts earliest, then the one before, ... */
        int better = !found || worst < *best;
        if (found && worst == *best) {
            for (s = k - 1; s >= 1; s--)
                if (first[s] != best_first[s]) {
                    better = first[s] < best_first[s];
                    break;
                }
        }
        if (better) {
            found = 1;
            *best = worst;
            memcpy(best_first, first, sizeof first);
        }
    }
    return found;
}

/* The smallest k' > k that fits under the spec's retry rule (1F1B counts for
 * micro_batches > 0, else in_flight[0] everywhere; the smallest capacity), by
 * brute force over compositions; 0 if none. */
static int brute_retry(const struct cdp_partition_spec *sp)
{
    const int n = sp->n;
    double cmin = 0;
    for (int s = 0; s < sp->k; s++)
        if (sp->capacity[s] > 0 && (cmin <= 0 || sp->capacity[s] < cmin)) cmin = sp->capacity[s];
    for (int k2 = sp->k + 1; k2 <= n; k2++) {
        int inf[10];
        for (int s = 0; s < k2; s++)
            inf[s] = sp->micro_batches <= 0 ? sp->in_flight[0]
                                            : (k2 - s < sp->micro_batches ? k2 - s : sp->micro_batches);
        for (unsigned mask = 0; mask < 1u << (n - 1); mask++) {
            if (__builtin_popcount(mask) != k2 - 1) continue;
            int first[10], s = 0, good = 1;
            first[0] = 0;
            for (int g = 0; g < n - 1; g++)
                if (mask >> g & 1) first[++s] = g + 1;
            for (s = 0; s < k2 && good; s++) {
                const int a = first[s], e = s + 1 < k2 ? first[s + 1] : n;
                double state = 0, act = 0;
                for (int i = a; i < e; i++) {
                    state += sp->unit[i].state_bytes;
                    act += sp->unit[i].act_bytes;
                }
                if (cmin > 0 && state + act * inf[s] + sp->workspace_bytes > cmin) good = 0;
            }
            if (good) return k2;
        }
    }
    return 0;
}

Test(partition, plan_equals_brute_force_on_random_instances)
{
    int feasible = 0, infeasible = 0, memory_bound = 0, retry_named = 0;
    rng_state = 12345;
    for (int it = 0; it < 4000; it++) {
        struct inst I;
        memset(&I, 0, sizeof I);
        I.n = rnd(1, 10);
        I.k = rnd(1, I.n < 4 ? I.n : 4);
        double total_state = 0;
        for (int i = 0; i < I.n; i++) {
            I.u[i].fwd_s = rnd(0, 16) / 4.0;
            I.u[i].bwd_s = rnd(0, 32) / 4.0;
            I.u[i].state_bytes = rnd(0, 20);
            I.u[i].act_bytes = rnd(0, 5);
            I.u[i].out_bytes = rnd(0, 8);
            total_state += I.u[i].state_bytes;
        }
        I.n_bw = rnd(0, 2) == 0 ? 0 : rnd(0, 1) ? 1 : I.k - 1;
        for (int s = 0; s < 3; s++) I.bw[s] = (double)(1 << rnd(0, 3));
        if (I.n_bw == 1 && rnd(0, 4) == 0) I.bw[0] = 0; /* unlimited */
        int fk = rnd(0, 1);
        for (int s = 0; s < I.k; s++) I.inflight[s] = fk ? I.k - s : 4;
        for (int s = 0; s < I.k; s++)
            I.cap[s] = rnd(0, 5) == 0 ? 0 : 2 + total_state / I.k + rnd(0, (int)total_state / 2 + 10);
        spec_of(&I);
        I.sp.micro_batches = fk ? 4 : 0; /* 1F1B, m = 4; else the retry keeps in_flight[0] = 4 */
        double bv = 0;
        int bf[4];
        const int ok = brute(&I.sp, I.inflight, I.cap, I.k, &bv, bf);
        struct cdp_partition_stage st[4];
        cdp_status rc = cdp_partition_plan(&I.sp, st);
        if (!ok) {
            cr_assert_eq(rc, CDP_ERR_INVALID, "instance %d: brute force finds no split, the DP does", it);
            infeasible++;
            const int k2 = brute_retry(&I.sp);
            char want[96];
            if (k2) snprintf(want, sizeof want, "smallest number of stages that fits is %d", k2);
            else snprintf(want, sizeof want, "nor in any number up to %d", I.n);
            cr_expect(strstr(cdp_last_error(), want), "instance %d: want \"%s\" in: %s", it, want,
                      cdp_last_error());
            retry_named += k2 > 0;
            continue;
        }
        cr_assert_eq(rc, CDP_OK, "instance %d: %s", it, cdp_last_error());
        feasible++;
        double worst = 0;
        for (int s = 0; s < I.k; s++) {
            cr_assert_eq(st[s].first, bf[s], "instance %d stage %d: first %lld, brute force %d", it, s,
                         (long long)st[s].first, bf[s]);
            cr_assert_eq(st[s].end, s + 1 < I.k ? bf[s + 1] : I.n);
            cr_assert_eq(st[s].time_s, st[s].compute_s + st[s].send_s);
            cr_assert(I.cap[s] <= 0 || st[s].memory_bytes <= I.cap[s]);
            worst = fmax(worst, st[s].time_s);
        }
        cr_assert_eq(worst, bv, "instance %d: %g vs brute force %g", it, worst, bv);
        /* memory forced an unbalanced split: without capacities the optimum is faster */
        double fv = 0;
        int ff[4];
        brute(&I.sp, I.inflight, NULL, I.k, &fv, ff);
        memory_bound += fv < bv;
    }
    cr_expect_gt(feasible, 1000, "%d", feasible);
    cr_expect_gt(infeasible, 200, "%d", infeasible);
    cr_expect_gt(memory_bound, 100, "%d", memory_bound);
    cr_expect_gt(retry_named, 20, "%d", retry_named);
}

static void uniform(struct inst *I, int n, int k)
{
    memset(I, 0, sizeof *I);
    I->n = n;
    I->k = k;
    for (int i = 0; i < n; i++) I->u[i] = (struct cdp_unit_cost){.fwd_s = 1, .bwd_s = 2, .state_bytes = 10};
    for (int s = 0; s < k; s++) I->inflight[s] = k - s;
    spec_of(I);
    I->sp.capacity = NULL;
    I->sp.workspace_bytes = 0;
}

Test(partition, infeasible_names_smallest_stage_count)
{
    struct inst I;
    uniform(&I, 6, 2);
    for (int s = 0; s < 2; s++) I.cap[s] = 25; /* two units of 10 per stage at most */
    I.sp.capacity = I.cap;
    struct cdp_partition_stage st[4];
    cr_assert_eq(cdp_partition_plan(&I.sp, st), CDP_ERR_INVALID);
    cr_expect(strstr(cdp_last_error(), "6 units do not fit in 2 stages"), "%s", cdp_last_error());
    cr_expect(strstr(cdp_last_error(), "smallest number of stages that fits is 3"), "%s", cdp_last_error());
    /* with 3 stages it fits, two units each */
    I.k = 3;
    I.cap[2] = 25;
    spec_of(&I);
    I.sp.workspace_bytes = 0;
    cr_assert_eq(cdp_partition_plan(&I.sp, st), CDP_OK, "%s", cdp_last_error());
    for (int s = 0; s < 3; s++) cr_expect_eq(st[s].end - st[s].first, 2);
    /* one unit larger than a device: no stage count helps */
    I.u[3].state_bytes = 30;
    cr_assert_eq(cdp_partition_plan(&I.sp, st), CDP_ERR_INVALID);
    cr_expect(strstr(cdp_last_error(), "unit 3 alone needs 30 bytes"), "%s", cdp_last_error());
    cr_expect(strstr(cdp_last_error(), "capacity of 25 bytes"), "%s", cdp_last_error());
}

/* The smallest-count search tries more stages than the spec lists boundary
 * links for: the extra boundaries take the slowest listed link (this read past
 * the list before; the sanitizer build checks it). */
Test(partition, infeasible_search_with_a_link_per_boundary)
{
    struct inst I;
    uniform(&I, 6, 3);
    I.n_bw = 2; /* one link per boundary of 3 stages */
    I.bw[0] = 8;
    I.bw[1] = 2;
    for (int s = 0; s < 3; s++) I.cap[s] = 15; /* one unit of 10 per stage */
    spec_of(&I);
    I.sp.workspace_bytes = 0;
    for (int i = 0; i < 6; i++) I.u[i].out_bytes = 4;
    struct cdp_partition_stage st[4];
    cr_assert_eq(cdp_partition_plan(&I.sp, st), CDP_ERR_INVALID);
    cr_expect(strstr(cdp_last_error(), "6 units do not fit in 3 stages"), "%s", cdp_last_error());
    cr_expect(strstr(cdp_last_error(), "smallest number of stages that fits is 6"), "%s", cdp_last_error());
}

Test(partition, activations_in_flight_count_per_stage)
{
    int f[4];
    cr_assert_eq(cdp_partition_in_flight(CDP_SCHEDULE_1F1B, 4, 8, f), CDP_OK);
    for (int s = 0; s < 4; s++) cr_expect_eq(f[s], 4 - s);
    cr_assert_eq(cdp_partition_in_flight(CDP_SCHEDULE_1F1B, 4, 2, f), CDP_OK);
    cr_expect(f[0] == 2 && f[1] == 2 && f[2] == 2 && f[3] == 1);
    cr_assert_eq(cdp_partition_in_flight(CDP_SCHEDULE_GPIPE, 3, 5, f), CDP_OK);
    cr_expect(f[0] == 5 && f[2] == 5);
    cr_expect_eq(cdp_partition_in_flight(CDP_SCHEDULE_INTERLEAVED, 4, 8, f), CDP_ERR_UNSUPPORTED);
    /* 1F1B: stage 0 holds 4 activations, stage 3 one, so with equal
     * capacities the early stages take fewer units */
    struct inst I;
    uniform(&I, 8, 4);
    for (int i = 0; i < 8; i++) I.u[i] = (struct cdp_unit_cost){.fwd_s = 1, .bwd_s = 1, .act_bytes = 4};
    cdp_partition_in_flight(CDP_SCHEDULE_1F1B, 4, 8, I.inflight);
    for (int s = 0; s < 4; s++) I.cap[s] = 40;
    I.sp.capacity = I.cap;
    struct cdp_partition_stage st[4];
    cr_assert_eq(cdp_partition_plan(&I.sp, st), CDP_OK, "%s", cdp_last_error());
    cr_expect_eq(st[0].end - st[0].first, 2, "stage 0 holds 4 in flight: 2 units x 4 x 4 = 32 <= 40");
    cr_expect_eq(st[0].memory_bytes, 32);
    cr_expect_eq(st[3].first, 6);
}

Test(partition, heavy_first_and_last_stages)
{
    /* an embedding (cheap compute, large state) first and a head (large compute) last */
    struct inst I;
    uniform(&I, 8, 4);
    I.u[0] = (struct cdp_unit_cost){.fwd_s = 0.25, .bwd_s = 0.25, .state_bytes = 60, .out_bytes = 8};
    I.u[7] = (struct cdp_unit_cost){.fwd_s = 4, .bwd_s = 8, .state_bytes = 20};
    for (int s = 0; s < 4; s++) I.cap[s] = 80;
    I.sp.capacity = I.cap;
    I.bw[0] = 4;
    I.sp.n_bandwidth = 1;
    struct cdp_partition_stage st[4];
    cr_assert_eq(cdp_partition_plan(&I.sp, st), CDP_OK, "%s", cdp_last_error());
    double bv;
    int bf[4];
    cr_assert(brute(&I.sp, I.inflight, I.cap, 4, &bv, bf));
    for (int s = 0; s < 4; s++) cr_expect_eq(st[s].first, bf[s]);
    cr_expect_eq(st[3].first, 7, "the head alone on the last stage");
    cr_expect_eq(st[3].time_s, 12);
    cr_expect_eq(st[3].send_s, 0, "the last stage sends nothing");
    cr_expect(st[0].end <= 3, "the embedding's 60 bytes leave room for two units of 10 at most");
    cr_expect_eq(st[0].memory_bytes, 60 + 10 * (st[0].end - 1));
}

Test(partition, ties_go_to_the_earliest_last_stage)
{
    struct inst I;
    uniform(&I, 5, 2); /* units of 3: splits 2+3 and 3+2 both reach 9 */
    struct cdp_partition_stage st[4];
    cr_assert_eq(cdp_partition_plan(&I.sp, st), CDP_OK, "%s", cdp_last_error());
    cr_expect_eq(st[0].end, 2);
    cr_expect_eq(st[1].time_s, 9);
    /* a zero-cost tail: the last stage starts as early as possible */
    uniform(&I, 6, 3);
    for (int i = 3; i < 6; i++) I.u[i] = (struct cdp_unit_cost){0};
    cr_assert_eq(cdp_partition_plan(&I.sp, st), CDP_OK);
    cr_expect(st[0].end == 1 && st[1].end == 2 && st[2].first == 2, "got [%lld,%lld) [%lld,%lld) [%lld,%lld)",
              (long long)st[0].first, (long long)st[0].end, (long long)st[1].first, (long long)st[1].end,
              (long long)st[2].first, (long long)st[2].end);
}

Test(partition, bad_arguments)
{
    struct inst I;
    uniform(&I, 3, 2);
    struct cdp_partition_stage st[4];
    I.sp.k = 4;
    cr_expect_eq(cdp_partition_plan(&I.sp, st), CDP_ERR_INVALID);
    I.sp.k = 2;
    I.sp.n_bandwidth = 3;
    cr_expect_eq(cdp_partition_plan(&I.sp, st), CDP_ERR_INVALID);
    I.sp.n_bandwidth = 0;
    I.u[1].fwd_s = -1;
    cr_expect_eq(cdp_partition_plan(&I.sp, st), CDP_ERR_INVALID);
    cr_expect(strstr(cdp_last_error(), "unit 1"), "%s", cdp_last_error());
}

Test(partition, balanced_split_unchanged)
{
    const double c[] = {1, 2, 3, 4, 5, 6};
    int64_t r[3][2];
    cr_assert_eq(cdp_partition_balanced(c, 6, 3, r), CDP_OK);
    cr_expect(r[0][1] == 3 && r[1][1] == 5 && r[2][1] == 6, "%lld %lld", (long long)r[0][1], (long long)r[1][1]);
    cr_expect_eq(cdp_partition_balanced(c, 6, 7, r), CDP_ERR_INVALID);
}

/* Chunked schedules: each rank's chunks together. zbv on 2 ranks puts chunks
 * 0 and 3 (the model's two ends) on rank 0; a heavy first and last unit then
 * leaves the chunk-balanced split far from the best of the ranks' totals,
 * which a brute force over every split finds. */
static double worst_rank(const double *c, int64_t (*r)[2], const int *owner, int k, int ranks)
{
    double load[8] = {0}, w = 0;
    for (int j = 0; j < k; j++)
        for (int64_t i = r[j][0]; i < r[j][1]; i++) load[owner[j]] += c[i];
    for (int q = 0; q < ranks; q++) w = load[q] > w ? load[q] : w;
    return w;
}

Test(partition, chunked_split_balances_each_ranks_total)
{
    static const double cases[][8] = {{10, 1, 1, 1, 1, 1, 1, 10}, {5, 2, 2, 2, 2, 2, 2, 9}, {1, 1, 1, 1, 1, 1, 1, 1},
                                      {3, 1, 4, 1, 5, 9, 2, 6}};
    const int owner[4] = {0, 1, 1, 0}, n = 8, k = 4;
    for (size_t q = 0; q < sizeof cases / sizeof cases[0]; q++) {
        const double *c = cases[q];
        int64_t r[4][2], chunks[4][2];
        cr_assert_eq(cdp_partition_balanced(c, n, k, chunks), CDP_OK);
        cr_assert_eq(cdp_partition_balanced_ranks(c, n, k, owner, 2, r), CDP_OK);
        for (int j = 0; j < k; j++) {
            cr_assert_lt(r[j][0], r[j][1], "case %zu: chunk %d empty", q, j);
            if (j) cr_assert_eq(r[j][0], r[j - 1][1]);
        }
        cr_assert(r[0][0] == 0 && r[k - 1][1] == n);
        double best = 1e300;
        for (int a = 1; a < n; a++)
            for (int b = a + 1; b < n; b++)
                for (int d = b + 1; d < n; d++) {
                    int64_t x[4][2] = {{0, a}, {a, b}, {b, d}, {d, n}};
                    const double w = worst_rank(c, x, owner, k, 2);
                    if (w < best) best = w;
                }
        const double got = worst_rank(c, r, owner, k, 2);
        cr_expect_leq(got, worst_rank(c, chunks, owner, k, 2), "case %zu", q);
        cr_expect_eq(got, best, "case %zu: %g, the best split gives %g", q, got, best);
    }
    const int bad[4] = {0, 1, 2, 0};
    int64_t r[4][2];
    cr_expect_eq(cdp_partition_balanced_ranks(cases[0], n, k, bad, 2, r), CDP_ERR_INVALID);
}
