/* Suite model: the layer table against counted work, the golden GPT step
 * against PyTorch, Hugging Face GPT-2 import, weights round trips, seeded
 * initialisation independent of the partition, falling losses, and units and
 * models on the kernel table they are given (failures, missing ops). */
#include <cblas.h>
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/device.h"
#include "cdp/plan.h"
#include "harness.h"
#include "kernels/ops.h"
#include "model/layer_def.h"
#include "model/layers.h"
#include "model/model.h"
#include "model/optim.h"
#include "model/safetensors.h"
#include "partitioner/planner.h"
#include "cdp/train.h"

/* ---- counting GEMM work: this executable interposes cblas_sgemm -------------- */

static double sgemm_flops;

typedef void (*sgemm_fn)(const enum CBLAS_ORDER, const enum CBLAS_TRANSPOSE, const enum CBLAS_TRANSPOSE,
                         const blasint, const blasint, const blasint, const float, const float *,
                         const blasint, const float *, const blasint, const float, float *, const blasint);

void cblas_sgemm(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE ta, const enum CBLAS_TRANSPOSE tb,
                 const blasint M, const blasint N, const blasint K, const float alpha, const float *A,
                 const blasint lda, const float *B, const blasint ldb, const float beta, float *Cm,
                 const blasint ldc)
{
    static sgemm_fn real;
    if (!real) real = (sgemm_fn)dlsym(RTLD_NEXT, "cblas_sgemm");
    sgemm_flops += 2.0 * (double)M * (double)N * (double)K;
    real(order, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, Cm, ldc);
}

static struct cdp_plan *plan_from(const char *json)
{
    struct cdp_plan *p = NULL;
    cr_assert_eq(cdp_plan_load_string(json, "test.json", NULL, &p), CDP_OK, "%s", cdp_last_error());
    struct cdp_machine_info mi = {0, NULL};
    cr_assert_eq(cdp_plan_resolve(p, &mi), CDP_OK, "%s", cdp_last_error());
    return p;
}

static cdp_device_t cpu(void)
{
    cdp_device_t d;
    cr_assert_eq(cdp_device_open(CDP_BACKEND_CPU, 0, 0, &d), CDP_OK, "%s", cdp_last_error());
    return d;
}

static void fill_inputs(struct cdp_model *m, const struct cdp_unit *u0, int B, int vocab)
{
    int64_t n = B;
    for (int d = 0; d < u0->in.ndim; d++) n *= u0->in.d[d];
    uint64_t s = 12345;
    if (u0->in_tokens) {
        int32_t *t = cdp_model_input(m, 0);
        for (int64_t i = 0; i < n; i++) t[i] = (int32_t)((s = s * 6364136223846793005ull + 1) >> 33) % vocab;
    } else {
        float *x = cdp_model_input(m, 0);
        for (int64_t i = 0; i < n; i++)
            x[i] = (float)(((s = s * 6364136223846793005ull + 1) >> 40) % 1000) / 500.0f - 1.0f;
    }
}

/* Forward + backward of one micro-batch counts exactly the GEMM work the table
 * states, for every unit type. */
static void check_counted_work(const char *json, int B)
{
    struct cdp_plan *p = plan_from(json);
    cdp_device_t dev = cpu();
    struct cdp_model *m;
    int n = (int)cdp_plan_model_units(p);
    cr_assert_eq(cdp_model_create(&p->model, 0, n, B, 1, 7, dev, &m), CDP_OK, "%s", cdp_last_error());
    const struct cdp_unit *u0 = cdp_model_unit(m, 0);
    fill_inputs(m, u0, B, (int)(u0->in_tokens ? u0->desc.vocab : 1));
    for (int i = 0; i < n; i++) {
        const struct cdp_unit *u = cdp_model_unit(m, i);
        cr_assert_geq(u->fwd_flops, 0);
        cr_assert_geq(u->act_floats, u->out_floats, "%s keeps its output", cdp_layer_name(u->desc.type));
        /* W's part of the backward; a type without parameters leaves W nothing */
        cr_assert(u->bwd_weight_flops >= 0 && u->bwd_weight_flops <= u->bwd_flops, "%s",
                  cdp_layer_name(u->desc.type));
        cr_assert_geq(u->wstate_floats, 0);
        const char *name = cdp_layer_name(u->desc.type);
        if (!u->n_params) cr_assert(u->bwd_weight_flops == 0 && u->wstate_floats == 0, "%s", name);
        else cr_assert_gt(u->wstate_floats, 0, "%s", name);
    }
    sgemm_flops = 0;
    cr_assert_eq(cdp_model_forward(m, 0), CDP_OK);
    double fwd = 0;
    for (int i = 0; i < n; i++) fwd += cdp_model_unit(m, i)->fwd_flops * B;
    cr_assert_float_eq(sgemm_flops, fwd, 0.5, "forward: counted %.0f, table %.0f", sgemm_flops, fwd);
    /* the backward of the whole range, fed with a unit gradient */
    const struct cdp_unit *ul = cdp_model_unit(m, n - 1);
    float *dout = calloc((size_t)(B * ul->out_floats), 4);
    for (int64_t i = 0; i < B * ul->out_floats; i++) dout[i] = 0.01f;
    int64_t in_n = B;
    for (int d = 0; d < u0->in.ndim; d++) in_n *= u0->in.d[d];
    float *din = calloc((size_t)in_n, 4);
    sgemm_flops = 0;
    cr_assert_eq(cdp_model_backward(m, 0, dout, u0->in_tokens ? NULL : din), CDP_OK);
    double bwd = 0;
    for (int i = 0; i < n; i++) bwd += cdp_model_unit(m, i)->bwd_flops * B;
    cr_assert_float_eq(sgemm_flops, bwd, 0.5, "backward: counted %.0f, table %.0f", sgemm_flops, bwd);
    free(dout);
    free(din);
    cdp_model_destroy(m);
    cdp_device_close(dev);
    cdp_plan_free(p);
}

Test(model, table_flops_equal_counted_gemm_work_gpt)
{
    check_counted_work("{\"model\": {\"preset\": \"gpt\", \"vocab\": 37, \"context\": 9, \"layers\": 2, "
                       "\"heads\": 3, \"embed\": 24}}", 3);
    /* longer than one 64-row attention block: causal attention skips masked blocks */
    check_counted_work("{\"model\": {\"preset\": \"gpt\", \"vocab\": 19, \"context\": 150, \"layers\": 1, "
                       "\"heads\": 2, \"embed\": 8}}", 1);
}

Test(model, table_flops_equal_counted_gemm_work_layers)
{
    check_counted_work("{\"model\": {\"input\": [3, 11, 10], \"layers\": ["
                       "{\"type\": \"conv2d\", \"out\": 5, \"kernel\": 3, \"stride\": 2, \"padding\": 1},"
                       "{\"type\": \"relu\"}, {\"type\": \"maxpool2d\", \"kernel\": 2},"
                       "{\"type\": \"conv2d\", \"out\": 4, \"kernel\": 1, \"bias\": false},"
                       "{\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": 7}, {\"type\": \"gelu\"},"
                       "{\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": 3, \"bias\": false}]}}", 2);
    check_counted_work("{\"model\": {\"input\": [6], \"layers\": ["
                       "{\"type\": \"embedding\", \"vocab\": 11, \"dim\": 8, \"context\": 6},"
                       "{\"type\": \"attention\", \"heads\": 2, \"causal\": false},"
                       "{\"type\": \"attention\", \"heads\": 1},"
                       "{\"type\": \"transformer_block\", \"heads\": 4},"
                       "{\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": 11}]}}", 1);
    /* the Llama types */
    check_counted_work("{\"model\": {\"input\": [7], \"layers\": ["
                       "{\"type\": \"embedding\", \"vocab\": 11, \"dim\": 16},"
                       "{\"type\": \"llama_block\", \"heads\": 4, \"kv_heads\": 2, \"hidden\": 24},"
                       "{\"type\": \"rmsnorm\"},"
                       "{\"type\": \"rotary_attention\", \"heads\": 2, \"kv_heads\": 1, "
                       "\"rope_scaling\": {\"type\": \"llama3\", \"factor\": 4, \"low_freq_factor\": 1, "
                       "\"high_freq_factor\": 2, \"original_context\": 8}},"
                       "{\"type\": \"swiglu_mlp\", \"hidden\": 20},"
                       "{\"type\": \"llama_block\", \"heads\": 2},"
                       "{\"type\": \"linear\", \"out\": 11, \"bias\": false}]}}", 2);
}

/* The llama preset: embedding, blocks with grouped-query attention, RMS norm and untied head. */
Test(model, table_flops_equal_counted_gemm_work_llama)
{
    check_counted_work("{\"model\": {\"preset\": \"llama\", \"vocab\": 37, \"context\": 9, \"layers\": 2, "
                       "\"heads\": 4, \"kv_heads\": 2, \"dim\": 24, \"hidden\": 40}}", 3);
    check_counted_work("{\"model\": {\"preset\": \"llama\", \"vocab\": 37, \"context\": 70, \"layers\": 2, "
                       "\"heads\": 4, \"kv_heads\": 2, \"dim\": 24, \"hidden\": 40}}", 1);
}

/* ---- activation recomputation ------------------------------------------------ */

/* What one model built in recompute mode r gives for two micro-batches in
 * flight (both forwards, then both backwards, the later first): every
 * parameter gradient, the input gradient, the outputs, the GEMM work of the
 * backward, the device's peak, and the activation floats per sample kept. */
struct rc_run {
    float *grads, *din, *out;
    int64_t n_grads, n_din, n_out;
    double bwd_flops, table_bwd;
    uint64_t peak;
};

/* shards > 1: gradients sharded (ZeRO-2) over that many replicas, this one
 * `shard`, with no reduce hook (one replica's sum is its own gradient): the
 * gradients kept are the shard's, the rest of o->grads NAN. */
static void rc_run_sharded(const char *json, enum cdp_recompute r, int B, int shards, int shard, struct rc_run *o)
{
    struct cdp_plan *p = plan_from(json);
    cdp_device_t dev = cpu();
    struct cdp_model *m;
    const int n = (int)cdp_plan_model_units(p);
    cr_assert_eq(cdp_model_create_sharded(&p->model, 0, n, B, 2, 7, r, shards, shard, dev, &m), CDP_OK, "%s",
                 cdp_last_error());
    cr_assert_eq(cdp_model_grads_sharded(m), shards > 1);
    const struct cdp_unit *u0 = cdp_model_unit(m, 0), *ul = cdp_model_unit(m, n - 1);
    int64_t in_n = B;
    for (int d = 0; d < u0->in.ndim; d++) in_n *= u0->in.d[d];
    uint64_t s = 12345;
    for (int slot = 0; slot < 2; slot++) {
        if (u0->in_tokens) {
            int32_t *t = cdp_model_input(m, slot);
            for (int64_t i = 0; i < in_n; i++)
                t[i] = (int32_t)(((s = s * 6364136223846793005ull + 1) >> 33) % (uint64_t)u0->desc.vocab);
        } else {
            float *x = cdp_model_input(m, slot);
            for (int64_t i = 0; i < in_n; i++)
                x[i] = (float)(((s = s * 6364136223846793005ull + 1) >> 40) % 1000) / 500.0f - 1.0f;
        }
    }
    cr_assert_eq(cdp_model_forward(m, 0), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_model_forward(m, 1), CDP_OK, "%s", cdp_last_error());
    o->n_out = 2 * B * ul->out_floats;
    o->out = malloc((size_t)o->n_out * 4);
    memcpy(o->out, cdp_model_output(m, 0), (size_t)o->n_out / 2 * 4);
    memcpy(o->out + o->n_out / 2, cdp_model_output(m, 1), (size_t)o->n_out / 2 * 4);
    float *dout = malloc((size_t)(B * ul->out_floats) * 4);
    for (int64_t i = 0; i < B * ul->out_floats; i++) dout[i] = 0.01f * (float)((i % 7) - 3);
    o->n_din = u0->in_tokens ? 0 : in_n;
    o->din = calloc((size_t)in_n + 1, 4);
    sgemm_flops = 0;
    cr_assert_eq(cdp_model_backward(m, 1, dout, u0->in_tokens ? NULL : o->din), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_model_backward(m, 0, dout, u0->in_tokens ? NULL : o->din), CDP_OK, "%s", cdp_last_error());
    o->bwd_flops = sgemm_flops;
    o->table_bwd = 0;
    for (int i = 0; i < n; i++)
        o->table_bwd += 2.0 * B * (cdp_model_unit(m, i)->bwd_flops + cdp_model_unit(m, i)->recompute_flops);
    o->n_grads = cdp_model_param_floats(m);
    o->grads = malloc((size_t)o->n_grads * 4);
    if (shards > 1) {
        cr_assert_eq(cdp_model_reduce_tied_grads(m), CDP_OK, "%s", cdp_last_error());
        uint64_t off, len;
        cdp_shard((uint64_t)o->n_grads, shards, shard, &off, &len);
        for (int64_t i = 0; i < o->n_grads; i++) o->grads[i] = NAN;
        for (int i = 0; i < cdp_model_tensor_count(m); i++) {
            const struct cdp_model_tensor *t = cdp_model_tensor(m, i);
            const uint64_t at = (uint64_t)(t->data - cdp_model_tensor(m, 0)->data), end = at + (uint64_t)t->numel;
            const uint64_t lo = at > off ? at : off, hi = end < off + len ? end : off + len;
            if (lo < hi) memcpy(o->grads + lo, cdp_model_reduced_grad(m, i, lo - at), (size_t)(hi - lo) * 4);
        }
    } else {
        memcpy(o->grads, cdp_model_tensor(m, 0)->grad, (size_t)o->n_grads * 4);
    }
    o->peak = cdp_device_mem_peak(dev);
    free(dout);
    cdp_model_destroy(m);
    cdp_device_close(dev);
    cdp_plan_free(p);
}

static void rc_run(const char *json, enum cdp_recompute r, int B, struct rc_run *o)
{
    rc_run_sharded(json, r, B, 1, 0, o);
}

static void rc_free(struct rc_run *o)
{
    free(o->grads);
    free(o->din);
    free(o->out);
}

