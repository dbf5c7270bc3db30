/* The layout's JSON form (layout.h): what training writes under "layout" in
 * planned.json and what the ranks, the simulator, --schedule and restarts run,
 * read back and checked as a plan is (every key known, every value of its
 * type, messages naming the JSON pointer), and checked against the plan it
 * runs so that a hand-edited file runs as edited or is refused. */
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "core/json_check.h"
#include "model/layers.h"
#include "pipeline/layout.h"
#include "pipeline/schedule.h"

/* ---- writing ---------------------------------------------------------------------- */

static json_t *memory_json(const struct cdp_rank_memory *m)
{
    return json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "params", (json_int_t)m->params, "grads",
                     (json_int_t)m->grads, "optimizer", (json_int_t)m->optimizer, "activations",
                     (json_int_t)m->activations, "buffers", (json_int_t)m->buffers, "device",
                     (json_int_t)m->device, "host", (json_int_t)m->host);
}

json_t *cdp_layout_to_json(const struct cdp_layout *l)
{
    json_t *o = json_object(), *shares = json_array(), *ranges = json_array(), *ranks = json_array();
    int ok = o && shares && ranges && ranks;
    for (int r = 0; ok && r < l->replicas; r++) ok = !json_array_append_new(shares, json_integer(l->shares[r]));
    for (int k = 0; ok && k < l->stages * l->chunks; k++)
        ok = !json_array_append_new(ranges, json_pack("[I,I]", (json_int_t)l->ranges[k][0],
                                                      (json_int_t)l->ranges[k][1]));
    for (int i = 0; ok && i < l->n_ranks; i++) {
        const struct cdp_layout_rank *k = &l->rank[i];
        ok = !json_array_append_new(ranks, json_pack("{s:i,s:i,s:i,s:i,s:i,s:i,s:s,s:I,s:o}", "stage", k->stage,
                                                     "replica", k->replica, "tensor", k->tensor, "node", k->node,
                                                     "device", k->device,
                                                     "gpu", k->gpu, "cpuset", k->cpuset, "capacity_bytes",
                                                     (json_int_t)k->capacity, "memory", memory_json(&k->memory)));
    }
    if (ok) {
        ok = !json_object_set_new(o, "version", json_integer(CDP_LAYOUT_JSON_VERSION)) &&
             !json_object_set_new(o, "backend", json_string(cdp_backend_name(l->backend))) &&
             !json_object_set_new(o, "topology", json_string(l->topology)) &&
             !json_object_set_new(o, "nodes", json_integer(l->n_nodes)) &&
             !json_object_set_new(o, "stages", json_integer(l->stages)) &&
             !json_object_set_new(o, "chunks", json_integer(l->chunks)) &&
             !json_object_set_new(o, "replicas", json_integer(l->replicas)) &&
             !json_object_set_new(o, "tensor", json_integer(l->tensor)) &&
             !json_object_set_new(o, "micro_batches", json_integer(l->micro_batches)) &&
             !json_object_set_new(o, "micro_batch", json_integer(l->micro_batch)) &&
             !json_object_set_new(o, "schedule", json_string(cdp_schedule_name(l->schedule))) &&
             !json_object_set_new(o, "schedule_file", l->schedule_file ? json_string(l->schedule_file) : json_null()) &&
             !json_object_set_new(o, "recompute", json_string(cdp_recompute_name(l->recompute))) &&
             !json_object_set_new(o, "zero", json_integer(l->zero)) &&
             !json_object_set_new(o, "rebalance_every", json_integer(l->rebalance_every)) &&
             !json_object_set_new(o, "shares", shares) && !json_object_set_new(o, "ranges", ranges) &&
             !json_object_set_new(o, "shared_devices", json_boolean(l->shared_devices)) &&
             !json_object_set_new(o, "ranks", ranks);
        if (ok) return o;
        json_decref(o);
        return NULL; /* set_new took the arrays */
    }
    json_decref(o);
    json_decref(shares);
    json_decref(ranges);
    json_decref(ranks);
    return NULL;
}

/* ---- reading ---------------------------------------------------------------------- */

static const char *const layout_keys[] = {"version", "backend", "topology", "nodes", "stages", "chunks", "replicas",
                                          "tensor", "micro_batches", "micro_batch", "schedule", "schedule_file", "recompute",
                                          "zero", "rebalance_every", "shares", "ranges", "shared_devices", "ranks",
                                          NULL};
static const char *const rank_keys[] = {"stage", "replica", "tensor", "node", "device", "gpu", "cpuset", "capacity_bytes",
                                        "memory", NULL};
