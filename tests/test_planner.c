/* Suite planner: cdp_planner_run on fixed and "auto" plans, against
 * --simulate, the fixed placement orders, memory limits, and the --dry-run
 * --json round trip with the "planner" key. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/plan.h"
#include "cdp/topology.h"
#include "comm/comm.h"
#include "harness.h"
#include "pipeline/balance.h"
#include "pipeline/simulator.h"
#include "partitioner/planner.h"
#include "plan/schedule_kind.h"

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
    cdp_status st = cdp_planner_run(p, t, NULL, 0, r);
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
    cr_expect_eq(r.layout->stages, 2);
    cr_expect_eq(r.layout->replicas, 2);
    cr_expect_eq(r.layout->micro_batches, 4);
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
    cr_assert_eq(cdp_planner_run(p, t, NULL, 0, &r), CDP_OK, "%s", cdp_last_error());
    cr_expect(r.layout->stages >= 1 && r.layout->stages <= 4 && r.layout->replicas == 1, "%d x %d", r.layout->stages, r.layout->replicas);
    cr_expect(r.layout->micro_batches >= r.layout->stages, "m %d < p %d", r.layout->micro_batches, r.layout->stages);
    /* one stage: one micro-batch (no pipeline to fill); 2-4 stages: the micro-batch choices */
    cr_expect_eq(r.shapes, 1 + 3 * CDP_PLANNER_MB_CHOICES, "shapes %lld", (long long)r.shapes);
    cr_expect_eq((r.layout->stages * r.layout->chunks), r.layout->stages);
    cr_expect_eq(r.layout->ranges[0][0], 0);
    cr_expect_eq(r.layout->ranges[(r.layout->stages * r.layout->chunks) - 1][1], cdp_plan_model_units(p));
    cr_expect(r.predicted.samples_per_s > 0);
    cr_assert_eq(cdp_planner_apply(&r, p), CDP_OK);
    cr_expect_eq(p->parallel.stages, r.layout->stages);
    cr_expect_eq(p->parallel.micro_batches, r.layout->micro_batches);
    cr_expect_eq(p->train.global_batch, (int64_t)r.layout->micro_batches * 8);
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
        for (int s = 0; s < r.layout->stages; s++)
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
    cr_expect(r.layout->stages * r.layout->replicas <= 8);
    cr_expect_eq(((int64_t)r.layout->replicas * r.layout->micro_batches * r.layout->micro_batch), 128);
    for (int i = 0; i < 2; i++)
        cr_expect(r.predicted.step_s <= r.baseline[i].pred.step_s, "%s: %.6g < chosen %.6g", r.baseline[i].name,
                  r.baseline[i].pred.step_s, r.predicted.step_s);
    for (int s = 0; s < r.layout->stages; s++) cr_expect(r.stage[s].memory_bytes <= 16.0 * 1073741824);
    cr_log_info("%d x %d, m %d: %.3f ms (pp-inner %.3f, dp-inner %.3f), %s", r.layout->stages, r.layout->replicas,
                r.layout->micro_batches, r.predicted.step_s * 1e3, r.baseline[0].pred.step_s * 1e3,
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
    cr_assert_eq(a.layout->stages, b.layout->stages);
    cr_assert_eq(a.layout->replicas, b.layout->replicas);
    cr_expect_eq(a.layout->micro_batches, b.layout->micro_batches);
    cr_expect_eq(a.predicted.step_s, b.predicted.step_s);
    cr_expect_eq(memcmp(a.layout->ranges, b.layout->ranges,
                        (size_t)a.layout->stages * a.layout->chunks * sizeof *a.layout->ranges), 0);
    cr_expect_eq(memcmp(a.layout->rank, b.layout->rank, (size_t)a.layout->n_ranks * sizeof *a.layout->rank), 0);
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

/* "auto" schedule: GPipe, 1F1B, the zero-bubble kinds and interleaved at 2
 * and 3 chunks (4 would need 8 units) are all evaluated, the fastest
 * prediction wins, and the planned plan names it. */
#define AUTO_SCHED(s)                                                                                         \
    "{\"model\": {\"preset\": \"gpt\", \"vocab\": 64, \"context\": 16, \"layers\": 4, \"heads\": 2, "     \
    "\"embed\": 32}, \"train\": {\"micro_batch\": 2}, \"parallel\": {\"stages\": 2, \"replicas\": 1, "          \
    "\"micro_batches\": 4, \"schedule\": \"" s "\"}, \"cluster\": {\"backend\": \"cpu\"}}"

static double planned_sps(const char *json, struct cdp_planner_result *r)
{
    struct cdp_plan *p = load(json);
    struct cdp_topology *t = NULL;
    cr_assert_eq(cdp_topology_cpu(2, 0, 0, &t), CDP_OK);
    cr_assert_eq(cdp_planner_run(p, t, NULL, 0, r), CDP_OK, "%s", cdp_last_error());
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
    cr_expect_eq(a.shapes, 7, "one shape, five schedules and interleaved at 2 and 3 chunks (6 units): %lld",
                 (long long)a.shapes);
    /* the fastest of all five, 1F1B on a tie */
    const char *const zb[3] = {"zb-h1", "zb-h2", "zbv"};
    const enum cdp_schedule_kind zk[3] = {CDP_SCHEDULE_ZB_H1, CDP_SCHEDULE_ZB_H2, CDP_SCHEDULE_ZBV};
    double best = s_1f1b;
    enum cdp_schedule_kind best_kind = CDP_SCHEDULE_1F1B;
    if (s_gpipe > best) best = s_gpipe, best_kind = CDP_SCHEDULE_GPIPE;
    for (int k = 0; k < 3; k++) {
        char json[1024];
        struct cdp_planner_result z = {0};
        snprintf(json, sizeof json, AUTO_SCHED("%s"), zb[k]);
        const double sz = planned_sps(json, &z);
        cr_expect_eq(z.layout->schedule, zk[k]);
        if (sz > best) best = sz, best_kind = zk[k];
        cdp_planner_result_clear(&z);
    }
    for (int v = 2; v <= 3; v++) { /* "interleaved" with its chunks */
        char json[1024], *at;
        snprintf(json, sizeof json, AUTO_SCHED("interleaved"));
        at = strstr(json, "\"interleaved\"") + strlen("\"interleaved\"");
        memmove(at + 13, at, strlen(at) + 1); /* `, "chunks": v` after the name */
        memcpy(at, ", \"chunks\": ", 12);
        at[12] = (char)('0' + v);
        struct cdp_planner_result z = {0};
        const double sz = planned_sps(json, &z);
        cr_expect_eq(z.layout->chunks, v, "%s", json);
        if (sz > best) best = sz, best_kind = CDP_SCHEDULE_INTERLEAVED;
        cdp_planner_result_clear(&z);
    }
    cr_expect_eq(s_auto, best, "auto %g, best %g (%s)", s_auto, best, cdp_schedule_name(best_kind));
    cr_expect_eq(a.layout->schedule, best_kind, "auto picked %s, the best is %s", cdp_schedule_name(a.layout->schedule),
                 cdp_schedule_name(best_kind));
    cr_expect_gt(best, s_1f1b, "a split backward fills 1F1B's bubble (%g against %g)", best, s_1f1b);
    struct cdp_plan *p = load(AUTO_SCHED("auto"));
    cr_assert(p->parallel.schedule_auto);
    char *text = NULL;
    cr_assert_eq(cdp_plan_to_json(p, &text), CDP_OK);
    cr_expect(strstr(text, "\"schedule\": \"auto\""), "%s", text);
    free(text);
    cr_assert_eq(cdp_planner_apply(&a, p), CDP_OK);
    cr_expect(!p->parallel.schedule_auto);
    cr_expect_eq(p->parallel.schedule, a.layout->schedule);
    cdp_planner_result_clear(&a);
    cdp_planner_result_clear(&g);
    cdp_planner_result_clear(&f);
    cdp_plan_free(p);
}

/* "schedule": "auto" at 2 stages and 3 micro-batches, a count the stages do
 * not divide: the planner weighs only schedules the runtime runs there (not
 * interleaved), and shares the micro-batches in multiples of the stages only
 * where the schedule's table row asks it (interleaved; zbv's V runs any
 * count, as the executor takes it), so zbv, named or chosen, plans; the
 * "auto" plan trains one step on 2 ranks. */
#define M3_PLAN(sched, out)                                                                                    \
    "{\"model\": {\"preset\": \"gpt\", \"vocab\": 32, \"context\": 8, \"layers\": 2, \"heads\": 2, "          \
    "\"embed\": 16}, \"train\": {\"steps\": 1, \"micro_batch\": 1}, \"parallel\": {\"stages\": 2, "             \
    "\"micro_batches\": 3, \"schedule\": \"" sched "\"}, \"cluster\": {\"backend\": \"cpu\"}" out "}"

Test(planner, auto_schedule_at_micro_batches_the_stages_do_not_divide_trains)
{
    struct cdp_topology *t = NULL;
    cr_assert_eq(cdp_topology_cpu(2, 0, 0, &t), CDP_OK);
    static const char *const plans[] = {M3_PLAN("zbv", ""), M3_PLAN("auto", "")};
    for (int i = 0; i < 2; i++) {
        struct cdp_plan *p = load(plans[i]);
        struct cdp_planner_result r = {0};
        cr_assert_eq(cdp_planner_run(p, t, NULL, 0, &r), CDP_OK, "%s: %s", i ? "auto" : "zbv", cdp_last_error());
        const struct cdp_layout *l = r.layout;
        cr_expect_eq(l->stages, 2);
        cr_expect_eq(l->replicas, 1);
        cr_expect_eq(l->micro_batches, 3);
        cr_expect_eq(l->shares[0], 3);
        cr_expect(!cdp_schedule_def(l->schedule)->mb_multiple_of_stages, "%s chosen at 3 micro-batches on 2 stages",
                  cdp_schedule_name(l->schedule));
        if (i == 0) cr_expect_eq(l->schedule, CDP_SCHEDULE_ZBV);
        cdp_planner_result_clear(&r);
        cdp_plan_free(p);
    }
    cdp_topology_free(t);
    if (!cdp_comm_have_mpi()) cr_skip_test("this build has no MPI (-Dmpi=disabled): the 2-rank run is not possible");
    char dir[4096], text[4800], metrics[4200];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", dir);
    snprintf(text, sizeof text, M3_PLAN("auto", ", \"output\": {\"metrics\": \"%s\"}"), metrics);
    const char *path = cdp_test_write_file(dir, "auto.json", text);
    struct cdp_run run;
    cr_assert_eq(cdp_test_run(&run, (const char *[]){"--plan", path, NULL}), 0);
    cr_assert_eq(run.exit_code, 0, "%s\n%s", run.out, run.err);
    cr_expect(strstr(run.out, "on 2 ranks: 2 stages x 1 replicas") && strstr(run.out, "3 micro-batches"), "%s",
              run.out);
    char *m = cdp_test_read_file(metrics);
    cr_assert_not_null(m, "no %s", metrics);
    cr_expect(strstr(m, "\"step\": 1") && strstr(m, "\"loss\""), "%s", m);
    free(m);
    cdp_test_run_free(&run);
}
#undef M3_PLAN

/* ---- load balance across replicas on mixed GPUs ------------------------------------------ */

/* Replica 0 on the A100 node, replica 1 on the V100 node (placement[stage][replica]). */
#define MIXED(prec, sched, extra)                                                                              \
    "{\"model\": {\"preset\": \"gpt\", \"vocab\": 1024, \"context\": 256, \"layers\": 8, \"heads\": 8, "      \
    "\"embed\": 512}, \"train\": {\"micro_batch\": 4, \"precision\": \"" prec "\", "                           \
    "\"optimizer\": {\"type\": \"adamw\"}}, \"parallel\": {\"stages\": 2, \"replicas\": 2, "                    \
    "\"micro_batches\": 8, \"schedule\": \"" sched "\", \"placement\": [[0, 8], [1, 9]]" extra "}, "           \
    "\"cluster\": {\"backend\": \"cuda\", \"topology\": \"1 x dgx-a100 + 1 x dgx1-v100\"}}"

static void check_sum(const struct cdp_planner_result *r)
{
    int64_t sum = 0;
    for (int q = 0; q < r->layout->replicas; q++) {
        cr_expect_geq(r->balance.shares[q], 1);
        sum += r->balance.shares[q];
    }
    cr_expect_eq(sum, (int64_t)r->layout->replicas * r->layout->micro_batches, "the global batch stays");
}

Test(planner, shares_follow_the_speed_ratio)
{
    struct cdp_plan *p = load(MIXED("fp32", "1f1b", ""));
    struct cdp_topology *t = NULL;
    cr_assert_eq(cdp_topology_load(p->cluster.topology, NULL, &t), CDP_OK, "%s", cdp_last_error());
    /* fp32: the A100's 19.5 TFLOP/s against the V100's 15.7 */
    const double k = t->gpus[0].peak_fp32 / t->gpus[8].peak_fp32;
    cr_assert(k > 1.2 && k < 1.3, "%g", k);
    struct cdp_planner_result r = {0};
    cr_assert_eq(cdp_planner_run(p, t, NULL, 0, &r), CDP_OK, "%s", cdp_last_error());
    const struct cdp_planner_balance *b = &r.balance;
    cr_assert_not_null(b->shares);
    cr_expect_eq(b->kind, CDP_BALANCE_SPEED);
    cr_expect(fabs(b->t_s[1] / b->t_s[0] - k) < 1e-9 * k, "t %g / %g, rates %g", b->t_s[1], b->t_s[0], k);
    check_sum(&r);
    /* the continuous optimum: (s0 + p - 1) t0 = (s1 + p - 1) t1 with s0 + s1 = T */
    const int T = 16, p1 = r.layout->stages - 1;
    const double s0 = (k * (T + p1) - p1) / (1 + k);
    cr_expect(fabs((double)b->shares[0] - s0) <= 1, "shares %lld %lld, optimum %.3f : %.3f", (long long)b->shares[0],
              (long long)b->shares[1], s0, T - s0);
    cr_expect_gt(b->shares[0], b->shares[1], "the faster replica takes more");
    cr_expect_lt(b->step_s, b->uniform_step_s);
    cr_expect(fabs(b->gain - (b->uniform_step_s / b->step_s - 1)) < 1e-12);
    cr_expect_geq(b->rest_s, 0);
    cr_expect_str_eq(b->devices[0], "A100-SXM4-80GB x2");
    cr_expect_str_eq(b->devices[1], "V100-SXM2-16GB x2");
    /* no share vector does better (brute force over s0) */
    for (int64_t x = 1; x < T; x++) {
        const int64_t sh[2] = {x, T - x};
        cr_expect_geq(cdp_balance_step_time(b->t_s, 2, r.layout->stages, sh) + b->rest_s, b->step_s * (1 - 1e-12));
    }
    /* written into the plan as explicit shares */
    cr_assert_eq(cdp_planner_apply(&r, p), CDP_OK);
    cr_expect_eq(p->parallel.balance, CDP_BALANCE_EXPLICIT);
    cr_assert_eq(p->parallel.n_shares, 2);
    cr_expect_eq(p->parallel.shares[0], b->shares[0]);
    cr_expect_eq(p->parallel.shares[1], b->shares[1]);
    /* and planning the planned plan gives the same */
    struct cdp_planner_result again = {0};
    cr_assert_eq(cdp_planner_run(p, t, NULL, 0, &again), CDP_OK, "%s", cdp_last_error());
    cr_expect_eq(again.balance.kind, CDP_BALANCE_EXPLICIT);
    cr_expect_eq(again.balance.shares[0], b->shares[0]);
    cr_expect_eq(again.balance.step_s, b->step_s);
    cdp_planner_result_clear(&again);
    cdp_planner_result_clear(&r);
    cdp_topology_free(t);
    cdp_plan_free(p);
}

Test(planner, equal_devices_get_exactly_uniform_shares)
{
    struct cdp_plan *p = load(FIXED_GPU);
    struct cdp_planner_result r = {0};
    cr_assert_eq(plan_on(p, "dgx1-v100", &r), CDP_OK, "%s", cdp_last_error());
    for (int q = 0; q < r.layout->replicas; q++) cr_expect_eq(r.balance.shares[q], r.layout->micro_batches, "replica %d", q);
    cr_expect_eq(r.balance.step_s, r.balance.uniform_step_s);
    cr_expect_eq(r.balance.gain, 0);
    cr_expect_eq(r.balance.t_s[0], r.balance.t_s[1]);
    cr_expect_str_eq(r.balance.devices[0], "V100-SXM2-16GB x2");
    cr_assert_eq(cdp_planner_apply(&r, p), CDP_OK);
    cr_expect_eq(p->parallel.balance, CDP_BALANCE_SPEED, "equal shares leave \"speed\"");
    cr_expect_null(p->parallel.shares);
    cdp_planner_result_clear(&r);
    cdp_plan_free(p);
    /* a mixed replica (one A100, one V100) is as slow as its V100 */
    p = load(MIXED("fp32", "1f1b", ", \"balance\": \"speed\"")); /* placement replaced below */
    p->parallel.placement_map[0] = 0, p->parallel.placement_map[1] = 1;  /* stage 0: A100s */
    p->parallel.placement_map[2] = 8, p->parallel.placement_map[3] = 9;  /* stage 1: V100s */
    struct cdp_topology *t = NULL;
    cr_assert_eq(cdp_topology_load(p->cluster.topology, NULL, &t), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_planner_run(p, t, NULL, 0, &r), CDP_OK, "%s", cdp_last_error());
    cr_expect_eq(r.balance.shares[0], 8);
    cr_expect_eq(r.balance.shares[1], 8);
    cr_expect_str_eq(r.balance.devices[1], "A100-SXM4-80GB x1 + V100-SXM2-16GB x1");
    cdp_planner_result_clear(&r);
    cdp_topology_free(t);
    cdp_plan_free(p);
}

Test(planner, explicit_and_uniform_shares_are_kept)
{
    struct cdp_plan *p = load(MIXED("fp32", "1f1b", ", \"balance\": [5, 11]"));
    struct cdp_planner_result r = {0};
    cr_assert_eq(plan_on(p, p->cluster.topology, &r), CDP_OK, "%s", cdp_last_error());
    cr_expect_eq(r.balance.kind, CDP_BALANCE_EXPLICIT);
    cr_expect_eq(r.balance.shares[0], 5);
    cr_expect_eq(r.balance.shares[1], 11);
    cr_expect_lt(r.balance.gain, 0, "more on the slower replica is slower than uniform");
    cr_assert_eq(cdp_planner_apply(&r, p), CDP_OK);
    cr_expect_eq(p->parallel.balance, CDP_BALANCE_EXPLICIT);
    cr_expect_eq(p->parallel.shares[0], 5);
    cdp_planner_result_clear(&r);
    cdp_plan_free(p);
    p = load(MIXED("fp32", "1f1b", ", \"balance\": \"uniform\""));
    cr_assert_eq(plan_on(p, p->cluster.topology, &r), CDP_OK, "%s", cdp_last_error());
    cr_expect_eq(r.balance.kind, CDP_BALANCE_UNIFORM);
    cr_expect_eq(r.balance.shares[0], 8);
    cr_expect_eq(r.balance.shares[1], 8);
    cr_expect_eq(r.balance.gain, 0);
    cr_assert_eq(cdp_planner_apply(&r, p), CDP_OK);
    cr_expect_eq(p->parallel.balance, CDP_BALANCE_UNIFORM);
    cdp_planner_result_clear(&r);
    cdp_plan_free(p);
}

Test(planner, interleaved_shares_are_multiples_of_the_stages)
{
    /* bf16: the A100 is about 20 x faster than a V100 (which has no BF16) */
    struct cdp_plan *p = load(MIXED("bf16", "interleaved", ""));
    struct cdp_planner_result r = {0};
    cr_assert_eq(plan_on(p, p->cluster.topology, &r), CDP_OK, "%s", cdp_last_error());
    check_sum(&r);
    for (int q = 0; q < r.layout->replicas; q++)
        cr_expect_eq(r.balance.shares[q] % r.layout->stages, 0, "replica %d: %lld", q, (long long)r.balance.shares[q]);
    cr_expect_gt(r.balance.shares[0], r.balance.shares[1]);
    cr_expect_eq(r.balance.shares[1], r.layout->stages, "the slow replica keeps one unit");
    cr_expect_gt(r.balance.gain, 0);
    cdp_planner_result_clear(&r);
    cdp_plan_free(p);
    /* explicit shares that are not multiples of a stage count: that shape is not tried
     * (p = 4 and 8 divide the 8 micro-batches but not the shares 10 and 6) */
    p = load(MIXED("bf16", "interleaved", ", \"balance\": [10, 6]"));
    p->parallel.stages = CDP_AUTO;
    p->parallel.placement = CDP_PLACEMENT_ORDERED_PP_INNER;
    cr_assert_eq(plan_on(p, p->cluster.topology, &r), CDP_OK, "%s", cdp_last_error());
    cr_expect_eq(r.layout->stages, 2);
    cr_expect_eq(r.shapes, 1, "%lld shapes", (long long)r.shapes);
    cr_expect_eq(r.balance.shares[0], 10);
    cdp_planner_result_clear(&r);
    cdp_plan_free(p);
}

/* The example of docs/planner.md: --dry-run shows the shares, --json carries them and round-trips. */
Test(planner, dry_run_shows_the_balance_of_the_mixed_example)
{
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    const char *src = cdp_test_source_path("examples/mixed-gpus.json");
    struct cdp_run r;
    const char *argv[] = {"--plan", src, "--dry-run", NULL};
    cr_assert_eq(cdp_test_run(&r, argv), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    const char *b = strstr(r.out, "Plan: balance (speed: shares by predicted speed)");
    cr_assert_not_null(b, "%s", r.out);
    long long s0, s1;
    double t0, t1, with, uniform, gain;
    const char *l0 = strstr(b, "A100-SXM4-80GB x8"), *l1 = strstr(b, "V100-SXM2-16GB x8");
    cr_assert(l0 && l1, "%s", b);
    cr_assert_eq(sscanf(l0, "A100-SXM4-80GB x8 %lf %lld", &t0, &s0), 2, "%s", l0);
    cr_assert_eq(sscanf(l1, "V100-SXM2-16GB x8 %lf %lld", &t1, &s1), 2, "%s", l1);
    cr_expect_gt(s0, s1, "%s", b);
    cr_expect_lt(t0, t1);
    const char *st = strstr(b, "  step ");
    cr_assert_not_null(st, "%s", b);
    cr_assert_eq(sscanf(st, " step %lf ms with these shares, %lf ms with 16 each: %lf%%", &with, &uniform, &gain), 3,
                 "%s", st);
    cr_expect_lt(with, uniform);
    cr_expect_gt(gain, 0);
    cdp_test_run_free(&r);

    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    const char *argv1[] = {"--plan", src, "--dry-run", "--json", NULL};
    struct cdp_run r1, r2;
    cr_assert_eq(cdp_test_run(&r1, argv1), 0);
    cr_assert_eq(r1.exit_code, 0, "%s", r1.err);
    json_t *j = json_loads(r1.out, 0, NULL);
    cr_assert_not_null(j, "%s", r1.out);
    json_t *bal = json_object_get(json_object_get(j, "planner"), "balance");
    cr_assert(json_is_object(bal), "%s", r1.out);
    json_t *shares = json_object_get(bal, "shares");
    json_t *plan_shares = json_object_get(json_object_get(j, "parallel"), "balance");
    cr_expect_eq(json_integer_value(json_array_get(shares, 0)), s0);
    cr_expect(json_equal(shares, plan_shares), "the plan runs with the shares shown");
    cr_expect_str_eq(json_string_value(json_array_get(json_object_get(bal, "devices"), 1)), "V100-SXM2-16GB x8");
    cr_expect_gt(json_real_value(json_object_get(bal, "gain")), 0);
    json_decref(j);
    const char *again = cdp_test_write_file(dir, "mixed-planned.json", r1.out);
    const char *argv2[] = {"--plan", again, "--dry-run", "--json", NULL};
    cr_assert_eq(cdp_test_run(&r2, argv2), 0);
    cr_assert_eq(r2.exit_code, 0, "%s", r2.err);
    cr_expect_str_eq(r1.out, r2.out);
    cdp_test_run_free(&r1);
    cdp_test_run_free(&r2);
}

/* ---- cdp_balance_shares ------------------------------------------------------------------ */

/* The least step time over every share vector (multiples of unit, unit..cap, summing to total). */
static double brute(const double *t, int R, int p, int64_t total, int64_t unit, int64_t cap, int64_t *sh, int r)
{
    if (r == R - 1) {
        sh[r] = total;
        if (total < unit || total % unit || (cap > 0 && total > cap)) return INFINITY;
        return cdp_balance_step_time(t, R, p, sh);
    }
    double best = INFINITY;
    for (int64_t x = unit; x <= total - (int64_t)(R - 1 - r) * unit; x += unit) {
        if (cap > 0 && x > cap) break;
        sh[r] = x;
        const double v = brute(t, R, p, total - x, unit, cap, sh, r + 1);
        if (v < best) best = v;
    }
    return best;
}

Test(planner, balance_shares_are_optimal_against_brute_force)
{
    uint64_t seed = 12345;
    int cases = 0;
    for (int R = 1; R <= 4; R++)
        for (int p = 1; p <= 3; p++)
            for (int64_t unit = 1; unit <= 2; unit++)
                for (int64_t cap = 0; cap <= 6; cap += 3)
                    for (int trial = 0; trial < 6; trial++) {
                        double t[4];
                        for (int r = 0; r < R; r++) {
                            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                            t[r] = 0.5 + (double)(seed >> 11) / 9007199254740992.0 * (trial < 3 ? 1 : 8);
                        }
                        const int64_t total = unit * (R + trial % 4 + (trial > 3 ? 5 : 0));
                        if (cap > 0 && (cap % unit || total > (int64_t)R * cap)) continue;
                        int64_t got[4], scratch[4];
                        cr_assert_eq(cdp_balance_shares(t, R, p, total, unit, cap, got), CDP_OK, "%s",
                                     cdp_last_error());
                        int64_t sum = 0;
                        for (int r = 0; r < R; r++) {
                            cr_expect_eq(got[r] % unit, 0);
                            cr_expect_geq(got[r], unit);
                            if (cap > 0) cr_expect_leq(got[r], cap, "R %d cap %lld", R, (long long)cap);
                            sum += got[r];
                        }
                        cr_expect_eq(sum, total);
                        const double best = brute(t, R, p, total, unit, cap, scratch, 0);
                        const double mine = cdp_balance_step_time(t, R, p, got);
                        cr_expect(mine <= best * (1 + 1e-12), "R %d p %d unit %lld cap %lld total %lld: %.9g > %.9g",
                                  R, p, (long long)unit, (long long)cap, (long long)total, mine, best);
                        cases++;
                    }
    cr_expect_gt(cases, 200, "%d cases", cases);
}

Test(planner, balance_shares_equal_times_and_errors)
{
    const double eq[3] = {2, 2, 2};
    int64_t sh[3];
    cr_assert_eq(cdp_balance_shares(eq, 3, 4, 12, 1, 0, sh), CDP_OK);
    cr_expect(sh[0] == 4 && sh[1] == 4 && sh[2] == 4);
    cr_assert_eq(cdp_balance_shares(eq, 3, 2, 12, 2, 0, sh), CDP_OK);
    cr_expect(sh[0] == 4 && sh[1] == 4 && sh[2] == 4);
    /* twice as fast: twice the share once the bubble is counted */
    const double two[2] = {1, 2};
    cr_assert_eq(cdp_balance_shares(two, 2, 1, 12, 1, 0, sh), CDP_OK);
    cr_expect(sh[0] == 8 && sh[1] == 4, "%lld %lld", (long long)sh[0], (long long)sh[1]);
    cr_expect_eq(cdp_balance_step_time(two, 2, 1, sh), 8);
    /* a cap moves the rest to the slower replica */
    cr_assert_eq(cdp_balance_shares(two, 2, 1, 12, 1, 6, sh), CDP_OK);
    cr_expect(sh[0] == 6 && sh[1] == 6);
    const struct {
        double t0;
        int R, p;
        int64_t total, unit, cap;
        const char *msg;
    } bad[] = {
        {1, 2, 2, 7, 2, 0, "in multiples of 2"},
        {1, 2, 2, 2, 2, 0, "cannot give 2 replicas at least 2 each"},
        {1, 2, 1, 13, 1, 6, "exceed 2 replicas x 6"},
        {0, 2, 1, 4, 1, 0, "replica 0 has time 0"},
        {-1, 2, 1, 4, 1, 0, "replica 0 has time -1"},
        {INFINITY, 2, 1, 4, 1, 0, "replica 0 has time inf"},
        {NAN, 2, 1, 4, 1, 0, "replica 0 has time"},
        {1, 0, 1, 4, 1, 0, "0 replicas"},
        {1, 2, 0, 4, 1, 0, "0 stages"},
        {1, 2, 1, 4, 0, 0, "unit 0"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const double t[2] = {bad[i].t0, 1};
        int64_t out[2] = {-7, -7};
        cr_expect_eq(cdp_balance_shares(t, bad[i].R, bad[i].p, bad[i].total, bad[i].unit, bad[i].cap, out),
                     CDP_ERR_INVALID, "case %zu", i);
        cr_expect(strstr(cdp_last_error(), bad[i].msg), "case %zu: \"%s\" lacks \"%s\"", i, cdp_last_error(),
                  bad[i].msg);
    }
}

/* Attention's saved state in the memory model: the CUDA table's fused bf16
 * kernels keep B*T*(heads + C) floats where the probabilities take
 * heads*T*T (head sizes 32 and 64, T above it); every other backend,
 * precision or head size keeps the probabilities. */
Test(planner, fused_attention_state_counts_in_activation_memory)
{
#define GPT_PLAN(prec, backend, heads)                                                                          \
    "{\"model\": {\"preset\": \"gpt\", \"vocab\": 1024, \"context\": 256, \"layers\": 2, \"heads\": " heads ", " \
    "\"embed\": 512}, \"train\": {\"micro_batch\": 4, \"precision\": \"" prec "\"}, "                            \
    "\"cluster\": {\"backend\": \"" backend "\", \"topology\": \"dgx1-v100\"}}"
    struct cdp_plan *fused = load(GPT_PLAN("bf16", "cuda", "8"));     /* head size 64 */
    struct cdp_plan *fp32 = load(GPT_PLAN("fp32", "cuda", "8"));
    struct cdp_plan *hs128 = load(GPT_PLAN("bf16", "cuda", "4"));     /* head size 128: no fused kernels */
    struct cdp_unit *u;
    int n;
    cr_assert_eq(cdp_units_build(&fused->model, &u, &n), CDP_OK, "%s", cdp_last_error());
    const struct cdp_unit *blk = &u[1];
    cr_assert_eq(blk->desc.type, CDP_LAYER_TRANSFORMER_BLOCK);
    const int64_t T = 256, C = 512;
    cr_expect_eq(cdp_cost_att_floats(fused, blk), T * (8 + C));
    cr_expect_eq(cdp_cost_att_floats(fp32, blk), blk->att_floats);
    cr_expect_eq(blk->att_floats, 8 * T * T);
    cr_expect_eq(cdp_cost_att_floats(fused, &u[0]), 0, "the embedding has no attention");
    struct cdp_unit *u4;
    int n4;
    cr_assert_eq(cdp_units_build(&hs128->model, &u4, &n4), CDP_OK, "%s", cdp_last_error());
    cr_expect_eq(cdp_cost_att_floats(hs128, &u4[1]), u4[1].att_floats);

    /* the activation bytes of the block drop by exactly the difference */
    struct cdp_device_rate r = {.flops = 1e14, .efficiency = 0.5, .mem_bw = 1e12};
    struct cdp_unit_cost cf, cp;
    cdp_cost_analytic(fused, blk, 1, &r, &cf);
    cdp_cost_analytic(hs128, &u4[1], 1, &r, &cp);
    const double B = 4, elem = 4; /* the runtime keeps fp32 activations in bf16 plans too */
    cr_expect_eq(cf.act_bytes, (double)(blk->act_floats - blk->att_floats + T * (8 + C)) * B * elem);
    cr_expect_eq(cp.act_bytes, (double)u4[1].act_floats * B * elem);
    free(u);
    free(u4);
    cdp_plan_free(fused);
    cdp_plan_free(fp32);
    cdp_plan_free(hs128);
#undef GPT_PLAN
}

/* Split by heads over a tensor group of t, the fused kernels' state is the
 * rank's: the CUDA table's attention_state_floats, B*NH*T + B*T*C when its
 * flash path takes the shape (kernels/cuda/attention.cu), asked with the
 * rank's NH/t heads and C/t width (cdp_unit_fit_kernels), so T*(NH/t + C/t)
 * a sample; the numbers written out, since that formula is CUDA code. Head
 * size 64 (C 512, 8 heads), a GPT block, a Llama block (4 kv heads) and a
 * list's attention, on every rank of the group. */
Test(planner, fused_attention_state_is_the_ranks_under_tensor_split)
{
#define BF16_CUDA(model) "{\"model\": " model ", \"train\": {\"micro_batch\": 4, \"precision\": \"bf16\"}, " \
    "\"cluster\": {\"backend\": \"cuda\", \"topology\": \"dgx1-v100\"}}"
    static const char *const plans[] = {
        BF16_CUDA("{\"preset\": \"gpt\", \"vocab\": 1024, \"context\": 256, \"layers\": 2, \"heads\": 8, "
                  "\"embed\": 512}"),
        BF16_CUDA("{\"preset\": \"llama\", \"vocab\": 1024, \"context\": 256, \"layers\": 2, \"heads\": 8, "
                  "\"kv_heads\": 4, \"dim\": 512, \"hidden\": 1024}"),
        BF16_CUDA("{\"input\": [256, 512], \"layers\": [{\"type\": \"attention\", \"heads\": 8}]}"),
    };
#undef BF16_CUDA
    const int at[] = {1, 1, 0}; /* the attention unit of each */
    const int64_t T = 256, C = 512, NH = 8, B = 4;
    for (size_t i = 0; i < sizeof plans / sizeof *plans; i++) {
        struct cdp_plan *p = load(plans[i]);
        for (int t = 1; t <= 4; t *= 2)
            for (int k = 0; k < t; k++) {
                struct cdp_unit *u;
                int n;
                cr_assert_eq(cdp_units_build_tensor(&p->model, t, k, &u, &n), CDP_OK, "%s", cdp_last_error());
                const struct cdp_unit *a = &u[at[i]];
                cr_assert_eq(cdp_unit_tensor_split(a), t > 1, "plan %zu, t = %d", i, t);
                /* B*(NH/t)*T + B*T*(C/t) over B */
                const int64_t state = (B * (NH / t) * T + B * T * (C / t)) / B;
                const int64_t want = t == 1 ? 256 * (8 + 512) : t == 2 ? 256 * (4 + 256) : 256 * (2 + 128);
                cr_expect_eq(state, want);
                cr_expect_eq(cdp_cost_att_floats(p, a), want, "plan %zu, t = %d, rank %d: %lld floats a sample", i,
                             t, k, (long long)cdp_cost_att_floats(p, a));
                /* the probabilities it replaces are the rank's heads' too */
                cr_expect_eq(a->att_floats, NH / t * T * T, "plan %zu, t = %d", i, t);
                /* and the planner's activation memory counts it */
                struct cdp_device_rate r = {.flops = 1e14, .efficiency = 0.5, .mem_bw = 1e12};
                struct cdp_unit_cost c;
                cdp_cost_analytic(p, a, 1, &r, &c);
                cr_expect_eq(c.act_bytes, (double)(a->act_floats - a->att_floats + want) * B * 4, "plan %zu, t = %d",
                             i, t);
                free(u);
            }
        cdp_plan_free(p);
    }
}

/* /train/recompute "auto": for a fixed shape, the least recomputation whose
 * memory fits the cap (none, then selective, then full), written into the
 * planned plan; each mode keeps less than the one before. */
static double peak_with(const char *mode, const char *cap, enum cdp_recompute *chosen)
{
    char text[1024];
    snprintf(text, sizeof text,
             "{\"model\": {\"preset\": \"gpt\", \"vocab\": 512, \"context\": 128, \"layers\": 4, \"heads\": 4, "
             "\"embed\": 64}, \"train\": {\"micro_batch\": 4, \"recompute\": \"%s\", \"optimizer\": {\"type\": "
             "\"adamw\"}}, \"parallel\": {\"stages\": 2, \"replicas\": 1, \"micro_batches\": 4}, "
             "\"cluster\": {\"backend\": \"cuda\", \"topology\": \"dgx1-v100\"%s%s%s}}",
             mode, cap ? ", \"device_memory\": \"" : "", cap ? cap : "", cap ? "\"" : "");
    struct cdp_plan *p = load(text);
    struct cdp_planner_result r = {0};
    cr_assert_eq(plan_on(p, "dgx1-v100", &r), CDP_OK, "%s", cdp_last_error());
    double peak = 0;
    for (int s = 0; s < r.layout->stages; s++) peak = fmax(peak, r.stage[s].memory_bytes);
    *chosen = r.layout->recompute;
    cr_assert_eq(cdp_planner_apply(&r, p), CDP_OK);
    cr_assert_eq(p->train.recompute, r.layout->recompute);
    cr_assert(!p->train.recompute_auto);
    cdp_planner_result_clear(&r);
    cdp_plan_free(p);
    return peak;
}

Test(planner, auto_recompute_is_the_least_that_fits)
{
    enum cdp_recompute got;
    const double none = peak_with("none", NULL, &got), sel = peak_with("selective", NULL, &got),
                 full = peak_with("full", NULL, &got);
    cr_assert_eq(got, CDP_RECOMPUTE_FULL);
    cr_assert_lt(sel, none);
    cr_assert_lt(full, sel);
    char cap[32];
    const double caps[3] = {none + 1024, 0.5 * (sel + none), 0.5 * (full + sel)};
    const enum cdp_recompute want[3] = {CDP_RECOMPUTE_NONE, CDP_RECOMPUTE_SELECTIVE, CDP_RECOMPUTE_FULL};
    for (int i = 0; i < 3; i++) {
        snprintf(cap, sizeof cap, "%.0fKiB", ceil(caps[i] / 1024));
        const double peak = peak_with("auto", cap, &got);
        cr_assert_eq(got, want[i], "cap %s: chose %s", cap, cdp_recompute_name(got));
        cr_assert_leq(peak, caps[i] + 1024);
    }
    cr_log_info("peak per stage: none %.0f, selective %.0f, full %.0f bytes", none, sel, full);
}

/* /parallel/zero "auto": unsharded when that fits, ZeRO-1 when only sharded
 * optimizer state fits (before any recomputation). */
static double zero_peak(const char *zero, const char *cap, const char *extra, int *chosen, enum cdp_recompute *rc)
{
    char text[1024];
    snprintf(text, sizeof text,
             "{\"model\": {\"preset\": \"gpt\", \"vocab\": 512, \"context\": 64, \"layers\": 4, \"heads\": 4, "
             "\"embed\": 128}, \"train\": {\"micro_batch\": 2, \"optimizer\": {\"type\": \"adamw\"}%s}, "
             "\"parallel\": {\"stages\": 1, \"replicas\": 4, \"micro_batches\": 1, \"zero\": %s}, "
             "\"cluster\": {\"backend\": \"cuda\", \"topology\": \"dgx1-v100\"%s%s%s}}",
             extra, zero, cap ? ", \"device_memory\": \"" : "", cap ? cap : "", cap ? "\"" : "");
    struct cdp_plan *p = load(text);
    struct cdp_planner_result r = {0};
    cr_assert_eq(plan_on(p, "dgx1-v100", &r), CDP_OK, "%s", cdp_last_error());
    double peak = 0;
    for (int i = 0; i < r.layout->n_ranks; i++) peak = fmax(peak, (double)r.layout->rank[i].memory.device);
    *chosen = r.layout->zero;
    *rc = r.layout->recompute;
    cr_assert_eq(cdp_planner_apply(&r, p), CDP_OK);
    cr_assert_eq(p->parallel.zero, r.layout->zero);
    cdp_planner_result_clear(&r);
    cdp_plan_free(p);
    return peak;
}

Test(planner, auto_zero_shards_when_that_is_what_fits)
{
    int z;
    enum cdp_recompute rc;
    const double whole = zero_peak("0", NULL, ", \"recompute\": \"none\"", &z, &rc),
                 sharded = zero_peak("1", NULL, ", \"recompute\": \"none\"", &z, &rc);
    cr_assert_eq(z, 1);
    cr_assert_lt(sharded, whole);
    char cap[32];
    snprintf(cap, sizeof cap, "%.0fKiB", ceil(0.5 * (whole + sharded) / 1024));
    zero_peak("\"auto\"", cap, "", &z, &rc);
    cr_assert_eq(z, 1, "cap %s", cap);
    cr_assert_eq(rc, CDP_RECOMPUTE_NONE, "sharding before recomputing");
    snprintf(cap, sizeof cap, "%.0fKiB", ceil(whole / 1024) + 1);
    zero_peak("\"auto\"", cap, "", &z, &rc);
    cr_assert_eq(z, 0, "it fits unsharded");
    /* ZeRO-2: the gradients sharded too; chosen where ZeRO-1 is not enough */
    const double grads = zero_peak("2", NULL, ", \"recompute\": \"none\"", &z, &rc);
    cr_assert_eq(z, 2);
    cr_assert_lt(grads, sharded);
    snprintf(cap, sizeof cap, "%.0fKiB", ceil(0.5 * (sharded + grads) / 1024));
    zero_peak("\"auto\"", cap, ", \"recompute\": \"none\"", &z, &rc);
    cr_assert_eq(z, 2, "cap %s, no recomputation", cap);
    /* with recomputation allowed, ZeRO-2 (a reduction after every backward) comes last */
    zero_peak("\"auto\"", cap, "", &z, &rc);
    cr_assert(z < 2 && rc != CDP_RECOMPUTE_NONE, "cap %s: zero %d, recompute %d", cap, z, (int)rc);
    cr_log_info("largest rank: %.0f bytes, %.0f with zero 1, %.0f with zero 2", whole, sharded, grads);
}

/* Gradient buckets are one rule (cdp_plan_bucket_bytes) for the executor, the
 * planner and the simulator, and the same on cpu and cuda (nccl overlaps its
 * collectives on a stream of its own): on with several replicas below ZeRO-2,
 * off with one replica, ZeRO-2 or bucket_mb 0. */
Test(planner, gradient_buckets_are_one_rule_on_every_backend)
{
    static const char *const backends[] = {"cpu", "cuda"};
    for (int k = 0; k < 2; k++)
        for (int off = 0; off < 2; off++) {
            char text[1024];
            snprintf(text, sizeof text,
                     "{\"model\": {\"preset\": \"gpt\", \"vocab\": 64, \"context\": 16, \"layers\": 2, \"heads\": 2,"
                     " \"embed\": 32}, \"data\": {\"source\": \"synthetic\"}, \"train\": {\"steps\": 1,"
                     " \"micro_batch\": 2}, \"parallel\": {\"bucket_mb\": %s}, \"cluster\": {\"backend\": \"%s\"}}",
                     off ? "0" : "2.5", backends[k]);
            struct cdp_plan *p = NULL;
            cr_assert_eq(cdp_plan_load_string(text, "test.json", NULL, &p), CDP_OK, "%s", cdp_last_error());
            const double on = off ? 0 : 2.5 * 1048576.0;
            cr_assert_eq(cdp_plan_bucket_bytes(p, 2, 0), on, "%s: 2 replicas: %g bytes", backends[k],
                         cdp_plan_bucket_bytes(p, 2, 0));
            cr_assert_eq(cdp_plan_bucket_bytes(p, 4, 1), on, "%s: ZeRO-1", backends[k]);
            cr_assert_eq(cdp_plan_bucket_bytes(p, 1, 0), 0.0, "%s: one replica", backends[k]);
            cr_assert_eq(cdp_plan_bucket_bytes(p, 2, 2), 0.0, "%s: ZeRO-2", backends[k]);
            cdp_plan_free(p);
        }
    cr_assert_eq(cdp_plan_bucket_bytes(NULL, 2, 0), 0.0);
}

static json_t *dry_run_json(const char *dir, const char *name, const char *text)
{
    const char *path = cdp_test_write_file(dir, name, text);
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", path, "--dry-run", "--json", NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    json_error_t e;
    json_t *j = json_loads(r.out, 0, &e);
    cr_assert_not_null(j, "%s: %s", e.text, r.out);
    cdp_test_run_free(&r);
    return j;
}

#define SMALL_GPT                                                                                              \
    "{\"model\": {\"preset\": \"gpt\", \"vocab\": 256, \"context\": 64, \"layers\": 4, \"heads\": 2, "        \
    "\"embed\": 64}, \"data\": {\"source\": \"synthetic\"}, \"train\": {\"steps\": 2, \"micro_batch\": 4}, "

/* /cluster/devices 4 on an 8-GPU topology: the job has devices 0 to 3, so
 * the planner places only there (it chose 0, 3, 4 and 7, and every rank then
 * refused planned.json: "device 4 does not exist"); the plan it writes loads
 * and plans again. */
Test(planner, fewer_devices_than_a_node_has_are_its_first, .timeout = 60)
{
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    json_t *j = dry_run_json(dir, "four.json", SMALL_GPT
                             "\"parallel\": {\"stages\": \"auto\", \"replicas\": \"auto\", \"micro_batches\": "
                             "\"auto\"}, \"cluster\": {\"backend\": \"cuda\", \"topology\": \"dgx1-v100\", "
                             "\"devices\": 4}}");
    const json_t *place = json_object_get(json_object_get(j, "parallel"), "placement");
    cr_assert(json_is_array(place));
    size_t i, k;
    const json_t *stage, *d;
    int n = 0;
    json_array_foreach(place, i, stage) json_array_foreach(stage, k, d) {
        cr_assert(json_integer_value(d) >= 0 && json_integer_value(d) < 4, "device %lld placed",
                  (long long)json_integer_value(d));
        n++;
    }
    cr_assert(n >= 1 && n <= 4, "%d ranks", n);
    char *text = json_dumps(j, 0);
    json_decref(dry_run_json(dir, "planned.json", text));
    free(text);
    json_decref(j);
}

/* Two ranks per GPU: the chosen placement and both fixed orders are
 * predicted as training runs them, ranks on one GPU sharing it; the chosen
 * is never slower than an order (the dry-run printed "-22.9%" when the
 * orders were simulated as if every rank had a GPU of its own, and the
 * search had put both replicas of a stage on one GPU). */
Test(planner, the_chosen_layout_is_no_slower_than_either_order, .timeout = 60)
{
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    json_t *j = dry_run_json(dir, "shared.json", SMALL_GPT
                             "\"parallel\": {\"stages\": 2, \"replicas\": 2, \"micro_batches\": 4}, \"cluster\": "
                             "{\"backend\": \"cuda\", \"topology\": \"dgx1-v100\", \"devices\": 2, "
                             "\"ranks_per_device\": 2}}");
    const json_t *pl = json_object_get(j, "planner");
    const double chosen = json_number_value(json_object_get(json_object_get(pl, "predicted"), "step_s"));
    cr_assert_gt(chosen, 0);
    const char *names[] = {"ordered-pp-inner", "ordered-dp-inner"};
    for (int i = 0; i < 2; i++) {
        const double b = json_number_value(
            json_object_get(json_object_get(json_object_get(pl, "baselines"), names[i]), "step_s"));
        cr_assert_geq(b, chosen, "%s: %.6g s, the chosen layout %.6g s", names[i], b, chosen);
    }
    json_decref(j);
}

/* The step lines' MFU divides by each rank's device peak, which the planner
 * copies from the topology for the plan's precision; a CPU device has none. */
Test(planner, layout_ranks_carry_their_device_peak)
{
    static const struct {
        const char *precision, *topology;
        double peak;
    } cases[] = {{"bf16", "hgx-h100", 989.5e12}, {"fp32", "hgx-h100", 67e12}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char json[1024];
        snprintf(json, sizeof json, "{\"model\": {\"preset\": \"gpt\", \"vocab\": 1024, \"context\": 256, \"layers\": 4, "
                 "\"heads\": 8, \"embed\": 512}, \"train\": {\"micro_batch\": 4, \"precision\": \"%s\"}, \"parallel\": "
                 "{\"stages\": 2, \"replicas\": 2, \"micro_batches\": 4}, \"cluster\": {\"backend\": \"cuda\", "
                 "\"topology\": \"%s\"}}", cases[i].precision, cases[i].topology);
        struct cdp_plan *p = load(json);
        struct cdp_planner_result r = {0};
        cr_assert_eq(plan_on(p, cases[i].topology, &r), CDP_OK, "%s", cdp_last_error());
        for (int k = 0; k < r.layout->n_ranks; k++)
            cr_assert_eq(r.layout->rank[k].peak_flops, cases[i].peak, "%s rank %d: %g", cases[i].precision, k,
                         r.layout->rank[k].peak_flops);
        cdp_planner_result_clear(&r);
        cdp_plan_free(p);
    }
    struct cdp_plan *p = load(AUTO_CPU);
    struct cdp_planner_result r = {0};
    struct cdp_topology *t = NULL;
    cr_assert_eq(cdp_topology_cpu(4, 0, 0, &t), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_planner_run(p, t, NULL, 0, &r), CDP_OK, "%s", cdp_last_error());
    for (int k = 0; k < r.layout->n_ranks; k++) cr_assert_eq(r.layout->rank[k].peak_flops, 0.0, "rank %d", k);
    cdp_topology_free(t);
    cdp_planner_result_clear(&r);
    cdp_plan_free(p);
}

/* The learning-rate schedule and the weight-decay groups change no cost: the
 * planner chooses the same layout and predicts the same step with them. */
Test(planner, the_lr_schedule_changes_no_plan)
{
    struct cdp_planner_result r[2] = {{0}};
    for (int k = 0; k < 2; k++) {
        char json[1024];
        snprintf(json, sizeof json, "{\"model\": {\"preset\": \"gpt\", \"vocab\": 1024, \"context\": 256, \"layers\": 4, "
                 "\"heads\": 8, \"embed\": 512}, \"train\": {\"steps\": 100, \"micro_batch\": 4, \"optimizer\": "
                 "{\"weight_decay\": 0.1%s}%s}, \"parallel\": {\"stages\": \"auto\", \"replicas\": \"auto\"}, "
                 "\"cluster\": {\"backend\": \"cuda\", \"topology\": \"hgx-h100\"}}",
                 k ? ", \"no_decay\": []" : "",
                 k ? ", \"lr_schedule\": {\"type\": \"wsd\", \"warmup_steps\": 10, \"decay_steps\": 20}" : "");
        struct cdp_plan *p = load(json);
        cr_assert_eq(plan_on(p, "hgx-h100", &r[k]), CDP_OK, "%s", cdp_last_error());
        cdp_plan_free(p);
    }
    char a[65], b[65];
    cdp_layout_digest(r[0].layout, a);
    cdp_layout_digest(r[1].layout, b);
    cr_assert_str_eq(a, b, "the same layout");
    cr_assert_eq(r[0].predicted.step_s, r[1].predicted.step_s);
    for (int k = 0; k < 2; k++) cdp_planner_result_clear(&r[k]);
}

/* /parallel/tensor t (docs/parallelism.md): t ranks per (stage, replica), the
 * ranks of a tensor group consecutive, on consecutive devices of one node,
 * with tensor indices 0 .. t-1; "auto" plans t = 1 for now. */
#define TENSOR_MLP(t, extra)                                                                                   \
    "{\"model\": {\"input\": [64], \"layers\": [{\"type\": \"linear\", \"out\": 256}, {\"type\": \"relu\"}, "    \
    "{\"type\": \"linear\", \"out\": 64}, {\"type\": \"gelu\"}, {\"type\": \"linear\", \"out\": 10}], "          \
    "\"loss\": \"cross_entropy\"}, \"train\": {\"micro_batch\": 4}, \"parallel\": {\"stages\": 2, "               \
    "\"replicas\": 2, \"micro_batches\": 4, \"tensor\": " t extra "}, \"cluster\": {\"backend\": \"cuda\", "     \
    "\"topology\": \"2 x hgx-h100\"}}"

Test(planner, tensor_groups_are_consecutive_devices_of_one_node)
{
    static const char *const placements[] = {"", ", \"placement\": \"ordered-dp-inner\"",
                                             ", \"placement\": [[0, 4], [8, 12]]"};
    for (int t = 2; t <= 4; t *= 2)
        for (int pl = 0; pl < 3; pl++) {
            char json[1024];
            char ts[8];
            snprintf(ts, sizeof ts, "%d", t);
            snprintf(json, sizeof json, TENSOR_MLP("%s", "%s"), ts, placements[pl]);
            struct cdp_plan *p = load(json);
            struct cdp_planner_result r = {0};
            cr_assert_eq(plan_on(p, "2 x hgx-h100", &r), CDP_OK, "t %d: %s", t, cdp_last_error());
            const struct cdp_layout *l = r.layout;
            cr_assert_eq(l->tensor, t);
            cr_assert_eq(l->n_ranks, 2 * 2 * t);
            cr_assert_eq(cdp_layout_check(l, 5), CDP_OK, "%s", cdp_last_error());
            for (int i = 0; i < l->n_ranks; i++) {
                const struct cdp_layout_rank *k = &l->rank[i];
                const int first = cdp_layout_rank_at(l, k->stage, k->replica, 0);
                cr_assert_eq(i, first + k->tensor, "t %d placement %d: rank %d (tensor %d) not after its group's first "
                             "rank %d", t, pl, i, k->tensor, first);
                cr_assert_eq(k->device, l->rank[first].device + k->tensor);
                cr_assert_eq(k->node, l->rank[first].node, "a tensor group spans nodes");
                if (i) cr_assert_gt(k->device, l->rank[i - 1].device, "ranks follow devices");
            }
            /* the layout's JSON keeps every tensor index */
            json_t *j = cdp_layout_to_json(l);
            cr_assert_eq(json_integer_value(json_object_get(j, "tensor")), t);
            json_t *rk = json_array_get(json_object_get(j, "ranks"), (size_t)l->n_ranks - 1);
            cr_assert_eq(json_integer_value(json_object_get(rk, "tensor")), t - 1);
            json_decref(j);
            cdp_planner_result_clear(&r);
            cdp_plan_free(p);
        }
    /* auto: the t the planner chooses, its groups as consecutive */
    struct cdp_plan *p = load(TENSOR_MLP("\"auto\"", ""));
    struct cdp_planner_result r = {0};
    cr_assert_eq(plan_on(p, "2 x hgx-h100", &r), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(r.layout->n_ranks, 4 * r.layout->tensor);
    cr_assert_eq(cdp_layout_check(r.layout, 5), CDP_OK, "%s", cdp_last_error());
    cdp_planner_result_clear(&r);
    cdp_plan_free(p);
}

Test(planner, tensor_groups_that_do_not_fit_a_node_are_refused)
{
    struct cdp_plan *p = load(TENSOR_MLP("16", ""));
    struct cdp_planner_result r = {0};
    cr_assert_eq(plan_on(p, "2 x hgx-h100", &r), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "/parallel/tensor: 16, but no node of the topology"), "%s", cdp_last_error());
    cdp_plan_free(p);
    /* an explicit group must start where t devices of one node follow */
    p = load(TENSOR_MLP("4", ", \"placement\": [[0, 6], [8, 12]]"));
    cr_assert_eq(plan_on(p, "2 x hgx-h100", &r), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "/parallel/placement/0/1: device 6 starts a tensor group of /parallel/tensor 4 "
                                       "devices, but devices 6 to 9 are not all on one node"),
              "%s", cdp_last_error());
    cdp_plan_free(p);
}

/* ---- /parallel/tensor "auto": the t the planner tries (partitioner/planner_tensor.c) */

#include "model/costs.h"
#include "model/layers.h"
#include "core/hash.h"
#include "partitioner/placement.h"
#include "partitioner/planner_internal.h"

#define TENSOR_GPT(heads, backend, extra)                                                                      \
    "{\"model\": {\"preset\": \"gpt\", \"vocab\": 1024, \"context\": 256, \"layers\": 8, \"heads\": " heads    \
    ", \"embed\": 384}, \"train\": {\"micro_batch\": 2, \"global_batch\": 64, \"precision\": \"bf16\", "       \
    "\"optimizer\": {\"type\": \"adamw\"}}, \"parallel\": {\"stages\": \"auto\", \"replicas\": \"auto\", "     \
    "\"micro_batches\": \"auto\", \"tensor\": \"auto\"" extra "}, \"cluster\": {\"backend\": \"" backend "\", \"topology\": \"hgx-h100\"}}"

static int choices_on(const char *plan_text, const char *topo, int *ts, char *why, size_t cap)
{
    struct cdp_plan *p = load(plan_text);
    struct cdp_topology *t = NULL;
    cr_assert_eq(cdp_topology_load(topo, NULL, &t), CDP_OK, "%s", cdp_last_error());
    const int n = cdp_planner_tensor_choices(p, t, ts, CDP_PLANNER_TENSOR_CHOICES, why, cap);
    cdp_topology_free(t);
    cdp_plan_free(p);
    return n;
}

Test(planner, tensor_choices_follow_the_model_and_the_nvlink_domain)
{
    int ts[CDP_PLANNER_TENSOR_CHOICES];
    char why[256];
    /* an NVSwitch node: every power of two up to its 8 GPUs */
    int n = choices_on(TENSOR_GPT("8", "cuda", ""), "2 x hgx-h100", ts, why, sizeof why);
    cr_assert_eq(n, 4, "%d: %s", n, why);
    cr_expect(ts[0] == 1 && ts[1] == 2 && ts[2] == 4 && ts[3] == 8);
    cr_expect(strstr(why, "t <= 8: the devices of a node"), "%s", why);
    /* dgx1-v100: the fully connected quads, not the whole cube-mesh */
    n = choices_on(TENSOR_GPT("8", "cuda", ""), "dgx1-v100", ts, why, sizeof why);
    cr_assert_eq(n, 3, "%d: %s", n, why);
    cr_expect_eq(ts[2], 4);
    cr_expect(strstr(why, "t = 8 would cross the NVLink domain"), "%s", why);
    /* a PCIe box: t = 1 and why */
    n = choices_on(TENSOR_GPT("8", "cuda", ""), "pcie-8gpu-2socket", ts, why, sizeof why);
    cr_assert_eq(n, 1, "%d: %s", n, why);
    cr_expect(strstr(why, "t = 2 would cross the NVLink domain") && strstr(why, "not NVLink or NVSwitch"), "%s", why);
    /* the model's divisors: 6 heads allow 2, not 4 */
    n = choices_on(TENSOR_GPT("6", "cuda", ""), "2 x hgx-h100", ts, why, sizeof why);
    cr_assert_eq(n, 2, "%d: %s", n, why);
    cr_expect(strstr(why, "t = 4 does not divide /model/heads (6)"), "%s", why);
    /* CPU devices */
    n = choices_on(TENSOR_GPT("8", "cpu", ""), "2 x hgx-h100", ts, why, sizeof why);
    cr_expect_eq(n, 1);
    cr_expect(strstr(why, "CPUs"), "%s", why);
    /* a layer list splits where its linears say so: the column split's width 12 allows 2 and 4, not 8 */
    n = choices_on("{\"model\": {\"input\": [64], \"layers\": [{\"type\": \"linear\", \"out\": 12, \"split\": "
                   "\"column\"}, {\"type\": \"relu\"}, {\"type\": \"linear\", \"out\": 10, \"split\": \"row\"}], "
                   "\"loss\": \"cross_entropy\"}, \"train\": {\"micro_batch\": 4}, \"parallel\": {\"tensor\": "
                   "\"auto\"}, \"cluster\": {\"backend\": \"cuda\", \"topology\": \"hgx-h100\"}}",
                   "2 x hgx-h100", ts, why, sizeof why);
    cr_expect_eq(n, 3, "%d: %s", n, why);
    cr_expect(strstr(why, "t = 8 does not divide the column splits' widths (their gcd 12)"), "%s", why);
    n = choices_on(TENSOR_MLP("\"auto\"", ""), "2 x hgx-h100", ts, why, sizeof why);
    cr_expect(n == 1 && strstr(why, "no linear of /model/layers has a \"split\" and no layer splits itself"), "%d: %s", n,
              why);
    /* a list of layers that split themselves (no split linear): their keys' divisors, the
     * first that t does not divide named (kv_heads 2 of the rotary_attention allows 2) */
    n = choices_on("{\"model\": {\"input\": [8], \"layers\": [{\"type\": \"embedding\", \"vocab\": 32, \"dim\": "
                   "16}, {\"type\": \"rmsnorm\"}, {\"type\": \"rotary_attention\", \"heads\": 4, \"kv_heads\": 2}, "
                   "{\"type\": \"rmsnorm\"}, {\"type\": \"swiglu_mlp\", \"hidden\": 24}, {\"type\": \"rmsnorm\"}, "
                   "{\"type\": \"linear\", \"out\": 32, \"bias\": false}]}, \"train\": {\"micro_batch\": 4}, "
                   "\"parallel\": {\"tensor\": \"auto\"}, \"cluster\": {\"backend\": \"cuda\", \"topology\": "
                   "\"hgx-h100\"}}",
                   "2 x hgx-h100", ts, why, sizeof why);
    cr_expect(n == 2 && ts[1] == 2, "%d: %s", n, why);
    cr_expect(strstr(why, "t = 4 does not divide /model/layers/2/kv_heads (2)"), "%s", why);
    /* GPT's list attention splits by heads: 6 allow 2, not 4 */
    n = choices_on("{\"model\": {\"input\": [8], \"layers\": [{\"type\": \"embedding\", \"vocab\": 32, \"dim\": "
                   "24}, {\"type\": \"layernorm\"}, {\"type\": \"attention\", \"heads\": 6}, {\"type\": "
                   "\"layernorm\"}, {\"type\": \"linear\", \"out\": 32}], \"loss\": \"cross_entropy\"}, \"train\": "
                   "{\"micro_batch\": 4}, \"parallel\": {\"tensor\": \"auto\"}, \"cluster\": {\"backend\": \"cuda\", "
                   "\"topology\": \"hgx-h100\"}}",
                   "2 x hgx-h100", ts, why, sizeof why);
    cr_expect(n == 2 && ts[1] == 2, "%d: %s", n, why);
    cr_expect(strstr(why, "t = 4 does not divide /model/layers/2/heads (6)"), "%s", why);
    /* a fixed t is the plan's */
    n = choices_on(TENSOR_MLP("2", ""), "2 x hgx-h100", ts, why, sizeof why);
    cr_expect(n == 1 && ts[0] == 2);
}

Test(planner, tensor_collectives_cost_a_ring_all_reduce_per_split_product)
{
    struct cdp_plan *p = load(TENSOR_GPT("8", "cuda", ""));
    struct cdp_unit *u = NULL;
    int n = 0;
    cr_assert_eq(cdp_units_build(&p->model, &u, &n), CDP_OK);
    const struct cdp_unit *block = &u[1];
    cr_assert_eq(block->desc.type, CDP_LAYER_TRANSFORMER_BLOCK);
    const double bw = 1e11, lat = 2e-6, bytes = 2.0 * 256 * 384 * cdp_cost_act_elem_bytes(p);
    int f, b;
    double one = cdp_planner_tensor_collective_s(p, 4, bw, lat, block, &f, &b);
    cr_expect(fabs(one - (2.0 * 3 / 4 * bytes / bw + 6 * lat)) < 1e-12 * one, "%g", one);
    cr_expect(f == 2 && b == 2, "%d %d", f, b);
    /* full recomputation runs the forward's two again */
    cdp_unit_set_recompute(&u[1], CDP_RECOMPUTE_FULL);
    cdp_planner_tensor_collective_s(p, 4, bw, lat, &u[1], &f, &b);
    cr_expect(f == 2 && b == 4, "%d %d", f, b);
    /* the embedding: one after the lookup; the head: its input's gradient; t = 1: none */
    cdp_planner_tensor_collective_s(p, 4, bw, lat, &u[0], &f, &b);
    cr_expect(f == 1 && b == 0);
    cdp_planner_tensor_collective_s(p, 4, bw, lat, &u[n - 1], &f, &b);
    cr_expect(f == 0 && b == 1);
    cr_expect_eq(cdp_planner_tensor_collective_s(p, 1, bw, lat, block, &f, &b), 0);
    /* a rank of a group of 4 holds a quarter of a block's matrices and does a quarter of its products:
     * the block splits itself (cdp_units_build_tensor), and the planner does not divide it again */
    struct cdp_unit *u4 = NULL;
    int n4 = 0;
    cr_assert_eq(cdp_units_build_tensor(&p->model, 4, 0, &u4, &n4), CDP_OK);
    cdp_planner_tensor_units(p, 4, u4, n4);
    struct cdp_unit q = u4[1];
    free(u4);
    cr_expect(fabs(q.fwd_flops - u[1].fwd_flops / 4) < 1e-9 * u[1].fwd_flops, "%g of %g", q.fwd_flops,
              u[1].fwd_flops);
    cr_expect(fabs(q.bwd_flops - u[1].bwd_flops / 4) < 1e-9 * u[1].bwd_flops, "%g of %g", q.bwd_flops,
              u[1].bwd_flops);
    /* biases and layernorms whole: 13 x embed of them */
    cr_expect(q.param_count <= u[1].param_count / 4 + 13 * 384 && q.param_count > u[1].param_count / 4, "%lld of %lld",
              (long long)q.param_count, (long long)u[1].param_count);
    free(u);
    cdp_plan_free(p);
    /* a list's attention: its output's all-reduce forward, its input gradient's backward, of its own [T, C] */
    p = load("{\"model\": {\"input\": [32, 64], \"layers\": [{\"type\": \"attention\", \"heads\": 4}, "
             "{\"type\": \"linear\", \"out\": 8}]}, \"train\": {\"micro_batch\": 2}, \"cluster\": "
             "{\"backend\": \"cuda\", \"topology\": \"hgx-h100\"}}");
    cr_assert_eq(cdp_units_build(&p->model, &u, &n), CDP_OK);
    cr_assert_eq(u[0].desc.type, CDP_LAYER_ATTENTION);
    const double att_bytes = 2.0 * 32 * 64 * cdp_cost_act_elem_bytes(p);
    one = cdp_planner_tensor_collective_s(p, 4, bw, lat, &u[0], &f, &b);
    cr_expect(fabs(one - (2.0 * 3 / 4 * att_bytes / bw + 6 * lat)) < 1e-12 * one, "%g", one);
    cr_expect(f == 1 && b == 1, "%d %d", f, b);
    cdp_unit_set_recompute(&u[0], CDP_RECOMPUTE_FULL);
    cdp_planner_tensor_collective_s(p, 4, bw, lat, &u[0], &f, &b);
    cr_expect(f == 1 && b == 2, "%d %d", f, b);
    free(u);
    cdp_plan_free(p);
    /* Llama's list types the same: rotary_attention and swiglu_mlp each sum their [T, C] output */
    p = load("{\"model\": {\"input\": [32, 64], \"layers\": [{\"type\": \"rotary_attention\", \"heads\": 4, "
             "\"kv_heads\": 2}, {\"type\": \"swiglu_mlp\", \"hidden\": 128}, {\"type\": \"linear\", \"out\": 8}]}, "
             "\"train\": {\"micro_batch\": 2}, \"cluster\": {\"backend\": \"cuda\", \"topology\": \"hgx-h100\"}}");
    cr_assert_eq(cdp_units_build(&p->model, &u, &n), CDP_OK);
    for (int i = 0; i < 2; i++) {
        one = cdp_planner_tensor_collective_s(p, 4, bw, lat, &u[i], &f, &b);
        cr_expect(fabs(one - (2.0 * 3 / 4 * att_bytes / bw + 6 * lat)) < 1e-12 * one, "unit %d: %g", i, one);
        cr_expect(f == 1 && b == 1, "unit %d: %d %d", i, f, b);
    }
    free(u);
    cdp_plan_free(p);
}

Test(planner, tensor_auto_keeps_the_fastest_t_and_lists_the_others, .timeout = 120)
{
    struct cdp_plan *p = load(TENSOR_GPT("8", "cuda", ""));
    struct cdp_planner_result r = {0};
    cr_assert_eq(plan_on(p, "hgx-h100", &r), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(r.n_tensor_alt, 4);
    int chosen = 0;
    for (int i = 0; i < r.n_tensor_alt; i++) {
        const struct cdp_planner_tensor_alt *a = &r.tensor_alt[i];
        if (a->tensor == r.layout->tensor) {
            chosen++;
            cr_expect(a->ok);
            cr_expect_eq(a->samples_per_s, r.predicted.samples_per_s);
        } else if (a->ok) {
            cr_expect_leq(a->samples_per_s, r.predicted.samples_per_s, "t %d beats the chosen t %d", a->tensor,
                          r.layout->tensor);
        }
    }
    cr_expect_eq(chosen, 1);
    cr_expect_eq(r.layout->n_ranks, r.layout->stages * r.layout->replicas * r.layout->tensor);
    /* --json carries the same */
    json_t *j = cdp_planner_to_json(&r), *tried = json_object_get(json_object_get(j, "tensor_search"), "tried");
    cr_assert_eq(json_array_size(tried), 4);
    int marked = 0;
    for (size_t i = 0; i < 4; i++) {
        json_t *x = json_array_get(tried, i);
        if (json_is_true(json_object_get(x, "chosen"))) {
            marked++;
            cr_expect_eq(json_integer_value(json_object_get(x, "tensor")), r.layout->tensor);
        }
    }
    cr_expect_eq(marked, 1);
    json_decref(j);
    cdp_planner_result_clear(&r);
    cdp_plan_free(p);
}

/* The dry-run's tensor lines on the two non-NVSwitch machines: dgx1-v100
 * tries t up to its fully connected quads (no group crosses one) and says why
 * not 8; a PCIe box keeps t = 1 and says why. */
Test(planner, tensor_groups_stay_in_the_quads_and_a_pcie_box_keeps_t_1, .timeout = 120)
{
    static const char *const topo[] = {"dgx1-v100", "pcie-8gpu-2socket"};
    for (int k = 0; k < 2; k++) {
        struct cdp_plan *p = load(TENSOR_GPT("8", "cuda", ""));
        struct cdp_planner_result r = {0};
        cr_assert_eq(plan_on(p, topo[k], &r), CDP_OK, "%s: %s", topo[k], cdp_last_error());
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        cr_assert(f);
        cdp_planner_print(&r, f);
        fclose(f);
        if (k == 0) {
            cr_expect_eq(r.n_tensor_alt, 3, "t = 1, 2, 4");
            for (int i = 0; i < r.n_tensor_alt; i++) cr_expect_leq(r.tensor_alt[i].tensor, 4);
            /* a group of the chosen layout: consecutive devices of one quad (0-3 or 4-7) */
            for (int i = 0; i < r.layout->n_ranks; i++) {
                const struct cdp_layout_rank *q = &r.layout->rank[i];
                const struct cdp_layout_rank *lead = &r.layout->rank[i - q->tensor];
                cr_expect_eq(q->device, lead->device + q->tensor);
                cr_expect_eq(q->device / 4, lead->device / 4, "rank %d: device %d, its group's first %d", i,
                             q->device, lead->device);
            }
            cr_expect(strstr(text, "not tried: t <= 4: t = 8 would cross the NVLink domain"), "%s", text);
        } else {
            cr_expect_eq(r.layout->tensor, 1);
            cr_expect_eq(r.n_tensor_alt, 1);
            cr_expect(strstr(text, "not tried: t <= 1: t = 2 would cross the NVLink domain: devices 0 and 1 are "
                                   "linked by PIX, not NVLink or NVSwitch"), "%s", text);
        }
        free(text);
        cdp_planner_result_clear(&r);
        cdp_plan_free(p);
    }
    /* a fixed t = 4 on dgx1-v100: 2 stages x 1 replica, one group per quad */
    struct cdp_plan *p = load("{\"model\": {\"input\": [64], \"layers\": [{\"type\": \"linear\", \"out\": 256, "
                              "\"split\": \"column\"}, {\"type\": \"relu\"}, {\"type\": \"linear\", \"out\": 64, "
                              "\"split\": \"row\"}], \"loss\": \"cross_entropy\"}, \"train\": {\"micro_batch\": 4}, "
                              "\"parallel\": {\"stages\": 2, \"replicas\": 1, \"micro_batches\": 4, \"tensor\": 4}, "
                              "\"cluster\": {\"backend\": \"cuda\", \"topology\": \"dgx1-v100\"}}");
    struct cdp_planner_result r = {0};
    cr_assert_eq(plan_on(p, "dgx1-v100", &r), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(r.layout->n_ranks, 8);
    for (int i = 0; i < 8; i++)
        cr_expect_eq(r.layout->rank[i].device / 4, r.layout->rank[i - r.layout->rank[i].tensor].device / 4,
                     "rank %d on device %d", i, r.layout->rank[i].device);
    cdp_planner_result_clear(&r);
    cdp_plan_free(p);
}

/* A long pipeline of a small world (m >= 10p, p x R <= 16) is placed on its
 * steady state: the search's objective simulates every rank at 2p and 3p
 * micro-batches and extrapolates to m (cdp_planner_search_cost). Past the fill
 * each micro-batch adds one period; where replicas' transfers or tensor
 * collectives contend for a link or port the period can shift a little, so
 * the extrapolation is the full simulation at m to 1e-3 (to 1e-9 in most of
 * these cases), for every schedule kind, with replicas, ZeRO-2 and tensor
 * groups, on the chosen, the ordered and random placements; what the plan
 * predicts is the full simulation of its placement; and a shorter pipeline is
 * searched on the full simulation itself. */
#define LONG_PIPE(shape)                                                                                       \
    "{\"model\": {\"preset\": \"gpt\", \"vocab\": 1024, \"context\": 256, \"layers\": 8, \"heads\": 8, "      \
    "\"embed\": 512}, \"data\": {\"source\": \"synthetic\"}, \"train\": {\"micro_batch\": 4, \"optimizer\": "  \
    "{\"type\": \"adamw\"}}, \"parallel\": {" shape "}, \"cluster\": {\"backend\": \"cuda\", \"topology\": "   \
    "\"dgx1-v100\"}}"
#define ORDERED ", \"placement\": \"ordered-pp-inner\""

Test(planner, a_long_pipelines_placement_search_extrapolates_the_full_simulation, .timeout = 120)
{
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    static const char *const plans[] = {
        LONG_PIPE("\"stages\": 4, \"replicas\": 2, \"micro_batches\": 40, \"schedule\": \"1f1b\"" ORDERED),
        LONG_PIPE("\"stages\": 2, \"replicas\": 4, \"micro_batches\": 24, \"schedule\": \"gpipe\"" ORDERED),
        LONG_PIPE("\"stages\": 4, \"replicas\": 2, \"micro_batches\": 44, \"schedule\": \"zb-h1\", \"zero\": 2" ORDERED),
        LONG_PIPE("\"stages\": 2, \"replicas\": 4, \"micro_batches\": 20, \"schedule\": \"zb-h2\"" ORDERED),
        LONG_PIPE("\"stages\": 4, \"replicas\": 2, \"micro_batches\": 40, \"schedule\": \"interleaved\", "
                  "\"chunks\": 2" ORDERED),
        LONG_PIPE("\"stages\": 4, \"replicas\": 2, \"micro_batches\": 42, \"schedule\": \"zbv\"" ORDERED),
        /* searched: tensor groups on the objective */
        LONG_PIPE("\"stages\": 4, \"replicas\": 1, \"micro_batches\": 40, \"tensor\": 2, \"schedule\": \"1f1b\""),
        /* 36 < 10p: the full simulation */
        LONG_PIPE("\"stages\": 4, \"replicas\": 2, \"micro_batches\": 36, \"schedule\": \"1f1b\"" ORDERED),
    };
    const size_t n = sizeof plans / sizeof *plans;
    struct cdp_topology *t = NULL;
    cr_assert_eq(cdp_topology_load("dgx1-v100", NULL, &t), CDP_OK, "%s", cdp_last_error());
    uint64_t seed = 7;
    int close = 0;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        struct cdp_plan *p = load(plans[i]);
        struct cdp_planner_result r = {0};
        cr_assert_eq(cdp_planner_run(p, t, NULL, 0, &r), CDP_OK, "plan %zu: %s", i, cdp_last_error());
        const struct cdp_layout *l = r.layout;
        const int S = l->stages, R = l->replicas, N = S * R, longer = l->micro_batches >= 10 * S;
        cr_assert_eq(longer, i + 1 < n, "plan %zu: %d micro-batches of %d stages", i, l->micro_batches, S);
        /* the plan as the search saw it: its shape prepared, as cdp_planner_explore does */
        struct ctx c;
        struct cdp_plan at = *p;
        at.parallel.tensor = l->tensor;
        at.model.seq_parallel = r.sequence_parallel;
        cr_assert_eq(cdp_planner_ctx_init_for(&c, &at, t, NULL, l->recompute), CDP_OK, "%s", cdp_last_error());
        c.kind = l->schedule, c.zero = l->zero, c.v = l->chunks;
        cr_assert_eq(cdp_planner_prepare(&c, S, R, l->micro_batches, (const int64_t(*)[2])l->ranges), CDP_OK);
        cr_assert_eq(c.cheap, 0, "plan %zu: a small world", i);
        int dev[16], perm[16];
        for (int which = 0; which < 6; which++) {
            if (which == 0) { /* the chosen placement */
                for (int k = 0; k < l->n_ranks; k++)
                    if (!l->rank[k].tensor) dev[l->rank[k].stage * R + l->rank[k].replica] = l->rank[k].device;
            } else {
                if (which == 1) cdp_placement_ordered_pp_inner(S, R, dev);
                else {
                    for (int d = 0; d < c.n_groups; d++) perm[d] = d;
                    for (int k = 0; k < N; k++) {
                        const int j = k + (int)(cdp_splitmix64(&seed) % (uint64_t)(c.n_groups - k));
                        const int x = perm[k];
                        perm[k] = perm[j], perm[j] = x;
                    }
                    memcpy(dev, perm, (size_t)N * sizeof *dev);
                }
                cdp_planner_to_leaders(&c, N, dev);
            }
            const int64_t sims = c.sims;
            const double full = cdp_planner_place_cost(dev, &c), lin = cdp_planner_search_cost(dev, &c);
            cr_expect(isfinite(full) && full > 0, "plan %zu", i);
            if (longer) {
                cr_expect_eq(c.sims, sims + 3, "plan %zu: one full simulation and two short ones", i);
                close += fabs(lin - full) <= 1e-9 * full;
                worst = fmax(worst, fabs(lin - full) / full);
                cr_expect_leq(fabs(lin - full), 1e-3 * full,
                              "plan %zu, placement %d (%s): extrapolated %.9f ms, full %.9f ms", i, which,
                              cdp_schedule_name(l->schedule), lin * 1e3, full * 1e3);
            } else {
                cr_expect_eq(c.sims, sims + 2, "plan %zu: two full simulations", i);
                cr_expect_eq(lin, full, "plan %zu", i);
            }
            if (which == 0) /* what the plan predicts is the full simulation */
                cr_expect_leq(fabs(r.predicted.step_s - full), 1e-12 * full, "plan %zu: %.9f ms, %.9f ms", i,
                              r.predicted.step_s * 1e3, full * 1e3);
        }
        cdp_planner_ctx_free(&c);
        cdp_planner_result_clear(&r);
        cdp_plan_free(p);
    }
    cr_log_info("extrapolated steps within 1e-9 of the full simulation's: %d of %zu, %.2e off at worst", close,
                6 * (n - 1), worst);
    cdp_topology_free(t);
}

/* Placement "topology" at t > 1 (docs/planner.md, "Tensor groups"): on
 * dgx1-v100 at t = 2 the groups {0,1}, {2,3}, {4,5}, {6,7} are joined member by
 * member over NVLink in a ring ({0,1}-{2,3}, {2,3}-{6,7}, {6,7}-{4,5},
 * {4,5}-{0,1}) and over PCIe/SYS across it ({2,3}-{4,5}, {0,1}-{6,7}).
 * ordered-pp-inner's 4-stage pipeline crosses {2,3} -> {4,5}; the search
 * keeps every boundary on NVLink, is predicted strictly faster, and the
 * dry-run's line says what was searched. The layout puts tensor index k on
 * its group's first device + k; `--dry-run --json` writes that layout and
 * that placement, and the file planned again (as a run reads planned.json)
 * gives the same layout. */
#define GROUPS_DGX1                                                                                            \
    "{\"model\": {\"preset\": \"gpt\", \"vocab\": 1024, \"context\": 256, \"layers\": 8, \"heads\": 8, "      \
    "\"embed\": 512}, \"data\": {\"source\": \"synthetic\"}, \"train\": {\"micro_batch\": 4, \"optimizer\": "  \
    "{\"type\": \"adamw\"}}, \"parallel\": {\"stages\": 4, \"replicas\": 1, \"micro_batches\": 8, \"tensor\": " \
    "2, \"schedule\": \"1f1b\"}, \"cluster\": {\"backend\": \"cuda\", \"topology\": \"dgx1-v100\"}}"

Test(planner, tensor_groups_placed_by_the_search_beat_ordered_pp_inner, .timeout = 120)
{
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    struct cdp_plan *p = load(GROUPS_DGX1);
    struct cdp_planner_result r = {0};
    cr_assert_eq(plan_on(p, "dgx1-v100", &r), CDP_OK, "%s", cdp_last_error());
    cr_expect(strstr(r.placement_method, "exact over 4 groups of 2 devices"), "%s", r.placement_method);
    cr_assert_eq(r.layout->n_ranks, 8);
    cr_assert_eq(r.layout->tensor, 2);
    cr_expect_lt(r.predicted.step_s, r.baseline[0].pred.step_s, "searched %.6f ms, %s %.6f ms",
                 r.predicted.step_s * 1e3, r.baseline[0].name, r.baseline[0].pred.step_s * 1e3);
    struct cdp_topology *t = NULL;
    cr_assert_eq(cdp_topology_load("dgx1-v100", NULL, &t), CDP_OK);
    int lead[4][2]; /* [stage][tensor] -> device */
    for (int i = 0; i < 8; i++) {
        const struct cdp_layout_rank *q = &r.layout->rank[i];
        const struct cdp_layout_rank *first = &r.layout->rank[i - q->tensor];
        cr_expect_eq(q->device, first->device + q->tensor);
        cr_expect_eq(first->device % 2, 0, "a group starts at an even device");
        lead[q->stage][q->tensor] = q->device;
    }
    for (int s = 0; s < 3; s++)
        for (int k = 0; k < 2; k++) {
            struct cdp_topology_link l;
            cr_assert_eq(cdp_topology_link(t, lead[s][k], lead[s + 1][k], &l), CDP_OK);
            cr_expect_eq(l.cls, CDP_LINK_NVLINK, "stages %d-%d, tensor %d: devices %d-%d", s, s + 1, k, lead[s][k],
                         lead[s + 1][k]);
        }
    cdp_topology_free(t);

    /* the dry-run's line, the --json layout and placement, and the file planned again */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    const char *path = cdp_test_write_file(dir, "groups.json", GROUPS_DGX1);
    struct cdp_run run, again;
    cr_assert_eq(cdp_test_run(&run, (const char *[]){"--plan", path, "--dry-run", NULL}), 0);
    cr_assert_eq(run.exit_code, 0, "%s", run.err);
    cr_expect(strstr(run.out, "Plan: placement (exact over 4 groups of 2 devices: "), "%s", run.out);
    cdp_test_run_free(&run);
    cr_assert_eq(cdp_test_run(&run, (const char *[]){"--plan", path, "--dry-run", "--json", NULL}), 0);
    cr_assert_eq(run.exit_code, 0, "%s", run.err);
    json_error_t err;
    json_t *j = json_loads(run.out, 0, &err);
    cr_assert_not_null(j, "%s", err.text);
    const json_t *place = json_object_get(json_object_get(j, "parallel"), "placement");
    const json_t *ranks = json_object_get(json_object_get(j, "layout"), "ranks");
    cr_assert_eq(json_array_size(place), 4, "/parallel/placement names each stage's group");
    cr_assert_eq(json_array_size(ranks), 8);
    for (size_t i = 0; i < 8; i++) {
        const json_t *q = json_array_get(ranks, i);
        const int s = (int)json_integer_value(json_object_get(q, "stage")),
                  k = (int)json_integer_value(json_object_get(q, "tensor")),
                  d = (int)json_integer_value(json_object_get(q, "device"));
        cr_expect_eq(d, lead[s][k], "/layout/ranks/%zu: stage %d tensor %d on device %d, the planner's %d", i, s, k,
                     d, lead[s][k]);
        cr_expect_eq(d, json_integer_value(json_array_get(json_array_get(place, (size_t)s), 0)) + k,
                     "/layout/ranks/%zu: device %d, not /parallel/placement/%d/0 + %d", i, d, s, k);
    }
    json_decref(j);
    const char *planned = cdp_test_write_file(dir, "planned.json", run.out);
    cr_assert_eq(cdp_test_run(&again, (const char *[]){"--plan", planned, "--dry-run", "--json", NULL}), 0);
    cr_assert_eq(again.exit_code, 0, "%s", again.err);
    cr_expect_str_eq(again.out, run.out, "planning the planned file again changed it");
    cdp_test_run_free(&run);
    cdp_test_run_free(&again);
    cdp_planner_result_clear(&r);
    cdp_plan_free(p);
}

/* ---- sequence parallelism and interleaving in the search (docs/parallelism.md, "When the planner picks
 * sequence parallelism"; docs/planner.md) */

/* A small GPT at a fixed t = 2 on one hgx-h100, one stage and replica, no
 * recomputation; sp: the /parallel/sequence_parallel value. */
#define SP_PLAN(sp)                                                                                           \
    "{\"model\": {\"preset\": \"gpt\", \"vocab\": 1024, \"context\": 256, \"layers\": 8, \"heads\": 8, "      \
    "\"embed\": 384}, \"train\": {\"micro_batch\": 2, \"global_batch\": 8, \"precision\": \"bf16\", "          \
    "\"recompute\": \"none\", \"optimizer\": {\"type\": \"adamw\"}}, \"parallel\": {\"stages\": 1, "            \
    "\"replicas\": 1, \"micro_batches\": 4, \"tensor\": 2, \"sequence_parallel\": " sp "}, "                   \
    "\"cluster\": {\"backend\": \"cuda\", \"topology\": \"hgx-h100\"}}"

static void plan_sp(const char *text, uint64_t cap, struct cdp_planner_result *r, cdp_status want)
{
    struct cdp_plan *p = load(text);
    p->cluster.device_memory = cap;
    const cdp_status st = plan_on(p, "hgx-h100", r);
    cr_assert_eq(st, want, "%s", st ? cdp_last_error() : "planned");
    cdp_plan_free(p);
}

/* Sequence parallel, each rank keeps 1/t of the residual stream's rows: a
 * block's output, res2 and both norms' mean and 1/std ((T - T/t)(2C + 4)
 * floats a sample fewer), the embedding's output ((T - T/t) C) and the head's
 * norm statistics ((T - T/t) 2), for the one micro-batch a one-stage 1F1B
 * keeps; its collectives move what the all-reduces did, plus each backward's
 * norm-gradient sums, so the step is slower. */
Test(planner, sequence_parallel_saves_the_residual_streams_rows, .timeout = 60)
{
    struct cdp_planner_result off = {0}, on = {0};
    plan_sp(SP_PLAN("false"), 0, &off, CDP_OK);
    plan_sp(SP_PLAN("true"), 0, &on, CDP_OK);
    cr_assert(!off.sequence_parallel && on.sequence_parallel);
    const double T = 256, t = 2, C = 384, L = 8, B = 2;
    const double saved = B * 4 * (T - T / t) * (L * (2 * C + 4) + C + 2);
    for (int i = 0; i < 2; i++) {
        const struct cdp_rank_memory *a = &off.layout->rank[i].memory, *b = &on.layout->rank[i].memory;
        cr_expect_eq((double)a->activations - (double)b->activations, saved, "rank %d: %llu - %llu, expected %.0f",
                     i, (unsigned long long)a->activations, (unsigned long long)b->activations, saved);
        cr_expect_lt(b->device, a->device);
        cr_expect_eq(a->params, b->params);
    }
    /* the same bytes on the links, and the norms' gradient sums on top (at this size their latency shows) */
    cr_expect_gt(on.predicted.step_s, off.predicted.step_s);
    cdp_planner_result_clear(&off);
    cdp_planner_result_clear(&on);
}

/* The collectives of a sequence-parallel unit: reduce-scatters and
 * all-gathers of the whole [B, T, C], each half an all-reduce; a block runs
 * four forward and four backward, two more under selective recomputation
 * (the norms' outputs gathered again) and four more under full. */
Test(planner, sequence_parallel_collectives_are_reduce_scatters_and_all_gathers)
{
    struct cdp_plan *p = load(SP_PLAN("true"));
    struct cdp_unit *u = NULL;
    int n = 0;
    cr_assert_eq(cdp_units_build_tensor(&p->model, 4, 0, &u, &n), CDP_OK);
    cr_assert(u[1].seq_parallel);
    const double bw = 1e11, lat = 2e-6, bytes = 2.0 * 256 * 384 * cdp_cost_act_elem_bytes(p);
    int f, b;
    const double one = cdp_planner_tensor_collective_s(p, 4, bw, lat, &u[1], &f, &b);
    cr_expect(fabs(one - (3.0 / 4 * bytes / bw + 3 * lat)) < 1e-12 * one, "%g", one);
    cr_expect(f == 4 && b == 4, "%d %d", f, b);
    cdp_unit_set_recompute(&u[1], CDP_RECOMPUTE_SELECTIVE);
    cdp_planner_tensor_collective_s(p, 4, bw, lat, &u[1], &f, &b);
    cr_expect(f == 4 && b == 6, "%d %d", f, b);
    cdp_unit_set_recompute(&u[1], CDP_RECOMPUTE_FULL);
    cdp_planner_tensor_collective_s(p, 4, bw, lat, &u[1], &f, &b);
    cr_expect(f == 4 && b == 8, "%d %d", f, b);
    cdp_planner_tensor_collective_s(p, 4, bw, lat, &u[0], &f, &b);
    cr_expect(f == 1 && b == 1, "embedding %d %d", f, b);
    cdp_planner_tensor_collective_s(p, 4, bw, lat, &u[n - 1], &f, &b);
    cr_expect(f == 1 && b == 1, "head %d %d", f, b);
    free(u);
    cdp_plan_free(p);
}

/* "auto" plans t = 2 with and without sequence parallelism: without a cap
 * it only costs, and is not chosen; under a cap between the two layouts'
 * memory it is what fits, and is chosen; the runners-up table and --json
 * show both rows, and the plan written back says which. */
Test(planner, sequence_parallel_auto_where_memory_needs_it, .timeout = 120)
{
    struct cdp_planner_result off = {0}, on = {0}, r = {0};
    plan_sp(SP_PLAN("false"), 0, &off, CDP_OK);
    plan_sp(SP_PLAN("true"), 0, &on, CDP_OK);
    const uint64_t a = off.layout->rank[0].memory.device, b = on.layout->rank[0].memory.device;
    cr_assert_lt(b, a);
    plan_sp(SP_PLAN("\"auto\""), 0, &r, CDP_OK);
    cr_expect(!r.sequence_parallel, "chosen though it only costs");
    cr_expect_eq(r.n_tensor_alt, 2);
    cr_expect_eq(r.predicted.step_s, off.predicted.step_s);
    cdp_planner_result_clear(&r);
    plan_sp(SP_PLAN("false"), (a + b) / 2, &r, CDP_ERR_INVALID);
    plan_sp(SP_PLAN("\"auto\""), (a + b) / 2, &r, CDP_OK);
    cr_expect(r.sequence_parallel, "not chosen where only it fits");
    cr_expect_eq(r.layout->rank[0].memory.device, b);
    cr_assert_eq(r.n_tensor_alt, 2);
    cr_expect(r.tensor_alt[0].ok != r.tensor_alt[1].ok);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert(f);
    cdp_planner_print(&r, f);
    fclose(f);
    cr_expect(strstr(text, "x tensor 2 sequence parallel"), "%s", text);
    cr_expect(strstr(text, "  2  on  "), "%s", text);
    cr_expect(strstr(text, "  2  off  no plan: "), "%s", text);
    free(text);
    json_t *j = cdp_planner_to_json(&r), *tried = json_object_get(json_object_get(j, "tensor_search"), "tried");
    cr_assert_eq(json_array_size(tried), 2);
    int marked = 0;
    for (size_t i = 0; i < 2; i++) {
        json_t *x = json_array_get(tried, i);
        if (json_is_true(json_object_get(x, "chosen"))) {
            marked++;
            cr_expect(json_is_true(json_object_get(x, "sequence_parallel")));
        }
    }
    cr_expect_eq(marked, 1);
    json_decref(j);
    /* written back: the plan runs sequence parallel, as planned */
    struct cdp_plan *p = load(SP_PLAN("\"auto\""));
    cr_assert_eq(cdp_planner_apply(&r, p), CDP_OK);
    cr_expect(p->parallel.sequence_parallel && !p->parallel.sequence_parallel_auto && p->model.seq_parallel);
    char *json = NULL;
    cr_assert_eq(cdp_plan_to_json(p, &json), CDP_OK);
    cr_expect(strstr(json, "\"sequence_parallel\": true"), "%s", json);
    free(json);
    cdp_plan_free(p);
    cdp_planner_result_clear(&r);
    cdp_planner_result_clear(&off);
    cdp_planner_result_clear(&on);
}

/* true at tensor "auto": every t above 1 the search tries runs sequence
 * parallel, t = 1 without it. */
Test(planner, sequence_parallel_true_at_tensor_auto_applies_to_every_t, .timeout = 120)
{
    struct cdp_plan *p = load(TENSOR_GPT("8", "cuda", ", \"sequence_parallel\": true"));
    struct cdp_planner_result r = {0};
    cr_assert_eq(plan_on(p, "hgx-h100", &r), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(r.n_tensor_alt, 4);
    for (int i = 0; i < r.n_tensor_alt; i++)
        cr_expect_eq(r.tensor_alt[i].sequence_parallel, r.tensor_alt[i].tensor > 1, "t = %d",
                     r.tensor_alt[i].tensor);
    cr_expect_eq(r.sequence_parallel, r.layout->tensor > 1);
    cdp_planner_result_clear(&r);
    cdp_plan_free(p);
}

/* "auto" schedule: the table's five kinds and interleaved at 2, 3 and 4
 * chunks a rank, where its rules allow (stages x chunks at most the units,
 * micro-batches a multiple of the stages); the fastest simulated is kept, so
 * no fixed interleaved plan of the same shape is predicted faster. */
#define INTERLEAVE_AUTO(layers, stages, mb, sched)                                                                  \
    "{\"model\": {\"preset\": \"gpt\", \"vocab\": 1024, \"context\": 256, \"layers\": " layers ", \"heads\": 8, " \
    "\"embed\": 384}, \"train\": {\"micro_batch\": 2, \"precision\": \"bf16\", \"recompute\": \"none\", "        \
    "\"optimizer\": {\"type\": \"adamw\"}}, \"parallel\": {\"stages\": " stages ", \"replicas\": 1, "              \
    "\"micro_batches\": " mb ", \"schedule\": " sched "}, \"cluster\": {\"backend\": \"cuda\", \"topology\": "    \
    "\"hgx-h100\"}}"

Test(planner, auto_schedule_tries_interleaved_where_it_runs, .timeout = 120)
{
    static const struct {
        const char *plan;
        int shapes;
    } cases[] = {
        {INTERLEAVE_AUTO("16", "4", "8", "\"auto\""), 8},  /* 5 kinds + interleaved x 2, 3, 4 */
        {INTERLEAVE_AUTO("4", "2", "4", "\"auto\""), 7},   /* 6 units: 2 x 4 chunks do not fit */
        {INTERLEAVE_AUTO("1", "2", "4", "\"auto\""), 4},   /* 3 units: neither interleaved nor zbv */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct cdp_plan *p = load(cases[i].plan);
        struct cdp_planner_result r = {0};
        cr_assert_eq(plan_on(p, "hgx-h100", &r), CDP_OK, "%s", cdp_last_error());
        cr_expect_eq(r.shapes, cases[i].shapes, "case %zu", i);
        cdp_planner_result_clear(&r);
        cdp_plan_free(p);
    }
    struct cdp_plan *p = load(cases[0].plan);
    struct cdp_planner_result best = {0};
    cr_assert_eq(plan_on(p, "hgx-h100", &best), CDP_OK, "%s", cdp_last_error());
    cdp_plan_free(p);
    static const char *const fixed[] = {
        INTERLEAVE_AUTO("16", "4", "8", "\"interleaved\", \"chunks\": 2"),
        INTERLEAVE_AUTO("16", "4", "8", "\"interleaved\", \"chunks\": 3"),
        INTERLEAVE_AUTO("16", "4", "8", "\"interleaved\", \"chunks\": 4"),
    };
    for (int v = 0; v < 3; v++) {
        struct cdp_planner_result r = {0};
        p = load(fixed[v]);
        cr_assert_eq(plan_on(p, "hgx-h100", &r), CDP_OK, "%s", cdp_last_error());
        cr_expect_eq(r.layout->chunks, v + 2);
        cr_expect_geq(r.predicted.step_s, best.predicted.step_s, "interleaved x %d beats \"auto\"'s %s", v + 2,
                      cdp_schedule_name(best.layout->schedule));
        cdp_planner_result_clear(&r);
        cdp_plan_free(p);
    }
    cdp_planner_result_clear(&best);
}

/* /parallel/comm_dtype: bf16 puts 2 bytes an element on the wire. A tensor
 * group's all-reduce of a block moves half the bytes (its latency terms
 * unchanged); the data-parallel collective at the step's end moves half at
 * ZeRO 0, three quarters at ZeRO-1 (its parameter all-gather stays fp32) and
 * all at ZeRO-2 (only the all-gather is left then); and the planner's
 * prediction of one fixed layout (t 2, 4 replicas, no buckets, so that the
 * reduction follows the last backward) shrinks with each kind of collective
 * sent as bf16. */
#define COMM_GPT(cd)                                                                                           \
    "{\"model\": {\"preset\": \"gpt\", \"vocab\": 1024, \"context\": 256, \"layers\": 8, \"heads\": 8, "      \
    "\"embed\": 384}, \"train\": {\"micro_batch\": 2, \"global_batch\": 32, \"precision\": \"bf16\", "        \
    "\"optimizer\": {\"type\": \"adamw\"}}, \"parallel\": {\"stages\": 1, \"replicas\": 4, \"tensor\": 2, "    \
    "\"micro_batches\": 4, \"bucket_mb\": 0, \"comm_dtype\": " cd "}, \"cluster\": {\"backend\": \"cuda\", "  \
    "\"topology\": \"hgx-h100\"}}"

Test(planner, comm_dtype_bf16_predicts_less_communication)
{
    struct cdp_plan *p32 = load(COMM_GPT("\"fp32\"")), *p16 = load(COMM_GPT("\"bf16\""));
    struct cdp_unit *u = NULL;
    int n = 0, f, b;
    cr_assert_eq(cdp_units_build(&p32->model, &u, &n), CDP_OK);
    const double bw = 1e11, lat = 2e-6, bytes = 2.0 * 256 * 384 * 4;
    const double t32 = cdp_planner_tensor_collective_s(p32, 4, bw, lat, &u[1], &f, &b);
    const double t16 = cdp_planner_tensor_collective_s(p16, 4, bw, lat, &u[1], &f, &b);
    free(u);
    cr_expect(fabs(t32 - (1.5 * bytes / bw + 6 * lat)) < 1e-12 * t32, "fp32 %g", t32);
    cr_expect(fabs(t16 - (1.5 * bytes / 2 / bw + 6 * lat)) < 1e-12 * t16, "bf16 %g", t16);
    cr_expect_eq(cdp_sim_step_collective_bytes(1000, 0, 0.5), 500);
    cr_expect_eq(cdp_sim_step_collective_bytes(1000, 1, 0.5), 750);
    cr_expect_eq(cdp_sim_step_collective_bytes(1000, 2, 0.5), 1000);
    cr_expect_eq(cdp_sim_step_collective_bytes(1000, 0, 0), 1000, "0: as fp32");
    double step[3];
    const char *cds[3] = {"\"fp32\"", "{\"tensor\": \"bf16\"}", "\"bf16\""};
    for (int i = 0; i < 3; i++) {
        struct cdp_plan *p = load(i == 0 ? COMM_GPT("\"fp32\"") : i == 1 ? COMM_GPT("{\"tensor\": \"bf16\"}")
                                                                         : COMM_GPT("\"bf16\""));
        struct cdp_planner_result r = {0};
        cr_assert_eq(plan_on(p, "hgx-h100", &r), CDP_OK, "%s", cdp_last_error());
        cr_assert(r.predicted_ok && r.layout->tensor == 2 && r.layout->replicas == 4);
        step[i] = r.predicted.step_s;
        cr_log_info("comm_dtype %s: predicted step %.4f ms", cds[i], 1e3 * step[i]);
        cdp_planner_result_clear(&r);
        cdp_plan_free(p);
    }
    cr_expect_lt(step[1], step[0], "tensor collectives in bf16: %.6g ms, fp32 %.6g ms", 1e3 * step[1], 1e3 * step[0]);
    cr_expect_lt(step[2], step[1], "and the gradients: %.6g ms, tensor only %.6g ms", 1e3 * step[2], 1e3 * step[1]);
    cdp_plan_free(p32);
    cdp_plan_free(p16);
}

/* The search checks a shape's memory (builds its lists) only when its bound
 * could still win: the plan, every simulation and every t's row are those of
 * checking every shape first (CDP_PLANNER_CHECK_EVERY_SHAPE), on plans where
 * recomputation, ZeRO, the schedule, t and sequence parallelism are all
 * "auto" and the device cap leaves some shapes out; and where nothing fits,
 * the message is the same. */
#define EVERY_SHAPE(layers, gb, tensor, cap)                                                                        \
    "{\"model\": {\"preset\": \"gpt\", \"vocab\": 1024, \"context\": 256, \"layers\": " layers ", \"heads\": 8, " \
    "\"embed\": 384}, \"train\": {\"micro_batch\": 2" gb ", \"precision\": \"bf16\", \"recompute\": \"auto\", "   \
    "\"optimizer\": {\"type\": \"adamw\"}}, \"parallel\": {\"stages\": \"auto\", \"replicas\": \"auto\", "        \
    "\"micro_batches\": \"auto\", \"schedule\": \"auto\", \"zero\": \"auto\", \"tensor\": " tensor "}, "         \
    "\"cluster\": {\"backend\": \"cuda\", \"topology\": \"hgx-h100\", \"device_memory\": \"" cap "\"}}"

static cdp_status plan_flags(const char *text, int flags, struct cdp_planner_result *r, char *err, size_t cap)
{
    struct cdp_plan *p = load(text);
    struct cdp_topology *t = NULL;
    cr_assert_eq(cdp_topology_load("hgx-h100", NULL, &t), CDP_OK, "%s", cdp_last_error());
    const cdp_status st = cdp_planner_run(p, t, NULL, flags, r);
    snprintf(err, cap, "%s", st ? cdp_last_error() : "");
    cdp_topology_free(t);
    cdp_plan_free(p);
    return st;
}

Test(planner, bounding_shapes_first_plans_as_checking_every_shape, .timeout = 120)
{
    static const char *const plans[] = {
        EVERY_SHAPE("8", ", \"global_batch\": 64", "\"auto\", \"sequence_parallel\": \"auto\"", "160MiB"),
        EVERY_SHAPE("8", "", "1", "120MiB"),
        EVERY_SHAPE("12", ", \"global_batch\": 96", "\"auto\"", "200MiB"),
    };
    int skipped = 0, misfit = 0;
    for (size_t i = 0; i < sizeof plans / sizeof *plans; i++) {
        struct cdp_planner_result a = {0}, b = {0};
        char ea[1024], eb[1024];
        const cdp_status sa = plan_flags(plans[i], 0, &a, ea, sizeof ea),
                         sb = plan_flags(plans[i], CDP_PLANNER_CHECK_EVERY_SHAPE, &b, eb, sizeof eb);
        cr_assert_eq(sa, CDP_OK, "plan %zu: %s", i, ea);
        cr_assert_eq(sb, CDP_OK, "plan %zu: %s", i, eb);
        const struct cdp_layout *la = a.layout, *lb = b.layout;
        cr_expect_eq(la->stages, lb->stages, "plan %zu", i);
        cr_expect_eq(la->replicas, lb->replicas, "plan %zu", i);
        cr_expect_eq(la->tensor, lb->tensor, "plan %zu", i);
        cr_expect_eq(la->chunks, lb->chunks, "plan %zu", i);
        cr_expect_eq(la->micro_batches, lb->micro_batches, "plan %zu", i);
        cr_expect_eq(la->schedule, lb->schedule, "plan %zu", i);
        cr_expect_eq(la->recompute, lb->recompute, "plan %zu", i);
        cr_expect_eq(la->zero, lb->zero, "plan %zu", i);
        cr_expect_eq(a.sequence_parallel, b.sequence_parallel, "plan %zu", i);
        cr_expect_eq(a.predicted.step_s, b.predicted.step_s, "plan %zu: %.9f ms against %.9f ms", i,
                     a.predicted.step_s * 1e3, b.predicted.step_s * 1e3);
        cr_assert_eq(la->n_ranks, lb->n_ranks, "plan %zu", i);
        cr_expect_eq(memcmp(la->ranges, lb->ranges, (size_t)la->stages * la->chunks * sizeof *la->ranges), 0,
                     "plan %zu", i);
        for (int k = 0; k < la->n_ranks; k++) {
            cr_expect_eq(la->rank[k].device, lb->rank[k].device, "plan %zu rank %d", i, k);
            cr_expect_eq(la->rank[k].memory.device, lb->rank[k].memory.device, "plan %zu rank %d", i, k);
        }
        cr_expect_eq(a.simulations, b.simulations, "plan %zu", i);
        cr_expect_eq(a.replica_simulations, b.replica_simulations, "plan %zu", i);
        cr_expect_eq(a.placed_shapes, b.placed_shapes, "plan %zu", i);
        cr_expect_eq(a.shapes, b.shapes, "plan %zu", i);
        cr_assert_eq(a.n_tensor_alt, b.n_tensor_alt, "plan %zu", i);
        for (int k = 0; k < a.n_tensor_alt; k++) {
            const struct cdp_planner_tensor_alt *x = &a.tensor_alt[k], *y = &b.tensor_alt[k];
            cr_expect_eq(x->ok, y->ok, "plan %zu t %d", i, x->tensor);
            cr_expect_eq(x->step_s, y->step_s, "plan %zu t %d", i, x->tensor);
            cr_expect_eq(x->stages * 1000 + x->micro_batches, y->stages * 1000 + y->micro_batches, "plan %zu t %d",
                         i, x->tensor);
            cr_expect_str_eq(x->why, y->why, "plan %zu t %d", i, x->tensor);
        }
        /* every shape checked: the counts of before; bounded first: fewer checked, the same simulated */
        cr_expect_eq(b.checked, b.shapes, "plan %zu", i);
        cr_expect_leq(a.checked, b.checked, "plan %zu", i);
        cr_expect_leq(a.feasible, b.feasible, "plan %zu", i);
        cr_expect_eq(a.shapes - a.pruned - (a.checked - a.feasible), b.feasible - b.pruned, "plan %zu", i);
        skipped += a.checked < a.shapes;
        misfit += b.feasible < b.checked;
        cr_log_info("plan %zu: %lld shapes, checked %lld (%lld fit) against %lld (%lld fit), %d x %d x t %d, %s",
                    i, (long long)a.shapes, (long long)a.checked, (long long)a.feasible, (long long)b.checked,
                    (long long)b.feasible, la->stages, la->replicas, la->tensor, cdp_schedule_name(la->schedule));
        cdp_planner_result_clear(&a);
        cdp_planner_result_clear(&b);
    }
    cr_expect_gt(skipped, 0, "no plan left a shape unchecked: the bound saves nothing here");
    cr_expect_gt(misfit, 0, "no shape misfits: the caps test nothing");
    /* nothing fits: the same message (the last shape's why, the smallest cap) */
    struct cdp_planner_result a = {0}, b = {0};
    char ea[1024], eb[1024];
    const cdp_status sa = plan_flags(EVERY_SHAPE("8", ", \"global_batch\": 64", "1", "30MiB"), 0, &a, ea, sizeof ea),
                     sb = plan_flags(EVERY_SHAPE("8", ", \"global_batch\": 64", "1", "30MiB"),
                                     CDP_PLANNER_CHECK_EVERY_SHAPE, &b, eb, sizeof eb);
    cr_expect_eq(sa, CDP_ERR_INVALID);
    cr_expect_eq(sb, CDP_ERR_INVALID);
    cr_expect_str_eq(ea, eb);
    cr_expect(strstr(ea, "smallest device memory"), "%s", ea);
}
