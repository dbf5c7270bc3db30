/* Suite placement: the exact search against brute force over every injective
 * assignment on the 8-GPU presets (simulated step time as the objective, two
 * traffic mixes), the two fixed orders, the fallback past the evaluation cap,
 * and the heuristic on a 32-GPU cluster (valid, no worse than the fixed
 * orders, deterministic); the same on tensor groups as slots.
 * CDP_PLACEMENT_REPORT=1 prints the gains table. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/topology.h"
#include "harness.h"
#include "partitioner/placement.h"
#include "pipeline/schedule.h"
#include "pipeline/simulator.h"

enum traffic { ACTIVATIONS, GRADIENTS };
static const char *traffic_name[] = {"activations", "gradients"};

/* The simulator on a topology for p x R with synthetic equal stages. */
struct objective {
    struct cdp_topology *topo;
    struct cdp_schedule *sched;
    struct cdp_sim_vstage vs[8];
    double *bw, *lat;
    int p, R;
    long calls;
};

static void objective_init(struct objective *o, const char *preset, int p, int R, enum traffic tr)
{
    memset(o, 0, sizeof *o);
    cr_assert_eq(cdp_topology_load(preset, NULL, &o->topo), CDP_OK, "%s", cdp_last_error());
    const int n = o->topo->n_gpus;
    o->p = p;
    o->R = R;
    cr_assert_eq(cdp_schedule_build(CDP_SCHEDULE_1F1B, p, 1, 4, 0, &o->sched), CDP_OK, "%s", cdp_last_error());
    for (int s = 0; s < p; s++)
        o->vs[s] = tr == ACTIVATIONS
                       ? (struct cdp_sim_vstage){.fwd_s = 1e-3, .bwd_s = 2e-3, .out_bytes = 100e6, .grad_bytes = 1e6}
                       : (struct cdp_sim_vstage){.fwd_s = 1e-3, .bwd_s = 2e-3, .out_bytes = 1e6, .grad_bytes = 1e9};
    o->bw = calloc((size_t)n * n, sizeof *o->bw);
    o->lat = calloc((size_t)n * n, sizeof *o->lat);
    cr_assert(o->bw && o->lat);
    for (int a = 0; a < n; a++)
        for (int b = 0; b < n; b++) {
            struct cdp_topology_link l;
            if (a == b) continue;
            cr_assert_eq(cdp_topology_link(o->topo, a, b, &l), CDP_OK);
            o->bw[a * n + b] = l.bandwidth;
            o->lat[a * n + b] = l.latency;
        }
}

static void objective_free(struct objective *o)
{
    cdp_schedule_free(o->sched);
    cdp_topology_free(o->topo);
    free(o->bw);
    free(o->lat);
}

static double step_time(const int *device, void *ctx)
{
    struct objective *o = ctx;
    struct cdp_sim_config c = {.sched = o->sched, .replicas = o->R, .vstage = o->vs, .device = device,
                               .n_devices = o->topo->n_gpus, .bandwidth = o->bw, .latency = o->lat,
                               .samples_per_mb = 1};
    struct cdp_sim_result *r = NULL;
    o->calls++;
    if (cdp_sim_run(&c, &r)) return NAN;
    const double t = r->step_s;
    cdp_sim_result_free(r);
    return t;
}

/* Brute force: the least objective over every injective assignment. */
static void brute_rec(struct objective *o, int *a, int *used, int d, double *best)
{
    const int N = o->p * o->R;
    if (d == N) {
        const double c = step_time(a, o);
        if (c < *best) *best = c;
        return;
    }
    for (int dev = 0; dev < o->topo->n_gpus; dev++) {
        if (used[dev]) continue;
        used[dev] = 1;
        a[d] = dev;
        brute_rec(o, a, used, d + 1, best);
        used[dev] = 0;
    }
}

static int nvlinks(const struct cdp_topology *t, int a, int b)
{
    struct cdp_topology_link l;
    cr_assert_eq(cdp_topology_link(t, a, b, &l), CDP_OK);
    return l.nvlinks;
}

