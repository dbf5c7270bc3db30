/* The helpers the layer types share (common.h). */
#include "model/layers/common.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cdp/core.h"
#include "kernels/cpu/ops.h" /* cdp_cpu_attention_gemm_flops: the work table */

int64_t cdp_shape_numel(const struct cdp_shape *s)
{
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++) n *= s->d[i];
    return n;
}

int64_t cdp_shape_rows(const struct cdp_shape *s) { return s->ndim ? cdp_shape_numel(s) / s->d[s->ndim - 1] : 1; }

int64_t cdp_shape_last(const struct cdp_shape *s) { return s->ndim ? s->d[s->ndim - 1] : 1; }

void cdp_shape_format(const struct cdp_shape *s, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < s->ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)s->d[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

struct cdp_param_desc *cdp_unit_add_param(struct cdp_unit *u, const char *name, int ndim, int64_t d0, int64_t d1,
                                          int64_t d2, int64_t d3, enum cdp_init init, float scale,
                                          enum cdp_param_group group)
{
    CDP_ASSERT(u->n_params < CDP_UNIT_MAX_PARAMS);
    struct cdp_param_desc *p = &u->params[u->n_params++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    int64_t d[4] = {d0, d1, d2, d3};
    p->ndim = ndim;
    p->numel = 1;
    for (int i = 0; i < ndim; i++) {
        p->shape[i] = d[i];
        p->numel *= d[i];
    }
    p->init = init;
    p->init_scale = scale;
    p->group = group;
    p->tied_unit = -1;
    p->tied_param = -1;
    u->param_count += p->numel;
    return p;
}

/* PyTorch's default for Linear/Conv2d: U(-1/sqrt(fan_in), 1/sqrt(fan_in)). */
void cdp_unit_add_linear_params(struct cdp_unit *u, const char *prefix, int64_t out, int64_t in, int bias, int gpt,
                                float gpt_std)
{
    char name[24];
    float bound = 1.0f / sqrtf((float)in);
    snprintf(name, sizeof name, "%s%sweight", prefix, *prefix ? "." : "");
    cdp_unit_add_param(u, name, 2, out, in, 0, 0, gpt ? CDP_INIT_NORMAL : CDP_INIT_UNIFORM, gpt ? gpt_std : bound,
                       CDP_PARAM_WEIGHT);
    if (bias) {
        snprintf(name, sizeof name, "%s%sbias", prefix, *prefix ? "." : "");
        cdp_unit_add_param(u, name, 1, out, 0, 0, 0, gpt ? CDP_INIT_ZERO : CDP_INIT_UNIFORM, gpt ? 0.0f : bound,
                           CDP_PARAM_BIAS);
    }
}

void cdp_unit_add_norm_params(struct cdp_unit *u, const char *prefix, int64_t C)
{
    char name[24];
    snprintf(name, sizeof name, "%s%sweight", prefix, *prefix ? "." : "");
    cdp_unit_add_param(u, name, 1, C, 0, 0, 0, CDP_INIT_ONE, 0.0f, CDP_PARAM_NORM);
    snprintf(name, sizeof name, "%s%sbias", prefix, *prefix ? "." : "");
    cdp_unit_add_param(u, name, 1, C, 0, 0, 0, CDP_INIT_ZERO, 0.0f, CDP_PARAM_NORM);
}

double cdp_attention_flops(int64_t T, int64_t C, int causal, int backward)
{
    return cdp_cpu_attention_gemm_flops((int)T, (int)C, causal, backward);
}

int cdp_heads_shape(const char *type_name, const struct cdp_layer_desc *L, const struct cdp_shape *in,
                    struct cdp_shape *out, char *why, size_t cap)
{
    const int64_t last = cdp_shape_last(in);
    if (last % L->heads != 0) {
        char sh[96];
        cdp_shape_format(in, sh, sizeof sh);
        snprintf(why, cap, "%s width %lld (of %s) is not a multiple of heads %lld", type_name, (long long)last, sh,
                 (long long)L->heads);
        return -1;
    }
    *out = *in;
    return 0;
}

int cdp_window_shape(const char *type_name, const struct cdp_shape *in, int64_t K, int64_t S, int64_t P,
                     int64_t channels, struct cdp_shape *out, char *why, size_t cap)
{
    char sh[96];
    cdp_shape_format(in, sh, sizeof sh);
    if (in->ndim != 3) {
        snprintf(why, cap, "%s needs a [C, H, W] input, but gets %s", type_name, sh);
        return -1;
    }
    struct cdp_shape o = {3, {channels, 0, 0}};
    for (int k = 1; k < 3; k++) {
        const int64_t span = in->d[k] + 2 * P;
        if (span < K) {
            snprintf(why, cap, "kernel %lld is larger than the %s input %s (with padding %lld)", (long long)K,
                     type_name, sh, (long long)P);
            return -1;
        }
        o.d[k] = (span - K) / S + 1;
    }
    *out = o;
    return 0;
}

cdp_status cdp_layer_get_required_int(const struct cdp_json_in *in, const json_t *obj, const char *ptr,
                                      const char *key, int64_t min, const char *who, int64_t *out)
{
    if (!json_object_get(obj, key)) {
        char kp[CDP_JSON_PTR_CAP];
        cdp_json_ptr_key(kp, ptr, key);
        return cdp_json_fail(in, kp, "missing; %s needs \"%s\", a %s integer", who, key,
                             min >= 1 ? "positive" : "non-negative");
    }
    return cdp_json_get_int(in, obj, ptr, key, min, CDP_PLAN_MAX_COUNT, 0, out);
}

int64_t cdp_mul_add(int64_t a, int64_t b, int64_t c)
{
    int64_t x;
    if (a < 0 || b < 0 || c < 0 || __builtin_mul_overflow(a, b, &x) || __builtin_add_overflow(x, c, &x)) return -1;
    return x;
}
