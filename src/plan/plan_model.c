/* The plan's /model: the GPT presets, explicit layers and their shapes, a
 * model read from a Hugging Face folder (model.from) and the Llama family. */
#include "cdp/plan.h"
#include "plan/plan_load_internal.h"

#include <errno.h>
#include <glob.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cdp/core.h"
#include "core/path.h"
#include "plan/schedule_header.h"
#include "plan/schedule_kind.h"
#include "cdp/log.h"
#include "cdp/topology_spec.h"
#include "core/json_check.h"
#include "model/hf.h"
#include "model/layer_def.h"
#include "plan/plan_internal.h"

struct gpt_preset {
    const char *name;
    int64_t vocab, context, layers, heads, embed;
};

static const struct gpt_preset gpt_presets[] = {
    {"gpt", 256, 64, 4, 4, 128},
    {"gpt2", 50257, 1024, 12, 12, 768},
    {"gpt2-medium", 50257, 1024, 24, 16, 1024},
    {"gpt2-large", 50257, 1024, 36, 20, 1280},
    {"gpt2-xl", 50257, 1024, 48, 25, 1600},
};

#define N_GPT_PRESETS ((int)(sizeof gpt_presets / sizeof gpt_presets[0]))

static const char *const preset_names[] = {"gpt", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl",
                                           "llama", "mlp", "cnn",  NULL};

static const char *const gpt_keys[] = {"preset", "vocab", "context", "layers", "heads", "embed",
                                       "tie_embeddings", "weights", "unused_tensors", NULL};

static const char *const llama_keys[] = {"preset", "vocab", "context", "layers", "heads", "kv_heads", "dim",
                                         "hidden", "multiple_of", "ffn_dim_multiplier", "rope_theta",
                                         "rope_scaling", "norm_eps", "tie_embeddings", "weights", "unused_tensors",
                                         NULL};

static const char *const mlp_keys[] = {"preset", "input", "hidden", "classes", "activation", "loss",
                                       "weights", "unused_tensors", NULL};

static const char *const cnn_keys[] = {"preset", "input", "channels", "classes", "loss", "weights",
                                       "unused_tensors", NULL};

static const char *const explicit_keys[] = {"input", "layers", "loss", "preset", "weights", "unused_tensors",
                                            NULL};

static cdp_status load_layer(struct ld *c, const json_t *v, const char *ptr, struct cdp_layer_desc *L)
{
    cdp_status st;
    int i = 0;
    char tp[CDP_JSON_PTR_CAP], who[64];
    if (!json_is_object(v)) return cdp_json_expected(&c->in, ptr, "a layer object with a \"type\"", v);
    const json_t *type = json_object_get(v, "type");
    cdp_json_ptr_key(tp, ptr, "type");
    if (!type) return cdp_json_fail(&c->in, tp, "missing; every layer needs a \"type\"");
    const char *const *names = cdp_layer_listable_names();
    if ((st = cdp_json_enum(&c->in, type, tp, names, &i))) return st;
    const struct cdp_layer_def *def = cdp_layer_def((enum cdp_layer_type)cdp_layer_find(names[i]));
    L->type = def->type;
    snprintf(who, sizeof who, "a %s layer", def->name);

    /* Unknown keys: a key of another layer type is still unknown here. */
    const char *key;
    json_t *kv;
    json_object_foreach((json_t *)v, key, kv) {
        if (!strcmp(key, "type") || cdp_json_word_index(key, def->keys) >= 0) continue;
        char kp[CDP_JSON_PTR_CAP], words[256];
        cdp_json_ptr_key(kp, ptr, key);
        const char *s = cdp_closest_word(key, def->keys);
        if (s) return cdp_json_fail(&c->in, kp, "unknown key for %s (did you mean \"%s\"?)", who, s);
        cdp_json_list_words(words, sizeof words, def->keys);
        return cdp_json_fail(&c->in, kp, "unknown key for %s (it takes %s)", who, words[0] ? words : "no settings");
    }
    L->bias = 1;
    L->causal = 1;
    return def->parse ? def->parse(&c->in, v, ptr, who, L) : CDP_OK;
}

