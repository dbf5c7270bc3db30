/* Data sources (data.h): synthetic data, a fixed random teacher network
 * (y = W2 tanh(W1 x + b1) + b2) or a seeded Markov chain of tokens. */
#include "model/data.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "core/hash.h"
#include "model/data_internal.h"

void data_teacher_forward(const struct cdp_data *d, const float *x, float *h, float *y)
{
    int64_t D = d->shape.input_numel, C = d->out;
    for (int j = 0; j < TEACHER_HIDDEN; j++) {
        const float *w = d->w1 + (int64_t)j * D;
        double a = d->b1[j];
        for (int64_t i = 0; i < D; i++) a += (double)w[i] * x[i];
        h[j] = (float)tanh(a);
    }
    for (int64_t c = 0; c < C; c++) {
        const float *w = d->w2 + c * TEACHER_HIDDEN;
        double a = d->b2[c];
        for (int j = 0; j < TEACHER_HIDDEN; j++) a += (double)w[j] * h[j];
        y[c] = (float)a;
    }
}

void data_normal_input(struct rng *r, float *x, int64_t D)
{
    for (int64_t i = 0; i < D; i++) x[i] = (float)data_rng_normal(r);
}

cdp_status data_open_synthetic(struct cdp_data *d)
{
    for (int s = 0; s < CDP_SPLIT_COUNT; s++) d->count[s] = INT64_MAX;
    if (d->shape.tokens) return CDP_OK; /* the Markov chain is a pure function of the seed */
    int64_t D = d->shape.input_numel, C = d->out = d->shape.target_is_float ? d->shape.target_numel
                                                                             : d->shape.classes;
    if (D > INT64_MAX / TEACHER_HIDDEN / (int64_t)sizeof(float) || C > INT64_MAX / TEACHER_HIDDEN / 8)
        return cdp_fail(CDP_ERR_NOMEM, "synthetic data: teacher for %lld inputs and %lld outputs is too large",
                        (long long)D, (long long)C);
    d->w1 = malloc((size_t)(D * TEACHER_HIDDEN) * sizeof(float));
    d->b1 = malloc(TEACHER_HIDDEN * sizeof(float));
    d->w2 = malloc((size_t)(C * TEACHER_HIDDEN) * sizeof(float));
    d->b2 = calloc((size_t)C, sizeof(float));
    float *x = malloc((size_t)D * sizeof(float)), *h = malloc(TEACHER_HIDDEN * sizeof(float));
    double *mean = calloc((size_t)C, sizeof(double));
    float *y = malloc((size_t)C * sizeof(float));
    if (!d->w1 || !d->b1 || !d->w2 || !d->b2 || !x || !h || !mean || !y) {
        free(x), free(h), free(mean), free(y);
        return cdp_fail(CDP_ERR_NOMEM, "synthetic data: out of memory for the teacher network");
    }
    struct rng r;
    data_rng_seed(&r, data_hash4(d->seed, DOM_TEACHER, 0, 0));
    double s1 = 1.0 / sqrt((double)D);
    for (int64_t i = 0; i < D * TEACHER_HIDDEN; i++) d->w1[i] = (float)(data_rng_normal(&r) * s1);
    for (int j = 0; j < TEACHER_HIDDEN; j++) d->b1[j] = (float)(data_rng_normal(&r) * 0.1);
    for (int64_t c = 0; c < C; c++) {
        float *w = d->w2 + c * TEACHER_HIDDEN;
        double nrm = 0;
        for (int j = 0; j < TEACHER_HIDDEN; j++) {
            w[j] = (float)data_rng_normal(&r);
            nrm += (double)w[j] * w[j];
        }
        nrm = sqrt(nrm);
        for (int j = 0; j < TEACHER_HIDDEN; j++) w[j] = (float)(w[j] / (nrm > 0 ? nrm : 1.0));
    }
    /* calibration: a few hundred inputs, fewer when one teacher pass is large */
    double work = (double)D * TEACHER_HIDDEN + (double)C * TEACHER_HIDDEN;
    int64_t n_cal = (int64_t)(33554432.0 / work);
    if (n_cal > 1024) n_cal = 1024;
    if (n_cal < 64) n_cal = 64;
    for (int64_t k = 0; k < n_cal; k++) {
        data_rng_seed(&r, data_hash4(d->seed, DOM_CALIB, 0, (uint64_t)k));
        data_normal_input(&r, x, D);
        data_teacher_forward(d, x, h, y);
        for (int64_t c = 0; c < C; c++) mean[c] += y[c];
    }
    for (int64_t c = 0; c < C; c++) d->b2[c] = (float)(-mean[c] / (double)n_cal);
    free(x), free(h), free(mean), free(y);
    return CDP_OK;
}

void data_synth_tokens(const struct cdp_data *d, struct rng *r, int32_t *in, int32_t *tgt)
{
    static const double cum[MARKOV_SUCCESSORS] = {0.5, 0.75, 0.9, 1.0};
    int64_t T = d->shape.input_numel;
    uint64_t V = (uint64_t)d->shape.vocab;
    uint64_t tok = data_rng_below(r, V);
    for (int64_t t = 0; t <= T; t++) {
        if (t < T) in[t] = (int32_t)tok;
        if (t > 0) tgt[t - 1] = (int32_t)tok;
        double u = data_rng_uniform(r);
        if (u < MARKOV_NOISE) {
            tok = data_rng_below(r, V);
        } else {
            u = (u - MARKOV_NOISE) / (1.0 - MARKOV_NOISE);
            int k = 0;
            while (k < MARKOV_SUCCESSORS - 1 && u >= cum[k]) k++;
            tok = data_hash4(d->seed, DOM_MARKOV, tok, (uint64_t)k) % V;
        }
    }
}

/* Samples of a file source: the reads of mapped data that the SIGBUS guard
 * covers (it allocates nothing, so a jump out of it leaks nothing). */
