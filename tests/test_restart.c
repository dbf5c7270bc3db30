/* Suite restart: /train/restart. A launched job whose rank dies or hangs is
 * ended, re-planned on the devices left (or on the same layout) and resumed
 * from its last checkpoint by the launcher, with no one there; it ends with
 * the weights of a run resumed by hand under the same new layout, bitwise, and
 * a loss curve with every step once. A fault at every attempt stops. Runs the
 * real binary under mpirun, with the CDP_FAULT knob (docs/pipeline.md). */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "comm/comm.h"
#include "harness.h"

static void need_mpi(void)
{
    if (!cdp_comm_have_mpi()) cr_skip_test("this build has no MPI (-Dmpi=disabled): multi-rank runs are not possible");
}

/* A GPT of 6 blocks, 6 steps of 8 samples (micro-batches of 2) on 2 stages x 2
 * replicas, checkpoints every 2 steps; restart: the /train/restart value. */
static const char *plan_data(const char *dir, const char *name, const char *restart, int timeout_s, const char *data)
{
    char json[2048], file[64];
    snprintf(json, sizeof json,
             "{\"model\": {\"preset\": \"gpt\", \"vocab\": 32, \"context\": 8, \"layers\": 6, \"heads\": 2, "
             "\"embed\": 16}, \"data\": %s, \"train\": {\"steps\": 6, "
             "\"micro_batch\": 2, \"log_every\": 1, \"optimizer\": {\"lr\": 0.01, \"eps\": 1e-6}, \"grad_clip\": 0.5, "
             "\"eval_batches\": 1, \"timeout_s\": %d, \"checkpoint\": {\"dir\": \"ckpt-%s\", \"every\": 2, "
             "\"keep\": 3}, \"restart\": %s}, \"parallel\": {\"stages\": 2, \"replicas\": 2, \"micro_batches\": 2}, "
             "\"cluster\": {\"backend\": \"cpu\"}, \"output\": {\"metrics\": \"%s.jsonl\", \"weights\": "
             "\"%s.safetensors\"}}",
             data, timeout_s, name, restart, name, name);
    snprintf(file, sizeof file, "%s.json", name);
    return cdp_test_write_file(dir, file, json);
}

static const char *plan(const char *dir, const char *name, const char *restart, int timeout_s)
{
    return plan_data(dir, name, restart, timeout_s, "{\"source\": \"synthetic\", \"seed\": 5}");
}

static struct cdp_run run(const char *const *argv, const char *fault)
{
    struct cdp_run r;
    if (fault) setenv("CDP_FAULT", fault, 1);
    cr_assert_eq(cdp_test_run(&r, argv), 0);
    unsetenv("CDP_FAULT");
    return r;
}

static json_t *load(const char *path)
{
    json_error_t e;
    json_t *j = json_load_file(path, 0, &e);
    cr_assert_not_null(j, "%s: %s", path, e.text);
    return j;
}

/* The records of name.jsonl: step records 1..n, each once, in order; returns
 * the restart records (a new array) and the losses in loss[0..n-1]. */
static json_t *records(const char *dir, const char *name, int n, double *loss)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s.jsonl", dir, name);
    char *t = cdp_test_read_file(path);
    cr_assert_not_null(t, "%s", path);
    cr_assert(*t && t[strlen(t) - 1] == '\n', "%s ends inside a line", path);
    json_t *restarts = json_array();
    int next = 1;
    for (char *line = strtok(t, "\n"); line; line = strtok(NULL, "\n")) {
        json_error_t e;
        json_t *o = json_loads(line, 0, &e);
        cr_assert_not_null(o, "%s: not JSON: %s", path, line);
        const json_t *st = json_object_get(o, "step");
        if (json_is_integer(st)) {
            cr_assert_eq(json_integer_value(st), next, "%s: step %lld where %d was next", path,
                         (long long)json_integer_value(st), next);
            loss[next - 1] = json_real_value(json_object_get(o, "loss"));
            next++;
        }
        if (json_object_get(o, "restart")) json_array_append(restarts, o);
        json_decref(o);
    }
    cr_assert_eq(next, n + 1, "%s: %d steps recorded, expected %d", path, next - 1, n);
    free(t);
    return restarts;
}

