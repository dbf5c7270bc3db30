/* Starting a layout's ranks under mpirun or srun on the planned file,
 * watching them (a rank's last word, a lost node, a stop by signal), the
 * restarts after a fault (docs/jobs.md) and --no-launch's command line. */
#include "cli/main_internal.h"

#include <cblas.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cdp/core.h"
#include "cdp/device.h"
#include "cdp/log.h"
#include "cdp/plan.h"
#include "cdp_config.h"
#include "cli/commands.h"
#include "cli/limits.h"
#include "cli/restart.h"
#include "comm/comm.h"
#include "core/file.h"
#include "model/checkpoint.h"
#include "partitioner/costs.h"
#include "partitioner/host.h"
#include "partitioner/planner.h"
#include "pipeline/run/executor.h"
#include "pipeline/run/launch.h"
#include "pipeline/schedule.h"
#include "cdp/train.h"

/* The arguments of every rank: this command's, with --plan naming the planned
 * file and without --hostfile (the launcher's); resume not NULL (a restart):
 * --resume resume instead of the command's own --resume. */
static char **rank_args(const struct cli_args *a, const char *planned, const char *resume)
{
    char **v = calloc((size_t)a->argc + 5, sizeof *v);
    if (!v) return NULL;
    int k = 0;
    v[k++] = "--plan";
    v[k++] = (char *)planned;
    for (int i = 1; i < a->argc; i++) {
        const char *s = a->argv[i];
        if (!strcmp(s, "--plan") || !strcmp(s, "--hostfile") || !strcmp(s, "--costs")) {
            i++;
            continue;
        }
        if (!strncmp(s, "--plan=", 7) || !strcmp(s, "--no-launch")) continue;
        if (resume && (!strcmp(s, "--resume") || !strncmp(s, "--resume=", 9))) {
            if (!s[8] && i + 1 < a->argc && a->argv[i + 1][0] != '-') i++; /* its folder */
            continue;
        }
        v[k++] = a->argv[i];
    }
    if (resume) {
        v[k++] = "--resume";
        v[k++] = (char *)resume;
    }
    v[k] = NULL;
    return v;
}

/* The nodes a layout's ranks run on (ranks are in node order). */
int cdp_cli_layout_nodes(const struct cdp_layout *l)
{
    int nodes = 0;
    for (int i = 0; i < l->n_ranks; i++) nodes += i == 0 || l->rank[i].node != l->rank[i - 1].node;
    return nodes;
}

/* What reaches the ranks on other hosts (mpirun -x; docs/multinode.md): ours,
 * the BLAS's and OpenMP's threads, CUDA's and NCCL's settings, the sanitizers'. */
static const char *const forwarded_env[] = {"CDP_*", "OPENBLAS_*", "GOTO_*", "OMP_*", "MKL_*", "CUDA_*", "NCCL_*",
                                            "ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS", NULL};

/* After a rank says it failed, how long the launcher may take to end the job
 * by itself before it is ended (mpirun waits on a host it cannot reach). */
#define LAUNCH_GRACE_S 10.0
/* How long a host has to answer the question whether it is there. */
#define PROBE_TIMEOUT_S 5

struct rank_watch {
    const char *dir;
    int n_ranks;
};

/* Whether a rank has left the word "failed ..." (launch's failing()). */
static int rank_failed(void *ctx)
{
    const struct rank_watch *w = ctx;
    for (int i = 0; i < w->n_ranks; i++) {
        char path[4300], word[16] = "";
        snprintf(path, sizeof path, RANK_STATUS_FILE, w->dir, i);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        const size_t n = fread(word, 1, sizeof word - 1, f);
        fclose(f);
        word[n] = '\0';
        if (!strncmp(word, "failed", 6)) return 1;
    }
    return 0;
}

static const char *mpi_launcher_name(const struct cdp_launch_spec *s)
{
    return cdp_launch_which(s) == CDP_LAUNCHER_SRUN ? "srun" : "mpirun";
}

const char *cdp_cli_signal_name(int sig)
{
    return sig == SIGINT    ? "SIGINT (Ctrl-C)"
           : sig == SIGTERM ? "SIGTERM"
           : sig == SIGHUP  ? "SIGHUP"
           : sig == SIGUSR1 ? "SIGUSR1"
                            : "a signal";
}

