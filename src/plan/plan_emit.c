/* Writes a loaded plan back out: as a complete plan file (every default spelled
 * out, so `--dry-run --json` shows exactly what will run and loads back to the same
 * plan), and as a table for people. */
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/plan.h"
#include "model/layer_def.h"
#include "plan/plan_internal.h"

/* ---- JSON -------------------------------------------------------------------- */

struct emit {
    int ok;         /* 0 after an allocation failed */
    int need_exact; /* a real does not survive 15 digits: write 17 */
};

static void set(struct emit *e, json_t *obj, const char *key, json_t *v)
{
    if (!v || json_object_set_new(obj, key, v) != 0) e->ok = 0;
}

static json_t *jint(int64_t v) { return json_integer((json_int_t)v); }

static json_t *jint_auto(int64_t v) { return v == CDP_AUTO ? json_string("auto") : jint(v); }

/* A size in bytes: "auto" for 0, past INT64_MAX as a decimal string. */
static void set_size(struct emit *e, json_t *o, const char *key, uint64_t v)
{
    if (v == 0) {
        set(e, o, key, json_string("auto"));
    } else if (v > (uint64_t)INT64_MAX) {
        char buf[32];
        snprintf(buf, sizeof buf, "%" PRIu64, v);
        set(e, o, key, json_string(buf));
    } else {
        set(e, o, key, jint((int64_t)v));
    }
}

static json_t *jstr_or_null(const char *s) { return s ? json_string(s) : json_null(); }

/* data.path / data.val_path: one file as a string, several as a list (globs
 * come out expanded), none as null. */
