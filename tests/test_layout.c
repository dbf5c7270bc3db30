/* Suite layout: the planner's layout as the executor runs it. The memory the
 * planner predicts for every rank is what the device layer's accounting
 * measures (a grid of models, schedules, stages and replicas, on the cpu
 * backend and through the stand-in CUDA module); "fits" means fits (a cap at
 * the prediction + 2% trains, one 5% below is planned around or refused with
 * the smallest cap that works); ranks sharing a host share its memory; and
 * the layout's own checks; where ranks run (a planned dgx1-v100 layout, two
 * nodes on one machine, CPU binding) and the launcher's command lines. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cdp/plan.h"
#include "cdp/planner.h"
#include "comm/comm.h"
#include "harness.h"
#include "pipeline/run/launch.h"
#include "model/layers.h"
#include "model/model.h"
#include "pipeline/layout.h"

enum { GPT = 0, MLP = 1, SPLIT = 2, VOCAB = 3, LLAMA = 4, ATT = 5 };

struct cell {
    int model, p, R, m;
    char schedule[16];
    int cuda;  /* through the stand-in CUDA module (tests/fake-cuda) */
    int steps; /* 0: one (the memory peaks while the first step sets up) */
    char recompute[12]; /* /train/recompute; "": the default (auto) */
    int zero;           /* /parallel/zero */
    int t;              /* /parallel/tensor */
};

static const char *model_json(int model)
{
    return model == GPT
               ? "\"model\": {\"preset\": \"gpt\", \"vocab\": 61, \"context\": 16, \"layers\": 6, \"heads\": 2, "
                 "\"embed\": 32}"
           : model == SPLIT /* split linears (docs/parallelism.md) */
               ? "\"model\": {\"input\": [24], \"layers\": [{\"type\": \"linear\", \"out\": 64, \"split\": "
                 "\"column\"}, {\"type\": \"relu\"}, {\"type\": \"linear\", \"out\": 48, \"split\": \"row\"}, "
                 "{\"type\": \"linear\", \"out\": 32, \"split\": \"column\"}, {\"type\": \"gelu\"}, {\"type\": "
                 "\"linear\", \"out\": 5, \"split\": \"row\"}]}"
           : model == LLAMA /* grouped-query attention, an untied head */
               ? "\"model\": {\"preset\": \"llama\", \"vocab\": 61, \"context\": 16, \"layers\": 4, \"heads\": 4, "
                 "\"kv_heads\": 2, \"dim\": 32, \"hidden\": 48}"
           : model == VOCAB /* a vocab-parallel embedding (slices padded: 61 rows) and loss-side classifier */
               ? "\"model\": {\"input\": [16], \"layers\": [{\"type\": \"embedding\", \"vocab\": 61, \"dim\": 32, "
                 "\"context\": 16}, {\"type\": \"linear\", \"out\": 64, \"split\": \"column\"}, {\"type\": "
                 "\"relu\"}, {\"type\": \"linear\", \"out\": 32, \"split\": \"row\"}, {\"type\": \"linear\", "
                 "\"out\": 61}], \"loss\": \"cross_entropy\"}"
           : model == ATT /* GPT's list types: attention split by heads between replicated layernorms */
               ? "\"model\": {\"input\": [16], \"layers\": [{\"type\": \"embedding\", \"vocab\": 61, \"dim\": 32, "
                 "\"context\": 16}, {\"type\": \"layernorm\"}, {\"type\": \"attention\", \"heads\": 4}, "
                 "{\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": 64, \"split\": \"column\"}, "
                 "{\"type\": \"gelu\"}, {\"type\": \"linear\", \"out\": 32, \"split\": \"row\"}, {\"type\": "
                 "\"linear\", \"out\": 61}], \"loss\": \"cross_entropy\"}"
               : "\"model\": {\"preset\": \"mlp\", \"input\": [24], \"hidden\": [64, 48, 32, 32], \"classes\": 5}";
}

/* A plan of the cell in dir/name.json; extra: more "cluster" keys or "". */
static const char *cell_plan(const char *dir, const char *name, const struct cell *c, const char *extra)
{
    char json[2048], file[96];
    snprintf(json, sizeof json,
             "{%s, \"data\": {\"source\": \"synthetic\", \"seed\": 5}, \"train\": {\"steps\": %d, \"micro_batch\": 3, "
             "\"optimizer\": {\"type\": \"%s\"}, \"eval_batches\": 1, \"log_every\": 1, \"timeout_s\": 60%s%s%s}, "
             "\"parallel\": {\"stages\": %d, \"replicas\": %d, \"tensor\": %d, \"micro_batches\": %d, "
             "\"schedule\": \"%s\"%s, \"zero\": %d}, "
             "\"cluster\": {\"backend\": \"%s\"%s%s}, \"output\": {\"metrics\": \"%s.jsonl\"}}",
             model_json(c->model), c->steps ? c->steps : 1, c->model == GPT || c->model == LLAMA ? "adamw" : "sgd",
             c->recompute[0] ? ", \"recompute\": \"" : "", c->recompute, c->recompute[0] ? "\"" : "", c->p, c->R, c->t > 1 ? c->t : 1, c->m,
             c->schedule,
             !strcmp(c->schedule, "interleaved") ? ", \"chunks\": 2" : "", c->zero, c->cuda ? "cuda" : "cpu",
             c->cuda ? ", \"ranks_per_device\": 8" : "", extra, name);
    snprintf(file, sizeof file, "%s.json", name);
    return cdp_test_write_file(dir, file, json);
}

/* The last record of a metrics file with a "ranks" list, parsed. */
static json_t *last_ranks(const char *path)
{
    char *text = cdp_test_read_file(path);
    cr_assert_not_null(text, "%s was not written", path);
    json_t *last = NULL;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        json_error_t e;
        json_t *j = json_loads(line, 0, &e);
        cr_assert_not_null(j, "%s: not JSON: %s", path, line);
        if (json_object_get(j, "ranks") && json_object_get(j, "step")) {
            json_decref(last);
            last = j;
        } else {
            json_decref(j);
        }
    }
    free(text);
    cr_assert_not_null(last, "%s: no record with the ranks", path);
    return last;
}