/* A job stopped by a signal to the launcher: what was stopped, where, and
 * what was saved (rank 0's last word); 128 + the signal. A stop is never
 * taken for a fault: nothing restarts it. */
static int stopped_job(const struct cdp_plan *plan, const struct cdp_layout *l, const char *status_dir,
                       const char *launcher, int sig)
{
    char word[512] = "", where[4400] = "";
    if (status_dir) {
        char path[4300];
        snprintf(path, sizeof path, RANK_STATUS_FILE, status_dir, 0);
        FILE *f = fopen(path, "r");
        if (f) {
            if (!fgets(word, sizeof word, f)) word[0] = '\0';
            if (!fgets(where, sizeof where, f)) where[0] = '\0';
            fclose(f);
        }
        word[strcspn(word, "\n")] = '\0';
        where[strcspn(where, "\n")] = '\0';
    }
    if (!strcmp(word, "stopped on request"))
        fprintf(stderr, "cdphybrid: stopped by %s: the job's %d ranks (%s) ended %s\n", cdp_cli_signal_name(sig), l->n_ranks,
                launcher, where);
    else {
        const char *ck = plan->train.checkpoint.dir;
        const int saved = ck && cdp_ckpt_check_fresh(ck) != CDP_OK; /* committed checkpoints are there */
        fprintf(stderr, "cdphybrid: stopped by %s: the job's %d ranks (%s) were ended%s%s; %s%s\n", cdp_cli_signal_name(sig),
                l->n_ranks, launcher, where[0] ? "; where they were: " : "", where,
                saved ? "--resume continues from the last checkpoint in " : ck ? "no checkpoint was saved yet in "
                                                                             : "nothing was saved (no /train/checkpoint)",
                ck ? ck : "");
    }
    return 128 + sig;
}

/* Starts the layout's ranks (mpirun or srun) on the planned file and waits.
 * Exit codes stay 0, 1 and 2: a rank that died (mpirun's 137 for a SIGKILL)
 * is 1, named with its place in the layout. The ranks leave their last word in
 * status_dir (NULL: none); resume: the folder a restart resumes from (NULL:
 * the command's own arguments); attempt: 0, or the restart's number
 * (CDP_RESTART_ATTEMPT). *raw gets the launcher's own exit code. */