static const char *const memory_keys[] = {"params", "grads", "optimizer", "activations", "buffers", "device", "host",
                                          NULL};

/* A member that must be there. */
static cdp_status need(const struct cdp_json_in *in, const json_t *obj, const char *ptr, const char *key,
                       const char *what, const json_t **out)
{
    char p[CDP_JSON_PTR_CAP];
    cdp_json_ptr_key(p, ptr, key);
    *out = json_object_get(obj, key);
    if (!*out) return cdp_json_fail(in, p, "missing: expected %s", what);
    return CDP_OK;
}

static cdp_status get_int(const struct cdp_json_in *in, const json_t *obj, const char *ptr, const char *key,
                          int64_t min, int64_t max, int64_t *out)
{
    const json_t *v;
    cdp_status st = need(in, obj, ptr, key, min > 0 ? "a positive integer" : "a non-negative integer", &v);
    if (st) return st;
    char p[CDP_JSON_PTR_CAP];
    cdp_json_ptr_key(p, ptr, key);
    return cdp_json_int(in, v, p, min, max, 0, NULL, out);
}

/* An int field of the layout's, within [min, max]. */
#define GET_INT(obj, ptr, key, min, max, dst)                                                                     \
    do {                                                                                                          \
        int64_t v_;                                                                                               \
        if ((st = get_int(in, obj, ptr, key, min, max, &v_))) goto fail;                                           \
        dst = v_;                                                                                                 \
    } while (0)

static cdp_status get_name(const struct cdp_json_in *in, const json_t *obj, const char *ptr, const char *key,
                           const char *(*name)(int), int count, int *out)
{
    const char *names[32];
    for (int i = 0; i < count && i < 31; i++) names[i] = name(i);
    names[count < 31 ? count : 31] = NULL;
    const json_t *v;
    cdp_status st = need(in, obj, ptr, key, "a name", &v);
    if (st) return st;
    char p[CDP_JSON_PTR_CAP];
    cdp_json_ptr_key(p, ptr, key);
    return cdp_json_enum(in, v, p, names, out);
}

static const char *backend_name(int i) { return cdp_backend_name((enum cdp_backend)i); }
static const char *schedule_name(int i) { return cdp_schedule_name((enum cdp_schedule_kind)i); }
static const char *recompute_name(int i) { return cdp_recompute_name((enum cdp_recompute)i); }

/* An array of exactly n entries. */
static cdp_status get_array(const struct cdp_json_in *in, const json_t *obj, const char *ptr, const char *key,
                            size_t n, const char *what, const json_t **out)
{
    cdp_status st = need(in, obj, ptr, key, what, out);
    if (st) return st;
    char p[CDP_JSON_PTR_CAP];
    cdp_json_ptr_key(p, ptr, key);
    if (!json_is_array(*out)) return cdp_json_expected(in, p, what, *out);
    if (json_array_size(*out) != n)
        return cdp_json_fail(in, p, "expected %s: %zu entries, got %zu", what, n, json_array_size(*out));
    return CDP_OK;
}

static cdp_status read_rank(const struct cdp_json_in *in, const json_t *o, const char *ptr,
                            struct cdp_layout_rank *k)
{
    cdp_status st;
    if (!json_is_object(o)) return cdp_json_expected(in, ptr, "an object", o);
    if ((st = cdp_json_check_keys(in, o, ptr, rank_keys, "a rank"))) return st;
    GET_INT(o, ptr, "stage", 0, (1 << 24), k->stage);
    GET_INT(o, ptr, "replica", 0, (1 << 24), k->replica);
    if (json_object_get(o, "tensor")) GET_INT(o, ptr, "tensor", 0, (1 << 24), k->tensor); /* absent: 0 */
    GET_INT(o, ptr, "node", 0, (1 << 24), k->node);
    GET_INT(o, ptr, "device", 0, (1 << 24), k->device);
    GET_INT(o, ptr, "gpu", 0, (1 << 24), k->gpu);
    GET_INT(o, ptr, "capacity_bytes", 0, INT64_MAX, k->capacity);
    const json_t *v;
    char p[CDP_JSON_PTR_CAP];
    if ((st = need(in, o, ptr, "cpuset", "a CPU list such as \"0-3\" (\"\": not bound)", &v))) return st;
    cdp_json_ptr_key(p, ptr, "cpuset");
    if ((st = cdp_json_string(in, v, p, k->cpuset, sizeof k->cpuset))) return st;
    for (const char *c = k->cpuset; *c; c++)
        if (!((*c >= '0' && *c <= '9') || *c == ',' || *c == '-'))
            return cdp_json_fail(in, p, "expected a CPU list such as \"0-3,8\", got \"%s\"", k->cpuset);
    if ((v = json_object_get(o, "memory"))) { /* predictions: shown, not run */
        cdp_json_ptr_key(p, ptr, "memory");
        if (!json_is_object(v)) return cdp_json_expected(in, p, "an object", v);
        if ((st = cdp_json_check_keys(in, v, p, memory_keys, "memory"))) return st;
        uint64_t *const dst[] = {&k->memory.params,      &k->memory.grads,  &k->memory.optimizer,
                                 &k->memory.activations, &k->memory.buffers, &k->memory.device, &k->memory.host};
        for (int i = 0; memory_keys[i]; i++) {
            int64_t x = 0;
            if ((st = cdp_json_get_int(in, v, p, memory_keys[i], 0, INT64_MAX, 0, &x))) return st;
            *dst[i] = (uint64_t)x;
        }
    }
    return CDP_OK;
fail:
    return st;
}

