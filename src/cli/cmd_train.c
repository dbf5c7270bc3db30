/* Training: the layout printed and written as planned.json, then run here
 * (one rank, with its own stop on SIGTERM/SIGINT) or launched (several); and
 * a rank of a launched job. */
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

/* A rank of a launched job: the whole job trains the layout. */
int cdp_cli_run_ranks(const struct cli_args *a, const struct cdp_plan *plan, const struct cdp_layout *layout)
{
    cdp_comm_t world = NULL;
    if (cdp_comm_world(&world)) {
        fprintf(stderr, "cdphybrid: %s\n", cdp_last_error());
        return EXIT_RUN_FAILED;
    }
    const int rank = cdp_comm_rank(world);
    const char *sd = getenv("CDP_RANK_STATUS_DIR");
    if (sd && *sd) snprintf(cdp_cli_status_path, sizeof cdp_cli_status_path, RANK_STATUS_FILE, sd, rank);
    cdp_cli_rank_signals();
    struct cdp_train_opts opts = {.size = sizeof opts, .out = a->quiet || rank != 0 ? NULL : stdout,
                                  .progress = 0, .resume = cdp_cli_resume_dir(a, plan), .world = CDP_TRAIN_MPI,
                                  .resume_allow = a->resume_allow};
    /* the entry an embedding program's ranks call (cdp/train.h) */
    cdp_status st = cdp_train(plan, layout, &opts, NULL);
    if (st) {
        cdp_cli_print_failure(cdp_last_error());
        fflush(stdout);
        char said[400]; /* where, then its exit code: the launcher's evidence if mpirun dies on the abort */
        snprintf(said, sizeof said, "%s\nexit %d", cdp_exec_where(), cdp_cli_exit_code(st));
        cdp_cli_rank_status(st == CDP_ERR_DEVICE ? "failed device" : st == CDP_ERR_COMM ? "failed comm" : "failed other",
                            said);
        cdp_cli_status_final = 1;
        /* the others may be waiting on this rank: end the whole job */
        cdp_comm_abort(world, cdp_cli_exit_code(st));
    }
    fflush(stdout);
    cdp_comm_free(world);
    int64_t saved = -1;
    const int64_t stopped = cdp_exec_stopped(&saved);
    if (stopped >= 0) {
        char where[4400];
        if (saved >= 0) snprintf(where, sizeof where, "after step %lld: checkpoint saved in %s", (long long)stopped,
                                 plan->train.checkpoint.dir);
        else snprintf(where, sizeof where, "after step %lld: nothing saved (no /train/checkpoint)", (long long)stopped);
        cdp_cli_rank_status("stopped on request", where);
        return 0;
    }
    cdp_cli_rank_status("done", "");
    return 0;
}

/* A one-rank run's own stop: the signal that asked for it. */
static volatile sig_atomic_t self_stop;

