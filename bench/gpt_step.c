/* Training-step speed of GPT models on the CPU against the raw cblas_sgemm rate
 * at the same GEMM shapes, with 1 and 2 OpenBLAS threads. A step is forward,
 * loss, backward and the AdamW update, through the same model code as training.
 *
 *   bench-gpt-step [--quick]
 *
 * For each configuration: ms per step (median of 7 after 2 warm-ups),
 * tokens/s, achieved GFLOP/s (the layer table's matrix work), the share of the
 * step spent inside cblas_sgemm, and the ceiling: the same GEMM calls (same
 * shapes, transposes and leading dimensions) timed alone, back to back. The
 * ratio achieved/ceiling is the step's efficiency; the target is >= 70%. */
#include <cblas.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "cdp/core.h"
#include "cdp/device.h"
#include "cdp/plan.h"
#include "model/model.h"
#include "model/optim.h"

/* ---- cblas_sgemm interposed (this program exports it): count and time ---- */

typedef void (*sgemm_fn)(const enum CBLAS_ORDER, const enum CBLAS_TRANSPOSE, const enum CBLAS_TRANSPOSE,
                         const blasint, const blasint, const blasint, const float, const float *,
                         const blasint, const float *, const blasint, const float, float *, const blasint);

struct gemm_call {
    int ta, tb;
    blasint M, N, K, lda, ldb, ldc;
    float beta;
};

static sgemm_fn real_sgemm;
static uint64_t gemm_ns;
static int recording;
static struct gemm_call *calls;
static int n_calls, cap_calls;

