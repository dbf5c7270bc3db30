/* Hugging Face folders (model/hf.h): config.json read into a model's
 * description and written from one, one table per architecture. */
#include "model/hf.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cdp/core.h"
#include "core/file.h"
#include "core/json_check.h"
#include "model/hf_gpt2.h"
#include "model/model.h"

enum hf_type { HF_INT, HF_BOOL, HF_REAL };

/* One config key of an architecture and the plan key it fills. */
struct hf_key {
    const char *hf;   /* "n_layer" */
    const char *plan; /* "layers" */
};

/* A config key that fills a field of the description. */
struct hf_field {
    struct hf_key key;
    size_t off;        /* int64_t (HF_INT), int (HF_BOOL) or double (HF_REAL) in struct cdp_model_desc */
    enum hf_type type;
    int required;      /* else def */
    double def;
    const char *alias; /* an older name transformers also reads ("n_ctx"), or NULL */
};

/* One architecture: its names, our family, its fields, what else its
 * config must say for our model to be it, and what else export writes. */
struct hf_arch {
    const char *architecture, *model_type;
    enum cdp_model_arch arch;
    const char *preset;
    const struct hf_field *fields;
    cdp_status (*check)(const struct cdp_json_in *in, const json_t *cfg, struct cdp_model_desc *md);
    int (*extra)(json_t *cfg, const struct cdp_model_desc *md);
};

#define F(field) offsetof(struct cdp_model_desc, field)

/* ---- GPT-2 ---------------------------------------------------------------------------- */

static const struct hf_field gpt2_fields[] = {
    {{"vocab_size", "vocab"}, F(vocab), HF_INT, 1, 0, NULL},
    {{"n_positions", "context"}, F(context), HF_INT, 1, 0, "n_ctx"},
    {{"n_embd", "embed"}, F(embed), HF_INT, 1, 0, NULL},
    {{"n_layer", "layers"}, F(layers), HF_INT, 1, 0, NULL},
    {{"n_head", "heads"}, F(heads), HF_INT, 1, 0, NULL},
    {{"tie_word_embeddings", "tie_embeddings"}, F(tie_embeddings), HF_BOOL, 0, 1, NULL},
    {{NULL, NULL}, 0, HF_INT, 0, 0, NULL},
};
/* What our GPT fixes: GPT-2's layernorm eps, the tanh GELU, a 4C MLP,
 * attention scaled by 1/sqrt(head size) alone. */
static cdp_status gpt2_check(const struct cdp_json_in *in, const json_t *cfg, struct cdp_model_desc *md)
{
    char got[CDP_JSON_GOT_CAP];
    const json_t *eps = json_object_get(cfg, "layer_norm_epsilon");
    if (eps && (!json_is_number(eps) || fabs(json_number_value(eps) - 1e-5) > 1e-12))
        return cdp_json_fail(in, "/layer_norm_epsilon", "%s; cdphybrid's GPT normalises with eps 1e-5 (GPT-2's)",
                             cdp_json_got(eps, got, sizeof got));
    static const char *const gelus[] = {"gelu_new", "gelu_pytorch_tanh", "gelu_fast", NULL};
    const json_t *act = json_object_get(cfg, "activation_function");
    if (act && (!json_is_string(act) || cdp_json_word_index(json_string_value(act), gelus) < 0))
        return cdp_json_fail(in, "/activation_function", "%s; cdphybrid's GPT has GELU's tanh form (\"gelu_new\", "
                             "\"gelu_pytorch_tanh\", \"gelu_fast\")", cdp_json_got(act, got, sizeof got));
    const json_t *inner = json_object_get(cfg, "n_inner");
    if (inner && !json_is_null(inner) && (!json_is_integer(inner) || json_integer_value(inner) != 4 * md->embed))
        return cdp_json_fail(in, "/n_inner", "%s; cdphybrid's GPT has an MLP of 4 x n_embd (%lld): null or that",
                             cdp_json_got(inner, got, sizeof got), (long long)(4 * md->embed));
    const json_t *inv = json_object_get(cfg, "scale_attn_by_inverse_layer_idx");
    if (json_is_true(inv))
        return cdp_json_fail(in, "/scale_attn_by_inverse_layer_idx", "true is not implemented (false: attention "
                             "scaled by 1/sqrt(head size) alone)");
    const json_t *scale = json_object_get(cfg, "scale_attn_weights");
    if (json_is_false(scale))
        return cdp_json_fail(in, "/scale_attn_weights", "false is not implemented (true: scaled by 1/sqrt(head "
                             "size))");
    if (md->embed % md->heads)
        return cdp_json_fail(in, "/n_head", "%lld does not divide n_embd %lld", (long long)md->heads,
                             (long long)md->embed);
    return CDP_OK;
}

