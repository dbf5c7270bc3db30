/* Suite resume: training continues exactly from a checkpoint, after a crash at
 * any point of a save, and under another layout. Runs the real binary (under
 * mpirun for several ranks). */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dirent.h>

#include "core/hash.h"
#include "harness.h"
#include "comm/comm.h"
#include "model/safetensors.h"
#include "pipeline/run/tensorboard.h"

#define CPU_BACKEND "\"backend\": \"cpu\""
/* the stand-in CUDA module's one device, shared by every rank */
#define CUDA_BACKEND "\"backend\": \"cuda\", \"ranks_per_device\": 8"

/* A GPT of 6 blocks, 6 steps of 8 samples (B = 2); checkpoints every 2 steps;
 * cluster is the members of /cluster. */
static const char *plan_on_z(const char *dir, const char *name, const char *cluster, int p, int R, int m, int steps,
                             int zero)
{
    char json[2048], file[64], z[32] = "";
    if (zero >= 0) snprintf(z, sizeof z, ", \"zero\": %d", zero);
    snprintf(json, sizeof json,
             "{\"model\": {\"preset\": \"gpt\", \"vocab\": 32, \"context\": 8, \"layers\": 6, \"heads\": 2, "
             "\"embed\": 16}, \"data\": {\"source\": \"synthetic\", \"seed\": 5}, \"train\": {\"steps\": %d, "
             "\"micro_batch\": 2, \"optimizer\": {\"lr\": 0.01, \"eps\": 1e-6}, \"grad_clip\": 0.5, "
             "\"eval_batches\": 1, \"timeout_s\": 30, \"checkpoint\": {\"dir\": \"ckpt-%s\", \"every\": 2, "
             "\"keep\": 2}}, \"parallel\": {\"stages\": %d, \"replicas\": %d, \"micro_batches\": %d%s}, "
             "\"cluster\": {%s}, \"output\": {\"metrics\": \"%s.jsonl\", \"weights\": "
             "\"%s.safetensors\"}}",
             steps, name, p, R, m, z, cluster, name, name);
    snprintf(file, sizeof file, "%s.json", name);
    return cdp_test_write_file(dir, file, json);
}

static const char *plan_on(const char *dir, const char *name, const char *cluster, int p, int R, int m, int steps)
{
    return plan_on_z(dir, name, cluster, p, R, m, steps, -1);
}

static const char *plan(const char *dir, const char *name, int p, int R, int m, int steps)
{
    return plan_on(dir, name, CPU_BACKEND, p, R, m, steps);
}

static struct cdp_run run(const char *const *argv, const char *fault)
{
    struct cdp_run r;
    if (fault) setenv("CDP_FAULT", fault, 1);
    cr_assert_eq(cdp_test_run(&r, argv), 0);
    unsetenv("CDP_FAULT");
    return r;
}

static void run_ok(const char *const *argv)
{
    struct cdp_run r = run(argv, NULL);
    cr_assert_eq(r.exit_code, 0, "exit %d: %s", r.exit_code, r.err);
    cdp_test_run_free(&r);
}

static int losses(const char *dir, const char *name, double *out)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s.jsonl", dir, name);
    char *t = cdp_test_read_file(path);
    cr_assert_not_null(t, "%s", path);
    int n = 0;
    for (char *c = strstr(t, "\"step\": "); c && n < 16; c = strstr(c + 1, "\"step\": ")) {
        int step = atoi(c + 8);
        char *l = strstr(c, "\"loss\": ");
        cr_assert(step >= 1 && step <= 16 && l);
        out[step - 1] = strtod(l + 8, NULL);
        if (step > n) n = step;
    }
    free(t);
    return n;
}

/* Every line of name.jsonl is whole JSON, and the step records are 1..n,
 * each once, in order (a resume cuts the lines of the steps it runs again). */
static void steps_once(const char *dir, const char *name, int n)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s.jsonl", dir, name);
    char *t = cdp_test_read_file(path);
    cr_assert_not_null(t, "%s", path);
    cr_assert(*t && t[strlen(t) - 1] == '\n', "%s ends inside a line", path);
    int next = 1;
    for (char *line = strtok(t, "\n"); line; line = strtok(NULL, "\n")) {
        json_error_t e;
        json_t *o = json_loads(line, 0, &e);
        cr_assert_not_null(o, "%s: not JSON: %s", path, line);
        const json_t *st = json_object_get(o, "step");
        if (json_is_integer(st)) {
            cr_assert_eq(json_integer_value(st), next, "%s: step %lld where %d was next", path,
                         (long long)json_integer_value(st), next);
            next++;
        }
        json_decref(o);
    }
    cr_assert_eq(next, n + 1, "%s: %d steps recorded, expected %d", path, next - 1, n);
    free(t);
}

static double weights_error(const char *dir, const char *a, const char *b)
{
    char pa[4200], pb[4200];
    snprintf(pa, sizeof pa, "%s/%s.safetensors", dir, a);
    snprintf(pb, sizeof pb, "%s/%s.safetensors", dir, b);
    struct cdp_safetensors_file *fa, *fb;
    cr_assert_eq(cdp_safetensors_open(pa, &fa), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_safetensors_open(pb, &fb), CDP_OK, "%s", cdp_last_error());
    double worst = 0;
    for (int i = 0; i < cdp_safetensors_count(fa); i++) {
        const struct cdp_safetensors_tensor *x = cdp_safetensors_at(fa, i), *y = cdp_safetensors_find(fb, x->name);
        cr_assert_not_null(y, "%s", x->name);
        const float *u = x->data, *v = y->data;
        double num = 0, den = 0;
        for (uint64_t k = 0; k < x->nbytes / 4; k++) {
            num += ((double)u[k] - v[k]) * ((double)u[k] - v[k]);
            den += (double)u[k] * u[k];
        }
        double e = sqrt(num / (den > 0 ? den : 1));
        if (e > worst) worst = e;
    }
    cdp_safetensors_close(fa);
    cdp_safetensors_close(fb);
    return worst;
}

static char *newdir(void)
{
    static char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    return dir;
}

/* A rank killed mid-run, or mid-save at several points: the newest complete
 * checkpoint is intact and training resumes to the same result, bitwise. */
static void need_mpi(void)
{
    if (!cdp_comm_have_mpi()) cr_skip_test("this build has no MPI (-Dmpi=disabled): multi-rank runs are not possible");
}

