/* Hugging Face folders both ways: a tiny GPT-2 that transformers saved in
 * four shards (tests/fixtures/hf/gpt2-tiny, made by tools/hf_folders.py with
 * its loss and last logits) imported by /model/from and run by the model and
 * by the KV-cache decoder; the plan keys beside "from"; errors naming the key
 * or the file; export --format hf (shards, index, configs) read back to the
 * same bytes; generate's --stop-token and --top-p on the command line. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cdp/core.h"
#include "cdp/device.h"
#include "cdp/plan.h"
#include "harness.h"
#include "model/hf.h"
#include "model/infer.h"
#include "model/model.h"

#define T 16
#define V 64

static const char *fixture_dir(const char *name)
{
    static char path[4096];
    snprintf(path, sizeof path, "%s/%s", cdp_test_source_path("tests/fixtures/hf"), name);
    return path;
}
static const char *tiny(void) { return fixture_dir("gpt2-tiny"); }

/* A plan of the model at /model (a JSON object's text), loaded from dir. */
static cdp_status plan_of(const char *model, const char *dir, struct cdp_plan **out)
{
    char json[8192];
    snprintf(json, sizeof json, "{\"model\": %s, \"train\": {\"micro_batch\": 2}}", model);
    return cdp_plan_load_string(json, "plan.json", dir, out);
}

struct expect {
    int32_t tokens[2 * T], targets[2 * T];
    double loss;
    float last[V];
};

static void read_expect(const char *dir, struct expect *e)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/expect.json", dir);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    cr_assert(j, "%s: %s", path, err.text);
    for (int r = 0; r < 2; r++)
        for (int t = 0; t < T; t++) {
            e->tokens[r * T + t] = (int32_t)json_integer_value(json_array_get(json_array_get(json_object_get(j, "tokens"), r), t));
            e->targets[r * T + t] = (int32_t)json_integer_value(json_array_get(json_array_get(json_object_get(j, "targets"), r), t));
        }
    e->loss = json_number_value(json_object_get(j, "loss"));
    for (int v = 0; v < V; v++) e->last[v] = (float)json_number_value(json_array_get(json_object_get(j, "last_logits"), v));
    json_decref(j);
}

/* The model of plan p with its /model/weights loaded, on the CPU. */
static struct cdp_model *load(const struct cdp_plan *p, cdp_device_t *dev)
{
    struct cdp_model *m = NULL;
    cr_assert_eq(cdp_device_open(CDP_BACKEND_CPU, 0, 0, dev), CDP_OK);
    cr_assert_eq(cdp_model_create(&p->model, 0, (int)cdp_plan_model_units(p), 2, 1, 1, *dev, &m), CDP_OK, "%s",
                 cdp_last_error());
    cr_assert_eq(cdp_model_check_weights(&p->model, p->model.weights), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_model_load(m, p->model.weights), CDP_OK, "%s", cdp_last_error());
    return m;
}

/* The fixture's loss through the model, and its last logits through the
 * KV-cache decoder (the prompt at once, then one token at a time). */
static void gives_its_loss(const char *dir, const struct cdp_plan *p)
{
    struct expect e;
    read_expect(dir, &e);
    cdp_device_t dev = NULL;
    struct cdp_model *m = load(p, &dev);
    memcpy(cdp_model_input(m, 0), e.tokens, sizeof e.tokens);
    cr_assert_eq(cdp_model_forward(m, 0), CDP_OK);
    double sum = 0;
    cr_assert_eq(cdp_model_loss(m, 0, e.targets, 1.0f, &sum), CDP_OK);
    const double loss = sum / (2 * T);
    cr_assert(fabs(loss - e.loss) <= 1e-5 * e.loss, "loss %.9f, transformers %.9f", loss, e.loss);
    /* the KV-cache decoder: the prompt at once, or one token at a time, gives transformers' last logits */
    struct cdp_infer *inf = NULL;
    cr_assert_eq(cdp_infer_create(m, T, &inf), CDP_OK, "%s", cdp_last_error());
    float logits[V], step[V];
    cr_assert_eq(cdp_infer_step(inf, e.tokens, T, logits), CDP_OK, "%s", cdp_last_error());
    cdp_infer_reset(inf);
    for (int t = 0; t < T; t++) cr_assert_eq(cdp_infer_step(inf, e.tokens + t, 1, step), CDP_OK);
    cr_assert_eq(cdp_infer_position(inf), T);
    for (int v = 0; v < V; v++) {
        cr_assert(fabsf(logits[v] - e.last[v]) <= 1e-4f, "logit %d: %g, transformers %g", v, logits[v], e.last[v]);
        cr_assert(fabsf(step[v] - e.last[v]) <= 1e-4f, "logit %d one at a time: %g, transformers %g", v, step[v],
                  e.last[v]);
    }
    /* the cache is full: one more position is refused */
    cr_assert_eq(cdp_infer_step(inf, e.tokens, 1, step), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "context holds 16"), "%s", cdp_last_error());
    cdp_infer_destroy(inf);
    cdp_model_destroy(m);
    cdp_device_close(dev);
}

