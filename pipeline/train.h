/* Training on one rank: the whole model on one device, every global batch as a
 * sequence of micro-batches with gradients accumulated, so the result is the
 * one every pipeline x data-parallel layout of the same plan must reproduce. */
#ifndef CDP_PIPELINE_TRAIN_H
#define CDP_PIPELINE_TRAIN_H

#include <stdio.h>

#include "cdp/plan.h"
#include "cdp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct cdp_train_opts {
    FILE *out;          /* step lines and the summary (stdout); NULL = silent */
    int progress;       /* redraw a progress line between logged steps (a terminal) */
    const char *resume; /* a checkpoint folder (or a folder of them) to continue from, or NULL */
};

struct cdp_train_summary {
    int64_t steps;
    double first_loss, last_loss; /* mean over the global batch */
    double val_loss;              /* after the last step */
    double seconds;
    double samples_per_s, tokens_per_s, flops_per_s;
    /* pipeline runs: per step, averaged over ranks and steps after the first */
    double bubble;       /* idle share of the forward/backward phase */
    double compute_s;    /* loading, forward, backward, optimizer */
    double comm_s;       /* posting sends, all-reduces */
    double idle_s;       /* waiting for a peer's activation or gradient */
    double overhead_s;   /* the executor's own time: everything else in the step */
    double step_s;
    /* this rank's device memory: the accounting's high-water mark and the layout's prediction */
    double peak_memory_bytes, predicted_memory_bytes;
};

struct cdp_layout;
/* Trains the plan in this process: the executor on a world of one, for a
 * layout of one rank (else CDP_ERR_UNSUPPORTED, naming the layout's ranks). */
cdp_status cdp_train_one_rank(const struct cdp_plan *plan, const struct cdp_layout *layout,
                              const struct cdp_train_opts *opts, struct cdp_train_summary *summary);

#ifdef __cplusplus
}
#endif

#endif