static void crash_and_resume_z(const char *fault, int resumed_from, int zero)
{
    need_mpi();
    char *dir = newdir();
    const char *base = plan_on_z(dir, "base", CPU_BACKEND, 2, 2, 2, 6, zero);
    run_ok((const char *[]){"-q", "--plan", base, NULL});
    const char *crash = plan_on_z(dir, "crash", CPU_BACKEND, 2, 2, 2, 6, zero);
    struct cdp_run r = run((const char *[]){"-q", "--plan", crash, NULL}, fault);
    cr_assert_neq(r.exit_code, 0, "the fault %s did not stop the run", fault);
    cdp_test_run_free(&r);
    /* as if the crash had cut a line in half */
    char mpath[4200];
    snprintf(mpath, sizeof mpath, "%s/crash.jsonl", dir);
    FILE *mf = fopen(mpath, "a");
    cr_assert_not_null(mf);
    fputs("{\"step\": 9, \"lo", mf);
    fclose(mf);
    r = run((const char *[]){"--plan", crash, "--resume", NULL}, NULL);
    cr_assert_eq(r.exit_code, 0, "resume after %s: %s", fault, r.err);
    char want[64];
    snprintf(want, sizeof want, "at step %d", resumed_from);
    cr_assert(strstr(r.out, want), "after %s, expected to resume %s: %s", fault, want, r.out);
    cr_assert(strstr(r.out, "later line") && strstr(r.out, "removed (those steps run again)"), "%s", r.out);
    cdp_test_run_free(&r);
    steps_once(dir, "crash", 6);
    double a[16], b[16];
    cr_assert_eq(losses(dir, "base", a), 6);
    cr_assert_eq(losses(dir, "crash", b), 6);
    for (int i = 0; i < 6; i++) cr_assert_eq(a[i], b[i], "step %d: %.9g vs %.9g", i + 1, b[i], a[i]);
    cr_assert_eq(weights_error(dir, "base", "crash"), 0.0, "bitwise under the same plan");
}

static void crash_and_resume(const char *fault, int resumed_from) { crash_and_resume_z(fault, resumed_from, -1); }

Test(resume, killed_rank_resumes_bitwise, .timeout = 120) { crash_and_resume("kill:1:5", 4); }
/* ZeRO-1: the stage's replicas gather their shards into replica 0's part */
Test(resume, zero_killed_rank_resumes_bitwise, .timeout = 120) { crash_and_resume_z("kill:1:5", 4, 1); }
Test(resume, zero_killed_before_a_part_is_written, .timeout = 120)
{
    CDP_TEST_SKIP_WHEN_SAMPLED("zero_killed_rank_resumes_bitwise and killed_before_a_part_is_written");
    crash_and_resume_z("killsave:1:4:part", 2, 1);
}
/* ZeRO-2: the same shards of the optimizer state (gradients are not saved) */
Test(resume, zero2_killed_rank_resumes_bitwise, .timeout = 120)
{
    CDP_TEST_SKIP_WHEN_SAMPLED("zero_killed_rank_resumes_bitwise and zero_checkpoints_resume_across_layouts (ZeRO-2)");
    crash_and_resume_z("kill:1:5", 4, 2);
}

/* A ZeRO-1 checkpoint at 4 replicas resumes at 2 replicas with ZeRO-1 and at
 * 2 stages without it; an unsharded one resumes sharded over 4 (uneven
 * shards); a ZeRO-2 one at 2 x 2 with ZeRO-2, then unsharded: every chain
 * ends where an uninterrupted 2 x 2 run does. */
Test(resume, zero_checkpoints_resume_across_layouts, .timeout = 180)
{
    need_mpi();
    char *dir = newdir();
    run_ok((const char *[]){"-q", "--plan", plan(dir, "base", 2, 2, 2, 6), NULL});
    char ck[4200];
    snprintf(ck, sizeof ck, "%s/ckpt-x", dir);
    run_ok((const char *[]){"-q", "--plan", plan_on_z(dir, "x", CPU_BACKEND, 1, 4, 1, 2, 1), NULL});
    run_ok((const char *[]){"-q", "--plan", plan_on_z(dir, "x", CPU_BACKEND, 1, 2, 2, 4, 1), "--resume", ck, NULL});
    run_ok((const char *[]){"-q", "--plan", plan_on_z(dir, "x", CPU_BACKEND, 2, 1, 4, 6, 0), "--resume", ck, NULL});
    snprintf(ck, sizeof ck, "%s/ckpt-y", dir);
    run_ok((const char *[]){"-q", "--plan", plan_on_z(dir, "y", CPU_BACKEND, 2, 2, 2, 2, 0), NULL});
    run_ok((const char *[]){"-q", "--plan", plan_on_z(dir, "y", CPU_BACKEND, 1, 4, 1, 6, 1), "--resume", ck, NULL});
    snprintf(ck, sizeof ck, "%s/ckpt-z", dir);
    run_ok((const char *[]){"-q", "--plan", plan_on_z(dir, "z", CPU_BACKEND, 1, 4, 1, 2, 2), NULL});
    run_ok((const char *[]){"-q", "--plan", plan_on_z(dir, "z", CPU_BACKEND, 2, 2, 2, 4, 2), "--resume", ck, NULL});
    run_ok((const char *[]){"-q", "--plan", plan_on_z(dir, "z", CPU_BACKEND, 2, 1, 4, 6, 0), "--resume", ck, NULL});
    double a[16], b[16];
    cr_assert_eq(losses(dir, "base", a), 6);
    static const char *const chains[] = {"x", "y", "z"};
    static const char *const said[] = {"zero 1 1x4 -> 1x2 -> zero 0 2x1", "zero 0 2x2 -> zero 1 1x4",
                                       "zero 2 1x4 -> 2x2 -> zero 0 2x1"};
    for (int c = 0; c < 3; c++) {
        cr_assert_eq(losses(dir, chains[c], b), 6);
        for (int i = 0; i < 6; i++)
            cr_assert_leq(fabs(a[i] - b[i]), 1e-5 * fabs(a[i]), "%s step %d: %.9g vs %.9g", chains[c], i + 1, b[i],
                          a[i]);
        double e = weights_error(dir, "base", chains[c]);
        cr_assert_leq(e, 1e-5, "%s: weights differ by %.3g", chains[c], e);
        cr_log_info("%s: worst weight error %.3g", said[c], e);
    }
}
/* The worst case: a 2 x 2 run saved steps 4 and 6; a 1 x 1 plan with
 * the same folder resumed from step 4 would save step 6 again under the old
 * name. It is refused before training, and step 6 stays byte for byte. */
