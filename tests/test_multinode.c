/* Suite multinode: jobs over several hosts of a cluster on this machine
 * (tests/cluster/cluster.sh: each host its own network, hostname, /tmp and
 * node-local /mnt; tests/multinode.sh brings it up and runs this program on
 * host 0). Open MPI reaches the hosts through the cluster's rsh agent. What
 * needs no cluster (a step line kept, the words of a stopped job) runs
 * without one; the rest skips when the cluster could not be made. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "harness.h"

/* ---- the cluster -------------------------------------------------------------------- */

static const char *cluster_dir(void)
{
    const char *d = getenv("CDP_CLUSTER_DIR");
    return d && *d ? d : NULL;
}

static void need_cluster(void)
{
    if (!cdp_comm_have_mpi()) cr_skip_test("this build has no MPI");
    if (!cluster_dir()) cr_skip_test("no cluster: %s", getenv("CDP_CLUSTER_WHY") ? getenv("CDP_CLUSTER_WHY") : "?");
}

/* cluster.sh CMD DIR ARGS: pull or plug a cable, kill a host. */
static void cluster(const char *cmd, const char *args)
{
    char line[8192];
    snprintf(line, sizeof line, "'%s' %s '%s' %s", getenv("CDP_CLUSTER"), cmd, cluster_dir(), args);
    cr_assert_eq(system(line), 0, "%s", line);
}

/* Every host back as it was (a test that pulled a cable or killed a host
 * leaves them dead otherwise). */
static double now_s(void);

static void restore_hosts(void)
{
    if (!cluster_dir()) return;
    const double t0 = now_s();
    for (int k = 0; k < 3; k++) {
        char a[32];
        snprintf(a, sizeof a, "%d", k);
        cluster("revive", a);
    }
    fprintf(stderr, "multinode: hosts restored in %.1f s\n", now_s() - t0);
}

/* A hostfile of hosts h0..h(n-1) in dir. */
static const char *hostfile(const char *dir, int n)
{
    char text[128] = "";
    for (int k = 0; k < n; k++) snprintf(text + strlen(text), sizeof text - strlen(text), "h%d\n", k);
    return cdp_test_write_file(dir, "hosts", text);
}

/* ---- plans and runs --------------------------------------------------------------- */

/* An MLP on `stages` x 2 replicas over `nodes` nodes (2 ranks each), steps
 * steps; extra: more "train" keys ("" for none). dir/NAME.json, outputs
 * beside it (absolute paths: every host sees dir). */
static const char *mlp_plan(const char *dir, const char *name, int stages, int nodes, int steps, int timeout_s,
                            const char *extra)
{
    char json[20000], file[96];
    snprintf(json, sizeof json,
             "{\"model\": {\"preset\": \"mlp\", \"input\": [24], \"hidden\": [64, 48, 32, 32], \"classes\": 5}, "
             "\"data\": {\"source\": \"synthetic\", \"seed\": 5}, \"train\": {\"steps\": %d, \"micro_batch\": 3, "
             "\"optimizer\": {\"type\": \"sgd\"}, \"log_every\": 1, \"timeout_s\": %d%s}, "
             "\"parallel\": {\"stages\": %d, \"replicas\": 2, \"micro_batches\": 2, \"schedule\": \"1f1b\"}, "
             "\"cluster\": {\"backend\": \"cpu\"%s%.0d}, "
             "\"output\": {\"metrics\": \"%s/%s.jsonl\", \"weights\": \"%s/%s.safetensors\"}}",
             steps, timeout_s, extra, stages, nodes ? ", \"nodes\": " : "", nodes, dir, name, dir, name);
    snprintf(file, sizeof file, "%s.json", name);
    return cdp_test_write_file(dir, file, json);
}

