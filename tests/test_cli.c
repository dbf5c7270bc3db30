/* Suite cli: the cdphybrid binary's options, exit codes and messages. The
 * bad-plan cases are in test_cli_plans.c. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cdp_config.h"
#include "harness.h"
#include "model/safetensors.h"

static struct cdp_run run(const char *const *argv)
{
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, argv), 0, "could not start the binary");
    return r;
}

Test(cli, help_prints_usage_with_examples)
{
    struct cdp_run r = run((const char *[]){"--help", NULL});
    cr_assert_eq(r.exit_code, 0);
    cr_assert(strstr(r.out, "usage: cdphybrid"), "%s", r.out);
    cr_assert(strstr(r.out, "--dry-run"));
    cr_assert(strstr(r.out, "examples:"));
    cr_assert(strstr(r.out, "exit codes"));
    cr_assert_str_empty(r.err);
    cdp_test_run_free(&r);
}

Test(cli, version_names_backends_and_libraries)
{
    struct cdp_run r = run((const char *[]){"--version", NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.out, "cdphybrid " CDP_VERSION), "%s", r.out);
    cr_assert(strstr(r.out, "cpu   built in"), "%s", r.out);
    cr_assert(strstr(r.out, "jansson 2."), "%s", r.out);
    cr_assert(strstr(r.out, "OpenBLAS"), "%s", r.out);
    if (CDP_HAVE_CUDA)
        cr_assert(strstr(r.out, "cuda  module for " CDP_GPU_ARCH), "%s", r.out);
    else
        cr_assert(strstr(r.out, "cuda  not built"), "%s", r.out);
    cdp_test_run_free(&r);
}

struct usage_case {
    char args[4][32];
    char expect[80];
};

ParameterizedTestParameters(cli, bad_usage_exits_2)
{
    static struct usage_case cases[] = {
        {{""}, "nothing to do"},
        {{"--plam", "x.json"}, "unknown option --plam (did you mean --plan?)"},
        {{"--frobnicate"}, "unknown option --frobnicate"},
        {{"--plan"}, "--plan needs a file name"},
        {{"--plan="}, "--plan needs a file name"},
        {{"stray"}, "unexpected argument \"stray\""},
        {{"--plan", "x.json"}, "x.json: cannot read"},
        {{"--plan", "x.json", "--json"}, "--json goes with --dry-run"},
        {{"-v", "-q", "--plan", "x.json"}, "cannot be used together"},
    };
    return cr_make_param_array(struct usage_case, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(struct usage_case *c, cli, bad_usage_exits_2)
{
    const char *argv[5] = {NULL};
    int n = 0;
    for (int i = 0; i < 4 && c->args[i][0]; i++) argv[n++] = c->args[i];
    struct cdp_run r = run(argv);
    cr_assert_eq(r.exit_code, 2, "exit %d for %s: %s", r.exit_code, c->expect, r.err);
    cr_assert(strstr(r.err, c->expect), "expected \"%s\" in: %s", c->expect, r.err);
    cr_assert(strncmp(r.err, "cdphybrid: ", 11) == 0, "%s", r.err);
    cr_assert_str_empty(r.out);
    cdp_test_run_free(&r);
}

Test(cli, bad_log_environment_is_bad_usage)
{
    setenv("CDP_LOG", "shouty", 1);
    struct cdp_run r = run((const char *[]){"--help", NULL});
    cr_assert_eq(r.exit_code, 2);
    cr_assert(strstr(r.err, "CDP_LOG") && strstr(r.err, "shouty"), "%s", r.err);
    cdp_test_run_free(&r);
}

Test(cli, demo_plan_dry_run_succeeds)
{
    const char *plan = cdp_test_source_path("examples/gpt-tiny.json");
    struct cdp_run r = run((const char *[]){"--plan", plan, "--dry-run", NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.out, "gpt"), "%s", r.out);
    cr_assert(strstr(r.out, "1f1b"), "%s", r.out);
    cdp_test_run_free(&r);
}

/* A fixed shape is planned too: its shares are shown (equal devices: equal shares), and with
 * explicit shares a mixed cluster says what they cost against uniform. */
