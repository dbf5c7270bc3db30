/* Training on one rank is the executor on a world of one: the same schedule
 * code, data addressing, checkpoints and outputs as any layout. */
#include "pipeline/train.h"

#include "comm/comm.h"
#include "pipeline/executor.h"

cdp_status cdp_train_one_rank(const struct cdp_plan *p, const struct cdp_train_opts *opts,
                              struct cdp_train_summary *summary)
{
    const struct cdp_parallel_desc *pd = &p->parallel;
    if (pd->stages != 1 || pd->replicas != 1) {
        char s[32], r[32];
        snprintf(s, sizeof s, pd->stages == CDP_AUTO ? "auto" : "%lld", (long long)pd->stages);
        snprintf(r, sizeof r, pd->replicas == CDP_AUTO ? "auto" : "%lld", (long long)pd->replicas);
        return cdp_fail(CDP_ERR_UNSUPPORTED,
                        "%s: /parallel/stages is %s and /parallel/replicas is %s: one-rank training needs 1 "
                        "stage x 1 replica (cdphybrid starts the ranks a layout needs under mpirun)",
                        p->source, s, r);
    }
    cdp_comm_t self = NULL;
    cdp_status st = cdp_comm_self(&self);
    if (st) return st;
    st = cdp_exec_run(p, self, opts, summary);
    cdp_comm_free(self);
    return st;
}
