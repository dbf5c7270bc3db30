/* Suite model: the vocab-parallel embedding, head and cross-entropy, and a
 * list's attention split by heads (docs/parallelism.md). A tensor group of t ranks runs in this process, one
 * thread a rank, each with its own device and model, their collective a real
 * all-reduce between the threads (a barrier, then each rank sums every
 * rank's buffer in rank order). Each range runs two micro-batches forward,
 * the loss where it ends the model, and backward (combined or split) into
 * one input gradient that arrives non-zero and takes both micro-batches'
 * (din +=, model.h), and every rank's outputs, loss, input gradient, parameters and gradients are
 * checked against one rank's (t = 1) within 1e-6 relative, with vocabularies
 * that t does not divide (padding rows: zero, in no loss and no gradient). */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/device.h"
#include "cdp/plan.h"
#include "model/layers.h"
#include "model/model.h"

#define MAX_T 4
#define SLOTS 2
#define B 2

/* ---- an in-process tensor group ------------------------------------------------- */

struct group {
    int t;
    pthread_barrier_t bar;
    float *bufs[MAX_T];
    int64_t calls[MAX_T]; /* all-reduces each rank made */
};

struct member {
    struct group *g;
    int k;
};

static cdp_status group_all_reduce(void *ctx, float *buf, int64_t n)
{
    struct member *me = ctx;
    struct group *g = me->g;
    float *sum = malloc((size_t)n * sizeof *sum + 1);
    if (!sum) return cdp_fail(CDP_ERR_NOMEM, "test all-reduce of %lld floats", (long long)n);
    g->bufs[me->k] = buf;
    pthread_barrier_wait(&g->bar);
    for (int64_t i = 0; i < n; i++) { /* rank order on every rank: the same bits everywhere */
        float s = 0.0f;
        for (int j = 0; j < g->t; j++) s += g->bufs[j][i];
        sum[i] = s;
    }
    pthread_barrier_wait(&g->bar); /* every rank has read every buffer */
    memcpy(buf, sum, (size_t)n * sizeof *buf);
    free(sum);
    g->calls[me->k]++;
    return CDP_OK;
}

/* ---- one rank's run of a range ----------------------------------------------------- */

struct tensor_out {
    struct cdp_param_desc pd; /* its slice, shard_dim -1 when whole */
    float *data, *grad;
};

struct run {
    /* in */
    const struct cdp_model_desc *md;
    int first, end, split;
    enum cdp_recompute r;
    const struct cdp_tensor_group *tg; /* NULL: one rank */
    /* out */
    char err[512];
    int64_t out_floats, in_floats;
    float *out;  /* [SLOTS, B x out_floats] */
    float *din;  /* [B x in_floats], float inputs only */
    double loss[SLOTS];
    int n_tensors;
    struct tensor_out tensors[64];
    uint64_t held, planned; /* device bytes in use after creation, and cdp_model_memory's total */
    double fwd_flops;       /* the range's, per sample */
};

static uint64_t next(uint64_t *s) { return (*s = *s * 6364136223846793005ull + 1442695040888963407ull) >> 33; }

#define TRY(x, what)                                                                         \
    do {                                                                                     \
        if ((st = (x))) {                                                                    \
            snprintf(o->err, sizeof o->err, "%s: %s", what, cdp_last_error());               \
            goto done;                                                                       \
        }                                                                                    \
    } while (0)

