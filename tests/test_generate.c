/* Using a trained model: GPT-2's BPE on a hand-written tokenizer
 * (tests/fixtures/bpe), `cdphybrid generate` (seeded, greedy against an
 * argmax computed here through the library, top-k 1, the sliding window,
 * bad arguments) and `cdphybrid eval` (equal to the val_loss training wrote,
 * on one rank and from a 2-stage pipeline's checkpoint, whatever BLAS
 * threads each process got: both sum with one). */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cdp/core.h"
#include "cdp/device.h"
#include "cdp/plan.h"
#include "cdp/topology.h"
#include "comm/comm.h"
#include "harness.h"
#include "kernels/cpu/ops.h" /* cdp_cpu_set_threads */
#include "model/bpe.h"
#include "model/infer.h"
#include "model/model.h"
#include "partitioner/planner.h"
#include "pipeline/run/executor.h"

static const char *fixture(const char *name)
{
    static char path[4096];
    snprintf(path, sizeof path, "%s", cdp_test_source_path("tests/fixtures/bpe"));
    strncat(path, "/", sizeof path - strlen(path) - 1);
    strncat(path, name, sizeof path - strlen(path) - 1);
    return path;
}

static struct cdp_bpe *load_fixture(void)
{
    char vocab[4096];
    snprintf(vocab, sizeof vocab, "%s", fixture("vocab.json"));
    struct cdp_bpe *b = NULL;
    cr_assert_eq(cdp_bpe_load(vocab, fixture("merges.txt"), &b), CDP_OK, "%s", cdp_last_error());
    return b;
}

static void expect_ids(const struct cdp_bpe *b, const char *text, const int32_t *want, int64_t n)
{
    int32_t *ids = NULL;
    int64_t got = 0;
    cr_assert_eq(cdp_bpe_encode(b, text, strlen(text), &ids, &got), CDP_OK, "%s: %s", text, cdp_last_error());
    cr_assert_eq(got, n, "\"%s\": %lld ids, expected %lld", text, (long long)got, (long long)n);
    for (int64_t i = 0; i < n; i++)
        cr_assert_eq(ids[i], want[i], "\"%s\": id %lld is %d, expected %d", text, (long long)i, ids[i], want[i]);
    /* and back: decoding gives the bytes */
    char out[256] = "";
    size_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        size_t len = 0;
        const char *s = cdp_bpe_decode(b, ids[i], &len);
        cr_assert_not_null(s);
        cr_assert_lt(at + len, sizeof out);
        memcpy(out + at, s, len);
        at += len;
    }
    out[at] = '\0';
    cr_assert_str_eq(out, text);
    free(ids);
}

Test(bpe, merges_by_rank_and_gpt2_pieces)
{
    struct cdp_bpe *b = load_fixture();
    cr_assert_eq(cdp_bpe_vocab_size(b), 31);
    /* ids of the fixture: hello 21, Ġworld 26 (Ġ is the space) */
    expect_ids(b, "hello world", (int32_t[]){21, 26}, 2);
    /* "l l" (rank 1) goes before "e l" (rank 12), though "e l" is leftmost */
    expect_ids(b, "ell", (int32_t[]){1, 19}, 2);
    /* a contraction is a piece of its own */
    expect_ids(b, "it's", (int32_t[]){11, 12, 27}, 3);
    /* ... only where a piece starts: "!'" is one run of others, then "s" */
    expect_ids(b, "!'s", (int32_t[]){8, 9, 10}, 3);
    /* \s+(?!\S): of three spaces before a letter, two are a piece (ĠĠ) and the last starts " b" (Ġb) */
    expect_ids(b, "a   b", (int32_t[]){13, 29, 28}, 3);
    /* a newline before a letter is a piece alone (Ċ) */
    expect_ids(b, "a\nb", (int32_t[]){13, 15, 14}, 3);
    /* " ?\p{N}+": the space goes with the digits, which have no merges */
    expect_ids(b, "a 12", (int32_t[]){13, 4, 16, 17}, 4);
    expect_ids(b, "hello!!", (int32_t[]){21, 8, 8}, 3);
    size_t len = 0;
    cr_assert_null(cdp_bpe_decode(b, 31, &len));
    cr_assert_null(cdp_bpe_decode(b, -1, &len));
    cdp_bpe_free(b);
}

Test(bpe, text_outside_the_vocabulary_is_an_error)
{
    struct cdp_bpe *b = load_fixture();
    int32_t *ids = NULL;
    int64_t n = 0;
    cr_assert_eq(cdp_bpe_encode(b, "hello z", 7, &ids, &n), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "\"z\""), "%s", cdp_last_error());
    cr_assert_null(ids);
    cdp_bpe_free(b);
}

