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
    const long at = cdp_test_files_differ(a, b);
    cr_assert_eq(at, -1, "%s and %s differ at byte %ld (or one is missing or empty)", a, b, at);
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

/* An MLP of split linears (or a GPT: gpt) on 2 stages of tensor groups of 2
 * (4 ranks on devices 0..3), checkpoints every 2 steps. */
static const char *split_plan(const char *dir, const char *name, const char *restart, int gpt)
{
    char json[2048], file[64];
    snprintf(json, sizeof json,
             "{\"model\": %s, \"data\": {\"source\": \"synthetic\", \"seed\": 5}, \"train\": {\"steps\": 6, "
             "\"micro_batch\": 2, \"global_batch\": 8, \"log_every\": 1, \"optimizer\": {\"type\": \"adamw\", "
             "\"lr\": 0.01}, \"eval_batches\": 1, \"timeout_s\": 30, \"checkpoint\": {\"dir\": \"ckpt-%s\", "
             "\"every\": 2, \"keep\": 3}, \"restart\": %s}, \"parallel\": {\"stages\": 2, \"tensor\": 2}, "
             "\"cluster\": {\"backend\": \"cpu\"}, \"output\": {\"metrics\": \"%s.jsonl\", \"weights\": "
             "\"%s.safetensors\"}}",
             gpt ? "{\"preset\": \"gpt\", \"vocab\": 32, \"context\": 8, \"layers\": 2, \"heads\": 4, \"embed\": 16}"
                 : "{\"input\": [12], \"layers\": [{\"type\": \"linear\", \"out\": 32, \"split\": \"column\"}, "
                   "{\"type\": \"relu\"}, {\"type\": \"linear\", \"out\": 24, \"split\": \"row\"}, {\"type\": "
                   "\"linear\", \"out\": 16, \"split\": \"column\"}, {\"type\": \"gelu\"}, {\"type\": \"linear\", "
                   "\"out\": 5, \"split\": \"row\"}]}",
             name, restart, name, name);
    snprintf(file, sizeof file, "%s.json", name);
    return cdp_test_write_file(dir, file, json);
}

/* A rank of a tensor group killed at step 6 (rank 1: stage 0, tensor index
 * 1, device 1): its group's slot (devices 0 and 1) goes, the plan's t = 2
 * stays, the re-plan puts the model on the group of devices 2 and 3 and the
 * run resumes from step 4; it ends as a resume by hand from the same
 * checkpoint under the restart's planned.json does, bitwise. */
