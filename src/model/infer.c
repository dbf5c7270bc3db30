/* Using a trained model (infer.h): the KV-cache decoder, the window of the
 * context and the choice of the next token.
 *
 * Shapes: n the new positions of a step, L the positions in the cache after
 * it, C the width, NH heads of HS = C / NH, V the vocabulary. Weights are
 * ours ([out, in], model/model.h), read in place on the CPU device. A step
 * of one position is matrix-vector products (sgemv), a step of several (the
 * prompt) matrix products (sgemm), as the training kernels do them. */
#include "model/infer.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "core/hash.h"
#include "kernels/cpu/ops.h"
#include "kernels/rope.h"
#include "model/model.h"

enum unit_kind { U_EMBED, U_GPT_BLOCK, U_LLAMA_BLOCK, U_HEAD };

struct infer_unit {
    enum unit_kind kind;
    const struct cdp_unit *u;
    float *const *p;           /* the unit's parameters (model/model.h cdp_model_unit_params) */
    int64_t heads, kv_heads;   /* blocks */
    int64_t hidden;            /* llama blocks: the MLP's width */
    float *k, *v;              /* blocks: the cache, [context, kv_heads x head size] each (keys rotated) */
    float *inv_freq;           /* llama blocks: the rotary frequencies of a head (kernels/rope.h) */
};

struct cdp_infer {
    int n;
    struct infer_unit *units;
    int64_t context, C, V, pos;
    int starts, ends; /* the range starts with the embedding / ends with the head */
    /* scratch for up to `context` rows */
    float *x, *ln, *qkv, *att, *fc, *scores, *mean, *rstd;
};

void cdp_infer_destroy(struct cdp_infer *s)
{
    if (!s) return;
    for (int i = 0; i < s->n; i++) {
        free(s->units[i].k);
        free(s->units[i].v);
        free(s->units[i].inv_freq);
    }
    free(s->units);
    free(s->x);
    free(s->ln);
    free(s->qkv);
    free(s->att);
    free(s->fc);
    free(s->scores);
    free(s->mean);
    free(s->rstd);
    free(s);
}

static int64_t last_dim(const struct cdp_shape *sh) { return sh->d[sh->ndim - 1]; }

static float *floats(int64_t n) { return malloc((size_t)(n > 0 ? n : 1) * sizeof(float)); }

