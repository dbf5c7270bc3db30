/* Suite pipeline: the real binary under mpirun (it launches itself). Every
 * (stages, replicas, micro-batches) layout and schedule must train to the same
 * losses and weights as one rank; faults end the whole job quickly with a
 * message naming the rank, its stage and replica, and its instruction. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "comm/comm.h"
#include "model/safetensors.h"

enum {
    MODEL_MLP = 0, MODEL_GPT = 1, MODEL_SILU = 2, MODEL_LLAMA = 3, MODEL_LLAMA_TIED = 4, MODEL_SPLIT = 5,
    MODEL_GPT_T = 6, MODEL_GPT_T_TIED = 7, MODEL_LLAMA_T = 8, /* heads that split over 4 ranks */
    MODEL_LLAMA_LIST = 9,                                      /* the Llama types in a layer list */
    MODEL_VOCAB = 10,                                          /* a vocab-parallel embedding in a layer list */
    MODEL_LLAMA_GQA = 11, /* heads and kv heads (2 heads a kv head) that split over 4 ranks, vocab 37 padded */
    MODEL_ATT_LIST = 12   /* GPT's attention in a layer list */
};

static const char *model_name(int model)
{
    static const char *const names[] = {"mlp", "gpt", "silu", "llama", "llama (tied)", "mlp (split linears)",
                                        "gpt (4 heads, untied)", "gpt (4 heads, tied)", "llama (4 kv heads)",
                                        "llama types in a list", "embedding (vocab-parallel)",
                                        "llama (8 heads, 4 kv heads)", "attention in a list"};
    return names[model];
}

/* An MLP of two column-then-row pairs of split linears (docs/parallelism.md). */
#define SPLIT_MLP                                                                                              \
    "\"model\": {\"input\": [12], \"layers\": [{\"type\": \"linear\", \"out\": 32, \"split\": \"column\"}, "    \
    "{\"type\": \"relu\"}, {\"type\": \"linear\", \"out\": 24, \"split\": \"row\"}, {\"type\": \"linear\", "         \
    "\"out\": 16, \"split\": \"column\"}, {\"type\": \"gelu\"}, {\"type\": \"linear\", \"out\": 5, \"split\": "        \
    "\"row\"}]}"

/* A vocab-parallel embedding of a vocabulary no t of the grid divides (its
 * slices padded), a pair of split linears, and a replicated classifier. */
#define VOCAB_MODEL                                                                                               \
    "\"model\": {\"input\": [8], \"layers\": [{\"type\": \"embedding\", \"vocab\": 37, \"dim\": 16, "             \
    "\"context\": 8}, {\"type\": \"linear\", \"out\": 32, \"split\": \"column\"}, {\"type\": \"gelu\"}, "        \
    "{\"type\": \"linear\", \"out\": 16, \"split\": \"row\"}, {\"type\": \"linear\", \"out\": 37}], "               \
    "\"loss\": \"cross_entropy\"}"

/* GPT's list types: a vocab-parallel embedding, layernorms, attention split by
 * heads, a pair of split linears, a replicated classifier. */
#define ATT_LIST_MODEL                                                                                            \
    "\"model\": {\"input\": [8], \"layers\": [{\"type\": \"embedding\", \"vocab\": 37, \"dim\": 16, "             \
    "\"context\": 8}, {\"type\": \"layernorm\"}, {\"type\": \"attention\", \"heads\": 4}, {\"type\": "          \
    "\"layernorm\"}, {\"type\": \"linear\", \"out\": 32, \"split\": \"column\"}, {\"type\": \"gelu\"}, "          \
    "{\"type\": \"linear\", \"out\": 16, \"split\": \"row\"}, {\"type\": \"layernorm\"}, {\"type\": "             \
    "\"linear\", \"out\": 37}], \"loss\": \"cross_entropy\"}"

struct layout {
    int model, p, R, m, v;
    char schedule[16];
    char balance[24]; /* "" (the default), or a /parallel/balance list such as "[3, 1]" */
    int rebalance_every;
    char recompute[12]; /* /train/recompute of the pipeline's plan; "": the default */
    int zero;           /* /parallel/zero of the pipeline's plan */
    int t;              /* /parallel/tensor of the pipeline's plan (0: 1) */
};

/* /parallel/sequence_parallel of the pipeline's plans write_plan writes (its own test sets it) */
static int plan_sp;
/* /parallel/comm_dtype of the pipeline's plans ("": the default; its own test sets it) */
static const char *plan_comm = "";
/* /cluster of the plans write_plan writes (its own test sets it) */
static char plan_cluster[4400] = "{\"backend\": \"cpu\"}";

static void write_plan(const char *dir, const char *name, const struct layout *l, int one_rank)
{
    char json[8192], par[512], bal[160] = "";
    const int p = one_rank ? 1 : l->p, R = one_rank ? 1 : l->R, m = one_rank ? l->R * l->m : l->m;
    if (!one_rank && l->balance[0])
        snprintf(bal, sizeof bal, ", \"balance\": %s", l->balance);
    if (!one_rank && l->rebalance_every)
        snprintf(bal + strlen(bal), sizeof bal - strlen(bal), ", \"rebalance_every\": %d", l->rebalance_every);
    if (!one_rank && l->t > 1) snprintf(bal + strlen(bal), sizeof bal - strlen(bal), ", \"tensor\": %d", l->t);
    if (!one_rank && plan_sp) snprintf(bal + strlen(bal), sizeof bal - strlen(bal), ", \"sequence_parallel\": true");
    if (!one_rank && plan_comm[0])
        snprintf(bal + strlen(bal), sizeof bal - strlen(bal), ", \"comm_dtype\": %s", plan_comm);
    snprintf(par, sizeof par,
             "\"parallel\": {\"stages\": %d, \"replicas\": %d, \"micro_batches\": %d, \"schedule\": \"%s\""
             "%s%s, \"zero\": %d}",
             p, R, m, one_rank ? "1f1b" : l->schedule, !one_rank && l->v > 1 ? ", \"chunks\": 2" : "", bal,
             one_rank ? 0 : l->zero);
    /* llama: grouped-query attention, llama3 rope scaling, untied (or tied) head */
    const char *model = l->model == MODEL_GPT
        ? "\"model\": {\"preset\": \"gpt\", \"vocab\": 32, \"context\": 8, \"layers\": 6, \"heads\": 2, \"embed\": 16}"
        : l->model == MODEL_LLAMA || l->model == MODEL_LLAMA_TIED
        ? (l->model == MODEL_LLAMA
               ? "\"model\": {\"preset\": \"llama\", \"vocab\": 32, \"context\": 8, \"layers\": 6, \"heads\": 4, "
                 "\"kv_heads\": 2, \"dim\": 16, \"hidden\": 24, \"rope_scaling\": {\"type\": \"llama3\", "
                 "\"factor\": 4, \"low_freq_factor\": 1, \"high_freq_factor\": 2, \"original_context\": 8}}"
               : "\"model\": {\"preset\": \"llama\", \"vocab\": 32, \"context\": 8, \"layers\": 6, \"heads\": 2, "
                 "\"kv_heads\": 1, \"dim\": 16, \"hidden\": 24, \"tie_embeddings\": true}")
        : l->model == MODEL_SPLIT
        ? SPLIT_MLP
        : l->model == MODEL_VOCAB
        ? VOCAB_MODEL
        : l->model == MODEL_ATT_LIST
        ? ATT_LIST_MODEL
        : l->model == MODEL_GPT_T
        ? "\"model\": {\"preset\": \"gpt\", \"vocab\": 37, \"context\": 8, \"layers\": 4, \"heads\": 4, \"embed\": 16, "
          "\"tie_embeddings\": false}"
        : l->model == MODEL_GPT_T_TIED
        ? "\"model\": {\"preset\": \"gpt\", \"vocab\": 37, \"context\": 8, \"layers\": 4, \"heads\": 4, \"embed\": 16, "
          "\"tie_embeddings\": true}"
        : l->model == MODEL_LLAMA_T
        ? "\"model\": {\"preset\": \"llama\", \"vocab\": 37, \"context\": 8, \"layers\": 4, \"heads\": 4, "
          "\"kv_heads\": 4, \"dim\": 16, \"hidden\": 24}"
        : l->model == MODEL_LLAMA_GQA
        ? "\"model\": {\"preset\": \"llama\", \"vocab\": 37, \"context\": 8, \"layers\": 4, \"heads\": 8, "
          "\"kv_heads\": 4, \"dim\": 32, \"hidden\": 24}"
        : l->model == MODEL_LLAMA_LIST
        ? "\"model\": {\"input\": [8], \"layers\": [{\"type\": \"embedding\", \"vocab\": 32, \"dim\": 16}, "
          "{\"type\": \"rmsnorm\"}, {\"type\": \"rotary_attention\", \"heads\": 4, \"kv_heads\": 2}, {\"type\": "
          "\"rmsnorm\"}, {\"type\": \"swiglu_mlp\", \"hidden\": 24}, {\"type\": \"llama_block\", \"heads\": 4, "
          "\"kv_heads\": 2, \"hidden\": 24}, {\"type\": \"rmsnorm\"}, {\"type\": \"linear\", \"out\": 32, "
          "\"bias\": false}]}"
        : l->model == MODEL_SILU
        ? "\"model\": {\"input\": [12], \"layers\": [{\"type\": \"linear\", \"out\": 32}, {\"type\": \"silu\"}, "
          "{\"type\": \"linear\", \"out\": 24}, {\"type\": \"silu\"}, {\"type\": \"linear\", \"out\": 5}]}"
        : "\"model\": {\"preset\": \"mlp\", \"input\": [12], \"hidden\": [32, 24, 16], \"classes\": 5}";
    /* AdamW's eps is 1e-6, not 1e-8: the key bias of attention has an exactly
     * zero gradient (softmax ignores a constant added to every key), so its
     * fp32 gradient is rounding noise that differs with summation order, and
     * with eps 1e-8 Adam turns that noise into steps of up to lr. Tensor
     * groups split every block's products and sums, so more elements' fp32
     * gradients differ from one rank's in their last bits; on the few that
     * are near zero by cancellation (rows of rare tokens), Adam's first steps
     * (g / (|g| + eps)) amplify that to 1e-5 of a tensor at eps 1e-6: those
     * plans take eps 1e-4 (SGD agrees to 1e-8 with or without it). */
    char rc[48] = "";
    if (!one_rank && l->recompute[0]) snprintf(rc, sizeof rc, ", \"recompute\": \"%s\"", l->recompute);
    const char *opt = l->model == MODEL_GPT || l->model == MODEL_LLAMA || l->model == MODEL_LLAMA_TIED ||
                              l->model == MODEL_GPT_T || l->model == MODEL_GPT_T_TIED || l->model == MODEL_LLAMA_T ||
                              l->model == MODEL_LLAMA_GQA
                          ? (l->t > 1 ? "{\"type\": \"adamw\", \"lr\": 0.01, \"weight_decay\": 0.1, \"eps\": 1e-4}"
                                      : "{\"type\": \"adamw\", \"lr\": 0.01, \"weight_decay\": 0.1, \"eps\": 1e-6}")
                          : "{\"type\": \"sgd\", \"lr\": 0.05, \"momentum\": 0.9}";
    snprintf(json, sizeof json,
             "{%s, \"data\": {\"source\": \"synthetic\", \"seed\": 3}, \"train\": {\"steps\": 3, \"micro_batch\": 2, "
             "\"optimizer\": %s, \"grad_clip\": 0.5, \"eval_batches\": 1, \"timeout_s\": 60%s}, %s, "
             "\"cluster\": %s, \"output\": {\"metrics\": \"%s.jsonl\", \"weights\": "
             "\"%s.safetensors\", \"trace\": \"%s-trace.json\"}}",
             model, opt, rc, par, plan_cluster, name, name, name);
    char file[64];
    snprintf(file, sizeof file, "%s.json", name);
    cdp_test_write_file(dir, file, json);
}

static int read_losses(const char *path, double *out, int cap)
{
    char *text = cdp_test_read_file(path);
    cr_assert_not_null(text, "%s was not written", path);
    int n = 0;
    for (char *c = strstr(text, "\"loss\": "); c && n < cap; c = strstr(c + 1, "\"loss\": "))
        out[n++] = strtod(c + 8, NULL);
    free(text);
    return n;
}

static double compare_weights(const char *a, const char *b)
{
    struct cdp_safetensors_file *fa, *fb;
    cr_assert_eq(cdp_safetensors_open(a, &fa), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_safetensors_open(b, &fb), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_safetensors_count(fa), cdp_safetensors_count(fb), "the same tensors");
    double worst = 0;
    for (int i = 0; i < cdp_safetensors_count(fa); i++) {
        const struct cdp_safetensors_tensor *ta = cdp_safetensors_at(fa, i), *tb = cdp_safetensors_find(fb, ta->name);
        cr_assert_not_null(tb, "%s missing from the pipeline's weights", ta->name);
        cr_assert_eq(ta->nbytes, tb->nbytes, "%s", ta->name);
        const float *x = ta->data, *y = tb->data;
        double num = 0, den = 0;
        for (uint64_t k = 0; k < ta->nbytes / 4; k++) {
            num += ((double)x[k] - y[k]) * ((double)x[k] - y[k]);
            den += (double)x[k] * x[k];
        }
        double e = sqrt(num / (den > 0 ? den : 1));
        if (e > worst) worst = e;
    }
    cdp_safetensors_close(fa);
    cdp_safetensors_close(fb);
    return worst;
}

/* Multi-rank runs need the mpi communicator; a build without MPI says so. */
static void need_mpi(void)
{
    if (!cdp_comm_have_mpi()) cr_skip_test("this build has no MPI (-Dmpi=disabled): multi-rank runs are not possible");
}

static void run_ok(const char *plan)
{
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"-q", "--plan", plan, NULL}), 0);
    if (r.exit_code != 0) {
        char *text = cdp_test_read_file(plan);
        const char *par = text ? strstr(text, "\"parallel\"") : NULL;
        cr_assert_fail("%s failed (%d), %.200s: %s", plan, r.exit_code, par ? par : "", r.err);
    }
    cdp_test_run_free(&r);
}