static int launch(const struct cli_args *a, const struct cdp_plan *plan, const struct cdp_layout *l,
                  const char *planned, const char *tmpdir, const char *status_dir, const char *resume, int attempt,
                  int *raw, int *died, int *stopped_by, int64_t *oom_kills, int *lost_node)
{
    *died = -1;
    *stopped_by = 0;
    *oom_kills = 0;
    if (lost_node) *lost_node = -1;
    *raw = EXIT_RUN_FAILED;
    if (!cdp_comm_have_mpi()) {
        fprintf(stderr, "cdphybrid: %s: the layout has %d ranks and this build has no MPI (configure "
                        "with -Dmpi=enabled after installing libopenmpi-dev)\n", plan->source, l->n_ranks);
        return *raw = EXIT_USAGE;
    }
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        fprintf(stderr, "cdphybrid: cannot find the running program to start its ranks\n");
        return EXIT_RUN_FAILED;
    }
    self[n] = '\0';
    char **args = rank_args(a, planned, resume);
    if (!args) return EXIT_RUN_FAILED;
    struct rank_watch watch = {.dir = status_dir, .n_ranks = l->n_ranks};
    int stopped = 0;
    struct cdp_launch_spec spec = {.layout = l, .program = self, .args = args, .hostfile = a->hostfile,
                                   .tmpdir = tmpdir, .pass_env = forwarded_env,
                                   .died = plan->train.restart.max > 0 ? died : NULL,
                                   .stop_saves = plan->train.checkpoint.dir != NULL,
                                   .failing = status_dir ? rank_failed : NULL, .ctx = &watch,
                                   .grace_s = LAUNCH_GRACE_S, .stopped = &stopped};
    int code = 0;
    /* the ranks leave their last word in status_dir: none is left from before */
    for (int i = 0; status_dir && i < l->n_ranks; i++) {
        char path[4300];
        snprintf(path, sizeof path, RANK_STATUS_FILE, status_dir, i);
        remove(path);
    }
    if (status_dir) setenv("CDP_RANK_STATUS_DIR", status_dir, 1);
    char num[16];
    snprintf(num, sizeof num, "%d", attempt);
    if (attempt > 0) setenv("CDP_RESTART_ATTEMPT", num, 1);
    const int64_t oom0 = cdp_host_oom_kills();
    cdp_status st = cdp_launch_run(&spec, &code);
    const int64_t oom1 = cdp_host_oom_kills();
    if (oom0 >= 0 && oom1 > oom0) *oom_kills = oom1 - oom0;
    unsetenv("CDP_RANK_STATUS_DIR");
    if (attempt > 0) unsetenv("CDP_RESTART_ATTEMPT");
    free(args);
    if (st) {
        fprintf(stderr, "cdphybrid: %s: the layout has %d ranks: %s; or start the ranks yourself: mpirun -np %d "
                        "%s --plan %s\n", plan->source, l->n_ranks, cdp_last_error(), l->n_ranks, self, planned);
        return *raw = cdp_cli_exit_code(st);
    }
    *raw = code;
    *stopped_by = stopped > 0 ? stopped : 0;
    if (*stopped_by) return stopped_job(plan, l, status_dir, mpi_launcher_name(&spec), *stopped_by);
    if (code != 0 && cdp_cli_layout_nodes(l) > 1 && (a->hostfile || cdp_launch_which(&spec) == CDP_LAUNCHER_SRUN)) {
        /* a host cut off or gone: ask every host; the ranks' words cannot tell it from a hang */
        unsigned char *lost = calloc((size_t)l->n_nodes, 1);
        if (lost && !cdp_launch_probe_hosts(&spec, PROBE_TIMEOUT_S, lost)) {
            for (int node = 0; node < l->n_nodes; node++) {
                if (!lost[node]) continue;
                char *h = cdp_launch_host_of(&spec, node);
                fprintf(stderr, "cdphybrid: host %s (node %d) does not answer: its ranks are cut off or gone%s\n",
                        h ? h : "?", node, stopped < 0 ? "; the job was ended after the ranks that are left timed out"
                                                      : "");
                free(h);
                if (lost_node && *lost_node < 0) *lost_node = node;
            }
        }
        free(lost);
    }
    if (code == 0 || code == EXIT_RUN_FAILED || code == EXIT_USAGE) return code;
    /* a rank died (a signal, or the launcher's own code): say which, and exit 1 */
    char how[64];
    if (code > 128 && code < 128 + 65) {
        const char *name = strsignal(code - 128);
        snprintf(how, sizeof how, "signal %d (%s)", code - 128, name ? name : "?");
    } else {
        snprintf(how, sizeof how, "exit code %d", code);
    }
    /* Open MPI 4.1's mpirun may crash (signal 11) while it aborts a job a
     * rank ended on bad input: the rank's own word says exit 2 */
    struct cdp_job_end said;
    if (code > 128 && status_dir && !cdp_restart_read_ends(status_dir, l->n_ranks, code, -1, &said)) {
        const int rank_code = said.rank_code;
        cdp_job_end_clear(&said);
        if (rank_code == EXIT_USAGE) {
            fprintf(stderr, "cdphybrid: %s ended with %s after a rank stopped on bad input (its message is above): "
                            "exit 2\n", mpi_launcher_name(&spec), how);
            return EXIT_USAGE;
        }
    }
    int named = 0, silent = 0;
    for (int i = 0; status_dir && i < l->n_ranks; i++) {
        char path[4300];
        snprintf(path, sizeof path, RANK_STATUS_FILE, status_dir, i);
        silent += access(path, F_OK) != 0;
    }
    if (l->n_ranks > 1 && silent == l->n_ranks) {
        /* not one rank said a word: they did not start (the launcher's
         * daemons did not), or every one went at once */
        fprintf(stderr, "cdphybrid: no rank of the job's %d left a word: they never started, or all ended at once; "
                        "%s ended the job with %s (its lines above say why)\n", l->n_ranks,
                mpi_launcher_name(&spec), how);
        named = -1;
    }
    for (int i = 0; status_dir && named >= 0 && i < l->n_ranks; i++) {
        char path[4300];
        snprintf(path, sizeof path, RANK_STATUS_FILE, status_dir, i);
        if (access(path, F_OK) == 0) continue;
        const struct cdp_layout_rank *k = &l->rank[i];
        char host[256] = "";
        if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "?");
        char *h = cdp_cli_layout_nodes(l) == 1 ? NULL : cdp_launch_host_of(&spec, k->node);
        fprintf(stderr, "cdphybrid: rank %d/%d (stage %d, replica %d) on node %d (%s) died without a word; %s ended "
                        "the job with %s; where the other ranks were is above\n", i, l->n_ranks, k->stage,
                k->replica, k->node, cdp_cli_layout_nodes(l) == 1 ? host : h ? h : "its host", mpi_launcher_name(&spec), how);
        free(h);
        named++;
    }
    if (!named)
        fprintf(stderr, "cdphybrid: %s ended the job with %s (a rank died; the lines above say where the others "
                        "were)\n", mpi_launcher_name(&spec), how);
    if (*oom_kills > 0)
        fprintf(stderr, "cdphybrid: out of memory: the kernel's OOM killer ended %lld process%s of this job (its "
                        "cgroup's memory.events oom_kill); plan smaller micro-batches or fewer ranks per host\n",
                (long long)*oom_kills, *oom_kills == 1 ? "" : "es");
    return EXIT_RUN_FAILED;
}

