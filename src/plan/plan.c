/* The plan loader: reads plan.json with jansson, fills struct cdp_plan with every
 * default, and rejects each bad value with "FILE: /json/pointer: expected ..., got
 * ..." so a user can fix a plan without reading the code (schema: docs/plan.md). */
#include "cdp/plan.h"

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

#define MAX_PLAN_BYTES (16u << 20)
/* What the planner partitions in seconds (4096 layers: about 12 s here; its
 * split is O(stages x layers^2)), named by key when passed. */
#define MAX_LAYERS 4096
#define MAX_WIDTHS 10000
#define MAX_COUNT CDP_PLAN_MAX_COUNT

const char *const cdp_plan_model_kind_names[] = {"gpt", "mlp", "cnn", "layers"};
CDP_TABLE_CHECK(cdp_plan_model_kind_names, CDP_MODEL_KIND_COUNT);
const char *const cdp_plan_loss_names[] = {"cross_entropy", "mse", NULL};
CDP_TABLE_CHECK(cdp_plan_loss_names, CDP_LOSS_COUNT + 1);
const char *const cdp_plan_unused_tensors_names[] = {"error", "warn", NULL};
CDP_TABLE_CHECK(cdp_plan_unused_tensors_names, CDP_UNUSED_COUNT + 1);
const char *const cdp_plan_activation_names[] = {"relu", "gelu", NULL};
CDP_TABLE_CHECK(cdp_plan_activation_names, CDP_ACT_COUNT + 1);
const char *const cdp_plan_source_names[] = {"synthetic", "text", "tokens",
                                                                      "idx", NULL};
CDP_TABLE_CHECK(cdp_plan_source_names, CDP_DATA_SOURCE_COUNT + 1);
const char *const cdp_plan_order_names[] = {"shuffle", "sequential", NULL};
CDP_TABLE_CHECK(cdp_plan_order_names, CDP_DATA_ORDER_COUNT + 1);
const char *const cdp_plan_optimizer_names[] = {"sgd", "adamw", NULL};
CDP_TABLE_CHECK(cdp_plan_optimizer_names, CDP_OPT_TYPE_COUNT + 1);
const char *const cdp_plan_param_group_names[] = {"weight", "embedding", "bias", "norm", NULL};
CDP_TABLE_CHECK(cdp_plan_param_group_names, CDP_PARAM_GROUP_COUNT + 1);
const char *const cdp_plan_lr_schedule_names[] = {"constant", "cosine", "linear", "wsd", NULL};
CDP_TABLE_CHECK(cdp_plan_lr_schedule_names, CDP_LR_SCHEDULE_COUNT + 1);
const char *const cdp_plan_precision_names[] = {"fp32", "bf16", NULL};
CDP_TABLE_CHECK(cdp_plan_precision_names, CDP_PRECISION_COUNT + 1);
/* /train/recompute: the modes in enum order, then "auto" */
const char *const cdp_plan_recompute_names[] = {"none", "selective", "full", "auto", NULL};
CDP_TABLE_CHECK(cdp_plan_recompute_names, CDP_RECOMPUTE_COUNT + 2);
const char *const cdp_plan_placement_names[] = {
    "topology", "ordered-pp-inner", "ordered-dp-inner", NULL};
CDP_TABLE_CHECK(cdp_plan_placement_names, CDP_PLACEMENT_KIND_COUNT);


double cdp_plan_bucket_bytes(const struct cdp_plan *plan, int replicas, int zero)
{
    if (!plan || replicas < 2 || zero >= 2 || !(plan->parallel.bucket_mb > 0)) return 0;
    return plan->parallel.bucket_mb * 1048576.0;
}

int cdp_plan_zero2_allowed(const struct cdp_plan *plan, char *why, size_t cap)
{
    const struct cdp_parallel_desc *pd = &plan->parallel;
    if (pd->rebalance_every > 0) {
        if (why)
            snprintf(why, cap, "2 (ZeRO-2) reduces the gradients after every backward, so the replicas must run "
                     "the same micro-batches; /parallel/rebalance_every %lld moves them: use 0 or 1, or set "
                     "rebalance_every to 0", (long long)pd->rebalance_every);
        return 0;
    }
    for (int i = 1; pd->balance == CDP_BALANCE_EXPLICIT && i < pd->n_shares; i++)
        if (pd->shares[i] != pd->shares[0]) {
            if (why)
                snprintf(why, cap, "2 (ZeRO-2) reduces the gradients after every backward, so the replicas must "
                         "run the same micro-batches; /parallel/balance gives shares %lld and %lld: use 0 or 1, or "
                         "equal shares", (long long)pd->shares[0], (long long)pd->shares[i]);
            return 0;
        }
    return 1;
}

const char *cdp_recompute_name(enum cdp_recompute r)
{
    return (unsigned)r < CDP_RECOMPUTE_COUNT ? cdp_plan_recompute_names[r] : "?";
}


const char *cdp_layer_type_name(enum cdp_layer_type t) { return cdp_layer_name(t); }

/* ---- presets ----------------------------------------------------------------- */

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

/* ---- the loading context and messages ---------------------------------------- */

struct ld {
    struct cdp_json_in in; /* the file as named by the user, for messages */
    char *base;       /* absolute folder that relative paths start from (owned) */
    struct cdp_plan *p;
};

static cdp_status get_seed(struct ld *c, const json_t *obj, const char *ptr, uint64_t *out)
{
    int64_t x = (int64_t)*out;
    cdp_status st = cdp_json_get_int(&c->in, obj, ptr, "seed", 0, INT64_MAX, 0, &x);
    if (st) return st;
    *out = (uint64_t)x;
    return CDP_OK;
}

/* An array of positive integers with min_n..max_n elements. */
static cdp_status int_array(struct ld *c, const json_t *v, const char *ptr, size_t min_n, size_t max_n,
                            int64_t *dst, size_t *n_out)
{
    char what[96];
    if (min_n == max_n)
        snprintf(what, sizeof what, "an array of %zu positive integers", min_n);
    else
        snprintf(what, sizeof what, "an array of %zu to %zu positive integers", min_n, max_n);
    if (!json_is_array(v) || json_array_size(v) < min_n || json_array_size(v) > max_n)
        return cdp_json_expected(&c->in, ptr, what, v);
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        char ep[CDP_JSON_PTR_CAP];
        cdp_json_ptr_index(ep, ptr, i);
        cdp_status st = cdp_json_int(&c->in, e, ep, 1, MAX_COUNT, 0, NULL, &dst[i]);
        if (st) return st;
    }
    *n_out = json_array_size(v);
    return CDP_OK;
}

/* ---- paths ------------------------------------------------------------------- */

static const char *file_kind(mode_t m)
{
    return S_ISDIR(m) ? "a folder" : "not a regular file";
}