Test(bpe, bad_files_name_the_line)
{
    const char *dir = cdp_test_tmpdir();
    char vocab[4096];
    snprintf(vocab, sizeof vocab, "%s", fixture("vocab.json"));
    struct cdp_bpe *b = NULL;
    const char *m = cdp_test_write_file(dir, "merges.txt", "#version: 0.2\nh e\nhe\n");
    cr_assert_eq(cdp_bpe_load(vocab, m, &b), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "merges.txt:3: expected two tokens"), "%s", cdp_last_error());
    m = cdp_test_write_file(dir, "merges.txt", "h e\nq u\n");
    cr_assert_eq(cdp_bpe_load(vocab, m, &b), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "merges.txt:2: \"q\" is not a token"), "%s", cdp_last_error());
    const char *v = cdp_test_write_file(dir, "vocab.json", "{\"a\": 0, \"b\": 0}");
    cr_assert_eq(cdp_bpe_load(v, fixture("merges.txt"), &b), CDP_ERR_INVALID);
    cr_assert(strstr(cdp_last_error(), "id 0 is given to two tokens"), "%s", cdp_last_error());
    cr_assert_null(b);
}

Test(bpe, sampling_is_seeded_and_top_k_1_is_greedy)
{
    const float logits[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.5f, 0.0f};
    int32_t id = -1;
    uint64_t s = 7;
    cr_assert_eq(cdp_infer_pick(logits, 6, 0, 0, 1.0, &s, &id), CDP_OK);
    cr_assert_eq(id, 1, "greedy takes the lowest id among equal logits");
    cr_assert_eq(cdp_infer_pick(logits, 6, 1.0, 1, 1.0, &s, &id), CDP_OK);
    cr_assert_eq(id, 1);
    /* top-k 2: only ids 1 and 3; a seed repeats its draws */
    int seen[6] = {0};
    int32_t first[50];
    s = 42;
    for (int i = 0; i < 50; i++) {
        cr_assert_eq(cdp_infer_pick(logits, 6, 1.0, 2, 1.0, &s, &first[i]), CDP_OK);
        seen[first[i]]++;
    }
    cr_assert(seen[1] > 0 && seen[3] > 0 && seen[1] + seen[3] == 50, "%d %d", seen[1], seen[3]);
    s = 42;
    for (int i = 0; i < 50; i++) {
        cr_assert_eq(cdp_infer_pick(logits, 6, 1.0, 2, 1.0, &s, &id), CDP_OK);
        cr_assert_eq(id, first[i]);
    }
    const float bad[2] = {0.0f, NAN};
    cr_assert_eq(cdp_infer_pick(bad, 2, 1.0, 0, 1.0, &s, &id), CDP_ERR_INVALID);
}

/* top-p keeps the fewest most likely tokens whose probabilities reach p:
 * softmax of the logits above is 1 and 3 at 0.332 each, 4 at 0.201, 0 at
 * 0.074, 5 at 0.045, 2 at 0.017 */
Test(bpe, top_p_keeps_the_fewest_most_likely)
{
    const float logits[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.5f, 0.0f};
    const double ps[] = {0.2, 0.5, 0.7, 0.95};
    const int allowed[][6] = {{0, 1, 0, 0, 0, 0}, {0, 1, 0, 1, 0, 0}, {0, 1, 0, 1, 1, 0}, {1, 1, 0, 1, 1, 1}};
    for (int c = 0; c < 4; c++) {
        int seen[6] = {0};
        uint64_t s = 3;
        for (int i = 0; i < 400; i++) {
            int32_t id = -1;
            cr_assert_eq(cdp_infer_pick(logits, 6, 1.0, 0, ps[c], &s, &id), CDP_OK);
            cr_assert(allowed[c][id], "top-p %g drew %d", ps[c], id);
            seen[id]++;
        }
        for (int v = 0; v < 6; v++) cr_assert(!allowed[c][v] || seen[v] > 0, "top-p %g never drew %d", ps[c], v);
    }
    /* with top-k 2 first, p is a share of those two */
    uint64_t s = 3;
    int32_t id = -1;
    for (int i = 0; i < 100; i++) {
        cr_assert_eq(cdp_infer_pick(logits, 6, 1.0, 2, 0.4, &s, &id), CDP_OK);
        cr_assert_eq(id, 1, "top-k 2 then top-p 0.4 keeps id 1 alone (half of the two)");
    }
}

/* A tiny byte-level GPT trained in dir (stages 1 or 2), with metrics,
 * weights and a checkpoint at its last step; returns the plan's path. */
static const char *train_tiny_on(const char *dir, const char *parallel);
static void run_ranks(struct cdp_run *r, const char *np, const char *const *argv);

static const char *train_tiny(const char *dir, int stages)
{
    char parallel[128];
    snprintf(parallel, sizeof parallel, "\"stages\": %d, \"replicas\": 1, \"micro_batches\": 2", stages);
    return train_tiny_on(dir, parallel);
}

/* ... with /parallel's keys as given. */
static const char *train_tiny_on(const char *dir, const char *parallel)
{
    char text[2048];
    snprintf(text, sizeof text,
             "{\"model\": {\"preset\": \"gpt\", \"vocab\": 256, \"context\": 16, \"layers\": 2, \"heads\": 2, "
             "\"embed\": 32},\n"
             " \"data\": {\"source\": \"text\", \"path\": \"%s\", \"seed\": 3},\n"
             " \"train\": {\"steps\": 12, \"micro_batch\": 4, \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.01}, "
             "\"log_every\": 6, \"eval_every\": 6, \"eval_batches\": 3, \"checkpoint\": {\"dir\": \"ck\"}},\n"
             " \"parallel\": {%s},\n"
             " \"cluster\": {\"backend\": \"cpu\"},\n"
             " \"output\": {\"metrics\": \"m.jsonl\", \"weights\": \"w.safetensors\"}}\n",
             cdp_test_source_path("examples/data/licenses.txt"), parallel);
    static char plan[4096];
    snprintf(plan, sizeof plan, "%s", cdp_test_write_file(dir, "plan.json", text));
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", plan, "-q", NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cdp_test_run_free(&r);
    return plan;
}