static void check_injective(const int *d, int N, int n)
{
    int used[64] = {0};
    for (int i = 0; i < N; i++) {
        cr_assert(d[i] >= 0 && d[i] < n, "device %d out of range", d[i]);
        cr_assert(!used[d[i]], "device %d used twice", d[i]);
        used[d[i]] = 1;
    }
}

static const int shapes[][2] = {{2, 2}, {4, 2}, {2, 4}, {8, 1}, {1, 8}, {2, 3}};

static void exact_vs_brute(const char *preset, enum traffic tr)
{
    const int report = getenv("CDP_PLACEMENT_REPORT") != NULL;
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k += (size_t)cdp_test_sample()) {
        const int p = shapes[k][0], R = shapes[k][1], N = p * R;
        struct objective o;
        objective_init(&o, preset, p, R, tr);
        struct cdp_placement_problem pb = {.topo = o.topo, .p = p, .R = R, .cost = step_time, .ctx = &o};
        int dev[8], a[8], used[16] = {0};
        struct cdp_placement_info info;
        cr_assert_eq(cdp_placement_search(&pb, dev, &info), CDP_OK, "%s", cdp_last_error());
        cr_assert(info.exact, "%s %dx%d: %s", preset, p, R, info.method);
        check_injective(dev, N, o.topo->n_gpus);
        cr_assert_eq(step_time(dev, &o), info.cost);
        double best = INFINITY;
        const long before = o.calls;
        brute_rec(&o, a, used, 0, &best);
        const long all = o.calls - before;
        cr_expect(fabs(info.cost - best) <= 1e-9 * best, "%s %dx%d %s: search %.9g, brute force %.9g (%s)", preset,
                  p, R, traffic_name[tr], info.cost, best, info.method);
        cr_expect_leq(info.evals, all);
        int pp[8], dp[8];
        cdp_placement_ordered_pp_inner(p, R, pp);
        cdp_placement_ordered_dp_inner(p, R, dp);
        const double cpp = step_time(pp, &o), cdp = step_time(dp, &o);
        cr_expect_leq(info.cost, cpp * (1 + 1e-12));
        cr_expect_leq(info.cost, cdp * (1 + 1e-12));
        if (report)
            fprintf(stderr, "| %s | %dx%d | %s | %.3f | %.3f | %.3f | %.1f%% | %lld of %ld |\n", preset, p, R,
                    traffic_name[tr], cpp * 1e3, cdp * 1e3, info.cost * 1e3,
                    100 * (fmin(cpp, cdp) - info.cost) / fmin(cpp, cdp), (long long)info.evals, all);
        objective_free(&o);
    }
}

Test(placement, exact_equals_brute_force_dgx1_v100_activations, .timeout = 600) { exact_vs_brute("dgx1-v100", ACTIVATIONS); }
Test(placement, exact_equals_brute_force_dgx1_v100_gradients, .timeout = 600) { exact_vs_brute("dgx1-v100", GRADIENTS); }
Test(placement, exact_equals_brute_force_pcie_activations, .timeout = 600) { exact_vs_brute("pcie-8gpu-2socket", ACTIVATIONS); }
Test(placement, exact_equals_brute_force_pcie_gradients, .timeout = 600) { exact_vs_brute("pcie-8gpu-2socket", GRADIENTS); }
Test(placement, exact_equals_brute_force_dgx_a100_activations, .timeout = 600) { exact_vs_brute("dgx-a100", ACTIVATIONS); }
Test(placement, exact_equals_brute_force_dgx_a100_gradients, .timeout = 600) { exact_vs_brute("dgx-a100", GRADIENTS); }

Test(placement, fixed_orders)
{
    int d[6];
    cdp_placement_ordered_pp_inner(2, 3, d); /* [s*R + r] = r*p + s */
    cr_expect(d[0] == 0 && d[1] == 2 && d[2] == 4 && d[3] == 1 && d[4] == 3 && d[5] == 5);
    cdp_placement_ordered_dp_inner(2, 3, d);
    for (int i = 0; i < 6; i++) cr_expect_eq(d[i], i);
}

