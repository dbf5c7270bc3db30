/* The helpers the layer types share (common.h). */
#include "model/layers/common.h"

#include <cblas.h>
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
    p->shard_dim = -1;
    p->shard_parts = 1;
    u->param_count += p->numel;
    return p;
}

/* PyTorch's default for Linear/Conv2d: U(-1/sqrt(fan_in), 1/sqrt(fan_in)). */
void cdp_unit_add_linear_params(struct cdp_unit *u, const char *prefix, int64_t out, int64_t in, int bias, int gpt,
                                float gpt_std)
{
    char name[32];
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
    char name[32];
    snprintf(name, sizeof name, "%s%sweight", prefix, *prefix ? "." : "");
    cdp_unit_add_param(u, name, 1, C, 0, 0, 0, CDP_INIT_ONE, 0.0f, CDP_PARAM_NORM);
    snprintf(name, sizeof name, "%s%sbias", prefix, *prefix ? "." : "");
    cdp_unit_add_param(u, name, 1, C, 0, 0, 0, CDP_INIT_ZERO, 0.0f, CDP_PARAM_NORM);
}

void cdp_unit_add_rmsnorm_param(struct cdp_unit *u, const char *prefix, int64_t C)
{
    char name[32];
    snprintf(name, sizeof name, "%s%sweight", prefix, *prefix ? "." : "");
    cdp_unit_add_param(u, name, 1, C, 0, 0, 0, CDP_INIT_ONE, 0.0f, 0);
}

int64_t cdp_llama_hidden(int64_t dim, int64_t multiple_of, double ffn_dim_multiplier)
{
    int64_t h = cdp_mul_add(dim, 4, 0);
    if (h < 0 || multiple_of < 1) return -1;
    h = 2 * (h / 3) + (2 * (h % 3)) / 3; /* int(2 * h / 3) without overflow */
    if (ffn_dim_multiplier > 0) {
        const double x = ffn_dim_multiplier * (double)h;
        if (!(x < 9e18)) return -1;
        h = (int64_t)x;
    }
    if (h > INT64_MAX - multiple_of) return -1;
    return cdp_mul_add(multiple_of, (h + multiple_of - 1) / multiple_of, 0);
}

int cdp_rotary_shape(const char *type_name, const struct cdp_layer_desc *L, const struct cdp_shape *in,
                     struct cdp_shape *out, char *why, size_t cap)
{
    if (cdp_heads_shape(type_name, L, in, out, why, cap)) return -1;
    const int64_t C = cdp_shape_last(in);
    if (L->heads % L->kv_heads) {
        snprintf(why, cap, "%s heads %lld is not a multiple of kv_heads %lld", type_name, (long long)L->heads,
                 (long long)L->kv_heads);
        return -1;
    }
    if ((C / L->heads) % 2) {
        snprintf(why, cap, "%s head width %lld (width %lld / heads %lld) is odd; rotary embeddings pair its halves",
                 type_name, (long long)(C / L->heads), (long long)C, (long long)L->heads);
        return -1;
    }
    return 0;
}

static const char *const rope_scaling_keys[] = {"type", "factor", "low_freq_factor", "high_freq_factor",
                                                "original_context", NULL};
static const char *const rope_types[] = {"llama3", NULL};

cdp_status cdp_rope_parse(const struct cdp_json_in *in, const json_t *obj, const char *ptr, struct cdp_rope *r)
{
    cdp_status st;
    char sp[CDP_JSON_PTR_CAP], kp[CDP_JSON_PTR_CAP];
    int t = 0;
    r->theta = 10000.0;
    if ((st = cdp_json_get_number(in, obj, ptr, "rope_theta", CDP_JSON_POSITIVE, &r->theta))) return st;
    const json_t *s = json_object_get(obj, "rope_scaling");
    if (!s || json_is_null(s)) return CDP_OK;
    cdp_json_ptr_key(sp, ptr, "rope_scaling");
    if (!json_is_object(s))
        return cdp_json_expected(in, sp, "null or an object {\"type\": \"llama3\", \"factor\", ...}", s);
    if ((st = cdp_json_check_keys(in, s, sp, rope_scaling_keys, "rope_scaling"))) return st;
    cdp_json_ptr_key(kp, sp, "type");
    if (!json_object_get(s, "type")) return cdp_json_fail(in, kp, "missing; rope_scaling needs \"type\": \"llama3\"");
    if ((st = cdp_json_get_enum(in, s, sp, "type", rope_types, &t))) return st;
    static const char *const need[] = {"factor", "low_freq_factor", "high_freq_factor", "original_context"};
    for (int i = 0; i < 4; i++)
        if (!json_object_get(s, need[i])) {
            cdp_json_ptr_key(kp, sp, need[i]);
            return cdp_json_fail(in, kp, "missing; rope_scaling \"llama3\" needs factor, low_freq_factor, "
                                         "high_freq_factor and original_context");
        }
    if ((st = cdp_json_get_number(in, s, sp, "factor", CDP_JSON_POSITIVE, &r->factor))) return st;
    if ((st = cdp_json_get_number(in, s, sp, "low_freq_factor", CDP_JSON_POSITIVE, &r->low_freq_factor))) return st;
    if ((st = cdp_json_get_number(in, s, sp, "high_freq_factor", CDP_JSON_POSITIVE, &r->high_freq_factor)))
        return st;
    if ((st = cdp_json_get_int(in, s, sp, "original_context", 1, CDP_PLAN_MAX_CONTEXT, 0, &r->original_context)))
        return st;
    if (!(r->high_freq_factor > r->low_freq_factor)) {
        cdp_json_ptr_key(kp, sp, "high_freq_factor");
        return cdp_json_fail(in, kp, "%g must be larger than low_freq_factor %g", r->high_freq_factor,
                             r->low_freq_factor);
    }
    return CDP_OK;
}

