/* Rebalancing while training (/parallel/rebalance_every): every N steps the
 * replicas' measured time per micro-batch gives new shares of a step's
 * micro-batches (pipeline/balance.h), taken when they promise a shorter step. */
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "pipeline/balance.h"
#include "pipeline/run/exec_internal.h"

/* Every rank measured its busy time per micro-batch since the last look; a
 * replica's is that of its slowest stage. New shares for those speeds replace
 * the current ones when they promise a step at least 5% shorter (so noise does
 * not move micro-batches back and forth). Every rank computes the same shares
 * from the same reduced times. */
cdp_status cdp_exec_rebalance(struct exec *e, int step)
{
    const int R = e->R;
    double *t = calloc((size_t)R, sizeof *t);
    int64_t *next = calloc((size_t)R, sizeof *next);
    cdp_status st = !t || !next ? cdp_fail(CDP_ERR_NOMEM, "out of memory") : CDP_OK;
    if (!st) {
        t[e->r] = e->rb_mb > 0 ? e->rb_busy / (double)e->rb_mb : 0;
        st = cdp_comm_allreduce_f64(e->world, t, (size_t)R, CDP_REDUCE_MAX, e->timeout);
    }
    e->rb_busy = 0;
    e->rb_mb = 0;
    int64_t total = 0;
    for (int r = 0; r < R; r++) total += e->share[r];
    int ok = 1;
    for (int r = 0; r < R; r++) ok &= t && t[r] > 0;
    if (!st && ok && !(st = cdp_balance_shares(t, R, e->p, total, e->unit, e->mcap, next))) {
        const double now = cdp_balance_step_time(t, R, e->p, e->share),
                     then = cdp_balance_step_time(t, R, e->p, next);
        if (memcmp(next, e->share, (size_t)R * sizeof *next) && then < 0.95 * now) {
            if (e->rank == 0 && e->out) {
                fprintf(e->out, "step %d: rebalanced micro-batches per replica ", step);
                cdp_exec_print_shares(e->out, e->share, R);
                fputs(" -> ", e->out);
                cdp_exec_print_shares(e->out, next, R);
                fputs(" (measured ms per micro-batch:", e->out);
                for (int r = 0; r < R; r++) fprintf(e->out, " %.1f", 1e3 * t[r]);
                fprintf(e->out, "; predicted forward/backward %.0f -> %.0f ms)\n", 1e3 * now, 1e3 * then);
                fflush(e->out);
            }
            CDP_INFO(EXEC, "step %d: replica %d now runs %lld micro-batches (was %lld)", step, e->r,
                     (long long)next[e->r], (long long)e->share[e->r]);
            memcpy(e->share, next, (size_t)R * sizeof *next);
            cdp_exec_set_share(e);
            st = cdp_exec_build_schedule(e);
        }
    }
    free(t);
    free(next);
    return st;
}