/* DGX-1 V100, 4 stages x 2 replicas: heavy activations put consecutive stages
 * of each pipeline on NV2 links; a heavy all-reduce puts each stage's two
 * replicas on NV2 links instead. */
Test(placement, dgx1_v100_optimum_follows_the_traffic)
{
    int best[2][8];
    for (int tr = ACTIVATIONS; tr <= GRADIENTS; tr++) {
        struct objective o;
        objective_init(&o, "dgx1-v100", 4, 2, tr);
        struct cdp_placement_problem pb = {.topo = o.topo, .p = 4, .R = 2, .cost = step_time, .ctx = &o};
        cr_assert_eq(cdp_placement_search(&pb, best[tr], NULL), CDP_OK, "%s", cdp_last_error());
        for (int r = 0; r < 2; r++)
            for (int s = 0; s < 4; s++) {
                if (tr == ACTIVATIONS && s < 3)
                    cr_expect_eq(nvlinks(o.topo, best[tr][s * 2 + r], best[tr][(s + 1) * 2 + r]), 2,
                                 "pipeline %d, stages %d-%d", r, s, s + 1);
                if (tr == GRADIENTS && r == 0)
                    cr_expect_eq(nvlinks(o.topo, best[tr][s * 2], best[tr][s * 2 + 1]), 2, "stage %d replicas", s);
            }
        objective_free(&o);
    }
    cr_expect(memcmp(best[0], best[1], sizeof best[0]) != 0);
}

Test(placement, exact_cap_falls_back_to_the_heuristic)
{
    struct objective o;
    objective_init(&o, "dgx1-v100", 4, 2, ACTIVATIONS);
    struct cdp_placement_problem pb = {.topo = o.topo, .p = 4, .R = 2, .cost = step_time, .ctx = &o,
                                       .max_exact_evals = 10};
    int d[8];
    struct cdp_placement_info info;
    cr_assert_eq(cdp_placement_exact(&pb, d, &info), CDP_ERR_UNSUPPORTED);
    cr_expect(strstr(cdp_last_error(), "more than 10"), "%s", cdp_last_error());
    o.calls = 0;
    cr_assert_eq(cdp_placement_search(&pb, d, &info), CDP_OK, "%s", cdp_last_error());
    cr_expect(!info.exact);
    cr_expect(strstr(info.method, "heuristic") && strstr(info.method, "more than 10"), "%s", info.method);
    cr_expect_eq(o.calls, info.evals);
    check_injective(d, 8, 8);
    objective_free(&o);
}

Test(placement, bad_shapes)
{
    struct objective o;
    objective_init(&o, "dgx-a100", 2, 2, ACTIVATIONS);
    struct cdp_placement_problem pb = {.topo = o.topo, .p = 3, .R = 3, .cost = step_time, .ctx = &o};
    int d[9];
    cr_expect_eq(cdp_placement_search(&pb, d, NULL), CDP_ERR_INVALID);
    pb.p = 0;
    cr_expect_eq(cdp_placement_search(&pb, d, NULL), CDP_ERR_INVALID);
    objective_free(&o);
}

static void cluster_case(int p, int R, enum traffic tr)
{
    const int report = getenv("CDP_PLACEMENT_REPORT") != NULL;
    struct objective o;
    objective_init(&o, "4 x dgx-a100", p, R, tr);
    cr_assert_eq(o.topo->n_gpus, 32);
    struct cdp_placement_problem pb = {.topo = o.topo, .p = p, .R = R, .cost = step_time, .ctx = &o,
                                       .max_local_evals = 1500};
    int d[32], d2[32], pp[32], dp[32];
    struct cdp_placement_info info, info2;
    cr_assert_eq(cdp_placement_search(&pb, d, &info), CDP_OK, "%s", cdp_last_error());
    cr_expect(!info.exact);
    check_injective(d, p * R, 32);
    cdp_placement_ordered_pp_inner(p, R, pp);
    cdp_placement_ordered_dp_inner(p, R, dp);
    const double cpp = step_time(pp, &o), cdp = step_time(dp, &o);
    cr_expect_leq(info.cost, cpp);
    cr_expect_leq(info.cost, cdp);
    cr_expect_eq(step_time(d, &o), info.cost);
    cr_assert_eq(cdp_placement_search(&pb, d2, &info2), CDP_OK);
    cr_expect(memcmp(d, d2, sizeof(int) * (size_t)(p * R)) == 0, "not deterministic");
    cr_expect_eq(info.cost, info2.cost);
    if (report)
        fprintf(stderr, "| 4 x dgx-a100 | %dx%d | %s | %.3f | %.3f | %.3f | %.1f%% | %lld (heuristic) |\n", p, R,
                traffic_name[tr], cpp * 1e3, cdp * 1e3, info.cost * 1e3,
                100 * (fmin(cpp, cdp) - info.cost) / fmin(cpp, cdp), (long long)info.evals);
    objective_free(&o);
}

