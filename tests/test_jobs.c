/* Suite jobs: a job's life from start to kill (docs/jobs.md). The real binary
 * in the background, as a shell starts a job: one job per output folder and
 * per checkpoint folder; the ranks die with their launcher; a signal to the
 * launcher stops the job (saving a checkpoint first for SIGTERM, SIGHUP and
 * SIGUSR1), never restarts it; a rank killed from outside is a death; limits
 * (file size, open files, address space, CPUs) are named; a fresh run does not
 * mix with another run's checkpoints or metrics; a resume under another
 * model, data or optimizer setting is refused naming the key; a signal
 * raised inside a transfer ends the job as a signal anywhere else does. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "harness.h"

static void need_mpi(void)
{
    if (!cdp_comm_have_mpi()) cr_skip_test("this build has no MPI (-Dmpi=disabled): multi-rank runs are not possible");
}

/* A GPT small enough for thousands of steps a second: stages x 1 replica,
 * outputs name.jsonl in dir, checkpoints in ck_dir (relative to dir) every
 * `every` steps; train_extra: more /train keys (", ..."), or "". */
static const char *plan_of(const char *dir, const char *name, int stages, int steps, const char *ck_dir, int every,
                           const char *train_extra, const char *model_extra)
{
    char json[2048], file[96], ck[512] = "";
    if (ck_dir) snprintf(ck, sizeof ck, ", \"checkpoint\": {\"dir\": \"%s\", \"every\": %d}", ck_dir, every);
    snprintf(json, sizeof json,
             "{\"model\": {\"preset\": \"gpt\", \"vocab\": 32, \"context\": 8, \"layers\": 4, \"heads\": 2, "
             "\"embed\": 16%s}, \"data\": {\"source\": \"synthetic\", \"seed\": 5}, \"train\": {\"steps\": %d, "
             "\"micro_batch\": 2, \"log_every\": 100, \"optimizer\": {\"lr\": 0.01}, \"eval_batches\": 1%s%s}, "
             "\"parallel\": {\"stages\": %d, \"replicas\": 1, \"micro_batches\": 2}, \"cluster\": {\"backend\": "
             "\"cpu\"}, \"output\": {\"metrics\": \"%s.jsonl\"}}",
             model_extra, steps, ck, train_extra, stages, name);
    snprintf(file, sizeof file, "%s.json", name);
    return cdp_test_write_file(dir, file, json);
}

static const char *in(const char *dir, const char *name)
{
    static char path[4][4200];
    static int k;
    k = (k + 1) % 4;
    snprintf(path[k], sizeof path[k], "%s/%s", dir, name);
    return path[k];
}

/* Starts the plan, and waits until its metrics hold step 3 (training is under way). */
static void start_training(struct cdp_job *j, const char *dir, const char *name, const char *const *argv)
{
    cr_assert_eq(cdp_test_start(j, argv, NULL), 0);
    char metrics[4200];
    snprintf(metrics, sizeof metrics, "%s/%s.jsonl", dir, name);
    if (!cdp_test_wait_for(metrics, "\"step\": 3,", 60)) {
        struct cdp_run r;
        cdp_test_finish(j, 1, &r);
        cr_assert_fail("%s never reached step 3: %s", name, r.err);
    }
}

/* No process of the job is left after at most 10 s. */
static void nothing_left(const struct cdp_job *j)
{
    int n = 0;
    for (int i = 0; i < 100 && (n = cdp_test_tagged(j->tag, NULL, 0)) > 0; i++) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (n > 0) { /* not left to train on after this test */
        int pids[64];
        const int k = cdp_test_tagged(j->tag, pids, 64);
        for (int i = 0; i < k && i < 64; i++) kill(pids[i], SIGKILL);
    }
    cr_assert_eq(n, 0, "%d processes of the job were still alive (killed now)", n);
}

/* The newest committed step-N folder in dir (with its manifest), or -1. */
static long newest_step(const char *dir)
{
    long best = -1;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        long s;
        char path[8192];
        if (sscanf(e->d_name, "step-%ld", &s) != 1) continue;
        snprintf(path, sizeof path, "%s/%s/manifest.json", dir, e->d_name);
        if (access(path, F_OK) == 0 && s > best) best = s;
    }
    if (d) closedir(d);
    return best;
}

