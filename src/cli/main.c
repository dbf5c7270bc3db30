/* cdphybrid: the command line. Parses arguments, loads and checks the plan,
 * and runs the command. Only this file decides exit codes:
 * 0 success, 1 the run failed, 2 bad usage or bad input. */
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
#include "pipeline/executor.h"
#include "pipeline/launch.h"
#include "pipeline/schedule.h"
#include "cdp/train.h"


struct cli_args {
    const char *plan;
    int dry_run;
    int schedule;
    int simulate;
    int profile;          /* --profile: measure the units' costs */
    const char *costs;    /* --costs FILE: the table --profile writes, or measured costs the planner uses */
    const char *hostfile; /* --hostfile FILE: the hosts of a layout's nodes, in order */
    const char *trace;    /* --simulate: predicted Chrome trace */
    const char *timeline; /* --simulate: predicted SVG timeline */
    int json;
    int explore; /* --explore placements (with --dry-run) */
    int verbose;
    int quiet;
    int no_launch;
    int resume;             /* --resume given */
    const char *resume_dir; /* its folder, or NULL: the plan's /train/checkpoint/dir */
    const char *resume_allow; /* --resume-allow KEYS: plan keys that may differ from the checkpoint's */
    int argc;
    char **argv;
};

static void usage(FILE *f)
{
    fputs("usage: cdphybrid --plan FILE [--dry-run | --schedule | --resume [DIR|auto]] [--costs FILE] [--json] [-v|-q]\n"
          "       cdphybrid --plan FILE [--hostfile FILE]   (a layout over several nodes)\n"
          "       cdphybrid --plan FILE --simulate [--costs FILE] [--trace OUT.json] [--timeline OUT.svg] [--json]\n"
          "       cdphybrid --plan FILE --profile [--costs OUT.json]\n"
          "       cdphybrid topo [--topology SPEC] [--json] [--export FILE]   (see topo --help)\n"
          "       cdphybrid export --checkpoint DIR --out FILE   (see export --help)\n"
          "       cdphybrid doctor [--plan FILE] [--json]   (what runs here; see doctor --help)\n"
          "       cdphybrid generate --plan FILE --weights FILE --prompt TEXT   (see generate --help)\n"
          "       cdphybrid eval --checkpoint DIR   (validation loss; see eval --help)\n"
          "       cdphybrid tokenize INPUT... --out DIR --tokenizer FILE   (text to token shards; see tokenize --help)\n"
          "       cdphybrid plot METRICS.jsonl -o OUT.svg   (loss curves; see plot --help)\n"
          "       cdphybrid --help | --version\n"
          "\n"
          "Trains a neural network across pipeline stages and data-parallel replicas,\n"
          "as described by one plan file (docs/plan.md). Every command plans first: what the\n"
          "plan leaves \"auto\" (shape, partition, placement) the planner chooses, and training\n"
          "prints the layout, writes it as planned.json beside the outputs and runs it.\n"
          "\n"
          "options:\n"
          "  --plan FILE    the plan (JSON): model, data, train, parallel, cluster, output\n"
          "  --dry-run      check the plan and print it resolved (every default filled in);\n"
          "                 nothing is trained and no file is written\n"
          "                 (without it, the plan is trained: one step line per log_every)\n"
          "  --schedule     print each pipeline rank's instruction list for one step (L load,\n"
          "                 F/B forward/backward of a micro-batch, I/W the input/weight half of\n"
          "                 a split backward (zero-bubble schedules), sa/ra send/receive\n"
          "                 activation, sg/rg gradient, T tied reduce, A all-reduce, O optimizer\n"
          "                 step; a chunk's number goes before it: 1F0);\n"
          "                 nothing is trained\n"
          "  --simulate     predict one step on the cost model and the plan's topology: stages,\n"
          "                 step time, samples/s, bubble, per-rank memory, busiest links\n"
          "                 (docs/simulator.md); nothing is trained\n"
          "  --profile      measure every unit's forward and backward time (and the optimizer's)\n"
          "                 on this machine's CPU and write them as JSON (default: the plan's\n"
          "                 name with .costs.json); nothing is trained\n"
          "  --costs FILE   with --profile: where to write the table; otherwise plan (and\n"
          "                 simulate) with its measured times instead of the analytic ones\n"
          "  --hostfile FILE  the hosts the layout's nodes run on, one per line, node 0 first\n"
          "                 (mpirun's hostfile syntax); without it a layout runs on this host\n"
          "  --trace FILE   with --simulate: write the predicted Chrome trace\n"
          "  --timeline FILE  with --simulate: write the predicted SVG timeline\n"
          "  --explore placements  with --dry-run: also predict the chosen placement, both fixed\n"
          "                 orders and 200 random placements of the shape; print the spread\n"
          "  --json         with --dry-run, --schedule or --simulate: print JSON instead of text\n"
          "  -v, --verbose  more log output (twice: debug); CDP_LOG=debug does the same\n"
          "  -q, --quiet    errors only\n"
          "  --resume [DIR] continue from the newest complete checkpoint in DIR (default: the\n"
          "                 plan's /train/checkpoint/dir), under this plan or another layout;\n"
          "                 --resume auto: from the plan's folder when a checkpoint was begun\n"
          "                 there, else from the start (a job a scheduler may requeue)\n"
          "  --resume-allow KEYS  with --resume: these plan keys (JSON paths, comma-separated,\n"
          "                 e.g. /train/optimizer/lr) may differ from the checkpoint's plan; without\n"
          "                 it another /model, /data, /train/seed or /train/optimizer is refused\n"
          "  --no-launch    a plan with several ranks is not started under mpirun: print the\n"
          "                 command line that starts it (mpirun ... cdphybrid --plan planned.json,\n"
          "                 with the variables Open MPI needs as root) and exit 0\n"
          "  -h, --help     this text\n"
          "  -V, --version  version, backends and libraries this build has\n"
          "\n"
          "environment:\n"
          "  CDP_LOG=error|warn|info|debug    log level (default warn)\n"
          "  CDP_LOG_SUBSYS=plan,device,...   only these subsystems\n"
          "  CDP_MODULE_DIR=DIR               where to look first for backend modules\n"
          "\n"
          "examples:\n"
          "  cdphybrid --plan examples/quickstart.json\n"
          "  cdphybrid --plan examples/gpt-tiny.json --dry-run\n"
          "  cdphybrid --plan examples/gpt2-dgx.json --dry-run --json > resolved.json\n"
          "  cdphybrid --plan examples/gpt-tiny.json --schedule\n"
          "\n"
          "signals: SIGTERM, SIGHUP, SIGUSR1 stop the job after the step under way, saving a\n"
          "  checkpoint when the plan has one (CDP_STOP_GRACE_S, default 25 s); Ctrl-C stops it now\n"
          "\n"
          "exit codes: 0 success, 1 the run failed, 2 bad usage or bad input, 128+N stopped by\n"
          "  signal N (docs/jobs.md)\n",
          f);
}