Test(placement, heuristic_on_4_dgx_a100_8x4_activations, .timeout = 600) { cluster_case(8, 4, ACTIVATIONS); }
Test(placement, heuristic_on_4_dgx_a100_4x8_gradients, .timeout = 600) { cluster_case(4, 8, GRADIENTS); }
Test(placement, heuristic_on_4_dgx_a100_4x6_activations, .timeout = 600) { cluster_case(4, 6, ACTIVATIONS); }

/* ---- tensor groups as slots (placement.h: group, n_groups, group_first) */

/* The objective on groups of t: the groups are t consecutive devices of one
 * node, and the link between two groups' first devices is their t member
 * pairs' slowest (least bandwidth, largest latency), as the planner gives the
 * simulator at t > 1. Returns the number of groups, firsts in first[]. */
static int objective_groups(struct objective *o, int t, int *first)
{
    const int n = o->topo->n_gpus;
    int g = 0;
    for (int d = 0; d + t <= n; d += t) {
        int k = 1;
        while (k < t && o->topo->gpus[d + k].node == o->topo->gpus[d].node) k++;
        if (k == t) first[g++] = d;
    }
    for (int i = 0; i < g; i++)
        for (int j = 0; j < g; j++) {
            if (i == j) continue;
            double bw = INFINITY, lat = 0;
            for (int k = 0; k < t; k++) {
                struct cdp_topology_link l;
                cr_assert_eq(cdp_topology_link(o->topo, first[i] + k, first[j] + k, &l), CDP_OK);
                bw = fmin(bw, l.bandwidth);
                lat = fmax(lat, l.latency);
            }
            o->bw[first[i] * n + first[j]] = bw;
            o->lat[first[i] * n + first[j]] = lat;
        }
    return g;
}

static void brute_groups(struct objective *o, const int *first, int ng, int *a, int *used, int d, double *best)
{
    if (d == o->p * o->R) {
        const double c = step_time(a, o);
        if (c < *best) *best = c;
        return;
    }
    for (int g = 0; g < ng; g++) {
        if (used[g]) continue;
        used[g] = 1;
        a[d] = first[g];
        brute_groups(o, first, ng, a, used, d + 1, best);
        used[g] = 0;
    }
}

/* Every returned device starts a group, no group twice. */
static void check_groups(const int *d, int N, const int *first, int ng)
{
    int used[64] = {0};
    for (int i = 0; i < N; i++) {
        int g = 0;
        while (g < ng && first[g] != d[i]) g++;
        cr_assert(g < ng, "device %d starts no group", d[i]);
        cr_assert(!used[g], "group %d used twice", g);
        used[g] = 1;
    }
}

/* dgx1-v100 in groups of 2 ({0,1}, {2,3}, {4,5}, {6,7}: a ring of NVLink
 * pairs with two PCIe/SYS diagonals) and of 4 (the quads), pcie-8gpu-2socket
 * in groups of 2 and 4: the exact search over groups finds brute force's
 * optimum over every injective assignment of groups, no worse than the two
 * fixed orders over groups, and with fewer evaluations. */