cdp_status cdp_infer_create(struct cdp_model *m, int64_t context, struct cdp_infer **out)
{
    struct cdp_infer *s = calloc(1, sizeof *s);
    const int n = cdp_model_unit_count(m);
    if (!s || !(s->units = calloc((size_t)n + 1, sizeof *s->units))) {
        free(s);
        return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    }
    s->n = n;
    s->context = context;
    cdp_status st = CDP_OK;
    int64_t wide = 0; /* the widest MLP: 4C (GPT-2), 2 hidden (llama: gate and up) */
    for (int i = 0; i < n && !st; i++) {
        struct infer_unit *iu = &s->units[i];
        const struct cdp_unit *u = cdp_model_unit(m, i);
        iu->u = u;
        iu->p = cdp_model_unit_params(m, i);
        switch (u->desc.type) {
        case CDP_LAYER_EMBEDDING:
            iu->kind = U_EMBED;
            s->C = last_dim(&u->out);
            if (u->n_params > 1 && u->params[1].shape[0] < context)
                st = cdp_fail(CDP_ERR_INVALID, "unit %d: %lld learned positions, fewer than the context %lld",
                              u->index, (long long)u->params[1].shape[0], (long long)context);
            if (i == 0) s->starts = 1;
            break;
        case CDP_LAYER_TRANSFORMER_BLOCK:
            iu->kind = U_GPT_BLOCK;
            s->C = last_dim(&u->in);
            iu->heads = u->desc.heads;
            iu->kv_heads = iu->heads;
            if (4 * s->C > wide) wide = 4 * s->C;
            if (!(iu->k = floats(context * s->C)) || !(iu->v = floats(context * s->C)))
                st = cdp_fail(CDP_ERR_NOMEM, "out of memory for the KV cache of unit %d", u->index);
            break;
        case CDP_LAYER_LLAMA_BLOCK: {
            iu->kind = U_LLAMA_BLOCK;
            s->C = last_dim(&u->in);
            iu->heads = u->desc.heads;
            iu->kv_heads = u->desc.kv_heads;
            iu->hidden = u->desc.hidden;
            if (2 * iu->hidden > wide) wide = 2 * iu->hidden;
            const int64_t HD = s->C / iu->heads, KVD = HD * iu->kv_heads;
            if (!(iu->k = floats(context * KVD)) || !(iu->v = floats(context * KVD)) ||
                !(iu->inv_freq = floats(HD / 2))) {
                st = cdp_fail(CDP_ERR_NOMEM, "out of memory for the KV cache of unit %d", u->index);
                break;
            }
            for (int64_t i = 0; i < HD / 2; i++) iu->inv_freq[i] = cdp_rope_inv_freq(&u->desc.rope, (int)i, (int)HD);
            break;
        }
        case CDP_LAYER_LM_HEAD:
            iu->kind = U_HEAD;
            s->C = last_dim(&u->in);
            s->V = u->params[u->n_params - 1].shape[0];
            if (i == n - 1) s->ends = 1;
            break;
        case CDP_LAYER_LINEAR:
        case CDP_LAYER_RELU:
        case CDP_LAYER_GELU:
        case CDP_LAYER_LAYERNORM:
        case CDP_LAYER_ATTENTION:
        case CDP_LAYER_CONV2D:
        case CDP_LAYER_MAXPOOL2D:
        case CDP_LAYER_FLATTEN:
        case CDP_LAYER_SILU:
        case CDP_LAYER_RMSNORM:
        case CDP_LAYER_ROTARY_ATTENTION:
        case CDP_LAYER_SWIGLU_MLP:
        case CDP_LAYER_TYPE_COUNT:
            st = cdp_fail(CDP_ERR_INVALID, "unit %d: a %s layer, which the KV-cache decoder does not run (it "
                          "runs the GPT-2 and Llama families: embedding, transformer_block, llama_block, lm_head)", u->index,
                          cdp_layer_name(u->desc.type));
            break;
        }
    }
    const int64_t T = context, C = s->C;
    if (!st && (!(s->x = floats(T * C)) || !(s->ln = floats(T * C)) || !(s->qkv = floats(T * 3 * C)) ||
                !(s->att = floats(T * C)) || !(s->fc = floats(T * wide)) || !(s->scores = floats(T)) ||
                !(s->mean = floats(T)) || !(s->rstd = floats(T))))
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory");
    if (st) {
        cdp_infer_destroy(s);
        return st;
    }
    *out = s;
    return CDP_OK;
}

int64_t cdp_infer_position(const struct cdp_infer *s) { return s->pos; }
void cdp_infer_reset(struct cdp_infer *s) { s->pos = 0; }
int64_t cdp_infer_in_floats(const struct cdp_infer *s, int64_t n) { return s->starts ? n : n * s->C; }
int64_t cdp_infer_out_floats(const struct cdp_infer *s, int64_t n) { return s->ends ? s->V : n * s->C; }

/* out[n, OC] (+)= in[n, IC] w[OC, IC]^T + b: accumulate adds to what out
 * holds (the residual stream). */
