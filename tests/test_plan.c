/* Plan loader tests (suite "plan"): defaults, presets and their expansion, batch
 * arithmetic, resolve against a machine, sizes, paths, and the JSON round trip of
 * every example and good fixture. Bad plans through the binary: test_cli_plans.c. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <dirent.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/plan.h"
#include "harness.h"

static struct cdp_plan *load_ok(const char *json)
{
    struct cdp_plan *p = NULL;
    cdp_status st = cdp_plan_load_string(json, "t.json", NULL, &p);
    cr_assert_eq(st, CDP_OK, "plan failed to load: %s\n%s", cdp_last_error(), json);
    return p;
}

static void load_fails(const char *json, const char *needle)
{
    struct cdp_plan *p = NULL;
    cdp_status st = cdp_plan_load_string(json, "t.json", NULL, &p);
    cr_assert_neq(st, CDP_OK, "plan should not load:\n%s", json);
    cr_assert_null(p);
    cr_assert(strncmp(cdp_last_error(), "t.json", 6) == 0, "message: %s", cdp_last_error());
    cr_assert(strstr(cdp_last_error(), needle), "message \"%s\" lacks \"%s\"", cdp_last_error(), needle);
}

/* ---- round trip of every example and good fixture ----------------------------- */

static int roundtrip_folder(const char *rel)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", cdp_test_source_path(rel));
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "cannot open %s", dir);
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (len < 6 || strcmp(de->d_name + len - 5, ".json") != 0) continue;
        char path[PATH_MAX + 256];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        struct cdp_plan *p = NULL, *q = NULL;
        cr_assert_eq(cdp_plan_load(path, &p), CDP_OK, "%s: %s", path, cdp_last_error());
        char *a = NULL, *b = NULL;
        cr_assert_eq(cdp_plan_to_json(p, &a), CDP_OK);
        json_error_t err;
        json_t *j = json_loads(a, 0, &err);
        cr_assert_not_null(j, "%s: to_json output does not parse: %s", path, err.text);
        json_decref(j);
        /* The written plan loads back (from anywhere: paths are absolute) to the same plan. */
        cr_assert_eq(cdp_plan_load_string(a, path, "/", &q), CDP_OK, "%s: reload: %s", path, cdp_last_error());
        cr_assert_eq(cdp_plan_to_json(q, &b), CDP_OK);
        cr_assert_str_eq(a, b, "%s: round trip differs", path);
        cr_assert_eq(cdp_plan_model_units(p), cdp_plan_model_units(q));
        cr_assert_eq(p->train.global_batch, q->train.global_batch);
        cr_assert_eq(p->parallel.stages, q->parallel.stages);
        cr_assert_eq(p->train.optimizer.lr, q->train.optimizer.lr, "%s: lr not exact", path);
        /* And it survives resolve + print on a machine without GPUs. */
        struct cdp_machine_info m = {0, "no CUDA-capable device is detected"};
        FILE *f = fopen("/dev/null", "w");
        if (p->cluster.backend != CDP_BACKEND_CUDA || p->cluster.devices != CDP_AUTO ||
            strcmp(p->cluster.topology, "auto") != 0) {
            cr_assert_eq(cdp_plan_resolve(p, &m), CDP_OK, "%s: resolve: %s", path, cdp_last_error());
        }
        cr_assert_eq(cdp_plan_print(p, f), CDP_OK);
        fclose(f);
        free(a);
        free(b);
        cdp_plan_free(p);
        cdp_plan_free(q);
        n++;
    }
    closedir(d);
    return n;
}

Test(plan, examples_round_trip)
{
    cr_assert_geq(roundtrip_folder("examples"), 4, "expected the four examples");
}

Test(plan, good_plans_round_trip)
{
    cr_assert_geq(roundtrip_folder("tests/plans/good"), 8);
}

/* /model/unused_tensors: "error" (the default) or "warn", for every kind of model, kept by --json. */
Test(plan, unused_tensors_is_read_and_written)
{
    const char *plans[] = {"{\"model\": {\"preset\": \"gpt\", \"unused_tensors\": \"warn\"}}",
                           "{\"model\": {\"preset\": \"mlp\", \"unused_tensors\": \"warn\"}}",
                           "{\"model\": {\"input\": [4], \"layers\": [{\"type\": \"relu\"}], "
                           "\"unused_tensors\": \"warn\"}}"};
    for (size_t i = 0; i < sizeof plans / sizeof plans[0]; i++) {
        struct cdp_plan *p = load_ok(plans[i]);
        cr_assert_eq(p->model.unused_tensors, CDP_UNUSED_WARN, "%s", plans[i]);
        char *j = NULL;
        cr_assert_eq(cdp_plan_to_json(p, &j), CDP_OK);
        cr_assert(strstr(j, "\"unused_tensors\": \"warn\""), "%s", j);
        free(j);
        cdp_plan_free(p);
    }
}

/* ---- defaults ----------------------------------------------------------------- */

Test(plan, defaults_filled)
{
    struct cdp_plan *p = load_ok("{\"model\": {\"preset\": \"gpt\"}}");
    cr_assert_eq(p->model.kind, CDP_MODEL_GPT);
    cr_assert_str_eq(p->model.preset, "gpt");
    cr_assert_eq(p->model.vocab, 256);
    cr_assert_eq(p->model.context, 64);
    cr_assert_eq(p->model.layers, 4);
    cr_assert_eq(p->model.heads, 4);
    cr_assert_eq(p->model.embed, 128);
    cr_assert_eq(p->model.tie_embeddings, 1);
    cr_assert_eq(p->model.unused_tensors, CDP_UNUSED_ERROR, "a weights file's unused tensors are an error");
    cr_assert_eq(cdp_plan_model_units(p), 6);
    cr_assert_eq(p->data.source, CDP_DATA_SYNTHETIC);
    cr_assert_null(p->data.path);
    cr_assert_eq(p->data.seed, 1);
    cr_assert_eq(p->train.steps, 10);
    cr_assert_eq(p->train.micro_batch, 1);
    cr_assert_eq(p->train.global_batch, CDP_AUTO);
    cr_assert_eq(p->train.optimizer.type, CDP_OPT_ADAMW);
    cr_assert_float_eq(p->train.optimizer.lr, 3e-4, 1e-15);
    cr_assert_float_eq(p->train.optimizer.beta2, 0.999, 1e-15);
    cr_assert_float_eq(p->train.optimizer.eps, 1e-8, 1e-20);
    cr_assert_eq(p->train.grad_clip, 0.0);
    cr_assert_eq(p->train.precision, CDP_PRECISION_FP32);
    cr_assert_eq(p->train.log_every, 10);
    cr_assert_null(p->train.checkpoint.dir);
    cr_assert_eq(p->parallel.stages, 1);
    cr_assert_eq(p->parallel.replicas, 1);
    cr_assert_eq(p->parallel.micro_batches, CDP_AUTO);
    cr_assert_eq(p->parallel.schedule, CDP_SCHEDULE_1F1B);
    cr_assert_eq(p->parallel.chunks, 1);
    cr_assert_null(p->parallel.partition);
    cr_assert_eq(p->parallel.placement, CDP_PLACEMENT_TOPOLOGY);
    cr_assert_eq(p->cluster.backend_auto, 1);
    cr_assert_str_eq(p->cluster.topology, "auto");
    cr_assert_eq(p->cluster.nodes, 1);
    cr_assert_eq(p->cluster.devices, CDP_AUTO);
    cr_assert_eq(p->cluster.device_memory, 0);
    cr_assert_null(p->output.metrics);
    cr_assert_null(p->output.trace);
    cr_assert_null(p->output.timeline);
    cdp_plan_free(p);
}

Test(plan, sgd_defaults_and_interleaved_chunks)
{
    struct cdp_plan *p = load_ok("{\"model\": {\"preset\": \"gpt\"}, \"train\": {\"optimizer\": {\"type\": "
                                 "\"sgd\"}}, \"parallel\": {\"stages\": 2, \"schedule\": \"interleaved\"}}");
    cr_assert_eq(p->train.optimizer.type, CDP_OPT_SGD);
    cr_assert_float_eq(p->train.optimizer.lr, 0.01, 1e-15);
    cr_assert_float_eq(p->train.optimizer.momentum, 0.9, 1e-15);
    cr_assert_eq(p->parallel.chunks, 2);
    cdp_plan_free(p);
}

Test(plan, ordered_is_an_alias)
{
    struct cdp_plan *p = load_ok("{\"model\": {\"preset\": \"gpt\"}, \"parallel\": {\"placement\": \"ordered\"}}");
    cr_assert_eq(p->parallel.placement, CDP_PLACEMENT_ORDERED_PP_INNER);
    char *s = NULL;
    cr_assert_eq(cdp_plan_to_json(p, &s), CDP_OK);
    cr_assert(strstr(s, "\"placement\": \"ordered-pp-inner\""), "%s", s);
    free(s);
    cdp_plan_free(p);
}

/* ---- presets ------------------------------------------------------------------- */

struct preset_case {
    char json[160];
    int64_t params;
    int64_t units;
};

