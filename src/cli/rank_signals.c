/* A launched rank's signals (docs/jobs.md) and its last word for the
 * launcher: async-signal-safe writers of the rank's status file. */
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

/* A launched rank's last word for the launcher (CDP_RANK_STATUS_DIR/rank-N.end,
 * set by launch()): written when it ends by itself, fails, or is stopped by
 * the launcher, so that a rank without one is the one that died. Only
 * async-signal-safe calls: on_term writes it too. */
char cdp_cli_status_path[4200];

volatile sig_atomic_t cdp_cli_status_final; /* "failed" or "done" is written: a stop after it changes nothing */

void cdp_cli_rank_status(const char *what, const char *where)
{
    if (!cdp_cli_status_path[0] || cdp_cli_status_final) return;
    const int fd = open(cdp_cli_status_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return;
    char msg[600];
    size_t n = 0;
    for (const char *p = what; *p && n < sizeof msg - 3; p++) msg[n++] = *p;
    msg[n++] = '\n';
    for (const char *p = where; *p && n < sizeof msg - 2; p++) msg[n++] = *p;
    msg[n++] = '\n';
    ssize_t ignored = write(fd, msg, n);
    (void)ignored;
    close(fd);
}

/* Appends async-signal-safe text to msg at *n. */
void cdp_cli_put(char *msg, size_t cap, size_t *n, const char *t)
{
    for (; *t && *n < cap - 2; t++) msg[(*n)++] = *t;
}

static void put_num(char *msg, size_t cap, size_t *n, long v)
{
    char d[24];
    int k = 0;
    if (v < 0) {
        cdp_cli_put(msg, cap, n, "-");
        v = -v;
    }
    do d[k++] = (char)('0' + v % 10); while ((v /= 10) && k < 23);
    while (k && *n < cap - 2) msg[(*n)++] = d[--k];
}

/* SIGTERM to a rank. From its launcher (mpirun, srun: the parent), which
 * stops the job because another rank failed or it was asked to: say what this
 * rank was doing. From anyone else (kill -TERM on this rank alone): this rank
 * was killed, a death of the job (a restart counts it as one). */
static pid_t rank_launcher; /* the parent this rank started under (mpirun, orted, slurmstepd) */

static void on_term(int sig, siginfo_t *info, void *ctx)
{
    (void)ctx;
    char msg[600], where[460];
    size_t n = 0;
    const char *w = cdp_exec_where();
    if (!*w) w = "start-up (before its first instruction)";
    const int outside = info && info->si_code == SI_USER && info->si_pid > 0 && info->si_pid != rank_launcher &&
                        info->si_pid != getppid();
    if (outside) {
        cdp_cli_put(where, sizeof where, &n, "by signal ");
        put_num(where, sizeof where, &n, sig);
        cdp_cli_put(where, sizeof where, &n, " from pid ");
        put_num(where, sizeof where, &n, (long)info->si_pid);
        cdp_cli_put(where, sizeof where, &n, ", at ");
        cdp_cli_put(where, sizeof where, &n, w);
        where[n] = '\0';
        cdp_cli_rank_status("killed", where);
    } else {
        /* the last word first: stderr may be a pipe the launcher has closed already */
        cdp_cli_rank_status(cdp_comm_waiting() ? "stopped waiting" : "stopped busy", w);
    }
    n = 0;
    cdp_cli_put(msg, sizeof msg, &n, outside ? "cdphybrid: killed (SIGTERM from outside the job) at " : "cdphybrid: stopped while at ");
    cdp_cli_put(msg, sizeof msg, &n, w);
    msg[n++] = '\n';
    ssize_t ignored = write(2, msg, n);
    (void)ignored;
    _exit(128 + sig);
}

/* SIGUSR1 to a rank (passed on by the launcher when it is asked to stop, or
 * a scheduler's warning): save a checkpoint after this step, and end. */
static void on_stop_request(int sig)
{
    (void)sig;
    cdp_train_request_stop();
}

/* SIGBUS: a mapped file changed under the run (a data file shrank or was
 * replaced): a failure that a restart would meet again, not a device's. */
void cdp_cli_on_bus(int sig)
{
    char msg[600];
    size_t n = 0;
    const char *w = cdp_exec_where();
    cdp_cli_put(msg, sizeof msg, &n, "SIGBUS (a mapped file shrank or changed under the run, e.g. the data file) at ");
    cdp_cli_put(msg, sizeof msg, &n, *w ? w : "start-up");
    msg[n] = '\0';
    cdp_cli_rank_status("failed other", msg);
    cdp_cli_status_final = 1;
    ssize_t ignored = write(2, "cdphybrid: ", 11);
    ignored = write(2, msg, n);
    ignored = write(2, "\n", 1);
    (void)ignored;
    signal(sig, SIG_DFL);
    raise(sig);
}

/* How this process handles the signals of a job's life (docs/jobs.md). */
void cdp_cli_rank_signals(void)
{
    rank_launcher = getppid();
    struct sigaction sa = {.sa_sigaction = on_term, .sa_flags = SA_SIGINFO};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGUSR1, on_stop_request);
    signal(SIGBUS, cdp_cli_on_bus);
    signal(SIGPIPE, SIG_IGN); /* a write to the launcher's closed pipe fails; it does not end the rank unheard */
    /* the launcher (mpirun, srun) gone: this rank goes too, not trains on unwatched */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != rank_launcher) raise(SIGTERM);
}

/* A failure's line; a file too large for the file size limit names the limit. */
void cdp_cli_print_failure(const char *msg)
{
    struct rlimit fs;
    if (strstr(msg, strerror(EFBIG)) && getrlimit(RLIMIT_FSIZE, &fs) == 0 && fs.rlim_cur != RLIM_INFINITY)
        fprintf(stderr, "cdphybrid: %s (the file size limit, ulimit -f / RLIMIT_FSIZE, is %llu bytes)\n", msg,
                (unsigned long long)fs.rlim_cur);
    else
        fprintf(stderr, "cdphybrid: %s\n", msg);
}