/* ---- one job per folder (B1, B2) ---------------------------------------------------- */

/* A second job started on an output folder in use is refused, naming the
 * folder and the job that holds it; it writes nothing there. */
Test(jobs, a_second_job_on_an_output_folder_in_use_is_refused, .timeout = 120)
{
    need_mpi();
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    const char *a = plan_of(dir, "a", 2, 100000, NULL, 0, "", "");
    struct cdp_job j;
    start_training(&j, dir, "a", (const char *[]){"-q", "--plan", a, NULL});
    char *planned_a = cdp_test_read_file(in(dir, "planned.json"));
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"-q", "--plan", plan_of(dir, "b", 1, 4, NULL, 0, "", ""), NULL}),
                 0);
    cr_assert_eq(r.exit_code, 2, "exit %d: %s", r.exit_code, r.err);
    char holder[64];
    snprintf(holder, sizeof holder, "pid %d on ", j.pid);
    cr_assert(strstr(r.err, dir) && strstr(r.err, "is in use by another job") && strstr(r.err, holder), "%s", r.err);
    cdp_test_run_free(&r);
    char *planned_now = cdp_test_read_file(in(dir, "planned.json"));
    cr_assert(planned_a && planned_now && !strcmp(planned_a, planned_now), "planned.json was written over");
    free(planned_a);
    free(planned_now);
    kill(j.pid, SIGINT);
    cdp_test_finish(&j, 30, &r);
    cr_assert_eq(r.exit_code, 128 + SIGINT, "exit %d: %s", r.exit_code, r.err);
    cdp_test_run_free(&r);
}

/* Two runs with their own outputs but one checkpoint folder: the second is
 * refused while the first runs, naming the folder and the holder. */
Test(jobs, a_second_writer_of_a_checkpoint_folder_is_refused, .timeout = 120)
{
    char dir[4096], other[4200];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    snprintf(other, sizeof other, "%s/other", dir);
    cr_assert_eq(mkdir(other, 0755), 0);
    char ck[4300];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    const char *a = plan_of(dir, "a", 1, 1000000, ck, 100000000, "", "");
    struct cdp_job j;
    start_training(&j, dir, "a", (const char *[]){"-q", "--plan", a, NULL});
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"-q", "--plan", plan_of(other, "b", 1, 4, ck, 2, "", ""), NULL}), 0);
    cr_assert_eq(r.exit_code, 2, "exit %d: %s", r.exit_code, r.err);
    char holder[64];
    snprintf(holder, sizeof holder, "pid %d on ", j.pid);
    cr_assert(strstr(r.err, "/train/checkpoint/dir") && strstr(r.err, ck) && strstr(r.err, "in use by another job") &&
                  strstr(r.err, holder), "%s", r.err);
    cr_assert_eq(newest_step(ck), -1, "the second run saved into the first one's folder");
    cdp_test_run_free(&r);
    kill(j.pid, SIGINT);
    cdp_test_finish(&j, 30, &r);
    cdp_test_run_free(&r);
}

/* ---- the launcher's death and signals (B3, B4, B5) -------------------------------------- */

/* SIGKILL to the launcher: mpirun and the ranks go too, none trains on. */
Test(jobs, the_ranks_die_with_their_launcher, .timeout = 120)
{
    need_mpi();
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    struct cdp_job j;
    start_training(&j, dir, "k", (const char *[]){"-q", "--plan", plan_of(dir, "k", 2, 1000000, NULL, 0, "", ""), NULL});
    cr_assert_geq(cdp_test_tagged(j.tag, NULL, 0), 4, "the launcher, mpirun and 2 ranks");
    kill(j.pid, SIGKILL);
    nothing_left(&j);
    struct cdp_run r;
    cdp_test_finish(&j, 5, &r);
    cdp_test_run_free(&r);
}

/* SIGTERM (Slurm's time limit, scancel), SIGHUP and SIGUSR1 to the launcher
 * stop the job after a checkpoint of the step under way (not a multiple of
 * /train/checkpoint/every), exit 128 + the signal, say so, and leave no
 * process; the saved step resumes. */
