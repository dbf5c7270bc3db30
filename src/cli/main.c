/* cdphybrid: the command line. Parses arguments, loads and checks the plan,
 * and runs the command. Only the CLI decides exit codes:
 * 0 success, 1 the run failed, 2 bad usage or bad input. This file is main
 * and the run of a plan; its parts are in the files main_internal.h names. */
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

/* Whether --resume is "--resume auto". */
int cdp_cli_resume_auto(const struct cli_args *a) { return a->resume && a->resume_dir && !strcmp(a->resume_dir, "auto"); }

/* --resume DIR, or --resume alone: the plan's checkpoint folder (checked in
 * run_plan); --resume auto: that folder when a checkpoint was begun there,
 * else NULL (the first run of a job that a scheduler may start again). */
const char *cdp_cli_resume_dir(const struct cli_args *a, const struct cdp_plan *plan)
{
    if (!a->resume) return NULL;
    if (cdp_cli_resume_auto(a)) return cdp_cli_has_step_folders(plan->train.checkpoint.dir) ? plan->train.checkpoint.dir : NULL;
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
    if (a->resume && (!a->resume_dir || cdp_cli_resume_auto(a)) && !plan->train.checkpoint.dir) {
        cdp_fail(CDP_ERR_INVALID, "%s: --resume %s needs /train/checkpoint/dir in the plan", plan->source,
                 cdp_cli_resume_auto(a) ? "auto" : "without a folder");
        goto bad_input;
    }
    cdp_status st;
    /* a planned file (planned.json) holds its layout: the ranks and --schedule run it as written; the
     * other commands run it once its plan, fixed, plans the same (below) */
    if ((st = cdp_layout_of_planned(a->plan, plan, &given_layout))) goto bad_input;
    if (given_layout && ranked && !a->dry_run && !a->simulate && !a->schedule && !a->profile) {
        code = cdp_cli_run_ranks(a, plan, given_layout);
        goto done;
    }
    if (given_layout && a->schedule) {
        code = cdp_cli_print_schedule(plan, given_layout, a->json);
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
        code = cdp_cli_print_schedule(plan, pr.layout, a->json);
    } else if (a->simulate) {
        cdp_planner_apply_sequence_parallel(&pr, plan); /* the rest of the plan as given ("partition: the planner's") */
        struct cdp_sim_in in = {.r = &pr, .t = topo, .note = note, .table = have_table ? &table : NULL,
                                .costs = a->costs, .costs_device = table.device};
        code = cdp_cli_simulate(plan, &in, a->json, a->trace, a->timeline);
    } else if (a->dry_run) {
        if ((st = cdp_planner_apply(&pr, plan))) goto failed;
        if (a->json) st = cdp_cli_print_plan_json(plan, &pr, stdout);
        else if (!(st = cdp_plan_print(plan, stdout))) {
            cdp_planner_print(&pr, stdout);
            if (have_table) {
                char note[192];
                cdp_cost_table_tensor_note(&table, pr.layout->tensor, note, sizeof note);
                printf("  costs       measured: %s (%s); %s\n", a->costs, table.device, note);
            }
        }
        if (st) goto failed;
        code = fflush(stdout) ? EXIT_RUN_FAILED : 0;
        if (code) fprintf(stderr, "cdphybrid: cannot write to standard output\n");
    } else if (ranked) {
        code = cdp_cli_run_ranks(a, plan, pr.layout);
    } else {
        if ((st = cdp_planner_apply(&pr, plan))) goto failed;
        const struct cdp_replan_in rin = {.plan_path = a->plan, .machine = &machine,
                                          .table = have_table ? &table : NULL, .topo = topo};
        code = cdp_cli_train(a, plan, &pr, &rin);
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
    int code = cdp_cli_parse_args(argc, argv, &a);
    if (code >= 0) return code;
    if (!getenv("CDP_LOG") || !*getenv("CDP_LOG")) {
        if (a.quiet) cdp_log_set_level(CDP_LOG_ERROR);
        else if (a.verbose) cdp_log_set_level(a.verbose > 1 ? CDP_LOG_DEBUG : CDP_LOG_INFO);
    }
    return run_plan(&a);
}