/* Walks the layer list from the input shape: checks that each layer can take what
 * the one before gives, and counts parameters (*params = -1 when they overflow). */
cdp_status cdp_plan_check_shapes(struct ld *c, const struct cdp_model_desc *m, int64_t *params)
{
    struct cdp_shape s = {m->input_ndim, {0}};
    int64_t total = 0;
    memcpy(s.d, m->input, (size_t)m->input_ndim * sizeof s.d[0]);
    for (int i = 0; i < m->n_layers; i++) {
        const struct cdp_layer_desc *L = &m->layer_list[i];
        const struct cdp_layer_def *def = cdp_layer_def(L->type);
        char lp[CDP_JSON_PTR_CAP], why[512];
        struct cdp_shape out = s;
        snprintf(lp, sizeof lp, "/model/layers/%d", i);
        const int64_t p = def->params ? def->params(L, &s) : 0;
        if (def->shape && def->shape(L, &s, &out, why, sizeof why)) return cdp_json_fail(&c->in, lp, "%s", why);
        if (p < 0 || total < 0 || __builtin_add_overflow(total, p, &total)) total = -1;
        s = out;
    }
    *params = total;
    return CDP_OK;
}

/* The model's sizes at the plan's micro-batch (cdp_units_check_sizes), before
 * anything builds, sizes or costs its units. */
cdp_status cdp_plan_check_sizes(struct ld *c)
{
    const struct cdp_model_desc *m = &c->p->model;
    int at = 0;
    char why[512], lp[CDP_JSON_PTR_CAP];
    if (!cdp_units_check_sizes(m, c->p->train.micro_batch, &at, why, sizeof why)) return CDP_OK;
    if (m->kind == CDP_MODEL_GPT)
        return cdp_json_fail(&c->in, "/model", "%s (set by vocab, context, heads and embed, and /train/micro_batch)",
                             why);
    snprintf(lp, sizeof lp, "/model/layers/%d", at);
    return cdp_json_fail(&c->in, lp, "%s (/train/micro_batch %lld)", why, (long long)c->p->train.micro_batch);
}

static cdp_status push_layer(struct cdp_model_desc *m, struct cdp_layer_desc L)
{
    m->layer_list[m->n_layers++] = L;
    return CDP_OK;
}

static cdp_status expand_preset(struct ld *c, struct cdp_model_desc *m)
{
    int n = m->kind == CDP_MODEL_MLP ? 2 * m->n_hidden + 2 : 3 * m->n_channels + 2;
    m->layer_list = calloc((size_t)n, sizeof *m->layer_list);
    if (!m->layer_list) return cdp_fail(CDP_ERR_NOMEM, "%s: /model: out of memory", c->in.file);
    m->n_layers = 0;
    if (m->kind == CDP_MODEL_MLP) {
        if (m->input_ndim > 1) push_layer(m, (struct cdp_layer_desc){.type = CDP_LAYER_FLATTEN});
        for (int i = 0; i < m->n_hidden; i++) {
            push_layer(m, (struct cdp_layer_desc){.type = CDP_LAYER_LINEAR, .out = m->hidden[i], .bias = 1});
            push_layer(m, (struct cdp_layer_desc){
                              .type = m->activation == CDP_ACT_GELU ? CDP_LAYER_GELU : CDP_LAYER_RELU});
        }
    } else {
        for (int i = 0; i < m->n_channels; i++) {
            push_layer(m, (struct cdp_layer_desc){.type = CDP_LAYER_CONV2D, .out = m->channels[i],
                                                  .kernel = 3, .stride = 1, .padding = 1, .bias = 1});
            push_layer(m, (struct cdp_layer_desc){.type = CDP_LAYER_RELU});
            push_layer(m, (struct cdp_layer_desc){.type = CDP_LAYER_MAXPOOL2D, .kernel = 2, .stride = 2});
        }
        push_layer(m, (struct cdp_layer_desc){.type = CDP_LAYER_FLATTEN});
    }
    push_layer(m, (struct cdp_layer_desc){.type = CDP_LAYER_LINEAR, .out = m->classes, .bias = 1});
    for (int i = 0; i < m->n_layers; i++) m->layer_list[i].causal = 1;
    return CDP_OK;
}