ParameterizedTestParameters(pipeline, layouts_equal_one_rank)
{
    static struct layout grid[128];
    static const int shapes[][3] = {{1, 1, 4}, {2, 1, 4}, {1, 2, 2}, {2, 2, 4}, {4, 1, 8}, {2, 3, 3}, {3, 2, 6}};
    int n = 0;
    for (int model = 0; model < 2; model++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int p = shapes[s][0], R = shapes[s][1], m = shapes[s][2];
            grid[n++] = (struct layout){model, p, R, m, 1, "gpipe", "", 0, "", 0, 1};
            grid[n++] = (struct layout){model, p, R, m, 1, "1f1b", "", 0, "", 0, 1};
            /* interleaved: 2 chunks per rank, m a multiple of p, enough units */
            const int units = model == MODEL_GPT ? 8 : 7;
            if (p >= 2 && m % p == 0 && 2 * p <= units)
                grid[n++] = (struct layout){model, p, R, m, 2, "interleaved", "", 0, "", 0, 1};
        }
    /* unequal shares of the global batch (load-balanced replicas) */
    for (int model = 0; model < 2; model++) {
        grid[n++] = (struct layout){model, 1, 2, 2, 1, "1f1b", "[3, 1]", 0, "", 0, 1};
        grid[n++] = (struct layout){model, 2, 2, 4, 1, "gpipe", "[6, 2]", 0, "", 0, 1};
        grid[n++] = (struct layout){model, 2, 2, 4, 1, "1f1b", "[1, 7]", 0, "", 0, 1};
        grid[n++] = (struct layout){model, 2, 2, 4, 2, "interleaved", "[6, 2]", 0, "", 0, 1};
        grid[n++] = (struct layout){model, 2, 3, 3, 1, "1f1b", "[5, 3, 1]", 0, "", 0, 1};
    }
    /* recomputation, selective and full, on every schedule */
    for (int model = 0; model < 2; model++)
        for (int mode = 0; mode < 2; mode++) {
            const char *rc = mode ? "full" : "selective";
            struct layout a = {model, 2, 2, 4, 1, "gpipe", "", 0, "", 0, 1}, b = {model, 2, 2, 4, 1, "1f1b", "", 0, "", 0, 1},
                          c = {model, 2, 1, 4, 2, "interleaved", "", 0, "", 0, 1};
            snprintf(a.recompute, sizeof a.recompute, "%s", rc);
            snprintf(b.recompute, sizeof b.recompute, "%s", rc);
            snprintf(c.recompute, sizeof c.recompute, "%s", rc);
            grid[n++] = a;
            grid[n++] = b;
            grid[n++] = c;
        }
    /* ZeRO-1 and ZeRO-2: 2, 3 and 4 replicas (shards that do not divide evenly), every
     * schedule, with recomputation; unequal shares for ZeRO-1 only (ZeRO-2 refuses them) */
    for (int z = 1; z <= 2; z++)
        for (int model = 0; model < 2; model++) {
            grid[n++] = (struct layout){model, 1, 2, 2, 1, "1f1b", "", 0, "", z, 1};
            grid[n++] = (struct layout){model, 2, 3, 3, 1, "gpipe", "", 0, "", z, 1};
            grid[n++] = (struct layout){model, 1, 4, 2, 1, "1f1b", "", 0, "", z, 1};
            grid[n++] = (struct layout){model, 2, 2, 4, 2, "interleaved", "", 0, "", z, 1};
            struct layout f = {model, 2, 2, 4, 1, "1f1b", "", 0, "full", z, 1};
            if (z == 1) snprintf(f.balance, sizeof f.balance, "[6, 2]");
            grid[n++] = f;
            grid[n++] = (struct layout){model, 2, 2, 4, 1, "gpipe", "", 0, "selective", z, 1};
            grid[n++] = (struct layout){model, 2, 2, 4, 2, "interleaved", "", 0, "full", z, 1};
        }
    /* the zero-bubble schedules (split backward): GPT (tied embeddings: between
     * two ranks, or within rank 0 under zbv) and MLP, with replicas, unequal
     * shares, recomputation and ZeRO */
    for (int model = 0; model < 2; model++) {
        grid[n++] = (struct layout){model, 2, 1, 4, 1, "zb-h1", "", 0, "", 0, 1};
        grid[n++] = (struct layout){model, 3, 2, 6, 1, "zb-h1", "", 0, "", 0, 1};
        grid[n++] = (struct layout){model, 2, 2, 4, 1, "zb-h2", "", 0, "", 0, 1};
        grid[n++] = (struct layout){model, 4, 1, 8, 1, "zb-h2", "", 0, "", 0, 1};
        grid[n++] = (struct layout){model, 2, 1, 4, 2, "zbv", "", 0, "", 0, 1};
        grid[n++] = (struct layout){model, 3, 2, 3, 2, "zbv", "", 0, "", 0, 1};
        grid[n++] = (struct layout){model, 1, 2, 2, 2, "zbv", "", 0, "", 0, 1};
        grid[n++] = (struct layout){model, 2, 2, 4, 2, "zbv", "[6, 2]", 0, "", 0, 1};
        grid[n++] = (struct layout){model, 2, 2, 4, 1, "zb-h1", "", 0, "full", 1, 1};
        grid[n++] = (struct layout){model, 2, 2, 4, 2, "zbv", "", 0, "selective", 2, 1};
    }
    /* the llama preset: every schedule, replicas, unequal shares, recomputation, ZeRO; a tied head
     * across two ranks and within rank 0 under zbv */
    grid[n++] = (struct layout){MODEL_LLAMA, 2, 1, 4, 1, "gpipe", "", 0, "", 0, 1};
    grid[n++] = (struct layout){MODEL_LLAMA, 2, 2, 4, 1, "1f1b", "", 0, "", 0, 1};
    grid[n++] = (struct layout){MODEL_LLAMA, 4, 1, 8, 1, "1f1b", "", 0, "", 0, 1};
    grid[n++] = (struct layout){MODEL_LLAMA, 2, 2, 4, 2, "interleaved", "", 0, "", 0, 1};
    grid[n++] = (struct layout){MODEL_LLAMA, 2, 2, 4, 1, "1f1b", "[6, 2]", 0, "selective", 0, 1};
    grid[n++] = (struct layout){MODEL_LLAMA, 2, 2, 4, 2, "interleaved", "", 0, "full", 1, 1};
    grid[n++] = (struct layout){MODEL_LLAMA, 2, 3, 3, 1, "gpipe", "", 0, "", 2, 1};
    grid[n++] = (struct layout){MODEL_LLAMA, 3, 2, 6, 1, "zb-h1", "", 0, "", 0, 1};
    grid[n++] = (struct layout){MODEL_LLAMA, 2, 2, 4, 1, "zb-h2", "", 0, "full", 1, 1};
    grid[n++] = (struct layout){MODEL_LLAMA, 2, 2, 4, 2, "zbv", "", 0, "selective", 2, 1};
    grid[n++] = (struct layout){MODEL_LLAMA_TIED, 2, 1, 4, 1, "1f1b", "", 0, "", 0, 1};
    grid[n++] = (struct layout){MODEL_LLAMA_TIED, 2, 2, 4, 2, "zbv", "", 0, "", 1, 1};
    /* a layer list with silu */
    grid[n++] = (struct layout){MODEL_SILU, 2, 1, 4, 1, "1f1b", "", 0, "", 0, 1};
    grid[n++] = (struct layout){MODEL_SILU, 2, 2, 4, 1, "gpipe", "", 0, "", 0, 1};
    CDP_ASSERT((size_t)n <= sizeof grid / sizeof grid[0]);
    return cr_make_param_array(struct layout, grid, cdp_test_sample_cells(grid, (size_t)n, sizeof grid[0]));
}

ParameterizedTest(struct layout *l, pipeline, layouts_equal_one_rank, .timeout = 240)
{
    need_mpi();
    const char *d = cdp_test_tmpdir();
    char dir[4096], base[4200], pipe[4200], path_a[4300], path_b[4300];
    snprintf(dir, sizeof dir, "%s", d);
    write_plan(dir, "one", l, 1);
    write_plan(dir, "pipe", l, 0);
    snprintf(base, sizeof base, "%s/one.json", dir);
    snprintf(pipe, sizeof pipe, "%s/pipe.json", dir);
    run_ok(base);
    run_ok(pipe);
    double la[8], lb[8];
    snprintf(path_a, sizeof path_a, "%s/one.jsonl", dir);
    snprintf(path_b, sizeof path_b, "%s/pipe.jsonl", dir);
    int na = read_losses(path_a, la, 8), nb = read_losses(path_b, lb, 8);
    cr_assert_eq(na, 3);
    cr_assert_eq(nb, 3);
    for (int i = 0; i < 3; i++)
        cr_assert_leq(fabs(la[i] - lb[i]), 1e-5 * fabs(la[i]), "%s p=%d R=%d m=%d: step %d loss %.9g vs %.9g",
                      l->schedule, l->p, l->R, l->m, i + 1, lb[i], la[i]);
    snprintf(path_a, sizeof path_a, "%s/one.safetensors", dir);
    snprintf(path_b, sizeof path_b, "%s/pipe.safetensors", dir);
    double e = compare_weights(path_a, path_b);
    cr_assert_leq(e, 1e-5, "%s %s p=%d R=%d m=%d: weights differ by %.3g", model_name(l->model),
                  l->schedule, l->p, l->R, l->m, e);
    cr_log_info("%s %s p=%d R=%d m=%d %s%s%s%s: worst weight error %.3g",
                model_name(l->model), l->schedule, l->p, l->R, l->m,
                l->balance, l->recompute[0] ? " recompute " : "", l->recompute, l->zero == 2 ? " zero 2" : l->zero ? " zero 1" : "", e);
}

/* Tensor groups (docs/parallelism.md): an MLP of split linears, and GPT
 * (tied and untied) and Llama blocks split by heads, train as one rank does,
 * for t 2 and 4 with stages and replicas, every kind of schedule,
 * recomputation and ZeRO; the metrics' layout record and the trace name each
 * rank's tensor index. */
ParameterizedTestParameters(pipeline, tensor_layouts_equal_one_rank)
{
    static struct layout grid[64];
    int n = 0;
    for (int t = 2; t <= 4; t *= 2)
        for (int p = 1; p <= 2; p++)
            for (int R = 1; R <= 2; R++)
                grid[n++] = (struct layout){MODEL_SPLIT, p, R, 2 * p, 1, "1f1b", "", 0, "", 0, t};
    grid[n++] = (struct layout){MODEL_SPLIT, 2, 2, 4, 1, "gpipe", "", 0, "", 0, 2};
    grid[n++] = (struct layout){MODEL_SPLIT, 2, 1, 4, 2, "interleaved", "", 0, "", 0, 2};
    grid[n++] = (struct layout){MODEL_SPLIT, 2, 2, 4, 1, "zb-h1", "", 0, "", 0, 2};
    grid[n++] = (struct layout){MODEL_SPLIT, 2, 1, 4, 2, "zbv", "", 0, "", 0, 2};
    grid[n++] = (struct layout){MODEL_SPLIT, 2, 2, 4, 1, "1f1b", "", 0, "selective", 0, 2};
    grid[n++] = (struct layout){MODEL_SPLIT, 2, 1, 4, 1, "1f1b", "", 0, "full", 0, 4};
    grid[n++] = (struct layout){MODEL_SPLIT, 1, 2, 2, 1, "1f1b", "", 0, "", 1, 2};
    grid[n++] = (struct layout){MODEL_SPLIT, 2, 2, 4, 1, "1f1b", "", 0, "", 2, 2};
    grid[n++] = (struct layout){MODEL_VOCAB, 2, 2, 4, 1, "1f1b", "", 0, "", 0, 2};
    grid[n++] = (struct layout){MODEL_VOCAB, 1, 1, 2, 1, "1f1b", "", 0, "", 0, 4};
    grid[n++] = (struct layout){MODEL_VOCAB, 2, 1, 4, 2, "zbv", "", 0, "full", 1, 2};
    /* blocks split by heads: GPT untied and tied (the tie between stages, or within rank 0 under zbv), Llama */
    grid[n++] = (struct layout){MODEL_GPT_T, 1, 1, 2, 1, "1f1b", "", 0, "", 0, 2};
    grid[n++] = (struct layout){MODEL_GPT_T, 2, 1, 4, 1, "1f1b", "", 0, "", 0, 4};
    grid[n++] = (struct layout){MODEL_GPT_T, 2, 1, 4, 1, "zb-h1", "", 0, "selective", 0, 2};
    grid[n++] = (struct layout){MODEL_GPT_T, 1, 2, 2, 1, "1f1b", "", 0, "full", 2, 2};
    grid[n++] = (struct layout){MODEL_GPT_T, 2, 2, 4, 2, "zbv", "", 0, "full", 1, 2};
    grid[n++] = (struct layout){MODEL_GPT_T_TIED, 2, 1, 4, 1, "1f1b", "", 0, "", 0, 2};
    grid[n++] = (struct layout){MODEL_GPT_T_TIED, 2, 1, 4, 2, "interleaved", "", 0, "full", 0, 2};
    grid[n++] = (struct layout){MODEL_GPT_T_TIED, 2, 1, 4, 2, "zbv", "", 0, "selective", 0, 2};
    grid[n++] = (struct layout){MODEL_GPT_T_TIED, 1, 2, 2, 1, "1f1b", "", 0, "selective", 1, 4};
    grid[n++] = (struct layout){MODEL_GPT_T_TIED, 1, 1, 2, 1, "1f1b", "", 0, "", 0, 2};
    grid[n++] = (struct layout){MODEL_GPT_T_TIED, 2, 2, 4, 1, "1f1b", "", 0, "", 0, 2};
    grid[n++] = (struct layout){MODEL_LLAMA, 1, 1, 2, 1, "1f1b", "", 0, "", 0, 2};
    grid[n++] = (struct layout){MODEL_LLAMA, 2, 1, 4, 2, "zbv", "", 0, "selective", 0, 2};
    grid[n++] = (struct layout){MODEL_LLAMA, 2, 2, 4, 1, "1f1b", "", 0, "full", 2, 2};
    grid[n++] = (struct layout){MODEL_LLAMA_T, 1, 1, 2, 1, "1f1b", "", 0, "", 0, 4};
    grid[n++] = (struct layout){MODEL_LLAMA_T, 2, 1, 4, 2, "interleaved", "", 0, "", 0, 2};
    grid[n++] = (struct layout){MODEL_LLAMA_LIST, 2, 1, 4, 1, "zb-h1", "", 0, "full", 0, 2};
    grid[n++] = (struct layout){MODEL_LLAMA_LIST, 1, 2, 2, 1, "1f1b", "", 0, "selective", 1, 2};
    /* three stages (at most 8 ranks a cell: 3 stages x t 2 x 1 replica) */
    grid[n++] = (struct layout){MODEL_GPT_T_TIED, 3, 1, 3, 1, "1f1b", "", 0, "", 0, 2};
    grid[n++] = (struct layout){MODEL_SPLIT, 3, 1, 3, 2, "interleaved", "", 0, "", 0, 2};
    grid[n++] = (struct layout){MODEL_SPLIT, 3, 1, 3, 2, "zbv", "", 0, "", 0, 2};
    grid[n++] = (struct layout){MODEL_GPT_T, 3, 1, 3, 1, "1f1b", "", 0, "full", 1, 2};
    CDP_ASSERT((size_t)n <= sizeof grid / sizeof grid[0]);
    return cr_make_param_array(struct layout, grid, cdp_test_sample_cells(grid, (size_t)n, sizeof grid[0]));
}

