/* Subcommands of the cdphybrid program, each a main() of its own that returns
 * the exit code (0 success, 1 the run failed, 2 bad usage or bad input). */
#ifndef CDP_CLI_COMMANDS_H
#define CDP_CLI_COMMANDS_H

#include "cdp/status.h"

enum { EXIT_RUN_FAILED = 1, EXIT_USAGE = 2 };

/* "cdphybrid CMD: " + fmt + "(see cdphybrid CMD --help)" on stderr (cmd NULL:
 * the main command); returns EXIT_USAGE. */
int cdp_cli_usage_error(const char *cmd, const char *fmt, const char *arg);
/* An unknown option, with the closest of the NULL-terminated known ones when
 * it is a likely typo; returns EXIT_USAGE. */
int cdp_cli_unknown_option(const char *cmd, const char *opt, const char *const *known);
/* Bad input and what this build cannot do are the user's to fix (2); the rest
 * is a failed run (1). */
int cdp_cli_exit_code(cdp_status st);

/* `cdphybrid topo ...`; argv[0] is "topo". */
int cdp_cli_topo(int argc, char **argv);

/* `cdphybrid export ...`; argv[0] is "export". */
int cdp_cli_export(int argc, char **argv);

/* `cdphybrid generate ...` and `cdphybrid eval ...` (cmd_generate.c); argv[0]
 * is the command. */
int cdp_cli_generate(int argc, char **argv);
int cdp_cli_eval(int argc, char **argv);

/* The layout eval and generate run on (src/cli/forward_layout.c): plan, the
 * trained model's (changed in place), becomes a plan of `ranks` pipeline
 * stages of one replica on this host's CPU in fp32, micro_batches
 * micro-batches of /train/micro_batch, writing nothing; the planner's answer
 * for it (the plan's partition when it has `ranks` ranges). *out is the
 * caller's (cdp_layout_free). */
struct cdp_plan;
struct cdp_layout;
cdp_status cdp_cli_forward_layout(struct cdp_plan *plan, int ranks, int64_t micro_batches, struct cdp_layout **out);

/* `cdphybrid tokenize ...` (cmd_tokenize.c); argv[0] is "tokenize". */
int cdp_cli_tokenize(int argc, char **argv);
/* `cdphybrid plot METRICS.jsonl -o OUT.svg` (cmd_plot.c); argv[0] is "plot". */
int cdp_cli_plot(int argc, char **argv);

/* `cdphybrid doctor ...`; argv[0] is "doctor". */
int cdp_cli_doctor(int argc, char **argv);

/* What `cdphybrid --plan P --simulate` simulates: the planner's result for
 * the loaded, resolved plan on topology t (note: how t was chosen), with the
 * measured cost table the planner used (--costs FILE) or NULL. */
struct cdp_plan;
struct cdp_planner_result;
struct cdp_topology;
struct cdp_cost_table;
struct cdp_sim_result;
struct cdp_sim_in {
    const struct cdp_planner_result *r;
    const struct cdp_topology *t;
    const char *note;
    const struct cdp_cost_table *table;
    const char *costs, *costs_device; /* the table's file and what measured it */
    const struct cdp_sim_result *res; /* set by cdp_cli_simulate for its printers */
};

/* json, trace and timeline are the flags given with --simulate (trace and
 * timeline NULL when not asked). */
int cdp_cli_simulate(const struct cdp_plan *plan, const struct cdp_sim_in *in, int json, const char *trace,
                     const char *timeline);

/* `cdphybrid --plan P --profile [--costs OUT]`: plan_path is the --plan argument;
 * costs the file to write, or NULL: cdp_cli_default_costs_path(plan_path);
 * cpuset: the CPUs of rank 0 of the plan's layout (measured bound to them,
 * with as many BLAS threads), or NULL. */
int cdp_cli_profile(const struct cdp_plan *plan, const char *plan_path, const char *costs, const char *cpuset);

/* "dir/p.json" -> "dir/p.costs.json" (malloc'd; NULL when out of memory). */
char *cdp_cli_default_costs_path(const char *plan_path);

#endif
