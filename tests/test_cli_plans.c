/* Plans through the real binary (suite "cli"): every bad plan exits 2 with one
 * message on stderr naming the file and the JSON pointer, and nothing on stdout;
 * good plans print, and their --json output loads back to the same output. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "harness.h"

enum bad_kind {
    BAD_TEXT = 0,   /* write text as the plan */
    BAD_MISSING,    /* name a plan that does not exist */
    BAD_FOLDER,     /* name a folder as the plan */
};

struct bad_plan {
    char name[40];
    int kind;
    char text[420];
    char needle[120];  /* must appear in stderr */
    char needle2[64];  /* and this too, when not "" */
};

#define GPT "\"model\": {\"preset\": \"gpt\"}"

ParameterizedTestParameters(cli, bad_plans)
{
    static struct bad_plan cases[] = {
        {"syntax", BAD_TEXT, "{\n  \"model\": {\"preset\": \"gpt\",}\n}\n", "plan.json:2:", "'}'"},
        {"duplicate_key", BAD_TEXT, "{\n" GPT ",\n\"model\": {}}", "plan.json:3:", "duplicate"},
        {"empty_file", BAD_TEXT, "", "plan.json: empty file", ""},
        {"missing_file", BAD_MISSING, "", "plan.json: cannot read: No such file or directory", ""},
        {"folder_as_plan", BAD_FOLDER, "", "plan.json: cannot read: Is a directory", ""},
        {"top_level_array", BAD_TEXT, "[{" GPT "}]", "expected an object, got [", ""},
        {"missing_model", BAD_TEXT, "{\"train\": {}}", "/model: missing", ""},
        {"model_not_object", BAD_TEXT, "{\"model\": \"gpt\"}", "/model: expected an object, got \"gpt\"", ""},
        {"unknown_top_key", BAD_TEXT, "{" GPT ", \"trian\": {}}", "/trian: unknown key (did you mean \"train\"?)", ""},
        {"unknown_nested_key", BAD_TEXT, "{" GPT ", \"train\": {\"setps\": 5}}",
         "/train/setps: unknown key (did you mean \"steps\"?)", ""},
        {"data_not_object", BAD_TEXT, "{" GPT ", \"data\": []}", "/data: expected an object, got []", ""},
        {"train_not_object", BAD_TEXT, "{" GPT ", \"train\": 5}", "/train: expected an object, got 5", ""},
        {"parallel_not_object", BAD_TEXT, "{" GPT ", \"parallel\": \"auto\"}",
         "/parallel: expected an object, got \"auto\"", ""},
        {"cluster_not_object", BAD_TEXT, "{" GPT ", \"cluster\": null}", "/cluster: expected an object, got null", ""},
        {"output_not_object", BAD_TEXT, "{" GPT ", \"output\": true}", "/output: expected an object, got true", ""},
        {"negative_steps", BAD_TEXT, "{" GPT ", \"train\": {\"steps\": -5}}",
         "/train/steps: expected a positive integer, got -5", ""},
        {"zero_stages", BAD_TEXT, "{" GPT ", \"parallel\": {\"stages\": 0}}",
         "/parallel/stages: expected a positive integer or \"auto\", got 0", ""},
        {"float_for_int", BAD_TEXT, "{" GPT ", \"train\": {\"micro_batch\": 4.0}}",
         "/train/micro_batch: expected a positive integer, got 4.0", ""},
        {"lr_fast", BAD_TEXT, "{" GPT ", \"train\": {\"optimizer\": {\"lr\": \"fast\"}}}",
         "/train/optimizer/lr: expected a positive number, got \"fast\"", ""},
        {"schedule_typo", BAD_TEXT, "{" GPT ", \"parallel\": {\"schedule\": \"1fib\"}}",
         "/parallel/schedule: expected one of", "did you mean \"1f1b\""},
        {"unused_tensors_value", BAD_TEXT, "{\"model\": {\"preset\": \"gpt\", \"unused_tensors\": \"ignore\"}}",
         "/model/unused_tensors: expected one of", "\"warn\""},
        {"preset_unknown", BAD_TEXT, "{\"model\": {\"preset\": \"gtp2\"}}", "/model/preset", "did you mean \"gpt2\""},
        {"embed_heads", BAD_TEXT, "{\"model\": {\"preset\": \"gpt\", \"embed\": 100, \"heads\": 3}}",
         "/model/embed: 100 is not a multiple of /model/heads 3", ""},
        {"preset_and_layers", BAD_TEXT, "{\"model\": {\"preset\": \"mlp\", \"layers\": [{\"type\": \"relu\"}]}}",
         "/model/layers: a layer list and /model/preset \"mlp\"", ""},
        {"layer_missing_out", BAD_TEXT,
         "{\"model\": {\"input\": [4], \"layers\": [{\"type\": \"relu\"}, {\"type\": \"linear\"}]}}",
         "/model/layers/1/out: missing", ""},
        {"layer_unknown_type", BAD_TEXT, "{\"model\": {\"input\": [4], \"layers\": [{\"type\": \"lineer\", \"out\": 2}]}}",
         "/model/layers/0/type", "did you mean \"linear\""},
        {"layer_key_of_other_type", BAD_TEXT,
         "{\"model\": {\"input\": [4], \"layers\": [{\"type\": \"linear\", \"out\": 2}, {\"type\": \"relu\", \"out\": 3}]}}",
         "/model/layers/1/out: unknown key for a relu layer", ""},
        {"layers_not_array", BAD_TEXT, "{\"model\": {\"input\": [4], \"layers\": 3}}", "/model/layers: expected", ""},
        {"cnn_too_small", BAD_TEXT, "{\"model\": {\"preset\": \"cnn\", \"input\": [1, 4, 4], \"channels\": [2, 2, 2]}}",
         "/model/channels", "/model/input"},
        {"batch_mismatch", BAD_TEXT,
         "{" GPT ", \"train\": {\"global_batch\": 64, \"micro_batch\": 4}, \"parallel\": {\"replicas\": 2, "
         "\"micro_batches\": 4}}",
         "/train/global_batch: 64 does not equal /parallel/replicas 2 x /parallel/micro_batches 4 x "
         "/train/micro_batch 4 = 32", ""},
        {"micro_batches_not_divisible", BAD_TEXT,
         "{" GPT ", \"train\": {\"global_batch\": 10}, \"parallel\": {\"replicas\": 3}}",
         "/parallel/micro_batches: \"auto\" cannot be derived", "/parallel/replicas 3"},
        {"partition_gap", BAD_TEXT, "{" GPT ", \"parallel\": {\"stages\": 2, \"partition\": [[0, 2], [3, 6]]}}",
         "/parallel/partition/1: starts at unit 3", "contiguous"},
        {"partition_count", BAD_TEXT, "{" GPT ", \"parallel\": {\"stages\": 3, \"partition\": [[0, 2], [2, 6]]}}",
         "/parallel/partition: has 2 ranges, but /parallel/stages is 3", ""},
        {"partition_past_end", BAD_TEXT, "{" GPT ", \"parallel\": {\"stages\": 2, \"partition\": [[0, 3], [3, 7]]}}",
         "/parallel/partition/1: ends at 7, past the model's 6 units", ""},
        {"partition_short", BAD_TEXT, "{" GPT ", \"parallel\": {\"stages\": 2, \"partition\": [[0, 3], [3, 5]]}}",
         "/parallel/partition: covers units [0, 5)", ""},
        {"placement_shape", BAD_TEXT, "{" GPT ", \"parallel\": {\"stages\": 2, \"replicas\": 2, \"placement\": [[0, 1]]}}",
         "/parallel/placement: expected an array of 2 arrays", ""},
        {"placement_duplicate", BAD_TEXT,
         "{" GPT ", \"parallel\": {\"stages\": 2, \"replicas\": 2, \"placement\": [[0, 1], [1, 2]]}}",
         "/parallel/placement/1/0: device 1 is already used by stage 0 replica 1", ""},
        {"placement_typo", BAD_TEXT, "{" GPT ", \"parallel\": {\"placement\": \"orderd\"}}", "/parallel/placement",
         "did you mean \"ordered\""},
        {"interleaved_one_chunk", BAD_TEXT,
         "{" GPT ", \"parallel\": {\"stages\": 2, \"schedule\": \"interleaved\", \"chunks\": 1}}",
         "/parallel/chunks: /parallel/schedule \"interleaved\" needs at least 2", ""},
        {"interleaved_one_stage", BAD_TEXT, "{" GPT ", \"parallel\": {\"schedule\": \"interleaved\"}}",
         "/parallel/stages", "interleaved"},
        {"chunks_with_1f1b", BAD_TEXT, "{" GPT ", \"parallel\": {\"stages\": 2, \"chunks\": 2}}",
         "/parallel/chunks: 2 needs /parallel/schedule \"interleaved\"", ""},
        {"bad_size", BAD_TEXT, "{" GPT ", \"cluster\": {\"device_memory\": \"16 GB s\"}}",
         "/cluster/device_memory: expected a size", "got \"16 GB s\""},
        {"data_path_missing", BAD_TEXT, "{" GPT ", \"data\": {\"source\": \"text\", \"path\": \"nope.txt\"}}",
         "/data/path: cannot open", "No such file or directory"},
        {"idx_without_labels", BAD_TEXT, "{\"model\": {\"preset\": \"mlp\"}, \"data\": {\"source\": \"idx\", "
         "\"path\": \"data.bin\"}}", "/data/labels: missing", ""},
        {"labels_with_text", BAD_TEXT, "{" GPT ", \"data\": {\"source\": \"text\", \"path\": \"data.bin\", "
         "\"labels\": \"data.bin\"}}", "/data/labels: only /data/source \"idx\"", ""},
        {"text_small_vocab", BAD_TEXT, "{\"model\": {\"preset\": \"gpt\", \"vocab\": 100}, \"data\": {\"source\": "
         "\"text\", \"path\": \"data.bin\"}}", "/data/source", "/model/vocab"},
        {"idx_with_gpt", BAD_TEXT, "{" GPT ", \"data\": {\"source\": \"idx\", \"path\": \"data.bin\", \"labels\": "
         "\"data.bin\"}}", "/data/source: \"idx\"", ""},
        {"data_source_typo", BAD_TEXT, "{" GPT ", \"data\": {\"source\": \"txt\"}}", "/data/source",
         "did you mean \"text\""},
        {"optimizer_foreign_key", BAD_TEXT, "{" GPT ", \"train\": {\"optimizer\": {\"type\": \"adamw\", "
         "\"momentum\": 0.5}}}", "/train/optimizer/momentum", "\"adamw\""},
        {"beta_out_of_range", BAD_TEXT, "{" GPT ", \"train\": {\"optimizer\": {\"beta2\": 1.0}}}",
         "/train/optimizer/beta2: expected a number in [0, 1), got 1.0", ""},
        {"output_folder_missing", BAD_TEXT, "{" GPT ", \"output\": {\"metrics\": \"no-such-dir/m.jsonl\"}}",
         "/output/metrics: the folder", "does not exist"},
        {"checkpoint_parent_missing", BAD_TEXT, "{" GPT ", \"train\": {\"checkpoint\": {\"dir\": \"no/such/ckpt\"}}}",
         "/train/checkpoint/dir: the folder", "does not exist"},
        {"topology_missing", BAD_TEXT, "{" GPT ", \"cluster\": {\"topology\": \"dgx-h100\"}}",
         "/cluster/topology: cannot open", ""},
        {"too_many_ranks", BAD_TEXT, "{" GPT ", \"parallel\": {\"stages\": 4, \"replicas\": 2}, \"cluster\": "
         "{\"devices\": 2, \"nodes\": 2}}",
         "/parallel/stages: 4 stages x /parallel/replicas 2 = 8", "/cluster/nodes 2 x /cluster/devices 2"},
        {"cuda_without_gpu", BAD_TEXT, "{" GPT ", \"cluster\": {\"backend\": \"cuda\"}}",
         "/cluster/backend: \"cuda\" needs GPUs", "/cluster/topology"},
    };
    return cr_make_param_array(struct bad_plan, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(struct bad_plan *c, cli, bad_plans)
{
    char dir[PATH_MAX], path[PATH_MAX + 32];
    /* No GPU for the child, so "cuda without a GPU" fails the same everywhere. */
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    cdp_test_write_file(dir, "data.bin", "some bytes\n");
    snprintf(path, sizeof path, "%s/plan.json", dir);
    if (c->kind == BAD_TEXT) cdp_test_write_file(dir, "plan.json", c->text);
    if (c->kind == BAD_FOLDER) cr_assert_eq(mkdir(path, 0755), 0);

    struct cdp_run r;
    const char *argv[] = {"--plan", path, "--dry-run", NULL};
    cr_assert_eq(cdp_test_run(&r, argv), 0, "could not run the binary");
    char prefix[PATH_MAX + 64];
    snprintf(prefix, sizeof prefix, "cdphybrid: %s", path);
    cr_expect_eq(r.exit_code, 2, "[%s] exit %d, stderr: %s", c->name, r.exit_code, r.err);
    cr_expect_str_empty(r.out, "[%s] stdout not empty: %s", c->name, r.out);
    cr_expect(strncmp(r.err, prefix, strlen(prefix)) == 0, "[%s] stderr does not start with \"%s\": %s",
              c->name, prefix, r.err);
    cr_expect(strstr(r.err, c->needle) != NULL, "[%s] stderr lacks \"%s\": %s", c->name, c->needle, r.err);
    if (c->needle2[0])
        cr_expect(strstr(r.err, c->needle2) != NULL, "[%s] stderr lacks \"%s\": %s", c->name, c->needle2, r.err);
    cr_log_info("[%s] %s", c->name, r.err);
    /* One message, one line. */
    const char *nl = strchr(r.err, '\n');
    cr_expect(nl && nl[1] == '\0', "[%s] expected one line on stderr: %s", c->name, r.err);
    cdp_test_run_free(&r);
}

/* ---- good plans ----------------------------------------------------------------- */

struct good_plan {
    char rel[64];
};

ParameterizedTestParameters(cli, good_plans_json_round_trip)
{
    static struct good_plan cases[] = {
        {"examples/gpt-tiny.json"},
        {"examples/gpt2-dgx.json"},
        {"examples/mlp.json"},
        {"examples/mlp-tensor.json"},
        {"examples/gpt-tensor.json"},
        {"tests/plans/good/text-data.json"},
        {"tests/plans/good/placement-explicit.json"},
    };
    return cr_make_param_array(struct good_plan, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(struct good_plan *c, cli, good_plans_json_round_trip)
{
    char src[PATH_MAX], dir[PATH_MAX], again[PATH_MAX + 32];
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    snprintf(src, sizeof src, "%s", cdp_test_source_path(c->rel));
    struct cdp_run r1, r2;
    const char *argv1[] = {"--plan", src, "--dry-run", "--json", NULL};
    cr_assert_eq(cdp_test_run(&r1, argv1), 0);
    cr_assert_eq(r1.exit_code, 0, "%s: exit %d: %s", c->rel, r1.exit_code, r1.err);
    json_error_t err;
    json_t *j = json_loads(r1.out, 0, &err);
    cr_assert_not_null(j, "%s: stdout is not JSON (%s): %s", c->rel, err.text, r1.out);
    cr_assert(json_is_object(json_object_get(j, "model")));
    json_decref(j);

    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    snprintf(again, sizeof again, "%s", cdp_test_write_file(dir, "resolved.json", r1.out));
    const char *argv2[] = {"--plan", again, "--dry-run", "--json", NULL};
    cr_assert_eq(cdp_test_run(&r2, argv2), 0);
    cr_assert_eq(r2.exit_code, 0, "%s (again): exit %d: %s", c->rel, r2.exit_code, r2.err);
    cr_assert_str_eq(r1.out, r2.out, "%s: feeding --json output back changed it", c->rel);
    cdp_test_run_free(&r1);
    cdp_test_run_free(&r2);
}

Test(cli, demo_plan_prints_a_table)
{
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    char src[PATH_MAX];
    snprintf(src, sizeof src, "%s", cdp_test_source_path("examples/gpt-tiny.json"));
    struct cdp_run r;
    const char *argv[] = {"--plan", src, "--dry-run", NULL};
    cr_assert_eq(cdp_test_run(&r, argv), 0);
    cr_assert_eq(r.exit_code, 0, "exit %d: %s", r.exit_code, r.err);
    static const char *const want[] = {"Model", "Data", "Train", "Parallel", "Cluster", "Output",
                                       "32 = 2 replicas x 4 micro_batches x 4 micro_batch", "834,304", NULL};
    for (int i = 0; want[i]; i++) cr_expect(strstr(r.out, want[i]), "table lacks \"%s\":\n%s", want[i], r.out);
    cdp_test_run_free(&r);
}

/* examples/larger-than-device.json: the model, its optimizer state and its
 * activations on one device need several times the plan's device_memory; the
 * planner splits it into stages with recomputation and ZeRO-1, and every
 * rank's predicted memory is within the cap. */
static double max_rank_memory(const json_t *planner)
{
    double most = 0;
    const json_t *ranks = json_object_get(planner, "placement");
    for (size_t i = 0; i < json_array_size(ranks); i++) {
        const json_t *mem = json_object_get(json_array_get(ranks, i), "memory_bytes");
        cr_assert(json_is_number(mem), "rank %zu has no predicted memory", i);
        if (json_number_value(mem) > most) most = json_number_value(mem);
    }
    return most;
}

static json_t *dry_run_json(const char *plan)
{
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", plan, "--dry-run", "--json", NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s: %s", plan, r.err);
    json_error_t err;
    json_t *j = json_loads(r.out, 0, &err);
    cr_assert_not_null(j, "%s: %s", err.text, r.out);
    cdp_test_run_free(&r);
    return j;
}

Test(cli, the_larger_than_device_example_fits_by_stages_recomputation_and_zero)
{
    const char *src = cdp_test_source_path("examples/larger-than-device.json");
    json_t *j = dry_run_json(src);
    const json_t *pl = json_object_get(j, "planner");
    const char *rc = json_string_value(json_object_get(pl, "recompute"));
    cr_assert(rc && strcmp(rc, "none"), "recompute %s", rc ? rc : "(missing)");
    cr_assert_gt(json_array_size(json_object_get(pl, "stages")), 1);
    cr_assert_eq(json_integer_value(json_object_get(pl, "zero")), 1, "the planner shards the optimizer state");
    const double cap = 40.0 * 1048576, fitted = max_rank_memory(pl);
    cr_assert_leq(fitted, cap);
    /* the same model on one device, keeping everything, without a cap */
    json_error_t err;
    json_t *p = json_load_file(src, 0, &err);
    cr_assert_not_null(p, "%s", err.text);
    json_object_set_new(p, "data", json_pack("{s:s}", "source", "synthetic"));
    json_object_set_new(json_object_get(p, "train"), "recompute", json_string("none"));
    json_object_set_new(p, "parallel", json_pack("{s:i,s:i,s:i}", "stages", 1, "replicas", 1, "micro_batches", 8));
    json_object_del(json_object_get(p, "cluster"), "device_memory");
    json_object_del(p, "output");
    char *text = json_dumps(p, 0);
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    json_t *one = dry_run_json(cdp_test_write_file(dir, "one.json", text));
    const double whole = max_rank_memory(json_object_get(one, "planner"));
    cr_assert_gt(whole, 3 * cap, "one device needs %.0f bytes, the cap is %.0f", whole, cap);
    cr_log_info("one device: %.1f MiB; planned: %zu stages, recompute %s, at most %.1f MiB per rank (cap 40 MiB)",
                whole / 1048576, json_array_size(json_object_get(pl, "stages")), rc, fitted / 1048576);
    free(text);
    json_decref(p);
    json_decref(one);
    json_decref(j);
}