static void print_version(void)
{
    printf("cdphybrid %s\n", CDP_VERSION);
    printf("backends:\n  cpu   built in\n");
    if (CDP_HAVE_CUDA) {
        int n = 0;
        cdp_status st = cdp_device_count(CDP_BACKEND_CUDA, &n);
        if (st) printf("  cuda  module for %s; %s\n", CDP_GPU_ARCH, cdp_last_error());
        else printf("  cuda  module for %s; %d usable GPU%s\n", CDP_GPU_ARCH, n, n == 1 ? "" : "s");
    } else {
        printf("  cuda  not built (nvcc was not found at configure time)\n");
    }
    printf("libraries:\n  jansson %s\n", jansson_version_str());
    printf("  %s (%d thread%s)\n", openblas_get_config(), openblas_get_num_threads(),
           openblas_get_num_threads() == 1 ? "" : "s");
    printf("found at configure time (for the communicators and topology discovery):\n"
           "  mpi %s, hwloc %s, nccl %s, cudnn %s\n",
           CDP_HAVE_MPI ? "yes" : "no", CDP_HAVE_HWLOC ? "yes" : "no",
           CDP_HAVE_NCCL ? "yes" : "no", CDP_HAVE_CUDNN ? "yes" : "no");
}

/* Returns -1 to go on, or an exit code. */
static int parse_args(int argc, char **argv, struct cli_args *a)
{
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(s, "-V") || !strcmp(s, "--version")) {
            print_version();
            return 0;
        } else if (!strcmp(s, "--plan") || !strncmp(s, "--plan=", 7)) {
            if (s[6] == '=') {
                a->plan = s + 7;
            } else {
                if (i + 1 >= argc) return cdp_cli_usage_error(NULL, "%s needs a file name", s);
                a->plan = argv[++i];
            }
            if (!*a->plan) return cdp_cli_usage_error(NULL, "%s needs a file name", "--plan");
        } else if (!strcmp(s, "--dry-run")) {
            a->dry_run = 1;
        } else if (!strcmp(s, "--json")) {
            a->json = 1;
        } else if (!strcmp(s, "--explore")) {
            if (i + 1 >= argc || strcmp(argv[i + 1], "placements"))
                return cdp_cli_usage_error(NULL, "%s", "--explore takes \"placements\"");
            a->explore = 1;
            i++;
        } else if (!strcmp(s, "--schedule")) {
            a->schedule = 1;
        } else if (!strcmp(s, "--simulate")) {
            a->simulate = 1;
        } else if (!strcmp(s, "--profile")) {
            a->profile = 1;
        } else if (!strcmp(s, "--costs")) {
            if (i + 1 >= argc || !*argv[i + 1]) return cdp_cli_usage_error(NULL, "%s needs a file name", s);
            a->costs = argv[++i];
        } else if (!strcmp(s, "--hostfile")) {
            if (i + 1 >= argc || !*argv[i + 1]) return cdp_cli_usage_error(NULL, "%s needs a file name", s);
            a->hostfile = argv[++i];
        } else if (!strcmp(s, "--trace") || !strcmp(s, "--timeline")) {
            if (i + 1 >= argc || !*argv[i + 1]) return cdp_cli_usage_error(NULL, "%s needs a file name", s);
            if (s[3] == 'r') a->trace = argv[++i];
            else a->timeline = argv[++i];
        } else if (!strcmp(s, "-v") || !strcmp(s, "--verbose")) {
            a->verbose++;
        } else if (!strcmp(s, "-vv")) {
            a->verbose += 2;
        } else if (!strcmp(s, "-q") || !strcmp(s, "--quiet")) {
            a->quiet = 1;
        } else if (!strcmp(s, "--no-launch")) {
            a->no_launch = 1;
        } else if (!strcmp(s, "--resume-allow")) {
            if (i + 1 >= argc || !*argv[i + 1] || argv[i + 1][0] != '/')
                return cdp_cli_usage_error(NULL, "%s needs plan keys as JSON paths, e.g. /train/optimizer/lr,/data/path",
                                           s);
            a->resume_allow = argv[++i];
        } else if (!strcmp(s, "--resume") || !strncmp(s, "--resume=", 9)) {
            a->resume = 1;
            if (s[8] == '=') a->resume_dir = s + 9;
            else if (i + 1 < argc && argv[i + 1][0] != '-') a->resume_dir = argv[++i];
            if (a->resume_dir && !*a->resume_dir) return cdp_cli_usage_error(NULL, "%s needs a folder", "--resume=");
        } else if (s[0] == '-') {
            static const char *const known[] = {"--plan", "--dry-run", "--json", "--verbose",
                                                "--quiet", "--help", "--version", "--no-launch", "--resume",
                                                "--schedule", "--simulate", "--trace", "--timeline", "--profile",
                                                "--costs", "--explore", "--hostfile", "--resume-allow", NULL};
            return cdp_cli_unknown_option(NULL, s, known);
        } else {
            return cdp_cli_usage_error(NULL, "unexpected argument \"%s\"", s);
        }
    }
    if (a->verbose && a->quiet) return cdp_cli_usage_error(NULL, "%s", "-v and -q cannot be used together");
    if (a->json && !a->dry_run && !a->schedule && !a->simulate)
        return cdp_cli_usage_error(NULL, "%s", "--json goes with --dry-run, --schedule or --simulate");
    if (a->explore && (!a->dry_run || a->json))
        return cdp_cli_usage_error(NULL, "%s", "--explore placements goes with --dry-run (text output)");
    if ((a->trace || a->timeline) && !a->simulate)
        return cdp_cli_usage_error(NULL, "%s", "--trace and --timeline go with --simulate");
    if (a->simulate && (a->dry_run || a->schedule))
        return cdp_cli_usage_error(NULL, "%s", "--simulate cannot be combined with --dry-run or --schedule");
    if (a->profile && (a->simulate || a->dry_run || a->schedule || a->json))
        return cdp_cli_usage_error(NULL, "%s", "--profile cannot be combined with --simulate, --dry-run, --schedule or --json");
    if (a->hostfile && (a->dry_run || a->schedule || a->simulate || a->profile))
        return cdp_cli_usage_error(NULL, "%s", "--hostfile goes with training");
    if (!a->plan) return cdp_cli_usage_error(NULL, "%s", "nothing to do: give --plan FILE");
    if (a->resume_allow && !a->resume) return cdp_cli_usage_error(NULL, "%s", "--resume-allow goes with --resume");
    if (a->resume && (a->dry_run || a->schedule || a->simulate || a->profile))
        return cdp_cli_usage_error(NULL, "%s", "--resume goes with training, not with --dry-run, --schedule or --simulate");
    return -1;
}