static void a_group_s_rank_killed(int gpt)
{
    need_mpi();
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    const char *a = split_plan(dir, "a", "{\"max\": 2, \"exclude_failed\": true}", gpt);
    struct cdp_run r = run((const char *[]){"--dry-run", "--plan", a, NULL}, NULL);
    cr_assert(r.exit_code == 0 && strstr(r.out, "up to 2 in a row at one step, re-planned without the failed "
                                                "devices' tensor groups"),
              "%s", r.out);
    cdp_test_run_free(&r);
    r = run((const char *[]){"--plan", a, NULL}, "kill:1:6@0");
    cr_assert_eq(r.exit_code, 0, "exit %d: %s", r.exit_code, r.err);
    cr_assert(strstr(r.out, "restart 1: rank 1 (stage 0, replica 0, tensor 1, node 0, device 1) died"), "%s", r.out);
    cr_assert(strstr(r.out, "at step 6; resuming from step 4 (1 step lost) on 1x1 (tensor 2), was 2x1 (tensor 2) "
                            "(devices 2,3)"),
              "%s", r.out);
    cr_assert(!strstr(r.out, "restart 2:"), "%s", r.out);
    cr_log_info("%s", strstr(r.out, "restart 1:"));
    cdp_test_run_free(&r);
    char planned[4200];
    snprintf(planned, sizeof planned, "%s/planned.json", dir);
    json_t *p = load(planned);
    json_t *train = json_object_get(p, "train"), *par = json_object_get(p, "parallel");
    cr_assert_eq(json_integer_value(json_object_get(train, "global_batch")), 8);
    cr_assert_eq(json_integer_value(json_object_get(par, "tensor")), 2);
    const json_t *place = json_object_get(par, "placement");
    cr_assert(json_is_array(place) && count(place) == 1 && holds(place, 2), "one group, from device 2");
    double la[6], lc[6];
    json_t *rec = records(dir, "a", 6, la);
    cr_assert_eq(json_array_size(rec), 1);
    const json_t *r1 = json_array_get(rec, 0);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(r1, "old_layout"), "tensor")), 2);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(r1, "new_layout"), "tensor")), 2);
    cr_assert_eq(json_integer_value(json_object_get(r1, "resumed_from")), 4);
    json_decref(rec);
    /* by hand: the same fault without restarts, then --resume under the restart's layout */
    char sub[4200];
    snprintf(sub, sizeof sub, "%s/c", dir);
    cr_assert_eq(mkdir(sub, 0700), 0);
    const char *c = split_plan(sub, "c", "null", gpt);
    r = run((const char *[]){"-q", "--plan", c, NULL}, "kill:1:6");
    cr_assert_neq(r.exit_code, 0, "the fault did not stop the run");
    cdp_test_run_free(&r);
    char ck[4300], metrics[4300], weights[4300], hand[4300];
    snprintf(ck, sizeof ck, "%s/ckpt-c", sub);
    snprintf(metrics, sizeof metrics, "%s/c.jsonl", sub);
    snprintf(weights, sizeof weights, "%s/c.safetensors", sub);
    json_object_set_new(json_object_get(train, "checkpoint"), "dir", json_string(ck));
    json_object_set_new(train, "restart", json_null());
    json_object_set_new(json_object_get(p, "output"), "metrics", json_string(metrics));
    json_object_set_new(json_object_get(p, "output"), "weights", json_string(weights));
    snprintf(hand, sizeof hand, "%s/by-hand.json", sub);
    cr_assert_eq(json_dump_file(p, hand, JSON_INDENT(2)), 0);
    json_decref(p);
    r = run((const char *[]){"--plan", hand, "--resume", ck, NULL}, NULL);
    cr_assert_eq(r.exit_code, 0, "resume by hand: %s", r.err);
    cdp_test_run_free(&r);
    json_decref(records(sub, "c", 6, lc));
    for (int i = 0; i < 6; i++) cr_assert_eq(la[i], lc[i], "step %d: %.17g restarted, %.17g by hand", i + 1, la[i], lc[i]);
    char wa[4300];
    snprintf(wa, sizeof wa, "%s/a.safetensors", dir);
    files_equal(wa, weights);
}

Test(restart, a_killed_rank_of_a_tensor_group_is_replanned_around, .timeout = 240)
{
    a_group_s_rank_killed(0);
}

/* The same for a GPT split by heads (2 stages of t = 2: embedding and a block, a block
 * and the head). */