Test(cli, dry_run_shows_the_balance_of_a_fixed_plan)
{
    const char *dir = cdp_test_tmpdir();
    const char *cpu = cdp_test_write_file(dir, "cpu.json",
        "{\"model\": {\"preset\": \"mlp\", \"input\": [16], \"hidden\": [32, 32], \"classes\": 4}, "
        "\"train\": {\"micro_batch\": 2}, \"parallel\": {\"stages\": 1, \"replicas\": 2, \"micro_batches\": 3}, "
        "\"cluster\": {\"backend\": \"cpu\"}}");
    struct cdp_run r = run((const char *[]){"--plan", cpu, "--dry-run", NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    const char *b = strstr(r.out, "Plan: balance (speed: shares by predicted speed)");
    cr_assert_not_null(b, "%s", r.out);
    cr_assert(strstr(b, "      0  CPU x1") && strstr(b, "      1  CPU x1"), "%s", b);
    cr_assert(strstr(b, "with 3 each: +0.0%"), "%s", b);
    cr_assert(strstr(r.out, "balance          speed"), "equal shares leave \"speed\": %s", r.out);
    cdp_test_run_free(&r);
    const char *mixed = cdp_test_write_file(dir, "mixed.json",
        "{\"model\": {\"preset\": \"gpt\", \"vocab\": 256, \"context\": 64, \"layers\": 4, \"heads\": 4, "
        "\"embed\": 128}, \"train\": {\"micro_batch\": 2}, \"parallel\": {\"stages\": 1, \"replicas\": 2, "
        "\"micro_batches\": 4, \"placement\": [[8, 0]], \"balance\": [5, 3]}, "
        "\"cluster\": {\"backend\": \"cuda\", \"topology\": \"dgx-a100 + dgx1-v100\"}}");
    r = run((const char *[]){"--plan", mixed, "--dry-run", NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    b = strstr(r.out, "Plan: balance (shares from the plan)");
    cr_assert_not_null(b, "%s", r.out);
    cr_assert(strstr(b, "      0  V100-SXM2-16GB x1") && strstr(b, "      1  A100-SXM4-80GB x1"), "%s", b);
    cr_assert(strstr(b, "with 4 each: -"), "more on the slower replica loses: %s", b);
    cr_assert(strstr(r.out, "balance          5 3 micro-batches per replica"), "%s", r.out);
    cdp_test_run_free(&r);
    /* one replica: nothing to share */
    const char *one = cdp_test_write_file(dir, "one.json",
        "{\"model\": {\"preset\": \"mlp\", \"input\": [16], \"hidden\": [32, 32], \"classes\": 4}, "
        "\"parallel\": {\"stages\": 2, \"replicas\": 1}, \"cluster\": {\"backend\": \"cpu\"}}");
    r = run((const char *[]){"--plan", one, "--dry-run", NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.out, "Plan: predicted") && !strstr(r.out, "Plan: balance"), "%s", r.out);
    cdp_test_run_free(&r);
}

Test(cli, verbose_says_why_no_gpu_for_auto_backend)
{
    const char *dir = cdp_test_tmpdir();
    const char *plan = cdp_test_write_file(dir, "p.json", "{\"model\": {\"preset\": \"gpt\"}}");
    struct cdp_run r = run((const char *[]){"-v", "--plan", plan, "--dry-run", NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    if (!strstr(r.out, "cuda"))
        cr_assert(strstr(r.err, "INFO DEVICE:"), "verbose output says what the GPU probe found: %s", r.err);
    cdp_test_run_free(&r);
}

Test(cli, quiet_prints_no_log_lines)
{
    const char *dir = cdp_test_tmpdir();
    const char *plan = cdp_test_write_file(dir, "p.json", "{\"model\": {\"preset\": \"gpt\"}}");
    struct cdp_run r = run((const char *[]){"-q", "--plan", plan, "--dry-run", NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_str_empty(r.err);
    cdp_test_run_free(&r);
}

Test(cli, trains_a_plan_and_writes_metrics_and_weights)
{
    const char *dir = cdp_test_tmpdir();
    const char *plan = cdp_test_write_file(
        dir, "p.json",
        "{\"model\": {\"preset\": \"gpt\", \"vocab\": 16, \"context\": 8, \"layers\": 1, \"heads\": 2, "
        "\"embed\": 16}, \"train\": {\"steps\": 6, \"micro_batch\": 4, \"log_every\": 2, \"eval_every\": 3}, "
        "\"parallel\": {\"micro_batches\": 2}, \"cluster\": {\"backend\": \"cpu\"}, "
        "\"output\": {\"metrics\": \"m.jsonl\", \"weights\": \"w.safetensors\"}}");
    struct cdp_run r = run((const char *[]){"--plan", plan, NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.out, "step 1/6"), "%s", r.out);
    cr_assert(strstr(r.out, "step 6/6"), "%s", r.out);
    cr_assert(strstr(r.out, "val "), "validation every 3 steps: %s", r.out);
    cr_assert(strstr(r.out, "done: 6 steps"), "%s", r.out);
    char path[4200];
    snprintf(path, sizeof path, "%s/m.jsonl", dir);
    char *m = cdp_test_read_file(path);
    cr_assert_not_null(m, "metrics written next to the plan");
    int lines = 0;
    for (char *c = m; *c; c++) lines += *c == '\n';
    cr_assert_eq(lines, 7, "the layout, then one line per step: %s", m);
    cr_assert(!strncmp(m, "{\"layout\": {", 12), "the layout first: %s", m);
    cr_assert(strstr(m, "{\"step\": 6, \"loss\": "), "%s", m);
    cr_assert(strstr(m, "\"val_loss\""), "%s", m);
    free(m);
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    char *w = cdp_test_read_file(path);
    cr_assert_not_null(w, "weights written");
    free(w);
    /* the metadata of cdphybrid export: "step", the optimizer steps done */
    struct cdp_safetensors_file *sf;
    cr_assert_eq(cdp_safetensors_open(path, &sf), CDP_OK, "%s", cdp_last_error());
    cr_assert_str_eq(cdp_safetensors_metadata(sf, "format"), "cdphybrid");
    const char *step = cdp_safetensors_metadata(sf, "step");
    cr_assert(step && !strcmp(step, "6"), "metadata step: %s", step ? step : "(none)");
    cr_assert_null(cdp_safetensors_metadata(sf, "steps"), "one name for the step");
    cdp_safetensors_close(sf);
    cdp_test_run_free(&r);

    /* -q keeps stdout empty and still trains */
    r = run((const char *[]){"-q", "--plan", plan, NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_str_empty(r.out);
    cdp_test_run_free(&r);
}

Test(cli, multi_rank_plans_without_launching_ask_for_mpirun)
{
    const char *plan = cdp_test_source_path("examples/gpt-tiny.json");
    struct cdp_run r = run((const char *[]){"--no-launch", "--plan", plan, NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.out, "the layout has 4 ranks: start them with\n") && strstr(r.out, "mpirun -np 4 --bind-to none "),
              "%s", r.out);
    cr_assert(strstr(r.out, "plan: 2 stages x 2 replicas"), "the layout is printed first: %s", r.out);
    cr_assert(!strstr(r.out, "--no-launch"), "the ranks' line has no --no-launch: %s", r.out);
    if (geteuid() == 0)
        cr_assert(strstr(r.out, "\nOMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "), "as root: %s", r.out);
    cdp_test_run_free(&r);
}

/* Outputs are checked before the first step (exit 1, the key and the path),
 * and a write that fails mid-run (a full disk: /dev/full) ends the run at that
 * write with exit 1, the file named, no line left cut in half. */
Test(cli, unwritable_outputs_fail_before_the_first_step)
{
    const char *dir = cdp_test_tmpdir();
    static const struct {
        const char *key, *value, *want;
    } c[] = {
        {"\"output\": {\"weights\": \"no-such-folder/w.safetensors\"}", "/output/weights",
         "no-such-folder\" does not exist"},
        {"\"output\": {\"trace\": \".\"}", "/output/trace", "is a folder"},
        {"\"output\": {\"metrics\": \"plan.json/m.jsonl\"}", "/output/metrics", "plan.json"},
        {"\"output\": {\"metrics\": \"m.jsonl\"}, \"train\": {\"steps\": 2, \"checkpoint\": {\"dir\": \"plan.json/ck\", "
         "\"every\": 1}}",
         "/train/checkpoint/dir", "plan.json"},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        char json[1024];
        snprintf(json, sizeof json,
                 "{\"model\": {\"preset\": \"mlp\", \"input\": [4], \"hidden\": [8], \"classes\": 3}, "
                 "\"data\": {\"source\": \"synthetic\"}, %s%s}", c[i].key,
                 strstr(c[i].key, "\"train\"") ? "" : ", \"train\": {\"steps\": 2}");
        const char *plan = cdp_test_write_file(dir, "plan.json", json);
        struct cdp_run r = run((const char *[]){"--plan", plan, NULL});
        /* 2 where the plan's own check finds it (a missing folder), 1 from the run's check */
        cr_assert(r.exit_code == 1 || r.exit_code == 2, "%s: exit %d: %s", c[i].value, r.exit_code, r.err);
        cr_assert(strstr(r.err, c[i].value) && strstr(r.err, c[i].want), "%s: %s", c[i].value, r.err);
        cr_assert_null(strstr(r.out, "step 1/"), "%s: it trained first: %s", c[i].value, r.out);
        cdp_test_run_free(&r);
    }
    /* a full disk: the first record fails, the run ends there */
    const char *plan = cdp_test_write_file(dir, "full.json",
                                           "{\"model\": {\"preset\": \"mlp\", \"input\": [4], \"hidden\": [8], "
                                           "\"classes\": 3}, \"data\": {\"source\": \"synthetic\"}, \"train\": "
                                           "{\"steps\": 3}, \"output\": {\"metrics\": \"/dev/full\"}}");
    struct cdp_run r = run((const char *[]){"--plan", plan, NULL});
    cr_assert_eq(r.exit_code, 1, "exit %d: %s", r.exit_code, r.err);
    cr_assert(strstr(r.err, "/dev/full: cannot write: No space left on device"), "%s", r.err);
    cr_assert_null(strstr(r.out, "step 3/"), "%s", r.out);
    cdp_test_run_free(&r);
}

/* ---- weights files the plan does not fully use (issue 19) --------------------------------- */

/* The Hugging Face fixture (2 blocks, vocab 32, width 16) at dir/name, its
 * tensor `replace` (NULL: none) swapped for x, or x added. */
static const char *hf_file(const char *dir, const char *name, const char *replace,
                           const struct cdp_safetensors_tensor *x)
{
    static char path[4200];
    struct cdp_safetensors_file *f;
    cr_assert_eq(cdp_safetensors_open(cdp_test_source_path("tests/fixtures/golden/gpt-tiny-hf.safetensors"), &f),
                 CDP_OK, "%s", cdp_last_error());
    struct cdp_safetensors_tensor ts[40];
    int n = 0;
    for (int i = 0; i < cdp_safetensors_count(f); i++)
        if (!replace || strcmp(cdp_safetensors_at(f, i)->name, replace)) ts[n++] = *cdp_safetensors_at(f, i);
    ts[n++] = *x;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    cr_assert_eq(cdp_safetensors_write(path, ts, n, (const char *[]){"format", "pt"}, 1), CDP_OK, "%s",
                 cdp_last_error());
    cdp_safetensors_close(f);
    return path;
}

static const char *tiny_plan(const char *dir, const char *weights, const char *extra)
{
    char json[6000];
    snprintf(json, sizeof json,
             "{\"model\": {\"preset\": \"gpt\", \"vocab\": 32, \"context\": 8, \"layers\": 2, \"heads\": 2, "
             "\"embed\": 16, \"weights\": \"%s\"%s}, \"train\": {\"steps\": 1, \"micro_batch\": 2}, "
             "\"cluster\": {\"backend\": \"cpu\"}}", weights, extra);
    return cdp_test_write_file(dir, "plan.json", json);
}

/* An untied lm_head.weight given to a tied plan was dropped without a word
 * (the head became the embedding); the run now stops before its first step,
 * naming the tensor and /model/tie_embeddings, unless the plan says "warn". */
Test(cli, weights_the_plan_would_drop_stop_the_run)
{
    const char *dir = cdp_test_tmpdir();
    static float head[32 * 16];
    for (int i = 0; i < 32 * 16; i++) head[i] = 0.01f * (float)(i % 13) - 0.05f;
    struct cdp_safetensors_tensor lm = {.name = "lm_head.weight", .dtype = CDP_DTYPE_F32, .ndim = 2,
                                        .shape = {32, 16}, .data = head, .nbytes = sizeof head};
    const char *w = hf_file(dir, "untied.safetensors", NULL, &lm);
    struct cdp_run r = run((const char *[]){"--plan", tiny_plan(dir, w, ""), NULL});
    cr_assert_eq(r.exit_code, 2, "exit %d: %s", r.exit_code, r.err);
    cr_assert(strstr(r.err, "untied.safetensors: 1 tensor in the file is not used by the plan's model: "
                            "lm_head.weight") && strstr(r.err, "/model/tie_embeddings"), "%s", r.err);
    cr_assert_null(strstr(r.out, "step 1/1"), "no step is trained: %s", r.out);
    cdp_test_run_free(&r);

    r = run((const char *[]){"--plan", tiny_plan(dir, w, ", \"unused_tensors\": \"warn\""), NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.err, "lm_head.weight") && strstr(r.err, "loaded without them: /model/unused_tensors is "
                                                                "\"warn\""), "%s", r.err);
    cr_assert(strstr(r.out, "step 1/1"), "%s", r.out);
    cdp_test_run_free(&r);
}

/* GPT-2's files have 1024 positions: a shorter context uses the first rows,
 * and -v says so. */
Test(cli, a_shorter_context_loads_the_first_positions)
{
    const char *dir = cdp_test_tmpdir();
    static float rows[1024 * 16];
    for (int i = 0; i < 1024 * 16; i++) rows[i] = 0.001f * (float)(i % 101);
    struct cdp_safetensors_tensor wpe = {.name = "transformer.wpe.weight", .dtype = CDP_DTYPE_F32, .ndim = 2,
                                         .shape = {1024, 16}, .data = rows, .nbytes = sizeof rows};
    const char *w = hf_file(dir, "positions.safetensors", "transformer.wpe.weight", &wpe);
    struct cdp_run r = run((const char *[]){"-v", "--plan", tiny_plan(dir, w, ""), NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.err, "tensor transformer.wpe.weight has 1024 positions; using the first 8 (/model/context 8)"),
              "%s", r.err);
    cr_assert(strstr(r.out, "step 1/1"), "%s", r.out);
    cdp_test_run_free(&r);
}

/* ---- step lines with the learning rate and the time left; cdphybrid plot ---------- */

static int count_of(const char *s, const char *needle)
{
    int n = 0;
    for (const char *c = strstr(s, needle); c; c = strstr(c + 1, needle)) n++;
    return n;
}

/* The step lines show the scheduled rate and the time left (not on the last
 * step); a CPU device has no known peak, so no MFU. The run's metrics.jsonl
 * then plots: the training loss of every step, the validation points and the
 * rate on its own axis. */
Test(cli, step_lines_show_the_rate_and_the_run_plots)
{
    const char *dir = cdp_test_tmpdir();
    const char *plan = cdp_test_write_file(
        dir, "p.json",
        "{\"model\": {\"preset\": \"gpt\", \"vocab\": 16, \"context\": 8, \"layers\": 1, \"heads\": 2, "
        "\"embed\": 16}, \"train\": {\"steps\": 6, \"micro_batch\": 4, \"log_every\": 1, \"eval_every\": 3, "
        "\"optimizer\": {\"lr\": 0.01}, \"lr_schedule\": {\"type\": \"linear\", \"warmup_steps\": 2, "
        "\"min_lr\": 0.002}}, \"parallel\": {\"micro_batches\": 2}, \"cluster\": {\"backend\": \"cpu\"}, "
        "\"output\": {\"metrics\": \"m.jsonl\"}}");
    struct cdp_run r = run((const char *[]){"--plan", plan, NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    static const char *const want[] = {"step 1/6  loss ", "lr 5.000e-03", "step 2/6", "lr 1.000e-02",
                                       "lr 8.000e-03", "lr 6.000e-03", "lr 4.000e-03", "lr 2.000e-03"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_assert(strstr(r.out, want[i]), "no \"%s\" in:\n%s", want[i], r.out);
    cr_assert_eq(count_of(r.out, "  eta "), 5, "the time left on steps 1 to 5:\n%s", r.out);
    cr_assert_null(strstr(r.out, "MFU"), "a CPU has no known peak:\n%s", r.out);
    char m[4200], svg[4200];
    snprintf(m, sizeof m, "%s/m.jsonl", dir);
    snprintf(svg, sizeof svg, "%s/loss.svg", dir);
    cdp_test_run_free(&r);
    r = run((const char *[]){"plot", m, "-o", svg, NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.out, "6 steps"), "%s", r.out);
    cdp_test_run_free(&r);
    char *s = cdp_test_read_file(svg);
    cr_assert_not_null(s);
    cr_assert(!strncmp(s, "<svg ", 5) && strstr(s, "</svg>\n"), "%s", s);
    cr_assert_eq(count_of(s, "<polyline"), 3, "loss, validation loss and rate:\n%s", s);
    cr_assert_eq(count_of(s, "<circle"), 2, "validation at steps 3 and 6:\n%s", s);
    cr_assert(strstr(s, ">learning rate</text>") && strstr(s, ">validation loss</text>"), "%s", s);
    /* the training loss: 6 points, the rate's line from 0.005 up to 0.01 and down to 0.002 */
    static const char head[] = "stroke=\"#1f6fb4\" stroke-width=\"1.5\" points=\"";
    const char *loss = strstr(s, head);
    cr_assert_not_null(loss, "%s", s);
    loss += sizeof head - 1;
    const char *end = strchr(loss, '"');
    int pts = 0;
    for (const char *c = loss; c < end; c++) pts += *c == ',';
    cr_assert_eq(pts, 6, "%.*s", (int)(end - loss), loss);
    free(s);
}

/* A resumed run records steps again: the later records replace the earlier
 * ones. Bad lines are named by file and line, exit 2, and nothing is written
 * (an older picture stays as it was). */
Test(cli, plot_reads_resumes_and_names_bad_lines)
{
    const char *dir = cdp_test_tmpdir();
    const char *m = cdp_test_write_file(dir, "m.jsonl",
                                        "{\"layout\": {\"stages\": 1}}\n"
                                        "{\"step\": 1, \"loss\": 3.0, \"lr\": 0.001}\n"
                                        "{\"step\": 2, \"loss\": 2.5, \"lr\": 0.001, \"val_loss\": 2.6}\n"
                                        "{\"step\": 3, \"loss\": 9.0, \"lr\": 0.001}\n"
                                        "{\"step\": 3, \"loss\": 2.0, \"lr\": 0.001}\n"
                                        "{\"step\": 4, \"loss\": 1.5, \"lr\": 0.001, \"val_loss\": 1.9}\n");
    char svg[4200];
    snprintf(svg, sizeof svg, "%s/loss.svg", dir);
    struct cdp_run r = run((const char *[]){"plot", m, "--out", svg, "--title", "a <run> & more", NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.out, "4 steps"), "%s", r.out);
    cdp_test_run_free(&r);
    char *s = cdp_test_read_file(svg);
    cr_assert(strstr(s, ">a &lt;run&gt; &amp; more</text>"), "the title, escaped: %s", s);
    cr_assert_eq(count_of(s, "<circle"), 2);
    free(s);
    static const struct {
        const char *text, *error;
    } bad[] = {
        {"{\"step\": 1, \"loss\": 3.0}\n{\"step\": 2, \"loss\": \n", "bad.jsonl:2: expected a JSON object per line"},
        {"{\"step\": 1, \"loss\": \"3.0\"}\n", "bad.jsonl:1: /loss: expected a number"},
        {"{\"step\": -1, \"loss\": 3.0}\n", "bad.jsonl:1: /step: expected a non-negative integer"},
        {"[1, 2]\n", "bad.jsonl:1: expected a JSON object per line (metrics.jsonl), got another value"},
        {"{\"layout\": {}}\n", "bad.jsonl: no step records"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *b = cdp_test_write_file(dir, "bad.jsonl", bad[i].text);
        r = run((const char *[]){"plot", b, "-o", svg, NULL});
        cr_assert_eq(r.exit_code, 2, "%s: exit %d", bad[i].text, r.exit_code);
        cr_assert(strstr(r.err, bad[i].error), "%s: %s", bad[i].text, r.err);
        cdp_test_run_free(&r);
        s = cdp_test_read_file(svg);
        cr_assert(strstr(s, ">a &lt;run&gt; &amp; more</text>"), "the earlier picture was replaced");
        free(s);
    }
    r = run((const char *[]){"plot", m, NULL});
    cr_assert_eq(r.exit_code, 2);
    cr_assert(strstr(r.err, "-o OUT.svg"), "%s", r.err);
    cdp_test_run_free(&r);
    char missing[4200];
    snprintf(missing, sizeof missing, "%s/nope.jsonl", dir);
    r = run((const char *[]){"plot", missing, "-o", svg, NULL});
    cr_assert_eq(r.exit_code, 2);
    cr_assert(strstr(r.err, "nope.jsonl: cannot open"), "%s", r.err);
    cdp_test_run_free(&r);
}

/* MFU where the devices' peak is known: a GPU of a topology preset (here the
 * stand-in CUDA module's device, planned as one H100 of hgx-h100, fp32 peak
 * 67 TFLOP/s): metrics.jsonl's mfu is its flops_per_s over that peak, and the
 * step lines show it. */
Test(cli, mfu_over_the_topologys_gpu_peak)
{
    const char *fake = getenv("CDP_FAKE_CUDA_DIR");
    cr_assert_not_null(fake, "CDP_FAKE_CUDA_DIR is not set (run the tests through meson test)");
    const char *dir = cdp_test_tmpdir();
    const char *plan = cdp_test_write_file(
        dir, "g.json",
        "{\"model\": {\"preset\": \"gpt\", \"vocab\": 32, \"context\": 8, \"layers\": 2, \"heads\": 2, \"embed\": 16}, "
        "\"train\": {\"steps\": 3, \"micro_batch\": 2, \"log_every\": 1}, \"parallel\": {\"stages\": 1, "
        "\"replicas\": 1, \"micro_batches\": 2}, \"cluster\": {\"backend\": \"cuda\", \"topology\": \"hgx-h100\"}, "
        "\"output\": {\"metrics\": \"g.jsonl\"}}");
    char *saved = getenv("CDP_MODULE_DIR") ? strdup(getenv("CDP_MODULE_DIR")) : NULL;
    setenv("CDP_MODULE_DIR", fake, 1);
    struct cdp_run r = run((const char *[]){"--plan", plan, NULL});
    if (saved) setenv("CDP_MODULE_DIR", saved, 1);
    else unsetenv("CDP_MODULE_DIR");
    free(saved);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_eq(count_of(r.out, "  MFU "), 3, "%s", r.out);
    cdp_test_run_free(&r);
    char path[4200];
    snprintf(path, sizeof path, "%s/g.jsonl", dir);
    char *text = cdp_test_read_file(path);
    int n = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        const char *m = strstr(line, "\"mfu\": "), *f = strstr(line, "\"flops_per_s\": ");
        if (!strstr(line, "\"step\": ")) continue;
        cr_assert(m && f, "%s", line);
        const double mfu = strtod(m + 7, NULL), fps = strtod(f + 15, NULL);
        cr_assert_float_eq(mfu, fps / 67e12, 1e-12 * mfu, "%s", line);
        n++;
    }
    free(text);
    cr_assert_eq(n, 3);
}