static void stops_with_a_checkpoint(int sig, int stages)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    const char *p = plan_of(dir, "s", stages, 1000000, "ck", 100000000, "", "");
    struct cdp_job j;
    start_training(&j, dir, "s", (const char *[]){"-q", "--plan", p, NULL});
    kill(j.pid, sig);
    struct cdp_run r;
    cdp_test_finish(&j, 60, &r);
    cr_assert_eq(r.exit_code, 128 + sig, "exit %d: %s", r.exit_code, r.err);
    cr_assert(strstr(r.err, "stopped by ") && strstr(r.err, "checkpoint saved in "), "%s", r.err);
    cdp_test_run_free(&r);
    nothing_left(&j);
    const long s = newest_step(in(dir, "ck"));
    cr_assert_geq(s, 3, "no checkpoint was saved at the stop");
    /* it continues from there: 2 steps more */
    char steps[32];
    snprintf(steps, sizeof steps, "%ld", s + 2);
    const char *more = plan_of(dir, "s", stages, (int)(s + 2), "ck", 100000000, "", "");
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", more, "--resume", NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    char at[64];
    snprintf(at, sizeof at, "at step %ld", s);
    cr_assert(strstr(r.out, at), "%s", r.out);
    cdp_test_run_free(&r);
}

Test(jobs, sigterm_to_the_launcher_saves_and_stops, .timeout = 120)
{
    need_mpi();
    stops_with_a_checkpoint(SIGTERM, 2);
}

Test(jobs, sighup_and_sigusr1_to_the_launcher_save_and_stop, .timeout = 180)
{
    need_mpi();
    stops_with_a_checkpoint(SIGHUP, 2);
    stops_with_a_checkpoint(SIGUSR1, 2);
}

Test(jobs, sigterm_to_a_one_rank_run_saves_and_stops, .timeout = 120) { stops_with_a_checkpoint(SIGTERM, 1); }

/* Ctrl-C (SIGINT to the terminal's whole process group) on a job with
 * /train/restart: it stops, says what it stopped, starts nothing beside it. */
Test(jobs, ctrl_c_stops_a_job_and_never_restarts_it, .timeout = 120)
{
    need_mpi();
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    const char *p = plan_of(dir, "c", 2, 1000000, "ck", 100000000, ", \"restart\": {\"max\": 2}", "");
    struct cdp_job j;
    start_training(&j, dir, "c", (const char *[]){"--plan", p, NULL});
    kill(-j.pid, SIGINT); /* as a terminal does: every process of the foreground group */
    struct cdp_run r;
    cdp_test_finish(&j, 60, &r);
    cr_assert_eq(r.exit_code, 128 + SIGINT, "exit %d: %s", r.exit_code, r.err);
    cr_assert(strstr(r.err, "stopped by SIGINT (Ctrl-C): the job's 2 ranks (mpirun) were ended"), "%s", r.err);
    cr_assert(!strstr(r.out, "restart 1:"), "%s", r.out);
    cdp_test_run_free(&r);
    nothing_left(&j);
    /* without restart, one rank: said too */
    struct cdp_job k;
    start_training(&k, dir, "one", (const char *[]){"--plan", plan_of(dir, "one", 1, 1000000, NULL, 0, "", ""), NULL});
    kill(-k.pid, SIGINT);
    cdp_test_finish(&k, 60, &r);
    cr_assert_eq(r.exit_code, 128 + SIGINT, "exit %d: %s", r.exit_code, r.err);
    cr_assert(strstr(r.err, "stopped by SIGINT (Ctrl-C) at rank 0/1"), "%s", r.err);
    cdp_test_run_free(&r);
}

/* A rank killed with SIGTERM alone (not by its launcher) is a death: the
 * restart names it and resumes. */
Test(jobs, a_rank_killed_with_sigterm_is_a_death_for_restarts, .timeout = 120)
{
    need_mpi();
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    const char *p = plan_of(dir, "t", 2, 3000, "ck", 50, ", \"restart\": {\"max\": 1}", "");
    struct cdp_job j;
    start_training(&j, dir, "t", (const char *[]){"--plan", p, NULL});
    int pid = -1;
    for (int i = 0; i < 50 && (pid = cdp_test_rank_pid(j.tag, 1)) < 0; i++) usleep(100000);
    cr_assert_gt(pid, 0, "rank 1 not found");
    kill(pid, SIGTERM);
    struct cdp_run r;
    cdp_test_finish(&j, 90, &r);
    cr_assert_eq(r.exit_code, 0, "exit %d: %s", r.exit_code, r.err);
    cr_assert(strstr(r.out, "restart 1: rank 1 (") && strstr(r.out, "was killed (SIGTERM from outside the job)"),
              "%s", r.out);
    cdp_test_run_free(&r);
}

