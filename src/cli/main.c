/* cdphybrid: the command line. Parses arguments, loads and checks the plan,
 * and runs the command. Only this file decides exit codes:
 * 0 success, 1 the run failed, 2 bad usage or bad input. */
#include <cblas.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include "cdp/core.h"
#include "cdp/device.h"
#include "cdp/log.h"
#include "cdp/plan.h"
#include "cdp_config.h"
#include "cli/commands.h"
#include "comm/comm.h"
#include "partitioner/planner.h"
#include "pipeline/executor.h"
#include "pipeline/schedule.h"
#include "pipeline/train.h"


struct cli_args {
    const char *plan;
    int dry_run;
    int schedule;
    int simulate;
    int profile;          /* --profile: measure the units' costs */
    const char *costs;    /* --costs FILE: the table --profile writes or --simulate reads */
    const char *trace;    /* --simulate: predicted Chrome trace */
    const char *timeline; /* --simulate: predicted SVG timeline */
    int json;
    int explore; /* --explore placements (with --dry-run) */
    int verbose;
    int quiet;
    int no_launch;
    int resume;             /* --resume given */
    const char *resume_dir; /* its folder, or NULL: the plan's /train/checkpoint/dir */
    int argc;
    char **argv;
};

static void usage(FILE *f)
{
    fputs("usage: cdphybrid --plan FILE [--dry-run | --schedule | --resume [DIR]] [--json] [-v|-q]\n"
          "       cdphybrid --plan FILE --simulate [--costs FILE] [--trace OUT.json] [--timeline OUT.svg] [--json]\n"
          "       cdphybrid --plan FILE --profile [--costs OUT.json]\n"
          "       cdphybrid topo [--topology SPEC] [--json] [--export FILE]   (see topo --help)\n"
          "       cdphybrid export --checkpoint DIR --out FILE   (see export --help)\n"
          "       cdphybrid doctor [--plan FILE] [--json]   (what runs here; see doctor --help)\n"
          "       cdphybrid --help | --version\n"
          "\n"
          "Trains a neural network across pipeline stages and data-parallel replicas,\n"
          "as described by one plan file (docs/plan.md).\n"
          "\n"
          "options:\n"
          "  --plan FILE    the plan (JSON): model, data, train, parallel, cluster, output\n"
          "  --dry-run      check the plan and print it resolved (every default filled in);\n"
          "                 nothing is trained and no file is written\n"
          "                 (without it, the plan is trained: one step line per log_every)\n"
          "  --schedule     print each pipeline rank's instruction list for one step (L load,\n"
          "                 F/B forward/backward of a micro-batch, sa/ra send/receive activation,\n"
          "                 sg/rg gradient, T tied reduce, A all-reduce, O optimizer step);\n"
          "                 nothing is trained\n"
          "  --simulate     predict one step on the cost model and the plan's topology: stages,\n"
          "                 step time, samples/s, bubble, per-rank memory, busiest links\n"
          "                 (docs/simulator.md); nothing is trained\n"
          "  --profile      measure every unit's forward and backward time (and the optimizer's)\n"
          "                 on this machine's CPU and write them as JSON (default: the plan's\n"
          "                 name with .costs.json); nothing is trained\n"
          "  --costs FILE   with --profile: where to write the table; with --simulate: use its\n"
          "                 measured times instead of the analytic ones\n"
          "  --trace FILE   with --simulate: write the predicted Chrome trace\n"
          "  --timeline FILE  with --simulate: write the predicted SVG timeline\n"
          "  --explore placements  with --dry-run: also predict the chosen placement, both fixed\n"
          "                 orders and 200 random placements of the shape; print the spread\n"
          "  --json         with --dry-run, --schedule or --simulate: print JSON instead of text\n"
          "  -v, --verbose  more log output (twice: debug); CDP_LOG=debug does the same\n"
          "  -q, --quiet    errors only\n"
          "  --resume [DIR] continue from the newest complete checkpoint in DIR (default: the\n"
          "                 plan's /train/checkpoint/dir), under this plan or another layout\n"
          "  --no-launch    a plan with several ranks is not restarted under mpirun by itself;\n"
          "                 start it as `mpirun -np N cdphybrid --plan FILE`\n"
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
          "exit codes: 0 success, 1 the run failed, 2 bad usage or bad input\n",
          f);
}