static cdp_status get_widths(struct ld *c, const json_t *m, const char *key, int64_t **out, int *n)
{
    const json_t *v = json_object_get(m, key);
    char kp[CDP_JSON_PTR_CAP];
    size_t k = 0;
    if (!v) return CDP_OK;
    cdp_json_ptr_key(kp, "/model", key);
    if (!json_is_array(v) || json_array_size(v) > MAX_WIDTHS)
        return cdp_json_expected(&c->in, kp, "an array of positive integers", v);
    int64_t *w = calloc(json_array_size(v) + 1, sizeof *w);
    if (!w) return cdp_fail(CDP_ERR_NOMEM, "%s: %s: out of memory", c->in.file, kp);
    cdp_status st = cdp_plan_int_array(c, v, kp, 0, MAX_WIDTHS, w, &k);
    if (st) {
        free(w);
        return st;
    }
    free(*out);
    *out = w;
    *n = (int)k;
    return CDP_OK;
}

static cdp_status get_input(struct ld *c, const json_t *m, size_t min_n, size_t max_n, int required,
                            struct cdp_model_desc *md)
{
    const json_t *v = json_object_get(m, "input");
    size_t n = 0;
    int64_t dims[CDP_MAX_INPUT_DIMS];
    if (!v) {
        if (required)
            return cdp_json_fail(&c->in, "/model/input",
                                 "missing; an explicit layer list needs \"input\", the shape "
                                 "of one sample (an array of 1 to 4 positive integers)");
        return CDP_OK;
    }
    cdp_status st = cdp_plan_int_array(c, v, "/model/input", min_n, max_n, dims, &n);
    if (st) return st;
    memset(md->input, 0, sizeof md->input);
    memcpy(md->input, dims, n * sizeof dims[0]);
    md->input_ndim = (int)n;
    return CDP_OK;
}
/* /model/unused_tensors, when the model has it. */
static cdp_status read_unused_tensors(struct ld *c, const json_t *m, struct cdp_model_desc *md)
{
    const json_t *unused = json_object_get(m, "unused_tensors");
    int ui = 0;
    if (!unused) return CDP_OK;
    cdp_status st = cdp_json_enum(&c->in, unused, "/model/unused_tensors", cdp_plan_unused_tensors_names, &ui);
    if (!st) md->unused_tensors = (enum cdp_unused_tensors)ui;
    return st;
}


/* /model/from: a Hugging Face model folder (model/hf.h): its config.json
 * gives the model, its safetensors the weights; the plan's own keys may only
 * agree with it, or shorten the context. */
static cdp_status load_from(struct ld *c, const json_t *m, const json_t *from, struct cdp_model_desc *md)
{
    if (!json_is_string(from) || json_string_length(from) == 0 ||
        strlen(json_string_value(from)) != json_string_length(from))
        return cdp_json_expected(&c->in, "/model/from", "a Hugging Face model folder (config.json, model.safetensors)",
                                 from);
    static const char *const clash[] = {"preset", "weights", "layers", NULL};
    for (int i = 0; clash[i]; i++) {
        const json_t *v = json_object_get(m, clash[i]);
        if (v && (i < 2 || json_is_array(v)))
            return cdp_json_fail(&c->in, i == 0 ? "/model/preset" : i == 1 ? "/model/weights" : "/model/layers",
                                 "not with /model/from: the folder's config.json gives the model and its "
                                 "safetensors the weights");
    }
    cdp_status st;
    char *dir = cdp_path_join(c->base, json_string_value(from));
    if (!dir) return cdp_fail(CDP_ERR_NOMEM, "%s: /model/from: out of memory", c->in.file);
    char *weights = NULL;
    if ((st = cdp_hf_read_config(dir, md, &weights))) {
        cdp_error_context(st, "%s: /model/from", c->in.file);
        free(dir);
        return st;
    }
    md->weights = weights;
    char config[PATH_MAX + 16];
    snprintf(config, sizeof config, "%s/config.json", dir);
    free(dir);
    if ((st = cdp_hf_plan_keys(&c->in, m, config, md))) return st;
    if ((st = read_unused_tensors(c, m, md))) return st;
    return CDP_OK;
}