static void linear(float *out, const float *in, const float *w, const float *b, int64_t n, int64_t IC, int64_t OC,
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

/* Causal attention of n new rows (positions pos ..) over the cache [0, pos + n):
 * q from qkv[n, 3C], keys and values already in the cache; out[n, C]. */
static void attend(struct cdp_infer *s, const struct infer_unit *iu, const float *q_rows, int64_t q_stride,
                   float *out, int64_t n)
{
    const int64_t C = s->C, NH = iu->heads, HS = C / NH, KVD = HS * iu->kv_heads, rep = NH / iu->kv_heads;
    const float scale = 1.0f / sqrtf((float)HS);
    for (int64_t r = 0; r < n; r++) {
        const int64_t L = s->pos + r + 1;
        for (int64_t h = 0; h < NH; h++) {
            const float *q = q_rows + r * q_stride + h * HS;
            const int64_t g = h / rep; /* its key/value head */
            float *sc = s->scores, best = -INFINITY;
            for (int64_t t = 0; t < L; t++) {
                const float *k = iu->k + t * KVD + g * HS;
                float d = 0;
                for (int64_t j = 0; j < HS; j++) d += q[j] * k[j];
                sc[t] = d * scale;
                if (sc[t] > best) best = sc[t];
            }
            float sum = 0;
            for (int64_t t = 0; t < L; t++) sum += sc[t] = expf(sc[t] - best);
            const float inv = 1.0f / sum;
            float *o = out + r * C + h * HS;
            memset(o, 0, (size_t)HS * sizeof *o);
            for (int64_t t = 0; t < L; t++) {
                const float *v = iu->v + t * KVD + g * HS, a = sc[t] * inv;
                for (int64_t j = 0; j < HS; j++) o[j] += a * v[j];
            }
        }
    }
}

/* A GPT-2 block on x[n, C] in place (model/layers/transformer_block.c's
 * parameters: ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj). */
static void gpt_block(struct cdp_infer *s, struct infer_unit *iu, int64_t n)
{
    float *const *p = iu->p;
    const int64_t C = s->C;
    cdp_cpu_layernorm_fwd(s->ln, s->mean, s->rstd, s->x, p[0], p[1], (int)n, (int)C, 1e-5f);
    linear(s->qkv, s->ln, p[2], p[3], n, C, 3 * C, 0);
    for (int64_t r = 0; r < n; r++) {
        memcpy(iu->k + (s->pos + r) * C, s->qkv + r * 3 * C + C, (size_t)C * sizeof(float));
        memcpy(iu->v + (s->pos + r) * C, s->qkv + r * 3 * C + 2 * C, (size_t)C * sizeof(float));
    }
    attend(s, iu, s->qkv, 3 * C, s->att, n);
    linear(s->x, s->att, p[4], p[5], n, C, C, 1);
    cdp_cpu_layernorm_fwd(s->ln, s->mean, s->rstd, s->x, p[6], p[7], (int)n, (int)C, 1e-5f);
    linear(s->fc, s->ln, p[8], p[9], n, C, 4 * C, 0);
    cdp_cpu_gelu_fwd(s->fc, s->fc, (size_t)(n * 4 * C));
    linear(s->x, s->fc, p[10], p[11], n, 4 * C, C, 1);
}

/* A Llama block on x[n, C] in place (model/layers/llama_block.c's
 * parameters: input_layernorm, q, k, v, o projections, post_attention_layernorm,
 * gate, up, down): keys rotated at their positions before they are cached. */
static void llama_block(struct cdp_infer *s, struct infer_unit *iu, int64_t n)
{
    float *const *p = iu->p;
    const int64_t C = s->C, HD = C / iu->heads, KVD = HD * iu->kv_heads, H = iu->hidden, half = HD / 2;
    const float eps = (float)iu->u->desc.eps;
    float *q = s->qkv, *k = q + n * C, *v = k + n * KVD;
    cdp_cpu_rmsnorm_fwd(s->ln, s->rstd, s->x, p[0], (int)n, (int)C, eps);
    linear(q, s->ln, p[1], NULL, n, C, C, 0);
    linear(k, s->ln, p[2], NULL, n, C, KVD, 0);
    linear(v, s->ln, p[3], NULL, n, C, KVD, 0);
    for (int64_t r = 0; r < n; r++) {
        float *qr = q + r * C, *kr = k + r * KVD;
        for (int64_t i = 0; i < half; i++) {
            const float a = (float)(s->pos + r) * iu->inv_freq[i], c = cosf(a), sn = sinf(a);
            for (int64_t h = 0; h < iu->heads; h++) {
                const float x1 = qr[h * HD + i], x2 = qr[h * HD + i + half];
                qr[h * HD + i] = x1 * c - x2 * sn;
                qr[h * HD + i + half] = x2 * c + x1 * sn;
            }
            for (int64_t j = 0; j < iu->kv_heads; j++) {
                const float x1 = kr[j * HD + i], x2 = kr[j * HD + i + half];
                kr[j * HD + i] = x1 * c - x2 * sn;
                kr[j * HD + i + half] = x2 * c + x1 * sn;
            }
        }
        memcpy(iu->k + (s->pos + r) * KVD, kr, (size_t)KVD * sizeof(float));
        memcpy(iu->v + (s->pos + r) * KVD, v + r * KVD, (size_t)KVD * sizeof(float));
    }
    attend(s, iu, q, C, s->att, n);
    linear(s->x, s->att, p[4], NULL, n, C, C, 1);
    cdp_cpu_rmsnorm_fwd(s->ln, s->rstd, s->x, p[5], (int)n, (int)C, eps);
    float *gate = s->fc, *up = gate + n * H;
    linear(gate, s->ln, p[6], NULL, n, C, H, 0);
    linear(up, s->ln, p[7], NULL, n, C, H, 0);
    cdp_cpu_swiglu_fwd(gate, gate, up, (size_t)(n * H));
    linear(s->x, gate, p[8], NULL, n, H, C, 1);
}

cdp_status cdp_infer_step(struct cdp_infer *s, const void *in, int64_t n, float *out)
{
    if (n < 1 || s->pos + n > s->context)
        return cdp_fail(CDP_ERR_INVALID, "%lld positions after %lld: the context holds %lld", (long long)n,
                        (long long)s->pos, (long long)s->context);
    const int64_t C = s->C;
    if (!s->starts) memcpy(s->x, in, (size_t)(n * C) * sizeof(float));
    for (int i = 0; i < s->n; i++) {
        struct infer_unit *iu = &s->units[i];
        float *const *p = iu->p;
        switch (iu->kind) {
        case U_EMBED: {
            const int32_t *tok = in;
            const int64_t V = iu->u->params[0].shape[0];
            for (int64_t r = 0; r < n; r++) {
                if (tok[r] < 0 || tok[r] >= V)
                    return cdp_fail(CDP_ERR_INVALID, "token %d is outside the vocabulary of %lld", tok[r],
                                    (long long)V);
                const float *e = p[0] + tok[r] * C, *pe = iu->u->n_params > 1 ? p[1] + (s->pos + r) * C : NULL;
                for (int64_t j = 0; j < C; j++) s->x[r * C + j] = e[j] + (pe ? pe[j] : 0.0f);
            }
            break;
        }
        case U_GPT_BLOCK:
            gpt_block(s, iu, n);
            break;
        case U_LLAMA_BLOCK:
            llama_block(s, iu, n);
            break;
        case U_HEAD: {
            const float *last = s->x + (n - 1) * C;
            if (iu->u->desc.rms)
                cdp_cpu_rmsnorm_fwd(s->ln, s->rstd, last, p[0], 1, (int)C, (float)iu->u->desc.eps);
            else cdp_cpu_layernorm_fwd(s->ln, s->mean, s->rstd, last, p[0], p[1], 1, (int)C, 1e-5f);
            cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)s->V, (int)C, 1.0f, p[iu->u->n_params - 1], (int)C, s->ln,
                        1, 0.0f, out, 1);
            break;
        }
        }
    }
    if (!s->ends) memcpy(out, s->x, (size_t)(n * C) * sizeof(float));
    s->pos += n;
    return CDP_OK;
}