Test(restart, a_killed_rank_of_a_gpt_tensor_group_is_replanned_around, .timeout = 240)
{
    a_group_s_rank_killed(1);
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

/* ---- the decision, on made-up ends of a 2 x 2 layout over 2 nodes -------------------- */

#include "cli/restart.h"

static struct cdp_layout *two_nodes(void)
{
    struct cdp_layout *l = NULL;
    cr_assert_eq(cdp_layout_create(2, 1, 2, &l), CDP_OK);
    l->n_nodes = 2;
    for (int i = 0; i < 4; i++) l->rank[i] = (struct cdp_layout_rank){.stage = i / 2, .replica = i % 2, .node = i / 2,
                                                                        .device = i};
    return l;
}

/* A rank's last word, read back: the word, where, and a failed rank's exit code. */
Test(restart, a_failed_rank_s_word_carries_its_exit_code)
{
    const char *dir = cdp_test_tmpdir();
    cdp_test_write_file(dir, "rank-0.end", "failed other\nrank 0/2 (stage 0, replica 0): setting up\nexit 2\n");
    cdp_test_write_file(dir, "rank-1.end", "stopped waiting\nrank 1/2 (stage 1, replica 0), step 3: RECV_ACT\n");
    struct cdp_job_end e;
    cr_assert_eq(cdp_restart_read_ends(dir, 2, 139, -1, &e), CDP_OK);
    cr_assert_eq(e.end[0], CDP_END_FAILED_OTHER);
    cr_assert_eq(e.end[1], CDP_END_STOPPED_WAITING);
    cr_assert_eq(e.step[1], 3);
    cr_assert_eq(e.rank_code, 2);
    cdp_job_end_clear(&e);
}

static struct cdp_fault_report decide(const struct cdp_layout *l, int code, int died, const enum cdp_rank_end *end,
                                      int64_t last)
{
    int64_t step[4] = {-1, -1, -1, -1};
    struct cdp_job_end e = {.code = code, .n_ranks = 4, .end = (enum cdp_rank_end *)end, .step = step, .died = died};
    struct cdp_fault_report f;
    cr_assert_eq(cdp_restart_decide(l, &e, last, &f), CDP_OK);
    return f;
}

Test(restart, what_failed_is_decided_from_the_strongest_evidence)
{
    struct cdp_layout *l = two_nodes();
    const enum cdp_rank_end W = CDP_END_STOPPED_WAITING, S = CDP_END_SILENT, B = CDP_END_STOPPED_BUSY,
                            C = CDP_END_FAILED_COMM, D = CDP_END_FAILED_DEVICE, O = CDP_END_FAILED_OTHER;
    /* node 1 vanished: both its ranks silent, the job ended by a signal */
    struct cdp_fault_report f = decide(l, 137, -1, (enum cdp_rank_end[]){W, W, S, S}, 5);
    cr_assert(f.restartable && !strcmp(f.kind, "died") && f.node == 1 && f.n_failed == 2 && f.step == 6, "%s", f.what);
    cr_assert(strstr(f.what, "node 1 (all its ranks) died"), "%s", f.what);
    cdp_fault_report_clear(&f);
    /* two silent, mpirun named one: that one */
    f = decide(l, 137, 1, (enum cdp_rank_end[]){W, S, S, W}, -1);
    cr_assert(f.restartable && f.n_failed == 1 && f.failed[0] == 1 && f.node == -1, "%s", f.what);
    cdp_fault_report_clear(&f);
    /* a device error beside a rank killed in the clean-up */
    f = decide(l, 1, -1, (enum cdp_rank_end[]){W, W, S, D}, 5);
    cr_assert(f.restartable && !strcmp(f.kind, "device error") && f.n_failed == 1 && f.failed[0] == 3, "%s", f.what);
    cdp_fault_report_clear(&f);
    /* a deadline: the busy rank hung */
    f = decide(l, 1, -1, (enum cdp_rank_end[]){C, W, B, C}, 5);
    cr_assert(f.restartable && !strcmp(f.kind, "hang") && f.n_failed == 1 && f.failed[0] == 2, "%s", f.what);
    cdp_fault_report_clear(&f);
    /* a deadline, no rank busy: not known which */
    f = decide(l, 1, -1, (enum cdp_rank_end[]){C, W, W, W}, 5);
    cr_assert(f.restartable && !strcmp(f.kind, "hang") && f.n_failed == 0, "%s", f.what);
    cr_assert(strstr(f.what, "which one is not known"), "%s", f.what);
    cdp_fault_report_clear(&f);
    /* a deadline, then mpirun crashed while it aborted the job (signal 11) and
     * never stopped the hung rank: the ranks' words decide, a hang of the
     * silent rank, not a death; the same when mpirun named it */
    f = decide(l, 139, -1, (enum cdp_rank_end[]){C, C, S, C}, 5);
    cr_assert(f.restartable && !strcmp(f.kind, "hang") && f.n_failed == 1 && f.failed[0] == 2, "%s", f.what);
    cr_assert(strstr(f.what, "rank 2 (") && strstr(f.what, "hung past the deadline"), "%s", f.what);
    cdp_fault_report_clear(&f);
    f = decide(l, 137, 2, (enum cdp_rank_end[]){C, W, S, C}, 5);
    cr_assert(f.restartable && !strcmp(f.kind, "hang") && f.n_failed == 1 && f.failed[0] == 2, "%s", f.what);
    cdp_fault_report_clear(&f);
    /* ... and a busy rank beside a silent one: the busy one hung */
    f = decide(l, 139, -1, (enum cdp_rank_end[]){C, S, B, C}, 5);
    cr_assert(f.restartable && !strcmp(f.kind, "hang") && f.n_failed == 1 && f.failed[0] == 2, "%s", f.what);
    cdp_fault_report_clear(&f);
    /* node 1's host went (killed or cut off): its ranks silent, node 0's
     * timed out on it, one stopped while computing; the node died, not the
     * busy rank of the healthy node (it was taken for a hang) */
    f = decide(l, 1, -1, (enum cdp_rank_end[]){B, C, S, S}, 5);
    cr_assert(f.restartable && !strcmp(f.kind, "died") && f.node == 1 && f.n_failed == 2 && f.failed[0] == 2,
              "%s", f.what);
    cr_assert(strstr(f.what, "node 1 (all its ranks) died"), "%s", f.what);
    cdp_fault_report_clear(&f);
    /* ... with a rank of node 0 killed in the clean-up before it said a word: node 1 still */
    f = decide(l, 1, -1, (enum cdp_rank_end[]){B, S, S, S}, 5);
    cr_assert(f.restartable && f.node == 1 && f.n_failed == 2 && f.failed[0] == 2 && f.failed[1] == 3, "%s",
              f.what);
    cdp_fault_report_clear(&f);
    /* no rank said a word (a relaunch whose ranks never started): no node is
     * named (node 0 was, for being the first all silent) */
    f = decide(l, 1, -1, (enum cdp_rank_end[]){S, S, S, S}, 5);
    cr_assert(f.node == -1 && f.n_failed == 0, "%s", f.what);
    cr_assert(strstr(f.what, "no rank left a word (none started") && !strstr(f.what, "node 0"), "%s", f.what);
    cdp_fault_report_clear(&f);
    /* another error, a silent rank beside it: not restarted */
    f = decide(l, 1, -1, (enum cdp_rank_end[]){O, S, W, W}, 5);
    cr_assert(!f.restartable, "%s", f.what);
    cdp_fault_report_clear(&f);
    /* bad input */
    f = decide(l, 2, -1, (enum cdp_rank_end[]){O, O, O, O}, 5);
    cr_assert(!f.restartable && strstr(f.what, "bad input"), "%s", f.what);
    cdp_fault_report_clear(&f);
    /* bad input the ranks said (exit 2 in their words), and mpirun crashed on the abort
     * (signal 11) before it could pass the 2 on, two ranks killed silent: no restart */
    {
        int64_t step[4] = {-1, -1, -1, -1};
        enum cdp_rank_end end[4] = {S, O, S, O};
        struct cdp_job_end e = {.code = 139, .n_ranks = 4, .end = end, .step = step, .died = -1, .rank_code = 2};
        cr_assert_eq(cdp_restart_decide(l, &e, 5, &f), CDP_OK);
        cr_assert(!f.restartable && strstr(f.what, "bad input"), "%s", f.what);
        cdp_fault_report_clear(&f);
    }
    cdp_layout_free(l);
}

/* The ranks' files: the word, and the step from where each was. */
Test(restart, the_ranks_last_words_are_read_with_their_step)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    cdp_test_write_file(dir, "rank-0.end", "failed comm\nrank 0/3 (stage 0, replica 0), step 6: RECV_GRAD of micro-batch 0\n");
    cdp_test_write_file(dir, "rank-1.end", "stopped busy\nrank 1/3 (stage 1, replica 0), after step 5: writing\n");
    struct cdp_job_end e;
    cr_assert_eq(cdp_restart_read_ends(dir, 3, 1, -1, &e), CDP_OK);
    cr_assert(e.end[0] == CDP_END_FAILED_COMM && e.end[1] == CDP_END_STOPPED_BUSY && e.end[2] == CDP_END_SILENT);
    cr_assert(e.step[0] == 6 && e.step[1] == 6 && e.step[2] == -1, "%lld %lld", (long long)e.step[0],
              (long long)e.step[1]);
    cdp_job_end_clear(&e);
}

