/* Internal to the main command of cdphybrid (--plan ...; src/cli/main.c and the
 * files below): its arguments and the parts shared between its files. */
#ifndef CDP_CLI_MAIN_INTERNAL_H
#define CDP_CLI_MAIN_INTERNAL_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cdp/plan.h"
#include "cli/restart.h"
#include "partitioner/planner.h"
#include "pipeline/layout.h"

/* A launched rank's status file (its last word for the launcher: rank_signals.c):
 * in the folder, of the rank. */
#define RANK_STATUS_FILE "%s/rank-%d.end"

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

/* ---- main.c: main: the subcommands, the run of a plan and where a rank stands */

int cdp_cli_resume_auto(const struct cli_args *a);
const char *cdp_cli_resume_dir(const struct cli_args *a, const struct cdp_plan *plan);

/* ---- cli_args.c: the main command's arguments: usage, --version, parsing */

int cdp_cli_parse_args(int argc, char **argv, struct cli_args *a);

/* ---- rank_signals.c: a launched rank's signals and its last word for the launcher */

extern char cdp_cli_status_path[4200];
extern volatile sig_atomic_t cdp_cli_status_final;
void cdp_cli_rank_status(const char *what, const char *where);
void cdp_cli_put(char *msg, size_t cap, size_t *n, const char *t);
void cdp_cli_on_bus(int sig);
void cdp_cli_rank_signals(void);
void cdp_cli_print_failure(const char *msg);

/* ---- cmd_launch.c: starting a layout's ranks (mpirun, srun), watching them, restarts */

int cdp_cli_layout_nodes(const struct cdp_layout *l);
const char *cdp_cli_signal_name(int sig);
void cdp_cli_remove_tmpdir(const char *dir, const char *planned, int n_ranks);
int cdp_cli_has_step_folders(const char *dir);
int cdp_cli_launch_with_restarts(const struct cli_args *a, struct cdp_plan *plan, const struct cdp_planner_result *r0,
                                 const struct cdp_replan_in *rin, const char *planned, const char *tmpdir,
                                 const char *status_dir);
int cdp_cli_print_launch(const struct cli_args *a, const struct cdp_plan *plan, const struct cdp_layout *l,
                         const char *planned, const char *dir);

/* ---- cmd_train.c: training: one rank here, or a rank of a launched job */

int cdp_cli_run_ranks(const struct cli_args *a, const struct cdp_plan *plan, const struct cdp_layout *layout);
int cdp_cli_train(const struct cli_args *a, struct cdp_plan *plan, const struct cdp_planner_result *r,
                  const struct cdp_replan_in *rin);

/* ---- plan_output.c: --schedule, the plan and layout as JSON, planned.json */

int cdp_cli_print_schedule(const struct cdp_plan *plan, const struct cdp_layout *l, int json);
cdp_status cdp_cli_print_plan_json(const struct cdp_plan *plan, const struct cdp_planner_result *r, FILE *f);
char *cdp_cli_output_dir(const struct cdp_plan *plan);
cdp_status cdp_cli_write_planned(const struct cdp_plan *plan, const struct cdp_planner_result *r, const char *path);

#endif