/* The val_loss of the last record of dir/m.jsonl. */
static double last_val_loss(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/m.jsonl", dir);
    char *text = cdp_test_read_file(path);
    cr_assert_not_null(text);
    double v = NAN;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *o = json_loads(line, 0, NULL);
        json_t *x = o ? json_object_get(o, "val_loss") : NULL;
        if (x) v = json_real_value(x);
        json_decref(o);
    }
    free(text);
    cr_assert(!isnan(v), "no val_loss in %s", path);
    return v;
}

static double eval_value(const char *const *argv)
{
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, argv), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    const char *at = strstr(r.out, "val_loss ");
    cr_assert_not_null(at, "%s", r.out);
    const double v = strtod(at + 9, NULL);
    const char *pp = strstr(r.out, "perplexity ");
    cr_assert_not_null(pp, "%s", r.out);
    cr_assert_float_eq(strtod(pp + 11, NULL), exp(v), 1e-12 * exp(v));
    cr_assert(strstr(r.out, "tokens 192\n"), "3 micro-batches of 4 x 16 tokens: %s", r.out);
    cdp_test_run_free(&r);
    return v;
}

Test(eval, equals_the_val_loss_training_recorded, .timeout = 120)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    const char *plan = train_tiny(dir, 1);
    char pl[4096], w[4200], ck[4200];
    snprintf(pl, sizeof pl, "%s", plan);
    snprintf(w, sizeof w, "%s/w.safetensors", dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    const double want = last_val_loss(dir);
    /* the same double: same micro-batches, same kernels, same sum */
    cr_assert_eq(eval_value((const char *[]){"eval", "--checkpoint", ck, NULL}), want);
    cr_assert_eq(eval_value((const char *[]){"eval", "--plan", pl, "--checkpoint", ck, "-q", NULL}), want);
    cr_assert_eq(eval_value((const char *[]){"eval", "--plan", pl, "--weights", w, NULL}), want);
}

/* The 2-stage run's ranks have fewer cores each than eval's one process;
 * validation and eval both sum with one BLAS thread, so the value is the
 * same double. OpenBLAS's Haswell kernels (which Zen uses too) round a
 * product's rows differently with 2 threads than with 1, so the test runs
 * on them where this CPU has them (AVX2 and FMA): it failed there when eval
 * ran as many threads as cores. */
Test(eval, a_pipeline_checkpoint_loads_whole, .timeout = 180)
{
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && !getenv("OPENBLAS_NUM_THREADS"))
        setenv("OPENBLAS_CORETYPE", "Haswell", 1);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    train_tiny(dir, 2);
    char ck[4200];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    const double want = last_val_loss(dir), got = eval_value((const char *[]){"eval", "--checkpoint", ck, NULL});
    cr_assert_eq(got, want, "eval %.17g, the 2-stage run %.17g", got, want);
}