static void groups_vs_brute(const char *preset, int t, enum traffic tr)
{
    static const int gshapes[][2] = {{4, 1}, {2, 2}, {1, 4}, {3, 1}, {2, 1}};
    for (size_t k = 0; k < sizeof gshapes / sizeof *gshapes; k++) {
        const int p = gshapes[k][0], R = gshapes[k][1], N = p * R;
        struct objective o;
        int first[8];
        objective_init(&o, preset, p, R, tr);
        const int ng = objective_groups(&o, t, first);
        if (N > ng) {
            objective_free(&o);
            continue;
        }
        struct cdp_placement_problem pb = {.topo = o.topo, .p = p, .R = R, .cost = step_time, .ctx = &o,
                                           .group = t, .n_groups = ng, .group_first = first};
        int dev[8], a[8], used[8] = {0}, pp[8], dp[8];
        struct cdp_placement_info info;
        cr_assert_eq(cdp_placement_search(&pb, dev, &info), CDP_OK, "%s", cdp_last_error());
        cr_assert(info.exact, "%s t=%d %dx%d: %s", preset, t, p, R, info.method);
        check_groups(dev, N, first, ng);
        cr_assert_eq(step_time(dev, &o), info.cost);
        double best = INFINITY;
        const long before = o.calls;
        brute_groups(&o, first, ng, a, used, 0, &best);
        cr_expect(fabs(info.cost - best) <= 1e-9 * best, "%s t=%d %dx%d %s: search %.9g, brute force %.9g (%s)",
                  preset, t, p, R, traffic_name[tr], info.cost, best, info.method);
        cr_expect_leq(info.evals, o.calls - before);
        cdp_placement_ordered_pp_inner(p, R, pp);
        cdp_placement_ordered_dp_inner(p, R, dp);
        for (int i = 0; i < N; i++) pp[i] = first[pp[i]], dp[i] = first[dp[i]];
        cr_expect_leq(info.cost, step_time(pp, &o) * (1 + 1e-12));
        cr_expect_leq(info.cost, step_time(dp, &o) * (1 + 1e-12));
        objective_free(&o);
    }
}

Test(placement, groups_exact_equals_brute_force_dgx1_v100, .timeout = 120)
{
    groups_vs_brute("dgx1-v100", 2, ACTIVATIONS);
    groups_vs_brute("dgx1-v100", 2, GRADIENTS);
    groups_vs_brute("dgx1-v100", 4, ACTIVATIONS);
}

Test(placement, groups_exact_equals_brute_force_pcie, .timeout = 120)
{
    groups_vs_brute("pcie-8gpu-2socket", 2, ACTIVATIONS);
    groups_vs_brute("pcie-8gpu-2socket", 4, GRADIENTS);
}

/* dgx1-v100 at t = 2, 4 stages x 1 replica of heavy activations: ordered-pp-
 * inner over groups ({0,1}, {2,3}, {4,5}, {6,7}) crosses a PCIe/SYS pair
 * ({2,3} -> {4,5}); the search keeps every boundary's member pairs on
 * NVLink and is strictly faster. */
Test(placement, groups_keep_a_pipeline_on_nvlink)
{
    struct objective o;
    int first[8], dev[4], pp[4];
    objective_init(&o, "dgx1-v100", 4, 1, ACTIVATIONS);
    const int ng = objective_groups(&o, 2, first);
    cr_assert_eq(ng, 4);
    struct cdp_placement_problem pb = {.topo = o.topo, .p = 4, .R = 1, .cost = step_time, .ctx = &o, .group = 2,
                                       .n_groups = ng, .group_first = first};
    struct cdp_placement_info info;
    cr_assert_eq(cdp_placement_search(&pb, dev, &info), CDP_OK, "%s", cdp_last_error());
    for (int s = 0; s < 3; s++)
        for (int k = 0; k < 2; k++)
            cr_expect_gt(nvlinks(o.topo, dev[s] + k, dev[s + 1] + k), 0, "stages %d-%d, member %d: devices %d-%d", s,
                         s + 1, k, dev[s] + k, dev[s + 1] + k);
    cdp_placement_ordered_pp_inner(4, 1, pp);
    for (int i = 0; i < 4; i++) pp[i] = first[pp[i]];
    cr_expect_eq(nvlinks(o.topo, pp[1] + 1, pp[2] + 1), 0, "ordered-pp-inner crosses {2,3} -> {4,5} on PCIe");
    cr_expect_lt(info.cost, step_time(pp, &o));
    objective_free(&o);
}

