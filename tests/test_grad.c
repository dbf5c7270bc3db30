/* Suite `grad`: every CPU backward kernel against central finite differences
 * of a scalar loss L = sum(out * R), R random and fixed, evaluated in double
 * from the float32 forward. Every produced gradient is checked (input and
 * parameter gradients), and each backward is called twice onto gradients that
 * start at random values, to prove it accumulates (the second call adds the
 * same amount again). The losses' backwards overwrite instead, which is
 * checked too.
 *
 * Step and tolerance. The forward runs in float32, so every output carries a
 * relative rounding error of ~1e-7 and L an absolute noise delta of about
 * 1e-7 * sqrt(sum (out R)^2) <= 1e-5 for the shapes here. A central
 * difference with step h has error delta / h + h^2 |f'''| / 6. With h = 1e-2
 * that is <= 1e-3 from noise and ~2e-5 from truncation for these smooth ops
 * with O(1) inputs, against gradients of size O(0.1 .. 1). We require the
 * normalised error |num - ana| / |num| over the checked elements to be below
 * 1e-2: ten times the realistic bar, while any real mistake (a missing term,
 * a wrong index, a factor of 2, a missing scale) gives errors of O(0.1 .. 1).
 * Piecewise-linear ops (relu, maxpool) have zero truncation error, but their
 * inputs are kept at least 0.05 from every kink (|x| >= 0.05 for relu,
 * window values at least 0.05 apart for maxpool), more than the step, so the
 * difference never straddles one. The perturbation actually applied is
 * (float)(x +- h) - x, not h. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "kernels/cpu/ops.h"

#define FD_STEP 1e-2
#define FD_TOL 1e-2
#define FD_MAX_CHECKS 250 /* elements checked per tensor, chosen at random beyond that */

/* ---- helpers ---------------------------------------------------------------- */

static double dot_out(const float *out, const float *R, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)out[i] * R[i];
    return s;
}

typedef double (*loss_fn)(void *ctx);

/* Central differences of loss() with respect to x[], against ana[]. */
static void check_fd(const char *what, loss_fn loss, void *ctx, float *x, size_t n,
                     const double *ana)
{
    double num2 = 0, err2 = 0;
    size_t checks = n <= FD_MAX_CHECKS ? n : FD_MAX_CHECKS;
    for (size_t c = 0; c < checks; c++) {
        size_t i = n <= FD_MAX_CHECKS ? c : (size_t)(urand() * n);
        float save = x[i];
        float xp = (float)(save + FD_STEP), xm = (float)(save - FD_STEP);
        x[i] = xp;
        double lp = loss(ctx);
        x[i] = xm;
        double lm = loss(ctx);
        x[i] = save;
        double num = (lp - lm) / ((double)xp - (double)xm);
        num2 += num * num;
        err2 += (num - ana[i]) * (num - ana[i]);
    }
    double e = num2 > 0 ? sqrt(err2 / num2) : sqrt(err2);
    cr_assert(e <= FD_TOL, "%s: finite-difference error %.3g > %.3g (|num| = %.3g)", what, e,
              (double)FD_TOL, sqrt(num2));
}

/* A gradient buffer that starts at random values, so accumulation shows. */
struct gbuf {
    float *g;   /* what backward writes into */
    float *g0;  /* its value before the first call */
    double *d1; /* g - g0 after the first call: the analytic gradient */
    size_t n;
};

static void gbuf_init(struct gbuf *b, size_t n)
{
    b->n = n;
    b->g = randv(n, -1, 1);
    b->g0 = malloc((n ? n : 1) * sizeof *b->g0);
    memcpy(b->g0, b->g, n * sizeof *b->g);
    b->d1 = calloc(n ? n : 1, sizeof *b->d1);
    cr_assert(b->g0 && b->d1);
}

static void gbuf_first(struct gbuf *b)
{
    for (size_t i = 0; i < b->n; i++)
        b->d1[i] = (double)b->g[i] - b->g0[i];
}