/* The llama preset (docs/models.md): a small Llama by default; every size
 * can be set, the MLP's width as "hidden" or by Llama's rule from
 * "multiple_of" (256) and "ffn_dim_multiplier". */
static cdp_status load_llama(struct ld *c, const json_t *m, struct cdp_model_desc *md)
{
    cdp_status st;
    md->kind = CDP_MODEL_GPT;
    md->arch = CDP_ARCH_LLAMA;
    md->vocab = 256;
    md->context = 64;
    md->layers = 4;
    md->heads = 4;
    md->embed = 128;
    md->tie_embeddings = 0;
    md->multiple_of = 256;
    md->norm_eps = 1e-5;
    if ((st = cdp_json_check_keys(&c->in, m, "/model", llama_keys, "a llama model"))) return st;
    if ((st = cdp_json_get_int(&c->in, m, "/model", "vocab", 1, MAX_COUNT, 0, &md->vocab))) return st;
    if ((st = cdp_json_get_int(&c->in, m, "/model", "context", 1, CDP_PLAN_MAX_CONTEXT, 0, &md->context))) return st;
    if ((st = cdp_json_get_int(&c->in, m, "/model", "layers", 1, MAX_LAYERS, 0, &md->layers))) return st;
    if ((st = cdp_json_get_int(&c->in, m, "/model", "heads", 1, MAX_COUNT, 0, &md->heads))) return st;
    md->kv_heads = md->heads;
    if ((st = cdp_json_get_int(&c->in, m, "/model", "kv_heads", 1, MAX_COUNT, 0, &md->kv_heads))) return st;
    if ((st = cdp_json_get_int(&c->in, m, "/model", "dim", 1, MAX_COUNT, 0, &md->embed))) return st;
    if ((st = cdp_json_get_number(&c->in, m, "/model", "norm_eps", CDP_JSON_POSITIVE, &md->norm_eps))) return st;
    if ((st = cdp_json_get_bool(&c->in, m, "/model", "tie_embeddings", &md->tie_embeddings))) return st;
    if ((st = cdp_rope_parse(&c->in, m, "/model", &md->rope))) return st;
    if (md->embed % md->heads != 0)
        return cdp_json_fail(&c->in, "/model/dim", "%lld is not a multiple of /model/heads %lld",
                             (long long)md->embed, (long long)md->heads);
    if (md->heads % md->kv_heads != 0)
        return cdp_json_fail(&c->in, "/model/kv_heads", "%lld does not divide /model/heads %lld",
                             (long long)md->kv_heads, (long long)md->heads);
    if ((md->embed / md->heads) % 2)
        return cdp_json_fail(&c->in, "/model/heads", "the head width /model/dim / heads = %lld is odd; rotary "
                             "embeddings need an even one", (long long)(md->embed / md->heads));
    const json_t *hidden = json_object_get(m, "hidden");
    if (hidden) {
        const char *rule = json_object_get(m, "multiple_of") ? "multiple_of"
                           : json_object_get(m, "ffn_dim_multiplier") ? "ffn_dim_multiplier" : NULL;
        if (rule)
            return cdp_json_fail(&c->in, "/model/hidden", "given together with /model/%s; give the MLP's width "
                                 "either as hidden or by Llama's rule (multiple_of, ffn_dim_multiplier)", rule);
        md->multiple_of = 0;
        return cdp_json_get_int(&c->in, m, "/model", "hidden", 1, MAX_COUNT, 0, &md->ffn_hidden);
    }
    if ((st = cdp_json_get_int(&c->in, m, "/model", "multiple_of", 1, MAX_COUNT, 0, &md->multiple_of))) return st;
    const json_t *mult = json_object_get(m, "ffn_dim_multiplier");
    if (mult && !json_is_null(mult) &&
        (st = cdp_json_get_number(&c->in, m, "/model", "ffn_dim_multiplier", CDP_JSON_POSITIVE,
                                  &md->ffn_dim_multiplier)))
        return st;
    md->ffn_hidden = cdp_llama_hidden(md->embed, md->multiple_of, md->ffn_dim_multiplier);
    if (md->ffn_hidden < 1 || md->ffn_hidden > MAX_COUNT)
        return cdp_json_fail(&c->in, "/model/multiple_of", "Llama's rule gives an MLP width out of range (dim "
                             "%lld, multiple_of %lld, ffn_dim_multiplier %g)", (long long)md->embed,
                             (long long)md->multiple_of, md->ffn_dim_multiplier);
    return CDP_OK;
}

