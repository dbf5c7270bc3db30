/* Suite profile: measured unit costs (src/model/profile.h), their JSON table
 * (partitioner/costs.h), and --simulate --costs using them. Times are only
 * checked for sign and for backward doing the GEMM work twice over. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cdp/core.h"
#include "cdp/plan.h"
#include "harness.h"
#include "model/layers.h"
#include "model/profile.h"
#include "model/costs.h"

static struct cdp_plan *load_plan(const char *path)
{
    struct cdp_plan *p = NULL;
    struct cdp_machine_info mi = {0};
    cr_assert_eq(cdp_plan_load(path, &p), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_plan_resolve(p, &mi), CDP_OK, "%s", cdp_last_error());
    return p;
}

static const char *mlp_plan(const char *dir, const char *name, int mb, int stages, int m, const char *sched)
{
    char text[1024];
    snprintf(text, sizeof text,
             "{\"model\": {\"preset\": \"mlp\", \"input\": [128], \"hidden\": [256, 256], \"classes\": 64},"
             " \"data\": {\"source\": \"synthetic\"}, \"train\": {\"steps\": 1, \"micro_batch\": %d},"
             " \"parallel\": {\"stages\": %d, \"replicas\": 1, \"micro_batches\": %d, \"schedule\": \"%s\"},"
             " \"cluster\": {\"backend\": \"cpu\"}}", mb, stages, m, sched);
    return cdp_test_write_file(dir, name, text);
}

static void check_profile(const char *plan_path)
{
    struct cdp_plan *p = load_plan(plan_path);
    struct cdp_unit *u = NULL;
    int n = 0;
    cr_assert_eq(cdp_units_build(&p->model, &u, &n), CDP_OK);
    struct cdp_profile_options o = {.min_unit_s = 0.02, .max_total_s = 5};
    struct cdp_cost_table t = {0};
    cr_assert_eq(cdp_profile_run(p, &o, &t), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(t.n_units, n);
    cr_expect_eq(t.micro_batch, p->train.micro_batch);
    cr_expect(t.threads >= 1);
    cr_expect(t.optimizer_s_per_param > 0);
    for (int i = 0; i < n; i++) {
        cr_expect_eq(t.units[i].index, i);
        cr_expect_eq(t.units[i].type, u[i].desc.type);
        cr_expect(t.units[i].fwd_s > 0 && t.units[i].bwd_s > 0, "unit %d: %g %g", i, t.units[i].fwd_s,
                  t.units[i].bwd_s);
        /* no comparison of the two times: tests never assert on measured speed
         * (a loaded machine reorders them) */
    }
    cr_expect_eq(cdp_cost_table_check(&t, "x.json", p, u, n), CDP_OK, "%s", cdp_last_error());
    cdp_cost_table_clear(&t);
    free(u);
    cdp_plan_free(p);
}

Test(profile, mlp_units_measured)
{
    check_profile(mlp_plan(cdp_test_tmpdir(), "mlp.json", 32, 1, 1, "gpipe"));
}

Test(profile, gpt_units_measured)
{
    const char *plan = cdp_test_write_file(
        cdp_test_tmpdir(), "gpt.json",
        "{\"model\": {\"preset\": \"gpt\", \"vocab\": 128, \"context\": 32, \"layers\": 2, \"heads\": 2,"
        " \"embed\": 64}, \"data\": {\"source\": \"synthetic\"}, \"train\": {\"steps\": 1, \"micro_batch\": 4},"
        " \"parallel\": {\"stages\": 2, \"replicas\": 1, \"micro_batches\": 2}, \"cluster\": {\"backend\": \"cpu\"}}");
    check_profile(plan);
}

Test(profile, json_round_trip)
{
    struct cdp_cost_table_unit us[3] = {{0, CDP_LAYER_LINEAR, 1.25e-3, 2.5e-3},
                                        {1, CDP_LAYER_RELU, 3.0e-6, 4.0e-6},
                                        {2, CDP_LAYER_LM_HEAD, 0.123456789, 0.2}};
    struct cdp_cost_table t = {.micro_batch = 7, .threads = 3, .n_units = 3, .units = us,
                               .optimizer_s_per_param = 1.5e-9};
    snprintf(t.device, sizeof t.device, "cpu: test");
    char path[512];
    snprintf(path, sizeof path, "%s/t.costs.json", cdp_test_tmpdir());
    cr_assert_eq(cdp_cost_table_write(&t, path), CDP_OK, "%s", cdp_last_error());
    struct cdp_cost_table r = {0};
    cr_assert_eq(cdp_cost_table_read(path, &r), CDP_OK, "%s", cdp_last_error());
    cr_expect_str_eq(r.device, "cpu: test");
    cr_expect_eq(r.micro_batch, 7);
    cr_expect_eq(r.threads, 3);
    cr_assert_eq(r.n_units, 3);
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(r.units[i].index, i);
        cr_expect_eq(r.units[i].type, us[i].type);
        cr_expect(fabs(r.units[i].fwd_s - us[i].fwd_s) <= 1e-8 * us[i].fwd_s);
        cr_expect(fabs(r.units[i].bwd_s - us[i].bwd_s) <= 1e-8 * us[i].bwd_s);
    }
    cr_expect(fabs(r.optimizer_s_per_param - 1.5e-9) <= 1e-17);
    cdp_cost_table_clear(&r);
    cdp_cost_table_clear(NULL);
}

