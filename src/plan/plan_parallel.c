/* The plan's /parallel: stages, replicas and micro-batches, the schedule (a
 * kind of the table in schedule_kind.c or a schedule file), the partition,
 * the placement, the balance of replicas and the batch arithmetic. */
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

static const char *const parallel_keys[] = {"stages", "replicas", "tensor", "micro_batches", "schedule", "chunks",
                                            "partition", "placement", "balance", "rebalance_every", "zero", "bucket_mb",
                                            "sequence_parallel", "comm_dtype", NULL};

/* /parallel/comm_dtype, in the order of comm.h's cdp_comm_wire */
static const char *const comm_dtype_words[] = {"fp32", "bf16", NULL};
static const char *const comm_dtype_keys[] = {"tensor", "gradients", NULL};

/* "fp32" | "bf16" (both kinds of collective) | {"tensor": ..., "gradients": ...} (each fp32 unless named) */
static cdp_status load_comm_dtype(struct ld *c, const json_t *v)
{
    struct cdp_parallel_desc *pd = &c->p->parallel;
    const char *P = "/parallel/comm_dtype";
    cdp_status st;
    int tensor = 0, gradients = 0;
    if (json_is_string(v)) {
        if ((st = cdp_json_enum(&c->in, v, P, comm_dtype_words, &tensor))) return st;
        gradients = tensor;
    } else if (json_is_object(v)) {
        if ((st = cdp_json_check_keys(&c->in, v, P, comm_dtype_keys, P))) return st;
        if ((st = cdp_json_get_enum(&c->in, v, P, "tensor", comm_dtype_words, &tensor))) return st;
        if ((st = cdp_json_get_enum(&c->in, v, P, "gradients", comm_dtype_words, &gradients))) return st;
    } else {
        return cdp_json_expected(&c->in, P, "\"fp32\", \"bf16\" or {\"tensor\": ..., \"gradients\": ...}", v);
    }
    pd->comm_bf16_tensor = tensor == 1;
    pd->comm_bf16_gradients = gradients == 1;
    return CDP_OK;
}

int cdp_plan_sequence_parallel_runs(const struct cdp_model_desc *m, char *why, size_t cap)
{
    if (m->kind == CDP_MODEL_GPT) return 1;
    if (why) snprintf(why, cap, "%s", "an explicit layer list");
    return 0;
}

/* /parallel/sequence_parallel: true, false or "auto" (after /parallel/tensor).
 * true at a fixed t needs t above 1 dividing the context; true at tensor
 * "auto" applies to every t above 1 the planner tries (those the context
 * allows); "auto" lets the planner decide per t. */
static cdp_status load_sequence_parallel(struct ld *c, const json_t *v)
{
    struct cdp_parallel_desc *pd = &c->p->parallel;
    const struct cdp_model_desc *md = &c->p->model;
    const char *P = "/parallel/sequence_parallel";
    if (!v) return CDP_OK;
    if (json_is_string(v) && strcmp(json_string_value(v), "auto") == 0) {
        pd->sequence_parallel_auto = 1;
    } else if (json_is_boolean(v)) {
        pd->sequence_parallel = json_is_true(v);
    } else {
        return cdp_json_expected(&c->in, P, "true, false or \"auto\"", v);
    }
    if (!pd->sequence_parallel && !pd->sequence_parallel_auto) return CDP_OK;
    const char *word = pd->sequence_parallel ? "true" : "\"auto\"";
    char what[64];
    if (pd->tensor != CDP_AUTO && pd->tensor < 2)
        return cdp_json_fail(&c->in, P, "%s needs /parallel/tensor above 1 or \"auto\" (it shards the sequence over "
                             "the tensor group), not 1", word);
    if (!cdp_plan_sequence_parallel_runs(md, what, sizeof what))
        return cdp_json_fail(&c->in, P, "%s runs the GPT and Llama presets only today, not %s", word, what);
    if (pd->sequence_parallel && pd->tensor != CDP_AUTO && md->context % pd->tensor)
        return cdp_json_fail(&c->in, P, "true needs /model/context %lld to be a multiple of /parallel/tensor %lld "
                             "(each rank holds context / tensor positions)", (long long)md->context,
                             (long long)pd->tensor);
    c->p->model.seq_parallel = pd->sequence_parallel && pd->tensor != CDP_AUTO;
    return CDP_OK;
}

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