static void print_version(void)
{
    printf("cdphybrid %s\n", CDP_VERSION);
    printf("backends:\n  cpu   built in\n");
    if (CDP_HAVE_CUDA) {
        int n = 0;
        cdp_status st = cdp_device_count(CDP_DEVICE_CUDA, &n);
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
        } else if (!strcmp(s, "--resume") || !strncmp(s, "--resume=", 9)) {
            a->resume = 1;
            if (s[8] == '=') a->resume_dir = s + 9;
            else if (i + 1 < argc && argv[i + 1][0] != '-') a->resume_dir = argv[++i];
            if (a->resume_dir && !*a->resume_dir) return cdp_cli_usage_error(NULL, "%s needs a folder", "--resume=");
        } else if (s[0] == '-') {
            static const char *const known[] = {"--plan", "--dry-run", "--json", "--verbose",
                                                "--quiet", "--help", "--version", "--no-launch", "--resume",
                                                "--schedule", "--simulate", "--trace", "--timeline", "--profile",
                                                "--costs", "--explore", NULL};
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
    if (a->costs && !a->profile && !a->simulate)
        return cdp_cli_usage_error(NULL, "%s", "--costs goes with --profile or --simulate");
    if (!a->plan) return cdp_cli_usage_error(NULL, "%s", "nothing to do: give --plan FILE");
    if (a->resume && (a->dry_run || a->schedule || a->simulate || a->profile))
        return cdp_cli_usage_error(NULL, "%s", "--resume goes with training, not with --dry-run, --schedule or --simulate");
    return -1;
}

/* Restarts this very command under `mpirun -np N`; returns only on failure. */
static int launch(const struct cli_args *a, int ranks)
{
    if (!cdp_comm_have_mpi()) {
        fprintf(stderr, "cdphybrid: %s: the plan needs %d ranks and this build has no MPI (configure "
                        "with -Dmpi=enabled after installing libopenmpi-dev)\n", a->plan, ranks);
        return EXIT_USAGE;
    }
    char np[16], self[4096];
    snprintf(np, sizeof np, "%d", ranks);
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        fprintf(stderr, "cdphybrid: cannot find the running program to relaunch it\n");
        return EXIT_RUN_FAILED;
    }
    self[n] = '\0';
    char **argv = calloc((size_t)a->argc + 4, sizeof *argv);
    if (!argv) return EXIT_RUN_FAILED;
    int k = 0;
    argv[k++] = "mpirun";
    argv[k++] = "-np";
    argv[k++] = np;
    argv[k++] = self;
    for (int i = 1; i < a->argc; i++) argv[k++] = a->argv[i];
    argv[k] = NULL;
    /* Open MPI refuses root and more ranks than cores unless told */
    if (geteuid() == 0) {
        setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
        setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
    }
    if (ranks > sysconf(_SC_NPROCESSORS_ONLN)) setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
    CDP_INFO(CLI, "starting %d ranks: mpirun -np %d %s ...", ranks, ranks, self);
    fflush(stdout);
    execvp("mpirun", argv);
    fprintf(stderr, "cdphybrid: %s: the plan needs %d ranks, and mpirun could not be started (%s); install "
                    "openmpi-bin, or start the ranks yourself with your launcher\n", a->plan, ranks,
            strerror(errno));
    free(argv);
    return EXIT_RUN_FAILED;
}