/* Profiles plan through the CLI into costs; the exit code must be 0. */
static void cli_profile(const char *plan, const char *costs)
{
    struct cdp_run run;
    cr_assert_eq(cdp_test_run(&run, (const char *const[]){"--plan", plan, "--profile", "--costs", costs, NULL}), 0);
    cr_assert_eq(run.exit_code, 0, "stderr: %s", run.err);
    cr_expect(strstr(run.out, "lm_head") || strstr(run.out, "linear"), "%s", run.out);
    cdp_test_run_free(&run);
}

static void expect_bad_costs(const char *plan, const char *costs, const char *what)
{
    struct cdp_run run;
    cr_assert_eq(cdp_test_run(&run, (const char *const[]){"--plan", plan, "--simulate", "--costs", costs, NULL}), 0);
    cr_expect_eq(run.exit_code, 2, "%s: exit %d, stderr %s", what, run.exit_code, run.err);
    cr_expect(strstr(run.err, costs), "%s: the file is not named: %s", what, run.err);
    cdp_test_run_free(&run);
}

Test(profile, cli_default_path_next_to_the_plan)
{
    const char *dir = cdp_test_tmpdir();
    char plan[512], costs[512];
    snprintf(plan, sizeof plan, "%s", mlp_plan(dir, "small.json", 4, 1, 1, "gpipe"));
    snprintf(costs, sizeof costs, "%s/small.costs.json", dir);
    struct cdp_run run;
    cr_assert_eq(cdp_test_run(&run, (const char *const[]){"--plan", plan, "--profile", NULL}), 0);
    cr_expect_eq(run.exit_code, 0, "stderr: %s", run.err);
    cdp_test_run_free(&run);
    struct cdp_cost_table t = {0};
    cr_expect_eq(cdp_cost_table_read(costs, &t), CDP_OK, "%s", cdp_last_error());
    cdp_cost_table_clear(&t);
    /* the planner plans with the measured times: --dry-run shows them per stage */
    cr_assert_eq(cdp_cost_table_read(costs, &t), CDP_OK, "%s", cdp_last_error());
    double fwd = 0;
    for (int i = 0; i < t.n_units; i++) fwd += t.units[i].fwd_s;
    cdp_cost_table_clear(&t);
    cr_assert_eq(cdp_test_run(&run, (const char *const[]){"--plan", plan, "--costs", costs, "--dry-run", "--json",
                                                          NULL}), 0);
    cr_assert_eq(run.exit_code, 0, "--costs with --dry-run: %s", run.err);
    json_error_t e;
    json_t *j = json_loads(run.out, 0, &e);
    cr_assert_not_null(j, "%s", run.out);
    json_t *st = json_array_get(json_object_get(json_object_get(j, "planner"), "stages"), 0);
    cr_expect_float_eq(json_real_value(json_object_get(st, "fwd_s")), fwd, 1e-9 * fwd, "%s", run.out);
    json_decref(j);
    cdp_test_run_free(&run);
}