/* The val_loss eval prints for argv (under mpirun -np np when np is not NULL). */
static double eval_loss(const char *np, const char *const *argv)
{
    struct cdp_run r;
    if (np) run_ranks(&r, np, argv);
    else cr_assert_eq(cdp_test_run(&r, argv), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    const char *at = strstr(r.out, "val_loss ");
    cr_assert_not_null(at, "%s", r.out);
    const double v = strtod(at + 9, NULL);
    cdp_test_run_free(&r);
    return v;
}

/* A checkpoint that tensor groups wrote (an MLP of split linears, 2 stages of
 * t = 2: 4 ranks) holds whole tensors: eval loads it whole, on one rank and
 * on 2 stages under mpirun (t = 1, the same double), and gives the
 * validation loss the t = 2 run recorded, to its all-reduces' rounding; the
 * checkpoint's export gives the same double. */
Test(eval, a_tensor_group_checkpoint_loads_whole, .timeout = 180)
{
    if (!cdp_comm_have_mpi()) cr_skip_test("this build has no MPI: a run of tensor groups is not possible");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    const char *plan = cdp_test_write_file(
        dir, "split.json",
        "{\"model\": {\"input\": [12], \"layers\": [{\"type\": \"linear\", \"out\": 32, \"split\": \"column\"}, "
        "{\"type\": \"relu\"}, {\"type\": \"linear\", \"out\": 24, \"split\": \"row\"}, {\"type\": \"linear\", "
        "\"out\": 16, \"split\": \"column\"}, {\"type\": \"gelu\"}, {\"type\": \"linear\", \"out\": 5, \"split\": "
        "\"row\"}]}, \"data\": {\"source\": \"synthetic\", \"seed\": 3}, \"train\": {\"steps\": 3, "
        "\"global_batch\": 8, \"micro_batch\": 2, \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.01}, "
        "\"eval_batches\": 2, \"checkpoint\": {\"dir\": \"ck\", \"every\": 3}}, \"parallel\": {\"stages\": 2, "
        "\"tensor\": 2}, \"cluster\": {\"backend\": \"cpu\"}, \"output\": {\"metrics\": \"m.jsonl\"}}");
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", plan, "-q", NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cdp_test_run_free(&r);
    char ck[4200], w[4200];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    snprintf(w, sizeof w, "%s/exported.safetensors", dir);
    const double recorded = last_val_loss(dir);
    const double one = eval_loss(NULL, (const char *[]){"eval", "--checkpoint", ck, NULL});
    cr_assert_leq(fabs(one - recorded), 1e-5 * fabs(recorded), "eval %.17g, the t = 2 run recorded %.17g", one,
                  recorded);
    const double two = eval_loss("2", (const char *[]){"eval", "--checkpoint", ck, "-q", NULL});
    cr_assert_eq(two, one, "eval on 2 stages %.17g, on one rank %.17g", two, one);
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"export", "--checkpoint", ck, "--out", w, NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cdp_test_run_free(&r);
    const double exported = eval_loss(NULL, (const char *[]){"eval", "--plan", plan, "--weights", w, NULL});
    cr_assert_eq(exported, one, "the export's eval %.17g, the checkpoint's %.17g", exported, one);
    cr_log_info("t = 2 recorded %.17g, eval %.17g", recorded, one);
}

Test(eval, bad_arguments_exit_2)
{
    const char *dir = cdp_test_tmpdir();
    const char *plan = cdp_test_write_file(dir, "p.json", "{\"model\": {\"preset\": \"gpt\", \"vocab\": 256, "
                                           "\"context\": 16, \"layers\": 1, \"heads\": 2, \"embed\": 32}}");
    struct {
        const char *argv[8];
        const char *says;
    } cases[] = {
        {{"eval", "--plan", plan, NULL}, "--weights FILE or --checkpoint DIR"},
        {{"eval", "--plan", plan, "--weights", "w.st", "--checkpoint", "ck", NULL}, "not both"},
        {{"eval", "--plan", plan, "--weights", "w.st", "--batches", "0", NULL}, "--batches"},
        {{"eval", "--checkpoint", "/nonexistent/ck", NULL}, "/nonexistent/ck"},
        {{"eval", "--batch", "3", NULL}, "did you mean --batches"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct cdp_run r;
        cr_assert_eq(cdp_test_run(&r, cases[i].argv), 0);
        cr_assert_eq(r.exit_code, 2, "case %zu: %d %s", i, r.exit_code, r.err);
        cr_assert(strstr(r.err, cases[i].says), "case %zu: %s", i, r.err);
        cdp_test_run_free(&r);
    }
}

static char *generate(const char *const *argv)
{
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, argv), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    char *out = r.out;
    r.out = NULL;
    cdp_test_run_free(&r);
    return out;
}

/* Greedy continuation computed here: the library's model, our own window and
 * argmax, with generate's BLAS threads (one), so the logits are its bits. */
static void greedy_here(const char *plan_path, const char *weights, const char *prompt, int n_new, char *out)
{
    cdp_cpu_set_threads(CDP_CPU_EXACT_THREADS);
    struct cdp_plan *p = NULL;
    cr_assert_eq(cdp_plan_load(plan_path, &p), CDP_OK, "%s", cdp_last_error());
    cdp_device_t dev = NULL;
    struct cdp_model *m = NULL;
    cr_assert_eq(cdp_device_open(CDP_BACKEND_CPU, 0, 0, &dev), CDP_OK);
    cr_assert_eq(cdp_model_create(&p->model, 0, (int)cdp_plan_model_units(p), 1, 1, 1, dev, &m), CDP_OK);
    cr_assert_eq(cdp_model_load(m, weights), CDP_OK, "%s", cdp_last_error());
    const int T = (int)p->model.context, V = (int)p->model.vocab;
    int n = (int)strlen(prompt);
    strcpy(out, prompt);
    for (int k = 0; k < n_new; k++, n++) {
        int32_t *in = cdp_model_input(m, 0);
        const int from = n > T ? n - T : 0, used = n - from;
        for (int t = 0; t < T; t++) in[t] = t < used ? (unsigned char)out[from + t] : 0;
        cr_assert_eq(cdp_model_forward(m, 0), CDP_OK);
        const float *row = cdp_model_output(m, 0) + (size_t)(used - 1) * V;
        int best = 0;
        for (int v = 1; v < 256; v++)
            if (row[v] > row[best]) best = v;
        out[n] = (char)best;
    }
    out[n] = '\n';
    out[n + 1] = '\0';
    cdp_model_destroy(m);
    cdp_device_close(dev);
    cdp_plan_free(p);
}

Test(generate, greedy_seeded_top_k_and_window, .timeout = 120)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    char plan[4096], w[4200], ck[4200];
    snprintf(plan, sizeof plan, "%s", train_tiny(dir, 1));
    snprintf(w, sizeof w, "%s/w.safetensors", dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    /* greedy = the argmax computed here, short prompt and one longer than the context (16) */
    const char *prompts[] = {"The ", "Permission is hereby granted, "};
    for (int i = 0; i < 2; i++) {
        char want[256];
        greedy_here(plan, w, prompts[i], 24, want);
        char *got = generate((const char *[]){"generate", "--plan", plan, "--weights", w, "--prompt", prompts[i],
                                              "--tokens", "24", "--temperature", "0", NULL});
        cr_assert_str_eq(got, want);
        /* top-k 1 at temperature 1 is greedy too; the checkpoint holds the same weights */
        char *k1 = generate((const char *[]){"generate", "--checkpoint", ck, "--prompt", prompts[i], "--tokens", "24",
                                             "--top-k", "1", "--seed", "9", NULL});
        cr_assert_str_eq(k1, want);
        free(got);
        free(k1);
    }
    /* a seed gives the same text; another seed other text */
    const char *a1[] = {"generate", "--plan", plan, "--weights", w, "--prompt", "The ", "--tokens", "40",
                        "--seed", "5", "--temperature", "1.5", NULL};
    const char *a2[] = {"generate", "--plan", plan, "--weights", w, "--prompt", "The ", "--tokens", "40",
                        "--seed", "6", "--temperature", "1.5", NULL};
    char *x = generate(a1), *y = generate(a1), *z = generate(a2);
    cr_assert_str_eq(x, y);
    cr_assert_str_neq(x, z);
    cr_assert_eq(strlen(x), strlen("The ") + 40 + 1, "40 bytes and a newline: \"%s\"", x);
    free(x);
    free(y);
    free(z);
    /* the window note for a long prompt */
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"generate", "--plan", plan, "--weights", w, "--prompt",
                                                   "Permission is hereby granted, ", "--tokens", "1", NULL}),
                 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.err, "the prompt is 30 tokens and /model/context 16: the model sees its last 16"), "%s", r.err);
    cdp_test_run_free(&r);
    /* GPT-2 BPE: the fixture's 31 tokens, so the prompt's ids and every id chosen are below 31 */
    char vocab[4096], merges[4096];
    snprintf(vocab, sizeof vocab, "%s", fixture("vocab.json"));
    snprintf(merges, sizeof merges, "%s", fixture("merges.txt"));
    char *b = generate((const char *[]){"generate", "--plan", plan, "--weights", w, "--prompt", "hello world",
                                        "--tokens", "10", "--vocab", vocab, "--merges", merges, NULL});
    cr_assert(!strncmp(b, "hello world", 11), "%s", b);
    for (const char *c = b + 11; *c && c[1]; c++)
        cr_assert(strchr("helowrd!'sitab\n12 ", *c), "a byte no fixture token holds: 0x%02x in \"%s\"",
                  (unsigned char)*c, b);
    free(b);
}