/* ---- a signal inside a transfer ------------------------------------------------------------ */

/* 4 ranks of the tiny GPT with transfers in flight at every wait: 2 stages x
 * 2 replicas with gradient buckets of 10 KB (several per stage, started while
 * the backward runs), or 2 stages x tensor 2 (an all-reduce in every block). */
static const char *transfer_plan(const char *dir, const char *name, int replicas, int tensor)
{
    char json[2048], file[96];
    snprintf(json, sizeof json,
             "{\"model\": {\"preset\": \"gpt\", \"vocab\": 32, \"context\": 8, \"layers\": 4, \"heads\": 2, "
             "\"embed\": 16}, \"data\": {\"source\": \"synthetic\", \"seed\": 5}, \"train\": {\"steps\": 8, "
             "\"micro_batch\": 2, \"log_every\": 100, \"optimizer\": {\"lr\": 0.01}, \"eval_batches\": 1, "
             "\"checkpoint\": {\"dir\": \"ck\", \"every\": 100}}, \"parallel\": {\"stages\": 2, \"replicas\": %d, "
             "\"tensor\": %d, \"micro_batches\": 4, \"bucket_mb\": 0.01}, \"cluster\": {\"backend\": \"cpu\"}, "
             "\"output\": {\"metrics\": \"%s.jsonl\"}}",
             replicas, tensor, name);
    snprintf(file, sizeof file, "%s.json", name);
    return cdp_test_write_file(dir, file, json);
}

/* Runs the plan with CDP_FAULT=signal:... (the rank raises the signal in the
 * given wait on its peers of step 3, while that transfer is in flight); r
 * gets how it ended. No run trips an assertion or a sanitizer, and none
 * leaves a process behind. */
static void signal_in_transfer(const char *dir, const char *name, int replicas, int tensor, const char *fault,
                               struct cdp_run *r)
{
    char set[128];
    snprintf(set, sizeof set, "CDP_FAULT=%s", fault);
    const char *const env[] = {set, NULL};
    const struct cdp_job_opts o = {.set = env};
    struct cdp_job j;
    cr_assert_eq(cdp_test_start(&j, (const char *[]){"--plan", transfer_plan(dir, name, replicas, tensor), NULL}, &o),
                 0);
    cdp_test_finish(&j, 90, r);
    cr_assert(!strstr(r->err, "assertion failed") && !strstr(r->err, "Sanitizer") && !strstr(r->err, "runtime error"),
              "%s: %s", fault, r->err);
    nothing_left(&j);
}

/* A stop asked of a rank (SIGUSR1) while its transfers are in flight (a
 * pipeline send or receive, gradient buckets, a tensor all-reduce) ends the
 * job after that step with its checkpoint, exit 0; SIGTERM there (as from its
 * launcher) ends the job now, naming where each rank was, exit 1; a rank that
 * dies there (SIGKILL) is named as the one that died, exit 1. */