ParameterizedTestParameters(plan, gpt_parameter_counts)
{
    static struct preset_case cases[] = {
        /* 124,439,808: the well-known GPT-2 small count with the head tied to wte. */
        {"{\"model\": {\"preset\": \"gpt2\"}}", 124439808, 14},
        {"{\"model\": {\"preset\": \"gpt2\", \"tie_embeddings\": false}}", 124439808 + 50257LL * 768, 14},
        {"{\"model\": {\"preset\": \"gpt2-medium\"}}", 354823168, 26},
        {"{\"model\": {\"preset\": \"gpt2-large\"}}", 774030080, 38},
        {"{\"model\": {\"preset\": \"gpt2-xl\"}}", 1557611200, 50},
        {"{\"model\": {\"preset\": \"gpt\"}}", 834304, 6},
        /* mlp 784-256-256-10: 784*256+256 + 256*256+256 + 256*10+10 */
        {"{\"model\": {\"preset\": \"mlp\"}}", 200960 + 65792 + 2570, 5},
        /* cnn 1x28x28, [8,16]: conv 8*1*9+8, conv 16*8*9+16, linear 16*7*7*10+10 */
        {"{\"model\": {\"preset\": \"cnn\"}}", 80 + 1168 + 7850, 8},
    };
    return cr_make_param_array(struct preset_case, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(struct preset_case *c, plan, gpt_parameter_counts)
{
    struct cdp_plan *p = load_ok(c->json);
    cr_assert_eq(cdp_plan_param_count(p), c->params, "%s: %lld", c->json, (long long)cdp_plan_param_count(p));
    cr_assert_eq(cdp_plan_model_units(p), c->units);
    cdp_plan_free(p);
}

Test(plan, gpt2_sizes_and_overrides)
{
    struct cdp_plan *p = load_ok("{\"model\": {\"preset\": \"gpt2-xl\", \"layers\": 2, \"context\": 256}}");
    cr_assert_eq(p->model.vocab, 50257);
    cr_assert_eq(p->model.heads, 25);
    cr_assert_eq(p->model.embed, 1600);
    cr_assert_eq(p->model.layers, 2);
    cr_assert_eq(p->model.context, 256);
    cr_assert_str_eq(p->model.preset, "gpt2-xl");
    cdp_plan_free(p);
}

Test(plan, gpt2_param_count_in_print)
{
    struct cdp_plan *p = load_ok("{\"model\": {\"preset\": \"gpt2\"}}");
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    cr_assert_eq(cdp_plan_print(p, f), CDP_OK);
    fclose(f);
    cr_assert(strstr(buf, "124,439,808"), "%s", buf);
    cr_assert(strstr(buf, "Parallel"), "%s", buf);
    free(buf);
    cdp_plan_free(p);
}

/* The llama preset: its defaults, the MLP width by Meta's rule or as given, and
 * its parameter count. */
Test(plan, llama_defaults_and_widths)
{
    struct cdp_plan *p = load_ok("{\"model\": {\"preset\": \"llama\"}}");
    const struct cdp_model_desc *m = &p->model;
    cr_assert_eq(m->kind, CDP_MODEL_GPT);
    cr_assert_eq(m->arch, CDP_ARCH_LLAMA);
    cr_assert_eq(m->vocab, 256);
    cr_assert_eq(m->context, 64);
    cr_assert_eq(m->layers, 4);
    cr_assert_eq(m->heads, 4);
    cr_assert_eq(m->kv_heads, 4);
    cr_assert_eq(m->embed, 128);
    cr_assert_eq(m->ffn_hidden, 512); /* 2/3 of 4 x 128, up to a multiple of 256 */
    cr_assert_eq(m->tie_embeddings, 0);
    cr_assert_float_eq(m->norm_eps, 1e-5, 1e-12);
    cr_assert_float_eq(m->rope.theta, 10000.0, 1e-9);
    cr_assert_eq(m->rope.factor, 0);
    cr_assert_eq(cdp_plan_model_units(p), 6);
    /* wte 256 x 128, 4 blocks of 2 C^2 + 2 C^2 (kv = q here) + 3 C 512 + 2 C, the norm, the untied head */
    cr_assert_eq(cdp_plan_param_count(p), 2 * 256 * 128 + 4 * (4 * 128 * 128 + 3 * 128 * 512 + 2 * 128) + 128);
    cdp_plan_free(p);

    /* Llama 3 8B's shape: 14336 by the rule, 8 key/value heads */
    p = load_ok("{\"model\": {\"preset\": \"llama\", \"dim\": 4096, \"heads\": 32, \"kv_heads\": 8, "
                "\"layers\": 1, \"multiple_of\": 1024, \"ffn_dim_multiplier\": 1.3, \"vocab\": 128, "
                "\"context\": 8}}");
    cr_assert_eq(p->model.ffn_hidden, 14336);
    cr_assert_eq(cdp_plan_param_count(p), 2 * 128 * 4096 + 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 +
                                              2 * 4096 + 4096);
    cdp_plan_free(p);

    p = load_ok("{\"model\": {\"preset\": \"llama\", \"hidden\": 100, \"tie_embeddings\": true, "
                "\"rope_scaling\": {\"type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, "
                "\"high_freq_factor\": 4, \"original_context\": 8192}, \"rope_theta\": 500000}}");
    cr_assert_eq(p->model.ffn_hidden, 100);
    cr_assert_eq(p->model.multiple_of, 0);
    cr_assert_float_eq(p->model.rope.factor, 8.0, 1e-12);
    cr_assert_eq(p->model.rope.original_context, 8192);
    cr_assert_float_eq(p->model.rope.theta, 500000.0, 1e-9);
    char *j = NULL;
    cr_assert_eq(cdp_plan_to_json(p, &j), CDP_OK);
    cr_assert(strstr(j, "\"hidden\": 100") && !strstr(j, "multiple_of") && strstr(j, "\"llama3\""), "%s", j);
    free(j);
    cdp_plan_free(p);
}

/* Every bad llama key is named, with what was expected. */
Test(plan, llama_errors_name_the_key)
{
    static const char *const cases[][2] = {
        {"{\"model\": {\"preset\": \"llama\", \"embed\": 64}}", "/model/embed: unknown key"},
        {"{\"model\": {\"preset\": \"llama\", \"dim\": 100, \"heads\": 3}}", "/model/dim: 100 is not a multiple"},
        {"{\"model\": {\"preset\": \"llama\", \"heads\": 4, \"kv_heads\": 3}}", "/model/kv_heads: 3 does not divide"},
        {"{\"model\": {\"preset\": \"llama\", \"dim\": 12, \"heads\": 4}}", "/model/heads: the head width"},
        {"{\"model\": {\"preset\": \"llama\", \"hidden\": 64, \"multiple_of\": 32}}",
         "/model/hidden: given together with /model/multiple_of"},
        {"{\"model\": {\"preset\": \"llama\", \"hidden\": 64, \"ffn_dim_multiplier\": 1.5}}",
         "/model/hidden: given together with /model/ffn_dim_multiplier"},
        {"{\"model\": {\"preset\": \"llama\", \"ffn_dim_multiplier\": -1}}", "/model/ffn_dim_multiplier"},
        {"{\"model\": {\"preset\": \"llama\", \"norm_eps\": 0}}", "/model/norm_eps"},
        {"{\"model\": {\"preset\": \"llama\", \"rope_theta\": \"big\"}}", "/model/rope_theta"},
        {"{\"model\": {\"preset\": \"llama\", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4}}}",
         "/model/rope_scaling/type"},
        {"{\"model\": {\"preset\": \"llama\", \"rope_scaling\": {\"type\": \"llama3\", \"factor\": 8}}}",
         "/model/rope_scaling/low_freq_factor: missing"},
        {"{\"model\": {\"preset\": \"llama\", \"rope_scaling\": {\"factor\": 8}}}", "/model/rope_scaling/type: missing"},
        {"{\"model\": {\"preset\": \"llama\", \"rope_scaling\": {\"type\": \"llama3\", \"factor\": 8, "
         "\"low_freq_factor\": 4, \"high_freq_factor\": 1, \"original_context\": 64}}}",
         "/model/rope_scaling/high_freq_factor: 1 must be larger"},
        {"{\"model\": {\"preset\": \"llama\", \"rope_scaling\": {\"type\": \"llama3\", \"factor\": 8, "
         "\"low_freq_factor\": 1, \"high_freq_factor\": 4, \"original_context\": 64, \"beta\": 1}}}",
         "/model/rope_scaling/beta: unknown key"},
        {"{\"model\": {\"preset\": \"llama\", \"rope_scaling\": 3}}", "/model/rope_scaling: expected null or an object"},
        {"{\"model\": {\"input\": [8], \"layers\": [{\"type\": \"embedding\", \"vocab\": 4, \"dim\": 12}, "
         "{\"type\": \"rotary_attention\", \"heads\": 4, \"kv_heads\": 3}]}}",
         "/model/layers/1: rotary_attention heads 4 is not a multiple of kv_heads 3"},
        {"{\"model\": {\"input\": [8], \"layers\": [{\"type\": \"embedding\", \"vocab\": 4, \"dim\": 12}, "
         "{\"type\": \"llama_block\", \"heads\": 4}]}}", "/model/layers/1: llama_block head width 3"},
        {"{\"model\": {\"input\": [8], \"layers\": [{\"type\": \"rmsnorm\", \"bias\": true}]}}",
         "/model/layers/0/bias: unknown key for a rmsnorm layer"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) load_fails(cases[i][0], cases[i][1]);
}

Test(plan, mlp_expansion)
{
    struct cdp_plan *p = load_ok("{\"model\": {\"preset\": \"mlp\", \"input\": [1, 28, 28], \"hidden\": [32, 16], "
                                 "\"classes\": 5, \"activation\": \"gelu\"}}");
    static const enum cdp_layer_type want[] = {CDP_LAYER_FLATTEN, CDP_LAYER_LINEAR, CDP_LAYER_GELU,
                                               CDP_LAYER_LINEAR, CDP_LAYER_GELU, CDP_LAYER_LINEAR};
    cr_assert_eq(p->model.kind, CDP_MODEL_MLP);
    cr_assert_eq(p->model.n_layers, 6);
    for (int i = 0; i < 6; i++) cr_assert_eq(p->model.layer_list[i].type, want[i], "layer %d", i);
    cr_assert_eq(p->model.layer_list[1].out, 32);
    cr_assert_eq(p->model.layer_list[1].bias, 1);
    cr_assert_eq(p->model.layer_list[3].out, 16);
    cr_assert_eq(p->model.layer_list[5].out, 5);
    cdp_plan_free(p);
}

Test(plan, cnn_expansion)
{
    struct cdp_plan *p = load_ok("{\"model\": {\"preset\": \"cnn\", \"channels\": [4]}}");
    static const enum cdp_layer_type want[] = {CDP_LAYER_CONV2D, CDP_LAYER_RELU, CDP_LAYER_MAXPOOL2D,
                                               CDP_LAYER_FLATTEN, CDP_LAYER_LINEAR};
    cr_assert_eq(p->model.n_layers, 5);
    for (int i = 0; i < 5; i++) cr_assert_eq(p->model.layer_list[i].type, want[i], "layer %d", i);
    const struct cdp_layer_desc *c = &p->model.layer_list[0];
    cr_assert(c->out == 4 && c->kernel == 3 && c->stride == 1 && c->padding == 1 && c->bias == 1);
    cr_assert(p->model.layer_list[2].kernel == 2 && p->model.layer_list[2].stride == 2);
    cr_assert_eq(p->model.layer_list[4].out, 10);
    cdp_plan_free(p);
}

Test(plan, explicit_layer_defaults)
{
    struct cdp_plan *p = load_ok(
        "{\"model\": {\"input\": [8], \"layers\": [{\"type\": \"embedding\", \"vocab\": 10, \"dim\": 16}, "
        "{\"type\": \"attention\", \"heads\": 2}, {\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": 10}]}}");
    const struct cdp_layer_desc *L = p->model.layer_list;
    cr_assert_eq(p->model.kind, CDP_MODEL_LAYERS);
    cr_assert_eq(p->model.loss, CDP_LOSS_CROSS_ENTROPY);
    cr_assert_eq(L[0].context, 0);
    cr_assert_eq(L[1].causal, 1);
    cr_assert_float_eq(L[2].eps, 1e-5, 1e-15);
    cr_assert_eq(L[3].bias, 1);
    cr_assert_eq(cdp_plan_model_units(p), 4);
    cdp_plan_free(p);
    p = load_ok("{\"model\": {\"input\": [3, 9, 9], \"layers\": [{\"type\": \"maxpool2d\", \"kernel\": 3}, "
                "{\"type\": \"conv2d\", \"out\": 2, \"kernel\": 3}]}}");
    cr_assert_eq(p->model.layer_list[0].stride, 3);
    cr_assert_eq(p->model.layer_list[1].stride, 1);
    cr_assert_eq(p->model.layer_list[1].padding, 0);
    cdp_plan_free(p);
}