static int gpt2_extra(json_t *c, const struct cdp_model_desc *md)
{
    json_t *eos = md->vocab == 50257 ? json_integer(50256) : json_null(); /* GPT-2's tokenizer's <|endoftext|> */
    int bad = json_object_set_new(c, "n_ctx", json_integer(md->context));
    bad |= json_object_set_new(c, "n_inner", json_null()); /* 4 x n_embd, as ours */
    bad |= json_object_set_new(c, "activation_function", json_string("gelu_new")); /* the tanh form, as ours */
    bad |= json_object_set_new(c, "layer_norm_epsilon", json_real(1e-5));
    bad |= json_object_set_new(c, "initializer_range", json_real(0.02));
    /* cdphybrid trains without dropout */
    bad |= json_object_set_new(c, "resid_pdrop", json_real(0.0));
    bad |= json_object_set_new(c, "embd_pdrop", json_real(0.0));
    bad |= json_object_set_new(c, "attn_pdrop", json_real(0.0));
    bad |= json_object_set_new(c, "scale_attn_weights", json_true());
    bad |= json_object_set_new(c, "scale_attn_by_inverse_layer_idx", json_false());
    bad |= json_object_set_new(c, "reorder_and_upcast_attn", json_false());
    bad |= json_object_set_new(c, "bos_token_id", json_incref(eos));
    bad |= json_object_set_new(c, "eos_token_id", eos);
    return bad;
}

/* ---- Llama ----------------------------------------------------------------------------------- */

static const struct hf_field llama_fields[] = {
    {{"vocab_size", "vocab"}, F(vocab), HF_INT, 1, 0, NULL},
    {{"max_position_embeddings", "context"}, F(context), HF_INT, 1, 0, NULL},
    {{"hidden_size", "dim"}, F(embed), HF_INT, 1, 0, NULL},
    {{"num_hidden_layers", "layers"}, F(layers), HF_INT, 1, 0, NULL},
    {{"num_attention_heads", "heads"}, F(heads), HF_INT, 1, 0, NULL},
    {{"num_key_value_heads", "kv_heads"}, F(kv_heads), HF_INT, 0, 0, NULL}, /* absent: heads */
    {{"intermediate_size", "hidden"}, F(ffn_hidden), HF_INT, 1, 0, NULL},
    {{"rms_norm_eps", "norm_eps"}, F(norm_eps), HF_REAL, 0, 1e-6, NULL}, /* LlamaConfig's default */
    {{"rope_theta", "rope_theta"}, F(rope.theta), HF_REAL, 0, 10000, NULL}, /* or in rope_parameters */
    {{"tie_word_embeddings", "tie_embeddings"}, F(tie_embeddings), HF_BOOL, 0, 0, NULL},
    {{NULL, NULL}, 0, HF_INT, 0, 0, NULL},
};

/* A number of a rope object at ptr/key into *out. */
static cdp_status rope_number(const struct cdp_json_in *in, const json_t *o, const char *ptr, const char *key,
                              double *out)
{
    char p[CDP_JSON_PTR_CAP];
    cdp_json_ptr_key(p, ptr, key);
    const json_t *v = json_object_get(o, key);
    if (!v) return cdp_json_fail(in, p, "missing; the llama3 rope scaling needs it");
    return cdp_json_number(in, v, p, CDP_JSON_POSITIVE, out);
}