ParameterizedTestParameters(layout, measured_peak_is_the_predicted_memory)
{
    static struct cell grid[160];
    int n = 0;
    static const char *const kinds[] = {"gpipe", "1f1b", "interleaved"};
    for (int model = 0; model < 2; model++)
        for (int k = 0; k < 3; k++)
            for (int p = 1; p <= 4; p++)
                for (int R = 1; R <= 2; R++) {
                    if (k == 2 && p < 2) continue; /* interleaved needs two stages */
                    struct cell c = {model, p, R, 2 * p, "", 0, 0, "", 0, 1};
                    snprintf(c.schedule, sizeof c.schedule, "%s", kinds[k]);
                    grid[n++] = c;
                }
    /* the GPU path (device buffers the host does not see, host staging) on the stand-in */
    static const int gpu[][3] = {{1, 1, 2}, {2, 1, 4}, {2, 2, 4}, {3, 1, 6}};
    for (int model = 0; model < 2; model++)
        for (size_t i = 0; i < sizeof gpu / sizeof gpu[0]; i++)
            for (int k = 0; k < 3; k++) {
                if (k == 2 && gpu[i][0] < 2) continue;
                struct cell c = {model, gpu[i][0], gpu[i][1], gpu[i][2], "", 1, 0, "", 0, 1};
                snprintf(c.schedule, sizeof c.schedule, "%s", kinds[k]);
                grid[n++] = c;
            }
    /* recomputation: what each mode keeps, on every schedule and both paths */
    static const int rc[][4] = {{2, 2, 4, 1}, {3, 1, 6, 0}, {2, 1, 4, 2}, {2, 1, 4, 1}};
    for (int model = 0; model < 2; model++)
        for (int mode = 0; mode < 2; mode++)
            for (size_t i = 0; i < sizeof rc / sizeof rc[0]; i++) {
                struct cell c = {model, rc[i][0], rc[i][1], rc[i][2], "", i == 3, 0, "", 0, 1};
                snprintf(c.schedule, sizeof c.schedule, "%s", kinds[rc[i][3]]);
                snprintf(c.recompute, sizeof c.recompute, "%s", mode ? "full" : "selective");
                grid[n++] = c;
            }
    /* ZeRO-1 and 2: shards of 2, 3 and 4 replicas, each rank its own shard's state */
    static const int zc[][5] = {{1, 3, 3, 1, 0}, {2, 2, 4, 1, 0}, {1, 4, 4, 0, 0}, {2, 2, 4, 2, 0}, {2, 2, 4, 1, 1}};
    for (int model = 0; model < 2; model++)
        for (size_t i = 0; i < sizeof zc / sizeof zc[0]; i++) {
            for (int z = 1; z <= 2; z++) { /* ZeRO-2 also each rank's gradient shard and one unit's window */
                struct cell c = {model, zc[i][0], zc[i][1], zc[i][2], "", zc[i][4], 0, "", z, 1};
                snprintf(c.schedule, sizeof c.schedule, "%s", kinds[zc[i][3]]);
                grid[n++] = c;
            }
        }
    /* split backward: activations until W and the W-state slots, both paths,
     * with recomputation and ZeRO-2 */
    for (int model = 0; model < 2; model++) {
        grid[n++] = (struct cell){model, 2, 1, 4, "zb-h1", 0, 0, "", 0, 1};
        grid[n++] = (struct cell){model, 2, 2, 4, "zb-h2", 0, 0, "", 0, 1};
        grid[n++] = (struct cell){model, 2, 1, 4, "zbv", 0, 0, "", 0, 1};
        grid[n++] = (struct cell){model, 3, 1, 6, "zbv", 0, 0, "", 0, 1};
        grid[n++] = (struct cell){model, 2, 1, 4, "zb-h1", 1, 0, "", 0, 1};
        grid[n++] = (struct cell){model, 2, 2, 4, "zbv", 1, 0, "", 0, 1};
        grid[n++] = (struct cell){model, 2, 1, 4, "zbv", 0, 0, "full", 0, 1};
        grid[n++] = (struct cell){model, 2, 2, 4, "zb-h1", 0, 0, "", 2, 1};
    }
    /* tensor groups: each rank's slices of the split linears */
    grid[n++] = (struct cell){SPLIT, 1, 1, 2, "1f1b", 0, 0, "", 0, 2};
    grid[n++] = (struct cell){SPLIT, 2, 2, 4, "1f1b", 0, 0, "", 0, 2};
    grid[n++] = (struct cell){SPLIT, 2, 1, 4, "gpipe", 0, 0, "full", 0, 4};
    grid[n++] = (struct cell){SPLIT, 2, 1, 4, "zb-h1", 0, 0, "", 0, 2};
    grid[n++] = (struct cell){SPLIT, 1, 2, 2, "1f1b", 0, 0, "", 1, 2};
    grid[n++] = (struct cell){SPLIT, 2, 1, 4, "1f1b", 1, 0, "", 0, 2};
    grid[n++] = (struct cell){VOCAB, 2, 1, 4, "1f1b", 0, 0, "", 0, 2};
    grid[n++] = (struct cell){VOCAB, 1, 2, 2, "1f1b", 0, 0, "", 1, 4};
    /* GPT blocks split by heads, the embedding and head replicated */
    grid[n++] = (struct cell){GPT, 1, 1, 2, "1f1b", 0, 0, "", 0, 2};
    grid[n++] = (struct cell){GPT, 2, 1, 4, "zbv", 0, 0, "selective", 0, 2};
    grid[n++] = (struct cell){GPT, 2, 2, 4, "1f1b", 0, 0, "full", 1, 2};
    grid[n++] = (struct cell){GPT, 2, 1, 4, "interleaved", 0, 0, "", 0, 2};
    grid[n++] = (struct cell){GPT, 1, 1, 2, "1f1b", 1, 0, "", 0, 2};
    /* a list's attention split by heads: its qkv, attention state and W-state the rank's heads' */
    grid[n++] = (struct cell){ATT, 1, 1, 2, "1f1b", 0, 0, "", 0, 2};
    grid[n++] = (struct cell){ATT, 2, 1, 4, "zb-h1", 0, 0, "selective", 0, 2};
    grid[n++] = (struct cell){ATT, 1, 2, 2, "1f1b", 1, 0, "full", 1, 2};
    CDP_ASSERT((size_t)n <= sizeof grid / sizeof grid[0]);
    return cr_make_param_array(struct cell, grid, cdp_test_sample_cells(grid, (size_t)n, sizeof grid[0]));
}

/* Within 3% on every rank (the prediction is the allocation rule itself, so
 * the test asks for the bytes to be equal, and reports the worst error). */
ParameterizedTest(struct cell *c, layout, measured_peak_is_the_predicted_memory, .timeout = 120)
{
    if (c->p * c->R * (c->t > 1 ? c->t : 1) > 1 && !cdp_comm_have_mpi()) cr_skip_test("this build has no MPI");
    const char *fake = getenv("CDP_FAKE_CUDA_DIR");
    if (c->cuda) {
        cr_assert_not_null(fake, "CDP_FAKE_CUDA_DIR is not set (run the tests through meson test)");
        setenv("CDP_MODULE_DIR", fake, 1);
    }
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    const char *plan = cell_plan(dir, "cell", c, "");
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"-q", "--plan", plan, NULL}), 0);
    if (c->cuda) unsetenv("CDP_MODULE_DIR");
    cr_assert_eq(r.exit_code, 0, "%s %s p=%d R=%d: %s", c->model == GPT ? "gpt" : "mlp", c->schedule, c->p, c->R,
                 r.err);
    cdp_test_run_free(&r);
    snprintf(path, sizeof path, "%s/cell.jsonl", dir);
    json_t *j = last_ranks(path);
    json_t *ranks = json_object_get(j, "ranks");
    cr_assert_eq(json_array_size(ranks), (size_t)(c->p * c->R * (c->t > 1 ? c->t : 1)));
    double worst = 0;
    for (size_t i = 0; i < json_array_size(ranks); i++) {
        json_t *k = json_array_get(ranks, i);
        const double peak = json_number_value(json_object_get(k, "peak_memory_bytes"));
        const double pred = json_number_value(json_object_get(k, "predicted_memory_bytes"));
        cr_assert_gt(pred, 0, "rank %zu has a prediction", i);
        const double err = fabs(peak - pred) / pred;
        if (err > worst) worst = err;
        cr_expect_leq(err, 0.03, "%s %s p=%d R=%d%s %s rank %zu: measured %.0f, predicted %.0f bytes (%+.2f%%)",
                      c->model == GPT ? "gpt" : "mlp", c->schedule, c->p, c->R, c->cuda ? " (stand-in cuda)" : "",
                      c->recompute, i, peak, pred, 100 * (peak / pred - 1));
        cr_expect_eq(peak, pred, "%s %s p=%d R=%d rank %zu: the prediction is the allocation", c->model == GPT ? "gpt"
                     : "mlp", c->schedule, c->p, c->R, i);
    }
    cr_log_info("%s %s p=%d R=%d%s%s%s: worst memory error %.4f%%", c->model == GPT ? "gpt" : "mlp", c->schedule,
                c->p, c->R, c->cuda ? " (stand-in cuda)" : "", c->recompute[0] ? ", recompute " : "", c->recompute,
                100 * worst);
    json_decref(j);
}

/* The cell's plan with `key` (a "name": value pair) added to /parallel, run;
 * every rank's measured peak is its prediction, to the byte. */
