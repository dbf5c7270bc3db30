/* What the main command writes of a planned plan: --schedule's lists, the
 * plan with the planner's result and the layout as JSON (--dry-run --json,
 * planned.json) and the folder it goes in. */
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

/* --schedule: the lists of one step of the layout (every replica alike). */
int cdp_cli_print_schedule(const struct cdp_plan *plan, const struct cdp_layout *l, int json)
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
cdp_status cdp_cli_print_plan_json(const struct cdp_plan *plan, const struct cdp_planner_result *r, FILE *f)
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
char *cdp_cli_output_dir(const struct cdp_plan *plan)
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
cdp_status cdp_cli_write_planned(const struct cdp_plan *plan, const struct cdp_planner_result *r, const char *path)
{
    struct cdp_atomic_file out;
    cdp_status st = cdp_atomic_open(path, &out);
    if (st) return st;
    if ((st = cdp_cli_print_plan_json(plan, r, out.stream))) {
        cdp_atomic_abort(&out);
        return st;
    }
    return cdp_atomic_commit(&out);
}
