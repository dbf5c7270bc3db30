/* The layout `eval` and `generate` run on: the trained model's plan made a
 * plan of forward passes (this host's CPU, one replica, `ranks` pipeline
 * stages, nothing written), then planned as training plans (the planner's
 * partition, or the plan's own when it has that many stages). No other rule
 * cuts the model for them. */
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "cdp/plan.h"
#include "cdp/topology.h"
#include "cli/commands.h"
#include "partitioner/planner.h"

/* A plan's owned path, gone. */
static void drop(char **s)
{
    free(*s);
    *s = NULL;
}

cdp_status cdp_cli_forward_layout(struct cdp_plan *p, int ranks, int64_t micro_batches, struct cdp_layout **out)
{
    struct cdp_parallel_desc *par = &p->parallel;
    /* the plan's partition when it cuts the model in as many ranges (an
     * interleaved plan's stages x chunks ranges in unit order, each then one
     * rank's); else the planner's */
    if (par->partition && par->n_partition != ranks) {
        free(par->partition);
        par->partition = NULL;
        par->n_partition = 0;
    }
    par->stages = ranks;
    par->replicas = 1;
    par->tensor = 1; /* forward passes run whole layers (a checkpoint holds whole tensors at any t) */
    par->micro_batches = micro_batches;
    par->schedule = CDP_SCHEDULE_1F1B; /* its placement: stage s on rank s */
    par->schedule_auto = 0;
    drop(&par->schedule_file);
    par->chunks = 1;
    if (par->placement == CDP_PLACEMENT_EXPLICIT) {
        free(par->placement_map);
        par->placement_map = NULL;
        par->placement = CDP_PLACEMENT_ORDERED_PP_INNER;
    }
    if (par->balance == CDP_BALANCE_EXPLICIT) {
        free(par->shares);
        par->shares = NULL;
        par->n_shares = 0;
        par->balance = CDP_BALANCE_UNIFORM;
    }
    par->rebalance_every = 0;
    par->bucket_mb = 0;
    par->zero = 0;
    /* this host's CPU, in fp32, as every forward pass of these commands runs */
    struct cdp_cluster_desc *cl = &p->cluster;
    cl->backend = CDP_BACKEND_CPU;
    cl->backend_auto = 0;
    drop(&cl->topology);
    if (!(cl->topology = strdup("auto"))) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    cl->nodes = 1;
    cl->nodes_given = 0;
    cl->devices = CDP_AUTO;
    cl->device_memory = 0;
    cl->ranks_per_device = 1;
    cl->host_memory = 0;
    p->train.precision = CDP_PRECISION_FP32;
    /* no optimizer state is made (the executor's forward passes have none),
     * so the planner counts none: plain SGD keeps nothing */
    p->train.optimizer.type = CDP_OPT_SGD;
    p->train.optimizer.momentum = 0;
    p->train.recompute = CDP_RECOMPUTE_NONE;
    p->train.recompute_auto = 0;
    p->train.global_batch = micro_batches * p->train.micro_batch;
    drop(&p->train.checkpoint.dir);
    p->train.restart.max = 0;
    drop(&p->output.metrics);
    drop(&p->output.trace);
    drop(&p->output.timeline);
    drop(&p->output.weights);
    drop(&p->output.tensorboard);
    cdp_status st = cdp_plan_resolve(p, &(struct cdp_machine_info){.gpus = 0, .no_gpu_why = NULL});
    if (st) return st;
    struct cdp_topology *topo = NULL;
    struct cdp_planner_result pr = {0};
    char note[512] = "";
    if ((st = cdp_planner_topology(p, 0, &topo, note, sizeof note)))
        return cdp_error_context(st, "%s: /cluster/topology", p->source);
    st = cdp_planner_run(p, topo, NULL, CDP_PLANNER_LAYOUT_ONLY, &pr);
    cdp_topology_free(topo);
    if (st) return st;
    *out = pr.layout;
    pr.layout = NULL;
    cdp_planner_result_clear(&pr);
    return CDP_OK;
}