/* Selective and full recomputation run the same kernels on the same inputs as
 * keeping everything: outputs and gradients are bit-identical, the backward
 * does the table's extra work (recompute_flops, counted GEMM by GEMM), and
 * the device holds less. selective_saves: the model has attention, whose
 * state selective drops and whose GEMMs it runs again. */
static void check_recompute(const char *json, int B, int selective_saves)
{
    struct rc_run base, r;
    rc_run(json, CDP_RECOMPUTE_NONE, B, &base);
    cr_assert_float_eq(base.bwd_flops, base.table_bwd, 0.5);
    uint64_t last = base.peak;
    for (int mode = CDP_RECOMPUTE_SELECTIVE; mode <= CDP_RECOMPUTE_FULL; mode++) {
        rc_run(json, (enum cdp_recompute)mode, B, &r);
        const char *name = mode == CDP_RECOMPUTE_FULL ? "full" : "selective";
        cr_assert_eq(r.n_grads, base.n_grads);
        cr_assert_eq(memcmp(r.out, base.out, (size_t)base.n_out * 4), 0, "%s: the outputs differ", name);
        cr_assert_eq(memcmp(r.grads, base.grads, (size_t)base.n_grads * 4), 0, "%s: the gradients differ", name);
        cr_assert_eq(memcmp(r.din, base.din, (size_t)base.n_din * 4), 0, "%s: the input gradient differs", name);
        cr_assert_float_eq(r.bwd_flops, r.table_bwd, 0.5, "%s: backward counted %.0f, table %.0f", name, r.bwd_flops,
                           r.table_bwd);
        if (selective_saves) cr_assert_gt(r.bwd_flops, base.bwd_flops, "%s recomputes attention", name);
        if (mode == CDP_RECOMPUTE_FULL || selective_saves) {
            cr_assert_lt(r.peak, last, "%s: peak %llu, not below %llu", name, (unsigned long long)r.peak,
                         (unsigned long long)last);
            last = r.peak;
        }
        rc_free(&r);
    }
    rc_free(&base);
}

Test(model, recomputation_is_bit_identical_and_keeps_less)
{
    check_recompute("{\"model\": {\"preset\": \"gpt\", \"vocab\": 37, \"context\": 33, \"layers\": 2, "
                    "\"heads\": 3, \"embed\": 24}}", 2, 1);
    check_recompute("{\"model\": {\"input\": [6], \"layers\": ["
                    "{\"type\": \"embedding\", \"vocab\": 11, \"dim\": 8, \"context\": 6},"
                    "{\"type\": \"attention\", \"heads\": 2, \"causal\": false},"
                    "{\"type\": \"attention\", \"heads\": 1},"
                    "{\"type\": \"transformer_block\", \"heads\": 4},"
                    "{\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": 11}]}}", 3, 1);
    /* no tail anywhere: selective keeps what none keeps */
    check_recompute("{\"model\": {\"input\": [3, 11, 10], \"layers\": ["
                    "{\"type\": \"conv2d\", \"out\": 5, \"kernel\": 3, \"stride\": 2, \"padding\": 1},"
                    "{\"type\": \"relu\"}, {\"type\": \"maxpool2d\", \"kernel\": 2},"
                    "{\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": 7}, {\"type\": \"gelu\"},"
                    "{\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": 3}]}}", 2, 0);
    check_recompute("{\"model\": {\"preset\": \"llama\", \"vocab\": 37, \"context\": 33, \"layers\": 2, "
                       "\"heads\": 4, \"kv_heads\": 2, \"dim\": 24, \"hidden\": 40}}", 2, 1);
    check_recompute("{\"model\": {\"input\": [7], \"layers\": ["
                       "{\"type\": \"embedding\", \"vocab\": 11, \"dim\": 16},"
                       "{\"type\": \"llama_block\", \"heads\": 4, \"kv_heads\": 2, \"hidden\": 24},"
                       "{\"type\": \"rmsnorm\"},"
                       "{\"type\": \"rotary_attention\", \"heads\": 2, \"kv_heads\": 1, "
                       "\"rope_scaling\": {\"type\": \"llama3\", \"factor\": 4, \"low_freq_factor\": 1, "
                       "\"high_freq_factor\": 2, \"original_context\": 8}},"
                       "{\"type\": \"swiglu_mlp\", \"hidden\": 20},"
                       "{\"type\": \"llama_block\", \"heads\": 2},"
                       "{\"type\": \"linear\", \"out\": 11, \"bias\": false}]}}", 2, 1);
}

/* ZeRO-2's sharded gradients on one replica: each unit's gradient, made in
 * the window after each backward and added to the shard, and the tied
 * tensors kept whole, give the whole model's gradients on every shard (the
 * shards together cover them all) within rounding (a sum of per-micro-batch
 * gradients, not one accumulated in place), with less memory. */
static void check_sharded(const char *json, int B, int shards)
{
    struct rc_run base, r;
    rc_run(json, CDP_RECOMPUTE_NONE, B, &base);
    int64_t covered = 0;
    for (int k = 0; k < shards; k++) {
        rc_run_sharded(json, CDP_RECOMPUTE_NONE, B, shards, k, &r);
        cr_assert_eq(memcmp(r.out, base.out, (size_t)base.n_out * 4), 0, "shard %d: the outputs differ", k);
        cr_assert_eq(memcmp(r.din, base.din, (size_t)base.n_din * 4), 0, "shard %d: the input gradient differs", k);
        double num = 0, den = 0;
        for (int64_t i = 0; i < base.n_grads; i++) {
            if (isnan(r.grads[i])) continue;
            covered++;
            num += ((double)r.grads[i] - base.grads[i]) * ((double)r.grads[i] - base.grads[i]);
            den += (double)base.grads[i] * base.grads[i];
        }
        const double e = sqrt(num / (den > 0 ? den : 1));
        cr_assert_leq(e, 1e-6, "shard %d of %d: gradients differ by %.3g", k, shards, e);
        cr_assert_lt(r.peak, base.peak, "shard %d: peak %llu, not below %llu", k, (unsigned long long)r.peak,
                     (unsigned long long)base.peak);
        rc_free(&r);
    }
    cr_assert_eq(covered, base.n_grads, "the shards cover every gradient once");
    rc_free(&base);
}

Test(model, sharded_gradients_are_the_whole_models)
{
    /* tied head: the embedding's table is kept whole and reduced at the end */
    check_sharded("{\"model\": {\"preset\": \"gpt\", \"vocab\": 37, \"context\": 9, \"layers\": 3, "
                  "\"heads\": 3, \"embed\": 24}}", 2, 3);
    check_sharded("{\"model\": {\"preset\": \"mlp\", \"input\": [12], \"hidden\": [32, 24, 16], \"classes\": 5}}", 3,
                  2);
    check_sharded("{\"model\": {\"preset\": \"llama\", \"vocab\": 37, \"context\": 9, \"layers\": 2, "
                       "\"heads\": 4, \"kv_heads\": 2, \"dim\": 24, \"hidden\": 40}}", 2, 2);
}

/* ---- split backward ----------------------------------------------------------- */

/* How a run takes its three micro-batches' backwards (forwards of slots 0, 1,
 * 2 first; backwards from slot 2 down, as a pipeline's last stage would):
 * combined; every B, then every W (W-state slots permuted); and interleaved,
 * a W before the next Bs, its W-state slot reused at once. */
enum sb_order { SB_COMBINED, SB_DEFERRED, SB_INTERLEAVED };

struct sb_run {
    float *grads, *din;
    int64_t n_grads, n_din;
    double b_flops, w_flops, table_b, table_w; /* counted GEMM work of the Bs and the Ws, and the table's */
    uint64_t peak_grew, wstate_table, wstate_held;
    int reduces;
};

static cdp_status count_reduce(void *ctx, float *buf, uint64_t n, uint64_t from, uint64_t count)
{
    (void)buf, (void)n, (void)from, (void)count;
    ++*(int *)ctx;
    return CDP_OK;
}

/* loss: the range ends with its loss (targets; dout NULL), else a given
 * output gradient. shards > 1: sharded gradients, this replica shard 0, with
 * a reduce hook that counts (one replica: the sum is its own). Everything
 * passes through device buffers, so dev may be a GPU's. */
static void sb_run(const char *json, enum cdp_recompute r, int B, int loss, int shards, enum sb_order order,
                   cdp_device_t (*open_dev)(void), struct sb_run *o)
{
    struct cdp_plan *p = plan_from(json);
    cdp_device_t dev = open_dev(); /* a fresh one: its high-water mark is this run's */
    struct cdp_model *m;
    const int n = (int)cdp_plan_model_units(p), S = 3;
    memset(o, 0, sizeof *o);
    cr_assert_eq(cdp_model_create_sharded(&p->model, 0, n, B, S, 7, r, shards, 0, dev, &m), CDP_OK, "%s",
                 cdp_last_error());
    if (shards > 1) cdp_model_set_grad_reduce(m, count_reduce, &o->reduces);
    const struct cdp_unit *u0 = cdp_model_unit(m, 0), *ul = cdp_model_unit(m, n - 1);
    int64_t in_n = B;
    for (int d = 0; d < u0->in.ndim; d++) in_n *= u0->in.d[d];
    uint64_t sd = 12345;
    void *host_in = malloc((size_t)in_n * 4);
    for (int slot = 0; slot < S; slot++) {
        for (int64_t i = 0; i < in_n; i++) {
            sd = sd * 6364136223846793005ull + 1;
            if (u0->in_tokens) ((int32_t *)host_in)[i] = (int32_t)((sd >> 33) % (uint64_t)u0->desc.vocab);
            else ((float *)host_in)[i] = (float)((sd >> 40) % 1000) / 500.0f - 1.0f;
        }
        cr_assert_eq(cdp_device_write(dev, cdp_model_input(m, slot), host_in, (uint64_t)in_n * 4), CDP_OK);
        cr_assert_eq(cdp_model_forward(m, slot), CDP_OK, "%s", cdp_last_error());
        if (loss) {
            const int64_t V = ul->out.d[ul->out.ndim - 1], rows = B * ul->out_floats / V;
            int32_t *tg = malloc((size_t)rows * 4);
            for (int64_t i = 0; i < rows; i++) tg[i] = (int32_t)((i * 7 + slot) % V);
            double ls;
            cr_assert_eq(cdp_model_loss(m, slot, tg, 1.0f / (float)(3 * rows), &ls), CDP_OK, "%s", cdp_last_error());
            free(tg);
        }
    }
    free(host_in);
    const int64_t n_out = B * ul->out_floats;
    float *hd = malloc((size_t)n_out * 4);
    for (int64_t i = 0; i < n_out; i++) hd[i] = 0.01f * (float)((i % 7) - 3);
    cdp_buffer_t dout_b, din_b;
    cr_assert_eq(cdp_buffer_create(dev, (uint64_t)n_out * 4, &dout_b), CDP_OK);
    cr_assert_eq(cdp_buffer_create(dev, (uint64_t)in_n * 4, &din_b), CDP_OK);
    cr_assert_eq(cdp_buffer_write(dout_b, 0, hd, (uint64_t)n_out * 4), CDP_OK);
    cr_assert_eq(cdp_buffer_memset(din_b, 0, 0, (uint64_t)in_n * 4), CDP_OK);
    free(hd);
    const float *dout = loss ? NULL : cdp_buffer_data(dout_b);
    float *din = u0->in_tokens ? NULL : cdp_buffer_data(din_b);
    for (int i = 0; i < n; i++) {
        const struct cdp_unit *u = cdp_model_unit(m, i);
        o->table_b += 3.0 * B * (u->bwd_flops - u->bwd_weight_flops + u->recompute_flops);
        o->table_w += 3.0 * B * (u->bwd_weight_flops + (u->n_params ? u->recompute_flops : 0));
        o->wstate_table += 3ull * (uint64_t)B * (uint64_t)u->wstate_floats * 4;
    }
    if (order == SB_COMBINED) {
        sgemm_flops = 0;
        for (int slot = S - 1; slot >= 0; slot--)
            cr_assert_eq(cdp_model_backward(m, slot, dout, din), CDP_OK, "%s", cdp_last_error());
        o->b_flops = sgemm_flops;
    } else {
        const uint64_t peak = cdp_device_mem_peak(dev);
        cr_assert_eq(cdp_device_mem_in_use(dev), peak, "nothing transient before");
        cr_assert_eq(cdp_model_set_split_backward(m, S), CDP_OK, "%s", cdp_last_error());
        o->peak_grew = cdp_device_mem_peak(dev) - peak;
        struct cdp_model_bytes mb;
        cdp_model_memory(m, &mb);
        o->wstate_held = mb.wstate;
        /* B(slot) into W-state ws[slot]; the Ws in the same slot order as the combined backwards */
        const int ws_deferred[3] = {1, 2, 0}, ws_inter[3] = {1, 0, 1};
        const int *ws = order == SB_DEFERRED ? ws_deferred : ws_inter;
#define SB_B(slot)                                                                                                   \
    do {                                                                                                             \
        sgemm_flops = 0;                                                                                             \
        cr_assert_eq(cdp_model_backward_input(m, slot, ws[slot], dout, din), CDP_OK, "%s", cdp_last_error());      \
        o->b_flops += sgemm_flops;                                                                                   \
    } while (0)
#define SB_W(slot)                                                                                                   \
    do {                                                                                                             \
        sgemm_flops = 0;                                                                                             \
        cr_assert_eq(cdp_model_backward_weight(m, slot, ws[slot]), CDP_OK, "%s", cdp_last_error());                \
        o->w_flops += sgemm_flops;                                                                                   \
    } while (0)
        if (order == SB_DEFERRED) {
            SB_B(2);
            SB_B(1);
            SB_B(0);
            SB_W(2);
            SB_W(1);
            SB_W(0);
        } else {
            SB_B(2);
            SB_W(2);
            SB_B(1);
            SB_B(0);
            SB_W(1);
            SB_W(0);
        }
#undef SB_B
#undef SB_W
    }
    o->n_din = din ? in_n : 0;
    o->din = calloc((size_t)in_n + 1, 4);
    if (din) cr_assert_eq(cdp_buffer_read(din_b, 0, o->din, (uint64_t)in_n * 4), CDP_OK);
    o->n_grads = cdp_model_param_floats(m);
    o->grads = calloc((size_t)o->n_grads + 1, 4);
    if (shards > 1) {
        cr_assert_eq(cdp_model_reduce_tied_grads(m), CDP_OK, "%s", cdp_last_error());
        uint64_t off, len;
        cdp_shard((uint64_t)o->n_grads, shards, 0, &off, &len);
        for (int i = 0; i < cdp_model_tensor_count(m); i++) {
            const struct cdp_model_tensor *t = cdp_model_tensor(m, i);
            const uint64_t at = (uint64_t)(t->data - cdp_model_tensor(m, 0)->data), end = at + (uint64_t)t->numel;
            const uint64_t lo = at > off ? at : off, hi = end < off + len ? end : off + len;
            if (lo < hi)
                cr_assert_eq(cdp_device_read(dev, o->grads + lo, cdp_model_reduced_grad(m, i, lo - at), (hi - lo) * 4),
                             CDP_OK);
        }
    } else if (o->n_grads) {
        cr_assert_eq(cdp_device_read(dev, o->grads, cdp_model_tensor(m, 0)->grad, (uint64_t)o->n_grads * 4), CDP_OK);
    }
    cdp_buffer_destroy(dout_b);
    cdp_buffer_destroy(din_b);
    /* 0 frees the W-states */
    const uint64_t held = cdp_device_mem_in_use(dev);
    cr_assert_eq(cdp_model_set_split_backward(m, 0), CDP_OK);
    cr_assert_eq(held - cdp_device_mem_in_use(dev), o->wstate_held);
    cdp_model_destroy(m);
    cdp_device_close(dev);
    cdp_plan_free(p);
}