static void tensor_layout_equals_one_rank(struct layout *l);

ParameterizedTest(struct layout *l, pipeline, tensor_layouts_equal_one_rank, .timeout = 240)
{
    tensor_layout_equals_one_rank(l);
}

/* GPT's list types at t > 1 (docs/parallelism.md): attention split by heads
 * between replicated layernorms, beside a vocab-parallel embedding and a
 * pair of split linears; t 2 and 4, stages 1-3, split backward, recomputation
 * and ZeRO. */
ParameterizedTestParameters(pipeline, attention_list_layouts_equal_one_rank)
{
    static struct layout grid[8];
    int n = 0;
    grid[n++] = (struct layout){MODEL_ATT_LIST, 1, 1, 2, 1, "1f1b", "", 0, "", 0, 2};
    grid[n++] = (struct layout){MODEL_ATT_LIST, 1, 2, 2, 1, "1f1b", "", 0, "selective", 1, 4};
    grid[n++] = (struct layout){MODEL_ATT_LIST, 2, 1, 4, 1, "zb-h1", "", 0, "full", 0, 4};
    grid[n++] = (struct layout){MODEL_ATT_LIST, 2, 1, 4, 2, "interleaved", "", 0, "full", 0, 2};
    grid[n++] = (struct layout){MODEL_ATT_LIST, 3, 1, 3, 2, "zbv", "", 0, "selective", 0, 2};
    CDP_ASSERT((size_t)n <= sizeof grid / sizeof grid[0]);
    return cr_make_param_array(struct layout, grid, cdp_test_sample_cells(grid, (size_t)n, sizeof grid[0]));
}

ParameterizedTest(struct layout *l, pipeline, attention_list_layouts_equal_one_rank, .timeout = 240)
{
    tensor_layout_equals_one_rank(l);
}

/* Sequence parallelism (docs/parallelism.md): the same, with the norms and
 * the residual stream on sequence shards of every tensor group. */
ParameterizedTestParameters(pipeline, sequence_parallel_layouts_equal_one_rank)
{
    static struct layout grid[16];
    int n = 0;
    grid[n++] = (struct layout){MODEL_GPT_T_TIED, 1, 1, 2, 1, "1f1b", "", 0, "", 0, 2};
    grid[n++] = (struct layout){MODEL_GPT_T_TIED, 2, 1, 4, 1, "1f1b", "", 0, "", 0, 4};
    grid[n++] = (struct layout){MODEL_GPT_T_TIED, 1, 2, 2, 1, "1f1b", "", 0, "selective", 1, 2};
    grid[n++] = (struct layout){MODEL_GPT_T_TIED, 2, 2, 4, 1, "1f1b", "", 0, "full", 2, 2};
    grid[n++] = (struct layout){MODEL_GPT_T_TIED, 2, 1, 4, 2, "interleaved", "", 0, "selective", 0, 2};
    grid[n++] = (struct layout){MODEL_GPT_T_TIED, 2, 1, 4, 2, "zbv", "", 0, "full", 1, 2};
    grid[n++] = (struct layout){MODEL_GPT_T_TIED, 2, 2, 4, 1, "zb-h1", "", 0, "", 0, 4};
    grid[n++] = (struct layout){MODEL_GPT_T, 2, 1, 4, 1, "1f1b", "", 0, "", 1, 2};
    /* Llama: grouped-query attention, the untied head's RMS norm on the shards, the vocabulary padded */
    grid[n++] = (struct layout){MODEL_LLAMA_GQA, 1, 1, 2, 1, "1f1b", "", 0, "", 0, 2};
    grid[n++] = (struct layout){MODEL_LLAMA_GQA, 2, 1, 4, 1, "1f1b", "", 0, "selective", 1, 4};
    grid[n++] = (struct layout){MODEL_LLAMA_GQA, 2, 1, 4, 2, "zbv", "", 0, "full", 0, 2};
    grid[n++] = (struct layout){MODEL_LLAMA_GQA, 1, 2, 2, 1, "1f1b", "", 0, "full", 1, 2};
    grid[n++] = (struct layout){MODEL_LLAMA_GQA, 2, 1, 4, 2, "zbv", "", 0, "selective", 0, 4};
    CDP_ASSERT((size_t)n <= sizeof grid / sizeof grid[0]);
    return cr_make_param_array(struct layout, grid, cdp_test_sample_cells(grid, (size_t)n, sizeof grid[0]));
}

ParameterizedTest(struct layout *l, pipeline, sequence_parallel_layouts_equal_one_rank, .timeout = 240)
{
    plan_sp = 1;
    tensor_layout_equals_one_rank(l);
}

/* /parallel/comm_dtype "bf16" (docs/parallelism.md): two replicas (ZeRO 0,
 * and ZeRO-2's reduce-scatter after each backward) and a tensor group of 2
 * (its all-reduces forward and backward). Each collective rounds its sums
 * to bf16 (8 bits of mantissa: up to 2^-9 = 2e-3 relative each); the loss,
 * a mean over every token, moves by less than one such rounding of itself
 * (2^-9 relative; 2e-5 at most measured here over three steps of AdamW at lr
 * 0.01), against 1e-5 for fp32 layouts. The weights are NOT those of the
 * same layout in fp32 (the key acts), and every replica ends with the same
 * bits (the run compares them and says so). */
ParameterizedTestParameters(pipeline, comm_dtype_bf16_close_to_one_rank)
{
    static struct layout grid[8];
    int n = 0;
    grid[n++] = (struct layout){MODEL_GPT, 1, 2, 2, 1, "1f1b", "", 0, "", 0, 1};
    grid[n++] = (struct layout){MODEL_GPT, 1, 2, 2, 1, "1f1b", "", 0, "", 2, 1};
    grid[n++] = (struct layout){MODEL_GPT_T, 1, 1, 2, 1, "1f1b", "", 0, "", 0, 2};
    CDP_ASSERT((size_t)n <= sizeof grid / sizeof grid[0]);
    return cr_make_param_array(struct layout, grid, (size_t)n);
}

static void run_out(const char *plan, char **out)
{
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", plan, NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s failed (%d): %s", plan, r.exit_code, r.err);
    *out = r.out;
    r.out = NULL;
    cdp_test_run_free(&r);
}

ParameterizedTest(struct layout *l, pipeline, comm_dtype_bf16_close_to_one_rank, .timeout = 240)
{
    need_mpi();
    char dir[4096], one[4200], f32[4200], b16[4200], a[4300], b[4300];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    write_plan(dir, "one", l, 1);
    write_plan(dir, "f32", l, 0);
    plan_comm = "\"bf16\"";
    write_plan(dir, "b16", l, 0);
    plan_comm = "";
    snprintf(one, sizeof one, "%s/one.json", dir);
    snprintf(f32, sizeof f32, "%s/f32.json", dir);
    snprintf(b16, sizeof b16, "%s/b16.json", dir);
    run_ok(one);
    run_ok(f32);
    char *out = NULL;
    run_out(b16, &out);
    if (l->R > 1)
        cr_assert(strstr(out, "replicas: the same weights on all 2, bit for bit"), "no replica check:\n%s", out);
    free(out);
    double la[8], lb[8];
    snprintf(a, sizeof a, "%s/one.jsonl", dir);
    snprintf(b, sizeof b, "%s/b16.jsonl", dir);
    cr_assert_eq(read_losses(a, la, 8), 3);
    cr_assert_eq(read_losses(b, lb, 8), 3);
    double worst = 0;
    for (int i = 0; i < 3; i++) {
        cr_assert_leq(fabs(la[i] - lb[i]), 0x1p-9 * fabs(la[i]), "bf16 t=%d R=%d zero %d: step %d loss %.9g, one fp32 "
                      "rank %.9g", l->t, l->R, l->zero, i + 1, lb[i], la[i]);
        worst = fmax(worst, fabs(la[i] - lb[i]) / fabs(la[i]));
    }
    snprintf(a, sizeof a, "%s/f32.safetensors", dir);
    snprintf(b, sizeof b, "%s/b16.safetensors", dir);
    const double e = compare_weights(a, b);
    cr_assert_gt(e, 0.0, "bf16 on the wire trained the same bits as fp32: the key did nothing");
    snprintf(a, sizeof a, "%s/one.safetensors", dir);
    cr_log_info("bf16 t=%d R=%d zero %d: losses within %.2g relative of one rank; weights %.3g from fp32's, %.3g from "
                "one rank's", l->t, l->R, l->zero, worst, e, compare_weights(a, b));
}

/* On CUDA bf16 on the wire is refused before anything runs, naming the key:
 * converting NCCL's bf16 sums back to fp32 needs a kernel not yet run on a
 * GPU (through the stand-in CUDA module; exit 2, bad input). */
Test(pipeline, comm_dtype_bf16_on_cuda_is_refused_naming_the_key)
{
    const char *fake = getenv("CDP_FAKE_CUDA_DIR");
    cr_assert_not_null(fake, "CDP_FAKE_CUDA_DIR is not set (run the tests through meson test)");
    const char *plan = cdp_test_write_file(
        cdp_test_tmpdir(), "cuda.json",
        "{\"model\": {\"preset\": \"gpt\", \"vocab\": 64, \"context\": 16, \"layers\": 2, \"heads\": 2, \"embed\": 32}, "
        "\"train\": {\"steps\": 1, \"micro_batch\": 2}, \"parallel\": {\"comm_dtype\": {\"gradients\": \"bf16\"}}, "
        "\"cluster\": {\"backend\": \"cuda\"}}");
    setenv("CDP_MODULE_DIR", fake, 1);
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"-q", "--plan", plan, NULL}), 0);
    unsetenv("CDP_MODULE_DIR");
    cr_assert_eq(r.exit_code, 2, "exit %d: %s", r.exit_code, r.err);
    cr_assert(strstr(r.err, "cuda.json: /parallel/comm_dtype: \"bf16\" on CUDA needs a kernel not yet run on a GPU"),
              "%s", r.err);
    cdp_test_run_free(&r);
}

static void tensor_layout_equals_one_rank(struct layout *l)
{
    need_mpi();
    char dir[4096], one[4200], pipe[4200], a[4300], b[4300];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    write_plan(dir, "one", l, 1);
    write_plan(dir, "pipe", l, 0);
    snprintf(one, sizeof one, "%s/one.json", dir);
    snprintf(pipe, sizeof pipe, "%s/pipe.json", dir);
    run_ok(one);
    run_ok(pipe);
    double la[8], lb[8];
    snprintf(a, sizeof a, "%s/one.jsonl", dir);
    snprintf(b, sizeof b, "%s/pipe.jsonl", dir);
    cr_assert_eq(read_losses(a, la, 8), 3);
    cr_assert_eq(read_losses(b, lb, 8), 3);
    for (int i = 0; i < 3; i++)
        cr_assert_leq(fabs(la[i] - lb[i]), 1e-5 * fabs(la[i]), "t=%d %s p=%d R=%d: step %d loss %.9g vs %.9g", l->t,
                      l->schedule, l->p, l->R, i + 1, lb[i], la[i]);
    char *text = cdp_test_read_file(b);
    char want[64];
    snprintf(want, sizeof want, "\"tensor\": %d", l->t - 1);
    cr_assert(text && strstr(text, "\"tensor\": ") && strstr(text, want), "%s names every rank's tensor index", b);
    cr_assert(strstr(text, "\"tensor_comm_s\": "), "%s has the tensor groups' all-reduce time", b);
    free(text);
    /* the model's FLOPs of a step whatever t: a slice each, a replicated unit once */
    double flops[2];
    for (int f = 0; f < 2; f++) {
        snprintf(a, sizeof a, "%s/%s.jsonl", dir, f ? "pipe" : "one");
        text = cdp_test_read_file(a);
        const char *fl = text ? strstr(text, "\"flops_per_s\": ") : NULL, *ti = text ? strstr(text, "\"time_s\": ") : NULL;
        cr_assert(fl && ti, "%s: a step record", a);
        flops[f] = strtod(fl + 15, NULL) * strtod(ti + 10, NULL);
        free(text);
    }
    cr_assert_leq(fabs(flops[1] - flops[0]), 1e-6 * flops[0], "FLOPs of a step: %g at t=%d, %g on one rank", flops[1],
                  l->t, flops[0]);
    snprintf(a, sizeof a, "%s/pipe-trace.json", dir);
    text = cdp_test_read_file(a);
    snprintf(want, sizeof want, ", tensor %d,", l->t - 1);
    cr_assert(text && strstr(text, want), "%s labels the ranks with their tensor index", a);
    free(text);
    snprintf(a, sizeof a, "%s/one.safetensors", dir);
    snprintf(b, sizeof b, "%s/pipe.safetensors", dir);
    const double e = compare_weights(a, b);
    cr_assert_leq(e, 1e-5, "%s t=%d %s p=%d R=%d: weights differ by %.3g", model_name(l->model), l->t, l->schedule,
                  l->p, l->R, e);
    cr_log_info("%s t=%d %s p=%d R=%d %s zero %d: worst weight error %.3g", model_name(l->model), l->t, l->schedule,
                l->p, l->R, l->recompute, l->zero, e);
}

/* Placement "topology" at t = 2 on a CPU topology file (docs/planner.md,
 * "Tensor groups"): the placement search places the two stages on the file's
 * two groups of 2 CPU devices (the dry-run says so), and the run trains as
 * one rank does (losses and weights, 1e-5). */