int cdp_rope_emit(const struct cdp_rope *r, json_t *o)
{
    int bad = json_object_set_new(o, "rope_theta", json_real(r->theta));
    if (r->factor <= 0) return bad | json_object_set_new(o, "rope_scaling", json_null());
    json_t *s = json_object();
    if (!s) return 1;
    bad |= json_object_set_new(s, "type", json_string("llama3"));
    bad |= json_object_set_new(s, "factor", json_real(r->factor));
    bad |= json_object_set_new(s, "low_freq_factor", json_real(r->low_freq_factor));
    bad |= json_object_set_new(s, "high_freq_factor", json_real(r->high_freq_factor));
    bad |= json_object_set_new(s, "original_context", CDP_JINT(r->original_context));
    return bad | json_object_set_new(o, "rope_scaling", s);
}

struct cdp_rotary_dims cdp_rotary_dims(const struct cdp_unit *u, int B)
{
    const int t = cdp_unit_tensor_split(u) ? u->tp_size : 1;
    struct cdp_rotary_dims d;
    d.T = (int)u->in.d[0] * (u->seq_parallel ? t : 1);
    d.C = (int)u->in.d[1];
    d.HD = d.C / (int)u->desc.heads;
    d.NH = (int)u->desc.heads / t;
    d.NKV = (int)u->desc.kv_heads / t;
    d.A = d.HD * d.NH;
    d.KVD = d.HD * d.NKV;
    d.N = B * d.T;
    return d;
}

void cdp_rope_describe(const struct cdp_rope *r, char *buf, size_t cap)
{
    if (r->factor > 0)
        snprintf(buf, cap, " rope_theta %g (llama3 scaling x%g from %lld)", r->theta, r->factor,
                 (long long)r->original_context);
    else
        snprintf(buf, cap, " rope_theta %g", r->theta);
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

cdp_status cdp_unit_tensor_add_sum(const struct cdp_kernels *k, const struct cdp_unit *u, float *part, float *din,
                                   int64_t n)
{
    if (!din) return CDP_OK;
    cdp_status st = cdp_unit_tensor_sum(u, part, n);
    if (st) return st;
    K(add, din, part, (size_t)n);
    return CDP_OK;
}

/* ---- decoding with a KV cache (the decode hooks) ---- */

void cdp_decode_linear(float *out, const float *in, const float *w, const float *b, int64_t n, int64_t IC, int64_t OC,
                       int accumulate)
{
    if (b) {
        for (int64_t r = 0; r < n; r++) {
            float *o = out + r * OC;
            if (accumulate)
                for (int64_t j = 0; j < OC; j++) o[j] += b[j];
            else memcpy(o, b, (size_t)OC * sizeof *o);
        }
    }
    const float beta = b || accumulate ? 1.0f : 0.0f;
    if (n == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)OC, (int)IC, 1.0f, w, (int)IC, in, 1, beta, out, 1);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)OC, (int)IC, 1.0f, in, (int)IC, w,
                    (int)IC, beta, out, (int)OC);
}

void cdp_decode_attend(const struct cdp_decode *d, const float *kc, const float *vc, int64_t heads, int64_t kv_heads,
                       const float *q_rows, int64_t q_stride, float *out)
{
    const int64_t C = d->C, NH = heads, HS = C / NH, KVD = HS * kv_heads, rep = NH / kv_heads;
    const float scale = 1.0f / sqrtf((float)HS);
    for (int64_t r = 0; r < d->n; r++) {
        const int64_t L = d->pos + r + 1;
        for (int64_t h = 0; h < NH; h++) {
            const float *q = q_rows + r * q_stride + h * HS;
            const int64_t g = h / rep; /* its key/value head */
            float *sc = d->scores, best = -INFINITY;
            for (int64_t t = 0; t < L; t++) {
                const float *k = kc + t * KVD + g * HS;
                float dot = 0;
                for (int64_t j = 0; j < HS; j++) dot += q[j] * k[j];
                sc[t] = dot * scale;
                if (sc[t] > best) best = sc[t];
            }
            float sum = 0;
            for (int64_t t = 0; t < L; t++) sum += sc[t] = expf(sc[t] - best);
            const float inv = 1.0f / sum;
            float *o = out + r * C + h * HS;
            memset(o, 0, (size_t)HS * sizeof *o);
            for (int64_t t = 0; t < L; t++) {
                const float *v = vc + t * KVD + g * HS, a = sc[t] * inv;
                for (int64_t j = 0; j < HS; j++) o[j] += a * v[j];
            }
        }
    }
}
