/* The unit-cost record's bytes, and the measured cost table's file. */
#include "model/costs.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cdp/core.h"
#include "core/file.h"
#include "core/json_check.h"
#include "model/layer_def.h"
#include "model/optim.h"

/* The runtime keeps activations, gradients and what travels between stages
 * and replicas in fp32 on every backend (bf16 plans compute their matrix
 * products in bf16 from fp32 operands). */
double cdp_cost_act_elem_bytes(const struct cdp_plan *plan)
{
    (void)plan;
    return 4;
}

double cdp_cost_grad_bytes_per_param(const struct cdp_plan *plan) { return cdp_cost_act_elem_bytes(plan); }

/* What travels (/parallel/comm_dtype): bf16 is 2 bytes an element on the wire. */
double cdp_cost_tensor_comm_elem_bytes(const struct cdp_plan *plan)
{
    return plan->parallel.comm_bf16_tensor ? 2 : cdp_cost_act_elem_bytes(plan);
}

double cdp_cost_grad_comm_bytes_per_param(const struct cdp_plan *plan)
{
    return plan->parallel.comm_bf16_gradients ? 2 : cdp_cost_grad_bytes_per_param(plan);
}

/* fp32 weights 4 + gradients 4 + the optimizer's state (cdp_optimizer_state_bytes). */
double cdp_cost_state_bytes_per_param(const struct cdp_plan *plan)
{
    return 8 + (double)cdp_optimizer_state_bytes(&plan->train.optimizer, 1);
}

/* Reads and writes of one fp32 step: AdamW reads w, g, m, v and writes w, m, v
 * (7 x 4); SGD with momentum reads w, g, b and writes w, b (5 x 4); plain SGD
 * reads w, g and writes w (3 x 4). bf16's extra weight copy is not counted. */
double cdp_cost_opt_bytes_per_param(const struct cdp_plan *plan)
{
    const struct cdp_optimizer_desc *o = &plan->train.optimizer;
    if (o->type == CDP_OPT_ADAMW) return 28;
    return o->momentum != 0 ? 20 : 12;
}

void cdp_cost_fit_units(const struct cdp_plan *plan, struct cdp_unit *u, int n)
{
    for (int i = 0; i < n; i++) {
        const int64_t att = cdp_cost_att_floats(plan, &u[i]);
        u[i].act_floats += att - u[i].att_floats;
        u[i].att_floats = att;
        cdp_unit_set_recompute(&u[i], u[i].recompute);
    }
}

int64_t cdp_cost_att_floats(const struct cdp_plan *plan, const struct cdp_unit *u)
{
    if (!cdp_layer_def(u->desc.type)->keeps_attention) return 0;
    /* the rank's heads and width where u is split by heads, as cdp_unit_fit_kernels asks the table */
    const int64_t t = cdp_unit_tensor_split(u) ? u->tp_size : 1;
    const int64_t T = u->in.d[0] * (u->seq_parallel ? u->tp_size : 1), C = u->in.d[1] / t, NH = u->desc.heads / t;
    const int64_t HS = NH > 0 ? C / NH : 0;
    if (cdp_backend_is_gpu(plan->cluster.backend) && plan->train.precision == CDP_PRECISION_BF16 &&
        (HS == 32 || HS == 64) && C % NH == 0 && T > HS)
        return T * (NH + C);
    return u->att_floats;
}

/* ---- measured tables ---- */

void cdp_cost_table_clear(struct cdp_cost_table *t)
{
    if (!t) return;
    free(t->units);
    memset(t, 0, sizeof *t);
}