Test(pipeline, searched_tensor_groups_train_as_one_rank, .timeout = 240)
{
    need_mpi();
    char dir[4096], plan[4300];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    const char *topo = cdp_test_write_file(dir, "cpus.json", "{\"name\": \"four cpus\", \"source\": \"a test\", "
                                                             "\"kind\": \"cpu\", \"gpus\": 4}");
    snprintf(plan_cluster, sizeof plan_cluster, "{\"backend\": \"cpu\", \"topology\": \"%s\"}", topo);
    struct layout l = {MODEL_GPT_T, 2, 1, 4, 1, "1f1b", "", 0, "", 0, 2};
    write_plan(dir, "pipe", &l, 0);
    snprintf(plan, sizeof plan, "%s/pipe.json", dir);
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", plan, "--dry-run", NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_expect(strstr(r.out, "Plan: placement (exact over 2 groups of 2 devices: "), "%s", r.out);
    cdp_test_run_free(&r);
    tensor_layout_equals_one_rank(&l);
    snprintf(plan_cluster, sizeof plan_cluster, "{\"backend\": \"cpu\"}");
}

/* The same layout with every recompute mode: the same kernels on the same
 * inputs in the same order, so the same losses and weights to the bit. */
Test(pipeline, recomputation_trains_bit_identically, .timeout = 240)
{
    need_mpi();
    char dir[4096], a[4300], b[4300], plan[4300];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    static const char *const modes[] = {"none", "selective", "full"};
    double base[8];
    for (int i = 0; i < 3; i++) {
        struct layout l = {MODEL_GPT, 2, 2, 4, 1, "1f1b", "", 0, "", 0, 1};
        snprintf(l.recompute, sizeof l.recompute, "%s", modes[i]);
        write_plan(dir, modes[i], &l, 0);
        snprintf(plan, sizeof plan, "%s/%s.json", dir, modes[i]);
        run_ok(plan);
        double loss[8];
        snprintf(b, sizeof b, "%s/%s.jsonl", dir, modes[i]);
        cr_assert_eq(read_losses(b, loss, 8), 3);
        char *text = cdp_test_read_file(b);
        char want[64];
        snprintf(want, sizeof want, "\"recompute\": \"%s\"", modes[i]);
        cr_assert(text && strstr(text, want), "%s: the layout record names the mode", b);
        free(text);
        if (i == 0) {
            memcpy(base, loss, sizeof base);
            continue;
        }
        for (int k = 0; k < 3; k++) cr_assert_eq(loss[k], base[k], "%s: step %d loss %.9g vs %.9g", modes[i], k + 1,
                                                 loss[k], base[k]);
        snprintf(a, sizeof a, "%s/none.safetensors", dir);
        snprintf(b, sizeof b, "%s/%s.safetensors", dir, modes[i]);
        cr_assert_eq(compare_weights(a, b), 0.0, "%s: the weights differ from none", modes[i]);
    }
}

/* ZeRO-1 against every replica stepping everything: each replica steps its
 * shard with the same kernels on the same reduced gradients (the
 * reduce-scatter's shard is the all-reduce's sum, comm suite), so the same
 * losses and weights to the bit. ZeRO-2 reduces each micro-batch's gradient
 * as its backward makes it, so its sums are in another order: within 1e-5
 * of the others, as the layout grid. Each rank's peak memory is what the
 * planner predicted for its shard, and less with each stage. */
Test(pipeline, zero_trains_bit_identically_and_keeps_less, .timeout = 240)
{
    need_mpi();
    char dir[4096], a[4300], b[4300], plan[4300];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    static const int shapes[][3] = {{1, 3, 2}, {2, 2, 4}};
    for (size_t q = 0; q < sizeof shapes / sizeof shapes[0]; q++) {
        double loss[3][8], peak[3] = {0, 0, 0};
        for (int z = 0; z < 3; z++) {
            struct layout l = {MODEL_GPT, shapes[q][0], shapes[q][1], shapes[q][2], 1, "1f1b", "", 0, "none", z, 1};
            char name[32];
            snprintf(name, sizeof name, "z%zu-%d", q, z);
            write_plan(dir, name, &l, 0);
            snprintf(plan, sizeof plan, "%s/%s.json", dir, name);
            run_ok(plan);
            snprintf(b, sizeof b, "%s/%s.jsonl", dir, name);
            cr_assert_eq(read_losses(b, loss[z], 8), 3);
            char *text = cdp_test_read_file(b);
            cr_assert_not_null(text);
            char want[32];
            snprintf(want, sizeof want, "\"zero\": %d", z);
            cr_assert(strstr(text, want), "%s: the layout record names zero %d", b, z);
            /* the last record's ranks: measured peak == predicted */
            const char *last = NULL;
            for (const char *c = strstr(text, "\"peak_memory_bytes\": "); c; c = strstr(c + 1, "\"peak_memory_bytes\": "))
                last = c;
            for (const char *c = last; c; c = strstr(c + 1, "\"peak_memory_bytes\": ")) {
                const double pk = strtod(c + strlen("\"peak_memory_bytes\": "), NULL);
                const char *pr = strstr(c, "\"predicted_memory_bytes\": ");
                cr_assert_not_null(pr);
                cr_assert_eq(pk, strtod(pr + strlen("\"predicted_memory_bytes\": "), NULL), "%s: peak %.0f", b, pk);
                if (pk > peak[z]) peak[z] = pk;
            }
            free(text);
        }
        for (int k = 0; k < 3; k++) {
            cr_assert_eq(loss[1][k], loss[0][k], "shape %zu step %d: loss %.9g vs %.9g", q, k + 1, loss[1][k],
                         loss[0][k]);
            cr_assert_leq(fabs(loss[2][k] - loss[0][k]), 1e-5 * fabs(loss[0][k]),
                          "shape %zu step %d: ZeRO-2's loss %.9g vs %.9g", q, k + 1, loss[2][k], loss[0][k]);
        }
        snprintf(a, sizeof a, "%s/z%zu-0.safetensors", dir, q);
        snprintf(b, sizeof b, "%s/z%zu-1.safetensors", dir, q);
        cr_assert_eq(compare_weights(a, b), 0.0, "shape %zu: ZeRO-1's weights differ", q);
        snprintf(b, sizeof b, "%s/z%zu-2.safetensors", dir, q);
        const double e2 = compare_weights(a, b);
        cr_assert_leq(e2, 1e-5, "shape %zu: ZeRO-2's weights differ by %.3g", q, e2);
        cr_assert_lt(peak[1], peak[0], "shape %zu: peak %.0f with zero 1, %.0f without", q, peak[1], peak[0]);
        cr_assert_lt(peak[2], peak[1], "shape %zu: peak %.0f with zero 2, %.0f with zero 1", q, peak[2], peak[1]);
        cr_log_info("%d x %d: largest peak %.0f -> %.0f (zero 1) -> %.0f bytes (zero 2); zero 2 weights within %.3g",
                    shapes[q][0], shapes[q][1], peak[0], peak[1], peak[2], e2);
    }
}

Test(pipeline, trace_has_a_track_per_rank_and_forward_backward_boxes)
{
    need_mpi();
    const char *d = cdp_test_tmpdir();
    char dir[4096], plan[4200], path[4300];
    snprintf(dir, sizeof dir, "%s", d);
    struct layout l = {MODEL_GPT, 2, 2, 4, 1, "1f1b", "", 0, "", 0, 1};
    write_plan(dir, "pipe", &l, 0);
    snprintf(plan, sizeof plan, "%s/pipe.json", dir);
    run_ok(plan);
    snprintf(path, sizeof path, "%s/pipe-trace.json", dir);
    char *t = cdp_test_read_file(path);
    cr_assert_not_null(t);
    /* each track named after the rank's place in the layout */
    for (int r = 0; r < 4; r++) {
        char want[64];
        snprintf(want, sizeof want, "\"name\": \"rank %d: stage ", r);
        cr_assert(strstr(t, want), "no track for rank %d: %s", r, t);
    }
    cr_assert(strstr(t, "stage 1, replica 1, node 0, device "), "%s", t);
    cr_assert(strstr(t, "\"name\": \"F3\"") && strstr(t, "\"name\": \"B0\""), "F and B boxes by micro-batch");
    free(t);
}

/* A run's Chrome trace: the stage of each rank (from its track's name) and its
 * events. */
struct trace_view {
    json_t *root, *events;
    int ranks, stage[8];
};

static void read_trace(const char *path, int ranks, struct trace_view *v)
{
    json_error_t err;
    *v = (struct trace_view){.ranks = ranks};
    v->root = json_load_file(path, 0, &err);
    cr_assert_not_null(v->root, "%s: %s (line %d)", path, err.text, err.line);
    v->events = json_object_get(v->root, "traceEvents");
    cr_assert(json_is_array(v->events), "%s has no traceEvents", path);
    for (int r = 0; r < ranks; r++) v->stage[r] = -1;
    size_t i;
    json_t *e;
    json_array_foreach(v->events, i, e) {
        if (strcmp(json_string_value(json_object_get(e, "ph")), "M")) continue;
        const char *name = json_string_value(json_object_get(json_object_get(e, "args"), "name"));
        int r, s;
        if (name && sscanf(name, "rank %d: stage %d,", &r, &s) == 2 && r >= 0 && r < ranks) v->stage[r] = s;
    }
    for (int r = 0; r < ranks; r++) cr_assert_geq(v->stage[r], 0, "%s: no track named for rank %d", path, r);
}

struct span {
    double ts, end;
    const char *name;
};

static int span_cmp(const void *a, const void *b)
{
    const struct span *x = a, *y = b;
    if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
    return (x->end < y->end) - (x->end > y->end); /* the enclosing one first */
}

/* Chrome's "X" events on one track must nest: each after the one before it
 * ends, or inside it (overlapping buckets on one comm track did not). */
static void assert_tracks_nest(const struct trace_view *v, int tracks)
{
    const size_t n = json_array_size(v->events);
    struct span *sp = malloc((n + 1) * sizeof *sp), *open = malloc((n + 1) * sizeof *open);
    cr_assert(sp && open);
    for (int tid = 0; tid < tracks; tid++) {
        size_t k = 0, i;
        json_t *e;
        json_array_foreach(v->events, i, e) {
            if (strcmp(json_string_value(json_object_get(e, "ph")), "X") ||
                json_integer_value(json_object_get(e, "tid")) != tid)
                continue;
            const double ts = json_number_value(json_object_get(e, "ts"));
            sp[k++] = (struct span){ts, ts + json_number_value(json_object_get(e, "dur")),
                                    json_string_value(json_object_get(e, "name"))};
        }
        qsort(sp, k, sizeof *sp, span_cmp);
        size_t depth = 0;
        for (size_t q = 0; q < k; q++) {
            while (depth && open[depth - 1].end <= sp[q].ts) depth--;
            cr_assert(!depth || sp[q].end <= open[depth - 1].end + 1e-3,
                      "tid %d: \"%s\" [%.3f, %.3f] overlaps \"%s\" [%.3f, %.3f] without nesting", tid, sp[q].name,
                      sp[q].ts, sp[q].end, open[depth - 1].name, open[depth - 1].ts, open[depth - 1].end);
            open[depth++] = sp[q];
        }
    }
    free(sp);
    free(open);
}

/* The comm events of rank r named `kind` (up to " mb"), with step `step` (0: any). */
static int count_comm(const struct trace_view *v, int r, const char *kind, int step)
{
    int n = 0;
    size_t i;
    json_t *e;
    json_array_foreach(v->events, i, e) {
        const char *name = json_string_value(json_object_get(e, "name"));
        if (strcmp(json_string_value(json_object_get(e, "ph")), "X") || strncmp(name, kind, strlen(kind)) ||
            (name[strlen(kind)] && name[strlen(kind)] != ' '))
            continue;
        json_t *args = json_object_get(e, "args");
        if (step && json_integer_value(json_object_get(args, "step")) != step) continue;
        const int tid = (int)json_integer_value(json_object_get(e, "tid"));
        if (tid < v->ranks || tid % v->ranks != r) continue; /* rank r's comm tracks: ranks x (lane + 1) + r */
        n++;
    }
    return n;
}

/* Communication in the trace (issue 19): every send and receive on its rank's
 * own comm track (tid ranks + rank, named "rank N comm"; what overlaps there
 * on further tracks ranks x k + rank, "rank N comm k+1"), with bytes and the
 * peer's rank; an all-reduce of the gradients per rank per step among the
 * stage's replicas; and the compute tracks carry no communication. */
Test(pipeline, trace_has_sends_receives_and_all_reduces_on_a_comm_track)
{
    need_mpi();
    const char *d = cdp_test_tmpdir();
    char dir[4096], plan[4200], path[4300];
    snprintf(dir, sizeof dir, "%s", d);
    struct layout l = {MODEL_GPT, 2, 2, 4, 1, "1f1b", "", 0, "", 0, 1};
    write_plan(dir, "comm", &l, 0);
    snprintf(plan, sizeof plan, "%s/comm.json", dir);
    run_ok(plan);
    snprintf(path, sizeof path, "%s/comm-trace.json", dir);
    struct trace_view v;
    read_trace(path, 4, &v);
    const int steps = 3, m = 4;
    size_t i;
    json_t *e;
    int comm_named[4] = {0};
    json_array_foreach(v.events, i, e) {
        const int tid = (int)json_integer_value(json_object_get(e, "tid"));
        const char *ph = json_string_value(json_object_get(e, "ph"));
        json_t *args = json_object_get(e, "args");
        if (!strcmp(ph, "M")) {
            const char *name = json_string_value(json_object_get(args, "name"));
            char want[32];
            snprintf(want, sizeof want, "rank %d comm", tid % 4);
            if (tid >= 4 && name && !strncmp(name, want, strlen(want)) && (tid < 8) == !name[strlen(want)])
                comm_named[tid % 4] += tid < 8;
            continue;
        }
        const int comm = !strcmp(json_string_value(json_object_get(e, "cat")), "comm");
        cr_assert_eq(comm, tid >= 4, "event %s on tid %d: comm events on tids 4 and up only",
                     json_string_value(json_object_get(e, "name")), tid);
        if (!comm) continue;
        cr_assert_gt(json_integer_value(json_object_get(args, "bytes")), 0, "event %zu has no bytes", i);
        cr_assert_geq(json_real_value(json_object_get(e, "dur")), 0);
        const char *name = json_string_value(json_object_get(e, "name"));
        const int r = tid % 4;
        if (!strncmp(name, "send", 4) || !strncmp(name, "recv", 4)) {
            const int peer = (int)json_integer_value(json_object_get(args, "peer"));
            cr_assert(peer >= 0 && peer < 4 && v.stage[peer] == 1 - v.stage[r], "%s of rank %d (stage %d) with "
                      "rank %d", name, r, v.stage[r], peer);
            cr_assert_geq(json_integer_value(json_object_get(args, "micro_batch")), 0, "%s", name);
        } else {
            cr_assert_eq(json_integer_value(json_object_get(args, "ranks")), 2, "%s of rank %d", name, r);
            cr_assert(json_is_string(json_object_get(args, "group")), "%s of rank %d names no group", name, r);
        }
    }
    for (int r = 0; r < 4; r++) {
        cr_assert(comm_named[r], "no track named \"rank %d comm\"", r);
        const int first = v.stage[r] == 0;
        cr_assert_eq(count_comm(&v, r, first ? "send act" : "recv act", 0), steps * m, "rank %d", r);
        cr_assert_eq(count_comm(&v, r, first ? "recv grad" : "send grad", 0), steps * m, "rank %d", r);
        cr_assert_eq(count_comm(&v, r, first ? "recv act" : "send act", 0), 0, "rank %d", r);
        for (int s = 1; s <= steps; s++) {
            cr_assert_eq(count_comm(&v, r, "all-reduce", s), 1, "rank %d step %d: all-reduces", r, s);
            /* the GPT's embedding is tied between its first and last stage */
            cr_assert_eq(count_comm(&v, r, "tied all-reduce", s), 1, "rank %d step %d: tied reductions", r, s);
        }
    }
    assert_tracks_nest(&v, 4 * 65);
    json_decref(v.root);
}

/* Gradient buckets (issue 17): per rank and step, the start of the first
 * "bucket" event on the comm track and the end of the last backward ("B")
 * on the compute track, from the executor's own event times. */
struct overlap_view {
    double first_bucket[2][4], last_bwd_end[2][4]; /* [rank][step]; -1: none */
    int buckets[2][4], allreduces[2][4];
};

static void overlap_of(const char *path, struct overlap_view *o)
{
    struct trace_view v;
    read_trace(path, 2, &v);
    for (int r = 0; r < 2; r++)
        for (int s = 0; s < 4; s++) {
            o->first_bucket[r][s] = o->last_bwd_end[r][s] = -1;
            o->buckets[r][s] = o->allreduces[r][s] = 0;
        }
    size_t i;
    json_t *e;
    json_array_foreach(v.events, i, e) {
        if (strcmp(json_string_value(json_object_get(e, "ph")), "X")) continue;
        const char *name = json_string_value(json_object_get(e, "name"));
        const int tid = (int)json_integer_value(json_object_get(e, "tid"));
        const int step = (int)json_integer_value(json_object_get(json_object_get(e, "args"), "step"));
        const double ts = json_number_value(json_object_get(e, "ts")), dur = json_number_value(json_object_get(e, "dur"));
        if (step < 1 || step > 3) continue;
        if (tid < 2 && name[0] == 'B') {
            if (ts + dur > o->last_bwd_end[tid][step]) o->last_bwd_end[tid][step] = ts + dur;
        } else if (tid >= 2 && !strcmp(name, "bucket")) { /* rank tid % 2's comm tracks */
            double *f = &o->first_bucket[tid % 2][step];
            if (*f < 0 || ts < *f) *f = ts;
            o->buckets[tid % 2][step]++;
        } else if (tid >= 2 && !strcmp(name, "all-reduce")) {
            o->allreduces[tid % 2][step]++;
            if (o->first_bucket[tid % 2][step] < 0 && !o->buckets[tid % 2][step])
                o->first_bucket[tid % 2][step] = -ts - 1; /* the whole buffer's reduction: its start, negated */
        }
    }
    /* buckets in flight together are on tracks of their own: every track nests */
    assert_tracks_nest(&v, 2 * 65);
    json_decref(v.root);
}

/* cluster: the plan's /cluster object. Returns the run's messages (stderr, -v: info), to be freed. */
static char *run_buckets_on(const char *dir, const char *name, double bucket_mb, const char *cluster)
{
    char json[1536], file[64];
    snprintf(json, sizeof json,
             "{\"model\": {\"preset\": \"gpt\", \"vocab\": 64, \"context\": 16, \"layers\": 6, \"heads\": 2,"
             " \"embed\": 32}, \"data\": {\"source\": \"synthetic\", \"seed\": 3}, \"train\": {\"steps\": 3,"
             " \"micro_batch\": 2, \"eval_batches\": 1, \"timeout_s\": 60}, \"parallel\": {\"stages\": 1,"
             " \"replicas\": 2, \"micro_batches\": 2, \"bucket_mb\": %g}, \"cluster\": %s,"
             " \"output\": {\"trace\": \"%s-trace.json\", \"weights\": \"%s.safetensors\"}}",
             bucket_mb, cluster, name, name);
    snprintf(file, sizeof file, "%s.json", name);
    const char *plan = cdp_test_write_file(dir, file, json);
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"-v", "--plan", plan, NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s failed (%d): %s", plan, r.exit_code, r.err);
    char *err = strdup(r.err ? r.err : "");
    cdp_test_run_free(&r);
    return err;
}

static void run_buckets(const char *dir, const char *name, double bucket_mb)
{
    free(run_buckets_on(dir, name, bucket_mb, "{\"backend\": \"cpu\"}"));
}

/* From the traces and weights of the runs `on` (buckets) and `off`
 * (bucket_mb 0) in dir: every step of both ranks has at least 7 buckets (a GPT
 * of 6 blocks), the first starting before the last backward ends (one
 * all-reduce event spanning them where one_span); without buckets none, and
 * the one reduction starts after the last backward; the same weights. */
static void check_buckets(const char *dir, const char *on, const char *off, int one_span)
{
    char path[4300], wa[4300], wb[4300];
    struct overlap_view o;
    snprintf(path, sizeof path, "%s/%s-trace.json", dir, on);
    overlap_of(path, &o);
    for (int r = 0; r < 2; r++)
        for (int s = 1; s <= 3; s++) {
            cr_assert_geq(o.buckets[r][s], 7, "rank %d step %d: %d buckets (a GPT of 6 blocks)", r, s, o.buckets[r][s]);
            if (one_span)
                cr_assert_eq(o.allreduces[r][s], 1, "rank %d step %d: one all-reduce spanning the buckets", r, s);
            cr_assert(o.first_bucket[r][s] >= 0 && o.first_bucket[r][s] < o.last_bwd_end[r][s],
                      "rank %d step %d: the first bucket starts at %.1f us, the last backward ends at %.1f us", r, s,
                      o.first_bucket[r][s], o.last_bwd_end[r][s]);
        }
    snprintf(path, sizeof path, "%s/%s-trace.json", dir, off);
    overlap_of(path, &o);
    for (int r = 0; r < 2; r++)
        for (int s = 1; s <= 3; s++) {
            cr_assert_eq(o.buckets[r][s], 0, "rank %d step %d: no buckets with bucket_mb 0", r, s);
            cr_assert(o.first_bucket[r][s] < 0 && -o.first_bucket[r][s] - 1 >= o.last_bwd_end[r][s],
                      "rank %d step %d: without buckets the reduction starts after the last backward", r, s);
        }
    snprintf(wa, sizeof wa, "%s/%s.safetensors", dir, on);
    snprintf(wb, sizeof wb, "%s/%s.safetensors", dir, off);
    const double d = compare_weights(wa, wb);
    cr_assert_eq(d, 0.0, "the weights do not depend on the buckets: they differ by up to %g", d);
}

/* The first bucket's reduction starts while the step's last backward still
 * runs (the test fails when it starts only after it); with bucket_mb 0 there
 * are no buckets and the one reduction starts after the last backward; and
 * the weights are the same bits either way. */
Test(pipeline, gradient_buckets_reduce_while_the_last_backward_runs, .timeout = 240)
{
    need_mpi();
    const char *dir = cdp_test_tmpdir();
    run_buckets(dir, "bk", 0.001); /* 1 KiB: a bucket per unit */
    run_buckets(dir, "nobk", 0);
    check_buckets(dir, "bk", "nobk", 1);
}

/* The same on the cuda backend with a GPU per rank, so that the replicas'
 * reduction is the nccl communicator's non-blocking collectives (its own
 * stream, ordered by events), on the stand-in CUDA module (tests/fake-cuda:
 * its pretend NCCL completes a collective at its second test and does not
 * connect ranks, so each replica keeps its own gradients: the weights are
 * compared between buckets on and off, not with the cpu run). */
Test(pipeline, gradient_buckets_on_nccl_reduce_while_the_last_backward_runs, .timeout = 240)
{
    need_mpi();
    const char *fake = getenv("CDP_FAKE_CUDA_DIR");
    cr_assert_not_null(fake, "CDP_FAKE_CUDA_DIR is not set (run the tests through meson test)");
    const char *dir = cdp_test_tmpdir();
    setenv("CDP_MODULE_DIR", fake, 1);
    setenv("CDP_FAKE_GPUS", "2", 1);
    const char *cluster = "{\"backend\": \"cuda\", \"devices\": 2}";
    char *ea = run_buckets_on(dir, "nbk", 0.001, cluster); /* 1 KiB: a bucket per unit */
    char *eb = run_buckets_on(dir, "nnobk", 0, cluster);
    unsetenv("CDP_FAKE_GPUS");
    unsetenv("CDP_MODULE_DIR");
    cr_assert(strstr(ea, "rank 1: nccl, one GPU per rank"), "the replicas reduce through nccl: %s", ea);
    cr_assert(strstr(eb, "rank 0: nccl, one GPU per rank"), "the replicas reduce through nccl: %s", eb);
    free(ea);
    free(eb);
    check_buckets(dir, "nbk", "nnobk", 0);
}

/* Receives posted early (issue 17): on 2 stages with 1F1B, stage 0 posts the
 * gradient of its next micro-batch as soon as a BACKWARD has read the last,
 * so some "recv grad" event (from its posting to the arrival) spans a
 * forward the rank ran meanwhile; a blocking receive never would. */
Test(pipeline, gradients_are_received_while_the_rank_computes, .timeout = 120)
{
    need_mpi();
    const char *d = cdp_test_tmpdir();
    char dir[4096], plan[4200], path[4300];
    snprintf(dir, sizeof dir, "%s", d);
    struct layout l = {MODEL_GPT, 2, 1, 4, 1, "1f1b", "", 0, "", 0, 1};
    write_plan(dir, "early", &l, 0);
    snprintf(plan, sizeof plan, "%s/early.json", dir);
    run_ok(plan);
    snprintf(path, sizeof path, "%s/early-trace.json", dir);
    struct trace_view v;
    read_trace(path, 2, &v);
    const int r0 = v.stage[0] == 0 ? 0 : 1;
    int spanning = 0;
    size_t i, j;
    json_t *a, *b;
    json_array_foreach(v.events, i, a) {
        if (strcmp(json_string_value(json_object_get(a, "ph")), "X") ||
            json_integer_value(json_object_get(a, "tid")) != 2 + r0 ||
            strncmp(json_string_value(json_object_get(a, "name")), "recv grad", 9))
            continue;
        const double s0 = json_number_value(json_object_get(a, "ts")), s1 = s0 + json_number_value(json_object_get(a, "dur"));
        json_array_foreach(v.events, j, b) {
            if (strcmp(json_string_value(json_object_get(b, "ph")), "X") ||
                json_integer_value(json_object_get(b, "tid")) != r0 || json_string_value(json_object_get(b, "name"))[0] != 'F')
                continue;
            const double f0 = json_number_value(json_object_get(b, "ts")), f1 = f0 + json_number_value(json_object_get(b, "dur"));
            spanning += f0 >= s0 && f1 <= s1;
        }
    }
    cr_assert_geq(spanning, 3, "stage 0's early receives span %d forwards (1F1B, m 4, 3 steps: at least one a step)",
                  spanning);
    json_decref(v.root);
}

/* An interleaved run's compute and transfers name their chunk (args and
 * name), and the run says where the trace and the timeline went. */
Test(pipeline, interleaved_trace_events_carry_their_chunk)
{
    need_mpi();
    const char *dir = cdp_test_tmpdir();
    const char *plan = cdp_test_write_file(
        dir, "inter.json",
        "{\"model\": {\"preset\": \"gpt\", \"vocab\": 32, \"context\": 8, \"layers\": 6, \"heads\": 2, \"embed\": 16},"
        " \"data\": {\"source\": \"synthetic\", \"seed\": 3}, \"train\": {\"steps\": 2, \"micro_batch\": 2,"
        " \"eval_batches\": 1, \"timeout_s\": 60}, \"parallel\": {\"stages\": 2, \"replicas\": 1, \"micro_batches\": 4,"
        " \"schedule\": \"interleaved\", \"chunks\": 2}, \"cluster\": {\"backend\": \"cpu\"},"
        " \"output\": {\"trace\": \"inter-trace.json\", \"timeline\": \"inter.svg\"}}");
    struct cdp_run run;
    cr_assert_eq(cdp_test_run(&run, (const char *[]){"--plan", plan, NULL}), 0);
    cr_assert_eq(run.exit_code, 0, "%s", run.err);
    char path[4300], want[4400];
    snprintf(path, sizeof path, "%s/inter-trace.json", dir);
    snprintf(want, sizeof want, "trace written to %s\n", path);
    cr_assert(strstr(run.out, want), "no \"%s\" in: %s", want, run.out);
    snprintf(want, sizeof want, "timeline written to %s/inter.svg\n", dir);
    cr_assert(strstr(run.out, want), "no \"%s\" in: %s", want, run.out);
    cdp_test_run_free(&run);
    struct trace_view v;
    read_trace(path, 2, &v);
    int seen[2][2][2] = {{{0}}}; /* [rank][forward, backward][chunk] */
    int sends = 0;
    size_t i;
    json_t *e;
    json_array_foreach(v.events, i, e) {
        if (strcmp(json_string_value(json_object_get(e, "ph")), "X")) continue;
        const char *cat = json_string_value(json_object_get(e, "cat"));
        const char *name = json_string_value(json_object_get(e, "name"));
        json_t *args = json_object_get(e, "args"), *chunk = json_object_get(args, "chunk");
        const int fwd = !strcmp(cat, "forward"), comm = !strcmp(cat, "comm");
        if (!fwd && strcmp(cat, "backward") && !(comm && !strncmp(name, "send act", 8))) continue;
        cr_assert(json_is_integer(chunk), "%s has no chunk", name);
        const int c = (int)json_integer_value(chunk);
        cr_assert(c == 0 || c == 1, "%s: chunk %d", name, c);
        char suffix[8];
        snprintf(suffix, sizeof suffix, " c%d", c);
        cr_assert(strlen(name) > 3 && !strcmp(name + strlen(name) - 3, suffix), "%s does not end in \"%s\"", name,
                  suffix);
        if (comm) {
            sends++;
            continue;
        }
        const int r = (int)json_integer_value(json_object_get(e, "tid"));
        cr_assert(r == 0 || r == 1, "compute on tid %d", r);
        seen[r][!fwd][c]++;
    }
    for (int r = 0; r < 2; r++)
        for (int b = 0; b < 2; b++)
            for (int c = 0; c < 2; c++)
                cr_assert_eq(seen[r][b][c], 2 * 4, "rank %d %s of chunk %d: %d", r, b ? "backward" : "forward", c,
                             seen[r][b][c]);
    /* 3 of the 4 virtual stages send activations on: 3 x 4 micro-batches x 2 steps */
    cr_assert_eq(sends, 3 * 4 * 2, "%d activation sends", sends);
    json_decref(v.root);
}

/* Faults: the job ends non-zero within 30 s, naming rank, stage, replica and
 * what it was doing. */
static struct cdp_run run_fault(const char *plan, const char *fault, double *seconds)
{
    struct cdp_run r;
    if (fault) setenv("CDP_FAULT", fault, 1);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", plan, NULL}), 0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    unsetenv("CDP_FAULT");
    *seconds = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
    return r;
}

static const char *fault_plan(const char *dir, int timeout_s, const char *data)
{
    char json[1024];
    snprintf(
        json, sizeof json,
        "{\"model\": {\"preset\": \"gpt\", \"vocab\": 256, \"context\": 8, \"layers\": 2, \"heads\": 2, "
        "\"embed\": 16}, %s, \"train\": {\"steps\": 4, \"micro_batch\": 2, \"timeout_s\": %d}, "
        "\"parallel\": {\"stages\": 2, \"replicas\": 1, \"micro_batches\": 4}, \"cluster\": {\"backend\": \"cpu\"}}",
        data ? data : "\"data\": {\"source\": \"synthetic\"}", timeout_s);
    return cdp_test_write_file(dir, "fault.json", json);
}

Test(pipeline, a_killed_rank_ends_the_job, .timeout = 60)
{
    need_mpi();
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    double s;
    struct cdp_run r = run_fault(fault_plan(dir, 20, NULL), "kill:1:2", &s);
    /* 1, not mpirun's 137, naming the rank that died and where the other waited */
    cr_assert_eq(r.exit_code, 1, "%s", r.err);
    cr_assert(strstr(r.err, "rank 1/2 (stage 1, replica 0) on node 0 (") && strstr(r.err, "died without a word") &&
                  strstr(r.err, "signal 9 (Killed)"),
              "%s", r.err);
    cr_assert(strstr(r.err, "stopped while at rank 0/2 (stage 0, replica 0), step 2:"), "%s", r.err);
    cr_log_info("killed rank: exit %d after %.1f s", r.exit_code, s);
    cdp_test_run_free(&r);
}

Test(pipeline, a_deadline_names_the_waiting_rank_and_instruction, .timeout = 60)
{
    need_mpi();
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    double s;
    struct cdp_run r = run_fault(fault_plan(dir, 2, NULL), "stall:0:2:25", &s);
    cr_assert_neq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.err, "rank 1/2 (stage 1, replica 0), step 2: RECV_ACT of micro-batch 0, from stage 0"),
              "%s", r.err);
    cr_assert(strstr(r.err, "timed out"), "%s", r.err);
    cr_log_info("deadline: exit %d after %.1f s", r.exit_code, s);
    cdp_test_run_free(&r);
}