Test(generate, bad_arguments_exit_2_naming_the_option)
{
    const char *dir = cdp_test_tmpdir();
    const char *plan = cdp_test_write_file(dir, "p.json", "{\"model\": {\"preset\": \"gpt\", \"vocab\": 256, "
                                           "\"context\": 16, \"layers\": 1, \"heads\": 2, \"embed\": 32}}");
    char p[4096];
    snprintf(p, sizeof p, "%s", plan);
    /* a weights file of this model, so that the checks after loading are reached */
    struct cdp_plan *pl = NULL;
    cr_assert_eq(cdp_plan_load(p, &pl), CDP_OK);
    cdp_device_t dev = NULL;
    struct cdp_model *m = NULL;
    cr_assert_eq(cdp_device_open(CDP_BACKEND_CPU, 0, 0, &dev), CDP_OK);
    cr_assert_eq(cdp_model_create(&pl->model, 0, (int)cdp_plan_model_units(pl), 1, 1, 1, dev, &m), CDP_OK);
    char w[4200];
    snprintf(w, sizeof w, "%s/w.safetensors", dir);
    cr_assert_eq(cdp_model_save(m, w, NULL, 0), CDP_OK, "%s", cdp_last_error());
    cdp_model_destroy(m);
    cdp_device_close(dev);
    cdp_plan_free(pl);
    char vocab[4096];
    snprintf(vocab, sizeof vocab, "%s", fixture("vocab.json"));
    struct {
        const char *argv[14];
        const char *says;
    } cases[] = {
        {{"generate", "--plan", p, "--prompt", "a", NULL}, "--weights FILE or --checkpoint DIR"},
        {{"generate", "--plan", p, "--weights", w, "--prompt", "a", "--tokens", "-3", NULL}, "--tokens: expected"},
        {{"generate", "--plan", p, "--weights", w, "--prompt", "a", "--top-k", "300", NULL},
         "--top-k 300 is more than the 256 tokens"},
        {{"generate", "--plan", p, "--weights", w, "--prompt", "a", "--temperature", "-1", NULL}, "--temperature"},
        {{"generate", "--plan", p, "--weights", w, "--prompt", "a", "--seed", "x", NULL}, "--seed"},
        {{"generate", "--plan", p, "--weights", w, NULL}, "give --prompt"},
        {{"generate", "--plan", p, "--weights", w, "--prompt", "", NULL}, "--prompt: give at least one"},
        {{"generate", "--plan", p, "--weights", w, "--prompt", "a", "--vocab", vocab, NULL}, "--vocab and --merges"},
        {{"generate", "--plan", p, "--weights", "/nonexistent.safetensors", "--prompt", "a", NULL},
         "/nonexistent.safetensors"},
        {{"generate", "--plan", p, "--weights", w, "--promt", "a", NULL}, "did you mean --prompt"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct cdp_run r;
        cr_assert_eq(cdp_test_run(&r, cases[i].argv), 0);
        cr_assert_eq(r.exit_code, 2, "case %zu: %d %s", i, r.exit_code, r.err);
        cr_assert(strstr(r.err, cases[i].says), "case %zu: %s", i, r.err);
        cdp_test_run_free(&r);
    }
    /* without an error, exit 0 and the prompt echoed */
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"generate", "--plan", p, "--weights", w, "--prompt", "ab",
                                                   "--tokens", "0", NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_str_eq(r.out, "ab\n");
    cdp_test_run_free(&r);
}

/* cdp_test_run under `mpirun -np np`: CDP_BIN is the rank's program. */
static void run_ranks(struct cdp_run *r, const char *np, const char *const *argv)
{
    static char bin[4096], mpirun[4096];
    snprintf(bin, sizeof bin, "%s", getenv("CDP_BIN"));
    mpirun[0] = '\0';
    const char *path = getenv("PATH");
    for (const char *at = path; at && *at && !mpirun[0];) {
        const char *colon = strchr(at, ':');
        const size_t len = colon ? (size_t)(colon - at) : strlen(at);
        char cand[4096];
        snprintf(cand, sizeof cand, "%.*s/mpirun", (int)len, at);
        if (access(cand, X_OK) == 0) snprintf(mpirun, sizeof mpirun, "%s", cand);
        at = colon ? colon + 1 : at + len;
    }
    cr_assert(mpirun[0], "no mpirun on PATH");
    const char *args[32] = {"-np", np, bin};
    int k = 3;
    for (int i = 0; argv[i]; i++) {
        cr_assert_lt(k, 31);
        args[k++] = argv[i];
    }
    args[k] = NULL;
    setenv("CDP_BIN", mpirun, 1);
    const int started = cdp_test_run(r, args);
    setenv("CDP_BIN", bin, 1);
    cr_assert_eq(started, 0);
}

static char *generate_ranks(const char *np, const char *const *argv)
{
    struct cdp_run r;
    run_ranks(&r, np, argv);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    char *out = r.out;
    r.out = NULL;
    cdp_test_run_free(&r);
    return out;
}

static double eval_ranks(const char *np, const char *const *argv)
{
    struct cdp_run r;
    run_ranks(&r, np, argv);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    const char *at = strstr(r.out, "val_loss ");
    cr_assert_not_null(at, "%s", r.out);
    cr_assert(strstr(r.out, "tokens 192\n"), "%s", r.out);
    const double v = strtod(at + 9, NULL);
    cdp_test_run_free(&r);
    return v;
}

Test(stages, generate_and_eval_on_a_pipeline_equal_one_rank, .timeout = 120)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    char plan[4096], w[4200], ck[4200];
    snprintf(plan, sizeof plan, "%s", train_tiny(dir, 2));
    snprintf(w, sizeof w, "%s/w.safetensors", dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    /* sampled with a seed, from the 2-stage checkpoint: the one-rank text, on 2 and 3 stages
     * (4 units: [0, 2) [2, 4), then [0, 2) [2, 3) [3, 4)) */
    const char *sampled[] = {"generate", "--checkpoint", ck, "--prompt", "The ", "--tokens", "40", "--seed", "5",
                             "--temperature", "1.5", NULL};
    char *one = generate(sampled);
    cr_assert_eq(strlen(one), strlen("The ") + 40 + 1, "%s", one);
    for (int np = 2; np <= 3; np++) {
        char *got = generate_ranks(np == 2 ? "2" : "3", sampled);
        cr_assert_str_eq(got, one, "%d stages", np);
        free(got);
    }
    free(one);
    /* from the weights file, top-k, a prompt longer than the context (the window slides) */
    const char *topk[] = {"generate", "--plan", plan, "--weights", w, "--prompt", "Permission is hereby granted, ",
                          "--tokens", "24", "--seed", "11", "--top-k", "5", "--temperature", "0.8", "-q", NULL};
    one = generate(topk);
    char *two = generate_ranks("2", topk);
    cr_assert_str_eq(two, one);
    free(one);
    free(two);
    /* one process, a 2-stage plan: said with -v */
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"eval", "--checkpoint", ck, "-v", NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.err, "the plan has 2 stages; this one process holds all 4 units"), "%s", r.err);
    cdp_test_run_free(&r);
    /* which rank holds what, said with -v */
    run_ranks(&r, "2", (const char *[]){"eval", "--checkpoint", ck, "-v", NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.err, "eval: stage 0 of 2 stages: units [0, 2) of 4"), "%s", r.err);
    cr_assert(strstr(r.err, "eval: stage 1 of 2 stages: units [2, 4) of 4"), "%s", r.err);
    cr_assert(strstr(r.out, "on 2 pipeline stages"), "%s", r.out);
    cdp_test_run_free(&r);
    /* eval: the same double as one rank (the same micro-batches, kernels and sum), and the
     * val_loss the 2-stage training recorded */
    const double want = eval_value((const char *[]){"eval", "--checkpoint", ck, NULL});
    const double ck2 = eval_ranks("2", (const char *[]){"eval", "--checkpoint", ck, NULL});
    const double w3 = eval_ranks("3", (const char *[]){"eval", "--plan", plan, "--weights", w, NULL});
    cr_assert_eq(ck2, want, "2 stages %.17g, one rank %.17g", ck2, want);
    cr_assert_eq(w3, want, "3 stages %.17g, one rank %.17g", w3, want);
    /* the plan's partition, when it has a range per rank: [0, 1) [1, 4) */
    char *text = cdp_test_read_file(plan);
    cr_assert_not_null(text);
    char *at = strstr(text, "\"micro_batches\": 2}");
    cr_assert_not_null(at, "%s", text);
    char parted[2048];
    snprintf(parted, sizeof parted, "%.*s\"micro_batches\": 2, \"partition\": [[0, 1], [1, 4]]}%s", (int)(at - text),
             text, at + strlen("\"micro_batches\": 2}"));
    free(text);
    char pp[4096];
    snprintf(pp, sizeof pp, "%s", cdp_test_write_file(dir, "parted.json", parted));
    run_ranks(&r, "2", (const char *[]){"eval", "--plan", pp, "--weights", w, "-v", NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.err, "eval: stage 0 of 2 stages: units [0, 1) of 4"), "%s", r.err);
    cr_assert(strstr(r.err, "eval: stage 1 of 2 stages: units [1, 4) of 4"), "%s", r.err);
    at = strstr(r.out, "val_loss ");
    cr_assert_not_null(at, "%s", r.out);
    cr_assert_eq(strtod(at + 9, NULL), want, "%s", r.out);
    cdp_test_run_free(&r);
    const double trained = last_val_loss(dir);
    cr_assert_float_eq(ck2, trained, 1e-12 * trained, "eval %.17g, the 2-stage run %.17g", ck2, trained);
    /* more ranks than units: exit 2, saying so */
    run_ranks(&r, "5", (const char *[]){"eval", "--checkpoint", ck, NULL});
    cr_assert_eq(r.exit_code, 2, "%d %s", r.exit_code, r.err);
    cr_assert(strstr(r.err, "the model has 4 units and 5 ranks were started"), "%s", r.err);
    cdp_test_run_free(&r);
}