/* What our Llama fixes (SiLU, no biases, head_dim = hidden_size / heads) and
 * its rotary embeddings: transformers 5's rope_parameters, or 4's rope_theta
 * and rope_scaling; of the scalings, llama3 (and none). */
static cdp_status llama_check(const struct cdp_json_in *in, const json_t *cfg, struct cdp_model_desc *md)
{
    char got[CDP_JSON_GOT_CAP];
    cdp_status st;
    const json_t *act = json_object_get(cfg, "hidden_act");
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu")))
        return cdp_json_fail(in, "/hidden_act", "%s; cdphybrid's Llama has a SwiGLU MLP (\"silu\")",
                             cdp_json_got(act, got, sizeof got));
    static const char *const biases[] = {"attention_bias", "mlp_bias", NULL};
    for (int i = 0; biases[i]; i++) {
        const json_t *b = json_object_get(cfg, biases[i]);
        char p[CDP_JSON_PTR_CAP];
        cdp_json_ptr_key(p, "", biases[i]);
        if (b && !json_is_false(b)) return cdp_json_fail(in, p, "%s; cdphybrid's Llama has no biases (false)",
                                                         cdp_json_got(b, got, sizeof got));
    }
    if (!json_object_get(cfg, "num_key_value_heads")) md->kv_heads = md->heads;
    if (md->embed % md->heads)
        return cdp_json_fail(in, "/num_attention_heads", "%lld does not divide hidden_size %lld", (long long)md->heads,
                             (long long)md->embed);
    if (md->heads % md->kv_heads)
        return cdp_json_fail(in, "/num_key_value_heads", "%lld does not divide num_attention_heads %lld",
                             (long long)md->kv_heads, (long long)md->heads);
    const json_t *hd = json_object_get(cfg, "head_dim");
    if (hd && !json_is_null(hd) && (!json_is_integer(hd) || json_integer_value(hd) != md->embed / md->heads))
        return cdp_json_fail(in, "/head_dim", "%s; cdphybrid's Llama has heads of hidden_size / num_attention_heads "
                             "(%lld)", cdp_json_got(hd, got, sizeof got), (long long)(md->embed / md->heads));
    if ((md->embed / md->heads) % 2)
        return cdp_json_fail(in, "/num_attention_heads", "heads of %lld dimensions; rotary embeddings need an even "
                             "number", (long long)(md->embed / md->heads));
    /* the rotary embeddings */
    const json_t *params = json_object_get(cfg, "rope_parameters");
    const char *pptr = "/rope_parameters";
    if (!params || json_is_null(params)) {
        params = json_object_get(cfg, "rope_scaling");
        pptr = "/rope_scaling";
    } else if (!json_is_object(params)) {
        return cdp_json_expected(in, pptr, "an object", params);
    } else if (json_object_get(params, "rope_theta") &&
               (st = rope_number(in, params, pptr, "rope_theta", &md->rope.theta))) {
        return st;
    }
    if (!params || json_is_null(params)) return CDP_OK;
    if (!json_is_object(params)) return cdp_json_expected(in, pptr, "null or an object", params);
    const json_t *type = json_object_get(params, "rope_type");
    const char *tkey = "rope_type";
    if (!type) {
        type = json_object_get(params, "type");
        tkey = "type";
    }
    char tptr[CDP_JSON_PTR_CAP];
    cdp_json_ptr_key(tptr, pptr, tkey);
    if (!type || (json_is_string(type) && !strcmp(json_string_value(type), "default"))) return CDP_OK;
    if (!json_is_string(type) || strcmp(json_string_value(type), "llama3"))
        return cdp_json_fail(in, tptr, "%s: a rope scaling cdphybrid does not implement (it implements \"llama3\" "
                             "and \"default\": none)", cdp_json_got(type, got, sizeof got));
    double old = 0;
    if ((st = rope_number(in, params, pptr, "factor", &md->rope.factor)) ||
        (st = rope_number(in, params, pptr, "low_freq_factor", &md->rope.low_freq_factor)) ||
        (st = rope_number(in, params, pptr, "high_freq_factor", &md->rope.high_freq_factor)) ||
        (st = rope_number(in, params, pptr, "original_max_position_embeddings", &old)))
        return st;
    md->rope.original_context = (int64_t)old;
    if (md->rope.high_freq_factor <= md->rope.low_freq_factor)
        return cdp_json_fail(in, pptr, "high_freq_factor %g is not above low_freq_factor %g", md->rope.high_freq_factor,
                             md->rope.low_freq_factor);
    return CDP_OK;
}