Test(pipeline, an_unreadable_data_file_names_rank_and_file, .timeout = 60)
{
    need_mpi();
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    cdp_test_write_file(dir, "bad.bin", "this is not an llm.c token file, it is too short and has no magic");
    double s;
    struct cdp_run r = run_fault(fault_plan(dir, 20, "\"data\": {\"source\": \"tokens\", \"path\": \"bad.bin\"}"),
                                 NULL, &s);
    cr_assert_neq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.err, "bad.bin") && strstr(r.err, "(stage "), "%s", r.err);
    cdp_test_run_free(&r);
}

/* --no-launch prints the line that starts the job (exit 0), and that line,
 * run by sh without the test's Open MPI variables, trains: as root it sets
 * the two Open MPI needs (the line it printed before failed as root). */
Test(pipeline, no_launch_prints_the_line_that_starts_the_job, .timeout = 60)
{
    need_mpi();
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--no-launch", "--plan", fault_plan(dir, 20, NULL), NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.out, "the layout has 2 ranks: start them with\n"), "%s", r.out);
    const char *line = strstr(r.out, "start them with\n") + strlen("start them with\n");
    cr_assert(strstr(line, "mpirun -np 2 "), "%s", line);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "unset OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM "
             "OMPI_MCA_rmaps_base_oversubscribe; cd %s && %s", dir, line);
    cdp_test_run_free(&r);
    static char bin[4096];
    snprintf(bin, sizeof bin, "%s", getenv("CDP_BIN"));
    setenv("CDP_BIN", "/bin/sh", 1);
    const int started = cdp_test_run(&r, (const char *[]){"-c", cmd, NULL});
    setenv("CDP_BIN", bin, 1);
    cr_assert_eq(started, 0);
    cr_assert_eq(r.exit_code, 0, "%s: %s", cmd, r.err);
    cr_assert(strstr(r.out, "done: 4 steps"), "%s", r.out);
    cdp_test_run_free(&r);
}