cdp_status cdp_layout_from_json(const json_t *j, const char *file, const char *ptr, struct cdp_layout **out)
{
    const struct cdp_json_in in_ = {.file = file}, *in = &in_;
    struct cdp_layout *l = NULL;
    char p[CDP_JSON_PTR_CAP], q[CDP_JSON_PTR_CAP];
    const json_t *v;
    cdp_status st;
    if (!json_is_object(j)) return cdp_json_expected(in, ptr[0] ? ptr : "/", "a layout (an object)", j);
    if ((st = cdp_json_check_keys(in, j, ptr, layout_keys, "a layout"))) return st;
    int64_t version, p_, v_, R_, t_ = 1;
    if ((st = get_int(in, j, ptr, "version", 1, INT32_MAX, &version))) return st;
    if (version != CDP_LAYOUT_JSON_VERSION) {
        cdp_json_ptr_key(p, ptr, "version");
        return cdp_json_fail(in, p, "version %lld: this cdphybrid reads layouts of version %d (plan the plan again "
                             "with this cdphybrid to write one)", (long long)version, CDP_LAYOUT_JSON_VERSION);
    }
    if ((st = get_int(in, j, ptr, "stages", 1, 1 << 24, &p_)) || (st = get_int(in, j, ptr, "chunks", 1, 1 << 24, &v_)) ||
        (st = get_int(in, j, ptr, "replicas", 1, 1 << 24, &R_)) ||
        (json_object_get(j, "tensor") && (st = get_int(in, j, ptr, "tensor", 1, 1 << 24, &t_)))) /* absent: 1 */
        return st;
    if ((st = cdp_layout_create_tensor((int)p_, (int)v_, (int)R_, (int)t_, &l))) {
        cdp_json_ptr_key(p, ptr, "stages");
        return cdp_error_context(st, "%s: %s", file, p);
    }
    const int nv = l->stages * l->chunks;
    int e;
    if ((st = get_name(in, j, ptr, "backend", backend_name, CDP_BACKEND_COUNT, &e))) goto fail;
    l->backend = (enum cdp_backend)e;
    if ((st = get_name(in, j, ptr, "schedule", schedule_name, CDP_SCHEDULE_COUNT, &e))) goto fail;
    l->schedule = (enum cdp_schedule_kind)e;
    if ((st = get_name(in, j, ptr, "recompute", recompute_name, CDP_RECOMPUTE_COUNT, &e))) goto fail;
    l->recompute = (enum cdp_recompute)e;
    GET_INT(j, ptr, "nodes", 1, 1 << 24, l->n_nodes);
    GET_INT(j, ptr, "micro_batches", 1, CDP_PLAN_MAX_MICRO_BATCHES, l->micro_batches);
    GET_INT(j, ptr, "micro_batch", 1, INT32_MAX, l->micro_batch);
    GET_INT(j, ptr, "zero", 0, 2, l->zero);
    GET_INT(j, ptr, "rebalance_every", 0, INT64_MAX, l->rebalance_every);
    if ((v = json_object_get(j, "topology"))) {
        cdp_json_ptr_key(p, ptr, "topology");
        if ((st = cdp_json_string(in, v, p, l->topology, sizeof l->topology))) goto fail;
    }
    if ((v = json_object_get(j, "shared_devices")) && (st = cdp_json_get_bool(in, j, ptr, "shared_devices", &e)) == 0)
        l->shared_devices = e;
    if (st) goto fail;
    if ((v = json_object_get(j, "schedule_file")) && !json_is_null(v)) {
        cdp_json_ptr_key(p, ptr, "schedule_file");
        if (!json_is_string(v) || json_string_length(v) == 0 || json_string_value(v)[0] != '/') {
            st = cdp_json_expected(in, p, "an absolute path, or null", v);
            goto fail;
        }
        if (!(l->schedule_file = strdup(json_string_value(v)))) {
            st = cdp_fail(CDP_ERR_NOMEM, "%s: out of memory", file);
            goto fail;
        }
    }
    if ((st = get_array(in, j, ptr, "shares", (size_t)l->replicas, "an array of micro-batches, one per replica", &v)))
        goto fail;
    cdp_json_ptr_key(q, ptr, "shares");
    for (int r = 0; r < l->replicas; r++) {
        cdp_json_ptr_index(p, q, (size_t)r);
        if ((st = cdp_json_int(in, json_array_get(v, (size_t)r), p, 1, CDP_PLAN_MAX_MICRO_BATCHES, 0, NULL,
                               &l->shares[r])))
            goto fail;
    }
    if ((st = get_array(in, j, ptr, "ranges", (size_t)nv, "an array of [first, end) unit ranges, one per virtual "
                        "stage", &v)))
        goto fail;
    cdp_json_ptr_key(q, ptr, "ranges");
    for (int k = 0; k < nv; k++) {
        const json_t *a = json_array_get(v, (size_t)k);
        cdp_json_ptr_index(p, q, (size_t)k);
        if (!json_is_array(a) || json_array_size(a) != 2) {
            st = cdp_json_expected(in, p, "[first, end)", a);
            goto fail;
        }
        for (int b = 0; b < 2; b++) {
            char pb[CDP_JSON_PTR_CAP];
            cdp_json_ptr_index(pb, p, (size_t)b);
            if ((st = cdp_json_int(in, json_array_get(a, (size_t)b), pb, 0, INT32_MAX, 0, NULL, &l->ranges[k][b])))
                goto fail;
        }
    }
    if ((st = get_array(in, j, ptr, "ranks", (size_t)l->n_ranks, "an array of ranks, stages x replicas x tensor", &v)))
        goto fail;
    cdp_json_ptr_key(q, ptr, "ranks");
    for (int i = 0; i < l->n_ranks; i++) {
        cdp_json_ptr_index(p, q, (size_t)i);
        if ((st = read_rank(in, json_array_get(v, (size_t)i), p, &l->rank[i]))) goto fail;
    }
    int64_t units = l->ranges[nv - 1][1];
    if ((st = cdp_layout_check(l, units))) {
        st = cdp_error_context(st, "%s: %s", file, ptr[0] ? ptr : "/");
        goto fail;
    }
    *out = l;
    return CDP_OK;
fail:
    cdp_layout_free(l);
    return st;
}