Test(resume, resuming_an_earlier_step_never_writes_over_a_later_checkpoint, .timeout = 120)
{
    need_mpi();
    char *dir = newdir();
    run_ok((const char *[]){"-q", "--plan", plan(dir, "h", 2, 2, 2, 6), NULL});
    char six[4300], four[4300], part[4400], sum_before[65], sum_after[65];
    snprintf(six, sizeof six, "%s/ckpt-h/step-00000006/manifest.json", dir);
    snprintf(four, sizeof four, "%s/ckpt-h/step-00000004", dir);
    snprintf(part, sizeof part, "%s/ckpt-h/step-00000006/stage-0.safetensors", dir);
    char *before = cdp_test_read_file(six);
    cr_assert_not_null(before);
    cr_assert_eq(cdp_sha256_file(part, sum_before), CDP_OK);
    struct cdp_run r = run((const char *[]){"-q", "--plan", plan(dir, "h", 1, 1, 8, 6), "--resume", four, NULL}, NULL);
    cr_assert_neq(r.exit_code, 0, "resumed over a later checkpoint: %s", r.out);
    cr_assert(strstr(r.err, "checkpoints after step 4 are there") && strstr(r.err, "step-00000006"), "%s", r.err);
    cdp_test_run_free(&r);
    char *after = cdp_test_read_file(six);
    cr_assert(after && !strcmp(before, after), "step 6's manifest changed");
    cr_assert_eq(cdp_sha256_file(part, sum_after), CDP_OK);
    cr_assert_str_eq(sum_after, sum_before, "step 6's part changed");
    free(before);
    free(after);
}

Test(resume, killed_before_a_part_is_written, .timeout = 120) { crash_and_resume("killsave:1:4:part", 2); }
Test(resume, killed_before_the_manifest, .timeout = 120) { crash_and_resume("killsave:0:4:commit", 2); }

/* 2 stages x 2 replicas -> 4 x 1 -> 1 x 1, against an uninterrupted run. */
Test(resume, across_layouts, .timeout = 120)
{
    need_mpi();
    char *dir = newdir();
    const char *base = plan(dir, "base", 2, 2, 2, 6);
    run_ok((const char *[]){"-q", "--plan", base, NULL});
    run_ok((const char *[]){"-q", "--plan", plan(dir, "x", 2, 2, 2, 2), NULL});
    char ck[4200];
    snprintf(ck, sizeof ck, "%s/ckpt-x", dir);
    run_ok((const char *[]){"-q", "--plan", plan(dir, "x", 4, 1, 4, 4), "--resume", ck, NULL});
    run_ok((const char *[]){"-q", "--plan", plan(dir, "x", 1, 1, 4, 6), "--resume", ck, NULL});
    double a[16], b[16];
    cr_assert_eq(losses(dir, "base", a), 6);
    cr_assert_eq(losses(dir, "x", b), 6);
    for (int i = 0; i < 6; i++)
        cr_assert_leq(fabs(a[i] - b[i]), 1e-5 * fabs(a[i]), "step %d: %.9g vs %.9g", i + 1, b[i], a[i]);
    double e = weights_error(dir, "base", "x");
    cr_assert_leq(e, 1e-5, "weights differ by %.3g", e);
    cr_log_info("2x2 -> 4x1 -> 1x1: worst weight error %.3g", e);
}

/* GPT's list types with the attention split by heads (docs/parallelism.md):
 * p stages of tensor groups of t, steps steps, checkpoints every 2. */
static const char *plan_att(const char *dir, const char *name, int p, int t, int steps)
{
    char json[2048], file[64];
    snprintf(json, sizeof json,
             "{\"model\": {\"input\": [8], \"layers\": [{\"type\": \"embedding\", \"vocab\": 37, \"dim\": "
             "16, \"context\": 8}, {\"type\": \"layernorm\"}, {\"type\": \"attention\", \"heads\": 4}, "
             "{\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": 32, \"split\": \"column\"}, "
             "{\"type\": \"gelu\"}, {\"type\": \"linear\", \"out\": 16, \"split\": \"row\"}, {\"type\": "
             "\"linear\", \"out\": 37}], \"loss\": \"cross_entropy\"}, \"data\": {\"source\": \"synthetic\", "
             "\"seed\": 5}, \"train\": {\"steps\": %d, \"global_batch\": 8, \"micro_batch\": 2, \"optimizer\": "
             "{\"type\": \"sgd\", \"lr\": 0.05, \"momentum\": 0.9}, \"eval_batches\": 1, \"timeout_s\": 30, "
             "\"checkpoint\": {\"dir\": \"ckpt-%s\", \"every\": 2, \"keep\": 2}}, \"parallel\": {\"stages\": "
             "%d, \"tensor\": %d}, \"cluster\": {" CPU_BACKEND "}, \"output\": {\"metrics\": \"%s.jsonl\", "
             "\"weights\": \"%s.safetensors\"}}",
             steps, name, p, t, name, name);
    snprintf(file, sizeof file, "%s.json", name);
    return cdp_test_write_file(dir, file, json);
}

/* A list with attention trained at t = 2 (2 stages) checkpoints whole
 * tensors (its export is the weights the run wrote, to the bit) and resumes
 * at t = 1 on one rank, training on as an uninterrupted one-rank run. */
Test(resume, an_attention_list_at_t2_resumes_at_t1, .timeout = 120)
{
    need_mpi();
    char *dir = newdir();
    run_ok((const char *[]){"-q", "--plan", plan_att(dir, "base", 1, 1, 4), NULL});
    run_ok((const char *[]){"-q", "--plan", plan_att(dir, "x", 2, 2, 2), NULL});
    char ck[4200], out[4200];
    snprintf(ck, sizeof ck, "%s/ckpt-x", dir);
    snprintf(out, sizeof out, "%s/exported.safetensors", dir);
    run_ok((const char *[]){"export", "--checkpoint", ck, "--out", out, NULL});
    cr_assert_eq(weights_error(dir, "x", "exported"), 0.0, "the checkpoint holds the weights the t = 2 run wrote");
    struct cdp_run r = run((const char *[]){"--plan", plan_att(dir, "x", 1, 1, 4), "--resume", ck, NULL}, NULL);
    cr_assert_eq(r.exit_code, 0, "exit %d: %s", r.exit_code, r.err);
    cr_assert(strstr(r.out, "resuming from ") && strstr(r.out, " at step 2\n"), "%s", r.out);
    cdp_test_run_free(&r);
    double a[16], b[16];
    cr_assert_eq(losses(dir, "base", a), 4);
    cr_assert_eq(losses(dir, "x", b), 4);
    for (int i = 0; i < 4; i++)
        cr_assert_leq(fabs(a[i] - b[i]), 1e-5 * fabs(a[i]), "step %d: %.9g vs %.9g", i + 1, b[i], a[i]);
    const double e = weights_error(dir, "base", "x");
    cr_assert_leq(e, 1e-5, "weights differ by %.3g", e);
    cr_log_info("attention list t=2 x 2 stages -> t=1: worst weight error %.3g", e);
}