/* The last value of `"key": [a, b, ...]` in a metrics file. */
static int last_list(const char *path, const char *key, long *out, int cap)
{
    char *text = cdp_test_read_file(path);
    cr_assert_not_null(text, "%s was not written", path);
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": [", key);
    const char *at = NULL;
    for (const char *c = strstr(text, pat); c; c = strstr(c + 1, pat)) at = c;
    int n = 0;
    if (at) {
        char *c = (char *)at + strlen(pat);
        while (n < cap && *c != ']') {
            out[n++] = strtol(c, &c, 10);
            while (*c == ',' || *c == ' ') c++;
        }
    }
    free(text);
    return n;
}

/* One rank made ten times slower (the CDP_FAULT slow knob): the first
 * rebalancing moves micro-batches to the fast replica and logs it, and the run
 * still equals one-rank training. Only the first move is asserted on: a
 * micro-batch here takes about a millisecond, so on a loaded machine a later
 * look may measure a preempted fast rank and move some back, which is what
 * rebalancing should do with what it measured. */
Test(pipeline, rebalancing_moves_micro_batches_to_fast_replicas, .timeout = 240)
{
    need_mpi();
    char dir[4096], base[4200], pipe[4200], a[4300], b[4300];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    struct layout l = {MODEL_GPT, 1, 2, 4, 1, "1f1b", "", 1, "", 0, 1};
    write_plan(dir, "one", &l, 1);
    write_plan(dir, "pipe", &l, 0);
    snprintf(base, sizeof base, "%s/one.json", dir);
    snprintf(pipe, sizeof pipe, "%s/pipe.json", dir);
    run_ok(base);
    double secs;
    struct cdp_run r = run_fault(pipe, "slow:1:10", &secs);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    const char *moved = strstr(r.out, "step 1: rebalanced micro-batches per replica 4 4 -> ");
    cr_assert(moved, "%s", r.out);
    long first[2] = {0, 0};
    cr_assert_eq(sscanf(strstr(moved, "-> ") + 3, "%ld %ld", &first[0], &first[1]), 2, "%s", r.out);
    cr_assert_gt(first[0], first[1], "4 4 -> %ld %ld: the slowed replica 1 should run fewer\n%s", first[0], first[1],
                 r.out);
    cr_assert_eq(first[0] + first[1], 8);
    snprintf(b, sizeof b, "%s/pipe.jsonl", dir);
    long shares[4];
    cr_assert_eq(last_list(b, "shares", shares, 4), 2);
    cr_assert_eq(shares[0] + shares[1], 8, "shares %ld %ld", shares[0], shares[1]);
    double la[8], lb[8];
    snprintf(a, sizeof a, "%s/one.jsonl", dir);
    cr_assert_eq(read_losses(a, la, 8), 3);
    cr_assert_eq(read_losses(b, lb, 8), 3);
    for (int i = 0; i < 3; i++)
        cr_assert_leq(fabs(la[i] - lb[i]), 1e-5 * fabs(la[i]), "step %d: loss %.9g vs %.9g", i + 1, lb[i], la[i]);
    snprintf(a, sizeof a, "%s/one.safetensors", dir);
    snprintf(b, sizeof b, "%s/pipe.safetensors", dir);
    double e = compare_weights(a, b);
    cr_assert_leq(e, 1e-5, "weights differ by %.3g", e);
    cr_log_info("rebalanced to %ld %ld, then %ld %ld; worst weight error %.3g", first[0], first[1], shares[0],
                shares[1], e);
    cdp_test_run_free(&r);
}

/* Rebalancing with tensor groups: the shares are a replica's, so a tensor
 * group moves as one (every rank of it reads the same micro-batches). Rank 2
 * (replica 1's tensor index 0) made twenty times slower: the first look moves
 * micro-batches to replica 0, and the run equals one-rank training. */
Test(pipeline, rebalancing_moves_a_tensor_group_s_micro_batches, .timeout = 240)
{
    need_mpi();
    char dir[4096], base[4200], pipe[4200], a[4300], b[4300];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    struct layout l = {MODEL_SPLIT, 1, 2, 4, 1, "1f1b", "", 1, "", 0, 2};
    write_plan(dir, "one", &l, 1);
    write_plan(dir, "pipe", &l, 0);
    snprintf(base, sizeof base, "%s/one.json", dir);
    snprintf(pipe, sizeof pipe, "%s/pipe.json", dir);
    run_ok(base);
    double secs;
    struct cdp_run r = run_fault(pipe, "slow:2:20", &secs);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    const char *moved = strstr(r.out, "step 1: rebalanced micro-batches per replica 4 4 -> ");
    cr_assert(moved, "%s", r.out);
    long first[2] = {0, 0};
    cr_assert_eq(sscanf(strstr(moved, "-> ") + 3, "%ld %ld", &first[0], &first[1]), 2, "%s", r.out);
    cr_assert_gt(first[0], first[1], "4 4 -> %ld %ld: the slowed replica 1 should run fewer\n%s", first[0], first[1],
                 r.out);
    cr_assert_eq(first[0] + first[1], 8);
    double la[8], lb[8];
    snprintf(a, sizeof a, "%s/one.jsonl", dir);
    snprintf(b, sizeof b, "%s/pipe.jsonl", dir);
    cr_assert_eq(read_losses(a, la, 8), 3);
    cr_assert_eq(read_losses(b, lb, 8), 3);
    for (int i = 0; i < 3; i++)
        cr_assert_leq(fabs(la[i] - lb[i]), 1e-5 * fabs(la[i]), "step %d: loss %.9g vs %.9g", i + 1, lb[i], la[i]);
    snprintf(a, sizeof a, "%s/one.safetensors", dir);
    snprintf(b, sizeof b, "%s/pipe.safetensors", dir);
    const double e = compare_weights(a, b);
    cr_assert_leq(e, 1e-5, "weights differ by %.3g", e);
    cr_log_info("t = 2: rebalanced to %ld %ld; worst weight error %.3g", first[0], first[1], e);
    cdp_test_run_free(&r);
}

/* The monitor: per-rank utilisation, memory and busy time in metrics.jsonl,
 * the slowest rank, and a warning naming a rank that is consistently slow.
 * Micro-batches of some milliseconds, so that a preempted fast rank on a
 * loaded machine does not look as slow as the one slowed 20 times. */
Test(pipeline, the_monitor_reports_ranks_and_names_a_straggler, .timeout = 120)
{
    need_mpi();
    char dir[4096], plan[4200], path[4300];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    char json[1024];
    snprintf(json, sizeof json,
             "{\"model\": {\"preset\": \"mlp\", \"input\": [256], \"hidden\": [256, 256], \"classes\": 5}, "
             "\"data\": {\"source\": \"synthetic\"}, \"train\": {\"steps\": 8, \"micro_batch\": 32, "
             "\"log_every\": 1, \"timeout_s\": 60}, \"parallel\": {\"stages\": 1, \"replicas\": 2, "
             "\"micro_batches\": 2}, \"cluster\": {\"backend\": \"cpu\"}, \"output\": {\"metrics\": \"m.jsonl\"}}");
    snprintf(plan, sizeof plan, "%s", cdp_test_write_file(dir, "mon.json", json));
    double secs;
    struct cdp_run r = run_fault(plan, "slow:1:20", &secs);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.out, "slowest r1"), "%s", r.out);
    cr_assert(strstr(r.out, "| cpu "), "%s", r.out);
    cr_assert(strstr(r.err, "rank 1 (stage 0, replica 1) has been the slowest of stage 0's replicas"), "%s", r.err);
    snprintf(path, sizeof path, "%s/m.jsonl", dir);
    char *t = cdp_test_read_file(path);
    cr_assert_not_null(t);
    cr_assert(strstr(t, "\"ranks\": [{\"rank\": 0, \"stage\": 0, \"replica\": 0, \"node\": 0, \"device\": "), "%s", t);
    cr_assert(strstr(t, "\"peak_memory_bytes\": ") && strstr(t, "\"predicted_memory_bytes\": "), "%s", t);
    cr_assert(strstr(t, "\"slowest_rank\": 1"), "%s", t);
    cr_assert(strstr(t, "\"straggler\": 1"), "%s", t);
    /* every rank holds some memory and did some work */
    const char *c = strstr(t, "\"mem_bytes\": ");
    cr_assert(c && strtod(c + 13, NULL) > 1e6, "%s", t);
    c = strstr(t, "\"busy_s\": ");
    cr_assert(c && strtod(c + 10, NULL) > 0, "%s", t);
    free(t);
    cdp_test_run_free(&r);
}

/* The executor's GPU path (device buffers the host does not touch, activations
 * and gradients staged through the host, every kernel through the device's
 * table, ranks sharing a device) on the stand-in CUDA module of
 * tests/fake-cuda (host memory run by the CPU kernels, treated as device
 * memory): it must train exactly as the cpu backend does. The real kernels are
 * the gpu_ops suite's. */