static void sb_free(struct sb_run *o)
{
    free(o->grads);
    free(o->din);
}

/* B then W gives the combined backward's bits, deferred or interleaved, in
 * every recompute mode; the Bs and the Ws do the table's work (W computes
 * again what B did); the W-states add exactly their figure to the peak. */
static void check_split_on(const char *json, int B, int loss, int shards, cdp_device_t (*dev)(void), int count_work)
{
    static const char *const mode_name[] = {"none", "selective", "full"};
    static const char *const order_name[] = {"combined", "deferred", "interleaved"};
    for (int mode = CDP_RECOMPUTE_NONE; mode <= CDP_RECOMPUTE_FULL; mode++) {
        struct sb_run base, r;
        sb_run(json, (enum cdp_recompute)mode, B, loss, shards, SB_COMBINED, dev, &base);
        cr_assert_gt(base.n_grads, 0);
        for (int order = SB_DEFERRED; order <= SB_INTERLEAVED; order++) {
            sb_run(json, (enum cdp_recompute)mode, B, loss, shards, (enum sb_order)order, dev, &r);
            const char *mn = mode_name[mode], *on = order_name[order];
            cr_assert_eq(r.n_grads, base.n_grads);
            cr_assert_eq(memcmp(r.grads, base.grads, (size_t)base.n_grads * 4), 0, "%s, %s: the gradients differ", on,
                         mn);
            cr_assert_eq(memcmp(r.din, base.din, (size_t)base.n_din * 4), 0, "%s, %s: the input gradient differs", on,
                         mn);
            cr_assert_eq(r.reduces, base.reduces, "%s, %s: %d reductions, the combined backward's %d", on, mn,
                         r.reduces, base.reduces);
            cr_assert_gt(r.wstate_table, 0);
            cr_assert_eq(r.peak_grew, r.wstate_table, "%s, %s: the peak grew by %llu, the W-states are %llu", on, mn,
                         (unsigned long long)r.peak_grew, (unsigned long long)r.wstate_table);
            cr_assert_eq(r.wstate_held, r.wstate_table);
            if (count_work) {
                cr_assert_float_eq(r.b_flops, r.table_b, 0.5, "%s, %s: B counted %.0f, table %.0f", on, mn, r.b_flops,
                                   r.table_b);
                cr_assert_float_eq(r.w_flops, r.table_w, 0.5, "%s, %s: W counted %.0f, table %.0f", on, mn, r.w_flops,
                                   r.table_w);
            }
            sb_free(&r);
        }
        sb_free(&base);
    }
}

static void check_split(const char *json, int B, int loss)
{
    check_split_on(json, B, loss, 1, cpu, 1);
}

/* Every type with parameters has both halves (layer_def.h); the others neither. */
Test(model, every_type_with_parameters_splits_its_backward)
{
    for (int t = 0; t < CDP_LAYER_TYPE_COUNT; t++) {
        const struct cdp_layer_def *d = cdp_layer_def((enum cdp_layer_type)t);
        const int has_params = d->build != NULL;
        cr_assert_eq(d->backward_input != NULL, has_params, "%s: backward_input", d->name);
        cr_assert_eq(d->backward_weight != NULL, has_params, "%s: backward_weight", d->name);
    }
}

/* Every layer type: explicit lists given an output gradient. */
Test(model, split_backward_is_the_combined_backwards_bits_for_every_layer_type)
{
    check_split("{\"model\": {\"input\": [3, 11, 10], \"layers\": ["
                "{\"type\": \"conv2d\", \"out\": 5, \"kernel\": 3, \"stride\": 2, \"padding\": 1},"
                "{\"type\": \"relu\"}, {\"type\": \"maxpool2d\", \"kernel\": 2},"
                "{\"type\": \"conv2d\", \"out\": 4, \"kernel\": 1, \"bias\": false},"
                "{\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": 7}, {\"type\": \"gelu\"},"
                "{\"type\": \"layernorm\"}, {\"type\": \"silu\"},"
                "{\"type\": \"linear\", \"out\": 3, \"bias\": false}]}}",
                2, 0);
    check_split("{\"model\": {\"input\": [6], \"layers\": ["
                "{\"type\": \"embedding\", \"vocab\": 11, \"dim\": 8, \"context\": 6},"
                "{\"type\": \"attention\", \"heads\": 2, \"causal\": false},"
                "{\"type\": \"attention\", \"heads\": 1},"
                "{\"type\": \"transformer_block\", \"heads\": 4},"
                "{\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": 11}]}}", 2, 0);
    /* a float input: the first unit's input gradient, a block's included */
    check_split("{\"model\": {\"input\": [5, 8], \"layers\": [{\"type\": \"layernorm\"},"
                "{\"type\": \"transformer_block\", \"heads\": 2}, {\"type\": \"attention\", \"heads\": 2}]}}", 2, 0);
}

/* GPT (tied and untied head, the loss's gradient computed again at W) and MLP
 * presets ending with their loss. */
Test(model, split_backward_is_the_combined_backwards_bits_for_gpt_and_mlp)
{
    check_split("{\"model\": {\"preset\": \"gpt\", \"vocab\": 37, \"context\": 33, \"layers\": 2, "
                "\"heads\": 3, \"embed\": 24}}", 2, 1);
    check_split("{\"model\": {\"preset\": \"gpt\", \"vocab\": 37, \"context\": 9, \"layers\": 1, "
                "\"heads\": 3, \"embed\": 24, \"tie_embeddings\": false}}", 2, 1);
    check_split("{\"model\": {\"preset\": \"mlp\", \"input\": [12], \"hidden\": [32, 24], \"classes\": 5}}", 3, 1);
    check_split("{\"model\": {\"preset\": \"llama\", \"vocab\": 37, \"context\": 9, \"layers\": 2, "
                       "\"heads\": 4, \"kv_heads\": 2, \"dim\": 24, \"hidden\": 40}}", 2, 1);
    check_split("{\"model\": {\"preset\": \"llama\", \"vocab\": 37, \"context\": 9, \"layers\": 1, "
                "\"heads\": 2, \"kv_heads\": 1, \"dim\": 8, \"tie_embeddings\": true}}", 2, 1);
}

/* Every Llama layer type in a list given an output gradient, a float input first. */
Test(model, split_backward_is_the_combined_backwards_bits_for_the_llama_types)
{
    check_split("{\"model\": {\"input\": [7], \"layers\": ["
                       "{\"type\": \"embedding\", \"vocab\": 11, \"dim\": 16},"
                       "{\"type\": \"llama_block\", \"heads\": 4, \"kv_heads\": 2, \"hidden\": 24},"
                       "{\"type\": \"rmsnorm\"},"
                       "{\"type\": \"rotary_attention\", \"heads\": 2, \"kv_heads\": 1, "
                       "\"rope_scaling\": {\"type\": \"llama3\", \"factor\": 4, \"low_freq_factor\": 1, "
                       "\"high_freq_factor\": 2, \"original_context\": 8}},"
                       "{\"type\": \"swiglu_mlp\", \"hidden\": 20},"
                       "{\"type\": \"llama_block\", \"heads\": 2},"
                       "{\"type\": \"linear\", \"out\": 11, \"bias\": false}]}}", 2, 0);
    check_split("{\"model\": {\"input\": [5, 8], \"layers\": [{\"type\": \"rotary_attention\", \"heads\": 4, "
                "\"kv_heads\": 2}, {\"type\": \"swiglu_mlp\"}, {\"type\": \"llama_block\", \"heads\": 2}, "
                "{\"type\": \"rmsnorm\"}]}}", 2, 0);
}

/* Sharded gradients: W reduces each unit's window where the combined backward does. */
Test(model, split_backward_reduces_sharded_gradients_as_the_combined_backward)
{
    check_split_on("{\"model\": {\"preset\": \"gpt\", \"vocab\": 37, \"context\": 9, \"layers\": 2, "
                   "\"heads\": 3, \"embed\": 24}}", 2, 1, 3, cpu, 0);
    check_split_on("{\"model\": {\"preset\": \"mlp\", \"input\": [12], \"hidden\": [32, 24], \"classes\": 5}}", 2, 1, 2,
                   cpu, 0);
}

/* The stand-in CUDA module of tests/fake-cuda: memory the host may not
 * address (everything staged as for a GPU), the CPU kernels behind it. */
static cdp_device_t fake_cuda(void)
{
    const char *fake = getenv("CDP_FAKE_CUDA_DIR");
    cr_assert_not_null(fake, "CDP_FAKE_CUDA_DIR is not set (run the tests through meson test)");
    setenv("CDP_MODULE_DIR", fake, 1);
    cdp_device_t d = NULL;
    cr_assert_eq(cdp_device_open(CDP_BACKEND_CUDA, 0, 0, &d), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_device_host_visible(d), 0);
    return d;
}

Test(model, split_backward_on_a_device_the_host_cannot_address)
{
    check_split_on("{\"model\": {\"preset\": \"gpt\", \"vocab\": 37, \"context\": 9, \"layers\": 2, "
                   "\"heads\": 3, \"embed\": 24}}", 2, 1, 1, fake_cuda, 0);
    check_split_on("{\"model\": {\"preset\": \"mlp\", \"input\": [12], \"hidden\": [32, 24], \"classes\": 5}}", 2, 1, 2,
                   fake_cuda, 0);
}

/* Bad calls are errors, not crashes. */
Test(model, split_backward_refuses_bad_slots)
{
    struct cdp_plan *p = plan_from("{\"model\": {\"preset\": \"gpt\", \"vocab\": 37, \"context\": 9, \"layers\": 1, "
                                   "\"heads\": 3, \"embed\": 24}}");
    cdp_device_t dev = cpu();
    struct cdp_model *m;
    cr_assert_eq(cdp_model_create(&p->model, 0, 3, 2, 2, 7, dev, &m), CDP_OK);
    cr_assert_eq(cdp_model_backward_input(m, 0, 0, NULL, NULL), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "no W-state slots"), "%s", cdp_last_error());
    cr_assert_eq(cdp_model_set_split_backward(m, -1), CDP_ERR_INVALID);
    cr_assert_eq(cdp_model_set_split_backward(m, 2), CDP_OK);
    cr_assert_eq(cdp_model_wstate_slots(m), 2);
    cr_assert_eq(cdp_model_backward_weight(m, 0, 2), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "W-state slot 2 of 2"), "%s", cdp_last_error());
    cr_assert_eq(cdp_model_backward_input(m, 2, 0, NULL, NULL), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "slot 2 of a model with 2"), "%s", cdp_last_error());
    /* the head's W computes the loss's gradient again: a given one is refused */
    float *dout = calloc((size_t)2 * 9 * 37, 4);
    cr_assert_eq(cdp_model_backward_input(m, 0, 0, dout, NULL), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "lm_head"), "%s", cdp_last_error());
    free(dout);
    cdp_model_destroy(m);
    cdp_device_close(dev);
    cdp_plan_free(p);
}

Test(model, table_memory_matches_hand_counts)
{
    struct cdp_plan *p = plan_from("{\"model\": {\"preset\": \"gpt\", \"vocab\": 50, \"context\": 4, "
                                   "\"layers\": 1, \"heads\": 2, \"embed\": 8}}");
    struct cdp_unit *u;
    int n;
    cr_assert_eq(cdp_units_build(&p->model, &u, &n), CDP_OK);
    cr_assert_eq(n, 3);
    /* embedding: wte 50x8 + wpe 4x8; keeps its output 4x8 */
    cr_assert_eq(u[0].param_count, 432);
    cr_assert_eq(u[0].act_floats, 32);
    /* block: 12C^2 + 13C = 872; keeps out, ln1, qkv(3), atty, res2, ln2, fch(4), gelu(4) = 16 TC,
     * 4 T of norm statistics and NH T^2 of attention probabilities */
    cr_assert_eq(u[1].param_count, 872);
    cr_assert_eq(u[1].act_floats, 16 * 32 + 16 + 2 * 16);
    cr_assert_eq(u[1].out_floats, 32);
    /* matrices 24 T C^2, attention 4 T^2 C (T = 4 fits one causal block) */
    cr_assert_float_eq(u[1].fwd_flops, 24.0 * 4 * 64 + 4.0 * 16 * 8, 1e-9);
    /* head: ln_f (16) and the tied vocabulary matrix (not counted again) */
    cr_assert_eq(u[2].param_count, 16);
    cr_assert_eq(u[2].params[2].tied_unit, 0);
    cr_assert_eq(u[2].act_floats, 4 * 50 + 32 + 8);
    cr_assert_eq(u[0].param_count + u[1].param_count + u[2].param_count, cdp_plan_param_count(p));
    /* split backward: W does the parameter products (block 24 T C^2, head 2 T C V) and holds copies
     * of output gradients: the embedding's T C, the block's 11 T C (dout, dfch 4, dln2, dres2, dqkv 3,
     * dln1), the head's dln T C (its logits' gradient is computed again) */
    cr_assert_float_eq(u[0].bwd_weight_flops, 0, 1e-9);
    cr_assert_eq(u[0].wstate_floats, 32);
    cr_assert_float_eq(u[1].bwd_weight_flops, 24.0 * 4 * 64, 1e-9);
    cr_assert_eq(u[1].wstate_floats, 11 * 32);
    cr_assert_float_eq(u[2].bwd_weight_flops, 2.0 * 4 * 8 * 50, 1e-9);
    cr_assert_eq(u[2].wstate_floats, 32);
    struct cdp_unit_bytes ub;
    cdp_unit_bytes(&u[1], 3, CDP_LOSS_CROSS_ENTROPY, &ub);
    cr_assert_eq(ub.wstate_bytes, 3 * 11 * 32 * 4);
    free(u);
    cdp_plan_free(p);
}