static void files_equal(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    cr_assert(fa && fb);
    fseek(fa, 0, SEEK_END);
    fseek(fb, 0, SEEK_END);
    const long na = ftell(fa), nb = ftell(fb);
    fclose(fa);
    fclose(fb);
    cr_assert(na > 0 && na == nb, "%s: %ld bytes, %s: %ld", a, na, b, nb);
    fa = fopen(a, "rb");
    fb = fopen(b, "rb");
    for (long i = 0; i < na; i++) cr_assert_eq(fgetc(fa), fgetc(fb), "%s and %s differ at byte %ld", a, b, i);
    fclose(fa);
    fclose(fb);
}

/* 1 when the array (or an array in it) holds the integer v. */
static int holds(const json_t *a, json_int_t v)
{
    size_t i;
    const json_t *x;
    json_array_foreach(a, i, x) if ((json_is_array(x) && holds(x, v)) || (json_is_integer(x) && json_integer_value(x) == v)) return 1;
    return 0;
}

/* Integers in the array and its arrays. */
static int count(const json_t *a)
{
    size_t i;
    const json_t *x;
    int n = 0;
    json_array_foreach(a, i, x) n += json_is_array(x) ? count(x) : 1;
    return n;
}

/* A fault of the first attempt only (fault names it with @0) at step 6 on the
 * rank `failed`: the job re-plans on the 3 devices left, resumes from step 4
 * and ends with exit 0; against a run with the same fault and no restart,
 * resumed by hand from its step-4 checkpoint under the restart's planned.json:
 * the same losses and the same weights file, byte for byte. */
static void restarts_like_a_resume_by_hand(const char *fault, const char *fault_alone, int failed, const char *said,
                                           int timeout_s)
{
    need_mpi();
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    const char *a = plan(dir, "a", "{\"max\": 2, \"exclude_failed\": true}", timeout_s);
    struct cdp_run r = run((const char *[]){"--plan", a, NULL}, fault);
    cr_assert_eq(r.exit_code, 0, "exit %d: %s", r.exit_code, r.err);
    char want[200];
    snprintf(want, sizeof want, "restart 1: rank %d (", failed);
    cr_assert(strstr(r.out, want) && strstr(r.out, said), "%s", r.out);
    cr_assert(strstr(r.out, "at step 6; resuming from step 4 (1 step lost)"), "%s", r.out);
    cr_assert(!strstr(r.out, "restart 2:"), "%s", r.out);
    cr_log_info("%s", strstr(r.out, "restart 1:"));
    cdp_test_run_free(&r);
    /* the new planned.json: the same global batch on 3 devices, none the failed rank's */
    char planned[4200];
    snprintf(planned, sizeof planned, "%s/planned.json", dir);
    json_t *p = load(planned);
    json_t *train = json_object_get(p, "train"), *par = json_object_get(p, "parallel");
    cr_assert_eq(json_integer_value(json_object_get(train, "global_batch")), 8);
    const json_t *place = json_object_get(par, "placement");
    cr_assert(json_is_array(place), "the placement is written out");
    const int ranks = (int)(json_integer_value(json_object_get(par, "stages")) *
                            json_integer_value(json_object_get(par, "replicas")));
    cr_assert(ranks >= 1 && ranks <= 3 && count(place) == ranks, "%d ranks", ranks);
    cr_assert(!holds(place, failed), "device %d failed and is placed again", failed);
    /* the record */
    double la[6], lc[6];
    json_t *rec = records(dir, "a", 6, la);
    cr_assert_eq(json_array_size(rec), 1);
    const json_t *r1 = json_array_get(rec, 0), *f = json_object_get(r1, "failed");
    cr_assert(holds(json_object_get(f, "ranks"), failed) && json_array_size(json_object_get(f, "ranks")) == 1);
    cr_assert_eq(json_integer_value(json_object_get(r1, "resumed_from")), 4);
    cr_assert_eq(json_integer_value(json_object_get(r1, "fault_step")), 6);
    cr_assert_eq(json_integer_value(json_object_get(r1, "steps_lost")), 1);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(r1, "old_layout"), "replicas")), 2);
    cr_assert(!holds(json_object_get(json_object_get(r1, "new_layout"), "devices"), failed));
    json_decref(rec);
    /* by hand: the same fault without restarts, then --resume under the restart's layout */
    char sub[4200];
    snprintf(sub, sizeof sub, "%s/c", dir);
    cr_assert_eq(mkdir(sub, 0700), 0);
    const char *c = plan(sub, "c", "null", timeout_s);
    r = run((const char *[]){"-q", "--plan", c, NULL}, fault_alone);
    cr_assert_neq(r.exit_code, 0, "the fault %s did not stop the run", fault_alone);
    cdp_test_run_free(&r);
    char ck[4300], metrics[4300], weights[4300];
    snprintf(ck, sizeof ck, "%s/ckpt-c", sub);
    snprintf(metrics, sizeof metrics, "%s/c.jsonl", sub);
    snprintf(weights, sizeof weights, "%s/c.safetensors", sub);
    json_object_set_new(json_object_get(train, "checkpoint"), "dir", json_string(ck));
    json_object_set_new(train, "restart", json_null());
    json_object_set_new(json_object_get(p, "output"), "metrics", json_string(metrics));
    json_object_set_new(json_object_get(p, "output"), "weights", json_string(weights));
    char hand[4300];
    snprintf(hand, sizeof hand, "%s/by-hand.json", sub);
    cr_assert_eq(json_dump_file(p, hand, JSON_INDENT(2)), 0);
    json_decref(p);
    r = run((const char *[]){"--plan", hand, "--resume", ck, NULL}, NULL);
    cr_assert_eq(r.exit_code, 0, "resume by hand: %s", r.err);
    cr_assert(strstr(r.out, "at step 4"), "%s", r.out);
    cdp_test_run_free(&r);
    json_decref(records(sub, "c", 6, lc));
    for (int i = 0; i < 6; i++) cr_assert_eq(la[i], lc[i], "step %d: %.17g restarted, %.17g by hand", i + 1, la[i], lc[i]);
    char wa[4300];
    snprintf(wa, sizeof wa, "%s/a.safetensors", dir);
    files_equal(wa, weights);
}