/* After a second backward call: g - g0 must be twice the first increment. */
static void gbuf_check_twice(const char *what, const struct gbuf *b)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < b->n; i++) {
        double d = ((double)b->g[i] - b->g0[i]) - 2.0 * b->d1[i];
        num += d * d;
        den += 4.0 * b->d1[i] * b->d1[i];
    }
    double e = den > 0 ? sqrt(num / den) : sqrt(num);
    cr_assert(den > 0, "%s: backward produced a zero gradient", what);
    cr_assert(e <= 1e-5, "%s: backward does not accumulate (second call off by %.3g)", what, e);
}

static void gbuf_free(struct gbuf *b)
{
    free(b->g), free(b->g0), free(b->d1);
}

/* ---- linear ------------------------------------------------------------------ */

struct linear_ctx {
    float *in, *w, *b, *out, *R;
    int N, IC, OC;
};

static double linear_loss(void *p)
{
    struct linear_ctx *c = p;
    cdp_cpu_linear_fwd(c->out, c->in, c->w, c->b, c->N, c->IC, c->OC);
    return dot_out(c->out, c->R, (size_t)c->N * c->OC);
}

static void check_linear(int N, int IC, int OC)
{
    struct linear_ctx c = {randv((size_t)N * IC, -1, 1), randv((size_t)OC * IC, -1, 1),
                           randv(OC, -1, 1), falloc((size_t)N * OC),
                           randv((size_t)N * OC, -1, 1), N, IC, OC};
    struct gbuf din, dw, db;
    gbuf_init(&din, (size_t)N * IC), gbuf_init(&dw, (size_t)OC * IC), gbuf_init(&db, OC);
    for (int call = 0; call < 2; call++) {
        cdp_cpu_linear_bwd(din.g, dw.g, db.g, c.R, c.in, c.w, N, IC, OC);
        if (call == 0) gbuf_first(&din), gbuf_first(&dw), gbuf_first(&db);
    }
    check_fd("linear din", linear_loss, &c, c.in, din.n, din.d1);
    check_fd("linear dw", linear_loss, &c, c.w, dw.n, dw.d1);
    check_fd("linear db", linear_loss, &c, c.b, db.n, db.d1);
    gbuf_check_twice("linear din", &din);
    gbuf_check_twice("linear dw", &dw);
    gbuf_check_twice("linear db", &db);

    /* each gradient may be skipped (NULL) without changing the others */
    float *only = falloc((size_t)N * IC);
    cdp_cpu_linear_bwd(only, NULL, NULL, c.R, c.in, c.w, N, IC, OC);
    for (size_t i = 0; i < din.n; i++)
        cr_assert(fabs(only[i] - din.d1[i]) <= 1e-5 * (1 + fabs(din.d1[i])), "linear din alone");
    cdp_cpu_linear_bwd(NULL, NULL, NULL, c.R, c.in, c.w, N, IC, OC);
    free(only);
    gbuf_free(&din), gbuf_free(&dw), gbuf_free(&db);
    free(c.in), free(c.w), free(c.b), free(c.out), free(c.R);
}

Test(grad, linear)
{
    rng_seed(21);
    check_linear(1, 1, 1);
    check_linear(3, 5, 7);
    check_linear(13, 17, 9);
}

/* ---- elementwise ---------------------------------------------------------------- */

struct unary_ctx {
    void (*fwd)(float *, const float *, size_t);
    float *in, *out, *R;
    size_t n;
};

static double unary_loss(void *p)
{
    struct unary_ctx *c = p;
    c->fwd(c->out, c->in, c->n);
    return dot_out(c->out, c->R, c->n);
}

static void check_unary(const char *what, void (*fwd)(float *, const float *, size_t),
                        void (*bwd)(float *, const float *, const float *, size_t), float *in,
                        size_t n)
{
    struct unary_ctx c = {fwd, in, falloc(n), randv(n, -1, 1), n};
    struct gbuf din;
    gbuf_init(&din, n);
    bwd(din.g, c.R, in, n);
    gbuf_first(&din);
    bwd(din.g, c.R, in, n);
    check_fd(what, unary_loss, &c, in, n, din.d1);
    gbuf_check_twice(what, &din);
    gbuf_free(&din);
    free(c.out), free(c.R);
}