/* The plan of plan_on with a schedule. */
static const char *plan_sched(const char *dir, const char *name, int p, int R, int m, int steps, const char *sched)
{
    char json[2048], file[64];
    snprintf(json, sizeof json,
             "{\"model\": {\"preset\": \"gpt\", \"vocab\": 32, \"context\": 8, \"layers\": 6, \"heads\": 2, "
             "\"embed\": 16}, \"data\": {\"source\": \"synthetic\", \"seed\": 5}, \"train\": {\"steps\": %d, "
             "\"micro_batch\": 2, \"optimizer\": {\"lr\": 0.01, \"eps\": 1e-6}, \"grad_clip\": 0.5, "
             "\"eval_batches\": 1, \"timeout_s\": 30, \"checkpoint\": {\"dir\": \"ckpt-%s\", \"every\": 2, "
             "\"keep\": 2}}, \"parallel\": {\"stages\": %d, \"replicas\": %d, \"micro_batches\": %d, "
             "\"schedule\": \"%s\"}, \"cluster\": {" CPU_BACKEND "}, \"output\": {\"metrics\": \"%s.jsonl\", "
             "\"weights\": \"%s.safetensors\"}}",
             steps, name, p, R, m, sched, name, name);
    snprintf(file, sizeof file, "%s.json", name);
    return cdp_test_write_file(dir, file, json);
}

/* The zero-bubble schedules across a resume: zbv 2 x 2 -> zb-h1 4 x 1 ->
 * zb-h2 2 x 1 (tied embeddings within rank 0, then between ranks), against
 * an uninterrupted 1f1b run; and a zbv run killed mid-step resumes bitwise. */
Test(resume, zero_bubble_schedules_resume, .timeout = 180)
{
    need_mpi();
    char *dir = newdir();
    run_ok((const char *[]){"-q", "--plan", plan_sched(dir, "base", 2, 2, 2, 6, "1f1b"), NULL});
    run_ok((const char *[]){"-q", "--plan", plan_sched(dir, "x", 2, 2, 2, 2, "zbv"), NULL});
    char ck[4200];
    snprintf(ck, sizeof ck, "%s/ckpt-x", dir);
    run_ok((const char *[]){"-q", "--plan", plan_sched(dir, "x", 4, 1, 4, 4, "zb-h1"), "--resume", ck, NULL});
    run_ok((const char *[]){"-q", "--plan", plan_sched(dir, "x", 2, 1, 4, 6, "zb-h2"), "--resume", ck, NULL});
    double a[16], b[16];
    cr_assert_eq(losses(dir, "base", a), 6);
    cr_assert_eq(losses(dir, "x", b), 6);
    for (int i = 0; i < 6; i++)
        cr_assert_leq(fabs(a[i] - b[i]), 1e-5 * fabs(a[i]), "step %d: %.9g vs %.9g", i + 1, b[i], a[i]);
    double e = weights_error(dir, "base", "x");
    cr_assert_leq(e, 1e-5, "weights differ by %.3g", e);
    cr_log_info("1f1b against zbv 2x2 -> zb-h1 4x1 -> zb-h2 2x1: worst weight error %.3g", e);

    const char *v = plan_sched(dir, "v", 2, 2, 2, 6, "zbv");
    run_ok((const char *[]){"-q", "--plan", v, NULL});
    const char *crash = plan_sched(dir, "vcrash", 2, 2, 2, 6, "zbv");
    struct cdp_run r = run((const char *[]){"-q", "--plan", crash, NULL}, "kill:1:5");
    cr_assert_neq(r.exit_code, 0, "the kill did not stop the run");
    cdp_test_run_free(&r);
    run_ok((const char *[]){"-q", "--plan", crash, "--resume", NULL});
    cr_assert_eq(losses(dir, "v", a), 6);
    cr_assert_eq(losses(dir, "vcrash", b), 6);
    for (int i = 0; i < 6; i++) cr_assert_eq(a[i], b[i], "step %d: %.9g vs %.9g", i + 1, b[i], a[i]);
    cr_assert_eq(weights_error(dir, "v", "vcrash"), 0.0, "bitwise under the same plan");
}

/* data.order "sequential": a resumed run reads on from the checkpoint's
 * samples_seen, so it sees the uninterrupted run's batches (the 33 windows of
 * the text wrap at step 5, after the resume at step 3). */
static const char *plan_text(const char *dir, const char *name, const char *order, int steps)
{
    char json[2048], file[64];
    snprintf(json, sizeof json,
             "{\"model\": {\"preset\": \"gpt\", \"vocab\": 256, \"context\": 8, \"layers\": 2, \"heads\": 2, "
             "\"embed\": 16}, \"data\": {\"source\": \"text\", \"path\": \"corpus.txt\", \"order\": \"%s\"}, "
             "\"train\": {\"steps\": %d, \"micro_batch\": 2, \"optimizer\": {\"lr\": 0.01}, \"grad_clip\": 0.5, "
             "\"eval_batches\": 1, \"checkpoint\": {\"dir\": \"ckpt-%s\", \"every\": 2, \"keep\": 2}}, "
             "\"parallel\": {\"stages\": 1, \"replicas\": 1, \"micro_batches\": 4}, \"cluster\": {" CPU_BACKEND
             "}, \"output\": {\"metrics\": \"%s.jsonl\", \"weights\": \"%s.safetensors\"}}",
             order, steps, name, name, name);
    snprintf(file, sizeof file, "%s.json", name);
    return cdp_test_write_file(dir, file, json);
}