Test(profile, mismatched_costs_exit_2_naming_the_file)
{
    const char *dir = cdp_test_tmpdir();
    char plan4[512], plan8[512], other[512], costs[512], junk[512];
    snprintf(plan4, sizeof plan4, "%s", mlp_plan(dir, "mb4.json", 4, 1, 1, "gpipe"));
    snprintf(plan8, sizeof plan8, "%s", mlp_plan(dir, "mb8.json", 8, 1, 1, "gpipe"));
    snprintf(other, sizeof other, "%s",
             cdp_test_write_file(dir, "other.json",
                                 "{\"model\": {\"preset\": \"mlp\", \"input\": [128], \"hidden\": [256],"
                                 " \"classes\": 64}, \"data\": {\"source\": \"synthetic\"},"
                                 " \"train\": {\"steps\": 1, \"micro_batch\": 4}, \"parallel\": {\"micro_batches\": 1},"
                                 " \"cluster\": {\"backend\": \"cpu\"}}"));
    snprintf(costs, sizeof costs, "%s/mb4.costs.json", dir);
    snprintf(junk, sizeof junk, "%s", cdp_test_write_file(dir, "junk.costs.json", "this is not { JSON"));
    cli_profile(plan4, costs);
    struct cdp_run run;
    cr_assert_eq(cdp_test_run(&run, (const char *const[]){"--plan", plan4, "--simulate", "--costs", costs, NULL}), 0);
    cr_expect_eq(run.exit_code, 0, "matching costs: %s", run.err);
    cr_expect(strstr(run.out, "measured"), "%s", run.out);
    cdp_test_run_free(&run);
    expect_bad_costs(plan8, costs, "other micro_batch");
    expect_bad_costs(other, costs, "other unit count");
    expect_bad_costs(plan4, junk, "not JSON");
}

/* Uniform stages (equal measured stage times), no optimizer time, one
 * replica, every rank on a core of its own: the step is the closed form
 * (m+p-1)(tf+tb) plus the CPU topology's transfer of a few hundred bytes per
 * hop (latency and copy rate; there is no option for an unlimited link),
 * which is below 1e-4 of seconds-long units. (Ranks that share cores share
 * their time: suite simulate.) */
static void closed_form(const char *sched)
{
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2) cr_skip_test("two stages need a core each: this machine has one");
    const char *dir = cdp_test_tmpdir();
    char plan[512], costs[512], text[1024];
    const int p = 2, m = 4;
    const double tf = 0.25, tb = 0.5;
    /* stage 0 is unit 0, stage 1 the other four, each a quarter of the stage's time */
    snprintf(text, sizeof text,
             "{\"model\": {\"preset\": \"mlp\", \"input\": [128], \"hidden\": [256, 256], \"classes\": 64},"
             " \"data\": {\"source\": \"synthetic\"}, \"train\": {\"steps\": 1, \"micro_batch\": 2},"
             " \"parallel\": {\"stages\": %d, \"replicas\": 1, \"micro_batches\": %d, \"schedule\": \"%s\","
             " \"partition\": [[0, 1], [1, 5]]}, \"cluster\": {\"backend\": \"cpu\"}}", p, m, sched);
    snprintf(plan, sizeof plan, "%s", cdp_test_write_file(dir, "uni.json", text));
    snprintf(costs, sizeof costs, "%s/uni.costs.json", dir);
    cli_profile(plan, costs);
    struct cdp_cost_table t = {0};
    cr_assert_eq(cdp_cost_table_read(costs, &t), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(t.n_units, 5, "the mlp has %d units", t.n_units);
    for (int i = 0; i < t.n_units; i++) {
        t.units[i].fwd_s = i == 0 ? tf : tf / 4;
        t.units[i].bwd_s = i == 0 ? tb : tb / 4;
    }
    t.optimizer_s_per_param = 0;
    cr_assert_eq(cdp_cost_table_write(&t, costs), CDP_OK);
    cdp_cost_table_clear(&t);
    struct cdp_run run;
    cr_assert_eq(cdp_test_run(&run, (const char *const[]){"--plan", plan, "--simulate", "--costs", costs, "--json",
                                                          NULL}), 0);
    cr_assert_eq(run.exit_code, 0, "stderr: %s", run.err);
    json_error_t e;
    json_t *j = json_loads(run.out, 0, &e);
    cr_assert(j, "%s", run.out);
    const double step = json_real_value(json_object_get(json_object_get(j, "predicted"), "step_s"));
    const double want = (m + p - 1) * (tf + tb);
    cr_expect(step >= want * (1 - 1e-12) && step <= want * (1 + 1e-4), "%s: step %.9f s, closed form %.9f s", sched,
              step, want);
    json_t *st = json_object_get(j, "stages");
    for (size_t s = 0; s < json_array_size(st); s++) {
        cr_expect(fabs(json_real_value(json_object_get(json_array_get(st, s), "fwd_s")) - tf) < 1e-12);
        cr_expect(fabs(json_real_value(json_object_get(json_array_get(st, s), "bwd_s")) - tb) < 1e-12);
    }
    json_decref(j);
    cdp_test_run_free(&run);
}

Test(profile, simulate_uses_costs_gpipe_closed_form) { closed_form("gpipe"); }
Test(profile, simulate_uses_costs_1f1b_closed_form) { closed_form("1f1b"); }