Test(grad, relu)
{
    rng_seed(22);
    size_t n = 203;
    float *x = randv(n, 0.05f, 2.0f);
    for (size_t i = 0; i < n; i++)
        if (urand() < 0.5) x[i] = -x[i]; /* |x| >= 0.05: no kink within the step */
    check_unary("relu din", cdp_cpu_relu_fwd, cdp_cpu_relu_bwd, x, n);
    free(x);
}

Test(grad, gelu)
{
    rng_seed(23);
    size_t n = 211;
    float *x = randv(n, -5, 5);
    check_unary("gelu din", cdp_cpu_gelu_fwd, cdp_cpu_gelu_bwd, x, n);
    free(x);
}

Test(grad, silu)
{
    rng_seed(24);
    size_t n = 209;
    float *x = randv(n, -8, 8);
    check_unary("silu din", cdp_cpu_silu_fwd, cdp_cpu_silu_bwd, x, n);
    free(x);
}

struct residual_ctx {
    float *a, *b, *out, *R;
    size_t n;
};

static double residual_loss(void *p)
{
    struct residual_ctx *c = p;
    cdp_cpu_residual_fwd(c->out, c->a, c->b, c->n);
    return dot_out(c->out, c->R, c->n);
}

Test(grad, residual)
{
    rng_seed(24);
    size_t n = 77;
    struct residual_ctx c = {randv(n, -1, 1), randv(n, -1, 1), falloc(n), randv(n, -1, 1), n};
    struct gbuf da, db;
    gbuf_init(&da, n), gbuf_init(&db, n);
    cdp_cpu_residual_bwd(da.g, db.g, c.R, n);
    gbuf_first(&da), gbuf_first(&db);
    cdp_cpu_residual_bwd(da.g, db.g, c.R, n);
    check_fd("residual da", residual_loss, &c, c.a, n, da.d1);
    check_fd("residual db", residual_loss, &c, c.b, n, db.d1);
    gbuf_check_twice("residual da", &da), gbuf_check_twice("residual db", &db);
    gbuf_free(&da), gbuf_free(&db);
    free(c.a), free(c.b), free(c.out), free(c.R);
}

/* ---- layernorm ------------------------------------------------------------------- */

struct ln_ctx {
    float *in, *w, *b, *out, *mean, *rstd, *R;
    int N, C;
};

static double ln_loss(void *p)
{
    struct ln_ctx *c = p;
    cdp_cpu_layernorm_fwd(c->out, c->mean, c->rstd, c->in, c->w, c->b, c->N, c->C, 1e-5f);
    return dot_out(c->out, c->R, (size_t)c->N * c->C);
}

static void check_layernorm(int N, int C)
{
    size_t n = (size_t)N * C;
    struct ln_ctx c = {randv(n, -2, 2), randv(C, 0.5f, 1.5f), randv(C, -1, 1), falloc(n),
                       falloc(N), falloc(N), randv(n, -1, 1), N, C};
    ln_loss(&c); /* mean and rstd for backward */
    struct gbuf din, dw, db;
    gbuf_init(&din, n), gbuf_init(&dw, C), gbuf_init(&db, C);
    for (int call = 0; call < 2; call++) {
        cdp_cpu_layernorm_bwd(din.g, dw.g, db.g, c.R, c.in, c.w, c.mean, c.rstd, N, C);
        if (call == 0) gbuf_first(&din), gbuf_first(&dw), gbuf_first(&db);
    }
    check_fd("layernorm din", ln_loss, &c, c.in, n, din.d1);
    check_fd("layernorm dweight", ln_loss, &c, c.w, C, dw.d1);
    check_fd("layernorm dbias", ln_loss, &c, c.b, C, db.d1);
    gbuf_check_twice("layernorm din", &din);
    gbuf_check_twice("layernorm dweight", &dw);
    gbuf_check_twice("layernorm dbias", &db);
    gbuf_free(&din), gbuf_free(&dw), gbuf_free(&db);
    free(c.in), free(c.w), free(c.b), free(c.out), free(c.mean), free(c.rstd), free(c.R);
}