Test(restart, a_killed_rank_is_replanned_around_and_resumed, .timeout = 240)
{
    restarts_like_a_resume_by_hand("kill:1:6@0", "kill:1:6", 1, "died", 30);
}

Test(restart, a_hung_rank_is_replanned_around_and_resumed, .timeout = 240)
{
    restarts_like_a_resume_by_hand("stall:2:6:60@0", "stall:2:6:60", 2, "hung past the deadline", 3);
}

Test(restart, a_device_error_is_replanned_around_and_resumed, .timeout = 240)
{
    restarts_like_a_resume_by_hand("deverr:3:6@0", "deverr:3:6", 3, "reported a device error", 30);
}

/* The same fault at every attempt, on the same layout: 2 restarts, then it stops
 * with exit 1 and says so; each restart is on stdout and in metrics.jsonl. */
Test(restart, a_fault_at_every_attempt_stops_after_max_restarts, .timeout = 240)
{
    need_mpi();
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    const char *b = plan(dir, "b", "{\"max\": 2, \"exclude_failed\": false}", 30);
    struct cdp_run r = run((const char *[]){"--plan", b, NULL}, "kill:1:6");
    cr_assert_eq(r.exit_code, 1, "exit %d: %s", r.exit_code, r.err);
    cr_assert(strstr(r.out, "restart 1: rank 1 (") && strstr(r.out, "restart 2: rank 1 ("), "%s", r.out);
    cr_assert(strstr(r.out, "on 2x2, the same layout"), "%s", r.out);
    cr_assert(!strstr(r.out, "restart 3:"), "%s", r.out);
    cr_assert(strstr(r.err, "stopping: the fault repeated at step 6 on 3 attempts in a row") &&
                  strstr(r.err, "/train/restart/max is 2"),
              "%s", r.err);
    cdp_test_run_free(&r);
    char path[4200];
    snprintf(path, sizeof path, "%s/b.jsonl", dir);
    char *t = cdp_test_read_file(path);
    cr_assert_not_null(t);
    int n = 0;
    for (char *c = strstr(t, "{\"restart\": "); c; c = strstr(c + 1, "{\"restart\": ")) n++;
    cr_assert_eq(n, 2, "%d restart records: %s", n, t);
    cr_assert(strstr(t, "\"same_layout\": true"), "%s", t);
    free(t);
}