Test(plan, silu_layer_loads_and_takes_no_settings)
{
    struct cdp_plan *p = load_ok("{\"model\": {\"input\": [6], \"layers\": [{\"type\": \"linear\", \"out\": 8}, "
                                 "{\"type\": \"silu\"}, {\"type\": \"linear\", \"out\": 3}]}}");
    cr_assert_eq(p->model.layer_list[1].type, CDP_LAYER_SILU);
    cr_assert_str_eq(cdp_layer_type_name(CDP_LAYER_SILU), "silu");
    cr_assert_eq(cdp_plan_param_count(p), 6 * 8 + 8 + 8 * 3 + 3, "silu has no parameters");
    cdp_plan_free(p);
    load_fails("{\"model\": {\"input\": [6], \"layers\": [{\"type\": \"silu\", \"beta\": 2}]}}",
               "/model/layers/0/beta: unknown key for a silu layer (it takes no settings)");
    load_fails("{\"model\": {\"input\": [6], \"layers\": [{\"type\": \"slu\"}]}}", "did you mean \"silu\"");
}

/* ---- batch arithmetic ------------------------------------------------------------ */

struct batch_case {
    char parallel[96];
    char train[96];
    int64_t global_batch, micro_batches;
    char error[48]; /* "" = loads */
};