/* When the launcher stops this rank because another failed, say what it was doing. */
static void on_term(int sig)
{
    char msg[400];
    const char *w = cdp_exec_where();
    if (!*w) w = "start-up (before its first instruction)";
    size_t n = 0;
    const char *head = "cdphybrid: stopped while at ";
    for (const char *p = head; *p && n < sizeof msg - 2; p++) msg[n++] = *p;
    for (const char *p = w; *p && n < sizeof msg - 2; p++) msg[n++] = *p;
    msg[n++] = '\n';
    ssize_t ignored = write(2, msg, n);
    (void)ignored;
    _exit(128 + sig);
}

/* --resume DIR, or --resume alone: the plan's checkpoint folder (checked in run_plan). */
static const char *resume_dir(const struct cli_args *a, const struct cdp_plan *plan)
{
    if (!a->resume) return NULL;
    return a->resume_dir ? a->resume_dir : plan->train.checkpoint.dir;
}

static int run_ranks(const struct cli_args *a, const struct cdp_plan *plan)
{
    cdp_comm_t world = NULL;
    if (cdp_comm_world(&world)) {
        fprintf(stderr, "cdphybrid: %s\n", cdp_last_error());
        return EXIT_RUN_FAILED;
    }
    signal(SIGTERM, on_term);
    const int rank = cdp_comm_rank(world);
    struct cdp_train_opts opts = {.out = a->quiet || rank != 0 ? NULL : stdout, .progress = 0,
                                  .resume = resume_dir(a, plan)};
    cdp_status st = cdp_exec_run(plan, world, &opts, NULL);
    if (st) {
        fprintf(stderr, "cdphybrid: %s\n", cdp_last_error());
        fflush(stdout);
        /* the others may be waiting on this rank: end the whole job */
        cdp_comm_abort(world, cdp_cli_exit_code(st));
    }
    fflush(stdout);
    cdp_comm_free(world);
    return 0;
}

