/* The planner and the simulator for programs that embed cdphybrid
 * (cdp/planner.h, cdp/simulator.h): the steps the cdphybrid program takes
 * before it trains or simulates (resolve, topology, the search, the answer
 * written into the plan), behind an opaque result. */
#include <stdlib.h>
#include <string.h>

#include "cdp/planner.h"
#include "cdp/simulator.h"
#include "cdp/topology.h"
#include "model/costs.h"
#include "model/layers.h"
#include "partitioner/planner.h"

struct cdp_planned {
    struct cdp_planner_result r;
    struct cdp_topology *topo;
    struct cdp_cost_table table;
    int have_table;
};

void cdp_planned_free(struct cdp_planned *x)
{
    if (!x) return;
    cdp_planner_result_clear(&x->r);
    cdp_topology_free(x->topo);
    cdp_cost_table_clear(&x->table);
    free(x);
}

/* The measured cost table at path, checked against the plan's units. */
static cdp_status read_costs(const struct cdp_plan *plan, const char *path, struct cdp_planned *x)
{
    struct cdp_unit *u = NULL;
    int n = 0;
    cdp_status st = cdp_cost_table_read(path, &x->table);
    if (st) return st;
    x->have_table = 1;
    if ((st = cdp_units_build(&plan->model, &u, &n))) return st;
    st = cdp_cost_table_check(&x->table, path, plan, u, n);
    free(u);
    return st;
}

cdp_status cdp_plan_layout(struct cdp_plan *plan, const struct cdp_machine_info *machine,
                           const struct cdp_plan_layout_opts *opts, struct cdp_planned **out)
{
    if (!plan || !out) return cdp_fail(CDP_ERR_INVALID, "cdp_plan_layout: the plan and out are required");
    struct cdp_plan_layout_opts o = CDP_PLAN_LAYOUT_OPTS_INIT;
    if (opts) {
        if (opts->size < sizeof(size_t) || opts->size > sizeof o)
            return cdp_fail(CDP_ERR_INVALID, "cdp_plan_layout: cdp_plan_layout_opts: size is %zu, expected "
                            "sizeof(struct cdp_plan_layout_opts) (%zu in this library): set it, e.g. with "
                            "CDP_PLAN_LAYOUT_OPTS_INIT", opts->size, sizeof o);
        memcpy(&o, opts, opts->size);
    }
    const struct cdp_machine_info none = {.gpus = 0, .no_gpu_why = NULL};
    if (!machine) machine = &none;
    struct cdp_planned *x = calloc(1, sizeof *x);
    if (!x) return cdp_fail(CDP_ERR_NOMEM, "cdp_plan_layout: out of memory");
    char note[512] = "";
    cdp_status st = cdp_plan_resolve(plan, machine);
    if (!st && o.costs) st = read_costs(plan, o.costs, x);
    if (!st && (st = cdp_planner_topology(plan, machine->gpus, &x->topo, note, sizeof note)))
        cdp_error_context(st, "%s: /cluster/topology", plan->source);
    if (!st) st = cdp_planner_run(plan, x->topo, x->have_table ? &x->table : NULL, 0, &x->r);
    if (!st) st = cdp_planner_apply(&x->r, plan);
    if (st) {
        cdp_planned_free(x);
        return st;
    }
    *out = x;
    return CDP_OK;
}

cdp_status cdp_layout_replan_check(struct cdp_plan *plan, const struct cdp_machine_info *machine,
                                   const struct cdp_layout *l)
{
    if (!plan || !l) return cdp_fail(CDP_ERR_INVALID, "cdp_layout_replan_check: the plan and the layout are required");
    struct cdp_planned *x = NULL;
    cdp_status st = cdp_plan_layout(plan, machine, NULL, &x);
    if (st) return st;
    char diff[400];
    if (cdp_layout_diff(l, x->r.layout, diff, sizeof diff))
        st = cdp_fail(CDP_ERR_INVALID, "%s: the layout is not what its plan plans on this machine: %s (\"here\": the "
                      "layout, \"there\": planned now)", plan->source, diff);
    cdp_planned_free(x);
    return st;
}

const struct cdp_layout *cdp_planned_layout(const struct cdp_planned *x) { return x->r.layout; }
double cdp_planned_step_s(const struct cdp_planned *x) { return x->r.predicted.step_s; }
double cdp_planned_bubble(const struct cdp_planned *x) { return x->r.predicted.bubble; }
double cdp_planned_samples_per_s(const struct cdp_planned *x) { return x->r.predicted.samples_per_s; }
void cdp_planned_print(const struct cdp_planned *x, FILE *f) { cdp_planner_print_brief(&x->r, f); }

cdp_status cdp_simulate(const struct cdp_plan *plan, const struct cdp_planned *x, struct cdp_simulation *out)
{
    if (!plan || !x || !out) return cdp_fail(CDP_ERR_INVALID, "cdp_simulate: the plan, the planned layout and out "
                                             "are required");
    struct cdp_simulation s = CDP_SIMULATION_INIT;
    if (out->size < sizeof(size_t) || out->size > sizeof s)
        return cdp_fail(CDP_ERR_INVALID, "cdp_simulate: cdp_simulation: size is %zu, expected sizeof(struct "
                        "cdp_simulation) (%zu in this library): set it, e.g. with CDP_SIMULATION_INIT",
                        out->size, sizeof s);
    struct cdp_sim_result *res = NULL;
    const struct cdp_layout *l = x->r.layout;
    cdp_status st = cdp_planner_simulate(plan, x->topo, x->have_table ? &x->table : NULL, l, &res);
    if (st) return st;
    s.step_s = res->step_s;
    s.phase_s = res->phase_s;
    s.bubble = res->bubble;
    s.samples_per_s = res->samples_per_s;
    s.ranks = l->n_ranks;
    for (int i = 0; i < l->n_ranks; i++)
        if ((double)l->rank[i].memory.device > s.peak_memory_bytes) s.peak_memory_bytes = (double)l->rank[i].memory.device;
    cdp_sim_result_free(res);
    s.size = out->size;
    memcpy(out, &s, out->size);
    return CDP_OK;
}