/* Removes a folder made for one launch and what the launch wrote in it
 * (planned: the planned file when it went there, else NULL). */
void cdp_cli_remove_tmpdir(const char *dir, const char *planned, int n_ranks)
{
    char hosts[4200];
    snprintf(hosts, sizeof hosts, "%s/hosts.txt", dir);
    remove(hosts);
    for (int i = 0; i < n_ranks; i++) { /* the ranks' last words (launch) */
        snprintf(hosts, sizeof hosts, RANK_STATUS_FILE, dir, i);
        remove(hosts);
    }
    if (planned) remove(planned);
    rmdir(dir);
}

/* Whether dir holds a committed step folder (step-N, with its manifest or
 * without): a restart before the first checkpoint starts over only where none
 * is there. */
int cdp_cli_has_step_folders(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    int any = 0;
    for (struct dirent *e; !any && (e = readdir(d));) any = !strncmp(e->d_name, "step-", 5);
    closedir(d);
    return any;
}

/* A launched job with /train/restart: runs it, and while it fails by a death,
 * a hang or a device error and restarts remain, decides what failed,
 * re-plans on what is left (or keeps the layout), writes planned.json again
 * and resumes from the last committed checkpoint (docs/checkpoints.md,
 * "Restarts"). Returns the exit code; *plan and *r may be replaced (owned by
 * *owned_plan and *owned_r then). */