cdp_status cdp_plan_load_model(struct ld *c, const json_t *m)
{
    struct cdp_model_desc *md = &c->p->model;
    cdp_status st;
    int i = 0;
    if (!m) return cdp_fail(CDP_ERR_INVALID, "%s: /model: missing; a plan needs a \"model\" section "
                                             "(a \"preset\" or an explicit \"layers\" list)", c->in.file);
    if (!json_is_object(m)) return cdp_json_expected(&c->in, "/model", "an object", m);
    const json_t *preset = json_object_get(m, "preset"), *layers = json_object_get(m, "layers");
    md->loss = CDP_LOSS_CROSS_ENTROPY;
    const json_t *from = json_object_get(m, "from");
    if (from) return load_from(c, m, from, md);
    const json_t *weights = json_object_get(m, "weights");
    if (weights && !json_is_null(weights)) {
        if (!json_is_string(weights))
            return cdp_json_expected(&c->in, "/model/weights", "a safetensors file path or null", weights);
        if ((st = cdp_plan_get_existing_file(c, weights, "/model/weights", &md->weights))) return st;
    }
    if ((st = read_unused_tensors(c, m, md))) return st;
    if (preset) {
        int pi = 0;
        if ((st = cdp_json_enum(&c->in, preset, "/model/preset", preset_names, &pi))) return st;
        if (json_is_array(layers))
            return cdp_json_fail(&c->in, "/model/layers",
                                 "a layer list and /model/preset \"%s\" are both given; "
                                 "use one: a preset, or an explicit layer list with \"input\"",
                                 preset_names[pi]);
        snprintf(md->preset, sizeof md->preset, "%s", preset_names[pi]);
        if (pi < N_GPT_PRESETS) {
            const struct gpt_preset *g = &gpt_presets[pi];
            md->kind = CDP_MODEL_GPT;
            md->vocab = g->vocab;
            md->context = g->context;
            md->layers = g->layers;
            md->heads = g->heads;
            md->embed = g->embed;
            md->tie_embeddings = 1;
            if ((st = cdp_json_check_keys(&c->in, m, "/model", gpt_keys, "a gpt model"))) return st;
            if ((st = cdp_json_get_int(&c->in, m, "/model", "vocab", 1, MAX_COUNT, 0, &md->vocab))) return st;
            if ((st = cdp_json_get_int(&c->in, m, "/model", "context", 1, CDP_PLAN_MAX_CONTEXT, 0, &md->context))) return st;
            if ((st = cdp_json_get_int(&c->in, m, "/model", "layers", 1, MAX_LAYERS, 0, &md->layers))) return st;
            if ((st = cdp_json_get_int(&c->in, m, "/model", "heads", 1, MAX_COUNT, 0, &md->heads))) return st;
            if ((st = cdp_json_get_int(&c->in, m, "/model", "embed", 1, MAX_COUNT, 0, &md->embed))) return st;
            if ((st = cdp_json_get_bool(&c->in, m, "/model", "tie_embeddings", &md->tie_embeddings))) return st;
            if (md->embed % md->heads != 0)
                return cdp_json_fail(&c->in, "/model/embed", "%lld is not a multiple of /model/heads %lld",
                                     (long long)md->embed, (long long)md->heads);
            return CDP_OK;
        }
        if (strcmp(md->preset, "llama") == 0) return load_llama(c, m, md);
        if (strcmp(md->preset, "mlp") == 0) {
            static const int64_t hidden_default[] = {256, 256};
            md->kind = CDP_MODEL_MLP;
            md->input[0] = 784;
            md->input_ndim = 1;
            md->classes = 10;
            md->activation = CDP_ACT_RELU;
            md->hidden = malloc(sizeof hidden_default);
            if (!md->hidden) return cdp_fail(CDP_ERR_NOMEM, "%s: /model: out of memory", c->in.file);
            memcpy(md->hidden, hidden_default, sizeof hidden_default);
            md->n_hidden = 2;
            if ((st = cdp_json_check_keys(&c->in, m, "/model", mlp_keys, "an mlp model"))) return st;
            if ((st = get_input(c, m, 1, CDP_MAX_INPUT_DIMS, 0, md))) return st;
            if ((st = get_widths(c, m, "hidden", &md->hidden, &md->n_hidden))) return st;
            if ((st = cdp_json_get_int(&c->in, m, "/model", "classes", 1, MAX_COUNT, 0, &md->classes))) return st;
            if ((st = cdp_json_get_enum(&c->in, m, "/model", "activation", cdp_plan_activation_names, &i))) return st;
            md->activation = (enum cdp_activation)i;
        } else {
            static const int64_t channels_default[] = {8, 16};
            md->kind = CDP_MODEL_CNN;
            md->input[0] = 1;
            md->input[1] = 28;
            md->input[2] = 28;
            md->input_ndim = 3;
            md->classes = 10;
            md->channels = malloc(sizeof channels_default);
            if (!md->channels) return cdp_fail(CDP_ERR_NOMEM, "%s: /model: out of memory", c->in.file);
            memcpy(md->channels, channels_default, sizeof channels_default);
            md->n_channels = 2;
            if ((st = cdp_json_check_keys(&c->in, m, "/model", cnn_keys, "a cnn model"))) return st;
            if ((st = get_input(c, m, 3, 3, 0, md))) return st;
            if ((st = get_widths(c, m, "channels", &md->channels, &md->n_channels))) return st;
            if ((st = cdp_json_get_int(&c->in, m, "/model", "classes", 1, MAX_COUNT, 0, &md->classes))) return st;
            int64_t h = md->input[1], w = md->input[2];
            for (int k = 0; k < md->n_channels; k++) {
                h /= 2;
                w /= 2;
                if (h < 1 || w < 1)
                    return cdp_json_fail(&c->in, "/model/channels",
                                         "%d conv blocks each halve the image, but /model/input [%lld, %lld, %lld] "
                                         "is too small for more than %d; use fewer channels or a larger input",
                                         md->n_channels, (long long)md->input[0], (long long)md->input[1],
                                         (long long)md->input[2], k);
            }
        }
        i = 0;
        if ((st = cdp_json_get_enum(&c->in, m, "/model", "loss", cdp_plan_loss_names, &i))) return st;
        md->loss = (enum cdp_loss)i;
        return expand_preset(c, md);
    }
    if (!layers) return cdp_json_expected(&c->in, "/model", "a \"preset\" or an explicit \"layers\" list", m);
    md->kind = CDP_MODEL_LAYERS;
    md->preset[0] = '\0';
    if ((st = cdp_json_check_keys(&c->in, m, "/model", explicit_keys, "a model with a layer list"))) return st;
    if (json_is_array(layers) && json_array_size(layers) > MAX_LAYERS)
        return cdp_json_fail(&c->in, "/model/layers", "%zu layers: at most %d (what the planner partitions in "
                             "seconds)", json_array_size(layers), MAX_LAYERS);
    if (!json_is_array(layers) || json_array_size(layers) == 0)
        return cdp_json_expected(&c->in, "/model/layers", "a non-empty array of layer objects (or a \"preset\")",
                                 layers);
    if ((st = get_input(c, m, 1, CDP_MAX_INPUT_DIMS, 1, md))) return st;
    md->layer_list = calloc(json_array_size(layers), sizeof *md->layer_list);
    if (!md->layer_list) return cdp_fail(CDP_ERR_NOMEM, "%s: /model/layers: out of memory", c->in.file);
    size_t k;
    json_t *lv;
    json_array_foreach(layers, k, lv) {
        char lp[CDP_JSON_PTR_CAP];
        cdp_json_ptr_index(lp, "/model/layers", k);
        if ((st = load_layer(c, lv, lp, &md->layer_list[k]))) return st;
        md->n_layers = (int)k + 1;
    }
    i = 0;
    if ((st = cdp_json_get_enum(&c->in, m, "/model", "loss", cdp_plan_loss_names, &i))) return st;
    md->loss = (enum cdp_loss)i;
    return CDP_OK;
}