static void *run_range(void *arg)
{
    struct run *o = arg;
    cdp_device_t dev = NULL;
    struct cdp_model *m = NULL;
    float *dout = NULL;
    cdp_status st;
    TRY(cdp_device_open(CDP_BACKEND_CPU, 0, 0, &dev), "device");
    TRY(cdp_model_create_tensor(o->md, o->first, o->end, B, SLOTS, 7, o->r, 1, 0, o->tg, dev, &m), "model");
    if (o->split) TRY(cdp_model_set_split_backward(m, SLOTS), "split backward");
    struct cdp_model_bytes mb;
    cdp_model_memory(m, &mb);
    o->planned = mb.total;
    o->held = cdp_device_mem_in_use(dev);
    const int n = o->end - o->first;
    const struct cdp_unit *u0 = cdp_model_unit(m, 0), *ul = cdp_model_unit(m, n - 1);
    for (int i = 0; i < n; i++) o->fwd_flops += cdp_model_unit(m, i)->fwd_flops;
    const int ends = o->end == cdp_model_desc_units(o->md);
    o->in_floats = 1;
    for (int d = 0; d < u0->in.ndim; d++) o->in_floats *= u0->in.d[d];
    o->out_floats = ul->out_floats;
    o->out = calloc((size_t)(SLOTS * B * o->out_floats), 4);
    o->din = calloc((size_t)(B * o->in_floats), 4);
    /* the input gradient arrives holding something (backward adds into it, model.h): the same on every run */
    for (int64_t i = 0; i < B * o->in_floats; i++) o->din[i] = 0.25f * (float)((i * 7 % 13) - 6);
    uint64_t seed = 99;
    for (int slot = 0; slot < SLOTS; slot++) {
        if (u0->in_tokens) {
            int32_t *tok = cdp_model_input(m, slot);
            for (int64_t i = 0; i < B * o->in_floats; i++) tok[i] = (int32_t)(next(&seed) % (uint64_t)o->md->vocab);
        } else {
            float *x = cdp_model_input(m, slot);
            for (int64_t i = 0; i < B * o->in_floats; i++) x[i] = (float)(next(&seed) % 2001) / 1000.0f - 1.0f;
        }
        TRY(cdp_model_forward(m, slot), "forward");
        memcpy(o->out + slot * B * o->out_floats, cdp_model_output(m, slot), (size_t)(B * o->out_floats) * 4);
        if (ends) { /* every vocabulary id as a target, the last ones (the last slice's) among them */
            const int64_t rows = B * ul->T;
            int32_t tg[B * 64];
            for (int64_t i = 0; i < rows; i++)
                tg[i] = (int32_t)(i % 3 == 0 ? o->md->vocab - 1 - (i / 3) % 3 : (int64_t)next(&seed) % o->md->vocab);
            TRY(cdp_model_loss(m, slot, tg, 1.0f / (float)(SLOTS * rows), &o->loss[slot]), "loss");
        }
    }
    if (!ends) {
        dout = malloc((size_t)(B * o->out_floats) * 4);
        for (int64_t i = 0; i < B * o->out_floats; i++) dout[i] = 0.01f * (float)((i * 5 % 11) - 5);
    }
    float *din = u0->in_tokens ? NULL : o->din;
    for (int slot = SLOTS - 1; slot >= 0; slot--) {
        if (!o->split) {
            TRY(cdp_model_backward(m, slot, dout, din), "backward");
        } else {
            TRY(cdp_model_backward_input(m, slot, slot, dout, din), "backward (B)");
            TRY(cdp_model_backward_weight(m, slot, slot), "backward (W)");
        }
    }
    o->n_tensors = cdp_model_tensor_count(m);
    if (o->n_tensors > 64) {
        snprintf(o->err, sizeof o->err, "%d tensors, more than this test keeps", o->n_tensors);
        goto done;
    }
    for (int i = 0; i < o->n_tensors; i++) {
        const struct cdp_model_tensor *t = cdp_model_tensor(m, i);
        struct tensor_out *to = &o->tensors[i];
        to->pd = cdp_model_unit(m, t->unit_local)->params[t->param_local];
        to->data = malloc((size_t)t->numel * 4);
        to->grad = malloc((size_t)t->numel * 4);
        memcpy(to->data, t->data, (size_t)t->numel * 4);
        memcpy(to->grad, t->grad, (size_t)t->numel * 4);
    }
done:
    free(dout);
    cdp_model_destroy(m);
    cdp_device_close(dev);
    return NULL;
}

static void run_free(struct run *o)
{
    free(o->out);
    free(o->din);
    for (int i = 0; i < o->n_tensors; i++) {
        free(o->tensors[i].data);
        free(o->tensors[i].grad);
    }
}

/* ---- comparing with one rank ---------------------------------------------------- */

/* max |a - b| over max |b| of n floats at strides sa, sb (rows of len) */
static double rel_rows(const float *a, const float *b, int64_t rows, int64_t len, int64_t sa, int64_t sb)
{
    double num = 0, den = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < len; j++) {
            const double x = a[r * sa + j], y = b[r * sb + j];
            if (fabs(x - y) > num || isnan(x)) num = isnan(x) ? INFINITY : fabs(x - y);
            if (fabs(y) > den) den = fabs(y);
        }
    return den > 0 ? num / den : num;
}

#define TOL 1e-6

static struct cdp_plan *plan_from(const char *json)
{
    struct cdp_plan *p = NULL;
    cr_assert_eq(cdp_plan_load_string(json, "test.json", NULL, &p), CDP_OK, "%s", cdp_last_error());
    struct cdp_machine_info mi = {0, NULL};
    cr_assert_eq(cdp_plan_resolve(p, &mi), CDP_OK, "%s", cdp_last_error());
    return p;
}