Test(grad, layernorm)
{
    rng_seed(25);
    check_layernorm(1, 7);
    check_layernorm(5, 33);
    /* C = 2 is degenerate (the normalised pair is +-1 whatever the input,
     * so the input gradient is ~0 and only noise is left); 3 is the smallest
     * row with a real gradient */
    check_layernorm(3, 3);
    check_layernorm(2, 64);
}

/* ---- embedding ------------------------------------------------------------------- */

struct emb_ctx {
    float *wte, *wpe, *out, *R;
    int32_t *tok;
    int B, T, C;
};

static double emb_loss(void *p)
{
    struct emb_ctx *c = p;
    cdp_cpu_embedding_fwd(c->out, c->tok, c->wte, c->wpe, c->B, c->T, c->C);
    return dot_out(c->out, c->R, (size_t)c->B * c->T * c->C);
}

Test(grad, embedding)
{
    rng_seed(26);
    int B = 2, T = 5, C = 7, V = 6;
    int32_t tok[10] = {0, 3, 3, 5, 1, 3, 0, 2, 5, 5}; /* repeated ids must add up; id 4 unused */
    struct emb_ctx c = {randv((size_t)V * C, -1, 1), randv((size_t)T * C, -1, 1),
                        falloc((size_t)B * T * C), randv((size_t)B * T * C, -1, 1), tok, B, T, C};
    struct gbuf dwte, dwpe;
    gbuf_init(&dwte, (size_t)V * C), gbuf_init(&dwpe, (size_t)T * C);
    cdp_cpu_embedding_bwd(dwte.g, dwpe.g, c.R, tok, B, T, C);
    gbuf_first(&dwte), gbuf_first(&dwpe);
    cdp_cpu_embedding_bwd(dwte.g, dwpe.g, c.R, tok, B, T, C);
    check_fd("embedding dwte", emb_loss, &c, c.wte, dwte.n, dwte.d1);
    check_fd("embedding dwpe", emb_loss, &c, c.wpe, dwpe.n, dwpe.d1);
    gbuf_check_twice("embedding dwte", &dwte), gbuf_check_twice("embedding dwpe", &dwpe);
    for (int k = 0; k < C; k++) /* the unused row's gradient is untouched */
        cr_assert(dwte.d1[4 * C + k] == 0.0);
    gbuf_free(&dwte), gbuf_free(&dwpe);
    free(c.wte), free(c.wpe), free(c.out), free(c.R);
}

/* ---- attention ------------------------------------------------------------------- */

struct att_ctx {
    float *qkv, *out, *att, *R;
    int B, T, C, NH, causal;
};

static double att_loss(void *p)
{
    struct att_ctx *c = p;
    cdp_cpu_attention_fwd(c->out, c->att, c->qkv, c->B, c->T, c->C, c->NH, c->causal);
    return dot_out(c->out, c->R, (size_t)c->B * c->T * c->C);
}

static void check_attention(int B, int T, int C, int NH, int causal)
{
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C;
    struct att_ctx c = {randv(nq, -1.5f, 1.5f), falloc(no), falloc((size_t)B * NH * T * T),
                        randv(no, -1, 1), B, T, C, NH, causal};
    att_loss(&c);
    float *scratch = randv((size_t)T * T, 50, 60); /* garbage: must not leak into results */
    struct gbuf dqkv;
    gbuf_init(&dqkv, nq);
    cdp_cpu_attention_bwd(dqkv.g, c.R, c.qkv, c.att, scratch, B, T, C, NH, causal);
    gbuf_first(&dqkv);
    cdp_cpu_attention_bwd(dqkv.g, c.R, c.qkv, c.att, scratch, B, T, C, NH, causal);
    char what[96];
    snprintf(what, sizeof what, "attention dqkv B=%d T=%d C=%d NH=%d causal=%d", B, T, C, NH,
             causal);
    check_fd(what, att_loss, &c, c.qkv, nq, dqkv.d1);
    gbuf_check_twice(what, &dqkv);
    gbuf_free(&dqkv);
    free(c.qkv), free(c.out), free(c.att), free(c.R), free(scratch);
}