static int llama_extra(json_t *c, const struct cdp_model_desc *md)
{
    int bad = json_object_set_new(c, "head_dim", json_integer(md->embed / md->heads));
    bad |= json_object_set_new(c, "hidden_act", json_string("silu"));
    bad |= json_object_set_new(c, "attention_bias", json_false());
    bad |= json_object_set_new(c, "mlp_bias", json_false());
    bad |= json_object_set_new(c, "attention_dropout", json_real(0.0));
    bad |= json_object_set_new(c, "initializer_range", json_real(0.02));
    bad |= json_object_set_new(c, "pretraining_tp", json_integer(1));
    /* transformers 4's keys, which 5 reads too */
    json_t *scaling = json_null();
    if (md->rope.factor > 0) {
        scaling = json_object();
        bad |= !scaling || json_object_set_new(scaling, "rope_type", json_string("llama3")) ||
               json_object_set_new(scaling, "factor", json_real(md->rope.factor)) ||
               json_object_set_new(scaling, "low_freq_factor", json_real(md->rope.low_freq_factor)) ||
               json_object_set_new(scaling, "high_freq_factor", json_real(md->rope.high_freq_factor)) ||
               json_object_set_new(scaling, "original_max_position_embeddings",
                                   json_integer(md->rope.original_context));
    }
    bad |= json_object_set_new(c, "rope_scaling", scaling);
    bad |= json_object_set_new(c, "bos_token_id", json_null()); /* the tokenizer's, which cdphybrid does not know */
    bad |= json_object_set_new(c, "eos_token_id", json_null());
    return bad;
}

/* ---- the architectures ------------------------------------------------------------------- */

static const struct hf_arch archs[] = {
    {"GPT2LMHeadModel", "gpt2", CDP_ARCH_GPT2, "gpt", gpt2_fields, gpt2_check, gpt2_extra},
    {"LlamaForCausalLM", "llama", CDP_ARCH_LLAMA, "llama", llama_fields, llama_check, llama_extra},
};
#define N_ARCHS ((int)(sizeof archs / sizeof archs[0]))

static const struct hf_arch *arch_of(const struct cdp_model_desc *md)
{
    for (int i = 0; md->kind == CDP_MODEL_GPT && i < N_ARCHS; i++)
        if (archs[i].arch == md->arch) return &archs[i];
    return NULL;
}

const char *cdp_hf_family(const struct cdp_model_desc *md)
{
    const struct hf_arch *a = arch_of(md);
    return a ? a->architecture : NULL;
}

/* "a", "b" of every architecture's name, for messages. */
static void arch_names(char *buf, size_t cap)
{
    buf[0] = '\0';
    for (int i = 0; i < N_ARCHS; i++) {
        size_t n = strlen(buf);
        snprintf(buf + n, cap - n, "%s\"%s\" (model_type \"%s\")", i ? ", " : "", archs[i].architecture,
                 archs[i].model_type);
    }
}

static int is_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