static void peak_with_key(const struct cell *c, const char *key)
{
    if (!cdp_comm_have_mpi()) cr_skip_test("this build has no MPI");
    char dir[4096], path[4200], json[2200];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    const char *plan = cell_plan(dir, "cell", c, "");
    char *text = cdp_test_read_file(plan);
    char *z = text ? strstr(text, "\"zero\": ") : NULL;
    cr_assert(z, "%s: no zero key", plan);
    snprintf(json, sizeof json, "%.*s%s, %s", (int)(z - text), text, key, z);
    free(text);
    plan = cdp_test_write_file(dir, "cell.json", json);
    const char *fake = getenv("CDP_FAKE_CUDA_DIR");
    if (c->cuda) {
        cr_assert_not_null(fake, "CDP_FAKE_CUDA_DIR is not set (run the tests through meson test)");
        setenv("CDP_MODULE_DIR", fake, 1);
    }
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"-q", "--plan", plan, NULL}), 0);
    if (c->cuda) unsetenv("CDP_MODULE_DIR");
    cr_assert_eq(r.exit_code, 0, "%s %s p=%d R=%d%s: %s", key, c->schedule, c->p, c->R,
                 c->cuda ? " (stand-in cuda)" : "", r.err);
    cdp_test_run_free(&r);
    snprintf(path, sizeof path, "%s/cell.jsonl", dir);
    json_t *j = last_ranks(path);
    json_t *ranks = json_object_get(j, "ranks");
    cr_assert_eq(json_array_size(ranks), (size_t)(c->p * c->R * (c->t > 1 ? c->t : 1)));
    for (size_t i = 0; i < json_array_size(ranks); i++) {
        json_t *k = json_array_get(ranks, i);
        const double peak = json_number_value(json_object_get(k, "peak_memory_bytes"));
        const double pred = json_number_value(json_object_get(k, "predicted_memory_bytes"));
        cr_assert_gt(pred, 0, "rank %zu has a prediction", i);
        cr_expect_eq(peak, pred, "%s %s %s p=%d R=%d %s rank %zu: measured %.0f, predicted %.0f bytes", key,
                     c->model == LLAMA ? "llama" : "gpt", c->schedule, c->p, c->R, c->recompute, i, peak, pred);
    }
    json_decref(j);
}

/* Sequence parallelism (docs/parallelism.md): each rank's shard of the
 * residual stream, its messages and the moves' staging, as predicted, to
 * the byte. */
ParameterizedTestParameters(layout, sequence_parallel_peak_is_the_predicted_memory)
{
    static struct cell grid[5];
    int n = 0;
    grid[n++] = (struct cell){GPT, 1, 1, 2, "1f1b", 0, 0, "", 0, 2};
    grid[n++] = (struct cell){GPT, 2, 1, 4, "zbv", 0, 0, "selective", 0, 2};
    grid[n++] = (struct cell){GPT, 2, 2, 4, "1f1b", 0, 0, "full", 1, 2};
    grid[n++] = (struct cell){LLAMA, 2, 1, 4, "1f1b", 0, 0, "selective", 0, 2};
    grid[n++] = (struct cell){LLAMA, 1, 1, 2, "1f1b", 1, 0, "", 0, 2}; /* through the stand-in CUDA module */
    return cr_make_param_array(struct cell, grid, cdp_test_sample_cells(grid, (size_t)n, sizeof grid[0]));
}

ParameterizedTest(struct cell *c, layout, sequence_parallel_peak_is_the_predicted_memory, .timeout = 120)
{
    peak_with_key(c, "\"sequence_parallel\": true");
}

/* /parallel/comm_dtype "bf16" (docs/parallelism.md): the collectives pack
 * bf16 into the first half of the floats they reduce, in place, so no rank
 * allocates more than the fp32 run: still the prediction, to the byte
 * (replicas with gradient buckets and ZeRO-1; a tensor group of 2). */
ParameterizedTestParameters(layout, comm_dtype_bf16_peak_is_the_predicted_memory)
{
    static struct cell grid[4];
    int n = 0;
    grid[n++] = (struct cell){GPT, 1, 2, 2, "1f1b", 0, 0, "", 1, 1};
    grid[n++] = (struct cell){GPT, 1, 1, 2, "1f1b", 0, 0, "", 0, 2};
    return cr_make_param_array(struct cell, grid, (size_t)n);
}

ParameterizedTest(struct cell *c, layout, comm_dtype_bf16_peak_is_the_predicted_memory, .timeout = 120)
{
    peak_with_key(c, "\"comm_dtype\": \"bf16\"");
}

/* --dry-run --json's largest predicted rank memory, and the partition. */
static double planned_peak(const char *plan, char *partition, size_t cap, int *exit_code, char *err, size_t ecap)
{
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", plan, "--dry-run", "--json", NULL}), 0);
    *exit_code = r.exit_code;
    snprintf(err, ecap, "%s", r.err);
    double peak = 0;
    if (r.exit_code == 0) {
        json_error_t e;
        json_t *j = json_loads(r.out, 0, &e);
        cr_assert_not_null(j, "%s", r.out);
        json_t *mem = json_object_get(json_object_get(json_object_get(j, "planner"), "predicted"), "peak_memory_bytes");
        for (size_t i = 0; i < json_array_size(mem); i++) peak = fmax(peak, json_number_value(json_array_get(mem, i)));
        char *part = json_dumps(json_object_get(json_object_get(j, "parallel"), "partition"), JSON_COMPACT);
        snprintf(partition, cap, "%s", part ? part : "");
        free(part);
        json_decref(j);
    }
    cdp_test_run_free(&r);
    return peak;
}

static void trains(const char *plan, const char *what)
{
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"-q", "--plan", plan, NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s: %s", what, r.err);
    cdp_test_run_free(&r);
}

/* "Fits" means fits: at the predicted peak + 2% the plan trains; 5% below it
 * the planner plans another partition that fits, or refuses naming the
 * smallest cap that works, and that cap trains. (Recomputation is held at
 * none: under "auto" the planner may keep the partition and recompute, which
 * suites planner and layout check elsewhere.) */
Test(layout, fits_means_fits, .timeout = 120)
{
    if (!cdp_comm_have_mpi()) cr_skip_test("this build has no MPI");
    char dir[4096], extra[128], part[512], err[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    struct cell c = {GPT, 2, 1, 4, "1f1b", 0, 0, "none", 0, 1};
    int code;
    const double peak = planned_peak(cell_plan(dir, "free", &c, ""), part, sizeof part, &code, err, sizeof err);
    cr_assert_eq(code, 0, "%s", err);
    cr_assert_gt(peak, 0);

    snprintf(extra, sizeof extra, ", \"device_memory\": %.0f", ceil(peak * 1.02));
    const char *plan = cell_plan(dir, "above", &c, extra);
    trains(plan, "a cap 2% above the prediction");

    snprintf(extra, sizeof extra, ", \"device_memory\": %.0f", floor(peak * 0.95));
    plan = cell_plan(dir, "below", &c, extra);
    char part2[512];
    const double peak2 = planned_peak(plan, part2, sizeof part2, &code, err, sizeof err);
    if (code == 0) {
        cr_expect_leq(peak2, floor(peak * 0.95), "the layout planned under the lower cap fits it");
        cr_expect_str_neq(part2, part, "another partition: %s", part2);
        trains(plan, "the layout planned under a cap 5% below");
    } else {
        cr_assert_eq(code, 2, "%s", err);
        const char *at = strstr(err, "the smallest device memory any layout fits in is ");
        cr_assert_not_null(at, "names the smallest cap: %s", err);
        cr_log_info("refused: %s", err);
    }
    /* far below: refused, naming the smallest cap that works; which trains */
    snprintf(extra, sizeof extra, ", \"device_memory\": %.0f", floor(peak * 0.3));
    plan = cell_plan(dir, "far", &c, extra);
    planned_peak(plan, part2, sizeof part2, &code, err, sizeof err);
    cr_assert_eq(code, 2, "%s", err);
    const char *at = strstr(err, "the smallest device memory any layout fits in is ");
    cr_assert_not_null(at, "names the smallest cap: %s", err);
    /* "... fits in is 12.34 KiB (" : the planner's own figure, in bytes from --dry-run at that cap */
    double v = strtod(at + strlen("the smallest device memory any layout fits in is "), NULL);
    const char *unit = strchr(at + strlen("the smallest device memory any layout fits in is "), ' ') + 1;
    const double mul = !strncmp(unit, "GiB", 3) ? 1073741824.0 : !strncmp(unit, "MiB", 3) ? 1048576.0
                       : !strncmp(unit, "KiB", 3) ? 1024.0 : 1.0;
    snprintf(extra, sizeof extra, ", \"device_memory\": %.0f", ceil(v * mul * 1.01));
    plan = cell_plan(dir, "smallest", &c, extra);
    trains(plan, "the smallest cap the planner named");
}

/* Ranks on one host share its memory: the planner counts their sum against
 * /cluster/host_memory and refuses with the numbers, before any rank starts,
 * saying it once. */
Test(layout, ranks_on_a_host_share_its_memory)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    struct cell c = {GPT, 2, 2, 4, "1f1b", 0, 0, "", 0, 1};
    const char *plan = cell_plan(dir, "host", &c, ", \"host_memory\": \"64MiB\"");
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", plan, NULL}), 0);
    cr_assert_eq(r.exit_code, 2, "%s", r.err);
    cr_expect(strstr(r.err, "the 4 ranks on node 0 need") && strstr(r.err, "of host memory together") &&
                  strstr(r.err, "64.00 MiB") && strstr(r.err, "/cluster/host_memory"),
              "%s", r.err);
    int lines = 0;
    for (const char *e = r.err; *e; e++) lines += *e == '\n';
    cr_expect_eq(lines, 1, "said once: %s", r.err);
    cr_expect_str_empty(r.out, "nothing started: %s", r.out);
    cdp_test_run_free(&r);
    /* with room for them it plans, and --dry-run shows the node's sum */
    plan = cell_plan(dir, "host", &c, ", \"host_memory\": \"4GiB\"");
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", plan, "--dry-run", NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_expect(strstr(r.out, "Plan: host memory") && strstr(r.out, "/cluster/host_memory"), "%s", r.out);
    cdp_test_run_free(&r);
}

