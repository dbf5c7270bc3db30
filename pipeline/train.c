/* Training on one rank is the executor on a world of one: the same schedule
 * code, data addressing, checkpoints and outputs as any layout. */
#include "pipeline/train.h"

#include "comm/comm.h"
#include "pipeline/executor.h"

cdp_status cdp_train_one_rank(const struct cdp_plan *p, const struct cdp_layout *layout,
                              const struct cdp_train_opts *opts, struct cdp_train_summary *summary)
{
    if (layout->n_ranks != 1)
        return cdp_fail(CDP_ERR_UNSUPPORTED,
                        "%s: the layout has %d ranks (%d stages x %d replicas): one-rank training needs one "
                        "(cdphybrid starts the ranks a layout needs under mpirun)",
                        p->source, layout->n_ranks, layout->stages, layout->replicas);
    cdp_comm_t self = NULL;
    cdp_status st = cdp_comm_self(&self);
    if (st) return st;
    st = cdp_exec_run(p, layout, self, opts, summary);
    cdp_comm_free(self);
    return st;
}
