/* Subcommands of the cdphybrid program, each a main() of its own that returns
 * the exit code (0 success, 1 the run failed, 2 bad usage or bad input). */
#ifndef CDP_CLI_COMMANDS_H
#define CDP_CLI_COMMANDS_H

/* `cdphybrid topo ...`; argv[0] is "topo". */
int cdp_cli_topo(int argc, char **argv);

/* `cdphybrid export ...`; argv[0] is "export". */
int cdp_cli_export(int argc, char **argv);

/* `cdphybrid doctor ...`; argv[0] is "doctor". */
int cdp_cli_doctor(int argc, char **argv);

/* `cdphybrid --plan P --simulate`: plan is loaded and resolved; json, trace and
 * timeline are the flags given with it (trace/timeline NULL when not asked);
 * costs: a measured table (--costs FILE) to use instead of the analytic times,
 * or NULL. */
struct cdp_plan;
int cdp_cli_simulate(const struct cdp_plan *plan, int json, const char *trace, const char *timeline,
                     const char *costs);

/* `cdphybrid --plan P --profile [--costs OUT]`: plan_path is the --plan argument;
 * costs the file to write, or NULL: cdp_cli_default_costs_path(plan_path). */
int cdp_cli_profile(const struct cdp_plan *plan, const char *plan_path, const char *costs);

/* "dir/p.json" -> "dir/p.costs.json" (malloc'd; NULL when out of memory). */
char *cdp_cli_default_costs_path(const char *plan_path);

#endif