Test(resume, sequential_data_resumes_bitwise, .timeout = 120)
{
    char *dir = newdir();
    char text[301];
    uint64_t z = 99;
    for (int i = 0; i < 300; i++) {
        z = z * 6364136223846793005ull + 1442695040888963407ull;
        text[i] = (char)('a' + (z >> 59)); /* 32 letters from 'a' */
    }
    text[300] = 0;
    cdp_test_write_file(dir, "corpus.txt", text);
    run_ok((const char *[]){"-q", "--plan", plan_text(dir, "base", "sequential", 6), NULL});
    run_ok((const char *[]){"-q", "--plan", plan_text(dir, "x", "sequential", 3), NULL});
    struct cdp_run r = run((const char *[]){"--plan", plan_text(dir, "x", "sequential", 6), "--resume", NULL}, NULL);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.out, "at step 3"), "%s", r.out);
    cdp_test_run_free(&r);
    run_ok((const char *[]){"-q", "--plan", plan_text(dir, "shuf", "shuffle", 6), NULL});
    double a[16], b[16], c[16];
    cr_assert_eq(losses(dir, "base", a), 6);
    cr_assert_eq(losses(dir, "x", b), 6);
    cr_assert_eq(losses(dir, "shuf", c), 6);
    for (int i = 0; i < 6; i++) cr_assert_eq(a[i], b[i], "step %d: %.9g vs %.9g", i + 1, b[i], a[i]);
    cr_assert_eq(weights_error(dir, "base", "x"), 0.0, "bitwise under the same plan");
    cr_assert_neq(a[1], c[1], "the order changes the batches: step 2 loss %.9g under both", a[1]);
}

/* Sharded token data (docs/data.md): a glob of three files in three formats
 * reads as the one file they cut, and a run on them resumes exactly, under the
 * same layout (bitwise) and under another (2 replicas, to the same weights). */
static const char *plan_shards(const char *dir, const char *name, const char *path, int R, int steps)
{
    char json[2048], file[64];
    snprintf(json, sizeof json,
             "{\"model\": {\"preset\": \"gpt\", \"vocab\": 300, \"context\": 8, \"layers\": 2, \"heads\": 2, "
             "\"embed\": 16}, \"data\": {\"source\": \"tokens\", \"path\": %s, \"val_path\": \"val.npy\"}, "
             "\"train\": {\"steps\": %d, \"micro_batch\": 2, \"optimizer\": {\"lr\": 0.01, \"eps\": 1e-6}, "
             "\"grad_clip\": 0.5, \"eval_batches\": 1, \"checkpoint\": {\"dir\": \"ckpt-%s\", \"every\": 3, \"keep\": 2}}, "
             "\"parallel\": {\"stages\": 1, \"replicas\": %d, \"micro_batches\": %d}, \"cluster\": {" CPU_BACKEND
             "}, \"output\": {\"metrics\": \"%s.jsonl\", \"weights\": \"%s.safetensors\"}}",
             path, steps, name, R, 4 / R, name, name);
    snprintf(file, sizeof file, "%s.json", name);
    return cdp_test_write_file(dir, file, json);
}

static void write_file_bytes(const char *dir, const char *name, const void *head, size_t nh, const void *body,
                             size_t nb)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    cr_assert_eq(fwrite(head, 1, nh, f), nh);
    cr_assert_eq(fwrite(body, 1, nb, f), nb);
    fclose(f);
}

static void write_llmc(const char *dir, const char *name, int magic, int version, const void *toks, int n, int width)
{
    int32_t hdr[256] = {magic, version, n};
    write_file_bytes(dir, name, hdr, sizeof hdr, toks, (size_t)n * (size_t)width);
}

static void write_npy16(const char *dir, const char *name, const uint16_t *toks, int n)
{
    char h[128];
    int len = snprintf(h, sizeof h, "\x93NUMPY\x01%c%c%c{'descr': '<u2', 'fortran_order': False, 'shape': (%d,), }",
                       0, 0, 0, n);
    while ((len + 1) % 64) h[len++] = ' ';
    h[len++] = '\n';
    h[8] = (char)((len - 10) & 0xff), h[9] = (char)((len - 10) >> 8);
    write_file_bytes(dir, name, h, (size_t)len, toks, 2 * (size_t)n);
}

Test(resume, sharded_tokens_read_as_one_file_and_resume, .timeout = 120)
{
    char *dir = newdir();
    enum { N = 900, V = 200 };
    uint16_t t16[N], v16[V];
    uint32_t t32[N];
    uint64_t z = 7;
    for (int i = 0; i < N; i++) {
        z = z * 6364136223846793005ull + 1442695040888963407ull;
        t16[i] = (uint16_t)((z >> 33) % 300), t32[i] = t16[i];
    }
    for (int i = 0; i < V; i++) v16[i] = t16[(i * 37) % N];
    write_llmc(dir, "whole.bin", 20240520, 1, t16, N, 2);
    write_llmc(dir, "tok_000.bin", 20240520, 1, t16, 250, 2);
    write_npy16(dir, "tok_001.npy", t16 + 250, 333);
    write_llmc(dir, "tok_002.bin", 20240801, 7, t32 + 583, N - 583, 4);
    write_npy16(dir, "val.npy", v16, V);
    run_ok((const char *[]){"-q", "--plan", plan_shards(dir, "base", "\"whole.bin\"", 1, 6), NULL});
    run_ok((const char *[]){"-q", "--plan", plan_shards(dir, "glob", "\"tok_*\"", 1, 6), NULL});
    double a[16], b[16];
    cr_assert_eq(losses(dir, "base", a), 6);
    cr_assert_eq(losses(dir, "glob", b), 6);
    for (int i = 0; i < 6; i++) cr_assert_eq(a[i], b[i], "step %d: %.17g vs %.17g", i + 1, b[i], a[i]);
    cr_assert_eq(weights_error(dir, "base", "glob"), 0.0, "the shards are the file they cut");

    const char *list = "[\"tok_000.bin\", \"tok_001.npy\", \"tok_002.bin\"]";
    run_ok((const char *[]){"-q", "--plan", plan_shards(dir, "x", list, 1, 3), NULL});
    run_ok((const char *[]){"-q", "--plan", plan_shards(dir, "x", list, 1, 6), "--resume", NULL});
    cr_assert_eq(losses(dir, "x", b), 6);
    for (int i = 0; i < 6; i++) cr_assert_eq(a[i], b[i], "step %d: %.17g vs %.17g", i + 1, b[i], a[i]);
    cr_assert_eq(weights_error(dir, "base", "x"), 0.0, "resumed bitwise");

    need_mpi();
    run_ok((const char *[]){"-q", "--plan", plan_shards(dir, "y", list, 1, 3), NULL});
    run_ok((const char *[]){"-q", "--plan", plan_shards(dir, "y", list, 2, 6), "--resume", NULL});
    cr_assert_eq(losses(dir, "y", b), 6);
    for (int i = 0; i < 6; i++)
        cr_assert_leq(fabs(a[i] - b[i]), 1e-5 * fabs(a[i]), "step %d: %.9g vs %.9g", i + 1, b[i], a[i]);
    double e = weights_error(dir, "base", "y");
    cr_assert_leq(e, 1e-5, "weights differ by %.3g", e);
    cr_log_info("shards, 1 x 1 -> 1 x 2: worst weight error %.3g", e);
}