static json_t *data_paths_json(const char *one, char *const *list, int n)
{
    if (n <= 1) return jstr_or_null(n == 1 ? list[0] : one);
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_string(list[i]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* Notes a real that 15 digits do not keep. */
static void note_exact(struct emit *e, double v)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%.15g", v);
    if (strtod(buf, NULL) != v) e->need_exact = 1;
}

static json_t *jreal(struct emit *e, double v)
{
    note_exact(e, v);
    return json_real(v);
}

static json_t *jints(const int64_t *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        if (json_array_append_new(a, jint(v[i])) != 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}

static json_t *layer_json(struct emit *e, const struct cdp_layer_desc *L)
{
    const struct cdp_layer_def *def = cdp_layer_def(L->type);
    json_t *o = json_object();
    if (!o) return NULL;
    set(e, o, "type", json_string(def->name));
    if (def->emit && def->emit(L, o)) e->ok = 0;
    /* a real the type wrote (layernorm's eps) that 15 digits do not keep */
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        if (json_is_real(v)) note_exact(e, json_real_value(v));
    }
    return o;
}

static json_t *model_json(struct emit *e, const struct cdp_model_desc *m)
{
    json_t *o = json_object();
    if (!o) return NULL;
    switch (m->kind) {
    case CDP_MODEL_GPT:
        if (m->arch == CDP_ARCH_LLAMA) {
            set(e, o, "preset", json_string(m->preset));
            set(e, o, "vocab", jint(m->vocab));
            set(e, o, "context", jint(m->context));
            set(e, o, "layers", jint(m->layers));
            set(e, o, "heads", jint(m->heads));
            set(e, o, "kv_heads", jint(m->kv_heads));
            set(e, o, "dim", jint(m->embed));
            /* the width as the plan gave it: the rule again, or hidden */
            if (m->multiple_of > 0) {
                set(e, o, "multiple_of", jint(m->multiple_of));
                set(e, o, "ffn_dim_multiplier", m->ffn_dim_multiplier > 0 ? json_real(m->ffn_dim_multiplier)
                                                                           : json_null());
            } else {
                set(e, o, "hidden", jint(m->ffn_hidden));
            }
            set(e, o, "norm_eps", json_real(m->norm_eps));
            if (cdp_rope_emit(&m->rope, o)) e->ok = 0;
            set(e, o, "tie_embeddings", json_boolean(m->tie_embeddings));
            set(e, o, "weights", jstr_or_null(m->weights));
            set(e, o, "unused_tensors", json_string(cdp_plan_unused_tensors_names[m->unused_tensors]));
            return o;
        }
        set(e, o, "preset", json_string(m->preset));
        set(e, o, "vocab", jint(m->vocab));
        set(e, o, "context", jint(m->context));
        set(e, o, "layers", jint(m->layers));
        set(e, o, "heads", jint(m->heads));
        set(e, o, "embed", jint(m->embed));
        set(e, o, "tie_embeddings", json_boolean(m->tie_embeddings));
        set(e, o, "weights", jstr_or_null(m->weights));
        set(e, o, "unused_tensors", json_string(cdp_plan_unused_tensors_names[m->unused_tensors]));
        return o;
    case CDP_MODEL_MLP:
        set(e, o, "preset", json_string("mlp"));
        set(e, o, "input", jints(m->input, m->input_ndim));
        set(e, o, "hidden", jints(m->hidden, m->n_hidden));
        set(e, o, "classes", jint(m->classes));
        set(e, o, "activation", json_string(cdp_plan_activation_names[m->activation]));
        break;
    case CDP_MODEL_CNN:
        set(e, o, "preset", json_string("cnn"));
        set(e, o, "input", jints(m->input, m->input_ndim));
        set(e, o, "channels", jints(m->channels, m->n_channels));
        set(e, o, "classes", jint(m->classes));
        break;
    case CDP_MODEL_LAYERS:
    case CDP_MODEL_KIND_COUNT: {
        json_t *a = json_array();
        set(e, o, "input", jints(m->input, m->input_ndim));
        for (int i = 0; a && i < m->n_layers; i++)
            if (json_array_append_new(a, layer_json(e, &m->layer_list[i])) != 0) e->ok = 0;
        set(e, o, "layers", a);
        break;
    }
    }
    set(e, o, "loss", json_string(cdp_plan_loss_names[m->loss]));
    set(e, o, "weights", jstr_or_null(m->weights));
    set(e, o, "unused_tensors", json_string(cdp_plan_unused_tensors_names[m->unused_tensors]));
    return o;
}

static json_t *no_decay_json(unsigned mask)
{
    json_t *a = json_array();
    for (int g = 0; a && g < CDP_PARAM_GROUP_COUNT; g++)
        if (mask & CDP_PARAM_GROUP_BIT(g)) json_array_append_new(a, json_string(cdp_plan_param_group_names[g]));
    return a;
}

/* /train/lr_schedule with only the keys its type reads (the loader refuses the others). */
static json_t *lr_schedule_json(struct emit *e, const struct cdp_lr_schedule_desc *s)
{
    json_t *o = json_object();
    if (!o) return NULL;
    set(e, o, "type", json_string(cdp_plan_lr_schedule_names[s->type]));
    set(e, o, "warmup_steps", jint(s->warmup_steps));
    if (s->type != CDP_LR_CONSTANT) set(e, o, "min_lr", jreal(e, s->min_lr));
    if (s->type == CDP_LR_WSD) set(e, o, "decay_steps", jint(s->decay_steps));
    return o;
}

static json_t *plan_json(struct emit *e, const struct cdp_plan *p)
{
    json_t *root = json_object(), *o;
    if (!root) return NULL;
    set(e, root, "model", model_json(e, &p->model));

    set(e, root, "data", o = json_object());
    if (o) {
        set(e, o, "source", json_string(cdp_plan_source_names[p->data.source]));
        set(e, o, "path", data_paths_json(p->data.path, p->data.paths, p->data.n_paths));
        set(e, o, "val_path", data_paths_json(NULL, p->data.val_paths, p->data.n_val_paths));
        set(e, o, "labels", jstr_or_null(p->data.labels));
        set(e, o, "seed", jint((int64_t)p->data.seed));
        set(e, o, "order", json_string(cdp_plan_order_names[p->data.order]));
    }

    const struct cdp_train_desc *t = &p->train;
    set(e, root, "train", o = json_object());
    if (o) {
        json_t *opt = json_object(), *ck;
        set(e, o, "steps", jint(t->steps));
        set(e, o, "global_batch", jint_auto(t->global_batch));
        set(e, o, "micro_batch", jint(t->micro_batch));
        set(e, o, "optimizer", opt);
        if (opt) {
            set(e, opt, "type", json_string(cdp_plan_optimizer_names[t->optimizer.type]));
            set(e, opt, "lr", jreal(e, t->optimizer.lr));
            set(e, opt, "weight_decay", jreal(e, t->optimizer.weight_decay));
            set(e, opt, "no_decay", no_decay_json(t->optimizer.no_decay));
            if (t->optimizer.type == CDP_OPT_SGD) {
                set(e, opt, "momentum", jreal(e, t->optimizer.momentum));
            } else {
                set(e, opt, "beta1", jreal(e, t->optimizer.beta1));
                set(e, opt, "beta2", jreal(e, t->optimizer.beta2));
                set(e, opt, "eps", jreal(e, t->optimizer.eps));
            }
        }
        set(e, o, "lr_schedule", lr_schedule_json(e, &t->lr_schedule));
        set(e, o, "grad_clip", jreal(e, t->grad_clip));
        set(e, o, "precision", json_string(cdp_plan_precision_names[t->precision]));
        set(e, o, "recompute",
            json_string(cdp_plan_recompute_names[t->recompute_auto ? CDP_RECOMPUTE_COUNT : t->recompute]));
        set(e, o, "seed", jint((int64_t)t->seed));
        set(e, o, "log_every", jint(t->log_every));
        set(e, o, "eval_every", jint(t->eval_every));
        set(e, o, "eval_batches", jint(t->eval_batches));
        set(e, o, "timeout_s", jreal(e, t->timeout_s));
        if (t->checkpoint.dir) {
            set(e, o, "checkpoint", ck = json_object());
            if (ck) {
                set(e, ck, "dir", json_string(t->checkpoint.dir));
                set(e, ck, "every", jint(t->checkpoint.every));
                set(e, ck, "keep", jint(t->checkpoint.keep));
            }
        } else {
            set(e, o, "checkpoint", json_null());
        }
        if (t->restart.max > 0) {
            json_t *rs;
            set(e, o, "restart", rs = json_object());
            if (rs) {
                set(e, rs, "max", jint(t->restart.max));
                set(e, rs, "exclude_failed", json_boolean(t->restart.exclude_failed));
            }
        } else {
            set(e, o, "restart", json_null());
        }
    }

    const struct cdp_parallel_desc *pd = &p->parallel;
    set(e, root, "parallel", o = json_object());
    if (o) {
        set(e, o, "stages", jint_auto(pd->stages));
        set(e, o, "replicas", jint_auto(pd->replicas));
        set(e, o, "tensor", jint_auto(pd->tensor));
        set(e, o, "sequence_parallel",
            pd->sequence_parallel_auto ? json_string("auto") : json_boolean(pd->sequence_parallel));
        if (pd->comm_bf16_tensor == pd->comm_bf16_gradients) {
            set(e, o, "comm_dtype", json_string(pd->comm_bf16_tensor ? "bf16" : "fp32"));
        } else {
            json_t *cd = json_object();
            set(e, o, "comm_dtype", cd);
            if (cd) {
                set(e, cd, "tensor", json_string(pd->comm_bf16_tensor ? "bf16" : "fp32"));
                set(e, cd, "gradients", json_string(pd->comm_bf16_gradients ? "bf16" : "fp32"));
            }
        }
        set(e, o, "micro_batches", jint_auto(pd->micro_batches));
        set(e, o, "schedule", json_string(pd->schedule_auto   ? "auto"
                                          : pd->schedule_file ? pd->schedule_file
                                                              : cdp_schedule_name(pd->schedule)));
        set(e, o, "chunks", jint(pd->chunks));
        if (pd->partition) {
            json_t *a = json_array();
            for (int i = 0; a && i < pd->n_partition; i++)
                if (json_array_append_new(a, jints(pd->partition[i], 2)) != 0) e->ok = 0;
            set(e, o, "partition", a);
        } else {
            set(e, o, "partition", json_string("auto"));
        }
        if (pd->placement == CDP_PLACEMENT_EXPLICIT) {
            json_t *a = json_array();
            for (int64_t s = 0; a && s < pd->stages; s++)
                if (json_array_append_new(a, jints(pd->placement_map + s * pd->replicas,
                                                   (int)pd->replicas)) != 0)
                    e->ok = 0;
            set(e, o, "placement", a);
        } else {
            set(e, o, "placement", json_string(cdp_plan_placement_names[pd->placement]));
        }
        if (pd->balance == CDP_BALANCE_EXPLICIT)
            set(e, o, "balance", jints(pd->shares, pd->n_shares));
        else
            set(e, o, "balance", json_string(pd->balance == CDP_BALANCE_UNIFORM ? "uniform" : "speed"));
        set(e, o, "rebalance_every", jint(pd->rebalance_every));
        set(e, o, "zero", jint_auto(pd->zero));
        set(e, o, "bucket_mb", json_real(pd->bucket_mb));
    }

    const struct cdp_cluster_desc *cd = &p->cluster;
    set(e, root, "cluster", o = json_object());
    if (o) {
        set(e, o, "backend", json_string(cd->backend_auto ? "auto" : cdp_backend_name(cd->backend)));
        set(e, o, "topology", json_string(cd->topology));
        set(e, o, "nodes", jint(cd->nodes));
        set(e, o, "devices", jint_auto(cd->devices));
        set_size(e, o, "device_memory", cd->device_memory);
        set_size(e, o, "host_memory", cd->host_memory);
        set(e, o, "ranks_per_device", jint(cd->ranks_per_device));
    }

    set(e, root, "output", o = json_object());
    if (o) {
        set(e, o, "metrics", jstr_or_null(p->output.metrics));
        set(e, o, "trace", jstr_or_null(p->output.trace));
        set(e, o, "timeline", jstr_or_null(p->output.timeline));
        set(e, o, "weights", jstr_or_null(p->output.weights));
        set(e, o, "tensorboard", jstr_or_null(p->output.tensorboard));
    }
    return root;
}

cdp_status cdp_plan_to_json(const struct cdp_plan *plan, char **out)
{
    struct emit e = {.ok = 1};
    CDP_ASSERT(plan && out);
    json_t *root = plan_json(&e, plan);
    if (!root || !e.ok) {
        json_decref(root);
        return cdp_fail(CDP_ERR_NOMEM, "%s: out of memory writing the plan as JSON", plan->source);
    }
    size_t flags = JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(e.need_exact ? 17 : 15);
    char *s = json_dumps(root, flags);
    json_decref(root);
    if (!s) return cdp_fail(CDP_ERR_NOMEM, "%s: out of memory writing the plan as JSON", plan->source);
    *out = s;
    return CDP_OK;
}

/* ---- the table --------------------------------------------------------------- */

#define ROW "  %-16s "

/* The learning-rate schedule in words. */
static void print_lr_schedule(FILE *f, const struct cdp_train_desc *t)
{
    const struct cdp_lr_schedule_desc *s = &t->lr_schedule;
    char warm[64] = "";
    if (s->warmup_steps > 0)
        snprintf(warm, sizeof warm, "linear warmup over %lld steps, then ", (long long)s->warmup_steps);
    switch (s->type) {
    case CDP_LR_CONSTANT:
        fprintf(f, ROW "%sconstant %g\n", "lr_schedule", warm, t->optimizer.lr);
        return;
    case CDP_LR_COSINE:
    case CDP_LR_LINEAR:
        fprintf(f, ROW "%s%s decay from %g to %g at step %lld\n", "lr_schedule", warm,
                cdp_plan_lr_schedule_names[s->type], t->optimizer.lr, s->min_lr, (long long)t->steps);
        return;
    case CDP_LR_WSD:
        fprintf(f, ROW "%s%g, then linear decay over the last %lld steps to %g (wsd)\n", "lr_schedule", warm,
                t->optimizer.lr, (long long)s->decay_steps, s->min_lr);
        return;
    case CDP_LR_SCHEDULE_COUNT:
        break;
    }
}

/* 124439808 -> "124,439,808" */
static const char *group(int64_t v, char *buf, size_t cap)
{
    char raw[32];
    int n = snprintf(raw, sizeof raw, "%lld", (long long)v), o = 0, first = n % 3 ? n % 3 : 3;
    for (int i = 0; i < n && (size_t)o + 2 < cap; i++) {
        if (i && (i - first) % 3 == 0 && i >= first && raw[i - 1] != '-') buf[o++] = ',';
        buf[o++] = raw[i];
    }
    buf[o] = '\0';
    return buf;
}

static const char *count_or_auto(int64_t v, char *buf, size_t cap)
{
    if (v == CDP_AUTO) return "auto (chosen by the planner)";
    snprintf(buf, cap, "%lld", (long long)v);
    return buf;
}

static void print_shape(FILE *f, const int64_t *d, int nd)
{
    fputc('[', f);
    for (int i = 0; i < nd; i++) fprintf(f, "%s%lld", i ? ", " : "", (long long)d[i]);
    fputc(']', f);
}

static void print_layer(FILE *f, int i, const struct cdp_layer_desc *L)
{
    const struct cdp_layer_def *def = cdp_layer_def(L->type);
    char text[256] = "";
    if (def->describe) def->describe(L, text, sizeof text);
    fprintf(f, text[0] ? "    %3d  %-18s%s\n" : "    %3d  %s%s\n", i, def->name, text);
}

static void print_model(FILE *f, const struct cdp_plan *p)
{
    const struct cdp_model_desc *m = &p->model;
    char b1[64];
    int64_t params = cdp_plan_param_count(p), units = cdp_plan_model_units(p);
    fprintf(f, "Model\n");
    if (m->kind == CDP_MODEL_GPT) {
        const int llama = m->arch == CDP_ARCH_LLAMA;
        fprintf(f, ROW "%s (%s)\n", "preset", m->preset, llama ? "Llama" : "GPT");
        fprintf(f, ROW "%lld\n", "vocab", (long long)m->vocab);
        fprintf(f, ROW "%lld\n", "context", (long long)m->context);
        fprintf(f, ROW "%lld\n", "layers", (long long)m->layers);
        fprintf(f, ROW "%lld\n", "heads", (long long)m->heads);
        if (llama) {
            fprintf(f, ROW "%lld\n", "kv_heads", (long long)m->kv_heads);
            fprintf(f, ROW "%lld\n", "dim", (long long)m->embed);
            fprintf(f, ROW "%lld\n", "hidden", (long long)m->ffn_hidden);
            fprintf(f, ROW "%g\n", "rope_theta", m->rope.theta);
            if (m->rope.factor > 0)
                fprintf(f, ROW "llama3, factor %g, low %g, high %g, original context %lld\n", "rope_scaling",
                        m->rope.factor, m->rope.low_freq_factor, m->rope.high_freq_factor,
                        (long long)m->rope.original_context);
            fprintf(f, ROW "%g\n", "norm_eps", m->norm_eps);
        } else {
            fprintf(f, ROW "%lld\n", "embed", (long long)m->embed);
        }
        fprintf(f, ROW "%s\n", "tie_embeddings", m->tie_embeddings ? "yes" : "no");
        fprintf(f, ROW "%lld (embedding, %lld blocks, final %s + head)\n", "units", (long long)units,
                (long long)m->layers, llama ? "RMS norm" : "layernorm");
    } else {
        if (m->kind == CDP_MODEL_LAYERS)
            fprintf(f, ROW "explicit layer list\n", "model");
        else
            fprintf(f, ROW "%s\n", "preset", m->preset);
        fprintf(f, ROW, "input");
        print_shape(f, m->input, m->input_ndim);
        fputc('\n', f);
        if (m->kind == CDP_MODEL_MLP) {
            fprintf(f, ROW, "hidden");
            print_shape(f, m->hidden, m->n_hidden);
            fprintf(f, "\n" ROW "%s\n", "activation", cdp_plan_activation_names[m->activation]);
        }
        if (m->kind == CDP_MODEL_CNN) {
            fprintf(f, ROW, "channels");
            print_shape(f, m->channels, m->n_channels);
            fputc('\n', f);
        }
        if (m->kind != CDP_MODEL_LAYERS) fprintf(f, ROW "%lld\n", "classes", (long long)m->classes);
        fprintf(f, ROW "%s\n", "loss", cdp_plan_loss_names[m->loss]);
        fprintf(f, ROW "%lld (one per layer)\n", "units", (long long)units);
        for (int i = 0; i < m->n_layers && i < 64; i++) print_layer(f, i, &m->layer_list[i]);
        if (m->n_layers > 64) fprintf(f, "    ... %d more\n", m->n_layers - 64);
    }
    fprintf(f, ROW "%s\n", "weights", m->weights ? m->weights : "random (seeded by /train/seed)");
    if (m->weights)
        fprintf(f, ROW "%s\n", "unused tensors",
                m->unused_tensors == CDP_UNUSED_WARN ? "a warning" : "an error (/model/unused_tensors)");
    if (params >= 0)
        fprintf(f, ROW "%s (%.1f M)\n", "parameters", group(params, b1, sizeof b1), (double)params / 1e6);
    else
        fprintf(f, ROW "more than 2^63\n", "parameters");
}

cdp_status cdp_plan_print(const struct cdp_plan *p, FILE *f)
{
    char b1[64], b2[64], b3[64];
    CDP_ASSERT(p && f);
    fprintf(f, "Plan %s\n\n", p->source);
    print_model(f, p);

    fprintf(f, "\nData\n");
    fprintf(f, ROW "%s\n", "source", cdp_plan_source_names[p->data.source]);
    if (p->data.path) {
        if (p->data.n_paths > 1)
            fprintf(f, ROW "%s and %d more files\n", "path", p->data.path, p->data.n_paths - 1);
        else
            fprintf(f, ROW "%s\n", "path", p->data.path);
    }
    if (p->data.n_val_paths == 1) fprintf(f, ROW "%s\n", "val_path", p->data.val_paths[0]);
    if (p->data.n_val_paths > 1)
        fprintf(f, ROW "%s and %d more files\n", "val_path", p->data.val_paths[0], p->data.n_val_paths - 1);
    if (p->data.labels) fprintf(f, ROW "%s\n", "labels", p->data.labels);
    fprintf(f, ROW "%llu\n", "seed", (unsigned long long)p->data.seed);
    if (p->data.path) fprintf(f, ROW "%s\n", "order", cdp_plan_order_names[p->data.order]);

    const struct cdp_train_desc *t = &p->train;
    const struct cdp_optimizer_desc *o = &t->optimizer;
    fprintf(f, "\nTrain\n");
    fprintf(f, ROW "%lld\n", "steps", (long long)t->steps);
    fprintf(f, ROW "%s\n", "global_batch", count_or_auto(t->global_batch, b1, sizeof b1));
    fprintf(f, ROW "%lld\n", "micro_batch", (long long)t->micro_batch);
    if (o->type == CDP_OPT_SGD)
        fprintf(f, ROW "sgd, lr %g, weight_decay %g, momentum %g\n", "optimizer", o->lr, o->weight_decay,
                o->momentum);
    else
        fprintf(f, ROW "adamw, lr %g, weight_decay %g, betas (%g, %g), eps %g\n", "optimizer", o->lr,
                o->weight_decay, o->beta1, o->beta2, o->eps);
    if (o->weight_decay > 0) {
        char groups[96] = "";
        for (int g = 0; g < CDP_PARAM_GROUP_COUNT; g++)
            if (o->no_decay & CDP_PARAM_GROUP_BIT(g))
                snprintf(groups + strlen(groups), sizeof groups - strlen(groups), "%s%s", *groups ? ", " : "",
                         cdp_plan_param_group_names[g]);
        fprintf(f, ROW "%s\n", "no_decay", *groups ? groups : "(none: every tensor decays)");
    }
    print_lr_schedule(f, t);
    if (t->grad_clip > 0)
        fprintf(f, ROW "%g (global norm)\n", "grad_clip", t->grad_clip);
    else
        fprintf(f, ROW "off\n", "grad_clip");
    fprintf(f, ROW "%s\n", "precision", cdp_plan_precision_names[t->precision]);
    fprintf(f, ROW "%s\n", "recompute",
            t->recompute_auto ? "auto (the planner's choice: the cheapest that fits)"
                              : cdp_plan_recompute_names[t->recompute]);
    fprintf(f, ROW "%llu\n", "seed", (unsigned long long)t->seed);
    fprintf(f, ROW "every %lld steps\n", "log", (long long)t->log_every);
    if (t->eval_every > 0)
        fprintf(f, ROW "every %lld steps, %lld micro-batches\n", "validation", (long long)t->eval_every,
                (long long)t->eval_batches);
    else
        fprintf(f, ROW "after the last step, %lld micro-batches\n", "validation", (long long)t->eval_batches);
    fprintf(f, ROW "%g s for any wait between ranks\n", "timeout", t->timeout_s);
    if (t->checkpoint.dir)
        fprintf(f, ROW "%s every %lld steps, keep %lld\n", "checkpoint", t->checkpoint.dir,
                (long long)t->checkpoint.every, (long long)t->checkpoint.keep);
    else
        fprintf(f, ROW "none\n", "checkpoint");
    if (t->restart.max > 0)
        fprintf(f, ROW "up to %lld in a row at one step, %s\n", "restart", (long long)t->restart.max,
                !t->restart.exclude_failed    ? "on the same layout"
                : p->parallel.tensor > 1 ? "re-planned without the failed devices' tensor groups"
                                         : "re-planned without the failed devices");
    else
        fprintf(f, ROW "none\n", "restart");

    const struct cdp_parallel_desc *pd = &p->parallel;
    fprintf(f, "\nParallel\n");
    fprintf(f, ROW "%s\n", "stages", count_or_auto(pd->stages, b1, sizeof b1));
    fprintf(f, ROW "%s\n", "replicas", count_or_auto(pd->replicas, b1, sizeof b1));
    fprintf(f, ROW "%s\n", "tensor", count_or_auto(pd->tensor, b1, sizeof b1));
    if (pd->sequence_parallel_auto)
        fprintf(f, ROW "auto (the planner plans each t above 1 with and without it)\n", "sequence_parallel");
    else if (pd->sequence_parallel && pd->tensor == CDP_AUTO)
        fprintf(f, ROW "on at every t above 1 the planner tries\n", "sequence_parallel");
    else if (pd->sequence_parallel)
        fprintf(f, ROW "on (norms and residual on 1/%lld of the sequence a rank)\n", "sequence_parallel",
                (long long)pd->tensor);
    fprintf(f, ROW "tensor collectives %s, gradient reduction %s%s\n", "comm_dtype",
            pd->comm_bf16_tensor ? "bf16" : "fp32", pd->comm_bf16_gradients ? "bf16" : "fp32",
            pd->comm_bf16_tensor || pd->comm_bf16_gradients
                ? " (loss statistics, tied gradients, ZeRO's parameter all-gather: fp32)" : "");
    fprintf(f, ROW "%s\n", "micro_batches", count_or_auto(pd->micro_batches, b1, sizeof b1));
    if (t->global_batch == CDP_AUTO) {
        snprintf(b1, sizeof b1, "auto");
        fprintf(f, ROW "auto (chosen by the planner) = replicas x micro_batches x micro_batch\n",
                "global batch");
    } else {
        snprintf(b1, sizeof b1, "%lld", (long long)pd->replicas);
        snprintf(b2, sizeof b2, "%lld", (long long)pd->micro_batches);
        fprintf(f, ROW "%lld = %s replicas x %s micro_batches x %lld micro_batch\n", "global batch",
                (long long)t->global_batch, pd->replicas == CDP_AUTO ? "auto" : b1,
                pd->micro_batches == CDP_AUTO ? "auto" : b2, (long long)t->micro_batch);
    }
    if (pd->schedule_file)
        fprintf(f, ROW "from %s (%s's placement)", "schedule", pd->schedule_file, cdp_schedule_name(pd->schedule));
    else
        fprintf(f, ROW "%s", "schedule", pd->schedule_auto ? "auto (chosen by the planner)"
                                                           : cdp_schedule_name(pd->schedule));
    if (cdp_schedule_has_chunks(pd->schedule)) fprintf(f, ", %lld chunks per rank", (long long)pd->chunks);
    fputc('\n', f);
    if (pd->partition) {
        fprintf(f, ROW, "partition");
        for (int i = 0; i < pd->n_partition; i++)
            fprintf(f, "%s[%lld, %lld)", i ? " " : "", (long long)pd->partition[i][0],
                    (long long)pd->partition[i][1]);
        fprintf(f, "  (of %lld units)\n", (long long)cdp_plan_model_units(p));
    } else {
        fprintf(f, ROW "auto (chosen by the planner, %lld units)\n", "partition",
                (long long)cdp_plan_model_units(p));
    }
    if (pd->placement == CDP_PLACEMENT_EXPLICIT) {
        if (pd->tensor > 1) fprintf(f, ROW "explicit (each tensor group's first device)\n", "placement");
        else fprintf(f, ROW "explicit\n", "placement");
        for (int64_t s = 0; s < pd->stages; s++) {
            fprintf(f, "    stage %-4lld devices", (long long)s);
            for (int64_t r = 0; r < pd->replicas; r++)
                fprintf(f, " %lld", (long long)pd->placement_map[s * pd->replicas + r]);
            fputc('\n', f);
        }
    } else if (pd->placement == CDP_PLACEMENT_TOPOLOGY) {
        fprintf(f, ROW "topology (chosen by the planner)\n", "placement");
    } else {
        fprintf(f, ROW "%s\n", "placement", cdp_plan_placement_names[pd->placement]);
    }
    if (pd->balance == CDP_BALANCE_EXPLICIT) {
        fprintf(f, ROW, "balance");
        for (int i = 0; i < pd->n_shares; i++) fprintf(f, "%s%lld", i ? " " : "", (long long)pd->shares[i]);
        fprintf(f, " micro-batches per replica\n");
    } else {
        fprintf(f, ROW "%s\n", "balance", pd->balance == CDP_BALANCE_UNIFORM
                ? "uniform" : "speed (shares in proportion to each replica's speed)");
    }
    if (pd->rebalance_every > 0)
        fprintf(f, ROW "every %lld steps, from measured step times\n", "rebalance", (long long)pd->rebalance_every);
    fprintf(f, ROW "%s\n", "zero",
            pd->zero == CDP_AUTO ? "auto (the planner's choice: sharded when it is needed to fit)"
            : pd->zero == 1      ? "1 (optimizer state sharded over each stage's replicas)"
            : pd->zero == 2      ? "2 (optimizer state and gradients sharded over each stage's replicas)"
                                 : "0 (every replica keeps all optimizer state)");

    const struct cdp_cluster_desc *cd = &p->cluster;
    fprintf(f, "\nCluster\n");
    fprintf(f, ROW "%s\n", "backend",
            cd->backend_auto ? "auto (cuda when GPUs are usable, else cpu)"
                                            : cdp_backend_name(cd->backend));
    fprintf(f, ROW "%s\n", "topology", strcmp(cd->topology, "auto") == 0 ? "auto (discovered)" : cd->topology);
    fprintf(f, ROW "%lld\n", "nodes", (long long)cd->nodes);
    if (cd->devices == CDP_AUTO)
        fprintf(f, ROW "auto (%s)\n", "devices per node",
                !cdp_backend_is_gpu(cd->backend) ? "one CPU device per rank" : "as found");
    else
        fprintf(f, ROW "%lld\n", "devices per node", (long long)cd->devices);
    if (cd->device_memory)
        fprintf(f, ROW "%s (%llu bytes)\n", "device_memory", cdp_format_bytes(cd->device_memory, b3, sizeof b3),
                (unsigned long long)cd->device_memory);
    else
        fprintf(f, ROW "auto (the device's own)\n", "device_memory");
    if (cd->host_memory)
        fprintf(f, ROW "%s (%llu bytes)\n", "host_memory", cdp_format_bytes(cd->host_memory, b3, sizeof b3),
                (unsigned long long)cd->host_memory);
    else
        fprintf(f, ROW "auto (what the host has free)\n", "host_memory");

    fprintf(f, "\nOutput\n");
    fprintf(f, ROW "%s\n", "metrics", p->output.metrics ? p->output.metrics : "(not written)");
    fprintf(f, ROW "%s\n", "trace", p->output.trace ? p->output.trace : "(not written)");
    fprintf(f, ROW "%s\n", "timeline", p->output.timeline ? p->output.timeline : "(not written)");
    fprintf(f, ROW "%s\n", "weights", p->output.weights ? p->output.weights : "(not written)");
    fprintf(f, ROW "%s\n", "tensorboard", p->output.tensorboard ? p->output.tensorboard : "(not written)");
    return ferror(f) ? cdp_fail(CDP_ERR_IO, "writing the plan table failed") : CDP_OK;
}