/* cdp_layout_check refuses layouts the executor could not run. */
Test(layout, check_names_what_is_wrong)
{
    struct cdp_layout *l = NULL;
    cr_assert_eq(cdp_layout_create(2, 1, 2, &l), CDP_OK);
    l->micro_batches = 2;
    l->micro_batch = 1;
    for (int r = 0; r < 2; r++) l->shares[r] = 2;
    l->ranges[0][0] = 0, l->ranges[0][1] = 3, l->ranges[1][0] = 3, l->ranges[1][1] = 5;
    for (int i = 0; i < 4; i++) l->rank[i] = (struct cdp_layout_rank){.stage = i % 2, .replica = i / 2};
    cr_expect_eq(cdp_layout_check(l, 5), CDP_OK, "%s", cdp_last_error());
    cr_expect_eq(cdp_layout_rank_of(l, 1, 1), 3);
    cr_expect_eq(cdp_layout_check(l, 6), CDP_ERR_INVALID);
    cr_expect(strstr(cdp_last_error(), "the model has 6"), "%s", cdp_last_error());
    l->rank[3].stage = 0;
    cr_expect_eq(cdp_layout_check(l, 5), CDP_ERR_INVALID);
    cr_expect(strstr(cdp_last_error(), "stage 0 of replica 1 runs on two ranks"), "%s", cdp_last_error());
    l->rank[3].stage = 1;
    l->shares[1] = 1;
    cr_expect_eq(cdp_layout_check(l, 5), CDP_ERR_INVALID);
    cr_expect(strstr(cdp_last_error(), "shares sum to 3"), "%s", cdp_last_error());
    l->shares[1] = 2;
    l->ranges[1][0] = 4;
    cr_expect_eq(cdp_layout_check(l, 5), CDP_ERR_INVALID);
    cr_expect(strstr(cdp_last_error(), "should start at 3"), "%s", cdp_last_error());
    cdp_layout_free(l);
    cr_expect_eq(cdp_layout_create(0, 1, 1, &l), CDP_ERR_INVALID);
}

/* What the ranks of a job compare before training (cdp_train under MPI): the
 * same for equal layouts, different for any decision, not for predictions. */