/* Runs [first, end) of the plan's model on one rank and on a group of t,
 * and checks every rank against the one. */
static void check_range(const char *json, int first, int end, int t, enum cdp_recompute r, int split)
{
    struct cdp_plan *p = plan_from(json);
    const struct cdp_model_desc *md = &p->model;
    if (end < 0) end = cdp_model_desc_units(md);
    const int ends = end == cdp_model_desc_units(md);
    char what[160];
    snprintf(what, sizeof what, "units [%d, %d) of vocab %lld at t = %d, recompute %d, split backward %d", first, end,
             (long long)md->vocab, t, (int)r, split);

    struct run one = {.md = md, .first = first, .end = end, .split = split, .r = r};
    run_range(&one);
    cr_assert_str_empty(one.err, "%s, one rank: %s", what, one.err);

    struct group g = {.t = t};
    pthread_barrier_init(&g.bar, NULL, (unsigned)t);
    struct member mem[MAX_T];
    struct cdp_tensor_group tg[MAX_T];
    struct run rk[MAX_T];
    pthread_t th[MAX_T];
    for (int k = 0; k < t; k++) {
        mem[k] = (struct member){&g, k};
        tg[k] = (struct cdp_tensor_group){.size = t, .index = k, .all_reduce = group_all_reduce,
                                            .all_reduce_f32 = group_all_reduce, .ctx = &mem[k]};
        rk[k] = (struct run){.md = md, .first = first, .end = end, .split = split, .r = r, .tg = &tg[k]};
        cr_assert_eq(pthread_create(&th[k], NULL, run_range, &rk[k]), 0);
    }
    for (int k = 0; k < t; k++) pthread_join(th[k], NULL);
    pthread_barrier_destroy(&g.bar);

    const int64_t V = md->vocab, Vl = (V + t - 1) / t;
    for (int k = 0; k < t; k++) {
        struct run *o = &rk[k];
        cr_assert_str_empty(o->err, "%s, rank %d: %s", what, k, o->err);
        /* the memory the model says it holds is what its device holds */
        cr_assert_eq(o->held, o->planned, "%s, rank %d: %llu bytes held, %llu planned", what, k,
                     (unsigned long long)o->held, (unsigned long long)o->planned);
        cr_assert_eq(o->n_tensors, one.n_tensors, "%s, rank %d", what, k);
        if (ends) {
            const int64_t off = k * Vl, valid = V - off < 0 ? 0 : V - off < Vl ? V - off : Vl;
            const int64_t rows = SLOTS * B * one.out_floats / V;
            cr_assert_eq(o->out_floats * V, one.out_floats * Vl, "%s, rank %d: the logits of a slice", what, k);
            /* the logits: its slice's columns, then padding 0 */
            if (valid > 0) {
                const double e = rel_rows(o->out, one.out + off, rows, valid, Vl, V);
                cr_assert_leq(e, TOL, "%s, rank %d: logits differ by %g relative", what, k, e);
            }
            for (int64_t rr = 0; rr < rows; rr++)
                for (int64_t j = valid; j < Vl; j++)
                    cr_assert_eq(o->out[rr * Vl + j], 0.0f, "%s, rank %d: padding logit %lld", what, k, (long long)j);
            for (int s = 0; s < SLOTS; s++) {
                /* the loss is the whole vocabulary's, and the same bits on every rank */
                const double e = fabs(o->loss[s] - one.loss[s]) / fabs(one.loss[s]);
                cr_assert_leq(e, TOL, "%s, rank %d, slot %d: loss %.9g, one rank %.9g", what, k, s, o->loss[s],
                              one.loss[s]);
                cr_assert(o->loss[s] == rk[0].loss[s], "%s, rank %d: loss %.9g, rank 0 %.9g", what, k, o->loss[s],
                          rk[0].loss[s]);
            }
            /* the head's FLOPs are its slice's */
            cr_assert(o->fwd_flops < one.fwd_flops, "%s: %g FLOPs, one rank %g", what, o->fwd_flops, one.fwd_flops);
        } else {
            const int64_t n = SLOTS * B * one.out_floats;
            cr_assert_eq(o->out_floats, one.out_floats, "%s, rank %d", what, k);
            const double e = rel_rows(o->out, one.out, 1, n, 0, 0);
            cr_assert_leq(e, TOL, "%s, rank %d: output differs by %g relative", what, k, e);
            for (int64_t i = 0; i < n; i++)
                cr_assert(o->out[i] == rk[0].out[i], "%s, rank %d: output %lld is %.9g, rank 0's %.9g", what, k,
                          (long long)i, o->out[i], rk[0].out[i]);
        }
        if (first > 0) {
            const int64_t n = B * one.in_floats;
            const double e = rel_rows(o->din, one.din, 1, n, 0, 0);
            cr_assert_leq(e, TOL, "%s, rank %d: input gradient differs by %g relative", what, k, e);
            cr_assert(!memcmp(o->din, rk[0].din, (size_t)n * 4), "%s, rank %d: input gradient not rank 0's", what,
                      k);
        }
        for (int i = 0; i < o->n_tensors; i++) {
            const struct tensor_out *a = &o->tensors[i], *w = &one.tensors[i];
            const struct cdp_param_desc *pd = &a->pd;
            cr_assert_str_eq(pd->name, w->pd.name, "%s, rank %d, tensor %d", what, k, i);
            if (pd->shard_dim < 0) {
                const double e = rel_rows(a->grad, w->grad, 1, pd->numel, 0, 0);
                for (int64_t j = 0; j < pd->numel; j++)
                    cr_assert(a->data[j] == w->data[j], "%s, rank %d: %s[%lld] is %.9g, one rank's %.9g", what, k,
                              pd->name, (long long)j, a->data[j], w->data[j]);
                cr_assert_leq(e, TOL, "%s, rank %d: gradient of %s differs by %g relative", what, k, pd->name, e);
                continue;
            }
            /* a slice: its part of the whole one rank holds (cdp_param_slice_copy, which zeroes padding) */
            float *want = calloc((size_t)pd->numel, 4), *want_g = calloc((size_t)pd->numel, 4);
            cdp_param_slice_copy(pd, w->data, want, 0);
            cdp_param_slice_copy(pd, w->grad, want_g, 0);
            cr_assert(!memcmp(a->data, want, (size_t)pd->numel * 4), "%s, rank %d: %s is not its part of the whole",
                      what, k, pd->name);
            const double e = rel_rows(a->grad, want_g, 1, pd->numel, 0, 0);
            cr_assert_leq(e, TOL, "%s, rank %d: gradient of %s differs by %g relative", what, k, pd->name, e);
            free(want);
            free(want_g);
            if (strcmp(pd->name, "wte") && strcmp(pd->name, "lm_head.weight")) continue;
            /* a vocabulary slice: rows [k Vl, ...) of the whole, then padding rows of zeros */
            cr_assert_eq(pd->shard_dim, 0, "%s: %s", what, pd->name);
            cr_assert_eq(pd->shape[0], Vl, "%s: %s holds %lld rows", what, pd->name, (long long)pd->shape[0]);
            cr_assert_eq(pd->shard_off, k * Vl);
            const int64_t C = pd->shape[1], len = cdp_param_slice_len(pd);
            cr_assert_eq(len, V - k * Vl < 0 ? 0 : V - k * Vl < Vl ? V - k * Vl : Vl);
            for (int64_t j = len * C; j < Vl * C; j++)
                cr_assert(a->data[j] == 0.0f && a->grad[j] == 0.0f, "%s, rank %d: padding of %s: %g, gradient %g",
                          what, k, pd->name, a->data[j], a->grad[j]);
        }
    }
    for (int k = 0; k < t; k++) run_free(&rk[k]);
    /* one all-reduce a forward of the embedding, one a loss, one a head's backward; none elsewhere */
    cr_assert_gt(g.calls[0], 0, "%s: no collective ran", what);
    for (int k = 1; k < t; k++) cr_assert_eq(g.calls[k], g.calls[0]);
    run_free(&one);
    cdp_plan_free(p);
}