Test(resume, a_corrupt_checkpoint_is_named_and_left_alone, .timeout = 120)
{
    char *dir = newdir();
    const char *p = plan(dir, "c", 1, 1, 4, 2);
    run_ok((const char *[]){"-q", "--plan", p, NULL});
    char part[4300];
    snprintf(part, sizeof part, "%s/ckpt-c/step-00000002/stage-0.safetensors", dir);
    FILE *f = fopen(part, "r+b");
    cr_assert_not_null(f, "%s", part);
    fseek(f, -5, SEEK_END);
    fputc(0x5a, f);
    fclose(f);
    char *before = cdp_test_read_file(part);
    const char *more = plan(dir, "c", 1, 1, 4, 4);
    struct cdp_run r = run((const char *[]){"--plan", more, "--resume", NULL}, NULL);
    cr_assert_eq(r.exit_code, 2, "%s", r.err);
    cr_assert(strstr(r.err, "stage-0.safetensors") && strstr(r.err, "checksum"), "%s", r.err);
    char *after = cdp_test_read_file(part);
    cr_assert(before && after && !memcmp(before, after, 100), "the checkpoint was changed");
    free(before);
    free(after);
    cdp_test_run_free(&r);
}

Test(resume, resume_needs_a_folder)
{
    char *dir = newdir();
    const char *p =
        cdp_test_write_file(dir, "p.json", "{\"model\": {\"preset\": \"gpt\"}, \"cluster\": {\"backend\": \"cpu\"}}");
    struct cdp_run r = run((const char *[]){"--plan", p, "--resume", NULL}, NULL);
    cr_assert_eq(r.exit_code, 2, "%s", r.err);
    cr_assert(strstr(r.err, "/train/checkpoint/dir"), "%s", r.err);
    cdp_test_run_free(&r);
}

/* Checkpoints of the cuda backend, on the stand-in CUDA module of
 * tests/fake-cuda (host memory run by the CPU kernels, which the core treats
 * as device memory the host cannot address: weights and optimizer state are
 * staged through host copies both ways). A run killed part way resumes from
 * its checkpoint and ends bitwise where an uninterrupted cpu-backend run of the
 * same plan does; the parts it writes are byte for byte the cpu run's (but for
 * the id of the run that wrote each, in their metadata). */
static void files_equal(const char *a, const char *b)
{
    const long at = cdp_test_parts_differ(a, b);
    cr_assert_eq(at, -1, "%s and %s differ at byte %ld (or one is missing or empty)", a, b, at);
}

static void gpu_crash_and_resume(int p, int R, int m, const char *fault, int resumed_from)
{
    const char *fake = getenv("CDP_FAKE_CUDA_DIR");
    cr_assert_not_null(fake, "CDP_FAKE_CUDA_DIR is not set (run the tests through meson test)");
    if (p * R > 1) need_mpi();
    char *dir = newdir();
    run_ok((const char *[]){"-q", "--plan", plan(dir, "base", p, R, m, 6), NULL});
    const char *gpu = plan_on(dir, "gpu", CUDA_BACKEND, p, R, m, 6);
    setenv("CDP_MODULE_DIR", fake, 1);
    struct cdp_run r = run((const char *[]){"-q", "--plan", gpu, NULL}, fault);
    cr_assert_neq(r.exit_code, 0, "the fault %s did not stop the run", fault);
    cdp_test_run_free(&r);
    r = run((const char *[]){"--plan", gpu, "--resume", NULL}, NULL);
    unsetenv("CDP_MODULE_DIR");
    cr_assert_eq(r.exit_code, 0, "resume after %s: %s", fault, r.err);
    char want[64];
    snprintf(want, sizeof want, "at step %d", resumed_from);
    cr_assert(strstr(r.out, want), "after %s, expected to resume %s: %s", fault, want, r.out);
    cr_assert(strstr(r.out, "| gpu "), "the run is on the cuda backend: %s", r.out);
    cdp_test_run_free(&r);
    double a[16], b[16];
    cr_assert_eq(losses(dir, "base", a), 6);
    cr_assert_eq(losses(dir, "gpu", b), 6);
    for (int i = 0; i < 6; i++) cr_assert_eq(a[i], b[i], "step %d: %.9g on cuda, %.9g on cpu", i + 1, b[i], a[i]);
    cr_assert_eq(weights_error(dir, "base", "gpu"), 0.0, "bitwise, cuda against cpu");
    /* the last checkpoint (written after the resume, from device memory) */
    for (int s = 0; s < p; s++) {
        char ca[4300], cb[4300];
        snprintf(ca, sizeof ca, "%s/ckpt-base/step-00000006/stage-%d.safetensors", dir, s);
        snprintf(cb, sizeof cb, "%s/ckpt-gpu/step-00000006/stage-%d.safetensors", dir, s);
        files_equal(ca, cb);
    }
}

Test(resume, cuda_one_rank_killed_resumes_bitwise_to_the_cpu_run, .timeout = 120)
{
    gpu_crash_and_resume(1, 1, 4, "kill:0:5", 4);
}

Test(resume, cuda_2x2_killed_rank_resumes_bitwise_to_the_cpu_run, .timeout = 120)
{
    gpu_crash_and_resume(2, 2, 2, "kill:1:5", 4);
}

Test(resume, cuda_2x2_killed_before_the_manifest_resumes_bitwise_to_the_cpu_run, .timeout = 120)
{
    CDP_TEST_SKIP_WHEN_SAMPLED("cuda_2x2_killed_rank_resumes_bitwise_to_the_cpu_run and killed_before_the_manifest");
    gpu_crash_and_resume(2, 2, 2, "killsave:0:4:commit", 2);
}