cdp_status cdp_cost_table_write(const struct cdp_cost_table *t, const char *path)
{
    json_t *o = json_object(), *units = json_array();
    json_object_set_new(o, "format", json_string("cdphybrid-costs"));
    json_object_set_new(o, "version", json_integer(2));
    json_object_set_new(o, "device", json_string(t->device));
    json_object_set_new(o, "micro_batch", json_integer((json_int_t)t->micro_batch));
    json_object_set_new(o, "threads", json_integer(t->threads));
    json_object_set_new(o, "tensor", json_integer(t->tensor > 1 ? t->tensor : 1));
    for (int i = 0; i < t->n_units; i++)
        json_array_append_new(units, json_pack("{s:i,s:s,s:f,s:f,s:f}", "index", t->units[i].index, "kind",
                                               cdp_layer_name(t->units[i].type), "fwd_s", t->units[i].fwd_s,
                                               "bwd_s", t->units[i].bwd_s, "bwd_w_s", t->units[i].bwd_w_s));
    json_object_set_new(o, "units", units);
    json_object_set_new(o, "optimizer_s_per_param", json_real(t->optimizer_s_per_param));
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    json_decref(o);
    if (!text) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    size_t n = strlen(text);
    char *line = realloc(text, n + 2); /* the file ends with a newline */
    if (!line) {
        free(text);
        return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    }
    text = line;
    memcpy(text + n, "\n", 2);
    cdp_status st = cdp_write_file_atomic(path, text, n + 1);
    free(text);
    return st;
}

static int kind_of(const char *name, enum cdp_layer_type *k)
{
    for (int i = 0; i < CDP_LAYER_TYPE_COUNT; i++)
        if (!strcmp(cdp_layer_name((enum cdp_layer_type)i), name)) {
            *k = (enum cdp_layer_type)i;
            return 1;
        }
    return 0;
}

/* A non-negative number of seconds at key of o (a positive one when positive). */
static cdp_status read_time(const struct cdp_json_in *in, json_t *o, const char *where, const char *key,
                            int positive, double *out)
{
    char p[CDP_JSON_PTR_CAP], what[64];
    cdp_json_ptr_key(p, where, key);
    snprintf(what, sizeof what, "a %s number of seconds", positive ? "positive" : "non-negative");
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v) || !(json_number_value(v) >= 0) || (positive && json_number_value(v) <= 0) ||
        !isfinite(json_number_value(v)))
        return cdp_json_expected(in, p, what, v);
    *out = json_number_value(v);
    return CDP_OK;
}

