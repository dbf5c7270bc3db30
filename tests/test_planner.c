/* Suite planner: cdp_planner_run on fixed and "auto" plans, against
 * --simulate, the fixed placement orders, memory limits, and the --dry-run
 * --json round trip with the "planner" key. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/plan.h"
#include "cdp/topology.h"
#include "harness.h"
#include "partitioner/planner.h"

static struct cdp_plan *load(const char *text)
{
    struct cdp_plan *p = NULL;
    cr_assert_eq(cdp_plan_load_string(text, "test.json", NULL, &p), CDP_OK, "%s", cdp_last_error());
    struct cdp_machine_info m = {0};
    cr_assert_eq(cdp_plan_resolve(p, &m), CDP_OK, "%s", cdp_last_error());
    return p;
}

static cdp_status plan_on(struct cdp_plan *p, const char *topo, struct cdp_planner_result *r)
{
    struct cdp_topology *t = NULL;
    cr_assert_eq(cdp_topology_load(topo, NULL, &t), CDP_OK, "%s", cdp_last_error());
    cdp_status st = cdp_planner_run(p, t, NULL, r);
    cdp_topology_free(t);
    return st;
}

#define FIXED_GPU                                                                                              \
    "{\"model\": {\"preset\": \"gpt\", \"vocab\": 1024, \"context\": 256, \"layers\": 8, \"heads\": 8, "      \
    "\"embed\": 512},"                                                                                         \
    "\"train\": {\"micro_batch\": 4, \"precision\": \"bf16\", \"optimizer\": {\"type\": \"adamw\"}},"          \
    "\"parallel\": {\"stages\": 2, \"replicas\": 2, \"micro_batches\": 4, \"partition\": [[0,5],[5,10]], "     \
    "\"placement\": \"ordered-pp-inner\"},"                                                                    \
    "\"cluster\": {\"backend\": \"cuda\", \"topology\": \"dgx1-v100\"}}"

Test(planner, fixed_plan_predicts_what_simulate_predicts)
{
    struct cdp_plan *p = load(FIXED_GPU);
    struct cdp_planner_result r = {0};
    cr_assert_eq(plan_on(p, "dgx1-v100", &r), CDP_OK, "%s", cdp_last_error());
    cr_expect_eq(r.stages, 2);
    cr_expect_eq(r.replicas, 2);
    cr_expect_eq(r.micro_batches, 4);
    cr_expect_eq(r.shapes, 1);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    const char *path = cdp_test_write_file(dir, "fixed.json", FIXED_GPU);
    struct cdp_run run;
    const char *argv[] = {"--plan", path, "--simulate", "--json", NULL};
    cr_assert_eq(cdp_test_run(&run, argv), 0);
    cr_assert_eq(run.exit_code, 0, "%s", run.err);
    json_error_t e;
    json_t *j = json_loads(run.out, 0, &e);
    cr_assert_not_null(j, "%s", run.out);
    double step = json_real_value(json_object_get(json_object_get(j, "predicted"), "step_s"));
    cr_expect(fabs(step - r.predicted.step_s) <= 1e-9 * step, "simulate %.9g, planner %.9g", step,
              r.predicted.step_s);
    /* the pp-inner baseline is the fixed placement itself */
    cr_expect_eq(r.baseline[0].pred.step_s, r.predicted.step_s);
    json_decref(j);
    cdp_test_run_free(&run);
    cdp_planner_result_clear(&r);
    cdp_plan_free(p);
}

#define AUTO_CPU                                                                                               \
    "{\"model\": {\"preset\": \"mlp\", \"input\": [64], \"hidden\": [256, 256, 256, 256], \"classes\": 10},"   \
    "\"train\": {\"micro_batch\": 8},"                                                                         \
    "\"parallel\": {\"stages\": \"auto\", \"replicas\": 1, \"micro_batches\": \"auto\"},"                      \
    "\"cluster\": {\"backend\": \"cpu\", \"devices\": 4}}"

