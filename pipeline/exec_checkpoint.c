/* Checkpoints of a running layout: replica 0's ranks write their stages' parts
 * in parallel (under ZeRO-1 with the optimizer state gathered from the stage's
 * replicas) and rank 0 commits the step (src/model/checkpoint.h); a resume
 * loads every rank's ranges (and its shard of the state) from the newest
 * complete checkpoint, whatever the layout that wrote it. */
#include <stdio.h>
#include <stdlib.h>

#include "cdp/core.h"
#include "cdp/log.h"
#include "model/checkpoint.h"
#include "pipeline/exec_internal.h"

/* Replica 0's ranks each write the part of their stage; rank 0 commits the
 * checkpoint once every part is on disk. */
/* The models and optimizers of this rank's chunks, as the checkpoint calls
 * take them (both malloc'd; the caller frees them, also on failure). */
static cdp_status chunk_lists(const struct exec *e, struct cdp_model ***models, struct cdp_optimizer ***opts)
{
    *models = malloc((size_t)e->v * sizeof **models);
    *opts = malloc((size_t)e->v * sizeof **opts);
    if (!*models || !*opts) return cdp_fail(CDP_ERR_NOMEM, "out of memory");
    for (int k = 0; k < e->v; k++) {
        (*models)[k] = e->ch[k].model;
        (*opts)[k] = e->ch[k].opt;
    }
    return CDP_OK;
}

cdp_status cdp_exec_save_checkpoint(struct exec *e, int step)
{
    const struct cdp_plan *p = e->plan;
    cdp_status st = CDP_OK;
    snprintf(cdp_exec_where_buf, sizeof cdp_exec_where_buf,
             "rank %d/%d (stage %d, replica %d), step %d: writing a checkpoint", e->rank, e->size, e->s, e->r, step);
    cdp_fault_in_save(&e->fault, e->rank, step, "part");
    /* ZeRO-1: the stage's other replicas hand replica 0 their shards of the state as it writes */
    if (e->r == 0 || e->zero) {
        struct cdp_model **models = NULL;
        struct cdp_optimizer **opts = NULL;
        st = chunk_lists(e, &models, &opts);
        char part[32];
        snprintf(part, sizeof part, "stage-%d", e->s);
        if (!st && !e->zero) st = cdp_ckpt_write_part(p->train.checkpoint.dir, step, part, models, opts, e->v);
        else if (!st && e->r == 0)
            st = cdp_ckpt_write_part_gathered(p->train.checkpoint.dir, step, part, models, opts, e->v, cdp_comm_host(e->dp),
                                              e->timeout);
        else if (!st) st = cdp_ckpt_send_shards(models, opts, e->v, cdp_comm_host(e->dp), e->timeout);
        free(models);
        free(opts);
    }
    cdp_fault_in_save(&e->fault, e->rank, step, "commit");
    if (!st) st = cdp_comm_barrier(e->world, e->timeout);
    if (!st && e->rank == 0) {
        struct cdp_ckpt_info info = {.step = step, .samples_seen = e->sample_base + (int64_t)(step - e->step0) * e->G,
                                     .seed = p->train.seed};
        snprintf(info.optimizer, sizeof info.optimizer, "%s",
                 p->train.optimizer.type == CDP_OPT_SGD ? "sgd" : "adamw");
        if (!(st = cdp_plan_to_json(p, &info.plan_json)))
            st = cdp_ckpt_commit(p->train.checkpoint.dir, step, &info, (int)p->train.checkpoint.keep);
        free(info.plan_json);
    }
    return st;
}

/* Every rank loads its ranges' tensors and optimizer state from the newest
 * complete checkpoint; training continues at the step after it. */
cdp_status cdp_exec_resume(struct exec *e, const char *dir)
{
    char *path = NULL;
    struct cdp_ckpt_info info = {0};
    cdp_status st = cdp_ckpt_find_latest(dir, &path, &info);
    if (st) return st;
    struct cdp_model **models = NULL;
    struct cdp_optimizer **opts = NULL;
    st = chunk_lists(e, &models, &opts);
    if (!st) st = cdp_ckpt_load(path, &info, models, opts, e->v);
    if (!st && info.step >= e->plan->train.steps)
        st = cdp_fail(CDP_ERR_INVALID, "%s: the checkpoint is at step %lld and /train/steps is %lld: nothing "
                      "left to train", path, (long long)info.step, (long long)e->plan->train.steps);
    /* every rank has read its tensors before rank 0 tidies the folder */
    if (!st) st = cdp_comm_barrier(e->world, e->timeout);
    if (!st && e->plan->train.checkpoint.dir) st = cdp_ckpt_check_no_later(e->plan->train.checkpoint.dir, info.step);
    if (!st && e->rank == 0 && e->plan->train.checkpoint.dir)
        cdp_ckpt_discard_incomplete_after(e->plan->train.checkpoint.dir, info.step);
    if (!st) {
        e->step0 = (int)info.step;
        e->sample_base = info.samples_seen;
        CDP_INFO(CKPT, "resuming from %s (step %lld, %lld samples seen)", path, (long long)info.step,
                 (long long)info.samples_seen);
        if (e->rank == 0 && e->out)
            fprintf(e->out, "resuming from %s at step %lld\n", path, (long long)info.step);
    }
    free(models);
    free(opts);
    free(path);
    cdp_ckpt_info_free(&info);
    return st;
}