static void on_self_stop(int sig)
{
    if (self_stop) { /* a second signal: now */
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    self_stop = sig;
    cdp_train_request_stop();
}

/* Ctrl-C on a one-rank run: it ends now, saying where it was. */
static void on_self_int(int sig)
{
    char msg[600];
    size_t n = 0;
    const char *w = cdp_exec_where();
    cdp_cli_put(msg, sizeof msg, &n, "cdphybrid: stopped by SIGINT (Ctrl-C) at ");
    cdp_cli_put(msg, sizeof msg, &n, *w ? w : "start-up (before its first step)");
    cdp_cli_put(msg, sizeof msg, &n, "; nothing was saved since the last checkpoint\n");
    ssize_t ignored = write(2, msg, n);
    (void)ignored;
    _exit(128 + sig);
}

/* Training: the layout printed once, written as planned.json beside the
 * outputs, then run here (one rank) or launched (several). */
int cdp_cli_train(const struct cli_args *a, struct cdp_plan *plan, const struct cdp_planner_result *r,
                  const struct cdp_replan_in *rin)
{
    const struct cdp_layout *l = r->layout;
    if (cdp_cli_resume_auto(a) && cdp_cli_resume_dir(a, plan)) {
        /* a job requeued after its last checkpoint: done already */
        char *ck = NULL;
        struct cdp_ckpt_info info = {0};
        const int done = !cdp_ckpt_find_latest(plan->train.checkpoint.dir, &ck, &info) && info.step >= plan->train.steps;
        if (done && !a->quiet) printf("--resume auto: %s holds step %lld of %lld: nothing left to train\n", ck,
                                      (long long)info.step, (long long)plan->train.steps);
        free(ck);
        cdp_ckpt_info_free(&info);
        if (done) return 0;
    }
    if (!a->quiet) {
        cdp_planner_print_brief(r, stdout);
        fflush(stdout);
    }
    cdp_status st = cdp_exec_check(plan);
    /* a fresh run into a folder of another run's checkpoints: said before step 1, not at the first save */
    if (!st) st = cdp_exec_check_checkpoint_dir(plan, cdp_cli_resume_dir(a, plan));
    if (st) {
        fprintf(stderr, "cdphybrid: %s\n", cdp_last_error());
        return cdp_cli_exit_code(st);
    }
    char *dir = cdp_cli_output_dir(plan), tmpdir[4096] = "", planned[4200] = "";
    /* one job at a time per output folder: planned.json, metrics and the ranks' words are its alone */
    int lock = -1;
    if (dir && access(dir, F_OK) == 0 && (st = cdp_dir_lock(dir, ".cdphybrid.lock", "an output folder", &lock))) {
        fprintf(stderr, "cdphybrid: %s: %s\n", plan->source, cdp_last_error());
        free(dir);
        return cdp_cli_exit_code(st);
    }
    const int launching = l->n_ranks > 1 && !a->no_launch;
    const int nodes = cdp_cli_layout_nodes(l);
    if (launching && !dir && nodes > 1) {
        fprintf(stderr, "cdphybrid: %s: a layout on %d nodes needs a folder every node sees for planned.json: give "
                        "/output/metrics (or another output) on a shared filesystem\n", plan->source, nodes);
        return EXIT_USAGE;
    }
    {
        /* the limits this job runs under, named before it starts rather than met as a hang */
        const char *base = getenv("TMPDIR");
        if ((st = cdp_cli_check_limits(l, launching, base && *base ? base : "/tmp"))) {
            fprintf(stderr, "cdphybrid: %s: %s\n", plan->source, cdp_last_error());
            free(dir);
            if (lock >= 0) close(lock);
            return cdp_cli_exit_code(st);
        }
    }
    if (launching) { /* the launcher's own files: its hostfile, and planned.json of a run without outputs */
        const char *base = getenv("TMPDIR");
        snprintf(tmpdir, sizeof tmpdir, "%s/cdphybrid-XXXXXX", base && *base ? base : "/tmp");
        if (!mkdtemp(tmpdir)) {
            fprintf(stderr, "cdphybrid: cannot make a folder in %s: %s (TMPDIR)\n", tmpdir, strerror(errno));
            free(dir);
            if (lock >= 0) close(lock);
            return EXIT_RUN_FAILED;
        }
    }
    if (dir || tmpdir[0]) {
        snprintf(planned, sizeof planned, "%s/planned.json", dir ? dir : tmpdir);
        if ((st = cdp_cli_write_planned(plan, r, planned))) {
            fprintf(stderr, "cdphybrid: %s\n", cdp_last_error());
            free(dir);
            if (tmpdir[0]) rmdir(tmpdir);
            if (lock >= 0) close(lock);
            return EXIT_RUN_FAILED;
        }
        if (!a->quiet && dir) printf("  layout written to %s\n", planned);
    }
    /* where the ranks leave their last word: the launcher's folder on one node;
     * on several, a folder beside planned.json (which every node sees) */
    char status_dir[4300] = "";
    if (launching && nodes == 1) snprintf(status_dir, sizeof status_dir, "%s", tmpdir);
    else if (launching && dir) {
        snprintf(status_dir, sizeof status_dir, "%s/.cdphybrid-ranks", dir);
        if (mkdir(status_dir, 0700) != 0 && errno != EEXIST) status_dir[0] = '\0';
    }
    int code;
    if (l->n_ranks > 1) {
        if (a->no_launch) {
            if (!a->quiet)
                printf("  the layout has %d ranks: start them with\n", l->n_ranks);
            code = cdp_cli_print_launch(a, plan, l, planned[0] ? planned : plan->source, dir);
        } else {
            code = cdp_cli_launch_with_restarts(a, plan, r, rin, planned, tmpdir, status_dir[0] ? status_dir : NULL);
        }
    } else {
        if (plan->train.restart.max > 0)
            CDP_WARN(CLI, "%s: /train/restart: a one-rank run is the launcher itself; nothing restarts it",
                     plan->source);
        struct cdp_train_opts opts = {.size = sizeof opts, .out = a->quiet ? NULL : stdout,
                                      .progress = isatty(1), .resume = cdp_cli_resume_dir(a, plan),
                                      .world = CDP_TRAIN_SELF, .resume_allow = a->resume_allow};
        /* a signal stops the run: SIGTERM, SIGHUP, SIGUSR1 after the step with a checkpoint, Ctrl-C now */
        signal(SIGTERM, on_self_stop);
        signal(SIGHUP, on_self_stop);
        signal(SIGUSR1, on_self_stop);
        signal(SIGINT, on_self_int);
        signal(SIGBUS, cdp_cli_on_bus);
        st = cdp_train(plan, l, &opts, NULL);
        signal(SIGINT, SIG_DFL);
        code = st ? cdp_cli_exit_code(st) : 0;
        if (st) cdp_cli_print_failure(cdp_last_error());
        int64_t saved = -1;
        const int64_t stopped = cdp_exec_stopped(&saved);
        if (!st && stopped >= 0) {
            const int sig = self_stop ? self_stop : SIGTERM;
            if (saved >= 0)
                fprintf(stderr, "cdphybrid: stopped by %s after step %lld: checkpoint saved in %s; continue with "
                                "--resume\n", cdp_cli_signal_name(sig), (long long)stopped, plan->train.checkpoint.dir);
            else
                fprintf(stderr, "cdphybrid: stopped by %s after step %lld (no /train/checkpoint: nothing saved)\n",
                        cdp_cli_signal_name(sig), (long long)stopped);
            code = 128 + sig;
        }
    }
    if (tmpdir[0]) cdp_cli_remove_tmpdir(tmpdir, dir ? NULL : planned, l->n_ranks > 64 ? l->n_ranks : 64);
    if (status_dir[0] && strcmp(status_dir, tmpdir) != 0) {
        for (int i = 0; i < l->n_ranks * 2 + 64; i++) {
            char path[4400];
            snprintf(path, sizeof path, RANK_STATUS_FILE, status_dir, i);
            remove(path);
        }
        rmdir(status_dir);
    }
    free(dir);
    if (lock >= 0) close(lock);
    if (!code && fflush(stdout) != 0) {
        fprintf(stderr, "cdphybrid: cannot write to standard output\n");
        return EXIT_RUN_FAILED;
    }
    return code;
}