/* A failure that is no death, hang or device error (a bad data file: bad
 * input, exit 2) would fail the same again: not restarted, and said so. */
Test(restart, a_bad_data_file_is_not_restarted, .timeout = 120)
{
    need_mpi();
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    cdp_test_write_file(dir, "bad.bin", "this is not an llm.c token file, it is too short and has no magic");
    const char *p = plan_data(dir, "d", "{\"max\": 2}", 30, "{\"source\": \"tokens\", \"path\": \"bad.bin\"}");
    struct cdp_run r = run((const char *[]){"--plan", p, NULL}, NULL);
    cr_assert_eq(r.exit_code, 2, "exit %d: %s", r.exit_code, r.err);
    cr_assert(strstr(r.err, "bad.bin") && strstr(r.err, "not restarting: bad input (exit code 2)"),
              "%s", r.err);
    cr_assert(!strstr(r.out, "restart 1:"), "%s", r.out);
    cdp_test_run_free(&r);
}

/* Without a restart, a fault for another attempt is not armed. */
Test(restart, a_fault_for_another_attempt_is_not_armed, .timeout = 120)
{
    need_mpi();
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    struct cdp_run r = run((const char *[]){"-q", "--plan", plan(dir, "n", "null", 30), NULL}, "kill:1:3@1");
    cr_assert_eq(r.exit_code, 0, "exit %d: %s", r.exit_code, r.err);
    cdp_test_run_free(&r);
}

/* The key: written back by --dry-run --json; bad values name the key. */
Test(restart, the_plan_key_is_checked_and_written_back)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    struct cdp_run r = run((const char *[]){"--dry-run", "--json", "--plan",
                                            plan(dir, "k", "{\"max\": 3, \"exclude_failed\": false}", 30), NULL},
                           NULL);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.out, "\"restart\": {\n      \"max\": 3,\n      \"exclude_failed\": false\n    }"), "%s", r.out);
    cdp_test_run_free(&r);
    r = run((const char *[]){"--dry-run", "--json", "--plan", plan(dir, "k", "null", 30), NULL}, NULL);
    cr_assert(r.exit_code == 0 && strstr(r.out, "\"restart\": null"), "%s", r.out);
    cdp_test_run_free(&r);
    r = run((const char *[]){"--dry-run", "--plan", plan(dir, "k", "{\"max\": 1}", 30), NULL}, NULL);
    cr_assert(r.exit_code == 0 && strstr(r.out, "up to 1 in a row at one step, re-planned without the failed"),
              "%s", r.out);
    cdp_test_run_free(&r);
    static const struct {
        const char *value, *said;
    } bad[] = {
        {"{\"max\": 0}", "/train/restart/max"},
        {"{\"max\": 101}", "/train/restart/max"},
        {"{\"max\": 2.0}", "/train/restart/max"},
        {"{\"exclude_failed\": true}", "/train/restart/max: missing"},
        {"{\"max\": 2, \"exclude_failed\": 1}", "/train/restart/exclude_failed"},
        {"{\"max\": 2, \"exclude\": true}", "did you mean \"exclude_failed\""},
        {"true", "/train/restart"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        r = run((const char *[]){"--dry-run", "--plan", plan(dir, "k", bad[i].value, 30), NULL}, NULL);
        cr_assert_eq(r.exit_code, 2, "%s: %s", bad[i].value, r.out);
        cr_assert(strstr(r.err, bad[i].said), "%s: %s", bad[i].value, r.err);
        cdp_test_run_free(&r);
    }
    /* a restart resumes from a checkpoint: it needs one */
    const char *nock = cdp_test_write_file(dir, "nock.json",
                                           "{\"model\": {\"preset\": \"gpt\"}, \"train\": {\"restart\": {\"max\": 1}}, "
                                           "\"cluster\": {\"backend\": \"cpu\"}}");
    r = run((const char *[]){"--dry-run", "--plan", nock, NULL}, NULL);
    cr_assert_eq(r.exit_code, 2, "%s", r.out);
    cr_assert(strstr(r.err, "/train/restart: needs /train/checkpoint"), "%s", r.err);
    cdp_test_run_free(&r);
}