Test(grad, attention)
{
    rng_seed(27);
    for (int causal = 0; causal < 2; causal++) {
        check_attention(1, 1, 4, 1, causal);
        check_attention(2, 5, 6, 2, causal);
        check_attention(1, 9, 9, 3, causal);
        check_attention(1, 70, 8, 2, causal); /* crosses the 64-row causal block */
    }
}

/* ---- the Llama ops: rmsnorm, rope, swiglu --------------------------------------- */

struct rms_ctx {
    float *in, *w, *out, *rstd, *R;
    int N, C;
};

static double rms_loss(void *p)
{
    struct rms_ctx *c = p;
    cdp_cpu_rmsnorm_fwd(c->out, c->rstd, c->in, c->w, c->N, c->C, 1e-5f);
    return dot_out(c->out, c->R, (size_t)c->N * c->C);
}

static void check_rmsnorm(int N, int C)
{
    size_t n = (size_t)N * C;
    struct rms_ctx c = {randv(n, -2, 2), randv(C, 0.5f, 1.5f), falloc(n), falloc(N), randv(n, -1, 1), N, C};
    rms_loss(&c); /* rstd for backward */
    struct gbuf din, dw;
    gbuf_init(&din, n), gbuf_init(&dw, C);
    for (int call = 0; call < 2; call++) {
        cdp_cpu_rmsnorm_bwd(din.g, dw.g, c.R, c.in, c.w, c.rstd, N, C);
        if (call == 0) gbuf_first(&din), gbuf_first(&dw);
    }
    check_fd("rmsnorm din", rms_loss, &c, c.in, n, din.d1);
    check_fd("rmsnorm dweight", rms_loss, &c, c.w, C, dw.d1);
    gbuf_check_twice("rmsnorm din", &din);
    gbuf_check_twice("rmsnorm dweight", &dw);
    /* either gradient alone is the same */
    float *only = calloc(n, sizeof *only), *only_w = calloc((size_t)C, sizeof *only_w);
    cdp_cpu_rmsnorm_bwd(only, NULL, c.R, c.in, c.w, c.rstd, N, C);
    cdp_cpu_rmsnorm_bwd(NULL, only_w, c.R, c.in, c.w, c.rstd, N, C);
    for (size_t i = 0; i < n; i++)
        cr_assert(fabs(only[i] - din.d1[i]) <= 1e-5 * (1 + fabs(din.d1[i])), "rmsnorm din alone");
    for (int j = 0; j < C; j++)
        cr_assert(fabs(only_w[j] - dw.d1[j]) <= 1e-5 * (1 + fabs(dw.d1[j])), "rmsnorm dweight alone");
    free(only), free(only_w);
    gbuf_free(&din), gbuf_free(&dw);
    free(c.in), free(c.w), free(c.out), free(c.rstd), free(c.R);
}

Test(grad, rmsnorm)
{
    rng_seed(31);
    check_rmsnorm(1, 7);
    check_rmsnorm(5, 33);
    check_rmsnorm(3, 2);
    check_rmsnorm(2, 64);
}

struct rope_ctx {
    float *q, *k, *v, *qkv, *R;
    int B, T, NH, NKV, HD, pos0;
    struct cdp_rope rope;
};

static double rope_loss(void *p)
{
    struct rope_ctx *c = p;
    cdp_cpu_rope_fwd(c->qkv, c->q, c->k, c->v, c->B, c->T, c->NH, c->NKV, c->HD, c->pos0, &c->rope);
    return dot_out(c->qkv, c->R, (size_t)c->B * c->T * 3 * c->NH * c->HD);
}