/* ---- against its plan --------------------------------------------------------------- */

cdp_status cdp_layout_check_plan(const struct cdp_layout *l, const struct cdp_plan *plan, const char *file)
{
    const struct cdp_parallel_desc *pd = &plan->parallel;
    const int p = l->stages, R = l->replicas, nv = p * l->chunks;
    struct cdp_unit *u = NULL;
    int n = 0;
    cdp_status st = cdp_units_build(&plan->model, &u, &n);
    if (st) return st;
    free(u);
    if ((st = cdp_layout_check(l, n))) return cdp_error_context(st, "%s: /layout", file);
#define DIFFERS(...) return cdp_fail(CDP_ERR_INVALID, "%s: the layout and its plan disagree: " __VA_ARGS__)
#define FIXED(plan_value, key, lkey, lvalue)                                                                      \
    if ((plan_value) != CDP_AUTO && (int64_t)(plan_value) != (int64_t)(lvalue))                                   \
        DIFFERS("/layout/%s is %lld, /%s is %lld (edit both, or plan again)", file, lkey, (long long)(lvalue), key, \
                (long long)(plan_value));
    if (!plan->cluster.backend_auto && plan->cluster.backend != l->backend)
        DIFFERS("/layout/backend is \"%s\", /cluster/backend is \"%s\"", file, cdp_backend_name(l->backend),
                cdp_backend_name(plan->cluster.backend));
    FIXED(pd->stages, "parallel/stages", "stages", p);
    FIXED(pd->replicas, "parallel/replicas", "replicas", R);
    FIXED(pd->tensor, "parallel/tensor", "tensor", l->tensor);
    FIXED(pd->micro_batches, "parallel/micro_batches", "micro_batches", l->micro_batches);
    if (!pd->schedule_auto) FIXED(pd->chunks, "parallel/chunks", "chunks", l->chunks);
    FIXED(plan->train.micro_batch, "train/micro_batch", "micro_batch", l->micro_batch);
    FIXED(plan->train.global_batch, "train/global_batch", "replicas x micro_batches x micro_batch",
          (int64_t)R * l->micro_batches * l->micro_batch);
    FIXED(pd->rebalance_every, "parallel/rebalance_every", "rebalance_every", l->rebalance_every);
    if (R > 1) FIXED(pd->zero, "parallel/zero", "zero", l->zero);
    if (!pd->schedule_auto && pd->schedule != l->schedule)
        DIFFERS("/layout/schedule is \"%s\", /parallel/schedule is \"%s\"", file, cdp_schedule_name(l->schedule),
                cdp_schedule_name(pd->schedule));
    if (!pd->schedule_file != !l->schedule_file || (l->schedule_file && strcmp(pd->schedule_file, l->schedule_file)))
        DIFFERS("/layout/schedule_file is %s, the plan's schedule file is %s", file,
                l->schedule_file ? l->schedule_file : "null", pd->schedule_file ? pd->schedule_file : "none");
    if (!plan->train.recompute_auto && plan->train.recompute != l->recompute)
        DIFFERS("/layout/recompute is \"%s\", /train/recompute is \"%s\"", file, cdp_recompute_name(l->recompute),
                cdp_recompute_name(plan->train.recompute));
    if (pd->partition) {
        if (pd->n_partition != nv)
            DIFFERS("/layout/ranges has %d virtual stages, /parallel/partition %d", file, nv, pd->n_partition);
        for (int k = 0; k < nv; k++)
            if (pd->partition[k][0] != l->ranges[k][0] || pd->partition[k][1] != l->ranges[k][1])
                DIFFERS("/layout/ranges/%d is [%lld, %lld], /parallel/partition/%d is [%lld, %lld]", file, k,
                        (long long)l->ranges[k][0], (long long)l->ranges[k][1], k, (long long)pd->partition[k][0],
                        (long long)pd->partition[k][1]);
    }
    if (pd->placement == CDP_PLACEMENT_EXPLICIT && pd->stages == p && pd->replicas == R)
        for (int i = 0; i < l->n_ranks; i++) {
            const struct cdp_layout_rank *k = &l->rank[i];
            /* a tensor group's devices follow the first, which the placement names */
            const int64_t d = pd->placement_map[k->stage * R + k->replica] + k->tensor;
            char tensor[24] = "";
            if (l->tensor > 1) snprintf(tensor, sizeof tensor, ", tensor %d", k->tensor);
            if (d != k->device)
                DIFFERS("/layout/ranks/%d (stage %d, replica %d%s) is on device %d, /parallel/placement/%d/%d %s %lld",
                        file, i, k->stage, k->replica, tensor, k->device, k->stage, k->replica,
                        l->tensor > 1 ? "gives" : "is", (long long)d);
        }
    for (int r = 0; r < R; r++) {
        const int64_t want = pd->balance == CDP_BALANCE_EXPLICIT && pd->n_shares == R ? pd->shares[r]
                             : pd->balance == CDP_BALANCE_UNIFORM                     ? l->micro_batches
                                                                                      : l->shares[r];
        if (want != l->shares[r])
            DIFFERS("/layout/shares/%d is %lld, /parallel/balance%s gives %lld", file, r, (long long)l->shares[r],
                    pd->balance == CDP_BALANCE_EXPLICIT ? "" : " (\"uniform\")", (long long)want);
    }
#undef FIXED
#undef DIFFERS
    return CDP_OK;
}