Test(jobs, a_signal_inside_a_transfer_ends_the_job_as_documented, .timeout = 240)
{
    need_mpi();
    static const struct {
        int replicas, tensor;
        const char *fault;
    } stops[] = {{2, 1, "signal:1:3:USR1:1"}, {1, 2, "signal:1:3:USR1:6"}};
    struct cdp_run r;
    for (size_t i = 0; i < sizeof stops / sizeof *stops; i++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
        signal_in_transfer(dir, "x", stops[i].replicas, stops[i].tensor, stops[i].fault, &r);
        cr_assert_eq(r.exit_code, 0, "%s: exit %d: %s", stops[i].fault, r.exit_code, r.err);
        cr_assert(strstr(r.out, "stopped after step 3, as asked: checkpoint saved in "), "%s: %s", stops[i].fault,
                  r.out);
        cr_assert_eq(newest_step(in(dir, "ck")), 3, "%s", stops[i].fault);
        cdp_test_run_free(&r);
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    signal_in_transfer(dir, "t", 2, 1, "signal:1:3:TERM:2", &r);
    cr_assert_eq(r.exit_code, 1, "exit %d: %s", r.exit_code, r.err);
    cr_assert(strstr(r.err, "cdphybrid: stopped while at rank 1/4 (stage 0, replica 1), step 3: ") &&
                  strstr(r.err, "mpirun ended the job"), "%s", r.err);
    cdp_test_run_free(&r);
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    signal_in_transfer(dir, "k", 2, 1, "signal:2:3:KILL:4", &r);
    cr_assert_eq(r.exit_code, 1, "exit %d: %s", r.exit_code, r.err);
    cr_assert(strstr(r.err, "rank 2/4 (stage 1, replica 0) on node 0") && strstr(r.err, "died without a word"), "%s",
              r.err);
    cdp_test_run_free(&r);
}

/* ---- signals that are no device failure (B7) --------------------------------------------- */

/* A GPT whose checkpoint part of one stage (weights and AdamW state) is
 * about 28 MB, past a file size limit of 16 MiB. */
static const char *big_plan(const char *dir, const char *name, int stages, const char *train_extra)
{
    char json[2048], file[96];
    snprintf(json, sizeof json,
             "{\"model\": {\"preset\": \"gpt\", \"vocab\": 32, \"context\": 8, \"layers\": 6, \"heads\": 4, "
             "\"embed\": 256}, \"data\": {\"source\": \"synthetic\", \"seed\": 5}, \"train\": {\"steps\": 4, "
             "\"micro_batch\": 2, \"optimizer\": {\"lr\": 0.01}, \"eval_batches\": 1, \"checkpoint\": {\"dir\": "
             "\"ck-%s\", \"every\": 2}%s}, \"parallel\": {\"stages\": %d, \"replicas\": 1, \"micro_batches\": 2}, "
             "\"cluster\": {\"backend\": \"cpu\"}, \"output\": {\"metrics\": \"%s.jsonl\"}}",
             name, train_extra, stages, name);
    snprintf(file, sizeof file, "%s.json", name);
    return cdp_test_write_file(dir, file, json);
}

/* A file past the file size limit (ulimit -f): an error naming the file and
 * the limit, exit 1, not a silent SIGXFSZ death; with restarts, not one (no
 * device is excluded for it). A limit too small for Open MPI itself is named
 * before the job starts, exit 2. */
Test(jobs, the_file_size_limit_is_named_and_not_restarted, .timeout = 180)
{
    need_mpi();
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    const struct cdp_job_opts o = {.fsize_bytes = 16ull << 20};
    struct cdp_job j;
    struct cdp_run r;
    cr_assert_eq(cdp_test_start(&j, (const char *[]){"-q", "--plan", big_plan(dir, "f", 1, ""), NULL}, &o), 0);
    cdp_test_finish(&j, 60, &r);
    cr_assert_eq(r.exit_code, 1, "exit %d: %s", r.exit_code, r.err);
    cr_assert(strstr(r.err, "File too large") && strstr(r.err, "ulimit -f") && strstr(r.err, "16777216 bytes"), "%s",
              r.err);
    cdp_test_run_free(&r);
    const char *p = big_plan(dir, "g", 2, ", \"restart\": {\"max\": 2, \"exclude_failed\": true}");
    cr_assert_eq(cdp_test_start(&j, (const char *[]){"--plan", p, NULL}, &o), 0);
    cdp_test_finish(&j, 90, &r);
    cr_assert_eq(r.exit_code, 1, "exit %d: %s", r.exit_code, r.err);
    cr_assert(strstr(r.err, "File too large") && strstr(r.err, "not restarting"), "%s", r.err);
    cr_assert(!strstr(r.out, "restart 1:"), "%s", r.out);
    cdp_test_run_free(&r);
    const struct cdp_job_opts tiny = {.fsize_bytes = 40000};
    cr_assert_eq(cdp_test_start(&j, (const char *[]){"--plan", p, NULL}, &tiny), 0);
    cdp_test_finish(&j, 60, &r);
    cr_assert_eq(r.exit_code, 2, "exit %d: %s", r.exit_code, r.err);
    cr_assert(strstr(r.err, "the file size limit (ulimit -f, RLIMIT_FSIZE) is 40000 bytes"), "%s", r.err);
    cdp_test_run_free(&r);
}

/* SIGBUS (a mapped data file that shrank) is named and not restarted. */
Test(jobs, sigbus_is_named_and_not_restarted, .timeout = 120)
{
    need_mpi();
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    const char *p = plan_of(dir, "b", 2, 6, "ck", 2, ", \"restart\": {\"max\": 2, \"exclude_failed\": true}", "");
    setenv("CDP_FAULT", "sigbus:1:3", 1);
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", p, NULL}), 0);
    unsetenv("CDP_FAULT");
    cr_assert_eq(r.exit_code, 1, "exit %d: %s", r.exit_code, r.err);
    cr_assert(strstr(r.err, "SIGBUS (a mapped file shrank or changed") && strstr(r.err, "not restarting"), "%s",
              r.err);
    cr_assert(!strstr(r.out, "restart 1:"), "%s", r.out);
    cdp_test_run_free(&r);
}

/* ---- limits (B8) ------------------------------------------------------------------------ */

/* ulimit -n too small for mpirun and its ranks (it hangs ending a job): a
 * line naming the limit before anything starts, exit 2. */
Test(jobs, the_open_file_limit_is_named, .timeout = 120)
{
    need_mpi();
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    const char *p = plan_of(dir, "n", 2, 4, NULL, 0, "", "");
    struct cdp_job j;
    struct cdp_run r;
    const struct cdp_job_opts files = {.nofile = 24};
    cr_assert_eq(cdp_test_start(&j, (const char *[]){"-q", "--plan", p, NULL}, &files), 0);
    cdp_test_finish(&j, 30, &r);
    cr_assert_eq(r.exit_code, 2, "exit %d: %s", r.exit_code, r.err);
    cr_assert(strstr(r.err, "open-file limit (ulimit -n, RLIMIT_NOFILE) is 24"), "%s", r.err);
    cdp_test_run_free(&r);
}

/* ulimit -v too small for a rank (OpenBLAS waits forever for memory it is
 * refused): named before anything starts, exit 2. AddressSanitizer reserves
 * terabytes of address space at start-up: under a limit of 300 MiB its build
 * cannot start at all, so there this is skipped. */
Test(jobs, the_address_space_limit_is_named_outside_asan_builds, .timeout = 60)
{
    if (CDP_TEST_ASAN) cr_skip_test("an AddressSanitizer build cannot start under ulimit -v 300 MiB");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    struct cdp_job j;
    struct cdp_run r;
    const struct cdp_job_opts space = {.as_bytes = 300ull << 20};
    cr_assert_eq(cdp_test_start(&j, (const char *[]){"-q", "--plan", plan_of(dir, "v", 1, 4, NULL, 0, "", ""), NULL},
                                &space), 0);
    cdp_test_finish(&j, 30, &r);
    cr_assert_eq(r.exit_code, 2, "exit %d: %s", r.exit_code, r.err);
    cr_assert(strstr(r.err, "address-space limit (ulimit -v, RLIMIT_AS) is 300 MiB"), "%s", r.err);
    cdp_test_run_free(&r);
}

/* Inside one allowed CPU (taskset -c 1, a cpuset) a 2-rank plan runs
 * oversubscribed, said so, and a rank binds inside the allowed CPUs, never
 * to one the process may not use. */
Test(jobs, the_allowed_cpus_decide_oversubscription_and_binding, .timeout = 120)
{
    need_mpi();
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2) cr_skip_test("one CPU online: taskset -c 1 is not possible here");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    static const char *const unset[] = {"OMPI_MCA_rmaps_base_oversubscribe", NULL};
    const struct cdp_job_opts one = {.cpus = "1", .unset = unset};
    struct cdp_job j;
    struct cdp_run r;
    cr_assert_eq(cdp_test_start(&j, (const char *[]){"--plan", plan_of(dir, "o", 2, 4, NULL, 0, "", ""), NULL}, &one),
                 0);
    cdp_test_finish(&j, 60, &r);
    cr_assert_eq(r.exit_code, 0, "exit %d: %s", r.exit_code, r.err);
    cr_assert(strstr(r.err, "2 ranks on this host and 1 CPU this process may use (CPUs 1)"), "%s", r.err);
    cdp_test_run_free(&r);
    char *planned = cdp_test_read_file(in(dir, "planned.json"));
    cr_assert(planned && strstr(planned, "\"cpuset\": \"1\"") && !strstr(planned, "\"cpuset\": \"0\""), "%s", planned);
    free(planned);
}

