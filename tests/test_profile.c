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
#include "partitioner/costs.h"

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

/* Profiles the plan (a fixed /parallel/tensor of tp: rank 0's slices) and
 * checks the table's shape, and each unit's weight-gradient part: measured
 * (its split backward's W), above 0 and below bwd_s where the unit has
 * parameters, 0 where it has none. */
static void cli_profile(const char *plan, const char *costs);

static void check_profile_at(const char *plan_path, int tp)
{
    struct cdp_plan *p = load_plan(plan_path);
    struct cdp_unit *u = NULL;
    int n = 0;
    cr_assert_eq(cdp_units_build_tensor(&p->model, tp, 0, &u, &n), CDP_OK, "%s", cdp_last_error());
    struct cdp_profile_options o = {.min_unit_s = 0.02, .max_total_s = 5};
    struct cdp_cost_table t = {0};
    cr_assert_eq(cdp_profile_run(p, &o, &t), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(t.n_units, n);
    cr_expect_eq(t.micro_batch, p->train.micro_batch);
    cr_expect(t.threads >= 1);
    cr_expect(t.optimizer_s_per_param > 0);
    cr_expect_eq(t.tensor, tp);
    cr_expect(t.bwd_w_measured);
    for (int i = 0; i < n; i++) {
        if (u[i].n_params > 0)
            cr_expect(t.units[i].bwd_w_s > 0 && t.units[i].bwd_w_s < t.units[i].bwd_s, "unit %d (%s): W %g, bwd %g",
                      i, cdp_layer_name(u[i].desc.type), t.units[i].bwd_w_s, t.units[i].bwd_s);
        else
            cr_expect_eq(t.units[i].bwd_w_s, 0, "unit %d (%s) has no parameters: W %g", i,
                         cdp_layer_name(u[i].desc.type), t.units[i].bwd_w_s);
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

static void check_profile(const char *plan_path) { check_profile_at(plan_path, 1); }

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

#define GPT_T2                                                                                                 \
    "{\"model\": {\"preset\": \"gpt\", \"vocab\": 128, \"context\": 32, \"layers\": 2, \"heads\": 4, "               \
    "\"embed\": 64}, \"data\": {\"source\": \"synthetic\"}, \"train\": {\"steps\": 1, \"micro_batch\": 4}, "          \
    "\"parallel\": {\"stages\": 1, \"replicas\": 1, \"micro_batches\": 2, \"tensor\": 2}, \"cluster\": "            \
    "{\"backend\": \"cpu\"}}"

/* A plan of t = 2: rank 0's slices timed (fewer parameters than the whole
 * units), t and each unit's W in the table and its file. */
Test(profile, tensor_2_times_the_slices_and_records_t_and_w)
{
    const char *dir = cdp_test_tmpdir();
    char plan[512], costs[512];
    snprintf(plan, sizeof plan, "%s", cdp_test_write_file(dir, "gpt2.json", GPT_T2));
    check_profile_at(plan, 2);
    snprintf(costs, sizeof costs, "%s/gpt2.costs.json", dir);
    cli_profile(plan, costs);
    json_error_t e;
    json_t *j = json_load_file(costs, 0, &e);
    cr_assert_not_null(j, "%s: %s", costs, e.text);
    cr_expect_eq(json_integer_value(json_object_get(j, "version")), 2);
    cr_expect_eq(json_integer_value(json_object_get(j, "tensor")), 2);
    json_t *us = json_object_get(j, "units");
    cr_assert(json_array_size(us) > 0);
    for (size_t i = 0; i < json_array_size(us); i++)
        cr_expect(json_is_number(json_object_get(json_array_get(us, i), "bwd_w_s")), "/units/%zu has no bwd_w_s", i);
    json_decref(j);
    struct cdp_run run;
    cr_assert_eq(cdp_test_run(&run, (const char *const[]){"--plan", plan, "--costs", costs, "--dry-run", NULL}), 0);
    cr_assert_eq(run.exit_code, 0, "%s", run.err);
    cr_expect(strstr(run.out, "measured at t = 2, used as measured"), "%s", run.out);
    cdp_test_run_free(&run);
}

/* Writes a table for the GPT_T2 plan's units measured at t = tp: every unit's
 * forward a, backward b, of it W w. */
static void write_table(const char *path, const struct cdp_unit *u, int n, int tp, double a, double b, double w)
{
    struct cdp_cost_table_unit us[16];
    cr_assert(n <= 16);
    for (int i = 0; i < n; i++)
        us[i] = (struct cdp_cost_table_unit){.index = i, .type = u[i].desc.type, .fwd_s = a, .bwd_s = b,
                                             .bwd_w_s = u[i].n_params ? w : 0};
    struct cdp_cost_table t = {.micro_batch = 4, .threads = 1, .tensor = tp, .bwd_w_measured = 1, .n_units = n,
                               .units = us, .optimizer_s_per_param = 1e-9};
    snprintf(t.device, sizeof t.device, "cpu: hand-written");
    cr_assert_eq(cdp_cost_table_write(&t, path), CDP_OK, "%s", cdp_last_error());
}

/* The planned stage's forward and backward with the table at path (--dry-run --json). */
static void planned_stage(const char *plan, const char *path, double *fwd, double *bwd)
{
    struct cdp_run run;
    cr_assert_eq(cdp_test_run(&run, (const char *const[]){"--plan", plan, "--costs", path, "--dry-run", "--json",
                                                          NULL}), 0);
    cr_assert_eq(run.exit_code, 0, "%s: %s", path, run.err);
    json_error_t e;
    json_t *j = json_loads(run.out, 0, &e);
    cr_assert_not_null(j, "%s", run.out);
    json_t *st = json_array_get(json_object_get(json_object_get(j, "planner"), "stages"), 0);
    *fwd = json_real_value(json_object_get(st, "fwd_s"));
    *bwd = json_real_value(json_object_get(st, "bwd_s"));
    json_decref(j);
    cdp_test_run_free(&run);
}

/* The planner at t = 2 takes a table measured at t = 2 as it is, divides a
 * t = 1 table's split units (the GPT's embedding, blocks and head, its final
 * layernorm inside) by 2, and scales a t = 4 table's by 4/2. Every unit of the
 * hand-written tables costs the same, so the stage's times differ by the
 * split units' share alone (the group's collectives are the same in all). */
Test(profile, planner_uses_a_table_of_its_t_unscaled)
{
    const char *dir = cdp_test_tmpdir();
    char plan[512], t1[512], t2[512], t4[512];
    snprintf(plan, sizeof plan, "%s", cdp_test_write_file(dir, "gpt2.json", GPT_T2));
    struct cdp_plan *p = load_plan(plan);
    struct cdp_unit *u = NULL;
    int n = 0, split = 0;
    cr_assert_eq(cdp_units_build_tensor(&p->model, 2, 0, &u, &n), CDP_OK, "%s", cdp_last_error());
    for (int i = 0; i < n; i++)
        split += u[i].desc.type == CDP_LAYER_TRANSFORMER_BLOCK || u[i].desc.type == CDP_LAYER_EMBEDDING ||
                 u[i].desc.type == CDP_LAYER_LM_HEAD;
    cr_assert(split >= 3, "%d of %d units split", split, n);
    const double a = 0.01, b = 0.02, w = 0.008;
    snprintf(t1, sizeof t1, "%s/t1.costs.json", dir);
    snprintf(t2, sizeof t2, "%s/t2.costs.json", dir);
    snprintf(t4, sizeof t4, "%s/t4.costs.json", dir);
    write_table(t1, u, n, 1, a, b, w);
    write_table(t2, u, n, 2, a, b, w);
    write_table(t4, u, n, 4, a, b, w);
    double f1, b1, f2, b2, f4, b4;
    planned_stage(plan, t1, &f1, &b1);
    planned_stage(plan, t2, &f2, &b2);
    planned_stage(plan, t4, &f4, &b4);
    /* the stage's forward is its units' (and their collectives'): n a at t = 2 as measured */
    cr_expect(f2 >= n * a && f2 < n * a + 0.5 * a, "t = 2 table: stage fwd %.9f s, units %.9f s", f2, n * a);
    cr_expect(fabs((f2 - f1) - split * a / 2) < 1e-9, "t = 1 table not divided by 2: %.9f vs %.9f", f1, f2);
    cr_expect(fabs((b2 - b1) - split * b / 2) < 1e-9, "t = 1 table's backward not divided: %.9f vs %.9f", b1, b2);
    cr_expect(fabs((f4 - f2) - split * a) < 1e-9, "t = 4 table not scaled by 4/2: %.9f vs %.9f", f4, f2);
    struct cdp_run run;
    cr_assert_eq(cdp_test_run(&run, (const char *const[]){"--plan", plan, "--costs", t1, "--dry-run", NULL}), 0);
    cr_expect(strstr(run.out, "measured at t = 1, split units' times / 2 for t = 2"), "%s", run.out);
    cdp_test_run_free(&run);
    cr_assert_eq(cdp_test_run(&run, (const char *const[]){"--plan", plan, "--costs", t4, "--dry-run", NULL}), 0);
    cr_expect(strstr(run.out, "measured at t = 4, split units' times x 4/2 for t = 2"), "%s", run.out);
    cdp_test_run_free(&run);
    free(u);
    cdp_plan_free(p);
}

/* A version 2 table's W is used as measured; a version 1 file (no "tensor",
 * no "bwd_w_s") still loads, at t = 1, its W split by the units' FLOPs. */
Test(profile, version_1_tables_load_and_w_falls_back_to_flops)
{
    const char *dir = cdp_test_tmpdir();
    const char *v1 = cdp_test_write_file(
        dir, "v1.costs.json",
        "{\"format\": \"cdphybrid-costs\", \"version\": 1, \"device\": \"cpu: old\", \"micro_batch\": 32, "
        "\"threads\": 1, \"units\": [{\"index\": 0, \"kind\": \"linear\", \"fwd_s\": 0.001, \"bwd_s\": 0.002}, "
        "{\"index\": 1, \"kind\": \"relu\", \"fwd_s\": 1e-5, \"bwd_s\": 1e-5}, {\"index\": 2, \"kind\": \"linear\", "
        "\"fwd_s\": 0.001, \"bwd_s\": 0.002}, {\"index\": 3, \"kind\": \"relu\", \"fwd_s\": 1e-5, \"bwd_s\": 1e-5}, "
        "{\"index\": 4, \"kind\": \"linear\", \"fwd_s\": 0.0005, \"bwd_s\": 0.001}], "
        "\"optimizer_s_per_param\": 1e-9}\n");
    struct cdp_cost_table t = {0};
    cr_assert_eq(cdp_cost_table_read(v1, &t), CDP_OK, "%s", cdp_last_error());
    cr_expect_eq(t.tensor, 1);
    cr_expect_eq(t.bwd_w_measured, 0);
    char plan[512];
    snprintf(plan, sizeof plan, "%s", mlp_plan(dir, "mlp.json", 32, 1, 1, "gpipe"));
    struct cdp_plan *p = load_plan(plan);
    struct cdp_unit *u = NULL;
    int n = 0;
    cr_assert_eq(cdp_units_build(&p->model, &u, &n), CDP_OK);
    cr_assert_eq(n, 5);
    cr_expect_eq(cdp_cost_table_check(&t, v1, p, u, n), CDP_OK, "%s", cdp_last_error());
    struct cdp_unit_cost c[5] = {0};
    cdp_cost_apply(&t, u, n, c);
    cr_expect(u[0].bwd_flops > 0 && fabs(c[0].bwd_w_s - 0.002 * u[0].bwd_weight_flops / u[0].bwd_flops) < 1e-15,
              "version 1: W %g", c[0].bwd_w_s);
    /* the same table as version 2, with a W unlike the FLOP share: used as it is */
    t.bwd_w_measured = 1;
    t.units[0].bwd_w_s = 0.0015;
    char v2[512];
    snprintf(v2, sizeof v2, "%s/v2.costs.json", dir);
    cr_assert_eq(cdp_cost_table_write(&t, v2), CDP_OK, "%s", cdp_last_error());
    cdp_cost_table_clear(&t);
    cr_assert_eq(cdp_cost_table_read(v2, &t), CDP_OK, "%s", cdp_last_error());
    cr_expect(t.bwd_w_measured && t.tensor == 1);
    cdp_cost_apply(&t, u, n, c);
    cr_expect(fabs(c[0].bwd_w_s - 0.0015) < 1e-15, "version 2: W %g", c[0].bwd_w_s);
    cr_expect_eq(c[1].bwd_w_s, 0);
    cdp_cost_table_clear(&t);
    /* a W above its backward is refused, naming the key */
    const char *bad = cdp_test_write_file(
        dir, "bad.costs.json",
        "{\"format\": \"cdphybrid-costs\", \"version\": 2, \"micro_batch\": 32, \"tensor\": 1, \"units\": "
        "[{\"index\": 0, \"kind\": \"linear\", \"fwd_s\": 0.001, \"bwd_s\": 0.002, \"bwd_w_s\": 0.0021}], "
        "\"optimizer_s_per_param\": 1e-9}\n");
    cr_expect_eq(cdp_cost_table_read(bad, &t), CDP_ERR_INVALID);
    cr_expect(strstr(cdp_last_error(), "/units/0/bwd_w_s"), "%s", cdp_last_error());
    const char *not_t = cdp_test_write_file(
        dir, "nott.costs.json",
        "{\"format\": \"cdphybrid-costs\", \"version\": 2, \"micro_batch\": 32, \"units\": "
        "[{\"index\": 0, \"kind\": \"linear\", \"fwd_s\": 0.001, \"bwd_s\": 0.002, \"bwd_w_s\": 0.001}], "
        "\"optimizer_s_per_param\": 1e-9}\n");
    cr_expect_eq(cdp_cost_table_read(not_t, &t), CDP_ERR_INVALID);
    cr_expect(strstr(cdp_last_error(), "/tensor"), "%s", cdp_last_error());
    free(u);
    cdp_plan_free(p);
}

Test(profile, json_round_trip)
{
    struct cdp_cost_table_unit us[3] = {{0, CDP_LAYER_LINEAR, 1.25e-3, 2.5e-3, 1.0e-3},
                                        {1, CDP_LAYER_RELU, 3.0e-6, 4.0e-6, 0},
                                        {2, CDP_LAYER_LM_HEAD, 0.123456789, 0.2, 0.0987654321}};
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
        cr_expect(fabs(r.units[i].bwd_w_s - us[i].bwd_w_s) <= 1e-8 * us[i].bwd_w_s);
    }
    cr_expect_eq(r.tensor, 1); /* 0 written as 1 */
    cr_expect(r.bwd_w_measured);
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