/* The re-plan of a layout over 2 DGX nodes (16 GPUs) when node 1 vanished, and
 * then one GPU of node 0 too: the same global batch, on what is left only. */
#include "partitioner/planner.h"

static struct cdp_plan *load_resolved(const char *path)
{
    struct cdp_plan *p = NULL;
    const struct cdp_machine_info none = {.gpus = 0};
    cr_assert_eq(cdp_plan_load(path, &p), CDP_OK, "%s", cdp_last_error());
    cr_assert_eq(cdp_plan_resolve(p, &none), CDP_OK, "%s", cdp_last_error());
    return p;
}

Test(restart, a_vanished_node_is_planned_around)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    const char *path = cdp_test_write_file(
        dir, "dgx.json",
        "{\"model\": {\"preset\": \"gpt\", \"layers\": 8}, \"train\": {\"micro_batch\": 2, \"global_batch\": 64, "
        "\"checkpoint\": {\"dir\": \"ck\"}, \"restart\": {\"max\": 1}}, \"parallel\": {\"stages\": 4, "
        "\"replicas\": 4}, \"cluster\": {\"backend\": \"cuda\", \"topology\": \"2 x dgx-a100\"}}");
    struct cdp_plan *p = load_resolved(path);
    struct cdp_topology *t = NULL;
    char note[512];
    cr_assert_eq(cdp_planner_topology(p, 0, &t, note, sizeof note), CDP_OK, "%s", cdp_last_error());
    struct cdp_planner_result r0 = {0};
    cr_assert_eq(cdp_planner_run(p, t, NULL, 0, &r0), CDP_OK, "%s", cdp_last_error());
    const struct cdp_layout *l = r0.layout;
    cr_assert_eq(l->n_ranks, 16);
    unsigned char dead[16] = {0};
    for (int i = 0; i < 16; i++)
        if (l->rank[i].node == 1) dead[l->rank[i].device] = 1;
    const struct cdp_machine_info none = {.gpus = 0};
    const struct cdp_replan_in in = {.plan_path = path, .machine = &none, .table = NULL, .topo = t};
    struct cdp_plan *np = NULL;
    struct cdp_planner_result nr = {0};
    cr_assert_eq(cdp_restart_replan(&in, l, dead, t->n_gpus, &np, &nr), CDP_OK, "%s", cdp_last_error());
    const struct cdp_layout *n = nr.layout;
    int64_t mb = 0;
    for (int r = 0; r < n->replicas; r++) mb += n->shares[r];
    cr_assert_eq(mb * n->micro_batch, 64, "the global batch stays");
    cr_assert(n->n_ranks >= 1 && n->n_ranks <= 8, "%d ranks", n->n_ranks);
    for (int i = 0; i < n->n_ranks; i++) cr_assert(n->rank[i].node == 0 && !dead[n->rank[i].device], "rank %d", i);
    cr_assert_eq(np->train.global_batch, 64);
    cr_log_info("node 1 gone: %dx%d on node 0", n->stages, n->replicas);
    /* then the GPU of its rank 0 as well: planned on what is still left */
    dead[n->rank[0].device] = 1;
    struct cdp_plan *np2 = NULL;
    struct cdp_planner_result nr2 = {0};
    cr_assert_eq(cdp_restart_replan(&in, n, dead, t->n_gpus, &np2, &nr2), CDP_OK, "%s", cdp_last_error());
    for (int i = 0; i < nr2.layout->n_ranks; i++)
        cr_assert(!dead[nr2.layout->rank[i].device] && nr2.layout->rank[i].node == 0, "rank %d", i);
    cr_assert_leq(nr2.layout->n_ranks, 7);
    cr_assert_eq(np2->train.global_batch, 64);
    cdp_planner_result_clear(&nr2);
    cdp_plan_free(np2);
    cdp_planner_result_clear(&nr);
    cdp_plan_free(np);
    cdp_planner_result_clear(&r0);
    cdp_topology_free(t);
    cdp_plan_free(p);
}