/* A full TMPDIR (a 64 KiB tmpfs, filled): named before the job starts, not
 * left to Open MPI's words. Mounting needs CAP_SYS_ADMIN: skipped without it. */
Test(jobs, a_full_tmpdir_is_named_where_a_tmpfs_can_be_mounted, .timeout = 60)
{
    need_mpi();
    char dir[4096], full[4200];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    snprintf(full, sizeof full, "%s/full", dir);
    cr_assert_eq(mkdir(full, 0755), 0);
    if (mount("tmpfs", full, "tmpfs", 0, "size=64k") != 0)
        cr_skip_test("cannot mount a tmpfs here (%s): a full TMPDIR is not tested", strerror(errno));
    char fill[4300];
    snprintf(fill, sizeof fill, "%s/fill", full);
    FILE *f = fopen(fill, "wb");
    static char block[4096];
    while (f && fwrite(block, 1, sizeof block, f) == sizeof block && fflush(f) == 0) {
    }
    if (f) fclose(f);
    char env[4300];
    snprintf(env, sizeof env, "TMPDIR=%s", full);
    const char *const set[] = {env, NULL};
    const struct cdp_job_opts o = {.set = set};
    struct cdp_job j;
    struct cdp_run r;
    cr_assert_eq(cdp_test_start(&j, (const char *[]){"-q", "--plan", plan_of(dir, "t", 2, 4, NULL, 0, "", ""), NULL},
                                &o), 0);
    cdp_test_finish(&j, 60, &r);
    umount2(full, MNT_DETACH);
    cr_assert_eq(r.exit_code, 1, "exit %d: %s", r.exit_code, r.err);
    cr_assert(strstr(r.err, "TMPDIR") && strstr(r.err, full) && strstr(r.err, "KiB"), "%s", r.err);
    cdp_test_run_free(&r);
}