/* The llama preset's units by hand: T 4, C 8, 2 heads of 4, 1 key/value head (KVD 4), hidden 12,
 * vocab 50, untied head. */
Test(model, table_memory_matches_hand_counts_llama)
{
    struct cdp_plan *p = plan_from("{\"model\": {\"preset\": \"llama\", \"vocab\": 50, \"context\": 4, "
                                   "\"layers\": 1, \"heads\": 2, \"kv_heads\": 1, \"dim\": 8, \"hidden\": 12}}");
    struct cdp_unit *u;
    int n;
    cr_assert_eq(cdp_units_build(&p->model, &u, &n), CDP_OK);
    cr_assert_eq(n, 3);
    /* embedding: wte 50x8, no positions */
    cr_assert_eq(u[0].n_params, 1);
    cr_assert_eq(u[0].param_count, 400);
    /* block: 2 C^2 (q, o) + 2 C KVD (k, v) + 3 C H + 2 C = 128 + 64 + 288 + 16 */
    cr_assert_eq(u[1].n_params, 9);
    cr_assert_str_eq(u[1].params[0].name, "input_layernorm.weight");
    cr_assert_str_eq(u[1].params[2].name, "self_attn.k_proj.weight");
    cr_assert_eq(u[1].params[2].shape[0], 4);
    cr_assert_str_eq(u[1].params[5].name, "post_attention_layernorm.weight");
    cr_assert_str_eq(u[1].params[8].name, "mlp.down_proj.weight");
    cr_assert_eq(u[1].param_count, 496);
    /* kept: out, 1/rms, qkv (3), res2, 1/rms, gate, up (H each); tail: ln1, atty, ln2, the product (H);
     * attention probabilities NH T^2 */
    cr_assert_eq(u[1].act_floats, 4 * (8 * 8 + 3 * 12 + 2) + 2 * 16);
    cr_assert_eq(u[1].tail_floats, 4 * (3 * 8 + 12));
    /* matrices 2 T (2 C^2 + 2 C KVD + 3 C H), attention 4 T^2 C */
    cr_assert_float_eq(u[1].fwd_flops, 2.0 * 4 * (128 + 64 + 288) + 4.0 * 16 * 8, 1e-9);
    cr_assert_float_eq(u[1].bwd_weight_flops, 2.0 * 4 * (128 + 64 + 288), 1e-9);
    /* W-state: dout, dgate, dup, dln2, dres2, dq, dk, dv, dln1 */
    cr_assert_eq(u[1].wstate_floats, 4 * (5 * 8 + 2 * 12 + 2 * 4));
    /* head: the RMS norm's weight and the untied vocabulary matrix */
    cr_assert_str_eq(u[2].params[0].name, "norm.weight");
    cr_assert_str_eq(u[2].params[1].name, "lm_head.weight");
    cr_assert_eq(u[2].param_count, 8 + 400);
    cr_assert_eq(u[2].act_floats, 4 * 50 + 32 + 4);
    cr_assert_eq(u[0].param_count + u[1].param_count + u[2].param_count, cdp_plan_param_count(p));
    free(u);
    cdp_plan_free(p);
}

/* Llama's MLP width rule: Meta's sizes. */
Test(model, llama_hidden_rule_gives_metas_widths)
{
    cr_assert_eq(cdp_llama_hidden(4096, 256, 0), 11008);    /* Llama 2 7B */
    cr_assert_eq(cdp_llama_hidden(5120, 256, 0), 13824);    /* Llama 2 13B */
    cr_assert_eq(cdp_llama_hidden(8192, 4096, 1.3), 28672); /* Llama 2 70B */
    cr_assert_eq(cdp_llama_hidden(4096, 1024, 1.3), 14336); /* Llama 3 8B */
    cr_assert_eq(cdp_llama_hidden(128, 256, 0), 512);
}

Test(model, initialisation_is_independent_of_the_partition)
{
    struct cdp_plan *p = plan_from("{\"model\": {\"preset\": \"gpt\", \"vocab\": 40, \"context\": 5, "
                                   "\"layers\": 3, \"heads\": 2, \"embed\": 8}}");
    cdp_device_t dev = cpu();
    struct cdp_model *whole, *a, *b;
    cr_assert_eq(cdp_model_create(&p->model, 0, 5, 2, 1, 99, dev, &whole), CDP_OK);
    cr_assert_eq(cdp_model_create(&p->model, 0, 2, 2, 1, 99, dev, &a), CDP_OK);
    cr_assert_eq(cdp_model_create(&p->model, 2, 5, 2, 1, 99, dev, &b), CDP_OK);
    cr_assert_eq(cdp_model_tensor_count(a) + cdp_model_tensor_count(b),
                 cdp_model_tensor_count(whole) + 1, "the last stage holds its own copy of the tied wte");
    struct cdp_model *parts[2] = {a, b};
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < cdp_model_tensor_count(parts[k]); i++) {
            struct cdp_model_tensor *t = cdp_model_tensor(parts[k], i);
            struct cdp_model_tensor *w = NULL;
            for (int j = 0; j < cdp_model_tensor_count(whole); j++)
                if (!strcmp(cdp_model_tensor(whole, j)->name, t->name)) w = cdp_model_tensor(whole, j);
            cr_assert_not_null(w, "%s", t->name);
            cr_assert_eq(memcmp(w->data, t->data, (size_t)t->numel * 4), 0, "%s differs", t->name);
        }
    }
    cdp_model_destroy(whole);
    cdp_model_destroy(a);
    cdp_model_destroy(b);
    cdp_device_close(dev);
    cdp_plan_free(p);
}

/* The golden Llama of tools/gen_golden_llama.py: transformers' LlamaForCausalLM in
 * float64, grouped-query attention, llama3 rope scaling, untied head. */
static const char *golden_llama_plan =
    "{\"model\": {\"preset\": \"llama\", \"vocab\": 48, \"context\": 12, \"layers\": 2, \"dim\": 32, "
    "\"heads\": 4, \"kv_heads\": 2, \"hidden\": 48, \"rope_theta\": 10000, \"norm_eps\": 1e-5, "
    "\"rope_scaling\": {\"type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, "
    "\"high_freq_factor\": 4, \"original_context\": 64}}}";

static const char *golden_plan =
    "{\"model\": {\"preset\": \"gpt\", \"vocab\": 32, \"context\": 8, \"layers\": 2, \"heads\": 2, "
    "\"embed\": 16}}";

