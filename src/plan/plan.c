/* The plan loader: reads plan.json with jansson, fills struct cdp_plan with every
 * default, and rejects each bad value with "FILE: /json/pointer: expected ..., got
 * ..." so a user can fix a plan without reading the code (schema: docs/plan.md).
 * This file holds the entry points and the name tables; each section of a plan
 * is read and checked in plan_<section>.c (plan_load_internal.h). */
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

cdp_status cdp_plan_get_seed(struct ld *c, const json_t *obj, const char *ptr, uint64_t *out)
{
    int64_t x = (int64_t)*out;
    cdp_status st = cdp_json_get_int(&c->in, obj, ptr, "seed", 0, INT64_MAX, 0, &x);
    if (st) return st;
    *out = (uint64_t)x;
    return CDP_OK;
}

/* An array of positive integers with min_n..max_n elements. */
cdp_status cdp_plan_int_array(struct ld *c, const json_t *v, const char *ptr, size_t min_n, size_t max_n,
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
    p->parallel.tensor = 1;
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
    if ((st = cdp_plan_load_model(c, json_object_get(root, "model")))) return st;
    if (c->p->model.kind != CDP_MODEL_GPT) {
        int64_t params;
        if ((st = cdp_plan_check_shapes(c, &c->p->model, &params))) return st;
    }
    if ((st = cdp_plan_load_data(c, json_object_get(root, "data")))) return st;
    if ((st = cdp_plan_load_train(c, json_object_get(root, "train")))) return st;
    if ((st = cdp_plan_check_sizes(c))) return st;
    if ((st = cdp_plan_load_parallel(c, json_object_get(root, "parallel")))) return st;
    if ((st = cdp_plan_load_cluster(c, json_object_get(root, "cluster")))) return st;
    if ((st = cdp_plan_load_output(c, json_object_get(root, "output")))) return st;
    return cdp_plan_check_fit(c->in.file, c->p);
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
    return cdp_plan_check_fit(plan->source, plan);
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
        return cdp_plan_check_shapes(&c, m, &total) ? -1 : total;
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