/* The re-plan of tensor groups (docs/checkpoints.md, "Restarts"): every
 * group of the new layout is t consecutive devices of one node, none of them
 * the failed one. A fixed t stays (want_t), and the failed device takes its
 * group's slot with it; "auto" (want_t 0) plans the old t and its halves on
 * what is left, so that a smaller t may use the rest of the slot. */
static void replanned_around_groups(const char *json, int kill_rank, int want_t)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    const char *path = cdp_test_write_file(dir, "groups.json", json);
    struct cdp_plan *p = load_resolved(path);
    struct cdp_topology *t = NULL;
    char note[512];
    cr_assert_eq(cdp_planner_topology(p, 0, &t, note, sizeof note), CDP_OK, "%s", cdp_last_error());
    struct cdp_planner_result r0 = {0};
    cr_assert_eq(cdp_planner_run(p, t, NULL, 0, &r0), CDP_OK, "%s", cdp_last_error());
    const struct cdp_layout *l = r0.layout;
    cr_assert_gt(l->tensor, 1, "the first plan has tensor groups");
    cr_assert_lt(kill_rank, l->n_ranks);
    unsigned char dead[64] = {0}, gone[64] = {0};
    cr_assert_leq(t->n_gpus, 64);
    const struct cdp_layout_rank *k = &l->rank[kill_rank];
    dead[k->device] = 1;
    for (int i = 0; i < l->n_ranks; i++)
        if (l->rank[i].stage == k->stage && l->rank[i].replica == k->replica) gone[l->rank[i].device] = 1;
    const struct cdp_machine_info none = {.gpus = 0};
    const struct cdp_replan_in in = {.plan_path = path, .machine = &none, .table = NULL, .topo = t};
    struct cdp_plan *np = NULL;
    struct cdp_planner_result nr = {0};
    cr_assert_eq(cdp_restart_replan(&in, l, dead, t->n_gpus, &np, &nr), CDP_OK, "%s", cdp_last_error());
    const struct cdp_layout *n = nr.layout;
    if (want_t) cr_assert_eq(n->tensor, want_t, "tensor %d after the re-plan", n->tensor);
    cr_assert_eq(np->parallel.tensor, n->tensor);
    int64_t mb = 0;
    for (int r = 0; r < n->replicas; r++) mb += n->shares[r];
    cr_assert_eq(mb * n->micro_batch, np->train.global_batch);
    cr_assert_eq(np->train.global_batch, p->train.global_batch, "the global batch stays");
    for (int i = 0; i < n->n_ranks; i++) {
        const struct cdp_layout_rank *q = &n->rank[i], *lead = &n->rank[i - q->tensor];
        cr_assert(!dead[q->device], "rank %d on the failed device %d", i, q->device);
        cr_assert(!want_t || !gone[q->device], "rank %d on device %d, of the failed device's group", i, q->device);
        cr_assert_eq(lead->tensor, 0);
        cr_assert(lead->stage == q->stage && lead->replica == q->replica, "rank %d: its group is consecutive", i);
        cr_assert_eq(q->device, lead->device + q->tensor, "rank %d: a group's devices are consecutive", i);
        cr_assert_eq(q->node, lead->node);
    }
    for (int64_t i = 0; i < np->parallel.stages * np->parallel.replicas; i++)
        cr_assert(!dead[np->parallel.placement_map[i]], "the placement starts a group on device %lld",
                  (long long)np->parallel.placement_map[i]);
    if (!want_t) cr_assert_lt(n->tensor, l->tensor, "a smaller t on what is left");
    cr_log_info("t=%d %dx%d -> t=%d %dx%d on devices from %d", l->tensor, l->stages, l->replicas, n->tensor,
                n->stages, n->replicas, n->rank[0].device);
    cdp_planner_result_clear(&nr);
    cdp_plan_free(np);
    cdp_planner_result_clear(&r0);
    cdp_topology_free(t);
    cdp_plan_free(p);
}