static double rel_err(const float *a, const float *ref, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* One forward + backward of the golden Llama against transformers (float64
 * there, fp32 here): the loss within 1e-5 relative, every gradient within
 * 1e-4 relative (two orders of magnitude above fp32 summation noise; a wrong
 * rotation pairing, head grouping or norm gives errors of order one). */
Test(model, golden_llama_step_matches_transformers)
{
    enum { B = 2, T = 12 };
    struct cdp_plan *p = plan_from(golden_llama_plan);
    const char *path = cdp_test_source_path("tests/fixtures/golden/llama-tiny.safetensors");
    struct cdp_safetensors_file *f;
    cr_assert_eq(cdp_safetensors_open(path, &f), CDP_OK, "%s", cdp_last_error());
    cdp_device_t dev = cpu();
    struct cdp_model *m;
    cr_assert_eq(cdp_model_create(&p->model, 0, 4, B, 1, 1, dev, &m), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_model_load(m, path), CDP_OK, "%s", cdp_last_error());
    const struct cdp_safetensors_tensor *tok = cdp_safetensors_find(f, "tokens"),
                                        *tgt = cdp_safetensors_find(f, "targets");
    cr_assert(tok && tgt);
    memcpy(cdp_model_input(m, 0), tok->data, B * T * 4);
    float want_loss;
    cr_assert_eq(cdp_safetensors_read_f32(f, "loss", 1, (int64_t[]){1}, &want_loss), CDP_OK);
    double loss = 0;
    cr_assert_eq(cdp_model_forward(m, 0), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_model_loss(m, 0, tgt->data, 1.0f / (B * T), &loss), CDP_OK);
    loss /= B * T;
    cr_assert_float_eq(loss, want_loss, 1e-5 * want_loss, "loss %.8f, transformers %.8f", loss, want_loss);
    cr_assert_eq(cdp_model_backward(m, 0, NULL, NULL), CDP_OK, "%s", cdp_last_error());
    double worst = 0;
    int checked = 0;
    for (int i = 0; i < cdp_model_tensor_count(m); i++) {
        struct cdp_model_tensor *t = cdp_model_tensor(m, i);
        char name[96];
        snprintf(name, sizeof name, "grad.%s", t->name);
        float *ref = malloc((size_t)t->numel * 4);
        cr_assert_eq(cdp_safetensors_read_f32(f, name, t->ndim, t->shape, ref), CDP_OK, "%s", cdp_last_error());
        double e = rel_err(t->grad, ref, t->numel);
        cr_assert_leq(e, 1e-4, "gradient of %s: relative error %.3g", t->name, e);
        if (e > worst) worst = e;
        checked++;
        free(ref);
    }
    /* wte, 9 per block, the final norm and the untied head */
    cr_assert_eq(checked, 1 + 2 * 9 + 2);
    cr_log_info("golden Llama step: loss %.8f vs %.8f, worst gradient relative error %.3g", loss, want_loss, worst);
    cdp_model_destroy(m);
    cdp_safetensors_close(f);
    cdp_device_close(dev);
    cdp_plan_free(p);
}

/* One forward + backward + AdamW step of a tiny GPT-2 against PyTorch
 * (tools/gen_golden.py, float64). fp32 here against float64 there: 1e-4
 * relative leaves two orders of magnitude for summation order. */
Test(model, golden_gpt_step_matches_pytorch)
{
    struct cdp_plan *p = plan_from(golden_plan);
    const char *path = cdp_test_source_path("tests/fixtures/golden/gpt-tiny.safetensors");
    struct cdp_safetensors_file *f;
    cr_assert_eq(cdp_safetensors_open(path, &f), CDP_OK, "%s", cdp_last_error());
    cdp_device_t dev = cpu();
    struct cdp_model *m;
    cr_assert_eq(cdp_model_create(&p->model, 0, 4, 2, 1, 1, dev, &m), CDP_OK);
    cr_assert_eq(cdp_model_load(m, path), CDP_OK, "%s", cdp_last_error());
    const struct cdp_safetensors_tensor *tok = cdp_safetensors_find(f, "tokens"),
                                        *tgt = cdp_safetensors_find(f, "targets");
    cr_assert(tok && tgt);
    memcpy(cdp_model_input(m, 0), tok->data, 2 * 8 * 4);
    float want_loss;
    cr_assert_eq(cdp_safetensors_read_f32(f, "loss", 1, (int64_t[]){1}, &want_loss), CDP_OK);
    double loss = 0;
    cr_assert_eq(cdp_model_forward(m, 0), CDP_OK);
    cr_assert_eq(cdp_model_loss(m, 0, tgt->data, 1.0f / 16, &loss), CDP_OK);
    loss /= 16;
    cr_assert_float_eq(loss, want_loss, 1e-5 * want_loss, "loss %.8f, PyTorch %.8f", loss, want_loss);
    cr_assert_eq(cdp_model_backward(m, 0, NULL, NULL), CDP_OK);
    double worst = 0;
    for (int i = 0; i < cdp_model_tensor_count(m); i++) {
        struct cdp_model_tensor *t = cdp_model_tensor(m, i);
        char name[96];
        snprintf(name, sizeof name, "grad.%s", t->name);
        float *ref = malloc((size_t)t->numel * 4);
        cr_assert_eq(cdp_safetensors_read_f32(f, name, t->ndim, t->shape, ref), CDP_OK, "%s", cdp_last_error());
        double e = rel_err(t->grad, ref, t->numel);
        cr_assert_leq(e, 1e-4, "gradient of %s: relative error %.3g", t->name, e);
        if (e > worst) worst = e;
        /* The optimizer is checked on PyTorch's gradients: AdamW's first step
         * moves every weight by about lr * sign(g), so where g is exactly zero in
         * float64 (the key bias: softmax ignores a constant added to every key)
         * fp32 rounding noise of 1e-9 would still move it by lr. */
        memcpy(t->grad, ref, (size_t)t->numel * 4);
        free(ref);
    }
    struct cdp_optimizer *o;
    /* the fixture's recipe (tools/gen_golden.py): every matrix decays, the embeddings too */
    struct cdp_optimizer_desc od = {.type = CDP_OPT_ADAMW, .lr = 1e-3, .weight_decay = 0.1,
                                    .no_decay = CDP_PARAM_GROUP_BIT(CDP_PARAM_BIAS) |
                                                CDP_PARAM_GROUP_BIT(CDP_PARAM_NORM),
                                    .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
    cr_assert_eq(cdp_optimizer_create(&od, m, dev, &o), CDP_OK);
    cdp_optimizer_step(o, m, 1e-3f, 1.0f);
    for (int i = 0; i < cdp_model_tensor_count(m); i++) {
        struct cdp_model_tensor *t = cdp_model_tensor(m, i);
        char name[96];
        snprintf(name, sizeof name, "after.%s", t->name);
        float *ref = malloc((size_t)t->numel * 4);
        cr_assert_eq(cdp_safetensors_read_f32(f, name, t->ndim, t->shape, ref), CDP_OK, "%s", cdp_last_error());
        double e = rel_err(t->data, ref, t->numel);
        cr_assert_leq(e, 1e-4, "%s after AdamW: relative error %.3g", t->name, e);
        if (e > worst) worst = e;
        free(ref);
    }
    cr_log_info("golden GPT step: loss %.8f vs %.8f, worst tensor relative error %.3g", loss, want_loss, worst);
    cdp_optimizer_destroy(o);
    cdp_model_destroy(m);
    cdp_safetensors_close(f);
    cdp_device_close(dev);
    cdp_plan_free(p);
}

Test(model, hugging_face_gpt2_layout_imports_identically)
{
    struct cdp_plan *p = plan_from(golden_plan);
    cdp_device_t dev = cpu();
    struct cdp_model *ours, *hf;
    cr_assert_eq(cdp_model_create(&p->model, 0, 4, 1, 1, 5, dev, &ours), CDP_OK);
    cr_assert_eq(cdp_model_create(&p->model, 0, 4, 1, 1, 6, dev, &hf), CDP_OK);
    cr_assert_eq(cdp_model_load(ours, cdp_test_source_path("tests/fixtures/golden/gpt-tiny.safetensors")),
                 CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_model_load(hf, cdp_test_source_path("tests/fixtures/golden/gpt-tiny-hf.safetensors")),
                 CDP_OK, "%s", cdp_last_error());
    for (int i = 0; i < cdp_model_tensor_count(ours); i++) {
        struct cdp_model_tensor *a = cdp_model_tensor(ours, i), *b = cdp_model_tensor(hf, i);
        cr_assert_str_eq(a->name, b->name);
        cr_assert_eq(memcmp(a->data, b->data, (size_t)a->numel * 4), 0, "%s differs after import", a->name);
    }
    cdp_model_destroy(ours);
    cdp_model_destroy(hf);
    cdp_device_close(dev);
    cdp_plan_free(p);
}

Test(model, weights_round_trip_and_mismatches_are_named)
{
    struct cdp_plan *p = plan_from(golden_plan);
    struct cdp_plan *other = plan_from("{\"model\": {\"preset\": \"gpt\", \"vocab\": 32, \"context\": 8, "
                                       "\"layers\": 2, \"heads\": 2, \"embed\": 24}}");
    cdp_device_t dev = cpu();
    struct cdp_model *a, *b, *c;
    cr_assert_eq(cdp_model_create(&p->model, 0, 4, 1, 1, 11, dev, &a), CDP_OK);
    cr_assert_eq(cdp_model_create(&p->model, 0, 4, 1, 1, 12, dev, &b), CDP_OK);
    cr_assert_eq(cdp_model_create(&other->model, 0, 4, 1, 1, 12, dev, &c), CDP_OK);
    const char *dir = cdp_test_tmpdir();
    char path[4200];
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    const char *meta[] = {"format", "cdphybrid"};
    cr_assert_eq(cdp_model_save(a, path, meta, 1), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_model_load(b, path), CDP_OK, "%s", cdp_last_error());
    for (int i = 0; i < cdp_model_tensor_count(a); i++)
        cr_assert_eq(memcmp(cdp_model_tensor(a, i)->data, cdp_model_tensor(b, i)->data,
                            (size_t)cdp_model_tensor(a, i)->numel * 4), 0);
    cr_assert_eq(cdp_model_load(c, path), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "w.safetensors") && strstr(cdp_last_error(), "layers.0.wte"),
              "%s", cdp_last_error());
    cdp_model_destroy(a);
    cdp_model_destroy(b);
    cdp_model_destroy(c);
    cdp_device_close(dev);
    cdp_plan_free(p);
    cdp_plan_free(other);
}

/* ---- what a weights file holds that the plan does not use (issue 19) ---------------- */

#define HF_FIXTURE "tests/fixtures/golden/gpt-tiny-hf.safetensors"

/* A copy of the Hugging Face fixture at dir/name: without the tensor `drop`
 * (NULL: none), with `n_extra` more tensors. */
static const char *hf_variant(const char *name, const char *drop, const struct cdp_safetensors_tensor *extra,
                              int n_extra)
{
    static char path[4200];
    struct cdp_safetensors_file *f;
    cr_assert_eq(cdp_safetensors_open(cdp_test_source_path(HF_FIXTURE), &f), CDP_OK, "%s", cdp_last_error());
    struct cdp_safetensors_tensor ts[64];
    int n = 0;
    for (int i = 0; i < cdp_safetensors_count(f); i++)
        if (!drop || strcmp(cdp_safetensors_at(f, i)->name, drop)) ts[n++] = *cdp_safetensors_at(f, i);
    for (int i = 0; i < n_extra; i++) ts[n++] = extra[i];
    snprintf(path, sizeof path, "%s/%s", cdp_test_tmpdir(), name);
    const char *meta[] = {"format", "pt"};
    cr_assert_eq(cdp_safetensors_write(path, ts, n, meta, 1), CDP_OK, "%s", cdp_last_error());
    cdp_safetensors_close(f);
    return path;
}

static const struct cdp_safetensors_tensor *fixture_tensor(struct cdp_safetensors_file **f, const char *name)
{
    cr_assert_eq(cdp_safetensors_open(cdp_test_source_path(HF_FIXTURE), f), CDP_OK, "%s", cdp_last_error());
    const struct cdp_safetensors_tensor *x = cdp_safetensors_find(*f, name);
    cr_assert_not_null(x, "%s", name);
    return x;
}

/* Every tensor of a and b holds the same bytes. */
static void assert_same_weights(struct cdp_model *a, struct cdp_model *b)
{
    cr_assert_eq(cdp_model_tensor_count(a), cdp_model_tensor_count(b));
    for (int i = 0; i < cdp_model_tensor_count(a); i++) {
        struct cdp_model_tensor *x = cdp_model_tensor(a, i), *y = cdp_model_tensor(b, i);
        cr_assert_str_eq(x->name, y->name);
        cr_assert_eq(memcmp(x->data, y->data, (size_t)x->numel * 4), 0, "%s differs", x->name);
    }
}

/* The model of `plan` with the fixture's weights in our names (the reference). */
static struct cdp_model *golden_model(struct cdp_plan *p, cdp_device_t dev)
{
    struct cdp_model *m;
    cr_assert_eq(cdp_model_create(&p->model, 0, 4, 1, 1, 5, dev, &m), CDP_OK);
    cr_assert_eq(cdp_model_load(m, cdp_test_source_path("tests/fixtures/golden/gpt-tiny.safetensors")), CDP_OK,
                 "%s", cdp_last_error());
    return m;
}

/* A 4-block Hugging Face file given to the 2-block plan: blocks 2 and 3 were
 * ignored; now an error naming them and /model/layers, or (unused_tensors
 * "warn") a load of blocks 0-1. */
Test(model, weights_with_more_blocks_than_the_plan_are_refused)
{
    struct cdp_safetensors_file *f;
    fixture_tensor(&f, "transformer.wte.weight");
    struct cdp_safetensors_tensor extra[32];
    static char names[32][64];
    int n = 0;
    for (int i = 0; i < cdp_safetensors_count(f); i++) {
        const struct cdp_safetensors_tensor *x = cdp_safetensors_at(f, i);
        if (strncmp(x->name, "transformer.h.", 14)) continue;
        /* block 0 again as block 2, block 1 as block 3 */
        snprintf(names[n], sizeof names[n], "transformer.h.%d.%s", x->name[14] - '0' + 2, x->name + 16);
        extra[n] = *x;
        extra[n].name = names[n];
        n++;
    }
    cr_assert_eq(n, 24, "blocks 0 and 1 have 12 tensors each, not %d", n);
    const char *path = hf_variant("four-blocks.safetensors", NULL, extra, n);
    struct cdp_plan *p = plan_from(golden_plan);
    cr_assert_eq(cdp_model_check_weights(&p->model, path), CDP_ERR_INVALID);
    const char *e = cdp_last_error();
    cr_assert(strstr(e, "four-blocks.safetensors: 24 tensors in the file are not used by the plan's model: "
                        "transformer.h.2."), "%s", e);
    cr_assert(strstr(e, "/model/layers: the file has blocks 2-3 (transformer.h.2.* .. transformer.h.3.*) beyond "
                        "the plan's 2; layers 4 would use them"), "%s", e);
    cr_assert(strstr(e, "/model/unused_tensors \"warn\""), "%s", e);
    /* the opt-out: a warning, and the plan's blocks load */
    p->model.unused_tensors = CDP_UNUSED_WARN;
    cr_assert_eq(cdp_model_check_weights(&p->model, path), CDP_OK, "%s", cdp_last_error());
    cdp_device_t dev = cpu();
    struct cdp_model *ref = golden_model(p, dev), *m;
    cr_assert_eq(cdp_model_create(&p->model, 0, 4, 1, 1, 9, dev, &m), CDP_OK);
    cr_assert_eq(cdp_model_load(m, path), CDP_OK, "%s", cdp_last_error());
    assert_same_weights(m, ref);
    /* a 4-layer plan uses them all */
    struct cdp_plan *four = plan_from("{\"model\": {\"preset\": \"gpt\", \"vocab\": 32, \"context\": 8, "
                                      "\"layers\": 4, \"heads\": 2, \"embed\": 16}}");
    cr_assert_eq(cdp_model_check_weights(&four->model, path), CDP_OK, "%s", cdp_last_error());
    cdp_model_destroy(m);
    cdp_model_destroy(ref);
    cdp_device_close(dev);
    cdp_plan_free(four);
    cdp_plan_free(p);
    cdp_safetensors_close(f);
}

/* Our own names: a 4-block file has units 0-5, the 2-block plan 0-3. */
Test(model, our_weights_of_another_depth_are_refused)
{
    struct cdp_plan *four = plan_from("{\"model\": {\"preset\": \"gpt\", \"vocab\": 32, \"context\": 8, "
                                      "\"layers\": 4, \"heads\": 2, \"embed\": 16}}");
    struct cdp_plan *p = plan_from(golden_plan);
    cdp_device_t dev = cpu();
    struct cdp_model *m;
    cr_assert_eq(cdp_model_create(&four->model, 0, 6, 1, 1, 3, dev, &m), CDP_OK);
    char path[4200];
    snprintf(path, sizeof path, "%s/four.safetensors", cdp_test_tmpdir());
    cr_assert_eq(cdp_model_save(m, path, NULL, 0), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_model_check_weights(&four->model, path), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_model_check_weights(&p->model, path), CDP_ERR_INVALID);
    const char *e = cdp_last_error();
    cr_assert(strstr(e, "four.safetensors: ") && strstr(e, "tensors in the file are not used by the plan's model: "
                                                        "layers.3.ln_1.weight"), "%s", e);
    cr_assert(strstr(e, "/model/layers: the file has units 0-5, the plan's model 0-3"), "%s", e);
    cdp_model_destroy(m);
    cdp_device_close(dev);
    cdp_plan_free(four);
    cdp_plan_free(p);
}

/* An untied head given to a tied plan was dropped (the head became the
 * embedding); now an error naming it and /model/tie_embeddings. The same
 * bytes under both names are a tied head, and an untied plan uses it. */
Test(model, an_untied_head_for_a_tied_plan_is_refused)
{
    struct cdp_safetensors_file *f;
    const struct cdp_safetensors_tensor *wte = fixture_tensor(&f, "transformer.wte.weight");
    float head[32 * 16];
    memcpy(head, wte->data, sizeof head);
    for (int i = 0; i < 32 * 16; i++) head[i] = -0.5f * head[i] + 0.01f * (float)(i % 7);
    struct cdp_safetensors_tensor lm = *wte;
    lm.name = "lm_head.weight";
    lm.data = head;
    const char *untied = hf_variant("untied.safetensors", NULL, &lm, 1);
    struct cdp_plan *p = plan_from(golden_plan);
    cr_assert_eq(cdp_model_check_weights(&p->model, untied), CDP_ERR_INVALID);
    const char *e = cdp_last_error();
    cr_assert(strstr(e, "untied.safetensors: 1 tensor in the file is not used by the plan's model: lm_head.weight"),
              "%s", e);
    cr_assert(strstr(e, "/model/tie_embeddings: the file has an untied head (lm_head.weight, not the embedding); "
                        "tie_embeddings false would use it"), "%s", e);
    /* untied, the plan loads it as its head */
    struct cdp_plan *up = plan_from("{\"model\": {\"preset\": \"gpt\", \"vocab\": 32, \"context\": 8, \"layers\": 2, "
                                    "\"heads\": 2, \"embed\": 16, \"tie_embeddings\": false}}");
    cr_assert_eq(cdp_model_check_weights(&up->model, untied), CDP_OK, "%s", cdp_last_error());
    cdp_device_t dev = cpu();
    struct cdp_model *m;
    cr_assert_eq(cdp_model_create(&up->model, 0, 4, 1, 1, 9, dev, &m), CDP_OK);
    cr_assert_eq(cdp_model_load(m, untied), CDP_OK, "%s", cdp_last_error());
    struct cdp_model_tensor *t = cdp_model_tensor(m, cdp_model_tensor_count(m) - 1);
    cr_assert_str_eq(t->name, "layers.3.lm_head.weight");
    cr_assert_eq(memcmp(t->data, head, sizeof head), 0, "the head is the file's lm_head.weight");
    cr_assert_eq(memcmp(cdp_model_tensor(m, 0)->data, wte->data, sizeof head), 0, "the embedding its wte");
    /* the tied head stored twice (torch.save of a state dict) is tied */
    lm.data = wte->data;
    const char *twice = hf_variant("twice.safetensors", NULL, &lm, 1);
    cr_assert_eq(cdp_model_check_weights(&p->model, twice), CDP_OK, "%s", cdp_last_error());
    cdp_model_destroy(m);
    cdp_device_close(dev);
    cdp_plan_free(up);
    cdp_plan_free(p);
    cdp_safetensors_close(f);
}

/* safetensors.torch.save_model keeps lm_head.weight of the tied pair and
 * drops transformer.wte.weight: the same Hugging Face layout, the embedding
 * read from the head. The causal-mask buffers (h.N.attn.bias) some files
 * carry are not weights and not an error. */
Test(model, save_model_files_and_mask_buffers_load_as_hugging_face)
{
    struct cdp_safetensors_file *f;
    const struct cdp_safetensors_tensor *wte = fixture_tensor(&f, "transformer.wte.weight");
    float mask[8 * 8];
    for (int i = 0; i < 64; i++) mask[i] = (float)(i % 8 <= i / 8);
    struct cdp_safetensors_tensor extra[3] = {*wte,
                                              {.name = "transformer.h.0.attn.bias", .dtype = CDP_DTYPE_F32, .ndim = 4,
                                               .shape = {1, 1, 8, 8}, .data = mask, .nbytes = sizeof mask},
                                              {.name = "transformer.h.1.attn.bias", .dtype = CDP_DTYPE_F32, .ndim = 4,
                                               .shape = {1, 1, 8, 8}, .data = mask, .nbytes = sizeof mask}};
    extra[0].name = "lm_head.weight";
    const char *path = hf_variant("save-model.safetensors", "transformer.wte.weight", extra, 3);
    struct cdp_plan *p = plan_from(golden_plan);
    cr_assert_eq(cdp_model_check_weights(&p->model, path), CDP_OK, "%s", cdp_last_error());
    cdp_device_t dev = cpu();
    struct cdp_model *ref = golden_model(p, dev), *m;
    cr_assert_eq(cdp_model_create(&p->model, 0, 4, 1, 1, 9, dev, &m), CDP_OK);
    cr_assert_eq(cdp_model_load(m, path), CDP_OK, "%s", cdp_last_error());
    assert_same_weights(m, ref);
    /* a stage holding only the head (the tied copy) finds it too */
    struct cdp_model *last;
    cr_assert_eq(cdp_model_create(&p->model, 3, 4, 1, 1, 9, dev, &last), CDP_OK);
    cr_assert_eq(cdp_model_load(last, path), CDP_OK, "%s", cdp_last_error());
    struct cdp_model_tensor *t = cdp_model_tensor(last, cdp_model_tensor_count(last) - 1);
    cr_assert_str_eq(t->name, "layers.0.wte");
    cr_assert_eq(memcmp(t->data, wte->data, (size_t)wte->nbytes), 0);
    cdp_model_destroy(last);
    cdp_model_destroy(m);
    cdp_model_destroy(ref);
    cdp_device_close(dev);
    cdp_plan_free(p);
    cdp_safetensors_close(f);
}

/* A real GPT-2 file has 1024 positions: a shorter context loads the first
 * rows; a longer one is refused naming /model/context. */
Test(model, learned_positions_load_their_first_rows)
{
    struct cdp_safetensors_file *f;
    const struct cdp_safetensors_tensor *wpe = fixture_tensor(&f, "transformer.wpe.weight");
    float rows[24 * 16];
    memcpy(rows, wpe->data, (size_t)wpe->nbytes);
    for (int i = 8 * 16; i < 24 * 16; i++) rows[i] = 100.0f + (float)i; /* rows 8-23: not to be read */
    struct cdp_safetensors_tensor longer = *wpe;
    longer.shape[0] = 24;
    longer.data = rows;
    longer.nbytes = sizeof rows;
    /* the file's wpe replaced by the longer one */
    const char *path = hf_variant("positions.safetensors", "transformer.wpe.weight", &longer, 1);
    struct cdp_plan *p = plan_from(golden_plan);
    cr_assert_eq(cdp_model_check_weights(&p->model, path), CDP_OK, "%s", cdp_last_error());
    cdp_device_t dev = cpu();
    struct cdp_model *ref = golden_model(p, dev), *m;
    cr_assert_eq(cdp_model_create(&p->model, 0, 4, 1, 1, 9, dev, &m), CDP_OK);
    cr_assert_eq(cdp_model_load(m, path), CDP_OK, "%s", cdp_last_error());
    assert_same_weights(m, ref);
    /* a context of 32 cannot come from 24 positions */
    struct cdp_plan *wide = plan_from("{\"model\": {\"preset\": \"gpt\", \"vocab\": 32, \"context\": 32, "
                                      "\"layers\": 2, \"heads\": 2, \"embed\": 16}}");
    struct cdp_model *w;
    cr_assert_eq(cdp_model_create(&wide->model, 0, 4, 1, 1, 9, dev, &w), CDP_OK);
    cr_assert_eq(cdp_model_load(w, path), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "positions.safetensors: tensor transformer.wpe.weight: 24 learned positions, "
                                       "fewer than the model's context 32 (/model/context); a context of at most "
                                       "24 can load it"), "%s", cdp_last_error());
    cdp_model_destroy(w);
    cdp_model_destroy(m);
    cdp_model_destroy(ref);
    cdp_device_close(dev);
    cdp_plan_free(wide);
    cdp_plan_free(p);
    cdp_safetensors_close(f);
}