cdp_status cdp_cost_table_read(const char *path, struct cdp_cost_table *out)
{
    const struct cdp_json_in in = {.file = path};
    struct cdp_cost_table t = {0};
    json_error_t err;
    cdp_status st = CDP_OK;
    FILE *f = fopen(path, "r");
    if (!f) return cdp_fail(errno == ENOENT ? CDP_ERR_INVALID : CDP_ERR_IO, "%s: cannot read: %s", path,
                            strerror(errno));
    json_t *o = json_loadf(f, 0, &err);
    fclose(f);
    if (!o) return cdp_fail(CDP_ERR_INVALID, "%s:%d:%d: not a costs file (JSON): %s", path, err.line, err.column,
                            err.text);
    json_t *fmt = json_object_get(o, "format"), *units = json_object_get(o, "units");
    json_t *th = json_object_get(o, "threads"), *dev = json_object_get(o, "device");
    int64_t version = 0;
    if (!json_is_object(o) || !json_is_string(fmt) || strcmp(json_string_value(fmt), "cdphybrid-costs")) {
        st = cdp_json_fail(&in, "/format", "expected \"cdphybrid-costs\" (write one with cdphybrid --plan P "
                           "--profile)");
        goto fail;
    }
    /* version 1: no "tensor" (measured at t = 1) and no per-unit "bwd_w_s" */
    if ((st = cdp_json_int(&in, json_object_get(o, "version"), "/version", 1, 2, 0, "1 or 2", &version)))
        goto fail;
    t.tensor = 1;
    t.bwd_w_measured = version >= 2;
    if (version >= 2) {
        int64_t tp = 1;
        if ((st = cdp_json_int(&in, json_object_get(o, "tensor"), "/tensor", 1, CDP_PLAN_MAX_TENSOR_GROUP, 0,
                               NULL, &tp)))
            goto fail;
        t.tensor = (int)tp;
    }
    if ((st = cdp_json_int(&in, json_object_get(o, "micro_batch"), "/micro_batch", 1, INT64_MAX, 0, NULL,
                           &t.micro_batch)))
        goto fail;
    if (!json_is_array(units) || json_array_size(units) == 0 || json_array_size(units) > (1 << 20)) {
        st = cdp_json_expected(&in, "/units", "a non-empty array", units);
        goto fail;
    }
    t.threads = json_is_integer(th) ? (int)json_integer_value(th) : 0;
    if (json_is_string(dev)) snprintf(t.device, sizeof t.device, "%s", json_string_value(dev));
    t.n_units = (int)json_array_size(units);
    if (!(t.units = calloc((size_t)t.n_units, sizeof *t.units))) {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < t.n_units; i++) {
        json_t *e = json_array_get(units, (size_t)i), *k = json_object_get(e, "kind");
        char where[CDP_JSON_PTR_CAP], p[CDP_JSON_PTR_CAP], what[32];
        int64_t index = -1;
        cdp_json_ptr_index(where, "/units", (size_t)i);
        cdp_json_ptr_key(p, where, "index");
        snprintf(what, sizeof what, "%d", i);
        if ((st = cdp_json_int(&in, json_object_get(e, "index"), p, i, i, 0, what, &index))) goto fail;
        cdp_json_ptr_key(p, where, "kind");
        if (!json_is_string(k) || !kind_of(json_string_value(k), &t.units[i].type)) {
            st = cdp_json_expected(&in, p, "a unit kind", k);
            goto fail;
        }
        t.units[i].index = i;
        if ((st = read_time(&in, e, where, "fwd_s", 1, &t.units[i].fwd_s))) goto fail;
        if ((st = read_time(&in, e, where, "bwd_s", 1, &t.units[i].bwd_s))) goto fail;
        if (version >= 2) {
            if ((st = read_time(&in, e, where, "bwd_w_s", 0, &t.units[i].bwd_w_s))) goto fail;
            if (t.units[i].bwd_w_s > t.units[i].bwd_s) {
                cdp_json_ptr_key(p, where, "bwd_w_s");
                st = cdp_json_expected(&in, p, "a number of seconds no larger than the unit's bwd_s (the weight "
                                       "gradients' part of its backward)", json_object_get(e, "bwd_w_s"));
                goto fail;
            }
        }
    }
    if ((st = read_time(&in, o, "", "optimizer_s_per_param", 0, &t.optimizer_s_per_param))) goto fail;
    json_decref(o);
    *out = t;
    return CDP_OK;
fail:
    json_decref(o);
    cdp_cost_table_clear(&t);
    return st;
}

cdp_status cdp_cost_table_check(const struct cdp_cost_table *t, const char *path, const struct cdp_plan *plan,
                                const struct cdp_unit *u, int n)
{
    if (t->n_units != n)
        return cdp_fail(CDP_ERR_INVALID, "%s: measured for a model of %d units; %s's model has %d (profile it "
                        "again: cdphybrid --plan %s --profile)", path, t->n_units, plan->source, n, plan->source);
    if (t->micro_batch != plan->train.micro_batch)
        return cdp_fail(CDP_ERR_INVALID, "%s: measured for micro_batch %lld; %s has /train/micro_batch %lld "
                        "(profile it again: cdphybrid --plan %s --profile)", path, (long long)t->micro_batch,
                        plan->source, (long long)plan->train.micro_batch, plan->source);
    for (int i = 0; i < n; i++)
        if (t->units[i].type != u[i].desc.type)
            return cdp_fail(CDP_ERR_INVALID, "%s: /units/%d is a %s; unit %d of %s's model is a %s", path, i,
                            cdp_layer_name(t->units[i].type), i, plan->source, cdp_layer_name(u[i].desc.type));
    return CDP_OK;
}