Test(restart, a_fixed_tensor_group_is_replanned_without_the_failed_group)
{
    /* 2 replicas of a 4-way group on a dgx-a100; device 5 fails: 4..7 go, the
     * same t on devices 0..3 */
    replanned_around_groups(
        "{\"model\": {\"input\": [64], \"layers\": [{\"type\": \"linear\", \"out\": 256, \"split\": \"column\"}, "
        "{\"type\": \"relu\"}, {\"type\": \"linear\", \"out\": 8, \"split\": \"row\"}]}, \"train\": "
        "{\"micro_batch\": 4, \"global_batch\": 32, \"checkpoint\": {\"dir\": \"ck\"}, \"restart\": {\"max\": 1}}, "
        "\"parallel\": {\"stages\": 1, \"replicas\": 2, \"tensor\": 4}, \"cluster\": {\"backend\": \"cuda\", "
        "\"topology\": \"dgx-a100\"}}",
        5, 4);
}

Test(restart, an_auto_tensor_plan_chooses_t_again_on_what_is_left)
{
    /* a GPT whose planner chose one group of 8 on a dgx-a100; the device of
     * its rank 3 fails: a smaller t on the 7 left */
    replanned_around_groups(
        "{\"model\": {\"preset\": \"gpt\", \"layers\": 8, \"embed\": 1024, \"heads\": 16}, \"train\": "
        "{\"micro_batch\": 2, \"global_batch\": 64, \"checkpoint\": {\"dir\": \"ck\"}, \"restart\": {\"max\": 1}}, "
        "\"parallel\": {\"tensor\": \"auto\"}, \"cluster\": {\"backend\": \"cuda\", \"topology\": \"dgx-a100\"}}",
        3, 0);
}