Test(model, device_memory_cap_limits_the_model)
{
    struct cdp_plan *p = plan_from(golden_plan);
    cdp_device_t dev;
    cr_assert_eq(cdp_device_open(CDP_BACKEND_CPU, 0, 4096, &dev), CDP_OK);
    struct cdp_model *m = NULL;
    cr_assert_eq(cdp_model_create(&p->model, 0, 4, 1, 1, 1, dev, &m), CDP_ERR_NOMEM);
    cr_assert_null(m);
    cr_assert(strstr(cdp_last_error(), "model parameters") && strstr(cdp_last_error(), "memory cap"),
              "%s", cdp_last_error());
    cr_assert_eq(cdp_device_mem_in_use(dev), 0, "a failed model leaves nothing allocated");
    cdp_device_close(dev);
    cdp_plan_free(p);
}

/* As the CLI trains one rank: the planner's layout, then the executor. */
static struct cdp_train_summary train(const char *json)
{
    struct cdp_plan *p = plan_from(json);
    struct cdp_train_summary s = CDP_TRAIN_SUMMARY_INIT;
    struct cdp_train_opts o = CDP_TRAIN_OPTS_INIT;
    struct cdp_topology *t = NULL;
    struct cdp_planner_result r = {0};
    char note[256];
    cr_assert_eq(cdp_planner_topology(p, 0, &t, note, sizeof note), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_planner_run(p, t, NULL, 0, &r), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_train(p, r.layout, &o, &s), CDP_OK, "%s", cdp_last_error());
    cdp_planner_result_clear(&r);
    cdp_topology_free(t);
    cdp_plan_free(p);
    return s;
}

/* Bounds: log(vocab) = 3.47 at the start for 32 tokens; the synthetic chains
 * have a few likely successors per token, so a small GPT gets far below. */
Test(model, loss_falls_on_synthetic_tokens)
{
    struct cdp_train_summary s = train(
        "{\"model\": {\"preset\": \"gpt\", \"vocab\": 32, \"context\": 16, \"layers\": 2, \"heads\": 2, "
        "\"embed\": 32}, \"train\": {\"steps\": 80, \"micro_batch\": 8, \"optimizer\": {\"lr\": 0.003}}, "
        "\"parallel\": {\"micro_batches\": 2}, \"cluster\": {\"backend\": \"cpu\"}}");
    cr_assert_gt(s.first_loss, 3.0, "starts near log(32): %g", s.first_loss);
    cr_assert_lt(s.last_loss, 2.0, "after 80 steps: %g", s.last_loss);
    cr_assert_lt(s.val_loss, 2.2, "validation: %g", s.val_loss);
}

Test(model, loss_falls_on_synthetic_tokens_llama)
{
    struct cdp_train_summary s = train(
        "{\"model\": {\"preset\": \"llama\", \"vocab\": 32, \"context\": 16, \"layers\": 2, \"heads\": 4, "
        "\"kv_heads\": 2, \"dim\": 32, \"hidden\": 64}, \"train\": {\"steps\": 80, \"micro_batch\": 8, "
        "\"optimizer\": {\"lr\": 0.003}}, \"parallel\": {\"micro_batches\": 2}, \"cluster\": {\"backend\": \"cpu\"}}");
    cr_assert_gt(s.first_loss, 3.0, "starts near log(32): %g", s.first_loss);
    cr_assert_lt(s.last_loss, 2.0, "after 80 steps: %g", s.last_loss);
    cr_assert_lt(s.val_loss, 2.2, "validation: %g", s.val_loss);
}

Test(model, loss_falls_on_synthetic_classes)
{
    struct cdp_train_summary s = train(
        "{\"model\": {\"preset\": \"mlp\", \"input\": [20], \"hidden\": [64], \"classes\": 4}, "
        "\"train\": {\"steps\": 150, \"micro_batch\": 32, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}, "
        "\"cluster\": {\"backend\": \"cpu\"}}");
    cr_assert_gt(s.first_loss, 1.2, "starts near log(4): %g", s.first_loss);
    cr_assert_lt(s.last_loss, 0.7, "after 150 steps: %g", s.last_loss);
}

Test(model, loss_falls_on_text)
{
    char json[1024];
    snprintf(json, sizeof json,
             "{\"model\": {\"preset\": \"gpt\", \"vocab\": 256, \"context\": 32, \"layers\": 1, \"heads\": 2, "
             "\"embed\": 32}, \"data\": {\"source\": \"text\", \"path\": \"%s\"}, \"train\": {\"steps\": 60, "
             "\"micro_batch\": 16, \"optimizer\": {\"lr\": 0.01}}, \"cluster\": {\"backend\": \"cpu\"}}",
             cdp_test_source_path("examples/data/licenses.txt"));
    struct cdp_train_summary s = train(json);
    cr_assert_gt(s.first_loss, 5.0, "starts near log(256) = 5.55: %g", s.first_loss);
    cr_assert_lt(s.last_loss, 3.2, "after 60 steps: %g", s.last_loss);
}

/* ---- the kernel table ------------------------------------------------------------- */

static int linear_fwd_calls;

static cdp_status counting_linear_fwd(void *ks, float *out, const float *in, const float *w, const float *b, int N,
                                      int IC, int OC)
{
    linear_fwd_calls++;
    return cdp_cpu_ops.linear_fwd(ks, out, in, w, b, N, IC, OC);
}

static cdp_status failing_attention_fwd(void *ks, float *out, float *att, const float *qkv, int B, int T, int C,
                                        int NH, int causal)
{
    (void)ks, (void)out, (void)att, (void)qkv, (void)B, (void)T, (void)C, (void)NH, (void)causal;
    return cdp_fail(CDP_ERR_DEVICE, "attention_fwd: launch failed (test)");
}

/* A unit runs on the table it is given: the first failing op ends the pass
 * with its status and nothing after it runs; an op the table lacks is
 * CDP_ERR_UNSUPPORTED, named. */
