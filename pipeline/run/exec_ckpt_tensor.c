/* Checkpoints of tensor groups (docs/parallelism.md, "Checkpoints"): a
 * checkpoint holds whole tensors whatever t wrote it, so it resumes under any
 * t. Writing, the ranks of each of replica 0's tensor groups hand their slices
 * (and the optimizer state of each, under ZeRO first gathered from the
 * replicas' shards) to the group's index 0, which assembles them into a whole
 * twin of its chunks (a model range as one rank holds it, in host memory) and
 * writes the twin as the stage's part. Resuming, every rank loads the
 * checkpoint into such a twin and copies its slices (and shards) out. */
#include <stdlib.h>
#include <string.h>

#include "cdp/core.h"
#include "model/checkpoint.h"
#include "model/layers.h"
#include "model/optim.h"
#include "pipeline/run/exec_internal.h"

/* The whole twins of this rank's chunks, on a host device of their own (so
 * the rank's device accounting sees none of them). */
struct twin {
    cdp_device_t dev;
    struct cdp_model **m;
    struct cdp_optimizer **o;
    int v;
};

static void twin_free(struct twin *w)
{
    for (int k = 0; k < w->v; k++) {
        if (w->o) cdp_optimizer_destroy(w->o[k]);
        if (w->m) cdp_model_destroy(w->m[k]);
    }
    free(w->m);
    free(w->o);
    cdp_device_close(w->dev);
}

static cdp_status twin_create(const struct exec *e, struct twin *w)
{
    const struct cdp_plan *p = e->plan;
    memset(w, 0, sizeof *w);
    w->v = e->v;
    w->m = calloc((size_t)e->v, sizeof *w->m);
    w->o = calloc((size_t)e->v, sizeof *w->o);
    if (!w->m || !w->o) return cdp_fail(CDP_ERR_NOMEM, "out of memory for a checkpoint's whole tensors");
    cdp_status st = cdp_device_open(CDP_BACKEND_CPU, 0, 0, &w->dev);
    for (int k = 0; k < e->v && !st; k++) {
        st = cdp_model_create(&p->model, e->ch[k].first_unit, e->ch[k].end_unit, 1, 1, p->train.seed, w->dev,
                              &w->m[k]);
        if (!st) st = cdp_optimizer_create(&p->train.optimizer, w->m[k], w->dev, &w->o[k]);
        if (!st && cdp_model_tensor_count(w->m[k]) != cdp_model_tensor_count(e->ch[k].model))
            st = cdp_fail(CDP_ERR_INTERNAL, "chunk %d: %d tensors, its whole twin %d", k,
                          cdp_model_tensor_count(e->ch[k].model), cdp_model_tensor_count(w->m[k]));
    }
    return st;
}

/* Value s (0: the parameter, 1 and 2: the optimizer's state, NULL when it
 * has none) of tensor i of model m with a whole-model optimizer o: device pointer. */
static float *value_of(struct cdp_model *m, struct cdp_optimizer *o, int i, int s)
{
    if (s == 0) return cdp_model_tensor(m, i)->data;
    float *a = NULL, *b = NULL;
    cdp_optimizer_state(o, m, i, &a, &b);
    return s == 1 ? a : b;
}

/* Writing: value s of this rank's tensor i of chunk k (its slice, whole over
 * the replicas' ZeRO shards) into slice; 0 with *have 0 on a rank that holds
 * no part of what replica 0 writes (another replica, after sending its shard). */
static cdp_status read_mine(struct exec *e, int k, int i, int s, float *slice, int *have)
{
    struct cdp_model *own = e->ch[k].model;
    struct cdp_optimizer *o = e->ch[k].opt;
    const uint64_t bytes = (uint64_t)cdp_model_tensor(own, i)->numel * 4;
    *have = 0;
    if (s > 0 && cdp_ckpt_sharded(o, own)) { /* ZeRO: the shards of the stage's replicas, at replica 0 */
        uint8_t *whole = NULL;
        cdp_status st = cdp_exec_ckpt_gather_state(o, own, i, s - 1, cdp_comm_host(e->dp), e->timeout, bytes,
                                                   e->r == 0 ? &whole : NULL);
        if (st || e->r != 0) return st;
        memcpy(slice, whole, (size_t)bytes);
        free(whole);
        *have = 1;
        return CDP_OK;
    }
    if (e->r != 0) return CDP_OK;
    *have = 1;
    return cdp_device_read(e->dev, slice, value_of(own, o, i, s), bytes);
}

/* Resuming: this rank's part of value s of tensor i of chunk k (slice holds
 * its slice, whole) into its model or optimizer: under ZeRO only its shard. */
static cdp_status write_mine(struct exec *e, int k, int i, int s, const float *slice)
{
    struct cdp_model *own = e->ch[k].model;
    struct cdp_optimizer *o = e->ch[k].opt;
    const uint64_t bytes = (uint64_t)cdp_model_tensor(own, i)->numel * 4;
    if (s == 0 || !cdp_ckpt_sharded(o, own)) return cdp_device_write(e->dev, value_of(own, o, i, s), slice, bytes);
    float *a = NULL, *b = NULL;
    uint64_t from = 0, count = 0;
    cdp_optimizer_state_range(o, own, i, &a, &b, &from, &count);
    float *dst = s == 1 ? a : b;
    return count && dst ? cdp_device_write(e->dev, dst, slice + from, count * 4) : CDP_OK;
}