ParameterizedTestParameters(plan, batch_arithmetic)
{
    static struct batch_case cases[] = {
        {"\"replicas\": 2, \"micro_batches\": 4", "\"micro_batch\": 4", 32, 4, ""},
        {"\"replicas\": 2, \"micro_batches\": 4", "\"micro_batch\": 4, \"global_batch\": 32", 32, 4, ""},
        {"\"replicas\": 2", "\"micro_batch\": 4, \"global_batch\": 64", 64, 8, ""},
        {"\"replicas\": 3", "\"global_batch\": 10", 0, 0, "/parallel/micro_batches"},
        {"\"replicas\": 2, \"micro_batches\": 4", "\"micro_batch\": 4, \"global_batch\": 64", 0, 0,
         "/train/global_batch"},
        {"\"replicas\": \"auto\", \"micro_batches\": 4", "\"micro_batch\": 2, \"global_batch\": 64", 64, 4, ""},
        {"\"replicas\": \"auto\", \"micro_batches\": 4", "\"micro_batch\": 2, \"global_batch\": 12", 0, 0,
         "/train/global_batch"},
        {"\"replicas\": \"auto\"", "\"micro_batch\": 4", CDP_AUTO, CDP_AUTO, ""},
        {"", "\"global_batch\": 16", 16, 16, ""},
        {"", "", CDP_AUTO, CDP_AUTO, ""},
        {"\"stages\": 4, \"micro_batches\": 6, \"schedule\": \"interleaved\"", "", 0, 0,
         "/parallel/micro_batches"},
        {"\"stages\": 4, \"schedule\": \"interleaved\"", "\"global_batch\": 8", 8, 8, ""},
    };
    return cr_make_param_array(struct batch_case, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(struct batch_case *c, plan, batch_arithmetic)
{
    char json[512];
    snprintf(json, sizeof json, "{\"model\": {\"preset\": \"gpt\"}, \"parallel\": {%s}, \"train\": {%s}}",
             c->parallel, c->train);
    if (c->error[0]) {
        load_fails(json, c->error);
        return;
    }
    struct cdp_plan *p = load_ok(json);
    cr_assert_eq(p->train.global_batch, c->global_batch, "%s: global_batch %lld", json,
                 (long long)p->train.global_batch);
    cr_assert_eq(p->parallel.micro_batches, c->micro_batches, "%s: micro_batches %lld", json,
                 (long long)p->parallel.micro_batches);
    cdp_plan_free(p);
}

Test(plan, batch_mismatch_names_every_key)
{
    load_fails("{\"model\": {\"preset\": \"gpt\"}, \"parallel\": {\"replicas\": 2, \"micro_batches\": 4}, "
               "\"train\": {\"micro_batch\": 4, \"global_batch\": 64}}",
               "/train/global_batch: 64 does not equal /parallel/replicas 2 x /parallel/micro_batches 4 x "
               "/train/micro_batch 4 = 32");
}

Test(plan, partition_sets_auto_stages)
{
    struct cdp_plan *p = load_ok("{\"model\": {\"preset\": \"gpt\"}, \"parallel\": {\"stages\": \"auto\", "
                                 "\"partition\": [[0, 1], [1, 5], [5, 6]]}}");
    cr_assert_eq(p->parallel.stages, 3);
    cr_assert_eq(p->parallel.n_partition, 3);
    cr_assert_eq(p->parallel.partition[1][0], 1);
    cr_assert_eq(p->parallel.partition[1][1], 5);
    cdp_plan_free(p);
}

/* ---- /parallel/balance, /parallel/rebalance_every ------------------------------------ */

#define BAL(par) "{\"model\": {\"preset\": \"gpt\"}, \"train\": {\"micro_batch\": 2}, \"parallel\": {" par "}}"

Test(plan, balance_forms)
{
    struct cdp_plan *p = load_ok(BAL("\"replicas\": 2"));
    cr_assert_eq(p->parallel.balance, CDP_BALANCE_SPEED, "the default");
    cr_assert_null(p->parallel.shares);
    cr_assert_eq(p->parallel.rebalance_every, 0);
    cdp_plan_free(p);
    p = load_ok(BAL("\"replicas\": 2, \"balance\": \"uniform\", \"rebalance_every\": 50"));
    cr_assert_eq(p->parallel.balance, CDP_BALANCE_UNIFORM);
    cr_assert_eq(p->parallel.rebalance_every, 50);
    char *s = NULL;
    cr_assert_eq(cdp_plan_to_json(p, &s), CDP_OK);
    cr_assert(strstr(s, "\"balance\": \"uniform\"") && strstr(s, "\"rebalance_every\": 50"), "%s", s);
    free(s);
    cdp_plan_free(p);
    p = load_ok(BAL("\"replicas\": 2, \"micro_batches\": 4, \"balance\": [5, 3]"));
    cr_assert_eq(p->parallel.balance, CDP_BALANCE_EXPLICIT);
    cr_assert_eq(p->parallel.n_shares, 2);
    cr_assert(p->parallel.shares[0] == 5 && p->parallel.shares[1] == 3);
    cr_assert_eq(p->train.global_batch, 16, "replicas x micro_batches x micro_batch, whatever the shares");
    cr_assert_eq(cdp_plan_to_json(p, &s), CDP_OK);
    cr_assert(strstr(s, "\"balance\": [\n      5,\n      3\n    ]") || strstr(s, "\"balance\": [5, 3]"), "%s", s);
    struct cdp_plan *q = NULL;
    cr_assert_eq(cdp_plan_load_string(s, "t.json", NULL, &q), CDP_OK, "%s", cdp_last_error());
    cr_assert(q->parallel.balance == CDP_BALANCE_EXPLICIT && q->parallel.shares[1] == 3);
    char *s2 = NULL;
    cr_assert_eq(cdp_plan_to_json(q, &s2), CDP_OK);
    cr_assert_str_eq(s, s2);
    free(s);
    free(s2);
    cdp_plan_free(q);
    cdp_plan_free(p);
    /* the shares settle what is "auto": replicas (one share each), micro_batches (their mean) */
    p = load_ok(BAL("\"replicas\": \"auto\", \"micro_batches\": \"auto\", \"balance\": [7, 5, 6]"));
    cr_assert_eq(p->parallel.replicas, 3);
    cr_assert_eq(p->parallel.micro_batches, 6);
    cr_assert_eq(p->train.global_batch, 36);
    cdp_plan_free(p);
    /* interleaved: multiples of the stages */
    p = load_ok(BAL("\"stages\": 2, \"schedule\": \"interleaved\", \"replicas\": 2, \"balance\": [6, 2]"));
    cr_assert_eq(p->parallel.micro_batches, 4);
    cdp_plan_free(p);
    /* one replica: its share is micro_batches */
    p = load_ok(BAL("\"balance\": [3]"));
    cr_assert_eq(p->parallel.replicas, 1);
    cr_assert_eq(p->parallel.micro_batches, 3);
    cdp_plan_free(p);
}

struct balance_bad {
    char parallel[160];
    char train[48];
    char error[200];
};

ParameterizedTestParameters(plan, balance_errors_name_the_key)
{
    static struct balance_bad cases[] = {
        {"\"replicas\": 2, \"balance\": [3, 4]", "",
         "t.json: /parallel/balance: the shares sum to 7 micro-batches per step, not a multiple of "
         "/parallel/replicas 2"},
        {"\"replicas\": 2, \"micro_batches\": 4, \"balance\": [3, 4]", "",
         "t.json: /parallel/balance: the shares sum to 7 micro-batches per step; /parallel/replicas 2 x "
         "/parallel/micro_batches 4 is 8"},
        {"\"replicas\": 2, \"balance\": [4, 4, 4]", "",
         "t.json: /parallel/balance: 3 shares for /parallel/replicas 2: give one per replica"},
        {"\"balance\": \"sped\"", "",
         "t.json: /parallel/balance: expected one of \"speed\", \"uniform\", got \"sped\" (did you mean \"speed\"?)"},
        {"\"balance\": \"fast\"", "",
         "t.json: /parallel/balance: expected one of \"speed\", \"uniform\", got \"fast\""},
        {"\"replicas\": 2, \"balance\": [0, 8]", "",
         "t.json: /parallel/balance/0: expected a positive integer, got 0"},
        {"\"replicas\": 2, \"balance\": [4, -1]", "",
         "t.json: /parallel/balance/1: expected a positive integer, got -1"},
        {"\"replicas\": 2, \"balance\": [4, 2.5]", "",
         "t.json: /parallel/balance/1: expected a positive integer, got 2.5"},
        {"\"replicas\": 2, \"balance\": [4, \"4\"]", "", "t.json: /parallel/balance/1: expected a positive integer"},
        {"\"balance\": []", "",
         "t.json: /parallel/balance: expected \"speed\", \"uniform\" or a list of micro-batches per replica, got []"},
        {"\"balance\": {\"0\": 4}", "", "t.json: /parallel/balance: expected \"speed\", \"uniform\" or a list"},
        {"\"balance\": true", "", "t.json: /parallel/balance: expected \"speed\", \"uniform\" or a list"},
        {"\"stages\": 2, \"schedule\": \"interleaved\", \"replicas\": 2, \"balance\": [5, 3]", "",
         "t.json: /parallel/balance/0: 5 is not a multiple of /parallel/stages 2, as the interleaved schedule needs"},
        {"\"stages\": 4, \"schedule\": \"interleaved\", \"replicas\": 2, \"balance\": [4, 6]", "",
         "t.json: /parallel/balance/1: 6 is not a multiple of /parallel/stages 4"},
        {"\"stages\": 2, \"schedule\": \"interleaved\", \"replicas\": 2, \"balance\": [2, 4]", "",
         "t.json: /parallel/balance: the shares sum to 6, so /parallel/micro_batches is 3, not a multiple of "
         "/parallel/stages 2"},
        {"\"replicas\": 2, \"balance\": [5, 3]", "\"global_batch\": 32",
         "t.json: /train/global_batch: 32 does not equal /parallel/replicas 2 x /parallel/micro_batches 4 x "
         "/train/micro_batch 2 = 16"},
        {"\"rebalance_every\": -1", "", "t.json: /parallel/rebalance_every: expected a non-negative integer, got -1"},
        {"\"rebalance_every\": \"auto\"", "", "t.json: /parallel/rebalance_every: expected a non-negative integer"},
        {"\"balanse\": \"speed\"", "", "t.json: /parallel/balanse: unknown key (did you mean \"balance\"?)"},
    };
    return cr_make_param_array(struct balance_bad, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(struct balance_bad *c, plan, balance_errors_name_the_key)
{
    char json[512];
    snprintf(json, sizeof json, "{\"model\": {\"preset\": \"gpt\"}, \"train\": {\"micro_batch\": 2%s%s}, "
             "\"parallel\": {%s}}", c->train[0] ? ", " : "", c->train, c->parallel);
    load_fails(json, c->error);
}

/* ---- resolve ----------------------------------------------------------------------- */

Test(plan, resolve_without_gpus)
{
    struct cdp_plan *p = load_ok("{\"model\": {\"preset\": \"gpt\"}, \"parallel\": {\"stages\": 4, \"replicas\": 4}}");
    struct cdp_machine_info m = {0, "no CUDA-capable device is detected"};
    cr_assert_eq(cdp_plan_resolve(p, &m), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(p->cluster.backend, CDP_BACKEND_CPU);
    cr_assert_eq(p->cluster.devices, CDP_AUTO); /* one CPU device per rank: no limit */
    cdp_plan_free(p);
}

Test(plan, resolve_with_8_gpus)
{
    struct cdp_plan *p = load_ok("{\"model\": {\"preset\": \"gpt\"}, \"parallel\": {\"stages\": 4, \"replicas\": 2}}");
    struct cdp_machine_info m = {8, NULL};
    cr_assert_eq(cdp_plan_resolve(p, &m), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(p->cluster.backend, CDP_BACKEND_CUDA);
    cr_assert_eq(p->cluster.devices, 8);
    cdp_plan_free(p);

    p = load_ok("{\"model\": {\"preset\": \"gpt\"}, \"parallel\": {\"stages\": 4, \"replicas\": 4}}");
    cr_assert_neq(cdp_plan_resolve(p, &m), CDP_OK);
    cr_assert(strstr(cdp_last_error(), "/parallel/stages") && strstr(cdp_last_error(), "/cluster/devices 8"),
              "%s", cdp_last_error());
    cdp_plan_free(p);

    /* cpu chosen explicitly on a GPU machine stays cpu. */
    p = load_ok("{\"model\": {\"preset\": \"gpt\"}, \"cluster\": {\"backend\": \"cpu\"}}");
    cr_assert_eq(cdp_plan_resolve(p, &m), CDP_OK);
    cr_assert_eq(p->cluster.backend, CDP_BACKEND_CPU);
    cr_assert_eq(p->cluster.devices, CDP_AUTO);
    cdp_plan_free(p);
}

/* Ranks that share one GPU: a 2-stage pipeline fits one GPU with
 * ranks_per_device 2, not without it; the key round-trips. */
Test(plan, ranks_per_device_lets_ranks_share_a_gpu)
{
    struct cdp_machine_info m = {1, NULL};
    struct cdp_plan *p = load_ok("{\"model\": {\"preset\": \"gpt\"}, \"parallel\": {\"stages\": 2, \"replicas\": 1}}");
    cr_assert_eq(p->cluster.ranks_per_device, 1);
    cr_assert_neq(cdp_plan_resolve(p, &m), CDP_OK);
    cr_assert(strstr(cdp_last_error(), "/cluster/devices 1 gives only 1"), "%s", cdp_last_error());
    cdp_plan_free(p);
    p = load_ok("{\"model\": {\"preset\": \"gpt\"}, \"parallel\": {\"stages\": 2, \"replicas\": 1}, "
                "\"cluster\": {\"ranks_per_device\": 2}}");
    cr_assert_eq(cdp_plan_resolve(p, &m), CDP_OK, "%s", cdp_last_error());
    char *text = NULL;
    cr_assert_eq(cdp_plan_to_json(p, &text), CDP_OK);
    cr_assert(strstr(text, "\"ranks_per_device\": 2"), "%s", text);
    free(text);
    cdp_plan_free(p);
    p = load_ok("{\"model\": {\"preset\": \"gpt\"}, \"parallel\": {\"stages\": 4, \"replicas\": 1}, "
                "\"cluster\": {\"ranks_per_device\": 2}}");
    cr_assert_neq(cdp_plan_resolve(p, &m), CDP_OK);
    cr_assert(strstr(cdp_last_error(), "x /cluster/ranks_per_device gives only 2"), "%s", cdp_last_error());
    cdp_plan_free(p);
    load_fails("{\"model\": {\"preset\": \"gpt\"}, \"cluster\": {\"ranks_per_device\": 0}}",
               "/cluster/ranks_per_device");
}

Test(plan, resolve_cuda_without_gpus)
{
    struct cdp_machine_info m = {0, "CUDA driver version is insufficient"};
    struct cdp_plan *p = load_ok("{\"model\": {\"preset\": \"gpt\"}, \"cluster\": {\"backend\": \"cuda\"}}");
    cr_assert_neq(cdp_plan_resolve(p, &m), CDP_OK);
    const char *e = cdp_last_error();
    cr_assert(strstr(e, "t.json: /cluster/backend: \"cuda\" needs GPUs"), "%s", e);
    cr_assert(strstr(e, "(CUDA driver version is insufficient)"), "%s", e);
    cr_assert(strstr(e, "/cluster/topology") && strstr(e, "/cluster/devices"), "%s", e);
    cdp_plan_free(p);

    /* Planning for a machine we do not have: explicit devices. */
    p = load_ok("{\"model\": {\"preset\": \"gpt\"}, \"parallel\": {\"stages\": 4, \"replicas\": 2}, "
                "\"cluster\": {\"backend\": \"cuda\", \"devices\": 8}}");
    cr_assert_eq(cdp_plan_resolve(p, &m), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(p->cluster.devices, 8);
    cdp_plan_free(p);
}

/* ---- sizes and paths ---------------------------------------------------------------- */

struct size_case {
    char value[32];
    uint64_t bytes;
};

ParameterizedTestParameters(plan, device_memory_sizes)
{
    static struct size_case cases[] = {
        {"\"16GiB\"", 17179869184ull}, {"\"512MB\"", 512000000ull}, {"1234", 1234},
        {"\"1.5 KiB\"", 1536},         {"\"auto\"", 0},             {"\"80gib\"", 85899345920ull},
    };
    return cr_make_param_array(struct size_case, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(struct size_case *c, plan, device_memory_sizes)
{
    char json[256];
    snprintf(json, sizeof json, "{\"model\": {\"preset\": \"gpt\"}, \"cluster\": {\"device_memory\": %s}}", c->value);
    struct cdp_plan *p = load_ok(json);
    cr_assert_eq(p->cluster.device_memory, c->bytes, "%s -> %llu", c->value,
                 (unsigned long long)p->cluster.device_memory);
    cdp_plan_free(p);
}

Test(plan, paths_are_relative_to_the_plan_folder)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    char *real = realpath(dir, NULL);
    cdp_test_write_file(dir, "corpus.txt", "hello world\n");
    struct cdp_plan *p = NULL;
    const char *json = "{\"model\": {\"preset\": \"gpt\"}, \"data\": {\"source\": \"text\", \"path\": "
                       "\"corpus.txt\"}, \"train\": {\"checkpoint\": {\"dir\": \"ckpt/\"}}, \"output\": "
                       "{\"metrics\": \"m.jsonl\", \"trace\": \"./t.json\"}}";
    cr_assert_eq(cdp_plan_load_string(json, "p.json", dir, &p), CDP_OK, "%s", cdp_last_error());
    char want[PATH_MAX + 32];
    snprintf(want, sizeof want, "%s/corpus.txt", real);
    cr_assert_str_eq(p->data.path, want);
    snprintf(want, sizeof want, "%s/ckpt", real);
    cr_assert_str_eq(p->train.checkpoint.dir, want);
    cr_assert_eq(p->train.checkpoint.every, 100);
    cr_assert_eq(p->train.checkpoint.keep, 3);
    snprintf(want, sizeof want, "%s/m.jsonl", real);
    cr_assert_str_eq(p->output.metrics, want);
    snprintf(want, sizeof want, "%s/t.json", real);
    cr_assert_str_eq(p->output.trace, want);
    cr_assert_null(p->output.timeline);
    cdp_plan_free(p);
    free(real);
}

/* /data/order: parsed, kept through planned.json (the ranks read it), printed;
 * a bad value names the key and the accepted values. */
Test(plan, data_order_round_trips_and_refuses_bad_values)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    cdp_test_write_file(dir, "corpus.txt", "hello world\n");
    struct cdp_plan *p = NULL, *q = NULL;
    cr_assert_eq(cdp_plan_load_string("{\"model\": {\"preset\": \"gpt\"}, \"data\": {\"source\": \"text\", \"path\": "
                                      "\"corpus.txt\"}}",
                                      "p.json", dir, &p),
                 CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(p->data.order, CDP_DATA_ORDER_SHUFFLE, "the default");
    cdp_plan_free(p);
    p = NULL;
    cr_assert_eq(cdp_plan_load_string("{\"model\": {\"preset\": \"gpt\"}, \"data\": {\"source\": \"text\", \"path\": "
                                      "\"corpus.txt\", \"order\": \"sequential\"}}",
                                      "p.json", dir, &p),
                 CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(p->data.order, CDP_DATA_ORDER_SEQUENTIAL);
    char *a = NULL, *b = NULL;
    cr_assert_eq(cdp_plan_to_json(p, &a), CDP_OK);
    cr_assert(strstr(a, "\"order\": \"sequential\""), "%s", a);
    cr_assert_eq(cdp_plan_load_string(a, "planned.json", "/", &q), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(q->data.order, CDP_DATA_ORDER_SEQUENTIAL, "planned.json keeps the order");
    cr_assert_eq(cdp_plan_to_json(q, &b), CDP_OK);
    cr_assert_str_eq(a, b);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert_eq(cdp_plan_print(p, f), CDP_OK);
    fclose(f);
    cr_assert(strstr(text, "order") && strstr(text, "sequential"), "%s", text);
    free(text), free(a), free(b);
    cdp_plan_free(p);
    cdp_plan_free(q);

    /* synthetic data keeps "shuffle" in planned.json, which loads back */
    p = load_ok("{\"model\": {\"preset\": \"gpt\"}}");
    cr_assert_eq(cdp_plan_to_json(p, &a), CDP_OK);
    cr_assert(strstr(a, "\"order\": \"shuffle\""), "%s", a);
    cdp_plan_free(load_ok(a));
    free(a);
    cdp_plan_free(p);

    struct {
        const char *data, *needle;
    } bad[] = {
        {"{\"source\": \"synthetic\", \"order\": \"random\"}", "/data/order: expected one of \"shuffle\", \"sequential\""},
        {"{\"source\": \"synthetic\", \"order\": \"sequental\"}", "did you mean \"sequential\"?"},
        {"{\"source\": \"synthetic\", \"order\": 1}", "/data/order: expected one of"},
        {"{\"source\": \"synthetic\", \"order\": \"sequential\"}", "/data/order: \"sequential\" reads a file"},
        {"{\"source\": \"synthetic\", \"ordre\": \"sequential\"}", "did you mean \"order\"?"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char json[256];
        snprintf(json, sizeof json, "{\"model\": {\"preset\": \"gpt\"}, \"data\": %s}", bad[i].data);
        load_fails(json, bad[i].needle);
    }
}

/* ---- never a crash ------------------------------------------------------------------- */

struct weird_case {
    char json[200];
    char needle[64];
};

ParameterizedTestParameters(plan, weird_inputs_fail_cleanly)
{
    static struct weird_case cases[] = {
        {"", "empty file"},
        {"   \n\t ", "empty file"},
        {"null", "expected an object, got null"},
        {"\"model\"", "expected an object"},
        {"{\"model\": {\"preset\": \"gpt\", \"layers\": 99999999999999999999}}", "t.json:1:"},
        {"{\"model\": {\"preset\": \"gpt\", \"layers\": -0}}", "/model/layers: expected a positive integer, got 0"},
        {"{\"model\": {\"preset\": \"gpt\", \"heads\": 4.0}}", "/model/heads: expected a positive integer, got 4.0"},
        {"{\"model\": {\"preset\": \"gpt\", \"heads\": 1e400}}", "t.json:1:"},
        {"{\"model\": {\"preset\": \"gpt\", \"embed\": 9223372036854775807}}", "no larger than"},
        {"{\"model\": {\"preset\": \"gpt\"}, \"train\": {\"steps\": -9223372036854775808}}", "/train/steps"},
        {"{\"model\": {\"preset\": \"gpt\"}, \"cluster\": {\"device_memory\": \"99999999999999999999\"}}",
         "/cluster/device_memory"},
        {"{\"model\": {\"preset\": \"gpt\"}, \"cluster\": {\"device_memory\": -1}}", "/cluster/device_memory"},
        {"{\"model\": {\"preset\": \"gpt\"}, \"data\": {\"path\": \"a\\u0000b\"}}", "t.json:1:"},
        {"{\"model\": {\"input\": [1, 2, 3, 4, 5], \"layers\": [{\"type\": \"relu\"}]}}", "/model/input"},
        {"{\"model\": {\"input\": [4], \"layers\": []}}", "/model/layers"},
        {"{\"model\": {\"input\": [4], \"layers\": [{\"type\": \"conv2d\", \"out\": 1, \"kernel\": 1}]}}",
         "/model/layers/0: conv2d needs a [C, H, W] input"},
        {"{\"model\": {\"input\": [3, 4, 4], \"layers\": [{\"type\": \"conv2d\", \"out\": 1, \"kernel\": 9}]}}",
         "/model/layers/0: kernel 9"},
        {"{\"model\": {\"input\": [6], \"layers\": [{\"type\": \"attention\", \"heads\": 4}]}}",
         "/model/layers/0: attention width 6"},
        {"{\"model\": {\"input\": [8], \"layers\": [{\"type\": \"embedding\", \"vocab\": 4, \"dim\": 4, "
         "\"context\": 4}]}}",
         "more than this embedding's context"},
        {"{\"model\": {\"preset\": \"gpt\"}, \"a/b~c\": 1}", "/a~1b~0c: unknown key"},
        {"{\"model\": {\"preset\": \"gpt\"}, \"parallel\": {\"stages\": 2, \"placement\": [[0], [1]]}, "
         "\"cluster\": {\"devices\": 1}}",
         "/parallel/stages"},
        {"{\"model\": {\"preset\": \"gpt\"}, \"parallel\": {\"placement\": [[5]]}, \"cluster\": {\"devices\": 2}}",
         "/parallel/placement/0/0: device 5 does not exist"},
    };
    return cr_make_param_array(struct weird_case, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(struct weird_case *c, plan, weird_inputs_fail_cleanly)
{
    load_fails(c->json, c->needle);
}

Test(plan, deep_nesting_and_big_arrays)
{
    size_t depth = 100000;
    char *s = malloc(2 * depth + 64);
    size_t n = (size_t)sprintf(s, "{\"model\": ");
    for (size_t i = 0; i < depth; i++) s[n++] = '[';
    for (size_t i = 0; i < depth; i++) s[n++] = ']';
    s[n++] = '}';
    s[n] = '\0';
    load_fails(s, "t.json:1:");
    free(s);

    /* 200,000 layers: over the cap, refused without building them. */
    size_t count = 200000;
    s = malloc(count * 20 + 128);
    n = (size_t)sprintf(s, "{\"model\": {\"input\": [4], \"layers\": [");
    for (size_t i = 0; i < count; i++) n += (size_t)sprintf(s + n, "%s{\"type\":\"relu\"}", i ? "," : "");
    sprintf(s + n, "]}}");
    load_fails(s, "/model/layers: 200000 layers: at most 4096 (what the planner partitions in seconds)");
    free(s);
    load_fails("{\"model\": {\"preset\": \"gpt\", \"layers\": 5000}}", "/model/layers");

    /* The "got" part of a message stays short. */
    load_fails("{\"model\": {\"preset\": \"gpt\", \"heads\": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,"
               "21,22,23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48,49,50]}}",
               "...");
    cr_assert_lt(strlen(cdp_last_error()), 300);
}

Test(plan, free_null_is_a_noop)
{
    cdp_plan_free(NULL);
}

/* /train/recompute: "auto" unless given; each mode by name; anything else
 * names the key and the choices. */
Test(plan, recompute_key)
{
    struct cdp_plan *p = NULL;
    cr_assert_eq(cdp_plan_load_string("{\"model\": {\"preset\": \"gpt2\"}}", "t.json", NULL, &p), CDP_OK, "%s",
                 cdp_last_error());
    cr_assert(p->train.recompute_auto);
    cdp_plan_free(p);
    static const char *const names[] = {"none", "selective", "full"};
    for (int i = 0; i < 3; i++) {
        char text[256];
        snprintf(text, sizeof text, "{\"model\": {\"preset\": \"gpt2\"}, \"train\": {\"recompute\": \"%s\"}}",
                 names[i]);
        p = NULL;
        cr_assert_eq(cdp_plan_load_string(text, "t.json", NULL, &p), CDP_OK, "%s", cdp_last_error());
        cr_assert(!p->train.recompute_auto);
        cr_assert_eq((int)p->train.recompute, i);
        cr_assert_str_eq(cdp_recompute_name(p->train.recompute), names[i]);
        char *json = NULL;
        cr_assert_eq(cdp_plan_to_json(p, &json), CDP_OK);
        char want[64];
        snprintf(want, sizeof want, "\"recompute\": \"%s\"", names[i]);
        cr_assert(strstr(json, want), "%s", json);
        free(json);
        cdp_plan_free(p);
    }
    p = NULL;
    cr_assert_eq(cdp_plan_load_string("{\"model\": {\"preset\": \"gpt2\"}, \"train\": {\"recompute\": true}}",
                                      "t.json", NULL, &p), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "t.json: /train/recompute: expected one of \"none\", \"selective\", \"full\", "
                                       "\"auto\""), "%s", cdp_last_error());
}

/* /parallel/zero: "auto" unless given; 0 or 1; 2 is not there yet and says
 * so. */
/* A validated value must not hang the planner: the context is at most 2^20
 * (attention's T x T state beyond it fits no device), for a GPT and for an
 * embedding layer, named by key. */
Test(plan, context_has_a_limit_named_by_its_key)
{
    struct cdp_plan *p = NULL;
    cr_assert_eq(cdp_plan_load_string("{\"model\": {\"preset\": \"gpt\", \"context\": 2147483647}}", "t.json", NULL,
                                      &p), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "t.json: /model/context: expected a positive integer no larger than 1048576"),
              "%s", cdp_last_error());
    p = NULL;
    cr_assert_eq(cdp_plan_load_string("{\"model\": {\"input\": [4], \"layers\": [{\"type\": \"embedding\", \"vocab\": 8, "
                                      "\"dim\": 4, \"context\": 2000000}]}}", "t.json", NULL, &p),
                 CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "/model/layers/0/context") && strstr(cdp_last_error(), "1048576"), "%s",
              cdp_last_error());
    p = NULL;
    cr_assert_eq(cdp_plan_load_string("{\"model\": {\"preset\": \"gpt\", \"context\": 1048576}}", "t.json", NULL, &p),
                 CDP_OK, "%s", cdp_last_error());
    cdp_plan_free(p);
}

/* Sizes past the limits that keep every size computation in 64 bits (issue 18):
 * each an error naming its key, never an overflow (UBSan runs this suite). */
struct limit_case {
    char json[300];
    char needle[120];
};

ParameterizedTestParameters(plan, sizes_past_their_limits_name_their_key)
{
    static struct limit_case cases[] = {
        /* a micro-batch's input past 2^40 elements */
        {"{\"model\": {\"preset\": \"mlp\", \"input\": [2147483647], \"hidden\": [8], \"classes\": 2}, "
         "\"train\": {\"micro_batch\": 2147483647}}",
         "/model/layers/0: the linear's input [2147483647] holds more than 2^40 elements in a micro-batch of "
         "2147483647"},
        {"{\"model\": {\"preset\": \"gpt\", \"context\": 1048576, \"embed\": 1048576, \"heads\": 1}, "
         "\"train\": {\"micro_batch\": 2}}",
         "/model: the embedding's output [1048576, 1048576] holds more than 2^40"},
        /* a layer's parameters past 2^40, the model's past 2^44 */
        {"{\"model\": {\"preset\": \"gpt\", \"embed\": 2147483647, \"heads\": 1, \"context\": 4}}",
         "/model: the transformer_block has more than 2^40 parameters; one layer may have at most 2^40"},
        {"{\"model\": {\"preset\": \"gpt\", \"embed\": 131072, \"heads\": 1, \"context\": 4, \"layers\": 4096}}",
         "/model: the model has more than 2^44 parameters (17.6 trillion) up to this transformer_block"},
        /* rows past what the kernels index with int */
        {"{\"model\": {\"input\": [1073741824, 2], \"layers\": [{\"type\": \"linear\", \"out\": 2}]}, "
         "\"train\": {\"micro_batch\": 4}}",
         "/model/layers/0: the linear's input [1073741824, 2] has 1073741824 rows a sample"},
        /* attention over more tokens than a context may have */
        {"{\"model\": {\"input\": [2097152, 2], \"layers\": [{\"type\": \"attention\", \"heads\": 1}]}}",
         "/model/layers/0: the attention's input has 2097152 tokens a sample; attention takes at most 1048576"},
        /* a convolution whose im2col scratch overflows 64 bits */
        {"{\"model\": {\"input\": [1, 1, 1], \"layers\": [{\"type\": \"conv2d\", \"out\": 1, \"kernel\": 32768, "
         "\"padding\": 32768}]}}",
         "/model/layers/0: the conv2d's scratch holds more than 2^60 elements"},
        /* micro-batches per replica */
        {"{\"model\": {\"preset\": \"gpt\"}, \"parallel\": {\"micro_batches\": 4097}}",
         "/parallel/micro_batches: expected a positive integer or \"auto\" no larger than 4096"},
        {"{\"model\": {\"preset\": \"gpt\"}, \"train\": {\"global_batch\": 8194}, \"parallel\": {\"replicas\": 2}}",
         "/train/global_batch: 8194 gives each of /parallel/replicas 2 4097 micro-batches"},
    };
    return cr_make_param_array(struct limit_case, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(struct limit_case *c, plan, sizes_past_their_limits_name_their_key)
{
    load_fails(c->json, c->needle);
}

Test(plan, sizes_at_their_limits_load)
{
    /* the largest of each still loads: context 2^20 (one head of [2^20, 2^20]
     * attention state is priced by the fit, not refused here), 4096
     * micro-batches, a device count whose product with ranks_per_device
     * overflows 64 bits */
    cdp_plan_free(load_ok("{\"model\": {\"preset\": \"gpt\", \"context\": 1048576, \"heads\": 16, \"embed\": 64}, "
                          "\"train\": {\"micro_batch\": 16}}"));
    cdp_plan_free(load_ok("{\"model\": {\"preset\": \"gpt\"}, \"parallel\": {\"micro_batches\": 4096}}"));
    cdp_plan_free(load_ok("{\"model\": {\"preset\": \"gpt\"}, \"cluster\": {\"backend\": \"cuda\", \"nodes\": "
                          "2147483647, \"devices\": 2147483647, \"ranks_per_device\": 64}}"));
}

Test(plan, zero_key)
{
    struct cdp_plan *p = NULL;
    cr_assert_eq(cdp_plan_load_string("{\"model\": {\"preset\": \"gpt2\"}}", "t.json", NULL, &p), CDP_OK, "%s",
                 cdp_last_error());
    cr_assert_eq(p->parallel.zero, CDP_AUTO);
    cdp_plan_free(p);
    p = NULL;
    cr_assert_eq(cdp_plan_load_string("{\"model\": {\"preset\": \"gpt2\"}, \"parallel\": {\"zero\": 1}}", "t.json", NULL,
                                      &p), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(p->parallel.zero, 1);
    char *json = NULL;
    cr_assert_eq(cdp_plan_to_json(p, &json), CDP_OK);
    cr_assert(strstr(json, "\"zero\": 1"), "%s", json);
    free(json);
    cdp_plan_free(p);
    p = NULL;
    cr_assert_eq(cdp_plan_load_string("{\"model\": {\"preset\": \"gpt2\"}, \"parallel\": {\"zero\": 2}}", "t.json", NULL,
                                      &p), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(p->parallel.zero, 2);
    cr_assert_eq(cdp_plan_to_json(p, &json), CDP_OK);
    cr_assert(strstr(json, "\"zero\": 2"), "%s", json);
    free(json);
    cr_assert(cdp_plan_zero2_allowed(p, NULL, 0));
    cdp_plan_free(p);
    /* ZeRO-2 reduces after every backward: the replicas must run the same micro-batches */
    p = NULL;
    cr_assert_eq(cdp_plan_load_string("{\"model\": {\"preset\": \"gpt2\"}, \"parallel\": {\"replicas\": 2, "
                                      "\"micro_batches\": 4, \"balance\": [5, 3], \"zero\": 2}}",
                                      "t.json", NULL, &p),
                 CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "t.json: /parallel/zero: 2 (ZeRO-2) reduces the gradients after every backward, "
                                       "so the replicas must run the same micro-batches; /parallel/balance gives shares "
                                       "5 and 3"),
              "%s", cdp_last_error());
    p = NULL;
    cr_assert_eq(cdp_plan_load_string("{\"model\": {\"preset\": \"gpt2\"}, \"parallel\": {\"rebalance_every\": 10, "
                                      "\"zero\": 2}}", "t.json", NULL, &p),
                 CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "/parallel/rebalance_every 10 moves them"), "%s", cdp_last_error());
    p = NULL;
    cr_assert_eq(cdp_plan_load_string("{\"model\": {\"preset\": \"gpt2\"}, \"parallel\": {\"balance\": [4, 4], "
                                      "\"replicas\": 2, \"micro_batches\": 4, \"zero\": 2}}", "t.json", NULL, &p),
                 CDP_OK, "equal shares are fine: %s", cdp_last_error());
    cdp_plan_free(p);
    p = NULL;
    cr_assert_eq(cdp_plan_load_string("{\"model\": {\"preset\": \"gpt2\"}, \"parallel\": {\"rebalance_every\": 10}}",
                                      "t.json", NULL, &p), CDP_OK, "%s", cdp_last_error());
    cr_assert_not(cdp_plan_zero2_allowed(p, NULL, 0), "auto does not consider 2 when replicas are rebalanced");
    cdp_plan_free(p);
    p = NULL;
    cr_assert_eq(cdp_plan_load_string("{\"model\": {\"preset\": \"gpt2\"}, \"parallel\": {\"zero\": 3}}", "t.json", NULL,
                                      &p), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "/parallel/zero"), "%s", cdp_last_error());
}

/* data.path / data.val_path: a file, a list, a glob (sorted, expanded in the
 * resolved plan, which loads back the same). */
Test(plan, data_paths_take_lists_and_globs)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    char *real = realpath(dir, NULL);
    cdp_test_write_file(dir, "s_train_002.bin", "x");
    cdp_test_write_file(dir, "s_train_001.bin", "x");
    cdp_test_write_file(dir, "s_val_000.bin", "x");
    cdp_test_write_file(dir, "extra.bin", "x");
    struct cdp_plan *p = NULL;
    const char *json = "{\"model\": {\"preset\": \"gpt\"}, \"data\": {\"source\": \"tokens\", \"path\": "
                       "[\"s_train_*.bin\", \"extra.bin\"], \"val_path\": \"s_val_*.bin\"}}";
    cr_assert_eq(cdp_plan_load_string(json, "p.json", dir, &p), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(p->data.n_paths, 3);
    cr_assert_eq(p->data.n_val_paths, 1);
    char want[PATH_MAX + 32];
    snprintf(want, sizeof want, "%s/s_train_001.bin", real);
    cr_assert_str_eq(p->data.paths[0], want);
    cr_assert_str_eq(p->data.path, want);
    snprintf(want, sizeof want, "%s/s_train_002.bin", real);
    cr_assert_str_eq(p->data.paths[1], want);
    snprintf(want, sizeof want, "%s/extra.bin", real);
    cr_assert_str_eq(p->data.paths[2], want);
    snprintf(want, sizeof want, "%s/s_val_000.bin", real);
    cr_assert_str_eq(p->data.val_paths[0], want);
    char *out = NULL;
    cr_assert_eq(cdp_plan_to_json(p, &out), CDP_OK, "%s", cdp_last_error());
    struct cdp_plan *q = NULL;
    cr_assert_eq(cdp_plan_load_string(out, "resolved.json", "/", &q), CDP_OK, "%s\n%s", cdp_last_error(), out);
    cr_assert_eq(q->data.n_paths, 3);
    for (int i = 0; i < 3; i++) cr_assert_str_eq(q->data.paths[i], p->data.paths[i]);
    cr_assert_str_eq(q->data.val_paths[0], p->data.val_paths[0]);
    free(out);
    cdp_plan_free(q);
    cdp_plan_free(p);
    free(real);

    static const struct {
        const char *data, *msg;
    } bad[] = {
        {"{\"source\": \"tokens\", \"path\": \"none_*.bin\"}", "/data/path: the pattern \""},
        {"{\"source\": \"tokens\", \"path\": []}", "/data/path: expected a file path, a glob pattern or a non-empty "
                                               "list of them"},
        {"{\"source\": \"tokens\", \"path\": [\"extra.bin\", 3]}", "/data/path/1: expected a file path"},
        {"{\"source\": \"tokens\", \"path\": [\"extra.bin\", \"gone.bin\"]}", "/data/path/1: cannot open"},
        {"{\"source\": \"synthetic\", \"val_path\": \"extra.bin\"}", "/data/val_path: only /data/source \"text\" and "
                                                                    "\"tokens\" take validation files"},
        {"{\"source\": \"tokens\", \"path\": \"extra.bin\", \"val_path\": \"nope*\"}", "/data/val_path: the pattern"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char plan[512];
        snprintf(plan, sizeof plan, "{\"model\": {\"preset\": \"gpt\"}, \"data\": %s}", bad[i].data);
        p = NULL;
        cr_assert_eq(cdp_plan_load_string(plan, "p.json", dir, &p), CDP_ERR_INVALID, "%s", plan);
        cr_assert(strstr(cdp_last_error(), bad[i].msg), "%s\ngot: %s\nwant: %s", plan, cdp_last_error(), bad[i].msg);
        cr_assert_null(p);
    }
}

/* ---- learning-rate schedule and weight-decay groups --------------------------- */

Test(plan, lr_schedule_and_no_decay_defaults)
{
    struct cdp_plan *p = load_ok("{\"model\": {\"preset\": \"gpt\"}}");
    cr_assert_eq(p->train.lr_schedule.type, CDP_LR_CONSTANT);
    cr_assert_eq(p->train.lr_schedule.warmup_steps, 0);
    cr_assert_eq(p->train.optimizer.no_decay, CDP_NO_DECAY_DEFAULT);
    cdp_plan_free(p);
    p = load_ok("{\"model\": {\"preset\": \"gpt\"}, \"train\": {\"steps\": 50, \"optimizer\": {\"no_decay\": []}, "
                "\"lr_schedule\": {\"type\": \"cosine\", \"warmup_steps\": 5, \"min_lr\": 1e-5}}}");
    cr_assert_eq(p->train.optimizer.no_decay, 0u);
    cr_assert_eq(p->train.lr_schedule.type, CDP_LR_COSINE);
    cr_assert_eq(p->train.lr_schedule.warmup_steps, 5);
    cr_assert_eq(p->train.lr_schedule.min_lr, 1e-5);
    cdp_plan_free(p);
}

struct lr_bad {
    char train[200];
    char error[240];
};

ParameterizedTestParameters(plan, lr_schedule_errors_name_the_key)
{
    static struct lr_bad cases[] = {
        {"\"lr_schedule\": \"cosine\"", "t.json: /train/lr_schedule: expected an object or null, got \"cosine\""},
        {"\"lr_schedule\": {\"type\": \"cosin\"}",
         "t.json: /train/lr_schedule/type: expected one of \"constant\", \"cosine\", \"linear\", \"wsd\", got "
         "\"cosin\" (did you mean \"cosine\"?)"},
        {"\"lr_schedule\": {\"warmup\": 10}", "t.json: /train/lr_schedule/warmup: unknown key (did you mean"},
        {"\"lr_schedule\": {\"warmup_steps\": -1}",
         "t.json: /train/lr_schedule/warmup_steps: expected a non-negative integer, got -1"},
        {"\"lr_schedule\": {\"warmup_steps\": 11}", "t.json: /train/lr_schedule/warmup_steps: 11 is more than "
         "/train/steps 10"},
        {"\"lr_schedule\": {\"type\": \"cosine\", \"warmup_steps\": 10}",
         "t.json: /train/lr_schedule/warmup_steps: 10 leaves no step for the cosine decay: expected fewer than "
         "/train/steps 10"},
        {"\"lr_schedule\": {\"min_lr\": 0.1}", "t.json: /train/lr_schedule/min_lr: unknown key for "
         "/train/lr_schedule/type \"constant\""},
        {"\"lr_schedule\": {\"type\": \"linear\", \"min_lr\": 0.1}",
         "t.json: /train/lr_schedule/min_lr: 0.1 is above /train/optimizer/lr 0.0003"},
        {"\"lr_schedule\": {\"type\": \"linear\", \"min_lr\": -1e-5}",
         "t.json: /train/lr_schedule/min_lr: expected a non-negative number"},
        {"\"lr_schedule\": {\"type\": \"cosine\", \"decay_steps\": 3}",
         "t.json: /train/lr_schedule/decay_steps: unknown key for /train/lr_schedule/type \"cosine\""},
        {"\"lr_schedule\": {\"type\": \"wsd\"}", "t.json: /train/lr_schedule/decay_steps: missing; \"wsd\" decays "
         "over the last decay_steps steps"},
        {"\"lr_schedule\": {\"type\": \"wsd\", \"warmup_steps\": 4, \"decay_steps\": 7}",
         "t.json: /train/lr_schedule/decay_steps: 7 does not fit after warmup_steps 4 within /train/steps 10: "
         "expected at most 6"},
        {"\"lr_schedule\": {\"type\": \"wsd\", \"decay_steps\": 0}",
         "t.json: /train/lr_schedule/decay_steps: expected a positive integer, got 0"},
        {"\"optimizer\": {\"no_decay\": \"bias\"}", "t.json: /train/optimizer/no_decay: expected a list of "
         "parameter groups"},
        {"\"optimizer\": {\"no_decay\": [\"bias\", \"norms\"]}",
         "t.json: /train/optimizer/no_decay/1: expected one of \"weight\", \"embedding\", \"bias\", \"norm\", got "
         "\"norms\" (did you mean \"norm\"?)"},
        {"\"optimizer\": {\"no_decay\": [\"bias\", \"bias\"]}",
         "t.json: /train/optimizer/no_decay/1: \"bias\" is listed twice"},
    };
    return cr_make_param_array(struct lr_bad, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(struct lr_bad *c, plan, lr_schedule_errors_name_the_key)
{
    char json[512];
    snprintf(json, sizeof json, "{\"model\": {\"preset\": \"gpt\"}, \"train\": {\"steps\": 10, %s}}", c->train);
    load_fails(json, c->error);
}

/* /parallel/tensor: a positive count or "auto", emitted back; with t above
 * 1 every layer must split or pass a slice through, else the layer is named. */
#define SPLITS(l1, l2, l3, t)                                                                                 \
    "{\"model\": {\"input\": [8], \"layers\": [" l1 ", " l2 ", " l3 "]}, \"parallel\": {\"tensor\": " t "}}"
#define COL "{\"type\": \"linear\", \"out\": 10, \"split\": \"column\"}"
#define ROW "{\"type\": \"linear\", \"out\": 4, \"split\": \"row\"}"

/* /parallel/sequence_parallel: off by default, written back, and refused
 * naming the key where it cannot run (tensor 1, a model other than a GPT or
 * Llama preset, a context the group does not divide); with tensor "auto" true is
 * the planner's to apply at each t above 1 (sequence_parallel_auto_values). */
#define SP_GPT(ctx, t) \
    "{\"model\": {\"preset\": \"gpt\", \"heads\": 4, \"embed\": 32, \"context\": " ctx "}, \"parallel\": " \
    "{\"tensor\": " t ", \"sequence_parallel\": true}}"

Test(plan, sequence_parallel_key)
{
    struct cdp_plan *p = load_ok("{\"model\": {\"preset\": \"gpt\"}, \"parallel\": {\"tensor\": 2}}");
    cr_assert(!p->parallel.sequence_parallel && !p->model.seq_parallel);
    char *json = NULL;
    cr_assert_eq(cdp_plan_to_json(p, &json), CDP_OK);
    cr_assert(strstr(json, "\"sequence_parallel\": false"), "%s", json);
    free(json);
    cdp_plan_free(p);
    p = load_ok(SP_GPT("64", "4"));
    cr_assert(p->parallel.sequence_parallel && p->model.seq_parallel);
    cr_assert_eq(cdp_plan_to_json(p, &json), CDP_OK);
    cr_assert(strstr(json, "\"sequence_parallel\": true"), "%s", json);
    free(json);
    cdp_plan_free(p);
    p = load_ok("{\"model\": {\"preset\": \"llama\", \"heads\": 4, \"kv_heads\": 2, \"dim\": 16, \"hidden\": 24}, "
                "\"parallel\": {\"tensor\": 2, \"sequence_parallel\": true}}");
    cr_assert(p->parallel.sequence_parallel && p->model.seq_parallel, "a Llama preset runs sequence parallel");
    cdp_plan_free(p);
    static const struct {
        const char *plan, *error;
    } bad[] = {
        {SP_GPT("64", "1"), "t.json: /parallel/sequence_parallel: true needs /parallel/tensor above 1 or \"auto\""},
        {SP_GPT("30", "4"), "t.json: /parallel/sequence_parallel: true needs /model/context 30 to be a multiple of "
                            "/parallel/tensor 4"},
        {SPLITS(COL, "{\"type\": \"relu\"}", ROW, "2, \"sequence_parallel\": true"),
         "t.json: /parallel/sequence_parallel: true runs the GPT and Llama presets only today, not an explicit "
         "layer list"},
        {"{\"model\": {\"preset\": \"gpt\"}, \"parallel\": {\"tensor\": 2, \"sequence_parallel\": 1}}",
         "t.json: /parallel/sequence_parallel: expected true, false or \"auto\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p = NULL;
        cr_assert_eq(cdp_plan_load_string(bad[i].plan, "t.json", NULL, &p), CDP_ERR_INVALID, "%s", bad[i].plan);
        cr_assert(strstr(cdp_last_error(), bad[i].error), "got: %s\nwant: %s", cdp_last_error(), bad[i].error);
    }
}


/* /parallel/sequence_parallel "auto", and true with tensor "auto": kept for
 * the planner (the units not sequence parallel until it decides), written
 * back as given; refused where true would be (tensor 1, a Llama preset, a
 * layer list), naming the key and the value. */
#define SP_VALUE(t, v)                                                                                        \
    "{\"model\": {\"preset\": \"gpt\", \"heads\": 4, \"embed\": 32, \"context\": 64}, \"parallel\": " \
    "{\"tensor\": " t ", \"sequence_parallel\": " v "}}"

Test(plan, sequence_parallel_auto_values)
{
    static const char *const tensors[] = {"\"auto\"", "4"};
    for (int i = 0; i < 2; i++) {
        char text[512];
        snprintf(text, sizeof text, SP_VALUE("%s", "\"auto\""), tensors[i]);
        struct cdp_plan *p = load_ok(text);
        cr_expect(p->parallel.sequence_parallel_auto && !p->parallel.sequence_parallel && !p->model.seq_parallel);
        char *json = NULL;
        cr_assert_eq(cdp_plan_to_json(p, &json), CDP_OK);
        cr_expect(strstr(json, "\"sequence_parallel\": \"auto\""), "%s", json);
        free(json);
        cdp_plan_free(p);
    }
    /* true at tensor "auto": on, for the planner to apply at t above 1 (the units wait for its t) */
    struct cdp_plan *p = load_ok(SP_VALUE("\"auto\"", "true"));
    cr_expect(p->parallel.sequence_parallel && !p->parallel.sequence_parallel_auto && !p->model.seq_parallel);
    char *json = NULL;
    cr_assert_eq(cdp_plan_to_json(p, &json), CDP_OK);
    cr_expect(strstr(json, "\"sequence_parallel\": true"), "%s", json);
    free(json);
    cdp_plan_free(p);
    static const struct {
        const char *plan, *error;
    } bad[] = {
        {SP_VALUE("1", "\"auto\""),
         "t.json: /parallel/sequence_parallel: \"auto\" needs /parallel/tensor above 1 or \"auto\""},
        {SPLITS(COL, "{\"type\": \"relu\"}", ROW, "\"auto\", \"sequence_parallel\": \"auto\""),
         "t.json: /parallel/sequence_parallel: \"auto\" runs the GPT and Llama presets only today, not an explicit "
         "layer list"},
        {SPLITS(COL, "{\"type\": \"relu\"}", ROW, "\"auto\", \"sequence_parallel\": true"),
         "t.json: /parallel/sequence_parallel: true runs the GPT and Llama presets only today, not an explicit "
         "layer list"},
        {SP_VALUE("2", "\"on\""), "t.json: /parallel/sequence_parallel: expected true, false or \"auto\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p = NULL;
        cr_assert_eq(cdp_plan_load_string(bad[i].plan, "t.json", NULL, &p), CDP_ERR_INVALID, "%s", bad[i].plan);
        cr_expect(strstr(cdp_last_error(), bad[i].error), "got: %s\nwant: %s", cdp_last_error(), bad[i].error);
    }
}

/* /parallel/comm_dtype: fp32 by default; "bf16" for both kinds of collective,
 * or an object naming each; written back so that planned.json reloads it;
 * bad values refused naming the key. */
#define CD_GPT(v) "{\"model\": {\"preset\": \"gpt\"}, \"parallel\": {\"tensor\": 2, \"comm_dtype\": " v "}}"

static void comm_dtype_round_trip(const char *json, int tensor, int gradients, const char *written)
{
    struct cdp_plan *p = load_ok(json);
    cr_assert_eq(p->parallel.comm_bf16_tensor, tensor, "%s", json);
    cr_assert_eq(p->parallel.comm_bf16_gradients, gradients, "%s", json);
    char *out = NULL;
    cr_assert_eq(cdp_plan_to_json(p, &out), CDP_OK);
    cr_assert(strstr(out, written), "%s\nwant: %s", out, written);
    struct cdp_plan *q = load_ok(out); /* what is written loads back the same */
    cr_assert_eq(q->parallel.comm_bf16_tensor, tensor);
    cr_assert_eq(q->parallel.comm_bf16_gradients, gradients);
    free(out);
    cdp_plan_free(q);
    cdp_plan_free(p);
}

Test(plan, comm_dtype_key)
{
    comm_dtype_round_trip("{\"model\": {\"preset\": \"gpt\"}}", 0, 0, "\"comm_dtype\": \"fp32\"");
    comm_dtype_round_trip(CD_GPT("\"fp32\""), 0, 0, "\"comm_dtype\": \"fp32\"");
    comm_dtype_round_trip(CD_GPT("\"bf16\""), 1, 1, "\"comm_dtype\": \"bf16\"");
    comm_dtype_round_trip(CD_GPT("{\"tensor\": \"bf16\"}"), 1, 0, "\"gradients\": \"fp32\"");
    comm_dtype_round_trip(CD_GPT("{\"gradients\": \"bf16\"}"), 0, 1, "\"gradients\": \"bf16\"");
    comm_dtype_round_trip(CD_GPT("{\"tensor\": \"bf16\", \"gradients\": \"bf16\"}"), 1, 1, "\"comm_dtype\": \"bf16\"");
    comm_dtype_round_trip(CD_GPT("{}"), 0, 0, "\"comm_dtype\": \"fp32\"");
    static const struct {
        const char *plan, *error;
    } bad[] = {
        {CD_GPT("\"fp16\""), "t.json: /parallel/comm_dtype"},
        {CD_GPT("\"bf17\""), "did you mean \"bf16\""},
        {CD_GPT("16"), "t.json: /parallel/comm_dtype: expected \"fp32\", \"bf16\" or {\"tensor\": ..., \"gradients\": "
                       "...}"},
        {CD_GPT("{\"tensor\": \"int8\"}"), "t.json: /parallel/comm_dtype/tensor"},
        {CD_GPT("{\"gradient\": \"bf16\"}"), "t.json: /parallel/comm_dtype"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct cdp_plan *p = NULL;
        cr_assert_eq(cdp_plan_load_string(bad[i].plan, "t.json", NULL, &p), CDP_ERR_INVALID, "%s", bad[i].plan);
        cr_assert(strstr(cdp_last_error(), bad[i].error), "got: %s\nwant: %s", cdp_last_error(), bad[i].error);
    }
    /* the unknown key says which it might be */
    struct cdp_plan *p = NULL;
    cr_assert_eq(cdp_plan_load_string(CD_GPT("{\"gradient\": \"bf16\"}"), "t.json", NULL, &p), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "gradients"), "%s", cdp_last_error());
}

Test(plan, tensor_key)
{
    struct cdp_plan *p = load_ok("{\"model\": {\"preset\": \"mlp\"}}");
    cr_assert_eq(p->parallel.tensor, 1);
    cdp_plan_free(p);
    p = load_ok("{\"model\": {\"input\": [8], \"layers\": [{\"type\": \"linear\", \"out\": 16}, "
                "{\"type\": \"silu\"}, {\"type\": \"linear\", \"out\": 4}]}, \"parallel\": {\"tensor\": 4}}");
    cr_assert_eq(p->parallel.tensor, 4);
    char *json = NULL;
    cr_assert_eq(cdp_plan_to_json(p, &json), CDP_OK);
    cr_assert(strstr(json, "\"tensor\": 4"), "%s", json);
    free(json);
    cdp_plan_free(p);
    p = load_ok("{\"model\": {\"preset\": \"gpt\"}, \"parallel\": {\"tensor\": \"auto\"}}");
    cr_assert_eq(p->parallel.tensor, CDP_AUTO);
    cdp_plan_free(p);
    /* splits load, pair and are written back; at t = 1 they are whole */
    p = load_ok(SPLITS(COL, "{\"type\": \"gelu\"}", ROW, "2"));
    cr_assert_eq(p->model.layer_list[0].split, CDP_TSPLIT_COLUMN);
    cr_assert_eq(p->model.layer_list[2].split, CDP_TSPLIT_ROW);
    cr_assert_eq(cdp_plan_to_json(p, &json), CDP_OK);
    cr_assert(strstr(json, "\"split\": \"column\"") && strstr(json, "\"split\": \"row\""), "%s", json);
    free(json);
    cdp_plan_free(p);
    cdp_plan_free(load_ok(SPLITS(COL, "{\"type\": \"relu\"}", ROW, "\"auto\"")));
    /* a vocab-parallel embedding at t = 4 of a vocabulary 4 does not divide: its slices are padded */
    cdp_plan_free(load_ok("{\"model\": {\"input\": [6], \"layers\": [{\"type\": \"embedding\", \"vocab\": 37, "
                          "\"dim\": 8}, {\"type\": \"linear\", \"out\": 5}], \"loss\": \"cross_entropy\"}, "
                          "\"parallel\": {\"tensor\": 4}}"));
    /* a list's attention splits by heads */
    cdp_plan_free(load_ok("{\"model\": {\"input\": [4, 16], \"layers\": [{\"type\": \"layernorm\"}, {\"type\": "
                          "\"attention\", \"heads\": 4}, {\"type\": \"linear\", \"out\": 5}]}, \"parallel\": "
                          "{\"tensor\": 4}}"));
    /* blocks split by heads, norms and the GPT embedding and head replicated (docs/parallelism.md) */
    cdp_plan_free(load_ok("{\"model\": {\"preset\": \"gpt\", \"heads\": 4, \"embed\": 32}, \"parallel\": {\"tensor\": 4}}"));
    cdp_plan_free(load_ok("{\"model\": {\"preset\": \"llama\", \"heads\": 4, \"kv_heads\": 2, \"dim\": 16, "
                          "\"hidden\": 24}, \"parallel\": {\"tensor\": 2}}"));
    cdp_plan_free(load_ok(SPLITS("{\"type\": \"linear\", \"out\": 16}", "{\"type\": \"layernorm\"}",
                                 "{\"type\": \"linear\", \"out\": 4}", "2")));
    static const struct {
        const char *plan, *error;
    } bad[] = {
        {"{\"model\": {\"preset\": \"mlp\"}, \"parallel\": {\"tensor\": 0}}",
         "t.json: /parallel/tensor: expected a positive integer or \"auto\", got 0"},
        {"{\"model\": {\"preset\": \"mlp\"}, \"parallel\": {\"tensor\": 2048}}", "t.json: /parallel/tensor"},
        {"{\"model\": {\"preset\": \"mlp\"}, \"parallel\": {\"tensr\": 2}}",
         "t.json: /parallel/tensr: unknown key (did you mean \"tensor\"?)"},
        {"{\"model\": {\"preset\": \"gpt\", \"heads\": 12, \"embed\": 48}, \"parallel\": {\"tensor\": 8}}",
         "t.json: /model/heads: 12 is not a multiple of /parallel/tensor 8 (each rank of a tensor group holds heads "
         "/ tensor of every transformer_block)"},
        {"{\"model\": {\"preset\": \"llama\", \"heads\": 4, \"kv_heads\": 2, \"dim\": 16}, \"parallel\": "
         "{\"tensor\": 4}}",
         "t.json: /model/kv_heads: 2 is not a multiple of /parallel/tensor 4"},
        {"{\"model\": {\"preset\": \"llama\", \"heads\": 4, \"dim\": 16, \"hidden\": 26}, \"parallel\": "
         "{\"tensor\": 4}}",
         "t.json: /model/hidden: 26 is not a multiple of /parallel/tensor 4"},
        {"{\"model\": {\"input\": [4, 16], \"layers\": [{\"type\": \"linear\", \"out\": 16}, {\"type\": "
         "\"transformer_block\", \"heads\": 2}]}, \"parallel\": {\"tensor\": 4}}",
         "t.json: /model/layers/1/heads: 2 is not a multiple of /parallel/tensor 4"},
        {"{\"model\": {\"input\": [4, 8], \"layers\": [{\"type\": \"linear\", \"out\": 16}, {\"type\": "
         "\"flatten\"}]}, \"parallel\": {\"tensor\": 2}}",
         "t.json: /model/layers/1: flatten (layer 1) does not split over /parallel/tensor 2 yet; the layer types "
         "that run with tensor above 1 today: linear, relu, gelu, layernorm, embedding, attention, "},
        {"{\"model\": {\"input\": [4, 12], \"layers\": [{\"type\": \"layernorm\"}, {\"type\": "
         "\"attention\", \"heads\": 3}]}, \"parallel\": {\"tensor\": 2}}",
         "t.json: /model/layers/1/heads: 3 is not a multiple of /parallel/tensor 2 (each rank of a tensor group "
         "holds heads / tensor of every attention)"},
        {SPLITS(COL, "{\"type\": \"layernorm\"}", ROW, "2"),
         "t.json: /model/layers/1: layernorm gets the slice of the column split of layer 0"},
        {"{\"model\": {\"preset\": \"cnn\"}, \"parallel\": {\"tensor\": 2}}",
         "t.json: /model/preset: conv2d (layer 0) does not split"},
        {SPLITS(COL, "{\"type\": \"relu\"}", ROW, "4"),
         "t.json: /model/layers/0/out: 10 is not a multiple of /parallel/tensor 4"},
        {SPLITS("{\"type\": \"relu\"}", "{\"type\": \"linear\", \"out\": 4}", ROW, "1"),
         "t.json: /model/layers/2/split: \"row\" needs a \"column\" split linear before it"},
        {SPLITS(COL, "{\"type\": \"linear\", \"out\": 6}", ROW, "2"),
         "t.json: /model/layers/1: linear gets the slice of the column split of layer 0"},
        {SPLITS(COL, COL, ROW, "2"),
         "t.json: /model/layers/1/split: \"column\", but the slice of the column split of layer 0"},
        {SPLITS(ROW, "{\"type\": \"relu\"}", COL, "2"), "t.json: /model/layers/0/split: \"row\" needs"},
        {SPLITS("{\"type\": \"relu\"}", "{\"type\": \"relu\"}", COL, "2"),
         "t.json: /model/layers/2/split: \"column\", but its slice reaches the end of the model"},
        {SPLITS(COL, "{\"type\": \"relu\"}", "{\"type\": \"linear\", \"out\": 4, \"split\": \"rows\"}", "2"),
         "t.json: /model/layers/2/split: expected one of \"none\", \"column\", \"row\", got \"rows\" (did you mean "
         "\"row\"?)"},
        {"{\"model\": {\"preset\": \"mlp\"}, \"parallel\": {\"stages\": 2, \"replicas\": 2, \"tensor\": 2}, "
         "\"cluster\": {\"devices\": 4}}",
         "t.json: /parallel/stages: 2 stages x /parallel/replicas 2 x /parallel/tensor = 8 devices, but "
         "/cluster/nodes 1 x /cluster/devices 4 gives only 4"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p = NULL;
        cr_assert_eq(cdp_plan_load_string(bad[i].plan, "t.json", NULL, &p), CDP_ERR_INVALID, "%s", bad[i].plan);
        cr_assert(strstr(cdp_last_error(), bad[i].error), "got: %s\nwant: %s", cdp_last_error(), bad[i].error);
    }
}