static void check_rope(int B, int T, int NH, int NKV, int HD, int pos0, struct cdp_rope rope)
{
    const size_t N = (size_t)B * T, nq = N * NH * HD, nk = N * NKV * HD, nqkv = 3 * nq;
    struct rope_ctx c = {randv(nq, -1, 1), randv(nk, -1, 1), randv(nk, -1, 1), falloc(nqkv), randv(nqkv, -1, 1),
                         B, T, NH, NKV, HD, pos0, rope};
    struct gbuf dq, dk, dv;
    gbuf_init(&dq, nq), gbuf_init(&dk, nk), gbuf_init(&dv, nk);
    for (int call = 0; call < 2; call++) {
        cdp_cpu_rope_bwd(dq.g, dk.g, dv.g, c.R, B, T, NH, NKV, HD, pos0, &rope);
        if (call == 0) gbuf_first(&dq), gbuf_first(&dk), gbuf_first(&dv);
    }
    char what[128];
    snprintf(what, sizeof what, "rope B=%d T=%d NH=%d NKV=%d HD=%d pos0=%d factor=%g", B, T, NH, NKV, HD, pos0,
             rope.factor);
    check_fd(what, rope_loss, &c, c.q, nq, dq.d1);
    check_fd(what, rope_loss, &c, c.k, nk, dk.d1);
    check_fd(what, rope_loss, &c, c.v, nk, dv.d1);
    gbuf_check_twice(what, &dq), gbuf_check_twice(what, &dk), gbuf_check_twice(what, &dv);
    /* position 0 is not rotated; the rotation keeps each pair's length */
    rope_loss(&c);
    const int C = NH * HD, half = HD / 2;
    for (size_t n = 0; n < N; n++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < half; i++) {
                const float *x = c.q + n * C + h * HD, *y = c.qkv + n * 3 * C + h * HD;
                double lx = hypot(x[i], x[i + half]), ly = hypot(y[i], y[i + half]);
                cr_assert(fabs(lx - ly) <= 1e-6 * (1 + lx), "%s: pair length %g -> %g", what, lx, ly);
                if (pos0 == 0 && n % (size_t)T == 0)
                    cr_assert(y[i] == x[i] && y[i + half] == x[i + half], "%s: position 0 rotated", what);
            }
    gbuf_free(&dq), gbuf_free(&dk), gbuf_free(&dv);
    free(c.q), free(c.k), free(c.v), free(c.qkv), free(c.R);
}

Test(grad, rope)
{
    rng_seed(32);
    const struct cdp_rope plain = {.theta = 10000.0};
    const struct cdp_rope llama3 = {.theta = 500000.0, .factor = 8, .low_freq_factor = 1, .high_freq_factor = 4,
                                    .original_context = 64};
    check_rope(1, 1, 1, 1, 2, 0, plain);
    check_rope(2, 5, 4, 2, 8, 0, plain);   /* grouped: two query heads a key/value head */
    check_rope(1, 7, 6, 1, 4, 0, plain);   /* multi-query */
    check_rope(2, 9, 4, 4, 16, 0, llama3); /* every frequency band of the scaling */
    check_rope(1, 3, 2, 1, 6, 37, llama3); /* positions from an offset (a KV cache's) */
}

struct swiglu_ctx {
    float *gate, *up, *out, *R;
    size_t n;
};

static double swiglu_loss(void *p)
{
    struct swiglu_ctx *c = p;
    cdp_cpu_swiglu_fwd(c->out, c->gate, c->up, c->n);
    return dot_out(c->out, c->R, c->n);
}

Test(grad, swiglu)
{
    rng_seed(33);
    size_t n = 197;
    struct swiglu_ctx c = {randv(n, -8, 8), randv(n, -2, 2), falloc(n), randv(n, -1, 1), n};
    struct gbuf dg, du;
    gbuf_init(&dg, n), gbuf_init(&du, n);
    for (int call = 0; call < 2; call++) {
        cdp_cpu_swiglu_bwd(dg.g, du.g, c.R, c.gate, c.up, n);
        if (call == 0) gbuf_first(&dg), gbuf_first(&du);
    }
    check_fd("swiglu dgate", swiglu_loss, &c, c.gate, n, dg.d1);
    check_fd("swiglu dup", swiglu_loss, &c, c.up, n, du.d1);
    gbuf_check_twice("swiglu dgate", &dg), gbuf_check_twice("swiglu dup", &du);
    gbuf_free(&dg), gbuf_free(&du);
    free(c.gate), free(c.up), free(c.out), free(c.R);
}