Test(planner, auto_cpu_plan_picks_a_feasible_shape)
{
    struct cdp_plan *p = load(AUTO_CPU);
    struct cdp_topology *t = NULL;
    cr_assert_eq(cdp_topology_cpu(4, 0, 0, &t), CDP_OK);
    struct cdp_planner_result r = {0};
    cr_assert_eq(cdp_planner_run(p, t, NULL, &r), CDP_OK, "%s", cdp_last_error());
    cr_expect(r.stages >= 1 && r.stages <= 4 && r.replicas == 1, "%d x %d", r.stages, r.replicas);
    cr_expect(r.micro_batches >= r.stages, "m %d < p %d", r.micro_batches, r.stages);
    cr_expect_eq(r.shapes, 4 * CDP_PLANNER_MB_CHOICES, "shapes %lld", (long long)r.shapes);
    cr_expect_eq(r.n_ranges, r.stages);
    cr_expect_eq(r.ranges[0][0], 0);
    cr_expect_eq(r.ranges[r.n_ranges - 1][1], cdp_plan_model_units(p));
    cr_expect(r.predicted.samples_per_s > 0);
    cr_assert_eq(cdp_planner_apply(&r, p), CDP_OK);
    cr_expect_eq(p->parallel.stages, r.stages);
    cr_expect_eq(p->parallel.micro_batches, r.micro_batches);
    cr_expect_eq(p->train.global_batch, (int64_t)r.micro_batches * 8);
    cr_expect_eq(p->parallel.placement, CDP_PLACEMENT_EXPLICIT);
    cdp_topology_free(t);
    cdp_planner_result_clear(&r);
    cdp_plan_free(p);
}

Test(planner, memory_infeasible_plan_names_what_fits)
{
    struct cdp_plan *p = load(
        "{\"model\": {\"preset\": \"gpt\", \"vocab\": 1024, \"context\": 256, \"layers\": 8, \"heads\": 8, "
        "\"embed\": 512}, \"train\": {\"micro_batch\": 4, \"optimizer\": {\"type\": \"adamw\"}},"
        "\"parallel\": {\"stages\": 1, \"replicas\": 1, \"micro_batches\": 4},"
        "\"cluster\": {\"backend\": \"cuda\", \"topology\": \"dgx1-v100\", \"device_memory\": \"100MiB\"}}");
    struct cdp_planner_result r = {0};
    cr_assert_eq(plan_on(p, "dgx1-v100", &r), CDP_ERR_INVALID);
    const char *msg = cdp_last_error();
    cr_expect(strstr(msg, "planner") && (strstr(msg, "stages") || strstr(msg, "GiB")), "%s", msg);
    cr_log_info("%s", msg);
    /* auto stages: the search finds the split that fits */
    p->parallel.stages = CDP_AUTO;
    p->parallel.replicas = CDP_AUTO;
    cdp_status st = plan_on(p, "dgx1-v100", &r);
    if (st == CDP_OK) {
        for (int s = 0; s < r.stages; s++)
            cr_expect(r.stage[s].memory_bytes <= 100.0 * 1048576, "stage %d: %.0f", s, r.stage[s].memory_bytes);
        cdp_planner_result_clear(&r);
    } else {
        cr_expect_eq(st, CDP_ERR_INVALID);
    }
    cdp_plan_free(p);
}

#define DGX_AUTO                                                                                               \
    "{\"model\": {\"preset\": \"gpt2-medium\"},"                                                              \
    "\"train\": {\"global_batch\": 128, \"micro_batch\": 4, \"precision\": \"bf16\","                          \
    "\"optimizer\": {\"type\": \"adamw\"}},"                                                                   \
    "\"parallel\": {\"stages\": \"auto\", \"replicas\": \"auto\", \"micro_batches\": \"auto\"},"               \
    "\"cluster\": {\"backend\": \"cuda\", \"topology\": \"dgx1-v100\", \"device_memory\": \"16GiB\"}}"