/* One value of tensor i of chunk k: the group's slices into the twin (at
 * index 0 of replica 0) when gather, else the twin's into this rank's. host
 * holds the whole tensor, slice a slice. */
static cdp_status move_value(struct exec *e, struct twin *w, int k, int i, int s, int gather, float *host,
                             float *slice)
{
    struct cdp_model *own = e->ch[k].model;
    const struct cdp_model_tensor *t = cdp_model_tensor(own, i);
    const struct cdp_param_desc *pd = &cdp_model_unit(own, t->unit_local)->params[t->param_local];
    const uint64_t bytes = (uint64_t)t->numel * 4;
    cdp_status st;
    if (!gather) { /* resume: the twin's values, this rank's slice of them */
        float *whole = value_of(w->m[k], w->o[k], i, s);
        if (!whole) return CDP_OK; /* SGD: no second state */
        if ((st = cdp_device_read(w->dev, host, whole, (uint64_t)cdp_model_tensor(w->m[k], i)->numel * 4))) return st;
        if (pd->shard_dim < 0) return write_mine(e, k, i, s, host);
        cdp_param_slice_copy(pd, host, slice, 0);
        return write_mine(e, k, i, s, slice);
    }
    if (s == 2 && cdp_optimizer_type_of(e->ch[k].opt) != CDP_OPT_ADAMW) return CDP_OK; /* SGD: one state */
    int have = 0;
    if ((st = read_mine(e, k, i, s, slice, &have)) || !have) return st;
    float *whole = e->k == 0 ? value_of(w->m[k], w->o[k], i, s) : NULL;
    if (pd->shard_dim < 0) return whole ? cdp_device_write(w->dev, whole, slice, bytes) : CDP_OK;
    void *all = NULL;
    size_t *lens = NULL;
    if ((st = cdp_comm_gather_bytes(cdp_comm_host(e->tpc), slice, (size_t)bytes, &all, &lens, e->timeout))) return st;
    if (e->k == 0) {
        struct cdp_param_desc at = *pd;
        for (int j = 0; j < e->t; j++) { /* index j's slice, in rank order of the group */
            at.shard_off = cdp_param_shard_off_of(pd, j);
            cdp_param_slice_copy(&at, host, (char *)all + (size_t)j * bytes, 1);
        }
        st = cdp_device_write(w->dev, whole, host, (uint64_t)cdp_model_tensor(w->m[k], i)->numel * 4);
    }
    free(all);
    free(lens);
    return st;
}

/* Every value of every tensor of this rank's chunks, one way. w->m is NULL
 * on a rank that only sends (writing: not index 0 of replica 0's group). */
static cdp_status move_all(struct exec *e, struct twin *w, int gather)
{
    int64_t most = 0;
    for (int k = 0; k < e->v; k++)
        for (int i = 0; i < cdp_model_tensor_count(e->ch[k].model); i++) {
            const struct cdp_model_tensor *t = cdp_model_tensor(e->ch[k].model, i);
            const struct cdp_param_desc *pd = &cdp_model_unit(e->ch[k].model, t->unit_local)->params[t->param_local];
            const int64_t whole = pd->shard_dim < 0 ? t->numel : t->numel / pd->shape[pd->shard_dim] * pd->shard_full;
            if (whole > most) most = whole;
        }
    float *host = malloc((size_t)most * 4 + 4), *slice = malloc((size_t)most * 4 + 4);
    cdp_status st = !host || !slice ? cdp_fail(CDP_ERR_NOMEM, "out of memory for a checkpoint's tensors") : CDP_OK;
    for (int k = 0; k < e->v && !st; k++) {
        for (int i = 0; i < cdp_model_tensor_count(e->ch[k].model) && !st; i++)
            for (int s = 0; s < 3 && !st; s++) st = move_value(e, w, k, i, s, gather, host, slice);
        if (!st && gather && w->m) cdp_optimizer_set_steps(w->o[k], cdp_optimizer_steps(e->ch[k].opt));
        if (!st && !gather) cdp_optimizer_set_steps(e->ch[k].opt, cdp_optimizer_steps(w->o[k]));
    }
    free(host);
    free(slice);
    return st;
}

cdp_status cdp_exec_ckpt_write_tensor(struct exec *e, int step, const char *part)
{
    struct twin w = {0};
    const int writes = e->r == 0 && e->k == 0;
    cdp_status st = writes ? twin_create(e, &w) : CDP_OK;
    if (!st) st = move_all(e, &w, 1);
    if (!st && writes) st = cdp_ckpt_write_part(e->plan->train.checkpoint.dir, step, part, w.m, w.o, e->v);
    twin_free(&w);
    return st;
}

cdp_status cdp_exec_ckpt_load_tensor(struct exec *e, const char *path, const struct cdp_ckpt_info *info)
{
    struct twin w;
    cdp_status st = twin_create(e, &w);
    if (!st) st = cdp_ckpt_load(path, info, w.m, w.o, e->v);
    if (!st) st = move_all(e, &w, 0);
    twin_free(&w);
    return st;
}