/* A launched rank's last word for the launcher (CDP_RANK_STATUS_DIR/rank-N.end,
 * set by launch()): written when it ends by itself, fails, or is stopped by
 * the launcher, so that a rank without one is the one that died. Only
 * async-signal-safe calls: on_term writes it too. */
#define RANK_STATUS_FILE "%s/rank-%d.end" /* in the folder, of the rank */
static char status_path[4200];
static volatile sig_atomic_t status_final; /* "failed" or "done" is written: a stop after it changes nothing */

static void rank_status(const char *what, const char *where)
{
    if (!status_path[0] || status_final) return;
    const int fd = open(status_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
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
static void put(char *msg, size_t cap, size_t *n, const char *t)
{
    for (; *t && *n < cap - 2; t++) msg[(*n)++] = *t;
}

static void put_num(char *msg, size_t cap, size_t *n, long v)
{
    char d[24];
    int k = 0;
    if (v < 0) {
        put(msg, cap, n, "-");
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
        put(where, sizeof where, &n, "by signal ");
        put_num(where, sizeof where, &n, sig);
        put(where, sizeof where, &n, " from pid ");
        put_num(where, sizeof where, &n, (long)info->si_pid);
        put(where, sizeof where, &n, ", at ");
        put(where, sizeof where, &n, w);
        where[n] = '\0';
        rank_status("killed", where);
    } else {
        /* the last word first: stderr may be a pipe the launcher has closed already */
        rank_status(cdp_comm_waiting() ? "stopped waiting" : "stopped busy", w);
    }
    n = 0;
    put(msg, sizeof msg, &n, outside ? "cdphybrid: killed (SIGTERM from outside the job) at " : "cdphybrid: stopped while at ");
    put(msg, sizeof msg, &n, w);
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
static void on_bus(int sig)
{
    char msg[600];
    size_t n = 0;
    const char *w = cdp_exec_where();
    put(msg, sizeof msg, &n, "SIGBUS (a mapped file shrank or changed under the run, e.g. the data file) at ");
    put(msg, sizeof msg, &n, *w ? w : "start-up");
    msg[n] = '\0';
    rank_status("failed other", msg);
    status_final = 1;
    ssize_t ignored = write(2, "cdphybrid: ", 11);
    ignored = write(2, msg, n);
    ignored = write(2, "\n", 1);
    (void)ignored;
    signal(sig, SIG_DFL);
    raise(sig);
}

/* How this process handles the signals of a job's life (docs/jobs.md). */
static void rank_signals(void)
{
    rank_launcher = getppid();
    struct sigaction sa = {.sa_sigaction = on_term, .sa_flags = SA_SIGINFO};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGUSR1, on_stop_request);
    signal(SIGBUS, on_bus);
    signal(SIGPIPE, SIG_IGN); /* a write to the launcher's closed pipe fails; it does not end the rank unheard */
    /* the launcher (mpirun, srun) gone: this rank goes too, not trains on unwatched */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != rank_launcher) raise(SIGTERM);
}

/* A failure's line; a file too large for the file size limit names the limit. */
static void print_failure(const char *msg)
{
    struct rlimit fs;
    if (strstr(msg, strerror(EFBIG)) && getrlimit(RLIMIT_FSIZE, &fs) == 0 && fs.rlim_cur != RLIM_INFINITY)
        fprintf(stderr, "cdphybrid: %s (the file size limit, ulimit -f / RLIMIT_FSIZE, is %llu bytes)\n", msg,
                (unsigned long long)fs.rlim_cur);
    else
        fprintf(stderr, "cdphybrid: %s\n", msg);
}

static int has_step_folders(const char *dir);

/* Whether --resume is "--resume auto". */
static int resume_auto(const struct cli_args *a) { return a->resume && a->resume_dir && !strcmp(a->resume_dir, "auto"); }

/* --resume DIR, or --resume alone: the plan's checkpoint folder (checked in
 * run_plan); --resume auto: that folder when a checkpoint was begun there,
 * else NULL (the first run of a job that a scheduler may start again). */
static const char *resume_dir(const struct cli_args *a, const struct cdp_plan *plan)
{
    if (!a->resume) return NULL;
    if (resume_auto(a)) return has_step_folders(plan->train.checkpoint.dir) ? plan->train.checkpoint.dir : NULL;
    return a->resume_dir ? a->resume_dir : plan->train.checkpoint.dir;
}

/* This process's rank when a launcher started it (before MPI is up), else 0:
 * only rank 0 reports what every rank finds alike (a bad plan). */
static int launched_rank(void)
{
    static const char *const keys[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID", NULL};
    for (int i = 0; keys[i]; i++) {
        const char *v = getenv(keys[i]);
        if (v && *v) return atoi(v);
    }
    return 0;
}

/* The nodes of the Slurm allocation a launcher runs in (srun starts its ranks
 * there: no --hostfile), else 0. */
static int allocation_nodes(const struct cli_args *a)
{
    const char *job = getenv("SLURM_JOB_ID"), *n = getenv("SLURM_JOB_NUM_NODES");
    if (!n || !*n) n = getenv("SLURM_NNODES");
    if (a->hostfile || !job || !*job || !n) return 0;
    return atoi(n) > 0 ? atoi(n) : 0;
}

/* A task of a Slurm job step of several tasks that has no MPI world (srun
 * without PMIx): its rank would not know the others. */
static int slurm_task_without_mpi(void)
{
    const char *step = getenv("SLURM_STEP_ID"), *n = getenv("SLURM_STEP_NUM_TASKS");
    return step && *step && n && atoi(n) > 1 && !cdp_comm_launched_by_mpi();
}

/* Its place among the ranks of its host, or 0 when the launcher does not say. */
static int launched_local_rank(void)
{
    static const char *const keys[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", NULL};
    for (int i = 0; keys[i]; i++) {
        const char *v = getenv(keys[i]);
        if (v && *v) return atoi(v);
    }
    return 0;
}

/* A rank of a launched job: the whole job trains the layout. */
static int run_ranks(const struct cli_args *a, const struct cdp_plan *plan, const struct cdp_layout *layout)
{
    cdp_comm_t world = NULL;
    if (cdp_comm_world(&world)) {
        fprintf(stderr, "cdphybrid: %s\n", cdp_last_error());
        return EXIT_RUN_FAILED;
    }
    const int rank = cdp_comm_rank(world);
    const char *sd = getenv("CDP_RANK_STATUS_DIR");
    if (sd && *sd) snprintf(status_path, sizeof status_path, RANK_STATUS_FILE, sd, rank);
    rank_signals();
    struct cdp_train_opts opts = {.size = sizeof opts, .out = a->quiet || rank != 0 ? NULL : stdout,
                                  .progress = 0, .resume = resume_dir(a, plan), .world = CDP_TRAIN_MPI,
                                  .resume_allow = a->resume_allow};
    /* the entry an embedding program's ranks call (cdp/train.h) */
    cdp_status st = cdp_train(plan, layout, &opts, NULL);
    if (st) {
        print_failure(cdp_last_error());
        fflush(stdout);
        char said[400]; /* where, then its exit code: the launcher's evidence if mpirun dies on the abort */
        snprintf(said, sizeof said, "%s\nexit %d", cdp_exec_where(), cdp_cli_exit_code(st));
        rank_status(st == CDP_ERR_DEVICE ? "failed device" : st == CDP_ERR_COMM ? "failed comm" : "failed other",
                    said);
        status_final = 1;
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
        rank_status("stopped on request", where);
        return 0;
    }
    rank_status("done", "");
    return 0;
}

/* --schedule: the lists of one step of the layout (every replica alike). */
static int print_schedule(const struct cdp_plan *plan, const struct cdp_layout *l, int json)
{
    const int tied = cdp_model_ties_embeddings(&plan->model) && l->stages * l->chunks > 1;
    struct cdp_schedule *s = NULL;
    cdp_status st = cdp_schedule_for_layout(l, l->micro_batches, tied, 0, &s);
    if (!st) st = json ? cdp_schedule_print_json(s, stdout) : cdp_schedule_print(s, stdout);
    cdp_schedule_free(s);
    if (st) {
        fprintf(stderr, "cdphybrid: %s: %s\n", plan->source, cdp_last_error());
        return cdp_cli_exit_code(st);
    }
    if (fflush(stdout) != 0) {
        fprintf(stderr, "cdphybrid: cannot write to standard output\n");
        return EXIT_RUN_FAILED;
    }
    return 0;
}

/* The plan's JSON, then the planner's result ("planner": what it predicted,
 * for people and scripts) and the layout ("layout": what the ranks run,
 * cdp_layout_to_json) as two more top-level members. Each part is dumped by
 * its own rules (the plan's reals in their shortest exact form, the
 * predictions with 17 digits), so the members are written one after another. */
static cdp_status print_plan_json(const struct cdp_plan *plan, const struct cdp_planner_result *r, FILE *f)
{
    char *text = NULL;
    cdp_status st = cdp_plan_to_json(plan, &text);
    if (st) return st;
    size_t n = strlen(text);
    if (!r || n < 2 || text[n - 1] != '}' || text[n - 2] != '\n') {
        fputs(text, f);
        fputc('\n', f);
        free(text);
        return CDP_OK;
    }
    const char *const keys[] = {"planner", "layout"};
    json_t *members[] = {cdp_planner_to_json(r), cdp_layout_to_json(r->layout)};
    char *dumped[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++)
        dumped[i] = members[i] ? json_dumps(members[i], JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17))
                               : NULL;
    if (dumped[0] && dumped[1]) {
        fwrite(text, 1, n - 2, f);
        for (int i = 0; i < 2; i++) {
            fprintf(f, ",\n  \"%s\": ", keys[i]);
            for (const char *c = dumped[i]; *c; c++) {
                fputc(*c, f);
                if (*c == '\n') fputs("  ", f);
            }
        }
        fputs("\n}\n", f);
    } else {
        st = cdp_fail(CDP_ERR_NOMEM, "out of memory writing the plan as JSON");
    }
    for (int i = 0; i < 2; i++) {
        json_decref(members[i]);
        free(dumped[i]);
    }
    free(text);
    return st;
}

/* The folder of the run's first output (metrics, trace, timeline, weights,
 * or the checkpoint folder's parent), or NULL when it writes none. */
static char *output_dir(const struct cdp_plan *plan)
{
    const char *o = plan->output.metrics ? plan->output.metrics
                    : plan->output.trace ? plan->output.trace
                    : plan->output.timeline ? plan->output.timeline
                    : plan->output.weights ? plan->output.weights
                                           : plan->train.checkpoint.dir;
    if (!o) return NULL;
    char *d = strdup(o);
    if (!d) return NULL;
    char *slash = strrchr(d, '/');
    if (slash == d) d[1] = '\0';
    else if (slash) *slash = '\0';
    else strcpy(d, ".");
    return d;
}

/* planned.json: the planned plan (with the planner's section), written
 * through a temporary name so that a reader never sees half of it. */
static cdp_status write_planned(const struct cdp_plan *plan, const struct cdp_planner_result *r, const char *path)
{
    struct cdp_atomic_file out;
    cdp_status st = cdp_atomic_open(path, &out);
    if (st) return st;
    if ((st = print_plan_json(plan, r, out.stream))) {
        cdp_atomic_abort(&out);
        return st;
    }
    return cdp_atomic_commit(&out);
}

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
static int layout_nodes(const struct cdp_layout *l)
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

static const char *signal_name(int sig)
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
        fprintf(stderr, "cdphybrid: stopped by %s: the job's %d ranks (%s) ended %s\n", signal_name(sig), l->n_ranks,
                launcher, where);
    else {
        const char *ck = plan->train.checkpoint.dir;
        const int saved = ck && cdp_ckpt_check_fresh(ck) != CDP_OK; /* committed checkpoints are there */
        fprintf(stderr, "cdphybrid: stopped by %s: the job's %d ranks (%s) were ended%s%s; %s%s\n", signal_name(sig),
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
    if (code != 0 && layout_nodes(l) > 1 && (a->hostfile || cdp_launch_which(&spec) == CDP_LAUNCHER_SRUN)) {
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
        char *h = layout_nodes(l) == 1 ? NULL : cdp_launch_host_of(&spec, k->node);
        fprintf(stderr, "cdphybrid: rank %d/%d (stage %d, replica %d) on node %d (%s) died without a word; %s ended "
                        "the job with %s; where the other ranks were is above\n", i, l->n_ranks, k->stage,
                k->replica, k->node, layout_nodes(l) == 1 ? host : h ? h : "its host", mpi_launcher_name(&spec), how);
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
static void remove_tmpdir(const char *dir, const char *planned, int n_ranks)
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
static int has_step_folders(const char *dir)
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
static int launch_with_restarts(const struct cli_args *a, struct cdp_plan *plan, const struct cdp_planner_result *r0,
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
        } else if (has_step_folders(plan->train.checkpoint.dir)) {
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
            if (planned[0] && (st = write_planned(np, &nr, planned))) {
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
static int print_launch(const struct cli_args *a, const struct cdp_plan *plan, const struct cdp_layout *l,
                        const char *planned, const char *dir)
{
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        fprintf(stderr, "cdphybrid: cannot find the running program to name it\n");
        return EXIT_RUN_FAILED;
    }
    self[n] = '\0';
    char **args = rank_args(a, planned, resume_dir(a, plan)), **argv = NULL;
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
    put(msg, sizeof msg, &n, "cdphybrid: stopped by SIGINT (Ctrl-C) at ");
    put(msg, sizeof msg, &n, *w ? w : "start-up (before its first step)");
    put(msg, sizeof msg, &n, "; nothing was saved since the last checkpoint\n");
    ssize_t ignored = write(2, msg, n);
    (void)ignored;
    _exit(128 + sig);
}

/* Training: the layout printed once, written as planned.json beside the
 * outputs, then run here (one rank) or launched (several). */
static int train(const struct cli_args *a, struct cdp_plan *plan, const struct cdp_planner_result *r,
                 const struct cdp_replan_in *rin)
{
    const struct cdp_layout *l = r->layout;
    if (resume_auto(a) && resume_dir(a, plan)) {
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
    if (!st) st = cdp_exec_check_checkpoint_dir(plan, resume_dir(a, plan));
    if (st) {
        fprintf(stderr, "cdphybrid: %s\n", cdp_last_error());
        return cdp_cli_exit_code(st);
    }
    char *dir = output_dir(plan), tmpdir[4096] = "", planned[4200] = "";
    /* one job at a time per output folder: planned.json, metrics and the ranks' words are its alone */
    int lock = -1;
    if (dir && access(dir, F_OK) == 0 && (st = cdp_dir_lock(dir, ".cdphybrid.lock", "an output folder", &lock))) {
        fprintf(stderr, "cdphybrid: %s: %s\n", plan->source, cdp_last_error());
        free(dir);
        return cdp_cli_exit_code(st);
    }
    const int launching = l->n_ranks > 1 && !a->no_launch;
    const int nodes = layout_nodes(l);
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
        if ((st = write_planned(plan, r, planned))) {
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
            code = print_launch(a, plan, l, planned[0] ? planned : plan->source, dir);
        } else {
            code = launch_with_restarts(a, plan, r, rin, planned, tmpdir, status_dir[0] ? status_dir : NULL);
        }
    } else {
        if (plan->train.restart.max > 0)
            CDP_WARN(CLI, "%s: /train/restart: a one-rank run is the launcher itself; nothing restarts it",
                     plan->source);
        struct cdp_train_opts opts = {.size = sizeof opts, .out = a->quiet ? NULL : stdout,
                                      .progress = isatty(1), .resume = resume_dir(a, plan),
                                      .world = CDP_TRAIN_SELF, .resume_allow = a->resume_allow};
        /* a signal stops the run: SIGTERM, SIGHUP, SIGUSR1 after the step with a checkpoint, Ctrl-C now */
        signal(SIGTERM, on_self_stop);
        signal(SIGHUP, on_self_stop);
        signal(SIGUSR1, on_self_stop);
        signal(SIGINT, on_self_int);
        signal(SIGBUS, on_bus);
        st = cdp_train(plan, l, &opts, NULL);
        signal(SIGINT, SIG_DFL);
        code = st ? cdp_cli_exit_code(st) : 0;
        if (st) print_failure(cdp_last_error());
        int64_t saved = -1;
        const int64_t stopped = cdp_exec_stopped(&saved);
        if (!st && stopped >= 0) {
            const int sig = self_stop ? self_stop : SIGTERM;
            if (saved >= 0)
                fprintf(stderr, "cdphybrid: stopped by %s after step %lld: checkpoint saved in %s; continue with "
                                "--resume\n", signal_name(sig), (long long)stopped, plan->train.checkpoint.dir);
            else
                fprintf(stderr, "cdphybrid: stopped by %s after step %lld (no /train/checkpoint: nothing saved)\n",
                        signal_name(sig), (long long)stopped);
            code = 128 + sig;
        }
    }
    if (tmpdir[0]) remove_tmpdir(tmpdir, dir ? NULL : planned, l->n_ranks > 64 ? l->n_ranks : 64);
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

static int run_plan(const struct cli_args *a)
{
    struct cdp_plan *plan = NULL;
    struct cdp_topology *topo = NULL;
    struct cdp_cost_table table = {0};
    struct cdp_planner_result pr = {0};
    struct cdp_layout *given_layout = NULL;
    char why[1024] = "", note[512] = "";
    int code = EXIT_USAGE, have_table = 0;
    /* ranks of a launched job: only rank 0 says what every rank would */
    /* ranks of a launched job: only rank 0 says what every rank would, and
     * the first rank of each other host what its host may see alone (a file
     * that host cannot read) */
    const int ranked = cdp_comm_launched_by_mpi(), rank = ranked ? launched_rank() : 0;
    const int quiet_errors = ranked && rank != 0 && launched_local_rank() != 0;
    if (cdp_plan_load(a->plan, &plan)) goto bad_input;
    if (!ranked && slurm_task_without_mpi()) {
        /* every task would be a launcher and start srun again: a deadlock */
        cdp_fail(CDP_ERR_INVALID, "%s: this is task %s of a Slurm step of %s tasks that srun started without "
                 "PMIx (Slurm's MpiDefault or SLURM_MPI_TYPE is \"%s\"): start cdphybrid once (it runs srun "
                 "--mpi=pmix itself), or srun --mpi=pmix -n N cdphybrid --plan planned.json", plan->source,
                 getenv("SLURM_PROCID"), getenv("SLURM_STEP_NUM_TASKS"),
                 getenv("SLURM_MPI_TYPE") ? getenv("SLURM_MPI_TYPE") : "none");
        goto bad_input;
    }

    struct cdp_machine_info machine = {.gpus = 0, .no_gpu_why = NULL};
    /* a plan that does not say how many nodes, started inside an allocation: all of them */
    const int alloc = ranked ? 0 : allocation_nodes(a);
    if (alloc > 1 && !plan->cluster.nodes_given) {
        CDP_INFO(PLAN, "%s: /cluster/nodes: %d, the nodes of this Slurm allocation", plan->source, alloc);
        plan->cluster.nodes = alloc;
    }
    /* Only plans that may run on GPUs pay for loading the CUDA module. */
    if (plan->cluster.backend_auto || plan->cluster.backend == CDP_BACKEND_CUDA) {
        if (cdp_device_count(CDP_BACKEND_CUDA, &machine.gpus)) {
            snprintf(why, sizeof why, "%s", cdp_last_error());
            machine.no_gpu_why = why;
            CDP_INFO(DEVICE, "%s", why);
        }
    }
    if (cdp_plan_resolve(plan, &machine)) goto bad_input;
    if (a->resume && (!a->resume_dir || resume_auto(a)) && !plan->train.checkpoint.dir) {
        cdp_fail(CDP_ERR_INVALID, "%s: --resume %s needs /train/checkpoint/dir in the plan", plan->source,
                 resume_auto(a) ? "auto" : "without a folder");
        goto bad_input;
    }
    cdp_status st;
    /* a planned file (planned.json) holds its layout: the ranks and --schedule run it as written; the
     * other commands run it once its plan, fixed, plans the same (below) */
    if ((st = cdp_layout_of_planned(a->plan, plan, &given_layout))) goto bad_input;
    if (given_layout && ranked && !a->dry_run && !a->simulate && !a->schedule && !a->profile) {
        code = run_ranks(a, plan, given_layout);
        goto done;
    }
    if (given_layout && a->schedule) {
        code = print_schedule(plan, given_layout, a->json);
        goto done;
    }
    if (a->costs && !a->profile) {
        struct cdp_unit *u = NULL;
        int n = 0;
        if ((st = cdp_cost_table_read(a->costs, &table))) goto failed;
        have_table = 1;
        if ((st = cdp_units_build(&plan->model, &u, &n))) goto failed;
        st = cdp_cost_table_check(&table, a->costs, plan, u, n);
        free(u);
        if (st) goto failed;
    }
    /* every command goes through the planner: the topology, then the layout */
    if ((st = cdp_planner_topology(plan, machine.gpus, &topo, note, sizeof note))) {
        cdp_error_context(st, "%s: /cluster/topology", plan->source);
        goto failed;
    }
    if (note[0]) CDP_INFO(PART, "topology %s: %s", topo->name, note);
    if (given_layout) { /* the planned file's layout, if its plan (fixed) plans the same one */
        char diff[400];
        if ((st = cdp_planner_run(plan, topo, have_table ? &table : NULL, 0, &pr))) goto failed;
        if (cdp_layout_diff(given_layout, pr.layout, diff, sizeof diff)) {
            st = cdp_fail(CDP_ERR_INVALID, "%s: /layout%s in the file, its plan on %s plans another layout (edit "
                          "the plan and the layout alike, or plan again)", plan->source, diff, topo->name);
            goto failed;
        }
        cdp_layout_free(pr.layout); /* what runs is the file's: its CPU sets and caps as written */
        pr.layout = given_layout;
        given_layout = NULL;
    } else {
    const int flags = ranked && !a->dry_run && !a->simulate && !a->schedule ? CDP_PLANNER_LAYOUT_ONLY : 0;
    if ((st = cdp_planner_run(plan, topo, have_table ? &table : NULL, flags, &pr))) goto failed;
    }
    if (a->profile) {
        code = cdp_cli_profile(plan, a->plan, a->costs, pr.layout->rank[0].cpuset);
    } else if (a->explore) {
        struct cdp_planner_spread spread = {0};
        if ((st = cdp_planner_explore(plan, topo, have_table ? &table : NULL, &pr, CDP_PLANNER_EXPLORE_SAMPLES, 1,
                                      &spread)))
            goto failed;
        if ((st = cdp_planner_apply(&pr, plan)) || (st = cdp_plan_print(plan, stdout))) goto failed;
        cdp_planner_print(&pr, stdout);
        cdp_planner_spread_print(&spread, stdout);
        code = 0;
    } else if (a->schedule) {
        code = print_schedule(plan, pr.layout, a->json);
    } else if (a->simulate) {
        struct cdp_sim_in in = {.r = &pr, .t = topo, .note = note, .table = have_table ? &table : NULL,
                                .costs = a->costs, .costs_device = table.device};
        code = cdp_cli_simulate(plan, &in, a->json, a->trace, a->timeline);
    } else if (a->dry_run) {
        if ((st = cdp_planner_apply(&pr, plan))) goto failed;
        if (a->json) st = print_plan_json(plan, &pr, stdout);
        else if (!(st = cdp_plan_print(plan, stdout))) cdp_planner_print(&pr, stdout);
        if (st) goto failed;
        code = fflush(stdout) ? EXIT_RUN_FAILED : 0;
        if (code) fprintf(stderr, "cdphybrid: cannot write to standard output\n");
    } else if (ranked) {
        code = run_ranks(a, plan, pr.layout);
    } else {
        if ((st = cdp_planner_apply(&pr, plan))) goto failed;
        const struct cdp_replan_in rin = {.plan_path = a->plan, .machine = &machine,
                                          .table = have_table ? &table : NULL, .topo = topo};
        code = train(a, plan, &pr, &rin);
    }
done:
    cdp_layout_free(given_layout);
    cdp_planner_result_clear(&pr);
    cdp_topology_free(topo);
    cdp_cost_table_clear(&table);
    cdp_plan_free(plan);
    return code;

failed:
    code = cdp_cli_exit_code(st);
bad_input:
    if (!quiet_errors && rank != 0) {
        char host[256] = "?";
        if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "?");
        fprintf(stderr, "cdphybrid: rank %d on %s: %s\n", rank, host, cdp_last_error());
    } else if (!quiet_errors) {
        fprintf(stderr, "cdphybrid: %s\n", cdp_last_error());
    }
    cdp_layout_free(given_layout);
    cdp_planner_result_clear(&pr);
    cdp_topology_free(topo);
    cdp_cost_table_clear(&table);
    cdp_plan_free(plan);
    return code;
}

int main(int argc, char **argv)
{
    struct cli_args a = {.argc = argc, .argv = argv};
    /* CUDA numbers GPUs fastest first unless told; hwloc and NVML, where the
     * planner's topology comes from, number them in PCI bus order: make the
     * layout's GPU k CUDA's device k (a user's own setting is kept) */
    setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 0);
    /* past the file size limit (ulimit -f) a write fails with EFBIG, named
     * with its file, instead of a silent SIGXFSZ death; mpirun and the ranks
     * inherit this */
    signal(SIGXFSZ, SIG_IGN);
    if (cdp_log_init_from_env()) {
        fprintf(stderr, "cdphybrid: %s\n", cdp_last_error());
        return EXIT_USAGE;
    }
    if (argc > 1 && !strcmp(argv[1], "topo")) return cdp_cli_topo(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "export")) return cdp_cli_export(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "doctor")) return cdp_cli_doctor(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "generate")) return cdp_cli_generate(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "eval")) return cdp_cli_eval(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "tokenize")) return cdp_cli_tokenize(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "plot")) return cdp_cli_plot(argc - 1, argv + 1);
    int code = parse_args(argc, argv, &a);
    if (code >= 0) return code;
    if (!getenv("CDP_LOG") || !*getenv("CDP_LOG")) {
        if (a.quiet) cdp_log_set_level(CDP_LOG_ERROR);
        else if (a.verbose) cdp_log_set_level(a.verbose > 1 ? CDP_LOG_DEBUG : CDP_LOG_INFO);
    }
    return run_plan(&a);
}