/* Out of memory (the kernel's OOM killer, counted in the cgroup's
 * memory.events) is named and not restarted: no device failed. A rank killed
 * from outside the job (SIGTERM, not by its launcher) is a death, that rank's. */
Test(restart, out_of_memory_is_named_and_a_killed_rank_is_a_death)
{
    struct cdp_layout *l = two_nodes();
    const enum cdp_rank_end W = CDP_END_STOPPED_WAITING, S = CDP_END_SILENT, K = CDP_END_KILLED;
    int64_t step[4] = {-1, -1, -1, -1};
    struct cdp_job_end e = {.code = 137, .n_ranks = 4, .end = (enum cdp_rank_end[]){W, S, W, W}, .step = step,
                            .died = 1, .oom_kills = 1};
    struct cdp_fault_report f;
    cr_assert_eq(cdp_restart_decide(l, &e, 5, &f), CDP_OK);
    cr_assert(!f.restartable && !strcmp(f.kind, "out of memory") && f.n_failed == 0, "%s", f.what);
    cr_assert(strstr(f.what, "OOM killer ended 1 process of this job") && strstr(f.what, "without a word: 1"), "%s",
              f.what);
    cdp_fault_report_clear(&f);
    f = decide(l, 143, -1, (enum cdp_rank_end[]){W, W, K, W}, 5);
    cr_assert(f.restartable && !strcmp(f.kind, "died") && f.n_failed == 1 && f.failed[0] == 2, "%s", f.what);
    cr_assert(strstr(f.what, "was killed (SIGTERM from outside the job)"), "%s", f.what);
    cdp_fault_report_clear(&f);
    cdp_layout_free(l);
}

/* The count the launcher reads before and after a job: "oom_kill N" of
 * memory.events (v2) or memory.oom_control (v1). */
#include "partitioner/host.h"

Test(restart, the_oom_kill_count_is_read_from_the_cgroup_file)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    const char *v2 = cdp_test_write_file(dir, "memory.events", "low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\n");
    cr_assert_eq(cdp_host_oom_kills_in(v2), 2);
    const char *v1 = cdp_test_write_file(dir, "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 7\n");
    cr_assert_eq(cdp_host_oom_kills_in(v1), 7);
    cr_assert_eq(cdp_host_oom_kills_in("/nonexistent/memory.events"), -1);
    cr_assert_geq(cdp_host_oom_kills(), -1);
}