/* eval_batches past what validation is for: refused by the plan loader. */
Test(jobs, eval_batches_is_bounded)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    const char *p = cdp_test_write_file(dir, "e.json", "{\"model\": {\"preset\": \"gpt\"}, \"train\": {\"eval_batches\": "
                                        "2147483647}, \"cluster\": {\"backend\": \"cpu\"}}");
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--dry-run", "--plan", p, NULL}), 0);
    cr_assert_eq(r.exit_code, 2, "exit %d: %s", r.exit_code, r.out);
    cr_assert(strstr(r.err, "/train/eval_batches") && strstr(r.err, "100000"), "%s", r.err);
    cdp_test_run_free(&r);
}

/* ---- a fresh run, a resume (B6, B9) ---------------------------------------------------- */

/* A fresh run into a folder of another run's checkpoints stops before step 1. */
Test(jobs, a_fresh_run_into_another_runs_checkpoints_stops_before_step_1, .timeout = 60)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    const char *p = plan_of(dir, "r", 1, 4, "ck", 2, "", "");
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"-q", "--plan", p, NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cdp_test_run_free(&r);
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", p, NULL}), 0);
    cr_assert_eq(r.exit_code, 2, "exit %d: %s", r.exit_code, r.err);
    cr_assert(strstr(r.err, "/train/checkpoint/dir") && strstr(r.err, "holds checkpoints of an earlier run") &&
                  strstr(r.err, "step-00000004"), "%s", r.err);
    cr_assert(!strstr(r.out, "step    1"), "%s", r.out);
    cdp_test_run_free(&r);
}

/* A restart of a fresh run that died before writing metrics counts nothing
 * of the metrics.jsonl a previous run left there. */