/* A string path to an existing regular file; *out = its absolute, canonical form. */
static cdp_status get_existing_file(struct ld *c, const json_t *v, const char *ptr, char **out)
{
    if (!json_is_string(v) || json_string_length(v) == 0 || strlen(json_string_value(v)) != json_string_length(v))
        return cdp_json_expected(&c->in, ptr, "a file path", v);
    char *joined = cdp_path_join(c->base, json_string_value(v));
    if (!joined) return cdp_fail(CDP_ERR_NOMEM, "%s: %s: out of memory", c->in.file, ptr);
    char *abs = realpath(joined, NULL);
    if (!abs) {
        int e = errno;
        cdp_status st = cdp_json_fail(&c->in, ptr, "cannot open \"%s\": %s", joined, strerror(e));
        free(joined);
        return st;
    }
    struct stat sb;
    if (stat(abs, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        cdp_status st = cdp_json_fail(&c->in, ptr, "\"%s\" is %s", joined,
                                      stat(abs, &sb) != 0 ? "unreadable" : file_kind(sb.st_mode));
        free(joined);
        free(abs);
        return st;
    }
    free(joined);
    *out = abs;
    return CDP_OK;
}

/* A path that will be written: its folder must exist (it need not). When dir_ok,
 * the path itself may be an existing folder (a checkpoint folder); otherwise an
 * existing folder there is an error. */
static cdp_status get_output_path(struct ld *c, const json_t *v, const char *ptr, int dir_ok, char **out)
{
    const char *what = dir_ok ? "a folder path" : "a file path";
    if (!json_is_string(v) || json_string_length(v) == 0 || strlen(json_string_value(v)) != json_string_length(v))
        return cdp_json_expected(&c->in, ptr, what, v);
    char *joined = cdp_path_join(c->base, json_string_value(v));
    if (!joined) return cdp_fail(CDP_ERR_NOMEM, "%s: %s: out of memory", c->in.file, ptr);
    size_t n = strlen(joined);
    while (n > 1 && joined[n - 1] == '/') joined[--n] = '\0';
    cdp_status st = CDP_OK;
    char *abs = NULL, *parent_abs = NULL;
    struct stat sb;
    if (stat(joined, &sb) == 0) {
        if (S_ISDIR(sb.st_mode) && !dir_ok) {
            st = cdp_json_fail(&c->in, ptr, "\"%s\" is a folder; expected a file path", joined);
            goto done;
        }
        if (!S_ISDIR(sb.st_mode) && dir_ok) {
            st = cdp_json_fail(&c->in, ptr, "\"%s\" exists and is not a folder", joined);
            goto done;
        }
        abs = realpath(joined, NULL);
        if (!abs) {
            st = cdp_json_fail(&c->in, ptr, "cannot resolve \"%s\": %s", joined, strerror(errno));
            goto done;
        }
        goto done;
    }
    char *slash = strrchr(joined, '/');
    const char *leaf = slash ? slash + 1 : joined;
    if (!*leaf || strcmp(leaf, ".") == 0 || strcmp(leaf, "..") == 0) {
        st = cdp_json_expected(&c->in, ptr, what, v);
        goto done;
    }
    if (slash == joined) {
        parent_abs = strdup("/");
    } else {
        *slash = '\0';
        parent_abs = realpath(joined, NULL);
        int e = errno;
        if (!parent_abs) {
            st = cdp_json_fail(&c->in, ptr, "the folder \"%s\" does not exist (%s); create it first", joined,
                               strerror(e));
            *slash = '/';
            goto done;
        }
        *slash = '/';
    }
    if (!parent_abs) {
        st = cdp_fail(CDP_ERR_NOMEM, "%s: %s: out of memory", c->in.file, ptr);
        goto done;
    }
    if (stat(parent_abs, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        st = cdp_json_fail(&c->in, ptr, "\"%s\" is not a folder", parent_abs);
        goto done;
    }
    {
        size_t np = strlen(parent_abs), nl = strlen(leaf);
        abs = malloc(np + nl + 2);
        if (!abs) {
            st = cdp_fail(CDP_ERR_NOMEM, "%s: %s: out of memory", c->in.file, ptr);
            goto done;
        }
        snprintf(abs, np + nl + 2, "%s%s%s", parent_abs, np > 1 ? "/" : "", leaf);
    }
done:
    free(parent_abs);
    free(joined);
    if (st) {
        free(abs);
        return st;
    }
    *out = abs;
    return CDP_OK;
}

/* ---- model ------------------------------------------------------------------- */

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
static cdp_status check_shapes(struct ld *c, const struct cdp_model_desc *m, int64_t *params)
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
static cdp_status check_sizes(struct ld *c)
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
    cdp_status st = int_array(c, v, kp, 0, MAX_WIDTHS, w, &k);
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
    cdp_status st = int_array(c, v, "/model/input", min_n, max_n, dims, &n);
    if (st) return st;
    memset(md->input, 0, sizeof md->input);
    memcpy(md->input, dims, n * sizeof dims[0]);
    md->input_ndim = (int)n;
    return CDP_OK;
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
    const json_t *unused = json_object_get(m, "unused_tensors");
    if (unused) {
        int ui = 0;
        if ((st = cdp_json_enum(&c->in, unused, "/model/unused_tensors", cdp_plan_unused_tensors_names, &ui)))
            return st;
        md->unused_tensors = (enum cdp_unused_tensors)ui;
    }
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

static cdp_status load_model(struct ld *c, const json_t *m)
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
        if ((st = get_existing_file(c, weights, "/model/weights", &md->weights))) return st;
    }
    const json_t *unused = json_object_get(m, "unused_tensors");
    if (unused) {
        int ui = 0;
        if ((st = cdp_json_enum(&c->in, unused, "/model/unused_tensors", cdp_plan_unused_tensors_names, &ui)))
            return st;
        md->unused_tensors = (enum cdp_unused_tensors)ui;
    }
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

/* ---- data -------------------------------------------------------------------- */

static const char *const data_keys[] = {"source", "path", "val_path", "labels", "seed", "order", NULL};

#define MAX_DATA_FILES 1000000

static cdp_status push_path(struct ld *c, const char *ptr, char ***list, int *n, char *path)
{
    if (*n >= MAX_DATA_FILES) {
        free(path);
        return cdp_json_fail(&c->in, ptr, "more than %d files", MAX_DATA_FILES);
    }
    char **nl = realloc(*list, (size_t)(*n + 1) * sizeof *nl);
    if (!nl) {
        free(path);
        return cdp_fail(CDP_ERR_NOMEM, "%s: %s: out of memory", c->in.file, ptr);
    }
    nl[(*n)++] = path;
    *list = nl;
    return CDP_OK;
}

/* One entry of a data path list: a file, or a glob pattern (it holds * ? or [)
 * that names at least one regular file, its matches in sorted order. */
static cdp_status get_data_entry(struct ld *c, const json_t *v, const char *ptr, char ***list, int *n)
{
    cdp_status st;
    if (!json_is_string(v) || json_string_length(v) == 0 || strlen(json_string_value(v)) != json_string_length(v))
        return cdp_json_expected(&c->in, ptr, "a file path, a glob pattern or a list of them", v);
    const char *s = json_string_value(v);
    if (!strpbrk(s, "*?[")) {
        char *one = NULL;
        if ((st = get_existing_file(c, v, ptr, &one))) return st;
        return push_path(c, ptr, list, n, one);
    }
    char *joined = cdp_path_join(c->base, s);
    if (!joined) return cdp_fail(CDP_ERR_NOMEM, "%s: %s: out of memory", c->in.file, ptr);
    glob_t g;
    int rc = glob(joined, GLOB_ERR, NULL, &g);
    if (rc != 0) {
        st = rc == GLOB_NOMATCH ? cdp_json_fail(&c->in, ptr, "the pattern \"%s\" matches no file", joined)
             : rc == GLOB_NOSPACE ? cdp_fail(CDP_ERR_NOMEM, "%s: %s: out of memory", c->in.file, ptr)
                                  : cdp_json_fail(&c->in, ptr, "cannot read the folders of \"%s\"", joined);
        if (rc != GLOB_NOMATCH) globfree(&g);
        free(joined);
        return st;
    }
    free(joined);
    st = CDP_OK;
    int regular = 0;
    for (size_t i = 0; i < g.gl_pathc && !st; i++) {
        struct stat sb;
        if (stat(g.gl_pathv[i], &sb) != 0 || !S_ISREG(sb.st_mode)) continue; /* folders a pattern also matches */
        char *abs = realpath(g.gl_pathv[i], NULL);
        if (!abs) {
            st = cdp_json_fail(&c->in, ptr, "cannot open \"%s\": %s", g.gl_pathv[i], strerror(errno));
            break;
        }
        st = push_path(c, ptr, list, n, abs);
        regular++;
    }
    if (!st && !regular) st = cdp_json_fail(&c->in, ptr, "the pattern \"%s\" matches no regular file", s);
    globfree(&g);
    return st;
}

/* data.path / data.val_path: a file, a glob, or a non-empty list of either. */
static cdp_status get_data_paths(struct ld *c, const json_t *v, const char *ptr, char ***list, int *n)
{
    cdp_status st;
    if (!json_is_array(v)) return get_data_entry(c, v, ptr, list, n);
    if (json_array_size(v) == 0)
        return cdp_json_expected(&c->in, ptr, "a file path, a glob pattern or a non-empty list of them", v);
    size_t k;
    json_t *e;
    json_array_foreach(v, k, e) {
        char ep[CDP_JSON_PTR_CAP];
        cdp_json_ptr_index(ep, ptr, k);
        if ((st = get_data_entry(c, e, ep, list, n))) return st;
    }
    return CDP_OK;
}

static cdp_status load_data(struct ld *c, const json_t *d)
{
    struct cdp_data_desc *dd = &c->p->data;
    const struct cdp_model_desc *m = &c->p->model;
    cdp_status st;
    int src = 0;
    if ((st = cdp_json_need_object(&c->in, d, "/data"))) return st;
    if (!d) return CDP_OK;
    if ((st = cdp_json_check_keys(&c->in, d, "/data", data_keys, "/data"))) return st;
    if ((st = cdp_json_get_enum(&c->in, d, "/data", "source", cdp_plan_source_names, &src))) return st;
    dd->source = (enum cdp_data_source)src;
    if ((st = get_seed(c, d, "/data", &dd->seed))) return st;
    int order = CDP_DATA_ORDER_SHUFFLE;
    if ((st = cdp_json_get_enum(&c->in, d, "/data", "order", cdp_plan_order_names, &order))) return st;
    dd->order = (enum cdp_data_order)order;
    const json_t *path = json_object_get(d, "path"), *labels = json_object_get(d, "labels");
    const json_t *val_path = json_object_get(d, "val_path");
    if (json_is_null(path)) path = NULL;
    if (json_is_null(labels)) labels = NULL;
    if (json_is_null(val_path)) val_path = NULL;
    const char *sn = cdp_plan_source_names[src];
    if (dd->source == CDP_DATA_SYNTHETIC) {
        if (path)
            return cdp_json_fail(&c->in, "/data/path", "synthetic data has no file; remove it or set /data/source");
        if (dd->order != CDP_DATA_ORDER_SHUFFLE)
            return cdp_json_fail(&c->in, "/data/order",
                                 "\"%s\" reads a file in its order; synthetic data has no file (each sample is "
                                 "drawn from its index): remove /data/order or set /data/source",
                                 cdp_plan_order_names[dd->order]);
    } else {
        if (!path) return cdp_json_fail(&c->in, "/data/path", "missing; /data/source \"%s\" needs a file", sn);
        if (dd->source == CDP_DATA_IDX) {
            if ((st = get_existing_file(c, path, "/data/path", &dd->path))) return st;
        } else {
            if ((st = get_data_paths(c, path, "/data/path", &dd->paths, &dd->n_paths))) return st;
            if (!(dd->path = strdup(dd->paths[0])))
                return cdp_fail(CDP_ERR_NOMEM, "%s: /data/path: out of memory", c->in.file);
        }
    }
    if (val_path) {
        if (dd->source != CDP_DATA_TEXT && dd->source != CDP_DATA_TOKENS)
            return cdp_json_fail(&c->in, "/data/val_path",
                                 "only /data/source \"text\" and \"tokens\" take validation files, not \"%s\"", sn);
        if ((st = get_data_paths(c, val_path, "/data/val_path", &dd->val_paths, &dd->n_val_paths))) return st;
    }
    if (dd->source == CDP_DATA_IDX) {
        if (!labels)
            return cdp_json_fail(&c->in, "/data/labels",
                                 "missing; /data/source \"idx\" needs the labels file "
                                 "beside /data/path (the images)");
        if ((st = get_existing_file(c, labels, "/data/labels", &dd->labels))) return st;
    } else if (labels) {
        return cdp_json_fail(&c->in, "/data/labels", "only /data/source \"idx\" has a labels file, not \"%s\"", sn);
    }
    int gpt = m->kind == CDP_MODEL_GPT;
    if (dd->source == CDP_DATA_TEXT && (!gpt || m->vocab < 256)) {
        if (!gpt)
            return cdp_json_fail(&c->in, "/data/source", "\"text\" needs a gpt model (byte tokens), not /model %s",
                                 m->kind == CDP_MODEL_LAYERS ? "with a layer list" : m->preset);
        return cdp_json_fail(&c->in, "/data/source",
                             "\"text\" reads bytes, so /model/vocab must be at least 256, "
                             "got %lld",
                             (long long)m->vocab);
    }
    if (dd->source == CDP_DATA_TOKENS && !gpt)
        return cdp_json_fail(&c->in, "/data/source",
                             "\"tokens\" needs a gpt model (/model/preset \"gpt\", \"gpt2\", ...)");
    if (dd->source == CDP_DATA_IDX && gpt)
        return cdp_json_fail(&c->in, "/data/source",
                             "\"idx\" (images and labels) needs an mlp, cnn or layer-list "
                             "model, not /model/preset \"%s\"",
                             m->preset);
    return CDP_OK;
}

/* ---- train ------------------------------------------------------------------- */

static const char *const train_keys[] = {"steps", "global_batch", "micro_batch", "optimizer", "lr_schedule",
                                         "grad_clip", "precision", "recompute", "seed", "log_every", "eval_every",
                                         "eval_batches", "timeout_s", "checkpoint", "restart", NULL};
static const char *const opt_keys[] = {"type", "lr", "weight_decay", "no_decay", "momentum", "beta1", "beta2",
                                       "eps", NULL};
static const char *const ckpt_keys[] = {"dir", "every", "keep", NULL};
static const char *const restart_keys[] = {"max", "exclude_failed", NULL};

/* /train/restart: null (off) or {"max": N, "exclude_failed": true}; a restart
 * resumes from the last checkpoint, so it needs /train/checkpoint. */
static cdp_status load_restart(struct ld *c, const json_t *r)
{
    struct cdp_train_desc *td = &c->p->train;
    const char *RP = "/train/restart";
    td->restart.max = 0;
    td->restart.exclude_failed = 1;
    if (!r || json_is_null(r)) return CDP_OK;
    if (!json_is_object(r)) return cdp_json_expected(&c->in, RP, "an object or null", r);
    cdp_status st;
    if ((st = cdp_json_check_keys(&c->in, r, RP, restart_keys, RP))) return st;
    if (!json_object_get(r, "max"))
        return cdp_json_fail(&c->in, "/train/restart/max", "missing; how many restarts in a row (1 to %d)",
                             CDP_RESTART_MAX);
    if ((st = cdp_json_get_int(&c->in, r, RP, "max", 1, CDP_RESTART_MAX, 0, &td->restart.max))) return st;
    if ((st = cdp_json_get_bool(&c->in, r, RP, "exclude_failed", &td->restart.exclude_failed))) return st;
    if (!td->checkpoint.dir)
        return cdp_json_fail(&c->in, RP, "needs /train/checkpoint: a restart resumes from the last checkpoint");
    return CDP_OK;
}

/* /train/optimizer/no_decay: the parameter groups weight decay skips, a list
 * of "weight", "embedding", "bias", "norm" (each at most once); [] decays
 * every tensor. */
static cdp_status load_no_decay(struct ld *c, const json_t *v, unsigned *out)
{
    const char *P = "/train/optimizer/no_decay";
    if (!v) return CDP_OK;
    if (!json_is_array(v))
        return cdp_json_expected(&c->in, P, "a list of parameter groups (\"embedding\", \"bias\", \"norm\", "
                                 "\"weight\")", v);
    unsigned mask = 0;
    for (size_t i = 0; i < json_array_size(v); i++) {
        char kp[CDP_JSON_PTR_CAP];
        cdp_json_ptr_index(kp, P, i);
        int g = 0;
        cdp_status st = cdp_json_enum(&c->in, json_array_get(v, i), kp, cdp_plan_param_group_names, &g);
        if (st) return st;
        if (mask & CDP_PARAM_GROUP_BIT(g))
            return cdp_json_fail(&c->in, kp, "\"%s\" is listed twice", cdp_plan_param_group_names[g]);
        mask |= CDP_PARAM_GROUP_BIT(g);
    }
    *out = mask;
    return CDP_OK;
}

/* /train/lr_schedule (after /train/steps and /train/optimizer/lr are known):
 * {"type", "warmup_steps", "min_lr", "decay_steps"}; each key only where its
 * type uses it, and the phases within /train/steps. */
static const char *const lr_schedule_keys[] = {"type", "warmup_steps", "min_lr", "decay_steps", NULL};

static cdp_status load_lr_schedule(struct ld *c, const json_t *v)
{
    struct cdp_train_desc *td = &c->p->train;
    struct cdp_lr_schedule_desc *s = &td->lr_schedule;
    const char *P = "/train/lr_schedule";
    *s = (struct cdp_lr_schedule_desc){.type = CDP_LR_CONSTANT};
    if (!v || json_is_null(v)) return CDP_OK;
    if (!json_is_object(v)) return cdp_json_expected(&c->in, P, "an object or null", v);
    cdp_status st;
    if ((st = cdp_json_check_keys(&c->in, v, P, lr_schedule_keys, P))) return st;
    int t = CDP_LR_CONSTANT;
    if ((st = cdp_json_get_enum(&c->in, v, P, "type", cdp_plan_lr_schedule_names, &t))) return st;
    s->type = (enum cdp_lr_schedule_kind)t;
    const char *tn = cdp_plan_lr_schedule_names[t];
    if (s->type == CDP_LR_CONSTANT && json_object_get(v, "min_lr"))
        return cdp_json_fail(&c->in, "/train/lr_schedule/min_lr",
                             "unknown key for /train/lr_schedule/type \"constant\" (the rate a decay ends at: "
                             "\"cosine\", \"linear\" or \"wsd\")");
    if (s->type != CDP_LR_WSD && json_object_get(v, "decay_steps"))
        return cdp_json_fail(&c->in, "/train/lr_schedule/decay_steps",
                             "unknown key for /train/lr_schedule/type \"%s\" (the length of \"wsd\"'s decay; "
                             "\"%s\" decays from the warmup's end to the last step)", tn, tn);
    if ((st = cdp_json_get_int(&c->in, v, P, "warmup_steps", 0, INT64_MAX, 0, &s->warmup_steps))) return st;
    if (s->warmup_steps > td->steps)
        return cdp_json_fail(&c->in, "/train/lr_schedule/warmup_steps", "%lld is more than /train/steps %lld",
                             (long long)s->warmup_steps, (long long)td->steps);
    if ((st = cdp_json_get_number(&c->in, v, P, "min_lr", CDP_JSON_NONNEG, &s->min_lr))) return st;
    if (s->min_lr > td->optimizer.lr)
        return cdp_json_fail(&c->in, "/train/lr_schedule/min_lr",
                             "%g is above /train/optimizer/lr %g: a decay ends at most at the peak rate", s->min_lr,
                             td->optimizer.lr);
    if ((s->type == CDP_LR_COSINE || s->type == CDP_LR_LINEAR) && s->warmup_steps >= td->steps)
        return cdp_json_fail(&c->in, "/train/lr_schedule/warmup_steps",
                             "%lld leaves no step for the %s decay: expected fewer than /train/steps %lld",
                             (long long)s->warmup_steps, tn, (long long)td->steps);
    if (s->type != CDP_LR_WSD) return CDP_OK;
    if (!json_object_get(v, "decay_steps"))
        return cdp_json_fail(&c->in, "/train/lr_schedule/decay_steps",
                             "missing; \"wsd\" decays over the last decay_steps steps (1 to /train/steps %lld "
                             "minus warmup_steps %lld)", (long long)td->steps, (long long)s->warmup_steps);
    const int64_t room = td->steps - s->warmup_steps;
    if (room < 1)
        return cdp_json_fail(&c->in, "/train/lr_schedule/warmup_steps",
                             "%lld leaves no step for the decay: expected fewer than /train/steps %lld",
                             (long long)s->warmup_steps, (long long)td->steps);
    if ((st = cdp_json_get_int(&c->in, v, P, "decay_steps", 1, INT64_MAX, 0, &s->decay_steps))) return st;
    if (s->decay_steps > room)
        return cdp_json_fail(&c->in, "/train/lr_schedule/decay_steps",
                             "%lld does not fit after warmup_steps %lld within /train/steps %lld: expected at most "
                             "%lld", (long long)s->decay_steps, (long long)s->warmup_steps, (long long)td->steps,
                             (long long)room);
    return CDP_OK;
}

static cdp_status load_optimizer(struct ld *c, const json_t *o)
{
    struct cdp_optimizer_desc *od = &c->p->train.optimizer;
    cdp_status st;
    int t = CDP_OPT_ADAMW;
    const char *P = "/train/optimizer";
    if ((st = cdp_json_need_object(&c->in, o, P))) return st;
    if (o) {
        if ((st = cdp_json_check_keys(&c->in, o, P, opt_keys, "/train/optimizer"))) return st;
        if ((st = cdp_json_get_enum(&c->in, o, P, "type", cdp_plan_optimizer_names, &t))) return st;
    }
    od->type = (enum cdp_optimizer_type)t;
    od->lr = od->type == CDP_OPT_SGD ? 0.01 : 3e-4;
    od->weight_decay = 0;
    od->no_decay = CDP_NO_DECAY_DEFAULT;
    od->momentum = 0.9;
    od->beta1 = 0.9;
    od->beta2 = 0.999;
    od->eps = 1e-8;
    if (!o) return CDP_OK;
    static const char *const sgd_only[] = {"momentum", NULL};
    static const char *const adamw_only[] = {"beta1", "beta2", "eps", NULL};
    const char *const *foreign = od->type == CDP_OPT_SGD ? adamw_only : sgd_only;
    for (int k = 0; foreign[k]; k++) {
        if (json_object_get(o, foreign[k])) {
            char kp[CDP_JSON_PTR_CAP];
            cdp_json_ptr_key(kp, P, foreign[k]);
            return cdp_json_fail(&c->in, kp,
                                 "unknown key for /train/optimizer/type \"%s\" (\"%s\" is a setting of "
                                 "\"%s\")",
                                 cdp_plan_optimizer_names[t], foreign[k], od->type == CDP_OPT_SGD ? "adamw" : "sgd");
        }
    }
    if ((st = cdp_json_get_number(&c->in, o, P, "lr", CDP_JSON_POSITIVE, &od->lr))) return st;
    if ((st = cdp_json_get_number(&c->in, o, P, "weight_decay", CDP_JSON_NONNEG, &od->weight_decay))) return st;
    if ((st = load_no_decay(c, json_object_get(o, "no_decay"), &od->no_decay))) return st;
    if ((st = cdp_json_get_number(&c->in, o, P, "momentum", CDP_JSON_UNIT, &od->momentum))) return st;
    if ((st = cdp_json_get_number(&c->in, o, P, "beta1", CDP_JSON_UNIT, &od->beta1))) return st;
    if ((st = cdp_json_get_number(&c->in, o, P, "beta2", CDP_JSON_UNIT, &od->beta2))) return st;
    return cdp_json_get_number(&c->in, o, P, "eps", CDP_JSON_POSITIVE, &od->eps);
}

static cdp_status load_train(struct ld *c, const json_t *t)
{
    struct cdp_train_desc *td = &c->p->train;
    cdp_status st;
    int prec = 0;
    const char *P = "/train";
    if ((st = cdp_json_need_object(&c->in, t, P))) return st;
    if (t && (st = cdp_json_check_keys(&c->in, t, P, train_keys, "/train"))) return st;
    if ((st = load_optimizer(c, t ? json_object_get(t, "optimizer") : NULL))) return st;
    if (!t) return CDP_OK;
    if ((st = cdp_json_get_int(&c->in, t, P, "steps", 1, INT64_MAX, 0, &td->steps))) return st;
    if ((st = load_lr_schedule(c, json_object_get(t, "lr_schedule")))) return st;
    if ((st = cdp_json_get_int(&c->in, t, P, "global_batch", 1, MAX_COUNT, 1, &td->global_batch))) return st;
    if ((st = cdp_json_get_int(&c->in, t, P, "micro_batch", 1, MAX_COUNT, 0, &td->micro_batch))) return st;
    if ((st = cdp_json_get_number(&c->in, t, P, "grad_clip", CDP_JSON_NONNEG, &td->grad_clip))) return st;
    if ((st = cdp_json_get_enum(&c->in, t, P, "precision", cdp_plan_precision_names, &prec))) return st;
    td->precision = (enum cdp_precision)prec;
    int rc = td->recompute_auto ? CDP_RECOMPUTE_COUNT : (int)td->recompute;
    if ((st = cdp_json_get_enum(&c->in, t, P, "recompute", cdp_plan_recompute_names, &rc))) return st;
    td->recompute_auto = rc == CDP_RECOMPUTE_COUNT;
    td->recompute = td->recompute_auto ? CDP_RECOMPUTE_NONE : (enum cdp_recompute)rc;
    if ((st = get_seed(c, t, P, &td->seed))) return st;
    if ((st = cdp_json_get_int(&c->in, t, P, "log_every", 1, INT64_MAX, 0, &td->log_every))) return st;
    if ((st = cdp_json_get_int(&c->in, t, P, "eval_every", 0, INT64_MAX, 0, &td->eval_every))) return st;
    /* validation is a check of a few micro-batches, the same each time: a
     * count past this is a mistake (it would outlast the training) */
    if ((st = cdp_json_get_int(&c->in, t, P, "eval_batches", 1, CDP_PLAN_MAX_EVAL_BATCHES, 0, &td->eval_batches)))
        return st;
    if ((st = cdp_json_get_number(&c->in, t, P, "timeout_s", CDP_JSON_POSITIVE, &td->timeout_s))) return st;
    const json_t *ck = json_object_get(t, "checkpoint");
    if (!ck || json_is_null(ck)) return load_restart(c, json_object_get(t, "restart"));
    const char *CP = "/train/checkpoint";
    if (!json_is_object(ck)) return cdp_json_expected(&c->in, CP, "an object or null", ck);
    if ((st = cdp_json_check_keys(&c->in, ck, CP, ckpt_keys, "/train/checkpoint"))) return st;
    const json_t *dir = json_object_get(ck, "dir");
    if (!dir) return cdp_json_fail(&c->in, "/train/checkpoint/dir", "missing; checkpoints need a folder");
    if ((st = cdp_json_get_int(&c->in, ck, CP, "every", 1, INT64_MAX, 0, &td->checkpoint.every))) return st;
    if ((st = cdp_json_get_int(&c->in, ck, CP, "keep", 1, INT64_MAX, 0, &td->checkpoint.keep))) return st;
    if ((st = get_output_path(c, dir, "/train/checkpoint/dir", 1, &td->checkpoint.dir))) return st;
    return load_restart(c, json_object_get(t, "restart"));
}

/* ---- parallel ---------------------------------------------------------------- */

static const char *const parallel_keys[] = {"stages", "replicas", "micro_batches", "schedule", "chunks",
                                            "partition", "placement", "balance", "rebalance_every", "zero", "bucket_mb",
                                            NULL};
static const char *const balance_words[] = {"speed", "uniform", NULL};

/* "speed" | "uniform" | [micro-batches of replica 0, 1, ...] */
static cdp_status load_balance(struct ld *c, const json_t *v)
{
    struct cdp_parallel_desc *pd = &c->p->parallel;
    const char *P = "/parallel/balance";
    if (json_is_string(v)) {
        int k = 0;
        cdp_status st = cdp_json_enum(&c->in, v, P, balance_words, &k);
        if (st) return st;
        pd->balance = (enum cdp_balance_kind)k;
        return CDP_OK;
    }
    if (!json_is_array(v) || json_array_size(v) == 0)
        return cdp_json_expected(&c->in, P, "\"speed\", \"uniform\" or a list of micro-batches per replica", v);
    size_t n = json_array_size(v);
    if (n > (size_t)MAX_COUNT) return cdp_json_fail(&c->in, P, "too many replicas");
    pd->shares = calloc(n, sizeof *pd->shares);
    if (!pd->shares) return cdp_fail(CDP_ERR_NOMEM, "%s: %s: out of memory", c->in.file, P);
    pd->n_shares = (int)n;
    pd->balance = CDP_BALANCE_EXPLICIT;
    for (size_t i = 0; i < n; i++) {
        char kp[CDP_JSON_PTR_CAP];
        snprintf(kp, sizeof kp, "%s/%zu", P, i);
        cdp_status st = cdp_json_int(&c->in, json_array_get(v, i), kp, 1, MAX_COUNT, 0, NULL, &pd->shares[i]);
        if (st) return st;
    }
    return CDP_OK;
}

/* Explicit shares against replicas, micro_batches and the schedule; settles
 * micro_batches when it is "auto". */
static cdp_status check_shares(struct ld *c)
{
    struct cdp_parallel_desc *pd = &c->p->parallel;
    const char *P = "/parallel/balance";
    if (pd->balance != CDP_BALANCE_EXPLICIT) return CDP_OK;
    if (pd->replicas == CDP_AUTO) pd->replicas = pd->n_shares;
    if (pd->n_shares != pd->replicas)
        return cdp_json_fail(&c->in, P, "%d shares for /parallel/replicas %lld: give one per replica", pd->n_shares,
                             (long long)pd->replicas);
    int64_t sum = 0;
    for (int i = 0; i < pd->n_shares; i++) sum += pd->shares[i];
    if (pd->micro_batches == CDP_AUTO) {
        if (sum % pd->replicas)
            return cdp_json_fail(&c->in, P,
                                 "the shares sum to %lld micro-batches per step, not a multiple of "
                                 "/parallel/replicas %lld (the global batch is replicas x micro_batches x micro_batch)",
                                 (long long)sum, (long long)pd->replicas);
        pd->micro_batches = sum / pd->replicas;
    } else if (sum != pd->replicas * pd->micro_batches) {
        return cdp_json_fail(&c->in, P,
                             "the shares sum to %lld micro-batches per step; /parallel/replicas %lld x "
                             "/parallel/micro_batches %lld is %lld",
                             (long long)sum, (long long)pd->replicas, (long long)pd->micro_batches,
                             (long long)(pd->replicas * pd->micro_batches));
    }
    if (pd->schedule == CDP_SCHEDULE_INTERLEAVED && !pd->schedule_file && pd->stages != CDP_AUTO) {
        for (int i = 0; i < pd->n_shares; i++)
            if (pd->shares[i] % pd->stages) {
                char kp[CDP_JSON_PTR_CAP];
                snprintf(kp, sizeof kp, "%s/%d", P, i);
                return cdp_json_fail(&c->in, kp,
                                     "%lld is not a multiple of /parallel/stages %lld, as the interleaved "
                                     "schedule needs",
                                     (long long)pd->shares[i], (long long)pd->stages);
            }
        /* said here, not as a /parallel/micro_batches the file may not have */
        if (pd->micro_batches % pd->stages)
            return cdp_json_fail(&c->in, P,
                                 "the shares sum to %lld, so /parallel/micro_batches is %lld, not a multiple of "
                                 "/parallel/stages %lld as the interleaved schedule needs of it too",
                                 (long long)sum, (long long)pd->micro_batches, (long long)pd->stages);
    }
    return CDP_OK;
}
static const char *const placement_words[] = {"topology", "ordered-pp-inner", "ordered-dp-inner",
                                              "ordered", NULL};

static cdp_status load_partition(struct ld *c, const json_t *v)
{
    struct cdp_parallel_desc *pd = &c->p->parallel;
    const char *P = "/parallel/partition";
    int64_t units = cdp_plan_model_units(c->p);
    if (json_is_string(v) && strcmp(json_string_value(v), "auto") == 0) return CDP_OK;
    if (!json_is_array(v) || json_array_size(v) == 0 || json_array_size(v) > MAX_LAYERS + 2)
        return cdp_json_expected(&c->in, P, "\"auto\" or an array of [first, end) unit ranges, one per stage", v);
    size_t n = json_array_size(v), i;
    int64_t per_rank = cdp_schedule_has_chunks(pd->schedule) ? pd->chunks : 1;
    if (pd->stages != CDP_AUTO) {
        int64_t want = pd->stages * per_rank;
        if ((int64_t)n != want) {
            if (per_rank > 1)
                return cdp_json_fail(&c->in, P,
                                     "has %zu ranges, but /parallel/stages %lld x /parallel/chunks %lld "
                                     "needs %lld",
                                     n, (long long)pd->stages, (long long)per_rank, (long long)want);
            return cdp_json_fail(&c->in, P, "has %zu ranges, but /parallel/stages is %lld; give one range per stage", n,
                                 (long long)pd->stages);
        }
    } else if ((int64_t)n % per_rank != 0) {
        return cdp_json_fail(&c->in, P, "has %zu ranges, not a multiple of /parallel/chunks %lld", n,
                             (long long)per_rank);
    }
    pd->partition = calloc(n, sizeof *pd->partition);
    if (!pd->partition) return cdp_fail(CDP_ERR_NOMEM, "%s: %s: out of memory", c->in.file, P);
    json_t *e;
    int64_t next = 0;
    json_array_foreach(v, i, e) {
        char ep[CDP_JSON_PTR_CAP];
        cdp_json_ptr_index(ep, P, i);
        if (!json_is_array(e) || json_array_size(e) != 2)
            return cdp_json_expected(&c->in, ep, "a [first, end) pair of unit indices", e);
        int64_t r[2];
        for (size_t k = 0; k < 2; k++) {
            char kp[CDP_JSON_PTR_CAP];
            cdp_json_ptr_index(kp, ep, k);
            cdp_status st = cdp_json_int(&c->in, json_array_get(e, k), kp, 0, MAX_COUNT, 0, NULL, &r[k]);
            if (st) return st;
        }
        if (r[0] != next)
            return cdp_json_fail(&c->in, ep,
                                 "starts at unit %lld, but the ranges must be contiguous from 0: "
                                 "expected %lld",
                                 (long long)r[0], (long long)next);
        if (r[1] <= r[0])
            return cdp_json_fail(&c->in, ep, "[%lld, %lld) is empty; every range needs at least one unit",
                                 (long long)r[0], (long long)r[1]);
        if (r[1] > units)
            return cdp_json_fail(&c->in, ep, "ends at %lld, past the model's %lld units", (long long)r[1],
                                 (long long)units);
        pd->partition[i][0] = r[0];
        pd->partition[i][1] = r[1];
        pd->n_partition = (int)i + 1;
        next = r[1];
    }
    if (next != units)
        return cdp_json_fail(&c->in, P,
                             "covers units [0, %lld), but the model has %lld units; the last range must "
                             "end at %lld",
                             (long long)next, (long long)units, (long long)units);
    if (pd->stages == CDP_AUTO) pd->stages = (int64_t)n / per_rank;
    return CDP_OK;
}

static cdp_status load_placement(struct ld *c, const json_t *v)
{
    struct cdp_parallel_desc *pd = &c->p->parallel;
    const char *P = "/parallel/placement";
    if (json_is_string(v)) {
        int k = 0;
        cdp_status st = cdp_json_enum(&c->in, v, P, placement_words, &k);
        if (st) return st;
        pd->placement = k == 3 ? CDP_PLACEMENT_ORDERED_PP_INNER : (enum cdp_placement_kind)k;
        return CDP_OK;
    }
    if (!json_is_array(v))
        return cdp_json_expected(&c->in, P,
                                 "\"topology\", \"ordered-pp-inner\", \"ordered-dp-inner\", \"ordered\" or "
                                 "an array of device indices per stage",
                                 v);
    if (pd->stages == CDP_AUTO || pd->replicas == CDP_AUTO)
        return cdp_json_fail(&c->in, P,
                             "a list of devices needs /parallel/stages and /parallel/replicas as numbers, "
                             "not \"auto\"");
    char what[160];
    snprintf(what, sizeof what, "an array of %lld arrays (one per stage) of %lld device indices (one per "
             "replica)", (long long)pd->stages, (long long)pd->replicas);
    if ((int64_t)json_array_size(v) != pd->stages) return cdp_json_expected(&c->in, P, what, v);
    size_t s, r;
    json_t *row, *e;
    /* Shapes first, so the map's size is bounded by what the file holds. */
    json_array_foreach(v, s, row) {
        char sp[CDP_JSON_PTR_CAP];
        cdp_json_ptr_index(sp, P, s);
        if (!json_is_array(row) || (int64_t)json_array_size(row) != pd->replicas) {
            snprintf(what, sizeof what, "an array of %lld device indices (one per replica)",
                     (long long)pd->replicas);
            return cdp_json_expected(&c->in, sp, what, row);
        }
    }
    int64_t n = pd->stages * pd->replicas;
    pd->placement_map = calloc((size_t)n, sizeof *pd->placement_map);
    if (!pd->placement_map) return cdp_fail(CDP_ERR_NOMEM, "%s: %s: out of memory", c->in.file, P);
    pd->placement = CDP_PLACEMENT_EXPLICIT;
    json_array_foreach(v, s, row) {
        char sp[CDP_JSON_PTR_CAP];
        cdp_json_ptr_index(sp, P, s);
        json_array_foreach(row, r, e) {
            char ep[CDP_JSON_PTR_CAP];
            int64_t dev;
            cdp_json_ptr_index(ep, sp, r);
            cdp_status st = cdp_json_int(&c->in, e, ep, 0, MAX_COUNT, 0, NULL, &dev);
            if (st) return st;
            int64_t at = (int64_t)s * pd->replicas + (int64_t)r;
            for (int64_t q = 0; q < at; q++)
                if (pd->placement_map[q] == dev)
                    return cdp_json_fail(&c->in, ep, "device %lld is already used by stage %lld replica %lld",
                                         (long long)dev, (long long)(q / pd->replicas), (long long)(q % pd->replicas));
            pd->placement_map[at] = dev;
        }
    }
    return CDP_OK;
}

static cdp_status batch_arithmetic(struct ld *c)
{
    struct cdp_train_desc *td = &c->p->train;
    struct cdp_parallel_desc *pd = &c->p->parallel;
    int64_t R = pd->replicas, M = pd->micro_batches, b = td->micro_batch, G = td->global_batch, prod;
    if (R != CDP_AUTO && M != CDP_AUTO) {
        int over = __builtin_mul_overflow(R, M, &prod) || __builtin_mul_overflow(prod, b, &prod);
        if (G == CDP_AUTO) {
            if (over || prod > MAX_COUNT)
                return cdp_json_fail(&c->in, "/train/global_batch",
                                     "/parallel/replicas %lld x /parallel/micro_batches "
                                     "%lld x /train/micro_batch %lld is too large",
                                     (long long)R, (long long)M, (long long)b);
            td->global_batch = prod;
        } else if (over || prod != G) {
            return cdp_json_fail(&c->in, "/train/global_batch",
                                 "%lld does not equal /parallel/replicas %lld x "
                                 "/parallel/micro_batches %lld x /train/micro_batch %lld = %lld",
                                 (long long)G, (long long)R, (long long)M, (long long)b, over ? -1LL : (long long)prod);
        }
        return CDP_OK;
    }
    if (G == CDP_AUTO) return CDP_OK;
    /* G is known: whatever factors are known must divide it. */
    if (M == CDP_AUTO && R != CDP_AUTO) {
        if (__builtin_mul_overflow(R, b, &prod) || G % prod != 0)
            return cdp_json_fail(&c->in, "/parallel/micro_batches",
                                 "\"auto\" cannot be derived: /train/global_batch "
                                 "%lld is not a multiple of /parallel/replicas %lld x /train/micro_batch %lld",
                                 (long long)G, (long long)R, (long long)b);
        if (G / prod > CDP_PLAN_MAX_MICRO_BATCHES)
            return cdp_json_fail(&c->in, "/train/global_batch",
                                 "%lld gives each of /parallel/replicas %lld %lld micro-batches of /train/micro_batch "
                                 "%lld; a replica runs at most %d a step", (long long)G, (long long)R,
                                 (long long)(G / prod), (long long)b, CDP_PLAN_MAX_MICRO_BATCHES);
        pd->micro_batches = G / prod;
        return CDP_OK;
    }
    int64_t known = b;
    if (M != CDP_AUTO && (__builtin_mul_overflow(known, M, &known) || G % known != 0))
        return cdp_json_fail(&c->in, "/train/global_batch",
                             "%lld is not a multiple of /parallel/micro_batches %lld x "
                             "/train/micro_batch %lld",
                             (long long)G, (long long)M, (long long)b);
    if (G % b != 0)
        return cdp_json_fail(&c->in, "/train/global_batch", "%lld is not a multiple of /train/micro_batch %lld",
                             (long long)G, (long long)b);
    return CDP_OK;
}

/* /parallel/schedule naming a file (docs/pipeline.md): its path, and from a
 * JSON file its shape ("stages", "chunks", "micro_batches") and the kind whose
 * placement of virtual stages it uses ("schedule", a kind's name; else
 * Megatron's). The lists themselves are read and validated where they run
 * (cdp_schedule_for_plan): the planner, the executor, --schedule. */
static cdp_status load_schedule_file(struct ld *c, const json_t *sj, int *sch)
{
    struct cdp_parallel_desc *pd = &c->p->parallel;
    const char *P = "/parallel/schedule";
    cdp_status st = get_existing_file(c, sj, P, &pd->schedule_file);
    if (st) return st;
    *sch = CDP_SCHEDULE_1F1B;
    pd->chunks = 0;
    FILE *f = fopen(pd->schedule_file, "rb");
    if (!f) return cdp_json_fail(&c->in, P, "cannot read \"%s\": %s", pd->schedule_file, strerror(errno));
    int ch = fgetc(f);
    while (ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r') ch = fgetc(f);
    fclose(f);
    if (ch != '{') return CDP_OK; /* CSV: the plan gives the shape */
    json_error_t je;
    json_t *root = json_load_file(pd->schedule_file, 0, &je);
    if (!root)
        return cdp_json_fail(&c->in, P, "%s: line %d: %s", pd->schedule_file, je.line, je.text);
    struct cdp_schedule_header h;
    st = cdp_schedule_header_read(pd->schedule_file, root, &h);
    if (st) {
        json_decref(root);
        return cdp_error_context(st, "%s: %s", c->in.file, P);
    }
    pd->file_stages = h.stages;
    pd->file_micro_batches = h.micro_batches;
    pd->file_chunks = h.chunks;
    if (h.kind >= 0) *sch = h.kind;
    pd->chunks = pd->file_chunks;
    json_decref(root);
    return CDP_OK;
}

/* A file's lists fix the shape: stages and micro-batches its own (taken when
 * "auto", else equal), the same micro-batches for every replica. */
static cdp_status check_schedule_file_shape(struct ld *c)
{
    struct cdp_parallel_desc *pd = &c->p->parallel;
    const char *f = pd->schedule_file;
    if (pd->rebalance_every > 0)
        return cdp_json_fail(&c->in, "/parallel/rebalance_every", "%lld, but the schedule file %s runs the same "
                             "micro-batches on every replica: use 0", (long long)pd->rebalance_every, f);
    for (int i = 1; pd->balance == CDP_BALANCE_EXPLICIT && i < pd->n_shares; i++)
        if (pd->shares[i] != pd->shares[0])
            return cdp_json_fail(&c->in, "/parallel/balance", "shares %lld and %lld, but the schedule file %s runs the "
                                 "same micro-batches on every replica: give equal shares",
                                 (long long)pd->shares[0], (long long)pd->shares[i], f);
    if (pd->file_stages <= 0) { /* CSV */
        if (pd->stages == CDP_AUTO || pd->micro_batches == CDP_AUTO)
            return cdp_json_fail(&c->in, "/parallel/schedule", "the CSV schedule %s has no shape of its own: give "
                                 "/parallel/stages and /parallel/micro_batches", f);
        return CDP_OK;
    }
    if (pd->stages == CDP_AUTO) pd->stages = pd->file_stages;
    if (pd->micro_batches == CDP_AUTO) pd->micro_batches = pd->file_micro_batches;
    if (pd->stages != pd->file_stages)
        return cdp_json_fail(&c->in, "/parallel/stages", "%lld, but the schedule file %s has lists for %lld ranks",
                             (long long)pd->stages, f, (long long)pd->file_stages);
    if (pd->micro_batches != pd->file_micro_batches)
        return cdp_json_fail(&c->in, "/parallel/micro_batches", "%lld, but the schedule file %s runs %lld",
                             (long long)pd->micro_batches, f, (long long)pd->file_micro_batches);
    return CDP_OK;
}

static cdp_status load_parallel(struct ld *c, const json_t *v)
{
    struct cdp_parallel_desc *pd = &c->p->parallel;
    cdp_status st;
    int sch = CDP_SCHEDULE_1F1B;
    const char *P = "/parallel";
    if ((st = cdp_json_need_object(&c->in, v, P))) return st;
    if (v) {
        if ((st = cdp_json_check_keys(&c->in, v, P, parallel_keys, "/parallel"))) return st;
        if ((st = cdp_json_get_int(&c->in, v, P, "stages", 1, MAX_COUNT, 1, &pd->stages))) return st;
        if ((st = cdp_json_get_int(&c->in, v, P, "replicas", 1, MAX_COUNT, 1, &pd->replicas))) return st;
        if ((st = cdp_json_get_int(&c->in, v, P, "micro_batches", 1, CDP_PLAN_MAX_MICRO_BATCHES, 1, &pd->micro_batches)))
            return st;
        const json_t *sj = json_object_get(v, "schedule");
        if (json_is_string(sj) && strcmp(json_string_value(sj), "auto") == 0) pd->schedule_auto = 1;
        else if (json_is_string(sj) && (strchr(json_string_value(sj), '/') || strchr(json_string_value(sj), '.'))) {
            if ((st = load_schedule_file(c, sj, &sch))) return st;
        } else {
            const char *names[CDP_SCHEDULE_COUNT + 1];
            cdp_schedule_names(names);
            if ((st = cdp_json_get_enum(&c->in, v, P, "schedule", names, &sch))) return st;
        }
    }
    pd->schedule = (enum cdp_schedule_kind)sch;
    int inter = pd->schedule == CDP_SCHEDULE_INTERLEAVED && !pd->schedule_file; /* a file's lists need no m % p */
    pd->chunks = pd->schedule_file && pd->chunks > 0 ? pd->chunks : cdp_schedule_has_chunks(pd->schedule) ? 2 : 1;
    if (v && (st = cdp_json_get_int(&c->in, v, P, "chunks", 1, MAX_COUNT, 0, &pd->chunks))) return st;
    if (pd->schedule_file) {
        if (pd->file_chunks > 0 && pd->chunks != pd->file_chunks)
            return cdp_json_fail(&c->in, "/parallel/chunks", "%lld, but the schedule file %s has %lld chunks per rank",
                                 (long long)pd->chunks, pd->schedule_file, (long long)pd->file_chunks);
        if (pd->chunks > 1 && pd->schedule != CDP_SCHEDULE_ZBV) pd->schedule = CDP_SCHEDULE_INTERLEAVED;
    }
    if (pd->schedule == CDP_SCHEDULE_ZBV && pd->chunks != 2)
        return cdp_json_fail(&c->in, "/parallel/chunks",
                             "%lld, but /parallel/schedule \"zbv\" runs exactly 2 chunks per rank (a V); "
                             "leave chunks out or give 2",
                             (long long)pd->chunks);
    if (pd->chunks > 1 && !cdp_schedule_has_chunks(pd->schedule))
        return cdp_json_fail(&c->in, "/parallel/chunks", "%lld needs /parallel/schedule \"interleaved\" (or \"zbv\", 2), not \"%s\"",
                             (long long)pd->chunks, cdp_schedule_name((enum cdp_schedule_kind)sch));
    if (inter && pd->chunks < 2)
        return cdp_json_fail(&c->in, "/parallel/chunks",
                             "/parallel/schedule \"interleaved\" needs at least 2 chunks "
                             "per rank, got %lld",
                             (long long)pd->chunks);
    const json_t *part = v ? json_object_get(v, "partition") : NULL;
    if (part && (st = load_partition(c, part))) return st;
    if (inter && pd->stages != CDP_AUTO && pd->stages < 2)
        return cdp_json_fail(&c->in, "/parallel/stages",
                             "/parallel/schedule \"interleaved\" needs at least 2 stages, "
                             "got %lld",
                             (long long)pd->stages);
    const json_t *pl = v ? json_object_get(v, "placement") : NULL;
    if (pl && (st = load_placement(c, pl))) return st;
    const json_t *bal = v ? json_object_get(v, "balance") : NULL;
    if (bal && (st = load_balance(c, bal))) return st;
    if (v && (st = cdp_json_get_int(&c->in, v, P, "rebalance_every", 0, MAX_COUNT, 0, &pd->rebalance_every))) return st;
    if (pd->schedule_file && (st = check_schedule_file_shape(c))) return st;
    if (v && (st = cdp_json_get_int(&c->in, v, P, "zero", 0, 2, 1, &pd->zero))) return st;
    pd->bucket_mb = CDP_PLAN_BUCKET_MB_DEFAULT;
    if (v && (st = cdp_json_get_number(&c->in, v, P, "bucket_mb", CDP_JSON_NONNEG, &pd->bucket_mb))) return st;
    if (pd->bucket_mb > 1048576)
        return cdp_json_fail(&c->in, "/parallel/bucket_mb", "%g MiB is more than 1 TiB; use 0 for no buckets",
                             pd->bucket_mb);
    char why[256];
    if (pd->zero == 2 && !cdp_plan_zero2_allowed(c->p, why, sizeof why))
        return cdp_json_fail(&c->in, "/parallel/zero", "%s", why);
    if ((st = check_shares(c))) return st;
    if ((st = batch_arithmetic(c))) return st;
    if (inter && pd->stages != CDP_AUTO && pd->micro_batches != CDP_AUTO && pd->micro_batches % pd->stages)
        return cdp_json_fail(&c->in, "/parallel/micro_batches",
                             "%lld is not a multiple of /parallel/stages %lld, as "
                             "the interleaved schedule needs",
                             (long long)pd->micro_batches, (long long)pd->stages);
    return CDP_OK;
}

/* ---- cluster, output --------------------------------------------------------- */

static const char *const cluster_keys[] = {"backend", "topology", "nodes", "devices", "device_memory", "host_memory",
                                           "ranks_per_device", NULL};
static const char *const output_keys[] = {"metrics", "trace", "timeline", "weights", "tensorboard", NULL};

/* /cluster/KEY: a size ("16GiB", "512MB"), a number of bytes, or "auto" (0). */
static cdp_status get_size(struct ld *c, const json_t *v, const char *key, uint64_t *out)
{
    const json_t *mem = json_object_get(v, key);
    if (!mem) return CDP_OK;
    char MP[CDP_JSON_PTR_CAP];
    cdp_json_ptr_key(MP, "/cluster", key);
    const char *what = "a size like \"16GiB\" or \"512MB\", a number of bytes, or \"auto\"";
    if (json_is_integer(mem)) {
        if (json_integer_value(mem) < 0) return cdp_json_expected(&c->in, MP, what, mem);
        *out = (uint64_t)json_integer_value(mem);
    } else if (json_is_string(mem)) {
        const char *s = json_string_value(mem);
        if (strcmp(s, "auto") == 0) {
            *out = 0;
        } else if (strlen(s) != json_string_length(mem) || cdp_parse_size(s, out)) {
            char why[512], g[CDP_JSON_GOT_CAP];
            snprintf(why, sizeof why, "%s", cdp_last_error());
            return cdp_json_fail(&c->in, MP, "expected %s, got %s: %s", what, cdp_json_got(mem, g, sizeof g), why);
        }
    } else {
        return cdp_json_expected(&c->in, MP, what, mem);
    }
    return CDP_OK;
}

static cdp_status load_cluster(struct ld *c, const json_t *v)
{
    struct cdp_cluster_desc *cd = &c->p->cluster;
    cdp_status st;
    int be = 0;
    const char *P = "/cluster";
    if ((st = cdp_json_need_object(&c->in, v, P))) return st;
    if (!v) return CDP_OK;
    if ((st = cdp_json_check_keys(&c->in, v, P, cluster_keys, "/cluster"))) return st;
    /* "auto", then the backends in enum order (cdp_backend_name) */
    const char *backends[CDP_BACKEND_COUNT + 2] = {"auto"};
    for (int k = 0; k < CDP_BACKEND_COUNT; k++) backends[k + 1] = cdp_backend_name((enum cdp_backend)k);
    if ((st = cdp_json_get_enum(&c->in, v, P, "backend", backends, &be))) return st;
    cd->backend_auto = be == 0;
    cd->backend = be == 0 ? CDP_BACKEND_CPU : (enum cdp_backend)(be - 1);
    const json_t *topo = json_object_get(v, "topology");
    if (topo && !(json_is_string(topo) && strcmp(json_string_value(topo), "auto") == 0)) {
        char *spec = NULL;
        if (!json_is_string(topo) || json_string_length(topo) == 0 ||
            strlen(json_string_value(topo)) != json_string_length(topo))
            return cdp_json_expected(&c->in, "/cluster/topology",
                                     "\"auto\", a preset name, \"N x preset\" or a topology "
                                     "file path",
                                     topo);
        /* Presets and "N x preset" are kept as written, files become absolute;
         * the file itself is read by the planner. */
        if (cdp_topology_check_spec(json_string_value(topo), c->base, &spec))
            return cdp_json_context(&c->in, "/cluster/topology");
        free(cd->topology);
        cd->topology = spec;
    }
    if ((st = cdp_json_get_int(&c->in, v, P, "nodes", 1, MAX_COUNT, 0, &cd->nodes))) return st;
    cd->nodes_given = json_object_get(v, "nodes") != NULL;
    if ((st = cdp_json_get_int(&c->in, v, P, "devices", 1, MAX_COUNT, 1, &cd->devices))) return st;
    if ((st = cdp_json_get_int(&c->in, v, P, "ranks_per_device", 1, 64, 0, &cd->ranks_per_device))) return st;
    if ((st = get_size(c, v, "device_memory", &cd->device_memory))) return st;
    if ((st = get_size(c, v, "host_memory", &cd->host_memory))) return st;
    return CDP_OK;
}

static cdp_status load_output(struct ld *c, const json_t *v)
{
    struct cdp_output_desc *od = &c->p->output;
    char **slots[] = {&od->metrics, &od->trace, &od->timeline, &od->weights, &od->tensorboard};
    const int folder[] = {0, 0, 0, 0, 1}; /* tensorboard: a folder of event files */
    cdp_status st;
    if ((st = cdp_json_need_object(&c->in, v, "/output"))) return st;
    if (!v) return CDP_OK;
    if ((st = cdp_json_check_keys(&c->in, v, "/output", output_keys, "/output"))) return st;
    for (int i = 0; output_keys[i]; i++) {
        const json_t *e = json_object_get(v, output_keys[i]);
        char kp[CDP_JSON_PTR_CAP];
        if (!e || json_is_null(e)) continue;
        cdp_json_ptr_key(kp, "/output", output_keys[i]);
        if (!json_is_string(e)) return cdp_json_expected(&c->in, kp, folder[i] ? "a folder path or null"
                                                                                   : "a file path or null", e);
        if ((st = get_output_path(c, e, kp, folder[i], slots[i]))) return st;
    }
    return CDP_OK;
}

/* Stages x replicas must fit the devices, when both are known. */
static cdp_status check_fit(const char *name, const struct cdp_plan *p)
{
    const struct cdp_parallel_desc *pd = &p->parallel;
    const struct cdp_cluster_desc *cd = &p->cluster;
    if (cd->devices == CDP_AUTO) return CDP_OK;
    int64_t total; /* more than any stages x replicas when it overflows */
    if (__builtin_mul_overflow(cd->nodes, cd->devices, &total) ||
        __builtin_mul_overflow(total, cd->ranks_per_device, &total))
        total = INT64_MAX;
    if (pd->stages != CDP_AUTO && pd->replicas != CDP_AUTO && pd->stages * pd->replicas > total)
        return cdp_fail(CDP_ERR_INVALID, "%s: /parallel/stages: %lld stages x /parallel/replicas %lld = %lld "
                        "devices, but /cluster/nodes %lld x /cluster/devices %lld%s gives only %lld",
                        name, (long long)pd->stages, (long long)pd->replicas,
                        (long long)(pd->stages * pd->replicas), (long long)cd->nodes,
                        (long long)cd->devices, cd->ranks_per_device > 1 ? " x /cluster/ranks_per_device" : "",
                        (long long)total);
    if (pd->placement == CDP_PLACEMENT_EXPLICIT) {
        for (int64_t i = 0; i < pd->stages * pd->replicas; i++)
            if (pd->placement_map[i] >= total)
                return cdp_fail(CDP_ERR_INVALID, "%s: /parallel/placement/%lld/%lld: device %lld does not "
                                "exist; /cluster/nodes %lld x /cluster/devices %lld gives devices 0 to %lld",
                                name, (long long)(i / pd->replicas), (long long)(i % pd->replicas),
                                (long long)pd->placement_map[i], (long long)cd->nodes,
                                (long long)cd->devices, (long long)(total - 1));
    }
    return CDP_OK;
}

/* ---- entry points ------------------------------------------------------------ */

/* "planner" and "layout": written by --dry-run --json and training beside the plan; the loader skips
 * them (the layout is read by cdp_layout_of_planned, pipeline/layout.h). */
static const char *const top_keys[] = {"model", "data", "train", "parallel", "cluster", "output", "planner",
                                       "layout", NULL};

static void set_defaults(struct cdp_plan *p)
{
    p->data.source = CDP_DATA_SYNTHETIC;
    p->data.seed = 1;
    p->train.steps = 10;
    p->train.global_batch = CDP_AUTO;
    p->train.micro_batch = 1;
    p->train.seed = 1;
    p->train.recompute_auto = 1;
    p->train.log_every = 10;
    p->train.eval_batches = 4;
    p->train.timeout_s = 300;
    p->train.checkpoint.every = 100;
    p->train.checkpoint.keep = 3;
    p->train.restart.max = 0;
    p->train.restart.exclude_failed = 1;
    p->parallel.stages = 1;
    p->parallel.replicas = 1;
    p->parallel.micro_batches = CDP_AUTO;
    p->parallel.schedule = CDP_SCHEDULE_1F1B;
    p->parallel.chunks = 1;
    p->parallel.placement = CDP_PLACEMENT_TOPOLOGY;
    p->parallel.zero = CDP_AUTO;
    p->cluster.backend_auto = 1;
    p->cluster.nodes = 1;
    p->cluster.devices = CDP_AUTO;
    p->cluster.ranks_per_device = 1;
}

static cdp_status load_json(struct ld *c, const json_t *root)
{
    cdp_status st;
    if (!json_is_object(root)) return cdp_json_expected(&c->in, "top level", "an object", root);
    if ((st = cdp_json_check_keys(&c->in, root, "", top_keys, "a plan"))) return st;
    if ((st = load_model(c, json_object_get(root, "model")))) return st;
    if (c->p->model.kind != CDP_MODEL_GPT) {
        int64_t params;
        if ((st = check_shapes(c, &c->p->model, &params))) return st;
    }
    if ((st = load_data(c, json_object_get(root, "data")))) return st;
    if ((st = load_train(c, json_object_get(root, "train")))) return st;
    if ((st = check_sizes(c))) return st;
    if ((st = load_parallel(c, json_object_get(root, "parallel")))) return st;
    if ((st = load_cluster(c, json_object_get(root, "cluster")))) return st;
    if ((st = load_output(c, json_object_get(root, "output")))) return st;
    return check_fit(c->in.file, c->p);
}

static int blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r') return 0;
    return 1;
}

/* Parses text of n bytes and loads it; base_dir may be NULL (current folder). */
static cdp_status load_text(const char *text, size_t n, const char *name, const char *base_dir,
                            struct cdp_plan **out)
{
    cdp_status st;
    struct ld c = {.in = {.file = name}};
    json_t *root = NULL;
    if (blank(text, n))
        return cdp_fail(CDP_ERR_INVALID, "%s: empty file; expected a JSON object with at least a "
                                         "\"model\" section", name);
    json_error_t err;
    root = json_loadb(text, n, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &err);
    if (!root)
        return cdp_fail(CDP_ERR_INVALID, "%s:%d:%d: %s", name, err.line, err.column, err.text);
    c.base = realpath(base_dir ? base_dir : ".", NULL);
    if (!c.base) {
        int e = errno;
        json_decref(root);
        return cdp_fail(CDP_ERR_INVALID, "%s: cannot resolve the plan's folder \"%s\": %s", name,
                        base_dir ? base_dir : ".", strerror(e));
    }
    c.p = calloc(1, sizeof *c.p);
    if (!c.p) {
        st = cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", name);
        goto fail;
    }
    set_defaults(c.p);
    c.p->source = strdup(name);
    c.p->cluster.topology = strdup("auto");
    if (!c.p->source || !c.p->cluster.topology) {
        st = cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", name);
        goto fail;
    }
    if ((st = load_json(&c, root))) goto fail;
    CDP_DEBUG(PLAN, "%s: loaded (%s model, %lld units)", name, cdp_plan_model_kind_names[c.p->model.kind],
              (long long)cdp_plan_model_units(c.p));
    json_decref(root);
    free(c.base);
    *out = c.p;
    return CDP_OK;
fail:
    json_decref(root);
    free(c.base);
    cdp_plan_free(c.p);
    return st;
}

cdp_status cdp_plan_load_string(const char *json, const char *name, const char *base_dir,
                                struct cdp_plan **out)
{
    CDP_ASSERT(json && out);
    return load_text(json, strlen(json), name ? name : "<plan>", base_dir, out);
}

cdp_status cdp_plan_load(const char *path, struct cdp_plan **out)
{
    CDP_ASSERT(path && out);
    FILE *f = fopen(path, "rb");
    if (!f) return cdp_fail(CDP_ERR_INVALID, "%s: cannot read: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || S_ISDIR(sb.st_mode)) {
        int e = S_ISDIR(sb.st_mode) ? EISDIR : errno;
        fclose(f);
        return cdp_fail(CDP_ERR_INVALID, "%s: cannot read: %s", path, strerror(e));
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n == cap) {
            if (cap >= MAX_PLAN_BYTES) {
                free(buf);
                fclose(f);
                return cdp_fail(CDP_ERR_INVALID, "%s: larger than %u MiB; not a plan file", path,
                                MAX_PLAN_BYTES >> 20);
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (k == 0) break;
    }
    if (!buf) {
        fclose(f);
        return cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", path);
    }
    if (ferror(f)) {
        int e = errno;
        free(buf);
        fclose(f);
        return cdp_fail(CDP_ERR_INVALID, "%s: cannot read: %s", path, strerror(e));
    }
    fclose(f);
    /* Relative paths in the plan start at the plan's folder. */
    char *dir = strdup(path);
    if (!dir) {
        free(buf);
        return cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", path);
    }
    char *slash = strrchr(dir, '/');
    const char *base = ".";
    if (slash) {
        if (slash == dir) slash[1] = '\0';
        else *slash = '\0';
        base = dir;
    }
    cdp_status st = load_text(buf, n, path, base, out);
    free(dir);
    free(buf);
    return st;
}

cdp_status cdp_plan_resolve(struct cdp_plan *plan, const struct cdp_machine_info *machine)
{
    CDP_ASSERT(plan && machine);
    struct cdp_cluster_desc *cd = &plan->cluster;
    if (cd->backend_auto) cd->backend = machine->gpus > 0 ? CDP_BACKEND_CUDA : CDP_BACKEND_CPU;
    cd->backend_auto = 0;
    if (cdp_backend_is_gpu(cd->backend) && cd->devices == CDP_AUTO) {
        if (machine->gpus > 0) {
            cd->devices = machine->gpus;
        } else if (strcmp(cd->topology, "auto") == 0) {
            return cdp_fail(CDP_ERR_INVALID, "%s: /cluster/backend: \"cuda\" needs GPUs, and none is usable "
                            "here (%s); name a topology file in /cluster/topology or set /cluster/devices "
                            "to plan for a machine you do not have", plan->source,
                            machine->no_gpu_why ? machine->no_gpu_why : "no GPU found");
        }
    }
    CDP_DEBUG(PLAN, "%s: resolved backend %s, %lld devices per node", plan->source,
              cdp_backend_name(cd->backend), (long long)cd->devices);
    return check_fit(plan->source, plan);
}

int64_t cdp_plan_model_units(const struct cdp_plan *plan)
{
    if (plan->model.kind == CDP_MODEL_GPT) return plan->model.layers + 2;
    return plan->model.n_layers;
}

int64_t cdp_plan_param_count(const struct cdp_plan *plan)
{
    const struct cdp_model_desc *m = &plan->model;
    int64_t E = m->embed, total, t;
    if (m->kind != CDP_MODEL_GPT) {
        struct ld c = {.in = {.file = plan->source}};
        /* The list was checked at load, so this cannot fail. */
        return check_shapes(&c, m, &total) ? -1 : total;
    }
    /* the embedding and the blocks as their types count them (cdp_model_desc_unit), the head's final norm
     * (2E: weight and bias; E: an RMS norm's weight) and its projection unless tied */
    const struct cdp_shape tokens = {1, {m->context}}, rows = {2, {m->context, E}};
    const struct cdp_layer_desc emb = cdp_model_desc_unit(m, 0), block = cdp_model_desc_unit(m, 1);
    total = cdp_layer_def(emb.type)->params(&emb, &tokens);
    t = cdp_layer_def(block.type)->params(&block, &rows);
    if (total < 0 || t < 0 || __builtin_mul_overflow(t, m->layers, &t) || __builtin_add_overflow(total, t, &total) ||
        __builtin_add_overflow(total, (m->arch == CDP_ARCH_LLAMA ? 1 : 2) * E, &total))
        return -1;
    if (!m->tie_embeddings && (__builtin_mul_overflow(m->vocab, E, &t) || __builtin_add_overflow(total, t, &total)))
        return -1;
    return total;
}

void cdp_plan_free(struct cdp_plan *plan)
{
    if (!plan) return;
    free(plan->source);
    free(plan->model.hidden);
    free(plan->model.channels);
    free(plan->model.layer_list);
    free(plan->data.path);
    free(plan->data.labels);
    for (int i = 0; i < plan->data.n_paths; i++) free(plan->data.paths[i]);
    free(plan->data.paths);
    for (int i = 0; i < plan->data.n_val_paths; i++) free(plan->data.val_paths[i]);
    free(plan->data.val_paths);
    free(plan->train.checkpoint.dir);
    free(plan->parallel.partition);
    free(plan->parallel.schedule_file);
    free(plan->parallel.placement_map);
    free(plan->parallel.shares);
    free(plan->cluster.topology);
    free(plan->output.metrics);
    free(plan->output.trace);
    free(plan->output.timeline);
    free(plan->output.weights);
    free(plan->output.tensorboard);
    free(plan->model.weights);
    free(plan);
}