int cdp_cli_launch_with_restarts(const struct cli_args *a, struct cdp_plan *plan, const struct cdp_planner_result *r0,
                                 const struct cdp_replan_in *rin, const char *planned, const char *tmpdir,
                                 const char *status_dir)
{
    const struct cdp_restart_desc *rs = &plan->train.restart;
    struct cdp_plan *cur_plan = plan;
    struct cdp_planner_result owned = {0};
    const struct cdp_layout *l = r0->layout;
    const int n_devices = rin->topo ? rin->topo->n_gpus : 0;
    unsigned char *dead = calloc((size_t)n_devices + 1, 1);
    char *resume = NULL;
    int raw = 0, died = -1, attempt = 0, streak = 0, code, stopped_by = 0;
    int64_t oom_kills = 0;
    int64_t last_fault_step = -2;
    if (!dead) return EXIT_RUN_FAILED;
    for (;;) {
        /* metrics.jsonl as it was: a fresh attempt that never wrote it leaves
         * another run's steps there, which are not this run's */
        const char *mpath = plan->output.metrics;
        struct stat m0, m1;
        const int fresh = attempt == 0 ? !a->resume : resume == NULL;
        const int had = mpath && stat(mpath, &m0) == 0;
        int lost_node = -1;
        code = launch(a, cur_plan, l, planned, tmpdir, status_dir, resume, attempt, &raw, &died, &stopped_by,
                      &oom_kills, &lost_node);
        const int untouched = fresh && had && stat(mpath, &m1) == 0 && m1.st_ino == m0.st_ino &&
                              m1.st_size == m0.st_size && m1.st_mtim.tv_sec == m0.st_mtim.tv_sec &&
                              m1.st_mtim.tv_nsec == m0.st_mtim.tv_nsec;
        /* a signal to the launcher is a stop, never a fault */
        if (code == 0 || stopped_by || rs->max <= 0 || !status_dir) break;
        struct cdp_job_end end;
        struct cdp_fault_report f;
        if (cdp_restart_read_ends(status_dir, l->n_ranks, raw, died, &end)) {
            fprintf(stderr, "cdphybrid: %s\n", cdp_last_error());
            break;
        }
        end.oom_kills = oom_kills;
        const char *metrics = plan->output.metrics;
        const int64_t last = metrics && !untouched ? cdp_metrics_last_step(metrics) : -1;
        cdp_status st = cdp_restart_decide(l, &end, last, &f);
        const int rank_code = end.rank_code;
        cdp_job_end_clear(&end);
        if (st) {
            fprintf(stderr, "cdphybrid: %s\n", cdp_last_error());
            break;
        }
        if (lost_node >= 0) /* a host that does not answer outweighs what its peers said */
            cdp_restart_node_lost(l, lost_node, &f);
        if (!f.restartable) {
            fprintf(stderr, "cdphybrid: not restarting: %s; /train/restart restarts after a death, a hang or a "
                            "device error\n", f.what);
            cdp_fault_report_clear(&f);
            if (rank_code == EXIT_USAGE) code = EXIT_USAGE; /* the ranks' own exit, when mpirun did not pass it on */
            break;
        }
        /* the same step as the fault before: one more in a row */
        streak = f.step == last_fault_step ? streak + 1 : 1;
        last_fault_step = f.step;
        if (streak > rs->max) {
            fprintf(stderr, "cdphybrid: stopping: the fault repeated at step %lld on %d attempts in a row (%s); "
                            "/train/restart/max is %lld\n", (long long)f.step, streak, f.what, (long long)rs->max);
            cdp_fault_report_clear(&f);
            code = EXIT_RUN_FAILED;
            break;
        }
        /* the last committed checkpoint; none yet: from the start, where no save was begun */
        char *ck = NULL;
        struct cdp_ckpt_info info = {0};
        int64_t from = 0;
        if (!cdp_ckpt_find_latest(plan->train.checkpoint.dir, &ck, &info)) {
            from = info.step;
            cdp_ckpt_info_free(&info);
        } else if (cdp_cli_has_step_folders(plan->train.checkpoint.dir)) {
            fprintf(stderr, "cdphybrid: not restarting after %s: %s\n", f.what, cdp_last_error());
            cdp_fault_report_clear(&f);
            break;
        } else {
            /* from the start: the first save's leftovers go (another layout's parts would mix) */
            cdp_ckpt_discard_incomplete_after(plan->train.checkpoint.dir, 0);
        }
        free(ck);
        const int64_t lost = last > from ? last - from : 0;
        /* the layout: re-planned without the failed devices, or the same */
        int same = !rs->exclude_failed || f.n_failed == 0;
        struct cdp_plan *np = NULL;
        struct cdp_planner_result nr = {0};
        if (!same) {
            for (int k = 0; k < f.n_failed; k++) {
                const int d = l->rank[f.failed[k]].device;
                if (d >= 0 && d < n_devices) dead[d] = 1;
            }
            for (int i = 0; f.node >= 0 && i < l->n_ranks; i++)
                if (l->rank[i].node == f.node && l->rank[i].device < n_devices) dead[l->rank[i].device] = 1;
            if ((st = cdp_restart_replan(rin, l, dead, n_devices, &np, &nr))) {
                fprintf(stderr, "cdphybrid: not restarting after %s: %s: cannot plan on what is left: %s\n", f.what,
                        plan->source, cdp_last_error());
                cdp_fault_report_clear(&f);
                code = EXIT_RUN_FAILED;
                break;
            }
        }
        const struct cdp_layout *nl = same ? l : nr.layout;
        attempt++;
        char was[32], now[32];
        cdp_restart_shape(l, was, sizeof was);
        cdp_restart_shape(nl, now, sizeof now);
        if (metrics) {
            long dropped = 0;
            if ((st = cdp_metrics_cut(metrics, from, &dropped)) ||
                (st = cdp_restart_record(metrics, attempt, &f, l, nl, from, lost, same))) {
                fprintf(stderr, "cdphybrid: %s\n", cdp_last_error());
                cdp_fault_report_clear(&f);
                if (!same) {
                    cdp_planner_result_clear(&nr);
                    cdp_plan_free(np);
                }
                code = EXIT_RUN_FAILED;
                break;
            }
        }
        char devs[256] = "";
        for (int i = 0, o = 0; i < nl->n_ranks && o < (int)sizeof devs - 12; i++)
            o += snprintf(devs + o, sizeof devs - (size_t)o, "%s%d", i ? "," : "", nl->rank[i].device);
        if (!a->quiet) {
            char at[48];
            if (f.step >= 0) snprintf(at, sizeof at, "at step %lld", (long long)f.step);
            else snprintf(at, sizeof at, "before its first step");
            printf("restart %d: %s %s; %s from step %lld (%lld step%s lost) on %s%s%s (devices %s)\n",
                   attempt, f.what, at, from ? "resuming" : "starting again", (long long)from,
                   (long long)lost, lost == 1 ? "" : "s", now, same ? ", the same layout" : ", was ",
                   same ? "" : was, devs);
            fflush(stdout);
        }
        cdp_fault_report_clear(&f);
        if (!same) {
            if (planned[0] && (st = cdp_cli_write_planned(np, &nr, planned))) {
                fprintf(stderr, "cdphybrid: %s\n", cdp_last_error());
                cdp_planner_result_clear(&nr);
                cdp_plan_free(np);
                code = EXIT_RUN_FAILED;
                break;
            }
            if (cur_plan != plan) cdp_plan_free(cur_plan);
            cdp_planner_result_clear(&owned);
            cur_plan = np;
            owned = nr;
            l = owned.layout;
        }
        free(resume);
        resume = from ? strdup(plan->train.checkpoint.dir) : NULL;
        if (from && !resume) {
            code = EXIT_RUN_FAILED;
            break;
        }
    }
    free(resume);
    free(dead);
    if (cur_plan != plan) cdp_plan_free(cur_plan);
    cdp_planner_result_clear(&owned);
    return code;
}

