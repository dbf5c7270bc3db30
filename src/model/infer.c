/* Using a trained model (infer.h): the KV-cache decoder, the window of the
 * context and the choice of the next token.
 *
 * The decoder knows no layer type: each unit runs through its type's decode
 * hook (model/layer_def.h, in the type's file under model/layers/), which
 * keeps its own cache; this file holds the residual stream and the scratch
 * they share. Shapes: n the new positions of a step, C the width, V the
 * vocabulary. Weights are ours ([out, in], model/model.h), read in place on
 * the CPU device. */
#include "model/infer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "core/hash.h"
#include "model/layer_def.h"
#include "model/model.h"

/* One unit of the range: its description's decode hooks, its parameters
 * and its cache. */
struct infer_unit {
    const struct cdp_layer_def *def;
    const struct cdp_unit *u;
    float *const *p; /* the unit's parameters (model/model.h cdp_model_unit_params) */
    float *cache;    /* its keys and values (decode_size's floats), or NULL */
};

struct cdp_infer {
    int n;
    struct infer_unit *units;
    int64_t context, C, V, pos;
    int starts, ends; /* the range starts with a unit that reads tokens / ends with one that gives logits */
    struct cdp_decode d; /* the residual stream and the scratch, for up to `context` rows */
};

void cdp_infer_destroy(struct cdp_infer *s)
{
    if (!s) return;
    for (int i = 0; i < s->n; i++) free(s->units[i].cache);
    free(s->units);
    free(s->d.x);
    free(s->d.ln);
    free(s->d.qkv);
    free(s->d.att);
    free(s->d.fc);
    free(s->d.scores);
    free(s->d.mean);
    free(s->d.rstd);
    free(s);
}

static int64_t last_dim(const struct cdp_shape *sh) { return sh->d[sh->ndim - 1]; }

static float *floats(int64_t n) { return malloc((size_t)(n > 0 ? n : 1) * sizeof(float)); }

/* The types with a decode hook, for the message naming those the decoder runs. */
static void decodable_names(char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = 0;
    for (int t = 0; t < CDP_LAYER_TYPE_COUNT && n < cap; t++) {
        const struct cdp_layer_def *def = cdp_layer_def((enum cdp_layer_type)t);
        if (def->decode) n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", def->name);
    }
}

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
    int64_t wide = 0; /* the widest scratch row a unit asks for (an MLP's) */
    for (int i = 0; i < n && !st; i++) {
        struct infer_unit *iu = &s->units[i];
        const struct cdp_unit *u = cdp_model_unit(m, i);
        iu->u = u;
        iu->p = cdp_model_unit_params(m, i);
        iu->def = cdp_layer_def(u->desc.type);
        if (!iu->def->decode) {
            char names[256];
            decodable_names(names, sizeof names);
            st = cdp_fail(CDP_ERR_INVALID, "unit %d: a %s layer, which the KV-cache decoder does not run (it runs "
                          "the layer types with a decode hook: %s)", u->index, iu->def->name, names);
            break;
        }
        int64_t cache = 0, row = 0, logits = 0;
        if (iu->def->decode_size && (st = iu->def->decode_size(u, context, &cache, &row, &logits))) break;
        s->C = u->in_tokens ? last_dim(&u->out) : last_dim(&u->in);
        if (i == 0 && u->in_tokens) s->starts = 1;
        if (logits) {
            s->V = logits;
            if (i == n - 1) s->ends = 1;
        }
        if (row > wide) wide = row;
        if (cache > 0 && !(iu->cache = floats(cache)))
            st = cdp_fail(CDP_ERR_NOMEM, "out of memory for the KV cache of unit %d", u->index);
    }
    const int64_t T = context, C = s->C;
    struct cdp_decode *d = &s->d;
    d->C = C;
    d->context = context;
    if (!st && (!(d->x = floats(T * C)) || !(d->ln = floats(T * C)) || !(d->qkv = floats(T * 3 * C)) ||
                !(d->att = floats(T * C)) || !(d->fc = floats(T * wide)) || !(d->scores = floats(T)) ||
                !(d->mean = floats(T)) || !(d->rstd = floats(T))))
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

cdp_status cdp_infer_step(struct cdp_infer *s, const void *in, int64_t n, float *out)
{
    if (n < 1 || s->pos + n > s->context)
        return cdp_fail(CDP_ERR_INVALID, "%lld positions after %lld: the context holds %lld", (long long)n,
                        (long long)s->pos, (long long)s->context);
    struct cdp_decode *d = &s->d;
    d->pos = s->pos;
    d->n = n;
    d->tokens = s->starts ? in : NULL;
    d->logits = s->ends ? out : NULL;
    if (!s->starts) memcpy(d->x, in, (size_t)(n * s->C) * sizeof(float));
    /* each unit's own decode: the types' knowledge stays in their files (model/layers/) */
    for (int i = 0; i < s->n; i++) {
        const struct infer_unit *iu = &s->units[i];
        cdp_status st = iu->def->decode(iu->u, iu->p, d, iu->cache);
        if (st) return st;
    }
    if (!s->ends) memcpy(out, d->x, (size_t)(n * s->C) * sizeof(float));
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
