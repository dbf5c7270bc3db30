/* ZeRO-1 checkpoints of a running layout: the optimizer state of a stage is
 * sharded over its replicas, and the part replica 0 writes holds it whole.
 * Replica 0 writes the part (model/checkpoint.h cdp_ckpt_write_part_sharded)
 * with the state of each tensor gathered from every replica's shard over the
 * stage's data-parallel group as it is written; the other replicas send their
 * shards in the same order at the same time. */
#include <stdlib.h>

#include "cdp/core.h"
#include "comm/comm.h"
#include "model/checkpoint.h"
#include "pipeline/run/exec_internal.h"

/* The group and timeout a gather runs over. */
struct gather_ctx {
    cdp_comm_t group;
    double timeout;
};

/* Every replica's piece of state s of tensor i, in rank order (the shards are
 * in rank order, so the pieces make the tensor): at rank 0 into *out (malloc'd,
 * the tensor's bytes); the others (out NULL) send theirs. */
cdp_status cdp_exec_ckpt_gather_state(struct cdp_optimizer *o, struct cdp_model *m, int i, int s, cdp_comm_t group,
                                      double timeout, uint64_t nbytes, uint8_t **out)
{
    float *mine = NULL;
    uint64_t count = 0;
    cdp_status st = cdp_ckpt_shard_piece(o, m, i, s, &mine, &count);
    void *all = NULL;
    size_t *lens = NULL;
    if (!st) st = cdp_comm_gather_bytes(group, mine, (size_t)count * 4, &all, &lens, timeout);
    free(mine);
    if (!st && out) {
        uint64_t total = 0;
        for (int r = 0; r < cdp_comm_size(group); r++) total += lens[r];
        if (total != nbytes)
            st = cdp_fail(CDP_ERR_INTERNAL, "the replicas' shards hold %llu bytes of a %llu-byte tensor",
                          (unsigned long long)total, (unsigned long long)nbytes);
        else *out = all, all = NULL;
    }
    free(lens);
    free(all);
    return st;
}

static cdp_status gather_whole(void *ctx, struct cdp_optimizer *o, struct cdp_model *m, int i, int s,
                               uint64_t nbytes, uint8_t **out)
{
    const struct gather_ctx *g = ctx;
    return cdp_exec_ckpt_gather_state(o, m, i, s, g->group, g->timeout, nbytes, out);
}

cdp_status cdp_exec_ckpt_write_gathered(const char *dir, int64_t step, const char *part,
                                        struct cdp_model *const *models, struct cdp_optimizer *const *opts, int n,
                                        cdp_comm_t group, double timeout_s)
{
    struct gather_ctx g = {group, timeout_s};
    const struct cdp_ckpt_gather gather = {gather_whole, &g};
    return cdp_ckpt_write_part_sharded(dir, step, part, models, opts, n, &gather);
}

cdp_status cdp_exec_ckpt_send_shards(struct cdp_model *const *models, struct cdp_optimizer *const *opts, int n,
                                     cdp_comm_t group, double timeout_s)
{
    cdp_status st = CDP_OK;
    for (int k = 0; k < n && !st; k++) {
        struct cdp_model *m = models[k];
        struct cdp_optimizer *o = opts[k];
        if (!cdp_ckpt_sharded(o, m)) continue;
        const int first = cdp_model_unit(m, 0)->index, states = cdp_optimizer_type_of(o) == CDP_OPT_ADAMW ? 2 : 1;
        for (int i = 0; i < cdp_model_tensor_count(m) && !st; i++) {
            if (cdp_model_tensor(m, i)->unit < first) continue; /* as the writer: a tied copy is not written */
            for (int s = 0; s < states && !st; s++)
                st = cdp_exec_ckpt_gather_state(o, m, i, s, group, timeout_s, 0, NULL);
        }
    }
    return st;
}
