/* Checkpoints of tensor groups (docs/parallelism.md, "Checkpoints"): a
 * checkpoint holds whole tensors whatever t wrote it, so it resumes under any
 * t. Writing, the ranks of each of replica 0's tensor groups hand their slices
 * (and the optimizer state of each) to the group's index 0, which assembles
 * them into a whole twin of its chunks (a model range as one rank holds it,
 * in host memory) and writes the twin as the stage's part. Resuming, every
 * rank loads the checkpoint into such a twin and copies its slices out. */
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
 * has none) of tensor i of model m with optimizer o: device pointer. */
static float *value_of(struct cdp_model *m, struct cdp_optimizer *o, int i, int s)
{
    if (s == 0) return cdp_model_tensor(m, i)->data;
    float *a = NULL, *b = NULL;
    cdp_optimizer_state(o, m, i, &a, &b);
    return s == 1 ? a : b;
}

/* One value of tensor i of chunk k: the group's slices into the twin (at
 * index 0) when gather, else the twin's into this rank's. host holds the
 * whole tensor, slice a slice. */
static cdp_status move_value(struct exec *e, struct twin *w, int k, int i, int s, int gather, float *host,
                             float *slice)
{
    struct cdp_model *own = e->ch[k].model;
    const struct cdp_model_tensor *t = cdp_model_tensor(own, i);
    const struct cdp_param_desc *pd = &cdp_model_unit(own, t->unit_local)->params[t->param];
    float *mine = value_of(own, e->ch[k].opt, i, s), *whole = value_of(w->m[k], w->o[k], i, s);
    if (!mine || !whole) return CDP_OK; /* SGD: no second state */
    const uint64_t bytes = (uint64_t)t->numel * 4, whole_bytes = (uint64_t)cdp_model_tensor(w->m[k], i)->numel * 4;
    cdp_status st;
    if (!gather) { /* resume: the twin's values, this rank's slice of them */
        if ((st = cdp_device_read(w->dev, host, whole, whole_bytes))) return st;
        if (pd->shard_dim < 0) return cdp_device_write(e->dev, mine, host, bytes);
        cdp_param_slice_copy(pd, host, slice, 0);
        return cdp_device_write(e->dev, mine, slice, bytes);
    }
    if ((st = cdp_device_read(e->dev, slice, mine, bytes))) return st;
    if (pd->shard_dim < 0) return e->k == 0 ? cdp_device_write(w->dev, whole, slice, bytes) : CDP_OK;
    void *all = NULL;
    size_t *lens = NULL;
    if ((st = cdp_comm_gather_bytes(cdp_comm_host(e->tpc), slice, (size_t)bytes, &all, &lens, e->timeout))) return st;
    if (e->k == 0) {
        struct cdp_param_desc at = *pd;
        for (int j = 0; j < e->t; j++) { /* index j's slice, in rank order of the group */
            at.shard_off = (int64_t)j * pd->shape[pd->shard_dim];
            cdp_param_slice_copy(&at, host, (char *)all + (size_t)j * bytes, 1);
        }
        st = cdp_device_write(w->dev, whole, host, whole_bytes);
    }
    free(all);
    free(lens);
    return st;
}

/* Every value of every tensor of this rank's chunks, one way. */
static cdp_status move_all(struct exec *e, struct twin *w, int gather)
{
    int64_t most = 0;
    for (int k = 0; k < e->v; k++)
        for (int i = 0; i < cdp_model_tensor_count(w->m[k]); i++)
            if (cdp_model_tensor(w->m[k], i)->numel > most) most = cdp_model_tensor(w->m[k], i)->numel;
    float *host = malloc((size_t)most * 4 + 4), *slice = malloc((size_t)most * 4 + 4);
    cdp_status st = !host || !slice ? cdp_fail(CDP_ERR_NOMEM, "out of memory for a checkpoint's tensors") : CDP_OK;
    for (int k = 0; k < e->v && !st; k++) {
        for (int i = 0; i < cdp_model_tensor_count(w->m[k]) && !st; i++)
            for (int s = 0; s < 3 && !st; s++) st = move_value(e, w, k, i, s, gather, host, slice);
        if (!st && gather) cdp_optimizer_set_steps(w->o[k], cdp_optimizer_steps(e->ch[k].opt));
        if (!st && !gather) cdp_optimizer_set_steps(e->ch[k].opt, cdp_optimizer_steps(w->o[k]));
    }
    free(host);
    free(slice);
    return st;
}

cdp_status cdp_exec_ckpt_write_tensor(struct exec *e, int step, const char *part)
{
    struct twin w;
    cdp_status st = twin_create(e, &w);
    if (!st) st = move_all(e, &w, 1);
    if (!st && e->k == 0) st = cdp_ckpt_write_part(e->plan->train.checkpoint.dir, step, part, w.m, w.o, e->v);
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