cdp_status cdp_hf_read_config(const char *dir, struct cdp_model_desc *md, char **weights)
{
    CDP_ASSERT(dir && md && weights);
    char path[PATH_MAX + 32], known[512];
    struct stat sb;
    if (stat(dir, &sb) != 0) return cdp_fail(CDP_ERR_IO, "%s: cannot open: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return cdp_fail(CDP_ERR_INVALID, "%s: not a folder; expected a Hugging Face model folder (config.json and "
                        "model.safetensors)", dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    const struct cdp_json_in in = {.file = path};
    json_error_t jerr;
    json_t *cfg = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!cfg) {
        if (!is_file(path)) return cdp_fail(CDP_ERR_INVALID, "%s: missing: a Hugging Face model folder has a "
                                            "config.json", path);
        return cdp_fail(CDP_ERR_INVALID, "%s: line %d, column %d: %s", path, jerr.line, jerr.column, jerr.text);
    }
    cdp_status st = CDP_OK;
    char got[CDP_JSON_GOT_CAP];
    const struct hf_arch *a = NULL;
    const json_t *archv = json_object_get(cfg, "architectures"), *type = json_object_get(cfg, "model_type");
    arch_names(known, sizeof known);
    if (!json_is_object(cfg)) {
        st = cdp_json_expected(&in, "", "an object", cfg);
        goto done;
    }
    if (json_is_array(archv) && json_array_size(archv) > 0) {
        const char *name = json_string_value(json_array_get(archv, 0));
        for (int i = 0; name && i < N_ARCHS && !a; i++)
            if (!strcmp(archs[i].architecture, name)) a = &archs[i];
        if (!a) {
            st = cdp_json_fail(&in, "/architectures/0", "%s: not an architecture cdphybrid reads; it reads %s",
                               cdp_json_got(json_array_get(archv, 0), got, sizeof got), known);
            goto done;
        }
    } else {
        const char *name = json_string_value(type);
        for (int i = 0; name && i < N_ARCHS && !a; i++)
            if (!strcmp(archs[i].model_type, name)) a = &archs[i];
        if (!a) {
            st = cdp_json_fail(&in, type ? "/model_type" : "/architectures", "%s: not an architecture cdphybrid "
                               "reads; it reads %s", cdp_json_got(type ? type : archv, got, sizeof got), known);
            goto done;
        }
    }
    memset(md, 0, sizeof *md);
    md->kind = CDP_MODEL_GPT;
    md->arch = a->arch;
    md->loss = CDP_LOSS_CROSS_ENTROPY;
    snprintf(md->preset, sizeof md->preset, "%s", a->preset);
    for (const struct hf_field *f = a->fields; f->key.hf; f++) {
        char ptr[CDP_JSON_PTR_CAP];
        const json_t *v = json_object_get(cfg, f->key.hf);
        const char *name = f->key.hf;
        if (!v && f->alias && (v = json_object_get(cfg, f->alias))) name = f->alias;
        cdp_json_ptr_key(ptr, "", name);
        if (!v && f->required) {
            st = cdp_json_fail(&in, ptr, "missing; a %s config gives it (our /model/%s)", a->architecture,
                               f->key.plan);
            goto done;
        }
        switch (f->type) {
        case HF_REAL:
            *(double *)((char *)md + f->off) = f->def;
            if (v && (st = cdp_json_number(&in, v, ptr, CDP_JSON_POSITIVE, (double *)((char *)md + f->off))))
                goto done;
            break;
        case HF_INT: {
            int64_t x = (int64_t)f->def;
            if (v && (st = cdp_json_int(&in, v, ptr, 1, f->off == F(layers) ? 4096 : CDP_PLAN_MAX_COUNT, 0, NULL,
                                        &x)))
                goto done;
            if (f->off == F(context) && x > CDP_PLAN_MAX_CONTEXT) x = CDP_PLAN_MAX_CONTEXT;
            *(int64_t *)((char *)md + f->off) = x;
            break;
        }
        case HF_BOOL:
            if (v && !json_is_boolean(v)) {
                st = cdp_json_expected(&in, ptr, "true or false", v);
                goto done;
            }
            *(int *)((char *)md + f->off) = v ? json_is_true(v) : (int)f->def;
            break;
        }
    }
    if ((st = a->check(&in, cfg, md))) goto done;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (!is_file(path)) snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (!is_file(path)) {
        snprintf(path, sizeof path, "%s/pytorch_model.bin", dir);
        st = cdp_fail(CDP_ERR_INVALID, "%s: no model.safetensors and no model.safetensors.index.json (sharded)%s; "
                      "cdphybrid reads safetensors: save_pretrained(dir) writes them", dir,
                      is_file(path) ? ", only pytorch_model.bin (torch's pickle format)" : "");
        goto done;
    }
    if (!(*weights = realpath(path, NULL))) st = cdp_fail(CDP_ERR_IO, "%s: %s", path, strerror(errno));
done:
    json_decref(cfg);
    return st;
}

json_t *cdp_hf_config_json(const struct cdp_model_desc *md)
{
    const struct hf_arch *a = arch_of(md);
    if (!a) return NULL;
    json_t *c = json_object(), *arch = json_array();
    int bad = !c || !arch || json_array_append_new(arch, json_string(a->architecture));
    bad |= json_object_set_new(c, "architectures", arch);
    bad |= json_object_set_new(c, "model_type", json_string(a->model_type));
    for (const struct hf_field *f = a->fields; !bad && f->key.hf; f++) {
        const char *at = (const char *)md + f->off;
        switch (f->type) {
        case HF_REAL: bad |= json_object_set_new(c, f->key.hf, json_real(*(const double *)at)); break;
        case HF_INT: bad |= json_object_set_new(c, f->key.hf, json_integer(*(const int64_t *)at)); break;
        case HF_BOOL: bad |= json_object_set_new(c, f->key.hf, json_boolean(*(const int *)at)); break;
        }
    }
    bad |= a->extra(c, md);
    bad |= json_object_set_new(c, "use_cache", json_true());
    bad |= json_object_set_new(c, "torch_dtype", json_string("float32"));
    if (bad) {
        json_decref(c);
        return NULL;
    }
    return c;
}

json_t *cdp_hf_generation_config_json(const struct cdp_model_desc *md)
{
    json_t *cfg = cdp_hf_config_json(md);
    if (!cfg) return NULL;
    json_t *g = json_object();
    int bad = !g;
    static const char *const keys[] = {"bos_token_id", "eos_token_id", NULL};
    for (int i = 0; !bad && keys[i]; i++) {
        json_t *v = json_object_get(cfg, keys[i]);
        if (v && !json_is_null(v)) bad |= json_object_set(g, keys[i], v);
    }
    bad |= json_object_set_new(g, "_from_model_config", json_true());
    json_decref(cfg);
    if (bad) {
        json_decref(g);
        return NULL;
    }
    return g;
}

cdp_status cdp_hf_plan_keys(const struct cdp_json_in *in, const json_t *m, const char *config,
                            struct cdp_model_desc *md)
{
    const struct hf_arch *a = arch_of(md);
    CDP_ASSERT(a);
    const char *known[24] = {"from", "unused_tensors"};
    int nk = 2;
    for (const struct hf_field *f = a->fields; f->key.hf && nk < 23; f++) known[nk++] = f->key.plan;
    known[nk] = NULL;
    char what[96];
    snprintf(what, sizeof what, "a %s read /from a Hugging Face folder", a->model_type);
    cdp_status st = cdp_json_check_keys(in, m, "/model", known, what);
    if (st) return st;
    for (const struct hf_field *f = a->fields; f->key.hf; f++) {
        const json_t *v = json_object_get(m, f->key.plan);
        if (!v) continue;
        char ptr[CDP_JSON_PTR_CAP];
        cdp_json_ptr_key(ptr, "/model", f->key.plan);
        int64_t x = 0, have = 0;
        switch (f->type) {
        case HF_REAL: {
            double d = 0, hd = *(double *)((char *)md + f->off);
            if ((st = cdp_json_number(in, v, ptr, CDP_JSON_POSITIVE, &d))) return st;
            if (d == hd) continue;
            char got[CDP_JSON_GOT_CAP];
            return cdp_json_fail(in, ptr, "%s, but %s has %s %g; with /model/from only /model/context may differ "
                                 "(a shorter one)", cdp_json_got(v, got, sizeof got), config, f->key.hf, hd);
        }
        case HF_INT:
            if ((st = cdp_json_int(in, v, ptr, 1, CDP_PLAN_MAX_COUNT, 0, NULL, &x))) return st;
            have = *(int64_t *)((char *)md + f->off);
            break;
        case HF_BOOL:
            if (!json_is_boolean(v)) return cdp_json_expected(in, ptr, "true or false", v);
            x = json_is_true(v);
            have = *(int *)((char *)md + f->off);
            break;
        }
        if (f->off == F(context) && x <= have) {
            md->context = x;
            continue;
        }
        if (x == have) continue;
        char got[CDP_JSON_GOT_CAP];
        return cdp_json_fail(in, ptr, "%s, but %s has %s %lld%s; with /model/from only /model/context may differ "
                             "(a shorter one)", cdp_json_got(v, got, sizeof got), config, f->key.hf,
                             (long long)have, f->type == HF_BOOL ? (have ? " (true)" : " (false)") : "");
    }
    return CDP_OK;
}

/* mkdir -p */
static cdp_status make_dirs(const char *path)
{
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return cdp_fail(CDP_ERR_INVALID, "%s: path too long", path);
    for (char *q = buf + 1;; q++) {
        const int end = *q == '\0';
        if (*q == '/' || end) {
            *q = '\0';
            struct stat sb;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return cdp_fail(CDP_ERR_IO, "%s: cannot make the folder: %s", buf, strerror(errno));
            if (stat(buf, &sb) != 0 || !S_ISDIR(sb.st_mode))
                return cdp_fail(CDP_ERR_IO, "%s: not a folder", buf);
            if (end) break;
            *q = '/';
        }
    }
    return CDP_OK;
}

/* A JSON document written whole, two-space indented, with a final newline. */
static cdp_status write_json(const char *path, json_t *doc)
{
    char *text = doc ? json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15)) : NULL;
    json_decref(doc);
    if (!text) return cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", path);
    size_t len = strlen(text);
    text[len] = '\n'; /* the NUL's byte becomes the last line's end; the NUL is not written */
    cdp_status st = cdp_write_file_atomic(path, text, len + 1);
    free(text);
    return st;
}

