/* The arguments of `cdphybrid --plan ...`: the usage text, --version and the
 * parser (exit code 2 for bad usage). */
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
int cdp_cli_parse_args(int argc, char **argv, struct cli_args *a)
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