/* ---- losses (their backwards overwrite) ------------------------------------------- */

struct ce_ctx {
    float *logits, *losses;
    int32_t *tg;
    int N, V;
    float scale;
};

static double ce_loss(void *p)
{
    struct ce_ctx *c = p;
    cdp_cpu_crossentropy_fwd(c->losses, c->logits, c->tg, c->N, c->V);
    double s = 0;
    for (int i = 0; i < c->N; i++)
        s += c->losses[i];
    return s * c->scale;
}

static void check_ce(int N, int V, float spread)
{
    struct ce_ctx c = {randv((size_t)N * V, -spread, spread), falloc(N), malloc(N * sizeof(int32_t)),
                       N, V, 0.3f};
    for (int i = 0; i < N; i++)
        c.tg[i] = (int32_t)(urand() * V);
    size_t n = (size_t)N * V;
    float *dl = randv(n, 100, 200); /* garbage: backward overwrites */
    cdp_cpu_crossentropy_bwd(dl, c.logits, c.tg, N, V, c.scale);
    double *ana = calloc(n, sizeof *ana);
    for (size_t i = 0; i < n; i++)
        ana[i] = dl[i];
    check_fd("crossentropy dlogits", ce_loss, &c, c.logits, n, ana);
    cdp_cpu_crossentropy_bwd(dl, c.logits, c.tg, N, V, c.scale);
    for (size_t i = 0; i < n; i++)
        cr_assert(dl[i] == (float)ana[i], "crossentropy backward must overwrite");
    free(c.logits), free(c.losses), free(c.tg), free(dl), free(ana);
}

Test(grad, crossentropy)
{
    rng_seed(28);
    check_ce(1, 2, 2);
    check_ce(4, 11, 3);
    check_ce(3, 257, 5);
}

struct mse_ctx {
    float *pred, *target, *losses;
    int N, D;
    float scale;
};

static double mse_loss(void *p)
{
    struct mse_ctx *c = p;
    cdp_cpu_mse_fwd(c->losses, c->pred, c->target, c->N, c->D);
    double s = 0;
    for (int i = 0; i < c->N; i++)
        s += c->losses[i];
    return s * c->scale;
}

Test(grad, mse)
{
    rng_seed(29);
    int N = 3, D = 13;
    size_t n = (size_t)N * D;
    struct mse_ctx c = {randv(n, -1, 1), randv(n, -1, 1), falloc(N), N, D, 0.25f};
    float *d = randv(n, 100, 200);
    cdp_cpu_mse_bwd(d, c.pred, c.target, N, D, c.scale);
    double *ana = calloc(n, sizeof *ana);
    for (size_t i = 0; i < n; i++)
        ana[i] = d[i];
    check_fd("mse dpred", mse_loss, &c, c.pred, n, ana);
    cdp_cpu_mse_bwd(d, c.pred, c.target, N, D, c.scale);
    for (size_t i = 0; i < n; i++)
        cr_assert(d[i] == (float)ana[i], "mse backward must overwrite");
    free(c.pred), free(c.target), free(c.losses), free(d), free(ana);
}

/* ---- conv2d and maxpool ------------------------------------------------------------ */

struct conv_ctx {
    float *in, *w, *b, *out, *col, *R;
    int B, IC, H, W, OC, K, S, P;
    size_t nout;
};

static double conv_loss(void *p)
{
    struct conv_ctx *c = p;
    cdp_cpu_conv2d_fwd(c->out, c->col, c->in, c->w, c->b, c->B, c->IC, c->H, c->W, c->OC, c->K,
                       c->S, c->P);
    return dot_out(c->out, c->R, c->nout);
}