#define GPT(vocab, tie)                                                                                      \
    "{\"model\": {\"preset\": \"gpt\", \"vocab\": " #vocab ", \"context\": 8, \"layers\": 1, \"heads\": 4, " \
    "\"embed\": 16, \"tie_embeddings\": " #tie "}, \"train\": {\"global_batch\": 2, \"micro_batch\": 2}}"

Test(model, vocab_parallel_embedding_equals_one_rank)
{
    check_range(GPT(37, true), 0, 1, 2, CDP_RECOMPUTE_NONE, 0);
    check_range(GPT(37, true), 0, 1, 4, CDP_RECOMPUTE_NONE, 1);
    check_range(GPT(3, false), 0, 1, 4, CDP_RECOMPUTE_NONE, 0); /* a rank with no row of the vocabulary */
}

Test(model, vocab_parallel_head_and_loss_equal_one_rank)
{
    /* the head alone (units [2, 3)): tied (a copy of the embedding's slice) and untied */
    check_range(GPT(37, true), 2, 3, 2, CDP_RECOMPUTE_NONE, 0);
    check_range(GPT(37, false), 2, 3, 2, CDP_RECOMPUTE_FULL, 0);
    check_range(GPT(37, false), 2, 3, 4, CDP_RECOMPUTE_NONE, 1);
    check_range(GPT(38, true), 2, 3, 2, CDP_RECOMPUTE_NONE, 1); /* no padding */
}

