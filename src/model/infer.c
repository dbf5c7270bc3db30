/* Using a trained model (infer.h): the window of the context and the choice
 * of the next token. */
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