Test(jobs, a_restart_reads_no_steps_of_a_previous_runs_metrics, .timeout = 120)
{
    need_mpi();
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    char old[8192] = "";
    for (int s = 1; s <= 31; s++) snprintf(old + strlen(old), sizeof old - strlen(old), "{\"step\": %d, \"loss\": 1.0}\n", s);
    cdp_test_write_file(dir, "m.jsonl", old);
    const char *p = plan_of(dir, "m", 2, 6, "ck", 2, ", \"restart\": {\"max\": 1, \"exclude_failed\": false}", "");
    setenv("CDP_FAULT", "kill:1:0@0", 1);
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", p, NULL}), 0);
    unsetenv("CDP_FAULT");
    cr_assert_eq(r.exit_code, 0, "exit %d: %s", r.exit_code, r.err);
    cr_assert(strstr(r.out, "restart 1: rank 1 ("), "%s", r.out);
    cr_assert(!strstr(r.out, "at step 32") && strstr(r.out, "(0 steps lost)"), "%s", r.out);
    cdp_test_run_free(&r);
}

/* A resume under another model of the same shapes, another data seed, another
 * learning rate or a data file changed since is refused naming the key;
 * --resume-allow lets it through. */
Test(jobs, a_resume_under_another_model_or_data_is_refused_naming_the_key, .timeout = 90)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    char text[6000] = "";
    for (int i = 0; i < 120; i++) strcat(text, "the quick brown fox jumps over the lazy dog. ");
    cdp_test_write_file(dir, "corpus.txt", text);
    static const char *const fmt_plan =
        "{\"model\": {\"preset\": \"gpt\", \"vocab\": 256, \"context\": 8, \"layers\": 2, \"heads\": %d, "
        "\"embed\": 16}, \"data\": {\"source\": \"text\", \"path\": \"corpus.txt\", \"seed\": %d}, \"train\": "
        "{\"steps\": %d, \"micro_batch\": 2, \"global_batch\": 4, \"optimizer\": {\"lr\": %s}, \"eval_batches\": 1, "
        "\"checkpoint\": {\"dir\": \"ck\", \"every\": 2}}, \"cluster\": {\"backend\": \"cpu\"}}";
    char json[2048];
    snprintf(json, sizeof json, fmt_plan, 2, 1, 2, "0.01");
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"-q", "--plan", cdp_test_write_file(dir, "w.json", json), NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cdp_test_run_free(&r);
    static const struct {
        int heads, seed;
        const char *lr, *key;
    } bad[] = {{4, 1, "0.01", "/model/heads is 2 in the checkpoint's plan and 4 in this one"},
               {2, 7, "0.01", "/data/seed is 1 in the checkpoint's plan and 7 in this one"},
               {2, 1, "0.02", "/train/optimizer/lr is 0.01 in the checkpoint's plan and 0.02 in this one"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(json, sizeof json, fmt_plan, bad[i].heads, bad[i].seed, 4, bad[i].lr);
        const char *p = cdp_test_write_file(dir, "x.json", json);
        cr_assert_eq(cdp_test_run(&r, (const char *[]){"-q", "--plan", p, "--resume", NULL}), 0);
        cr_assert_eq(r.exit_code, 2, "%s: exit %d: %s", bad[i].key, r.exit_code, r.err);
        cr_assert(strstr(r.err, bad[i].key) && strstr(r.err, "--resume-allow"), "%s", r.err);
        cdp_test_run_free(&r);
    }
    /* the data file replaced by one of the same size */
    for (char *c = text; *c; c++)
        if (*c == 'q') *c = 'Q';
    cdp_test_write_file(dir, "corpus.txt", text);
    snprintf(json, sizeof json, fmt_plan, 2, 1, 4, "0.01");
    const char *same = cdp_test_write_file(dir, "x.json", json);
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"-q", "--plan", same, "--resume", NULL}), 0);
    cr_assert_eq(r.exit_code, 2, "exit %d: %s", r.exit_code, r.err);
    cr_assert(strstr(r.err, "/data/path: ") && strstr(r.err, "is not the file the checkpoint was trained on"), "%s",
              r.err);
    cdp_test_run_free(&r);
    /* what the user says may change, does */
    snprintf(json, sizeof json, fmt_plan, 2, 1, 4, "0.02");
    const char *lr = cdp_test_write_file(dir, "x.json", json);
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"-q", "--plan", lr, "--resume", "--resume-allow",
                                                   "/train/optimizer/lr,/data/path", NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "exit %d: %s", r.exit_code, r.err);
    cdp_test_run_free(&r);
}