/* A word of a command line as sh reads it back: as is when it is made of
 * safe characters, else in single quotes. */
static void print_sh_word(const char *s, FILE *f)
{
    int safe = *s != '\0';
    for (const char *c = s; *c && safe; c++)
        safe = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
               strchr("-_./=:,+@%", *c);
    if (safe) {
        fputs(s, f);
        return;
    }
    fputc('\'', f);
    for (const char *c = s; *c; c++)
        if (*c == '\'') fputs("'\\''", f);
        else fputc(*c, f);
    fputc('\'', f);
}

/* --no-launch: the command line the launcher would run, on stdout, with the
 * variables it would set (Open MPI refuses root, and more ranks than cores,
 * unless told), so that pasted into a shell it starts the job. */
int cdp_cli_print_launch(const struct cli_args *a, const struct cdp_plan *plan, const struct cdp_layout *l,
                         const char *planned, const char *dir)
{
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        fprintf(stderr, "cdphybrid: cannot find the running program to name it\n");
        return EXIT_RUN_FAILED;
    }
    self[n] = '\0';
    char **args = rank_args(a, planned, cdp_cli_resume_dir(a, plan)), **argv = NULL;
    if (!args) return EXIT_RUN_FAILED;
    const struct cdp_launch_spec spec = {.layout = l, .program = self, .args = args, .hostfile = a->hostfile,
                                         .tmpdir = dir ? dir : "."}; /* its hosts.txt, with --hostfile */
    cdp_status st = cdp_launch_argv(&spec, CDP_LAUNCHER_MPIRUN, &argv);
    if (st) {
        free(args);
        fprintf(stderr, "cdphybrid: %s: %s\n", plan->source, cdp_last_error());
        return cdp_cli_exit_code(st);
    }
    if (geteuid() == 0) fputs("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ", stdout);
    if (l->n_ranks > sysconf(_SC_NPROCESSORS_ONLN)) fputs("OMPI_MCA_rmaps_base_oversubscribe=1 ", stdout);
    for (int i = 0; argv[i]; i++) {
        if (i) fputc(' ', stdout);
        print_sh_word(argv[i], stdout);
    }
    fputc('\n', stdout);
    free(argv);
    free(args);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "cdphybrid: cannot write to standard output\n");
        return EXIT_RUN_FAILED;
    }
    return 0;
}