struct gpu_layout {
    int model, p, R, m, v;
    char schedule[16];
};

ParameterizedTestParameters(pipeline, the_gpu_path_equals_the_cpu_backend)
{
    static const struct gpu_layout cells[] = {
        {MODEL_GPT, 1, 1, 2, 1, "1f1b"},      {MODEL_MLP, 1, 1, 2, 1, "1f1b"},
        {MODEL_GPT, 2, 2, 4, 1, "1f1b"},      {MODEL_MLP, 2, 2, 4, 1, "gpipe"},
        {MODEL_GPT, 2, 1, 4, 2, "interleaved"},
    };
    static struct gpu_layout grid[sizeof cells / sizeof cells[0]];
    memcpy(grid, cells, sizeof cells);
    const size_t n = cdp_test_sample_cells(grid, sizeof grid / sizeof grid[0], sizeof grid[0]);
    return cr_make_param_array(struct gpu_layout, grid, n);
}

ParameterizedTest(struct gpu_layout *g, pipeline, the_gpu_path_equals_the_cpu_backend, .timeout = 240)
{
    const char *fake = getenv("CDP_FAKE_CUDA_DIR");
    cr_assert_not_null(fake, "CDP_FAKE_CUDA_DIR is not set (run the tests through meson test)");
    if (g->p * g->R > 1) need_mpi();
    char dir[4096], cpu[4200], gpu[4200], a[4300], b[4300];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    struct layout l = {g->model, g->p, g->R, g->m, g->v, "", "", 0, "", 0, 1};
    snprintf(l.schedule, sizeof l.schedule, "%s", g->schedule);
    write_plan(dir, "cpu", &l, 0);
    snprintf(cpu, sizeof cpu, "%s/cpu.json", dir);
    /* the same plan on the cuda backend, every rank on the stand-in's one device */
    char *text = cdp_test_read_file(cpu);
    cr_assert_not_null(text);
    char *at = strstr(text, "\"backend\": \"cpu\"");
    cr_assert_not_null(at);
    char json[4096];
    snprintf(json, sizeof json, "%.*s\"backend\": \"cuda\", \"ranks_per_device\": 8%s", (int)(at - text), text,
             at + strlen("\"backend\": \"cpu\""));
    free(text);
    /* its outputs under other names */
    for (char *c = strstr(json, "\"cpu."); c; c = strstr(c, "\"cpu.")) memcpy(c + 1, "gpu", 3);
    for (char *c = strstr(json, "\"cpu-"); c; c = strstr(c, "\"cpu-")) memcpy(c + 1, "gpu", 3);
    cdp_test_write_file(dir, "gpu.json", json);
    snprintf(gpu, sizeof gpu, "%s/gpu.json", dir);
    run_ok(cpu);
    setenv("CDP_MODULE_DIR", fake, 1);
    run_ok(gpu);
    unsetenv("CDP_MODULE_DIR");
    double la[8], lb[8];
    snprintf(a, sizeof a, "%s/cpu.jsonl", dir);
    snprintf(b, sizeof b, "%s/gpu.jsonl", dir);
    cr_assert_eq(read_losses(a, la, 8), 3);
    cr_assert_eq(read_losses(b, lb, 8), 3);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(la[i], lb[i], "%s p=%d R=%d: step %d loss %.9g on the gpu path, %.9g on the cpu", g->schedule,
                     g->p, g->R, i + 1, lb[i], la[i]);
    snprintf(a, sizeof a, "%s/cpu.safetensors", dir);
    snprintf(b, sizeof b, "%s/gpu.safetensors", dir);
    double e = compare_weights(a, b);
    cr_assert_eq(e, 0.0, "%s p=%d R=%d: weights differ by %.3g", g->schedule, g->p, g->R, e);
}

/* "schedule": a file: the lists `--schedule --json` prints for zbv (GPT, tied
 * embeddings within rank 0), read back, train to the generated run's bits; a
 * file with a weight gradient before its input gradient is refused naming the
 * file, the rank, the instruction and what it waits for. */
Test(pipeline, a_schedule_file_trains_as_its_generated_lists, .timeout = 120)
{
    need_mpi();
    const char *d = cdp_test_tmpdir();
    char dir[4096], plan[4200], a[4300], b[4300];
    snprintf(dir, sizeof dir, "%s", d);
    struct layout l = {MODEL_GPT, 2, 2, 4, 2, "zbv", "", 0, "", 0, 1};
    write_plan(dir, "gen", &l, 0);
    snprintf(plan, sizeof plan, "%s/gen.json", dir);
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", plan, "--schedule", "--json", NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cdp_test_write_file(dir, "lists.json", r.out);
    cdp_test_run_free(&r);
    run_ok(plan);
    snprintf(l.schedule, sizeof l.schedule, "lists.json");
    l.v = 1; /* the file gives the chunks */
    write_plan(dir, "file", &l, 0);
    snprintf(plan, sizeof plan, "%s/file.json", dir);
    run_ok(plan);
    double la[8], lb[8];
    snprintf(a, sizeof a, "%s/gen.jsonl", dir);
    snprintf(b, sizeof b, "%s/file.jsonl", dir);
    cr_assert_eq(read_losses(a, la, 8), 3);
    cr_assert_eq(read_losses(b, lb, 8), 3);
    for (int i = 0; i < 3; i++) cr_assert_eq(la[i], lb[i], "step %d: %.17g vs %.17g", i + 1, lb[i], la[i]);
    snprintf(a, sizeof a, "%s/gen.safetensors", dir);
    snprintf(b, sizeof b, "%s/file.safetensors", dir);
    cr_assert_eq(compare_weights(a, b), 0.0, "the same lists, the same bits");

    /* rank 1's first I and W swapped */
    char *text = cdp_test_read_file(strcat(strcpy(a, dir), "/lists.json"));
    cr_assert_not_null(text);
    char *i0 = strstr(strstr(text, "],"), "\"1I0\""), *w0 = strstr(strstr(text, "],"), "\"1W0\"");
    cr_assert(i0 && w0 && i0 < w0);
    memcpy(i0, "\"1W0\"", 5);
    memcpy(w0, "\"1I0\"", 5);
    cdp_test_write_file(dir, "lists.json", text);
    free(text);
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"-q", "--plan", plan, NULL}), 0);
    cr_assert_eq(r.exit_code, 2, "%s", r.err);
    cr_assert(strstr(r.err, "lists.json: rank 1, instruction ") &&
                  strstr(r.err, "(1W0): weight gradient of micro-batch 0 on chunk 1 before its input gradient (no 1I0 "
                                "before it)"),
              "%s", r.err);
    cdp_test_run_free(&r);
}

/* A checkpoint of tensor groups holds whole tensors (docs/parallelism.md):
 * written at t = 2 under ZeRO-1 and exported, it is bitwise the weights the
 * run wrote; it resumes at t = 1 and at t = 2 (under ZeRO-2), each training
 * on as one rank does. */
Test(pipeline, tensor_checkpoints_resume_at_any_t, .timeout = 240)
{
    need_mpi();
    char dir[4096], path[4300], a[4300], b[4300];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    static const struct {
        const char *name;
        int steps, p, t, R, zero;
        const char *ckpt;
    } runs[] = {{"write", 2, 2, 2, 2, 1, "\"checkpoint\": {\"dir\": \"ckpt\", \"every\": 2}, "},
                {"at1", 4, 1, 1, 1, 0, "\"checkpoint\": {\"dir\": \"ckpt1\", \"every\": 100}, "},
                {"at2", 4, 2, 2, 2, 2, "\"checkpoint\": {\"dir\": \"ckpt2\", \"every\": 100}, "},
                {"one", 4, 1, 1, 1, 0, ""}};
    for (int i = 0; i < 4; i++) {
        char json[2048], file[64];
        snprintf(json, sizeof json,
                 "{" SPLIT_MLP ", \"data\": {\"source\": \"synthetic\", \"seed\": 3}, \"train\": {\"steps\": %d, "
                 "\"global_batch\": 8, \"micro_batch\": 2, %s\"optimizer\": {\"type\": \"adamw\", \"lr\": 0.01}, "
                 "\"eval_batches\": 1}, \"parallel\": {\"stages\": %d, \"tensor\": %d, \"replicas\": %d, \"zero\": "
                 "%d}, \"cluster\": {\"backend\": \"cpu\"}, \"output\": {\"weights\": \"%s.safetensors\"}}",
                 runs[i].steps, runs[i].ckpt, runs[i].p, runs[i].t, runs[i].R, runs[i].zero, runs[i].name);
        snprintf(file, sizeof file, "%s.json", runs[i].name);
        cdp_test_write_file(dir, file, json);
    }
    snprintf(path, sizeof path, "%s/write.json", dir);
    run_ok(path);
    /* the checkpoint's tensors are the whole ones the run ended with, to the bit */
    struct cdp_run r;
    snprintf(a, sizeof a, "%s/ckpt", dir);
    snprintf(b, sizeof b, "%s/exported.safetensors", dir);
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"export", "--checkpoint", a, "--out", b, NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cdp_test_run_free(&r);
    snprintf(a, sizeof a, "%s/write.safetensors", dir);
    cr_assert_eq(compare_weights(a, b), 0.0, "the checkpoint holds the weights the run wrote");
    /* resumed at t = 1 and t = 2 (each from its own copy), then as one rank */
    for (int i = 1; i <= 2; i++) {
        char cmd[13000];
        snprintf(cmd, sizeof cmd, "cp -r '%s/ckpt' '%s/ckpt%d'", dir, dir, i);
        cr_assert_eq(system(cmd), 0);
        snprintf(path, sizeof path, "%s/%s.json", dir, runs[i].name);
        snprintf(a, sizeof a, "%s/ckpt%d", dir, i);
        cr_assert_eq(cdp_test_run(&r, (const char *[]){"-q", "--plan", path, "--resume", a, NULL}), 0);
        cr_assert_eq(r.exit_code, 0, "t=%d: %s", runs[i].t, r.err);
        cdp_test_run_free(&r);
    }
    snprintf(path, sizeof path, "%s/one.json", dir);
    run_ok(path);
    snprintf(a, sizeof a, "%s/one.safetensors", dir);
    for (int i = 1; i <= 2; i++) {
        snprintf(b, sizeof b, "%s/%s.safetensors", dir, runs[i].name);
        const double e = compare_weights(a, b);
        cr_assert_leq(e, 1e-5, "resumed at t=%d: weights differ by %.3g", runs[i].t, e);
    }
}

/* A checkpoint written at t = 2 (one stage, 2 replicas, ZeRO-1; an MLP of
 * split linears, and a GPT split by heads with a tied head) resumes at
 * t = 4 (2 replicas under ZeRO-2: each rank's quarter of a split tensor and
 * its shard of that quarter's moments): loaded, stepped once at a rate of 0
 * and written out, its weights are the checkpoint's to the bit; trained on
 * (its steps made with the moments sliced and sharded at t = 4), it equals an
 * uninterrupted one-rank run to 1e-5, and the checkpoint the t = 4 run writes
 * holds the weights it ended with, bitwise. */
ParameterizedTestParameters(pipeline, a_t2_checkpoint_resumes_at_t4_bitwise)
{
    static int models[2];
    models[0] = MODEL_SPLIT;
    models[1] = MODEL_GPT;
    return cr_make_param_array(int, models, cdp_test_sample_cells(models, 2, sizeof models[0]));
}

ParameterizedTest(int *model, pipeline, a_t2_checkpoint_resumes_at_t4_bitwise, .timeout = 240)
{
    need_mpi();
    char dir[4096], path[4300], a[4300], b[4300];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    /* the GPT: 4 heads, tied head; AdamW's eps as in write_plan's tensor plans */
    const char *net = *model == MODEL_GPT
                          ? "\"model\": {\"preset\": \"gpt\", \"vocab\": 32, \"context\": 8, \"layers\": 2, "
                            "\"heads\": 4, \"embed\": 16, \"tie_embeddings\": true}"
                          : SPLIT_MLP;
    const char *eps = *model == MODEL_GPT ? ", \"eps\": 1e-4" : "";
    static const struct {
        const char *name;
        int steps, t, R, zero;
        const char *ckpt, *lr;
    } runs[] = {{"w2", 2, 2, 2, 1, "ckw", ""},
                {"z4", 3, 4, 2, 2, "ckz", "\"lr_schedule\": {\"type\": \"linear\", \"min_lr\": 0}, "},
                {"t4", 4, 4, 2, 2, "ck4", ""},
                {"one", 4, 1, 1, 0, "ck1", ""}};
    for (int i = 0; i < 4; i++) {
        char json[2048], file[64];
        snprintf(json, sizeof json,
                 "{%s, \"data\": {\"source\": \"synthetic\", \"seed\": 3}, \"train\": {\"steps\": %d, "
                 "\"global_batch\": 8, \"micro_batch\": 2, \"checkpoint\": {\"dir\": \"%s\", \"every\": 2}, %s"
                 "\"optimizer\": {\"type\": \"adamw\", \"lr\": 0.01%s}, \"eval_batches\": 1}, \"parallel\": "
                 "{\"stages\": 1, \"tensor\": %d, \"replicas\": %d, \"zero\": %d}, \"cluster\": {\"backend\": "
                 "\"cpu\"}, \"output\": {\"weights\": \"%s.safetensors\"}}",
                 net, runs[i].steps, runs[i].ckpt, runs[i].lr, eps, runs[i].t, runs[i].R, runs[i].zero,
                 runs[i].name);
        snprintf(file, sizeof file, "%s.json", runs[i].name);
        cdp_test_write_file(dir, file, json);
    }
    snprintf(path, sizeof path, "%s/w2.json", dir);
    run_ok(path);
    char cmd[17000];
    snprintf(cmd, sizeof cmd, "cp -r '%s/ckw' '%s/ckz' && cp -r '%s/ckw' '%s/ck4'", dir, dir, dir, dir);
    cr_assert_eq(system(cmd), 0);
    struct cdp_run r;
    for (int i = 1; i <= 2; i++) {
        snprintf(path, sizeof path, "%s/%s.json", dir, runs[i].name);
        snprintf(a, sizeof a, "%s/%s", dir, runs[i].ckpt);
        cr_assert_eq(cdp_test_run(&r, (const char *[]){"-q", "--plan", path, "--resume", a, NULL}), 0);
        cr_assert_eq(r.exit_code, 0, "%s: %s", runs[i].name, r.err);
        cdp_test_run_free(&r);
    }
    /* loaded at t = 4, one step at a rate of 0 (a linear decay's last step),
     * written out: the t = 2 run's bits */
    snprintf(a, sizeof a, "%s/w2.safetensors", dir);
    snprintf(b, sizeof b, "%s/z4.safetensors", dir);
    cr_assert_eq(compare_weights(a, b), 0.0, "the weights loaded at t = 4 are not the checkpoint's");
    /* trained on at t = 4: as one rank does, uninterrupted */
    snprintf(path, sizeof path, "%s/one.json", dir);
    run_ok(path);
    snprintf(a, sizeof a, "%s/one.safetensors", dir);
    snprintf(b, sizeof b, "%s/t4.safetensors", dir);
    const double e = compare_weights(a, b);
    cr_assert_leq(e, 1e-5, "resumed at t = 4: weights differ from one rank's by %.3g", e);
    /* the t = 4 run's own checkpoint (gathered from quarters and ZeRO shards) */
    snprintf(a, sizeof a, "%s/ck4", dir);
    snprintf(path, sizeof path, "%s/ck4.safetensors", dir);
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"export", "--checkpoint", a, "--out", path, NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cdp_test_run_free(&r);
    cr_assert_eq(compare_weights(b, path), 0.0, "the t = 4 checkpoint holds the weights the run wrote");
    cr_log_info("%s resumed at t = 4: %.3g from one rank", *model == MODEL_GPT ? "gpt" : "split mlp", e);
}