/* The first kind of the table that runs c chunks per rank. */
static enum cdp_schedule_kind kind_of_chunks(enum cdp_schedule_chunks c)
{
    for (int k = 0; k < CDP_SCHEDULE_COUNT; k++)
        if (cdp_schedule_def((enum cdp_schedule_kind)k)->chunks == c) return (enum cdp_schedule_kind)k;
    CDP_ASSERT(!"no schedule kind runs these chunks");
    return CDP_SCHEDULE_1F1B;
}

/* The kinds that run more than one chunk per rank, for a message: "\"a\" (or
 * \"b\", 2)", those that run exactly two with the 2. */
static void chunk_kinds(char *buf, size_t cap)
{
    size_t o = 0;
    int n = 0;
    buf[0] = '\0';
    for (int k = 0; k < CDP_SCHEDULE_COUNT && o < cap; k++) {
        const struct cdp_schedule_def *d = cdp_schedule_def((enum cdp_schedule_kind)k);
        if (d->chunks == CDP_CHUNKS_ONE) continue;
        o += (size_t)snprintf(buf + o, cap - o, "%s\"%s\"%s", n ? (n == 1 ? " (or " : ", or ") : "", d->name,
                              d->chunks == CDP_CHUNKS_TWO ? ", 2" : "");
        n++;
    }
    if (n > 1 && o < cap) snprintf(buf + o, cap - o, ")");
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
    const struct cdp_schedule_def *sd = cdp_schedule_def(pd->schedule);
    if (sd->mb_multiple_of_stages && !pd->schedule_file && pd->stages != CDP_AUTO) {
        for (int i = 0; i < pd->n_shares; i++)
            if (pd->shares[i] % pd->stages) {
                char kp[CDP_JSON_PTR_CAP];
                snprintf(kp, sizeof kp, "%s/%d", P, i);
                return cdp_json_fail(&c->in, kp,
                                     "%lld is not a multiple of /parallel/stages %lld, as the %s "
                                     "schedule needs",
                                     (long long)pd->shares[i], (long long)pd->stages, sd->name);
            }
        /* said here, not as a /parallel/micro_batches the file may not have */
        if (pd->micro_batches % pd->stages)
            return cdp_json_fail(&c->in, P,
                                 "the shares sum to %lld, so /parallel/micro_batches is %lld, not a multiple of "
                                 "/parallel/stages %lld as the %s schedule needs of it too",
                                 (long long)sum, (long long)pd->micro_batches, (long long)pd->stages, sd->name);
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
    cdp_status st = cdp_plan_get_existing_file(c, sj, P, &pd->schedule_file);
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

/* The layer types a list may hold with /parallel/tensor above 1, for messages. */
static void tensor_types(char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int t = 0; t < CDP_LAYER_TYPE_COUNT; t++) {
        const struct cdp_layer_def *d = cdp_layer_def((enum cdp_layer_type)t);
        if (!d->tensor_ok || !d->listable || n >= cap) continue;
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", d->name);
    }
}

/* With /parallel/tensor above 1, every layer must be of a type that splits
 * over the tensor group or passes a slice through (layer_def.h, tensor_ok);
 * the others are refused here, naming the layer. */
static cdp_status check_tensor_layers(struct ld *c)
{
    const struct cdp_parallel_desc *pd = &c->p->parallel;
    const struct cdp_model_desc *md = &c->p->model;
    /* splits pair, whatever t: a column, elementwise layers, a row */
    int open = -1; /* the column split whose slice flows, or -1 */
    for (int i = 0; md->kind != CDP_MODEL_GPT && i < md->n_layers; i++) {
        const struct cdp_layer_desc *L = &md->layer_list[i];
        const struct cdp_layer_def *d = cdp_layer_def(L->type);
        char at[64];
        if (L->type == CDP_LAYER_LINEAR && L->split == CDP_TSPLIT_COLUMN) {
            snprintf(at, sizeof at, "/model/layers/%d/split", i);
            if (open >= 0)
                return cdp_json_fail(&c->in, at, "\"column\", but the slice of the column split of layer %d has not "
                                     "been summed by a \"row\" split linear yet", open);
            snprintf(at, sizeof at, "/model/layers/%d/out", i);
            if (pd->tensor != CDP_AUTO && L->out % pd->tensor)
                return cdp_json_fail(&c->in, at, "%lld is not a multiple of /parallel/tensor %lld (a column split "
                                     "holds out / tensor rows a rank)", (long long)L->out, (long long)pd->tensor);
            open = i;
        } else if (L->type == CDP_LAYER_LINEAR && L->split == CDP_TSPLIT_ROW) {
            snprintf(at, sizeof at, "/model/layers/%d/split", i);
            if (open < 0)
                return cdp_json_fail(&c->in, at, "\"row\" needs a \"column\" split linear before it, with only "
                                     "relu, gelu or silu between (its input is the column's slice)");
            open = -1;
        } else if (open >= 0 && !d->tensor_passes) {
            snprintf(at, sizeof at, "/model/layers/%d", i);
            return cdp_json_fail(&c->in, at, "%s gets the slice of the column split of layer %d; only relu, gelu "
                                 "or silu may pass it on, to a \"row\" split linear", d->name, open);
        }
    }
    if (open >= 0) {
        char at[64];
        snprintf(at, sizeof at, "/model/layers/%d/split", open);
        return cdp_json_fail(&c->in, at, "\"column\", but its slice reaches the end of the model; a \"row\" split "
                             "linear must sum it");
    }
    if (pd->tensor == 1 || pd->tensor == CDP_AUTO) return CDP_OK;
    char types[256];
    tensor_types(types, sizeof types);
    for (int i = 0; i < cdp_model_desc_units(md); i++) {
        const struct cdp_layer_def *d = cdp_layer_def(cdp_model_desc_unit(md, i).type);
        char where[64];
        if (md->kind == CDP_MODEL_LAYERS) snprintf(where, sizeof where, "/model/layers/%d", i);
        else snprintf(where, sizeof where, "/model/preset");
        if (!d->tensor_ok)
            return cdp_json_fail(&c->in, where,
                                 "%s (layer %d) does not split over /parallel/tensor %lld yet; the layer types "
                                 "that run with tensor above 1 today: %s (docs/parallelism.md)",
                                 d->name, i, (long long)pd->tensor, types);
    }
    const char *key = NULL;
    int64_t value = 0;
    const int i = cdp_model_desc_tensor_misfit(md, (int)pd->tensor, &key, &value);
    if (i >= 0) {
        char at[96];
        if (md->kind == CDP_MODEL_LAYERS) snprintf(at, sizeof at, "/model/layers/%d/%s", i, key);
        else snprintf(at, sizeof at, "/model/%s", key);
        return cdp_json_fail(&c->in, at,
                             "%lld is not a multiple of /parallel/tensor %lld (each rank of a tensor group holds %s / "
                             "tensor of every %s)",
                             (long long)value, (long long)pd->tensor, key,
                             cdp_layer_def(cdp_model_desc_unit(md, i).type)->name);
    }
    return CDP_OK;
}

cdp_status cdp_plan_load_parallel(struct ld *c, const json_t *v)
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
        if ((st = cdp_json_get_int(&c->in, v, P, "tensor", 1, CDP_PLAN_MAX_TENSOR_GROUP, 1, &pd->tensor))) return st;
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
    /* the named kind's shape rules (schedule_kind.c); a file's lists carry their own */
    const struct cdp_schedule_def *named = pd->schedule_file ? NULL : cdp_schedule_def(pd->schedule);
    pd->chunks = pd->schedule_file && pd->chunks > 0 ? pd->chunks : cdp_schedule_has_chunks(pd->schedule) ? 2 : 1;
    if (v && (st = cdp_json_get_int(&c->in, v, P, "chunks", 1, MAX_COUNT, 0, &pd->chunks))) return st;
    if (pd->schedule_file) {
        if (pd->file_chunks > 0 && pd->chunks != pd->file_chunks)
            return cdp_json_fail(&c->in, "/parallel/chunks", "%lld, but the schedule file %s has %lld chunks per rank",
                                 (long long)pd->chunks, pd->schedule_file, (long long)pd->file_chunks);
        /* lists of more chunks than their kind runs place them as the kind that runs the plan's chunks */
        if (pd->chunks > 1 && cdp_schedule_def(pd->schedule)->chunks == CDP_CHUNKS_ONE)
            pd->schedule = kind_of_chunks(CDP_CHUNKS_PLAN);
    }
    const struct cdp_schedule_def *sd = cdp_schedule_def(pd->schedule);
    if (sd->chunks == CDP_CHUNKS_TWO && pd->chunks != 2)
        return cdp_json_fail(&c->in, "/parallel/chunks",
                             "%lld, but /parallel/schedule \"%s\" runs exactly 2 chunks per rank%s; "
                             "leave chunks out or give 2",
                             (long long)pd->chunks, sd->name, sd->placement == CDP_VSTAGE_V ? " (a V)" : "");
    if (pd->chunks > 1 && !cdp_schedule_has_chunks(pd->schedule)) {
        char kinds[256];
        chunk_kinds(kinds, sizeof kinds);
        return cdp_json_fail(&c->in, "/parallel/chunks", "%lld needs /parallel/schedule %s, not \"%s\"",
                             (long long)pd->chunks, kinds, cdp_schedule_name((enum cdp_schedule_kind)sch));
    }
    if (named && named->chunks == CDP_CHUNKS_PLAN && pd->chunks < 2)
        return cdp_json_fail(&c->in, "/parallel/chunks",
                             "/parallel/schedule \"%s\" needs at least 2 chunks "
                             "per rank, got %lld",
                             named->name, (long long)pd->chunks);
    const json_t *part = v ? json_object_get(v, "partition") : NULL;
    if (part && (st = load_partition(c, part))) return st;
    if (named && pd->stages != CDP_AUTO && pd->stages < named->min_stages)
        return cdp_json_fail(&c->in, "/parallel/stages",
                             "/parallel/schedule \"%s\" needs at least %d stages, "
                             "got %lld",
                             named->name, named->min_stages, (long long)pd->stages);
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
    if ((st = check_tensor_layers(c))) return st;
    if ((st = load_sequence_parallel(c, v ? json_object_get(v, "sequence_parallel") : NULL))) return st;
    const json_t *cd = v ? json_object_get(v, "comm_dtype") : NULL;
    if (cd && (st = load_comm_dtype(c, cd))) return st;
    if ((st = batch_arithmetic(c))) return st;
    if (named && named->mb_multiple_of_stages && pd->stages != CDP_AUTO && pd->micro_batches != CDP_AUTO &&
        pd->micro_batches % pd->stages)
        return cdp_json_fail(&c->in, "/parallel/micro_batches",
                             "%lld is not a multiple of /parallel/stages %lld, as "
                             "the %s schedule needs",
                             (long long)pd->micro_batches, (long long)pd->stages, named->name);
    return CDP_OK;
}