Test(model, a_unit_runs_on_its_kernel_table_and_stops_at_the_first_failure)
{
    struct cdp_plan *p = plan_from("{\"model\": {\"preset\": \"gpt\", \"vocab\": 16, \"context\": 4, "
                                   "\"layers\": 1, \"heads\": 2, \"embed\": 8}}");
    struct cdp_unit *u;
    int n;
    cr_assert_eq(cdp_units_build(&p->model, &u, &n), CDP_OK);
    const struct cdp_unit *blk = &u[1];
    cr_assert_eq(blk->desc.type, CDP_LAYER_TRANSFORMER_BLOCK);
    const int B = 2;
    float *params[CDP_UNIT_MAX_PARAMS] = {0}, *grads[CDP_UNIT_MAX_PARAMS] = {0};
    for (int i = 0; i < blk->n_params; i++) {
        params[i] = calloc((size_t)blk->params[i].numel, 4);
        grads[i] = calloc((size_t)blk->params[i].numel, 4);
        cdp_param_init(blk, i, 1, params[i]);
    }
    const size_t in_n = (size_t)B * 4 * 8;
    float *x = calloc(in_n, 4), *dout = calloc(in_n, 4), *din = calloc(in_n, 4);
    float *act = calloc((size_t)(B * blk->act_floats), 4);
    float *scratch = calloc((size_t)cdp_unit_scratch_floats(blk, B), 4);
    for (size_t i = 0; i < in_n; i++) x[i] = dout[i] = (float)(i % 7) / 7.0f - 0.5f;

    struct cdp_ops ops = cdp_cpu_ops;
    ops.linear_fwd = counting_linear_fwd;
    struct cdp_kernels k = {&ops, NULL};
    linear_fwd_calls = 0;
    cr_assert_eq(cdp_unit_forward(&k, blk, params, x, act, scratch, B), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(linear_fwd_calls, 4, "qkv, attention projection, fc, mlp projection");

    ops.attention_fwd = failing_attention_fwd;
    linear_fwd_calls = 0;
    cr_assert_eq(cdp_unit_forward(&k, blk, params, x, act, scratch, B), CDP_ERR_DEVICE);
    cr_assert(strstr(cdp_last_error(), "launch failed"), "%s", cdp_last_error());
    cr_assert_eq(linear_fwd_calls, 1, "nothing runs after the failing op: %d", linear_fwd_calls);

    ops.attention_fwd = cdp_cpu_ops.attention_fwd;
    ops.gelu_fwd = NULL;
    cr_assert_eq(cdp_unit_forward(&k, blk, params, x, act, scratch, B), CDP_ERR_UNSUPPORTED);
    cr_assert(strstr(cdp_last_error(), "cpu") && strstr(cdp_last_error(), "gelu_fwd"), "%s", cdp_last_error());

    /* backward: the residual stream's gradient passes through the table's add */
    ops.gelu_fwd = cdp_cpu_ops.gelu_fwd;
    cr_assert_eq(cdp_unit_forward(&k, blk, params, x, act, scratch, B), CDP_OK);
    cr_assert_eq(cdp_unit_backward(&k, blk, params, grads, x, act, dout, din, scratch, B), CDP_OK);
    ops.add = NULL;
    cr_assert_eq(cdp_unit_backward(&k, blk, params, grads, x, act, dout, din, scratch, B), CDP_ERR_UNSUPPORTED);
    cr_assert(strstr(cdp_last_error(), "add"), "%s", cdp_last_error());
    cr_assert_eq(cdp_unit_backward(&k, blk, params, grads, x, act, dout, NULL, scratch, B), CDP_OK,
                 "no input gradient wanted: no add");

    for (int i = 0; i < blk->n_params; i++) {
        free(params[i]);
        free(grads[i]);
    }
    free(x);
    free(dout);
    free(din);
    free(act);
    free(scratch);
    free(u);
    cdp_plan_free(p);
}

/* A table whose attention keeps less than the probabilities: it reports
 * B*T*(NH + C) floats (what the CUDA table's fused kernels keep), runs the CPU
 * attention on a private T x T buffer, and fills exactly its reported share
 * of att with a pattern that its backward checks. So the layout must give att
 * that many floats without overlapping the rest (ASan sees an overrun of the
 * exactly sized activations in the sanitizer run). */
static float *compact_private;
static size_t compact_floats;
static int compact_pattern_ok;

static size_t compact_state_floats(void *ks, int B, int T, int C, int NH)
{
    (void)ks;
    return (size_t)B * T * (NH + C);
}

static cdp_status compact_attention_fwd(void *ks, float *out, float *att, const float *qkv, int B, int T, int C,
                                        int NH, int causal)
{
    cdp_status rc = cdp_cpu_ops.attention_fwd(ks, out, compact_private, qkv, B, T, C, NH, causal);
    compact_floats = compact_state_floats(ks, B, T, C, NH);
    for (size_t i = 0; i < compact_floats; i++) att[i] = (float)(i % 251);
    return rc;
}

static cdp_status compact_attention_bwd(void *ks, float *dqkv, const float *dout, const float *qkv, const float *att,
                                        float *scratch, int B, int T, int C, int NH, int causal)
{
    for (size_t i = 0; i < compact_floats; i++)
        if (att[i] != (float)(i % 251)) compact_pattern_ok = 0;
    return cdp_cpu_ops.attention_bwd(ks, dqkv, dout, qkv, compact_private, scratch, B, T, C, NH, causal);
}

Test(model, attention_keeps_the_state_its_kernel_table_asks_for)
{
    struct cdp_plan *p = plan_from("{\"model\": {\"preset\": \"gpt\", \"vocab\": 16, \"context\": 8, "
                                   "\"layers\": 1, \"heads\": 2, \"embed\": 8}}");
    struct cdp_unit *u;
    int n;
    cr_assert_eq(cdp_units_build(&p->model, &u, &n), CDP_OK);
    const int B = 3, T = 8, C = 8, NH = 2;
    struct cdp_kernels cpu = {&cdp_cpu_ops, NULL};
    struct cdp_ops ops = cdp_cpu_ops;
    ops.attention_state_floats = compact_state_floats;
    ops.attention_fwd = compact_attention_fwd;
    ops.attention_bwd = compact_attention_bwd;
    struct cdp_kernels compact = {&ops, NULL};

    /* sizes: the block shrinks by the difference, other units and a table
     * without the entry change nothing */
    const struct cdp_unit full = u[1];
    cr_assert_eq(full.desc.type, CDP_LAYER_TRANSFORMER_BLOCK);
    cr_assert_eq(full.att_floats, NH * T * T);
    struct cdp_unit fit = full, same = full, emb = u[0];
    cdp_unit_fit_kernels(&same, &cpu, B);
    cr_assert_eq(same.att_floats, full.att_floats, "the CPU table has no attention_state_floats");
    cdp_unit_fit_kernels(&emb, &compact, B);
    cr_assert_eq(emb.act_floats, u[0].act_floats, "not an attention unit");
    cdp_unit_fit_kernels(&fit, &compact, B);
    cr_assert_eq(fit.att_floats, T * (NH + C));
    cr_assert_eq(fit.act_floats, full.act_floats - (NH * T * T - T * (NH + C)));

    /* the same results through the smaller layout */
    float *params[CDP_UNIT_MAX_PARAMS] = {0}, *g_full[CDP_UNIT_MAX_PARAMS] = {0}, *g_fit[CDP_UNIT_MAX_PARAMS] = {0};
    for (int i = 0; i < full.n_params; i++) {
        params[i] = calloc((size_t)full.params[i].numel, 4);
        g_full[i] = calloc((size_t)full.params[i].numel, 4);
        g_fit[i] = calloc((size_t)full.params[i].numel, 4);
        cdp_param_init(&full, i, 7, params[i]);
    }
    const size_t in_n = (size_t)B * T * C;
    float *x = malloc(in_n * 4), *dout = malloc(in_n * 4), *din_full = calloc(in_n, 4), *din_fit = calloc(in_n, 4);
    for (size_t i = 0; i < in_n; i++) {
        x[i] = (float)((i * 37) % 19) / 19.0f - 0.5f;
        dout[i] = (float)((i * 11) % 13) / 13.0f - 0.5f;
    }
    float *act_full = calloc((size_t)(B * full.act_floats), 4), *act_fit = calloc((size_t)(B * fit.act_floats), 4);
    const size_t ns = (size_t)cdp_unit_scratch_floats(&full, B);
    float *scratch = calloc(ns, 4);
    compact_private = calloc((size_t)B * NH * T * T, 4);
    compact_pattern_ok = 1;

    cr_assert_eq(cdp_unit_forward(&cpu, &full, params, x, act_full, scratch, B), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_unit_backward(&cpu, &full, params, g_full, x, act_full, dout, din_full, scratch, B), CDP_OK,
                 "%s", cdp_last_error());
    cr_assert_eq(cdp_unit_forward(&compact, &fit, params, x, act_fit, scratch, B), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_unit_backward(&compact, &fit, params, g_fit, x, act_fit, dout, din_fit, scratch, B), CDP_OK,
                 "%s", cdp_last_error());
    cr_assert(compact_pattern_ok, "the attention state was overwritten between forward and backward");
    cr_assert_eq(memcmp(act_full, act_fit, in_n * 4), 0, "the block's output differs");
    cr_assert_eq(memcmp(din_full, din_fit, in_n * 4), 0, "the input gradient differs");
    for (int i = 0; i < full.n_params; i++)
        cr_assert_eq(memcmp(g_full[i], g_fit[i], (size_t)full.params[i].numel * 4), 0, "gradient %d differs", i);

    for (int i = 0; i < full.n_params; i++) {
        free(params[i]);
        free(g_full[i]);
        free(g_fit[i]);
    }
    free(x);
    free(dout);
    free(din_full);
    free(din_fit);
    free(act_full);
    free(act_fit);
    free(scratch);
    free(compact_private);
    free(u);
    cdp_plan_free(p);
}

/* A kernel failure where no status can be returned (zero_grad, the gradient
 * norm, the optimizer step) is kept; every later pass returns it, and the
 * optimizer no longer touches the weights. */
Test(model, a_kernel_failure_without_a_status_is_returned_by_the_next_pass)
{
    struct cdp_plan *p = plan_from("{\"model\": {\"preset\": \"gpt\", \"vocab\": 16, \"context\": 4, "
                                   "\"layers\": 1, \"heads\": 2, \"embed\": 8}}");
    cdp_device_t dev = cpu();
    struct cdp_model *m;
    struct cdp_optimizer *o;
    struct cdp_optimizer_desc od = {.type = CDP_OPT_ADAMW, .lr = 1e-2, .weight_decay = 0.5, .beta1 = 0.9,
                                    .beta2 = 0.95, .eps = 1e-8};
    cr_assert_eq(cdp_model_create(&p->model, 0, 3, 2, 1, 1, dev, &m), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_optimizer_create(&od, m, dev, &o), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_model_kernels(m)->ops, cdp_device_ops(dev));
    fill_inputs(m, cdp_model_unit(m, 0), 2, 16);
    cr_assert_eq(cdp_model_error(m), CDP_OK);
    cr_assert_eq(cdp_model_forward(m, 0), CDP_OK);

    cdp_model_record_error(m, cdp_fail(CDP_ERR_DEVICE, "sum_squares: an illegal memory access (test)"));
    cdp_model_record_error(m, cdp_fail(CDP_ERR_INVALID, "a later failure"));
    cdp_clear_error();
    cr_assert_eq(cdp_model_error(m), CDP_ERR_DEVICE, "the first failure is kept");
    cr_assert_eq(cdp_model_forward(m, 0), CDP_ERR_DEVICE);
    cr_assert(strstr(cdp_last_error(), "illegal memory access"), "%s", cdp_last_error());
    int32_t tg[8] = {0};
    double loss;
    cr_assert_eq(cdp_model_loss(m, 0, tg, 1.0f, &loss), CDP_ERR_DEVICE);
    cr_assert_eq(cdp_model_backward(m, 0, NULL, NULL), CDP_ERR_DEVICE);
    cr_assert(isnan(cdp_model_grad_sumsq(m)));
    struct cdp_model_tensor *t = cdp_model_tensor(m, 0);
    cr_assert(cdp_optimizer_decays(&od, t->group), "%s decays: a step would change it", t->name);
    float *before = malloc((size_t)t->numel * 4);
    memcpy(before, t->data, (size_t)t->numel * 4);
    cdp_optimizer_step(o, m, 1.0f, 1.0f);
    cr_assert_eq(memcmp(before, t->data, (size_t)t->numel * 4), 0, "the weights were stepped");
    free(before);
    cdp_optimizer_destroy(o);
    cdp_model_destroy(m);
    cdp_device_close(dev);
    cdp_plan_free(p);
}

/* Global-norm clipping scales by torch.nn.utils.clip_grad_norm_'s
 * min(1, max_norm / (norm + 1e-6)), not max_norm / norm: at small norms, and at
 * a norm equal to the limit, the two differ by far more than rounding. */
Test(model, grad_clip_scale_is_torchs)
{
    static const struct {
        double norm, max;
        int differs; /* from the old factor: max / norm when norm > max, else 1 */
    } cases[] = {
        {1e-5, 5e-6, 1}, {1e-6, 1e-6, 1}, {3.0, 1.0, 1}, {2.5e-7, 1e-7, 1},
        {5e-8, 1e-7, 1}, /* under a limit far below 1e-6, torch scales even a smaller norm */
        {0.5, 1.0, 0},   {1.0, 1.0 + 2e-6, 0}, {1.0, 0.0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        double n = cases[i].norm, c = cases[i].max;
        float want = c > 0 && c / (n + 1e-6) < 1 ? (float)(c / (n + 1e-6)) : 1.0f;
        float old = c > 0 && n > c ? (float)(c / n) : 1.0f;
        float got = cdp_grad_clip_scale(n, c);
        cr_assert_eq(got, want, "norm %g, clip %g: %.9g, torch %.9g", n, c, got, want);
        if (cases[i].differs) cr_assert_neq(got, old, "norm %g, clip %g: the test cannot tell the formulas apart", n, c);
    }
    cr_assert_eq(cdp_grad_clip_scale(NAN, 1.0), 1.0f);

    /* A real step: tiny gradients (the loss scaled by 1e-8), clipped at their
     * own norm, then SGD with lr 1e6 moves every weight by lr * g * scale. */
    struct cdp_plan *p = plan_from("{\"model\": {\"preset\": \"gpt\", \"vocab\": 16, \"context\": 4, "
                                   "\"layers\": 1, \"heads\": 2, \"embed\": 8}}");
    cdp_device_t dev = cpu();
    struct cdp_model *m;
    struct cdp_optimizer *o;
    struct cdp_optimizer_desc od = {.type = CDP_OPT_SGD, .lr = 1e6};
    cr_assert_eq(cdp_model_create(&p->model, 0, 3, 2, 1, 1, dev, &m), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_optimizer_create(&od, m, dev, &o), CDP_OK, "%s", cdp_last_error());
    fill_inputs(m, cdp_model_unit(m, 0), 2, 16);
    int32_t tg[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    double loss;
    cr_assert_eq(cdp_model_forward(m, 0), CDP_OK);
    cr_assert_eq(cdp_model_loss(m, 0, tg, 1e-8f, &loss), CDP_OK);
    cr_assert_eq(cdp_model_backward(m, 0, NULL, NULL), CDP_OK);
    double norm = sqrt(cdp_model_grad_sumsq(m));
    cr_assert(norm > 1e-9 && norm < 1e-5, "gradient norm %g: not small enough to tell the formulas apart", norm);
    double torch = norm / (norm + 1e-6);
    float scale = cdp_grad_clip_scale(norm, norm);
    cr_assert_float_eq(scale, torch, 1e-6 * torch, "scale %.9g, torch %.9g", scale, torch);
    int n = cdp_model_tensor_count(m);
    float **before = calloc((size_t)n, sizeof *before), **grad = calloc((size_t)n, sizeof *grad);
    for (int i = 0; i < n; i++) {
        struct cdp_model_tensor *t = cdp_model_tensor(m, i);
        before[i] = malloc((size_t)t->numel * 4), grad[i] = malloc((size_t)t->numel * 4);
        memcpy(before[i], t->data, (size_t)t->numel * 4);
        memcpy(grad[i], t->grad, (size_t)t->numel * 4);
    }
    cdp_optimizer_step(o, m, 1e6f, scale);
    double worst = 0, biggest = 0;
    for (int i = 0; i < n; i++) {
        struct cdp_model_tensor *t = cdp_model_tensor(m, i);
        for (int64_t k = 0; k < t->numel; k++) {
            double step = (double)before[i][k] - t->data[k], want = 1e6 * torch * grad[i][k];
            if (fabs(step - want) > worst) worst = fabs(step - want);
            if (fabs(want) > biggest) biggest = fabs(want);
        }
        free(before[i]), free(grad[i]);
    }
    free(before), free(grad);
    /* the old factor (1) would be off by (1 - torch) * biggest, over half of it */
    cr_assert_gt(1.0 - torch, 0.5, "the norm %g leaves too small a difference", norm);
    cr_assert_leq(worst, 1e-3 * biggest, "step off by %.3g (largest step %.3g)", worst, biggest);
    cr_log_info("clipping at norm %.3g: scale %.6f (torch %.6f; max/norm would give 1)", norm, scale, torch);
    cdp_optimizer_destroy(o);
    cdp_model_destroy(m);
    cdp_device_close(dev);
    cdp_plan_free(p);
}

/* ---- learning-rate schedules and weight-decay groups ----------------------------- */

static double lr_of(const char *schedule, int64_t steps, int64_t step)
{
    char json[512];
    snprintf(json, sizeof json, "{\"model\": {\"preset\": \"gpt\"}, \"train\": {\"steps\": %lld, \"optimizer\": "
             "{\"lr\": 0.001}, \"lr_schedule\": %s}}", (long long)steps, schedule);
    struct cdp_plan *p = plan_from(json);
    const double lr = cdp_lr_at(&p->train, step);
    cdp_plan_free(p);
    return lr;
}

/* Warmup reaches the peak on its last step and every decay reaches min_lr on
 * the run's last step, as llm.c's and nanoGPT's schedules do (1-based steps). */
Test(model, lr_schedules_hit_their_ends)
{
    for (int64_t s = 1; s <= 20; s++) cr_assert_eq(lr_of("null", 20, s), 0.001, "constant at step %lld", (long long)s);
    const char *cs = "{\"type\": \"cosine\", \"warmup_steps\": 10, \"min_lr\": 1e-4}";
    cr_assert_float_eq(lr_of(cs, 110, 1), 1e-4, 1e-18, "warmup starts at lr / warmup_steps");
    cr_assert_float_eq(lr_of(cs, 110, 5), 5e-4, 1e-18);
    cr_assert_eq(lr_of(cs, 110, 10), 0.001, "the warmup's last step is the peak, exactly");
    cr_assert_float_eq(lr_of(cs, 110, 60), 5.5e-4, 1e-15, "half way down the cosine");
    cr_assert_float_eq(lr_of(cs, 110, 35), 1e-4 + 0.5 * 9e-4 * (1 + cos(M_PI / 4)), 1e-15);
    cr_assert_eq(lr_of(cs, 110, 110), 1e-4, "min_lr on the last step, exactly");
    for (int64_t s = 11; s <= 110; s++) cr_assert_leq(lr_of(cs, 110, s), lr_of(cs, 110, s - 1) + 1e-18);
    const char *lin = "{\"type\": \"linear\", \"warmup_steps\": 10, \"min_lr\": 0}";
    cr_assert_float_eq(lr_of(lin, 110, 60), 5e-4, 1e-15);
    cr_assert_float_eq(lr_of(lin, 110, 85), 2.5e-4, 1e-15);
    cr_assert_eq(lr_of(lin, 110, 110), 0.0);
    const char *wsd = "{\"type\": \"wsd\", \"warmup_steps\": 5, \"min_lr\": 1e-4, \"decay_steps\": 20}";
    cr_assert_float_eq(lr_of(wsd, 100, 3), 6e-4, 1e-15);
    cr_assert_eq(lr_of(wsd, 100, 5), 0.001);
    cr_assert_eq(lr_of(wsd, 100, 50), 0.001, "stable");
    cr_assert_eq(lr_of(wsd, 100, 80), 0.001, "the last stable step");
    cr_assert_float_eq(lr_of(wsd, 100, 90), 5.5e-4, 1e-15, "half way through the decay");
    cr_assert_eq(lr_of(wsd, 100, 100), 1e-4);
    cr_assert_eq(lr_of("{\"warmup_steps\": 4}", 10, 2), 0.0005, "warmup, then constant");
    cr_assert_eq(lr_of("{\"warmup_steps\": 4}", 10, 7), 0.001);
}

/* The plan's default decays the weight matrices only: after an AdamW step on
 * zero gradients a matrix has shrunk by exactly lr x weight_decay and every
 * embedding, bias and norm is untouched; "no_decay": [] decays them all. */
Test(model, weight_decay_follows_the_parameter_groups)
{
    for (int all = 0; all < 2; all++) {
        char json[512];
        snprintf(json, sizeof json, "{\"model\": {\"preset\": \"gpt\", \"vocab\": 16, \"context\": 4, \"layers\": 1, "
                 "\"heads\": 2, \"embed\": 8, \"tie_embeddings\": false}, \"train\": {\"optimizer\": {\"lr\": 0.25, "
                 "\"weight_decay\": 0.5%s}}}", all ? ", \"no_decay\": []" : "");
        struct cdp_plan *p = plan_from(json);
        cdp_device_t dev = cpu();
        struct cdp_model *m;
        struct cdp_optimizer *o;
        cr_assert_eq(cdp_model_create(&p->model, 0, cdp_plan_model_units(p), 2, 1, 1, dev, &m), CDP_OK, "%s",
                     cdp_last_error());
        cr_assert_eq(cdp_optimizer_create(&p->train.optimizer, m, dev, &o), CDP_OK, "%s", cdp_last_error());
        cdp_model_zero_grad(m);
        const int n = cdp_model_tensor_count(m);
        float **before = calloc((size_t)n, sizeof *before);
        int seen[CDP_PARAM_GROUP_COUNT] = {0};
        for (int i = 0; i < n; i++) {
            struct cdp_model_tensor *t = cdp_model_tensor(m, i);
            const char *base = strrchr(t->name, '.') + 1;
            const enum cdp_param_group want = !strcmp(base, "wte") || !strcmp(base, "wpe") ? CDP_PARAM_EMBEDDING
                                              : strstr(t->name, ".ln")                      ? CDP_PARAM_NORM
                                              : !strcmp(base, "bias")                       ? CDP_PARAM_BIAS
                                                                                            : CDP_PARAM_WEIGHT;
            cr_assert_eq(t->group, want, "%s: group %d, expected %d", t->name, t->group, want);
            seen[t->group]++;
            before[i] = malloc((size_t)t->numel * 4);
            memcpy(before[i], t->data, (size_t)t->numel * 4);
        }
        for (int g = 0; g < CDP_PARAM_GROUP_COUNT; g++) cr_assert_gt(seen[g], 0, "no tensor of group %d", g);
        cdp_optimizer_step(o, m, 0.25f, 1.0f);
        cr_assert_eq(cdp_model_error(m), CDP_OK);
        for (int i = 0; i < n; i++) {
            struct cdp_model_tensor *t = cdp_model_tensor(m, i);
            const int decays = all || t->group == CDP_PARAM_WEIGHT;
            cr_assert_eq(cdp_optimizer_decays(&p->train.optimizer, t->group), decays, "%s", t->name);
            for (int64_t j = 0; j < t->numel; j++) {
                const float want = decays ? before[i][j] * (1.0f - 0.25f * 0.5f) : before[i][j];
                cr_assert_float_eq(t->data[j], want, 1e-6f * fabsf(want) + 1e-30f, "%s[%lld]: %g, expected %g%s",
                                   t->name, (long long)j, t->data[j], want, decays ? " (decayed)" : " (untouched)");
            }
            free(before[i]);
        }
        free(before);
        cdp_optimizer_destroy(o);
        cdp_model_destroy(m);
        cdp_device_close(dev);
        cdp_plan_free(p);
    }
}

/* Tensor groups (docs/parallelism.md): every rank's slices of a split unit,
 * put back where cdp_param_slice_copy says (GPT's fused q, k, v weight as
 * three row ranges), are the whole tensors one rank makes from the same seed,
 * every element once; the ranks' FLOPs add up to one rank's; a t the heads do
 * not divide is refused naming the key. */
static void check_slices(const char *json, int t)
{
    struct cdp_plan *p = plan_from(json);
    struct cdp_unit *one = NULL;
    int n = 0;
    cr_assert_eq(cdp_units_build(&p->model, &one, &n), CDP_OK);
    double flops[2] = {0, 0};
    for (int i = 0; i < n; i++)
        if (cdp_layer_def(one[i].desc.type)->tensor_splits) flops[0] += one[i].fwd_flops + one[i].bwd_flops;
    for (int i = 0; i < n; i++)
        for (int q = 0; q < one[i].n_params; q++) {
            const struct cdp_param_desc *w = &one[i].params[q];
            float *whole = malloc((size_t)w->numel * sizeof *whole), *again = calloc((size_t)w->numel, sizeof *again);
            int *hits = calloc((size_t)w->numel, sizeof *hits);
            cr_assert(whole && again && hits);
            cdp_param_init(&one[i], q, 7, whole);
            int sliced = 0;
            for (int k = 0; k < t; k++) {
                struct cdp_unit *mine = NULL;
                int m = 0;
                cr_assert_eq(cdp_units_build_tensor(&p->model, t, k, &mine, &m), CDP_OK, "%s", cdp_last_error());
                cr_assert_eq(m, n);
                if (q == 0 && cdp_layer_def(mine[i].desc.type)->tensor_splits) {
                    /* a vocabulary slice also computes its padding columns: its real ones add up */
                    int64_t off, valid;
                    const double real = cdp_unit_vocab_split(&mine[i], &off, &valid)
                                            ? (double)valid / (double)mine[i].out.d[mine[i].out.ndim - 1] : 1.0;
                    flops[1] += (mine[i].fwd_flops + mine[i].bwd_flops) * real;
                }
                const struct cdp_param_desc *s = &mine[i].params[q];
                cr_assert_str_eq(s->name, w->name);
                float *slice = malloc((size_t)s->numel * sizeof *slice);
                cr_assert(slice);
                cdp_param_init(&mine[i], q, 7, slice);
                if (s->shard_dim < 0) { /* replicated: the whole, on every rank */
                    cr_assert_eq(s->numel, w->numel);
                    cr_assert(!memcmp(slice, whole, (size_t)w->numel * sizeof *whole), "%s", w->name);
                } else {
                    sliced = 1;
                    /* ceil(rows / t) rows each: a vocabulary t does not divide is padded (never in the whole) */
                    const int sd = s->shard_dim;
                    cr_assert_eq(s->shape[sd], (w->shape[sd] + t - 1) / t, "%s", w->name);
                    cr_assert_eq(s->numel / s->shape[sd], w->numel / w->shape[sd], "%s", w->name);
                    cr_assert(w->shape[sd] % t == 0 ? s->numel * t == w->numel
                                                    : s->shard_parts <= 1 && s->numel * t > w->numel,
                              "%s", w->name);
                    /* mark where the slice goes: copy ones in place of its values */
                    float *ones = malloc((size_t)s->numel * sizeof *ones), *mark = calloc((size_t)w->numel, sizeof *mark);
                    cr_assert(ones && mark);
                    for (int64_t e = 0; e < s->numel; e++) ones[e] = 1.0f;
                    cdp_param_slice_copy(s, mark, ones, 1);
                    for (int64_t e = 0; e < w->numel; e++) hits[e] += mark[e] != 0.0f;
                    cdp_param_slice_copy(s, again, slice, 1);
                    if (strstr(w->name, "c_attn")) { /* rank k: rows of its heads in each of q, k and v */
                        const int64_t C = w->shape[0] / 3, rows = C / t, inner = w->numel / w->shape[0];
                        for (int j = 0; j < 3; j++)
                            cr_assert(!memcmp(slice + j * rows * inner, whole + (j * C + k * rows) * inner,
                                              (size_t)(rows * inner) * sizeof *whole),
                                      "%s: rank %d's part %d", w->name, k, j);
                    }
                    free(ones);
                    free(mark);
                }
                free(slice);
                free(mine);
            }
            if (sliced) {
                for (int64_t e = 0; e < w->numel; e++) cr_assert_eq(hits[e], 1, "%s element %lld", w->name, (long long)e);
                cr_assert(!memcmp(again, whole, (size_t)w->numel * sizeof *whole), "%s: the slices are the whole",
                          w->name);
            }
            free(whole);
            free(again);
            free(hits);
        }
    cr_assert(flops[0] > 0);
    cr_assert_leq(fabs(flops[1] - flops[0]), 1e-9 * flops[0], "the ranks' FLOPs %g, one rank's %g", flops[1], flops[0]);
    free(one);
    cdp_plan_free(p);
}

Test(model, tensor_slices_are_the_whole_tensors_parts)
{
    check_slices("{\"model\": {\"preset\": \"gpt\", \"vocab\": 11, \"context\": 6, \"layers\": 2, \"heads\": 4, "
                 "\"embed\": 16}}", 2);
    check_slices("{\"model\": {\"preset\": \"gpt\", \"vocab\": 11, \"context\": 6, \"layers\": 1, \"heads\": 4, "
                 "\"embed\": 16}}", 4);
    check_slices("{\"model\": {\"preset\": \"llama\", \"vocab\": 11, \"context\": 6, \"layers\": 1, \"heads\": 4, "
                 "\"kv_heads\": 2, \"dim\": 16, \"hidden\": 24}}", 2);
    check_slices("{\"model\": {\"input\": [5, 8], \"layers\": [{\"type\": \"rotary_attention\", \"heads\": 4, "
                 "\"kv_heads\": 2}, {\"type\": \"rmsnorm\"}, {\"type\": \"swiglu_mlp\", \"hidden\": 12}]}}", 2);
    for (int t = 2; t <= 4; t *= 2) /* GPT's list attention: c_attn as three row ranges, c_proj row-parallel */
        check_slices("{\"model\": {\"input\": [5, 16], \"layers\": [{\"type\": \"attention\", \"heads\": 4}, "
                     "{\"type\": \"layernorm\"}]}}", t);
    /* a library caller's t that the heads do not divide */
    struct cdp_plan *p = plan_from("{\"model\": {\"preset\": \"gpt\", \"vocab\": 11, \"context\": 6, \"layers\": 1, "
                                   "\"heads\": 2, \"embed\": 16}}");
    struct cdp_unit *u = NULL;
    int n = 0;
    cr_assert_eq(cdp_units_build_tensor(&p->model, 4, 0, &u, &n), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "transformer_block): heads 2 is not a multiple of the tensor group's 4"), "%s",
              cdp_last_error());
    cdp_plan_free(p);
}
