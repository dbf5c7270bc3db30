/* cdphybrid --plan P --profile [--costs OUT.json]: measures every unit of the
 * plan's model on this machine's CPU (src/model/profile.h) and writes the
 * table that --simulate --costs reads, next to the plan by default. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/plan.h"
#include "cdp/log.h"
#include "cli/commands.h"
#include "pipeline/run/launch.h"
#include "model/profile.h"
#include "model/costs.h"


char *cdp_cli_default_costs_path(const char *plan_path)
{
    size_t n = strlen(plan_path);
    if (n >= 5 && !strcmp(plan_path + n - 5, ".json")) n -= 5;
    char *s = malloc(n + sizeof ".costs.json");
    if (!s) return NULL;
    memcpy(s, plan_path, n);
    memcpy(s + n, ".costs.json", sizeof ".costs.json");
    return s;
}

int cdp_cli_profile(const struct cdp_plan *plan, const char *plan_path, const char *costs, const char *cpuset)
{
    char *path = costs ? NULL : cdp_cli_default_costs_path(plan_path);
    const char *outp = costs ? costs : path;
    struct cdp_cost_table t = {0};
    if (!outp) {
        fprintf(stderr, "cdphybrid: out of memory\n");
        return EXIT_RUN_FAILED;
    }
    /* measured as a rank of the plan's layout runs: on its CPUs, with as many BLAS threads */
    int cpus = 0;
    if (cpuset && *cpuset) {
        if (cdp_launch_bind(cpuset, &cpus)) CDP_WARN(CLI, "profiling unbound: %s", cdp_last_error());
        else cdp_launch_blas_threads(cpus);
    }
    cdp_status st = cdp_profile_run(plan, NULL, &t);
    if (!st) st = cdp_cost_table_write(&t, outp);
    if (st) {
        fprintf(stderr, "cdphybrid: %s\n", cdp_last_error());
        cdp_cost_table_clear(&t);
        free(path);
        return st == CDP_ERR_INVALID || st == CDP_ERR_UNSUPPORTED ? EXIT_USAGE : EXIT_RUN_FAILED;
    }
    double f = 0, b = 0;
    printf("Measured costs of %s on %s\n", plan->source, t.device);
    printf("  micro-batch %lld, %d BLAS thread%s%s%s (as rank 0 of the plan's layout runs)\n\n",
           (long long)t.micro_batch, t.threads, t.threads == 1 ? "" : "s", cpus ? ", on CPUs " : "", cpus ? cpuset : "");
    if (t.tensor > 1)
        printf("  tensor group of %d: rank 0's slices, their compute only (the group's all-reduces are not in "
               "these times; the planner costs them on the topology's links)\n\n", t.tensor);
    printf("  unit  kind                 fwd ms    bwd ms  of it W ms\n");
    for (int i = 0; i < t.n_units; i++) {
        printf("  %4d  %-18s %8.3f  %8.3f  %8.3f\n", i, cdp_layer_name(t.units[i].type), t.units[i].fwd_s * 1e3,
               t.units[i].bwd_s * 1e3, t.units[i].bwd_w_s * 1e3);
        f += t.units[i].fwd_s;
        b += t.units[i].bwd_s;
    }
    printf("  total                    %8.3f  %8.3f\n", f * 1e3, b * 1e3);
    printf("  optimizer %.3f ns per parameter\n\nwrote %s (plan, simulate and train with it: --costs %s)\n",
           t.optimizer_s_per_param * 1e9, outp, outp);
    cdp_cost_table_clear(&t);
    free(path);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "cdphybrid: cannot write to standard output\n");
        return EXIT_RUN_FAILED;
    }
    return 0;
}