int64_t cdp_infer_window(const int32_t *tokens, int64_t n, int64_t context, int32_t *win)
{
    const int64_t used = n < context ? n : context, from = n - used;
    memset(win, 0, (size_t)context * sizeof *win);
    memcpy(win, tokens + from, (size_t)used * sizeof *win);
    return used;
}

struct cand {
    float logit;
    int32_t id;
};

static int by_logit(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

cdp_status cdp_infer_pick(const float *logits, int64_t n, double temperature, int64_t top_k, double top_p,
                          uint64_t *state, int32_t *out)
{
    if (n < 1) return cdp_fail(CDP_ERR_INVALID, "no token to choose from");
    int64_t best = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(logits[i])) return cdp_fail(CDP_ERR_INVALID, "the logit of token %lld is NaN", (long long)i);
        if (logits[i] > logits[best]) best = i;
    }
    if (temperature == 0) {
        *out = (int32_t)best;
        return CDP_OK;
    }
    int64_t k = top_k > 0 && top_k < n ? top_k : n;
    const int nucleus = top_p < 1.0;
    struct cand *c = malloc((size_t)n * sizeof *c);
    if (!c) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < n; i++) c[i] = (struct cand){logits[i], (int32_t)i};
    if (k < n || nucleus) qsort(c, (size_t)n, sizeof *c, by_logit); /* all n: in id order */
    const double top = logits[best];
    double total = 0;
    for (int64_t i = 0; i < k; i++) total += exp(((double)c[i].logit - top) / temperature);
    if (nucleus) {
        /* the fewest most likely whose share of the top k reaches top_p */
        double kept = 0;
        int64_t i = 0;
        while (i < k) {
            kept += exp(((double)c[i].logit - top) / temperature);
            i++;
            if (kept >= top_p * total) break;
        }
        k = i;
        total = kept;
    }
    const double u = (double)(cdp_splitmix64(state) >> 11) * 0x1p-53 * total;
    double acc = 0;
    int32_t pick = c[k - 1].id;
    for (int64_t i = 0; i < k; i++) {
        acc += exp(((double)c[i].logit - top) / temperature);
        if (u < acc) {
            pick = c[i].id;
            break;
        }
    }
    free(c);
    *out = pick;
    return CDP_OK;
}