Test(planner, auto_on_dgx1_is_no_worse_than_the_fixed_orders)
{
    struct cdp_plan *p = load(DGX_AUTO);
    struct cdp_planner_result r = {0};
    cr_assert_eq(plan_on(p, "dgx1-v100", &r), CDP_OK, "%s", cdp_last_error());
    cr_expect(r.stages * r.replicas <= 8);
    cr_expect_eq(r.global_batch, 128);
    for (int i = 0; i < 2; i++)
        cr_expect(r.predicted.step_s <= r.baseline[i].pred.step_s, "%s: %.6g < chosen %.6g", r.baseline[i].name,
                  r.baseline[i].pred.step_s, r.predicted.step_s);
    for (int s = 0; s < r.stages; s++) cr_expect(r.stage[s].memory_bytes <= 16.0 * 1073741824);
    cr_log_info("%d x %d, m %d: %.3f ms (pp-inner %.3f, dp-inner %.3f), %s", r.stages, r.replicas,
                r.micro_batches, r.predicted.step_s * 1e3, r.baseline[0].pred.step_s * 1e3,
                r.baseline[1].pred.step_s * 1e3, r.placement_method);
    cdp_planner_result_clear(&r);
    cdp_plan_free(p);
}

Test(planner, deterministic)
{
    struct cdp_plan *p = load(DGX_AUTO);
    struct cdp_planner_result a = {0}, b = {0};
    cr_assert_eq(plan_on(p, "dgx1-v100", &a), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(plan_on(p, "dgx1-v100", &b), CDP_OK, "%s", cdp_last_error());
    cr_expect_eq(a.stages, b.stages);
    cr_expect_eq(a.replicas, b.replicas);
    cr_expect_eq(a.micro_batches, b.micro_batches);
    cr_expect_eq(a.predicted.step_s, b.predicted.step_s);
    cr_expect_eq(memcmp(a.ranges, b.ranges, (size_t)a.n_ranges * sizeof *a.ranges), 0);
    cr_expect_eq(memcmp(a.device, b.device, (size_t)a.stages * a.replicas * sizeof *a.device), 0);
    cr_expect_eq(a.simulations, b.simulations);
    cdp_planner_result_clear(&a);
    cdp_planner_result_clear(&b);
    cdp_plan_free(p);
}

Test(planner, dry_run_json_round_trips_with_the_planner_key)
{
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    const char *src = cdp_test_write_file(dir, "auto.json", DGX_AUTO);
    struct cdp_run r1, r2;
    const char *argv1[] = {"--plan", src, "--dry-run", "--json", NULL};
    cr_assert_eq(cdp_test_run(&r1, argv1), 0);
    cr_assert_eq(r1.exit_code, 0, "%s", r1.err);
    json_error_t e;
    json_t *j = json_loads(r1.out, 0, &e);
    cr_assert_not_null(j, "%s: %s", e.text, r1.out);
    json_t *pl = json_object_get(j, "planner");
    cr_assert(json_is_object(pl), "%s", r1.out);
    cr_expect(json_is_array(json_object_get(pl, "stages")));
    cr_expect(json_is_array(json_object_get(pl, "placement")));
    cr_expect(json_is_object(json_object_get(pl, "predicted")));
    cr_expect(json_is_object(json_object_get(json_object_get(pl, "baselines"), "ordered-dp-inner")));
    /* the auto values are written into the plan */
    json_t *par = json_object_get(j, "parallel");
    cr_expect(json_is_integer(json_object_get(par, "stages")));
    cr_expect(json_is_integer(json_object_get(par, "micro_batches")));
    cr_expect(json_is_array(json_object_get(par, "partition")));
    cr_expect(json_is_array(json_object_get(par, "placement")));
    json_decref(j);
    const char *again = cdp_test_write_file(dir, "resolved.json", r1.out);
    const char *argv2[] = {"--plan", again, "--dry-run", "--json", NULL};
    cr_assert_eq(cdp_test_run(&r2, argv2), 0);
    cr_assert_eq(r2.exit_code, 0, "%s", r2.err);
    cr_expect_str_eq(r1.out, r2.out);
    const char *argv3[] = {"--plan", again, "--dry-run", NULL};
    struct cdp_run r3;
    cr_assert_eq(cdp_test_run(&r3, argv3), 0);
    cr_expect_eq(r3.exit_code, 0, "%s", r3.err);
    cr_expect(strstr(r3.out, "Plan: placement") && strstr(r3.out, "Plan: baselines"), "%s", r3.out);
    cdp_test_run_free(&r1);
    cdp_test_run_free(&r2);
    cdp_test_run_free(&r3);
}

Test(planner, explore_placements_prints_the_spread)
{
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    const char *src = cdp_test_write_file(dir, "auto.json", DGX_AUTO);
    struct cdp_run r;
    const char *argv[] = {"--plan", src, "--dry-run", "--explore", "placements", NULL};
    cr_assert_eq(cdp_test_run(&r, argv), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    const char *e = strstr(r.out, "Plan: placements explored");
    cr_assert_not_null(e, "%s", r.out);
    cr_expect(strstr(e, "chosen") && strstr(e, "ordered-pp-inner") && strstr(e, "ordered-dp-inner"), "%s", e);
    double mn, md, mx, chosen;
    const char *l = strstr(e, "random            min");
    cr_assert_not_null(l, "%s", e);
    cr_assert_eq(sscanf(l, "random min %lf ms median %lf ms max %lf ms", &mn, &md, &mx), 3, "%s", l);
    cr_expect(mn <= md && md <= mx, "%s", e);
    const char *c = strstr(e, "\n  chosen");
    cr_assert_not_null(c, "%s", e);
    cr_assert_eq(sscanf(c, " chosen %lf", &chosen), 1, "%s", c);
    /* dgx1-v100 is small enough for the exact search: nothing random beats it (to print precision) */
    cr_expect(chosen <= mn + 1e-3, "chosen %.3f ms, random min %.3f ms\n%s", chosen, mn, e);
    cdp_test_run_free(&r);
    const char *bad[] = {"--plan", src, "--dry-run", "--explore", "nodes", NULL};
    cr_assert_eq(cdp_test_run(&r, bad), 0);
    cr_expect_eq(r.exit_code, 2, "%s", r.err);
    cdp_test_run_free(&r);
}

/* "auto" schedule: GPipe and 1F1B are both evaluated (twice the shapes), the
 * faster prediction wins, and the planned plan names it. */
#define AUTO_SCHED(s)                                                                                         \
    "{\"model\": {\"preset\": \"gpt\", \"vocab\": 64, \"context\": 16, \"layers\": 4, \"heads\": 2, "     \
    "\"embed\": 32}, \"train\": {\"micro_batch\": 2}, \"parallel\": {\"stages\": 2, \"replicas\": 1, "          \
    "\"micro_batches\": 4, \"schedule\": \"" s "\"}, \"cluster\": {\"backend\": \"cpu\"}}"

static double planned_sps(const char *json, struct cdp_planner_result *r)
{
    struct cdp_plan *p = load(json);
    struct cdp_topology *t = NULL;
    cr_assert_eq(cdp_topology_cpu(2, 0, 0, &t), CDP_OK);
    cr_assert_eq(cdp_planner_run(p, t, NULL, r), CDP_OK, "%s", cdp_last_error());
    double sps = r->predicted.samples_per_s;
    cdp_topology_free(t);
    cdp_plan_free(p);
    return sps;
}

Test(planner, auto_schedule_is_searched_and_written_back)
{
    struct cdp_planner_result a = {0}, g = {0}, f = {0};
    const double s_auto = planned_sps(AUTO_SCHED("auto"), &a);
    const double s_gpipe = planned_sps(AUTO_SCHED("gpipe"), &g);
    const double s_1f1b = planned_sps(AUTO_SCHED("1f1b"), &f);
    cr_expect_eq(a.shapes, 2, "one shape, two schedules: %lld", (long long)a.shapes);
    cr_expect_eq(s_auto, s_gpipe > s_1f1b ? s_gpipe : s_1f1b, "auto %g, gpipe %g, 1f1b %g", s_auto, s_gpipe, s_1f1b);
    cr_expect_eq(a.schedule, s_gpipe > s_1f1b ? CDP_SCHEDULE_GPIPE : CDP_SCHEDULE_1F1B);
    struct cdp_plan *p = load(AUTO_SCHED("auto"));
    cr_assert(p->parallel.schedule_auto);
    char *text = NULL;
    cr_assert_eq(cdp_plan_to_json(p, &text), CDP_OK);
    cr_expect(strstr(text, "\"schedule\": \"auto\""), "%s", text);
    free(text);
    cr_assert_eq(cdp_planner_apply(&a, p), CDP_OK);
    cr_expect(!p->parallel.schedule_auto);
    cr_expect_eq(p->parallel.schedule, a.schedule);
    cdp_planner_result_clear(&a);
    cdp_planner_result_clear(&g);
    cdp_planner_result_clear(&f);
    cdp_plan_free(p);
}