/* Groups that are all alike cost one evaluation (the exact search: one
 * class, one assignment; the heuristic: every assignment is the same): one
 * group per node of 4 x dgx-a100 and of 32 x hgx-h100 (32 groups: the
 * heuristic) at t = 8. */
Test(placement, alike_groups_cost_next_to_nothing, .timeout = 120)
{
    struct objective o;
    int first[32], dev[32];
    struct cdp_placement_info info;
    objective_init(&o, "4 x dgx-a100", 2, 2, GRADIENTS);
    int ng = objective_groups(&o, 8, first);
    cr_assert_eq(ng, 4);
    struct cdp_placement_problem pb = {.topo = o.topo, .p = 2, .R = 2, .cost = step_time, .ctx = &o, .group = 8,
                                       .n_groups = ng, .group_first = first};
    cr_assert_eq(cdp_placement_search(&pb, dev, &info), CDP_OK, "%s", cdp_last_error());
    cr_expect(info.exact);
    cr_expect_eq(info.evals, 1, "%s", info.method);
    check_groups(dev, 4, first, ng);
    objective_free(&o);

    objective_init(&o, "32 x hgx-h100", 4, 8, ACTIVATIONS);
    ng = objective_groups(&o, 8, first);
    cr_assert_eq(ng, 32);
    pb = (struct cdp_placement_problem){.topo = o.topo, .p = 4, .R = 8, .cost = step_time, .ctx = &o, .group = 8,
                                        .n_groups = ng, .group_first = first};
    o.calls = 0;
    cr_assert_eq(cdp_placement_search(&pb, dev, &info), CDP_OK, "%s", cdp_last_error());
    cr_expect(!info.exact);
    cr_expect_eq(info.evals, 1, "%s", info.method);
    cr_expect_eq(o.calls, 1);
    cr_expect(strstr(info.method, "over 32 groups of 8 devices: every slot alike"), "%s", info.method);
    check_groups(dev, 32, first, ng);
    objective_free(&o);
}

Test(placement, bad_groups)
{
    struct objective o;
    objective_init(&o, "2 x dgx-a100", 2, 1, ACTIVATIONS);
    int d[2];
    int overlap[] = {0, 2}, across[] = {0, 6}, outside[] = {0, 14}, fine[] = {0, 8};
    struct cdp_placement_problem pb = {.topo = o.topo, .p = 2, .R = 1, .cost = step_time, .ctx = &o, .group = 4,
                                       .n_groups = 2, .group_first = overlap};
    cr_expect_eq(cdp_placement_search(&pb, d, NULL), CDP_ERR_INVALID);
    cr_expect(strstr(cdp_last_error(), "overlaps"), "%s", cdp_last_error());
    pb.group_first = across;
    cr_expect_eq(cdp_placement_search(&pb, d, NULL), CDP_ERR_INVALID);
    cr_expect(strstr(cdp_last_error(), "spans nodes"), "%s", cdp_last_error());
    pb.group_first = outside;
    cr_expect_eq(cdp_placement_search(&pb, d, NULL), CDP_ERR_INVALID);
    pb.group_first = fine;
    pb.p = 3;
    cr_expect_eq(cdp_placement_search(&pb, d, NULL), CDP_ERR_INVALID);
    cr_expect(strstr(cdp_last_error(), "2 groups"), "%s", cdp_last_error());
    pb.p = 2;
    cr_expect_eq(cdp_placement_search(&pb, d, NULL), CDP_OK, "%s", cdp_last_error());
    cr_expect(d[0] % 8 == 0 && d[1] % 8 == 0 && d[0] != d[1]);
    objective_free(&o);
}