/* generate and eval from a GPT checkpoint that tensor groups wrote (t = 2:
 * heads, MLP and the fused q, k, v split over 2 ranks): it loads whole, for
 * whole layers (t = 1), so one rank, 2 stages under mpirun and the exported
 * weights under the t = 2 plan all sample the same text; eval gives the
 * validation loss the t = 2 run recorded, to its all-reduces' rounding. */
Test(stages, generate_and_eval_from_a_tensor_group_checkpoint, .timeout = 180)
{
    if (!cdp_comm_have_mpi()) cr_skip_test("this build has no MPI: a run of tensor groups is not possible");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    char plan[4096], w[4200], ck[4200];
    snprintf(plan, sizeof plan, "%s", train_tiny_on(dir, "\"stages\": 1, \"replicas\": 1, \"tensor\": 2, "
                                                         "\"micro_batches\": 2"));
    snprintf(w, sizeof w, "%s/exported.safetensors", dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    const char *sampled[] = {"generate", "--checkpoint", ck, "--prompt", "The ", "--tokens", "30", "--seed", "5",
                             "--temperature", "1.5", NULL};
    char *one = generate(sampled);
    cr_assert_eq(strlen(one), strlen("The ") + 30 + 1, "%s", one);
    char *two = generate_ranks("2", sampled);
    cr_assert_str_eq(two, one, "on 2 stages");
    free(two);
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"export", "--checkpoint", ck, "--out", w, NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cdp_test_run_free(&r);
    char *exported = generate((const char *[]){"generate", "--plan", plan, "--weights", w, "--prompt", "The ",
                                               "--tokens", "30", "--seed", "5", "--temperature", "1.5", NULL});
    cr_assert_str_eq(exported, one, "from the exported weights");
    free(exported);
    const double want = last_val_loss(dir), got = eval_value((const char *[]){"eval", "--checkpoint", ck, NULL});
    cr_assert_leq(fabs(got - want), 1e-5 * fabs(want), "eval %.17g, the t = 2 run recorded %.17g", got, want);
    cr_log_info("t = 2 GPT: %s", one);
    free(one);
}

/* Validation runs the forward-only schedule through the executor's
 * instruction table on every placement of virtual stages: chunks handed on
 * between ranks (interleaved), the turn of zbv's V on one rank. The loss is
 * the double one rank computes, and eval's on one and on 2 stages. */
Test(stages, validation_with_chunks_equals_eval_on_1_and_2_stages, .timeout = 240)
{
    static const char *const parallel[] = {
        "\"stages\": 2, \"replicas\": 1, \"micro_batches\": 2, \"schedule\": \"interleaved\", \"chunks\": 2",
        "\"stages\": 2, \"replicas\": 1, \"micro_batches\": 2, \"schedule\": \"zbv\"",
    };
    for (size_t i = 0; i < sizeof parallel / sizeof parallel[0]; i++) {
        char dir[4096], ck[4200];
        snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
        train_tiny_on(dir, parallel[i]);
        snprintf(ck, sizeof ck, "%s/ck", dir);
        const double trained = last_val_loss(dir);
        const double one = eval_value((const char *[]){"eval", "--checkpoint", ck, NULL});
        const double two = eval_ranks("2", (const char *[]){"eval", "--checkpoint", ck, NULL});
        cr_assert_eq(one, trained, "%s: eval %.17g, training's validation %.17g", parallel[i], one, trained);
        cr_assert_eq(two, one, "%s: 2 stages %.17g, one rank %.17g", parallel[i], two, one);
    }
}

/* The executor's decoder (pipeline/run/executor.h) on one rank, as the layout
 * the planner gives a plan of `parallel` (the model random from its seed). */
static struct cdp_exec_decoder *open_decoder(const char *parallel, struct cdp_plan **plan, struct cdp_layout **lay,
                                             cdp_comm_t *self)
{
    char text[1024];
    snprintf(text, sizeof text,
             "{\"model\": {\"preset\": \"gpt\", \"vocab\": 64, \"context\": 16, \"layers\": 3, \"heads\": 2, "
             "\"embed\": 16}, \"train\": {\"micro_batch\": 1, \"seed\": 5}, \"parallel\": {%s}, "
             "\"cluster\": {\"backend\": \"cpu\"}}",
             parallel);
    cr_assert_eq(cdp_plan_load_string(text, "decode.json", NULL, plan), CDP_OK, "%s", cdp_last_error());
    struct cdp_machine_info m = {0};
    cr_assert_eq(cdp_plan_resolve(*plan, &m), CDP_OK, "%s", cdp_last_error());
    struct cdp_topology *t = NULL;
    char note[256];
    cr_assert_eq(cdp_planner_topology(*plan, 0, &t, note, sizeof note), CDP_OK, "%s", cdp_last_error());
    struct cdp_planner_result r = {0};
    cr_assert_eq(cdp_planner_run(*plan, t, NULL, CDP_PLANNER_LAYOUT_ONLY, &r), CDP_OK, "%s", cdp_last_error());
    cdp_topology_free(t);
    *lay = r.layout;
    r.layout = NULL;
    cdp_planner_result_clear(&r);
    cr_assert_eq(cdp_comm_self(self), CDP_OK);
    struct cdp_exec_decoder *d = NULL;
    cr_assert_eq(cdp_exec_decoder_open(*plan, *lay, *self, NULL, NULL, 16, &d), CDP_OK, "%s", cdp_last_error());
    return d;
}

/* Decoding runs the forward-only lists through the interpreter on any
 * placement: zbv's two chunks on one rank (the second takes the first's rows
 * on the rank, no transfer) give the logits of one chunk, bit for bit, for the
 * prompt's positions at once and then one position a step. */
Test(generate, decoder_over_two_local_chunks_equals_one_chunk)
{
    struct cdp_plan *pa, *pb;
    struct cdp_layout *la, *lb;
    cdp_comm_t sa, sb;
    struct cdp_exec_decoder *a = open_decoder("\"stages\": 1, \"micro_batches\": 1", &pa, &la, &sa);
    struct cdp_exec_decoder *b =
        open_decoder("\"stages\": 1, \"micro_batches\": 1, \"schedule\": \"zbv\"", &pb, &lb, &sb);
    cr_assert_eq(lb->chunks, 2, "zbv runs two chunks");
    cr_assert(cdp_exec_decoder_last(a) && cdp_exec_decoder_last(b));
    const int32_t tokens[] = {3, 14, 15, 9, 2, 6, 5, 35};
    float la_[64], lb_[64];
    int64_t at = 0;
    for (int step = 0; step < 4; step++) {
        const int64_t n = step == 0 ? 5 : 1; /* the prompt, then a position a step */
        cr_assert_eq(cdp_exec_decoder_step(a, tokens + at, n, la_), CDP_OK, "%s", cdp_last_error());
        cr_assert_eq(cdp_exec_decoder_step(b, tokens + at, n, lb_), CDP_OK, "%s", cdp_last_error());
        at += n;
        cr_assert_eq(cdp_exec_decoder_position(a), at);
        cr_assert_eq(cdp_exec_decoder_position(b), at);
        cr_assert(!memcmp(la_, lb_, sizeof la_), "step %d: the logits differ", step);
        int finite = 1;
        for (int i = 0; i < 64; i++) finite &= isfinite(la_[i]);
        cr_assert(finite);
    }
    cdp_exec_decoder_reset(b);
    cr_assert_eq(cdp_exec_decoder_position(b), 0);
    cdp_exec_decoder_close(a);
    cdp_exec_decoder_close(b);
    cdp_comm_free(sa);
    cdp_comm_free(sb);
    cdp_layout_free(la);
    cdp_layout_free(lb);
    cdp_plan_free(pa);
    cdp_plan_free(pb);
}