/* The same for GPT blocks split by heads (the fused q, k, v projection a
 * slice of three row ranges) and a tied head: a checkpoint written at t = 2
 * over 2 stages holds bitwise the weights the run wrote, exports the same
 * tensors as that weights file (ours and Hugging Face's), and resumes at t = 1
 * and at t = 2 under ZeRO-1, each training on as one rank does. */
Test(pipeline, tensor_block_checkpoints_resume_at_t1_and_export, .timeout = 240)
{
    need_mpi();
    char dir[4096], path[4300], a[4300], b[4300];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    static const struct {
        const char *name;
        int steps, p, t, R, zero;
        const char *ckpt;
    } runs[] = {{"write", 2, 2, 2, 1, 0, "\"checkpoint\": {\"dir\": \"ckpt\", \"every\": 2}, "},
                {"at1", 4, 1, 1, 1, 0, "\"checkpoint\": {\"dir\": \"ckpt1\", \"every\": 100}, "},
                {"at2", 4, 1, 2, 2, 1, "\"checkpoint\": {\"dir\": \"ckpt2\", \"every\": 100}, "},
                {"one", 4, 1, 1, 1, 0, ""}};
    for (int i = 0; i < 4; i++) {
        char json[2048], file[64];
        /* AdamW's eps as in write_plan's tensor plans */
        snprintf(json, sizeof json,
                 "{\"model\": {\"preset\": \"gpt\", \"vocab\": 37, \"context\": 8, \"layers\": 2, \"heads\": 4, "
                 "\"embed\": 16, \"tie_embeddings\": true}, \"data\": {\"source\": \"synthetic\", \"seed\": 3}, "
                 "\"train\": {\"steps\": %d, \"global_batch\": 8, \"micro_batch\": 2, %s\"optimizer\": {\"type\": "
                 "\"adamw\", \"lr\": 0.01, \"eps\": 1e-4}, \"eval_batches\": 1}, \"parallel\": {\"stages\": %d, "
                 "\"tensor\": %d, \"replicas\": %d, \"zero\": %d}, \"cluster\": {\"backend\": \"cpu\"}, "
                 "\"output\": {\"weights\": \"%s.safetensors\"}}",
                 runs[i].steps, runs[i].ckpt, runs[i].p, runs[i].t, runs[i].R, runs[i].zero, runs[i].name);
        snprintf(file, sizeof file, "%s.json", runs[i].name);
        cdp_test_write_file(dir, file, json);
    }
    snprintf(path, sizeof path, "%s/write.json", dir);
    run_ok(path);
    struct cdp_run r;
    snprintf(a, sizeof a, "%s/ckpt", dir);
    snprintf(b, sizeof b, "%s/exported.safetensors", dir);
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"export", "--checkpoint", a, "--out", b, NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cdp_test_run_free(&r);
    snprintf(a, sizeof a, "%s/write.safetensors", dir);
    cr_assert_eq(compare_weights(a, b), 0.0, "the checkpoint holds the weights the run wrote");
    /* Hugging Face's: from the checkpoint and from the weights file, the same bytes */
    char hf_a[4200], hf_b[4200], ck[4300];
    snprintf(ck, sizeof ck, "%s/ckpt", dir);
    snprintf(hf_a, sizeof hf_a, "%s/hf-ckpt", dir);
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"export", "--checkpoint", ck, "--format", "hf", "--out", hf_a,
                                                  NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cdp_test_run_free(&r);
    snprintf(hf_b, sizeof hf_b, "%s/hf-weights", dir);
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"export", "--plan", path, "--weights", a, "--format", "hf",
                                                  "--out", hf_b, NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cdp_test_run_free(&r);
    snprintf(a, sizeof a, "%s/model.safetensors", hf_a);
    snprintf(b, sizeof b, "%s/model.safetensors", hf_b);
    cr_assert_eq(compare_weights(a, b), 0.0, "the Hugging Face exports of the checkpoint and of the weights agree");
    for (int i = 1; i <= 2; i++) {
        char cmd[13000];
        snprintf(cmd, sizeof cmd, "cp -r '%s/ckpt' '%s/ckpt%d'", dir, dir, i);
        cr_assert_eq(system(cmd), 0);
        snprintf(path, sizeof path, "%s/%s.json", dir, runs[i].name);
        snprintf(a, sizeof a, "%s/ckpt%d", dir, i);
        cr_assert_eq(cdp_test_run(&r, (const char *[]){"-q", "--plan", path, "--resume", a, NULL}), 0);
        cr_assert_eq(r.exit_code, 0, "t=%d: %s", runs[i].t, r.err);
        cdp_test_run_free(&r);
    }
    snprintf(path, sizeof path, "%s/one.json", dir);
    run_ok(path);
    snprintf(a, sizeof a, "%s/one.safetensors", dir);
    for (int i = 1; i <= 2; i++) {
        snprintf(b, sizeof b, "%s/%s.safetensors", dir, runs[i].name);
        const double e = compare_weights(a, b);
        cr_assert_leq(e, 1e-5, "resumed at t=%d: weights differ by %.3g", runs[i].t, e);
        cr_log_info("gpt checkpoint of t=2 resumed at t=%d: worst weight error %.3g", runs[i].t, e);
    }
}

/* A weights file (/model/weights: whole tensors) loads into tensor groups as
 * each rank's slices: training from it at t = 2 equals training from it on
 * one rank (docs/parallelism.md). */
Test(pipeline, tensor_groups_start_from_a_weights_file, .timeout = 120)
{
    need_mpi();
    char dir[4096], path[4300], a[4300], b[4300];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    struct layout l = {MODEL_GPT_T, 1, 1, 2, 1, "1f1b", "", 0, "", 0, 2};
    write_plan(dir, "init", &l, 1); /* its weights are the start of the others */
    snprintf(path, sizeof path, "%s/init.json", dir);
    run_ok(path);
    for (int i = 0; i < 2; i++) {
        const char *name = i ? "pipe" : "one";
        write_plan(dir, name, &l, i == 0);
        snprintf(path, sizeof path, "%s/%s.json", dir, name);
        char *text = cdp_test_read_file(path), *at = text ? strstr(text, "\"embed\": 16") : NULL;
        cr_assert_not_null(at);
        char json[4096];
        snprintf(json, sizeof json, "%.*s\"embed\": 16, \"weights\": \"init.safetensors\"%s", (int)(at - text), text,
                 at + strlen("\"embed\": 16"));
        free(text);
        char file[64];
        snprintf(file, sizeof file, "%s.json", name);
        cdp_test_write_file(dir, file, json);
        run_ok(path);
    }
    double la[8], lb[8];
    snprintf(a, sizeof a, "%s/one.jsonl", dir);
    snprintf(b, sizeof b, "%s/pipe.jsonl", dir);
    cr_assert_eq(read_losses(a, la, 8), 3);
    cr_assert_eq(read_losses(b, lb, 8), 3);
    snprintf(path, sizeof path, "%s/init.jsonl", dir);
    double li[8];
    cr_assert_eq(read_losses(path, li, 8), 3);
    cr_assert_neq(la[0], li[0], "the runs start from the loaded weights, not the seed's");
    for (int i = 0; i < 3; i++)
        cr_assert_leq(fabs(la[i] - lb[i]), 1e-5 * fabs(la[i]), "step %d loss %.9g at t=2, %.9g on one rank", i + 1,
                      lb[i], la[i]);
    snprintf(a, sizeof a, "%s/one.safetensors", dir);
    snprintf(b, sizeof b, "%s/pipe.safetensors", dir);
    const double e = compare_weights(a, b);
    cr_assert_leq(e, 1e-5, "weights differ by %.3g", e);
}

/* A vocab-parallel embedding's checkpoint (docs/parallelism.md): written at
 * t = 2 with the vocabulary padded in memory, it holds the whole table (no
 * padding row), exports as the weights one rank trains, and resumes at t = 4
 * and t = 1 to one rank's weights. model: the plan's model and optimizer;
 * wte: the table's name. */
static void check_vocab_checkpoint(const char *model, const char *wte_name)
{
    need_mpi();
    char dir[4096], path[4300], a[4300], b[4300];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    static const struct {
        const char *name;
        int steps, p, t, R, zero;
        const char *ckpt;
    } runs[] = {{"write", 2, 2, 2, 2, 1, "\"checkpoint\": {\"dir\": \"ckpt\", \"every\": 2}, "},
                {"at4", 4, 1, 4, 1, 0, "\"checkpoint\": {\"dir\": \"ckpt1\", \"every\": 100}, "},
                {"at1", 4, 2, 1, 1, 0, "\"checkpoint\": {\"dir\": \"ckpt2\", \"every\": 100}, "},
                {"one", 4, 1, 1, 1, 0, ""},
                {"one2", 2, 1, 1, 1, 0, ""}};
    for (int i = 0; i < 5; i++) {
        char json[2048], file[64];
        snprintf(json, sizeof json,
                 "{%s, \"data\": {\"source\": \"synthetic\", \"seed\": 3}, \"train\": {\"steps\": %d, "
                 "\"global_batch\": 8, \"micro_batch\": 2, %s\"optimizer\": {\"type\": \"adamw\", \"lr\": 0.01, "
                 "\"eps\": 1e-4}, \"eval_batches\": 1}, \"parallel\": {\"stages\": %d, \"tensor\": %d, \"replicas\": "
                 "%d, \"zero\": %d}, \"cluster\": {\"backend\": \"cpu\"}, \"output\": {\"weights\": \"%s.safetensors\"}}",
                 model, runs[i].steps, runs[i].ckpt, runs[i].p, runs[i].t, runs[i].R, runs[i].zero, runs[i].name);
        snprintf(file, sizeof file, "%s.json", runs[i].name);
        cdp_test_write_file(dir, file, json);
    }
    snprintf(path, sizeof path, "%s/write.json", dir);
    run_ok(path);
    struct cdp_run r;
    snprintf(a, sizeof a, "%s/ckpt", dir);
    snprintf(b, sizeof b, "%s/exported.safetensors", dir);
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"export", "--checkpoint", a, "--out", b, NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cdp_test_run_free(&r);
    /* the whole table: 37 rows of 16, not the 38 the two slices hold */
    struct cdp_safetensors_file *f;
    cr_assert_eq(cdp_safetensors_open(b, &f), CDP_OK, "%s", cdp_last_error());
    const struct cdp_safetensors_tensor *wte = cdp_safetensors_find(f, wte_name);
    cr_assert_not_null(wte, "%s has the embedding's table", b);
    cr_assert(wte->ndim == 2 && wte->shape[0] == 37 && wte->shape[1] == 16 && wte->nbytes == 37 * 16 * 4,
              "the exported table is [%lld, %lld]", (long long)wte->shape[0], (long long)wte->shape[1]);
    cdp_safetensors_close(f);
    snprintf(a, sizeof a, "%s/write.safetensors", dir);
    cr_assert_eq(compare_weights(a, b), 0.0, "the checkpoint holds the weights the run wrote");
    snprintf(path, sizeof path, "%s/one2.json", dir);
    run_ok(path);
    snprintf(a, sizeof a, "%s/one2.safetensors", dir);
    double e = compare_weights(a, b);
    cr_assert_leq(e, 1e-5, "the t = 2 checkpoint against one rank's weights: %.3g", e);
    for (int i = 1; i <= 2; i++) {
        char cmd[13000];
        snprintf(cmd, sizeof cmd, "cp -r '%s/ckpt' '%s/ckpt%d'", dir, dir, i);
        cr_assert_eq(system(cmd), 0);
        snprintf(path, sizeof path, "%s/%s.json", dir, runs[i].name);
        snprintf(a, sizeof a, "%s/ckpt%d", dir, i);
        cr_assert_eq(cdp_test_run(&r, (const char *[]){"-q", "--plan", path, "--resume", a, NULL}), 0);
        cr_assert_eq(r.exit_code, 0, "t=%d: %s", runs[i].t, r.err);
        cdp_test_run_free(&r);
    }
    snprintf(path, sizeof path, "%s/one.json", dir);
    run_ok(path);
    snprintf(a, sizeof a, "%s/one.safetensors", dir);
    for (int i = 1; i <= 2; i++) {
        snprintf(b, sizeof b, "%s/%s.safetensors", dir, runs[i].name);
        e = compare_weights(a, b);
        cr_assert_leq(e, 1e-5, "resumed at t=%d: weights differ by %.3g", runs[i].t, e);
    }
}

Test(pipeline, vocab_parallel_checkpoints_are_whole_and_resume_at_any_t, .timeout = 240)
{
    check_vocab_checkpoint(VOCAB_MODEL, "layers.0.wte");
}

/* the same for a tied GPT whose blocks split by heads: the head's slice is the embedding's */
Test(pipeline, vocab_parallel_gpt_checkpoints_are_whole_and_resume_at_any_t, .timeout = 240)
{
    check_vocab_checkpoint("\"model\": {\"preset\": \"gpt\", \"vocab\": 37, \"context\": 8, \"layers\": 2, "
                           "\"heads\": 4, \"embed\": 16, \"tie_embeddings\": true}",
                           "layers.0.wte");
}