/* A learning-rate schedule is a function of the step: a run killed in its
 * decay resumes on the same rates (metrics.jsonl's lr, step by step) and ends
 * on the uninterrupted run's weights, bitwise. */
static const char *plan_lr(const char *dir, const char *name)
{
    char json[2048], file[64];
    snprintf(json, sizeof json,
             "{\"model\": {\"preset\": \"gpt\", \"vocab\": 32, \"context\": 8, \"layers\": 2, \"heads\": 2, "
             "\"embed\": 16}, \"data\": {\"source\": \"synthetic\", \"seed\": 5}, \"train\": {\"steps\": 6, "
             "\"micro_batch\": 2, \"optimizer\": {\"lr\": 0.01, \"weight_decay\": 0.1}, \"lr_schedule\": "
             "{\"type\": \"cosine\", \"warmup_steps\": 2, \"min_lr\": 0.001}, \"eval_batches\": 1, "
             "\"checkpoint\": {\"dir\": \"ckpt-%s\", \"every\": 2, \"keep\": 2}}, \"parallel\": {\"stages\": 1, "
             "\"replicas\": 1, \"micro_batches\": 2}, \"cluster\": {" CPU_BACKEND "}, \"output\": {\"metrics\": "
             "\"%s.jsonl\", \"weights\": \"%s.safetensors\", \"tensorboard\": \"tb-%s\"}}",
             name, name, name, name);
    snprintf(file, sizeof file, "%s.json", name);
    return cdp_test_write_file(dir, file, json);
}

static void lrs(const char *dir, const char *name, double *out, int n)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s.jsonl", dir, name);
    char *t = cdp_test_read_file(path);
    cr_assert_not_null(t, "%s", path);
    int seen = 0;
    for (char *line = strtok(t, "\n"); line; line = strtok(NULL, "\n")) {
        json_error_t e;
        json_t *o = json_loads(line, 0, &e);
        cr_assert_not_null(o, "%s: %s", path, line);
        const json_t *st = json_object_get(o, "step"), *lr = json_object_get(o, "lr");
        if (json_is_integer(st)) {
            const int s = (int)json_integer_value(st);
            cr_assert(s >= 1 && s <= n && json_is_real(lr), "%s: %s", path, line);
            out[s - 1] = json_real_value(lr);
            seen++;
        }
        json_decref(o);
    }
    cr_assert_eq(seen, n, "%s: %d step records", path, seen);
    free(t);
}

Test(resume, lr_schedule_resumes_bitwise, .timeout = 120)
{
    char *dir = newdir();
    run_ok((const char *[]){"-q", "--plan", plan_lr(dir, "base"), NULL});
    const char *crash = plan_lr(dir, "crash");
    struct cdp_run r = run((const char *[]){"-q", "--plan", crash, NULL}, "kill:0:5");
    cr_assert_neq(r.exit_code, 0, "the fault did not stop the run");
    cdp_test_run_free(&r);
    r = run((const char *[]){"--plan", crash, "--resume", NULL}, NULL);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.out, "at step 4"), "%s", r.out);
    cdp_test_run_free(&r);
    double a[6], b[6];
    lrs(dir, "base", a, 6);
    lrs(dir, "crash", b, 6);
    const double want[6] = {0.005, 0.01, 0.001 + 0.0045 * (1 + cos(M_PI / 4)), 0.0055,
                            0.001 + 0.0045 * (1 + cos(3 * M_PI / 4)), 0.001};
    for (int i = 0; i < 6; i++) {
        cr_assert_float_eq(a[i], want[i], 1e-15, "step %d: lr %.17g, expected %.17g", i + 1, a[i], want[i]);
        cr_assert_eq(a[i], b[i], "step %d: lr %.17g after the resume, %.17g uninterrupted", i + 1, b[i], a[i]);
    }
    double la[16], lb[16];
    cr_assert_eq(losses(dir, "base", la), 6);
    cr_assert_eq(losses(dir, "crash", lb), 6);
    for (int i = 0; i < 6; i++) cr_assert_eq(la[i], lb[i], "step %d: %.9g vs %.9g", i + 1, lb[i], la[i]);
    cr_assert_eq(weights_error(dir, "base", "crash"), 0.0, "bitwise under the same plan");
}

/* ---- TensorBoard event files, read back record by record -------------------------- */

/* What one event file holds: its scalars and its session starts. */
struct tb_read {
    int n, starts, start_step, versions;
    int64_t step[256];
    char tag[256][32];
    float value[256];
};

static uint64_t rd_varint(const unsigned char **p, const unsigned char *end)
{
    uint64_t v = 0;
    for (int sh = 0; *p < end && sh < 64; sh += 7) {
        const unsigned char b = *(*p)++;
        v |= (uint64_t)(b & 0x7F) << sh;
        if (!(b & 0x80)) return v;
    }
    cr_assert_fail("a varint runs past its message");
    return 0;
}

static uint32_t rd_le32(const unsigned char *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }

/* A Summary's Values: tag = 1, simple_value = 2 */
static void tb_summary(struct tb_read *r, int64_t step, const unsigned char *p, const unsigned char *end)
{
    while (p < end) {
        const uint64_t key = rd_varint(&p, end), len = rd_varint(&p, end);
        cr_assert_eq(key, (1 << 3) | 2, "Summary field %llu", (unsigned long long)key);
        const unsigned char *v = p, *ve = p + len;
        cr_assert_lt(r->n, 256);
        while (v < ve) {
            const uint64_t k = rd_varint(&v, ve);
            if (k == ((1 << 3) | 2)) {
                const uint64_t n = rd_varint(&v, ve);
                cr_assert_lt(n, sizeof r->tag[0]);
                memcpy(r->tag[r->n], v, n);
                r->tag[r->n][n] = 0;
                v += n;
            } else {
                cr_assert_eq(k, (2 << 3) | 5, "Value field %llu", (unsigned long long)k);
                uint32_t u = rd_le32(v);
                memcpy(&r->value[r->n], &u, 4);
                v += 4;
            }
        }
        r->step[r->n++] = step;
        p = ve;
    }
}