/* --schedule: the lists of one step as the executor runs them (every replica alike). */
static int print_schedule(const struct cdp_plan *plan, int json)
{
    const struct cdp_parallel_desc *pd = &plan->parallel;
    const char *key = pd->stages == CDP_AUTO          ? "/parallel/stages"
                      : pd->micro_batches == CDP_AUTO ? "/parallel/micro_batches"
                      : pd->schedule_auto             ? "/parallel/schedule"
                                                      : NULL;
    if (key) {
        fprintf(stderr, "cdphybrid: %s: %s is \"auto\": --schedule needs it fixed; --dry-run plans it "
                        "(--dry-run --json writes the planned plan)\n", plan->source, key);
        return EXIT_USAGE;
    }
    /* out-of-range counts are clamped here and rejected by the builder */
    int p = (int)(pd->stages < (1 << 30) ? pd->stages : (1 << 30));
    int v = (int)(pd->chunks < (1 << 30) ? pd->chunks : (1 << 30));
    int m = (int)(pd->micro_batches < (1 << 30) ? pd->micro_batches : (1 << 30));
    int tied = plan->model.kind == CDP_MODEL_GPT && plan->model.tie_embeddings && (int64_t)p * v > 1;
    struct cdp_schedule *s = NULL;
    cdp_status st = cdp_schedule_build(pd->schedule, p, v, m, tied, &s);
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

/* --dry-run runs the planner for plans that target a GPU topology or several
 * ranks (or leave the shape "auto"); a one-rank CPU plan has nothing to place. */
static int wants_planner(const struct cdp_plan *plan)
{
    const struct cdp_parallel_desc *pd = &plan->parallel;
    return plan->cluster.backend == CDP_BACKEND_CUDA || strcmp(plan->cluster.topology, "auto") != 0 ||
           pd->stages == CDP_AUTO || pd->replicas == CDP_AUTO || pd->stages * pd->replicas > 1;
}

/* Plans on the plan's topology (an "auto" CPU one: /cluster/devices per node,
 * else the plan's ranks) and writes the choices into the plan. */
static cdp_status plan_auto(struct cdp_plan *plan, struct cdp_planner_result *r, struct cdp_planner_spread *spread)
{
    const struct cdp_parallel_desc *pd = &plan->parallel;
    const struct cdp_cluster_desc *cd = &plan->cluster;
    int64_t ranks = cd->nodes;
    if (cd->devices != CDP_AUTO) ranks = cd->nodes * cd->devices;
    else if (pd->stages != CDP_AUTO && pd->replicas != CDP_AUTO) ranks = pd->stages * pd->replicas;
    if (ranks > 1 << 20) ranks = 1 << 20;
    struct cdp_topology *t = NULL;
    char note[256];
    cdp_status st = cdp_planner_topology(plan, (int)ranks, &t, note, sizeof note);
    if (st) {
        /* the plan is checked; only the prediction needs the machine's file */
        cdp_error_context(st, "%s: /cluster/topology", plan->source);
        fprintf(stderr, "cdphybrid: warning: no planner prediction: %s\n", cdp_last_error());
        return CDP_ERR_UNSUPPORTED;
    }
    st = cdp_planner_run(plan, t, NULL, r);
    if (!st && spread && (st = cdp_planner_explore(plan, t, NULL, r, CDP_PLANNER_EXPLORE_SAMPLES, 1, spread)))
        cdp_planner_result_clear(r);
    cdp_topology_free(t);
    if (!st && (st = cdp_planner_apply(r, plan))) cdp_planner_result_clear(r);
    return st;
}

/* The plan's JSON with the planner's result under one more top-level key. */
static cdp_status print_plan_json(const struct cdp_plan *plan, const struct cdp_planner_result *r)
{
    char *text = NULL, *extra = NULL;
    cdp_status st = cdp_plan_to_json(plan, &text);
    if (st) return st;
    size_t n = strlen(text);
    if (r && n >= 2 && text[n - 1] == '}' && text[n - 2] == '\n') {
        json_t *j = cdp_planner_to_json(r);
        extra = j ? json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17)) : NULL;
        json_decref(j);
        if (!extra) {
            free(text);
            return cdp_fail(CDP_ERR_NOMEM, "out of memory writing the plan as JSON");
        }
        fwrite(text, 1, n - 2, stdout);
        fputs(",\n  \"planner\": ", stdout);
        for (const char *c = extra; *c; c++) {
            fputc(*c, stdout);
            if (*c == '\n') fputs("  ", stdout);
        }
        fputs("\n}\n", stdout);
    } else {
        fputs(text, stdout);
        fputc('\n', stdout);
    }
    free(extra);
    free(text);
    return CDP_OK;
}