Test(model, vocab_parallel_whole_gpt_equals_one_rank)
{
    /* embedding, block and head in one range, the head tied to the embedding in it */
    check_range(GPT(37, true), 0, -1, 2, CDP_RECOMPUTE_NONE, 0);
    check_range(GPT(37, true), 0, -1, 2, CDP_RECOMPUTE_FULL, 1);
    check_range(GPT(37, false), 0, -1, 4, CDP_RECOMPUTE_SELECTIVE, 0);
}

/* GPT's list attention split by heads (docs/parallelism.md), alone between
 * replicated layernorms: its output and input gradient (one all-reduce each)
 * the same bits on every rank and one rank's within the tolerance, c_attn's
 * slices (three row ranges) and c_proj's (input columns) one rank's parts,
 * c_proj's bias whole; every recompute mode, combined and split backward. */
#define ATT_LIST(causal)                                                                                          \
    "{\"model\": {\"input\": [8, 16], \"layers\": [{\"type\": \"layernorm\"}, {\"type\": \"attention\", "        \
    "\"heads\": 4, \"causal\": " #causal "}, {\"type\": \"layernorm\"}]}, \"train\": {\"global_batch\": 2, "      \
    "\"micro_batch\": 2}}"

Test(model, tensor_split_list_attention_equals_one_rank)
{
    check_range(ATT_LIST(true), 1, 2, 2, CDP_RECOMPUTE_NONE, 0);
    check_range(ATT_LIST(true), 1, 2, 4, CDP_RECOMPUTE_SELECTIVE, 1);
    check_range(ATT_LIST(false), 1, 2, 2, CDP_RECOMPUTE_FULL, 1);
    check_range(ATT_LIST(true), 0, 2, 4, CDP_RECOMPUTE_FULL, 0); /* with the norm before it, one range */
}

/* The list types whose input gradient is the group's sum of the ranks'
 * parts: a column-split linear (with its row), rotary_attention and
 * swiglu_mlp, first in their range, so that the caller's din reaches them
 * holding a value, then slot 1's gradient when slot 0's backward adds into
 * it: din = what it held + the gradient, as one rank, at t = 2 and 4,
 * combined and split backward (an all-reduce of din in place would count
 * what it held t times). */
#define SPLIT_LINEARS                                                                                           \
    "{\"model\": {\"input\": [4, 12], \"layers\": [{\"type\": \"layernorm\"}, {\"type\": \"linear\", "       \
    "\"out\": 16, \"split\": \"column\"}, {\"type\": \"gelu\"}, {\"type\": \"linear\", \"out\": 12, \"split\": "  \
    "\"row\"}, {\"type\": \"layernorm\"}]}, \"train\": {\"global_batch\": 2, \"micro_batch\": 2}}"
#define LLAMA_LIST(kv)                                                                                          \
    "{\"model\": {\"input\": [8, 16], \"layers\": [{\"type\": \"rmsnorm\"}, {\"type\": \"rotary_attention\", " \
    "\"heads\": 4, \"kv_heads\": " #kv "}, {\"type\": \"swiglu_mlp\", \"hidden\": 24}, {\"type\": \"rmsnorm\"}]}, " \
    "\"train\": {\"global_batch\": 2, \"micro_batch\": 2}}"

Test(model, tensor_split_input_gradients_add_into_din)
{
    check_range(SPLIT_LINEARS, 1, 4, 2, CDP_RECOMPUTE_NONE, 0);
    check_range(SPLIT_LINEARS, 1, 4, 4, CDP_RECOMPUTE_NONE, 1);
    check_range(LLAMA_LIST(2), 1, 2, 2, CDP_RECOMPUTE_NONE, 0); /* rotary_attention */
    check_range(LLAMA_LIST(4), 1, 2, 4, CDP_RECOMPUTE_SELECTIVE, 1);
    check_range(LLAMA_LIST(2), 2, 3, 2, CDP_RECOMPUTE_NONE, 0); /* swiglu_mlp */
    check_range(LLAMA_LIST(4), 2, 3, 4, CDP_RECOMPUTE_FULL, 1);
}