Test(layout, digest_names_every_decision)
{
    struct cdp_layout *a = NULL;
    cr_assert_eq(cdp_layout_create(2, 1, 2, &a), CDP_OK);
    a->micro_batches = 2;
    a->micro_batch = 1;
    for (int r = 0; r < 2; r++) a->shares[r] = 2;
    a->ranges[0][0] = 0, a->ranges[0][1] = 3, a->ranges[1][0] = 3, a->ranges[1][1] = 5;
    for (int i = 0; i < 4; i++) a->rank[i] = (struct cdp_layout_rank){.stage = i % 2, .replica = i / 2, .device = i};
    char h0[65], h[65];
    cdp_layout_digest(a, h0);
    cr_assert_eq(strlen(h0), 64);
    a->rank[2].memory.device = 12345; /* a prediction, not a decision */
    snprintf(a->rank[1].cpuset, sizeof a->rank[1].cpuset, "0-3");
    cdp_layout_digest(a, h);
    cr_expect_str_eq(h, h0);
#define CHANGES(stmt, undo)                                                     \
    do {                                                                        \
        stmt;                                                                   \
        cdp_layout_digest(a, h);                                                \
        cr_expect_str_neq(h, h0, "%s does not change the digest", #stmt);     \
        undo;                                                                   \
    } while (0)
    CHANGES(a->shares[1] = 3, a->shares[1] = 2);
    CHANGES(a->ranges[0][1] = 2, a->ranges[0][1] = 3);
    CHANGES(a->rank[3].device = 7, a->rank[3].device = 3);
    CHANGES(a->micro_batches = 4, a->micro_batches = 2);
    const enum cdp_schedule_kind k0 = a->schedule;
    CHANGES(a->schedule = k0 == CDP_SCHEDULE_1F1B ? CDP_SCHEDULE_GPIPE : CDP_SCHEDULE_1F1B, a->schedule = k0);
    CHANGES(a->zero = 1, a->zero = 0);
#undef CHANGES
    cdp_layout_digest(a, h);
    cr_expect_str_eq(h, h0, "every change undone");
    cdp_layout_free(a);
}

/* Slots: what the schedule holds in flight (1F1B p - s, GPipe m), and with
 * rebalancing the most micro-batches a replica may be given. */
Test(layout, slots_follow_the_schedule)
{
    struct cdp_plan *plan = NULL;
    cr_assert_eq(cdp_plan_load_string("{\"model\": {\"preset\": \"gpt\"}}", "t.json", NULL, &plan), CDP_OK);
    struct cdp_layout *l = NULL;
    cr_assert_eq(cdp_layout_create(4, 1, 2, &l), CDP_OK);
    l->micro_batches = 8;
    l->shares[0] = l->shares[1] = 8;
    l->schedule = CDP_SCHEDULE_1F1B;
    int mcap, slots[4];
    cr_assert_eq(cdp_layout_slots(l, 0, &mcap, slots), CDP_OK, "%s", cdp_last_error());
    for (int s = 0; s < 4; s++) cr_expect_eq(slots[s], 4 - s);
    cr_expect_eq(mcap, 8);
    l->schedule = CDP_SCHEDULE_GPIPE;
    cr_assert_eq(cdp_layout_slots(l, 1, &mcap, slots), CDP_OK);
    cr_expect_eq(slots[2], 8);
    l->rebalance_every = 10;
    cr_assert_eq(cdp_layout_slots(l, 1, &mcap, slots), CDP_OK);
    cr_expect_eq(mcap, 15, "all but one of the other replica's 8");
    cr_expect_eq(slots[2], 15);
    cdp_layout_free(l);
    cdp_plan_free(plan);
}

/* Split backward: W-state slots are the schedule's W-pending peak (zb-h1:
 * s + 1, zbv: the V's), activation slots count until the W (zb-h1: p on every
 * stage), and the chunk's memory holds wslots x the range's W-state bytes,
 * counted with its activations. */
Test(layout, split_backward_memory_counts_the_w_states)
{
    struct cdp_plan *plan = NULL;
    cr_assert_eq(cdp_plan_load_string("{\"model\": {\"preset\": \"gpt\"}}", "t.json", NULL, &plan), CDP_OK);
    struct cdp_layout *l = NULL;
    cr_assert_eq(cdp_layout_create(4, 1, 1, &l), CDP_OK);
    l->micro_batches = 8;
    l->shares[0] = 8;
    l->schedule = CDP_SCHEDULE_ZB_H1;
    int mcap, slots[4], wslots[4];
    cr_assert_eq(cdp_layout_slots_ex(l, 0, &mcap, slots, wslots), CDP_OK, "%s", cdp_last_error());
    for (int s = 0; s < 4; s++) {
        cr_expect_eq(slots[s], 4, "stage %d", s);
        cr_expect_eq(wslots[s], s + 1, "stage %d", s);
    }
    l->schedule = CDP_SCHEDULE_1F1B;
    cr_assert_eq(cdp_layout_slots_ex(l, 0, &mcap, slots, wslots), CDP_OK);
    for (int s = 0; s < 4; s++) cr_expect_eq(wslots[s], 0);
    cdp_layout_free(l);

    /* one chunk of the GPT's units 1..3: 3 W-states more, 3 x their bytes more */
    struct cdp_unit *u = NULL;
    int n = 0;
    cr_assert_eq(cdp_units_build(&plan->model, &u, &n), CDP_OK, "%s", cdp_last_error());
    struct cdp_range_terms t = {0};
    struct cdp_unit_bytes ub, u0, ul;
    uint64_t wsum = 0;
    for (int i = 1; i < 4; i++) {
        cdp_unit_bytes(&u[i], 2, cdp_model_loss_of(&plan->model), &ub);
        cdp_range_terms_add(&t, &ub);
        wsum += ub.wstate_bytes;
        if (i == 1) u0 = ub;
        ul = ub;
    }
    cr_assert_gt(wsum, 0, "a transformer block keeps a W-state");
    struct cdp_rank_memory m0, m3;
    cdp_layout_chunk_memory(plan, &t, 0, &u0, &ul, 0, 1, 4, 2, wsum, 0, 1, 0, 1, 0, &m0);
    cdp_layout_chunk_memory(plan, &t, 0, &u0, &ul, 0, 1, 4, 2, wsum, 3, 1, 0, 1, 0, &m3);
    cr_expect_eq(m3.activations - m0.activations, 3 * wsum);
    cr_expect_eq(m3.device - m0.device, 3 * wsum);
    cr_expect_eq(m3.params, m0.params);
    free(u);
    cdp_plan_free(plan);
}

/* The "planner"/"placement" list of a JSON plan (planned.json, --dry-run
 * --json), as text. */
static char *placement_of(const char *json_text)
{
    json_error_t e;
    json_t *j = json_loads(json_text, 0, &e);
    cr_assert_not_null(j, "not JSON: %s", json_text);
    char *p = json_dumps(json_object_get(json_object_get(j, "planner"), "placement"), JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(j);
    cr_assert_not_null(p);
    return p;
}

/* The losses of a metrics file's step records. */
static int losses_of(const char *path, double *out, int cap)
{
    char *text = cdp_test_read_file(path);
    cr_assert_not_null(text, "%s was not written", path);
    int n = 0;
    for (char *c = strstr(text, "\"loss\": "); c && n < cap; c = strstr(c + 1, "\"loss\": ")) out[n++] = strtod(c + 8, NULL);
    free(text);
    return n;
}

/* The "done when": a plan that leaves stages, replicas,
 * micro-batches, partition and placement to the planner, on a named GPU
 * topology, trains on the cpu backend with one command; planned.json is the
 * --dry-run --json output, training it reproduces it, metrics give every
 * rank's (stage, replica, device) as planned, and the losses are the one-rank
 * run's. */
Test(layout, a_planned_dgx1_layout_trains_as_planned, .timeout = 120)
{
    if (!cdp_comm_have_mpi()) cr_skip_test("this build has no MPI");
    char dir[4096], path[4200], again[4200];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    static const char *const fmt =
        "{%s, \"data\": {\"source\": \"synthetic\", \"seed\": 5}, \"train\": {\"steps\": 3, \"global_batch\": 24, "
        "\"micro_batch\": 3, \"eval_batches\": 1, \"timeout_s\": 60}, %s \"cluster\": {\"backend\": \"cpu\", "
        "\"topology\": \"dgx1-v100\"}, \"output\": {\"metrics\": \"%s.jsonl\"}}";
    char json[2048];
    snprintf(json, sizeof json, fmt, model_json(GPT),
             "\"parallel\": {\"stages\": \"auto\", \"replicas\": \"auto\", \"micro_batches\": \"auto\", "
             "\"partition\": \"auto\", \"placement\": \"topology\"},", "auto");
    const char *plan = cdp_test_write_file(dir, "auto.json", json);
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", plan, "--dry-run", "--json", NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    char *dry = strdup(r.out);
    cdp_test_run_free(&r);
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", plan, NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_expect(strstr(r.out, "plan: ") && strstr(r.out, "on dgx1-v100"), "the layout is printed: %s", r.out);
    cdp_test_run_free(&r);
    snprintf(path, sizeof path, "%s/planned.json", dir);
    char *planned = cdp_test_read_file(path);
    cr_assert_not_null(planned, "planned.json is written beside the metrics");
    cr_expect_str_eq(planned, dry, "planned.json is the --dry-run --json output");
    /* training the planned file plans the same layout */
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", path, "--dry-run", "--json", NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    char *p1 = placement_of(planned), *p2 = placement_of(r.out);
    cr_expect_str_eq(p1, p2, "the planned file plans to the same layout");
    cdp_test_run_free(&r);

    /* metrics: the layout first, then each rank's place as planned */
    snprintf(path, sizeof path, "%s/auto.jsonl", dir);
    json_t *last = last_ranks(path);
    json_error_t e;
    json_t *pj = json_loads(planned, 0, &e), *pl = json_object_get(json_object_get(pj, "planner"), "placement");
    json_t *ranks = json_object_get(last, "ranks");
    cr_assert_eq(json_array_size(ranks), json_array_size(pl));
    cr_assert_gt(json_array_size(pl), 1, "the planner uses several of the 8 GPUs: %s", p1);
    for (size_t i = 0; i < json_array_size(pl); i++) {
        json_t *a = json_array_get(pl, i), *b = json_array_get(ranks, i);
        for (const char *const *k = (const char *const[]){"stage", "replica", "device", "node", NULL}; *k; k++)
            cr_expect_eq(json_integer_value(json_object_get(a, *k)), json_integer_value(json_object_get(b, *k)),
                         "rank %zu: %s", i, *k);
    }
    double la[8], lb[8];
    const int n = losses_of(path, la, 8);
    cr_assert_eq(n, 3);
    json_decref(pj);
    json_decref(last);
    /* the same samples on one rank give the same losses */
    snprintf(json, sizeof json, fmt, model_json(GPT), "", "one");
    plan = cdp_test_write_file(dir, "one.json", json);
    trains(plan, "one rank");
    snprintf(again, sizeof again, "%s/one.jsonl", dir);
    cr_assert_eq(losses_of(again, lb, 8), 3);
    for (int i = 0; i < 3; i++)
        cr_expect_float_eq(la[i], lb[i], 1e-5 * fabs(lb[i]), "step %d: %.9g planned, %.9g one rank", i + 1, la[i], lb[i]);
    free(p1);
    free(p2);
    free(planned);
    free(dry);
}

/* Two nodes of two ranks on this machine: a hostfile of two made-up hosts,
 * started through Open MPI's rsh launcher with a stand-in ssh, so each "node"
 * has its own daemon and its own local ranks. Ranks run on the layout's nodes
 * and the result is one rank's. */
Test(layout, a_two_node_layout_trains_on_its_nodes, .timeout = 120)
{
    if (!cdp_comm_have_mpi()) cr_skip_test("this build has no MPI");
    char dir[4096], path[4200], agent[4200];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    snprintf(agent, sizeof agent, "%s", cdp_test_source_path("tests/fixtures/fake-ssh"));
    const char *hosts = cdp_test_write_file(dir, "hosts", "node-a\nnode-b   # the second node\n");
    char hostpath[4200];
    snprintf(hostpath, sizeof hostpath, "%s", hosts);
    struct cell c = {GPT, 2, 2, 4, "1f1b", 0, 2, "", 0, 1};
    char plan[4200];
    snprintf(plan, sizeof plan, "%s", cell_plan(dir, "two", &c, ", \"nodes\": 2"));
    setenv("OMPI_MCA_plm_rsh_agent", agent, 1);
    setenv("OMPI_MCA_btl", "self,tcp", 1); /* the nodes share no memory segment */
    setenv("CDP_FAKE_SSH_TMP", dir, 1);     /* each "node" its own session folder */
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", plan, "--hostfile", hostpath, NULL}), 0);
    unsetenv("OMPI_MCA_plm_rsh_agent");
    unsetenv("OMPI_MCA_btl");
    unsetenv("CDP_FAKE_SSH_TMP");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cdp_test_run_free(&r);
    snprintf(path, sizeof path, "%s/two.jsonl", dir);
    json_t *last = last_ranks(path), *ranks = json_object_get(last, "ranks");
    cr_assert_eq(json_array_size(ranks), 4);
    for (size_t i = 0; i < 4; i++)
        cr_expect_eq(json_integer_value(json_object_get(json_array_get(ranks, i), "node")), (json_int_t)(i / 2),
                     "rank %zu on node %zu", i, i / 2);
    json_decref(last);
    double la[4], lb[4];
    cr_assert_eq(losses_of(path, la, 4), 2);
    struct cell one = {GPT, 1, 1, 8, "1f1b", 0, 2, "", 0, 1};
    trains(cell_plan(dir, "one", &one, ""), "one rank");
    snprintf(path, sizeof path, "%s/one.jsonl", dir);
    cr_assert_eq(losses_of(path, lb, 4), 2);
    for (int i = 0; i < 2; i++)
        cr_expect_float_eq(la[i], lb[i], 1e-5 * fabs(lb[i]), "step %d: %.9g on two nodes, %.9g on one rank", i + 1,
                           la[i], lb[i]);
    /* the hostfile must name every node of the layout */
    hosts = cdp_test_write_file(dir, "hosts", "node-a\n");
    snprintf(hostpath, sizeof hostpath, "%s", hosts);
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", plan, "--hostfile", hostpath, NULL}), 0);
    cr_expect_eq(r.exit_code, 2, "%s", r.err);
    cr_expect(strstr(r.err, "1 host for a layout of 2 nodes"), "%s", r.err);
    cdp_test_run_free(&r);
}

/* Every rank is bound where the layout says (-v shows it): on the cpu backend
 * disjoint cores while there are as many as ranks. */
Test(layout, ranks_are_bound_to_the_layout_cpus, .timeout = 60)
{
    if (!cdp_comm_have_mpi()) cr_skip_test("this build has no MPI");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    struct cell c = {MLP, 2, 1, 2, "1f1b", 0, 0, "", 0, 1};
    const char *plan = cell_plan(dir, "bind", &c, "");
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", plan, "--dry-run", "--json", NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    json_error_t e;
    json_t *j = json_loads(r.out, 0, &e), *pl = json_object_get(json_object_get(j, "planner"), "placement");
    cr_assert_eq(json_array_size(pl), 2);
    char want[2][128];
    const char *sets[2];
    for (int i = 0; i < 2; i++) {
        sets[i] = json_string_value(json_object_get(json_array_get(pl, (size_t)i), "cpuset"));
        cr_assert(sets[i] && *sets[i], "rank %d has a CPU set", i);
        snprintf(want[i], sizeof want[i], "rank %d (stage %d, replica 0) on node 0, cpu: bound to CPUs %s", i, i,
                 sets[i]);
    }
    if (sysconf(_SC_NPROCESSORS_ONLN) >= 2) cr_expect_str_neq(sets[0], sets[1], "disjoint cores");
    cdp_test_run_free(&r);
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"-v", "--plan", plan, NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    for (int i = 0; i < 2; i++) cr_expect(strstr(r.err, want[i]), "no \"%s\" in: %s", want[i], r.err);
    json_decref(j);
    cdp_test_run_free(&r);
}

/* The launcher's command lines: mpirun with the layout's nodes as a hostfile
 * of slots, srun inside a Slurm allocation; what cannot be placed is named. */
Test(layout, launch_command_lines)
{
    struct cdp_layout *l = NULL;
    cr_assert_eq(cdp_layout_create(2, 1, 2, &l), CDP_OK);
    l->n_nodes = 2;
    for (int i = 0; i < 4; i++) l->rank[i] = (struct cdp_layout_rank){.stage = i % 2, .replica = i / 2, .node = i / 2};
    char dir[4096], hosts[4200], *const args[] = {"--plan", "planned.json", NULL};
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    snprintf(hosts, sizeof hosts, "%s", cdp_test_write_file(dir, "hosts", "# two hosts\nalpha slots=8\n\nbeta\n"));
    struct cdp_launch_spec s = {.layout = l, .program = "/bin/cdphybrid", .args = args, .hostfile = hosts,
                                .tmpdir = dir};
    cr_expect_eq(cdp_launch_which(&s), CDP_LAUNCHER_MPIRUN, "a hostfile means mpirun");
    char **v = NULL;
    cr_assert_eq(cdp_launch_argv(&s, CDP_LAUNCHER_MPIRUN, &v), CDP_OK, "%s", cdp_last_error());
    char line[8192] = "";
    for (int i = 0; v[i]; i++) snprintf(line + strlen(line), sizeof line - strlen(line), "%s%s", i ? " " : "", v[i]);
    char want[8192];
    snprintf(want, sizeof want, "mpirun -np 4 --bind-to none --hostfile %s/hosts.txt --map-by slot /bin/cdphybrid "
             "--plan planned.json", dir);
    cr_expect_str_eq(line, want);
    free(v);
    char path[4200];
    snprintf(path, sizeof path, "%s/hosts.txt", dir);
    char *text = cdp_test_read_file(path);
    cr_expect_str_eq(text, "alpha slots=2 max_slots=2\nbeta slots=2 max_slots=2\n");
    free(text);
    cr_assert_eq(cdp_launch_argv(&s, CDP_LAUNCHER_SRUN, &v), CDP_OK, "%s", cdp_last_error());
    line[0] = '\0';
    for (int i = 0; v[i]; i++) snprintf(line + strlen(line), sizeof line - strlen(line), "%s%s", i ? " " : "", v[i]);
    cr_expect_str_eq(line, "srun --ntasks 4 --nodes 2 --ntasks-per-node 2 --distribution=block --cpu-bind=none "
                           "--kill-on-bad-exit=1 --overlap --mpi=pmix /bin/cdphybrid --plan planned.json");
    free(v);
    /* in an allocation: the nodes that hold ranks by name, node i the i-th of
     * the allocation (node 1 left out after a restart: not the first two) */
    setenv("SLURM_JOB_NODELIST", "n[07-09]", 1);
    l->n_nodes = 3;
    l->rank[2].node = l->rank[3].node = 2;
    cr_assert_eq(cdp_launch_argv(&s, CDP_LAUNCHER_SRUN, &v), CDP_OK, "%s", cdp_last_error());
    line[0] = '\0';
    for (int i = 0; v[i]; i++) snprintf(line + strlen(line), sizeof line - strlen(line), "%s%s", i ? " " : "", v[i]);
    cr_expect(strstr(line, " --nodes 2 --ntasks-per-node 2 --nodelist n07,n09 "), "%s", line);
    free(v);
    setenv("SLURM_JOB_NODELIST", "n07", 1);
    cr_expect_eq(cdp_launch_argv(&s, CDP_LAUNCHER_SRUN, &v), CDP_ERR_INVALID);
    cr_expect(strstr(cdp_last_error(), "the layout has 3 nodes and the Slurm allocation 1"), "%s", cdp_last_error());
    unsetenv("SLURM_JOB_NODELIST");
    l->n_nodes = 2;
    l->rank[2].node = l->rank[3].node = 1;
    /* inside a Slurm allocation with srun on PATH and no hostfile: srun */
    cdp_test_write_file(dir, "srun", "#!/bin/sh\nexit 0\n");
    snprintf(path, sizeof path, "%s/srun", dir);
    chmod(path, 0755);
    char *old_path = getenv("PATH") ? strdup(getenv("PATH")) : NULL;
    setenv("PATH", dir, 1);
    setenv("SLURM_JOB_ID", "42", 1);
    s.hostfile = NULL;
    cr_expect_eq(cdp_launch_which(&s), CDP_LAUNCHER_SRUN);
    unsetenv("SLURM_JOB_ID");
    cr_expect_eq(cdp_launch_which(&s), CDP_LAUNCHER_MPIRUN);
    if (old_path) setenv("PATH", old_path, 1);
    free(old_path);
    /* unequal nodes: srun cannot place them; mpirun without hosts for two nodes neither */
    l->rank[1].node = 0, l->rank[2].node = 0, l->rank[3].node = 1;
    cr_expect_eq(cdp_launch_argv(&s, CDP_LAUNCHER_SRUN, &v), CDP_ERR_INVALID);
    cr_expect(strstr(cdp_last_error(), "3 ranks on one node and 1 on another"), "%s", cdp_last_error());
    cr_expect_eq(cdp_launch_argv(&s, CDP_LAUNCHER_MPIRUN, &v), CDP_ERR_INVALID);
    cr_expect(strstr(cdp_last_error(), "--hostfile"), "%s", cdp_last_error());
    cdp_layout_free(l);
}

/* Slurm's host lists, as SLURM_JOB_NODELIST writes them. */
Test(layout, slurm_host_lists_are_read_in_order)
{
    char **h = NULL;
    int n = 0;
    cr_assert_eq(cdp_launch_hostlist("h[0-2],gpu07,n[01-02,10]x", &h, &n), CDP_OK, "%s", cdp_last_error());
    const char *want[] = {"h0", "h1", "h2", "gpu07", "n01x", "n02x", "n10x"};
    cr_assert_eq(n, 7);
    for (int i = 0; i < n; i++) {
        cr_expect_str_eq(h[i], want[i]);
        free(h[i]);
    }
    free(h);
    cr_expect_eq(cdp_launch_hostlist("h[0-2", &h, &n), CDP_ERR_INVALID);
    cr_expect(strstr(cdp_last_error(), "host list \"h[0-2\": a '[' without its ']'"), "%s", cdp_last_error());
    cr_expect_eq(cdp_launch_hostlist("h[3-1]", &h, &n), CDP_ERR_INVALID);
    cr_expect_eq(cdp_launch_hostlist("h[a]", &h, &n), CDP_ERR_INVALID);
    cr_expect_eq(cdp_launch_hostlist("", &h, &n), CDP_ERR_INVALID);
}

/* ---- the layout's JSON form ------------------------------------------------------- */

/* A layout's "layout" in a planned file's JSON, with one change made by edit. */
static cdp_status layout_read(json_t *j, char *err, size_t cap)
{
    struct cdp_layout *l = NULL;
    cdp_status st = cdp_layout_from_json(j, "planned.json", "/layout", &l);
    snprintf(err, cap, "%s", st ? cdp_last_error() : "");
    cdp_layout_free(l);
    return st;
}

/* cdp_layout_to_json / cdp_layout_from_json: every decision and every rank's
 * place, CPU set, cap and prediction read back as written; what is wrong is
 * named by its JSON pointer. */
Test(layout, json_round_trips_and_names_what_is_wrong)
{
    struct cdp_layout *a = NULL, *b = NULL;
    cr_assert_eq(cdp_layout_create(2, 1, 2, &a), CDP_OK);
    a->micro_batches = 2;
    a->micro_batch = 3;
    a->schedule = CDP_SCHEDULE_GPIPE;
    a->recompute = CDP_RECOMPUTE_SELECTIVE;
    a->zero = 1;
    a->rebalance_every = 5;
    a->shares[0] = 1, a->shares[1] = 3;
    a->ranges[0][0] = 0, a->ranges[0][1] = 3, a->ranges[1][0] = 3, a->ranges[1][1] = 5;
    a->schedule_file = strdup("/tmp/lists.csv");
    snprintf(a->topology, sizeof a->topology, "dgx1-v100");
    for (int i = 0; i < 4; i++)
        a->rank[i] = (struct cdp_layout_rank){.stage = i / 2, .replica = i % 2, .device = 3 - i, .gpu = i,
                                              .capacity = 1000u + (unsigned)i, .memory = {.device = 77u * i, .host = 9}};
    snprintf(a->rank[2].cpuset, sizeof a->rank[2].cpuset, "4-7,12");
    json_t *j = cdp_layout_to_json(a);
    cr_assert_not_null(j);
    cr_assert_eq(cdp_layout_from_json(j, "planned.json", "/layout", &b), CDP_OK, "%s", cdp_last_error());
    char diff[256], ha[65], hb[65];
    cr_expect_eq(cdp_layout_diff(a, b, diff, sizeof diff), 0, "%s", diff);
    cdp_layout_digest(a, ha);
    cdp_layout_digest(b, hb);
    cr_expect_str_eq(ha, hb);
    cr_expect_str_eq(b->rank[2].cpuset, "4-7,12");
    cr_expect_str_eq(b->topology, "dgx1-v100");
    cr_expect_str_eq(b->schedule_file, "/tmp/lists.csv");
    for (int i = 0; i < 4; i++) {
        cr_expect_eq(b->rank[i].capacity, a->rank[i].capacity);
        cr_expect_eq(b->rank[i].gpu, i);
        cr_expect_eq(b->rank[i].memory.device, 77u * i);
    }
    b->rank[3].device = 9;
    cr_expect_eq(cdp_layout_diff(a, b, diff, sizeof diff), 1);
    cr_expect_str_eq(diff, "/ranks/3/device: 0 here, 9 there");
    cdp_layout_free(b);

    static const struct {
        const char *pointer, *value; /* where, and the JSON written there ("" deletes it) */
        const char *said;            /* what the message must hold */
    } bad[] = {
        {"stagez", "2", "/layout/stagez: unknown key (did you mean \"stages\"?)"},
        {"version", "2", "/layout/version: version 2"},
        {"schedule", "\"1f2b\"", "/layout/schedule"},
        {"shares", "[2]", "/layout/shares: expected an array of micro-batches, one per replica: 2 entries, got 1"},
        {"ranks", "[]", "/layout/ranks: expected an array of ranks"},
        {"micro_batch", "", "/layout/micro_batch: missing"},
        {"zero", "3", "/layout/zero"},
        {"schedule_file", "\"lists.csv\"", "/layout/schedule_file: expected an absolute path"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        json_t *c = json_deep_copy(j);
        if (bad[k].value[0]) json_object_set_new(c, bad[k].pointer, json_loads(bad[k].value, JSON_DECODE_ANY, NULL));
        else json_object_del(c, bad[k].pointer);
        char err[1024];
        cr_expect_eq(layout_read(c, err, sizeof err), CDP_ERR_INVALID, "%s", bad[k].pointer);
        cr_expect(strstr(err, "planned.json: ") && strstr(err, bad[k].said), "%s: %s", bad[k].pointer, err);
        json_decref(c);
    }
    /* in a rank */
    json_t *c = json_deep_copy(j), *r1 = json_array_get(json_object_get(c, "ranks"), 1);
    json_object_set_new(r1, "stage", json_string("one"));
    char err[1024];
    cr_expect_eq(layout_read(c, err, sizeof err), CDP_ERR_INVALID);
    cr_expect(strstr(err, "/layout/ranks/1/stage: expected"), "%s", err);
    json_object_set_new(r1, "stage", json_integer(0));
    json_object_set_new(r1, "replica", json_integer(0)); /* rank 0's place */
    cr_expect_eq(layout_read(c, err, sizeof err), CDP_ERR_INVALID);
    cr_expect(strstr(err, "stage 0 of replica 0 runs on two ranks"), "%s", err);
    json_object_set_new(r1, "replica", json_integer(1));
    json_object_set_new(r1, "cpuset", json_string("0-3; rm -rf"));
    cr_expect_eq(layout_read(c, err, sizeof err), CDP_ERR_INVALID);
    cr_expect(strstr(err, "/layout/ranks/1/cpuset: expected a CPU list"), "%s", err);
    json_decref(c);
    json_decref(j);
    cdp_layout_free(a);
}

/* The tensor dimension: p x R x t ranks, each (stage, replica, tensor slice)
 * on one rank, carried through JSON, the digest and the diff; a layout
 * written without it (tensor 1) still reads. */
Test(layout, the_tensor_dimension_round_trips_and_is_checked)
{
    struct cdp_layout *a = NULL, *b = NULL;
    cr_expect_eq(cdp_layout_create_tensor(2, 1, 1, 0, &a), CDP_ERR_INVALID);
    cr_assert_eq(cdp_layout_create_tensor(2, 1, 2, 2, &a), CDP_OK);
    cr_assert_eq(a->n_ranks, 8);
    a->micro_batches = 2;
    a->micro_batch = 1;
    a->shares[0] = a->shares[1] = 2;
    a->ranges[0][0] = 0, a->ranges[0][1] = 2, a->ranges[1][0] = 2, a->ranges[1][1] = 4;
    for (int i = 0; i < 8; i++) /* tensor slices on consecutive ranks */
        a->rank[i] = (struct cdp_layout_rank){.stage = i / 4, .replica = (i / 2) % 2, .tensor = i % 2, .device = i};
    cr_assert_eq(cdp_layout_check(a, 4), CDP_OK, "%s", cdp_last_error());
    cr_expect_eq(cdp_layout_rank_at(a, 1, 0, 1), 5);
    cr_expect_eq(cdp_layout_rank_of(a, 1, 1), 6);
    cr_expect_eq(cdp_layout_tensor(a), 2);
    cr_expect_eq(cdp_layout_rank_tensor(a, 3), 1);
    json_t *j = cdp_layout_to_json(a);
    cr_assert_not_null(j);
    cr_expect_eq(json_integer_value(json_object_get(j, "tensor")), 2);
    cr_assert_eq(cdp_layout_from_json(j, "planned.json", "/layout", &b), CDP_OK, "%s", cdp_last_error());
    char diff[256], ha[65], hb[65];
    cr_expect_eq(cdp_layout_diff(a, b, diff, sizeof diff), 0, "%s", diff);
    cdp_layout_digest(a, ha);
    cdp_layout_digest(b, hb);
    cr_expect_str_eq(ha, hb);
    b->rank[5].tensor = 0;
    b->rank[4].tensor = 1;
    cr_expect_eq(cdp_layout_diff(a, b, diff, sizeof diff), 1);
    cr_expect_str_eq(diff, "/ranks/4/tensor: 0 here, 1 there");
    cdp_layout_digest(b, hb);
    cr_expect_str_neq(ha, hb);
    cdp_layout_free(b);
    /* a slice twice, a slice out of range */
    json_t *c = json_deep_copy(j), *r1 = json_array_get(json_object_get(c, "ranks"), 1);
    json_object_set_new(r1, "tensor", json_integer(0));
    char err[1024];
    cr_expect_eq(layout_read(c, err, sizeof err), CDP_ERR_INVALID);
    cr_expect(strstr(err, "stage 0 of replica 0 (one tensor slice) runs on two ranks"), "%s", err);
    json_object_set_new(r1, "tensor", json_integer(2));
    cr_expect_eq(layout_read(c, err, sizeof err), CDP_ERR_INVALID);
    cr_expect(strstr(err, "rank 1 holds tensor slice 2; the layout's tensor groups have 2"), "%s", err);
    json_decref(c);
    /* without the key: tensor 1, and then 8 ranks are too many */
    c = json_deep_copy(j);
    json_object_del(c, "tensor");
    cr_expect_eq(layout_read(c, err, sizeof err), CDP_ERR_INVALID);
    cr_expect(strstr(err, "/layout/ranks: expected an array of ranks, stages x replicas x tensor: 4 entries, got 8"),
              "%s", err);
    json_decref(c);
    json_decref(j);
    cdp_layout_free(a);
}

/* A planned file is what runs: the ranks read its "layout". Edited by hand,
 * it runs as edited when the plan agrees (a placement swapped in both
 * /parallel/placement and /layout), and is refused naming both places when
 * only one was edited. */
Test(layout, a_hand_edited_planned_file_runs_as_edited_or_is_refused, .timeout = 120)
{
    if (!cdp_comm_have_mpi()) cr_skip_test("this build has no MPI");
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    struct cell c = {GPT, 2, 2, 4, "1f1b", 0, 2, "none", 0, 1};
    const char *plan = cell_plan(dir, "edit", &c, "");
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", plan, "--dry-run", "--json", NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    json_t *j = json_loads(r.out, 0, NULL);
    cdp_test_run_free(&r);
    cr_assert_not_null(j);
    json_t *pl = json_object_get(json_object_get(j, "parallel"), "placement");
    json_t *ranks = json_object_get(json_object_get(j, "layout"), "ranks");
    cr_assert_eq(json_array_size(ranks), 4);
    /* rank 0 holds (stage 0, replica 0) and rank 2 (stage 1, replica 0): swap them in the layout only */
    int d0 = -1, d2 = -1;
    for (int i = 0; i < 4; i++) {
        json_t *k = json_array_get(ranks, (size_t)i);
        const int s = (int)json_integer_value(json_object_get(k, "stage")),
                  q = (int)json_integer_value(json_object_get(k, "replica"));
        if (s == 0 && q == 0) d0 = i;
        if (s == 1 && q == 0) d2 = i;
    }
    cr_assert(d0 >= 0 && d2 >= 0);
    json_object_set_new(json_array_get(ranks, (size_t)d0), "stage", json_integer(1));
    json_object_set_new(json_array_get(ranks, (size_t)d2), "stage", json_integer(0));
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    const char *half = cdp_test_write_file(dir, "half.json", text);
    free(text);
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", half, "--dry-run", NULL}), 0);
    cr_expect_eq(r.exit_code, 2, "%s", r.err);
    char want[128];
    snprintf(want, sizeof want, "/layout/ranks/%d (stage 1, replica 0) is on device", d0);
    cr_expect(strstr(r.err, "half.json: the layout and its plan disagree: ") && strstr(r.err, want) &&
                  strstr(r.err, "/parallel/placement/1/0 is"), "%s", r.err);
    cdp_test_run_free(&r);
    /* the same swap in the plan: it trains, every rank where the edited file puts it */
    json_t *s0 = json_array_get(pl, 0), *s1 = json_array_get(pl, 1);
    json_t *a = json_incref(json_array_get(s0, 0)), *b = json_incref(json_array_get(s1, 0));
    json_array_set_new(s0, 0, b);
    json_array_set_new(s1, 0, a);
    text = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    const char *both = cdp_test_write_file(dir, "both.json", text);
    free(text);
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"-q", "--plan", both, NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cdp_test_run_free(&r);
    snprintf(path, sizeof path, "%s/edit.jsonl", dir);
    json_t *last = last_ranks(path), *ran = json_object_get(last, "ranks");
    cr_assert_eq(json_array_size(ran), 4);
    for (size_t i = 0; i < 4; i++)
        for (const char *const *k = (const char *const[]){"stage", "replica", "device", NULL}; *k; k++)
            cr_expect_eq(json_integer_value(json_object_get(json_array_get(ran, i), *k)),
                         json_integer_value(json_object_get(json_array_get(ranks, i), *k)), "rank %zu: %s", i, *k);
    cr_expect_eq(json_integer_value(json_object_get(json_array_get(ran, (size_t)d0), "stage")), 1);
    json_decref(last);
    json_decref(j);
}

/* The API an embedding program's ranks use: the planned file's layout read
 * back (cdp_layout_load), and re-planning only as a check
 * (cdp_layout_replan_check), which names what differs. */
Test(layout, a_planned_file_loads_and_replanning_is_a_check)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    struct cell c = {MLP, 2, 1, 2, "gpipe", 0, 1, "none", 0, 1};
    char src[4200];
    snprintf(src, sizeof src, "%s", cell_plan(dir, "api", &c, ""));
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", src, "--dry-run", "--json", NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    const char *planned = cdp_test_write_file(dir, "planned.json", r.out);
    cdp_test_run_free(&r);
    struct cdp_plan *plan = NULL;
    struct cdp_layout *l = NULL;
    cr_assert_eq(cdp_plan_load(planned, &plan), CDP_OK, "%s", cdp_last_error());
    const struct cdp_machine_info none = {.gpus = 0};
    cr_assert_eq(cdp_plan_resolve(plan, &none), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_layout_load(planned, plan, &l), CDP_OK, "%s", cdp_last_error());
    cr_expect_eq(cdp_layout_stages(l), 2);
    cr_expect_eq(cdp_layout_schedule(l), CDP_SCHEDULE_GPIPE);
    cr_expect_eq(cdp_layout_replan_check(plan, NULL, l), CDP_OK, "%s", cdp_last_error());
    l->ranges[0][1]--, l->ranges[1][0]--;
    cr_expect_eq(cdp_layout_replan_check(plan, NULL, l), CDP_ERR_INVALID);
    cr_expect(strstr(cdp_last_error(), "the layout is not what its plan plans on this machine: /ranges/0: "),
              "%s", cdp_last_error());
    cdp_layout_free(l);
    /* a plan without a layout */
    cr_expect_eq(cdp_layout_load(src, plan, &l), CDP_ERR_INVALID);
    cr_expect(strstr(cdp_last_error(), "/layout: missing"), "%s", cdp_last_error());
    cdp_plan_free(plan);
}