Test(hf, a_sharded_transformers_gpt2_gives_its_loss)
{
    char model[4400];
    snprintf(model, sizeof model, "{\"from\": \"%s\"}", tiny());
    struct cdp_plan *p = NULL;
    cr_assert_eq(plan_of(model, "/", &p), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(p->model.kind, CDP_MODEL_GPT);
    cr_assert_eq(p->model.arch, CDP_ARCH_GPT2);
    cr_assert_eq(p->model.layers, 2);
    cr_assert_eq(p->model.heads, 4);
    cr_assert_eq(p->model.embed, 32);
    cr_assert_eq(p->model.vocab, V);
    cr_assert_eq(p->model.context, T);
    cr_assert(p->model.tie_embeddings);
    cr_assert(strstr(p->model.weights, "model.safetensors.index.json"), "%s", p->model.weights);
    gives_its_loss(tiny(), p);
    cdp_plan_free(p);
}

Test(hf, a_sharded_transformers_llama_gives_its_loss)
{
    char model[4400];
    snprintf(model, sizeof model, "{\"from\": \"%s\", \"kv_heads\": 2, \"rope_theta\": 10000}",
             fixture_dir("llama-tiny"));
    struct cdp_plan *p = NULL;
    cr_assert_eq(plan_of(model, "/", &p), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(p->model.arch, CDP_ARCH_LLAMA);
    cr_assert_str_eq(p->model.preset, "llama");
    cr_assert_eq(p->model.layers, 2);
    cr_assert_eq(p->model.heads, 4);
    cr_assert_eq(p->model.kv_heads, 2);
    cr_assert_eq(p->model.embed, 32);
    cr_assert_eq(p->model.ffn_hidden, 48);
    cr_assert_eq(p->model.context, T);
    cr_assert(!p->model.tie_embeddings);
    cr_assert_float_eq(p->model.norm_eps, 1e-5, 1e-12);
    /* transformers 5's rope_parameters with llama3 scaling */
    cr_assert_float_eq(p->model.rope.theta, 10000, 1e-9);
    cr_assert_float_eq(p->model.rope.factor, 8, 1e-9);
    cr_assert_float_eq(p->model.rope.low_freq_factor, 1, 1e-9);
    cr_assert_float_eq(p->model.rope.high_freq_factor, 4, 1e-9);
    cr_assert_eq(p->model.rope.original_context, 8);
    gives_its_loss(fixture_dir("llama-tiny"), p);
    cdp_plan_free(p);
}

Test(hf, plan_keys_beside_from_may_only_shorten_the_context)
{
    char model[4400];
    struct cdp_plan *p = NULL;
    /* the same values, and a shorter context: learned positions load their first rows */
    snprintf(model, sizeof model, "{\"from\": \"%s\", \"layers\": 2, \"tie_embeddings\": true, \"context\": 8}",
             tiny());
    cr_assert_eq(plan_of(model, "/", &p), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(p->model.context, 8);
    cdp_device_t dev = NULL;
    struct cdp_model *m = load(p, &dev);
    cdp_model_destroy(m);
    cdp_device_close(dev);
    cdp_plan_free(p);
    static const struct {
        const char *keys, *words[3];
    } bad[] = {
        {"\"layers\": 3", {"/model/layers: 3", "n_layer 2", "only /model/context may differ"}},
        {"\"context\": 32", {"/model/context: 32", "n_positions 16", "a shorter one"}},
        {"\"tie_embeddings\": false", {"/model/tie_embeddings", "tie_word_embeddings 1 (true)", "config.json"}},
        {"\"weights\": \"w.safetensors\"", {"/model/weights", "not with /model/from", "safetensors the weights"}},
        {"\"preset\": \"gpt2\"", {"/model/preset", "not with /model/from", "config.json gives"}},
        {"\"hidden\": 5", {"/model/hidden", "unknown key", ""}},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(model, sizeof model, "{\"from\": \"%s\", %s}", tiny(), bad[i].keys);
        cr_assert_eq(plan_of(model, "/", &p), CDP_ERR_INVALID, "%s", bad[i].keys);
        for (int w = 0; w < 3; w++)
            cr_assert(strstr(cdp_last_error(), bad[i].words[w]), "%s: \"%s\" not in: %s", bad[i].keys, bad[i].words[w],
                      cdp_last_error());
    }
}

/* A copy of the fixture in a new folder, for breaking. */
static const char *copy_of(const char *from, const char *name)
{
    static char dir[4200];
    snprintf(dir, sizeof dir, "%s/%s", cdp_test_tmpdir(), name);
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", from, dir);
    cr_assert_eq(system(cmd), 0);
    return dir;
}
static const char *copy_tiny(const char *name) { return copy_of(tiny(), name); }

/* /model/from dir fails naming each of words. */
static void refused(const char *dir, const char *const *words, int n)
{
    char model[4400];
    snprintf(model, sizeof model, "{\"from\": \"%s\"}", dir);
    struct cdp_plan *p = NULL;
    cdp_status st = plan_of(model, "/", &p);
    if (st == CDP_OK) { /* the shards are read when the weights load */
        cdp_device_t dev = NULL;
        struct cdp_model *m = NULL;
        cr_assert_eq(cdp_device_open(CDP_BACKEND_CPU, 0, 0, &dev), CDP_OK);
        cr_assert_eq(cdp_model_create(&p->model, 0, (int)cdp_plan_model_units(p), 1, 1, 1, dev, &m), CDP_OK);
        st = cdp_model_load(m, p->model.weights);
        cdp_model_destroy(m);
        cdp_device_close(dev);
        cdp_plan_free(p);
    }
    cr_assert_neq(st, CDP_OK, "%s loaded", dir);
    for (int i = 0; i < n; i++)
        cr_assert(strstr(cdp_last_error(), words[i]), "\"%s\" not in: %s", words[i], cdp_last_error());
}

static void set_config(const char *dir, const char *key, json_t *value)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *c = json_load_file(path, 0, NULL);
    cr_assert(c);
    json_object_set_new(c, key, value);
    cr_assert_eq(json_dump_file(c, path, 0), 0);
    json_decref(c);
}

Test(hf, mismatches_name_the_key_or_the_file)
{
    const char *d = copy_tiny("arch");
    json_t *arch = json_array();
    json_array_append_new(arch, json_string("BertForMaskedLM"));
    set_config(d, "architectures", arch);
    refused(d, (const char *[]){"config.json: /architectures/0", "\"BertForMaskedLM\"", "GPT2LMHeadModel"}, 3);

    d = copy_tiny("act");
    set_config(d, "activation_function", json_string("relu"));
    refused(d, (const char *[]){"config.json: /activation_function", "\"relu\"", "gelu_new"}, 3);

    d = copy_tiny("eps");
    set_config(d, "layer_norm_epsilon", json_real(1e-6));
    refused(d, (const char *[]){"/layer_norm_epsilon", "1e-05"}, 1);

    d = copy_tiny("layers");
    json_t *c = NULL;
    char path[4400];
    snprintf(path, sizeof path, "%s/config.json", d);
    c = json_load_file(path, 0, NULL);
    json_object_del(c, "n_layer");
    json_dump_file(c, path, 0);
    json_decref(c);
    refused(d, (const char *[]){"config.json: /n_layer", "missing", "/model/layers"}, 3);

    d = copy_tiny("shard");
    snprintf(path, sizeof path, "%s/model-00002-of-00004.safetensors", d);
    cr_assert_eq(unlink(path), 0);
    refused(d, (const char *[]){"model.safetensors.index.json", "shard \"model-00002-of-00004.safetensors\"",
                                "cannot open"}, 3);

    d = copy_tiny("none");
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", d);
    cr_assert_eq(unlink(path), 0);
    refused(d, (const char *[]){"no model.safetensors", "save_pretrained"}, 2);

    /* an index that puts a tensor in the wrong shard */
    d = copy_tiny("moved");
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", d);
    c = json_load_file(path, 0, NULL);
    json_t *map = json_object_get(c, "weight_map");
    const char *first = json_string_value(json_object_get(map, "transformer.wte.weight"));
    json_object_set_new(map, "transformer.wte.weight",
                        json_string(strcmp(first, "model-00001-of-00004.safetensors") ? "model-00001-of-00004.safetensors"
                                                                                      : "model-00004-of-00004.safetensors"));
    json_dump_file(c, path, 0);
    json_decref(c);
    refused(d, (const char *[]){"/weight_map/transformer.wte.weight", "has no tensor"}, 2);

    /* Llama: a rope scaling not implemented, biases, another activation, heads that do not divide */
    d = copy_of(fixture_dir("llama-tiny"), "yarn");
    json_t *rope = json_pack("{s:s, s:f, s:f}", "rope_type", "yarn", "factor", 4.0, "rope_theta", 10000.0);
    set_config(d, "rope_parameters", rope);
    refused(d, (const char *[]){"config.json: /rope_parameters/rope_type", "\"yarn\"", "llama3"}, 3);
    d = copy_of(fixture_dir("llama-tiny"), "yarn4");
    set_config(d, "rope_parameters", json_null());
    set_config(d, "rope_scaling", json_pack("{s:s, s:f}", "type", "linear", "factor", 2.0));
    refused(d, (const char *[]){"/rope_scaling/type", "\"linear\""}, 2);
    d = copy_of(fixture_dir("llama-tiny"), "bias");
    set_config(d, "attention_bias", json_true());
    refused(d, (const char *[]){"/attention_bias", "no biases"}, 2);
    d = copy_of(fixture_dir("llama-tiny"), "gelu");
    set_config(d, "hidden_act", json_string("gelu"));
    refused(d, (const char *[]){"/hidden_act", "silu"}, 2);
    d = copy_of(fixture_dir("llama-tiny"), "kv3");
    set_config(d, "num_key_value_heads", json_integer(3));
    refused(d, (const char *[]){"/num_key_value_heads", "does not divide"}, 2);
    d = copy_of(fixture_dir("llama-tiny"), "scaling");
    set_config(d, "rope_parameters", json_pack("{s:s, s:f}", "rope_type", "llama3", "factor", 8.0));
    refused(d, (const char *[]){"/rope_parameters/low_freq_factor", "missing"}, 2);

    /* a folder that is not one */
    refused("/nonexistent-hf-folder", (const char *[]){"/model/from", "/nonexistent-hf-folder", "cannot open"}, 3);
}

static int is_file(const char *dir, const char *name)
{
    char path[8800];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* The parameters of the model at /model/from dir, as floats. */
static float *params_of(const char *dir, int64_t *n)
{
    char model[4400];
    snprintf(model, sizeof model, "{\"from\": \"%s\"}", dir);
    struct cdp_plan *p = NULL;
    cr_assert_eq(plan_of(model, "/", &p), CDP_OK, "%s", cdp_last_error());
    cdp_device_t dev = NULL;
    struct cdp_model *m = load(p, &dev);
    *n = cdp_model_param_floats(m);
    float *out = malloc((size_t)*n * 4);
    int64_t at = 0;
    for (int i = 0; i < cdp_model_tensor_count(m); i++) {
        const struct cdp_model_tensor *t = cdp_model_tensor(m, i);
        memcpy(out + at, t->data, (size_t)t->numel * 4);
        at += t->numel;
    }
    cr_assert_eq(at, *n);
    cdp_model_destroy(m);
    cdp_device_close(dev);
    cdp_plan_free(p);
    return out;
}

Test(hf, export_writes_shards_an_index_and_configs_that_read_back_the_same, .timeout = 60)
{
    const char *dir = cdp_test_tmpdir();
    char plan[4400], out[4400];
    char text[4400];
    snprintf(text, sizeof text, "{\"model\": {\"from\": \"%s\"}}\n", tiny());
    snprintf(plan, sizeof plan, "%s", cdp_test_write_file(dir, "plan.json", text));
    snprintf(out, sizeof out, "%s/exported", dir);
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"export", "--plan", plan, "--format", "hf", "--shard-size",
                                                   "30kB", "--out", out, NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cdp_test_run_free(&r);
    for (const char *const *f = (const char *[]){"config.json", "generation_config.json",
                                                  "model.safetensors.index.json", "model-00001-of-00005.safetensors",
                                                  "model-00005-of-00005.safetensors", NULL};
         *f; f++)
        cr_assert(is_file(out, *f), "%s/%s missing", out, *f);
    cr_assert(!is_file(out, "model.safetensors"));
    int64_t n = 0, n2 = 0;
    float *a = params_of(tiny(), &n), *b = params_of(out, &n2);
    cr_assert_eq(n, n2);
    cr_assert_eq(memcmp(a, b, (size_t)n * 4), 0, "the exported weights read back differently");
    free(b);
    /* config.json says the model */
    char cfg[8800];
    snprintf(cfg, sizeof cfg, "%s/config.json", out);
    json_t *c = json_load_file(cfg, 0, NULL);
    cr_assert(c);
    cr_assert_str_eq(json_string_value(json_array_get(json_object_get(c, "architectures"), 0)), "GPT2LMHeadModel");
    cr_assert_eq(json_integer_value(json_object_get(c, "n_layer")), 2);
    cr_assert_eq(json_integer_value(json_object_get(c, "n_positions")), T);
    cr_assert(json_is_true(json_object_get(c, "tie_word_embeddings")));
    json_decref(c);
    /* again in one file: the index of the sharded export goes */
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"export", "--plan", plan, "--weights", "", "--format", "hf",
                                                   "--out", out, NULL}), 0);
    cr_assert_eq(r.exit_code, 2, "an empty --weights: %s", r.err);
    cdp_test_run_free(&r);
    char weights[4400];
    snprintf(weights, sizeof weights, "%s/model.safetensors.index.json", tiny());
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"export", "--plan", plan, "--weights", weights, "--format", "hf",
                                                   "--out", out, NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cdp_test_run_free(&r);
    cr_assert(is_file(out, "model.safetensors"));
    cr_assert(!is_file(out, "model.safetensors.index.json"));
    b = params_of(out, &n2);
    cr_assert_eq(memcmp(a, b, (size_t)n * 4), 0);
    free(a);
    free(b);
    /* a Llama the same way, in shards: nothing transposed, the untied head beside the embedding */
    snprintf(text, sizeof text, "{\"model\": {\"from\": \"%s\"}}\n", fixture_dir("llama-tiny"));
    char lplan[4400], lout[4400];
    snprintf(lplan, sizeof lplan, "%s", cdp_test_write_file(dir, "llama.json", text));
    snprintf(lout, sizeof lout, "%s/llama-exported", dir);
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"export", "--plan", lplan, "--format", "hf", "--shard-size",
                                                   "30kB", "--out", lout, NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.out, "LlamaForCausalLM"), "%s", r.out);
    cdp_test_run_free(&r);
    cr_assert(is_file(lout, "model.safetensors.index.json"));
    a = params_of(fixture_dir("llama-tiny"), &n);
    b = params_of(lout, &n2);
    cr_assert_eq(n, n2);
    cr_assert_eq(memcmp(a, b, (size_t)n * 4), 0, "the exported Llama reads back differently");
    free(a);
    free(b);
    snprintf(cfg, sizeof cfg, "%s/config.json", lout);
    c = json_load_file(cfg, 0, NULL);
    cr_assert(c);
    cr_assert_str_eq(json_string_value(json_array_get(json_object_get(c, "architectures"), 0)), "LlamaForCausalLM");
    cr_assert_eq(json_integer_value(json_object_get(c, "num_key_value_heads")), 2);
    cr_assert_eq(json_integer_value(json_object_get(c, "intermediate_size")), 48);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(c, "rope_scaling"), "rope_type")), "llama3");
    cr_assert(json_is_false(json_object_get(c, "tie_word_embeddings")));
    json_decref(c);
    /* ours: one file in our names, loaded back by a plan of the same model */
    snprintf(weights, sizeof weights, "%s/ours.safetensors", dir);
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"export", "--plan", plan, "--out", weights, NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cdp_test_run_free(&r);
    cr_assert(is_file(dir, "ours.safetensors"));
}

