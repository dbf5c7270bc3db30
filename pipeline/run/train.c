/* cdp_train (cdp/train.h): the executor on a world of one (this process
 * alone) or on MPI's world (this process a rank of a launched job). The
 * cdphybrid program trains through it too, so an embedding program runs the
 * same schedule code, data addressing, checkpoints and outputs as any run. */
#include "cdp/train.h"

#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "pipeline/run/executor.h"
#include "pipeline/run/launch.h"

/* A caller's versioned struct into the library's own, zero beyond its size. */
static cdp_status take_sized(void *dst, size_t cap, const void *src, const char *what)
{
    const size_t n = *(const size_t *)src;
    if (n < sizeof(size_t) || n > cap)
        return cdp_fail(CDP_ERR_INVALID, "cdp_train: %s: size is %zu, expected sizeof(struct %s) (%zu in this "
                        "library): set it, e.g. with %s", what, n, what, cap,
                        !strcmp(what, "cdp_train_opts") ? "CDP_TRAIN_OPTS_INIT" : "CDP_TRAIN_SUMMARY_INIT");
    memset(dst, 0, cap);
    memcpy(dst, src, n);
    return CDP_OK;
}

/* Every rank of a job trains one layout: an embedding program whose ranks
 * each plan may not get the same answer (each sees its own binding), and a
 * rank of another layout would wait at a transfer its peer never makes. All
 * ranks fail together, naming the first that differs. */
static cdp_status same_layout(const struct cdp_plan *p, const struct cdp_layout *layout, cdp_comm_t world,
                              int *agreed)
{
    char mine[65], root[65];
    cdp_layout_digest(layout, mine);
    memcpy(root, mine, sizeof root);
    const double t = p->train.timeout_s;
    cdp_status st = cdp_comm_bcast_bytes(world, root, sizeof root, 0, t);
    if (st) return st;
    double differs = memcmp(mine, root, sizeof mine) ? (double)cdp_comm_rank(world) : -1.0;
    if ((st = cdp_comm_allreduce_f64(world, &differs, 1, CDP_REDUCE_MAX, t))) return st;
    *agreed = 1; /* every rank has the answer */
    if (differs < 0) return CDP_OK;
    return cdp_fail(CDP_ERR_INVALID, "%s: rank %d's layout differs from rank 0's (%d stages x %d replicas, %d "
                    "micro-batches here): every rank of a job must train the same layout; plan once and give "
                    "every rank that plan (cdphybrid's ranks read planned.json), or fix /parallel's values",
                    p->source, (int)differs, layout->stages, layout->replicas, layout->micro_batches);
}

cdp_status cdp_train(const struct cdp_plan *p, const struct cdp_layout *layout, const struct cdp_train_opts *opts,
                     struct cdp_train_summary *summary)
{
    if (!p || !layout) return cdp_fail(CDP_ERR_INVALID, "cdp_train: the plan and the layout are required");
    struct cdp_train_opts o = CDP_TRAIN_OPTS_INIT;
    cdp_status st;
    if (opts && (st = take_sized(&o, sizeof o, opts, "cdp_train_opts"))) return st;
    o.size = sizeof o;
    struct cdp_train_summary sum = CDP_TRAIN_SUMMARY_INIT;
    if (summary && (st = take_sized(&sum, sizeof sum, summary, "cdp_train_summary"))) return st;
    if (o.world != CDP_TRAIN_SELF && o.world != CDP_TRAIN_MPI)
        return cdp_fail(CDP_ERR_INVALID, "cdp_train: cdp_train_opts: world is %d, expected CDP_TRAIN_SELF (0) or "
                        "CDP_TRAIN_MPI (1)", (int)o.world);
    if (o.world == CDP_TRAIN_SELF && layout->n_ranks != 1)
        return cdp_fail(CDP_ERR_UNSUPPORTED,
                        "%s: the layout has %d ranks (%d stages x %d replicas): training in this process alone "
                        "needs one; start %d ranks with mpirun and train with world CDP_TRAIN_MPI (cdphybrid "
                        "does that itself)", p->source, layout->n_ranks, layout->stages, layout->replicas,
                        layout->n_ranks);
    cdp_comm_t world = NULL;
    st = o.world == CDP_TRAIN_MPI ? cdp_comm_world(&world) : cdp_comm_self(&world);
    if (st) return st;
    /* the world's size is checked by the executor's set-up, which names both */
    if (cdp_comm_size(world) == layout->n_ranks) st = cdp_launch_check_node(layout, cdp_comm_rank(world));
    if (!st && cdp_comm_size(world) > 1) {
        int agreed = 0;
        st = same_layout(p, layout, world, &agreed);
        if (st && agreed) { /* all ranks fail here together: the world can go */
            cdp_comm_free(world);
            return st;
        }
    }
    if (!st) st = cdp_exec_run(p, layout, world, &o, summary ? &sum : NULL);
    /* a failed rank of a job keeps its world: the caller ends the job
     * (cdp_train_abort), and freeing it could wait on the other ranks */
    if (st && cdp_comm_size(world) > 1) return st;
    cdp_comm_free(world);
    if (!st && summary) {
        sum.size = summary->size;
        memcpy(summary, &sum, summary->size);
    }
    return st;
}

void cdp_train_request_stop(void) { cdp_exec_request_stop(); }

void cdp_train_abort(int code)
{
    cdp_comm_t world = NULL;
    if (cdp_comm_world(&world)) world = NULL;
    cdp_comm_abort(world, code);
    exit(code); /* cdp_comm_abort does not return; this says so to the compiler */
}