cdp_status cdp_layout_load(const char *path, const struct cdp_plan *plan, struct cdp_layout **out)
{
    if (!path || !plan || !out) return cdp_fail(CDP_ERR_INVALID, "cdp_layout_load: the path, the plan and out are "
                                                "required");
    struct cdp_layout *l = NULL;
    cdp_status st = cdp_layout_of_planned(path, plan, &l);
    if (st) return st;
    if (!l) return cdp_fail(CDP_ERR_INVALID, "%s: /layout: missing: expected the layout a run of cdphybrid writes "
                            "into planned.json", path);
    *out = l;
    return CDP_OK;
}

cdp_status cdp_layout_of_planned(const char *path, const struct cdp_plan *plan, struct cdp_layout **out)
{
    *out = NULL;
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) return cdp_fail(CDP_ERR_IO, "%s: line %d: %s", path, je.line, je.text);
    const json_t *j = json_object_get(root, "layout");
    struct cdp_layout *l = NULL;
    cdp_status st = CDP_OK;
    if (j && !(st = cdp_layout_from_json(j, path, "/layout", &l)) && (st = cdp_layout_check_plan(l, plan, path))) {
        cdp_layout_free(l);
        l = NULL;
    }
    json_decref(root);
    if (!st) *out = l;
    return st;
}