/* Every record's two masked CRC-32Cs checked, every Event decoded. */
static void tb_read_file(const char *path, struct tb_read *r)
{
    memset(r, 0, sizeof *r);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    unsigned char *buf = malloc(1 << 20);
    const size_t len = fread(buf, 1, 1 << 20, f);
    fclose(f);
    for (size_t at = 0; at < len;) {
        cr_assert_leq(at + 12, len, "%s: a record cut at byte %zu", path, at);
        uint64_t n = 0;
        for (int i = 0; i < 8; i++) n |= (uint64_t)buf[at + i] << (8 * i);
        cr_assert_eq(rd_le32(buf + at + 8), cdp_tb_masked_crc(cdp_crc32c(buf + at, 8)), "%s: length CRC at %zu", path,
                     at);
        cr_assert_leq(at + 12 + n + 4, len, "%s: a record cut at byte %zu", path, at);
        const unsigned char *p = buf + at + 12, *end = p + n;
        cr_assert_eq(rd_le32(end), cdp_tb_masked_crc(cdp_crc32c(p, n)), "%s: data CRC at %zu", path, at);
        int64_t step = 0;
        while (p < end) {
            const uint64_t key = rd_varint(&p, end);
            switch (key) {
            case (1 << 3) | 1: p += 8; break; /* wall_time */
            case (2 << 3) | 0: step = (int64_t)rd_varint(&p, end); break;
            case (3 << 3) | 2: {
                const uint64_t m = rd_varint(&p, end);
                cr_assert(m == 13 && !memcmp(p, "brain.Event:2", 13), "%s: file_version", path);
                r->versions++;
                p += m;
                break;
            }
            case (5 << 3) | 2: {
                const uint64_t m = rd_varint(&p, end);
                tb_summary(r, step, p, p + m);
                p += m;
                break;
            }
            case (7 << 3) | 2: {
                const uint64_t m = rd_varint(&p, end);
                cr_assert(m == 2 && p[0] == 0x08 && p[1] == 0x01, "%s: a SessionLog other than START", path);
                r->starts++;
                r->start_step = (int)step;
                p += m;
                break;
            }
            default: cr_assert_fail("%s: Event field key %llu", path, (unsigned long long)key);
            }
        }
        at += 12 + n + 4;
    }
    free(buf);
}

/* The event files of dir, oldest first (by name: the start time, then the pid). */
static int tb_files(const char *dir, char names[4][512])
{
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "%s", dir);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (strstr(de->d_name, "events.out.tfevents.")) {
            cr_assert_lt(n, 4);
            snprintf(names[n++], 512, "%s/%s", dir, de->d_name);
        }
    closedir(d);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && strcmp(names[j], names[j - 1]) < 0; j--) {
            char t[512];
            memcpy(t, names[j], 512);
            memcpy(names[j], names[j - 1], 512);
            memcpy(names[j - 1], t, 512);
        }
    return n;
}

static float tb_value(const struct tb_read *r, int64_t step, const char *tag)
{
    for (int i = 0; i < r->n; i++)
        if (r->step[i] == step && !strcmp(r->tag[i], tag)) return r->value[i];
    cr_assert_fail("no %s at step %lld", tag, (long long)step);
    return 0;
}

Test(resume, crc32c_is_castagnolis)
{
    cr_assert_eq(cdp_crc32c("123456789", 9), 0xE3069283u); /* the check value of CRC-32C */
    cr_assert_eq(cdp_crc32c("", 0), 0u);
    unsigned char zeros[32] = {0};
    cr_assert_eq(cdp_crc32c(zeros, 32), 0x8A9136AAu); /* RFC 3720 B.4 */
}

/* The event files of the run above: the uninterrupted run's holds every
 * step's scalars, equal (as float) to metrics.jsonl's; the resumed run's
 * second file starts a session at step 5, where TensorBoard drops the
 * first file's later steps. */
Test(resume, tensorboard_files_hold_every_step_and_mark_the_resume, .timeout = 120)
{
    char *dir = newdir();
    run_ok((const char *[]){"-q", "--plan", plan_lr(dir, "base"), NULL});
    const char *crash = plan_lr(dir, "crash");
    struct cdp_run r = run((const char *[]){"-q", "--plan", crash, NULL}, "kill:0:5");
    cr_assert_neq(r.exit_code, 0);
    cdp_test_run_free(&r);
    run_ok((const char *[]){"-q", "--plan", crash, "--resume", NULL});
    char names[4][512], tbdir[4200];
    snprintf(tbdir, sizeof tbdir, "%s/tb-base", dir);
    cr_assert_eq(tb_files(tbdir, names), 1);
    static struct tb_read a, b0, b1;
    tb_read_file(names[0], &a);
    cr_assert_eq(a.versions, 1);
    cr_assert_eq(a.starts, 0);
    double lr[6];
    lrs(dir, "base", lr, 6);
    char path[4200];
    snprintf(path, sizeof path, "%s/base.jsonl", dir);
    char *text = cdp_test_read_file(path);
    int records = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        json_error_t e;
        json_t *o = json_loads(line, 0, &e);
        const json_t *st = json_object_get(o, "step");
        if (json_is_integer(st)) {
            const char *key;
            json_t *v;
            json_object_foreach(o, key, v) {
                if (!strcmp(key, "step") || !json_is_number(v)) continue;
                const float want = (float)json_number_value(v);
                cr_assert_eq(tb_value(&a, json_integer_value(st), key), want, "step %lld %s",
                             (long long)json_integer_value(st), key);
                records++;
            }
        }
        json_decref(o);
    }
    free(text);
    cr_assert_eq(records, a.n, "%d scalars in the event file, %d numbers in metrics.jsonl", a.n, records);
    for (int s = 1; s <= 6; s++) cr_assert_eq(tb_value(&a, s, "lr"), (float)lr[s - 1]);
    snprintf(tbdir, sizeof tbdir, "%s/tb-crash", dir);
    cr_assert_eq(tb_files(tbdir, names), 2, "one file per run");
    tb_read_file(names[0], &b0);
    tb_read_file(names[1], &b1);
    cr_assert_eq(b0.starts, 0);
    cr_assert_eq(b1.starts, 1);
    cr_assert_eq(b1.start_step, 5, "the resume after step 4 starts at 5");
    for (int i = 0; i < b1.n; i++) cr_assert_geq(b1.step[i], 5);
    for (int s = 5; s <= 6; s++)
        cr_assert_eq(tb_value(&b1, s, "loss"), tb_value(&a, s, "loss"), "step %d: the resumed loss", s);
}