static void check_conv(int B, int IC, int H, int W, int OC, int K, int S, int P)
{
    int OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1;
    size_t nin = (size_t)B * IC * H * W, nw = (size_t)OC * IC * K * K;
    size_t nout = (size_t)B * OC * OH * OW;
    struct conv_ctx c = {randv(nin, -1, 1), randv(nw, -1, 1), randv(OC, -1, 1), falloc(nout),
                         falloc((size_t)IC * K * K * OH * OW), randv(nout, -1, 1),
                         B, IC, H, W, OC, K, S, P, nout};
    struct gbuf din, dw, db;
    gbuf_init(&din, nin), gbuf_init(&dw, nw), gbuf_init(&db, OC);
    for (int call = 0; call < 2; call++) {
        cdp_cpu_conv2d_bwd(din.g, dw.g, db.g, c.col, c.R, c.in, c.w, B, IC, H, W, OC, K, S, P);
        if (call == 0) gbuf_first(&din), gbuf_first(&dw), gbuf_first(&db);
    }
    char what[128];
    snprintf(what, sizeof what, "conv2d B=%d IC=%d H=%d W=%d OC=%d K=%d S=%d P=%d", B, IC, H, W,
             OC, K, S, P);
    check_fd(what, conv_loss, &c, c.in, nin, din.d1);
    check_fd(what, conv_loss, &c, c.w, nw, dw.d1);
    check_fd(what, conv_loss, &c, c.b, OC, db.d1);
    gbuf_check_twice(what, &din), gbuf_check_twice(what, &dw), gbuf_check_twice(what, &db);
    gbuf_free(&din), gbuf_free(&dw), gbuf_free(&db);
    free(c.in), free(c.w), free(c.b), free(c.out), free(c.col), free(c.R);
}

Test(grad, conv2d)
{
    rng_seed(30);
    check_conv(1, 1, 5, 5, 1, 3, 1, 0);
    check_conv(2, 3, 7, 6, 4, 3, 2, 1);
    check_conv(1, 2, 6, 5, 3, 1, 1, 0); /* 1x1: the im2col-free path */
    check_conv(2, 2, 9, 7, 3, 5, 3, 2);
    check_conv(1, 3, 6, 6, 2, 2, 2, 0);
    check_conv(1, 2, 2, 3, 3, 3, 1, 1); /* kernel larger than the image, padded */
}

struct pool_ctx {
    float *in, *out, *R;
    int32_t *am;
    int B, C, H, W, K, S;
    size_t nout;
};

static double pool_loss(void *p)
{
    struct pool_ctx *c = p;
    cdp_cpu_maxpool2d_fwd(c->out, c->am, c->in, c->B, c->C, c->H, c->W, c->K, c->S);
    return dot_out(c->out, c->R, c->nout);
}

static void check_pool(int B, int C, int H, int W, int K, int S)
{
    int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
    size_t nin = (size_t)B * C * H * W, nout = (size_t)B * C * OH * OW;
    /* distinct values 0.05 apart, shuffled: no ties within the step */
    float *in = malloc(nin * sizeof *in);
    for (size_t i = 0; i < nin; i++)
        in[i] = 0.05f * (float)i - 1.0f;
    for (size_t i = nin - 1; i > 0; i--) {
        size_t j = (size_t)(urand() * (i + 1));
        float t = in[i];
        in[i] = in[j], in[j] = t;
    }
    struct pool_ctx c = {in, falloc(nout), randv(nout, -1, 1), malloc(nout * sizeof(int32_t)),
                         B, C, H, W, K, S, nout};
    pool_loss(&c);
    struct gbuf din;
    gbuf_init(&din, nin);
    cdp_cpu_maxpool2d_bwd(din.g, c.R, c.am, B, C, OH, OW);
    gbuf_first(&din);
    cdp_cpu_maxpool2d_bwd(din.g, c.R, c.am, B, C, OH, OW);
    check_fd("maxpool2d din", pool_loss, &c, in, nin, din.d1);
    gbuf_check_twice("maxpool2d din", &din);
    gbuf_free(&din);
    free(in), free(c.out), free(c.R), free(c.am);
}

Test(grad, maxpool2d)
{
    rng_seed(31);
    check_pool(1, 1, 4, 4, 2, 2);
    check_pool(2, 3, 7, 5, 3, 2); /* overlapping windows: one input can win twice */
    check_pool(1, 2, 5, 5, 2, 1);
}
