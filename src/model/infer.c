/* Using a trained model (infer.h): next-token logits, the choice of the next
 * token, and the validation loss as training computes it. */
#include "model/infer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "core/hash.h"

int64_t cdp_infer_window(const int32_t *tokens, int64_t n, int64_t context, int32_t *win)
{
    const int64_t used = n < context ? n : context, from = n - used;
    memset(win, 0, (size_t)context * sizeof *win);
    memcpy(win, tokens + from, (size_t)used * sizeof *win);
    return used;
}

cdp_status cdp_infer_next_logits(struct cdp_model *m, cdp_device_t dev, const int32_t *tokens, int64_t n,
                                 int64_t context, int64_t vocab, float *logits)
{
    if (n < 1 || context < 1) return cdp_fail(CDP_ERR_INVALID, "no token to continue from");
    int32_t *win = malloc((size_t)context * sizeof *win);
    if (!win) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    const int64_t used = cdp_infer_window(tokens, n, context, win);
    cdp_status st = cdp_device_write(dev, cdp_model_input(m, 0), win, (uint64_t)context * 4);
    free(win);
    if (!st) st = cdp_model_forward(m, 0);
    if (!st)
        st = cdp_device_read(dev, logits, cdp_model_output(m, 0) + (used - 1) * vocab,
                             (uint64_t)vocab * 4);
    return st;
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

cdp_status cdp_infer_pick(const float *logits, int64_t n, double temperature, int64_t top_k, uint64_t *state,
                          int32_t *out)
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
    const int64_t k = top_k > 0 && top_k < n ? top_k : n;
    struct cand *c = malloc((size_t)n * sizeof *c);
    if (!c) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < n; i++) c[i] = (struct cand){logits[i], (int32_t)i};
    if (k < n) qsort(c, (size_t)n, sizeof *c, by_logit); /* all n: in id order */
    const double top = logits[best];
    double total = 0;
    for (int64_t i = 0; i < k; i++) total += exp(((double)c[i].logit - top) / temperature);
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

cdp_status cdp_infer_val_loss(struct cdp_model *m, cdp_device_t dev, struct cdp_data *d, int B, int64_t batches,
                              double *loss, int64_t *rows)
{
    const struct cdp_sample_shape *sh = cdp_data_shape(d);
    const int64_t per = sh->tokens ? sh->input_numel : 1, avail = cdp_data_split_size(d, CDP_SPLIT_VAL);
    void *in = malloc((size_t)B * (size_t)sh->input_numel * 4), *tgt = malloc((size_t)B * (size_t)sh->target_numel * 4);
    cdp_status st = in && tgt ? CDP_OK : cdp_fail(CDP_ERR_NOMEM, "out of memory");
    double sum = 0;
    for (int64_t k = 0; k < batches && !st; k++) {
        const int64_t first = (k * B) % (avail > B ? avail - B + 1 : 1);
        if ((st = cdp_data_fetch(d, CDP_SPLIT_VAL, first, B, in, tgt))) break;
        if ((st = cdp_device_write(dev, cdp_model_input(m, 0), in, (uint64_t)B * (uint64_t)sh->input_numel * 4)))
            break;
        if ((st = cdp_model_forward(m, 0))) break;
        double s = 0;
        if ((st = cdp_model_loss(m, 0, tgt, 1.0f, &s))) break;
        sum += s;
    }
    free(in);
    free(tgt);
    if (st) return st;
    *rows = batches * B * per;
    *loss = sum / ((double)batches * B * (double)per);
    return CDP_OK;
}