static int run_plan(const struct cli_args *a)
{
    struct cdp_plan *plan = NULL;
    char why[1024] = "";
    int code = EXIT_USAGE;
    if (cdp_plan_load(a->plan, &plan)) goto bad_input;

    struct cdp_machine_info machine = {.gpus = 0, .no_gpu_why = NULL};
    /* Only plans that may run on GPUs pay for loading the CUDA module. */
    if (plan->cluster.backend != CDP_BACKEND_CPU) {
        if (cdp_device_count(CDP_DEVICE_CUDA, &machine.gpus)) {
            snprintf(why, sizeof why, "%s", cdp_last_error());
            machine.no_gpu_why = why;
            CDP_INFO(DEVICE, "%s", why);
        }
    }
    if (cdp_plan_resolve(plan, &machine)) goto bad_input;
    if (a->simulate) {
        code = cdp_cli_simulate(plan, a->json, a->trace, a->timeline, a->costs);
        cdp_plan_free(plan);
        return code;
    }
    if (a->profile) {
        code = cdp_cli_profile(plan, a->plan, a->costs);
        cdp_plan_free(plan);
        return code;
    }
    if (a->schedule) {
        code = print_schedule(plan, a->json);
        cdp_plan_free(plan);
        return code;
    }

    if (a->resume && !a->resume_dir && !plan->train.checkpoint.dir) {
        cdp_fail(CDP_ERR_INVALID, "%s: --resume without a folder needs /train/checkpoint/dir in the plan",
                 plan->source);
        goto bad_input;
    }
    const int ranks = cdp_exec_ranks(plan);
    if (!a->dry_run && (ranks > 1 || cdp_comm_launched_by_mpi())) {
        if (ranks < 1) {
            cdp_fail(CDP_ERR_UNSUPPORTED, "%s: /parallel/stages or /parallel/replicas is \"auto\": give "
                     "numbers to train, or plan them first: cdphybrid --plan P --dry-run --json > planned.json", plan->source);
            goto bad_input;
        }
        if (!cdp_comm_launched_by_mpi()) {
            if (a->no_launch) {
                cdp_fail(CDP_ERR_INVALID, "%s: the plan needs %d ranks; start it with mpirun -np %d, or "
                         "leave out --no-launch", plan->source, ranks, ranks);
                goto bad_input;
            }
            /* say once what no rank could do, rather than from every rank */
            cdp_status st = cdp_exec_check(plan);
            if (st) {
                code = cdp_cli_exit_code(st);
                goto bad_input;
            }
            cdp_plan_free(plan);
            return launch(a, ranks);
        }
        code = run_ranks(a, plan);
        cdp_plan_free(plan);
        return code;
    }
    if (!a->dry_run) {
        struct cdp_train_opts opts = {.out = a->quiet ? NULL : stdout, .progress = isatty(1),
                                      .resume = resume_dir(a, plan)};
        cdp_status st = cdp_train_one_rank(plan, &opts, NULL);
        if (st) {
            code = cdp_cli_exit_code(st);
            goto bad_input;
        }
    } else {
        struct cdp_planner_result pr = {0};
        struct cdp_planner_spread spread = {0};
        int planned = wants_planner(plan) || a->explore;
        cdp_status st = planned ? plan_auto(plan, &pr, a->explore ? &spread : NULL) : CDP_OK;
        if (st == CDP_ERR_UNSUPPORTED) planned = 0, st = CDP_OK;
        if (st) {
            code = cdp_cli_exit_code(st);
            goto bad_input;
        }
        if (a->json) st = print_plan_json(plan, planned ? &pr : NULL);
        else if (!(st = cdp_plan_print(plan, stdout)) && planned) {
            cdp_planner_print(&pr, stdout);
            if (a->explore) cdp_planner_spread_print(&spread, stdout);
        }
        cdp_planner_result_clear(&pr);
        if (st) {
            code = EXIT_RUN_FAILED;
            goto bad_input;
        }
    }
    cdp_plan_free(plan);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "cdphybrid: cannot write to standard output\n");
        return EXIT_RUN_FAILED;
    }
    return 0;

bad_input:
    fprintf(stderr, "cdphybrid: %s\n", cdp_last_error());
    cdp_plan_free(plan);
    return code;
}

int main(int argc, char **argv)
{
    struct cli_args a = {.argc = argc, .argv = argv};
    if (cdp_log_init_from_env()) {
        fprintf(stderr, "cdphybrid: %s\n", cdp_last_error());
        return EXIT_USAGE;
    }
    if (argc > 1 && !strcmp(argv[1], "topo")) return cdp_cli_topo(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "export")) return cdp_cli_export(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "doctor")) return cdp_cli_doctor(argc - 1, argv + 1);
    int code = parse_args(argc, argv, &a);
    if (code >= 0) return code;
    if (!getenv("CDP_LOG") || !*getenv("CDP_LOG")) {
        if (a.quiet) cdp_log_set_level(CDP_LOG_ERROR);
        else if (a.verbose) cdp_log_set_level(a.verbose > 1 ? CDP_LOG_DEBUG : CDP_LOG_INFO);
    }
    return run_plan(&a);
}