void cblas_sgemm(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE ta, const enum CBLAS_TRANSPOSE tb,
                 const blasint M, const blasint N, const blasint K, const float alpha, const float *A,
                 const blasint lda, const float *B, const blasint ldb, const float beta, float *C,
                 const blasint ldc)
{
    if (recording && order == CblasRowMajor) {
        if (n_calls == cap_calls) {
            cap_calls = cap_calls ? 2 * cap_calls : 256;
            calls = realloc(calls, (size_t)cap_calls * sizeof *calls);
        }
        calls[n_calls++] = (struct gemm_call){ta, tb, M, N, K, lda, ldb, ldc, beta};
    }
    uint64_t t0 = cdp_time_ns();
    real_sgemm(order, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    gemm_ns += cdp_time_ns() - t0;
}

/* Time of the recorded GEMM calls replayed alone (median of 5 passes). */
static double replay_seconds(void)
{
    size_t need = 0;
    for (int i = 0; i < n_calls; i++) {
        const struct gemm_call *c = &calls[i];
        size_t a = (size_t)c->lda * (size_t)(c->ta == CblasNoTrans ? c->M : c->K);
        size_t b = (size_t)c->ldb * (size_t)(c->tb == CblasNoTrans ? c->K : c->N);
        size_t cc = (size_t)c->ldc * (size_t)c->M;
        if (a > need) need = a;
        if (b > need) need = b;
        if (cc > need) need = cc;
    }
    float *A = malloc(need * 4), *B = malloc(need * 4), *C = malloc(need * 4);
    for (size_t i = 0; i < need; i++) A[i] = B[i] = C[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    double t[5];
    for (int r = 0; r < 5; r++) {
        uint64_t t0 = cdp_time_ns();
        for (int i = 0; i < n_calls; i++) {
            const struct gemm_call *c = &calls[i];
            real_sgemm(CblasRowMajor, c->ta, c->tb, c->M, c->N, c->K, 1.0f, A, c->lda, B, c->ldb, c->beta, C,
                       c->ldc);
        }
        t[r] = (double)(cdp_time_ns() - t0) / 1e9;
    }
    free(A);
    free(B);
    free(C);
    return cdp_bench_median(t, 5);
}

struct config {
    const char *name;
    int vocab, context, layers, heads, embed, batch;
};

static int bench(const struct config *c, int threads, int reps)
{
    char json[512];
    snprintf(json, sizeof json,
             "{\"model\": {\"preset\": \"gpt\", \"vocab\": %d, \"context\": %d, \"layers\": %d, \"heads\": %d, "
             "\"embed\": %d}}", c->vocab, c->context, c->layers, c->heads, c->embed);
    struct cdp_plan *p;
    cdp_device_t dev;
    struct cdp_model *m;
    if (cdp_plan_load_string(json, "bench", NULL, &p) || cdp_device_open(CDP_BACKEND_CPU, 0, 0, &dev) ||
        cdp_model_create(&p->model, 0, (int)cdp_plan_model_units(p), c->batch, 1, 1, dev, &m)) {
        fprintf(stderr, "bench-gpt-step: %s\n", cdp_last_error());
        return 1;
    }
    struct cdp_optimizer *opt;
    struct cdp_optimizer_desc od = {.type = CDP_OPT_ADAMW, .lr = 1e-4, .weight_decay = 0.1, .beta1 = 0.9,
                                    .beta2 = 0.95, .eps = 1e-8};
    if (cdp_optimizer_create(&od, m, dev, &opt)) {
        fprintf(stderr, "bench-gpt-step: %s\n", cdp_last_error());
        return 1;
    }
    openblas_set_num_threads(threads);
    int32_t *tok = cdp_model_input(m, 0);
    int32_t *tgt = malloc((size_t)c->batch * c->context * 4);
    for (int i = 0; i < c->batch * c->context; i++) {
        tok[i] = (int32_t)((i * 7919u) % (unsigned)c->vocab);
        tgt[i] = (int32_t)((i * 104729u + 13) % (unsigned)c->vocab);
    }
    const float scale = 1.0f / (float)(c->batch * c->context);
    double t[16], gshare[16];
    for (int r = 0; r < reps + 2; r++) {
        double loss;
        recording = r == 0;
        if (recording) n_calls = 0;
        gemm_ns = 0;
        uint64_t t0 = cdp_time_ns();
        cdp_model_zero_grad(m);
        cdp_model_forward(m, 0);
        cdp_model_loss(m, 0, tgt, scale, &loss);
        cdp_model_backward(m, 0, NULL, NULL);
        cdp_optimizer_step(opt, m, 1e-4f, 1.0f);
        double dt = (double)(cdp_time_ns() - t0) / 1e9;
        recording = 0;
        if (r >= 2) {
            t[r - 2] = dt;
            gshare[r - 2] = (double)gemm_ns / 1e9 / dt;
        }
    }
    double step = cdp_bench_median(t, reps), share = cdp_bench_median(gshare, reps);
    double flops = cdp_model_step_flops(m);
    double ceiling = flops / replay_seconds();
    double tokens = (double)c->batch * c->context;
    printf("%-22s %2d thr  %9.1f ms  %9.0f tok/s  %7.1f GFLOP/s  GEMM %4.0f%%  ceiling %7.1f GFLOP/s  "
           "efficiency %4.0f%%\n",
           c->name, threads, step * 1e3, tokens / step, flops / step / 1e9, share * 100, ceiling / 1e9,
           100.0 * flops / step / ceiling);
    fflush(stdout);
    free(tgt);
    cdp_optimizer_destroy(opt);
    cdp_model_destroy(m);
    cdp_device_close(dev);
    cdp_plan_free(p);
    return 0;
}

int main(int argc, char **argv)
{
    int quick = argc > 1 && !strcmp(argv[1], "--quick");
    real_sgemm = (sgemm_fn)dlsym(RTLD_NEXT, "cblas_sgemm");
    if (!real_sgemm) {
        fprintf(stderr, "bench-gpt-step: cblas_sgemm not found\n");
        return 1;
    }
    static const struct config configs[] = {
        {"L4-H4-C256 V256 B8", 256, 64, 4, 4, 256, 8},
        {"L4-H4-C256 V50257 B8", 50257, 64, 4, 4, 256, 8},
        {"GPT-2 124M B4", 50257, 64, 12, 12, 768, 4},
    };
    int n = quick ? 1 : 3;
    printf("training step (forward + loss + backward + AdamW), T=64; median of %d after 2 warm-ups\n",
           quick ? 3 : 7);
    for (int i = 0; i < n; i++)
        for (int th = 1; th <= 2; th++)
            if (bench(&configs[i], th, quick ? 3 : 7)) return 1;
    return 0;
}