Test(hf, export_and_generate_refuse_bad_options)
{
    static const struct {
        const char *argv[12];
        const char *word;
    } bad[] = {
        {{"export", "--weights", "w.safetensors", "--out", "x", NULL}, "--weights needs --plan"},
        {{"export", "--checkpoint", "c", "--plan", "p.json", "--out", "x", NULL}, "not both"},
        {{"export", "--checkpoint", "c", "--shard-size", "1GB", "--out", "x", NULL}, "--shard-size goes with"},
        {{"export", "--checkpoint", "c", "--format", "hf", "--shard-size", "lots", "--out", "x", NULL},
         "--shard-size: expected a size"},
        {{"generate", "--plan", "p.json", "--prompt", "a", "--top-p", "0", NULL}, "--top-p: expected a number in (0, 1]"},
        {{"generate", "--plan", "p.json", "--prompt", "a", "--top-p", "1.5", NULL}, "--top-p"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct cdp_run r;
        cr_assert_eq(cdp_test_run(&r, bad[i].argv), 0);
        cr_assert_eq(r.exit_code, 2, "%s: exit %d", bad[i].word, r.exit_code);
        cr_assert(strstr(r.err, bad[i].word), "\"%s\" not in: %s", bad[i].word, r.err);
        cdp_test_run_free(&r);
    }
}

Test(hf, generate_stops_at_the_end_of_text_token, .timeout = 60)
{
    const char *dir = cdp_test_tmpdir();
    char plan[4400], text[4400];
    snprintf(text, sizeof text, "{\"model\": {\"from\": \"%s\"}}\n", tiny());
    snprintf(plan, sizeof plan, "%s", cdp_test_write_file(dir, "plan.json", text));
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"generate", "--plan", plan, "--prompt-ids", "1,2,3", "--tokens",
                                                   "8", "--temperature", "0", "-q", NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    int ids[16], n = 0;
    for (char *s = r.out, *end; n < 16; s = end) {
        long x = strtol(s, &end, 10);
        if (end == s) break;
        ids[n++] = (int)x;
    }
    cdp_test_run_free(&r);
    cr_assert_eq(n, 11, "3 prompt ids and 8 new");
    cr_assert(ids[0] == 1 && ids[1] == 2 && ids[2] == 3);
    /* a later new id not generated before it (else the first): generation stops there, not printing it */
    int k = 4;
    for (; k < n; k++) {
        int seen = 0;
        for (int j = 3; j < k; j++) seen |= ids[j] == ids[k];
        if (!seen) break;
    }
    if (k == n) k = 3;
    char stop[16];
    snprintf(stop, sizeof stop, "%d", ids[k]);
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"generate", "--plan", plan, "--prompt-ids", "1,2,3", "--tokens",
                                                   "8", "--temperature", "0", "--stop-token", stop, "-q", NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    char want[256] = "";
    for (int j = 0; j < k; j++) snprintf(want + strlen(want), sizeof want - strlen(want), "%s%d", j ? " " : "", ids[j]);
    strcat(want, "\n");
    cr_assert_str_eq(r.out, want);
    cdp_test_run_free(&r);
}

/* A Llama read from a Hugging Face folder trains (2 stages), and its
 * checkpoint exports to a folder with the weights training wrote. */
Test(hf, an_imported_llama_trains_and_its_checkpoint_exports, .timeout = 120)
{
    const char *dir = cdp_test_tmpdir();
    char text[8192], plan[4400], out[4400], wout[4400], w[4400];
    snprintf(text, sizeof text,
             "{\"model\": {\"from\": \"%s\"},\n"
             " \"data\": {\"source\": \"synthetic\", \"seed\": 3},\n"
             " \"train\": {\"steps\": 3, \"micro_batch\": 1, \"global_batch\": 2, \"checkpoint\": {\"dir\": \"ck\"},\n"
             "           \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.01}},\n"
             " \"parallel\": {\"stages\": 2, \"replicas\": 1},\n"
             " \"cluster\": {\"backend\": \"cpu\"},\n"
             " \"output\": {\"weights\": \"w.safetensors\"}}\n",
             fixture_dir("llama-tiny"));
    snprintf(plan, sizeof plan, "%s", cdp_test_write_file(dir, "plan.json", text));
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", plan, "-q", NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cdp_test_run_free(&r);
    char ck[4400];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    snprintf(out, sizeof out, "%s/from-ckpt", dir);
    snprintf(wout, sizeof wout, "%s/from-weights", dir);
    snprintf(w, sizeof w, "%s/w.safetensors", dir);
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"export", "--checkpoint", ck, "--format", "hf", "--out", out, NULL}),
                 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.out, "LlamaForCausalLM"), "%s", r.out);
    cdp_test_run_free(&r);
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"export", "--plan", plan, "--weights", w, "--format", "hf", "--out",
                                                   wout, NULL}),
                 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cdp_test_run_free(&r);
    int64_t n = 0, n2 = 0, n0 = 0;
    float *a = params_of(out, &n), *b = params_of(wout, &n2), *start = params_of(fixture_dir("llama-tiny"), &n0);
    cr_assert_eq(n, n2);
    cr_assert_eq(n, n0);
    cr_assert_eq(memcmp(a, b, (size_t)n * 4), 0, "the checkpoint's export differs from the weights' export");
    cr_assert_neq(memcmp(a, start, (size_t)n * 4), 0, "3 steps of AdamW changed nothing");
    free(a);
    free(b);
    free(start);
}