#define STAGE ((uint64_t)8 << 20)

cdp_status cdp_hf_write_folder(const char *dir, const struct cdp_model_desc *md,
                               const struct cdp_safetensors_tensor *ts, int n, const char *const *meta, int n_meta,
                               cdp_safetensors_fetch_fn fetch, void *ctx, uint64_t shard_bytes)
{
    char path[PATH_MAX + 64], file[64];
    cdp_status st = make_dirs(dir);
    if (st) return st;
    /* shard k holds tensors [first[k], first[k + 1]) */
    int *first = calloc((size_t)n + 2, sizeof *first), shards = 0;
    json_t *map = json_object(), *index = json_object(), *imeta = json_object();
    if (!first || !map || !index || !imeta) {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
        goto done;
    }
    uint64_t at = 0, total = 0;
    for (int i = 0; i < n; i++) {
        if (i == 0 || (at > 0 && at + ts[i].nbytes > shard_bytes)) {
            first[shards++] = i;
            at = 0;
        }
        at += ts[i].nbytes;
        total += ts[i].nbytes;
    }
    first[shards] = n;
    for (int k = 0; k < shards && !st; k++) {
        if (shards == 1) snprintf(file, sizeof file, "model.safetensors");
        else snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", k + 1, shards);
        snprintf(path, sizeof path, "%s/%s", dir, file);
        st = cdp_safetensors_write_staged(path, ts + first[k], first[k + 1] - first[k], meta, n_meta, fetch, ctx,
                                          STAGE);
        for (int i = first[k]; !st && i < first[k + 1]; i++)
            if (json_object_set_new(map, ts[i].name, json_string(file))) st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
    }
    if (st) goto done;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (shards > 1) {
        if (json_object_set_new(imeta, "total_size", json_integer((json_int_t)total)) ||
            json_object_set(index, "metadata", imeta) || json_object_set(index, "weight_map", map)) {
            st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
            goto done;
        }
        if ((st = write_json(path, json_incref(index)))) goto done;
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
    }
    if (unlink(path) != 0 && errno != ENOENT) {
        st = cdp_fail(CDP_ERR_IO, "%s: cannot remove the earlier export's file: %s", path, strerror(errno));
        goto done;
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    if ((st = write_json(path, cdp_hf_config_json(md)))) goto done;
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    st = write_json(path, cdp_hf_generation_config_json(md));
done:
    json_decref(map);
    json_decref(index);
    json_decref(imeta);
    free(first);
    return st;
}

/* cdp_hf_export_model's tensors: host memory, a transposed one through a buffer. */
struct model_src {
    const float *data;
    int64_t rows, cols; /* ours [rows, cols]; transposed: written [cols, rows] */
    int transposed;
};

struct model_fetch {
    const struct cdp_safetensors_tensor *ts;
    const struct model_src *src;
    float *held;
};

static cdp_status model_fetch(void *ctx, const struct cdp_safetensors_tensor *t, uint64_t offset, void *dst,
                              uint64_t n)
{
    struct model_fetch *c = ctx;
    const struct model_src *s = &c->src[t - c->ts];
    if (!s->transposed) {
        memcpy(dst, (const uint8_t *)s->data + offset, (size_t)n);
        return CDP_OK;
    }
    if (offset == 0) {
        free(c->held);
        if (!(c->held = malloc((size_t)(s->rows * s->cols) * 4 + 1)))
            return cdp_fail(CDP_ERR_NOMEM, "out of memory transposing %s", t->name);
        for (int64_t r = 0; r < s->rows; r++)
            for (int64_t k = 0; k < s->cols; k++) c->held[k * s->rows + r] = s->data[r * s->cols + k];
    }
    memcpy(dst, (const uint8_t *)c->held + offset, (size_t)n);
    return CDP_OK;
}

cdp_status cdp_hf_export_model(struct cdp_model *m, const struct cdp_model_desc *md, const char *dir,
                               uint64_t shard_bytes, const char *const *meta, int n_meta)
{
    if (!arch_of(md))
        return cdp_fail(CDP_ERR_INVALID, "only the GPT-2 and Llama families (their presets, or /model/from a "
                        "Hugging Face folder) have a Hugging Face form");
    const int n = cdp_model_tensor_count(m), units = cdp_model_unit_count(m);
    struct cdp_safetensors_tensor *ts = calloc((size_t)n + 1, sizeof *ts);
    struct model_src *src = calloc((size_t)n + 1, sizeof *src);
    char *names = calloc((size_t)n + 1, 96);
    struct model_fetch fc = {ts, src, NULL};
    cdp_status st = ts && src && names ? CDP_OK : cdp_fail(CDP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n && !st; i++) {
        const struct cdp_model_tensor *t = cdp_model_tensor(m, i);
        const char *param = strchr(strchr(t->name, '.') + 1, '.') + 1;
        const enum cdp_hf_part part = t->unit == 0 ? CDP_HF_EMBED : t->unit == units - 1 ? CDP_HF_HEAD : CDP_HF_BLOCK;
        char *hf = names + (size_t)i * 96;
        int conv1d = 0;
        if (!cdp_hf_gpt2_name(part, t->unit - 1, param, cdp_hf_prefix(md->arch), hf, 96, &conv1d)) {
            st = cdp_fail(CDP_ERR_INTERNAL, "%s: no Hugging Face name", t->name);
            break;
        }
        ts[i].name = hf;
        ts[i].dtype = CDP_DTYPE_F32;
        ts[i].dtype_name = "F32";
        ts[i].ndim = t->ndim;
        memcpy(ts[i].shape, t->shape, sizeof t->shape);
        ts[i].nbytes = (uint64_t)t->numel * 4;
        ts[i].data = t->data;
        src[i] = (struct model_src){t->data, t->shape[0], t->ndim == 2 ? t->shape[1] : 1, conv1d};
        if (conv1d) {
            ts[i].shape[0] = t->shape[1];
            ts[i].shape[1] = t->shape[0];
        }
    }
    if (!st) st = cdp_hf_write_folder(dir, md, ts, n, meta, n_meta, model_fetch, &fc, shard_bytes);
    free(fc.held);
    free(names);
    free(src);
    free(ts);
    return st;
}