/* A run in the background: stdout and stderr to files in dir. */
struct job {
    pid_t pid;
    char out[4200], err[4200];
    double t0;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* argv: the arguments of cdphybrid, or with prog not NULL, of prog (argv[0] included). */
static void job_exec(struct job *j, const char *dir, const char *name, const char *prog, const char *const *argv);

static void job_start(struct job *j, const char *dir, const char *name, const char *const *argv)
{
    job_exec(j, dir, name, NULL, argv);
}

static void job_exec(struct job *j, const char *dir, const char *name, const char *prog, const char *const *argv)
{
    snprintf(j->out, sizeof j->out, "%s/%s.out", dir, name);
    snprintf(j->err, sizeof j->err, "%s/%s.err", dir, name);
    j->t0 = now_s();
    j->pid = fork();
    cr_assert_geq(j->pid, 0);
    if (j->pid == 0) {
        const int in = open("/dev/null", O_RDONLY), o = open(j->out, O_WRONLY | O_CREAT | O_TRUNC, 0644),
                  e = open(j->err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(in, 0);
        dup2(o, 1);
        dup2(e, 2);
        size_t n = 0;
        while (argv[n]) n++;
        if (prog) {
            execvp(prog, (char *const *)argv);
            _exit(127);
        }
        char **args = calloc(n + 2, sizeof *args);
        args[0] = getenv("CDP_BIN");
        for (size_t i = 0; i < n; i++) args[i + 1] = (char *)argv[i];
        execv(args[0], args);
        _exit(127);
    }
}

/* Waits for the job at most limit_s seconds (then kills it: 137); its exit code. */
static int job_wait(struct job *j, double limit_s)
{
    int status = 0;
    for (;;) {
        const pid_t w = waitpid(j->pid, &status, WNOHANG);
        if (w == j->pid) break;
        if (now_s() - j->t0 > limit_s) {
            kill(j->pid, SIGKILL);
            waitpid(j->pid, &status, 0);
            break;
        }
        usleep(50000);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void need_slurm(void)
{
    need_cluster();
    if (!getenv("SLURM_CONF")) cr_skip_test("no Slurm: %s", getenv("CDP_SLURM_WHY") ? getenv("CDP_SLURM_WHY") : "?");
}

/* salloc -N nodes --ntasks-per-node 2 --no-kill PROGRAM ARGS... (cdphybrid
 * when argv[0] is NULL) started in the background (--no-kill: the allocation
 * outlives a node that fails, so that a job can go on without it). */
static void salloc_start(struct job *j, const char *dir, const char *name, int nodes, const char *const *argv)
{
    const char *v[32];
    char n[16];
    snprintf(n, sizeof n, "%d", nodes);
    int k = 0;
    v[k++] = "salloc";
    v[k++] = "-N";
    v[k++] = n;
    v[k++] = "--ntasks-per-node";
    v[k++] = "2";
    v[k++] = "--no-kill";
    v[k++] = "--quiet";
    v[k++] = argv[0] ? argv[0] : getenv("CDP_BIN");
    for (int i = 1; argv[i] && k < 31; i++) v[k++] = argv[i];
    v[k] = NULL;
    job_exec(j, dir, name, "salloc", v);
}

/* salloc_start, waited for at most limit_s; its output in *out and *err. */
static int salloc_run(const char *dir, const char *name, int nodes, const char *const *argv, double limit_s,
                      char **out, char **err)
{
    struct job j;
    salloc_start(&j, dir, name, nodes, argv);
    const int code = job_wait(&j, limit_s);
    *out = cdp_test_read_file(j.out);
    *err = cdp_test_read_file(j.err);
    if (!*out) *out = strdup("");
    if (!*err) *err = strdup("");
    return code;
}

/* The last step metrics.jsonl records (-1: none yet). */
static int last_step(const char *metrics)
{
    char *text = cdp_test_read_file(metrics);
    int last = -1;
    for (char *line = text ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        json_error_t e;
        json_t *o = json_loads(line, 0, &e);
        json_t *s = o ? json_object_get(o, "step") : NULL;
        if (s && json_is_integer(s) && !json_object_get(o, "restart")) last = (int)json_integer_value(s);
        json_decref(o);
    }
    free(text);
    return last;
}

/* Waits until metrics records step `step` (at most limit_s). */
static void wait_for_step(const struct job *j, const char *metrics, int step, double limit_s)
{
    while (last_step(metrics) < step) {
        int status;
        cr_assert_eq(waitpid(j->pid, &status, WNOHANG), 0, "the job ended before step %d", step);
        cr_assert_lt(now_s() - j->t0, limit_s, "no step %d in %s after %.0f s", step, metrics, limit_s);
        usleep(20000);
    }
}

/* The losses of the step records (the last record of each step) and the
 * layout record's ranks (new reference, or NULL). */
static int losses_of(const char *metrics, double *loss, int cap, json_t **ranks)
{
    char *text = cdp_test_read_file(metrics);
    cr_assert_not_null(text, "%s was not written", metrics);
    int n = 0;
    if (ranks) *ranks = NULL;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        json_error_t e;
        json_t *o = json_loads(line, 0, &e);
        cr_assert_not_null(o, "%s: not JSON: %s", metrics, line);
        json_t *s = json_object_get(o, "step"), *lay = json_object_get(o, "layout");
        if (lay && ranks) {
            json_decref(*ranks);
            *ranks = json_incref(json_object_get(lay, "ranks"));
        }
        if (s && json_object_get(o, "loss") && !json_object_get(o, "restart")) {
            const int k = (int)json_integer_value(s) - 1;
            if (k >= 0 && k < cap) {
                loss[k] = json_real_value(json_object_get(o, "loss"));
                if (k + 1 > n) n = k + 1;
            }
        }
        json_decref(o);
    }
    free(text);
    return n;
}

static char *read_all(const char *path)
{
    char *t = cdp_test_read_file(path);
    return t ? t : strdup("");
}

/* ---- training over hosts ------------------------------------------------------------ */

/* n hosts, stages x 2 replicas (2 ranks per host) under mpirun through the
 * rsh agent: every rank on the host of its layout node (hostnames in
 * metrics.jsonl), and losses and weights bitwise those of the same layout on
 * one host. */
static void trains_as_one_host(int n, int slurm)
{
    if (slurm) need_slurm();
    else need_cluster();
    char dir[4096], plan[4200], one[4200], hosts[4200], path[4400], path1[4400];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    snprintf(hosts, sizeof hosts, "%s", hostfile(dir, n));
    snprintf(plan, sizeof plan, "%s", mlp_plan(dir, "hosts", n, n, 4, 30, ""));
    snprintf(one, sizeof one, "%s", mlp_plan(dir, "one", n, 1, 4, 30, ""));
    struct cdp_run r;
    if (slurm) {
        char *out, *err;
        const int code = salloc_run(dir, "salloc", n, (const char *[]){NULL, "--plan", plan, NULL}, 120, &out, &err);
        cr_assert_eq(code, 0, "%s\n%s", out, err);
        free(out);
        free(err);
    } else {
        cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", plan, "--hostfile", hosts, NULL}), 0);
        cr_assert_eq(r.exit_code, 0, "%s\n%s", r.out, r.err);
        cdp_test_run_free(&r);
    }
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", one, NULL}), 0);
    cr_assert_eq(r.exit_code, 0, "%s\n%s", r.out, r.err);
    cdp_test_run_free(&r);
    double la[8], lb[8];
    json_t *ranks = NULL;
    snprintf(path, sizeof path, "%s/hosts.jsonl", dir);
    snprintf(path1, sizeof path1, "%s/one.jsonl", dir);
    cr_assert_eq(losses_of(path, la, 8, &ranks), 4);
    cr_assert_eq(losses_of(path1, lb, 8, NULL), 4);
    for (int i = 0; i < 4; i++) cr_expect_eq(la[i], lb[i], "step %d: %.17g on %d hosts, %.17g on one", i + 1, la[i], n, lb[i]);
    snprintf(path, sizeof path, "%s/hosts.safetensors", dir);
    snprintf(path1, sizeof path1, "%s/one.safetensors", dir);
    cr_expect_eq(cdp_test_files_differ(path, path1), -1, "the weights after 4 steps are those of one host");
    /* placement: rank i on node i / 2, which runs on host h(i / 2) */
    cr_assert_eq(json_array_size(ranks), (size_t)(2 * n));
    for (size_t i = 0; i < json_array_size(ranks); i++) {
        json_t *k = json_array_get(ranks, i);
        char want[32];
        snprintf(want, sizeof want, "h%d", (int)(i / 2));
        cr_expect_eq(json_integer_value(json_object_get(k, "node")), (json_int_t)(i / 2), "rank %zu: node", i);
        const char *h = json_string_value(json_object_get(k, "host"));
        cr_expect(h && !strcmp(h, want), "rank %zu ran on %s, not %s", i, h ? h : "(no host)", want);
    }
    json_decref(ranks);
}

Test(multinode, two_hosts_under_mpirun_train_as_one_host, .timeout = 120) { trains_as_one_host(2, 0); }
Test(multinode, three_hosts_under_mpirun_train_as_one_host, .timeout = 120) { trains_as_one_host(3, 0); }
Test(multinode, two_hosts_under_srun_train_as_one_host, .timeout = 180) { trains_as_one_host(2, 1); }
Test(multinode, three_hosts_under_srun_train_as_one_host, .timeout = 180) { trains_as_one_host(3, 1); }

/* A plan that does not say how many nodes, started in a Slurm allocation of
 * 2: planned on both (it was planned on one, --nodes 1). */
Test(multinode, a_plan_without_nodes_uses_the_allocation, .timeout = 180)
{
    need_slurm();
    char dir[4096], plan[4200], path[4400], *out, *err;
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    snprintf(plan, sizeof plan, "%s", mlp_plan(dir, "alloc", 2, 0, 2, 30, ""));
    const int code = salloc_run(dir, "alloc", 2, (const char *[]){NULL, "--plan", plan, NULL}, 120, &out, &err);
    cr_assert_eq(code, 0, "%s\n%s", out, err);
    free(out);
    free(err);
    double loss[4];
    json_t *ranks = NULL;
    snprintf(path, sizeof path, "%s/alloc.jsonl", dir);
    cr_assert_eq(losses_of(path, loss, 4, &ranks), 2);
    cr_assert_eq(json_array_size(ranks), 4);
    const char *h = json_string_value(json_object_get(json_array_get(ranks, 3), "host"));
    cr_expect(h && !strcmp(h, "h1"), "rank 3 on the allocation's second node, not %s", h ? h : "?");
    json_decref(ranks);
}

/* Tasks that srun started without PMIx (MpiDefault=none): each would be a
 * launcher and run srun again inside the step, a deadlock; refused at once. */
Test(multinode, tasks_started_without_pmix_are_refused, .timeout = 180)
{
    need_slurm();
    char dir[4096], plan[4200], *out, *err;
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    snprintf(plan, sizeof plan, "%s", mlp_plan(dir, "nompi", 2, 2, 2, 30, ""));
    const int code = salloc_run(dir, "nompi", 2,
                                (const char *[]){"srun", "--mpi=none", "-n", "4", getenv("CDP_BIN"), "--plan", plan,
                                                 NULL}, 90, &out, &err);
    cr_expect_neq(code, 0, "%s", err);
    cr_expect_neq(code, 137, "no deadlock: %s", err);
    cr_expect(strstr(err, "started without PMIx"), "%s", err);
    free(out);
    free(err);
}

/* ---- failures ----------------------------------------------------------------------- */

/* A plan of 3 hosts that restarts and checkpoints every 2 steps. */
static const char *restart_plan(const char *dir, const char *name, int steps, int timeout_s, int restart)
{
    char extra[8192];
    snprintf(extra, sizeof extra, ", \"checkpoint\": {\"dir\": \"%s/ckpt-%s\", \"every\": 2}%s", dir, name,
             restart ? ", \"restart\": {\"max\": 2, \"exclude_failed\": true}" : "");
    return mlp_plan(dir, name, 3, 3, steps, timeout_s, extra);
}

/* A rank killed on host 1: the job is planned again without it and finishes
 * (under mpirun with a hostfile, or under srun in a Slurm allocation). */
static void rank_killed_on_host_1(int slurm)
{
    if (slurm) need_slurm();
    else need_cluster();
    char dir[4096], plan[4200], hosts[4200], *out, *err;
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    snprintf(hosts, sizeof hosts, "%s", hostfile(dir, 3));
    snprintf(plan, sizeof plan, "%s", restart_plan(dir, "kill", 6, 20, 1));
    setenv("CDP_FAULT", "kill:3:4@0", 1); /* rank 3: node 1, host h1 */
    int code;
    if (slurm) {
        code = salloc_run(dir, "kill", 3, (const char *[]){NULL, "--plan", plan, NULL}, 150, &out, &err);
    } else {
        struct cdp_run r;
        cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", plan, "--hostfile", hosts, NULL}), 0);
        code = r.exit_code;
        out = strdup(r.out ? r.out : "");
        err = strdup(r.err ? r.err : "");
        cdp_test_run_free(&r);
    }
    unsetenv("CDP_FAULT");
    cr_assert_eq(code, 0, "%s\n%s", out, err);
    cr_expect(strstr(out, "restart 1: rank 3 (") && strstr(out, ", node 1, device 3) died"), "%s", out);
    cr_expect(strstr(err, "on node 1 (h1) died"), "the host is named: %s", err);
    free(out);
    free(err);
    char path[4400];
    snprintf(path, sizeof path, "%s/kill.jsonl", dir);
    cr_expect_eq(last_step(path), 6);
}

Test(multinode, a_rank_killed_on_host_1_is_restarted_around, .timeout = 180) { rank_killed_on_host_1(0); }
Test(multinode, a_rank_killed_on_host_1_under_srun_is_restarted_around, .timeout = 180) { rank_killed_on_host_1(1); }

/* Pulls host 1's cable (or kills host 1) at step 2 of a 3-host job that
 * stalls there; returns the exit code and the seconds from the cut to the end
 * of the job (restart 0) or to the restart line (restart 1). */
static int cut_at_step_2(const char *dir, const char *name, int restart, int kill_host, int slurm, double *after_cut,
                         char **out, char **err)
{
    char plan[4200], hosts[4200], metrics[4400];
    snprintf(hosts, sizeof hosts, "%s", hostfile(dir, 3));
    snprintf(plan, sizeof plan, "%s", restart_plan(dir, name, 8, 4, restart));
    snprintf(metrics, sizeof metrics, "%s/%s.jsonl", dir, name);
    setenv("CDP_FAULT", "stall:0:3:2@0", 1); /* a window to cut in */
    struct job j;
    if (slurm) salloc_start(&j, dir, name, 3, (const char *[]){NULL, "--plan", plan, NULL});
    else job_start(&j, dir, name, (const char *[]){"--plan", plan, "--hostfile", hosts, NULL});
    unsetenv("CDP_FAULT");
    wait_for_step(&j, metrics, 2, 60);
    cluster(kill_host ? "kill" : "cable", kill_host ? "1" : "1 down");
    const double cut = now_s();
    int code;
    if (!restart) {
        code = job_wait(&j, 300);
        *after_cut = now_s() - cut;
    } else {
        *after_cut = -1;
        for (;;) {
            char *o = read_all(j.out);
            const int seen = strstr(o, "restart 1:") != NULL;
            free(o);
            if (seen && *after_cut < 0) *after_cut = now_s() - cut;
            int status;
            if (waitpid(j.pid, &status, WNOHANG) == j.pid) {
                code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                break;
            }
            if (now_s() - cut > 300) {
                kill(j.pid, SIGKILL);
                waitpid(j.pid, &status, 0);
                code = 137;
                break;
            }
            usleep(50000);
        }
    }
    *out = read_all(j.out);
    *err = read_all(j.err);
    return code;
}

/* The grace the launcher gives a job after a rank failed (LAUNCH_GRACE_S),
 * and the time a host has to answer (PROBE_TIMEOUT_S + 2): what a cut costs
 * beyond timeout_s. The bound below adds SLACK_S for a loaded machine: it
 * tells "ended by the launcher" from "waited for TCP" (about 16 minutes),
 * not one speed from another. */
#define GRACE_S (10 + 7)
#define SLACK_S 30

/* A cable pulled: the ranks time out at timeout_s (4 s), the launcher ends
 * mpirun (which waits for the cut host's daemon) and names the host. (Under
 * srun the same path: the test with restart below checks it there.) */
Test(multinode, a_pulled_cable_ends_the_job_naming_the_host, .timeout = 240, .fini = restore_hosts)
{
    need_cluster();
    char dir[4096], *out, *err;
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    double t;
    const int code = cut_at_step_2(dir, "cable", 0, 0, 0, &t, &out, &err);
    fprintf(stderr, "multinode: cable pulled: the job ended %.1f s later\n", t);
    cr_expect_eq(code, 1, "%s", err);
    cr_expect_lt(t, 4 + GRACE_S + SLACK_S, "the job ended %.1f s after the cut (timeout_s 4 + grace %d)", t, GRACE_S);
    cr_expect(strstr(err, "host h1 (node 1) does not answer"), "%s", err);
    free(out);
    free(err);
}

/* A cable pulled or a whole host killed (every process on it, its cable
 * with it) with restart on: within timeout_s + the grace, the host named and
 * planned again on the hosts that answer, node 1 told as lost (not a healthy rank of another node that was computing when
 * the job was stopped), and no rank on h1 after the restart. */
static void cut_is_restarted_around(int kill_host, int slurm)
{
    if (slurm) need_slurm();
    else need_cluster();
    char dir[4096], *out, *err, path[4400];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    double t;
    const int code = cut_at_step_2(dir, "cut", 1, kill_host, slurm, &t, &out, &err);
    fprintf(stderr, "multinode: %s%s: the restart line came %.1f s later\n", kill_host ? "host killed" : "cable pulled",
            slurm ? " (srun)" : "", t);
    cr_expect_eq(code, 0, "%s\n%s", out, err);
    cr_expect(strstr(out, "restart 1: node 1 lost"), "%s\n%s", out, err);
    cr_expect(strstr(err, "host h1 (node 1) does not answer"), "the host is named: %s", err);
    cr_expect(t > 0 && t < 4 + GRACE_S + SLACK_S, "restart line %.1f s after the cut", t);
    snprintf(path, sizeof path, "%s/cut.jsonl", dir);
    cr_expect_eq(last_step(path), 8);
    /* after the restart no rank runs on h1 */
    char *text = read_all(path), *restart = strstr(text, "\"restart\"");
    cr_expect(restart && !strstr(restart, "\"host\": \"h1\""), "h1 is not used after the restart: %s\n%s", out,
              restart ? restart : text);
    free(text);
    free(out);
    free(err);
}

Test(multinode, a_pulled_cable_is_restarted_around_on_the_survivors, .timeout = 240, .fini = restore_hosts)
{
    cut_is_restarted_around(0, 0);
}

Test(multinode, a_killed_host_is_restarted_around, .timeout = 240, .fini = restore_hosts)
{
    cut_is_restarted_around(1, 0);
}

Test(multinode, a_pulled_cable_under_srun_is_restarted_around_on_the_survivors, .timeout = 240,
     .fini = restore_hosts)
{
    cut_is_restarted_around(0, 1);
}

Test(multinode, a_killed_host_under_srun_is_restarted_around, .timeout = 240, .fini = restore_hosts)
{
    cut_is_restarted_around(1, 1);
}

/* A checkpoint folder on each host's own disk (/mnt is node-local here):
 * refused at the start, naming it (it was committed with host 0's part only). */
Test(multinode, a_node_local_checkpoint_folder_is_refused, .timeout = 120)
{
    need_cluster();
    char dir[4096], plan[4200], hosts[4200], extra[256];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    snprintf(hosts, sizeof hosts, "%s", hostfile(dir, 2));
    snprintf(extra, sizeof extra, ", \"checkpoint\": {\"dir\": \"/mnt/ckpt-%d\", \"every\": 2}", (int)getpid());
    snprintf(plan, sizeof plan, "%s", mlp_plan(dir, "local", 2, 2, 2, 20, extra));
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", plan, "--hostfile", hosts, NULL}), 0);
    cr_expect_eq(r.exit_code, 2, "%s\n%s", r.out, r.err);
    char want[128];
    snprintf(want, sizeof want, "/mnt/ckpt-%d (/train/checkpoint/dir) is not one folder on every host", (int)getpid());
    cr_expect(strstr(r.err, want), "%s", r.err);
    cr_expect(strstr(r.err, "not seen on h1"), "%s", r.err);
    cdp_test_run_free(&r);
}

/* A file only host 0 sees (planned.json in node-local /mnt): the ranks of
 * host 1 say so, with their host (errors of ranks but 0 were silenced). */
Test(multinode, an_error_on_another_host_is_told, .timeout = 120)
{
    need_cluster();
    char dir[4096], plan[4200], hosts[4200], json[2048];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    snprintf(hosts, sizeof hosts, "%s", hostfile(dir, 2));
    snprintf(json, sizeof json,
             "{\"model\": {\"preset\": \"mlp\", \"input\": [24], \"hidden\": [32, 32], \"classes\": 5}, "
             "\"train\": {\"steps\": 1, \"micro_batch\": 3, \"optimizer\": {\"type\": \"sgd\"}, \"timeout_s\": 20}, "
             "\"parallel\": {\"stages\": 2, \"replicas\": 2, \"micro_batches\": 2}, "
             "\"cluster\": {\"backend\": \"cpu\", \"nodes\": 2}, \"output\": {\"metrics\": \"/mnt/run-%d/m.jsonl\"}}",
             (int)getpid());
    snprintf(plan, sizeof plan, "%s", cdp_test_write_file(dir, "unseen.json", json));
    char local[64];
    snprintf(local, sizeof local, "/mnt/run-%d", (int)getpid());
    mkdir(local, 0755); /* on host 0 only */
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", plan, "--hostfile", hosts, NULL}), 0);
    cr_expect_eq(r.exit_code, 2, "%s\n%s", r.out, r.err);
    char want[128];
    snprintf(want, sizeof want, "rank 2 on h1: /mnt/run-%d/planned.json", (int)getpid());
    cr_expect(strstr(r.err, want), "no \"%s\" in: %s", want, r.err);
    cdp_test_run_free(&r);
}

/* What the environment says reaches the ranks on other hosts (the rsh agent
 * gives them a fresh one): CDP_LOG here, an info line from host 1's rank. */
Test(multinode, the_environment_reaches_other_hosts, .timeout = 120)
{
    need_cluster();
    char dir[4096], plan[4200], hosts[4200];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    snprintf(hosts, sizeof hosts, "%s", hostfile(dir, 2));
    snprintf(plan, sizeof plan, "%s", mlp_plan(dir, "env", 2, 2, 1, 20, ""));
    setenv("CDP_LOG", "info", 1);
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", plan, "--hostfile", hosts, NULL}), 0);
    unsetenv("CDP_LOG");
    cr_assert_eq(r.exit_code, 0, "%s\n%s", r.out, r.err);
    cr_expect(strstr(r.err, "rank 3 (stage 1, replica 1) on node 1"), "no info line of rank 3: %s", r.err);
    cdp_test_run_free(&r);
}

/* ---- batch jobs: scancel, a time limit, a requeue ------------------------------------ */

/* SLURM command (squeue, scancel, sbatch...) on host 0, its first line of output in out. */
static int slurm_cmd(const char *cmd, char *out, size_t cap)
{
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p, "%s", cmd);
    if (!out) {
        char sink[256];
        while (fgets(sink, sizeof sink, p)) {
        }
    } else if (!fgets(out, (int)cap, p)) {
        out[0] = '\0';
    }
    const int rc = pclose(p);
    if (out) out[strcspn(out, "\n")] = '\0';
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* The requeue script of docs/multinode.md for a plan of 2 nodes: sbatch
 * OPTIONS of it; the job's id in id. */
static void sbatch_job(const char *dir, const char *plan, const char *options, char *id, size_t cap)
{
    char script[8192], cmd[12000];
    snprintf(script, sizeof script,
             "#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=2\n#SBATCH --requeue --open-mode=append\n"
             "#SBATCH --signal=B:TERM@50\n# the same line on the first run and every requeue\n"
             "exec '%s' --plan '%s' --resume auto\n", getenv("CDP_BIN"), plan);
    const char *file = cdp_test_write_file(dir, "job.sh", script);
    snprintf(cmd, sizeof cmd, "sbatch --parsable --output '%s/job.log' %s '%s'", dir, options, file);
    cr_assert_eq(slurm_cmd(cmd, id, cap), 0, "%s: %s", cmd, id);
    cr_assert(id[0], "sbatch gave no job id");
}

/* Waits until job id has left squeue's list of running and pending jobs (at most limit_s). */
static void wait_job_gone(const char *id, double limit_s)
{
    const double t0 = now_s();
    char cmd[256], state[128];
    snprintf(cmd, sizeof cmd, "squeue -h -j %s -t PD,R,CG,S,CF,RQ,RS -o %%T 2>/dev/null", id);
    for (;;) {
        slurm_cmd(cmd, state, sizeof state);
        if (!state[0]) return;
        cr_assert_lt(now_s() - t0, limit_s, "job %s still %s after %.0f s", id, state, limit_s);
        usleep(200000);
    }
}

/* Waits for metrics to record step `step` while job id runs (at most limit_s). */
static void wait_job_step(const char *id, const char *metrics, int step, double limit_s)
{
    const double t0 = now_s();
    while (last_step(metrics) < step) {
        cr_assert_lt(now_s() - t0, limit_s, "job %s: no step %d in %s after %.0f s", id, step, metrics, limit_s);
        usleep(50000);
    }
}

/* A 2-node plan of steps steps that checkpoints every 2 (timeout_s long: a
 * rank stalled by CDP_FAULT keeps the others waiting). */
static const char *batch_plan(const char *dir, const char *name, int steps)
{
    char extra[8192];
    snprintf(extra, sizeof extra, ", \"checkpoint\": {\"dir\": \"%s/ckpt\", \"every\": 2}", dir);
    return mlp_plan(dir, name, 2, 2, steps, 200, extra);
}

/* scancel: the job ends as a stop (said so, exit 143, no "died"), every step
 * line in the log whole, the checkpoint of step 2 committed and intact; the
 * job requeued runs the same line and --resume auto continues from it. */
Test(multinode, a_batch_job_cancelled_ends_cleanly_and_continues_when_requeued, .timeout = 240)
{
    need_slurm();
    char dir[4096], plan[4200], metrics[4400], log[4400], id[64], cmd[256], path[4400];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    snprintf(plan, sizeof plan, "%s", batch_plan(dir, "cancel", 6));
    snprintf(metrics, sizeof metrics, "%s/cancel.jsonl", dir);
    snprintf(log, sizeof log, "%s/job.log", dir);
    setenv("CDP_FAULT", "stall:0:3:5", 1); /* a window to cancel in, at every run */
    sbatch_job(dir, plan, "", id, sizeof id);
    unsetenv("CDP_FAULT");
    wait_job_step(id, metrics, 2, 90);
    /* cancelled inside step 3's stall, once step 2's checkpoint is committed (its
     * metrics line can come before the commit does) */
    snprintf(path, sizeof path, "%s/ckpt/step-00000002/manifest.json", dir);
    for (const double t0 = now_s(); access(path, R_OK) != 0; usleep(50000))
        cr_assert_lt(now_s() - t0, 60, "step 2's checkpoint was not committed in 60 s");
    snprintf(cmd, sizeof cmd, "scancel %s", id);
    cr_assert_eq(slurm_cmd(cmd, NULL, 0), 0, "%s", cmd);
    wait_job_gone(id, 60);
    char *text = read_all(log);
    cr_expect(strstr(text, "stopped by SIGTERM"), "the stop is told as one: %s", text);
    cr_expect(!strstr(text, "died"), "no rank died: %s", text);
    cr_expect(strstr(text, "step 2/6"), "step 2's line is there: %s", text);
    const size_t n = strlen(text);
    cr_expect(n > 0 && text[n - 1] == '\n', "no line is cut: [%s]", text);
    free(text);
    snprintf(path, sizeof path, "%s/ckpt/step-00000002/manifest.json", dir);
    cr_expect_eq(access(path, R_OK), 0, "step 2's checkpoint is committed");
    /* requeued: the same script again, appending to the log */
    snprintf(cmd, sizeof cmd, "scontrol requeue %s", id);
    cr_assert_eq(slurm_cmd(cmd, NULL, 0), 0, "%s", cmd);
    /* (Slurm holds a requeued job back two minutes: let it start now, and again
     * while it is pending, since a requeue still being processed can set the
     * hold after the first update) */
    char start[256], pending[256], state[128];
    snprintf(start, sizeof start, "scontrol update jobid=%s StartTime=now", id);
    snprintf(pending, sizeof pending, "squeue -h -j %s -o %%T 2>/dev/null", id);
    cr_assert_eq(slurm_cmd(start, NULL, 0), 0, "%s", start);
    const double t0 = now_s();
    double nudged = t0;
    while (!strstr((text = read_all(log)), "step 6/6")) {
        free(text);
        cr_assert_lt(now_s() - t0, 150, "the requeued job did not reach step 6: %s", read_all(log));
        if (now_s() - nudged > 3) {
            slurm_cmd(pending, state, sizeof state);
            if (!strcmp(state, "PENDING")) slurm_cmd(start, NULL, 0);
            nudged = now_s();
        }
        usleep(200000);
    }
    free(text);
    wait_job_gone(id, 60);
    text = read_all(log);
    const char *stop = strstr(text, "stopped by SIGTERM");
    cr_expect(stop && strstr(stop, "step 3/6"), "the requeued run continues after step 2: %s", text);
    free(text);
    cr_expect_eq(last_step(metrics), 6);
}

/* A time limit with the script's --signal=B:TERM@50: the batch shell (the
 * script exec's cdphybrid) gets SIGTERM before the limit, the ranks save the
 * step under way and end: "stopped by SIGTERM ... checkpoint saved", exit 143,
 * before Slurm kills anything. */
Test(multinode, a_batch_job_at_its_time_limit_saves_and_stops, .timeout = 240)
{
    need_slurm();
    char dir[4096], plan[4200], metrics[4400], log[4400], id[64], path[4400];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    snprintf(plan, sizeof plan, "%s", batch_plan(dir, "limit", 6));
    snprintf(metrics, sizeof metrics, "%s/limit.jsonl", dir);
    snprintf(log, sizeof log, "%s/job.log", dir);
    setenv("CDP_FAULT", "stall:0:3:150", 1); /* in step 3 until the signal comes */
    sbatch_job(dir, plan, "--time=1", id, sizeof id);
    unsetenv("CDP_FAULT");
    wait_job_gone(id, 150);
    char *text = read_all(log);
    /* the step under way when the signal came (3, where rank 0 stalls, unless
     * the signal came sooner on a slow start) */
    const char *said = strstr(text, "cdphybrid: stopped by SIGTERM: the job's 4 ranks (srun) ended after step ");
    cr_expect(said, "%s", text);
    const int step = said ? atoi(said + strlen("cdphybrid: stopped by SIGTERM: the job's 4 ranks (srun) ended after step "))
                          : -1;
    cr_expect(said && strstr(said, ": checkpoint saved in"), "%s", text);
    /* (slurmstepd's "*** JOB N ON h0 CANCELLED AT ... ***" comes with the signal itself) */
    cr_expect(!strstr(text, "died") && !strstr(text, "DUE TO TIME LIMIT"), "%s", text);
    free(text);
    snprintf(path, sizeof path, "%s/ckpt/step-%08d/manifest.json", dir, step);
    cr_expect(step > 0 && access(path, R_OK) == 0, "the step under way (%d) is saved", step);
    cr_expect_eq(last_step(metrics), step);
}

/* ---- what needs no cluster ---------------------------------------------------------- */

/* Step lines are written whole as they come: a job killed after step 2 has
 * its line (stdout to a file is fully buffered: it had none, or half a one). */
Test(multinode, step_lines_are_not_lost_when_a_job_is_killed, .timeout = 60)
{
    char dir[4096], plan[4200], metrics[4400], json[12000];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    snprintf(json, sizeof json,
             "{\"model\": {\"preset\": \"mlp\", \"input\": [24], \"hidden\": [32, 32], \"classes\": 5}, "
             "\"train\": {\"steps\": 5, \"micro_batch\": 3, \"optimizer\": {\"type\": \"sgd\"}, \"log_every\": 1}, "
             "\"cluster\": {\"backend\": \"cpu\"}, \"output\": {\"metrics\": \"%s/kept.jsonl\"}}", dir);
    snprintf(plan, sizeof plan, "%s", cdp_test_write_file(dir, "kept.json", json));
    snprintf(metrics, sizeof metrics, "%s/kept.jsonl", dir);
    setenv("CDP_FAULT", "stall:0:3:30", 1);
    struct job j;
    job_start(&j, dir, "kept", (const char *[]){"--plan", plan, NULL});
    unsetenv("CDP_FAULT");
    wait_for_step(&j, metrics, 2, 30);
    usleep(200000);
    kill(j.pid, SIGKILL);
    job_wait(&j, 30);
    char *out = read_all(j.out);
    cr_expect(strstr(out, "step 2/5"), "the step 2 line is kept: [%s]", out);
    const size_t n = strlen(out);
    cr_expect(n > 0 && out[n - 1] == '\n', "no line is cut: [%s]", out);
    free(out);
}

/* A job stopped by SIGTERM (scancel, a time limit) says so, not "a rank died",
 * and is not restarted. */
Test(multinode, a_job_stopped_by_sigterm_says_so, .timeout = 120)
{
    if (!cdp_comm_have_mpi()) cr_skip_test("this build has no MPI");
    char dir[4096], plan[4200], metrics[4400], extra[8192];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    snprintf(extra, sizeof extra, ", \"checkpoint\": {\"dir\": \"%s/ckpt\", \"every\": 2}, \"restart\": {\"max\": 2}",
             dir);
    snprintf(plan, sizeof plan, "%s", mlp_plan(dir, "term", 2, 1, 6, 30, extra));
    snprintf(metrics, sizeof metrics, "%s/term.jsonl", dir);
    setenv("CDP_FAULT", "stall:0:3:20", 1);
    struct job j;
    job_start(&j, dir, "term", (const char *[]){"--plan", plan, NULL});
    unsetenv("CDP_FAULT");
    wait_for_step(&j, metrics, 2, 60);
    usleep(300000);
    kill(j.pid, SIGTERM);
    const int code = job_wait(&j, 60);
    char *out = read_all(j.out), *err = read_all(j.err);
    cr_expect_eq(code, 128 + SIGTERM, "%s", err);
    cr_expect(strstr(err, "stopped by SIGTERM"), "%s", err);
    cr_expect(!strstr(err, "died"), "no rank died: %s", err);
    cr_expect(!strstr(out, "restart 1:"), "not restarted: %s", out);
    free(out);
    free(err);
}

/* --resume auto: from the start while the folder holds no checkpoint, then
 * from its newest (an sbatch --requeue script runs the same line each time). */
Test(multinode, resume_auto_starts_or_continues, .timeout = 60)
{
    char dir[4096], json[12000], plan[4200];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    struct cdp_run r;
    for (int steps = 2; steps <= 4; steps += 2) {
        snprintf(json, sizeof json,
                 "{\"model\": {\"preset\": \"mlp\", \"input\": [24], \"hidden\": [32, 32], \"classes\": 5}, "
                 "\"train\": {\"steps\": %d, \"micro_batch\": 3, \"log_every\": 1, \"optimizer\": {\"type\": \"sgd\"}, "
                 "\"checkpoint\": {\"dir\": \"%s/ck\", \"every\": 2}}, \"cluster\": {\"backend\": \"cpu\"}}",
                 steps, dir);
        snprintf(plan, sizeof plan, "%s", cdp_test_write_file(dir, "auto.json", json));
        cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", plan, "--resume", "auto", NULL}), 0);
        cr_expect_eq(r.exit_code, 0, "%s", r.err);
        if (steps == 2) cr_expect(strstr(r.out, "step 1/2"), "no checkpoint yet: from the start: %s", r.out);
        else cr_expect(strstr(r.out, "step 3/4") && !strstr(r.out, "step 1/4"), "from step 2's: %s", r.out);
        cdp_test_run_free(&r);
    }
    /* requeued once more after the last checkpoint: nothing to do, exit 0 */
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", plan, "--resume", "auto", NULL}), 0);
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    cr_expect(strstr(r.out, "nothing left to train") && !strstr(r.out, "step 4/4"), "%s", r.out);
    cdp_test_run_free(&r);
}

/* mpirun crashing (Open MPI 4.1's does, now and then, in MPI_Abort) after a
 * rank stopped on bad input: exit 2 as the rank said, not "a rank died". A
 * stand-in mpirun leaves rank 0's word and dies of SIGSEGV. */
Test(multinode, a_launcher_crash_after_bad_input_is_exit_2, .timeout = 60)
{
    if (!cdp_comm_have_mpi()) cr_skip_test("this build has no MPI");
    char dir[4096], plan[4200], path[4400];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    cdp_test_write_file(dir, "mpirun", "#!/bin/sh\n"
                        "printf 'failed other\\nrank 0/4 (stage 0, replica 0): setting up\\nexit 2\\n' "
                        "> \"$CDP_RANK_STATUS_DIR/rank-0.end\"\n"
                        "echo 'cdphybrid: rank 0/4 (stage 0, replica 0): setting up: bad input' >&2\n"
                        "kill -SEGV $$\n");
    snprintf(path, sizeof path, "%s/mpirun", dir);
    chmod(path, 0755);
    snprintf(plan, sizeof plan, "%s", mlp_plan(dir, "crash", 2, 1, 1, 20, ""));
    char *old = strdup(getenv("PATH"));
    setenv("PATH", dir, 1);
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", plan, NULL}), 0);
    setenv("PATH", old, 1);
    free(old);
    cr_expect_eq(r.exit_code, 2, "%s", r.err);
    cr_expect(strstr(r.err, "mpirun ended with signal 11") && strstr(r.err, "bad input") && !strstr(r.err, "died"),
              "%s", r.err);
    cdp_test_run_free(&r);
}

/* A hostfile naming one host twice: refused before Open MPI merges the two
 * nodes (exit 2, the file and the host named); the launcher's hint to install
 * Open MPI only when mpirun is not there. */
Test(multinode, a_host_named_twice_is_refused_before_mpirun, .timeout = 60)
{
    if (!cdp_comm_have_mpi()) cr_skip_test("this build has no MPI");
    char dir[4096], plan[4200], hosts[4200];
    snprintf(dir, sizeof dir, "%s", cdp_test_tmpdir());
    snprintf(hosts, sizeof hosts, "%s", cdp_test_write_file(dir, "hosts", "localhost\nlocalhost\n"));
    snprintf(plan, sizeof plan, "%s", mlp_plan(dir, "twice", 2, 2, 1, 20, ""));
    struct cdp_run r;
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", plan, "--hostfile", hosts, NULL}), 0);
    cr_expect_eq(r.exit_code, 2, "%s", r.err);
    cr_expect(strstr(r.err, "host 1 and host 2 are both \"localhost\""), "%s", r.err);
    cr_expect(!strstr(r.err, "install openmpi-bin"), "mpirun is installed: %s", r.err);
    cdp_test_run_free(&r);
    /* no mpirun on PATH: then the hint */
    char *old = strdup(getenv("PATH"));
    setenv("PATH", dir, 1);
    snprintf(plan, sizeof plan, "%s", mlp_plan(dir, "nompi", 2, 1, 1, 20, ""));
    cr_assert_eq(cdp_test_run(&r, (const char *[]){"--plan", plan, NULL}), 0);
    setenv("PATH", old, 1);
    free(old);
    cr_expect_neq(r.exit_code, 0);
    cr_expect(strstr(r.err, "install openmpi-bin"), "%s", r.err);
    cdp_test_run_free(&r);
}
